"""A state's storage layout as data (issue 52, :mod:`adam8lib.state_layout`): the family's and lesson 07's are two
values of one dataclass, chosen by the class; the core reads everything it stores, checks and saves from it, and
one reference step (the core's) is what lesson 07's chunked step and the formats' reference step are tested against.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from adam8lib import AdamW8bit, Lion8bit, LowBitAdam, Muon8bit
from adam8lib.family import Lion
from adam8lib.formats import get_format
from adam8lib.kernels import reference
from adam8lib.quantized_state import QuantizedStateOptimizer
from adam8lib.rules import AdamWRule, LionRule
from adam8lib.state_layout import ADAM_LAYOUT, FAMILY_LAYOUT, STORED_KEYS, StateLayout


def _steps(opt, params, steps=3, seed=0, bad=False):
    gen = torch.Generator().manual_seed(seed)
    for t in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
            if bad and t == 1:
                p.grad.view(-1)[::97] = float("nan")
        opt.step()


def test_the_two_layouts_are_values_of_one_dataclass():
    assert dataclasses.is_dataclass(StateLayout) and StateLayout.__dataclass_params__.frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        ADAM_LAYOUT.tag_key = "x"
    assert LowBitAdam.layout is ADAM_LAYOUT and Lion8bit.layout is FAMILY_LAYOUT and Muon8bit.layout is FAMILY_LAYOUT
    assert [(s.codes_key, s.scales_key) for s in ADAM_LAYOUT.specs(AdamWRule())] == [("state1", "absmax1"),
                                                                                      ("state2", "absmax2")]
    assert [(s.codes_key, s.scales_key) for s in FAMILY_LAYOUT.specs(AdamWRule())] == [
        ("exp_avg_codes", "exp_avg_absmax"), ("exp_avg_sq_codes", "exp_avg_sq_absmax")]
    assert ADAM_LAYOUT.new_state_order(ADAM_LAYOUT.specs(AdamWRule())) == ("state1", "state2", "absmax1", "absmax2")
    assert (ADAM_LAYOUT.block_layout, FAMILY_LAYOUT.block_layout) == ("local", "global")
    assert (ADAM_LAYOUT.tag_key, FAMILY_LAYOUT.tag_key) == ("qmap_fingerprint", "state_format")
    assert (ADAM_LAYOUT.group_settings, FAMILY_LAYOUT.group_settings) == (("blocksize", "min_8bit_size"), ())
    assert "amsgrad" in ADAM_LAYOUT.flags and "amsgrad" not in FAMILY_LAYOUT.flags
    assert STORED_KEYS == {"state1", "state2", "absmax1", "absmax2"}
    with pytest.raises(ValueError, match="block_layout"):
        StateLayout("bad", block_layout="shard")


def test_the_tag_is_computed_as_the_layout_says():
    eight, four = get_format("8bit"), get_format("4bit")
    from adam8lib.quant import map_fingerprint

    assert ADAM_LAYOUT.format_tag(eight) == map_fingerprint(eight.m.qmap(), eight.v.qmap())  # the maps
    assert ADAM_LAYOUT.format_tag(four) == four.fingerprint()  # no byte-coded maps: the whole format
    assert FAMILY_LAYOUT.format_tag(eight) == f"8bit:{eight.m.fingerprint()}|{eight.v.fingerprint()}"


def test_the_core_reads_every_storage_fact_from_the_layout():
    """No class of the library overrides a method for its storage: the core's properties are the layout's."""
    for cls in (LowBitAdam, Lion8bit, Muon8bit):
        for name in ("state_specs", "_new_state", "format_tag", "_check_group", "_check_param_and_grad",
                     "_check_live_state", "state_dict", "load_state_dict"):
            assert getattr(cls, name) is getattr(QuantizedStateOptimizer, name) or \
                getattr(cls, name).__wrapped__ is getattr(QuantizedStateOptimizer, name).__wrapped__, (cls, name)
    w = torch.nn.Parameter(torch.randn(64, 80))
    adam, lion = AdamW8bit([w]), Lion8bit([w])
    assert (adam.group_settings, adam.block_layout, adam.format_tag_key) == (
        ADAM_LAYOUT.group_settings, "local", "qmap_fingerprint")
    assert (lion.group_settings, lion.block_layout, lion.format_tag_key) == ((), "global", "state_format")


#: A third layout, for a test: Lion's momentum under other keys, tagged under another key, groups that show
#: min_8bit_size; the bits are the family's.
OTHER = StateLayout(name="other", keys=(("exp_avg", ("m8", "m8_scales")),), tag_key="codes_in",
                    group_settings=("min_8bit_size",))


class _LionOtherKeys(Lion8bit):
    layout = OTHER


def test_a_new_layout_is_one_value_and_the_core_follows_it():
    gen = torch.Generator().manual_seed(1)
    w0 = torch.randn(70, 61, generator=gen)
    a, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    ours, family = _LionOtherKeys([a], lr=1e-3), Lion8bit([b], lr=1e-3)
    _steps(ours, [a])
    _steps(family, [b])
    assert torch.equal(a, b)
    assert list(ours.state[a]) == ["step", "m8", "m8_scales"]
    assert torch.equal(ours.state[a]["m8"], family.state[b]["exp_avg_codes"])
    assert ours.param_groups[0]["min_8bit_size"] == 4096 and "blocksize" not in ours.param_groups[0]
    sd = ours.state_dict()
    assert sd["state"][0]["codes_in"] == FAMILY_LAYOUT.format_tag(ours.format)
    twin = _LionOtherKeys([torch.nn.Parameter(w0.clone())], lr=1e-3)
    twin.load_state_dict(sd)
    assert torch.equal(twin.state[twin.param_groups[0]["params"][0]]["m8"], ours.state[a]["m8"])
    with pytest.raises(ValueError, match="not a _LionOtherKeys checkpoint.*family's optimizers"):
        twin.load_state_dict(family.state_dict())  # (its groups do not show min_8bit_size)


def test_foreign_checkpoints_are_named_from_the_layouts():
    w = torch.nn.Parameter(torch.randn(64, 80))
    adam, lion = AdamW8bit([w]), Lion8bit([w])
    _steps(adam, [w], 1)
    _steps(lion, [w], 1)
    assert "family's optimizers" in ADAM_LAYOUT.foreign_origin(lion.state_dict())
    assert "Adam8bit/AdamW8bit/LowBitAdam" in FAMILY_LAYOUT.foreign_origin(adam.state_dict())
    torch_adam = torch.optim.AdamW([w])
    w.grad = torch.randn(64, 80)
    torch_adam.step()
    assert "torch.optim Adam/AdamW" in ADAM_LAYOUT.foreign_origin(torch_adam.state_dict())
    assert "torch.optim" in FAMILY_LAYOUT.foreign_origin(torch_adam.state_dict())
    bnb_like = {"param_groups": [{"optim_bits": 8, "params": [0]}], "state": {0: {"state1": torch.zeros(1)}}}
    assert "bitsandbytes" in ADAM_LAYOUT.foreign_origin(bnb_like)
    assert "bitsandbytes" in FAMILY_LAYOUT.foreign_origin(bnb_like)
    assert ADAM_LAYOUT.foreign_origin(adam.state_dict()) == "" == FAMILY_LAYOUT.foreign_origin(lion.state_dict())


# ------------------------------------------------------------------ one reference step
class _CoreReference(LowBitAdam):
    """LowBitAdam stepping through the core's reference step whatever the format (an overridden ``quantize``, here
    the format's own coding, always takes it): the spec the other steps are tested against."""

    def quantize(self, spec, x, fmt, shape):
        return fmt.quantize(x, shape)


@pytest.mark.parametrize("shape", [(70, 61), (5000,), (3, 1000)])
def test_lesson_07s_chunked_step_is_the_cores_reference_step(shape):
    """:func:`adam8lib.kernels.reference.adam8bit_step` (lesson 07: a chunk of blocks at a time) gives the bits of
    the core's reference step (decode the whole tensor, the AdamW rule, the non-finite rule, encode)."""
    gen = torch.Generator().manual_seed(2)
    w0 = torch.randn(shape, generator=gen)
    a, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    core = _CoreReference([a], lr=1e-2, weight_decay=0.1, backend="torch", min_8bit_size=1)
    assert core.fused_step(a) is None  # the core's reference step
    fmt = core.format
    g = [torch.randn(shape, generator=gen) for _ in range(4)]
    g[2].view(-1)[::53] = float("inf")
    state = {"state1": torch.full((b.numel(),), fmt.m.zero_code(), dtype=torch.uint8),
             "state2": torch.full((b.numel(),), fmt.v.zero_code(), dtype=torch.uint8),
             "absmax1": torch.zeros(-(-b.numel() // 256)), "absmax2": torch.zeros(-(-b.numel() // 256))}
    flat = b.detach().view(-1)
    for t, grad in enumerate(g, start=1):
        a.grad = grad.clone()
        core.step()
        reference.adam8bit_step(flat, grad.reshape(-1), state["state1"], state["state2"], state["absmax1"],
                                state["absmax2"], fmt.m.qmap(), fmt.v.qmap(), step=t, lr=1e-2, beta1=0.9,
                                beta2=0.999, eps=1e-8, weight_decay=0.1, blocksize=256, chunk_size=512)
        assert torch.equal(a, b), t
        for key in state:
            assert torch.equal(core.state[a][key], state[key]), (t, key)


@pytest.mark.parametrize("state_format", ["8bit", "4bit", "4bit-naive", "fp8"])
def test_the_formats_reference_step_is_the_cores_reference_step(state_format):
    """:func:`adam8lib.kernels.reference.format_reference_step`, the spec the fused steps of every format are tested
    against, gives the bits of the core's reference step."""
    gen = torch.Generator().manual_seed(4)
    shape = (40, 130)
    w0 = torch.randn(shape, generator=gen)
    a, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    core = _CoreReference([a], lr=1e-2, weight_decay=0.1, backend="torch", min_8bit_size=1, state_format=state_format)
    fmt = core.format
    state = fmt.new_state(shape, torch.device("cpu"))
    for t in range(1, 5):
        grad = torch.randn(shape, generator=gen)
        if t == 2:
            grad.view(-1)[::41] = float("nan")
        a.grad = grad.clone()
        core.step()
        reference.format_reference_step(b.detach(), grad, state, fmt, shape=shape, step=t, lr=1e-2, beta1=0.9,
                                        beta2=0.999, eps=1e-8, weight_decay=0.1)
        assert torch.equal(a, b), t
        for key in state:
            assert torch.equal(core.state[a][key], state[key]), (t, key)


def test_the_family_and_lesson_07_share_the_reference_step_of_the_rule():
    """The same rule in both layouts: Muon8bit's AdamW group (the family's keys, global blocks) on the core's
    reference step equals LowBitAdam's, bit for bit."""
    gen = torch.Generator().manual_seed(5)
    w0 = torch.randn(64, 80, generator=gen)
    a, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    adam = _CoreReference([a], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, backend="torch")
    muon = Muon8bit([b], lr=1e-2, adamw_betas=(0.9, 0.95), adamw_eps=1e-8, weight_decay=0.1, use_muon=False,
                    backend="torch")
    _steps(adam, [a], 3, bad=True)
    _steps(muon, [b], 3, bad=True)
    assert torch.equal(a, b)
    assert torch.equal(adam.state[a]["state1"], muon.state[b]["exp_avg_codes"])


def test_lion_with_fp32_states_has_no_codes_in_either_layout():
    w = torch.nn.Parameter(torch.randn(64, 80))
    lion = Lion([w])
    _steps(lion, [w], 1)
    assert list(lion.state[w]) == ["step", "exp_avg"] and "state_format" not in lion.state_dict()["state"][0]
    assert LionRule().states == FAMILY_LAYOUT.specs(LionRule())
