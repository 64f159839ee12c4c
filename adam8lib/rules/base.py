"""What an update rule is: the states it keeps, its hyper-parameters, and one fp32 step (issue 35).

An optimizer of the family is an **update rule** (this module and its neighbours) x a **state format**
per state (:mod:`adam8lib.formats`: 8-bit, 4-bit, FP8, or plain fp32) x a backend (here the reference
step, :mod:`adam8lib.quantized_state`). The rule knows nothing about quantization: it is handed fp32
copies of the parameter and the gradient and the fp32 values of its states, updates the states in
place and returns the new fp32 parameter. The optimizer decodes the states before and encodes them
after, so the same rule runs with fp32 states (``Lion``), 8-bit ones (``Lion8bit``) or 4-bit ones
(``Lion4bit``).

A :class:`StateSpec` names a state and says which of a state format's two moment formats stores it:
``"m"`` (signed: the signed dynamic map in 8 bits) or ``"v"`` (never negative: the unsigned map); or that
it is **kept** in a plain dtype whatever the format (``kept="fp32"`` or ``"bf16"``): a state that is not a
moment, such as Adan's previous gradient, which quantizing would turn into another algorithm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch

__all__ = ["StateSpec", "UpdateRule", "KEPT_DTYPES", "check_number", "check_beta", "check_int", "fp32_step"]

#: The dtypes a state can be kept in whatever the format (:attr:`StateSpec.kept`).
KEPT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class StateSpec:
    """One state of a rule: its key in the optimizer's state, and the moment format that stores it
    (``"m"``: the state format's signed one, ``"v"``: its one for values that are never negative).

    Where it is stored: kept in fp32, ``state[name]``; quantized, its codes ``state[codes_key]`` and its
    scales ``state[scales_key]`` (by default ``name + "_codes"`` and ``name + "_absmax"``; a rule whose
    checkpoints have other keys names them, e.g. the low-bit Adam classes' ``"state1"``/``"absmax1"``).

    ``kept``: ``"fp32"`` or ``"bf16"`` keeps the state in that dtype in every format (``state[name]``, the
    parameter's shape; never codes): the rule is handed its fp32 values and what it writes is stored back
    (rounded to nearest for bf16). ``None`` (default): stored in the format's moment ``stored_as``."""

    name: str
    stored_as: str = "m"
    codes: str | None = None
    scales: str | None = None
    kept: str | None = None

    def __post_init__(self) -> None:
        if self.stored_as not in ("m", "v"):
            raise ValueError(f"StateSpec.stored_as must be 'm' or 'v', got {self.stored_as!r}")
        if self.kept not in (None, *KEPT_DTYPES):
            raise ValueError(f"StateSpec.kept must be None, 'fp32' or 'bf16', got {self.kept!r}")
        if self.kept is not None and (self.codes is not None or self.scales is not None):
            raise ValueError(f"StateSpec {self.name!r}: a kept state has no codes or scales keys")
        for what in (self.codes, self.scales):
            if what is not None and (not isinstance(what, str) or not what or what in (self.name, "step")):
                raise ValueError(f"StateSpec {self.name!r}: a storage key must be a new non-empty string, got {what!r}")

    @property
    def kept_dtype(self) -> torch.dtype | None:
        """The dtype of a kept state (None: quantized in the format, or fp32 with fp32 states)."""
        return None if self.kept is None else KEPT_DTYPES[self.kept]

    @property
    def codes_key(self) -> str:
        """The key of this state's codes when it is quantized."""
        return self.name + "_codes" if self.codes is None else self.codes

    @property
    def scales_key(self) -> str:
        """The key of this state's scales when it is quantized."""
        return self.name + "_absmax" if self.scales is None else self.scales


class UpdateRule:
    """An optimizer's update in fp32, and nothing else.

    Subclasses set :attr:`name`, :attr:`states` and :attr:`hyperparameters` (the param-group keys it
    reads, with their defaults), and write :meth:`check` (raise ValueError/TypeError naming the bad
    argument) and :meth:`update`. ``elementwise`` rules (every element's new values depend on that
    element alone) get the optimizer's non-finite rule for free: an element whose new state is not
    finite has its states reset to 0 and its parameter left unchanged. A rule that is not
    elementwise (Muon's orthogonalization) must keep non-finite values out of its other elements itself.
    """

    name: ClassVar[str] = ""
    states: ClassVar[tuple[StateSpec, ...]] = ()
    hyperparameters: ClassVar[dict[str, Any]] = {}
    elementwise: ClassVar[bool] = True

    def check(self, group: Mapping[str, Any]) -> None:
        """ValueError/TypeError naming the argument if a group's hyper-parameters are invalid."""
        raise NotImplementedError

    def update(self, p: torch.Tensor, g: torch.Tensor, states: dict[str, torch.Tensor], *, step: int,
               group: Mapping[str, Any]) -> torch.Tensor:
        """One step: ``p`` and ``g`` are fp32 tensors of the parameter's shape (``p`` a copy the rule
        may change), ``states`` the fp32 values of :attr:`states` by name (updated in place);
        ``step`` counts from 1. Returns the new fp32 parameter. ``g`` may be the gradient itself: never
        change it in place."""
        raise NotImplementedError

    def update_unquantized(self, p: torch.Tensor, g: torch.Tensor, states: dict[str, torch.Tensor], *, step: int,
                           group: Mapping[str, Any]) -> torch.Tensor:
        """:meth:`update` for a parameter whose states are kept in fp32 (the same maths). A rule overrides
        it only where its reference rounds that case differently: bitsandbytes' 32-bit CPU step orders
        a few operations otherwise than its 8-bit one (Lion, RMSprop, Adagrad)."""
        return self.update(p, g, states, step=step, group=group)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))


def fp32_step(rule: UpdateRule, quantized: bool, target: torch.Tensor, grad: torch.Tensor,
              values: dict[str, torch.Tensor], step: int, hyper: dict[str, Any]) -> torch.Tensor:
    """The reference step of ``rule`` in fp32: the new value of ``target`` (not written) from its decoded states
    ``values`` (updated in place; ``quantized``: whether they were decoded from codes, else the rule's
    ``update_unquantized``), and the non-finite rule of an elementwise rule: where a state turned NaN/Inf, every
    state restarts from 0 and the parameter keeps its value."""
    update = rule.update if quantized else rule.update_unquantized
    new = update(target.to(torch.float32, copy=True), grad.float(), values, step=step, group=hyper)
    if rule.elementwise:
        ok = None
        for x in values.values():
            finite = torch.isfinite(x)
            ok = finite if ok is None else ok & finite
        if ok is not None and not bool(ok.all()):
            for x in values.values():
                x.masked_fill_(~ok, 0.0)
            new = torch.where(ok, new, target.float())  # target itself is not written yet
    return new


def check_number(value: Any, name: str, *, minimum: float = 0.0, strict: bool = False) -> None:
    """A real number (not a bool) >= ``minimum`` (> with ``strict``), finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or (value <= minimum if strict else value < minimum):
        raise ValueError(f"Invalid {name}: {value!r} (must be {'>' if strict else '>='} {minimum})")


def check_beta(value: Any, name: str, *, allow_one: bool = False) -> None:
    """A decay rate in [0, 1) (or [0, 1] with ``allow_one``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not (0.0 <= value <= 1.0 if allow_one else 0.0 <= value < 1.0):
        raise ValueError(f"Invalid {name}: {value!r} (must be in [0, {'1]' if allow_one else '1)'})")


def check_int(value: Any, name: str, *, minimum: int = 1, optional: bool = False) -> None:
    """An int (not a bool) >= ``minimum``; ``None`` too with ``optional``."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int{' or None' if optional else ''}, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"Invalid {name}: {value!r} (must be >= {minimum})")


def check_betas(betas: Any, count: int, name: str = "betas") -> None:
    if not isinstance(betas, (tuple, list)) or len(betas) != count:
        raise ValueError(f"{name} must be a tuple of {count} floats, got {betas!r}")
    for i, beta in enumerate(betas):
        check_beta(beta, f"beta parameter at index {i} of {name}")
