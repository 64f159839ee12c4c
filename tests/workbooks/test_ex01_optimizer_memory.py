"""Workbook 01 · optimizer memory: unit tests of the learner's functions (run: -m ex01)."""

import pytest
import torch

from adam8lib.memory import compute_optimizer_size, estimate_optimizer_memory
from adam8lib.optim import Adam8bit

pytestmark = pytest.mark.ex01


@pytest.mark.parametrize("blocksize", [64, 128, 256, 512, 1024, 2048, 4096])
def test_state_bytes_per_param_every_blocksize(workbook, blocksize):
    fn = workbook("01").state_bytes_per_param
    assert fn("adamw", blocksize) == 8
    assert fn("adam8bit", blocksize) == pytest.approx(2 + 8 / blocksize, rel=1e-12)


def test_state_bytes_per_param_approaches_two_bytes(workbook):
    fn = workbook("01").state_bytes_per_param
    values = [fn("adam8bit", 2**k) for k in range(6, 13)]
    assert values == sorted(values, reverse=True) and 2 < values[-1] < 2.002


@pytest.mark.parametrize("kind", ["sgd", "Adam8bit", ""])
def test_state_bytes_per_param_rejects_unknown_kinds(workbook, kind):
    with pytest.raises(ValueError):
        workbook("01").state_bytes_per_param(kind)


def test_optimizer_state_bytes_random_models(workbook):
    fn = workbook("01").optimizer_state_bytes
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        shapes = [tuple(int(d) for d in torch.randint(1, 300, (int(torch.randint(1, 4, (1,), generator=gen)),),
                                                      generator=gen)) for _ in range(5)]
        for kind in ("adamw", "adam8bit"):
            for bs in (64, 256, 2048):
                want = estimate_optimizer_memory(shapes, kind, blocksize=bs).total_bytes
                assert fn(shapes, kind, blocksize=bs) == want, (shapes, kind, bs)


def test_optimizer_state_bytes_accepts_torch_sizes_and_counts_per_tensor(workbook):
    fn = workbook("01").optimizer_state_bytes
    model = torch.nn.Sequential(torch.nn.Linear(65, 65), torch.nn.LayerNorm(65), torch.nn.Linear(65, 1))
    shapes = [p.shape for p in model.parameters()]  # torch.Size, 4225 weights (8-bit), the rest fp32
    assert fn(shapes, "adam8bit") == 2 * 4225 + 8 * 17 + 8 * (65 + 65 + 65 + 65 + 1)
    assert fn([(4096,)] * 3, "adam8bit", min_8bit_size=4097) == 3 * 8 * 4096
    assert fn([], "adamw") == 0


def test_compute_optimizer_size_matches_a_real_8bit_optimizer(workbook):
    fn = workbook("01").compute_optimizer_size
    model = torch.nn.Sequential(torch.nn.Linear(100, 100), torch.nn.Linear(100, 7))
    opt = Adam8bit(model.parameters(), backend="torch")
    model(torch.randn(3, 100)).sum().backward()
    opt.step()
    mb, elements = fn(opt.state.values())
    want_mb, want_elements = compute_optimizer_size(opt.state.values())
    assert elements == want_elements == 2 * 10_000 + 2 * 40 + 2 * (100 + 700 + 7)
    assert mb == pytest.approx(want_mb, rel=1e-12)


def test_compute_optimizer_size_of_fp16_and_scalar_tensors(workbook):
    fn = workbook("01").compute_optimizer_size
    shared = torch.zeros(256)
    states = [{"step": torch.tensor(3.0), "m": torch.zeros(10, dtype=torch.float16), "map": shared, "note": "x"},
              {"step": 3, "m": torch.zeros(2, 5, dtype=torch.bfloat16), "map": shared}]
    mb, elements = fn(states)
    assert elements == 1 + 10 + 256 + 10
    assert mb * 2**20 == pytest.approx(4 + 20 + 1024 + 20)
