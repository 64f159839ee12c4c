"""Check cells of workbook 08 (ex08_triton_kernel): pass on the solution, fail with a named hint on each plausible wrong answer."""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():  # before any @triton.jit below: Triton's interpreter on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from adam8lib.course import checks  # noqa: E402
from adam8lib.kernels.reference import adam8bit_step  # noqa: E402
from adam8lib.quant import dequantize_blocks, nearest_code, num_blocks  # noqa: E402

from tests._check_helpers import SOLUTIONS, fails_with, solution, stub  # noqa: E402,F401



# ------------------------------------------------------------------ 08 · Triton kernels
@triton.jit
def absmax_no_mask(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(absmax_ptr + tl.program_id(0), tl.max(tl.abs(x), axis=0))


@triton.jit
def absmax_signed(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(absmax_ptr + tl.program_id(0), tl.max(x, axis=0))


def absmax_plain_python(x_ptr, absmax_ptr, n, BLOCK):
    pass


@triton.jit
def absmax_stub(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
    raise NotImplementedError("Exercise 08.1: absmax_kernel")


@pytest.mark.parametrize("kernel, hint", [
    (absmax_no_mask, "mask the load"),
    (absmax_signed, "the largest MAGNITUDE"),
    (absmax_plain_python, "decorate the kernel function with @triton.jit"),
    (absmax_stub, "not implemented yet"),
])
def test_absmax_kernel_fails(kernel, hint):
    fails_with(checks.check_absmax_kernel, kernel, hint)


@triton.jit
def dequantize_no_mask(codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    codes = tl.load(codes_ptr + offs).to(tl.int32)
    tl.store(out_ptr + offs, tl.load(qmap_ptr + codes) * tl.load(absmax_ptr + tl.program_id(0)))


@triton.jit
def dequantize_no_lookup(codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    codes = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.float32)
    tl.store(out_ptr + offs, codes * tl.load(absmax_ptr + tl.program_id(0)), mask=mask)


@triton.jit
def dequantize_first_absmax(codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    codes = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
    tl.store(out_ptr + offs, tl.load(qmap_ptr + codes, mask=mask, other=0.0) * tl.load(absmax_ptr), mask=mask)


@triton.jit
def stub_kernel(codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    raise NotImplementedError("Exercise 08.2: dequantize_kernel")


@pytest.mark.parametrize("kernel, hint", [
    (dequantize_no_mask, "wrote past the end of the output"),
    (dequantize_no_lookup, "look them up in the map first"),
    (dequantize_first_absmax, "program pid uses absmax[pid]"),
    (stub_kernel, "not implemented yet"),
])
def test_dequantize_kernel_fails(kernel, hint):
    fails_with(checks.check_dequantize_kernel, kernel, hint)


def test_ex08_checks_pass_on_the_solution(capsys):
    checks.check_absmax_kernel(solution("08", "absmax_kernel"))
    checks.check_dequantize_kernel(solution("08", "dequantize_kernel"))
    assert capsys.readouterr().out.count("all checks passed") == 2


# ------------------------------------------------------------------ 08.3 · nearest code by binary search
@triton.jit
def _last_le(x, qmap_ptr, BLOCK: tl.constexpr):
    lo = tl.zeros([BLOCK], dtype=tl.int32)
    for s in tl.static_range(8):
        probe = lo + (128 >> s)
        lo = tl.where(tl.load(qmap_ptr + probe) <= x, probe, lo)
    return lo


@triton.jit
def quantize_ties_up(x_ptr, absmax_ptr, qmap_ptr, codes_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    scale = tl.load(absmax_ptr + pid)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0) / tl.where(scale > 0, scale, 1.0)
    lo = _last_le(x, qmap_ptr, BLOCK)
    hi = tl.minimum(lo + 1, 255)
    codes = tl.where(tl.load(qmap_ptr + hi) - x <= x - tl.load(qmap_ptr + lo), hi, lo)  # <=: ties go up
    tl.store(codes_ptr + offs, codes.to(tl.uint8), mask=offs < n)


@triton.jit
def quantize_no_zero_guard(x_ptr, absmax_ptr, qmap_ptr, codes_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0) / tl.load(absmax_ptr + pid)  # 0/0 in a zero block
    lo = _last_le(x, qmap_ptr, BLOCK)
    hi = tl.minimum(lo + 1, 255)
    codes = tl.where(tl.load(qmap_ptr + hi) - x < x - tl.load(qmap_ptr + lo), hi, lo)
    tl.store(codes_ptr + offs, codes.to(tl.uint8), mask=offs < n)


@triton.jit
def quantize_floor_only(x_ptr, absmax_ptr, qmap_ptr, codes_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    scale = tl.load(absmax_ptr + pid)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0) / tl.where(scale > 0, scale, 1.0)
    tl.store(codes_ptr + offs, _last_le(x, qmap_ptr, BLOCK).to(tl.uint8), mask=offs < n)


@triton.jit
def quantize_unmasked_store(x_ptr, absmax_ptr, qmap_ptr, codes_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    scale = tl.load(absmax_ptr + pid)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0) / tl.where(scale > 0, scale, 1.0)
    lo = _last_le(x, qmap_ptr, BLOCK)
    hi = tl.minimum(lo + 1, 255)
    codes = tl.where(tl.load(qmap_ptr + hi) - x < x - tl.load(qmap_ptr + lo), hi, lo)
    tl.store(codes_ptr + offs, codes.to(tl.uint8))


def test_quantize_kernel_check_passes_the_solution():
    checks.check_quantize_kernel(solution("08", "quantize_kernel"))


@pytest.mark.parametrize("fn, hint", [
    (quantize_ties_up, "take the LOWER index"),
    (quantize_no_zero_guard, "an all-zero block has absmax 0"),
    (quantize_floor_only, "compare both"),
    (quantize_unmasked_store, "mask the store"),
    (lambda *a, **k: None, "is not a Triton kernel"),
])
def test_quantize_kernel_check_names_the_mistake(fn, hint):
    fails_with(checks.check_quantize_kernel, fn, hint)


# ------------------------------------------------------------------ 08.4 · fused EMA + requantize
@triton.jit
def _ema_kernel(codes_ptr, absmax_ptr, g_ptr, qmap_ptr, n, beta, BLOCK: tl.constexpr,
                ZERO_MASKED: tl.constexpr, ABS: tl.constexpr, OLD_ABSMAX: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    old = tl.load(absmax_ptr + pid)
    m = tl.load(qmap_ptr + tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)) * old
    m = beta * m + (1 - beta) * tl.load(g_ptr + offs, mask=mask, other=0.0)
    if ZERO_MASKED:
        m = tl.where(mask, m, 0.0)
    if ABS:
        scale = tl.max(tl.abs(m), axis=0)
    else:
        scale = tl.max(m, axis=0)
    if OLD_ABSMAX:
        scale = old
    x = m / tl.where(scale > 0, scale, 1.0)
    lo = _last_le(x, qmap_ptr, BLOCK)
    hi = tl.minimum(lo + 1, 255)
    codes = tl.where(tl.load(qmap_ptr + hi) - x < x - tl.load(qmap_ptr + lo), hi, lo)
    tl.store(codes_ptr + offs, codes.to(tl.uint8), mask=mask)
    tl.store(absmax_ptr + pid, scale)


class _Flags:
    """A kernel with some constexpr flags bound, launched like the learner's kernel[grid](...)."""

    def __init__(self, **flags):
        self.flags = flags

    def __getitem__(self, grid):
        return lambda *args, **kwargs: _ema_kernel[grid](*args, **kwargs, **self.flags)

    def __call__(self, *args, **kwargs):  # like a jitted function: callable, but launched with [grid]
        raise RuntimeError("launch it as kernel[grid](...)")


if not torch.cuda.is_available():
    _Flags.__name__ = "InterpretedFunction"  # the check's test for "built in interpreter mode"


def _flags(**overrides):
    return _Flags(**{"ZERO_MASKED": True, "ABS": True, "OLD_ABSMAX": False, **overrides})


def test_ema_requantize_kernel_check_passes_the_solution_and_the_flagged_twin():
    checks.check_ema_requantize_kernel(solution("08", "ema_requantize_kernel"))
    checks.check_ema_requantize_kernel(_flags())


@pytest.mark.parametrize("overrides, hint", [
    (dict(ZERO_MASKED=False), "masked lanes must not count in the new absmax"),
    (dict(ABS=False), "largest MAGNITUDE"),
    (dict(OLD_ABSMAX=True), "AFTER the update"),
])
def test_ema_requantize_kernel_check_names_the_mistake(overrides, hint):
    fails_with(checks.check_ema_requantize_kernel, _flags(**overrides), hint)


def test_ema_requantize_kernel_check_catches_a_stub():
    fails_with(checks.check_ema_requantize_kernel, stub, "is not a Triton kernel")
