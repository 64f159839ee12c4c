"""The optimizer family on the quantized-state core: rules, formats, checkpoints, bad input (issue 35)."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch

from adam8lib import (AdEMAMix, AdEMAMix8bit, Adagrad8bit, Adam8bit, Adan, Adan8bit, Lion, Lion4bit, Lion8bit,
                      Muon8bit, RMSprop8bit, SGD8bit)
from adam8lib.quantized_state import FORMAT_KEY
from adam8lib.rules.ademamix import alpha_at, beta3_at

FAMILY = [Lion, Lion8bit, Lion4bit, AdEMAMix, AdEMAMix8bit, RMSprop8bit, Adagrad8bit, SGD8bit, Muon8bit, Adan, Adan8bit]
QUANTIZED = [c for c in FAMILY if c.state_format != "fp32"]


def _model(seed=0):
    gen = torch.Generator().manual_seed(seed)
    # a matrix of 4270 elements (quantized states, not a multiple of any block) and a bias (fp32 states)
    return [torch.nn.Parameter(torch.randn(70, 61, generator=gen)), torch.nn.Parameter(torch.randn(61, generator=gen))]


def _steps(opt, params, count, seed=1):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(count):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()


def _snapshot(opt, params):
    return [p.detach().clone() for p in params], copy.deepcopy([dict(opt.state[p]) for p in params])


def _same(a, b):
    (pa, sa), (pb, sb) = a, b
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))
    assert len(sa) == len(sb)
    for da, db in zip(sa, sb):
        assert da.keys() == db.keys()
        for k in da:
            x, y = da[k], db[k]
            assert torch.equal(x, y) if torch.is_tensor(x) else x == y, k


# ------------------------------------------------------------------ rules
def test_lion_weight_decay_is_decoupled_and_scaled_by_lr_as_bitsandbytes_0_50():
    # zero gradient and zero momentum: sign(0) = 0, so only the decay acts: p * (1 - lr * wd) per step
    # (bitsandbytes >= 0.50.0); before 0.50.0 its 8-bit kernels decayed by (1 - wd) without lr
    for cls in (Lion, Lion8bit, Lion4bit):
        p = torch.nn.Parameter(torch.linspace(-2, 2, 5000))
        start = p.detach().clone()
        opt = cls([p], lr=0.01, weight_decay=0.5)
        for _ in range(3):
            p.grad = torch.zeros_like(p)
            opt.step()
        expected = start.clone()
        for _ in range(3):
            expected.mul_(1 - 0.01 * 0.5)
        assert torch.equal(p.detach(), expected), cls
        assert not torch.allclose(p.detach(), start * (1 - 0.5) ** 3)


def test_lion_moves_every_element_by_lr_in_the_sign_of_the_interpolation():
    p = torch.nn.Parameter(torch.zeros(4096))
    opt = Lion8bit([p], lr=0.1, betas=(0.5, 0.99))
    g = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    p.grad = g.clone()
    opt.step()
    assert torch.equal(p.detach(), -0.1 * torch.sign(g))


def test_ademamix_warmups_follow_the_paper():
    assert alpha_at(50, 8.0, 100) == 4.0 and alpha_at(100, 8.0, 100) == 8.0 and alpha_at(300, 8.0, 100) == 8.0
    assert alpha_at(7, 8.0, None) == 8.0
    # beta3 starts at beta1 and reaches beta3 at t_beta3, increasing in between
    assert beta3_at(0, 0.9, 0.9999, 1000) == pytest.approx(0.9)
    assert beta3_at(1000, 0.9, 0.9999, 1000) == pytest.approx(0.9999, abs=1e-15)
    mids = [beta3_at(t, 0.9, 0.9999, 1000) for t in (1, 250, 500, 999)]
    assert mids == sorted(mids) and all(0.9 < b < 0.9999 for b in mids)
    # the EMA's time scale in steps, -1 / ln(beta3), grows linearly in t from beta1's to beta3's
    h = lambda b: -1 / math.log(b)  # noqa: E731
    for t in (100, 500, 900):
        assert h(beta3_at(t, 0.9, 0.9999, 1000)) == pytest.approx((1 - t / 1000) * h(0.9) + t / 1000 * h(0.9999), rel=1e-9)


def test_ademamix_with_alpha_zero_and_beta3_equal_beta1_is_adam():
    # m2 then equals m1 and weighs nothing: the AdEMAMix update is Adam's, decoupled decay included
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(300, generator=gen)
    a, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    ours = AdEMAMix([a], lr=1e-2, betas=(0.9, 0.999, 0.9), alpha=0.0, weight_decay=0.1)
    ref = torch.optim.AdamW([b], lr=1e-2, betas=(0.9, 0.999), weight_decay=0.1)
    for _ in range(10):
        g = torch.randn(300, generator=gen)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    assert torch.allclose(a, b, rtol=0, atol=1e-6)
    assert torch.equal(ours.state[a]["exp_avg_fast"], ours.state[a]["exp_avg_slow"])


def test_lion4bit_keeps_two_codes_per_byte_and_blocks_of_128():
    params = _model()
    opt = Lion4bit(params)
    _steps(opt, params, 2)
    state = opt.state[params[0]]
    assert state["exp_avg_codes"].dtype == torch.uint8 and state["exp_avg_codes"].numel() == math.ceil(4270 / 2)
    assert state["exp_avg_absmax"].numel() == math.ceil(4270 / 128)
    assert "exp_avg" in opt.state[params[1]]  # the bias: fp32


@pytest.mark.parametrize("cls", QUANTIZED, ids=lambda c: c.__name__)
def test_blocksize_lives_in_the_format_and_a_group_cannot_set_it(cls):
    params = _model()
    opt = cls(params, blocksize=512)
    assert opt.format.m.blocksize == opt.format.v.blocksize == 512
    _steps(opt, params, 1)
    spec = opt.rule_for(params[0], opt.param_groups[0]).states[0]
    assert opt.state[params[0]][spec.name + "_absmax"].numel() == math.ceil(4270 / 512)
    with pytest.raises(ValueError, match="'blocksize'.*setting of the whole"):
        cls([{"params": _model(), "blocksize": 128}])
    with pytest.raises(ValueError, match="Unsupported blocksize"):
        cls(_model(), blocksize=100)


# ------------------------------------------------------------------ a step that raises changes nothing
@pytest.mark.parametrize("cls", FAMILY, ids=lambda c: c.__name__)
def test_a_step_that_raises_changes_nothing(cls):
    params = _model()
    opt = cls(params)
    _steps(opt, params, 2)
    before = _snapshot(opt, params)
    faults = [
        ("lr", lambda g: g.update(lr=-1.0), ValueError, "lr"),
        ("blocksize", lambda g: g.update(blocksize=512), ValueError, "blocksize"),
        ("maximize", lambda g: g.update(maximize=True), ValueError, "maximize"),
    ]
    for _, edit, exc, word in faults:
        saved = dict(opt.param_groups[0])
        edit(opt.param_groups[0])
        for p in params:
            p.grad = torch.ones_like(p)
        with pytest.raises(exc, match=word):
            opt.step()
        opt.param_groups[0].clear()
        opt.param_groups[0].update(saved)
        _same(before, _snapshot(opt, params))
    # a bad gradient on the second parameter: the first is not stepped either
    params[0].grad = torch.ones_like(params[0])
    params[1].grad = torch.ones(61).to_sparse()
    with pytest.raises(RuntimeError, match="sparse gradients"):
        opt.step()
    _same(before, _snapshot(opt, params))


@pytest.mark.parametrize("cls", FAMILY, ids=lambda c: c.__name__)
def test_bad_arguments_are_refused_naming_them(cls):
    for kwargs, word in ((dict(lr=-1.0), "lr"), (dict(lr="0.1"), "lr"), (dict(weight_decay=-0.1), "weight_decay"),
                         (dict(min_8bit_size=-1), "min_8bit_size"), (dict(backend="cuda-magic"), "backend"),
                         (dict(state_format="3bit"), "state_format"), (dict(foreach=True), "foreach"),
                         (dict(nonsense=1), "nonsense")):
        with pytest.raises((ValueError, TypeError), match=word):
            cls(_model(), **kwargs)
    with pytest.raises(TypeError, match="fp32, bf16 and fp16"):
        cls([torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))])


def test_class_specific_arguments_are_checked():
    p = _model()
    with pytest.raises(ValueError, match="beta parameter at index 2"):
        AdEMAMix8bit(p, betas=(0.9, 0.999, 1.5))
    with pytest.raises(ValueError, match="betas must be a tuple of 3"):
        AdEMAMix8bit(p, betas=(0.9, 0.999))
    with pytest.raises(TypeError, match="t_alpha"):
        AdEMAMix8bit(p, t_alpha=1.5)
    with pytest.raises(ValueError, match="momentum=0.9 is not supported"):
        RMSprop8bit(p, momentum=0.9)
    with pytest.raises(ValueError, match="centered"):
        RMSprop8bit(p, centered=True)
    with pytest.raises(ValueError, match="alpha"):
        RMSprop8bit(p, alpha=0.0)
    with pytest.raises(ValueError, match="lr_decay"):
        Adagrad8bit(p, lr_decay=0.1)
    with pytest.raises(ValueError, match="nesterov"):
        SGD8bit(p, nesterov=True)
    with pytest.raises(ValueError, match="momentum"):
        SGD8bit(p, momentum=0.0)
    with pytest.raises(ValueError, match="betas must be a tuple of 2"):
        Lion8bit(p, betas=(0.9,))
    with pytest.raises(ValueError, match="blocksize=64 means nothing"):
        Lion(p, blocksize=64)


# ------------------------------------------------------------------ non-finite gradients
@pytest.mark.parametrize("cls", FAMILY, ids=lambda c: c.__name__)
def test_a_non_finite_gradient_element_resets_its_states_and_skips_its_update(cls):
    params = _model()
    opt = cls(params, lr=1e-2)
    _steps(opt, params, 2)
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(9))
    params[0].grad[3, 4] = float("nan")
    params[1].grad[5] = float("inf")
    opt.step()
    assert params[0][3, 4] == before[0][3, 4] and params[1][5] == before[1][5]
    assert all(torch.isfinite(p).all() for p in params)
    assert (params[0] != before[0]).sum() >= params[0].numel() - 1
    for p in params:
        rule = opt.rule_for(p, opt.param_groups[0])
        for spec in rule.states:
            values = opt.decode(opt.state[p], spec, p)
            assert torch.isfinite(values).all(), (cls, spec.name)
    for spec in opt.rule_for(params[1], opt.param_groups[0]).states:
        assert opt.decode(opt.state[params[1]], spec, params[1])[5] == 0


# ------------------------------------------------------------------ checkpoints
@pytest.mark.parametrize("cls", FAMILY, ids=lambda c: c.__name__)
def test_state_dict_round_trip_resumes_bit_for_bit(cls):
    params = _model()
    opt = cls(params, lr=1e-2)
    _steps(opt, params, 3)
    buffer = io.BytesIO()
    torch.save({"params": [p.detach() for p in params], "opt": opt.state_dict()}, buffer)
    buffer.seek(0)
    ckpt = torch.load(buffer, weights_only=True)
    twins = [torch.nn.Parameter(p.clone()) for p in ckpt["params"]]
    opt2 = cls(twins, lr=0.5)
    opt2.load_state_dict(ckpt["opt"])
    assert opt2.param_groups[0]["lr"] == 1e-2
    _steps(opt, params, 3, seed=5)
    _steps(opt2, twins, 3, seed=5)
    _same(_snapshot(opt, params), _snapshot(opt2, twins))
    if cls.state_format != "fp32":
        assert FORMAT_KEY in opt.state_dict()["state"][0] and FORMAT_KEY not in opt.state_dict()["state"][1]


def test_a_checkpoint_in_another_format_is_refused_naming_both_formats():
    params = _model()
    opt = Lion8bit(params)
    _steps(opt, params, 1)
    ckpt = opt.state_dict()
    with pytest.raises(ValueError, match=r"format '8bit' \(blocks of 256\); this Lion4bit stores '4bit' \(blocks of 128\)"):
        Lion4bit(_model()).load_state_dict(ckpt)
    with pytest.raises(ValueError, match=r"format '8bit' \(blocks of 256\); this Lion8bit stores '8bit' \(blocks of 512\)"):
        Lion8bit(_model(), blocksize=512).load_state_dict(ckpt)
    with pytest.raises(ValueError, match="this Lion stores fp32 states"):
        Lion(_model()).load_state_dict(ckpt)
    fresh = Lion8bit(_model())
    fresh_state = copy.deepcopy(fresh.state_dict())
    with pytest.raises(ValueError, match="has fp32 states; this Lion8bit stores"):
        fresh.load_state_dict(Lion(_model()).state_dict() | {"state": {0: {"step": 1, "exp_avg": torch.zeros(70, 61)}}})
    assert fresh.state_dict() == fresh_state  # refused: unchanged
    with pytest.raises(ValueError, match="not an AdEMAMix8bit checkpoint"):
        AdEMAMix8bit(_model()).load_state_dict(ckpt)


def test_foreign_checkpoints_are_refused_naming_their_origin():
    from _bnb import bnb

    params = _model()
    ref = bnb.optim.Lion8bit(params)
    _steps(ref, params, 1)
    with pytest.raises(ValueError, match="bitsandbytes"):
        Lion8bit(_model()).load_state_dict(ref.state_dict())
    params = _model()
    adam = Adam8bit(params, backend="torch")
    _steps(adam, params, 1)
    with pytest.raises(ValueError, match="not a Lion8bit checkpoint.*Adam8bit"):
        Lion8bit(_model()).load_state_dict(adam.state_dict())
    torch_sgd = torch.optim.SGD(_model(), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="torch.optim"):
        SGD8bit(_model()).load_state_dict(torch_sgd.state_dict() | {"state": {0: {"momentum_buffer": torch.zeros(70, 61)}}})


def test_a_corrupt_checkpoint_is_refused():
    params = _model()
    opt = AdEMAMix8bit(params)
    _steps(opt, params, 1)
    for key, value, word in (("exp_avg_sq_absmax", float("nan"), "NaN or Inf"), ("exp_avg_fast_absmax", -1.0, "negative"),
                             ("step", 1.5, "'step' must be a Python int")):
        ckpt = copy.deepcopy(opt.state_dict())
        if key == "step":
            ckpt["state"][0]["step"] = value
        else:
            ckpt["state"][0][key][0] = value
        with pytest.raises(ValueError, match=word):
            AdEMAMix8bit(_model()).load_state_dict(ckpt)
    ckpt = copy.deepcopy(opt.state_dict())
    ckpt["state"][0]["exp_avg_slow_codes"] = ckpt["state"][0]["exp_avg_slow_codes"][:-1]
    with pytest.raises(ValueError, match="should be torch.uint8\\[4270\\]"):
        AdEMAMix8bit(_model()).load_state_dict(ckpt)


# ------------------------------------------------------------------ memory
def test_state_bytes_are_codes_plus_scales():
    from _bnb import bnb

    from adam8lib.memory import compute_optimizer_size

    n = 256 * 64 + 100  # 16484 elements: 65 blocks of 256, 129 of 128
    expected = {Lion8bit: n + 4 * 65, Lion4bit: n // 2 + 4 * 129, AdEMAMix8bit: 3 * n + 3 * 4 * 65,
                RMSprop8bit: n + 4 * 65, Lion: 4 * n, AdEMAMix: 12 * n,
                Adan8bit: 3 * n + 3 * 4 * 65 + 4 * n, Adan: 16 * n}  # (Adan8bit: the previous gradient in fp32)
    for cls, nbytes in expected.items():
        p = torch.nn.Parameter(torch.zeros(n))
        opt = cls([p])
        p.grad = torch.ones(n)
        opt.step()
        mib, _ = compute_optimizer_size(opt.state.values())
        assert mib * 2**20 == nbytes, cls
    # bitsandbytes' Lion8bit keeps the same codes and scales, plus its 256-entry map (1 KiB)
    p = torch.nn.Parameter(torch.zeros(n))
    ref = bnb.optim.Lion8bit([p])
    p.grad = torch.ones(n)
    ref.step()
    assert compute_optimizer_size(ref.state.values())[0] * 2**20 == n + 4 * 65 + 4 * 256
