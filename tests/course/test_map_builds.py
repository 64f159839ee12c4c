"""The dynamic map rebuilt on other grids (lesson 05): exact on the exact grid, within 2 ulp otherwise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adam8lib.course.map_builds import tree_map_float64, tree_map_from
from adam8lib.quant import dynamic_map, exact_linspace


def _twice_rounded(start, end, steps):
    s, e = np.float32(start), np.float32(end)
    step = (e - s) / np.float32(steps - 1)
    return [float(s + step * np.float32(k)) if k < steps // 2 else float(e - step * np.float32(steps - 1 - k))
            for k in range(steps)]


def _ulps_apart(a, b):
    return (a.view(torch.int32).long() - b.view(torch.int32).long()).abs()


@pytest.mark.parametrize("signed", [True, False])
def test_the_exact_grid_gives_the_canonical_map_and_the_others_stay_within_2_ulp(signed):
    canonical = dynamic_map(signed)
    assert torch.equal(tree_map_from(exact_linspace, signed), canonical)
    for other in (tree_map_from(_twice_rounded, signed), tree_map_float64(signed)):
        assert other.dtype == torch.float32 and other.numel() == 256
        apart = _ulps_apart(other, canonical)
        assert 0 < int((apart > 0).sum()) < 128 and int(apart.max()) <= 2


def test_the_counts_lesson_05_prints():
    changed = [int((tree_map_from(_twice_rounded, s) != dynamic_map(s)).sum()) for s in (True, False)]
    differ = [int((tree_map_float64(s) != dynamic_map(s)).sum()) for s in (True, False)]
    assert changed == [42, 31] and differ == [72, 100]
