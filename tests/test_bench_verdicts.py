"""How bench/bench_step.py judges its speed targets: the distribution-free interval of a median
(bench/stats.py) and the 'met?' verdicts built on it. No timing happens here (speed is measured
by `make bench`, never by a test); the inputs are made-up per-round ratios."""

from __future__ import annotations

import math
import random
import statistics
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import bench_step  # noqa: E402
import stats  # noqa: E402


# ------------------------------------------------------------------ the interval of a median
@pytest.mark.parametrize("n, low_rank, high_rank, coverage", [
    # ranks (1-based) from printed tables of the sign-test interval; coverage = 1 - 2 P(B <= j-1)
    (6, 1, 6, 1 - 2 / 64),
    (10, 2, 9, 1 - 2 * 11 / 1024),
    (31, 10, 22, None),
    (61, 23, 39, None),
])
def test_median_ci_uses_the_order_statistics_of_the_sign_test(n, low_rank, high_rank, coverage):
    values = [100.0 + 3 * k for k in range(n)]  # rank r (1-based) holds 100 + 3 (r - 1)
    random.Random(n).shuffle(values)
    out = stats.median_ci(values)
    assert (out["ci_low"], out["ci_high"]) == (100.0 + 3 * (low_rank - 1), 100.0 + 3 * (high_rank - 1))
    assert out["median"] == 100.0 + 3 * (n - 1) / 2
    assert out["n"] == n
    if coverage is not None:
        assert out["coverage"] == pytest.approx(coverage)


@pytest.mark.parametrize("n", [6, 7, 10, 31, 61, 101, 200])
def test_median_ci_is_the_narrowest_interval_that_reaches_the_level(n):
    out = stats.median_ci(range(n))
    j = int(out["ci_low"]) + 1  # values are 0..n-1, so the low end's rank is its value + 1
    assert out["ci_high"] == n - j
    def cover(rank):
        return 1 - 2 * sum(math.comb(n, i) for i in range(rank)) / 2 ** n
    assert out["coverage"] == pytest.approx(cover(j))
    assert out["coverage"] >= 0.95
    assert cover(j + 1) < 0.95  # one rank further in would miss the level


def test_median_ci_covers_the_true_median_of_a_skewed_distribution():
    # exponential(1): median ln 2; 2,000 samples of 31 draws: the interval should hold it in
    # ~97.1 % of them (its exact coverage), whatever the skew
    rng = random.Random(7)
    hits = 0
    for _ in range(2000):
        out = stats.median_ci([rng.expovariate(1.0) for _ in range(31)])
        hits += out["ci_low"] <= math.log(2) <= out["ci_high"]
    assert 0.955 <= hits / 2000 <= 0.985


def test_median_ci_refuses_what_it_cannot_answer():
    with pytest.raises(ValueError, match="5 values cannot give a 95% interval"):
        stats.median_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    with pytest.raises(ValueError, match="NaN"):
        stats.median_ci([1.0] * 9 + [math.nan])
    with pytest.raises(ValueError, match="level"):
        stats.median_ci(range(10), level=1.0)
    assert stats.median_ci(range(10), level=0.5)["coverage"] >= 0.5


# ------------------------------------------------------------------ verdicts
@pytest.mark.parametrize("median, low, high, target, expected", [
    (0.94, 0.91, 0.97, 1.0, "yes"),
    (0.94, 0.91, 1.00, 1.0, "yes"),  # "at most" the target
    (1.08, 1.03, 1.12, 1.0, "no"),
    (0.99, 0.96, 1.02, 1.0, "not resolved: median below 1.0, the 95 % CI spans it"),
    (1.01, 0.98, 1.04, 1.0, "not resolved: median above 1.0, the 95 % CI spans it"),
    (1.16, 1.11, 1.25, 1.5, "yes"),
    (1.60, 1.52, 1.70, 1.5, "no"),
])
def test_verdict_needs_the_whole_interval_on_one_side(median, low, high, target, expected):
    assert bench_step.verdict(median, low, high, target) == expected


def test_verdict_without_an_interval_says_so():
    assert bench_step.verdict(0.9, math.nan, math.nan, 1.0) == "yes (median; too few rounds for an interval)"
    assert bench_step.verdict(1.1, math.nan, math.nan, 1.0) == "no (median; too few rounds for an interval)"


def _rows(size, n, **ms):
    names = {"fused": "torch AdamW (fused)", "copy": bench_step.COPY, "cpu": bench_step.CPU,
             "fast": bench_step.CPU_FAST, "bnb": "bitsandbytes Adam8bit"}
    return [bench_step.Row(names[k], size, n, ms=v, transient_mb=0.0 if k in ("cpu", "fast") else None)
            for k, v in ms.items()]


def test_targets_table_judges_the_paired_ratios_not_the_ratio_of_medians():
    # the medians alone say fast = 0.95x fused, but the per-round ratios (the paired test)
    # straddle 1.0, and the exact mode's interval is clearly under 1.5
    rows = _rows("16.8M", 16_777_216, fused=10.0, copy=10.5, cpu=12.0, fast=9.5, bnb=400.0)
    wall = {"16.8M": {"torch AdamW (fused)": 10.0, bench_step.COPY: 10.5, bench_step.CPU: 12.0,
                      bench_step.CPU_FAST: 9.5}}
    paired = {"16.8M": {bench_step.CPU_FAST: (0.99, 0.95, 1.05, 0.97, 1.02),
                        bench_step.CPU: (1.2, 1.15, 1.25, 1.17, 1.22)}}
    table = bench_step.targets(rows, {"wall": wall, "paired": paired})
    lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()}
    fast = lines["fast mode (cpu_fast) ≤ 1.0× fused AdamW"]
    assert "0.99× fused (paired median, 95 % CI 0.97–1.02, quartiles 0.95–1.05)" in fast
    assert fast.endswith("| not resolved: median below 1.0, the 95 % CI spans it |")
    exact = lines["bit-identical mode (cpu) ≤ 1.5× fused AdamW"]
    assert "1.20× fused" in exact and exact.endswith("| yes |")
    assert lines["≥ 10× faster than bitsandbytes Adam8bit"].endswith("| yes |")
    assert "0.90× copy" in lines["stretch: fast mode within 1.3× of the copy limit"]


def test_targets_table_without_paired_ratios_uses_the_medians():
    rows = _rows("100M", 100_000_000, fused=60.0, copy=62.0, cpu=66.0, fast=63.0, bnb=2000.0)
    table = bench_step.targets(rows, None)
    fast = next(line for line in table.splitlines() if line.startswith("| fast mode"))
    assert "1.05× fused" in fast and fast.endswith("| no |")


def test_model_table_reports_the_paired_ratios_and_says_when_it_could_not_run():
    assert "not timed" in bench_step.model_table(None)
    res = {"model": "distilbert-base-cased for sequence classification from its config", "params": 65_783_042, "tensors": 104, "fp32_state_tensors": 65, "rounds": 21, "rows": {
        bench_step.MODEL_ROWS[1]: {"ms": 45.0, "ratio": 1.0, "ci_low": 1.0, "ci_high": 1.0},
        bench_step.CPU_FAST: {"ms": 44.1, "ratio": 0.98, "ci_low": 0.95, "ci_high": 1.03},
        bench_step.CPU: {"ms": 52.0, "ratio": 1.15, "ci_low": math.nan, "ci_high": math.nan}}}
    table = bench_step.model_table(res)
    assert "(distilbert-base-cased for sequence classification from its config: 65,783,042 parameters in 104 " \
           "tensors, 65 of them" in table
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert rows[bench_step.MODEL_ROWS[1]].endswith("| 1.00× | – |")  # the anchor has no interval
    assert rows[bench_step.CPU_FAST].endswith("| 44.1 | 0.98× | 0.95–1.03 |")
    assert rows[bench_step.CPU].endswith("| 1.15× | – |")


def test_median_and_ci_gives_the_median_alone_when_an_interval_is_impossible():
    med, lo, hi = stats.median_and_ci([3.0, 1.0, 2.0])
    assert med == 2.0 and math.isnan(lo) and math.isnan(hi)
    assert stats.median_and_ci(range(31)) == (15, 9.0, 21.0)
    with pytest.raises(ValueError, match="NaN"):
        stats.median_and_ci([1.0] * 9 + [math.nan])
    with pytest.raises(statistics.StatisticsError):
        stats.median_and_ci([])
