"""The score is decided in a process the learner's code cannot reach (issue 38, first bullet).

For the workbooks of ``checker.SPLIT`` the gradebook runs the checks in a *check process* that
never runs learner code, and the learner's cells and functions in a sandboxed *learner process*
that gets the checks' inputs and returns plain data. These tests grade hostile learners of
workbook 12 with the learner process's guard switched **off** (``--no-guard``, a flag only tests
pass), so what stops them is the split alone:

* heap and stack searches (``gc.get_objects``, ``sys._getframe``, every thread's frames) in the
  learner process find no manifest, no expected value, no success line, no result sender and no
  token, and score 0;
* the cheats of ``test_grading_hostile`` that need no guard to fail — replacing the checks found on
  the stack or heap, sending "passed" with the runner's sender, a ``TorchFunctionMode`` left pushed,
  a tensor subclass whose ``__torch_function__`` answers True, monkey-patched ``torch.equal`` —
  score 0: the comparisons they aim at run in the other process;
* what the split does *not* stop: returning the course's own reference implementations (cheat 1)
  scores without the guard; with it (the gradebook's only configuration) it scores 0
  (``test_grading_hostile``).

Also: the honest learner keeps full marks without the guard, in the sandbox and without one, and
the grading log says which workbooks were split.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import nbformat
import pytest

from adam8lib.course.grading import checker, gradebook, sandbox
from adam8lib.course.grading.conventions import MANIFEST_NAME, Manifest

from tests.course.test_grading_hostile import (ALL_SOLVED, C1_ALIAS, C2_GC, C4_MODE, C4_PATCH, C4_SUBCLASS, EXERCISES,
                                               FIND, SOLVED, WORKBOOK, WRONG, _want, learner_notebook)  # fmt: skip

REPO = Path(__file__).resolve().parents[2]
needs_bwrap = pytest.mark.skipif(sandbox.available() is not None, reason=f"no sandbox here: {sandbox.available()}")

#: everything the learner process holds, searched: the heap, this thread's stack, every thread's stack,
#: and (without a sandbox) the check process's /proc files. Reported in the cell's exception (a note).
SEARCH = WRONG + '''
import gc, os, re, sys
def _search():
    token = re.compile(r"^[0-9a-f]{32}$")
    wanted = {"expected_output", "token", "resolved", "send", "want", "checks", "manifest"}
    hits, objects, frames = set(), gc.get_objects(), 0
    for o in objects:
        if isinstance(o, dict):
            keys = {k for k in o if isinstance(k, str)}
            hits |= {f"key {k}" for k in keys & {"expected_output", "token", "learner_cmd"}}
            values = o.values()
        elif isinstance(o, (list, tuple)):
            values = o
        else:
            continue
        for v in values:
            if isinstance(v, str) and (token.match(v) or v.endswith(": all checks passed")):
                hits.add("a token or success line")
    stacks = [sys._getframe()] + list(sys._current_frames().values())
    for f in stacks:
        while f is not None:
            frames += 1
            hits |= {f"local {k}" for k in set(f.f_locals) & wanted}
            f = f.f_back
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as fh:
            cmdline = fh.read()
    except OSError:
        cmdline = b""
    proc = "invisible"
    if b"grading.checker" in cmdline:
        proc = "visible:"
        for what in ("mem", "environ", "fd"):
            try:
                os.listdir(f"/proc/{parent}/fd") if what == "fd" else open(f"/proc/{parent}/{what}", "rb").read(1)
                proc += f" {what} READ"
            except OSError:
                proc += f" {what} refused"
    return len(objects), frames, sorted(hits), proc
_n, _frames, _hits, _proc = _search()
raise RuntimeError(f"searched {_n} objects, {_frames} frames; found {_hits or 'nothing'}; check process {_proc}")
'''

# the hostile test's cheats that also write the right answers, rebuilt on wrong ones, so that
# reaching nothing shows as 0 points
C2_RUNNER_WRONG = {"pack_nibbles": FIND + WRONG + '''
found = find("resolved", "getframe")
if found is not None:
    for spec in found["checks"]:
        check, expression = found["resolved"][spec["exercise"]]
        ns = {}
        exec(compile(f"def fake(*a, **k):\\n    print({spec['expected_output']!r}, end='')\\n", "<x>", "exec"), ns)
        found["resolved"][spec["exercise"]] = (ns["fake"], expression)
''', "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}
C3_SENDER_WRONG = {"pack_nibbles": FIND + WRONG + '''
import os, sys
for route in ("getframe", "traceback", "generator"):
    found = find("send", route)
    if found is not None:
        for exercise in ("pack_nibbles", "zero_point_victims", "rank1_scale", "stochastic_round"):
            found["send"](kind="result", exercise=exercise, status="passed", detail="")
        found["send"](kind="done")
        os._exit(0)
for fd in range(3, 64):  # every inherited descriptor: the result channel is not among them
    try:
        os.write(fd, b'{"kind": "result", "exercise": "pack_nibbles", "status": "passed", "token": ""}\\n')
    except OSError:
        pass
''', "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}

UNGUARDED = {
    "honest": SOLVED,
    "search": {"pack_nibbles": SEARCH, "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""},
    "c2_getframe": _want("getframe"), "c2_traceback": _want("traceback"), "c2_generator": _want("generator"),
    "c2_gc": C2_GC, "c2_runner": C2_RUNNER_WRONG, "c3_sender": C3_SENDER_WRONG,
    "c4_mode": C4_MODE, "c4_subclass": C4_SUBCLASS, "c4_patch": C4_PATCH,
    "c1_alias": C1_ALIAS,
}  # fmt: skip


def _grade(root: Path, learners: dict, mode: str, flags=("--no-guard",)) -> dict:
    for learner, cells in learners.items():
        (root / "sub" / learner).mkdir(parents=True)
        nbformat.write(learner_notebook(cells), str(root / "sub" / learner / WORKBOOK))
    manifest = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
    only = Manifest({WORKBOOK: manifest.notebooks[WORKBOOK]}, extras={WORKBOOK: manifest.extras.get(WORKBOOK, {})})
    out = root / "grades" / "gradebook.csv"
    gradebook.grade_class(root / "sub", only, cell_timeout=60, jobs=2, reports=root / "grades" / "reports", out=out,
                          sandbox=mode, progress=False, learner_flags=flags)  # fmt: skip
    rows = {r["learner"]: r for r in csv.DictReader(out.open(encoding="utf-8"))}
    for name, row in rows.items():
        row["report"] = json.loads((root / "grades" / "reports" / f"{name}.json").read_text())
        row["log"] = (root / "grades" / "reports" / f"{name}.log").read_text()
    return rows


@pytest.fixture(scope="module")
def unguarded(tmp_path_factory) -> dict:
    if sandbox.available() is not None:
        pytest.skip(f"no sandbox here: {sandbox.available()}")
    return _grade(tmp_path_factory.mktemp("split"), UNGUARDED, "bwrap")


def test_workbook_12_is_graded_split_and_the_class_workbooks_left_in_one_process_are_named():
    assert WORKBOOK in checker.SPLIT
    manifest = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
    left = sorted(set(manifest.notebooks) - set(checker.SPLIT))
    assert left == ["07_adam8bit_step.ipynb", "08_triton_kernel.ipynb", "09_memory_maths.ipynb",
                    "10_mixed_precision_finetune.ipynb"], left
    assert set(checker.SPLIT) <= set(manifest.notebooks)


@needs_bwrap
def test_the_honest_learner_keeps_full_marks_without_the_guard(unguarded):
    row = unguarded["honest"]
    assert [row[e] for e in EXERCISES] == ["1"] * 4 and row["notes"] == "", row
    assert "checks in a process of their own" in row["log"]


@needs_bwrap
def test_the_learner_process_holds_no_expected_value_token_or_sender(unguarded):
    row = unguarded["search"]
    assert int(row["total"]) == 0, row
    note = row["notes"]
    assert "found nothing; check process invisible" in note, note
    objects = int(note.split("searched ")[1].split(" objects")[0])
    frames = int(note.split(" objects, ")[1].split(" frames")[0])
    assert objects > 10_000 and frames >= 2, note  # the search ran over a real heap and stack


@needs_bwrap
@pytest.mark.parametrize("learner", ["c2_getframe", "c2_traceback", "c2_generator"])
def test_frame_walks_reach_nothing_to_copy(unguarded, learner):
    row = unguarded[learner]
    # the three exercises whose answers the cheat hoped to copy score 0; stochastic rounding is solved honestly
    assert [row[e] for e in EXERCISES] == ["0", "0", "0", "1"], (row["notes"], row["report"]["statuses"])


@needs_bwrap
@pytest.mark.parametrize("learner", ["c2_gc", "c2_runner", "c3_sender", "c4_mode", "c4_subclass", "c4_patch"])
def test_cheats_on_the_checks_or_the_result_channel_score_zero_without_the_guard(unguarded, learner):
    row = unguarded[learner]
    assert int(row["total"]) == 0, (row["notes"], row["report"]["statuses"])
    statuses = row["report"]["statuses"]
    assert all(statuses[e]["status"] == "failed" for e in EXERCISES), statuses


@needs_bwrap
def test_what_the_split_alone_does_not_stop_the_course_references(unguarded):
    """Returning the course's reference implementations scores without the guard: the guard's
    reference detection (always on in the gradebook) is what makes it 0 (test_grading_hostile)."""
    row = unguarded["c1_alias"]
    assert int(row["total"]) >= 3, row


def test_without_a_sandbox_the_check_process_refuses_its_memory_and_descriptors(tmp_path):
    """``--sandbox none``: the learner process sees the check process (same user) but the check
    process is non-dumpable: its memory, environment and descriptors cannot be read."""
    rows = _grade(tmp_path, {"honest": SOLVED, "search": UNGUARDED["search"]}, "none")
    assert [rows["honest"][e] for e in EXERCISES] == ["1"] * 4 and rows["honest"]["notes"] == "", rows["honest"]
    note = rows["search"]["notes"]
    assert int(rows["search"]["total"]) == 0 and "found nothing" in note, note
    assert "check process visible: mem refused environ refused fd refused" in note, note
