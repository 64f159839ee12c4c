"""Stale second moments (lesson 07): round-to-nearest keeps a slowly changing v on its code."""

from __future__ import annotations

import math

import pytest
import torch

from adam8lib import Adam8bit
from adam8lib.quant import dynamic_map
from adam8lib.stale import ShadowV, relative_half_gaps, stale_v_block


def test_relative_half_gaps_of_the_unsigned_map():
    q = dynamic_map(signed=False).double()
    gaps = relative_half_gaps(dynamic_map(signed=False))
    assert gaps.shape == (255,)
    k = 200  # brute force for one entry: the rounding boundary below Q[k] is the midpoint
    assert math.isclose(gaps[k - 1].item(), (q[k] - (q[k - 1] + q[k]) / 2).item() / q[k].item(), rel_tol=1e-6)
    smallest = gaps[1:]  # Q[1] (the first non-zero entry) rounds down to 0 at half its value: 50 %
    assert int(smallest.argmin()) + 2 == 255  # between the two top entries
    assert 0.0017 < smallest.min().item() < 0.0018  # 0.176 %: above beta2 = 0.999's 0.1 % everywhere


@pytest.fixture(scope="module")
def block():
    return stale_v_block()


def test_a_v_whose_gradient_stops_keeps_its_code_and_ends_about_11x_the_fp32_v(block):
    """Steps 1,001-3,000 without gradient: fp32 v shrinks by 0.999**2000 (1/7.39); the 8-bit codes never
    change, and the absmax (weight 0's v) grows from 1 - 0.999**1000 to 1 - 0.999**3000 (x 1.50)."""
    assert int(block.codes_changed[block.stop:block.resume].sum()) == 0
    expected = (1 - 0.999**3000) / (1 - 0.999**1000) / 0.999**2000  # 11.1
    assert 9 < block.v_ratio[block.resume - 1].item() < 13
    assert math.isclose(block.v_ratio[block.resume - 1].item(), expected, rel_tol=0.05)
    assert abs(block.v_ratio[block.stop - 1].item() - 1) < 0.02  # before the stop: 8-bit follows fp32


def test_a_stale_v_makes_the_step_smaller_when_the_gradient_returns(block):
    first = block.step_ratio[block.resume].item()  # step 3,001
    assert 0.25 < first < 0.4
    assert math.isclose(first, block.v_ratio[block.resume - 1].item() ** -0.5, rel_tol=0.1)  # ~ 1 / sqrt(11)
    assert first < block.step_ratio[-1].item() < 1  # recovering, not recovered, 500 steps later
    assert torch.allclose(block.step_ratio[: block.stop], torch.ones(block.stop), atol=0.01)  # same steps before


def test_stale_v_block_rejects_bad_phases():
    with pytest.raises(ValueError):
        stale_v_block(steps=10, stop=5, resume=5)


def test_shadow_v_follows_the_exact_second_moment():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(8192))
    small = torch.nn.Parameter(torch.randn(10))  # fp32 states: not reported
    opt = Adam8bit([p, small], lr=1e-3, backend="torch")
    shadow = ShadowV(opt)
    grads = [torch.randn(8192) for _ in range(20)]
    for g in grads:
        p.grad, small.grad = g.clone(), torch.randn(10)
        shadow.observe()
        opt.step()
    exact = torch.zeros(8192)
    for g in grads:
        exact = 0.999 * exact + 0.001 * g * g
    assert torch.allclose(shadow.v[p], exact, rtol=1e-5)
    ratios = shadow.ratios()
    assert ratios.numel() == 8192  # the small tensor is left out
    assert abs(ratios.median().item() - 1) < 0.02 and (ratios - 1).abs().max().item() < 0.5
