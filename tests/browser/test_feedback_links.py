"""A learner's feedback page in a real browser: the "read again" link opens the lesson, rendered as
HTML, scrolled to the section the failed exercise practises."""

from __future__ import annotations

from pathlib import Path

from adam8lib.course.grading import gradebook
from adam8lib.course.grading.feedback import write_pages
from adam8lib.course.grading.conventions import MANIFEST_NAME, Manifest

ROOT = Path(__file__).resolve().parents[2]
WORKBOOK = "02_ema.ipynb"


def test_the_section_link_opens_the_lesson_at_its_heading(browser, tmp_path, artifacts):
    manifest = Manifest({WORKBOOK: Manifest.load(ROOT / "exercises" / MANIFEST_NAME).notebooks[WORKBOOK]})
    grade = gradebook.LearnerGrade("eve", {s.exercise: 0 for s in manifest.checks})
    for spec in manifest.checks:
        grade.statuses[spec.exercise] = ("failed", "AssertionError: wrong")
        grade.errors[spec.exercise] = "AssertionError: wrong\nHint: look again"
    pages = write_pages([grade], manifest, tmp_path, lessons=ROOT / "notebooks")
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    page = context.new_page()
    try:
        page.goto(pages.learner_pages["eve"].as_uri())
        link = page.locator('a[href$="#Bias-correction"]').first
        link.click()
        page.wait_for_url("**/lessons/02_ema.html#Bias-correction")
        heading = page.locator('[id="Bias-correction"]')
        heading.wait_for(state="visible")
        page.wait_for_function("() => { const r = document.getElementById('Bias-correction').getBoundingClientRect();"
                               " return r.top > -1 && r.top < window.innerHeight; }")  # -1: sub-pixel scroll positions
        assert "Bias correction" in heading.inner_text()
        page.screenshot(path=str(artifacts / "feedback-link-lesson.png"))
    finally:
        context.close()
