"""adam8lib.kernels: one dispatch point, backend choice and errors."""

import copy

import pytest
import torch

from adam8lib import kernels
from adam8lib.kernels import reference


def test_torch_backend_always_available_and_auto_resolves():
    assert "torch" in kernels.available_backends("cpu")
    assert kernels.get_backend("torch", "cpu").step is reference.adam8bit_step
    auto = kernels.get_backend("auto", "cpu")
    assert auto.name in kernels.available_backends("cpu") and auto.name != "triton"  # never the interpreter


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="Unknown or unavailable backend 'nope'"):
        kernels.get_backend("nope", "cpu")


def test_registered_backend_is_used_by_the_optimizer():
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs["blocksize"])
        reference.adam8bit_step(*args, **kwargs)

    kernels.register_backend("spy", spy, lambda device: device.type == "cpu")
    try:
        from adam8lib import Adam8bit

        p = torch.nn.Parameter(torch.randn(5000))
        opt = Adam8bit([p], backend="spy", blocksize=512)
        p.grad = torch.randn(5000)
        opt.step()
        assert calls == [512]
        with pytest.raises(ValueError, match="cannot run on device meta"):
            kernels.get_backend("spy", "meta")
    finally:
        kernels._BACKENDS.pop("spy")


@pytest.mark.parametrize("chunk_size", [256, 1024, 1 << 16])
def test_reference_result_does_not_depend_on_chunk_size(chunk_size):
    from adam8lib.quant import dynamic_map

    n = 10_003
    outs = []
    for cs in (chunk_size, 1 << 20):
        torch.manual_seed(0)
        p = torch.randn(n)
        s1, s2 = torch.full((n,), 127, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)
        a1, a2 = torch.zeros(40), torch.zeros(40)
        for step in (1, 2):
            g = torch.randn(n)
            reference.adam8bit_step(p, g, s1, s2, a1, a2, dynamic_map(True), dynamic_map(False), step=step,
                                    lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01,
                                    blocksize=256, chunk_size=cs)
        outs.append((p, s1, s2, a1, a2))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


# ------------------------------------------------------------------ the argument contract, every backend
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

from torch import nn  # noqa: E402

from adam8lib import Adam8bit, AdamW8bit  # noqa: E402
from adam8lib.kernels.contract import check_step_args  # noqa: E402
from adam8lib.quant import dynamic_map  # noqa: E402

HYPER = dict(step=1, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, blocksize=256)
CPU_BACKENDS = ["torch"] + [b for b in ("cpu", "triton") if b in kernels.available_backends("cpu")]


def step_args(n=1000):
    torch.manual_seed(0)
    return dict(p=torch.randn(n), g=torch.randn(n), state1=torch.full((n,), 127, dtype=torch.uint8),
                state2=torch.zeros(n, dtype=torch.uint8), absmax1=torch.zeros(4), absmax2=torch.zeros(4),
                qmap1=dynamic_map(True), qmap2=dynamic_map(False))


class Marked(torch.Tensor):
    """A do-nothing tensor subclass (what a library's wrapper tensor looks like to us)."""


BAD_ARGS = {
    "not a tensor": (lambda a: a.update(g=a["g"].tolist()), TypeError, "g must be a torch.Tensor"),
    "meta tensor": (lambda a: a.update(state2=a["state2"].to("meta")), ValueError, "state2 is a meta tensor"),
    "subclass": (lambda a: a.update(p=a["p"].as_subclass(Marked)), TypeError, "p is a tensor subclass"),
    "sparse": (lambda a: a.update(g=a["g"].to_sparse()), TypeError, "g has layout torch.sparse_coo"),
    "strided view": (lambda a: a.update(p=torch.randn(2000)[::2]), ValueError, "p must be a flat contiguous"),
    "2-D": (lambda a: a.update(state1=a["state1"].view(10, 100)), ValueError, "state1 must be a flat contiguous"),
    "fp64 param": (lambda a: a.update(p=a["p"].double()), TypeError, "p must be fp32, bf16 or fp16"),
    "int grad": (lambda a: a.update(g=a["g"].int()), TypeError, "g must be a floating-point"),
    "short grad": (lambda a: a.update(g=a["g"][:999]), ValueError, "g must have 1000 elements"),
    "float codes": (lambda a: a.update(state1=a["state1"].float()), TypeError, "state1 must be torch.uint8"),
    "absmax count": (lambda a: a.update(absmax2=torch.zeros(5)), ValueError, r"absmax2 must have 4 elements"),
    "fp16 absmax": (lambda a: a.update(absmax1=a["absmax1"].half()), TypeError, "absmax1 must be torch.float32"),
    "short map": (lambda a: a.update(qmap2=a["qmap2"][:255]), ValueError, "qmap2 must have 256"),
}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("case", list(BAD_ARGS))
def test_every_backend_rejects_bad_arguments_and_changes_nothing(backend, case):
    args = step_args()
    edit, error, message = BAD_ARGS[case]
    edit(args)
    before = {k: (v.clone() if isinstance(v, torch.Tensor) and v.device.type != "meta" and not v.is_sparse else v)
              for k, v in args.items()}
    with pytest.raises(error, match=message):
        kernels.adam8bit_step(**args, **HYPER, backend=backend)
    for k, v in args.items():
        if isinstance(v, torch.Tensor) and v.device.type != "meta" and not v.is_sparse:
            assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("hyper, message", [
    (dict(step=0), "step must be an int >= 1"), (dict(step=1.0), "step must be an int"),
    (dict(blocksize=100), "Unsupported blocksize"),
])
def test_contract_checks_step_and_blocksize(hyper, message):
    with pytest.raises(ValueError, match=message):
        check_step_args(*step_args().values(), **{"blocksize": 256, "step": 1, **hyper})


def test_reference_checks_the_contract_when_called_directly():
    args = step_args()
    args["p"] = args["p"][None]
    with pytest.raises(ValueError, match="p must be a flat contiguous"):
        reference.adam8bit_step(*args.values(), **HYPER)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_the_dispatcher_checks_once_and_a_direct_backend_call_still_checks(backend, monkeypatch):
    """Through the dispatcher each tensor is checked once (the backend's own check of the same
    objects is skipped while the dispatcher calls it); called directly, before and after, the
    backend checks everything itself, and a failing call leaves nothing behind."""
    from adam8lib.kernels import contract

    calls = []  # one entry per full check (the check of the blocksize is part of it, and only of it)
    real = contract.check_blocksize
    monkeypatch.setattr(contract, "check_blocksize", lambda b: (calls.append(b), real(b)))
    step = kernels.get_backend(backend, "cpu").step
    args = step_args()
    kernels.adam8bit_step(**args, **HYPER, backend=backend)
    assert len(calls) == 1, calls  # the dispatcher's, not again in the backend
    calls.clear()
    step(**args, **HYPER)
    assert len(calls) == 1, calls  # called directly: its own full check
    bad = {**args, "absmax1": torch.zeros(3)}
    with pytest.raises(ValueError, match="absmax1 must have 4"):
        step(**bad, **HYPER)
    with pytest.raises(ValueError, match="step must be an int >= 1"):
        kernels.adam8bit_step(**args, **{**HYPER, "step": 0}, backend=backend)
    # a backend that fails while the dispatcher calls it: afterwards the same objects are checked in full
    monkeypatch.setattr(kernels, "get_backend", lambda name, device: kernels.Backend("boom", _raise, lambda d: True))
    with pytest.raises(RuntimeError, match="boom"):
        kernels.adam8bit_step(**args, **HYPER, backend=backend)
    calls.clear()
    check_step_args(*args.values(), blocksize=256)
    assert len(calls) == 1, calls


def _raise(*args, **kwargs):
    raise RuntimeError("boom")


def test_tensors_passed_by_name_are_checked_too():
    args = step_args()
    args["absmax1"] = torch.zeros(3)
    with pytest.raises(ValueError, match="absmax1 must have 4"):
        kernels.adam8bit_step(args.pop("p"), **args, **HYPER)


# ------------------------------------------------------------------ the optimizer: a clear error, never a crash
def test_meta_and_subclass_parameters_raise_before_anything_changes():
    good = nn.Parameter(torch.randn(5000))
    meta = nn.Parameter(torch.randn(5000, device="meta"))
    opt = Adam8bit([good, meta])
    good.grad, meta.grad = torch.randn(5000), torch.randn(5000, device="meta")
    before = good.detach().clone()
    with pytest.raises(ValueError, match=r"parameter 1 of group 0 \(shape \(5000,\)\) is a meta tensor"):
        opt.step()
    assert torch.equal(good, before) and not opt.state
    sub = torch.randn(64, 80).as_subclass(Marked).requires_grad_()
    opt = AdamW8bit([sub])
    sub.grad = torch.randn(64, 80)
    with pytest.raises(TypeError, match="is a tensor subclass"):
        opt.step()
    assert not opt.state


def test_non_contiguous_views_as_parameters_and_gradients_are_updated_correctly():
    torch.manual_seed(0)
    base = torch.randn(128, 96)
    view = nn.Parameter(base.t())  # non-contiguous parameter (a transposed view)
    copy = nn.Parameter(base.t().contiguous())
    o1, o2 = Adam8bit([view], lr=1e-2, backend="torch"), Adam8bit([copy], lr=1e-2, backend="torch")
    for _ in range(3):
        g = torch.randn(128, 96)
        view.grad, copy.grad = g.t(), g.t().contiguous()  # non-contiguous gradient too
        o1.step()
        o2.step()
    assert not view.is_contiguous() and torch.equal(view, copy)


FSDP_SCRIPT = textwrap.dedent(
    """
    import os, socket, torch, torch.distributed as dist
    from torch import nn
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, distribute_tensor
    from adam8lib import AdamW8bit, kernels
    from adam8lib.quant import dynamic_map
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (1,))
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))  # the issue's reproduction
    fully_shard(model, mesh=mesh)
    opt = AdamW8bit(model.parameters())  # default backend: this step used to die with SIGSEGV
    before = [p.to_local().clone() for p in model.parameters()]
    model(torch.randn(4, 64)).square().mean().backward()
    opt.step()  # the optimizer steps each DTensor's local shard (issue 14)
    print("all changed:", all(not torch.equal(p.to_local(), b) for p, b in zip(model.parameters(), before)),
          len(opt.state))
    n = 5000
    p = distribute_tensor(torch.randn(n), mesh, [Replicate()])
    args = [p, torch.randn(n), torch.full((n,), 127, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8),
            torch.zeros(20), torch.zeros(20), dynamic_map(True), dynamic_map(False)]
    for backend in kernels.available_backends("cpu"):
        try:
            kernels.adam8bit_step(*args, step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                                  blocksize=256, backend=backend)
        except TypeError as exc:
            print(f"backend {backend}:", exc)
    from adam8lib.distributed import end_rank
    end_rank()  # not the interpreter teardown, which can abort a gloo process
    """
)


def test_fsdp2_optimizer_steps_and_raw_kernels_refuse_dtensors():
    """Issue 14's reproduction (fully_shard, default backend), in a subprocess: a crash would
    show as a negative return code. The optimizer steps the local shards; a raw kernel call
    with a DTensor raises a TypeError that says what to pass instead. One gloo process is enough to make DTensor parameters."""
    pytest.importorskip("torch.distributed.fsdp")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = subprocess.run([sys.executable, "-c", FSDP_SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    lines = out.stdout.splitlines()
    assert "all changed: True 4" in lines, lines
    for backend in kernels.available_backends("cpu"):
        assert any(line.startswith(f"backend {backend}: p is a DTensor") for line in lines), (backend, lines)


# ------------------------------------------------------------------ unavailable backends say why
def test_a_backend_that_failed_to_import_says_why(monkeypatch):
    monkeypatch.setattr(kernels, "_loaded_optional", False)
    monkeypatch.setattr(kernels, "_OPTIONAL_MODULES", {"fancy": "adam8lib.kernels.no_such_module"})
    monkeypatch.setattr(kernels, "_IMPORT_ERRORS", {})
    monkeypatch.setattr(kernels, "AUTO_ORDER", ("fancy", "torch"))
    assert kernels.unavailable_reason("fancy").startswith("ModuleNotFoundError: No module named 'adam8lib.kernels.no_such")
    with pytest.raises(ValueError, match=r"Unknown or unavailable backend 'fancy' \(ModuleNotFoundError: No module"):
        kernels.get_backend("fancy", "cpu")
    with pytest.raises(ValueError, match=r"Backend 'fancy' is unavailable here: ModuleNotFoundError"):
        Adam8bit([nn.Parameter(torch.ones(3))], backend="fancy")
    assert kernels.get_backend("auto", "cpu").name == "torch"  # auto falls back, and the reason is kept


def test_cpu_backend_unavailable_message_carries_the_import_error(monkeypatch):
    kernels.available_backends()
    monkeypatch.delitem(kernels._BACKENDS, "cpu", raising=False)
    monkeypatch.setitem(kernels._IMPORT_ERRORS, "cpu", "ImportError: adam8lib cpu backend unavailable: no C++ compiler")
    with pytest.raises(ValueError, match="cpu backend unavailable: no C\\+\\+ compiler"):
        Adam8bit([nn.Parameter(torch.ones(3))], backend="cpu")
    assert kernels.get_backend("auto", "cpu").name == "torch"


def test_a_backend_that_cannot_run_on_a_device_gives_its_own_reason(monkeypatch):
    import types

    module = types.ModuleType("fake_backend_module")
    module.unavailable_reason = lambda: "the build failed: ninja not found"

    def step(*args, **kwargs):  # pragma: no cover - never runs
        raise AssertionError

    step.__module__ = module.__name__
    monkeypatch.setitem(sys.modules, module.__name__, module)
    kernels.register_backend("fake", step, lambda device: False)
    try:
        with pytest.raises(ValueError, match="Backend 'fake' cannot run on device cpu: the build failed: ninja not found"):
            kernels.get_backend("fake", "cpu")
    finally:
        kernels._BACKENDS.pop("fake")


# ------------------------------------------------------------------ devices: auto is resolved at every step
def test_auto_resolves_the_backend_at_every_step_not_at_construction(monkeypatch):
    """An optimizer built with backend="auto" follows the registry at each step: a backend that
    starts claiming the device (as a new device's backend does after model.to(device)) is used
    from the next step on, and the result equals the reference."""
    ran = []

    def accel(*args, **kwargs):
        ran.append(args[0].device.type)
        reference.adam8bit_step(*args, **kwargs)

    torch.manual_seed(0)
    p, q = nn.Parameter(torch.randn(5000)), nn.Parameter(torch.randn(5000))
    q.data.copy_(p.data)
    opt, ref = Adam8bit([p], backend="auto"), Adam8bit([q], backend="torch")
    for step in range(3):
        if step == 1:
            kernels.register_backend("accel", accel, lambda device: device.type == "cpu")
            monkeypatch.setattr(kernels, "AUTO_ORDER", ("accel",) + kernels.AUTO_ORDER)
        g = torch.randn(5000)
        p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    kernels._BACKENDS.pop("accel")
    assert ran == ["cpu", "cpu"]  # steps 2 and 3, not step 1
    torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CPU twin: the test above)")
def test_optimizer_built_before_model_to_cuda_keeps_working():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 4))
    twin = copy.deepcopy(model)
    opt, ref = AdamW8bit(model.parameters(), lr=1e-2), AdamW8bit(twin.parameters(), lr=1e-2, backend="torch")
    data = [(torch.randn(16, 64), torch.randint(0, 4, (16,))) for _ in range(4)]
    for i, (x, y) in enumerate(data):
        if i == 2:
            model.to("cuda")  # states made on the CPU must follow
        dev = next(model.parameters()).device
        for m, o, d in ((model, opt, dev), (twin, ref, torch.device("cpu"))):
            o.zero_grad()
            nn.functional.cross_entropy(m(x.to(d)), y.to(d)).backward()
            o.step()
    assert all(t.device.type == "cuda" for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a.cpu(), b, rtol=0, atol=1e-5)


def test_many_tensor_steps_need_every_p_on_the_first_ones_device():
    """check_each (every many-tensor entry point: the dispatcher, cpu, triton) refuses a group
    whose tensors are on different devices, naming the tensor, after that tensor's own check."""
    from adam8lib.kernels.contract import check_each

    def item(device):
        return tuple(torch.zeros(4, device=device) for _ in range(6))

    seen = []
    with pytest.raises(ValueError, match=r"tensor 1 of 3: p is on meta, the first tensor's p on cpu"):
        check_each([item("cpu"), item("meta"), item("cpu")], [1, 1, 1], lambda entry, step: seen.append(entry))
    assert len(seen) == 2  # the tensor's own check ran first
    assert check_each([item("cpu"), item("cpu")], (1, 2), lambda entry, step: None)[1] == [1, 2]
