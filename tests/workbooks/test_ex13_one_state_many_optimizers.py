"""Workbook 13 · one state, many optimizers: unit tests of the learner's code (run: -m ex13)."""

import math

import pytest
import torch

from adam8lib import AdEMAMix8bit, Lion8bit
from adam8lib.formats import FORMATS

pytestmark = pytest.mark.ex13


def _train(cls, state_format, steps=15, **kwargs):
    gen = torch.Generator().manual_seed(11)
    params = [torch.nn.Parameter(torch.randn(96, 64, generator=gen)), torch.nn.Parameter(torch.randn(64, generator=gen))]
    opt = cls(params, lr=1e-2, weight_decay=0.05, state_format=state_format, **kwargs)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return params, opt


@pytest.mark.parametrize("state_format", ["8bit", "4bit", "fp32"])
def test_lion_from_scratch_steps_as_the_library_in_every_format(workbook, state_format):
    """The learner's rule knows no format: with 8-bit, 4-bit or fp32 states its parameters equal Lion8bit's."""
    mine, _ = _train(workbook("13").Lion8bitFromScratch, state_format)
    ref, _ = _train(Lion8bit, state_format)
    assert all(torch.equal(a, b) for a, b in zip(mine, ref))


def test_lion_from_scratch_moves_every_entry_by_lr_and_refuses_bad_arguments(workbook):
    cls = workbook("13").Lion8bitFromScratch
    p = torch.nn.Parameter(torch.zeros(5000))
    opt = cls([p], lr=1e-3)
    p.grad = torch.randn(5000, generator=torch.Generator().manual_seed(2))
    opt.step()
    assert torch.equal(p.detach().abs(), torch.full((5000,), 1e-3))  # a sign update: exactly lr everywhere
    assert torch.equal(torch.sign(p.detach()), -torch.sign(p.grad))
    for bad in (dict(lr=-1.0), dict(betas=(1.0, 0.99)), dict(betas=(0.9, -0.1)), dict(weight_decay=-1.0)):
        with pytest.raises((ValueError, TypeError)):
            cls([torch.nn.Parameter(torch.zeros(3))], **bad)


@pytest.mark.parametrize("state_format", ["fp32", "8bit", "fp8", "4bit"])
def test_state_bytes_add_up_to_the_states_an_optimizer_allocates(workbook, state_format):
    """AdEMAMix8bit keeps two signed states and one unsigned: the learner's bytes sum to what a real step creates."""
    state_bytes = workbook("13").state_bytes
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in ((130, 70), (5000,), (33,))]
    opt = AdEMAMix8bit(params, state_format=state_format)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    for p in params:
        allocated = sum(t.numel() * t.element_size() for t in opt.state[p].values() if torch.is_tensor(t))
        mine = sum(state_bytes(tuple(p.shape), spec.stored_as, state_format) for spec in opt.rule.states)
        assert mine == allocated, (tuple(p.shape), state_format)


def test_lion_flips_few_in_8_bits_more_in_4(workbook):
    """On a momentum spread over three decades, 8-bit storage flips fewer of Lion's signs than 4-bit, and every
    flip is an entry where the fp32 and the stored interpolation really have different signs."""
    lion_flips = workbook("13").lion_flips
    gen = torch.Generator().manual_seed(4)
    g = torch.randn(128, 256, generator=gen)
    m = 0.05 * torch.randn(128, 256, generator=gen) * torch.logspace(-3, 0, 256)
    flips = {name: lion_flips(m, g, 0.9, name) for name in ("8bit", "4bit")}
    assert int(flips["8bit"].sum()) < int(flips["4bit"].sum())
    fmt = FORMATS["4bit"].m
    stored = fmt.dequantize(*fmt.quantize(m.reshape(-1), tuple(m.shape)), tuple(m.shape)).view(m.shape)
    exact, approx = 0.9 * m + 0.1 * g, 0.9 * stored + 0.1 * g
    assert bool((torch.sign(exact) != torch.sign(approx))[flips["4bit"]].all())
    assert math.isclose(float(flips["4bit"].double().mean()), float((torch.sign(exact) != torch.sign(approx)).double().mean()))
