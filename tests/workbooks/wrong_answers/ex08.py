"""Workbook 08 · Triton kernels: what learners write instead of the solution (run in Triton's interpreter
on a CPU, ``TRITON_INTERPRET=1``, set here before triton is imported)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any @triton.jit below
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from adam8lib.course import checks  # noqa: E402
from tests.workbooks.wrong_answers import Right, Wrong  # noqa: E402

ABSMAX, DEQ = checks.check_absmax_kernel, checks.check_dequantize_kernel
QUANT, EMA = checks.check_quantize_kernel, checks.check_ema_requantize_kernel


# ------------------------------------------------------------------ 08.1 · absmax per block
@triton.jit
def absmax_no_mask(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(absmax_ptr + pid, tl.max(tl.abs(x), axis=0))


@triton.jit
def absmax_other_one(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=1.0)  # the fill value takes part in the max
    tl.store(absmax_ptr + pid, tl.max(tl.abs(x), axis=0))


@triton.jit
def absmax_mask_le(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs <= n, other=0.0)  # one element too many
    tl.store(absmax_ptr + pid, tl.max(tl.abs(x), axis=0))


@triton.jit
def absmax_signed(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(absmax_ptr + pid, tl.max(x, axis=0))


@triton.jit
def absmax_abs_after_max(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(absmax_ptr + pid, tl.abs(tl.max(x, axis=0)))


@triton.jit
def absmax_no_pid_offset(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)  # every program reads block 0
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(absmax_ptr + pid, tl.max(tl.abs(x), axis=0))


@triton.jit
def absmax_pid_not_scaled(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid + tl.arange(0, BLOCK)  # pid, not pid * BLOCK
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(absmax_ptr + pid, tl.max(tl.abs(x), axis=0))


@triton.jit
def absmax_store_at_zero(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(absmax_ptr, tl.max(tl.abs(x), axis=0))  # no + pid


@triton.jit
def absmax_store_per_lane(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    amax = tl.max(tl.abs(x), axis=0)
    tl.store(absmax_ptr + offs, amax + tl.zeros([BLOCK], dtype=tl.float32), mask=offs < n)  # one store per lane


@triton.jit
def absmax_program_id_1(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(1)  # the grid is 1-D: always 0
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(absmax_ptr + pid, tl.max(tl.abs(x), axis=0))


@triton.jit
def absmax_no_store(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    absmax = tl.max(tl.abs(x), axis=0)  # computed, never stored  # noqa: F841


def absmax_not_jitted(x_ptr, absmax_ptr, n, BLOCK):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(absmax_ptr + pid, tl.max(tl.abs(x), axis=0))


@triton.jit
def absmax_maximum_of_x_and_minus_x(x_ptr, absmax_ptr, n, BLOCK: tl.constexpr):
    """Right: |x| as max(x, -x), the mask applied with tl.where after an unmasked-safe load."""
    pid = tl.program_id(axis=0)
    offs = tl.arange(0, BLOCK) + BLOCK * pid
    inside = offs < n
    x = tl.load(x_ptr + offs, mask=inside, other=123.0)
    mag = tl.where(inside, tl.maximum(x, -x), 0.0)
    tl.store(absmax_ptr + pid, tl.max(mag, axis=0))


# ------------------------------------------------------------------ 08.2 · dequantize
@triton.jit
def deq_no_mask(codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    codes = tl.load(codes_ptr + offs).to(tl.int32)
    tl.store(out_ptr + offs, tl.load(qmap_ptr + codes) * tl.load(absmax_ptr + pid))


@triton.jit
def deq_no_lookup(codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    codes = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.float32)
    tl.store(out_ptr + offs, codes * tl.load(absmax_ptr + pid), mask=mask)


@triton.jit
def deq_absmax_zero(codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    codes = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
    tl.store(out_ptr + offs, tl.load(qmap_ptr + codes, mask=mask, other=0.0) * tl.load(absmax_ptr), mask=mask)


@triton.jit
def deq_no_scale(codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    codes = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
    tl.store(out_ptr + offs, tl.load(qmap_ptr + codes, mask=mask, other=0.0), mask=mask)


@triton.jit
def deq_divide(codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    codes = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
    tl.store(out_ptr + offs, tl.load(qmap_ptr + codes, mask=mask, other=0.0) / tl.load(absmax_ptr + pid), mask=mask)


@triton.jit
def deq_pid_not_scaled(codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid + tl.arange(0, BLOCK)
    mask = offs < n
    codes = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
    tl.store(out_ptr + offs, tl.load(qmap_ptr + codes, mask=mask, other=0.0) * tl.load(absmax_ptr + pid), mask=mask)


@triton.jit
def deq_absmax_per_element(codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    codes = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
    scale = tl.load(absmax_ptr + offs, mask=mask, other=0.0)  # absmax has one entry per BLOCK
    tl.store(out_ptr + offs, tl.load(qmap_ptr + codes, mask=mask, other=0.0) * scale, mask=mask)


@triton.jit
def deq_store_unmasked(codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    codes = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
    tl.store(out_ptr + offs, tl.load(qmap_ptr + codes) * tl.load(absmax_ptr + pid))  # loads masked, store not


@triton.jit
def deq_int64_gather(codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Right: int64 offsets, one mask reused, the scale broadcast by multiplication."""
    pid = tl.program_id(axis=0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    idx = tl.load(codes_ptr + offs, mask=valid, other=127).to(tl.int64)
    values = tl.load(qmap_ptr + idx)
    tl.store(out_ptr + offs, tl.load(absmax_ptr + pid) * values, mask=valid)


# ------------------------------------------------------------------ 08.3 · nearest code by binary search
@triton.jit
def _last_le(x, qmap_ptr, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    lo = tl.zeros([BLOCK], dtype=tl.int32)
    for s in tl.static_range(STEPS):
        probe = lo + ((128 >> (8 - STEPS)) >> s)
        lo = tl.where(tl.load(qmap_ptr + probe) <= x, probe, lo)
    return lo


@triton.jit
def _quantize(x_ptr, absmax_ptr, qmap_ptr, codes_ptr, n, BLOCK: tl.constexpr, GUARD: tl.constexpr,
              TIE_UP: tl.constexpr, PICK: tl.constexpr, STEPS: tl.constexpr, CLAMP: tl.constexpr,
              MASK_STORE: tl.constexpr, SCALE: tl.constexpr):
    """The solution with switches (PICK: 0 nearest, 1 always lo, 2 always hi; SCALE: 0 divide by
    absmax[pid], 1 multiply, 2 divide by absmax[0])."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if SCALE == 2:
        scale = tl.load(absmax_ptr)
    else:
        scale = tl.load(absmax_ptr + pid)
    if GUARD:
        scale = tl.where(scale > 0, scale, 1.0)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if SCALE == 1:
        x = x * scale
    else:
        x = x / scale
    lo = _last_le(x, qmap_ptr, BLOCK, STEPS)
    if CLAMP:
        hi = tl.minimum(lo + 1, 255)
    else:
        hi = lo + 1
    below, above = tl.load(qmap_ptr + lo), tl.load(qmap_ptr + hi)
    if TIE_UP:
        codes = tl.where(above - x <= x - below, hi, lo)
    else:
        codes = tl.where(above - x < x - below, hi, lo)
    if PICK == 1:
        codes = lo
    if PICK == 2:
        codes = hi
    if MASK_STORE:
        tl.store(codes_ptr + offs, codes.to(tl.uint8), mask=mask)
    else:
        tl.store(codes_ptr + offs, codes.to(tl.uint8))


class _Switched:
    """``_quantize`` with its switches bound, launched like a learner's kernel: ``kernel[grid](...)``.
    Each instance stands for the kernel a learner wrote with that one slip."""

    def __init__(self, name, **switches):
        self.__name__ = name
        self.switches = dict(GUARD=True, TIE_UP=False, PICK=0, STEPS=8, CLAMP=True, MASK_STORE=True, SCALE=0)
        self.switches.update(switches)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: _quantize[grid](*args, **kwargs, **self.switches)

    def __call__(self, *args, **kwargs):
        raise RuntimeError("launch it as kernel[grid](...)")


if not torch.cuda.is_available():
    _Switched.__name__ = "InterpretedFunction"  # the check's test for "built in interpreter mode"


@triton.jit
def quantize_ties_from_below(x_ptr, absmax_ptr, qmap_ptr, codes_ptr, n, BLOCK: tl.constexpr):
    """Right: the same search written with a Python-unrolled step list and the tie test turned round
    (keep lo unless hi is strictly closer <=> take lo when x - below <= above - x)."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    absmax = tl.load(absmax_ptr + pid)
    safe = tl.where(absmax == 0.0, 1.0, absmax)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0) / safe
    idx = tl.full([BLOCK], 0, tl.int32)
    for step in tl.static_range(7, -1, -1):
        cand = idx + (1 << step)
        idx = tl.where(tl.load(qmap_ptr + cand) <= x, cand, idx)
    nxt = tl.where(idx < 255, idx + 1, idx)
    lower, upper = tl.load(qmap_ptr + idx), tl.load(qmap_ptr + nxt)
    tl.store(codes_ptr + offs, tl.where(x - lower <= upper - x, idx, nxt).to(tl.uint8), mask=mask)


# ------------------------------------------------------------------ 08.4 · the fused 8-bit EMA
@triton.jit
def _ema(codes_ptr, absmax_ptr, g_ptr, qmap_ptr, n, beta, BLOCK: tl.constexpr, ZERO_MASKED: tl.constexpr,
         ABS: tl.constexpr, NEW_ABSMAX: tl.constexpr, SWAP_BETA: tl.constexpr, MASK_STORE: tl.constexpr,
         NORM_OLD: tl.constexpr, STORE_ABSMAX: tl.constexpr, SCALE_IN: tl.constexpr, GUARD: tl.constexpr,
         TIE_UP: tl.constexpr, PER_LANE_ABSMAX: tl.constexpr):
    """The solution with switches, one per slip."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    old = tl.load(absmax_ptr + pid)
    m = tl.load(qmap_ptr + tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32))
    if SCALE_IN:
        m = m * old
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    if SWAP_BETA:
        m = (1 - beta) * m + beta * g
    else:
        m = beta * m + (1 - beta) * g
    if ZERO_MASKED:
        m = tl.where(mask, m, 0.0)
    if ABS:
        scale = tl.max(tl.abs(m), axis=0)
    else:
        scale = tl.max(m, axis=0)
    if not NEW_ABSMAX:
        scale = old
    norm = scale
    if NORM_OLD:
        norm = old
    if GUARD:
        norm = tl.where(norm > 0, norm, 1.0)
    x = m / norm
    lo = tl.zeros([BLOCK], dtype=tl.int32)
    for s in tl.static_range(8):
        probe = lo + (128 >> s)
        lo = tl.where(tl.load(qmap_ptr + probe) <= x, probe, lo)
    hi = tl.minimum(lo + 1, 255)
    if TIE_UP:
        codes = tl.where(tl.load(qmap_ptr + hi) - x <= x - tl.load(qmap_ptr + lo), hi, lo)
    else:
        codes = tl.where(tl.load(qmap_ptr + hi) - x < x - tl.load(qmap_ptr + lo), hi, lo)
    if MASK_STORE:
        tl.store(codes_ptr + offs, codes.to(tl.uint8), mask=mask)
    else:
        tl.store(codes_ptr + offs, codes.to(tl.uint8))
    if PER_LANE_ABSMAX:  # the scalar broadcast over the block's lanes, stored at absmax_ptr + offs
        tl.store(absmax_ptr + offs, scale + tl.zeros([BLOCK], dtype=tl.float32), mask=mask)
    elif STORE_ABSMAX:
        tl.store(absmax_ptr + pid, scale)


class _SwitchedEma(_Switched):
    """``_ema`` with its switches bound (one slip each), launched as ``kernel[grid](...)``."""

    def __init__(self, name, **switches):
        self.__name__ = name
        self.switches = dict(ZERO_MASKED=True, ABS=True, NEW_ABSMAX=True, SWAP_BETA=False, MASK_STORE=True,
                             NORM_OLD=False, STORE_ABSMAX=True, SCALE_IN=True, GUARD=True, TIE_UP=False,
                             PER_LANE_ABSMAX=False)
        self.switches.update(switches)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: _ema[grid](*args, **kwargs, **self.switches)


if not torch.cuda.is_available():
    _SwitchedEma.__name__ = "InterpretedFunction"


@triton.jit
def ema_two_passes_in_registers(codes_ptr, absmax_ptr, g_ptr, qmap_ptr, n, beta, BLOCK: tl.constexpr):
    """Right: the EMA written as m + (1 - beta) * (g - m), masked lanes dropped from the max with -1 (|m| >= 0),
    the nearest code chosen by comparing distances with tl.abs."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    m = tl.load(qmap_ptr + tl.load(codes_ptr + offs, mask=valid, other=127).to(tl.int32)) * tl.load(absmax_ptr + pid)
    g = tl.load(g_ptr + offs, mask=valid, other=0.0)
    m = m + (1 - beta) * (g - m)
    new_absmax = tl.max(tl.where(valid, tl.abs(m), -1.0), axis=0)
    x = m / tl.where(new_absmax > 0, new_absmax, 1.0)
    lo = tl.zeros([BLOCK], dtype=tl.int32)
    for s in tl.static_range(8):
        probe = lo + (128 >> s)
        lo = tl.where(tl.load(qmap_ptr + probe) <= x, probe, lo)
    hi = tl.minimum(lo + 1, 255)
    d_lo, d_hi = tl.abs(x - tl.load(qmap_ptr + lo)), tl.abs(tl.load(qmap_ptr + hi) - x)
    tl.store(codes_ptr + offs, tl.where(d_hi < d_lo, hi, lo).to(tl.uint8), mask=valid)
    tl.store(absmax_ptr + pid, new_absmax)


WRONG = [
    Wrong("08.1", ABSMAX, absmax_no_mask, "load without a mask", "read past the end of x", True),
    Wrong("08.1", ABSMAX, absmax_other_one, "masked lanes filled with other=1.0", "filled with other=1.0", True),
    Wrong("08.1", ABSMAX, absmax_mask_le, "mask offs <= n (one element too many)", "read past the end of x", True),
    Wrong("08.1", ABSMAX, absmax_signed, "tl.max(x) without tl.abs", "you took the max of x itself", True),
    Wrong("08.1", ABSMAX, absmax_abs_after_max, "tl.abs(tl.max(x)): abs after the max", "or tl.abs after the max", True),
    Wrong("08.1", ABSMAX, absmax_no_pid_offset, "offsets tl.arange(0, BLOCK) without pid", "every program read (almost) block 0",
          True),
    Wrong("08.1", ABSMAX, absmax_pid_not_scaled, "offsets pid + arange (pid not times BLOCK)",
          "not at 0, and not at pid", True),
    Wrong("08.1", ABSMAX, absmax_store_at_zero, "store at absmax_ptr without + pid", "every program stored into absmax[0]",
          True),
    Wrong("08.1", ABSMAX, absmax_store_per_lane, "absmax stored at absmax_ptr + offs (one store per lane)",
          "the store used one address per lane", True),
    Wrong("08.1", ABSMAX, absmax_program_id_1, "tl.program_id(1) on a 1-D grid", "tl.program_id(0)", True),
    Wrong("08.1", ABSMAX, absmax_no_store, "absmax computed but never stored", "nothing was written into absmax",
          True),
    Wrong("08.1", ABSMAX, absmax_not_jitted, "no @triton.jit", "decorate the kernel function with @triton.jit", True),
    Wrong("08.2", DEQ, deq_no_mask, "no masks at all", "wrote past the end of the output", True),
    Wrong("08.2", DEQ, deq_store_unmasked, "loads masked, store not", "wrote past the end of the output", True),
    Wrong("08.2", DEQ, deq_no_lookup, "codes used as values, no map lookup", "you multiplied the codes themselves",
          True),
    Wrong("08.2", DEQ, deq_absmax_zero, "tl.load(absmax_ptr) without + pid", "program pid uses absmax[pid]", True),
    Wrong("08.2", DEQ, deq_no_scale, "map value not multiplied by absmax", "you forgot the scale", True),
    Wrong("08.2", DEQ, deq_divide, "divided by absmax", "you divided by absmax", True),
    Wrong("08.2", DEQ, deq_pid_not_scaled, "offsets pid + arange (pid not times BLOCK)", "offsets start at pid * BLOCK",
          True),
    Wrong("08.2", DEQ, deq_absmax_per_element, "absmax loaded at absmax_ptr + offs", "one entry per BLOCK", True),
    Wrong("08.3", QUANT, _Switched("quantize_ties_up", TIE_UP=True), "ties go to the upper index (<=)",
          "take the LOWER index", True),
    Wrong("08.3", QUANT, _Switched("quantize_no_zero_guard", GUARD=False), "no zero guard: 0/0 in an all-zero block",
          "an all-zero block has absmax 0", True),
    Wrong("08.3", QUANT, _Switched("quantize_floor_only", PICK=1), "the search result lo kept, neighbour not compared",
          "you always kept the lower neighbour", True),
    Wrong("08.3", QUANT, _Switched("quantize_always_upper", PICK=2), "always lo + 1", "you always took the upper",
          True),
    Wrong("08.3", QUANT, _Switched("quantize_seven_halvings", STEPS=7), "search steps 64 … 1 (7 halvings)",
          "8 halvings", True),
    Wrong("08.3", QUANT, _Switched("quantize_no_clamp", CLAMP=False), "hi = lo + 1 not kept inside the map",
          "tl.minimum(lo + 1, 255)", True),
    Wrong("08.3", QUANT, _Switched("quantize_unmasked_store", MASK_STORE=False), "store without a mask",
          "mask the store", True),
    Wrong("08.3", QUANT, _Switched("quantize_multiply", SCALE=1), "x multiplied by absmax instead of divided",
          "you multiplied x by absmax", True),
    Wrong("08.3", QUANT, _Switched("quantize_absmax_zero", SCALE=2), "every program normalises by absmax[0]",
          "program pid uses absmax[pid]", True),
    Wrong("08.4", EMA, _SwitchedEma("ema_masked_lanes_count", ZERO_MASKED=False), "masked lanes not zeroed before "
          "the max", "masked lanes must not count in the new absmax", True),
    Wrong("08.4", EMA, _SwitchedEma("ema_signed_max", ABS=False), "tl.max(m) without tl.abs", "you took tl.max(m)", True),
    Wrong("08.4", EMA, _SwitchedEma("ema_old_absmax", NEW_ABSMAX=False), "the old absmax kept and used",
          "you kept the old absmax", True),
    Wrong("08.4", EMA, _SwitchedEma("ema_beta_swapped", SWAP_BETA=True), "m = (1 - beta) m + beta g",
          "beta multiplies the OLD state", True),
    Wrong("08.4", EMA, _SwitchedEma("ema_unmasked_store", MASK_STORE=False), "code store without a mask",
          "wrote past the end", True),
    Wrong("08.4", EMA, _SwitchedEma("ema_normalised_by_old", NORM_OLD=True), "new absmax stored, codes normalised "
          "by the old one", "you normalised by the OLD absmax", True),
    Wrong("08.4", EMA, _SwitchedEma("ema_absmax_not_stored", STORE_ABSMAX=False), "new absmax never stored",
          "you did not store the new absmax", True),
    Wrong("08.4", EMA, _SwitchedEma("ema_not_dequantized", SCALE_IN=False), "m = qmap[codes] without * absmax",
          "dequantize first", True),
    Wrong("08.4", EMA, _SwitchedEma("ema_ties_up", TIE_UP=True), "ties between two codes go to the upper index (<=)",
          "take the LOWER index", True),
    Wrong("08.4", EMA, _SwitchedEma("ema_absmax_per_lane", PER_LANE_ABSMAX=True), "the new absmax stored at "
          "absmax_ptr + offs (one store per lane, past the absmax buffer)", "the store used one address per lane", True),
    Wrong("08.4", EMA, _SwitchedEma("ema_no_zero_guard", GUARD=False), "0/0 in the all-zero block",
          "an all-zero block has absmax 0", True),
]

RIGHT = [
    Right("08.1", ABSMAX, absmax_maximum_of_x_and_minus_x, "max(x, -x) and the mask applied with tl.where"),
    Right("08.2", DEQ, deq_int64_gather, "int64 offsets, masked load with other=127, unmasked gather"),
    Right("08.3", QUANT, quantize_ties_from_below, "static_range(7, -1, -1) steps, the tie test turned round"),
    Right("08.4", EMA, ema_two_passes_in_registers, "m + (1 - beta)(g - m), masked lanes as -1, tl.abs distances"),
]
