"""Checks for workbook 02 · exponential moving averages (Adam's moments, bias correction)."""

from __future__ import annotations

import torch

from ...ema import adam_moments, bias_correction, ema_update
from ._common import call, fail, passed, require_callable
from ._variants import expect_close

__all__ = ["check_adam_moments", "check_bias_correct"]


def _inputs(shape, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    m = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype) * 0.1
    v = torch.rand(shape, generator=gen, dtype=torch.float64).to(dtype) * 0.01
    g = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    return m, v, g


# ---------------------------------------------------------------------------- 02.1
def check_adam_moments(adam_moments_fn) -> None:
    """``adam_moments(m, v, g, beta1, beta2) -> (m_new, v_new)``."""
    require_callable(adam_moments_fn, "adam_moments")
    cases = [((7,), torch.float32, 0.9, 0.999), ((3, 5), torch.float32, 0.5, 0.75),
             ((4, 1, 3), torch.float64, 0.8, 0.95), ((6,), torch.float32, 0.0, 0.0),
             ((), torch.float32, 0.9, 0.99)]
    for i, (shape, dtype, b1, b2) in enumerate(cases):
        m, v, g = _inputs(shape, dtype, seed=i)
        want_m, want_v = adam_moments(m, v, g, b1, b2)
        got = call(adam_moments_fn, m.clone(), v.clone(), g.clone(), b1, b2)
        what = f"adam_moments(shape={shape}, dtype={dtype}, beta1={b1}, beta2={b2})"
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(f"{what} returned {type(got).__name__}, expected a pair (m, v).", hint="return m, v")
        got_m, got_v = got
        expect_close(got_m, want_m, what=what + " m", dtype=dtype,
                     default="m = beta1 * m + (1 - beta1) * g",
                     variants=[
                         ("beta and 1 - beta are swapped: the OLD average gets beta, the new g gets 1 - beta.",
                          lambda: ema_update(g, m, b1)),
                         ("m tracks g with beta1 (you used beta2).", lambda: ema_update(m, g, b2)),
                         ("m is the average of g itself, not of g squared.", lambda: ema_update(m, g * g, b1)),
                     ])
        expect_close(got_v, want_v, what=what + " v", dtype=dtype,
                     default="v = beta2 * v + (1 - beta2) * g * g",
                     variants=[
                         ("g not squared: v is the moving average of g * g.", lambda: ema_update(v, g, b2)),
                         ("beta1 used for v: the second moment uses beta2.", lambda: ema_update(v, g * g, b1)),
                         ("beta and 1 - beta are swapped: the OLD average gets beta2, g * g gets 1 - beta2.",
                          lambda: ema_update(g * g, v, b2)),
                         ("square the gradient, not the average: (1 - beta2) * g**2, not ((1 - beta2) * g)**2.",
                          lambda: v * b2 + ((1 - b2) * g) ** 2),
                     ])
    passed("Exercise 02.1 · Adam's two moving averages")


# ---------------------------------------------------------------------------- 02.2
def check_bias_correct(bias_correct) -> None:
    """``bias_correct(m, v, beta1, beta2, step) -> (m_hat, v_hat)``."""
    require_callable(bias_correct, "bias_correct")
    # 1. a constant gradient: after t steps from zero the corrected averages are exactly g and g*g
    g = torch.tensor([0.5, -2.0, 3.0, 1e-3])
    b1, b2 = 0.9, 0.999
    m = torch.zeros_like(g)
    v = torch.zeros_like(g)
    for t in range(1, 6):
        m, v = adam_moments(m, v, g, b1, b2)
        got = call(bias_correct, m.clone(), v.clone(), b1, b2, t)
        _compare(got, m, v, b1, b2, t, f"bias_correct after {t} steps of a constant g")
        expect_close(got[0], g, what=f"step {t}: m_hat for a constant g", rtol=1e-5, atol=1e-7,
                     default="for a constant g the corrected average is g itself")
    # 2. random states, various betas and steps (incl. step 1 and a late step)
    gen = torch.Generator().manual_seed(0)
    for shape, beta1, beta2, step in [((5,), 0.9, 0.999, 1), ((2, 3), 0.8, 0.99, 7), ((9,), 0.5, 0.9, 100),
                                      ((3,), 0.9, 0.999, 10_000)]:
        m = torch.randn(shape, generator=gen)
        v = torch.rand(shape, generator=gen)
        got = call(bias_correct, m.clone(), v.clone(), beta1, beta2, step)
        _compare(got, m, v, beta1, beta2, step, f"bias_correct(shape={shape}, beta1={beta1}, beta2={beta2}, "
                                                 f"step={step})")
    passed("Exercise 02.2 · Bias correction")


def _compare(got, m, v, b1, b2, t, what):
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(f"{what} returned {type(got).__name__}, expected a pair (m_hat, v_hat).", hint="return m_hat, v_hat")
    want = (m / bias_correction(b1, t), v / bias_correction(b2, t))

    def corr(beta, s):
        return 1 - beta**s

    expect_close(tuple(got), want, what=what + ": (m_hat, v_hat)",
                 default="m_hat = m / (1 - beta1**step), v_hat = v / (1 - beta2**step), step counting from 1",
                 variants=[
                     ("no bias correction: divide m by 1 - beta1**step and v by 1 - beta2**step.", lambda: (m, v)),
                     ("v needs its own correction, 1 - beta2**step (you corrected m only).",
                      lambda: (m / corr(b1, t), v)),
                     ("each moment uses its own beta: m with beta1, v with beta2.",
                      lambda: (m / corr(b1, t), v / corr(b1, t))),
                     ("step counts from 1: the first step divides by 1 - beta (you used step + 1).",
                      lambda: (m / corr(b1, t + 1), v / corr(b2, t + 1))),
                     ("step counts from 1 (you used step - 1).",
                      lambda: (m / corr(b1, t - 1), v / corr(b2, t - 1))),
                     ("divide by the correction factor, don't multiply.", lambda: (m * corr(b1, t), v * corr(b2, t))),
                     ("the factor is 1 - beta**step, not beta**step.", lambda: (m / b1**t, v / b2**t)),
                     ("don't take the square root here: v_hat = v / (1 - beta2**step) (Adam takes sqrt(v_hat) later).",
                      lambda: (m / corr(b1, t), v / corr(b2, t) ** 0.5)),
                 ])
