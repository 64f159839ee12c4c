"""Exponential moving averages: Adam's first and second moments (lesson 02).

Adam keeps two running averages of the gradient ``g_t``::

    m_t = beta1 * m_{t-1} + (1 - beta1) * g_t          (first moment:  mean of g)
    v_t = beta2 * v_{t-1} + (1 - beta2) * g_t**2       (second moment: mean of g²)

Both start at 0, so early on they are biased towards 0: after ``t`` steps of a constant
``g`` the average is ``(1 - beta**t) * g``. Dividing by ``1 - beta**t`` removes that bias::

    m_hat = m_t / (1 - beta1**t)        v_hat = v_t / (1 - beta2**t)
"""

from __future__ import annotations

from typing import Iterable

import torch

__all__ = ["ema_update", "bias_correction", "ema_series", "adam_moments"]


def _check_beta(beta: float, name: str = "beta") -> None:
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"Invalid {name}: {beta} (must be in [0, 1))")


def ema_update(avg: torch.Tensor, x: torch.Tensor, beta: float) -> torch.Tensor:
    """One EMA step, returned as a new tensor: ``beta * avg + (1 - beta) * x``."""
    _check_beta(beta)
    return avg * beta + x * (1.0 - beta)


def bias_correction(beta: float, step: int) -> float:
    """The factor ``1 - beta**step`` that an EMA started at 0 must be divided by."""
    _check_beta(beta)
    if step < 1:
        raise ValueError(f"step counts from 1, got {step}")
    return 1.0 - beta**step


def ema_series(xs: Iterable[torch.Tensor] | torch.Tensor, beta: float, *, bias_correct: bool = False) -> torch.Tensor:
    """EMA of a whole stream (first dimension = time), stacked; optionally bias-corrected."""
    _check_beta(beta)
    out, avg = [], None
    for t, x in enumerate(xs, start=1):
        x = torch.as_tensor(x, dtype=torch.float32)
        avg = ema_update(torch.zeros_like(x) if avg is None else avg, x, beta)
        out.append(avg / bias_correction(beta, t) if bias_correct else avg)
    if not out:
        raise ValueError("ema_series needs at least one value")
    return torch.stack(out)


def adam_moments(
    m: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta1: float, beta2: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Adam's two moment updates: ``m`` tracks ``g`` with beta1, ``v`` tracks ``g*g`` with beta2."""
    _check_beta(beta1, "beta1")
    _check_beta(beta2, "beta2")
    return ema_update(m, g, beta1), ema_update(v, g * g, beta2)
