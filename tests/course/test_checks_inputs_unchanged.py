"""The checks' common call path: a learner's function must give its tensor / array inputs back unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adam8lib.course.checks._common import ALL_ARGS, call


def _adds_one_in_place(x, y):
    x.add_(1)
    return x + y


def test_an_in_place_change_of_an_input_fails_and_names_the_argument():
    x, y = torch.zeros(5), torch.ones(5)
    with pytest.raises(AssertionError, match=r"modified its argument `x` in place") as err:
        call(_adds_one_in_place, x, y)
    assert "5 of its values changed" in str(err.value)


def test_an_argument_the_contract_updates_may_change():
    x, y = torch.zeros(5), torch.ones(5)
    assert torch.equal(call(_adds_one_in_place, x, y, may_change=(0,)), torch.full((5,), 2.0))
    assert torch.equal(x, torch.ones(5))  # the change happened and was allowed
    call(_adds_one_in_place, torch.zeros(3), torch.ones(3), may_change=("x",))
    call(_adds_one_in_place, torch.zeros(3), torch.ones(3), may_change=ALL_ARGS)


def test_keyword_and_nested_inputs_are_watched_too():
    def clamps_state(states, *, g):
        states[1]["v"].clamp_(min=1.0)
        return g

    states = [{"v": torch.ones(2)}, {"v": torch.zeros(2)}]
    with pytest.raises(AssertionError, match=r"`states\[1\]\['v'\]`"):
        call(clamps_state, states, g=torch.zeros(1))

    def scales_g(*, g):
        g.mul_(2)

    with pytest.raises(AssertionError, match=r"`g`"):
        call(scales_g, g=torch.ones(1))


def test_the_comparison_is_bitwise_and_nan_safe():
    call(lambda x: x * 2, torch.tensor([float("nan"), 1.0]))  # NaN in, untouched: passes
    with pytest.raises(AssertionError, match="in place"):
        call(lambda x: x.abs_(), torch.tensor([-0.0, 1.0]))  # -0.0 -> 0.0: same value, other bits
    with pytest.raises(AssertionError, match="shape changed"):
        call(lambda x: x.resize_(2), torch.zeros(4))
    with pytest.raises(AssertionError, match="in place"):
        call(lambda x: x.view(torch.int32).add_(1), torch.ones(3))  # through a view of the input


def test_numpy_arrays_are_watched():
    def fills(a):
        a[0] = 7.0

    with pytest.raises(AssertionError, match=r"`a` in place"):
        call(fills, np.zeros(3, dtype=np.float32))
    assert call(lambda a: a.sum(), np.ones(3)) == 3.0


def test_a_function_that_leaves_its_inputs_alone_returns_its_result():
    x = torch.randn(4, 3)
    out = call(lambda x: x.t().contiguous() * 3, x)
    assert out.shape == (3, 4)
