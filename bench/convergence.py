"""Convergence evidence: does 8-bit Adam train as well as 32-bit AdamW? (the paper's Table 1, in miniature)

Fine-tunes the same small DistilBERT on the offline paraphrase task (``adam8lib.course.data``,
synpara) with three optimizers — ``torch.optim.AdamW`` (32-bit states), adam8lib's
``Adam8bit`` and bitsandbytes' ``Adam8bit`` — for several seeds each, with identical data
order, schedule, weight-decay groups and precision. Writes

* ``bench/results/convergence.json`` — every run (loss curve, eval metrics, time) and the
  mean ± std per optimizer (read by lesson 10);
* ``bench/convergence.png`` — loss curves (mean over seeds) and final accuracy.

Run: ``python bench/convergence.py`` (≈10 min on 2 CPU cores; ``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adam8lib.course import data as D  # noqa: E402
from adam8lib import training as T  # noqa: E402

OPTIMIZERS = {"adamw": "torch AdamW (32-bit)", "adam8bit": "adam8lib Adam8bit", "bnb8bit": "bitsandbytes Adam8bit"}
TARGET_POINTS = 0.5  # adam8lib 8-bit within this many accuracy points of AdamW


def run_one(kind: str, seed: int, data, tok, args) -> dict:
    model = F.build_distilbert(small=True, seed=seed, vocab_size=len(tok), max_position_embeddings=64)
    train, valid = F.make_dataloaders(data, tok, batch_size=args.batch_size, seed=seed)
    opt = T.make_optimizer(model, kind, lr=args.lr, weight_decay=args.weight_decay)
    start = time.perf_counter()
    hist = F.train_with_accelerate(model, opt, train, valid, epochs=args.epochs, precision=args.precision,
                                   warmup_ratio=args.warmup, progress=not args.no_progress)
    seconds = time.perf_counter() - start
    last = hist["eval"][-1]
    return {
        "optimizer": kind, "seed": seed, "accuracy": last["accuracy"], "f1": last["f1"], "eval_loss": last["loss"],
        "eval_per_epoch": hist["eval"], "loss": hist["loss"], "seconds": seconds,
    }


def summarize(runs: list[dict]) -> dict:
    out = {}
    for kind in OPTIMIZERS:
        rs = [r for r in runs if r["optimizer"] == kind]
        if not rs:
            continue
        entry = {"label": OPTIMIZERS[kind], "seeds": [r["seed"] for r in rs]}
        for key in ("accuracy", "f1", "eval_loss", "seconds"):
            vals = [r[key] for r in rs]
            entry[f"{key}_mean"] = statistics.fmean(vals)
            entry[f"{key}_std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
        out[kind] = entry
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    window = 20
    for kind, entry in result["summary"].items():
        curves = torch.tensor([r["loss"] for r in result["runs"] if r["optimizer"] == kind])
        mean = curves.mean(0)
        smooth = torch.nn.functional.avg_pool1d(mean[None, None], window, 1).flatten()
        steps = torch.arange(len(smooth)) + window
        ax.plot(steps, smooth, label=entry["label"])
    ax.set(xlabel="step", ylabel=f"training loss (mean of seeds, {window}-step average)",
           title=f"synpara, small DistilBERT, {result['settings']['precision']} autocast")
    ax.legend()
    labels = [e["label"].replace(" ", "\n", 1) for e in result["summary"].values()]
    means = [100 * e["accuracy_mean"] for e in result["summary"].values()]
    stds = [100 * e["accuracy_std"] for e in result["summary"].values()]
    bx.bar(labels, means, yerr=stds, capsize=6, color=["C0", "C1", "C2"][: len(means)])
    lo = min(m - s for m, s in zip(means, stds))
    bx.set(ylim=(max(0, lo - 5), 100), ylabel="validation accuracy (%)", title=f"mean ± std, {len(result['settings']['seeds'])} seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=list(OPTIMIZERS))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--warmup", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--precision", default="bf16", choices=T.PRECISIONS)
    parser.add_argument("--train-size", type=int, default=None, help="use the first N training pairs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "convergence.json")
    parser.add_argument("--plot", type=Path, default=ROOT / "bench" / "convergence.png")
    parser.add_argument("--quick", action="store_true", help="1 seed, 1 epoch, 512 pairs: a smoke run (writes nothing)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.epochs, args.train_size = [0], 1, 512

    data, tok, name = D.load_task("offline")
    if args.train_size:
        data["train"] = data["train"].select(range(args.train_size))
    runs = []
    for kind in args.optimizers:
        for seed in args.seeds:
            r = run_one(kind, seed, data, tok, args)
            print(f"{kind:9s} seed {seed}: accuracy {100 * r['accuracy']:.2f}  F1 {100 * r['f1']:.2f}  "
                  f"eval loss {r['eval_loss']:.4f}  ({r['seconds']:.0f} s)", flush=True)
            runs.append(r)
    summary = summarize(runs)
    result = {
        "task": name, "train_pairs": len(data["train"]), "validation_pairs": len(data["validation"]),
        "model": {"config": "build_distilbert(small=True, vocab_size=len(tokenizer), max_position_embeddings=64)",
                  "parameters": sum(p.numel() for p in F.build_distilbert(small=True, vocab_size=len(tok),
                                                                         max_position_embeddings=64).parameters())},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                     if k not in ("out", "plot", "no_progress")},
        "environment": {"torch": torch.__version__, "python": platform.python_version(),
                        "bitsandbytes": _version("bitsandbytes"), "threads": torch.get_num_threads(),
                        "machine": platform.machine()},
        "summary": summary,
        "runs": runs,
    }
    if "adamw" in summary and "adam8bit" in summary:
        gap = 100 * (summary["adam8bit"]["accuracy_mean"] - summary["adamw"]["accuracy_mean"])
        result["adam8bit_minus_adamw_accuracy_points"] = gap
        result["target_points"] = TARGET_POINTS
        result["target_met"] = abs(gap) <= TARGET_POINTS or gap > 0
    for kind, e in summary.items():
        print(f"{e['label']:24s} accuracy {100 * e['accuracy_mean']:.2f} ± {100 * e['accuracy_std']:.2f}   "
              f"F1 {100 * e['f1_mean']:.2f} ± {100 * e['f1_std']:.2f}   {e['seconds_mean']:.0f} s/run")
    if "adam8bit_minus_adamw_accuracy_points" in result:
        print(f"adam8lib Adam8bit - AdamW: {result['adam8bit_minus_adamw_accuracy_points']:+.2f} accuracy points "
              f"(target: within {TARGET_POINTS})")
    if not args.quick:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        plot(result, args.plot)
        print(f"wrote {args.out.relative_to(ROOT)} and {args.plot.relative_to(ROOT)}")
    return result


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
