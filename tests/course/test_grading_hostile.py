"""Hostile submissions of workbook 12 against the gradebook (issue 38): each cheat scores 0 with a
note naming what was found, the honest learner keeps full marks without a note.

The four cheats of the issue and variants of them, each a learner of one class graded in the
bubblewrap sandbox (one grading process per learner, two at a time):

* **references** — the checks' own implementations returned as the learner's (``c1_*``): through
  ``adam8lib.course`` under an alias, wrapped in a lambda / partial / def, and reached at call
  time through ``importlib``, ``__import__`` and ``sys.modules`` with names built from strings;
* **frames** — the call stack walked to what the checks compare against (``c2_*``): with
  ``sys._getframe``, a traceback's ``tb_frame``, ``inspect.stack()``, a generator's frame,
  ``gc.get_objects()``, ``sys.settrace``, a signal handler (it receives the interrupted frame);
* **the result channel** — the runner's sender (its token in a closure) taken from the stack
  (``c3_*``) and "passed" sent for every check, and the guard's own alarm pipe closed;
* **comparisons** — a ``TorchFunctionMode`` left pushed (``c4_mode``), a ``TorchDispatchMode``
  pushed inside the learner's function, a tensor subclass whose ``__torch_function__`` answers
  True, and torch / numpy / builtins functions monkey-patched (``c4_*``);
* ``sys.getprofile`` / ``ctypes`` reaching the guard or raw memory (``c5_*``).

Every cheating learner also writes the correct solution where the cheat leaves room for it, so
a cheat that went unnoticed would show as points, and a cheat that was merely blocked but not
reported would show as an exercise without a note.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import nbformat
import pytest

from adam8lib.course.grading import gradebook, sandbox
from adam8lib.course.grading.conventions import MANIFEST_NAME, Manifest, cell_source, is_solution_cell

REPO = Path(__file__).resolve().parents[2]
WORKBOOK = "12_beyond_8_bits.ipynb"
EXERCISES = ("pack_nibbles", "zero_point_victims", "rank1_scale", "stochastic_round")
CHECKS = "adam8lib.course.checks.ex12_beyond_8_bits"

needs_bwrap = pytest.mark.skipif(sandbox.available() is not None, reason=f"no sandbox here: {sandbox.available()}")


def _solution_cells() -> list[str]:
    nb = nbformat.read(str(REPO / "solutions" / WORKBOOK), as_version=4)
    return [cell_source(c) for c in nb.cells if c.cell_type == "code" and is_solution_cell(c)]


SOLVED = dict(zip(EXERCISES, _solution_cells()))
ALL_SOLVED = "\n\n".join(SOLVED.values())

# ---- the cheats ------------------------------------------------------------------------------
C1_ALIAS = {  # the checks' references, imported through adam8lib.course under another name
    "pack_nibbles": f"import torch\nimport {CHECKS} as notes12\npack_nibbles = notes12.pack_nibbles\n"
                    "unpack_nibbles = lambda packed, n: notes12.unpack_nibbles(packed, n)",
    "zero_point_victims": "import functools\nfrom adam8lib.course import checks as course_checks\n"
                          "zero_point_victims = functools.partial(course_checks.ex12_beyond_8_bits._victims)",
    "rank1_scale": "def rank1_scale(x):\n    return notes12._rank1(x)",
    "stochastic_round": "import torch\nfrom adam8lib.course.checks.ex12_beyond_8_bits import _bf16_neighbours as nb\n"
                        "def stochastic_round(x, generator):\n    low, high = nb(x)\n"
                        "    frac = (x.double() - low.double()) / (high.double() - low.double()).clamp(min=1e-300)\n"
                        "    up = torch.rand(x.shape, generator=generator, dtype=torch.float64) < frac\n"
                        "    return torch.where(up, high, low).to(torch.bfloat16)",
}  # fmt: skip
C1_DYNAMIC = {  # the same, found only when the function runs, by names built from strings
    "pack_nibbles": "import importlib\ndef pack_nibbles(codes):\n"
                    "    return getattr(importlib.import_module('adam8lib.' + 'formats'), 'pack_' + 'nibbles')(codes)\n"
                    "def unpack_nibbles(packed, n):\n"
                    "    return getattr(__import__('adam8lib.formats', fromlist=['x']), 'unpack_nibbles')(packed, n)",
    "zero_point_victims": "import sys\ndef zero_point_victims(m, v, qmap, blocksize):\n"
                          f"    return getattr(sys.modules['{CHECKS}'], '_vic' + 'tims')(m, v, qmap, blocksize)",
    "rank1_scale": "def rank1_scale(x):\n    ns = {}\n"
                   f"    exec('from {CHECKS} import _rank1 as r', ns)\n    return ns['r'](x)",
    "stochastic_round": C1_ALIAS["stochastic_round"].replace(
        "from adam8lib.course.checks.ex12_beyond_8_bits import _bf16_neighbours as nb\n",
        f"import sys\nnb = lambda x: getattr(sys.modules['{CHECKS}'], '_bf16_' + 'neighbours')(x)\n"),
}  # fmt: skip

#: find the frame whose locals hold ``name`` by one of several routes; None when refused
FIND = '''
import sys
def find(name, route):
    try:
        if route == "getframe":
            f = sys._getframe()
        elif route == "traceback":
            try:
                raise KeyError(name)
            except KeyError as exc:
                f = exc.__traceback__.tb_frame
        elif route == "inspect":
            import inspect
            f = inspect.stack()[0].frame
        elif route == "generator":
            box = []
            def gen():
                yield box[0].gi_frame.f_back  # a running generator's frame: its caller is next's caller
            box.append(gen())
            f = next(box[0])
        while f is not None and name not in f.f_locals:
            f = f.f_back
        return f.f_locals if f is not None else None
    except Exception:
        return None
'''


#: wrong answers everywhere (zeros of the right shape and dtype)
WRONG = '''
import torch
def pack_nibbles(codes):
    return torch.zeros((codes.numel() + 1) // 2, dtype=torch.uint8)
def unpack_nibbles(packed, n):
    return torch.zeros(n, dtype=torch.uint8)
def zero_point_victims(m, v, qmap, blocksize):
    return torch.zeros(v.shape, dtype=torch.bool)
def rank1_scale(x):
    return torch.zeros_like(x)
def stochastic_round(x, generator):
    return x.to(torch.bfloat16)
'''
def _want(route: str) -> dict:
    """Wrong answers everywhere, except what the check compares against, found on the stack by ``route``
    (``want``; ``codes`` for unpack); stochastic rounding solved (its check keeps no expected value)."""
    cheat = WRONG
    for fn, local in (("pack_nibbles(codes)", "want"), ("unpack_nibbles(packed, n)", "codes"),
                      ("zero_point_victims(m, v, qmap, blocksize)", "want"), ("rank1_scale(x)", "want")):
        cheat = cheat.replace(f"def {fn}:\n", f"def {fn}:\n    got = find({local!r}, {route!r})\n"
                                               f"    if got is not None:\n        return got[{local!r}].clone()\n")
    cheat = cheat.replace("def stochastic_round(x, generator):\n    return x.to(torch.bfloat16)\n", "")
    assert cheat.count("find(") == 4
    return {"pack_nibbles": FIND + cheat + "\n" + SOLVED["stochastic_round"], "zero_point_victims": "",
            "rank1_scale": "", "stochastic_round": ""}


C2_RUNNER = {  # walk up to the runner and make every check a function that prints its success line
    "pack_nibbles": FIND + ALL_SOLVED + '''
import types
found = find("resolved", "getframe")
if found is not None:
    for spec in found["checks"]:
        check, expression = found["resolved"][spec["exercise"]]
        line = spec["expected_output"]
        fake = compile(f"def fake(*a, **k):\\n    print({line!r}, end='')\\n", check.__code__.co_filename, "exec")
        ns = {}
        exec(fake, ns)
        found["resolved"][spec["exercise"]] = (ns["fake"], expression)
''', "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}
C2_GC = {  # the same through the heap: the runner's table of checks and their specs
    "pack_nibbles": WRONG + '''
import gc
exercises = {"pack_nibbles", "zero_point_victims", "rank1_scale", "stochastic_round"}
try:
    table = [o for o in gc.get_objects() if isinstance(o, dict) and set(o) == exercises]
    lines = {o["exercise"]: o["expected_output"] for o in gc.get_objects()
             if isinstance(o, dict) and "expected_output" in o and "exercise" in o}
    for resolved in table:
        for exercise, (check, expression) in list(resolved.items()):
            ns = {}
            exec(compile(f"def fake(*a, **k):\\n    print({lines[exercise]!r}, end='')\\n", check.__code__.co_filename, "exec"), ns)
            resolved[exercise] = (ns["fake"], expression)
except RuntimeError:
    pass
''', "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}
C2_TRACE = {"pack_nibbles": ALL_SOLVED + '''
import sys
def spy(frame, event, arg):
    if "want" in frame.f_locals:
        pass
    return spy
try:
    sys.settrace(spy)
except RuntimeError:
    pass
''', "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}
C2_SIGNAL = {"pack_nibbles": ALL_SOLVED + '''
import signal
def peek(signum, frame):
    frame.f_back
try:
    signal.signal(signal.SIGVTALRM, peek)
    signal.setitimer(signal.ITIMER_VIRTUAL, 0.01, 0.01)
except RuntimeError:
    pass
''', "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}

C3_SENDER = {"pack_nibbles": FIND + ALL_SOLVED + '''
import os
for route in ("getframe", "traceback", "generator"):
    found = find("send", route)
    if found is not None and "checks" in found:
        for spec in found["checks"]:
            found["send"](kind="result", exercise=spec["exercise"], status="passed", detail="")
        found["send"](kind="done")
        os._exit(0)
''', "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}
C3_CLOSE = {"pack_nibbles": ALL_SOLVED + '''
import os, sys
os.close(int(sys.argv[sys.argv.index("--alarm-fd") + 1]))
''', "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}

MODE = '''
import torch
from torch.overrides import TorchFunctionMode
class Agree(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.equal, torch.allclose, torch.Tensor.equal):
            return True
        return func(*args, **(kwargs or {}))
Agree().__enter__()
'''
C4_MODE = {"pack_nibbles": WRONG + MODE, "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}
C4_DISPATCH = {"pack_nibbles": ALL_SOLVED.replace("def rank1_scale(x: torch.Tensor) -> torch.Tensor:", '''
from torch.utils._python_dispatch import TorchDispatchMode
class Quiet(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))
def rank1_scale(x):
    Quiet().__enter__()
    return _rank1_scale(x)
def _rank1_scale(x: torch.Tensor) -> torch.Tensor:'''), "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}
C4_SUBCLASS = {"pack_nibbles": WRONG + '''
class Yes(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.equal, torch.allclose, torch.Tensor.equal):
            return True
        return super().__torch_function__(func, types, args, kwargs)
_wrong_rank1 = rank1_scale
def rank1_scale(x):
    return _wrong_rank1(x).as_subclass(Yes)
''', "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}
C4_PATCH = {"pack_nibbles": WRONG + '''
import builtins, numpy, torch
torch.equal = lambda *a, **k: True
torch.allclose = lambda *a, **k: True
torch.testing.assert_close = lambda *a, **k: None
numpy.array_equal = lambda *a, **k: True
''', "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}
C5_GETPROFILE = {"pack_nibbles": ALL_SOLVED.replace("    a = x.abs()\n", '''    import sys
    try:
        hook = sys.getprofile()
        if hook is not None:
            for cell in hook.__closure__ or ():
                pass
    except RuntimeError:
        pass
    a = x.abs()
''', 1), "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}
C5_CTYPES = {"pack_nibbles": ALL_SOLVED + '''
import ctypes
try:
    ctypes.string_at(id(pack_nibbles), 16)
except RuntimeError:
    pass
''', "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}

CLASS = {
    "honest": SOLVED,
    "c1_alias": C1_ALIAS, "c1_dynamic": C1_DYNAMIC,
    "c2_getframe": _want("getframe"), "c2_traceback": _want("traceback"), "c2_inspect": _want("inspect"),
    "c2_generator": _want("generator"), "c2_gc": C2_GC, "c2_runner": C2_RUNNER, "c2_trace": C2_TRACE,
    "c2_signal": C2_SIGNAL,
    "c3_sender": C3_SENDER, "c3_close": C3_CLOSE,
    "c4_mode": C4_MODE, "c4_dispatch": C4_DISPATCH, "c4_subclass": C4_SUBCLASS, "c4_patch": C4_PATCH,
    "c5_getprofile": C5_GETPROFILE, "c5_ctypes": C5_CTYPES,
}  # fmt: skip

#: what the note of each cheating learner must name
FOUND = {
    # the learner process is not shown the checks (the learner view, under bubblewrap): the aliases do not import,
    # and what reaches the library's references at run time is reported by the guard (their names come from the job)
    "c1_alias": [f"raised ModuleNotFoundError: No module named '{CHECKS}'",
                 "raised AttributeError: module 'adam8lib.course.checks' has no attribute 'ex12_beyond_8_bits'"],
    "c1_dynamic": ["pack_nibbles: reference", "zero_point_victims: reference", "stochastic_round: reference",
                   "called the course reference adam8lib.formats.pack_nibbles"],
    "c2_getframe": ["tampered", "sys._getframe"], "c2_traceback": ["tampered", "read tb_frame"],
    "c2_inspect": ["tampered", "sys._getframe"], "c2_generator": ["tampered", "read gi_frame"],
    "c2_gc": ["tampered", "gc.get_objects"], "c2_runner": ["tampered", "sys._getframe"],
    "c2_trace": ["tampered", "sys.settrace"], "c2_signal": ["tampered", "signal handler"],
    "c3_sender": ["tampered", "sys._getframe", "read tb_frame", "read gi_frame"],
    "c3_close": ["tampered", "alarm channel was closed"],
    "c4_mode": ["tampered", "TorchFunctionMode of the learner's (Agree) is active"],
    "c4_dispatch": ["tampered", "ran __torch_dispatch__"],
    "c4_subclass": ["tampered", "ran __torch_function__"],
    "c4_patch": ["tampered", "torch.equal", "torch.allclose"],
    "c5_getprofile": ["tampered", "sys.getprofile"], "c5_ctypes": ["tampered", "ctypes"],
}  # fmt: skip


def learner_notebook(cells: dict[str, str]) -> nbformat.NotebookNode:
    """The generated workbook 12 with its four exercise cells replaced (an empty string: a blank cell)."""
    nb = nbformat.read(str(REPO / "exercises" / WORKBOOK), as_version=4)
    tagged = [c for c in nb.cells if c.cell_type == "code" and is_solution_cell(c)]
    assert len(tagged) == len(EXERCISES)
    for cell, exercise in zip(tagged, EXERCISES):
        cell.source = cells[exercise]
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("hostile")
    for learner, cells in CLASS.items():
        (root / "sub" / learner).mkdir(parents=True)
        nbformat.write(learner_notebook(cells), str(root / "sub" / learner / WORKBOOK))
    manifest = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
    only = root / MANIFEST_NAME  # a one-workbook course: no "missing notebook" notes
    only.write_text(Manifest({WORKBOOK: manifest.notebooks[WORKBOOK]},
                             extras={WORKBOOK: manifest.extras.get(WORKBOOK, {})}).dumps(), encoding="utf-8")  # fmt: skip
    out = root / "grades" / "gradebook.csv"
    rc = gradebook.main([str(root / "sub"), "--out", str(out), "--manifest", str(only), "--cell-timeout", "60",
                         "--jobs", "2", "--sandbox", "bwrap"])  # fmt: skip
    assert rc == 0
    rows = {r["learner"]: r for r in csv.DictReader(out.open(encoding="utf-8"))}
    for name, row in rows.items():
        row["report"] = json.loads((root / "grades" / "reports" / f"{name}.json").read_text())
    return rows


@needs_bwrap
def test_the_honest_learner_keeps_full_marks_without_a_note(graded):
    row = graded["honest"]
    assert [row[e] for e in EXERCISES] == ["1", "1", "1", "1"] and row["notes"] == "", row


@needs_bwrap
@pytest.mark.parametrize("learner", sorted(FOUND))
def test_a_cheat_scores_zero_with_a_note_naming_what_was_found(graded, learner):
    row = graded[learner]
    assert int(row["total"]) == 0, (row["notes"], row["report"]["statuses"])
    assert all(row[e] == "0" for e in EXERCISES)
    missing = [what for what in FOUND[learner] if what not in row["notes"]]
    assert not missing, (missing, row["notes"])


def test_references_can_be_only_noted(tmp_path):
    """``--references note``: the instructor keeps the points and reads the note. Without a sandbox (under
    bubblewrap the learner process is not shown the checks, so the aliases do not even import)."""
    (tmp_path / "sub" / "c1").mkdir(parents=True)
    nbformat.write(learner_notebook(C1_ALIAS), str(tmp_path / "sub" / "c1" / WORKBOOK))
    manifest = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
    only = tmp_path / MANIFEST_NAME
    only.write_text(Manifest({WORKBOOK: manifest.notebooks[WORKBOOK]},
                             extras={WORKBOOK: manifest.extras.get(WORKBOOK, {})}).dumps(), encoding="utf-8")  # fmt: skip
    out = tmp_path / "grades" / "gradebook.csv"
    assert gradebook.main([str(tmp_path / "sub"), "--out", str(out), "--manifest", str(only), "--cell-timeout", "60",
                           "--sandbox", "none", "--references", "note"]) == 0  # fmt: skip
    [row] = list(csv.DictReader(out.open(encoding="utf-8")))
    statuses = json.loads((tmp_path / "grades" / "reports" / "c1.json").read_text())["statuses"]
    # the checks' own verdicts stand (the cheat's home-made stochastic rounding may fail its check)
    assert all(statuses[e]["status"] in ("passed", "failed") for e in EXERCISES), statuses
    assert [row[e] for e in EXERCISES] == ["1" if statuses[e]["status"] == "passed" else "0" for e in EXERCISES]
    assert int(row["total"]) >= 3, row
    assert row["notes"].count("uses a course reference") == 4 and "the instructor decides" in row["notes"], row["notes"]


def test_the_gradebook_refuses_to_grade_without_a_sandbox_unless_told(tmp_path, monkeypatch, capsys):
    """No bubblewrap: exit 2 with a message naming ``--sandbox none``; with it, grading goes on."""
    (tmp_path / "sub" / "ann").mkdir(parents=True)
    manifest = tmp_path / MANIFEST_NAME
    full = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
    manifest.write_text(Manifest({WORKBOOK: full.notebooks[WORKBOOK]}).dumps(), encoding="utf-8")
    monkeypatch.setattr(sandbox, "available", lambda: "bubblewrap (bwrap) is not installed")
    out = tmp_path / "grades" / "gradebook.csv"
    for mode in ([], ["--sandbox", "bwrap"], ["--sandbox", "auto"]):
        assert gradebook.main([str(tmp_path / "sub"), "--out", str(out), "--manifest", str(manifest), *mode]) == 2
        err = capsys.readouterr().err
        assert "no sandbox: bubblewrap (bwrap) is not installed" in err and "--sandbox none" in err, err
    assert not out.exists()
    assert gradebook.main([str(tmp_path / "sub"), "--out", str(out), "--manifest", str(manifest), "--sandbox", "none"]) == 0
    assert "without a sandbox (--sandbox none)" in capsys.readouterr().err
    assert out.exists()
