"""Workbook 04 · linear (absmax) quantization: what learners write instead of the solution."""

from __future__ import annotations

import numpy as np
import torch

from adam8lib.course import checks

from . import Right, Wrong


# ---------------------------------------------------------------------------- 04.1
def quantize(*, scale=127.0, rounding="round", signed_max=False, guard=True, dtype=torch.int8, cast=True,
             per_row=False, magnitude=False, to_float=True, swap=False, mean=False):
    def absmax_quantize(x):
        if to_float:
            x = x.float()
        if per_row and x.dim() > 1:
            absmax = x.abs().amax(dim=-1, keepdim=True)
        else:
            absmax = x.max() if signed_max else x.abs().mean() if mean else x.abs().max()
        if guard and bool((absmax == 0).all()):
            q, a = torch.zeros_like(x, dtype=dtype if cast else x.dtype), absmax
        else:
            y = (x.abs() if magnitude else x) * scale / absmax
            y = {"round": torch.round, "floor": torch.floor, "trunc": lambda t: t}[rounding](y)
            q, a = (y.to(dtype) if cast else y), absmax
        return (a, q) if swap else (q, a)

    return absmax_quantize


def _clamped_absmax(x):
    x = x.float()
    absmax = x.abs().max().clamp(min=1e-8)
    return torch.round(127 * x / absmax).to(torch.int8), absmax


def _absmax_as_float(x):
    x = x.float()
    absmax = x.abs().max().item()
    if absmax == 0:
        return torch.zeros_like(x, dtype=torch.int8), absmax
    return torch.round(127 * x / absmax).to(torch.int8), absmax


def _absmax_keepdim(x):
    x = x.float()
    absmax = x.abs().amax(dim=tuple(range(x.dim())), keepdim=True)
    q = torch.where(absmax > 0, torch.round(127 * x / absmax.clamp(min=1e-30)), torch.zeros_like(x))
    return q.to(torch.int8), absmax


def quantize_by_loop(x):
    x = x.float()
    absmax = x.abs().max()
    if absmax == 0:
        return torch.zeros_like(x, dtype=torch.int8), absmax
    return torch.tensor([round(float(value) * 127 / float(absmax)) for value in x], dtype=torch.int8), absmax


def dequantize_by_loop(q, absmax):
    return torch.tensor([int(code) * float(absmax) / 127 for code in q], dtype=torch.float32)


def quantize_with_where(x):
    x = x.to(torch.float32)
    absmax = x.abs().amax()
    safe = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    return torch.round(x / safe * 127).to(torch.int8), absmax


def quantize_through_numpy(x):
    a = x.float().numpy()
    absmax = np.abs(a).max() if a.size else np.float32(0)
    q = np.zeros(a.shape, np.int8) if absmax == 0 else np.rint(a * (np.float32(127) / absmax)).astype(np.int8)
    return torch.from_numpy(q), torch.tensor(absmax, dtype=torch.float32)


# ---------------------------------------------------------------------------- 04.2
def dequantize(rule):
    def absmax_dequantize(q, absmax):
        return {
            "128": lambda: q.float() * absmax / 128,
            "no_absmax": lambda: q.float() / 127,
            "times_127": lambda: q.float() * absmax * 127,
            "over_absmax": lambda: q.float() / absmax / 127,
            "double": lambda: q.double() * absmax.double() / 127,
            "floor_div": lambda: q.float() * absmax // 127,
            "rounded": lambda: torch.round(q.float() * absmax / 127),
            "unsigned": lambda: q.view(torch.uint8).float() * absmax / 127,
            "half": lambda: (q.half() * absmax.half() / 127),
            "none": lambda: None,
        }[rule]()

    return absmax_dequantize


def dequantize_normalised_first(q, absmax):
    return (q / 127.0).float().mul(absmax)


def dequantize_with_numpy(q, absmax):
    return torch.from_numpy(q.numpy().astype(np.float32) * np.float32(absmax.item()) / np.float32(127))


_Q, _D = checks.check_absmax_quantize, checks.check_absmax_dequantize

WRONG = [
    # 04.1
    Wrong("04.1", _Q, quantize(signed_max=True), "absmax = x.max() (sign ignored)",
          "you took max(x), not max(|x|)", True),
    Wrong("04.1", _Q, quantize(scale=128.0), "scaled by 128", "you scaled by 128", True),
    Wrong("04.1", _Q, quantize(rounding="trunc"), "no rounding before the cast",
          "you cast to int8 without rounding", True),
    Wrong("04.1", _Q, quantize(rounding="floor"), "floor instead of round", "you rounded down (floor)", True),
    Wrong("04.1", _Q, quantize(guard=False), "no zero guard (0 / 0 = NaN cast to int8)",
          "your all-zero x went through 0 / 0 = NaN", True),
    Wrong("04.1", _Q, quantize(dtype=torch.uint8), "uint8 codes", "uint8 has no negative values", True),
    Wrong("04.1", _Q, quantize(cast=False), "rounded floats returned", "you returned the rounded floats", True),
    Wrong("04.1", _Q, quantize(per_row=True), "absmax per row", "you took one absmax per row", True),
    Wrong("04.1", _Q, quantize(magnitude=True), "quantized |x| (sign lost)", "you quantized |x|", True),
    Wrong("04.1", _Q, quantize(to_float=False), "absmax left in the input's dtype",
          "your absmax is torch.bfloat16 (the input's dtype)", True),
    Wrong("04.1", _Q, quantize(swap=True), "returns (absmax, q)", "you returned (absmax, q)", True),
    Wrong("04.1", _Q, quantize_by_loop, "a Python loop over the elements (1-D only)",
          "your function failed on a tensor of shape (4, 33)", True),
    Wrong("04.1", _Q, _clamped_absmax, "absmax clamped to 1e-8 (an all-zero x returns 1e-8, not 0)",
          "you replaced it (a clamp, a tiny epsilon", True),
    Wrong("04.1", _Q, _absmax_as_float, "absmax returned as a Python float (.item())",
          "you turned the tensor into a plain number", True),
    Wrong("04.1", _Q, _absmax_keepdim, "absmax of shape (1, 1) (amax with keepdim) for a matrix",
          "not one with a length-1 dimension", True),
    # not recognised: the check can only restate the rule
    Wrong("04.1", _Q, quantize(mean=True), "scale from the mean magnitude (codes overflow int8)",
          "absmax = max(|x|) over the WHOLE tensor", False),
    # 04.2
    Wrong("04.2", _D, dequantize("128"), "divided by 128", "you divided by 128", True),
    Wrong("04.2", _D, dequantize("no_absmax"), "absmax not multiplied", "you did not multiply by absmax", True),
    Wrong("04.2", _D, dequantize("times_127"), "multiplied by 127", "you multiplied by 127", True),
    Wrong("04.2", _D, dequantize("over_absmax"), "divided by absmax", "you divided by absmax", True),
    Wrong("04.2", _D, dequantize("double"), "float64 result",
          "your result is torch.float64", True),
    Wrong("04.2", _D, dequantize("half"), "float16 result", "your result is torch.float16", True),
    Wrong("04.2", _D, dequantize("floor_div"), "// (floor division)", "you used // (floor division)", True),
    Wrong("04.2", _D, dequantize("rounded"), "result rounded", "you rounded the result", True),
    Wrong("04.2", _D, dequantize("unsigned"), "q read as uint8", "you read q as unsigned", True),
    Wrong("04.2", _D, dequantize_by_loop, "a Python loop over the codes (1-D only)",
          "your function failed on a tensor of shape (4, 33)", True),
    Wrong("04.2", _D, dequantize("none"), "no return statement", "did you forget to `return` the result?", True),
]

RIGHT = [
    Right("04.1", _Q, quantize_with_where, how="torch.where guard on the divisor, amax, x / a * 127"),
    Right("04.1", _Q, quantize_through_numpy, how="NumPy round trip with np.rint (half to even, as torch.round)"),
    Right("04.2", _D, dequantize_normalised_first, how="q / 127 first, then times absmax"),
    Right("04.2", _D, dequantize_with_numpy, how="NumPy float32 arithmetic"),
]


# ---------------------------------------------------------------- mistakes named by a PROPERTY of the result
def dequantize_plus_one(q, absmax):
    return (q.float() + 1) * absmax.float() / 127


def dequantize_magnitudes(q, absmax):
    return q.float().abs() * absmax.float() / 127


def dequantize_in_bf16(q, absmax):
    return (q.to(torch.bfloat16) * absmax / 127).float()


def quantize_flat(x):
    a = x.float().abs().max()
    if a == 0:
        return torch.zeros(x.numel(), dtype=torch.int8), a
    return torch.round(x.float().reshape(-1) * 127 / a).to(torch.int8), a


WRONG += [
    Wrong("04.2", checks.check_absmax_dequantize, dequantize_plus_one, "(q + 1) * absmax / 127",
          "shifted by a constant", True),
    Wrong("04.2", checks.check_absmax_dequantize, dequantize_magnitudes, "q.abs(): the sign lost",
          "the sign of the negative entries was lost", True),
    Wrong("04.2", checks.check_absmax_dequantize, dequantize_in_bf16, "the product computed in bfloat16",
          "the rounding of bfloat16", True),
    Wrong("04.1", checks.check_absmax_quantize, quantize_flat, "q returned flat (x.reshape(-1))",
          "your result is flat", True),
]
