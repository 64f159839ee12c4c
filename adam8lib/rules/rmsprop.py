"""RMSprop and Adagrad: one state, the (moving) sum of g^2; L2 weight decay added to the gradient.

As bitsandbytes 0.50.2's CPU steps, in this order (``wd``: ``weight_decay``)::

    g <- g + wd * p
    RMSprop:  s <- alpha s + (1 - alpha) g^2        Adagrad:  s <- s + g^2
    p <- p - lr * g / (sqrt(s) + eps)

bitsandbytes stores this never-negative state on its *signed* dynamic map (its one-state optimizers
keep every state1 there), so ``stored_as`` is ``"m"``: the same codes. (Half the signed map's codes
are negative and unused: the unsigned map would be finer; ``stored_as="v"`` is one line away.)
For fp32 states (tensors under ``min_8bit_size``) bitsandbytes' 32-bit step adds the decay only when it
is positive and rounds the last line as ``p + (-lr) * (g / (sqrt(s) + eps))`` instead of ``addcdiv``'s
``p + (-lr * g) / (sqrt(s) + eps)``; ``update_unquantized`` follows it, so small tensors match bit for bit.
Not implemented, as in bitsandbytes: RMSprop's ``momentum`` and ``centered``, Adagrad's ``lr_decay``
and ``initial_accumulator_value`` (bitsandbytes' CPU step ignores RMSprop's momentum; here anything
but their defaults raises ValueError).
"""

from __future__ import annotations

from typing import Any, Mapping

from .base import StateSpec, UpdateRule, check_beta, check_number


class RMSpropRule(UpdateRule):
    name = "rmsprop"
    states = (StateSpec("square_avg", "m"),)
    hyperparameters = {"lr": 1e-2, "alpha": 0.99, "eps": 1e-8, "weight_decay": 0.0}

    def check(self, group: Mapping[str, Any]) -> None:
        check_number(group["lr"], "lr")
        check_beta(group["alpha"], "alpha")
        if group["alpha"] == 0.0:
            raise ValueError("Invalid alpha: 0.0 (RMSprop with alpha == 0 is not supported, as in bitsandbytes)")
        check_number(group["eps"], "eps")
        check_number(group["weight_decay"], "weight_decay")

    def update(self, p, g, states, *, step, group):
        s = states["square_avg"]
        g = g.add(p, alpha=group["weight_decay"])
        s.mul_(group["alpha"]).addcmul_(g, g, value=1.0 - group["alpha"])
        p.addcdiv_(g, s.sqrt().add_(group["eps"]), value=-group["lr"])
        return p

    def update_unquantized(self, p, g, states, *, step, group):
        s = states["square_avg"]
        if group["weight_decay"] > 0.0:
            g = g.add(p, alpha=group["weight_decay"])
        s.mul_(group["alpha"]).addcmul_(g, g, value=1.0 - group["alpha"])
        p.add_(g / (s.sqrt() + group["eps"]), alpha=-group["lr"])
        return p


class AdagradRule(UpdateRule):
    name = "adagrad"
    states = (StateSpec("sum", "m"),)
    hyperparameters = {"lr": 1e-2, "eps": 1e-10, "weight_decay": 0.0}

    def check(self, group: Mapping[str, Any]) -> None:
        check_number(group["lr"], "lr")
        check_number(group["eps"], "eps")
        check_number(group["weight_decay"], "weight_decay")

    def update(self, p, g, states, *, step, group):
        s = states["sum"]
        g = g.add(p, alpha=group["weight_decay"])
        s.addcmul_(g, g, value=1.0)
        p.addcdiv_(g, s.sqrt().add_(group["eps"]), value=-group["lr"])
        return p

    def update_unquantized(self, p, g, states, *, step, group):
        s = states["sum"]
        if group["weight_decay"] > 0.0:
            g = g.add(p, alpha=group["weight_decay"])
        s.addcmul_(g, g, value=1.0)
        p.add_(g / (s.sqrt() + group["eps"]), alpha=-group["lr"])
        return p
