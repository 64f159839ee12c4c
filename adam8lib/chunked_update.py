"""A low-precision parameter stepped in fp32 a chunk at a time: stochastic rounding and compressed master weights.

A bf16 parameter written with stochastic rounding (:mod:`adam8lib.rounding`), or joined with its 16-bit correction
into an fp32 master and split back (:mod:`adam8lib.master_weights`), is stepped in fp32. Doing it on one fp32 copy
of the whole tensor costs 4 bytes per element at the peak; the one core
(:class:`~adam8lib.quantized_state.QuantizedStateOptimizer`) instead steps it a chunk at a time, with the same bits:

* a **codec** says how a chunk goes to fp32 and back (:class:`RoundingCodec`: the fp32 copy, rounded back with the
  key of the step and each element's index in the whole parameter; :class:`MasterCodec`: the master's join and
  split), chosen by :func:`param_codec`;
* an elementwise rule with blockwise (or fp32) states on a contiguous parameter is stepped
  :data:`adam8lib.rounding.SR_CHUNK` elements at a time (:func:`rounding_chunks`: whole blocks, so the same scales
  as at once), the fused step (which cannot round) on each chunk's fp32 copy;
* a quantized moment with rank-1 scales on a plain contiguous tensor: two passes over chunks of rows
  (:func:`rank1_row_chunks`, :mod:`adam8lib.rank1_chunks`);
* a shard whose scales are reduced across ranks, a non-contiguous parameter, an overridden ``quantize`` or a rule
  that is not elementwise: one fp32 copy of the whole (local) tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from . import rank1_chunks, rounding
from .distributed import global_offset, is_dtensor
from .rounding import element_key, state_chunks, stochastic_round_to_bf16
from .rules.base import UpdateRule, fp32_step

__all__ = ["param_codec", "step_in_chunks", "rounding_chunks", "rank1_row_chunks", "RoundingCodec", "MasterCodec"]


class RoundingCodec:
    """An fp32 copy of a bf16 chunk, rounded back stochastically with the key of the step and each element's index
    in the whole parameter (:mod:`adam8lib.rounding`)."""

    def __init__(self, key: torch.Tensor, offset: int) -> None:
        self.key, self.offset = key, offset

    def load(self, view: torch.Tensor, a: int, b: int, whole: bool) -> torch.Tensor:
        return view.float()

    def store(self, view: torch.Tensor, target: torch.Tensor, a: int, b: int, whole: bool) -> None:
        stochastic_round_to_bf16(target, key=self.key, start=self.offset + a, out=view)


class MasterCodec:
    """The fp32 master of a bf16 chunk, joined with its correction and split back into both
    (:mod:`adam8lib.master_weights`)."""

    def __init__(self, masters: Any, corrections: torch.Tensor) -> None:
        self.masters, self.corrections = masters, corrections

    def _lo(self, a: int, b: int, whole: bool) -> torch.Tensor:
        return self.corrections if whole else self.corrections.view(-1)[a:b]

    def load(self, view: torch.Tensor, a: int, b: int, whole: bool) -> torch.Tensor:
        return self.masters.join(view, self._lo(a, b, whole))

    def store(self, view: torch.Tensor, target: torch.Tensor, a: int, b: int, whole: bool) -> None:
        self.masters.split(target, view, self._lo(a, b, whole))


def param_codec(opt, p: torch.Tensor, step: int, index: int) -> RoundingCodec | MasterCodec | None:
    """How ``opt`` steps ``p`` in fp32 (None: in its own dtype): its adopted compressed master's join and split, or
    stochastic rounding with the key of ``(seed, step, rounding_offset + index)``."""
    masters = opt.__dict__.get("_compressed_masters")
    if masters is not None and opt.steps_own_master(p):
        corrections = masters.corrections.get(id(p))
        if corrections is not None:
            return MasterCodec(masters, corrections)
    if opt.stochastic_rounding:
        return RoundingCodec(element_key(opt.seed, step, opt.rounding_offset + index), global_offset(p))
    return None


def step_in_chunks(opt, p: torch.Tensor, param: torch.Tensor, grad: torch.Tensor, state: dict[str, Any],
                   rule: UpdateRule, hyper: dict[str, Any], step: int, fused, codec, group: dict[str, Any]) -> None:
    """One step of ``p`` (``param``, ``grad``: its local tensors) through ``codec``, a chunk at a time where that
    gives the same bits (see the module docstring). The step count is the caller's to move."""
    rows = rank1_row_chunks(opt, p, param, state, rule)
    if rows is not None:  # rank-1 scales: two passes over chunks of rows, not one fp32 copy of the whole
        rank1_chunks.step_in_row_chunks(
            param.detach(), grad.detach(), state, opt.state_specs(rule), opt.moment,
            lambda target, g, values: fp32_step(rule, True, target, g, values, step, hyper), rows, codec)
        return
    for a, b, part in rounding_chunks(opt, p, param, state, rule, group):
        whole = part is state
        flat = param.detach() if whole else param.detach().view(-1)[a:b]
        target = codec.load(flat, a, b, whole)
        g = grad.detach() if whole else grad.detach().reshape(-1)[a:b]
        opt._step_tensor(p, target, g, part, rule, hyper, step, fused)
        codec.store(flat, target, a, b, whole)


def rounding_chunks(opt, p: torch.Tensor, param: torch.Tensor, state: dict[str, Any], rule: UpdateRule,
                    group: dict[str, Any] | None = None) -> list:
    """The pieces an update through a codec steps (:func:`adam8lib.rounding.state_chunks`): ``[(0, n, state)]``, or
    chunks of whole blocks for an elementwise rule with blockwise or fp32 states on a contiguous parameter whose
    scales need nothing from other shards."""
    n = param.numel()
    if (not rule.elementwise or not param.is_contiguous() or opt._needs_reduction(p, rule, group)
            or opt._custom_quantize()):
        return [(0, n, state)]
    moments, fp32 = [], []
    for spec in opt.state_specs(rule):
        if spec.name in state:
            fp32.append(spec.name)
            continue
        fmt = opt.moment(spec)
        if fmt.uses_rank1(tuple(param.shape)) or rounding.SR_CHUNK % fmt.blocksize:
            return [(0, n, state)]
        moments.append((spec.codes_key, spec.scales_key, fmt))
    return state_chunks(n, state, moments, fp32, chunk=rounding.SR_CHUNK)


def rank1_row_chunks(opt, p: torch.Tensor, param: torch.Tensor, state: dict[str, Any], rule: UpdateRule):
    """Row chunks for :func:`adam8lib.rank1_chunks.step_in_row_chunks`, or None: a plain contiguous parameter, an
    elementwise rule, the format's own coding and a quantized moment with rank-1 scales on this shape."""
    if (opt.format is None or is_dtensor(p) or not rule.elementwise or not param.is_contiguous()
            or opt._custom_quantize()):
        return None
    moments = [opt.moment(s) for s in opt.state_specs(rule) if s.name not in state]
    if not any(m.uses_rank1(tuple(param.shape)) for m in moments):
        return None
    return rank1_chunks.row_chunks(tuple(param.shape), moments, rank1_chunks.RANK1_CHUNK)
