"""Where the time of one 8-bit Adam step goes on the CPU (writes the "CPU: where the time goes"
section of bench/README.md and bench/results/cpu_profile.png; lessons 07 and 08 can show both).

    python bench/profile_step.py           # 4M parameters, 2 threads, about a minute
    python bench/profile_step.py --quick   # smaller, prints only

1. **The reference backend, phase by phase.** The same torch operations as
   ``adam8lib.kernels.reference.adam8bit_step``, over the same 64K-element chunks, with a
   clock around each phase: dequantize (codes -> fp32), update m and v, update p,
   absmax (per block), nearest code (requantize).
2. **The C++ kernel** (``backend="cpu"``) as a whole, with each of its SIMD levels (scalar,
   AVX2, AVX-512), and in its fast mode (``backend="cpu_fast"``: IEEE sqrt and one division
   fewer), to show what matching torch bit for bit costs. ``torch.optim.AdamW(fused=True)`` is the
   anchor; these rows are timed round-robin (one step of each in turn) and each row's ratio is the
   median of its per-round ratios to fused AdamW, so a load that changes from second to second
   tilts them less than the absolute times. With AVX-512, one more row times the fast mode on a
   *knock-out build* (``cpu.knockout_build("ADAM8_KNOCKOUT_GATHER")``) whose requantization
   gathers are replaced by one register permute: its codes are wrong on purpose, and its time
   shows what the two table gathers per element cost on this CPU (about 45 % of the step on an
   AMD Zen 4, much less on Intel).
3. **The cost of each parameter tensor.** A model has many tensors, and every one costs an
   optimizer a Python call and a kernel launch besides its elements. One optimizer step over
   100 tensors of 65,536 elements against the same 6.6M parameters as one tensor, for
   ``AdamW8bit`` (``cpu``, ``cpu_fast``) and fused AdamW (which takes all tensors in one call),
   round-robin: the difference divided by 99 is the time each extra tensor costs.
"""

from __future__ import annotations

import argparse
import math
import os
from contextlib import contextmanager
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

from readme_section import write_section  # noqa: E402
from stats import median_and_ci  # noqa: E402

from adam8lib import AdamW8bit  # noqa: E402
from adam8lib.kernels import cpu, reference  # noqa: E402
from adam8lib.quant import _as_blocks, dequantize_blocks, dynamic_map, nearest_code, num_blocks  # noqa: E402

THREADS = 2
README = HERE / "README.md"
PLOT = HERE / "results" / "cpu_profile.png"
START, END = "<!-- cpu-profile:start (bench/profile_step.py writes this) -->", "<!-- cpu-profile:end -->"
PHASES = ("dequantize", "update m, v", "update p", "absmax", "nearest code")
HYPER = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, blocksize=256)
FAST = "best, fast mode (cpu_fast: IEEE sqrt, not bit-identical)"
FUSED = "torch.optim.AdamW(fused=True)"
KNOCKOUT = "fast mode, requantization gathers knocked out (wrong codes: timing only)"
#: round-robin rounds for the kernel rows and the per-tensor cost (enough for a 95 % interval
#: of a median: 31 rounds give the 10th to the 22nd value)
ROUNDS = 31


def _problem(n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(n, generator=gen)
    g = torch.randn(n, generator=gen) * 1e-2
    blocks = num_blocks(n, HYPER["blocksize"])
    states = [torch.full((n,), 127, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8),
              torch.zeros(blocks), torch.zeros(blocks)]
    return p, g, states


def reference_phases(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, *, step, lr, beta1, beta2, eps,
                     weight_decay, blocksize, chunk_size=reference.CHUNK_SIZE) -> dict[str, float]:
    """reference.adam8bit_step, line for line, with a clock around each phase (seconds)."""
    spent = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def phase(name):
        t0 = time.perf_counter()
        yield
        spent[name] += time.perf_counter() - t0

    n = p.numel()
    bias_correction1 = 1.0 - beta1**step
    bias_correction2_sqrt = math.sqrt(1.0 - beta2**step)
    step_size = lr / bias_correction1
    chunk = max(blocksize, chunk_size - chunk_size % blocksize)
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        b0, b1 = start // blocksize, -(-end // blocksize)
        with phase("dequantize"):
            m = dequantize_blocks(state1[start:end], absmax1[b0:b1], qmap1, blocksize)
            v = dequantize_blocks(state2[start:end], absmax2[b0:b1], qmap2, blocksize)
        with phase("update m, v"):
            grad = g[start:end].float()
            finite = torch.isfinite(grad)
            m.mul_(beta1).add_(grad, alpha=1.0 - beta1)
            v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
            m.masked_fill_(~finite, 0.0)
            v.masked_fill_(~finite, 0.0)
        with phase("update p"):
            param = p[start:end].float()
            new = param.mul(1.0 - lr * weight_decay) if weight_decay != 0 else param.clone()
            denom = v.sqrt().div_(bias_correction2_sqrt).add_(eps)
            new.addcdiv_(m, denom, value=-step_size)
            p[start:end].copy_(torch.where(finite, new, param))
        # requantize = quantize_blocks(x, qmap, blocksize, keep_sign=True), split in two
        for x, qmap, state, absmax in ((m, qmap1, state1, absmax1), (v, qmap2, state2, absmax2)):
            with phase("absmax"):
                blocks = _as_blocks(x, blocksize)
                scale = blocks.abs().amax(dim=1)
                absmax[b0:b1] = scale
            with phase("nearest code"):
                inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
                state[start:end] = nearest_code((blocks * inv[:, None]).view(-1)[: end - start], qmap, keep_sign=True)
    return spent


def _round_robin(steps: dict, rounds: int) -> dict[str, list[float]]:
    """Each step once (a warm-up), then ``rounds`` rounds of one step of each in turn: seconds."""
    for fn in steps.values():
        fn(1)
    times = {name: [] for name in steps}
    for t in range(2, rounds + 2):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            fn(t)
            times[name].append(time.perf_counter() - t0)
    return times


def _median_time(fn, reps: int) -> float:
    """One step of ``fn`` as a warm-up, then the median of ``reps`` timed steps (seconds)."""
    return statistics.median(_round_robin({"step": fn}, reps)["step"])


def _ci_text(lo: float, hi: float, fmt: str) -> str:
    return "–" if math.isnan(lo) else f"{lo:{fmt}}–{hi:{fmt}}"


def profile(n: int, reps: int, rounds: int = ROUNDS) -> dict:
    torch.set_num_threads(THREADS)
    qmap1, qmap2 = dynamic_map(True), dynamic_map(False)
    # 1. reference, by phase (and the real reference step, to check the sum)
    p, g, st = _problem(n)
    p2, _, st2 = _problem(n)
    runs = []
    for t in range(1, reps + 2):
        runs.append(reference_phases(p, g, *st, qmap1, qmap2, step=t, **HYPER))
        reference.adam8bit_step(p2, g, *st2, qmap1, qmap2, step=t, **HYPER)
    assert torch.equal(p, p2) and all(torch.equal(a, b) for a, b in zip(st, st2)), "phases differ from reference"
    phases = {k: statistics.median(r[k] for r in runs[1:]) for k in PHASES}
    ref_total = _median_time(lambda t: reference.adam8bit_step(p2, g, *st2, qmap1, qmap2, step=t, **HYPER), reps)

    # 2. the C++ kernel: SIMD levels, and IEEE sqrt instead of torch's, and fused AdamW, timed
    # round-robin (one step of each in turn): the load of this shared machine changes from
    # second to second, and each round's ratios to fused AdamW are taken within the round
    steps = {}
    for level in range(cpu.simd_level() + 1):
        name = {0: "scalar loops", 1: "AVX2 (8 lanes)", 2: "AVX-512 (16 lanes)"}[level]
        p, g, st = _problem(n)
        steps[name] = lambda t, p=p, g=g, st=st, level=level: cpu.adam8bit_step(
            p, g, *st, qmap1, qmap2, step=t, simd=level, **HYPER)
    p, g, st = _problem(n)
    steps[FAST] = lambda t: cpu.adam8bit_step(p, g, *st, qmap1, qmap2, step=t, exact=False, **HYPER)
    if cpu.simd_level() >= 2:
        knockout = cpu.knockout_build("ADAM8_KNOCKOUT_GATHER")
        p_ko, g_ko, st_ko = _problem(n)

        def without_gathers(t):
            with cpu.using_build(knockout):
                cpu.adam8bit_step(p_ko, g_ko, *st_ko, qmap1, qmap2, step=t, exact=False, **HYPER)

        steps[KNOCKOUT] = without_gathers
    w = torch.nn.Parameter(torch.randn(n))
    w.grad = torch.randn(n)
    opt = torch.optim.AdamW([w], fused=True)
    steps[FUSED] = lambda t: opt.step()
    times = _round_robin(steps, rounds)
    kernel = {k: statistics.median(v) for k, v in times.items() if k != FUSED}
    ratios = {k: median_and_ci([a / b for a, b in zip(v, times[FUSED])]) for k, v in times.items() if k != FUSED}
    fused = statistics.median(times[FUSED])
    count, size = (10, 4096) if n < 2**20 else (100, 65_536)
    tensors = {"count": count, "size": size, "rows": per_tensor_cost(count, size, rounds)}
    return {"n": n, "phases": phases, "reference_total": ref_total, "kernel": kernel, "ratios": ratios,
            "fused_adamw": fused, "tensors": tensors, "rounds": rounds}


def per_tensor_cost(count: int, size: int, rounds: int) -> dict[str, dict[str, float]]:
    """One optimizer step over ``count`` tensors of ``size`` elements and over one tensor of
    ``count * size``, each optimizer its own parameters, round-robin: median seconds of each,
    and the cost of one more tensor, ``(many - one) / (count - 1)`` within each round, as its
    median over the rounds with a 95 % interval."""
    makers = {
        "adam8lib AdamW8bit, backend cpu": lambda ps: AdamW8bit(ps, lr=1e-3, backend="cpu"),
        "adam8lib AdamW8bit, backend cpu_fast": lambda ps: AdamW8bit(ps, lr=1e-3, backend="cpu_fast"),
        "torch AdamW (fused)": lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True),
    }
    gen = torch.Generator().manual_seed(0)
    steps = {}
    for name, make in makers.items():
        for shape in ("many", "one"):
            params = [torch.nn.Parameter(torch.randn(s, generator=gen))
                      for s in ([size] * count if shape == "many" else [size * count])]
            for w in params:
                w.grad = torch.randn(w.numel(), generator=gen) * 1e-2
            steps[(name, shape)] = lambda t, opt=make(params): opt.step()
    raw = _round_robin(steps, rounds)
    times = {k: statistics.median(v) for k, v in raw.items()}
    rows = {}
    for name in makers:
        extra = [(many - one) / (count - 1) for many, one in zip(raw[(name, "many")], raw[(name, "one")])]
        med, lo, hi = median_and_ci(extra)
        rows[name] = {"one": times[(name, "one")], "many": times[(name, "many")], "per_tensor": med,
                      "per_tensor_ci": (lo, hi)}
    return rows


def render(res: dict) -> str:
    n, phases = res["n"], res["phases"]
    total = sum(phases.values())
    load = f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?"
    lines = [f"{n / 1e6:.1f}M fp32 parameters, blocksize 256, {THREADS} threads; the kernel's rows and fused AdamW "
             f"timed round-robin ({res['rounds']} rounds of one step of each in turn), median ms, and the median "
             "of each round's ratio to fused AdamW with its 95 % interval (order statistics, bench/stats.py); "
             f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, load average (1 min) {load} (the "
             "machine's 2 cores are shared: read the ratios rather than the absolute times).",
             "", "**Reference backend (`backend=\"torch\"`), by phase**", "",
             "| phase | ms | share |", "|---|---|---|"]
    lines += [f"| {k} | {v * 1e3:.1f} | {v / total:.0%} |" for k, v in phases.items()]
    lines += [f"| sum (the untimed reference step: {res['reference_total'] * 1e3:.1f} ms) | {total * 1e3:.1f} | 100% |",
              "", "**C++ kernel (`backend=\"cpu\"`)**", "", "| variant | ms | vs fused AdamW | 95 % CI |",
              "|---|---|---|---|"]
    fused = res["fused_adamw"]
    for k, v in res["kernel"].items():
        med, lo, hi = res["ratios"][k]
        lines.append(f"| {k} | {v * 1e3:.1f} | {med:.2f}× | {_ci_text(lo, hi, '.2f')} |")
    lines.append(f"| torch.optim.AdamW(fused=True), the anchor | {fused * 1e3:.1f} | 1.00× | |")
    tensors = res["tensors"]
    count, size = tensors["count"], tensors["size"]
    lines += ["", f"**Each parameter tensor's own cost** (one optimizer step, {count} tensors of {size:,} elements "
              f"vs one tensor of {count * size:,}; round-robin, median; each extra tensor: the median over the rounds of "
              "(many - one) / (count - 1) within a round)", "",
              f"| optimizer | 1 tensor: ms | {count} tensors: ms | each extra tensor: µs | 95 % CI |",
              "|---|---|---|---|---|"]
    for name, row in tensors["rows"].items():
        lo, hi = row["per_tensor_ci"]
        lines.append(f"| {name} | {row['one'] * 1e3:.2f} | {row['many'] * 1e3:.2f} | {row['per_tensor'] * 1e6:.0f} | "
                     f"{_ci_text(lo * 1e6, hi * 1e6, '.0f')} |")
    lines += ["", f"![where the time goes]({PLOT.relative_to(HERE).as_posix()})"]
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 2]})
    bottom = 0.0
    for k, v in res["phases"].items():
        a.bar(["reference\n(torch ops)"], [v * 1e3], bottom=bottom, label=k)
        bottom += v * 1e3
    a.set_ylabel("ms per step")
    a.set_title("reference, by phase")
    a.legend(fontsize=8)
    names = list(res["kernel"]) + ["AdamW fused (anchor)"]
    values = [v * 1e3 for v in res["kernel"].values()] + [res["fused_adamw"] * 1e3]
    b.barh(names, values, color=["tab:blue"] * len(res["kernel"]) + ["tab:gray"])
    b.invert_yaxis()
    b.set_xlabel("ms per step")
    b.set_title("C++ kernel: SIMD level and mode")
    fig.suptitle(f"One 8-bit Adam step, {res['n'] / 1e6:.1f}M fp32 parameters, {THREADS} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_readme(section: str) -> None:
    write_section(START, END, section, "CPU: where the time goes", README)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="256K parameters, prints only")
    parser.add_argument("-n", type=int, default=4 * 2**20, help="number of parameters (default 4Mi)")
    args = parser.parse_args(argv)
    res = profile(2**18 if args.quick else args.n, reps=2 if args.quick else 3)
    section = render(res)
    print(section)
    if not args.quick:
        plot(res, PLOT)
        write_readme(section)
        print(f"wrote {README} and {PLOT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
