"""Adam4bit, AdamFp8 and stochastic rounding: one optimizer with state formats (lesson 12).

torch.optim's conventions (schedulers, closures, hooks, compile, copies, checkpoints) run over these
classes in tests/test_torch_optim_conventions.py; here: the step against its definition, training
against fp32 AdamW, the zero-point problem and its fix, checkpoints across formats, the
non-finite and small-tensor rules, bad input, and bf16 weights with stochastic rounding.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from adam8lib import Adam4bit, Adam8bit, AdamFp8, AdamW4bit, AdamW8bit, AdamWFp8, LowBitAdam
from adam8lib.adam import adam_step
from adam8lib.formats import FORMATS
from adam8lib.rounding import step_generator, stochastic_round_to_bf16

NEW = [Adam4bit, AdamW4bit, AdamFp8, AdamWFp8]


def mlp(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4)).to(dtype)


def data(seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(512, 64, generator=gen), torch.randint(0, 4, (512,), generator=gen)


def train(model, opt, steps, dtype=torch.float32):
    x, y = data()
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(x.to(dtype)).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


# ------------------------------------------------------------------ the step
@pytest.mark.parametrize("name", ["4bit", "4bit-naive", "fp8"])
def test_one_step_is_decode_then_the_fp32_adam_rule_then_encode(name):
    """Two steps on a (300, 70) weight, against the fp32 Adam rule of lesson 03 applied to the
    decoded states (adam8lib.adam.adam_step, itself equal to torch.optim.AdamW)."""
    fmt = FORMATS[name]
    gen = torch.Generator().manual_seed(3)
    p = nn.Parameter(torch.randn(300, 70, generator=gen))
    opt = LowBitAdam([p], lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, state_format=name)
    ref_p, ref_state = p.detach().clone(), fmt.new_state((300, 70), torch.device("cpu"))
    for step in (1, 2):
        g = torch.randn(300, 70, generator=gen)
        p.grad = g.clone()
        opt.step()
        m, v = fmt.decode(ref_state, (300, 70))
        adam_step(ref_p, g, m.view(300, 70), v.view(300, 70), step=step, lr=1e-2, betas=(0.8, 0.99), eps=1e-6,
                  weight_decay=0.1, decoupled=True)  # in place on ref_p, m, v
        fmt.encode_(ref_state, m, v, (300, 70))
        assert torch.allclose(p.detach(), ref_p, rtol=0, atol=1e-6), step
        ours = opt.state[p]
        for key in ("absmax1", "absmax2"):
            assert torch.allclose(ours[key], ref_state[key], rtol=1e-6, atol=0), (step, key)
        same = [(ours[k] == ref_state[k]).float().mean().item() for k in ("state1", "state2")]
        assert min(same) >= 0.999, (step, same)  # codes: rounding of the fp32 rule's last bit aside


@pytest.mark.parametrize("cls", [AdamW4bit, AdamWFp8])
def test_trains_like_fp32_adamw(cls):
    loss_ref = train(model := mlp(), torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01), 150)
    loss = train(model := mlp(), cls(model.parameters(), lr=3e-3), 150)
    first = train(mlp(), torch.optim.AdamW(mlp().parameters(), lr=0.0), 1)
    assert loss < 0.2 * first and abs(loss - loss_ref) < 0.1 * first, (loss, loss_ref, first)


def test_zero_point_problem_blows_up_naive_four_bit_and_not_the_fix():
    """Rows of 128 with one large gradient (1.0) and 127 small ones (0.01), then the small ones stop
    (a sparse feature). Naive 4-bit codes their v (1e-4 of the block's largest) to 0 while m stays,
    so the next update is lr * m / eps: hundreds of thousands of lr. The zero-free map with rank-1
    scales keeps every update within about lr, as 8-bit and FP8 do."""
    moves = {}
    for name in ("4bit-naive", "4bit", "8bit", "fp8"):
        p = nn.Parameter(torch.zeros(64, 128))
        opt = LowBitAdam([p], lr=1e-3, state_format=name)
        g = torch.full((64, 128), 1e-2)
        g[:, 0] = 1.0
        p.grad = g
        opt.step()
        g = torch.zeros(64, 128)
        g[:, 0] = 1.0
        before = p.detach().clone()
        p.grad = g
        opt.step()
        moves[name] = ((p.detach() - before).abs().max() / 1e-3).item()
    assert moves["4bit-naive"] > 1e4, moves
    assert max(moves["4bit"], moves["8bit"], moves["fp8"]) < 1.01, moves


# ------------------------------------------------------------------ rules shared with Adam8bit
@pytest.mark.parametrize("cls", NEW)
def test_small_tensors_keep_fp32_states_and_large_ones_low_bit_codes(cls):
    model = mlp()
    opt = cls(model.parameters())
    train(model, opt, 1)
    keys = [sorted(k for k in st if k != "step") for st in opt.state.values()]
    assert keys == [["absmax1", "absmax2", "state1", "state2"], ["exp_avg", "exp_avg_sq"],
                    ["exp_avg", "exp_avg_sq"], ["exp_avg", "exp_avg_sq"]]
    w = model[0].weight
    assert all(opt.state[w][k].dtype == torch.uint8 for k in ("state1", "state2"))
    spec = opt.format.state_spec(tuple(w.shape))
    assert {k: (t.numel(), t.dtype) for k, t in opt.state[w].items() if k != "step"} == spec


@pytest.mark.parametrize("cls", NEW)
def test_non_finite_gradient_resets_that_element_and_keeps_the_weight(cls):
    p = nn.Parameter(torch.randn(64, 128))
    opt = cls([p], lr=1e-2)
    p.grad = torch.randn(64, 128)
    opt.step()
    before = p.detach().clone()
    g = torch.randn(64, 128)
    g[3, 5], g[10, 0], g[63, 127] = float("nan"), float("inf"), -float("inf")
    p.grad = g
    opt.step()
    m, v = opt.format.with_blocksize(opt.param_groups[0]["blocksize"]).decode(opt.state[p], (64, 128))
    for i, j in ((3, 5), (10, 0), (63, 127)):
        assert p[i, j].item() == before[i, j].item()
        assert m.view(64, 128)[i, j].abs().item() <= 1e-3 * m.abs().max().item()  # reset (v: the map's floor)
    assert bool(torch.isfinite(p).all() and torch.isfinite(m).all() and torch.isfinite(v).all())
    assert not torch.equal(p.detach(), before)


@pytest.mark.parametrize("saver, loader", [(AdamW4bit, AdamW8bit), (AdamW8bit, AdamW4bit), (AdamWFp8, AdamW4bit),
                                           (AdamW4bit, AdamWFp8)])
def test_checkpoint_of_another_format_is_refused_and_changes_nothing(saver, loader):
    model = mlp()
    source = saver(model.parameters(), lr=1e-2)
    train(model, source, 2)
    target = loader(model.parameters(), lr=1e-2)
    train(model, target, 2)
    before = copy.deepcopy(target.state_dict())
    with pytest.raises(ValueError, match="format|maps"):
        target.load_state_dict(source.state_dict())
    after = target.state_dict()
    for k, st in before["state"].items():
        for key, value in st.items():
            assert torch.equal(value, after["state"][k][key]) if torch.is_tensor(value) else value == after["state"][k][key]


def test_corrupt_fp8_codes_are_refused():
    model = mlp()
    opt = AdamWFp8(model.parameters())
    train(model, opt, 1)
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][0]["state2"][7] = 0x7F  # a NaN of float8 e4m3fn
    with pytest.raises(ValueError, match="decode to NaN"):
        opt.load_state_dict(sd)


def test_bad_input_is_a_clear_error():
    params = list(mlp().parameters())
    with pytest.raises(ValueError, match=r"state_format=.4bit. has the backends .auto., .torch.*backend .cpu_fast. has no step for its states"):
        Adam4bit(params, backend="cpu_fast")  # ("cpu" runs 4-bit states too)
    with pytest.raises(ValueError, match="Unknown state_format"):
        LowBitAdam(params, state_format="2bit")
    with pytest.raises(TypeError, match="stochastic_rounding=True writes bf16"):
        AdamW8bit(params, stochastic_rounding=True)
    with pytest.raises(TypeError, match="must be a bool"):
        AdamW8bit(params, stochastic_rounding=1)
    with pytest.raises(TypeError, match="seed must be an int"):
        AdamW8bit(params, seed=1.5)
    assert Adam4bit(params).param_groups[0]["blocksize"] == 128 and AdamFp8(params).param_groups[0]["blocksize"] == 256
    assert isinstance(Adam8bit(params), LowBitAdam) and Adam8bit(params).format.name == "8bit"


# ------------------------------------------------------------------ stochastic rounding
def test_stochastic_rounding_picks_a_neighbour_with_the_right_odds():
    lo = torch.tensor(1.0)
    hi = torch.nextafter(lo.bfloat16(), torch.tensor(2.0, dtype=torch.bfloat16)).float()  # 1 + 2^-7
    x = torch.full((200_000,), float(lo + 0.25 * (hi - lo)))
    out = stochastic_round_to_bf16(x, step_generator(0, 1, 0)).float()
    assert set(out.unique().tolist()) == {float(lo), float(hi)}
    up = (out == hi).float().mean().item()
    assert abs(up - 0.25) < 4 * (0.25 * 0.75 / 200_000) ** 0.5  # 4 standard errors
    neg = stochastic_round_to_bf16(-x, step_generator(0, 1, 0)).float()
    assert torch.equal(neg, -out)  # sign and magnitude: the same odds below zero
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0])
    got = stochastic_round_to_bf16(special, step_generator(0, 1, 0)).float()
    assert torch.isnan(got[0]) and got[1:].tolist() == [float("inf"), -float("inf"), 0.0, 0.0, 1.0]
    with pytest.raises(TypeError, match="fp32"):
        stochastic_round_to_bf16(x.double(), step_generator(0, 1, 0))


def test_small_updates_survive_stochastic_rounding_and_vanish_with_round_to_nearest():
    """bf16 weights at 1.0 (spacing 2^-8 below 1): an Adam step of lr = 1e-4 is far below half of it.
    Round-to-nearest loses every one; stochastic rounding keeps them in expectation."""
    finals = {}
    for sr in (False, True):
        p = nn.Parameter(torch.ones(8192, dtype=torch.bfloat16))
        opt = AdamW8bit([p], lr=1e-4, weight_decay=0.0, stochastic_rounding=sr)
        for _ in range(100):
            p.grad = torch.ones(8192, dtype=torch.bfloat16)
            opt.step()
        finals[sr] = p.detach().float()
    assert bool((finals[False] == 1.0).all())  # frozen
    assert abs(finals[True].mean().item() - (1 - 100 * 1e-4)) < 1e-3  # 0.99 on average


@pytest.mark.parametrize("cls", [AdamW8bit, AdamW4bit, AdamWFp8])
def test_stochastic_rounding_is_seeded_and_resumes_bit_identically(cls):
    def run(seed, steps=6, resume_at=None):
        model = mlp(dtype=torch.bfloat16)
        opt = cls(model.parameters(), lr=1e-3, stochastic_rounding=True, seed=seed)
        x, y = data()
        for step in range(steps):
            if step == resume_at:  # a new optimizer and model from a checkpoint
                ckpt = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict()})
                model = mlp(seed=9, dtype=torch.bfloat16)
                model.load_state_dict(ckpt["model"])
                opt = cls(model.parameters(), lr=1.0, stochastic_rounding=True, seed=seed)
                opt.load_state_dict(ckpt["opt"])
            loss = nn.functional.cross_entropy(model(x.bfloat16()).float(), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])

    a, b, other = run(seed=1), run(seed=1), run(seed=2)
    assert torch.equal(a, b) and not torch.equal(a, other)
    assert torch.equal(run(seed=1, resume_at=3), a)
