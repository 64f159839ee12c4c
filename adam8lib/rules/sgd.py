"""SGD with momentum: one state, the momentum buffer; L2 weight decay added to the gradient.

As bitsandbytes 0.50.2's CPU step (and torch.optim.SGD with dampening 0, nesterov off)::

    g <- g + wd * p
    b <- g at step 1, else momentum * b + g
    p <- p - lr * b
"""

from __future__ import annotations

from typing import Any, Mapping

from .base import StateSpec, UpdateRule, check_beta, check_number


class SGDMomentumRule(UpdateRule):
    name = "momentum"
    states = (StateSpec("momentum_buffer", "m"),)
    hyperparameters = {"lr": 1e-3, "momentum": 0.9, "weight_decay": 0.0}

    def check(self, group: Mapping[str, Any]) -> None:
        check_number(group["lr"], "lr")
        check_beta(group["momentum"], "momentum")
        if group["momentum"] == 0.0:
            raise ValueError("Invalid momentum: 0.0 (SGD8bit keeps a momentum buffer; use torch.optim.SGD without one)")
        check_number(group["weight_decay"], "weight_decay")

    def update(self, p, g, states, *, step, group):
        b = states["momentum_buffer"]
        g = g.add(p, alpha=group["weight_decay"])
        if step == 1:
            b.copy_(g)
        else:
            b.mul_(group["momentum"]).add_(g)
        p.add_(b, alpha=-group["lr"])
        return p
