"""A library's warning in a learner's process never enters a compared output (issue 53).

An honest workbook-14 solution lost a point when ``RuntimeWarning: adam8lib cpu backend unavailable:
building the kernel failed …`` was printed while its check ran: the check's output is compared with its
success line. Here the warning (and a library logger's warning) fires on every call of an honest learner's
functions, in one process (the tiny workbook: the check captures the output) and split (workbook 01: the
learner process captures what the function printed and sends it to the check): full marks, no note, and
the warning is in the grading log.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import nbformat

from adam8lib.course.grading import gradebook, sandbox
from adam8lib.course.grading.conventions import MANIFEST_NAME, Manifest, is_solution_cell

from tests.course.test_grading import (CLASS_WORKBOOK, EXERCISES, SOLUTIONS, SOLVED_CLAMP, SOLVED_SQUARE,  # noqa: F401
                                       tiny_course, tiny_learner)  # fmt: skip

SANDBOX = "bwrap" if sandbox.available() is None else "none"
MESSAGE = ("adam8lib cpu backend unavailable: building the kernel failed: RuntimeError: forced by the test; "
           "falling back to the 'torch' backend")  # fmt: skip
#: wraps the named functions so that every call raises a library's warning and logs one first
NOISY = f'''
import functools as _functools, logging as _logging, warnings as _warnings
def _noisy(function):
    @_functools.wraps(function)
    def wrapped(*args, **kwargs):
        _warnings.warn_explicit({MESSAGE!r}, RuntimeWarning, filename="adam8lib/kernels/cpu_build.py", lineno=1,
                               module="adam8lib.kernels.cpu_build")
        _logging.getLogger("adam8lib.kernels.cpu_build").warning("adam8lib: a library log line, forced by the test")
        return function(*args, **kwargs)
    return wrapped
'''


def _rows(out: Path) -> dict:
    rows = {r["learner"]: r for r in csv.DictReader(out.open(encoding="utf-8"))}
    for name, row in rows.items():
        row["log"] = (out.parent / "reports" / f"{name}.log").read_text()
        row["report"] = json.loads((out.parent / "reports" / f"{name}.json").read_text())
    return rows


def test_a_library_warning_in_the_learners_process_costs_nothing_in_one_process(tiny_course):
    root = tiny_course["root"]
    tiny_learner(root / "sub" / "ada" / "01_tiny.ipynb", square=SOLVED_SQUARE + "\n" + NOISY + "square = _noisy(square)\n",
                 clamp=SOLVED_CLAMP + "\nclamp = _noisy(clamp)\n")  # fmt: skip
    out = root / "grades" / "gradebook.csv"
    rc = gradebook.main([str(root / "sub"), "--out", str(out), "--manifest", str(tiny_course["manifest"]),
                         "--sandbox", SANDBOX, "--cell-timeout", "40", "--require-full-marks"])  # fmt: skip
    row = _rows(out)["ada"]
    assert rc == 0 and (row["total"], row["notes"]) == ("3", ""), row["report"]
    assert MESSAGE in row["log"] and "a library log line" in row["log"]  # in the log, where the instructor looks


def test_a_library_warning_in_the_learner_process_costs_nothing_split(tmp_path):
    nb = nbformat.read(str(SOLUTIONS / CLASS_WORKBOOK), as_version=4)
    tagged = [c for c in nb.cells if c.cell_type == "code" and is_solution_cell(c)]
    names = ["state_bytes_per_param", "optimizer_state_bytes", "compute_optimizer_size"]
    tagged[-1].source += "\n" + NOISY + "".join(f"{n} = _noisy({n})\n" for n in names)
    (tmp_path / "sub" / "ada").mkdir(parents=True)
    nbformat.write(nb, str(tmp_path / "sub" / "ada" / CLASS_WORKBOOK))
    course = Manifest.load(EXERCISES / MANIFEST_NAME)
    manifest = tmp_path / MANIFEST_NAME
    manifest.write_text(Manifest({CLASS_WORKBOOK: course.notebooks[CLASS_WORKBOOK]}).dumps(), encoding="utf-8")
    out = tmp_path / "grades" / "gradebook.csv"
    rc = gradebook.main([str(tmp_path / "sub"), "--out", str(out), "--manifest", str(manifest), "--sandbox", SANDBOX,
                         "--cell-timeout", "40", "--require-full-marks"])  # fmt: skip
    row = _rows(out)["ada"]
    full = sum(s.points for s in course.notebooks[CLASS_WORKBOOK])
    assert rc == 0 and (row["total"], row["notes"]) == (str(full), ""), row["report"]
    assert "checks in a process of their own" in row["log"] and MESSAGE in row["log"], row["log"][-3000:]
