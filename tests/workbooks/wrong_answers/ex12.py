"""Workbook 12 · beyond 8 bits: what learners plausibly write instead of the solution."""

from __future__ import annotations

import torch

from adam8lib.course import checks
from adam8lib.quant import nearest_code
from tests.workbooks.wrong_answers import Right, Wrong


# ---------------------------------------------------------------------------------- 12.1
def _pad(codes):
    return torch.cat([codes, codes.new_zeros(codes.numel() % 2)])


def pack(codes):  # a correct pack, to check an unpack with
    c = _pad(codes)
    return c[0::2] << 4 | c[1::2]


def unpack(packed, n):  # a correct unpack, to check a pack with
    return torch.stack([packed >> 4, packed & 0x0F], dim=1).reshape(-1)[:n]


def pack_low_first(codes):
    c = _pad(codes)
    return c[1::2] << 4 | c[0::2]


def pack_unpadded_view(codes):
    pairs = codes.view(-1, 2)
    return pairs[:, 0] << 4 | pairs[:, 1]


def pack_odd_code_dropped(codes):
    n = codes.numel() // 2 * 2
    return codes[0:n:2] << 4 | codes[1:n:2]


def pack_padded_in_front(codes):
    if codes.numel() % 2:
        codes = torch.cat([codes.new_zeros(1), codes])
    return codes[0::2] << 4 | codes[1::2]


def pack_shift_by_8(codes):  # "a byte has 8 bits"
    c = _pad(codes)
    return c[0::2] << 8 | c[1::2]


def pack_in_int64(codes):
    c = _pad(codes).long()
    return c[0::2] * 16 + c[1::2]


def pack_no_pairs(codes):  # each code in its own byte, shifted
    return codes << 4


def unpack_low_first(packed, n):
    return torch.stack([packed & 0x0F, packed >> 4], dim=1).reshape(-1)[:n]


def unpack_unmasked(packed, n):
    return torch.stack([packed >> 4, packed], dim=1).reshape(-1)[:n]


def unpack_high_unshifted(packed, n):
    return torch.stack([packed & 0xF0, packed & 0x0F], dim=1).reshape(-1)[:n]


def unpack_concatenated(packed, n):
    return torch.cat([packed >> 4, packed & 0x0F])[:n]


def unpack_not_trimmed(packed, n):
    return torch.stack([packed >> 4, packed & 0x0F], dim=1).reshape(-1)


def pack_arithmetic(codes):
    if len(codes) % 2 == 1:
        codes = torch.nn.functional.pad(codes, (0, 1))
    return (codes[::2] * 16 + codes[1::2]).to(torch.uint8)


def unpack_with_divmod(packed, n):
    out = torch.empty(2 * packed.numel(), dtype=torch.uint8)
    out[0::2] = torch.div(packed, 16, rounding_mode="floor")
    out[1::2] = packed % 16
    return out[:n]


# ---------------------------------------------------------------------------------- 12.2
def make_victims(*, scale="block", test="nearest", m_rule="decoded", m_map_used="m"):
    def zero_point_victims(m, v, m_map, v_map, blocksize):
        def scales(x):
            n = x.numel()
            if scale == "block":
                absmax = torch.nn.functional.pad(x.abs(), (0, -n % blocksize)).view(-1, blocksize).amax(1)
                return absmax.repeat_interleave(blocksize)[:n]
            if scale == "whole":
                return x.abs().max().expand(n)
            return x.abs().view(-1, blocksize).amax(1).repeat_interleave(blocksize)  # "unpadded": no tail padding

        def decoded(x, qmap):
            s = scales(x)
            y = torch.where(s > 0, x / s, torch.zeros_like(x))
            return qmap[nearest_code(y, qmap).long()] * s, y

        v_hat, y = decoded(v, v_map)
        smallest = v_map[v_map > 0].min()
        if test == "nearest":
            zero = v_hat == 0
        elif test == "floor":  # the entry at or below y
            zero = y < smallest
        elif test == "raw-v":  # v itself against the map, no absmax
            zero = v < smallest / 2
        elif test == "before-quantizing":
            zero = v == 0
        elif test == "isclose":  # isclose's default atol=1e-8: the size of a whole tiny v
            zero = torch.isclose(v_hat, torch.zeros_like(v_hat))
        elif test == "eps":  # "zero" as below Adam's eps
            zero = v_hat < 1e-8
        if m_rule == "ignored":
            return zero
        if m_rule == "raw":
            return zero & (m != 0)
        m_hat = decoded(m, m_map if m_map_used == "m" else v_map)[0]
        if m_rule == "inverted":
            return zero & (m_hat == 0)
        return zero & (m_hat != 0)

    return zero_point_victims


def victims_in_a_loop(m, v, m_map, v_map, blocksize):
    def decoded(block, qmap):
        absmax = block.abs().max()
        if absmax == 0:
            return torch.zeros_like(block)
        idx = (block / absmax).unsqueeze(1).sub(qmap).abs().argmin(dim=1)
        return qmap[idx] * absmax

    out = torch.zeros_like(v, dtype=torch.bool)
    for start in range(0, v.numel(), blocksize):
        part = slice(start, start + blocksize)
        out[part] = (decoded(v[part], v_map) == 0) & (decoded(m[part], m_map) != 0)
    return out


def victims_by_codes(m, v, m_map, v_map, blocksize):
    def codes(x, qmap):
        n = x.numel()
        blocks = torch.cat([x, x.new_zeros(-n % blocksize)]).reshape(-1, blocksize)
        absmax = blocks.abs().amax(dim=1, keepdim=True)
        return nearest_code(blocks / torch.where(absmax > 0, absmax, torch.ones_like(absmax)), qmap).reshape(-1)[:n]

    v_zero, m_zero = int(torch.nonzero(v_map == 0)[0]), int(torch.nonzero(m_map == 0)[0])
    # a block of zeros codes to the zero entry too, so comparing codes needs no special case
    return (codes(v, v_map) == v_zero) & (codes(m, m_map) != m_zero)


def victims_with_library_calls(m, v, m_map, v_map, blocksize):
    from adam8lib.quant import dequantize_blocks, quantize_blocks

    v_hat = dequantize_blocks(*quantize_blocks(v, v_map, blocksize), v_map, blocksize)
    m_hat = dequantize_blocks(*quantize_blocks(m, m_map, blocksize), m_map, blocksize)
    return (v_hat == 0) & (m_hat != 0)


# ---------------------------------------------------------------------------------- 12.3
def rank1_max_of_maxima(x):
    a = x.abs()
    return torch.maximum(a.amax(dim=1, keepdim=True), a.amax(dim=0, keepdim=True))


def rank1_rows_only(x):
    return x.abs().amax(dim=1, keepdim=True).expand_as(x)


def rank1_no_abs(x):
    return torch.minimum(x.amax(dim=1, keepdim=True), x.amax(dim=0, keepdim=True))


def rank1_product(x):
    a = x.abs()
    return a.amax(dim=1, keepdim=True) * a.amax(dim=0, keepdim=True)


def rank1_no_keepdim(x):
    a = x.abs()
    return torch.minimum(a.amax(dim=1), a.amax(dim=0))


def rank1_returns_both(x):
    a = x.abs()
    return a.amax(dim=1, keepdim=True), a.amax(dim=0, keepdim=True)


def rank1_amin(x):
    a = x.abs()
    return torch.minimum(a.amin(dim=1, keepdim=True), a.amin(dim=0, keepdim=True))


def rank1_global_absmax(x):
    return x.abs().max().expand_as(x)


def rank1_with_loops(x):
    rows = [max(abs(float(v)) for v in row) for row in x]
    cols = [max(abs(float(v)) for v in col) for col in x.T]
    return torch.tensor([[min(r, c) for c in cols] for r in rows], dtype=x.dtype)


def rank1_by_clamp(x):
    a = x.abs()
    return a.max(dim=0).values.unsqueeze(0).clamp(max=a.max(dim=1).values.unsqueeze(1))


# ---------------------------------------------------------------------------------- 12.4
def make_round(*, rule="noise", span=1 << 16, global_rng=False, dtype=torch.bfloat16):
    def stochastic_round(x, generator):
        g = None if global_rng else generator
        bits = x.contiguous().view(torch.int32)
        if rule == "nearest":
            return x.to(torch.bfloat16)
        if rule == "truncate":
            return (bits & ~0xFFFF).view(torch.float32).to(dtype)
        if rule == "always-up":
            up = torch.where((bits & 0xFFFF) != 0, (bits & ~0xFFFF) + 0x10000, bits)
            return up.view(torch.float32).to(dtype)
        if rule in ("half", "reversed"):
            frac = (bits & 0xFFFF).double() / 65536
            r = torch.rand(x.shape, dtype=torch.float64, generator=g)
            up = (r < 0.5) if rule == "half" else (r < 1 - frac)
            up &= (bits & 0xFFFF) != 0
            return torch.where(up, (bits & ~0xFFFF) + 0x10000, bits & ~0xFFFF).view(torch.float32).to(dtype)
        noise = torch.randint(0, span, x.shape, generator=g, dtype=torch.int32)
        return ((bits + noise) & ~0xFFFF).view(torch.float32).to(dtype)

    return stochastic_round


def round_noise_inclusive(x, generator):
    """randint's high bound taken as inclusive: the noise can be 2**16, so an exact number may move up."""
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, (1 << 16) + 1, x.shape, generator=generator, dtype=torch.int32)
    return ((bits + noise) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def round_noise_flat(x, generator):
    """noise drawn as a flat vector of x.numel() and added to the flat bits: the result comes back flat."""
    bits = x.contiguous().view(-1).view(torch.int32)
    noise = torch.randint(0, 1 << 16, (x.numel(),), generator=generator, dtype=torch.int32)
    return ((bits + noise) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def round_by_comparing_rand(x, generator):
    bits = x.view(torch.int32)
    low = (bits & -65536).view(torch.float32)
    high = ((bits & -65536) + 65536).view(torch.float32)
    p = (bits & 0xFFFF).float() / 65536
    return torch.where(torch.rand(x.shape, generator=generator) < p, high, low).bfloat16()


C = checks
P, U = checks.check_pack_nibbles, "12.1"
def round_gap_taken_positive(x, generator):
    """Right for a positive x; for a negative one the gap is taken as positive (abs) on one side only, so the odds
    of going away from zero are never above 0 (a cold learner's mistake)."""
    bits = x.float().contiguous().view(torch.int32) & -65536
    low = bits.view(torch.float32)
    high = (bits + 65536).view(torch.float32)
    frac = (x.float() - low) / (high - low).abs()
    up = torch.rand(x.shape, generator=generator) < frac
    return torch.where(up, high, low).to(torch.bfloat16)


WRONG = [
    # 12.1 · two codes per byte (pack checked with a right unpack, unpack with a right pack)
    Wrong(U, P, pack_low_first, "nibble order swapped: low first", "the nibbles are swapped", True, (unpack,)),
    Wrong(U, P, pack_unpadded_view, "odd count not padded: view(-1, 2) fails",
          "an odd number of codes cannot be paired as it is", True, (unpack,)),
    Wrong(U, P, pack_odd_code_dropped, "odd count: the last code dropped",
          "an odd number of codes still needs its last byte", True, (unpack,)),
    Wrong(U, P, pack_padded_in_front, "the pad code put in front", "you padded at the front", True, (unpack,)),
    Wrong(U, P, pack_shift_by_8, "shift by 8 bits", "the high nibble is lost", True, (unpack,)),
    Wrong(U, P, pack_in_int64, "packed in int64, not cast back", "expected torch.uint8", True, (unpack,)),
    Wrong(U, P, pack_no_pairs, "one code per byte", "n codes fit in n / 2 bytes", False, (unpack,)),
    Wrong(U, P, pack, "unpack: low nibble first", "you put the low nibble first", True, (unpack_low_first,)),
    Wrong(U, P, pack, "unpack: low nibble not masked to 4 bits", "the low nibble is not masked", True,
          (unpack_unmasked,)),
    Wrong(U, P, pack, "unpack: high nibble masked, not shifted", "the high nibble came out 16 times too large", True,
          (unpack_high_unshifted,)),
    Wrong(U, P, pack, "unpack: highs then lows, not interleaved", "all the high nibbles come first", True,
          (unpack_concatenated,)),
    Wrong(U, P, pack, "unpack: padding not trimmed", "keep the first n codes", True, (unpack_not_trimmed,)),
    # 12.2 · zero-point victims
    Wrong("12.2", C.check_zero_point_victims, make_victims(scale="whole"), "one absmax for the whole tensor",
          "absmax of ITS block", True),
    Wrong("12.2", C.check_zero_point_victims, make_victims(scale="unpadded"), "view(-1, blocksize) on a short tail",
          "the last block is short", True),
    Wrong("12.2", C.check_zero_point_victims, make_victims(m_rule="ignored"), "m forgotten",
          "Require the decoded m to be non-zero too", True),
    Wrong("12.2", C.check_zero_point_victims, make_victims(m_rule="raw"), "the given m tested, not the decoded m",
          "the update uses the DECODED m", True),
    Wrong("12.2", C.check_zero_point_victims, make_victims(m_rule="inverted"), "decoded m == 0 instead of != 0",
          "the m test is inverted", True),
    Wrong("12.2", C.check_zero_point_victims, make_victims(m_map_used="v"), "m coded with v's map",
          "you coded m with v's map", True),
    Wrong("12.2", C.check_zero_point_victims, make_victims(test="floor"), "rounded down, not to the nearest entry",
          "you rounded down to the map entry below", True),
    Wrong("12.2", C.check_zero_point_victims, make_victims(test="raw-v"), "v compared with the map unscaled",
          "you compared v itself with the map", True),
    Wrong("12.2", C.check_zero_point_victims, make_victims(test="before-quantizing"), "v == 0 before quantizing",
          "you flagged v == 0 before quantizing", True),
    Wrong("12.2", C.check_zero_point_victims, make_victims(test="isclose"), "isclose(v_hat, 0): atol 1e-8",
          "your test depends on the size of v", True),
    Wrong("12.2", C.check_zero_point_victims, make_victims(test="eps"), "decoded v below eps counted as 0",
          "your test depends on the size of v", True),
    # 12.3 · rank-1 scales
    Wrong("12.3", C.check_rank1_scale, rank1_max_of_maxima, "max instead of min of row/column max",
          "take the smaller one", True),
    Wrong("12.3", C.check_rank1_scale, rank1_rows_only, "row maxima only", "the row maximum alone", True),
    Wrong("12.3", C.check_rank1_scale, rank1_no_abs, "maxima of x, not |x|", "take maxima of |x|", True),
    Wrong("12.3", C.check_rank1_scale, rank1_product, "product of the maxima", "not the product of the maxima", True),
    Wrong("12.3", C.check_rank1_scale, rank1_no_keepdim, "keepdim forgotten: shapes do not broadcast",
          "lost the reduced dimension", True),
    Wrong("12.3", C.check_rank1_scale, rank1_returns_both, "returns the two vectors", "combine them into one scale",
          True),
    Wrong("12.3", C.check_rank1_scale, rank1_amin, "amin instead of amax", "you took the SMALLEST magnitude", True),
    Wrong("12.3", C.check_rank1_scale, rank1_global_absmax, "one absmax for the matrix",
          "one absmax for the whole matrix is plain absmax", True),
    # 12.4 · stochastic rounding
    Wrong("12.4", C.check_stochastic_round, make_round(rule="nearest"), "round to nearest",
          "that is round-to-nearest", True),
    Wrong("12.4", C.check_stochastic_round, round_noise_inclusive, "noise range 0 … 2**16 inclusive",
          "an inclusive upper bound", True),
    Wrong("12.4", C.check_stochastic_round, round_noise_flat, "a flat result for a matrix input",
          "in x's shape", True),
    Wrong("12.4", C.check_stochastic_round, make_round(rule="truncate"), "truncation", "you truncate", True),
    Wrong("12.4", C.check_stochastic_round, make_round(rule="always-up"), "always the upper neighbour",
          "you always round away from zero", True),
    Wrong("12.4", C.check_stochastic_round, make_round(rule="half"), "biased threshold: up with probability 0.5",
          "you round up half of the time whatever x is", True),
    Wrong("12.4", C.check_stochastic_round, make_round(rule="reversed"), "odds reversed", "the odds are reversed",
          True),
    Wrong("12.4", C.check_stochastic_round, make_round(span=1 << 15), "noise over 2**15, half a step",
          "your random integers span 2**15", True),
    Wrong("12.4", C.check_stochastic_round, make_round(span=1 << 17), "noise over 2**17, two steps",
          "your random integers span more than 2**16", True),
    Wrong("12.4", C.check_stochastic_round, make_round(global_rng=True), "global RNG, not the generator",
          "draw every random number from the generator you are given", True),
    Wrong("12.4", C.check_stochastic_round, make_round(dtype=torch.float32), "returns fp32",
          "expected a bf16 tensor", True),
    Wrong("12.4", C.check_stochastic_round, round_gap_taken_positive, "a negative x's gap taken as positive: one "
          "way only for negatives", "a negative x is mishandled", True),
]

RIGHT = [
    Right(U, P, pack_arithmetic, "F.pad, * 16 + and a cast", (unpack_with_divmod,)),
    Right(U, P, pack, "the unpack with divmod into an empty tensor", (unpack_with_divmod,)),
    Right("12.2", C.check_zero_point_victims, victims_in_a_loop, "a loop over blocks, argmin distance"),
    Right("12.2", C.check_zero_point_victims, victims_by_codes, "codes compared with the zero entry's code"),
    Right("12.2", C.check_zero_point_victims, victims_with_library_calls, "the library's quantize_blocks / dequantize_blocks"),
    Right("12.3", C.check_rank1_scale, rank1_with_loops, "Python loops"),
    Right("12.3", C.check_rank1_scale, rank1_by_clamp, "max(dim).values and clamp(max=...)"),
    Right("12.4", C.check_stochastic_round, round_by_comparing_rand, "torch.rand compared with the fraction"),
]
