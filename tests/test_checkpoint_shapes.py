"""A checkpoint saved for a parameter of one shape is refused by a parameter of another shape with as many
elements (a transposed weight), in every optimizer class, with low-bit and with fp32 states: the message names
the parameter and both shapes, and the optimizer is left as it was. (torch.optim.AdamW fails at the next step;
flat codes would step without an error.)"""

from __future__ import annotations

import warnings

import pytest
import torch

import adam8lib
from adam8lib.state_checkpoint import SHAPE_KEY

CLASSES = sorted((obj for obj in vars(adam8lib).values()
                  if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer)), key=lambda c: c.__name__)


def _stepped(cls, shape, **kwargs):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, generator=gen)), torch.nn.Parameter(torch.randn(7, generator=gen))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = cls(params, **kwargs)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return params, opt


def test_every_optimizer_class_is_covered():
    names = {c.__name__ for c in CLASSES}
    assert {"AdamW8bit", "Adam4bit", "AdamWFp8", "Lion8bit", "AdEMAMix8bit", "Muon8bit", "RMSprop8bit",
            "Adagrad8bit", "SGD8bit", "Adan", "Adan8bit"} <= names


@pytest.mark.parametrize("states", ["low-bit", "fp32"])
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_a_transposed_parameter_refuses_the_checkpoint(cls, states):
    kwargs = {} if states == "low-bit" else {"min_8bit_size": 10**9}
    _, saver = _stepped(cls, (70, 61), **kwargs)
    saved = saver.state_dict()
    quantized = any(t.dtype == torch.uint8 for t in saved["state"][0].values() if torch.is_tensor(t))
    if quantized:  # flat codes: the shape is saved beside them
        assert saved["state"][0][SHAPE_KEY] == [70, 61]
    params, opt = _stepped(cls, (61, 70), **kwargs)
    before = {k: v.clone() for k, v in opt.state[params[0]].items() if torch.is_tensor(v)}
    with pytest.raises(ValueError, match=r"parameter 0 \(shape \(61, 70\)\).*\(70, 61\)"):
        opt.load_state_dict(saved)
    after = opt.state[params[0]]
    assert all(torch.equal(after[k], v) for k, v in before.items())  # left as it was


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_the_same_shape_loads_and_steps_as_the_saver(cls):
    params, saver = _stepped(cls, (70, 61))
    saved = saver.state_dict()
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = cls(twins)
    opt.load_state_dict(saved)
    gen = torch.Generator().manual_seed(1)
    for a, b in zip(params, twins):
        a.grad = torch.randn(a.shape, generator=gen)
        b.grad = a.grad.clone()
    saver.step()
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(params, twins))


def test_a_bad_shape_entry_is_named():
    _, saver = _stepped(adam8lib.AdamW8bit, (70, 61))
    saved = saver.state_dict()
    saved["state"][0][SHAPE_KEY] = "70x61"
    params, opt = _stepped(adam8lib.AdamW8bit, (70, 61))
    with pytest.raises(ValueError, match="param_shape.*list of ints"):
        opt.load_state_dict(saved)
