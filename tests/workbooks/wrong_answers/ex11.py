"""Workbook 11 · 8-bit Adam at scale: what learners plausibly write instead of the solution."""

from __future__ import annotations

import math

import numpy as np

from adam8lib.course import checks
from tests.workbooks.wrong_answers import Right, Wrong


# ---------------------------------------------------------------------------------- 11.1
def make_bytes(*, shard_rule="ceil", weights_sharded=("fsdp2",), states_sharded=("zero1", "fsdp2"), code=2,
               absmax=8, blocks="ceil", blocks_over="shard", adamw=8, unit=1):
    def per_rank_bytes(num_params, world_size, strategy, optimizer, blocksize=256):
        if shard_rule == "ceil":
            shard = -(-num_params // world_size)
        elif shard_rule == "floor":
            shard = num_params // world_size
        else:
            shard = num_params / world_size
        held = shard if strategy in weights_sharded else num_params
        k = shard if strategy in states_sharded else num_params
        if optimizer == "adamw":
            states = adamw * k
        else:
            counted = k if blocks_over == "shard" else num_params
            n_blocks = math.ceil(counted / blocksize) if blocks == "ceil" else counted // blocksize
            states = code * k + absmax * n_blocks
        return {"weights": 4 * held / unit, "gradients": 4 * held / unit, "states": states / unit}

    return per_rank_bytes


def bytes_with_a_table(num_params, world_size, strategy, optimizer, blocksize=256):
    shard = -(-num_params // world_size)  # exact for any size
    per_state = {"adamw": lambda k: 8 * k, "adam8bit": lambda k: 2 * k + 8 * ((k + blocksize - 1) // blocksize)}
    what_is_sharded = {"ddp": set(), "zero1": {"states"}, "fsdp2": {"weights", "gradients", "states"}}[strategy]
    count = {part: shard if part in what_is_sharded else num_params for part in ("weights", "gradients", "states")}
    return {"weights": 4 * count["weights"], "gradients": 4 * count["gradients"],
            "states": per_state[optimizer](count["states"])}


# ---------------------------------------------------------------------------------- 11.2
def range_by_elements(shape, world_size, rank):
    n = math.prod(shape)
    per = -(-n // world_size)
    return (min(rank * per, n), min((rank + 1) * per, n))


def range_floor_last_takes_rest(shape, world_size, rank):
    rows, row = shape[0], math.prod(shape[1:])
    per = rows // world_size
    stop = rows if rank == world_size - 1 else (rank + 1) * per
    return (rank * per * row, stop * row)


def range_floor_remainder_lost(shape, world_size, rank):
    rows, row = shape[0], math.prod(shape[1:])
    per = rows // world_size
    return (rank * per * row, (rank + 1) * per * row)


def range_unclipped(shape, world_size, rank):
    rows, row = shape[0], math.prod(shape[1:])
    per = math.ceil(rows / world_size)
    return (rank * per * row, (rank + 1) * per * row)


def range_stop_clipped(shape, world_size, rank):
    rows, row = shape[0], math.prod(shape[1:])
    per = math.ceil(rows / world_size)
    return (rank * per * row, min((rank + 1) * per, rows) * row)


def range_in_rows(shape, world_size, rank):
    rows = shape[0]
    per = -(-rows // world_size)
    return (min(rank * per, rows), min((rank + 1) * per, rows))


def range_inclusive_stop(shape, world_size, rank):
    rows, row = shape[0], math.prod(shape[1:])
    per = -(-rows // world_size)
    return (min(rank * per, rows) * row, min((rank + 1) * per, rows) * row - 1)


def range_array_split(shape, world_size, rank):
    pieces = np.array_split(np.arange(shape[0]), world_size)
    row = math.prod(shape[1:])
    start = sum(len(p) for p in pieces[:rank])
    return (start * row, (start + len(pieces[rank])) * row)


def range_second_dim_only(shape, world_size, rank):
    rows = shape[0]
    row = shape[1] if len(shape) > 1 else 1
    per = -(-rows // world_size)
    return (min(rank * per, rows) * row, min((rank + 1) * per, rows) * row)


def range_ceil_off_by_one(shape, world_size, rank):
    rows, row = shape[0], math.prod(shape[1:])
    per = (rows + world_size) // world_size
    return (min(rank * per, rows) * row, min((rank + 1) * per, rows) * row)


def range_with_torch_chunk(shape, world_size, rank):
    import torch

    chunks = torch.arange(shape[0]).chunk(world_size)
    row = math.prod(shape[1:])
    start = sum(len(c) for c in chunks[:rank])
    size = len(chunks[rank]) if rank < len(chunks) else 0
    return tuple([start * row, (start + size) * row])


def range_with_numpy_strides(shape, world_size, rank):
    rows = shape[0]
    row = int(np.prod(shape[1:], dtype=np.int64))
    per = (rows + world_size - 1) // world_size
    first, last = min(rank * per, rows), min(rank * per + per, rows)
    return (first * row, last * row)


# ---------------------------------------------------------------------------------- 11.3
def _range(shape, world_size, rank):
    rows, row = shape[0], math.prod(shape[1:])
    per = -(-rows // world_size)
    return (min(rank * per, rows) * row, min((rank + 1) * per, rows) * row)


def make_local(*, decide_by="full", op=">=", code=2, absmax=8, fp32=8, blocks="local", rank_of=None, small="fp32"):
    def local_state_bytes(shape, world_size, rank, min_8bit_size=4096, blocksize=256):
        start, stop = _range(shape, world_size, rank if rank_of is None else rank_of)
        local = stop - start
        size = math.prod(shape) if decide_by == "full" else local
        eight = size >= min_8bit_size if op == ">=" else size > min_8bit_size
        if small == "8bit":
            eight = True
        if not eight:
            return fp32 * local
        if blocks == "local":
            n_blocks = -(-local // blocksize)
        elif blocks == "full":
            n_blocks = -(-math.prod(shape) // blocksize)
        elif blocks == "global":
            n_blocks = (-(-stop // blocksize) - start // blocksize) if local else 0
        else:
            n_blocks = local // blocksize + 1
        return code * local + absmax * n_blocks

    return local_state_bytes


def local_bytes_per_state(shape, world_size, rank, min_8bit_size=4096, blocksize=256):
    start, stop = _range(shape, world_size, rank)
    local = stop - start
    if math.prod(shape) < min_8bit_size:
        return 2 * (4 * local)  # m and v in fp32
    one_state = local + 4 * math.ceil(local / blocksize)  # 1-byte codes + one fp32 absmax per block
    return 2 * one_state


C = checks
WRONG = [
    # 11.1 · per-rank memory
    Wrong("11.1", C.check_per_rank_bytes, make_bytes(weights_sharded=("zero1", "fsdp2")),
          "ZeRO-1 shards the weights and gradients too", "ZeRO-1 shards only the optimizer states", True),
    Wrong("11.1", C.check_per_rank_bytes, make_bytes(weights_sharded=("ddp", "fsdp2"), states_sharded=("ddp", "zero1", "fsdp2")),
          "DDP shards like FSDP2", "under DDP every rank holds everything", True),
    Wrong("11.1", C.check_per_rank_bytes, make_bytes(weights_sharded=(), states_sharded=()),
          "per-rank bytes never divided by the world size", "the optimizer states are not divided by the world size", True),
    Wrong("11.1", C.check_per_rank_bytes, make_bytes(weights_sharded=()),
          "FSDP2's weights and gradients not divided", "the weights and gradients are not divided by the world size", True),
    Wrong("11.1", C.check_per_rank_bytes, make_bytes(absmax=0), "absmax bytes forgotten",
          "you forgot the absmax", True),
    Wrong("11.1", C.check_per_rank_bytes, make_bytes(absmax=4), "one absmax per block, not two",
          "you counted one absmax (4 bytes) per block", True),
    Wrong("11.1", C.check_per_rank_bytes, make_bytes(code=1), "1 byte per parameter for both states",
          "you counted 1 byte per parameter for the 8-bit states", True),
    Wrong("11.1", C.check_per_rank_bytes, make_bytes(blocks="floor"), "blocks rounded down",
          "you rounded the number of blocks down", True),
    Wrong("11.1", C.check_per_rank_bytes, make_bytes(blocks_over="all"), "absmax blocks of the whole model on each rank",
          "you counted the blocks of all n parameters", True),
    Wrong("11.1", C.check_per_rank_bytes, make_bytes(adamw=4), "AdamW with one fp32 state",
          "AdamW keeps two fp32 states (m and v): 8 bytes per parameter, not 4", True),
    Wrong("11.1", C.check_per_rank_bytes, make_bytes(adamw=16), "AdamW 16 bytes/param in the states",
          "the weights (and gradients) are counted separately", True),
    Wrong("11.1", C.check_per_rank_bytes, make_bytes(shard_rule="floor"), "shard = n // world_size",
          "ceil(n / world_size) parameters, not n // world_size", True),
    Wrong("11.1", C.check_per_rank_bytes, make_bytes(shard_rule="true"), "shard = n / world_size (a float)",
          "n / world_size is not a whole number of parameters", True),
    Wrong("11.1", C.check_per_rank_bytes, make_bytes(unit=2**20), "MiB instead of bytes",
          "return bytes, not MiB", True),
    # 11.2 · FSDP2 shards
    Wrong("11.2", C.check_shard_range, lambda shape, w, r: list(range_with_torch_chunk(shape, w, r)),
          "returns a list [start, stop], not a tuple", "you returned a list where the statement asks for a tuple",
          True),
    Wrong("11.2", C.check_shard_range, lambda shape, w, r: tuple(float(v) for v in range_with_torch_chunk(shape, w, r)),
          "float positions (true division)", "your positions are not Python ints", True),
    Wrong("11.2", C.check_shard_range, range_by_elements, "chunks of the flat elements, not rows",
          "FSDP2 splits dim 0 (whole rows)", True),
    Wrong("11.2", C.check_shard_range, range_floor_last_takes_rest, "rows // world_size, remainder on the last rank",
          "not rows // world_size", True),
    Wrong("11.2", C.check_shard_range, range_floor_remainder_lost, "rows // world_size, remainder rows lost",
          "you gave each rank rows // world_size rows", True),
    Wrong("11.2", C.check_shard_range, range_unclipped, "not clipped: the last rank runs past the end",
          "the last ranks run past the end of the parameter", True),
    Wrong("11.2", C.check_shard_range, range_stop_clipped, "stop clipped, start not",
          "you clipped the stop but not the start", True),
    Wrong("11.2", C.check_shard_range, range_in_rows, "row numbers instead of flat positions",
          "you returned row numbers", True),
    Wrong("11.2", C.check_shard_range, range_inclusive_stop, "inclusive stop (off by one)",
          "stop is exclusive", True),
    Wrong("11.2", C.check_shard_range, range_array_split, "numpy.array_split's split",
          "that is numpy.array_split", True),
    Wrong("11.2", C.check_shard_range, range_second_dim_only, "row length = shape[1]",
          "a row of a tensor with more than two dims holds prod(shape[1:])", True),
    Wrong("11.2", C.check_shard_range, range_ceil_off_by_one, "ceil written as (rows + w) // w",
          "(rows + world_size) // world_size is one too many", True),
    # 11.3 · 8-bit states of a shard
    Wrong("11.3", C.check_local_state_bytes, make_local(decide_by="local"), "8-bit decided by the shard's size",
          "decide 8-bit or fp32 by the FULL parameter's size", True),
    Wrong("11.3", C.check_local_state_bytes, make_local(blocks="global"), "the single-process blocks the shard overlaps",
          "blocks are local to the shard", True),
    Wrong("11.3", C.check_local_state_bytes, make_local(blocks="full"), "absmax of the full parameter on every rank",
          "you counted the blocks of the full parameter on every rank", True),
    Wrong("11.3", C.check_local_state_bytes, make_local(absmax=0), "absmax bytes forgotten",
          "you forgot the absmax", True),
    Wrong("11.3", C.check_local_state_bytes, make_local(code=1), "1 byte per element for both states",
          "you counted 1 byte per element for the 8-bit states", True),
    Wrong("11.3", C.check_local_state_bytes, make_local(fp32=4), "fp32 branch with one state",
          "fp32 Adam keeps two fp32 states (m and v): 8 bytes per element, not 4", True),
    Wrong("11.3", C.check_local_state_bytes, make_local(op=">"), "prod(shape) > min_8bit_size",
          "a parameter of exactly min_8bit_size elements is 8-bit", True),
    Wrong("11.3", C.check_local_state_bytes, make_local(blocks="plus-one"), "local // blocksize + 1 blocks",
          "local // blocksize + 1 counts one block too many", True),
    Wrong("11.3", C.check_local_state_bytes, make_local(rank_of=0), "rank 0's shard for every rank",
          "use shard_range(shape, world_size, rank) for this rank", True),
    Wrong("11.3", C.check_local_state_bytes, make_local(small="8bit"), "no fp32 branch for small parameters",
          "parameters smaller than min_8bit_size keep fp32 states", True),
]

RIGHT = [
    Right("11.1", C.check_per_rank_bytes, bytes_with_a_table, "a table of what each strategy shards, (k + b - 1) // b"),
    Right("11.2", C.check_shard_range, range_with_torch_chunk, "torch.arange(rows).chunk, tuple() of a list"),
    Right("11.2", C.check_shard_range, range_with_numpy_strides, "(rows + w - 1) // w, np.prod"),
    Right("11.3", C.check_local_state_bytes, local_bytes_per_state, "per state: 1 byte + 4 per block, times two"),
]
