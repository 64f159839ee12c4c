"""The checks of workbooks 07-09 pass on the solutions and fail, with the right hint, on wrong answers."""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():  # before any @triton.jit below: Triton's interpreter on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from adam8lib import checks  # noqa: E402
from adam8lib.kernels.reference import adam8bit_step  # noqa: E402
from adam8lib.quant import dequantize_blocks, nearest_code, num_blocks  # noqa: E402

from tests._check_helpers import SOLUTIONS, fails_with, solution, stub  # noqa: E402,F401


# ------------------------------------------------------------------ 07 · the 8-bit step
def _requantize(x, qmap, blocksize, keep_sign, absmax=None):
    n = x.numel()
    nb = num_blocks(n, blocksize)
    blocks = torch.nn.functional.pad(x, (0, nb * blocksize - n)).view(nb, blocksize)
    new_absmax = blocks.abs().amax(dim=1) if absmax is None else absmax
    scale = torch.where(new_absmax > 0, new_absmax, torch.ones_like(new_absmax))
    return nearest_code((blocks / scale[:, None]).reshape(-1)[:n], qmap, keep_sign=keep_sign), new_absmax


def make_8bit(*, keep_sign=True, keep_sign_v=True, bias=True, nan_rule=True, fresh_absmax=True, swap=False):
    @torch.no_grad()
    def step_fn(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, *, step, lr, beta1, beta2, eps,
                weight_decay, blocksize):
        map_m, map_v = (qmap2, qmap1) if swap else (qmap1, qmap2)
        m = dequantize_blocks(state1, absmax1, map_m, blocksize)
        v = dequantize_blocks(state2, absmax2, map_v, blocksize)
        grad = g.float()
        ok = torch.isfinite(grad) if nan_rule else torch.ones_like(grad, dtype=torch.bool)
        m = torch.where(ok, beta1 * m + (1 - beta1) * grad, 0.0)
        v = torch.where(ok, beta2 * v + (1 - beta2) * grad * grad, 0.0)
        c1, c2 = (1 - beta1**step, math.sqrt(1 - beta2**step)) if bias else (1.0, 1.0)
        old = p.float()
        new = old * (1 - lr * weight_decay) - lr / c1 * m / (v.sqrt() / c2 + eps)
        p.copy_(torch.where(ok, new, old))
        s1, a1 = _requantize(m, map_m, blocksize, keep_sign, None if fresh_absmax else absmax1.clone())
        s2, a2 = _requantize(v, map_v, blocksize, keep_sign_v, None if fresh_absmax else absmax2.clone())
        state1.copy_(s1), absmax1.copy_(a1), state2.copy_(s2), absmax2.copy_(a2)

    return step_fn


@pytest.mark.parametrize("fn, hint", [
    (make_8bit(keep_sign=False, keep_sign_v=False), "sign lost on requantize"),
    (make_8bit(keep_sign=False), "keep_sign=True for m"),
    (make_8bit(keep_sign_v=False), "a tiny positive v must not round to 0"),
    (make_8bit(bias=False), "no bias correction"),
    (make_8bit(nan_rule=False), "NaN handling"),
    (make_8bit(fresh_absmax=False), "FRESH absmax"),
    (make_8bit(swap=True), "the maps are swapped"),
    (stub, "not implemented yet"),
])
def test_adam8bit_step_fails(fn, hint):
    fails_with(checks.check_adam8bit_step, fn, hint)


def test_adam8bit_step_check_wants_in_place_updates():
    def not_in_place(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, **kw):
        adam8bit_step(p.clone(), g, state1.clone(), state2.clone(), absmax1.clone(), absmax2.clone(), qmap1, qmap2,
                      **kw)

    fails_with(checks.check_adam8bit_step, not_in_place, "IN PLACE")


def test_ex07_check_passes_on_the_solution_and_the_reference(capsys):
    checks.check_adam8bit_step(solution("07", "adam8bit_step"))
    checks.check_adam8bit_step(adam8bit_step)
    assert capsys.readouterr().out.count("✔ Exercise 07.1 · The 8-bit Adam step: all checks passed") == 2


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


# ------------------------------------------------------------------ 09 · memory maths
def make_megabytes(*, divisor=2**20, absmax=8, ceil=True):
    def state_megabytes(num_params, kind="adam8bit", blocksize=256):
        if kind == "adamw":
            return 8 * num_params / divisor
        blocks = -(-num_params // blocksize) if ceil else num_params // blocksize
        return (2 * num_params + absmax * blocks) / divisor

    return state_megabytes


@pytest.mark.parametrize("fn, hint", [
    (make_megabytes(divisor=1e6), "divide by 2**20, not 10**6"),
    (make_megabytes(absmax=0), "you forgot the absmax"),
    (make_megabytes(ceil=False), "the ragged tail is a block too"),
    (stub, "not implemented yet"),
])
def test_state_megabytes_fails(fn, hint):
    fails_with(checks.check_state_megabytes, fn, hint)


def make_budget(*, grads=True, itemsize=None, small_rule=True):
    def training_memory(model, optimizer="adamw", blocksize=256, min_8bit_size=4096):
        w = g = s = 0
        for p in model.parameters():
            n = p.numel()
            w += n * (itemsize or p.element_size())
            g += n * (itemsize or p.element_size()) if grads else 0
            big = n >= min_8bit_size or not small_rule
            s += 2 * n + 8 * (-(-n // blocksize)) if optimizer == "adam8bit" and big else 8 * n
        return {"weights": w, "gradients": g, "optimizer": s, "total": w + g + s}

    return training_memory


@pytest.mark.parametrize("fn, hint", [
    (make_budget(grads=False), "gradients take as much memory as the weights"),
    (make_budget(itemsize=4), "bf16/fp16 weights and gradients take 2 bytes"),
    (make_budget(small_rule=False), "small-tensor rule"),
    (stub, "not implemented yet"),
])
def test_training_memory_fails(fn, hint):
    fails_with(checks.check_training_memory, fn, hint)


def test_ex09_checks_pass_on_the_solution(capsys):
    checks.check_state_megabytes(solution("09", "state_megabytes"))
    checks.check_training_memory(solution("09", "training_memory"))
    assert capsys.readouterr().out.count("all checks passed") == 2


def test_distilbert_shapes_match_the_model():
    """The check's DistilBERT shapes are those of the transformers model (built on the meta device)."""
    from adam8lib.checks.ex09_memory_maths import distilbert_shapes
    from adam8lib.training import build_distilbert

    with torch.device("meta"):
        model = build_distilbert()
    assert sorted(tuple(p.shape) for p in model.parameters()) == sorted(distilbert_shapes())
