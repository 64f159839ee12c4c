"""Adam on the one core (issue 35): the low-bit Adams are the AdamW rule on QuantizedStateOptimizer, with no
step, stochastic rounding, FSDP2 or checkpoint code of their own; what they keep of their own forms goes through
the core's hooks, and each hook does what it says."""

from __future__ import annotations

import inspect

import pytest
import torch

from adam8lib import Adam4bit, Adam8bit, AdamFp8, AdamW4bit, AdamW8bit, AdamWFp8, LowBitAdam, Lion8bit, Muon8bit
from adam8lib.quantized_state import QuantizedStateOptimizer
from adam8lib.rules.adamw import AdamWRule
from adam8lib.variants import Adam8bitVariant
from tests._random_steps import random_steps

ADAMS = [LowBitAdam, Adam8bit, AdamW8bit, Adam4bit, AdamW4bit, AdamFp8, AdamWFp8, Adam8bitVariant]
#: What the core does and no class of the library redoes: the step with its checks, batches, stochastic
#: rounding and collectives; the states; the checkpoints and their DCP forms.
CORE = ["step", "_check_and_update", "_run_batched", "_update", "_step_tensor", "_encode",
        "_ready_state", "init_state", "add_param_group", "state_dict", "load_state_dict", "_fused_for",
        "_needs_reduction", "fused_step"]


@pytest.mark.parametrize("cls", ADAMS, ids=lambda c: c.__name__)
def test_the_low_bit_adams_are_the_adamw_rule_on_the_one_core(cls):
    assert issubclass(cls, QuantizedStateOptimizer)
    assert cls.rule == AdamWRule()
    # (torch.optim wraps a class's step in its profiling hook once an instance exists: compare what is wrapped)
    own = [name for name in CORE
           if inspect.unwrap(getattr(cls, name)) is not inspect.unwrap(getattr(QuantizedStateOptimizer, name))]
    assert own == []


def test_the_family_and_the_adams_share_one_step_for_one_rule():
    """Muon8bit's AdamW group (the family's default keys, global blocks) and AdamW8bit (lesson 07's keys, groups
    that show blocksize): the same rule, format and backend give the same bits, batched or not."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(40, 130), (5000,), (17,), (300,)]
    a = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    adam = AdamW8bit(a, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    muon = Muon8bit(b, lr=1e-2, adamw_betas=(0.9, 0.95), adamw_eps=1e-8, weight_decay=0.1, use_muon=False)
    for t in range(4):
        for p, q in zip(a, b):
            g = torch.randn(p.shape, generator=gen)
            p.grad, q.grad = g, g.clone()
        adam.step()
        muon.step()
        for i, (p, q) in enumerate(zip(a, b)):
            assert torch.equal(p, q), (t, i)
    keys = lambda opt, p: [k for k in opt.state[p] if k != "step"]
    assert keys(adam, a[0]) == ["state1", "state2", "absmax1", "absmax2"]  # lesson 07's order
    assert keys(muon, b[0]) == ["exp_avg_codes", "exp_avg_absmax", "exp_avg_sq_codes", "exp_avg_sq_absmax"]
    for ours, theirs in zip(muon.state_specs(AdamWRule()), adam.state_specs(AdamWRule())):
        for key in ("codes_key", "scales_key"):
            assert torch.equal(muon.state[b[0]][getattr(ours, key)], adam.state[a[0]][getattr(theirs, key)])


def test_group_settings_are_shown_in_groups_only_where_a_class_keeps_them():
    w, v = torch.nn.Parameter(torch.randn(70, 80)), torch.nn.Parameter(torch.randn(5000))
    adam = AdamW8bit([{"params": [w]}, {"params": [v], "min_8bit_size": 10_000}])
    assert [g["blocksize"] for g in adam.param_groups] == [256, 256]
    adam.init_state()
    assert "state1" in adam.state[w] and "exp_avg" in adam.state[v]  # min_8bit_size per group
    assert adam.quantized(w) and not adam.quantized(v)
    with pytest.raises(ValueError, match="sets 'min_8bit_size': it is a setting of the whole Lion8bit"):
        Lion8bit([{"params": [v], "min_8bit_size": 10_000}])
    with pytest.raises(ValueError, match="blocksize=512, this AdamW8bit stores its states in blocks of 256"):
        AdamW8bit([{"params": [v], "blocksize": 512}])


def test_backend_torch_on_the_8bit_layout_is_the_chunked_map_code_step():
    """Lesson 07's step in plain PyTorch (a chunk of blocks at a time), not a decode of whole tensors, and the
    bits of the C++ kernel."""
    from adam8lib import kernels

    w = torch.nn.Parameter(torch.randn(64, 80))
    assert Adam8bit([w], backend="torch").fused_step(w) is kernels.map_codes_reference_step()
    assert Adam4bit([w], backend="torch").fused_step(w) is None  # the core's reference step
    twins = [torch.nn.Parameter(w.detach().clone()) for _ in range(2)]
    opts = [AdamW8bit([twins[0]], backend="torch"), AdamW8bit([twins[1]], backend="cpu")]
    for t in range(3):
        g = torch.randn(64, 80)
        for p, opt in zip(twins, opts):
            p.grad = g.clone()
            opt.step()
    assert torch.equal(twins[0], twins[1])
    for key in ("state1", "state2", "absmax1", "absmax2"):
        assert torch.equal(opts[0].state[twins[0]][key], opts[1].state[twins[1]][key]), key


# ---------------------------------------------------------------------- what the old class did, kept (review of the re-base)
def _steps(opt, params, steps=3, seed=1):
    random_steps(opt, params, steps, seed)


@pytest.mark.parametrize("make", [AdamW8bit, Adam4bit, AdamWFp8, Lion8bit], ids=lambda c: c.__name__)
def test_a_non_contiguous_parameter_takes_the_fused_step_on_a_contiguous_copy(make):
    """A channels_last or transposed weight runs the kernel (not the whole-tensor reference step: ~15x slower,
    ~10x the memory), with the bits of its contiguous twin."""
    base = torch.randn(96, 80)
    a = torch.nn.Parameter(base.clone())
    b = torch.nn.Parameter(base.t().contiguous().t())  # the same values, transposed strides
    assert not b.is_contiguous()
    opt_a, opt_b = make([a]), make([b])
    assert opt_b.fused_step(b) is not None and opt_b.fused_step(b).backend == "cpu"
    _steps(opt_a, [a])
    _steps(opt_b, [b])
    assert torch.equal(a, b) and not b.is_contiguous()
    for key, value in opt_a.state[a].items():
        assert (value == opt_b.state[b][key]) if isinstance(value, int) else torch.equal(value, opt_b.state[b][key])


def test_a_state_keeps_its_kind_when_a_groups_min_8bit_size_changes():
    """A state made (or loaded) before ``min_8bit_size`` changed steps as it is, as it did before the re-base."""
    p = torch.nn.Parameter(torch.randn(5000))
    opt = AdamW8bit([p])
    _steps(opt, [p], steps=1)
    opt.param_groups[0]["min_8bit_size"] = 10**6
    _steps(opt, [p], steps=1)
    assert opt.state[p]["step"] == 2 and "state1" in opt.state[p]
    again = AdamW8bit([p])
    again.load_state_dict(opt.state_dict())  # a checkpoint whose group says fp32, with 8-bit states
    _steps(again, [p], steps=1)
    assert again.state[p]["step"] == 3 and "state1" in again.state[p]


def test_the_maps_a_step_uses_are_the_ones_its_checkpoints_name():
    """``opt.qmap1 = ...`` changes the codes' map: the step, the saved fingerprint and a pickle all follow it."""
    import pickle

    from adam8lib.quant import linear_map

    def run(custom):
        p = torch.nn.Parameter(torch.linspace(-1, 1, 5000))
        opt = AdamW8bit([p])
        if custom:
            opt.qmap1 = linear_map(signed=True)
        _steps(opt, [p])
        return p, opt

    (a, plain), (b, custom) = run(False), run(True)
    assert not torch.equal(a, b)
    assert torch.equal(custom.format.m.qmap(), linear_map(signed=True)) and custom.qmap1 is custom.format.m.qmap()
    tags = [o.state_dict()["state"][0]["qmap_fingerprint"] for o in (plain, custom)]
    assert tags[0] != tags[1]
    copy = pickle.loads(pickle.dumps(custom))
    assert torch.equal(copy.qmap1, linear_map(signed=True)) and copy.state_dict()["state"][0]["qmap_fingerprint"] == tags[1]
    with pytest.raises(ValueError, match="'4bit' does not code bytes into two maps"):
        Adam4bit([a]).qmap1 = linear_map(signed=True)


def test_states_are_made_in_the_parameters_order():
    big, small = torch.nn.Parameter(torch.randn(5000)), torch.nn.Parameter(torch.randn(10))
    opt = AdamW8bit([big, small])
    _steps(opt, [big, small], steps=1)
    assert list(opt.state_dict()["state"]) == [0, 1] and list(opt.state) == [big, small]


def test_auto_is_looked_up_again_when_the_auto_order_changes(monkeypatch):
    from adam8lib import kernels

    w = torch.nn.Parameter(torch.randn(64, 80))
    opt = Adam4bit([w])
    assert opt.fused_step(w) is not None
    monkeypatch.setattr(kernels, "AUTO_ORDER", ("torch",))
    assert opt.fused_step(w) is None


def test_expected_state_is_a_plain_dict_and_the_variant_pickles():
    import copy
    import pickle

    w = torch.nn.Parameter(torch.randn(64, 80))
    opt = AdamW8bit([w])
    expected = opt.expected_state(w, opt.rule)
    expected["x"] = None  # a dict of the caller's: changing it changes nothing of the optimizer's
    assert "x" not in opt.expected_state(w, opt.rule) and copy.deepcopy(opt.expected_state(w, opt.rule))
    variant = Adam8bitVariant([w], quantization="linear", blockwise=False)
    _steps(variant, [w], steps=1)
    for twin in (copy.deepcopy(variant), pickle.loads(pickle.dumps(variant))):
        assert (twin.quantization, twin.blockwise, twin.keep_sign) == ("linear", False, True)
        assert twin.state[next(iter(twin.state))]["absmax1"].numel() == 1


def test_a_family_checkpoint_loaded_into_adam8bit_is_named():
    w = torch.nn.Parameter(torch.randn(64, 80))
    lion = Lion8bit([w])
    _steps(lion, [w], steps=1)
    with pytest.raises(ValueError, match="family's optimizers, e.g. Lion8bit"):
        AdamW8bit([w]).load_state_dict(lion.state_dict())
