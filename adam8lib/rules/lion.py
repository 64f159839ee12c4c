"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): one state, a sign update.

As bitsandbytes 0.50.2's CPU step (``backends/cpu/ops.py``), in this order::

    p <- p * (1 - lr * weight_decay)                    (only if weight_decay > 0)
    p <- p - lr * sign(beta1 * m + (1 - beta1) * g)
    m <- beta2 * m + (1 - beta2) * g

Weight decay is **decoupled and scaled by lr** (``p *= 1 - lr * wd``), the semantics bitsandbytes
adopted in 0.50.0 (the paper's and lucidrains' lion-pytorch's); before 0.50.0 its 8-bit kernels
decayed by ``1 - wd`` without the learning rate. The momentum is signed: stored as ``"m"``.

For fp32 states bitsandbytes' 32-bit step forms the interpolation as ``m.mul(beta1).add(g, alpha=1 - beta1)``
(one fused multiply-add on AVX2 CPUs) instead of a sum of two products; :meth:`LionRule.update_unquantized`
does the same, so that small tensors match it bit for bit too.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .base import StateSpec, UpdateRule, check_betas, check_number


class LionRule(UpdateRule):
    name = "lion"
    states = (StateSpec("exp_avg", "m"),)
    hyperparameters = {"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.0}

    def check(self, group: Mapping[str, Any]) -> None:
        check_number(group["lr"], "lr")
        check_betas(group["betas"], 2)
        check_number(group["weight_decay"], "weight_decay")

    def update(self, p, g, states, *, step, group):
        m = states["exp_avg"]
        beta1, beta2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        if wd > 0.0:
            p.mul_(1.0 - lr * wd)
        p.add_(torch.sign(m.mul(beta1) + g.mul(1.0 - beta1)), alpha=-lr)
        m.mul_(beta2).add_(g, alpha=1.0 - beta2)
        return p

    def update_unquantized(self, p, g, states, *, step, group):
        m = states["exp_avg"]
        beta1, beta2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        if wd > 0.0:
            p.mul_(1.0 - lr * wd)
        p.add_(m.mul(beta1).add(g, alpha=1.0 - beta1).sign(), alpha=-lr)
        m.mul_(beta2).add_(g, alpha=1.0 - beta2)
        return p
