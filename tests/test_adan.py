"""Adan / Adan8bit (issue 52): a rule with four states, one of them kept unquantized (adam8lib/rules/adan.py).

* ``Adan`` (fp32 states) equals pytorch-optimizer 3.11.0's ``Adan`` bit for bit (the same torch ops in the same
  order), with and without weight decay, in both of its weight-decay forms, over several steps;
* ``Adan8bit`` tracks ``Adan`` in every state format, its previous gradient kept in fp32 (the last gradient, exactly);
* a state kept in bf16 (``StateSpec(kept="bf16")``) is stored rounded and read back in fp32;
* checkpoints round-trip and resume bit for bit; a checkpoint of another shape is refused; the non-finite rule
  resets the previous gradient too.
The fused steps (tests/kernels/test_cpu_rules.py, test_triton_rules.py), the conventions suite, the family's
checkpoint tests and FSDP2 (tests/test_family_distributed.py) list Adan8bit with the family."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch

from adam8lib import Adan, Adan8bit
from adam8lib.quantized_state import FORMAT_KEY
from adam8lib.rules.adan import AdanRule
from adam8lib.rules.base import StateSpec

FORMATS = ["8bit", "4bit", "fp8"]
#: After 20 steps of pure-noise gradients, |p_8bit - p_fp32| under this share of how far fp32 moved (measured: 8bit
#: 0.018, fp8 0.04, 4bit 0.25; the small tensor keeps fp32 states: 0)
TRACKS = {"8bit": 0.05, "fp8": 0.1, "4bit": 0.35}
SHAPES = [(64, 80), (300,), (4500,)]  # two quantized (by size), one under min_8bit_size


def _params(seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((torch.randn(s, generator=gen) * 0.5).to(dtype)) for s in SHAPES]


def _grads(step, seed=1):
    gen = torch.Generator().manual_seed(seed * 1000 + step)
    return [torch.randn(s, generator=gen) * (1 + step % 3) for s in SHAPES]


def _train(opt, params, steps, first=0):
    for t in range(first, first + steps):
        for p, g in zip(params, _grads(t)):
            p.grad = g.to(p.dtype)  # (a fresh tensor: pytorch-optimizer's Adan negates p.grad in place)
        opt.step()


@pytest.mark.parametrize("weight_decay, weight_decouple", [(0.0, False), (0.05, False), (0.05, True)])
def test_adan_equals_pytorch_optimizer_bit_for_bit(weight_decay, weight_decouple):
    import pytorch_optimizer as po  # (the test extras pin it: a missing one fails here, not skips)

    kwargs = dict(lr=1e-2, betas=(0.98, 0.92, 0.99), eps=1e-8, weight_decay=weight_decay,
                  weight_decouple=weight_decouple)
    ref, ours = _params(), _params()
    opt_ref = po.Adan(ref, foreach=False, **kwargs)
    opt = Adan(ours, **kwargs)
    for t in range(8):
        _train(opt_ref, ref, 1, first=t)
        _train(opt, ours, 1, first=t)
        for a, b in zip(ref, ours):
            assert torch.equal(a, b), (t, float((a - b).abs().max()))
    for a, b in zip(ref, ours):  # the states (pytorch-optimizer keeps -g_prev)
        sa, sb = opt_ref.state[a], opt.state[b]
        for key in ("exp_avg", "exp_avg_diff", "exp_avg_sq"):
            assert torch.equal(sa[key], sb[key]), key
        assert torch.equal(-sa["previous_grad"], sb["prev_grad"])


def test_defaults_are_pytorch_optimizers():
    import pytorch_optimizer as po

    theirs = po.Adan([torch.nn.Parameter(torch.zeros(2))]).defaults
    ours = Adan([torch.nn.Parameter(torch.zeros(2))]).defaults
    for key in ("lr", "betas", "eps", "weight_decay", "weight_decouple"):
        assert tuple(ours[key]) == tuple(theirs[key]) if key == "betas" else ours[key] == theirs[key], key
    assert AdanRule.hyperparameters == {k: ours[k] for k in AdanRule.hyperparameters}


def test_the_first_step_has_no_gradient_difference():
    """Step 1: g_prev is g (d = 0), so the bias-corrected update is g / (|g| + eps): lr times about sign(g)."""
    p = torch.nn.Parameter(torch.zeros(5000))
    g = torch.randn(5000)
    opt = Adan([p], lr=1e-2)
    p.grad = g.clone()
    opt.step()
    state = opt.state[p]
    assert not bool(state["exp_avg_diff"].any())
    assert torch.equal(state["prev_grad"], g)
    torch.testing.assert_close(p.detach(), -1e-2 * g / (g.abs() + 1e-8), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("fmt", FORMATS)
def test_adan8bit_tracks_adan_in_every_format(fmt):
    ref, ours = _params(), _params()
    opt_ref, opt = Adan(ref, lr=1e-2), Adan8bit(ours, lr=1e-2, state_format=fmt)
    _train(opt_ref, ref, 20)
    _train(opt, ours, 20)
    last = _grads(19)
    for i, (a, b, g) in enumerate(zip(ref, ours, last)):
        moved = float((a.detach() - _params()[i].detach()).norm())
        assert float((a.detach() - b.detach()).norm()) < TRACKS[fmt] * moved, (fmt, i)
        state = opt.state[b]
        assert state["prev_grad"].dtype == torch.float32 and state["prev_grad"].shape == b.shape
        assert torch.equal(state["prev_grad"], g)  # kept, never quantized
        quantized = b.numel() >= 4096
        assert all(f"{n}_codes" in state for n in ("exp_avg", "exp_avg_diff", "exp_avg_sq")) == quantized
        assert "prev_grad_codes" not in state


def test_state_bytes_are_three_moments_and_an_fp32_gradient():
    from adam8lib.memory import compute_optimizer_size

    n = 256 * 64 + 100
    p = torch.nn.Parameter(torch.zeros(n))
    opt = Adan8bit([p])
    p.grad = torch.ones(n)
    opt.step()
    assert compute_optimizer_size(opt.state.values())[0] * 2**20 == 3 * (n + 4 * 65) + 4 * n


@pytest.mark.parametrize("fmt", ["8bit", "4bit", "fp32"])
def test_checkpoint_round_trip_and_resume_bit_for_bit(fmt):
    params = _params()
    opt = Adan8bit(params, lr=1e-2, weight_decay=0.02, state_format=fmt)
    _train(opt, params, 4)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    if fmt != "fp32":
        assert FORMAT_KEY in saved["state"][0] and "prev_grad" in saved["state"][0]
    params2 = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt2 = Adan8bit(params2, lr=1e-2, weight_decay=0.02, state_format=fmt)
    opt2.load_state_dict(saved)
    for a, b in zip(params, params2):
        for key, value in opt.state[a].items():
            assert torch.equal(value, opt2.state[b][key]) if torch.is_tensor(value) else value == opt2.state[b][key]
    _train(opt, params, 3, first=4)
    _train(opt2, params2, 3, first=4)
    for a, b in zip(params, params2):
        assert torch.equal(a, b)


def test_a_checkpoint_of_another_shape_is_refused():
    p = torch.nn.Parameter(torch.randn(70, 61))
    opt = Adan8bit([p])
    p.grad = torch.randn(70, 61)
    opt.step()
    q = torch.nn.Parameter(torch.randn(61, 70))
    with pytest.raises(ValueError, match=r"\(70, 61\).*\(61, 70\)"):
        Adan8bit([q]).load_state_dict(opt.state_dict())
    small = torch.nn.Parameter(torch.randn(30, 20))
    opt = Adan([small])
    small.grad = torch.randn(30, 20)
    opt.step()
    with pytest.raises(ValueError, match=r"\(30, 20\)"):  # fp32 states: the previous gradient tells
        Adan([torch.nn.Parameter(torch.randn(20, 30))]).load_state_dict(opt.state_dict())


def test_a_non_finite_gradient_resets_every_state_of_that_element():
    p = torch.nn.Parameter(torch.randn(5000))
    opt = Adan8bit([p], lr=1e-2)
    for t in range(3):
        p.grad = torch.randn(5000)
        opt.step()
    before = p.detach().clone()
    g = torch.randn(5000)
    g[7] = float("nan")
    p.grad = g
    opt.step()
    state = opt.state[p]
    assert float(p.detach()[7]) == float(before[7])
    assert float(state["prev_grad"][7]) == 0.0
    assert float(opt.decode(state, opt.rule.states[2], p)[7]) == 0.0
    assert bool(torch.isfinite(p).all())


def test_bad_arguments_are_refused():
    p = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(ValueError, match="max_grad_norm"):
        Adan(p, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="betas"):
        Adan8bit(p, betas=(0.9, 0.99))
    with pytest.raises(ValueError, match="beta parameter at index 2"):
        Adan8bit(p, betas=(0.9, 0.9, 1.0))
    with pytest.raises(TypeError, match="weight_decouple"):
        Adan8bit(p, weight_decouple=1)
    with pytest.raises(TypeError):
        Adan8bit(p, adanorm=True)


# ------------------------------------------------------------------ a state kept in bf16
class _AdanBf16Prev(AdanRule):
    """Adan with its previous gradient kept in bf16 (a rule of the user's: the reference step)."""

    states = AdanRule.states[:3] + (StateSpec("prev_grad", kept="bf16"),)


class _Adan8bitBf16(Adan8bit):
    rule = _AdanBf16Prev()


@pytest.mark.parametrize("fmt", ["8bit", "fp32"])
def test_a_state_kept_in_bf16_is_stored_rounded_and_read_in_fp32(fmt):
    params = _params()
    opt = _Adan8bitBf16(params, lr=1e-2, state_format=fmt)
    _train(opt, params, 3)
    last = _grads(2)
    for p, g in zip(params, last):
        prev = opt.state[p]["prev_grad"]
        assert prev.dtype == torch.bfloat16 and prev.shape == p.shape
        assert torch.equal(prev, g.to(torch.bfloat16))
    # what the step read: bf16(g_prev), the same bits as the fp32-kept rule given bf16-rounded gradients
    ref = _params()
    opt_ref = Adan8bit(ref, lr=1e-2, state_format=fmt)
    _train(opt_ref, ref, 3)
    for p, q in zip(params, ref):
        assert not torch.equal(p, q)  # (rounding g_prev changes d)
        torch.testing.assert_close(p, q, rtol=0, atol=1e-3)
    sd = copy.deepcopy(opt.state_dict())
    params2 = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt2 = _Adan8bitBf16(params2, lr=1e-2, state_format=fmt)
    opt2.load_state_dict(sd)
    _train(opt, params, 2, first=3)
    _train(opt2, params2, 2, first=3)
    for a, b in zip(params, params2):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="prev_grad.*torch.float32"):  # a bf16-kept checkpoint in an fp32-kept class
        Adan8bit(_params(), state_format=fmt).load_state_dict(sd)


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_fused_steps_take_the_kept_state_as_values_and_refuse_it_as_codes(backend, monkeypatch):
    """The fused steps' calling convention: a kept state is ``(values,)`` (flat fp32); given as codes and scales,
    or with another dtype, the step refuses before anything changes."""
    from adam8lib import kernels
    from adam8lib.formats import get_format

    if backend == "triton":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        pytest.importorskip("triton")
        from adam8lib.kernels.triton_rules import rule_step_triton as step
    else:
        if "cpu" not in kernels.available_backends("cpu"):
            pytest.skip("the cpu backend is not built here")
        from adam8lib.kernels.cpu_rules import rule_step_cpu as step
    rule, fmt, n = AdanRule(), get_format("8bit").with_blocksize(64), 300
    group = dict(AdanRule.hyperparameters)
    p, g = torch.zeros(n), torch.ones(n)
    coded = [(torch.full((n,), 127, dtype=torch.uint8), torch.zeros(5)) for _ in range(2)]
    coded.append((torch.zeros(n, dtype=torch.uint8), torch.zeros(5)))
    prev = torch.zeros(n)
    for bad, error in (((torch.zeros(n, dtype=torch.uint8), torch.zeros(5)), TypeError),
                       ((torch.zeros(n, dtype=torch.float64),), ValueError),
                       ((torch.zeros(n - 1),), ValueError)):
        with pytest.raises(error):
            step(p, g, tuple(coded) + (bad,), rule=rule, fmt=fmt, shape=(n,), step=1, group=group)
        assert not bool(p.any())
    if backend == "cpu":  # the C++ template keeps states in fp32 only: a bf16-kept one is refused, by name
        with pytest.raises(ValueError, match="'prev_grad' is kept in bf16: the cpu template keeps states in fp32"):
            step(p, g, tuple(coded) + ((prev.bfloat16(),),), rule=_AdanBf16Prev(), fmt=fmt, shape=(n,), step=1,
                 group=group)
        assert not bool(p.any())
    step(p, g, tuple(coded) + ((prev,),), rule=rule, fmt=fmt, shape=(n,), step=1, group=group)
    assert torch.equal(prev, g)  # the kept state: the gradient, as it is
    torch.testing.assert_close(p, torch.full((n,), -1e-3), rtol=1e-6, atol=0)  # step 1: lr * g / (|g| + eps)


def test_state_spec_kept_is_checked():
    assert StateSpec("x", kept="fp32").kept_dtype == torch.float32
    assert StateSpec("x", kept="bf16").kept_dtype == torch.bfloat16
    assert StateSpec("x").kept_dtype is None
    with pytest.raises(ValueError, match="kept"):
        StateSpec("x", kept="fp16")
    with pytest.raises(ValueError, match="no codes"):
        StateSpec("x", codes="x_q", kept="fp32")


def test_kept_state_under_stochastic_rounding_chunks():
    """bf16 weights with stochastic rounding step in chunks of whole blocks: the kept state is chunked with them,
    and the result does not depend on the chunk size."""
    from adam8lib import rounding

    def run(chunk, monkeypatch=None):
        p = torch.nn.Parameter((torch.randn(3 * 4096 + 77, generator=torch.Generator().manual_seed(3))).bfloat16())
        opt = Adan8bit([p], lr=1e-2, stochastic_rounding=True, seed=4)
        old = rounding.SR_CHUNK
        rounding.SR_CHUNK = chunk
        try:
            for t in range(3):
                p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(t)).bfloat16()
                opt.step()
        finally:
            rounding.SR_CHUNK = old
        return p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)}

    (p1, s1), (p2, s2) = run(4096), run(1 << 20)
    assert torch.equal(p1, p2)
    for key in s1:
        assert torch.equal(s1[key], s2[key]), key
    assert math.isfinite(float(p1.float().sum()))


def test_kept_state_in_rank1_row_chunks():
    """4-bit states (v with rank-1 scales) on bf16 weights with stochastic rounding step a matrix in two passes over
    chunks of rows (adam8lib.rank1_chunks): the kept previous gradient goes with them; the same bits as one chunk."""
    from adam8lib import rank1_chunks

    def run(chunk):
        p = torch.nn.Parameter(torch.randn(96, 64, generator=torch.Generator().manual_seed(5)).bfloat16())
        opt = Adan8bit([p], lr=1e-2, state_format="4bit", stochastic_rounding=True, seed=2)
        old = rank1_chunks.RANK1_CHUNK
        rank1_chunks.RANK1_CHUNK = chunk
        try:
            for t in range(3):
                p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 + t)).bfloat16()
                opt.step()
        finally:
            rank1_chunks.RANK1_CHUNK = old
        return p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)}

    (p1, s1), (p2, s2) = run(64 * 16), run(1 << 22)
    assert torch.equal(p1, p2)
    for key in s1:
        assert torch.equal(s1[key], s2[key]), key
    assert s1["prev_grad"].dtype == torch.float32
