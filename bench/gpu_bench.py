"""Time the fused Triton 8-bit Adam step on one CUDA GPU, next to its two anchors.

For each size N (fp32 parameters, one tensor) it times, one after another and freeing memory
in between:

* a device-to-device copy moving the same 16 bytes per parameter (read 8 B, write 8 B):
  the machine's real bandwidth, the ceiling for any optimizer step;
* ``adam8lib.kernels.triton.adam8bit_step_triton`` (AdamW, blocksize 256);
* ``bitsandbytes.optim.AdamW8bit`` (its blockwise 8-bit CUDA kernel, default settings);
* ``torch.optim.AdamW(fused=True)`` (fp32 states).

The 8-bit step moves 16 bytes per fp32 parameter (p read+write 8, g read 4, two uint8 codes
read+write 4; absmax is 8/blocksize more). "Effective bandwidth" is ``16 * N / time`` for every
optimizer, so the numbers compare times on one scale (fused AdamW really moves 28 B/param).
Targets: ours >= 85% of the copy bandwidth, >= 1.2x faster than bitsandbytes, >= 1.6x faster
than fused AdamW.

Then the course's model (``--model``, on by default): one optimizer step over all the
parameters of DistilBERT for sequence classification (65,783,042 parameters in 104 tensors,
lesson 10's two parameter groups), for ``AdamW8bit(backend="triton")`` with its one launch per
parameter group, the same with one launch per tensor (what it did before), the lesson-12 formats
on their Triton steps (``AdamW4bit``: blockwise m, rank-1 v in two passes; ``AdamWFp8``),
bitsandbytes' AdamW8bit, torchao's ``AdamW4bit``/``AdamWFp8`` where torchao is installed, and fused
AdamW: on a real model the per-tensor cost of launches and host work counts, not only the
bandwidth of one big tensor.

Timing: CUDA events around each call, median of ``--iters`` calls after ``--warmup`` calls.

    python bench/gpu_bench.py                    # 1e8 and 1e9 params (needs ~20 GB of GPU memory)
    python bench/gpu_bench.py --sizes 1e8 --json out.json
    python bench/gpu_bench.py --sweep            # also try a few (tile, num_warps) launch configs
    python bench/gpu_bench.py --cpu-smoke        # tiny sizes on the CPU (Triton interpreter):
                                                 # checks the script runs; timings mean nothing
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import statistics
import sys
import time
import warnings
from typing import Callable

BYTES_PER_PARAM = 16  # fp32 p (r+w) + fp32 g (r) + two uint8 states (r+w)
TARGETS = {"copy_fraction": 0.85, "vs_bnb": 1.2, "vs_adamw": 1.6}
HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
BLOCKSIZE = 256


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=None, help="parameter counts (default 1e8 1e9)")
    parser.add_argument("--iters", type=int, default=None, help="timed calls per measurement (default 20)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 3)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--skip", nargs="*", default=[], choices=["bnb", "adamw"], help="anchors to leave out")
    parser.add_argument("--no-model", dest="model", action="store_false",
                        help="leave out the course's model (DistilBERT, every tensor, one optimizer step)")
    parser.add_argument("--sweep", action="store_true",
                        help="first, time our step at the smallest size for several (tile, num_warps) launch configs")
    parser.add_argument(
        "--cpu-smoke", action="store_true",
        help="run everything on the CPU at tiny sizes (Triton interpreter) to check the script works",
    )
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        args.sizes = args.sizes or [16384]
        args.iters = args.iters or 2
        args.warmup = 1 if args.warmup is None else args.warmup
    else:
        args.sizes = args.sizes or [1e8, 1e9]
        args.iters = args.iters or 20
        args.warmup = 3 if args.warmup is None else args.warmup
    args.sizes = [int(s) for s in args.sizes]
    if min(args.sizes) < 4096 or args.iters < 1 or args.warmup < 0:
        parser.error("sizes must be >= 4096 (8-bit states start there), iters >= 1, warmup >= 0")
    return args


def median_seconds(fn: Callable[[], object], device, iters: int, warmup: int) -> float:
    """Median wall time of ``fn()`` (CUDA events on a GPU, perf_counter on the CPU)."""
    import torch

    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        return statistics.median(start.elapsed_time(end) / 1e3 for start, end in events)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def free(device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def param_and_grad(n: int, device):
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    p = torch.randn(n, device=device, generator=gen)
    g = torch.randn(n, device=device, generator=gen).mul_(1e-3)
    return p, g


def time_copy(n, device, iters, warmup) -> float:
    import torch

    src = torch.empty(2 * n, dtype=torch.float32, device=device).fill_(1.0)  # 8 bytes per parameter
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), device, iters, warmup)
    del src, dst
    return seconds


def time_triton(n, device, iters, warmup, tile=None, num_warps=None) -> float:
    import torch

    from adam8lib.kernels.triton import adam8bit_step_triton
    from adam8lib.quant import dynamic_map, num_blocks

    p, g = param_and_grad(n, device)
    blocks = num_blocks(n, BLOCKSIZE)
    state1 = torch.full((n,), 127, dtype=torch.uint8, device=device)
    state2 = torch.zeros(n, dtype=torch.uint8, device=device)
    absmax1 = torch.zeros(blocks, device=device)
    absmax2 = torch.zeros(blocks, device=device)
    qmap1, qmap2 = dynamic_map(True).to(device), dynamic_map(False).to(device)
    counter = iter(range(1, 1 << 30))
    beta1, beta2 = HYPER["betas"]

    def step():
        adam8bit_step_triton(
            p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, step=next(counter), lr=HYPER["lr"],
            beta1=beta1, beta2=beta2, eps=HYPER["eps"], weight_decay=HYPER["weight_decay"], blocksize=BLOCKSIZE,
            tile=tile, num_warps=num_warps,
        )

    seconds = median_seconds(step, device, iters, warmup)
    del p, g, state1, state2, absmax1, absmax2
    return seconds


def time_optimizer(make_optimizer, n, device, iters, warmup) -> float:
    import torch

    p, g = param_and_grad(n, device)
    param = torch.nn.Parameter(p)
    param.grad = g
    opt = make_optimizer([param])
    seconds = median_seconds(opt.step, device, iters, warmup)
    del opt, param, p, g
    return seconds


def quiet_bnb():
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import bitsandbytes as bnb
    return bnb


def run(args: argparse.Namespace) -> dict:
    import torch

    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("No CUDA GPU here. Use --cpu-smoke to check the script on a CPU.")
    import triton

    bnb = quiet_bnb() if "bnb" not in args.skip else None
    info = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (Triton interpreter)",
        "torch": torch.__version__, "triton": triton.__version__,
        "bitsandbytes": getattr(bnb, "__version__", None), "iters": args.iters, "warmup": args.warmup,
        "blocksize": BLOCKSIZE, "bytes_per_param": BYTES_PER_PARAM, "results": [],
    }
    print(f"{info['device']} | torch {info['torch']} | triton {info['triton']} | bitsandbytes {info['bitsandbytes']}")
    if args.cpu_smoke:
        print("CPU smoke run: checks that every path runs; the timings mean nothing.")
    if args.sweep:
        info["sweep"] = sweep(min(args.sizes), device, args.iters, args.warmup)
    for n in args.sizes:
        row = {"n": n}
        row["copy_s"] = time_copy(n, device, args.iters, args.warmup)
        free(device)
        row["triton_s"] = time_triton(n, device, args.iters, args.warmup)
        free(device)
        if bnb is not None:
            row["bnb_s"] = time_optimizer(
                lambda ps: bnb.optim.AdamW8bit(ps, **HYPER), n, device, args.iters, args.warmup)
            free(device)
        if "adamw" not in args.skip:
            row["adamw_s"] = time_optimizer(
                lambda ps: torch.optim.AdamW(ps, **HYPER, fused=True), n, device, args.iters, args.warmup)
            free(device)
        summarize(row)
        info["results"].append(row)
    if args.model:
        info["model"] = time_model(device, args.iters, args.warmup, bnb, small=args.cpu_smoke)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=2)
    return info


def _model(device, small: bool):
    """The course's DistilBERT (from its config, fp32) on ``device`` with a fixed gradient per
    tensor; ``small``: a three-layer stand-in of a few thousand parameters (interpreter smoke run)."""
    import torch

    if small:
        model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.LayerNorm(96), torch.nn.Linear(96, 48))
    else:
        from adam8lib.course.finetune import build_distilbert

        model = build_distilbert()
    model = model.to(device)
    gen = torch.Generator(device=device).manual_seed(0)
    for w in model.parameters():
        w.grad = torch.randn(w.shape, device=device, generator=gen).mul_(1e-3)
    return model


def time_model(device, iters, warmup, bnb, small: bool = False) -> dict:
    """One optimizer step over every tensor of the course's model, per optimizer (see the
    module docstring); each optimizer gets a fresh copy of the model."""
    from adam8lib import kernels
    from adam8lib.kernels import triton as kt

    # the triton step without its step_many, under a name of its own for this measurement only
    kernels.register_backend("triton_one_launch_per_tensor", kt.adam8bit_step_triton, kt.supports)
    try:
        return _time_model_rows(device, iters, warmup, bnb, small)
    finally:
        kernels._BACKENDS.pop("triton_one_launch_per_tensor", None)


def _time_model_rows(device, iters, warmup, bnb, small: bool) -> dict:
    import torch

    from adam8lib import AdamW8bit
    from adam8lib.optim import AdamW4bit, AdamWFp8
    from adam8lib.training import make_param_groups

    lr, wd = HYPER["lr"], HYPER["weight_decay"]
    makers = {
        "adam8lib AdamW8bit (triton, one launch per group)": lambda gs: AdamW8bit(gs, lr=lr, backend="triton"),
        "adam8lib AdamW8bit (triton, one launch per tensor)":
            lambda gs: AdamW8bit(gs, lr=lr, backend="triton_one_launch_per_tensor"),
        "adam8lib AdamW4bit (triton; rank-1 v: two passes)": lambda gs: AdamW4bit(gs, lr=lr, backend="triton"),
        "adam8lib AdamWFp8 (triton)": lambda gs: AdamWFp8(gs, lr=lr, backend="triton"),
        "torch AdamW(fused=True)": lambda gs: torch.optim.AdamW(gs, lr=lr, fused=True),
    }
    if bnb is not None:
        makers["bitsandbytes AdamW8bit"] = lambda gs: bnb.optim.AdamW8bit(gs, lr=lr)
    try:  # torchao's low-bit optimizers (torch.compile'd steps), where installed
        from torchao.optim import AdamW4bit as AoAdamW4bit, AdamWFp8 as AoAdamWFp8
    except ImportError:
        pass
    else:
        if device.type == "cuda":  # their compiled steps are not for the interpreter's smoke run
            makers["torchao AdamW4bit"] = lambda gs: AoAdamW4bit(gs, lr=lr)
            makers["torchao AdamWFp8"] = lambda gs: AoAdamWFp8(gs, lr=lr)
    out = {"rows": {}}
    for name, make in makers.items():
        model = _model(device, small)
        opt = make(make_param_groups(model, weight_decay=wd))
        out["rows"][name] = median_seconds(opt.step, device, iters, warmup)
        out["params"] = sum(w.numel() for w in model.parameters())
        out["tensors"] = len(list(model.parameters()))
        del opt, model
        free(device)
    fused = out["rows"]["torch AdamW(fused=True)"]
    print(f"\nthe course's model: {out['params']:,} parameters in {out['tensors']} tensors, one optimizer step")
    for name, seconds in out["rows"].items():
        print(f"  {name:52s} {seconds * 1e3:9.3f} ms  {seconds / fused:5.2f}x fused AdamW")
    return out


#: (elements per program, warps per program) tried by --sweep; the library default is (2048, 8).
SWEEP = [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16)]


def sweep(n, device, iters, warmup) -> list[dict]:
    """Time our step for each launch config in SWEEP (to pick TILE_ELEMENTS / num_warps)."""
    print(f"\nlaunch configs at N = {n:,} (blocksize {BLOCKSIZE}):")
    rows = []
    for tile, num_warps in SWEEP:
        seconds = time_triton(n, device, iters, warmup, tile=tile, num_warps=num_warps)
        free(device)
        rows.append({"tile": tile, "num_warps": num_warps, "seconds": seconds,
                     "gbps": BYTES_PER_PARAM * n / seconds / 1e9})
        print(f"  tile {tile:5d}, num_warps {num_warps:2d}: {seconds * 1e3:9.3f} ms {rows[-1]['gbps']:8.0f} GB/s")
    return rows


def summarize(row: dict) -> None:
    """Add bandwidths and ratios to ``row`` and print them."""
    n = row["n"]
    gbps = lambda seconds: BYTES_PER_PARAM * n / seconds / 1e9  # noqa: E731
    row["copy_gbps"] = gbps(row["copy_s"])
    row["triton_gbps"] = gbps(row["triton_s"])
    row["copy_fraction"] = row["triton_gbps"] / row["copy_gbps"]
    print(f"\nN = {n:,} fp32 parameters ({BYTES_PER_PARAM} B/param, effective bandwidth = {BYTES_PER_PARAM}*N/time)")
    print(f"  {'device-to-device copy':28s} {row['copy_s'] * 1e3:9.3f} ms {row['copy_gbps']:8.0f} GB/s")
    print(f"  {'adam8lib triton fused step':28s} {row['triton_s'] * 1e3:9.3f} ms {row['triton_gbps']:8.0f} GB/s"
          f"  {row['copy_fraction']:6.1%} of copy {verdict(row['copy_fraction'], TARGETS['copy_fraction'], '%')}")
    for key, name in (("bnb", "bitsandbytes AdamW8bit"), ("adamw", "torch AdamW(fused=True)")):
        if f"{key}_s" in row:
            row[f"{key}_gbps"] = gbps(row[f"{key}_s"])
            row[f"vs_{key}"] = row[f"{key}_s"] / row["triton_s"]
            print(f"  {name:28s} {row[f'{key}_s'] * 1e3:9.3f} ms {row[f'{key}_gbps']:8.0f} GB/s"
                  f"  ours {row[f'vs_{key}']:5.2f}x faster {verdict(row[f'vs_{key}'], TARGETS[f'vs_{key}'], 'x')}")


def verdict(value: float, target: float, unit: str) -> str:
    shown = f"{target:.0%}" if unit == "%" else f"{target}x"
    return f"[target >= {shown}: {'PASS' if value >= target else 'MISS'}]"


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.cpu_smoke:  # must precede the first import of adam8lib.kernels.triton
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    return run(args)


if __name__ == "__main__":
    main()
