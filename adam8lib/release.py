"""Gradient release: the optimizer step fused into the backward pass (issue 37).

An ordinary training step keeps a gradient for every parameter until ``optimizer.step()``: the whole
model's gradients exist at once. With gradient release each parameter is stepped as soon as its gradient
is complete, and its gradient is freed right away (torch's tutorial "How to save memory by fusing the
optimizer step into the backward pass", with ``Tensor.register_post_accumulate_grad_hook``)::

    handle = adam8lib.release_gradients(model, optimizer)
    for batch in data:
        loss_fn(model(batch)).backward()   # every parameter is stepped inside backward
        scheduler.step()                   # (if any) as after optimizer.step()
    handle.remove()                        # back to ordinary steps

**The same step, bit for bit.** The hook of parameter ``p`` calls ``optimizer.step()`` with ``p`` the only
parameter visible: its group's ``params`` is ``[p]`` and the other groups hold no parameters (they stay in
their places, so a message names the right group), then everything is restored. Every optimizer of this
library, and torch's (single-tensor path), steps each parameter on its own with its group's hyper-parameters,
so this is the ordinary step's arithmetic (tests/test_release.py checks every class, with schedulers and with
a checkpoint resumed mid-run). One thing of the ordinary step depends on the other parameters: with
``stochastic_rounding=True`` (:class:`~adam8lib.optim.LowBitAdam`) the random bits of a parameter are seeded
by its *index*, its place among the parameters stepped together. The hook gives ``p`` the index it has in a
full step where every parameter has a gradient: during its one-parameter step the optimizer's per-parameter
update is given that index (the optimizer's ``rounding_offset``, added to the index 0 it would get alone: the
public hook of the one core, :class:`~adam8lib.quantized_state.QuantizedStateOptimizer`, and so of
:class:`~adam8lib.optim.LowBitAdam` and the family), one update per parameter; a parameter that gets no
gradient in some backward (unused in the forward) would shift the later indices of an ordinary step, not of
this one.

**Shared (tied) parameters** are one tensor: one hook, one step per backward, after the gradients of
all its uses are summed.

**What it cannot do, and what it does instead** (each refused with :class:`GradientReleasedError`):

* ``optimizer.step()`` called by hand while released: the parameters were stepped already.
* ``torch.nn.utils.clip_grad_norm_`` on released parameters: the global norm needs every gradient,
  and each one is gone before the last is computed. The recipe that works: two backward passes,
  :meth:`ReleaseHandle.backward_clipped` -- the first only measures each gradient's norm and frees it,
  the second scales each gradient by ``clip_grad_norm_``'s factor and steps it; the same numbers as
  ``backward(); clip_grad_norm_(); step()`` bit for bit, for a second backward's time (the activations
  are kept for it, as they are during any backward). Or clip by value or per parameter in your own hook.
* Gradient accumulation: ``accumulate=k`` steps each parameter at its k-th backward and frees its
  gradient then, the same as ``k`` backward passes, one ``step()`` and ``zero_grad()``; between the
  micro-batches the gradients are kept (they are summed), so the memory saved is that of the last one.

**Real training loops** (issue 54):

* ``requires_grad`` may be toggled after ``release_gradients()``. Every parameter of the optimizer gets a hook,
  frozen ones too (a frozen parameter's hook never fires: no gradient reaches it), so a parameter unfrozen
  later (progressive unfreezing) is stepped from its first backward on, and one frozen later simply stops; a
  parameter added to the optimizer later (``add_param_group``) is released at the next backward. The
  stochastic-rounding indices are those of the full step at each backward (the trainable parameters then).
  The same bits as the ordinary loop with the same toggles. (Freezing a parameter in the middle of an
  accumulation window keeps its partial sum for when it is unfrozen; the ordinary loop would step it.)
* A setting the optimizer refuses is reported as in an ordinary step: the hook shows the optimizer every param
  group (the others with no parameters), so a message names the group the setting is in; the exception also
  gets a note naming the parameter whose step raised.
* **A backward that raises partway** (out of memory, anomaly detection, a hook or an autograd function that
  raises) cannot be undone: the parameters whose gradients were complete before the failure were stepped
  (an optimizer step is not reversible without a copy of the whole state), the others were not. So it says
  exactly what happened, and does not go on silently: the exception gets a note naming the parameters that
  were stepped and those that were not; every gradient left by the failed backward is dropped (a released
  parameter holds no half-summed gradient; with ``accumulate`` > 1 the parameters not stepped start their
  window again, and the note names those whose earlier micro-batches were dropped); the record is kept in
  :attr:`ReleaseHandle.interrupted` (an :class:`InterruptedBackward`), and the next backward is refused
  (:class:`GradientReleasedError`, before anything runs) until :meth:`ReleaseHandle.resume` says to go on with
  the model as it is -- or reload a checkpoint. A backward that raises before any parameter was stepped
  leaves nothing to resume (its gradients are dropped, nothing else changed). To see where each backward
  begins and ends, ``torch.autograd.backward`` (which ``Tensor.backward`` calls) is wrapped while a handle
  lives, as ``clip_grad_norm_`` is; a backward run by the autograd engine directly is not seen. A backward
  inside the backward (reentrant activation checkpointing) is part of the outer one.

Two more things to know (not detected): one backward is one step -- two losses backpropagated one after
the other, or ``backward(retain_graph=True)`` twice, step every parameter twice (sum the losses first,
or use ``accumulate``); and fp16 loss scaling (``torch.amp.GradScaler``) does not fit: the hook steps
with the *scaled* gradients, before ``scaler.unscale_`` or its inf check could run (``scaler.step`` is
then refused, too late). bf16 needs no loss scaling.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Iterable

import torch

__all__ = ["release_gradients", "ReleaseHandle", "GradientReleasedError", "InterruptedBackward"]


class GradientReleasedError(RuntimeError):
    """Something an ordinary training step does that gradient release cannot (see the module docstring)."""


#: The live handles; ``clip_grad_norm_`` is guarded while there is one.
_LIVE: "weakref.WeakSet[ReleaseHandle]" = weakref.WeakSet()
_ORIGINAL_CLIP = None
#: Called with each parameter whose gradient is complete, before it is stepped and freed
#: (:class:`adam8lib.memory_tracker.MemoryTracker` names the gradient there).
_OBSERVERS: list = []
#: ``torch.autograd.backward`` as it was before the guard wrapped it, and the depth of backward calls in
#: progress (a backward inside a backward, reentrant checkpointing: depth 2; global, not per thread: on a GPU
#: the hooks run in the autograd engine's threads)
_ORIGINAL_BACKWARD = None
_BACKWARD_DEPTH = 0


@dataclass(frozen=True)
class InterruptedBackward:
    """What a backward that raised partway did under gradient release (:attr:`ReleaseHandle.interrupted`).

    ``stepped``: the parameters stepped in it (they keep that step); ``not_stepped``: the trainable released
    parameters that were not (their gradients of that backward are dropped); ``dropped``: those of them whose
    gradients summed over earlier micro-batches were dropped too (``accumulate`` > 1: their window starts
    again); ``error``: the exception. Parameters are named as in the model (or ``param_groups[g]['params'][i]``)."""
    stepped: tuple[str, ...]
    not_stepped: tuple[str, ...]
    dropped: tuple[str, ...]
    error: str

    def __str__(self) -> str:
        total = len(self.stepped) + len(self.not_stepped)
        text = (f"the backward raised ({self.error}) after stepping {len(self.stepped)} of {total} parameters "
                f"({_names(self.stepped)}): they keep that step; not stepped: {_names(self.not_stepped)} "
                f"(their gradients of that backward are dropped)")
        if self.dropped:
            text += (f"; the gradients summed since their last step were dropped for {_names(self.dropped)} "
                     f"(their accumulation starts again)")
        return text


def _names(names: tuple[str, ...], most: int = 6) -> str:
    if not names:
        return "none"
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


class ReleaseHandle:
    """What :func:`release_gradients` returns: the hooks it registered. ``remove()`` takes them away."""

    def __init__(self, params: list[torch.Tensor], optimizer: torch.optim.Optimizer, accumulate: int,
                 names: dict[int, str] | None = None) -> None:
        self.optimizer = optimizer
        self.accumulate = accumulate
        #: every parameter released: the optimizer's, frozen ones too (their hooks fire once they are unfrozen)
        self.params: list[torch.Tensor] = []
        self._ids: set[int] = set()
        self._counts: dict[int, int] = {}
        self._names = dict(names or {})
        self._stepping = False
        #: during backward_clipped: None (step), "norm" (first pass: measure, free) or the clip factor (second)
        self._norms: dict[int, torch.Tensor] | None = None
        self._scale: torch.Tensor | None = None
        #: what the backward in progress did: the parameters it stepped, the ids of those it counted
        self._pass_stepped: list[torch.Tensor] = []
        self._pass_counted: set[int] = set()
        #: a backward that raised partway (see the module docstring); the next one is refused until resume()
        self.interrupted: InterruptedBackward | None = None
        self._hooks = [optimizer.register_step_pre_hook(self._refuse_manual_step)]
        for p in params:
            self._release(p)
        self._index = self._stochastic_rounding_indices()
        self.removed = False
        _LIVE.add(self)
        _guard_clip_grad_norm()
        _guard_backward()

    def _release(self, p: torch.Tensor) -> None:
        """Register ``p``'s hook; a frozen parameter's too (torch registers hooks on tensors that require a
        gradient only: it requires one for the registration; the hook stays when it is frozen again)."""
        frozen = not p.requires_grad
        if frozen:
            p.requires_grad_(True)
        try:
            self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))
        finally:
            if frozen:
                p.requires_grad_(False)
        self.params.append(p)
        self._ids.add(id(p))
        self._counts[id(p)] = 0

    # ------------------------------------------------------------------ hooks
    def _on_grad(self, p: torch.Tensor) -> None:
        for observe in list(_OBSERVERS):
            observe(p)
        if self._norms is not None:  # backward_clipped's first pass: the norm only, then free it
            self._norms[id(p)] = _grad_norm(p.grad)
            p.grad = None
            return
        if self._scale is not None:  # its second pass: clip_grad_norm_'s scaling, then the step
            _scale_grad(p.grad, self._scale)
        key = id(p)
        recording = _BACKWARD_DEPTH > 0  # inside a backward the guard sees (else no record: nothing to clear it)
        self._counts[key] += 1
        if recording:
            self._pass_counted.add(key)
        if self._counts[key] < self.accumulate:
            return  # keep summing: an accumulation micro-batch
        self._counts[key] = 0
        self._step_one(p)
        p.grad = None
        if recording:
            self._pass_stepped.append(p)

    def _refuse_manual_step(self, optimizer, args, kwargs) -> None:
        if not self._stepping:
            raise GradientReleasedError(
                f"{type(optimizer).__name__}.step() was called while its gradients are released: every parameter "
                f"is stepped inside backward already (and its gradient freed). Drop the call, or call "
                f"handle.remove() first to go back to ordinary steps.")

    def _step_one(self, p: torch.Tensor) -> None:
        """``optimizer.step()`` with only ``p`` visible (see the module docstring): every param group stays in
        its place (a message names the right one), ``p``'s holds ``[p]``, the others nothing."""
        opt = self.optimizer
        groups = opt.param_groups
        gi, group = self._group_of(p)
        offset = self._index.get(id(p), 0)
        saved = [g["params"] for g in groups]
        for g in groups:
            g["params"] = [p] if g is group else []
        if offset:
            # stochastic rounding seeds by the place in the step: p is update 0 of this step, so the
            # optimizer's public hook shifts it to its full-step index
            opt.rounding_offset = offset
        self._stepping = True
        try:
            opt.step()
        except Exception as exc:
            exc.add_note(f"gradient release: raised by the step of {self._name(p)!r} (shape {tuple(p.shape)}, "
                         f"param group {gi}), inside backward")
            raise
        finally:
            self._stepping = False
            if offset:
                del opt.rounding_offset  # the instance attribute: back to the class's 0
            for g, params in zip(groups, saved):
                g["params"] = params

    def _group_of(self, p: torch.Tensor) -> tuple[int, dict]:
        for gi, g in enumerate(self.optimizer.param_groups):
            if any(q is p for q in g["params"]):
                return gi, g
        raise GradientReleasedError(f"a released parameter of shape {tuple(p.shape)} is in no param group of "
                                    f"{type(self.optimizer).__name__} any more: call handle.remove() first")

    def _name(self, p: torch.Tensor) -> str:
        """``p``'s name in the model, else its place in the optimizer."""
        name = self._names.get(id(p))
        if name is not None:
            return name
        for gi, g in enumerate(self.optimizer.param_groups):
            for pi, q in enumerate(g["params"]):
                if q is p:
                    names = g.get("param_names")
                    return names[pi] if names and pi < len(names) else f"param_groups[{gi}]['params'][{pi}]"
        return f"a parameter of shape {tuple(p.shape)}"

    # ------------------------------------------------------------------ where a backward begins and ends
    def _before_backward(self) -> None:
        """At the start of each (outermost) backward: refuse after an unresumed interruption; release the
        parameters added to the optimizer since; the stochastic-rounding indices of the trainable ones now."""
        if self.interrupted is not None:
            raise GradientReleasedError(
                f"the last backward raised partway under gradient release: {self.interrupted}. Call handle.resume() "
                f"to go on with the model as it is (or reload a checkpoint); this backward was not run")
        self._pass_stepped, self._pass_counted = [], set()
        for g in self.optimizer.param_groups:
            for p in g["params"]:
                if id(p) not in self._ids:
                    _check_releasable(p, self)
                    self._release(p)
        self._index = self._stochastic_rounding_indices()

    def _after_backward(self, exc: BaseException | None) -> None:
        stepped, counted = self._pass_stepped, self._pass_counted
        self._pass_stepped, self._pass_counted = [], set()
        if exc is None:
            return
        done = {id(p) for p in stepped}
        if self.accumulate == 1:
            dropped = []
        elif not stepped and not counted:
            return  # no gradient of a released parameter was completed: the summed ones are intact
        else:
            dropped = [p for p in self.params if id(p) not in done and self._counts[id(p)] > (id(p) in counted)]
        for p in self.params:
            if id(p) not in done and (p.requires_grad or id(p) in counted):
                p.grad = None  # nothing half-summed is left for the next backward
                self._counts[id(p)] = 0
        if not stepped and not dropped:
            return  # nothing was stepped and nothing of earlier backward passes lost: nothing to say
        record = InterruptedBackward(
            stepped=tuple(self._name(p) for p in stepped),
            not_stepped=tuple(self._name(p) for p in self.params if id(p) not in done and p.requires_grad),
            dropped=tuple(self._name(p) for p in dropped),
            error=" ".join(f"{type(exc).__name__}: {exc}".split())[:200])
        self.interrupted = record
        exc.add_note(f"gradient release: {record}. The handle refuses the next backward until handle.resume() "
                     f"(handle.interrupted holds this record)")

    def resume(self) -> InterruptedBackward | None:
        """Go on after a backward that raised partway (:attr:`interrupted`, see the module docstring), with the
        model as it is: the parameters it stepped keep that step. Returns the record (None if there was none)."""
        record, self.interrupted = self.interrupted, None
        return record

    def _stochastic_rounding_indices(self) -> dict[int, int]:
        """``{id(p): index}``: each parameter's place in a full step, where the optimizer seeds stochastic
        rounding by it (an optimizer with ``stochastic_rounding=True``: LowBitAdam, the family's classes; else none)."""
        if not getattr(self.optimizer, "stochastic_rounding", False):
            return {}
        order = [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]
        return {id(p): i for i, p in enumerate(order)}

    # ------------------------------------------------------------------ global-norm clipping
    def backward_clipped(self, loss: torch.Tensor, max_norm: float) -> torch.Tensor:
        """``loss.backward()``, ``torch.nn.utils.clip_grad_norm_(params, max_norm)`` (2-norm) and the step, with
        released gradients: two backward passes. The first measures each gradient's norm as it is completed
        and frees it at once; the total norm and the factor ``min(max_norm / (total + 1e-6), 1)`` are then
        computed as ``clip_grad_norm_`` computes them (the per-tensor norms grouped by device and dtype,
        in parameter order); the second pass scales each gradient by that factor and steps it. Bit for
        bit the ordinary ``backward(); clip_grad_norm_(); step()``, for a second backward pass (the graph
        is kept for it: ``retain_graph=True`` in the first). Returns the total norm, as ``clip_grad_norm_``
        does. Not with ``accumulate`` > 1 (the norm of a sum over micro-batches needs the sum: clip the
        last micro-batch's ``backward_clipped`` yourself, or accumulate without release)."""
        if self.removed:
            raise GradientReleasedError("backward_clipped on a removed handle: call clip_grad_norm_ as usual")
        if self.accumulate != 1:
            raise ValueError(f"backward_clipped needs accumulate=1 (this handle accumulates {self.accumulate} "
                             f"backward passes): the global norm of an accumulated gradient needs the whole sum")
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise TypeError("loss must be a tensor that requires grad (the output of the forward pass)")
        if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0:
            raise ValueError(f"max_norm must be a number > 0, got {max_norm!r}")
        self._norms = {}
        try:
            loss.backward(retain_graph=True)
            norms, self._norms = self._norms, None
        except BaseException:
            self._norms = None
            raise
        got = [p for p in self.params if id(p) in norms]  # clip_grad_norm_ skips the parameters without one
        if not got:
            return torch.tensor(0.0)
        # clip_grad_norm_'s order: grouped by (device, dtype), groups in order of first appearance
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for p in got:
            groups.setdefault((p.device, p.dtype), []).append(norms[id(p)])
        first = got[0].device
        total = torch.linalg.vector_norm(torch.stack([n.to(first) for ns in groups.values() for n in ns]), 2.0)
        self._scale = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
        try:
            loss.backward()
        finally:
            self._scale = None
        return total

    # ------------------------------------------------------------------ removal
    def remove(self) -> None:
        """Remove every hook: back to ordinary ``backward(); step()``. Gradients summed by an unfinished
        accumulation (``accumulate`` > 1) stay in ``.grad``. Removing twice does nothing."""
        if self.removed:
            return
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self.removed = True
        _LIVE.discard(self)
        if not len(_LIVE):
            _unguard_clip_grad_norm()
            _unguard_backward()

    def releases(self, p: torch.Tensor) -> bool:
        """Whether ``p``'s gradient is released by this (live) handle."""
        return not self.removed and id(p) in self._ids

    def __enter__(self) -> "ReleaseHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "removed" if self.removed else "live"
        return (f"ReleaseHandle({len(self.params)} parameters of {type(self.optimizer).__name__}, "
                f"accumulate={self.accumulate}, {state})")


def release_gradients(model_or_params: torch.nn.Module | Iterable[torch.Tensor], optimizer: torch.optim.Optimizer,
                      *, accumulate: int = 1) -> ReleaseHandle:
    """Step every parameter of ``model_or_params`` inside backward, as soon as its gradient is complete,
    and free the gradient (see the module docstring). Returns a :class:`ReleaseHandle`.

    Args:
        model_or_params: an ``nn.Module`` or parameters (named as in the module in messages). Together they
            must be every trainable parameter of ``optimizer`` (a parameter left out would wait for a
            ``step()`` that is refused). The optimizer's frozen parameters (``requires_grad=False``) are
            released too: unfrozen later, they are stepped; frozen ones outside the optimizer are skipped.
        optimizer: any ``torch.optim.Optimizer`` whose step updates each parameter on its own (every
            optimizer of adam8lib; torch's Adam/AdamW/SGD...).
        accumulate: step at every ``accumulate``-th backward (gradient accumulation), default 1.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
        raise ValueError(f"accumulate must be an int >= 1 (backward passes per step), got {accumulate!r}")
    if isinstance(model_or_params, torch.nn.Module):
        given = list(model_or_params.parameters())
    elif isinstance(model_or_params, torch.Tensor):
        given = [model_or_params]
    else:
        try:
            given = list(model_or_params)
        except TypeError:
            raise TypeError(f"model_or_params must be an nn.Module or an iterable of parameters, got "
                            f"{type(model_or_params).__name__}") from None
    params, seen = [], set()
    for p in given:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"model_or_params must hold tensors, got a {type(p).__name__}")
        if p.requires_grad and id(p) not in seen:  # a tied parameter once
            seen.add(id(p))
            params.append(p)
    if not params:
        raise ValueError("no parameter that requires a gradient: nothing to release")
    in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
    outside = [tuple(p.shape) for p in params if id(p) not in in_optimizer]
    if outside:
        raise ValueError(f"{len(outside)} parameter(s) are not in the optimizer (shapes {outside[:3]}"
                         f"{'...' if len(outside) > 3 else ''}): release only what the optimizer steps")
    trainable = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    left = [tuple(p.shape) for p in trainable if id(p) not in seen]
    if left:
        raise ValueError(f"{len(left)} trainable parameter(s) of the optimizer are not released (shapes {left[:3]}"
                         f"{'...' if len(left) > 3 else ''}): their step() would be refused; release every "
                         f"parameter of the optimizer, or give the others an optimizer of their own")
    # the frozen parameters of the optimizer are released too (unfrozen later, they are stepped): in the order
    # given (a module's), then the optimizer's
    released, ids = [], set()
    for p in list(given) + [q for g in optimizer.param_groups for q in g["params"]]:
        if id(p) in in_optimizer and id(p) not in ids:
            ids.add(id(p))
            released.append(p)
    for p in released:
        _check_releasable(p)
    names = {}
    if isinstance(model_or_params, torch.nn.Module):
        for name, p in model_or_params.named_parameters():  # a tied parameter: its first name
            names.setdefault(id(p), name)
    return ReleaseHandle(released, optimizer, accumulate, names)


def _check_releasable(p: torch.Tensor, by: ReleaseHandle | None = None) -> None:
    """ValueError for a parameter no hook can step: not a leaf, or released by another live handle."""
    if not p.is_leaf:
        raise ValueError(f"a parameter of shape {tuple(p.shape)} is not a leaf tensor: only leaves accumulate "
                         f"gradients")
    for handle in list(_LIVE):
        if handle is not by and handle.releases(p):
            raise ValueError(f"a parameter of shape {tuple(p.shape)} is released already by {handle!r}: "
                             f"remove that handle first")


# ---------------------------------------------------------------------- where a backward begins and ends
def _guarded_backward(*args, **kwargs):
    """``torch.autograd.backward`` while a handle lives: each handle is told where the outermost backward
    begins (it may refuse it: an unresumed interruption) and how it ended (it raised: what was stepped)."""
    global _BACKWARD_DEPTH
    handles = [h for h in list(_LIVE) if not h.removed] if _BACKWARD_DEPTH == 0 else []
    for handle in handles:
        handle._before_backward()
    _BACKWARD_DEPTH += 1
    try:
        result = _ORIGINAL_BACKWARD(*args, **kwargs)
    except BaseException as exc:
        _BACKWARD_DEPTH -= 1
        for handle in handles:
            handle._after_backward(exc)
        raise
    _BACKWARD_DEPTH -= 1
    for handle in handles:
        handle._after_backward(None)
    return result


def _guard_backward() -> None:
    global _ORIGINAL_BACKWARD
    if _ORIGINAL_BACKWARD is not None:
        return  # in place (or still in the chain below another wrapper: it does nothing without a handle)
    _ORIGINAL_BACKWARD = torch.autograd.backward
    functools.update_wrapper(_guarded_backward, _ORIGINAL_BACKWARD)
    torch.autograd.backward = _guarded_backward


def _unguard_backward() -> None:
    global _ORIGINAL_BACKWARD
    if _ORIGINAL_BACKWARD is not None and torch.autograd.backward is _guarded_backward:
        torch.autograd.backward = _ORIGINAL_BACKWARD
        _ORIGINAL_BACKWARD = None


# ---------------------------------------------------------------------- clip_grad_norm_ guard
def _released(parameters) -> bool:
    tensors = [parameters] if isinstance(parameters, torch.Tensor) else parameters
    return any(handle.releases(p) for handle in list(_LIVE) for p in tensors if isinstance(p, torch.Tensor))


def _guard_clip_grad_norm() -> None:
    """While a handle lives, ``torch.nn.utils.clip_grad_norm_`` raises on released parameters (it would
    see no gradient and silently clip nothing)."""
    global _ORIGINAL_CLIP
    if _ORIGINAL_CLIP is not None:
        return
    original = torch.nn.utils.clip_grad_norm_

    @functools.wraps(original)
    def clip_grad_norm_(parameters, *args, **kwargs):
        if not isinstance(parameters, torch.Tensor):
            parameters = list(parameters)  # a generator is read once: keep it for the real call
        if _released(parameters):
            raise GradientReleasedError(
                "clip_grad_norm_ on parameters whose gradients are released: each gradient is freed when it is "
                "complete, so the global norm is never known before a step. Clip by value or per parameter in "
                "your own hook, compute the norm in a first backward pass and step in a second, or train "
                "without gradient release.")
        return original(parameters, *args, **kwargs)

    _ORIGINAL_CLIP = original
    torch.nn.utils.clip_grad_norm_ = clip_grad_norm_
    torch.nn.utils.clip_grad.clip_grad_norm_ = clip_grad_norm_


def _unguard_clip_grad_norm() -> None:
    global _ORIGINAL_CLIP
    if _ORIGINAL_CLIP is None:
        return
    torch.nn.utils.clip_grad_norm_ = _ORIGINAL_CLIP
    torch.nn.utils.clip_grad.clip_grad_norm_ = _ORIGINAL_CLIP
    _ORIGINAL_CLIP = None


# ---------------------------------------------------------------------- clip_grad_norm_'s arithmetic
def _grad_norm(grad: torch.Tensor) -> torch.Tensor:
    """One gradient's 2-norm the way ``clip_grad_norm_`` computes it (foreach where torch supports it)."""
    from torch.utils._foreach_utils import _has_foreach_support

    if _has_foreach_support([grad], grad.device):
        return torch._foreach_norm([grad], 2.0)[0]
    return torch.linalg.vector_norm(grad, 2.0)


def _scale_grad(grad: torch.Tensor, scale: torch.Tensor) -> None:
    """``clip_grad_norm_``'s in-place scaling of one gradient by the clamped factor."""
    from torch.utils._foreach_utils import _has_foreach_support

    if _has_foreach_support([grad], grad.device):
        torch._foreach_mul_([grad], scale.to(grad.device))
    else:
        grad.mul_(scale.to(grad.device))
