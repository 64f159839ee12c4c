"""Muon (Jordan et al. 2024; torch.optim.Muon of torch >= 2.9): momentum, then Newton-Schulz
orthogonalization of the (2-D) update. Not elementwise: the orthogonalization mixes the whole matrix,
so the rule runs around the stored momentum, whatever its format, with no kernel of its own.

As torch 2.13's ``torch.optim.Muon`` (``_single_tensor_muon``), in this order::

    B <- lerp(B, g, 1 - momentum)                        (= momentum B + (1 - momentum) g)
    U <- lerp(g, B, momentum) if nesterov else B
    O <- NS(U)         (bf16: U / max(||U||_F, eps), then ns_steps quintic iterations with (a, b, c),
                        on the transpose when rows > columns)
    p <- p * (1 - lr * weight_decay)
    p <- p - adjusted_lr * O        adjusted_lr = lr * sqrt(max(1, rows / cols))  ("original", the default)
                                                = lr * 0.2 * sqrt(max(rows, cols)) ("match_rms_adamw")

Non-finite gradients (an addition: torch's Muon lets one NaN turn the whole matrix into NaN): an element
whose new momentum is not finite has its momentum reset to 0 and takes no part in the update (its
gradient counts as 0 there); its parameter is left unchanged that step (no update, no decay).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from .base import StateSpec, UpdateRule, check_int, check_number

#: torch.optim.Muon's defaults (torch/optim/_muon.py)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7
ADJUST_LR_FNS = (None, "original", "match_rms_adamw")


def newton_schulz(update: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float) -> torch.Tensor:
    """The quintic Newton-Schulz iteration of torch.optim.Muon, in bf16 (the same operations, so the same bits)."""
    a, b, c = coefficients
    x = update.bfloat16()
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    return x.T if tall else x


def adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: tuple[int, ...]) -> float:
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, rows / cols))
    return lr * 0.2 * math.sqrt(max(rows, cols))


class MuonRule(UpdateRule):
    name = "muon"
    states = (StateSpec("momentum_buffer", "m"),)
    hyperparameters = {"lr": 1e-3, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True,
                       "ns_coefficients": NS_COEFFICIENTS, "eps": NS_EPS, "ns_steps": NS_STEPS, "adjust_lr_fn": None}
    elementwise = False

    def check(self, group: Mapping[str, Any]) -> None:
        check_number(group["lr"], "lr")
        check_number(group["weight_decay"], "weight_decay")
        check_number(group["momentum"], "momentum")
        if not isinstance(group["nesterov"], bool):
            raise TypeError(f"nesterov must be a bool, got {type(group['nesterov']).__name__}")
        coefficients = group["ns_coefficients"]
        if not isinstance(coefficients, (tuple, list)) or len(coefficients) != 3:
            raise ValueError(f"ns_coefficients must be a tuple of 3 floats, got {coefficients!r}")
        for i, value in enumerate(coefficients):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"ns_coefficients[{i}] must be a finite number, got {value!r}")
        check_number(group["eps"], "eps")
        check_int(group["ns_steps"], "ns_steps", minimum=0)
        if group["ns_steps"] >= 100:
            raise ValueError(f"Invalid ns_steps: {group['ns_steps']} (must be < 100, as torch.optim.Muon)")
        if group["adjust_lr_fn"] not in ADJUST_LR_FNS:
            raise ValueError(f"Invalid adjust_lr_fn: {group['adjust_lr_fn']!r} (one of {ADJUST_LR_FNS})")

    def update(self, p, g, states, *, step, group):
        buf = states["momentum_buffer"]
        momentum = group["momentum"]
        buf.lerp_(g, 1 - momentum)
        bad = ~torch.isfinite(buf)
        any_bad = bool(bad.any())
        if any_bad:
            buf.masked_fill_(bad, 0.0)
            g = g.masked_fill(bad, 0.0)
        update = g.lerp(buf, momentum) if group["nesterov"] else buf
        update = newton_schulz(update, tuple(group["ns_coefficients"]), group["ns_steps"], group["eps"])
        old = p.clone() if any_bad else None
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.add_(update, alpha=-adjusted_lr(group["lr"], group["adjust_lr_fn"], tuple(p.shape)))
        return torch.where(bad, old, p) if any_bad else p
