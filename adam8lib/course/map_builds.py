"""The dynamic map rebuilt on other grids, for lesson 05's look at why the map is pinned to the bit.

Lesson 05 compares the canonical map (:func:`adam8lib.quant.dynamic_map`) with the same recipe
computed another way: on a grid whose points are rounded twice (torch's generic CPU kernel), and in
float64 with one rounding to fp32 at the end. Writing the recipe is exercise 05.1 of the workbook,
so the lesson calls these functions instead of showing their bodies.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

__all__ = ["tree_map_from", "tree_map_float64"]


def tree_map_from(linspace: Callable[[float, float, int], Sequence[float]], signed: bool = True) -> torch.Tensor:
    """The 8-bit dynamic map with grid points from ``linspace(0.1, 1.0, n)``; midpoints and scaling in fp32.

    With :func:`adam8lib.quant.exact_linspace` this is :func:`adam8lib.quant.dynamic_map`, bit for bit.
    """
    entries = [0.0, 1.0]
    for decade in range(7):
        n_points = (2**decade if signed else 2 ** (decade + 1)) + 1
        points = np.array(linspace(0.1, 1.0, n_points), dtype=np.float32)
        scaled = (points[:-1] + points[1:]) / np.float32(2) * np.float32(10.0 ** (decade - 6))
        entries.extend(scaled.tolist())
        if signed:
            entries.extend((-scaled).tolist())
    return torch.tensor(sorted(entries), dtype=torch.float32)


def tree_map_float64(signed: bool = True) -> torch.Tensor:
    """The same recipe in NumPy float64 (grid, midpoints, scaling), rounded to fp32 once at the end."""
    entries = [np.array([0.0, 1.0])]
    for decade in range(7):
        points = np.linspace(0.1, 1.0, (2**decade if signed else 2 ** (decade + 1)) + 1)
        scaled = (points[:-1] + points[1:]) / 2 / 10 ** (6 - decade)
        entries.append(scaled)
        if signed:
            entries.append(-scaled)
    return torch.from_numpy(np.sort(np.concatenate(entries))).float()
