"""Checks for workbook 14 · the whole bill: the post-accumulate-grad hook that steps one parameter and frees its
gradient (gradient release by hand), and one row of the bill read from a :class:`~adam8lib.MemoryTracker`.

Both are checked by *property*: the learner's code runs on small models, the check measures what it did (which
parameters were stepped, how many times, whether a gradient is left, which number of the tracker a value is) and
names the property that fails, rather than comparing with one expected piece of code.

The learner's code runs inside course drivers (:mod:`adam8lib.course.grading.drivers.ex14`): they build the model
or the trackers, run the learner's function on them and return plain data (what was stepped and freed, the
parameters, the row's numbers). This check decides from that alone, against its own reference run of the same
scenario (ordinary training with the same optimizers; its own trackers). When graded, the drivers run in the
learner's process and this check in the check process; in a notebook both run in the kernel."""

from __future__ import annotations

import math
from typing import Any

import torch

from ...memory_tracker import BILL, MemoryTracker
from ..grading.drivers import drive, reraise
from ..grading.drivers import ex14 as _drivers
from ._common import call, fail, passed, require_callable

__all__ = ["check_release_by_hand", "check_bill_row"]


# ---------------------------------------------------------------------------- shared models
#: the model, the batches and the loss both the drivers and this check's references use
_Tied, _batches, _loss = _drivers.Tied, _drivers.batches, _drivers.loss_of


# ---------------------------------------------------------------------------- 14.1
STEPS = 3
#: the optimizers a release is tried with (the drivers make the learner's by name, the references these)
_OPTIMIZERS = dict(_drivers.OPTIMIZERS)


def _reference(make, steps=STEPS):
    """Ordinary training with one optimizer per parameter: backward, every step, zero_grad."""
    model = _Tied()
    opts = [make([p]) for p in model.parameters() if p.requires_grad]
    for x, y in _batches(steps):
        _loss(model, x, y).backward()
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return model


def check_release_by_hand(release_by_hand) -> None:
    """``release_by_hand(model, make_optimizer)`` registers on every trainable parameter a post-accumulate-grad
    hook that steps it (with its own ``make_optimizer([p])``) and frees its gradient; returns the handles."""
    require_callable(release_by_hand, "release_by_hand")
    for label, make_one in _OPTIMIZERS.items():

        def make(params, make_one=make_one):  # what the learner's function is handed (the driver makes its own)
            return make_one(params)

        model = _Tied()  # the check's copy of the model the driver builds: its parameters, its names
        trainable = [p for p in model.parameters() if p.requires_grad]
        what = f"release_by_hand(model, make_optimizer) with {label}"

        def run(model, make_optimizer, label=label):  # the driver registers and trains in the learner's process
            return drive(release_by_hand, _drivers.release_run, label, STEPS)

        run.__name__ = run.__qualname__ = getattr(release_by_hand, "__name__", "release_by_hand")
        try:
            ran = call(run, model, make)
        except AssertionError as err:
            if isinstance(err.__cause__, RuntimeError) and "require" in str(err.__cause__):
                fail(f"{what} raised RuntimeError: {err.__cause__}",
                     hint="skip the parameters that do not require a gradient (p.requires_grad is False): "
                          "they get no gradient, and torch refuses a gradient hook on them")
            raise
        handles = ran["handles"]
        if handles["none"]:
            fail(f"{what} returned None.", hint="return the list of the handles that register_..._hook returned "
                                                "(so that the hooks can be removed)")
        if not handles["listable"]:
            fail(f"{what} returned a {handles['type']}, not a list of hook handles.",
                 hint="return the list of the handles that register_..._hook returned")
        if not handles["removable"]:
            fail(f"{what} returned {handles['types']}..., not hook handles.",
                 hint="return what p.register_post_accumulate_grad_hook(...) returns: a handle with .remove()")
        if handles["count"] == 2 * len(trainable):
            fail(f"{what} registered {handles['count']} hooks for {len(trainable)} trainable parameters.",
                 hint="every parameter got two hooks: model.modules() includes the model itself, whose "
                      "parameters() are all of them; walk model.parameters() once (each tensor once)")
        if handles["count"] != len(trainable):
            fail(f"{what} registered {handles['count']} hooks; the model has {len(trainable)} trainable parameters.",
                 hint="one hook per parameter that requires a gradient (each tensor once)")
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        for k, seen in enumerate(ran["steps"]):
            steps = {n: int(seen["stepped"].get(n, 0)) for n in names}
            if all(v == 0 for v in steps.values()) and seen["all_unchanged"]:
                hooks = ran.get("hooks") or {}
                if hooks.get("gradient") and not hooks.get("post_accumulate"):
                    fail(f"{what}: after a backward pass no parameter was stepped.",
                         hint="your hooks are Tensor.register_hook hooks: they run when a gradient is computed, "
                              "BEFORE it is accumulated into p.grad, so p.grad is still None there and step() skips "
                              "the parameter. The hook that runs once p.grad is complete is "
                              "register_post_accumulate_grad_hook.")
                fail(f"{what}: after a backward pass no parameter was stepped.",
                     hint="the hook must call the optimizer's step() before it frees the gradient: a parameter "
                          "whose .grad is None is skipped by step()")
            if steps["shared.weight"] == 2 * (k + 1) and all(v == k + 1 for n, v in steps.items() if n != "shared.weight"):
                fail(f"{what}: the shared parameter (used twice in the forward pass) was stepped twice per backward.",
                     hint="step once per backward, when the gradient is complete: one post-accumulate-grad hook "
                          "per tensor, which fires after the contributions of both uses are summed")
            changed = [n for n in seen["changed"] if n in names]
            if k == 0 and len(changed) == 1 and len(trainable) > 1:
                fail(f"{what}: after the first backward only {changed[0]} had changed.",
                     hint="every hook stepped the same optimizer: a function defined in a loop sees the loop's last "
                          "variables; bind the optimizer when the hook is made (a default argument, "
                          "functools.partial), or look it up from the tensor the hook is called with")
            left = [n for n in seen["left"] if n in names]
            if left:
                zeroed = bool(seen["zeroed"])
                fail(f"{what}: after backward, {', '.join(left)} still {'has' if len(left) == 1 else 'have'} a "
                     f"gradient{' (all zeros)' if zeroed else ''}.",
                     hint="zeroing the gradient keeps its memory: set p.grad = None" if zeroed else
                     "free the gradient right after the step, in a post-accumulate-grad hook (p.grad = None, or "
                     "zero_grad(set_to_none=True)); a hook from register_hook runs before autograd writes the "
                     "gradient into p.grad, so freeing it there is undone")
            wrong = [n for n, v in steps.items() if v != k + 1]
            if wrong:
                fail(f"{what}: after {k + 1} backward pass(es) the parameters were stepped "
                     f"{ {n: steps[n] for n in wrong} } times, expected {k + 1} each.",
                     hint="each parameter's hook steps that parameter once per backward")
        if ran["error_at"] == "backward":  # the learner's hook raised during a backward pass
            reraise(ran["error"])
        ref = _reference(make_one)  # the check's own run: ordinary training with the same optimizers
        theirs = ran["params"] or []
        differ = [n for (n, r), p in zip(((n, q) for n, q in ref.named_parameters() if q.requires_grad), theirs)
                  if not (r.shape == p.shape and r.dtype == p.dtype and torch.equal(r.detach(), p))]
        if differ or len(theirs) != len(trainable):
            fail(f"{what}: after {STEPS} steps the parameters {differ} differ from an ordinary "
                 f"backward(); step(); zero_grad() with the same optimizers.",
                 hint="step with the optimizer make_optimizer([p]) made for that parameter, with the gradient "
                      "complete (in a post-accumulate-grad hook), once per backward")
        if ran["error_at"] == "remove":
            reraise(ran["error"])
        if ran["freed_after_remove"] is not False:
            fail(f"{what}: after removing every handle you returned, a backward pass still freed gradients.",
                 hint="return the handles of the hooks you registered (the value of register_..._hook)")
    passed("Exercise 14.1 · Step and free, one parameter at a time")


# ---------------------------------------------------------------------------- 14.2
def _rows() -> list[tuple[str, MemoryTracker]]:
    """The check's own trackers: :func:`~adam8lib.course.grading.drivers.ex14.tracked_rows` (the learner's function
    reads the same rows, measured by the driver in the learner's process)."""
    return _drivers.tracked_rows()


def _expected(tracker: MemoryTracker) -> dict[str, Any]:
    n = tracker.num_params
    end, peak = tracker.at_end_of("backward"), tracker.peak(categories=BILL)
    return {"weights": end.bytes["parameters"] / n, "gradients": end.bytes["gradients"] / n,
            "state": end.bytes["optimizer_state"] / n, "between": end.sum() / n, "peak": peak.sum() / n,
            "largest_gradient": peak.largest_gradient[0] if peak.largest_gradient else None}


def _named_value(tracker: MemoryTracker, key: str, got: float, want: float) -> str | None:
    """Which other number of the tracker ``got`` is, in words (the property that went wrong), or None."""
    n = tracker.num_params
    end, peak, top = tracker.at_end_of("backward"), tracker.peak(categories=BILL), tracker.peak()
    tensors = len(tracker.named_params)

    def close(a, b):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)

    if want and close(got, want * n / 2**20):
        return "it is in MiB: divide the bytes by the number of parameters (tracker.num_params), not by 2**20"
    if want and close(got, want * n):
        return "it is in bytes: divide by the number of parameters (tracker.num_params)"
    if want and close(got, want * n / tensors):
        return "you divided by the number of parameter tensors: divide by the number of parameters, tracker.num_params"
    part = {"weights": "parameters", "gradients": "gradients", "state": "optimizer_state"}
    try:
        after_step = tracker.at_end_of("step")
    except ValueError:  # released: no step phase
        after_step = None
    forward = tracker.at_end_of("forward")
    line = tracker.timeline()
    each_max = sum(max(line[c]) for c in BILL)  # every part at its own highest, at whatever moment
    if key == "peak" and close(got, each_max / n) and not close(got, want):
        return ("you added each part's own maximum: the parts peak at different moments (the gradients during "
                "backward, the state once it is made), so those maxima are never alive together. The peak is the "
                "highest the three reach TOGETHER, at one moment of the step.")
    if key == "peak":
        try:
            in_backward = tracker.peak(phase="backward", categories=BILL).sum()
        except ValueError:
            in_backward = None
        if in_backward is not None and close(got, in_backward / n) and not close(got, want):
            return ("that is the highest the bill gets during backward; here it is higher in the step (the first "
                    "step makes the optimizer's state while the gradients are still alive): look at every moment.")
    if key in part and after_step is not None and not close(got, want) and close(
            got, after_step.bytes[part[key]] / n) and close(got, forward.bytes[part[key]] / n):
        return ("you read it at a moment when no gradient is alive: before backward (when forward ends) or after the "
                "step has freed them. Read the three parts when backward ends.")
    if after_step is not None and key in part:
        if close(got, after_step.bytes[part[key]] / n) and not close(got, want):
            return ("you read it after the step, when the gradients are freed (and with gradient release there is "
                    "no 'step' phase): read the bill at the end of 'backward'")
    if key in part and close(got, forward.bytes[part[key]] / n) and not close(got, want):
        return ("you read it when the forward pass ended, before backward: the gradients are not made yet then, and "
                "a first step has not made its state. Read the three parts when backward ends.")
    if key in part:
        for other, cat in part.items():
            if other != key and close(got, end.bytes[cat] / n) and not close(got, want):
                return f"that is the {other!r} part: '{key}' is the tracker's {part[key]!r} category"
        if close(got, peak.bytes[part[key]] / n):
            return "you read it at the bill's peak: the parts are read when backward ends (at_end_of('backward'))"
    if key == "between":
        if close(got, (end.bytes["parameters"] + end.bytes["optimizer_state"]) / n) and end.bytes["gradients"]:
            return "the gradients are missing from the sum"
        if close(got, forward.sum() / n):
            return ("that is the bill when the forward pass ended, before backward made any gradient: 'between' is "
                    "the bill when backward ends")
        if after_step is not None and close(got, after_step.sum() / n):
            return ("that is the bill after the step (its gradients freed): 'between' is the bill when backward "
                    "ends, before the step")
        if close(got, end.total / n):
            return "that counts activations and transient buffers too: the bill is weights + gradients + state only"
        if close(got, peak.sum() / n):
            return "that is the bill's peak: 'between' is the bill when backward ends"
        if close(got, (end.bytes["parameters"] + end.bytes["optimizer_state"]) / n):
            return "the gradients are missing from the sum"
    if key == "peak":
        if close(got, top.total / n):
            return ("that is the peak of everything live (activations and transient included): take the peak of "
                    "the bill's categories, tracker.peak(categories=BILL)")
        if close(got, top.sum() / n):
            return ("that is the bill at the moment everything else peaks: the bill has its own peak, "
                    "tracker.peak(categories=BILL)")
        if close(got, end.sum() / n):
            return "that is the bill when backward ends: the peak is the highest it is at any moment of the step"
    return None


class _Theirs:
    """A value of the learner's answer that is not plain data: only its type's name and its repr crossed."""

    def __init__(self, kind: str, shown: str):
        self.kind, self.shown = str(kind), str(shown)

    def __repr__(self) -> str:
        return self.shown


def _kind(value) -> str:
    return value.kind if isinstance(value, _Theirs) else type(value).__name__


def _their_answer(answer: dict):
    """The learner's answer as the driver returned it (:func:`~adam8lib.course.grading.drivers.ex14.bill_rows`)."""

    def one(described: dict):
        return described["plain"] if "plain" in described else _Theirs(described.get("kind"), described.get("repr"))

    if "dict" in answer:
        return {key: one(value) for key, value in answer["dict"].items()}
    return one(answer["value"])


def check_bill_row(bill_row) -> None:
    """``bill_row(tracker)``: weights, gradients, state and their sum when backward ends, the bill's peak
    (bytes per parameter) and the name of the largest gradient alive at that peak."""
    require_callable(bill_row, "bill_row")
    keys = ("weights", "gradients", "state", "between", "peak", "largest_gradient")
    rows = _rows()  # the check's own trackers; the driver measures the same rows where the learner's function runs
    answers = drive(bill_row, _drivers.bill_rows, [label for label, _ in rows])
    for (label, tracker), answer in zip(rows, answers):
        what = f"bill_row(tracker) for the row {label!r}"

        def read(tracker, answer=answer):  # the learner's answer for this row, or what their function raised
            if answer.get("error") is not None:
                reraise(answer["error"])
            return _their_answer(answer["answer"])

        read.__name__ = read.__qualname__ = getattr(bill_row, "__name__", "bill_row")
        try:
            got = call(read, tracker)
        except AssertionError as err:
            if isinstance(err.__cause__, ValueError) and "phase" in str(err.__cause__):
                fail(f"{what}: {err.__cause__}",
                     hint="with gradient release there is no 'step' phase (the step happens inside backward), and "
                          "after an ordinary step the gradients are freed: read the bill at the end of 'backward'")
            raise
        if not isinstance(got, dict):
            fail(f"{what} returned a {_kind(got)}, expected a dict.", hint=f"return a dict with keys {keys}")
        missing = [k for k in keys if k not in got]
        if missing:
            fail(f"{what} has no key(s) {missing}.", hint=f"return a dict with keys {keys}")
        want = _expected(tracker)
        name = got["largest_gradient"]
        if isinstance(name, tuple):
            fail(f"{what}: largest_gradient is {name!r}.",
                 hint="the name only: Snapshot.largest_gradient is (name, bytes); take its first item")
        if name != want["largest_gradient"]:
            end = tracker.at_end_of("backward")
            at_end = end.largest_gradient[0] if end.largest_gradient else None
            grads_peak = tracker.peak(categories="gradients").largest_gradient
            if name == at_end:
                hint = ("you named the largest gradient alive when backward ends; with gradient release none is left "
                        "then: name the largest alive at the bill's peak")
            elif name is None:
                hint = ("you say no gradient is alive at the bill's peak, but there is one: that is true only of a "
                        "moment before backward (the end of forward) or after the gradients are freed. Find the "
                        "moment the bill peaks first, then the gradients alive at that moment.")
            elif grads_peak is not None and name == grads_peak[0]:
                hint = ("that is the largest gradient where the GRADIENTS peak; the bill (weights + gradients + state) "
                        "peaks at another moment here: name the largest gradient alive at the bill's own peak")
            else:
                hint = "the largest gradient alive at the moment the bill (weights + gradients + state) peaks"
            fail(f"{what}: largest_gradient is {name!r}, expected {want['largest_gradient']!r}.", hint=hint)
        numbers = {key: got[key] for key in keys[:-1]
                   if not isinstance(got[key], bool) and isinstance(got[key], (int, float))}
        floored = [key for key, value in numbers.items() if value == math.floor(want[key]) != want[key]]
        if floored:
            key = floored[0]
            fail(f"{what}: {key!r} is {numbers[key]!r}, expected {want[key]!r} bytes per parameter.",
                 hint=f"{numbers[key]!r} is {want[key]!r} rounded down to a whole number: floor division (or int()) "
                      "drops the fraction, and bytes per parameter is not a whole number here. Divide the bytes by "
                      "tracker.num_params with true division, which keeps the fraction and gives a Python float.",
                 prop=f"the value of {key!r} (a fraction, not a whole number)")
        for key in keys[:-1]:
            value = got[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                fail(f"{what}: {key!r} is a {_kind(value)}, expected a number of bytes per parameter.",
                     hint="a Python float (bytes divided by tracker.num_params)")
            if not isinstance(value, float):
                fail(f"{what}: {key!r} is the int {value!r}, expected a Python float.",
                     hint=f"every number of the row is a Python float (the statement says so): bytes per parameter "
                          f"is a fraction in general, even where it comes out whole, as {key!r} does here. An int "
                          "comes from floor division or int(); divide the bytes by tracker.num_params with true "
                          "division.",
                     kind="type", what=what, got="int", expected="a Python float",
                     prop=f"the type of {key!r} (a Python float)")
            if not math.isclose(value, want[key], rel_tol=1e-9, abs_tol=1e-12):
                named = _named_value(tracker, key, float(value), want[key])
                fail(f"{what}: {key!r} is {value!r}, expected {want[key]!r} bytes per parameter.",
                     hint=named or f"'{key}': see the exercise's definition of each key")
    passed("Exercise 14.2 · A row of the bill")
