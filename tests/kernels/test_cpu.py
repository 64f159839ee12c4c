"""The ``"cpu"`` backend (C++ kernel, adam8lib/kernels/cpu.py) against the reference backend.

"Agree" means bit for bit: the same codes, the same absmax and the same parameters (NaN
where the reference has NaN). The kernel repeats the reference's fp32 operations in the same
order, fuses a multiply-add exactly where this torch build does, and calls the same sqrt
(MKL's, when torch uses it), so there is nothing to tolerate. Every SIMD level the build has
(scalar, AVX2, AVX-512) is checked, and the exact nearest-code tables are checked against
``adam8lib.quant.nearest_code`` on ~500k chosen fp32 values.

The first test to run builds the kernel (a few seconds; cached under ~/.cache/adam8lib).
"""

import ctypes
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from adam8lib import kernels
from adam8lib.kernels import cpu, cpu_build, reference
from adam8lib.optim import Adam8bit, AdamW8bit
from adam8lib.quant import dynamic_map, linear_map, nearest_code, num_blocks

REPO = Path(__file__).resolve().parents[1]
QMAP1, QMAP2 = dynamic_map(signed=True), dynamic_map(signed=False)
SIMD_LEVELS = list(range(cpu.simd_level() + 1))  # 0 = scalar loops only


def _fresh_states(n, blocksize):
    blocks = num_blocks(n, blocksize)
    return [torch.full((n,), 127, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8),
            torch.zeros(blocks), torch.zeros(blocks)]


def _gradient(n, dtype, gen, scale=1.0, bad=True):
    """Gradients over six decades (so the codes of v spread over the whole map), with a NaN,
    a +Inf and a -Inf when ``bad``."""
    decades = 10.0 ** torch.randint(-5, 2, (n,), generator=gen).float()
    g = torch.randn(n, generator=gen) * decades * scale
    if bad and n >= 4:
        g[1], g[n // 2], g[-1] = float("nan"), float("inf"), -float("inf")
    return g.to(dtype)


def _assert_same(ref, got, what):
    for name, a, b in zip(("state1", "state2", "absmax1", "absmax2"), ref[1:], got[1:]):
        same = torch.equal(a, b) or (a.is_floating_point() and bool(((a == b) | (a.isnan() & b.isnan())).all()))
        if not same:
            bad = (a != b).nonzero().flatten()
            raise AssertionError(f"{what}: {name} differs at {bad.numel()} places, first {bad[:5].tolist()}: "
                                 f"reference {a[bad[:5]].tolist()} vs cpu {b[bad[:5]].tolist()}")
    p_ref, p_cpu = ref[0].float(), got[0].float()
    same = (p_ref == p_cpu) | (p_ref.isnan() & p_cpu.isnan())
    assert bool(same.all()), (
        f"{what}: parameters differ at {int((~same).sum())} places, max |diff| "
        f"{(p_ref - p_cpu)[~same].abs().max().item():.3g}"
    )


def _run_both(n, dtype, blocksize, *, steps=3, weight_decay=0.01, scale=1.0, bad=True, simd=None, seed=0,
              grad_dtype=None):
    gen = torch.Generator().manual_seed(seed + n)
    p0 = torch.randn(n, generator=gen).to(dtype)
    ref = [p0.clone(), *_fresh_states(n, blocksize)]
    got = [p0.clone(), *_fresh_states(n, blocksize)]
    for t in range(1, steps + 1):
        g = _gradient(n, grad_dtype or dtype, gen, scale, bad)
        kw = dict(step=t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=weight_decay, blocksize=blocksize)
        reference.adam8bit_step(ref[0], g, *ref[1:], QMAP1, QMAP2, **kw)
        cpu.adam8bit_step(got[0], g, *got[1:], QMAP1, QMAP2, simd=simd, **kw)
        _assert_same(ref, got, f"n={n} {dtype} blocksize={blocksize} simd={simd} step {t}")


# ------------------------------------------------------------------------------ registry
def test_registered_and_preferred_by_auto_on_cpu():
    assert "cpu" in kernels.available_backends("cpu")
    assert kernels.get_backend("auto", "cpu").name == "cpu"
    assert kernels.get_backend("cpu", "cpu").step is cpu.adam8bit_step
    assert not cpu.supports(torch.device("meta"))
    assert kernels.AUTO_ORDER.index("cpu") < kernels.AUTO_ORDER.index("torch")


def test_extension_is_cached_and_reports_its_simd_level():
    assert cpu.load_extension() is cpu.load_extension()
    assert cpu.build_directory().is_dir()
    assert cpu.simd_level() in (0, 1, 2)


# ------------------------------------------------------------------------------ the step
@pytest.mark.parametrize("n", [1, 255, 256, 257, 4095, 4096, 10_003, 1_000_003])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("blocksize", [256, 2048])
def test_step_identical_to_reference(n, dtype, blocksize):
    _run_both(n, dtype, blocksize, weight_decay=0.01 if n % 2 else 0.0, steps=2 if n > 100_000 else 3)


@pytest.mark.parametrize("simd", SIMD_LEVELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_every_simd_level_identical_to_reference(simd, dtype):
    _run_both(20_011, dtype, 256, simd=simd, steps=4)
    _run_both(5_003, dtype, 2048, simd=simd, steps=2, weight_decay=0.0)


@pytest.mark.parametrize("simd", SIMD_LEVELS)
@pytest.mark.parametrize(
    "scale", [1e20, 1e-38, 1e-43, 0.0],
    ids=["v-overflows-to-inf", "denormal-absmax", "denormal-grads", "zero-grads"],
)
def test_extreme_gradients_identical_to_reference(simd, scale):
    # 1e20: g*g overflows, absmax2 = inf and the next dequantized v is NaN (the scalar path);
    # 1e-38/1e-43: 1/absmax overflows to inf; 0: every absmax is 0
    _run_both(9_001, torch.float32, 256, scale=scale, steps=3, simd=simd)


def test_fp32_gradient_for_bf16_parameters():
    _run_both(10_003, torch.bfloat16, 256, grad_dtype=torch.float32)


def test_optimizer_with_cpu_backend_matches_torch_backend():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    twin = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    opt_cpu = AdamW8bit(model.parameters(), lr=1e-2, backend="cpu", min_8bit_size=1024)
    opt_ref = AdamW8bit(twin, lr=1e-2, backend="torch", min_8bit_size=1024)
    for _ in range(5):
        x = torch.randn(32, 96)
        for params, opt in ((list(model.parameters()), opt_cpu), (twin, opt_ref)):
            w1, b1, w2, b2 = params
            out = torch.nn.functional.gelu(x @ w1.T + b1) @ w2.T + b2
            opt.zero_grad()
            out.square().mean().backward()
            opt.step()
    for p, q in zip(model.parameters(), twin):
        assert torch.equal(p, q)
        for key in ("state1", "state2", "absmax1", "absmax2"):
            if key in opt_ref.state[q]:
                assert torch.equal(opt_cpu.state[p][key], opt_ref.state[q][key]), key
    assert "cpu" in repr(opt_cpu)


def test_auto_backend_steps_like_the_reference():
    p = torch.nn.Parameter(torch.randn(5000))
    q = torch.nn.Parameter(p.detach().clone())
    p.grad = q.grad = torch.randn(5000)
    opt_auto, opt_ref = Adam8bit([p]), Adam8bit([q], backend="torch")
    for _ in range(3):
        opt_auto.step()
        opt_ref.step()
    assert kernels.get_backend(opt_auto.backend, p.device).name == "cpu"
    assert torch.equal(p, q) and not torch.equal(p, p.grad)
    assert torch.equal(opt_auto.state[p]["state2"], opt_ref.state[q]["state2"])


# ------------------------------------------------------------------------------ the tables
def _table_code(x, table):
    """The kernels' lookup, in Python: hi if (low 16 bits of key) >= where else lo (NaN included)."""
    bits = x.view(torch.int32).long()
    key = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    entry = table.steps.long()[(key >> 16) + 0x8000] & 0xFFFFFFFF
    lo, hi, where = entry & 0xFF, (entry >> 8) & 0xFF, entry >> 16
    return torch.where((key & 0xFFFF) >= where, hi, lo)


def _raw_table_code(x, table):
    """The C++ kernel's lookup by raw bits: bits 8-15 if (bits << 16) > entry (unsigned), else bits 0-7."""
    bits = x.view(torch.int32).long() & 0xFFFFFFFF
    entry = table.raw_steps.long()[bits >> 16] & 0xFFFFFFFF
    return torch.where(((bits << 16) & 0xFFFFFFFF) > entry, (entry >> 8) & 0xFF, entry & 0xFF)


def _probe_values():
    """fp32 values where a lookup could go wrong: every bucket's first and last value and
    their neighbours, every map entry and midpoint (and the floats next to them), zeros,
    infinities, NaN, and random values over the whole exponent range."""
    starts = (torch.arange(65536, dtype=torch.int64) << 16)
    keys = torch.cat([starts, starts + 1, starts + 0xFFFF, starts + 0xFFFE])
    keys = torch.cat([keys, torch.arange(0x007F0000, 0x00800002), torch.arange(0xFF7FFFFE, 0xFF810000)])  # +-inf, NaN
    bits = torch.where(keys >= 2**31, keys - 2**31, (~keys) & 0xFFFFFFFF)
    bucket_edges = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(torch.float32)
    maps = torch.cat([QMAP1, QMAP2, linear_map(True), linear_map(False)])
    mids = torch.cat([(m[1:] + m[:-1]) / 2 for m in (QMAP1, QMAP2, linear_map(True), linear_map(False))])
    near = torch.cat([maps, mids])
    near = torch.cat([near, torch.nextafter(near, torch.tensor(2.0)), torch.nextafter(near, torch.tensor(-2.0))])
    gen = torch.Generator().manual_seed(0)
    rand = torch.randint(-(2**31), 2**31 - 1, (200_000,), generator=gen, dtype=torch.int64).to(torch.int32)
    rand = rand.view(torch.float32)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), -float("nan"), 1e-45, -1e-45, 1.0, -1.0])
    return torch.cat([bucket_edges, near, -near, rand, special, torch.rand(100_000, generator=gen) * 2 - 1])


@pytest.mark.parametrize("name,qmap", [("dynamic signed", QMAP1), ("dynamic unsigned", QMAP2),
                                       ("linear signed", linear_map(True)), ("linear unsigned", linear_map(False))])
@pytest.mark.parametrize("keep_sign", [True, False])
def test_code_table_gives_the_exact_nearest_code(name, qmap, keep_sign):
    x = _probe_values()
    expected = nearest_code(x, qmap, keep_sign=keep_sign).long()
    table = cpu.code_table(qmap, keep_sign)
    for layout, lookup in (("sortable key", _table_code), ("raw bits", _raw_table_code)):
        got = lookup(x, table)
        bad = (got != expected).nonzero().flatten()
        assert bad.numel() == 0, f"{name}, {layout}: {bad.numel()} wrong codes, e.g. x={x[bad[:3]].tolist()}"


def test_code_table_follows_a_map_tensor_written_in_place():
    """The tables are remembered per map tensor (an optimizer passes the same two every step),
    but a map written in place, or another tensor that now has the same id, gets its own; a
    kernel step with the changed map quantizes with the new one."""
    qmap = dynamic_map(True)
    first = cpu.code_table(qmap, True)
    assert cpu.code_table(qmap, True) is first and cpu.code_table(qmap, False) is not first
    qmap.copy_(linear_map(True))  # same tensor, new values
    assert torch.equal(cpu.code_table(qmap, True).qmap, linear_map(True))
    n = 4096
    p, g = torch.zeros(n), torch.linspace(-1, 1, n)
    states = _fresh_states(n, 256)
    cpu.adam8bit_step(p, g, *states, qmap, QMAP2, step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                      weight_decay=0.0, blocksize=256)
    ref = _fresh_states(n, 256)
    reference.adam8bit_step(torch.zeros(n), g, *ref, linear_map(True), QMAP2, step=1, lr=1e-3, beta1=0.9,
                            beta2=0.999, eps=1e-8, weight_decay=0.0, blocksize=256)
    assert torch.equal(states[0], ref[0])  # the codes of m, on the linear map
    del qmap, first
    for _ in range(20):  # new tensors, some of them at a freed tensor's id: each gets its own map's table
        other = linear_map(False) if _ % 2 else dynamic_map(False)
        assert torch.equal(cpu.code_table(other, True).qmap, other)
    with torch.inference_mode():  # no version counter: looked up by value
        frozen = linear_map(False)
    assert torch.equal(cpu.code_table(frozen, True).qmap, frozen)


def test_code_table_rejects_a_map_it_cannot_represent():
    crowded = torch.sort(torch.cat([torch.linspace(0.5, 0.5 + 1e-5, 200), torch.linspace(-1, 1, 56)])).values
    with pytest.raises(ValueError, match="change more than once"):
        cpu.code_table(crowded, keep_sign=False)
    with pytest.raises(ValueError, match="256-entry"):
        cpu.code_table(torch.zeros(10), keep_sign=False)
    with pytest.raises(ValueError, match="sorted"):
        cpu.code_table(torch.flip(QMAP1, [0]), keep_sign=False)


# ------------------------------------------------------------------------------ bad input
def _args(n=1000, blocksize=256):
    return [torch.zeros(n), torch.zeros(n), *_fresh_states(n, blocksize), QMAP1, QMAP2]


KW = dict(step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, blocksize=256)


@pytest.mark.parametrize(
    "position,bad,error,match",
    [
        (0, torch.zeros(1000, dtype=torch.float64), TypeError, "fp32, bf16 or fp16"),
        (0, torch.zeros(10, 100), ValueError, "flat contiguous"),
        (1, torch.zeros(999), ValueError, "1000 elements"),
        (1, torch.zeros(1000, dtype=torch.int32), TypeError, "floating-point"),
        (2, torch.zeros(1000, dtype=torch.int8), TypeError, "state1 must be torch.uint8"),
        (4, torch.zeros(3), ValueError, "absmax1 must have 4 elements"),
        (6, torch.zeros(255), ValueError, "qmap1"),
        (0, [0.0] * 1000, TypeError, "torch.Tensor"),
        (0, torch.zeros(2000)[::2], ValueError, "flat contiguous"),
    ],
)
def test_bad_arguments_raise_clear_errors(position, bad, error, match):
    args = _args()
    args[position] = bad
    with pytest.raises(error, match=match):
        cpu.adam8bit_step(*args, **KW)


def test_bad_blocksize_and_device():
    with pytest.raises(ValueError, match="blocksize"):
        cpu.adam8bit_step(*_args(), **{**KW, "blocksize": 100})
    args = _args()
    args[0] = torch.zeros(1000, device="meta")
    with pytest.raises(ValueError, match="meta tensor"):
        cpu.adam8bit_step(*args, **KW)


def test_sqrt_probe_reproduces_torch_sqrt_on_new_data():
    # torch.sqrt is either IEEE sqrt or MKL's vmsSqrt; what the probe found must hold for
    # values it never saw (the step tests rely on it for bit-identical parameters)
    address, kind = cpu.torch_sqrt()
    gen = torch.Generator().manual_seed(7)
    x = torch.cat([torch.rand(100_003, generator=gen) ** 3 * 10.0 ** torch.randint(-30, 3, (100_003,), generator=gen),
                   torch.randint(0, 0x7F800000, (1 << 18,), generator=gen, dtype=torch.int32).view(torch.float32)])
    ieee = x.double().sqrt().float()  # correctly rounded: one rounding of the exact root
    if kind == "ieee":
        assert address is None and torch.equal(torch.sqrt(x), ieee)
    else:
        assert address is not None and not torch.equal(torch.sqrt(x), ieee)  # else the probe was needless
        out = torch.empty_like(x)
        fn = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(address)
        fn(x.numel(), x.data_ptr(), out.data_ptr(), cpu.MKL_VML_MODE)
        assert torch.equal(out, torch.sqrt(x))


def test_inline_mkl_sqrt_equals_torch_sqrt_on_new_data():
    """Where torch.sqrt is MKL's and the kernel has AVX-512, the step computes MKL's root
    inline (cpu.mkl_sqrt_inline() checked that at first use); it must also hold on values the
    check never saw: fresh random magnitudes, the range below 2^-78 where MKL rescales its
    residual, and denormals."""
    if not cpu.mkl_sqrt_inline():
        # torch.sqrt is not MKL's here; or it is, but runs a code path the kernel has no inline copy of
        # (MKL's AVX2 code, MKL_ENABLE_INSTRUCTIONS=AVX2), or the build lacks the loops: then the kernel
        # calls vmsSqrt itself, and the step tests above hold it to torch.sqrt's bits
        pytest.skip("no inline MKL root here: the kernel calls the library (or torch.sqrt is IEEE)")
    gen = torch.Generator().manual_seed(11)
    x = torch.cat([torch.rand(200_003, generator=gen) * 10.0 ** torch.randint(-45, 30, (200_003,), generator=gen),
                   torch.rand(10_000, generator=gen) * 2.0**-78, torch.rand(10_000, generator=gen) * 1e-40])
    out = torch.empty_like(x)
    assert cpu.load_extension().adam8bit_cpu_mkl_sqrt_inline(ctypes.c_void_p(x.data_ptr()),
                                                             ctypes.c_void_p(out.data_ptr()), ctypes.c_int64(x.numel()),
                                                             ctypes.c_int(cpu.mkl_sqrt_inline())) == 0
    assert torch.equal(out.view(torch.int32), torch.sqrt(x).view(torch.int32))
    ieee = x.double().sqrt().float()
    assert not torch.equal(out, ieee)  # the inline version is MKL's, not IEEE's


def test_inline_mkl_sqrt_of_special_values():
    """MKL's generic SSE code (the one it runs on AMD CPUs) sends zeros, denormals, negative,
    infinite and NaN inputs, and the largest floats, to a scalar path; the inline version must
    give what torch.sqrt gives for each, NaN bit patterns included. (The AVX-512 version returns
    negative inputs unchanged, which the kernel never relies on: v >= 0; it is checked on the
    non-negative ones.)"""
    root = cpu.mkl_sqrt_inline()
    if not root:
        pytest.skip("the kernel does not compute MKL's sqrt inline here")
    bits = torch.cat([torch.arange(0, 1 << 12), torch.arange(0x7F7FF000 - 8, 0x80000000),  # 0, denormals, largest, inf, NaN
                      torch.arange(0x80000000, 0x80000000 + (1 << 12)), torch.tensor([0xBF800000, 0xFF800000, 0xFFC00000]),
                      torch.randint(0, 1 << 32, (100_000,), generator=torch.Generator().manual_seed(3))])
    x = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(torch.float32)
    if root != 2:
        x = x[~torch.signbit(x)]
    out = torch.empty_like(x)
    assert cpu.load_extension().adam8bit_cpu_mkl_sqrt_inline(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                                                             ctypes.c_int64(x.numel()), ctypes.c_int(root)) == 0
    assert torch.equal(out.view(torch.int32), torch.sqrt(x).view(torch.int32))
    if root == 2:  # the same algorithm on 8 lanes, which builds without AVX-512 use
        out8 = torch.full_like(x, -1.0)
        n = x.numel() - 5 - x.numel() % 8  # ends in a partial vector of 3
        assert cpu.load_extension().adam8bit_cpu_mkl_sqrt_sse8(ctypes.c_void_p(x.data_ptr()),
                                                               ctypes.c_void_p(out8.data_ptr()), ctypes.c_int64(n)) == 0
        assert torch.equal(out8[:n].view(torch.int32), torch.sqrt(x[:n]).view(torch.int32))
        assert bool((out8[n:] == -1.0).all())  # nothing written past n


@pytest.mark.parametrize("flush", [False, True], ids=["denormals", "flush_denormal"])
def test_step_identical_to_reference_with_tiny_second_moments(flush):
    """Tiny gradients make v denormal or below 2^-78 (where MKL's sqrt rescales): still
    bit-identical. With torch.set_flush_denormal(True) (no denormal v can arise then) the kernel
    calls MKL instead of its inline root, as a precaution: MKL turns flushing off inside its
    call, the inline code would not. A tiny eps, so that sqrt(v) of a denormal v shows in the
    parameters."""
    n, blocksize = 4096, 256
    gen = torch.Generator().manual_seed(5)
    p0 = torch.randn(n, generator=gen)
    ref, got = [p0.clone(), *_fresh_states(n, blocksize)], [p0.clone(), *_fresh_states(n, blocksize)]
    previous = torch.set_flush_denormal(flush)
    try:
        for t in range(1, 4):
            g = torch.randn(n, generator=gen) * 10.0 ** torch.randint(-30, -2, (n,), generator=gen)
            kw = {**KW, "step": t, "weight_decay": 0.01, "eps": 1e-30}  # eps must not hide a tiny root
            reference.adam8bit_step(ref[0], g, *ref[1:], QMAP1, QMAP2, **kw)
            cpu.adam8bit_step(got[0], g, *got[1:], QMAP1, QMAP2, **kw)
            _assert_same(ref, got, f"tiny moments, step {t}, flush_denormal={flush}")
    finally:
        torch.set_flush_denormal(False)


# ------------------------------------------------------------------------------ the non-finite rule
@pytest.mark.parametrize("simd", SIMD_LEVELS)
@pytest.mark.parametrize("exact", [True, False], ids=["cpu", "cpu_fast"])
def test_one_huge_gradient_does_not_poison_its_block(simd, exact):
    """One gradient element of 1e30 (g*g overflows fp32) in a block of normal ones: that
    element's m and v restart from 0 and its parameter stays; no NaN anywhere, the rest of the
    block steps as usual, and the states equal the reference's bit for bit."""
    n, blocksize = 4096, 256
    gen = torch.Generator().manual_seed(3)
    p0 = torch.randn(n, generator=gen)
    ref, got = [p0.clone(), *_fresh_states(n, blocksize)], [p0.clone(), *_fresh_states(n, blocksize)]
    kw = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, blocksize=blocksize)
    for t in range(1, 6):
        g = torch.randn(n, generator=gen) * 1e-2
        g[300] = 1e30 if t % 2 else -1e30  # block 1
        g[1000] = float("nan") if t == 2 else g[1000]
        before = got[0].clone()
        reference.adam8bit_step(ref[0], g, *ref[1:], QMAP1, QMAP2, step=t, **kw)
        cpu.adam8bit_step(got[0], g, *got[1:], QMAP1, QMAP2, step=t, simd=simd, exact=exact, **kw)
        assert not any(bool(x.float().isnan().any()) for x in got[::3] + got[3:])  # p, absmax1, absmax2
        assert got[0][300] == before[300]  # skipped: no update, no decay
        assert bool((got[0][256:512] != before[256:512]).sum() == 255)  # its neighbours moved
        assert got[3][1] > 0 and torch.isfinite(got[3][1]) and torch.isfinite(got[4][1])
        if exact:
            _assert_same(ref, got, f"1e30 gradient, step {t}, simd {simd}")
        else:
            for a, b in zip(ref[1:], got[1:]):
                assert torch.equal(a, b)  # states identical in the fast mode too


# ------------------------------------------------------------------------------ the pipelined loop
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("blocksize", [64, 256, 4096])
@pytest.mark.parametrize("exact", [True, False], ids=["cpu", "cpu_fast"])
def test_pipelined_blocks_agree_with_the_tiled_loops(threads, blocksize, exact):
    """The default loops against the AVX2 loops, which go tile by tile: bit for bit in both
    modes, and the exact mode also against the reference. With AVX-512 VBMI (as on the CI
    machine) the default loops are the pipelined ones (pass 2 of block b runs with pass 1 of
    block b + 1) whenever no sqrt call is needed: the fast mode, or MKL's sqrt computed inline.
    The gradients put a NaN and an Inf in some blocks (a block redone with the non-finite rule
    between two pipelined ones) and denormals in one whole block (1/absmax overflows: that
    block is finished by the general loops); 70,001 elements end in a partial block, and 3
    threads get runs of blocks of different lengths."""
    n = 70_001
    gen = torch.Generator().manual_seed(blocksize + threads)
    p0 = torch.randn(n, generator=gen)
    runs = {"default": None, "avx2": min(1, cpu.simd_level())}
    got = {name: [p0.clone(), *_fresh_states(n, blocksize)] for name in runs}
    ref = [p0.clone(), *_fresh_states(n, blocksize)]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for t in range(1, 4):
            g = _gradient(n, torch.float32, gen)
            g[5 * blocksize:6 * blocksize] = torch.randn(blocksize, generator=gen) * 1e-41  # denormal
            kw = dict(step=t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, blocksize=blocksize)
            for name, simd in runs.items():
                cpu.adam8bit_step(got[name][0], g, *got[name][1:], QMAP1, QMAP2, simd=simd, exact=exact, **kw)
            what = f"step {t}, {threads} threads, blocksize {blocksize}, exact={exact}"
            _assert_same(got["avx2"], got["default"], what)
            if exact:
                reference.adam8bit_step(ref[0], g, *ref[1:], QMAP1, QMAP2, **kw)
                _assert_same(ref, got["default"], what)
    finally:
        torch.set_num_threads(previous)
    assert bool(torch.isfinite(got["default"][3]).all())  # the denormal block kept finite scales
    assert got["default"][3][5] < 1e-37  # ... and really had denormal ones


@pytest.mark.parametrize("exact", [True, False], ids=["cpu", "cpu_fast"])
def test_runs_of_blocks_taken_by_whichever_thread_is_free(exact):
    """The threads take the blocks in runs of 2**18 elements, each as it becomes free (a
    dynamic schedule: which thread does which run changes from call to call). Three full runs,
    a shorter fourth and a partial last block, with a NaN in the last block of a run and in
    the first of the next, with 3 threads, 1 thread and the tiled AVX2 loops: the same result
    bit for bit, and the exact mode's also the reference's."""
    n, blocksize, run = 3 * 2**18 + 5_000 + 37, 256, 2**18
    gen = torch.Generator().manual_seed(3)
    p0 = torch.randn(n, generator=gen)
    setups = {"3 threads": (3, None), "1 thread": (1, None), "avx2": (3, min(1, cpu.simd_level()))}
    got = {name: [p0.clone(), *_fresh_states(n, blocksize)] for name in setups}
    ref = [p0.clone(), *_fresh_states(n, blocksize)]
    previous = torch.get_num_threads()
    try:
        for t in range(1, 3):
            g = _gradient(n, torch.float32, gen)
            g[run - 3], g[run + 5] = float("nan"), float("nan")
            kw = dict(step=t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, blocksize=blocksize)
            for name, (threads, simd) in setups.items():
                torch.set_num_threads(threads)
                cpu.adam8bit_step(got[name][0], g, *got[name][1:], QMAP1, QMAP2, simd=simd, exact=exact, **kw)
            _assert_same(got["1 thread"], got["3 threads"], f"step {t}, exact={exact}")
            _assert_same(got["avx2"], got["3 threads"], f"step {t}, exact={exact}")
            if exact:
                reference.adam8bit_step(ref[0], g, *ref[1:], QMAP1, QMAP2, **kw)
                _assert_same(ref, got["3 threads"], f"step {t}")
    finally:
        torch.set_num_threads(previous)
    assert bool(((got["3 threads"][0] != p0) | ~torch.isfinite(g)).all())  # every element was stepped


# ------------------------------------------------------------------------------ many tensors, one call
_NAMES = ("p", "g", "state1", "state2", "absmax1", "absmax2")


def _many_problem(seed):
    """Five tensors of different sizes, dtypes and step counts, a NaN in one gradient."""
    gen = torch.Generator().manual_seed(seed)
    specs = [(1, torch.float32, torch.float32, 1), (255, torch.bfloat16, torch.float32, 3),
             (4096, torch.float16, torch.float16, 2), (70_001, torch.float32, torch.float32, 5),
             (300_000, torch.bfloat16, torch.bfloat16, 1)]
    tensors, steps = [], []
    for n, p_dtype, g_dtype, step in specs:
        g = _gradient(n, torch.float32, gen, bad=False).to(g_dtype)
        if n > 1000:
            g[n // 3] = float("nan")
        p = torch.randn(n, generator=gen).to(p_dtype)
        states = _fresh_states(n, 256)
        states[0] = torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8)  # some history
        states[2] = torch.rand(states[2].numel(), generator=gen)
        tensors.append((p, g, *states))
        steps.append(step)
    return tensors, steps


@pytest.mark.parametrize("exact", [True, False], ids=["cpu", "cpu_fast"])
def test_many_tensors_in_one_call_step_like_one_call_each(exact):
    """adam8bit_step_many (what the optimizer uses for a parameter group) against one
    adam8bit_step per tensor: the same parameters, codes and scales bit for bit, whatever the
    sizes (1 element to several runs), dtypes (fp32, bf16 with fp32 or bf16 gradients, fp16)
    and step counts; the exact mode also against the reference."""
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, blocksize=256)
    many, steps = _many_problem(1)
    one = [tuple(t.clone() for t in item) for item in many]
    ref = [tuple(t.clone() for t in item) for item in many]
    cpu.adam8bit_step_many(many, QMAP1, QMAP2, steps=steps, exact=exact, **hyper)
    for i, (item, step) in enumerate(zip(one, steps)):
        cpu.adam8bit_step(*item, QMAP1, QMAP2, step=step, exact=exact, **hyper)
        _assert_same([item[0], *item[2:]], [many[i][0], *many[i][2:]], f"tensor {i}")
        if exact:
            reference.adam8bit_step(*ref[i], QMAP1, QMAP2, step=step, **hyper)
            _assert_same([ref[i][0], *ref[i][2:]], [many[i][0], *many[i][2:]], f"tensor {i} vs reference")
    assert all(not torch.equal(a[0], b[0]) for a, b in zip(many, _many_problem(1)[0]))  # all were stepped


@pytest.mark.parametrize("simd", SIMD_LEVELS)
def test_a_group_of_many_small_tensors_shares_one_parallel_region(simd):
    """The kernel runs every item (run of blocks, partial last block) of every tensor of a
    many-tensor call in one parallel region: with 3 threads taking items as they become free,
    a thread often skips past whole tensors between two items. 60 tensors of 0 to 70,001
    elements (items of 0 to several per tensor, pipelined and tiled loops) give what one call
    per tensor gives, bit for bit."""
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, blocksize=256)
    gen = torch.Generator().manual_seed(5)
    sizes = [1, 0, 256, 257, 3000, 20_000, 70_001, 511, 65_536, 40_000] * 6
    many = []
    for n in sizes:
        states = _fresh_states(n, 256)
        states[0] = torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8)
        states[2] = torch.rand(states[2].numel(), generator=gen)
        many.append((torch.randn(n, generator=gen), _gradient(n, torch.float32, gen, bad=False), *states))
    steps = [1 + i % 4 for i in range(len(sizes))]
    one = [tuple(t.clone() for t in item) for item in many]
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        cpu.adam8bit_step_many(many, QMAP1, QMAP2, steps=steps, simd=simd, **hyper)
    finally:
        torch.set_num_threads(previous)
    for i, (item, step) in enumerate(zip(one, steps)):
        cpu.adam8bit_step(*item, QMAP1, QMAP2, step=step, simd=simd, **hyper)
        _assert_same([item[0], *item[2:]], [many[i][0], *many[i][2:]], f"tensor {i} ({sizes[i]} elements)")


@pytest.mark.parametrize("freed", ["p", "p_view", "state1", "absmax2", "qmap1"])
def test_a_tensor_whose_memory_was_freed_is_a_clear_error(freed):
    """A tensor that still has elements but whose storage was freed (``untyped_storage()
    .resize_(0)``, as FSDP does between uses) would make the kernel read address 0: ValueError
    naming it, for one tensor and inside a many-tensor call, and nothing is changed. ``p_view``:
    p is a view at an offset into the freed storage (its data pointer is then not 0)."""
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, blocksize=256)
    tensors, steps = _many_problem(4)
    before = [tuple(t.clone() for t in item) for item in tensors]
    qmap1 = QMAP1.clone()
    i, name = 3, freed.removesuffix("_view")
    if freed == "p_view":
        base = torch.randn(tensors[i][0].numel() + 7)
        view = base[7:]
        view.copy_(tensors[i][0])
        tensors[i] = (view, *tensors[i][1:])
        base.untyped_storage().resize_(0)
    elif freed == "qmap1":
        qmap1.untyped_storage().resize_(0)
    else:
        tensors[i][_NAMES.index(name)].untyped_storage().resize_(0)
    for call in (lambda: cpu.adam8bit_step(*tensors[i], qmap1, QMAP2, step=steps[i], **hyper),
                 lambda: cpu.adam8bit_step_many(tensors, qmap1, QMAP2, steps=steps, **hyper)):
        with pytest.raises(ValueError, match=f"{name} has no storage"):
            call()
    for k, (item, saved) in enumerate(zip(tensors, before)):
        if k != i:
            assert all(torch.equal(a, b) or (a.isnan() == b.isnan()).all() for a, b in zip(item, saved))


def test_many_tensors_are_all_checked_before_any_changes():
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, blocksize=256)
    tensors, steps = _many_problem(2)
    before = [tuple(t.clone() for t in item) for item in tensors]
    bad = list(tensors)
    bad[3] = (*tensors[3][:4], torch.zeros(5), tensors[3][5])
    for call, error, message in [
        (lambda: cpu.adam8bit_step_many(bad, QMAP1, QMAP2, steps=steps, **hyper), ValueError,
         r"tensor 3 of 5: absmax1 must have 274 elements"),
        (lambda: cpu.adam8bit_step_many(tensors, QMAP1, QMAP2, steps=[1, 2, 0, 1, 1], **hyper), ValueError,
         r"tensor 2 of 5: step must be an int >= 1"),
        (lambda: cpu.adam8bit_step_many(tensors, QMAP1, QMAP2, steps=steps[:4], **hyper), ValueError,
         "one step count per tensor"),
        (lambda: cpu.adam8bit_step_many(tensors[:2] + [tensors[2][:5]], QMAP1, QMAP2, steps=steps[:3], **hyper),
         TypeError, r"tensor 2 of 3: each entry must be"),
        (lambda: kernels.adam8bit_step_many(bad, QMAP1, QMAP2, steps=steps, backend="cpu", **hyper), ValueError,
         r"tensor 3 of 5: absmax1 must have 274 elements"),
    ]:
        with pytest.raises(error, match=message):
            call()
        for item, saved in zip(tensors, before):
            assert all(torch.equal(a, b) or (a.isnan() == b.isnan()).all() for a, b in zip(item, saved))
    cpu.adam8bit_step_many([], QMAP1, QMAP2, steps=[], **hyper)  # nothing to do


def test_the_dispatcher_steps_many_tensors_with_any_backend(monkeypatch):
    """kernels.adam8bit_step_many: the cpu backends take the whole list in one call; a backend
    without a step_many (the reference) is called once per tensor: the same results."""
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, blocksize=256)
    calls = []

    class Counting:  # the loaded library, noting which entry points Python calls
        def __init__(self, lib):
            self.lib = lib

        def __getattr__(self, name):
            calls.append(name)
            return getattr(self.lib, name)

    monkeypatch.setattr(cpu_build, "_extension", Counting(cpu.load_extension()))
    got, steps = _many_problem(3)
    ref = [tuple(t.clone() for t in item) for item in got]
    kernels.adam8bit_step_many(got, QMAP1, QMAP2, steps=steps, backend="cpu", **hyper)
    steps_called = [name for name in calls if name.startswith("adam8bit_step")]
    assert steps_called == ["adam8bit_step_cpu_many"], calls  # one call into the kernel for the five tensors
    kernels.adam8bit_step_many(ref, QMAP1, QMAP2, steps=steps, backend="torch", **hyper)
    for i, (a, b) in enumerate(zip(ref, got)):
        _assert_same([a[0], *a[2:]], [b[0], *b[2:]], f"tensor {i}")


# ------------------------------------------------------------------------------ the fast mode
@pytest.mark.parametrize("simd", SIMD_LEVELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fast_mode_same_states_parameters_within_tolerance(simd, dtype):
    """``exact=False`` ("cpu_fast"): codes and absmax equal the reference's bit for bit (the
    moments are the same operations); each parameter is within 1e-6 of the reference's update
    plus one ulp of the parameter (its final rounding may land on the neighbour): the only differences are an IEEE instead of MKL sqrt
    and a multiply by 1/sqrt(1-beta2^t) fused with + eps, a few ulps of the update."""
    n, blocksize = 20_011, 256
    gen = torch.Generator().manual_seed(11)
    p0 = torch.randn(n, generator=gen).to(dtype)
    differ = 0
    for t in range(1, 4):
        ref, got = [p0.clone(), *_fresh_states(n, blocksize)], [p0.clone(), *_fresh_states(n, blocksize)]
        g = _gradient(n, dtype, gen, bad=True)
        kw = dict(step=t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, blocksize=blocksize)
        reference.adam8bit_step(ref[0], g, *ref[1:], QMAP1, QMAP2, **kw)
        cpu.adam8bit_step(got[0], g, *got[1:], QMAP1, QMAP2, simd=simd, exact=False, **kw)
        for a, b in zip(ref[1:], got[1:]):
            assert torch.equal(a, b)
        update = (ref[0].float() - p0.float()).abs()
        ulp = torch.finfo(dtype).eps * p0.float().abs()  # the last rounding of p may land on a neighbour
        err = (got[0].float() - ref[0].float()).abs()
        assert bool((err <= 1e-6 * update + ulp + 1e-12).all()), float((err - 1e-6 * update - ulp).max())
        differ += int((got[0] != ref[0]).sum())
    if dtype == torch.float32:  # (bf16 rounding hides the ulps)
        assert differ > 0  # the fast mode really computes differently (else this test could not fail)


def test_fast_mode_is_a_separate_backend_never_chosen_by_auto():
    assert "cpu_fast" in kernels.available_backends("cpu")
    assert kernels.get_backend("auto", "cpu").name == "cpu"
    p = torch.nn.Parameter(torch.randn(5000))
    q = torch.nn.Parameter(p.detach().clone())
    p.grad = q.grad = torch.randn(5000)
    fast, exact = AdamW8bit([p], backend="cpu_fast"), AdamW8bit([q], backend="cpu")
    for _ in range(3):
        fast.step()
        exact.step()
    assert torch.equal(fast.state[p]["state1"], exact.state[q]["state1"])
    assert torch.allclose(p, q, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------ torch.compile
def _mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 64))


def test_compiled_opt_step_equals_eager():
    """``torch.compile(opt.step)`` with the cpu backend: the kernel runs eagerly (a graph break),
    on real tensors, so 20 steps give exactly the eager parameters and states."""
    models = [_mlp(0), _mlp(0)]
    # every tensor 8-bit (min_8bit_size=1): the compiled region is then the optimizer's own Python
    # around the kernel; fp32-state tensors would be updated by Inductor-generated code, which
    # rounds differently (tested with a tolerance below)
    opts = [AdamW8bit(m.parameters(), lr=1e-2, backend="cpu", min_8bit_size=1) for m in models]
    compiled_step = torch.compile(opts[1].step)
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        x = torch.randn(16, 64, generator=gen)
        for model, opt, step in ((models[0], opts[0], opts[0].step), (models[1], opts[1], compiled_step)):
            opt.zero_grad()
            model(x).square().mean().backward()
            step()
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(p, q)
        for key, value in opts[0].state[p].items():
            other = opts[1].state[q][key]
            assert torch.equal(value, other) if torch.is_tensor(value) else value == other, key
    assert not torch.equal(models[1][0].weight, _mlp(0)[0].weight)  # it did train


def test_compiled_training_step_equals_eager_training():
    """A whole training step (forward, backward, ``opt.step``) under ``torch.compile`` for 20
    steps equals eager training exactly. The ``aot_eager`` backend runs the traced graph with
    the same aten kernels as eager, so the gradients are the same bits and any difference
    would be the optimizer's (the bug this guards against left parameters unmoved, off by
    ~1e-2, or NaN). With Inductor the forward/backward itself rounds differently, which the
    8-bit codes then amplify, so that case is covered by the ``opt.step`` test above."""
    models = [_mlp(0), _mlp(0)]
    opts = [AdamW8bit(m.parameters(), lr=1e-2, backend="cpu", min_8bit_size=1) for m in models]

    def train_step(model, opt, x):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    compiled = torch.compile(train_step, backend="aot_eager")
    gen = torch.Generator().manual_seed(2)
    for _ in range(20):
        x = torch.randn(16, 64, generator=gen)
        eager_loss = train_step(models[0], opts[0], x)
        compiled_loss = compiled(models[1], opts[1], x)
        assert torch.equal(eager_loss, compiled_loss)
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(p, q)
    assert not torch.equal(models[1][0].weight, _mlp(0)[0].weight)


# ------------------------------------------------------------------------------ tensors it must not touch
class _Subclass(torch.Tensor):
    pass


@pytest.mark.parametrize(
    "position,make,error,match",
    [
        (0, lambda t: t.as_subclass(_Subclass), TypeError, "tensor subclass"),
        (1, lambda t: t.as_subclass(_Subclass), TypeError, "tensor subclass"),
        (2, lambda t: t.as_subclass(_Subclass), TypeError, "tensor subclass"),
        (0, lambda t: torch.empty_like(t, device="meta"), ValueError, "meta tensor"),
        (4, lambda t: torch.empty_like(t, device="meta"), ValueError, "meta tensor"),
        (1, lambda t: t.to_sparse(), TypeError, "dense"),
        (0, lambda t: torch.zeros(2 * t.numel())[::2], ValueError, "contiguous"),
        (3, lambda t: torch.zeros(2 * t.numel(), dtype=torch.uint8)[1::2], ValueError, "contiguous"),
    ],
    ids=["subclass-p", "subclass-g", "subclass-state", "meta-p", "meta-absmax", "sparse-g", "strided-p",
         "strided-state"],
)
def test_unsupported_tensors_raise_before_any_pointer_is_read(position, make, error, match):
    args = _args()
    args[position] = make(args[position])
    with pytest.raises(error, match=match):
        cpu.adam8bit_step(*args, **KW)


DTENSOR_SCRIPT = """
import os, tempfile, torch, torch.distributed as dist
from torch.distributed.tensor import distribute_tensor, Shard
from torch.distributed.device_mesh import init_device_mesh
from adam8lib.kernels import cpu
from adam8lib.quant import dynamic_map
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
p = distribute_tensor(torch.zeros(1000), mesh, [Shard(0)])
args = [p, torch.zeros(1000), torch.zeros(1000, dtype=torch.uint8), torch.zeros(1000, dtype=torch.uint8),
        torch.zeros(4), torch.zeros(4), dynamic_map(True), dynamic_map(False)]
try:
    cpu.adam8bit_step(*args, step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, blocksize=256)
except TypeError as exc:
    print("TypeError:", exc)
from adam8lib.distributed import end_rank
end_rank()  # not the interpreter teardown, which can abort a gloo process
"""


def test_dtensor_raises_a_clear_error_instead_of_a_segfault():
    """A DTensor parameter (FSDP2) used to crash the process (SIGSEGV: a DTensor owns no
    storage). Run in a subprocess so that a crash fails this test instead of the whole run."""
    done = subprocess.run([sys.executable, "-c", DTENSOR_SCRIPT], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "TypeError: p is a DTensor (FSDP2 / tensor parallel)" in done.stdout
    assert "DTensor" in done.stdout


# ------------------------------------------------------------------------------ building: lock, reasons
def _python(code, env, timeout):
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO), **env})
    return done, time.monotonic() - start


def test_stale_build_lock_is_removed_and_the_build_succeeds(tmp_path):
    """A build killed mid-compile leaves torch's ``lock`` file behind; it used to make every later
    step wait forever. Now the build (under an flock that dies with its holder) removes it."""
    env = {"ADAM8LIB_CACHE_DIR": str(tmp_path)}
    done, _ = _python("from adam8lib.kernels import cpu; print(cpu.build_directory())", env, 120)
    directory = Path(done.stdout.strip())
    directory.mkdir(parents=True)
    (directory / "lock").write_text("")  # what a killed build leaves
    code = """
        import warnings
        from adam8lib.kernels import cpu
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cpu.load_extension()
        print("built", cpu.simd_level(), [str(w.message) for w in caught])
    """
    done, _ = _python(code, env, 300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "built" in done.stdout and "stale build lock" in done.stdout
    assert not (directory / "lock").exists()


def test_a_build_that_never_finishes_times_out_with_a_clear_error(tmp_path):
    """Another process holding the build lock (a build that hangs) makes this one give up after
    ADAM8LIB_BUILD_LOCK_TIMEOUT seconds, saying why, instead of waiting forever."""
    env = {"ADAM8LIB_CACHE_DIR": str(tmp_path), "ADAM8LIB_BUILD_LOCK_TIMEOUT": "2"}
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import fcntl, sys, time
            from adam8lib.kernels import cpu
            d = cpu.build_directory(); d.mkdir(parents=True)
            f = open(d / "build.flock", "a+"); fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            print("holding", flush=True); time.sleep(120)
        """)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        code = """
            import time, torch
            from adam8lib import kernels
            from adam8lib.kernels import cpu
            start = time.monotonic()
            try:
                cpu.load_extension()
            except RuntimeError as exc:
                print("error:", exc)
            print("waited:", time.monotonic() - start)
            print("supports:", cpu.supports(torch.device("cpu")), "reason:", cpu.unavailable_reason())
            print("auto:", kernels.get_backend("auto", "cpu").name)
        """
        done, _ = _python(code, env, 180)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 0, done.stderr[-2000:]
    waited = float(done.stdout.split("waited:")[1].split()[0])
    assert 2 <= waited < 20, waited  # the 2 s timeout (plus polling), not forever
    assert "error: adam8lib cpu backend unavailable: building the kernel failed: TimeoutError" in done.stdout
    assert "ADAM8LIB_BUILD_LOCK_TIMEOUT" in done.stdout
    assert "supports: False" in done.stdout and "auto: torch" in done.stdout


def test_unavailable_backend_says_why_without_a_compiler(tmp_path):
    code = """
        import torch
        from adam8lib import kernels
        from adam8lib.kernels import cpu
        print("supports:", cpu.supports(torch.device("cpu")))
        print("reason:", cpu.unavailable_reason())
        print("auto:", kernels.get_backend("auto", "cpu").name)
    """
    done, _ = _python(code, {"ADAM8LIB_CACHE_DIR": str(tmp_path), "CXX": "no-such-compiler-adam8"}, 120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "supports: False" in done.stdout and "auto: torch" in done.stdout
    assert "reason: no C++ compiler ('no-such-compiler-adam8' not on PATH" in done.stdout


def test_unavailable_backend_quotes_the_compiler_error(tmp_path):
    fake = tmp_path / "fake-cxx"
    # answers torch's version probes like g++, fails on every compile
    fake.write_text('#!/bin/sh\ncase "$1" in --version|-v|-dumpversion|-dumpfullversion) exec g++ "$@";; esac\n'
                    "echo 'fake-cxx: error: this compiler always fails' >&2\nexit 1\n")
    fake.chmod(0o755)
    code = """
        import torch, warnings
        warnings.simplefilter("ignore")
        from adam8lib.kernels import cpu
        print("supports:", cpu.supports(torch.device("cpu")))
        print("reason:", cpu.unavailable_reason())
    """
    done, _ = _python(code, {"ADAM8LIB_CACHE_DIR": str(tmp_path / "cache"), "CXX": str(fake)}, 120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "supports: False" in done.stdout
    assert "reason: building the kernel failed" in done.stdout
    assert "this compiler always fails" in done.stdout


def test_fast_backend_name_is_known_in_a_fresh_process(tmp_path):
    """``backend="cpu_fast"`` is accepted by the optimizer before anything imported the cpu module."""
    code = """
        import torch
        from adam8lib import AdamW8bit
        p = torch.nn.Parameter(torch.randn(5000)); p.grad = torch.randn(5000)
        opt = AdamW8bit([p], backend="cpu_fast"); opt.step()
        print("stepped", opt.state[p]["step"])
    """
    done, _ = _python(code, {}, 120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stepped 1" in done.stdout


def test_signed_second_moment_map_still_identical_to_reference():
    """A map with negative entries used for v (an experiment's choice, not the library's):
    dequantized v can be negative, torch's sqrt gives NaN there, and the kernel must too, so
    it calls MKL instead of its inline root (which returns a negative input as it is)."""
    n, blocksize = 20_011, 256
    gen = torch.Generator().manual_seed(7)
    p0 = torch.randn(n, generator=gen)
    states = _fresh_states(n, blocksize)
    states[1] = torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8)  # codes of v, half negative
    states[3] = torch.rand(states[3].shape, generator=gen) + 0.5  # their absmax
    ref, got = [p0.clone(), *[s.clone() for s in states]], [p0.clone(), *[s.clone() for s in states]]
    for t in range(1, 4):
        g = _gradient(n, torch.float32, gen, bad=False)
        kw = dict(step=t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, blocksize=blocksize)
        reference.adam8bit_step(ref[0], g, *ref[1:], QMAP1, QMAP1, **kw)
        cpu.adam8bit_step(got[0], g, *got[1:], QMAP1, QMAP1, **kw)
        _assert_same(ref, got, f"signed map for v, step {t}")
    assert bool(got[0].isnan().any())  # some v was negative: its parameter is NaN, as in the reference


def test_knockout_builds_are_only_for_timing():
    """bench/profile_step.py's knock-out builds: the define must be a C identifier (it goes on
    the compiler's command line), and ``using_build`` hands the step back to the real kernel
    afterwards, even when the block raises."""
    with pytest.raises(ValueError, match="C identifier"):
        cpu.knockout_build("X; rm -rf /")
    real = cpu.load_extension()
    stand_in = object()
    with pytest.raises(RuntimeError, match="inside"):
        with cpu.using_build(stand_in):
            assert cpu.load_extension() is stand_in
            raise RuntimeError("inside")
    assert cpu.load_extension() is real
