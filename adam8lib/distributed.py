"""Low-bit Adam on sharded parameters: FSDP2 local shards and portable checkpoints (lesson 11).

What follows describes the 8-bit format (lesson 11); the other state formats (lesson 12) shard
the same way, with the differences listed under *Other state formats* at the end. Which checkpoint
form a format takes is decided by what it stores, not by its name: codes aligned with the elements
(one byte per code into a map, blockwise scales:
:attr:`~adam8lib.formats.StateFormat.byte_codes_into_maps`) take the form below; packed codes,
rank-1 scales and float8 bytes the flat form of *Other state formats*.

**Stepping a shard.** Under FSDP2 (``torch.distributed.fsdp.fully_shard``) each parameter is a
``DTensor``: rank ``r`` of ``W`` holds rows ``chunk(r)`` of dim 0 (``torch.chunk`` sizes:
``ceil(R/W)`` rows each, the last ranks may hold fewer or none). The optimizer steps on the
local shard ``p.to_local()`` with ``grad.to_local()``: Adam is elementwise, so the update of
every element is the one a single process would make, *except* for the quantization blocks.

**Blocks are local to a shard.** Rank ``r`` splits its ``n_r`` local elements into
``ceil(n_r / blocksize)`` blocks, each with its own absmax. Per-rank state is therefore
``2·n_r + 8·ceil(n_r/blocksize)`` bytes, about ``(2 + 8/blocksize)·n / W``. The blocks equal
the single-process ones exactly when every shard starts on a block boundary, i.e. when
``ceil(R/W)·C`` is a multiple of ``blocksize`` (``C`` = elements per row); otherwise the blocks
that straddle a shard boundary differ and so do their absmax values (a few elements per
boundary get a different quantization step, bounded by one step of the map).

(The optimizer family, :class:`~adam8lib.quantized_state.QuantizedStateOptimizer` in the family's storage
layout, keeps the whole tensor's blocks on a shard instead, so its sharded runs equal the unsharded ones bit for
bit whatever the boundaries: :mod:`adam8lib.global_blocks`. Every layout's checkpoints go through one path,
:func:`to_checkpoint_state` and :func:`to_local_state`, which read the layout's keys (``moments``, ``fp32_keys``)
and whose blocks a shard keeps (``block_layout``): :mod:`adam8lib.state_layout`. The names ``state1``/``absmax1``
below are lesson 07's layout's keys.)

Where a shard lies (:func:`local_range`, :func:`shard_ranges`, ...) is :mod:`adam8lib.shards`' (named here too).

**8-bit or fp32 is decided by the full parameter** (``p.numel()`` of the DTensor, not the
shard), so sharding never changes which states are 8-bit.

**Checkpoints.** ``Adam8bit.state_dict()`` gives, for a DTensor parameter sharded on dim 0 of
a 1-D mesh, the form ``torch.distributed.checkpoint`` (DCP) can save and reshard:

* ``state1``/``state2``: uint8 DTensors with the parameter's shape and placements (one code
  per element, so DCP reshards them exactly);
* ``absmax1``/``absmax2``: fp32 DTensors of shape ``(W, B_max)``, sharded on dim 0: row ``r``
  is rank ``r``'s block scales, zero-padded to ``B_max = ceil(ceil(R/W)·C / blocksize)``.

Loading on the same world size (same layout) is bit-identical. Loading a checkpoint saved on
a different world size (2→1, 1→2) goes through :func:`load_checkpoint`: it reads the full
codes and block scales of the saved layout, dequantizes the local range with the *saved*
blocks and requantizes it with the *new* local blocks. A new block that coincides with a
saved block keeps its saved codes and absmax bit for bit; the others change each state
element by at most one step of the quantization map times the new block's absmax (the
documented reshard tolerance, see :func:`reshard_tolerance`).

**Other state formats** (``"4bit"``, ``"4bit-naive"``, ``"fp8"``; :mod:`adam8lib.formats`).

* *Blockwise moments* (fp8's ``m`` and ``v``, 4-bit ``m``, 4-bit-naive ``v``, and the 4-bit ``v`` of a
  1-D tensor) are exactly as above: the states of the local shard, blocks local to it. They equal
  the single-process blocks when every shard starts on a block boundary (``ceil(R/W)·C`` a
  multiple of ``blocksize``: 128 for the 4-bit formats, 256 for fp8); otherwise the straddling
  blocks get their own scales, and the result is that of a single process stepping each row
  chunk as its own tensor.
* *Rank-1 ``v``* (the ``"4bit"`` format, tensors of two or more dimensions): a shard holds whole
  rows, so its row maxima are the whole tensor's, but its column maxima are not. Each step
  all-reduces (MAX) the shard's column maxima across the mesh's process group
  (:func:`rank1_maxima_reducer`: ``cols`` floats per matrix per step), so the scales, codes and
  parameters equal the unsharded run's bit for bit (with block-aligned shards for ``m``). Every
  rank keeps its row maxima and the (whole) column maxima: ``absmax2`` has ``rows_local + cols``
  floats. That step is a collective: every rank must step the same parameters (FSDP2 gives every
  rank a gradient, an empty shard included, and an empty shard still takes part), and it always
  runs the reference step, never a fused kernel.
* *Checkpoints*: a 4-bit shard's codes are packed two per byte, so they cannot take the
  parameter's shape; ``state_dict()`` gives each of ``state1``, ``state2``, ``absmax1``,
  ``absmax2`` as an fp32/uint8 DTensor of shape ``(W, L_max)`` sharded on dim 0 (row ``r``: rank
  ``r``'s flat tensor, zero-padded). The same world size loads bit-identical; another world
  size (2→1, 1→2, through :func:`load_checkpoint`) decodes every saved shard to fp32 ``m`` and
  ``v``, and encodes this rank's range in its own layout (rank-1 scales from the whole
  tensor's maxima): each state element moves by at most one step of its map (fp8: one e4m3
  step) times its new scale.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, NoReturn

import torch

from .formats import pack_nibbles, rank1_scales, unpack_nibbles
from .global_blocks import local_scales, shard_scales_numel
from .quant import num_blocks, quantize_blocks
from .shards import (_check_layout, global_offset, is_dtensor, is_sharded, local_param_and_grad, local_range,
                     local_tensor, shard_ranges, shard_shapes)
from .state_layout import STORED_KEYS

__all__ = [
    "is_dtensor", "is_sharded", "local_tensor", "local_param_and_grad", "global_offset", "shard_ranges", "shard_shapes",
    "local_range",
    "rank1_maxima_reducer",
    "to_checkpoint_state", "to_local_state", "reshard_tolerance",
    "save_checkpoint", "load_checkpoint", "end_rank",
]

# ---------------------------------------------------------------------- rank-1 scales of a shard
def rank1_maxima_reducer(p: torch.Tensor):
    """For a sharded (DTensor) parameter, the ``reduce_maxima`` hook of
    :meth:`adam8lib.formats.MomentFormat.quantize` that makes a shard's rank-1 scales those of the
    whole tensor; ``None`` for a plain or replicated parameter (its maxima are already whole).

    Under ``Shard(d)`` the maxima along axis ``d`` (for FSDP2's ``Shard(0)``: the row maxima) are
    complete on each rank, since each slice along ``d`` lives on one rank; the maxima along every
    other axis (the column maxima) are maxima over the local rows only. The hook all-reduces those
    with MAX across the mesh's process group: ``sum(shape) - shape[d]`` floats per tensor and
    moment, one collective per step. The maximum is exact, so the scales, the codes and the
    parameters equal those of an unsharded run bit for bit. Every rank must call it for the same
    tensors in the same order (an empty shard too, with zero maxima); the optimizer does, for every
    parameter with a gradient (FSDP2 gives every rank one)."""
    if not is_dtensor(p):
        return None
    from torch.distributed.tensor import Shard

    mesh, placements = p.device_mesh, p.placements
    if not any(isinstance(pl, Shard) for pl in placements):
        return None
    if mesh.ndim != 1 or len(placements) != 1:
        raise NotImplementedError(
            f"rank-1 scales of a sharded parameter support a 1-D mesh (FSDP2); got placements {placements} "
            f"on a {mesh.ndim}-D mesh"
        )
    import torch.distributed as dist

    dim = placements[0].dim % p.dim()
    group = mesh.get_group()

    def reduce(maxima: list[torch.Tensor]) -> list[torch.Tensor]:
        others = [axis for axis in range(len(maxima)) if axis != dim]
        flat = torch.cat([maxima[axis].float().reshape(-1) for axis in others])
        dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=group)
        out = list(maxima)
        for axis, part in zip(others, flat.split([maxima[axis].numel() for axis in others])):
            out[axis] = part
        return out

    return reduce


# ---------------------------------------------------------------------- checkpoint form
#: ``{codes key: (scales key, moment format)}`` of one parameter's quantized states (a storage layout's keys,
#: :meth:`adam8lib.state_layout.StateLayout.moments`).
Moments = dict[str, tuple[str, Any]]


def to_checkpoint_state(p: torch.Tensor, state: dict[str, Any], fmt: Any, *, moments: Moments,
                        fp32_keys: tuple[str, ...] = (), block_layout: str = "global") -> dict[str, Any]:
    """The DCP form of one parameter's state, the one path of every storage layout
    (:class:`adam8lib.state_layout.StateLayout`); a plain parameter's state as it is.

    ``moments`` names its quantized states, ``{codes key: (scales key, moment format)}`` (``{}`` if it has
    none), ``fp32_keys`` its fp32 states, ``block_layout`` whose blocks a shard keeps (``"global"``: the whole
    tensor's, :mod:`adam8lib.global_blocks`; ``"local"``: its own, lesson 11) and ``fmt`` the optimizer's
    :class:`~adam8lib.formats.StateFormat`. fp32 states become DTensors placed like the parameter. Codes and
    scales become DTensors of shape ``(W, L_max)`` sharded on dim 0 (row ``r``: rank ``r``'s flat tensor,
    zero-padded to the longest rank's length), but for the codes of lesson 11's layout (local blocks, one byte
    per element into a map: :attr:`~adam8lib.formats.StateFormat.byte_codes_into_maps`), which take the
    parameter's shape and placements (DCP reshards them exactly); its scales' rows are ``(W, B_max)``."""
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
    aligned = _element_aligned(fmt, block_layout)
    lengths = _row_lengths(tuple(p.shape), world, moments, block_layout)
    for codes_key, (scales_key, _) in moments.items():
        if aligned and torch.is_tensor(state.get(codes_key)):
            out[codes_key] = DTensor.from_local(state[codes_key].view(local_shape), p.device_mesh, p.placements,
                                                run_check=False, shape=p.shape, stride=p.stride())
        for key in ((scales_key,) if aligned else (codes_key, scales_key)):
            value = state.get(key)
            if not torch.is_tensor(value):
                continue
            longest = max(lengths[key])
            row = torch.zeros((1, longest), dtype=value.dtype, device=value.device)
            row[0, : value.numel()] = value.reshape(-1)
            out[key] = DTensor.from_local(row, p.device_mesh, [Shard(0)], run_check=False, shape=(world, longest),
                                          stride=(longest, 1))
    return out


def to_local_state(p: torch.Tensor, saved: dict[str, Any], fmt: Any, *, moments: Moments,
                   fp32_keys: tuple[str, ...] = (), block_layout: str = "global") -> dict[str, Any]:
    """This rank's plain local state from a loaded one (the arguments: :func:`to_checkpoint_state`'s): the plain
    local form (as it is), the DCP form of the same world size (this rank's row: bit for bit), or the states of
    another world size or of one process, which are made this rank's:

    * whole-tensor blocks (``"global"``): exact, bit for bit (:func:`adam8lib.global_blocks.local_scales`: each
      block's scale from the row that holds it), as the states are the unsharded ones;
    * a shard's own blocks (``"local"``): lesson 11's layout dequantizes this rank's range with the *saved* blocks
      and requantizes it with its own (:func:`_reblock`: a block that coincides with a saved one keeps its codes
      and scale; the others move by at most one step of the map, :func:`reshard_tolerance`); other formats decode
      every saved shard and encode this rank's range (:func:`_relayout`).

    Returns ``saved``'s tensors unchanged where they fit no layout (the state check that follows names what is
    wrong), or raises ValueError naming the misfit; never changes ``saved``."""
    out = dict(saved)
    local_shape = tuple(local_tensor(p).shape)
    for key in fp32_keys:
        value = saved.get(key)
        if is_dtensor(value) and is_dtensor(p):  # (a DTensor for a plain parameter: the state check refuses it)
            out[key] = value.to_local().reshape(local_shape)
    keys = [k for c, (s, _) in moments.items() for k in (c, s)]
    if not keys or not all(torch.is_tensor(saved.get(k)) for k in keys):
        return out  # the state check names what is missing
    if _element_aligned(fmt, block_layout):
        return _aligned_local_state(p, saved, out, moments)
    tensors = {k: saved[k] for k in keys}
    dtensors = [is_dtensor(t) for t in tensors.values()]
    if not any(dtensors) and all(t.dim() == 1 for t in tensors.values()) and not is_sharded(p):
        return out  # one process's plain state
    shape = tuple(p.shape)
    if all(dtensors) and is_sharded(p) and all(t.dim() == 2 and t.shape[0] == p.device_mesh.size()
                                               for t in tensors.values()):
        rank, world = _check_layout(p)
        lengths = _row_lengths(shape, world, moments, block_layout)
        for key, t in tensors.items():  # the same layout: this rank's row
            row = t.to_local().reshape(-1)
            if row.numel() < lengths[key][rank]:
                raise ValueError(f"saved {key!r} shard has {row.numel()} values, expected {lengths[key][rank]}")
            out[key] = row[: lengths[key][rank]]
        return out
    rows = {k: local_tensor(t) for k, t in tensors.items()}
    if all(t.dim() == 1 for t in rows.values()):
        rows, world = {k: t.reshape(1, -1) for k, t in rows.items()}, 1
    elif all(t.dim() == 2 for t in rows.values()) and len({t.shape[0] for t in rows.values()}) == 1:
        world = next(iter(rows.values())).shape[0]
    elif block_layout == "local":
        raise ValueError(f"saved low-bit states of shapes {[tuple(t.shape) for t in rows.values()]} fit no "
                         f"layout of a parameter of shape {shape}")
    else:
        return out
    lengths = _row_lengths(shape, world, moments, block_layout)
    for key in keys:
        short = rows[key].shape[1] < max(lengths[key])
        if block_layout == "global":
            if short:
                return out  # (the state check names what is wrong)
            continue
        if short or (world == 1 and rows[key].shape[1] != lengths[key][0]):
            raise ValueError(f"saved {key!r} has {rows[key].shape[1]} values per shard, but a parameter of shape "
                             f"{shape} in {world} shard(s) in format {fmt.name!r} needs {max(lengths[key])}")
        expected = moments[key][1].code_dtype if key in moments else torch.float32
        if rows[key].dtype != expected:
            raise ValueError(f"saved {key!r} is {rows[key].dtype}, a parameter of shape {shape} in format "
                             f"{fmt.name!r} needs {expected}")
    ranges = shard_ranges(shape, world) if world > 1 else [(0, math.prod(shape))]
    shapes = shard_shapes(shape, world) if world > 1 else [shape]
    start, stop = local_range(p)
    for codes_key, (scales_key, moment) in moments.items():
        codes = [rows[codes_key][r, : lengths[codes_key][r]] for r in range(world)]
        scales = [rows[scales_key][r, : lengths[scales_key][r]] for r in range(world)]
        if block_layout == "global":  # the whole tensor's blocks: this rank's part of them, exact
            full = torch.cat([unpack_nibbles(c, b - a) if moment.bits == 4 else c for c, (a, b) in zip(codes, ranges)])
            mine = full[start:stop]
            out[codes_key] = pack_nibbles(mine) if moment.bits == 4 else mine.clone()
            out[scales_key] = local_scales(moment, shape, local_shape, ranges, scales, start, stop)
        else:
            out[codes_key], out[scales_key] = _relayout(p, moment, codes, scales, shapes)
    return out


def _element_aligned(fmt: Any, block_layout: str) -> bool:
    """Lesson 11's layout: a shard's own blocks, one code per element (its codes can take the parameter's shape)."""
    return block_layout == "local" and fmt is not None and fmt.byte_codes_into_maps


def _row_lengths(shape: tuple[int, ...], world: int, moments: Moments, block_layout: str) -> dict[str, list[int]]:
    """``{key: [elements kept by rank r]}`` of every codes and scales key, on ``world`` ranks: a shard's scales
    are those of the whole tensor's blocks it touches (``"global"``), or of its own blocks."""
    out: dict[str, list[int]] = {}
    for codes_key, (scales_key, moment) in moments.items():
        out[codes_key], out[scales_key] = [], []
        for (a, _), local in zip(shard_ranges(shape, world), shard_shapes(shape, world)):
            out[codes_key].append(moment.codes_numel(math.prod(local)))
            out[scales_key].append(shard_scales_numel(moment, shape, local, a % moment.blocksize)
                                   if block_layout == "global" else moment.scales_numel(local))
    return out


def _relayout(p: torch.Tensor, moment: Any, codes: list[torch.Tensor], scales: list[torch.Tensor],
              shapes: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
    """One state saved on another world size (or by one process) in a shard's own blocks, onto this rank's shard:
    decode every saved shard to fp32 values of the whole tensor, take this rank's range and encode it in this
    rank's layout (blocks of the local shard; rank-1 scales with the whole tensor's maxima, as the sharded step
    keeps them). Each element moves by at most about one step of its map times its new scale. (Transient memory:
    the fp32 values of the whole parameter, one state at a time.)"""
    parts = [moment.dequantize(c, s, shape).reshape(-1) for c, s, shape in zip(codes, scales, shapes)
             if math.prod(shape)]
    full = torch.cat(parts) if parts else torch.zeros(0)
    start, stop = local_range(p)

    def whole(maxima):  # the whole tensor's maxima along every axis but the sharded one
        return [maxima[0]] + rank1_scales(full.view(tuple(p.shape)))[1:]

    return moment.quantize(full[start:stop].contiguous(), tuple(local_tensor(p).shape), whole)


def _aligned_local_state(p: torch.Tensor, saved: dict[str, Any], out: dict[str, Any], moments: Moments) -> dict:
    """:func:`to_local_state` of lesson 11's layout (see the module docstring)."""
    first_codes, (first_scales, first) = next(iter(moments.items()))
    if not any(is_dtensor(saved[k]) for c, (s, _) in moments.items() for k in (c, s)) and \
            not _is_full_form(p, saved[first_codes], saved[first_scales]):
        return out  # already local and plain (a single-process state)
    start, stop = local_range(p)
    for codes_key, (scales_key, moment) in moments.items():
        codes, absmax = saved[codes_key], saved[scales_key]
        if is_dtensor(codes) and is_dtensor(absmax) and is_dtensor(p) and absmax.shape[0] == p.device_mesh.size():
            local_codes = codes.to_local().reshape(-1)
            if local_codes.numel() != stop - start:
                raise ValueError(f"saved {codes_key!r} shard has {local_codes.numel()} codes, expected {stop - start}")
            out[codes_key] = local_codes
            out[scales_key] = absmax.to_local().reshape(-1)[: num_blocks(stop - start, moment.blocksize)]
            continue
        codes, absmax = local_tensor(codes).reshape(-1), local_tensor(absmax)
        out[codes_key], out[scales_key] = _reblock(codes, absmax, p, (start, stop), moment.blocksize, moment.qmap(),
                                                   codes_key)
    return out


def _is_full_form(p: torch.Tensor, codes: torch.Tensor, absmax: torch.Tensor) -> bool:
    """Plain tensors that describe the whole parameter in another layout than this rank's."""
    if codes.numel() == local_tensor(p).numel() and absmax.dim() == 1:
        return False
    return codes.numel() == p.numel()


def _saved_layout(p: torch.Tensor, absmax: torch.Tensor, blocksize: int, key: str) -> list[tuple[int, int]]:
    """Shard ranges of the layout ``absmax`` was saved in; ValueError if its shape fits none."""
    n = p.numel()
    if absmax.dim() == 1:
        ranges = [(0, n)]
        b_max = absmax.numel()
    elif absmax.dim() == 2:
        ranges = shard_ranges(p.shape, absmax.shape[0])
        b_max = absmax.shape[1]
    else:
        raise ValueError(f"saved absmax for {key!r} has shape {tuple(absmax.shape)}; expected (B,) or (world, B_max)")
    expected = num_blocks(ranges[0][1] - ranges[0][0], blocksize)
    if b_max != expected:
        raise ValueError(
            f"saved absmax for {key!r} has shape {tuple(absmax.shape)}, but a parameter of shape "
            f"{tuple(p.shape)} in {len(ranges)} shard(s) of blocks of {blocksize} needs {expected} per shard"
        )
    return ranges


def _reblock(codes, absmax, p, local, blocksize, qmap, key):
    """Dequantize ``[start, stop)`` with the saved blocks, requantize with local blocks; keep
    saved codes/absmax bit for bit where a local block coincides with a saved block."""
    if codes.numel() != p.numel() or codes.dtype != torch.uint8:
        raise ValueError(f"saved {key!r} should be uint8 with {p.numel()} codes, got {codes.dtype}[{codes.numel()}]")
    if absmax.dtype != torch.float32:
        raise ValueError(f"saved absmax for {key!r} should be float32, got {absmax.dtype}")
    ranges = _saved_layout(p, absmax, blocksize, key)
    table = absmax.reshape(len(ranges), -1)
    qmap = qmap.to(codes.device)
    start, stop = local
    n = stop - start
    device = codes.device
    values = torch.empty(n, dtype=torch.float32, device=device)
    for s, (a, b) in enumerate(ranges):
        lo, hi = max(a, start), min(b, stop)
        if lo < hi:
            idx = torch.arange(lo, hi, device=device)
            values[lo - start: hi - start] = qmap[codes[lo:hi].long()] * table[s][(idx - a) // blocksize]
    # local block j covers [g0, g1); it is a saved block if it starts on a saved block boundary
    # of the saved shard holding g0 and ends where that saved block ends
    g0 = start + torch.arange(num_blocks(n, blocksize), device=device) * blocksize
    g1 = (g0 + blocksize).clamp(max=stop)
    starts = torch.tensor([a for a, _ in ranges], device=device)
    stops = torch.tensor([b for _, b in ranges], device=device)
    shard = torch.searchsorted(stops, g0, right=True).clamp(max=len(ranges) - 1)
    offset = g0 - starts[shard]
    same = (offset % blocksize == 0) & (g1 == (g0 + blocksize).minimum(stops[shard]))
    kept = table[shard, (offset // blocksize).clamp(max=table.shape[1] - 1)]
    new_codes, new_absmax = quantize_blocks(values, qmap, blocksize, keep_sign=True)
    if bool(same.any()):
        mask = same.repeat_interleave(blocksize)[:n]
        new_codes[mask] = codes[start:stop][mask]
        new_absmax[same] = kept[same]
    return new_codes, new_absmax


def reshard_tolerance(qmap: torch.Tensor, absmax: torch.Tensor, blocksize: int, n: int) -> torch.Tensor:
    """Per-element bound on how far a resharded load may move a dequantized state: one step
    of the map (its largest gap) times the new block's absmax."""
    gap = float((qmap[1:] - qmap[:-1]).max())
    return (gap * absmax.float()).repeat_interleave(blocksize)[:n]


# ---------------------------------------------------------------------- save / load
#: The key, in a plain parameter's saved state with quantized entries, of the parameter's shape: flat codes and
#: scales do not say it, and a (70, 61) state decoded into a (61, 70) parameter would step without an error
#: (adam8lib.quantized_state refuses it at load). A DCP form keeps the shape in its DTensors instead.
SHAPE_KEY = "param_shape"


def save_checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer, checkpoint_id: str) -> None:
    """Save model and optimizer with ``torch.distributed.checkpoint`` (sharded, one file per rank)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=checkpoint_id)


def load_checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer, checkpoint_id: str) -> None:
    """Load a checkpoint written by :func:`save_checkpoint` on any world size (1 or more).

    Tensors whose saved shape differs from this run's (the low-bit states of another world
    size) are read whole and re-blocked by ``LowBitAdam.load_state_dict``. Everything is read into
    copies first (transient memory: one more copy of the model and optimizer state), so a
    checkpoint that does not fit (missing keys, other shapes, a missing or corrupt shard file)
    raises ValueError and leaves the model and the optimizer as they were.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_optimizer_state_dict

    from torch.utils._pytree import tree_map_only

    try:
        reader = dcp.FileSystemReader(checkpoint_id)
        metadata = reader.read_metadata().state_dict_metadata
    except Exception as e:  # noqa: BLE001 - missing or unreadable .metadata
        raise ValueError(f"{checkpoint_id!r} is not a readable checkpoint: {e}") from e
    model_sd, optim_sd = get_state_dict(model, optimizer)
    # read into copies (state_dict tensors share storage with the live model and optimizer)
    target = tree_map_only(torch.Tensor, lambda t: t.detach().clone(), {"model": model_sd, "optim": optim_sd})
    _fit_to_saved(target, metadata, TensorStorageMetadata)
    for fqn, state in target["optim"].get("state", {}).items():  # checkpoints of sharded parameters have none
        if isinstance(state, dict) and SHAPE_KEY in state and f"optim.state.{fqn}.{SHAPE_KEY}" not in metadata:
            del state[SHAPE_KEY]
    try:
        dcp.load(target, storage_reader=reader)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - CheckpointException is a BaseException
        raise ValueError(f"checkpoint {checkpoint_id!r} could not be read (missing or corrupt shard file?): {e}") from e
    # the optimizer checks everything before it changes anything; then the model
    set_optimizer_state_dict(model, optimizer, optim_state_dict=target["optim"])
    set_model_state_dict(model, target["model"])


def _fit_to_saved(target: dict, metadata: dict, tensor_md: type, prefix: str = "") -> None:
    """Replace every target tensor whose saved global shape differs by a plain tensor of the
    saved shape (DCP then reads it whole); ValueError for a key the checkpoint lacks."""
    for key, value in list(target.items()):
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            _fit_to_saved(value, metadata, tensor_md, name)
        elif isinstance(value, list):
            continue  # param_groups: loaded as bytes, checked by load_state_dict
        elif torch.is_tensor(value):
            md = metadata.get(name)
            if md is None:
                raise ValueError(f"checkpoint has no entry {name!r}: it was saved from another model or optimizer")
            if not isinstance(md, tensor_md):
                raise ValueError(f"checkpoint entry {name!r} is not a tensor")
            if tuple(md.size) != tuple(value.shape):
                if not (name.startswith("optim.") and _reshardable_key(name.rsplit(".", 1)[-1])):
                    raise ValueError(
                        f"checkpoint entry {name!r} has shape {tuple(md.size)}, this run has {tuple(value.shape)}"
                    )
                target[key] = torch.empty(tuple(md.size), dtype=md.properties.dtype, device=local_tensor(value).device)


def _reshardable_key(key: str) -> bool:
    """A saved optimizer state whose global shape depends on the world size: the codes or scales of a storage
    layout (:data:`adam8lib.state_layout.STORED_KEYS`: lesson 07's ``state1``/``absmax1``/..., the family's
    ``<name>_codes``/``<name>_absmax``)."""
    return key in STORED_KEYS or key.endswith("_codes") or key.endswith("_absmax")


# ---------------------------------------------------------------------- the end of a rank
def end_rank(exit_code: int = 0) -> NoReturn:
    """End this rank's process once every rank is done: barrier, destroy the process group,
    flush stdout/stderr, then ``os._exit(exit_code)``.

    For worker scripts (one process per rank, e.g. under ``torchrun``), as their last call.
    ``os._exit`` skips the interpreter's teardown. With gloo on the CPU (torch 2.13), that
    teardown sometimes aborts a rank *after* all its work is done ("terminate called without
    an active exception", SIGABRT, no Python frame left): one rank in a few under a loaded
    machine, which fails a ``torchrun`` job whose results were already written. Every
    collective has finished when the barrier returns, and files written with ``open``/``Path``
    are closed by then, so nothing is lost by skipping the teardown; only ``atexit`` handlers do
    not run. Without an initialized process group it just flushes and exits.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
