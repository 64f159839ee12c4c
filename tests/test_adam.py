"""adam8lib.adam.adam_step, the fp32 spec, against torch.optim.Adam / AdamW."""

import pytest
import torch
from torch import nn

from adam8lib.adam import adam_step


def run_both(decoupled, weight_decay, steps=100, lr=1e-2, betas=(0.9, 0.999), eps=1e-8):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 3))
    ref = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 3))
    ref.load_state_dict(model.state_dict())
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    ref_opt = cls(ref.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False)
    states = {p: (torch.zeros_like(p), torch.zeros_like(p)) for p in model.parameters()}
    for t in range(1, steps + 1):
        x = torch.randn(16, 20)
        y = torch.randint(0, 3, (16,))
        for m, opt_step in ((model, None), (ref, ref_opt)):
            m.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
        ref_opt.step()
        for p in model.parameters():
            adam_step(p.data, p.grad, *states[p], step=t, lr=lr, betas=betas, eps=eps,
                      weight_decay=weight_decay, decoupled=decoupled)
    return model, ref


@pytest.mark.parametrize("decoupled, weight_decay", [(True, 0.0), (True, 0.1), (False, 0.0), (False, 0.1)])
def test_equals_torch_optim_after_100_steps(decoupled, weight_decay):
    model, ref = run_both(decoupled, weight_decay)
    diff = max((p - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
    assert diff <= 1e-6, diff


def test_adam_and_adamw_differ_with_weight_decay():
    adam, _ = run_both(False, 0.1, steps=20)
    adamw, _ = run_both(True, 0.1, steps=20)
    assert max((p - q).abs().max().item() for p, q in zip(adam.parameters(), adamw.parameters())) > 1e-4


def test_bad_hyperparameters():
    p, g, m, v = (torch.zeros(3) for _ in range(4))
    with pytest.raises(ValueError, match="learning rate"):
        adam_step(p, g, m, v, step=1, lr=-1.0)
    with pytest.raises(ValueError, match="index 1"):
        adam_step(p, g, m, v, step=1, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="step counts from 1"):
        adam_step(p, g, m, v, step=0)
    with pytest.raises(TypeError, match="lr must be a number"):
        adam_step(p, g, m, v, step=1, lr="0.1")
