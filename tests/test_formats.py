"""adam8lib.formats: how each state format stores a moment, against brute force and bitsandbytes."""

from __future__ import annotations

import math

import pytest
import torch

from adam8lib.formats import (
    FORMATS,
    FP8_MAX,
    FP8_TINY,
    get_format,
    pack_nibbles,
    rank1_scales,
    unpack_nibbles,
    zero_free_map,
)
from adam8lib.quant import dynamic_map, nearest_code

SHAPES = [(300, 70), (4096,), (5, 6, 7), (1, 129), (3,)]


def moments(shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    m = torch.randn(shape, generator=gen).reshape(-1) * 1e-3
    v = (torch.randn(shape, generator=gen).reshape(-1) * 1e-3) ** 2
    v[::17] = 0.0  # some entries never saw a gradient
    m[::17] = 0.0
    return m, v


# ------------------------------------------------------------------ packing and maps
def test_nibbles_pack_two_codes_per_byte_high_first():
    codes = torch.tensor([1, 2, 15, 0, 7], dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [0x12, 0xF0, 0x70]  # odd count: a 0 code pads the last byte
    assert torch.equal(unpack_nibbles(packed, 5), codes)
    every = torch.arange(16, dtype=torch.uint8).repeat_interleave(16)
    assert torch.equal(unpack_nibbles(pack_nibbles(every), 256), every)


def test_zero_free_map_is_sixteen_exact_fractions_without_zero():
    q = zero_free_map()
    assert q.tolist() == [k / 16 for k in range(1, 17)] and bool((q > 0).all())


def test_rank1_scales_are_the_axis_maxima_and_bound_every_entry():
    x = torch.randn(6, 9)
    rows, cols = rank1_scales(x)
    assert torch.equal(rows, x.abs().amax(1)) and torch.equal(cols, x.abs().amax(0))
    scale = torch.minimum(rows[:, None], cols[None, :])
    assert bool((x.abs() <= scale).all())  # so x / scale is in [-1, 1]
    cube = torch.randn(3, 4, 5)
    maxima = rank1_scales(cube)
    assert [m.shape for m in maxima] == [(3,), (4,), (5,)]
    assert torch.equal(maxima[1], cube.abs().permute(1, 0, 2).reshape(4, -1).amax(1))


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fresh_state_decodes_to_zeros_and_has_the_stated_layout(name, shape):
    fmt = FORMATS[name]
    state = fmt.new_state(shape, torch.device("cpu"))
    m, v = fmt.decode(state, shape)
    assert bool((m == 0).all()) and bool((v == 0).all()) and m.numel() == math.prod(shape)
    spec = fmt.state_spec(shape)
    assert {k: (t.numel(), t.dtype) for k, t in state.items()} == spec
    assert fmt.state_bytes(shape) == sum(t.numel() * t.element_size() for t in state.values())


def brute_force_map_decode(values, scale, qmap, keep_sign):
    """Nearest entry by argmin over the map (ties: lower index), with the sign rule, times the scale."""
    x = torch.where(scale > 0, values / scale, torch.zeros_like(values))
    idx = (qmap[None, :] - x[:, None]).abs().argmin(1)
    if keep_sign:
        idx = idx - ((x < 0) & (qmap[idx] >= 0)).long() + ((x > 0) & (qmap[idx] <= 0)).long()
    return qmap[idx] * scale


@pytest.mark.parametrize("name", ["8bit", "4bit", "4bit-naive"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_map_formats_decode_to_the_nearest_map_entry_times_the_scale(name, shape):
    fmt = FORMATS[name]
    state = fmt.new_state(shape, torch.device("cpu"))
    m, v = moments(shape)
    fmt.encode_(state, m, v, shape)
    got_m, got_v = fmt.decode(state, shape)
    for moment, x, got in ((fmt.m, m, got_m), (fmt.v, v, got_v)):
        if moment.uses_rank1(shape):  # the smallest of the maxima along every axis that meet at the element
            a = x.view(shape).abs()
            scale = torch.full(shape, float("inf"))
            for axis in range(len(shape)):
                others = tuple(d for d in range(len(shape)) if d != axis)
                scale = torch.minimum(scale, a.amax(dim=others, keepdim=True))
            scale = scale.reshape(-1)
        else:
            scale = torch.nn.functional.pad(x.abs(), (0, -x.numel() % moment.blocksize)).view(
                -1, moment.blocksize).amax(1).repeat_interleave(moment.blocksize)[: x.numel()]
        # rank-1 divides by the element's own scale; blockwise by its block's (x * (1/scale) in the library)
        want = brute_force_map_decode(x * torch.where(scale > 0, 1 / scale, 0) * scale, scale, moment.qmap(),
                                      moment.keep_sign)
        assert torch.allclose(got, want, rtol=1e-6, atol=0), name


def test_fp8_codes_are_e4m3_numbers_with_one_scale_per_block():
    fmt = FORMATS["fp8"]
    shape = (1000,)
    m, v = moments(shape)
    state = fmt.new_state(shape, torch.device("cpu"))
    fmt.encode_(state, m, v, shape)
    scale = torch.nn.functional.pad(m.abs(), (0, 24)).view(-1, 256).amax(1)
    assert torch.equal(state["absmax1"], scale)
    codes = state["state1"].view(torch.float8_e4m3fn).float()
    assert float(codes.abs().max()) == FP8_MAX  # the block's largest value maps to e4m3's largest
    got, _ = fmt.decode(state, shape)
    normal = m.abs() / scale.repeat_interleave(256)[:1000] * FP8_MAX >= 2.0**-6  # e4m3's normal range
    rel = ((got - m).abs() / m.abs())[normal & (m != 0)]
    assert float(rel.max()) <= 2.0**-4  # 3 mantissa bits: half an ulp is 1/16 relative


@pytest.mark.parametrize("name", ["8bit", "4bit", "fp8"])
def test_keep_sign_never_codes_a_nonzero_moment_to_zero(name):
    """The sign rule where a format has it: 8-bit and FP8 for m and v; 4-bit for v (a map without 0)."""
    fmt = FORMATS[name]
    shape = (64, 64)
    m = torch.full(shape, 1e-9).reshape(-1)
    m[::7] = -1e-9
    m[0] = 1.0  # one large value per block/row: the tiny ones sit far below its scale
    v = torch.full(shape, 1e-18).reshape(-1)
    v[0] = 1.0
    state = fmt.new_state(shape, torch.device("cpu"))
    fmt.encode_(state, m, v, shape)
    got_m, got_v = fmt.decode(state, shape)
    if fmt.m.keep_sign:
        assert bool((torch.sign(got_m) == torch.sign(m)).all())
    else:  # 4-bit m: the nearest code; a tiny m becomes 0, never the other sign
        assert bool((torch.sign(got_m) * torch.sign(m) >= 0).all()) and bool((got_m == 0).any())
    assert bool((got_v > 0).all())  # v: the zero-free map (4bit) or the sign rule (8bit, fp8)


def test_naive_four_bit_codes_tiny_v_to_zero_the_zero_point_problem():
    fmt = FORMATS["4bit-naive"]
    shape = (64, 64)
    m = torch.full(shape, 1e-4).reshape(-1)
    v = torch.full(shape, 1e-12).reshape(-1)
    v[::128] = 1e-6  # one larger v per block of 128
    state = fmt.new_state(shape, torch.device("cpu"))
    fmt.encode_(state, m, v, shape)
    got_m, got_v = fmt.decode(state, shape)
    lost = (got_v == 0) & (got_m != 0)
    assert int(lost.sum()) == 4096 - 32  # every tiny v: the next update is lr * m / eps
    # the fix: a map without zero keeps v positive (and rank-1 scales keep it close)
    fixed = FORMATS["4bit"]
    state = fixed.new_state(shape, torch.device("cpu"))
    fixed.encode_(state, m, v, shape)
    assert bool((fixed.decode(state, shape)[1] > 0).all())


@pytest.mark.parametrize("shape", [(256, 256), (4096,), (768, 3072)], ids=str)
def test_bytes_per_parameter(shape):
    n = math.prod(shape)
    blocks = lambda b: -(-n // b)  # noqa: E731
    assert FORMATS["8bit"].state_bytes(shape) == 2 * n + 8 * blocks(256)
    assert FORMATS["fp8"].state_bytes(shape) == 2 * n + 8 * blocks(256)
    v_scales = sum(shape) if len(shape) >= 2 else blocks(128)
    assert FORMATS["4bit"].state_bytes(shape) == 2 * -(-n // 2) + 4 * blocks(128) + 4 * v_scales
    if shape == (768, 3072):  # a DistilBERT feed-forward matrix: about 1.03 bytes per parameter
        assert FORMATS["4bit"].state_bytes(shape) / n == pytest.approx(1.0 + 4 / 128 + 4 * (768 + 3072) / n)


def test_four_bit_m_map_is_bitsandbytes_four_bit_map():
    assert torch.equal(FORMATS["4bit"].m.qmap(), dynamic_map(True, 3, 4))


def test_fingerprints_name_maps_packing_and_scales():
    prints = {name: fmt.fingerprint() for name, fmt in FORMATS.items()}
    assert len(set(prints.values())) == len(prints)
    assert prints["4bit"] == ("4bit:721d11e3711326d4/4bit/b128/nearest|"
                              f"{FORMATS['4bit'].v.fingerprint()}") and "rank1-b128" in prints["4bit"]
    assert FORMATS["4bit"].with_blocksize(256).fingerprint() != prints["4bit"]


def test_get_format_and_bad_names():
    assert get_format("fp8") is FORMATS["fp8"] and get_format(FORMATS["4bit"]) is FORMATS["4bit"]
    for bad in ("8-bit", None, 4):
        with pytest.raises(ValueError, match="Unknown state_format"):
            get_format(bad)


def test_nearest_code_is_what_the_map_formats_use():
    # the map formats code with the library's nearest_code (tested against brute force in test_quant)
    x = torch.linspace(-1, 1, 1001)
    q = dynamic_map(True, 3, 4)
    fmt = FORMATS["4bit"].m
    codes, _ = fmt.quantize(x, (1001,))
    scale = torch.nn.functional.pad(x.abs(), (0, 23)).view(-1, 128).amax(1).repeat_interleave(128)[:1001]
    assert torch.equal(unpack_nibbles(codes, 1001), nearest_code(x * (1 / scale), q, keep_sign=False))
    assert FP8_TINY == 2.0**-9
