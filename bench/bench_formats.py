"""Beyond 8 bits on the CPU: step time and state bytes per parameter of adam8lib's state formats
next to torchao's (writes the "CPU: state formats" section of bench/README.md).

    python bench/bench_formats.py           # a 1M and a 16.8M matrix, a 16.8M vector, DistilBERT's states (minutes)
    python bench/bench_formats.py --quick   # tiny sizes, prints the table, writes nothing

Rows: fused torch AdamW (the fp32 anchor), adam8lib ``AdamW8bit`` (cpu kernel), adam8lib
``AdamW4bit`` and ``AdamWFp8`` with their default backend (the cpu kernel,
:mod:`adam8lib.kernels.cpu_formats`) and with ``backend="torch"`` (the reference step: decode,
fp32 rule, encode, in plain PyTorch; bit for bit the same result), torchao ``AdamW4bit`` and ``AdamWFp8`` (torch.compile'd steps), and
bitsandbytes ``Adam8bit``. Each shape (matrices, where 4-bit ``v`` takes rank-1 scales in two passes,
and a vector, blocks of 128): one fp32 parameter with a fixed gradient shared by all rows,
two warm-up steps each (state allocation; torchao compiles), then round-robin rounds (one step of
each in turn, so every row sees the same load) and each row's step time divided by fused AdamW's
*in the same round*: median and 95 % interval of the median (``stats.median_and_ci``).

**State bytes per parameter** are counted from the states each optimizer really allocates, for
DistilBERT built from its config (65,783,042 parameters, 104 tensors; one step with zero
gradients); torchao's tensor subclasses are counted by their inner tensors (codes, scales, map).
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(ROOT), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

import torch  # noqa: E402

from bench_step import THREADS, _paired_ratios, _round_robin, machine, state_bytes  # noqa: E402
from readme_section import write_section  # noqa: E402

#: name -> shape of the parameter. A weight matrix is what a model mostly has, and where 4-bit v takes
#: rank-1 scales (two passes); a vector takes blocks of 128 (one pass), as biases and 1-D weights do.
SIZES = {"1M matrix 1024×1024": (1024, 1024), "16.8M vector": (16_777_216,), "16.8M matrix 4096×4096": (4096, 4096)}
QUICK_SIZES = {"64K matrix 256×256": (256, 256)}
ROUNDS = {1_048_576: 15, 16_777_216: 7}
ANCHOR = "torch AdamW (fused)"
START, END = "<!-- formats:start (bench/bench_formats.py writes this) -->", "<!-- formats:end -->"


def optimizers() -> list[tuple[str, object]]:
    """(row name, factory(params) -> optimizer) in table order; an ImportError marks a missing library."""
    from adam8lib import AdamW4bit, AdamW8bit, AdamWFp8

    def torchao(cls_name):
        def make(params):
            import torchao.optim

            return getattr(torchao.optim, cls_name)(params, lr=1e-3, weight_decay=0.01)

        return make

    def bnb(params):
        import bitsandbytes as bnb

        return bnb.optim.Adam8bit(params, lr=1e-3, weight_decay=0.01)

    return [
        (ANCHOR, lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, fused=True)),
        ("adam8lib AdamW8bit (cpu kernel)", lambda ps: AdamW8bit(ps, lr=1e-3, backend="cpu")),
        ("adam8lib AdamW4bit (cpu kernel)", lambda ps: AdamW4bit(ps, lr=1e-3)),
        ("adam8lib AdamWFp8 (cpu kernel)", lambda ps: AdamWFp8(ps, lr=1e-3)),
        ("adam8lib AdamW4bit (reference step)", lambda ps: AdamW4bit(ps, lr=1e-3, backend="torch")),
        ("adam8lib AdamWFp8 (reference step)", lambda ps: AdamWFp8(ps, lr=1e-3, backend="torch")),
        ("torchao AdamW4bit", torchao("AdamW4bit")),
        ("torchao AdamWFp8", torchao("AdamWFp8")),
        ("bitsandbytes Adam8bit", bnb),
    ]


def distilbert_bytes(progress=print) -> dict[str, float | str]:
    """State bytes per parameter of each row (except the anchor: 8) for DistilBERT's parameters."""
    from adam8lib.course.finetune import build_distilbert

    model = build_distilbert()
    n = sum(p.numel() for p in model.parameters())
    out: dict[str, float | str] = {}
    for name, make in optimizers():
        try:
            opt = make(list(model.parameters()))
        except ImportError as exc:
            out[name] = f"not installed ({exc.name or exc})"
            continue
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        out[name] = state_bytes(opt) / n
        progress(f"DistilBERT {name:<40} {out[name]:.4f} state bytes/param")
        del opt
        gc.collect()
    return out


def race(shape: tuple[int, ...], rounds: int, progress=print) -> dict[str, tuple[float, ...] | str]:
    """Paired step-time ratios to fused AdamW (median, quartiles, 95 % CI of the median) for one
    parameter of ``shape``."""
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(shape, generator=gen))
    p.grad = torch.randn(shape, generator=gen) * 1e-2
    n = p.numel()
    contenders, missing = {}, {}
    for name, make in optimizers():
        try:
            contenders[name] = make([p])
        except ImportError as exc:
            missing[name] = f"not installed ({exc.name or exc})"
    times = _round_robin(contenders, rounds)
    ratios: dict[str, tuple[float, ...] | str] = dict(_paired_ratios(times, ANCHOR))
    for name, ts in times.items():
        ratios[name] = (*ratios[name], sorted(ts)[len(ts) // 2] * 1e3)
        progress(f"{n:>10,} {name:<40} {ratios[name][-1]:9.1f} ms  x{ratios[name][0]:.2f} fused AdamW")
    ratios.update(missing)
    return ratios


def render(races: dict, bytes_per_param: dict, info: dict, seconds: float) -> str:
    sizes = list(races)
    head = ("| optimizer | state bytes/param (DistilBERT) | "
            + " | ".join(f"{s}: ms/step | {s}: x fused AdamW [95% CI]" for s in sizes) + " |")
    lines = [head, "|" + "---|" * (2 + 2 * len(sizes))]
    for name, _ in optimizers():
        b = bytes_per_param.get(name)
        cells = [name, f"{b:.4f}" if isinstance(b, float) else (b or "–")]
        for s in sizes:
            r = races[s].get(name)
            if isinstance(r, tuple):
                cells += [f"{r[-1]:.1f}", f"{r[0]:.2f} [{r[3]:.2f}, {r[4]:.2f}]"]
            else:
                cells += [r or "–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    env = ", ".join(f"{k} {v}" for k, v in info.items())
    return "\n".join([
        f"One fp32 parameter of each shape with a fixed gradient, {THREADS} threads, round-robin steps "
        "(paired ratios to fused AdamW in the same round); state bytes counted from the states allocated "
        "for DistilBERT (65,783,042 parameters). adam8lib's 4-bit and FP8 formats run their cpu kernel "
        "(the default) and, for comparison, their reference step (`backend=\"torch\"`, the same bits).", "",
        *lines, "", f"- Measured on: {env}; {seconds:.0f} s in all."])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny size, 3 rounds, no DistilBERT; print only")
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)
    start = time.perf_counter()
    sizes = QUICK_SIZES if args.quick else SIZES
    races = {s: race(shape, 3 if args.quick else ROUNDS[math.prod(shape)]) for s, shape in sizes.items()}
    bpp = {} if args.quick else distilbert_bytes()
    section = render(races, bpp, machine(), time.perf_counter() - start)
    print(section)
    if not args.quick:
        write_section(START, END, section, "CPU: state formats beyond 8 bits (4-bit, FP8) next to torchao")
        print("wrote bench/README.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
