"""Check cells of workbook 02 (ex02_ema): pass on the solution, fail with a named hint on each plausible wrong answer."""

from __future__ import annotations

import math

import pytest
import torch

from adam8lib.course import checks

from tests._check_helpers import SOLUTIONS, fails_with, solution, stub  # noqa: E402,F401



# ------------------------------------------------------------------ 02 · EMA
def moments_g_not_squared(m, v, g, b1, b2):
    return b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g


def moments_beta1_for_v(m, v, g, b1, b2):
    return b1 * m + (1 - b1) * g, b1 * v + (1 - b1) * g * g


def moments_swapped(m, v, g, b1, b2):
    return (1 - b1) * m + b1 * g, b2 * v + (1 - b2) * g * g


@pytest.mark.parametrize("fn, hint", [
    (moments_g_not_squared, "you averaged g, not g * g"),
    (moments_beta1_for_v, "you used beta1 for v"),
    (moments_swapped, "you gave beta to the new g"),
    (stub, "not implemented yet"),
])
def test_adam_moments_fails(fn, hint):
    fails_with(checks.check_adam_moments, fn, hint)


@pytest.mark.parametrize("fn, hint", [
    (lambda m, v, b1, b2, t: (m, v), "you returned m and v uncorrected"),
    (lambda m, v, b1, b2, t: (m / (1 - b1**t), v), "v needs its own correction"),
    (lambda m, v, b1, b2, t: (m / (1 - b1 ** (t + 1)), v / (1 - b2 ** (t + 1))), "you used step + 1"),
    (lambda m, v, b1, b2, t: (m / (1 - b1**t), v / (1 - b1**t)), "each moment uses its own beta"),
    (stub, "not implemented yet"),
])
def test_bias_correct_fails(fn, hint):
    fails_with(checks.check_bias_correct, fn, hint)


def test_ex02_checks_pass_on_the_solution(capsys):
    checks.check_adam_moments(solution("02", "adam_moments"))
    checks.check_bias_correct(solution("02", "bias_correct"))
    out = capsys.readouterr().out.splitlines()
    assert out == ["✔ Exercise 02.1 · Adam's two moving averages: all checks passed",
                   "✔ Exercise 02.2 · Bias correction: all checks passed"]
