"""Workbook 06 · blockwise quantization: what learners write instead of the solution."""

from __future__ import annotations

import torch

from adam8lib.course import checks
from adam8lib.quant import nearest_code
from tests.workbooks.wrong_answers import Right, Wrong

Q, DQ = checks.check_quantize_blockwise, checks.check_dequantize_blockwise


# ------------------------------------------------------------------ 06.1 · quantize_blockwise
def _blocks(x, blocksize):
    flat = x.reshape(-1).float()
    n = flat.numel()
    nb = -(-n // blocksize)
    return torch.nn.functional.pad(flat, (0, nb * blocksize - n)).view(nb, blocksize), n


def _codes(blocks, scale, n, code):
    return nearest_code((blocks / scale[:, None]).reshape(-1)[:n], code)


def floor_blocks(x, code, blocksize=256):
    """n // blocksize blocks: the ragged tail gets no absmax of its own (it borrows the last one)."""
    flat = x.reshape(-1).float()
    nb = max(flat.numel() // blocksize, 1)
    absmax = flat[: nb * blocksize].view(nb, blocksize).abs().amax(dim=1) if flat.numel() >= blocksize \
        else flat.abs().max().reshape(1)
    block_of = (torch.arange(flat.numel()) // blocksize).clamp(max=nb - 1)
    scale = torch.where(absmax > 0, absmax, torch.ones_like(absmax))[block_of]
    return nearest_code(flat / scale, code).view(x.shape), absmax


def one_absmax(x, code, blocksize=256):
    """absmax over the whole tensor (lesson 04's scheme), returned as a single number."""
    flat = x.reshape(-1).float()
    absmax = flat.abs().max()
    return nearest_code(flat / absmax, code).view(x.shape), absmax.reshape(1)


def global_scale_codes(x, code, blocksize=256):
    """absmax per block returned, but every element divided by the whole tensor's max."""
    blocks, n = _blocks(x, blocksize)
    absmax = blocks.abs().amax(dim=1)
    return nearest_code(x.reshape(-1).float() / x.float().abs().max(), code).view(x.shape), absmax


def no_zero_guard(x, code, blocksize=256):
    blocks, n = _blocks(x, blocksize)
    absmax = blocks.abs().amax(dim=1)
    return _codes(blocks, absmax, n, code).view(x.shape), absmax  # 0 / 0 in an all-zero block


def signed_max(x, code, blocksize=256):
    blocks, n = _blocks(x, blocksize)
    absmax = blocks.amax(dim=1)  # max(x), not max(|x|)
    return _codes(blocks, torch.where(absmax > 0, absmax, torch.ones_like(absmax)), n, code).view(x.shape), absmax


def int8_codes(x, code, blocksize=256):
    blocks, n = _blocks(x, blocksize)
    absmax = blocks.abs().amax(dim=1)
    codes = _codes(blocks, torch.where(absmax > 0, absmax, torch.ones_like(absmax)), n, code)
    return codes.to(torch.int8).view(x.shape), absmax  # 128…255 wrap to -128…-1


def flat_codes(x, code, blocksize=256):
    blocks, n = _blocks(x, blocksize)
    absmax = blocks.abs().amax(dim=1)
    return _codes(blocks, torch.where(absmax > 0, absmax, torch.ones_like(absmax)), n, code), absmax


def blocks_per_row(x, code, blocksize=256):
    """Each row of a matrix cut into its own blocks, instead of the flat tensor."""
    rows = x.float().reshape(-1, x.shape[-1]) if x.dim() > 1 else x.float().reshape(1, -1)
    codes, absmaxes = [], []
    for row in rows:
        blocks, n = _blocks(row, blocksize)
        absmax = blocks.abs().amax(dim=1)
        codes.append(_codes(blocks, torch.where(absmax > 0, absmax, torch.ones_like(absmax)), n, code))
        absmaxes.append(absmax)
    return torch.cat(codes).view(x.shape), torch.cat(absmaxes)


def strided_blocks(x, code, blocksize=256):
    """view(blocksize, -1): block b collects every number_of_blocks-th element, not a contiguous run."""
    flat = x.reshape(-1).float()
    n = flat.numel()
    nb = -(-n // blocksize)
    cols = torch.nn.functional.pad(flat, (0, nb * blocksize - n)).view(blocksize, nb)
    absmax = cols.abs().amax(dim=0)
    scale = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    return nearest_code((cols / scale[None, :]).reshape(-1)[:n], code).view(x.shape), absmax


def linear_codes(x, code, blocksize=256):
    """Lesson 04's linear rounding, round(x / absmax * 127) + 127, instead of the map's nearest entry."""
    blocks, n = _blocks(x, blocksize)
    absmax = blocks.abs().amax(dim=1)
    scaled = (blocks / torch.where(absmax > 0, absmax, torch.ones_like(absmax))[:, None]).reshape(-1)[:n]
    return (torch.round(scaled * 127) + 127).to(torch.uint8).view(x.shape), absmax


def absmax_in_input_dtype(x, code, blocksize=256):
    """No .float(): for a bf16 x the absmax comes back in bf16."""
    flat = x.reshape(-1)
    n = flat.numel()
    nb = -(-n // blocksize)
    blocks = torch.nn.functional.pad(flat, (0, nb * blocksize - n)).view(nb, blocksize)
    absmax = blocks.abs().amax(dim=1)
    codes = _codes(blocks.float(), torch.where(absmax > 0, absmax, torch.ones_like(absmax)).float(), n, code)
    return codes.view(x.shape), absmax


def argmin_codes(x, code, blocksize=256):
    """Right: brute-force nearest entry with argmin (ties go to the first, lower, index)."""
    blocks, n = _blocks(x, blocksize)
    absmax = blocks.abs().amax(dim=1)
    scaled = (blocks / torch.where(absmax > 0, absmax, torch.ones_like(absmax))[:, None]).reshape(-1)[:n]
    return (scaled[:, None] - code[None, :]).abs().argmin(dim=1).to(torch.uint8).reshape(x.shape), absmax


def eps_guard_loop(x, code, blocksize=256):
    """Right: a Python loop over blocks, the zero guard as absmax + 1e-12."""
    flat = x.reshape(-1).float()
    codes, absmax = [], []
    for start in range(0, flat.numel(), blocksize):
        block = flat[start: start + blocksize]
        a = block.abs().max()
        codes.append(nearest_code(block / (a + 1e-12), code))
        absmax.append(a)
    return torch.cat(codes).reshape(x.shape), torch.stack(absmax)


# ------------------------------------------------------------------ 06.2 · dequantize_blockwise
def _block_of(codes, blocksize):
    return torch.arange(codes.numel()) // blocksize


def deq_modulo(codes, absmax, code, blocksize=256):
    i = torch.arange(codes.numel())
    return (code[codes.reshape(-1).long()] * absmax[i % absmax.numel()]).view(codes.shape)


def deq_tiled(codes, absmax, code, blocksize=256):
    """absmax.repeat(blocksize) tiles [a0, a1, a2, a0, a1, …] instead of repeating each entry."""
    return (code[codes.reshape(-1).long()] * absmax.repeat(blocksize)[: codes.numel()]).view(codes.shape)


def deq_codes_as_values(codes, absmax, code, blocksize=256):
    return (codes.reshape(-1).float() * absmax[_block_of(codes, blocksize)]).view(codes.shape)


def deq_no_scale(codes, absmax, code, blocksize=256):
    return code[codes.long()]


def deq_linear(codes, absmax, code, blocksize=256):
    return ((codes.reshape(-1).float() - 127) / 127 * absmax[_block_of(codes, blocksize)]).view(codes.shape)


def deq_divide(codes, absmax, code, blocksize=256):
    return (code[codes.reshape(-1).long()] / absmax[_block_of(codes, blocksize)]).view(codes.shape)


def deq_flat(codes, absmax, code, blocksize=256):
    return code[codes.reshape(-1).long()] * absmax[_block_of(codes, blocksize)]


def deq_uint8_index(codes, absmax, code, blocksize=256):
    """code[codes] with uint8 codes: torch reads a uint8 index as a boolean mask."""
    return (code[codes.reshape(-1)] * absmax[_block_of(codes, blocksize)]).view(codes.shape)


def deq_repeat_untrimmed(codes, absmax, code, blocksize=256):
    """repeat_interleave gives blocks * blocksize scales: one too many blocks' worth for a ragged tail."""
    return (code[codes.reshape(-1).long()] * absmax.repeat_interleave(blocksize)).view(codes.shape)


def deq_repeat_interleave(codes, absmax, code, blocksize=256):
    scales = absmax.repeat_interleave(blocksize)[: codes.numel()]
    return (code.index_select(0, codes.reshape(-1).int()) * scales).reshape(codes.shape)


def deq_padded_blocks(codes, absmax, code, blocksize=256):
    flat = codes.reshape(-1).long()
    n = flat.numel()
    padded = torch.nn.functional.pad(flat, (0, absmax.numel() * blocksize - n), value=127)
    return (code[padded].view(-1, blocksize) * absmax[:, None]).reshape(-1)[:n].reshape(codes.shape)


WRONG = [
    Wrong("06.1", Q, floor_blocks, "n // blocksize blocks, the ragged tail has no absmax of its own",
          "the last, shorter block needs its own absmax", True),
    Wrong("06.1", Q, one_absmax, "one absmax for the whole tensor", "one absmax PER BLOCK, not one for the whole tensor",
          True),
    Wrong("06.1", Q, global_scale_codes, "per-block absmax returned, codes scaled by the whole tensor's max",
          "not by the whole tensor's", True),
    Wrong("06.1", Q, no_zero_guard, "absmax without the zero guard (0/0 in an all-zero block)", "an all-zero block",
          True),
    Wrong("06.1", Q, signed_max, "absmax = max(x) instead of max(|x|)", "max(x), not max(|x|)", True),
    Wrong("06.1", Q, int8_codes, "codes as int8 instead of uint8", "int8 cannot hold codes 128", True),
    Wrong("06.1", Q, flat_codes, "codes returned flat, not in x's shape", "you returned the codes flat", True),
    Wrong("06.1", Q, blocks_per_row, "each row of a matrix cut into blocks of its own", "you cut each ROW into blocks",
          True),
    Wrong("06.1", Q, strided_blocks, "blocks cut with view(blocksize, -1) (strided, not contiguous)",
          "view(blocksize, -1)", True),
    Wrong("06.1", Q, linear_codes, "linear codes round(x/absmax*127)+127 instead of the map", "you rounded linearly",
          True),
    Wrong("06.1", Q, absmax_in_input_dtype, "absmax in the input's dtype (bf16) instead of fp32",
          "absmax is torch.bfloat16", True),
    Wrong("06.2", DQ, deq_modulo, "element i scaled by absmax[i % number_of_blocks]",
          "element i belongs to block i // blocksize (not i % number_of_blocks)", True),
    Wrong("06.2", DQ, deq_tiled, "absmax.repeat(blocksize) (tiles) instead of repeat_interleave",
          "element i belongs to block i // blocksize (not i % number_of_blocks)", True),
    Wrong("06.2", DQ, deq_codes_as_values, "codes multiplied directly, no map lookup", "you multiplied the codes themselves",
          True),
    Wrong("06.2", DQ, deq_no_scale, "map lookup without the absmax", "you forgot the scale", True),
    Wrong("06.2", DQ, deq_linear, "linear dequantization (codes - 127) / 127", "linear dequantization", True),
    Wrong("06.2", DQ, deq_divide, "divided by absmax instead of multiplied", "you divided by absmax", True),
    Wrong("06.2", DQ, deq_flat, "result returned flat", "you returned a flat tensor", True),
    Wrong("06.2", DQ, deq_uint8_index, "map indexed with uint8 codes (a boolean mask in torch)",
          "a uint8 index is a boolean MASK", True),
    Wrong("06.2", DQ, deq_repeat_untrimmed, "repeat_interleave(blocksize) not cut to n for the ragged tail",
          "cut it to codes.numel()", True),
]

RIGHT = [
    Right("06.1", Q, argmin_codes, "nearest entry by brute-force argmin over the map"),
    Right("06.1", Q, eps_guard_loop, "a Python loop over blocks, zero guard as absmax + 1e-12"),
    Right("06.2", DQ, deq_repeat_interleave, "absmax.repeat_interleave(blocksize)[:n] and index_select with int32"),
    Right("06.2", DQ, deq_padded_blocks, "pad the codes to whole blocks, broadcast absmax[:, None], trim"),
]


# ---------------------------------------------------------------- mistakes named by a PROPERTY of the result
from adam8lib.quant import dequantize_blockwise as _dequantize  # noqa: E402
from adam8lib.quant import quantize_blockwise as _quantize  # noqa: E402


def quantize_last_block_by_whole_tensor(x, code, blocksize):
    """The ragged last block is scaled by the whole tensor's absmax."""
    _, absmax = _quantize(x, code, blocksize)
    absmax = absmax.clone()
    flat = x.reshape(-1).float()
    if flat.numel() % blocksize:
        absmax[-1] = flat.abs().max()
    scale = torch.where(absmax > 0, absmax, torch.ones_like(absmax)).repeat_interleave(blocksize)[: flat.numel()]
    return nearest_code(flat / scale, code).view(x.shape), absmax


def quantize_magnitudes(x, code, blocksize):
    return _quantize(x.abs(), code, blocksize)


def dequantize_last_block_with_first_scale(codes, absmax, code, blocksize):
    out = _dequantize(codes, absmax, code, blocksize).clone().reshape(-1)
    n = out.numel()
    if n % blocksize:
        tail = (n // blocksize) * blocksize
        out[tail:] = code[codes.reshape(-1)[tail:].long()] * absmax[0]
    return out.view(codes.shape)


def dequantize_neighbour(codes, absmax, code, blocksize):
    idx = (codes.reshape(-1).long() - 1).clamp(0, 255)
    return (code[idx] * absmax.repeat_interleave(blocksize)[: codes.numel()]).view(codes.shape)


WRONG += [
    Wrong("06.1", Q, quantize_last_block_by_whole_tensor, "the partial last block scaled by the whole tensor's absmax",
          "only the last entry", True),
    Wrong("06.1", Q, quantize_magnitudes, "codes of |x| (the sign dropped)",
          "only the elements where the input is negative are wrong", True),
    Wrong("06.2", DQ, dequantize_last_block_with_first_scale, "the partial last block uses absmax[0]",
          "the partial last block of 232) is wrong", True),
    Wrong("06.2", DQ, dequantize_neighbour, "code[codes - 1]", "NEIGHBOURING map entry", True),
]


def quantize_with_view(x, code, blocksize=256):
    """.view(-1) instead of .reshape(-1): fails on a transposed (non-contiguous) x."""
    flat = x.view(-1).float()
    n = flat.numel()
    n_blocks = -(-n // blocksize)
    padded = torch.zeros(n_blocks * blocksize)
    padded[:n] = flat
    blocks = padded.view(n_blocks, blocksize)
    absmax = blocks.abs().amax(dim=1)
    scale = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    codes = nearest_code((blocks / scale[:, None]).reshape(-1)[:n], code)
    return codes.view(x.shape), absmax


def quantize_column_major(x, code, blocksize=256):
    """flattens a transposed x in memory order (x.t().reshape) instead of row-major: codes land on the wrong elements."""
    flat = (x.t().reshape(-1) if x.dim() == 2 and not x.is_contiguous() else x.reshape(-1)).float()
    n = flat.numel()
    n_blocks = -(-n // blocksize)
    padded = torch.zeros(n_blocks * blocksize)
    padded[:n] = flat
    blocks = padded.view(n_blocks, blocksize)
    absmax = blocks.abs().amax(dim=1)
    scale = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    codes = nearest_code((blocks / scale[:, None]).reshape(-1)[:n], code)
    return codes.view(x.shape), absmax


WRONG += [
    Wrong("06.1", Q, quantize_with_view, "x.view(-1) on a non-contiguous (transposed) x", "`.view` needs memory", True),
    Wrong("06.1", Q, quantize_column_major, "a transposed x flattened in memory (column) order",
          "transposed", False),
]
