"""pytest plugin: score workbooks during ``pytest --nbval``.

Registered through the ``pytest11`` entry point ``adam8lib.course.grading.plugin`` (pyproject.toml),
so it is active in every pytest of an environment where adam8lib is installed; elsewhere
pass ``-p adam8lib.course.grading.plugin``. Without nbval items it does nothing.

For every collected notebook that the grading manifest knows (by file name, else by its
``NN_`` prefix), each check cell is matched to its exercise and

* an **intact** check cell (same source as in solutions/, up to trailing spaces) is graded:
  its expected output is taken from the manifest (the learner's saved output does not matter)
  and nbval-skip/raises-exception/ignore-output markers added by a learner are overridden.
  It scores its points when the cell passes, 0 when it fails, times out or is skipped;
* an **edited** check cell (source changed) fails with an integrity message and scores 0;
* a **deleted** check cell (in the manifest, not in the notebook) scores 0.

The manifest is ``--grade-manifest FILE`` if given, else the official one (``exercises/`` of the
repository adam8lib is installed from), else ``<rootdir>/exercises/.manifest.json`` — these two
only for a notebook that calls at least one of its checks (so the lessons in notebooks/, which
share the workbooks' names, are not graded) — else ``.manifest.json`` next to the notebook. A
manifest next to a learner's notebook never overrides the official one (a note says so).
The text outputs of a check cell are cut to a little more than its success line before nbval
compares them (a huge print cannot make the comparison explode).

This plugin is a self-check, not a grader: a learner's ``conftest.py`` can change anything in a
pytest run that loads it. :mod:`adam8lib.course.grading.selfcheck` runs it without the learner's
conftest/pytest.ini; grades come only from the gradebook. At the end of the run a score
summary (points per exercise, per workbook, total) is printed, and ``--grade-report FILE``
writes it as JSON or CSV (by extension).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .conventions import MANIFEST_NAME, CheckSpec, Manifest, WorkbookError, cell_source, check_calls, source_hash

__all__ = ["NbvalScorer", "STATUSES"]

#: Exercise statuses in a report; only "passed" scores points.
STATUSES = {
    "passed": "the check cell ran and printed its success line",
    "failed": "the check cell raised (or printed something else)",
    "timeout": "the check cell ran past the per-cell timeout",
    "skipped": "the check cell did not run (skipped)",
    "not run": "the check cell was not part of this run (deselected)",
    "edited": "the check cell's source differs from the manifest (integrity)",
    "missing": "the check cell was deleted (integrity)",
}


def pytest_addoption(parser):
    group = parser.getgroup("adam8-grading", "adam8 workbook grading (with --nbval)")
    group.addoption(
        "--grade-report",
        metavar="FILE",
        default=None,
        help="write the scores of this run to FILE: JSON if it ends in .json, CSV if in .csv",
    )
    group.addoption(
        "--grade-manifest",
        metavar="FILE",
        default=None,
        help=f"check-cell manifest (default: {MANIFEST_NAME} next to each notebook, "
        f"else <rootdir>/exercises/{MANIFEST_NAME})",
    )


def pytest_configure(config):
    report = config.getoption("grade_report", None)
    if report and Path(report).suffix.lower() not in (".json", ".csv"):
        raise pytest.UsageError(f"--grade-report must end in .json or .csv, got {report!r}")
    manifest = config.getoption("grade_manifest", None)
    if manifest and not Path(manifest).is_file():
        raise pytest.UsageError(f"--grade-manifest: no such file {manifest!r}")
    config.pluginmanager.register(NbvalScorer(config), "adam8-grader")


def _is_nbval_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell" and hasattr(item, "cell") and hasattr(item, "cell_num")


def _first_line(text: str, limit: int = 160) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass
class ExerciseResult:
    spec: CheckSpec
    notebook: str
    items: list = field(default_factory=list)  # node ids of intact check cells
    edited: list = field(default_factory=list)  # node ids of edited check cells
    present: bool = False  # the notebook has a check cell for it (intact or edited)
    outcomes: dict = field(default_factory=dict)  # node id -> (status, detail)

    @property
    def status_detail(self) -> tuple[str, str]:
        if not self.present:
            return "missing", f"check cell of {self.spec.exercise} was deleted: copy it back from exercises/{self.notebook}"
        if not self.items and self.edited:
            return "edited", f"check cell of {self.spec.exercise} was edited: restore it from exercises/{self.notebook}"
        if not self.items:
            return "not run", "check cell not part of this run"
        results = [self.outcomes.get(nodeid, ("not run", "check cell not run")) for nodeid in self.items]
        return next((r for r in results if r[0] != "passed"), results[0])

    @property
    def status(self) -> str:
        return self.status_detail[0]

    @property
    def points(self) -> int:
        return self.spec.points if self.status == "passed" else 0

    def to_json(self) -> dict:
        status, detail = self.status_detail
        return {
            "exercise": self.spec.exercise,
            "label": self.spec.label,
            "title": self.spec.title,
            "status": status,
            "points": self.points,
            "max_points": self.spec.points,
            "detail": "" if status == "passed" else detail,
        }


@dataclass
class NotebookResult:
    path: str
    notebook: str  # the manifest's name
    exercises: dict[str, ExerciseResult]
    notes: list[str] = field(default_factory=list)

    @property
    def points(self) -> int:
        return sum(r.points for r in self.exercises.values())

    @property
    def max_points(self) -> int:
        return sum(r.spec.points for r in self.exercises.values())

    def to_json(self) -> dict:
        return {
            "notebook": self.notebook,
            "path": self.path,
            "points": self.points,
            "max_points": self.max_points,
            "exercises": [r.to_json() for r in self.exercises.values()],
            "notes": list(self.notes),
        }


class NbvalScorer:
    """Maps nbval items to exercises, watches their reports, and writes the scores."""

    def __init__(self, config):
        self.config = config
        self.notebooks: dict[str, NotebookResult] = {}
        self.by_item: dict[str, tuple[ExerciseResult, bool]] = {}  # nodeid -> (result, intact)
        self._manifests: dict[Path, Manifest | None] = {}
        self.ignored: dict[str, Path] = {}  # notebook -> manifest next to it that was not used

    # -- manifest lookup ------------------------------------------------------------------
    def _load(self, path: Path) -> Manifest | None:
        path = path.resolve()
        if path not in self._manifests:
            try:
                self._manifests[path] = Manifest.load(path) if path.is_file() else None
            except WorkbookError as exc:
                raise pytest.UsageError(str(exc)) from None
        return self._manifests[path]

    def official(self) -> Manifest | None:
        """The course's own manifest: exercises/ of the repository adam8lib is installed from."""
        from .sandbox import repository_root

        root = repository_root()
        return self._load(root / "exercises" / MANIFEST_NAME) if root is not None else None

    def manifest_for(self, notebook: Path) -> tuple[Manifest | None, bool]:
        """The notebook's manifest, and whether it was found by a repository-wide lookup.

        Order: ``--grade-manifest``; the official manifest (the installed course's
        exercises/); ``<rootdir>/exercises/``; last, a ``.manifest.json`` next to the notebook
        (a course of one's own). A manifest next to the notebook never overrides an official
        one that knows the notebook: the run notes that it was ignored.
        """
        explicit = self.config.getoption("grade_manifest", None)
        if explicit:
            return self._load(Path(explicit)), False
        beside = self._load(notebook.parent / MANIFEST_NAME)
        for candidate in (self.official(), self._load(Path(self.config.rootpath) / "exercises" / MANIFEST_NAME)):
            if candidate is not None and candidate.match(notebook.name):
                if beside is not None and beside.path != candidate.path and beside.match(notebook.name):
                    self.ignored[str(notebook)] = beside.path
                # found next to the notebook too (exercises/ itself): a workbook even without check cells
                return candidate, not (beside is not None and beside.path == candidate.path)
        if beside is not None and beside.match(notebook.name):
            return beside, False
        return None, False

    # -- collection: classify check cells ------------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session):
        files: dict[str, list] = {}
        for item in session.items:
            if _is_nbval_cell(item):
                files.setdefault(str(item.path), []).append(item)
        for path, items in files.items():
            manifest, fallback = self.manifest_for(Path(path))
            if manifest is None:
                continue
            name = manifest.match(Path(path).name)
            specs = manifest.notebooks[name]
            if fallback and not self._calls_a_check(items, specs):
                continue  # e.g. the lesson notebooks/NN_topic.ipynb: same name, not a workbook
            self._classify(path, name, specs, items)
            if path in self.ignored:
                self.notebooks[path].notes.append(
                    f"ignored {self.ignored[path]}: graded with the course's manifest {manifest.path}"
                )

    @staticmethod
    def _calls_a_check(items: list, specs: list[CheckSpec]) -> bool:
        nb = getattr(items[0].parent, "nb", None)
        cells = nb.cells if nb is not None else [item.cell for item in items]
        wanted = {spec.check for spec in specs}
        return any(wanted.intersection(check_calls(cell_source(c))) for c in cells if c.cell_type == "code")

    def _classify(self, path: str, name: str, specs: list[CheckSpec], items: list) -> None:
        try:
            shown = str(Path(path).relative_to(self.config.rootpath))
        except ValueError:
            shown = path
        result = NotebookResult(
            path=shown, notebook=name, exercises={s.exercise: ExerciseResult(s, name) for s in specs}
        )
        self.notebooks[path] = result
        by_num = {item.cell_num: item for item in items}
        nb = getattr(items[0].parent, "nb", None)
        code_cells = [c for c in nb.cells if c.cell_type == "code"] if nb is not None else [i.cell for i in items]
        for number, cell in enumerate(code_cells):
            source = cell_source(cell)
            calls = check_calls(source)
            if not calls:
                continue
            known = [c[len("check_"):] for c in calls if c[len("check_"):] in result.exercises]
            if not known:
                result.notes.append(f"code cell {number} calls {', '.join(calls)}, not an exercise of {name}")
                continue
            digest = source_hash(source)
            item = by_num.get(number)
            for exercise in known:
                ex = result.exercises[exercise]
                ex.present = True
                intact = len(calls) == 1 and digest == ex.spec.sha256
                if item is None:
                    continue  # deselected
                (ex.items if intact else ex.edited).append(item.nodeid)
                self.by_item[item.nodeid] = (ex, intact)
                if intact:
                    self._arm(item, ex.spec)

    @staticmethod
    def _arm(item, spec: CheckSpec) -> None:
        """Grade an intact check cell against the manifest's output, whatever the learner saved."""
        import nbformat

        item.cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=spec.expected_output)]
        if item.cell.get("execution_count") is None:
            item.cell.execution_count = spec.cell + 1
        item.options["check"] = True
        item.options["skip"] = False
        item.options["check_exception"] = False
        compare = item.compare_outputs
        limit = len(spec.expected_output) + 1000

        def compare_capped(test, ref, skip_compare=None):
            """nbval's comparison, on outputs cut to a little more than the success line."""
            for out in test or []:
                text = out.get("text")
                if isinstance(text, str) and len(text) > limit:
                    out["text"] = text[:limit] + f"\n[... {len(text) - limit} more characters cut by the grader]\n"
            return compare(test, ref, skip_compare) if skip_compare is not None else compare(test, ref)

        item.compare_outputs = compare_capped

    # -- run: watch the reports ------------------------------------------------------------------
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        entry = self.by_item.get(item.nodeid)
        if entry is None:
            return
        report = outcome.get_result()
        ex, intact = entry
        if not intact:
            # the learner changed THE check cell (a check called from their own cell is harmless
            # as long as the original check cell is still there)
            if report.when == "call" and not ex.items:
                report.outcome = "failed"
                report.longrepr = (
                    f"Integrity: this check cell of exercise {ex.spec.exercise} differs from the original in "
                    f"exercises/{ex.notebook}, so the exercise scores 0. Restore the original (editing "
                    f"solutions/? run `make exercises` to update the manifest):\n{ex.spec.source}"
                )
                if hasattr(report, "wasxfail"):
                    del report.wasxfail
            return
        if report.when == "setup" and not report.passed:
            ex.outcomes[item.nodeid] = (
                ("skipped", "skipped") if report.skipped else ("failed", _first_line(report.longreprtext))
            )
        elif report.when == "call":
            if report.passed:  # an xpass after an earlier timeout passes too
                ex.outcomes[item.nodeid] = ("passed", "")
            elif report.failed or hasattr(report, "wasxfail"):
                text = report.longreprtext
                if "Timeout of" in text:
                    ex.outcomes[item.nodeid] = ("timeout", _first_line(text[text.index("Timeout of"):]))
                else:
                    ex.outcomes[item.nodeid] = ("failed", self._error_detail(item, text))
            else:
                ex.outcomes[item.nodeid] = ("skipped", "skipped")

    @staticmethod
    def _error_detail(item, text: str) -> str:
        for out in getattr(item, "test_outputs", None) or []:
            if out.get("output_type") == "error":
                return _first_line(f"{out.get('ename')}: {out.get('evalue')}")
        if "Cell outputs differ" in text:
            return "the check printed something other than its success line"
        return _first_line(text)

    # -- summary and report ------------------------------------------------------------------
    def results(self) -> dict:
        notebooks = [nb.to_json() for nb in self.notebooks.values()]
        return {
            "points": sum(nb["points"] for nb in notebooks),
            "max_points": sum(nb["max_points"] for nb in notebooks),
            "notebooks": notebooks,
        }

    def pytest_terminal_summary(self, terminalreporter):
        report_path = self.config.getoption("grade_report", None)
        if not self.notebooks and not report_path:
            return
        results = self.results()
        tr = terminalreporter
        tr.write_sep("=", "adam8 grade")
        if not self.notebooks:
            tr.write_line("no graded workbook in this run (no check cells known to a grading manifest)")
        for nb in results["notebooks"]:
            tr.write_line(f"{nb['path']}: {nb['points']}/{nb['max_points']} points")
            for ex in nb["exercises"]:
                mark = "✔" if ex["status"] == "passed" else "✘"
                line = f"  {mark} {ex['label']:>6} {ex['exercise']:<32} {ex['points']}/{ex['max_points']}  {ex['status']}"
                if ex["status"] not in ("passed",) and ex["detail"]:
                    line += f": {ex['detail']}"
                tr.write_line(line)
            for note in nb["notes"]:
                tr.write_line(f"  note: {note}")
        tr.write_line(f"total: {results['points']}/{results['max_points']} points")
        if report_path:
            write_report(results, Path(report_path))
            tr.write_line(f"grade report written to {report_path}")


CSV_FIELDS = ["notebook", "path", "exercise", "label", "title", "status", "points", "max_points", "detail"]


def write_report(results: dict, path: Path) -> None:
    """Write :meth:`NbvalScorer.results` as JSON, or as CSV with one row per exercise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for nb in results["notebooks"]:
            for ex in nb["exercises"]:
                writer.writerow({"notebook": nb["notebook"], "path": nb["path"], **ex})
