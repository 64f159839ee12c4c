"""Shared helpers for the tests of the workbook checks (tests/test_checks_ex*.py)."""

from pathlib import Path

import pytest

from adam8lib.course.grading.workbook import find_workbook, load_workbook

SOLUTIONS = Path(__file__).resolve().parents[1] / "solutions"


def solution(number: str, name: str):
    """A function defined by the solution cells of workbook ``number``."""
    return getattr(load_workbook(find_workbook(SOLUTIONS, number)), name)


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise: stub")


def fails_with(check, fn, hint: str) -> None:
    """``check(fn)`` must raise an AssertionError whose message contains ``hint``."""
    with pytest.raises(AssertionError) as info:
        check(fn)
    assert hint in str(info.value), str(info.value)
