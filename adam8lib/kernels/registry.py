"""One registry of fused optimizer steps, keyed by what a step can do: (update rule, state format, device).

A fused step is a kernel that does what :class:`adam8lib.quantized_state.QuantizedStateOptimizer`'s
reference step does for one rule (:mod:`adam8lib.rules`) and the state formats it accepts
(:mod:`adam8lib.formats`), on the devices its backend supports, bit for bit on the CPU. The calling
convention::

    fn(p, g, states, *, rule, fmt, shape, step, group) -> None        # in place

* ``p``, ``g``: the parameter and its gradient, flat and contiguous (``p``: fp32, bf16 or fp16);
* ``states``: one entry per ``rule.states``, in order: ``(codes, absmax)`` for a quantized state
  (flat codes in the moment format ``fmt.m`` or ``fmt.v`` that ``StateSpec.stored_as`` names, flat
  fp32 scales), ``(values,)`` for an fp32 one or one the rule keeps unquantized (``StateSpec.kept``: flat, in
  its dtype; Adan's previous gradient);
* ``rule``: the :class:`~adam8lib.rules.base.UpdateRule`; ``fmt``: the
  :class:`~adam8lib.formats.StateFormat` (its block size is the one that counts); ``shape``: the
  parameter's shape; ``step``: the step count t of this step (from 1); ``group``: the rule's
  hyper-parameters by its own names.

Elementwise rules follow the core's non-finite rule (an element whose new state is not finite has
every state reset to 0 and keeps its parameter). The caller has checked groups, parameters and
states (a step that raises changes nothing); the step still checks every tensor it reads through a
pointer and raises TypeError/ValueError before it changes anything.

Finding a step for a device (``find_step``, ``registered_steps``, ``backends_for``) is
:mod:`adam8lib.kernels`'s: it knows the backends and their order.

A step says which formats it accepts with ``formats``: a tuple of format names, or a predicate on
the :class:`~adam8lib.formats.StateFormat` (e.g. "blockwise, one byte per code"), so a user-made
format with the same layout finds the same kernel.

``many(items, *, rule, fmt, shapes, steps, group)`` (optional at registration) steps several tensors of
one group on one device in one call, each as ``fn`` would: ``items`` holds ``(p, g, states)`` per tensor as
``fn`` takes them, ``shapes`` and ``steps`` one entry per tensor. The 8-bit Adam steps have one (the backend's
``step_many``: what Adam8bit's batched step calls). Registered today: the 8-bit Adam backends and the FP8 and
4-bit Adam kernels as ``"adamw"`` (:func:`adam8lib.kernels.register_adam_step`), and the rule templates
of Lion, AdEMAMix, RMSprop, Adagrad and Adan (:mod:`.cpu_rules`, :mod:`.triton_rules`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

__all__ = ["FusedStep", "register_step", "steps", "matching", "FP32_FORMAT"]

#: The format name of plain fp32 states (what ``find_step`` takes for ``fmt=None``).
FP32_FORMAT = "fp32"


def _format_name(fmt: Any) -> str:
    if fmt is None:
        return FP32_FORMAT
    return fmt if isinstance(fmt, str) else fmt.name


def _rule_name(rule: Any) -> str:
    name = rule if isinstance(rule, str) else getattr(rule, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"rule must be an update rule or its name, got {rule!r}")
    return name


@dataclass(frozen=True)
class FusedStep:
    """One registered fused step (see the module docstring for ``fn``'s arguments)."""

    rule: str
    backend: str
    fn: Callable[..., None]
    formats: tuple[str, ...] | Callable[[Any], bool]
    supports: Callable[[torch.device], bool]
    #: optional: several tensors of one group in one call, ``many(items, *, rule, fmt, shapes, steps, group)``
    many: Callable[..., None] | None = None

    def accepts(self, fmt: Any) -> bool:
        """Whether this step stores states in ``fmt`` (a StateFormat, a name, or None for fp32)."""
        if callable(self.formats):
            if fmt is None or isinstance(fmt, str):
                return False  # a predicate judges a StateFormat's layout, not a bare name
            return bool(self.formats(fmt))
        return _format_name(fmt) in self.formats

    def names(self) -> tuple[str, ...]:
        """The format names this step is known to accept (those of the built-in formats for a predicate)."""
        if not callable(self.formats):
            return self.formats
        from ..formats import FORMATS, get_format

        return tuple(name for name in FORMATS if self.formats(get_format(name)))


_STEPS: list[FusedStep] = []
_VERSION = [0]


def version() -> int:
    """A number that changes with every registration: what a caller that remembers a found step compares."""
    return _VERSION[0]


def register_step(rule: str, backend: str, fn: Callable[..., None], *,
                  formats: Iterable[str] | Callable[[Any], bool], supports: Callable[[torch.device], bool],
                  many: Callable[..., None] | None = None) -> FusedStep:
    """Register ``fn`` as the fused step of ``rule`` on ``backend`` for the formats it accepts.

    A later registration for the same rule, backend and formats replaces the earlier one."""
    rule = _rule_name(rule)
    if not isinstance(backend, str) or not backend:
        raise TypeError(f"backend must be a non-empty string, got {backend!r}")
    if not callable(fn) or not callable(supports):
        raise TypeError("fn and supports must be callable")
    if not callable(formats):
        formats = tuple(formats)
        if not formats or not all(isinstance(f, str) for f in formats):
            raise TypeError(f"formats must be format names or a predicate, got {formats!r}")
    entry = FusedStep(rule, backend, fn, formats, supports, many)
    _STEPS[:] = [s for s in _STEPS if not (s.rule == rule and s.backend == backend and s.formats == formats)]
    _STEPS.append(entry)
    _VERSION[0] += 1
    return entry


def steps() -> list[FusedStep]:
    """Every step registered so far (:func:`adam8lib.kernels.registered_steps` imports the optional
    backends' modules first, so that their steps are in)."""
    return list(_STEPS)


def matching(steps_: list[FusedStep], rule: Any, fmt: Any) -> list[FusedStep]:
    """The steps of ``steps_`` for ``rule`` (a name or an UpdateRule) that accept ``fmt``. An UpdateRule
    named like one of the library's rules but computing something else
    (:func:`adam8lib.rules.is_library_rule`) has none: a step is the kernel of the rule it was written for."""
    name = _rule_name(rule)
    if not isinstance(rule, str):
        from ..rules import is_library_rule

        if not is_library_rule(rule):
            return []
    return [s for s in steps_ if s.rule == name and s.accepts(fmt)]
