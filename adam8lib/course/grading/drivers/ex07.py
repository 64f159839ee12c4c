"""Drivers of workbook 07 (:mod:`adam8lib.course.checks.ex07_adam8bit_step`): the learner's ``MyAdam8bit`` built and
stepped over the parameters and gradients the check sends (07.2: the parameters after the steps, what each one's
state holds, the optimizer's defaults; a checkpoint saved and loaded into a fresh optimizer), the learner's
``StableEmbedding`` built from a fixed seed, run and moved as training would move it (07.3: its table, its
LayerNorm, its outputs; what bitsandbytes' Adam8bit keeps for its table), and the learner's ``train`` run with
``torch.optim.Adam``, or :func:`mlp_task` trained with the learner's optimizer (07.4: the losses). What they did
comes back as plain data; the check recomputes the same scenario with its own reference and compares.

07.1 needs no driver: the learner's ``adam8bit_step`` is a function on tensors, called on the check's plain
tensors (those it updates in place are copied back).

:func:`mlp_task` (07.4's data and model) lives here, where the learner process can import it: under the grader's
learner view the course's checks are not shown, and the exercise cell's
``from adam8lib.course.checks.ex07_adam8bit_step import mlp_task`` finds a stand-in module that holds only
:func:`mlp_task` (:func:`_stand_in_for_the_check_module`)."""

from __future__ import annotations

import importlib
import io
import numbers
import sys
import types
from pathlib import Path

import torch
from torch import nn

from . import attempt, described, driver

__all__ = ["mlp_task", "train_losses", "TRAIN_OPTIMIZERS", "step_optimizer", "checkpoint_run", "embedding_run",
           "train_run", "train_with"]


# ---------------------------------------------------------------------------- 07.2
def _optimizer(cls, groups: list, params: list):
    """``cls(groups)`` over :class:`~torch.nn.Parameter` copies of ``params``; ``groups`` name their parameters by
    index (``{"params": [0, 1], "lr": ...}``)."""
    made = [nn.Parameter(p.detach().clone()) for p in params]
    built = [{**{k: v for k, v in g.items() if k != "params"}, "params": [made[i] for i in g["params"]]} for g in groups]
    return cls(built), made


def _step(opt, made: list, grads: list) -> None:
    """One ``opt.step()`` with ``grads`` (one entry per parameter: a tensor, or None for no gradient)."""
    for p, g in zip(made, grads):
        p.grad = None if g is None else g.detach().clone().to(p.dtype)
    opt.step()


def _state_of(opt, p) -> dict:
    """What ``opt.state[p]`` holds, described: empty or not, and each tensor's dtype and shape."""
    state = getattr(opt, "state", {})
    st = state.get(p) if hasattr(state, "get") else None
    tensors = []
    if hasattr(st, "values"):
        for v in st.values():
            if torch.is_tensor(v):
                tensors.append({"dtype": v.dtype, "shape": [int(n) for n in v.shape], "numel": int(v.numel())})
    return {"empty": not st, "tensors": tensors}


@driver
def step_optimizer(cls, groups: list, params: list, grads: list) -> dict:
    """``cls(groups)`` stepped once per entry of ``grads``: whether it is a ``torch.optim.Optimizer``, the parameters
    at the end, what each parameter's state holds, and the optimizer's defaults (lr, betas, eps, weight_decay: those
    that are plain data)."""
    opt, made = _optimizer(cls, groups, params)
    for step in grads:
        _step(opt, made, step)
    defaults = getattr(opt, "defaults", None)
    own = {}
    if type(defaults) is dict:
        for key in ("lr", "betas", "eps", "weight_decay"):
            if key in defaults and "plain" in described(defaults[key]):
                own[key] = defaults[key]
    return {"optimizer": isinstance(opt, torch.optim.Optimizer), "type": type(opt).__name__,
            "params": [p.detach().clone() for p in made], "states": [_state_of(opt, p) for p in made],
            "defaults": own}


@driver
def checkpoint_run(cls, groups: list, params: list, grads: list, last: list) -> dict:
    """A checkpoint's round trip: ``a = cls(groups)`` stepped over ``grads``, its ``state_dict()`` saved to bytes and
    loaded (``weights_only``) into ``b = cls(groups)`` over copies of a's parameters; then both stepped once more
    with ``last``. Returns both optimizers' parameters — or where ``b.load_state_dict`` raised, or what b's first step
    after loading raised (its type and message: the check names it)."""
    a, a_made = _optimizer(cls, groups, params)
    for step in grads:
        _step(a, a_made, step)
    buffer = io.BytesIO()  # a checkpoint on disk, as in real life (and no tensor shared with `a`)
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    b, b_made = _optimizer(cls, groups, [p.detach() for p in a_made])
    _, error = attempt(lambda: b.load_state_dict(saved))
    if error is not None:
        return {"load_error": error}
    _step(a, a_made, last)
    _, error = attempt(lambda: _step(b, b_made, last))  # the loaded optimizer's first step: what it lacks shows here
    if error is not None:
        return {"load_error": None, "step_error": {"type": str(error["names"][0]), "text": str(error["text"])[:300]}}
    return {"load_error": None, "step_error": None, "a": [p.detach().clone() for p in a_made],
            "b": [p.detach().clone() for p in b_made]}


# ---------------------------------------------------------------------------- 07.3
@driver
def embedding_run(cls, x, moves: dict) -> dict:
    """``cls(1000, 64)`` built after ``torch.manual_seed(0)``: its parts, its table and LayerNorm as built, which
    parameters are frozen or not listed by ``parameters()``, its output on ``x``; then its parameters moved as
    training would (``moves``: added to the table, the LayerNorm's new scale and shift) and its output again; then a
    fresh one trained one step by bitsandbytes' Adam8bit (the dtype of its table's state). Each stage stops where
    the learner's code raised (the record: :func:`~adam8lib.course.grading.drivers.reraise`) or where the check
    already has what fails it."""
    torch.manual_seed(0)
    module, error = attempt(lambda: cls(1000, 64))
    out: dict = {"build_error": error}
    if error is not None:
        return out
    emb, norm = getattr(module, "embedding", None), getattr(module, "norm", None)
    out["parts"] = [type(emb).__name__, type(norm).__name__]
    if not isinstance(emb, nn.Embedding) or not isinstance(norm, nn.LayerNorm):
        return out
    out.update(table=emb.weight.detach().clone(), normalized_shape=[int(n) for n in norm.normalized_shape],
               scale=None if norm.weight is None else norm.weight.detach().clone(),
               shift=None if norm.bias is None else norm.bias.detach().clone(), eps=float(norm.eps),
               frozen=[str(name) for name, prm in module.named_parameters() if not prm.requires_grad])
    listed = {id(prm) for prm in module.parameters()}
    out["missing"] = [name for name, prm in (("embedding.weight", emb.weight), ("norm.weight", norm.weight),
                                             ("norm.bias", norm.bias)) if id(prm) not in listed]
    y, error = attempt(lambda: module(x))
    out.update(forward_error=error, output=None if error else described(y))
    if error is not None or norm.weight is None or norm.bias is None or out["frozen"] or out["missing"]:
        return out
    if tuple(emb.weight.shape) != tuple(moves["table"].shape) or tuple(norm.weight.shape) != tuple(moves["scale"].shape):
        return out
    with torch.no_grad():  # what a few optimizer steps do: every parameter moves away from its init
        emb.weight.add_(moves["table"])
        norm.weight.copy_(moves["scale"])
        norm.bias.copy_(moves["shift"])
    y, error = attempt(lambda: module(x))
    out.update(trained_error=error, trained=None if error else described(y),
               trained_grad=bool(getattr(y, "requires_grad", False)))
    if error is None:
        out["override"] = _override(cls, x)
    return out


def _override(cls, x) -> dict:
    """A fresh ``cls(1000, 64)`` trained one step by bitsandbytes' Adam8bit: the dtype of its table's state1 (None: the
    table was not stepped), whether the learner registered an override for the table and the configs registered for it
    (their plain entries) — or where it raised."""
    try:
        import contextlib

        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            import bitsandbytes as bnb
    except Exception:  # noqa: BLE001 - no bitsandbytes: the 32-bit override cannot be checked here
        return {"bnb": False}
    found, error = attempt(lambda: _stepped_by_bnb(bnb, cls, x))
    return {"bnb": True, "error": error, **(found or {})}


def _stepped_by_bnb(bnb, cls, x) -> dict:
    # forget earlier registrations: they are keyed by id(parameter), and ids of dead modules get reused
    manager = bnb.optim.GlobalOptimManager.get_instance()
    manager.initialize()
    try:
        torch.manual_seed(0)
        module = cls(1000, 64)
        opt = bnb.optim.Adam8bit(module.parameters(), lr=1e-3)
        module(x).pow(2).sum().backward()
        try:
            opt.step()
        except AttributeError as err:  # a registered (module, name) pair that is not a parameter
            return {"attribute_error": str(err)[:1000]}
        state = opt.state.get(module.embedding.weight) or {}
        overrides = manager.module_weight_config_triple
        mine = [config for mod, name, config in overrides if getattr(mod, name, None) is module.embedding.weight]
        configs = [{str(k): v for k, v in config.items() if isinstance(v, (bool, int, float, str))}
                   for config in mine if isinstance(config, dict)]
        return {"attribute_error": None, "dtype": state["state1"].dtype if torch.is_tensor(state.get("state1")) else None,
                "registered": bool(mine), "configs": configs}
    finally:  # and leave none behind: a later optimizer could take a dead parameter's override by its id
        manager.initialize()


# ---------------------------------------------------------------------------- 07.4
#: the number of points of each input :func:`mlp_task`'s model was run on while :func:`train_run` records them
#: (None: not recording)
_batches: list[int] | None = None
#: while train_run runs a learner's train(): how many times it ran the course's own loop (train_losses) instead
_course_loops: int | None = None


def _record_batch(module, inputs) -> None:
    """A forward pre-hook of :func:`mlp_task`'s model: how many points it is run on (for 07.4's check: the whole
    batch, or mini-batches)."""
    if _batches is not None and inputs and torch.is_tensor(inputs[0]):
        _batches.append(int(inputs[0].shape[0]) if inputs[0].dim() > 1 else 1)


def mlp_task(seed: int = 0):
    """``(x, y, model)``: a fixed regression task (256 points, ``y = sum(sin(x @ W))``) and an MLP
    16 -> 64 -> 64 -> 1 (tanh), the same initial weights on every call. The 64x64 weight (4,096
    elements) gets 8-bit states, the 16x64 one (1,024) and the biases fp32 states."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 16, generator=gen)
    teacher = torch.randn(16, 8, generator=gen) / 4
    y = torch.sin(x @ teacher).sum(dim=1, keepdim=True)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                torch.nn.Tanh(), torch.nn.Linear(64, 1))
    model.register_forward_pre_hook(_record_batch)
    return x, y, model


def train_losses(make_optimizer, steps: int = 200, step_fn=None, *, record: str = "before", zero: str = "before",
                 fresh_optimizer: bool = False, reduction: str = "mean", shape: str = "same") -> list[float]:
    """Full-batch training of :func:`mlp_task`'s MLP: the mean squared error before each step.

    The keywords reproduce a learner's slips (for the hints): ``record="after"`` (loss after the step),
    ``zero="none"`` / ``"between"`` (no zero_grad / zero_grad between backward and step),
    ``fresh_optimizer`` (a new optimizer every step), ``reduction="sum"``, ``shape="broadcast"`` (an output of
    shape (256,) against y of shape (256, 1): mse_loss broadcasts them to every output against every target)."""
    import warnings

    global _course_loops
    if _course_loops is not None:  # inside train_run: the learner's train() ran this loop instead of its own
        _course_loops += 1
    x, y, model = mlp_task()
    params = list(model.parameters())
    opt = make_optimizer(params)
    losses = []
    for _ in range(steps):
        if fresh_optimizer:
            opt = make_optimizer(params)
        if zero == "before":
            opt.zero_grad()
        if shape == "broadcast":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch's "target size ... broadcasting" warning
                loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y, reduction=reduction)
        else:
            loss = torch.nn.functional.mse_loss(model(x), y, reduction=reduction)
        loss.backward()
        if record == "before":
            losses.append(loss.item())
        if zero == "between":
            opt.zero_grad()
        opt.step() if step_fn is None else step_fn(opt)
        if record == "after":
            losses.append(torch.nn.functional.mse_loss(model(x), y, reduction=reduction).item())
    return losses


#: the optimizer classes a learner's train() is handed, by the name the check sends
TRAIN_OPTIMIZERS = {"torch.optim.Adam": torch.optim.Adam}


def _curve(got) -> dict:
    """A learner's list of losses, described: None, a tensor, a sequence (its length, the kinds of its items, the
    first tensor among them, its values as floats when they are all real numbers), or something else."""
    out = {"none": got is None, "type": type(got).__name__, "tensor": isinstance(got, torch.Tensor),
           "sequence": isinstance(got, (list, tuple))}
    if got is None or out["tensor"] or not out["sequence"]:
        return out
    items = list(got)
    first = next((v for v in items if isinstance(v, torch.Tensor)), None)
    out.update(length=len(items), kinds=sorted({type(v).__name__ for v in items}),
               first_tensor=None if first is None else {"type": type(first).__name__,
                                                        "shape": [int(n) for n in first.shape],
                                                        "requires_grad": bool(first.requires_grad)},
               numbers=all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in items))
    out["values"] = [float(v) for v in items] if out["numbers"] else None
    return out


@driver
def train_run(train_fn, optimizer: str, steps: int, lr: float) -> dict:
    """``train_fn(optimizer_class, steps=steps, lr=lr)`` with the optimizer class named ``optimizer``: its answer
    described (:func:`_curve`), ``batches``: the sizes of the inputs :func:`mlp_task`'s model was run on, and
    ``course_loops``: how many times it ran :func:`train_losses`, the course's loop, instead of a loop of its own."""
    global _batches, _course_loops
    _batches, _course_loops = [], 0
    try:
        out = _curve(train_fn(TRAIN_OPTIMIZERS[optimizer], steps=steps, lr=lr))
    finally:
        seen, _batches = _batches, None
        loops, _course_loops = _course_loops, None
    out["batches"] = sorted(set(seen))
    out["course_loops"] = loops
    return out


@driver
def train_with(optimizer_class, steps: int, lr: float) -> list:
    """:func:`mlp_task`'s MLP trained ``steps`` steps with ``optimizer_class(params, lr=lr)``: the losses."""
    return [float(v) for v in train_losses(lambda ps: optimizer_class(list(ps), lr=lr), steps)]


# ---------------------------------------------------------------------------- the learner view
_CHECK_MODULE = "adam8lib.course.checks.ex07_adam8bit_step"


def _stand_in_for_the_check_module() -> None:
    """Where the checks are not shown (the grader's learner view: ``adam8lib/course/checks`` holds only its
    ``__init__`` and ``_common``), a module under the check module's name that holds only :func:`mlp_task`, so that
    07.4's exercise cell (``from adam8lib.course.checks.ex07_adam8bit_step import mlp_task``) runs as in a notebook.
    Where the checks are there, nothing is done (the check module itself is imported)."""
    checks = Path(__file__).resolve().parents[2] / "checks"
    if _CHECK_MODULE in sys.modules or not checks.is_dir() or (checks / "ex07_adam8bit_step.py").exists():
        return
    stand_in = types.ModuleType(_CHECK_MODULE, "Workbook 07's task data for a learner's exercise cell (the checks "
                                               "are not shown while grading): mlp_task only.")
    stand_in.mlp_task = mlp_task
    stand_in.__all__ = ["mlp_task"]
    package = importlib.import_module(_CHECK_MODULE.rpartition(".")[0])  # the learner view's: no check module in it
    sys.modules[_CHECK_MODULE] = stand_in
    setattr(package, _CHECK_MODULE.rpartition(".")[2], stand_in)


_stand_in_for_the_check_module()
