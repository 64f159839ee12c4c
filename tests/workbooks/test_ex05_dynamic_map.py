"""Workbook 05 · the dynamic map: unit tests of the learner's functions (run: -m ex05)."""

import contextlib
import io

import pytest
import torch

from adam8lib.quant import dynamic_map, nearest_code

pytestmark = pytest.mark.ex05


def test_signed_map_shape_range_and_symmetry(workbook):
    code = workbook("05").dynamic_map_from_scratch(signed=True)
    assert code.shape == (256,) and code.dtype == torch.float32
    assert float(code[0]) == pytest.approx(-0.99297, abs=1e-5) and float(code[-1]) == 1.0
    assert float(code[127]) == 0.0
    negatives, positives = code[:127], code[128:255]  # without 0 and the extra 1.0
    assert torch.equal(-negatives.flip(0), positives)


def test_unsigned_map_is_non_negative_and_finer(workbook):
    code = workbook("05").dynamic_map_from_scratch(signed=False)
    assert float(code[0]) == 0.0 and float(code[-1]) == 1.0 and bool((code >= 0).all())
    assert bool((code[1:] > code[:-1]).all())  # strictly increasing: 256 distinct levels
    # twice as many levels per decade as the signed map has on its positive side
    signed = workbook("05").dynamic_map_from_scratch(signed=True)
    assert int(((code > 0.1) & (code < 1)).sum()) == 2 * int(((signed > 0.1) & (signed < 1)).sum())


@pytest.mark.parametrize("signed", [True, False])
def test_maps_equal_bitsandbytes(workbook, signed):
    with contextlib.redirect_stderr(io.StringIO()):
        from bitsandbytes.functional import create_dynamic_map
    assert torch.equal(workbook("05").dynamic_map_from_scratch(signed=signed), create_dynamic_map(signed).float())


@pytest.mark.parametrize("signed", [True, False])
def test_nearest_code_is_the_brute_force_argmin(workbook, signed):
    code = dynamic_map(signed)
    gen = torch.Generator().manual_seed(50)
    x = torch.rand(20_000, generator=gen) * (2.2 if signed else 1.1) - (1.1 if signed else 0.05)
    x = torch.cat([x, x * 1e-4, x * 1e-6])
    got = workbook("05").nearest_code(x, code)
    brute = (x[:, None] - code[None, :]).abs().argmin(dim=1)
    assert torch.equal(got.long(), brute)


def test_nearest_code_is_monotone_and_exact_on_the_map(workbook):
    code = dynamic_map(True)
    fn = workbook("05").nearest_code
    assert torch.equal(fn(code, code).long(), torch.arange(256))
    xs = torch.linspace(-2, 2, 5001)
    codes = fn(xs, code).long()
    assert bool((codes[1:] >= codes[:-1]).all())
    assert codes[0] == 0 and codes[-1] == 255


def test_nearest_code_keeps_shape_and_handles_empty(workbook):
    fn = workbook("05").nearest_code
    x = torch.rand(2, 3, 4) - 0.5
    out = fn(x, dynamic_map(True))
    assert out.shape == (2, 3, 4) and out.dtype == torch.uint8
    assert torch.equal(out, nearest_code(x, dynamic_map(True)))
    assert fn(torch.empty(0), dynamic_map(True)).numel() == 0


def test_decode_code_rebuilds_both_maps_from_the_bits(workbook):
    decode = workbook("05").decode_code
    for signed in (True, False):
        values = torch.tensor([decode(i, signed=signed)[3] for i in range(256)], dtype=torch.float64)
        assert torch.allclose(values, dynamic_map(signed).double(), rtol=2e-6, atol=0)


def test_decode_code_fields_follow_the_tree_layout(workbook):
    decode = workbook("05").decode_code
    assert decode(127) == (0, 0, 0, 0.0) and decode(0, signed=False) == (0, 0, 0, 0.0)
    assert decode(255)[:3] == (1, 7, 0) and decode(255, signed=False)[:3] == (1, 7, 0)
    assert decode(128)[:3] == (1, 0, 0) and decode(126)[:3] == (-1, 0, 0)  # decade 0: one value each side
    decades = [decode(i)[1] for i in range(128, 255)]
    assert [decades.count(d) for d in range(7)] == [1, 2, 4, 8, 16, 32, 64]
    decades = [decode(i, signed=False)[1] for i in range(1, 255)]
    assert [decades.count(d) for d in range(7)] == [2, 4, 8, 16, 32, 64, 128]
    for i in range(127):  # negatives mirror positives
        s, d, k, v = decode(i)
        assert (s, d, k) == (-1, *decode(254 - i)[1:3]) and v == -decode(254 - i)[3]
