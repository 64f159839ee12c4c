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

import torch

from ..quant import num_blocks
from ..rules.ademamix import alpha_at, beta3_at
from .contract import PARAM_DTYPES, check_plain_tensor, is_usual_tensor

__all__ = ["RULES", "accepts", "rule_scalars", "checked_tensors"]

#: The rules the templates step: name -> id (``csrc/rules.h`` and :mod:`.triton_rules` use the same).
RULES = {"lion": 1, "ademamix": 2, "rmsprop": 3, "adagrad": 4, "adan": 5}


def accepts(fmt: Any) -> bool:
    """A format whose states the templates code: one byte per element (an 8-bit map or FP8), one
    scale per block, one block size for every state."""
    return fmt.one_byte_per_element


def checked_tensors(p: torch.Tensor, g: torch.Tensor, states, rule: Any, fmt: Any, shape: tuple[int, ...], *,
                    template: str, kept: tuple[str, ...] = ("fp32", "bf16"), most_states: int | None = None
                    ) -> list[tuple[str, torch.Tensor]]:
    """The checks every rule template makes before a pointer is read (the backend adds its device's):
    ``template`` names it in the messages; ``kept``: the dtypes it keeps an unquantized state in; ``most_states``:
    the most states it steps. ValueError/TypeError naming what is wrong; else ``[(name, tensor)]`` of every tensor
    (p, g, each state's codes and scales or kept values): plain, flat, contiguous, of their size and dtype."""
    if rule.name not in RULES:
        raise ValueError(f"the {template} rule template has no rule {rule.name!r}; it has {sorted(RULES)}")
    if not accepts(fmt):
        raise ValueError(f"the {template} rule template steps byte codes with one block size, not {fmt.fingerprint()}")
    if len(states) != len(rule.states):
        raise ValueError(f"the {rule.name} rule keeps {len(rule.states)} states, got {len(states)}")
    if most_states is not None and not 1 <= len(states) <= most_states:
        raise ValueError(f"the {template} rule template steps 1 to {most_states} states, the {rule.name} rule has "
                         f"{len(states)}")
    n = math.prod(shape)
    wanted = [("p", p, n, None), ("g", g, n, None)]
    for spec, entry in zip(rule.states, states):
        if spec.kept is not None:
            if spec.kept not in kept:
                raise ValueError(f"state {spec.name!r} is kept in {spec.kept}: the {template} template keeps states "
                                 f"in {' or '.join(kept)} only")
            if not isinstance(entry, (tuple, list)) or len(entry) != 1:
                raise TypeError(f"state {spec.name!r} must be a (values,) tuple: the rule keeps it in {spec.kept}")
            wanted.append((spec.name, entry[0], n, spec.kept_dtype))
            continue
        if not isinstance(entry, (tuple, list)) or len(entry) != 2:
            raise TypeError(f"state {spec.name!r} must be a (codes, absmax) pair: the {template} template steps "
                            f"quantized states")
        wanted += [(spec.name + " codes", entry[0], n, torch.uint8),
                   (spec.name + " absmax", entry[1], num_blocks(n, fmt.m.blocksize), torch.float32)]
    for name, t, size, dtype in wanted:
        if not is_usual_tensor(t):
            check_plain_tensor(t, name)
        if t.dim() != 1 or not t.is_contiguous():
            raise ValueError(f"{name} must be a flat contiguous 1-D tensor, got shape {tuple(t.shape)}")
        if t.numel() != size or (dtype is not None and t.dtype != dtype):
            raise ValueError(f"{name} must be {size} elements{f' of {dtype}' if dtype else ''}, got {t.numel()} of "
                             f"{t.dtype}")
    if p.dtype not in PARAM_DTYPES or g.dtype not in PARAM_DTYPES:
        raise TypeError(f"p and g must be fp32, bf16 or fp16, got {p.dtype} and {g.dtype}")
    return [(name, t) for name, t, _, _ in wanted]


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
