"""The quantized-state core reproduces the library's Adam in every state format, bit for bit: 8-bit is data.

The AdamW rule (:class:`adam8lib.rules.AdamWRule`) on :class:`adam8lib.quantized_state.QuantizedStateOptimizer`
with the ``"8bit"``, ``"4bit"``, ``"4bit-naive"`` and ``"fp8"`` formats gives LowBitAdam's reference step's
parameters, codes and scales; and a checkpoint written by main before the core
(tests/fixtures/checkpoints/main_checkpoints.pt), its keys renamed, resumes on the core bit for bit. That is
the ground a later port of Adam8bit onto the core stands on (Adam's classes still run their own path).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from adam8lib import optim
from adam8lib.quantized_state import QuantizedStateOptimizer
from adam8lib.rules import AdamWRule, StateSpec

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "checkpoints"
sys.path.insert(0, str(FIXTURES))

import build_main_checkpoints as builder  # noqa: E402

from tests import _continuations as cont  # noqa: E402

#: Adam8bit's state keys -> the core's (the AdamW rule's states exp_avg and exp_avg_sq)
ADAM_KEYS = {"state1": "exp_avg_codes", "absmax1": "exp_avg_absmax", "state2": "exp_avg_sq_codes",
             "absmax2": "exp_avg_sq_absmax"}


class AdamWOnCore(QuantizedStateOptimizer):
    rule = AdamWRule()

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, **kwargs):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay), **kwargs)


@pytest.mark.parametrize("state_format", ["8bit", "4bit", "4bit-naive", "fp8"])
def test_adamw_rule_on_the_core_equals_lowbit_adam_in_every_format(state_format):
    gen = torch.Generator().manual_seed(0)
    w0 = [torch.randn(70, 61, generator=gen), torch.randn(61, generator=gen)]
    ours = [torch.nn.Parameter(t.clone()) for t in w0]
    ref = [torch.nn.Parameter(t.clone()) for t in w0]
    opt = AdamWOnCore(ours, lr=1e-2, weight_decay=0.1, state_format=state_format)
    lowbit = optim.LowBitAdam(ref, lr=1e-2, weight_decay=0.1, state_format=state_format, backend="torch")
    for step in range(12):
        for a, b in zip(ours, ref):
            g = torch.randn(a.shape, generator=gen) * (1e-6 if step % 4 == 3 else 1.0)
            a.grad, b.grad = g.clone(), g.clone()
        opt.step()
        lowbit.step()
    for a, b in zip(ours, ref):
        assert torch.equal(a.detach(), b.detach())
    s, r = opt.state[ours[0]], lowbit.state[ref[0]]
    for theirs, mine in ADAM_KEYS.items():
        assert torch.equal(s[mine], r[theirs]), (state_format, mine)
    assert torch.equal(opt.state[ours[1]]["exp_avg_sq"], lowbit.state[ref[1]]["exp_avg_sq"])


def _to_core(state_dict: dict) -> dict:
    groups = [{k: v for k, v in g.items() if k not in ("blocksize", "min_8bit_size")} for g in state_dict["param_groups"]]
    state = {}
    for index, saved in state_dict["state"].items():
        state[index] = {ADAM_KEYS.get(k, k): v for k, v in saved.items() if k != "qmap_fingerprint"}
    return {"param_groups": groups, "state": state}


class _AdamKeysView:
    """The core optimizer's states under Adam8bit's key names (for the fixture's digest)."""

    def __init__(self, opt):
        back = {v: k for k, v in ADAM_KEYS.items()}
        self.state = {p: {back.get(k, k): v for k, v in s.items()} for p, s in opt.state.items()}


@pytest.mark.parametrize("name", [name for name, _, _ in builder.CONFIGS])
def test_a_main_checkpoint_resumes_on_the_core_bit_for_bit(name):
    # the core, given main's checkpoint under its own keys, takes the same 4 steps as the Adam class loading it
    # (which tests/test_checkpoint_fixture.py holds to 544a2bb's recorded bits): same machine, same path
    saved = cont.saved()
    config = saved["configs"][name]
    fmt = {"Adam8bit": "8bit", "AdamW8bit": "8bit", "Adam4bit": "4bit", "AdamW4bit": "4bit", "AdamWFp8": "fp8",
           "Adam4bit-naive": "4bit-naive"}[name]
    params = [torch.nn.Parameter(p.clone()) for p in config["params"]]
    kwargs = {k: v for k, v in config["kwargs"].items() if k != "state_format"}
    opt = AdamWOnCore(params, state_format=fmt, **kwargs)
    core_sd = _to_core(config["state_dict"])
    for index in core_sd["state"]:  # the saved codes are in this format: say so, as the core's checkpoints do
        if "exp_avg_codes" in core_sd["state"][index]:
            core_sd["state"][index]["state_format"] = opt.format_fingerprint()
    opt.load_state_dict(core_sd)
    builder.run_steps(opt, params, builder.STEPS_BEFORE + 1, builder.STEPS_AFTER)
    assert builder.digest(params, _AdamKeysView(opt)) == cont.adam_continuation(name)
    key = cont.numeric_key()
    if key in cont.recorded():  # where this machine's path was recorded, the bits are 544a2bb's too
        assert builder.digest(params, _AdamKeysView(opt)) == cont.recorded()[key][name]


def test_state_spec_names_a_moment_format():
    assert StateSpec("m").stored_as == "m"
    with pytest.raises(ValueError, match="stored_as"):
        StateSpec("x", "signed")


class _AdamWWithLowBitKeys(AdamWRule):
    """The AdamW rule whose quantized states are stored under Adam8bit's checkpoint keys."""

    states = (StateSpec("exp_avg", "m", codes="state1", scales="absmax1"),
              StateSpec("exp_avg_sq", "v", codes="state2", scales="absmax2"))


class _AdamWOnCoreLowBitKeys(AdamWOnCore):
    rule = _AdamWWithLowBitKeys()


@pytest.mark.parametrize("state_format", ["8bit", "4bit", "fp8"])
def test_state_specs_name_their_storage_keys(state_format):
    """A StateSpec's ``codes``/``scales`` keys are where the core stores a quantized state (its fp32 form keeps
    the state's name): the AdamW rule with Adam8bit's keys gives LowBitAdam's states under LowBitAdam's keys,
    bit for bit, and its checkpoints round-trip (tagged with the format, refused in another format)."""
    gen = torch.Generator().manual_seed(3)
    w0 = [torch.randn(70, 61, generator=gen), torch.randn(61, generator=gen)]
    ours = [torch.nn.Parameter(t.clone()) for t in w0]
    ref = [torch.nn.Parameter(t.clone()) for t in w0]
    opt = _AdamWOnCoreLowBitKeys(ours, lr=1e-2, weight_decay=0.1, state_format=state_format, backend="torch")
    lowbit = optim.LowBitAdam(ref, lr=1e-2, weight_decay=0.1, state_format=state_format, backend="torch")
    for _ in range(5):
        for a, b in zip(ours, ref):
            g = torch.randn(a.shape, generator=gen)
            a.grad, b.grad = g.clone(), g.clone()
        opt.step()
        lowbit.step()
    for a, b in zip(ours, ref):
        assert torch.equal(a.detach(), b.detach())
        assert set(opt.state[a]) == set(lowbit.state[b])
        for key, value in opt.state[a].items():
            assert value == lowbit.state[b][key] if key == "step" else torch.equal(value, lowbit.state[b][key]), key
    sd = opt.state_dict()
    assert "state_format" in sd["state"][0] and "state_format" not in sd["state"][1]
    again = _AdamWOnCoreLowBitKeys([torch.nn.Parameter(t.clone()) for t in w0], state_format=state_format)
    again.load_state_dict(sd)
    for key, value in opt.state[ours[0]].items():
        assert value == again.state[again.param_groups[0]["params"][0]][key] if key == "step" else \
            torch.equal(value, again.state[again.param_groups[0]["params"][0]][key])
    other = _AdamWOnCoreLowBitKeys([torch.nn.Parameter(t.clone()) for t in w0],
                                   state_format="4bit-naive" if state_format != "4bit-naive" else "8bit")
    with pytest.raises(ValueError, match="saved with states in format"):
        other.load_state_dict(sd)


def test_state_spec_storage_keys_are_checked():
    spec = StateSpec("m")
    assert (spec.codes_key, spec.scales_key) == ("m_codes", "m_absmax")
    for bad in ("", "m", "step", 3):
        with pytest.raises(ValueError, match="storage key"):
            StateSpec("m", codes=bad)
