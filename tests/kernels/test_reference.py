"""The reference backend (adam8lib.kernels.reference) is the spec: test it against the maths.

The other backends are tested against *it* (tests/kernels/test_cpu.py, test_triton.py); here it
is tested against things that do not depend on it: the fp32 Adam rule of adam8lib.adam (which
equals torch.optim.AdamW, tests/test_adam.py) and the blockwise quantizer of adam8lib.quant.
"""

from __future__ import annotations

import pytest
import torch

from adam8lib.adam import adam_step
from adam8lib.kernels import reference
from adam8lib.quant import dequantize_blocks, dynamic_map, num_blocks, quantize_blocks

QMAP1, QMAP2 = dynamic_map(signed=True), dynamic_map(signed=False)
HYPER = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)


def zero_state(n: int, blocksize: int):
    blocks = num_blocks(n, blocksize)
    return (torch.full((n,), 127, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8),
            torch.zeros(blocks), torch.zeros(blocks))


@pytest.mark.parametrize("n,blocksize", [(5000, 256), (70_001, 2048), (257, 64)])
def test_first_step_is_fp32_adamw_then_blockwise_quantized_states(n, blocksize):
    """From zero states, step 1 dequantizes exact zeros: the parameter update must equal the
    fp32 AdamW rule, and the stored states must be the blockwise quantization of fp32 m and v."""
    gen = torch.Generator().manual_seed(n)
    p = torch.randn(n, generator=gen)
    g = torch.randn(n, generator=gen) * torch.logspace(-6, 1, n)[torch.randperm(n, generator=gen)]
    s1, s2, a1, a2 = zero_state(n, blocksize)
    ours = p.clone()
    reference.adam8bit_step(ours, g, s1, s2, a1, a2, QMAP1, QMAP2, step=1, blocksize=blocksize, **HYPER)

    spec, m, v = p.clone(), torch.zeros(n), torch.zeros(n)
    adam_step(spec, g, m, v, step=1, lr=HYPER["lr"], betas=(HYPER["beta1"], HYPER["beta2"]),
              eps=HYPER["eps"], weight_decay=HYPER["weight_decay"], decoupled=True)
    torch.testing.assert_close(ours, spec, rtol=1e-6, atol=1e-7)

    codes1, absmax1 = quantize_blocks(m, QMAP1, blocksize, keep_sign=True)
    codes2, absmax2 = quantize_blocks(v, QMAP2, blocksize, keep_sign=True)
    torch.testing.assert_close(a1, absmax1, rtol=1e-6, atol=0)
    torch.testing.assert_close(a2, absmax2, rtol=1e-6, atol=0)
    # codes may differ only where m/absmax sits on a rounding tie (a last-bit difference of lerp vs mul-add)
    assert (s1 != codes1).float().mean() < 1e-3 and (s2 != codes2).float().mean() < 1e-3
    # and the dequantized states are within one code gap of fp32 m and v
    m_hat = dequantize_blocks(s1, a1, QMAP1, blocksize)
    assert ((m_hat - m).abs() <= a1.repeat_interleave(blocksize)[:n] * 0.05 + 1e-12).all()


@pytest.mark.parametrize("blocksize", [64, 256, 2048])
def test_chunking_never_changes_a_bit(blocksize):
    """The reference works over chunks of whole blocks to bound memory; the chunk size must not
    change any result (params, codes, absmax) over several steps."""
    n = 3 * 4096 + 77
    runs = []
    for chunk_size in (blocksize, 4096, reference.CHUNK_SIZE):
        p = torch.randn(n, generator=torch.Generator().manual_seed(0))
        state = zero_state(n, blocksize)
        for step in range(1, 4):
            g = torch.randn(n, generator=torch.Generator().manual_seed(step))
            reference.adam8bit_step(p, g, *state, QMAP1, QMAP2, step=step, blocksize=blocksize,
                                    chunk_size=chunk_size, **HYPER)
        runs.append((p, *state))
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


def test_zero_gradient_on_zero_state_moves_only_by_decay():
    """g = 0 everywhere: m = v = 0, so the update is exactly the decoupled decay p·(1 − lr·wd),
    and the states stay the codes of 0 (127 signed, 0 unsigned) with absmax 0."""
    n, blocksize = 4096, 256
    p = torch.randn(n)
    s1, s2, a1, a2 = zero_state(n, blocksize)
    ours = p.clone()
    reference.adam8bit_step(ours, torch.zeros(n), s1, s2, a1, a2, QMAP1, QMAP2, step=1, blocksize=blocksize, **HYPER)
    torch.testing.assert_close(ours, p * (1 - HYPER["lr"] * HYPER["weight_decay"]), rtol=0, atol=1e-7)
    assert (s1 == 127).all() and (s2 == 0).all() and (a1 == 0).all() and (a2 == 0).all()


# ------------------------------------------------------------------ several fp32 tensors at once
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit on the CPU; on CUDA (torch's fused multi-tensor kernels against the
    per-tensor ones) within 4 ulp."""
    if a.device.type == "cpu":
        return torch.equal(a, b)
    return torch.allclose(a, b, rtol=4 * 2.0**-23, atol=0.0) and bool((a.isnan() == b.isnan()).all())


def _fp32_case(seed: int, bad=None):
    """Tensors of several shapes (one non-contiguous, one empty), their gradients and states
    after one ordinary step; ``bad`` puts that value into one gradient element of tensor 2."""
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(shape, generator=gen) for shape in [(7,), (3, 5), (0,), (4, 6), (1,), (300,)]]
    params[3] = params[3].t()  # a transposed (non-contiguous) view
    grads = [torch.randn(p.shape, generator=gen) * 10.0 ** torch.randint(-6, 2, p.shape, generator=gen)
             for p in params]
    ms = [torch.randn(p.shape, generator=gen) * 1e-2 for p in params]
    vs = [torch.rand(p.shape, generator=gen) * 1e-4 for p in params]
    if bad is not None:
        grads[1][1, 2] = bad
    return params, grads, ms, vs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), 1e30])
def test_fp32_update_of_many_tensors_is_one_at_a_time_bit_for_bit(weight_decay, bad, device):
    """adam_update_fp32_many (the optimizer's batched path for small tensors) equals
    adam_update_fp32 tensor by tensor, bit for bit on the CPU: parameters and both moments,
    over three steps, including a step where a non-finite (or overflowing) gradient triggers
    the rule. (On CUDA within a few ulp: see _same.)"""
    hyper = dict(HYPER, weight_decay=weight_decay)
    params, grads, ms, vs = ([t.to(device) for t in ts] for ts in _fp32_case(3))
    ours = [[t.clone() for t in ts] for ts in (params, grads, ms, vs)]
    ours[0][3] = ours[0][3].t().contiguous().t()  # keep the non-contiguous layout
    for step in (1, 2, 3):
        g = [t.to(device) for t in _fp32_case(3 + step, bad if step == 2 else None)[1]]
        for i, (p, m, v) in enumerate(zip(params, ms, vs)):
            p.copy_(reference.adam_update_fp32(p, g[i], m, v, step=step, **hyper))
        reference.adam_update_fp32_many(ours[0], g, ours[2], ours[3], step=step, **hyper)
        for name, want, got in zip(("param", "m", "v"), (params, ms, vs), (ours[0], ours[2], ours[3])):
            for i, (a, b) in enumerate(zip(want, got)):
                assert _same(a, b), f"step {step}: {name} of tensor {i} differs"
        if step == 2 and bad is not None:  # the rule ran (the slow path): that element restarted
            assert ours[2][1][1, 2] == 0 and ours[3][1][1, 2] == 0
    assert not ours[0][3].is_contiguous()


def test_fp32_update_of_many_tensors_keeps_the_parameter_of_a_reset_element():
    params, grads, ms, vs = _fp32_case(11, float("nan"))
    before = [p.clone() for p in params]
    reference.adam_update_fp32_many(params, grads, ms, vs, step=1, **HYPER)
    assert params[1][1, 2] == before[1][1, 2] and ms[1][1, 2] == 0 and vs[1][1, 2] == 0
    assert not torch.equal(params[0], before[0]) and not torch.equal(params[5], before[5])
    assert all(torch.isfinite(t).all() for t in (*params, *ms, *vs))


def test_fp32_update_of_many_tensors_rejects_what_it_does_not_handle():
    p, g, m, v = torch.zeros(3), torch.ones(3), torch.zeros(3), torch.zeros(3)
    with pytest.raises(ValueError, match=r"fp32 tensors on one device \(cpu\), got torch.bfloat16 on cpu"):
        reference.adam_update_fp32_many([p.bfloat16()], [g], [m], [v], step=1, **HYPER)
    with pytest.raises(ValueError, match="got torch.float32 on meta"):
        reference.adam_update_fp32_many([p], [g], [m], [v.to("meta")], step=1, **HYPER)
    with pytest.raises(ValueError, match="different lengths"):
        reference.adam_update_fp32_many([p, p.clone()], [g], [m], [v], step=1, **HYPER)
    reference.adam_update_fp32_many([], [], [], [], step=1, **HYPER)  # nothing to do
