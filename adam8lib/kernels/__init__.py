"""The backends, the one registry of fused steps, and the 8-bit Adam step's dispatch point.

Fused steps of every rule and state format are in one registry, keyed by what a step can do
(:mod:`.registry`: ``register_step``, ``find_step(rule, fmt, backend, device)``): today's 8-bit Adam
backends and the FP8/4-bit Adam kernels (as rule ``"adamw"``), and the rule templates of the family
(:mod:`.cpu_rules`, :mod:`.triton_rules`). ``register_adam_step`` registers a format's Adam kernel
written with the state-dict signature (what the FP8 and 4-bit kernels have) behind an adapter.

The 8-bit Adam step itself (lessons 07 and 08) keeps its dispatch point: pick a backend, check its
arguments, call it.

Every backend is a function with the signature of :func:`reference.adam8bit_step`
(flat contiguous tensors, in-place update; the argument contract is
:func:`contract.check_step_args`) and must give the same codes, the same absmax
and parameters within 1e-6 of the reference. Backends:

* ``"torch"`` — :mod:`adam8lib.kernels.reference`, plain PyTorch over bounded chunks (any device);
* ``"triton"`` — a fused Triton kernel (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``),
  registered by :mod:`adam8lib.kernels.triton` when triton imports;
* ``"cpu"`` — a C++ kernel, registered by :mod:`adam8lib.kernels.cpu` when a compiler is found;
* further backends register themselves with :func:`register_backend`.

``"auto"`` takes the first *available* backend in :data:`AUTO_ORDER` for the tensor's device;
it never picks ``"triton"`` for CPU tensors (the interpreter is thousands of times slower).
It is resolved again at every call, so a model moved to another device after the optimizer
was built gets that device's backend.

An optional backend whose module fails to import is recorded with the reason
(:func:`unavailable_reason`), and asking for it by name says why it is missing. A backend
module that imports but cannot run (e.g. its build failed) may define
``unavailable_reason() -> str | None``; its answer goes into the error message.

Several tensors of one parameter group go through :func:`adam8bit_step_many` (what the
optimizers use): each is checked, then a backend that registered a ``step_many`` (the ``cpu``
backends: one call into the C++ kernel; ``triton``: one launch per pair of dtypes) steps them
all at once, and any other backend one by one. Python (and, on a GPU, a kernel launch) is then
paid once per group instead of once per tensor, which is most of what a small tensor costs.

torch.compile: :func:`adam8bit_step` always runs eagerly (``torch.compiler.disable``): inside a
compiled function it is a graph break, and the backend sees real tensors that live until it
returns (a kernel reading raw pointers must never see a tensor traced away by the compiler).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from . import reference
from .contract import check_each, check_step_args, checked_for_backend
from . import registry
from .registry import FusedStep, register_step

__all__ = [
    "register_backend",
    "get_backend",
    "available_backends",
    "unavailable_reason",
    "adam8bit_step",
    "adam8bit_step_many",
    "run_eagerly",
    "AUTO_ORDER",
    "register_adam_step",
    "adam8bit_step_items",
    "register_step",
    "find_step",
    "registered_steps",
    "backends_for",
    "FusedStep",
]


@dataclass(frozen=True)
class Backend:
    name: str
    step: Callable[..., None]
    supports: Callable[[torch.device], bool]
    #: optional: several tensors of one parameter group in one call (see :func:`adam8bit_step_many`)
    step_many: Callable[..., None] | None = None


_BACKENDS: dict[str, Backend] = {}
#: Modules that register optional backends and their fused steps when imported (backend name -> modules,
#: the backend's own first).
_OPTIONAL_MODULES = {
    "triton": ("adam8lib.kernels.triton", "adam8lib.kernels.triton_fp8", "adam8lib.kernels.triton_4bit",
               "adam8lib.kernels.triton_rules"),
    "cpu": ("adam8lib.kernels.cpu",),
}
#: Why an optional backend is missing: backend name -> "ExceptionType: message".
_IMPORT_ERRORS: dict[str, str] = {}
_loaded_optional = False
#: Preference order for ``backend="auto"``.
AUTO_ORDER = ("triton", "cpu", "torch")


def run_eagerly(fn: Callable) -> Callable:
    """Decorator: ``fn`` always runs in eager mode, also when called from ``torch.compile``d code.

    The same as ``torch.compiler.disable`` but importing ``torch._dynamo`` (seconds) only at the
    first call, as torch's own optimizers do; inside a compiled region the call is a graph break.
    """
    disable_lazily = getattr(torch, "_disable_dynamo", None)
    if disable_lazily is not None:
        return disable_lazily(fn)
    return torch.compiler.disable(fn)  # pragma: no cover - older/newer torch without the lazy form


def register_backend(name: str, step: Callable[..., None], supports: Callable[[torch.device], bool], *,
                     step_many: Callable[..., None] | None = None) -> None:
    """Make ``step`` available as ``backend=name`` for devices where ``supports(device)``.

    ``step_many(tensors, qmap1, qmap2, *, steps, **hyperparameters)``, if given, steps several
    tensors in one call (:func:`adam8bit_step_many`); without it they are stepped one by one."""
    _BACKENDS[name] = Backend(name, step, supports, step_many)
    _IMPORT_ERRORS.pop(name, None)
    if name != "torch":  # the reference is no fused step: the core's own reference step runs instead
        register_step("adamw", name, _adam8bit_as_fused(step), formats=_is_adam8bit_layout, supports=supports,
                      many=_adam8bit_many_as_fused(name))


register_backend("torch", reference.adam8bit_step, lambda device: True)


def _load_optional() -> None:
    global _loaded_optional
    if _loaded_optional:
        return
    _loaded_optional = True
    for name, modules in _OPTIONAL_MODULES.items():
        try:
            for module in (modules,) if isinstance(modules, str) else modules:
                importlib.import_module(module)
        except Exception as exc:  # ImportError, or a broken toolchain failing at import: recorded, not fatal
            _IMPORT_ERRORS[name] = f"{type(exc).__name__}: {exc}"


def unavailable_reason(name: str, device: torch.device | str | None = None) -> str | None:
    """Why backend ``name`` cannot be used (on ``device``, if given), or None if it can.

    Reasons come from the failed import of its module, or from the module's own
    ``unavailable_reason()`` (or ``_build_error``) when it imported but cannot run.
    """
    _load_optional()
    if name in _IMPORT_ERRORS:
        return _IMPORT_ERRORS[name]
    backend = _BACKENDS.get(name)
    if backend is None:
        return f"no backend named {name!r} is registered"
    if device is None or backend.supports(torch.device(device)):
        return None
    module = importlib.import_module(backend.step.__module__) if backend.step.__module__ else None
    own = getattr(module, "unavailable_reason", None)
    reason = own() if callable(own) else getattr(module, "_build_error", None)
    return str(reason) if reason else f"it does not support {torch.device(device).type} tensors"


def available_backends(device: torch.device | str | None = None) -> list[str]:
    """Names of the registered backends (that support ``device``, if given)."""
    _load_optional()
    if device is None:
        return list(_BACKENDS)
    device = torch.device(device)
    return [name for name, b in _BACKENDS.items() if b.supports(device)]


def known_backend_names() -> tuple[str, ...]:
    """Every name a user may pass as ``backend=``, whether or not it is usable here."""
    _load_optional()  # the optional modules register their names (e.g. "cpu_fast") on import
    return ("auto",) + tuple(dict.fromkeys(AUTO_ORDER + tuple(_BACKENDS)))


def get_backend(name: str, device: torch.device | str) -> Backend:
    """Resolve ``name`` (or ``"auto"``) to a backend usable on ``device``; clear error if none."""
    _load_optional()
    device = torch.device(device)
    if name == "auto":
        for candidate in AUTO_ORDER:
            if candidate == "triton" and device.type != "cuda":
                continue  # the Triton interpreter (CPU, TRITON_INTERPRET=1) is for lessons and tests only: too slow
            backend = _BACKENDS.get(candidate)
            if backend is not None and backend.supports(device):
                return backend
        return _BACKENDS["torch"]
    backend = _BACKENDS.get(name)
    if backend is None:
        why = f" ({_IMPORT_ERRORS[name]})" if name in _IMPORT_ERRORS else ""
        raise ValueError(f"Unknown or unavailable backend {name!r}{why}; available here: {available_backends()}")
    if not backend.supports(device):
        hint = " (the triton backend needs CUDA tensors, or TRITON_INTERPRET=1 for CPU)" if name == "triton" else ""
        raise ValueError(f"Backend {name!r} cannot run on device {device}{hint}: {unavailable_reason(name, device)}")
    return backend


@run_eagerly
def adam8bit_step(*args, backend: str = "auto", **kwargs) -> None:
    """Run one 8-bit Adam step on flat tensors with the chosen backend (see reference).

    The arguments are checked against :mod:`.contract` first, so a bad call raises
    TypeError/ValueError and changes nothing, whatever the backend.
    """
    bound = _bind(*args, **kwargs)
    check_step_args(*bound, blocksize=kwargs.get("blocksize"), step=kwargs.get("step"))
    chosen = get_backend(backend, bound[0].device)
    with checked_for_backend([bound], kwargs.get("blocksize")):
        chosen.step(*args, **kwargs)


@run_eagerly
def adam8bit_step_many(tensors, qmap1: torch.Tensor, qmap2: torch.Tensor, *, steps, backend: str = "auto",
                       **hyperparameters) -> None:
    """The step of several tensors that share maps and hyperparameters (one parameter group).

    ``tensors``: ``(p, g, state1, state2, absmax1, absmax2)`` per tensor, all on one device;
    ``steps``: each one's step count; ``hyperparameters``: ``lr``, ``beta1``, ``beta2``, ``eps``,
    ``weight_decay``, ``blocksize`` (and a backend's own options). Every tensor is checked
    against the contract before any is changed (the error names its position), then the backend
    steps them all in one call if it can (``Backend.step_many``: the ``cpu`` backends), else one
    by one. The result is the same as :func:`adam8bit_step` on each tensor, bit for bit.
    """
    blocksize = hyperparameters.get("blocksize")

    tensors, steps = check_each(
        tensors, steps, lambda item, step: check_step_args(*item, qmap1, qmap2, blocksize=blocksize, step=step))
    if not tensors:
        return
    calls = [(*item, qmap1, qmap2) for item in tensors]
    chosen = get_backend(backend, tensors[0][0].device)
    with checked_for_backend(calls, blocksize):
        if chosen.step_many is not None:
            chosen.step_many(tensors, qmap1, qmap2, steps=steps, **hyperparameters)
        else:
            for item, step in zip(tensors, steps):
                chosen.step(*item, qmap1, qmap2, step=step, **hyperparameters)


# ---------------------------------------------------------------------------------------
# Finding a fused step in the one registry (:mod:`.registry`) for a device
# ---------------------------------------------------------------------------------------
def registered_steps() -> list[FusedStep]:
    """Every registered fused step (:mod:`.registry`), the optional backends' modules imported first."""
    _load_optional()
    return registry.steps()


def backends_for(rule, fmt) -> tuple[str, ...]:
    """The backends with a fused step of ``rule`` for ``fmt``, in registration order (no device check)."""
    return tuple(dict.fromkeys(s.backend for s in registry.matching(registered_steps(), rule, fmt)))


def find_step(rule, fmt, backend: str, device: torch.device | str) -> FusedStep | None:
    """The fused step of ``rule`` (an UpdateRule or its name) for the state format ``fmt`` (a
    StateFormat, a name, or None for fp32 states) on ``backend`` that runs on ``device``, or None.

    ``backend="auto"``: the first of :data:`AUTO_ORDER` with such a step that runs on ``device``
    (never the Triton interpreter for CPU tensors); ``"torch"``: None (the reference step). None
    means "run the reference step". A named backend that cannot run on ``device`` raises ValueError
    saying why (:func:`get_backend`); one with no step for this rule and format gives None."""
    device = torch.device(device)
    found = registry.matching(registered_steps(), rule, fmt)
    if backend == "auto":
        for candidate in AUTO_ORDER:
            if candidate == "triton" and device.type != "cuda":
                continue
            for s in found:
                if s.backend == candidate and s.supports(device):
                    return s
        return None
    if backend == "torch":
        return None
    get_backend(backend, device)  # ValueError naming why, if it cannot run here
    return next((s for s in found if s.backend == backend and s.supports(device)), None)


def _is_adam8bit_layout(fmt) -> bool:
    """What the 8-bit Adam backends store (:attr:`adam8lib.formats.StateFormat.steps_in_map_kernels`)."""
    return fmt.steps_in_map_kernels


def _adam8bit_as_fused(step: Callable[..., None]) -> Callable[..., None]:
    """An 8-bit Adam backend's ``step`` in the registry's calling convention."""
    def fused(p, g, states, *, rule, fmt, shape, step: int, group) -> None:
        (c1, a1), (c2, a2) = states
        beta1, beta2 = group["betas"]
        qmap1, qmap2 = fmt.m.qmap().to(p.device), fmt.v.qmap().to(p.device)
        check_step_args(p, g, c1, c2, a1, a2, qmap1, qmap2, blocksize=fmt.m.blocksize, step=step)
        with checked_for_backend([(p, g, c1, c2, a1, a2, qmap1, qmap2)], fmt.m.blocksize):
            step_fn(p, g, c1, c2, a1, a2, qmap1, qmap2, step=step, lr=group["lr"], beta1=beta1, beta2=beta2,
                    eps=group["eps"], weight_decay=group["weight_decay"], blocksize=fmt.m.blocksize)
    step_fn = step
    fused.__doc__ = f"{getattr(step, '__qualname__', step)} in the fused-step convention (:mod:`adam8lib.kernels.registry`)."
    return fused


def _adam8bit_many_as_fused(backend: str) -> Callable[..., None]:
    """An 8-bit Adam backend's batched step (:func:`adam8bit_step_many`: one call of its ``step_many`` where it
    has one) as the registry's ``many``: ``items`` are ``(p, g, states)`` as ``fn`` takes them, one per tensor,
    all on one device; each is stepped as ``fn`` would step it, bit for bit."""
    maps: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def many(items, *, rule, fmt, shapes, steps, group) -> None:
        if not items:
            return
        device = items[0][0].device
        key = (device, fmt.m.map_builder, fmt.v.map_builder)  # the maps (cached per builder: _cached_map)
        qmaps = maps.get(key)
        if qmaps is None:
            qmaps = maps[key] = (fmt.m.qmap().to(device), fmt.v.qmap().to(device))
        adam8bit_step_items(items, *qmaps, steps=steps, group=group, blocksize=fmt.m.blocksize, backend=backend)
    return many


def map_codes_reference_step() -> FusedStep:
    """The map-code kernel of the ``"torch"`` backend (:func:`adam8lib.kernels.reference.adam8bit_step`: the
    8-bit Adam step of lesson 07 in plain PyTorch, a chunk of blocks at a time, so its fp32 temporaries are one
    chunk's) in the registry's calling convention. Not in the registry: ``backend="torch"`` means the reference
    step, and for the 8-bit layout of the Adam classes (:class:`~adam8lib.optim.LowBitAdam`) this is it."""
    return _MAP_CODES_REFERENCE


_MAP_CODES_REFERENCE = FusedStep("adamw", "torch", _adam8bit_as_fused(reference.adam8bit_step), _is_adam8bit_layout,
                                 lambda device: True, _adam8bit_many_as_fused("torch"))


def adam8bit_step_items(items, qmap1: torch.Tensor, qmap2: torch.Tensor, *, steps, group, blocksize: int,
                        backend: str = "auto") -> None:
    """:func:`adam8bit_step_many` for tensors given as the registry's steps take them, ``items`` of
    ``(p, g, ((state1, absmax1), (state2, absmax2)))``, with a param group's ``lr``, ``betas``, ``eps`` and
    ``weight_decay``."""
    beta1, beta2 = group["betas"]
    adam8bit_step_many([(p, g, c1, c2, a1, a2) for p, g, ((c1, a1), (c2, a2)) in items], qmap1, qmap2, steps=steps,
                       lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                       weight_decay=group["weight_decay"], blocksize=blocksize, backend=backend)


def _adam_format_step_as_fused(step: Callable[..., None]) -> Callable[..., None]:
    """A state format's Adam step of the old signature (:func:`register_adam_step`) in the registry's."""
    def fused(p, g, states, *, rule, fmt, shape, step: int, group) -> None:
        (c1, a1), (c2, a2) = states
        beta1, beta2 = group["betas"]
        step_fn(p, g, {"state1": c1, "state2": c2, "absmax1": a1, "absmax2": a2}, fmt, shape=shape, step=step,
                lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"])
    step_fn = step
    return fused


def register_adam_step(format_name: str, backend: str, step: Callable[..., None]) -> None:
    """Register a state format's fused Adam step written with the signature below (what the FP8 and
    4-bit kernels have), behind an adapter: ``register_step("adamw", backend, ..., formats=(format_name,))``.

    ``step(p, g, state, fmt, *, shape, step, lr, beta1, beta2, eps, weight_decay)``: ``p`` and
    ``g`` flat contiguous tensors of one parameter, ``state`` its dict (``state1``/``state2`` codes,
    ``absmax1``/``absmax2`` scales, :meth:`adam8lib.formats.StateFormat.state_spec`), ``fmt`` the
    :class:`~adam8lib.formats.StateFormat` (with the group's block size), ``shape`` the parameter's
    shape (rank-1 scales need it). In place, with the states and parameter that the reference step
    (:func:`adam8lib.kernels.reference.format_reference_step`) gives, bit for bit. The backend's ``supports``
    (:func:`register_backend`) says on which devices it runs."""
    def supports(device: torch.device) -> bool:  # the backend's (it may register after its steps)
        entry = _BACKENDS.get(backend)
        return entry is not None and entry.supports(device)

    register_step("adamw", backend, _adam_format_step_as_fused(step), formats=(format_name,), supports=supports)


_TENSOR_ARGS = ("p", "g", "state1", "state2", "absmax1", "absmax2", "qmap1", "qmap2")


def _bind(*args, **kwargs) -> tuple:
    """The eight tensor arguments, whether passed by position or by name."""
    if len(args) > len(_TENSOR_ARGS):
        raise TypeError(f"adam8bit_step takes {len(_TENSOR_ARGS)} positional tensors, got {len(args)}")
    named = dict(zip(_TENSOR_ARGS, args))
    for key in _TENSOR_ARGS[len(args):]:
        if key not in kwargs:
            raise TypeError(f"adam8bit_step is missing the tensor argument {key!r}")
        named[key] = kwargs[key]
    return tuple(named[k] for k in _TENSOR_ARGS)

