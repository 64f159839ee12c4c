"""The learner view (issue 53): under bubblewrap a learner's code sees the system's folders, the Python environment,
the package and its own scratch folder, and nothing else of the machine.

The row of the issue's table: a learner's exercise cells execute the official solution notebook of *another copy
of the course* on the same machine (a clone somewhere outside the graded checkout, here under the grader's home
folder). Under bubblewrap the copy is not there (every top-level folder but the system's is an empty folder): the
cells fail and the exercises score 0, next to an honest learner with full marks. Without a sandbox it is not
prevented (the README says so): that gap is asserted too, so a change of it is seen.
"""

from __future__ import annotations

import csv
import shutil
import uuid
from pathlib import Path

import nbformat
import pytest

from adam8lib.course.grading import gradebook, sandbox
from adam8lib.course.grading.conventions import MANIFEST_NAME, Manifest, is_solution_cell

REPO = Path(__file__).resolve().parents[2]
WORKBOOK = "02_ema.ipynb"
MODES = ["bwrap", "none"] if sandbox.available() is None else ["none"]

THIEF = '''
import json, pathlib
_copy = json.loads(pathlib.Path({path!r}).read_text())
for _cell in _copy["cells"]:
    if _cell["cell_type"] == "code" and "### BEGIN SOLUTION" in "".join(_cell["source"]):
        exec("".join(_cell["source"]), globals())
'''


@pytest.fixture()
def other_copy():
    """A copy of the course's solutions in a folder of the grader's home (outside the checkout and /tmp)."""
    where = Path.home() / ".cache" / f"adam8-other-copy-{uuid.uuid4().hex[:8]}"
    (where / "solutions").mkdir(parents=True)
    shutil.copyfile(REPO / "solutions" / WORKBOOK, where / "solutions" / WORKBOOK)
    yield where / "solutions" / WORKBOOK
    shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize("mode", MODES)
def test_another_copy_of_the_course_is_not_in_the_learner_view(tmp_path, other_copy, mode):
    assert not str(other_copy).startswith(("/tmp/", str(REPO)))
    course = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
    only = tmp_path / MANIFEST_NAME
    only.write_text(Manifest({WORKBOOK: course.notebooks[WORKBOOK]},
                             extras={WORKBOOK: course.extras.get(WORKBOOK, {})}).dumps(), encoding="utf-8")
    sub = tmp_path / "sub"
    (sub / "honest").mkdir(parents=True)
    shutil.copyfile(REPO / "solutions" / WORKBOOK, sub / "honest" / WORKBOOK)
    nb = nbformat.read(str(REPO / "exercises" / WORKBOOK), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and is_solution_cell(cell):
            cell.source = THIEF.format(path=str(other_copy))
    (sub / "thief").mkdir()
    nbformat.write(nb, str(sub / "thief" / WORKBOOK))
    out = tmp_path / "grades" / "gradebook.csv"
    rc = gradebook.main([str(sub), "--out", str(out), "--manifest", str(only), "--cell-timeout", "120",
                         "--jobs", "1", "--sandbox", mode])
    assert rc == 0
    rows = {row["learner"]: row for row in csv.DictReader(out.open(encoding="utf-8"))}
    full = sum(spec.points for spec in course.notebooks[WORKBOOK])
    assert float(rows["honest"]["total"]) == full, rows["honest"]
    if mode == "bwrap":
        assert float(rows["thief"]["total"]) == 0, rows["thief"]
    else:  # not prevented without a sandbox (README: "What the gradebook prevents")
        assert float(rows["thief"]["total"]) == full, rows["thief"]["notes"]


def test_the_repository_on_pythonpath_is_not_bound_back(tmp_path, monkeypatch):
    """An instructor who grades with ``PYTHONPATH=<the course checkout>`` (no install): only the package inside it is
    bound back, never the checkout (solutions/, tests/) — whatever bubblewrap's availability, the command says so."""
    root = sandbox.repository_root()
    if root is None:
        pytest.skip("adam8lib is installed without its repository")
    monkeypatch.setenv("PYTHONPATH", str(root))
    monkeypatch.setattr(sandbox, "available", lambda: None)  # (the command is built the same either way)
    cmd, used, _ = sandbox.wrap(["python", "-c", "pass"], scratch=tmp_path, mode="bwrap")
    binds = [(cmd[i + 1], cmd[i + 2]) for i, part in enumerate(cmd) if part == "--ro-bind"]
    assert used == "bwrap" and (str(root / "adam8lib"), str(root / "adam8lib")) in binds
    assert not any(Path(src) == root or root.is_relative_to(Path(src)) for src, _ in binds if src != "/"), binds
    # a checkout inside a folder the sandbox covers as a whole (/tmp, a home): what keeps it out is keep_out
    outer = root.parent
    assert root in [real for real, _ in sandbox._bound_back([outer])]
    kept = [real for real, _ in sandbox._bound_back([outer], keep_out=[root])]
    assert root not in kept and root / "adam8lib" in kept
