"""Many parameters in one call: the one core's batches, with the same bits as one parameter at a time.

A step of many small tensors is mostly the cost of each call, not arithmetic. So, without stochastic rounding or
compressed master weights, :class:`~adam8lib.quantized_state.QuantizedStateOptimizer` steps together

* the parameters of one group and device that take the same fused step with a batched form
  (:attr:`adam8lib.kernels.FusedStep.many`: the 8-bit Adam kernels, one call of the C++ kernel for them all), and
* those with fp32 states of a rule with ``update_many`` (AdamW: one batch of ``torch._foreach_*`` operations per
  group, device and step count; on the CPU the same bits as one tensor at a time),

and the others one at a time, in order (a step that reduces scales across ranks is a collective, which every rank
must run in the same order). tests/test_optim.py compares the batches with one tensor at a time, bit for bit.

:func:`kernel_item` is the registry's calling convention for one parameter (used by the batches and by the core's
one-tensor step alike).
"""

from __future__ import annotations

from typing import Any

import torch

from .rules.base import StateSpec, UpdateRule

__all__ = ["run_batched", "kernel_item", "batches_fp32"]

_MISSING = object()


def run_batched(opt, work: list) -> None:
    """Step every ``(group, p, param, grad, rule, fused)`` of ``work`` (checked by ``opt``'s step) in ``opt``."""
    fused_batches: dict[tuple, tuple] = {}
    fp32_batches: dict[tuple, tuple] = {}
    fp32_names: dict[int, list[str] | None] = {}  # per rule: its states' names if its fp32 states batch
    for index, (group, p, param, grad, rule, fused) in enumerate(work):
        names = fp32_names.get(id(rule), _MISSING)
        if names is _MISSING:
            names = fp32_names[id(rule)] = [s.name for s in opt.state_specs(rule)] if batches_fp32(rule) else None
        if fused is not None and fused.many is not None:
            state = opt._ready_state(group, p, param, rule)  # (made in the parameters' order, as one at a time)
            key = (id(group), param.device, id(fused.many), id(rule))
            fused_batches.setdefault(key, (group, rule, fused, []))[3].append((p, param, grad, state))
        elif fused is None and names and param.device.type in ("cpu", "cuda"):
            state = opt._ready_state(group, p, param, rule)
            if all(name in state and state[name].dtype == torch.float32 for name in names):  # fp32 states
                key = (id(group), param.device, id(rule), state["step"])
                fp32_batches.setdefault(key, (group, rule, []))[2].append((p, param, grad, state))
            else:
                opt._update(group, p, param, grad, rule, fused, index)
        else:
            opt._update(group, p, param, grad, rule, fused, index)
    for group, rule, entries in fp32_batches.values():
        _fp32_batch(opt, group, rule, entries)
    for group, rule, fused, entries in fused_batches.values():
        _fused_batch(opt, group, rule, fused, entries)


def _fp32_batch(opt, group: dict[str, Any], rule: UpdateRule, entries: list) -> None:
    """The fp32 states of one rule, group, device and step count: the rule's ``update_many``."""
    hyper, step = opt.rule_group(rule, group), entries[0][3]["step"] + 1
    work32 = [(param, param.float()) for _, param, _, _ in entries]  # (under no_grad: the step's)
    rule.update_many([w for _, w in work32], [g.float() for _, _, g, _ in entries],
                     [{s.name: st[s.name] for s in opt.state_specs(rule)} for *_, st in entries],
                     step=step, group=hyper)
    for (param, w), (*_, state) in zip(work32, entries):
        if w is not param:
            param.copy_(w)
        state["step"] = step


def _fused_batch(opt, group: dict[str, Any], rule: UpdateRule, fused, entries: list) -> None:
    """The quantized states of one group, device and fused step: its batched form, in one call."""
    items, states, copies, steps, shapes = [], [], [], [], []
    specs = opt.state_specs(rule)
    for p, param, grad, state in entries:
        item = kernel_item(specs, param, grad, state)
        if not param.is_contiguous():  # a contiguous copy: written back below
            copies.append((param, item[0]))
        items.append(item)
        states.append(state)
        steps.append(state["step"] + 1)
        shapes.append(tuple(param.shape))
    fused.many(items, rule=rule, fmt=opt.format, shapes=shapes, steps=steps, group=opt.rule_group(rule, group))
    for param, flat in copies:
        param.copy_(flat.view(param.shape))
    for state, step in zip(states, steps):
        state["step"] = step


def kernel_item(specs: tuple[StateSpec, ...], target: torch.Tensor, grad: torch.Tensor,
                state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """``(p, g, states)`` as the registry's fused steps take them: flat, contiguous (a copy of ``target`` where
    it is not contiguous, which the caller writes back), and the ``(codes, scales)`` of each state (``(values,)``,
    flat, of a kept one)."""
    flat = target.view(-1) if target.is_contiguous() else target.contiguous().view(-1)
    return (flat, grad.reshape(-1).contiguous(),
            tuple((state[s.name].view(-1),) if s.kept is not None else (state[s.codes_key], state[s.scales_key])
                  for s in specs))


def batches_fp32(rule: UpdateRule) -> bool:
    """Whether parameters with fp32 states of ``rule`` step in batches: the rule has ``update_many`` and an fp32
    step the core's (the non-finite rule is the rule's own there)."""
    kind = type(rule)
    return getattr(kind, "update_many", None) is not None and kind.update_unquantized is UpdateRule.update_unquantized
