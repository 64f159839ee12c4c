"""The bytes-vs-loss board: every update rule x every state format on the course's byte-level LM.

How many bytes of optimizer state per parameter does each optimizer need before it trains worse than
fp32 AdamW? Each row of the board is an optimizer (:mod:`bench.board_rows`: AdamW, Lion, AdEMAMix,
RMSprop and Muon with fp32, 8-bit, 4-bit and FP8 states, Adan with fp32 and 8-bit states, and bitsandbytes' /
torchao's classes as anchors), trained on the LM of ``bench/lm_task.py`` (445,952 parameters, 250 steps) with seeds 0-7: the
seed fixes the initial weights and the batches, the same for every row, so each run is compared with
fp32 AdamW *on its seed* (the mean relative difference in final validation loss, in %, with its 95 %
Student-t interval, ``bench/stats.py``). Its x is the state bytes per parameter measured from the
allocated states (:mod:`bench.board_bytes`).

**Learning rates.** Each rule's lr comes from a sweep with fp32 states on other seeds (100, 101;
:data:`bench.board_rows.SWEEP_LRS`); the rule: the lr with the lowest mean final validation loss over
those seeds (a diverged run counts as worse than any finished one); every format of the rule then uses
it. AdamW is swept too, but its rows keep the LM benchmark's lr 2e-3 (their runs are the benchmark's
own, reused, not repeated); the sweep says whether 2e-3 is also the sweep's choice.

Run (resumable: a run whose JSON exists is skipped; one torch thread per run)::

    python -m bench.board                 # the sweep, then every row, then the report
    python -m bench.board --report        # board.json, table, plot, README sections from stored runs
    python -m bench.board --optimizer torch.optim:Adagrad --kwargs '{"lr_decay": 0}' --lr 0.01
    python -m bench.board --optimizer torch.optim:Adagrad --lr 0.01 --steps 5 --seeds 0 1 --out /tmp/b

``--optimizer package.module:Class`` puts any torch optimizer on the board: it is built as
``Class(param_groups, lr=LR, **KWARGS)`` over the LM's param groups (weight decay 0.01 on the
matrices, 0 elsewhere), run through the same seeds and compared with fp32 AdamW on each; its point is
added to the board (with ``--steps``, a tiny run, it goes to its own file ``board-steps{N}.json``
beside fp32 AdamW runs of the same length).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
for _p in (str(BENCH), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import board_rows as R  # noqa: E402
import lm_task  # noqa: E402
import stats  # noqa: E402

RESULTS = BENCH / "results"
LM_RUNS = RESULTS / "runs" / "lm"
#: The compact copy the course package ships (lesson 13 reads it with adam8lib.course.board.load()).
COURSE_BOARD = ROOT / "adam8lib" / "course" / "results" / "board.json"
SEEDS = tuple(range(8))
THREADS = 1


# ---------------------------------------------------------------------- custom optimizers
def load_optimizer(spec: str) -> type:
    """``"package.module:Class"`` -> the class (a ``torch.optim.Optimizer`` subclass), or ValueError."""
    import torch

    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"--optimizer must look like package.module:Class, got {spec!r}")
    module_name, attr = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--optimizer {spec!r}: cannot import module {module_name!r} ({exc})") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--optimizer {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer)):
        raise ValueError(f"--optimizer {spec!r} is {obj!r}, not a torch.optim.Optimizer subclass")
    return obj


def parse_kwargs(text: str | None) -> dict[str, Any]:
    """``--kwargs``: a JSON object of keyword arguments (``lr`` goes in ``--lr``)."""
    if text is None or text == "":
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--kwargs must be a JSON object, e.g. '{{\"eps\": 1e-8}}': {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"--kwargs must be a JSON object (keyword -> value), got {type(value).__name__}: {text}")
    if "lr" in value:
        raise ValueError("--kwargs must not hold 'lr': give the learning rate with --lr (it is scheduled per step)")
    if "params" in value:
        raise ValueError("--kwargs must not hold 'params': the board gives the LM's parameter groups")
    return value


def custom_row(spec: str, kwargs: dict[str, Any], label: str | None) -> R.Row:
    cls = load_optimizer(spec)

    def make(groups, cfg, lr):
        return cls(groups, lr=lr, **kwargs)

    # fail now, clearly, if the class refuses these arguments (on a throwaway parameter)
    import torch

    try:
        cls([torch.nn.Parameter(torch.zeros(2))], lr=1e-3, **kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--kwargs {json.dumps(kwargs)} rejected by {spec}: {exc}") from None
    label = label or spec.replace(":", ".")
    slug = re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_").lower() or "custom"
    return R.Row(f"custom-{slug}", "custom", "custom", "custom", label, make)


# ---------------------------------------------------------------------- runs
def config(steps: int | None = None):
    cfg = lm_task.LMConfig()
    return cfg if steps is None else replace(cfg, steps=steps)


def tag_of(cfg) -> str:
    return "" if cfg == lm_task.LMConfig() else f"steps{cfg.steps}-"


def run_path(out: Path, row: R.Row, lr: float, seed: int, cfg) -> Path:
    """A run's JSON. The rows that are the LM benchmark's own runs (same lr, seeds 0-7, threads, config)
    are read from ``bench/results/runs/lm/``; everything the board runs goes under ``OUT/runs/board/``."""
    if row.reuse and lr == R.ADAMW_LR and cfg == lm_task.LMConfig() and seed in SEEDS:
        stored = LM_RUNS / f"{row.reuse}-lr{lr:g}-t{THREADS}-s{seed}.json"
        if stored.exists() or out == RESULTS:
            return stored
    return out / "runs" / "board" / f"{tag_of(cfg)}{row.key}-lr{lr:g}-t{THREADS}-s{seed}.json"


@contextmanager
def named_parameters():
    """While it is active, every LM the task builds has its parameters tagged with their names
    (:data:`bench.board_rows.NAME_ATTR`): Muon's rows split the groups by name."""
    original = lm_task.build_model

    def build(cfg, seed):
        model = original(cfg, seed)
        tag_names(model)
        return model

    lm_task.build_model = build
    try:
        yield
    finally:
        lm_task.build_model = original


def tag_names(model) -> None:
    for name, p in model.named_parameters():
        setattr(p, R.NAME_ATTR, name)


def run_one(row: R.Row, lr: float, seed: int, cfg) -> dict[str, Any]:
    """Train one LM with ``row``'s optimizer at ``lr`` (eval every 50 steps, as the LM benchmark)."""
    from convergence import environment

    with named_parameters():
        record = lm_task.run(lambda groups, c: row.make(groups, c, lr), seed, cfg, threads=THREADS, eval_every=50)
    record.update(optimizer=row.key, rule=row.rule, state_format=row.state_format, library=row.library,
                  label=row.label, lr=lr, task="lm", config=asdict(cfg), environment=environment([THREADS]))
    return record


def _claim(path: Path) -> bool:
    """Take ``path`` for this process (so two runner processes never do the same run)."""
    claim = path.with_suffix(".claim")
    claim.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            pid = int(claim.read_text() or 0)
            os.kill(pid, 0)
            return False  # another live runner has it
        except (ValueError, ProcessLookupError, PermissionError, OSError):
            claim.unlink(missing_ok=True)  # a dead runner's claim
            return _claim(path)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def ensure(row: R.Row, lr: float, seed: int, cfg, out: Path, log=print) -> dict[str, Any] | None:
    """The run's record: read if stored, else run it and store it (None if another runner has it)."""
    path = run_path(out, row, lr, seed, cfg)
    if path.exists():
        return json.loads(path.read_text())
    if not _claim(path):
        return None
    try:
        start = time.perf_counter()
        record = run_one(row, lr, seed, cfg)
        path.write_text(json.dumps(record) + "\n")
        log(f"{row.key:18s} lr {lr:<7g} seed {seed:3d}: valid loss {record['valid_loss']:.4f}"
            f"{'  DIVERGED' if record['diverged'] else ''}  ({time.perf_counter() - start:.0f} s)")
        return record
    finally:
        path.with_suffix(".claim").unlink(missing_ok=True)


def wait_for(row, lr, seed, cfg, out, log=print) -> dict[str, Any]:
    """:func:`ensure`, waiting while another runner does the run."""
    while (record := ensure(row, lr, seed, cfg, out, log)) is None:
        time.sleep(5)
    return record


# ---------------------------------------------------------------------- the sweep
#: How many times a sweep grid is extended (by a factor of 2 past the edge) when its best lr is at an edge.
MAX_EXTENSIONS = 2


def _sweep_entry(row, lr, out, cfg) -> dict[str, Any] | None:
    recs = []
    for seed in R.SWEEP_SEEDS:
        path = run_path(out, row, lr, seed, cfg)
        if not path.exists():
            return None
        recs.append(json.loads(path.read_text()))
    losses = [r["valid_loss"] for r in recs]
    diverged = sum(bool(r["diverged"]) for r in recs)
    return {"lr": lr, "valid_loss": losses, "diverged": diverged,
            "mean": statistics.fmean(losses) if not diverged else math.inf}


def sweep_grid(rule: str, out: Path = RESULTS, cfg=None) -> tuple[list[float], dict[float, Any]]:
    """The sweep's grid as far as its stored runs decide it: :data:`bench.board_rows.SWEEP_LRS`, extended by a
    factor of 2 past an edge while the best lr is at that edge (at most :data:`MAX_EXTENSIONS` times).
    Returns the grid and the entries that are complete (a missing lr: the grid is not decided yet)."""
    cfg = cfg or config()
    row = R.sweep_row(rule)
    grid = sorted(R.SWEEP_LRS[rule])
    entries: dict[float, Any] = {}
    for _ in range(MAX_EXTENSIONS + 1):
        for lr in grid:
            if lr not in entries:
                e = _sweep_entry(row, lr, out, cfg)
                if e is None:
                    return grid, entries
                entries[lr] = e
        best = min(entries.values(), key=lambda e: (e["diverged"], e["mean"]))["lr"]
        if rule == "adamw" or len(grid) - len(R.SWEEP_LRS[rule]) >= MAX_EXTENSIONS:
            break
        if best == grid[-1]:
            grid.append(grid[-1] * 2)
        elif best == grid[0]:
            grid.insert(0, grid[0] / 2)
        else:
            break
    return grid, entries


def sweep_summary(rule: str, out: Path = RESULTS, cfg=None) -> dict[str, Any] | None:
    """The sweep of ``rule``: per lr the sweep seeds' final losses; the chosen lr (lowest mean loss,
    a diverged run worse than any finished one). None while a run is missing."""
    cfg = cfg or config()
    grid, entries = sweep_grid(rule, out, cfg)
    if any(lr not in entries for lr in grid):
        return None
    per_lr = [entries[lr] for lr in grid]
    best = min(per_lr, key=lambda e: (e["diverged"], e["mean"]))
    return {"rule": rule, "row": R.sweep_row(rule).key, "seeds": list(R.SWEEP_SEEDS), "lrs": per_lr,
            "initial_grid": list(R.SWEEP_LRS[rule]), "best_lr": best["lr"],
            "best_at_edge": best["lr"] in (grid[0], grid[-1]),
            "used_lr": R.ADAMW_LR if rule == "adamw" else best["lr"]}


def run_sweep(rule: str, out: Path, cfg, log=print) -> dict[str, Any]:
    row = R.sweep_row(rule)
    while (summary := sweep_summary(rule, out, cfg)) is None:
        grid, entries = sweep_grid(rule, out, cfg)
        for lr in grid:
            if lr not in entries:
                for seed in R.SWEEP_SEEDS:
                    wait_for(row, lr, seed, cfg, out, log)
    return summary


def chosen_lr(rule: str, out: Path = RESULTS, cfg=None) -> float | None:
    if rule == "adamw":
        return R.ADAMW_LR
    s = sweep_summary(rule, out, cfg)
    return None if s is None else s["used_lr"]


#: The runner's plan: (what, rule-or-row), breadth first: each rule's sweep just before its fp32 and 8-bit rows,
#: then the bitsandbytes anchors, Muon, the 4-bit rows, AdamW's sweep (a check of the benchmark's lr), FP8 last.
PLAN = (
    ("repro", "adamw"),
    ("sweep", "lion"), ("row", "lion-fp32"), ("row", "lion-8bit"),
    ("sweep", "ademamix"), ("row", "ademamix-fp32"), ("row", "ademamix-8bit"),
    ("sweep", "rmsprop"), ("row", "rmsprop-fp32"), ("row", "rmsprop-8bit"),
    ("row", "bnb-lion8bit"), ("row", "bnb-ademamix8bit"),
    ("sweep", "muon"), ("row", "muon-fp32"), ("row", "muon-8bit"),
    ("row", "lion-4bit"), ("row", "ademamix-4bit"), ("row", "rmsprop-4bit"), ("row", "muon-4bit"),
    ("sweep", "adamw"),
    ("row", "lion-fp8"), ("row", "ademamix-fp8"), ("row", "rmsprop-fp8"), ("row", "muon-fp8"),
    ("sweep", "adan"), ("row", "adan-fp32"), ("row", "adan-8bit"),
)


def reproduce(seed: int = 0, log=print) -> dict[str, Any]:
    """Re-run fp32 AdamW on ``seed`` with the board's runner and compare it with the LM benchmark's stored run."""
    row = R.ROWS["adamw"]
    path = RESULTS / "runs" / "board" / f"repro-adamw-lr{R.ADAMW_LR:g}-t{THREADS}-s{seed}.json"
    if path.exists():
        new = json.loads(path.read_text())
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        new = run_one(row, R.ADAMW_LR, seed, config())
        path.write_text(json.dumps(new) + "\n")
    old = json.loads((LM_RUNS / f"adamw-lr{R.ADAMW_LR:g}-t{THREADS}-s{seed}.json").read_text())
    rel = abs(new["valid_loss"] - old["valid_loss"]) / old["valid_loss"]
    out = {"seed": seed, "stored_valid_loss": old["valid_loss"], "rerun_valid_loss": new["valid_loss"],
           "relative_difference": rel, "bit_identical": new["valid_loss"] == old["valid_loss"] and new["loss"] == old["loss"],
           "stored_environment": old.get("environment"), "rerun_environment": new.get("environment")}
    log(f"reproducibility: AdamW seed {seed} re-run {new['valid_loss']!r} vs stored {old['valid_loss']!r} "
        f"(relative {rel:.2e}, bit identical: {out['bit_identical']})")
    return out


def run_plan(out: Path = RESULTS, seeds=SEEDS, only: list[str] | None = None, log=print) -> None:
    cfg = config()
    pending = []
    for what, name in PLAN:
        if what == "repro":
            if only is None:
                reproduce(0, log)
            continue
        if what == "sweep":
            if only is None or name in only or any(R.ROWS[k].rule == name for k in only):
                run_sweep(name, out, cfg, log)
            continue
        if only is not None and name not in only:
            continue
        row = R.ROWS[name]
        lr = chosen_lr(row.rule, out, cfg)
        if lr is None:
            lr = run_sweep(row.rule, out, cfg, log)["used_lr"]
        for seed in seeds:  # a run another runner holds is waited for at the end
            if ensure(row, lr, seed, cfg, out, log) is None:
                pending.append((row, lr, seed))
    for row, lr, seed in pending:
        wait_for(row, lr, seed, cfg, out, log)


# ---------------------------------------------------------------------- the board's numbers
def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def row_summary(row: R.Row, lr: float, seeds, cfg, out: Path, baseline: list[dict[str, Any]],
                bytes_info: dict[str, Any]) -> dict[str, Any]:
    """One point: n, per-seed losses, paired Δ % vs fp32 AdamW (95 % interval over the seeds where
    neither run diverged), diverged count, bytes per parameter."""
    recs = {}
    for seed in seeds:
        path = run_path(out, row, lr, seed, cfg)
        if path.exists():
            recs[seed] = json.loads(path.read_text())
    base = {r["seed"]: r for r in baseline}
    done = [s for s in seeds if s in recs and s in base]
    pairs = [s for s in done if not recs[s]["diverged"] and not base[s]["diverged"]]
    entry: dict[str, Any] = {
        "key": row.key, "label": row.label, "rule": row.rule, "state_format": row.state_format,
        "library": row.library, "lr": lr, "seeds": done, "n": len(done), "n_wanted": len(seeds),
        "diverged": sum(bool(recs[s]["diverged"]) for s in done),
        "valid_loss": [recs[s]["valid_loss"] for s in done],
        "runs": [_shown(run_path(out, row, lr, s, cfg)) for s in done],
        "run_environments": _run_environments([recs[s] for s in done]),
        **bytes_info,
    }
    if row.key == "adamw":
        entry["delta_pct"] = None
    elif len(pairs) >= 2:
        p = stats.paired([base[s]["valid_loss"] for s in pairs], [recs[s]["valid_loss"] for s in pairs], relative=True)
        entry["delta_pct"] = {"mean": 100 * p["mean"], "ci_low": 100 * p["ci_low"], "ci_high": 100 * p["ci_high"],
                              "std": 100 * p["std"], "n": p["n"], "per_seed": [100 * d for d in p["diffs"]],
                              "seeds": pairs}
    else:
        entry["delta_pct"] = None
    return entry


def _run_environments(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where a row's runs ran: each distinct (CPU, torch, bitsandbytes, torchao) with its run count."""
    seen: dict[tuple, int] = {}
    for r in recs:
        env = r.get("environment") or {}
        k = (env.get("cpu"), env.get("torch"), env.get("bitsandbytes"), env.get("torchao"))
        seen[k] = seen.get(k, 0) + 1
    return [{"cpu": k[0], "torch": k[1], "bitsandbytes": k[2], "torchao": k[3], "runs": n} for k, n in seen.items()]


def pareto(points: list[dict[str, Any]]) -> list[str]:
    """Keys of the points no other point beats on both axes (fewer bytes and lower mean Δ, one strictly)."""
    ok = [p for p in points if p.get("delta_pct") is not None or p["key"] == "adamw"]

    def y(p):
        return 0.0 if p["key"] == "adamw" else p["delta_pct"]["mean"]

    front = []
    for p in ok:
        if not any((y(q) <= y(p) and q["bytes_per_param"] <= p["bytes_per_param"])
                   and (y(q) < y(p) or q["bytes_per_param"] < p["bytes_per_param"]) for q in ok):
            front.append(p)
    return [p["key"] for p in sorted(front, key=lambda p: p["bytes_per_param"])]


def noise_floor(baseline: list[dict[str, Any]]) -> dict[str, Any]:
    losses = [r["valid_loss"] for r in baseline if not r["diverged"]]
    floor: dict[str, Any] = {}
    if len(losses) > 1:
        floor["seed_to_seed_relative_std_pct"] = 100 * statistics.stdev(losses) / statistics.fmean(losses)
    stored = ROOT / "adam8lib" / "course" / "results" / "convergence_lm.json"
    if stored.exists():
        nf = json.loads(stored.read_text()).get("noise_floor", {})
        for key in ("threads", "rerun"):
            if key in nf and "valid_loss" in nf[key]:
                v = nf[key]["valid_loss"]
                floor[key] = {"label": nf[key]["label"], "n": v["n"], "mean_pct": 100 * v["mean"],
                              "ci_pct": [100 * v["ci_low"], 100 * v["ci_high"]],
                              "max_abs_pct": 100 * max(abs(d) for d in v["diffs"])}
    return floor


BYTES_KEYS = ("bytes_per_param", "large_tensors_bytes_per_param", "small_tensors_bytes_per_param", "state_bytes",
              "parameters", "small_tensor_parameters", "state_tensors")


def measured_bytes(path: Path) -> dict[str, dict[str, Any]]:
    """The bytes already measured in a board file, per row key (``--remeasure`` measures them again)."""
    if not path.exists():
        return {}
    return {e["key"]: {k: e[k] for k in BYTES_KEYS} for e in json.loads(path.read_text()).get("rows", [])}


def summarize(out: Path = RESULTS, seeds=SEEDS, cfg=None, custom: list[tuple[R.Row, float]] = (),
              builtin: bool = True, remeasure: bool = False, fresh: tuple[str, ...] = (), log=print) -> dict[str, Any]:
    import board_bytes
    from convergence import environment

    cfg = cfg or config()
    base_row = R.ROWS["adamw"]
    baseline = [json.loads(run_path(out, base_row, R.ADAMW_LR, s, cfg).read_text()) for s in seeds
                if run_path(out, base_row, R.ADAMW_LR, s, cfg).exists()]
    rows: list[tuple[R.Row, float]] = [(base_row, R.ADAMW_LR)]
    sweeps = {}
    if builtin:
        for rule in R.RULES:
            sweeps[rule] = sweep_summary(rule, out, cfg)
        for key, row in R.ROWS.items():
            if key == "adamw":
                continue
            lr = R.ADAMW_LR if row.rule == "adamw" else (sweeps[row.rule] or {}).get("used_lr")
            if lr is not None and any(run_path(out, row, lr, s, cfg).exists() for s in seeds):
                rows.append((row, lr))
    rows += list(custom)
    entries = []
    known = {} if remeasure else measured_bytes(board_file(out, cfg))
    for row, lr in rows:
        info = None if row.key in fresh else known.get(row.key)
        if info is None:  # one step of the optimizer on the LM (torchao's compiles its step: minutes, once)
            info = board_bytes.measure(lambda g, c, row=row, lr=lr: row.make(g, c, lr), cfg, named=tag_names)
        entries.append(row_summary(row, lr, seeds, cfg, out, baseline, info))
    for e in entries:
        e["pareto"] = False
    front = pareto(entries)
    for e in entries:
        e["pareto"] = e["key"] in front
    return {
        "description": lm_task.describe(cfg), "seeds": list(seeds), "threads_per_run": THREADS,
        "baseline": "adamw", "metric": "relative difference in final validation loss vs fp32 AdamW on the same seed, %",
        "lr_rule": "per rule, the lr of SWEEP_LRS with the lowest mean final validation loss on seeds 100 and 101 with "
                   "fp32 states (a diverged run loses); AdamW keeps the LM benchmark's 2e-3",
        "sweep": sweeps, "rows": entries, "pareto": front, "noise_floor": noise_floor(baseline),
        "comparisons": sum(1 for e in entries if e.get("delta_pct")),
        "excluding_zero": [e["key"] for e in entries if e.get("delta_pct")
                           and (e["delta_pct"]["ci_low"] > 0 or e["delta_pct"]["ci_high"] < 0)],
        "reproducibility": (reproduce(0, log=lambda *_: None) if builtin and cfg == lm_task.LMConfig()
                            and (RESULTS / "runs" / "board" / f"repro-adamw-lr{R.ADAMW_LR:g}-t{THREADS}-s0.json").exists()
                            else None),
        "environment": environment([THREADS]),
    }


def board_file(out: Path, cfg) -> Path:
    return out / ("board.json" if tag_of(cfg) == "" else f"board-{tag_of(cfg).rstrip('-')}.json")


def stored_custom(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return json.loads(path.read_text()).get("custom", [])


def write(result: dict[str, Any], out: Path, cfg, custom_specs: list[dict[str, Any]], plot: bool = True,
          readme: bool = True, log=print) -> Path:
    import board_report

    result["custom"] = custom_specs
    result["within_rule"] = board_report.within_rule(result)
    path = board_file(out, cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {path}")
    if result.get("sweep"):
        sweep = path.with_name(path.stem + "_sweep.json")
        sweep.write_text(json.dumps({"seeds": list(R.SWEEP_SEEDS), "rule": result["lr_rule"],
                                     "max_extensions": MAX_EXTENSIONS, "sweeps": result["sweep"]}, indent=1) + "\n")
        log(f"wrote {sweep}")
    if plot:
        png = path.with_suffix(".png")
        board_report.plot(result, png)
        log(f"wrote {png}")
    log(board_report.table(result))
    if readme and out == RESULTS and tag_of(cfg) == "":
        from adam8lib.course import board as course_board

        COURSE_BOARD.write_text(json.dumps(course_board.compact(result, R.RULE_LABELS), indent=1) + "\n")
        log(f"wrote {COURSE_BOARD} (what lesson 13 shows)")
        board_report.write_readmes(result)
        log("wrote the board sections of README.md and bench/README.md")
    return path


# ---------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.board", description=__doc__.split("\n")[0])
    parser.add_argument("--report", action="store_true", help="no runs: summarize what is stored")
    parser.add_argument("--rows", nargs="+", choices=list(R.ROWS), help="run only these rows (and their sweeps)")
    parser.add_argument("--optimizer", help="package.module:Class, a torch optimizer to put on the board")
    parser.add_argument("--kwargs", help="JSON object of its keyword arguments (not lr)")
    parser.add_argument("--lr", type=float, help="its peak learning rate (default: the LM's 2e-3)")
    parser.add_argument("--label", help="its name on the board (default: the class path)")
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds (default 0-7)")
    parser.add_argument("--steps", type=int, help="a shorter run (a tiny check; its own board file)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory (default bench/results)")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--remeasure", action="store_true", help="measure the state bytes again (default: reuse "
                        "those of the board file for rows already in it)")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        parser.error(f"--lr must be a positive number, got {args.lr}")
    if args.seeds is not None and len(set(args.seeds)) < 2:
        parser.error("--seeds needs at least 2 different seeds (an interval needs two pairs)")
    if args.optimizer is None and (args.kwargs or args.label or args.lr):
        parser.error("--kwargs, --label and --lr describe an --optimizer: give --optimizer package.module:Class")
    seeds = tuple(args.seeds or SEEDS)
    cfg = config(args.steps)
    out = args.out.resolve()
    path = board_file(out, cfg)
    specs = stored_custom(path)
    if args.optimizer is not None:
        try:
            kwargs = parse_kwargs(args.kwargs)
            row = custom_row(args.optimizer, kwargs, args.label)
        except ValueError as exc:
            parser.error(str(exc))
        spec = {"optimizer": args.optimizer, "kwargs": kwargs, "lr": args.lr or R.ADAMW_LR, "label": row.label,
                "key": row.key}
        specs = [s for s in specs if s["key"] != row.key] + [spec]
        for seed in seeds:
            wait_for(R.ROWS["adamw"], R.ADAMW_LR, seed, cfg, out)
            wait_for(row, spec["lr"], seed, cfg, out)
    elif not args.report:
        run_plan(out, seeds, args.rows)
    custom = [(custom_row(s["optimizer"], s["kwargs"], s["label"]), s["lr"]) for s in specs]
    result = summarize(out, seeds, cfg, custom, builtin=tag_of(cfg) == "", remeasure=args.remeasure,
                       fresh=(row.key,) if args.optimizer is not None else ())
    write(result, out, cfg, specs, plot=not args.no_plot)
    return result


if __name__ == "__main__":
    main()
