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
