"""Workbook 02 · exponential moving averages: what learners write instead of the solution."""

from __future__ import annotations

import numpy as np
import torch

from adam8lib.course import checks

from . import Right, Wrong


# ---------------------------------------------------------------------------- 02.1
def moments(*, m_rule="ok", v_rule="ok", order="mv", double=False):
    def adam_moments(m, v, g, beta1, beta2):
        if double:
            m, v, g = m.double(), v.double(), g.double()
        m_new = {"ok": beta1 * m + (1 - beta1) * g,
                 "swapped": (1 - beta1) * m + beta1 * g,
                 "beta2": beta2 * m + (1 - beta2) * g}[m_rule]
        v_new = {"ok": beta2 * v + (1 - beta2) * g * g,
                 "unsquared": beta2 * v + (1 - beta2) * g,
                 "beta1": beta1 * v + (1 - beta1) * g * g,
                 "square_after": beta2 * v + ((1 - beta2) * g) ** 2,
                 "of_m": beta2 * v + (1 - beta2) * m_new * m_new,
                 "swapped": (1 - beta2) * v + beta2 * g * g,
                 "abs": beta2 * v + (1 - beta2) * g.abs()}[v_rule]
        if order == "none":
            return None
        return (v_new, m_new) if order == "vm" else (m_new, v_new)

    return adam_moments


def moments_by_index(m, v, g, beta1, beta2):
    m_new, v_new = m.clone(), v.clone()
    for i in range(len(m)):  # a vector habit: len() of a 0-d tensor fails
        m_new[i] = beta1 * m[i] + (1 - beta1) * g[i]
        v_new[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i]
    return m_new, v_new


def moments_in_place(m, v, g, beta1, beta2):
    m.mul_(beta1).add_(g, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    return m, v


def moments_squaring_g_in_place(m, v, g, beta1, beta2):
    m_new = beta1 * m + (1 - beta1) * g
    return m_new, beta2 * v + (1 - beta2) * g.mul_(g)  # the caller's gradient is squared too


def moments_with_lerp(m, v, g, beta1, beta2):
    return torch.lerp(m, g, 1 - beta1), torch.lerp(v, g.square(), 1 - beta2)


def moments_through_numpy(m, v, g, beta1, beta2):
    mn, vn, gn = m.numpy(), v.numpy(), g.numpy()
    m_new = mn + (1 - beta1) * (gn - mn)
    v_new = vn + (1 - beta2) * (np.square(gn) - vn)
    return torch.from_numpy(np.asarray(m_new, dtype=mn.dtype)), torch.from_numpy(np.asarray(v_new, dtype=vn.dtype))


# ---------------------------------------------------------------------------- 02.2
def corrected(rule):
    def bias_correct(m, v, beta1, beta2, step):
        c = lambda beta, t: 1 - beta**t  # noqa: E731
        out = {
            "none": lambda: (m, v),
            "m_only": lambda: (m / c(beta1, step), v),
            "beta1_both": lambda: (m / c(beta1, step), v / c(beta1, step)),
            "step_plus_1": lambda: (m / c(beta1, step + 1), v / c(beta2, step + 1)),
            "step_minus_1": lambda: (m / c(beta1, step - 1), v / c(beta2, step - 1)),
            "multiply": lambda: (m * c(beta1, step), v * c(beta2, step)),
            "beta_pow": lambda: (m / beta1**step, v / beta2**step),
            "sqrt": lambda: (m / c(beta1, step), (v / c(beta2, step)).sqrt()),
            "times_step": lambda: (m / (1 - beta1 * step), v / (1 - beta2 * step)),
            "swapped": lambda: (v / c(beta2, step), m / c(beta1, step)),
            "none_returned": lambda: None,
        }[rule]
        return out()

    return bias_correct


def corrected_in_place(m, v, beta1, beta2, step):
    m.div_(1 - beta1**step)
    v.div_(1 - beta2**step)
    return m, v


def corrected_with_math(m, v, beta1, beta2, step):
    import math

    return m / -math.expm1(step * math.log(beta1)), v / -math.expm1(step * math.log(beta2))


_C1, _C2 = checks.check_adam_moments, checks.check_bias_correct

WRONG = [
    # 02.1
    Wrong("02.1", _C1, moments(m_rule="swapped"), "beta and 1 - beta swapped for m",
          "you gave beta to the new g", True),
    Wrong("02.1", _C1, moments(m_rule="beta2"), "beta2 used for m", "you used beta2 for m", True),
    Wrong("02.1", _C1, moments(v_rule="unsquared"), "g not squared for v", "you averaged g, not g * g", True),
    Wrong("02.1", _C1, moments(v_rule="beta1"), "beta1 used for v", "you used beta1 for v", True),
    Wrong("02.1", _C1, moments(v_rule="square_after"), "((1 - beta2) * g)**2",
          "you squared (1 - beta2) * g", True),
    Wrong("02.1", _C1, moments(v_rule="of_m"), "v averages m * m", "you averaged m * m", True),
    Wrong("02.1", _C1, moments(v_rule="swapped"), "beta and 1 - beta swapped for v",
          "you gave beta2 to the new g * g", True),
    Wrong("02.1", _C1, moments(v_rule="abs"), "v averages |g|", "you averaged |g|", True),
    Wrong("02.1", _C1, moments(order="vm"), "returns (v, m)", "you returned (v, m)", True),
    Wrong("02.1", _C1, moments(double=True), "computes in float64",
          "your result is torch.float64 but the inputs are torch.float32", True),
    Wrong("02.1", _C1, moments(order="none"), "no return statement", "you returned None", True),
    Wrong("02.1", _C1, moments_by_index, "a loop over range(len(m))", "your function failed on a 0-d tensor", True),
    Wrong("02.1", _C1, moments_squaring_g_in_place, "squares the caller's g in place (g.mul_(g))",
          "modified its argument `g` in place", True),
    # 02.2
    Wrong("02.2", _C2, corrected("none"), "no bias correction", "you returned m and v uncorrected", True),
    Wrong("02.2", _C2, corrected("m_only"), "only m corrected", "you corrected m only", True),
    Wrong("02.2", _C2, corrected("beta1_both"), "beta1 for both", "you corrected v with beta1", True),
    Wrong("02.2", _C2, corrected("step_plus_1"), "step + 1", "you used step + 1", True),
    Wrong("02.2", _C2, corrected("step_minus_1"), "step - 1", "you used step - 1", True),
    Wrong("02.2", _C2, corrected("multiply"), "multiplied by the factor",
          "you multiplied by 1 - beta**step", True),
    Wrong("02.2", _C2, corrected("beta_pow"), "divided by beta**step", "you divided by beta**step", True),
    Wrong("02.2", _C2, corrected("sqrt"), "square root of v_hat", "you took the square root of v_hat", True),
    Wrong("02.2", _C2, corrected("times_step"), "1 - beta * step", "you wrote 1 - beta * step", True),
    Wrong("02.2", _C2, corrected("swapped"), "returns (v_hat, m_hat)", "you returned (v_hat, m_hat)", True),
    Wrong("02.2", _C2, corrected("none_returned"), "no return statement", "you returned None", True),
    Wrong("02.2", _C2, corrected_in_place, "divides the caller's m and v in place (the stored moments become "
          "bias-corrected)", "modified its argument `m` in place", True),
]

RIGHT = [
    Right("02.1", _C1, moments_in_place, how="in place with mul_/add_/addcmul_, returning the same tensors"),
    Right("02.1", _C1, moments_with_lerp, how="torch.lerp towards g and g.square()"),
    Right("02.1", _C1, moments_through_numpy, how="NumPy round trip in the input's dtype, m + (1-b)(g-m)"),
    Right("02.2", _C2, corrected_with_math, how="1 - beta**t as -expm1(t log beta)"),
]
