"""The 4-bit state formats' fused Adam step in Triton (``"4bit"``, ``"4bit-naive"``): two codes per byte,
rank-1 scales for ``v`` of a matrix, on lesson 08's tile helpers (:mod:`adam8lib.kernels.triton`: the
moments, the parameter update, blockwise coding; :mod:`.triton_codes`: the 16-entry nearest code).
The layout and the two passes are described in :mod:`adam8lib.kernels.triton`'s docstring ("The 4-bit
formats"). States bit for bit the reference step's in the interpreter (tests/kernels/test_triton_4bit.py)."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..quant import check_blocksize, num_blocks
from . import register_adam_step
from . import triton as lesson
from .contract import check_step
from .reference import bias_corrections, format_reference_step
from .triton import FLT_MAX, INTERPRETED, INTERPRETER_TILE_ELEMENTS, TILE_ELEMENTS  # noqa: F401
from .triton import moments as _moments, quantize_tile as _quantize_tile, store_param as _store_param
from .triton import tile as _tile, to_dtype as _to_dtype  # noqa: F401
from .triton_codes import nearest_code16 as _nearest_code16

__all__ = ["adam4bit_step_triton", "rank1_tile"]


@triton.jit
def _unpack_tile(bytes_ptr, byte_offsets, byte_mask):
    """The 4-bit codes (int32) of a [ROWS, BLOCKSIZE] tile from its [ROWS, BLOCKSIZE // 2] bytes:
    element 2i is byte i's high nibble, element 2i + 1 its low one (interleaved back in order)."""
    b = tl.load(bytes_ptr + byte_offsets, mask=byte_mask, other=0).to(tl.int32)
    return tl.interleave(b >> 4, b & 0x0F)


@triton.jit
def _pack_tile(codes, mask, ROWS: tl.constexpr, BLOCKSIZE: tl.constexpr):
    """The bytes of a [ROWS, BLOCKSIZE] tile of 4-bit codes: ``even << 4 | odd``; an element outside
    ``mask`` (the pad of an odd count) gets code 0, as :func:`adam8lib.formats.pack_nibbles` pads."""
    codes = tl.where(mask, codes, 0)
    even, odd = tl.split(tl.reshape(codes, (ROWS, BLOCKSIZE // 2, 2)))
    return ((even << 4) | odd).to(tl.uint8)


@triton.jit
def _rank1_scale(scales_ptr, rows, cols, d0, d1, d2, mask, NDIM: tl.constexpr):
    """The rank-1 scale of each element: the smallest of the maxima along every axis that meet there.
    ``scales`` holds the maxima of axis 0, then axis 1, ... (absmax2's layout); the tensor has shape
    ``(d0, n_cols)``, ``(d0, d1, n_cols)`` or ``(d0, d1, d2, n_cols)`` (``NDIM`` = 2, 3, 4) and an
    element is given by its row of the ``(n / n_cols, n_cols)`` view and its column (last index)."""
    if NDIM == 2:
        scale = tl.minimum(tl.load(scales_ptr + rows, mask=mask, other=0.0),
                           tl.load(scales_ptr + d0 + cols, mask=mask, other=0.0))
    elif NDIM == 3:
        i0 = rows // d1
        i1 = rows - i0 * d1
        scale = tl.minimum(tl.minimum(tl.load(scales_ptr + i0, mask=mask, other=0.0),
                                      tl.load(scales_ptr + d0 + i1, mask=mask, other=0.0)),
                           tl.load(scales_ptr + d0 + d1 + cols, mask=mask, other=0.0))
    else:
        i01 = rows // d2
        i2 = rows - i01 * d2
        i0 = i01 // d1
        i1 = i01 - i0 * d1
        scale = tl.minimum(tl.minimum(tl.load(scales_ptr + i0, mask=mask, other=0.0),
                                      tl.load(scales_ptr + d0 + i1, mask=mask, other=0.0)),
                           tl.minimum(tl.load(scales_ptr + d0 + d1 + i2, mask=mask, other=0.0),
                                      tl.load(scales_ptr + d0 + d1 + d2 + cols, mask=mask, other=0.0)))
    return scale


@triton.jit
def _adam4bit_kernel(p_ptr, g_ptr, state1_ptr, state2_ptr, absmax1_ptr, absmax2_ptr, qmap1_ptr, qmap2_ptr,
                     new_absmax2_ptr, n, n_blocks, n_cols, d0, d1, d2,
                     beta1, one_minus_beta1, beta2, one_minus_beta2, eps,
                     decay, neg_step_size, bias_correction2_sqrt,
                     BLOCKSIZE: tl.constexpr, ROWS: tl.constexpr, DECAY: tl.constexpr,
                     RESET_KEEPS_P: tl.constexpr, INT64: tl.constexpr, RANK1: tl.constexpr,
                     NDIM: tl.constexpr = 2):
    """The 4-bit step of one [ROWS, BLOCKSIZE] tile (whole blocks of the flat tensor), in place.

    m is blockwise; v blockwise too, or (``RANK1``, a tensor of ``NDIM`` dimensions, the last
    ``n_cols`` long, see :func:`_rank1_scale`) scaled per element by the smallest of its axes' maxima
    (a matrix: min(row max, column max)): decoded with the old maxima in ``absmax2``, encoded with
    the new ones in ``new_absmax2`` (from pass 1; the launcher copies them over after)."""
    blocks, offsets, mask = _tile(n, BLOCKSIZE, ROWS, INT64)
    block_mask = blocks < n_blocks
    byte_offsets = blocks[:, None] * (BLOCKSIZE // 2) + tl.arange(0, BLOCKSIZE // 2)[None, :]
    byte_mask = byte_offsets * 2 < n

    # 1. decode: m = qmap1[code] * absmax1[block], v = qmap2[code] * (absmax2[block] or its rank-1 scale)
    absmax1 = tl.load(absmax1_ptr + blocks, mask=block_mask, other=0.0)
    m = tl.load(qmap1_ptr + _unpack_tile(state1_ptr, byte_offsets, byte_mask)) * absmax1[:, None]
    if RANK1:
        rows = offsets // n_cols
        cols = offsets - rows * n_cols
        v = tl.load(qmap2_ptr + _unpack_tile(state2_ptr, byte_offsets, byte_mask)) * \
            _rank1_scale(absmax2_ptr, rows, cols, d0, d1, d2, mask, NDIM)
    else:
        absmax2 = tl.load(absmax2_ptr + blocks, mask=block_mask, other=0.0)
        v = tl.load(qmap2_ptr + _unpack_tile(state2_ptr, byte_offsets, byte_mask)) * absmax2[:, None]

    # 2-3. the moments and the parameter, as the 8-bit tile
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    m, v, finite = _moments(m, v, g, mask, beta1, one_minus_beta1, beta2, one_minus_beta2)
    _store_param(p_ptr, offsets, mask, m, v, finite, eps, decay, neg_step_size, bias_correction2_sqrt,
                 DECAY, RESET_KEEPS_P)

    # 4. encode: nearest codes (no sign rule), two per byte
    code1, absmax1 = _quantize_tile(m, qmap1_ptr, qmap1_ptr, False, False, MAP16=True)
    tl.store(absmax1_ptr + blocks, absmax1, mask=block_mask)
    if RANK1:
        scale = _rank1_scale(new_absmax2_ptr, rows, cols, d0, d1, d2, mask, NDIM)
        inv = tl.where(scale > 0, tl.math.div_rn(1.0, tl.where(scale > 0, scale, 1.0)), 0.0)
        code2 = _nearest_code16(v * inv, qmap2_ptr)
    else:
        code2, absmax2 = _quantize_tile(v, qmap2_ptr, qmap2_ptr, False, False, MAP16=True)
        tl.store(absmax2_ptr + blocks, absmax2, mask=block_mask)
    tl.store(state1_ptr + byte_offsets, _pack_tile(code1, mask, ROWS, BLOCKSIZE), mask=byte_mask)
    tl.store(state2_ptr + byte_offsets, _pack_tile(code2, mask, ROWS, BLOCKSIZE), mask=byte_mask)


@triton.jit
def _rank1_max_kernel(g_ptr, state1_ptr, state2_ptr, absmax1_ptr, absmax2_ptr, qmap1_ptr, qmap2_ptr,
                      maxima_ptr, n_rows, n_cols, d0, d1, d2,
                      beta1, one_minus_beta1, beta2, one_minus_beta2,
                      BLOCKSIZE: tl.constexpr, TILE_R: tl.constexpr, TILE_C: tl.constexpr, INT64: tl.constexpr,
                      NDIM: tl.constexpr = 2):
    """Pass 1 of the rank-1 step: the row and column maxima of the new v of the ``n_rows x n_cols``
    view of the tensor (``n_cols`` its last dimension), into ``maxima`` (int32 bit patterns of fp32
    >= 0, which order as the floats do; zeroed by the launcher; rows then columns: for a matrix,
    absmax2's layout; for more dimensions the launcher reduces the row maxima to each leading axis's). A program takes a [TILE_R, TILE_C] tile,
    computes the new m and v exactly as :func:`_adam4bit_kernel` will (so the same elements are
    reset), and merges its rows' and columns' maxima with ``atomic_max``: max is order-free, so the
    result does not depend on the programs' order. Nothing else is written."""
    if INT64:
        rows = tl.program_id(0).to(tl.int64) * TILE_R + tl.arange(0, TILE_R)
    else:
        rows = tl.program_id(0) * TILE_R + tl.arange(0, TILE_R)
    cols = tl.program_id(1) * TILE_C + tl.arange(0, TILE_C)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    offsets = rows[:, None] * n_cols + cols[None, :]
    rows2 = rows[:, None] + tl.zeros_like(offsets)
    cols2 = cols[None, :] + tl.zeros_like(offsets)
    shift = 4 - 4 * (offsets & 1)  # element 2i: high nibble, 2i + 1: low nibble
    code1 = (tl.load(state1_ptr + (offsets >> 1), mask=mask, other=0).to(tl.int32) >> shift) & 0x0F
    code2 = (tl.load(state2_ptr + (offsets >> 1), mask=mask, other=0).to(tl.int32) >> shift) & 0x0F
    m = tl.load(qmap1_ptr + code1) * tl.load(absmax1_ptr + offsets // BLOCKSIZE, mask=mask, other=0.0)
    v = tl.load(qmap2_ptr + code2) * _rank1_scale(absmax2_ptr, rows2, cols2, d0, d1, d2, mask, NDIM)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    m, v, finite = _moments(m, v, g, mask, beta1, one_minus_beta1, beta2, one_minus_beta2)
    v = tl.abs(v)
    tl.atomic_max(maxima_ptr + rows, tl.max(v, axis=1).to(tl.int32, bitcast=True), mask=row_ok)
    tl.atomic_max(maxima_ptr + n_rows + cols, tl.max(v, axis=0).to(tl.int32, bitcast=True), mask=col_ok)



_MAPS4: dict[tuple, torch.Tensor] = {}


def _map_on(fmt_moment, device: torch.device) -> torch.Tensor:
    """A moment format's 16-entry map on ``device`` (cached)."""
    key = (fmt_moment.map_builder, device)
    table = _MAPS4.get(key)
    if table is None:
        table = _MAPS4[key] = fmt_moment.qmap().to(device=device, dtype=torch.float32).contiguous()
    return table


def rank1_tile(n_rows: int, n_cols: int, tile: int | None = None) -> tuple[int, int]:
    """``(TILE_R, TILE_C)`` of the rank-1 maxima pass: ``tile`` elements (defaults as
    :func:`launch_config`'s), at most 128 columns wide (or the matrix's width, rounded up to a power of
    two), as many rows as fill the tile (at most the matrix's height, rounded up). A row's maximum is
    then merged from ``cols / 128`` programs, a column's from ``rows / TILE_R``."""
    if tile is None:
        tile = INTERPRETER_TILE_ELEMENTS if INTERPRETED else TILE_ELEMENTS
    tile_c = min(triton.next_power_of_2(n_cols), 128, tile)
    tile_r = max(1, min(tile // tile_c, triton.next_power_of_2(n_rows)))
    return tile_r, tile_c


@torch.no_grad()
def adam4bit_step_triton(p: torch.Tensor, g: torch.Tensor, state: dict, fmt, *, shape: tuple[int, ...], step: int,
                         lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                         tile: int | None = None, num_warps: int | None = None) -> None:
    """One fused Adam/AdamW step of a 4-bit state format (``"4bit"``, ``"4bit-naive"``, or one with
    another block size: ``fmt`` is the :class:`~adam8lib.formats.StateFormat`), in place on the flat
    contiguous ``p`` and ``g`` of a tensor of ``shape`` and its ``state`` (``state1``/``state2``:
    packed codes, ``absmax1``/``absmax2``). Gives the reference step's (:func:`adam8lib.kernels.reference.format_reference_step`)
    states bit for bit (CPU, interpreter).

    Blockwise moments take one pass (``_adam4bit_kernel``). v with rank-1 scales (a matrix) takes
    two: ``_rank1_max_kernel`` reduces the new v's row and column maxima into a separate buffer,
    then ``_adam4bit_kernel`` recomputes the same new m and v, updates p and encodes, decoding v
    with the old maxima and encoding it with the new ones, which then replace the old. Tensors of 3
    or 4 dimensions (a scale is the smallest of every axis's maxima) run the same on their
    ``(n / last dimension, last dimension)`` view (:func:`_rank1_scale`, :func:`_axis_maxima`); with
    5 or more, the reference step runs instead."""
    n = p.numel()
    _check_4bit_step(p, g, state, fmt, shape)
    check_step(step)
    lesson.check_runnable(p.device)
    if n == 0:
        return
    shape = tuple(shape)
    rank1 = fmt.v.uses_rank1(shape)
    if rank1 and len(shape) > 4:
        format_reference_step(p, g, state, fmt, shape=shape, step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                              weight_decay=weight_decay)
        return
    blocksize = fmt.m.blocksize
    n_cols = shape[-1] if rank1 else n
    n_rows = n // n_cols
    d0, d1, d2 = (tuple(shape[:-1]) + (1, 1))[:3] if rank1 else (1, 1, 1)
    ndim = len(shape) if rank1 else 2
    qmap1, qmap2 = _map_on(fmt.m, p.device), _map_on(fmt.v, p.device)
    state1, state2, absmax1, absmax2 = (state[k] for k in ("state1", "state2", "absmax1", "absmax2"))
    step_size, bias_correction2_sqrt = bias_corrections(step, lr, beta1, beta2)
    decay, neg_step_size = 1.0 - lr * weight_decay, -step_size
    moments = (beta1, 1.0 - beta1, beta2, 1.0 - beta2)
    n_blocks = num_blocks(n, blocksize)
    rows, warps = lesson.launch_config(blocksize, tile, num_warps)
    flags = lesson.step_specialization(n_blocks * blocksize, rows * blocksize, decay=decay, neg_step_size=neg_step_size,
                                bias_correction2_sqrt=bias_correction2_sqrt, eps=eps)
    new_absmax2 = absmax2
    if rank1:
        maxima = torch.zeros(n_rows + n_cols, dtype=torch.float32, device=p.device)
        tile_r, tile_c = rank1_tile(n_rows, n_cols, tile)
        grid = (triton.cdiv(n_rows, tile_r), triton.cdiv(n_cols, tile_c))
        _rank1_max_kernel[grid](g, state1, state2, absmax1, absmax2, qmap1, qmap2, maxima.view(torch.int32),
                                n_rows, n_cols, d0, d1, d2, *moments, BLOCKSIZE=blocksize, TILE_R=tile_r,
                                TILE_C=tile_c, INT64=flags["INT64"], NDIM=ndim,
                                num_warps=min(16, max(1, tile_r * tile_c // 256)), enable_fp_fusion=False)
        new_absmax2 = maxima if ndim == 2 else _axis_maxima(maxima, shape)
    lesson.launch(_adam4bit_kernel, n_blocks, rows, warps,
            p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, new_absmax2, n, n_blocks, n_cols, d0, d1, d2,
            *moments, eps, decay, neg_step_size, bias_correction2_sqrt,
            BLOCKSIZE=blocksize, RANK1=rank1, NDIM=ndim, **flags)
    if rank1:
        absmax2.copy_(new_absmax2)


def _axis_maxima(maxima: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """absmax2 of a tensor of 3 or 4 dimensions from pass 1's maxima of its ``(n / last, last)`` view:
    each leading axis's maxima are maxima of the view's row maxima (exact: a max of maxima), then
    the last axis's (the view's column maxima)."""
    lead = len(shape) - 1
    rows = maxima[: maxima.numel() - shape[-1]].view(shape[:-1])
    parts = [rows.amax(dim=tuple(d for d in range(lead) if d != axis)) for axis in range(lead)]
    return torch.cat(parts + [maxima[maxima.numel() - shape[-1]:]])


def _check_4bit_step(p, g, state, fmt, shape) -> None:
    """What :func:`adam4bit_step_triton` needs: a 4-bit map format with one block size, flat
    contiguous p and g of ``shape``'s size, and states of the format's layout on p's device."""
    if fmt.m.coding != "map" or fmt.v.coding != "map" or fmt.m.bits != 4 or fmt.v.bits != 4 or fmt.m.keep_sign \
            or fmt.v.keep_sign or fmt.m.rank1 or not fmt.one_blocksize:
        raise ValueError(f"the 4-bit Triton step runs 4-bit map formats without keep_sign, got {fmt.name!r}")
    for moment in (fmt.m, fmt.v):
        if moment.qmap().numel() != 16:
            raise ValueError(f"the 4-bit Triton step needs 16-entry maps, {moment.map_name} has {moment.qmap().numel()}")
    check_blocksize(fmt.m.blocksize)
    n = math.prod(shape)
    for name, t in (("p", p), ("g", g)):
        if t.dim() != 1 or t.numel() != n or not t.is_contiguous():
            raise ValueError(f"{name} must be flat and contiguous with {n} elements (shape {tuple(shape)}), "
                             f"got {tuple(t.shape)}")
        if t.dtype not in lesson.PARAM_DTYPES:
            raise TypeError(f"{name} must have dtype in {[str(d) for d in lesson.PARAM_DTYPES]}, got {t.dtype}")
        if t.device != p.device:
            raise ValueError(f"{name} is on {t.device}, p on {p.device}")
    if p.device.type not in ("cpu", "cuda"):
        raise ValueError(f"the triton backend needs CUDA (or CPU under TRITON_INTERPRET=1) tensors; p is on {p.device}")
    for key, (count, dtype) in fmt.state_spec(tuple(shape)).items():
        t = state[key]
        if t.dtype != dtype or t.numel() != count or t.dim() != 1 or not t.is_contiguous() or t.device != p.device:
            raise ValueError(f"state[{key!r}] must be a flat contiguous {dtype} tensor of {count} elements on "
                             f"{p.device}, got {t.dtype} {tuple(t.shape)} on {t.device}")


def _4bit_adam_step(p, g, state, fmt, *, shape, **hyperparameters) -> None:
    """:func:`adam4bit_step_triton` as the 4-bit formats' fused step (:func:`adam8lib.kernels.register_adam_step`)."""
    adam4bit_step_triton(p, g, state, fmt, shape=shape, **hyperparameters)


register_adam_step("4bit", "triton", _4bit_adam_step)
register_adam_step("4bit-naive", "triton", _4bit_adam_step)
