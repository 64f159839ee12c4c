"""Workbook 08 · Triton kernels: unit tests of the learner's kernels (run: -m ex08).

On a CPU the kernels run in Triton's interpreter: TRITON_INTERPRET=1 must be set before the
workbook's @triton.jit cells are loaded, so this module sets it at import (sizes stay small).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from adam8lib.quant import dequantize_blockwise, dynamic_map, num_blocks, quantize_blockwise  # noqa: E402

pytestmark = pytest.mark.ex08
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n, bs", [(1, 64), (63, 64), (65, 64), (4096, 4096), (2049, 2048)])
def test_absmax_kernel_sizes(workbook, n, bs):
    kernel = workbook("08").absmax_kernel
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(DEVICE)
    nb = num_blocks(n, bs)
    out = torch.empty(nb, device=DEVICE)
    kernel[(nb,)](x, out, n, BLOCK=bs)
    assert torch.equal(out.cpu(), quantize_blockwise(x.cpu(), None, bs)[1])


def test_absmax_kernel_negative_and_zero_blocks(workbook):
    kernel = workbook("08").absmax_kernel
    x = torch.cat([torch.zeros(64), -torch.rand(64) - 1, torch.full((10,), -0.0)]).to(DEVICE)
    out = torch.empty(3, device=DEVICE)
    kernel[(3,)](x, out, x.numel(), BLOCK=64)
    assert out[0] == 0 and out[1] == x[64:128].abs().max() and out[2] == 0


@pytest.mark.parametrize("signed", [True, False])
def test_dequantize_kernel_every_code(workbook, signed):
    """Random codes 0…255 (not only those quantize produces), a ragged tail, any absmax."""
    kernel = workbook("08").dequantize_kernel
    qmap = dynamic_map(signed)
    gen = torch.Generator().manual_seed(8)
    n, bs = 1000, 128
    codes = torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8)
    codes[:2] = torch.tensor([0, 255], dtype=torch.uint8)
    absmax = torch.rand(num_blocks(n, bs), generator=gen) * 10
    out = torch.empty(n, device=DEVICE)
    kernel[(absmax.numel(),)](codes.to(DEVICE), absmax.to(DEVICE), qmap.to(DEVICE), out, n, BLOCK=bs)
    assert torch.equal(out.cpu(), dequantize_blockwise(codes, absmax, qmap, bs))


def test_dequantize_kernel_single_short_block(workbook):
    kernel = workbook("08").dequantize_kernel
    x = torch.tensor([0.5, -1.0, 0.25])
    codes, absmax = quantize_blockwise(x, None, 64)
    out = torch.empty(3, device=DEVICE)
    kernel[(1,)](codes.to(DEVICE), absmax.to(DEVICE), dynamic_map(True).to(DEVICE), out, 3, BLOCK=64)
    assert torch.equal(out.cpu(), dequantize_blockwise(codes, absmax, None, 64))


@pytest.mark.parametrize("n, bs, signed", [(1, 64, True), (130, 64, False), (2049, 2048, True)])
def test_quantize_kernel_equals_the_library(workbook, n, bs, signed):
    kernel = workbook("08").quantize_kernel
    qmap = dynamic_map(signed)
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) ** 3
    x = x if signed else x.abs()
    want, absmax = quantize_blockwise(x, qmap, bs)
    out = torch.zeros(n, dtype=torch.uint8, device=DEVICE)
    kernel[(absmax.numel(),)](x.to(DEVICE), absmax.to(DEVICE), qmap.to(DEVICE), out, n, BLOCK=bs)
    assert torch.equal(out.cpu(), want)


def test_quantize_kernel_round_trips_the_map_itself(workbook):
    """Every map entry (absmax 1) must come back as its own code."""
    kernel = workbook("08").quantize_kernel
    for signed in (True, False):
        qmap = dynamic_map(signed)
        out = torch.zeros(256, dtype=torch.uint8, device=DEVICE)
        kernel[(1,)](qmap.to(DEVICE), torch.ones(1, device=DEVICE), qmap.to(DEVICE), out, 256, BLOCK=256)
        assert torch.equal(out.cpu().long(), torch.arange(256))


def test_ema_requantize_kernel_tracks_the_fp32_ema(workbook):
    """Ten fused 8-bit EMA steps stay within a few percent of the same EMA kept in fp32."""
    kernel = workbook("08").ema_requantize_kernel
    qmap, n, bs = dynamic_map(True), 700, 256
    gen = torch.Generator().manual_seed(0)
    codes, absmax = quantize_blockwise(torch.zeros(n), qmap, bs)
    codes, absmax, m = codes.to(DEVICE), absmax.to(DEVICE), torch.zeros(n)
    for _ in range(10):
        g = torch.randn(n, generator=gen) * 0.1 + 0.05
        m = 0.9 * m + 0.1 * g
        kernel[(absmax.numel(),)](codes, absmax, g.to(DEVICE), qmap.to(DEVICE), n, 0.9, BLOCK=bs)
    approx = dequantize_blockwise(codes.cpu(), absmax.cpu(), qmap, bs)
    assert (approx - m).norm() / m.norm() < 0.05
