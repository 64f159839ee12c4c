"""The ``"cpu"`` and ``"cpu_fast"`` backends: the 8-bit Adam step as a small C++ kernel (OpenMP + SIMD).

The same kernel is the ``"cpu"`` step of the other state formats (:mod:`adam8lib.kernels.cpu_formats`,
registered from here): ``"fp8"`` runs the 8-bit loops unchanged with FP8's 256 code values as the
map and a table sampled from the format's code function; ``"4bit"``/``"4bit-naive"`` run a 4-bit
loop of the same source (two codes per byte, rank-1 scales for ``v`` of a matrix) on the same
per-element helpers. Both are bit for bit the reference step of their format. The other rules of
the family (Lion, AdEMAMix, RMSprop, ...) run the rule template on the same pieces
(:mod:`adam8lib.kernels.cpu_rules`).

``"cpu"``: the same maths as :mod:`adam8lib.kernels.reference`, bit for bit (codes, absmax,
parameters), in one pass over memory per block instead of a dozen chunk-sized temporaries
(bench/README.md has the numbers). ``"cpu_fast"`` (``exact=False``, asked for by name, never
picked by ``"auto"``): the same codes and absmax, but the parameter update uses the IEEE
square root and a multiply by ``1/sqrt(1 - beta2^t)`` instead of torch's MKL square root and a
division, so the parameters differ from the reference by about an ulp (tolerance tested). The
kernel is ``csrc/adam8bit.h`` (entry points in ``csrc/step_cpu.cpp``); read it next to the
reference: each scalar line there is one line of the reference, and the AVX2/AVX-512 loops do the
same 8 or 16 elements at a time. Building and loading: :mod:`.cpu_build`; torch's rounding:
:mod:`.cpu_rounding`.

Safe to call from anywhere
    Every scalar goes to C by value; the only pointers are the data of the tensors passed in
    (and of the cached tables), alive for the call. Anything the kernel must not read (a
    tensor subclass such as DTensor, a meta, sparse or non-contiguous tensor) raises
    TypeError/ValueError first. Under ``torch.compile`` the step runs eagerly
    (``torch.compiler.disable``: a graph break).

Exact nearest code, fast
    :mod:`adam8lib.kernels.code_table` samples the reference's ``nearest_code`` once per map
    (or any code function: :func:`~adam8lib.kernels.code_table.encode_table`, as FP8 and 4 bits do)
    into a table indexed by the top 16 bits of a sortable key of ``x``; the kernel needs one
    table load and one integer compare per value and returns exactly the reference's code.
    Dequantizing needs no gather on CPUs with AVX-512 VBMI: the map's 256 fp32 values are
    held as four byte planes and looked up 64 codes at a time with byte shuffles.

The non-finite rule
    An element whose new ``m`` or ``v`` is not finite (a NaN/Inf gradient, or one so large
    that ``g*g`` overflows) restarts from ``m = v = 0`` and keeps its parameter, as in the
    reference; absmax is taken after that, so it stays finite.

Rounding
    torch's ``add_(g, alpha=a)`` and ``addcmul_`` use fused multiply-adds on AVX2/AVX-512
    builds (:func:`torch_uses_fma` asks this torch build once), and ``torch.sqrt`` on x86
    Linux wheels is Intel MKL's ``vmsSqrt``, which is not always correctly rounded
    (:func:`torch_sqrt` finds it); the kernel does the same, so even the parameters match:
    with AVX-512 it computes MKL's algorithm inline (MKL has one for Intel's AVX-512 CPUs and
    another for the rest, AMD's included; :func:`mkl_sqrt_inline` finds the one that equals
    ``torch.sqrt`` bit for bit here), else it calls ``vmsSqrt`` on each tile.
"""

from __future__ import annotations

import ctypes

import torch

from . import register_backend
from .code_table import BUCKET_BITS, CodeTable, cache_root, code_table  # noqa: F401 (re-exported)
from .contract import check_each, check_step, check_step_args
from .cpu_args import DTYPE_CODES, adam_scalars, check_memory, kernel_grad, table_args
from .cpu_build import (  # noqa: F401 (re-exported: this module was their home)
    CFLAGS, LDFLAGS, SOURCE, SOURCES, build_directory, byte_planes, knockout_build, load_extension, simd_level,
    supports, unavailable_reason, using_build)
from .cpu_rounding import MKL_ROOTS, MKL_VML_MODE, mkl_sqrt_inline, torch_sqrt  # noqa: F401 (re-exported)
from .reference import torch_uses_fma  # noqa: F401 (re-exported)

__all__ = ["adam8bit_step", "adam8bit_step_fast", "adam8bit_step_many", "code_table", "CodeTable", "torch_uses_fma",
           "load_extension", "supports", "unavailable_reason", "SOURCE"]

# ---------------------------------------------------------------------------------------
# The step
# ---------------------------------------------------------------------------------------

_NAMES = ("p", "g", "state1", "state2", "absmax1", "absmax2", "qmap1", "qmap2")


def _check(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, blocksize, *, maps_checked=False) -> None:
    """TypeError/ValueError for anything the kernel must not touch, before any data pointer is read:
    the shared backend contract (:func:`adam8lib.kernels.contract.check_step_args`), plus CPU tensors
    whose memory is really there (``maps_checked``: the caller checked qmap1/qmap2's memory once
    for several calls)."""
    check_step_args(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, blocksize=blocksize)
    if p.device.type != "cpu":
        raise ValueError(f"the cpu backend needs CPU tensors; p is on {p.device}")
    if p.numel():
        tensors = (p, g, state1, state2, absmax1, absmax2) if maps_checked else (
            p, g, state1, state2, absmax1, absmax2, qmap1, qmap2)
        for name, t in zip(_NAMES, tensors):
            check_memory(t, name)


@torch.compiler.disable
@torch.no_grad()
def adam8bit_step(
    p: torch.Tensor,
    g: torch.Tensor,
    state1: torch.Tensor,
    state2: torch.Tensor,
    absmax1: torch.Tensor,
    absmax2: torch.Tensor,
    qmap1: torch.Tensor,
    qmap2: torch.Tensor,
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    blocksize: int,
    chunk_size: int | None = None,  # accepted for the reference's signature; blocks are the unit here
    simd: int | None = None,
    exact: bool = True,
) -> None:
    """One 8-bit Adam/AdamW step, in place, on flat contiguous CPU tensors (see the reference).

    ``exact=True`` (the ``"cpu"`` backend): bit-identical to the reference backend, parameters
    included. ``exact=False`` (the ``"cpu_fast"`` backend): the same codes and absmax (the
    moments are computed identically), but the parameter update uses the IEEE square root and
    multiplies by ``1/sqrt(1 - beta2^t)`` (fused with ``+ eps``) instead of torch's MKL square
    root and a division; the parameters then differ from the reference by about an ulp of the
    update (tests/kernels/test_cpu.py states the tolerance).

    ``simd`` picks the kernel's loops: 0 scalar only, 1 AVX2, 2 AVX-512, None the best this
    build has (:func:`simd_level`). They all give the same result (tested).

    Runs eagerly under ``torch.compile`` (``torch.compiler.disable``: a graph break), so it
    always sees real tensors; every scalar goes to C by value.
    """
    _check(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, blocksize)
    check_step(step)
    lib = load_extension()
    tables, maps, modes = _shared_args(qmap1, qmap2, exact, simd)  # (tables: kept alive for the call)
    g = kernel_grad(p, g)
    decay, bias_correction2_sqrt, neg_step_size, inv_bc2_sqrt = adam_scalars(step, lr, beta1, beta2, weight_decay)
    status = lib.adam8bit_step_cpu(
        p.data_ptr(), g.data_ptr(), DTYPE_CODES[p.dtype], DTYPE_CODES[g.dtype],
        state1.data_ptr(), state2.data_ptr(), absmax1.data_ptr(), absmax2.data_ptr(), p.numel(), blocksize, *maps,
        beta1, 1.0 - beta1, beta2, 1.0 - beta2, decay, bias_correction2_sqrt, eps, neg_step_size, inv_bc2_sqrt,
        *modes,
    )
    if status != 0:
        raise RuntimeError(f"cpu kernel rejected its arguments (status {status})")


@torch.compiler.disable
@torch.no_grad()
def adam8bit_step_many(
    tensors,
    qmap1: torch.Tensor,
    qmap2: torch.Tensor,
    *,
    steps,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    blocksize: int,
    simd: int | None = None,
    exact: bool = True,
) -> None:
    """:func:`adam8bit_step` for several tensors in one call into the kernel.

    ``tensors``: a sequence of ``(p, g, state1, state2, absmax1, absmax2)``, each as
    :func:`adam8bit_step` takes them; ``steps``: each one's step count. The maps and the other
    hyperparameters are shared (one parameter group). Every tensor is checked before any is
    changed (TypeError/ValueError naming the tensor's position); each is then stepped exactly
    as :func:`adam8bit_step` would step it, bit for bit. What this saves is Python: one call
    for the group instead of one per tensor (see "Each parameter tensor's own cost" in
    bench/README.md).
    """
    tensors, steps = check_each(tensors, steps,
                                lambda item, step: _check(*item, qmap1, qmap2, blocksize, maps_checked=True))
    if not tensors:
        return
    check_memory(qmap1, "qmap1")  # once for all tensors (the contract checked them with each)
    check_memory(qmap2, "qmap2")
    lib = load_extension()
    tables, maps, modes = _shared_args(qmap1, qmap2, exact, simd)  # (tables: kept alive for the call)
    grads = [kernel_grad(p, g) for p, g, *_ in tensors]  # (kept alive for the call)
    count = len(tensors)
    pointers = [(ctypes.c_void_p * count)(*(t.data_ptr() for t in column))
                for column in zip(*((item[0], grad, *item[2:]) for item, grad in zip(tensors, grads)))]
    scalars = [adam_scalars(step, lr, beta1, beta2, weight_decay) for step in steps]
    decay, bc2_sqrt, neg_step, inv_bc2_sqrt = ((ctypes.c_float * count)(*column) for column in zip(*scalars))
    status = lib.adam8bit_step_cpu_many(
        count, pointers[0], pointers[1],
        (ctypes.c_int * count)(*(DTYPE_CODES[item[0].dtype] for item in tensors)),
        (ctypes.c_int * count)(*(DTYPE_CODES[grad.dtype] for grad in grads)),
        *pointers[2:], (ctypes.c_int64 * count)(*(item[0].numel() for item in tensors)), blocksize, *maps,
        beta1, 1.0 - beta1, beta2, 1.0 - beta2, decay, bc2_sqrt, eps, neg_step, inv_bc2_sqrt, *modes,
    )
    if status != 0:
        raise RuntimeError(f"cpu kernel rejected its arguments (status {status})")

def _shared_args(qmap1: torch.Tensor, qmap2: torch.Tensor, exact: bool, simd: int | None) -> tuple[tuple, tuple, tuple]:
    """The kernel arguments every call shares: the two maps with their nearest-code tables (both
    states keep their signs when requantized, as in the reference), and the rounding, sqrt and
    loop choices that follow the last scalar. Returns ``(tables, map arguments, mode arguments)``;
    the caller holds ``tables`` until the kernel returns (the pointers are into them)."""
    return table_args(code_table(qmap1, keep_sign=True), code_table(qmap2, keep_sign=True), exact, simd)



def adam8bit_step_many_fast(*args, **kwargs) -> None:
    """The ``"cpu_fast"`` backend's :func:`adam8bit_step_many` (``exact=False``)."""
    kwargs.pop("exact", None)
    adam8bit_step_many(*args, exact=False, **kwargs)


def adam8bit_step_fast(*args, **kwargs) -> None:
    """The ``"cpu_fast"`` backend: :func:`adam8bit_step` with ``exact=False`` (not bit-identical
    parameters; same states). Never chosen by ``"auto"``: ask for it by name."""
    kwargs.pop("exact", None)
    adam8bit_step(*args, exact=False, **kwargs)


register_backend("cpu", adam8bit_step, supports, step_many=adam8bit_step_many)
register_backend("cpu_fast", adam8bit_step_fast, supports, step_many=adam8bit_step_many_fast)

from . import cpu_formats  # noqa: E402,F401 (registers the "cpu" steps of the fp8 and 4-bit formats)
from . import cpu_rules  # noqa: E402,F401 (registers the "cpu" steps of the other rules: Lion, AdEMAMix, ...)
