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

from ..grading.drivers.ex10 import Calls  # the spy lives with workbook 10's drivers, where the learner's step runs

__all__ = ["Calls", "order_hint"]


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
