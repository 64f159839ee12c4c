"""Two gloo ranks on the CPU for the optimizer family under FSDP2, run once by tests/test_family_distributed.py
(``python family_distributed_worker.py OUT``).

For each optimizer of :data:`FAMILY` (Lion8bit, AdEMAMix8bit, RMSprop8bit, Lion4bit, AdEMAMix in the 4-bit
format (rank-1 ``v``), Muon8bit's AdamW group, Adagrad8bit, SGD8bit with FP8 states, Lion8bit/AdEMAMix8bit
on bf16 weights with stochastic rounding, and Adan8bit in 8 and 4 bits: four states, one kept in fp32) the worker trains :class:`Net` sharded with ``fully_shard`` for
:data:`STEPS` steps, round-trips ``state_dict()`` through ``torch.save``, saves a DCP checkpoint, takes 2 more
steps, loads the checkpoint into a fresh sharded model and takes the same 2 steps, and loads the test's
1-process checkpoint ``OUT/ckpt1_<name>`` and takes 2 steps. It writes ``OUT/<name>_rank<r>.pt``; the test
compares them with unsharded runs. Also: a step that raises on a shard (``OUT/fault_rank<r>.pt``) and the Muon
rule refusing a sharded matrix (``OUT/muon_refused_rank<r>.pt``). With ``3`` after ``OUT``: AdEMAMix8bit on
:class:`Small` on 3 ranks, where blocks are shared by three shards (``OUT/three_rank<r>.pt``, ``OUT/ckpt3_small``).
"""

from __future__ import annotations

import io
import os
import socket
import sys

import torch
import torch.multiprocessing as mp

from distributed_worker import full_params, join_gloo, local_states, shard  # the same helpers as Adam's worker

STEPS = 3
MORE = 2


class Net(torch.nn.Module):
    """Shards on 2 ranks (``torch.chunk`` of dim 0):

    * ``net.0.weight`` 45x100 = 4500 elements: 23 and 22 rows (2300 and 2200 elements): the boundary cuts
      a block of 256 (and of 128), the size is no multiple of either, each shard is under 4096 (quantized
      by the whole size);
    * ``net.2.weight`` 128x45: 64 rows each (2880 elements: the boundary cuts a block);
    * ``net.4.weight`` 64x128: 32 rows each (4096 elements: whole blocks, the fused step's case);
    * ``row`` 1x4500: rank 1's shard is empty; the biases (45, 128, 64) are under ``min_8bit_size``."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(100, 45), torch.nn.Tanh(), torch.nn.Linear(45, 128), torch.nn.Tanh(),
            torch.nn.Linear(128, 64),
        )
        self.row = torch.nn.Parameter(torch.randn(1, 4500) * 0.1)

    def forward(self, x):
        return self.net(x).float().square().mean() + (self.row.float() * self.row.float()).sum() * 1e-3


#: name: (class, arguments, bf16 weights).
FAMILY = {
    "lion8": ("Lion8bit", {"lr": 1e-3, "weight_decay": 0.1}, False),
    "ademamix8": ("AdEMAMix8bit", {"lr": 1e-2, "t_alpha": 10, "t_beta3": 10}, False),
    "rmsprop8": ("RMSprop8bit", {"lr": 1e-3}, False),
    "lion4": ("Lion4bit", {"lr": 1e-3}, False),
    "ademamix4": ("AdEMAMix8bit", {"lr": 1e-2, "state_format": "4bit"}, False),  # v: rank-1 scales of matrices
    "muon_adamw": ("Muon8bit", {"lr": 1e-2, "use_muon": False}, False),
    "adagrad8": ("Adagrad8bit", {"lr": 1e-2}, False),
    "sgd8": ("SGD8bit", {"lr": 1e-2, "state_format": "fp8"}, False),
    "lion8_sr": ("Lion8bit", {"lr": 1e-3, "stochastic_rounding": True, "seed": 5}, True),
    "ademamix8_sr": ("AdEMAMix8bit", {"lr": 1e-2, "stochastic_rounding": True, "seed": 9}, True),
    "adan8": ("Adan8bit", {"lr": 1e-2, "weight_decay": 0.02}, False),  # 3 moments + the previous gradient kept fp32
    "adan4": ("Adan8bit", {"lr": 1e-2, "state_format": "4bit", "weight_decouple": True}, False),  # rank-1 v, kept g_prev
}


def make(name, params):
    import adam8lib

    cls, kwargs, _ = FAMILY[name]
    return getattr(adam8lib, cls)(params, **kwargs)


def make_model(name=None) -> Net:
    torch.manual_seed(0)
    model = Net()
    return model.to(torch.bfloat16) if name is not None and FAMILY[name][2] else model


def batch(step: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(2000 + step)
    return torch.randn(16, 100, generator=g).to(dtype)


def train(model, opt, steps, first_step=0):
    """Same data on every rank, so the gradients equal the single-process ones."""
    dtype = next(model.parameters()).dtype
    for s in range(first_step, first_step + steps):
        model(batch(s, dtype)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def run(rank: int, world: int, out: str, port: int) -> None:
    join_gloo(rank, world, port)
    from adam8lib import Muon8bit
    from adam8lib.distributed import end_rank, load_checkpoint, save_checkpoint

    for name in FAMILY:
        model = shard(make_model(name))
        opt = make(name, model.parameters())
        train(model, opt, STEPS)
        result = {"afterN": full_params(model), "states": local_states(model, opt),
                  "fused": {k: opt.fused_step(p) is not None for k, p in model.named_parameters()}}
        buffer = io.BytesIO()  # state_dict() (DTensors) through torch.save, into a fresh optimizer
        torch.save(opt.state_dict(), buffer)
        buffer.seek(0)
        opt_sd = make(name, model.parameters())
        opt_sd.load_state_dict(torch.load(buffer, weights_only=False))
        result["sd_loaded"] = local_states(model, opt_sd)
        ckpt = os.path.join(out, f"ckpt2_{name}")
        save_checkpoint(model, opt, ckpt)
        train(model, opt, MORE, first_step=STEPS)
        model2 = shard(make_model(name))
        opt2 = make(name, model2.parameters())
        load_checkpoint(model2, opt2, ckpt)
        result["loaded"] = local_states(model2, opt2)
        train(model2, opt2, MORE, first_step=STEPS)
        result.update(continued=full_params(model), resumed=full_params(model2))
        model3 = shard(make_model(name))
        opt3 = make(name, model3.parameters())
        load_checkpoint(model3, opt3, os.path.join(out, f"ckpt1_{name}"))
        result["from1_loaded"] = local_states(model3, opt3)
        train(model3, opt3, MORE, first_step=STEPS)
        result["from1"] = full_params(model3)
        torch.save(result, os.path.join(out, f"{name}_rank{rank}.pt"))

    # a step that raises on a shard changes nothing (a later parameter's state cut short: found first)
    model = shard(make_model())
    opt = make("lion8", model.parameters())
    train(model, opt, 1)
    before = (full_params(model), local_states(model, opt))
    last = dict(model.named_parameters())["net.4.weight"]
    opt.state[last]["exp_avg_codes"] = opt.state[last]["exp_avg_codes"][:-1].clone()
    model(batch(1)).backward()
    try:
        opt.step()
        raised = None
    except ValueError as exc:
        raised = str(exc)
    opt.state[last]["exp_avg_codes"] = before[1]["net.4.weight"]["exp_avg_codes"].clone()
    torch.save({"raised": raised, "before": before, "after": (full_params(model), local_states(model, opt))},
               os.path.join(out, f"fault_rank{rank}.pt"))

    # the Muon rule on a sharded matrix: refused at construction, naming the parameter
    model = shard(make_model())
    try:
        Muon8bit([{"params": list(model.net.parameters()), "param_names": [k for k, _ in model.net.named_parameters()]}])
        refused = None
    except (ValueError, TypeError) as exc:
        refused = f"{type(exc).__name__}: {exc}"
    torch.save({"refused": refused}, os.path.join(out, f"muon_refused_rank{rank}.pt"))
    end_rank()


class Small(torch.nn.Module):
    """For 3 ranks, every state quantized (``min_8bit_size=0``), blocks of 256: ``net.0.weight`` 5x60 (rows 2, 2, 1:
    elements 0-119, 120-239, 240-299: block 0 is cut twice, rank 1 holds part of it only), ``net.1.weight`` 7x5 and
    the biases (the whole tensor in block 0, held by three ranks)."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(60, 5), torch.nn.Linear(5, 7))

    def forward(self, x):
        return self.net(x).square().mean()


def make_small():
    torch.manual_seed(0)
    return Small()


def make_small_opt(params):
    from adam8lib import AdEMAMix8bit

    return AdEMAMix8bit(params, lr=1e-2, min_8bit_size=0)


def small_batch(step: int) -> torch.Tensor:
    return torch.randn(8, 60, generator=torch.Generator().manual_seed(3000 + step))


def train_small(model, opt, steps, grads=None):
    """``grads``: a list to record each step's whole gradients in (a sharded run); or the list of a sharded
    run's gradients to step with (the unsharded reference: on 3 ranks the gradient is an average of 3 equal
    ones, which need not be the single process's bit for bit; the optimizer is what is tested)."""
    from adam8lib.distributed import is_dtensor

    for s in range(steps):
        model(small_batch(s)).backward()
        if grads is not None and len(grads) > s:
            for k, p in model.named_parameters():
                p.grad = grads[s][k].clone()
        elif grads is not None:
            grads.append({k: (p.grad.full_tensor() if is_dtensor(p.grad) else p.grad).clone()
                          for k, p in model.named_parameters()})
        opt.step()
        opt.zero_grad(set_to_none=True)


def run_three(rank: int, world: int, out: str, port: int) -> None:
    """3 ranks: blocks shared by three shards (see :class:`Small`); a DCP checkpoint for the test to load."""
    join_gloo(rank, world, port)
    from adam8lib.distributed import end_rank, save_checkpoint

    from torch.distributed.fsdp import fully_shard

    model = make_small()
    for m in model.net:
        fully_shard(m)
    fully_shard(model)
    opt = make_small_opt(model.parameters())
    grads = []
    train_small(model, opt, STEPS, grads)
    torch.save({"afterN": full_params(model), "states": local_states(model, opt), "grads": grads},
               os.path.join(out, f"three_rank{rank}.pt"))
    save_checkpoint(model, opt, os.path.join(out, "ckpt3_small"))
    end_rank()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "3":
        mp.spawn(run_three, args=(3, sys.argv[1], free_port()), nprocs=3)
    else:
        mp.spawn(run, args=(2, sys.argv[1], free_port()), nprocs=2)
