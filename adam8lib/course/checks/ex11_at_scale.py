"""Checks for workbook 11 · 8-bit Adam at scale (per-rank memory, FSDP2 shards, local 8-bit states)."""

from __future__ import annotations

import math

from ...distributed import shard_ranges
from ..at_scale import estimate
from ._common import call, fail, passed, require_callable
from ._variants import expect_close

__all__ = ["check_per_rank_bytes", "check_shard_range", "check_local_state_bytes"]


# ---------------------------------------------------------------------------- 11.1
def _bytes_variant(n, w, strategy, optimizer, bs, *, zero_shards_all=False, ddp_shards=False, absmax=True,
                   floor=False):
    shard = n // w if floor else -(-n // w)
    states_n = n if strategy == "ddp" and not ddp_shards else shard
    states = 8 * states_n if optimizer == "adamw" else 2 * states_n + (8 * (-(-states_n // bs)) if absmax else 0)
    sharded = strategy == "fsdp2" or (strategy == "zero1" and zero_shards_all) or (strategy == "ddp" and ddp_shards)
    weights = 4 * shard if sharded else 4 * n
    return {"weights": weights, "gradients": weights, "states": states}


def check_per_rank_bytes(per_rank_bytes) -> None:
    """``per_rank_bytes(num_params, world_size, strategy, optimizer, blocksize=256)`` -> bytes per rank."""
    require_callable(per_rank_bytes, "per_rank_bytes")
    cases = [(7_000_000_000, 8, s, o, 256) for s in ("ddp", "zero1", "fsdp2") for o in ("adamw", "adam8bit")]
    cases += [(1_000_003, 2, "fsdp2", "adam8bit", 256), (1_000_003, 3, "zero1", "adam8bit", 64),
              (4096, 1, "fsdp2", "adam8bit", 256), (70_000_000_000, 8, "fsdp2", "adam8bit", 2048)]
    for n, w, strategy, optimizer, bs in cases:
        want = estimate(n, w, strategy, optimizer, bs)
        got = call(per_rank_bytes, n, w, strategy, optimizer, blocksize=bs)
        what = f"per_rank_bytes({n:,}, {w}, {strategy!r}, {optimizer!r}, blocksize={bs})"
        if not isinstance(got, dict):
            fail(f"{what} returned {type(got).__name__}, expected a dict.",
                 hint="return {'weights': ..., 'gradients': ..., 'states': ...} in bytes")
        expect_close(got, want, what=what, rtol=0, atol=0,
                     default="fp32 weights and gradients (4 bytes each); states 8 bytes/param (adamw) or 2 bytes/param "
                             "+ 8 per block (adam8bit). DDP shards nothing, ZeRO-1 only the states, FSDP2 everything; "
                             "a shard holds ceil(n / world_size) parameters.",
                     variants=[
                         ("ZeRO-1 shards only the optimizer states: every rank still holds all weights and gradients.",
                          lambda: _bytes_variant(n, w, strategy, optimizer, bs, zero_shards_all=True)),
                         ("under DDP every rank holds everything: the full weights, gradients and states.",
                          lambda: _bytes_variant(n, w, strategy, optimizer, bs, ddp_shards=True)),
                         ("you forgot the absmax: 2 fp32 scales (8 bytes) per block of the rank's states.",
                          lambda: _bytes_variant(n, w, strategy, optimizer, bs, absmax=False)),
                         ("the largest rank holds ceil(n / world_size) parameters, not n // world_size.",
                          lambda: _bytes_variant(n, w, strategy, optimizer, bs, floor=True)),
                     ])
    passed("Exercise 11.1 · Per-rank memory")


# ---------------------------------------------------------------------------- 11.2
def _range_variant(shape, w, r, kind):
    n = math.prod(shape)
    if kind == "elements":  # chunks of the flat tensor
        per = -(-n // w)
        return (min(r * per, n), min((r + 1) * per, n))
    rows, row = shape[0], math.prod(shape[1:])
    per = rows // w  # floor: the remainder goes to the last rank
    start = r * per
    stop = rows if r == w - 1 else (r + 1) * per
    return (start * row, stop * row)


def check_shard_range(shard_range) -> None:
    """``shard_range(shape, world_size, rank)`` -> flat (start, stop) of the rank's FSDP2 shard."""
    require_callable(shard_range, "shard_range")
    cases = [((512, 256), 2), ((33, 128), 2), ((5, 3), 4), ((1, 4096), 2), ((7,), 3), ((10, 4, 2), 3), ((8, 8), 1)]
    for shape, w in cases:
        for r in range(w):
            want = shard_ranges(shape, w)[r]
            got = call(shard_range, shape, w, r)
            if isinstance(got, list):
                got = tuple(got)
            expect_close(got, want, what=f"shard_range({shape}, world_size={w}, rank={r})", rtol=0, atol=0,
                         default="rank r holds rows [r*c, (r+1)*c) of dim 0, c = ceil(rows / world_size), clipped to "
                                 "the row count; multiply by the elements per row for flat positions.",
                         variants=[
                             ("FSDP2 splits dim 0 (whole rows), not the flat elements: chunk the rows, then multiply "
                              "by the row length.", lambda: _range_variant(shape, w, r, "elements")),
                             ("torch.chunk gives every rank ceil(rows / world_size) rows (the last ones fewer, maybe "
                              "none), not rows // world_size with the remainder on the last rank.",
                              lambda: _range_variant(shape, w, r, "floor")),
                         ])
    passed("Exercise 11.2 · FSDP2 shards")


# ---------------------------------------------------------------------------- 11.3
def _local_bytes(shape, w, r, min_size, bs, *, by_local=False, global_blocks=False):
    start, stop = shard_ranges(shape, w)[r]
    n_local, n_full = stop - start, math.prod(shape)
    eight = (n_local if by_local else n_full) >= min_size
    if not eight:
        return 8 * n_local
    blocks = (-(-stop // bs) - start // bs) if (global_blocks and n_local) else -(-n_local // bs)
    return 2 * n_local + 8 * blocks


def check_local_state_bytes(local_state_bytes) -> None:
    """``local_state_bytes(shape, world_size, rank, min_8bit_size=4096, blocksize=256)`` -> bytes on this rank."""
    require_callable(local_state_bytes, "local_state_bytes")
    cases = [((512, 256), 2, 4096, 256), ((33, 128), 2, 4096, 256), ((1, 4096), 2, 4096, 256),
             ((100, 30), 3, 4096, 256), ((33, 128), 4, 4096, 64), ((64,), 2, 4096, 256), ((3, 1000), 2, 0, 256)]
    for shape, w, min_size, bs in cases:
        for r in range(w):
            want = _local_bytes(shape, w, r, min_size, bs)
            got = call(local_state_bytes, shape, w, r, min_8bit_size=min_size, blocksize=bs)
            expect_close(got, want, rtol=0, atol=0,
                         what=f"local_state_bytes({shape}, world_size={w}, rank={r}, min_8bit_size={min_size}, "
                              f"blocksize={bs})",
                         default="8-bit when the FULL parameter has >= min_8bit_size elements: 2 bytes per local "
                                 "element + 8 per local block (ceil(local / blocksize)); else 8 bytes per local element.",
                         variants=[
                             ("decide 8-bit or fp32 by the FULL parameter's size, not the shard's: sharding must never "
                              "change which states are 8-bit.", lambda: _local_bytes(shape, w, r, min_size, bs,
                                                                                    by_local=True)),
                             ("blocks are local to the shard: the rank splits its own elements into "
                              "ceil(local / blocksize) blocks from its first element, whatever the single-process "
                              "blocks were.", lambda: _local_bytes(shape, w, r, min_size, bs, global_blocks=True)),
                         ])
    passed("Exercise 11.3 · 8-bit states of a shard")
