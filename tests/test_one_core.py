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

ADAMS = [LowBitAdam, Adam8bit, AdamW8bit, Adam4bit, AdamW4bit, AdamFp8, AdamWFp8, Adam8bitVariant]
#: What the core does and no class of the library redoes: the step with its checks, batches, stochastic
#: rounding and collectives; the states; the checkpoints and their DCP forms.
CORE = ["step", "_check_and_update", "_run_batched", "_update", "_rounding_chunks", "_step_tensor", "_encode",
        "_ready_state", "init_state", "add_param_group", "state_dict", "load_state_dict", "_checked_checkpoint",
        "_local_state", "_fused_for", "_needs_reduction", "fused_step"]


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
