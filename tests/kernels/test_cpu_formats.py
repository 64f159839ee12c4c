"""The "cpu" backend of the FP8 and 4-bit state formats equals the reference step bit for bit
(states, scales and parameters), and the optimizers pick it on the CPU (adam8lib/kernels/cpu_formats.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from adam8lib import AdamW4bit, AdamWFp8
from adam8lib.kernels import available_backends
from adam8lib.optim import LowBitAdam

pytestmark = pytest.mark.skipif("cpu" not in available_backends("cpu"), reason="the cpu kernel cannot be built here")

FORMATS = ("fp8", "4bit", "4bit-naive")


def _kernel(fmt):
    """The C++ Adam kernel of ``fmt`` with its own (state-dict) signature, as registered behind an adapter."""
    from adam8lib.kernels import cpu_formats

    return cpu_formats.fp8_step_cpu if fmt == "fp8" else cpu_formats.fourbit_step_cpu
# vectors (odd, not a multiple of a block), matrices (rank-1 v for "4bit"), one row, a 3-D tensor
SHAPES = [(4097,), (384,), (300, 77), (1, 999), (129, 1), (3, 20, 50)]
BIG_SHAPES = [(70001,), (200, 301)]  # more than 2^15 elements: several threads


def _grads(shape, steps, seed, special):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in range(steps):
        g = torch.randn(shape, generator=gen) * 10.0 ** torch.randint(-6, 1, shape, generator=gen)
        flat = g.view(-1)
        flat[:128] = 0.0  # an all-zero first block (m and v stay 0: scale 0)
        if special and t == 1:
            n = flat.numel()
            flat[n // 3] = float("nan")
            flat[n // 2] = float("inf")
            flat[n - 1] = -float("inf")
            flat[2 * n // 3] = 3e30  # g*g overflows
            flat[200 % n] = -1e-30
        out.append(g)
    return out


@pytest.fixture
def counted():
    """How many times each format's "cpu" step ran (so a silent fallback cannot pass)."""
    from adam8lib import kernels

    calls = {}
    real = {fmt: _kernel(fmt) for fmt in FORMATS}
    for fmt in FORMATS:
        def wrapper(*args, _real=real[fmt], _fmt=fmt, **kwargs):
            calls[_fmt] = calls.get(_fmt, 0) + 1
            return _real(*args, **kwargs)

        kernels.register_adam_step(fmt, "cpu", wrapper)
    yield calls
    for fmt in FORMATS:
        kernels.register_adam_step(fmt, "cpu", real[fmt])


def _run(fmt, shape, dtype, weight_decay, backend, grads, state_dict=None, blocksize=None):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(shape).to(dtype))
    opt = LowBitAdam([p], lr=1e-2, weight_decay=weight_decay, min_8bit_size=1, backend=backend,
                     state_format=fmt, blocksize=blocksize)
    if state_dict is not None:
        p.data.copy_(state_dict[0])
        opt.load_state_dict(copy.deepcopy(state_dict[1]))
    for g in grads:
        p.grad = g.to(dtype)
        opt.step()
    return p.detach().clone(), opt


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16) if t.element_size() == 2 else t


def _assert_same(a, b):
    (pa, oa), (pb, ob) = a, b
    assert torch.equal(_bits(pa), _bits(pb)), (pa - pb).abs().max()
    for sa, sb in zip(oa.state.values(), ob.state.values()):
        assert sa.keys() == sb.keys()
        for key in sa:
            if torch.is_tensor(sa[key]):
                assert torch.equal(_bits(sa[key]), _bits(sb[key])), key


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_equals_reference(fmt, shape, dtype, counted):
    grads = _grads(shape, 3, 1, special=True)
    for wd in (0.0, 0.01):
        _assert_same(_run(fmt, shape, dtype, wd, "torch", grads), _run(fmt, shape, dtype, wd, "cpu", grads))
    assert counted == {fmt: 6}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", BIG_SHAPES, ids=str)
def test_equals_reference_threads(fmt, shape):
    grads = _grads(shape, 2, 2, special=True)
    _assert_same(_run(fmt, shape, torch.float32, 0.01, "torch", grads),
                 _run(fmt, shape, torch.float32, 0.01, "cpu", grads))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("simd", [0, 1, 2])
def test_every_simd_level(fmt, simd, monkeypatch):
    import adam8lib.kernels.cpu_formats as cpu_formats

    monkeypatch.setattr(cpu_formats, "SIMD", simd)  # (capped at what this build has)
    for shape in [(4097,), (300, 77)]:
        grads = _grads(shape, 2, 6, special=True)
        _assert_same(_run(fmt, shape, torch.float32, 0.01, "torch", grads),
                     _run(fmt, shape, torch.float32, 0.01, "cpu", grads))


@pytest.mark.parametrize("fmt", FORMATS)
def test_other_blocksize_and_fp32_grad_of_bf16(fmt):
    shape = (130, 33)
    grads = _grads(shape, 2, 3, special=False)
    _assert_same(_run(fmt, shape, torch.float32, 0.0, "torch", grads, blocksize=64),
                 _run(fmt, shape, torch.float32, 0.0, "cpu", grads, blocksize=64))
    # an fp32 gradient of a bf16 parameter, straight into the steps
    from adam8lib import kernels
    from adam8lib.formats import get_format
    from adam8lib.kernels.reference import format_reference_step

    f = get_format(fmt)
    runs = []
    for step_fn in (format_reference_step, _kernel(fmt)):
        p = torch.randn(shape, generator=torch.Generator().manual_seed(4)).bfloat16().view(-1)
        state = f.new_state(shape, p.device)
        for t, g in enumerate(grads, 1):
            step_fn(p, g.reshape(-1), state, f, shape=shape, step=t, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8,
                    weight_decay=0.01)
        runs.append((p, state))
    assert torch.equal(_bits(runs[0][0]), _bits(runs[1][0]))
    for key in runs[0][1]:
        assert torch.equal(_bits(runs[0][1][key]), _bits(runs[1][1][key])), key


@pytest.mark.parametrize("cls, fmt", [(AdamWFp8, "fp8"), (AdamW4bit, "4bit")])
def test_auto_picks_cpu_and_resume(cls, fmt, monkeypatch):
    import adam8lib.kernels.cpu_formats as cpu_formats
    from adam8lib import kernels

    p = torch.nn.Parameter(torch.randn(64, 80))
    opt = cls([p])
    found = opt.fused_step(p)
    assert found is kernels.find_step("adamw", opt.format, "cpu", p.device) and found.backend == "cpu"
    grads = _grads((64, 80), 4, 5, special=False)
    # two steps with one backend, resume from its state_dict with each backend: the same bits
    first, opt1 = _run(fmt, (64, 80), torch.float32, 0.01, "cpu", grads[:2])
    saved = (first, opt1.state_dict())
    runs = [_run(fmt, (64, 80), torch.float32, 0.01, b, grads[2:], state_dict=saved) for b in ("torch", "cpu", "auto")]
    _assert_same(runs[0], runs[1])
    _assert_same(runs[0], runs[2])


def test_fp8_negative_v_bytes_from_a_corrupt_state():
    """A v byte that decodes negative (no step writes one) takes MKL's called root, as the reference."""
    from adam8lib.formats import get_format
    from adam8lib.kernels.reference import format_reference_step

    f, shape = get_format("fp8"), (1000,)
    runs = []
    for step_fn in (format_reference_step, _kernel("fp8")):
        p = torch.randn(shape, generator=torch.Generator().manual_seed(7))
        state = f.new_state(shape, p.device)
        state["state2"][::7] = 0xB0  # negative e4m3 numbers
        state["absmax2"].fill_(1e-4)
        step_fn(p, torch.full(shape, 1e-6), state, f, shape=shape, step=1, lr=1e-2, beta1=0.9, beta2=0.999,
                eps=1e-8, weight_decay=0.0)
        runs.append((p, state))
    assert torch.equal(runs[0][0].isnan(), runs[1][0].isnan()) and bool(runs[0][0].isnan().any())
    assert torch.equal(runs[0][0].nan_to_num(), runs[1][0].nan_to_num())
    for key in runs[0][1]:
        assert torch.equal(_bits(runs[0][1][key]), _bits(runs[1][1][key])), key
