"""Plausible wrong answers to every exercise, each with the hint its check cell must give.

One module per workbook (``exNN.py``) lists what learners plausibly write instead of the
solution, and correct answers written differently from the solution::

    from tests.workbooks.wrong_answers import Right, Wrong
    from adam8lib.course import checks

    WRONG = [
        Wrong("03.1", checks.check_adam_step, adam_with_decoupled_decay,
              mistake="weight decay applied to p directly (AdamW's rule) in Adam",
              hint="that is AdamW's decoupled decay", names_mistake=True),
        ...
    ]
    RIGHT = [Right("03.1", checks.check_adam_step, adam_written_with_torch_lerp,
                   how="m and v updated with torch.lerp")]

``tests/course/test_wrong_answers.py`` asserts each one: a wrong answer's check raises an
AssertionError whose message contains ``hint`` (so it is caught, and caught *for that reason*),
a right one passes. ``names_mistake`` records whether the hint says what was done wrong in the
learner's terms (True) or only reminds of the rule (False); the counts are printed by::

    python -m tests.workbooks.wrong_answers        # per exercise: wrong, caught, named, right

and the course's targets (≥ 5 wrong answers per exercise, ≥ 70 % of them named, every right
variant accepted) are asserted by the test module.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

if not torch.cuda.is_available():  # workbook 08's kernels: Triton must be imported in interpreter mode (as in
    os.environ.setdefault("TRITON_INTERPRET", "1")  # tests/conftest.py), and an earlier exNN may import it first

__all__ = ["Wrong", "Right", "collect", "counts", "MIN_WRONG_PER_EXERCISE", "MIN_NAMED_SHARE"]

MIN_WRONG_PER_EXERCISE = 5
MIN_NAMED_SHARE = 0.70


@dataclass(frozen=True)
class Wrong:
    """A plausible wrong answer to exercise ``exercise`` ("NN.k") and the hint it must get."""

    exercise: str
    check: Callable[[Any], None]
    answer: Any  # what the learner hands to the check (a function, a class, a value)
    mistake: str  # what was done wrong, in a few words (for the report)
    hint: str  # a substring of the AssertionError's message
    names_mistake: bool  # does the hint name this mistake (not just restate the rule)?
    args: tuple = field(default=())  # extra positional arguments of the check, if it takes any

    def run(self) -> None:
        self.check(self.answer, *self.args)


@dataclass(frozen=True)
class Right:
    """A correct answer written differently from the solution: the check must accept it."""

    exercise: str
    check: Callable[[Any], None]
    answer: Any
    how: str
    args: tuple = field(default=())

    def run(self) -> None:
        self.check(self.answer, *self.args)


def collect() -> tuple[list[Wrong], list[Right]]:
    """Every ``WRONG`` and ``RIGHT`` of the ``exNN`` modules of this package."""
    wrong: list[Wrong] = []
    right: list[Right] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if not info.name.startswith("ex"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        wrong += list(getattr(module, "WRONG", []))
        right += list(getattr(module, "RIGHT", []))
    return wrong, right


def counts(wrong: list[Wrong], right: list[Right]) -> dict[str, dict[str, int]]:
    """Per exercise: how many wrong answers, how many of their hints name the mistake, rights."""
    out: dict[str, dict[str, int]] = {}
    n_wrong = Counter(w.exercise for w in wrong)
    n_named = Counter(w.exercise for w in wrong if w.names_mistake)
    n_right = Counter(r.exercise for r in right)
    for ex in sorted(set(n_wrong) | set(n_right)):
        out[ex] = {"wrong": n_wrong[ex], "named": n_named[ex], "right": n_right[ex]}
    return out
