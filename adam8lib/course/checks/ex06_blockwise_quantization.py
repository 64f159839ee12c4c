"""Checks for workbook 06 · blockwise quantization (one absmax per block, ragged tail, zero blocks)."""

from __future__ import annotations

import torch

from ...quant import dequantize_blockwise, dynamic_map, nearest_code, num_blocks, quantize_blockwise
from ._common import assert_close, call, fail, passed, require_callable
from ._variants import expect_close

__all__ = ["check_quantize_blockwise", "check_dequantize_blockwise"]


def _cases():
    gen = torch.Generator().manual_seed(6)
    smap, umap = dynamic_map(True), dynamic_map(False)
    zero_mid = torch.randn(768, generator=gen)
    zero_mid[256:512] = 0.0  # the middle block is all zeros
    outlier = torch.randn(1024, generator=gen) * 1e-3
    outlier[5] = 100.0  # one outlier only hurts its own block
    return [
        ("1000 values, blocksize 256 (a ragged tail of 232)", torch.randn(1000, generator=gen), smap, 256),
        ("exactly one block of 256", torch.randn(256, generator=gen), smap, 256),
        ("5 values, blocksize 256 (one short block)", torch.randn(5, generator=gen), smap, 256),
        ("a (3, 100) matrix, blocksize 64", torch.randn(3, 100, generator=gen), smap, 64),
        ("768 values whose middle block is all zeros", zero_mid, smap, 256),
        ("1024 small values and one outlier", outlier, smap, 256),
        ("5000 values, blocksize 2048", torch.randn(5000, generator=gen), smap, 2048),
        ("600 non-negative values with the unsigned map", torch.rand(600, generator=gen) ** 4, umap, 128),
        ("bfloat16 input", torch.randn(300, generator=gen).to(torch.bfloat16), smap, 64),
    ]


def _codes_close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Same codes up to rare neighbours (x / absmax and x * (1 / absmax) round differently)."""
    diff = (got.reshape(-1).long() - want.reshape(-1).long()).abs()
    return bool(diff.numel() == 0 or (diff.max() <= 1 and int((diff > 0).sum()) <= max(1, diff.numel() // 200)))


# ---------------------------------------------------------------------------- 06.1
def check_quantize_blockwise(quantize_blockwise_fn) -> None:
    """``quantize_blockwise(x, code, blocksize) -> (codes uint8 shaped like x, absmax fp32 per block)``."""
    require_callable(quantize_blockwise_fn, "quantize_blockwise")
    for label, x, code, bs in _cases():
        want_codes, want_absmax = quantize_blockwise(x, code, bs)
        got = call(quantize_blockwise_fn, x.clone(), code.clone(), bs)
        what = f"quantize_blockwise({label})"
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(f"{what} returned {type(got).__name__}, expected a pair (codes, absmax).", hint="return codes, absmax")
        codes, absmax = got
        n, nb = x.numel(), num_blocks(x.numel(), bs)
        if not isinstance(absmax, torch.Tensor):
            fail(f"{what}: absmax is {type(absmax).__name__}, expected a tensor.", hint="one fp32 absmax per block")
        if absmax.numel() != nb:
            if absmax.numel() == n // bs:
                hint = ("wrong block count for a ragged tail: the last, shorter block needs its own absmax — "
                        "ceil(n / blocksize) blocks (pad the tail with zeros).")
            elif absmax.numel() == 1:
                hint = "one absmax PER BLOCK, not one for the whole tensor."
            else:
                hint = "absmax has one entry per block of the FLAT tensor: ceil(x.numel() / blocksize)."
            fail(f"{what}: absmax has {absmax.numel()} entries, expected {nb}.", hint=hint)
        flat = torch.nn.functional.pad(x.reshape(-1).float(), (0, nb * bs - n)).view(nb, bs)
        expect_close(absmax.reshape(-1), want_absmax, what=f"{what}: absmax", dtype=torch.float32,
                     default="absmax[b] = max |x| over block b (elements b*blocksize ... (b+1)*blocksize - 1).",
                     variants=[("absmax is the largest MAGNITUDE: max(|x|), not max(x).",
                                lambda: flat.amax(dim=1))])
        if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
            fail(f"{what}: codes have dtype {getattr(codes, 'dtype', type(codes).__name__)}, expected torch.uint8.",
                 hint="codes are uint8 indices into the map (.to(torch.uint8)).")
        if codes.shape != x.shape:
            fail(f"{what}: codes have shape {tuple(codes.shape)}, expected {tuple(x.shape)}.",
                 hint="give the codes the shape of x (codes.view(x.shape)).")
        if not _codes_close(codes, want_codes):
            zero_blocks = (want_absmax == 0).nonzero().reshape(-1)
            hint = "code = nearest map entry to x / absmax of the element's own block."
            if len(zero_blocks):
                b = int(zero_blocks[0])
                sl = slice(b * bs, min((b + 1) * bs, n))
                if not torch.equal(codes.reshape(-1)[sl], want_codes.reshape(-1)[sl]):
                    hint = (f"an all-zero block (block {b}): its absmax is 0, so x / absmax is 0/0 = NaN. Store the "
                            "code of 0.0 there (divide by 1 instead, or use torch.where).")
            scale_global = nearest_code(x.reshape(-1).float() / x.float().abs().max(), code)
            if torch.equal(codes.reshape(-1), scale_global):
                hint = "normalize each element by ITS block's absmax, not by the whole tensor's."
            assert_close(codes, want_codes, what=f"{what}: codes", hint=hint, rtol=0, atol=0)
    passed("Exercise 06.1 · Blockwise quantization")


# ---------------------------------------------------------------------------- 06.2
def check_dequantize_blockwise(dequantize_blockwise_fn) -> None:
    """``dequantize_blockwise(codes, absmax, code, blocksize) -> fp32 shaped like codes``."""
    require_callable(dequantize_blockwise_fn, "dequantize_blockwise")
    for label, x, code, bs in _cases():
        codes, absmax = quantize_blockwise(x, code, bs)
        want = dequantize_blockwise(codes, absmax, code, bs)
        got = call(dequantize_blockwise_fn, codes.clone(), absmax.clone(), code.clone(), bs)
        what = f"dequantize_blockwise({label})"
        n = codes.numel()
        idx = torch.arange(n)
        values = code[codes.reshape(-1).long()]

        def shaped(flat):
            return flat.view(codes.shape)

        expect_close(got, want, what=what, dtype=torch.float32, rtol=1e-6, atol=0,
                     default="x[i] = code[codes[i]] * absmax[i // blocksize], in the shape of codes.",
                     variants=[
                         ("element i belongs to block i // blocksize (not i % number_of_blocks).",
                          lambda: shaped(values * absmax[idx % absmax.numel()])),
                         ("look the codes up in the map first: code[codes] (the codes are indices, not values).",
                          lambda: shaped(codes.reshape(-1).float() * absmax[idx // bs])),
                         ("multiply by the block's absmax: code[codes] is the normalized value only.",
                          lambda: shaped(values)),
                         ("look up code[codes] and multiply: linear dequantization (codes / 127) is lesson 04's "
                          "scheme, not the map.",
                          lambda: shaped((codes.reshape(-1).float() - 127) / 127 * absmax[idx // bs])),
                     ])
    passed("Exercise 06.2 · Blockwise dequantization")
