"""Diagnosing a wrong answer: which *plausible mistake* does the learner's result match?

A check knows the reference answer and can compute the answers of the usual wrong
implementations ("no bias correction", "g not squared", …). :func:`expect_close` compares
the learner's result with the reference; when it differs, it looks for the first wrong
variant that the result *does* match and uses that variant's hint in the AssertionError
(raised by :func:`adam8lib.course.checks._common.assert_close`, so the message has the usual
details: worst element, index, tolerance).

Variants are given lazily, as ``(hint, zero-argument callable)`` pairs, so they are only
computed when the answer is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ._common import assert_close, assert_equal
from ._properties import describe

Variants = Sequence[tuple[str, Callable[[], Any]]]

__all__ = ["matches", "diagnose", "expect_close", "expect_equal"]


def matches(actual: Any, expected: Any, *, rtol: float = 1e-5, atol: float = 1e-6) -> bool:
    """True when ``actual`` ≈ ``expected`` (same rules as assert_close; never raises)."""
    if isinstance(expected, Mapping):
        return isinstance(actual, Mapping) and set(actual) == set(expected) and all(
            matches(actual[k], expected[k], rtol=rtol, atol=atol) for k in expected)
    if isinstance(expected, (tuple, list)):
        return isinstance(actual, (tuple, list)) and len(actual) == len(expected) and all(
            matches(a, e, rtol=rtol, atol=atol) for a, e in zip(actual, expected))
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
            return False
        a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
        return bool(torch.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True))
    if isinstance(actual, torch.Tensor) and actual.numel() == 1:
        actual = actual.item()
    try:
        a, e = float(actual), float(expected)
    except (TypeError, ValueError):
        return actual == expected
    return (math.isnan(a) and math.isnan(e)) or a == e or abs(a - e) <= atol + rtol * abs(e)


def diagnose(actual: Any, variants: Variants, default: str, *, rtol: float = 1e-5, atol: float = 1e-6,
             expected: Any = None, x: Any = None, blocksize: int | None = None, context: str | None = None) -> str:
    """The hint of the first variant that ``actual`` matches; else, when ``expected`` is given, the
    property in which it differs (:func:`~adam8lib.course.checks._properties.describe`) followed by
    ``default``; else ``default``. ``context``: a sentence about the inputs (e.g. on which kind of input the
    answer is wrong, :func:`~adam8lib.course.checks._properties.case_pattern`) added when no variant matched."""
    for hint, make in variants:
        try:
            candidate = make()
        except Exception:  # a variant that cannot be built for this input just does not match
            continue
        if candidate is not None and matches(actual, candidate, rtol=rtol, atol=atol):
            return hint
    found = None
    if expected is not None:
        try:
            found = describe(actual, expected, x=x, blocksize=blocksize, rtol=rtol, atol=atol)
        except Exception:  # noqa: BLE001 - describing is best effort; the comparison itself still fails
            found = None
    parts = [part for part in (found, context) if part]
    return f"{'; '.join(parts)}. The rule: {default}" if parts else default


def expect_close(actual: Any, expected: Any, *, what: str, default: str, variants: Variants = (),
                 rtol: float = 1e-5, atol: float = 1e-6, dtype: Any = None, x: Any = None,
                 blocksize: int | None = None, describe_diff: bool = True, context: str | None = None) -> None:
    """assert_close with a hint chosen by :func:`diagnose` when the answer is wrong (``x``, ``blocksize``:
    the input and the block size, to say where a wrong result differs)."""
    if matches(actual, expected, rtol=rtol, atol=atol):
        if dtype is not None and isinstance(actual, torch.Tensor) and actual.dtype != dtype:
            assert_close(actual, expected, what=what, dtype=dtype, rtol=rtol, atol=atol,
                         hint=f"return a {dtype} tensor (convert with .to({dtype}))")
        return
    hint = diagnose(actual, variants, default, rtol=rtol, atol=atol, expected=expected if describe_diff else None,
                    x=x, blocksize=blocksize, context=context)
    assert_close(actual, expected, what=what, hint=hint, rtol=rtol, atol=atol, dtype=dtype)
    # assert_close compares a little differently (e.g. dict keys); never let a mismatch pass
    assert_equal(actual, expected, what=what, hint=hint)
