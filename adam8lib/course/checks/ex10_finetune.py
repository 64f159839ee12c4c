"""Checks for workbook 10 · mixed-precision fine-tuning: decay groups and the training step.

The learner's functions are handed models, optimizers, schedules, loaders, accelerators and GradScalers: course
drivers (:mod:`adam8lib.course.grading.drivers.ex10`) build those, from fixed seeds and the case this module names,
where the learner's code runs (in its own process when graded), run it on them and return plain data — its
answers, the events a spy recorded, the losses, the parameters at the end. This module builds the same objects for
its reference runs and its messages and compares; nothing of the learner's objects reaches it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..grading.drivers import drive, reraise
from ..grading.drivers import ex10 as _drivers
from ..grading.drivers.ex10 import (LayerScale, NormalizedGate, ScaleNorm, TinyClassifier, _Block,  # noqa: F401
                                    _CustomNet, _SpyAccelerator, _TinyClassifier)  # noqa: F401
from ._common import assert_equal, call, fail, passed, require_callable
from ._spy import order_hint
from ._variants import matches

__all__ = ["check_decay_parameter_names", "check_training_step", "check_trainer_8bit", "check_accelerate_epoch", "check_amp_step"]

_quiet = _drivers.quiet
_models = _drivers.decay_models  # the check's copies: the drivers build the same models for the learner's function
_tiny_batches, _setup = _drivers.tiny_batches, _drivers.setup
_batches, _epoch_setup, _amp_run = _drivers.batches, _drivers.epoch_setup, _drivers.amp_run


class _Foreign:
    """A value of the learner's that is not plain data, as the driver described it (its type's name, its repr)."""

    def __init__(self, described: dict) -> None:
        self.kind, self.shown = str(described.get("kind", "object")), str(described.get("repr", ""))

    def __repr__(self) -> str:
        return self.shown


def _value(described: dict):
    return described["plain"] if "plain" in described else _Foreign(described)


def _answer(crossed: dict):
    """The learner's answer as a driver returned it (:func:`~adam8lib.course.grading.drivers.ex10.answer`)."""
    if "seq" in crossed:
        items = [_value(v) for v in crossed["items"]]
        return items if crossed["seq"] == "list" else tuple(items)
    return _value(crossed["value"])


def _type_of(crossed: dict) -> str:
    """The name of the type of the learner's answer (as it was in the learner's process)."""
    return str(crossed["seq"] if "seq" in crossed else crossed.get("type", "object"))


def _as(fn, run):
    """``run`` under the learner's function's name (what :func:`call` reports)."""
    run.__name__ = run.__qualname__ = getattr(fn, "__name__", "your function")
    return run


class _Shown:
    """Stands for an object the driver builds (in :func:`call`'s messages)."""

    def __init__(self, shown: str) -> None:
        self.shown = shown

    def __repr__(self) -> str:
        return self.shown


def _norm_param_names(model: nn.Module) -> dict[str, str]:
    from ...training import _is_norm

    out = {}
    for mod_name, module in model.named_modules():
        if _is_norm(module):
            for name, _ in module.named_parameters(recurse=False):
                out[f"{mod_name}.{name}" if mod_name else name] = type(module).__name__
    return out


def check_decay_parameter_names(get_decay_parameter_names: Callable) -> None:
    """Compare with :func:`adam8lib.training.decay_parameter_names` on three models."""
    from ...training import decay_parameter_names

    require_callable(get_decay_parameter_names, "get_decay_parameter_names")
    for index, (label, model) in enumerate(_models()):
        crossed = call(_as(get_decay_parameter_names, lambda *_, index=index: drive(
            get_decay_parameter_names, _drivers.decay_names_run, index)), model)
        got = _answer(crossed)
        what = f"get_decay_parameter_names on {label}"
        if got is None:
            fail(f"{what} returned None.", hint="did you forget to `return` the list of names?")
        if isinstance(got, (str, bytes)) or not isinstance(got, (list, tuple)):
            fail(f"{what} should return a list of parameter names, got {_type_of(crossed)}.",
                 hint="collect the names in a list: [name for name, p in model.named_parameters() if ...]")
        if not all(isinstance(n, str) for n in got):
            fail(f"{what} should contain names (str), got "
                 f"{crossed['types'][next(i for i, n in enumerate(got) if not isinstance(n, str))]}.",
                 hint="return the *names* from model.named_parameters(), not the parameters")
        all_names = [n for n, _ in model.named_parameters()]
        if len(set(got)) != len(got):
            dup = next(n for n in got if got.count(n) > 1)
            fail(f"{what} lists {dup!r} more than once.",
                 hint="module.named_parameters() recurses into the submodules by default, so inside a "
                      "named_modules() loop each parameter comes once per ancestor: use "
                      "module.named_parameters(recurse=False) (or walk model.named_parameters() once)")
        unknown = [n for n in got if n not in all_names]
        if unknown:
            if unknown[0].startswith(".") and unknown[0][1:] in all_names:
                hint = (f"the model's own parameter is called {unknown[0][1:]!r}, not {unknown[0]!r}: the model "
                        "itself comes first from named_modules() with the name '' — no dot before its parameters")
            else:
                hint = "use the full dotted names of model.named_parameters(), e.g. 'blocks.0.attn.weight'"
            fail(f"{what} returned names that are not parameters of the model, e.g. {unknown[0]!r}.", hint=hint)
        want = decay_parameter_names(model)
        if got and set(got) <= set(all_names) - set(want):
            fail(f"{what} returned only parameters that should NOT decay, e.g. {got[0]!r}.",
                 hint="every name you returned is a bias or a norm-layer parameter — the ones to EXCLUDE; the "
                      "list is of the names that GET weight decay (all the others)")
        if set(got) != set(want) and set(got) == {n for n, p in model.named_parameters() if p.ndim >= 2}:
            one_d = next(n for n in want if model.get_parameter(n).ndim < 2)
            fail(f"{what}: {one_d!r} is missing — it should decay.",
                 hint=f"you kept the parameters with 2 or more dimensions (p.ndim >= 2), but {one_d!r} is 1-D and "
                      "neither a bias nor in a norm layer: decide by the name ('bias') and the module's type, "
                      "not by the shape")
        extra = [n for n in got if n not in want]
        missing = [n for n in want if n not in got]
        norms = _norm_param_names(model)
        for name in extra:
            if name in norms:
                cls = norms[name]
                if cls in ("LayerNorm", "RMSNorm"):
                    hint = (f"{name!r} belongs to an nn.{cls} module: find norm layers by their type "
                            "(isinstance), not by their name — here it is not called 'LayerNorm'")
                else:
                    hint = (f"{name!r} belongs to a {cls} module: models bring their own norm classes; "
                            "treat any module whose class name ends in 'Norm' as a norm layer too")
                fail(f"{what}: {name!r} should NOT decay.", hint=hint)
            if name.rsplit(".", 1)[-1] == "bias":
                fail(f"{what}: {name!r} should NOT decay.", hint="biases never get weight decay: drop every parameter named 'bias'")
        if extra:
            fail(f"{what}: {extra[0]!r} should NOT decay.", hint="only weights outside norm layers decay")
        if missing:
            name = missing[0]
            owner_cls = type(_owner(model, name)).__name__
            if "bias" in name and name.rsplit(".", 1)[-1] != "bias":
                hint = (f"{name!r} is a weight: only its module's NAME contains 'bias'. You tested for 'bias' "
                        "anywhere in the dotted name (a substring); the rule is about the LAST part of the name "
                        "being exactly 'bias'")
            elif "norm" in owner_cls.lower() and not owner_cls.lower().endswith("norm"):
                hint = (f"{name!r} belongs to a {owner_cls}: its class name contains 'Norm' but does not END in "
                        "it, so it is no norm layer and its weight decays. Test the END of the class name, not "
                        "whether 'Norm' appears somewhere in it")
            elif "norm" in name.lower():
                hint = (f"{name!r} has 'norm' in its name but is a {type(_owner(model, name)).__name__}'s "
                        "weight: decide by the module's type, not by a substring of the name")
            elif "." not in name:
                hint = f"{name!r} is a parameter of the model itself (no submodule): include it too"
            elif isinstance(_owner(model, name), nn.Embedding):
                hint = (f"{name!r} is an nn.Embedding's weight: embeddings decay too — only biases and the "
                        "parameters of norm layers are left out")
            else:
                owner = _owner(model, name)
                param = model.get_parameter(name)
                hint = (f"you left out {len(missing)} name(s) that should decay, e.g. {name!r} (the "
                        f"{name.rsplit('.', 1)[-1]!r} of a {type(owner).__name__}, {param.ndim}-D): every weight "
                        "outside norm layers decays (embeddings and Linear weights included)")
            fail(f"{what}: {name!r} is missing — it should decay.", hint=hint)
        assert_equal(sorted(got), sorted(want), what=what)
    passed("Exercise 10.1 · Weight-decay parameter names")


def _owner(model: nn.Module, name: str) -> nn.Module:
    return model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model


# ---------------------------------------------------------------------- exercise 10.2
def _reference_run(batches, seed, dtype):
    from ...training import training_step

    model, opt, sched = _setup(seed)
    return [training_step(model, b, opt, sched, dtype=dtype) for b in batches]


def _mirror(batch: dict, changed: dict) -> None:
    """The learner's in-place changes of the batch (said by the driver) made to the check's copy of it, so that
    :func:`call` reports them as it reports any changed input."""
    with torch.no_grad():
        for key, now in changed.items():
            mine = batch.get(key)
            if not (torch.is_tensor(mine) and torch.is_tensor(now)):
                continue
            if mine.shape == now.shape and mine.dtype == now.dtype:
                mine.copy_(now)
            else:
                mine.data = now


def check_training_step(training_step: Callable) -> None:
    """Run the learner's step and the reference on the same tiny model and data (Adam8bit,
    a decaying schedule), in bf16 and fp16 autocast: the losses must match step by step."""
    require_callable(training_step, "training_step")
    for dtype in (torch.bfloat16, torch.float16):
        seed = 3 if dtype is torch.bfloat16 else 4
        batches = _tiny_batches(16, seed)
        model, opt, sched = _setup(seed)  # the check's copies (its messages): the driver runs the learner's step
        ran = drive(training_step, _drivers.training_step_run, dtype, seed, len(batches))
        losses = []
        name = {torch.bfloat16: "torch.bfloat16", torch.float16: "torch.float16"}[dtype]
        for step, (batch, record) in enumerate(zip(batches, ran)):
            def replay(*_, record=record, batch=batch, **__):
                _mirror(batch, record["batch"])
                if record["error"] is not None:
                    reraise(record["error"])
                return _value(record["answer"])

            loss = call(_as(training_step, replay), model, batch, opt, sched, dtype=dtype)
            events = record["events"]
            what = f"training_step(..., dtype={name}) at step {step + 1}"
            if loss is None:
                fail(f"{what} returned None.", hint="return the loss as a Python float: `return loss.item()`")
            if torch.is_tensor(loss):
                fail(f"{what} returned a tensor.",
                     hint="return loss.item() (a float): a tensor keeps the whole graph of the step alive")
            if not isinstance(loss, float):
                fail(f"{what} returned {record['type']}, expected a float.", hint="return loss.item()")
            if step == 0:
                _first_step(what, name, dtype, record["first"], events)
            losses.append(float(loss))
        if len(losses) != len(batches):
            fail(f"training_step(..., dtype={name}) ran {len(losses)} of {len(batches)} steps.",
                 hint="return the loss as a Python float every step: `return loss.item()`")
        want = _reference_run(batches, seed, dtype)
        for step, (got, ref) in enumerate(zip(losses, want)):
            if abs(got - ref) > 1e-4 + 1e-3 * abs(ref):
                batch_size = len(batches[step]["labels"])
                if step == 0 and math.isclose(got, batch_size * ref, rel_tol=1e-3):
                    hint = (f"your loss is {batch_size} times the reference: the SUM over the batch's {batch_size} "
                            "examples. Use the model's loss (model(**batch).loss), which is their mean")
                else:
                    hint = _diagnose_step(training_step, dtype, seed)
                fail(f"training_step(..., dtype={name}): loss at step {step + 1} is {got:.5f}, the reference "
                     f"step gives {ref:.5f} (same model, data, optimizer and schedule).", hint=hint)
        first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
        if not last < 0.7 * first:
            fail(f"training_step(..., dtype={name}) did not lower the loss (mean of the first 4 steps "
                 f"{first:.4f}, of the last 4 {last:.4f}).",
                 hint="backward, optimizer.step(), scheduler.step(), zero_grad — all four, every step")
    passed("Exercise 10.2 · Mixed-precision training step")


def _first_step(what, name, dtype, first: dict, events) -> None:
    """What the first call of the learner's step must already show (said by the driver): autocast, an update,
    fp32 weights."""
    if not first["seen"]:
        fail(f"{what} never called the model.", hint="loss = model(**batch).loss")
    on_cpu, on_cuda, out_dtype = first["seen"]
    if not on_cpu:
        if on_cuda or first["disabling"]:
            fail(f"{what}: the forward pass did not run under CPU autocast (the Linear gave {out_dtype}).",
                 hint="you asked for autocast on 'cuda', but the model is on the CPU: take the device type from "
                      "the model, device_type = next(model.parameters()).device.type")
        fail(f"{what}: the forward pass did not run under autocast (the Linear gave {out_dtype}).",
             hint="your forward ran in fp32, without autocast: wrap it in "
                  "`with torch.autocast(device_type, dtype=dtype):`")
    if out_dtype != str(dtype):
        fail(f"{what}: autocast ran in {out_dtype}, asked for {name}.",
             hint="pass the `dtype` argument to torch.autocast instead of a fixed dtype")
    if first["weight_dtype"] != str(torch.float32):
        fail(f"{what} changed the weights' dtype to {first['weight_dtype']}.",
             hint="autocast keeps fp32 weights; do not call model.to(dtype) / .half() / .bfloat16()")
    hint = order_hint(events)
    if hint is not None:
        fail(f"{what} called, in this order: {', '.join(events)}.", hint=hint)
    if first["unchanged"] is True:
        fail(f"{what} did not change the weights.", hint="call optimizer.step() after loss.backward()")


def _diagnose_step(training_step: Callable, dtype: torch.dtype, seed: int) -> str:
    """Replay two steps (by the course's driver) and look at what the learner's step left behind."""
    ran = drive(training_step, _drivers.diagnose_step_run, dtype, seed)
    if ran["error"]:  # the first call already passed in the check
        return "compare your step with: autocast forward → backward → optimizer.step() → scheduler.step() → zero_grad"
    batches = _tiny_batches(2, seed)
    ref_model, ref_opt, ref_sched = _setup(seed)
    lr0 = ref_opt.param_groups[0]["lr"]
    from ...training import training_step as reference

    reference(ref_model, batches[0], ref_opt, ref_sched, dtype=dtype)
    last_epoch = ran["last_epoch"]
    if last_epoch == 0:
        return ("your step never calls scheduler.step(), so the learning rate never moves: call scheduler.step() "
                "once per training step (after optimizer.step())")
    if last_epoch > 1:
        return f"scheduler.step() ran {last_epoch} times in one training step: call it once"
    params = ran["params"]
    if not torch.allclose(params["hidden.weight"], ref_model.hidden.weight, atol=1e-5):
        if ran["lr"] == ref_opt.param_groups[0]["lr"] != lr0:
            return ("the first update used the next step's learning rate: call scheduler.step() AFTER "
                    "optimizer.step()")
        found = _update_property(params, ref_model, seed)
        rule = "backward on the loss from the autocast forward, then optimizer.step()"
        return f"{found}. The rule: {rule}" if found else f"the update differs: {rule}"
    # one step is right; does a second step see stale gradients?
    if ran["second_error"] is not None:
        reraise(ran["second_error"])
    reference(ref_model, batches[1], ref_opt, ref_sched, dtype=dtype)
    if not torch.allclose(ran["hidden2"], ref_model.hidden.weight, atol=1e-5):
        return "gradients add up across steps: call optimizer.zero_grad() every step"
    return "compare your step with: autocast forward → backward → optimizer.step() → scheduler.step() → zero_grad"


def _update_property(params: dict, ref_model: nn.Module, seed: int) -> str | None:
    """After one step (``params``: the learner's model's parameters by name): which parameters moved wrongly, and
    how their update differs from the reference's."""
    from ._properties import describe

    start, _, _ = _setup(seed)
    w0 = dict(start.named_parameters())
    ref = dict(ref_model.named_parameters())
    wrong = [(n, p) for n, p in params.items() if not torch.allclose(p, ref[n], atol=1e-5)]
    if not wrong:
        return None
    names = ", ".join(n for n, _ in wrong[:4]) + (" …" if len(wrong) > 4 else "")
    head = f"after one step {len(wrong)} of {len(ref)} parameters differ from the reference ({names})"
    name, p = wrong[0]
    found = describe((p - w0[name]).detach(), (ref[name] - w0[name]).detach(), rtol=1e-3, atol=1e-7)
    if found:
        return f"{head}; the update of {name} {found[len('your result '):] if found.startswith('your result ') else found}"
    return head


# ---------------------------------------------------------------------- exercise 10.3
def check_trainer_8bit(make_trainer_8bit: Callable) -> None:
    """``make_trainer_8bit(model, args, train_dataset)`` -> ``Trainer(..., optimizers=(Adam8bit(groups), None))``.
    The course's driver builds the model, the TrainingArguments and the data, calls the learner's function and says
    what the Trainer holds; the check compares that with its own copy of the model and the arguments."""
    from types import SimpleNamespace

    from ...training import decay_parameter_names

    require_callable(make_trainer_8bit, "make_trainer_8bit")
    with _quiet():
        from ..finetune import build_distilbert

        model = build_distilbert(small=True)  # the check's copy: the driver builds the same for the learner
    args = SimpleNamespace(**_drivers.TRAINER_ARGS)
    data = [{"input_ids": torch.tensor([101, 7, 8, 102]), "attention_mask": torch.ones(4, dtype=torch.long),
             "labels": torch.tensor(i % 2)} for i in range(8)]
    with _quiet():
        try:
            made = call(_as(make_trainer_8bit, lambda *_: drive(make_trainer_8bit, _drivers.trainer_run)),
                        model, args, data)
        except AssertionError as exc:
            if "cannot unpack non-iterable" in str(exc):
                fail(f"{str(exc).splitlines()[0]}",
                     "`optimizers` takes a pair, not the optimizer alone: optimizers=(optimizer, None).")
            raise
    if made["trainer"] is not True:
        fail(f"make_trainer_8bit returned {made['type']}", "return the transformers.Trainer you built.")
    if made["opt_none"] and made["sched_is_optimizer"]:
        fail("trainer.optimizer is None and trainer.lr_scheduler is your optimizer",
             "the pair is (optimizer, scheduler): you passed (None, optimizer); write optimizers=(optimizer, None).")
    if made["opt_none"]:
        fail("trainer.optimizer is None: the Trainer will build its own AdamW when training starts",
             "pass your optimizer in: Trainer(..., optimizers=(optimizer, None)).")
    if made["adam8bit"] is not True:
        fail(f"trainer.optimizer is a {made['opt_type']}", "build adam8lib.optim.Adam8bit over the two decay groups.")
    if not made["sched_none"]:
        fail("trainer.lr_scheduler is already set",
             "pass None as the scheduler (optimizers=(optimizer, None)): the Trainer then builds its linear "
             "schedule (warmup, decay) around your optimizer from the TrainingArguments.")
    decay = set(decay_parameter_names(model))
    groups = made["groups"]  # parameter name -> the settings of the optimizer group that holds it
    named = [n for n, _ in model.named_parameters()]
    left_out = [n for n in named if n not in groups]
    if left_out:
        hint = "every parameter of trainer.model goes into one of the two groups."
        if not set(left_out) & decay:
            hint = ("the no-decay group is missing: biases and norm parameters are still trained, in a second "
                    "group with weight_decay 0.0.")
        elif set(left_out) >= decay:
            hint = "the decay group is missing: the names from get_decay_parameter_names go in a group of their own."
        fail(f"{left_out[0]} is in no optimizer group", hint)
    wd = {n: groups[n]["weight_decay"] for n in named}
    if any(wd[n] != (args.weight_decay if n in decay else 0.0) for n in wd):
        in_decay = {wd[n] for n in decay}
        in_rest = {wd[n] for n in wd if n not in decay}
        bad = next(n for n in wd if wd[n] != (args.weight_decay if n in decay else 0.0))
        if in_decay == {0.0} and in_rest == {args.weight_decay}:
            hint = ("the two groups are swapped: the names from get_decay_parameter_names get args.weight_decay, "
                    "the others 0.0.")
        elif in_decay == {0.0} and in_rest == {0.0}:
            hint = (f"no parameter gets weight decay (e.g. {bad!r}): give the decay group "
                    "weight_decay=args.weight_decay — the Trainer does not set it on an optimizer you build.")
        elif in_rest == in_decay and len(in_decay) == 1:
            hint = (f"every parameter has weight_decay {in_decay.pop()}, biases and norm weights too (e.g. {bad!r}): "
                    "two groups, args.weight_decay for the names from get_decay_parameter_names, 0.0 for the others.")
        elif len(in_decay) == 1 and in_rest == {0.0}:
            hint = (f"the decay group has weight_decay {in_decay.pop()}, the arguments say {args.weight_decay}: use "
                    "args.weight_decay, not a number of your own.")
        else:
            hint = "two groups: names from get_decay_parameter_names (10.1) get args.weight_decay, all others 0.0."
        fail(f"{bad}: weight_decay {wd[bad]}, expected {args.weight_decay if bad in decay else 0.0}", hint)
    for name in named:
        g = groups[name]
        for key, value, hint in [("lr", args.learning_rate, "lr=args.learning_rate"),
                                 ("betas", (args.adam_beta1, args.adam_beta2), "betas=(args.adam_beta1, args.adam_beta2)"),
                                 ("eps", args.adam_epsilon, "eps=args.adam_epsilon")]:
            got = tuple(g[key]) if key == "betas" and isinstance(g[key], (list, tuple)) else g[key]
            if got != value:
                fail(f"{name}: {key} {got}, expected {value} (from the TrainingArguments)",
                     f"your optimizer's {key} is not the one in args — the Trainer does not pass its arguments to an "
                     f"optimizer you build: use {hint}.")
    if made["same_model"] is not True:
        fail("trainer.model is not the model you were given", "Trainer(model=model, args=args, train_dataset=...).")
    if made["create_error"] is not None:
        reraise(made["create_error"])
    if made["kept_after_create"] is not True:
        fail("after create_optimizer_and_scheduler the Trainer's optimizer or schedule is not yours",
             "optimizers=(optimizer, None): the first item is the optimizer itself, the second None.")
    passed("Exercise 10.3 · Trainer with 8-bit Adam")


# ---------------------------------------------------------------------- exercise 10.4
def _reference_epoch(model, optimizer, loader, scheduler, max_grad_norm, *, train=True, zero=True, clip=True,
                     sched=True, clip_norm=None, sched_per_epoch=False):
    """The loop of exercise 10.4 in plain torch: the bf16 autocast stands for the prepared model's."""
    model.train(train)
    losses = []
    for batch in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm or max_grad_norm)
        optimizer.step()
        if sched and scheduler is not None and not sched_per_epoch:
            scheduler.step()
        if zero:
            optimizer.zero_grad()
        losses.append(float(loss.detach()))
    if sched_per_epoch:
        scheduler.step()
    return losses, [p.detach().clone() for p in model.parameters()]


def _per_batch(events: list[str]) -> list[list[str]]:
    """The epoch's events cut at each forward (what came before the first forward goes with it)."""
    cuts = [i for i, e in enumerate(events) if e == "forward"]
    if not cuts:
        return [events]
    return [events[(0 if k == 0 else c):(cuts[k + 1] if k + 1 < len(cuts) else len(events))]
            for k, c in enumerate(cuts)]


def _epoch_order_hint(events: list[str], n_batches: int) -> str | None:
    """What the events of a whole epoch say about the order of the calls, or None."""
    batches = _per_batch(events)
    for one in batches[:-1] or batches:  # the last batch may carry a once-per-epoch call
        hint = order_hint(one, backward="accelerator.backward(loss)")
        if hint is not None:
            return hint
        if "clip" in one and "step" in one and one.index("clip") > one.index("step"):
            return "you clip after optimizer.step(): clip between accelerator.backward(loss) and the step."
        back = next((i for i, e in enumerate(one) if e.startswith("backward")), None)
        if "clip" in one and back is not None and one.index("clip") < back:
            return ("you clip before accelerator.backward(loss): there are no gradients yet; clip after backward "
                    "and before the step.")
    if n_batches > 1 and events.count("sched") == 1 and "sched" not in batches[0]:
        return "scheduler.step() ran once per epoch: call it once per batch, after optimizer.step()."
    return None


def check_accelerate_epoch(train_epoch: Callable) -> None:
    """``train_epoch(accelerator, model, optimizer, loader, scheduler, max_grad_norm=1.0)`` -> list of losses."""
    require_callable(train_epoch, "train_epoch")
    loader = _batches()
    model, opt, sched = _epoch_setup()  # the check's copies (its messages): the driver builds the same ones
    spy = _Shown("Accelerator(cpu=True, mixed_precision='bf16')")
    ran = call(_as(train_epoch, lambda *_, **__: drive(train_epoch, _drivers.epoch_run)), spy, model, opt, loader,
               sched, max_grad_norm=0.5)
    got, events, params, counts = _answer(ran["answer"]), ran["events"], ran["params"], ran["calls"]
    if isinstance(got, (float, int)) or torch.is_tensor(got) and got.numel() == 1:
        fail(f"train_epoch returned one number ({float(got):.4g}), not a list",
             f"return the list of the {len(loader)} batches' losses (one float per batch), not their mean or sum.")
    if not isinstance(got, list) or len(got) != len(loader):
        fail(f"train_epoch returned {_type_of(ran['answer'])} of length {len(got) if hasattr(got, '__len__') else '?'}",
             f"return a list with one loss per batch ({len(loader)} batches).")
    if not all(isinstance(v, float) for v in got):
        fail("train_epoch's losses are not Python floats", "append loss.item() (a float), not the tensor: a tensor keeps the graph alive.")
    if counts["backward"] != len(loader):
        fail(f"accelerator.backward was called {counts['backward']} times for {len(loader)} batches",
             "call accelerator.backward(loss), not loss.backward(): accelerate adds the gradient scaling "
             "(fp16) and the distributed hooks there.")

    def reference(**flags):
        m, o, s = _epoch_setup()
        torch.manual_seed(1)
        return _reference_epoch(m, o, loader, s, 0.5, **flags)

    want_losses, want_params = reference()
    same = lambda a, b: all(torch.allclose(x, y, rtol=1e-4, atol=1e-6) for x, y in zip(a, b))  # noqa: E731
    hint = _epoch_order_hint(events, len(loader))
    if hint is not None:
        fail(f"train_epoch's first batch called, in this order: {', '.join(_per_batch(events)[0])}", hint)
    if matches(got, want_losses, rtol=1e-4, atol=1e-6) and same(params, want_params):
        if counts["clip_grad_norm_"] != len(loader):
            fail(f"accelerator.clip_grad_norm_ was called {counts['clip_grad_norm_']} times for {len(loader)} "
                 "batches",
                 "clip with accelerator.clip_grad_norm_(model.parameters(), max_grad_norm), not torch's: under fp16 "
                 "accelerate's version unscales the gradients first, torch's would clip the scaled ones.")
        _require_no_own_autocast(train_epoch, loader)
        passed("Exercise 10.4 · The accelerate training loop")
        return
    for hint, flags in [
        ("call model.train() first: the model may come back from evaluation, and dropout must be on while training.",
         dict(train=False)),
        ("the gradients are never zeroed, so they add up across batches: zero the gradients after each step "
         "(optimizer.zero_grad()).", dict(zero=False)),
        ("the gradients are not clipped: clip after backward and before the step, "
         "accelerator.clip_grad_norm_(model.parameters(), max_grad_norm).", dict(clip=False)),
        ("the learning rate never moves: advance the schedule after each optimizer step, scheduler.step().",
         dict(sched=False)),
        ("you clipped at a fixed norm: pass the max_grad_norm argument to accelerator.clip_grad_norm_.",
         dict(clip_norm=1.0)),
    ]:
        losses, ps = reference(**flags)
        if matches(got, losses, rtol=1e-4, atol=1e-6) and same(params, ps):
            fail("train_epoch's losses or final parameters differ from the reference loop", hint)
    fail(f"train_epoch's losses {[round(v, 4) for v in got]} differ from the reference {[round(v, 4) for v in want_losses]}",
         "per batch: forward -> accelerator.backward -> clip -> optimizer.step -> scheduler.step -> zero_grad.")


def _require_no_own_autocast(train_epoch: Callable, loader) -> None:
    """One more epoch with an fp32 accelerator (mixed_precision="no"), by the course's driver: its prepared forward
    enters no autocast, so autocast is on inside the model only when the learner's loop opened a block of its own."""
    model, opt, sched = _epoch_setup()
    seen = call(_as(train_epoch, lambda *_, **__: drive(train_epoch, _drivers.epoch_autocast_run)),
                _Shown("Accelerator(cpu=True, mixed_precision='no')"), model, opt, loader, sched, max_grad_norm=0.5)
    if any(seen):
        fail(f"with an accelerator configured for fp32 (mixed_precision='no'), {sum(seen)} of train_epoch's "
             "forwards ran under autocast anyway",
             "you opened an autocast block of your own (torch.autocast around the forward): it overrides what the "
             "accelerator was configured with, so an fp32 run still computes in bf16. The prepared model's "
             "forward already applies the accelerator's mixed precision: no autocast in the loop.")


def _matches_list(a, b):
    return isinstance(a, list) and len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-6) for x, y in zip(a, b))


# ---------------------------------------------------------------------- exercise 10.5
def _amp_reference(model, batch, optimizer, scaler, max_norm, *, scale=True, unscale=True, via_scaler=True,
                   update=True, zero=True, dtype=torch.float16, max_norm_instead=None):
    with torch.autocast("cpu", dtype=dtype):
        loss = model(**batch).loss
    (scaler.scale(loss) if scale else loss).backward()
    if unscale:
        scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm_instead or max_norm)
    if via_scaler:
        scaler.step(optimizer)
    else:
        optimizer.step()
    if update:
        scaler.update()
    if zero:
        optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def check_amp_step(amp_step: Callable) -> None:
    """``amp_step(model, batch, optimizer, scaler, max_norm)``: fp16 autocast + GradScaler + clipping, with a fake overflow."""
    require_callable(amp_step, "amp_step")
    record: list[list[str]] = []
    try:
        def four_steps():  # run by the course's driver: each step's events, and the losses, scales and parameters
            ran = drive(amp_step, _drivers.amp_step_run)
            record[:] = ran["record"]
            if ran["error"] is not None:
                reraise(ran["error"])
            return [_value(v) for v in ran["losses"]], ran["scales"], ran["params"]

        four_steps.__name__ = "amp_step"
        with _quiet():
            got = call(four_steps)
    except AssertionError as exc:  # torch's GradScaler asserts (or raises) on a wrong order of calls
        hint = _scaler_refusal_hint(str(exc), record)
        if hint is None:
            raise
        fail(f"the GradScaler refused: {str(exc).splitlines()[-1][:160]} (your step called, in this order: "
             f"{', '.join(record[-1])})", hint)
    want = _amp_run(_amp_reference)
    losses, scales, params = got
    finite = lambda v: isinstance(v, float) and not math.isnan(v)  # noqa: E731

    def same_params(a, b):
        return all(torch.allclose(x, y, rtol=1e-4, atol=1e-6, equal_nan=True) for pa, pb in zip(a, b) for x, y in zip(pa, pb))

    if not all(isinstance(v, float) for v in losses):
        fail("amp_step should return the loss as a Python float", "return loss.item().")
    if not any(e in record[0] for e in ("scale", "unscale", "scaler.step", "update")):
        fail(f"amp_step never used the scaler it was given (it called: {', '.join(record[0])})",
             "use the `scaler` argument — scaler.scale(loss).backward(), scaler.unscale_, scaler.step, "
             "scaler.update — not a GradScaler of your own: the scale must carry over from step to step.")
    hint = order_hint(record[0], backward="scaler.scale(loss).backward()")
    if hint is not None:
        fail(f"amp_step called, in this order: {', '.join(record[0])}", hint)
    if math.isclose(losses[0], 1024.0 * want[0][0], rel_tol=1e-3):
        fail(f"amp_step returned {losses[0]:.4g}, 1024 times the loss ({want[0][0]:.4g})",
             "you returned the SCALED loss (scaler.scale(loss)): scale only what you backward, return loss.item().")
    if any(not bool(torch.isfinite(p).all()) for p in params[2]):
        fail("after the step whose gradients overflowed (inf), the parameters are no longer finite",
             "step through the scaler, scaler.step(optimizer): it skips optimizer.step() when the unscaled "
             "gradients contain inf/NaN. Calling optimizer.step() directly applies them.")
    if scales == [1024.0] * 4:
        fail(f"the scale stayed at {scales[0]} through an overflow",
             "call scaler.update() after scaler.step(): it halves the scale after an overflow.")
    if same_params(params, want[2]) and scales == want[1] and [finite(v) for v in losses[:2]] == [True, True] \
            and _matches_list([losses[i] for i in (0, 1, 3)], [want[0][i] for i in (0, 1, 3)]):
        passed("Exercise 10.5 · An fp16 step with a GradScaler")
        return
    for hint, flags in [
        ("unscale before clipping: scaler.unscale_(optimizer), then clip_grad_norm_ — otherwise you clip the "
         "scaled gradients (1024 times too large) and the step is far too small.", dict(unscale=False)),
        ("the gradients are never zeroed, so they add up across steps: zero the gradients after each step "
         "(optimizer.zero_grad()).", dict(zero=False)),
        ("you clipped at a fixed norm: clip_grad_norm_(model.parameters(), max_norm) with the max_norm argument.",
         dict(max_norm_instead=1.0)),
        ("your forward ran in bf16, not fp16: autocast with dtype=torch.float16 — fp16 is what overflows and needs "
         "the scaler (bf16 has fp32's range).",
         dict(dtype=torch.bfloat16)),
    ]:
        try:
            alt = _amp_run(_amp_reference, **flags)
        except Exception:  # noqa: BLE001 - a variant that torch refuses cannot be what the learner did
            continue
        if same_params(params, alt[2]) and scales == alt[1]:
            fail("amp_step's parameters differ from the reference fp16 step", hint)
    fail(f"amp_step: scales {scales} (expected {want[1]}) or parameters differ from the reference",
         "autocast(fp16) forward -> scaler.scale(loss).backward() -> scaler.unscale_(optimizer) -> clip -> "
         "scaler.step(optimizer) -> scaler.update() -> zero_grad.")


def _scaler_refusal_hint(text: str, record: list[list[str]]) -> str | None:
    """The hint for a GradScaler error, from the order of the calls of the step that raised it."""
    events = record[-1] if record else []
    earlier = [e for step in record[:-1] for e in step]
    if "_scale is None" in text and "scale" not in events:
        return "backward the SCALED loss: scaler.scale(loss).backward(); the scaler divides by the same scale later."
    if any("update" in one and ("scaler.step" not in one or one.index("update") < one.index("scaler.step"))
           for one in record):
        return "call scaler.update() AFTER scaler.step(optimizer): update ends the iteration; step needs its inf checks."
    if "No inf checks were recorded for this optimizer" in text:
        hint = order_hint(events, backward="scaler.scale(loss).backward()")
        return hint or ("scaler.step found no gradients: backward the scaled loss and keep the gradients until "
                        "scaler.step(optimizer) (zero them after it).")
    if "after step()" in text or "has already been called" in text:
        if record[:-1] and "update" not in earlier:
            return ("call scaler.update() after scaler.step(): it ends the iteration (and halves the scale after "
                    "an overflow).")
        if "unscale_() is being called after step()" in text:
            return "unscale before the step: scaler.unscale_(optimizer), clip, then scaler.step(optimizer)."
        if events.count("unscale") > 1:
            return "call scaler.unscale_(optimizer) once per step (scaler.step does not need a second one)."
    return None
