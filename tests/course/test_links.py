"""``python -m adam8lib.course.links``: cells 0/1 and README badges follow the repository URL."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from adam8lib.course import REPO_URL, SETUP_CELL, colab_url
from adam8lib.course import links

ROOT = Path(__file__).resolve().parents[2]
FORK = "https://github.com/someone-else/adam8-fork"


def test_the_repository_is_in_sync():
    assert links.main(["--check", *(str(ROOT / d) for d in ("notebooks", "solutions", "exercises")),
                       str(ROOT / "README.md")]) == 0


def test_a_new_url_rewrites_badges_and_setup_cell_and_back(tmp_path):
    lesson = shutil.copy(ROOT / "notebooks" / "02_ema.ipynb", tmp_path / "02_ema.ipynb")
    workbook = shutil.copy(ROOT / "solutions" / "02_ema.ipynb", tmp_path / "wb.ipynb")  # its badge opens exercises/
    readme = shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    before = nbformat.read(lesson, as_version=4)

    assert links.sync_notebook(lesson, repo_url=FORK) and links.sync_notebook(workbook, repo_url=FORK)
    assert links.sync_text(readme, repo_url=FORK)
    after = nbformat.read(lesson, as_version=4)
    assert colab_url("notebooks/02_ema.ipynb", repo_url=FORK) in after.cells[0].source
    assert "adam8-course/adam8/" not in after.cells[0].source
    assert f"git+{FORK}" in after.cells[1].source and REPO_URL not in after.cells[1].source
    assert after.cells[1].outputs == before.cells[1].outputs  # the stored output stays
    assert [c.source for c in after.cells[2:]] == [c.source for c in before.cells[2:]]
    assert colab_url("exercises/02_ema.ipynb", repo_url=FORK) in nbformat.read(workbook, as_version=4).cells[0].source
    text = Path(readme).read_text()
    assert colab_url("notebooks/10_mixed_precision_finetune.ipynb", repo_url=FORK) in text
    assert "github/adam8-course/adam8/blob" not in text

    assert links.main(["--check", str(lesson)]) == 1
    assert links.main([str(lesson), str(workbook), str(readme)]) == 0  # back to pyproject's URL
    assert nbformat.read(lesson, as_version=4).cells[1].source == SETUP_CELL
    assert Path(readme).read_text() == (ROOT / "README.md").read_text()
    assert not links.sync_notebook(lesson)  # idempotent


def test_relink_keeps_branch_and_path():
    old = "[x](https://colab.research.google.com/github/a/b/blob/dev/exercises/05_dynamic_map.ipynb)"
    assert links.relink(old, repo_url=FORK) == f"[x]({colab_url('exercises/05_dynamic_map.ipynb', branch='dev', repo_url=FORK)})"


def test_a_notebook_without_title_and_setup_cells_is_refused(tmp_path):
    path = tmp_path / "bad.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print(1)")]), path)
    with pytest.raises(ValueError, match="cell 0"):
        links.sync_notebook(path)


def test_relative_links_in_the_markdown_files_point_at_files():
    """Every relative link and image in the repository's Markdown files names a file or folder
    that exists (a bench writer once linked its plot next to the README instead of in results/)."""
    import re
    import subprocess

    files = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    missing = []
    for name in files.stdout.split():
        path = ROOT / name
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)  # not code blocks
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            target = target.split("#")[0]
            if not target or re.match(r"[a-z]+:", target):
                continue  # an anchor, or a URL (https:, mailto:, ...)
            if not (path.parent / target).exists():
                missing.append(f"{name}: {target}")
    assert not missing, missing
