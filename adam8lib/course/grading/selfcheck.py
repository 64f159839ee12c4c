"""Check your own workbook the way the course expects, without the folder's pytest settings.

    python -m adam8lib.course.grading.selfcheck exercises/05_dynamic_map.ipynb [more.ipynb ...] [-- PYTEST ARGS]

Runs ``pytest --nbval --nbval-current-env`` with the grading plugin on the notebooks, but with

* the course's official manifest (``--grade-manifest``, from the installed course), never a
  ``.manifest.json`` lying next to the notebook;
* no ``conftest.py`` (``--noconftest``), no ``pytest.ini``/``pyproject.toml``/``tox.ini``/``setup.cfg``
  of the notebook's folder (``-c`` an empty ini file, ``--rootdir`` an empty folder), no
  ``PYTEST_ADDOPTS``, no cache (``-p no:cacheprovider``), and the current folder not on
  ``sys.path`` (``python -P``).

It prints the score summary and returns pytest's exit status. It is for learners checking their
work: grades come only from the gradebook (:mod:`adam8lib.course.grading.gradebook`), which does
not run notebooks through pytest at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .conventions import MANIFEST_NAME
from .sandbox import repository_root

__all__ = ["command", "main"]


def command(notebooks: list[str], manifest: Path, rootdir: Path, extra: list[str] = ()) -> list[str]:
    """The pytest command line of a self-check."""
    ini = rootdir / "pytest.ini"
    return [
        sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), "-m", "pytest",
        "--nbval", "--nbval-current-env", "-p", "adam8lib.course.grading.plugin", "-p", "no:cacheprovider",
        "--noconftest", "-c", str(ini), "--rootdir", str(rootdir), f"--grade-manifest={manifest}", *extra,
        *[str(Path(nb).resolve()) for nb in notebooks],
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    if not argv or any(not a.endswith(".ipynb") for a in argv):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    root = repository_root()
    manifest = root / "exercises" / MANIFEST_NAME if root is not None else None
    if manifest is None or not manifest.is_file():
        print("error: the course's manifest (exercises/.manifest.json) was not found next to the installed "
              "adam8lib; run this from a checkout of the course (pip install -e .)", file=sys.stderr)  # fmt: skip
        return 2
    with tempfile.TemporaryDirectory(prefix="adam8-selfcheck-") as tmp:
        (Path(tmp) / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
        return subprocess.run(command(argv, manifest, Path(tmp), extra), env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
