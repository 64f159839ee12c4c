"""Checks for workbook 04 · linear (absmax) int8 quantization."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from ...quant import absmax_dequantize, absmax_quantize
from ._common import assert_close, call, fail, passed, require_callable, require_tensor
from ._shapes import call_any_shape
from ._properties import describe
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
        ("a transposed (33, 4) matrix (not contiguous)", torch.randn(4, 33, generator=gen).t()),
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


def _quant_variant(x, *, scale=127.0, rounding="round", signed_max=False, magnitude=False, per_row=False):
    x = x.float()
    if per_row and x.dim() > 1:
        a = x.abs().amax(dim=-1, keepdim=True)
    else:
        a = x.max() if signed_max else x.abs().max()
    y = (x.abs() if magnitude else x) * (scale / a) if bool((a != 0).all()) else torch.zeros_like(x)
    y = {"round": torch.round, "floor": torch.floor, "trunc": lambda t: t}[rounding](y)
    return y.to(torch.int8)  # note: 128 wraps around to -128, as a careless cast does


class _NaNCastWatch(TorchFunctionMode):
    """Notices a torch operation that turns a tensor holding NaN into an integer tensor (NaN cast to int8)."""

    def __init__(self):
        super().__init__()
        self.seen = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.seen and isinstance(out, torch.Tensor) and out.dtype in _INT_DTYPES:
            self.seen = any(isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() > 0
                            and bool(torch.isnan(a).any()) for a in args)
        return out


_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def _q_dtype_hint(q) -> str:
    if not isinstance(q, torch.Tensor):
        return f"you returned q as a {type(q).__name__}: return a torch.int8 tensor."
    if q.dtype == torch.uint8:
        return ("uint8 has no negative values (it wraps -1 to 255): q is signed, convert with .to(torch.int8).")
    if q.is_floating_point():
        return ("you returned the rounded floats: cast them with .to(torch.int8) (one byte per value).")
    return (f"you returned {q.dtype} codes: they take one byte each, convert the rounded values with "
            ".to(torch.int8) (one byte per value).")


# ---------------------------------------------------------------------------- 04.1
def check_absmax_quantize(absmax_quantize_fn) -> None:
    """``absmax_quantize(x) -> (q int8, absmax)``: q = round(127 * x / max|x|)."""
    require_callable(absmax_quantize_fn, "absmax_quantize")
    for label, x in _cases():
        want_q, want_a = absmax_quantize(x)
        watch = _NaNCastWatch()
        with watch:
            got = call_any_shape(absmax_quantize_fn, x.shape, x.clone())
        what = f"absmax_quantize({label})"
        if got is None:
            fail(f"{what} returned None.", hint="you returned None: end the function with `return q, absmax`.")
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(f"{what} returned {type(got).__name__}, expected a pair (q, absmax).", hint="return q, absmax")
        q, a = got
        if isinstance(a, torch.Tensor) and isinstance(q, torch.Tensor) and a.shape == x.shape and q.numel() == 1 \
                and x.numel() > 1:
            fail(f"{what} returned a scalar first and a tensor of x's shape second.",
                 hint="you returned (absmax, q): return q first, then absmax.")
        if not isinstance(q, torch.Tensor) or q.dtype != torch.int8:
            fail(f"{what}: q has dtype {getattr(q, 'dtype', type(q).__name__)}, expected torch.int8.",
                 hint=_q_dtype_hint(q))
        if isinstance(a, torch.Tensor) and a.numel() > 1:
            fail(f"{what}: absmax has shape {tuple(a.shape)}, expected one number.",
                 hint="you took one absmax per row (or per element): absmax is ONE number for the whole tensor, "
                      "x.abs().max().")
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != torch.float32:
            whose = " (the input's dtype)" if a.dtype == x.dtype else ""
            fail(f"{what}: absmax has dtype {a.dtype}, expected torch.float32.",
                 hint=f"your absmax is {a.dtype}{whose}: work in float32 (x = x.float() first) and return a 0-d "
                      "fp32 tensor.")
        if watch.seen:
            fail(f"{what}: a tensor holding NaN was cast to an integer type.",
                 hint="your all-zero x went through 0 / 0 = NaN: absmax is 0, and casting NaN to int8 is undefined "
                      "(it happens to give 0 here). Guard it: if absmax == 0, return zeros.")
        if not _codes_match(q, want_q):
            variants = [
                ("you took max(x), not max(|x|): a NEGATIVE value can be the largest in magnitude.",
                 lambda: _quant_variant(x, signed_max=True)),
                ("you scaled by 128: scale by 127, not 128 (int8 stops at 127, and 128 overflows to -128).",
                 lambda: _quant_variant(x, scale=128.0)),
                ("you cast to int8 without rounding: .to(torch.int8) truncates toward zero; round to the nearest "
                 "integer (torch.round) before casting.", lambda: _quant_variant(x, rounding="trunc")),
                ("you rounded down (floor): round to the nearest integer (torch.round).",
                 lambda: _quant_variant(x, rounding="floor")),
                ("you quantized |x|: keep the sign, q = round(127 * x / absmax) is negative where x is.",
                 lambda: _quant_variant(x, magnitude=True)),
                ("you took one absmax per row: absmax is ONE number for the whole tensor, x.abs().max().",
                 lambda: _quant_variant(x, per_row=True)),
            ]
            hint = "q = round(x * 127 / absmax) with absmax = max(|x|) over the WHOLE tensor."
            for h, make in variants:
                try:
                    if _codes_match(q, make()) and not _codes_match(make(), want_q):
                        hint = h
                        break
                except Exception:  # noqa: BLE001
                    continue
            if isinstance(q, torch.Tensor) and q.shape != want_q.shape:
                hint = f"q: {describe(q, want_q, x=x) or 'give q the shape of x'}. The rule: {hint}"
            elif hint.startswith("q = round(x * 127 / absmax)") and isinstance(q, torch.Tensor):
                found = describe(q.long(), want_q.long(), x=x.float(), rtol=0, atol=0)
                hint = f"q: {found}. The rule: {hint}" if found else hint
            assert_close(q, want_q, what=f"{what}: q", hint=hint, rtol=0, atol=1)
            fail(f"{what}: q differs from the reference in more than 1% of the codes.", hint)
        require_tensor(a, f"{what}: absmax")
        if a.dim() != 0:
            require_tensor(a, f"{what}: absmax", ndim=0)
        if not bool((x != 0).any()):
            if not bool((a == 0).all()) or not bool((q == 0).all()):
                fail(f"{what}: absmax = {float(a.reshape(-1)[0]):.3g}, q has {int((q != 0).sum())} non-zero codes; "
                     "expected absmax = 0 and q = 0 for an all-zero x.",
                     hint="for an all-zero x the statement asks for absmax = 0 exactly (and q = 0): you replaced it "
                          "(a clamp, a tiny epsilon or a max with a small number), which a caller then stores as the "
                          "scale. Keep the true absmax and guard only the division.")
        expect_close(a.float().reshape(()) if a.numel() == 1 else a, want_a, what=f"{what}: absmax",
                     default="absmax = x.abs().max(): ONE number for the whole tensor.",
                     variants=[("you took max(x), not max(|x|): a NEGATIVE value can be the largest in magnitude.",
                                lambda: x.float().max())])
    passed("Exercise 04.1 · Absmax int8 quantization")


# ---------------------------------------------------------------------------- 04.2
def check_absmax_dequantize(absmax_dequantize_fn) -> None:
    """``absmax_dequantize(q, absmax) -> fp32``: q * absmax / 127."""
    require_callable(absmax_dequantize_fn, "absmax_dequantize")
    for label, x in _cases():
        q, a = absmax_quantize(x)
        want = absmax_dequantize(q, a)
        got = call_any_shape(absmax_dequantize_fn, q.shape, q.clone(), a.clone())
        what = f"absmax_dequantize(absmax_quantize({label}))"
        qf = q.float()
        if isinstance(got, torch.Tensor) and got.dtype != torch.float32:
            fail(f"{what} has dtype {got.dtype}, expected torch.float32.",
                 hint=f"your result is {got.dtype}: return float32, e.g. q.float() * absmax / 127.")
        expect_close(got, want, what=what, dtype=torch.float32, rtol=1e-6, atol=1e-7, x=q,
                     default="x ≈ q * absmax / 127, returned as float32.",
                     variants=[
                         ("you divided by 128: divide by 127, the same number you scaled by.", lambda: qf * a / 128),
                         ("you did not multiply by absmax: q / 127 is only the normalized value; multiply by the "
                          "absmax.", lambda: qf / 127),
                         ("you multiplied by 127: x = q * absmax / 127.", lambda: qf * a * 127),
                         ("you divided by absmax: x = q * absmax / 127.", lambda: qf / a / 127),
                         ("you used // (floor division): use / (true division), x = q * absmax / 127.",
                          lambda: qf * a // 127),
                         ("you used // (floor division): use / (true division), x = q * absmax / 127.",
                          lambda: qf * (a // 127)),
                         ("you rounded the result: dequantization returns q * absmax / 127 as it is, unrounded.",
                          lambda: torch.round(qf * a / 127)),
                         ("you read q as unsigned (uint8): negative codes became 129..255; q is int8, q.float() "
                          "keeps the sign.", lambda: q.view(torch.uint8).float() * a / 127),
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
