"""Gradient release (adam8lib.release): each parameter stepped inside backward equals the ordinary step
bit for bit, for every optimizer class, with schedulers and with a resumed checkpoint; its limits
raise clear errors; accumulation, tied parameters and remove() work."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn

import adam8lib
from adam8lib import (AdEMAMix8bit, Adam8bit, AdamW8bit, Adagrad8bit, Adan8bit, LowBitAdam, Lion8bit, Lion4bit,
                      Muon8bit, RMSprop8bit, SGD8bit)
from adam8lib.release import GradientReleasedError, release_gradients

BF16 = torch.bfloat16

#: name -> (optimizer factory, parameter dtype); every class of the library and torch's AdamW.
OPTIMIZERS = {
    "Adam8bit": (lambda ps: Adam8bit(ps, lr=1e-2), torch.float32),
    "AdamW8bit": (lambda ps: AdamW8bit(ps, lr=1e-2, weight_decay=0.1), torch.float32),
    "AdamW8bit-torch-backend": (lambda ps: AdamW8bit(ps, lr=1e-2, backend="torch"), torch.float32),
    "LowBitAdam-4bit": (lambda ps: LowBitAdam(ps, lr=1e-2, weight_decay=0.1, state_format="4bit"), torch.float32),
    "LowBitAdam-fp8": (lambda ps: LowBitAdam(ps, lr=1e-2, weight_decay=0.1, state_format="fp8"), torch.float32),
    "Lion8bit": (lambda ps: Lion8bit(ps, lr=1e-3, weight_decay=0.1), torch.float32),
    "Lion4bit": (lambda ps: Lion4bit(ps, lr=1e-3), torch.float32),
    "AdEMAMix8bit": (lambda ps: AdEMAMix8bit(ps, lr=1e-2, t_alpha=5, t_beta3=5), torch.float32),
    "Adan8bit": (lambda ps: Adan8bit(ps, lr=1e-2, weight_decay=0.02), torch.float32),
    "RMSprop8bit": (lambda ps: RMSprop8bit(ps, lr=1e-3), torch.float32),
    "Adagrad8bit": (lambda ps: Adagrad8bit(ps, lr=1e-2), torch.float32),
    "SGD8bit": (lambda ps: SGD8bit(ps, lr=1e-2), torch.float32),
    "Muon8bit": (lambda ps: Muon8bit(ps, lr=2e-2), torch.float32),
    "AdamW8bit-bf16-SR": (lambda ps: AdamW8bit(ps, lr=1e-2, stochastic_rounding=True, seed=3), BF16),
    "AdamW4bit-bf16-SR": (lambda ps: LowBitAdam(ps, lr=1e-2, weight_decay=0.1, state_format="4bit",
                                                stochastic_rounding=True, seed=5), BF16),
    "AdamW8bit-bf16-no-SR": (lambda ps: AdamW8bit(ps, lr=1e-2), BF16),
    # the family core with stochastic rounding: the same public index hook (rounding_offset)
    "Lion8bit-bf16-SR": (lambda ps: Lion8bit(ps, lr=1e-3, weight_decay=0.1, stochastic_rounding=True, seed=3), BF16),
    "AdEMAMix8bit-bf16-SR": (lambda ps: AdEMAMix8bit(ps, lr=1e-2, t_alpha=5, t_beta3=5, min_8bit_size=0,
                                                     stochastic_rounding=True, seed=4), BF16),
    "torch.AdamW": (lambda ps: torch.optim.AdamW(ps, lr=1e-2), torch.float32),
}


def mlp(dtype=torch.float32, seed=0):
    """Two matrices with low-bit states (8192 elements each), a LayerNorm and a small head (fp32 states)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                         nn.Linear(64, 4)).to(dtype)


def batches(n, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(96, 64, generator=gen), torch.randint(0, 4, (96,), generator=gen)) for _ in range(n)]


def loss_of(model, x, y, dtype):
    return nn.functional.cross_entropy(model(x.to(dtype)).float(), y)


def train_step(model, opt, x, y, dtype, release):
    """One step: backward, then step and zero_grad; with release, backward alone, which steps and frees every gradient."""
    loss_of(model, x, y, dtype).backward()
    if not release:
        opt.step()
        opt.zero_grad()
    else:
        assert all(p.grad is None for p in model.parameters())  # every gradient stepped and freed in backward


def run(name, steps=4, release=False, scheduler=None, resume_at=None):
    """Train ``steps`` steps; ordinary (backward, step, zero_grad) or released. Returns (model, optimizer)."""
    make, dtype = OPTIMIZERS[name]
    model = mlp(dtype)
    opt = make(model.parameters())
    sched = scheduler(opt) if scheduler else None
    handle = release_gradients(model, opt) if release else None
    for i, (x, y) in enumerate(batches(steps)):
        if i == resume_at:  # a fresh model and optimizer from a checkpoint, then continue
            ckpt = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(),
                                  "sched": sched.state_dict() if sched else None})
            if handle:
                handle.remove()
            model = mlp(dtype, seed=7)
            model.load_state_dict(ckpt["model"])
            opt = make(model.parameters())
            opt.load_state_dict(ckpt["opt"])
            if sched:
                sched = scheduler(opt)
                sched.load_state_dict(ckpt["sched"])
            handle = release_gradients(model, opt) if release else None
        train_step(model, opt, x, y, dtype, release)
        if sched:
            sched.step()
    return model, opt


def assert_same(a, b):
    """Parameters and optimizer state dicts equal bit for bit."""
    (ma, oa), (mb, ob) = a, b
    for (name, pa), pb in zip(ma.named_parameters(), mb.parameters()):
        assert torch.equal(pa, pb), f"parameter {name} differs"
    sa, sb = oa.state_dict(), ob.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys() and len(sa["state"]) == len(list(ma.parameters()))
    for pid in sa["state"]:
        assert sa["state"][pid].keys() == sb["state"][pid].keys()
        for key, va in sa["state"][pid].items():
            vb = sb["state"][pid][key]
            assert torch.equal(va, vb) if torch.is_tensor(va) else va == vb, f"state {pid}/{key} differs"


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_release_equals_the_ordinary_step_bit_for_bit(name):
    ordinary = run(name, steps=4)
    released = run(name, steps=4, release=True)
    assert_same(ordinary, released)
    # and training moved the weights (the comparison is not of two untouched models)
    assert not torch.equal(ordinary[0][0].weight, mlp(OPTIMIZERS[name][1])[0].weight)


@pytest.mark.parametrize("name", ["AdamW8bit", "LowBitAdam-4bit", "Lion8bit", "Muon8bit", "AdamW8bit-bf16-SR",
                                  "torch.AdamW"])
@pytest.mark.parametrize("kind", ["lambda", "onecycle"])
def test_release_follows_a_scheduler(name, kind):
    """scheduler.step() after backward sets the next step's lr (OneCycleLR also cycles betas/momentum)."""
    if kind == "lambda":
        def scheduler(opt):
            return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 3 * s))
    else:
        def scheduler(opt):
            return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-2, total_steps=6, pct_start=0.5,
                                                       cycle_momentum="betas" in opt.defaults)
    ordinary = run(name, steps=5, scheduler=scheduler)
    released = run(name, steps=5, scheduler=scheduler, release=True)
    assert_same(ordinary, released)
    lrs = {g["lr"] for g in released[1].param_groups}
    make, dtype = OPTIMIZERS[name]
    assert lrs != {make(mlp(dtype).parameters()).defaults["lr"]}  # the schedule moved it


@pytest.mark.parametrize("name", ["AdamW8bit", "LowBitAdam-4bit", "AdEMAMix8bit", "AdamW8bit-bf16-SR",
                                  "AdamW4bit-bf16-SR", "Lion8bit-bf16-SR", "torch.AdamW"])
def test_resume_mid_training_equals_an_uninterrupted_run(name):
    uninterrupted = run(name, steps=5, release=True)
    assert_same(uninterrupted, run(name, steps=5, release=True, resume_at=2))
    assert_same(uninterrupted, run(name, steps=5))  # and both equal the ordinary steps


def test_stochastic_rounding_bits_depend_on_the_index_the_hook_reproduces():
    """Without the index offset (every parameter at index 0) the SR bits would differ: the test above
    can fail. Here: two indices give different bits, and the released run keeps the ordinary run's bits."""
    a = run("AdamW8bit-bf16-SR", steps=2)
    b = run("AdamW8bit-bf16-SR", steps=2, release=True)
    assert_same(a, b)
    from adam8lib.rounding import step_generator
    g0 = torch.randint(0, 1 << 16, (8,), generator=step_generator(3, 1, 0))
    g1 = torch.randint(0, 1 << 16, (8,), generator=step_generator(3, 1, 1))
    assert not torch.equal(g0, g1)


def test_accumulate_k_equals_k_backwards_then_one_step():
    k, steps = 3, 2
    data = batches(k * steps)
    ref, ref_opt = mlp(), None
    ref_opt = AdamW8bit(ref.parameters(), lr=1e-2)
    for i, (x, y) in enumerate(data):
        loss_of(ref, x, y, torch.float32).backward()
        if (i + 1) % k == 0:
            ref_opt.step()
            ref_opt.zero_grad()
    model = mlp()
    opt = AdamW8bit(model.parameters(), lr=1e-2)
    handle = release_gradients(model, opt, accumulate=k)
    for i, (x, y) in enumerate(data):
        loss_of(model, x, y, torch.float32).backward()
        freed = all(p.grad is None for p in model.parameters())
        assert freed == ((i + 1) % k == 0)  # kept between micro-batches, freed at the k-th
    handle.remove()
    assert_same((ref, ref_opt), (model, opt))
    assert opt.state_dict()["state"][0]["step"] == steps


def test_a_tied_parameter_is_stepped_once_per_backward():
    torch.manual_seed(0)
    emb = nn.Embedding(50, 96)  # 4800 elements: 8-bit states
    head = nn.Linear(96, 50, bias=False)
    head.weight = emb.weight  # tied

    def make():
        model = nn.ModuleDict({"emb": copy.deepcopy(emb)})
        return model, AdamW8bit(model.parameters(), lr=1e-2)

    tokens = torch.randint(0, 50, (4, 12), generator=torch.Generator().manual_seed(2))
    results = []
    for release in (False, True):
        model, opt = make()
        w = model["emb"].weight
        handle = release_gradients([w, w], opt) if release else None  # given twice: one hook
        for _ in range(3):
            h = model["emb"](tokens)
            logits = h @ w.t()  # the second use of the same tensor
            nn.functional.cross_entropy(logits.reshape(-1, 50), tokens.reshape(-1)).backward()
            if not release:
                opt.step()
                opt.zero_grad()
        results.append((model, opt))
        if handle:
            assert len(handle.params) == 1
    assert_same(*results)
    assert results[1][1].state[results[1][0]["emb"].weight]["step"] == 3


def test_calling_step_yourself_while_released_is_refused_and_remove_restores_it():
    model = mlp()
    opt = AdamW8bit(model.parameters(), lr=1e-2)
    handle = release_gradients(model, opt)
    x, y = batches(1)[0]
    loss_of(model, x, y, torch.float32).backward()
    with pytest.raises(GradientReleasedError, match=r"step\(\) was called while its gradients are released"):
        opt.step()
    assert "live" in repr(handle)
    handle.remove()
    handle.remove()  # twice: nothing
    before = [p.detach().clone() for p in model.parameters()]
    loss_of(model, x, y, torch.float32).backward()
    assert all(p.grad is not None for p in model.parameters())  # no hook any more: gradients stay
    opt.step()  # allowed again
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert "removed" in repr(handle)


def test_clip_grad_norm_on_released_parameters_is_refused():
    model = mlp()
    opt = AdamW8bit(model.parameters(), lr=1e-2)
    other = nn.Linear(3, 3)
    other(torch.ones(1, 3)).sum().backward()
    with release_gradients(model, opt):
        x, y = batches(1)[0]
        loss_of(model, x, y, torch.float32).backward()
        with pytest.raises(GradientReleasedError, match="global norm"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with pytest.raises(GradientReleasedError, match="global norm"):
            torch.nn.utils.clip_grad.clip_grad_norm_(list(model.parameters())[0], 1.0)
        norm = torch.nn.utils.clip_grad_norm_((p for p in other.parameters()), 1e-3)  # not released: clips
        assert norm > 1e-3 and torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in
                                                                    other.parameters()])) <= 1e-3 * 1.0001
    model[0].weight.grad = torch.ones_like(model[0].weight)  # after remove (the with block): clipping works
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    assert total == pytest.approx(8192 ** 0.5, rel=1e-6)  # the ones of one 128 x 64 gradient


def test_bad_arguments_raise_clear_errors():
    model = mlp()
    opt = AdamW8bit(model.parameters(), lr=1e-2)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        release_gradients(model, "adam")
    with pytest.raises(ValueError, match="accumulate must be an int >= 1"):
        release_gradients(model, opt, accumulate=0)
    with pytest.raises(ValueError, match="accumulate must be an int >= 1"):
        release_gradients(model, opt, accumulate=True)
    with pytest.raises(TypeError, match="nn.Module or an iterable"):
        release_gradients(3, opt)
    with pytest.raises(ValueError, match="not in the optimizer"):
        release_gradients(list(model.parameters()) + [nn.Parameter(torch.zeros(3))], opt)
    with pytest.raises(ValueError, match="are not released"):
        release_gradients(list(model.parameters())[:2], opt)
    with pytest.raises(ValueError, match="nothing to release"):
        release_gradients([torch.zeros(3)], opt)
    handle = release_gradients(model, opt)
    with pytest.raises(ValueError, match="released already"):
        release_gradients(model, AdamW8bit(model.parameters()))
    handle.remove()
    release_gradients(model, opt).remove()  # after remove(), releasing again is fine


def test_frozen_parameters_are_skipped():
    model = mlp()
    model[0].weight.requires_grad_(False)
    opt = AdamW8bit([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    handle = release_gradients(model, opt)
    assert len(handle.params) == len(list(model.parameters())) - 1
    x, y = batches(1)[0]
    loss_of(model, x, y, torch.float32).backward()
    assert len(opt.state) == len(handle.params)
    handle.remove()


def test_exported_from_the_package():
    assert adam8lib.release_gradients is release_gradients
    assert adam8lib.GradientReleasedError is GradientReleasedError


def test_two_param_groups_with_stochastic_rounding_keep_every_index():
    """Decay and no-decay groups (make_param_groups): a parameter's stochastic-rounding index counts the
    parameters of the groups before its own, as in the full step."""
    from adam8lib import make_param_groups

    results = []
    for release in (False, True):
        model = mlp(BF16)
        opt = AdamW8bit(make_param_groups(model, weight_decay=0.1), lr=1e-2, stochastic_rounding=True, seed=11)
        assert len(opt.param_groups) == 2 and all(len(g["params"]) > 1 for g in opt.param_groups)
        handle = release_gradients(model, opt) if release else None
        for x, y in batches(3):
            loss_of(model, x, y, BF16).backward()
            if not release:
                opt.step()
                opt.zero_grad()
        if handle:
            handle.remove()
        results.append((model, opt))
    assert_same(*results)


@pytest.mark.parametrize("name", ["AdamW8bit-bf16-SR", "AdamW4bit-bf16-SR"])
def test_stochastic_rounding_release_does_one_update_per_parameter(name, monkeypatch):
    """One backward steps n parameters with n per-parameter updates, each with its full-step index (no
    placeholder updates before it: those made n**2/2 of them), and no state besides the parameters'."""
    calls = []
    original = LowBitAdam._update

    def counting(self, group, p, param, grad, rule, fused=None, index=0):
        calls.append((p.numel(), index + self.rounding_offset))  # the public hook shifts the index
        return original(self, group, p, param, grad, rule, fused, index)

    monkeypatch.setattr(LowBitAdam, "_update", counting)
    make, dtype = OPTIMIZERS[name]
    model = mlp(dtype)
    opt = make(model.parameters())
    handle = release_gradients(model, opt)
    x, y = batches(1)[0]
    loss_of(model, x, y, dtype).backward()
    n = len(list(model.parameters()))
    assert len(calls) == n and all(size > 0 for size, _ in calls)
    assert sorted(index for _, index in calls) == list(range(n))  # each index once: the full step's
    assert len(opt.state) == n and "_update" not in vars(opt) and "rounding_offset" not in vars(opt)
    handle.remove()


def _clipped_run(name, max_norm, release, steps=3):
    """Train with global-norm clipping: ordinary (backward, clip_grad_norm_, step) or released
    (handle.backward_clipped). Returns (model, optimizer, total norms)."""
    make, dtype = OPTIMIZERS[name]
    model = mlp(dtype)
    opt = make(model.parameters())
    handle = release_gradients(model, opt) if release else None
    norms = []
    for x, y in batches(steps):
        loss = loss_of(model, x, y, dtype)
        if release:
            norms.append(handle.backward_clipped(loss, max_norm))
            assert all(p.grad is None for p in model.parameters())
        else:
            loss.backward()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
            opt.step()
            opt.zero_grad()
    if handle:
        handle.remove()
    return model, opt, norms


@pytest.mark.parametrize("name", ["AdamW8bit", "AdamW8bit-bf16-SR", "AdamW4bit-bf16-SR", "LowBitAdam-4bit",
                                  "torch.AdamW", "Lion8bit"])
@pytest.mark.parametrize("max_norm", [0.05, 1e3])
def test_backward_clipped_equals_clip_grad_norm_bit_for_bit(name, max_norm):
    """Two backward passes (norms, then scaled steps) give clip_grad_norm_'s numbers exactly, whether the
    clip acts (0.05: every step is scaled) or not (1e3)."""
    a_model, a_opt, a_norms = _clipped_run(name, max_norm, release=False)
    b_model, b_opt, b_norms = _clipped_run(name, max_norm, release=True)
    assert_same((a_model, a_opt), (b_model, b_opt))
    assert all(torch.equal(x, y) for x, y in zip(a_norms, b_norms))
    if max_norm < 1:
        assert all(float(n) > max_norm for n in a_norms)  # the clip did act: the test can fail


def test_backward_clipped_frees_every_gradient_in_both_passes():
    """Neither pass keeps a gradient: a hook registered after the release's sees, in both passes, every
    parameter without one (its own freed, the earlier ones too), and the step did happen."""
    model = mlp()
    opt = AdamW8bit(model.parameters(), lr=1e-2)
    handle = release_gradients(model, opt)
    alive = []
    params = list(model.parameters())
    for p in params:
        p.register_post_accumulate_grad_hook(lambda q: alive.append(sum(r.grad is not None for r in params)))
    x, y = batches(1)[0]
    before = [p.detach().clone() for p in params]
    handle.backward_clipped(loss_of(model, x, y, torch.float32), 1.0)
    assert len(alive) == 2 * len(params) and max(alive) == 0
    assert all(not torch.equal(b, p) for b, p in zip(before, params)) and len(opt.state) == len(params)
    handle.remove()


def test_backward_clipped_refuses_what_it_cannot_do():
    model = mlp()
    opt = AdamW8bit(model.parameters(), lr=1e-2)
    x, y = batches(1)[0]
    with release_gradients(model, opt, accumulate=2) as handle:
        with pytest.raises(ValueError, match="accumulate=1"):
            handle.backward_clipped(loss_of(model, x, y, torch.float32), 1.0)
    handle = release_gradients(model, opt)
    loss = loss_of(model, x, y, torch.float32)
    for bad in (0, -1.0, True, "1"):
        with pytest.raises(ValueError, match="max_norm"):
            handle.backward_clipped(loss, bad)
    with pytest.raises(TypeError, match="loss"):
        handle.backward_clipped(loss.detach(), 1.0)
    assert all(p.grad is None for p in model.parameters()) and not opt.state  # nothing ran
    handle.remove()
    with pytest.raises(GradientReleasedError, match="removed"):
        handle.backward_clipped(loss, 1.0)


def test_the_lm_benchmark_s_release_runs_are_the_ordinary_runs_bit_for_bit():
    """bench/convergence.py bill (packaged for lesson 14 and the README): on every seed, bf16 + SR + 8-bit with
    gradient release (clipping by backward_clipped) has the same loss curve and final loss as without."""
    import json
    from pathlib import Path

    result = json.loads((Path(adam8lib.__file__).parent / "course" / "results" / "whole_bill_lm.json").read_text())
    pair = result["pairs"]["bf16_sr_8bit_release_vs_bf16_sr_8bit"]
    assert pair["bit_identical"] == [True] * len(result["seeds"]) and len(result["seeds"]) >= 8
    runs = {(r["optimizer"], r["seed"]): r for r in result["runs"]}
    assert all(runs["bf16_sr_8bit_release", s]["valid_loss"] == runs["bf16_sr_8bit", s]["valid_loss"]
               for s in result["seeds"])
    assert all(result["optimizers"][k]["n"] == len(result["seeds"]) for k in result["optimizers"])


def test_the_benchmark_builds_the_bill_s_rows():
    """bench/convergence.py's factories: bf16 weights with SR for the release rows, a 24-bit master over fp32
    weights with 4-bit states (the parameters become bf16, their corrections int8)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import convergence

    for kind in convergence.RELEASE:
        model = mlp()
        groups = [{"params": list(model.parameters()), "weight_decay": 0.0}]
        opt = convergence.make_optimizer(kind, groups, 1e-3, (0.9, 0.98))
        dtypes = {p.dtype for p in model.parameters()}
        assert dtypes == {BF16}, (kind, dtypes)
        if kind.startswith("master"):
            assert not opt.stochastic_rounding
            assert opt.compressed_master.bits == (8 if kind.startswith("master24") else 16)
        else:
            assert opt.stochastic_rounding
        assert opt.format.name == ("8bit" if "8bit" in kind else "4bit")


# ---------------------------------------------------------------------- release in real loops (issue 54)
def _toggle_run(name, release, *, schedule, build="all", steps=6):
    """Train ``steps`` steps with ``requires_grad`` toggled before some of them: ``schedule`` maps a step
    index to ``{module index: requires_grad}`` (progressive unfreezing, freezing). ``build``: "all" (every
    parameter in the optimizer from the start, frozen ones too) or "add_group" (the optimizer starts with the
    trainable ones and each unfrozen module's parameters come in by ``add_param_group``)."""
    make, dtype = OPTIMIZERS[name]
    model = mlp(dtype)
    for i, flag in schedule.get(-1, {}).items():
        model[i].requires_grad_(flag)
    opt = make([p for p in model.parameters() if p.requires_grad or build == "all"])
    handle = release_gradients(model, opt) if release else None
    for step, (x, y) in enumerate(batches(steps)):
        for i, flag in schedule.get(step, {}).items():
            model[i].requires_grad_(flag)
            known = {id(q) for g in opt.param_groups for q in g["params"]}
            if flag and build == "add_group" and id(model[i].weight) not in known:
                opt.add_param_group({"params": list(model[i].parameters())})
        train_step(model, opt, x, y, dtype, release)
    if handle:
        handle.remove()
    return model, opt


#: frozen at the start (-1), unfrozen at step 2 (the first layer) and 3 (the head); the LayerNorm frozen at 4
UNFREEZE = {-1: {0: False, 5: False}, 2: {0: True}, 3: {5: True}, 4: {1: False}}


@pytest.mark.parametrize("name", ["AdamW8bit", "AdamW8bit-bf16-SR", "AdamW4bit-bf16-SR", "Lion8bit", "torch.AdamW"])
def test_a_parameter_unfrozen_after_release_is_stepped_as_in_an_ordinary_loop(name):
    """Progressive unfreezing: modules frozen when release_gradients() is called and unfrozen later are
    stepped from then on, and a module frozen later simply stops; the same bits as the ordinary loop (with
    stochastic rounding too: each parameter's index is that of the full step at each backward)."""
    ordinary = _toggle_run(name, False, schedule=UNFREEZE)
    released = _toggle_run(name, True, schedule=UNFREEZE)
    assert_same(ordinary, released)
    model, opt = released
    steps = [opt.state[p]["step"] for p in model.parameters()]
    if torch.is_tensor(steps[0]):
        steps = [int(s) for s in steps]
    assert steps == [4, 4, 4, 4, 6, 6, 3, 3]  # unfrozen at 2; the LayerNorm frozen at 4; the head unfrozen at 3


@pytest.mark.parametrize("name", ["AdamW8bit", "AdamW8bit-bf16-SR", "torch.AdamW"])
def test_parameters_added_to_the_optimizer_after_release_are_stepped(name):
    """The other unfreezing recipe: the optimizer gets the unfrozen module's parameters by add_param_group."""
    schedule = {-1: {0: False, 5: False}, 2: {0: True}, 3: {5: True}}
    assert_same(_toggle_run(name, False, schedule=schedule, build="add_group"),
                _toggle_run(name, True, schedule=schedule, build="add_group"))


def test_the_optimizer_s_frozen_parameters_are_released_and_stay_frozen():
    model = mlp()
    model[0].requires_grad_(False)
    opt = AdamW8bit(model.parameters(), lr=1e-2)
    handle = release_gradients(model, opt)
    assert handle.releases(model[0].weight) and len(handle.params) == len(list(model.parameters()))
    assert not model[0].weight.requires_grad  # registering its hook left it frozen
    handle.remove()


@pytest.mark.parametrize("name, key, bad, good", [("AdamW8bit", "maximize", True, False),
                                                  ("Lion8bit", "betas", (0.9, 1.5), (0.9, 0.99))])
def test_a_bad_setting_is_reported_in_its_own_param_group(name, key, bad, good):
    """The optimizer's check names the group it found the setting in; under release, the same group (the
    hook used to show the optimizer one group at a time: every message said 'param group 0')."""
    from adam8lib import make_param_groups

    x, y = batches(1)[0]
    messages = []
    for release in (False, True):
        model = mlp()
        opt = OPTIMIZERS[name][0](make_param_groups(model, weight_decay=0.1))
        opt.param_groups[1][key] = bad
        handle = release_gradients(model, opt) if release else None
        with pytest.raises(ValueError, match=r"param group 1\b") as err:
            loss_of(model, x, y, torch.float32).backward()
            opt.step()
        messages.append(str(err.value))
        assert "param group 0" not in str(err.value)
        assert not opt.state or all(s["step"] == 0 for s in opt.state.values())  # nothing was stepped
        if handle:
            assert handle.interrupted is None  # nothing half-stepped: nothing to say
            assert all(p.grad is None for p in model.parameters())  # this backward's gradients dropped
            opt.param_groups[1][key] = good
            loss_of(model, x, y, torch.float32).backward()  # fixed: the next backward steps everything
            assert {s["step"] for s in opt.state.values()} == {1}
            handle.remove()
    assert messages[0] == messages[1]


def test_a_bad_setting_under_release_names_the_parameter_being_stepped():
    model = mlp()
    opt = AdamW8bit([{"params": list(model[0].parameters())},
                     {"params": list(model[1].parameters()) + list(model[3].parameters())
                      + list(model[5].parameters())}], lr=1e-2)
    opt.param_groups[1]["maximize"] = True
    handle = release_gradients(model, opt)
    x, y = batches(1)[0]
    with pytest.raises(ValueError) as err:
        loss_of(model, x, y, torch.float32).backward()
    assert "gradient release" in "".join(getattr(err.value, "__notes__", []))
    assert re.search(r"the step of '5\.(weight|bias)' \(shape .*, param group 1\)", "".join(err.value.__notes__))
    handle.remove()


class _FailOnce(torch.autograd.Function):
    """The identity, whose backward raises when ``armed`` (a failure partway through backward: out of memory,
    a NaN found by anomaly detection, a hook that raises)."""
    armed = False

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if _FailOnce.armed:
            raise RuntimeError("backward failed partway")
        return grad


class _Two(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = nn.Linear(64, 128), nn.Linear(128, 4)

    def forward(self, x):
        return self.second(_FailOnce.apply(torch.relu(self.first(x))))


def _steps(opt, model):
    return [int(opt.state[p]["step"]) if p in opt.state else 0 for p in model.parameters()]


def test_a_backward_that_raises_partway_says_exactly_what_was_stepped():
    """The second layer is stepped before the failure, the first never gets its gradient: the exception says
    which were stepped, the handle records it (handle.interrupted), no gradient is left half-summed, and the
    next backward is refused until handle.resume(): a loop that catches the error goes on knowingly."""
    model = _Two()
    opt = AdamW8bit(model.parameters(), lr=1e-2)
    handle = release_gradients(model, opt)
    (x, y), (x2, y2) = batches(2)
    nn.functional.cross_entropy(model(x), y).backward()
    assert _steps(opt, model) == [1, 1, 1, 1]
    _FailOnce.armed = True
    try:
        with pytest.raises(RuntimeError, match="backward failed partway") as err:
            nn.functional.cross_entropy(model(x2), y2).backward()
    finally:
        _FailOnce.armed = False
    assert _steps(opt, model) == [1, 1, 2, 2]
    note = "".join(getattr(err.value, "__notes__", []))
    assert "2 of 4 parameters" in note and "'second.weight'" in note and "'second.bias'" in note
    assert "'first.weight'" in note and "resume()" in note
    record = handle.interrupted
    assert set(record.stepped) == {"second.weight", "second.bias"}  # (in the order they were stepped)
    assert record.not_stepped == ("first.weight", "first.bias") and record.dropped == ()
    assert all(p.grad is None for p in model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(GradientReleasedError, match=r"last backward raised.*'second.weight'.*resume\(\)"):
        nn.functional.cross_entropy(model(x), y).backward()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # refused before anything ran
    assert all(p.grad is None for p in model.parameters())
    assert handle.resume() is record and handle.interrupted is None
    nn.functional.cross_entropy(model(x), y).backward()
    assert _steps(opt, model) == [2, 2, 3, 3]
    handle.remove()


def test_a_backward_that_raises_before_any_step_leaves_nothing_to_resume():
    model = _Two()
    opt = AdamW8bit(model.parameters(), lr=1e-2)
    handle = release_gradients(model, opt)
    x, y = batches(1)[0]
    out = model(x)
    with pytest.raises(RuntimeError):
        out.sum().backward(torch.ones(3))  # a wrong gradient shape: raises before any parameter's gradient
    assert handle.interrupted is None and not opt.state
    nn.functional.cross_entropy(out, y).backward()
    assert _steps(opt, model) == [1, 1, 1, 1]
    handle.remove()


def test_an_interrupted_accumulation_window_starts_again_and_says_what_was_dropped():
    model = _Two()
    opt = AdamW8bit(model.parameters(), lr=1e-2)
    handle = release_gradients(model, opt, accumulate=2)
    data = batches(4)
    nn.functional.cross_entropy(model(data[0][0]), data[0][1]).backward()  # micro-batch 1 of 2: summed
    assert all(p.grad is not None for p in model.parameters())
    _FailOnce.armed = True
    try:
        with pytest.raises(RuntimeError, match="partway"):
            nn.functional.cross_entropy(model(data[1][0]), data[1][1]).backward()  # 2 of 2: fails partway
    finally:
        _FailOnce.armed = False
    record = handle.interrupted
    assert set(record.stepped) == {"second.weight", "second.bias"} and record.dropped == ("first.weight", "first.bias")
    assert all(p.grad is None for p in model.parameters())
    handle.resume()
    for x, y in data[2:]:  # a whole new window: everything stepped at its end
        nn.functional.cross_entropy(model(x), y).backward()
    assert _steps(opt, model) == [1, 1, 2, 2] and all(p.grad is None for p in model.parameters())
    handle.remove()


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_activation_checkpointing_is_not_an_interruption(use_reentrant):
    """Reentrant checkpointing runs a backward inside the backward (the parameters of the checkpointed part get
    their gradients there): one backward all the same, the same bits as without release."""
    from torch.utils.checkpoint import checkpoint

    results = []
    for release in (False, True):
        model = mlp()
        opt = AdamW8bit(model.parameters(), lr=1e-2)
        handle = release_gradients(model, opt) if release else None
        for x, y in batches(3):
            x = x.clone().requires_grad_(use_reentrant)  # (reentrant checkpointing needs an input that does)
            h = checkpoint(model[:3], x, use_reentrant=use_reentrant)
            nn.functional.cross_entropy(model[3:](h), y).backward()
            if not release:
                opt.step()
                opt.zero_grad()
        if handle:
            assert handle.interrupted is None
            handle.remove()
        results.append((model, opt))
    assert_same(*results)


def test_the_backward_guard_goes_with_the_last_handle():
    import gc

    from adam8lib import release

    gc.collect()
    for leftover in list(release._LIVE):  # handles earlier tests left live (their models are alive still)
        leftover.remove()
    original = torch.autograd.backward
    assert original is not release._guarded_backward
    model = mlp()
    a = release_gradients(model[0], AdamW8bit(model[0].parameters()))
    b = release_gradients(model[1], AdamW8bit(model[1].parameters()))
    assert torch.autograd.backward is not original
    a.remove()
    assert torch.autograd.backward is not original
    b.remove()
    assert torch.autograd.backward is original


@pytest.mark.parametrize("make", [
    lambda groups: torch.optim.AdamW(groups, lr=1e-2),
    lambda groups: torch.optim.Adam(groups, lr=1e-2, amsgrad=True),
    lambda groups: torch.optim.SGD(groups, lr=1e-2, momentum=0.9, nesterov=True),
    lambda groups: torch.optim.RMSprop(groups, lr=1e-3, momentum=0.5),
    lambda groups: torch.optim.Adagrad(groups, lr=1e-2),
    lambda groups: Lion8bit(groups, lr=1e-3),
], ids=["AdamW", "Adam-amsgrad", "SGD-nesterov", "RMSprop", "Adagrad", "Lion8bit"])
def test_every_group_shown_the_others_empty_keeps_torch_s_optimizers_bit_identical(make):
    """The hook shows the optimizer every param group, the others with no parameters: torch's optimizers
    step a group without parameters as nothing, so the bits stay the ordinary step's."""
    results = []
    for release in (False, True):
        model = mlp()
        params = list(model.parameters())
        opt = make([{"params": params[:3]}, {"params": params[3:], "lr": 3e-3}])
        handle = release_gradients(model, opt) if release else None
        for x, y in batches(3):
            loss_of(model, x, y, torch.float32).backward()
            if not release:
                opt.step()
                opt.zero_grad()
        if handle:
            handle.remove()
        results.append((model, opt))
    assert_same(*results)
