"""The whole tensor's blocks on a slice of it (adam8lib.global_blocks, MomentFormat.quantize's ``lead`` and
``reduce_blocks``), in one process: what each FSDP2 shard of the optimizer family computes (the 2- and 3-rank
runs are in tests/test_family_distributed.py)."""

from __future__ import annotations

import pytest
import torch

from adam8lib.distributed import shard_ranges
from adam8lib.formats import FORMATS, unpack_nibbles
from adam8lib.global_blocks import shard_scales_numel, straddles

MOMENTS = {f"{name}.{which}": getattr(fmt, which) for name, fmt in FORMATS.items() for which in ("m", "v")}


@pytest.mark.parametrize("key", [k for k, m in MOMENTS.items() if not m.rank1])
@pytest.mark.parametrize("n,a,b", [(4500, 2300, 4500), (4500, 0, 2300), (300, 120, 240), (1000, 256, 768),
                                   (1000, 1000, 1000)])
def test_a_slice_with_its_lead_and_whole_block_maxima_codes_as_the_whole_tensor(key, n, a, b):
    """Quantizing x[a:b] with ``lead = a mod B`` and, as ``reduce_blocks``, the whole tensor's maxima of the blocks
    it touches gives the whole tensor's codes of [a, b) and scales of those blocks; dequantize inverts it."""
    moment = MOMENTS[key]
    B = moment.blocksize
    x = torch.randn(n, generator=torch.Generator().manual_seed(n + a)) * torch.logspace(-3, 1, n)
    if key.endswith(".v"):  # never negative
        x = x.abs()
    codes, scales = moment.quantize(x, (n,))
    whole = unpack_nibbles(codes, n) if moment.bits == 4 else codes
    first, stop = a // B, -(-b // B)
    calls = []

    def reduce(local):
        calls.append(local.clone())
        return scales[first:stop] if b > a else local

    got_codes, got_scales = moment.quantize(x[a:b], (b - a,), lead=a % B, reduce_blocks=reduce)
    assert len(calls) == 1  # once, an empty slice included (its part of the collective)
    got = unpack_nibbles(got_codes, b - a) if moment.bits == 4 else got_codes
    assert torch.equal(got, whole[a:b])
    assert torch.equal(got_scales, scales[first:stop] if b > a else scales[:0])
    assert got_scales.numel() == shard_scales_numel(moment, (n,), (b - a,), a % B)
    if b > a:  # the local maxima: the same as the whole's except for the cut blocks
        assert torch.equal(calls[0][1:-1], scales[first + 1: stop - 1])
        back = moment.dequantize(got_codes, got_scales, (b - a,), lead=a % B)
        assert torch.equal(back, moment.dequantize(codes, scales, (n,))[a:b])


def test_straddles_names_the_layouts_whose_boundaries_cut_a_block():
    assert straddles((45, 100), 2, 256) and straddles((45, 100), 2, 128)  # 2300
    assert not straddles((64, 128), 2, 256)  # 4096
    assert not straddles((1, 4500), 2, 256)  # one shard holds everything
    assert straddles((5, 60), 3, 256) and [r for r in shard_ranges((5, 60), 3)] == [(0, 120), (120, 240), (240, 300)]


def test_rank1_moments_keep_the_local_rows_and_every_column():
    v = FORMATS["4bit"].v
    assert shard_scales_numel(v, (45, 100), (23, 100), 0) == 123
    assert shard_scales_numel(v, (45, 100), (0, 100), 0) == 0  # an empty shard
    assert shard_scales_numel(v, (4500,), (2200,), 252) == -(-(252 + 2200) // 128)  # a vector: blocks
