"""adam8lib.ema: moving averages and bias correction."""

import pytest
import torch

from adam8lib.ema import adam_moments, bias_correction, ema_series, ema_update


def test_ema_update_formula():
    avg, x = torch.tensor([1.0, -2.0]), torch.tensor([3.0, 4.0])
    assert torch.allclose(ema_update(avg, x, 0.9), 0.9 * avg + 0.1 * x)
    assert torch.equal(ema_update(avg, x, 0.0), x)


def test_bias_correction_recovers_a_constant_stream():
    g = torch.full((3,), 2.5)
    for beta in (0.9, 0.999):
        raw = ema_series([g] * 7, beta)
        corrected = ema_series([g] * 7, beta, bias_correct=True)
        assert torch.allclose(raw[-1], (1 - beta**7) * g)
        assert torch.allclose(corrected, g.expand(7, 3), rtol=1e-5)
    assert bias_correction(0.9, 1) == pytest.approx(0.1)
    assert bias_correction(0.999, 1000) == pytest.approx(1 - 0.999**1000)


def test_adam_moments_match_torch_adam_states():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(50))
    opt = torch.optim.Adam([p], betas=(0.8, 0.95))
    m = v = torch.zeros(50)
    for _ in range(5):
        p.grad = torch.randn(50)
        m, v = adam_moments(m, v, p.grad, 0.8, 0.95)
        opt.step()
    assert torch.allclose(m, opt.state[p]["exp_avg"], atol=1e-7)
    assert torch.allclose(v, opt.state[p]["exp_avg_sq"], atol=1e-7)


def test_bad_input():
    with pytest.raises(ValueError, match="beta"):
        ema_update(torch.zeros(1), torch.ones(1), 1.0)
    with pytest.raises(ValueError, match="beta1"):
        adam_moments(torch.zeros(1), torch.zeros(1), torch.ones(1), -0.1, 0.9)
    with pytest.raises(ValueError, match="step counts from 1"):
        bias_correction(0.9, 0)
    with pytest.raises(ValueError, match="at least one"):
        ema_series([], 0.9)
