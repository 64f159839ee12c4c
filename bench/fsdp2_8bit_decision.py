"""Which optimizer states are 8-bit under FSDP2: adam8lib, torchao and bitsandbytes on 2 gloo ranks (lesson 11).

    python -m torch.distributed.run --nproc-per-node 2 bench/fsdp2_8bit_decision.py

Three bias-free linear layers whose weights sit around the 4,096-element threshold, sharded by
``fully_shard`` over 2 CPU ranks. Each rank prints, per weight, its full and local sizes and the
kind of state each optimizer made for its first step: ``8-bit`` or ``fp32``, or the error of the step.
adam8lib decides by the full parameter; torchao (``torchao.optim.AdamW8bit``) by the local shard
(at least 4,096 elements and a multiple of its block size); bitsandbytes does not reach a decision
that matters: its step fails at its operator (mixed ``torch.Tensor`` and ``DTensor``). An optimizer
that is not installed is reported as such (torchao is not a course dependency: the bench venv has it).
"""

from __future__ import annotations


import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def model() -> torch.nn.Sequential:
    torch.manual_seed(0)  # 31x256: 8-bit on 1 process, shards 4,096 + 3,840; 128x48: shards 3,072 + 3,072
    return torch.nn.Sequential(torch.nn.Linear(256, 31, bias=False), torch.nn.Linear(31, 48, bias=False),
                               torch.nn.Linear(48, 128, bias=False))


def kind(state: dict) -> str:
    for value in state.values():
        local = value.to_local() if hasattr(value, "to_local") else value
        if torch.is_tensor(local) and (local.dtype == torch.uint8 or type(local).__name__.startswith("OptimState")):
            return "8-bit"
    return "fp32"


def torchao_states(params: list) -> list[dict]:
    """The states torchao's first step makes (``_new_buffer``, the function that decides 8-bit), without
    the step itself: the step is ``torch.compile``d, and on uneven shards the compiled graph of one shape
    has been seen to meet the other rank's ("expected size 16==15"), which is not what this measures."""
    from torchao.optim import AdamW8bit

    opt = AdamW8bit(params, lr=1e-3)
    return [{"exp_avg": opt._new_buffer(p, True), "exp_avg_sq": opt._new_buffer(p, False)} for p in params]


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    import bitsandbytes as bnb

    from adam8lib import AdamW8bit

    def stepped(make):
        def run(params):
            opt = make(params)
            opt.step()
            return [opt.state[p] for p in params]
        return run

    probes = {"adam8lib": stepped(lambda ps: AdamW8bit(ps, lr=1e-3)), "torchao": torchao_states,
              "bitsandbytes": stepped(lambda ps: bnb.optim.AdamW8bit(ps, lr=1e-3))}
    for name, probe in probes.items():
        net = model()
        full = [p.numel() for p in net.parameters()]
        fully_shard(net)
        net(torch.randn(4, 256)).sum().backward()
        params = list(net.parameters())
        try:
            states = probe(params)
        except ImportError:
            print(f"rank {rank} {name:12s} not installed", flush=True)
            continue
        except RuntimeError as err:
            print(f"rank {rank} {name:12s} step failed: {str(err).splitlines()[0][:140]}", flush=True)
            continue
        for n, p, state in zip(full, params, states):
            print(f"rank {rank} {name:12s} weight {tuple(p.shape)}: {n:5d} elements, local {p.to_local().numel():5d}:"
                  f" {kind(state)}", flush=True)
    dist.barrier()
    from adam8lib.distributed import end_rank
    end_rank()


if __name__ == "__main__":
    main()
