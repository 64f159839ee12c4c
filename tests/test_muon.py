"""Muon8bit: torch.optim.Muon's update with the momentum in a state format; AdamW for what Muon does not take."""

from __future__ import annotations

import pytest
import torch

from adam8lib import AdamW8bit, Muon8bit


def _grads(shape, steps, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for _ in range(steps)]


def _run(opt, params, grads):
    for gs in grads:
        for p, g in zip(params, gs if isinstance(gs, tuple) else (gs,)):
            p.grad = g.clone()
        opt.step()


@pytest.mark.parametrize("shape", [(64, 96), (96, 64), (50, 50)])
@pytest.mark.parametrize("options", [dict(), dict(nesterov=False), dict(adjust_lr_fn="match_rms_adamw"),
                                     dict(momentum=0.9, weight_decay=0.0, ns_steps=3, eps=1e-6)])
def test_fp32_states_equal_torch_muon_bit_for_bit(shape, options):
    w0 = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    a, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    ref = torch.optim.Muon([a], lr=0.02, **options)
    ours = Muon8bit([b], lr=0.02, state_format="fp32", **options)
    grads = _grads(shape, 12)
    _run(ref, [a], grads)
    _run(ours, [b], grads)
    assert torch.equal(a.detach(), b.detach())
    assert torch.equal(ref.state[a]["momentum_buffer"], ours.state[b]["momentum_buffer"])
    assert not torch.equal(a.detach(), w0)


def test_8bit_momentum_tracks_fp32_muon():
    shape = (128, 96)
    w0 = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    exact, low = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    ref = torch.optim.Muon([exact], lr=0.02)
    opt = Muon8bit([low], lr=0.02)
    grads = _grads(shape, 30, seed=3)
    _run(ref, [exact], grads)
    _run(opt, [low], grads)
    state = opt.state[low]
    assert state["momentum_buffer_codes"].dtype == torch.uint8 and state["momentum_buffer_codes"].numel() == 128 * 96
    assert state["momentum_buffer_absmax"].numel() == 128 * 96 // 256
    moved = (exact - w0).norm()
    assert (low - exact).norm() < 0.05 * moved  # measured: about 1 % of the distance travelled
    decoded = opt.decode(state, Muon8bit.rule.states[0], low)
    buf = ref.state[exact]["momentum_buffer"]
    assert (decoded - buf).norm() < 0.05 * buf.norm()


def test_parameters_muon_does_not_take_go_to_adamw():
    gen = torch.Generator().manual_seed(4)
    w, bias, emb = (torch.nn.Parameter(torch.randn(s, generator=gen)) for s in ((32, 48), (48,), (100, 48)))
    opt = Muon8bit([{"params": [w, bias]}, {"params": [emb], "use_muon": False, "lr": 3e-3}], lr=0.02,
                   weight_decay=0.01, min_8bit_size=4096, adamw_betas=(0.9, 0.95))
    assert opt.rule_for(w, opt.param_groups[0]).name == "muon"
    assert opt.rule_for(bias, opt.param_groups[0]).name == "adamw"
    assert opt.rule_for(emb, opt.param_groups[1]).name == "adamw"
    twins = [torch.nn.Parameter(p.detach().clone()) for p in (bias, emb)]
    ref = AdamW8bit([{"params": [twins[0]], "lr": 0.02}, {"params": [twins[1]], "lr": 3e-3}], betas=(0.9, 0.95),
                    weight_decay=0.01, backend="torch")
    steps = [tuple(torch.randn(p.shape, generator=gen) for p in (w, bias, emb)) for _ in range(6)]
    _run(opt, [w, bias, emb], steps)
    _run(ref, twins, [s[1:] for s in steps])
    # the bias (fp32 states) equals AdamW8bit's fp32 path bit for bit; the embedding (4800 >= 4096 elements)
    # keeps 8-bit AdamW states, its step equal to AdamW8bit's reference step too
    assert torch.equal(bias.detach(), twins[0].detach()) and torch.equal(emb.detach(), twins[1].detach())
    assert sorted(opt.state[emb]) == ["exp_avg_absmax", "exp_avg_codes", "exp_avg_sq_absmax", "exp_avg_sq_codes", "step"]
    assert sorted(opt.state[bias]) == ["exp_avg", "exp_avg_sq", "step"]
    assert sorted(opt.state[w]) == ["momentum_buffer", "step"]  # 1536 elements: fp32


def test_use_muon_true_needs_a_matrix():
    with pytest.raises(ValueError, match="use_muon=True on a parameter of shape \\(8,\\)"):
        Muon8bit([{"params": [torch.nn.Parameter(torch.zeros(8))], "use_muon": True}])
    with pytest.raises(ValueError, match="use_muon must be None, True or False"):
        Muon8bit([torch.nn.Parameter(torch.zeros(8, 8))], use_muon="yes")
    with pytest.raises(ValueError, match="adjust_lr_fn"):
        Muon8bit([torch.nn.Parameter(torch.zeros(8, 8))], adjust_lr_fn="sqrt")
    with pytest.raises(ValueError, match="ns_steps"):
        Muon8bit([torch.nn.Parameter(torch.zeros(8, 8))], ns_steps=100)
    with pytest.raises(ValueError, match="beta parameter at index 1"):
        Muon8bit([torch.nn.Parameter(torch.zeros(8))], adamw_betas=(0.9, 1.0))


def test_a_non_finite_gradient_element_does_not_spread_through_the_orthogonalization():
    shape = (64, 80)
    w0 = torch.randn(shape, generator=torch.Generator().manual_seed(5))
    for state_format in ("fp32", "8bit"):
        w = torch.nn.Parameter(w0.clone())
        opt = Muon8bit([w], lr=0.02, state_format=state_format, min_8bit_size=0)
        grads = _grads(shape, 3, seed=6)
        grads[1][3, 7] = float("nan")
        grads[2][10, 11] = float("inf")
        _run(opt, [w], grads[:1])
        before = w.detach().clone()
        _run(opt, [w], grads[1:2])
        assert torch.isfinite(w).all()
        assert w[3, 7] == before[3, 7]  # no update, no decay there
        assert (w != before).sum() == w.numel() - 1
        _run(opt, [w], grads[2:])
        assert torch.isfinite(w).all()
        buf = opt.decode(opt.state[w], Muon8bit.rule.states[0], w)
        assert torch.isfinite(buf).all() and buf[10, 11] == 0
