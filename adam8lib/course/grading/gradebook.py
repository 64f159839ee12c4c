"""Grade a class: ``make grade SUBMISSIONS=dir`` → ``grades/gradebook.csv``.

    python -m adam8lib.course.grading.gradebook SUBMISSIONS [--out grades/gradebook.csv]
        [--manifest exercises/.manifest.json] [--cell-timeout 120] [--jobs 1]

``SUBMISSIONS`` holds one folder per learner with their ``NN_topic.ipynb`` workbooks (at any
depth; a file is matched to a workbook by name, else by its ``NN_`` prefix). Each learner is
graded in a separate ``pytest --nbval`` process with the grading plugin
(:mod:`adam8lib.course.grading.plugin`), in a scratch folder with only their matched notebooks and an
empty pytest configuration (no conftest.py of theirs is loaded), and with a per-cell timeout
(``--nbval-cell-timeout``): a cell stuck in a loop is interrupted and loses its exercise only.

The gradebook has one row per learner: ``learner``, the points of every exercise (columns
named by exercise id, in course order), ``total``, and ``notes`` (missing workbooks, timeouts,
edited or deleted check cells). Each learner's full JSON report and pytest log go to
``<out folder>/reports/``. Learners' code runs with your permissions: grade in a container
or a throwaway account if you do not trust it.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .conventions import MANIFEST_NAME, Manifest

__all__ = ["LearnerGrade", "find_workbooks", "grade_learner", "grade_class", "write_gradebook", "main"]

#: Statuses worth a note in the gradebook (plain failures are just 0 points).
NOTED = ("timeout", "edited", "missing", "skipped", "not run")


@dataclass
class LearnerGrade:
    learner: str
    points: dict[str, int]  # exercise id -> points
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.points.values())


def find_workbooks(folder: Path, manifest: Manifest) -> tuple[dict[str, Path], list[str]]:
    """{manifest notebook: learner's file} for one learner, and notes about ambiguous files."""
    found: dict[str, list[Path]] = {}
    for path in sorted(folder.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts or not path.is_file():
            continue
        name = manifest.match(path.name)
        if name is not None:
            found.setdefault(name, []).append(path)
    chosen, notes = {}, []
    for name, paths in found.items():
        paths.sort(key=lambda p: (p.name != name, len(p.relative_to(folder).parts), str(p)))
        chosen[name] = paths[0]
        if len(paths) > 1:
            others = ", ".join(str(p.relative_to(folder)) for p in paths[1:])
            notes.append(f"{name}: graded {paths[0].relative_to(folder)}, ignored {others}")
    return chosen, notes


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def grade_learner(
    folder: Path,
    manifest: Manifest,
    *,
    cell_timeout: float = 120,
    learner_timeout: float = 3600,
    reports: Path | None = None,
) -> LearnerGrade:
    """Run one learner's workbooks through ``pytest --nbval`` and the grading plugin."""
    learner = folder.name
    points = {spec.exercise: 0 for spec in manifest.checks}
    workbooks, notes = find_workbooks(folder, manifest)
    for name in manifest.notebooks:
        if name not in workbooks:
            notes.append(f"{name} missing")
    if not workbooks:
        return LearnerGrade(learner, points, notes)
    with tempfile.TemporaryDirectory(prefix=f"grade-{learner}-") as scratch:
        scratch = Path(scratch)
        for name, path in workbooks.items():
            shutil.copyfile(path, scratch / name)
        ini = scratch / "pytest.ini"
        ini.write_text("[pytest]\n", encoding="utf-8")
        report = scratch / "grade-report.json"
        cmd = [
            sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
            f"--nbval-cell-timeout={cell_timeout:g}",
            "-p", "adam8lib.course.grading.plugin", "-p", "no:cacheprovider", "-p", "no:randomly",
            "--noconftest", "--continue-on-collection-errors", "-c", str(ini), "--rootdir", str(scratch),
            f"--grade-manifest={manifest.path}", f"--grade-report={report}", "-q", "--color=no",
            *sorted(workbooks),
        ]  # fmt: skip
        proc = subprocess.Popen(
            cmd, cwd=scratch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            log, _ = proc.communicate(timeout=learner_timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            log, _ = proc.communicate()
            notes.append(f"grading stopped after {learner_timeout:g} s (whole submission); scores are 0")
            report.unlink(missing_ok=True)
        finally:
            _kill_group(proc)  # stray kernels
        if reports is not None:
            reports.mkdir(parents=True, exist_ok=True)
            (reports / f"{learner}.log").write_text(log, encoding="utf-8")
        if not report.is_file():
            if proc.returncode not in (None, -signal.SIGKILL):
                tail = " | ".join(line for line in log.strip().splitlines()[-3:])
                notes.append(f"pytest exited with {proc.returncode} and no report: {tail[:300]}")
            return LearnerGrade(learner, points, notes)
        results = json.loads(report.read_text(encoding="utf-8"))
        if reports is not None:
            shutil.copyfile(report, reports / f"{learner}.json")
    graded = set()
    for nb in results["notebooks"]:
        graded.add(nb["notebook"])
        for ex in nb["exercises"]:
            points[ex["exercise"]] = ex["points"]
            if ex["status"] in NOTED:
                notes.append(f"{nb['notebook']} {ex['label']} {ex['exercise']}: {ex['status']} ({ex['detail']})")
        notes.extend(f"{nb['notebook']}: {note}" for note in nb["notes"])
    for name in workbooks:
        if name not in graded:
            notes.append(f"{name} could not be run (not a valid notebook?)")
    return LearnerGrade(learner, points, notes)


def grade_class(
    submissions: Path,
    manifest: Manifest,
    *,
    cell_timeout: float = 120,
    learner_timeout: float = 3600,
    jobs: int = 1,
    reports: Path | None = None,
    progress: bool = True,
) -> list[LearnerGrade]:
    """Grade every learner folder of ``submissions`` (sorted by name)."""
    from tqdm.auto import tqdm

    if not submissions.is_dir():
        raise FileNotFoundError(f"no submissions folder at {submissions}")
    folders = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise ValueError(f"{submissions} has no learner folders (one subfolder per learner)")
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")

    def one(folder: Path) -> LearnerGrade:
        return grade_learner(
            folder, manifest, cell_timeout=cell_timeout, learner_timeout=learner_timeout, reports=reports
        )

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        iterator = pool.map(one, folders)
        return list(tqdm(iterator, total=len(folders), desc="grading", unit="learner", disable=not progress))


def write_gradebook(grades: list[LearnerGrade], manifest: Manifest, out: Path) -> None:
    """CSV: learner, one column per exercise id (course order), total, notes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    exercises = [spec.exercise for spec in manifest.checks]
    with out.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["learner", *exercises, "total", "notes"])
        for grade in grades:
            writer.writerow([grade.learner, *(grade.points[e] for e in exercises), grade.total, "; ".join(grade.notes)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m adam8lib.course.grading.gradebook",
        description="Grade a folder of learner submissions (one subfolder each) into a CSV gradebook.",
    )
    parser.add_argument("submissions", type=Path, help="folder with one subfolder of notebooks per learner")
    parser.add_argument("--out", type=Path, default=Path("grades/gradebook.csv"), help="gradebook CSV to write")
    parser.add_argument("--manifest", type=Path, default=Path("exercises") / MANIFEST_NAME, help="grading manifest")
    parser.add_argument("--cell-timeout", type=float, default=120, help="seconds per notebook cell (default 120)")
    parser.add_argument("--learner-timeout", type=float, default=3600, help="seconds per learner (default 3600)")
    parser.add_argument("--jobs", type=int, default=1, help="learners graded at the same time (default 1)")
    args = parser.parse_args(argv)
    if args.cell_timeout <= 0 or args.learner_timeout <= 0:
        parser.error("timeouts must be positive")
    try:
        manifest = Manifest.load(args.manifest)
        grades = grade_class(
            args.submissions,
            manifest,
            cell_timeout=args.cell_timeout,
            learner_timeout=args.learner_timeout,
            jobs=args.jobs,
            reports=args.out.parent / "reports",
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_gradebook(grades, manifest, args.out)
    print(f"graded {len(grades)} learner(s) out of {manifest.total_points} points -> {args.out}")
    for grade in grades:
        print(f"  {grade.learner}: {grade.total}/{manifest.total_points}" + (" (see notes)" if grade.notes else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
