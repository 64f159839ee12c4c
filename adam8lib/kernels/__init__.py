"""One dispatch point for the 8-bit Adam step: pick a backend, call it.

Every backend is a function with the signature of :func:`reference.adam8bit_step`
(flat contiguous tensors, in-place update) and must give the same codes, the same absmax
and parameters within 1e-6 of the reference. Backends:

* ``"torch"`` — :mod:`adam8lib.kernels.reference`, plain PyTorch over bounded chunks (any device);
* ``"triton"`` — a fused Triton kernel (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``),
  registered by :mod:`adam8lib.kernels.triton` when triton imports;
* further backends register themselves with :func:`register_backend`.

``"auto"`` takes the first *available* backend in :data:`AUTO_ORDER` for the tensor's device;
it never picks ``"triton"`` for CPU tensors (the interpreter is thousands of times slower).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from . import reference

__all__ = ["register_backend", "get_backend", "available_backends", "adam8bit_step", "AUTO_ORDER"]


@dataclass(frozen=True)
class Backend:
    name: str
    step: Callable[..., None]
    supports: Callable[[torch.device], bool]


_BACKENDS: dict[str, Backend] = {}
#: Modules that register optional backends when imported (missing ones are skipped).
_OPTIONAL_MODULES = ("adam8lib.kernels.triton", "adam8lib.kernels.cpu")
_loaded_optional = False
#: Preference order for ``backend="auto"``.
AUTO_ORDER = ("triton", "cpu", "torch")


def register_backend(name: str, step: Callable[..., None], supports: Callable[[torch.device], bool]) -> None:
    """Make ``step`` available as ``backend=name`` for devices where ``supports(device)``."""
    _BACKENDS[name] = Backend(name, step, supports)


register_backend("torch", reference.adam8bit_step, lambda device: True)


def _load_optional() -> None:
    global _loaded_optional
    if _loaded_optional:
        return
    _loaded_optional = True
    for module in _OPTIONAL_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            pass


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
        raise ValueError(f"Unknown or unavailable backend {name!r}; available here: {available_backends()}")
    if not backend.supports(device):
        hint = " (the triton backend needs CUDA tensors, or TRITON_INTERPRET=1 for CPU)" if name == "triton" else ""
        raise ValueError(f"Backend {name!r} cannot run on device {device}{hint}")
    return backend


def adam8bit_step(*args, backend: str = "auto", **kwargs) -> None:
    """Run one 8-bit Adam step on flat tensors with the chosen backend (see reference)."""
    p = args[0] if args else kwargs["p"]
    get_backend(backend, p.device).step(*args, **kwargs)
