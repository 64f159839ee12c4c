"""Every time limit is enforced from outside the learner's process, and without a sandbox the learner's
whole process tree ends before the gradebook is written (issue 53).

* a learner's cell that ignores ``SIGALRM`` and spins is stopped by the parent's clock at the cell timeout
  (one process: the gradebook's :class:`~adam8lib.course.grading.channel.Phases`; split: the check process),
  the workbook graded again without that cell: 0 for its exercise with a note, the others graded;
* the same inside a learner's function while its check runs: that exercise ``timeout``, the others graded;
* ``--sandbox none``: a double-forked ``setsid`` grandchild (it would rewrite the finished gradebook) is
  ended before the gradebook is written — the gradebook is its reaper (``PR_SET_CHILD_SUBREAPER``).
"""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

import nbformat
import pytest

from adam8lib.course.grading import gradebook, reaper, sandbox
from adam8lib.course.grading.channel import Phases
from adam8lib.course.grading.conventions import MANIFEST_NAME, Manifest, is_solution_cell

from tests.course.test_grading import (CLASS_WORKBOOK, EXERCISES, SOLUTIONS, SOLVED_CLAMP, SOLVED_SQUARE,  # noqa: F401
                                       tiny_course, tiny_learner)  # fmt: skip

MODES = ["bwrap", "none"] if sandbox.available() is None else ["none"]
SPIN = "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n"
#: the cell timeout of these tests, and what the parent allows before it kills (Grader.phase_limit)
TIMEOUT = 3


def _grade(root: Path, manifest: Path, mode: str, timeout: float = TIMEOUT) -> tuple[int, dict, float]:
    out = root / "grades" / "gradebook.csv"
    started = time.monotonic()
    rc = gradebook.main([str(root / "sub"), "--out", str(out), "--manifest", str(manifest), "--sandbox", mode,
                         "--cell-timeout", str(timeout), "--learner-timeout", "300"])  # fmt: skip
    elapsed = time.monotonic() - started
    rows = {r["learner"]: r for r in csv.DictReader(out.open(encoding="utf-8"))}
    for name, row in rows.items():
        row["report"] = json.loads((out.parent / "reports" / f"{name}.json").read_text())
    return rc, rows, elapsed


def test_the_phase_clock_only_moves_forward():
    phases = Phases([3, 6], ["square", "clamp"], 5, "tok")
    assert phases.until is None and phases.current is None
    phases.seen({"kind": "phase", "phase": "cell", "index": 6, "token": "tok"})
    assert phases.current == ("cell", 6) and phases.until is not None
    for again in ({"kind": "phase", "phase": "cell", "index": 3, "token": "tok"},  # backwards
                  {"kind": "phase", "phase": "cell", "index": 6, "token": "tok"},  # the same phase again
                  {"kind": "phase", "phase": "check", "exercise": "clamp", "token": "forged"},  # not the token
                  {"kind": "phase", "phase": "check", "exercise": "nope", "token": "tok"}):  # fmt: skip
        until = phases.until
        phases.seen(again)
        assert phases.current == ("cell", 6) and phases.until == until, again
    phases.seen({"kind": "phase", "phase": "check", "exercise": "clamp", "token": "tok"})
    assert phases.current == ("check", "clamp")


@pytest.mark.parametrize("mode", MODES)
def test_a_cell_that_ignores_its_alarm_is_stopped_from_outside(tiny_course, mode):
    root = tiny_course["root"]
    tiny_learner(root / "sub" / "spinner" / "01_tiny.ipynb", square=SPIN + SOLVED_SQUARE, clamp=SOLVED_CLAMP)
    rc, rows, elapsed = _grade(root, tiny_course["manifest"], mode)
    row = rows["spinner"]
    assert rc == 0 and (row["square"], row["clamp"], row["total"]) == ("0", "2", "2"), row
    assert f"cell 3 (exercise cell) ran past {TIMEOUT} s, ignoring its time limit, and was stopped from outside" in row["notes"]
    assert elapsed < 90, elapsed  # not the learner time limit (300 s)


@pytest.mark.parametrize("mode", MODES)
def test_a_check_whose_function_ignores_its_alarm_is_stopped_from_outside(tiny_course, mode):
    root = tiny_course["root"]
    spin_in_check = "import signal\ndef square(x):\n    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n    while True:\n        pass\n"
    tiny_learner(root / "sub" / "spinner" / "01_tiny.ipynb", square=spin_in_check, clamp=SOLVED_CLAMP)
    rc, rows, elapsed = _grade(root, tiny_course["manifest"], mode)
    row = rows["spinner"]
    assert rc == 0 and (row["square"], row["clamp"], row["total"]) == ("0", "2", "2"), row
    status = row["report"]["statuses"]["square"]
    assert status["status"] == "timeout" and "stopped from outside by the grader" in status["detail"], status
    assert "square: timeout (the check of square ran past" in row["notes"], row["notes"]
    assert elapsed < 90, elapsed


@pytest.mark.parametrize("mode", MODES)
def test_a_cell_that_ignores_its_alarm_in_the_learner_process_is_stopped_by_the_check_process(tmp_path, mode):
    """Split (workbook 01): the check process's clock stops the learner process's cell and starts it again
    without that cell; the exercise it defines scores 0, the others their points."""
    nb = nbformat.read(str(SOLUTIONS / CLASS_WORKBOOK), as_version=4)
    tagged = [c for c in nb.cells if c.cell_type == "code" and is_solution_cell(c)]
    tagged[1].source = SPIN + tagged[1].source  # the cell of optimizer_state_bytes
    (tmp_path / "sub" / "spinner").mkdir(parents=True)
    nbformat.write(nb, str(tmp_path / "sub" / "spinner" / CLASS_WORKBOOK))
    course = Manifest.load(EXERCISES / MANIFEST_NAME)
    specs = course.notebooks[CLASS_WORKBOOK]
    manifest = tmp_path / MANIFEST_NAME
    manifest.write_text(Manifest({CLASS_WORKBOOK: specs}).dumps(), encoding="utf-8")
    rc, rows, elapsed = _grade(tmp_path, manifest, mode, timeout=8)
    row = rows["spinner"]
    points = {s.exercise: s.points for s in specs}
    assert rc == 0 and [int(row[s.exercise]) for s in specs] == [points["state_bytes_per_param"], 0,
                                                                 points["compute_optimizer_size"]], row  # fmt: skip
    cell = nb.cells.index(tagged[1])
    assert f"cell {cell} (exercise cell) ran past 8 s, ignoring its time limit, and was stopped from outside" in row["notes"]
    assert elapsed < 120, elapsed


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_without_a_sandbox_a_double_forked_grandchild_ends_before_the_gradebook_is_written(tiny_course):
    """The grandchild leaves the runner's session and tree, then would rewrite the learner's row of the
    finished gradebook.csv: it is killed (and reaped) before the row is written."""
    root = tiny_course["root"]
    out = root / "grades" / "gradebook.csv"
    pidfile = root / "grandchild.pid"
    escape = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
        "        time.sleep(4)\n"
        f"        open({str(out)!r}, 'w').write('learner,square,clamp,total,notes\\nada,1,2,3,\\nrow,1,2,99,forged\\n')\n"
        "    os._exit(0)\n"
        "os.wait()\n"
    )
    tiny_learner(root / "sub" / "row" / "01_tiny.ipynb", square=escape + SOLVED_SQUARE, clamp=SOLVED_CLAMP)
    tiny_learner(root / "sub" / "ada" / "01_tiny.ipynb", square=SOLVED_SQUARE, clamp=SOLVED_CLAMP)
    rc, rows, _ = _grade(root, tiny_course["manifest"], "none", timeout=20)
    assert rc == 0
    pid = int(pidfile.read_text())
    assert not _alive(pid), f"the grandchild {pid} outlived the run"
    time.sleep(5)  # it would have rewritten the gradebook by now
    rows = {r["learner"]: r for r in csv.DictReader(out.open(encoding="utf-8"))}
    assert {n: r["total"] for n, r in rows.items()} == {"ada": "3", "row": "3"}, rows


def test_the_reaper_ends_orphans_and_leaves_older_children(tmp_path):
    """The pieces: a process started before ``since`` is left alone; an orphan re-parented to this process
    (the subreaper) is killed and reaped."""
    import subprocess

    older = subprocess.Popen(["sleep", "30"])
    try:
        since = reaper.now() + 1
        time.sleep(0.05)
        assert reaper.become_subreaper()
        try:
            pidfile = tmp_path / "orphan"
            subprocess.run(["sh", "-c", f"(setsid sleep 30 & echo $! > {pidfile}) &"], check=True)
            deadline = time.monotonic() + 5
            while not pidfile.exists() or not pidfile.read_text().strip():
                assert time.monotonic() < deadline
                time.sleep(0.02)
            orphan = int(pidfile.read_text())
            time.sleep(0.2)
            assert reaper.sweep(keep={older.pid}, since=since) >= 1
            assert not _alive(orphan) and older.poll() is None
        finally:
            reaper.release_subreaper()
    finally:
        older.kill()
        older.wait()
