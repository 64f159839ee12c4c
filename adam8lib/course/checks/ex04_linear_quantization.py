"""Checks for workbook 04 · linear (absmax) int8 quantization."""

from __future__ import annotations

import torch

from ...quant import absmax_dequantize, absmax_quantize
from ._common import assert_close, call, fail, passed, require_callable
from ._variants import expect_close

__all__ = ["check_absmax_quantize", "check_absmax_dequantize"]


def _cases():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(1000, generator=gen)
    outlier = x.clone()
    outlier[3] = 50.0
    neg = torch.rand(300, generator=gen)
    neg[10] = -4.0  # the largest magnitude is negative
    return [
        ("randn(1000)", x),
        ("randn(1000) with one outlier of 50", outlier),
        ("a tensor whose largest magnitude is negative", neg),
        ("a (4, 33) matrix", torch.randn(4, 33, generator=gen)),
        ("all zeros", torch.zeros(10)),
        ("one element", torch.tensor([-0.25])),
        ("bfloat16 input", torch.randn(64, generator=gen).to(torch.bfloat16)),
        ("float64 input", torch.randn(50, generator=gen, dtype=torch.float64)),
        ("exact multiples of absmax / 127", torch.arange(-127, 128, dtype=torch.float32) / 127 * 3.0),
    ]


def _codes_match(got, want) -> bool:
    """Same codes, up to rare off-by-one rounding ties (x * (127 / a) vs 127 * x / a)."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return False
    if want.numel() == 0:
        return True
    diff = (got.to(torch.int64) - want.to(torch.int64)).abs()
    return bool(diff.max() <= 1) and int((diff > 0).sum()) <= max(1, want.numel() // 100)


def _quant_variant(x, *, scale=127.0, rounding="round", signed_max=False):
    x = x.float()
    a = x.max() if signed_max else x.abs().max()
    y = x * (scale / a) if a != 0 else torch.zeros_like(x)
    y = {"round": torch.round, "floor": torch.floor, "trunc": lambda t: t}[rounding](y)
    return y.to(torch.int8)  # note: 128 wraps around to -128, as a careless cast does


# ---------------------------------------------------------------------------- 04.1
def check_absmax_quantize(absmax_quantize_fn) -> None:
    """``absmax_quantize(x) -> (q int8, absmax)``: q = round(127 * x / max|x|)."""
    require_callable(absmax_quantize_fn, "absmax_quantize")
    for label, x in _cases():
        want_q, want_a = absmax_quantize(x)
        got = call(absmax_quantize_fn, x.clone())
        what = f"absmax_quantize({label})"
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(f"{what} returned {type(got).__name__}, expected a pair (q, absmax).", hint="return q, absmax")
        q, a = got
        if not isinstance(q, torch.Tensor) or q.dtype != torch.int8:
            fail(f"{what}: q has dtype {getattr(q, 'dtype', type(q).__name__)}, expected torch.int8.",
                 hint="convert the rounded values with .to(torch.int8) (one byte per value).")
        if not _codes_match(q, want_q):
            variants = [
                ("absmax is max(|x|): a NEGATIVE value can be the largest in magnitude.",
                 lambda: _quant_variant(x, signed_max=True)),
                ("scale by 127, not 128: int8 stops at 127 and 128 overflows to -128.",
                 lambda: _quant_variant(x, scale=128.0)),
                ("round to the nearest integer (torch.round) before casting: .to(torch.int8) truncates.",
                 lambda: _quant_variant(x, rounding="trunc")),
                ("round to the nearest integer (torch.round), not down (floor).",
                 lambda: _quant_variant(x, rounding="floor")),
            ]
            hint = "q = round(x * 127 / absmax) with absmax = max(|x|) over the WHOLE tensor."
            for h, make in variants:
                try:
                    if _codes_match(q, make()) and not _codes_match(make(), want_q):
                        hint = h
                        break
                except Exception:  # noqa: BLE001
                    continue
            assert_close(q, want_q, what=f"{what}: q", hint=hint, rtol=0, atol=1)
            fail(f"{what}: q differs from the reference in more than 1% of the codes.", hint)
        if not isinstance(a, torch.Tensor):
            a = torch.tensor(float(a))
        expect_close(a.float().reshape(()) if a.numel() == 1 else a, want_a, what=f"{what}: absmax",
                     default="absmax = x.abs().max(): ONE number for the whole tensor.",
                     variants=[("absmax is max(|x|), not max(x).", lambda: x.float().max())])
    passed("Exercise 04.1 · Absmax int8 quantization")


# ---------------------------------------------------------------------------- 04.2
def check_absmax_dequantize(absmax_dequantize_fn) -> None:
    """``absmax_dequantize(q, absmax) -> fp32``: q * absmax / 127."""
    require_callable(absmax_dequantize_fn, "absmax_dequantize")
    for label, x in _cases():
        q, a = absmax_quantize(x)
        want = absmax_dequantize(q, a)
        got = call(absmax_dequantize_fn, q.clone(), a.clone())
        what = f"absmax_dequantize(absmax_quantize({label}))"
        qf = q.float()
        expect_close(got, want, what=what, dtype=torch.float32, rtol=1e-6, atol=1e-7,
                     default="x ≈ q * absmax / 127, returned as float32.",
                     variants=[
                         ("divide by 127, the same number you scaled by (not 128).", lambda: qf * a / 128),
                         ("multiply by the absmax: q / 127 is only the normalized value.", lambda: qf / 127),
                         ("x = q * absmax / 127 (you multiplied by 127).", lambda: qf * a * 127),
                         ("x = q * absmax / 127 (you divided by absmax).", lambda: qf / a / 127),
                     ])
    # the round trip: error at most half a step (absmax / 254) per element
    x = torch.randn(513, generator=torch.Generator().manual_seed(1))
    q, a = absmax_quantize(x)
    back = call(absmax_dequantize_fn, q, a)
    err = float((back - x).abs().max())
    if err > float(a) / 254 * (1 + 1e-5):
        fail(f"round trip error {err:.4g} exceeds half a quantization step ({float(a) / 254:.4g}).",
             hint="x ≈ q * absmax / 127")
    passed("Exercise 04.2 · Absmax dequantization")
