"""A sharded (FSDP2) parameter's low-bit states in the blocks of the whole tensor (the family's layout, issue 35).

:class:`~adam8lib.quantized_state.QuantizedStateOptimizer` (Lion8bit, AdEMAMix8bit, RMSprop8bit, ...) steps
the local shard of a DTensor parameter so that the states and the parameter equal those of an unsharded
run bit for bit, whatever the shard boundaries. (:class:`~adam8lib.optim.LowBitAdam` keeps blocks local
to the shard instead: the same bits only where every shard starts on a block boundary.)

**Blocks.** Rank ``r`` holds the flat elements ``[a_r, b_r)`` of a parameter of ``N`` elements
(:func:`adam8lib.distributed.shard_ranges`: ``torch.chunk`` on dim 0). Block ``k`` of a moment with
block size ``B`` is the global range ``[kB, (k+1)B)``, as in the unsharded tensor. Rank ``r`` keeps the
scales of the blocks its elements touch, ``k = ⌊a_r/B⌋ … ⌈b_r/B⌉ - 1``: ``⌈(lead + n_r)/B⌉`` floats with
``lead = a_r mod B`` (:func:`block_lead`; none for an empty shard), and one code per element as ever.
A block cut by a shard boundary is kept by each rank that holds part of it, with the same scale: the
maximum of ``|x|`` over the whole block, the MAX of each part's maximum (:func:`block_edge_reducer`: one
all-reduce of ``2·W`` floats per state per step, only for a parameter with a boundary ``a_r`` that is not
a multiple of ``B``: :func:`straddles`, decided from the global shape, the same on every rank). The
maximum is exact and a code depends on its element and its block's scale alone, so every code and scale
is the unsharded tensor's. Rank-1 scales (the ``"4bit"`` format's ``v`` of a matrix) keep the local rows'
maxima and the whole tensor's column maxima (:func:`adam8lib.distributed.rank1_maxima_reducer`).

**Checkpoints** (:func:`adam8lib.distributed.to_checkpoint_state` and ``to_local_state``, with
``block_layout="global"``; :func:`local_scales`). ``state_dict()`` gives each quantized state
of a DTensor parameter as DTensors of shape ``(W, L_max)`` sharded on dim 0 (row ``r``: rank ``r``'s flat
codes or scales, zero-padded), fp32 states as DTensors placed like the parameter. Any other world size
(or one process) rebuilds the whole tensor's codes (unpacked 4-bit codes, concatenated) and scales (each
block's from the row that holds it; rank-1: the rows' maxima concatenated, the columns' from any row)
and takes its own range: exact, bit for bit, as the states are the unsharded ones.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .formats import MomentFormat
from .quant import num_blocks
from .shards import _check_layout, is_sharded, local_range, shard_ranges

__all__ = ["block_lead", "straddles", "block_edge_reducer", "shard_scales_numel", "local_scales"]


def block_lead(p: torch.Tensor, blocksize: int) -> int:
    """``a_r mod blocksize``: where this rank's first element sits in its block (0 for a plain or
    replicated parameter and for an empty shard)."""
    if not is_sharded(p):
        return 0
    start, stop = local_range(p)
    return start % blocksize if stop > start else 0


def straddles(shape: tuple[int, ...], world: int, blocksize: int) -> bool:
    """Whether some shard boundary of a tensor of ``shape`` split on dim 0 into ``world`` ranks cuts a
    block of ``blocksize`` (then the edge blocks' scales need :func:`block_edge_reducer`)."""
    n = math.prod(shape)
    return any(stop % blocksize for _, stop in shard_ranges(shape, world) if 0 < stop < n)


def block_edge_reducer(p: torch.Tensor, blocksize: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The ``reduce_blocks`` hook of :meth:`adam8lib.formats.MomentFormat.quantize` for the shard of a
    parameter whose shard boundaries cut blocks (:func:`straddles`), else None.

    Rank ``r`` puts the maxima of its first and last block in row ``r`` of a ``(W, 2)`` zero tensor;
    an all-reduce (MAX) gives every rank every row (maxima are ``>= 0``, the others 0: exact). A rank's
    first (last) block's scale is then the MAX over the rows of every rank whose first or last block it
    is. A collective: every rank calls it for the same tensors in the same order (an empty shard too)."""
    if not is_sharded(p):
        return None
    rank, world = _check_layout(p)
    shape = tuple(p.shape)
    if not straddles(shape, world, blocksize):
        return None
    import torch.distributed as dist

    group = p.device_mesh.get_group()
    ranges = shard_ranges(shape, world)
    ends = [((a // blocksize, (b - 1) // blocksize) if b > a else None) for a, b in ranges]

    def reduce(scales: torch.Tensor) -> torch.Tensor:
        edges = torch.zeros((world, 2), dtype=torch.float32, device=scales.device)
        if scales.numel():
            edges[rank, 0], edges[rank, 1] = scales[0], scales[-1]
        dist.all_reduce(edges, op=dist.ReduceOp.MAX, group=group)
        if ends[rank] is None:
            return scales
        out = scales.clone()
        for position, block in ((0, ends[rank][0]), (-1, ends[rank][1])):
            for r, held in enumerate(ends):
                if held is not None and r != rank:
                    for side in (0, 1):
                        if held[side] == block:
                            out[position] = torch.maximum(out[position], edges[r, side])
        return out

    return reduce


def shard_scales_numel(moment: MomentFormat, shape: tuple[int, ...], local_shape: tuple[int, ...], lead: int) -> int:
    """Scales a shard of ``local_shape`` (of a tensor of ``shape``) keeps: the local rows' and the whole
    columns' maxima (rank-1), or one per global block it touches."""
    n = math.prod(local_shape)
    if moment.uses_rank1(shape):
        return sum(local_shape) if n else 0
    return num_blocks(lead + n, moment.blocksize) if n else 0


# ---------------------------------------------------------------------- checkpoints
def local_scales(moment: MomentFormat, shape, local_shape, ranges, scales, start: int, stop: int) -> torch.Tensor:
    """This rank's scales of ``moment`` (a shard of ``local_shape``, flat ``[start, stop)`` of a tensor of ``shape``)
    from ``scales``, every saved shard's (``ranges``) in the whole tensor's blocks: each block's scale from the
    shard that holds it (they agree where two hold it); rank-1: the rows' maxima concatenated, the columns' from
    any shard. Exact (what :func:`adam8lib.distributed.to_local_state` loads on another world size)."""
    empty = scales[0].new_zeros(0)
    if stop <= start:
        return empty
    if moment.uses_rank1(shape):
        row_len = math.prod(shape[1:])
        rows = [s[: (b - a) // row_len] for s, (a, b) in zip(scales, ranges)]
        others = next(s[(b - a) // row_len:] for s, (a, b) in zip(scales, ranges) if b > a)
        return torch.cat([torch.cat(rows)[start // row_len: stop // row_len], others])
    B = moment.blocksize
    total = num_blocks(math.prod(shape), B)
    whole = scales[0].new_zeros(total)
    for s, (a, b) in zip(scales, ranges):
        if b > a:
            whole[a // B: a // B + s.numel()] = s
    return whole[start // B: -(-stop // B)].clone()
