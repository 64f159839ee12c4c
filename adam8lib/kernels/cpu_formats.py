"""The ``"cpu"`` Adam step of the FP8 and 4-bit state formats (lesson 12): the C++ kernel of
:mod:`adam8lib.kernels.cpu`, bit for bit the reference step (:func:`adam8lib.kernels.reference.format_reference_step`).

One kernel, three codings. What the 8-bit kernel needs from a format is only (a) the value of each
code before scaling (a 256-entry "map") and (b) the code of each normalized fp32 value, which it
reads from an exact table sampled from the spec (:mod:`adam8lib.kernels.code_table`). Here the
spec is the format's own :meth:`adam8lib.formats.MomentFormat.code` (:func:`moment_tables`):

* ``"fp8"`` runs the **8-bit kernel unchanged**: the map is the 256 float8 e4m3 bytes / 448 (not
  sorted; NaN at 0x7F/0xFF, which no step writes), and the table samples ``(x * 448).to(e4m3)``
  with the keep-sign rule. Nothing in the kernel needs a sorted map or a particular code of 0;
  only the inline MKL root (and with it the pipelined AVX-512 loop) needs ``v >= 0``, which a
  map with negative values does not promise: each FP8 step checks that no ``v`` byte is above
  0x80 (-0.0; no step writes one, a corrupt checkpoint could) and else calls MKL's ``vmsSqrt``
  per tile, as a machine whose MKL root is not reproduced does.
* ``"4bit"`` and ``"4bit-naive"`` run the kernel's 4-bit entry (``adam4bit_step_cpu``, at the end
  ``csrc/adam4bit.h``, built on the 8-bit pieces): each tile unpacks its two-codes-per-byte states, runs
  the 8-bit tile on them (blockwise scales: ``m``, and ``v`` of a vector) and packs them again;
  ``v`` of a matrix has rank-1 scales, so a first pass finds the new row and column maxima and a
  second does the step (with the same per-element helpers, AVX2 loops). ``v`` of a tensor of three or more dimensions (rank-1 over every axis) runs the
  reference step here instead (:func:`fourbit_step_cpu` says so).

The ``v`` tables sample ``code(x + 0.0)``: the kernel marks a ``v`` reset by the non-finite rule
as -0.0 (the reference stores +0.0), and a real new ``v`` is never -0.0, so adding +0.0 changes
nothing else (it matters for FP8, whose -0.0 has a byte of its own).
"""

from __future__ import annotations

import functools
import inspect
import math

import torch

from ..formats import FP8_MAX, FP8_TINY, MomentFormat, StateFormat
from ..quant import map_fingerprint, nearest_code
from . import register_adam_step
from .code_table import CodeTable, encode_table
from .contract import check_plain_tensor, check_step, is_usual_tensor
from .reference import format_reference_step
from .cpu_args import DTYPE_CODES, adam_scalars, check_memory, kernel_grad, table_args
from .cpu_build import load_extension
from .cpu_rounding import mkl_sqrt_inline

__all__ = ["moment_tables", "fp8_step_cpu", "fourbit_step_cpu"]

#: Which loops the steps run: None the widest this build has, 0 scalar only, 1 AVX2, 2 AVX-512
#: (as :func:`adam8lib.kernels.cpu.adam8bit_step`'s ``simd``; the tests run each, same bits).
SIMD: int | None = None


@functools.lru_cache(maxsize=32)
def moment_table(moment: MomentFormat, is_v: bool) -> CodeTable:
    """The exact table of ``moment.code`` (of ``code(x + 0.0)`` for ``v``: see the module
    docstring), with the code values the kernel decodes by; cached on disk by the source of
    :meth:`MomentFormat.code` and what it depends on (the map's bits and ``nearest_code``'s source, the
    rule, FP8's constants)."""
    coding = "e4m3fn" if moment.coding == "fp8" else map_fingerprint(moment.qmap()) + inspect.getsource(nearest_code)
    spec = "\n".join([inspect.getsource(MomentFormat.code), coding, f"bits={moment.bits}", f"keep_sign={moment.keep_sign}",
                      f"FP8_MAX={FP8_MAX!r} FP8_TINY={FP8_TINY!r}", "v: x + 0.0" if is_v else "m"])
    encode = (lambda x: moment.code(x + 0.0)) if is_v else moment.code
    return encode_table(moment.decode_values(), encode, spec.encode())


def moment_tables(fmt: StateFormat) -> tuple[CodeTable, CodeTable]:
    """The tables of ``m`` and ``v`` of a format (see :func:`moment_table`)."""
    return moment_table(fmt.m, False), moment_table(fmt.v, True)


def _check(p: torch.Tensor, g: torch.Tensor, state: dict, fmt: StateFormat, shape: tuple[int, ...]) -> tuple:
    """TypeError/ValueError for anything the kernel must not touch (before any pointer is read);
    returns the four state tensors."""
    tensors = {"p": p, "g": g, **{k: state[k] for k in ("state1", "state2", "absmax1", "absmax2")}}
    spec = fmt.state_spec(shape)
    n = math.prod(shape)
    for name, t in tensors.items():
        if not is_usual_tensor(t):
            check_plain_tensor(t, name)
        if t.device.type != "cpu":
            raise ValueError(f"the cpu backend needs CPU tensors; {name} is on {t.device}")
        if t.ndim != 1 or not t.is_contiguous():
            raise ValueError(f"{name} must be a flat contiguous 1-D tensor, got shape {tuple(t.shape)}")
        size, dtype = spec[name] if name in spec else (n, p.dtype if name == "p" else t.dtype)
        if t.numel() != size or t.dtype != dtype:
            raise ValueError(f"{name} must be {size} elements of {dtype}, got {t.numel()} of {t.dtype}")
        if n:
            check_memory(t, name)
    if p.dtype not in DTYPE_CODES or not g.is_floating_point():
        raise TypeError(f"p must be fp32, bf16 or fp16 and g floating point, got {p.dtype} and {g.dtype}")
    if not fmt.one_blocksize:
        raise ValueError("the cpu kernels need one block size for m and v")
    return tuple(tensors[k] for k in ("state1", "state2", "absmax1", "absmax2"))


@torch.compiler.disable
@torch.no_grad()
def fp8_step_cpu(p: torch.Tensor, g: torch.Tensor, state: dict, fmt: StateFormat, *, shape: tuple[int, ...],
                 step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """One step of the ``"fp8"`` format on flat CPU tensors, in place: the 8-bit kernel with FP8's
    map and tables (the module docstring)."""
    if fmt.m.coding != "fp8" or fmt.v.coding != "fp8" or fmt.m.rank1 or fmt.v.rank1:
        raise ValueError(f"fp8_step_cpu runs the blockwise fp8 coding, not {fmt.fingerprint()}")
    s1, s2, a1, a2 = _check(p, g, state, fmt, shape)
    check_step(step)
    lib = load_extension()
    tables, maps, modes = table_args(*moment_tables(fmt), True, SIMD)  # (tables: kept alive for the call)
    if modes[2] is not None and s2.numel() and int(s2.numpy().max()) <= 0x80:  # no v byte below -0.0 (nor NaN)
        modes = (*modes[:4], mkl_sqrt_inline(), *modes[5:])
    g = kernel_grad(p, g)
    decay, bc2_sqrt, neg_step_size, inv_bc2_sqrt = adam_scalars(step, lr, beta1, beta2, weight_decay)
    status = lib.adam8bit_step_cpu(
        p.data_ptr(), g.data_ptr(), DTYPE_CODES[p.dtype], DTYPE_CODES[g.dtype], s1.data_ptr(), s2.data_ptr(),
        a1.data_ptr(), a2.data_ptr(), p.numel(), fmt.m.blocksize, *maps,
        beta1, 1.0 - beta1, beta2, 1.0 - beta2, decay, bc2_sqrt, eps, neg_step_size, inv_bc2_sqrt, *modes)
    if status != 0:
        raise RuntimeError(f"cpu kernel rejected its arguments (status {status})")


@torch.compiler.disable
@torch.no_grad()
def fourbit_step_cpu(p: torch.Tensor, g: torch.Tensor, state: dict, fmt: StateFormat, *, shape: tuple[int, ...],
                     step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """One step of a 4-bit format (``"4bit"``, ``"4bit-naive"``, or any with 4-bit map codes) on
    flat CPU tensors, in place. ``v`` with rank-1 scales over three or more axes: the reference
    step (decode, fp32 update, encode), the same result."""
    for moment in (fmt.m, fmt.v):
        if moment.coding != "map" or moment.bits != 4 or moment.rank1 and moment is fmt.m:
            raise ValueError(f"fourbit_step_cpu runs 4-bit map codes (rank-1 for v only), not {fmt.fingerprint()}")
    s1, s2, a1, a2 = _check(p, g, state, fmt, shape)
    check_step(step)
    rank1 = fmt.v.uses_rank1(shape)
    if rank1 and len(shape) > 2:
        return format_reference_step(p, g, state, fmt, shape=shape, step=step, lr=lr, beta1=beta1, beta2=beta2,
                                     eps=eps, weight_decay=weight_decay)
    lib = load_extension()
    tables, maps, modes = table_args(*moment_tables(fmt), True, SIMD)  # (tables: kept alive for the call)
    fused, _, mkl_sqrt, mkl_mode, inline_root, simd, threads = modes
    g = kernel_grad(p, g)
    decay, bc2_sqrt, neg_step_size, _ = adam_scalars(step, lr, beta1, beta2, weight_decay)
    rows, cols = shape if rank1 else (0, 0)
    status = lib.adam4bit_step_cpu(
        p.data_ptr(), g.data_ptr(), DTYPE_CODES[p.dtype], DTYPE_CODES[g.dtype], s1.data_ptr(), s2.data_ptr(),
        a1.data_ptr(), a2.data_ptr(), p.numel(), fmt.m.blocksize, rows, cols, *maps,
        beta1, 1.0 - beta1, beta2, 1.0 - beta2, decay, bc2_sqrt, eps, neg_step_size,
        fused, mkl_sqrt, mkl_mode, inline_root, simd, threads)
    if status != 0:
        raise RuntimeError(f"cpu kernel rejected its arguments (status {status})")


register_adam_step("fp8", "cpu", fp8_step_cpu)
register_adam_step("4bit", "cpu", fourbit_step_cpu)
register_adam_step("4bit-naive", "cpu", fourbit_step_cpu)
