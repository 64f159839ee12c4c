"""Workbook 04 · linear (absmax) quantization: unit tests of the learner's functions (run: -m ex04)."""

import pytest
import torch

pytestmark = pytest.mark.ex04


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_round_trip_error_is_at_most_half_a_step(workbook, dtype):
    wb = workbook("04")
    gen = torch.Generator().manual_seed(4)
    for n in (1, 2, 7, 1000):
        x = (torch.randn(n, generator=gen) * 10).to(dtype)
        q, absmax = wb.absmax_quantize(x)
        assert q.dtype == torch.int8 and q.shape == x.shape
        back = wb.absmax_dequantize(q, absmax)
        assert back.dtype == torch.float32
        assert float((back - x.float()).abs().max()) <= float(absmax) / 254 * (1 + 1e-5)


def test_the_largest_magnitude_maps_to_plus_or_minus_127(workbook):
    q, absmax = workbook("04").absmax_quantize(torch.tensor([0.5, -2.0, 1.0]))
    assert q.tolist() == [32, -127, 64] and float(absmax) == 2.0


def test_quantization_is_odd_symmetric(workbook):
    x = torch.randn(5, 9, generator=torch.Generator().manual_seed(5))
    q_pos, _ = workbook("04").absmax_quantize(x)
    q_neg, _ = workbook("04").absmax_quantize(-x)
    assert torch.equal(q_neg, -q_pos)


def test_zero_tensor_has_no_nan(workbook):
    q, absmax = workbook("04").absmax_quantize(torch.zeros(3, 3))
    assert float(absmax) == 0 and not q.any()
    back = workbook("04").absmax_dequantize(q, absmax)
    assert torch.equal(back, torch.zeros(3, 3))


def test_an_outlier_flattens_the_small_values(workbook):
    """The lesson's point: with one scale, values far below absmax/254 all become 0."""
    x = torch.full((100,), 1e-3)
    x[0] = 1000.0
    q, _ = workbook("04").absmax_quantize(x)
    assert q[0] == 127 and not q[1:].any()
