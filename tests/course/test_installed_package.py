"""What Colab does: install the built package, then run lessons from a copy of the notebooks.

The wheel is built from a copy of the working tree, installed into a fresh virtual environment
outside the repository (its other packages are this environment's, through a ``.pth`` file, so
nothing is downloaded), and lesson 00 runs top to bottom there, from a copy of ``notebooks/``
outside the repository; then lesson 10's setup, imports and results cells. Every file they read
must come with the package: an audit hook in the kernel records every file opened, and none
may lie in the repository (other than its ``.venv``). Lesson 10's results cells must print what
the stored lesson printed (a missing results file prints something else).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

AUDIT = '''import os, sys
_opened = set()
def _audit(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.add(os.path.abspath(os.fsdecode(args[0])))
sys.addaudithook(_audit)'''

NOT_FROM_REPO = '''import os
import adam8lib
_repo = {repo!r}
assert not adam8lib.__file__.startswith(_repo + os.sep), adam8lib.__file__
_bad = sorted(p for p in _opened if p.startswith(_repo + os.sep) and not p.startswith(os.path.join(_repo, ".venv") + os.sep))
assert not _bad, f"read from the repository, not the package: {{_bad}}"
print("adam8lib from", os.path.dirname(adam8lib.__file__).split(os.sep)[-3:])'''


def copy_tree(dest: Path) -> Path:
    """Tracked and untracked-but-not-ignored files (what a clone of this working tree holds)."""
    import shutil

    names = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, names):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def setuptools_ok() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 77  # reads `license = "MIT"` (PEP 639)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh venv holding the built wheel (and this environment's other packages)."""
    tmp = tmp_path_factory.mktemp("installed")
    src = copy_tree(tmp / "src")
    # offline when this environment has a recent enough setuptools; otherwise pip fetches one
    isolation = ["--no-build-isolation"] if setuptools_ok() else []
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation,
                            "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    wheel = next((tmp / "dist").glob("adam8lib-*.whl"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # this environment's packages, but not the repository (nor an editable adam8lib pointing at it)
    others = [p for p in sys.path if p and Path(p).is_dir() and (
        not Path(p).resolve().is_relative_to(ROOT) or Path(p).resolve().is_relative_to(ROOT / ".venv"))]
    (site / "_others.pth").write_text("\n".join(others) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, text=True)
    where = subprocess.run([str(python), "-c", "import adam8lib; print(adam8lib.__file__)"], cwd=tmp,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(site), where
    return python


def run_in(python: Path, notebook: Path) -> nbformat.NotebookNode:
    """Execute ``notebook`` in place with the course runner of the installed package."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    proc = subprocess.run([str(python), "-m", "adam8lib.course.outputs", "execute", str(notebook)],
                          cwd=notebook.parent, env=env, capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return nbformat.read(notebook, as_version=4)


def audited(cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=[new_code_cell(AUDIT), *cells, new_code_cell(NOT_FROM_REPO.format(repo=str(ROOT)))])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def stdout_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("name") == "stdout")


def images_of(cell) -> int:
    return sum("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


def test_lesson_00_runs_from_the_installed_package(installed, tmp_path):
    import shutil

    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    lesson = nbformat.read(tmp_path / "notebooks" / "00_setup_and_tour.ipynb", as_version=4)
    path = tmp_path / "notebooks" / "00_audited.ipynb"
    nbformat.write(audited(lesson.cells), path)
    ran = run_in(installed, path)
    assert "adam8lib from" in stdout_of(ran.cells[-1])


def results_cells(lesson) -> list[int]:
    """Lesson 10's code cells that use the stored capstone results (whatever file they read)."""
    return [i for i, c in enumerate(lesson.cells) if c.cell_type == "code" and ("evidence" in c.source or "results" in c.source or "res[" in c.source
                                                                               or c.source.startswith("if res is not None"))]


LESSON_10 = ROOT / "notebooks" / "10_mixed_precision_finetune.ipynb"
_lesson_10 = nbformat.read(LESSON_10, as_version=4)
# a path into the repository's bench/ folder (which no pip/Colab install has)
_reads_bench = bool(re.search(r"""["']bench["']|bench/results""",
                              "".join(_lesson_10.cells[i].source for i in results_cells(_lesson_10))))


def test_lesson_10_results_cell_runs_from_the_installed_package(installed, tmp_path):
    import shutil

    assert not _reads_bench, "lesson 10's results cells read bench/ (no pip/Colab install has it)"

    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    lesson = nbformat.read(tmp_path / "notebooks" / LESSON_10.name, as_version=4)
    imports = next(i for i, c in enumerate(lesson.cells) if c.cell_type == "code" and "import adam8lib" in c.source)
    chosen = [1, imports, *results_cells(lesson)]
    assert len(chosen) >= 3, "no results cell found in lesson 10"
    path = tmp_path / "notebooks" / "10_results_audited.ipynb"
    nbformat.write(audited([lesson.cells[i] for i in chosen]), path)
    ran = run_in(installed, path)
    for k, i in enumerate(chosen[2:], start=3):  # audit cell + setup + imports come first
        want, got = lesson.cells[i], ran.cells[k]
        assert stdout_of(got) == stdout_of(want), f"cell {i} printed\n{stdout_of(got)}\ninstead of\n{stdout_of(want)}"
        assert images_of(got) == images_of(want), f"cell {i}: {images_of(got)} plots, stored {images_of(want)}"
    assert "adam8lib from" in stdout_of(ran.cells[-1])
