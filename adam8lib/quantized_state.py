"""One optimizer for every update rule and every state format: decode each state, the rule in fp32, encode.

:class:`QuantizedStateOptimizer` is the one core of every optimizer of the library (issue 35): the family
(Lion8bit, AdEMAMix8bit, RMSprop8bit, Adagrad8bit, SGD8bit, Adan8bit, Muon8bit, :mod:`adam8lib.family`) and the low-bit
Adams of lessons 07 and 12 (:class:`~adam8lib.optim.LowBitAdam`: the AdamW rule with the keys, groups, FSDP2
blocks and checkpoint tags those lessons teach, set through the hooks below). An optimizer is

* an **update rule** (:mod:`adam8lib.rules`: the states it keeps, its hyper-parameters and their checks,
  its step in fp32),
* a **state format** for its states (:mod:`adam8lib.formats`: ``"8bit"``, ``"4bit"``, ``"4bit-naive"``,
  ``"fp8"``; or :data:`FP32`, plain fp32 tensors). A format has two moment formats, ``m`` (signed) and
  ``v`` (never negative); each state of the rule names the one that stores it
  (:attr:`adam8lib.rules.base.StateSpec.stored_as`), or is kept in fp32/bf16 whatever the format
  (:attr:`~adam8lib.rules.base.StateSpec.kept`: Adan's previous gradient). A rule has any number of states. The
  8-bit format is data like the others.
* and a **backend**: the reference step (``backend="torch"``), the spec, or a fused step of the one
  registry (:func:`adam8lib.kernels.find_step`: keyed by rule, format and device): the C++ ``"cpu"``
  template of the elementwise rules (Lion, AdEMAMix, RMSprop, Adagrad, Adan) and AdamW's kernels on the CPU,
  ``"triton"`` on CUDA. ``"auto"`` takes the first backend of :data:`adam8lib.kernels.AUTO_ORDER` with
  a step for the parameter's rule, format and device (never the Triton interpreter for CPU tensors),
  else the reference step: fp32 states, tensors under ``min_8bit_size``, rules with no fused step (Muon's
  orthogonalization, SGD with momentum) and formats no kernel stores (the 4-bit formats for the family's rules).
  A parameter (or gradient) that is not contiguous, e.g. a ``channels_last`` convolution weight, takes the
  fused step on a contiguous copy, written back. Whether a parameter's states are quantized is decided when
  they are made (by ``min_8bit_size``) and stays so: a state keeps its kind. A named backend must have a fused step for every
  elementwise rule of the optimizer in its format (else ValueError at construction); the other
  parameters take the reference step. Every fused step gives the reference step's states and
  parameters bit for bit on the CPU (tests/kernels/test_cpu_rules.py, test_core_dispatch.py).
  :meth:`QuantizedStateOptimizer.fused_step` says which step a parameter gets.

The reference step works on whole tensors: fp32 temporaries of the parameter's size (its copy, each
decoded state), as the reference step of the low-bit Adam formats does. Each step, for every parameter
with a gradient: decode each state to fp32 (codes times their block's
scale), run the rule, apply the non-finite rule (elementwise rules: an element whose new state is not
finite has every state reset to 0 and its parameter left unchanged), write the parameter, encode each
state again with fresh per-block scales (:meth:`QuantizedStateOptimizer.quantize`, the one hook a
test or an experiment overrides to plug in another rounding, e.g. bitsandbytes' CPU quantizer; an
optimizer whose ``quantize`` is overridden always runs the reference step, so the hook is what runs).

**Where things live.** The block size is the optimizer's: ``blocksize`` sets it in the format
(:attr:`format`), the one place a step reads it; the family's param groups do not hold it (a group that sets
``blocksize`` or ``min_8bit_size`` is refused, in the constructor, ``add_param_group`` and ``step``); a class
that lists them in :attr:`~QuantizedStateOptimizer.group_settings` (the low-bit Adams) shows both in every
group, the block size read-only and ``min_8bit_size`` per group.
Tensors with fewer than ``min_8bit_size`` elements keep fp32 states (as bitsandbytes: 4096).

**Batches.** Without stochastic rounding, the parameters of a group on one device that take the same fused step
with a batched form (``many``: the 8-bit Adam kernels) are stepped in one call, and those with fp32 states of a
rule with ``update_many`` (AdamW) in one batch of ``torch._foreach_*`` operations per step count: on the CPU the
bits of one tensor at a time, without the per-tensor cost (most of a step of many small tensors).

**State keys** are the class's storage layout's (:attr:`QuantizedStateOptimizer.layout`, data:
:mod:`adam8lib.state_layout`), as are a new state's key order, whose blocks a shard keeps, the checkpoint tag,
the settings groups show, the torch flags refused and the class-specific words of the messages. A state stored in fp32 is ``state[name]`` (the parameter's shape); a quantized one is
``state[spec.codes_key]`` (flat uint8 codes, two 4-bit codes per byte for 4-bit formats; by default
``name + "_codes"``) and ``state[spec.scales_key]`` (flat fp32 scales; ``name + "_absmax"``), plus ``state["step"]``
(a Python int); :meth:`~QuantizedStateOptimizer.state_specs` gives the specs with the keys a class stores (the
low-bit Adams: ``state1``/``absmax1``, ``state2``/``absmax2``). A state its rule keeps in a plain dtype
(:attr:`adam8lib.rules.base.StateSpec.kept`, ``"fp32"``/``"bf16"``: Adan's previous gradient) is ``state[name]`` in that
dtype in every format: the rule gets its fp32 values, a fused step ``(values,)``, the DCP form treats it as an fp32
state of the shard (one value per element), and it says nothing of whether the others are quantized. ``state_dict()``
adds :data:`FORMAT_KEY` (a class's :attr:`~QuantizedStateOptimizer.format_tag_key`) to every state with quantized entries: the format's name and fingerprint (maps,
bits, block size, sign rule), so a checkpoint loads only where its codes decode to the same values,
and a refusal names both formats as users write them (``'8bit'``, ``'4bit'``).

**A step that raises changes nothing**: every group's hyper-parameters, every parameter and gradient
(dtype, shape, device, layout) are checked before the first state or parameter is touched, and the
step counters move only with the update.

As a ``torch.optim.Optimizer``: ``zero_grad``, closures, LR schedulers, state-dict hooks
(``load_state_dict`` runs the pre-hooks on the checkpoint and the post-hooks after it is in place),
``copy.deepcopy``/pickle, ``torch.compile`` (the step runs eagerly: one graph break). Flags of torch's
optimizers it does not implement (``maximize``, ``foreach``, ``fused``, ``capturable``,
``differentiable``) are refused unless false.

**FSDP2 (DTensor) parameters** (:mod:`adam8lib.global_blocks`). A sharded parameter is stepped on its local
shard (``p.to_local()``, ``p.grad.to_local()``), with states sized to the shard and quantized or fp32 by the
*whole* parameter's size (``p.numel()`` of the DTensor; not by the shard). With ``block_layout = "global"``
(the family's), a shard keeps the whole tensor's blocks:
element ``i`` of the parameter is in block ``⌊i/B⌋`` on any world size, a block cut by a shard boundary is
kept by both ranks with the scale of the whole block (an all-reduce (MAX) of each rank's edge maxima, ``2·W``
floats per state per step), rank-1 scales take the whole tensor's column maxima
(:func:`adam8lib.distributed.rank1_maxima_reducer`). So the states and the parameters of a sharded run equal
the unsharded run's bit for bit, whatever the shard boundaries (tests/test_family_distributed.py: 2 gloo
ranks). Such a step is a collective: every rank steps the same parameters (FSDP2 gives every rank a
gradient; an empty shard takes part). A fused step runs on a shard only where that gives the same bits:
no moment with rank-1 scales and no shard boundary inside a block; else the reference step. A rule that is
not elementwise (Muon's Newton-Schulz needs the whole matrix) refuses a sharded parameter with a ValueError
naming it (keep such matrices unsharded, or in Muon8bit's AdamW group, ``use_muon=False``); ``state_dict()``
gives a sharded parameter's states in the form ``torch.distributed.checkpoint`` saves
(:func:`adam8lib.distributed.to_checkpoint_state` with the rule's keys), and ``load_state_dict`` (so
:func:`adam8lib.distributed.load_checkpoint`) loads it on the same or another world size bit for bit. An
overridden :meth:`QuantizedStateOptimizer.quantize` cannot run on a shard (TypeError at the step). With
``block_layout = "local"`` (the low-bit Adams, lesson 11) a shard is cut into its own blocks, as bitsandbytes and
torchao cut theirs: the same bits as unsharded where every shard starts on a block boundary, and a checkpoint in
:mod:`adam8lib.distributed`'s local-block form, requantized (within ``reshard_tolerance``) on another world size.

**Stochastic rounding** (``stochastic_rounding=True``, ``seed``: the arguments, checks and errors of
every class). Every parameter must be bf16; the step computes the new parameter in fp32 and rounds it
stochastically (:mod:`adam8lib.rounding`) with the key of ``(seed, step, rounding_offset + index)``
(``index``: the parameter's place among those with a gradient in this step; ``rounding_offset``: the public
hook :func:`adam8lib.release.release_gradients` sets) and each element's index in the *whole* parameter
(:func:`adam8lib.distributed.global_offset`): the same bits for the same rule in any class (Muon8bit's AdamW
group and AdamW8bit) and, under FSDP2, as the unsharded run. The registry's fused steps cannot round
stochastically, so they run on an fp32 copy of the parameter and the result is rounded: an elementwise rule
with blockwise or fp32 states, on a contiguous parameter whose scales need nothing from other shards, is
updated and rounded :data:`adam8lib.rounding.SR_CHUNK` elements at a time (:func:`adam8lib.rounding.state_chunks`:
whole blocks, the same bits as at once; the fp32 copy is one chunk's); a plain contiguous tensor with a rank-1
moment in two passes over chunks of rows (:mod:`adam8lib.rank1_chunks`); a shard whose scales are reduced across
ranks (rank-1 or edge blocks), a non-contiguous parameter and Muon's rule take one fp32 copy of the whole (local)
tensor. **Compressed master weights** (:class:`adam8lib.master_weights.CompressedMasterWeights`, adopted with
:meth:`QuantizedStateOptimizer.adopt_master_weights`) go the same way, with the master's join and split in place of
the rounding: a plain bf16 parameter is stepped on its fp32 master a chunk at a time.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import MappingProxyType
from typing import Any, Iterable, Mapping

import torch

from . import batched_step, chunked_update, kernels, state_checkpoint
from .distributed import is_dtensor, local_param_and_grad, local_range, local_tensor, rank1_maxima_reducer
from .formats import MomentFormat, StateFormat, get_format
from .global_blocks import block_edge_reducer, block_lead, shard_scales_numel
from .kernels import run_eagerly
from .kernels.contract import PARAM_DTYPES, check_plain_tensor, is_usual_tensor
from .quant import check_blocksize
from .rules.base import StateSpec, UpdateRule, fp32_step
from .state_layout import FAMILY_LAYOUT, OPTIMIZER_LEVEL, StateLayout

__all__ = ["QuantizedStateOptimizer", "FP32", "FORMAT_KEY", "TORCH_FLAGS", "OPTIMIZER_LEVEL"]

#: The state format of plain fp32 states (no codes, no scales).
FP32 = "fp32"
#: The key, in a saved state with quantized entries, of the format its codes are in.
FORMAT_KEY = "state_format"
#: torch.optim flags the family's optimizers do not implement, with what to do instead (their layout's,
#: :attr:`adam8lib.state_layout.StateLayout.torch_flags`).
TORCH_FLAGS = FAMILY_LAYOUT.flags


class QuantizedStateOptimizer(torch.optim.Optimizer):
    """An update rule with its states in a state format (see the module docstring).

    Subclasses set :attr:`rule` and :attr:`state_format` and give ``defaults`` (the rule's
    hyper-parameters) to ``__init__``; :meth:`rule_for` may pick another rule per parameter.

    Args:
        params: parameters or param groups.
        defaults: every hyper-parameter of the rule(s), as torch.optim's ``defaults``.
        state_format: ``"8bit"``, ``"4bit"``, ``"4bit-naive"``, ``"fp8"``, ``"fp32"`` or a
            :class:`~adam8lib.formats.StateFormat`; ``None``: the class's.
        blocksize: elements per scale block (a power of two in 64...4096); ``None``: the format's.
        min_8bit_size: tensors with fewer elements keep fp32 states.
        backend: ``"auto"`` (a fused step where there is one, see the module docstring), ``"torch"`` (the
            reference step), or a backend of :mod:`adam8lib.kernels` with fused steps of these rules
            (``"cpu"``, ``"triton"``).
        stochastic_rounding: write bf16 parameters with stochastic rounding (every parameter must then be
            bf16); ``seed`` seeds it (the same seed gives the same bits).
    """

    rule: UpdateRule
    state_format: str = "8bit"
    #: How the states are stored and how checkpoints name them (:class:`adam8lib.state_layout.StateLayout`: the
    #: keys, a new state's key order, whose blocks a shard keeps, the tag, the settings groups show, the torch
    #: flags refused, the words of the messages): the family's, or lesson 07's for the low-bit Adams
    #: (:data:`~adam8lib.state_layout.ADAM_LAYOUT`). Data, chosen by the class; no method is overridden for it.
    layout: StateLayout = FAMILY_LAYOUT
    #: Added to each parameter's index in the stochastic rounding key (see the module docstring):
    #: the public hook :func:`adam8lib.release.release_gradients` sets while it steps one parameter.
    rounding_offset: int = 0

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any], *,
                 state_format: str | StateFormat | None = None, blocksize: int | None = None,
                 min_8bit_size: int = 4096, backend: str = "auto", stochastic_rounding: bool = False,
                 seed: int = 0, **torch_flags: Any) -> None:
        name = type(self).__name__
        flags = self.layout.flags
        for key, value in torch_flags.items():
            if key not in flags:
                raise TypeError(f"{name}.__init__() got an unexpected keyword argument {key!r}")
            if value:
                raise ValueError(f"{key}={value!r} is not supported by {name} (the constructor): {flags[key]}")
        if not isinstance(backend, str) or backend not in kernels.known_backend_names():
            raise ValueError(f"Unknown backend {backend!r} for {name}; choose one of {list(kernels.known_backend_names())}")
        if backend not in ("auto", "torch") and backend not in kernels.available_backends():
            raise ValueError(f"Backend {backend!r} is unavailable here: {kernels.unavailable_reason(backend)}")
        wanted = type(self).state_format if state_format is None else state_format
        if wanted == FP32:
            if blocksize is not None:
                raise ValueError(f"blocksize={blocksize!r} means nothing with state_format='fp32' (no blocks)")
            fmt = None
        else:
            fmt = get_format(wanted)
            if blocksize is not None:
                fmt = fmt.with_blocksize(check_blocksize(blocksize))
        if isinstance(min_8bit_size, bool) or not isinstance(min_8bit_size, int) or min_8bit_size < 0:
            raise ValueError(f"Invalid min_8bit_size: {min_8bit_size!r} (must be an int >= 0)")
        if not isinstance(stochastic_rounding, bool):
            raise TypeError(f"stochastic_rounding must be a bool, got {type(stochastic_rounding).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.format: StateFormat | None = fmt
        self.min_8bit_size = min_8bit_size
        self.backend = backend
        self.stochastic_rounding = stochastic_rounding
        self.seed = seed
        shown = {"blocksize": None if fmt is None else fmt.blocksize, "min_8bit_size": min_8bit_size}
        defaults = {**defaults, **{k: shown[k] for k in self.layout.group_settings if shown[k] is not None}}
        super().__init__(params, defaults)
        if backend not in ("auto", "torch"):
            self._check_named_backend()

    @property
    def group_settings(self) -> tuple[str, ...]:
        """Which optimizer-level settings (:data:`OPTIMIZER_LEVEL`) the param groups hold and show (``()``: none,
        every group that sets one is refused): the layout's."""
        return self.layout.group_settings

    @property
    def block_layout(self) -> str:
        """Whose blocks a shard of a sharded (FSDP2) parameter keeps: ``"global"`` (the whole tensor's,
        :mod:`adam8lib.global_blocks`) or ``"local"`` (its own, lesson 11): the layout's."""
        return self.layout.block_layout

    @property
    def format_tag_key(self) -> str:
        """The key, in every saved state with quantized entries, of :meth:`format_tag`: the layout's."""
        return self.layout.tag_key

    def _check_named_backend(self) -> None:
        """ValueError unless the named backend has a fused step for every elementwise rule of these groups."""
        rules = {r.name: r for g in (self.param_groups or [self.defaults]) for r in self.group_rules(g)}
        missing = [r.name for r in rules.values()
                   if r.elementwise and self.backend not in kernels.backends_for(r, self.format)]
        if missing:
            what = "fp32 states" if self.format is None else f"states in format {self.format.name!r}"
            raise ValueError(f"backend {self.backend!r} has no fused step of the {', '.join(missing)} rule for {what}; "
                             f"use backend='auto' (a fused step where there is one) or 'torch' (the reference step)")

    # ------------------------------------------------------------------ groups and rules
    def rule_for(self, p: torch.Tensor, group: dict[str, Any]) -> UpdateRule:
        """The rule that steps ``p`` (every parameter: :attr:`rule`; Muon8bit picks per shape)."""
        return self.rule

    def rule_group(self, rule: UpdateRule, group: dict[str, Any]) -> dict[str, Any]:
        """The hyper-parameters ``rule`` reads, by its own names (default: the group itself)."""
        return group

    def group_rules(self, group: dict[str, Any]) -> list[UpdateRule]:
        """The rules whose hyper-parameters a group must satisfy."""
        return [self.rule]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            self._check_group(group, f"param group {len(self.param_groups) - 1}")
            for pi, p in enumerate(group["params"]):
                if p.dtype not in PARAM_DTYPES:
                    raise TypeError(f"{type(self).__name__} supports fp32, bf16 and fp16 parameters; got one of "
                                    f"shape {tuple(p.shape)} with dtype {p.dtype}")
                if self.stochastic_rounding and p.dtype != torch.bfloat16:
                    raise TypeError(
                        f"stochastic_rounding=True writes bf16 parameters; got one of shape {tuple(p.shape)} with "
                        f"dtype {p.dtype} (cast the model with .to(torch.bfloat16), or turn stochastic rounding off)"
                    )
                self._check_shardable(p, self.rule_for(p, group), group, pi, len(self.param_groups) - 1)
        except (ValueError, TypeError):
            self.param_groups.pop()
            raise

    def _check_shardable(self, p: torch.Tensor, rule: UpdateRule, group: dict[str, Any], pi: int, gi: int) -> None:
        """ValueError for a sharded (FSDP2 DTensor) parameter that ``rule`` cannot step shard by shard: a rule
        that is not elementwise (Muon's Newton-Schulz orthogonalizes the whole matrix, which no shard holds)."""
        if rule.elementwise or not _sharded(p):
            return
        names = group.get("param_names")
        what = f"parameter {names[pi]!r}" if names and pi < len(names) else f"parameter {pi}"
        raise ValueError(
            f"{type(self).__name__} cannot step {what} of param group {gi} (shape {tuple(p.shape)}, sharded: "
            f"{p.placements}) with the {rule.name} rule: it needs the whole matrix, and each rank holds a shard "
            f"(FSDP2). Keep those matrices unsharded (do not fully_shard the modules that own them), or put them in "
            f"a group that steps them elementwise" + (" (use_muon=False: AdamW)" if "use_muon" in group else ""))

    def _check_group(self, group: dict[str, Any], where: str) -> None:
        for key in OPTIMIZER_LEVEL:
            if key in group and key not in self.group_settings:
                raise ValueError(f"{where} sets {key!r}: it is a setting of the whole {type(self).__name__} "
                                 f"(its constructor's argument), not of a param group")
        for key, instead in self.layout.torch_flags:
            if group.get(key):
                raise ValueError(f"{key}={group[key]!r} is not supported by {type(self).__name__} ({where}): {instead}")
        if "blocksize" in group:  # (shown by the groups of a layout that shows it: the format's, read-only)
            check_blocksize(group["blocksize"])
            if self.format is not None and group["blocksize"] != self.format.blocksize:
                raise ValueError(
                    f"{where} has blocksize={group['blocksize']!r}, this {type(self).__name__} stores its states in "
                    f"blocks of {self.format.blocksize}: the block size is a setting of the whole optimizer (its state "
                    f"format), not of a group; build the optimizer with blocksize={group['blocksize']!r} instead")
        size = group.get("min_8bit_size", 0)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"Invalid min_8bit_size: {size!r} (must be an int >= 0) ({where})")
        for key in ("betas", "ns_coefficients", "adamw_betas"):
            if isinstance(group.get(key), list):
                group[key] = tuple(group[key])
        for rule in self.group_rules(group):
            try:
                rule.check(self.rule_group(rule, group))
            except (ValueError, TypeError) as exc:
                raise type(exc)(f"{exc} ({where})") from None

    # ------------------------------------------------------------------ states
    def state_specs(self, rule: UpdateRule) -> tuple[StateSpec, ...]:
        """``rule``'s states as this optimizer stores them (their keys, :meth:`adam8lib.state_layout.StateLayout.specs`):
        the rule's own (``<name>_codes``/``<name>_absmax``) in the family's layout; AdamW's ``m``/``v`` under
        ``state1``/``absmax1`` and ``state2``/``absmax2`` in lesson 07's."""
        return self.layout.specs(rule)

    def min_size(self, group: dict[str, Any] | None) -> int:
        """The ``min_8bit_size`` that counts for a parameter of ``group``: the group's where groups hold it
        (:attr:`group_settings`), else the optimizer's."""
        if group is not None and "min_8bit_size" in self.group_settings:
            return group.get("min_8bit_size", self.min_8bit_size)
        return self.min_8bit_size

    def group_of(self, p: torch.Tensor) -> dict[str, Any] | None:
        """The param group that holds ``p`` (None if none does)."""
        for group in self.param_groups:
            if any(q is p for q in group["params"]):
                return group
        return None

    def quantized(self, p: torch.Tensor, group: dict[str, Any] | None = None) -> bool:
        """Whether ``p``'s states are stored in :attr:`format` (else in fp32): ``p`` (the whole parameter, for a
        shard) has at least :meth:`min_size` elements. ``group``: ``p``'s (found if not given)."""
        if self.format is None:
            return False
        if group is None and "min_8bit_size" in self.group_settings:
            group = self.group_of(p)
        return p.numel() >= self.min_size(group)

    def _global_blocks(self, p: torch.Tensor) -> bool:
        """Whether ``p`` is the shard of a sharded parameter that keeps the whole tensor's blocks."""
        return self.block_layout == "global" and _sharded(p)

    def moment(self, spec: StateSpec) -> MomentFormat:
        return self.format.m if spec.stored_as == "m" else self.format.v

    def expected_state(self, p: torch.Tensor, rule: UpdateRule,
                       group: dict[str, Any] | None = None) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """``{key: (shape, dtype)}`` of every tensor of ``p``'s state (of its local shard for a sharded
        parameter: one code per element, the scales of the global blocks it touches,
        :mod:`adam8lib.global_blocks`, or of its own blocks with :attr:`block_layout` ``"local"``; quantized
        or fp32 by the whole parameter's size, or as its existing state is). ``group``: ``p``'s param group
        (found if not given)."""
        return dict(self._expected_state(p, rule, group, self._state_kind(p, rule, group)))

    def _state_kind(self, p: torch.Tensor, rule: UpdateRule, group: dict[str, Any] | None,
                    state: dict[str, Any] | None = None) -> bool:
        """Whether ``p``'s states are quantized: as its existing state is (a state made, or loaded, before a
        group's ``min_8bit_size`` changed keeps its kind), else :meth:`quantized`."""
        state = self.state.get(p) if state is None else state
        if state:
            for spec in self.state_specs(rule):
                if spec.kept is not None:
                    continue  # (kept in its dtype in every format: says nothing of the kind)
                if spec.codes_key in state:
                    return True
                if spec.name in state:
                    return False
        return self.quantized(p, group)

    def _expected_state(self, p: torch.Tensor, rule: UpdateRule, group: dict[str, Any] | None,
                        quantized: bool) -> Mapping[str, tuple[tuple[int, ...], torch.dtype]]:
        """:meth:`expected_state` for states quantized or not, remembered for plain tensors (a read-only view:
        this runs for every parameter at every step)."""
        plain = type(p) in _PLAIN or not is_dtensor(p)
        if plain:  # the same for every plain tensor of a shape: remembered (this runs for every parameter and step)
            key = (id(rule), p.shape, quantized)
            known = self.__dict__.get("_expected_states")
            if known is None or known[0] is not self.format or len(known[1]) > 4096:
                known = self.__dict__["_expected_states"] = (self.format, {})
            found = known[1].get(key)
            if found is not None and found[0] is rule:
                return found[1]
        out = {}
        sharded = self._global_blocks(p)
        local = local_tensor(p)
        shape, local_shape = tuple(p.shape), tuple(local.shape)
        for spec in self.state_specs(rule):
            if spec.kept is not None:  # kept in its own dtype, whatever the format
                out[spec.name] = (local_shape, spec.kept_dtype)
            elif quantized:
                fmt = self.moment(spec)
                scales = (shard_scales_numel(fmt, shape, local_shape, block_lead(p, fmt.blocksize)) if sharded
                          else fmt.scales_numel(local_shape))
                out[spec.codes_key] = ((fmt.codes_numel(local.numel()),), fmt.code_dtype)
                out[spec.scales_key] = ((scales,), torch.float32)
            else:
                out[spec.name] = (local_shape, torch.float32)
        if plain:
            out = MappingProxyType(out)
            known[1][key] = (rule, out)
        return out

    def _new_state(self, p: torch.Tensor, rule: UpdateRule, group: dict[str, Any] | None = None) -> dict[str, Any]:
        state: dict[str, Any] = {"step": 0}
        device = local_tensor(p).device
        codes = {s.codes_key: s for s in self.state_specs(rule)}
        for key, (shape, dtype) in self._expected_state(p, rule, group, self.quantized(p, group)).items():
            if key in codes:
                fmt = self.moment(codes[key])
                state[key] = torch.full(shape, fmt.zero_code(), dtype=dtype, device=device)
            else:
                state[key] = torch.zeros(shape, dtype=dtype, device=device)
        if self.layout.codes_first:  # every codes key, then every scales key (as lessons 00 and 07 print them)
            order = {k: i for i, k in enumerate(self.layout.new_state_order(self.state_specs(rule)))}
            state = dict(sorted(state.items(), key=lambda item: order.get(item[0], -1)))
        return state

    def decode(self, state: dict[str, Any], spec: StateSpec, p: torch.Tensor,
               target: torch.Tensor | None = None) -> torch.Tensor:
        """The fp32 values of one state, in the shape of ``target`` (default: ``p``'s local tensor; an fp32
        state: the stored tensor itself). ``p`` is the parameter (a DTensor for a shard: its blocks are global)."""
        target = local_tensor(p) if target is None else target
        if spec.name in state:  # fp32 (updated in place), or kept in bf16 (an fp32 copy, stored back by _encode)
            values = state[spec.name]
            if values.dtype != torch.float32:
                values = values.float()
            return values if values.shape == target.shape else values.view(target.shape)
        fmt = self.moment(spec)
        lead = block_lead(p, fmt.blocksize) if self._global_blocks(p) else 0
        values = fmt.dequantize(state[spec.codes_key], state[spec.scales_key], tuple(target.shape),
                                lead=lead)
        return values.view(target.shape)

    def quantize(self, spec: StateSpec, x: torch.Tensor, fmt: MomentFormat,
                 shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codes, scales)`` of the flat fp32 values ``x`` of one state: the format's own coding. The
        hook to plug another rounding into (tests/test_family_bnb.py plugs in bitsandbytes')."""
        return fmt.quantize(x, shape)

    def _custom_quantize(self) -> bool:
        """Whether :meth:`quantize` is not the format's own coding (overridden, on the class or the instance): then
        the reference step runs, so that the hook is what codes the states."""
        return "quantize" in self.__dict__ or type(self).quantize is not QuantizedStateOptimizer.quantize

    def _encode(self, state: dict[str, Any], spec: StateSpec, x: torch.Tensor, p: torch.Tensor,
                target: torch.Tensor) -> None:
        if spec.name in state:  # fp32: updated in place; kept in another dtype: stored back, rounded to nearest
            stored = state[spec.name]
            if stored.dtype != torch.float32:
                stored.copy_(x.reshape(stored.shape))
            return
        fmt = self.moment(spec)
        if not _sharded(p):
            codes, scales = self.quantize(spec, x.reshape(-1), fmt, tuple(target.shape))
        elif not self._global_blocks(p):  # the shard's own blocks (rank-1 maxima: the whole tensor's)
            rank1 = fmt.uses_rank1(tuple(p.shape))
            codes, scales = fmt.quantize(x.reshape(-1), tuple(target.shape), rank1_maxima_reducer(p) if rank1 else None)
        else:  # the shard of a sharded parameter: the whole tensor's blocks (and rank-1 maxima)
            rank1 = fmt.uses_rank1(tuple(p.shape))
            codes, scales = fmt.quantize(x.reshape(-1), tuple(target.shape), rank1_maxima_reducer(p) if rank1 else None,
                                         lead=block_lead(p, fmt.blocksize),
                                         reduce_blocks=None if rank1 else block_edge_reducer(p, fmt.blocksize))
        state[spec.codes_key].copy_(codes.reshape(-1))
        state[spec.scales_key].copy_(scales.reshape(-1))

    # ------------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure=None):
        """One step. Checks every group, parameter and gradient first: a step that raises changes nothing."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_and_update()
        return loss

    @run_eagerly
    def _check_and_update(self) -> None:
        work = []
        for gi, group in enumerate(self.param_groups):
            self._check_group(group, f"param group {gi}")
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                where = _Where("parameter {} of group {} (shape {})", pi, gi, p)  # (the text: only for a message)
                distributed = not (type(p) in _PLAIN and type(p.grad) in _PLAIN) and (is_dtensor(p) or is_dtensor(p.grad))
                if distributed:
                    param, grad = local_param_and_grad(p)  # TypeError for a DTensor/plain mix
                else:
                    param, grad = p, p.grad
                self._check_param_and_grad(param, grad, where)
                if self.stochastic_rounding and p.dtype != torch.bfloat16:
                    raise TypeError(f"stochastic_rounding=True writes bf16 parameters; {where} is {p.dtype}")
                rule = self.rule_for(p, group)
                if distributed and _sharded(p):
                    self._check_shardable(p, rule, group, pi, gi)
                    local_range(p)  # NotImplementedError for a layout other than FSDP2's (dim 0 of a 1-D mesh)
                    if self._custom_quantize():
                        raise TypeError(f"{where} is sharded (FSDP2): its shard is quantized in the whole tensor's "
                                        f"blocks by the format itself, so an overridden {type(self).__name__}.quantize "
                                        f"cannot run on it; step it unsharded")
                state = self.state.get(p)  # (not self.state[p]: the defaultdict would make an empty state)
                kind = self._state_kind(p, rule, group, state)
                if state:
                    self._check_live_state(p, rule, _Where("the state of parameter {} of group {}", pi, gi), group,
                                           quantized=kind)
                work.append((group, p, param, grad, rule, self._fused_for(p, rule, param, grad, group, quantized=kind)))
        if self.stochastic_rounding or self.__dict__.get("_compressed_masters") is not None:
            for index, (group, p, param, grad, rule, fused) in enumerate(work):
                self._update(group, p, param, grad, rule, fused, index)
            return
        self._run_batched(work)

    def _run_batched(self, work: list) -> None:
        """The step of every parameter in ``work`` (checked), in batches where that gives the same bits as
        :meth:`_update` on each (:func:`adam8lib.batched_step.run_batched`)."""
        batched_step.run_batched(self, work)

    def _ready_state(self, group: dict[str, Any], p: torch.Tensor, param: torch.Tensor, rule: UpdateRule) -> dict:
        """``p``'s state, made (as the first step does) or moved to the device of ``param`` (its local tensor)."""
        state = self.state[p]
        if not state:
            state.update(self._new_state(p, rule, group))
        device = param.device
        for key, value in state.items():
            if key != "step" and torch.is_tensor(value) and value.device != device:  # the model moved since
                state[key] = value.to(device)
        return state

    def init_state(self, params: Iterable[torch.Tensor] | None = None) -> "QuantizedStateOptimizer":
        """Create the states of ``params`` (default: every parameter) now, as the first ``step()`` would
        (codes and scales, or fp32 states; ``step = 0``). Parameters that already have a state keep it.
        Returns the optimizer (for chaining). Useful to measure an optimizer's memory before training, or to
        shard or save states."""
        wanted = None if params is None else {id(p) for p in params}
        for group in self.param_groups:
            for p in group["params"]:
                if (wanted is None or id(p) in wanted) and not self.state.get(p):
                    self.state[p].update(self._new_state(p, self.rule_for(p, group), group))
        return self

    def fused_step(self, p: torch.Tensor) -> kernels.FusedStep | None:
        """The fused step (:class:`adam8lib.kernels.FusedStep`) that steps ``p`` now, or None: the reference
        step (see the module docstring). ``p`` must be a parameter of this optimizer."""
        for group in self.param_groups:
            if any(q is p for q in group["params"]):
                return self._fused_for(p, self.rule_for(p, group), group=group)
        raise ValueError(f"the tensor of shape {tuple(p.shape)} is not a parameter of this {type(self).__name__}")

    def _fused_for(self, p: torch.Tensor, rule: UpdateRule, local: torch.Tensor | None = None,
                   grad: torch.Tensor | None = None, group: dict[str, Any] | None = None,
                   quantized: bool | None = None) -> kernels.FusedStep | None:
        """Which fused step ``p`` takes (None: the reference step). Decided before anything changes: a named
        backend that cannot run on ``p``'s device raises ValueError here. The shard of a sharded parameter
        takes one only where it gives the same bits: no moment with rank-1 scales and no shard boundary
        inside a block (:func:`adam8lib.global_blocks.straddles`), so its blocks are whole and its own; else
        the reference step, whose scales are reduced across the shards (a collective on every rank)."""
        if local is None:
            local = local_tensor(p)
            grad = None if p.grad is None else local_tensor(p.grad)
        if quantized is None:
            quantized = self._state_kind(p, rule, group)
        if (not rule.elementwise or not local.numel() or not quantized
                or self._custom_quantize() or self._needs_reduction(p, rule, group)):
            return None  # (a parameter or gradient that is not contiguous: the step works on a contiguous copy)
        return self._find_fused(rule, local.device)

    def _find_fused(self, rule: UpdateRule, device: torch.device) -> kernels.FusedStep | None:
        """The fused step of ``rule`` for this optimizer's format and backend on ``device`` (None: the reference
        step): the one registry's (:func:`adam8lib.kernels.find_step`; ``backend="torch"``: None). Looked up again
        whenever the registry, :data:`adam8lib.kernels.AUTO_ORDER`, the format or the backend changes (a backend's
        ``supports(device)`` is taken to stay what it was)."""
        # remembered (a step of many small tensors does not look it up for each): keyed by what the answer
        # depends on, the format by identity (the whole cache is dropped when the format object changes)
        key = (kernels.find_step, kernels.registry.version(), id(rule), self.backend, device, kernels.AUTO_ORDER)
        known = self.__dict__.get("_found_steps")
        if known is None or known[0] is not self.format or len(known[1]) > 64:
            known = self.__dict__["_found_steps"] = (self.format, {})
        found = known[1].get(key, _MISSING)
        if found is _MISSING or found[0] is not rule:
            found = (rule, kernels.find_step(rule, self.format, self.backend, device))
            known[1][key] = found
            # the look-up may have imported an optional backend, which registers its steps (a new version)
            known[1][(kernels.find_step, kernels.registry.version()) + key[2:]] = found
        return found[1]

    def _needs_reduction(self, p: torch.Tensor, rule: UpdateRule, group: dict[str, Any] | None = None) -> bool:
        """Whether a step of the sharded parameter ``p`` reduces scales across its shards (rank-1 maxima,
        or blocks cut by a shard boundary): then it takes the reference step, on the whole shard."""
        if type(p) in _PLAIN or not is_dtensor(p) or not _sharded(p) or not self._state_kind(p, rule, group):
            return False
        moments = {self.moment(spec) for spec in self.state_specs(rule) if spec.kept is None}
        return any(m.uses_rank1(tuple(p.shape)) or (self._global_blocks(p) and block_edge_reducer(p, m.blocksize) is not None)
                   for m in moments)

    def _check_param_and_grad(self, p: torch.Tensor, grad: torch.Tensor, where: str) -> None:
        if (is_usual_tensor(p) and is_usual_tensor(grad) and p.dtype in PARAM_DTYPES and grad.dtype in PARAM_DTYPES
                and grad.shape == p.shape and grad.device == p.device):
            return
        name = type(self).__name__
        if getattr(grad, "is_sparse", False) or getattr(grad, "layout", torch.strided) != torch.strided:
            raise RuntimeError(f"{name} does not support sparse gradients: {where}{self.layout.sparse_advice}")
        if p.is_complex() or grad.is_complex():
            raise RuntimeError(f"{name} does not support complex parameters or gradients: {where}")
        for t, what in ((p, where), (grad, f"the gradient of {where}")):
            check_plain_tensor(t, what)
        if p.dtype not in PARAM_DTYPES:
            raise TypeError(f"{where} must be fp32, bf16 or fp16, got {p.dtype}")
        if grad.dtype not in PARAM_DTYPES:
            raise TypeError(f"the gradient of {where} must be floating point (fp32, bf16 or fp16), got {grad.dtype}")
        if grad.shape != p.shape:
            raise ValueError(f"gradient shape {tuple(grad.shape)} does not match {where}")
        if grad.device != p.device:
            raise ValueError(f"the gradient of {where} is on {grad.device}, the parameter on {p.device}")

    def _check_live_state(self, p: torch.Tensor, rule: UpdateRule, where: str, group: dict[str, Any] | None = None,
                          quantized: bool | None = None) -> None:
        """The state a step is about to read has the keys and sizes this optimizer and rule expect (of the kind
        it has, ``quantized`` if given: quantized or fp32), codes and scales contiguous (the kernels read them
        through pointers)."""
        state = self.state[p]
        if quantized is None:
            quantized = self._state_kind(p, rule, group, state)
        for key, (shape, dtype) in self._expected_state(p, rule, group, quantized).items():
            value = state.get(key)
            if (not torch.is_tensor(value) or value.dtype != dtype or value.numel() != math.prod(shape)
                    or (value.dim() == 1 and not value.is_contiguous())):
                raise ValueError(f"{where} has no {dtype} {key!r} of {math.prod(shape)} elements: it was not made "
                                 f"by this {type(self).__name__} (state format {self.format_name()!r}, "
                                 f"min_8bit_size {self.min_8bit_size})")

    def _update(self, group: dict[str, Any], p: torch.Tensor, param: torch.Tensor, grad: torch.Tensor,
                rule: UpdateRule, fused: kernels.FusedStep | None = None, index: int = 0) -> None:
        """Update one parameter (``param``, ``grad``: its local tensors; ``index``: its place among the parameters of
        this step, for the stochastic rounding key). A bf16 parameter with stochastic rounding or an adopted
        compressed master (:meth:`adopt_master_weights`) is stepped in fp32 a chunk at a time where that gives the
        same bits (:mod:`adam8lib.chunked_update`)."""
        state = self._ready_state(group, p, param, rule)
        step = state["step"] + 1
        hyper = self.rule_group(rule, group)
        codec = chunked_update.param_codec(self, p, step, index)
        if codec is None:
            self._step_tensor(p, param.detach(), grad.detach(), state, rule, hyper, step, fused)
        else:
            chunked_update.step_in_chunks(self, p, param, grad, state, rule, hyper, step, fused, codec, group)
        state["step"] = step

    def steps_own_master(self, p: torch.Tensor) -> bool:
        """Whether an adopted compressed master of ``p`` is joined and split by this optimizer's step (a plain bf16
        parameter); the others (a sharded one) are joined whole by the master weights' hooks, as for any optimizer."""
        return p.dtype == torch.bfloat16 and not is_dtensor(p)

    def adopt_master_weights(self, masters) -> bool:
        """Called by :class:`adam8lib.master_weights.CompressedMasterWeights` (``None``: let go): this optimizer
        steps the bf16 parameters that have a correction there on their fp32 master itself, chunk by chunk (the
        join, the step and the split of :data:`adam8lib.rounding.SR_CHUNK` elements at a time, rank-1 moments in
        two passes), instead of the hooks joining each whole parameter into fp32 with an fp32 gradient: the same
        bits, a chunk's temporaries. Returns True (it takes them)."""
        if masters is None:
            self.__dict__.pop("_compressed_masters", None)
        else:
            self.__dict__["_compressed_masters"] = masters
        return True

    def _step_tensor(self, p: torch.Tensor, target: torch.Tensor, grad: torch.Tensor, state: dict[str, Any],
                     rule: UpdateRule, hyper: dict[str, Any], step: int, fused: kernels.FusedStep | None) -> None:
        """One step of ``target`` (the local parameter, an fp32 copy of it, or a chunk of that) with ``state``
        (its states, or views of the chunk's): the fused step in place, or decode, the rule in fp32, the
        non-finite rule, write ``target``, encode. ``p`` is the parameter (its global shape and layout)."""
        if fused is not None:  # in place, the reference step's bits (the registry's calling convention)
            flat, g, states = batched_step.kernel_item(self.state_specs(rule), target, grad, state)
            fused.fn(flat, g, states, rule=rule, fmt=self.format, shape=tuple(target.shape), step=step, group=hyper)
            if not target.is_contiguous():
                target.copy_(flat.view(target.shape))
            return
        values = {spec.name: self.decode(state, spec, p, target) for spec in self.state_specs(rule)}
        quantized = any(s.codes_key in state for s in self.state_specs(rule))
        target.copy_(fp32_step(rule, quantized, target, grad, values, step, hyper))
        for spec in self.state_specs(rule):
            self._encode(state, spec, values[spec.name], p, target)

    # ------------------------------------------------------------------ copy / pickle
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for cache in ("_found_steps", "_expected_states", "_compressed_masters"):  # caches; a master weights' link
            state.pop(cache, None)
        state.update(format=self.format, min_8bit_size=self.min_8bit_size, backend=self.backend,
                     stochastic_rounding=self.stochastic_rounding, seed=self.seed)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.format = state.pop("format", None)
        self.min_8bit_size = state.pop("min_8bit_size", 4096)
        self.backend = state.pop("backend", "auto")
        self.stochastic_rounding = state.pop("stochastic_rounding", False)
        self.seed = state.pop("seed", 0)
        super().__setstate__(state)
        self.defaults.pop("differentiable", None)

    def format_name(self) -> str:
        return FP32 if self.format is None else self.format.name

    def format_fingerprint(self) -> str:
        """The format's name and its moments' fingerprints (the family's tag, :data:`FAMILY_LAYOUT`'s)."""
        return FAMILY_LAYOUT.format_tag(self.format)

    def __repr__(self) -> str:
        blocks = "" if self.format is None else f", blocks of {self.format.m.blocksize}"
        return super().__repr__().replace(
            type(self).__name__ + " (", f"{type(self).__name__} (state format: {self.format_name()}{blocks}", 1)

    # ------------------------------------------------------------------ checkpoints (adam8lib.state_checkpoint)
    def state_dict(self) -> dict[str, Any]:
        """As torch.optim; every state with quantized entries also carries :data:`FORMAT_KEY`. The states of
        a sharded (FSDP2) parameter come in the form ``torch.distributed.checkpoint`` saves and reshards
        (:func:`adam8lib.state_checkpoint.saved_states`)."""
        return state_checkpoint.saved_states(self, super().state_dict())

    def format_tag(self) -> str:
        """What a saved state's codes need to be decoded, saved under :attr:`format_tag_key`: the layout's
        (:meth:`adam8lib.state_layout.StateLayout.format_tag`: the format's name and fingerprint, maps, bits, block
        size, sign rule; lesson 07's: the maps' fingerprint for a format that codes bytes into maps)."""
        return self.layout.format_tag(self.format)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a checkpoint of this class, keeping codes and fp32 scales as they are. Everything is
        checked first (:func:`adam8lib.state_checkpoint.checked_checkpoint`): a checkpoint of another optimizer,
        format, shape or size raises ValueError naming the problem and leaves this optimizer as it was. Runs
        torch's load-state-dict hooks."""
        if not isinstance(state_dict, dict):
            raise ValueError(f"state_dict must be a dict from Optimizer.state_dict(), got {type(state_dict).__name__}")
        state_dict = state_dict.copy()
        for hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        groups, state = state_checkpoint.checked_checkpoint(self, state_dict)
        self.param_groups = groups
        self.state = defaultdict(dict, state)
        for hook in self._optimizer_load_state_dict_post_hooks.values():
            hook(self)


_MISSING = object()
#: Tensor types that are never DTensors (a fast first test, for every parameter at every step).
_PLAIN = (torch.Tensor, torch.nn.Parameter)


class _Where:
    """Which parameter a message is about, made into text only when a message is written (the checks run for
    every parameter at every step): ``str(where)``, or ``f"{where}"``."""

    __slots__ = ("text", "args")

    def __init__(self, text: str, *args: Any) -> None:
        self.text, self.args = text, args

    def __str__(self) -> str:
        args = [tuple(a.shape) if torch.is_tensor(a) else a for a in self.args]
        return self.text.format(*args)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def _sharded(p: torch.Tensor) -> bool:
    """A DTensor parameter with a ``Shard`` placement (FSDP2): each rank holds part of it."""
    if not is_dtensor(p):
        return False
    from torch.distributed.tensor import Shard

    return any(isinstance(pl, Shard) for pl in p.placements)
