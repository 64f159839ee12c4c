"""Check cells of workbook 04 (ex04_linear_quantization): pass on the solution, fail with a named hint on each plausible wrong answer."""

from __future__ import annotations


import pytest
import torch

from adam8lib import quant
from adam8lib.course import checks

from tests._check_helpers import SOLUTIONS, fails_with, solution, stub  # noqa: E402,F401



# ------------------------------------------------------------------ 04 · absmax int8
def make_quantize(*, scale=127.0, rounding=torch.round, signed_max=False, dtype=torch.int8):
    def absmax_quantize(x):
        x = x.float()
        a = x.max() if signed_max else x.abs().max()
        if a == 0:
            return torch.zeros_like(x, dtype=dtype), a
        return rounding(x * (scale / a)).to(dtype), a

    return absmax_quantize


@pytest.mark.parametrize("fn, hint", [
    (make_quantize(scale=128.0), "scale by 127, not 128"),
    (make_quantize(rounding=lambda t: t), "round to the nearest integer (torch.round) before casting"),
    (make_quantize(signed_max=True), "a NEGATIVE value can be the largest in magnitude"),
    (make_quantize(dtype=torch.int16), "convert the rounded values with .to(torch.int8)"),
    (stub, "not implemented yet"),
])
def test_absmax_quantize_fails(fn, hint):
    fails_with(checks.check_absmax_quantize, fn, hint)


@pytest.mark.parametrize("fn, hint", [
    (lambda q, a: q.float() * a / 128, "divide by 127"),
    (lambda q, a: q.float() / 127, "multiply by the absmax"),
    (lambda q, a: q.double() * a / 127, "expected torch.float32"),
    (stub, "not implemented yet"),
])
def test_absmax_dequantize_fails(fn, hint):
    fails_with(checks.check_absmax_dequantize, fn, hint)


def test_ex04_checks_pass_on_the_solution_and_the_library(capsys):
    checks.check_absmax_quantize(solution("04", "absmax_quantize"))
    checks.check_absmax_dequantize(solution("04", "absmax_dequantize"))
    checks.check_absmax_quantize(quant.absmax_quantize)
    checks.check_absmax_dequantize(quant.absmax_dequantize)
    assert capsys.readouterr().out.count("all checks passed") == 4
