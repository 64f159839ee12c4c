"""Checks for workbook 12 · beyond 8 bits: packing 4-bit codes, the zero-point problem, rank-1
normalization, stochastic rounding to bf16."""

from __future__ import annotations

import torch

from ...formats import pack_nibbles, unpack_nibbles
from ...quant import dequantize_blocks, dynamic_map, nearest_code, quantize_blocks
from ._common import assert_close, assert_equal, call, fail, passed, refail, require_callable

__all__ = ["check_pack_nibbles", "check_zero_point_victims", "check_rank1_scale", "check_stochastic_round"]


# ---------------------------------------------------------------------------- 12.1
def _codes(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 16, (n,), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def check_pack_nibbles(pack, unpack) -> None:
    """``pack(codes) -> bytes`` (element 2i in the high nibble), ``unpack(bytes, n) -> codes``."""
    require_callable(pack, "pack")
    require_callable(unpack, "unpack")
    cases = [("two codes, 1 and 2", torch.tensor([1, 2], dtype=torch.uint8)),
             ("every pair of codes", torch.arange(16, dtype=torch.uint8).repeat_interleave(16).roll(3)),
             ("an odd count (5 codes)", torch.tensor([15, 0, 7, 9, 1], dtype=torch.uint8)),
             ("1,001 random codes", _codes(1001, 12)), ("one code", torch.tensor([11], dtype=torch.uint8))]
    for label, codes in cases:
        want = pack_nibbles(codes)
        what = f"pack({label})"
        try:
            got = call(pack, codes.clone())
        except AssertionError as exc:
            if codes.numel() % 2 and "not implemented yet" not in str(exc):
                refail(exc, hint=f"an odd number of codes cannot be paired as it is: {label} leaves the last code "
                                    "without a partner. Pad one 0 code at the END first (n codes take ceil(n / 2) "
                                    "bytes).")
            raise
        if not isinstance(got, torch.Tensor):
            fail(f"{what} returned {type(got).__name__}, expected a uint8 tensor.",
                 hint="return the bytes as a torch tensor (one byte per pair of codes), not a list or a number.")
        if got.dtype != torch.uint8:
            fail(f"{what} has dtype {got.dtype}, expected torch.uint8.",
                 hint=f"a byte holds two codes: your arithmetic promoted the bytes to {got.dtype}. Keep every step "
                      "in uint8 (or convert back at the end).")
        if got.numel() != want.numel():
            hint = ("an odd number of codes still needs its last byte: pad with one 0 code "
                    "(ceil(n / 2) bytes)." if codes.numel() % 2 else "n codes fit in n / 2 bytes: two per byte.")
            fail(f"{what} has {got.numel()} bytes, expected {want.numel()}.", hint=hint)
        if not torch.equal(got, want):
            padded = torch.cat([codes, codes.new_zeros(codes.numel() % 2)])
            front = torch.cat([codes.new_zeros(codes.numel() % 2), codes])
            variants = [
                ("the nibbles are swapped: element 2i goes in the HIGH nibble (the upper 4 bits of byte i), element "
                 "2i + 1 in the low one.",
                 padded[1::2] << 4 | padded[0::2]),
                ("you padded at the front: the 0 code goes AFTER the last code, so the last byte holds the last "
                 "code in its high nibble.", front[0::2] << 4 | front[1::2]),
                ("the high nibble is lost: every byte holds only the second code of its pair. The first code must "
                 "move up by one nibble (4 bits); moved by 8 it falls off the byte.", padded[1::2]),
            ]
            hint = next((h for h, v in variants if torch.equal(got, v)), None) or _pack_property_hint(got, padded, label)
            assert_equal(got, want, what=what, hint=hint)
        back = call(unpack, want.clone(), codes.numel())
        what = f"unpack(pack({label}), n={codes.numel()})"
        if not isinstance(back, torch.Tensor) or back.dtype != torch.uint8:
            fail(f"{what} returned {getattr(back, 'dtype', type(back).__name__)}, expected a uint8 tensor.",
                 hint="return the codes as a uint8 tensor: integer operations on uint8 bytes keep that dtype.")
        if back.numel() != codes.numel():
            fail(f"{what} has {back.numel()} codes, expected {codes.numel()}.",
                 hint=f"an odd count was padded: unpack every byte ({2 * want.numel()} codes), then keep the first n "
                      f"codes (n={codes.numel()}).")
        if not torch.equal(back, codes):
            n, hi, lo = codes.numel(), want >> 4, want & 0x0F
            variants = [
                ("you put the low nibble first: the high nibble (upper 4 bits) of byte i is element 2i, the low one "
                 "element 2i + 1.", torch.stack([lo, hi], dim=1).reshape(-1)[:n]),
                ("the low nibble is not masked: element 2i + 1 is only the byte's lower 4 bits, and yours still "
                 "carries the upper 4.", torch.stack([hi, want], dim=1).reshape(-1)[:n]),
                ("the high nibble came out 16 times too large: you kept the upper 4 bits where they are; move them "
                 "down to the low end of the byte.", torch.stack([want & 0xF0, lo], dim=1).reshape(-1)[:n]),
                ("all the high nibbles come first, then all the low ones: the codes must alternate (high of byte 0, "
                 "low of byte 0, high of byte 1, …).", torch.cat([hi, lo])[:n]),
            ]
            hint = next((h for h, v in variants if torch.equal(back, v)), None) or _unpack_property_hint(back, codes, want,
                                                                                                  label)
            assert_equal(back, codes, what=what, hint=hint)
    passed("Exercise 12.1 · Two codes per byte")


def _first(mask: torch.Tensor) -> int:
    return int(torch.nonzero(mask.reshape(-1))[0])


def _pack_property_hint(got: torch.Tensor, padded: torch.Tensor, label: str) -> str:
    """Which half of the bytes is wrong, for a packing no listed mistake explains."""
    hi_ok, lo_ok = (got >> 4) == padded[0::2], (got & 0x0F) == padded[1::2]
    if bool(hi_ok[:-1].all() and lo_ok[:-1].all()) and padded.numel() > 2:
        return (f"on {label} only the last byte is wrong: the pad of an odd count is one 0 code after the last code, "
                f"so the last byte's low nibble must be 0 (yours is {int(got[-1]) & 0x0F}).")
    if bool(lo_ok.all()):
        k = _first(~hi_ok)
        return (f"on {label} the low nibbles are right but the high ones are not, first in byte {k}: the first code "
                "of each pair belongs in the upper 4 bits, i.e. worth 16 times its value.")
    if bool(hi_ok.all()):
        k = _first(~lo_ok)
        return (f"on {label} the high nibbles are right but the low ones are not, first in byte {k}: the second "
                "code of each pair fills the lower 4 bits, unchanged.")
    return ("byte i holds codes[2i] in its upper 4 bits and codes[2i + 1] in its lower 4 bits: compare your first "
            f"byte of {label}, in binary, with the first two codes.")


def _unpack_property_hint(back: torch.Tensor, codes: torch.Tensor, packed: torch.Tensor, label: str) -> str:
    """Which codes come out wrong, for an unpacking no listed mistake explains."""
    n = codes.numel()
    everything = torch.stack([packed >> 4, packed & 0x0F], dim=1).reshape(-1)
    if everything.numel() > n and torch.equal(back, everything[-n:]):
        return ("you kept the LAST n codes: the padding code of an odd count sits at the end, so keep the first n.")
    even_ok, odd_ok = back[0::2] == codes[0::2], back[1::2] == codes[1::2]
    if bool(even_ok.all()):
        k = 2 * _first(~odd_ok) + 1
        return (f"on {label} the codes 2i (high nibbles) are right, the codes 2i + 1 are not, first at index {k}: "
                "element 2i + 1 is the byte's lower 4 bits, and only those.")
    if bool(odd_ok.all()):
        k = 2 * _first(~even_ok)
        return (f"on {label} the codes 2i + 1 (low nibbles) are right, the codes 2i are not, first at index {k}: "
                "element 2i is the byte's upper 4 bits, moved down to a number from 0 to 15.")
    return ("the high nibble (upper 4 bits) of byte i is element 2i, the low one element 2i + 1, in that order: "
            f"compare your first two codes of {label} with the first byte in binary.")


# ---------------------------------------------------------------------------- 12.2
def _decoded(x: torch.Tensor, qmap: torch.Tensor, blocksize: int) -> torch.Tensor:
    """x quantized blockwise (absmax of |x| per block, nearest entry of qmap) and decoded."""
    codes, absmax = quantize_blocks(x.reshape(-1).float(), qmap, blocksize)
    return dequantize_blocks(codes, absmax, qmap, blocksize)


def _victims(m, v, m_map, v_map, blocksize) -> torch.Tensor:
    return (_decoded(v, v_map, blocksize) == 0) & (_decoded(m, m_map, blocksize) != 0)


def _zero_point_cases():
    """(label, m, v, m_map, v_map, blocksize): moments over three decades (some m too small for the 4-bit map),
    exact zeros, a short tail, an all-zero block, and the same moments with tiny second moments."""
    gen = torch.Generator().manual_seed(21)
    m_map, v_map = dynamic_map(True, 3, 4), dynamic_map(False, 3, 4)
    g = torch.randn(1000, generator=gen) * torch.logspace(-3, 0, 1000)[torch.randperm(1000, generator=gen)]
    m, v = 0.1 * g, 0.001 * g * g
    sparse_m = m.clone()
    sparse_m[::3] = 0.0  # entries that never saw a gradient: v = 0 there is harmless
    big = torch.rand(4096, generator=gen) ** 6  # many tiny values next to a few large ones
    dead = torch.cat([m[:128], torch.zeros(128), m[128:200]]), torch.cat([v[:128], torch.zeros(128), v[128:200]])
    return [("1,000 moments of gradients spread over three decades, blocks of 128", m, v, m_map, v_map, 128),
            ("the same with a third of m exactly 0", sparse_m, v, m_map, v_map, 128),
            ("4,096 skewed values, blocks of 256", big - 0.5, big * big, m_map, v_map, 256),
            ("a tail block of 40 values", m[:168], v[:168], m_map, v_map, 128),
            ("328 values whose second block is all 0", dead[0], dead[1], m_map, v_map, 128),
            ("the first case with v's absmax near 1e-6 (and m's near 1e-3)", 1e-2 * m, 1e-4 * v, m_map, v_map, 128),
            ("the first case with v's absmax near 1e-8 (and m's near 1e-4)", 1e-3 * m, 1e-6 * v, m_map, v_map, 128),
            ("the first case with v's absmax near 1e-10 and m's near 1e-5", 1e-4 * m, 1e-8 * v, m_map, v_map, 128)]


_SMALL = (5, 6, 7)  # the cases with tiny moments


def _decoded_keep_sign(x: torch.Tensor, qmap: torch.Tensor, blocksize: int) -> torch.Tensor:
    """:func:`_decoded` with lesson 07's keep-sign coding (a non-zero value is never coded 0)."""
    codes, absmax = quantize_blocks(x.reshape(-1).float(), qmap, blocksize, keep_sign=True)
    return dequantize_blocks(codes, absmax, qmap, blocksize)


def _decoded_floor(x: torch.Tensor, qmap: torch.Tensor, blocksize: int) -> torch.Tensor:
    """:func:`_decoded` with each value coded to the map entry at or below it (searchsorted), not the nearest."""
    n = x.numel()
    blocks = torch.nn.functional.pad(x.reshape(-1).float(), (0, -n % blocksize)).view(-1, blocksize)
    absmax = blocks.abs().amax(dim=1, keepdim=True)
    y = blocks / torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    codes = (torch.searchsorted(qmap, y.contiguous(), right=True) - 1).clamp(0, qmap.numel() - 1)
    return (qmap[codes] * absmax).reshape(-1)[:n]


def _victim_variants(m, v, m_map, v_map, bs):
    """(hint, mask) of the usual wrong answers, for one case."""
    n = v.numel()
    v_zero = _decoded(v, v_map, bs) == 0
    m_live = _decoded(m, m_map, bs) != 0
    kept = (_decoded_keep_sign(v, v_map, bs) == 0) & (_decoded_keep_sign(m, m_map, bs) != 0)
    absmax = torch.nn.functional.pad(v.abs(), (0, -n % bs)).view(-1, bs).amax(dim=1).repeat_interleave(bs)[:n]
    normalized = torch.where(absmax > 0, v / absmax, torch.zeros_like(v))
    smallest = v_map[v_map > 0].min()
    whole = v_map[nearest_code(v / v.abs().max(), v_map).long()] == 0
    whole_m_live = m_map[nearest_code(m / m.abs().max(), m_map).long()] != 0
    return [
        ("you tested the m you were given (m != 0), but the update uses the DECODED m: an m too small for its "
         "block is itself stored as 0, and then its update is 0, no victim. Quantize and decode m too.",
         v_zero & (m != 0)),
        ("every v scaled by the absmax of the whole tensor: each block has its own absmax, and v / absmax of ITS "
         "block is what the map codes.", whole & whole_m_live),
        ("every v scaled by the absmax of the whole tensor: each block has its own absmax, and v / absmax of ITS "
         "block is what the map codes.", whole & m_live),
        ("an entry whose decoded m is 0 is no victim: its update is 0 / eps = 0. Require the decoded m to be "
         "non-zero too.", v_zero),
        ("the m test is inverted: a victim has v decoded to 0 while its decoded m is NOT 0.", v_zero & ~m_live),
        ("your v counts as 0 only where v is exactly 0: you flagged v == 0 before quantizing, or you coded with "
         "keep_sign=True (lesson 07's rule, which never codes a non-zero value as 0 — the cure, not the problem). "
         "Here codes are the plain NEAREST entry (keep_sign=False), so a tiny non-zero v decodes to 0: quantize, "
         "decode, then test.", kept),
        ("you flagged v == 0 before quantizing: the victims are the entries whose QUANTIZED v decodes to 0 "
         "(non-zero v below half the smallest map entry times the block's absmax).", (v == 0) & m_live),
        ("you rounded down to the map entry below: codes are the NEAREST entry, so v / absmax decodes to 0 "
         "only below HALF the smallest positive entry.", (normalized < smallest) & m_live),
        ("you coded both moments to the map entry at or below each value (searchsorted alone): codes are the "
         "NEAREST entry, so v / absmax decodes to 0 only below HALF the smallest positive entry, and a negative m "
         "rounds toward the nearer entry, not always down.",
         (_decoded_floor(v, v_map, bs) == 0) & (_decoded_floor(m, m_map, bs) != 0)),
        ("you compared v itself with the map: the map holds v / absmax, so divide by the block's absmax first.",
         (v < smallest / 2) & m_live),
        ("you coded m with v's map (no negative entries): every negative m decodes to 0 there. m takes the signed "
         "map m_map, v the unsigned v_map.", v_zero & (_decoded(m, v_map, bs) != 0)),
        ("the two maps are swapped: m takes the signed map m_map, v the unsigned v_map with its 0.",
         (_decoded(v, m_map, bs) == 0) & (_decoded(m, v_map, bs) != 0)),
        ("you scaled each block by its largest VALUE, not its largest magnitude: where a block's biggest m is "
         "negative, that is the wrong absmax. Take the absmax of |x|.", v_zero & (_signed_absmax_decoded(m, m_map, bs) != 0)),
    ]


def _signed_absmax_decoded(x, qmap, bs):
    n = x.numel()
    blocks = torch.nn.functional.pad(x, (0, -n % bs)).view(-1, bs)
    top = blocks.amax(dim=1, keepdim=True)
    y = blocks / torch.where(top != 0, top, torch.ones_like(top))
    return (qmap[nearest_code(y.reshape(-1), qmap).long()].view_as(blocks) * top).reshape(-1)[:n]


def _victims_hint(zero_point_victims, failing: int) -> str:
    """The hint of the wrong answer that the learner's masks match on EVERY case (one case can be ambiguous:
    an empty mask fits several mistakes), else one from the property that failed."""
    cases = _zero_point_cases()
    try:
        masks = [zero_point_victims(m.clone(), v.clone(), a.clone(), b.clone(), bs).bool() for _, m, v, a, b, bs in cases]
    except Exception:  # noqa: BLE001 - the failing case already ran in the check
        masks = None
    wants = [_victims(*c[1:]) for c in cases]
    if masks is not None and all(isinstance(g, torch.Tensor) and g.shape == c[2].shape for g, c in zip(masks, cases)):
        per_case = [_victim_variants(*c[1:]) for c in cases]
        for k, (hint, _) in enumerate(per_case[0]):
            if all(torch.equal(g, variants[k][1]) for g, variants in zip(masks, per_case)):
                return hint
        if failing in _SMALL and all(torch.equal(masks[i], wants[i]) for i in range(len(cases)) if i not in _SMALL):
            return (f"right on the same moments at their usual size, wrong on \"{cases[failing][0]}\": your test depends "
                    "on the size of v or m, not only on x / absmax. A decoded v is a victim only if it is exactly 0, and "
                    "its decoded m must be exactly non-zero; an absolute tolerance (say 1e-8, the default atol of "
                    "isclose/allclose) or an added eps is as large as the whole moment here.")
        if all(not bool((w & ~g).any()) for g, w in zip(masks, wants)):
            return ("too many: an entry is a victim only if v's NEAREST map entry is 0 (v below half the map's "
                    "smallest positive entry times its block's absmax), not just small, and its decoded m is not 0.")
    return ("quantize both moments blockwise as lesson 06 does (each with its own map and absmax per block), decode "
            "them, and flag the entries where the decoded v is 0 while the decoded m is not.")


def check_zero_point_victims(zero_point_victims) -> None:
    """``zero_point_victims(m, v, m_map, v_map, blocksize) -> bool mask``: the entries whose decoded v is 0 while
    their decoded m is not (both quantized blockwise with nearest codes) — those whose next update is
    ``lr * m / eps``."""
    require_callable(zero_point_victims, "zero_point_victims")
    for index, (label, m, v, m_map, v_map, bs) in enumerate(_zero_point_cases()):
        want = _victims(m, v, m_map, v_map, bs)
        what = f"zero_point_victims({label})"
        try:
            got = call(zero_point_victims, m.clone(), v.clone(), m_map.clone(), v_map.clone(), bs)
        except AssertionError as exc:
            if v.numel() % bs and any(k in str(exc) for k in ("is invalid for input of size", "must match the size")):
                refail(exc, hint=f"{v.numel()} values are not a whole number of blocks of {bs}: the last block is "
                                    "short. Lesson 06's blocks pad the tail (and drop the padding afterwards).")
            raise
        if not isinstance(got, torch.Tensor):
            fail(f"{what} returned {type(got).__name__}, expected a bool tensor.",
                 hint="return a torch tensor of flags, one per entry of v.")
        if got.shape != want.shape:
            fail(f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}.",
                 hint=f"one flag per element of v: {v.numel()} of them, flat.")
        if got.dtype.is_floating_point and bool(torch.isnan(got).any()):
            fail(f"{what} has NaN entries.", hint="a block whose absmax is 0 decodes to 0: dividing by its absmax "
                                                 "gives 0 / 0. Treat that block on its own.")
        got = got.bool()
        if torch.equal(got, want):
            continue
        hint = _victims_hint(zero_point_victims, index)
        assert_equal(got, want, what=what, hint=hint)
    passed("Exercise 12.2 · The zero-point victims")


# ---------------------------------------------------------------------------- 12.3
def _rank1(x: torch.Tensor) -> torch.Tensor:
    a = x.abs()
    return torch.minimum(a.amax(dim=1, keepdim=True), a.amax(dim=0, keepdim=True))


def check_rank1_scale(rank1_scale) -> None:
    """``rank1_scale(x) -> tensor shaped like x``: min(max |x| of the row, max |x| of the column)."""
    require_callable(rank1_scale, "rank1_scale")
    gen = torch.Generator().manual_seed(31)
    spiky = torch.rand(64, 96, generator=gen) ** 4 * 1e-6
    spiky[5, :] *= 1e3  # one loud row
    spiky[:, 7] *= 1e3  # one loud column
    cases = [("a 4 x 5 matrix", torch.arange(20.0).view(4, 5) - 9.5),
             ("a 64 x 96 v with a loud row and a loud column", spiky),
             ("a random 33 x 17 matrix", torch.randn(33, 17, generator=gen)),
             ("one row", torch.randn(1, 9, generator=gen))]
    for label, x in cases:
        want = _rank1(x)
        what = f"rank1_scale({label})"
        try:
            got = call(rank1_scale, x.clone())
        except AssertionError as exc:
            if "must match the size of tensor" in str(exc):
                refail(exc, hint=f"the row maxima ({x.shape[0]} of them) and the column maxima ({x.shape[1]}) "
                                    "only broadcast to x's shape as a column (r, 1) and a row (1, c): your reductions "
                                    "lost the reduced dimension.")
            raise
        if isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got):
            fail(f"{what} returned two tensors (the row and the column maxima?), expected one shaped like x.",
                 hint="combine them into one scale per entry: for every (i, j), the smaller of row i's and column j's "
                      "maximum, shaped like x.")
        if not isinstance(got, torch.Tensor):
            fail(f"{what} returned {type(got).__name__}, expected a tensor shaped like x.",
                 hint="return one torch tensor with a scale per entry of x.")
        if got.shape != x.shape and x.shape[0] != x.shape[1] and got.shape == x.shape[::-1]:
            fail(f"{what} has shape {tuple(got.shape)}, expected {tuple(x.shape)}: your result is x's shape transposed.",
                 hint="you swapped the two reductions' axes: the maximum of each ROW reduces over the columns "
                      f"(dim=1) and must run down x as a ({x.shape[0]}, 1) column; the maximum of each COLUMN reduces "
                      f"over the rows (dim=0) and runs along a (1, {x.shape[1]}) row.")
        if got.shape != x.shape:
            hint = ("broadcast the row maxima (a column vector) against the column maxima (a row vector) to x's shape."
                    if got.numel() in (x.shape[0], x.shape[1], x.shape[0] + x.shape[1])
                    else f"one scale per element of x: {x.numel()} numbers shaped {tuple(x.shape)}")
            fail(f"{what} has shape {tuple(got.shape)}, expected {tuple(x.shape)}.", hint=hint)
        if torch.allclose(got.float(), want, rtol=1e-6, atol=0):
            continue
        a = x.abs()
        rows, cols = a.amax(dim=1, keepdim=True), a.amax(dim=0, keepdim=True)
        variants = [
            ("you took the LARGER of the two maxima, which lets the small entries of a quiet row vanish next to a loud "
             "column: take the smaller one.",
             torch.maximum(rows, cols)),
            ("the row maximum alone is one scale per row; rank-1 takes min(row max, column max).", rows.expand_as(x)),
            ("the column maximum alone is one scale per column; rank-1 takes min(row max, column max).",
             cols.expand_as(x)),
            ("your scales come out below some |x| on a matrix with negative entries: take maxima of |x| "
             "(magnitudes), not of x.",
             torch.minimum(x.amax(dim=1, keepdim=True), x.amax(dim=0, keepdim=True))),
            ("not the product of the maxima (that is a rank-1 approximation of x, not a scale): take their minimum.",
             rows * cols),
            ("you took the SMALLEST magnitude of the row and of the column: the scales are their LARGEST "
             "magnitudes, and then the smaller of those two.",
             torch.minimum(a.amin(dim=1, keepdim=True), a.amin(dim=0, keepdim=True))),
            ("one absmax for the whole matrix is plain absmax scaling: rank-1 takes each row's and each column's "
             "maximum, min(row max, column max) per entry.", a.max().expand_as(x)),
        ]
        hint = next((h for h, v in variants if torch.allclose(got.float(), v, rtol=1e-6, atol=0)), None) \
            or _rank1_property_hint(got.float(), x, want, label)
        assert_close(got.float(), want, rtol=1e-6, atol=0, what=what, hint=hint)
    passed("Exercise 12.3 · Rank-1 normalization")


def _rank1_property_hint(got: torch.Tensor, x: torch.Tensor, want: torch.Tensor, label: str) -> str:
    """Which property of a scale fails, for a scale no listed mistake explains."""
    a = x.abs()
    if torch.allclose(got, want * want, rtol=1e-5, atol=0):
        return f"on {label} your scales are the squares of the right ones: take magnitudes |x|, not x * x."
    below = got < a * (1 - 1e-6)
    if bool(below.any()):
        i, j = (int(t) for t in torch.nonzero(below)[0])
        return (f"on {label} your scale at ({i}, {j}) is {float(got[i, j]):.4g}, below |x[{i}, {j}]| = {float(a[i, j]):.4g}: "
                "a scale must bound every magnitude of its row and of its column, so it is built from their MAXIMA "
                "(not a mean, a rounded value or one row alone).")
    above = got > want * (1 + 1e-6)
    if bool(above.any()) and not bool((got < want * (1 - 1e-6)).any()):
        i, j = (int(t) for t in torch.nonzero(above)[0])
        return (f"on {label} your scale at ({i}, {j}) is {float(got[i, j]):.4g}, larger than both the maximum |x| of row "
                f"{i} and of column {j} allow ({float(want[i, j]):.4g}): maxima, not sums or norms, and the smaller one.")
    return (f"scale[i, j] = min(max_k |x[i, k]|, max_k |x[k, j]|): check one entry of {label} by hand.")


# ---------------------------------------------------------------------------- 12.4
def _bf16_neighbours(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 numbers just below and above |x| (toward zero and away), with x's sign."""
    bits = x.view(torch.int32)
    low = (bits & ~0xFFFF).view(torch.float32)
    high = ((bits & ~0xFFFF) + 0x10000).view(torch.float32)
    exact = (bits & 0xFFFF) == 0
    return low, torch.where(exact, low, high)


def check_stochastic_round(stochastic_round) -> None:
    """``stochastic_round(x, generator) -> bf16``: each element rounds to one of its two bf16 neighbours,
    up with probability proportional to the distance from the lower one, so the mean is x."""
    require_callable(stochastic_round, "stochastic_round")
    n = 100_000
    cases = [("1 + a quarter of a bf16 step (2^-9)", 1.0 + 2.0**-9, 0.25),
             ("1000.7", 1000.7, None), ("-3.14159", -3.14159, None), ("1e-20", 1e-20, None),
             ("0.1", 0.1, None), ("a (250, 400) matrix of 0.7", 0.7, None)]
    for label, value, p_up in cases:
        shape = (250, 400) if "matrix" in label else (n,)
        x = torch.full(shape, value, dtype=torch.float32)
        got = call(stochastic_round, x.clone(), torch.Generator().manual_seed(41))
        what = f"stochastic_round({n:,} copies of {label})"
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bfloat16:
            fail(f"{what} returned {getattr(got, 'dtype', type(got).__name__)}, expected a bf16 tensor.",
                 hint="return the rounded values as a torch.bfloat16 tensor: once the lower 16 bits are 0, the "
                      "conversion to bf16 is exact.")
        if got.shape != x.shape:
            fail(f"{what} has shape {tuple(got.shape)}, expected {tuple(x.shape)}.",
                 hint="one rounded value per element of x, in x's shape.")
        got = got.reshape(-1)
        x = x.reshape(-1)
        low, high = _bf16_neighbours(x[:1])
        values = set(got.float().unique().tolist())
        if not values <= {float(low), float(high)}:
            two_up = float(((x[:1].view(torch.int32) & ~0xFFFF) + 0x20000).view(torch.float32))
            if max(values, key=abs) == two_up and float(low) != float(high):
                hint = _two_steps_hint(stochastic_round, values, float(low), float(high))
            else:
                hint = ("every result must be one of the two bf16 numbers next to x (printed above); yours left that "
                        "pair, so your rounding changes more than the lower 16 bits.")
            fail(f"{what} gave {sorted(values)[:4]}, but x's bf16 neighbours are {float(low)!r} and {float(high)!r}.",
                 hint=hint)
        if len(values) == 1 and float(low) != float(high):
            direction = "up (away from 0)" if values == {float(high)} else "down (toward 0)"
            fail(f"{what}: every copy rounded {direction}; stochastic rounding goes both ways.",
                 hint=_one_way_hint(stochastic_round, values == {float(high)}, float(x[0])))
        frac = float((x[0].double() - low.double()) / (high.double() - low.double()))
        up = (got.float() == float(high)).double().mean().item()
        se = (frac * (1 - frac) / n) ** 0.5
        if abs(up - frac) > 5 * se + 1e-9:
            odds = [
                ("the odds are reversed: round UP with probability (x - low) / (high - low), the distance from "
                 "the lower neighbour.", 1 - frac),
                ("you round up half of the time whatever x is: the odds must be the fraction (x - low) / (high - low), "
                 "not a fixed 0.5.", 0.5),
                ("your random integers span 2**15, half the gap, so x rounds up only past the middle: the "
                 "randomness must cover one full bf16 step.", max(0.0, 2 * frac - 1)),
            ]
            hint = next((h for h, p in odds if abs(up - p) <= 5 * (p * (1 - p) / n) ** 0.5 + 1e-9),
                        "round up with probability (x - low) / (high - low): the mean of the results must be x.")
            if hint == odds[0][0] and _rounds_noise_to_nearest(stochastic_round):
                hint = ("you added up to one step of noise and then converted with .to(torch.bfloat16), which rounds to "
                        "NEAREST: x then rounds up whenever its fraction plus the noise passes one half, not with "
                        "probability equal to the fraction. After adding the noise, clear the low 16 bits (truncate).")
            fail(f"{what}: {100 * up:.2f} % of the copies rounded up, expected {100 * frac:.2f} % "
                 f"(± {500 * se:.2f} %).", hint=hint)
        if p_up is not None:
            assert abs(frac - p_up) < 1e-9  # the case is what its label says
    exact = torch.tensor([1.0, -2.5, 0.0, 2.0**127, 2.0**-120], dtype=torch.float32)
    got = call(stochastic_round, exact.clone(), torch.Generator().manual_seed(42))
    if not torch.equal(got.float(), exact.bfloat16().float()):
        fail(f"stochastic_round({exact.tolist()}) gave {got.float().tolist()}: numbers that bf16 holds exactly must "
             "not move.", hint="a number whose low 16 bits are 0 has only itself as neighbour: it must stay.")
    # an exact number moves only if the noise can reach 2**16: one draw in 65,537 for an inclusive bound, so
    # 2**20 copies see it about 16 times (and miss it with probability e^-16)
    many = exact[[0, 1, 4]].repeat(2**20 // 3 + 1)[: 2**20]
    got = call(stochastic_round, many.clone(), torch.Generator().manual_seed(44))
    moved = int((got.float() != many).sum()) if isinstance(got, torch.Tensor) and got.shape == many.shape else -1
    if moved:
        fail(f"stochastic_round of {many.numel():,} numbers that bf16 holds exactly moved {moved} of them "
             "(one step up or down).",
             hint="your random numbers reach a full bf16 step (2**16 itself: an inclusive upper bound, or a range "
                  "that starts at 1), so an exact number sometimes moves: the noise must take the 2**16 values "
                  "0 … 2**16 - 1, and 0 must be possible.")
    again = call(stochastic_round, torch.full((1000,), 1.3), torch.Generator().manual_seed(7))
    twice = call(stochastic_round, torch.full((1000,), 1.3), torch.Generator().manual_seed(7))
    if not torch.equal(again, twice):
        fail("two calls with generators seeded alike gave different results.",
             hint="draw every random number from the generator you are given, not from torch's global one.")
    passed("Exercise 12.4 · Stochastic rounding to bf16")


def _one_way_hint(stochastic_round, went_up: bool, x: float | None = None) -> str:
    """Every copy went the same way: name the deterministic rounding the learner wrote, from one more input
    (x three quarters of a step above a bf16 number: nearest rounds it up, truncation down); for a negative x,
    first whether its positive mirror rounds right (then only the sign is handled wrongly)."""
    generic = ("round up with probability (x - low) / (high - low), with a fresh random number per element "
               "drawn from the generator you are given.")
    if _one_draw_per_call(stochastic_round):
        return ("within one call every element rounds the same way, but calls with other seeds go the other way: "
                "you drew ONE random number for the whole tensor. Every element needs its own draw (a tensor of "
                "random numbers shaped like x).")
    if x is not None and x < 0 and _mirror_rounds_right(stochastic_round, -x):
        return (f"for {-x:.6g} your rounding goes both ways with the right odds, for {x:.6g} only one way: a negative x "
                "is mishandled. Its lower neighbour (toward zero) and x differ by a NEGATIVE amount, as do its two "
                "neighbours: a distance taken as positive (abs) on one side only makes the odds 0 or 1. Work with "
                "magnitudes throughout, or on the bit pattern, which is the same for either sign.")
    low_half = _probe(stochastic_round, 1.0 + 2.0**-10, 46, n=20000)  # an eighth of a step above 1
    if low_half is not None and abs(float((low_half > 1.0).double().mean()) - 0.125) < 0.03:
        return ("right where x sits in the lower half of its bf16 gap, one way only elsewhere: your 'lower neighbour' "
                "is x rounded to NEAREST (x.to(torch.bfloat16)), which in the upper half of the gap is the bf16 number "
                "ABOVE x (and for a negative x, mind which way 'above' is). The lower neighbour, toward zero, is x with "
                "its low 16 bits cleared.")
    if went_up:
        return ("you always round away from zero (the upper neighbour): stochastic rounding goes up only with "
                "probability (x - low) / (high - low).")
    probe = torch.full((1000,), 1.0 + 3 * 2.0**-9)
    try:
        got = stochastic_round(probe.clone(), torch.Generator().manual_seed(43))
        rounded = set(got.float().unique().tolist())
    except Exception:  # noqa: BLE001 - the probe is only for the hint
        return generic
    if rounded == {float(probe[0].bfloat16())} and float(probe[0].bfloat16()) > 1.0:
        return ("that is round-to-nearest (a plain conversion to bf16): deterministic, it loses every update below "
                "half a step. Round up at random, with probability (x - low) / (high - low).")
    high = float(probe[0].bfloat16())
    if rounded == {1.0, high} and abs(float((got.float() == high).double().mean()) - 0.5) < 0.08:
        return ("your random integers span 2**15, half the gap, so x rounds up only when it is past the middle: "
                "the randomness must cover one full bf16 step.")
    if rounded == {1.0}:
        return ("you truncate (clear the low 16 bits): always toward zero. Round up at random, with probability "
                "(x - low) / (high - low).")
    return generic


def _mirror_rounds_right(stochastic_round, value: float, n: int = 20000) -> bool:
    """Whether ``n`` copies of the positive ``value`` go to its two bf16 neighbours with the right odds."""
    got = _probe(stochastic_round, value, 48, n=n)
    if got is None:
        return False
    bits = torch.tensor([value], dtype=torch.float32).view(torch.int32) & ~0xFFFF
    low, high = float(bits.view(torch.float32)), float((bits + 0x10000).view(torch.float32))
    if low == high or not set(got.unique().tolist()) <= {low, high}:
        return False
    frac = (value - low) / (high - low)
    return abs(float((got == high).double().mean()) - frac) <= 5 * (frac * (1 - frac) / n) ** 0.5 + 1e-9


def _probe(stochastic_round, value: float, seed: int, n: int = 4000) -> torch.Tensor | None:
    """The learner's rounding of ``n`` copies of ``value`` as floats (None if it raises or returns no tensor)."""
    try:
        got = stochastic_round(torch.full((n,), value), torch.Generator().manual_seed(seed))
    except Exception:  # noqa: BLE001 - the probe is only for the hint
        return None
    return got.float().reshape(-1) if isinstance(got, torch.Tensor) and got.numel() == n else None


def _one_draw_per_call(stochastic_round) -> bool:
    """Whether every call rounds all its elements alike while calls with other seeds differ (one shared draw)."""
    value = 1.0 + 2.0**-8  # half a bf16 step (2**-7 at 1) above 1: both ways equally likely
    outcomes = set()
    for seed in range(12):
        got = _probe(stochastic_round, value, seed)
        if got is None:
            return False
        values = set(got.unique().tolist())
        if len(values) != 1:
            return False
        outcomes |= values
    return len(outcomes) == 2


def _rounds_noise_to_nearest(stochastic_round) -> bool:
    """Whether the learner's up-rate at a fraction of 1/8 is that of one step of noise rounded to nearest (5/8),
    not of reversed odds (7/8)."""
    got = _probe(stochastic_round, 1.0 + 2.0**-10, 45, n=20000)  # an eighth of a bf16 step above 1
    if got is None:
        return False
    up = float((got > 1.0).double().mean())
    return abs(up - 0.625) < 0.05



def _two_steps_hint(stochastic_round, values: set, low: float, high: float) -> str:
    """Some copies moved two bf16 steps: a step of the wrong size (x's upper neighbour never reached), noise over more
    than a step (copies also stay at the lower neighbour), one step of noise then a round-to-nearest conversion, or a
    'lower neighbour' taken by rounding to nearest."""
    if low in values and high not in values:
        return (f"you rounded to {low!r} or {max(values, key=abs)!r}, but x's upper bf16 neighbour is {high!r}: your "
                "step is not one bf16 step. The gap between bf16 numbers is 2**(e - 7) for |x| in [2**e, 2**(e + 1)), "
                "not |x| * 2**-7; or take the upper neighbour as the lower one's int32 bits plus 2**16.")
    if low in values:
        return ("your random integers span more than 2**16 (one bf16 step), so some copies jump two steps: the "
                "randomness must cover exactly one step of the lower 16 bits.")
    if _rounds_noise_to_nearest(stochastic_round):
        return ("you added up to one step of noise and then converted with .to(torch.bfloat16), which rounds to "
                "NEAREST, so x + noise can land two steps up: after adding the noise, clear the low 16 bits (truncate).")
    return ("your 'lower neighbour' is above x here: x.to(torch.bfloat16) rounds to NEAREST, which can be the bf16 "
            "number ABOVE x, and one step more is then two steps up. The lower neighbour is x with its low 16 bits "
            "cleared (toward zero).")
