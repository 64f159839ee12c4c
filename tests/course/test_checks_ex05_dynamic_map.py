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
