"""Drivers of workbook 13 (:mod:`adam8lib.course.checks.ex13_one_state_many_optimizers`): the learner's Lion8bit
class (a :class:`~adam8lib.quantized_state.QuantizedStateOptimizer` with a rule of theirs) built and stepped
over the scenario the check sends — its parameters and every step's gradients — and what it did returned as
plain data: the parameters, the states, its defaults, which settings it refused and how."""

from __future__ import annotations

import torch

from ....quantized_state import QuantizedStateOptimizer
from ....rules.base import StateSpec, UpdateRule
from . import described, driver

__all__ = ["with_bnb_rounding", "describe_optimizer", "optimizer_defaults", "refusals", "update_once",
           "step_optimizer", "where_flips_raised"]


def with_bnb_rounding(cls):
    """``cls`` whose states are requantized by bitsandbytes' CPU quantizer (tests/test_family_bnb.py's plug)."""

    class BnbRounding(cls):
        def quantize(self, spec, x, fmt, shape):
            return torch.ops.bitsandbytes.quantize_blockwise(x.contiguous(), fmt.qmap(), fmt.blocksize)

    BnbRounding.__name__ = cls.__name__ + "BnbRounding"
    return BnbRounding


@driver
def describe_optimizer(cls) -> dict:
    """What the class is made of: built on the core?, its rule, the rule's states, its state format."""
    core = isinstance(cls, type) and issubclass(cls, QuantizedStateOptimizer)
    rule = getattr(cls, "rule", None)
    specs = tuple(getattr(rule, "states", ()))
    fmt = getattr(cls, "state_format", None)
    bases = [*(cls.__mro__ if isinstance(cls, type) else ()), *type(rule).__mro__]
    return {"core": core, "rule_ok": isinstance(rule, UpdateRule), "rule_repr": repr(rule)[:300],
            "built_on": [f"{c.__module__}.{c.__qualname__}" for c in bases],
            "specs_ok": len(specs) == 1 and all(isinstance(s, StateSpec) for s in specs),
            "specs_repr": repr(specs)[:300], "state_format": described(fmt), "state_format_repr": repr(fmt)[:100]}


@driver
def optimizer_defaults(cls, keys: list) -> dict:
    """The first param group's values of ``keys`` for ``cls([a parameter])``, built with no setting."""
    opt = cls([torch.nn.Parameter(torch.zeros(3))])
    return {k: described(opt.param_groups[0].get(k)).get("plain", "<not plain data>") for k in keys}


@driver
def refusals(cls, settings: list) -> list:
    """For each keyword dict of ``settings``: ``cls([a parameter], **setting)`` accepted, or the exception it
    raised (its kind — ValueError, TypeError or something else — and its message)."""
    out = []
    for kwargs in settings:
        try:
            cls([torch.nn.Parameter(torch.zeros(3))], **kwargs)
        except Exception as exc:  # noqa: BLE001 - what the learner's check raised is the answer
            out.append({"accepted": False, "type": type(exc).__name__, "value_or_type": isinstance(exc, (ValueError, TypeError)),
                        "type_error": isinstance(exc, TypeError), "message": str(exc)[:1000]})
        else:
            out.append({"accepted": True})
    return out


@driver
def update_once(cls, p, g, state, step: int, group: dict) -> dict:
    """``cls.rule.update(p, g, {"exp_avg": state}, step=step, group=group)`` once: what it returned, and what it
    did to the state it was handed: ``state_rebound``, the dict holds another object than that tensor afterwards
    (the rule put a new tensor there); ``state_kept``, that tensor holds what the dict holds (equal values: the
    optimizer, which keeps the tensor it handed for an fp32 state, sees the rule's update)."""
    handed = state
    states = {"exp_avg": state}
    out = cls.rule.update(p, g, states, step=step, group=group)
    left = states.get("exp_avg")
    rebound = left is not handed
    kept = torch.is_tensor(left) and left.shape == handed.shape and bool(torch.equal(left.detach().float(),
                                                                                      handed.detach().float()))
    return {"tensor": torch.is_tensor(out), "none": out is None, "type": type(out).__name__,
            "shape": list(out.shape) if torch.is_tensor(out) else None, "state_rebound": rebound,
            "state_kept": kept}


def _states(opt, params) -> list[dict]:
    """Each parameter's state tensors under the names m / m_codes / m_absmax, whatever the rule calls its state."""
    out = []
    for p in params:
        name = opt.rule.states[0].name
        st = opt.state[p]
        renamed = {}
        for suffix in ("", "_codes", "_absmax"):
            if torch.is_tensor(st.get(name + suffix)):
                renamed["m" + suffix] = st[name + suffix].detach().clone()
        out.append(renamed)
    return out


@driver
def step_optimizer(cls, kwargs: dict, params: list, grads: list, trace: bool = False, states: bool = True,
                   bnb_rounding: bool = False) -> dict:
    """``cls(params, **kwargs)`` stepped once per entry of ``grads`` (one gradient per parameter): the parameters
    at the end, each parameter's state (``states``) and, with ``trace``, the parameters after every step.
    ``bnb_rounding``: the class with bitsandbytes' quantizer plugged in (:func:`with_bnb_rounding`).
    ``grads_changed``: whether any step left a gradient other than the one it was handed."""
    if bnb_rounding:
        import bitsandbytes  # noqa: F401 - registers torch.ops.bitsandbytes
    made = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = (with_bnb_rounding(cls) if bnb_rounding else cls)(made, **kwargs)
    after = []
    grads_changed = False  # did a step change the gradient it was handed (the rule wrote into g)?
    for step in grads:
        for p, g in zip(made, step):
            p.grad = g.detach().clone().to(p.dtype)
        opt.step()
        grads_changed = grads_changed or any(
            p.grad is not None and not torch.equal(p.grad, g.detach().to(p.dtype)) for p, g in zip(made, step))
        if trace:
            after.append([p.detach().clone() for p in made])
    return {"params": [p.detach().clone() for p in made], "states": _states(opt, made) if states else None,
            "trace": after, "grads_changed": grads_changed}


@driver
def where_flips_raised(fn, m, g, beta1: float, state_format: str) -> dict:
    """13.3: ``fn(m, g, beta1, state_format)`` once; where it raised, whether the error came from inside a format's
    ``quantize`` (the learner's m reached it in another shape than flat) — the frames' function and file names."""
    try:
        fn(m, g, beta1, state_format)
    except Exception as exc:  # noqa: BLE001 - the learner's code raised: only where it did crosses
        tb, in_quantize = exc.__traceback__, False
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_name == "quantize" and code.co_filename.replace("\\", "/").endswith("adam8lib/formats.py"):
                in_quantize = True
            tb = tb.tb_next
        return {"raised": True, "in_quantize": in_quantize}
    return {"raised": False, "in_quantize": False}
