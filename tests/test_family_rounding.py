"""Stochastic rounding in the optimizer family (QuantizedStateOptimizer, issue 35 part C): bf16 parameters
written with stochastic rounding keyed as LowBitAdam keys them (seed, step, the parameter's index, each
element's global index), the fused step run on an fp32 copy chunk by chunk."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from adam8lib import AdEMAMix8bit, AdamW8bit, Adan8bit, Lion, Lion8bit, Muon8bit, RMSprop8bit, rounding
from adam8lib.optim import LowBitAdam
from tests._random_steps import random_steps

BF16 = torch.bfloat16


def _params(shapes, dtype=BF16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen).to(dtype)) for shape in shapes]


def _train(opt, params, steps=4, seed=1):
    random_steps(opt, params, steps, seed)


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("state_format", ["8bit", "4bit", "fp8"])
def test_the_adamw_group_of_muon8bit_rounds_as_lowbitadam_bit_for_bit(state_format, backend):
    """Muon8bit's AdamW group and LowBitAdam run the same rule; with stochastic rounding (same seed, the same
    parameter order) they write the same bf16 parameters and states, bit for bit: the family keys the
    rounding as LowBitAdam does. Parameters: a matrix (rank-1 v in 4 bits), a long vector, a small one (fp32
    states)."""
    shapes = [(70, 123), (9001,), (50,)]
    a, b = _params(shapes), _params(shapes)
    kw = dict(state_format=state_format, backend=backend, stochastic_rounding=True, seed=3)
    low = LowBitAdam(a, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, **kw)
    fam = Muon8bit(b, lr=1e-2, adamw_betas=(0.9, 0.99), weight_decay=0.1, use_muon=False, **kw)
    _train(low, a)
    _train(fam, b)
    for p, q in zip(a, b):
        assert torch.equal(p, q)
        st, sq = low.state[p], fam.state[q]
        if "state1" in st:
            pairs = [("state1", "exp_avg_codes"), ("absmax1", "exp_avg_absmax"), ("state2", "exp_avg_sq_codes"),
                     ("absmax2", "exp_avg_sq_absmax")]
        else:
            pairs = [("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")]
        for k1, k2 in pairs:
            assert torch.equal(st[k1], sq[k2]), k2
    assert not torch.equal(a[0], _params(shapes)[0])  # it moved


def _chunked_run(make, shapes, chunk, monkeypatch, backend):
    monkeypatch.setattr(rounding, "SR_CHUNK", chunk)
    params = _params(shapes)
    opt = make(params, backend)
    _train(opt, params, steps=3)
    return params, [{k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)} for p in params]


FAMILY = {
    "Lion8bit": lambda ps, be: Lion8bit(ps, lr=1e-3, weight_decay=0.1, backend=be, stochastic_rounding=True, seed=5),
    "AdEMAMix8bit": lambda ps, be: AdEMAMix8bit(ps, lr=1e-2, backend=be, stochastic_rounding=True, seed=5),
    "RMSprop8bit": lambda ps, be: RMSprop8bit(ps, lr=1e-3, backend=be, stochastic_rounding=True, seed=5),
    "Lion-fp32-states": lambda ps, be: Lion(ps, lr=1e-3, backend="torch", stochastic_rounding=True, seed=5),
    "AdEMAMix-fp8": lambda ps, be: AdEMAMix8bit(ps, lr=1e-2, state_format="fp8", backend=be, stochastic_rounding=True,
                                                seed=5),
    # four states, the previous gradient kept in fp32 (chunked with the others)
    "Adan8bit": lambda ps, be: Adan8bit(ps, lr=1e-2, weight_decay=0.02, backend=be, stochastic_rounding=True, seed=5),
}


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("name", list(FAMILY))
def test_chunked_rounding_gives_the_bits_of_the_whole_tensor(name, backend, monkeypatch):
    """Chunks of 1,024 elements (whole blocks; the last one partial) against one piece, the fused step (cpu)
    on each chunk's fp32 copy."""
    shapes = [(37, 200), (9000,)]
    whole = _chunked_run(FAMILY[name], shapes, 1 << 30, monkeypatch, backend)
    chunked = _chunked_run(FAMILY[name], shapes, 1024, monkeypatch, backend)
    for p, q, s, t in zip(whole[0], chunked[0], whole[1], chunked[1]):
        assert torch.equal(p, q)
        assert set(s) == set(t)
        for key in s:
            assert torch.equal(s[key], t[key]), key


def test_chunks_keep_the_step_transient_to_a_chunks_copy(monkeypatch):
    """The fp32 copy of a rounded step is a chunk's: with chunks the rounded step's peak extra memory falls."""
    from adam8lib.memory_tracker import track_step

    def transient(chunk):
        monkeypatch.setattr(rounding, "SR_CHUNK", chunk)
        n = 1 << 18
        emb = torch.nn.Embedding(n // 256, 256).to(BF16)
        opt = Lion8bit(emb.parameters(), lr=1e-3, stochastic_rounding=True)
        x = torch.arange(0, n // 256, 7)
        track_step(emb, opt, lambda: emb(x).float().square().mean())
        tracker = track_step(emb, opt, lambda: emb(x).float().square().mean())
        return tracker.peak("step").bytes["transient"] / n

    whole, chunked = transient(1 << 30), transient(1 << 14)
    assert whole >= 4, whole
    assert chunked <= whole / 2, (chunked, whole)


def test_small_updates_survive_stochastic_rounding_and_vanish_with_round_to_nearest():
    """Lion's step is lr * sign(...) = 1e-4, far below half of bf16's spacing at 1.0 (2^-8 below it)."""
    finals = {}
    for sr in (False, True):
        p = torch.nn.Parameter(torch.ones(8192, dtype=BF16))
        opt = Lion8bit([p], lr=1e-4, stochastic_rounding=sr)
        for _ in range(100):
            p.grad = torch.ones(8192, dtype=BF16)
            opt.step()
        finals[sr] = p.detach().float()
    assert bool((finals[False] == 1.0).all())
    assert abs(finals[True].mean().item() - (1 - 100 * 1e-4)) < 1e-3


def test_seeded_reproducible_and_resumes_bit_identically():
    def run(seed, steps=6, resume_at=None):
        params = _params([(40, 120), (30,)])
        opt = AdEMAMix8bit(params, lr=1e-2, stochastic_rounding=True, seed=seed, min_8bit_size=0)
        gen = torch.Generator().manual_seed(1)
        for step in range(steps):
            if step == resume_at:
                ckpt = copy.deepcopy(opt.state_dict())
                opt = AdEMAMix8bit(params, lr=1.0, stochastic_rounding=True, seed=seed, min_8bit_size=0)
                opt.load_state_dict(ckpt)
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen).to(BF16)
            opt.step()
        return torch.cat([p.detach().float().reshape(-1) for p in params])

    a, b, other = run(1), run(1), run(2)
    assert torch.equal(a, b) and not torch.equal(a, other)
    assert torch.equal(run(1, resume_at=3), a)


def test_arguments_are_checked_as_lowbitadam_checks_them():
    """The same errors (type and message) as LowBitAdam's, and nothing is added on a refusal."""
    fp32 = [torch.nn.Parameter(torch.zeros(3))]
    for kwargs in ({"stochastic_rounding": True}, {"stochastic_rounding": 1}, {"seed": 1.5}, {"seed": True}):
        with pytest.raises((TypeError, ValueError)) as ours:
            Lion8bit(fp32, **kwargs)
        with pytest.raises((TypeError, ValueError)) as theirs:
            AdamW8bit(fp32, **kwargs)
        assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value), kwargs
    opt = Lion8bit(_params([(4,)]), stochastic_rounding=True)
    with pytest.raises(TypeError, match="stochastic_rounding=True writes bf16"):
        opt.add_param_group({"params": fp32})
    assert len(opt.param_groups) == 1


def test_a_step_that_finds_a_non_bf16_parameter_raises_and_changes_nothing():
    """A parameter cast to fp32 after construction: TypeError naming it at step(), before any parameter or state
    of the step (the first parameter's included) changes."""
    params = _params([(64, 80), (30,)])
    opt = Lion8bit(params, lr=1e-2, stochastic_rounding=True)
    _train(opt, params, steps=1)
    before = [p.detach().clone() for p in params], {k: v.clone() for k, v in opt.state[params[0]].items()
                                                    if torch.is_tensor(v)}
    steps = opt.state[params[0]]["step"]
    params[1].data = params[1].data.float()
    for p in params:
        p.grad = torch.ones(p.shape, dtype=p.dtype)
    with pytest.raises(TypeError, match=r"stochastic_rounding=True writes bf16 parameters; parameter 1 of group 0"):
        opt.step()
    assert torch.equal(params[0], before[0][0]) and opt.state[params[0]]["step"] == steps
    for key, value in before[1].items():
        assert torch.equal(opt.state[params[0]][key], value), key


def test_copy_and_pickle_keep_the_rounding_settings():
    opt = RMSprop8bit(_params([(4,)]), stochastic_rounding=True, seed=42)
    for clone in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))):
        assert clone.stochastic_rounding is True and clone.seed == 42


@pytest.mark.parametrize("name", ["Muon8bit", "Lion8bit", "RMSprop8bit-fp8"])
def test_one_rounded_step_is_the_fp32_step_rounded_with_the_element_keys(name):
    """The reference: the same step on fp32 copies of the bf16 parameters (round-to-nearest off: fp32), then
    rounding.stochastic_round_to_bf16 with element_key(seed, 1, index) from global index 0. Muon's rule (not
    elementwise: one fp32 copy of the whole matrix) and Lion's (fused cpu step on chunks) alike; states equal."""
    from adam8lib.rounding import element_key, stochastic_round_to_bf16

    make = {"Muon8bit": lambda ps, **kw: Muon8bit(ps, lr=2e-2, **kw),
            "Lion8bit": lambda ps, **kw: Lion8bit(ps, lr=1e-3, weight_decay=0.1, **kw),
            "RMSprop8bit-fp8": lambda ps, **kw: RMSprop8bit(ps, lr=1e-3, state_format="fp8", **kw)}[name]
    shapes = [(96, 80), (64,)]
    bf = _params(shapes)
    fp = [torch.nn.Parameter(p.detach().float()) for p in bf]
    sr = make(bf, stochastic_rounding=True, seed=21)
    ref = make(fp)
    gen = torch.Generator().manual_seed(2)
    for p, q in zip(bf, fp):
        p.grad = torch.randn(p.shape, generator=gen).to(BF16)
        q.grad = p.grad.float()
    sr.step()
    ref.step()
    for index, (p, q) in enumerate(zip(bf, fp)):
        want = stochastic_round_to_bf16(q.detach(), key=element_key(21, 1, index))
        assert torch.equal(p.detach(), want), index
        assert not torch.equal(want, q.detach().to(BF16))  # some element rounded the other way than nearest
        for key, value in ref.state[q].items():
            assert torch.equal(sr.state[p][key], value) if torch.is_tensor(value) else sr.state[p][key] == value
