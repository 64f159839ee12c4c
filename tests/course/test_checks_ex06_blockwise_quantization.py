"""Check cells of workbook 06 (ex06_blockwise_quantization): pass on the solution, fail with a named hint on each plausible wrong answer."""

from __future__ import annotations


import pytest
import torch

from adam8lib import quant
from adam8lib.course import checks

from tests._check_helpers import SOLUTIONS, fails_with, solution, stub  # noqa: E402,F401



# ------------------------------------------------------------------ 06 · blockwise
def make_quantize_blockwise(*, floor_blocks=False, zero_guard=True, signed_max=False, global_scale=False):
    def quantize_blockwise(x, code, blocksize=256):
        flat = x.reshape(-1).float()
        n = flat.numel()
        nb = n // blocksize if floor_blocks else -(-n // blocksize)
        padded = torch.zeros(max(nb * blocksize, n))
        padded[:n] = flat
        blocks = padded[: nb * blocksize].view(nb, blocksize)
        absmax = blocks.amax(dim=1) if signed_max else blocks.abs().amax(dim=1)
        if global_scale:
            scale = flat.abs().max().expand(nb)
        else:
            scale = torch.where(absmax > 0, absmax, torch.ones_like(absmax)) if zero_guard else absmax
        normalized = (padded.view(-1)[: nb * blocksize].view(nb, blocksize) / scale[:, None]).reshape(-1)[:n]
        return quant.nearest_code(normalized, code).view(x.shape) if not floor_blocks else \
            quant.nearest_code(torch.nn.functional.pad(normalized, (0, n - normalized.numel())), code).view(x.shape), \
            absmax

    return quantize_blockwise


@pytest.mark.parametrize("fn, hint", [
    (make_quantize_blockwise(floor_blocks=True), "the last, shorter block needs its own absmax"),
    (make_quantize_blockwise(zero_guard=False), "an all-zero block"),
    (make_quantize_blockwise(signed_max=True), "the largest MAGNITUDE"),
    (make_quantize_blockwise(global_scale=True), "not by the whole tensor's"),
    (lambda x, code, blocksize=256: quant.quantize_blockwise(x.reshape(-1), code, blocksize),
     "give them the shape of x"),
    (stub, "not implemented yet"),
])
def test_quantize_blockwise_fails(fn, hint):
    fails_with(checks.check_quantize_blockwise, fn, hint)


def deq_modulo(codes, absmax, code, blocksize=256):
    i = torch.arange(codes.numel())
    return (code[codes.reshape(-1).long()] * absmax[i % absmax.numel()]).view(codes.shape)


def deq_no_lookup(codes, absmax, code, blocksize=256):
    i = torch.arange(codes.numel())
    return (codes.reshape(-1).float() * absmax[i // blocksize]).view(codes.shape)


@pytest.mark.parametrize("fn, hint", [
    (deq_modulo, "element i belongs to block i // blocksize"),
    (deq_no_lookup, "look them up in the map first"),
    (lambda codes, absmax, code, blocksize=256: code[codes.long()], "multiply by the block's absmax"),
    (stub, "not implemented yet"),
])
def test_dequantize_blockwise_fails(fn, hint):
    fails_with(checks.check_dequantize_blockwise, fn, hint)


def test_ex06_checks_pass_on_the_solution_and_the_library(capsys):
    checks.check_quantize_blockwise(solution("06", "quantize_blockwise"))
    checks.check_dequantize_blockwise(solution("06", "dequantize_blockwise"))
    checks.check_quantize_blockwise(quant.quantize_blockwise)
    checks.check_dequantize_blockwise(quant.dequantize_blockwise)
    assert capsys.readouterr().out.count("all checks passed") == 4


def test_blocks_cut_without_padding_are_named_once():
    from adam8lib.quant import nearest_code

    def quantize_blockwise(x, code, blocksize):
        blocks = x.reshape(-1).view(-1, blocksize)  # no padding: fails on a short last block
        absmax = blocks.abs().amax(dim=1)
        scaled = blocks / torch.where(absmax > 0, absmax, torch.ones_like(absmax))[:, None]
        return nearest_code(scaled.reshape(-1), code).view(x.shape), absmax

    with pytest.raises(AssertionError) as info:
        checks.check_quantize_blockwise(quantize_blockwise)
    text = str(info.value)
    assert "Pad the flat tensor with zeros" in text and text.count("Hint:") == 1, text
