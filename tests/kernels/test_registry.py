"""The one registry of fused steps (adam8lib/kernels/registry.py): keyed by what a step can do (rule,
the formats it accepts, the device its backend runs on), today's entry points as thin wrappers over it,
and clear errors for bad registrations."""

from __future__ import annotations

import pytest
import torch

from adam8lib import kernels
from adam8lib.formats import get_format
from adam8lib.kernels import registry
from adam8lib.rules import LionRule


@pytest.fixture
def clean_registry(monkeypatch):
    """The registry as it is, restored afterwards (a test may add steps)."""
    kernels.registered_steps()  # (the optional backends register first)
    monkeypatch.setattr(registry, "_STEPS", list(registry._STEPS))


def test_every_builtin_format_has_an_adam_step_on_the_cpu():
    for name in ("8bit", "fp8", "4bit", "4bit-naive"):
        found = kernels.find_step("adamw", get_format(name), "auto", "cpu")
        assert found is not None and found.backend == "cpu", name
    assert kernels.find_step("adamw", None, "auto", "cpu") is None  # fp32 states: the reference step
    assert "cpu" in kernels.backends_for("adamw", get_format("4bit"))


def test_a_step_is_found_by_the_layout_it_accepts_not_by_the_format_name(clean_registry):
    calls = []
    fmt = get_format("8bit").with_blocksize(64)
    custom = type(fmt)("my-8bit", fmt.m, fmt.v)  # a user's format of the same layout, another name

    def fn(*args, **kwargs):
        calls.append(kwargs["rule"])

    kernels.register_step("my-rule", "cpu", fn, formats=lambda f: f.m.bits == 8 and not f.m.rank1,
                          supports=lambda d: d.type == "cpu")
    assert kernels.find_step("my-rule", custom, "cpu", "cpu").fn is fn
    assert kernels.find_step("my-rule", get_format("4bit"), "cpu", "cpu") is None
    assert kernels.find_step("my-rule", custom, "auto", "meta") is None  # its backend does not run there
    assert kernels.find_step("my-rule", "8bit", "cpu", "cpu") is None  # a predicate judges a format, not a name
    named = kernels.register_step("my-rule", "cpu", fn, formats=("8bit",), supports=lambda d: True)
    assert named.names() == ("8bit",)
    assert kernels.find_step("my-rule", "8bit", "cpu", "cpu") is named


def test_a_named_backend_that_cannot_run_says_why():
    with pytest.raises(ValueError, match="Unknown or unavailable backend 'nope'"):
        kernels.find_step(LionRule(), get_format("8bit"), "nope", "cpu")
    assert kernels.find_step(LionRule(), get_format("8bit"), "torch", "cpu") is None  # the reference step


def test_registering_again_replaces_and_bad_registrations_are_refused(clean_registry):
    def a(*args, **kwargs):
        pass

    def b(*args, **kwargs):
        pass

    kernels.register_step("lion", "cpu", a, formats=("8bit",), supports=lambda d: True)
    kernels.register_step("lion", "cpu", b, formats=("8bit",), supports=lambda d: True)
    mine = [s for s in kernels.registered_steps() if s.fn in (a, b)]
    assert [s.fn for s in mine] == [b]
    with pytest.raises(TypeError, match="rule"):
        kernels.register_step(None, "cpu", a, formats=("8bit",), supports=lambda d: True)
    with pytest.raises(TypeError, match="backend"):
        kernels.register_step("lion", "", a, formats=("8bit",), supports=lambda d: True)
    with pytest.raises(TypeError, match="callable"):
        kernels.register_step("lion", "cpu", "not a function", formats=("8bit",), supports=lambda d: True)
    with pytest.raises(TypeError, match="formats"):
        kernels.register_step("lion", "cpu", a, formats=(), supports=lambda d: True)


def test_format_kernels_are_registry_entries_and_the_old_names_are_gone(clean_registry):
    from adam8lib import optim as optim_module
    from adam8lib.kernels import cpu_formats, reference

    for gone in ("lowbit_step", "register_lowbit_step", "adam_step"):
        assert not hasattr(kernels, gone), gone
    assert not hasattr(reference, "lowbit_reference_step") and not hasattr(optim_module, "LOWBIT_KERNELS")
    assert "legacy" not in kernels.FusedStep.__dataclass_fields__
    assert kernels.find_step("adamw", get_format("fp8"), "cpu", "cpu") is not None
    assert optim_module.backends_of(get_format("fp8")) == ("auto", "torch") + kernels.backends_for("adamw", get_format("fp8"))
    assert "cpu" in optim_module.backends_of(get_format("4bit"))
    assert cpu_formats.fp8_step_cpu is not None

    seen = []

    def old_style(p, g, state, fmt, *, shape, step, lr, beta1, beta2, eps, weight_decay):
        seen.append((sorted(state), shape, step, lr, beta1, beta2, eps, weight_decay))

    kernels.register_adam_step("fp8", "cpu", old_style)
    codes, scales = torch.zeros(4, dtype=torch.uint8), torch.zeros(1)
    kernels.find_step("adamw", get_format("fp8"), "cpu", "cpu").fn(
        torch.zeros(4), torch.zeros(4), ((codes, scales), (codes, scales)), rule=None, fmt=get_format("fp8"),
        shape=(2, 2), step=3, group=dict(lr=0.1, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.5))
    assert seen == [(["absmax1", "absmax2", "state1", "state2"], (2, 2), 3, 0.1, 0.8, 0.9, 1e-6, 0.5)]
    # the Adam optimizers step a low-bit format with what the registry holds for it, nothing else
    from adam8lib import AdamWFp8

    p = torch.nn.Parameter(torch.ones(64, 80))
    p.grad = torch.ones_like(p)
    for backend in ("auto", "cpu"):
        seen.clear()
        AdamWFp8([p], lr=0.01, backend=backend).step()
        assert seen == [(["absmax1", "absmax2", "state1", "state2"], (64, 80), 1, 0.01, 0.9, 0.999, 1e-8, 0.01)]
    seen.clear()
    AdamWFp8([p], lr=0.01, backend="torch").step()
    assert seen == []
