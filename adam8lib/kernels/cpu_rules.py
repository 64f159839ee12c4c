"""The ``"cpu"`` fused steps of the family's elementwise rules: Lion, AdEMAMix, RMSprop, Adagrad, Adan (issues 35, 52).

One C++ template (``csrc/rules.h``): each rule's update is written once, on "lanes" of 1, 8 (AVX2) or 16
(AVX-512) floats with torch's rounding; decoding, the non-finite rule, torch's square root, the new
absmax and the exact nearest codes are shared with the 8-bit Adam kernel (``csrc/simd.h``,
``csrc/codes8.h``). Bit for bit the states and parameters of
:class:`adam8lib.quantized_state.QuantizedStateOptimizer`'s reference step, at every SIMD level
(:data:`SIMD`; tests/kernels/test_cpu_rules.py runs each).

What it accepts (:func:`~adam8lib.kernels.rule_args.accepts`): a state format whose moments are one byte per element with one
scale per block, the same block size for both (``"8bit"``, ``"fp8"``, or a user's format of that
layout); each state is coded with the table of its own moment format (:func:`state_tables`, sampled
from :meth:`adam8lib.formats.MomentFormat.code`, so the codes are the reference's, sign rule included).
A rule may have any number of states; one it keeps in fp32 (:attr:`adam8lib.rules.base.StateSpec.kept`,
Adan's previous gradient) comes as ``(values,)``, flat fp32, and is read and written as floats.
Registered in :mod:`adam8lib.kernels.registry` as ``(rule, that layout, "cpu")``; the calling convention
is the registry's: ``rule_step_cpu(p, g, states, *, rule, fmt, shape, step, group)``.

The layout it accepts and the scalars of each rule are the Triton template's too (:mod:`.rule_args`).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any, Mapping

import torch

from .code_table import CodeTable
from .contract import check_step
from .cpu_args import DTYPE_CODES, check_memory, kernel_grad
from .cpu_build import load_extension, simd_level, supports
from .cpu_formats import moment_table
from .cpu_rounding import MKL_VML_MODE, mkl_sqrt_inline, torch_sqrt
from .reference import torch_uses_fma
from .registry import register_step
from .rule_args import RULES, accepts, checked_tensors, rule_scalars

__all__ = ["RULES", "SIMD", "accepts", "rule_scalars", "rule_step_cpu", "state_tables"]

#: Which loops the steps run: None the widest this build has, 0 scalar only, 1 AVX2, 2 AVX-512.
SIMD: int | None = None


def state_tables(rule: Any, fmt: Any) -> list[CodeTable | None]:
    """The exact nearest-code table of each state of ``rule``, in its moment format (``m`` or ``v``); None for a
    state it keeps unquantized."""
    return [None if spec.kept is not None else moment_table(fmt.m if spec.stored_as == "m" else fmt.v, False)
            for spec in rule.states]


def _check(p: torch.Tensor, g: torch.Tensor, states, rule: Any, fmt: Any, shape: tuple[int, ...]) -> None:
    """TypeError/ValueError for anything the kernel must not touch, before a pointer is read: the templates'
    checks (:func:`~adam8lib.kernels.rule_args.checked_tensors`), CPU tensors whose memory is there."""
    tensors = checked_tensors(p, g, states, rule, fmt, shape, template="cpu", kept=("fp32",))
    for name, t in tensors:
        if t.device.type != "cpu":
            raise ValueError(f"the cpu backend needs CPU tensors; {name} is on {t.device}")
    if math.prod(shape):
        for name, t in tensors:
            check_memory(t, name)


@torch.compiler.disable
@torch.no_grad()
def rule_step_cpu(p: torch.Tensor, g: torch.Tensor, states, *, rule: Any, fmt: Any, shape: tuple[int, ...], step: int,
                  group: Mapping[str, Any], simd: int | None = None) -> None:
    """One step of ``rule`` (Lion, AdEMAMix, RMSprop, Adagrad, Adan) on flat CPU tensors, in place: the
    registry's calling convention (:mod:`adam8lib.kernels.registry`); ``simd`` as :data:`SIMD`."""
    _check(p, g, states, rule, fmt, shape)
    check_step(step)
    scalars = rule_scalars(rule.name, step, group)
    lib = load_extension()
    tables = state_tables(rule, fmt)
    g = kernel_grad(p, g)
    count = len(states)
    ptrs = ctypes.c_void_p * count
    mkl, _ = torch_sqrt()
    level = simd if simd is not None else (SIMD if SIMD is not None else simd_level())
    status = lib.rule_step_cpu(
        RULES[rule.name], p.data_ptr(), g.data_ptr(), DTYPE_CODES[p.dtype], DTYPE_CODES[g.dtype], p.numel(),
        fmt.m.blocksize, count, ptrs(*(s[0].data_ptr() for s in states)),  # (a kept state: its floats)
        ptrs(*(s[1].data_ptr() if len(s) == 2 else None for s in states)),
        ptrs(*(None if t is None else t.qmap.data_ptr() for t in tables)),
        ptrs(*(None if t is None else t.raw_steps.data_ptr() for t in tables)),
        (ctypes.c_int * count)(*(0 if t is None else t.nan_code for t in tables)),
        (ctypes.c_float * len(scalars))(*scalars), len(scalars),
        int(torch_uses_fma()), mkl, MKL_VML_MODE, mkl_sqrt_inline() if mkl is not None else 0, level,
        torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"cpu kernel rejected its arguments (status {status})")


for _name in RULES:
    register_step(_name, "cpu", rule_step_cpu, formats=accepts, supports=supports)
