"""The cpu rule template (adam8lib/kernels/cpu_rules.py, csrc/rules.h) is QuantizedStateOptimizer's
reference step (backend="torch"), bit for bit, and "auto" runs it: states (codes and absmax) and parameters, over many steps, at every SIMD
level of this build, for Lion8bit, AdEMAMix8bit (with its warm-ups), RMSprop8bit, Adagrad8bit and Adan8bit (four
states, the previous gradient kept in fp32; both forms of weight decay), with
weight decay, sizes that are not multiples of the block, bf16/fp16 parameters, NaN/Inf gradients and
gradients whose square overflows; and the one registry finds it."""

from __future__ import annotations

import pytest
import torch

from adam8lib import family, kernels
from adam8lib.formats import get_format
from adam8lib.kernels import cpu, cpu_rules
from adam8lib.quantized_state import QuantizedStateOptimizer
from adam8lib.rules.adamw import AdamWRule

from _fused_calls import count_fused_calls, unwrapped

SIMD_LEVELS = list(range(cpu.simd_level() + 1))  # 0 = scalar loops only; the second machine has fewer

CLASSES = {
    "lion": (family.Lion8bit, dict(lr=3e-3, betas=(0.9, 0.99), weight_decay=0.1)),
    "ademamix": (family.AdEMAMix8bit, dict(lr=2e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=7, t_beta3=5,
                                           weight_decay=0.01)),
    "rmsprop": (family.RMSprop8bit, dict(lr=1e-3, alpha=0.9, eps=1e-8, weight_decay=0.01)),
    "adagrad": (family.Adagrad8bit, dict(lr=1e-2, eps=1e-10, weight_decay=0.01)),
    "adan": (family.Adan8bit, dict(lr=2e-3, betas=(0.98, 0.92, 0.99), eps=1e-8, weight_decay=0.02)),
    "adan_decoupled": (family.Adan8bit, dict(lr=2e-3, weight_decay=0.05, weight_decouple=True)),
}
#: (shape, parameter dtype, gradient dtype): not multiples of the block, one of several whole blocks
PARAMS = [((4097,), torch.float32, torch.float32), ((24, 256), torch.float32, torch.float32),
          ((4500,), torch.bfloat16, torch.bfloat16), ((4300,), torch.float16, torch.float16)]


def _params(specs=PARAMS, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((torch.randn(shape, generator=gen) * 0.1).to(dtype)) for shape, dtype, _ in specs]


def _grads(step, gen, specs=PARAMS):
    out = []
    for (shape, _, dtype) in specs:
        decades = 10.0 ** torch.randint(-4, 2, shape, generator=gen).float()
        g = torch.randn(shape, generator=gen) * decades
        flat = g.view(-1)
        if step == 3:  # the non-finite rule: NaN, +-Inf, and a finite gradient whose square overflows
            flat[5], flat[flat.numel() // 2], flat[-2] = float("nan"), float("inf"), -float("inf")
            flat[flat.numel() // 3] = 3e30
        out.append(g.to(dtype))
    return out


def _assert_same(ref_opt, got_opt, ref_params, got_params, what):
    for i, (a, b) in enumerate(zip(ref_params, got_params)):
        pa, pb = a.detach().float(), b.detach().float()
        same = (pa == pb) | (pa.isnan() & pb.isnan())
        assert bool(same.all()), (f"{what}: parameter {i} differs at {int((~same).sum())} places, max |diff| "
                                  f"{float((pa - pb)[~same].abs().max())}")
        assert torch.equal(a.detach().view(torch.int16 if a.element_size() == 2 else torch.int32),
                           b.detach().view(torch.int16 if b.element_size() == 2 else torch.int32)), what
        sa, sb = ref_opt.state[a], got_opt.state[b]
        assert sa.keys() == sb.keys() and sa["step"] == sb["step"]
        for key, value in sa.items():
            if torch.is_tensor(value):
                diff = (value != sb[key]).nonzero().flatten()
                assert diff.numel() == 0, (f"{what}: {key} of parameter {i} differs at {diff.numel()} places, first "
                                           f"{diff[:4].tolist()}: {value[diff[:4]].tolist()} vs {sb[key][diff[:4]].tolist()}")


def _run(name, simd, monkeypatch, *, steps=8, state_format=None, blocksize=None, threads=1, specs=PARAMS):
    cls, hyper = CLASSES[name]
    monkeypatch.setattr(cpu_rules, "SIMD", simd)
    options = {k: v for k, v in (("state_format", state_format), ("blocksize", blocksize)) if v is not None}
    ref_params, got_params = _params(specs), _params(specs)
    ref = cls(ref_params, **hyper, **options, backend="torch")
    got = cls(got_params, **hyper, **options)  # "auto": the cpu template for every quantized parameter
    assert all(unwrapped(got.fused_step(p).fn) is cpu_rules.rule_step_cpu
               for p in got_params)
    calls = count_fused_calls(monkeypatch, "cpu")
    gen = torch.Generator().manual_seed(1)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for t in range(1, steps + 1):
            for p_ref, p_got, g in zip(ref_params, got_params, _grads(t, gen, specs)):
                p_ref.grad, p_got.grad = g.clone(), g.clone()
            ref.step()
            got.step()
            _assert_same(ref, got, ref_params, got_params, f"{name}, simd {simd}, step {t}")
    finally:
        torch.set_num_threads(old_threads)
    assert len(calls) == steps * len(specs)  # every step of every parameter ran the kernel: no silent fallback
    return ref, got


@pytest.mark.parametrize("simd", SIMD_LEVELS)
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_equals_reference_at_every_simd_level(name, simd, monkeypatch):
    _run(name, simd, monkeypatch)


@pytest.mark.parametrize("name", ["lion", "ademamix", "adan"])
def test_fp8_states_and_another_block_size(name, monkeypatch):
    _run(name, SIMD_LEVELS[-1], monkeypatch, steps=4, state_format="fp8")
    _run(name, SIMD_LEVELS[-1], monkeypatch, steps=4, blocksize=64)


def test_two_threads_large_tensor(monkeypatch):
    """Above 2^15 elements the kernel splits tiles over threads: the same bits as the reference."""
    _run("ademamix", SIMD_LEVELS[-1], monkeypatch, steps=2, threads=2, specs=[((33000,), torch.float32, torch.float32)])


@pytest.mark.parametrize("simd", SIMD_LEVELS)
def test_rmsprop_with_negative_decoded_state_takes_torchs_sqrt(simd, monkeypatch):
    """RMSprop's state sits on the signed map: a corrupt state with negative codes makes sqrt NaN in the
    reference; the kernel's inline MKL root is only valid for x >= 0, so such a tile calls torch's sqrt
    (the tile's scan for a negative state runs with the SIMD level's lanes: negatives at the start of
    the first tile, alone in the middle of the second, and in the scalar tail of the last block)."""
    ref, got = _run("rmsprop", simd, monkeypatch, steps=1)
    gen = torch.Generator().manual_seed(5)
    for opt in (ref, got):
        for p in opt.param_groups[0]["params"][:1]:
            codes = opt.state[p]["square_avg_codes"]
            codes[:300] = 20  # negative map values
            codes[2048 + 37] = 20
            codes[-1] = 20
    ref_params, got_params = ref.param_groups[0]["params"], got.param_groups[0]["params"]
    for p_ref, p_got, g in zip(ref_params, got_params, _grads(2, gen)):
        p_ref.grad, p_got.grad = g.clone(), g.clone()
    ref.step()
    got.step()
    _assert_same(ref, got, ref_params, got_params, "rmsprop with negative states")


@pytest.mark.parametrize("simd", SIMD_LEVELS)
def test_negative_scan_at_every_simd_level(simd):
    """The scan that sends a tile with a negative state to torch's sqrt (rules.h any_negative) finds one
    negative anywhere, in the vector loops and the scalar tail; -0.0, +0 and NaN are not negative."""
    import ctypes

    lib = cpu.load_extension()

    def scan(x):
        return lib.rule_any_negative(ctypes.c_void_p(x.data_ptr()), ctypes.c_int64(x.numel()), ctypes.c_int(simd))

    for n in (0, 1, 7, 8, 15, 16, 17, 33, 2048, 2053):
        x = torch.rand(n) + 1e-3
        assert scan(x) == 0, n
        for where in sorted({0, n // 2, n - 1} & set(range(n))):
            y = x.clone()
            y[where] = -1e-30
            assert scan(y) == 1, (n, where)
        if n:
            y = x.clone()
            y[: n // 2 + 1] = -0.0
            y[-1] = float("nan")
            assert scan(y) == 0, n


def test_registry_finds_the_template_by_what_it_stores():
    from adam8lib.rules import AdEMAMixRule, LionRule

    for fmt in ("8bit", "fp8"):
        found = kernels.find_step(LionRule(), get_format(fmt), "auto", "cpu")
        assert found is not None and found.fn is cpu_rules.rule_step_cpu and found.backend == "cpu"
    assert kernels.find_step(LionRule(), get_format("8bit").with_blocksize(128), "cpu", "cpu") is not None
    assert kernels.find_step(LionRule(), get_format("4bit"), "auto", "cpu") is None  # nibbles: reference step
    assert kernels.find_step(AdEMAMixRule(), None, "auto", "cpu") is None  # fp32 states: reference step
    assert kernels.find_step(LionRule(), get_format("8bit"), "torch", "cpu") is None
    assert kernels.find_step(LionRule(), get_format("8bit"), "auto", "meta") is None
    assert set(kernels.backends_for("ademamix", get_format("8bit"))) >= {"cpu"}


def test_bad_input_is_refused_before_anything_changes():
    cls, hyper = CLASSES["ademamix"]
    p = torch.nn.Parameter(torch.randn(5000))
    opt = cls([p], **hyper)
    p.grad = torch.randn(5000)
    opt.step()  # states exist
    rule, fmt = opt.rule, opt.format
    state = opt.state[p]
    states = tuple((state[s.name + "_codes"], state[s.name + "_absmax"]) for s in rule.states)
    before = [t.clone() for pair in states for t in pair] + [p.detach().clone()]
    group = opt.rule_group(rule, opt.param_groups[0])
    bad_calls = [
        dict(states=states[:2]),  # a state missing
        dict(states=(states[0], states[1], (states[2][0][:-1], states[2][1]))),  # short codes
        dict(states=(states[0], states[1], (states[2][0].float(), states[2][1]))),  # codes not uint8
        dict(p=p.detach().double().view(-1)),  # fp64 parameter
        dict(g=torch.randn(4999)),  # gradient of another size
        dict(p=p.detach().view(50, 100)),  # not flat
        dict(step=0),  # step counts from 1
    ]
    for change in bad_calls:
        args = dict(p=p.detach().view(-1), g=p.grad.view(-1), states=states, step=2)
        args.update(change)
        with pytest.raises((ValueError, TypeError)):
            cpu_rules.rule_step_cpu(args["p"], args["g"], args["states"], rule=rule, fmt=fmt, shape=(5000,),
                                    step=args["step"], group=group)
        after = [t for pair in states for t in pair] + [p.detach()]
        assert all(torch.equal(a, b) for a, b in zip(before, after)), change
    with pytest.raises(ValueError, match="4bit"):
        cpu_rules.rule_step_cpu(p.detach().view(-1), p.grad.view(-1), states, rule=rule, fmt=get_format("4bit"),
                                shape=(5000,), step=2, group=group)


def test_scalars_follow_the_warm_up_schedules():
    group = dict(lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=10, t_beta3=10, eps=1e-8, weight_decay=0.0)
    first, later = cpu_rules.rule_scalars("ademamix", 1, group), cpu_rules.rule_scalars("ademamix", 20, group)
    assert first[7] == pytest.approx(0.5) and later[7] == 5.0  # alpha_t ramps up to alpha
    assert first[2] < later[2] == 0.9999  # beta3_t ramps up to beta3
    assert first[10] == 1.0  # no weight decay: p * 1 == p
    lion = cpu_rules.rule_scalars("lion", 3, dict(lr=0.1, betas=(0.9, 0.99), weight_decay=0.5))
    assert lion[4] == pytest.approx(0.95) and lion[5] == -0.1  # decoupled decay scaled by lr (bitsandbytes >= 0.50)
    with pytest.raises(ValueError, match="no rule 'sgd'"):
        cpu_rules.rule_scalars("sgd", 1, group)


class _AdamW8bitOnTheCore(QuantizedStateOptimizer):
    """The AdamW rule on the core (what Adam8bit becomes with core35's work)."""

    rule = AdamWRule()
    state_format = "8bit"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, **kwargs):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay), **kwargs)


@pytest.mark.parametrize("fmt", ["8bit", "fp8", "4bit-naive"])
def test_adam_steps_in_the_registry_equal_the_core_reference(fmt, monkeypatch):
    """The registry's ("adamw", fmt, "cpu") steps (today's 8-bit, FP8 and 4-bit kernels behind adapters)
    are the core's reference step of the AdamW rule, bit for bit: what core35 switches Adam onto."""
    CLASSES["adamw"] = (_AdamW8bitOnTheCore, dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01))

    def run(steps=4):
        cls, hyper = CLASSES["adamw"]
        ref_params, got_params = _params(), _params()
        ref = cls(ref_params, **hyper, state_format=fmt, backend="torch")
        got = cls(got_params, **hyper, state_format=fmt, backend="cpu")
        calls = count_fused_calls(monkeypatch, "cpu")
        gen = torch.Generator().manual_seed(1)
        for t in range(1, steps + 1):
            for p_ref, p_got, g in zip(ref_params, got_params, _grads(t, gen)):
                p_ref.grad, p_got.grad = g.clone(), g.clone()
            ref.step()
            got.step()
            _assert_same(ref, got, ref_params, got_params, f"adamw {fmt}, step {t}")
        assert len(calls) == steps * len(PARAMS)

    try:
        run()
    finally:
        del CLASSES["adamw"]
