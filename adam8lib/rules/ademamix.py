"""AdEMAMix (Pagliardini et al. 2024, arXiv 2409.03137): Adam with a second, slow EMA of the gradient.

Three states: the fast EMA ``m1`` (beta1), the slow EMA ``m2`` (beta3) and ``nu`` (beta2, of g^2).
As bitsandbytes 0.50.2's CPU step, in this order::

    m1 <- beta1 m1 + (1 - beta1) g ;  m2 <- beta3_t m2 + (1 - beta3_t) g ;  nu <- beta2 nu + (1 - beta2) g^2
    update = (m1 / (1 - beta1^t) + alpha_t m2) / (sqrt(nu) / sqrt(1 - beta2^t) + eps)
    p <- p * (1 - lr * weight_decay)          (only if weight_decay > 0)
    p <- p - lr * update

with the warm-ups of the paper (in Python doubles, as bitsandbytes computes them):
``alpha_t = min(t alpha / t_alpha, alpha)`` and
``beta3_t = min(exp(ln b1 ln b3 / ((1 - t/t_beta3) ln b3 + (t/t_beta3) ln b1)), beta3)``;
``t_alpha``/``t_beta3`` of ``None`` (or 0) keep ``alpha``/``beta3`` from the first step.
bitsandbytes stores ``m1`` and ``m2`` together in ``state1`` of shape (2, ...) with an absmax of shape
(2, blocks), both on the signed map; here they are two states, ``exp_avg_fast`` and ``exp_avg_slow``
(the same codes and scales, row by row), and ``nu`` is ``exp_avg_sq`` on the unsigned map.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .base import StateSpec, UpdateRule, check_betas, check_int, check_number


def alpha_at(step: int, alpha: float, t_alpha: int | None) -> float:
    return min(step * alpha / t_alpha, alpha) if t_alpha else alpha


def beta3_at(step: int, beta1: float, beta3: float, t_beta3: int | None) -> float:
    if not t_beta3:
        return beta3
    ln_beta1, ln_beta3 = math.log(beta1), math.log(beta3)
    scale = step / t_beta3
    return min(math.exp((ln_beta1 * ln_beta3) / (((1 - scale) * ln_beta3) + (scale * ln_beta1))), beta3)


class AdEMAMixRule(UpdateRule):
    name = "ademamix"
    states = (StateSpec("exp_avg_fast", "m"), StateSpec("exp_avg_slow", "m"), StateSpec("exp_avg_sq", "v"))
    hyperparameters = {"lr": 1e-3, "betas": (0.9, 0.999, 0.9999), "alpha": 5.0, "t_alpha": None,
                       "t_beta3": None, "eps": 1e-8, "weight_decay": 1e-2}

    def check(self, group: Mapping[str, Any]) -> None:
        check_number(group["lr"], "lr")
        check_betas(group["betas"], 3)
        if group["t_beta3"] and group["betas"][0] == 0.0:
            raise ValueError("t_beta3 needs beta1 > 0 (its schedule takes log(beta1))")
        check_number(group["alpha"], "alpha")
        check_int(group["t_alpha"], "t_alpha", minimum=0, optional=True)
        check_int(group["t_beta3"], "t_beta3", minimum=0, optional=True)
        check_number(group["eps"], "eps")
        check_number(group["weight_decay"], "weight_decay")

    def update(self, p, g, states, *, step, group):
        m1, m2, nu = states["exp_avg_fast"], states["exp_avg_slow"], states["exp_avg_sq"]
        beta1, beta2, beta3 = group["betas"]
        beta3 = beta3_at(step, beta1, beta3, group["t_beta3"])
        alpha = alpha_at(step, group["alpha"], group["t_alpha"])
        lr, wd = group["lr"], group["weight_decay"]
        m1.mul_(beta1).add_(g, alpha=1.0 - beta1)
        m2.mul_(beta3).add_(g, alpha=1.0 - beta3)
        nu.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        correction1 = 1.0 - beta1**step
        correction2 = math.sqrt(1.0 - beta2**step)
        update = (m1 / correction1 + alpha * m2) / (nu.sqrt() / correction2 + group["eps"])
        if wd > 0.0:
            p.mul_(1.0 - lr * wd)
        p.add_(update, alpha=-lr)
        return p
