"""The bytes-vs-loss board (bench/board.py): an optimizer from outside the library gets its point, with
bytes, Δ and interval computed from its runs; bad --optimizer / --kwargs are refused; the sweep's rule;
the Pareto front; Muon's groups."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import bench.board as B  # noqa: E402
import board_bytes  # noqa: E402
import board_rows as R  # noqa: E402
import lm_task  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("board")
    result = B.main(["--optimizer", "torch.optim:Adagrad", "--kwargs", '{"eps": 1e-10}', "--lr", "0.01",
                     "--steps", "3", "--seeds", "0", "1", "--out", str(out), "--label", "my Adagrad"])
    return out, result


def test_a_foreign_optimizer_gets_its_point(tiny):
    out, result = tiny
    path = out / "board-steps3.json"
    assert path.exists() and (out / "board-steps3.png").exists()
    written = json.loads(path.read_text())
    rows = {e["key"]: e for e in written["rows"]}
    assert set(rows) == {"adamw", "custom-my_adagrad"}  # a tiny run: no built-in rows, the baseline only
    row = rows["custom-my_adagrad"]
    assert row["label"] == "my Adagrad" and row["lr"] == 0.01 and row["n"] == 2 and row["seeds"] == [0, 1]
    assert written["custom"][0]["optimizer"] == "torch.optim:Adagrad" and written["custom"][0]["kwargs"] == {"eps": 1e-10}

    # Δ and its interval by hand from the run files
    runs = out / "runs" / "board"
    mine = [json.loads((runs / f"steps3-custom-my_adagrad-lr0.01-t1-s{s}.json").read_text()) for s in (0, 1)]
    base = [json.loads((runs / f"steps3-adamw-lr0.002-t1-s{s}.json").read_text()) for s in (0, 1)]
    assert [r["config"]["steps"] for r in mine + base] == [3, 3, 3, 3]
    assert [r["optimizer"] for r in mine] == ["custom-my_adagrad"] * 2
    d = [100 * (m["valid_loss"] - b["valid_loss"]) / b["valid_loss"] for m, b in zip(mine, base)]
    assert d[0] != d[1]
    half = math.tan(math.pi * 0.475) * statistics.stdev(d) / math.sqrt(2)  # t(0.975, df=1) is Cauchy's quantile
    got = row["delta_pct"]
    assert got["mean"] == pytest.approx(statistics.fmean(d), rel=1e-12)
    assert got["ci_low"] == pytest.approx(statistics.fmean(d) - half, rel=1e-9)
    assert got["ci_high"] == pytest.approx(statistics.fmean(d) + half, rel=1e-9)
    assert row["valid_loss"] == [r["valid_loss"] for r in mine]

    # bytes: Adagrad keeps "sum" (fp32, the parameter's size) and "step" (a 0-d fp32 tensor) per parameter
    model = lm_task.build_model(B.config(3), 0)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    assert row["parameters"] == n == 445_952
    assert row["bytes_per_param"] == pytest.approx((4 * n + 4 * len(params)) / n, rel=1e-12)
    assert rows["adamw"]["bytes_per_param"] == pytest.approx((8 * n + 4 * len(params)) / n, rel=1e-12)
    # two points: Adagrad has fewer bytes, so it is on the front; AdamW is on it only if its 0 beats Adagrad's mean Δ
    assert row["pareto"] is True
    assert rows["adamw"]["pareto"] == (got["mean"] > 0)
    assert written["pareto"] == ["custom-my_adagrad"] + (["adamw"] if got["mean"] > 0 else [])


def test_rerun_reuses_the_stored_runs(tiny):
    out, _ = tiny
    runs = sorted((out / "runs" / "board").glob("*.json"))
    stamps = [p.stat().st_mtime_ns for p in runs]
    B.main(["--optimizer", "torch.optim:Adagrad", "--kwargs", '{"eps": 1e-10}', "--lr", "0.01", "--steps", "3",
            "--seeds", "0", "1", "--out", str(out), "--label", "my Adagrad", "--no-plot"])
    assert [p.stat().st_mtime_ns for p in runs] == stamps  # nothing re-run


@pytest.mark.parametrize("argv, message", [
    (["--optimizer", "torch.optim.Adagrad"], "must look like package.module:Class"),
    (["--optimizer", "no_such_module_xyz:Opt"], "cannot import module 'no_such_module_xyz'"),
    (["--optimizer", "torch.optim:NoSuchOptimizer"], "has no attribute 'NoSuchOptimizer'"),
    (["--optimizer", "torch.nn:Linear"], "not a torch.optim.Optimizer subclass"),
    (["--optimizer", "torch.optim:Adagrad", "--kwargs", "{eps: 1}"], "--kwargs must be a JSON object"),
    (["--optimizer", "torch.optim:Adagrad", "--kwargs", "[1, 2]"], "got list"),
    (["--optimizer", "torch.optim:Adagrad", "--kwargs", '{"lr": 0.1}'], "give the learning rate with --lr"),
    (["--optimizer", "torch.optim:Adagrad", "--kwargs", '{"nonsense": 1}'], "rejected by torch.optim:Adagrad"),
    (["--optimizer", "torch.optim:Adagrad", "--kwargs", '{"eps": -1}'], "rejected by torch.optim:Adagrad"),
    (["--kwargs", '{"eps": 1}'], "give --optimizer"),
    (["--optimizer", "torch.optim:Adagrad", "--lr", "-1"], "--lr must be a positive number"),
    (["--optimizer", "torch.optim:Adagrad", "--seeds", "3"], "at least 2 different seeds"),
])
def test_bad_arguments_are_refused_before_anything_runs(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        B.main(argv + ["--steps", "2", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written


def _fake_sweep(out, rule, losses):
    row = R.sweep_row(rule)
    for lr, per_seed in losses.items():
        for seed, loss in zip(R.SWEEP_SEEDS, per_seed):
            path = B.run_path(out, row, lr, seed, B.config())
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"valid_loss": loss, "diverged": not loss < lm_task.UNIFORM_LOSS}))


def test_the_sweep_chooses_the_lowest_mean_and_extends_past_an_edge(tmp_path):
    lion = R.SWEEP_LRS["lion"]
    _fake_sweep(tmp_path, "lion", {lion[0]: (2.6, 2.6), lion[1]: (2.5, 2.4), lion[2]: (2.41, 2.41)})
    assert B.sweep_summary("lion", tmp_path) is None  # best at the top edge: the next lr is wanted
    grid, _ = B.sweep_grid("lion", tmp_path)
    assert grid == sorted(lion) + [2 * lion[2]]
    _fake_sweep(tmp_path, "lion", {2 * lion[2]: (2.42, 2.43)})
    s = B.sweep_summary("lion", tmp_path)
    assert s["best_lr"] == s["used_lr"] == lion[2] and not s["best_at_edge"]
    assert [e["mean"] for e in s["lrs"]] == pytest.approx([2.6, 2.45, 2.41, 2.425])

    rms = sorted(R.SWEEP_LRS["rmsprop"])  # a diverged run loses to every finished one
    _fake_sweep(tmp_path, "rmsprop", {rms[0]: (2.9, 2.9), rms[1]: (2.5, 2.5), rms[2]: (2.0, 9.0), rms[3]: (2.7, 2.7)})
    s = B.sweep_summary("rmsprop", tmp_path)
    assert s["used_lr"] == rms[1] and s["lrs"][2]["diverged"] == 1

    adamw = sorted(R.SWEEP_LRS["adamw"])  # AdamW keeps the benchmark's lr, and says what the sweep preferred
    _fake_sweep(tmp_path, "adamw", {adamw[0]: (2.5, 2.5), adamw[1]: (2.4, 2.4), adamw[2]: (2.3, 2.3)})
    s = B.sweep_summary("adamw", tmp_path)
    assert s["used_lr"] == R.ADAMW_LR and s["best_lr"] == adamw[2] and s["best_at_edge"]


def test_pareto_front():
    def pt(key, b, mean):
        return {"key": key, "bytes_per_param": b, "delta_pct": None if key == "adamw" else {"mean": mean}}

    points = [pt("adamw", 8, 0), pt("a", 2, 0.1), pt("b", 2, -0.1), pt("c", 1, 0.5), pt("d", 4, 0.2), pt("e", 1, 0.5)]
    assert B.pareto(points) == ["c", "e", "b"]  # ties stay (neither beats the other); d and a are beaten by b


def test_muon_groups_give_hidden_matrices_to_muon_and_the_rest_to_adamw():
    from adam8lib.training import make_param_groups

    cfg = B.config(3)
    model = lm_task.build_model(cfg, 0)
    B.tag_names(model)
    groups = R.muon_groups(make_param_groups(model, cfg.weight_decay), cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = [names[id(p)] for g in groups if g["use_muon"] for p in g["params"]]
    adamw = [names[id(p)] for g in groups if not g["use_muon"] for p in g["params"]]
    assert sorted(muon + adamw) == sorted(names.values())
    assert "transformer.wte.weight" in adamw and "transformer.wpe.weight" in adamw
    assert all(model.get_parameter(n).dim() == 2 for n in muon) and len(muon) == 4 * cfg.n_layer
    assert all(g["lr"] == R.ADAMW_LR and g["adamw_betas"] == tuple(cfg.betas) for g in groups if not g["use_muon"])
    untagged = make_param_groups(lm_task.build_model(cfg, 0), cfg.weight_decay)
    with pytest.raises(ValueError, match="names"):
        R.muon_groups(untagged, cfg)


def test_state_bytes_counts_each_storage_once():
    p, q = torch.nn.Parameter(torch.zeros(5000)), torch.nn.Parameter(torch.zeros(10))
    opt = torch.optim.SGD([p, q], lr=0.1)
    shared = torch.zeros(256)
    opt.state[p] = {"buf": torch.zeros(5000, dtype=torch.uint8), "map": shared, "step": 3}
    opt.state[q] = {"buf": torch.zeros(10), "map": shared}
    b = board_bytes.state_bytes(opt)
    assert b["total"] == 5000 + 1024 + 40 and b["large_params_bytes"] == 5000 + 1024 and b["small_params_bytes"] == 40


def test_the_report_says_what_the_intervals_resolve_and_what_is_missing():
    import board_report

    def row(key, mean, lo, hi, n=8):
        return {"key": key, "label": key, "rule": R.ROWS[key].rule, "state_format": R.ROWS[key].state_format,
                "library": R.ROWS[key].library, "lr": 1e-3, "n": n, "n_wanted": 8, "diverged": 0, "pareto": False,
                "bytes_per_param": 1.0, "large_tensors_bytes_per_param": 1.0,
                "delta_pct": None if key == "adamw" else {"mean": mean, "ci_low": lo, "ci_high": hi, "std": 0.3}}

    result = {"rows": [row("adamw", 0, 0, 0), row("lion-fp32", 5.0, 4.0, 6.0), row("lion-8bit", 0.3, 0.05, 0.55),
                       row("adamw-8bit", 0.0, -0.3, 0.3, n=5)],
              "excluding_zero": ["lion-fp32", "lion-8bit"], "noise_floor": {"seed_to_seed_relative_std_pct": 0.7}}
    text = board_report.resolution(result)
    assert "With 3 comparisons at 95 %, about 0.1 would exclude 0 by chance" in text and "2 do here" in text
    assert "Still excluding 0 at 99 % (|t| above 3.50 with 7 degrees of freedom; ~0.03 such hits expected by " \
           "chance): lion-fp32: real differences." in text
    assert "Excluding 0 at 95 % only: lion-8bit:" in text
    assert "Two rows are not compared by whether their intervals overlap" in text
    assert "a format is compared with its rule's fp32 row seed by seed (paired, below)" in text
    missing = board_report.not_run(result)
    assert "adamw-8bit (5 of 8 seeds)" in missing and "muon-fp8" in missing and "lion-fp32," not in missing
    assert "5 of 8 (incomplete)" in board_report.table(result)


def test_within_rule_pairs_each_format_with_its_rules_fp32_row_seed_by_seed():
    import board_report

    def row(key, losses, seeds=(0, 1, 2, 3)):
        return {"key": key, "label": key, "rule": R.ROWS[key].rule, "state_format": R.ROWS[key].state_format,
                "library": R.ROWS[key].library, "bytes_per_param": 1.0, "seeds": list(seeds),
                "valid_loss": list(losses),
                "delta_pct": None if key == "adamw" else {"seeds": list(seeds), "ci_low": -1.0, "ci_high": 1.0}}

    fp32, four = [2.0, 2.2, 2.1, 2.3], [2.02, 2.21, 2.13, 2.31]
    result = {"rows": [row("adamw", [2.0] * 4), row("adamw-8bit", [2.0] * 4), row("lion-fp32", fp32),
                       row("lion-4bit", four), row("lion-8bit", [2.0, 2.2, 2.1], seeds=(0, 1, 2)),
                       row("muon-8bit", [2.0] * 4)]}  # no muon-fp32 row: nothing to pair with
    got = {w["key"]: w for w in board_report.within_rule(result)}
    assert set(got) == {"lion-4bit", "lion-8bit"}  # AdamW's rows are their Δ already
    d = [100 * (b - a) / a for a, b in zip(fp32, four)]
    half = 3.182446305284263 * statistics.stdev(d) / 2  # t(0.975, 3)
    w = got["lion-4bit"]
    assert w["versus"] == "lion-fp32" and w["n"] == 4 and w["seeds"] == [0, 1, 2, 3]
    assert w["mean"] == pytest.approx(statistics.fmean(d), rel=1e-12)
    mean = statistics.fmean(d)
    assert (w["ci_low"], w["ci_high"]) == pytest.approx((mean - half, mean + half), rel=1e-9)
    assert got["lion-8bit"]["n"] == 3 and got["lion-8bit"]["mean"] == pytest.approx(0.0, abs=1e-12)  # common seeds only
    text = board_report.within_rule_text(result)
    assert "Resolved: lion-4bit +" in text and "With 2 such comparisons at 95 %, about 0.1 would exclude 0" in text


def test_the_machine_line_names_every_machine_the_runs_ran_on():
    import board_report

    result = {"environment": {"cpu": "Report CPU", "cores": 2, "python": "3.11.7", "torchao": None},
              "rows": [{"run_environments": [{"cpu": "AMD EPYC", "torch": "2.13.0+cpu", "bitsandbytes": "0.50.2",
                                              "torchao": None, "runs": 5}]},
                       {"run_environments": [{"cpu": "Intel Xeon", "torch": "2.13.0+cpu", "bitsandbytes": "0.50.2",
                                              "torchao": "0.18.0", "runs": 3},
                                             {"cpu": None, "torch": None, "bitsandbytes": None, "torchao": None,
                                              "runs": 2}]}]}
    text = board_report.machine(result)
    assert text.startswith("AMD EPYC (5 runs); Intel Xeon (3 runs); machine not recorded (2 runs)")
    assert "torchao 0.18.0" in text and "Report CPU" not in text


def test_the_packaged_board_is_the_compact_form_of_the_full_one_and_plots():
    """Lesson 13 reads adam8lib/course/results/board.json: it must be what `--report` makes of
    bench/results/board.json (no drift between the two), with every row's interval around its mean."""
    import matplotlib

    matplotlib.use("Agg")
    from adam8lib.course import board as course_board

    full = json.loads((ROOT / "bench" / "results" / "board.json").read_text())
    shipped = course_board.load()
    assert shipped == json.loads(json.dumps(course_board.compact(full, R.RULE_LABELS)))
    assert {e["key"] for e in shipped["rows"]} == set(R.ROWS)
    for e in shipped["rows"]:
        d = e["delta_pct"]
        assert (d is None) == (e["key"] == "adamw")
        assert d is None or d["ci_low"] < d["mean"] < d["ci_high"]
    # the paired within-rule comparisons, recomputed from the full board's per-seed losses
    pairs = {w["key"]: w for w in shipped["within_rule"]}
    assert set(pairs) == {k for k, r in R.ROWS.items() if r.rule != "adamw" and r.state_format != "fp32"}
    by = {e["key"]: e for e in full["rows"]}
    for key, w in pairs.items():
        base, mine = by[w["versus"]], by[key]
        d = [100 * (b - a) / a for a, b in zip(base["valid_loss"], mine["valid_loss"])]
        assert base["seeds"] == mine["seeds"] and w["n"] == len(d)
        assert w["mean"] == pytest.approx(statistics.fmean(d), rel=1e-9, abs=1e-12)
    assert "+0.76 % [+0.19, +1.33]" in course_board.paired_table(shipped)
    text = course_board.table(shipped)
    assert len(text.splitlines()) == 1 + len(R.ROWS) and "+4.98 % [+3.89, +6.07]" in text
    with pytest.raises(KeyError, match="no row 'lion-2bit'"):
        course_board.row(shipped, "lion-2bit")
    fig = course_board.plot(shipped)
    assert len(fig.axes[0].collections) + len(fig.axes[0].lines) > len(R.ROWS)
