"""Workbook 10 · mixed-precision fine-tuning: unit tests of the learner's functions (run: -m ex10)."""

import math

import pytest
import torch
from torch import nn

from adam8lib import Adam8bit
from adam8lib.training import decay_parameter_names
from adam8lib.course.finetune import build_distilbert

pytestmark = pytest.mark.ex10


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))  # not a norm, no bias: decays
        self.bias = nn.Parameter(torch.zeros(4))


class MyRMSNorm(nn.Module):  # a model-specific norm: known by its class name
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))


def odd_model():
    return nn.ModuleDict({
        "embed": nn.Embedding(10, 4),
        "gate": Gate(),
        "norm": MyRMSNorm(),
        "layer_norm_like_name": nn.Linear(4, 4),  # named like a norm, but a Linear: its weight decays
        "ln": nn.LayerNorm(4),
        "head": nn.Linear(4, 2, bias=False),
    })


def test_decay_names_on_a_model_with_unusual_names(workbook):
    names = workbook("10").get_decay_parameter_names(odd_model())
    assert sorted(names) == sorted(["embed.weight", "gate.weight", "layer_norm_like_name.weight", "head.weight"])


def test_decay_names_on_small_distilbert_equal_the_library(workbook):
    model = build_distilbert(small=True)
    assert sorted(workbook("10").get_decay_parameter_names(model)) == sorted(decay_parameter_names(model))


def test_decay_names_ignore_frozen_flags_and_return_strings(workbook):
    model = odd_model()
    model["ln"].weight.requires_grad_(False)
    names = workbook("10").get_decay_parameter_names(model)
    assert all(isinstance(n, str) for n in names) and "ln.weight" not in names


class Tiny(nn.Module):
    """Hugging Face call convention: model(**batch).loss."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 64), nn.GELU(), nn.Linear(64, 2))

    def forward(self, x, labels):
        logits = self.net(x)

        class Out:
            pass

        out = Out()
        out.loss = nn.functional.cross_entropy(logits.float(), labels)
        out.dtype = logits.dtype
        self.last_dtype = logits.dtype
        return out


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 8, generator=g)
    return {"x": x, "labels": (x[:, 0] > 0).long()}


def test_training_step_trains_a_model_under_bf16_autocast(workbook):
    step = workbook("10").training_step
    model = Tiny()
    opt = Adam8bit(model.parameters(), lr=1e-2, min_8bit_size=256)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0)
    first = None
    for _ in range(30):
        loss = step(model, batch(), opt, sched, dtype=torch.bfloat16)
        first = loss if first is None else first
        assert isinstance(loss, float) and math.isfinite(loss)
    assert loss < 0.5 * first
    assert model.last_dtype == torch.bfloat16  # the forward ran under autocast
    assert all(p.grad is None or not p.grad.abs().sum() for p in model.parameters())  # grads cleared


def test_training_step_advances_the_scheduler_once_per_call(workbook):
    step = workbook("10").training_step
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (1 + t))
    for _ in range(3):
        step(model, batch(), opt, sched)
    assert sched.last_epoch == 3 and opt.param_groups[0]["lr"] == pytest.approx(0.1 / 4)
