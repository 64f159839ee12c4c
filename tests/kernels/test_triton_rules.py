"""The Triton template of the family's elementwise rules (adam8lib/kernels/triton_rules.py) against
QuantizedStateOptimizer's reference step: in the interpreter on the CPU (tiny sizes) and, its CUDA twin,
on a GPU. In the interpreter: states (codes and absmax) bit for bit; parameters bit for bit for Lion (no
square root) and within :data:`OFF` of a step (``lr``) for the rules with one (torch's CPU sqrt is MKL's,
not always correctly rounded; the kernel's is). On a GPU the reference runs torch's CUDA kernels, which
round some operations otherwise (fused multiply-adds of their own): there a code may move to its
neighbour, so the twin asserts the looser :func:`_close_on_gpu`."""

from __future__ import annotations

import pytest
import torch

from _triton_devices import DEVICES  # noqa: E402  (sets TRITON_INTERPRET=1 where there is no GPU)
from _fused_calls import count_fused_calls  # noqa: E402
from adam8lib import family, kernels
from adam8lib.formats import get_format
from adam8lib.kernels import triton_rules

CLASSES = {
    "lion": (family.Lion8bit, dict(lr=3e-3, betas=(0.9, 0.99), weight_decay=0.1)),
    "ademamix": (family.AdEMAMix8bit, dict(lr=2e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=3, t_beta3=3,
                                           weight_decay=0.01)),
    "rmsprop": (family.RMSprop8bit, dict(lr=1e-3, alpha=0.9, eps=1e-8, weight_decay=0.01)),
    "adagrad": (family.Adagrad8bit, dict(lr=1e-2, eps=1e-10, weight_decay=0.01)),
    "adan": (family.Adan8bit, dict(lr=2e-3, weight_decay=0.02)),  # four states, the previous gradient kept in fp32
    "adan_decoupled": (family.Adan8bit, dict(lr=2e-3, weight_decay=0.05, weight_decouple=True)),
}
#: the largest parameter difference allowed in the interpreter, as a fraction of lr: measured 7.5e-6
#: (AdEMAMix, RMSprop, Adan; Adan with weight_decouple 3.7e-6), 1.5e-6 (Adagrad) over these steps, 0 for Lion;
#: the states never differ.
OFF = {"lion": 0.0, "ademamix": 1e-5, "rmsprop": 1e-5, "adagrad": 1e-5, "adan": 1e-5, "adan_decoupled": 1e-5}
SHAPES = [(300,), (4, 130)]  # not multiples of the block (64 here)


def _steps_off(a: torch.Tensor, b: torch.Tensor, lr: float) -> float:
    """The largest difference as a fraction of the step size lr."""
    return float((a.float() - b.float()).abs().max()) / lr


def _close_on_gpu(ref_state: dict, got_state: dict, what: str) -> None:
    """CUDA twin: at least 99 % of the codes equal (the others a neighbour), scales within 1e-5."""
    for key, value in ref_state.items():
        if not torch.is_tensor(value):
            continue
        if key.endswith("_codes"):
            same = (value == got_state[key]).float().mean().item()
            assert same >= 0.99, f"{what}: only {same:.4f} of {key} equal"
            assert int((value.int() - got_state[key].int()).abs().max()) <= 1, f"{what}: {key} more than one code off"
        else:
            torch.testing.assert_close(got_state[key], value, rtol=1e-5, atol=0, msg=what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_equals_reference(name, device, monkeypatch):
    cls, hyper = CLASSES[name]
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(shape, generator=gen) * 0.1 for shape in SHAPES]
    ref_params = [torch.nn.Parameter(t.clone().to(device)) for t in init]
    got_params = [torch.nn.Parameter(t.clone().to(device)) for t in init]
    ref = cls(ref_params, **hyper, blocksize=64, min_8bit_size=0, backend="torch")
    got = cls(got_params, **hyper, blocksize=64, min_8bit_size=0, backend="triton")
    assert all(got.fused_step(p).fn is triton_rules.rule_step_triton for p in got_params)
    calls = count_fused_calls(monkeypatch, "triton")
    off = 0.0
    for step in range(1, 5):
        for p_ref, p_got in zip(ref_params, got_params):
            g = torch.randn(p_ref.shape, generator=gen) * 10.0 ** torch.randint(-3, 2, p_ref.shape, generator=gen)
            if step == 2:  # the non-finite rule
                g.view(-1)[3], g.view(-1)[-1], g.view(-1)[7] = float("nan"), float("inf"), 3e30
            p_ref.grad, p_got.grad = g.to(device), g.clone().to(device)
        ref.step()
        got.step()
        for i, (p_ref, p_got) in enumerate(zip(ref_params, got_params)):
            what = f"{name} step {step}, parameter {i}"
            off = max(off, _steps_off(p_ref.detach(), p_got.detach(), hyper["lr"]))
            if device == "cuda":
                _close_on_gpu(ref.state[p_ref], got.state[p_got], what)
                continue
            for key, value in ref.state[p_ref].items():
                if torch.is_tensor(value):
                    assert torch.equal(value, got.state[p_got][key]), f"{what}: {key}"
    assert len(calls) == 4 * len(SHAPES)  # every step of every parameter ran the kernel
    limit = OFF[name] if device == "cpu" else 1e-3
    assert off <= limit, f"{name}: parameters {off:.3g} lr from the reference (allowed {limit})"


@pytest.mark.parametrize("device", DEVICES)
def test_registry_and_bad_input(device):
    from adam8lib.rules import LionRule

    rule, fmt = LionRule(), get_format("8bit")
    assert kernels.find_step(rule, fmt, "triton", device).fn is triton_rules.rule_step_triton
    if device == "cpu":
        assert kernels.find_step(rule, fmt, "auto", "cpu").backend == "cpu"  # auto never picks the interpreter
    p = torch.zeros(300, device=device)
    codes, absmax = torch.full((300,), 127, dtype=torch.uint8, device=device), torch.zeros(5, device=device)
    group = dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0)
    with pytest.raises(ValueError, match="elements"):
        triton_rules.rule_step_triton(p, p[:-1], ((codes, absmax),), rule=rule, fmt=fmt, shape=(300,), step=1,
                                      group=group)
    with pytest.raises(ValueError, match="4bit"):
        triton_rules.rule_step_triton(p, p, ((codes, absmax),), rule=rule, fmt=get_format("4bit"), shape=(300,),
                                      step=1, group=group)
    assert bool((codes == 127).all()) and bool((p == 0).all())
