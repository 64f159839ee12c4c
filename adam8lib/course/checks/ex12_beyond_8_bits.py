"""Checks for workbook 12 · beyond 8 bits: packing 4-bit codes, the zero-point problem, rank-1
normalization, stochastic rounding to bf16."""

from __future__ import annotations

import torch

from ...formats import pack_nibbles, unpack_nibbles
from ...quant import dynamic_map, nearest_code, num_blocks
from ._common import assert_close, assert_equal, call, fail, passed, require_callable

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
        got = call(pack, codes.clone())
        what = f"pack({label})"
        if not isinstance(got, torch.Tensor):
            fail(f"{what} returned {type(got).__name__}, expected a uint8 tensor.", hint="return a torch.Tensor of bytes")
        if got.dtype != torch.uint8:
            fail(f"{what} has dtype {got.dtype}, expected torch.uint8.",
                 hint="a byte holds two codes: keep the result uint8 (shift and OR uint8 tensors).")
        if got.numel() != want.numel():
            hint = ("an odd number of codes still needs its last byte: pad with one 0 code "
                    "(ceil(n / 2) bytes)." if codes.numel() % 2 else "n codes fit in n / 2 bytes: two per byte.")
            fail(f"{what} has {got.numel()} bytes, expected {want.numel()}.", hint=hint)
        if not torch.equal(got, want):
            swapped = (codes[1::2] << 4 | codes[0::2]) if codes.numel() % 2 == 0 else None
            hint = ("the nibbles are swapped: element 2i goes in the HIGH nibble (codes[2i] << 4 | codes[2i+1])."
                    if swapped is not None and torch.equal(got, swapped) else
                    "byte i = codes[2i] << 4 | codes[2i + 1] (a 4-bit shift, then OR).")
            assert_equal(got, want, what=what, hint=hint)
        back = call(unpack, want.clone(), codes.numel())
        what = f"unpack(pack({label}), n={codes.numel()})"
        if not isinstance(back, torch.Tensor) or back.dtype != torch.uint8:
            fail(f"{what} returned {getattr(back, 'dtype', type(back).__name__)}, expected a uint8 tensor.",
                 hint="return the codes as uint8 (>> 4 and & 0x0F keep the dtype).")
        if back.numel() != codes.numel():
            fail(f"{what} has {back.numel()} codes, expected {codes.numel()}.",
                 hint="an odd count was padded: unpack every byte, then keep the first n codes.")
        if not torch.equal(back, codes):
            assert_equal(back, codes, what=what,
                         hint="the high nibble (byte >> 4) is element 2i, the low one (byte & 0x0F) element 2i + 1; "
                              "interleave them in that order.")
    passed("Exercise 12.1 · Two codes per byte")


# ---------------------------------------------------------------------------- 12.2
def _victims(m: torch.Tensor, v: torch.Tensor, qmap: torch.Tensor, blocksize: int) -> torch.Tensor:
    n = v.numel()
    pad = num_blocks(n, blocksize) * blocksize - n
    blocks = torch.nn.functional.pad(v, (0, pad)).view(-1, blocksize)
    absmax = blocks.amax(dim=1)
    scale = absmax.repeat_interleave(blocksize)[:n]
    normalized = torch.where(scale > 0, v / scale, torch.zeros_like(v))
    v_hat = qmap[nearest_code(normalized, qmap).long()] * scale
    return (v_hat == 0) & (m != 0)


def _zero_point_cases():
    gen = torch.Generator().manual_seed(21)
    qmap = dynamic_map(False, 3, 4)
    g = torch.randn(1000, generator=gen) * torch.logspace(-3, 0, 1000)[torch.randperm(1000, generator=gen)]
    m, v = 0.1 * g, 0.001 * g * g
    sparse_m = m.clone()
    sparse_m[::3] = 0.0  # entries that never saw a gradient: v = 0 there is harmless
    big = torch.rand(4096, generator=gen) ** 6  # many tiny values next to a few large ones
    return [("1,000 moments of gradients spread over three decades, blocks of 128", m, v, qmap, 128),
            ("the same with a third of m exactly 0", sparse_m, v, qmap, 128),
            ("4,096 skewed values, blocks of 256", big - 0.5, big * big, qmap, 256),
            ("a tail block of 40 values", m[:168], v[:168], qmap, 128)]


def check_zero_point_victims(zero_point_victims) -> None:
    """``zero_point_victims(m, v, qmap, blocksize) -> bool mask``: v codes to 0 (nearest code, blockwise)
    while m is not 0 — the entries whose next update would be ``lr * m / eps``."""
    require_callable(zero_point_victims, "zero_point_victims")
    for label, m, v, qmap, bs in _zero_point_cases():
        want = _victims(m, v, qmap, bs)
        got = call(zero_point_victims, m.clone(), v.clone(), qmap.clone(), bs)
        what = f"zero_point_victims({label})"
        if not isinstance(got, torch.Tensor):
            fail(f"{what} returned {type(got).__name__}, expected a bool tensor.", hint="return a mask shaped like v")
        if got.shape != want.shape:
            fail(f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}.", hint="one flag per element of v")
        got = got.bool()
        if torch.equal(got, want):
            continue
        scale_all = v.abs().max()
        whole = qmap[nearest_code(v / scale_all, qmap).long()] == 0
        if torch.equal(got, whole & (m != 0)):
            hint = "scale v by the absmax of ITS block (blocks of `blocksize`), not of the whole tensor."
        elif torch.equal(got, _victims(torch.ones_like(m), v, qmap, bs)):
            hint = "an entry whose m is 0 is no victim: its update is 0 / eps = 0. Require m != 0 too."
        elif bool((got & ~want).any()) and not bool((want & ~got).any()):
            hint = ("too many: an entry is a victim only if v's NEAREST map entry is 0 (v below half the map's "
                    "smallest positive entry times absmax), not just small.")
        else:
            hint = ("quantize v blockwise (absmax per block, nearest map entry to v / absmax), decode, and flag the "
                    "entries where that is 0 while m is not.")
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
        got = call(rank1_scale, x.clone())
        what = f"rank1_scale({label})"
        if not isinstance(got, torch.Tensor):
            fail(f"{what} returned {type(got).__name__}, expected a tensor shaped like x.", hint="return a tensor")
        if got.shape != x.shape:
            hint = ("broadcast the row maxima (a column vector) against the column maxima (a row vector) to x's shape."
                    if got.numel() in (x.shape[0], x.shape[1], x.shape[0] + x.shape[1]) else "one scale per element")
            fail(f"{what} has shape {tuple(got.shape)}, expected {tuple(x.shape)}.", hint=hint)
        if torch.allclose(got.float(), want, rtol=1e-6, atol=0):
            continue
        a = x.abs()
        rows, cols = a.amax(dim=1, keepdim=True), a.amax(dim=0, keepdim=True)
        variants = [
            ("the LARGER of the two maxima lets tiny entries vanish: take the smaller one (torch.minimum).",
             torch.maximum(rows, cols)),
            ("the row maximum alone is one scale per row; rank-1 takes min(row max, column max).", rows.expand_as(x)),
            ("the column maximum alone is one scale per column; rank-1 takes min(row max, column max).",
             cols.expand_as(x)),
            ("take maxima of |x| (magnitudes), not of x.",
             torch.minimum(x.amax(dim=1, keepdim=True), x.amax(dim=0, keepdim=True))),
            ("not the product of the maxima (that is a rank-1 approximation of x, not a scale): take their minimum.",
             rows * cols),
        ]
        hint = next((h for h, v in variants if torch.allclose(got.float(), v, rtol=1e-6, atol=0)),
                    "scale[i, j] = min(max_k |x[i, k]|, max_k |x[k, j]|).")
        assert_close(got.float(), want, rtol=1e-6, atol=0, what=what, hint=hint)
    passed("Exercise 12.3 · Rank-1 normalization")


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
             ("0.1", 0.1, None)]
    for label, value, p_up in cases:
        x = torch.full((n,), value, dtype=torch.float32)
        got = call(stochastic_round, x.clone(), torch.Generator().manual_seed(41))
        what = f"stochastic_round({n:,} copies of {label})"
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bfloat16:
            fail(f"{what} returned {getattr(got, 'dtype', type(got).__name__)}, expected a bf16 tensor.",
                 hint="return the rounded values as torch.bfloat16 (exact when the low 16 bits are 0).")
        if got.shape != x.shape:
            fail(f"{what} has shape {tuple(got.shape)}, expected {tuple(x.shape)}.", hint="one result per element")
        low, high = _bf16_neighbours(x[:1])
        values = set(got.float().unique().tolist())
        if not values <= {float(low), float(high)}:
            fail(f"{what} gave {sorted(values)[:4]}, but x's bf16 neighbours are {float(low)!r} and {float(high)!r}.",
                 hint="round to one of the two bf16 numbers next to x: add random low bits and cut them, "
                      "or pick up/down with a random draw.")
        if len(values) == 1 and float(low) != float(high):
            direction = "up (away from 0)" if values == {float(high)} else "down (toward 0)"
            fail(f"{what}: every copy rounded {direction}; stochastic rounding goes both ways.",
                 hint="round up with probability (x - low) / (high - low), with a fresh random number per element "
                      "(torch.rand / torch.randint with the generator you are given).")
        frac = float((x[0].double() - low.double()) / (high.double() - low.double()))
        up = (got.float() == float(high)).double().mean().item()
        se = (frac * (1 - frac) / n) ** 0.5
        if abs(up - frac) > 5 * se + 1e-9:
            hint = ("the odds are reversed: round UP with probability (x - low) / (high - low), the distance from "
                    "the lower neighbour." if abs(up - (1 - frac)) <= 5 * se + 1e-9 else
                    "round up with probability (x - low) / (high - low): the mean of the results must be x.")
            fail(f"{what}: {100 * up:.2f} % of the copies rounded up, expected {100 * frac:.2f} % "
                 f"(± {500 * se:.2f} %).", hint=hint)
        if p_up is not None:
            assert abs(frac - p_up) < 1e-9  # the case is what its label says
    exact = torch.tensor([1.0, -2.5, 0.0, 2.0**127, 2.0**-120], dtype=torch.float32)
    got = call(stochastic_round, exact.clone(), torch.Generator().manual_seed(42))
    if not torch.equal(got.float(), exact.bfloat16().float()):
        fail(f"stochastic_round({exact.tolist()}) gave {got.float().tolist()}: numbers that bf16 holds exactly must "
             "not move.", hint="a number whose low 16 bits are 0 has only itself as neighbour: it must stay.")
    again = call(stochastic_round, torch.full((1000,), 1.3), torch.Generator().manual_seed(7))
    twice = call(stochastic_round, torch.full((1000,), 1.3), torch.Generator().manual_seed(7))
    if not torch.equal(again, twice):
        fail("two calls with generators seeded alike gave different results.",
             hint="draw every random number from the generator you are given (generator=generator), not the global one.")
    passed("Exercise 12.4 · Stochastic rounding to bf16")
