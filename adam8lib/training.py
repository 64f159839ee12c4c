"""Training with 8-bit Adam: weight-decay parameter groups, precision, one training step (lesson 10).

Weight decay pulls weights towards 0. It is not applied to biases or to normalization
weights (LayerNorm's scale should stay near 1, and its bias/shift near wherever the data
puts it). So the parameters are split into two groups::

    [{"params": <decay>,    "weight_decay": wd},
     {"params": <no decay>, "weight_decay": 0.0}]

:func:`decay_parameter_names` gives the same names as
``transformers.Trainer.get_decay_parameter_names`` (tested on DistilBERT).

Mixed precision: bf16 autocast on the CPU; on a GPU bf16 when it has it, else fp16 with a
gradient scaler (fp16's narrow range would flush small gradients to zero without one).
Under autocast, matmuls (and on the CPU also GELU, attention and softmax) run in 16 bits;
parameters, their gradients and the optimizer's update stay fp32 — 8-bit Adam only stores
its two *states* as 8-bit codes.

:func:`training_step` is the plain-PyTorch step: ``torch.autocast`` forward, backward (through
a ``GradScaler`` for fp16), optimizer step, scheduler step. The Hugging Face ``Trainer`` and
``accelerate`` versions of the same loop are course helpers (:mod:`adam8lib.course.finetune`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = [
    "NORM_LAYERS",
    "decay_parameter_names",
    "make_param_groups",
    "PRECISIONS",
    "pick_precision",
    "autocast_dtype",
    "make_optimizer",
    "training_step",
]


#: Normalization layers whose parameters never get weight decay.
NORM_LAYERS: tuple[type[nn.Module], ...] = tuple(
    cls for cls in (nn.LayerNorm, getattr(nn, "RMSNorm", None), nn.GroupNorm,
                    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
    if cls is not None
)


def _is_norm(module: nn.Module) -> bool:
    # isinstance covers torch's norms; the name test covers model-specific ones (e.g. LlamaRMSNorm)
    return isinstance(module, NORM_LAYERS) or type(module).__name__.lower().endswith("norm")


def decay_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters that get weight decay: all but biases and norm-layer weights.

    Ordered as ``model.named_parameters()``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    no_decay: set[str] = set()
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        for name, _ in module.named_parameters(recurse=False):
            if _is_norm(module) or name == "bias":
                no_decay.add(prefix + name)
    return [name for name, _ in model.named_parameters() if name not in no_decay]


def make_param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two optimizer groups: decayed weights, and biases + norm weights with decay 0.

    Parameters with ``requires_grad=False`` are left out; an empty group is dropped.
    """
    if not weight_decay >= 0.0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    decay = set(decay_parameter_names(model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if n in decay], "weight_decay": weight_decay},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


#: Mixed-precision modes, as ``accelerate`` names them.
PRECISIONS = ("no", "bf16", "fp16")


_DTYPES = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def pick_precision(device: torch.device | str | None = None) -> str:
    """``"bf16"`` on the CPU and on GPUs with bf16 (Ampere+); ``"fp16"`` on older GPUs."""
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "fp16"
    return "bf16"


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a precision mode (``None`` for ``"no"``)."""
    if precision not in _DTYPES:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return _DTYPES[precision]


def make_optimizer(
    model: nn.Module, kind: str = "adam8bit", lr: float = 1e-3, weight_decay: float = 0.01, **kwargs: Any
) -> torch.optim.Optimizer:
    """An optimizer over :func:`make_param_groups` of ``model``.

    ``kind``: ``"adam8bit"`` (adam8lib, decoupled decay), ``"bnb8bit"`` (bitsandbytes'
    ``Adam8bit``, decoupled decay) or ``"adamw"`` (``torch.optim.AdamW``, 32-bit states).
    """
    groups = make_param_groups(model, weight_decay)
    if kind == "adam8bit":
        from .optim import Adam8bit  # backend "auto": chosen per device at each step

        return Adam8bit(groups, lr=lr, **kwargs)
    if kind == "bnb8bit":
        import bitsandbytes as bnb

        return bnb.optim.Adam8bit(groups, lr=lr, **kwargs)
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=lr, **kwargs)
    raise ValueError(f"kind must be 'adam8bit', 'bnb8bit' or 'adamw', got {kind!r}")


def training_step(
    model: nn.Module,
    batch: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    *,
    dtype: torch.dtype | None = torch.bfloat16,
    scaler: Any = None,
) -> float:
    """One mixed-precision step; returns the loss as a float.

    forward under ``torch.autocast(device, dtype)`` (no autocast for ``dtype=None``) →
    backward (``scaler.scale(loss)`` first when a ``GradScaler`` is given, for fp16) →
    ``optimizer.step()`` (``scaler.step``/``update``) → ``scheduler.step()`` → ``zero_grad``.
    """
    device_type = next(model.parameters()).device.type
    model.train()
    with torch.autocast(device_type, dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = model(**batch).loss
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())
