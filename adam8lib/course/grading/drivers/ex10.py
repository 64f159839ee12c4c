"""Drivers of workbook 10 (:mod:`adam8lib.course.checks.ex10_finetune`): the learner's training code handed the
models, optimizers, schedules, loaders, accelerators, Trainer arguments and GradScalers it works on, built here from
fixed seeds and the case the check names, and what it did returned as plain data — its answers, the events a spy
recorded (forward, backward, step, ...: :class:`Calls`), the losses, the learning rates, the parameters at the end.

The check builds the same objects in its own process for its reference runs and its messages, and compares what
came back with them; nothing of the learner's objects reaches it. The model classes and the spy live here (the
learner's process is not shown the checks when graded); the check module names them as before."""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import math
import warnings
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from . import attempt, described, driver

__all__ = ["Calls", "quiet", "ScaleNorm", "LayerScale", "NormalizedGate", "decay_models", "TinyClassifier",
           "tiny_batches", "setup", "batches", "epoch_setup", "amp_run",
           "decay_names_run", "training_step_run", "diagnose_step_run", "trainer_run", "epoch_run",
           "epoch_autocast_run", "amp_step_run", "answer"]


# ---------------------------------------------------------------------- the spy
class Calls:
    """An event log of the calls a step makes on the objects it was given (see :mod:`..checks._spy`)."""

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


@contextlib.contextmanager
def quiet():
    """Silence the notes that the first transformers model import may log (optional torchao
    kernels and the like): a check cell must print only its success line."""
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)


def answer(got) -> dict:
    """The learner's answer as plain data: a list or tuple item by item (with each item's type name), anything
    else as a whole (:func:`described`)."""
    if type(got) in (list, tuple):
        return {"seq": type(got).__name__, "items": [described(v) for v in got],
                "types": [type(v).__name__ for v in got]}
    return {"value": described(got), "type": type(got).__name__}


# ---------------------------------------------------------------------- 10.1
class ScaleNorm(nn.Module):
    """An RMSNorm-like layer of "some model": not a torch class, its name ends in ``Norm``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.gain * x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()


class LayerScale(nn.Module):
    """A per-channel gain (as in CaiT/ViT blocks): a 1-D parameter that is neither a bias nor a norm's."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), 0.1))

    def forward(self, x):
        return self.gamma * x


class NormalizedGate(nn.Module):
    """A gate whose class name STARTS with "Norm" but is no norm layer: its weight decays."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim, dim) * 0.1)

    def forward(self, x):
        return torch.sigmoid(x @ self.weight) * x


class _Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attn = nn.Linear(dim, dim)  # weight decays, bias does not
        self.ln = nn.LayerNorm(dim)  # a LayerNorm whose *name* says nothing about norms
        self.ffn = nn.Sequential(nn.Linear(dim, 2 * dim, bias=False), nn.GELU(), nn.Linear(2 * dim, dim))
        self.scale = LayerScale(dim)  # 1-D, decays: the "p.ndim >= 2" rule would leave it out


class _CustomNet(nn.Module):
    """Norm layers under names that no name pattern catches, and names that fool substring tests."""

    def __init__(self, dim: int = 8, rms: bool = True) -> None:
        super().__init__()
        self.tok = nn.Embedding(11, dim)
        self.blocks = nn.ModuleList([_Block(dim) for _ in range(2)])
        self.final = ScaleNorm(dim)
        if rms and hasattr(nn, "RMSNorm"):
            self.post = nn.RMSNorm(dim)
        self.denormalizer = nn.Linear(dim, dim)  # "norm" in the name, still a Linear: its weight decays
        self.bias_proj = nn.Linear(dim, dim)  # "bias" in the module's name: its weight decays, its bias does not
        self.gate = NormalizedGate(dim)  # "Norm" in the class name, but not at its end: decays
        self.temperature = nn.Parameter(torch.ones(1))  # a parameter of the model itself: decays
        self.bias = nn.Parameter(torch.zeros(dim))  # ...and one named bias: no decay


def decay_models() -> list[tuple[str, nn.Module]]:
    """10.1's cases: (label, model)."""
    with quiet():
        from ...finetune import build_distilbert

        distilbert = build_distilbert(small=True)
    return [
        ("DistilBERT (small)", distilbert),
        ("a custom model (LayerNorm named 'ln', an RMSNorm-like 'ScaleNorm', a Linear named 'denormalizer', "
         "a Linear named 'bias_proj', a 'NormalizedGate', a 1-D LayerScale gain)",
         _CustomNet()),
        ("nn.Sequential(Linear, LayerNorm, Linear without bias)",
         nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2, bias=False))),
    ]


@driver
def decay_names_run(get_decay_parameter_names, case: int) -> dict:
    """``get_decay_parameter_names(model)`` on 10.1's case number ``case``: the learner's answer (:func:`answer`)."""
    return answer(get_decay_parameter_names(decay_models()[case][1]))


# ---------------------------------------------------------------------- 10.2
class TinyClassifier(nn.Module):
    """A 2-class bag-of-embeddings model with the Hugging Face call convention
    (``model(input_ids=..., attention_mask=..., labels=...)`` returns ``.loss`` and ``.logits``)."""

    def __init__(self, vocab: int = 128, dim: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)  # 4096 elements: 8-bit states in Adam8bit
        self.hidden = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 2)

    def forward(self, input_ids, attention_mask, labels=None):
        mask = attention_mask.unsqueeze(-1).to(self.emb.weight.dtype)
        pooled = (self.emb(input_ids) * mask).sum(1) / mask.sum(1)
        logits = self.head(self.norm(torch.relu(self.hidden(pooled))))
        loss = nn.functional.cross_entropy(logits.float(), labels) if labels is not None else None
        return SimpleNamespace(loss=loss, logits=logits)


def tiny_batches(n: int, seed: int, distinct: int = 4) -> list[dict[str, torch.Tensor]]:
    """``n`` steps cycling over ``distinct`` batches; label = is token 1 in the sequence?"""
    gen = torch.Generator().manual_seed(seed)
    made = []
    for _ in range(distinct):
        ids = torch.randint(2, 128, (16, 12), generator=gen)
        labels = torch.randint(0, 2, (16,), generator=gen)
        ids[labels == 1, 0] = 1
        mask = torch.ones_like(ids)
        mask[:, 10:] = torch.randint(0, 2, (16, 2), generator=gen)
        made.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return [made[i % distinct] for i in range(n)]


def setup(seed: int, lr: float = 1e-2):
    """10.2's model, optimizer (8-bit Adam over two decay groups) and schedule (1 / sqrt(1 + step))."""
    from ....optim import Adam8bit
    from ....training import make_param_groups

    torch.manual_seed(seed)
    model = TinyClassifier()
    opt = Adam8bit(make_param_groups(model, 0.01), lr=lr, backend="torch")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / math.sqrt(1 + s))
    return model, opt, sched


def _changed(before: dict) -> dict:
    """The batch's tensors the learner's step changed in place (``before``: key -> (the tensor, a copy)), as they
    are now."""
    out = {}
    for key, (tensor, copy) in before.items():
        if tensor.shape != copy.shape or tensor.dtype != copy.dtype or not torch.equal(tensor, copy):
            out[key] = tensor.detach().clone()
    return out


@driver
def training_step_run(training_step, dtype, seed: int, steps: int) -> list:
    """``training_step(model, batch, optimizer, scheduler, dtype=dtype)`` over ``steps`` of :func:`tiny_batches`
    on :func:`setup`'s objects. Per step: the learner's answer, the events, the batch entries it changed and where
    it raised (the run stops there or at an answer that is not a float); the first step also says whether the
    model's forward ran under CPU / CUDA autocast and in which dtype, whether autocast warned that it was disabled,
    the weights' dtype and whether they moved."""
    model, opt, sched = setup(seed)
    w0 = model.hidden.weight.detach().clone()
    seen: list = []
    model.hidden.register_forward_hook(
        lambda m, i, o: seen.append((torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda"), str(o.dtype))))
    calls = Calls(model, opt, sched)
    out = []
    for step, batch in enumerate(tiny_batches(steps, seed)):
        before = {k: (v, v.detach().clone()) for k, v in batch.items() if torch.is_tensor(v)}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss, error = attempt(lambda batch=batch: training_step(model, batch, opt, sched, dtype=dtype))
        record = {"answer": described(loss), "type": type(loss).__name__, "error": error, "events": calls.clear(),
                  "batch": _changed(before)}
        if step == 0:
            record["first"] = {"seen": list(seen[0]) if seen else None,
                               "disabling": any("Disabling autocast" in str(w.message) for w in caught),
                               "weight_dtype": str(model.hidden.weight.dtype),
                               "unchanged": bool(torch.equal(model.hidden.weight.detach(), w0))}
        out.append(record)
        if error is not None or not isinstance(loss, float):
            break
    return out


@driver
def diagnose_step_run(training_step, dtype, seed: int) -> dict:
    """Two steps of the learner's ``training_step`` on :func:`setup`'s objects: whether the first raised, the
    schedule's step count and the learning rate after it (and before), every parameter after it, and the hidden
    layer's weight after the second (or where the second raised)."""
    two = tiny_batches(2, seed)
    model, opt, sched = setup(seed)
    lr0 = opt.param_groups[0]["lr"]
    _, error = attempt(lambda: training_step(model, two[0], opt, sched, dtype=dtype))
    if error is not None:
        return {"error": True}
    out = {"error": False, "last_epoch": described(sched.last_epoch).get("plain"), "lr0": lr0,
           "lr": described(opt.param_groups[0]["lr"]).get("plain"),
           "params": {n: p.detach().clone() for n, p in model.named_parameters()}}
    _, error = attempt(lambda: training_step(model, two[1], opt, sched, dtype=dtype))
    out.update(second_error=error, hidden2=model.hidden.weight.detach().clone())
    return out


# ---------------------------------------------------------------------- 10.3
#: the TrainingArguments 10.3's check hands the learner's function
TRAINER_ARGS = dict(learning_rate=3e-4, adam_beta1=0.85, adam_beta2=0.995, adam_epsilon=1e-7, weight_decay=0.05,
                    report_to=[], max_steps=4)


def trainer_inputs():
    """10.3's model (DistilBERT, small), TrainingArguments and dataset (8 examples)."""
    import tempfile

    with quiet():
        from transformers import TrainingArguments

        from ...finetune import build_distilbert

        model = build_distilbert(small=True)
        args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="adam8-check-"),
                                 use_cpu=not torch.cuda.is_available(), **TRAINER_ARGS)
    data = [{"input_ids": torch.tensor([101, 7, 8, 102]), "attention_mask": torch.ones(4, dtype=torch.long),
             "labels": torch.tensor(i % 2)} for i in range(8)]
    return model, args, data


@driver
def trainer_run(make_trainer_8bit) -> dict:
    """``make_trainer_8bit(model, args, data)`` on :func:`trainer_inputs`: what the Trainer is, its optimizer and
    schedule, each named parameter's group settings, whether it trains the model it was given, and whether after
    ``create_optimizer_and_scheduler`` the optimizer and schedule are still the learner's."""
    from transformers import Trainer

    from ....optim import Adam8bit

    model, args, data = trainer_inputs()
    with quiet():
        trainer = make_trainer_8bit(model, args, data)
    out = {"trainer": isinstance(trainer, Trainer), "type": type(trainer).__name__}
    if not out["trainer"]:
        return out
    opt = trainer.optimizer
    out.update(opt_none=opt is None, sched_is_optimizer=isinstance(trainer.lr_scheduler, torch.optim.Optimizer),
               adam8bit=isinstance(opt, Adam8bit), opt_type=type(opt).__name__, sched_none=trainer.lr_scheduler is None,
               same_model=trainer.model is model, groups={})
    if opt is None or not out["adam8bit"]:
        return out
    by_param = {id(p): g for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        if id(p) in by_param:
            g = by_param[id(p)]
            out["groups"][name] = {key: described(g.get(key)).get("plain", "<not plain data>")
                                   for key in ("weight_decay", "lr", "betas", "eps")}

    def create():
        with quiet():
            trainer.create_optimizer_and_scheduler(num_training_steps=args.max_steps)
        return trainer.optimizer is opt and getattr(trainer.lr_scheduler, "optimizer", None) is opt

    kept, error = attempt(create)
    out.update(kept_after_create=bool(kept), create_error=error)
    return out


# ---------------------------------------------------------------------- 10.4
class _TinyClassifier(nn.Module):
    """Linear -> dropout -> Linear; ``forward(x, labels)`` returns an object with ``.loss`` (like HF models)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 16)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(16, 3)

    def forward(self, x, labels, overflow=False):
        logits = self.head(self.drop(torch.relu(self.body(x))))
        loss = nn.functional.cross_entropy(logits.float(), labels)
        if overflow:  # a fake fp16 overflow: every gradient becomes inf/nan
            loss = loss * float("inf")
        return SimpleNamespace(loss=loss, logits=logits)



def batches(n=5, seed=0, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(8, 6, generator=gen) * scale, "labels": torch.randint(0, 3, (8,), generator=gen)}
            for _ in range(n)]


class _SpyAccelerator:
    """Delegates to a real Accelerator and counts what the loop calls."""

    def __init__(self, real, events: list[str] | None = None) -> None:
        self.real, self.calls = real, {"backward": 0, "autocast": 0, "clip_grad_norm_": 0}
        self.events = events if events is not None else []

    def backward(self, loss, **kw):
        self.calls["backward"] += 1
        return self.real.backward(loss, **kw)

    def autocast(self, *a, **kw):
        self.calls["autocast"] += 1
        return self.real.autocast(*a, **kw)

    def clip_grad_norm_(self, *a, **kw):
        self.calls["clip_grad_norm_"] += 1
        self.events.append("clip")
        return self.real.clip_grad_norm_(*a, **kw)

    def __getattr__(self, name):
        return getattr(self.real, name)



def epoch_setup(seed=0):
    torch.manual_seed(seed)
    model = _TinyClassifier()
    model.eval()  # as it comes back from an evaluation
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    return model, opt, sched


@driver
def epoch_run(train_epoch) -> dict:
    """``train_epoch(accelerator, model, optimizer, loader, scheduler, max_grad_norm=0.5)`` with a bf16 accelerator
    (a spy that counts its backward, autocast and clip calls) and a prepared model: the learner's answer, the
    events of the epoch, the parameters at the end and the accelerator's counts."""
    from ...finetune import fresh_accelerator

    with quiet():
        spy = _SpyAccelerator(fresh_accelerator(cpu=True, mixed_precision="bf16"))
    loader = batches()
    model, opt, sched = epoch_setup()
    # what the exercise promises: a prepared model, whose forward already runs under the accelerator's
    # mixed precision (bf16 here), as in the lesson's loop
    model = spy.real.prepare_model(model)
    calls = Calls(model, opt, sched)
    spy.events = calls.events
    torch.manual_seed(1)
    got = train_epoch(spy, model, opt, loader, sched, max_grad_norm=0.5)
    return {"answer": answer(got), "events": calls.clear(), "params": [p.detach().clone() for p in model.parameters()],
            "calls": dict(spy.calls)}


@driver
def epoch_autocast_run(train_epoch) -> list:
    """One more epoch with an fp32 accelerator (``mixed_precision="no"``): for each forward, whether autocast was on
    inside the model (the prepared forward enters none, so only a block of the learner's loop turns it on)."""
    from ...finetune import fresh_accelerator

    with quiet():
        accelerator = fresh_accelerator(cpu=True, mixed_precision="no")
    model, opt, sched = epoch_setup()
    model = accelerator.prepare_model(model)
    seen: list[bool] = []
    hook = model.register_forward_pre_hook(
        lambda module, args: seen.append(torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")))
    try:
        torch.manual_seed(1)
        train_epoch(accelerator, model, opt, batches(), sched, max_grad_norm=0.5)
    finally:
        hook.remove()
    return [bool(s) for s in seen]


# ---------------------------------------------------------------------- 10.5
def amp_run(step, record: list[list[str]] | None = None, **flags):
    """Four steps (the third overflows); ``record`` gets each call's events (the last one maybe cut short)."""
    torch.manual_seed(0)
    model = _TinyClassifier().train()
    model.drop.p = 0.0  # no dropout randomness: compare runs exactly
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    calls = Calls(model, opt, None, scaler) if record is not None else None
    made = batches(4, seed=3, scale=5.0)
    made[2] = {**made[2], "overflow": True}
    losses, scales, params = [], [], []
    for batch in made:
        if calls is not None:
            record.append(calls.events)
        losses.append(step(model, batch, opt, scaler, 0.5, **flags))
        if calls is not None:
            calls.clear()
        scales.append(scaler.get_scale())
        params.append([p.detach().clone() for p in model.parameters()])
    return losses, scales, params


@driver
def amp_step_run(amp_step) -> dict:
    """:func:`amp_run` of the learner's ``amp_step``: each step's events, and the losses (the learner's answers),
    scales and parameters after each step — or where it raised."""
    record: list[list[str]] = []
    with quiet():
        got, error = attempt(lambda: amp_run(amp_step, record))
    out = {"record": [list(r) for r in record], "error": error}
    if error is None:
        losses, scales, params = got
        out.update(losses=[described(v) for v in losses], types=[type(v).__name__ for v in losses],
                   scales=[described(s).get("plain") for s in scales], params=params)
    return out
