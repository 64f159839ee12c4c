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
adam4bit      1 + 4/128 + 4·(rows + cols)/(rows·cols) for a matrix — two 4-bit codes per byte,
              m's absmax per block of 128, v's rank-1 scales (:mod:`adam8lib.formats`)
adamfp8       2 + 8/256 — one float8 byte for m and v, two fp32 scales per block of 256
============  ===========================================================================

The low-bit kinds count what :class:`adam8lib.optim.LowBitAdam` stores for each format
(``StateFormat.state_spec``); with a bare parameter count every tensor is taken as one vector.

Units: :data:`MiB` is 2**20 bytes (65,783,042 parameters × 2 bytes = 125.5 MiB), and the course
prints it as "MiB". The source chapter writes the same unit "MB"; :data:`MB`, ``megabytes`` and
``code_megabytes`` are kept as aliases of :data:`MiB`, ``mebibytes`` and ``code_mebibytes`` (they
are 2**20-byte units too, not 10**6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import torch
from torch import nn

from .formats import get_format
from .quant import check_blocksize

__all__ = [
    "MiB", "MB", "OptimizerMemory", "estimate_optimizer_memory", "compute_optimizer_size", "KINDS",
    "saved_activation_bytes", "materialize_state",
]

MiB = 2**20
#: The chapter's name for :data:`MiB` (2**20 bytes, not 10**6), kept for compatibility.
MB = MiB
KINDS = ("adamw", "adam8bit", "adafactor", "adam4bit", "adamfp8")
#: The state format of each low-bit kind (adam8lib.formats).
_FORMAT_OF = {"adam8bit": "8bit", "adam4bit": "4bit", "adamfp8": "fp8"}


@dataclass(frozen=True)
class OptimizerMemory:
    """An estimate of optimizer-state memory, broken into its terms (bytes)."""

    kind: str
    num_params: int
    code_bytes: int = 0  # low-bit codes (adam8bit, adam4bit, adamfp8)
    absmax_bytes: int = 0  # fp32 scales: per block, or rank-1 axis maxima
    fp32_bytes: int = 0  # full fp32 states (adamw; adam8bit's small tensors; adafactor's vectors)
    factored_bytes: int = 0  # adafactor's row and column statistics

    @property
    def total_bytes(self) -> int:
        return self.code_bytes + self.absmax_bytes + self.fp32_bytes + self.factored_bytes

    @property
    def bytes_per_param(self) -> float:
        return self.total_bytes / self.num_params if self.num_params else 0.0

    @property
    def mebibytes(self) -> float:
        """The total in MiB (2**20 bytes)."""
        return self.total_bytes / MiB

    @property
    def code_mebibytes(self) -> float:
        """The chapter's "2 bytes per parameter" figure for 8-bit Adam (codes only), in MiB."""
        return self.code_bytes / MiB

    #: Aliases (the chapter's "MB" is MiB): the same values.
    megabytes = mebibytes
    code_megabytes = code_mebibytes


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
    blocksize: int | None = None,
    min_8bit_size: int = 4096,
) -> OptimizerMemory:
    """Estimate the optimizer-state bytes for ``params``.

    ``params`` is a parameter count (every tensor assumed large), a module, or an iterable
    of tensors or shapes (then the small-tensor rule and Adafactor's factoring are exact).
    """
    if kind not in KINDS:
        raise ValueError(f"Unknown optimizer kind {kind!r}; choose one of {KINDS}")
    fmt = get_format(_FORMAT_OF.get(kind, "8bit"))
    blocksize = fmt.blocksize if blocksize is None else blocksize
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
    if kind in _FORMAT_OF:
        fmt = fmt.with_blocksize(blocksize)
        code = absmax = fp32 = 0
        for shape in (shapes if shapes is not None else [(size,) for size in shapes_n]):
            size = math.prod(shape)
            if size >= min_8bit_size:
                spec = fmt.state_spec(tuple(shape))
                code += sum(count * 1 for key, (count, _) in spec.items() if key.startswith("state"))
                absmax += sum(4 * count for key, (count, _) in spec.items() if key.startswith("absmax"))
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


def _stored_tensors(value: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors that hold ``value``'s data: itself; a DTensor's local shard; the inner
    tensors of a wrapper subclass (``__tensor_flatten__``: torchao's quantized states hold codes,
    scales and a map, not a dense tensor of their logical shape)."""
    if hasattr(value, "to_local"):  # a DTensor (FSDP2 states): what this rank holds
        return _stored_tensors(value.to_local())
    if type(value) is not torch.Tensor and hasattr(value, "__tensor_flatten__"):
        names, _ = value.__tensor_flatten__()
        return [t for name in names for t in _stored_tensors(getattr(value, name))]
    return [value]


def compute_optimizer_size(optimizer_states: Iterable[Mapping[str, Any]]) -> tuple[float, int]:
    """Measure a live optimizer: ``compute_optimizer_size(optimizer.state.values())``.

    Returns ``(mebibytes, number_of_elements)`` (MiB = 2**20 bytes) summed over every tensor in every
    per-parameter state (codes, absmax, fp32 moments, step counters). A tensor that several
    states share (bitsandbytes keeps the same quantization map in each) is counted once. A
    DTensor (sharded state) counts its local shard: the bytes this rank holds; a tensor subclass
    that wraps others (torchao's 4-bit, 8-bit and FP8 states) counts the tensors it holds.
    """
    seen: set[tuple[int, int]] = set()
    nbytes = elements = 0
    for state in optimizer_states:
        if not isinstance(state, Mapping):
            raise TypeError(f"expected per-parameter state dicts (optimizer.state.values()), got {type(state).__name__}")
        for value in state.values():
            if not torch.is_tensor(value):
                continue
            for tensor in _stored_tensors(value):
                key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset()) if tensor.numel() else (id(tensor), 0)
                if key in seen:
                    continue
                seen.add(key)
                nbytes += tensor.numel() * tensor.element_size()
                elements += tensor.numel()
    return nbytes / MiB, elements


# ---------------------------------------------------------------------- measuring memory
def saved_activation_bytes(model: nn.Module, batch: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> int:
    """Bytes of the tensors autograd saves for backward in one forward pass of ``model``.

    Each saved storage is counted once, and parameters are skipped (autograd keeps them, not a
    copy). Everything else counts. Under 16-bit autocast that includes the 16-bit copy of its
    weight that each matmul saves (a new tensor, not a parameter) and one 16-bit copy of the input
    per Linear: three Linears that read one tensor save three copies where fp32 saves the shared
    tensor once. What an op keeps in fp32 does not shrink: LayerNorm's fp32 input (the residual
    stream) and its statistics, and on the CPU the attention of ``scaled_dot_product_attention``'s
    math path. Lesson 10 breaks the total down by op (DistilBERT: bf16 / fp32 ≈ 0.78).
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
    """Create every per-parameter state of a low-bit optimizer (Adam, AdamW or the family's) now, without a step.

    Optimizers create their states lazily, at the first ``step()``. To *measure* the state of
    a big model (``compute_optimizer_size``) no update is needed: for an optimizer on the one core
    (:class:`~adam8lib.quantized_state.QuantizedStateOptimizer`) this allocates exactly what the first step would (codes, absmax or fp32 moments); other
    optimizers take one step on zero gradients with ``lr`` set to 0 for that step.
    """
    from .quantized_state import QuantizedStateOptimizer

    if isinstance(optimizer, QuantizedStateOptimizer):  # the low-bit Adams and the family: init_state()
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
