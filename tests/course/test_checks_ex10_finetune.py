"""The checks of workbook 10 pass on the reference and the solution, and fail with the right hint
on plausible wrong answers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from adam8lib.course.checks import ex10_finetune as ex10
from adam8lib.training import decay_parameter_names, training_step

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"
SUCCESS_1 = "✔ Exercise 10.1 · Weight-decay parameter names: all checks passed\n"
SUCCESS_2 = "✔ Exercise 10.2 · Mixed-precision training step: all checks passed\n"


def fails_with(check, fn, hint: str) -> None:
    with pytest.raises(AssertionError) as info:
        check(fn)
    assert hint in str(info.value), str(info.value)


def stub(*args, **kwargs):
    raise NotImplementedError


def solution(name: str):
    from adam8lib.course.grading.workbook import find_workbook, load_workbook

    return getattr(load_workbook(find_workbook(SOLUTIONS, "10")), name)


# ---------------------------------------------------------------------- 10.1 decay names
def chapter_names(model, forbidden=(nn.LayerNorm,)):
    """The chapter's get_parameter_names: recurse into children, skip forbidden layer types."""
    result = []
    for name, child in model.named_children():
        result += [f"{name}.{n}" for n in chapter_names(child, forbidden) if not isinstance(child, forbidden)]
    return result + list(model._parameters.keys())


def no_bias_filter(model):  # forgets the biases
    return chapter_names(model)


def layernorm_and_bias_only(model):  # the chapter's rule: misses norms of other classes
    return [n for n in chapter_names(model) if "bias" not in n]


def by_name_patterns(model):  # names, not types: misses a LayerNorm called "ln"
    return [n for n, _ in model.named_parameters() if "bias" not in n and "LayerNorm" not in n and "layer_norm" not in n]


def norm_substring(model):  # "norm" anywhere in the name also drops "denormalizer.weight"
    from adam8lib.training import _is_norm

    out = []
    for mod_name, mod in model.named_modules():
        for n, _ in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{n}" if mod_name else n
            if n != "bias" and not _is_norm(mod) and "norm" not in full.lower():
                out.append(full)
    return out


def submodules_only(model):  # forgets the model's own parameters
    return [n for n in decay_parameter_names(model) if "." in n]


def returns_parameters(model):
    names = set(decay_parameter_names(model))
    return [p for n, p in model.named_parameters() if n in names]


def duplicates(model):
    names = decay_parameter_names(model)
    return names + names[:1]


def test_decay_check_passes_reference_and_solution(capsys):
    ex10.check_decay_parameter_names(decay_parameter_names)
    ex10.check_decay_parameter_names(lambda m: list(reversed(decay_parameter_names(m))))  # any order
    ex10.check_decay_parameter_names(solution("get_decay_parameter_names"))
    assert capsys.readouterr().out == SUCCESS_1 * 3


@pytest.mark.parametrize("wrong, hint", [
    (no_bias_filter, "biases never get weight decay"),
    (layernorm_and_bias_only, "treat any module whose class name ends in 'Norm'"),
    (by_name_patterns, "find norm layers by their type"),
    (norm_substring, "decide by the module's type, not by a substring"),
    (submodules_only, "a parameter of the model itself"),
    (returns_parameters, "return the *names*"),
    (duplicates, "more than once"),
    (lambda m: set(decay_parameter_names(m)), "should return a list"),
    (lambda m: None, "forget to `return`"),
    (stub, "not implemented yet"),
])
def test_decay_check_fails_with_hint(wrong, hint):
    fails_with(ex10.check_decay_parameter_names, wrong, hint)


def test_decay_check_rejects_a_non_function():
    with pytest.raises(TypeError):
        ex10.check_decay_parameter_names(["a.weight"])


# ---------------------------------------------------------------------- 10.2 training step
def step_no_autocast(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    return training_step(model, batch, optimizer, scheduler, dtype=None)


def step_fixed_bf16(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    return training_step(model, batch, optimizer, scheduler, dtype=torch.bfloat16)


def step_no_zero_grad(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    with torch.autocast("cpu", dtype=dtype):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss.item()


def step_no_scheduler(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    return training_step(model, batch, optimizer, None, dtype=dtype)


def step_scheduler_first(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=dtype):
        loss = model(**batch).loss
    loss.backward()
    scheduler.step()
    optimizer.step()
    return loss.item()


def step_returns_tensor(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    with torch.autocast("cpu", dtype=dtype):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return loss


def step_no_optimizer(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    with torch.autocast("cpu", dtype=dtype):
        loss = model(**batch).loss
    loss.backward()
    scheduler.step()
    optimizer.zero_grad()
    return loss.item()


def step_casts_model(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    model.to(dtype)
    return training_step(model, batch, optimizer, scheduler, dtype=dtype)


def test_step_check_passes_reference_and_solution(capsys):
    ex10.check_training_step(training_step)
    ex10.check_training_step(solution("training_step"))
    assert capsys.readouterr().out == SUCCESS_2 * 2


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch warns about scheduler-before-optimizer
@pytest.mark.parametrize("wrong, hint", [
    (step_no_autocast, "torch.autocast(device_type, dtype=dtype)"),
    (step_fixed_bf16, "pass the `dtype` argument"),
    (step_no_zero_grad, "call optimizer.zero_grad() every step"),
    (step_no_scheduler, "call scheduler.step() once per training step"),
    (step_scheduler_first, "AFTER optimizer.step()"),
    (step_returns_tensor, "return loss.item()"),
    (step_no_optimizer, "never calls optimizer.step()"),
    (step_casts_model, "do not call model.to(dtype)"),
    (stub, "not implemented yet"),
])
def test_step_check_fails_with_hint(wrong, hint):
    fails_with(ex10.check_training_step, wrong, hint)


# ------------------------------------------------------------------ 10.3 · Trainer with 8-bit Adam
def make_trainer_variant(*, pass_optimizer=True, scheduler=False, from_args=True, decay_all=False, library=True):
    def make_trainer_8bit(model, args, train_dataset):
        from transformers import Trainer

        from adam8lib.optim import Adam8bit
        from adam8lib.training import decay_parameter_names

        decay = set(decay_parameter_names(model)) if not decay_all else {n for n, _ in model.named_parameters()}
        groups = [{"params": [p for n, p in model.named_parameters() if n in decay], "weight_decay": args.weight_decay},
                  {"params": [p for n, p in model.named_parameters() if n not in decay], "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
        kw = dict(lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon) if from_args else {}
        opt = Adam8bit(groups, **kw) if library else torch.optim.AdamW(groups, **kw)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0) if scheduler else None
        if not pass_optimizer:
            return Trainer(model=model, args=args, train_dataset=train_dataset)
        return Trainer(model=model, args=args, train_dataset=train_dataset, optimizers=(opt, sched))

    return make_trainer_8bit


def test_trainer_8bit_check_passes_the_solution():
    ex10.check_trainer_8bit(solution("make_trainer_8bit"))


@pytest.mark.parametrize("fn, hint", [
    (make_trainer_variant(pass_optimizer=False), "optimizers=(optimizer, None)"),
    (make_trainer_variant(scheduler=True), "pass None as the scheduler"),
    (make_trainer_variant(from_args=False), "does not pass its arguments"),
    (make_trainer_variant(decay_all=True), "names from get_decay_parameter_names"),
    (make_trainer_variant(library=False), "build adam8lib.optim.Adam8bit"),
    (stub, "not implemented yet"),
])
def test_trainer_8bit_check_names_the_mistake(fn, hint):
    fails_with(ex10.check_trainer_8bit, fn, hint)


# ------------------------------------------------------------------ 10.4 · the accelerate loop
def make_epoch(*, train=True, acc_backward=True, clip=True, sched=True, zero=True, autocast=True, as_tensor=False):
    import contextlib

    def train_epoch(accelerator, model, optimizer, loader, scheduler, max_grad_norm=1.0):
        if train:
            model.train()
        losses = []
        for batch in loader:
            with accelerator.autocast() if autocast else contextlib.nullcontext():
                loss = model(**batch).loss
            accelerator.backward(loss) if acc_backward else loss.backward()
            if clip:
                accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            if sched:
                scheduler.step()
            if zero:
                optimizer.zero_grad()
            losses.append(loss.detach() if as_tensor else loss.item())
        return losses

    return train_epoch


def test_accelerate_epoch_check_passes_the_solution():
    ex10.check_accelerate_epoch(solution("train_epoch"))
    ex10.check_accelerate_epoch(make_epoch())


@pytest.mark.parametrize("fn, hint", [
    (make_epoch(train=False), "call model.train() first"),
    (make_epoch(acc_backward=False), "call accelerator.backward(loss)"),
    (make_epoch(clip=False), "clip after backward"),
    (make_epoch(sched=False), "scheduler.step()"),
    (make_epoch(zero=False), "zero the gradients"),
    (make_epoch(autocast=False), "accelerator.autocast()"),
    (make_epoch(as_tensor=True), "loss.item()"),
    (stub, "not implemented yet"),
])
def test_accelerate_epoch_check_names_the_mistake(fn, hint):
    fails_with(ex10.check_accelerate_epoch, fn, hint)


# ------------------------------------------------------------------ 10.5 · fp16 + GradScaler
def make_amp(*, scale=True, unscale=True, via_scaler=True, update=True, zero=True, dtype=torch.float16):
    def amp_step(model, batch, optimizer, scaler, max_norm):
        with torch.autocast("cpu", dtype=dtype):
            loss = model(**batch).loss
        (scaler.scale(loss) if scale else loss).backward()
        if unscale:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer) if via_scaler else optimizer.step()
        if update:
            scaler.update()
        if zero:
            optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return amp_step


def test_amp_step_check_passes_the_solution():
    ex10.check_amp_step(solution("amp_step"))
    ex10.check_amp_step(make_amp())


@pytest.mark.parametrize("fn, hint", [
    (make_amp(via_scaler=False), "scaler.step(optimizer)"),
    (make_amp(update=False), "call scaler.update()"),
    (make_amp(unscale=False), "unscale before clipping"),
    (make_amp(scale=False), "backward the SCALED loss"),
    (make_amp(zero=False), "zero the gradients"),
    (make_amp(dtype=torch.bfloat16), "dtype=torch.float16"),
    (stub, "not implemented yet"),
])
def test_amp_step_check_names_the_mistake(fn, hint):
    fails_with(ex10.check_amp_step, fn, hint)
