"""Small helpers the lesson notebooks share for their plots (lessons 05, 06, 09).

* :func:`error_by_decade` — relative quantization error grouped by order of magnitude:
  the dynamic map's whole point is that a value's *relative* error should not depend on how
  small it is, so the lessons plot the error per decade of ``|x| / max|x|``.
* :func:`levels_per_decade` — how many positive levels a code book (a map, or a float format's
  values divided by its largest) has in each decade below its largest level (lesson 12: the
  dynamic map against FP8 e4m3).
* :func:`stacked_bars` — a stacked bar chart with the total written on each bar (the memory
  bill of lesson 09: weights + gradients + optimizer state + activations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

__all__ = ["DecadeErrors", "error_by_decade", "levels_per_decade", "stacked_bars"]


@dataclass(frozen=True)
class DecadeErrors:
    """Per-decade statistics; decade ``e`` holds the values with ``10**e <= |x|/max|x| < 10**(e+1)``.

    The lowest decade also holds everything smaller (down to, not including, 0), and the top
    decade (``e = -1``) includes ``|x| = max|x|`` itself.
    """

    decades: list[int]  # exponents e, ascending
    share: list[float]  # fraction of the non-zero entries of x in each decade
    median_error: list[float]  # median |x_hat - x| / |x| (nan for an empty decade)
    zeroed: list[float]  # fraction of the decade's entries with x_hat == 0 (nan if empty)


def error_by_decade(x: torch.Tensor, x_hat: torch.Tensor, lowest: int = -8) -> DecadeErrors:
    """Relative error of ``x_hat`` (a reconstruction of ``x``) per decade of ``|x| / max|x|``.

    Entries with ``x == 0`` are left out (their relative error is undefined). ``lowest`` is
    the exponent of the lowest decade (a negative int).
    """
    if not isinstance(x, torch.Tensor) or not isinstance(x_hat, torch.Tensor):
        raise TypeError("x and x_hat must be torch tensors")
    if x.shape != x_hat.shape:
        raise ValueError(f"x and x_hat must have the same shape, got {tuple(x.shape)} and {tuple(x_hat.shape)}")
    if isinstance(lowest, bool) or not isinstance(lowest, int) or lowest >= 0:
        raise ValueError(f"lowest must be a negative int, got {lowest!r}")
    x, x_hat = x.detach().reshape(-1).double(), x_hat.detach().reshape(-1).double()
    keep = x != 0
    if not bool(keep.any()):
        raise ValueError("x has no non-zero entries")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x must be finite")
    x, x_hat = x[keep], x_hat[keep]
    scaled = x.abs() / x.abs().max()
    exponent = torch.floor(torch.log10(scaled)).clamp(lowest, -1).long()
    rel = (x_hat - x).abs() / x.abs()
    decades = list(range(lowest, 0))
    share, median, zeroed = [], [], []
    for e in decades:
        sel = exponent == e
        count = int(sel.sum())
        share.append(count / x.numel())
        median.append(float(rel[sel].quantile(0.5)) if count else float("nan"))
        zeroed.append(float((x_hat[sel] == 0).double().mean()) if count else float("nan"))
    return DecadeErrors(decades, share, median, zeroed)


def levels_per_decade(levels: torch.Tensor, decades: int = 7) -> list[int]:
    """Positive levels per decade below the largest: entry ``k`` counts the levels ``x`` with
    ``10**-(k+1) < x / max <= 10**-k`` (``k = 0`` holds the largest level itself).

    ``levels`` is a 1-D float tensor (a map, or every finite value of a float format); zero,
    negative and non-finite entries are left out. Levels below ``10**-decades`` of the largest are
    not counted.
    """
    if not isinstance(levels, torch.Tensor) or not levels.is_floating_point() or levels.dim() != 1:
        raise TypeError("levels must be a 1-D floating-point torch tensor")
    if isinstance(decades, bool) or not isinstance(decades, int) or decades < 1:
        raise ValueError(f"decades must be a positive int, got {decades!r}")
    x = levels.detach().double()
    x = x[torch.isfinite(x) & (x > 0)]
    if x.numel() == 0:
        raise ValueError("levels has no positive finite entry")
    x = x / x.max()
    return [int(((x <= 10.0**-k) & (x > 10.0 ** -(k + 1))).sum()) for k in range(decades)]


def stacked_bars(ax, labels: Sequence[str], parts: Mapping[str, Sequence[float]], *,
                 colors: Mapping[str, str] | None = None, total_format: str = "{:.0f}", width: float = 0.6):
    """Draw one stacked bar per label (``parts``: name -> one height per label), totals on top.

    Returns the list of bar containers, one per part, bottom first.
    """
    labels = list(labels)
    if not parts:
        raise ValueError("parts must name at least one stack")
    bottoms = [0.0] * len(labels)
    containers = []
    for name, heights in parts.items():
        heights = [float(h) for h in heights]
        if len(heights) != len(labels):
            raise ValueError(f"part {name!r} has {len(heights)} heights for {len(labels)} bars")
        if any(h < 0 for h in heights):
            raise ValueError(f"part {name!r} has a negative height")
        color = colors.get(name) if colors else None
        containers.append(ax.bar(labels, heights, width, bottom=bottoms, label=name, color=color))
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for i, total in enumerate(bottoms):
        ax.annotate(total_format.format(total), (i, total), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=9)
    return containers
