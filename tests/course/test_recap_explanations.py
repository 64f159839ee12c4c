"""A recap's explanation sits right under its own question and states that question's answer.

A recap (``RECAPS`` in :mod:`adam8lib.course.checks.questions`) is asked with ``ask`` and explained by the folded
``<details>`` cell that follows it. Lesson 05 once had its two recap explanations swapped: the answer of 05.c
stood under 05.b. Here each explanation must name its own question's answer: the letter ``(x)`` of a multiple
choice, or a number within the question's tolerance (LaTeX forms such as ``10^8`` and ``131{,}566{,}188`` read
as numbers).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import nbformat
import pytest

from adam8lib.course.checks.questions import QUESTIONS, RECAPS

LESSONS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
_ASK = re.compile(r'\bask\(\s*"(\d\d\.[a-z])"')
_POWER = re.compile(r"(\d+(?:\.\d+)?)\s*\^\s*\{?\s*([-+]?\d+)\s*\}?")
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def numbers_in(text: str) -> list[float]:
    """Every number written in ``text``, thousands separators (``,``, ``{,}``) and powers (``10^{-8}``) read."""
    text = text.replace("{,}", "").replace("\\,", "")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    found = [float(a) ** float(b) for a, b in _POWER.findall(text)]
    found += [float(s) for s in _NUMBER.findall(_POWER.sub(" ", text))]
    return found


def recaps(lesson: Path):
    cells = nbformat.read(lesson, as_version=4).cells
    for i, cell in enumerate(cells):
        match = _ASK.search(cell.source) if cell.cell_type == "code" else None
        if match and match.group(1) in RECAPS:
            yield match.group(1), (cells[i + 1] if i + 1 < len(cells) else None)


CASES = [(lesson.name, qid, cell) for lesson in LESSONS for qid, cell in recaps(lesson)]


def test_every_recap_is_found():
    asked = {qid for _, qid, _ in CASES}
    assert asked == set(RECAPS), f"recaps never asked in a lesson: {sorted(set(RECAPS) - asked)}"


@pytest.mark.parametrize("lesson,qid,cell", CASES, ids=[f"{q}" for _, q, _ in CASES])
def test_explanation_follows_its_recap_and_states_its_answer(lesson, qid, cell):
    assert cell is not None and cell.cell_type == "markdown" and cell.source.lstrip().startswith("<details"), (
        f"{lesson}: the cell after ask({qid!r}) must be its folded explanation")
    question = QUESTIONS[qid]
    if question.choices:
        assert f"({question.answer})" in cell.source, f"{lesson}: {qid}'s explanation does not state ({question.answer})"
        return
    tol = max(question.rel_tol * abs(question.answer), 1e-12)
    assert any(math.isclose(v, question.answer, rel_tol=0, abs_tol=tol) for v in numbers_in(cell.source)), (
        f"{lesson}: the explanation under {qid} states no number within its tolerance of {question.answer:g} "
        f"(is it another question's explanation?)")


def test_numbers_in_reads_latex():
    assert 1e8 in numbers_in(r"**$10^8$** times") and 1e-8 in numbers_in(r"$10^{-8}$")
    assert 131566188 in numbers_in(r"$= 131{,}566{,}188$ elements") and 5.5e-7 in numbers_in("**5.5e-7**.")
