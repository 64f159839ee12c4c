"""Workbook 03 · the Adam rule: unit tests of the learner's functions (run: -m ex03)."""

import pytest
import torch

pytestmark = pytest.mark.ex03


def _run(step_fn, torch_cls, shape, steps=50, **hp):
    gen = torch.Generator().manual_seed(3)
    ref = torch.randn(shape, generator=gen).requires_grad_(True)
    p, m, v = ref.detach().clone(), torch.zeros(shape), torch.zeros(shape)
    opt = torch_cls([ref], foreach=False, **hp)
    for t in range(1, steps + 1):
        g = torch.randn(shape, generator=gen)
        ref.grad = g.clone()
        opt.step()
        step_fn(p, g, m, v, t, **hp)
    return p, ref.detach(), (m, v), opt.state[ref]


@pytest.mark.parametrize("shape", [(1,), (3, 4, 5), ()])
def test_adam_step_50_steps_like_torch(workbook, shape):
    p, want, (m, v), state = _run(workbook("03").adam_step, torch.optim.Adam, shape, lr=3e-3, weight_decay=0.01)
    torch.testing.assert_close(p, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m, state["exp_avg"], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(v, state["exp_avg_sq"], rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("shape", [(1,), (3, 4, 5), ()])
def test_adamw_step_50_steps_like_torch(workbook, shape):
    p, want, (m, v), state = _run(workbook("03").adamw_step, torch.optim.AdamW, shape, lr=3e-3, weight_decay=0.1,
                                  betas=(0.8, 0.95))
    torch.testing.assert_close(p, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m, state["exp_avg"], rtol=1e-5, atol=1e-7)


def test_adamw_zero_gradient_only_decays(workbook):
    p = torch.randn(6)
    before = p.clone()
    workbook("03").adamw_step(p, torch.zeros(6), torch.zeros(6), torch.zeros(6), 1, lr=0.1, weight_decay=0.5)
    torch.testing.assert_close(p, before * (1 - 0.1 * 0.5))


def test_first_step_moves_every_weight_by_about_lr(workbook):
    for name in ("adam_step", "adamw_step"):
        p = torch.zeros(8)
        g = torch.linspace(-3, 3, 8) + 0.1
        getattr(workbook("03"), name)(p, g, torch.zeros(8), torch.zeros(8), 1, lr=1e-2)
        torch.testing.assert_close(p, -1e-2 * torch.sign(g), rtol=1e-5, atol=1e-7)


def test_lr_zero_changes_no_weight(workbook):
    for name in ("adam_step", "adamw_step"):
        p = torch.randn(5)
        before = p.clone()
        getattr(workbook("03"), name)(p, torch.randn(5), torch.zeros(5), torch.zeros(5), 1, lr=0.0, weight_decay=0.1)
        torch.testing.assert_close(p, before)
