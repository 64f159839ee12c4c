"""Stochastic rounding's step, chunked (issue 35, item 4): a bf16 parameter with blockwise low-bit states
is updated and rounded ``SR_CHUNK`` elements at a time, with the same bits as at once, and the step's
transient memory is a chunk's, not the parameter's (measured with adam8lib.memory_tracker)."""

from __future__ import annotations

import pytest
import torch

from adam8lib import AdamW8bit
from adam8lib import rounding
from adam8lib.memory_tracker import track_step
from adam8lib.optim import LowBitAdam


def _run(state_format, backend, shape, chunk, monkeypatch, steps=3):
    monkeypatch.setattr(rounding, "SR_CHUNK", chunk)
    gen = torch.Generator().manual_seed(3)
    p = torch.nn.Parameter(torch.randn(shape, generator=gen).to(torch.bfloat16))
    opt = LowBitAdam([p], lr=1e-3, weight_decay=0.1, state_format=state_format, backend=backend,
                     stochastic_rounding=True, seed=5)
    for _ in range(steps):
        p.grad = torch.randn(shape, generator=gen).to(torch.bfloat16)
        opt.step()
    return p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)}


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("state_format,shape", [("8bit", (37, 200)), ("fp8", (9000,)), ("4bit-naive", (70, 123)),
                                                ("4bit", (9001,))])
def test_chunked_rounding_gives_the_bits_of_the_whole_tensor(state_format, shape, backend, monkeypatch):
    """Chunks of 1,024 elements (whole blocks; the last one partial) against one piece."""
    whole = _run(state_format, backend, shape, 1 << 30, monkeypatch)
    chunked = _run(state_format, backend, shape, 1024, monkeypatch)
    assert torch.equal(whole[0], chunked[0])
    assert set(whole[1]) == set(chunked[1])
    for key, value in whole[1].items():
        assert torch.equal(value, chunked[1][key]), key


def _step_transient(monkeypatch, chunk):
    monkeypatch.setattr(rounding, "SR_CHUNK", chunk)
    n = 1 << 18
    emb = torch.nn.Embedding(n // 256, 256).to(torch.bfloat16)
    opt = AdamW8bit(emb.parameters(), stochastic_rounding=True)
    x = torch.arange(0, n // 256, 7)
    track_step(emb, opt, lambda: emb(x).float().square().mean())
    tracker = track_step(emb, opt, lambda: emb(x).float().square().mean())
    return tracker.peak("step").bytes["transient"] / n


def test_the_rounded_step_transient_is_a_chunks_not_the_parameters(monkeypatch):
    """Measured here: 8 B/param in one piece (the fp32 copy of the parameter, the kernel's fp32 work),
    about 2 with chunks of 2^14 (a sixteenth of the 2^18 elements)."""
    whole = _step_transient(monkeypatch, 1 << 30)
    chunked = _step_transient(monkeypatch, 1 << 14)
    assert whole >= 6, whole
    assert chunked <= whole / 2, (chunked, whole)
