"""Every plausible wrong answer (tests/workbooks/wrong_answers/exNN.py; they test the checks, not a
learner's workbook, so they live here, outside the workbook unit tests that grade stubs) fails its check with the hint
written for it; every correct variant passes; the course's targets hold (≥ 5 wrong answers per
exercise, ≥ 70 % of hints name the mistake, every exercise with a check has its list)."""

from __future__ import annotations

import pytest

from adam8lib.course import checks
from tests.workbooks.wrong_answers import MIN_NAMED_SHARE, MIN_WRONG_PER_EXERCISE, collect, counts

WRONG, RIGHT = collect()


@pytest.mark.parametrize("wrong", WRONG, ids=[f"{w.exercise}-{w.mistake}" for w in WRONG])
def test_wrong_answer_fails_with_its_hint(wrong, capsys):
    with pytest.raises(AssertionError) as info:
        wrong.run()
    assert wrong.hint in str(info.value), f"{wrong.mistake}: got {info.value}"
    assert "all checks passed" not in capsys.readouterr().out


@pytest.mark.parametrize("right", RIGHT, ids=[f"{r.exercise}-{r.how}" for r in RIGHT])
def test_right_variant_passes(right, capsys):
    right.run()
    assert "all checks passed" in capsys.readouterr().out


def test_targets():
    table = counts(WRONG, RIGHT)
    exercises_with_checks = {c.__name__ for c in checks.CHECKS.values()}
    covered = {w.check.__name__ for w in WRONG}
    assert exercises_with_checks <= covered, f"no wrong answers for {sorted(exercises_with_checks - covered)}"
    few = {ex: r["wrong"] for ex, r in table.items() if r["wrong"] < MIN_WRONG_PER_EXERCISE}
    assert not few, f"fewer than {MIN_WRONG_PER_EXERCISE} wrong answers: {few}"
    named = sum(r["named"] for r in table.values()) / sum(r["wrong"] for r in table.values())
    assert named >= MIN_NAMED_SHARE, f"only {named:.0%} of hints name the mistake"
