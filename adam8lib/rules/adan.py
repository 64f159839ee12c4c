"""Adan (Xie et al. 2022, arXiv 2208.06677, "Adan: Adaptive Nesterov Momentum Algorithm"): four states.

As ``pytorch-optimizer`` 3.11.0's ``Adan`` (per-parameter path), in this order, with ``d = g - g_prev``::

    m <- beta1 m + (1 - beta1) g                    (exp_avg: EMA of the gradient)
    e <- beta2 e + (1 - beta2) d                    (exp_avg_diff: EMA of the gradient difference)
    u  = beta2 d + g
    n <- beta3 n + (1 - beta3) u^2                  (exp_avg_sq)
    den = sqrt(n) / sqrt(1 - beta3^t) + eps
    p <- p * (1 - lr wd)                            (only with weight_decouple)
    p <- p - lr / (1 - beta1^t) * m / den
    p <- p - lr beta2 / (1 - beta2^t) * e / den
    p <- p / (1 + lr wd)                            (without weight_decouple: the paper's proximal step)
    g_prev <- g

Betas in the code's convention (``m <- beta1 m + (1 - beta1) g``; the paper's beta_k is 1 - these), defaults
(0.98, 0.92, 0.99), lr 1e-3, eps 1e-8, weight_decay 0. Where it deviates from the paper's Algorithm 1 (as the
authors' code and pytorch-optimizer do): the EMAs start at 0 with bias corrections, not at m_0 = g_0,
v_1 = g_1 - g_0; on the first step ``g_prev`` is the gradient itself, so d = 0. Weight decay never enters the
gradient: the proximal ``p / (1 + lr wd)`` after the update (the paper's, pytorch-optimizer's default), or the
AdamW form ``p (1 - lr wd)`` before it (``weight_decouple=True``; the authors' ``no_prox``). pytorch-optimizer's
gradient clipping (``max_grad_norm``: a global norm, not elementwise), AdaNorm and gradient centralization are
not taken. pytorch-optimizer keeps ``-g_prev``; here ``prev_grad`` is g_prev itself (g + (-g_prev) and
g - g_prev round alike).

``prev_grad`` is not a moment: it is kept in fp32 in every state format (:attr:`StateSpec.kept`); quantized, it
would change the algorithm (d is a small difference of two large values).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .base import StateSpec, UpdateRule, check_betas, check_number


class AdanRule(UpdateRule):
    name = "adan"
    states = (StateSpec("exp_avg", "m"), StateSpec("exp_avg_diff", "m"), StateSpec("exp_avg_sq", "v"),
              StateSpec("prev_grad", kept="fp32"))
    hyperparameters = {"lr": 1e-3, "betas": (0.98, 0.92, 0.99), "eps": 1e-8, "weight_decay": 0.0,
                       "weight_decouple": False}

    def check(self, group: Mapping[str, Any]) -> None:
        check_number(group["lr"], "lr")
        check_betas(group["betas"], 3)
        check_number(group["eps"], "eps")
        check_number(group["weight_decay"], "weight_decay")
        if not isinstance(group["weight_decouple"], bool):
            raise TypeError(f"weight_decouple must be a bool, got {type(group['weight_decouple']).__name__}")

    def update(self, p, g, states, *, step, group):
        m, e, n, prev = states["exp_avg"], states["exp_avg_diff"], states["exp_avg_sq"], states["prev_grad"]
        beta1, beta2, beta3 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        d = g - (g if step == 1 else prev)  # the first step has no previous gradient: d = 0
        m.mul_(beta1).add_(g, alpha=1.0 - beta1)
        e.mul_(beta2).add_(d, alpha=1.0 - beta2)
        u = d.mul_(beta2).add_(g)
        n.mul_(beta3).addcmul_(u, u, value=1.0 - beta3)
        den = n.sqrt().div_(math.sqrt(1.0 - beta3**step)).add_(group["eps"])
        if group["weight_decouple"]:
            p.mul_(1.0 - lr * wd)
        p.addcdiv_(m, den, value=-lr / (1.0 - beta1**step))
        p.addcdiv_(e, den, value=-lr * beta2 / (1.0 - beta2**step))
        if not group["weight_decouple"]:
            p.div_(1.0 + lr * wd)
        prev.copy_(g)
        return p
