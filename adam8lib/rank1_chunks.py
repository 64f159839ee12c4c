"""A stochastically rounded step of a tensor with rank-1 scales, in chunks of rows: bounded temporaries.

A bf16 parameter with stochastic rounding is stepped on an fp32 copy that is then rounded
(:mod:`adam8lib.rounding`). For blockwise states the copy is one chunk's (:func:`adam8lib.rounding.state_chunks`):
each block is whole in one chunk, so chunks give the bits of one step of the whole tensor. A moment with **rank-1
scales** (the 4-bit formats' v: each entry scaled by ``min(its row's max, its column's max)``, lesson 12) is not
like that: the new scales are maxima over the *whole* new tensor, so no chunk can be coded before every chunk has
been updated. Stepping the whole tensor at once costs an fp32 copy of it, its random bits and the decoded states
(on DistilBERT's 28,996 x 768 token embedding, several bytes per element more than the state itself: the peak of
lesson 14's 4-bit rows).

Two passes over chunks of whole rows instead (each a few rows, :data:`RANK1_CHUNK` elements or so):

1. decode each chunk's states, take the update rule's step on an fp32 copy of the chunk, and keep only the new
   rank-1 moments' axis maxima (a row's maximum is complete in its chunk; the other axes' maxima are running
   maxima over the chunks): ``sum(shape)`` floats per moment;
2. take the same step again (the same inputs, the same elementwise arithmetic: the same bits), round the chunk's
   parameter stochastically, code the blockwise moments with their own blocks (a chunk holds whole blocks) and the
   rank-1 moments with the whole tensor's maxima, and write the new maxima only at the end (pass 2 still decodes
   with the old ones).

The temporaries are a chunk's, whatever the tensor: the price is a second evaluation of the rule. The bits are
those of the whole-tensor step (tests/test_rank1_chunks.py compares them, for 2-D and 3-D tensors, rows that do
not fill a block, and non-finite gradients).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .formats import MomentFormat, rank1_scales
from .rounding import SR_CHUNK

__all__ = ["RANK1_CHUNK", "row_chunks", "step_in_row_chunks"]

#: Elements per chunk (about; whole rows): a quarter of :data:`adam8lib.rounding.SR_CHUNK`. A chunk's temporaries
#: are ~80 bytes per element (its fp32 copy, the decoded states of two passes, the rounding's random bits), and a
#: rank-1 step runs during backward under gradient release, next to the largest gradient in flight: ~1.3 MB.
RANK1_CHUNK = SR_CHUNK // 4


def row_chunks(shape: tuple[int, ...], moments: list[MomentFormat], chunk: int = RANK1_CHUNK) -> list[tuple[int, int]] | None:
    """Row ranges ``(r0, r1)`` over axis 0 of ``shape`` for :func:`step_in_row_chunks`, or None when one chunk
    would hold the whole tensor (or whole blocks would need chunks far larger than ``chunk``).

    A chunk starts on a block boundary of every blockwise moment (and on an even element, for packed codes)."""
    if len(shape) < 2 or math.prod(shape) == 0:
        return None
    rows, row = shape[0], math.prod(shape[1:])
    align = 1
    for m in moments:
        if m.uses_rank1(shape):
            need = 2 if m.bits == 4 else 1
        else:
            need = m.blocksize
        step = need // math.gcd(row, need)
        align = align * step // math.gcd(align, step)
    per = max(align, (chunk // row) // align * align)
    if per >= rows or per * row > 4 * chunk:
        return None
    return [(r0, min(r0 + per, rows)) for r0 in range(0, rows, per)]


def step_in_row_chunks(param: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], specs, moment_of: Callable,
                       update: Callable, chunks: list[tuple[int, int]], codec) -> None:
    """Step the contiguous bf16 tensor ``param`` (gradient ``grad``) and its ``state`` in ``chunks`` of rows, in two
    passes (module docstring). ``codec`` turns a chunk of the stored parameter into fp32 and back
    (``codec.load(view, a, b, whole=False)``, ``codec.store(view, target, a, b, whole=False)``: stochastic rounding,
    or a compressed master's join and split, :mod:`adam8lib.master_weights`).

    ``specs``: the rule's state specs; ``moment_of(spec)``: a quantized state's :class:`MomentFormat` (its codes
    and scales under ``spec.codes_key``/``spec.scales_key`` in ``state``; a state stored under ``spec.name`` is
    fp32, one value per element). ``update(target, grad, values) -> new``: the rule's fp32 step of one chunk
    (``target``: the chunk's fp32 parameter, ``values``: its decoded states, updated in place; non-finite
    handling included)."""
    shape = tuple(param.shape)
    row = math.prod(shape[1:])
    flat_p, flat_g = param.view(-1), grad.reshape(-1)
    rank1 = [s for s in specs if s.name not in state and moment_of(s).uses_rank1(shape)]
    old = {s.name: list(state[s.scales_key].split(list(shape))) for s in rank1}
    new_max: dict[str, list[torch.Tensor | None]] = {s.name: [None] * len(shape) for s in rank1}

    def decode(r0: int, r1: int, writable: bool) -> dict[str, torch.Tensor]:
        a, b, cshape = r0 * row, r1 * row, (r1 - r0,) + shape[1:]
        values = {}
        for s in specs:
            if s.name in state:  # fp32: the state itself (pass 2), or a copy (pass 1 must change nothing)
                view = state[s.name].view(-1)[a:b]
                values[s.name] = view if writable else view.clone()
                continue
            m = moment_of(s)
            codes = state[s.codes_key][m.codes_numel(a): m.codes_numel(b)]
            if s in rank1:
                scales = torch.cat([old[s.name][0][r0:r1]] + old[s.name][1:])
                values[s.name] = m.dequantize(codes, scales, cshape)
            else:
                scales = state[s.scales_key][a // m.blocksize: -(-b // m.blocksize)]
                values[s.name] = m.dequantize(codes, scales, (b - a,))
        return values

    for r0, r1 in chunks:  # pass 1: the new rank-1 maxima
        a, b = r0 * row, r1 * row
        values = decode(r0, r1, writable=False)
        update(codec.load(flat_p[a:b], a, b, False), flat_g[a:b], values)
        for s in rank1:
            maxima = rank1_scales(values[s.name].view((r1 - r0,) + shape[1:]))
            kept = new_max[s.name]
            if kept[0] is None:
                kept[0] = maxima[0].new_empty(shape[0])
                kept[1:] = maxima[1:]
            else:
                kept[1:] = [torch.maximum(k, m) for k, m in zip(kept[1:], maxima[1:])]
            kept[0][r0:r1] = maxima[0]
    for r0, r1 in chunks:  # pass 2: the same step, rounded and coded
        a, b, cshape = r0 * row, r1 * row, (r1 - r0,) + shape[1:]
        values = decode(r0, r1, writable=True)
        target = codec.load(flat_p[a:b], a, b, False)
        target.copy_(update(target, flat_g[a:b], values))
        codec.store(flat_p[a:b], target, a, b, False)
        for s in specs:
            if s.name in state:
                continue
            m = moment_of(s)
            x = values[s.name].reshape(-1)
            if s in rank1:
                whole = new_max[s.name]
                codes, _ = m.quantize(x, cshape, lambda _maxima, r0=r0, r1=r1, whole=whole: [whole[0][r0:r1]] + whole[1:])
            else:
                codes, scales = m.quantize(x, (b - a,))
                state[s.scales_key][a // m.blocksize: -(-b // m.blocksize)] = scales
            state[s.codes_key][m.codes_numel(a): m.codes_numel(b)] = codes.reshape(-1)
    for s in rank1:
        state[s.scales_key].copy_(torch.cat(new_max[s.name]))
