"""torch.optim conventions, run against every optimizer class and every CPU-usable backend.

Each test puts ``Adam8bit``/``AdamW8bit`` (and ``Adam4bit``/``AdamW4bit``/``AdamWFp8``) through one convention torch's own optimizers follow
(zero_grad modes, schedulers incl. OneCycleLR cycling betas, closures, GradScaler, hooks,
torch.compile, deepcopy/pickle/torch.save, weights_only checkpoints) and checks the result
against a reference: torch.optim.AdamW on the same data, or the same optimizer run plainly.

The optimizer family of issue 35 (``Lion``, ``Lion8bit``, ``Lion4bit``, ``AdEMAMix8bit``, ``RMSprop8bit``,
``Adagrad8bit``, ``SGD8bit``, ``Muon8bit``) goes through the same tests on its reference step; its twin is
the same class with fp32 states (``state_format="fp32"``) instead of torch.optim.AdamW.

Backends: ``torch`` (reference), ``cpu`` (C++ kernel, when it builds here) and ``triton`` in
the interpreter (TRITON_INTERPRET=1, set by conftest.py without a GPU) on a small model.
"""

import copy
import inspect
import io
import pickle

import pytest
import torch
from torch import nn

from adam8lib import (AdEMAMix8bit, Adagrad8bit, Adam4bit, Adam8bit, AdamW4bit, AdamW8bit, AdamWFp8, Adan8bit, Lion,
                      Lion4bit, Lion8bit, Muon8bit, RMSprop8bit, SGD8bit, kernels)
from adam8lib.optim import LowBitAdam
from adam8lib.quantized_state import QuantizedStateOptimizer

CLASSES = [Adam8bit, AdamW8bit]
#: The other state formats run the reference step only (lesson 12): the same conventions, backend "torch".
OTHER_FORMATS = [Adam4bit, AdamW4bit, AdamWFp8]
#: The family on the update-rule core: the reference step ("torch") and "auto" (the fused cpu steps of the
#: elementwise rules' 8-bit states, the reference step for the rest).
FAMILY = [Lion, Lion8bit, Lion4bit, AdEMAMix8bit, RMSprop8bit, Adagrad8bit, SGD8bit, Muon8bit, Adan8bit]


def _cpu_backends():
    names = ["torch"]
    if "cpu" in kernels.available_backends("cpu"):
        names.append("cpu")
    if "triton" in kernels.available_backends("cpu"):  # the interpreter
        names.append("triton")
    return names


BACKENDS = _cpu_backends()


@pytest.fixture(params=[(c, b) for c in CLASSES for b in BACKENDS] + [(c, "torch") for c in OTHER_FORMATS + FAMILY]
                + [(c, "auto") for c in FAMILY],
                ids=lambda cb: f"{cb[0].__name__}-{cb[1]}")
def make_opt(request):
    cls, backend = request.param

    def make(params, **kwargs):
        return cls(params, backend=backend, min_8bit_size=512, **kwargs)

    make.cls, make.backend = cls, backend
    return make


def small_model(seed=0):
    """One weight with 8-bit states (16*32 = 512 elements, two blocks; ``make_opt`` sets
    ``min_8bit_size=512``) and three with fp32 states."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def data(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 16, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(n)]


def loss_fn(model, x, y):
    return nn.functional.cross_entropy(model(x), y)


def train(model, opt, batches, sched=None):
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model, x, y).backward()
        opt.step()
        if sched is not None:
            sched.step()


def twin_adamw(model, make_opt, **kwargs):
    """torch.optim.AdamW with the same hyperparameters as ``make_opt`` would use (for the family: the
    same class with fp32 states)."""
    if issubclass(make_opt.cls, QuantizedStateOptimizer) and not issubclass(make_opt.cls, LowBitAdam):
        return make_opt.cls(model.parameters(), state_format="fp32", **kwargs)
    wd = inspect.signature(make_opt.cls.__init__).parameters["weight_decay"].default
    return torch.optim.AdamW(model.parameters(), weight_decay=kwargs.pop("weight_decay", wd), **kwargs)


#: How far a parameter may drift from torch.optim.AdamW's, as a fraction of how far AdamW moved it:
#: 8-bit states stay within ~1 % of the update (5 % allowed); 4-bit codes are 16 times coarser.
TRACK_RTOL = {"8bit": 0.05, "fp8": 0.1, "4bit": 0.3, "fp32": 0.0}
#: Muon8bit on this 512-element matrix: Newton-Schulz (in bf16) of a momentum that differs by its 8-bit
#: rounding lands 5-11 % (measured) of the distance travelled away from the fp32-state twin.
TRACK_RTOL_MUON8BIT = 0.2


def assert_tracks(ours, ref, start, rtol=None, opt=None):
    """Each parameter's distance from ``ref`` is a small fraction of how far ``ref`` moved
    (8-bit states: ~1 % of the update; fp32-state tensors much closer)."""
    if rtol is None and isinstance(opt, QuantizedStateOptimizer):
        rtol = TRACK_RTOL_MUON8BIT if isinstance(opt, Muon8bit) and opt.format else TRACK_RTOL[opt.format_name()]
    rtol = rtol if rtol is not None else TRACK_RTOL[opt.format.name if opt is not None else "8bit"]
    for p, q, s in zip(ours.parameters(), ref.parameters(), start.parameters()):
        moved = (q - s).norm()
        assert moved > 0
        assert (p - q).norm() <= rtol * moved, ((p - q).norm() / moved).item()


def assert_same(a, b):
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def assert_same_state(o1, o2):
    for s1, s2 in zip(o1.state.values(), o2.state.values()):
        assert s1.keys() == s2.keys()
        for k in s1:
            assert torch.equal(s1[k], s2[k]) if torch.is_tensor(s1[k]) else s1[k] == s2[k]


# ------------------------------------------------------------------ zero_grad
def test_zero_grad_set_to_none_skips_parameters_like_torch(make_opt):
    model = small_model()
    opt = make_opt(model.parameters(), lr=1e-2)
    train(model, opt, data(2))
    before = copy.deepcopy(model)
    state_before = copy.deepcopy(opt.state_dict())
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())
    opt.step()  # no gradients: nothing moves, no state changes (torch.optim skips them too)
    assert_same(model, before)
    assert [s["step"] for s in opt.state_dict()["state"].values()] == [2, 2, 2, 2]
    assert all(torch.equal(a, b) for k in state_before["state"] for a, b in
               zip(state_before["state"][k].values(), opt.state_dict()["state"][k].values()) if torch.is_tensor(a))


def test_zero_grad_set_to_zero_keeps_momentum_like_torch(make_opt):
    model, ref = small_model(), small_model()
    start = copy.deepcopy(model)
    opt, ref_opt = make_opt(model.parameters(), lr=1e-2), twin_adamw(ref, make_opt, lr=1e-2)
    for o, m in ((opt, model), (ref_opt, ref)):
        train(m, o, data(3))
        o.zero_grad(set_to_none=False)
        assert all(p.grad is not None and not p.grad.any() for p in m.parameters())
        o.step()  # zero gradients: the momentum still moves the parameters
    assert_tracks(model, ref, start, opt=opt)
    assert all(s["step"] == 4 for s in opt.state.values())


# ------------------------------------------------------------------ schedulers
def test_lr_schedulers_drive_the_learning_rate_like_torch(make_opt):
    model, ref = small_model(), small_model()
    start = copy.deepcopy(model)
    opt, ref_opt = make_opt(model.parameters(), lr=1e-2), twin_adamw(ref, make_opt, lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.1)
    train(model, opt, data(5), sched)
    train(ref, ref_opt, data(5), ref_sched)
    assert opt.param_groups[0]["lr"] == pytest.approx(ref_opt.param_groups[0]["lr"]) == pytest.approx(1e-4)
    assert_tracks(model, ref, start, opt=opt)


def test_one_cycle_lr_cycles_beta1_like_torch(make_opt):
    model, ref = small_model(), small_model()
    start = copy.deepcopy(model)
    opt, ref_opt = make_opt(model.parameters(), lr=1e-2), twin_adamw(ref, make_opt, lr=1e-2)
    key = "betas" if "betas" in opt.defaults else "momentum"
    if key not in opt.defaults:
        pytest.skip(f"{make_opt.cls.__name__} has no momentum for OneCycleLR to cycle")
    kw = dict(max_lr=1e-2, total_steps=8, cycle_momentum=True, base_momentum=0.8, max_momentum=0.95)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, **kw)
    ref_sched = torch.optim.lr_scheduler.OneCycleLR(ref_opt, **kw)
    beta1s = []
    for batch in data(7):
        train(model, opt, [batch], sched)
        train(ref, ref_opt, [batch], ref_sched)
        assert opt.param_groups[0][key] == pytest.approx(ref_opt.param_groups[0][key])
        assert opt.param_groups[0]["lr"] == pytest.approx(ref_opt.param_groups[0]["lr"])
        beta1s.append(opt.param_groups[0]["betas"][0] if key == "betas" else opt.param_groups[0][key])
    assert min(beta1s) < 0.85 < max(beta1s)  # beta1 really cycled
    assert_tracks(model, ref, start, opt=opt)


# ------------------------------------------------------------------ closures
def test_closure_is_called_once_and_its_loss_returned(make_opt):
    model, ref = small_model(), small_model()
    start = copy.deepcopy(model)
    opt, ref_opt = make_opt(model.parameters(), lr=1e-2), twin_adamw(ref, make_opt, lr=1e-2)
    for x, y in data(4):
        for m, o in ((model, opt), (ref, ref_opt)):
            calls = []

            def closure():
                calls.append(1)
                o.zero_grad()
                loss = loss_fn(m, x, y)
                loss.backward()
                return loss

            loss = o.step(closure)
            assert len(calls) == 1 and loss.item() == pytest.approx(loss_fn(start, x, y).item(), abs=10)
    assert_tracks(model, ref, start, opt=opt)


# ------------------------------------------------------------------ GradScaler
def test_grad_scaler_unscales_exactly_and_skips_overflowing_steps(make_opt):
    plain, scaled = small_model(), small_model()
    opt_plain, opt_scaled = make_opt(plain.parameters(), lr=1e-2), make_opt(scaled.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=1000)
    for x, y in data(3):
        train(plain, opt_plain, [(x, y)])
        opt_scaled.zero_grad()
        scaler.scale(loss_fn(scaled, x, y)).backward()
        scaler.step(opt_scaled)
        scaler.update()
    assert_same(plain, scaled)  # a power-of-two scale unscales exactly: identical steps
    assert_same_state(opt_plain, opt_scaled)
    # an overflowing gradient: the scaler skips the step and halves the scale
    before, state_before = copy.deepcopy(scaled), copy.deepcopy(opt_scaled.state_dict())
    x, y = data(1, seed=5)[0]
    opt_scaled.zero_grad()
    scaler.scale(loss_fn(scaled, x, y) * float("inf")).backward()
    scaler.step(opt_scaled)
    scaler.update()
    assert scaler.get_scale() == 2.0**11
    assert_same(scaled, before)
    assert [s["step"] for s in opt_scaled.state_dict()["state"].values()] == \
        [s["step"] for s in state_before["state"].values()]


# ------------------------------------------------------------------ hooks
def test_step_and_state_dict_hooks_run(make_opt):
    model = small_model()
    opt = make_opt(model.parameters(), lr=1e-2)
    seen = []
    opt.register_step_pre_hook(lambda o, args, kwargs: seen.append(("pre", len(o.state))))
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append(("post", len(o.state))))
    opt.register_state_dict_post_hook(lambda o, sd: {**sd, "extra": 1})
    train(model, opt, data(1))
    assert seen == [("pre", 0), ("post", 4)]
    assert opt.state_dict()["extra"] == 1


def test_load_state_dict_hooks_see_the_real_state(make_opt):
    model = small_model()
    opt = make_opt(model.parameters(), lr=1e-2)
    train(model, opt, data(2))
    ckpt = opt.state_dict()
    fresh = make_opt(small_model().parameters(), lr=1e-2)
    seen = {}

    def pre(o, sd):
        seen["pre"] = (len(sd["state"]), len(o.state))
        sd["param_groups"] = [{**g, "lr": 5e-3} for g in sd["param_groups"]]  # an edit that must stick

    def post(o):
        seen["post"] = (len(o.state), o.param_groups[0]["lr"], next(iter(o.state.values()))["step"])

    fresh.register_load_state_dict_pre_hook(pre)
    fresh.register_load_state_dict_post_hook(post)
    fresh.load_state_dict(ckpt)
    assert seen == {"pre": (4, 0), "post": (4, 5e-3, 2)}
    assert ckpt["param_groups"][0]["lr"] == 1e-2  # the caller's checkpoint is not edited

    def replace(o, sd):  # a pre-hook may also return a new checkpoint
        return {**sd, "param_groups": [{**g, "lr": 7e-3} for g in sd["param_groups"]]}

    fresh.register_load_state_dict_pre_hook(replace, prepend=True)
    fresh.load_state_dict(ckpt)
    assert fresh.param_groups[0]["lr"] == 5e-3  # `pre` ran after `replace` and set its own value
    assert seen["pre"] == (4, 4)


# ------------------------------------------------------------------ torch.compile
def step_fn(model, opt):
    """One training step (forward, backward, optimizer step, zero_grad) as a function to compile."""
    def train_step(x, y):
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return train_step


def compiled_vs_eager(make_opt, steps, compile_backend):
    eager, comp = small_model(), small_model()
    opt_e = make_opt(eager.parameters(), lr=1e-2, weight_decay=0.1)
    opt_c = make_opt(comp.parameters(), lr=1e-2, weight_decay=0.1)

    f_eager = step_fn(eager, opt_e)
    f_comp = torch.compile(step_fn(comp, opt_c), backend=compile_backend)
    for x, y in data(steps):
        assert f_eager(x, y).item() == f_comp(x, y).item()
    return eager, comp, opt_e, opt_c


def test_compiled_training_steps_equal_eager(make_opt):
    """A compiled training step (forward, backward, opt.step) gives the eager result, bit for bit.

    Dynamo's capture (backend "eager") is what broke the cpu backend before: its Python-side
    tensors were traced away before the C kernel read them (8191 of 8192 elements wrong after 3
    steps). Each parameter's update now runs eagerly (a graph break)."""
    steps = 5 if make_opt.backend == "triton" else 20
    eager, comp, opt_e, opt_c = compiled_vs_eager(make_opt, steps, "eager")
    assert_same(eager, comp)
    assert_same_state(opt_e, opt_c)


def test_compiled_opt_step_with_inductor_equals_eager(make_opt):
    torch._dynamo.reset()
    a, b = small_model(), small_model()
    opt_a, opt_b = make_opt(a.parameters(), lr=1e-2), make_opt(b.parameters(), lr=1e-2)
    compiled_step = torch.compile(opt_b.step)  # default backend (inductor)
    for x, y in data(3):
        for m, step in ((a, opt_a.step), (b, compiled_step)):
            m.zero_grad()
            loss_fn(m, x, y).backward()
            step()
    assert_same(a, b)
    assert_same_state(opt_a, opt_b)


# ------------------------------------------------------------------ copies and checkpoints
@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_copies_step_identically(make_opt, how):
    model = small_model()
    opt = make_opt(model.parameters(), lr=1e-2)
    train(model, opt, data(2))
    if how == "deepcopy":
        model2, opt2 = copy.deepcopy((model, opt))
    elif how == "pickle":
        model2, opt2 = pickle.loads(pickle.dumps((model, opt)))
    else:
        buffer = io.BytesIO()
        torch.save((model, opt), buffer)
        buffer.seek(0)
        model2, opt2 = torch.load(buffer, weights_only=False)
    assert type(opt2) is type(opt) and opt2.backend == opt.backend
    if hasattr(opt, "qmap1"):
        assert torch.equal(opt2.qmap1, opt.qmap1) and torch.equal(opt2.qmap2, opt.qmap2)
    else:
        assert opt2.format == opt.format and opt2.min_8bit_size == opt.min_8bit_size
    assert opt2.defaults == opt.defaults
    later = data(3, seed=7)
    train(model, opt, later)
    train(model2, opt2, later)
    assert_same(model, model2)
    assert_same_state(opt, opt2)


def test_weights_only_checkpoint_resumes_bit_identically(make_opt):
    model = small_model()
    opt = make_opt(model.parameters(), lr=1e-2)
    train(model, opt, data(2))
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    buffer.seek(0)
    ckpt = torch.load(buffer, weights_only=True)
    model2 = small_model(seed=3)
    model2.load_state_dict(ckpt["model"])
    opt2 = make_opt(model2.parameters(), lr=1.0)
    opt2.load_state_dict(ckpt["opt"])
    later = data(3, seed=7)
    train(model, opt, later)
    train(model2, opt2, later)
    assert_same(model, model2)
    assert_same_state(opt, opt2)


@pytest.mark.slow
def test_issue_repro_inductor_compiled_training_tracks_eager():
    """The issue's reproduction with the default compiler (inductor), default backend: 20 steps
    of a compiled training step stay within float rounding of eager (inductor's fused forward
    and backward round differently, and 8-bit codes can flip on such differences, so not
    bit-identical). Before the fix the parameters did not move and the loss became NaN."""
    torch._dynamo.reset()
    eager, comp = small_model(), small_model()
    start = copy.deepcopy(eager)
    opt_e = AdamW8bit(eager.parameters(), lr=1e-2, weight_decay=0.1, min_8bit_size=512)
    opt_c = AdamW8bit(comp.parameters(), lr=1e-2, weight_decay=0.1, min_8bit_size=512)

    f_eager, f_comp = step_fn(eager, opt_e), torch.compile(step_fn(comp, opt_c))
    for x, y in data(20):
        le, lc = f_eager(x, y).item(), f_comp(x, y).item()
        assert abs(le - lc) <= 1e-4 * abs(le), (le, lc)
    assert all(torch.isfinite(p).all() for p in comp.parameters())
    assert_tracks(comp, eager, start, rtol=0.01)
