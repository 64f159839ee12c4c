"""The 4-bit state formats' fused Triton step (``"4bit"``, ``"4bit-naive"``) against the reference
step (decode, fp32 rule, encode), on the CPU in Triton's interpreter and, as the ``cuda`` twin, on a GPU.

* the 16-entry nearest code (:func:`adam8lib.kernels.triton._nearest_code16`) equals
  :func:`adam8lib.quant.nearest_code` on every map entry, every midpoint, the fp32 neighbours of
  each midpoint, values past both ends and zeros of both signs;
* the fused step leaves the reference's states bit for bit (CPU): the packed codes (odd counts
  included: the pad nibble is 0), the blockwise scales of m and the rank-1 maxima of v (matrices
  with odd rows and columns, all-zero rows, a NaN gradient), over several steps, with weight decay,
  for fp32, bf16 and fp16 parameters. The parameters: bf16/fp16 bit for bit; fp32 within an ulp or
  two where torch's CPU ``sqrt`` (MKL/SLEEF) is not correctly rounded and the kernel's ``sqrt_rn`` is
  (as the 8-bit kernel's tests explain);
* tensors of 3 and 4 dimensions (rank-1 over every axis) too; 5 or more run the reference step;
* ``AdamW4bit(backend="triton")`` steps a model like ``backend="torch"``;
* the kernels compile for sm_90 ahead of time (bench/gpu_sass.py, no GPU needed) with exact
  division and square root, no fusion but the moments' two fmas, and no register spills.
"""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.kernels._triton_devices import DEVICES, KEYS, step_twins  # noqa: E402  (first: the interpreter where there is no GPU)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch import nn  # noqa: E402

from adam8lib import AdamW4bit  # noqa: E402
from adam8lib.formats import FORMATS  # noqa: E402
from adam8lib.kernels import triton as kt  # noqa: E402
from adam8lib.kernels import triton_4bit  # noqa: E402
from adam8lib.optim import LowBitAdam  # noqa: E402
from adam8lib.quant import nearest_code  # noqa: E402

FORMAT_NAMES = ("4bit", "4bit-naive")


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@triton.jit
def _code16_kernel(x_ptr, qmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, kt._nearest_code16(x, qmap_ptr).to(tl.uint8), mask=mask)


def _hard_inputs(qmap: torch.Tensor) -> torch.Tensor:
    """Every entry, every fp32 midpoint of neighbours and the fp32 neighbours of each, past the ends, +-0."""
    mids = (qmap[:-1] + qmap[1:]) / 2
    pts = torch.cat([qmap, mids])
    near = torch.cat([torch.nextafter(pts, torch.full_like(pts, -2)), torch.nextafter(pts, torch.full_like(pts, 2))])
    return torch.cat([pts, near, torch.tensor([-1.5, -1.0000001, 1.0000001, 1.5, 0.0, -0.0, 1e-30, -1e-30])])


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_nearest_code16_equals_the_reference_on_every_entry_and_tie(device, name):
    for moment in (FORMATS[name].m, FORMATS[name].v):
        qmap = moment.qmap().to(device)
        x = _hard_inputs(moment.qmap()).to(device)
        out = torch.empty(x.shape, dtype=torch.uint8, device=device)
        _code16_kernel[(triton.cdiv(x.numel(), 256),)](x, qmap, out, x.numel(), BLOCK=256)
        want = nearest_code(x, qmap)
        bad = (out != want).nonzero().flatten()
        assert bad.numel() == 0, f"{moment.map_name}: x={x[bad[:5]].tolist()}: {out[bad[:5]].tolist()} vs {want[bad[:5]].tolist()}"


def _gradient(shape, step, device):
    g = torch.randn(shape, device=device) * 10.0 ** torch.randint(-6, 1, shape, device=device)
    if step == 3:
        g.view(-1)[0] = float("nan")  # the non-finite rule: that element restarts, the others go on
        g.view(-1)[-1] = float("inf")
    if len(shape) == 2 and shape[0] > 2:
        g[1] = 0.0  # an all-zero row: row maximum 0 after step 1 (scale 0 there)
    return g


def _reference_and_kernel(name, shape, dtype, device, steps=4, tile=None, **hp):
    torch.manual_seed(sum(shape))
    p = torch.nn.Parameter(torch.randn(shape, device=device).to(dtype))
    opt = LowBitAdam([p], state_format=name, min_8bit_size=0, backend="torch", **hp)
    fmt = FORMATS[name]
    mine = p.detach().clone().reshape(-1)
    states = fmt.new_state(shape, device)
    for step in range(1, steps + 1):
        g = _gradient(shape, step, device).to(dtype)
        p.grad = g
        opt.step()
        triton_4bit.adam4bit_step_triton(mine, g.reshape(-1), states, fmt, shape=shape, step=step, beta1=0.9, beta2=0.999,
                                eps=1e-8, tile=tile, **hp)
        yield step, p.detach().reshape(-1), mine, opt.state[p], states


def _check(name, shape, dtype, device, tile=None, **hp):
    for step, want_p, got_p, ref, states in _reference_and_kernel(name, shape, dtype, device, tile=tile, **hp):
        for k in KEYS:
            if device.type == "cpu":
                assert torch.equal(states[k], ref[k]), f"step {step}: {k} differs"
            else:  # torch's CUDA kernels may fuse the moments differently: an ulp can move a code,
                # or a row's maximum and with it that row's codes of v (a row of (65, 130) is 1.5%)
                same = (states[k] == ref[k]).float().mean().item()
                assert same >= 0.97, f"step {step}: {k} only {same:.4%} identical"
        _parameters_agree(got_p, want_p, device, f"step {step}")


def _parameters_agree(got, want, device, where):
    """CPU: bf16/fp16 bit for bit, fp32 within an ulp or two (torch's CPU sqrt is an ulp off on some
    inputs, the kernel's sqrt_rn is not). CUDA: torch's kernels round the moments and addcdiv on their
    own terms, an ulp can move a code (and with rank-1 scales a row's maximum), so 99% of the
    parameters within 1e-5 relative (fp32) or a bf16/fp16 ulp."""
    if device.type == "cpu":
        if got.dtype != torch.float32:
            assert torch.equal(got, want), f"{where}: parameters differ"
        else:
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    else:
        rtol = 1e-5 if got.dtype == torch.float32 else 2**-7
        close = torch.isclose(got.float(), want.float(), rtol=rtol, atol=1e-6)
        assert close.float().mean() >= 0.99, f"{where}: only {close.float().mean():.4%} of the parameters agree"


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("shape", [(1,), (127,), (257,), (7, 33), (33, 5), (1, 9), (65, 130)])
def test_fused_4bit_step_equals_the_reference_step(device, name, shape):
    _check(name, shape, torch.float32, device, lr=1e-2, weight_decay=0.1)


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("shape", [(600,), (33, 130), (130, 17)])
def test_fused_4bit_step_with_small_tiles(device, name, shape):
    # 256-element tiles: many programs in both passes, so a row's (column's) maximum is merged by
    # atomic_max from several programs and a matrix row spans tiles of the blockwise pass
    _check(name, shape, torch.float32, device, tile=256, steps=3, lr=1e-2, weight_decay=0.1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(301,), (17, 9)])
def test_fused_4bit_step_half_precision_parameters(device, dtype, shape):
    _check("4bit", shape, dtype, device, lr=1e-3, weight_decay=0.0)
    _check("4bit-naive", shape, dtype, device, lr=1e-3, weight_decay=0.01)


def test_fused_4bit_step_other_blocksize(device):
    fmt = FORMATS["4bit"].with_blocksize(64)
    shape = (5, 51)
    torch.manual_seed(1)
    p = torch.nn.Parameter(torch.randn(shape, device=device))
    opt = LowBitAdam([p], state_format="4bit", blocksize=64, min_8bit_size=0, backend="torch", lr=1e-2)
    mine, states = p.detach().clone().reshape(-1), fmt.new_state(shape, device)
    for step in range(1, 3):
        p.grad = _gradient(shape, step, device)
        opt.step()
        triton_4bit.adam4bit_step_triton(mine, p.grad.reshape(-1), states, fmt, shape=shape, step=step, lr=1e-2, beta1=0.9,
                                beta2=0.999, eps=1e-8, weight_decay=0.0)
        if device.type == "cpu":
            assert all(torch.equal(states[k], opt.state[p][k]) for k in KEYS)


@pytest.mark.parametrize("shape,tile", [((3, 4, 5), None), ((5, 3, 7), 64), ((2, 3, 4, 5), None), ((3, 2, 5, 9), 64),
                                        ((2, 1, 3, 2, 3), None)])
def test_rank1_over_three_or_four_axes(device, shape, tile):
    # rank-1 over three or four axes (the smallest of every axis's maxima) is not the rank-1 of any
    # 2-D view; the kernel takes it on the (n / last, last) view; five or more: the reference step
    _check("4bit", shape, torch.float32, device, tile=tile, lr=1e-2, weight_decay=0.1)


def test_adamw4bit_triton_backend_steps_a_model_like_the_torch_backend(device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 129), nn.Tanh(), nn.Linear(129, 20), nn.Unflatten(1, (4, 5)),
                          nn.Conv1d(4, 3, 3)).to(device)  # matrices, vectors and a 3-D weight
    twin = copy.deepcopy(model)
    ours = AdamW4bit(model.parameters(), lr=1e-2, backend="triton", min_8bit_size=0)
    ref = AdamW4bit(twin.parameters(), lr=1e-2, backend="torch", min_8bit_size=0)
    step_twins(model, twin, ours, ref, steps=3)
    for p, q in zip(model.parameters(), twin.parameters()):
        assert "state1" in ref.state[q]
        if device.type == "cpu":
            assert all(torch.equal(ours.state[p][k], ref.state[q][k]) for k in KEYS)
        _parameters_agree(p.detach().reshape(-1), q.detach().reshape(-1), device, "model")


def test_the_4bit_formats_list_and_register_a_triton_step():
    from adam8lib import kernels

    for name in FORMAT_NAMES:
        assert "triton" in kernels.backends_for("adamw", FORMATS[name])
        assert any(s.rule == "adamw" and s.backend == "triton" and s.accepts(FORMATS[name])
                   for s in kernels.registered_steps())
    w = [torch.nn.Parameter(torch.zeros(8))]
    assert AdamW4bit(w, backend="triton").backend == "triton"
    with pytest.raises(ValueError, match="4-bit map formats"):
        triton_4bit.adam4bit_step_triton(torch.zeros(4), torch.zeros(4), FORMATS["fp8"].new_state((4,), "cpu"), FORMATS["fp8"],
                                shape=(4,), step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)


@pytest.mark.skipif(not kt.INTERPRETED, reason="the CPU reference in Triton's interpreter")
@pytest.mark.parametrize("name,shape", [("4bit", (65, 130)), ("4bit-naive", (65, 130)), ("4bit", (257,))])
def test_fp32_parameters_bit_for_bit_with_a_correctly_rounded_sqrt(monkeypatch, name, shape):
    """The fp32 parameters differ from the reference's only where torch's CPU sqrt is not correctly
    rounded: with the reference's ``v.sqrt()`` correctly rounded (NumPy's, IEEE), as the kernel's
    ``sqrt_rn`` is, the parameters are equal bit for bit too (every other operation, order included,
    is the reference's)."""
    import numpy as np

    torch_sqrt = torch.Tensor.sqrt

    def sqrt_rn(self):
        if self.device.type == "cpu" and self.dtype == torch.float32:
            return torch.from_numpy(np.sqrt(self.numpy()))
        return torch_sqrt(self)

    monkeypatch.setattr(torch.Tensor, "sqrt", sqrt_rn)
    for step, want_p, got_p, ref, states in _reference_and_kernel(name, shape, torch.float32, torch.device("cpu"),
                                                                  lr=1e-2, weight_decay=0.1):
        assert all(torch.equal(states[k], ref[k]) for k in KEYS), f"step {step}: states differ"
        assert torch.equal(got_p, want_p), f"step {step}: {(got_p != want_p).sum().item()} parameters differ"


AOT_COMPILE_4BIT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import gpu_sass
out = {}
for dtype in ("fp32", "bf16"):
    for name, compile_ in (("blockwise", lambda: gpu_sass.compile_4bit_step(90, dtype, rank1=False)),
                           ("rank1 pass 1", lambda: gpu_sass.compile_rank1_max(90, dtype)),
                           ("rank1 pass 2", lambda: gpu_sass.compile_4bit_step(90, dtype, rank1=True))):
        kernel, per_thread = compile_()
        out[name + " " + dtype] = dict(ptx=kernel.asm["ptx"], per_thread=per_thread,
                                       **gpu_sass.analyse(kernel, per_thread))
print(json.dumps(out))
"""


def test_4bit_kernels_compile_for_gpu_with_exact_math():
    """Compile the 4-bit kernels for an H100/H200 (sm_90) on the CPU (bench/gpu_sass.py) and read
    their PTX and SASS: they compile; division and square root are ``div.rn``/``sqrt.rn`` (no
    approximations); the only fmas are the moments' two per element; no register spills.
    (Instructions per element, for the record, in ``python bench/gpu_sass.py --lowbit4``.)
    Runs in a fresh process without TRITON_INTERPRET: the interpreter, once used, patches triton."""
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", AOT_COMPILE_4BIT, str(repo / "bench")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(out) == 6
    for name, res in out.items():
        ptx, per_thread = res["ptx"], res["per_thread"]
        for approximate in ("div.full", "div.approx", "sqrt.approx", "rsqrt", "ex2.approx"):
            assert approximate not in ptx, (name, approximate)
        assert ptx.count("fma.rn.f32") == 2 * per_thread, name  # m and v only: nothing else was fused
        if "pass 1" in name:
            assert "atom.global" in ptx and "sqrt" not in ptx, name  # maxima only: no parameter update
        else:
            assert ptx.count("sqrt.rn.f32") == per_thread and ptx.count("div.rn.f32") >= 2 * per_thread, name
        assert res["spill_bytes"] == 0, (name, res["spill_bytes"])
