"""Check cells of workbook 12 (ex12_beyond_8_bits): pass on the solution, fail with a named hint on each plausible wrong answer."""

from __future__ import annotations

import pytest
import torch

from adam8lib.course import checks
from adam8lib.quant import nearest_code

from tests._check_helpers import fails_with, solution, stub

SOLVED = {name: solution("12", name) for name in ("pack_nibbles", "unpack_nibbles", "zero_point_victims",
                                                   "rank1_scale", "stochastic_round")}


def test_the_solution_passes_every_check(capsys):
    checks.check_pack_nibbles(SOLVED["pack_nibbles"], SOLVED["unpack_nibbles"])
    checks.check_zero_point_victims(SOLVED["zero_point_victims"])
    checks.check_rank1_scale(SOLVED["rank1_scale"])
    checks.check_stochastic_round(SOLVED["stochastic_round"])
    assert capsys.readouterr().out.count("all checks passed") == 4


# ------------------------------------------------------------------ 12.1
def pad(codes):
    return torch.cat([codes, codes.new_zeros(1)]) if codes.numel() % 2 else codes


@pytest.mark.parametrize("pack, hint", [
    (lambda c: (pad(c)[1::2] << 4) | pad(c)[0::2], "the nibbles are swapped"),
    (lambda c: (c[0::2][: c.numel() // 2] << 4) | c[1::2], "an odd number of codes still needs its last byte"),
    (lambda c: ((pad(c)[0::2] << 4) | pad(c)[1::2]).long(), "expected torch.uint8"),
    (lambda c: pad(c)[0::2] * 10 + pad(c)[1::2], "byte i holds codes[2i] in its upper 4 bits"),
    (lambda c: c.clone(), "n codes fit in n / 2 bytes"),
    (stub, "not implemented yet"),
])
def test_pack_fails(pack, hint):
    fails_with(lambda fn: checks.check_pack_nibbles(fn, SOLVED["unpack_nibbles"]), pack, hint)


@pytest.mark.parametrize("unpack, hint", [
    (lambda b, n: torch.stack([b & 0x0F, b >> 4], dim=1).reshape(-1)[:n], "you put the low nibble first"),
    (lambda b, n: torch.stack([b >> 4, b & 0x0F], dim=1).reshape(-1), "keep the first n codes"),
    (lambda b, n: torch.cat([b >> 4, b & 0x0F])[:n], "all the high nibbles come first"),
    (lambda b, n: torch.stack([b >> 4, b & 0x0F], dim=1).reshape(-1)[:n].long(), "expected a uint8 tensor"),
    (stub, "not implemented yet"),
])
def test_unpack_fails(unpack, hint):
    fails_with(lambda fn: checks.check_pack_nibbles(SOLVED["pack_nibbles"], fn), unpack, hint)


# ------------------------------------------------------------------ 12.2
def victims(*, whole_tensor=False, ignore_m=False, raw_m=False, threshold=None, floor=False, atol=None):
    def zero_point_victims(m, v, m_map, v_map, blocksize):
        def decoded(x, qmap, *, rounding="nearest"):
            n = x.numel()
            if whole_tensor:
                scale = x.abs().max().expand(n)
            else:
                absmax = torch.nn.functional.pad(x.abs(), (0, -n % blocksize)).view(-1, blocksize).amax(1)
                scale = absmax.repeat_interleave(blocksize)[:n]
            y = torch.where(scale > 0, x / scale, torch.zeros_like(x))
            if rounding == "floor":  # searchsorted alone: the entry at or below y, not the nearest
                return qmap[(torch.searchsorted(qmap, y, right=True) - 1).clamp(min=0)] * scale, y
            return qmap[nearest_code(y, qmap).long()] * scale, y

        v_hat, y = decoded(v, v_map, rounding="floor" if floor else "nearest")
        if threshold is not None:
            zero = y < threshold
        elif atol is not None:
            zero = torch.isclose(v_hat, torch.zeros_like(v_hat), atol=atol)
        else:
            zero = v_hat == 0
        if ignore_m:
            return zero
        return zero & ((m != 0) if raw_m else (decoded(m, m_map)[0] != 0))

    return zero_point_victims


@pytest.mark.parametrize("fn, hint", [
    (victims(whole_tensor=True), "absmax of ITS block"),
    (victims(ignore_m=True), "Require the decoded m to be non-zero too"),
    (victims(raw_m=True), "the update uses the DECODED m"),
    (victims(threshold=0.0033), "not just small"),
    (victims(floor=True), "you rounded down to the map entry below"),
    (victims(atol=1e-8), "your test depends on the size of v"),
    (lambda m, v, a, b, bs: torch.zeros(v.shape[0] + 1, dtype=torch.bool), "one flag per element of v"),
    (stub, "not implemented yet"),
])
def test_zero_point_victims_fails(fn, hint):
    fails_with(checks.check_zero_point_victims, fn, hint)


def test_zero_point_cases_include_tiny_second_moments_and_m_coded_0():
    from adam8lib.course.checks.ex12_beyond_8_bits import _decoded, _zero_point_cases

    cases = _zero_point_cases()
    assert min(float(v.abs().max()) for _, _, v, _, _, _ in cases) < 1e-7  # a v whose absmax is about 1e-8
    m, m_map = cases[0][1], cases[0][3]
    assert bool(((m != 0) & (_decoded(m, m_map, 128) == 0)).any())  # an m too small for the 4-bit map


# ------------------------------------------------------------------ 12.3
@pytest.mark.parametrize("fn, hint", [
    (lambda x: torch.maximum(x.abs().amax(1, keepdim=True), x.abs().amax(0, keepdim=True)), "take the smaller one"),
    (lambda x: x.abs().amax(1, keepdim=True).expand_as(x), "the row maximum alone"),
    (lambda x: x.abs().amax(0, keepdim=True).expand_as(x), "the column maximum alone"),
    (lambda x: torch.minimum(x.amax(1, keepdim=True), x.amax(0, keepdim=True)), "maxima of |x|"),
    (lambda x: x.abs().amax(1, keepdim=True) * x.abs().amax(0, keepdim=True), "not the product of the maxima"),
    (lambda x: torch.minimum(x.abs().amax(1), x.abs().amax(1)), "broadcast the row maxima"),
    (lambda x: x.abs().max().expand_as(x), "one absmax for the whole matrix"),
    (stub, "not implemented yet"),
])
def test_rank1_scale_fails(fn, hint):
    fails_with(checks.check_rank1_scale, fn, hint)


# ------------------------------------------------------------------ 12.4
def sr(*, reversed_odds=False, global_rng=False, dtype=torch.bfloat16):
    def stochastic_round(x, generator):
        bits = x.contiguous().view(torch.int32)
        frac = (bits & 0xFFFF).double() / 65536
        r = torch.rand(x.shape, dtype=torch.float64, generator=None if global_rng else generator)
        up = r < (1 - frac if reversed_odds else frac)
        up &= (bits & 0xFFFF) != 0
        out = torch.where(up, (bits & ~0xFFFF) + 0x10000, bits & ~0xFFFF).view(torch.float32)
        return out.to(dtype)

    return stochastic_round


def test_a_probability_based_solution_passes_too():
    checks.check_stochastic_round(sr())


@pytest.mark.parametrize("fn, hint", [
    (lambda x, g: x.to(torch.bfloat16), "every copy rounded"),  # round to nearest: a quarter step rounds down
    (lambda x, g: (x.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16), "every copy rounded down"),
    (sr(reversed_odds=True), "the odds are reversed"),
    (sr(global_rng=True), "draw every random number from the generator you are given"),
    (sr(dtype=torch.float32), "expected a bf16 tensor"),
    (lambda x, g: (x + torch.rand(x.shape, generator=g) * 0.01).to(torch.bfloat16), "x's bf16 neighbours are"),
    (stub, "not implemented yet"),
])
def test_stochastic_round_fails(fn, hint):
    fails_with(checks.check_stochastic_round, fn, hint)


# ------------------------------------------------------------------ mistakes a cold learner made (named, not generic)
def _blockwise(x, qmap, blocksize, code):
    n = x.numel()
    blocks = torch.nn.functional.pad(x.float(), (0, -n % blocksize)).view(-1, blocksize)
    absmax = blocks.abs().amax(1, keepdim=True)
    y = blocks / torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    return (qmap[code(y.reshape(-1), qmap).long()].view_as(blocks) * absmax).reshape(-1)[:n]


def _keep_sign_victims(m, v, m_map, v_map, bs):
    code = lambda y, q: nearest_code(y, q, keep_sign=True)  # noqa: E731
    return (_blockwise(v, v_map, bs, code) == 0) & (_blockwise(m, m_map, bs, code) != 0)


def _floor_victims(m, v, m_map, v_map, bs):
    code = lambda y, q: (torch.searchsorted(q, y.contiguous(), right=True) - 1).clamp(0, q.numel() - 1)  # noqa: E731
    return (_blockwise(v, v_map, bs, code) == 0) & (_blockwise(m, m_map, bs, code) != 0)


def _one_draw(x, generator):
    r = torch.randint(0, 1 << 16, (1,), generator=generator, dtype=torch.int32)
    return ((x.view(torch.int32) + r) & -65536).view(torch.float32).to(torch.bfloat16)


def _noise_then_nearest(x, generator):
    lo = (x.view(torch.int32) & -65536).view(torch.float32)
    hi = ((x.view(torch.int32) & -65536) + 65536).view(torch.float32)
    return (x + torch.rand(x.shape, generator=generator) * (hi - lo)).to(torch.bfloat16)


def _step_from_magnitude(x, generator):  # a float approach with a step of |lo| * 2**-7, not the bf16 gap
    lo = (x.view(torch.int32) & -65536).view(torch.float32)
    step = lo.abs() * 2.0**-7
    u = torch.rand(x.shape, generator=generator)
    return torch.where(u < ((x - lo) / step).clamp(0, 1), lo + step, lo).to(torch.bfloat16)


def _nearest_as_lower(x, generator):  # the right gap, but the "lower" neighbour is x rounded to nearest
    lo = x.to(torch.bfloat16).float()
    up = (lo.view(torch.int32) + 65536).view(torch.float32)
    u = torch.rand(x.shape, generator=generator)
    return torch.where(u < ((x - lo) / (up - lo)).clamp(0, 1), up, lo).to(torch.bfloat16)


@pytest.mark.parametrize("check, fn, hint", [
    (checks.check_zero_point_victims, _keep_sign_victims, "keep_sign=True"),
    (checks.check_zero_point_victims, _floor_victims, "you coded both moments to the map entry at or below"),
    (checks.check_rank1_scale, lambda x: torch.minimum(x.abs().amax(0)[:, None], x.abs().amax(1)[None, :]),
     "you swapped the two reductions' axes"),
    (checks.check_stochastic_round, _one_draw, "you drew ONE random number for the whole tensor"),
    (checks.check_stochastic_round, _noise_then_nearest, "which rounds to NEAREST"),
    (checks.check_stochastic_round, _step_from_magnitude, "your step is not one bf16 step"),
    (checks.check_stochastic_round, _nearest_as_lower, "the bf16 number ABOVE x"),
], ids=["keep-sign", "floor-both", "axes-swapped", "one-draw", "noise-then-nearest", "step-from-magnitude",
        "nearest-as-lower"])
def test_cold_learners_mistakes_are_named(check, fn, hint):
    fails_with(check, fn, hint)


def test_a_crash_gets_the_exercises_own_hint_once():
    def no_keepdim(x):
        return torch.minimum(x.abs().amax(1), x.abs().amax(0))

    with pytest.raises(AssertionError) as info:
        checks.check_rank1_scale(no_keepdim)
    text = str(info.value)
    assert text.count("Hint:") == 1 and "lost the reduced dimension" in text, text
    assert isinstance(info.value.__cause__, RuntimeError)  # the learner's own error stays visible
