"""Compressed master weights (adam8lib.master_weights): split/join bit-exact against an independent
float64 reference, special values, bytes; the optimizer wrapper against an explicit fp32 master."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from adam8lib import AdamW4bit, AdamW8bit, Adan8bit, Lion8bit, LowBitAdam
from adam8lib.master_weights import CompressedMasterWeights, join_master, master_rounding, split_master


def from_bits(patterns) -> torch.Tensor:
    arr = np.asarray(patterns, dtype=np.uint64).astype(np.uint32)
    return torch.from_numpy(arr.view(np.float32).copy())


def bits_of(x: torch.Tensor) -> np.ndarray:
    return x.contiguous().numpy().view(np.uint32)


def ref_round(x: torch.Tensor, significant: int, clamp_finite: bool) -> np.ndarray:
    """float64 reference: fp32 ``x`` rounded to ``significant`` significant bits, ties away from zero,
    with the subnormal quantum of fp32 scaled alike; overflow to inf, or clamped to the largest finite."""
    v = x.double().numpy()
    mag = np.abs(v)
    _, e = np.frexp(mag)  # mag in [2**(e-1), 2**e)
    quantum = np.maximum(np.ldexp(1.0, e - significant), np.ldexp(1.0, -149 + 24 - significant))
    out = np.floor(mag / quantum + 0.5) * quantum
    largest = (2.0 - 2.0 ** (1 - significant)) * 2.0 ** 127
    out = np.where(out > largest, largest if clamp_finite else np.inf, out)
    return np.where(np.isfinite(v), np.copysign(out, v), v)


def sample(n=200_000, seed=0) -> torch.Tensor:
    """Random fp32 numbers across every binade (normal and subnormal), both signs."""
    gen = torch.Generator().manual_seed(seed)
    mant = torch.rand(n, generator=gen, dtype=torch.float64) + 1.0
    exps = torch.randint(-149, 128, (n,), generator=gen).double()
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).double()
    x = (sign * mant * torch.pow(2.0, exps)).float()
    return x[torch.isfinite(x)]


SPECIALS = [0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x0000FFFF, 0x00008000, 0x00007FFF, 0x007FFFFF,
            0x807FFFFF, 0x00800000, 0x3F800000, 0x3F808000, 0x3F818000, 0x3F807FFF, 0xBF808000, 0x3F80FFFF,
            0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x7F800000, 0xFF800000, 0x7F7FFF80, 0x7F7FFF7F]
NANS = [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA00000, 0x7FC0ABCD, 0xFF80FFFF, 0x7FFFFFFF]


def test_16_bits_join_back_every_finite_and_infinite_fp32_exactly():
    uppers = [0x0000, 0x0001, 0x007F, 0x0080, 0x3F80, 0x3FFF, 0x4000, 0x7F7F, 0x8000, 0x8001, 0xBF80, 0xFF7F]
    lows = np.arange(1 << 16, dtype=np.uint64)
    patterns = np.concatenate([(np.uint64(u) << np.uint64(16)) | lows for u in uppers] + [np.array(SPECIALS, np.uint64)])
    x = torch.cat([from_bits(patterns), sample()])
    hi, lo = split_master(x, 16)
    assert hi.dtype == torch.bfloat16 and lo.dtype == torch.int16 and hi.shape == lo.shape == x.shape
    back = join_master(hi, lo)
    assert np.array_equal(bits_of(back), bits_of(x))
    # hi is x rounded to the nearest bf16, ties away from zero (float64 reference)
    want = ref_round(x, 8, clamp_finite=False)
    assert np.array_equal(hi.double().numpy(), want)
    # ... which is torch's round-to-nearest-even except at exact ties
    differs = (hi != x.to(torch.bfloat16)).numpy()
    ties = (bits_of(x) & 0xFFFF) == 0x8000
    assert differs.any() and not (differs & ~ties).any()


def test_negative_zero_subnormals_infinities_and_the_largest_finite():
    x = from_bits([0x80000000, 0x00000001, 0x8000FFFF, 0x7F800000, 0xFF800000, 0x7F7FFFFF])
    hi, lo = split_master(x, 16)
    assert bits_of(hi.float()).tolist() == [0x80000000, 0x00000000, 0x80010000, 0x7F800000, 0xFF800000, 0x7F800000]
    assert lo.tolist() == [0, 1, -1, 0, 0, -1]  # the largest finite fp32 number: hi = inf, lo = -1
    assert np.array_equal(bits_of(join_master(hi, lo)), bits_of(x))


@pytest.mark.parametrize("bits", [16, 8])
def test_nan_stays_nan_with_its_sign_and_its_quiet_bit_set(bits):
    x = from_bits(NANS)
    hi, lo = split_master(x, bits)
    assert bool(torch.isnan(hi).all())
    assert (bits_of(hi.float()) >> 31).tolist() == (np.array(NANS, np.uint64) >> 31).tolist()
    back = bits_of(join_master(hi, lo))
    keep = 0xFFFFFFFF if bits == 16 else 0xFFFFFF00
    want = [(b | 0x00400000) & keep for b in NANS]
    assert back.tolist() == want
    assert back[0] == 0x7FC00000 and back[1] == 0xFFC00000  # torch's NaNs: exact


def test_8_bits_keep_a_24_bit_master_and_lose_the_8_lowest_mantissa_bits():
    x = torch.cat([from_bits(SPECIALS), sample(seed=1)])
    hi, lo = split_master(x, 8)
    assert lo.dtype == torch.int8
    back = join_master(hi, lo)
    want = ref_round(x, 16, clamp_finite=True)
    assert np.array_equal(back.double().numpy(), want)
    assert np.array_equal(bits_of(back[1:2]), [0x80000000])  # -0 stays -0
    assert (bits_of(back) & 0xFF == 0).all()
    normal = (x.abs() >= 2.0 ** -126) & torch.isfinite(x)
    err = (back.double() - x.double()).abs()
    assert bool((err[normal] <= 2.0 ** -16 * x.double().abs()[normal]).all())
    assert float(err[~normal & torch.isfinite(x)].max()) <= 2.0 ** -142
    assert bool((err[normal] > 2.0 ** -17 * x.double().abs()[normal]).any())  # the bound is nearly reached
    # hi: the 24-bit master rounded to bf16, ties away; exact 24-bit masters join back as they are
    assert np.array_equal(hi.double().numpy(), ref_round(back, 8, clamp_finite=False))
    assert np.array_equal(bits_of(master_rounding(back, 8)), bits_of(back))
    assert np.array_equal(bits_of(master_rounding(x, 16)), bits_of(x))


def test_bytes_per_element():
    x = torch.randn(1000)
    for bits, per in ((16, 4), (8, 3)):
        hi, lo = split_master(x, bits)
        assert hi.untyped_storage().nbytes() + lo.untyped_storage().nbytes() == per * 1000


def test_bad_input():
    with pytest.raises(TypeError, match="fp32 master"):
        split_master(torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="bits must be 16"):
        split_master(torch.ones(3), 12)
    with pytest.raises(ValueError, match="bits must be 16"):
        split_master(torch.ones(3), True)
    with pytest.raises(TypeError, match="upper half must be bf16"):
        join_master(torch.ones(3), torch.zeros(3, dtype=torch.int16))
    with pytest.raises(TypeError, match="int16 .16 bits. or int8"):
        join_master(torch.ones(3, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="shape"):
        join_master(torch.ones(3, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.int16))
    with pytest.raises(TypeError, match="a tensor"):
        split_master([1.0])


# ---------------------------------------------------------------------- the optimizer wrapper
def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128), nn.ReLU(), nn.Linear(128, 4))


def batches(n, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(64, 64, generator=gen), torch.randint(0, 4, (64,), generator=gen)) for _ in range(n)]


OPTS = {
    "AdamW8bit": lambda ps: AdamW8bit(ps, lr=1e-3, weight_decay=0.1),
    "LowBitAdam-4bit": lambda ps: LowBitAdam(ps, lr=1e-3, state_format="4bit"),
    "Lion8bit": lambda ps: Lion8bit(ps, lr=1e-4),
    "Adan8bit": lambda ps: Adan8bit(ps, lr=1e-3),  # a kept state, joined and split with the others' chunks
    "torch.AdamW": lambda ps: torch.optim.AdamW(ps, lr=1e-3),
}


def reference(name, bits, steps):
    """An explicit fp32 master (its own tensors and optimizer) and a bf16 model copy made from it each step:
    mixed precision with a full fp32 master; for bits=8 the master is rounded to 24 bits after each step
    (the float64 reference rounding)."""
    master = [nn.Parameter(p.detach().clone()) for p in mlp().parameters()]
    if bits == 8:
        with torch.no_grad():
            for w in master:
                w.copy_(torch.from_numpy(ref_round(w.detach(), 16, True)).float())
    opt = OPTS[name](master)
    model = mlp().to(torch.bfloat16)
    for x, y in batches(steps):
        with torch.no_grad():
            for p, w in zip(model.parameters(), master):
                p.copy_(split_master(w.detach(), bits)[0])
        nn.functional.cross_entropy(model(x.bfloat16()).float(), y).backward()
        for p, w in zip(model.parameters(), master):
            w.grad = p.grad.float()
            p.grad = None
        opt.step()
        if bits == 8:
            with torch.no_grad():
                for w in master:
                    w.copy_(torch.from_numpy(ref_round(w.detach(), 16, True)).float())
    return master, opt


def compressed(name, bits, steps, release=False, resume_at=None):
    model = mlp()
    opt = OPTS[name](model.parameters())
    mw = CompressedMasterWeights(model, opt, bits=bits)
    handle = None
    if release:
        from adam8lib.release import release_gradients
        handle = release_gradients(model, opt)
    for i, (x, y) in enumerate(batches(steps)):
        if i == resume_at:
            ckpt = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(), "mw": mw.state_dict()})
            if handle:
                handle.remove()
            mw.remove()
            model = mlp(seed=5).to(torch.bfloat16)
            model.load_state_dict(ckpt["model"])
            opt = OPTS[name](model.parameters())
            opt.load_state_dict(ckpt["opt"])
            mw = CompressedMasterWeights(model, opt, bits=bits)  # bf16 parameters: zero corrections...
            mw.load_state_dict(ckpt["mw"])  # ... until the checkpoint's are loaded
            if release:
                handle = release_gradients(model, opt)
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
        nn.functional.cross_entropy(model(x.bfloat16()).float(), y).backward()
        if not release:
            opt.step()
            opt.zero_grad()
    return model, opt, mw


def assert_matches_reference(ours, ref, bits):
    model, opt, mw = ours
    master, ref_opt = ref
    for p, w in zip(model.parameters(), master):
        assert p.dtype == torch.bfloat16
        assert np.array_equal(bits_of(mw.master(p)), bits_of(w.detach()))  # the whole master, bit for bit
        assert torch.equal(p.detach(), split_master(w.detach(), bits)[0])
    sa, sb = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for pid in sa:
        for key, value in sa[pid].items():
            assert torch.equal(value, sb[pid][key]) if torch.is_tensor(value) else value == sb[pid][key]


@pytest.mark.parametrize("name", list(OPTS))
@pytest.mark.parametrize("bits", [16, 8])
def test_the_step_on_the_joined_master_equals_an_explicit_fp32_master(name, bits):
    ours = compressed(name, bits, steps=3)
    assert_matches_reference(ours, reference(name, bits, steps=3), bits)
    n = 64 * 128 + 128 + 2 * 128 + 128 * 4 + 4  # 9092 parameters
    assert ours[2].nbytes() == {"weights": 2 * n, "corrections": bits // 8 * n}


@pytest.mark.parametrize("bits", [16, 8])
def test_with_gradient_release_and_resume(bits):
    ref = reference("AdamW8bit", bits, steps=4)
    assert_matches_reference(compressed("AdamW8bit", bits, steps=4, release=True), ref, bits)
    assert_matches_reference(compressed("AdamW8bit", bits, steps=4, resume_at=2), ref, bits)


def test_the_16_bit_master_keeps_updates_that_bf16_and_the_24_bit_master_lose():
    """lr=1e-6 on weights of 1: far below half a bf16 ulp (2**-8) and below the 24-bit master's
    half-quantum (2**-16 at 1) too; only the exact master moves."""
    moved = {}
    for bits in (16, 8):
        p = nn.Parameter(torch.ones(4096))
        opt = torch.optim.SGD([p], lr=1e-6)
        mw = CompressedMasterWeights([p], opt, bits=bits)
        for _ in range(10):
            p.grad = torch.ones(4096, dtype=torch.bfloat16)
            opt.step()
        moved[bits] = float(mw.master(p)[0])
        assert bool((p.detach() == 1.0).all())  # the bf16 weight has not moved yet
    assert moved[16] == pytest.approx(1 - 1e-5, rel=1e-6) and moved[8] == 1.0


def test_wrapper_errors():
    model = mlp()
    with pytest.raises(ValueError, match="stochastic_rounding=False"):
        CompressedMasterWeights(model.to(torch.bfloat16),
                                AdamW8bit(model.parameters(), stochastic_rounding=True))
    model = mlp()
    opt = AdamW8bit(model.parameters())
    with pytest.raises(ValueError, match="bits must be 16"):
        CompressedMasterWeights(model, opt, bits=4)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        CompressedMasterWeights(model, object())
    with pytest.raises(ValueError, match="not in the optimizer"):
        CompressedMasterWeights([nn.Parameter(torch.zeros(2))], opt)
    mw = CompressedMasterWeights(model, opt, bits=16)
    with pytest.raises(ValueError, match="8-bit corrections"):
        mw.load_state_dict({"bits": 8, "corrections": []})
    with pytest.raises(ValueError, match="corrections"):
        mw.load_state_dict({"bits": 16, "corrections": []})
    with pytest.raises(ValueError, match="no compressed master"):
        mw.master(torch.zeros(3))


def test_a_step_that_raises_leaves_fp32_parameters_until_restore():
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mw = CompressedMasterWeights(model, opt, bits=16)
    masters = [mw.master(p) for p in model.parameters()]
    x, y = batches(1)[0]
    nn.functional.cross_entropy(model(x.bfloat16()).float(), y).backward()

    def failing(optimizer, args, kwargs):
        raise RuntimeError("a failing step")

    hook = opt.register_step_pre_hook(failing)  # after the wrapper's: the masters are joined when it raises
    with pytest.raises(RuntimeError, match="a failing step"):
        opt.step()  # the pre-hook joined the masters; the post-hook never ran
    hook.remove()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(np.array_equal(bits_of(p.detach()), bits_of(m)) for p, m in zip(model.parameters(), masters))
    mw.restore()
    assert all(p.dtype == torch.bfloat16 and p.grad.dtype == torch.bfloat16 for p in model.parameters())
    assert all(np.array_equal(bits_of(mw.master(p)), bits_of(m)) for p, m in zip(model.parameters(), masters))
    opt.step()  # and stepping works again
    assert not np.array_equal(bits_of(mw.master(model[0].weight)), bits_of(masters[0]))


@pytest.mark.parametrize("name", ["AdamW8bit", "torch.AdamW"])
@pytest.mark.parametrize("bits", [16, 8])
def test_a_step_with_a_closure_steps_the_fp32_master(name, bits):
    """opt.step(closure): the closure runs on the bf16 weights (the model's forward and backward), its loss
    is returned, and the step is on the joined fp32 master: the explicit fp32 master's bits (it used to step
    the bf16 weight and keep the old correction: 1.9e-3 off after an update of 1e-3)."""
    model = mlp()
    opt = OPTS[name](model.parameters())
    mw = CompressedMasterWeights(model, opt, bits=bits)
    for i, (x, y) in enumerate(batches(3)):
        seen = []

        def closure():
            assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # the model computes in bf16
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x.bfloat16()).float(), y)
            loss.backward()
            seen.append(loss)
            return loss

        loss = opt.step(closure) if i % 2 else opt.step(closure=closure)  # positional or keyword
        assert loss is seen[0] and len(seen) == 1
        assert all(p.dtype == torch.bfloat16 and p.grad.dtype == torch.bfloat16 for p in model.parameters())
    assert_matches_reference((model, opt, mw), reference(name, bits, steps=3), bits)


def test_a_closure_called_twice_and_a_closure_that_raises():
    """An optimizer that evaluates the closure more than once (as L-BFGS does) gets the bf16 forward each time;
    a closure that raises leaves the bf16 weights, their gradients and the masters as they were."""
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mw = CompressedMasterWeights(model, opt, bits=16)
    x = torch.randn(4, 8)
    model(x.bfloat16()).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    masters = [mw.master(p) for p in model.parameters()]

    def failing():
        raise RuntimeError("a failing closure")

    with pytest.raises(RuntimeError, match="a failing closure"):
        opt.step(failing)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    assert all(np.array_equal(bits_of(mw.master(p)), bits_of(m)) for p, m in zip(model.parameters(), masters))

    class Twice(torch.optim.SGD):
        """Evaluates the closure twice, as L-BFGS may."""
        def step(self, closure=None):
            closure()
            return super().step(closure)

    results = []
    for twice in (False, True):
        torch.manual_seed(0)
        model = nn.Linear(8, 2)
        opt = (Twice if twice else torch.optim.SGD)(model.parameters(), lr=1e-3)
        mw = CompressedMasterWeights(model, opt, bits=16)
        calls = []

        def closure():
            calls.append({p.dtype for p in model.parameters()})
            opt.zero_grad()
            loss = model(x.bfloat16()).float().square().sum()
            loss.backward()
            return loss

        for _ in range(2):
            if twice:
                opt.step(closure)
            else:
                closure()
                opt.step()
        assert calls == [{torch.bfloat16}] * (4 if twice else 2)
        results.append([mw.master(p) for p in model.parameters()])
    assert all(np.array_equal(bits_of(a), bits_of(b)) for a, b in zip(*results))


def test_exported_from_the_package():
    import adam8lib
    from adam8lib import master_weights

    assert adam8lib.CompressedMasterWeights is master_weights.CompressedMasterWeights
    assert adam8lib.split_master is split_master and adam8lib.join_master is join_master
    assert {"CompressedMasterWeights", "split_master", "join_master"} <= set(adam8lib.__all__)


@pytest.mark.parametrize("bits", [16, 8])
def test_split_and_join_work_in_chunks_their_temporaries_stay_small(bits):
    """Measured with the MemoryTracker: splitting and joining 2**22 elements needs their outputs plus
    about one chunk's int64 temporaries (a whole-tensor int64 version needed 58 bytes per element)."""
    from adam8lib.master_weights import CHUNK
    from adam8lib.memory_tracker import MemoryTracker

    n = 1 << 22
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    with MemoryTracker([]) as tracker:
        hi, lo = split_master(x, bits)
        back = join_master(hi, lo)
    outputs = hi.nbytes + lo.nbytes + back.nbytes
    assert outputs == (2 + bits // 8 + 4) * n
    assert outputs < tracker.peak().total <= outputs + 80 * CHUNK < 20 * n
    assert np.array_equal(bits_of(back), bits_of(master_rounding(x, bits)))
    out = (torch.empty(n, dtype=torch.bfloat16), torch.empty(n, dtype=lo.dtype))
    assert split_master(x, bits, out=out)[0] is out[0] and torch.equal(out[0], hi) and torch.equal(out[1], lo)
    with pytest.raises(ValueError, match="out.1. must be a contiguous"):
        split_master(x, bits, out=(out[0], torch.empty(n, dtype=torch.int32)))
    with pytest.raises(ValueError, match="out must be a contiguous torch.float32"):
        join_master(hi, lo, out=torch.empty(n - 1))


# ---------------------------------------------------------------------- the core steps the masters in chunks
def _adopted_run(cls, adopt: bool, bits: int, release: bool = False, steps: int = 3):
    from adam8lib import release_gradients

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(770, 300), torch.nn.Linear(300, 5))
    opt = cls(model.parameters(), lr=1e-2, weight_decay=0.1)
    if not adopt:  # the hooks' whole-tensor join and split, as for any optimizer
        opt.adopt_master_weights = lambda masters: False
    masters = CompressedMasterWeights(model, opt, bits=bits)
    handle = release_gradients(model, opt) if release else None
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(4, 770, generator=gen).to(torch.bfloat16)
        model(x).float().pow(2).mean().backward()
        if not release:
            opt.step()
            opt.zero_grad(set_to_none=True)
    if handle is not None:
        handle.remove()
    return ([masters.master(p) for p in model.parameters()],
            [{k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)} for p in model.parameters()])


@pytest.mark.parametrize("release", [False, True], ids=["step", "release"])
@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("cls", [AdamW8bit, AdamW4bit], ids=lambda c: c.__name__)
def test_the_core_steps_adopted_masters_in_chunks_with_the_same_bits(cls, bits, release, monkeypatch):
    from adam8lib import rank1_chunks

    calls = []
    real = rank1_chunks.step_in_row_chunks
    monkeypatch.setattr(rank1_chunks, "step_in_row_chunks", lambda *a, **k: (calls.append(1), real(*a, **k)))
    chunked, chunked_state = _adopted_run(cls, True, bits, release)
    whole, whole_state = _adopted_run(cls, False, bits, release)
    assert bool(calls) == (cls is AdamW4bit)  # the rank-1 v of the 300 x 770 weight: two passes over rows
    for a, b in zip(chunked, whole):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    for s, t in zip(chunked_state, whole_state):
        assert s.keys() == t.keys() and all(torch.equal(s[k], t[k]) for k in s)


def test_adopted_masters_keep_a_step_s_temporaries_to_a_chunk():
    from adam8lib import MemoryTracker

    def transient(adopt: bool) -> int:
        p = torch.nn.Parameter(torch.randn(2048, 768))
        opt = AdamW4bit([p], lr=1e-3)
        if not adopt:
            opt.adopt_master_weights = lambda masters: False
        CompressedMasterWeights([p], opt, bits=8)
        p.grad = torch.randn(p.shape).to(torch.bfloat16)
        opt.step()
        p.grad = torch.randn(p.shape).to(torch.bfloat16)
        tracker = MemoryTracker([p], opt)
        with tracker:
            with tracker.phase("step"):
                opt.step()
        return tracker.peak("step", categories=["transient"]).sum(["transient"])

    n = 2048 * 768
    assert transient(False) >= 8 * n  # an fp32 master and an fp32 gradient of the whole matrix
    assert transient(True) < n  # a chunk's: under a byte per element here (measured in the note of issue 54)


def test_removing_the_masters_gives_the_step_back_to_the_optimizer():
    p = torch.nn.Parameter(torch.randn(64, 64))
    opt = AdamW8bit([p], lr=1e-3)
    masters = CompressedMasterWeights([p], opt, bits=16)
    assert opt.__dict__.get("_compressed_masters") is masters
    masters.remove()
    assert opt.__dict__.get("_compressed_masters") is None
