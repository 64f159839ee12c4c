"""Workbook 02 · EMA: unit tests of the learner's functions (run: -m ex02)."""

import pytest
import torch

from adam8lib.ema import adam_moments, ema_series

pytestmark = pytest.mark.ex02


def test_adam_moments_with_beta_zero_copies_the_gradient(workbook):
    g = torch.tensor([1.0, -2.0, 0.5])
    m, v = workbook("02").adam_moments(torch.ones(3), torch.ones(3), g, 0.0, 0.0)
    torch.testing.assert_close(m, g)
    torch.testing.assert_close(v, g * g)


def test_adam_moments_keeps_dtype_and_shape(workbook):
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = torch.randn(2, 3, 4).to(dtype)
        m, v = workbook("02").adam_moments(x, x.abs(), x, 0.9, 0.999)
        assert m.dtype == v.dtype == dtype and m.shape == v.shape == (2, 3, 4)


def test_adam_moments_over_many_steps_matches_the_library(workbook):
    fn = workbook("02").adam_moments
    gen = torch.Generator().manual_seed(2)
    m = v = mr = vr = torch.zeros(17)
    for _ in range(200):
        g = torch.randn(17, generator=gen)
        m, v = fn(m, v, g, 0.9, 0.999)
        mr, vr = adam_moments(mr, vr, g, 0.9, 0.999)
    torch.testing.assert_close(m, mr)
    torch.testing.assert_close(v, vr)
    assert bool((v >= 0).all())


def test_bias_correct_first_step_gives_back_g(workbook):
    g = torch.tensor([3.0, -1e-4, 0.0])
    for b1, b2 in [(0.9, 0.999), (0.5, 0.5), (0.99, 0.9999)]:
        m_hat, v_hat = workbook("02").bias_correct((1 - b1) * g, (1 - b2) * g * g, b1, b2, 1)
        torch.testing.assert_close(m_hat, g)
        torch.testing.assert_close(v_hat, g * g)


def test_bias_correct_matches_the_corrected_series(workbook):
    xs = torch.randn(30, 4, generator=torch.Generator().manual_seed(3))
    plain = ema_series(xs, 0.8)
    corrected = ema_series(xs, 0.8, bias_correct=True)
    for t in (1, 2, 10, 30):
        m_hat, _ = workbook("02").bias_correct(plain[t - 1], plain[t - 1].abs(), 0.8, 0.8, t)
        torch.testing.assert_close(m_hat, corrected[t - 1])


def test_bias_correct_vanishes_late(workbook):
    m, v = torch.randn(5), torch.rand(5)
    m_hat, v_hat = workbook("02").bias_correct(m, v, 0.9, 0.999, 100_000)
    torch.testing.assert_close(m_hat, m)
    torch.testing.assert_close(v_hat, v)
