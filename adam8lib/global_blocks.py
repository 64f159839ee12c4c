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

**Checkpoints** (:func:`checkpoint_form`, :func:`local_form`). ``state_dict()`` gives each quantized state
of a DTensor parameter as DTensors of shape ``(W, L_max)`` sharded on dim 0 (row ``r``: rank ``r``'s flat
codes or scales, zero-padded), fp32 states as DTensors placed like the parameter. Any other world size
(or one process) rebuilds the whole tensor's codes (unpacked 4-bit codes, concatenated) and scales (each
block's from the row that holds it; rank-1: the rows' maxima concatenated, the columns' from any row)
and takes its own range: exact, bit for bit, as the states are the unsharded ones.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .distributed import _check_layout, is_dtensor, local_range, local_tensor, shard_ranges, shard_shapes
from .formats import MomentFormat, pack_nibbles, unpack_nibbles
from .quant import num_blocks

__all__ = ["block_lead", "straddles", "block_edge_reducer", "shard_scales_numel", "checkpoint_form", "local_form"]


def _sharded(p: torch.Tensor) -> bool:
    if not is_dtensor(p):
        return False
    from torch.distributed.tensor import Shard

    return any(isinstance(pl, Shard) for pl in p.placements)


def block_lead(p: torch.Tensor, blocksize: int) -> int:
    """``a_r mod blocksize``: where this rank's first element sits in its block (0 for a plain or
    replicated parameter and for an empty shard)."""
    if not _sharded(p):
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
    if not _sharded(p):
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
def checkpoint_form(p: torch.Tensor, state: dict[str, Any], moments: dict[str, tuple[str, MomentFormat]],
                    fp32_keys: tuple[str, ...]) -> dict[str, Any]:
    """The DCP form of a sharded parameter's state (see the module docstring); a plain parameter's as it is.
    ``moments``: ``{codes_key: (scales_key, moment format)}`` of its quantized states; ``fp32_keys``: the
    names of its fp32 states."""
    if not is_dtensor(p):
        return state
    from torch.distributed.tensor import DTensor, Shard

    rank, world = _check_layout(p)
    out = dict(state)
    local_shape = p.to_local().shape
    for key in fp32_keys:
        if torch.is_tensor(state.get(key)):
            out[key] = DTensor.from_local(state[key].view(local_shape), p.device_mesh, p.placements,
                                          run_check=False, shape=p.shape, stride=p.stride())
    lengths = _row_lengths(tuple(p.shape), world, moments)
    for key in (k for pair in ((c, s) for c, (s, _) in moments.items()) for k in pair):
        value = state.get(key)
        if not torch.is_tensor(value):
            continue
        longest = max(lengths[key])
        row = torch.zeros((1, longest), dtype=value.dtype, device=value.device)
        row[0, : value.numel()] = value.reshape(-1)
        out[key] = DTensor.from_local(row, p.device_mesh, [Shard(0)], run_check=False, shape=(world, longest),
                                      stride=(longest, 1))
    return out


def _row_lengths(shape: tuple[int, ...], world: int, moments: dict[str, tuple[str, MomentFormat]]) -> dict[str, list[int]]:
    """``{key: [elements kept by rank r]}`` of every codes and scales key, on ``world`` ranks."""
    out: dict[str, list[int]] = {}
    for codes_key, (scales_key, moment) in moments.items():
        out[codes_key], out[scales_key] = [], []
        for (a, _), local in zip(shard_ranges(shape, world), shard_shapes(shape, world)):
            lead = a % moment.blocksize
            out[codes_key].append(moment.codes_numel(math.prod(local)))
            out[scales_key].append(shard_scales_numel(moment, shape, local, lead))
    return out


def local_form(p: torch.Tensor, saved: dict[str, Any], moments: dict[str, tuple[str, MomentFormat]],
               fp32_keys: tuple[str, ...]) -> dict[str, Any]:
    """This rank's plain local state from a loaded one: the plain local form (as it is), the DCP form of
    any world size (DTensors or plain ``(W, L_max)`` tensors) or one process's flat tensors. Exact (see the
    module docstring). Returns ``saved`` unchanged where its tensors fit no layout (the state check that
    follows names what is wrong); never changes ``saved``."""
    out = dict(saved)
    local_shape = tuple(local_tensor(p).shape)
    for key in fp32_keys:
        value = saved.get(key)
        if is_dtensor(value) and is_dtensor(p):  # (a DTensor for a plain parameter: the state check refuses it)
            out[key] = value.to_local().reshape(local_shape)
    keys = [k for c, (s, _) in moments.items() for k in (c, s)]
    if not keys or not all(torch.is_tensor(saved.get(k)) for k in keys):
        return out
    tensors = {k: saved[k] for k in keys}
    dtensors = [is_dtensor(t) for t in tensors.values()]
    if not any(dtensors) and all(t.dim() == 1 for t in tensors.values()) and not _sharded(p):
        return out  # one process's plain state
    shape = tuple(p.shape)
    if all(dtensors) and _sharded(p) and all(t.shape[0] == p.device_mesh.size() for t in tensors.values()):
        rank, world = _check_layout(p)
        lengths = _row_lengths(shape, world, moments)
        for key, t in tensors.items():  # the same layout: this rank's row
            out[key] = t.to_local().reshape(-1)[: lengths[key][rank]]
        return out
    rows = {k: local_tensor(t) for k, t in tensors.items()}
    if all(t.dim() == 1 for t in rows.values()):
        rows, world = {k: t.reshape(1, -1) for k, t in rows.items()}, 1
    elif all(t.dim() == 2 for t in rows.values()) and len({t.shape[0] for t in rows.values()}) == 1:
        world = next(iter(rows.values())).shape[0]
    else:
        return out
    lengths = _row_lengths(shape, world, moments)
    if any(rows[k].shape[1] < max(lengths[k]) for k in keys):
        return out
    start, stop = local_range(p)
    local_shape = tuple(local_tensor(p).shape)
    ranges = shard_ranges(shape, world) if world > 1 else [(0, math.prod(shape))]
    for codes_key, (scales_key, moment) in moments.items():
        codes = [rows[codes_key][r, : lengths[codes_key][r]] for r in range(world)]
        scales = [rows[scales_key][r, : lengths[scales_key][r]] for r in range(world)]
        full = torch.cat([unpack_nibbles(c, b - a) if moment.bits == 4 else c for c, (a, b) in zip(codes, ranges)])
        mine = full[start:stop]
        out[codes_key] = pack_nibbles(mine) if moment.bits == 4 else mine.clone()
        out[scales_key] = _local_scales(moment, shape, local_shape, ranges, scales, start, stop)
    return out


def _local_scales(moment: MomentFormat, shape, local_shape, ranges, scales, start: int, stop: int) -> torch.Tensor:
    """This rank's scales from every saved row's (see :func:`local_form`)."""
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
