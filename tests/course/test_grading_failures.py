"""The grader's failures are the grader's (issue 53): a sandbox that cannot start the learners' Python,
a grading process that dies before any learner code ran, a kernel build that does not load — the
gradebook stops with a non-zero exit and a message about the grader, and no learner is scored or
marked ``tampered`` for it. A virtual environment reached through a symbolic link grades normally.

The tiny course (tests/fixtures/tiny: one workbook, no torch) keeps these quick; the split case uses
workbook 01 of the course (its checks in a process of their own).
"""

from __future__ import annotations

import csv
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from adam8lib.course.grading import gradebook, sandbox
from adam8lib.course.grading.conventions import MANIFEST_NAME, Manifest

from tests.course.test_grading import (CLASS_WORKBOOK, EXERCISES, SOLUTIONS, SOLVED_CLAMP, SOLVED_SQUARE,  # noqa: F401
                                       tiny_course, tiny_learner)  # fmt: skip

needs_bwrap = pytest.mark.skipif(sandbox.available() is not None, reason=f"no sandbox here: {sandbox.available()}")


def _fake_bwrap(folder: Path, fail_when: str) -> Path:
    """A ``bwrap`` in front of the real one: it passes the gradebook's probe (``… true``) and fails like
    bubblewrap does when it cannot run the interpreter, for every command whose arguments contain ``fail_when``
    (``""``: every command but the probe)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "bwrap"
    script.write_text(
        "#!/bin/sh\n"
        f'real={shutil.which("bwrap")}\n'
        'last=""; for a in "$@"; do last="$a"; done\n'
        'if [ "$last" = true ]; then exec "$real" "$@"; fi\n'
        f'case "$*" in *"{fail_when}"*) echo "bwrap: execvp {sys.executable}: No such file or directory" >&2; exit 1;; esac\n'
        'exec "$real" "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)
    return folder


@pytest.fixture()
def broken_sandbox(monkeypatch, tmp_path):
    """Put a fake bwrap first on PATH (the gradebook and its children find it there)."""

    def use(fail_when: str) -> None:
        folder = _fake_bwrap(tmp_path / f"bin-{abs(hash(fail_when))}", fail_when)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        sandbox.available.cache_clear()
        assert sandbox.available() is None and shutil.which("bwrap") == str(folder / "bwrap")

    yield use
    sandbox.available.cache_clear()


def _class(root: Path) -> Path:
    for learner in ("ada", "bo"):
        tiny_learner(root / "sub" / learner / "01_tiny.ipynb", square=SOLVED_SQUARE, clamp=SOLVED_CLAMP)
    return root / "sub"


def _no_learner_marked(out: Path) -> None:
    """No row for any learner (the header alone, or no gradebook at all), no report, no feedback page."""
    if out.exists():
        rows = list(csv.reader(out.open(encoding="utf-8")))
        assert rows[1:] == [], rows
    assert not list((out.parent / "reports").glob("*.json")) if (out.parent / "reports").exists() else True
    assert not (out.parent / "class.html").exists()


@needs_bwrap
def test_a_sandbox_that_cannot_start_the_learners_python_stops_the_run(tiny_course, broken_sandbox, capsys):
    """Every learner would have been 'tampered' and 0: now the gradebook exits 2 naming the grader's problem."""
    broken_sandbox("")
    out = tiny_course["root"] / "grades" / "gradebook.csv"
    rc = gradebook.main([str(_class(tiny_course["root"])), "--out", str(out), "--manifest", str(tiny_course["manifest"]),
                         "--sandbox", "bwrap", "--cell-timeout", "20"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "the grader failed, not the learners" in err and "does not start in the bubblewrap sandbox" in err, err
    assert "bwrap: execvp" in err and "No learner was scored" in err, err
    assert "tampered" not in err
    _no_learner_marked(out)


@needs_bwrap
@pytest.mark.parametrize("process", ["runner", "learner"])
def test_a_grading_process_that_dies_before_learner_code_stops_the_run(tmp_path, tiny_course, broken_sandbox, capsys,
                                                                         process):  # fmt: skip
    """The sandbox starts (the gradebook's own probe passes), but the grading process of a workbook does not:
    in one process (runner: the tiny workbook) and split (learner: workbook 01, whose check process starts
    the learner's process)."""
    broken_sandbox(f"adam8lib.course.grading.{process}")
    if process == "runner":
        sub, manifest = _class(tiny_course["root"]), tiny_course["manifest"]
    else:
        sub = tmp_path / "sub"
        for learner in ("ada", "bo"):
            (sub / learner).mkdir(parents=True)
            shutil.copyfile(SOLUTIONS / CLASS_WORKBOOK, sub / learner / CLASS_WORKBOOK)
        course = Manifest.load(EXERCISES / MANIFEST_NAME)
        manifest = tmp_path / MANIFEST_NAME
        manifest.write_text(Manifest({CLASS_WORKBOOK: course.notebooks[CLASS_WORKBOOK]}).dumps(), encoding="utf-8")
    out = tmp_path / "grades" / "gradebook.csv"
    rc = gradebook.main([str(sub), "--out", str(out), "--manifest", str(manifest), "--sandbox", "bwrap",
                         "--cell-timeout", "40", "--jobs", "2"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "the grader failed, not the learners" in err, err
    assert "before any learner code ran" in err or "the learner's process could not start" in err, err
    assert "bwrap: execvp" in err and "tampered" not in err, err
    _no_learner_marked(out)


def test_a_kernel_build_that_does_not_load_in_the_learners_process_stops_the_run(tmp_path, monkeypatch, capsys):
    """The gradebook builds adam8lib's CPU kernel once and gives every grading process a copy; one that
    cannot load it (here: a copy that is not a library) is the grader's problem, not a point lost."""
    broken = tmp_path / "kernel" / "cpu_step-broken"
    broken.mkdir(parents=True)
    monkeypatch.setattr(gradebook, "_grader_kernel", lambda: broken)

    def give_broken(self, home: Path) -> None:  # the copy every child loads: a build folder whose library is junk
        from adam8lib.kernels import cpu_build

        env = self._env(home)
        folder = Path(env["ADAM8LIB_CACHE_DIR"]) / cpu_build.build_directory().name
        shutil.copytree(cpu_build.build_directory(), folder)
        for library in folder.glob("*.so"):
            library.write_bytes(b"not a shared library")

    monkeypatch.setattr(gradebook.Grader, "give_kernel", give_broken)
    sub = tmp_path / "sub"
    (sub / "ada").mkdir(parents=True)
    shutil.copyfile(SOLUTIONS / CLASS_WORKBOOK, sub / "ada" / CLASS_WORKBOOK)
    course = Manifest.load(EXERCISES / MANIFEST_NAME)
    manifest = tmp_path / MANIFEST_NAME
    manifest.write_text(Manifest({CLASS_WORKBOOK: course.notebooks[CLASS_WORKBOOK]}).dumps(), encoding="utf-8")
    from adam8lib.kernels import cpu_build

    if cpu_build.unavailable_reason() is not None:
        pytest.skip(f"no kernel build here: {cpu_build.unavailable_reason()}")
    out = tmp_path / "grades" / "gradebook.csv"
    rc = gradebook.main([str(sub), "--out", str(out), "--manifest", str(manifest), "--cell-timeout", "40",
                         "--sandbox", "bwrap" if sandbox.available() is None else "none"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "the grader failed, not the learners" in err and "kernel does not load here" in err, err
    _no_learner_marked(out)


@needs_bwrap
def test_a_virtual_environment_reached_through_a_symbolic_link_grades(tiny_course, tmp_path):
    """``bwrap: execvp …/.venv/bin/python: No such file or directory`` was every learner's 0: the sandbox
    now shows the environment where the gradebook's interpreter names it."""
    link = tmp_path / "through" / "venv"
    link.parent.mkdir()
    link.symlink_to(Path(sys.prefix).resolve(), target_is_directory=True)
    python = link / Path(sys.executable).relative_to(sys.prefix)
    assert python.exists() and Path(sys.executable).resolve() != python
    out = tiny_course["root"] / "grades" / "gradebook.csv"
    proc = subprocess.run([str(python), "-m", "adam8lib.course.grading.gradebook", str(_class(tiny_course["root"])),
                           "--out", str(out), "--manifest", str(tiny_course["manifest"]), "--sandbox", "bwrap",
                           "--cell-timeout", "40", "--require-full-marks"],
                          capture_output=True, text=True, timeout=600, env=os.environ)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["learner"]: r for r in csv.DictReader(out.open(encoding="utf-8"))}
    assert {name: (r["total"], r["notes"]) for name, r in rows.items()} == {"ada": ("3", ""), "bo": ("3", "")}


@needs_bwrap
def test_checks_changed_on_disk_under_the_sandbox_stop_the_run_and_are_not_written_over(tiny_course, monkeypatch, capsys):
    """Under bubblewrap no learner can write the course's files: checks that change on disk while grading
    (someone editing the checkout) are the grader's problem — exit 2, nobody scored or marked tampered, and the
    edit is not overwritten with the bytes read at the start."""
    checks = tiny_course["checks"]
    edit = "\n# edited by someone else while grading\n"
    preflight = gradebook.Grader.preflight

    def preflight_then_edit(self):  # after the gradebook read and hashed the checks, before any learner runs
        preflight(self)
        with open(checks, "a", encoding="utf-8") as fh:
            fh.write(edit)

    monkeypatch.setattr(gradebook.Grader, "preflight", preflight_then_edit)
    out = tiny_course["root"] / "grades" / "gradebook.csv"
    rc = gradebook.main([str(_class(tiny_course["root"])), "--out", str(out), "--manifest", str(tiny_course["manifest"]),
                         "--sandbox", "bwrap", "--cell-timeout", "20"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "the grader failed, not the learners" in err and "the checks are not the course's" in err, err
    assert "tiny_checks.py changed" in err and "tampered" not in err, err
    assert checks.read_text(encoding="utf-8").endswith(edit)
    _no_learner_marked(out)
