"""The convergence benchmark's machinery: reproducible runs, paired statistics, ablation variants.

The benchmarks themselves (``bench/convergence.py``) are not run here; a tiny configuration
of each task is run twice and must give identical numbers, and the statistics are checked
against closed forms and hand calculations (no scipy).
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import stats  # noqa: E402

from adam8lib import Adam8bit, AdamW8bit  # noqa: E402
from adam8lib.variants import Adam8bitVariant  # noqa: E402


# ------------------------------------------------------------------ statistics
@pytest.mark.parametrize("p", [0.9, 0.975, 0.995])
def test_t_quantile_matches_closed_forms(p):
    # df = 1 is the Cauchy distribution: t = tan(pi (p - 1/2));
    # df = 2 has t = (2p - 1) sqrt(2 / (4 p (1 - p))).
    assert stats.t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
    assert stats.t_quantile(p, 2) == pytest.approx((2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p))), rel=1e-9)
    assert stats.t_quantile(1 - p, 2) == pytest.approx(-stats.t_quantile(p, 2))


def test_t_quantile_table_values_and_normal_limit():
    # printed t tables (two-sided 95 %): df 7 -> 2.365, df 9 -> 2.262, df 30 -> 2.042
    assert stats.t_quantile(0.975, 7) == pytest.approx(2.365, abs=5e-4)
    assert stats.t_quantile(0.975, 9) == pytest.approx(2.262, abs=5e-4)
    assert stats.t_quantile(0.975, 30) == pytest.approx(2.042, abs=5e-4)
    assert stats.t_quantile(0.975, 1e6) == pytest.approx(1.959964, abs=1e-5)  # normal limit
    assert stats.t_cdf(0.0, 5) == 0.5
    # df = 4 has the closed form P(T <= t) = 1/2 + t (t^2 + 6) / (2 (t^2 + 4)^{3/2})
    t = -1.5
    assert stats.t_cdf(t, 4) == pytest.approx(0.5 + t * (t * t + 6) / (2 * (t * t + 4) ** 1.5), rel=1e-12)


def test_paired_difference_by_hand():
    a = [1.0, 2.0, 3.0, 4.0]
    b = [1.5, 2.0, 3.5, 5.0]  # differences 0.5, 0, 0.5, 1: mean 0.5, sample sd sqrt(1/6)
    out = stats.paired(a, b)
    assert out["mean"] == pytest.approx(0.5)
    assert out["std"] == pytest.approx(math.sqrt(1 / 6))
    half = stats.t_quantile(0.975, 3) * math.sqrt(1 / 6) / 2
    assert (out["ci_low"], out["ci_high"]) == pytest.approx((0.5 - half, 0.5 + half))
    assert stats.t_quantile(0.975, 3) == pytest.approx(3.182, abs=5e-4)
    rel = stats.paired(a, b, relative=True)
    assert rel["diffs"] == pytest.approx([0.5, 0.0, 0.5 / 3, 0.25])
    with pytest.raises(ValueError):
        stats.paired([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        stats.mean_ci([1.0])


# ------------------------------------------------------------------ reproducibility
@pytest.fixture(autouse=True)
def _restore_torch_globals():
    """The runs set the thread count and deterministic mode for the process: put them back."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


def _tiny_lm():
    import lm_task

    return replace(lm_task.LMConfig(), n_layer=1, n_embd=32, n_head=2, context=16, batch_size=4, steps=12,
                   eval_windows=4)


def _lm_run(make, seed=0):
    import lm_task

    kwargs = {} if make is torch.optim.AdamW else {"backend": "torch"}  # no kernel build in this test
    return lm_task.run(lambda groups, c: make(groups, lr=c.lr, betas=c.betas, **kwargs), seed, _tiny_lm(), threads=1)


def test_lm_run_is_reproducible_and_paired():
    import lm_task

    first = _lm_run(Adam8bit)
    again = _lm_run(Adam8bit)
    assert first["loss"] == again["loss"] and first["valid_loss"] == again["valid_loss"]
    assert first["threads"] == 1 and torch.get_num_threads() == 1 and torch.are_deterministic_algorithms_enabled()
    # the same seed gives every optimizer the same start: the first loss is the same number
    ref = _lm_run(torch.optim.AdamW)
    assert ref["loss"][0] == first["loss"][0]
    assert ref["loss"][1:] != first["loss"][1:]  # ...and then the optimizers differ
    # the seed sets the initial weights and the batches
    cfg, corpus = _tiny_lm(), lm_task.load_corpus()
    w0, w1 = (lm_task.build_model(cfg, s).transformer.wte.weight for s in (0, 1))
    assert not torch.equal(w0, w1) and torch.equal(w0, lm_task.build_model(cfg, 0).transformer.wte.weight)
    b0, b1 = (next(lm_task.batches(corpus["train"], cfg, s)) for s in (0, 1))
    assert not torch.equal(b0, b1) and torch.equal(b0, next(lm_task.batches(corpus["train"], cfg, 0)))
    # AdamW8bit is Adam8bit with a different default weight decay: the groups set it, so equal
    assert _lm_run(AdamW8bit)["loss"] == first["loss"]
    assert math.isfinite(first["valid_loss"]) and first["valid_loss"] < math.log(256)


def test_lm_corpus_is_split_by_file_and_hashed():
    import lm_task

    corpus = lm_task.load_corpus()
    assert not set(corpus["files"]["train"]) & set(corpus["files"]["valid"])
    assert len(corpus["sha256"]) == 64 and corpus["bytes"]["valid"] > 50_000
    assert corpus["train"].dtype == torch.uint8


def test_cls_run_is_reproducible():
    import cls_task

    cfg = replace(cls_task.ClsConfig(), train_pairs=64, epochs=1)
    runs = [cls_task.run(lambda g, c: torch.optim.AdamW(g, lr=c.lr), 0, cfg) for _ in range(2)]
    assert runs[0]["loss"] == runs[1]["loss"] and runs[0]["accuracy"] == runs[1]["accuracy"]
    assert len(runs[0]["loss"]) == 2


def test_spike_counter():
    import lm_task

    losses = [2.0] * 25 + [3.5] + [2.0] * 5 + [float("nan")]
    assert lm_task.count_spikes(losses) == 2
    assert lm_task.count_spikes([2.0] * 30) == 0


# ------------------------------------------------------------------ ablation variants
def _model_and_grads(seed=0):
    torch.manual_seed(seed)
    w = torch.nn.Parameter(torch.randn(64, 96))
    grads = [torch.randn(64, 96) * (1 + 10 * (i % 2)) for i in range(3)]
    return w, grads


def _steps(opt_cls, **kw):
    w, grads = _model_and_grads()
    opt = opt_cls([w], lr=1e-2, **kw)
    for g in grads:
        w.grad = g.clone()
        opt.step()
    return w.detach(), opt.state[w]


def test_variant_default_is_adam8bit_exactly():
    w_ref, s_ref = _steps(Adam8bit, backend="torch")
    w_var, s_var = _steps(Adam8bitVariant, backend="torch")
    assert torch.equal(w_ref, w_var)
    for key in ("state1", "state2", "absmax1", "absmax2"):
        assert torch.equal(s_ref[key], s_var[key])


@pytest.mark.parametrize("quantization", ["linear", "dynamic"])
def test_per_tensor_variant_keeps_one_scale(quantization):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(64, 96))
    g = torch.randn(64, 96)
    opt = Adam8bitVariant([w], lr=1e-2, quantization=quantization, blockwise=False)
    w.grad = g
    opt.step()
    state = opt.state[w]
    assert state["absmax1"].shape == (1,) and state["absmax2"].shape == (1,)
    m = (1 - 0.9) * g.flatten()
    assert state["absmax1"].item() == pytest.approx(m.abs().max().item(), rel=1e-6)
    decoded = opt.qmap1[state["state1"].long()] * state["absmax1"]
    err = (decoded - m).abs()
    if quantization == "linear":
        # evenly spaced codes 2/255 apart: every value within half a step (keep-sign may add one step near 0)
        assert torch.allclose(opt.qmap1, torch.linspace(-1, 1, 256))
        assert err.max().item() <= 2 / 255 * state["absmax1"].item() + 1e-7
    else:
        assert torch.equal(opt.qmap1, Adam8bit([torch.nn.Parameter(torch.zeros(1))]).qmap1)
    assert f"{quantization} map, per-tensor scales" in repr(opt)


@pytest.mark.parametrize("quantization", ["linear", "dynamic"])
def test_one_outlier_hurts_per_tensor_scales_more_than_blocks(quantization):
    # the first 256-element block has gradients 1000x larger: with one scale per tensor the
    # other blocks' m is stored relative to that outlier, so it is stored far less precisely
    g = torch.randn(4096, generator=torch.Generator().manual_seed(1))
    g[:256] *= 1000.0
    errors = {}
    for blockwise in (True, False):
        w = torch.nn.Parameter(torch.zeros(4096))
        opt = Adam8bitVariant([w], quantization=quantization, blockwise=blockwise, backend="torch")
        w.grad = g.clone()
        opt.step()
        st = opt.state[w]
        absmax = st["absmax1"].repeat_interleave(256) if blockwise else st["absmax1"]
        decoded = opt.qmap1[st["state1"].long()] * absmax
        m = 0.1 * g
        errors[blockwise] = ((decoded - m)[256:].abs() / m[256:].abs().clamp_min(1e-3)).median().item()
    assert errors[False] > 5 * errors[True], errors


def test_variant_rejects_bad_options():
    w = torch.nn.Parameter(torch.zeros(8))
    with pytest.raises(ValueError, match="quantization"):
        Adam8bitVariant([w], quantization="log")
    with pytest.raises(ValueError, match="reference backend"):
        Adam8bitVariant([w], blockwise=False, backend="cpu")
    with pytest.raises(TypeError):
        Adam8bitVariant([w], blockwise="no")


# ------------------------------------------------------------------ sign rule and bitsandbytes' CPU rounding
def test_keep_sign_true_is_adam8bit_bit_for_bit():
    # keep_sign=True through the variant's own phases (blockwise=True, run by a subclass hook)
    # must equal the library's step exactly: same update, same requantization
    class OwnPhases(Adam8bitVariant):
        custom_requantize = True

    w_ref, s_ref = _steps(Adam8bit, backend="torch")
    for cls, kw in ((Adam8bitVariant, {"keep_sign": True}), (OwnPhases, {})):
        w_var, s_var = _steps(cls, backend="torch", **kw)
        assert torch.equal(w_ref, w_var), cls
        for key in ("state1", "state2", "absmax1", "absmax2"):
            assert torch.equal(s_ref[key], s_var[key]), (cls, key)


def test_keep_sign_false_requantizes_to_the_plain_nearest_code():
    from adam8lib.quant import quantize_blockwise

    w, grads = _model_and_grads()
    # gradients spanning 8 decades inside every block, so that some states fall below the map's finest step
    scale = 10.0 ** (-8 * torch.rand(w.shape, generator=torch.Generator().manual_seed(2)))
    opt = Adam8bitVariant([w], lr=1e-3, keep_sign=False)
    kept = Adam8bitVariant([torch.nn.Parameter(w.detach().clone())], lr=1e-3, keep_sign=True)
    assert "signs not kept" in repr(opt) and "signs not kept" not in repr(kept)
    for opt_ in (opt, kept):
        p = opt_.param_groups[0]["params"][0]
        p.grad = grads[0] * scale
        opt_.step()
    # the fp32 states after step 1, computed by the library's one fp32 update from zero states
    from adam8lib.kernels.reference import adam_update_fp32

    g = (grads[0] * scale).flatten()
    m, v = torch.zeros_like(g), torch.zeros_like(g)
    adam_update_fp32(torch.zeros_like(g), g, m, v, step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)
    codes1, absmax1 = quantize_blockwise(m, opt.qmap1)          # plain nearest code, blocks of 256
    codes2, absmax2 = quantize_blockwise(v, opt.qmap2)
    st = opt.state[w]
    assert torch.equal(st["state1"], codes1) and torch.equal(st["state2"], codes2)
    assert torch.equal(st["absmax1"], absmax1) and torch.equal(st["absmax2"], absmax2)
    # the rule's visible difference: without it tiny non-zero states became 0, with it none did
    zero1, zero2 = 127, 0
    assert ((st["state2"] == zero2) & (v != 0)).sum() > 100
    assert ((st["state1"] == zero1) & (m != 0)).sum() > 100
    ks = kept.state[kept.param_groups[0]["params"][0]]
    assert ((ks["state2"] == zero2) & (v != 0)).sum() == 0 and ((ks["state1"] == zero1) & (m != 0)).sum() == 0


def test_keep_sign_must_be_a_bool_and_own_phases_need_the_reference_backend():
    w = torch.nn.Parameter(torch.zeros(8))
    with pytest.raises(TypeError, match="keep_sign"):
        Adam8bitVariant([w], keep_sign=1)
    with pytest.raises(ValueError, match="keep_sign=False runs the reference backend"):
        Adam8bitVariant([w], keep_sign=False, backend="cpu")
    assert Adam8bitVariant([w], keep_sign=False).backend == "torch"


def _bnb_cpu_codes(x, code):
    from _bnb import bnb  # noqa: F401  (registers the ops quietly)

    return torch.ops.bitsandbytes.quantize_blockwise(x.contiguous(), code, 256)


@pytest.mark.parametrize("signed", [True, False])
def test_bitsandbytes_cpu_quantizer_is_not_the_nearest_code_near_zero(signed):
    # The root cause the LM table measures: bitsandbytes 0.50.2's CPU quantizer agrees with the
    # exact nearest code (adam8lib's keep_sign=False rounding) away from 0, but near 0 its
    # search cannot resolve the dynamic map's finest steps: every value below about 2e-5 (of
    # absmax) lands on the code of +-2.1e-5 (m) or 1.6e-5 (v), never on a finer code or on 0.
    from adam8lib.quant import dynamic_map, nearest_code

    code = dynamic_map(signed)
    mags = torch.logspace(-9, 0, 255 * 20)
    values = torch.cat([-mags.flip(0), mags]) if signed else mags
    x = torch.cat([values.view(-1, 255), torch.ones(values.numel() // 255, 1)], 1).reshape(-1)  # absmax 1
    q, absmax = _bnb_cpu_codes(x, code)
    assert torch.all(absmax == 1)
    nearest = nearest_code(x, code, keep_sign=False)
    far = x.abs() > 0.1
    assert torch.equal(q[far], nearest[far])                      # same rounding away from 0
    tiny = x.abs() < 1e-6
    zero = 127 if signed else 0
    assert (nearest[tiny] == zero).sum() > 100                     # the exact nearest code is often 0 ...
    assert not torch.any(q[tiny] == zero)                          # ... bitsandbytes' never is
    if signed:
        assert code[131] == pytest.approx(2.125e-5) and code[123] == -code[131]
        assert torch.all(q[tiny & (x > 0)] == 131)
        neg = q[tiny & (x < 0)]
        assert torch.all((neg == 123) | (neg == 131))              # -2.1e-5, or (below ~1e-7) the sign flips
        assert (neg == 123).float().mean() > 0.5
    else:
        assert code[7] == pytest.approx(1.5625e-5)
        assert torch.all(q[tiny] == 7)


def test_adam8lib_step_with_bitsandbytes_rounding_equals_bnb_adam8bit_on_cpu():
    from _bnb import bnb
    from bnb_rounding import Adam8bitBnbRounding

    w0, grads = _model_and_grads()
    gen = torch.Generator().manual_seed(3)
    grads = grads + [g * 10.0 ** (-7 * torch.rand(g.shape, generator=gen)) for g in grads]
    w_ours = torch.nn.Parameter(w0.detach().clone())
    w_bnb = torch.nn.Parameter(w0.detach().clone())
    ours = Adam8bitBnbRounding([w_ours], lr=1e-2, weight_decay=0.01)
    ref = bnb.optim.Adam8bit([w_bnb], lr=1e-2, weight_decay=0.01)
    plain = Adam8bit([torch.nn.Parameter(w0.detach().clone())], lr=1e-2, weight_decay=0.01)
    for g in grads:
        for opt in (ours, ref, plain):
            opt.param_groups[0]["params"][0].grad = g.clone()
            opt.step()
    s_ours, s_ref = ours.state[w_ours], ref.state[w_bnb]
    assert torch.equal(w_ours.detach(), w_bnb.detach())
    for key in ("state1", "state2", "absmax1", "absmax2"):  # bitsandbytes keeps the codes in the parameter's shape
        assert torch.equal(s_ours[key], s_ref[key].reshape(-1)), key
    # and the library's own rounding does differ from it on these gradients, in codes and in the parameter
    p_plain = plain.param_groups[0]["params"][0]
    assert not torch.equal(plain.state[p_plain]["state2"], s_ref["state2"].reshape(-1))
    assert not torch.equal(p_plain.detach(), w_bnb.detach())
    with pytest.raises(TypeError, match="fixes keep_sign"):
        Adam8bitBnbRounding([w_ours], keep_sign=False)
    # tensors below min_8bit_size keep fp32 states; bitsandbytes' 32-bit CPU update folds the bias
    # corrections differently (lr*sqrt(bc2)/bc1 and eps*sqrt(bc2)): equal up to float rounding only
    torch.manual_seed(0)
    small = [torch.nn.Parameter(torch.randn(128)) for _ in range(2)]
    small[1].data.copy_(small[0].data)
    opts = (Adam8bitBnbRounding([small[0]], lr=1e-2, weight_decay=0.01), bnb.optim.Adam8bit([small[1]], lr=1e-2, weight_decay=0.01))
    for _ in range(20):
        g = torch.randn(128)
        for p_, opt in zip(small, opts):
            p_.grad = g.clone()
            opt.step()
    assert torch.allclose(small[0], small[1], rtol=0, atol=1e-6)
