"""Check cells of workbook 11 (ex11_at_scale): pass on the solution, fail with a named hint on each plausible wrong answer."""

from __future__ import annotations

import math

import pytest

from adam8lib.course import checks

from tests._check_helpers import fails_with, solution, stub


# ------------------------------------------------------------------ 11.1 per-rank bytes
def make_bytes(*, zero_shards_all=False, ddp_shards=False, absmax=True, floor=False):
    def per_rank_bytes(num_params, world_size, strategy, optimizer, blocksize=256):
        shard = num_params // world_size if floor else -(-num_params // world_size)
        sharded = strategy == "fsdp2" or (strategy == "zero1" and zero_shards_all) or ddp_shards
        k = num_params if strategy == "ddp" and not ddp_shards else shard
        states = 8 * k if optimizer == "adamw" else 2 * k + (8 * (-(-k // blocksize)) if absmax else 0)
        held = shard if sharded else num_params
        return {"weights": 4 * held, "gradients": 4 * held, "states": states}

    return per_rank_bytes


@pytest.mark.parametrize("fn, hint", [
    (make_bytes(zero_shards_all=True), "ZeRO-1 shards only the optimizer states"),
    (make_bytes(ddp_shards=True), "under DDP every rank holds everything"),
    (make_bytes(absmax=False), "you forgot the absmax"),
    (make_bytes(floor=True), "ceil(n / world_size) parameters, not n // world_size"),
    (stub, "not implemented yet"),
])
def test_per_rank_bytes_fails(fn, hint):
    fails_with(checks.check_per_rank_bytes, fn, hint)


# ------------------------------------------------------------------ 11.2 shard ranges
def make_range(kind):
    def shard_range(shape, world_size, rank):
        n = math.prod(shape)
        if kind == "elements":
            per = -(-n // world_size)
            return (min(rank * per, n), min((rank + 1) * per, n))
        rows, row = shape[0], math.prod(shape[1:])
        per = rows // world_size
        stop = rows if rank == world_size - 1 else (rank + 1) * per
        return (rank * per * row, stop * row)

    return shard_range


@pytest.mark.parametrize("fn, hint", [
    (make_range("elements"), "FSDP2 splits dim 0 (whole rows)"),
    (make_range("floor"), "torch.chunk gives every rank ceil(rows / world_size) rows"),
    (stub, "not implemented yet"),
])
def test_shard_range_fails(fn, hint):
    fails_with(checks.check_shard_range, fn, hint)


# ------------------------------------------------------------------ 11.3 local 8-bit states
def make_local(*, by_local=False, global_blocks=False):
    shard_range = solution("11", "shard_range")

    def local_state_bytes(shape, world_size, rank, min_8bit_size=4096, blocksize=256):
        start, stop = shard_range(shape, world_size, rank)
        local = stop - start
        if (local if by_local else math.prod(shape)) < min_8bit_size:
            return 8 * local
        blocks = (-(-stop // blocksize) - start // blocksize) if (global_blocks and local) else -(-local // blocksize)
        return 2 * local + 8 * blocks

    return local_state_bytes


@pytest.mark.parametrize("fn, hint", [
    (make_local(by_local=True), "decide 8-bit or fp32 by the FULL parameter's size"),
    (make_local(global_blocks=True), "blocks are local to the shard"),
    (stub, "not implemented yet"),
])
def test_local_state_bytes_fails(fn, hint):
    fails_with(checks.check_local_state_bytes, fn, hint)


def test_ex11_checks_pass_on_the_solution(capsys):
    checks.check_per_rank_bytes(solution("11", "per_rank_bytes"))
    checks.check_shard_range(solution("11", "shard_range"))
    checks.check_local_state_bytes(solution("11", "local_state_bytes"))
    assert capsys.readouterr().out.count("all checks passed") == 3
