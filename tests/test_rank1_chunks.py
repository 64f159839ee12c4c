"""A stochastically rounded step of a tensor with rank-1 scales runs in chunks of rows (adam8lib.rank1_chunks):
the same bits as the whole-tensor step, and temporaries bounded by a chunk, not by the tensor (issue 54)."""

from __future__ import annotations

import pytest
import torch

from adam8lib import AdamW4bit, MemoryTracker, rank1_chunks
from adam8lib.optim import LowBitAdam
from adam8lib.chunked_update import rank1_row_chunks

SHAPES = [(300, 770), (1000, 768), (40, 12, 70), (513, 129)]  # rows that fill no block, 3-D, odd rows


def _run(shape, monkeypatch, whole: bool, steps=3, cls=AdamW4bit, nonfinite=False, **kw):
    if whole:  # one chunk would hold every row: the whole-tensor path of before
        monkeypatch.setattr(rank1_chunks, "RANK1_CHUNK", 1 << 30)
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(shape, generator=gen).to(torch.bfloat16))
    opt = cls([p], lr=1e-2, weight_decay=0.1, stochastic_rounding=True, seed=3, **kw)
    for step in range(steps):
        g = torch.randn(shape, generator=gen) * 10.0 ** torch.randint(-3, 2, shape, generator=gen)
        if nonfinite and step == 1:
            g.view(-1)[[5, 70_000 % g.numel(), -1]] = torch.tensor([float("nan"), float("inf"), 3e30])
        p.grad = g.to(torch.bfloat16)
        opt.step()
    monkeypatch.undo()
    return p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_chunks_of_rows_give_the_bits_of_the_whole_tensor_step(shape, monkeypatch):
    calls = []
    real = rank1_chunks.step_in_row_chunks
    monkeypatch.setattr(rank1_chunks, "step_in_row_chunks", lambda *a, **k: (calls.append(len(a[6])), real(*a, **k)))
    p_chunked, s_chunked = _run(shape, monkeypatch, whole=False)
    assert calls and min(calls) > 1  # it ran, in several chunks
    p_whole, s_whole = _run(shape, monkeypatch, whole=True)
    assert torch.equal(p_chunked.view(torch.int16), p_whole.view(torch.int16))
    assert s_chunked.keys() == s_whole.keys()
    for key in s_whole:
        assert torch.equal(s_chunked[key], s_whole[key]), key


def test_non_finite_gradients_in_some_chunks_keep_the_bits(monkeypatch):
    p_chunked, s_chunked = _run((300, 770), monkeypatch, whole=False, nonfinite=True)
    p_whole, s_whole = _run((300, 770), monkeypatch, whole=True, nonfinite=True)
    assert torch.equal(p_chunked.view(torch.int16), p_whole.view(torch.int16))
    assert all(torch.equal(s_chunked[k], s_whole[k]) for k in s_whole)


def test_adam_without_decay_and_the_naive_format_keep_their_paths(monkeypatch):
    # Adam4bit (rank-1 v) chunks; the naive 4-bit format has no rank-1 scales: not this path
    a, sa = _run((300, 770), monkeypatch, whole=False, cls=LowBitAdam, state_format="4bit")
    b, sb = _run((300, 770), monkeypatch, whole=True, cls=LowBitAdam, state_format="4bit")
    assert torch.equal(a.view(torch.int16), b.view(torch.int16)) and all(torch.equal(sa[k], sb[k]) for k in sa)
    naive = LowBitAdam([w := torch.nn.Parameter(torch.zeros(300, 770, dtype=torch.bfloat16))], state_format="4bit-naive",
                       stochastic_rounding=True)
    w.grad = torch.ones_like(w)
    naive.step()  # (its states exist: blockwise, no rank-1 scales)
    assert rank1_row_chunks(naive, w, w, naive.state[w], naive.rule_for(w, naive.param_groups[0])) is None
    four = LowBitAdam([w], state_format="4bit", stochastic_rounding=True)
    four.step()
    assert len(rank1_row_chunks(four, w, w, four.state[w], four.rule_for(w, four.param_groups[0]))) > 1


def test_row_chunks_start_on_blocks_and_cover_every_row():
    fmt = AdamW4bit([torch.nn.Parameter(torch.zeros(2))]).format
    for shape in SHAPES:
        chunks = rank1_chunks.row_chunks(shape, [fmt.m, fmt.v])
        row = int(torch.tensor(shape[1:]).prod())
        assert chunks[0][0] == 0 and chunks[-1][1] == shape[0]
        assert all(b == c for (_, b), (c, _) in zip(chunks, chunks[1:]))
        assert all((r0 * row) % fmt.m.blocksize == 0 for r0, _ in chunks)
    assert rank1_chunks.row_chunks((8, 128), [fmt.m, fmt.v]) is None  # one chunk holds it


def _step_temporaries(monkeypatch, whole: bool, shape=(2048, 768)) -> float:
    """Bytes per element of the largest transient total during one SR step of a rank-1 4-bit matrix."""
    if whole:
        monkeypatch.setattr(rank1_chunks, "RANK1_CHUNK", 1 << 30)
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(shape, generator=gen).to(torch.bfloat16))
    opt = AdamW4bit([p], lr=1e-3, stochastic_rounding=True)
    p.grad = torch.randn(shape, generator=gen).to(torch.bfloat16)
    opt.step()  # the states exist before the tracker starts
    p.grad = torch.randn(shape, generator=gen).to(torch.bfloat16)
    tracker = MemoryTracker([p], opt)
    with tracker:
        with tracker.phase("step"):
            opt.step()
    monkeypatch.undo()
    return tracker.peak("step", categories=["transient"]).sum(["transient"])


def test_the_step_temporaries_are_a_chunk_s_not_the_matrix_s(monkeypatch):
    n = 2048 * 768
    whole = _step_temporaries(monkeypatch, whole=True)
    assert whole > 4 * n  # at least an fp32 copy of the whole matrix (measured: 8 bytes per element)
    chunked = _step_temporaries(monkeypatch, whole=False)
    # a chunk's temporaries (its fp32 copy, decoded states, the random bits of its rounding: measured ~81 bytes per
    # chunk element, ~5 MB), the same for a matrix four times smaller: bounded by the chunk, not the tensor
    assert chunked < 128 * rank1_chunks.RANK1_CHUNK, chunked / rank1_chunks.RANK1_CHUNK
    smaller = _step_temporaries(monkeypatch, whole=False, shape=(512, 768))
    assert abs(chunked - smaller) < 0.25 * chunked, (chunked, smaller)
