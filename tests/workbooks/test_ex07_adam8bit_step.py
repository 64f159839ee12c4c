"""Workbook 07 · the 8-bit step: unit tests of the learner's function (run: -m ex07)."""

import copy

import pytest
import torch

from adam8lib.kernels.reference import adam8bit_step
from adam8lib.optim import Adam8bit
from adam8lib.quant import dequantize_blocks, dynamic_map, num_blocks

pytestmark = pytest.mark.ex07

Q1, Q2 = dynamic_map(True), dynamic_map(False)


def fresh(n, bs):
    nb = num_blocks(n, bs)
    return [torch.full((n,), 127, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8), torch.zeros(nb),
            torch.zeros(nb)]


def test_drives_a_whole_optimizer_like_adam8bit(workbook):
    """Ten steps on a 5000-element weight, step for step with adam8lib's Adam8bit."""
    fn = workbook("07").adam8bit_step
    gen = torch.Generator().manual_seed(7)
    w = torch.nn.Parameter(torch.randn(50, 100, generator=gen))
    opt = Adam8bit([w], lr=1e-2, weight_decay=0.01, backend="torch")
    p = w.detach().clone().view(-1)
    states = fresh(5000, 256)
    for t in range(1, 11):
        g = torch.randn(50, 100, generator=gen)
        w.grad = g.clone()
        opt.step()
        fn(p, g.view(-1).clone(), *states, Q1, Q2, step=t, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8,
           weight_decay=0.01, blocksize=256)
        torch.testing.assert_close(p, w.detach().view(-1), rtol=1e-5, atol=1e-6)
        st = opt.state[w]
        for mine, key in zip(states, ("state1", "state2", "absmax1", "absmax2")):
            if key.startswith("state"):  # fp rounding (FMA or not) may move a rare code by one
                diff = (mine.long() - st[key].long()).abs()
                assert diff.max() <= 1 and int((diff > 0).sum()) <= 5, key
            else:
                torch.testing.assert_close(mine, st[key], rtol=1e-5, atol=1e-12)
            mine.copy_(st[key])  # continue from the optimizer's state: no drift between the two
        p.copy_(w.detach().view(-1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_parameters_stay_low_precision(workbook, dtype):
    fn = workbook("07").adam8bit_step
    p = torch.randn(3000).to(dtype)
    ref = p.clone()
    g = torch.randn(3000).to(dtype)
    a, b = fresh(3000, 512), fresh(3000, 512)
    hp = dict(step=1, lr=1e-3, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0, blocksize=512)
    fn(p, g, *a, Q1, Q2, **hp)
    adam8bit_step(ref, g, *b, Q1, Q2, **hp)
    assert p.dtype == dtype and a[0].dtype == torch.uint8 and a[2].dtype == torch.float32
    torch.testing.assert_close(p.float(), ref.float(), rtol=1e-2, atol=1e-3)


def test_all_nan_gradient_changes_no_weight_and_clears_the_states(workbook):
    fn = workbook("07").adam8bit_step
    p = torch.randn(700)
    before = p.clone()
    states = fresh(700, 128)
    hp = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1, blocksize=128)
    fn(p, torch.randn(700), *states, Q1, Q2, step=1, **hp)
    p_mid = p.clone()
    fn(p, torch.full((700,), float("nan")), *states, Q1, Q2, step=2, **hp)
    assert torch.equal(p, p_mid) and not torch.equal(p, before)
    assert torch.equal(dequantize_blocks(states[0], states[2], Q1, 128), torch.zeros(700))
    assert torch.equal(dequantize_blocks(states[1], states[3], Q2, 128), torch.zeros(700))


def test_a_tiny_negative_momentum_keeps_a_negative_code(workbook):
    fn = workbook("07").adam8bit_step
    g = torch.full((256,), -1e-9)
    g[0] = 1.0
    states = fresh(256, 256)
    fn(torch.zeros(256), g, *states, Q1, Q2, step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
       blocksize=256)
    m = dequantize_blocks(states[0], states[2], Q1, 256)
    assert bool((m[1:] < 0).all()), "sign of m lost on requantize"


def test_a_tiny_second_moment_never_rounds_to_zero(workbook):
    """v = 1e-21 next to v = 1e-3 in one block: its code must stay positive, or the next update is m / eps."""
    fn = workbook("07").adam8bit_step
    g = torch.full((256,), 1e-9)
    g[0] = 1.0
    states = fresh(256, 256)
    fn(torch.zeros(256), g, *states, Q1, Q2, step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
       blocksize=256)
    v = dequantize_blocks(states[1], states[3], Q2, 256)
    m = dequantize_blocks(states[0], states[2], Q1, 256)
    assert bool((v > 0).all()) and bool((m > 0).all())


def test_zero_gradient_on_fresh_states_only_decays(workbook):
    fn = workbook("07").adam8bit_step
    p = torch.randn(300)
    before = p.clone()
    states = fresh(300, 64)
    fn(p, torch.zeros(300), *states, Q1, Q2, step=1, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.2,
       blocksize=64)
    torch.testing.assert_close(p, before * (1 - 0.1 * 0.2))
    assert torch.equal(states[2], torch.zeros(5)) and torch.equal(states[3], torch.zeros(5))


def test_my_adam8bit_matches_the_library_and_keeps_small_tensors_fp32(workbook):
    from adam8lib.optim import Adam8bit

    cls = workbook("07").MyAdam8bit
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
    twin = copy.deepcopy(model)
    ours, ref = cls(model.parameters(), lr=3e-3, weight_decay=0.01), Adam8bit(twin.parameters(), lr=3e-3, weight_decay=0.01, backend="torch")
    x, y = torch.randn(32, 64), torch.randint(0, 4, (32,))
    for net, opt in ((model, ours), (twin, ref)):
        for _ in range(5):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    w, b = model[0].weight, model[0].bias
    assert ours.state[w]["state1"].dtype == torch.uint8 and ours.state[w]["absmax1"].numel() == 32
    assert ours.state[b]["exp_avg"].dtype == torch.float32 and "state1" not in ours.state[b]
    assert ours.state[w]["step"] == 5


def test_my_adam8bit_min_8bit_size_and_blocksize_are_per_group(workbook):
    cls = workbook("07").MyAdam8bit
    a, b = torch.nn.Parameter(torch.randn(1024)), torch.nn.Parameter(torch.randn(1024))
    opt = cls([dict(params=[a], min_8bit_size=1024, blocksize=64), dict(params=[b])])
    a.grad, b.grad = torch.randn(1024), torch.randn(1024)
    opt.step()
    assert opt.state[a]["state1"].dtype == torch.uint8 and opt.state[a]["absmax1"].numel() == 16
    assert "exp_avg" in opt.state[b]


def test_stable_embedding_is_normalised_and_xavier(workbook):
    cls = workbook("07").StableEmbedding
    torch.manual_seed(0)
    m = cls(500, 32)
    out = m(torch.arange(10))
    assert out.shape == (10, 32)
    assert torch.allclose(out.mean(-1), torch.zeros(10), atol=1e-5)  # LayerNorm at init: zero mean, unit variance
    assert m.embedding.weight.abs().max() <= (6 / 532) ** 0.5 + 1e-6


def test_train_loop_and_optimizer_learn_the_task_like_torch_adam(workbook):
    """07.4: the learner's train() with torch.optim.Adam is the reference loop; with MyAdam8bit it ends near Adam."""
    from adam8lib.course.checks.ex07_adam8bit_step import _train

    wb = workbook("07")
    ref = _train(lambda ps: torch.optim.Adam(ps, lr=1e-2), 200)
    assert wb.train(torch.optim.Adam, steps=200, lr=1e-2) == pytest.approx(ref, rel=1e-4, abs=1e-7)
    mine = wb.train(wb.MyAdam8bit, steps=200, lr=1e-2)
    assert mine[0] == ref[0] and mine[-1] < 0.01 * mine[0] and mine[-1] < 2 * ref[-1] + 1e-3
