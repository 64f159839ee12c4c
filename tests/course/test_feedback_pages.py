"""The feedback pages ``make grade`` writes (adam8lib/course/grading/feedback.py, lessons.py).

A synthetic class of workbook 02 is graded once through the gradebook's command line
(``--jobs 1``, a one-workbook manifest): a correct learner (full marks), a partly wrong one
(one check fails with a hint), a wrong one whose exercise cell also crashes, a broken notebook
(not JSON), and a hostile one whose folder name is HTML and whose code prints a ``<script>``
element, raises one, and forges a "Hint:" line. The pages are parsed with the stdlib HTML
parser: scores, hints (the same text the check gives in this process), lesson links that
resolve to the lesson and its heading, the class page's pass rates and hint counts, links to
every learner's page, and no element or attribute that a learner wrote. Cheap cases (page
names, lesson sections, pages without local lessons, stale pages) use grades built by hand.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import tomllib
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import nbformat
import pytest

from adam8lib.course.grading import gradebook, sandbox
from adam8lib.course.grading.conventions import MANIFEST_NAME, SOLUTION_TAG, Manifest
from adam8lib.course.grading.feedback import GENERATOR, page_name, split_hint, write_pages
from adam8lib.course.grading.lessons import SECTIONS, heading_anchor, lesson_headings, lesson_section

REPO = Path(__file__).resolve().parents[2]
WORKBOOK = "02_ema.ipynb"
LESSONS = REPO / "notebooks"
HOSTILE = '<img src=x onerror=alert(1)> "Zoë" & co'

RIGHT_MOMENTS = "def adam_moments(m, v, g, beta1, beta2):\n    return beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g\n"
SWAPPED_MOMENTS = "def adam_moments(m, v, g, beta1, beta2):\n    return (1 - beta1) * m + beta1 * g, (1 - beta2) * v + beta2 * g * g\n"
RIGHT_BIAS = "def bias_correct(m, v, beta1, beta2, step):\n    return m / (1 - beta1**step), v / (1 - beta2**step)\n"
LATE_BIAS = "def bias_correct(m, v, beta1, beta2, step):\n    return m / (1 - beta1**(step + 1)), v / (1 - beta2**(step + 1))\n"
CLASS = {
    "ada": (RIGHT_MOMENTS, RIGHT_BIAS),
    "bo": (RIGHT_MOMENTS, LATE_BIAS),
    "cy": (SWAPPED_MOMENTS, LATE_BIAS + "raise RuntimeError('my cell crashed')\n"),
    HOSTILE: (
        RIGHT_MOMENTS.replace("    return", "    print('<script>alert(1)</script>')\n    return"),
        "def bias_correct(m, v, beta1, beta2, step):\n    raise ValueError('nope\\nHint: <script>alert(2)</script>')\n"
        "raise RuntimeError('<script>alert(3)</script>')\n",
    ),
}


def _workbook(moments: str, bias: str) -> nbformat.NotebookNode:
    nb = nbformat.read(str(REPO / "exercises" / WORKBOOK), as_version=4)
    cells = [c for c in nb.cells if SOLUTION_TAG in c.metadata.get("tags", [])]
    assert len(cells) == 2
    cells[0].source, cells[1].source = "import torch\n" + moments, bias
    return nb


class Page(HTMLParser):
    """Every start tag with its attributes, the visible text, the links and the table rows."""

    def __init__(self, path: Path):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.links: list[tuple[str, str]] = []
        self.rows: list[list[str]] = []
        self.chunks: list[str] = []
        self._cell: list[str] | None = None
        self._link: list | None = None
        self._in_style = False
        self.feed(path.read_text(encoding="utf-8"))
        self.close()
        self.text = re.sub(r"\s+", " ", "".join(self.chunks))

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in ("a", "strong"):  # block-level: text on either side does not run together
            self.chunks.append(" ")
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "a":
            self._link = [dict(attrs).get("href"), []]
        elif tag == "style":
            self._in_style = True

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append(re.sub(r"\s+", " ", "".join(self._cell)).strip())
            self._cell = None
        elif tag == "a" and self._link is not None:
            self.links.append((self._link[0], "".join(self._link[1]).strip()))
            self._link = None
        elif tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            return
        self.chunks.append(data)
        if self._cell is not None:
            self._cell.append(data)
        if self._link is not None:
            self._link[1].append(data)

    def row(self, first: str) -> list[str]:
        [found] = [r for r in self.rows if r and r[0] == first]
        return found


def assert_no_learner_markup(page: Page) -> None:
    """Only the template's own elements: no script, no img, no event-handler attribute."""
    allowed = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "strong", "table", "tr",
               "th", "td", "a", "ul", "li", "div", "pre"}  # fmt: skip
    assert {tag for tag, _ in page.tags} <= allowed, {tag for tag, _ in page.tags} - allowed
    assert not [a for _, attrs in page.tags for a in attrs if a.startswith("on")]


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("feedback")
    sub = root / "submissions"
    for name, (moments, bias) in CLASS.items():
        (sub / name).mkdir(parents=True)
        nbformat.write(_workbook(moments, bias), str(sub / name / WORKBOOK))
    (sub / "broken").mkdir()
    (sub / "broken" / WORKBOOK).write_text('{"cells": [', encoding="utf-8")
    manifest = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
    only = root / MANIFEST_NAME  # a one-workbook course: quick, and no "missing" notes
    only.write_text(Manifest({WORKBOOK: manifest.notebooks[WORKBOOK]}).dumps(), encoding="utf-8")
    out = root / "grades" / "gradebook.csv"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        rc = gradebook.main([str(sub), "--out", str(out), "--manifest", str(only), "--jobs", "1",
                             "--cell-timeout", "60", "--lessons", str(LESSONS),
                             "--sandbox", "bwrap" if sandbox.available() is None else "none"])  # fmt: skip
    assert rc == 0, stdout.getvalue()
    return {"root": root, "grades": out.parent, "stdout": stdout.getvalue(), "manifest": Manifest.load(only)}


def _hint(check: str, source: str) -> str:
    """The hint the course's check gives for ``source``, run here (what the page must show)."""
    from adam8lib.course import checks

    namespace: dict = {}
    exec(source, namespace)
    function = next(v for k, v in namespace.items() if callable(v) and not k.startswith("__"))
    with pytest.raises(AssertionError) as caught:
        getattr(checks, f"check_{check}")(function)
    hint, _ = split_hint(str(caught.value))
    assert hint, str(caught.value)
    return hint


def learner_page(graded: dict, name: str) -> Page:
    return Page(graded["grades"] / "learners" / page_name(name))


def test_cli_says_where_the_pages_are(graded):
    grades = graded["grades"]
    assert f"feedback pages: {grades / 'class.html'} (the class) and 5 in {grades / 'learners'}" in graded["stdout"]
    assert sorted(p.name for p in (grades / "learners").iterdir()) == sorted(
        page_name(n) for n in [*CLASS, "broken"])  # fmt: skip


def test_correct_learner_has_full_marks(graded):
    page = learner_page(graded, "ada")
    assert "Feedback for ada" in page.text and "2 / 2 points" in page.text and "2 of 2 exercises passed" in page.text
    assert page.row("02.1 · Adam's two moving averages")[1:3] == ["1 / 1", "✔ passed"]
    assert page.row("02.2 · Bias correction")[1:3] == ["1 / 1", "✔ passed"]
    assert "Hint:" not in page.text and "Read again" not in page.text
    assert_no_learner_markup(page)


def test_partly_wrong_learner_gets_the_checks_hint_and_lesson_link(graded):
    page = learner_page(graded, "bo")
    assert "1 / 2 points" in page.text
    assert page.row("02.1 · Adam's two moving averages")[1:3] == ["1 / 1", "✔ passed"]
    row = page.row("02.2 · Bias correction")
    assert row[1:] == ["0 / 1", "✘ failed", "notebooks/02_ema.ipynb, section “Bias correction”"]
    hint = _hint("bias_correct", LATE_BIAS)
    assert f"Hint: {hint}" in page.text
    # the first lines of the check's message: which call, what differs
    assert "AssertionError: bias_correct after 1 steps of a constant g" in page.text
    assert "Read again: notebooks/02_ema.ipynb, section “Bias correction”." in page.text
    # the link opens the lesson at the section's heading (Jupyter's id for it)
    hrefs = {href for href, text in page.links if text == "notebooks/02_ema.ipynb"}
    by_fragment = {unquote(h.split("#")[1]) for h in hrefs}
    assert by_fragment == {"These-are-Adam's-moments", "Bias-correction"}
    for href in hrefs:  # to the lesson rendered as HTML next to the pages, where that heading has the id
        path, fragment = href.split("#")
        target = (graded["grades"] / "learners" / unquote(path)).resolve()
        assert target == (graded["grades"] / "lessons" / "02_ema.html").resolve()
        assert f'id="{fragment}"' in target.read_text(encoding="utf-8")
    assert "Bias correction" in lesson_headings(LESSONS / WORKBOOK)
    assert_no_learner_markup(page)


def test_crashing_cell_is_said_and_both_hints_shown(graded):
    page = learner_page(graded, "cy")
    assert "0 / 2 points" in page.text
    assert f"Hint: {_hint('adam_moments', SWAPPED_MOMENTS)}" in page.text
    assert f"Hint: {_hint('bias_correct', LATE_BIAS)}" in page.text
    assert "(exercise cell) raised RuntimeError: my cell crashed" in page.text


def test_broken_notebook_gets_a_page_that_says_what_went_wrong(graded):
    page = learner_page(graded, "broken")
    assert "0 / 2 points" in page.text
    assert f"{WORKBOOK} could not be read (JSONDecodeError" in page.text
    assert "None of its 2 exercises could be graded" in page.text
    for title in ("02.1 · Adam's two moving averages", "02.2 · Bias correction"):
        assert page.row(title)[1:3] == ["0 / 1", "✘ not graded: the workbook could not be read"]
    [lesson] = [href for href, text in page.links if text == "notebooks/02_ema.ipynb" and "#" not in href]
    assert (graded["grades"] / "learners" / unquote(lesson)).resolve() == (graded["grades"] / "lessons" / "02_ema.html").resolve()


def test_hostile_output_and_name_show_as_text(graded):
    name = page_name(HOSTILE)
    assert re.fullmatch(r"img_src_x_onerror_alert_1_Zoe_co-[0-9a-f]{8}\.html", name), name
    raw = (graded["grades"] / "learners" / name).read_text(encoding="utf-8")
    assert "<script" not in raw and "<img" not in raw
    page = Page(graded["grades"] / "learners" / name)
    assert_no_learner_markup(page)
    assert f"Feedback for {HOSTILE}" in page.text
    assert "the check printed '<script>alert(1)</script>', not its success line" in page.text
    assert "Hint: <script>alert(2)</script>" in page.text
    assert "raised RuntimeError: <script>alert(3)</script>" in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in raw


def test_class_page_pass_rates_top_hints_and_links(graded):
    page = Page(graded["grades"] / "class.html")
    assert_no_learner_markup(page)
    raw = (graded["grades"] / "class.html").read_text(encoding="utf-8")
    assert "<script" not in raw and "<img" not in raw
    assert "5 learner(s), 2 points in all." in page.text
    # passed: 02.1 ada, bo; 02.2 ada. broken is unreadable; the rest failed
    moments = page.row("02.1 · Adam's two moving averages")
    assert moments[1:4] == ["2 / 5", "40 %", "2 failed, 1 unreadable"]
    assert moments[4] == "notebooks/02_ema.ipynb, section “These are Adam's moments”"
    assert page.row("02.2 · Bias correction")[1:4] == ["1 / 5", "20 %", "3 failed, 1 unreadable"]
    hints = [r for r in page.rows if len(r) == 3 and r[0] != "Learners"]
    late = _hint("bias_correct", LATE_BIAS)
    assert hints[0] == ["2 (40 %)", "02.2 · Bias correction", late]  # bo and cy
    assert sorted(hints[1:]) == sorted([
        ["1 (20 %)", "02.1 · Adam's two moving averages", _hint("adam_moments", SWAPPED_MOMENTS)],
        ["1 (20 %)", "02.2 · Bias correction", "<script>alert(2)</script>"],  # the hostile learner's forged hint, as text
    ])  # fmt: skip
    links = {text: href for href, text in page.links if href.startswith("learners/")}
    assert sorted(links) == sorted([*CLASS, "broken"])
    for text, href in links.items():
        assert (graded["grades"] / unquote(href)).is_file() and unquote(href) == f"learners/{page_name(text)}"
    assert page.row("bo")[1:3] == ["1 / 2", "1"] and page.row("ada")[1:3] == ["2 / 2", "2"]


def test_reports_keep_the_failed_checks_message(graded):
    report = json.loads((graded["grades"] / "reports" / "bo.json").read_text(encoding="utf-8"))
    entry = report["statuses"]["bias_correct"]
    assert entry["status"] == "failed" and entry["error"].endswith(f"Hint: {_hint('bias_correct', LATE_BIAS)}")
    assert "error" not in report["statuses"]["adam_moments"]
    broken = json.loads((graded["grades"] / "reports" / "broken.json").read_text(encoding="utf-8"))
    assert {v["status"] for v in broken["statuses"].values()} == {"unreadable"}


# ---------------------------------------------------------------------------------------------
# without grading
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ada", "Bo.Smith-2", "con", "Zoë", "a b", "a_b", "..", "-x", "#1?", "x" * 200,
                                  "<b>", "名前", "ada.html", "not-utf8-\udcff"])  # fmt: skip
def test_page_names_are_plain_and_distinct(name):
    page = page_name(name)
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*\.html", page) and len(page) <= 100, page
    plain = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}", name) and name != "con"
    assert (page == f"{name}.html") == bool(plain)


def test_page_names_never_collide():
    from adam8lib.course.grading.feedback import _page_names

    names = ["a b", "a_b", "a?b", "Ada", "ada", "ADA", "x", "x-0"]
    pages = _page_names(names)
    assert len({p.casefold() for p in pages.values()}) == len(names)
    assert pages["x"] == "x.html"


def test_every_exercise_has_a_lesson_section_that_exists():
    manifest = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
    assert set(SECTIONS) == {spec.exercise for spec in manifest.checks}
    for spec in manifest.checks:
        section = lesson_section(spec.exercise, spec.notebook, LESSONS, LESSONS)
        assert section.found, f"{spec.exercise}: no heading {SECTIONS[spec.exercise]!r} in notebooks/{spec.notebook}"
        assert section.href == f"{spec.notebook}#{heading_anchor(SECTIONS[spec.exercise])}"
    assert heading_anchor("6 · `Trainer` with 8-bit Adam") == "6-%C2%B7-Trainer-with-8-bit-Adam"


def _grade(name: str, manifest: Manifest, status: str, error: str = "") -> gradebook.LearnerGrade:
    grade = gradebook.LearnerGrade(name, {s.exercise: 0 for s in manifest.checks})
    for spec in manifest.checks:
        grade.statuses[spec.exercise] = (status, error.splitlines()[0] if error else "")
        if error:
            grade.errors[spec.exercise] = error
    return grade


def test_without_local_lessons_the_section_is_named_and_stale_pages_go(tmp_path):
    manifest = Manifest({WORKBOOK: Manifest.load(REPO / "exercises" / MANIFEST_NAME).notebooks[WORKBOOK]})
    learners = tmp_path / "learners"
    learners.mkdir()
    (learners / "gone.html").write_text(f'<meta name="generator" content="{GENERATOR}">', encoding="utf-8")
    (learners / "mine.html").write_text("<p>the instructor's own file</p>", encoding="utf-8")
    grades = [_grade("eve", manifest, "failed", "AssertionError: wrong\nHint: look again"),
              _grade("fay", manifest, "timeout", "")]
    grades[1].statuses["adam_moments"] = ("timeout", "Timeout of 5 s exceeded in the check of adam_moments")
    pages = write_pages(grades, manifest, tmp_path, lessons=None)
    assert sorted(p.name for p in learners.iterdir()) == ["eve.html", "fay.html", "mine.html"]
    eve = Page(pages.learner_pages["eve"])
    assert "Read again: notebooks/02_ema.ipynb, section “Bias correction”." in eve.text
    assert not [href for href, _ in eve.links]  # nothing to link to
    assert eve.text.count("Hint: look again") == 2
    fay = Page(pages.learner_pages["fay"])
    assert "stopped: ran past the time limit" in fay.text and "Timeout of 5 s exceeded" in fay.text
    summary = Page(pages.class_page)
    assert ["1 (50 %)", "02.1 · Adam's two moving averages", "look again"] in summary.rows
    assert summary.row("02.1 · Adam's two moving averages")[1:4] == ["0 / 2", "0 %", "1 failed, 1 timed out"]


def test_templates_ship_with_the_package():
    """pyproject's package-data covers every template (so `pip install` carries them)."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    folder = REPO / "adam8lib" / "course" / "grading"
    shipped = {p for pattern in data["adam8lib.course.grading"] for p in folder.glob(pattern)}
    templates = set((folder / "templates").iterdir())
    assert templates and templates <= shipped
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert any(re.match(r"jinja2\b", d, re.I) for d in extras["course"])


def test_runner_keeps_the_hint_of_a_long_message():
    """The grading child sends the first lines of a failed check's message and always its hint."""
    from adam8lib.course.grading.runner import _message

    text = "AssertionError: first\n" + "".join(f"line {i}\n\n" for i in range(30)) + "x" * 1000 + "\nHint: the hint\n"
    sent = _message(text).splitlines()
    assert sent[:2] == ["AssertionError: first", "line 0"] and len(sent) == 13
    assert sent[-1] == "Hint: the hint"
    assert split_hint(_message(text)) == ("the hint", sent[:-1])
    assert _message("ValueError: " + "y" * 1000) == "ValueError: " + "y" * 285 + "..."


def test_every_section_link_lands_on_a_heading_of_the_rendered_lesson(tmp_path):
    """The anchors are worked out from the notebooks (heading_anchor); the ids are nbconvert's. Every
    exercise's link must find its heading in the HTML the pages link to."""
    from adam8lib.course.grading.lessons import render_lessons

    manifest = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
    rendered = render_lessons(manifest.notebooks, LESSONS, tmp_path / "lessons")
    assert sorted(rendered) == sorted(manifest.notebooks)
    for spec in manifest.checks:
        section = lesson_section(spec.exercise, spec.notebook, LESSONS, tmp_path, rendered)
        path, fragment = section.href.split("#")
        assert path == f"lessons/{Path(spec.notebook).stem}.html"
        assert f'id="{fragment}"' in (tmp_path / path).read_text(encoding="utf-8"), (spec.exercise, fragment)


def test_a_lesson_that_cannot_be_rendered_is_linked_as_the_notebook(tmp_path):
    from adam8lib.course.grading.lessons import render_lessons

    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    (lessons / WORKBOOK).write_text('{"cells": [', encoding="utf-8")
    assert render_lessons([WORKBOOK], lessons, tmp_path / "lessons") == {}
    section = lesson_section("bias_correct", WORKBOOK, lessons, tmp_path, {})
    assert section.href == f"notebooks/{WORKBOOK}" and not section.found
