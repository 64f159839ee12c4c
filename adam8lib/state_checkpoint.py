"""A checkpoint of the one core: the form ``state_dict()`` saves, and every check ``load_state_dict()`` makes first.

:class:`~adam8lib.quantized_state.QuantizedStateOptimizer` keeps torch.optim's checkpoint (``state``,
``param_groups``) with what low-bit states need on top, all read from the class's storage layout
(:mod:`adam8lib.state_layout`):

* **saved** (:func:`saved_states`): every state with quantized entries carries the layout's tag (the format's name
  and fingerprint, or lesson 07's maps' fingerprint) and, for a plain parameter, its shape (:data:`SHAPE_KEY`: a
  transposed weight has as many elements, so sizes alone cannot tell); a sharded (FSDP2) parameter's state comes in
  the form ``torch.distributed.checkpoint`` saves and reshards (:func:`adam8lib.distributed.to_checkpoint_state`).
* **loaded** (:func:`checked_checkpoint`): everything is checked before anything changes — the groups (their
  number, sizes, settings the class keeps at the optimizer's level, the rule's hyper-parameters), the format tag
  (a refusal names both formats as users write them), the kind of each state (quantized or fp32, by the parameter's
  size), the shape it was saved for, every key, dtype and size, codes that decode to NaN, non-finite or negative
  scales, the step count — and a checkpoint that is not this class's names the optimizer it probably comes from.
  A DCP form, or a state of another world size, becomes this rank's local state
  (:func:`adam8lib.distributed.to_local_state`).

Each check raises ValueError naming the parameter, the key and what was wrong, and leaves the optimizer as it was.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .distributed import SHAPE_KEY, is_dtensor, local_tensor, to_checkpoint_state, to_local_state
from .kernels.contract import check_plain_tensor
from .rules.base import UpdateRule
from .state_layout import OPTIMIZER_LEVEL

__all__ = ["saved_states", "checked_checkpoint", "checked_state", "check_saved_shape", "state_keys", "SHAPE_KEY"]


def state_keys(opt, p: torch.Tensor, rule: UpdateRule, group: dict[str, Any] | None = None,
               state: dict[str, Any] | None = None) -> dict[str, Any]:
    """``moments`` (``{codes key: (scales key, moment format)}``) and ``fp32_keys`` of ``p``'s state in ``opt``:
    what :func:`adam8lib.distributed.to_checkpoint_state` and ``to_local_state`` need to know of it (of the kind of
    ``state`` where given: a saved one). A kept state (Adan's previous gradient) is one value per element, as an
    fp32 one."""
    specs = opt.state_specs(rule)
    if opt._state_kind(p, rule, group, state):
        return {"moments": {s.codes_key: (s.scales_key, opt.moment(s)) for s in specs if s.kept is None},
                "fp32_keys": tuple(s.name for s in specs if s.kept is not None)}
    return {"moments": {}, "fp32_keys": tuple(s.name for s in specs)}


def saved_states(opt, sd: dict[str, Any]) -> dict[str, Any]:
    """torch.optim's ``state_dict()`` of ``opt`` (``sd``, changed in place and returned) in the saved form: the
    layout's tag and the parameter's shape on every state with quantized entries, the DCP form for a shard."""
    params = [(group, p) for group in opt.param_groups for p in group["params"]]
    for index, saved in sd["state"].items():
        group, p = params[index]
        rule = opt.rule_for(p, group)
        tagged = opt.format is not None and any(k in _codes_keys(opt, rule) for k in saved)
        if is_dtensor(p):  # the DCP form of this layout's keys and blocks
            saved = to_checkpoint_state(p, saved, opt.format, block_layout=opt.block_layout,
                                        **state_keys(opt, p, rule, group))
        if tagged:  # (last: the DCP forms keep other keys as they are, in their place)
            saved = {**saved, opt.format_tag_key: opt.format_tag()}
            if not is_dtensor(p):  # a DCP form keeps the shape in its DTensors
                saved[SHAPE_KEY] = list(p.shape)
        sd["state"][index] = saved
    return sd


def checked_checkpoint(opt, state_dict: dict[str, Any]) -> tuple[list[dict[str, Any]], dict]:
    """``(param_groups, state)`` of ``state_dict`` as ``opt`` keeps them, every part checked (see the module
    docstring): ValueError naming the first problem."""
    name = type(opt).__name__
    if "state" not in state_dict or "param_groups" not in state_dict:
        raise ValueError("state_dict must have 'state' and 'param_groups' (from Optimizer.state_dict())")
    saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
    if not isinstance(saved_groups, (list, tuple)) or not isinstance(saved_state, dict):
        raise ValueError("state_dict['param_groups'] must be a list and state_dict['state'] a dict")
    origin = opt.layout.foreign_origin(state_dict)
    if len(saved_groups) != len(opt.param_groups):
        raise ValueError(f"the checkpoint has {len(saved_groups)} parameter groups, this {name} has "
                         f"{len(opt.param_groups)}{origin}")
    for pid, saved in saved_state.items():  # states in another format: say so first, in the user's terms
        if isinstance(saved, dict) and (opt.format_tag_key in saved
                                        or any(isinstance(k, str) and k in _codes_keys(opt, opt.rule) for k in saved)):
            _check_tag(opt, saved.get(opt.format_tag_key), f"the state of parameter {pid!r}", origin)
    new_groups, by_id = [], {}
    for gi, (current, saved) in enumerate(zip(opt.param_groups, saved_groups)):
        group = _checked_group(opt, current, saved, f"param group {gi} of the checkpoint", origin)
        new_groups.append(group)
        for pid, p in zip(saved["params"], current["params"]):
            by_id[pid] = (p, group)
    new_state = {}
    for pid, saved in saved_state.items():
        if pid not in by_id:
            raise ValueError(f"the checkpoint has a state for unknown parameter id {pid!r}")
        p, group = by_id[pid]
        where = f"the state of parameter {pid!r} (shape {tuple(p.shape)}) in the checkpoint"
        check_saved_shape(p, saved, where)
        rule = opt.rule_for(p, group)
        if isinstance(saved, dict):  # DCP, or another world size: this rank's plain local state
            saved = to_local_state(p, saved, opt.format, block_layout=opt.block_layout,
                                   **state_keys(opt, p, rule, group, saved))
        new_state[p] = checked_state(opt, p, rule, saved, where, origin, group)
    return new_groups, new_state


def _checked_group(opt, current: dict[str, Any], saved: Any, where: str, origin: str) -> dict[str, Any]:
    """A saved param group as ``opt`` keeps it (the current group's parameters and names, the saved settings),
    checked as a live group is."""
    name = type(opt).__name__
    if not isinstance(saved, dict) or not isinstance(saved.get("params"), (list, tuple)):
        raise ValueError(f"{where} must be a dict with a 'params' list")
    refused = [k for k in OPTIMIZER_LEVEL if k in saved and k not in opt.group_settings]
    if refused:
        raise ValueError(f"{where} sets {', '.join(map(repr, refused))}: not {_a(name)} checkpoint{origin}")
    missing = [k for k in opt.defaults if k not in saved]
    if missing:
        raise ValueError(f"{where} has no {', '.join(map(repr, missing))}: not {_a(name)} checkpoint{origin}")
    if len(saved["params"]) != len(current["params"]):
        raise ValueError(f"{where} has {len(saved['params'])} parameters, this {name}'s group has "
                         f"{len(current['params'])}")
    group = {k: v for k, v in saved.items() if k != "params"}
    group["params"] = current["params"]
    if "param_names" in current and "param_names" not in group:
        group["param_names"] = current["param_names"]
    if "betas" in group and not isinstance(group["betas"], tuple):
        try:
            group["betas"] = tuple(group["betas"])
        except TypeError:
            raise ValueError(f"{where}: betas must be a pair of floats, got {group['betas']!r}") from None
    opt._check_group(group, where)
    return group


def checked_state(opt, p: torch.Tensor, rule: UpdateRule, saved: Any, where: str, origin: str,
                  group: dict[str, Any] | None = None) -> dict:
    """A saved state checked against what ``opt`` keeps for ``p`` (keys, dtypes, sizes, its format tag, finite
    scales, valid codes, the step count) and made this rank's: ValueError naming what is wrong."""
    name, tag_key = type(opt).__name__, opt.format_tag_key
    if not isinstance(saved, dict):
        raise ValueError(f"{where} must be a dict, got {type(saved).__name__}")
    saved_quantized = any(k in _codes_keys(opt, rule) for k in saved)
    expected = opt._expected_state(p, rule, group, saved_quantized)
    unknown = sorted(set(map(str, saved)) - set(expected) - {"step", tag_key, SHAPE_KEY})
    if origin and unknown:  # a foreign checkpoint: said before its tag or its kind is
        raise ValueError(f"{where} has unexpected keys {unknown} that {_a(name)} ({rule.name} rule) does not "
                         f"keep{origin}")
    if saved_quantized or tag_key in saved:
        _check_tag(opt, saved.get(tag_key), where, origin)
    # where the groups hold min_8bit_size (lesson 07's layout: a group's may change once its states exist), a
    # loaded state keeps its kind, as a live one does; else the optimizer's decides, and another kind is refused
    if "min_8bit_size" not in opt.group_settings:
        if (saved_quantized or tag_key in saved) and not opt.quantized(p, group):
            raise ValueError(f"{where} has low-bit states; this {name} keeps fp32 states for it (state format "
                             f"{opt.format_name()!r}, min_8bit_size {opt.min_size(group)}){origin}")
        if not (saved_quantized or tag_key in saved) and opt.quantized(p, group):
            raise ValueError(f"{where} has fp32 states; this {name} stores this parameter's states in format "
                             f"{opt.format_name()!r} (min_8bit_size {opt.min_size(group)}){origin}")
    if unknown:
        raise ValueError(f"{where} has unexpected keys {unknown} that {_a(name)} ({rule.name} rule) does not "
                         f"keep{origin}")
    step = saved.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        got = f"a tensor ({step.dtype})" if torch.is_tensor(step) else repr(step)
        raise ValueError(f"{where}: 'step' must be a Python int >= 0, got {got}{origin}")
    out: dict[str, Any] = {"step": step}
    specs = opt.state_specs(rule)
    codes, scales = {s.codes_key: s for s in specs}, {s.scales_key for s in specs}
    never_negative = {s.name for s in specs if s.stored_as == "v"}  # (a second moment kept in fp32)
    for key, (shape, dtype) in expected.items():
        value = saved.get(key)
        if not torch.is_tensor(value):
            raise ValueError(f"{where}: {key!r} should be a {dtype} tensor, got {type(value).__name__}{origin}")
        try:
            check_plain_tensor(value, f"{where}: {key!r}")
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        if value.dtype != dtype or value.numel() != math.prod(shape):
            raise ValueError(f"{where}: {key!r} should be {dtype}[{math.prod(shape)}], got "
                             f"{value.dtype}[{value.numel()}]{origin}")
        if key in codes:
            if not opt.moment(codes[key]).codes_are_valid(value):
                raise ValueError(f"{where}: {key!r} has codes that decode to NaN (a corrupt checkpoint)")
        elif not bool(torch.isfinite(value).all()):
            raise ValueError(f"{where}: {key!r} has NaN or Inf values (a corrupt checkpoint)")
        elif (key in scales or key in never_negative) and bool((value < 0).any()):
            raise ValueError(f"{where}: {key!r} has negative values (it must be >= 0: a corrupt checkpoint)")
        out[key] = value.detach().to(local_tensor(p).device).reshape(shape).clone(memory_format=torch.contiguous_format)
    return out


def check_saved_shape(p: torch.Tensor, saved: Any, where: str) -> None:
    """ValueError when a saved state belongs to a parameter of another shape: its :data:`SHAPE_KEY`, or an fp32
    state tensor of two or more dimensions, says a shape other than ``p``'s (a transposed weight has as many
    elements, so sizes alone do not tell)."""
    if not isinstance(saved, dict):
        return
    own = tuple(p.shape)
    told = saved.get(SHAPE_KEY)
    if told is not None:
        if not isinstance(told, (list, tuple)) or not all(isinstance(n, int) and not isinstance(n, bool) for n in told):
            raise ValueError(f"{where}: {SHAPE_KEY!r} must be a list of ints, got {told!r}")
        if tuple(told) != own:
            raise ValueError(f"{where} was saved for a parameter of shape {tuple(told)}; this parameter has shape "
                             f"{own}: load the checkpoint into the model it was saved from (same parameters, "
                             f"same order)")
    for key, value in saved.items():
        if torch.is_tensor(value) and not is_dtensor(value) and value.dim() >= 2 and value.dtype.is_floating_point \
                and value.numel() == p.numel() and tuple(value.shape) != own:
            raise ValueError(f"{where}: {key!r} has shape {tuple(value.shape)}, this parameter has shape {own}: the "
                             f"checkpoint belongs to another model (or another parameter order)")


def _check_tag(opt, saved: Any, where: str, origin: str) -> None:
    """ValueError unless a saved state's tag is ``opt``'s :meth:`format_tag`; the refusal names both formats as users
    write them (``'8bit'``, ``'4bit' (blocks of 128)``)."""
    opt.layout.check_tag(saved, opt.format, where, origin, type(opt).__name__)


def _codes_keys(opt, rule: UpdateRule) -> set[str]:
    """The keys of ``rule``'s states' codes in ``opt`` (:attr:`adam8lib.rules.base.StateSpec.codes_key`)."""
    return {s.codes_key for s in opt.state_specs(rule)}


def _a(name: str) -> str:
    """``name`` with its indefinite article: 'an Adam8bit', 'a Lion8bit'."""
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name
