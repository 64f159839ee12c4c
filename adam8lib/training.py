"""Training with 8-bit Adam: weight-decay parameter groups, precision, one training step (lesson 10).

Weight decay pulls weights towards 0. It is not applied to biases or to normalization
weights (LayerNorm's scale should stay near 1, and its bias/shift near wherever the data
puts it). So the parameters are split into two groups::

    [{"params": <decay>,    "weight_decay": wd},
     {"params": <no decay>, "weight_decay": 0.0}]

:func:`decay_parameter_names` gives the same names as
``transformers.Trainer.get_decay_parameter_names`` (tested on DistilBERT).

Mixed precision (:func:`pick_precision`): on a CPU bf16 autocast only where the CPU does bf16
arithmetic natively (AVX512-BF16; AMX CPUs have it too), else fp32 — emulated bf16 only costs
time (7–9× slower than fp32 measured on an AVX2 EPYC). On a GPU bf16 when it has it natively
(compute capability 8.0+: A100, RTX 30xx, H100), else fp16 with a gradient scaler (fp16's narrow
range would flush small gradients to zero without one) — e.g. on Colab's free T4 (sm_75).
Under autocast, matmuls (and on the CPU also GELU, attention and softmax) run in 16 bits;
parameters, their gradients and the optimizer's update stay fp32 — 8-bit Adam only stores
its two *states* as 8-bit codes.

:func:`training_step` is the plain-PyTorch step: ``torch.autocast`` forward, backward (through
a ``GradScaler`` for fp16), optimizer step, scheduler step. The Hugging Face ``Trainer`` and
``accelerate`` versions of the same loop are course helpers (:mod:`adam8lib.course.finetune`).
"""

from __future__ import annotations

import os
import platform
from typing import Any

import torch
from torch import nn

__all__ = [
    "NORM_LAYERS",
    "decay_parameter_names",
    "make_param_groups",
    "PRECISIONS",
    "Precision",
    "CPU_BF16_ENV",
    "cpu_bf16_native",
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


class Precision(str):
    """A precision mode (``"no"``, ``"bf16"`` or ``"fp16"``) that also says why it was chosen.

    It *is* the plain string — it compares equal to ``"bf16"``, prints as ``bf16`` and can be
    handed to ``Accelerator(mixed_precision=...)`` or :func:`autocast_dtype` — with one extra
    attribute, :attr:`reason`: the sentence a learner reads.
    """

    reason: str

    def __new__(cls, mode: str, reason: str) -> "Precision":
        if mode not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {mode!r}")
        if not isinstance(reason, str) or not reason:
            raise TypeError("a Precision needs a reason (a non-empty string)")
        obj = super().__new__(cls, mode)
        obj.reason = reason
        return obj

    def __reduce__(self):  # pickles (and deep-copies) with its reason
        return (Precision, (str(self), self.reason))


#: Environment variable that overrides the CPU's bf16 answer: ``"1"`` = treat the CPU as having
#: native bf16, ``"0"`` = as not having it (e.g. to run, on an AVX512-BF16 machine, what a laptop
#: without it runs). Unset or empty: ask torch.
CPU_BF16_ENV = "ADAM8LIB_CPU_BF16"


#: oneDNN's ISA caps (``ONEDNN_MAX_CPU_ISA``) below AVX512_CORE_BF16: under them oneDNN runs bf16
#: by converting to fp32, even on a CPU with AVX512-BF16.
_ONEDNN_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def cpu_bf16_native() -> tuple[bool, str]:
    """Does this CPU do bf16 arithmetic natively? ``(answer, why)``.

    Two of torch's own checks must both say yes:

    * ``torch.cpu._is_avx512_bf16_supported()`` — the CPU has the AVX512-BF16 instructions
      (bf16 dot products: Intel Cooper Lake and Sapphire Rapids on, whose AMX-BF16 comes with
      them; AMD Zen 4 on).
    * ``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` — oneDNN, which runs torch's bf16
      matmuls on the CPU, may use bf16 kernels. Alone it is not the test: it also answers True on
      any AVX-512 CPU (Skylake-X, Ice Lake), where oneDNN converts bf16 to fp32 and back, and on
      those bf16 is slower than fp32. But it honours ``ONEDNN_MAX_CPU_ISA``: capped at ``AVX2``
      (as ``python -m adam8lib.course.second_machine`` does) it says False, and then torch's bf16
      matmuls are emulated even on an AVX512-BF16 CPU. A cap at an AVX-512 level below
      ``AVX512_CORE_BF16`` (``AVX512_CORE``, ``AVX512_CORE_VNNI``) it lets through, so such a cap
      is read from the environment too.

    Off x86 (ARM: Graviton 3, Apple M2 and later have a BF16 extension) only the oneDNN check is
    asked, which there means the CPU's BF16 instructions (untested by the course).
    :data:`CPU_BF16_ENV` (``ADAM8LIB_CPU_BF16=0`` or ``1``) overrides both.
    """
    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if forced:
        if forced not in ("0", "1"):
            raise ValueError(f"{CPU_BF16_ENV} must be 0 (no native bf16), 1 (native bf16) or unset, got {forced!r}")
        native = forced == "1"
        return native, f"{CPU_BF16_ENV}={forced} says this CPU has {'native' if native else 'no native'} bf16"
    onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return onednn, ("oneDNN reports bf16 support (torch.ops.mkldnn._is_mkldnn_bf16_supported())" if onednn
                        else "torch reports no bf16 support on this CPU (torch.ops.mkldnn._is_mkldnn_bf16_supported())")
    if not torch.cpu._is_avx512_bf16_supported():
        return False, ("this CPU has no AVX512-BF16 or AMX-BF16 instructions "
                       "(torch.cpu._is_avx512_bf16_supported() is False)")
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    if not onednn or cap in _ONEDNN_ISAS_WITHOUT_BF16:
        return False, ("this CPU has AVX512-BF16, but oneDNN may not use it ("
                       + (f"ONEDNN_MAX_CPU_ISA={cap}" if cap else "torch.ops.mkldnn._is_mkldnn_bf16_supported() is False")
                       + ")")
    return True, ("this CPU has AVX512-BF16 instructions and oneDNN uses them "
                  "(torch.cpu._is_avx512_bf16_supported(), torch.ops.mkldnn._is_mkldnn_bf16_supported())")


def pick_precision(device: torch.device | str | None = None) -> Precision:
    """The mixed precision to train in on ``device``, with the reason (:class:`Precision`).

    * **CPU**: ``"bf16"`` where the CPU has native bf16 arithmetic (:func:`cpu_bf16_native`),
      else ``"no"`` (fp32). Where bf16 is emulated (most laptops, AMD before Zen 4, Intel
      before Cooper Lake), bf16 autocast only costs time: 7–9× slower than fp32 on an AVX2 EPYC.
    * **GPU**: ``"bf16"`` from compute capability 8.0 (Ampere, Ada, Hopper); ``"fp16"`` (with a
      ``GradScaler``) on older GPUs — Colab's free T4 is sm_75, a V100 sm_70 — which have fp16
      tensor cores but no bf16 ones. ``torch.cuda.is_bf16_supported()`` is not the test: it also
      answers True where bf16 is only emulated (a T4), and so does the ``Trainer``'s check, which
      would then train in slow, emulated bf16.

    ``device`` defaults to the GPU when there is one. The result is the mode's name (a ``str``);
    ``.reason`` says why, e.g. ``print(p, "-", p.reason)``.
    """
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major >= 8:
            return Precision("bf16", f"bf16: this GPU (compute capability {major}.{minor}) has bf16 tensor cores")
        return Precision("fp16", f"fp16 with a GradScaler: this GPU (compute capability {major}.{minor}) has fp16 "
                                 "but no bf16 tensor cores (those start at 8.0)")
    if device.type != "cpu":
        raise ValueError(f"pick_precision knows the CPU and CUDA GPUs, got device {device}")
    native, why = cpu_bf16_native()
    if native:
        return Precision("bf16", f"bf16: {why}")
    return Precision("no", f"fp32: {why}, so bf16 autocast would be emulated, slower than fp32")


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
