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


def test_ex03_checks_pass_on_the_solution_and_on_the_library(capsys):
    from adam8lib.adam import adam_step

    checks.check_adam_step(solution("03", "adam_step"))
    checks.check_adamw_step(solution("03", "adamw_step"))
    checks.check_adam_step(lambda p, g, m, v, step, **kw: adam_step(p, g, m, v, step=step, decoupled=False, **kw))
    checks.check_adamw_step(lambda p, g, m, v, step, **kw: adam_step(p, g, m, v, step=step, decoupled=True, **kw))
    assert capsys.readouterr().out.count("all checks passed") == 4
