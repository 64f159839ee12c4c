"""Checks for workbook 11 · 8-bit Adam at scale (per-rank memory, FSDP2 shards, local 8-bit states)."""

from __future__ import annotations

import math

from ...distributed import shard_ranges
from ..at_scale import estimate
from ._common import require_type, call, fail, passed, require_callable
from ._properties import case_pattern
from ._variants import expect_close, matches

__all__ = ["check_per_rank_bytes", "check_shard_range", "check_local_state_bytes"]


def _answers(fn, calls) -> list:
    """The learner's answers to every call (None where it raised: the main loop reports that)."""
    out = []
    for args, kwargs in calls:
        try:
            out.append(fn(*args, **kwargs))
        except Exception:  # noqa: BLE001
            out.append(None)
    return out


def _pattern(fn, calls, wants, tags) -> str | None:
    got = _answers(fn, calls)
    return case_pattern([(t, g is not None and matches(tuple(g) if isinstance(g, list) else g, w, rtol=0, atol=0))
                         for g, w, t in zip(got, wants, tags)])


# ---------------------------------------------------------------------------- 11.1
def _bytes_variant(n, w, strategy, optimizer, bs, *, zero_shards_all=False, ddp_shards=False, absmax=8,
                   floor=False, fsdp_full_weights=False, zero_full_states=False, code_bytes=2, block_round="ceil",
                   blocks_of_all=False, adamw_bytes=8, true_div=False, unit=1):
    shard = n / w if true_div else n // w if floor else -(-n // w)
    states_n = n if (strategy == "ddp" and not ddp_shards) or (strategy == "zero1" and zero_full_states) else shard
    block_n = n if blocks_of_all else states_n
    blocks = block_n // bs if block_round == "floor" else -(-block_n // bs)
    states = adamw_bytes * states_n if optimizer == "adamw" else code_bytes * states_n + absmax * blocks
    sharded = (strategy == "fsdp2" and not fsdp_full_weights) or (strategy == "zero1" and zero_shards_all) \
        or (strategy == "ddp" and ddp_shards)
    weights = 4 * shard if sharded else 4 * n
    return {"weights": weights / unit, "gradients": weights / unit, "states": states / unit}


def check_per_rank_bytes(per_rank_bytes) -> None:
    """``per_rank_bytes(num_params, world_size, strategy, optimizer, blocksize=256)`` -> bytes per rank."""
    require_callable(per_rank_bytes, "per_rank_bytes")
    cases = [(7_000_000_000, 8, s, o, 256) for s in ("ddp", "zero1", "fsdp2") for o in ("adamw", "adam8bit")]
    cases += [(1_000_003, 2, "fsdp2", "adam8bit", 256), (1_000_003, 3, "zero1", "adam8bit", 64),
              (4096, 1, "fsdp2", "adam8bit", 256), (70_000_000_000, 8, "fsdp2", "adam8bit", 2048)]
    pattern = _pattern(per_rank_bytes, [((n, w, s, o), {"blocksize": bs}) for n, w, s, o, bs in cases],
                       [estimate(*c) for c in cases],
                       [[f"with strategy={s!r}", f"with optimizer={o!r}", f"with {s!r} and {o!r}",
                         "where world_size does not divide num_params" if n % w else "where world_size divides num_params",
                         "with world_size=1" if w == 1 else "with several ranks",
                         f"with blocksize={bs}"] for n, w, s, o, bs in cases])
    for n, w, strategy, optimizer, bs in cases:
        want = estimate(n, w, strategy, optimizer, bs)
        got = call(per_rank_bytes, n, w, strategy, optimizer, blocksize=bs)
        what = f"per_rank_bytes({n:,}, {w}, {strategy!r}, {optimizer!r}, blocksize={bs})"
        if not isinstance(got, dict):
            fail(f"{what} returned {type(got).__name__}, expected a dict.",
                 hint="return {'weights': ..., 'gradients': ..., 'states': ...} in bytes")

        def variant(**mistake):
            return lambda: _bytes_variant(n, w, strategy, optimizer, bs, **mistake)

        expect_close(got, want, what=what, rtol=0, atol=0, context=pattern,
                     default="fp32 weights and gradients (4 bytes each); states 8 bytes/param (adamw) or 2 bytes/param "
                             "+ 8 per block (adam8bit). DDP shards nothing, ZeRO-1 only the states, FSDP2 everything; "
                             "a shard holds ceil(n / world_size) parameters.",
                     variants=[
                         ("ZeRO-1 shards only the optimizer states: every rank still holds all weights and gradients.",
                          variant(zero_shards_all=True)),
                         ("under DDP every rank holds everything: the full weights, gradients and states.",
                          variant(ddp_shards=True)),
                         ("the optimizer states are not divided by the world size: ZeRO-1 (and FSDP2) give each rank "
                          "the states of its shard only, ceil(n / world_size) parameters.",
                          variant(zero_full_states=True)),
                         ("the weights and gradients are not divided by the world size: FSDP2 shards them too, each "
                          "rank holds 4 bytes × ceil(n / world_size) of each.", variant(fsdp_full_weights=True)),
                         ("you forgot the absmax: 2 fp32 scales (8 bytes) per block of the rank's states.",
                          variant(absmax=0)),
                         ("you counted one absmax (4 bytes) per block; there are two, one for m and one for v: "
                          "8 bytes per block.", variant(absmax=4)),
                         ("you counted 1 byte per parameter for the 8-bit states; Adam keeps two (m and v): 2 bytes.",
                          variant(code_bytes=1)),
                         ("you counted 1 byte per parameter and one absmax: Adam has two 8-bit states (m and v), "
                          "each with its own absmax per block — 2 bytes per parameter + 8 per block.",
                          variant(code_bytes=1, absmax=4)),
                         ("you rounded the number of blocks down: a last, partial block has its absmax too — "
                          "ceil(k / blocksize) blocks.", variant(block_round="floor")),
                         ("you counted the blocks of all n parameters; the rank only keeps absmax for the blocks of "
                          "its own k parameters: ceil(k / blocksize).", variant(blocks_of_all=True)),
                         ("AdamW keeps two fp32 states (m and v): 8 bytes per parameter, not 4.",
                          variant(adamw_bytes=4)),
                         ("AdamW's states are m and v, 8 bytes per parameter: the weights (and gradients) are "
                          "counted separately, not in 'states'.", variant(adamw_bytes=12)),
                         ("AdamW's states are m and v, 8 bytes per parameter: the weights (and gradients) are "
                          "counted separately, not in 'states'.", variant(adamw_bytes=16)),
                         ("the largest rank holds ceil(n / world_size) parameters, not n // world_size.",
                          variant(floor=True)),
                         ("n / world_size is not a whole number of parameters: the largest rank holds "
                          "ceil(n / world_size), -(-n // world_size) in integers.", variant(true_div=True)),
                         ("return bytes, not MiB: do not divide by 2**20.", variant(unit=2**20)),
                         ("return bytes, not MB/GB: do not divide by 1e6 or 1e9.", variant(unit=10**6)),
                         ("return bytes, not MB/GB: do not divide by 1e6 or 1e9.", variant(unit=10**9)),
                         ("return bytes, not GiB: do not divide by 2**30.", variant(unit=2**30)),
                     ])
    passed("Exercise 11.1 · Per-rank memory")


# ---------------------------------------------------------------------------- 11.2
def _range_variant(shape, w, r, kind):
    n = math.prod(shape)
    if kind == "elements":  # chunks of the flat tensor
        per = -(-n // w)
        return (min(r * per, n), min((r + 1) * per, n))
    rows, row = shape[0], math.prod(shape[1:])
    per = -(-rows // w)
    if kind == "floor":  # floor: the remainder goes to the last rank
        per = rows // w
        return (r * per * row, (rows if r == w - 1 else (r + 1) * per) * row)
    if kind == "floor-dropped":  # floor, the remainder rows belong to nobody
        per = rows // w
        return (r * per * row, (r + 1) * per * row)
    if kind == "unclipped":
        return (r * per * row, (r + 1) * per * row)
    if kind == "stop-clipped":
        return (r * per * row, min((r + 1) * per, rows) * row)
    if kind == "rows":
        return (min(r * per, rows), min((r + 1) * per, rows))
    if kind == "inclusive":
        return (min(r * per, rows) * row, min((r + 1) * per, rows) * row - 1)
    if kind == "array_split":  # numpy.array_split: the first rows % w ranks get one row more
        base, extra = divmod(rows, w)
        start = r * base + min(r, extra)
        return (start * row, (start + base + (r < extra)) * row)
    if kind == "second-dim":  # elements per row = shape[1] only
        row = shape[1] if len(shape) > 1 else 1
        return (min(r * per, rows) * row, min((r + 1) * per, rows) * row)
    if kind == "ceil-plus-one":  # (rows + w) // w: one too many when w divides rows
        per = (rows + w) // w
        return (min(r * per, rows) * row, min((r + 1) * per, rows) * row)
    raise ValueError(kind)


_RANGE_HINTS = [
    ("elements", "FSDP2 splits dim 0 (whole rows), not the flat elements: chunk the rows, then multiply by the row "
                 "length."),
    ("floor", "you gave each rank rows // world_size rows: torch.chunk gives every rank ceil(rows / world_size) "
              "rows (the last ones fewer, maybe none), not rows // world_size with the remainder elsewhere."),
    ("unclipped", "the last ranks run past the end of the parameter: clip start and stop to the row count, "
                  "min(r*c, rows) and min((r+1)*c, rows) — a rank may get fewer rows, or none."),
    ("stop-clipped", "you clipped the stop but not the start: a rank past the last row gets an empty shard "
                     "(rows*row, rows*row), so clip the start to the row count too."),
    ("rows", "you returned row numbers: the exercise asks for flat positions, so multiply by the elements per row "
             "(prod(shape[1:]))."),
    ("inclusive", "stop is exclusive, as in Python slices: (r+1)*c rows times the row length, without the - 1."),
    ("array_split", "that is numpy.array_split (the first ranks get one row more); torch.chunk gives every rank "
                    "ceil(rows / world_size) rows, so the LAST ranks get fewer."),
    ("second-dim", "a row of a tensor with more than two dims holds prod(shape[1:]) elements, not shape[1]."),
    ("ceil-plus-one", "ceil(rows / world_size) is (rows + world_size - 1) // world_size; (rows + world_size) // "
                      "world_size is one too many when world_size divides rows."),
]


def check_shard_range(shard_range) -> None:
    """``shard_range(shape, world_size, rank)`` -> flat (start, stop) of the rank's FSDP2 shard."""
    require_callable(shard_range, "shard_range")
    cases = [((512, 256), 2), ((33, 128), 2), ((5, 3), 4), ((1, 4096), 2), ((7,), 3), ((10, 4, 2), 3), ((8, 8), 1)]
    every = [(shape, w, r) for shape, w in cases for r in range(w)]

    def range_tags(shape, w, r):
        rows, per = shape[0], -(-shape[0] // w)
        return ["where world_size does not divide the rows" if rows % w else "where world_size divides the rows",
                "of the last rank" if r == w - 1 else "of a rank before the last",
                "of rank 0" if r == 0 else "of a rank after rank 0",
                "of a rank that gets no rows at all" if r * per >= rows else "of a rank with rows",
                "of a rank that gets fewer rows than rank 0" if 0 < rows - r * per < per else
                "of a rank with a full share of rows (or none)",
                f"of a {len(shape)}-D shape", "of a 1-D shape" if len(shape) == 1 else "of a shape with rows of several elements",
                "of a tensor with more than two dims" if len(shape) > 2 else "of a tensor with at most two dims"]

    pattern = _pattern(shard_range, [((shape, w, r), {}) for shape, w, r in every],
                       [shard_ranges(shape, w)[r] for shape, w, r in every], [range_tags(*c) for c in every])
    for shape, w in cases:
        for r in range(w):
            want = shard_ranges(shape, w)[r]
            got = call(shard_range, shape, w, r)
            what = f"shard_range({shape}, world_size={w}, rank={r})"
            require_type(got, tuple, what)
            if len(got) == 2 and not all(isinstance(v, int) and not isinstance(v, bool) for v in got):
                kinds = ", ".join(type(v).__name__ for v in got)
                fail(f"{what} returned ({kinds}); expected two ints.",
                     hint="your positions are not Python ints (a float from `/` or math.ceil on floats, or a "
                          "0-d tensor): flat positions index a tensor, so compute them with integer arithmetic "
                          "(`//`, -(-a // b) for the ceiling) and return ints.")
            expect_close(got, want, what=f"shard_range({shape}, world_size={w}, rank={r})", rtol=0, atol=0,
                         context=pattern,
                         default="rank r holds rows [r*c, (r+1)*c) of dim 0, c = ceil(rows / world_size), clipped to "
                                 "the row count; multiply by the elements per row for flat positions.",
                         variants=[(hint, lambda kind=kind: _range_variant(shape, w, r, kind))
                                   for kind, hint in _RANGE_HINTS])
    passed("Exercise 11.2 · FSDP2 shards")


# ---------------------------------------------------------------------------- 11.3
def _local_bytes(shape, w, r, min_size, bs, *, by_local=False, global_blocks=False, absmax=8, code_bytes=2,
                 fp32_bytes=8, strict=False, blocks="ceil", shard_of=None, always_8bit=False):
    start, stop = shard_ranges(shape, w)[r if shard_of is None else shard_of]
    n_local, n_full = stop - start, math.prod(shape)
    size = n_local if by_local else n_full
    eight = always_8bit or (size > min_size if strict else size >= min_size)
    if not eight:
        return fp32_bytes * n_local
    if global_blocks and n_local:
        n_blocks = -(-stop // bs) - start // bs
    elif blocks == "full":
        n_blocks = -(-n_full // bs)
    elif blocks == "plus-one":
        n_blocks = n_local // bs + 1
    else:
        n_blocks = -(-n_local // bs)
    return code_bytes * n_local + absmax * n_blocks


_LOCAL_HINTS = [
    ("decide 8-bit or fp32 by the FULL parameter's size, not the shard's: sharding must never change which states "
     "are 8-bit.", dict(by_local=True)),
    ("blocks are local to the shard: the rank splits its own elements into ceil(local / blocksize) blocks from its "
     "first element, whatever the single-process blocks were.", dict(global_blocks=True)),
    ("you counted the blocks of the full parameter on every rank: a rank keeps absmax only for its own elements, "
     "ceil(local / blocksize) blocks.", dict(blocks="full")),
    ("you forgot the absmax: 8 bytes (two fp32 scales, m and v) per local block.", dict(absmax=0)),
    ("you counted one absmax (4 bytes) per block; m and v have one each: 8 bytes per block.", dict(absmax=4)),
    ("you counted 1 byte per element for the 8-bit states; Adam keeps two (m and v): 2 bytes.", dict(code_bytes=1)),
    ("fp32 Adam keeps two fp32 states (m and v): 8 bytes per element, not 4.", dict(fp32_bytes=4)),
    ("a parameter of exactly min_8bit_size elements is 8-bit: the test is prod(shape) >= min_8bit_size, not >.",
     dict(strict=True)),
    ("local // blocksize + 1 counts one block too many when blocksize divides the shard (and one for an empty "
     "shard): use ceil(local / blocksize), -(-local // blocksize).", dict(blocks="plus-one")),
    ("parameters smaller than min_8bit_size keep fp32 states: 8 bytes per element, no blocks.",
     dict(always_8bit=True)),
]


def check_local_state_bytes(local_state_bytes) -> None:
    """``local_state_bytes(shape, world_size, rank, min_8bit_size=4096, blocksize=256)`` -> bytes on this rank."""
    require_callable(local_state_bytes, "local_state_bytes")
    cases = [((512, 256), 2, 4096, 256), ((33, 128), 2, 4096, 256), ((1, 4096), 2, 4096, 256),
             ((100, 30), 3, 4096, 256), ((33, 128), 4, 4096, 64), ((64,), 2, 4096, 256), ((3, 1000), 2, 0, 256)]
    every = [(shape, w, r, min_size, bs) for shape, w, min_size, bs in cases for r in range(w)]

    def local_tags(shape, w, r, min_size, bs):
        start, stop = shard_ranges(shape, w)[r]
        n_full, local = math.prod(shape), stop - start
        eight = n_full >= min_size
        return ["of a parameter with 8-bit states" if eight else "of a parameter with fp32 states (smaller than "
                "min_8bit_size)",
                "of an 8-bit parameter whose shard is smaller than min_8bit_size" if eight and local < min_size else
                "of a shard at least min_8bit_size (or fp32)",
                "of a shard that is not a whole number of blocks" if eight and local % bs else
                "of a shard of whole blocks (or fp32)",
                "of an empty shard" if local == 0 else "of a non-empty shard",
                "of the last rank" if r == w - 1 else "of a rank before the last",
                "with min_8bit_size=0" if min_size == 0 else "with min_8bit_size=4096",
                f"with blocksize={bs}"]

    pattern = _pattern(local_state_bytes, [((shape, w, r), {"min_8bit_size": m, "blocksize": bs})
                                           for shape, w, r, m, bs in every],
                       [_local_bytes(*c) for c in every], [local_tags(*c) for c in every])
    for shape, w, min_size, bs in cases:
        for r in range(w):
            want = _local_bytes(shape, w, r, min_size, bs)
            got = call(local_state_bytes, shape, w, r, min_8bit_size=min_size, blocksize=bs)
            variants = [(hint, lambda kw=kw: _local_bytes(shape, w, r, min_size, bs, **kw)) for hint, kw in _LOCAL_HINTS]
            if r > 0:
                variants.append((f"rank {r} holds its own shard, which may be smaller than rank 0's (the last ranks get "
                                 "fewer rows, maybe none): use shard_range(shape, world_size, rank) for this rank.",
                                 lambda: _local_bytes(shape, w, r, min_size, bs, shard_of=0)))
            expect_close(got, want, rtol=0, atol=0, context=pattern,
                         what=f"local_state_bytes({shape}, world_size={w}, rank={r}, min_8bit_size={min_size}, "
                              f"blocksize={bs})",
                         default="8-bit when the FULL parameter has >= min_8bit_size elements: 2 bytes per local "
                                 "element + 8 per local block (ceil(local / blocksize)); else 8 bytes per local element.",
                         variants=variants)
    passed("Exercise 11.3 · 8-bit states of a shard")
