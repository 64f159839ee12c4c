"""Convergence evidence: does 8-bit Adam train as well as 32-bit AdamW? (the paper's Tables 1 and 3, in miniature)

Three experiments, each a set of runs paired by seed (the seed fixes the initial weights and
the data order, the same for every optimizer):

* ``lm``: a byte-level GPT-2-style LM trained from scratch on the Python standard library's
  source (``bench/lm_task.py``), validation loss; optimizers ``torch.optim.AdamW``, adam8lib
  ``Adam8bit``, bitsandbytes ``Adam8bit`` and torchao ``AdamW8bit``; plus the noise floor
  (AdamW again with another thread count).
* ``cls``: the lesson-10 fine-tune (synpara, small DistilBERT, ``bench/cls_task.py``),
  validation accuracy / F1 / loss; AdamW, adam8lib and bitsandbytes.
* ``beyond``: the LM beyond 8 bits (lesson 12): adam8lib's 4-bit states, its naive 4-bit ablation
  (v on a map with 0), FP8 states, bf16 weights with stochastic rounding or round-to-nearest (with
  8-bit states), against fp32 AdamW and adam8lib 8-bit, with torchao's ``AdamW4bit`` and
  ``AdamWFp8`` and bitsandbytes 8-bit as anchors (the LM's own runs are shared, not repeated).
* ``bill``: the LM with the whole bill's rows (lesson 14): gradient release (``adam8lib.release_gradients``,
  global-norm clipping in two backward passes) with bf16 + stochastic rounding and 8-bit states (which
  must be the ``bf16_sr_8bit`` runs to the bit: the check, not new evidence) or 4-bit states, and a
  24-bit compressed master (``adam8lib.CompressedMasterWeights``, bits=8) with 4-bit states; against
  fp32 AdamW, and the rows without an fp32 master against the ones that keep one.
* ``ablation``: the LM (at its own learning rate) with adam8lib's teaching variants
  (``adam8lib.variants.Adam8bitVariant``): linear map with one scale per tensor, dynamic map
  with one scale per tensor, blockwise dynamic (= ``Adam8bit``), and 32-bit AdamW.

Each run is cached as JSON under ``bench/results/runs/`` (re-running skips finished runs;
``--fresh`` re-runs them); the summaries, with paired mean differences and 95 % confidence
intervals (``bench/stats.py``), are written to ``adam8lib/course/results/`` (shipped in the
package, read by lesson 10), plots to ``bench/results/``, tables to ``bench/README.md``.

Run (one torch thread per run, ``--jobs`` runs at once, under ``nice``)::

    python bench/convergence.py lm          # ~8 seeds x 4 optimizers + noise floor
    python bench/convergence.py cls         # 10 seeds x 4 optimizers
    python bench/convergence.py ablation    # 6 variants x 8 seeds
    python bench/convergence.py bill        # 3 release / master rows x 8 seeds (+ the runs above)
    python bench/convergence.py beyond      # 10 optimizers x 8 seeds (needs torchao: pip install -e .[bench])
    python bench/convergence.py report      # tables + plots from the stored results
    python bench/convergence.py lm --quick  # smoke run: tiny config, 2 seeds, writes nothing
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))

import stats  # noqa: E402

RUNS = BENCH / "results" / "runs"
PACKAGED = ROOT / "adam8lib" / "course" / "results"
FILES = {"lm": "convergence_lm.json", "cls": "convergence_cls.json", "ablation": "ablation.json",
         "beyond": "beyond_8_bits.json", "bill": "whole_bill_lm.json"}

#: name -> label. Factories are in :func:`make_optimizer`.
LABELS = {
    "adamw": "torch AdamW (32-bit)",
    "adamw_fused": "torch AdamW, fused=True (32-bit; other rounding)",
    "adam8bit": "adam8lib Adam8bit",
    "adamw8bit": "adam8lib AdamW8bit",
    "bnb8bit": "bitsandbytes Adam8bit",
    "torchao8bit": "torchao AdamW8bit",
    "adam8bit_bnbround": "adam8lib Adam8bit, requantized by bitsandbytes' CPU quantizer",
    "adam8bit_nokeep": "adam8lib Adam8bit, plain nearest code (signs not kept)",
    "linear_tensor": "8-bit, linear map, one scale per tensor",
    "linear_tensor_nokeep": "8-bit, linear map, one scale per tensor, signs not kept (the paper's)",
    "linear_block_nokeep": "8-bit, linear map, blockwise, signs not kept",
    "dynamic_tensor": "8-bit, dynamic map, one scale per tensor",
    "dynamic_block": "8-bit, dynamic map, blockwise (adam8lib Adam8bit)",
    "adam4bit": "adam8lib Adam4bit (4-bit states; v: zero-free map, rank-1)",
    "adam4bit_naive": "adam8lib 4-bit, v on a map with 0 (the zero-point ablation)",
    "adamfp8": "adam8lib AdamFp8 (e4m3 states, blocks of 256)",
    "bf16_sr_8bit": "bf16 weights + stochastic rounding, adam8lib 8-bit states",
    "bf16_rne_8bit": "bf16 weights + round-to-nearest, adam8lib 8-bit states (the ablation)",
    "torchao4bit": "torchao AdamW4bit",
    "torchaofp8": "torchao AdamWFp8",
    "bf16_sr_8bit_release": "bf16 weights + stochastic rounding, 8-bit states, gradient release",
    "bf16_sr_4bit_release": "bf16 weights + stochastic rounding, 4-bit states, gradient release",
    "master24_4bit_release": "24-bit master (bf16 + 8-bit correction), 4-bit states, gradient release",
    "master32_4bit_release": "exact fp32 master (bf16 + 16-bit correction), 4-bit states, gradient release",
}
#: Kinds that step inside backward (``adam8lib.release_gradients``; clipping in two backward passes).
RELEASE = ("bf16_sr_8bit_release", "bf16_sr_4bit_release", "master24_4bit_release", "master32_4bit_release")
#: Kinds that train bf16 weights (the model is cast when its optimizer is made).
BF16_WEIGHTS = ("bf16_sr_8bit", "bf16_rne_8bit", "bf16_sr_8bit_release", "bf16_sr_4bit_release")
#: The root-cause rows: adam8lib's step with another rounding rule, compared with both libraries.
ROOT_CAUSE = ("adam8bit_bnbround", "adam8bit_nokeep")
DEFAULTS = {
    "lm": {"optimizers": ["adamw", "adam8bit", "adamw8bit", "bnb8bit", "torchao8bit", *ROOT_CAUSE],
           "seeds": list(range(8))},
    "cls": {"optimizers": ["adamw", "adam8bit", "adamw8bit", "bnb8bit"], "seeds": list(range(10))},
    "ablation": {"optimizers": ["adamw", "dynamic_block", "dynamic_tensor", "linear_tensor", "linear_tensor_nokeep",
                              "linear_block_nokeep"], "seeds": list(range(8))},
    "beyond": {"optimizers": ["adamw", "adam8bit", "adam4bit", "adam4bit_naive", "adamfp8", "bf16_sr_8bit",
                              "bf16_rne_8bit", "torchao4bit", "torchaofp8", "bnb8bit"], "seeds": list(range(8))},
    "bill": {"optimizers": ["adamw", "adam8bit", "adam4bit", "bf16_sr_8bit", *RELEASE], "seeds": list(range(8))},
}
#: The bill's fp32-weight rows: the LM's own runs (fp32 arithmetic reproduces across CPUs to ~1e-5).
FP32_SHARED = ("adamw", "adam8bit", "adam4bit")
#: The bill's pairs (ours, other): release against the same step without it (bit for bit), and the rows
#: that keep no fp32 master (or a 24-bit one) against the fp32-weight rows with the same states.
BILL_PAIRS = (("bf16_sr_8bit_release", "bf16_sr_8bit"), ("bf16_sr_8bit_release", "adam8bit"),
              ("bf16_sr_4bit_release", "adam4bit"), ("master24_4bit_release", "adam4bit"),
              ("bf16_sr_4bit_release", "master24_4bit_release"),
              # dropping the master with the compute held equal: every row computes in bf16, the last keeps the
              # exact fp32 master (a 16-bit correction) and steps it as the fp32-weight runs do
              ("bf16_sr_4bit_release", "master32_4bit_release"), ("master24_4bit_release", "master32_4bit_release"))


# ---------------------------------------------------------------------- optimizers
def make_optimizer(kind: str, groups: list[dict[str, Any]], lr: float, betas: tuple[float, float]):
    """The optimizer ``kind`` over ``groups`` (each group carries its weight decay)."""
    import torch

    if kind in BF16_WEIGHTS:  # pure bf16 training: the weights themselves become bf16
        for group in groups:
            for p in group["params"]:
                p.data = p.data.to(torch.bfloat16)
        from adam8lib import Adam8bit

        if kind == "bf16_sr_4bit_release":
            from adam8lib.optim import LowBitAdam

            return LowBitAdam(groups, lr=lr, betas=betas, state_format="4bit", stochastic_rounding=True)
        return Adam8bit(groups, lr=lr, betas=betas, stochastic_rounding=kind in ("bf16_sr_8bit", "bf16_sr_8bit_release"))
    if kind in ("master24_4bit_release", "master32_4bit_release"):  # fp32 weights split into bf16 + a correction
        from adam8lib import CompressedMasterWeights
        from adam8lib.optim import LowBitAdam

        opt = LowBitAdam(groups, lr=lr, betas=betas, state_format="4bit")
        bits = 8 if kind == "master24_4bit_release" else 16
        opt.compressed_master = CompressedMasterWeights([p for g in groups for p in g["params"]], opt, bits=bits)
        return opt
    if kind in ("adam4bit", "adam4bit_naive", "adamfp8"):
        from adam8lib.optim import LowBitAdam

        state_format = {"adam4bit": "4bit", "adam4bit_naive": "4bit-naive", "adamfp8": "fp8"}[kind]
        return LowBitAdam(groups, lr=lr, betas=betas, state_format=state_format)
    if kind in ("torchao4bit", "torchaofp8"):
        from torchao.optim import AdamW4bit, AdamWFp8

        return (AdamW4bit if kind == "torchao4bit" else AdamWFp8)(groups, lr=lr, betas=betas)
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=betas)
    if kind == "adamw_fused":  # the same maths in one fused kernel: a few last-bit differences per step
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
    if kind in ("adam8bit", "adamw8bit", "dynamic_block"):
        from adam8lib import Adam8bit, AdamW8bit

        cls = AdamW8bit if kind == "adamw8bit" else Adam8bit
        return cls(groups, lr=lr, betas=betas)  # backend "auto": the compiled CPU kernel where it builds
    if kind in ("linear_tensor", "dynamic_tensor", "linear_tensor_nokeep", "linear_block_nokeep", "adam8bit_nokeep"):
        from adam8lib.variants import Adam8bitVariant

        quantization = "dynamic" if kind == "adam8bit_nokeep" else kind.split("_")[0]
        return Adam8bitVariant(groups, lr=lr, betas=betas, quantization=quantization,
                               blockwise="tensor" not in kind, keep_sign="nokeep" not in kind)
    if kind == "adam8bit_bnbround":
        from bnb_rounding import Adam8bitBnbRounding

        return Adam8bitBnbRounding(groups, lr=lr, betas=betas)
    if kind == "bnb8bit":
        import bitsandbytes as bnb

        return bnb.optim.Adam8bit(groups, lr=lr, betas=betas)
    if kind == "torchao8bit":
        from torchao.optim import AdamW8bit

        return AdamW8bit(groups, lr=lr, betas=betas)
    raise ValueError(f"unknown optimizer {kind!r}; choose from {list(LABELS)}")


# ---------------------------------------------------------------------- one run / a shard of runs
def task_config(task: str, overrides: dict[str, Any] | None = None):
    import cls_task
    import lm_task

    cfg = lm_task.LMConfig() if task in ("lm", "ablation", "beyond", "bill") else cls_task.ClsConfig()
    if task == "ablation":
        cfg = replace(cfg, lr=ABLATION_LR)
    return replace(cfg, **(overrides or {}))


#: The ablation's learning rate: the LM's own (2e-3), where the linear map without the
#: keep-sign rule already diverges (so do its runs at 1e-2); with the rule, nothing diverged at
#: either rate. At this rate the ablation's AdamW and blockwise runs are the LM's.
ABLATION_LR = 2e-3


def run_path(task: str, kind: str, seed: int, threads: int, cfg) -> Path:
    """Where a run is stored. An ablation run at the LM's own configuration *is* an LM run
    (``dynamic_block`` is ``Adam8bit``: the ``adam8bit`` run), so it is stored with those."""
    tag = "quick-" if getattr(cfg, "steps", 0) and cfg.steps < 50 else ""
    if task == "bill" and kind not in FP32_SHARED:
        # bf16 arithmetic differs between CPUs: the bill's bf16 rows (bf16_sr_8bit re-run too) are run
        # on one machine, so that release can be compared with the ordinary step bit for bit
        return RUNS / task / f"{tag}{kind}-lr{cfg.lr:g}-t{threads}-s{seed}.json"
    if task in ("ablation", "beyond", "bill") and cfg == task_config("lm"):
        task, kind = "lm", {"dynamic_block": "adam8bit"}.get(kind, kind)
    return RUNS / task / f"{tag}{kind}-lr{cfg.lr:g}-t{threads}-s{seed}.json"


def run_one(task: str, kind: str, seed: int, threads: int, cfg) -> dict[str, Any]:
    import cls_task
    import lm_task

    def factory(groups, c):
        return make_optimizer(kind, groups, c.lr, tuple(c.betas))

    if task in ("lm", "ablation", "beyond", "bill"):
        record = lm_task.run(factory, seed, cfg, threads=threads, eval_every=50, release=kind in RELEASE)
    else:
        record = cls_task.run(factory, seed, cfg, threads=threads)
    record.update(optimizer=kind, task=task, config=asdict(cfg))
    return record


def _shard(spec_file: str) -> None:
    """Worker process: run every spec in the file, writing each record to its path."""
    specs = json.loads(Path(spec_file).read_text())
    for spec in specs:
        cfg = task_config(spec["task"], spec["overrides"])
        start = time.perf_counter()
        record = run_one(spec["task"], spec["kind"], spec["seed"], spec["threads"], cfg)
        record["environment"] = environment([spec["threads"]])  # versions, CPU, load: with each run
        path = Path(spec["path"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record) + "\n")
        metric = (f"valid loss {record['valid_loss']:.4f}" if "accuracy" not in record
                  else f"accuracy {100 * record['accuracy']:.1f}  loss {record['valid_loss']:.4f}")
        print(f"{spec['task']:8s} {spec['kind']:14s} seed {spec['seed']} threads {spec['threads']}: {metric}"
              f"  ({time.perf_counter() - start:.0f} s)", flush=True)


def execute(specs: list[dict[str, Any]], jobs: int, nice: int) -> None:
    """Run the specs in ``jobs`` worker processes (each a shard, under ``nice``)."""
    if not specs:
        return
    tmp = RUNS / "_specs"
    tmp.mkdir(parents=True, exist_ok=True)
    # a thread-count-2 run occupies both cores: keep those in one shard of their own
    single = [s for s in specs if s["threads"] == 1]
    multi = [s for s in specs if s["threads"] > 1]
    shards = [single[i::jobs] for i in range(jobs)] if single else []
    files = []
    for i, shard in enumerate(s for s in shards if s):
        f = tmp / f"shard{os.getpid()}-{i}.json"
        f.write_text(json.dumps(shard))
        files.append(f)

    def launch(f: Path) -> int:
        cmd = ["nice", "-n", str(nice), sys.executable, str(Path(__file__).resolve()), "_shard", str(f)]
        # OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep instead of spinning (a 2-thread run on
        # a shared or single core is otherwise many times slower); it changes no number
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_WAIT_POLICY": "PASSIVE"}
        return subprocess.run(cmd, env=env).returncode

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        codes = list(pool.map(launch, files))
    if multi:
        f = tmp / f"shard{os.getpid()}-multi.json"
        f.write_text(json.dumps(multi))
        codes.append(launch(f))
    if any(codes):
        raise SystemExit(f"a worker failed (exit codes {codes})")


# ---------------------------------------------------------------------- summaries
def environment(threads: list[int]) -> dict[str, Any]:
    from importlib import metadata

    import torch

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    cpu = "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "python": platform.python_version(), "torch": torch.__version__, "transformers": version("transformers"),
        "bitsandbytes": version("bitsandbytes"), "torchao": version("torchao"), "adam8lib": version("adam8lib"),
        "threads_per_run": sorted(set(threads)), "cpu": cpu, "cores": os.cpu_count(), "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%d"), "load_average_1min_at_end": os.getloadavg()[0],
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "cpus_allowed": sorted(os.sched_getaffinity(0)),
    }


def _metrics(task: str) -> list[tuple[str, bool]]:
    """(metric, compare relatively?) per task."""
    if task == "cls":
        return [("accuracy", False), ("f1", False), ("valid_loss", True)]
    return [("valid_loss", True)]


def _curve_band(rs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Validation loss per evaluation step: mean over seeds and its 95 % t-interval
    (only the steps every seed reached; a diverged run stops its curve)."""
    curves = [dict((int(s), v) for s, v in r["valid_curve"]) for r in rs]
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    band: dict[str, list[float]] = {"steps": steps, "mean": [], "ci_low": [], "ci_high": []}
    for step in steps:
        ci = stats.mean_ci([c[step] for c in curves]) if len(curves) > 1 else None
        for key in ("mean", "ci_low", "ci_high"):
            band[key].append(ci[key] if ci else curves[0][step])
    return band


def _thin(record: dict[str, Any], every: int = 5) -> dict[str, Any]:
    out = dict(record)
    out["loss"] = [round(x, 5) for x in record["loss"][::every]]
    out["loss_every"] = every
    return out


def _same_runs(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[bool]:
    """Per seed: the same run to the bit (the same final loss and the same training-loss curve)."""
    return [x["valid_loss"] == y["valid_loss"] and x["loss"] == y["loss"] for x, y in zip(a, b)]


def summarize(task: str, records: list[dict[str, Any]], optimizers: list[str], seeds: list[int],
              cfg, noise_seeds: list[int] = (), noise_threads: dict[str, Any] | None = None) -> dict[str, Any]:
    import cls_task
    import lm_task

    by = {(r["optimizer"], r["seed"], r["threads"]): r for r in records}
    per_opt: dict[str, Any] = {}
    for kind in optimizers:
        rs = [by[(kind, s, 1)] for s in seeds]
        entry: dict[str, Any] = {"label": LABELS[kind], "n": len(rs), "seconds_mean": statistics.fmean(r["seconds"] for r in rs)}
        for metric, _ in _metrics(task):
            vals = [r[metric] for r in rs]
            # a diverged run's loss (non-finite, or finite but above ln 256) is counted, not averaged
            finite = [v for v, r in zip(vals, rs) if math.isfinite(v) and not r.get("diverged")]
            entry[metric] = {"per_seed": vals, "mean": statistics.fmean(finite) if finite else float("nan"),
                             "std": statistics.stdev(finite) if len(finite) > 1 else 0.0}
        if task != "cls":
            entry["spikes"] = [r["spikes"] for r in rs]
            entry["diverged"] = sum(bool(r["diverged"]) for r in rs)
            entry["curve"] = _curve_band([r for r in rs if not r["diverged"]])  # diverged runs: no curve
        per_opt[kind] = entry

    def compare(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
        """Paired differences over the seeds where neither run diverged (a CI needs two)."""
        out = {}
        pairs = [(ra, rb) for ra, rb in zip(a, b) if not ra.get("diverged") and not rb.get("diverged")]
        for metric, relative in _metrics(task):
            x, y = [ra[metric] for ra, _ in pairs], [rb[metric] for _, rb in pairs]
            if len(x) > 1 and all(math.isfinite(v) for v in x + y):
                out[metric] = stats.paired(x, y, relative=relative)
                out[metric]["excluded_diverged"] = len(a) - len(pairs)
        return out

    base = [by[("adamw", s, 1)] for s in seeds] if "adamw" in optimizers else None
    paired_vs_adamw = {k: compare(base, [by[(k, s, 1)] for s in seeds]) for k in optimizers if k != "adamw" and base}
    result: dict[str, Any] = {
        "experiment": task,
        "description": (lm_task.describe(cfg) if task != "cls" else cls_task.describe(cfg)),
        "seeds": seeds, "optimizers": per_opt, "paired_vs_adamw": paired_vs_adamw,
    }
    if "adam8bit" in optimizers and "bnb8bit" in optimizers:
        result["adam8bit_vs_bnb8bit"] = compare([by[("bnb8bit", s, 1)] for s in seeds],
                                                [by[("adam8bit", s, 1)] for s in seeds])
    if base and len(seeds) > 1:
        result["noise_floor"] = {"seed_to_seed_std": {m: per_opt["adamw"][m]["std"] for m, _ in _metrics(task)}}
        if task != "cls":
            m = per_opt["adamw"]["valid_loss"]
            result["noise_floor"]["seed_to_seed_relative_std"] = m["std"] / m["mean"]
        if len(noise_seeds) > 1:
            one = [by[("adamw", s, 1)] for s in noise_seeds]
            other = [by[("adamw_fused", s, 1)] for s in noise_seeds]
            result["noise_floor"]["rerun"] = {"label": LABELS["adamw_fused"], "seeds": list(noise_seeds),
                                              **compare(one, other)}
        if noise_threads and len(noise_threads["seeds"]) > 1:
            t, ns = noise_threads["threads"], noise_threads["seeds"]
            one = [by[("adamw", s, 1)] for s in ns]
            other = [by[("adamw", s, t)] for s in ns]
            result["noise_floor"]["threads"] = {
                "label": f"torch AdamW with {t} torch threads", "threads": t, "seeds": list(ns),
                "bit_identical": _same_runs(one, other),
                **compare(one, other)}
    if task == "beyond":  # each fix against its ablation, and each adam8lib format against its torchao anchor
        pairs = {}
        for ours, other in (("adam4bit", "adam4bit_naive"), ("bf16_sr_8bit", "bf16_rne_8bit"),
                            ("adam4bit", "torchao4bit"), ("adamfp8", "torchaofp8"), ("bf16_sr_8bit", "adam8bit")):
            if ours in optimizers and other in optimizers:
                pairs[f"{ours}_vs_{other}"] = {"label": f"{LABELS[ours]} vs {LABELS[other]}",
                                               **compare([by[(other, s, 1)] for s in seeds],
                                                         [by[(ours, s, 1)] for s in seeds])}
        result["pairs"] = pairs
    if task == "bill":  # release vs the same step without it (must be identical), and master vs none
        pairs = {}
        for ours, other in BILL_PAIRS:
            if ours in optimizers and other in optimizers:
                a, b = [by[(other, s, 1)] for s in seeds], [by[(ours, s, 1)] for s in seeds]
                pairs[f"{ours}_vs_{other}"] = {"label": f"{LABELS[ours]} vs {LABELS[other]}", **compare(a, b),
                                               "bit_identical": _same_runs(a, b)}
        result["pairs"] = pairs
    if task == "lm":
        root = {}
        for kind in ROOT_CAUSE:
            if kind in optimizers and "bnb8bit" in optimizers and "adam8bit" in optimizers:
                runs = [by[(kind, s, 1)] for s in seeds]
                root[kind] = {"label": LABELS[kind]}
                for other in ("bnb8bit", "adam8bit"):
                    ref = [by[(other, s, 1)] for s in seeds]
                    root[kind][f"vs_{other}"] = compare(ref, runs)
                    root[kind][f"identical_to_{other}"] = _same_runs(ref, runs)
        if root:
            result["root_cause"] = root
    result["environment"] = environment([r["threads"] for r in records])
    result["runs"] = [_thin(r) for r in records]
    return result


# ---------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_shard"]:
        _shard(argv[1])
        return None
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("experiment", choices=["lm", "cls", "ablation", "beyond", "bill", "report"])
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--optimizers", nargs="+", choices=list(LABELS))
    parser.add_argument("--lr", type=float, help="override the task's learning rate")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (each one torch thread)")
    parser.add_argument("--nice", type=int, default=5)
    parser.add_argument("--noise-seeds", type=int, default=4,
                        help="the noise floor: AdamW again with fused=True (last-bit differences) on this many seeds")
    parser.add_argument("--noise-threads", type=int, nargs=2, metavar=("THREADS", "SEEDS"), default=(2, 4),
                        help="the noise floor: AdamW again with THREADS torch threads on the first SEEDS seeds "
                             "(SEEDS 0: skip)")
    parser.add_argument("--fresh", action="store_true", help="re-run runs that are already stored")
    parser.add_argument("--quick", action="store_true", help="tiny config, 2 seeds, in-process; writes nothing")
    args = parser.parse_args(argv)
    if args.experiment == "report":
        import report

        report.main()
        return None
    task = args.experiment
    optimizers = args.optimizers or DEFAULTS[task]["optimizers"]
    seeds = args.seeds or DEFAULTS[task]["seeds"]
    overrides: dict[str, Any] = {} if args.lr is None else {"lr": args.lr}
    noise = task == "lm" and "adamw" in optimizers and args.noise_seeds > 1
    if args.quick:
        overrides.update({"steps": 20, "eval_windows": 8} if task != "cls" else {"train_pairs": 256, "epochs": 1})
        seeds = seeds[:2]
    cfg = task_config(task, overrides)
    noise_seeds = seeds[: args.noise_seeds] if noise else []
    threads_n, threads_seeds = args.noise_threads
    noise_threads = ({"threads": threads_n, "seeds": seeds[:threads_seeds]}
                     if task == "lm" and "adamw" in optimizers and threads_seeds > 1 and threads_n != 1 else None)
    # seed by seed, so that an interrupted experiment leaves complete pairs behind
    wanted = [(k, s, 1) for s in seeds for k in optimizers] + [("adamw_fused", s, 1) for s in noise_seeds]
    if noise_threads:
        wanted += [("adamw", s, threads_n) for s in noise_threads["seeds"]]
    if args.quick:
        records = [run_one(task, k, s, t, cfg) for k, s, t in wanted]
    else:
        specs = []
        for k, s, t in wanted:
            path = run_path(task, k, s, t, cfg)
            if args.fresh or not path.exists():
                specs.append({"task": task, "kind": k, "seed": s, "threads": t, "overrides": overrides, "path": str(path)})
        print(f"{task}: {len(wanted)} runs, {len(specs)} to do, {args.jobs} at once", flush=True)
        execute(specs, args.jobs, args.nice)
        # (named as asked: an ablation's dynamic_block run may be stored as the LM's adam8bit run)
        records = [{**json.loads(run_path(task, k, s, t, cfg).read_text()), "optimizer": k, "threads": t}
                   for k, s, t in wanted]
    result = summarize(task, records, optimizers, seeds, cfg, noise_seeds, noise_threads)
    import report

    print(report.text_summary(result))
    if not args.quick:
        PACKAGED.mkdir(parents=True, exist_ok=True)
        out = PACKAGED / FILES[task]
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")
    return result


if __name__ == "__main__":
    main()
