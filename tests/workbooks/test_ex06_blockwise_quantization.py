"""Workbook 06 · blockwise quantization: unit tests of the learner's functions (run: -m ex06)."""

import pytest
import torch

from adam8lib.quant import dequantize_blockwise, dynamic_map, quantize_blockwise

pytestmark = pytest.mark.ex06


@pytest.mark.parametrize("blocksize", [64, 256])
def test_every_size_around_block_boundaries(workbook, blocksize):
    wb = workbook("06")
    code = dynamic_map(True)
    gen = torch.Generator().manual_seed(6)
    for n in (1, blocksize - 1, blocksize, blocksize + 1, 2 * blocksize - 1, 3 * blocksize + 5):
        x = torch.randn(n, generator=gen)
        codes, absmax = wb.quantize_blockwise(x, code, blocksize)
        want_codes, want_absmax = quantize_blockwise(x, code, blocksize)
        assert absmax.shape == want_absmax.shape == (-(-n // blocksize),), n
        torch.testing.assert_close(absmax, want_absmax)
        assert codes.dtype == torch.uint8 and (codes.long() - want_codes.long()).abs().max() <= 1
        back = wb.dequantize_blockwise(codes, absmax, code, blocksize)
        torch.testing.assert_close(back, dequantize_blockwise(codes, absmax, code, blocksize))


def test_all_zero_tensor_round_trips_to_zeros(workbook):
    wb = workbook("06")
    code = dynamic_map(True)
    codes, absmax = wb.quantize_blockwise(torch.zeros(300), code, 128)
    assert torch.equal(absmax, torch.zeros(3)) and bool((codes == 127).all())
    back = wb.dequantize_blockwise(codes, absmax, code, 128)
    assert torch.equal(back, torch.zeros(300))


def test_shapes_and_dtypes(workbook):
    wb = workbook("06")
    code = dynamic_map(True)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        x = torch.randn(2, 3, 50).to(dtype)
        codes, absmax = wb.quantize_blockwise(x, code, 64)
        assert codes.shape == x.shape and absmax.dtype == torch.float32 and absmax.numel() == 5
        back = wb.dequantize_blockwise(codes, absmax, code, 64)
        assert back.shape == x.shape and back.dtype == torch.float32


def test_an_outlier_only_hurts_its_own_block(workbook):
    wb = workbook("06")
    code = dynamic_map(True)
    x = torch.randn(1024, generator=torch.Generator().manual_seed(60)) * 1e-2
    x[0] = 1e3
    codes, absmax = wb.quantize_blockwise(x, code, 256)
    back = wb.dequantize_blockwise(codes, absmax, code, 256)
    rel = ((back - x).abs() / x.abs().clamp_min(1e-12))[256:]
    assert float(rel.median()) < 0.05  # the other blocks keep their precision


def test_unsigned_map_round_trip_error_is_small(workbook):
    wb = workbook("06")
    code = dynamic_map(False)
    v = torch.rand(5000, generator=torch.Generator().manual_seed(61)) ** 3
    codes, absmax = wb.quantize_blockwise(v, code, 256)
    back = wb.dequantize_blockwise(codes, absmax, code, 256)
    assert bool((back >= 0).all())
    assert float(((back - v).abs() / absmax.repeat_interleave(256)[:5000]).max()) < 0.01
