"""Matching torch's rounding in the C++ CPU steps: which square root ``torch.sqrt`` is here.

torch's ``add_(g, alpha=a)`` and ``addcmul_`` use fused multiply-adds on AVX2/AVX-512 builds
(:func:`adam8lib.kernels.reference.torch_uses_fma` asks this torch build once), and ``torch.sqrt``
on x86 Linux wheels is Intel MKL's ``vmsSqrt``, which is not always correctly rounded
(:func:`torch_sqrt` finds it); the kernels do the same, so even the parameters match: with
AVX-512 they compute MKL's algorithm inline (MKL has one for Intel's AVX-512 CPUs and another for
the rest, AMD's included; :func:`mkl_sqrt_inline` finds the one that equals ``torch.sqrt`` bit for
bit here), else they call ``vmsSqrt`` on each tile.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy
import torch

from .cpu_build import load_extension, mark_unavailable, simd_level
from .reference import probe_inputs, torch_uses_fma

__all__ = ["MKL_VML_MODE", "MKL_ROOTS", "torch_sqrt", "mkl_sqrt_inline"]

#: The mode torch passes to MKL's vector math (VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE).
MKL_VML_MODE = 0x2 | 0x140000 | 0x100


@functools.lru_cache(maxsize=None)
def torch_sqrt() -> tuple[int | None, str]:
    """How this torch build computes ``torch.sqrt`` on fp32: ``(None, "ieee")`` when it is the
    correctly rounded square root, ``(address of vmsSqrt, "mkl")`` when it is Intel MKL's
    vector sqrt (x86 Linux wheels), which is not always correctly rounded. ImportError if
    neither reproduces it (then the kernel could not match the reference bit for bit)."""
    gen = torch.Generator().manual_seed(1)
    # v-like values, and random bit patterns over every non-negative finite float (denormals included):
    # MKL's generic code (AMD CPUs, or MKL_ENABLE_INSTRUCTIONS=AVX2) is correctly rounded on [0, 1]
    # samples but not on about 1 in 1,200 patterns of the whole range, so a narrow probe would take
    # it for the IEEE root
    patterns = torch.randint(0, 0x7F800000, (1 << 18,), generator=gen, dtype=torch.int32).view(torch.float32)
    x = torch.cat([probe_inputs()[2], torch.rand(4099, generator=gen) ** 4, patterns])
    expected = torch.sqrt(x)
    if bool((torch.from_numpy(numpy.sqrt(x.numpy())) == expected).all()):
        return None, "ieee"
    for lib_name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
        path = Path(torch.__file__).parent / "lib" / lib_name
        if not path.exists():
            continue
        try:
            vms_sqrt = ctypes.CDLL(str(path)).vmsSqrt
        except (OSError, AttributeError):
            continue
        vms_sqrt.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        vms_sqrt.restype = None
        out = torch.empty_like(x)
        vms_sqrt(x.numel(), x.data_ptr(), out.data_ptr(), MKL_VML_MODE)
        if torch.equal(out, expected):
            return ctypes.cast(vms_sqrt, ctypes.c_void_p).value, "mkl"
    raise ImportError("torch.sqrt is neither IEEE sqrt nor MKL's vmsSqrt here; cpu backend disabled")


MKL_ROOTS = {1: "MKL's AVX-512 code (vrsqrt14ps, one fused correction)",
              2: "MKL's generic SSE code (rsqrtps, two Newton steps without fused multiply-adds)"}


@functools.lru_cache(maxsize=None)
def mkl_sqrt_inline() -> int:
    """Which of MKL's square-root algorithms the kernel may compute inline instead of calling
    ``vmsSqrt`` per tile: 0 for none, else a key of :data:`MKL_ROOTS`. MKL chooses its code
    path by CPU (its AVX-512 code on Intel CPUs with AVX-512, its generic SSE code on others,
    AMD's included), so each is tried: it is used only if torch uses MKL's sqrt, the build has
    the loops it needs (AVX-512 for the first, AVX2 for the second), and the inline version
    equals ``torch.sqrt`` bit for bit on every probe: a million
    random non-negative bit patterns, every denormal, the range below 2^-78 where the AVX-512
    code rescales, the largest floats (where the SSE code takes its scalar path), powers of two
    and their neighbours, zeros and infinity."""
    if torch_sqrt()[1] != "mkl" or simd_level() < 1:
        return 0
    gen = torch.Generator().manual_seed(2)
    bits = torch.randint(0, 0x7F800001, (1 << 20,), generator=gen, dtype=torch.int64).to(torch.int32)
    denormals = torch.arange(1, 0x800000, dtype=torch.int32)
    largest = torch.arange(0x7F7FE000, 0x7F800000, dtype=torch.int32)
    powers = torch.tensor([2.0**k for k in range(-149, 128)], dtype=torch.float32)
    x = torch.cat([bits.view(torch.float32), denormals.view(torch.float32), largest.view(torch.float32), powers,
                   torch.nextafter(powers, torch.tensor(0.0)), torch.nextafter(powers, torch.tensor(float("inf"))),
                   torch.rand(4096, generator=gen) * 2.0**-70, torch.tensor([0.0, -0.0, 1e-45, float("inf")])])
    expected = torch.sqrt(x).view(torch.int32)
    out = torch.empty_like(x)
    for root in MKL_ROOTS:  # (-1: no inline version of that one in this build)
        if load_extension().adam8bit_cpu_mkl_sqrt_inline(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                                                          ctypes.c_int64(x.numel()), ctypes.c_int(root)) != 0:
            continue
        if torch.equal(out.view(torch.int32), expected):
            return root
    return 0


try:  # can this torch build's rounding be reproduced? (else the CPU backends stay off, saying why)
    torch_uses_fma(), torch_sqrt()
except ImportError as exc:
    mark_unavailable(str(exc))
