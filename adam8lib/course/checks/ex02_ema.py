"""Checks for workbook 02 · exponential moving averages (Adam's moments, bias correction)."""

from __future__ import annotations

import torch

from ...ema import adam_moments, bias_correction, ema_update
from ._common import call, fail, passed, require_callable
from ._shapes import call_any_shape
from ._variants import expect_close, matches

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
        got = call_any_shape(adam_moments_fn, shape, m.clone(), v.clone(), g.clone(), b1, b2,
                             may_change=(0, 1))  # m and v may be updated in place; g must stay
        what = f"adam_moments(shape={shape}, dtype={dtype}, beta1={b1}, beta2={b2})"
        _require_pair(got, what, "m, v")
        got_m, got_v = got
        if matches(got_m, want_v) and matches(got_v, want_m) and not matches(want_m, want_v):
            fail(f"{what} returned the moments in the wrong order.",
                 hint="you returned (v, m): return the new m first, then the new v.")
        _require_dtype(got_m, dtype, what + " m")
        _require_dtype(got_v, dtype, what + " v")
        expect_close(got_m, want_m, what=what + " m", dtype=dtype, x=g,
                     default="m = beta1 * m + (1 - beta1) * g",
                     variants=[
                         ("you gave beta to the new g and 1 - beta to the old average: it is the other way "
                          "round, m = beta1 * m + (1 - beta1) * g.", lambda: ema_update(g, m, b1)),
                         ("you used beta2 for m: m averages g with beta1.", lambda: ema_update(m, g, b2)),
                         ("you averaged g * g into m: m is the average of g itself.", lambda: ema_update(m, g * g, b1)),
                     ])
        expect_close(got_v, want_v, what=what + " v", dtype=dtype, x=g,
                     default="v = beta2 * v + (1 - beta2) * g * g",
                     variants=[
                         ("you averaged g, not g * g: v is the moving average of the SQUARED gradient.",
                          lambda: ema_update(v, g, b2)),
                         ("you used beta1 for v: the second moment uses beta2.", lambda: ema_update(v, g * g, b1)),
                         ("you gave beta2 to the new g * g and 1 - beta2 to the old v: it is the other way round, "
                          "v = beta2 * v + (1 - beta2) * g * g.", lambda: ema_update(g * g, v, b2)),
                         ("you squared (1 - beta2) * g: only g is squared, (1 - beta2) * g**2.",
                          lambda: v * b2 + ((1 - b2) * g) ** 2),
                         ("you averaged m * m (the new first moment): v averages g * g, the squared gradient.",
                          lambda: ema_update(v, want_m * want_m, b2)),
                         ("you averaged m * m (the old first moment): v averages g * g, the squared gradient.",
                          lambda: ema_update(v, m * m, b2)),
                         ("you averaged |g|: v averages g * g (the square, not the absolute value).",
                          lambda: ema_update(v, g.abs(), b2)),
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
        got = call_any_shape(bias_correct, shape, m.clone(), v.clone(), beta1, beta2, step)
        _compare(got, m, v, beta1, beta2, step, f"bias_correct(shape={shape}, beta1={beta1}, beta2={beta2}, "
                                                 f"step={step})")
    passed("Exercise 02.2 · Bias correction")


def _require_pair(got, what: str, names: str) -> None:
    if got is None:
        fail(f"{what} returned None.", hint=f"you returned None: end the function with `return {names}`.")
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(f"{what} returned {type(got).__name__}, expected a pair ({names}).", hint=f"return {names}")


def _require_dtype(got, dtype, what: str) -> None:
    if isinstance(got, torch.Tensor) and got.dtype != dtype and got.is_floating_point():
        fail(f"{what} has dtype {got.dtype}, expected {dtype}.",
             hint=f"your result is {got.dtype} but the inputs are {dtype}: keep the inputs' dtype (no "
                  f".double()/.float() conversion, or convert back with .to(m.dtype)).")


def _compare(got, m, v, b1, b2, t, what):
    _require_pair(got, what, "m_hat, v_hat")
    m_hat, v_hat = m / bias_correction(b1, t), v / bias_correction(b2, t)
    if matches(got[0], v_hat) and matches(got[1], m_hat) and not matches(m_hat, v_hat):
        fail(f"{what} returned the moments in the wrong order.",
             hint="you returned (v_hat, m_hat): return m_hat first, then v_hat.")
    want = (m_hat, v_hat)

    def corr(beta, s):
        return 1 - beta**s

    expect_close(tuple(got), want, what=what + ": (m_hat, v_hat)",
                 default="m_hat = m / (1 - beta1**step), v_hat = v / (1 - beta2**step), step counting from 1",
                 variants=[
                     ("you returned m and v uncorrected: divide m by 1 - beta1**step and v by 1 - beta2**step.",
                      lambda: (m, v)),
                     ("you corrected m only: v needs its own correction, v / (1 - beta2**step).",
                      lambda: (m / corr(b1, t), v)),
                     ("you corrected v with beta1: each moment uses its own beta, v / (1 - beta2**step).",
                      lambda: (m / corr(b1, t), v / corr(b1, t))),
                     ("you corrected m with beta2: each moment uses its own beta, m / (1 - beta1**step).",
                      lambda: (m / corr(b2, t), v / corr(b2, t))),
                     ("you used step + 1: step already counts from 1, the first step divides by 1 - beta.",
                      lambda: (m / corr(b1, t + 1), v / corr(b2, t + 1))),
                     ("you used step - 1: step already counts from 1 (at step 1 you divided by zero).",
                      lambda: (m / corr(b1, t - 1), v / corr(b2, t - 1))),
                     ("you multiplied by 1 - beta**step: divide by it (the average is too SMALL early on).",
                      lambda: (m * corr(b1, t), v * corr(b2, t))),
                     ("you divided by beta**step: the factor is 1 - beta**step.", lambda: (m / b1**t, v / b2**t)),
                     ("you took the square root of v_hat: return v / (1 - beta2**step) itself (Adam takes "
                      "sqrt(v_hat) later, in the update).", lambda: (m / corr(b1, t), (v / corr(b2, t)) ** 0.5)),
                     ("you wrote 1 - beta * step: it is a power, 1 - beta**step.",
                      lambda: (m / (1 - b1 * t), v / (1 - b2 * t))),
                 ])
