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
    (dequantize_no_lookup, "look the codes up in the map"),
    (dequantize_first_absmax, "program pid uses absmax[pid]"),
    (stub_kernel, "not implemented yet"),
])
def test_dequantize_kernel_fails(kernel, hint):
    fails_with(checks.check_dequantize_kernel, kernel, hint)


def test_ex08_checks_pass_on_the_solution(capsys):
    checks.check_absmax_kernel(solution("08", "absmax_kernel"))
    checks.check_dequantize_kernel(solution("08", "dequantize_kernel"))
    assert capsys.readouterr().out.count("all checks passed") == 2
