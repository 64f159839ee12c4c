"""The checks of workbooks 04-06 pass on the solutions and fail, with the right hint, on wrong answers."""

from __future__ import annotations


import pytest
import torch

from adam8lib import checks, quant

from tests._check_helpers import SOLUTIONS, fails_with, solution, stub  # noqa: E402,F401


# ------------------------------------------------------------------ 04 · absmax int8
def make_quantize(*, scale=127.0, rounding=torch.round, signed_max=False, dtype=torch.int8):
    def absmax_quantize(x):
        x = x.float()
        a = x.max() if signed_max else x.abs().max()
        if a == 0:
            return torch.zeros_like(x, dtype=dtype), a
        return rounding(x * (scale / a)).to(dtype), a

    return absmax_quantize


@pytest.mark.parametrize("fn, hint", [
    (make_quantize(scale=128.0), "scale by 127, not 128"),
    (make_quantize(rounding=lambda t: t), "round to the nearest integer (torch.round) before casting"),
    (make_quantize(signed_max=True), "a NEGATIVE value can be the largest in magnitude"),
    (make_quantize(dtype=torch.int16), "convert the rounded values with .to(torch.int8)"),
    (stub, "not implemented yet"),
])
def test_absmax_quantize_fails(fn, hint):
    fails_with(checks.check_absmax_quantize, fn, hint)


@pytest.mark.parametrize("fn, hint", [
    (lambda q, a: q.float() * a / 128, "divide by 127"),
    (lambda q, a: q.float() / 127, "multiply by the absmax"),
    (lambda q, a: q.double() * a / 127, "expected torch.float32"),
    (stub, "not implemented yet"),
])
def test_absmax_dequantize_fails(fn, hint):
    fails_with(checks.check_absmax_dequantize, fn, hint)


def test_ex04_checks_pass_on_the_solution_and_the_library(capsys):
    checks.check_absmax_quantize(solution("04", "absmax_quantize"))
    checks.check_absmax_dequantize(solution("04", "absmax_dequantize"))
    checks.check_absmax_quantize(quant.absmax_quantize)
    checks.check_absmax_dequantize(quant.absmax_dequantize)
    assert capsys.readouterr().out.count("all checks passed") == 4


# ------------------------------------------------------------------ 05 · dynamic map
def make_map(*, float64=False, midpoints=True, unsigned_double=True, sort=True):
    def dynamic_map_from_scratch(signed=True):
        dtype = torch.float64 if float64 else torch.float32
        values = [torch.tensor([0.0, 1.0], dtype=dtype)]
        for i in range(7):
            n = (2**i if signed or not unsigned_double else 2 ** (i + 1)) + 1
            grid = torch.linspace(0.1, 1.0, n, dtype=dtype)
            dec = ((grid[:-1] + grid[1:]) / 2 if midpoints else grid) * 10.0 ** (i - 6)
            values += [dec, -dec] if signed else [dec]
        table = torch.cat(values)
        return (torch.sort(table).values if sort else table).float()

    return dynamic_map_from_scratch


@pytest.mark.parametrize("fn, hint", [
    (make_map(float64=True), "not bit-identical"),
    (make_map(midpoints=False), "take the MIDPOINTS"),
    (make_map(unsigned_double=False), "unsigned: 2**(i+1) + 1 grid points"),
    (make_map(sort=False), "is not sorted"),
    (stub, "not implemented yet"),
])
def test_dynamic_map_fails(fn, hint):
    fails_with(checks.check_dynamic_map, fn, hint)


def make_nearest(*, ties_up=False, only_searchsorted=False, clamp=True, dtype=torch.uint8):
    def nearest_code(x, code):
        x = x.float()
        hi = torch.searchsorted(code, x)
        if only_searchsorted:
            return (hi.clamp(0, 255) if clamp else hi).to(dtype)
        hi = hi.clamp(1, 255)
        lo = hi - 1
        pick = (code[hi] - x <= x - code[lo]) if ties_up else (code[hi] - x < x - code[lo])
        return torch.where(pick, hi, lo).to(dtype)

    return nearest_code


@pytest.mark.parametrize("fn, hint", [
    (make_nearest(ties_up=True), "take the LOWER index"),
    (make_nearest(only_searchsorted=True), "also look at the entry before it"),
    (make_nearest(dtype=torch.int64), "convert the indices with .to(torch.uint8)"),
    (stub, "not implemented yet"),
])
def test_nearest_code_fails(fn, hint):
    fails_with(checks.check_nearest_code, fn, hint)


def test_ex05_checks_pass_on_the_solution_and_the_library(capsys):
    checks.check_dynamic_map(solution("05", "dynamic_map_from_scratch"))
    checks.check_nearest_code(solution("05", "nearest_code"))
    checks.check_dynamic_map(quant.dynamic_map)
    checks.check_nearest_code(quant.nearest_code)
    # broadcasting argmin is another right answer (ties -> first index = lower)
    checks.check_nearest_code(lambda x, code: (x.float()[..., None] - code).abs().argmin(-1).to(torch.uint8))
    assert capsys.readouterr().out.count("all checks passed") == 5


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
    (make_quantize_blockwise(floor_blocks=True), "wrong block count for a ragged tail"),
    (make_quantize_blockwise(zero_guard=False), "an all-zero block"),
    (make_quantize_blockwise(signed_max=True), "the largest MAGNITUDE"),
    (make_quantize_blockwise(global_scale=True), "not by the whole tensor's"),
    (lambda x, code, blocksize=256: quant.quantize_blockwise(x.reshape(-1), code, blocksize),
     "give the codes the shape of x"),
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
    (deq_no_lookup, "look the codes up in the map first"),
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
