"""The ``"fp8"`` state format's fused Triton step against the reference step (decode, fp32 rule,
encode), on the CPU in Triton's interpreter and, as the ``cuda`` twin, on a GPU.

* the e4m3 encoder (:func:`adam8lib.kernels.triton._fp8_codes`) equals torch's
  ``.to(torch.float8_e4m3fn)`` on every e4m3 value, every midpoint between neighbours (ties to
  even), one fp32 ulp either side of each midpoint, zeros of both signs and the keep-sign rule;
* the fused step leaves the reference's states bit for bit (CPU), the parameters within 1e-6
  (the reference takes MKL's sqrt, the kernel ``sqrt_rn``; as the 8-bit kernel's tests explain);
* ``AdamWFp8(backend="triton")`` steps a model like ``backend="torch"`` (the 4-bit formats'
  Triton step: tests/kernels/test_triton_4bit.py).
"""

import copy

import pytest
import torch

from tests.kernels._triton_devices import DEVICES, KEYS, step_twins  # noqa: E402  (first: the interpreter where there is no GPU)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch import nn  # noqa: E402

from adam8lib import AdamW4bit, AdamWFp8  # noqa: E402
from adam8lib.kernels import triton as kt  # noqa: E402
from adam8lib.kernels import triton_fp8  # noqa: E402
from adam8lib.optim import LowBitAdam  # noqa: E402



@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@triton.jit
def _encode_kernel(x_ptr, out_ptr, n, KEEP_SIGN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, kt._fp8_codes(x, KEEP_SIGN).to(tl.uint8), mask=mask)


def _encode(x: torch.Tensor, keep_sign: bool) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    block = 1024
    _encode_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), KEEP_SIGN=keep_sign, BLOCK=block)
    return out


def _hard_inputs() -> torch.Tensor:
    """Normalized values |x| <= 1 at every e4m3 value, midpoint and the fp32 neighbours of each midpoint."""
    codes = torch.arange(0, 0x7F, dtype=torch.int32).to(torch.uint8)  # 0 .. 448 (0x7E), no NaN
    values = codes.view(torch.float8_e4m3fn).float()
    mids = (values[:-1] + values[1:]) / 2  # exact in fp32
    near = torch.cat([torch.nextafter(mids, torch.full_like(mids, -1)), torch.nextafter(mids, torch.full_like(mids, 1e9))])
    y = torch.cat([values, mids, near, torch.tensor([2.0**-12, 2.0**-10, 3 * 2.0**-11])])
    y = y[(y <= 448)]
    x = y / 448.0
    return torch.cat([x, -x, torch.tensor([0.0, -0.0])])


def test_encoder_rounds_like_torch_on_every_value_and_tie(device):
    x = _hard_inputs().to(device)
    want = (x * 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    got = _encode(x, keep_sign=False)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} differ, e.g. y={(x[bad[:5]] * 448).tolist()}: {got[bad[:5]].tolist()} vs {want[bad[:5]].tolist()}"


def test_encoder_keep_sign_never_codes_a_nonzero_value_as_zero(device):
    x = torch.tensor([1e-9, -1e-9, 2.0**-12 / 448, 0.0, -0.0, 0.5], device=device)
    got = _encode(x, keep_sign=True).tolist()
    assert got[:3] == [0x01, 0x81, 0x01]  # the smallest subnormal of the value's sign
    assert got[3:5] == [0x00, 0x80]  # a true zero keeps its code (and its sign bit, as torch)
    assert got[5] == (torch.tensor(224.0).to(torch.float8_e4m3fn).view(torch.uint8).item())


def _reference_and_kernel(n, dtype, device, steps=5, **hp):
    torch.manual_seed(n)
    p = torch.nn.Parameter(torch.randn(n, device=device).to(dtype))
    opt = LowBitAdam([p], state_format="fp8", min_8bit_size=0, backend="torch", **hp)
    mine = p.detach().clone()
    states = None
    for step in range(1, steps + 1):
        g = torch.randn(n, device=device) * 10.0 ** torch.randint(-6, 1, (n,), device=device)
        if step == 3:
            g[0] = float("inf")  # the non-finite rule: that element restarts, the others go on
        p.grad = g.to(dtype)
        opt.step()
        ref = opt.state[p]
        if states is None:
            states = {k: torch.zeros_like(ref[k]) for k in KEYS}  # a fresh fp8 state is all zero bytes
        triton_fp8.fp8_step_triton(mine, g.to(dtype), *(states[k] for k in KEYS), step=step, beta1=0.9, beta2=0.999,
                           eps=1e-8, **hp)
        yield step, p.detach(), mine, ref, states


@pytest.mark.parametrize("n", [1, 255, 257, 4099])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_fp8_step_equals_the_reference_step(device, n, dtype):
    for step, want_p, got_p, ref, states in _reference_and_kernel(n, dtype, device, lr=1e-2, weight_decay=0.1):
        for k in KEYS:
            if device.type == "cpu":
                assert torch.equal(states[k], ref[k]), f"step {step}: {k} differs"
            else:  # torch's CUDA kernels may fuse the moments differently: an ulp can move a code
                same = (states[k] == ref[k]).float().mean().item()
                assert same >= 0.999, f"step {step}: {k} only {same:.4%} identical"
        if dtype == torch.float32:
            torch.testing.assert_close(got_p, want_p, rtol=0, atol=1e-6)
        else:  # one bf16 ulp on a few elements where the fp32 values straddle a rounding boundary
            assert ((got_p.float() - want_p.float()).abs() > want_p.float().abs() * 2**-7).float().mean() <= 0.01


def test_adamwfp8_triton_backend_steps_a_model_like_the_torch_backend(device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 20)).to(device)
    twin = copy.deepcopy(model)
    ours = AdamWFp8(model.parameters(), lr=1e-2, backend="triton")
    ref = AdamWFp8(twin.parameters(), lr=1e-2, backend="torch")
    step_twins(model, twin, ours, ref, steps=4)
    low_bit = 0
    for p, q in zip(model.parameters(), twin.parameters()):
        if "state1" in ref.state[q]:
            low_bit += 1
            if device.type == "cpu":
                assert all(torch.equal(ours.state[p][k], ref.state[q][k]) for k in KEYS)
        torch.testing.assert_close(p, q, rtol=0, atol=1e-5)
    assert low_bit == 2  # both weight matrices have FP8 states; the biases are under min_8bit_size


def test_backends_of_the_low_bit_formats():
    w = [torch.nn.Parameter(torch.zeros(8))]
    assert AdamW4bit(w, backend="triton").backend == "triton"  # tests/kernels/test_triton_4bit.py
    with pytest.raises(ValueError, match="backend 'cpu_fast' has no step for its states"):
        AdamWFp8(w, backend="cpu_fast")
    assert AdamWFp8(w, backend="triton").backend == "triton"
    assert AdamWFp8(w, backend="cpu").backend == "cpu"
