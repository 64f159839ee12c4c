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

import pytest
import torch

from adam8lib import kernels
from adam8lib.kernels import cpu, reference
from adam8lib.optim import Adam8bit, AdamW8bit
from adam8lib.quant import dynamic_map, linear_map, nearest_code, num_blocks

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
    """The kernel's lookup, in Python: base + (low 16 bits of key >= where ? step : 0), mod 256."""
    bits = x.view(torch.int32).long()
    key = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    entry = table.steps.long()[(key >> 16) + 0x8000] & 0xFFFFFFFF
    base, step, where = entry & 0xFF, (entry >> 8) & 0xFF, entry >> 16
    code = (base + torch.where((key & 0xFFFF) >= where, step, 0)) % 256
    return torch.where(x.isnan(), table.nan_code, code)


def _probe_values():
    """fp32 values where a lookup could go wrong: every bucket's first and last value and
    their neighbours, every map entry and midpoint (and the floats next to them), zeros,
    infinities, NaN, and random values over the whole exponent range."""
    starts = (torch.arange(65536, dtype=torch.int64) << 16)
    keys = torch.cat([starts, starts + 1, starts + 0xFFFF, starts + 0xFFFE])
    keys = keys[(keys >= 0x007FFFFF) & (keys <= 0xFF800000)]  # no NaN keys
    bits = torch.where(keys >= 2**31, keys - 2**31, (~keys) & 0xFFFFFFFF)
    bucket_edges = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(torch.float32)
    maps = torch.cat([QMAP1, QMAP2, linear_map(True), linear_map(False)])
    mids = torch.cat([(m[1:] + m[:-1]) / 2 for m in (QMAP1, QMAP2, linear_map(True), linear_map(False))])
    near = torch.cat([maps, mids])
    near = torch.cat([near, torch.nextafter(near, torch.tensor(2.0)), torch.nextafter(near, torch.tensor(-2.0))])
    gen = torch.Generator().manual_seed(0)
    rand = torch.randint(-(2**31), 2**31 - 1, (200_000,), generator=gen, dtype=torch.int64).to(torch.int32)
    rand = rand.view(torch.float32)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -1e-45, 1.0, -1.0])
    return torch.cat([bucket_edges, near, -near, rand, special, torch.rand(100_000, generator=gen) * 2 - 1])


@pytest.mark.parametrize("name,qmap", [("dynamic signed", QMAP1), ("dynamic unsigned", QMAP2),
                                       ("linear signed", linear_map(True)), ("linear unsigned", linear_map(False))])
@pytest.mark.parametrize("keep_sign", [True, False])
def test_code_table_gives_the_exact_nearest_code(name, qmap, keep_sign):
    x = _probe_values()
    expected = nearest_code(x, qmap, keep_sign=keep_sign).long()
    got = _table_code(x, cpu.code_table(qmap, keep_sign))
    bad = (got != expected).nonzero().flatten()
    assert bad.numel() == 0, f"{name}: {bad.numel()} wrong codes, e.g. x={x[bad[:3]].tolist()}"


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
        (1, torch.zeros(1000, dtype=torch.int32), ValueError, "floating-point"),
        (2, torch.zeros(1000, dtype=torch.int8), ValueError, "state1 must be torch.uint8"),
        (4, torch.zeros(3), ValueError, "absmax1 must be torch.float32\\[4\\]"),
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
    with pytest.raises(ValueError, match="CPU tensors"):
        cpu.adam8bit_step(*args, **KW)


def test_sqrt_probe_reproduces_torch_sqrt_on_new_data():
    # torch.sqrt is either IEEE sqrt or MKL's vmsSqrt; what the probe found must hold for
    # values it never saw (the step tests rely on it for bit-identical parameters)
    address, kind = cpu.torch_sqrt()
    x = torch.rand(100_003, generator=torch.Generator().manual_seed(7)) ** 3 * 10.0 ** torch.randint(-30, 3, (100_003,))
    ieee = x.double().sqrt().float()  # correctly rounded: one rounding of the exact root
    if kind == "ieee":
        assert address is None and torch.equal(torch.sqrt(x), ieee)
    else:
        assert address is not None and not torch.equal(torch.sqrt(x), ieee)  # else the probe was needless
        out = torch.empty_like(x)
        fn = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(address)
        fn(x.numel(), x.data_ptr(), out.data_ptr(), cpu.MKL_VML_MODE)
        assert torch.equal(out, torch.sqrt(x))
