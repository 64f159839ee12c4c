"""Recording what a learner's training step calls, and in which order (workbook 10's checks).

A loss that differs from the reference says *that* a step is wrong, not *why*. A :class:`Calls`
log, attached to the model, optimizer, scheduler and (fp16) scaler the check hands to the
learner, records one event per call, so the hint can name the mistake ("optimizer.step() ran
before loss.backward()")::

    calls = Calls(model, optimizer, scheduler)
    loss = training_step(model, batch, optimizer, scheduler)
    calls.events  # ['forward', 'backward', 'step', 'sched', 'zero']
    order_hint(calls.events)  # None: nothing to say about the order

Events: ``forward`` (the model's forward), ``backward`` (a gradient reached the parameters; one
per backward pass), ``backward@autocast`` (the same, inside an autocast block), ``step`` (the
optimizer stepped with gradients present), ``step-nograd`` (it stepped without any gradient),
``sched``, ``zero`` (optimizer.zero_grad or model.zero_grad), and for a GradScaler ``scale``,
``unscale``, ``scaler.step``, ``update``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

__all__ = ["Calls", "order_hint"]


class Calls:
    """An event log of the calls a step makes on the objects it was given."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None,
                 scaler: Any = None) -> None:
        self.events: list[str] = []
        self._depth = 0
        model.register_forward_hook(lambda m, i, o: self.events.append("forward"))
        first = next(p for p in model.parameters() if p.requires_grad)  # every backward reaches it
        first.register_post_accumulate_grad_hook(self._backward)
        optimizer.register_step_pre_hook(self._step)
        self._wrap(optimizer, "zero_grad", "zero")
        self._wrap(model, "zero_grad", "zero")
        if scheduler is not None:
            self._wrap(scheduler, "step", "sched")
        if scaler is not None:
            for method, event in [("scale", "scale"), ("unscale_", "unscale"), ("step", "scaler.step"),
                                  ("update", "update")]:
                self._wrap(scaler, method, event)

    def _backward(self, p: torch.Tensor) -> None:
        on = any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda"))
        self.events.append("backward@autocast" if on else "backward")

    def _step(self, optimizer, args, kwargs) -> None:
        has_grad = any(p.grad is not None and bool(p.grad.any()) for g in optimizer.param_groups for p in g["params"])
        self.events.append("step" if has_grad else "step-nograd")

    def _wrap(self, obj: Any, method: str, event: str) -> None:
        original = getattr(obj, method)

        @functools.wraps(original)
        def recorded(*args, **kwargs):
            if self._depth == 0:  # scaler.step calls unscale_ itself: record the outer call only
                self.events.append(event)
            self._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1

        setattr(obj, method, recorded)

    def clear(self) -> list[str]:
        """The events so far, and start a new log (one per call of the learner's step)."""
        events, self.events = self.events, []
        return events


def _first(events: list[str], *names: str) -> int | None:
    return next((i for i, e in enumerate(events) if e in names), None)


def order_hint(events: list[str], *, backward: str = "loss.backward()") -> str | None:
    """A hint naming what is wrong with the order of one step's calls, or None."""
    bw = _first(events, "backward", "backward@autocast")
    st = _first(events, "step", "step-nograd")
    sc = _first(events, "scaler.step")
    step_at = st if st is not None else sc
    if "backward@autocast" in events:
        return (f"{backward} ran inside the autocast block: leave the `with` block after the forward "
                "(PyTorch: backward passes under autocast are not recommended; backward already uses the "
                "forward's dtypes)")
    if bw is None:
        return f"your step never calls {backward}: no gradients, nothing to step on"
    if step_at is None:
        return "your step never calls optimizer.step(): the weights do not move"
    if step_at < bw:
        return (f"optimizer.step() ran before {backward}: it stepped on no gradients (or the previous "
                "batch's); backward first, then step")
    zeros = [i for i, e in enumerate(events) if e == "zero"]
    if any(bw < z < step_at for z in zeros):
        return ("zero_grad() ran between backward and optimizer.step(), so the step saw no gradients: zero them "
                "after the step (or before the forward)")
    if "sched" in events and events.index("sched") < step_at:
        return ("scheduler.step() ran before optimizer.step(): the first update used the next step's learning "
                "rate; call scheduler.step() AFTER optimizer.step()")
    if events.count("sched") > 1:
        return f"scheduler.step() ran {events.count('sched')} times in one training step: call it once"
    return None
