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
    (step_no_optimizer, "call optimizer.step()"),
    (step_casts_model, "do not call model.to(dtype)"),
    (stub, "not implemented yet"),
])
def test_step_check_fails_with_hint(wrong, hint):
    fails_with(ex10.check_training_step, wrong, hint)
