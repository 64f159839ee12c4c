"""Check cells of workbook 07 (ex07_adam8bit_step): pass on the solution, fail with a named hint on each plausible wrong answer."""

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
