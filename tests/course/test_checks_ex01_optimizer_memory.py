"""Check cells of workbook 01 (ex01_optimizer_memory): pass on the solution, fail with a named hint on each plausible wrong answer."""

from __future__ import annotations

import math

import pytest
import torch

from adam8lib.course import checks

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
    (bpp_one_absmax, "you counted one absmax per block, for one state only"),
    (bpp_adamw_one_state, "you counted ONE fp32 state for AdamW"),
    (bpp_no_error, "raise ValueError for an unknown optimizer kind"),
    (stub, "not implemented yet"),
])
def test_state_bytes_per_param_fails(fn, hint):
    fails_with(checks.check_state_bytes_per_param, fn, hint)


@pytest.mark.parametrize("kw, hint", [
    (dict(ceil=False), "you dropped the ragged tail"),
    (dict(rule=False), "you made every tensor 8-bit"),
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
    (lambda states: _size(states, divisor=1e6), "you divided by 10**6"),
    (lambda states: _size(states, dedupe=False), "you counted the shared qmap tensors once per state"),
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
