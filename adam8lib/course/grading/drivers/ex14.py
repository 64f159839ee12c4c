"""Drivers of workbook 14 (:mod:`adam8lib.course.checks.ex14_the_whole_bill`): the learner's gradient release
registered on a model the driver builds (:class:`Tied`, from a fixed seed) and trained for a few backward
passes with the optimizer the check names; the learner's bill row read from trackers the driver measures.
What they did comes back as plain data: which parameters were stepped how often, which gradients were left,
the parameters at the end; the numbers of each row."""

from __future__ import annotations

import torch
from torch import nn

from ....memory_tracker import MemoryTracker, track_step
from ....optim import AdamW8bit
from ....release import release_gradients
from . import attempt, described, driver

__all__ = ["Tied", "batches", "loss_of", "OPTIMIZERS", "steps_of", "tracked_rows", "release_run", "bill_rows"]


class Tied(nn.Module):
    """A model with a parameter used twice (``shared`` applied in two places: one tensor, two gradient
    contributions), a frozen one, a matrix large enough for 8-bit states (8,192 elements) and small ones."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(32, 128)
        self.shared = nn.Linear(128, 128, bias=False)  # 16,384 elements, used twice
        self.out = nn.Linear(128, 4)
        self.frozen = nn.Parameter(torch.ones(4), requires_grad=False)
        self.to(dtype)

    def forward(self, x):
        h = torch.tanh(self.shared(torch.tanh(self.inp(x))))
        return self.out(torch.tanh(self.shared(h))) * self.frozen


def batches(n, dtype=torch.float32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 32, generator=gen).to(dtype), torch.randint(0, 4, (16,), generator=gen)) for _ in range(n)]


def loss_of(model, x, y):
    return nn.functional.cross_entropy(model(x).float(), y)


#: the optimizers a release is tried with, by the name the check sends
OPTIMIZERS = {
    "torch.optim.AdamW": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "adam8lib AdamW8bit": lambda ps: AdamW8bit(ps, lr=1e-2, weight_decay=0.1),
}


def steps_of(p, made) -> int:
    """How many steps the optimizers in ``made`` gave ``p`` (from their state's step counters)."""
    total = 0
    for opt in made:
        st = opt.state.get(p, {})
        step = st.get("step", 0)
        total += int(step.item() if torch.is_tensor(step) else step)
    return total


@driver
def release_run(release_by_hand, optimizer: str, steps: int) -> dict:
    """``release_by_hand(model, make_optimizer)`` on a fresh :class:`Tied` with ``make_optimizer`` making the
    optimizer named ``optimizer`` per call; then ``steps`` backward passes on :func:`batches`, the handles removed
    and one more backward. Returns what the handles are, after each backward which parameters were stepped how
    often, which changed, which still hold a gradient, the trainable parameters at the end, whether a backward
    after removing the handles still freed gradients — and where the learner's code raised, if it did."""
    make_one = OPTIMIZERS[optimizer]
    made: list = []

    def make(params):
        opt = make_one(params)
        made.append(opt)
        return opt

    model = Tied()
    names = {id(p): n for n, p in model.named_parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    handles = release_by_hand(model, make)  # an exception here is the learner function's own: the check names it
    out = {"handles": {"none": handles is None, "type": type(handles).__name__, "listable": False, "removable": False,
                       "types": [], "count": 0},
           "trainable": [names[id(p)] for p in trainable], "steps": [], "error": None, "error_at": None,
           "params": None, "freed_after_remove": None,
           # which kind of hook the learner's code left on the parameters (Tensor.register_hook runs before .grad is
           # written; register_post_accumulate_grad_hook after)
           "hooks": {"post_accumulate": sum(bool(getattr(p, "_post_accumulate_grad_hooks", None)) for p in trainable),
                     "gradient": sum(bool(getattr(p, "_backward_hooks", None)) for p in trainable)}}
    if handles is None:
        return out
    try:
        handles = list(handles)
    except TypeError:
        return out
    out["handles"].update(listable=True, removable=all(hasattr(h, "remove") for h in handles),
                          types=[type(h).__name__ for h in handles][:4], count=len(handles))
    if not out["handles"]["removable"] or len(handles) != len(trainable):
        return out
    before = [p.detach().clone() for p in trainable]
    for x, y in batches(steps):
        _, error = attempt(lambda: loss_of(model, x, y).backward())
        if error is not None:
            out.update(error=error, error_at="backward")
            return out
        left = [names[id(p)] for p in trainable if p.grad is not None]
        out["steps"].append({
            "stepped": {names[id(p)]: steps_of(p, made) for p in trainable},
            "all_unchanged": all(torch.equal(b, p) for b, p in zip(before, trainable)),
            "changed": [names[id(p)] for b, p in zip(before, trainable) if not torch.equal(b, p)],
            "left": left,
            "zeroed": bool(left) and all(float(dict(model.named_parameters())[n].grad.abs().max()) == 0 for n in left)})
    out["params"] = [p.detach().clone() for p in trainable]

    def remove_and_train():
        for h in handles:
            h.remove()
        x, y = batches(1, seed=9)[0]
        loss_of(model, x, y).backward()

    _, error = attempt(remove_and_train)
    if error is not None:
        out.update(error=error, error_at="remove")
        return out
    out["freed_after_remove"] = any(p.grad is None for p in trainable)
    return out


#: a row where something outside the bill is alive when backward ends: the logits, kept for logging
_LOGGED = "8-bit AdamW, its logits kept for logging (alive, outside the bill, when backward ends)"


def _logged_loss(model, x, y, kept: list):
    logits = model(x).float()
    kept.append(logits)
    return nn.functional.cross_entropy(logits, y)


def tracked_rows() -> list[tuple[str, MemoryTracker]]:
    """Trackers of training steps of :class:`Tied`: fp32 AdamW, 8-bit AdamW with bf16 weights, stochastic rounding
    and gradient release (no gradient left when backward ends), and 8-bit AdamW on fp32 weights, each tracked after
    a first step (the state exists before the step); then three FIRST steps, where the state is made during the
    tracked step — in the step (fp32 AdamW, 8-bit AdamW) or inside backward (release) — so that the weights and
    state are not the same at every moment and the parts peak at different moments; last, 8-bit AdamW with its logits
    kept alive (activations outside the bill when backward ends: 'between' is not everything live)."""
    out = []
    for label, dtype, make, release, first in (
            ("fp32 AdamW", torch.float32, lambda ps: torch.optim.AdamW(ps, lr=1e-3), False, False),
            ("bf16 + SR + 8-bit + release", torch.bfloat16,
             lambda ps: AdamW8bit(ps, lr=1e-3, stochastic_rounding=True), True, False),
            ("8-bit AdamW", torch.float32, lambda ps: AdamW8bit(ps, lr=1e-3), False, False),
            ("the first step of fp32 AdamW (its state made in the step)", torch.float32,
             lambda ps: torch.optim.AdamW(ps, lr=1e-3), False, True),
            ("the first step of 8-bit AdamW (its state made in the step)", torch.float32,
             lambda ps: AdamW8bit(ps, lr=1e-3), False, True),
            ("the first step of bf16 + SR + 8-bit + release (each state made inside backward)", torch.bfloat16,
             lambda ps: AdamW8bit(ps, lr=1e-3, stochastic_rounding=True), True, True),
            (_LOGGED, torch.float32, lambda ps: AdamW8bit(ps, lr=1e-3), False, False)):
        model = Tied(dtype)
        opt = make([p for p in model.parameters() if p.requires_grad])
        handle = release_gradients([p for p in model.parameters() if p.requires_grad], opt) if release else None
        x, y = batches(1, dtype)[0]
        if not first:
            loss_of(model, x, y).backward()  # a first step makes the state
            if not release:
                opt.step()
                opt.zero_grad(set_to_none=True)
        kept: list = []  # _LOGGED's logits, alive until this row is built (the tracker has stopped by then)
        compute = (lambda: _logged_loss(model, x, y, kept)) if label == _LOGGED else (lambda: loss_of(model, x, y))
        tracker = track_step(model, opt, compute)
        if handle:
            handle.remove()
        out.append((label, tracker))
    return out


def _answer(got) -> dict:
    """The learner's answer as plain data: a dict key by key (a value that is not plain data described by its
    type), anything else as a whole."""
    if type(got) is dict:
        kept = {}
        for key, value in got.items():
            if "plain" in described(key):
                kept[key] = described(value)
        return {"dict": kept}
    return {"value": described(got)}


@driver
def bill_rows(bill_row, labels: list) -> list:
    """``bill_row(tracker)`` for the trackers of :func:`tracked_rows` named in ``labels``, in order: each answer
    (:func:`_answer`) or where it raised."""
    rows = dict(tracked_rows())
    out = []
    for label in labels:
        got, error = attempt(lambda tracker=rows[label]: bill_row(tracker))
        out.append({"error": error} if error is not None else {"answer": _answer(got)})
    return out
