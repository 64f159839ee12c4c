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
* the course's own reference implementations under an alias (cheat 1): under bubblewrap the learner
  process is not shown the checks (the learner view), so the aliases do not import and score 0 without the
  guard; what the split does *not* stop is a learner calling the library's functions the checks compare
  with (``adam8lib.formats.pack_nibbles``): the guard reports them (``test_grading_hostile``).

Also: the honest learner keeps full marks without the guard, in the sandbox and without one, and
the grading log says which workbooks were split.
"""

from __future__ import annotations

import csv
import json
import os
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
TOKEN = "5ec7e7a11ce0b0b0cafe0ddba11f00d5"  # the gradebook's token in these tests (secrets.token_hex patched)
SEARCH = WRONG + '''
import gc, os, sys
def _search(token, lines):
    wanted = {"expected_output", "resolved", "learner_cmd", "want"}  # the runner's and the checks' names
    secrets = {token, *lines}
    hits, objects, frames = set(), gc.get_objects(), 0
    for o in objects:
        if o is lines or o is secrets:
            continue
        if isinstance(o, dict):
            hits |= {f"key {k}" for k in o if isinstance(k, str) and k in {"expected_output", "learner_cmd"}}
            values = list(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            values = list(o)
        else:
            continue
        hits |= {"the token" if v == token else "a success line" for v in values if isinstance(v, str) and v in secrets}
    stacks = [sys._getframe()] + list(sys._current_frames().values())
    for f in stacks:
        while f is not None:
            frames += 1
            if f.f_code.co_name != "_search":
                local = dict(f.f_locals)
                hits |= {f"local {k}" for k in set(local) & wanted}
                hits |= {"the token in a frame" for v in local.values() if isinstance(v, str) and v in secrets}
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
                if what == "fd":
                    os.listdir(f"/proc/{parent}/fd")
                else:
                    open(f"/proc/{parent}/{what}", "rb").close()
                proc += f" {what} OPEN"
            except OSError:
                proc += f" {what} refused"
    return len(objects), frames, sorted(hits), proc
_n, _frames, _hits, _proc = _search(TOKEN, LINES)
raise RuntimeError(f"searched {_n} objects, {_frames} frames; found {_hits or 'nothing'}; check process {_proc}")
'''


def _search_cells() -> dict:
    manifest = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
    lines = [s.expected_output.strip() for s in manifest.notebooks[WORKBOOK]] + [s.expected_output for s in manifest.notebooks[WORKBOOK]]
    # the learner knows the success lines (the lessons print them) but must build them at run time:
    # a literal in the cell would be found in the cell's own code constants
    hidden = [line[::-1] for line in lines]
    cell = SEARCH.replace("_search(TOKEN, LINES)", f"_search({TOKEN[::-1]!r}[::-1], [l[::-1] for l in {hidden!r}])")
    return {"pack_nibbles": cell, "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}


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
    "search": _search_cells(),
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
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gradebook.secrets, "token_hex", lambda n=16: TOKEN)
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
    assert left == [], left
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
    # failed on their own (wrong answers), not tampered: no detection runs without the guard
    assert all(statuses[e]["status"] == "failed" for e in EXERCISES) and "tampered" not in row["notes"], statuses


@needs_bwrap
def test_the_learner_view_hides_the_checks_references_without_the_guard(unguarded):
    """The checks' own references under an alias: the learner process is not shown ``adam8lib/course/checks``
    (only its ``__init__`` and ``_common``), so the aliases do not import: 0 without any guard."""
    row = unguarded["c1_alias"]
    assert int(row["total"]) == 0, row
    assert "No module named 'adam8lib.course.checks.ex12_beyond_8_bits'" in row["notes"], row["notes"]


def test_without_a_sandbox_the_check_process_refuses_its_memory_and_descriptors(tmp_path):
    """``--sandbox none``: the learner process sees the check process (same user) and finds nothing
    in its own memory; the check process is non-dumpable, so to a grader that is not root its
    memory, environment and descriptors are refused (root, with CAP_SYS_PTRACE, opens them: the
    README says so — grade as an ordinary user, or in the sandbox)."""
    rows = _grade(tmp_path, {"honest": SOLVED, "search": UNGUARDED["search"]}, "none")
    assert [rows["honest"][e] for e in EXERCISES] == ["1"] * 4 and rows["honest"]["notes"] == "", rows["honest"]
    note = rows["search"]["notes"]
    assert int(rows["search"]["total"]) == 0 and "found nothing; check process visible:" in note, note
    if os.geteuid() != 0:
        assert "check process visible: mem refused environ refused fd refused" in note, note
    else:
        assert "check process visible: mem OPEN environ OPEN fd OPEN" in note, note


HANG_AND_DIE = {"pack_nibbles": ALL_SOLVED.replace("def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:\n",
                                                   "def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:\n    while True:\n        pass\n")
                .replace("def rank1_scale(x: torch.Tensor) -> torch.Tensor:\n",
                         "def rank1_scale(x: torch.Tensor) -> torch.Tensor:\n    import os\n    os._exit(3)\n"),
                "zero_point_victims": "", "rank1_scale": "", "stochastic_round": ""}  # fmt: skip


@needs_bwrap
def test_a_function_that_hangs_or_ends_its_process_costs_only_its_own_check(tmp_path):
    """The check process stops a learner process stuck past the time limit, or finds it gone, and
    starts a fresh one for the next check: the other exercises keep their points."""
    assert HANG_AND_DIE["pack_nibbles"].count("while True") == 1 and "os._exit(3)" in HANG_AND_DIE["pack_nibbles"]
    for learner, cells in {"flaky": HANG_AND_DIE}.items():
        (tmp_path / "sub" / learner).mkdir(parents=True)
        nbformat.write(learner_notebook(cells), str(tmp_path / "sub" / learner / WORKBOOK))
    manifest = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
    only = Manifest({WORKBOOK: manifest.notebooks[WORKBOOK]}, extras={WORKBOOK: manifest.extras.get(WORKBOOK, {})})
    [grade] = gradebook.grade_class(tmp_path / "sub", only, cell_timeout=15, reports=tmp_path / "reports",
                                    sandbox="bwrap", progress=False)  # fmt: skip
    statuses = json.loads((tmp_path / "reports" / "flaky.json").read_text())["statuses"]
    assert statuses["pack_nibbles"]["status"] == "timeout", statuses
    assert statuses["rank1_scale"]["status"] == "failed" and "learner's process ended" in statuses["rank1_scale"]["detail"], statuses
    assert statuses["zero_point_victims"]["status"] == statuses["stochastic_round"]["status"] == "passed", statuses
    assert grade.total == 2 and not any("tampered" in n for n in grade.notes), grade.notes
