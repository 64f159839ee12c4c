"""Side-by-side CPU benchmark of one optimizer step (writes the "CPU: 8-bit step" section of
bench/README.md and bench/results/cpu_step.png).

    python bench/bench_step.py            # full run: 1M, 16.8M and 100M parameters (several minutes)
    python bench/bench_step.py --quick    # smoke run: tiny sizes, prints the table, writes nothing

One fp32 parameter tensor of N elements with a fixed random gradient, 2 threads, and for
each optimizer: two warm-up steps (state allocation, torch.compile for torchao), then the
median of timed steps. Reported per optimizer and size:

* **step time**: median wall time of ``optimizer.step()``;
* **bytes/param**: the memory traffic the algorithm needs per fp32 parameter (reads + writes
  of everything it must touch once): fused AdamW 28 (p 4+4, g 4, m 4+4, v 4+4); the 8-bit
  optimizers 16.06 (p 4+4, g 4, two uint8 codes 1+1 each, absmax 2·(4+4)/256); and
  **GB/s** = bytes/param × N / step time, the effective bandwidth;
* **torch copy (16 bytes/param)**: ``dst.copy_(src)`` of 2N fp32 values (reads 8, writes 8
  bytes per parameter): the practical memory limit for a 16-byte/param step on this machine;
* **state bytes/param**: ``adam8lib.memory.compute_optimizer_size(optimizer.state.values())``
  (torchao keeps its 8-bit states in a tensor subclass: its codes, scales and map are counted);
* **side by side**: copy, fused AdamW and both ``cpu`` modes again, round-robin (one step of
  each in turn), with each row's per-round ratio to fused AdamW: median, quartiles and a 95 %
  interval of the median (``stats.median_ci``), which the issue-15 targets are judged by;
* **the course's model**: DistilBERT from its config (65,783,042 parameters, 104 tensors),
  lesson 10's parameter groups, every optimizer on the same parameters, round-robin;
* **transient memory**: how far the resident set grows *during* a step above where it was
  just before, measured after the timed steps, in two more steps. The Linux kernel's own
  counter does the measuring: the script writes ``5`` to ``/proc/self/clear_refs`` (resets
  the peak, ``VmHWM``) and reads ``VmRSS``, steps, and reads ``VmHWM``. So that temporaries
  show up in the resident set at all, glibc is told (``mallopt(M_MMAP_THRESHOLD, 64 KiB)``)
  to serve every allocation of 64 KiB or more by a fresh ``mmap`` that is returned to the
  system when freed, instead of heap memory that it keeps and reuses (which would hide the
  next step's temporaries). That makes allocations slow, so timing runs with the threshold
  at 32 MiB (where glibc's own adaptive threshold ends up). Linux/glibc only.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from readme_section import write_section  # noqa: E402
from stats import median_and_ci  # noqa: E402

from adam8lib.memory import MB, MiB, compute_optimizer_size  # noqa: E402

THREADS = 2
SIZES = {"1M": 1_000_000, "16.8M": 16_777_216, "100M": 100_000_000}
QUICK_SIZES = {"64K": 65_536, "256K": 262_144}
#: timed steps per size (after 2 warm-up steps)
REPS = {1_000_000: 11, 16_777_216: 5, 100_000_000: 3}
#: timed steps for the (slow) reference backend
REFERENCE_REPS = 3
#: the reference backend is skipped above this size (it takes seconds per step there)
REFERENCE_MAX = 2_000_000
#: rows timed again side by side, round-robin (one step of each in turn), for the ratios
RACE = ("torch copy (16 bytes/param)", "torch AdamW (fused)", "adam8lib AdamW8bit, backend cpu",
        "adam8lib AdamW8bit, backend cpu_fast (not bit-identical)")
#: rounds: enough for a 95 % interval of the median ratio about as wide as the quartiles' half
RACE_REPS = {1_000_000: 31, 16_777_216: 61, 100_000_000: 61}
README = HERE / "README.md"
PLOT = HERE / "results" / "cpu_step.png"
RESULTS = HERE / "results" / "cpu_step.json"
START, END = "<!-- cpu-step:start (bench/bench_step.py writes this) -->", "<!-- cpu-step:end -->"


#: bytes each row must move per fp32 parameter (see the module docstring)
EIGHT_BIT_BYTES = 4 + 4 + 4 + 2 * (1 + 1) + 2 * (4 + 4) / 256
BYTES_PER_PARAM = {
    "torch copy (16 bytes/param)": 16.0,
    "torch AdamW (foreach)": 28.0,
    "torch AdamW (fused)": 28.0,
}
COPY = "torch copy (16 bytes/param)"
CPU = "adam8lib AdamW8bit, backend cpu"
CPU_FAST = "adam8lib AdamW8bit, backend cpu_fast (not bit-identical)"


def bytes_per_param(name: str) -> float:
    return BYTES_PER_PARAM.get(name, EIGHT_BIT_BYTES)


@dataclass
class Row:
    optimizer: str
    size: str
    n: int
    ms: float | None = None  # median step time
    state_bytes_per_param: float | None = None
    transient_mb: float | None = None
    note: str = ""


# ---------------------------------------------------------------------------------- optimizers
def _make_optimizers():
    """(name, factory(params) -> optimizer or None-with-reason) in table order."""
    import adam8lib  # noqa: F401
    from adam8lib.optim import AdamW8bit

    def bnb_adam8bit(params):
        import bitsandbytes as bnb

        return bnb.optim.Adam8bit(params, lr=1e-3, weight_decay=0.01)

    def torchao_adamw8bit(params):
        from torchao.optim import AdamW8bit as AoAdamW8bit

        return AoAdamW8bit(params, lr=1e-3, weight_decay=0.01)

    return [
        (COPY, _CopyStep),
        ("torch AdamW (foreach)", lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, foreach=True)),
        ("torch AdamW (fused)", lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, fused=True)),
        ("bitsandbytes Adam8bit", bnb_adam8bit),
        ("torchao AdamW8bit", torchao_adamw8bit),
        ("adam8lib AdamW8bit, backend torch (reference)", lambda ps: AdamW8bit(ps, lr=1e-3, backend="torch")),
        (CPU, lambda ps: AdamW8bit(ps, lr=1e-3, backend="cpu")),
        (CPU_FAST, lambda ps: AdamW8bit(ps, lr=1e-3, backend="cpu_fast")),
    ]


class _CopyStep:
    """Not an optimizer: ``step()`` copies 2N fp32 values (16 bytes per parameter moved)."""

    def __init__(self, params):
        (p,) = params
        self.src, self.dst = torch.randn(2 * p.numel()), torch.empty(2 * p.numel())
        self.state = {}

    def step(self):
        self.dst.copy_(self.src)


def state_bytes(opt) -> int:
    """Bytes of the optimizer's state as allocated (:func:`adam8lib.memory.compute_optimizer_size`:
    shared tensors once; torchao's subclasses by the codes, scales and map they hold)."""
    return round(compute_optimizer_size(opt.state.values())[0] * MiB)


# ---------------------------------------------------------------------------------- memory
def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _malloc_mmap_threshold(nbytes: int) -> bool:
    """glibc: serve allocations of nbytes or more by mmap (and stop adapting the threshold)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(-3, nbytes) == 1  # M_MMAP_THRESHOLD
        libc.malloc_trim(0)
        return ok
    except (OSError, AttributeError):
        return False


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------- measuring
def measure(name, factory, n, size, reps) -> Row:
    row = Row(name, size, n)
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(n, generator=gen))
    p.grad = torch.randn(n, generator=gen) * 1e-2
    try:
        opt = factory([p])
    except ImportError as exc:
        row.note = f"not installed ({exc.name or exc})"
        return row
    except Exception as exc:  # pragma: no cover - reported in the table
        row.note = f"failed: {type(exc).__name__}: {exc}"[:120]
        return row
    try:
        _malloc_mmap_threshold(32 * MB)
        for _ in range(2):  # warm-up: allocate states (and compile, for torchao)
            opt.step()
        times, transient = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
        if _malloc_mmap_threshold(64 * 1024):
            for _ in range(2):
                gc.collect()
                if not _reset_peak():
                    break
                rss = _status_kb("VmRSS")
                opt.step()
                transient.append(max(0, _status_kb("VmHWM") - rss) * 1024 / MB)
        row.ms = statistics.median(times) * 1e3
        row.state_bytes_per_param = state_bytes(opt) / n
        row.transient_mb = max(transient) if transient else None
    except Exception as exc:  # pragma: no cover - reported in the table
        row.note = f"failed: {type(exc).__name__}: {exc}"[:120]
    finally:
        del opt, p
        gc.collect()
    return row


def _round_robin(optimizers: dict, rounds: int, clock=time.perf_counter) -> dict[str, list[float]]:
    """Two warm-up steps of each optimizer, then ``rounds`` rounds of one step of each in turn:
    the seconds (by ``clock``) of every step, per row."""
    for opt in optimizers.values():
        for _ in range(2):
            opt.step()
    times = {name: [] for name in optimizers}
    for _ in range(rounds):
        for name, opt in optimizers.items():
            t0 = clock()
            opt.step()
            times[name].append(clock() - t0)
    return times


def _paired_ratios(times: dict[str, list[float]], anchor: str) -> dict[str, tuple[float, ...]]:
    """Each row's time divided by ``anchor``'s of the same round: (median, lower quartile, upper
    quartile, 95 % CI low, CI high) over the rounds (the interval: ``stats.median_and_ci``)."""
    out = {}
    for name, ts in times.items():
        ratios = sorted(t / a for t, a in zip(ts, times[anchor]))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        median, low, high = median_and_ci(ratios)
        out[name] = (median, q[0], q[2], low, high)
    return out


def race(n: int, size: str, reps: int, progress=print, cpu_time: bool = False,
         paired: dict | None = None) -> dict[str, float]:
    """The RACE rows timed round-robin: one step of each in turn, ``reps`` rounds, median ms.

    On a shared machine the load changes from second to second; measured in turn, every row
    sees the same load, so their ratios hold better than the absolute times do.
    ``cpu_time``: one thread, and the CPU time of that thread (``time.thread_time``), the
    smallest of the rounds: the work of one step, which waiting for a busy core does not
    inflate (other jobs still share the caches and memory bandwidth).
    ``paired``: filled with each row's time divided by fused AdamW's *in the same round*, as
    (median, lower quartile, upper quartile, 95 % CI low, CI high) over the rounds: a paired
    comparison, which a load that changes between rounds disturbs less than a ratio of
    medians; the interval is the distribution-free one of ``stats.median_ci``."""
    clock = time.thread_time if cpu_time else time.perf_counter
    threads = torch.get_num_threads()
    if cpu_time:
        torch.set_num_threads(1)
    factories = dict(_make_optimizers())
    # one parameter and gradient shared by every row: each optimizer keeps its own states, and
    # p and g (the largest streams) are the same memory for all, so the rows differ only in
    # what they are: where the allocator placed each row's own copy cannot tilt the ratios
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(n, generator=gen))
    p.grad = torch.randn(n, generator=gen) * 1e-2
    contenders = {name: factories[name]([p]) for name in RACE}
    times = _round_robin(contenders, reps, clock)
    pick = min if cpu_time else statistics.median
    result = {name: pick(ts) * 1e3 for name, ts in times.items()}
    if paired is not None and "torch AdamW (fused)" in times:
        paired.update(_paired_ratios(times, "torch AdamW (fused)"))
    torch.set_num_threads(threads)
    label = "1 thread, CPU time" if cpu_time else f"{threads} threads, wall time"
    progress(f"{size:>6} side by side ({label}): "
             + ", ".join(f"{k.split(', ')[-1]} {v:.1f} ms" for k, v in result.items()))
    del contenders
    gc.collect()
    return result


#: rows of the model race: the course's DistilBERT, every tensor, as the fine-tuning lesson steps it
MODEL_ROWS = ("torch AdamW (for-loop: torch's default on the CPU)", "torch AdamW (fused)", CPU, CPU_FAST)
MODEL_ROUNDS = 21


def model_race(rounds: int = MODEL_ROUNDS, progress=print, small: bool = False) -> dict | None:
    """One step of each optimizer in turn on the course's model (distilbert-base-cased for
    sequence classification, built from its config: 65,783,042 parameters in 104 tensors, 65 of
    them under ``min_8bit_size`` and so on fp32 states) with lesson 10's two parameter groups
    (no decay on biases and LayerNorm weights) and one fixed gradient per tensor. Each
    optimizer keeps its own states on the same parameters. Returns the median ms per row and
    the paired per-round ratios to fused AdamW (median and 95 % CI), or None without
    ``transformers``."""
    try:
        from adam8lib.course.finetune import build_distilbert
    except ImportError:
        return None
    try:
        model = build_distilbert(small=small)
    except ImportError:
        return None
    from adam8lib.optim import AdamW8bit
    from adam8lib.training import make_param_groups

    gen = torch.Generator().manual_seed(0)
    params = list(model.parameters())
    for w in params:
        w.grad = torch.randn(w.shape, generator=gen) * 1e-3
    make = {
        MODEL_ROWS[0]: lambda gs: torch.optim.AdamW(gs, lr=1e-5, foreach=False),
        MODEL_ROWS[1]: lambda gs: torch.optim.AdamW(gs, lr=1e-5, fused=True),
        CPU: lambda gs: AdamW8bit(gs, lr=1e-5, backend="cpu"),
        CPU_FAST: lambda gs: AdamW8bit(gs, lr=1e-5, backend="cpu_fast"),
    }
    opts = {name: factory(make_param_groups(model, weight_decay=0.01)) for name, factory in make.items()}
    times = _round_robin(opts, rounds)
    paired = _paired_ratios(times, MODEL_ROWS[1])
    out = {"model": ("a small DistilBERT (2 layers, width 128: the quick run)" if small else
                     "distilbert-base-cased for sequence classification from its config"),
           "params": sum(w.numel() for w in params), "tensors": len(params),
           "fp32_state_tensors": sum(w.numel() < 4096 for w in params), "rounds": rounds, "rows": {}}
    for name, ts in times.items():
        median, _, _, low, high = paired[name]
        out["rows"][name] = {"ms": statistics.median(ts) * 1e3, "ratio": median, "ci_low": low, "ci_high": high}
    progress("model side by side: " + ", ".join(f"{k} {v['ms']:.1f} ms" for k, v in out["rows"].items()))
    del opts, model, params
    gc.collect()
    return out


def model_table(res: dict | None) -> str:
    if not res:
        return "The course's model: not timed (`transformers` is not installed)."
    lines = [f"**The course's model, side by side, {THREADS} threads** ({res.get('model', 'DistilBERT')}: "
             f"{res['params']:,} parameters in {res['tensors']} tensors, "
             f"{res['fp32_state_tensors']} of them small enough to keep fp32 states; lesson 10's parameter groups; "
             f"{res['rounds']} rounds of one step of each in turn; ratio: the median of the per-round ratios to fused "
             "AdamW with its 95 % interval):", "",
             "| optimizer | step ms | × fused AdamW | 95 % CI |", "|---|---|---|---|"]
    for name, row in res["rows"].items():
        anchor = name == MODEL_ROWS[1]
        ci = "–" if anchor or math.isnan(row["ci_low"]) else f"{row['ci_low']:.2f}–{row['ci_high']:.2f}"
        lines.append(f"| {name} | {row['ms']:,.1f} | {row['ratio']:.2f}× | {ci} |")
    return "\n".join(lines)


def run(sizes: dict[str, int], reps_for, progress=print, race_reps=None) -> tuple[list[Row], dict]:
    torch.set_num_threads(THREADS)
    rows, races = [], {"wall": {}, "cpu": {}, "paired": {}}
    for size, n in sizes.items():
        _malloc_mmap_threshold(32 * MB)
        reps = (race_reps or RACE_REPS.get)(n) or 7
        races["paired"][size] = {}
        races["wall"][size] = race(n, size, reps, progress, paired=races["paired"][size])
        races["cpu"][size] = race(n, size, reps, progress, cpu_time=True)
        for name, factory in _make_optimizers():
            if "reference" in name and n > REFERENCE_MAX:
                rows.append(Row(name, size, n, note="skipped: several seconds per step at this size"))
                continue
            reps = min(reps_for(n), REFERENCE_REPS) if "reference" in name else reps_for(n)
            row = measure(name, factory, n, size, reps)
            rows.append(row)
            progress(f"{size:>6} {name:<48} " + (f"{row.ms:9.1f} ms" if row.ms is not None else row.note))
    return rows, races


# ---------------------------------------------------------------------------------- reporting
def machine() -> dict[str, str]:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = {"torch": torch.__version__}
    for module in ("bitsandbytes", "torchao"):
        try:
            versions[module] = __import__(module).__version__
        except Exception:
            versions[module] = "not installed"
    from adam8lib.kernels import cpu

    simd = {0: "scalar", 1: "AVX2", 2: "AVX-512"}.get(cpu.simd_level(), "?")
    if cpu.simd_level() == 2 and cpu.byte_planes():
        simd += " (VBMI byte-shuffle dequantize)"
    return {"cpu": model, "cores": str(os.cpu_count()), "threads": str(THREADS), "simd": simd,
            "sqrt": cpu.torch_sqrt()[1], **versions, "python": platform.python_version(),
            "date": date.today().isoformat(), "time (UTC)": time.strftime("%H:%M", time.gmtime()),
            "load average (1 min) at the start": LOAD_AT_START,
            "load average (1 min) at the end": _load()}


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?"


LOAD_AT_START = _load()


def _fmt(value, spec, missing="–"):
    return format(value, spec) if value is not None else missing


def table(rows: list[Row]) -> str:
    by = {(r.optimizer, r.size): r for r in rows}
    sizes = list(dict.fromkeys(r.size for r in rows))
    names = list(dict.fromkeys(r.optimizer for r in rows))
    head = "| optimizer | bytes/param | " + " | ".join(f"{s}: step ms | {s}: GB/s" for s in sizes)
    head += " | state bytes/param | " + " | ".join(f"{s}: transient MB" for s in sizes) + " |"
    lines = [head, "|" + "---|" * (3 + 3 * len(sizes))]
    notes = []
    for name in names:
        cells = []
        for s in sizes:
            r = by.get((name, s))
            if r is None or r.ms is None:
                cells += ["–", "–"]
                if r is not None and r.note:
                    notes.append(f"{name} at {s}: {r.note}")
            else:
                cells += [f"{r.ms:,.1f}", f"{bytes_per_param(name) * r.n / (r.ms * 1e-3) / 1e9:.1f}"]
        bpp = next((r.state_bytes_per_param for s in reversed(sizes) if (r := by.get((name, s))) and r.state_bytes_per_param), None)
        if name == COPY:
            bpp = None
        mem = [_fmt(by[(name, s)].transient_mb, ",.1f") if (name, s) in by and name != COPY else "–" for s in sizes]
        lines.append(f"| {name} | {bytes_per_param(name):.2f} | " + " | ".join(cells) + f" | {_fmt(bpp, '.3f')} | "
                     + " | ".join(mem) + " |")
    if notes:
        lines.append("")
        lines.extend(f"- {note}" for note in notes)
    return "\n".join(lines)


def verdict(median: float, ci_low: float, ci_high: float, target: float) -> str:
    """'met?' for a ratio that should be at most ``target``: resolved only when the 95 %
    interval of the median lies on one side of it; otherwise say which side the median is on."""
    if math.isnan(ci_low) or math.isnan(ci_high):
        return ("yes" if median <= target else "no") + " (median; too few rounds for an interval)"
    if ci_high <= target:
        return "yes"
    if ci_low > target:
        return "no"
    side = "below" if median <= target else "above"
    return f"not resolved: median {side} {target:.1f}, the 95 % CI spans it"


def targets(rows: list[Row], races: dict | None = None) -> str:
    """Issue 15's targets, as ratios of rows measured in this one run (the side-by-side race
    for copy, fused AdamW, cpu and cpu_fast; the table for bitsandbytes and the memory)."""
    by = {(r.optimizer, r.size): r for r in rows}
    paired = (races or {}).get("paired", {})
    races = (races or {}).get("wall", {})

    def times_fused(name, size, t, fused, target):
        """('x.xx× fused' text, 'met?' text) from the paired per-round ratios when the race has
        them (the median judged with its 95 % interval), else from t/fused alone."""
        r = paired.get(size, {}).get(name)
        if not r:
            return f"{t / fused:.2f}× fused", "yes" if t / fused <= target else "no"
        return (f"{r[0]:.2f}× fused (paired median, 95 % CI {r[3]:.2f}–{r[4]:.2f}, quartiles {r[1]:.2f}–{r[2]:.2f})",
                verdict(r[0], r[3], r[4], target))

    def ms(name, size):
        if name in races.get(size, {}):
            return races[size][name]
        r = by.get((name, size))
        return r.ms if r is not None else None

    lines = ["| target (2 threads, fp32 params) | size | measured | met? |", "|---|---|---|---|"]
    for size in ("16.8M", "100M"):
        fused, copy, bnb = ms("torch AdamW (fused)", size), ms(COPY, size), ms("bitsandbytes Adam8bit", size)
        exact, fast = ms(CPU, size), ms(CPU_FAST, size)
        if not (fused and exact):
            continue
        if fast:
            text, met = times_fused(CPU_FAST, size, fast, fused, 1.0)
            lines.append(f"| fast mode (cpu_fast) ≤ 1.0× fused AdamW | {size} | {fast:.1f} ms vs {fused:.1f} ms: "
                         f"{text} | {met} |")
            if copy:
                lines.append(f"| stretch: fast mode within 1.3× of the copy limit | {size} | {fast / copy:.2f}× copy "
                             f"({copy:.1f} ms) | {'yes' if fast <= 1.3 * copy else 'no'} |")
        text, met = times_fused(CPU, size, exact, fused, 1.5)
        lines.append(f"| bit-identical mode (cpu) ≤ 1.5× fused AdamW | {size} | {exact:.1f} ms: {text} | {met} |")
        if bnb:
            best = min(x for x in (exact, fast) if x)
            lines.append(f"| ≥ 10× faster than bitsandbytes Adam8bit | {size} | {bnb / exact:.1f}× (cpu), "
                         f"{bnb / best:.1f}× (best) vs {bnb:,.1f} ms | {'yes' if bnb / exact >= 10 else 'no'} |")
        for name in (CPU, CPU_FAST):
            r = by.get((name, size))
            if r is not None and r.transient_mb is not None:
                lines.append(f"| 0 MB transient ({name.split('backend ')[1].split(' ')[0]}) | {size} | "
                             f"{r.transient_mb:.1f} MB | {'yes' if r.transient_mb < 1 else 'no'} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(dict.fromkeys(r.size for r in rows))
    names = list(dict.fromkeys(r.optimizer for r in rows))
    by = {(r.optimizer, r.size): r for r in rows}
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        xs, ys = [], []
        for i, s in enumerate(sizes):
            r = by.get((name, s))
            if r is not None and r.ms is not None:
                xs.append(i + (k - (len(names) - 1) / 2) * width)
                ys.append(r.ms)
        ax.bar(xs, ys, width=width, label=name)
    ax.set_xticks(range(len(sizes)), [f"{s} params" for s in sizes])
    ax.set_yscale("log")
    ax.set_ylabel("median step time (ms, log scale)")
    ax.set_title(f"One optimizer step on the CPU ({THREADS} threads, fp32 parameters)")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_readme(section: str) -> None:
    write_section(START, END, section, "CPU: 8-bit step", README)


def race_table(races: dict, title: str) -> str:
    if not races:
        return ""
    sizes = list(races)
    lines = [title, "",
             "| row | bytes/param | " + " | ".join(f"{s}: ms | {s}: GB/s | {s}: × fused" for s in sizes) + " |",
             "|" + "---|" * (2 + 3 * len(sizes))]
    for name in RACE:
        cells = []
        for s in sizes:
            t, fused = races[s].get(name), races[s].get("torch AdamW (fused)")
            n = SIZES.get(s) or QUICK_SIZES.get(s)
            cells += [f"{t:,.1f}", f"{bytes_per_param(name) * n / (t * 1e-3) / 1e9:.1f}", f"{t / fused:.2f}"]
        lines.append(f"| {name} | {bytes_per_param(name):.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(rows: list[Row], info: dict[str, str], seconds: float, races: dict | None = None) -> str:
    machine_line = ", ".join(f"{k} {v}" for k, v in info.items())
    return "\n".join([
        f"Measured by `make bench` (`python bench/bench_step.py`, {seconds / 60:.1f} min) on: {machine_line}.",
        "",
        race_table((races or {}).get("wall", {}),
                   f"**Side by side, {THREADS} threads, wall time** (round-robin: one step of each in turn, median; "
                   "the ratios the targets below use):"),
        "",
        race_table((races or {}).get("cpu", {}),
                   "**Side by side, 1 thread, CPU time of the step** (round-robin, smallest of the rounds: the work "
                   "per step, which waiting for a busy core does not inflate):"),
        "",
        "Every row, one after another (two warm-up steps, then the median):",
        "",
        table(rows),
        "",
        targets(rows, races),
        "",
        model_table((races or {}).get("model")),
        "",
        f"![step time per optimizer and size]({PLOT.relative_to(HERE).as_posix()})",
    ])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 timed steps; print only")
    parser.add_argument("--no-write", action="store_true", help="print the table, do not touch bench/README.md")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.quick:
        rows, races = run(QUICK_SIZES, lambda n: 2, race_reps=lambda n: 3)
        races["model"] = model_race(rounds=3, small=True)
    else:
        rows, races = run(SIZES, lambda n: REPS.get(n, 5))
        torch.set_num_threads(THREADS)
        races["model"] = model_race()
    info = machine()
    section = render(rows, info, time.perf_counter() - start, races)
    print(section)
    if not (args.quick or args.no_write):
        plot(rows, PLOT)
        write_readme(section)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({"machine": info, "rows": [asdict(r) for r in rows], "side_by_side_ms": races},
                                      indent=1))
        print(f"wrote {README}, {PLOT} and {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
