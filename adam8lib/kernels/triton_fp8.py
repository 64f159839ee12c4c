"""The ``"fp8"`` state format's fused Adam step in Triton: lesson 08's kernel (:mod:`adam8lib.kernels.triton`)
with float8 e4m3 bytes for codes (``FP8=True``): both moments e4m3 with one fp32 scale per block; the
map of each code is the table of every byte's value / 448 (:func:`fp8_table`), so decoding is the same
lookup. States bit for bit the reference step's in the interpreter (tests/kernels/test_triton_fp8.py)."""

from __future__ import annotations

import torch

from ..quant import check_blocksize
from . import register_adam_step
from . import triton as lesson
from .contract import check_step

__all__ = ["fp8_table", "fp8_step_triton"]


def fp8_table(device: torch.device | str) -> torch.Tensor:
    """fp32 value / 448 of each of the 256 float8 e4m3 bytes (NaN for 0x7F and 0xFF): the FP8
    format's decode as a table lookup, the same fp32 numbers as ``codes.view(e4m3).float() / 448``."""
    device = torch.device(device)
    table = _FP8_TABLES.get(device)
    if table is None:
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        table = _FP8_TABLES[device] = (codes.view(torch.float8_e4m3fn).float() / 448.0).to(device)
    return table


_FP8_TABLES: dict[torch.device, torch.Tensor] = {}


@torch.no_grad()
def fp8_step_triton(p: torch.Tensor, g: torch.Tensor, state1: torch.Tensor, state2: torch.Tensor,
                    absmax1: torch.Tensor, absmax2: torch.Tensor, *, step: int, lr: float, beta1: float,
                    beta2: float, eps: float, weight_decay: float, blocksize: int = 256,
                    tile: int | None = None, num_warps: int | None = None) -> None:
    """One fused Adam/AdamW step of the ``"fp8"`` state format (:data:`adam8lib.formats.FORMATS`):
    both moments float8 e4m3 bytes with one fp32 scale per block of ``blocksize``, in place. The
    8-bit kernel's tile with e4m3 coding: the same reference order of fp32 operations, so the states
    equal the reference step's (:func:`adam8lib.kernels.reference.format_reference_step`) bit for bit on the CPU."""
    check_blocksize(blocksize)
    n = p.numel()
    table = fp8_table(p.device)
    lesson.check_step_tensors(p, g, state1, state2, absmax1, absmax2, table, table, n, blocksize)
    check_step(step)
    lesson.check_runnable(p.device)
    if n == 0:
        return
    lesson.launch_one((p, g, state1, state2, absmax1, absmax2), table, table, (table, table, False),
                lesson.launch_config(blocksize, tile, num_warps), step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                weight_decay=weight_decay, blocksize=blocksize, fp8=True)


def _fp8_adam_step(p, g, state, fmt, *, shape, **hyperparameters) -> None:
    """:func:`fp8_step_triton` as the ``"fp8"`` format's fused step (:func:`adam8lib.kernels.register_adam_step`)."""
    fp8_step_triton(p, g, state["state1"], state["state2"], state["absmax1"], state["absmax2"],
                    blocksize=fmt.m.blocksize, **hyperparameters)


register_adam_step("fp8", "triton", _fp8_adam_step)
