"""``Adam8bit`` and ``AdamW8bit``: Adam whose two states are stored as 8-bit codes (lesson 07).

What is 8-bit, and what is not:

* **parameters and gradients keep their own dtype** (fp32, bf16 or fp16) — nothing here
  stores parameters in FP8 or int8;
* the two Adam states ``m`` and ``v`` of every tensor with at least ``min_8bit_size``
  elements are stored as uint8 codes (``state1``, ``state2``) into two shared 256-entry
  maps (signed dynamic map for ``m``, unsigned for ``v``) plus one fp32 ``absmax`` per
  block of ``blocksize`` elements (``absmax1``, ``absmax2``): about 2 bytes per parameter
  instead of 8;
* smaller tensors (biases, LayerNorm weights) keep fp32 states ``exp_avg``/``exp_avg_sq``;
* each step dequantizes, updates in fp32 and requantizes, one chunk of blocks at a time
  (see :mod:`adam8lib.kernels.reference` for the exact maths).

Weight decay is *decoupled* (AdamW style) in both classes, as in bitsandbytes, where
``Adam8bit`` and ``AdamW8bit`` differ only in the default ``weight_decay`` (0 vs 1e-2).

Non-finite gradients: an element whose gradient is NaN or ±Inf has its ``m`` and ``v``
reset to 0 and its parameter left unchanged for that step (bitsandbytes' GPU kernels do
the same); the other elements are updated normally.
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Any, Iterable

import torch

from . import kernels
from .adam import check_hyperparameters
from .quant import check_blocksize, dynamic_map, num_blocks

__all__ = ["Adam8bit", "AdamW8bit"]

_PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_STATE_KEYS_8BIT = ("state1", "state2", "absmax1", "absmax2")
_STATE_KEYS_32BIT = ("exp_avg", "exp_avg_sq")


class Adam8bit(torch.optim.Optimizer):
    """Adam with 8-bit blockwise-quantized states (decoupled weight decay).

    Args:
        params: parameters or param groups (each group may set ``lr``, ``betas``, ``eps``,
            ``weight_decay``, ``blocksize``, ``min_8bit_size``).
        lr, betas, eps, weight_decay: as in ``torch.optim.AdamW``.
        blocksize: elements per quantization block, a power of two in 64…4096 (256 as in
            bitsandbytes; 2048 as in the paper).
        min_8bit_size: tensors with fewer elements keep fp32 states (4096, as bitsandbytes).
        backend: ``"auto"``, ``"torch"`` (reference), ``"triton"``, or another registered
            backend (see :mod:`adam8lib.kernels`).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        blocksize: int = 256,
        min_8bit_size: int = 4096,
        backend: str = "auto",
    ) -> None:
        if backend not in kernels.known_backend_names():
            raise ValueError(f"Unknown backend {backend!r}; choose one of {list(kernels.known_backend_names())}")
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
            blocksize=blocksize, min_8bit_size=min_8bit_size,
        )
        _check_group(defaults)
        self.backend = backend
        self.qmap1 = dynamic_map(signed=True)
        self.qmap2 = dynamic_map(signed=False)
        super().__init__(params, defaults)

    # ------------------------------------------------------------------ groups
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            group["betas"] = tuple(group["betas"])
            _check_group(group)
        except (ValueError, TypeError):
            self.param_groups.pop()
            raise
        for p in group["params"]:
            if p.dtype not in _PARAM_DTYPES:
                self.param_groups.pop()
                raise TypeError(
                    f"{type(self).__name__} supports fp32, bf16 and fp16 parameters; got one of shape "
                    f"{tuple(p.shape)} with dtype {p.dtype}"
                )

    # ------------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure=None):
        """One optimizer step. Checks every gradient first, so a bad one changes nothing."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = []
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                _check_grad(p, gi, pi)
                work.append((group, p))
        for group, p in work:
            state = self.state[p]
            if not state:
                self._init_state(group, p, state)
            state["step"] += 1
            if "state1" in state:
                self._step_8bit(group, p, state)
            else:
                self._step_32bit(group, p, state)
        return loss

    @torch.no_grad()
    def init_state(self) -> None:
        """Create the states of every parameter now (as the first ``step()`` would), without
        updating anything: to measure or shard an optimizer before training."""
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    self._init_state(group, p, state)

    def _init_state(self, group: dict[str, Any], p: torch.Tensor, state: dict[str, Any]) -> None:
        state["step"] = 0
        n = p.numel()
        if n >= group["min_8bit_size"]:
            blocks = num_blocks(n, group["blocksize"])
            # code of 0.0 is 127 (signed map) / 0 (unsigned map); absmax 0 makes both exactly 0
            state["state1"] = torch.full((n,), 127, dtype=torch.uint8, device=p.device)
            state["state2"] = torch.zeros((n,), dtype=torch.uint8, device=p.device)
            state["absmax1"] = torch.zeros((blocks,), dtype=torch.float32, device=p.device)
            state["absmax2"] = torch.zeros((blocks,), dtype=torch.float32, device=p.device)
        else:
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)

    def _maps(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self.qmap1.device != device:
            self.qmap1, self.qmap2 = self.qmap1.to(device), self.qmap2.to(device)
        return self.qmap1, self.qmap2

    def _step_8bit(self, group: dict[str, Any], p: torch.Tensor, state: dict[str, Any]) -> None:
        beta1, beta2 = group["betas"]
        flat = p.view(-1) if p.is_contiguous() else p.contiguous().view(-1)
        grad = p.grad.reshape(-1)
        if not grad.is_contiguous():
            grad = grad.contiguous()
        qmap1, qmap2 = self._maps(p.device)
        kernels.adam8bit_step(
            flat, grad, state["state1"], state["state2"], state["absmax1"], state["absmax2"], qmap1, qmap2,
            step=state["step"], lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
            weight_decay=group["weight_decay"], blocksize=group["blocksize"], backend=self.backend,
        )
        if not p.is_contiguous():  # we worked on a contiguous copy: write it back
            p.copy_(flat.view(p.shape))

    def _step_32bit(self, group: dict[str, Any], p: torch.Tensor, state: dict[str, Any]) -> None:
        """fp32 states for small tensors; same maths and NaN rule as the 8-bit path."""
        beta1, beta2 = group["betas"]
        lr, wd, t = group["lr"], group["weight_decay"], state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        grad = p.grad.float()
        finite = torch.isfinite(grad)
        m.mul_(beta1).add_(grad, alpha=1.0 - beta1).masked_fill_(~finite, 0.0)
        v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2).masked_fill_(~finite, 0.0)
        param = p.float()
        new = param.mul(1.0 - lr * wd) if wd != 0 else param.clone()
        denom = v.sqrt().div_(math.sqrt(1.0 - beta2**t)).add_(group["eps"])
        new.addcdiv_(m, denom, value=-lr / (1.0 - beta1**t))
        p.copy_(torch.where(finite, new, param))

    # ------------------------------------------------------------------ checkpoints
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a checkpoint *without* casting states (torch would cast uint8 codes and fp32
        absmax to the parameter dtype). Everything is checked before anything is changed,
        so a bad checkpoint raises ValueError and leaves this optimizer as it was."""
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError("state_dict must have 'state' and 'param_groups' (from Optimizer.state_dict())")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        params = list(chain.from_iterable(g["params"] for g in self.param_groups))
        ids = list(chain.from_iterable(g["params"] for g in saved_groups))
        if len(ids) != len(params):
            raise ValueError("loaded state dict contains a parameter group that doesn't match the size of optimizer's group")
        for saved in saved_groups:
            _check_group({**saved, "betas": tuple(saved["betas"])})
        id_to_param = dict(zip(ids, params))
        new_state: dict[torch.Tensor, dict[str, Any]] = {}
        for pid, saved in state_dict["state"].items():
            if pid not in id_to_param:
                raise ValueError(f"state for unknown parameter id {pid!r}")
            p = id_to_param[pid]
            group = saved_groups[next(i for i, g in enumerate(saved_groups) if pid in g["params"])]
            _check_saved_state(p, saved, group)
            new_state[p] = {k: (v.to(p.device).clone() if torch.is_tensor(v) else v) for k, v in saved.items()}
        super().load_state_dict({"state": {}, "param_groups": saved_groups})
        for g in self.param_groups:
            g["betas"] = tuple(g["betas"])
        self.state.update(new_state)

    def __repr__(self) -> str:
        return super().__repr__().replace(type(self).__name__ + " (", f"{type(self).__name__} (backend: {self.backend}", 1)


class AdamW8bit(Adam8bit):
    """:class:`Adam8bit` with AdamW's default ``weight_decay=1e-2`` (decay is decoupled in both)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, **kwargs):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kwargs)


# ---------------------------------------------------------------------- validation helpers
def _check_group(group: dict[str, Any]) -> None:
    check_hyperparameters(group["lr"], group["betas"], group["eps"], group["weight_decay"])
    check_blocksize(group["blocksize"])
    size = group["min_8bit_size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"Invalid min_8bit_size: {size!r} (must be an int >= 0)")


def _check_grad(p: torch.Tensor, group_index: int, param_index: int) -> None:
    where = f"parameter {param_index} of group {group_index} (shape {tuple(p.shape)})"
    grad = p.grad
    if grad.is_sparse or grad.layout != torch.strided:
        raise RuntimeError(f"Adam8bit does not support sparse gradients: {where}; use torch.optim.SparseAdam")
    if grad.is_complex() or p.is_complex():
        raise RuntimeError(f"Adam8bit does not support complex parameters or gradients: {where}")
    if grad.shape != p.shape:
        raise ValueError(f"gradient shape {tuple(grad.shape)} does not match {where}")
    if not grad.is_floating_point():
        raise TypeError(f"gradient of {where} must be floating point, got {grad.dtype}")


def _check_saved_state(p: torch.Tensor, saved: dict[str, Any], group: dict[str, Any]) -> None:
    n = p.numel()
    if "state1" in saved:
        blocks = num_blocks(n, group["blocksize"])
        expected = {"state1": (n, torch.uint8), "state2": (n, torch.uint8),
                    "absmax1": (blocks, torch.float32), "absmax2": (blocks, torch.float32)}
    elif "exp_avg" in saved:
        expected = {k: (n, torch.float32) for k in _STATE_KEYS_32BIT}
    else:
        raise ValueError(f"saved state for parameter of shape {tuple(p.shape)} has none of the Adam8bit state keys")
    for key, (numel, dtype) in expected.items():
        value = saved.get(key)
        if not torch.is_tensor(value) or value.numel() != numel or value.dtype != dtype:
            got = f"{value.dtype}[{value.numel()}]" if torch.is_tensor(value) else repr(type(value).__name__)
            raise ValueError(
                f"saved state {key!r} for parameter of shape {tuple(p.shape)} should be {dtype}[{numel}], got {got}"
            )
    if not isinstance(saved.get("step"), int):
        raise ValueError("saved state has no integer 'step'")
