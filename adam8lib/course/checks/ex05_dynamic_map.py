"""Checks for workbook 05 · the dynamic (tree) quantization map and nearest-code lookup."""

from __future__ import annotations

import torch

from ...quant import dynamic_map, linear_map, nearest_code
from ._common import assert_equal, call, fail, passed, require_callable
from ._properties import describe
from ._shapes import call_any_shape
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


def _count_hint(got: torch.Tensor, signed: bool) -> str:
    """What a map with the wrong number of entries most likely did."""
    n, flat = got.numel(), got.reshape(-1)
    has = {v: bool((flat == v).any()) for v in (0.0, 1.0, -1.0)}
    if signed and n == 270 or not signed and n == 263:
        rule = "2**i + 1" if signed else "2**(i+1) + 1"
        return (f"you kept the grid points: take the MIDPOINTS of neighbouring points of linspace(0.1, 1, {rule}), "
                "not the grid points themselves (n points give n - 1 midpoints).")
    if signed and n == 510:
        return ("you used 2**(i+1) + 1 points per decade for the signed map: that is the unsigned count; signed "
                "uses 2**i + 1 (the negatives take the other half of the codes).")
    if not signed and n == 129:
        return ("you used 2**i + 1 points per decade for the unsigned map: unsigned: 2**(i+1) + 1 grid points "
                "per decade (twice as fine: no negatives to store).")
    if n == 254:
        return "you left out 0.0 and 1.0: add both to the decades."
    if n == 255:
        return "you left out 1.0: add both 0.0 and 1.0." if has[0.0] else "you left out 0.0: add both 0.0 and 1.0."
    if n == 257 and has[-1.0]:
        return ("you added -1.0: the signed map's negative side stops at -0.99297; only the positive side gets the "
                "extra entry 1.0.")
    return "7 decades i = 0..6 of midpoints, (negatives if signed), plus 0.0 and 1.0: 256 values in all."


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
        if isinstance(got, (list, tuple)):
            fail(f"{what} returned a {type(got).__name__}, expected a torch.Tensor.",
                 hint=f"you returned a {type(got).__name__}: make it a float32 tensor (torch.cat of the decades' "
                      "tensors, or torch.tensor(values, dtype=torch.float32)).")
        if not isinstance(got, torch.Tensor):
            fail(f"{what} returned {type(got).__name__}, expected a torch.Tensor.", hint="return a 1-D float32 tensor")
        got = got.detach().cpu()
        if got.dim() != 1 or got.numel() != 256:
            fail(f"{what} has shape {tuple(got.shape)}, expected (256,).", hint=_count_hint(got, signed))
        if got.dtype != torch.float32:
            fail(f"{what} has dtype {got.dtype}, expected torch.float32.",
                 hint=f"you returned {got.dtype}: build the map in float32 (torch.linspace(..., "
                      "dtype=torch.float32)), as bitsandbytes does.")
        if bool((got[1:] < got[:-1]).any()):
            fail(f"{what} is not sorted ascending.", hint="you did not sort the values: sort them "
                                                          "(torch.sort(...).values); the nearest-code search is a "
                                                          "binary search.")
        if not torch.equal(got, want) and not torch.equal(got, _map_variant(signed)):
            if torch.equal(got, _map_variant(signed, float64=True)):
                hint = ("you computed in float64 and cast to float32: almost, but not bit-identical; compute the "
                        "grid, the midpoints and the scaling in float32, as bitsandbytes does.")
            elif matches(got, want, rtol=1e-6, atol=0):
                hint = ("almost, but not bit-identical: compute the grid, the midpoints and the scaling in float32 "
                        "(as bitsandbytes does), not in float64 or NumPy and then cast.")
            elif torch.equal(got, _map_variant(signed, scale_offset=7)):
                hint = ("your decades are 10x too small: decade i (0..6) is scaled by 10**(i - 6), the largest "
                        "ends at 1.")
            elif torch.equal(got, _map_variant(signed, scale_offset=5)):
                hint = ("your decades are 10x too large: decade i (0..6) is scaled by 10**(i - 6), the largest "
                        "ends at 1.")
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
    """Values exactly halfway between two neighbouring map entries: a tie in fp32 arithmetic AND in exact
    arithmetic (float64 holds these differences exactly), so that a learner who measures the distances in
    float64 sees the same ties as one who measures them in fp32."""
    mid = (code[:-1] + code[1:]) / 2
    exact = (mid - code[:-1]) == (code[1:] - mid)
    lo64, mid64, hi64 = code[:-1].double(), mid.double(), code[1:].double()
    exact &= (mid64 - lo64) == (hi64 - mid64)
    return mid[exact & (mid > code[:-1]) & (mid < code[1:])]


def _nearest_variant(x, code, *, ties_up=False, only_searchsorted=False, clamp=True, linear=None, normalise=False):
    x = x.float()
    if normalise:
        x = x / x.abs().max()
    if linear == "ends":
        return torch.round((x - code[0]) / (code[-1] - code[0]) * 255).clamp(0, 255).to(torch.uint8)
    if linear == "unit":
        return torch.round((x + 1) / 2 * 255).clamp(0, 255).to(torch.uint8)
    hi = torch.searchsorted(code, x)
    if only_searchsorted:
        return hi.clamp(0, 255).to(torch.uint8) if clamp else hi.to(torch.uint8)
    if clamp:
        hi = hi.clamp(1, 255)
    elif bool((hi > 255).any()):
        return None  # the learner's code raises IndexError there
    lo = hi - 1  # without the clamp, -1 reads the LAST entry
    d_hi, d_lo = code[hi] - x, x - code[lo]
    pick = d_hi <= d_lo if ties_up else d_hi < d_lo
    return torch.where(pick, hi, lo).to(torch.uint8)


_NO_CLAMP = ("you did not clamp searchsorted's index: below the first entry it is 0, so the entry 'before' it is "
             "code[-1] (the LAST entry, 1.0), and above the last entry it is 256 (out of range). Clamp it to 1..255 "
             "before looking at code[hi] and code[hi - 1].")


def _nearest_dtype_hint(dtype) -> str:
    if dtype == torch.int8:
        return ("int8 holds only -128..127, so codes 128..255 wrap to negative numbers: use torch.uint8 "
                "(.to(torch.uint8)).")
    return (f"you returned {dtype} indices: the codes are stored in one byte each, convert the indices with "
            ".to(torch.uint8).")


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
        what = f"nearest_code for {label}"
        try:
            got = call_any_shape(nearest_code_fn, x.shape, x.clone(), code.clone())
        except AssertionError as err:
            if x.dim() == 1 and isinstance(err.__cause__, IndexError):
                fail(str(err), hint=_NO_CLAMP)
            raise
        if got is None:
            fail(f"{what} returned None.", hint="you returned None: end the function with `return codes`.")
        if not isinstance(got, torch.Tensor):
            fail(f"{what} returned {type(got).__name__}, expected a tensor.", hint="return a uint8 tensor of indices")
        if got.dtype != torch.uint8:
            fail(f"{what} has dtype {got.dtype}, expected torch.uint8.", hint=_nearest_dtype_hint(got.dtype))
        if got.shape != want.shape:
            hint = "return one code per element of x, with x's shape."
            if got.numel() == want.numel():
                hint = (f"you returned a flat result (shape {tuple(got.shape)}): keep x's shape, one code per "
                        "element (reshape to x.shape).")
            fail(f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}.", hint=hint)
        if not torch.equal(got, want):
            hint = "pick the index of the map entry closest to x (|code[k] - x| smallest); on an exact tie the lower."
            for h, kw in [
                ("you broke ties towards the UPPER index: on an exact tie (x halfway between two entries) take the "
                 "LOWER index (compare with <, not <=).", {"ties_up": True}),
                ("you returned searchsorted's index: searchsorted gives the first entry >= x, not the nearest; "
                 "also look at the entry before it and take the closer one.", {"only_searchsorted": True}),
                ("you returned searchsorted's index: searchsorted gives the first entry >= x, not the nearest; "
                 "also look at the entry before it and take the closer one.",
                 {"only_searchsorted": True, "clamp": False}),
                (_NO_CLAMP, {"clamp": False}),
                ("you computed the index with a linear formula: the dynamic map is not evenly spaced (most entries "
                 "sit near 0); search the map itself (torch.searchsorted(code, x)).", {"linear": "ends"}),
                ("you computed the index with a linear formula: the dynamic map is not evenly spaced (most entries "
                 "sit near 0); search the map itself (torch.searchsorted(code, x)).", {"linear": "unit"}),
                ("you divided x by its absmax: nearest_code gets values already scaled to [-1, 1]; look them up "
                 "as they are.", {"normalise": True}),
            ]:
                alt = _nearest_variant(x, code, **kw)
                if alt is not None and torch.equal(got, alt):
                    hint = h
                    break
            if hint.startswith("pick the index of the map entry closest"):
                outside = (x.reshape(-1) < code[0]) | (x.reshape(-1) > code[-1])
                bad = (got.reshape(-1) != want.reshape(-1))
                if bool(outside.any()) and bool((bad <= outside).all()):
                    found = (f"only the values beyond the ends of the map (below {float(code[0]):g} or above "
                             f"{float(code[-1]):g}) get a wrong code: they belong to the nearest END entry")
                else:
                    found = describe(got.reshape(-1).long(), want.reshape(-1).long(), x=x.reshape(-1), rtol=0, atol=0)
                hint = f"{found}. The rule: {hint}" if found else hint
            assert_equal(got, want, what=what, hint=hint)
    passed("Exercise 05.2 · Nearest-code lookup")


# ---------------------------------------------------------------------------- 05.3
def decode_fields(index: int, signed: bool = True, *, midpoints: bool = True, offset: int = 6,
                  mirror: bool = True, unsigned_double: bool = True, mirror_offset: int = 126
                  ) -> tuple[int, int, int, float]:
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
        j = index - 128 if sign > 0 else ((mirror_offset - index) if mirror else (index))
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


def _tree_code(index: int, signed: bool) -> int:
    """The tree code of a non-special entry: j + 1 (signed) or j + 2 (unsigned)."""
    if signed:
        return (index - 128 if index > 127 else 126 - index) + 1
    return index - 1 + 2


def _fields_hint(index: int, signed: bool, got: tuple, want: tuple) -> str:
    """What is wrong with the (sign, decade, fraction) that the learner returned."""
    zero = 127 if signed else 0
    if index == zero:
        return "the zero entry has sign 0: it is (0, 0, 0, 0.0)."
    if index == 255:
        return "the entry 1.0 is (1, 7, 0, 1.0): it sits above the decades 0…6, with no fraction."
    if got[0] != want[0]:
        return ("the sign is +1 for indices above the zero entry, -1 below it" if signed else
                "the unsigned map has no negative entries: sign +1 for every entry but 0.0.")
    if got[1] == want[1] + 1 and got[2] == want[2]:
        return ("you took decade = bit_length(): bit_length() is the leading 1's position PLUS one, so "
                "decade = tree.bit_length() - 1" + ("" if signed else " - 1 (one more for the unsigned map)") + ".")
    if got[2] == _tree_code(index, signed):
        return ("you returned the whole tree code as the fraction: k is the bits AFTER the leading 1, "
                "tree - 2**(position of the leading 1).")
    return ("sign is -1/0/+1 (0 only for the zero code), decade 0…6 (7 for the code of 1.0), fraction "
            "k = the bits after the leading 1 (0 for 0.0 and 1.0).")


def check_decode_code(decode_code) -> None:
    """``decode_code(index, signed=True)`` -> ``(sign, decade, fraction, value)`` for all 512 entries."""
    require_callable(decode_code, "decode_code")
    wrong = [
        ("you took the grid point 0.1 + 0.9 * k / (n - 1): each value is the *midpoint* of two neighbouring grid "
         "points, 0.1 + 0.9 * (2k + 1) / (2n).", dict(midpoints=False)),
        ("your values are 10x too small: decade i is scaled by 10**(i - 6) (decade 6 covers [0.1, 1], decade 0 "
         "starts at 5.5e-7).", dict(offset=7)),
        ("your values are 10x too large: decade i is scaled by 10**(i - 6) (decade 6 covers [0.1, 1], decade 0 "
         "starts at 5.5e-7).", dict(offset=5)),
        ("you read negative entries like positive ones (j = index): negative codes mirror the positive ones, "
         "index i is minus index 254 - i, so j = 126 - index (index 126 is the smallest negative magnitude).",
         dict(mirror=False)),
        ("you used j = 127 - index for the negative entries: index i is minus index 254 - i, so j = 126 - index.",
         dict(mirror_offset=127)),
        ("you read the unsigned map like the signed one (tree code j + 1): it has no sign bit, so each decade "
         "has one more fraction bit: j = index - 1, the tree code is j + 2, and decade i holds 2**(i+1) values.",
         dict(unsigned_double=False)),
    ]
    for signed in (True, False):
        table = dynamic_map(signed)
        for index in range(256):
            got = call(decode_code, index, signed=signed)
            what = f"decode_code({index}, signed={signed})"
            if got is None:
                fail(f"{what} returned None.", "you returned None: end with `return sign, decade, fraction, value`.")
            if isinstance(got, (int, float)) or (isinstance(got, torch.Tensor) and got.numel() == 1):
                fail(f"{what} returned {got!r}",
                     "you returned only the value: return a tuple (sign, decade, fraction, value).")
            if not isinstance(got, tuple) or len(got) != 4:
                fail(f"{what} returned {got!r}", "return a tuple (sign, decade, fraction, value).")
            want = decode_fields(index, signed)
            if matches(float(got[3]), float(table[index]), rtol=2e-6, atol=0) and tuple(got[:3]) == want[:3]:
                continue
            fields_hint = None if tuple(got[:3]) == want[:3] else _fields_hint(index, signed, got, want)
            if fields_hint and fields_hint.startswith("you took decade = bit_length()"):
                fail(f"{what}: fields {tuple(got[:3])!r}, expected (sign, decade, fraction) = {want[:3]!r}",
                     fields_hint)
            for hint, kwargs in wrong:
                alt = decode_fields(index, signed, **kwargs)
                if alt[3] != want[3] and matches(float(got[3]), alt[3], rtol=2e-6, atol=0):
                    fail(f"{what}: value {got[3]!r}, expected {float(table[index])!r} (the map's entry)", hint)
            if not matches(float(got[3]), float(table[index]), rtol=2e-6, atol=0):
                fail(f"{what}: value {got[3]!r}, expected {float(table[index])!r} (the map's entry)",
                     "read the fields first: sign, then the leading 1 of the tree code (its position is the "
                     "decade), then the bits after it (the fraction k); compare with dynamic_map(signed)[index].")
            fail(f"{what}: fields {tuple(got[:3])!r}, expected (sign, decade, fraction) = {want[:3]!r}", fields_hint)
    passed("Exercise 05.3 · Decode a code")
