"""Workbook 03 · the Adam rule: what learners write instead of the solution."""

from __future__ import annotations

import torch

from adam8lib.course import checks

from . import Right, Wrong


def step_rule(*, decay="l2", bias=True, eps_inside=False, t_offset=0, rebind="none", correct_in_place=False,
              beta1_for_v=False, paper_form=False):
    """One Adam/AdamW step written with a chosen mistake.

    decay: "l2" (Adam), "decoupled" (AdamW), "none", "both", "no_lr" (p *= 1 - wd), "after" (decoupled,
    after the update), "constant" (p -= lr * wd). rebind: "all" (p, m, v rebound), "moments" (m, v rebound).
    """

    @torch.no_grad()
    def step_fn(p, g, m, v, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        b1, b2 = betas
        if rebind == "all":
            p = p.clone()
        if decay in ("decoupled", "both"):
            p.mul_(1 - lr * weight_decay)
        elif decay == "no_lr":
            p.mul_(1 - weight_decay)
        elif decay == "constant":
            p.sub_(lr * weight_decay)
        if decay in ("l2", "both"):
            g = g + weight_decay * p
        bv = b1 if beta1_for_v else b2
        if rebind in ("all", "moments"):
            m = b1 * m + (1 - b1) * g
            v = bv * v + (1 - bv) * g * g
        else:
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(bv).addcmul_(g, g, value=1 - bv)
        t = step + t_offset
        if correct_in_place:
            m_hat = m.div_(1 - b1**t)
            v_hat = v.div_(1 - b2**t)
        elif bias:
            m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        else:
            m_hat, v_hat = m, v
        denom = (v_hat + eps).sqrt() if eps_inside else v_hat.sqrt() + eps
        if paper_form:  # Kingma & Ba, section 2: alpha_t = lr * sqrt(1 - b2^t) / (1 - b1^t)
            p.sub_(lr * (1 - b2**t) ** 0.5 / (1 - b1**t) * m / (v.sqrt() + eps))
        else:
            p.sub_(lr * m_hat / denom)
        if decay == "after":
            p.mul_(1 - lr * weight_decay)
        return p

    return step_fn


@torch.no_grad()
def adam_with_addcdiv(p, g, m, v, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    b1, b2 = betas
    g = g.add(p, alpha=weight_decay)
    m.lerp_(g, 1 - b1)
    v.mul_(b2).add_(g.square() * (1 - b2))
    step_size = lr / (1 - b1**step)
    denom = v.sqrt().div_((1 - b2**step) ** 0.5).add_(eps)
    p.addcdiv_(m, denom, value=-step_size)


@torch.no_grad()
def adam_with_copy(p, g, m, v, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    b1, b2 = betas
    grad = g + weight_decay * p
    new_m = b1 * m + (1 - b1) * grad
    new_v = b2 * v + (1 - b2) * grad**2
    new_p = p - lr * (new_m / (1 - b1**step)) / (torch.sqrt(new_v / (1 - b2**step)) + eps)
    for old, new in ((p, new_p), (m, new_m), (v, new_v)):
        old.copy_(new)


@torch.no_grad()
def adamw_with_slices(p, g, m, v, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    b1, b2 = betas
    p[...] = p * (1 - lr * weight_decay)
    m[...] = b1 * m + (1 - b1) * g
    v[...] = b2 * v + (1 - b2) * g * g
    p -= lr * (m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt() + eps)


@torch.no_grad()
def adamw_with_functional(p, g, m, v, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    p.add_(p, alpha=-lr * weight_decay)
    m.mul_(betas[0]).add_((1 - betas[0]) * g)
    v.mul_(betas[1]).add_((1 - betas[1]) * g * g)
    update = (m / (1 - betas[0] ** step)) / ((v / (1 - betas[1] ** step)).sqrt() + eps)
    p.add_(update, alpha=-lr)


_A, _W = checks.check_adam_step, checks.check_adamw_step

WRONG = [
    # 03.1 · Adam (L2 decay through the gradient)
    Wrong("03.1", _A, step_rule(decay="decoupled"), "AdamW's decoupled decay in Adam",
          "that is AdamW's decoupled decay", True),
    Wrong("03.1", _A, step_rule(decay="none"), "weight_decay ignored", "you ignored weight_decay", True),
    Wrong("03.1", _A, step_rule(eps_inside=True), "eps inside the square root",
          "you put eps inside the square root", True),
    Wrong("03.1", _A, step_rule(rebind="all"), "p, m, v rebound to new tensors",
          "p, m and v did not change", True),
    Wrong("03.1", _A, step_rule(rebind="moments"), "m and v rebound, p in place",
          "p changed but m and v did not", True),
    Wrong("03.1", _A, step_rule(bias=False), "no bias correction", "you left out the bias correction", True),
    Wrong("03.1", _A, step_rule(t_offset=1), "step + 1 in the correction", "you used step + 1", True),
    Wrong("03.1", _A, step_rule(correct_in_place=True), "bias correction done in place on m and v",
          "you bias-corrected m and v in place", True),
    Wrong("03.1", _A, step_rule(beta1_for_v=True), "beta1 used for v", "you used beta1 for v", True),
    Wrong("03.1", _A, step_rule(paper_form=True), "the Adam paper's efficient form (eps on sqrt(v))",
          "you folded the bias correction into the step size", True),
    # 03.2 · AdamW (decoupled decay)
    Wrong("03.2", _W, step_rule(decay="l2"), "L2 decay through the gradient in AdamW",
          "you applied weight decay through the gradient: that is Adam with L2, not AdamW", True),
    Wrong("03.2", _W, step_rule(decay="no_lr"), "p *= 1 - weight_decay (no lr)",
          "you left lr out of the decay", True),
    Wrong("03.2", _W, step_rule(decay="after"), "decay after the Adam update",
          "you decayed p after the Adam update", True),
    Wrong("03.2", _W, step_rule(decay="both"), "decoupled decay and L2 together",
          "you applied weight decay twice", True),
    Wrong("03.2", _W, step_rule(decay="none"), "weight_decay ignored", "you ignored weight_decay", True),
    Wrong("03.2", _W, step_rule(decay="constant"), "p -= lr * weight_decay (not proportional to p)",
          "you subtracted lr * weight_decay", True),
    Wrong("03.2", _W, step_rule(decay="decoupled", rebind="all"), "p, m, v rebound to new tensors",
          "p, m and v did not change", True),
    Wrong("03.2", _W, step_rule(decay="decoupled", correct_in_place=True), "bias correction in place",
          "you bias-corrected m and v in place", True),
    Wrong("03.2", _W, step_rule(decay="decoupled", eps_inside=True), "eps inside the square root",
          "you put eps inside the square root", True),
    Wrong("03.2", _W, step_rule(decay="decoupled", paper_form=True), "the Adam paper's efficient form",
          "you folded the bias correction into the step size", True),
]

RIGHT = [
    Right("03.1", _A, adam_with_addcdiv, how="lerp_, addcdiv_ with the step size folded into lr (torch's order)"),
    Right("03.1", _A, adam_with_copy, how="out-of-place maths, results copied back with copy_"),
    Right("03.2", _W, adamw_with_slices, how="p[...] = ... slice assignment and -="),
    Right("03.2", _W, adamw_with_functional, how="add_ with alpha for the decay and the update"),
]


# ---------------------------------------------------------------- mistakes named by a PROPERTY of the result
def _adamw_with(slip):
    """AdamW written out in place, with one slip in the parameter update (m and v stay right)."""

    @torch.no_grad()
    def adamw_step(p, g, m, v, step, lr, betas, eps, weight_decay):
        b1, b2 = betas
        p.mul_(1 - lr * weight_decay)
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        m_hat, v_hat = m / (1 - b1**step), v / (1 - b2**step)
        update = m_hat / (v_hat.sqrt() + eps)
        if slip == "plus":
            p.add_(lr * update)
        elif slip == "half_lr":
            p.sub_(0.5 * lr * update)
        elif slip == "lr_squared":
            p.sub_(lr * lr * update)
        elif slip == "eps_times":
            p.sub_(lr * m_hat / (v_hat.sqrt() * (1 + eps)))
        elif slip == "m_reset":
            p.sub_(lr * update)
            m.zero_()

    adamw_step.__name__ = f"adamw_{slip}"
    return adamw_step


WRONG += [
    Wrong("03.2", _W, _adamw_with("plus"), "p += lr * update (the step goes with the gradient)",
          "the update p_new - p has the opposite sign", True),
    Wrong("03.2", _W, _adamw_with("half_lr"), "an extra factor 0.5 on the step size",
          "the update p_new - p is half the expected one", True),
    Wrong("03.2", _W, _adamw_with("lr_squared"), "lr multiplied in twice", "the update p_new - p is 0.01 times", True),
    Wrong("03.2", _W, _adamw_with("eps_times"), "sqrt(v_hat) * (1 + eps) instead of + eps",
          "right sign everywhere but the wrong size", False),
    Wrong("03.2", _W, _adamw_with("m_reset"), "m zeroed after the update", "m is all zeros", True),
]
