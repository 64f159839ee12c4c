"""Paired-seed statistics for the convergence benchmarks, without scipy.

Each optimizer is run with the same seeds (same initial weights, same data order), so the
question "is B as good as A?" is answered by the per-seed differences ``d_i = b_i - a_i``
(or relative: ``d_i = (b_i - a_i) / a_i``), not by comparing two means with their own
spreads. With ``n`` seeds, mean ``d̄`` and sample standard deviation ``s``::

    CI95 = d̄ ± t_{0.975, n-1} · s / sqrt(n)

the Student-t interval (the differences are treated as independent draws of one normal
variable). ``t_{0.975, n-1}`` comes from :func:`t_quantile`, which inverts the t CDF written
with the regularized incomplete beta function (Numerical Recipes' continued fraction)::

    P(T <= t) = 1 - I_{df/(df+t²)}(df/2, 1/2) / 2        (t >= 0)
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

__all__ = ["incomplete_beta", "t_cdf", "t_quantile", "paired", "mean_ci", "median_ci", "median_and_ci"]


def incomplete_beta(x: float, a: float, b: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)`` for ``0 <= x <= 1``, ``a, b > 0``."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1.0) / (a + b + 2.0):  # the continued fraction converges fast on this side only
        return 1.0 - incomplete_beta(1.0 - x, b, a)
    # modified Lentz's method for the continued fraction
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return front * h / a


def t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df}")
    tail = 0.5 * incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (bisection on :func:`t_cdf`, to ~1e-12)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def mean_ci(values: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """Mean, sample std, n and the Student-t confidence interval of the mean."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n < 2:
        raise ValueError(f"need at least 2 values for a confidence interval, got {n}")
    mean, sd = statistics.fmean(xs), statistics.stdev(xs)
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "std": sd, "ci_low": mean - half, "ci_high": mean + half, "level": level}


def paired(baseline: Sequence[float], other: Sequence[float], *, relative: bool = False,
           level: float = 0.95) -> dict[str, float]:
    """Mean paired difference ``other - baseline`` (per seed; ``/ baseline`` if relative) with its CI."""
    if len(baseline) != len(other):
        raise ValueError(f"paired samples need equal lengths, got {len(baseline)} and {len(other)}")
    diffs = [(o - b) / b if relative else o - b for b, o in zip(baseline, other)]
    out = mean_ci(diffs, level)
    out["relative"] = relative
    out["diffs"] = diffs
    return out


def median_ci(values: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """The median and a distribution-free confidence interval for it (order statistics).

    For ``n`` independent draws, the number that fall below the true median is
    Binomial(n, 1/2) whatever the distribution, so the interval from the ``j``-th smallest
    to the ``j``-th largest value (1-based) holds the median with probability
    ``1 - 2·P(B <= j - 1)``. ``j`` is the largest rank whose interval still reaches
    ``level``; ``coverage`` is that exact probability (at least ``level``). Used for the
    per-round speed ratios of ``bench_step.py``, which have no reason to be normal.
    """
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if any(math.isnan(x) for x in xs):
        raise ValueError("values contain NaN")
    j, below = _median_rank(n, level)
    if j == 0:
        raise ValueError(f"{n} values cannot give a {level:.0%} interval for the median "
                         f"(the widest, min to max, covers {1 - 2 / 2.0 ** n:.1%} at most)")
    return {"n": n, "median": statistics.median(xs), "ci_low": xs[j - 1], "ci_high": xs[n - j],
            "coverage": 1.0 - 2.0 * below, "level": level}


def _median_rank(n: int, level: float) -> tuple[int, float]:
    """The largest rank ``j`` (1-based; 0 if none) with ``2·P(B <= j - 1) <= 1 - level`` for
    B ~ Binomial(n, 1/2), and that ``P(B <= j - 1)``."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    alpha_half = (1.0 - level) / 2.0
    below, j = 0.0, 0  # below = P(B <= j - 1)
    while j <= n:
        nxt = below + math.comb(n, j) / 2.0 ** n  # P(B <= j)
        if nxt > alpha_half:
            break
        below, j = nxt, j + 1
    return j, below


def median_and_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(median, ci_low, ci_high)`` of :func:`median_ci`; the interval is NaN where there are
    too few values for one (fewer than 6 at 95 %), so a quick run still reports its median."""
    values = list(values)
    if _median_rank(len(values), level)[0] == 0:
        return statistics.median(values), math.nan, math.nan
    out = median_ci(values, level)
    return out["median"], out["ci_low"], out["ci_high"]
