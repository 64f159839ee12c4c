"""Workbook 11 · 8-bit Adam at scale: unit tests of the learner's functions (run: -m ex11)."""

import math

import pytest
import torch

from adam8lib import AdamW8bit, compute_optimizer_size

pytestmark = pytest.mark.ex11


def test_per_rank_bytes_of_a_7b_model_on_8_ranks(workbook):
    fn = workbook("11").per_rank_bytes
    n = 7_000_000_000
    ddp = fn(n, 8, "ddp", "adamw")
    assert ddp == {"weights": 28e9, "gradients": 28e9, "states": 56e9}
    assert fn(n, 8, "zero1", "adamw")["states"] == 7e9  # 56 GB shared by 8 ranks
    fsdp8 = fn(n, 8, "fsdp2", "adam8bit")
    assert fsdp8["weights"] == 3.5e9 and fsdp8["states"] == 2 * 875_000_000 + 8 * math.ceil(875_000_000 / 256)


def test_per_rank_bytes_sum_over_ranks_is_the_whole_model(workbook):
    fn = workbook("11").per_rank_bytes
    one = fn(1 << 20, 1, "fsdp2", "adam8bit")
    four = fn(1 << 20, 4, "fsdp2", "adam8bit")
    assert {k: 4 * v for k, v in four.items()} == one  # 2**20 splits into whole blocks on 4 ranks


@pytest.mark.parametrize("shape, world", [((33, 128), 2), ((5, 3), 4), ((1, 4096), 2), ((10, 4, 2), 3)])
def test_shard_range_is_torch_chunk_on_dim_0(workbook, shape, world):
    fn = workbook("11").shard_range
    index = torch.arange(math.prod(shape)).view(shape)
    chunks = list(index.chunk(world, dim=0))
    chunks += [index[:0]] * (world - len(chunks))  # torch.chunk drops empty tail chunks; FSDP2 keeps them empty
    for rank, chunk in enumerate(chunks):
        start, stop = fn(shape, world, rank)
        assert stop - start == chunk.numel()
        if chunk.numel():
            assert (start, stop) == (chunk.min().item(), chunk.max().item() + 1)


@pytest.mark.parametrize("shape, world", [((33, 128), 2), ((512, 256), 2), ((1, 4096), 2), ((40, 30), 3)])
def test_local_state_bytes_is_what_adam8bit_allocates_for_the_shard(workbook, shape, world):
    """A shard's 8-bit state is that of a tensor of the shard's size, 8-bit because the full one is."""
    fn, shard_range = workbook("11").local_state_bytes, workbook("11").shard_range
    for rank in range(world):
        start, stop = shard_range(shape, world, rank)
        piece = torch.nn.Parameter(torch.zeros(stop - start))
        opt = AdamW8bit([piece], min_8bit_size=0 if math.prod(shape) >= 4096 else 1 << 62)
        opt.init_state()
        want = round(compute_optimizer_size([{k: v for k, v in s.items() if k != "step"}
                                             for s in opt.state.values()])[0] * 2**20)
        assert fn(shape, world, rank) == want
