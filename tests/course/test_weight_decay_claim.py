"""Lesson 03's claim: ``Adam8bit(weight_decay=...)`` decays decoupled (AdamW-style) in adam8lib and in bitsandbytes.

With a zero gradient both moments stay 0 and the Adam update is 0, so what moves the weight is the decay
alone: decoupled, it is multiplied by ``1 - lr * wd``; as L2 (``torch.optim.Adam``), ``wd * p`` enters the
gradient and the first step moves it by a whole ``lr``.
"""

from __future__ import annotations

import inspect

import bitsandbytes as bnb
import pytest
import torch

import adam8lib

LR, WD, START = 1e-2, 0.1, 2.0


def _after_one_step(optimizer_class, **kwargs) -> float:
    p = torch.nn.Parameter(torch.full((8192,), START))  # large enough for 8-bit states
    opt = optimizer_class([p], lr=LR, weight_decay=WD, **kwargs)
    p.grad = torch.zeros_like(p)
    opt.step()
    return float(p[0])


@pytest.mark.parametrize("optimizer_class, kwargs", [
    (adam8lib.Adam8bit, {"backend": "torch"}), (adam8lib.AdamW8bit, {"backend": "torch"}),
    (bnb.optim.Adam8bit, {}), (bnb.optim.AdamW8bit, {}),
])
def test_adam8bit_decays_decoupled_in_both_libraries(optimizer_class, kwargs):
    assert _after_one_step(optimizer_class, **kwargs) == pytest.approx(START * (1 - LR * WD), abs=1e-6)


def test_torch_adam_decays_through_the_gradient():
    assert _after_one_step(torch.optim.Adam) == pytest.approx(START - LR, abs=1e-6)


@pytest.mark.parametrize("adam, adamw", [(adam8lib.Adam8bit, adam8lib.AdamW8bit),
                                         (bnb.optim.Adam8bit, bnb.optim.AdamW8bit)])
def test_adam8bit_and_adamw8bit_differ_only_in_the_default_decay(adam, adamw):
    defaults = [inspect.signature(cls.__init__).parameters["weight_decay"].default for cls in (adam, adamw)]
    assert defaults == [0, 1e-2]
