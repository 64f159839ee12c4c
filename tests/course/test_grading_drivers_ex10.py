"""Workbook 10 graded by construction with course drivers (issue 53): hostile training code scores 0.

The checks of workbook 10 hand the learner's training code to course drivers
(:mod:`adam8lib.course.grading.drivers.ex10`): in the sandboxed learner process the drivers build the models,
optimizers, schedules, loaders, accelerators, Trainer arguments and GradScalers, run the learner's function on them
with a spy recording its calls, and return plain data (answers, events, losses, parameters); the check process
recomputes the reference itself and compares. Each learner below puts its cheat in one exercise and the official
solution in the others, graded in the bubblewrap sandbox and with ``--sandbox none`` (the gradebook's guard on, as
always), next to an honest learner with full marks:

* ``closure`` — the guard's closures reached through ``sys.gettrace.__closure__`` (its ``busy`` set given this
  thread, its ``sent`` set filled), then the frame walk and the heap search for the checks' table, expected output
  or token (what took the checks in one process), in 10.2's cell: the learner process holds none of them;
* ``lies`` — 10.2's step forgets ``zero_grad`` and returns its loss as a ``float`` subclass whose ``__sub__`` gives
  0 and whose ``__eq__`` is always True (in one process the check's ``abs(got - ref)`` saw 0): it crosses as a
  plain ``float``, and the check names the mistake;
* ``patched`` — 10.4's loop forgets ``zero_grad`` and replaces the check's own reference loop with one that forgets
  it too (``_reference_epoch``, through ``importlib``): under bubblewrap the learner process is not shown the checks
  (``ModuleNotFoundError``), without a sandbox it patches its own copy and the check process compares with its own.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from adam8lib.course.grading import checker, sandbox
from adam8lib.course.grading.conventions import cell_source, is_solution_cell
from tests.course._one_workbook_class import grade_class, said

REPO = Path(__file__).resolve().parents[2]
WB10 = "10_mixed_precision_finetune.ipynb"
EX10 = ("decay_parameter_names", "training_step", "trainer_8bit", "accelerate_epoch", "amp_step")
MODES = ["bwrap", "none"] if sandbox.available() is None else ["none"]
TIMEOUT = 300


def _solution_cells() -> dict[str, str]:
    nb = nbformat.read(str(REPO / "solutions" / WB10), as_version=4)
    cells = [cell_source(c) for c in nb.cells if c.cell_type == "code" and is_solution_cell(c)]
    assert len(cells) == len(EX10)
    return dict(zip(EX10, cells))


SOLVED = _solution_cells()

CLOSURE = '''
import torch
def training_step(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    return 0.0
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
LIES = '''
import torch
class Close(float):
    def __sub__(self, other):
        return 0.0
    def __rsub__(self, other):
        return 0.0
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = float.__hash__
def training_step(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    device_type = next(model.parameters()).device.type
    with torch.autocast(device_type, dtype=dtype):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    scheduler.step()  # no zero_grad: the gradients add up
    return Close(loss.item())
'''
PATCHED = '''
def train_epoch(accelerator, model, optimizer, loader, scheduler, max_grad_norm=1.0):
    model.train()
    losses = []
    for batch in loader:
        loss = model(**batch).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        scheduler.step()  # no zero_grad: the gradients add up
        losses.append(loss.item())
    return losses
import functools, importlib
_course = importlib.import_module("adam8lib.course.checks.ex10" + "_finetune")
_course._reference_epoch = functools.partial(_course._reference_epoch, zero=False)
'''

CLASS = {
    "honest": SOLVED,
    "closure": {**SOLVED, "training_step": CLOSURE},
    "lies": {**SOLVED, "training_step": LIES},
    "patched": {**SOLVED, "accelerate_epoch": PATCHED},
}


@pytest.fixture(scope="module", params=MODES)
def graded(request, tmp_path_factory) -> tuple[str, dict]:
    root = tmp_path_factory.mktemp(f"drivers10-{request.param}")
    return request.param, grade_class(root, WB10, EX10, CLASS, request.param, TIMEOUT)


def _points(row: dict) -> list[int]:
    return [int(row[e]) for e in EX10]


def test_workbook_10_is_graded_by_the_check_process():
    assert WB10 in checker.SPLIT


def test_the_honest_learner_keeps_full_marks_without_a_note(graded):
    _, rows = graded
    row = rows["honest"]
    assert _points(row) == [1, 1, 1, 1, 1] and row["notes"] == "", row


def test_the_guard_silenced_through_its_closures_leaves_nothing_to_find(graded):
    _, rows = graded
    row = rows["closure"]
    if "tampered" in row["notes"]:  # the guard still saw the walk: the whole workbook scores 0
        assert _points(row) == [0, 0, 0, 0, 0], (row["notes"], row["report"]["statuses"])
    else:
        assert _points(row) == [1, 0, 1, 1, 1], (row["notes"], row["report"]["statuses"])
        assert "found nothing" in row["notes"], row["notes"]


def test_a_loss_that_lies_crosses_as_a_plain_float(graded):
    _, rows = graded
    row = rows["lies"]
    assert _points(row) == [1, 0, 1, 1, 1], (row["notes"], row["report"]["statuses"])
    assert "gradients add up across steps" in said(row, "training_step"), said(row, "training_step")


def test_the_checks_reference_patched_in_the_learner_process_is_not_the_checks(graded):
    mode, rows = graded
    row = rows["patched"]
    if mode == "bwrap":  # the learner process is not shown the checks: the cell stops at the import
        assert "ModuleNotFoundError" in row["notes"], row["notes"]
    if "tampered" in row["notes"]:  # without a sandbox the guard may also see the check module patched
        assert _points(row) == [0, 0, 0, 0, 0], (row["notes"], row["report"]["statuses"])
    else:
        assert _points(row) == [1, 1, 1, 0, 1], (row["notes"], row["report"]["statuses"])
        assert "the gradients are never zeroed" in said(row, "accelerate_epoch"), said(row, "accelerate_epoch")
