"""Cells 0 and 1 of every notebook, and the README's badges, derived from the repository URL.

The address is written once (pyproject ``[project.urls] Repository``, read by
:func:`adam8lib.course.environment.repo_url`). After changing it (a fork, a move), reinstall
(``pip install -e .``) and rewrite every derived copy::

    python -m adam8lib.course.links notebooks solutions exercises README.md
    python -m adam8lib.course.links --check notebooks solutions exercises README.md   # exit 1 if stale

Cell 0's "Open in Colab" links keep their path and branch and get the repository's owner/name;
cell 1, the setup cell, becomes :func:`~adam8lib.course.environment.setup_cell`. Its stored
output is not touched: the cell is tagged ``nbval-ignore-output`` and its output (the
environment summary) does not depend on the address.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Iterable, Sequence

import nbformat

from .environment import colab_url, setup_cell

__all__ = ["COLAB_LINK", "relink", "sync_notebook", "sync_text", "main"]

#: An "Open in Colab" address: groups owner/name, branch, path.
COLAB_LINK = re.compile(r"https://colab\.research\.google\.com/github/([\w.-]+/[\w.-]+)/blob/([\w./-]+?)/((?:notebooks|solutions|exercises)/[\w.-]+\.ipynb)")


def relink(text: str, repo_url: str | None = None) -> str:
    """``text`` with every Colab link pointing into ``repo_url`` (same branch and path)."""
    return COLAB_LINK.sub(lambda m: colab_url(m.group(3), branch=m.group(2), repo_url=repo_url), text)


def sync_notebook(path: str | Path, repo_url: str | None = None, write: bool = True) -> bool:
    """Bring cells 0 and 1 of a notebook in line with the repository URL; True if they differed."""
    nb = nbformat.read(path, as_version=4)
    if len(nb.cells) < 2 or nb.cells[0].cell_type != "markdown" or nb.cells[1].cell_type != "code":
        raise ValueError(f"{path}: cell 0 must be the markdown title + badge and cell 1 the setup code cell")
    badge, setup = relink(nb.cells[0].source, repo_url), setup_cell(repo_url)
    changed = badge != nb.cells[0].source or nb.cells[1].source.strip() != setup
    if changed and write:
        nb.cells[0].source, nb.cells[1].source = badge, setup
        nbformat.write(nb, path)
    return changed


def sync_text(path: str | Path, repo_url: str | None = None, write: bool = True) -> bool:
    """Relink the Colab badges of a text file (README.md); True if it changed."""
    path = Path(path)
    old = path.read_text(encoding="utf-8")
    new = relink(old, repo_url)
    if new != old and write:
        path.write_text(new, encoding="utf-8")
    return new != old


def _files(paths: Iterable[str | Path]) -> list[Path]:
    out = []
    for p in map(Path, paths):
        out += sorted(p.glob("*.ipynb")) if p.is_dir() else [p]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adam8lib.course.links", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="notebooks, folders of notebooks, or text files (README.md)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything is stale")
    args = parser.parse_args(argv)
    stale = []
    for path in _files(args.paths):
        sync = sync_notebook if path.suffix == ".ipynb" else sync_text
        if sync(path, write=not args.check):
            stale.append(path)
            print(f"{'stale' if args.check else 'updated'}: {path}")
    print(f"{len(stale)} file(s) {'stale' if args.check else 'updated'}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
