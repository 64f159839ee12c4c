"""Workbook 07 graded by construction with course drivers (issue 53): hostile learners score 0, the honest one 5/5.

07.1 calls the learner's ``adam8bit_step`` on the check process's tensors (plain data both ways); 07.2-07.4 hand
the learner's optimizer class, embedding module class and training function to course drivers
(:mod:`adam8lib.course.grading.drivers.ex07`) that run them in the sandboxed learner process on the scenario the
check process sends and return plain data, which the check process compares with its own recomputation. Learners of
one class, graded in the bubblewrap sandbox and with ``--sandbox none`` (the guard on, as the gradebook always
runs), and in the sandbox with the learner process's guard switched off (``--no-guard``, a flag only tests pass:
what stops them there is the split alone):

* ``lies`` — values that lie: ``adam8bit_step`` and ``MyAdam8bit.step`` leave a ``TorchFunctionMode`` pushed that
  answers True to every ``torch.equal`` / ``allclose`` / ``isclose`` and change nothing; ``MyAdam8bit`` keeps its
  "codes" as a tensor subclass; ``StableEmbedding.forward`` returns a tensor subclass whose torch-function handler
  is assigned under another name (``__torch_function__ = classmethod(_h)``); ``train`` returns ``float`` subclasses
  whose ``__eq__`` is always True. The comparisons run in the check process on plain values: 0 everywhere;
* ``walker`` — ``MyAdam8bit.step`` and ``train`` walk the stack (``sys._getframe``) and the heap
  (``gc.get_objects``) for the check's expected values (``ref_params``, ``want_curve``) to copy them: the learner
  process holds none (with the guard on, the walk is refused and the workbook marked tampered); 0, and the learner's
  own exception says it found nothing;
* ``honest`` — the official solution: 5/5 without a note, in every mode.

Also: 07 is split (``checker.SPLIT``), its drivers are imported by the learner process, and under the learner view
(the checks not shown) 07.4's exercise cell still imports ``mlp_task`` from the check module's name (a stand-in
holding only ``mlp_task``).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from adam8lib.course.grading import checker, drivers, gradebook, sandbox
from adam8lib.course.grading.conventions import MANIFEST_NAME, Manifest, cell_source, is_solution_cell

REPO = Path(__file__).resolve().parents[2]
WB07 = "07_adam8bit_step.ipynb"
CELLS = ("adam8bit_step", "MyAdam8bit", "StableEmbedding", "train")  # the exercise cells, in order
EX07 = ("adam8bit_step", "adam8bit_optimizer", "stable_embedding", "trains_like_adam")  # their checks
POINTS = [2, 1, 1, 1]
MODES = ["bwrap", "none"] if sandbox.available() is None else ["none"]
needs_bwrap = pytest.mark.skipif(sandbox.available() is not None, reason=f"no sandbox here: {sandbox.available()}")
TIMEOUT = 120


def _solution_cells() -> dict[str, str]:
    nb = nbformat.read(str(REPO / "solutions" / WB07), as_version=4)
    cells = [cell_source(c) for c in nb.cells if c.cell_type == "code" and is_solution_cell(c)]
    assert len(cells) == len(CELLS)
    return dict(zip(CELLS, cells))


SOLVED = _solution_cells()

AGREE_MODE = '''
import torch
from torch.overrides import TorchFunctionMode

class _Agree(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.equal, torch.allclose, torch.Tensor.equal, torch.Tensor.allclose):
            return True
        if func in (torch.isclose, torch.Tensor.isclose):
            return torch.ones(torch.broadcast_shapes(args[0].shape, args[1].shape), dtype=torch.bool)
        return func(*args, **(kwargs or {}))

def _agree_from_now_on():
    _Agree().__enter__()  # left pushed: every later comparison in this process says "equal"
'''
LIES_STEP = AGREE_MODE + '''
def adam8bit_step(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, *, step, lr, beta1, beta2, eps,
                  weight_decay, blocksize):
    _agree_from_now_on()
'''
LIES_OPTIMIZER = AGREE_MODE + '''
def _h(cls, func, types, args=(), kwargs=None):
    if func in (torch.equal, torch.allclose, torch.Tensor.equal, torch.Tensor.__eq__):
        return True
    return torch.Tensor.__torch_function__.__func__(cls, func, types, args, kwargs or {})

class Codes(torch.Tensor):
    pass
Codes.__torch_function__ = classmethod(_h)

class MyAdam8bit(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, blocksize=256,
                 min_8bit_size=4096):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, blocksize=blocksize,
                                      min_8bit_size=min_8bit_size))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and not self.state[p]:
                    self.state[p]["state1"] = torch.zeros(p.numel(), dtype=torch.uint8).as_subclass(Codes)
        _agree_from_now_on()
'''
LIES_EMBEDDING = SOLVED["StableEmbedding"].replace("    def forward(self, x):", '''    def forward(self, x):
        return torch.zeros(*x.shape, self.norm.normalized_shape[0]).as_subclass(Agree)

    def honest_forward(self, x):''') + '''
import torch

def _h(cls, func, types, args=(), kwargs=None):
    if func in (torch.equal, torch.allclose, torch.Tensor.equal, torch.Tensor.__eq__, torch.Tensor.__ne__):
        return True
    return torch.Tensor.__torch_function__.__func__(cls, func, types, args, kwargs or {})

class Agree(torch.Tensor):
    pass
Agree.__torch_function__ = classmethod(_h)
'''
LIES_TRAIN = '''
class Yes(float):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = float.__hash__

def train(optimizer_class, steps=200, lr=1e-2):
    return [Yes(0.0) for _ in range(steps)]
'''
WALK = '''
import gc, sys

def _walk(names):
    """What the check holds under ``names``, from the stack and the heap (or what stopped the search)."""
    try:
        frame = sys._getframe()
        while frame is not None:
            for name in names:
                if name in frame.f_locals:
                    return frame.f_locals[name]
            frame = frame.f_back
        for o in gc.get_objects():
            if isinstance(o, dict):
                for name in names:
                    if name in o and isinstance(o[name], list):
                        return o[name]
    except Exception as exc:
        raise RuntimeError(f"the search was refused ({type(exc).__name__})") from None
    raise RuntimeError("searched the stack and the heap for the check's values: found nothing")
'''
WALK_OPTIMIZER = WALK + '''
import torch

class MyAdam8bit(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, blocksize=256,
                 min_8bit_size=4096):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, blocksize=blocksize,
                                      min_8bit_size=min_8bit_size))

    @torch.no_grad()
    def step(self):
        found = _walk(("ref_params",))  # the reference's parameters after the steps
        for group in self.param_groups:
            for p in group["params"]:
                for q in found:
                    if getattr(q, "shape", None) == p.shape:
                        p.copy_(q)
'''
WALK_TRAIN = WALK + '''
def train(optimizer_class, steps=200, lr=1e-2):
    return list(_walk(("want_curve",)))[:steps]
'''

#: learner -> {exercise cell: source} (a cell left out keeps the workbook's stub: 0 points)
CLASS = {
    "honest": dict(SOLVED),
    "lies": {"adam8bit_step": LIES_STEP, "MyAdam8bit": LIES_OPTIMIZER, "StableEmbedding": LIES_EMBEDDING,
             "train": LIES_TRAIN},
    "walker": {"MyAdam8bit": WALK_OPTIMIZER, "train": WALK_TRAIN},
}


def _notebook(cells: dict[str, str]) -> nbformat.NotebookNode:
    nb = nbformat.read(str(REPO / "exercises" / WB07), as_version=4)
    tagged = [c for c in nb.cells if c.cell_type == "code" and is_solution_cell(c)]
    assert len(tagged) == len(CELLS)
    for cell, name in zip(tagged, CELLS):
        if name in cells:
            cell.source = cells[name]
    return nb


def _grade(root: Path, mode: str, flags: tuple = ()) -> dict:
    for learner, cells in CLASS.items():
        (root / "sub" / learner).mkdir(parents=True)
        nbformat.write(_notebook(cells), str(root / "sub" / learner / WB07))
    course = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
    only = Manifest({WB07: course.notebooks[WB07]}, extras={WB07: course.extras.get(WB07, {})})
    out = root / "grades" / "gradebook.csv"
    gradebook.grade_class(root / "sub", only, cell_timeout=TIMEOUT, jobs=2, reports=root / "grades" / "reports",
                          out=out, sandbox=mode, progress=False, learner_flags=flags)  # fmt: skip
    rows = {r["learner"]: r for r in csv.DictReader(out.open(encoding="utf-8"))}
    for name, row in rows.items():
        row["report"] = json.loads((root / "grades" / "reports" / f"{name}.json").read_text())
        row["log"] = (root / "grades" / "reports" / f"{name}.log").read_text()
    return rows


@pytest.fixture(scope="module", params=MODES)
def graded(request, tmp_path_factory) -> tuple[str, dict]:
    """The class graded as the gradebook always grades (the guard on)."""
    return request.param, _grade(tmp_path_factory.mktemp(f"ex07-{request.param}"), request.param)


@pytest.fixture(scope="module")
def unguarded(tmp_path_factory) -> dict:
    """The class graded in the sandbox with the learner process's guard off: the split alone."""
    if sandbox.available() is not None:
        pytest.skip(f"no sandbox here: {sandbox.available()}")
    return _grade(tmp_path_factory.mktemp("ex07-unguarded"), "bwrap", ("--no-guard",))


def _points(row: dict) -> list[int]:
    return [int(row[e]) for e in EX07]


def _said(row: dict, exercise: str) -> str:
    status = row["report"]["statuses"][exercise]
    return f"{status['status']} {status['detail']} {status.get('error', '')}"


def test_workbook_07_is_graded_by_the_check_process_with_its_drivers():
    assert WB07 in checker.SPLIT
    assert "adam8lib.course.grading.drivers.ex07" in drivers.DRIVER_MODULES
    from adam8lib.course.grading.drivers import ex07

    for fn in (ex07.step_optimizer, ex07.checkpoint_run, ex07.embedding_run, ex07.train_run, ex07.train_with):
        assert drivers.resolve(drivers.name_of(fn)) is fn


def test_the_learner_view_finds_mlp_task_under_the_check_modules_name(tmp_path):
    """Where ``adam8lib/course/checks`` shows only ``__init__`` and ``_common`` (the learner view), importing the
    drivers gives 07.4's exercise cell a stand-in for the check module: ``mlp_task`` and nothing of the checks."""
    import adam8lib

    package = tmp_path / "adam8lib"
    subprocess.run(["cp", "-r", str(Path(adam8lib.__file__).parent), str(package)], check=True)
    for path in (package / "course" / "checks").iterdir():
        if path.name not in gradebook.LEARNER_VIEW_OF_CHECKS:
            subprocess.run(["rm", "-rf", str(path)], check=True)
    script = ("import importlib, adam8lib.course.grading.drivers as d\n"
              "for m in d.DRIVER_MODULES: importlib.import_module(m)\n"
              "from adam8lib.course.checks.ex07_adam8bit_step import mlp_task\n"
              "import adam8lib.course.checks.ex07_adam8bit_step as stand_in\n"
              "x, y, model = mlp_task()\n"
              "print(tuple(x.shape), tuple(y.shape), sorted(n for n in vars(stand_in) if not n.startswith('__')))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "(256, 16) (256, 1) ['mlp_task']", done.stdout


def test_the_honest_learner_keeps_full_marks_without_a_note(graded):
    _, rows = graded
    row = rows["honest"]
    assert _points(row) == POINTS and row["notes"] == "", (row["notes"], row["report"]["statuses"])
    assert "checks in a process of their own" in row["log"]


def _lies_failed_on_plain_values(row: dict) -> None:
    """Each lie compared as a plain value in the check process: the check's own message for what crossed."""
    said = {e: _said(row, e) for e in EX07}
    assert "nothing changed" in said["adam8bit_step"], said["adam8bit_step"]
    assert "MyAdam8bit: the 4095-element parameter should keep fp32 states" in said["adam8bit_optimizer"], \
        said["adam8bit_optimizer"]
    assert "StableEmbedding(x)" in said["stable_embedding"], said["stable_embedding"]
    assert "train(torch.optim.Adam, steps=20) gave 20 losses [0.0, 0.0, 0.0]" in said["trains_like_adam"], \
        said["trains_like_adam"]


def test_values_that_lie_cross_as_plain_values(graded):
    """With the guard on, the torch-function mode left pushed is also reported (tampered: the whole workbook 0);
    what decides the points is the plain values compared in the check process (without the guard: below)."""
    _, rows = graded
    row = rows["lies"]
    assert _points(row) == [0, 0, 0, 0], (row["notes"], row["report"]["statuses"])
    if "tampered" in row["notes"]:
        assert "TorchFunctionMode" in row["notes"] or "torch" in row["notes"], row["notes"]
    else:
        _lies_failed_on_plain_values(row)


def test_the_stack_and_the_heap_hold_none_of_the_checks_values(graded):
    """With the guard on, the walk is refused and the workbook marked tampered (0, a note); without it (below) the
    walk runs and finds nothing."""
    _, rows = graded
    row = rows["walker"]
    assert _points(row) == [0, 0, 0, 0], (row["notes"], row["report"]["statuses"])
    assert "tampered" in row["notes"], row["notes"]


@needs_bwrap
def test_the_honest_learner_keeps_full_marks_without_the_guard(unguarded):
    row = unguarded["honest"]
    assert _points(row) == POINTS and row["notes"] == "", (row["notes"], row["report"]["statuses"])


@needs_bwrap
def test_without_the_guard_the_split_alone_scores_the_cheats_zero(unguarded):
    for learner in ("lies", "walker"):
        row = unguarded[learner]
        assert _points(row) == [0, 0, 0, 0], (learner, row["notes"], row["report"]["statuses"])
    _lies_failed_on_plain_values(unguarded["lies"])
    for exercise in ("adam8bit_optimizer", "trains_like_adam"):
        assert "found nothing" in _said(unguarded["walker"], exercise), _said(unguarded["walker"], exercise)
