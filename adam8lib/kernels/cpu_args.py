"""What every call into the C++ CPU steps passes besides its tensors: dtype codes, the gradient as the
kernel reads it, storage that is really there, and the map/rounding/loop arguments that follow a
call's last scalar (:func:`table_args`). Shared by :mod:`.cpu` (8-bit Adam), :mod:`.cpu_formats`
(FP8 and 4-bit Adam) and :mod:`.cpu_rules` (the rule template)."""

from __future__ import annotations

import torch

from .code_table import CodeTable
from .cpu_build import simd_level
from .cpu_rounding import MKL_VML_MODE, mkl_sqrt_inline, torch_sqrt
from .reference import bias_corrections, torch_uses_fma

__all__ = ["DTYPE_CODES", "check_memory", "kernel_grad", "table_args", "adam_scalars"]

#: dtype codes of the C entry points
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def check_memory(t: torch.Tensor, name: str) -> None:
    """ValueError if ``t`` has elements but its storage has no memory (freed, e.g. by
    ``untyped_storage().resize_(0)`` as FSDP does between uses): the kernel would read address 0.
    Cheap first test: the data pointer is the storage's plus the offset, so it can only equal the
    offset alone when the storage's pointer is 0."""
    if t.data_ptr() == t.storage_offset() * t.element_size() and t.numel() and t.untyped_storage().data_ptr() == 0:
        raise ValueError(f"{name} has no storage (data pointer 0): its memory was freed")


def kernel_grad(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The gradient as the kernel reads it: p's dtype or fp32 (exact for bf16/fp16; fp64 grads
    round as the reference's ``g.float()`` does)."""
    return g.float() if g.dtype != p.dtype and g.dtype != torch.float32 else g


def table_args(t1: CodeTable, t2: CodeTable, exact: bool, simd: int | None) -> tuple[tuple, tuple, tuple]:
    """The kernel arguments an Adam call shares: the two tables (``qmap``, ``raw_steps``, NaN code
    each), and the rounding, sqrt and loop choices that follow the last scalar. Returns ``(tables,
    map arguments, mode arguments)``; the caller holds ``tables`` until the kernel returns (the
    pointers are into them)."""
    maps = (t1.qmap.data_ptr(), t1.raw_steps.data_ptr(), t1.nan_code, t2.qmap.data_ptr(), t2.raw_steps.data_ptr(),
            t2.nan_code)
    modes = (torch_uses_fma(), bool(exact), torch_sqrt()[0] if exact else None, MKL_VML_MODE,
             mkl_sqrt_inline() if exact and t2.nonnegative else 0,  # v >= 0: no NaN from a negative v
             simd_level() if simd is None else simd, torch.get_num_threads())
    return (t1, t2), maps, modes


def adam_scalars(step: int, lr: float, beta1: float, beta2: float, weight_decay: float) -> tuple[float, float, float, float]:
    """(decay, sqrt(1 - beta2^t), -step_size, 1/sqrt(1 - beta2^t)) as the reference computes them
    (Python floats; ctypes rounds each to fp32 once, as torch rounds its kernels' scalars)."""
    step_size, bias_correction2_sqrt = bias_corrections(step, lr, beta1, beta2)
    decay = 1.0 - lr * weight_decay if weight_decay != 0 else 1.0  # p * 1.0 == p: no decay
    return decay, bias_correction2_sqrt, -step_size, 1.0 / bias_correction2_sqrt
