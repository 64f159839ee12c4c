"""Codings of the state formats other than the 256-entry maps, as Triton helpers (inlined into the
kernels of :mod:`adam8lib.kernels.triton`, :mod:`.triton_fp8`, :mod:`.triton_4bit`): the nearest code
of a 16-entry map (4-bit states) and the float8 e4m3 byte (FP8 states), each equal to the reference's
(:meth:`adam8lib.formats.MomentFormat.code`)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["nearest_code16", "fp8_codes"]


@triton.jit
def nearest_code16(x, qmap_ptr):
    """Index (int32) of the entry of a sorted 16-entry map (the 4-bit states' maps) nearest to each
    x, as :func:`adam8lib.quant.nearest_code` without the sign rule finds it, operation for
    operation: ``pos = #(entries < x)`` (``torch.searchsorted``; 16 compares against the map's
    entries, scalars every thread holds), clamped to 1..15; then ``map[pos]`` if it is strictly
    closer than ``map[pos - 1]`` in fp32 (``(hi - x) < (x - lo)``, so a tie goes to the lower index).
    Values past either end take the end's code (the clamp)."""
    pos = tl.zeros(x.shape, dtype=tl.int32)
    for k in tl.static_range(16):
        pos += (tl.load(qmap_ptr + k) < x).to(tl.int32)
    hi = tl.minimum(tl.maximum(pos, 1), 15)
    above = tl.load(qmap_ptr + hi)  # a 64-byte map: these two loads stay in L1
    below = tl.load(qmap_ptr + (hi - 1))
    return tl.where((above - x) < (x - below), hi, hi - 1)


@triton.jit
def fp8_codes(x, KEEP_SIGN: tl.constexpr):
    """The float8 e4m3 byte of ``x * 448`` for block-normalized ``|x| <= 1`` (the ``"fp8"`` state
    format), rounded to nearest even like torch's ``.to(torch.float8_e4m3fn)``, from the fp32 bits:

    * normal range (``|y| >= 2**-6``): e4m3 keeps 3 of fp32's 23 mantissa bits, so round the bit
      pattern at bit 20 (half to even), shift, and rebase the exponent (bias 127 -> 7); a carry
      out of the mantissa moves to the next power of two by itself;
    * subnormals (steps of ``2**-9``): the code is ``|y| * 512`` rounded half to even (8 is the
      smallest normal, code 0x08, so the two ranges meet);
    * the sign bit is y's (so -0.0 gives 0x80), and with ``KEEP_SIGN`` a non-zero value whose code
      is a zero gets the smallest subnormal of its sign instead (0x01 or 0x81), as the reference.
    """
    y = x * 448.0
    a = tl.abs(y)
    bits = a.to(tl.uint32, bitcast=True)
    normal = (((bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20) - (120 << 3)).to(tl.int32)
    t = a * 512.0
    whole = tl.floor(t)
    frac = t - whole
    low = whole.to(tl.int32)
    up = (frac > 0.5) | ((frac == 0.5) & ((low & 1) == 1))
    sub = low + up.to(tl.int32)
    mag = tl.where(a >= 0.015625, normal, sub)
    if KEEP_SIGN:
        mag = tl.where((mag == 0) & (y != 0), 1, mag)
    sign = (y.to(tl.uint32, bitcast=True) >> 31).to(tl.int32)
    return (sign << 7) | mag
