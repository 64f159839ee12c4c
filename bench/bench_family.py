"""Side-by-side CPU benchmark of the 8-bit family's fused steps (issue 35; writes the "CPU: the 8-bit
family" section of bench/README.md).

    python bench/bench_family.py            # full run: 16,777,216 parameters, DistilBERT's state bytes
    python bench/bench_family.py --quick    # smoke run: tiny sizes, prints the tables, writes nothing

**Step time.** One fp32 parameter tensor of N elements with a fixed random gradient, 2 threads (``--threads``). For
each rule, three optimizers on copies of the same parameter, stepped round-robin (one step of each in
turn, after two warm-up steps): adam8lib's 8-bit class running its fused C++ step (the rule template,
``adam8lib/kernels/cpu_rules.py``), bitsandbytes 0.50.2's class of the same name on the CPU, and the
same rule with fp32 states (adam8lib's class with ``state_format="fp32"``: the reference step in
torch ops, the 32-bit baseline). Reported: each one's median step time, and the per-round ratios to
the fused step (median and a 95 % interval of the median, :func:`stats.median_and_ci`).

The 8-bit class is built with ``backend="cpu"`` (what ``"auto"`` picks on the CPU): its quantized
parameters take the fused step the one registry has for its rule and format
(:func:`adam8lib.kernels.find_step`); a class whose rule has none is refused, not silently timed on
the reference step.

**State bytes per parameter.** DistilBERT for sequence classification built from its config (65,783,042
parameters, no download), every class of the family (and Adam8bit, torch's AdamW) on all its
parameters, one step with zero gradients, then the bytes of the states as allocated
(:func:`adam8lib.memory.compute_optimizer_size`) divided by the parameter count. Tensors under
``min_8bit_size`` (4096) keep fp32 states, as in bitsandbytes.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
import warnings
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from readme_section import write_section  # noqa: E402
from stats import median_and_ci  # noqa: E402

START, END = "<!-- bench_family:start -->", "<!-- bench_family:end -->"
THREADS = 2
N = 1 << 24
MiB = 2**20


def _bnb():
    warnings.filterwarnings("ignore", message=".*bitsandbytes.*")
    import bitsandbytes as bnb

    return bnb


def contenders():
    """name -> (adam8lib 8-bit class, bitsandbytes class, hyper-parameters, bitsandbytes' extra arguments)."""
    from adam8lib import family

    bnb = _bnb()
    return {
        "Lion8bit": (family.Lion8bit, bnb.optim.Lion8bit, dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.01), {}),
        "AdEMAMix8bit": (family.AdEMAMix8bit, bnb.optim.AdEMAMix8bit,
                         dict(lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-8,
                              weight_decay=0.01), {}),
        "RMSprop8bit": (family.RMSprop8bit, bnb.optim.RMSprop8bit, dict(lr=1e-3, alpha=0.99, eps=1e-8,
                                                                         weight_decay=0.0), {}),
        "Adagrad8bit": (family.Adagrad8bit, bnb.optim.Adagrad8bit, dict(lr=1e-2, eps=1e-10, weight_decay=0.0), {}),
    }


def race(n: int, rounds: int, progress=print) -> dict:
    """Round-robin step times of the fused step, bitsandbytes' and the fp32-state rule, per rule."""
    gen = torch.Generator().manual_seed(0)
    p0 = torch.randn(n, generator=gen) * 0.1
    g0 = torch.randn(n, generator=gen) * 1e-2
    out = {}
    for name, (ours_cls, bnb_cls, hyper, bnb_extra) in contenders().items():
        params = {k: torch.nn.Parameter(p0.clone()) for k in ("fused", "bitsandbytes", "fp32 states")}
        for p in params.values():
            p.grad = g0.clone()
        opts = {"fused": ours_cls([params["fused"]], **hyper, backend="cpu"),
                "bitsandbytes": bnb_cls([params["bitsandbytes"]], **hyper, **bnb_extra),
                "fp32 states": ours_cls([params["fp32 states"]], **hyper, state_format="fp32")}
        for opt in opts.values():
            for _ in range(2):
                opt.step()
        times = {k: [] for k in opts}
        for _ in range(rounds):
            for k, opt in opts.items():
                start = time.perf_counter()
                opt.step()
                times[k].append(time.perf_counter() - start)
        out[name] = times
        progress(f"{name}: " + ", ".join(f"{k} {1e3 * sorted(v)[len(v) // 2]:.1f} ms" for k, v in times.items()))
        del opts, params
        gc.collect()
    return out


def race_table(races: dict) -> str:
    lines = ["| rule (8-bit class) | fused cpu step | bitsandbytes 0.50.2 (CPU) | fp32 states (reference step) | "
             "bitsandbytes / fused (95 % CI) | fp32 states / fused (95 % CI) |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, times in races.items():
        med = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
        cells = []
        for other in ("bitsandbytes", "fp32 states"):
            ratios = [a / b for a, b in zip(times[other], times["fused"])]
            m, lo, hi = median_and_ci(ratios)
            cells.append(f"{m:.1f}x ({lo:.1f}-{hi:.1f})" if lo == lo else f"{m:.1f}x")
        lines.append(f"| {name} | {med['fused']:.1f} ms | {med['bitsandbytes']:.1f} ms | {med['fp32 states']:.1f} ms | "
                     f"{cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def distilbert_bytes(progress=print, small: bool = False) -> list[tuple[str, str, float, float]]:
    """(class, state format, state MiB, bytes/param) for every class on DistilBERT's parameters."""
    from adam8lib import family
    from adam8lib.memory import compute_optimizer_size
    from adam8lib.optim import Adam8bit

    try:
        from adam8lib.muon import Muon8bit
    except ImportError:  # pragma: no cover - Muon8bit not merged yet
        Muon8bit = None
    if small:
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 2))
    else:
        from transformers import DistilBertConfig, DistilBertForSequenceClassification

        torch.manual_seed(0)
        model = DistilBertForSequenceClassification(DistilBertConfig(vocab_size=28996, num_labels=2))
    params = [p for p in model.parameters() if p.requires_grad]
    count = sum(p.numel() for p in params)
    for p in params:
        p.grad = torch.zeros_like(p)
    classes = [("Lion", family.Lion, "fp32"), ("Lion8bit", family.Lion8bit, "8bit"), ("Lion4bit", family.Lion4bit, "4bit"),
               ("AdEMAMix", family.AdEMAMix, "fp32"), ("AdEMAMix8bit", family.AdEMAMix8bit, "8bit"),
               ("RMSprop8bit", family.RMSprop8bit, "8bit"), ("Adagrad8bit", family.Adagrad8bit, "8bit"),
               ("SGD8bit", family.SGD8bit, "8bit"), ("Adam8bit", Adam8bit, "8bit")]
    if Muon8bit is not None:
        classes.append(("Muon8bit", Muon8bit, "8bit"))
    classes.append(("torch.optim.AdamW", torch.optim.AdamW, "fp32"))
    rows = []
    for name, cls, fmt in classes:
        saved = [p.detach().clone() for p in params]
        opt = cls(params, lr=0.0)
        opt.step()
        mib, _ = compute_optimizer_size(opt.state.values())
        rows.append((name, fmt, mib, mib * MiB / count))
        progress(f"{name}: {mib:.1f} MiB, {mib * MiB / count:.3f} bytes/param")
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
        del opt, saved
        gc.collect()
    return rows, count


def bytes_table(rows, count: int, small: bool = False) -> str:
    what = "a small MLP (--quick)" if small else "DistilBERT for sequence classification from its config"
    lines = [f"{what}: {count:,} parameters.", "",
             "| class | state format | state (MiB) | bytes / parameter |", "|---|---|---:|---:|"]
    lines += [f"| {name} | {fmt} | {mib:.1f} | {per:.3f} |" for name, fmt, mib, per in rows]
    if not small and any(name == "Muon8bit" for name, *_ in rows):
        lines += ["", MUON_NOTE]
    return "\n".join(lines)


#: Under the table: the Muon8bit row is the class's default, not the split lesson 13 advises.
MUON_NOTE = ("Muon8bit is constructed here with no parameter groups (`use_muon=None`): every 2-D tensor, the "
             "embeddings and the classification head included, takes Muon's one 8-bit momentum, and only the "
             "biases and norms take AdamW's two states. Set up as lesson 13 advises (section 6: the embeddings, "
             "the head, the biases and the norms in a `use_muon=False` group, on AdamW), it takes 90,871,408 bytes, "
             "1.38 per parameter (computed there from the shapes and measured per tensor kind).")


def machine(threads: int) -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from adam8lib.kernels import cpu

    simd = {0: "scalar", 1: "AVX2", 2: "AVX-512"}.get(cpu.simd_level(), "?")
    bnb = _bnb().__version__
    load = f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?"
    return (f"{model}, {os.cpu_count()} cores, {threads} thread{'s' if threads > 1 else ''}, kernel loops {simd}, torch sqrt "
            f"{cpu.torch_sqrt()[1]}; torch {torch.__version__}, bitsandbytes {bnb}, Python {platform.python_version()}; "
            f"{date.today().isoformat()} {time.strftime('%H:%M', time.gmtime())} UTC, load average {load}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few rounds; print only")
    parser.add_argument("--no-write", action="store_true", help="print the tables, do not touch bench/README.md")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per rule (default 11; quick 3)")
    parser.add_argument("--threads", type=int, default=THREADS,
                        help=f"torch and kernel threads (default {THREADS}; 1 on a machine shared with other jobs)")
    args = parser.parse_args(argv)
    threads = args.threads
    torch.set_num_threads(threads)
    start = time.perf_counter()
    n = 1 << 16 if args.quick else N
    rounds = args.rounds or (3 if args.quick else 11)
    races = race(n, rounds)
    rows, count = distilbert_bytes(small=args.quick)
    section = "\n".join([
        f"Made by `python bench/bench_family.py` ({time.perf_counter() - start:.0f} s). Machine: {machine(threads)}.", "",
        f"**One step of {n:,} fp32 parameters** ({rounds} rounds, round-robin; median step time; ratios per round, "
        "median and its 95 % interval):", "",
        race_table(races), "",
        "**State bytes per parameter** (allocated states after one step, all parameters):", "",
        bytes_table(rows, count, small=args.quick),
    ])
    print(section)
    if not (args.quick or args.no_write):
        write_section(START, END, section, "CPU: the 8-bit family (issue 35)", HERE / "README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
