"""A class of learners of one workbook, graded as the gradebook grades (for the tests of the split workbooks' drivers).

Each learner hands in the course's exercise notebook with some exercise cells replaced (an exercise left out keeps
the workbook's stub); the class is graded with a manifest of that workbook only, and every row of the gradebook comes
back with the learner's report.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import nbformat

from adam8lib.course.grading import gradebook
from adam8lib.course.grading.conventions import MANIFEST_NAME, Manifest, is_solution_cell

REPO = Path(__file__).resolve().parents[2]


def grade_class(root: Path, workbook: str, exercises: tuple, learners: dict, mode: str, timeout: float,
                learner_flags: tuple = ()) -> dict:
    """``{learner: row}`` of ``learners`` (``{learner: {exercise: cell source}}``) graded in ``root``, sandbox
    ``mode``, two learners at a time; each row has its ``"report"`` (the learner's JSON report). ``learner_flags``:
    the learner process's extra arguments (``("--no-guard",)``: what is left when the guard is switched off)."""
    for learner, cells in learners.items():
        (root / "sub" / learner).mkdir(parents=True)
        nb = nbformat.read(str(REPO / "exercises" / workbook), as_version=4)
        tagged = [c for c in nb.cells if c.cell_type == "code" and is_solution_cell(c)]
        for cell, exercise in zip(tagged, exercises):
            if exercise in cells:
                cell.source = cells[exercise]
        nbformat.write(nb, str(root / "sub" / learner / workbook))
    course = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
    only = root / MANIFEST_NAME
    only.write_text(Manifest({workbook: course.notebooks[workbook]},
                             extras={workbook: course.extras.get(workbook, {})}).dumps(), encoding="utf-8")
    out = root / "grades" / "gradebook.csv"
    if learner_flags:
        gradebook.grade_class(root / "sub", Manifest.load(only), cell_timeout=timeout, jobs=2, out=out, sandbox=mode,
                              reports=out.parent / "reports", progress=False, learner_flags=learner_flags)  # fmt: skip
    else:
        rc = gradebook.main([str(root / "sub"), "--out", str(out), "--manifest", str(only), "--sandbox", mode,
                             "--cell-timeout", str(timeout), "--jobs", "2"])  # fmt: skip
        assert rc == 0
    rows = {r["learner"]: r for r in csv.DictReader(out.open(encoding="utf-8"))}
    for name, row in rows.items():
        row["report"] = json.loads((out.parent / "reports" / f"{name}.json").read_text())
    return rows


def said(row: dict, exercise: str) -> str:
    """What the learner's report says of ``exercise``: its status, detail and error."""
    status = row["report"]["statuses"][exercise]
    return f"{status['status']} {status['detail']} {status.get('error', '')}"
