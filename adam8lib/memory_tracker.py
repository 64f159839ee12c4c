"""Measure live tensor memory during a training step, from tensor storages (issue 37).

:class:`MemoryTracker` watches every storage that exists while it is active, from the moment it is
made to the moment it is freed, and counts its bytes (``untyped_storage().nbytes()``): a
measurement, not an estimate. Each storage is put in one category:

============== ==================================================================================
parameters     the storages of the tracked parameters
gradients      a storage that holds a parameter's gradient (``p.grad``, or the gradient on its way
               to it), named after the parameter; for a weight used twice (a tied embedding) also
               each contribution that autograd keeps until it sums them
optimizer_state the tensors in ``optimizer.state`` (codes, scales, moments, step counters)
activations    everything the forward phase makes (saved for backward or not; reported apart)
transient      everything else made while tracking: gradients of activations, the step's fp32
               working copies, the temporaries of every op
============== ==================================================================================

A storage's category is what it turns out to be: a gradient is made by a backward op and only then
handed to ``p.grad``; its bytes count as a gradient from the moment they exist (the same for the
optimizer state, created by the first step). Views share their base's storage: they add nothing.

How: a :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees the outputs of every op
(forward, backward -- the autograd engine keeps the mode -- and the optimizer step), a new storage is
registered with a ``weakref.finalize`` that records the moment it is freed; gradient hooks on the
parameters name the gradients; a step hook on the optimizer finds its states. The parameters,
their gradients and the optimizer state that exist when the tracker starts are counted from the
start; other tensors made before it (the batch, a model's buffers) are not counted. Buffers
inside one kernel that never become tensors (a BLAS workspace) are not seen.

Use::

    tracker = MemoryTracker(model, optimizer)
    with tracker:
        with tracker.phase("forward"):
            loss = loss_fn(model(batch))
        with tracker.phase("backward"):
            loss.backward()
        with tracker.phase("step"):
            optimizer.step(); optimizer.zero_grad()
    tracker.peak()                    # a Snapshot: bytes per category at the highest total
    tracker.at_end_of("backward")     # the bill between backward and step
    tracker.timeline()                # bytes per category after every event, to plot

(:func:`track_step` does these three phases in one call, and leaves out the step phase for an
optimizer whose gradients are released, :mod:`adam8lib.release`.)
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["CATEGORIES", "BILL", "MemoryTracker", "Snapshot", "track_step"]

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "transient")
#: What a training step keeps from one step to the next: the bill of bytes per parameter.
BILL = ("parameters", "gradients", "optimizer_state")
_CAT = {name: i for i, name in enumerate(CATEGORIES)}
_SUMS = (torch.ops.aten.add.Tensor,)  # how autograd sums the contributions to one gradient


@dataclass
class _Storage:
    nbytes: int
    category: str
    born: int  # index of the event that made it (it is live after that event)
    died: int | None = None  # index of the event that freed it
    name: str = ""  # a gradient's parameter
    summands: tuple["_Storage", ...] = ()  # a backward sum's inputs: parts of a gradient if it is one


@dataclass(frozen=True)
class Snapshot:
    """Live bytes after one event: per category, and the live gradients by name (largest first)."""

    event: int
    phase: str | None
    label: str
    bytes: dict[str, int]
    gradients: tuple[tuple[str, int], ...] = field(default=())

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    def sum(self, categories: Iterable[str] = BILL) -> int:
        """Bytes of some categories (default: parameters + gradients + optimizer state)."""
        categories = list(categories)
        unknown = [c for c in categories if c not in _CAT]
        if unknown:
            raise ValueError(f"unknown categories {unknown}; the categories are {CATEGORIES}")
        return sum(self.bytes[c] for c in categories)

    def bytes_per_param(self, num_params: int, categories: Iterable[str] = BILL) -> float:
        """``sum(categories) / num_params``: the row of a memory bill."""
        if isinstance(num_params, bool) or not isinstance(num_params, int) or num_params <= 0:
            raise ValueError(f"num_params must be a positive int, got {num_params!r}")
        return self.sum(categories) / num_params

    def describe(self, num_params: int) -> str:
        """The snapshot as lines a learner can print: MiB and bytes per parameter of each category,
        the bill (parameters + gradients + optimizer state) and the largest live gradient."""
        self.bytes_per_param(num_params)  # checks num_params
        lines = [f"after event {self.event} ({self.label}, phase {self.phase}):"]
        for c in CATEGORIES:
            lines.append(f"  {c:<16} {self.bytes[c] / 2**20:10.2f} MiB  {self.bytes[c] / num_params:7.3f} B/param")
        lines.append(f"  {'bill':<16} {self.sum() / 2**20:10.2f} MiB  {self.sum() / num_params:7.3f} B/param"
                     f"  (parameters + gradients + optimizer_state)")
        if self.gradients:
            name, nbytes = self.gradients[0]
            lines.append(f"  largest gradient: {name} ({nbytes / 2**20:.2f} MiB)")
        return "\n".join(lines)

    @property
    def largest_gradient(self) -> tuple[str, int] | None:
        """``(parameter name, bytes)`` of the largest gradient alive at this event, or None."""
        return self.gradients[0] if self.gradients else None


class MemoryTracker(TorchDispatchMode):
    """Measure live tensor bytes per category while active (see the module docstring).

    Args:
        model_or_params: an ``nn.Module`` (its parameters get their names) or parameters.
        optimizer: the optimizer whose state is counted (optional).
        also: more tensors that exist before the tracker starts, by category, e.g.
            ``{"parameters": corrections}`` for the corrections of compressed master weights.
    """

    def __init__(self, model_or_params: torch.nn.Module | Iterable[torch.Tensor],
                 optimizer: torch.optim.Optimizer | None = None,
                 also: Mapping[str, Iterable[torch.Tensor]] | None = None) -> None:
        super().__init__()
        also = dict(also or {})
        for category, tensors in list(also.items()):
            if category not in _CAT:
                raise ValueError(f"unknown category {category!r} in also; the categories are {CATEGORIES}")
            also[category] = list(tensors)
            if not all(isinstance(t, torch.Tensor) for t in also[category]):
                raise TypeError(f"also[{category!r}] must hold tensors")
        self.also = also
        if isinstance(model_or_params, torch.nn.Module):
            named = list(model_or_params.named_parameters())
        elif isinstance(model_or_params, torch.Tensor):
            named = [("0", model_or_params)]
        else:
            try:
                named = [(str(i), p) for i, p in enumerate(model_or_params)]
            except TypeError:
                raise TypeError(f"model_or_params must be an nn.Module or an iterable of parameters, got "
                                f"{type(model_or_params).__name__}") from None
        for _, p in named:
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"model_or_params must hold tensors, got a {type(p).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}")
        seen: set[int] = set()
        self.named_params = [(n, p) for n, p in named if id(p) not in seen and not seen.add(id(p))]
        self.optimizer = optimizer
        self.num_params = sum(p.numel() for _, p in self.named_params)
        self._records: list[_Storage] = []
        self._live: dict[int, _Storage] = {}  # storage key -> its record while alive
        self._finalizers: list[weakref.finalize] = []
        self._labels: list[tuple[str | None, str]] = []  # (phase, label) of every event
        self._phase: str | None = None
        self._phase_ends: dict[str, int] = {}
        self._hooks: list[Any] = []
        self._active = False
        self._used = False

    # ------------------------------------------------------------------ entering, phases
    def __enter__(self) -> "MemoryTracker":
        if self._used:
            raise RuntimeError("a MemoryTracker measures once: make a new one for another measurement")
        self._used = self._active = True
        self._event("start")
        for name, p in self.named_params:
            self._see(p, "parameters", name)
            if p.grad is not None:
                self._see(p.grad, "gradients", name)
            if p.requires_grad:
                self._hooks.append(p.register_hook(functools_partial(self._incoming_gradient, name, p)))
                self._hooks.append(p.register_post_accumulate_grad_hook(
                    functools_partial(self._accumulated_gradient, name)))
        for category, tensors in self.also.items():
            for t in tensors:
                self._see(t, category)
        self._see_optimizer_state()
        if self.optimizer is not None:
            self._hooks.append(self.optimizer.register_step_post_hook(lambda *_: self._after_step()))
        from . import release
        release._OBSERVERS.append(self._accumulated_gradient_of)
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self._event("end")
        self._active = False
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        from . import release
        release._OBSERVERS.remove(self._accumulated_gradient_of)
        for fin in self._finalizers:
            fin.detach()
        self._finalizers = []

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Events inside are of phase ``name``; what the phase "forward" makes counts as activations."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a phase is named by a non-empty str, got {name!r}")
        if not self._active:
            raise RuntimeError("phase() is used inside `with tracker:`")
        outer, self._phase = self._phase, name
        self._event(f"{name} begins")
        try:
            yield
        finally:
            self._event(f"{name} ends")
            self._phase_ends[name] = len(self._labels) - 1
            self._phase = outer

    # ------------------------------------------------------------------ recording
    def _event(self, label: str) -> int:
        self._labels.append((self._phase, label))
        return len(self._labels) - 1

    @staticmethod
    def _storage_of(t: torch.Tensor):
        if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
            return None  # a tensor subclass (its inner tensors are seen by their own ops)
        try:
            return t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return None

    def _see(self, t: torch.Tensor, category: str, name: str = "") -> None:
        """Count ``t``'s storage from now, or (already counted) give it ``category`` for its whole life."""
        storage = self._storage_of(t)
        if storage is None:
            return
        key = storage._cdata
        record = self._live.get(key)
        if record is None:
            self._new(storage, key, category, len(self._labels) - 1, name)
        elif _CAT[category] < _CAT[record.category]:  # parameters > gradients > state > activations > transient
            record.category, record.name = category, name
        if category == "gradients":
            self._claim_summands(self._live[key], name)

    @staticmethod
    def _claim_summands(record: _Storage, name: str) -> None:
        """A gradient that autograd summed from several contributions (a weight used twice, as a tied
        embedding): each contribution of its size was that gradient in part from its birth on."""
        todo = list(record.summands)
        while todo:
            part = todo.pop()
            if part.category == "transient" and part.nbytes == record.nbytes:
                part.category, part.name = "gradients", name
                todo.extend(part.summands)

    def _new(self, storage, key: int, category: str, born: int, name: str = "") -> None:
        record = _Storage(storage.nbytes(), category, born, name=name)
        self._records.append(record)
        self._live[key] = record
        self._finalizers.append(weakref.finalize(storage, self._freed, key, record))

    def _freed(self, key: int, record: _Storage) -> None:
        if not self._active or self._live.get(key) is not record:
            return
        del self._live[key]
        record.died = self._event("free")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {s._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
                  for s in [self._storage_of(t)] if s is not None}
        out = func(*args, **kwargs)
        index = None
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = self._storage_of(t)
            if storage is None:
                continue
            key = storage._cdata
            record = self._live.get(key)
            if record is not None and record.nbytes != storage.nbytes():  # resized in place
                record.died = index = self._event(str(func)) if index is None else index
                del self._live[key]
                self._new(storage, key, record.category, index, record.name)
            elif record is None and key not in inputs and storage.nbytes():  # a new storage, not a view
                index = self._event(str(func)) if index is None else index
                category = "activations" if self._phase == "forward" else "transient"
                self._new(storage, key, category, index)
                if category == "transient" and func in _SUMS:  # maybe the sum of a gradient's parts
                    self._live[key].summands = tuple(self._live[k] for k in inputs if k in self._live)
        return out

    # ------------------------------------------------------------------ hooks
    def _incoming_gradient(self, name: str, p: torch.Tensor, grad: torch.Tensor) -> None:
        """A parameter's gradient before it is accumulated: a gradient if its storage is exactly it."""
        storage = self._storage_of(grad)
        if storage is not None and storage.nbytes() == grad.numel() * grad.element_size() == \
                p.numel() * p.element_size():
            self._see(grad, "gradients", name)

    def _accumulated_gradient(self, name: str, p: torch.Tensor) -> None:
        if p.grad is not None:
            self._see(p.grad, "gradients", name)

    def _accumulated_gradient_of(self, p: torch.Tensor) -> None:
        """Called by gradient release before it steps ``p`` and frees its gradient."""
        for name, q in self.named_params:
            if q is p:
                self._accumulated_gradient(name, p)
                return

    def _after_step(self) -> None:
        """After each ``optimizer.step()``: its new states, the gradients it stepped with (one set by
        hand), and a parameter's new storage (a step that swaps ``p.data``, as
        :class:`adam8lib.master_weights.CompressedMasterWeights` does)."""
        if not self._active:
            return
        for name, p in self.named_params:
            self._see(p, "parameters", name)
            if p.grad is not None:
                self._see(p.grad, "gradients", name)
        self._see_optimizer_state()

    def _see_optimizer_state(self) -> None:
        if self.optimizer is None or not self._active:
            return
        from .memory import _stored_tensors
        for state in self.optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    for t in _stored_tensors(value):
                        self._see(t, "optimizer_state")

    # ------------------------------------------------------------------ reading
    def _sweep(self) -> Iterator[list[int]]:
        """Bytes per category after each event, in order."""
        n = len(self._labels)
        delta = [[0] * len(CATEGORIES) for _ in range(n + 1)]
        for r in self._records:
            c = _CAT[r.category]
            delta[r.born][c] += r.nbytes
            if r.died is not None:
                delta[r.died][c] -= r.nbytes
        live = [0] * len(CATEGORIES)
        for i in range(n):
            live = [a + b for a, b in zip(live, delta[i])]
            yield live

    def snapshot(self, event: int) -> Snapshot:
        """Live bytes after event number ``event`` (negative counts from the end)."""
        n = len(self._labels)
        if isinstance(event, bool) or not isinstance(event, int) or not -n <= event < n:
            raise ValueError(f"event must be an int in [{-n}, {n}), got {event!r}")
        event %= n
        for i, live in enumerate(self._sweep()):
            if i == event:
                break
        return self._snapshot(event, live)

    def _snapshot(self, event: int, live: list[int]) -> Snapshot:
        by_name: dict[str, int] = {}  # a gradient in parts (a tied weight's contributions) is summed
        for r in self._records:
            if r.category == "gradients" and r.born <= event and (r.died is None or r.died > event):
                by_name[r.name] = by_name.get(r.name, 0) + r.nbytes
        grads = sorted(by_name.items(), key=lambda x: (-x[1], x[0]))
        phase, label = self._labels[event]
        return Snapshot(event, phase, label, dict(zip(CATEGORIES, live)), tuple(grads))

    def peak(self, phase: str | None = None, categories: Iterable[str] = CATEGORIES) -> Snapshot:
        """The event with the most live bytes in ``categories`` (all by default), in ``phase`` (all by
        default); the first such event."""
        idx = [_CAT[c] for c in self._check_categories(categories)]
        best, best_live, best_total = None, None, -1
        for i, live in enumerate(self._sweep()):
            if phase is not None and self._labels[i][0] != phase:
                continue
            total = sum(live[c] for c in idx)
            if total > best_total:
                best, best_live, best_total = i, live, total
        if best is None:
            raise ValueError(f"no event in phase {phase!r}; the phases were {sorted(self._phase_ends)}")
        return self._snapshot(best, best_live)

    def at_end_of(self, phase: str) -> Snapshot:
        """Live bytes when ``phase`` ended (its last time)."""
        if phase not in self._phase_ends:
            raise ValueError(f"no phase {phase!r} was tracked; the phases were {sorted(self._phase_ends)}")
        return self.snapshot(self._phase_ends[phase])

    def timeline(self) -> dict[str, list]:
        """``{"event": [...], "phase": [...], "label": [...], <category>: [bytes, ...]}``: one entry per
        event (an op that made a storage, a free, a phase boundary), to plot."""
        out: dict[str, list] = {"event": [], "phase": [], "label": [], **{c: [] for c in CATEGORIES}}
        for i, live in enumerate(self._sweep()):
            out["event"].append(i)
            out["phase"].append(self._labels[i][0])
            out["label"].append(self._labels[i][1])
            for c, b in zip(CATEGORIES, live):
                out[c].append(b)
        return out

    @staticmethod
    def _check_categories(categories: Iterable[str]) -> list[str]:
        if isinstance(categories, str):
            categories = [categories]
        categories = list(categories)
        unknown = [c for c in categories if c not in _CAT]
        if unknown or not categories:
            raise ValueError(f"unknown categories {unknown}; the categories are {CATEGORIES}")
        return categories


def functools_partial(fn: Callable, *args: Any) -> Callable:
    """``functools.partial`` as a plain function (hooks are called with the tensor after ``args``)."""
    def call(*rest: Any) -> Any:
        return fn(*args, *rest)
    return call


def track_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               compute_loss: Callable[[], torch.Tensor],
               also: Mapping[str, Iterable[torch.Tensor]] | None = None) -> MemoryTracker:
    """Track one training step: phase "forward" (``loss = compute_loss()``), "backward"
    (``loss.backward()``) and, unless the optimizer's gradients are released (the step happened inside
    backward), "step" (``optimizer.step(); optimizer.zero_grad()``). ``also``: as for
    :class:`MemoryTracker`. Returns the tracker."""
    from .release import _LIVE

    if not callable(compute_loss):
        raise TypeError("compute_loss must be a callable that returns the loss")
    released = any(h.optimizer is optimizer and not h.removed for h in list(_LIVE))
    tracker = MemoryTracker(model, optimizer, also)
    with tracker:
        with tracker.phase("forward"):
            loss = compute_loss()
        with tracker.phase("backward"):
            loss.backward()
            del loss
        if not released:
            with tracker.phase("step"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    return tracker
