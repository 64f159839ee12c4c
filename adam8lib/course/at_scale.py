"""Per-rank memory and step time of DDP, ZeRO-1 and FSDP2 with AdamW and 8-bit Adam (lesson 11, bench/scale.py).

Per rank, for ``n`` parameters on ``W`` ranks (fp32 weights and gradients; ``s(k)`` = optimizer
state bytes for ``k`` parameters: ``8k`` for AdamW, ``2k + 8·ceil(k/blocksize)`` for 8-bit Adam):

=========  ==========  ==========  ============
strategy   weights     gradients   states
=========  ==========  ==========  ============
ddp        4n          4n          s(n)
zero1      4n          4n          s(n/W)       (ZeroRedundancyOptimizer: each rank steps a part)
fsdp2      4n/W        4n/W        s(n/W)       (fully_shard: every tensor sharded on dim 0)
=========  ==========  ==========  ============

:func:`estimate` is this table; :func:`run` measures it on ``W`` CPU processes (gloo) launched
with ``python -m torch.distributed.run --nproc-per-node W -m adam8lib.course.at_scale OUT.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

STRATEGIES = ("ddp", "zero1", "fsdp2")
OPTIMIZERS = ("adamw", "adam8bit")

__all__ = ["STRATEGIES", "OPTIMIZERS", "state_bytes", "estimate", "build_model", "run"]


def state_bytes(num_params: int, optimizer: str, blocksize: int = 256) -> int:
    """Optimizer-state bytes of ``num_params`` parameters in large tensors."""
    if optimizer == "adamw":
        return 8 * num_params
    if optimizer == "adam8bit":
        return 2 * num_params + 8 * (-(-num_params // blocksize))
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")


def estimate(num_params: int, world_size: int, strategy: str, optimizer: str, blocksize: int = 256) -> dict[str, int]:
    """Bytes per rank (the largest rank: shards of ``ceil(n / W)``) of weights, gradients, states."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    shard = -(-num_params // world_size)
    full = 4 * num_params
    weights = full if strategy in ("ddp", "zero1") else 4 * shard
    states = state_bytes(num_params if strategy == "ddp" else shard, optimizer, blocksize)
    return {"weights": weights, "gradients": weights, "states": states}


def build_model(width: int = 1024, depth: int = 4) -> torch.nn.Sequential:
    """``depth`` bias-free ``width``×``width`` linear layers with tanh: every tensor 8-bit, and
    its rows split evenly on 2 ranks, so the measurement equals :func:`estimate` to the byte."""
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width, bias=False), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _measure(strategy: str, optimizer: str, width: int, depth: int, steps: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..memory import compute_optimizer_size
    from ..optim import AdamW8bit

    model = build_model(width, depth)
    if strategy == "fsdp2":
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        wrapped = model
    else:
        wrapped = DDP(model)
    cls = torch.optim.AdamW if optimizer == "adamw" else AdamW8bit
    kwargs = {"foreach": False} if optimizer == "adamw" else {}
    if strategy == "zero1":
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, lr=1e-3, **kwargs)
        local_opt = opt.optim
    else:
        opt = local_opt = cls(model.parameters(), lr=1e-3, **kwargs)
    g = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(steps + 1):  # the first step allocates the states: not timed
        wrapped(torch.randn(8, width, generator=g)).square().mean().backward()
        dist.barrier()
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
        if len(times) <= steps:
            opt.zero_grad(set_to_none=False)
    params = list(model.parameters())
    return {
        "strategy": strategy, "optimizer": optimizer,
        "weights": sum(_local(p).numel() * p.element_size() for p in params),
        "gradients": sum(_local(p.grad).numel() * p.grad.element_size() for p in params if p.grad is not None),
        "states": round(compute_optimizer_size(
            [{k: v for k, v in s.items() if k != "step"} for s in local_opt.state.values()])[0] * 2**20),
        "step_ms": 1000 * statistics.median(times[1:]),
        "num_params": sum(p.numel() for p in params),
    }


def main(argv: list[str] | None = None) -> None:
    """Each rank's work (under torchrun): measure every strategy × optimizer, rank 0 writes JSON.

    Run as ``python -m adam8lib.course.at_scale``, the rank then ends with
    :func:`adam8lib.distributed.end_rank`.
    """
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("AT_SCALE_THREADS", "1")))
    dist.init_process_group("gloo")
    rows = [_measure(s, o, args.width, args.depth, args.steps) for s in STRATEGIES for o in OPTIMIZERS]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rows)
    if dist.get_rank() == 0:
        result = {"world_size": dist.get_world_size(), "width": args.width, "depth": args.depth, "ranks": gathered}
        args.out.write_text(json.dumps(result, indent=1))


def run(world_size: int, out: str | Path, *, width: int = 1024, depth: int = 4, steps: int = 3,
        timeout: float = 600) -> dict:
    """Launch ``world_size`` CPU processes with torchrun, wait, return the measurement.

    ``result["ranks"][r]`` lists one dict per strategy × optimizer: bytes of weights, gradients
    and states held by rank ``r``, and the median ``step_ms`` of ``optimizer.step()``.
    """
    out = Path(out)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world_size),
           "--master-port", str(_free_port()), "-m", "adam8lib.course.at_scale", str(out),
           "--width", str(width), "--depth", str(depth), "--steps", str(steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    from ..distributed import end_rank

    main()
    end_rank()  # barrier, destroy the group, exit without the teardown that can abort a gloo rank
