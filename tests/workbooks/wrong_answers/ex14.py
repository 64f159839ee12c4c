"""Workbook 14 · the whole bill: what learners plausibly write instead of the solution."""

from __future__ import annotations

import functools

from adam8lib.course import checks
from adam8lib.memory_tracker import BILL
from tests.workbooks.wrong_answers import Right, Wrong


# ---------------------------------------------------------------------------------- 14.1
def release_right(model, make_optimizer):
    handles = []
    for p in model.parameters():
        if p.requires_grad:
            opt = make_optimizer([p])

            def hook(param, opt=opt):
                opt.step()
                param.grad = None

            handles.append(p.register_post_accumulate_grad_hook(hook))
    return handles


def release_one_optimizer(model, make_optimizer):
    """One optimizer for every parameter, stepped in each hook: the others have no gradient then."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params)

    def hook(param):
        opt.step()
        opt.zero_grad(set_to_none=True)

    return [p.register_post_accumulate_grad_hook(hook) for p in params]


def release_partial_and_dict(model, make_optimizer):
    """A dict of optimizers looked up by the tensor, functools.partial, and zero_grad(set_to_none=True)."""
    optimizers = {p: make_optimizer([p]) for p in model.parameters() if p.requires_grad}

    def step(table, param):
        table[param].step()
        table[param].zero_grad(set_to_none=True)

    return [p.register_post_accumulate_grad_hook(functools.partial(step, optimizers)) for p in optimizers]


def release_no_free(model, make_optimizer):
    handles = []
    for p in model.parameters():
        if p.requires_grad:
            opt = make_optimizer([p])
            handles.append(p.register_post_accumulate_grad_hook(lambda param, opt=opt: opt.step()))
    return handles


def release_zeroed(model, make_optimizer):
    handles = []
    for p in model.parameters():
        if p.requires_grad:
            opt = make_optimizer([p])

            def hook(param, opt=opt):
                opt.step()
                param.grad.zero_()

            handles.append(p.register_post_accumulate_grad_hook(hook))
    return handles


def release_free_first(model, make_optimizer):
    handles = []
    for p in model.parameters():
        if p.requires_grad:
            opt = make_optimizer([p])

            def hook(param, opt=opt):
                param.grad = None
                opt.step()

            handles.append(p.register_post_accumulate_grad_hook(hook))
    return handles


def release_late_binding(model, make_optimizer):
    handles = []
    for p in model.parameters():
        if p.requires_grad:
            opt = make_optimizer([p])

            def hook(param):
                opt.step()  # the loop's last optimizer, by the time any hook runs
                param.grad = None

            handles.append(p.register_post_accumulate_grad_hook(hook))
    return handles


def release_tensor_hook(model, make_optimizer):
    """register_hook: called with the gradient before autograd writes it into p.grad."""
    handles = []
    for p in model.parameters():
        if p.requires_grad:
            opt = make_optimizer([p])

            def hook(grad, p=p, opt=opt):
                p.grad = grad
                opt.step()
                p.grad = None

            handles.append(p.register_hook(hook))
    return handles


def release_frozen_too(model, make_optimizer):
    handles = []
    for p in model.parameters():
        opt = make_optimizer([p])

        def hook(param, opt=opt):
            opt.step()
            param.grad = None

        handles.append(p.register_post_accumulate_grad_hook(hook))
    return handles


def release_every_module(model, make_optimizer):
    """model.modules() includes the model: every parameter is visited twice (or more)."""
    handles = []
    for module in model.modules():
        for p in module.parameters():
            if p.requires_grad:
                opt = make_optimizer([p])

                def hook(param, opt=opt):
                    opt.step()
                    param.grad = None

                handles.append(p.register_post_accumulate_grad_hook(hook))
    return handles


def release_no_return(model, make_optimizer):
    release_right(model, make_optimizer)


WRONG = [
    Wrong("14.1", checks.check_release_by_hand, release_no_free, mistake="steps but never frees the gradient",
          hint="free the gradient right after the step", names_mistake=True),
    Wrong("14.1", checks.check_release_by_hand, release_zeroed, mistake="p.grad.zero_() instead of p.grad = None",
          hint="zeroing the gradient keeps its memory", names_mistake=True),
    Wrong("14.1", checks.check_release_by_hand, release_free_first, mistake="frees the gradient before the step",
          hint="step() before it frees the gradient", names_mistake=True),
    Wrong("14.1", checks.check_release_by_hand, release_late_binding, mistake="the hook uses the loop's variable",
          hint="a function defined in a loop sees the loop's last variables", names_mistake=True),
    Wrong("14.1", checks.check_release_by_hand, release_tensor_hook, mistake="register_hook instead of the "
          "post-accumulate-grad hook", hint="a hook from register_hook runs before autograd writes the gradient",
          names_mistake=True),
    Wrong("14.1", checks.check_release_by_hand, release_frozen_too, mistake="a hook on the frozen parameter too",
          hint="skip the parameters that do not require a gradient", names_mistake=True),
    Wrong("14.1", checks.check_release_by_hand, release_every_module, mistake="walks model.modules(), model included",
          hint="model.modules() includes the model itself", names_mistake=True),
    Wrong("14.1", checks.check_release_by_hand, release_no_return, mistake="returns nothing",
          hint="return the list of the handles", names_mistake=False),
]
RIGHT = [
    Right("14.1", checks.check_release_by_hand, release_right, how="a closure with a default argument"),
    Right("14.1", checks.check_release_by_hand, release_one_optimizer, how="one optimizer for all, stepped in each hook"),
    Right("14.1", checks.check_release_by_hand, release_partial_and_dict,
          how="a dict of optimizers, functools.partial, zero_grad(set_to_none=True)"),
]


# ---------------------------------------------------------------------------------- 14.2
def _row(n, end, peak, largest="peak"):
    name = {"peak": peak, "end": end}[largest].largest_gradient
    return {"weights": end.bytes["parameters"] / n, "gradients": end.bytes["gradients"] / n,
            "state": end.bytes["optimizer_state"] / n, "between": end.sum() / n, "peak": peak.sum() / n,
            "largest_gradient": name[0] if name else None}


def bill_right(tracker):
    return _row(tracker.num_params, tracker.at_end_of("backward"), tracker.peak(categories=BILL))


def bill_by_hand(tracker):
    """The parts summed by hand, the peak found by walking the timeline."""
    n = tracker.num_params
    end = tracker.at_end_of("backward").bytes
    line = tracker.timeline()
    totals = [sum(line[c][i] for c in ("parameters", "gradients", "optimizer_state")) for i in line["event"]]
    best = max(range(len(totals)), key=lambda i: (totals[i], -i))
    peak = tracker.snapshot(best)
    parts = [end["parameters"] / n, end["gradients"] / n, end["optimizer_state"] / n]
    return {"weights": parts[0], "gradients": parts[1], "state": parts[2],
            "between": (end["parameters"] + end["gradients"] + end["optimizer_state"]) / n,
            "peak": totals[best] / n, "largest_gradient": peak.gradients[0][0] if peak.gradients else None}


def bill_peak_of_everything(tracker):
    row = bill_right(tracker)
    row["peak"] = tracker.peak().total / tracker.num_params
    return row


def bill_at_overall_peak(tracker):
    row = bill_right(tracker)
    row["peak"] = tracker.peak().sum() / tracker.num_params
    return row


def bill_in_mib(tracker):
    row = bill_right(tracker)
    return {k: (v * tracker.num_params / 2**20 if k != "largest_gradient" else v) for k, v in row.items()}


def bill_per_tensor(tracker):
    row = bill_right(tracker)
    return {k: (v * tracker.num_params / len(tracker.named_params) if k != "largest_gradient" else v)
            for k, v in row.items()}


def bill_after_step(tracker):
    n = tracker.num_params
    return _row(n, tracker.at_end_of("step"), tracker.peak(categories=BILL))


def bill_parts_at_peak(tracker):
    n = tracker.num_params
    peak = tracker.peak(categories=BILL)
    row = _row(n, peak, peak)
    row["between"] = tracker.at_end_of("backward").sum() / n
    return row


def bill_largest_at_end(tracker):
    return _row(tracker.num_params, tracker.at_end_of("backward"), tracker.peak(categories=BILL), largest="end")


def bill_largest_tuple(tracker):
    row = bill_right(tracker)
    row["largest_gradient"] = tracker.peak(categories=BILL).largest_gradient
    return row


def bill_swapped(tracker):
    row = bill_right(tracker)
    row["weights"], row["state"] = row["state"], row["weights"]
    return row


def bill_no_gradients_in_sum(tracker):
    row = bill_right(tracker)
    row["between"] = row["weights"] + row["state"]
    return row


def bill_peak_as_sum_of_maxima(tracker):
    """Each part's highest value on the timeline, added: the parts peak at different moments."""
    row = bill_right(tracker)
    line = tracker.timeline()
    row["peak"] = sum(max(line[c]) for c in ("parameters", "gradients", "optimizer_state")) / tracker.num_params
    return row


def bill_read_after_forward(tracker):
    """Every part read when forward ends (before backward): no gradient yet, a first step's state not made."""
    n = tracker.num_params
    return _row(n, tracker.at_end_of("forward"), tracker.peak(categories=BILL))


def bill_state_read_after_the_step(tracker):
    """Weights and state read at the end of the whole step (the state a first step makes is there then)."""
    row = bill_right(tracker)
    last = tracker.snapshot(-1)
    row["weights"] = last.bytes["parameters"] / tracker.num_params
    row["state"] = last.bytes["optimizer_state"] / tracker.num_params
    return row


def bill_largest_read_before_backward(tracker):
    row = bill_right(tracker)
    found = tracker.at_end_of("forward").largest_gradient
    row["largest_gradient"] = found[0] if found else None
    return row


def bill_peak_in_backward_only(tracker):
    row = bill_right(tracker)
    row["peak"] = tracker.peak(phase="backward", categories=BILL).sum() / tracker.num_params
    return row


WRONG += [
    Wrong("14.2", checks.check_bill_row, bill_peak_of_everything, mistake="peak of every category (tracker.peak())",
          hint="that is the peak of everything live", names_mistake=True),
    Wrong("14.2", checks.check_bill_row, bill_at_overall_peak, mistake="the bill at the overall peak's moment",
          hint="that is the bill at the moment everything else peaks", names_mistake=True),
    Wrong("14.2", checks.check_bill_row, bill_in_mib, mistake="MiB instead of bytes per parameter",
          hint="it is in MiB", names_mistake=True),
    Wrong("14.2", checks.check_bill_row, bill_per_tensor, mistake="divided by the number of tensors",
          hint="you divided by the number of parameter tensors", names_mistake=True),
    Wrong("14.2", checks.check_bill_row, bill_after_step, mistake="read after the step phase",
          hint="you read it at a moment when no gradient is alive", names_mistake=True),
    Wrong("14.2", checks.check_bill_row, bill_parts_at_peak, mistake="the parts read at the bill's peak",
          hint="you read it at the bill's peak", names_mistake=True),
    Wrong("14.2", checks.check_bill_row, bill_largest_at_end, mistake="largest gradient when backward ends",
          hint="you named the largest gradient alive when backward ends", names_mistake=True),
    Wrong("14.2", checks.check_bill_row, bill_largest_tuple, mistake="(name, bytes) instead of the name",
          hint="the name only", names_mistake=True),
    Wrong("14.2", checks.check_bill_row, bill_swapped, mistake="weights and state swapped",
          hint="that is the 'state' part", names_mistake=True),
    Wrong("14.2", checks.check_bill_row, bill_no_gradients_in_sum, mistake="between = weights + state",
          hint="the gradients are missing from the sum", names_mistake=True),
    Wrong("14.2", checks.check_bill_row, bill_peak_as_sum_of_maxima, mistake="peak = the sum of each part's maximum",
          hint="you added each part's own maximum", names_mistake=True),
    Wrong("14.2", checks.check_bill_row, bill_read_after_forward, mistake="the parts read when forward ends",
          hint="you read it at a moment when no gradient is alive", names_mistake=True),
    Wrong("14.2", checks.check_bill_row, bill_state_read_after_the_step,
          mistake="weights and state read after the step (a first step's state made by then)",
          hint="you read it after the step", names_mistake=True),
    Wrong("14.2", checks.check_bill_row, bill_largest_read_before_backward,
          mistake="largest gradient read before backward (None)", hint="you say no gradient is alive at the bill's peak",
          names_mistake=True),
    Wrong("14.2", checks.check_bill_row, bill_peak_in_backward_only, mistake="the peak looked for in backward only",
          hint="the highest the bill gets during backward", names_mistake=True),
]
RIGHT += [
    Right("14.2", checks.check_bill_row, bill_right, how="Snapshot.bytes and sum()"),
    Right("14.2", checks.check_bill_row, bill_by_hand, how="sums by hand, the peak found on the timeline"),
]


def bill_floor_division(tracker):
    n = tracker.num_params
    end, peak = tracker.at_end_of("backward"), tracker.peak(categories=BILL)
    largest = peak.largest_gradient
    return {"weights": end.bytes["parameters"] // n, "gradients": end.bytes["gradients"] // n,
            "state": end.bytes["optimizer_state"] // n, "between": end.sum() // n, "peak": peak.sum() // n,
            "largest_gradient": largest[0] if largest else None}


def bill_weights_as_an_int(tracker):
    """Right numbers, but 'weights' an int where it comes out whole (4 bytes per fp32 parameter)."""
    row = bill_right(tracker)
    if row["weights"].is_integer():
        row["weights"] = int(row["weights"])
    return row


WRONG += [
    Wrong("14.2", checks.check_bill_row, bill_floor_division, mistake="bytes // num_params (floor division)",
          hint="rounded down to a whole number: floor division", names_mistake=True),
    Wrong("14.2", checks.check_bill_row, bill_weights_as_an_int, mistake="an int 4 for 'weights' (floats asked)",
          hint="is the int 4, expected a Python float", names_mistake=True),
]


# ------------------------------------------------------------------ issue 51: what fresh cold learners wrote
def bill_between_everything_live(tracker):
    """Wrong: 'between' as the snapshot's total, every category (activations and transient too)."""
    row = bill_right(tracker)
    row["between"] = tracker.at_end_of("backward").total / tracker.num_params
    return row


WRONG_COLD_LEARNERS = [
    Wrong("14.2", checks.check_bill_row, bill_between_everything_live, mistake="'between' as the snapshot's total "
          "(all categories)", hint="that counts activations and transient buffers too", names_mistake=True),
]
WRONG += WRONG_COLD_LEARNERS
