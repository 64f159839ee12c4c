"""Triton kernels (lesson 08) against the reference backend and ``adam8lib.quant``.

Without a GPU the kernels run in Triton's interpreter: TRITON_INTERPRET=1 is set here and in
tests/conftest.py before ``adam8lib.kernels.triton`` is imported. Every GPU test is the
``device="cuda"`` case of a CPU test (``@pytest.mark.gpu``, skipped only without CUDA); the
``"cpu"`` case needs the interpreter, i.e. runs wherever there is no GPU (and in
``TRITON_INTERPRET=1 pytest -m "not gpu"`` on a GPU machine).

What "agree" means, and why:

* quantize / dequantize: identical codes, absmax and values. Both sides do an IEEE division
  ``1/absmax``, one fp32 multiply and the same search-and-compare rule.
* fused step, the states (codes and absmax): identical on the CPU. They depend only on the
  moments, which the kernel computes with the reference's fp32 operations in the same order
  (a fused multiply-add exactly where torch's CPU kernels use one). On a GPU they are expected
  identical too, but torch's CUDA kernels are compiled separately and may fuse differently:
  an ulp of difference in m or v can move a value sitting on the boundary between two codes.
  So GPU runs require >= 99.9% identical codes, any other one code away, absmax within 1e-6
  relative — compared step by step from identical inputs, so a difference cannot snowball.
* fused step, the parameters: within 1e-6 (fp32). Not bit-identical even on the CPU: torch
  computes ``v.sqrt()`` with MKL's vectorized sqrt, which is not correctly rounded (one ulp off on
  ~20% of inputs, measured on this machine), while the kernel's ``sqrt_rn`` is. A bf16/fp16
  parameter is the rounding of those fp32 values, which are an ulp apart at most, so it is
  identical unless the two straddle a rounding boundary; then they are neighbours: we allow one
  ulp of bf16/fp16 on at most 1% of the elements (a rounding bug, such as truncating, fails this).
"""

import copy
import importlib.util
import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # before adam8lib.kernels.triton is imported (conftest does it too)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from torch import nn  # noqa: E402

from adam8lib import AdamW8bit, kernels  # noqa: E402
from adam8lib.kernels import reference  # noqa: E402
from adam8lib.kernels import triton as kt  # noqa: E402
from adam8lib.quant import (  # noqa: E402
    dequantize_blockwise,
    dynamic_map,
    linear_map,
    nearest_code,
    num_blocks,
    quantize_blockwise,
    quantize_blocks,
)

REPO = Path(__file__).resolve().parents[2]
SIZES = [1, 255, 256, 257, 4095, 10_003]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BLOCKSIZES = [256, 2048]
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        not kt.INTERPRETED, reason="the CPU twin needs TRITON_INTERPRET=1 (set automatically without a GPU)")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU")]),
]
MAPS = {"dynamic signed": dynamic_map(True), "dynamic unsigned": dynamic_map(False), "linear": linear_map(True)}


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


def heavy_tailed(n, seed, device, scale=1.0):
    """Values spread over many decades (like Adam's moments), a zero block, both signs."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen) * torch.exp(2 * torch.randn(n, generator=gen)) * scale
    x[256:512] = 0.0  # an all-zero block (absmax 0) when n is large enough
    return x.to(device)


# ------------------------------------------------------------------ quantize / dequantize
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("blocksize", BLOCKSIZES)
@pytest.mark.parametrize("map_name", list(MAPS))
def test_quantize_matches_quant(device, n, blocksize, map_name):
    code = MAPS[map_name].to(device)
    x = heavy_tailed(n, seed=n, device=device)
    codes, absmax = kt.quantize_blockwise_triton(x, code, blocksize)
    ref_codes, ref_absmax = quantize_blockwise(x, code, blocksize)
    assert codes.dtype == torch.uint8 and codes.shape == x.shape
    assert torch.equal(absmax, ref_absmax)
    assert torch.equal(codes, ref_codes)


@pytest.mark.parametrize("n", [257, 10_003])
def test_quantize_keep_sign_matches_quant(device, n):
    code = dynamic_map(True).to(device)
    x = heavy_tailed(n, seed=5, device=device, scale=1e-3)
    x[-200:-100] = -1e-9 * (1 + torch.rand(100, device=device))  # tiny values whose nearest entry is 0.0
    x[-100:] = 1e-9 * (1 + torch.rand(100, device=device))
    codes, absmax = kt.quantize_blockwise_triton(x, code, 256, keep_sign=True)
    ref_codes, ref_absmax = quantize_blocks(x, code, 256, keep_sign=True)
    assert torch.equal(absmax, ref_absmax) and torch.equal(codes, ref_codes)
    assert (code[codes[-200:-100].long()] < 0).all() and (code[codes[-100:].long()] > 0).all()  # signs kept


@pytest.mark.parametrize("map_name", list(MAPS))
def test_quantize_exact_values_and_ties(device, map_name):
    """Map entries get their own code; exact midpoints (ties) get the lower index."""
    code = MAPS[map_name].to(device)
    mid = (code[:-1] + code[1:]) / 2  # fp32 midpoints; some are exact ties, some not
    x = torch.cat([torch.ones(1, device=device), code, mid])  # absmax 1, so x/absmax == x
    codes, absmax = kt.quantize_blockwise_triton(x, code, 2048)
    assert torch.equal(codes, quantize_blockwise(x, code, 2048)[0]) and absmax.item() == 1.0
    own = codes[1:257].long()
    assert torch.equal(code[own], code)  # each entry maps to itself (or its equal twin)
    lower = torch.arange(255, device=device)
    tie = (code[1:] - mid) == (mid - code[:-1])
    assert tie.sum() > 50, "expected many exact ties"
    assert torch.equal(codes[257:][tie].long(), lower[tie])


@pytest.mark.parametrize("map_name", list(MAPS))
@pytest.mark.parametrize("keep_sign", [False, True])
def test_raw_bits_table_gives_nearest_code(map_name, keep_sign):
    """The kernels' lookup (``_table_code``: entry = table[top 16 bits], then
    ``bits 8-15 if (bits << 16) > entry (unsigned) else bits 0-7``), written out here with
    integer tensor ops, returns ``nearest_code`` for every kind of fp32: 2**20 random bit
    patterns (both signs, subnormals, NaNs, infinities), +-0, +-inf, the map's entries and
    the floats on and next to each midpoint between neighbours, on both sides of zero."""
    code = MAPS[map_name]
    steps, use_table = kt.nearest_code_table(code, keep_sign=keep_sign)
    assert use_table and steps.dtype == torch.int32 and steps.shape == (65536,)
    gen = torch.Generator().manual_seed(1)
    random_bits = torch.randint(-2**31, 2**31, (1 << 20,), generator=gen, dtype=torch.int64).to(torch.int32)
    mid = (code[:-1] + code[1:]) / 2
    inf = torch.tensor([float("inf")])
    near = torch.cat([code, mid, torch.nextafter(mid, inf), torch.nextafter(mid, -inf), code * 1e-3])
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, -1e-45, 3.4e38, -3.4e38])
    x = torch.cat([random_bits.view(torch.float32), special, near, -near])
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    entry = steps.to(torch.int64)[bits >> 16] & 0xFFFFFFFF
    got = torch.where(((bits << 16) & 0xFFFFFFFF) > entry, entry >> 8, entry) & 0xFF
    expected = nearest_code(x, code, keep_sign=keep_sign).long()
    assert (x.isnan().sum() > 1000) and ((x < 0).sum() > 100_000)  # the sample covers both signs and NaNs
    assert torch.equal(got, expected), (x[got != expected][:5], got[got != expected][:5], expected[got != expected][:5])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("blocksize", BLOCKSIZES)
def test_dequantize_matches_quant(device, n, dtype, blocksize):
    gen = torch.Generator().manual_seed(n)
    codes = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen).to(device)
    absmax = (torch.rand(num_blocks(n, blocksize), generator=gen) * 10).to(device)
    absmax[0] = 0.0
    code = dynamic_map(True).to(device)
    out = kt.dequantize_blockwise_triton(codes, absmax, code, blocksize, dtype)
    assert out.dtype == dtype
    assert torch.equal(out, dequantize_blockwise(codes, absmax, code, blocksize, dtype))


def test_quantize_roundtrip_shapes_and_empty(device):
    x = torch.randn(3, 5, 7, device=device)
    codes, absmax = kt.quantize_blockwise_triton(x.transpose(0, 2), blocksize=64)  # non-contiguous input
    assert codes.shape == (7, 5, 3) and absmax.shape == (2,)
    back = kt.dequantize_blockwise_triton(codes, absmax, blocksize=64)
    assert torch.allclose(back, x.transpose(0, 2), atol=0.02 * x.abs().max().item())
    empty_codes, empty_absmax = kt.quantize_blockwise_triton(torch.empty(0, device=device))
    assert empty_codes.numel() == 0 and empty_absmax.numel() == 0


# ------------------------------------------------------------------ the fused step
def fresh_state(n, blocksize, device):
    blocks = num_blocks(n, blocksize)
    return [torch.full((n,), 127, dtype=torch.uint8, device=device), torch.zeros(n, dtype=torch.uint8, device=device),
            torch.zeros(blocks, device=device), torch.zeros(blocks, device=device)]


def gradient(n, step, dtype, device, blocksize):
    gen = torch.Generator().manual_seed(1000 * step + n)
    g = torch.randn(n, generator=gen) * torch.exp(torch.randn(n, generator=gen)) * 1e-2
    if step == 1 and n >= 2 * blocksize:
        g[:blocksize] = 0.0  # a block whose new states are all zero (absmax 0)
    if step == 2:
        g[(7 * step) % n] = float("nan")
    if step == 3:
        g[(11 * step) % n] = float("inf")
        g[(13 * step) % n] = -float("inf")
    return g.to(device=device, dtype=dtype)


def assert_params_agree(ours, ref):
    """fp32: within 1e-6. bf16/fp16: identical, or one ulp apart on <= 1% (see module docstring)."""
    if ours.dtype == torch.float32:
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)
        return
    diff = (ours.float() - ref.float()).abs()
    one_ulp = torch.finfo(ours.dtype).eps * ref.float().abs()  # >= one ulp at |ref|
    assert (diff <= torch.maximum(one_ulp, torch.full_like(diff, 1e-6))).all(), diff.max()
    assert (diff > 1e-6).float().mean() <= 0.01


def assert_states_agree(ours, ref, exact):
    names = ("state1", "state2", "absmax1", "absmax2")
    for name, a, b in zip(names, ours, ref):
        if exact:
            assert torch.equal(a, b), f"{name}: {(a != b).sum().item()} of {a.numel()} differ"
        elif a.dtype == torch.float32:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=0, msg=name)
        else:
            steps = (a.long() - b.long()).abs()
            assert steps.max() <= 1 and (steps > 0).float().mean() <= 1e-3, f"{name}: {(steps > 0).sum().item()} differ"


def run_steps(device, n, dtype, blocksize, weight_decay, steps=3, **launch):
    """Several steps of kernel and reference from the same inputs; compare after each."""
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=weight_decay, blocksize=blocksize)
    qmap1, qmap2 = dynamic_map(True).to(device), dynamic_map(False).to(device)
    p_ref = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(device=device, dtype=dtype)
    s_ref = fresh_state(n, blocksize, device)
    for step in range(1, steps + 1):
        g = gradient(n, step, dtype, device, blocksize)
        p, s = p_ref.clone(), [t.clone() for t in s_ref]  # identical inputs for both
        kt.adam8bit_step_triton(p, g, *s, qmap1, qmap2, step=step, **hyper, **launch)
        reference.adam8bit_step(p_ref, g, *s_ref, qmap1, qmap2, step=step, **hyper)
        assert_states_agree(s, s_ref, exact=device.type == "cpu")
        assert_params_agree(p, p_ref)
        bad = ~torch.isfinite(g)
        if bad.any():  # non-finite gradient: states restart at 0, parameter untouched
            assert torch.equal(p[bad], p_ref[bad]) and (s[0][bad] == 127).all() and (s[1][bad] == 0).all()
    return p_ref, s_ref


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("blocksize", BLOCKSIZES)
def test_fused_step_matches_reference(device, n, dtype, blocksize):
    # AdamW-style decay with blocksize 256, plain Adam with 2048: both paths, every size and dtype
    run_steps(device, n, dtype, blocksize, weight_decay=0.1 if blocksize == 256 else 0.0)


@pytest.mark.parametrize("blocksize", [64, 4096])
@pytest.mark.parametrize("tile,num_warps", [(None, None), (256, 2), (8192, 4)])
def test_fused_step_any_blocksize_and_tiling(device, blocksize, tile, num_warps):
    """Other supported blocksizes, and tiles of one block or many: the result never changes."""
    n = 1_000 if blocksize == 64 else 10_003  # 16 or 3 blocks
    run_steps(device, n, torch.float32, blocksize, weight_decay=0.01, steps=2, tile=tile, num_warps=num_warps)


def test_step_specialization_flags():
    """Which compiled variant a step gets: the decay multiply only when fp32(1 - lr*wd) != 1;
    the reset keeps p without a select only when its update is exactly -0.0 (lr >= 0 finite,
    eps > 0, bias correction > 0, all in fp32); int64 offsets from 2**31 padded elements on."""
    def flags(padded_n=10**6, tile=2048, lr=1e-3, wd=1e-2, eps=1e-8, bc2=0.03):
        return kt.step_specialization(padded_n, tile, decay=1.0 - lr * wd, neg_step_size=-lr / 0.1,
                                      bias_correction2_sqrt=bc2, eps=eps)
    assert flags() == {"DECAY": True, "RESET_KEEPS_P": True, "INT64": False}
    assert not flags(wd=0.0)["DECAY"] and not flags(wd=1e-6)["DECAY"]  # 1 - 1e-9 rounds to 1.0 in fp32
    assert flags(lr=0.0)["RESET_KEEPS_P"]  # -0.0 * m: still a -0.0 update
    for bad in (dict(lr=-1e-3), dict(eps=0.0), dict(eps=1e-50), dict(bc2=0.0), dict(lr=float("inf"))):
        assert not flags(**bad)["RESET_KEEPS_P"], bad
    assert not flags(padded_n=2**31 - 2048 - 1)["INT64"] and flags(padded_n=2**31 - 2048)["INT64"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_step_general_variant_matches_reference(monkeypatch, dtype):
    """The variant for any hyperparameters and sizes (decay multiply, reset by a final select,
    int64 offsets), forced on a small tensor: the same states and parameters as the reference,
    non-finite gradients included (the specialized variants are checked by the tests above)."""
    if not kt.INTERPRETED:
        pytest.skip("runs in the interpreter (TRITON_INTERPRET=1)")
    natural, seen = kt.step_specialization, []

    def forced(*args, **kwargs):
        seen.append(natural(*args, **kwargs))
        return {"DECAY": True, "RESET_KEEPS_P": False, "INT64": True}

    monkeypatch.setattr(kt, "step_specialization", forced)
    run_steps(torch.device("cpu"), 4095, dtype, 256, weight_decay=0.1)
    assert seen and seen[0]["RESET_KEEPS_P"] and not seen[0]["INT64"]  # the natural choice differed


def test_fused_step_huge_gradient_resets_only_its_element():
    """The non-finite rule: g = 1e25 or 1e30 (finite, but g*g overflows v to inf) resets that
    element's m and v to 0 and leaves its parameter alone, so the block's absmax stays finite
    and its neighbours are unaffected: no NaN after several steps, states identical to the
    reference's; 1e-30 (underflow) steps normally."""
    if not kt.INTERPRETED:
        pytest.skip("runs in the interpreter (TRITON_INTERPRET=1)")
    n, device = 1000, torch.device("cpu")
    qmap1, qmap2 = dynamic_map(True), dynamic_map(False)
    p_ref, s_ref = torch.randn(n), fresh_state(n, 256, device)
    p, s = p_ref.clone(), [t.clone() for t in s_ref]
    for step in range(1, 5):
        g = torch.randn(n, generator=torch.Generator().manual_seed(step)) * 1e-3
        g[:5], g[300], g[301:305] = 1e25, 1e30 if step % 2 else -1e30, 1e-30
        before = p.clone()
        hyper = dict(step=step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, blocksize=256)
        kt.adam8bit_step_triton(p, g, *s, qmap1, qmap2, **hyper)
        reference.adam8bit_step(p_ref, g, *s_ref, qmap1, qmap2, **hyper)
        assert_states_agree(s, s_ref, exact=True)
        assert_params_agree(p, p_ref)
        assert not p.isnan().any() and torch.isfinite(s[2]).all() and torch.isfinite(s[3]).all()
        assert torch.equal(p[:5], before[:5]) and p[300] == before[300]  # reset: no update, no decay
        assert (p[256:300] != before[256:300]).all()  # its block's neighbours stepped
        assert (s[0][:5] == 127).all() and (s[1][:5] == 0).all() and s[1][300] == 0


# ------------------------------------------------------------------ the optimizer with backend="triton"
def test_adamw8bit_triton_backend_matches_torch_backend(device):
    """A tiny model, 4 steps: 8-bit states and parameters agree after every step (rules above)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 20)).to(device)  # 8192, 5120: 8-bit
    twin = copy.deepcopy(model)
    ours = AdamW8bit(model.parameters(), lr=1e-2, weight_decay=0.1, backend="triton")
    ref = AdamW8bit(twin.parameters(), lr=1e-2, weight_decay=0.1, backend="torch")
    keys = ("state1", "state2", "absmax1", "absmax2")
    for step in range(1, 5):
        loss = model(torch.randn(16, 32, device=device)).square().mean()
        ours.zero_grad()
        loss.backward()
        for p, q in zip(model.parameters(), twin.parameters()):  # the same gradients for both
            q.grad = p.grad.clone()
        ours.step()
        ref.step()
        eight_bit = 0
        for p, q in zip(model.parameters(), twin.parameters()):
            a, b = ours.state[p], ref.state[q]
            assert a.keys() == b.keys() and a["step"] == b["step"] == step
            if "state1" in a:
                eight_bit += 1
                assert_states_agree([a[k] for k in keys], [b[k] for k in keys], exact=device.type == "cpu")
                for k in keys:  # next step from identical states (a no-op on the CPU, where they are equal)
                    a[k].copy_(b[k])
            torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
            p.data.copy_(q)
        assert eight_bit == 2


# ------------------------------------------------------------------ several tensors in one launch
def _many_case(device):
    """A parameter group as the optimizer hands it over: sizes that are multiples of 16 (one
    launch for all of a dtype pair) and sizes that are not (their own launch), three dtypes,
    an empty tensor, and each tensor at its own step count."""
    specs = [(4096, torch.float32), (257, torch.float32), (512, torch.bfloat16), (70_000, torch.float32),
             (0, torch.float32), (10_003, torch.float16), (1_024, torch.float16), (48, torch.float32)]
    items = []
    for i, (n, dtype) in enumerate(specs):
        gen = torch.Generator().manual_seed(i)
        p = torch.randn(n, generator=gen).to(device=device, dtype=dtype)
        items.append([p, None] + fresh_state(n, 256, device))
    return items, [1, 3, 2, 5, 1, 4, 2, 7]


@pytest.fixture(params=["specialized", "general"])
def variant(request, monkeypatch):
    """The step variant: as the launcher picks it, or forced to the general one (decay multiply,
    reset by a final select, int64 offsets) in the interpreter, for both kernels alike."""
    if request.param == "general":
        if not kt.INTERPRETED:
            pytest.skip("the forced general variant runs in the interpreter (TRITON_INTERPRET=1)")
        monkeypatch.setattr(kt, "step_specialization",
                            lambda *a, **k: {"DECAY": True, "RESET_KEEPS_P": False, "INT64": True})
    return request.param


def test_program_map_says_which_tile_of_which_tensor():
    codes = kt._program_map([2, 0, 3, 70_000], torch.device("cpu")).tolist()
    assert codes[:5] == [0, 1, 2 << 32, (2 << 32) | 1, (2 << 32) | 2]
    assert codes[5] == 3 << 32 and codes[-1] == (3 << 32) | 69_999 and len(codes) == 70_005
    cpu = torch.device("cpu")
    assert kt._program_map([2, 0, 3, 70_000], cpu) is kt._program_map([2, 0, 3, 70_000], cpu)  # cached


def test_many_tensors_in_one_launch_step_as_one_launch_each(device, variant, monkeypatch):
    """adam8bit_step_many_triton (what AdamW8bit uses with backend="triton") steps each tensor
    bit for bit as adam8bit_step_triton does, states and parameters, over three steps with a
    NaN and an Inf gradient; the tensors whose sizes are multiples of 16 go in one launch per
    pair of dtypes (three here), the others one launch each."""
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1, blocksize=256)
    qmap1, qmap2 = dynamic_map(True).to(device), dynamic_map(False).to(device)
    ours, steps = _many_case(device)
    ref = [[t.clone() if t is not None else None for t in item] for item in ours]
    launches, singles, counting = [], [], [False]  # launches of the many-tensor call only
    real_launch, real_one = kt._launch_many, kt._launch_one
    monkeypatch.setattr(kt, "_launch_many", lambda group, *a, **k: (launches.append(len(group)),
                                                                      real_launch(group, *a, **k)))
    monkeypatch.setattr(kt, "_launch_one", lambda item, *a, **k: (counting[0] and singles.append(item[0].numel()),
                                                                   real_one(item, *a, **k)))
    real_single = kt.adam8bit_step_triton
    for round_ in range(3):
        for i, (item, twin) in enumerate(zip(ours, ref)):
            g = gradient(max(item[0].numel(), 1), round_ + 1, item[0].dtype, device, 256)[: item[0].numel()]
            if round_ == 1 and item[0].numel() > 20:
                g[5], g[17] = float("nan"), float("inf")
            item[1], twin[1] = g, g.clone()
        round_steps = [s + round_ for s in steps]
        counting[0] = True
        kt.adam8bit_step_many_triton(ours, qmap1, qmap2, steps=round_steps, **hyper)
        counting[0] = False
        for twin, step in zip(ref, round_steps):
            real_single(*twin, qmap1, qmap2, step=step, **hyper)
        for i, (a, b) in enumerate(zip(ours, ref)):
            for k, name in ((0, "p"), (2, "state1"), (3, "state2"), (4, "absmax1"), (5, "absmax2")):
                assert torch.equal(a[k], b[k]), f"round {round_}: {name} of tensor {i} differs"
    # per round: fp32 (4096, 70,000, 48), bf16 (512), fp16 (1,024) in three launches; 257 and
    # 10,003 elements one launch each; the empty tensor none
    assert sorted(launches) == sorted([3, 1, 1] * 3) and sorted(singles) == sorted([257, 10_003] * 3)


def test_many_tensors_bad_input_names_the_tensor_and_changes_nothing():
    qmap1, qmap2 = dynamic_map(True), dynamic_map(False)
    items, steps = _many_case("cpu")
    for item in items:
        item[1] = torch.ones_like(item[0])
    items[3][2] = items[3][2].float()  # tensor 3: state1 not uint8
    before = [[t.clone() for t in item] for item in items]
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, blocksize=256)
    with pytest.raises(TypeError, match="tensor 3 of 8: state1"):
        kt.adam8bit_step_many_triton(items, qmap1, qmap2, steps=steps, **hyper)
    with pytest.raises(ValueError, match="one step count per tensor"):
        kt.adam8bit_step_many_triton(items, qmap1, qmap2, steps=steps[:-1], **hyper)
    with pytest.raises(ValueError, match="tensor 0 of 8: step must be"):
        kt.adam8bit_step_many_triton(items, qmap1, qmap2, steps=[0] + steps[1:], **hyper)
    assert all(torch.equal(a, b) for item, twin in zip(items, before) for a, b in zip(item, twin))
    assert kernels.get_backend("triton", "cuda").step_many is kt.adam8bit_step_many_triton


# ------------------------------------------------------------------ registry, dispatch, errors
def test_registered_as_triton_backend(monkeypatch):
    backend = kernels.get_backend("triton", "cuda")
    assert backend.step is kt.adam8bit_step_triton and backend.supports is kt.supports
    assert kernels.get_backend("auto", "cuda").name == "triton"
    assert kernels.get_backend("auto", "cpu").name != "triton"  # the interpreter is never picked by "auto"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kt.supports("cpu") and "triton" in kernels.available_backends("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not kt.supports("cpu") and kt.supports(torch.device("cuda", 0))
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        kernels.get_backend("triton", "cpu")
    assert not kt.supports("meta")
    monkeypatch.setattr(kt, "INTERPRETED", False)  # as if imported before TRITON_INTERPRET=1 was set
    args, kwargs = step_args()
    with pytest.raises(RuntimeError, match="imported without TRITON_INTERPRET=1"):
        kt.adam8bit_step_triton(*args, **kwargs)


def test_map_without_a_table_falls_back_to_the_binary_search(device):
    """A map whose codes change twice inside one table bucket cannot have an exact table: the
    kernels then use the binary search (``_nearest_code``), with the same results."""
    crowded = torch.sort(torch.cat([torch.linspace(0.5, 0.5 + 1e-5, 200), torch.linspace(-1, 1, 56)])).values
    assert kt.nearest_code_table(crowded, keep_sign=False)[1] is False
    assert kt.nearest_code_table(dynamic_map(True), keep_sign=True)[1] is True
    x = heavy_tailed(3000, 5, "cpu") * 1e-3 + 0.5
    codes, absmax = kt.quantize_blockwise_triton(x.to(device), crowded.to(device), blocksize=256)
    ref_codes, ref_absmax = quantize_blockwise(x, crowded, blocksize=256)
    assert torch.equal(codes.cpu(), ref_codes) and torch.equal(absmax.cpu(), ref_absmax)


class _Subclass(torch.Tensor):
    pass


@pytest.mark.parametrize(
    "position,make,error,match",
    [
        (0, lambda t: t.as_subclass(_Subclass), TypeError, "tensor subclass"),
        (2, lambda t: t.as_subclass(_Subclass), TypeError, "tensor subclass"),
        (0, lambda t: torch.empty_like(t, device="meta"), ValueError, "meta tensor"),
        (1, lambda t: t.to_sparse(), TypeError, "dense"),
        (0, lambda t: torch.zeros(2 * t.numel())[::2], ValueError, "contiguous"),
    ],
    ids=["subclass-p", "subclass-state", "meta-p", "sparse-g", "strided-p"],
)
def test_step_rejects_unsupported_tensors_before_launch(position, make, error, match):
    args, kwargs = step_args()
    args = list(args)
    args[position] = make(args[position])
    with pytest.raises(error, match=match):
        kt.adam8bit_step_triton(*args, **kwargs)


def test_unavailable_reason(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "TRITON_INTERPRET=1" in kt.unavailable_reason("cpu")
    assert kt.unavailable_reason("cuda") is None and "mps" in kt.unavailable_reason("mps")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kt.unavailable_reason("cpu") is None


def test_launch_config():
    for blocksize in (64, 128, 256, 512, 1024, 2048, 4096):
        rows, warps = kt.launch_config(blocksize, tile=2048)
        assert rows * blocksize == max(2048, blocksize) and warps == rows * blocksize // 256
    assert kt.launch_config(256, tile=8192, num_warps=4) == (32, 4)
    with pytest.raises(ValueError, match="power of two"):
        kt.launch_config(256, tile=3000)


def step_args(n=300, blocksize=256):
    return ([torch.zeros(n), torch.zeros(n)] + fresh_state(n, blocksize, "cpu") + [dynamic_map(True), dynamic_map(False)],
            dict(step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, blocksize=blocksize))


@pytest.mark.parametrize("change,error,match", [
    (lambda a, k: a.__setitem__(2, a[2].float()), TypeError, "state1"),
    (lambda a, k: a.__setitem__(4, a[4][:1]), ValueError, "absmax1"),
    (lambda a, k: a.__setitem__(1, a[1][:-1]), ValueError, "g must have"),
    (lambda a, k: a.__setitem__(0, torch.zeros(600)[::2]), ValueError, "contiguous"),
    (lambda a, k: a.__setitem__(0, torch.zeros(300, dtype=torch.float64)), TypeError, "p must"),
    (lambda a, k: a.__setitem__(6, torch.zeros(255)), ValueError, "qmap1"),
    (lambda a, k: k.update(blocksize=300), ValueError, "blocksize"),
    (lambda a, k: k.update(step=0), ValueError, "step"),
    (lambda a, k: a.__setitem__(3, [0] * 300), TypeError, "state2"),
])
def test_fused_step_rejects_bad_input(change, error, match):
    args, kwargs = step_args()
    change(args, kwargs)
    with pytest.raises(error, match=match):
        kt.adam8bit_step_triton(*args, **kwargs)


def test_quantize_functions_reject_bad_input():
    with pytest.raises(TypeError, match="floating-point"):
        kt.quantize_blockwise_triton(torch.arange(10))
    with pytest.raises(ValueError, match="blocksize"):
        kt.quantize_blockwise_triton(torch.randn(10), blocksize=100)
    with pytest.raises(ValueError, match="256-entry"):
        kt.quantize_blockwise_triton(torch.randn(10), torch.zeros(10))
    with pytest.raises(TypeError, match="uint8"):
        kt.dequantize_blockwise_triton(torch.zeros(10), torch.zeros(1))
    with pytest.raises(ValueError, match="absmax has 2 entries"):
        kt.dequantize_blockwise_triton(torch.zeros(10, dtype=torch.uint8), torch.zeros(2))
    with pytest.raises(TypeError, match="dtype"):
        kt.dequantize_blockwise_triton(torch.zeros(10, dtype=torch.uint8), torch.zeros(1), dtype=torch.int32)


# ------------------------------------------------------------------ the GPU benchmark script
def test_gpu_bench_cpu_smoke(capsys):
    """bench/gpu_bench.py --cpu-smoke: every path of the GPU benchmark runs (tiny, interpreter)."""
    if not kt.INTERPRETED:
        pytest.skip("the smoke run uses the interpreter (TRITON_INTERPRET=1)")
    spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "bench" / "gpu_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    info = bench.main(["--cpu-smoke", "--sizes", "4096", "--iters", "1", "--warmup", "0"])
    (row,) = info["results"]
    for key in ("copy_s", "triton_s", "bnb_s", "adamw_s"):
        assert row[key] > 0
    assert row["vs_bnb"] == pytest.approx(row["bnb_s"] / row["triton_s"])
    assert row["triton_gbps"] == pytest.approx(16 * 4096 / row["triton_s"] / 1e9)
    out = capsys.readouterr().out
    assert "N = 4,096 fp32 parameters" in out and "bitsandbytes AdamW8bit" in out and "of copy" in out
    model = info["model"]  # the course's-model rows (a small stand-in in the smoke run)
    assert model["tensors"] == 6 and model["params"] == 64 * 96 + 96 + 2 * 96 + 96 * 48 + 48
    assert set(model["rows"]) == {"adam8lib AdamW8bit (triton, one launch per group)",
                                  "adam8lib AdamW8bit (triton, one launch per tensor)",
                                  "adam8lib AdamW4bit (triton; rank-1 v: two passes)", "adam8lib AdamWFp8 (triton)",
                                  "torch AdamW(fused=True)", "bitsandbytes AdamW8bit"}
    assert all(seconds > 0 for seconds in model["rows"].values()) and "the course's model" in out
    assert "triton_one_launch_per_tensor" not in kernels.available_backends("cpu")  # registered for the run only


# ------------------------------------------------------------------ the compiled GPU code, checked without a GPU
def _compile_in_fresh_process(script: str) -> dict:
    """Run ``script`` (it compiles with bench/gpu_sass.py and prints one JSON line) in a fresh
    Python without TRITON_INTERPRET: the interpreter, once used, patches triton."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", script, str(REPO / "bench")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


AOT_COMPILE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import gpu_sass
out = {}
for dtype in ("fp32", "bf16"):
    kernel, per_thread = gpu_sass.compile_step(90, dtype)
    out[dtype] = dict(ptx=kernel.asm["ptx"], per_thread=per_thread, **gpu_sass.analyse(kernel, per_thread))
kernel, per_thread = gpu_sass.compile_step(90, "fp32", use_table=False)
out["search"] = gpu_sass.analyse(kernel, per_thread)
for dtype in ("fp32", "bf16"):
    kernel, per_thread = gpu_sass.compile_step_many(90, dtype)
    out["many " + dtype] = dict(ptx=kernel.asm["ptx"], per_thread=per_thread, **gpu_sass.analyse(kernel, per_thread))
print(json.dumps(out))
"""


def test_step_kernel_compiles_for_gpu_with_exact_math():
    """Compile the fused step for an H100/H200 (sm_90) ahead of time, on the CPU
    (bench/gpu_sass.py), and read its PTX and SASS.

    Checks what the interpreter cannot: the kernel compiles; division and square root are the
    correctly rounded ``div.rn``/``sqrt.rn`` (no ``div.full``/``sqrt.approx``); the only fused
    multiply-adds are the two written in the kernel (``enable_fp_fusion=False``); p and g move
    as 16-byte vectors; no register spills, at most 96 registers; and the main path (the
    variant bench/gpu_bench.py runs: AdamW, int32 offsets) needs at most 116 SASS instructions
    per element for fp32 and bf16 parameters (measured: 113 and 112; the binary-search fallback
    262; bench/README.md), so a regression of a few instructions per element fails here. The
    same for the many-tensor kernel (one launch per parameter group), which also looks up its
    tensor's addresses: at most 120 (measured 117 and 114), p and g still 16-byte vectors.
    Runs in a fresh process: the interpreter, once used, patches triton.
    """
    out = _compile_in_fresh_process(AOT_COMPILE)
    search = out.pop("search")
    many = {dtype: out.pop("many " + dtype) for dtype in ("fp32", "bf16")}
    for dtype, res in [*out.items(), *(("many " + k, v) for k, v in many.items())]:
        ptx, per_thread = res["ptx"], res["per_thread"]
        for approximate in ("div.full", "div.approx", "sqrt.approx", "rsqrt", "ex2.approx"):
            assert approximate not in ptx, (dtype, approximate)
        assert ptx.count("div.rn.f32") >= 2 * per_thread and ptx.count("sqrt.rn.f32") == per_thread, dtype
        assert ptx.count("fma.rn.f32") == 2 * per_thread, dtype  # m and v only: nothing else was fused
        assert "ld.global.v4.b32" in ptx, dtype  # p and g: 16-byte vector loads
        assert res["spill_bytes"] == 0 and res["registers"] <= 96, (dtype, res["registers"])
        limit = 120 if dtype.startswith("many") else 116  # many: + finding its tensor (measured 117, 114)
        assert res["instructions_per_element"] <= limit, (dtype, res["instructions_per_element"])
    assert out["fp32"]["instructions_per_element"] < 0.5 * search["instructions_per_element"]
    assert out["fp32"]["global_loads_per_element"] < search["global_loads_per_element"] / 3


AOT_COMPILE_SM75 = """
import json, sys
sys.path.insert(0, sys.argv[1])
import gpu_sass
out = {}
for dtype in ("fp32", "fp16", "bf16"):
    kernel, per_thread = gpu_sass.compile_step(75, dtype)
    out[dtype] = dict(ptx=kernel.asm["ptx"], per_thread=per_thread, **gpu_sass.analyse(kernel, per_thread))
print(json.dumps(out))
"""


def test_step_kernel_compiles_for_colab_t4_sm75():
    """Colab's free GPU is a T4 (sm_75: fp16 tensor cores, no bf16 ones). The fused step still
    compiles there for fp32, fp16 and bf16 parameters (bf16 loads/stores are converted with bit
    shifts before sm_80), with the same exact division and square root as on sm_90 and no spills."""
    out = _compile_in_fresh_process(AOT_COMPILE_SM75)
    assert set(out) == {"fp32", "fp16", "bf16"}
    for dtype, res in out.items():
        ptx, per_thread = res["ptx"], res["per_thread"]
        assert ".target sm_75" in ptx, dtype
        for approximate in ("div.full", "div.approx", "sqrt.approx", "rsqrt", "ex2.approx"):
            assert approximate not in ptx, (dtype, approximate)
        assert ptx.count("div.rn.f32") >= 2 * per_thread and ptx.count("sqrt.rn.f32") == per_thread, dtype
        assert ptx.count("fma.rn.f32") == 2 * per_thread, dtype
        assert res["spill_bytes"] == 0, dtype
    # sm_75 converts fp16 in hardware but has no cvt for bf16 (sm_80+): no bf16 cvt in its PTX
    assert "cvt.f32.f16" in out["fp16"]["ptx"] and "cvt.rn.f16.f32" in out["fp16"]["ptx"]
    assert "bf16" not in "".join(re.findall(r"cvt\.[a-z0-9.]+", out["bf16"]["ptx"]))
