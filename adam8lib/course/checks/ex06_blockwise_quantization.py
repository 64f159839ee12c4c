"""Checks for workbook 06 · blockwise quantization (one absmax per block, ragged tail, zero blocks)."""

from __future__ import annotations

import torch

from ...quant import dequantize_blockwise, dynamic_map, nearest_code, num_blocks, quantize_blockwise
from ._common import assert_close, call, fail, passed, refail, require_callable
from ._properties import describe
from ._variants import expect_close, matches

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
        ("a transposed (100, 3) matrix (not contiguous), blocksize 64", torch.randn(3, 100, generator=gen).t(),
         smap, 64),
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
        try:
            got = call(quantize_blockwise_fn, x.clone(), code.clone(), bs)
        except AssertionError as err:
            if x.numel() % bs and any(k in str(err) for k in ("is invalid for input of size", "must match the size")):
                refail(err, hint=f"{x.numel()} values are not a whole number of blocks of {bs}: the last block is "
                                 "short. Pad the flat tensor with zeros up to a whole number of blocks before you cut "
                                 "it into blocks (a zero never changes a block's absmax), and drop the padding from "
                                 "the codes afterwards.")
            raise
        what = f"quantize_blockwise({label})"
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(f"{what} returned {type(got).__name__}, expected a pair (codes, absmax).", hint="return codes, absmax")
        codes, absmax = got
        n, nb = x.numel(), num_blocks(x.numel(), bs)
        if not isinstance(absmax, torch.Tensor):
            fail(f"{what}: absmax is {type(absmax).__name__}, expected a tensor.", hint="one fp32 absmax per block")
        if absmax.numel() != nb:
            rows_blocks = x.numel() // x.shape[-1] * num_blocks(x.shape[-1], bs) if x.dim() > 1 else None
            if absmax.numel() == n // bs:
                hint = ("you made n // blocksize blocks, so the ragged tail has none: the last, shorter block needs "
                        "its own absmax — ceil(n / blocksize) blocks (pad the tail with zeros).")
            elif absmax.numel() == 1:
                hint = "one absmax PER BLOCK, not one for the whole tensor (that is lesson 04's scheme)."
            elif absmax.numel() == rows_blocks:
                hint = ("you cut each ROW into blocks: flatten x first (x.reshape(-1)) and cut the flat tensor, "
                        "so a block may span the end of one row and the start of the next.")
            else:
                hint = "absmax has one entry per block of the FLAT tensor: ceil(x.numel() / blocksize)."
            fail(f"{what}: absmax has {absmax.numel()} entries, expected {nb}.", hint=hint)
        flat = torch.nn.functional.pad(x.reshape(-1).float(), (0, nb * bs - n)).view(nb, bs)
        if absmax.dtype != torch.float32:
            fail(f"{what}: absmax is {absmax.dtype}, expected torch.float32.",
                 hint=f"absmax is {absmax.dtype} because it was computed in x's dtype: work on x.float() (or "
                      "return absmax.float()) — absmax is float32 whatever the input's dtype.")
        strided = torch.nn.functional.pad(x.reshape(-1).float(), (0, nb * bs - n)).view(bs, nb)
        expect_close(absmax.reshape(-1), want_absmax, what=f"{what}: absmax", dtype=torch.float32,
                     default="absmax[b] = max |x| over block b (elements b*blocksize ... (b+1)*blocksize - 1).",
                     variants=[("you took max(x), not max(|x|): absmax is the largest MAGNITUDE (x.abs().amax).",
                                lambda: flat.amax(dim=1)),
                               ("you cut the blocks with view(blocksize, -1), so block b collects every "
                                "number_of_blocks-th element: a block is a CONTIGUOUS run, view(-1, blocksize).",
                                lambda: strided.abs().amax(dim=0))])
        if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
            got_dtype = getattr(codes, "dtype", type(codes).__name__)
            hint = "codes are uint8 indices into the map (.to(torch.uint8))."
            if got_dtype == torch.int8:
                hint = ("int8 cannot hold codes 128 … 255 (they wrap to -128 … -1): the codes are indices into the "
                        "256-entry map, so store them as torch.uint8.")
            fail(f"{what}: codes have dtype {got_dtype}, expected torch.uint8.", hint=hint)
        if codes.shape != x.shape:
            hint = "give the codes the shape of x (codes.view(x.shape))."
            if codes.numel() == x.numel() and codes.dim() == 1:
                hint = "you returned the codes flat: give them the shape of x (codes.view(x.shape))."
            fail(f"{what}: codes have shape {tuple(codes.shape)}, expected {tuple(x.shape)}.", hint=hint)
        if not _codes_close(codes, want_codes):
            zero_blocks = (want_absmax == 0).nonzero().reshape(-1)
            hint = "code = nearest map entry to x / absmax of the element's own block."
            scale = torch.where(want_absmax > 0, want_absmax, torch.ones_like(want_absmax))
            normalized = (flat / scale[:, None]).reshape(-1)[:n]
            linear = (torch.round(normalized * 127) + 127).clamp(0, 255).to(torch.uint8)
            if _codes_close(codes.reshape(-1), linear):
                hint = ("you rounded linearly (round(x / absmax * 127) + 127, lesson 04): the code is the index of "
                        "the NEAREST ENTRY of the map `code` (nearest_code(x / absmax, code)).")
            if len(zero_blocks):
                b = int(zero_blocks[0])
                sl = slice(b * bs, min((b + 1) * bs, n))
                if not torch.equal(codes.reshape(-1)[sl], want_codes.reshape(-1)[sl]):
                    hint = (f"an all-zero block (block {b}): its absmax is 0, so x / absmax is 0/0 = NaN. Store the "
                            "code of 0.0 there (divide by 1 instead, or use torch.where).")
            scale_global = nearest_code(x.reshape(-1).float() / x.float().abs().max(), code)
            if torch.equal(codes.reshape(-1), scale_global):
                hint = "normalize each element by ITS block's absmax, not by the whole tensor's."
            if hint.startswith("code = nearest map entry"):
                found = describe(codes.reshape(-1).long(), want_codes.reshape(-1).long(), x=x.reshape(-1).float(),
                                 blocksize=bs, rtol=0, atol=0)
                hint = f"the codes: {found}. The rule: {hint}" if found else hint
            assert_close(codes, want_codes, what=f"{what}: codes", hint=hint, rtol=0, atol=0)
    passed("Exercise 06.1 · Blockwise quantization")


# ---------------------------------------------------------------------------- 06.2
def check_dequantize_blockwise(dequantize_blockwise_fn) -> None:
    """``dequantize_blockwise(codes, absmax, code, blocksize) -> fp32 shaped like codes``."""
    require_callable(dequantize_blockwise_fn, "dequantize_blockwise")
    for label, x, code, bs in _cases():
        codes, absmax = quantize_blockwise(x, code, bs)
        want = dequantize_blockwise(codes, absmax, code, bs)
        what = f"dequantize_blockwise({label})"
        n = codes.numel()
        try:
            got = call(dequantize_blockwise_fn, codes.clone(), absmax.clone(), code.clone(), bs)
        except AssertionError as err:
            text = str(err)
            if "shape of the mask" in text:
                refail(err, hint="index the map with codes.long(): a uint8 index is a boolean MASK in torch "
                                "(code[codes] with uint8 codes selects by True/False, it does not look up).")
            if "must match the size" in text and n % bs:
                refail(err, hint="the last block is short: absmax.repeat_interleave(blocksize) has blocks * blocksize "
                                "entries, more than the codes — cut it to codes.numel() ([:n]).")
            raise
        idx = torch.arange(n)
        values = code[codes.reshape(-1).long()]

        def shaped(flat):
            return flat.view(codes.shape)

        if isinstance(got, torch.Tensor) and got.dim() == 1 and codes.dim() > 1 and got.numel() == n \
                and matches(got.view(codes.shape), want, rtol=1e-6, atol=0):
            fail(f"{what} has shape {tuple(got.shape)}, expected {tuple(codes.shape)}.",
                 hint="you returned a flat tensor: give it the shape of codes (.view(codes.shape)).")
        expect_close(got, want, what=what, dtype=torch.float32, rtol=1e-6, atol=0, x=x, blocksize=bs,
                     default="x[i] = code[codes[i]] * absmax[i // blocksize], in the shape of codes.",
                     variants=[
                         ("element i belongs to block i // blocksize (not i % number_of_blocks): use "
                          "absmax.repeat_interleave(blocksize) or absmax[i // blocksize], not absmax.repeat.",
                          lambda: shaped(values * absmax[idx % absmax.numel()])),
                         ("you multiplied the codes themselves: look them up in the map first, code[codes.long()] "
                          "(the codes are indices 0…255, not values).",
                          lambda: shaped(codes.reshape(-1).float() * absmax[idx // bs])),
                         ("you forgot the scale: code[codes] is the normalized value in [-1, 1]; multiply by the "
                          "block's absmax.",
                          lambda: shaped(values)),
                         ("you divided by absmax: quantizing divided x by absmax, so dequantizing multiplies.",
                          lambda: shaped(values / absmax[idx // bs])),
                         ("you looked up the NEIGHBOURING map entry (code[codes - 1]): the code is the index itself, "
                          "code[codes.long()] — no shift by one.",
                          lambda: shaped(code[(codes.reshape(-1).long() - 1).clamp(0, 255)] * absmax[idx // bs])),
                         ("you looked up the NEIGHBOURING map entry (code[codes + 1]): the code is the index itself, "
                          "code[codes.long()] — no shift by one.",
                          lambda: shaped(code[(codes.reshape(-1).long() + 1).clamp(0, 255)] * absmax[idx // bs])),
                         ("that is linear dequantization ((codes - 127) / 127, lesson 04): look the codes up in the "
                          "map, code[codes], then multiply by the block's absmax.",
                          lambda: shaped((codes.reshape(-1).float() - 127) / 127 * absmax[idx // bs])),
                     ])
    passed("Exercise 06.2 · Blockwise dequantization")
