"""AdamW, the library's rule (:func:`adam8lib.kernels.reference.adam_update_fp32`: bias-corrected, decoupled
decay, non-finite elements reset) as an update rule: what Muon8bit uses for the parameters Muon does not take."""

from __future__ import annotations

from typing import Any, Mapping

from ..adam import check_hyperparameters
from ..kernels.reference import adam_update_fp32, adam_update_fp32_many
from .base import StateSpec, UpdateRule


class AdamWRule(UpdateRule):
    name = "adamw"
    states = (StateSpec("exp_avg", "m"), StateSpec("exp_avg_sq", "v"))
    hyperparameters = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}

    def check(self, group: Mapping[str, Any]) -> None:
        betas = group["betas"]
        check_hyperparameters(group["lr"], tuple(betas) if isinstance(betas, list) else betas, group["eps"],
                              group["weight_decay"])

    def update(self, p, g, states, *, step, group):
        beta1, beta2 = group["betas"]
        return adam_update_fp32(p, g, states["exp_avg"], states["exp_avg_sq"], step=step, lr=group["lr"],
                                beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"])

    def update_many(self, ps, gs, states, *, step, group) -> None:
        """:meth:`update` of several fp32 tensors with one step count, in place (``ps`` are written): one batch
        of ``torch._foreach_*`` operations (:func:`~adam8lib.kernels.reference.adam_update_fp32_many`), on
        the CPU the bits of :meth:`update` on each. ``states``: each tensor's ``{name: fp32 values}``."""
        beta1, beta2 = group["betas"]
        adam_update_fp32_many(ps, gs, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], step=step,
                              lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                              weight_decay=group["weight_decay"])
