"""Quantization: linear (absmax) int8, the dynamic tree map, and blockwise quantization.

Three ideas, in the order the course teaches them:

1. **Linear absmax int8** (lesson 04). One scale per tensor::

       q = round(127 * x / max|x|)          x ≈ q * max|x| / 127

   Simple, but one outlier stretches the scale and every small value collapses to 0.

2. **The dynamic (tree) map** (lesson 05). 256 fp32 values, dense near 0 and sparse near
   ±1, covering seven decades (1e-7 … 1). A value is stored as the *index* (a uint8 "code")
   of the nearest map entry to ``x / absmax``. ``dynamic_map`` rebuilds the table that
   bitsandbytes uses, with the same bits on every machine (each grid point rounded once;
   bitsandbytes' own table moves by an ulp here and there with torch's CPU vector path).

3. **Blockwise** (lesson 06). Cut the flat tensor into blocks of ``blocksize`` elements and
   keep one fp32 ``absmax`` per block, so an outlier only hurts its own block::

       absmax[b] = max_{i in b} |x_i|           code_i = argmin_k |map[k] - x_i / absmax[b]|
       x_i ≈ map[code_i] * absmax[b]

Rounding rule (used by every backend, Triton included): the code is the *exact* nearest
map entry; on an exact tie the lower index wins. An all-zero block has ``absmax = 0`` and
stores the code of 0.0, so it dequantizes to exact zeros (no NaN).
"""

from __future__ import annotations

import hashlib
from fractions import Fraction

import numpy
import torch

__all__ = [
    "absmax_quantize",
    "absmax_dequantize",
    "dynamic_map",
    "linear_map",
    "exact_linspace",
    "map_fingerprint",
    "MAP_FINGERPRINTS",
    "nearest_code",
    "quantize_blockwise",
    "dequantize_blockwise",
    "num_blocks",
    "check_blocksize",
    "check_code",
    "check_dequantize_inputs",
    "require_float",
    "quantize_blocks",
    "dequantize_blocks",
    "SUPPORTED_BLOCKSIZES",
]

#: Blocksizes accepted everywhere: powers of two from 64 to 4096 (bitsandbytes uses 256,
#: the 8-bit optimizers paper used 2048).
SUPPORTED_BLOCKSIZES = tuple(2**k for k in range(6, 13))


def require_float(x: torch.Tensor, what: str = "x") -> None:
    """Raise TypeError unless ``x`` is a floating-point tensor (``what`` names it in the message)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{what} must be a floating-point tensor to quantize, got dtype {x.dtype}")


def check_blocksize(blocksize: int) -> int:
    """Return ``blocksize`` if it is supported, else raise ValueError."""
    if isinstance(blocksize, bool) or not isinstance(blocksize, int) or blocksize not in SUPPORTED_BLOCKSIZES:
        raise ValueError(
            f"Unsupported blocksize: {blocksize!r}; use a power of two in {list(SUPPORTED_BLOCKSIZES)}"
        )
    return blocksize


def num_blocks(n: int, blocksize: int) -> int:
    """Number of blocks for ``n`` elements: ceil(n / blocksize) (the tail block may be short)."""
    return -(-n // blocksize)


# ----------------------------------------------------------------------------------------
# 1. Linear absmax int8
# ----------------------------------------------------------------------------------------
def absmax_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric linear int8 quantization with one scale for the whole tensor.

    Returns ``(q, absmax)`` with ``q = round(127 * x / absmax)`` as int8 and ``absmax``
    a 0-d fp32 tensor. An all-zero tensor gives ``absmax = 0`` and ``q = 0``.
    """
    require_float(x)
    x32 = x.float()
    absmax = x32.abs().amax() if x32.numel() else torch.zeros((), dtype=torch.float32)
    scale = torch.where(absmax > 0, 127.0 / absmax, torch.zeros_like(absmax))
    q = torch.round(x32 * scale).clamp_(-127, 127).to(torch.int8)
    return q, absmax


def absmax_dequantize(q: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`absmax_quantize`: ``q * absmax / 127`` in fp32."""
    if q.dtype != torch.int8:
        raise TypeError(f"q must be int8 codes from absmax_quantize, got dtype {q.dtype}")
    return q.float() * (torch.as_tensor(absmax, dtype=torch.float32) / 127.0)


# ----------------------------------------------------------------------------------------
# 2. Quantization maps
# ----------------------------------------------------------------------------------------
# Every map is built from scalars, never from a vectorized torch kernel: torch.linspace rounds
# differently on different CPU vector paths (its AVX2/AVX-512 kernels fuse start + step*k into
# one rounding, the generic kernel rounds the product first), so a map built with it has other
# bits on other machines, and a checkpoint's codes would decode differently after a move.
def _round_to_float32(x: Fraction) -> float:
    """``x`` rounded once to the nearest float32 (ties to even), returned as a Python float."""
    nearest = numpy.float32(float(x))  # float(x) is correctly rounded; float32 may round again
    candidates = (numpy.nextafter(nearest, numpy.float32(-numpy.inf)), nearest,
                  numpy.nextafter(nearest, numpy.float32(numpy.inf)))
    best = min(candidates, key=lambda c: (abs(Fraction(float(c)) - x), int(c.view(numpy.uint32)) & 1))
    return float(best)


def _f32(x: float) -> float:
    """A Python float rounded to float32 (one IEEE conversion; the same on every machine)."""
    return float(numpy.float32(x))


def exact_linspace(start: float, end: float, steps: int) -> list[float]:
    """``torch.linspace(start, end, steps, dtype=torch.float32)`` with every point rounded once.

    torch's formula: ``step = (end - start) / (steps - 1)`` in float32, then point ``k`` is
    ``start + step * k`` for the first half and ``end - step * (steps - 1 - k)`` for the
    second. Here each point is computed exactly (rational arithmetic) and rounded once to
    float32, which is what torch's AVX2 and AVX-512 kernels compute (with a fused multiply-add)
    and what its generic kernel does not always give (it rounds ``step * k`` first).
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 2:
        raise ValueError(f"steps must be an int >= 2, got {steps!r}")
    start32, end32 = _f32(start), _f32(end)
    step32 = float(numpy.float32(_f32(end32 - start32)) / numpy.float32(steps - 1))  # float32 ops, as torch
    half = steps // 2
    points = []
    for k in range(steps):
        if k < half:
            exact = Fraction(start32) + Fraction(step32) * k
        else:
            exact = Fraction(end32) - Fraction(step32) * (steps - 1 - k)
        points.append(_round_to_float32(exact))
    return points


def dynamic_map(signed: bool = True, max_exponent_bits: int = 7, total_bits: int = 8) -> torch.Tensor:
    """The dynamic (tree) quantization map with ``2**total_bits`` entries, sorted ascending, fp32.

    Built the way the 8-bit optimizers paper describes it (and bitsandbytes'
    ``create_dynamic_map``): ``max_exponent_bits`` "decades" 10^-(E-1) … 1; decade ``i`` holds
    the midpoints of an evenly spaced grid on [0.1, 1] scaled by ``10**(i - E + 1)``. With 8 bits
    (E = 7) decade ``i`` has ``2**i`` values (signed, mirrored to the negatives) or ``2**(i+1)``
    values (unsigned, all positive, so twice as fine). Then 0 and 1.0 are added.

    * signed: range [-0.99297, 1.0], 0.0 at index 127 — used for Adam's first moment ``m``;
    * unsigned: range [0, 1.0], 0.0 at index 0 — used for the second moment ``v >= 0``;
    * ``max_exponent_bits=3, total_bits=4``: the 16-entry map of 4-bit states.

    **The canonical values.** The grid is :func:`exact_linspace` (each point rounded once to
    float32); the midpoints ``(a + b) / 2`` and the scaling by ``float32(10**(i - E + 1))`` are
    float32 operations, correctly rounded on every machine. So the map has the same bits
    everywhere (:data:`MAP_FINGERPRINTS` pins them; tests rebuild them under two CPU
    capabilities). bitsandbytes builds its map with ``torch.linspace``, whose AVX2/AVX-512
    kernels give these same values: there ``dynamic_map`` is bit-identical to
    ``create_dynamic_map`` (tested). On a machine where torch runs its generic CPU kernels
    (``ATEN_CPU_CAPABILITY=default``, or a CPU without AVX2), bitsandbytes' map differs from
    these in a few dozen entries by 1-2 ulp, and this one does not move.
    """
    for name, value in (("max_exponent_bits", max_exponent_bits), ("total_bits", total_bits)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if max_exponent_bits != total_bits - 1 or total_bits < 2:
        raise ValueError(
            f"dynamic_map builds maps with max_exponent_bits = total_bits - 1 (7 for 8 bits, 3 for 4 bits); "
            f"got max_exponent_bits={max_exponent_bits}, total_bits={total_bits}"
        )
    values = [0.0, 1.0]
    for i in range(max_exponent_bits):
        n_points = (2**i if signed else 2 ** (i + 1)) + 1
        grid = numpy.array(exact_linspace(0.1, 1.0, n_points), dtype=numpy.float32)
        midpoints = (grid[:-1] + grid[1:]) / numpy.float32(2.0)
        decade = midpoints * numpy.float32(10.0 ** (i - max_exponent_bits + 1))  # float32 times float32
        values.extend(decade.tolist())
        if signed:
            values.extend((-decade).tolist())
    assert len(values) == 2**total_bits, len(values)
    return torch.tensor(sorted(values), dtype=torch.float32)


def linear_map(signed: bool = True) -> torch.Tensor:
    """A 256-entry *linear* map (evenly spaced), for comparing against the dynamic map.

    signed: ``linspace(-1, 1, 256)``; unsigned: ``linspace(0, 1, 256)``, each point rounded
    once (:func:`exact_linspace`: the same bits on every machine). Used with
    :func:`quantize_blockwise` it gives plain blockwise linear quantization.
    """
    return torch.tensor(exact_linspace(-1.0 if signed else 0.0, 1.0, 256), dtype=torch.float32)


#: The fingerprints (:func:`map_fingerprint`) of the canonical maps. They pin the values: a test
#: rebuilds every map in processes with torch's generic and vectorized CPU kernels and compares.
#: Changing a map changes the meaning of every stored code (checkpoints refuse a mismatch).
MAP_FINGERPRINTS = {
    "dynamic, signed, 8 bits": "e732639a65f497b4",
    "dynamic, unsigned, 8 bits": "305f002cc11278fb",
    "dynamic, signed, 4 bits": "721d11e3711326d4",
    "dynamic, unsigned, 4 bits": "3ba95dde3870dc0e",
    "linear, signed, 8 bits": "d88eea2f793473b6",
    "linear, unsigned, 8 bits": "7cb9ea560989533d",
}


def map_fingerprint(*maps: torch.Tensor) -> str:
    """A short fingerprint of quantization maps: the first 16 hex digits of the sha256 of their
    float32 bytes (little-endian), in order. Checkpoints carry it, so that codes are never
    decoded with another table than the one that made them."""
    digest = hashlib.sha256()
    for qmap in maps:
        digest.update(qmap.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4").tobytes())
    return digest.hexdigest()[:16]


def nearest_code(x: torch.Tensor, code: torch.Tensor, *, keep_sign: bool = False) -> torch.Tensor:
    """Index (uint8) of the nearest entry of the sorted map ``code`` for each value of ``x``.

    Binary search (``searchsorted``) finds the first entry ``>= x``; the answer is that entry
    or the one before it, whichever is closer; on an exact tie the lower index wins.

    ``keep_sign=True`` is the rule the optimizer uses when it requantizes its states: a
    non-zero value never becomes 0 or changes sign. A negative value whose nearest entry is
    ``>= 0`` moves one code down, a positive value whose nearest entry is ``<= 0`` one code
    up (to the smallest entry of the right sign). bitsandbytes' GPU kernel applies the
    negative half of this rule to ``m``; the positive half matters for ``v``: a tiny ``v``
    rounded to 0 would leave ``m / (sqrt(v) + eps)`` divided by ``eps`` alone on the next step.
    """
    x = x.float()
    hi = torch.searchsorted(code, x).clamp_(1, code.numel() - 1)
    lo = hi - 1
    pick_hi = (code[hi] - x) < (x - code[lo])
    idx = torch.where(pick_hi, hi, lo)
    if keep_sign:
        idx = idx - ((x < 0) & (code[idx] >= 0)).long() + ((x > 0) & (code[idx] <= 0)).long()
    return idx.to(torch.uint8)


# ----------------------------------------------------------------------------------------
# 3. Blockwise quantization
# ----------------------------------------------------------------------------------------
def _as_blocks(flat: torch.Tensor, blocksize: int) -> torch.Tensor:
    """View a flat tensor as (num_blocks, blocksize), zero-padding the ragged tail."""
    n = flat.numel()
    pad = num_blocks(n, blocksize) * blocksize - n
    if pad:
        flat = torch.nn.functional.pad(flat, (0, pad))
    return flat.view(-1, blocksize)


def quantize_blocks(
    flat32: torch.Tensor, code: torch.Tensor, blocksize: int, *, keep_sign: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a flat fp32 tensor: returns (codes uint8 flat, absmax fp32 per block).

    The building block shared by :func:`quantize_blockwise` and the optimizer backends.
    """
    n = flat32.numel()
    blocks = _as_blocks(flat32, blocksize)
    absmax = blocks.abs().amax(dim=1)
    inv = torch.where(absmax > 0, 1.0 / absmax, torch.zeros_like(absmax))
    normalized = (blocks * inv[:, None]).view(-1)[:n]
    return nearest_code(normalized, code, keep_sign=keep_sign), absmax


def dequantize_blocks(codes: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, blocksize: int) -> torch.Tensor:
    """Inverse of :func:`quantize_blocks`: flat fp32 values ``code[codes] * absmax[block]``."""
    n = codes.numel()
    values = _as_blocks(code[codes.long()], blocksize)
    return (values * absmax[:, None]).view(-1)[:n]


def quantize_blockwise(
    x: torch.Tensor, code: torch.Tensor | None = None, blocksize: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise quantization with a 256-entry map (the signed dynamic map by default).

    Returns ``(codes, absmax)``: ``codes`` is uint8 with the shape of ``x``; ``absmax`` is
    fp32 with ``ceil(x.numel() / blocksize)`` entries. Any length works (the last block may
    be short) and non-contiguous inputs are read in their logical (row-major) order.
    """
    require_float(x)
    check_blocksize(blocksize)
    code = check_code(code, x.device)
    codes, absmax = quantize_blocks(x.reshape(-1).float(), code, blocksize)
    return codes.view(x.shape), absmax


def dequantize_blockwise(
    codes: torch.Tensor,
    absmax: torch.Tensor,
    code: torch.Tensor | None = None,
    blocksize: int = 256,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Inverse of :func:`quantize_blockwise`: ``code[codes] * absmax[block]``, shape kept."""
    code = check_dequantize_inputs(codes, absmax, code, blocksize)
    out = dequantize_blocks(codes.reshape(-1), absmax.reshape(-1).float(), code, blocksize)
    return out.view(codes.shape).to(dtype)


def check_dequantize_inputs(
    codes: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor | None, blocksize: int
) -> torch.Tensor:
    """Validate dequantization inputs (shared by every backend); return the map to use."""
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        raise TypeError(f"codes must be a uint8 tensor, got {getattr(codes, 'dtype', type(codes).__name__)}")
    check_blocksize(blocksize)
    code = check_code(code, codes.device)
    n, expected = codes.numel(), num_blocks(codes.numel(), blocksize)
    if not isinstance(absmax, torch.Tensor) or absmax.numel() != expected:
        got = absmax.numel() if isinstance(absmax, torch.Tensor) else type(absmax).__name__
        raise ValueError(f"absmax has {got} entries but {n} codes in blocks of {blocksize} need {expected}")
    return code


def check_code(code: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """Validate a quantization map (256 floats, sorted ascending) and return it as fp32 on
    ``device``; ``None`` means the signed dynamic map."""
    if code is None:
        return dynamic_map(signed=True).to(device)
    require_float(code, "code")
    if code.shape != (256,):
        raise ValueError(f"code must be a 256-entry map, got shape {tuple(code.shape)}")
    if bool((code[1:] < code[:-1]).any()):
        raise ValueError("code must be sorted ascending (nearest-code search is a binary search)")
    return code.to(device=device, dtype=torch.float32)


