"""Workbooks 13 and 14 graded by construction with course drivers (issue 53): hostile learners score 0.

13.1 (an optimizer class stepped), 14.1 (hooks that fire during backward) and 14.2 (a function reading a
``MemoryTracker``) are checked by course *drivers* (:mod:`adam8lib.course.grading.drivers`) that run the learner's
class or function in the sandboxed learner process on the scenario the check process sends and return plain data;
the check process recomputes with its own reference. Each row of the issue's table that applies to 13 and 14 is a
learner of one class, graded in the bubblewrap sandbox and with ``--sandbox none`` (the gradebook's guard on, as
always), next to an honest learner with full marks:

* ``closure`` — the guard's closures reached through ``sys.gettrace.__closure__`` (its ``busy`` set given this
  thread, its ``sent`` set filled so that it says nothing more), then the frame walk and the heap search that took
  the checks in the one-process workbooks: the learner process holds no check, expected value or token; the cell's
  own report says what it found (nothing);
* ``lies`` — an ``int`` subclass whose ``__eq__`` is always True (13.2) and a tensor subclass whose torch-function
  handler is assigned under another name (``__torch_function__ = classmethod(_h)``, 13.3): they cross as a plain
  ``int`` and a plain tensor and are compared in the check process;
* ``tables`` — the checks' case tables emptied in place (``STATE_BYTES_CASES.clear()``, ``_OPTIMIZERS.clear()``):
  under bubblewrap the learner process is not shown the checks at all (``ModuleNotFoundError``), without a sandbox
  it empties its own copies, and the check process loops over its own;
* ``refs`` — references the guard did not know: the checks' public helpers (``reference_state_bytes``,
  ``reference_lion_flips``, reached through ``importlib`` with names built at run time) and the library's
  ``Lion8bit`` subclassed as "from scratch": under bubblewrap the checks are not there; without a sandbox the
  guard reports the helpers (``reference_*`` are course references now); a class built on the library's Lion is
  refused by 13.1 itself (the driver says what it is built on), in both modes;
* ``quiet_refs`` — the same helpers called with ``/dev/null`` ``dup2``'d onto the alarm pipe around each call:
  0 under bubblewrap (nothing to call); **not prevented** without a sandbox (the guard's report is lost; the
  README says so);
* ``spinner`` — a cell that ignores ``SIGALRM`` and spins: stopped from outside by the check process's clock at
  the cell timeout, the workbook graded again without it (13.1: 0, 13.2 and 13.3 keep their points);
* ``escape`` (``--sandbox none``) — a double-forked ``setsid`` grandchild that would rewrite the finished
  gradebook.csv: the whole process tree is ended before the gradebook is written.
"""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

import nbformat
import pytest

from adam8lib.course.grading import checker, gradebook, sandbox
from adam8lib.course.grading.conventions import MANIFEST_NAME, Manifest, cell_source, is_solution_cell

REPO = Path(__file__).resolve().parents[2]
WB09, WB13, WB14 = "09_memory_maths.ipynb", "13_one_state_many_optimizers.ipynb", "14_the_whole_bill.ipynb"
EX09 = ("state_megabytes", "training_memory", "adamw_state_elements", "seed_adam8bit")
EX13, EX14 = ("lion8bit", "state_bytes", "lion_flips"), ("release_by_hand", "bill_row")
EXERCISES = {WB09: EX09, WB13: EX13, WB14: EX14}
CHECKS13 = "adam8lib.course.checks.ex13_one_state_many_optimizers"
MODES = ["bwrap", "none"] if sandbox.available() is None else ["none"]
TIMEOUT = 120


def _solution_cells(workbook: str, exercises: tuple) -> dict[str, str]:
    nb = nbformat.read(str(REPO / "solutions" / workbook), as_version=4)
    cells = [cell_source(c) for c in nb.cells if c.cell_type == "code" and is_solution_cell(c)]
    assert len(cells) == len(exercises)
    return dict(zip(exercises, cells))


SOLVED09, SOLVED13, SOLVED14 = _solution_cells(WB09, EX09), _solution_cells(WB13, EX13), _solution_cells(WB14, EX14)

CLOSURE = '''
def state_bytes(shape, stored_as, state_format):
    return 0
import gc, sys, threading
silenced = 0
for cell in getattr(sys.gettrace, "__closure__", None) or ():
    try:
        value = cell.cell_contents
    except ValueError:
        continue
    if isinstance(value, set):  # the guard's busy (thread ids) and sent (lines said) sets
        value.add(threading.get_ident())
        value.update(f"said {i}" for i in range(300))
        silenced += 1
hits = set()
try:
    frame = sys._getframe()
    while frame is not None:
        hits |= set(frame.f_locals) & {"resolved", "expected_output", "want", "token"}
        frame = frame.f_back
    for o in gc.get_objects():
        if isinstance(o, dict) and ("expected_output" in o or "resolved" in o):
            hits.add("a table of checks")
except Exception as exc:
    hits.add(f"refused ({type(exc).__name__})")
raise RuntimeError(f"the guard's sets silenced: {silenced}; found {sorted(hits) or 'nothing'}")
'''
LIES_INT = '''
class Yes(int):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = int.__hash__
def state_bytes(shape, stored_as, state_format):
    return Yes(0)
'''
LIES_TENSOR = '''
import torch
def _h(cls, func, types, args=(), kwargs=None):
    if func in (torch.equal, torch.allclose, torch.Tensor.equal, torch.Tensor.__eq__, torch.Tensor.__ne__):
        return True
    return torch.Tensor.__torch_function__.__func__(cls, func, types, args, kwargs or {})
class Agree(torch.Tensor):
    pass
Agree.__torch_function__ = classmethod(_h)
def lion_flips(m, g, beta1, state_format):
    return torch.zeros(m.shape, dtype=torch.bool).as_subclass(Agree)
'''
TABLES13 = f'''
def state_bytes(shape, stored_as, state_format):
    return 0
import importlib
importlib.import_module("{CHECKS13}").STATE_BYTES_CASES.clear()
'''
TABLES14 = '''
def release_by_hand(model, make_optimizer):
    return []
import importlib
importlib.import_module("adam8lib.course.checks.ex14_the_whole_bill")._OPTIMIZERS.clear()
'''
REFS_CLASS = '''
import importlib
Lion8bitFromScratch = type("Lion8bitFromScratch", (importlib.import_module("adam8lib.fam" + "ily").Lion8bit,), {})
'''
REFS = f'''
import importlib
def _course():
    return importlib.import_module("{CHECKS13[:-len("one_state_many_optimizers")]}" + "one_state_many_optimizers")
def state_bytes(shape, stored_as, state_format):
    return _course().reference_state_bytes(shape, stored_as, state_format)
def lion_flips(m, g, beta1, state_format):
    return _course().reference_lion_flips(m, g, beta1, state_format)
'''
QUIET = REFS.replace("def state_bytes", '''import os, sys
_alarm = int(sys.argv[sys.argv.index("--alarm-fd") + 1])
def _quietly(call):
    null, saved = os.open(os.devnull, os.O_WRONLY), os.dup(_alarm)
    os.dup2(null, _alarm)
    try:
        return call()
    finally:
        os.dup2(saved, _alarm)
        os.close(saved)
        os.close(null)
def state_bytes''').replace("    return _course().reference_state_bytes(shape, stored_as, state_format)",
                            "    return _quietly(lambda: _course().reference_state_bytes(shape, stored_as, state_format))"
                            ).replace("    return _course().reference_lion_flips(m, g, beta1, state_format)",
                                      "    return _quietly(lambda: _course().reference_lion_flips(m, g, beta1, state_format))")
LIES09 = LIES_INT.replace("def state_bytes(shape, stored_as, state_format):\n    return Yes(0)\n", """
def training_memory(model, kind="adam8bit", blocksize=256, min_8bit_size=4096):
    return {"weights": Yes(0), "gradients": Yes(0), "optimizer": Yes(0), "total": Yes(0)}
def adamw_state_elements(model):
    return Yes(0)
""")
SPIN = "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n"

#: learner -> {workbook: {exercise: cell}} (an exercise left out keeps the workbook's stub: 0 points)
CLASS = {
    "honest": {WB09: SOLVED09, WB13: SOLVED13, WB14: SOLVED14},
    "lies09": {WB09: {"adamw_state_elements": LIES09}},  # the last of the two cells: no stub defined after it
    "closure": {WB13: {"state_bytes": CLOSURE}},
    "lies": {WB13: {"state_bytes": LIES_INT, "lion_flips": LIES_TENSOR}},
    "tables": {WB13: {"state_bytes": TABLES13}, WB14: {"release_by_hand": TABLES14}},
    "refs": {WB13: {"lion8bit": REFS_CLASS, "lion_flips": REFS}},  # the last cell: no stub defined after it
    "quiet_refs": {WB13: {"lion_flips": QUIET}},
    "spinner": {WB13: {"lion8bit": SPIN + SOLVED13["lion8bit"], "state_bytes": SOLVED13["state_bytes"],
                       "lion_flips": SOLVED13["lion_flips"]}},
}  # fmt: skip
assert "reference_state_bytes" in QUIET and QUIET.count("_quietly(lambda") == 2


def _notebook(workbook: str, exercises: tuple, cells: dict[str, str]) -> nbformat.NotebookNode:
    nb = nbformat.read(str(REPO / "exercises" / workbook), as_version=4)
    tagged = [c for c in nb.cells if c.cell_type == "code" and is_solution_cell(c)]
    for cell, exercise in zip(tagged, exercises):
        if exercise in cells:
            cell.source = cells[exercise]
    return nb


def _manifest(root: Path) -> Path:
    course = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
    only = root / MANIFEST_NAME
    only.write_text(Manifest({w: course.notebooks[w] for w in EXERCISES},
                             extras={w: course.extras.get(w, {}) for w in EXERCISES}).dumps(), encoding="utf-8")
    return only


def _write(root: Path, learners: dict) -> None:
    for learner, workbooks in learners.items():
        (root / "sub" / learner).mkdir(parents=True)
        for workbook, cells in workbooks.items():
            exercises = EXERCISES[workbook]
            nbformat.write(_notebook(workbook, exercises, cells), str(root / "sub" / learner / workbook))


def _grade(root: Path, mode: str, timeout: float = TIMEOUT) -> tuple[int, dict]:
    out = root / "grades" / "gradebook.csv"
    rc = gradebook.main([str(root / "sub"), "--out", str(out), "--manifest", str(_manifest(root)), "--sandbox", mode,
                         "--cell-timeout", str(timeout), "--jobs", "2"])  # fmt: skip
    rows = {r["learner"]: r for r in csv.DictReader(out.open(encoding="utf-8"))}
    for name, row in rows.items():
        row["report"] = json.loads((out.parent / "reports" / f"{name}.json").read_text())
    return rc, rows


@pytest.fixture(scope="module", params=MODES)
def graded(request, tmp_path_factory) -> tuple[str, dict]:
    root = tmp_path_factory.mktemp(f"drivers-{request.param}")
    _write(root, CLASS)
    rc, rows = _grade(root, request.param)
    assert rc == 0
    return request.param, rows


def _points(row: dict, exercises: tuple) -> list[int]:
    return [int(row[e]) for e in exercises]


def _said(row: dict, exercise: str) -> str:
    status = row["report"]["statuses"][exercise]
    return f"{status['status']} {status['detail']} {status.get('error', '')}"


def test_workbooks_09_13_and_14_are_graded_by_the_check_process():
    assert WB09 in checker.SPLIT and WB13 in checker.SPLIT and WB14 in checker.SPLIT


def test_the_honest_learner_keeps_full_marks_without_a_note(graded):
    _, rows = graded
    row = rows["honest"]
    assert _points(row, EX09 + EX13 + EX14) == [1] * 9 and row["notes"] == "", row


def test_the_guard_silenced_through_its_closures_leaves_nothing_to_find(graded):
    _, rows = graded
    row = rows["closure"]
    assert _points(row, EX13) == [0, 0, 0], (row["notes"], row["report"]["statuses"])
    assert "found nothing" in row["notes"] or "tampered" in row["notes"], row["notes"]


def test_values_that_lie_cross_as_plain_values(graded):
    _, rows = graded
    row = rows["lies"]
    assert _points(row, EX13) == [0, 0, 0], (row["notes"], row["report"]["statuses"])
    assert "returned 0, expected" in _said(row, "state_bytes") or "state_bytes(" in _said(row, "state_bytes")
    assert "lion_flips(" in _said(row, "lion_flips"), _said(row, "lion_flips")


def test_values_that_lie_about_models_cross_as_plain_values(graded):
    """Workbook 09: the learner's functions get models the driver builds; an ``int`` subclass equal to everything
    comes back as a plain 0."""
    _, rows = graded
    row = rows["lies09"]
    assert _points(row, EX09) == [0, 0, 0, 0], (row["notes"], row["report"]["statuses"])
    assert "adamw_state_elements(an MLP)" in _said(row, "adamw_state_elements"), _said(row, "adamw_state_elements")
    assert "training_memory(DistilBERT (fp32)" in _said(row, "training_memory"), _said(row, "training_memory")


def test_case_tables_emptied_in_the_learner_process_are_not_the_checks(graded):
    mode, rows = graded
    row = rows["tables"]
    assert _points(row, EX13 + EX14) == [0] * 5, (row["notes"], row["report"]["statuses"])
    if mode == "bwrap":  # the learner process is not shown the checks
        assert "ModuleNotFoundError" in row["notes"], row["notes"]
    else:  # it empties its own copies: the check process's tables are whole
        assert "registered 0 hooks" in _said(row, "release_by_hand"), _said(row, "release_by_hand")
        assert "state_bytes((768, 3072), 'm', 'fp32')" in _said(row, "state_bytes"), _said(row, "state_bytes")


def test_references_the_guard_did_not_know_score_zero(graded):
    mode, rows = graded
    row = rows["refs"]
    assert _points(row, EX13) == [0, 0, 0], (row["notes"], row["report"]["statuses"])
    assert "built on the library's adam8lib.family.Lion8bit" in _said(row, "lion8bit"), _said(row, "lion8bit")
    if mode == "bwrap":  # not there to call
        assert f"No module named '{CHECKS13}'" in _said(row, "state_bytes"), _said(row, "state_bytes")
    else:  # called, and reported by the guard
        assert f"course reference {CHECKS13}.reference_state_bytes" in row["notes"], row["notes"]


def test_references_called_with_the_alarm_pipe_silenced(graded):
    mode, rows = graded
    row = rows["quiet_refs"]
    if mode == "bwrap":
        assert _points(row, EX13) == [0, 0, 0], (row["notes"], row["report"]["statuses"])
        assert f"No module named '{CHECKS13}'" in _said(row, "state_bytes"), _said(row, "state_bytes")
    else:  # not prevented without a sandbox: the guard's report goes to /dev/null (README: not prevented)
        assert _points(row, EX13) == [0, 1, 1], (row["notes"], row["report"]["statuses"])


def test_a_cell_that_ignores_its_alarm_is_stopped_from_outside(graded):
    _, rows = graded
    row = rows["spinner"]
    assert _points(row, EX13) == [0, 1, 1], (row["notes"], row["report"]["statuses"])
    assert f"ran past {TIMEOUT} s, ignoring its time limit, and was stopped from outside" in row["notes"], row["notes"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_without_a_sandbox_a_double_forked_grandchild_of_the_learner_process_ends_before_the_gradebook(tmp_path):
    """Workbook 13 (split): the learner process's grandchild leaves its session and tree and would rewrite the
    finished gradebook.csv; the check process (its subreaper) and the gradebook end it before the row is written."""
    out = tmp_path / "grades" / "gradebook.csv"
    pidfile = tmp_path / "grandchild.pid"
    escape = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
        "        time.sleep(8)\n"
        f"        open({str(out)!r}, 'w').write('learner,total,notes\\nescape,99,forged\\n')\n"
        "    os._exit(0)\n"
        "os.wait()\n"
    )
    _write(tmp_path, {"escape": {WB13: {"lion8bit": SOLVED13["lion8bit"], "state_bytes": escape + SOLVED13["state_bytes"],
                                        "lion_flips": SOLVED13["lion_flips"]}}})
    rc, rows = _grade(tmp_path, "none")
    assert rc == 0
    pid = int(pidfile.read_text())
    assert not _alive(pid), f"the grandchild {pid} outlived the run"
    time.sleep(9)  # it would have rewritten the gradebook by now
    rows = {r["learner"]: r for r in csv.DictReader(out.open(encoding="utf-8"))}
    assert _points(rows["escape"], EX13) == [1, 1, 1] and rows["escape"]["total"] == "3", rows
    assert os.path.getsize(out) > 0
