"""Workbook 08 graded by construction with course drivers (issue 53): hostile kernels score 0.

The checks of workbook 08 hand the learner's ``@triton.jit`` kernel to course drivers
(:mod:`adam8lib.course.grading.drivers.ex08`): in the sandboxed learner process the kernel is described and launched
on copies of the sentinel-padded buffers the check process made, and the buffers come back as plain tensors; the
check process copies them into its own and compares there with its own reference. Each learner below puts its cheat
in the first exercise (08.1) and the official solution in the other three, graded in the bubblewrap sandbox and with
``--sandbox none`` (the gradebook's guard on, as always), next to an honest learner with full marks:

* ``closure`` — the guard's closures reached through ``sys.gettrace.__closure__`` (its ``busy`` set given this
  thread, its ``sent`` set filled), then, while the check launches the "kernel", a walk up the frames for the
  check's ``want`` (what took the checks in one process): the learner process holds no expected value, so the
  kernel finds nothing (the guard, watching the launch, may also report the walk: the workbook is then tampered);
* ``lies`` — a "kernel" that turns the buffer it was given into a tensor subclass whose torch-function handler
  (assigned as ``__torch_function__ = classmethod(_h)``) says it equals anything: the buffer crosses as a plain
  tensor and is compared in the check process (nothing was written);
* ``tables`` — the check's case table emptied in place (``_SIZES.clear()``, which in one process leaves the check
  nothing to test): under bubblewrap the learner process is not shown the checks (``ModuleNotFoundError``), without
  a sandbox it empties its own copy and the check process loops over its own.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from adam8lib.course.grading import checker, sandbox
from adam8lib.course.grading.conventions import cell_source, is_solution_cell
from tests.course._one_workbook_class import grade_class, said

REPO = Path(__file__).resolve().parents[2]
WB08 = "08_triton_kernel.ipynb"
EX08 = ("absmax_kernel", "dequantize_kernel", "quantize_kernel", "ema_requantize_kernel")
MODES = ["bwrap", "none"] if sandbox.available() is None else ["none"]
TIMEOUT = 300


def _solution_cells() -> dict[str, str]:
    nb = nbformat.read(str(REPO / "solutions" / WB08), as_version=4)
    cells = [cell_source(c) for c in nb.cells if c.cell_type == "code" and is_solution_cell(c)]
    assert len(cells) == len(EX08)
    return dict(zip(EX08, cells))


SOLVED = _solution_cells()

#: a launchable stand-in for a kernel (the checks accept an object named like Triton's interpreted kernels)
FAKE = '''
class InterpretedFunction:
    def __init__(self, run):
        self.run, self.__name__ = run, "absmax_kernel"
    def __call__(self, *args, **kwargs):
        raise RuntimeError("launch it as kernel[grid](...)")
    def __getitem__(self, grid):
        return self.run
'''
CLOSURE = FAKE + '''
import sys, threading
import torch
for cell in getattr(sys.gettrace, "__closure__", None) or ():
    try:
        value = cell.cell_contents
    except ValueError:
        continue
    if isinstance(value, set):  # the guard's busy (thread ids) and sent (lines said) sets
        value.add(threading.get_ident())
        value.update(f"said {i}" for i in range(300))
def _take(x, absmax, n, BLOCK):
    found = None
    try:
        frame = sys._getframe()
        while frame is not None and found is None:
            want = frame.f_locals.get("want")
            if torch.is_tensor(want) and want.shape == absmax.shape:
                found = want
            frame = frame.f_back
    except Exception as exc:
        raise RuntimeError(f"the frame walk was refused ({type(exc).__name__})")
    if found is None:
        raise RuntimeError("the frame walk found nothing")
    absmax.copy_(found)
absmax_kernel = InterpretedFunction(_take)
'''
LIES = FAKE + '''
import torch
def _h(cls, func, types, args=(), kwargs=None):
    if func in (torch.equal, torch.allclose, torch.isclose, torch.Tensor.equal, torch.Tensor.__eq__,
                torch.Tensor.__ne__, torch.testing.assert_close):
        return True
    return torch.Tensor.__torch_function__.__func__(cls, func, types, args, kwargs or {})
class Agree(torch.Tensor):
    pass
Agree.__torch_function__ = classmethod(_h)
def _agree(x, absmax, n, BLOCK):
    for t in (absmax, absmax._base):
        if t is not None:
            t.__class__ = Agree  # the buffer the check reads now says it equals anything
absmax_kernel = InterpretedFunction(_agree)
'''
TABLES = FAKE + '''
absmax_kernel = InterpretedFunction(lambda *args, **kwargs: None)
import importlib
importlib.import_module("adam8lib.course.checks.ex08_triton" + "_kernel")._SIZES.clear()
'''

CLASS = {
    "honest": SOLVED,
    "closure": {**SOLVED, "absmax_kernel": CLOSURE},
    "lies": {**SOLVED, "absmax_kernel": LIES},
    "tables": {**SOLVED, "absmax_kernel": TABLES},
}


@pytest.fixture(scope="module", params=MODES)
def graded(request, tmp_path_factory) -> tuple[str, dict]:
    root = tmp_path_factory.mktemp(f"drivers08-{request.param}")
    return request.param, grade_class(root, WB08, EX08, CLASS, request.param, TIMEOUT)


def _points(row: dict) -> list[int]:
    return [int(row[e]) for e in EX08]


def test_workbook_08_is_graded_by_the_check_process():
    assert WB08 in checker.SPLIT


def test_the_honest_learner_keeps_full_marks_without_a_note(graded):
    _, rows = graded
    row = rows["honest"]
    assert _points(row) == [1, 1, 1, 1] and row["notes"] == "", row


def test_the_frame_walk_with_the_guard_silenced_finds_no_expected_value(graded):
    _, rows = graded
    row = rows["closure"]
    if "tampered" in row["notes"]:  # the guard still saw the walk: the whole workbook scores 0
        assert _points(row) == [0, 0, 0, 0], (row["notes"], row["report"]["statuses"])
    else:  # nothing to find in the learner process: the kernel wrote nothing
        assert _points(row) == [0, 1, 1, 1], (row["notes"], row["report"]["statuses"])
        assert "the frame walk found nothing" in said(row, "absmax_kernel"), (row["notes"], said(row, "absmax_kernel"))


def test_a_buffer_turned_into_a_lying_tensor_subclass_crosses_as_a_plain_tensor(graded):
    _, rows = graded
    row = rows["lies"]
    assert _points(row) == [0, 1, 1, 1], (row["notes"], row["report"]["statuses"])
    assert "nothing was written into absmax" in said(row, "absmax_kernel"), said(row, "absmax_kernel")


def test_the_case_table_emptied_in_the_learner_process_is_not_the_checks(graded):
    mode, rows = graded
    row = rows["tables"]
    if mode == "bwrap":  # the learner process is not shown the checks: the cell stops at the import
        assert _points(row) == [0, 1, 1, 1], (row["notes"], row["report"]["statuses"])
        assert "ModuleNotFoundError" in row["notes"], row["notes"]
    else:  # it empties its own copy: the check process loops over its own table
        assert _points(row)[0] == 0, (row["notes"], row["report"]["statuses"])
        assert "absmax_kernel on 1000 values" in said(row, "absmax_kernel"), said(row, "absmax_kernel")
