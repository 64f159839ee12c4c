"""Feedback pages after grading: one HTML page per learner and one for the instructor.

:func:`write_pages` is called by the gradebook (:mod:`adam8lib.course.grading.gradebook`) once
a class is graded, and writes next to the CSV:

* ``learners/<learner>.html`` — the learner's total and, per workbook and exercise, the points;
  for a failed check its hint and the first lines of its message; for every exercise not passed
  a link to the lesson section it practises (:mod:`adam8lib.course.grading.lessons`); a missing
  or unreadable workbook says so;
* ``class.html`` — the pass rate of every exercise, the hints the class got most often (how many
  learners got each), and a link to every learner's page.

The pages are plain HTML with their style inline: no script, nothing fetched, readable offline.
They are rendered with Jinja2 from ``templates/`` (package data) with autoescaping on, so what a
learner controls (their folder's name, what their code printed or raised, which the checks'
messages quote) is shown as text, never read as HTML. A learner name that is not a plain file
name gets a page named after a slug of it and a hash.
"""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from .conventions import CheckSpec, Manifest
from .lessons import LessonSection, lesson_file, lesson_section, render_lessons

__all__ = ["GENERATOR", "FeedbackPages", "page_name", "split_hint", "write_pages"]

#: The ``generator`` meta tag of every page: pages left from an earlier run are recognised by it.
GENERATOR = "adam8lib.course.grading.feedback"
#: What each status says to a learner (``passed`` and ``failed`` are shown with points and hints).
STATUS_TEXT = {
    "passed": "passed",
    "failed": "failed",
    "timeout": "stopped: ran past the time limit",
    "tampered": "0 points: the code changed the checks or what they rely on",
    "error": "could not be checked",
    "not run": "not checked (grading stopped before this exercise)",
    "missing": "not handed in",
    "unreadable": "not graded: the workbook could not be read",
}
#: The same, in a few words (the class page's counts).
SHORT = {"timeout": "timed out", "missing": "not handed in", "not run": "not checked"}
#: Statuses that mean the workbook was not graded at all (its note says why, once).
UNGRADED = ("missing", "unreadable")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}
_ERROR_LINES = 8


def page_name(learner: str) -> str:
    """A file name for a learner's page: the name itself when it is plain (letters, digits,
    ``.``, ``_``, ``-``), else an ASCII slug of it and 8 hex digits of its sha256."""
    stem = learner.removesuffix(".html")
    if _PLAIN_NAME.fullmatch(learner) and stem.split(".")[0].lower() not in _RESERVED:
        return learner + ".html"
    ascii_name = unicodedata.normalize("NFKD", learner).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", ascii_name).strip("._-")[:60] or "learner"
    return f"{slug}-{hashlib.sha256(learner.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}.html"


def split_hint(message: str) -> tuple[str | None, list[str]]:
    """(hint, the other lines) of a failed check's message: the hint is the last line starting
    ``Hint:`` and what follows it (the checks' ``fail`` puts it last)."""
    lines = [ln for ln in message.splitlines() if ln.strip()]
    at = max((i for i, ln in enumerate(lines) if ln.lstrip().startswith("Hint:")), default=None)
    if at is None:
        return None, lines
    hint = " ".join([lines[at].lstrip()[len("Hint:"):].strip(), *(ln.strip() for ln in lines[at + 1 :])]).strip()
    return hint or None, lines[:at]


@dataclass
class ExerciseView:
    spec: CheckSpec
    points: int
    status: str
    status_text: str
    hint: str | None
    message: list[str]  # first lines of the check's message (or the reason it was not graded)
    lesson: LessonSection

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass
class WorkbookView:
    name: str
    points: int
    max_points: int
    notes: list[str]
    exercises: list[ExerciseView]
    lesson: LessonSection  # the lesson as a whole

    @property
    def graded(self) -> bool:
        """False when the workbook was missing or could not be read (its note says which)."""
        return not all(e.status in UNGRADED for e in self.exercises)


@dataclass
class LearnerView:
    name: str
    page: str
    total: int
    max_total: int
    passed: int
    workbooks: list[WorkbookView]
    notes: list[str] = field(default_factory=list)  # notes about no single workbook

    @property
    def exercises(self) -> int:
        return sum(len(w.exercises) for w in self.workbooks)

    @property
    def note_count(self) -> int:
        return len(self.notes) + sum(len(w.notes) for w in self.workbooks)


@dataclass
class FeedbackPages:
    """Where the pages went: ``class_page`` and {learner: page}."""

    class_page: Path
    learner_pages: dict[str, Path]


def _environment():
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("adam8lib.course.grading", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


class _Links:
    """Lesson links as seen from one folder of pages, each worked out once per run."""

    def __init__(self, lessons: Path | None, page_dir: Path, rendered: dict[str, Path] | None = None):
        self.lessons, self.page_dir, self.rendered, self.memo = lessons, page_dir, rendered, {}

    def section(self, spec: CheckSpec) -> LessonSection:
        key = ("section", spec.exercise, spec.notebook)
        if key not in self.memo:
            self.memo[key] = lesson_section(spec.exercise, spec.notebook, self.lessons, self.page_dir, self.rendered)
        return self.memo[key]

    def lesson(self, notebook: str) -> LessonSection:
        key = ("lesson", notebook)
        if key not in self.memo:
            self.memo[key] = lesson_file(notebook, self.lessons, self.page_dir, self.rendered)
        return self.memo[key]


def _exercise(grade, spec: CheckSpec, links: _Links) -> ExerciseView:
    status, detail = grade.statuses.get(spec.exercise, ("not run", ""))
    hint, message = split_hint(grade.errors.get(spec.exercise, "")) if status == "failed" else (None, [])
    if not message and detail and status not in ("passed", *UNGRADED) and detail not in grade.notes:
        message = [detail]
    return ExerciseView(spec, grade.points.get(spec.exercise, 0), status, STATUS_TEXT.get(status, status), hint,
                        message[:_ERROR_LINES], links.section(spec))  # fmt: skip


def learner_view(grade, manifest: Manifest, links: _Links, page: str) -> LearnerView:
    """What a learner's page shows, from their grade (:class:`~.gradebook.LearnerGrade`)."""
    workbooks, claimed = [], set()
    for name, specs in manifest.notebooks.items():
        notes = [n for n in grade.notes if n.startswith(name)]
        claimed.update(notes)
        exercises = [_exercise(grade, spec, links) for spec in specs]
        workbooks.append(WorkbookView(name, sum(e.points for e in exercises), manifest.points(name), notes, exercises,
                                      links.lesson(name)))  # fmt: skip
    return LearnerView(
        name=grade.learner, page=page, total=grade.total, max_total=manifest.total_points,
        passed=sum(e.passed for w in workbooks for e in w.exercises), workbooks=workbooks,
        notes=[n for n in grade.notes if n not in claimed],
    )  # fmt: skip


def class_view(views: list[LearnerView], manifest: Manifest, links: _Links) -> dict:
    """Pass rates per exercise and the most frequent hints (learners counted once per hint)."""
    size = len(views)
    rows = []
    by_exercise: dict[str, list[ExerciseView]] = {}
    for view in views:
        for workbook in view.workbooks:
            for exercise in workbook.exercises:
                by_exercise.setdefault(exercise.spec.exercise, []).append(exercise)
    hints: Counter = Counter()
    order = {spec.exercise: i for i, spec in enumerate(manifest.checks)}
    for spec in manifest.checks:
        results = by_exercise.get(spec.exercise, [])
        counts = Counter(e.status for e in results)
        passed = counts.pop("passed", 0)
        rows.append({"spec": spec, "passed": passed, "rate": 100.0 * passed / size if size else 0.0,
                     "others": [(SHORT.get(k, k), n) for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))],
                     "lesson": links.section(spec)})  # fmt: skip
        hints.update((spec.exercise, e.hint) for e in results if e.status == "failed" and e.hint)  # one per learner
    specs = {spec.exercise: spec for spec in manifest.checks}
    top = [{"spec": specs[ex], "hint": hint, "count": count, "share": 100.0 * count / size}
           for (ex, hint), count in sorted(hints.items(), key=lambda kv: (-kv[1], order[kv[0][0]], kv[0][1]))]  # fmt: skip
    return {"size": size, "exercises": rows, "hints": top[:20], "more_hints": max(0, len(top) - 20)}


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8", errors="replace")  # a name that is not UTF-8 shows "?"
    os.replace(tmp, path)


def _page_names(learners: list[str]) -> dict[str, str]:
    """{learner: file name}, unique even on a case-insensitive file system."""
    names = {learner: page_name(learner) for learner in learners}
    folded = Counter(n.casefold() for n in names.values())
    for learner, name in names.items():
        if folded[name.casefold()] > 1:
            digest = hashlib.sha256(learner.encode("utf-8", "surrogateescape")).hexdigest()[:8]
            names[learner] = f"{name.removesuffix('.html')}-{digest}.html"
    return names


def write_pages(grades: list, manifest: Manifest, folder: Path, lessons: Path | None = None) -> FeedbackPages:
    """Write ``folder/learners/<learner>.html`` for every grade and ``folder/class.html``.

    ``lessons`` is the folder of the lesson notebooks (``notebooks/``): each is rendered to
    ``folder/lessons/<lesson>.html`` and linked there, at the section's heading (the notebook
    itself where it cannot be rendered); None (or a folder without them) names the lesson and
    section without a link. Pages
    of learners no longer in the class, left by an earlier run, are removed.
    """
    folder = Path(folder)
    learners_dir = folder / "learners"
    learners_dir.mkdir(parents=True, exist_ok=True)
    env = _environment()
    grades = sorted(grades, key=lambda g: g.learner)
    names = _page_names([g.learner for g in grades])
    views, written = [], {}
    rendered = render_lessons(manifest.notebooks, lessons, folder / "lessons") if lessons is not None else {}
    template, links = env.get_template("learner.html"), _Links(lessons, learners_dir, rendered)
    for grade in grades:
        view = learner_view(grade, manifest, links, names[grade.learner])
        views.append(view)
        path = learners_dir / view.page
        _write(path, template.render(learner=view, generator=GENERATOR, status_text=STATUS_TEXT))
        written[grade.learner] = path
    keep = {p.name for p in written.values()}
    for old in learners_dir.glob("*.html"):
        if old.name not in keep and f'content="{GENERATOR}"' in old.read_text(encoding="utf-8", errors="replace")[:2000]:
            old.unlink()
    summary = class_view(views, manifest, _Links(lessons, folder, rendered))
    class_page = folder / "class.html"
    _write(class_page, env.get_template("class.html").render(
        learners=views, links={v.name: "learners/" + quote(v.page) for v in views}, summary=summary,
        total_points=manifest.total_points, generator=GENERATOR))  # fmt: skip
    return FeedbackPages(class_page, written)
