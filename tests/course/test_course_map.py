"""Lesson 00's course map lists every lesson, and every lesson but the last links to the next one."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[2]
LESSONS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
_MAP_ROW = re.compile(r"^\|\s*(\d\d)\s*\|\s*\[[^\]]+\]\(([^)]+\.ipynb)\)", re.M)


def _markdown(path: Path) -> str:
    return "\n".join(c.source for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "markdown")


def test_the_course_map_lists_every_lesson_in_order():
    rows = _MAP_ROW.findall(_markdown(REPO / "notebooks" / "00_setup_and_tour.ipynb"))
    assert rows == [(p.name[:2], p.name) for p in LESSONS], rows


@pytest.mark.parametrize("lesson, following", list(zip(LESSONS, LESSONS[1:])), ids=[p.stem for p in LESSONS[:-1]])
def test_each_lesson_links_to_the_next(lesson, following):
    nexts = re.findall(r"Next: \[(\d\d) · [^\]]+\]\(([^)]+)\)", _markdown(lesson))
    assert (following.name[:2], following.name) in nexts, f"{lesson.name}: no 'Next: [{following.name[:2]} · …]' link; {nexts}"
