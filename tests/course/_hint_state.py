"""The hints' state in this process — the checks' recorded outcomes and each exercise's hint level — forgotten
around every test of the hint tests (an autouse fixture both import), and between cases inside one test."""

from __future__ import annotations

import pytest

from adam8lib.course.checks._common import forget_outcomes
from adam8lib.course.hints import reset_hints


def forget_hints() -> None:
    """No recorded check outcome, every exercise's hints back at level 1."""
    forget_outcomes()
    reset_hints()


@pytest.fixture(autouse=True)
def fresh_hints():
    forget_hints()
    yield
    forget_hints()
