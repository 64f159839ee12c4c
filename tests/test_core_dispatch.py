"""The core (QuantizedStateOptimizer) runs the one registry's fused steps itself: with ``backend="auto"``
every quantized, contiguous parameter of an elementwise rule with a registered step takes it, the others the
reference step, and the result is the reference step's (``backend="torch"``) bit for bit; which step a
parameter gets is :meth:`fused_step`'s answer, and a named backend without a step for a rule is refused
when the optimizer is built."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from adam8lib import (AdEMAMix8bit, Adagrad8bit, Adan8bit, Lion, Lion4bit, Lion8bit, Muon8bit, RMSprop8bit, SGD8bit,
                      kernels)
from adam8lib.kernels import cpu_rules
from adam8lib.quantized_state import QuantizedStateOptimizer

sys.path.insert(0, str(Path(__file__).parent / "kernels"))
from _fused_calls import count_fused_calls, unwrapped  # noqa: E402

pytestmark = pytest.mark.skipif("cpu" not in kernels.available_backends("cpu"),
                                reason="no C++ compiler: the cpu backend is not built")

CASES = {
    "Lion8bit": (Lion8bit, dict(lr=3e-3, weight_decay=0.1)),
    "Lion8bit-fp8": (Lion8bit, dict(lr=3e-3, weight_decay=0.1, state_format="fp8")),
    "AdEMAMix8bit": (AdEMAMix8bit, dict(lr=2e-3, alpha=5.0, t_alpha=5, t_beta3=5, weight_decay=0.01)),
    "RMSprop8bit": (RMSprop8bit, dict(lr=1e-3, weight_decay=0.01)),
    "Adagrad8bit": (Adagrad8bit, dict(lr=1e-2, weight_decay=0.01)),
    "Muon8bit": (Muon8bit, dict(lr=2e-2, weight_decay=0.1)),  # its AdamW parameters: the 8-bit Adam kernel
    "Adan8bit": (Adan8bit, dict(lr=2e-3, weight_decay=0.02)),  # four states, one kept in fp32
}


def _model(seed=0):
    """A matrix and a vector with quantized states, a bf16 vector with an fp32 gradient, a transposed
    (non-contiguous) matrix, and a bias under min_8bit_size."""
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(96, 80, generator=gen) * 0.1),
              torch.nn.Parameter(torch.randn(5000, generator=gen) * 0.1),
              torch.nn.Parameter((torch.randn(4500, generator=gen) * 0.1).bfloat16()),
              torch.nn.Parameter((torch.randn(80, 96, generator=gen) * 0.1).t()),
              torch.nn.Parameter(torch.randn(30, generator=gen) * 0.1)]
    if hasattr(params[2], "grad_dtype"):
        params[2].grad_dtype = None  # torch >= 2.9: allow its fp32 gradient
    return params


def _grads(t, params):
    gen = torch.Generator().manual_seed(100 + t)
    out = []
    for p in params:
        g = torch.randn(p.shape, generator=gen) * 10.0 ** torch.randint(-3, 1, p.shape, generator=gen)
        if t == 3:
            g.view(-1)[7] = float("nan")
        out.append(g)  # fp32, also for the bf16 parameter
    return out


def _bits(t):
    return t.detach().view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("name", sorted(CASES))
def test_auto_runs_the_fused_steps_with_the_reference_bits(name, monkeypatch):
    cls, hyper = CASES[name]
    ref_params, got_params = _model(), _model()
    ref, got = cls(ref_params, **hyper, backend="torch"), cls(got_params, **hyper)
    expected = {0, 1, 2, 3} if name != "Muon8bit" else {1, 2}  # Muon's matrices: orthogonalized, no kernel; the
    # transposed (non-contiguous) matrix steps a contiguous copy in the kernel
    used = {i for i, p in enumerate(got_params) if got.fused_step(p) is not None}
    assert used == expected
    assert all(ref.fused_step(p) is None for p in ref_params)
    calls = count_fused_calls(monkeypatch, "cpu")
    for t in range(1, 6):
        for a, b, g in zip(ref_params, got_params, _grads(t, ref_params)):
            a.grad, b.grad = g.clone(), g.clone()
        ref.step()
        got.step()
        for i, (a, b) in enumerate(zip(ref_params, got_params)):
            assert torch.equal(_bits(a), _bits(b)), f"{name} step {t}: parameter {i}"
            sa, sb = ref.state[a], got.state[b]
            assert sa.keys() == sb.keys() and sa["step"] == sb["step"] == t
            for key, value in sa.items():
                if torch.is_tensor(value):
                    assert torch.equal(value, sb[key]), f"{name} step {t}: {key} of parameter {i}"
    assert len(calls) == 5 * len(expected)
    assert {rule for rule, _ in calls} == {"adamw" if name == "Muon8bit" else got.rule.name}


def test_fused_step_says_which_step_a_parameter_gets():
    w, small = torch.nn.Parameter(torch.randn(64, 80)), torch.nn.Parameter(torch.randn(10))
    found = Lion8bit([w, small]).fused_step(w)
    assert found.backend == "cpu" and unwrapped(found.fn) is cpu_rules.rule_step_cpu
    assert Lion8bit([w, small]).fused_step(small) is None  # under min_8bit_size: fp32 states
    assert Lion([w]).fused_step(w) is None  # fp32 states: the reference step
    assert Lion4bit([w]).fused_step(w) is None  # nibble codes: no kernel of the family's rules
    assert SGD8bit([w], lr=0.1).fused_step(w) is None  # no fused step of SGD with momentum
    assert Lion8bit([w], backend="torch").fused_step(w) is None
    with pytest.raises(ValueError, match="not a parameter"):
        Lion8bit([w]).fused_step(small)


def test_an_overridden_quantize_runs_the_reference_step():
    """The hook that plugs in another rounding (tests/test_family_bnb.py) is what runs, not the kernel."""

    class Rounded(Lion8bit):
        def quantize(self, spec, x, fmt, shape):
            return fmt.quantize(x, shape)

    w = torch.nn.Parameter(torch.randn(64, 80))
    opt = Rounded([w])
    assert opt.fused_step(w) is None
    opt.quantize = lambda spec, x, fmt, shape: fmt.quantize(x, shape)
    assert opt.fused_step(w) is None


def test_a_named_backend_needs_a_step_for_every_elementwise_rule():
    w = torch.nn.Parameter(torch.randn(64, 80))
    assert Lion8bit([w], backend="cpu").fused_step(w).backend == "cpu"
    assert Muon8bit([w], backend="cpu").fused_step(w) is None  # Muon's rule is not elementwise: no kernel needed
    with pytest.raises(ValueError, match="no fused step of the momentum rule"):
        SGD8bit([w], lr=0.1, backend="cpu")
    with pytest.raises(ValueError, match="fp32 states"):
        Lion([w], backend="cpu")
    with pytest.raises(ValueError, match="no fused step of the lion rule for states in format '4bit'"):
        Lion4bit([w], backend="cpu")
    with pytest.raises(ValueError, match="Unknown backend 'nope'"):
        Lion8bit([w], backend="nope")
    with pytest.raises(ValueError, match="Unknown backend"):
        Lion8bit([w], backend=3)


def test_a_named_backend_that_cannot_run_here_raises_before_anything_changes():
    """backend="triton" on CPU tensors without the interpreter: the step says why and changes nothing."""
    if "triton" not in kernels.available_backends():
        pytest.skip("triton is not installed")
    w = torch.nn.Parameter(torch.randn(64, 80))
    opt = Lion8bit([w], backend="triton")
    w.grad = torch.randn_like(w)
    before = w.detach().clone()
    if "triton" in kernels.available_backends("cpu"):  # the interpreter is on in this process: it steps
        opt.step()
        assert opt.state[w]["step"] == 1 and not torch.equal(w.detach(), before)
        return
    with pytest.raises(ValueError, match="triton"):
        opt.step()
    assert torch.equal(w.detach(), before) and not opt.state[w]


def test_the_subclass_hook_still_decides_the_rule(monkeypatch):
    """A core subclass's rule_for picks the rule, and with it the fused step (here: Muon's two rules)."""
    calls = count_fused_calls(monkeypatch, "cpu")
    mat, vec = torch.nn.Parameter(torch.randn(64, 80)), torch.nn.Parameter(torch.randn(5000))
    opt = Muon8bit([dict(params=[mat]), dict(params=[vec], use_muon=False)])
    mat.grad, vec.grad = torch.randn_like(mat), torch.randn_like(vec)
    opt.step()
    assert calls == [("adamw", 5000)]
    assert isinstance(opt, QuantizedStateOptimizer)


def test_a_rule_named_like_the_librarys_but_computing_otherwise_never_gets_its_kernel():
    """A learner's Lion (lesson 13's workbook) is named "lion": the Lion kernel must not replace its update."""
    from adam8lib.rules import LionRule, is_library_rule

    class SignOfGradient(LionRule):  # another update under the same name
        def update(self, p, g, states, *, step, group):
            return p - group["lr"] * g.sign()

    class StricterChecks(LionRule):  # the same computation, other checks: still the library's Lion
        def check(self, group):
            super().check(group)

    class Learner(Lion8bit):
        rule = SignOfGradient()

    class Checked(Lion8bit):
        rule = StricterChecks()

    assert not is_library_rule(SignOfGradient()) and is_library_rule(StricterChecks())
    w = torch.nn.Parameter(torch.zeros(64, 80))
    assert Learner([w]).fused_step(w) is None and Checked([w]).fused_step(w) is not None
    assert kernels.find_step(SignOfGradient(), Lion8bit([w]).format, "cpu", "cpu") is None
    opt = Learner([w], lr=0.5, weight_decay=0.0)
    w.grad = torch.full_like(w, -3.0)
    opt.step()
    assert bool((w.detach() == 0.5).all())  # its own update ran: p - lr * sign(g)
    with pytest.raises(ValueError, match="no fused step of the lion rule"):
        Learner([w], backend="cpu")


@pytest.mark.parametrize("backend", ["cpu", "cpu_fast"])
def test_adam8bit_batched_step_is_the_registry_entry_many(backend, monkeypatch):
    """The 8-bit Adam fused steps have a batched form in the registry (``FusedStep.many``: one call of the
    backend's step_many for a group), each tensor stepped as ``fn`` steps it, bit for bit; Adam8bit's batched
    map-code path is that entry's ``many``."""
    from adam8lib import AdamW8bit
    from adam8lib.formats import get_format
    from adam8lib.rules import AdamWRule

    if backend not in kernels.available_backends("cpu"):
        pytest.skip(f"no {backend} backend here")
    fmt = get_format("8bit")
    entry = kernels.find_step(AdamWRule(), fmt, backend, "cpu")
    assert entry is not None and entry.many is not None
    gen = torch.Generator().manual_seed(5)
    shapes = [(5000,), (64, 80), (4097,)]
    group = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)

    def fresh():
        torch.manual_seed(0)
        return [(torch.randn(s).reshape(-1), fmt.new_state(s, torch.device("cpu"))) for s in shapes]

    one, many = fresh(), fresh()
    for t in range(1, 4):
        grads = [torch.randn(s, generator=gen).reshape(-1) for s in shapes]
        for (p, st), g, s in zip(one, grads, shapes):
            entry.fn(p, g, ((st["state1"], st["absmax1"]), (st["state2"], st["absmax2"])), rule=AdamWRule(),
                     fmt=fmt, shape=s, step=t, group=group)
        entry.many([(p, g, ((st["state1"], st["absmax1"]), (st["state2"], st["absmax2"])))
                    for (p, st), g in zip(many, grads)], rule=AdamWRule(), fmt=fmt, shapes=shapes, steps=[t] * 3,
                   group=group)
    for (p, st), (q, su) in zip(one, many):
        assert torch.equal(p, q) and all(torch.equal(st[k], su[k]) for k in st)

    calls = []
    original = entry.many

    def counting(items, **kwargs):
        calls.append(len(items))
        return original(items, **kwargs)

    ps = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    opt = AdamW8bit(ps, backend=backend)
    import types
    monkeypatch.setattr(kernels, "find_step",
                        lambda *a, **k: types.SimpleNamespace(fn=entry.fn, many=counting, backend=backend))
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()
    assert calls == [3]  # the group's three 8-bit tensors in one call


def test_adam8bit_sees_a_step_registered_after_it_stepped():
    """Adam8bit remembers the fused step it found (no look-up per step of many small tensors) until the registry
    changes: a step registered later for its rule, format and backend is the one its next step runs."""
    from adam8lib import AdamW8bit
    from adam8lib.formats import get_format
    from adam8lib.kernels import registry
    from adam8lib.rules import AdamWRule

    if "cpu" not in kernels.available_backends("cpu"):
        pytest.skip("no cpu backend here")
    entry = kernels.find_step(AdamWRule(), get_format("8bit"), "cpu", "cpu")
    ps = [torch.nn.Parameter(torch.randn(5000)) for _ in range(3)]
    opt = AdamW8bit(ps, backend="cpu")
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()
    calls = []

    def counting(items, **kwargs):
        calls.append(len(items))
        return entry.many(items, **kwargs)

    before, saved = registry.version(), list(registry._STEPS)
    registry.register_step("adamw", "cpu", entry.fn, formats=entry.formats, supports=entry.supports, many=counting)
    try:
        assert registry.version() != before
        opt.step()
    finally:
        registry._STEPS[:] = saved  # the registry as it was, in its order
        registry._VERSION[0] += 1
    assert calls == [3]
    opt.step()
    assert calls == [3]  # the original step again
