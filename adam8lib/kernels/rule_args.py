"""What every fused step of the family's elementwise rules shares, whatever its backend (C++
:mod:`.cpu_rules`, Triton :mod:`.triton_rules`): the rules they step, the state layout they accept, and
the fp32 scalars of one step.

The scalars are computed in Python doubles and rounded once to fp32 (by ctypes or by Triton's launch),
as torch rounds the Python numbers its ops take in the reference step (:mod:`adam8lib.rules`): Lion's
and AdEMAMix's ``1 - lr*wd`` only when ``wd > 0`` (the reference multiplies only then; by 1.0
otherwise, which changes nothing), AdEMAMix's warm-ups ``alpha_t``, ``beta3_t`` and its bias
corrections per step."""

from __future__ import annotations

import math
from typing import Any, Mapping

from ..rules.ademamix import alpha_at, beta3_at

__all__ = ["RULES", "accepts", "rule_scalars"]

#: The rules the templates step: name -> id (``csrc/rules.h`` and :mod:`.triton_rules` use the same).
RULES = {"lion": 1, "ademamix": 2, "rmsprop": 3, "adagrad": 4, "adan": 5}


def accepts(fmt: Any) -> bool:
    """A format whose states the templates code: one byte per element (an 8-bit map or FP8), one
    scale per block, one block size for every state."""
    moments = (fmt.m, fmt.v)
    return all(m.bits == 8 and m.coding in ("map", "fp8") and not m.rank1 for m in moments) \
        and fmt.m.blocksize == fmt.v.blocksize


def rule_scalars(name: str, step: int, group: Mapping[str, Any]) -> list[float]:
    """The scalars of one step of rule ``name``, in the order the kernels read them:

    * lion: beta1, 1 - beta1, beta2, 1 - beta2, decay, -lr
    * ademamix: beta1, 1 - beta1, beta3_t, 1 - beta3_t, beta2, 1 - beta2, 1 - beta1^t, alpha_t,
      sqrt(1 - beta2^t), eps, decay, -lr
    * rmsprop: weight_decay, alpha, 1 - alpha, eps, -lr
    * adagrad: weight_decay, eps, -lr
    * adan: beta1, 1 - beta1, beta2, 1 - beta2, beta3, 1 - beta3, first (1 on step 1), sqrt(1 - beta3^t), eps,
      decay (1 - lr*wd with weight_decouple, else 1), -lr / (1 - beta1^t), -lr*beta2 / (1 - beta2^t),
      prox (1 + lr*wd without weight_decouple, else 1)
    """
    lr, wd = group["lr"], group["weight_decay"]
    if name == "lion":
        beta1, beta2 = group["betas"]
        decay = 1.0 - lr * wd if wd > 0.0 else 1.0
        return [beta1, 1.0 - beta1, beta2, 1.0 - beta2, decay, -lr]
    if name == "ademamix":
        beta1, beta2, beta3 = group["betas"]
        beta3 = beta3_at(step, beta1, beta3, group["t_beta3"])
        alpha = alpha_at(step, group["alpha"], group["t_alpha"])
        decay = 1.0 - lr * wd if wd > 0.0 else 1.0
        return [beta1, 1.0 - beta1, beta3, 1.0 - beta3, beta2, 1.0 - beta2, 1.0 - beta1**step, alpha,
                math.sqrt(1.0 - beta2**step), group["eps"], decay, -lr]
    if name == "rmsprop":
        return [wd, group["alpha"], 1.0 - group["alpha"], group["eps"], -lr]
    if name == "adagrad":
        return [wd, group["eps"], -lr]
    if name == "adan":
        beta1, beta2, beta3 = group["betas"]
        decouple = group["weight_decouple"]
        return [beta1, 1.0 - beta1, beta2, 1.0 - beta2, beta3, 1.0 - beta3, 1.0 if step == 1 else 0.0,
                math.sqrt(1.0 - beta3**step), group["eps"], 1.0 - lr * wd if decouple else 1.0,
                -lr / (1.0 - beta1**step), -lr * beta2 / (1.0 - beta2**step), 1.0 if decouple else 1.0 + lr * wd]
    raise ValueError(f"the rule templates have no rule {name!r}; they have {sorted(RULES)}")
