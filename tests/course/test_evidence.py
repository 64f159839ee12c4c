"""adam8lib.course.evidence: the packaged convergence results load, agree with their own runs,
and tabulate/plot; bench/convergence.py's summary computes paired statistics per seed."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import stats  # noqa: E402

from adam8lib.course import evidence  # noqa: E402


def _fake_lm_records():
    """AdamW and an 'adam8bit' whose loss is AdamW's + 1 % + a per-seed wobble."""
    records = []
    for seed in range(4):
        base = 2.3 + 0.01 * seed
        for kind, loss in (("adamw", base), ("adam8bit", base * (1.01 + 0.001 * (seed % 2)))):
            records.append({"optimizer": kind, "seed": seed, "threads": 1, "valid_loss": loss,
                            "valid_ppl": math.exp(loss), "spikes": seed % 2, "diverged": False, "seconds": 1.0,
                            "loss": [3.0, 2.5, loss], "valid_curve": [[50, loss + 0.2], [100, loss]]})
    return records


def test_summary_is_paired_by_seed(monkeypatch):
    import convergence

    monkeypatch.setattr("lm_task.describe", lambda cfg: {"stub": True})
    result = convergence.summarize("lm", _fake_lm_records(), ["adamw", "adam8bit"], [0, 1, 2, 3],
                                   convergence.task_config("lm"))
    comp = result["paired_vs_adamw"]["adam8bit"]["valid_loss"]
    # per-seed relative differences are exactly 1.0 %, 1.1 %, 1.0 %, 1.1 %
    assert comp["diffs"] == pytest.approx([0.010, 0.011, 0.010, 0.011])
    assert comp["mean"] == pytest.approx(0.0105)
    half = stats.t_quantile(0.975, 3) * comp["std"] / 2
    assert comp["ci_high"] - comp["mean"] == pytest.approx(half)
    entry = result["optimizers"]["adam8bit"]
    assert entry["spikes"] == [0, 1, 0, 1] and entry["curve"]["steps"] == [50, 100]
    assert entry["curve"]["ci_low"][1] < entry["curve"]["mean"][1] < entry["curve"]["ci_high"][1]
    rows = evidence.rows(result)
    assert rows[1]["Δ valid loss vs AdamW, % [95% CI]"].startswith("+1.05 [+0.9")
    assert rows[0]["Δ valid loss vs AdamW, % [95% CI]"] == "–"  # AdamW is the baseline
    assert "adam8lib Adam8bit" in evidence.table(result)
    assert evidence.markdown_table(result).count("\n") == 3
    # CI [+0.96, +1.14] %: excludes 0 (a loss, since lower loss is better) and is not inside ±1 %
    assert evidence.verdict(result) == (
        "adam8lib Adam8bit vs AdamW: +1.05 %, 95% CI [+0.96, +1.14] % (n=4); excludes 0: a loss resolved; "
        "not inside ±1 %")


def test_summary_root_cause_and_thread_noise_floor(monkeypatch):
    import convergence

    monkeypatch.setattr("lm_task.describe", lambda cfg: {"stub": True})
    records = _fake_lm_records()
    for r in [r for r in records if r["optimizer"] == "adam8bit"]:
        bnb = dict(r, optimizer="bnb8bit", valid_loss=r["valid_loss"] * 0.995, loss=[3.0, 2.5, 2.2])
        same = dict(bnb, optimizer="adam8bit_bnbround")                   # the same run to the bit as bnb
        near = dict(bnb, optimizer="adam8bit_nokeep", valid_loss=r["valid_loss"])  # equal loss to adam8bit,
        records += [bnb, same, near]                                          # but another curve
    for r in [r for r in records if r["optimizer"] == "adamw" and r["seed"] < 2]:
        records.append(dict(r, threads=2, valid_loss=r["valid_loss"] + (1e-6 if r["seed"] else 0.0)))
    kinds = ["adamw", "adam8bit", "bnb8bit", "adam8bit_bnbround", "adam8bit_nokeep"]
    result = convergence.summarize("lm", records, kinds, [0, 1, 2, 3], convergence.task_config("lm"),
                                   noise_threads={"threads": 2, "seeds": [0, 1]})
    rc = result["root_cause"]
    assert rc["adam8bit_bnbround"]["identical_to_bnb8bit"] == [True] * 4
    assert rc["adam8bit_bnbround"]["vs_bnb8bit"]["valid_loss"]["mean"] == 0.0
    assert rc["adam8bit_bnbround"]["vs_adam8bit"]["valid_loss"]["mean"] == pytest.approx(-0.005)
    assert rc["adam8bit_nokeep"]["identical_to_adam8bit"] == [False] * 4  # same final loss, other curve
    assert rc["adam8bit_nokeep"]["vs_adam8bit"]["valid_loss"]["mean"] == 0.0
    floor = result["noise_floor"]["threads"]
    assert floor["bit_identical"] == [True, False] and floor["seeds"] == [0, 1]
    assert floor["valid_loss"]["diffs"][0] == 0.0 and floor["valid_loss"]["diffs"][1] > 0
    verdict = evidence.verdict(result)
    assert "requantized by bitsandbytes' CPU quantizer vs bitsandbytes: +0.00 %" in verdict
    import report

    text = report.text_summary(result)
    assert "adam8bit_bnbround - bnb8bit" in text and "bit-identical runs: 4/4" in text
    assert "bit-identical: 1/2" in text


def test_diverged_runs_are_counted_not_averaged(monkeypatch):
    import convergence

    monkeypatch.setattr("lm_task.describe", lambda cfg: {"stub": True})
    records = _fake_lm_records()
    for r in [r for r in records if r["optimizer"] == "adam8bit"]:
        blown = r["seed"] in (0, 1)  # two seeds blow up (finite but far above ln 256), two train
        records.append(dict(r, optimizer="linear_tensor_nokeep", diverged=blown,
                            valid_loss=850.0 if blown else r["valid_loss"]))
    result = convergence.summarize("ablation", records, ["adamw", "linear_tensor_nokeep"], [0, 1, 2, 3],
                                   convergence.task_config("ablation"))
    e = result["optimizers"]["linear_tensor_nokeep"]
    assert e["diverged"] == 2 and e["valid_loss"]["per_seed"][0] == 850.0
    assert e["valid_loss"]["mean"] == pytest.approx((2.32 * 1.01 + 2.33 * 1.011) / 2)  # seeds 2 and 3 only
    comp = result["paired_vs_adamw"]["linear_tensor_nokeep"]["valid_loss"]
    assert comp["n"] == 2 and comp["excluded_diverged"] == 2
    assert comp["diffs"] == pytest.approx([0.010, 0.011])
    assert e["curve"]["steps"] == [50, 100]  # the band is drawn from the runs that trained
    row = evidence.rows(result)[1]
    assert row["diverged"] == "2/4" and row["valid loss (nats/byte)"].startswith("2.34")
    # the mean and the interval say that they cover only the runs that did not diverge
    assert row["valid loss (nats/byte)"].endswith("(2 runs that did not diverge)")
    assert row["Δ valid loss vs AdamW, % [95% CI]"].endswith("(n=2: diverged seeds left out)")
    assert "2 diverged seeds left out" in evidence.verdict(result)
    assert "left out" not in evidence.rows(result)[0]["Δ valid loss vs AdamW, % [95% CI]"]


def test_ablation_at_the_lm_configuration_reuses_the_lm_runs():
    import convergence

    cfg = convergence.task_config("ablation", {"lr": convergence.task_config("lm").lr})
    assert convergence.run_path("ablation", "dynamic_block", 3, 1, cfg) == \
        convergence.run_path("lm", "adam8bit", 3, 1, convergence.task_config("lm"))
    assert convergence.run_path("ablation", "linear_tensor", 3, 1, cfg).parent.name == "lm"
    high = convergence.task_config("ablation", {"lr": 0.01})
    assert convergence.run_path("ablation", "dynamic_block", 3, 1, high).name == "dynamic_block-lr0.01-t1-s3.json"


def test_plot_draws_bands_and_intervals(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import convergence

    monkeypatch.setattr("lm_task.describe", lambda cfg: {"stub": True})
    result = convergence.summarize("lm", _fake_lm_records(), ["adamw", "adam8bit"], [0, 1, 2, 3],
                                   convergence.task_config("lm"))
    fig = evidence.plot(result)
    left, right = fig.axes[:2]
    assert len(left.collections) == 2  # one 95 % band per optimizer
    assert len(right.lines) >= 1 and right.get_yticklabels()[0].get_text().startswith("adam8lib")


def test_unknown_experiment_is_rejected():
    with pytest.raises(ValueError, match="unknown experiment"):
        evidence.load("convergence")


@pytest.mark.parametrize("name", evidence.EXPERIMENTS)
def test_packaged_results_agree_with_their_runs(name):
    result = evidence.load(name)
    assert result is not None, f"adam8lib/course/results/{name}.json is missing (bench/convergence.py makes it)"
    seeds = result["seeds"]
    assert len(seeds) >= {"convergence_lm": 8, "convergence_cls": 10, "ablation": 1, "beyond_8_bits": 8}[name]
    runs = {(r["optimizer"], r["seed"], r["threads"]): r for r in result["runs"]}
    metric = "accuracy" if name == "convergence_cls" else "valid_loss"
    for kind, comp in result["paired_vs_adamw"].items():
        # seeds where neither run diverged (a diverged run is counted, not compared)
        kept = [s for s in seeds if not runs[("adamw", s, 1)].get("diverged") and not runs[(kind, s, 1)].get("diverged")]
        if len(kept) < 2:
            assert comp == {}  # one seed, or every run diverged: no interval is claimed
            continue
        base = [runs[("adamw", s, 1)][metric] for s in kept]
        other = [runs[(kind, s, 1)][metric] for s in kept]
        again = stats.paired(base, other, relative=metric == "valid_loss")
        assert comp[metric]["mean"] == pytest.approx(again["mean"])
        assert comp[metric]["ci_low"] == pytest.approx(again["ci_low"])
    for kind, rc in result.get("root_cause", {}).items():  # adam8lib with another rounding rule vs both libraries
        for other in ("bnb8bit", "adam8bit"):
            again = stats.paired([runs[(other, s, 1)][metric] for s in seeds], [runs[(kind, s, 1)][metric] for s in seeds],
                                 relative=True)
            assert rc[f"vs_{other}"][metric]["mean"] == pytest.approx(again["mean"])
    floor = result.get("noise_floor", {}).get("threads")
    if floor:
        t = floor["threads"]
        diffs = [runs[("adamw", s, t)][metric] - runs[("adamw", s, 1)][metric] for s in floor["seeds"]]
        assert floor["bit_identical"] == [d == 0 and runs[("adamw", s, t)]["loss"] == runs[("adamw", s, 1)]["loss"]
                                          for d, s in zip(diffs, floor["seeds"])]
    env = result["environment"]
    assert env["threads_per_run"] and env["torch"] and env["python"]
