"""Checks for workbook 05 · the dynamic (tree) quantization map and nearest-code lookup."""

from __future__ import annotations

import torch

from ...quant import dynamic_map, linear_map, nearest_code
from ._common import assert_equal, call, fail, passed, require_callable
from ._variants import matches

__all__ = ["check_dynamic_map", "check_nearest_code", "check_decode_code", "decode_fields"]


def _map_variant(signed: bool, *, float64=False, midpoints=True, unsigned_double=True, scale_offset=6):
    """The map built with torch.linspace (bitsandbytes' recipe as this machine's torch rounds it), or
    a wrong variant of it."""
    dtype = torch.float64 if float64 else torch.float32
    values = [torch.tensor([0.0, 1.0], dtype=dtype)]
    for i in range(7):
        n = (2**i if signed or not unsigned_double else 2 ** (i + 1)) + 1
        grid = torch.linspace(0.1, 1.0, n, dtype=dtype)
        dec = ((grid[:-1] + grid[1:]) / 2 if midpoints else grid) * (10.0 ** (i - scale_offset))
        values.append(dec)
        if signed:
            values.append(-dec)
    return torch.sort(torch.cat(values)).values.float()


# ---------------------------------------------------------------------------- 05.1
def check_dynamic_map(dynamic_map_from_scratch) -> None:
    """``dynamic_map_from_scratch(signed=True)``: bit-identical to bitsandbytes' recipe in float32.

    Two answers are right: the canonical map (adam8lib.quant.dynamic_map, each grid point rounded
    once) and the map that bitsandbytes' recipe gives with *this machine's* torch.linspace, whose
    generic CPU kernel rounds a few dozen grid points differently from its AVX2/AVX-512 kernels.
    So a learner's float32 torch.linspace solution earns its point on every machine.
    """
    require_callable(dynamic_map_from_scratch, "dynamic_map_from_scratch")
    for signed in (True, False):
        want = dynamic_map(signed)
        got = call(dynamic_map_from_scratch, signed=signed)
        what = f"dynamic_map_from_scratch(signed={signed})"
        if not isinstance(got, torch.Tensor):
            fail(f"{what} returned {type(got).__name__}, expected a torch.Tensor.", hint="return a 1-D float32 tensor")
        got = got.detach().cpu()
        if got.dim() != 1 or got.numel() != 256:
            hints = {
                (True, 270): "take the MIDPOINTS of linspace(0.1, 1, 2**i + 1), not the grid points themselves.",
                (False, 263): "take the MIDPOINTS of linspace(0.1, 1, 2**(i+1) + 1), not the grid points themselves.",
                (True, 510): "signed: 2**i + 1 grid points per decade (the negatives double the count).",
                (False, 129): "unsigned: 2**(i+1) + 1 grid points per decade (twice as fine: no negatives to store).",
                (True, 254): "append 0.0 and 1.0 to the decades.",
                (False, 254): "append 0.0 and 1.0 to the decades.",
                (True, 255): "append BOTH 0.0 and 1.0.",
                (False, 255): "append BOTH 0.0 and 1.0.",
            }
            fail(f"{what} has shape {tuple(got.shape)}, expected (256,).",
                 hint=hints.get((signed, got.numel()), "7 decades i = 0..6 of midpoints, (negatives if signed), "
                                                        "plus 0.0 and 1.0: 256 values in all."))
        if got.dtype != torch.float32:
            fail(f"{what} has dtype {got.dtype}, expected torch.float32.",
                 hint="build the map in float32 (torch.linspace(..., dtype=torch.float32)), as bitsandbytes does.")
        if bool((got[1:] < got[:-1]).any()):
            fail(f"{what} is not sorted ascending.", hint="sort the values (torch.sort(...).values): the "
                                                          "nearest-code search is a binary search.")
        if not torch.equal(got, want) and not torch.equal(got, _map_variant(signed)):
            if matches(got, want, rtol=1e-6, atol=0):
                hint = ("almost, but not bit-identical: compute the grid, the midpoints and the scaling in float32 "
                        "(as bitsandbytes does), not in float64 or NumPy and then cast.")
            elif torch.equal(got, _map_variant(signed, scale_offset=7)) or torch.equal(got, _map_variant(
                    signed, scale_offset=5)):
                hint = "decade i (0..6) is scaled by 10**(i - 6): the largest decade ends at 1, the smallest at 1e-6."
            elif got[0] == -1.0 or got.min() < want.min() - 1e-6:
                hint = "the negative half has no -1.0: only the positive side gets the extra entry 1.0."
            else:
                hint = "decade i: midpoints of linspace(0.1, 1, n_i) times 10**(i-6), for i = 0..6."
            assert_equal(got, want, what=what + " vs adam8lib.quant.dynamic_map", hint=hint)
        zero_at = 127 if signed else 0
        assert_equal(float(got[zero_at]), 0.0, what=f"{what}[{zero_at}]",
                     hint="0.0 must be in the map (so zero states are stored exactly).")
    passed("Exercise 05.1 · The dynamic map from scratch")


# ---------------------------------------------------------------------------- 05.2
def _ties(code: torch.Tensor) -> torch.Tensor:
    """Values exactly halfway between two neighbouring map entries (in fp32 arithmetic)."""
    mid = (code[:-1] + code[1:]) / 2
    exact = (mid - code[:-1]) == (code[1:] - mid)
    return mid[exact & (mid > code[:-1]) & (mid < code[1:])]


def _nearest_variant(x, code, *, ties_up=False, only_searchsorted=False, clamp=True):
    x = x.float()
    hi = torch.searchsorted(code, x)
    if only_searchsorted:
        return hi.clamp(0, 255).to(torch.uint8) if clamp else hi.to(torch.uint8)
    hi = hi.clamp(1, 255)
    lo = hi - 1
    d_hi, d_lo = code[hi] - x, x - code[lo]
    pick = d_hi <= d_lo if ties_up else d_hi < d_lo
    return torch.where(pick, hi, lo).to(torch.uint8)


def check_nearest_code(nearest_code_fn) -> None:
    """``nearest_code(x, code) -> uint8``: index of the nearest map entry; ties -> lower index."""
    require_callable(nearest_code_fn, "nearest_code")
    gen = torch.Generator().manual_seed(5)
    smap, umap = dynamic_map(True), dynamic_map(False)
    cases = [
        ("uniform values in [-1, 1], signed map", torch.rand(2000, generator=gen) * 2 - 1, smap),
        ("small values (|x| < 1e-3), signed map", (torch.rand(500, generator=gen) * 2 - 1) * 1e-3, smap),
        ("the map's own entries", smap.clone(), smap),
        ("values exactly halfway between two entries (ties -> lower index)", _ties(smap), smap),
        ("values beyond the ends of the map", torch.tensor([-5.0, -1.0, 1.0, 1.5, 2.0]), smap),
        ("uniform values in [0, 1], unsigned map", torch.rand(1000, generator=gen), umap),
        ("ties in the unsigned map", _ties(umap), umap),
        ("a (3, 7) matrix, signed map (shape kept)", torch.rand(3, 7, generator=gen) * 2 - 1, smap),
        ("the linear map", torch.rand(300, generator=gen) * 2 - 1, linear_map(True)),
    ]
    for label, x, code in cases:
        want = nearest_code(x, code)
        got = call(nearest_code_fn, x.clone(), code.clone())
        what = f"nearest_code for {label}"
        if not isinstance(got, torch.Tensor):
            fail(f"{what} returned {type(got).__name__}, expected a tensor.", hint="return a uint8 tensor of indices")
        if got.dtype != torch.uint8:
            fail(f"{what} has dtype {got.dtype}, expected torch.uint8.",
                 hint="the codes are stored in one byte each: convert the indices with .to(torch.uint8).")
        if got.shape != want.shape:
            fail(f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}.",
                 hint="return one code per element of x, with x's shape.")
        if not torch.equal(got, want):
            hint = "pick the index of the map entry closest to x (|code[k] - x| smallest); on an exact tie the lower."
            for h, kw in [
                ("on an exact tie (x halfway between two entries) take the LOWER index.", {"ties_up": True}),
                ("searchsorted gives the first entry >= x: also look at the entry before it and take the closer one.",
                 {"only_searchsorted": True}),
                ("values beyond the map's ends must map to the first/last entry: clamp the index to 0..255.",
                 {"only_searchsorted": True, "clamp": False}),
            ]:
                if torch.equal(got, _nearest_variant(x, code, **kw)):
                    hint = h
                    break
            assert_equal(got, want, what=what, hint=hint)
    passed("Exercise 05.2 · Nearest-code lookup")


# ---------------------------------------------------------------------------- 05.3
def decode_fields(index: int, signed: bool = True, *, midpoints: bool = True, offset: int = 6,
                  mirror: bool = True, unsigned_double: bool = True) -> tuple[int, int, int, float]:
    """(sign, decade, fraction, value) of map entry ``index``, read from the index's bits.

    Positive entries of the signed map sit at 128…254 (255 is 1.0, 127 is 0.0); with
    ``j = index - 128`` the 7-bit number ``j + 1`` is the tree code: its leading 1 is at bit
    ``decade`` (so ``6 - decade`` zeros before it) and the bits after it are the fraction ``k``.
    Negative entries mirror the positive ones: ``index`` and ``254 - index``. The unsigned map
    has no sign bit, so one more fraction bit: ``j = index - 1`` and ``j + 2`` is the code. The
    value is ``sign * 10**(decade - 6) * (g_k + g_{k+1}) / 2`` on the grid ``g`` of lesson 05.
    The keyword arguments build the usual wrong readings (for the check's hints).
    """
    last = 255
    if index == last:
        return 1, 7, 0, 1.0
    if signed:
        if index == 127:
            return 0, 0, 0, 0.0
        sign = 1 if index > 127 else -1
        j = index - 128 if sign > 0 else ((126 - index) if mirror else (index))
        code = j + 1
    else:
        if index == 0:
            return 0, 0, 0, 0.0
        sign, j = 1, index - 1
        code = j + 2 if unsigned_double else j + 1
    lead = code.bit_length() - 1
    decade = lead - 1 if (not signed and unsigned_double) else lead
    k = code - (1 << lead)
    n = 1 << lead  # values in this decade
    frac = (2 * k + 1) / (2 * n) if midpoints else k / max(n - 1, 1)
    value = sign * 10.0 ** (decade - offset) * (0.1 + 0.9 * frac)
    return sign, decade, k, value


def check_decode_code(decode_code) -> None:
    """``decode_code(index, signed=True)`` -> ``(sign, decade, fraction, value)`` for all 512 entries."""
    require_callable(decode_code, "decode_code")
    wrong = [
        ("each value is the *midpoint* of two neighbouring grid points: 0.1 + 0.9 * (2k + 1) / (2n), "
         "not the grid point 0.1 + 0.9 * k / (n - 1).", dict(midpoints=False)),
        ("decade i is scaled by 10**(i - 6): decade 6 covers [0.1, 1], decade 0 is 5.5e-7.", dict(offset=7)),
        ("decade i is scaled by 10**(i - 6): decade 6 covers [0.1, 1], decade 0 is 5.5e-7.", dict(offset=5)),
        ("negative codes mirror the positive ones: index 126 is the *smallest* negative magnitude "
         "(j = 126 - index), index 0 the largest.", dict(mirror=False)),
        ("the unsigned map has no sign bit, so each decade has one more fraction bit: "
         "j = index - 1 and the tree code is j + 2 (decade i holds 2**(i+1) values).", dict(unsigned_double=False)),
    ]
    for signed in (True, False):
        table = dynamic_map(signed)
        for index in range(256):
            got = call(decode_code, index, signed=signed)
            what = f"decode_code({index}, signed={signed})"
            if not isinstance(got, tuple) or len(got) != 4:
                fail(f"{what} returned {got!r}", "return a tuple (sign, decade, fraction, value).")
            want = decode_fields(index, signed)
            if matches(float(got[3]), float(table[index]), rtol=2e-6, atol=0) and tuple(got[:3]) == want[:3]:
                continue
            for hint, kwargs in wrong:
                alt = decode_fields(index, signed, **kwargs)
                if alt[3] != want[3] and matches(float(got[3]), alt[3], rtol=2e-6, atol=0):
                    fail(f"{what}: value {got[3]!r}, expected {float(table[index])!r} (the map's entry)", hint)
            if not matches(float(got[3]), float(table[index]), rtol=2e-6, atol=0):
                fail(f"{what}: value {got[3]!r}, expected {float(table[index])!r} (the map's entry)",
                     "read the fields first: sign, then the leading 1 of the tree code (its position is the "
                     "decade), then the bits after it (the fraction k); compare with dynamic_map(signed)[index].")
            fail(f"{what}: fields {tuple(got[:3])!r}, expected (sign, decade, fraction) = {want[:3]!r}",
                 "sign is -1/0/+1 (0 only for the zero code), decade 0…6 (7 for the code of 1.0), fraction "
                 "k = the bits after the leading 1 (0 for 0.0 and 1.0).")
    passed("Exercise 05.3 · Decode a code")
