"""The fused 8-bit Adam step as Triton kernels (lesson 08), and the other state formats' steps.

On a CUDA GPU the kernels are compiled; on a CPU they run in Triton's *interpreter*
(``TRITON_INTERPRET=1``, set before this module is imported; ``adam8lib.course.setup()``
does it), which runs every program with NumPy: slow, but the same code, so the course can
test it anywhere (one difference: the interpreter truncates fp32 -> bf16, so there the
rounding to nearest even that a GPU does in hardware is done by hand, see :func:`_to_dtype`).
``backend="auto"`` never picks the interpreter.

Three kernels:

* ``_quantize_kernel``   x -> (codes, absmax): blockwise quantization with a 256-entry map;
* ``_dequantize_kernel`` (codes, absmax) -> x = map[code] * absmax;
* ``_adam8bit_kernel``   the whole optimizer step in **one pass over memory**: load p, g, both
  codes and both absmax; dequantize; update in fp32; new absmax; requantize; store.

Work split (the "tile"). A program owns ``ROWS`` whole quantization blocks, seen as a
``[ROWS, BLOCKSIZE]`` tile, so a block's new absmax is a row maximum and no other program is
involved. On a GPU a tile has 2048 elements (8 x 256 or 1 x 2048) and 8 warps, eight elements
per thread: p and g move as 16-byte vectors, the codes 8 bytes at a time. Offsets are int32
while the tensor (rounded up to whole tiles) has fewer than 2**31 elements, int64 beyond.

Nearest code, the only part that is not elementwise. Two ways, same answer:

* ``_table_code`` (used whenever the map allows, i.e. the dynamic and linear maps): one load
  from an exact table of the reference's ``nearest_code``, indexed by the top 16 bits of the
  float's bit pattern, and one compare on the low 16 bits (:mod:`adam8lib.kernels.code_table`,
  ``CodeTable.raw_steps``, the layout the C++ kernel uses too);
* ``_nearest_code`` (the readable version lesson 08 shows, and the fallback): the map is
  sorted, so a branch-free binary search finds ``pos = #(map entries < x)`` in 8 halving
  steps, one ``tl.load`` from the 1 KiB map per step; it keeps the last probe below x and the
  last one at or above x, which are the two neighbours. Then the rule of
  :func:`adam8lib.quant.nearest_code`: the closer neighbour wins, a tie goes to the lower
  index, and, for the optimizer's states (``keep_sign``), a non-zero value never gets the
  code of 0 or of the other sign: it moves one code away from zero instead.

The non-finite rule (as in the reference): an element whose new m or v is not finite (a
NaN/Inf gradient, or one so large that g*g overflows) restarts from m = v = 0 and keeps its
parameter; absmax is taken after that, so one bad element never spoils its block.

The step kernel is specialized (constexpr flags, one compiled variant each; see
:func:`step_specialization`): no multiply when fp32(1 - lr*wd) == 1; "keeps its parameter"
without a final select when the reset element's update is exactly -0.0 (lr >= 0, eps > 0);
int32 or int64 offsets.

Same numbers as the reference backend (:mod:`adam8lib.kernels.reference`). Every fp32
operation follows the reference's order, division and square root are correctly rounded
(``div_rn``, ``sqrt_rn``; never ``div.full``/``sqrt.approx``), and the moments use a fused
multiply-add exactly where PyTorch's CPU kernels do::

    m = fma(g, 1-b1, b1*m)         # torch: m.mul_(b1).add_(g, alpha=1-b1)
    v = fma((1-b2)*g, g, b2*v)     # torch: v.mul_(b2).addcmul_(g, g, value=1-b2)

(In the interpreter, where torch's CPU kernels do not fuse them, i.e. its generic build, neither
does the kernel: ``FUSED_MOMENTS``.)

Launches pass ``enable_fp_fusion=False``, so the compiler fuses nothing else. In the
interpreter the states (codes and absmax) are then bit-identical to the reference. The
parameters agree within 1e-6 but not to the bit: torch's CPU ``sqrt`` (MKL) is one ulp off
on some inputs, ``sqrt_rn`` is not. On a GPU, torch's CUDA kernels are compiled on their own
terms (e.g. ``addcdiv`` rounds ``p + a*(m/d)``); tests/kernels/test_triton.py states what the GPU
tests require. Hyperparameters reach the kernel as fp32 scalars, as torch's do: ``beta1``,
``1-beta1``, ... are computed in Python doubles and rounded once.

The other state formats (:mod:`adam8lib.formats`) and rules reuse these pieces (the names listed
under "What the other kernels build on" at the end of this module), in modules of their own, registered
in :mod:`adam8lib.kernels.registry`: ``"fp8"`` is the same tile with e4m3 bytes for codes (``FP8``,
:mod:`adam8lib.kernels.triton_fp8`); the 4-bit formats, :mod:`adam8lib.kernels.triton_4bit`; the family's
elementwise rules (Lion, AdEMAMix, RMSprop, Adagrad), :mod:`adam8lib.kernels.triton_rules`. The
codings other than the 256-entry maps' are in :mod:`adam8lib.kernels.triton_codes`.

The 4-bit formats (``"4bit"``, ``"4bit-naive"``; :mod:`.triton_4bit`). Both moments are
4-bit codes, two per byte, element ``2i`` in the high nibble: a program loads its tile's
``BLOCKSIZE / 2`` bytes per block and ``tl.interleave``s the high and low nibbles back into the
``[ROWS, BLOCKSIZE]`` element order (:func:`_unpack_tile`); encoding reshapes the codes to pairs and
``tl.split``s them (:func:`_pack_tile`; the pad nibble of an odd count is 0, as the reference packs).
The moments and the parameter are the 8-bit tile's helpers (:func:`_moments`, :func:`_store_param`).
The nearest code of a 16-entry map is the reference's search itself (:func:`_nearest_code16`): 16
compares against scalars give ``#(entries < x)``, then the closer of the two neighbours in fp32, a
tie to the lower index (no sign rule: 4-bit m takes the plain nearest code, and ``"4bit"``'s v map
has no zero). m, and v of ``"4bit-naive"`` or of a vector, have one scale per block (of 128 unless
the optimizer says otherwise), found in the tile as in the 8-bit kernel: one pass (``_adam4bit_kernel``). ``"4bit"``'s v of a matrix has
rank-1 scales, ``min(max of its row, max of its column)`` of the *new* v, which no program knows
before every v is computed, so it takes **two passes**: ``_rank1_max_kernel`` computes new m and v
on 2-D tiles (rows x 128 columns) and merges each tile's row and column maxima into a separate
buffer with ``atomic_max`` on the fp32 bit patterns (v >= 0, so they order as integers; a max is
the same in any order, so the result is deterministic); then ``_adam4bit_kernel`` recomputes the
same m and v from the untouched old codes and scales, updates p, and encodes v with the new maxima,
which replace the old ones only after it (pass 2 decodes with the old). A tensor of 3 or 4
dimensions (its scale: the smallest of every axis's maxima; no 2-D view of it has the same scales)
takes the same passes over its ``(n / last, last)`` view, with the per-element scale from every
axis's maxima (``NDIM``) and each leading axis's new maxima reduced from the view's row maxima on
the host; 5 or more dimensions run the reference step.
States equal the reference's bit for bit in the interpreter; the parameters too except where torch's
CPU ``sqrt`` is not correctly rounded (tests/kernels/test_triton_4bit.py shows both).

Performance (registers, SASS instructions per element, GPU timings) is measured and recorded in
bench/README.md (``bench/gpu_sass.py`` compiles for sm_75/80/90 without a GPU; ``--lowbit4`` the
4-bit kernels).
"""

from __future__ import annotations

import ctypes
import math
import os

import torch
import triton
import triton.language as tl

from collections import OrderedDict

from . import register_backend
from .contract import check_each, check_step, check_step_args
from .code_table import code_table
from .reference import bias_corrections, torch_uses_fma
from ..quant import check_blocksize, check_code, check_dequantize_inputs, num_blocks, require_float

__all__ = [
    "adam8bit_step_triton",
    "adam8bit_step_many_triton",
    "quantize_blockwise_triton",
    "dequantize_blockwise_triton",
    "supports",
    "unavailable_reason",
    "launch_config",
    "INTERPRETED",
]

#: Elements per program on a GPU (a power of two; a block larger than this gets a program of its own).
TILE_ELEMENTS = 2048
#: Elements per program in the interpreter, where each program costs ~0.1 s of Python whatever its size.
INTERPRETER_TILE_ELEMENTS = 1 << 16
#: Largest finite fp32: ``|g| <= FLT_MAX`` is false exactly for NaN and +-Inf.
FLT_MAX = tl.constexpr(3.4028234663852886e38)
NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _probe():
    pass


#: True when the kernels below are built by Triton's interpreter (TRITON_INTERPRET=1 at import).
INTERPRETED = not isinstance(_probe, triton.runtime.JITFunction)
#: The interpreter truncates fp32 -> bf16; there :func:`_to_dtype` rounds by hand.
BF16_BY_HAND = tl.constexpr(INTERPRETED)
#: The moments as fused multiply-adds, as torch's CUDA and vectorized CPU kernels compute them; in
#: the interpreter (next to the CPU reference) only where this torch's CPU kernels fuse them too
#: (:func:`~adam8lib.kernels.reference.torch_uses_fma`: not with its generic kernels), so that on
#: any CPU the interpreted kernel leaves the reference's states bit for bit.
FUSED_MOMENTS = tl.constexpr(not INTERPRETED or torch_uses_fma())


# ----------------------------------------------------------------------------------------
# Helpers (inlined into each kernel)
# ----------------------------------------------------------------------------------------
from .triton_codes import fp8_codes as _fp8_codes, nearest_code16 as _nearest_code16  # noqa: E402  (used by _quantize_tile)

@triton.jit
def _tile(n, BLOCKSIZE: tl.constexpr, ROWS: tl.constexpr, INT64: tl.constexpr = True):
    """This program's ROWS blocks: block indices [ROWS], element offsets [ROWS, BLOCKSIZE], mask."""
    if INT64:
        blocks = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    else:
        blocks = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offsets = blocks[:, None] * BLOCKSIZE + tl.arange(0, BLOCKSIZE)[None, :]
    return blocks, offsets, offsets < n


@triton.jit
def _nearest_code(x, qmap_ptr, KEEP_SIGN: tl.constexpr):
    """Index (int32) of the map entry nearest to each x; a tie goes to the lower index.

    Same answer as ``adam8lib.quant.nearest_code`` (torch.searchsorted, then the closer of
    the two neighbours), found in 8 halving steps over the sorted 256-entry map.
    """
    # Binary search for pos = #(entries < x), keeping both neighbours of x as we go:
    #   below = map[pos-1], the last probe < x   (-inf while there is none)
    #   above = map[pos],   the last probe >= x  (map[255] at first: past the end counts as 255)
    pos = tl.zeros(x.shape, dtype=tl.int32)
    below = tl.full(x.shape, NEG_INF, dtype=tl.float32)
    above = tl.zeros(x.shape, dtype=tl.float32) + tl.load(qmap_ptr + 255)
    for k in tl.static_range(8):
        step = 128 >> k  # 128, 64, ..., 1
        probe = tl.load(qmap_ptr + pos + (step - 1))
        left = probe >= x  # x is in the lower half (a NaN goes right, as in torch.searchsorted)
        pos = tl.where(left, pos, pos + step)
        below = tl.where(left, below, probe)
        above = tl.where(left, probe, above)
    # The closer neighbour wins; on a tie the lower index (below) does.
    pick_above = (above - x) < (x - below)
    idx = tl.where(pick_above, pos, pos - 1)
    if KEEP_SIGN:
        # a non-zero value must not become 0 or change sign: one code down for a negative x
        # whose nearest entry is >= 0, one code up for a positive x whose nearest entry is <= 0
        value = tl.where(pick_above, above, below)
        idx = tl.where((x < 0) & (value >= 0), idx - 1, idx)
        idx = tl.where((x > 0) & (value <= 0), idx + 1, idx)
    return idx


@triton.jit
def _table_code(x, steps_ptr):
    """The same code as :func:`_nearest_code`, from the float's bits and one table probe.

    ``steps`` is ``CodeTable.raw_steps`` of :func:`adam8lib.kernels.code_table.code_table`'s
    exact table for the map (and rule): for each of the 65,536 values of the top 16 bits of
    x's fp32 bit pattern it holds a code ``B`` (bits 0-7), a code ``A`` (bits 8-15) and the
    low 16 bits ``T`` from which on ``A`` applies, stored as ``T - 1`` (bits 16-31), NaN and
    -0.0 included (negative floats: the bucket's codes in reverse order, absorbed by the table)::

        code = A if (bits(x) << 16) > entry else B        (unsigned 32-bit compare)

    one load (from a 256 KiB table whose hot part, |x| <= 1, is a few KiB) and one compare,
    instead of 8 dependent probes.
    """
    bits = x.to(tl.uint32, bitcast=True)
    entry = tl.load(steps_ptr + (bits >> 16))
    pick_a = (bits << 16) > entry.to(tl.uint32, bitcast=True)
    return tl.where(pick_a, entry >> 8, entry) & 0xFF


@triton.jit
def _codes(x, qmap_ptr, steps_ptr, KEEP_SIGN: tl.constexpr, USE_TABLE: tl.constexpr):
    """Nearest code of each x: one table probe (USE_TABLE) or the binary search."""
    if USE_TABLE:
        return _table_code(x, steps_ptr)
    else:
        return _nearest_code(x, qmap_ptr, KEEP_SIGN)



@triton.jit
def _to_dtype(x, DTYPE: tl.constexpr):
    """fp32 -> DTYPE, rounding to nearest even like torch's ``.to()``.

    A GPU converts fp32 -> bf16 to nearest even (``cvt.rn.bf16x2.f32``, one instruction for
    two values; before sm_80 Triton emulates the same rounding with integer operations).
    Triton's interpreter truncates instead, so there (only) the rounding is done by hand on
    the bits; both agree with torch.
    """
    if DTYPE == tl.bfloat16 and BF16_BY_HAND:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)  # round half to even on the 16 dropped bits
        rounded = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return tl.where(x == x, rounded, x.to(tl.bfloat16))  # NaN stays NaN
    else:
        return x.to(DTYPE)


@triton.jit
def _quantize_tile(x, qmap_ptr, steps_ptr, KEEP_SIGN: tl.constexpr, USE_TABLE: tl.constexpr,
                   FP8: tl.constexpr = False, MAP16: tl.constexpr = False):
    """Blockwise quantization of a [ROWS, BLOCKSIZE] fp32 tile: (codes int32, absmax [ROWS]).
    ``FP8``: the codes are float8 e4m3 bytes of x / absmax * 448 (:func:`_fp8_codes`), not map indices.
    ``MAP16``: nearest codes of a 16-entry map (:func:`_nearest_code16`, no sign rule; 4-bit states).

    The tile's elements past the end of the tensor must be 0 (so they leave absmax alone)."""
    absmax = tl.max(tl.abs(x), axis=1)  # absmax[b] = max_i |x_bi|
    # inv = 1/absmax, or 0 for an all-zero block (so its codes are the code of 0.0)
    safe = tl.where(absmax > 0, absmax, 1.0)
    inv = tl.where(absmax > 0, tl.math.div_rn(1.0, safe), 0.0)
    if FP8:
        codes = _fp8_codes(x * inv[:, None], KEEP_SIGN)
    elif MAP16:
        codes = _nearest_code16(x * inv[:, None], qmap_ptr)
    else:
        codes = _codes(x * inv[:, None], qmap_ptr, steps_ptr, KEEP_SIGN, USE_TABLE)
    return codes, absmax


# ----------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------
@triton.jit
def _quantize_kernel(x_ptr, codes_ptr, absmax_ptr, qmap_ptr, steps_ptr, n, n_blocks,
                     BLOCKSIZE: tl.constexpr, ROWS: tl.constexpr, KEEP_SIGN: tl.constexpr,
                     USE_TABLE: tl.constexpr):
    blocks, offsets, mask = _tile(n, BLOCKSIZE, ROWS)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    codes, absmax = _quantize_tile(x, qmap_ptr, steps_ptr, KEEP_SIGN, USE_TABLE)
    tl.store(codes_ptr + offsets, codes.to(tl.uint8), mask=mask)
    tl.store(absmax_ptr + blocks, absmax, mask=blocks < n_blocks)


@triton.jit
def _dequantize_kernel(codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, n_blocks,
                       BLOCKSIZE: tl.constexpr, ROWS: tl.constexpr):
    blocks, offsets, mask = _tile(n, BLOCKSIZE, ROWS)
    codes = tl.load(codes_ptr + offsets, mask=mask, other=0).to(tl.int32)
    absmax = tl.load(absmax_ptr + blocks, mask=blocks < n_blocks, other=0.0)
    x = tl.load(qmap_ptr + codes) * absmax[:, None]  # x = map[code] * absmax[block]
    tl.store(out_ptr + offsets, _to_dtype(x, out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _adam8bit_kernel(p_ptr, g_ptr, state1_ptr, state2_ptr, absmax1_ptr, absmax2_ptr, qmap1_ptr, qmap2_ptr,
                     steps1_ptr, steps2_ptr, n, n_blocks,
                     beta1, one_minus_beta1, beta2, one_minus_beta2, eps,
                     decay, neg_step_size, bias_correction2_sqrt,
                     BLOCKSIZE: tl.constexpr, ROWS: tl.constexpr, USE_TABLE: tl.constexpr,
                     DECAY: tl.constexpr, RESET_KEEPS_P: tl.constexpr,
                     INT64: tl.constexpr, FP8: tl.constexpr = False):
    blocks, offsets, mask = _tile(n, BLOCKSIZE, ROWS, INT64)
    _step_tile(p_ptr, g_ptr, state1_ptr, state2_ptr, absmax1_ptr, absmax2_ptr, qmap1_ptr, qmap2_ptr,
               steps1_ptr, steps2_ptr, blocks, offsets, mask, blocks < n_blocks,
               beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, neg_step_size, bias_correction2_sqrt,
               USE_TABLE, DECAY, RESET_KEEPS_P, FP8)


@triton.jit
def _adam8bit_many_kernel(meta_ptr, scalars_ptr, programs_ptr, qmap1_ptr, qmap2_ptr, steps1_ptr, steps2_ptr, count,
                          beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay,
                          BLOCKSIZE: tl.constexpr, ROWS: tl.constexpr, USE_TABLE: tl.constexpr,
                          DECAY: tl.constexpr, RESET_KEEPS_P: tl.constexpr, INT64: tl.constexpr,
                          P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr):
    """The step for ``count`` tensors in one launch (the tensors of one parameter group).

    ``programs_ptr`` (int64) says which tile of which tensor each program steps: ``t << 32 |
    tile``. ``meta_ptr`` (int64) holds, for tensor t, the addresses of p, g, state1, state2,
    absmax1, absmax2 and its element count at ``meta[k * count + t]`` (k = 0..6);
    ``scalars_ptr`` (fp32) its ``neg_step_size`` at ``[t]`` and ``bias_correction2_sqrt`` at
    ``[count + t]`` (from its own step count). The tile itself is exactly the one-tensor
    kernel's (``_step_tile``). Every address and count must be a multiple of 16 (the launcher
    sends other tensors to the one-tensor kernel): the compiler is told so, and p and g still
    move as 16-byte vectors (without it: ~208 instead of ~117 instructions per element)."""
    code = tl.load(programs_ptr + tl.program_id(0))
    t = (code >> 32).to(tl.int32)
    local = code & 0xFFFFFFFF
    n = tl.load(meta_ptr + 6 * count + t)
    if not INT64:
        n = n.to(tl.int32)
        local = local.to(tl.int32)
    n = tl.multiple_of(n, 16)
    p_ptr = tl.load(meta_ptr + t).to(tl.pointer_type(P_DTYPE))
    g_ptr = tl.load(meta_ptr + count + t).to(tl.pointer_type(G_DTYPE))
    state1_ptr = tl.load(meta_ptr + 2 * count + t).to(tl.pointer_type(tl.uint8))
    state2_ptr = tl.load(meta_ptr + 3 * count + t).to(tl.pointer_type(tl.uint8))
    absmax1_ptr = tl.load(meta_ptr + 4 * count + t).to(tl.pointer_type(tl.float32))
    absmax2_ptr = tl.load(meta_ptr + 5 * count + t).to(tl.pointer_type(tl.float32))
    p_ptr = tl.multiple_of(p_ptr, 16)
    g_ptr = tl.multiple_of(g_ptr, 16)
    state1_ptr = tl.multiple_of(state1_ptr, 16)
    state2_ptr = tl.multiple_of(state2_ptr, 16)
    absmax1_ptr = tl.multiple_of(absmax1_ptr, 16)
    absmax2_ptr = tl.multiple_of(absmax2_ptr, 16)
    neg_step_size = tl.load(scalars_ptr + t)
    bias_correction2_sqrt = tl.load(scalars_ptr + count + t)
    blocks = local * ROWS + tl.arange(0, ROWS)
    offsets = blocks[:, None] * BLOCKSIZE + tl.arange(0, BLOCKSIZE)[None, :]
    n_blocks = (n + BLOCKSIZE - 1) // BLOCKSIZE
    _step_tile(p_ptr, g_ptr, state1_ptr, state2_ptr, absmax1_ptr, absmax2_ptr, qmap1_ptr, qmap2_ptr,
               steps1_ptr, steps2_ptr, blocks, offsets, offsets < n, blocks < n_blocks,
               beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, neg_step_size, bias_correction2_sqrt,
               USE_TABLE, DECAY, RESET_KEEPS_P)


@triton.jit
def _moments(m, v, g, mask, beta1, one_minus_beta1, beta2, one_minus_beta2):
    """The new moments in fp32 from the decoded ones and the gradient, and which elements are
    finite: ``m = b1*m + (1-b1)*g``, ``v = b2*v + (1-b2)*g^2`` (an fma where torch has one).

    The non-finite rule: an element whose new m or v is not finite (a NaN/Inf gradient, or one so
    large that g*g overflows) restarts from m = v = 0 (and keeps its parameter, :func:`_store_param`).
    Elements outside ``mask`` (past the end) get m = v = 0 too, so they leave every maximum alone."""
    if FUSED_MOMENTS:
        m = tl.math.fma(g, one_minus_beta1, m * beta1)
        v = tl.math.fma(g * one_minus_beta2, g, v * beta2)
    else:  # each product rounded, then the sum (torch's generic CPU kernels)
        m = m * beta1 + g * one_minus_beta1
        v = v * beta2 + (g * one_minus_beta2) * g
    finite = mask & (tl.abs(m) <= FLT_MAX) & (tl.abs(v) <= FLT_MAX)  # false for NaN and +-Inf
    m = tl.where(finite, m, 0.0)
    v = tl.where(finite, v, 0.0)
    return m, v, finite


@triton.jit
def _store_param(p_ptr, offsets, mask, m, v, finite, eps, decay, neg_step_size, bias_correction2_sqrt,
                 DECAY: tl.constexpr, RESET_KEEPS_P: tl.constexpr):
    """Load p, ``p = p*(1 - lr*wd) - lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)`` in fp32 in the
    reference's order, and store it in p's dtype; an element reset by :func:`_moments` keeps its p."""
    p = tl.load(p_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if DECAY:
        if RESET_KEEPS_P:
            p_decayed = p * tl.where(finite, decay, 1.0)  # a reset element is not decayed ...
        else:
            p_decayed = p * decay
    else:
        p_decayed = p  # decay == 1.0 in fp32: p * 1 == p exactly
    denom = tl.math.div_rn(tl.math.sqrt_rn(v), bias_correction2_sqrt) + eps
    new_p = p_decayed + tl.math.div_rn(neg_step_size * m, denom)  # ... and its update is -0.0
    if not RESET_KEEPS_P:
        new_p = tl.where(finite, new_p, p)  # a reset element leaves its parameter alone
    tl.store(p_ptr + offsets, _to_dtype(new_p, p_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _step_tile(p_ptr, g_ptr, state1_ptr, state2_ptr, absmax1_ptr, absmax2_ptr, qmap1_ptr, qmap2_ptr,
               steps1_ptr, steps2_ptr, blocks, offsets, mask, block_mask,
               beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, neg_step_size, bias_correction2_sqrt,
               USE_TABLE: tl.constexpr, DECAY: tl.constexpr, RESET_KEEPS_P: tl.constexpr,
               FP8: tl.constexpr = False):
    """The step of one program's ``[ROWS, BLOCKSIZE]`` tile, for ``_adam8bit_kernel`` and ``_adam8bit_many_kernel``.
    ``FP8`` (the ``"fp8"`` state format): the codes are float8 e4m3 bytes; ``qmap1``/``qmap2`` are then
    the table of every byte's value / 448 (:func:`fp8_table`), so decoding is the same lookup."""
    # 1. load and dequantize the states: m = qmap1[state1] * absmax1, v = qmap2[state2] * absmax2
    code1 = tl.load(state1_ptr + offsets, mask=mask, other=0).to(tl.int32)
    code2 = tl.load(state2_ptr + offsets, mask=mask, other=0).to(tl.int32)
    absmax1 = tl.load(absmax1_ptr + blocks, mask=block_mask, other=0.0)
    absmax2 = tl.load(absmax2_ptr + blocks, mask=block_mask, other=0.0)
    m = tl.load(qmap1_ptr + code1) * absmax1[:, None]
    v = tl.load(qmap2_ptr + code2) * absmax2[:, None]

    # 2. moments in fp32: m = b1*m + (1-b1)*g,  v = b2*v + (1-b2)*g^2  (fma where torch has one)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    m, v, finite = _moments(m, v, g, mask, beta1, one_minus_beta1, beta2, one_minus_beta2)

    # 3. parameter in fp32: p = p*(1 - lr*wd) - lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
    _store_param(p_ptr, offsets, mask, m, v, finite, eps, decay, neg_step_size, bias_correction2_sqrt,
                 DECAY, RESET_KEEPS_P)

    # 4. requantize with fresh per-block absmax; a non-zero m or v never rounds to 0 or flips sign
    code1, absmax1 = _quantize_tile(m, qmap1_ptr, steps1_ptr, True, USE_TABLE, FP8)
    code2, absmax2 = _quantize_tile(v, qmap2_ptr, steps2_ptr, True, USE_TABLE, FP8)
    tl.store(state1_ptr + offsets, code1.to(tl.uint8), mask=mask)
    tl.store(state2_ptr + offsets, code2.to(tl.uint8), mask=mask)
    tl.store(absmax1_ptr + blocks, absmax1, mask=block_mask)
    tl.store(absmax2_ptr + blocks, absmax2, mask=block_mask)


# ----------------------------------------------------------------------------------------
# Python side: checks, launch configuration, the backend entry point
# ----------------------------------------------------------------------------------------

_PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def supports(device: torch.device | str) -> bool:
    """The Triton backend runs on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1``."""
    return unavailable_reason(device) is None


def unavailable_reason(device: torch.device | str = "cuda") -> str | None:
    """Why the Triton backend cannot run on ``device`` here, or None if it can."""
    device = torch.device(device)
    if device.type == "cuda":
        return None
    if device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") == "1":
            return None
        return ("CPU tensors run only in Triton's interpreter: set TRITON_INTERPRET=1 before adam8lib.kernels.triton "
                "is imported (adam8lib.course.setup() does), or use CUDA tensors")
    return f"the Triton backend runs on CUDA tensors (or CPU ones in the interpreter), not on {device.type}"


def launch_config(blocksize: int, tile: int | None = None, num_warps: int | None = None) -> tuple[int, int]:
    """``(rows, num_warps)``: blocks per program and warps per program for ``blocksize``.

    A program covers ``rows * blocksize = max(tile, blocksize)`` elements (``tile`` defaults
    to :data:`TILE_ELEMENTS`, or :data:`INTERPRETER_TILE_ELEMENTS` in the interpreter), with
    256 elements per warp (8 per thread) unless told otherwise (at most 16 warps).
    """
    if tile is None:
        tile = INTERPRETER_TILE_ELEMENTS if INTERPRETED else TILE_ELEMENTS
    if tile < 1 or tile & (tile - 1):
        raise ValueError(f"tile must be a power of two, got {tile}")
    rows = max(1, tile // blocksize)
    if num_warps is None:
        num_warps = min(16, max(1, rows * blocksize // 256))
    return rows, num_warps


def _check_runnable(device: torch.device) -> None:
    if device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            "Triton kernels run on CPU tensors only in interpreter mode, and adam8lib.kernels.triton was "
            "imported without TRITON_INTERPRET=1. Set it before anything imports this module "
            "(adam8lib.course.setup() does), or use CUDA tensors."
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"The Triton backend needs CUDA (or CPU under TRITON_INTERPRET=1) tensors, got {device}")


_TABLES: OrderedDict = OrderedDict()


def nearest_code_table(qmap: torch.Tensor, keep_sign: bool) -> tuple[torch.Tensor, bool]:
    """``(steps, use_table)`` for the kernels: the exact nearest-code table of ``qmap`` on its
    device (:mod:`adam8lib.kernels.code_table`, indexed by raw bits: ``CodeTable.raw_steps``), or,
    for a map the table cannot represent, ``(qmap, False)``: the kernels then fall back to the
    binary search.

    Cached per map tensor (held, so its address cannot be reused) and its version counter
    (an in-place edit of the map makes a new table)."""
    key = (qmap.data_ptr(), qmap._version, qmap.device, bool(keep_sign))
    hit = _TABLES.get(key)
    if hit is not None and hit[0] is qmap:
        _TABLES.move_to_end(key)
        return hit[1]
    try:
        table = code_table(qmap, keep_sign=keep_sign)
        value = (table.raw_steps.to(qmap.device), True)
    except ValueError:
        value = (qmap, False)
    _TABLES[key] = (qmap, value)
    while len(_TABLES) > 16:
        _TABLES.popitem(last=False)
    return value


def _launch(kernel, n_blocks: int, rows: int, num_warps: int, *args, **constexprs) -> None:
    grid = (triton.cdiv(n_blocks, rows),)
    kernel[grid](*args, ROWS=rows, num_warps=num_warps, enable_fp_fusion=False, **constexprs)


@torch.no_grad()
def adam8bit_step_triton(
    p: torch.Tensor,
    g: torch.Tensor,
    state1: torch.Tensor,
    state2: torch.Tensor,
    absmax1: torch.Tensor,
    absmax2: torch.Tensor,
    qmap1: torch.Tensor,
    qmap2: torch.Tensor,
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    blocksize: int,
    chunk_size: int | None = None,
    tile: int | None = None,
    num_warps: int | None = None,
) -> None:
    """One fused 8-bit Adam/AdamW step, in place — same contract as the reference backend.

    ``chunk_size`` is accepted for signature compatibility and ignored (the kernel keeps no fp32
    copy of anything); ``tile``/``num_warps`` override :func:`launch_config` (for benchmarks).
    """
    check_blocksize(blocksize)
    n = p.numel()
    _check_step_tensors(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, n, blocksize)
    check_step(step)
    _check_runnable(p.device)
    if n == 0:
        return
    _launch_one((p, g, state1, state2, absmax1, absmax2), qmap1, qmap2, _code_tables(qmap1, qmap2),
                launch_config(blocksize, tile, num_warps), step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                weight_decay=weight_decay, blocksize=blocksize)


def _code_tables(qmap1: torch.Tensor, qmap2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(steps1, steps2, use_table)`` for a launch: both maps' exact nearest-code tables, or,
    unless both have one, the maps themselves (the kernels' binary search)."""
    steps1, table1 = nearest_code_table(qmap1, keep_sign=True)
    steps2, table2 = nearest_code_table(qmap2, keep_sign=True)
    return (steps1, steps2, True) if table1 and table2 else (qmap1, qmap2, False)


def _launch_one(item, qmap1, qmap2, tables, config, *, step, lr, beta1, beta2, eps, weight_decay, blocksize,
                fp8=False) -> None:
    """One launch of ``_adam8bit_kernel`` for one checked, non-empty ``item`` (p, g, state1,
    state2, absmax1, absmax2); ``tables`` from :func:`_code_tables`, ``config`` = (rows, warps)."""
    p = item[0]
    n, n_blocks = p.numel(), num_blocks(p.numel(), blocksize)
    (steps1, steps2, use_table), (rows, warps) = tables, config
    # scalars in double precision here, rounded once to fp32 by the launch (as torch does)
    step_size, bias_correction2_sqrt = bias_corrections(step, lr, beta1, beta2)
    decay, neg_step_size = 1.0 - lr * weight_decay, -step_size
    _launch(
        _adam8bit_kernel, n_blocks, rows, warps,
        *item, qmap1, qmap2, steps1, steps2, n, n_blocks,
        beta1, 1.0 - beta1, beta2, 1.0 - beta2, eps, decay, neg_step_size, bias_correction2_sqrt,
        BLOCKSIZE=blocksize, USE_TABLE=use_table, FP8=fp8,
        **step_specialization(n_blocks * blocksize, rows * blocksize, decay=decay, neg_step_size=neg_step_size,
                              bias_correction2_sqrt=bias_correction2_sqrt, eps=eps),
    )



_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@torch.no_grad()
def adam8bit_step_many_triton(
    tensors,
    qmap1: torch.Tensor,
    qmap2: torch.Tensor,
    *,
    steps,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    blocksize: int,
    chunk_size: int | None = None,
    tile: int | None = None,
    num_warps: int | None = None,
) -> None:
    """:func:`adam8bit_step_triton` for several tensors (one parameter group) in one launch per
    pair of parameter and gradient dtypes, instead of one launch per tensor.

    ``tensors``: ``(p, g, state1, state2, absmax1, absmax2)`` per tensor, ``steps`` each one's
    step count. Every tensor is checked before any is changed (the error names its position);
    each is then stepped bit for bit as :func:`adam8bit_step_triton` steps it (the same tile
    code, ``_step_tile``; tested in the interpreter). What it saves is per-tensor work on the
    host: one launch and its argument handling per tensor, which on a GPU can cost more than the
    step of a small tensor itself.
    """
    check_blocksize(blocksize)
    tensors, steps = check_each(
        tensors, steps, lambda item, step: _check_step_tensors(*item, qmap1, qmap2, item[0].numel(), blocksize))
    work = [(item, step) for item, step in zip(tensors, steps) if item[0].numel()]
    if not work:
        return
    _check_runnable(work[0][0][0].device)
    tables, config = _code_tables(qmap1, qmap2), launch_config(blocksize, tile, num_warps)
    hyper = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, blocksize=blocksize)
    launches: dict[tuple, list] = {}  # one per pair of dtypes (a compiled variant each)
    for item, step in work:
        if _aligned(item):
            launches.setdefault((item[0].dtype, item[1].dtype), []).append((item, step))
        else:  # a size or address not a multiple of 16 (rare): its own launch, which Triton specializes
            _launch_one(item, qmap1, qmap2, tables, config, step=step, **hyper)
    for group in launches.values():
        _launch_many(group, qmap1, qmap2, tables, config, **hyper)


_PROGRAM_MAPS: OrderedDict = OrderedDict()


def _program_map(tiles: list[int], device: torch.device) -> torch.Tensor:
    """``t << 32 | tile`` for every program of a many-tensor launch (tensor t has ``tiles[t]``
    tiles), on ``device``; cached by the tile counts, which stay the same from step to step."""
    key = (tuple(tiles), device)
    hit = _PROGRAM_MAPS.get(key)
    if hit is not None:
        _PROGRAM_MAPS.move_to_end(key)
        return hit
    parts = [torch.arange(k, dtype=torch.int64) | (t << 32) for t, k in enumerate(tiles)]
    value = _PROGRAM_MAPS[key] = torch.cat(parts).to(device)
    while len(_PROGRAM_MAPS) > 16:
        _PROGRAM_MAPS.popitem(last=False)
    return value


def _launch_many(group, qmap1, qmap2, tables, config, *, lr, beta1, beta2, eps, weight_decay, blocksize) -> None:
    """One launch of ``_adam8bit_many_kernel`` for ``group``: (item, step) pairs, all checked,
    non-empty, aligned (:func:`_aligned`) and of one pair of parameter and gradient dtypes."""
    (steps1, steps2, use_table), (rows, warps) = tables, config
    count, tile, decay = len(group), rows * blocksize, 1.0 - lr * weight_decay
    p_dtype, g_dtype = group[0][0][0].dtype, group[0][0][1].dtype
    sizes = [item[0].numel() for item, _ in group]
    tiles = [triton.cdiv(num_blocks(n, blocksize), rows) for n in sizes]
    if max(tiles) >= 2**32:
        raise ValueError(f"a tensor of {max(sizes)} elements has too many tiles for one launch")
    corrections = [bias_corrections(step, lr, beta1, beta2) for _, step in group]
    neg_step_sizes = [-step_size for step_size, _ in corrections]
    bc2_sqrts = [bc2 for _, bc2 in corrections]
    flags = [step_specialization(num_blocks(n, blocksize) * blocksize, tile, decay=decay, neg_step_size=nss,
                                 bias_correction2_sqrt=bc2, eps=eps)
             for n, nss, bc2 in zip(sizes, neg_step_sizes, bc2_sqrts)]
    device = group[0][0][0].device
    meta = torch.tensor([item[k].data_ptr() for k in range(6) for item, _ in group] + sizes,
                        dtype=torch.int64).to(device)
    # fp32 as a launch would round them (nearest), one pair per tensor
    scalars = torch.tensor(neg_step_sizes + bc2_sqrts, dtype=torch.float32).to(device)
    programs = _program_map(tiles, device)
    _adam8bit_many_kernel[(programs.numel(),)](
        meta, scalars, programs, qmap1, qmap2, steps1, steps2, count,
        beta1, 1.0 - beta1, beta2, 1.0 - beta2, eps, decay,
        BLOCKSIZE=blocksize, ROWS=rows, USE_TABLE=use_table,
        DECAY=flags[0]["DECAY"], RESET_KEEPS_P=all(f["RESET_KEEPS_P"] for f in flags),
        INT64=any(f["INT64"] for f in flags), P_DTYPE=_TL_DTYPES[p_dtype], G_DTYPE=_TL_DTYPES[g_dtype],
        num_warps=warps, enable_fp_fusion=False,
    )


def _aligned(item) -> bool:
    """Every address of a step's six tensors and its size are multiples of 16."""
    return item[0].numel() % 16 == 0 and all(t.data_ptr() % 16 == 0 for t in item)


def _fp32(x: float) -> float:
    """``x`` rounded to fp32 as a launch passes it (C's double -> float: nearest, overflow to inf)."""
    return ctypes.c_float(x).value


def step_specialization(padded_n: int, tile: int, *, decay: float, neg_step_size: float,
                        bias_correction2_sqrt: float, eps: float) -> dict:
    """The step kernel's constexpr flags for these hyperparameters (one compiled variant each).

    * ``DECAY``: fp32(1 - lr*wd) != 1. Otherwise ``p * decay == p`` exactly and the multiply
      is left out (Adam, or a weight decay too small to change an fp32 factor).
    * ``RESET_KEEPS_P``: the non-finite rule's "keep the parameter" holds without a final
      select. A reset element has m = v = +0, so its update is ``fp32(-step_size) * (+0) /
      (0 / bc2 + eps)``, which is -0.0 exactly when -step_size is finite with its sign bit set,
      bc2 > 0 and eps > 0 (all in fp32); ``p * 1 + (-0.0) == p`` for every p, -0.0 included,
      and the decay factor of a reset element is then replaced by 1. Otherwise (lr <= 0, eps
      <= 0, ...) the kernel selects ``p`` back at the end.
    * ``INT64``: 64-bit element offsets, needed once ``padded_n`` (blocks x blocksize, rounded
      up to whole tiles) reaches 2**31; int32 offsets below that save address arithmetic.
    """
    neg32 = _fp32(neg_step_size)
    return {
        "DECAY": _fp32(decay) != 1.0,
        "RESET_KEEPS_P": (_fp32(eps) > 0 and _fp32(bias_correction2_sqrt) > 0
                          and math.isfinite(neg32) and math.copysign(1.0, neg32) < 0),
        "INT64": padded_n + tile >= 2**31,
    }


def quantize_blockwise_triton(
    x: torch.Tensor, code: torch.Tensor | None = None, blocksize: int = 256, *, keep_sign: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of :func:`adam8lib.quant.quantize_blockwise`: ``(codes uint8 like x, absmax fp32)``.

    ``keep_sign=True`` applies the states' rule: a non-zero value never rounds to 0 or flips sign.
    """
    require_float(x)
    check_blocksize(blocksize)
    code = check_code(code, x.device)
    _check_runnable(x.device)
    flat = x.reshape(-1).contiguous()
    n, n_blocks = flat.numel(), num_blocks(flat.numel(), blocksize)
    codes = torch.empty(n, dtype=torch.uint8, device=x.device)
    absmax = torch.empty(n_blocks, dtype=torch.float32, device=x.device)
    if n:
        rows, warps = launch_config(blocksize)
        steps, use_table = nearest_code_table(code, keep_sign=bool(keep_sign))
        _launch(_quantize_kernel, n_blocks, rows, warps, flat, codes, absmax, code, steps, n, n_blocks,
                BLOCKSIZE=blocksize, KEEP_SIGN=bool(keep_sign), USE_TABLE=use_table)
    return codes.view(x.shape), absmax


def dequantize_blockwise_triton(
    codes: torch.Tensor,
    absmax: torch.Tensor,
    code: torch.Tensor | None = None,
    blocksize: int = 256,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Triton twin of :func:`adam8lib.quant.dequantize_blockwise`: ``code[codes] * absmax[block]``."""
    code = check_dequantize_inputs(codes, absmax, code, blocksize)
    if dtype not in _PARAM_DTYPES:
        raise TypeError(f"dtype must be one of {list(_PARAM_DTYPES)}, got {dtype}")
    n, n_blocks = codes.numel(), num_blocks(codes.numel(), blocksize)
    _check_runnable(codes.device)
    out = torch.empty(codes.shape, dtype=dtype, device=codes.device)
    if n:
        rows, warps = launch_config(blocksize)
        _launch(_dequantize_kernel, n_blocks, rows, warps,
                codes.reshape(-1).contiguous(), absmax.reshape(-1).to(torch.float32).contiguous(), code, out,
                n, n_blocks, BLOCKSIZE=blocksize)
    return out


def _check_step_tensors(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, n, blocksize) -> None:
    """The shared backend contract (:func:`adam8lib.kernels.contract.check_step_args`), plus what
    the kernel itself needs: a device Triton runs on and a gradient in a dtype it loads."""
    check_step_args(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, blocksize=blocksize)
    if p.device.type not in ("cpu", "cuda"):
        raise ValueError(f"the triton backend needs CUDA (or CPU under TRITON_INTERPRET=1) tensors; p is on {p.device}")
    if g.dtype not in _PARAM_DTYPES:
        raise TypeError(f"g must have dtype in {[str(d) for d in _PARAM_DTYPES]}, got {g.dtype}")


register_backend("triton", adam8bit_step_triton, supports, step_many=adam8bit_step_many_triton)


# ----------------------------------------------------------------------------------------
# What the other kernels build on (triton_fp8.py, triton_4bit.py, triton_rules.py): this lesson's
# tile, moments, parameter update and coding, and the launcher's checks, under public names
# ----------------------------------------------------------------------------------------
tile, moments, store_param, quantize_tile, to_dtype = _tile, _moments, _store_param, _quantize_tile, _to_dtype
step_tile, adam8bit_kernel = _step_tile, _adam8bit_kernel
launch, launch_one, check_runnable, check_step_tensors = _launch, _launch_one, _check_runnable, _check_step_tensors
PARAM_DTYPES = _PARAM_DTYPES
# (The modules that build on these import this one, never the other way round: adam8lib.kernels
# imports them after it, and their steps register themselves.)

