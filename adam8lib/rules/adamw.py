"""AdamW, the library's rule (bias-corrected, decoupled decay, non-finite elements reset): its fp32 update
(:func:`adam_update_fp32`, the one fp32 Adam update of the library: the low-bit Adams' states decoded to fp32, their
fp32 small tensors, lesson 07's chunked step, the C++ and Triton kernels' spec) and the update rule
(:class:`AdamWRule`) of the low-bit Adams and of Muon8bit's parameters that Muon does not take.

The non-finite rule: ``m'`` and ``v'`` are computed in fp32; where either is not finite (a NaN or ±Inf gradient, or
a huge finite one whose ``(1 - beta2) g^2`` overflows fp32, ``|g|`` above about 6e20 for beta2 = 0.999) that
element's ``m`` and ``v`` are reset to 0 and its parameter is left unchanged this step (no update, no decay).
(torch.optim.AdamW keeps ``v = inf`` there, which freezes the element from then on.)
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from ..adam import check_hyperparameters
from .base import StateSpec, UpdateRule

__all__ = ["AdamWRule", "adam_update_fp32", "adam_update_fp32_many", "bias_corrections"]


def adam_update_fp32(
    param: torch.Tensor,
    grad: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
) -> torch.Tensor:
    """The fp32 Adam/AdamW update with the non-finite rule; returns the new parameter (fp32).

    ``param``, ``grad``, ``m``, ``v`` are fp32 tensors of one shape; ``m`` and ``v`` are updated
    in place::

        m' = beta1 m + (1 - beta1) g ;  v' = beta2 v + (1 - beta2) g^2
        bad = not finite(m') or not finite(v')         ->  m' = v' = 0 there, parameter kept
        p' = p (1 - lr wd) - lr / (1 - beta1^t) * m' / (sqrt(v') / sqrt(1 - beta2^t) + eps)

    Used per chunk by :func:`adam8lib.kernels.reference.adam8bit_step` (on dequantized states) and by the optimizer for
    tensors with fp32 states, so both follow one rule, in one place.
    """
    m.mul_(beta1).add_(grad, alpha=1.0 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
    return _param_with_rule(param, m, v, step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                            weight_decay=weight_decay)


def _param_with_rule(param, m, v, *, step, lr, beta1, beta2, eps, weight_decay) -> torch.Tensor:
    """The second half of :func:`adam_update_fp32`, after the moments: the non-finite rule
    element by element, then the new parameter."""
    step_size, bias_correction2_sqrt = bias_corrections(step, lr, beta1, beta2)
    ok = torch.isfinite(m) & torch.isfinite(v)
    m.masked_fill_(~ok, 0.0)
    v.masked_fill_(~ok, 0.0)
    new = param.mul(1.0 - lr * weight_decay) if weight_decay != 0 else param.clone()
    denom = v.sqrt().div_(bias_correction2_sqrt).add_(eps)
    new.addcdiv_(m, denom, value=-step_size)
    return torch.where(ok, new, param)


def adam_update_fp32_many(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    ms: list[torch.Tensor],
    vs: list[torch.Tensor],
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
) -> None:
    """:func:`adam_update_fp32` for several fp32 tensors on one device at once, **in place** on
    ``params``.

    The same operations in the same order, but each one over the whole list
    (``torch._foreach_*``: one call instead of one per tensor, which is most of the cost of a
    small tensor; on a GPU, a handful of kernel launches instead of ~18 per tensor). The
    non-finite rule needs to know whether any new ``m`` or ``v`` is not finite: one max-norm
    per tensor answers it; in the usual case (none) the parameters are updated in place,
    otherwise the rest of the rule runs tensor by tensor as in :func:`adam_update_fp32`.

    On the CPU the ``_foreach`` operations call the per-tensor ones, so the result is
    :func:`adam_update_fp32`'s bit for bit (tested). On CUDA they are torch's fused multi-tensor
    kernels: the same formulas, whose roundings may differ in the last bit (the GPU test allows
    a few ulp).
    """
    device = params[0].device if params else None
    for t in (*params, *grads, *ms, *vs):
        if t.dtype != torch.float32 or t.device != device:
            raise ValueError(f"adam_update_fp32_many takes fp32 tensors on one device ({device}), "
                             f"got {t.dtype} on {t.device}")
    if not (len(params) == len(grads) == len(ms) == len(vs)):
        raise ValueError(f"lists of different lengths: {len(params)}, {len(grads)}, {len(ms)}, {len(vs)}")
    keep = [i for i, t in enumerate(params) if t.numel()]  # an empty tensor has nothing to update
    if len(keep) < len(params):
        params, grads, ms, vs = ([xs[i] for i in keep] for xs in (params, grads, ms, vs))
    if not params:
        return
    torch._foreach_mul_(ms, beta1)
    torch._foreach_add_(ms, grads, alpha=1.0 - beta1)
    torch._foreach_mul_(vs, beta2)
    torch._foreach_addcmul_(vs, grads, grads, value=1.0 - beta2)
    hyper = dict(step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
    if not bool(torch.stack(torch._foreach_norm([*ms, *vs], ord=math.inf)).isfinite().all()):
        for p, m, v in zip(params, ms, vs):
            p.copy_(_param_with_rule(p, m, v, **hyper))
        return
    step_size, bias_correction2_sqrt = bias_corrections(step, lr, beta1, beta2)
    if weight_decay != 0:
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)
    denoms = torch._foreach_sqrt(vs)
    torch._foreach_div_(denoms, bias_correction2_sqrt)
    torch._foreach_add_(denoms, eps)
    torch._foreach_addcdiv_(params, ms, denoms, value=-step_size)


def bias_corrections(step: int, lr: float, beta1: float, beta2: float) -> tuple[float, float]:
    """``(lr / (1 - beta1^t), sqrt(1 - beta2^t))``: the step size and the square root of the
    second moment's correction, in Python doubles (every backend rounds them to fp32 once, as
    torch rounds its kernels' scalars)."""
    return lr / (1.0 - beta1**step), math.sqrt(1.0 - beta2**step)


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
        of ``torch._foreach_*`` operations (:func:`adam_update_fp32_many`), on
        the CPU the bits of :meth:`update` on each. ``states``: each tensor's ``{name: fp32 values}``."""
        beta1, beta2 = group["betas"]
        adam_update_fp32_many(ps, gs, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], step=step,
                              lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                              weight_decay=group["weight_decay"])
