"""checks/_spy.py: the event log of a training step's calls, and the hints that name a wrong order."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from adam8lib.course.checks._spy import Calls, order_hint


def setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    return model, opt, sched, Calls(model, opt, sched)


def test_the_log_records_each_call_in_order():
    model, opt, sched, calls = setup()
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(5, 4)).float().sum()
    loss.backward()
    opt.step()
    sched.step()
    assert calls.clear() == ["zero", "forward", "backward", "step", "sched"]
    assert calls.events == []


def test_the_log_sees_a_step_without_gradients_and_a_backward_under_autocast():
    model, opt, sched, calls = setup()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(5, 4)).float().sum()
        loss.backward()
    model.zero_grad()
    opt.step()
    assert calls.events == ["forward", "backward@autocast", "zero", "step-nograd"]


def test_a_scaler_call_is_logged_once_even_when_it_calls_another_method():
    model, opt, _, _ = setup()
    scaler = torch.amp.GradScaler("cpu")
    calls = Calls(model, opt, None, scaler)
    scaler.scale(model(torch.randn(5, 4)).sum()).backward()
    scaler.step(opt)  # calls unscale_ inside: not logged twice
    scaler.update()
    assert calls.events == ["forward", "scale", "backward", "scaler.step", "step", "update"]


@pytest.mark.parametrize("events", [
    ["forward", "backward", "step", "sched", "zero"],
    ["zero", "forward", "backward", "step", "sched"],
    ["forward", "backward", "step", "zero", "sched"],
])
def test_a_right_order_gets_no_hint(events):
    assert order_hint(events) is None


@pytest.mark.parametrize("events, hint", [
    (["forward", "step-nograd", "backward", "sched", "zero"], "optimizer.step() ran before loss.backward()"),
    (["forward", "backward", "zero", "step-nograd", "sched"], "zero_grad() ran between backward and optimizer.step()"),
    (["forward", "backward", "sched", "step", "zero"], "call scheduler.step() AFTER optimizer.step()"),
    (["forward", "backward", "step", "sched", "sched", "zero"], "ran 2 times in one training step"),
    (["forward", "backward@autocast", "step", "sched", "zero"], "ran inside the autocast block"),
    (["forward", "step", "sched"], "never calls loss.backward()"),
    (["forward", "backward", "sched", "zero"], "never calls optimizer.step()"),
])
def test_a_wrong_order_is_named(events, hint):
    assert hint in order_hint(events)
