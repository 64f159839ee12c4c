"""Checks for workbook 08 · Triton kernels (run on a GPU, or on the CPU with ``TRITON_INTERPRET=1``).

The check launches the learner's ``@triton.jit`` kernel itself, one program per quantization
block (``grid = (number_of_blocks,)``, ``BLOCK = blocksize``), on small inputs with a ragged
tail. Inputs and outputs live inside larger buffers filled with sentinels, so a kernel that
reads or writes past ``n`` (no mask) is caught instead of silently corrupting memory.
"""

from __future__ import annotations

import os

import torch

from ...quant import dequantize_blockwise, dynamic_map, num_blocks, quantize_blockwise
from ._common import assert_close, call, fail, passed, require_callable
from ._variants import diagnose

__all__ = ["check_absmax_kernel", "check_dequantize_kernel"]

_PAD = 512  # sentinel elements after every buffer
_SIZES = [(1000, 256), (256, 256), (5, 64), (4097, 512), (300, 128)]


def _device_for(kernel) -> torch.device:
    """cuda when there is a GPU; otherwise the kernel must have been built in interpreter mode."""
    if not hasattr(kernel, "__getitem__"):
        fail(f"{getattr(kernel, '__name__', kernel)!r} is not a Triton kernel.",
             hint="decorate the kernel function with @triton.jit (and launch it as kernel[grid](...)).")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if type(kernel).__name__ != "InterpretedFunction":
        fail("this kernel was compiled for a GPU, but there is none here.",
             hint="run the setup cell first: on a CPU it sets TRITON_INTERPRET=1, which must be set BEFORE the "
                  f"@triton.jit cell runs (now TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r}).")
    return torch.device("cpu")


def _launch(kernel, grid, *args, **kwargs) -> None:
    """Launch the learner's kernel; a stub's NotImplementedError (wrapped by the interpreter) is named."""
    try:
        call(kernel[grid], *args, **kwargs)
    except AssertionError as exc:
        if "NotImplementedError" in str(exc):
            fail(f"{getattr(getattr(kernel, 'fn', kernel), '__name__', 'the kernel')} is not implemented yet: replace "
                 "the `raise NotImplementedError(...)` line in the exercise cell with the kernel's body, run that "
                 "cell, then run this check again.")
        raise


def _padded(values: torch.Tensor, fill) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view): the view holds ``values``; the buffer continues with ``_PAD`` sentinels."""
    buf = torch.full((values.numel() + _PAD,), fill, dtype=values.dtype, device=values.device)
    buf[: values.numel()] = values.reshape(-1)
    return buf, buf[: values.numel()]


# ---------------------------------------------------------------------------- 08.1
def check_absmax_kernel(absmax_kernel) -> None:
    """``absmax_kernel[(nb,)](x_ptr, absmax_ptr, n, BLOCK=blocksize)`` writes max|x| of each block."""
    require_callable(absmax_kernel, "absmax_kernel")
    device = _device_for(absmax_kernel)
    gen = torch.Generator().manual_seed(8)
    for n, bs in _SIZES:
        x = torch.randn(n, generator=gen)
        x[n // 3] = -7.5  # a negative value with the largest magnitude of its block
        if n >= 2 * bs:
            x[bs: 2 * bs] = 0.0  # an all-zero block
        want = quantize_blockwise(x, None, bs)[1]
        nb = num_blocks(n, bs)
        _, x_view = _padded(x.to(device), 1e6)  # reading past n would see 1e6
        out_buf, out = _padded(torch.zeros(nb, device=device), -1.0)
        _launch(absmax_kernel, (nb,), x_view, out, n, BLOCK=bs)
        what = f"absmax_kernel on {n} values, blocksize {bs} ({nb} blocks)"
        if bool((out_buf[nb:] != -1.0).any()):
            fail(f"{what} wrote past the {nb} absmax entries.", hint="program `pid` writes exactly one value: "
                                                                   "tl.store(absmax_ptr + pid, ...).")
        blocks = torch.nn.functional.pad(x, (0, nb * bs - n)).view(nb, bs)
        hint = diagnose(out.cpu(), [
            ("mask the load: the last block is ragged, so load with mask=offs < n and other=0.0 "
             "(without it the kernel reads past the end of x).",
             lambda: torch.cat([want[:-1], torch.tensor([1e6])])),
            ("absmax is the largest MAGNITUDE: tl.max(tl.abs(x), axis=0), not tl.max(x).",
             lambda: blocks.amax(dim=1)),
            ("each program handles its own block: offsets = pid * BLOCK + tl.arange(0, BLOCK).",
             lambda: blocks[0].abs().amax().expand(nb)),
        ], "absmax[pid] = max |x| over offsets pid*BLOCK ... pid*BLOCK + BLOCK - 1 (masked at n).", rtol=0, atol=0)
        assert_close(out.cpu(), want, what=what, hint=hint, rtol=0, atol=0)
    passed("Exercise 08.1 · A Triton absmax-per-block kernel")


# ---------------------------------------------------------------------------- 08.2
def check_dequantize_kernel(dequantize_kernel) -> None:
    """``dequantize_kernel[(nb,)](codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, BLOCK=blocksize)``."""
    require_callable(dequantize_kernel, "dequantize_kernel")
    device = _device_for(dequantize_kernel)
    gen = torch.Generator().manual_seed(80)
    for signed in (True, False):
        qmap = dynamic_map(signed)
        for n, bs in _SIZES:
            x = torch.randn(n, generator=gen)
            x = x if signed else x.abs()
            if n >= 2 * bs:
                x[:bs] = 0.0  # an all-zero block
            codes, absmax = quantize_blockwise(x, qmap, bs)
            want = dequantize_blockwise(codes, absmax, qmap, bs)
            nb = absmax.numel()
            _, codes_view = _padded(codes.to(device), 255)
            _, absmax_view = _padded(absmax.to(device), 1e6)
            out_buf, out = _padded(torch.zeros(n, device=device), -12345.0)
            _launch(dequantize_kernel, (nb,), codes_view, absmax_view, qmap.to(device), out, n, BLOCK=bs)
            what = f"dequantize_kernel on {n} codes, blocksize {bs} ({nb} blocks, {'signed' if signed else 'unsigned'} map)"
            if bool((out_buf[n:] != -12345.0).any()):
                fail(f"{what} wrote past the end of the output.",
                     hint="mask the store (and the loads): mask = offs < n — the last block is ragged.")
            idx = torch.arange(n)
            hint = diagnose(out.cpu(), [
                ("look the codes up in the map: tl.load(qmap_ptr + codes) (codes are indices, not values).",
                 lambda: codes.float() * absmax[idx // bs]),
                ("multiply by the block's absmax: tl.load(absmax_ptr + pid).", lambda: qmap[codes.long()]),
                ("one absmax per block: program pid uses absmax[pid], not absmax[0].",
                 lambda: qmap[codes.long()] * absmax[0]),
            ], "out[i] = qmap[codes[i]] * absmax[pid] for offsets i = pid*BLOCK + tl.arange(0, BLOCK) (masked).",
                rtol=0, atol=0)
            assert_close(out.cpu(), want, what=what, hint=hint, rtol=1e-6, atol=0)
    passed("Exercise 08.2 · A Triton blockwise dequantization kernel")
