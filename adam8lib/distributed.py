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

(The optimizer family, :class:`~adam8lib.quantized_state.QuantizedStateOptimizer`, keeps the whole
tensor's blocks on a shard instead, so its sharded runs equal the unsharded ones bit for bit whatever the
boundaries: :mod:`adam8lib.global_blocks`. Its checkpoints go through :func:`to_checkpoint_state` and
:func:`to_local_state` with ``moments=``, keyed by each rule's ``<name>_codes``/``<name>_absmax``.)

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

from .quant import dequantize_blocks, num_blocks, quantize_blocks

__all__ = [
    "is_dtensor", "local_tensor", "local_param_and_grad", "global_offset", "shard_ranges", "shard_shapes", "local_range",
    "rank1_maxima_reducer",
    "to_checkpoint_state", "to_local_state", "reshard_tolerance",
    "save_checkpoint", "load_checkpoint", "end_rank",
]

_CODES = (("state1", "absmax1"), ("state2", "absmax2"))
_FP32 = ("exp_avg", "exp_avg_sq")


# ---------------------------------------------------------------------- local views
def is_dtensor(t: Any) -> bool:
    """True for a ``torch.distributed.tensor.DTensor``. No DTensor can exist before that module is
    imported, so this never imports it (single-process steps pay nothing)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: ``t.to_local()`` for a DTensor (shares its storage), else ``t``."""
    return t.to_local() if is_dtensor(t) else t


def local_param_and_grad(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(p, p.grad)`` as this rank holds them. A DTensor parameter needs a DTensor gradient
    placed the same way (FSDP2 makes it so); a mix raises TypeError instead of stepping a
    shard with a full gradient."""
    grad = p.grad
    if is_dtensor(p) != is_dtensor(grad):
        raise TypeError(
            f"parameter is a {type(p).__name__} but its gradient is a {type(grad).__name__}: a sharded (DTensor) "
            "parameter needs a DTensor gradient with the same placements"
        )
    if is_dtensor(p):
        if grad.placements != p.placements or grad.device_mesh != p.device_mesh:
            raise TypeError(f"gradient placements {grad.placements} differ from the parameter's {p.placements}")
        return p.to_local(), grad.to_local()
    return p, grad


def global_offset(p: torch.Tensor) -> int:
    """The flat index, in the whole parameter, of the first element this rank holds: 0 for a plain or
    replicated parameter, the start of this rank's chunk for one sharded on dim 0 of a 1-D mesh (FSDP2).
    What keys per-element randomness (stochastic rounding) to the element, not to the shard."""
    if not is_dtensor(p):
        return 0
    from torch.distributed.tensor import Shard

    if not any(isinstance(pl, Shard) for pl in p.placements):
        return 0
    return local_range(p)[0]


def shard_ranges(shape: tuple[int, ...] | torch.Size, world_size: int) -> list[tuple[int, int]]:
    """Flat ``[start, stop)`` element ranges of each rank's shard of a tensor split on dim 0
    into ``world_size`` chunks the way FSDP2 and DTensor ``Shard(0)`` do (``torch.chunk``)."""
    shape = tuple(shape)
    splits = _row_splits(shape, world_size)
    if not shape:
        return [(0, 1)] + [(1, 1)] * (world_size - 1)
    row = math.prod(shape[1:])
    return [(start * row, stop * row) for start, stop in splits]


def _row_splits(shape: tuple[int, ...], world_size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` rows of each rank's chunk of dim 0 (``torch.chunk``'s split: ``ceil(rows / W)``
    rows each, the last ranks fewer or none)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    rows = shape[0] if shape else 1
    per = -(-rows // world_size)
    return [(min(r * per, rows), min((r + 1) * per, rows)) for r in range(world_size)]


def _check_layout(p: torch.Tensor) -> tuple[int, int]:
    """(rank, world size) of a DTensor sharded on dim 0 of a 1-D mesh; clear error otherwise."""
    from torch.distributed.tensor import Shard

    mesh, placements = p.device_mesh, p.placements
    if mesh.ndim != 1 or len(placements) != 1 or not isinstance(placements[0], Shard) or placements[0].dim != 0:
        raise NotImplementedError(
            f"sharded optimizer states (and their checkpoints) support DTensor parameters sharded on dim 0 of a "
            f"1-D mesh (FSDP2's fully_shard); "
            f"got placements {placements} on a {mesh.ndim}-D mesh"
        )
    return mesh.get_local_rank(), mesh.size()


def local_range(p: torch.Tensor) -> tuple[int, int]:
    """Flat ``[start, stop)`` of this rank's shard in the full parameter (``(0, numel)`` if plain)."""
    if not is_dtensor(p):
        return 0, p.numel()
    rank, world = _check_layout(p)
    start, stop = shard_ranges(p.shape, world)[rank]
    if stop - start != p.to_local().numel():
        raise ValueError(f"local shard of shape {tuple(p.to_local().shape)} is not chunk {rank} of {tuple(p.shape)}")
    return start, stop


def shard_shapes(shape: tuple[int, ...] | torch.Size, world_size: int) -> list[tuple[int, ...]]:
    """The local shape of each rank's shard of a tensor split on dim 0 (as :func:`shard_ranges`)."""
    shape = tuple(shape)
    splits = _row_splits(shape, world_size)
    if not shape:
        return [()] + [(0,)] * (world_size - 1)
    return [(stop - start, *shape[1:]) for start, stop in splits]


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
_LOWBIT_KEYS = ("state1", "state2", "absmax1", "absmax2")


def to_checkpoint_state(p: torch.Tensor, state: dict[str, Any], blocksize: int | None, fmt: Any = None, *,
                        moments: dict[str, tuple[str, Any]] | None = None,
                        fp32_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """The DCP form of one parameter's state (see the module docstring); plain params unchanged.
    The fp32 states of a small DTensor parameter become DTensors placed like the parameter.
    ``fmt``: the optimizer's :class:`~adam8lib.formats.StateFormat` (default: the 8-bit format's
    layout). The form is chosen by what the format stores: codes aligned with the elements
    (:attr:`~adam8lib.formats.StateFormat.byte_codes_into_maps`) take the parameter's shape and
    placements; packed codes, rank-1 scales or float8 bytes get :func:`_flat_checkpoint_state`'s form.

    Any other rule's states (the optimizer family, :class:`~adam8lib.quantized_state.QuantizedStateOptimizer`,
    whose shards keep the whole tensor's blocks): ``moments`` names them, ``{codes key: (scales key, moment
    format)}`` (``<name>_codes``/``<name>_absmax`` of each quantized state; ``{}`` if none), and ``fp32_keys``
    its fp32 states; they take the form of :func:`adam8lib.global_blocks.checkpoint_form`."""
    if moments is not None:
        from .global_blocks import checkpoint_form

        return checkpoint_form(p, state, moments, fp32_keys)
    if not is_dtensor(p):
        return state
    from torch.distributed.tensor import DTensor, Shard

    rank, world = _check_layout(p)
    if "state1" in state and fmt is not None and not fmt.byte_codes_into_maps:
        return _flat_checkpoint_state(p, state, fmt, world)
    if "state1" not in state:
        return {
            k: DTensor.from_local(v.view(p.to_local().shape), p.device_mesh, p.placements,
                                  run_check=False, shape=p.shape, stride=p.stride())
            if k in _FP32 and torch.is_tensor(v) else v
            for k, v in state.items()
        }
    ranges = shard_ranges(p.shape, world)
    b_max = num_blocks(ranges[0][1] - ranges[0][0], blocksize)
    local_shape = p.to_local().shape
    out = dict(state)
    for codes_key, absmax_key in _CODES:
        out[codes_key] = DTensor.from_local(
            state[codes_key].view(local_shape), p.device_mesh, p.placements,
            run_check=False, shape=p.shape, stride=p.stride(),
        )
        padded = torch.zeros((1, b_max), dtype=torch.float32, device=state[absmax_key].device)
        padded[0, : state[absmax_key].numel()] = state[absmax_key]
        out[absmax_key] = DTensor.from_local(
            padded, p.device_mesh, [Shard(0)], run_check=False, shape=(world, b_max), stride=(b_max, 1),
        )
    return out


def _flat_checkpoint_state(p: torch.Tensor, state: dict[str, Any], fmt: Any, world: int) -> dict[str, Any]:
    """The DCP form of a sharded parameter's state in a format whose codes do not align with the
    elements (4-bit codes are packed two per byte, so they cannot take the parameter's shape): each of ``state1``,
    ``state2``, ``absmax1``, ``absmax2`` becomes a DTensor of shape ``(W, L_max)`` sharded on dim 0,
    row ``r`` holding rank ``r``'s flat local tensor zero-padded to the longest rank's length.
    Loading on the same world size is bit-identical; another world size decodes and re-encodes
    (:func:`to_local_state`)."""
    from torch.distributed.tensor import DTensor, Shard

    specs = [fmt.state_spec(shape) for shape in shard_shapes(p.shape, world)]
    out = dict(state)
    for key in _LOWBIT_KEYS:
        value = state[key]
        longest = max(spec[key][0] for spec in specs)
        padded = torch.zeros((1, longest), dtype=value.dtype, device=value.device)
        padded[0, : value.numel()] = value.reshape(-1)
        out[key] = DTensor.from_local(padded, p.device_mesh, [Shard(0)], run_check=False,
                                      shape=(world, longest), stride=(longest, 1))
    return out


def _flat_local_state(p: torch.Tensor, saved: dict[str, Any], fmt: Any) -> dict[str, Any]:
    """:func:`to_local_state` for a format whose codes do not align with the elements (the flat form)."""
    if not all(torch.is_tensor(saved.get(k)) for k in _LOWBIT_KEYS):
        return saved  # the state check names what is missing
    local_shape = tuple(local_tensor(p).shape)
    dtensors = [is_dtensor(saved[k]) for k in _LOWBIT_KEYS]
    if is_dtensor(p):
        rank, world = _check_layout(p)
        if all(dtensors) and all(saved[k].dim() == 2 and saved[k].shape[0] == world for k in _LOWBIT_KEYS):
            spec = fmt.state_spec(local_shape)
            out = dict(saved)
            for key in _LOWBIT_KEYS:  # the same layout: this rank's row, bit for bit
                row = saved[key].to_local().reshape(-1)
                if row.numel() < spec[key][0]:
                    raise ValueError(f"saved {key!r} shard has {row.numel()} values, expected {spec[key][0]}")
                out[key] = row[: spec[key][0]]
            return out
    elif not any(dtensors) and all(saved[k].dim() == 1 for k in _LOWBIT_KEYS):
        return saved  # a plain single-process state
    return _relayout(p, saved, fmt)


def _relayout(p: torch.Tensor, saved: dict[str, Any], fmt: Any) -> dict[str, Any]:
    """A state saved on another world size (2-D ``(W, L_max)`` tensors, or a single process's 1-D
    ones), onto this rank's shard: decode every saved shard to fp32 ``m`` and ``v`` of the whole
    tensor, take this rank's range and encode it in this rank's layout (blocks of the local
    shard; rank-1 scales with the whole tensor's maxima, as the sharded step keeps them). Each
    state element moves by at most about one step of its map times its new scale. (Transient
    memory: fp32 ``m`` and ``v`` of the whole parameter, one parameter at a time.)"""
    tensors = {k: local_tensor(saved[k]) for k in _LOWBIT_KEYS}
    dims = {t.dim() for t in tensors.values()}
    if dims == {1}:
        shapes, rows = [tuple(p.shape)], [{k: t for k, t in tensors.items()}]
    elif dims == {2} and len({t.shape[0] for t in tensors.values()}) == 1:
        world = next(iter(tensors.values())).shape[0]
        shapes = shard_shapes(p.shape, world)
        rows = [{k: t[r] for k, t in tensors.items()} for r in range(world)]
    else:
        raise ValueError(f"saved low-bit states of shapes {[tuple(t.shape) for t in tensors.values()]} fit no "
                         f"layout of a parameter of shape {tuple(p.shape)}")
    ms, vs = [], []
    for shape, row in zip(shapes, rows):
        spec = fmt.state_spec(shape)
        for key in _LOWBIT_KEYS:
            count, dtype = spec[key]
            if row[key].dtype != dtype or row[key].numel() < count or (dims == {1} and row[key].numel() != count):
                raise ValueError(
                    f"saved {key!r} is {row[key].dtype}[{row[key].numel()}], but a shard of shape {shape} of a "
                    f"parameter of shape {tuple(p.shape)} in format {fmt.name!r} needs {dtype}[{count}]"
                )
        if not math.prod(shape):
            continue
        m, v = fmt.decode({k: row[k][: spec[k][0]] for k in _LOWBIT_KEYS}, shape)
        ms.append(m)
        vs.append(v)
    m_full, v_full = torch.cat(ms), torch.cat(vs)
    start, stop = local_range(p)
    local_shape = tuple(local_tensor(p).shape)
    out = dict(saved)
    for (codes_key, scales_key), moment, full in zip(_CODES, (fmt.m, fmt.v), (m_full, v_full)):

        def whole(maxima, full=full):  # the whole tensor's maxima along every axis but the sharded one
            from .formats import rank1_scales

            return [maxima[0]] + rank1_scales(full.view(tuple(p.shape)))[1:]

        out[codes_key], out[scales_key] = moment.quantize(full[start:stop].contiguous(), local_shape, whole)
    return out


def to_local_state(
    p: torch.Tensor, saved: dict[str, Any], blocksize: int | None, qmaps: tuple[torch.Tensor, torch.Tensor] | None,
    fmt: Any = None, *, moments: dict[str, tuple[str, Any]] | None = None, fp32_keys: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Turn a loaded per-parameter state into this rank's plain local state.

    Accepts the plain local form (returned as is), the DCP form of the same layout
    (bit-identical), or full tensors of another layout (codes with the full parameter's
    numel, absmax of shape ``(W_saved, B_max)`` or ``(B,)`` for one process): those are
    requantized onto this rank's blocks (see :func:`reshard_tolerance`). Raises ValueError
    if the shapes fit no layout; never changes ``saved``.

    ``moments``/``fp32_keys`` (any other rule's states, see :func:`to_checkpoint_state`): the form of
    :func:`adam8lib.global_blocks.local_form`, loaded on any world size bit for bit.
    """
    if moments is not None:
        from .global_blocks import local_form

        return local_form(p, saved, moments, fp32_keys)
    if "state1" not in saved:
        return {k: (local_tensor(v).reshape(local_tensor(p).shape) if k in _FP32 and is_dtensor(v) else v)
                for k, v in saved.items()}
    if fmt is not None and not fmt.byte_codes_into_maps:
        return _flat_local_state(p, saved, fmt)
    if not all(torch.is_tensor(saved.get(k)) for pair in _CODES for k in pair):
        return saved
    if not any(is_dtensor(saved[k]) for pair in _CODES for k in pair) and not _is_full_form(p, saved, blocksize):
        return saved  # already local and plain (a single-process state)
    start, stop = local_range(p)
    out = dict(saved)
    for (codes_key, absmax_key), qmap in zip(_CODES, qmaps):
        codes, absmax = saved[codes_key], saved[absmax_key]
        if is_dtensor(codes) and is_dtensor(absmax) and is_dtensor(p) and absmax.shape[0] == p.device_mesh.size():
            local_codes = codes.to_local().reshape(-1)
            if local_codes.numel() != stop - start:
                raise ValueError(f"saved {codes_key!r} shard has {local_codes.numel()} codes, expected {stop - start}")
            out[codes_key] = local_codes
            out[absmax_key] = absmax.to_local().reshape(-1)[: num_blocks(stop - start, blocksize)]
            continue
        codes, absmax = local_tensor(codes).reshape(-1), local_tensor(absmax)
        out[codes_key], out[absmax_key] = _reblock(codes, absmax, p, (start, stop), blocksize, qmap, codes_key)
    return out


def _is_full_form(p: torch.Tensor, saved: dict[str, Any], blocksize: int) -> bool:
    """Plain tensors that describe the whole parameter in another layout than this rank's."""
    n_local = local_tensor(p).numel()
    codes, absmax = saved["state1"], saved["absmax1"]
    if codes.numel() == n_local and absmax.dim() == 1:
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
    """A saved optimizer state whose global shape depends on the world size: Adam's codes and scales
    (``state1``/``absmax1``/...) or a family rule's (``<name>_codes``/``<name>_absmax``)."""
    return key in _LOWBIT_KEYS or key.endswith("_codes") or key.endswith("_absmax")


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
