"""Check cells of workbook 03 (ex03_adam_rule): pass on the solution, fail with a named hint on each plausible wrong answer."""

from __future__ import annotations

import math

import pytest
import torch

from adam8lib.course import checks

from tests._check_helpers import SOLUTIONS, fails_with, solution, stub  # noqa: E402,F401



# ------------------------------------------------------------------ 03 · Adam rule
def make_step(*, decoupled, bias=True, eps_inside=False, l2_too=False, in_place=True):
    @torch.no_grad()
    def step_fn(p, g, m, v, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        b1, b2 = betas
        if not in_place:
            p, m, v = p.clone(), m.clone(), v.clone()
        if weight_decay:
            if decoupled:
                p.mul_(1 - lr * weight_decay)
            if not decoupled or l2_too:
                g = g + weight_decay * p
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        c1, c2 = (1 - b1**step, 1 - b2**step) if bias else (1.0, 1.0)
        denom = (v / c2 + eps).sqrt() if eps_inside else (v / c2).sqrt() + eps
        p.sub_(lr * (m / c1) / denom)
        return p

    return step_fn


@pytest.mark.parametrize("fn, hint", [
    (make_step(decoupled=False, bias=False), "you left out the bias correction"),
    (make_step(decoupled=True), "that is AdamW's decoupled decay"),
    (make_step(decoupled=False, eps_inside=True), "you put eps inside the square root"),
    (make_step(decoupled=False, in_place=False), "p, m and v did not change"),
    (stub, "not implemented yet"),
])
def test_adam_step_fails(fn, hint):
    fails_with(checks.check_adam_step, fn, hint)


@pytest.mark.parametrize("fn, hint", [
    (make_step(decoupled=False), "you applied weight decay through the gradient: that is Adam with L2, not AdamW"),
    (make_step(decoupled=True, bias=False), "you left out the bias correction"),
    (stub, "not implemented yet"),
])
def test_adamw_step_fails(fn, hint):
    fails_with(checks.check_adamw_step, fn, hint)


def make_wrong(*, decoupled, mistake):
    """One plausible wrong step, written as a learner would (not with the check's own helper)."""
    @torch.no_grad()
    def step_fn(p, g, m, v, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        b1, b2 = betas
        if mistake == "swapped_betas":
            b2, b1 = betas
        if decoupled:
            if mistake == "decay_grows":
                p.mul_(1 + lr * weight_decay)
            elif mistake == "decay_with_corrected_lr":
                p.mul_(1 - lr / (1 - b1**step) * weight_decay)
            else:
                p.mul_(1 - lr * weight_decay)
        elif mistake == "l2_minus":
            g = g - weight_decay * p
        elif mistake == "g_in_place":
            g.add_(p, alpha=weight_decay)
        else:
            g = g + weight_decay * p
        m.mul_(b1).add_(g, alpha=1 - b1)
        if mistake == "abs_for_v":
            v.mul_(b2).add_(g.abs(), alpha=1 - b2)
        else:
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
        p.sub_(lr * (m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt() + eps))

    return step_fn


@pytest.mark.parametrize("mistake, hint", [
    ("l2_minus", "your weight decay has the wrong sign: you subtracted weight_decay * p from the gradient"),
    ("abs_for_v", "you averaged |g| into v, not g * g"),
    ("swapped_betas", "you used the betas the other way round"),
    ("g_in_place", "changed its input `g` in place"),
])
def test_adam_step_names_each_mistake(mistake, hint):
    fails_with(checks.check_adam_step, make_wrong(decoupled=False, mistake=mistake), hint)


@pytest.mark.parametrize("mistake, hint", [
    ("decay_grows", "your weight decay has the wrong sign: p *= 1 + lr * weight_decay makes |p| grow"),
    ("decay_with_corrected_lr", "your decay used the bias-corrected step size"),
    ("abs_for_v", "you averaged |g| into v, not g * g"),
    ("swapped_betas", "you used the betas the other way round"),
])
def test_adamw_step_names_each_mistake(mistake, hint):
    fails_with(checks.check_adamw_step, make_wrong(decoupled=True, mistake=mistake), hint)


def test_a_gradient_changed_in_place_is_told_without_return_words():
    with pytest.raises(AssertionError) as info:
        checks.check_adam_step(make_wrong(decoupled=False, mistake="g_in_place"))
    message = str(info.value)
    assert "only p, m and v are yours to update in place" in message
    assert "return" not in message.split("Hint:", 1)[1]  # adam_step returns nothing


def test_ex03_checks_pass_on_the_solution_and_on_the_library(capsys):
    from adam8lib.adam import adam_step

    checks.check_adam_step(solution("03", "adam_step"))
    checks.check_adamw_step(solution("03", "adamw_step"))
    checks.check_adam_step(lambda p, g, m, v, step, **kw: adam_step(p, g, m, v, step=step, decoupled=False, **kw))
    checks.check_adamw_step(lambda p, g, m, v, step, **kw: adam_step(p, g, m, v, step=step, decoupled=True, **kw))
    assert capsys.readouterr().out.count("all checks passed") == 4
