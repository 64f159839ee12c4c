"""Checks for workbook 03 · the Adam rule: Adam (L2 decay) and AdamW (decoupled decay) ≡ torch.optim."""

from __future__ import annotations

import torch

from ._common import call, fail, passed, require_callable
from ._properties import describe_step
from ._variants import expect_close, matches

__all__ = ["check_adam_step", "check_adamw_step"]

_CASES = [  # lr, betas, eps, weight_decay, steps
    (1e-2, (0.9, 0.999), 1e-8, 0.0, 4),
    (1e-2, (0.8, 0.99), 1e-6, 0.1, 6),
    (1e-1, (0.5, 0.9), 1e-3, 0.05, 5),
]


def _one_step(p, g, m, v, t, lr, betas, eps, wd, *, decay, bias1=True, bias2=True, eps_inside=False,
              beta1_for_v=False, square=True, t_offset=0, changed="pmv", correct_in_place=False, eps_hat=False,
              abs_for_v=False, swap_betas=False):
    """One fp32 step, with optional mistakes, on copies; returns (p, m, v) as the caller would see them.

    decay: "l2" (Adam), "decoupled" (AdamW), "none", "no_lr" (p *= 1 - wd), "after" (decoupled, after the
    update), "constant" (p -= lr * wd), "both" (decoupled, then L2 with the decayed p), "both_l2_first",
    "l2_minus" (g - wd * p), "grow" (p *= 1 + lr * wd), "corrected_lr" (p *= 1 - lr / (1 - beta1**t) * wd),
    "step_size_lr" (p *= 1 - lr * sqrt(1 - beta2**t) / (1 - beta1**t) * wd).
    abs_for_v: v averages |g|; swap_betas: m uses beta2 and v beta1, "all" (the moments and their bias
    corrections) or "moments" (the corrections keep the right betas).
    changed: which of p, m, v the caller sees updated (the others were rebound to new tensors).
    """
    b1, b2 = betas
    mb1, mb2 = (b2, b1) if swap_betas else (b1, b2)  # the betas the moments use
    if swap_betas == "all":
        b1, b2 = b2, b1
    p0, m0, v0 = p.clone(), m.clone(), v.clone()
    s = t + t_offset
    if decay == "both_l2_first":
        g = g + wd * p
    if decay in ("decoupled", "both", "both_l2_first"):
        p = p * (1 - lr * wd)
    elif decay == "no_lr":
        p = p * (1 - wd)
    elif decay == "constant":
        p = p - lr * wd
    elif decay == "grow":
        p = p * (1 + lr * wd)
    elif decay == "corrected_lr":
        p = p * (1 - lr / (1 - b1**s) * wd)
    elif decay == "step_size_lr":
        p = p * (1 - lr * (1 - b2**s) ** 0.5 / (1 - b1**s) * wd)
    if decay in ("l2", "both"):
        g = g + wd * p
    elif decay == "l2_minus":
        g = g - wd * p
    bv = mb1 if beta1_for_v else mb2
    m = mb1 * m + (1 - mb1) * g
    v = bv * v + (1 - bv) * (g.abs() if abs_for_v else g * g if square else g)
    m_hat = m / (1 - b1**s) if bias1 else m
    v_hat = v / (1 - b2**s) if bias2 else v
    denom = torch.sqrt(v_hat + eps) if eps_inside else torch.sqrt(v_hat) + eps
    if eps_hat:  # the Adam paper's "efficient" form: correction folded into the step size, eps on sqrt(v)
        p = p - lr * (1 - b2**s) ** 0.5 / (1 - b1**s) * m / (torch.sqrt(v) + eps)
    else:
        p = p - lr * m_hat / denom
    if decay == "after":
        p = p * (1 - lr * wd)
    if correct_in_place:
        m, v = m_hat, v_hat
    return (p if "p" in changed else p0), (m if "m" in changed else m0), (v if "v" in changed else v0)


def _name(fn) -> str:
    return getattr(fn, "__name__", "your function")


def _run(step_fn, decoupled: bool, title: str, variants_for) -> None:
    torch_cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    for case, (lr, betas, eps, wd, steps) in enumerate(_CASES):
        gen = torch.Generator().manual_seed(case)
        shape = (5, 7) if case != 1 else (13,)
        ref_p = torch.randn(shape, generator=gen).requires_grad_(True)
        opt = torch_cls([ref_p], lr=lr, betas=betas, eps=eps, weight_decay=wd, foreach=False)
        m = torch.zeros(shape)
        v = torch.zeros(shape)
        for t in range(1, steps + 1):
            g = torch.randn(shape, generator=gen)
            p0 = ref_p.detach().clone()
            m0, v0 = m.clone(), v.clone()
            ref_p.grad = g.clone()
            opt.step()
            st = opt.state[ref_p]
            want = (ref_p.detach().clone(), st["exp_avg"].clone(), st["exp_avg_sq"].clone())
            p_l, m_l, v_l = p0.clone(), m0.clone(), v0.clone()
            g_l = g.clone()
            call(step_fn, p_l, g_l, m_l, v_l, step=t, lr=lr, betas=betas, eps=eps, weight_decay=wd,
                 may_change=(0, 1, 2, 3))  # p, m, v are updated in place; g is checked below
            kind = "AdamW" if decoupled else "Adam"
            if not torch.equal(g_l, g):
                fail(f"{_name(step_fn)} changed its input `g` in place: {int((g_l != g).sum())} of its "
                     f"{g.numel()} values changed after the call ({kind} step {t}, weight_decay={wd}).",
                     kind="in_place", what=f"{_name(step_fn)}(...)", got="g",
                     hint="your function modified the gradient `g` it was given (an in-place method such as "
                          "add_/mul_ on it, or `g += ...`): the caller still needs its gradient as it was, and "
                          "only p, m and v are yours to update in place. Where you need a changed gradient, make it "
                          "a new tensor (an out-of-place operation) and use that in the rest of the step.")
            what = (f"{kind} step {t} (lr={lr}, betas={betas}, eps={eps}, weight_decay={wd}), compared with "
                    f"torch.optim.{torch_cls.__name__}: (p, m, v)")

            def variant(**kw):
                return lambda: _one_step(p0, g, m0, v0, t, lr, betas, eps, wd,
                                         **{"decay": "decoupled" if decoupled else "l2", **kw})

            default = variants_for(None)
            if not matches((p_l, m_l, v_l), want, rtol=1e-5, atol=1e-6):
                found = describe_step({"p": p0, "m": m0, "v": v0}, {"p": p_l, "m": m_l, "v": v_l},
                                      dict(zip("pmv", want)), moments=("m", "v"), g=g)
                default = f"{found} (step {t}). The rule: {default}" if found else default
            expect_close((p_l, m_l, v_l), want, what=what, rtol=1e-5, atol=1e-6, describe_diff=False,
                         default=default, variants=variants_for(variant))
            m, v = want[1], want[2]
    passed(title)


def _common_variants(variant):
    return [
        ("p, m and v did not change: you made new tensors (p = p - ..., m = beta1 * m + ...) instead of "
         "updating the caller's; update them in place (p.sub_(...), m.mul_(beta1).add_(...), "
         "v.mul_(beta2).addcmul_(...)).", variant(changed="")),
        ("p changed but m and v did not: `m = beta1 * m + ...` makes a new tensor the caller never sees; update "
         "m and v in place (m.mul_(beta1).add_(g, alpha=1 - beta1), v.mul_(beta2).addcmul_(g, g, ...)).",
         variant(changed="p")),
        ("you left out the bias correction: divide m by 1 - beta1**step and v by 1 - beta2**step before the "
         "update.", variant(bias1=False, bias2=False)),
        ("you bias-corrected m but not v: use sqrt(v / (1 - beta2**step)).", variant(bias2=False)),
        ("you bias-corrected v but not m: use m / (1 - beta1**step).", variant(bias1=False)),
        ("you used step + 1 in the bias correction: step already counts from 1 (the first call has step=1).",
         variant(t_offset=1)),
        ("you bias-corrected m and v in place (m.div_(...)): the stored moments must stay uncorrected; compute "
         "m_hat = m / (1 - beta1**step) as a new tensor.", variant(correct_in_place=True)),
        ("you put eps inside the square root: torch adds it after, sqrt(v_hat) + eps.", variant(eps_inside=True)),
        ("you folded the bias correction into the step size (lr * sqrt(1 - beta2**step) / (1 - beta1**step), the "
         "Adam paper's efficient form): then eps is added to sqrt(v), not to sqrt(v_hat); torch (and this exercise) "
         "use m_hat / (sqrt(v_hat) + eps).", variant(eps_hat=True)),
        ("you used beta1 for v: the second moment uses beta2.", variant(beta1_for_v=True)),
        ("you averaged g into v, not g * g: v is the moving average of the squared gradient.",
         variant(square=False)),
        ("you averaged |g| into v, not g * g: v is the moving average of the squared gradient (the update then "
         "divides by sqrt(v_hat), so v must be in squared units).", variant(abs_for_v=True)),
        ("you used the betas the other way round: m (the gradient's average) uses betas[0] (0.9 by default) and "
         "v (the squared gradient's average) uses betas[1] (0.999), in the averages and in their corrections.",
         variant(swap_betas="all")),
        ("you used the betas the other way round in the averages: m (the gradient's average) uses betas[0] (0.9 "
         "by default) and v (the squared gradient's average) uses betas[1] (0.999).",
         variant(swap_betas="moments")),
    ]


def check_adam_step(adam_step) -> None:
    """``adam_step(p, g, m, v, step, lr, betas, eps, weight_decay)``: Adam with L2 decay, ≡ torch.optim.Adam."""
    require_callable(adam_step, "adam_step")

    def variants_for(variant):
        if variant is None:
            return ("Adam: g = g + weight_decay * p; m, v = EMAs of g and g*g; "
                    "p -= lr * m_hat / (sqrt(v_hat) + eps).")
        return _common_variants(variant) + [
            ("that is AdamW's decoupled decay (p *= 1 - lr * weight_decay); Adam's weight_decay is L2: add "
             "weight_decay * p to the gradient BEFORE the moments.", variant(decay="decoupled")),
            ("you ignored weight_decay: Adam adds weight_decay * p to the gradient before the moments.",
             variant(decay="none")),
            ("you applied weight decay twice (through the gradient AND p *= 1 - lr * weight_decay): Adam's L2 only "
             "goes through the gradient.", variant(decay="both")),
            ("you applied weight decay twice (through the gradient AND p *= 1 - lr * weight_decay): Adam's L2 only "
             "goes through the gradient.", variant(decay="both_l2_first")),
            ("your weight decay has the wrong sign: you subtracted weight_decay * p from the gradient, which pushes "
             "p away from 0. L2 adds weight_decay * p (the gradient of weight_decay / 2 * p**2).",
             variant(decay="l2_minus")),
        ]

    _run(adam_step, False, "Exercise 03.1 · The Adam step", variants_for)


def check_adamw_step(adamw_step) -> None:
    """``adamw_step(p, g, m, v, step, lr, betas, eps, weight_decay)``: decoupled decay, ≡ torch.optim.AdamW."""
    require_callable(adamw_step, "adamw_step")

    def variants_for(variant):
        if variant is None:
            return ("AdamW: p *= 1 - lr * weight_decay first, then the Adam update with the plain gradient.")
        return _common_variants(variant) + [
            ("you applied weight decay through the gradient: that is Adam with L2, not AdamW. AdamW decays p "
             "directly, p *= 1 - lr * weight_decay, and the moments see the plain gradient.", variant(decay="l2")),
            ("you left lr out of the decay: AdamW multiplies p by 1 - lr * weight_decay.", variant(decay="no_lr")),
            ("you decayed p after the Adam update: torch decays first, p *= 1 - lr * weight_decay, then the "
             "update.", variant(decay="after")),
            ("you applied weight decay twice: p *= 1 - lr * weight_decay AND weight_decay * p in the gradient; "
             "AdamW only does the first.", variant(decay="both")),
            ("you applied weight decay twice: p *= 1 - lr * weight_decay AND weight_decay * p in the gradient; "
             "AdamW only does the first.", variant(decay="both_l2_first")),
            ("you ignored weight_decay: AdamW multiplies p by 1 - lr * weight_decay before the update.",
             variant(decay="none")),
            ("you subtracted lr * weight_decay: the decay is proportional to p, p *= 1 - lr * weight_decay.",
             variant(decay="constant")),
            ("your weight decay has the wrong sign: p *= 1 + lr * weight_decay makes |p| grow. Decay shrinks p "
             "towards 0 by the factor 1 - lr * weight_decay.", variant(decay="grow")),
            ("your decay used the bias-corrected step size (lr / (1 - beta1**step), or with sqrt(1 - beta2**step)) "
             "instead of the plain lr: the bias correction belongs to the moments only; the decay factor is "
             "1 - lr * weight_decay at every step.", variant(decay="corrected_lr")),
            ("your decay used the bias-corrected step size (lr / (1 - beta1**step), or with sqrt(1 - beta2**step)) "
             "instead of the plain lr: the bias correction belongs to the moments only; the decay factor is "
             "1 - lr * weight_decay at every step.", variant(decay="step_size_lr")),
        ]

    _run(adamw_step, True, "Exercise 03.2 · The AdamW step", variants_for)
