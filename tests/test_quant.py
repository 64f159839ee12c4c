"""adam8lib.quant against bitsandbytes 0.50.2 and against brute force."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adam8lib.quant import (
    SUPPORTED_BLOCKSIZES,
    absmax_dequantize,
    absmax_quantize,
    dequantize_blockwise,
    dynamic_map,
    linear_map,
    nearest_code,
    quantize_blockwise,
)
from tests._bnb import bnbF

SIZES = [1, 255, 256, 257, 4095, 4096, 1_000_003]


def brute_force_nearest(x, code):
    """argmin |code - x|, ties to the lower index (argmin returns the first minimum)."""
    return (code[None, :] - x[:, None]).abs().argmin(dim=1)


def local_gap(code, idx):
    """Distance from code[idx] to its farther neighbour: one code gap around idx."""
    lower = code[(idx - 1).clamp(min=0)]
    upper = code[(idx + 1).clamp(max=255)]
    return torch.maximum(code[idx] - lower, upper - code[idx])


# ------------------------------------------------------------------ maps
# (bit-identical to bitsandbytes' map, and the same bits on every CPU: tests/test_canonical_maps.py)
def test_dynamic_map_shape_and_landmarks():
    signed, unsigned = dynamic_map(True), dynamic_map(False)
    for m in (signed, unsigned):
        assert m.shape == (256,) and bool((m[1:] > m[:-1]).all())
        assert m[-1].item() == 1.0
    assert signed[127].item() == 0.0 and signed[0].item() == pytest.approx(-0.99297, abs=1e-5)
    assert unsigned[0].item() == 0.0 and bool((unsigned >= 0).all())
    # seven decades: the smallest non-zero magnitude is below 1e-6
    assert 0 < signed[128].item() < 1e-6 and 0 < unsigned[1].item() < 1e-6


def test_linear_map():
    assert torch.equal(linear_map(True), torch.linspace(-1, 1, 256))
    assert linear_map(False)[0].item() == 0.0 and linear_map(False)[-1].item() == 1.0


# ------------------------------------------------------------------ nearest code
@pytest.mark.parametrize("signed", [True, False])
def test_nearest_code_is_exact_nearest_with_ties_to_lower(signed):
    code = dynamic_map(signed)
    g = torch.Generator().manual_seed(0)
    lo = -1.0 if signed else 0.0
    x = torch.cat([
        torch.rand(20000, generator=g) * (1 - lo) + lo,  # uniform
        torch.randn(20000, generator=g).mul(1e-3).clamp(lo, 1),  # near zero, many decades
        code,  # exact map values
        (code[1:] + code[:-1]) / 2,  # exact midpoints: ties -> lower index
        torch.tensor([-5.0, 5.0, -1.0, 1.0]),  # out of range clamps to the ends
    ])
    assert torch.equal(nearest_code(x, code).long(), brute_force_nearest(x, code))


def test_keep_sign_never_rounds_a_nonzero_value_to_zero_or_the_other_sign():
    signed, unsigned = dynamic_map(True), dynamic_map(False)
    x = torch.tensor([-1e-9, 1e-9, -0.0, 0.0, -0.5])
    plain, kept = nearest_code(x, signed), nearest_code(x, signed, keep_sign=True)
    assert plain.tolist()[:4] == [127, 127, 127, 127]
    assert kept.tolist() == [126, 128, 127, 127, plain[4].item()]
    assert signed[126] < 0 < signed[128]
    v = torch.tensor([0.0, 1e-12, 0.3])
    assert nearest_code(v, unsigned).tolist()[:2] == [0, 0]
    assert nearest_code(v, unsigned, keep_sign=True).tolist() == [0, 1, nearest_code(v, unsigned)[2].item()]
    # everywhere else it is the plain nearest code
    torch.manual_seed(0)
    y = torch.randn(10000).clamp(-0.99, 0.99)
    same = y.abs() > 1e-6
    assert torch.equal(nearest_code(y, signed, keep_sign=True)[same], nearest_code(y, signed)[same])


# ------------------------------------------------------------------ blockwise vs bitsandbytes
@pytest.mark.parametrize("blocksize", SUPPORTED_BLOCKSIZES)
@pytest.mark.parametrize("n", [1, 255, 257, 4095, 10_003])
def test_blockwise_matches_bitsandbytes(n, blocksize):
    torch.manual_seed(n + blocksize)
    x = torch.randn(n) * torch.rand(n) ** 3  # values spread over several decades
    codes, absmax = quantize_blockwise(x, blocksize=blocksize)
    theirs, qstate = bnbF.quantize_blockwise(x, blocksize=blocksize)
    assert absmax.shape == (math.ceil(n / blocksize),)
    assert torch.equal(absmax, qstate.absmax)  # absmax identical, bit for bit
    # Compare in normalized units (map values, before the absmax scale). bnb's CPU search is
    # not always the exact nearest: for |x/absmax| >= 1e-4 it is within one code gap of ours;
    # in the three smallest decades it is coarser (measured: up to 4 codes, 2.25e-5 apart).
    code = dynamic_map(True)
    ours_v, theirs_v = code[codes.long()], code[theirs.long()]
    normalized = x / absmax.repeat_interleave(blocksize)[:n]
    big = normalized.abs() >= 1e-4
    gap = local_gap(code, codes.long())
    assert bool(((ours_v - theirs_v).abs()[big] <= gap[big] * (1 + 1e-5)).all())
    assert bool(((ours_v - theirs_v).abs()[~big] <= 2.5e-5).all())
    # ... ours is the exact nearest, so never farther from x than bnb's
    assert bool(((ours_v - normalized).abs() <= (theirs_v - normalized).abs() + 1e-7).all())
    # and bnb's dequantizer reads our codes back to the same values as ours
    ours_x = dequantize_blockwise(codes, absmax, blocksize=blocksize)
    qstate.absmax = absmax
    assert torch.allclose(bnbF.dequantize_blockwise(codes, qstate), ours_x, rtol=1e-6, atol=0)


def test_codes_mostly_identical_to_bitsandbytes_on_gaussian_data():
    torch.manual_seed(0)
    x = torch.randn(100_000)
    codes, _ = quantize_blockwise(x)
    theirs, _ = bnbF.quantize_blockwise(x, blocksize=256)
    agree = (codes == theirs).float().mean().item()
    assert agree > 0.995, agree  # measured: 0.99852 (the rest are bnb's near-ties)


# ------------------------------------------------------------------ properties
@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=1, max_size=700),
    blocksize=st.sampled_from([64, 128, 256]),
)
def test_roundtrip_error_is_at_most_half_the_local_gap(values, blocksize):
    x = torch.tensor(values, dtype=torch.float32)
    codes, absmax = quantize_blockwise(x, blocksize=blocksize)
    y = dequantize_blockwise(codes, absmax, blocksize=blocksize)
    code = dynamic_map(True)
    block_absmax = absmax.repeat_interleave(blocksize)[: x.numel()]
    half_gap = local_gap(code, codes.long()) / 2 * block_absmax
    # the signed map stops at -0.99297: values below it clamp to that end (error ≤ 0.0070 × absmax)
    beyond = (x - (x / block_absmax).clamp(code[0], code[-1]).nan_to_num(0.0) * block_absmax).abs()
    assert bool(((x - y).abs() <= torch.maximum(half_gap, beyond) * (1 + 1e-5) + 1e-30).all())


@pytest.mark.parametrize("n", SIZES)
def test_shapes_zero_blocks_and_tail(n):
    x = torch.zeros(n)
    if n > 300:
        x[300:] = torch.randn(n - 300)  # first block(s) all zero, the rest not
    codes, absmax = quantize_blockwise(x.view(-1, 1) if n % 2 else x)
    y = dequantize_blockwise(codes, absmax)
    assert codes.dtype == torch.uint8 and absmax.numel() == math.ceil(n / 256)
    assert not torch.isnan(y).any()
    assert torch.equal(y.view(-1)[:256], torch.zeros(min(n, 256)))


def test_unsigned_map_and_other_dtypes_and_noncontiguous():
    torch.manual_seed(1)
    v = torch.rand(64, 33) ** 4
    code = dynamic_map(False)
    codes, absmax = quantize_blockwise(v, code=code, blocksize=64)
    assert codes.shape == v.shape
    err = (dequantize_blockwise(codes, absmax, code=code, blocksize=64) - v).abs().view(-1)
    half_gap = local_gap(code, codes.view(-1).long()) / 2 * absmax.repeat_interleave(64)
    assert bool((err <= half_gap * (1 + 1e-5)).all())
    t = v.t()  # non-contiguous: quantized in logical (row-major) order
    c_t, a_t = quantize_blockwise(t, code=code, blocksize=64)
    c_ref, a_ref = quantize_blockwise(t.contiguous(), code=code, blocksize=64)
    assert torch.equal(c_t, c_ref) and torch.equal(a_t, a_ref)
    for dtype in (torch.bfloat16, torch.float16):
        c16, a16 = quantize_blockwise(v.to(dtype), code=code, blocksize=64)
        c32, a32 = quantize_blockwise(v.to(dtype).float(), code=code, blocksize=64)
        assert torch.equal(c16, c32) and torch.equal(a16, a32)
        out = dequantize_blockwise(c16, a16, code=code, blocksize=64, dtype=dtype)
        assert out.dtype == dtype


# ------------------------------------------------------------------ linear absmax int8
def test_absmax_int8_roundtrip_error_bound():
    torch.manual_seed(0)
    x = torch.randn(10_000)
    q, absmax = absmax_quantize(x)
    assert q.dtype == torch.int8 and absmax.item() == x.abs().max().item()
    assert q.abs().max().item() == 127
    err = (absmax_dequantize(q, absmax) - x).abs().max().item()
    assert err <= absmax.item() / 254 * (1 + 1e-5)


def test_absmax_int8_outlier_zeroes_small_values():
    x = torch.full((1000,), 1e-3)
    x[0] = 100.0
    q, absmax = absmax_quantize(x)
    assert (absmax_dequantize(q, absmax)[1:] == 0).all()
    assert torch.equal(absmax_quantize(torch.zeros(5))[0], torch.zeros(5, dtype=torch.int8))


# ------------------------------------------------------------------ bad input
def test_bad_input_errors():
    with pytest.raises(TypeError, match="floating-point"):
        quantize_blockwise(torch.arange(10))
    with pytest.raises(TypeError, match="floating-point"):
        absmax_quantize(torch.ones(3, dtype=torch.int32))
    with pytest.raises(TypeError):
        quantize_blockwise([1.0, 2.0])
    for bad in (100, 32, 8192, 256.0, True):
        with pytest.raises(ValueError, match="blocksize"):
            quantize_blockwise(torch.ones(10), blocksize=bad)
    codes, absmax = quantize_blockwise(torch.ones(600))
    with pytest.raises(ValueError, match="absmax has 2 entries"):
        dequantize_blockwise(codes, absmax[:2])
    with pytest.raises(TypeError, match="uint8"):
        dequantize_blockwise(codes.int(), absmax)
    with pytest.raises(ValueError, match="sorted"):
        quantize_blockwise(torch.ones(10), code=dynamic_map().flip(0))
    with pytest.raises(ValueError, match="256-entry"):
        quantize_blockwise(torch.ones(10), code=torch.linspace(-1, 1, 16))
    with pytest.raises(TypeError, match="int8"):
        absmax_dequantize(torch.ones(3), torch.tensor(1.0))


def test_shared_validation_helpers_are_public():
    from adam8lib import quant

    assert torch.equal(quant.check_code(None, torch.device("cpu")), dynamic_map(True))
    with pytest.raises(ValueError, match="sorted ascending"):
        quant.check_code(dynamic_map(True).flip(0), torch.device("cpu"))
    with pytest.raises(TypeError, match="codes must be a floating-point tensor"):
        quant.require_float(torch.ones(3, dtype=torch.int32), "codes")
    valid = quant.check_dequantize_inputs(torch.zeros(300, dtype=torch.uint8), torch.zeros(2), None, 256)
    assert torch.equal(valid, dynamic_map(True))
    with pytest.raises(ValueError, match="absmax has 3 entries but 300 codes in blocks of 256 need 2"):
        quant.check_dequantize_inputs(torch.zeros(300, dtype=torch.uint8), torch.zeros(3), None, 256)
