"""Checks for workbook 03 · the Adam rule: Adam (L2 decay) and AdamW (decoupled decay) ≡ torch.optim."""

from __future__ import annotations

import torch

from ._common import call, passed, require_callable
from ._variants import expect_close

__all__ = ["check_adam_step", "check_adamw_step"]

_CASES = [  # lr, betas, eps, weight_decay, steps
    (1e-2, (0.9, 0.999), 1e-8, 0.0, 4),
    (1e-2, (0.8, 0.99), 1e-6, 0.1, 6),
    (1e-1, (0.5, 0.9), 1e-3, 0.05, 5),
]


def _one_step(p, g, m, v, t, lr, betas, eps, wd, *, decoupled, bias1=True, bias2=True, eps_inside=False,
              beta1_for_v=False, square=True, t_offset=0, decay="lr", in_place=True):
    """One fp32 step, with optional mistakes, on copies; returns (p, m, v)."""
    b1, b2 = betas
    p, m, v = p.clone(), m.clone(), v.clone()
    if not in_place:
        return p, m, v
    if wd:
        if decoupled and decay != "after":
            p = p * (1 - (lr * wd if decay == "lr" else wd))
        elif decay != "none":
            g = g + wd * p
    m = b1 * m + (1 - b1) * g
    v = (b1 if beta1_for_v else b2) * v + (1 - (b1 if beta1_for_v else b2)) * (g * g if square else g)
    s = t + t_offset
    m_hat = m / (1 - b1**s) if bias1 else m
    v_hat = v / (1 - b2**s) if bias2 else v
    denom = torch.sqrt(v_hat + eps) if eps_inside else torch.sqrt(v_hat) + eps
    if decoupled and decay == "after":
        return (p - lr * m_hat / denom) * (1 - lr * wd), m, v
    return p - lr * m_hat / denom, m, v


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
            call(step_fn, p_l, g.clone(), m_l, v_l, step=t, lr=lr, betas=betas, eps=eps, weight_decay=wd)
            kind = "AdamW" if decoupled else "Adam"
            what = (f"{kind} step {t} (lr={lr}, betas={betas}, eps={eps}, weight_decay={wd}), compared with "
                    f"torch.optim.{torch_cls.__name__}: (p, m, v)")

            def variant(**kw):
                return lambda: _one_step(p0, g, m0, v0, t, lr, betas, eps, wd, **{"decoupled": decoupled, **kw})

            expect_close((p_l, m_l, v_l), want, what=what, rtol=1e-5, atol=1e-6,
                         default=variants_for(None), variants=variants_for(variant))
            m, v = want[1], want[2]
    passed(title)


def _common_variants(variant):
    return [
        ("update p, m and v IN PLACE (p.sub_(...), m.mul_(...).add_(...)); the caller keeps its own tensors.",
         variant(in_place=False)),
        ("no bias correction: use m / (1 - beta1**step) and v / (1 - beta2**step).", variant(bias1=False, bias2=False)),
        ("v is not bias-corrected: sqrt(v / (1 - beta2**step)).", variant(bias2=False)),
        ("m is not bias-corrected: m / (1 - beta1**step).", variant(bias1=False)),
        ("step counts from 1 (the first call has step=1): don't add 1 to it.", variant(t_offset=1)),
        ("eps goes outside the square root: sqrt(v_hat) + eps.", variant(eps_inside=True)),
        ("beta1 used for v: the second moment uses beta2.", variant(beta1_for_v=True)),
        ("g not squared: v = beta2 * v + (1 - beta2) * g * g.", variant(square=False)),
    ]


def check_adam_step(adam_step) -> None:
    """``adam_step(p, g, m, v, step, lr, betas, eps, weight_decay)``: Adam with L2 decay, ≡ torch.optim.Adam."""
    require_callable(adam_step, "adam_step")

    def variants_for(variant):
        if variant is None:
            return ("Adam: g = g + weight_decay * p; m, v = EMAs of g and g*g; "
                    "p -= lr * m_hat / (sqrt(v_hat) + eps).")
        return _common_variants(variant) + [
            ("that is AdamW's decoupled decay; Adam's weight_decay is L2: add weight_decay * p to the gradient "
             "BEFORE the moments.", variant(decoupled=True)),
            ("weight_decay is ignored: Adam adds weight_decay * p to the gradient.", variant(decay="none")),
        ]

    _run(adam_step, False, "Exercise 03.1 · The Adam step", variants_for)


def check_adamw_step(adamw_step) -> None:
    """``adamw_step(p, g, m, v, step, lr, betas, eps, weight_decay)``: decoupled decay, ≡ torch.optim.AdamW."""
    require_callable(adamw_step, "adamw_step")

    def variants_for(variant):
        if variant is None:
            return ("AdamW: p *= 1 - lr * weight_decay first, then the Adam update with the plain gradient.")
        return _common_variants(variant) + [
            ("decay applied to m (through the gradient): that is Adam's L2. AdamW decays p directly: "
             "p *= 1 - lr * weight_decay.", variant(decoupled=False)),
            ("decay multiplies by 1 - lr * weight_decay (the learning rate scales the decay too).",
             variant(decay="plain")),
            ("decay first, as torch does: p *= 1 - lr * weight_decay BEFORE the Adam update.",
             variant(decay="after")),
        ]

    _run(adamw_step, True, "Exercise 03.2 · The AdamW step", variants_for)

