"""Two gloo ranks on the CPU, run once by tests/test_distributed.py (``python distributed_worker.py OUT``).

Each scenario writes what it measured to ``OUT/<name>_rank<r>.pt``; the test process compares it
with single-process runs of the same model and data. Scenarios:

* ``fsdp``: FSDP2 (``fully_shard``), default backend, N steps; params after step 1 and step N,
  per-rank optimizer size, which states are 8-bit, local states after N steps.
* ``resume``: save a DCP checkpoint after N steps, 2 more steps; a fresh model+optimizer loads
  it and takes the same 2 steps (must be bit-identical).
* ``from1``: load the 1-process checkpoint ``OUT/ckpt1`` (written by the test) on 2 ranks.
* ``ddp`` / ``zero``: DDP with AdamW8bit, and ZeroRedundancyOptimizer(optimizer_class=AdamW8bit).
* ``lowbit_<name>`` for each format of :data:`LOWBIT` (AdamW4bit, AdamWFp8, the 4-bit-naive format):
  FSDP2 training as ``fsdp``, a ``state_dict()`` round trip (through ``torch.save``), a DCP save and
  resume as ``resume``, and the 1-process checkpoint ``OUT/ckpt1_<name>`` loaded on 2 ranks.
* ``sr``: bf16 weights with stochastic rounding (:func:`make_sr`, 4-bit states): FSDP2 training as
  ``fsdp``; parameters and local states after N steps (must equal the unsharded run bit for bit).
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS = 3
LR = 1e-2


class Net(torch.nn.Module):
    """Aligned 256->512->128 layers (2-rank shards are whole blocks), a 128->33 layer (uneven
    shards of 17 and 16 rows, 4224 elements: 8-bit by the full size though each shard is < 4096)
    and a 1x4096 parameter (rank 1's shard is empty). ``forward`` returns the loss."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.Tanh(), torch.nn.Linear(512, 128), torch.nn.Tanh(),
            torch.nn.Linear(128, 33),
        )
        self.row = torch.nn.Parameter(torch.randn(1, 4096) * 0.1)

    def forward(self, x):
        return self.net(x).square().mean() + (self.row * self.row).sum() * 1e-3


#: The low-bit formats other than 8-bit that FSDP2 runs here: (optimizer class, extra arguments).
LOWBIT = {"4bit": ("AdamW4bit", {}), "fp8": ("AdamWFp8", {}), "naive": ("AdamW4bit", {"state_format": "4bit-naive"})}


def make_lowbit(name, params):
    import adam8lib

    cls, kwargs = LOWBIT[name]
    return getattr(adam8lib, cls)(params, lr=LR, **kwargs)


def make_sr_model() -> Net:
    """The model of :func:`make_model` in bf16 (the weights stochastic rounding writes)."""
    return make_model().to(torch.bfloat16)


def make_sr(params):
    """AdamW4bit on bf16 weights with stochastic rounding (the shards of Net are whole 128-blocks)."""
    from adam8lib import AdamW4bit

    return AdamW4bit(params, lr=LR, stochastic_rounding=True, seed=7)


def train_sr(model, opt, steps):
    for s in range(steps):
        model(batch(s).to(torch.bfloat16)).float().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def per_shard_run(name, world=2, steps=STEPS):
    """A single process that steps each parameter the way ``world`` FSDP2 ranks do: the optimizer
    holds one parameter per row chunk (``torch.chunk`` on dim 0, as ``Shard(0)``), low-bit (by the
    full size) or fp32 as the whole parameter would be; the model runs whole. For blockwise
    formats this is what the sharded run computes, straddling blocks included."""
    model = make_model()
    pieces, big, small = [], [], []
    for p in model.parameters():
        start = 0
        for chunk in p.detach().chunk(world):
            piece = torch.nn.Parameter(chunk.clone())
            pieces.append((p, start, piece))
            (big if p.numel() >= 4096 else small).append(piece)
            start += chunk.shape[0]
    opt = make_lowbit(name, [{"params": big, "min_8bit_size": 0}, {"params": small}])
    for s in range(steps):
        model(batch(s)).backward()
        for p, start, piece in pieces:
            piece.grad = p.grad[start: start + piece.shape[0]].clone()
        opt.step()
        with torch.no_grad():
            for p, start, piece in pieces:
                p[start: start + piece.shape[0]].copy_(piece)
        model.zero_grad(set_to_none=True)
    return model, opt, pieces


def make_model() -> Net:
    torch.manual_seed(0)
    return Net()


def batch(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(16, 256, generator=g)


def train(model, opt, steps, first_step=0, after_first=None):
    """Same data on every rank, so gradients equal the single-process ones."""
    for s in range(first_step, first_step + steps):
        model(batch(s)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if after_first is not None and s == first_step:
            after_first(model)


def full_params(model) -> dict[str, torch.Tensor]:
    from adam8lib.distributed import is_dtensor

    return {k: (v.full_tensor() if is_dtensor(v) else v).detach().clone() for k, v in model.named_parameters()}


def local_states(model, opt) -> dict[str, dict]:
    names = {p: k for k, p in model.named_parameters()}
    return {names[p]: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in st.items()} for p, st in opt.state.items()}


def shard(model):
    from torch.distributed.fsdp import fully_shard

    for m in model.net:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m)
    fully_shard(model)
    return model


def join_gloo(rank: int, world: int, port: int) -> None:
    """Join the test's gloo process group on this machine (one thread per rank)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)


def run(rank: int, world: int, out: str, port: int) -> None:
    join_gloo(rank, world, port)
    from adam8lib import AdamW8bit, compute_optimizer_size
    from adam8lib.distributed import load_checkpoint, save_checkpoint

    def save(name, obj):
        torch.save(obj, os.path.join(out, f"{name}_rank{rank}.pt"))

    # --- FSDP2, default backend
    model = shard(make_model())
    opt = AdamW8bit(model.parameters(), lr=LR)
    after1 = {}
    train(model, opt, STEPS, after_first=lambda m: after1.update(full_params(m)))
    names = {p: k for k, p in model.named_parameters()}
    save("fsdp", {
        "after1": after1, "afterN": full_params(model), "size": compute_optimizer_size(opt.state.values()),
        "eight_bit": {names[p]: "state1" in st for p, st in opt.state.items()}, "states": local_states(model, opt),
    })

    # --- DCP save, continue; fresh model loads and continues the same way
    ckpt = os.path.join(out, "ckpt2")
    save_checkpoint(model, opt, ckpt)
    train(model, opt, 2, first_step=STEPS)
    model2 = shard(make_model())
    opt2 = AdamW8bit(model2.parameters(), lr=LR)
    load_checkpoint(model2, opt2, ckpt)
    loaded = local_states(model2, opt2)
    train(model2, opt2, 2, first_step=STEPS)
    save("resume", {"continued": full_params(model), "resumed": full_params(model2), "loaded": loaded})

    # --- a 1-process checkpoint loaded on 2 ranks
    model3 = shard(make_model())
    opt3 = AdamW8bit(model3.parameters(), lr=LR)
    load_checkpoint(model3, opt3, os.path.join(out, "ckpt1"))
    save("from1", {"states": local_states(model3, opt3), "params": full_params(model3)})

    # --- the other low-bit formats under FSDP2
    import io

    for name in LOWBIT:
        model = shard(make_model())
        opt = make_lowbit(name, model.parameters())
        after1 = {}
        train(model, opt, STEPS, after_first=lambda m: after1.update(full_params(m)))
        states = local_states(model, opt)
        buffer = io.BytesIO()
        torch.save(opt.state_dict(), buffer)
        buffer.seek(0)
        opt_sd = make_lowbit(name, model.parameters())
        opt_sd.load_state_dict(torch.load(buffer, weights_only=False))
        result = {
            "after1": after1, "afterN": full_params(model), "size": compute_optimizer_size(opt.state.values()),
            "eight_bit": {k: "state1" in opt.state[p] for k, p in model.named_parameters()}, "states": states,
            "sd_loaded": local_states(model, opt_sd),
        }
        ckpt = os.path.join(out, f"ckpt2_{name}")
        save_checkpoint(model, opt, ckpt)
        train(model, opt, 2, first_step=STEPS)
        model2 = shard(make_model())
        opt2 = make_lowbit(name, model2.parameters())
        load_checkpoint(model2, opt2, ckpt)
        result["loaded"] = local_states(model2, opt2)
        train(model2, opt2, 2, first_step=STEPS)
        result.update(continued=full_params(model), resumed=full_params(model2))
        model3 = shard(make_model())
        opt3 = make_lowbit(name, model3.parameters())
        load_checkpoint(model3, opt3, os.path.join(out, f"ckpt1_{name}"))
        result.update(from1_states=local_states(model3, opt3), from1_params=full_params(model3))
        save(f"lowbit_{name}", result)

    # --- bf16 weights with stochastic rounding (4-bit states)
    model = shard(make_sr_model())
    opt = make_sr(model.parameters())
    train_sr(model, opt, STEPS)
    save("sr", {"afterN": full_params(model), "states": local_states(model, opt)})

    # --- DDP and ZeRO-1
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    for name in ("ddp", "zero"):
        inner = make_model()
        ddp = DDP(inner)
        params = list(ddp.parameters())
        if name == "ddp":
            opt4 = AdamW8bit(params, lr=LR)
        else:
            opt4 = ZeroRedundancyOptimizer(params, optimizer_class=AdamW8bit, lr=LR)
        train(ddp, opt4, STEPS)
        local = opt4.optim.state if name == "zero" else opt4.state
        if name == "zero":
            opt4.consolidate_state_dict(to=0)  # a collective: every rank takes part
        full_sd = opt4.state_dict() if rank == 0 else None
        save(name, {"params": {k: v.detach().clone() for k, v in inner.named_parameters()},
                    "size": compute_optimizer_size(local.values()), "state_dict": full_sd})
    from adam8lib.distributed import end_rank

    end_rank()  # barrier, destroy the group, exit without the teardown that can abort a gloo rank


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    mp.spawn(run, args=(2, sys.argv[1], free_port()), nprocs=2)
