"""Check cells of workbook 05 (ex05_dynamic_map): pass on the solution, fail with a named hint on each plausible wrong answer."""

from __future__ import annotations


import pytest
import torch

from adam8lib import quant
from adam8lib.course import checks

from tests._check_helpers import SOLUTIONS, fails_with, solution, stub  # noqa: E402,F401



# ------------------------------------------------------------------ 05 · dynamic map
def make_map(*, float64=False, midpoints=True, unsigned_double=True, sort=True):
    def dynamic_map_from_scratch(signed=True):
        dtype = torch.float64 if float64 else torch.float32
        values = [torch.tensor([0.0, 1.0], dtype=dtype)]
        for i in range(7):
            n = (2**i if signed or not unsigned_double else 2 ** (i + 1)) + 1
            grid = torch.linspace(0.1, 1.0, n, dtype=dtype)
            dec = ((grid[:-1] + grid[1:]) / 2 if midpoints else grid) * 10.0 ** (i - 6)
            values += [dec, -dec] if signed else [dec]
        table = torch.cat(values)
        return (torch.sort(table).values if sort else table).float()

    return dynamic_map_from_scratch


@pytest.mark.parametrize("fn, hint", [
    (make_map(float64=True), "not bit-identical"),
    (make_map(midpoints=False), "take the MIDPOINTS"),
    (make_map(unsigned_double=False), "unsigned: 2**(i+1) + 1 grid points"),
    (make_map(sort=False), "is not sorted"),
    (stub, "not implemented yet"),
])
def test_dynamic_map_fails(fn, hint):
    fails_with(checks.check_dynamic_map, fn, hint)


def make_nearest(*, ties_up=False, only_searchsorted=False, clamp=True, dtype=torch.uint8):
    def nearest_code(x, code):
        x = x.float()
        hi = torch.searchsorted(code, x)
        if only_searchsorted:
            return (hi.clamp(0, 255) if clamp else hi).to(dtype)
        hi = hi.clamp(1, 255)
        lo = hi - 1
        pick = (code[hi] - x <= x - code[lo]) if ties_up else (code[hi] - x < x - code[lo])
        return torch.where(pick, hi, lo).to(dtype)

    return nearest_code


@pytest.mark.parametrize("fn, hint", [
    (make_nearest(ties_up=True), "take the LOWER index"),
    (make_nearest(only_searchsorted=True), "also look at the entry before it"),
    (make_nearest(dtype=torch.int64), "convert the indices with .to(torch.uint8)"),
    (stub, "not implemented yet"),
])
def test_nearest_code_fails(fn, hint):
    fails_with(checks.check_nearest_code, fn, hint)


def test_ex05_checks_pass_on_the_solution_and_the_library(capsys):
    checks.check_dynamic_map(solution("05", "dynamic_map_from_scratch"))
    checks.check_nearest_code(solution("05", "nearest_code"))
    checks.check_dynamic_map(quant.dynamic_map)
    checks.check_nearest_code(quant.nearest_code)
    # broadcasting argmin is another right answer (ties -> first index = lower)
    checks.check_nearest_code(lambda x, code: (x.float()[..., None] - code).abs().argmin(-1).to(torch.uint8))
    assert capsys.readouterr().out.count("all checks passed") == 5


# ------------------------------------------------------------------ 05.3 · decode a code
def make_decode(*, midpoint=True, offset=6, mirror=True, unsigned_extra_bit=True, as_list=False):
    """A learner's decode_code, with one plausible slip switched on."""
    def decode_code(index, signed=True):
        if index == 255:
            out = (1, 7, 0, 1.0)
        elif index == (127 if signed else 0):
            out = (0, 0, 0, 0.0)
        else:
            if signed:
                sign = 1 if index > 127 else -1
                j = index - 128 if sign > 0 else (126 - index if mirror else index)
                tree, lead_shift = j + 1, 0
            else:
                sign = 1
                tree, lead_shift = (index + 1, 1) if unsigned_extra_bit else (index, 0)
            lead = tree.bit_length() - 1
            decade, n = lead - lead_shift, 2**lead
            k = tree - n
            frac = (2 * k + 1) / (2 * n) if midpoint else k / max(n - 1, 1)
            out = (sign, decade, k, sign * 10.0 ** (decade - offset) * (0.1 + 0.9 * frac))
        return list(out) if as_list else out

    return decode_code


def test_decode_code_check_passes_the_solution_and_a_clean_rewrite():
    checks.check_decode_code(solution("05", "decode_code"))
    checks.check_decode_code(make_decode())


@pytest.mark.parametrize("fn, hint", [
    (make_decode(midpoint=False), "*midpoint* of two neighbouring grid points"),
    (make_decode(offset=7), "scaled by 10**(i - 6)"),
    (make_decode(mirror=False), "negative codes mirror the positive ones"),
    (make_decode(unsigned_extra_bit=False), "one more fraction bit"),
    (make_decode(as_list=True), "return a tuple"),
    (stub, "not implemented yet"),
])
def test_decode_code_check_names_the_mistake(fn, hint):
    fails_with(checks.check_decode_code, fn, hint)
