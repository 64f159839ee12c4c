"""Optimizer memory: estimate it from shapes, measure it from a live optimizer (lessons 01, 09).

Bytes of optimizer *state* per parameter (parameters and gradients are extra, and are the
same for every optimizer):

============  ===========================================================================
adamw         8   — fp32 ``m`` and ``v``
adam8bit      2 + 8/blocksize — uint8 codes for ``m`` and ``v`` plus two fp32 absmax per
              block; tensors under ``min_8bit_size`` elements keep 8 bytes/param
adafactor     ≈ 4·(rows + cols) per matrix instead of 4·rows·cols — factored second
              moment, no first moment (``transformers.optimization.Adafactor`` defaults);
              vectors keep a full fp32 second moment
============  ===========================================================================

"MB" follows the source chapter and means MiB (2**20 bytes): 65,783,042 parameters ×
2 bytes = 125.5 MB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import torch
from torch import nn

from .quant import check_blocksize, num_blocks

__all__ = [
    "MB", "OptimizerMemory", "estimate_optimizer_memory", "compute_optimizer_size", "KINDS",
    "saved_activation_bytes", "materialize_state",
]

MB = 2**20
KINDS = ("adamw", "adam8bit", "adafactor")


@dataclass(frozen=True)
class OptimizerMemory:
    """An estimate of optimizer-state memory, broken into its terms (bytes)."""

    kind: str
    num_params: int
    code_bytes: int = 0  # 8-bit codes (adam8bit)
    absmax_bytes: int = 0  # per-block fp32 scales (adam8bit)
    fp32_bytes: int = 0  # full fp32 states (adamw; adam8bit's small tensors; adafactor's vectors)
    factored_bytes: int = 0  # adafactor's row and column statistics

    @property
    def total_bytes(self) -> int:
        return self.code_bytes + self.absmax_bytes + self.fp32_bytes + self.factored_bytes

    @property
    def bytes_per_param(self) -> float:
        return self.total_bytes / self.num_params if self.num_params else 0.0

    @property
    def megabytes(self) -> float:
        return self.total_bytes / MB

    @property
    def code_megabytes(self) -> float:
        """The chapter's "2 bytes per parameter" figure for 8-bit Adam (codes only)."""
        return self.code_bytes / MB


def _shapes(params: Any) -> list[tuple[int, ...]] | None:
    """Shapes from an int (None: unknown), a module, tensors, or shapes."""
    if isinstance(params, bool):
        raise TypeError("params must be an int, a module, tensors or shapes, not a bool")
    if isinstance(params, int):
        if params < 0:
            raise ValueError(f"number of parameters must be >= 0, got {params}")
        return None
    if isinstance(params, torch.nn.Module):
        params = params.parameters()
    shapes = []
    for item in params:
        shape = tuple(item.shape) if isinstance(item, torch.Tensor) else tuple(int(d) for d in item)
        shapes.append(shape)
    return shapes


def estimate_optimizer_memory(
    params: int | torch.nn.Module | Iterable[torch.Tensor] | Iterable[Iterable[int]],
    kind: str = "adam8bit",
    *,
    blocksize: int = 256,
    min_8bit_size: int = 4096,
) -> OptimizerMemory:
    """Estimate the optimizer-state bytes for ``params``.

    ``params`` is a parameter count (every tensor assumed large), a module, or an iterable
    of tensors or shapes (then the small-tensor rule and Adafactor's factoring are exact).
    """
    if kind not in KINDS:
        raise ValueError(f"Unknown optimizer kind {kind!r}; choose one of {KINDS}")
    check_blocksize(blocksize)
    shapes = _shapes(params)
    if shapes is None:
        n = params
        if kind == "adafactor":
            raise ValueError(
                "Adafactor's state depends on the tensor shapes (rows + columns); "
                "pass the model or a list of shapes instead of a count"
            )
        shapes_n = [n] if n else []
    else:
        shapes_n = [math.prod(s) for s in shapes]
        n = sum(shapes_n)
    if kind == "adamw":
        return OptimizerMemory(kind, n, fp32_bytes=8 * n)
    if kind == "adam8bit":
        code = absmax = fp32 = 0
        for size in shapes_n:
            if size >= min_8bit_size:
                code += 2 * size
                absmax += 2 * 4 * num_blocks(size, blocksize)
            else:
                fp32 += 8 * size
        return OptimizerMemory(kind, n, code_bytes=code, absmax_bytes=absmax, fp32_bytes=fp32)
    factored = fp32 = 0
    for shape in shapes:
        if len(shape) >= 2:  # v ≈ outer(row means, col means) over the last two dims
            lead = math.prod(shape[:-2])
            factored += 4 * lead * (shape[-2] + shape[-1])
        else:
            fp32 += 4 * math.prod(shape)
    return OptimizerMemory(kind, n, fp32_bytes=fp32, factored_bytes=factored)


def compute_optimizer_size(optimizer_states: Iterable[Mapping[str, Any]]) -> tuple[float, int]:
    """Measure a live optimizer: ``compute_optimizer_size(optimizer.state.values())``.

    Returns ``(megabytes, number_of_elements)`` summed over every tensor in every
    per-parameter state (codes, absmax, fp32 moments, step counters). A tensor that several
    states share (bitsandbytes keeps the same quantization map in each) is counted once.
    """
    seen: set[tuple[int, int]] = set()
    nbytes = elements = 0
    for state in optimizer_states:
        if not isinstance(state, Mapping):
            raise TypeError(f"expected per-parameter state dicts (optimizer.state.values()), got {type(state).__name__}")
        for value in state.values():
            if not torch.is_tensor(value):
                continue
            key = (value.untyped_storage().data_ptr(), value.storage_offset()) if value.numel() else (id(value), 0)
            if key in seen:
                continue
            seen.add(key)
            nbytes += value.numel() * value.element_size()
            elements += value.numel()
    return nbytes / MB, elements


# ---------------------------------------------------------------------- measuring memory
def saved_activation_bytes(model: nn.Module, batch: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> int:
    """Bytes of the tensors autograd saves for backward in one forward pass of ``model``.

    These activations, not the weights, are what autocast shrinks: under bf16 autocast the
    matmul inputs are saved as 2-byte copies. Each saved storage is counted once (weights are
    parameters, not activations, and are skipped unless autocast made a 16-bit copy).
    """
    device_type = next(model.parameters()).device.type
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor):
        nonlocal total
        if t.layout == torch.strided and t.device.type != "meta":
            key = t.untyped_storage().data_ptr()
            if key not in params and key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(device_type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = model(**batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return total


def materialize_state(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Create every per-parameter state of an ``Adam8bit`` (or AdamW) now, without a step.

    Optimizers create their states lazily, at the first ``step()``. To *measure* the state of
    a big model (``compute_optimizer_size``) no update is needed: for :class:`Adam8bit` this
    allocates exactly what the first step would (codes, absmax or fp32 moments); other
    optimizers take one step on zero gradients with ``lr`` set to 0 for that step.
    """
    from .optim import Adam8bit

    if isinstance(optimizer, Adam8bit):
        optimizer.init_state()
        return optimizer
    saved = [(g["lr"], g.get("weight_decay")) for g in optimizer.param_groups]
    grads = {}
    for g in optimizer.param_groups:
        g["lr"] = 0.0
        for p in g["params"]:
            grads[p] = p.grad
            p.grad = torch.zeros_like(p)
    try:
        optimizer.step()
    finally:
        for g, (lr, _) in zip(optimizer.param_groups, saved):
            g["lr"] = lr
        for p, grad in grads.items():
            p.grad = grad
    return optimizer
