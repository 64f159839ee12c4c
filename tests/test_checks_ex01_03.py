"""The checks of workbooks 01-03 pass on the solutions and fail, with the right hint, on wrong answers."""

from __future__ import annotations

import math

import pytest
import torch

from adam8lib import checks

from tests._check_helpers import SOLUTIONS, fails_with, solution, stub  # noqa: E402,F401


# ------------------------------------------------------------------ 01 · optimizer memory
def bpp_no_absmax(kind, blocksize=256):
    return 8.0 if kind == "adamw" else 2.0 if kind == "adam8bit" else _raise()


def bpp_one_absmax(kind, blocksize=256):
    return 8.0 if kind == "adamw" else 2 + 4 / blocksize if kind == "adam8bit" else _raise()


def bpp_adamw_one_state(kind, blocksize=256):
    return 4.0 if kind == "adamw" else 2 + 8 / blocksize if kind == "adam8bit" else _raise()


def bpp_no_error(kind, blocksize=256):
    return 8.0 if kind == "adamw" else 2 + 8 / blocksize


def _raise():
    raise ValueError("unknown kind")


def _state_bytes(shapes, kind="adam8bit", blocksize=256, min_8bit_size=4096, *, ceil=True, rule=True, strict=False):
    total = 0
    for shape in shapes:
        n = math.prod(shape)
        small = (n <= min_8bit_size if strict else n < min_8bit_size) if rule else False
        if kind == "adamw" or small:
            total += 8 * n
        else:
            total += 2 * n + 8 * (-(-n // blocksize) if ceil else n // blocksize)
    return total


@pytest.mark.parametrize("fn, hint", [
    (bpp_no_absmax, "you forgot the absmax"),
    (bpp_one_absmax, "one absmax per block for each of the TWO states"),
    (bpp_adamw_one_state, "AdamW keeps TWO fp32 states"),
    (bpp_no_error, "raise ValueError for an unknown optimizer kind"),
    (stub, "not implemented yet"),
])
def test_state_bytes_per_param_fails(fn, hint):
    fails_with(checks.check_state_bytes_per_param, fn, hint)


@pytest.mark.parametrize("kw, hint", [
    (dict(ceil=False), "the ragged tail is a block too"),
    (dict(rule=False), "small-tensor rule missing"),
    (dict(strict=True), "n >= min_8bit_size"),
])
def test_optimizer_state_bytes_fails(kw, hint):
    fails_with(checks.check_optimizer_state_bytes,
               lambda shapes, kind="adam8bit", blocksize=256, min_8bit_size=4096:
               _state_bytes(shapes, kind, blocksize, min_8bit_size, **kw), hint)
    fails_with(checks.check_optimizer_state_bytes, stub, "not implemented yet")


def test_optimizer_state_bytes_wants_an_int():
    fails_with(checks.check_optimizer_state_bytes,
               lambda shapes, kind="adam8bit", blocksize=256, min_8bit_size=4096:
               float(_state_bytes(shapes, kind, blocksize, min_8bit_size)), "return an int")


def _size(states, *, divisor=2**20, dedupe=True):
    seen, nbytes, elements = set(), 0, 0
    for state in states:
        for value in state.values():
            if not torch.is_tensor(value) or (dedupe and id(value) in seen):
                continue
            seen.add(id(value))
            nbytes += value.numel() * value.element_size()
            elements += value.numel()
    return nbytes / divisor, elements


@pytest.mark.parametrize("fn, hint", [
    (lambda states: _size(states, divisor=1e6), "divide the bytes by 2**20"),
    (lambda states: _size(states, dedupe=False), "must be counted once"),
    (lambda states: tuple(reversed(_size(states))), "in that order"),
    (stub, "not implemented yet"),
])
def test_compute_optimizer_size_fails(fn, hint):
    fails_with(checks.check_compute_optimizer_size, fn, hint)


@pytest.mark.parametrize("check, name", [
    ("check_state_bytes_per_param", "state_bytes_per_param"),
    ("check_optimizer_state_bytes", "optimizer_state_bytes"),
    ("check_compute_optimizer_size", "compute_optimizer_size"),
])
def test_ex01_checks_pass_on_the_solution(check, name, capsys):
    getattr(checks, check)(solution("01", name))
    assert capsys.readouterr().out.startswith("✔ Exercise 01.")


# ------------------------------------------------------------------ 02 · EMA
def moments_g_not_squared(m, v, g, b1, b2):
    return b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g


def moments_beta1_for_v(m, v, g, b1, b2):
    return b1 * m + (1 - b1) * g, b1 * v + (1 - b1) * g * g


def moments_swapped(m, v, g, b1, b2):
    return (1 - b1) * m + b1 * g, b2 * v + (1 - b2) * g * g


@pytest.mark.parametrize("fn, hint", [
    (moments_g_not_squared, "g not squared"),
    (moments_beta1_for_v, "beta1 used for v"),
    (moments_swapped, "are swapped"),
    (stub, "not implemented yet"),
])
def test_adam_moments_fails(fn, hint):
    fails_with(checks.check_adam_moments, fn, hint)


@pytest.mark.parametrize("fn, hint", [
    (lambda m, v, b1, b2, t: (m, v), "no bias correction"),
    (lambda m, v, b1, b2, t: (m / (1 - b1**t), v), "v needs its own correction"),
    (lambda m, v, b1, b2, t: (m / (1 - b1 ** (t + 1)), v / (1 - b2 ** (t + 1))), "step counts from 1"),
    (lambda m, v, b1, b2, t: (m / (1 - b1**t), v / (1 - b1**t)), "each moment uses its own beta"),
    (stub, "not implemented yet"),
])
def test_bias_correct_fails(fn, hint):
    fails_with(checks.check_bias_correct, fn, hint)


def test_ex02_checks_pass_on_the_solution(capsys):
    checks.check_adam_moments(solution("02", "adam_moments"))
    checks.check_bias_correct(solution("02", "bias_correct"))
    out = capsys.readouterr().out.splitlines()
    assert out == ["✔ Exercise 02.1 · Adam's two moving averages: all checks passed",
                   "✔ Exercise 02.2 · Bias correction: all checks passed"]


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
    (make_step(decoupled=False, bias=False), "no bias correction"),
    (make_step(decoupled=True), "that is AdamW's decoupled decay"),
    (make_step(decoupled=False, eps_inside=True), "eps goes outside the square root"),
    (make_step(decoupled=False, in_place=False), "IN PLACE"),
    (stub, "not implemented yet"),
])
def test_adam_step_fails(fn, hint):
    fails_with(checks.check_adam_step, fn, hint)


@pytest.mark.parametrize("fn, hint", [
    (make_step(decoupled=False), "decay applied to m"),
    (make_step(decoupled=True, bias=False), "no bias correction"),
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
