"""Adam with low-bit states: ``Adam8bit``/``AdamW8bit`` (lesson 07), ``Adam4bit``/``AdamW4bit`` and
``AdamFp8``/``AdamWFp8`` (lesson 12) — one optimizer, :class:`LowBitAdam`, with a *state format*.

The step, the parameter groups, checkpoints, torch.optim's conventions and FSDP2 support are written
once, here; how the two moments are stored is the state format's business (:mod:`adam8lib.formats`:
``"8bit"``, ``"4bit"``, ``"4bit-naive"``, ``"fp8"``), and what the optimizer does with a format is
decided by what the format stores, never by its name. A format of one byte per element into a map,
blockwise scales and the keep-sign rule (``"8bit"``; :func:`map_kernels_step`) runs through the
map-code backends of :mod:`adam8lib.kernels`; the others through the fused steps the one registry
has for the AdamW rule and their format (:func:`adam8lib.kernels.find_step`):
the C++ ``"cpu"`` kernel (``"auto"`` on the CPU; :mod:`adam8lib.kernels.cpu_formats`) and a Triton
kernel (``"auto"`` on CUDA; :mod:`adam8lib.kernels.triton_fp8`, :mod:`~adam8lib.kernels.triton_4bit`) for ``"fp8"``, ``"4bit"`` and
``"4bit-naive"``, else the reference step (``backend="torch"``: decode, the fp32 update, encode, in
plain PyTorch). Every fused step stores the reference step's codes and scales bit for bit; the CPU
kernel its parameters too. The Triton kernel's fp32 parameters (in the interpreter, on the CPU) are
within 64 units of 2^-23 (2^-17 relative) of the larger of ``|p|`` and the step's ``|update|``
(bf16/fp16 ones: see tests/kernels/test_triton*.py): the two compute the decay, the update and the
square root in different orders and roundings (torch's CPU square root is not correctly rounded, the
kernel's is). Measured (4 formats, 6 steps, lr 1e-2, weight decay 0.1): up to 25-45 of those units.
Counted in ulps of the parameter itself that is thousands where a parameter is near 0 (absolute
differences up to 2.4e-7 there), and for ``"4bit-naive"``, whose ``v`` can decode to 0 (an update of
``lr * m / eps``), absolute differences up to 1e-3 on such huge updates (tested:
tests/test_step_faults.py).

``stochastic_rounding=True`` writes bf16 parameters with stochastic rounding (:mod:`adam8lib.rounding`),
so that updates smaller than half a bf16 ulp survive on average; an element's random bits are keyed by
``(seed, step, the parameter's index among those stepped)`` and its index in the whole parameter, so an
FSDP2 shard rounds exactly as the unsharded tensor does.

What is 8-bit (or 4-bit), and what is not:

* **parameters and gradients keep their own dtype** (fp32, bf16 or fp16) — nothing here
  stores parameters in FP8 or int8;
* the two Adam states ``m`` and ``v`` of every tensor with at least ``min_8bit_size``
  elements are stored as uint8 codes (``state1``, ``state2``) into two shared 256-entry
  maps (signed dynamic map for ``m``, unsigned for ``v``) plus one fp32 ``absmax`` per
  block of ``blocksize`` elements (``absmax1``, ``absmax2``): about 2 bytes per parameter
  instead of 8;
* smaller tensors (biases, LayerNorm weights) keep fp32 states ``exp_avg``/``exp_avg_sq``;
* each step dequantizes, updates in fp32 and requantizes, one chunk of blocks at a time
  (see :mod:`adam8lib.kernels.reference` for the exact maths). Both kinds of state go through
  the same fp32 update, :func:`adam8lib.kernels.reference.adam_update_fp32` (the small
  tensors of a group that share a device and a step count in one batch of
  ``torch._foreach_*`` operations, :func:`~adam8lib.kernels.reference.adam_update_fp32_many`:
  on the CPU the same result bit for bit, without ~18 separate torch calls, or GPU kernel
  launches, per bias or LayerNorm weight).

Weight decay is *decoupled* (AdamW style) in both classes, as in bitsandbytes, where
``Adam8bit`` and ``AdamW8bit`` differ only in the default ``weight_decay`` (0 vs 1e-2).

The non-finite rule: ``m' = beta1 m + (1 - beta1) g`` and ``v' = beta2 v + (1 - beta2) g^2``
are computed in fp32; an element where ``m'`` or ``v'`` is not finite (a NaN/Inf gradient, or a
huge finite gradient such as 1e30 whose square overflows fp32) has its ``m`` and ``v`` reset to
0 and its parameter left unchanged that step (no update, no decay). The block's absmax is taken
after the reset, so one bad element never spreads NaN to its block. (torch.optim.AdamW keeps
``v = inf`` there, which freezes that element for good; no NaN either.)

As a ``torch.optim.Optimizer`` it follows torch's conventions: ``zero_grad``, closures, step
and state-dict hooks (``load_state_dict`` runs the pre-hooks on the checkpoint it is given and
the post-hooks after the state is in place), LR schedulers (OneCycleLR may cycle ``betas``),
``GradScaler``, ``copy.deepcopy``/pickle/``torch.save`` (the backend and the maps travel with
it), and ``torch.compile`` (each parameter's update runs eagerly: a graph break, never a
traced-away tensor). Flags of torch's Adam it does not implement (``maximize``, ``amsgrad``,
``foreach``, ``fused``, ``capturable``, ``differentiable``) raise ValueError when set, in the
constructor, in an added group, in a loaded checkpoint or at ``step()``.

FSDP2 (DTensor parameters): every state format steps each rank's local shard, with states sized
to the shard and low-bit or fp32 decided by the full size; blocks are local to the shard. The
4-bit format's rank-1 scales of ``v`` all-reduce (MAX) their column maxima across the shards at
every step (a collective in ``step()``; an empty shard takes part too), so a sharded run equals
the unsharded one bit for bit wherever the shards start on block boundaries. ``state_dict()`` and
``torch.distributed.checkpoint`` round-trip bit-identical on the same world size and load on
another one (:mod:`adam8lib.distributed`).

Devices: states are created on the parameter's device and follow it when the model is moved
after the optimizer was built (``model.to(device)``); ``backend="auto"`` is resolved per
device at every step.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable

import torch

from . import kernels
from .distributed import (global_offset, local_param_and_grad, local_tensor, rank1_maxima_reducer,
                          to_checkpoint_state, to_local_state)
from .kernels.contract import PARAM_DTYPES, check_plain_tensor, is_usual_tensor
from .kernels.reference import format_reference_step
from .rules.adamw import AdamWRule
from .rules.base import StateSpec
from .formats import FORMATS, StateFormat, get_format
from .quant import MAP_FINGERPRINTS, check_blocksize, dynamic_map, map_fingerprint
from .rounding import SR_CHUNK, element_key, state_chunks, stochastic_round_to_bf16

#: The update rule of these optimizers (issue 35: the one core's AdamW rule): its checks of the hyper-parameters,
#: its fp32 update, and the fused steps (:mod:`adam8lib.kernels.registry`) of their low-bit formats.
_ADAMW = AdamWRule()
#: The rule's states as these optimizers store them (their checkpoints' keys): ``m`` quantized as
#: ``state1``/``absmax1``, ``v`` as ``state2``/``absmax2``; in fp32 (small tensors) ``exp_avg``/``exp_avg_sq``.
STATE_SPECS = (StateSpec("exp_avg", "m", codes="state1", scales="absmax1"),
               StateSpec("exp_avg_sq", "v", codes="state2", scales="absmax2"))
assert tuple((s.name, s.stored_as) for s in STATE_SPECS) == tuple((s.name, s.stored_as) for s in _ADAMW.states)

__all__ = ["LowBitAdam", "Adam8bit", "AdamW8bit", "Adam4bit", "AdamW4bit", "AdamFp8", "AdamWFp8", "UNSUPPORTED_FLAGS"]

_STATE_KEYS_8BIT = tuple(s.codes_key for s in STATE_SPECS) + tuple(s.scales_key for s in STATE_SPECS)
_STATE_KEYS_32BIT = tuple(s.name for s in STATE_SPECS)
_GROUP_KEYS = ("lr", "betas", "eps", "weight_decay", "blocksize", "min_8bit_size")
#: The key, in the saved state of every parameter with 8-bit states, of the fingerprint of the maps
#: its codes index (:func:`adam8lib.quant.map_fingerprint` of qmap1 and qmap2). It travels with the
#: codes, through torch.save, ZeRO's consolidated state dict and torch.distributed.checkpoint.
MAPS_KEY = "qmap_fingerprint"
#: torch.optim.Adam(W) flags this optimizer does not implement, with what to do instead.
UNSUPPORTED_FLAGS = {
    "maximize": "negate the loss instead",
    "amsgrad": "AMSGrad needs a third state, which 8-bit Adam does not keep",
    "foreach": "the backends have their own loops; drop the flag",
    "fused": "choose a fused kernel with backend='cpu' or 'triton' instead",
    "capturable": "CUDA-graph capture is not supported",
    "differentiable": "the 8-bit step is not differentiable",
}


class LowBitAdam(torch.optim.Optimizer):
    """Adam with low-bit, blockwise-scaled states (decoupled weight decay), in a given state format.

    Args:
        params: parameters or param groups (each group may set ``lr``, ``betas``, ``eps``,
            ``weight_decay``, ``blocksize``, ``min_8bit_size``).
        lr, betas, eps, weight_decay: as in ``torch.optim.AdamW``.
        blocksize: elements per scale block, a power of two in 64…4096; ``None``: the format's
            (256 for 8-bit and FP8 as in bitsandbytes and torchao; 128 for 4-bit as in Li et al.).
        min_8bit_size: tensors with fewer elements keep fp32 states (4096, as bitsandbytes).
        backend: ``"auto"``, ``"torch"`` (reference), ``"cpu"``, ``"triton"``, or another
            registered backend (see :mod:`adam8lib.kernels`); :func:`backends_of` a format: every
            backend for the 8-bit layout, else ``"auto"``, ``"torch"`` (the reference step) and the
            backends with a fused AdamW step for the format in the registry
            (:func:`adam8lib.kernels.backends_for`: ``"cpu"`` and ``"triton"`` for the other three).
        state_format: ``"8bit"``, ``"4bit"``, ``"4bit-naive"``, ``"fp8"`` or a
            :class:`~adam8lib.formats.StateFormat`; ``None``: the class's (:attr:`state_format`).
        stochastic_rounding: write bf16 parameters with stochastic rounding (every parameter
            must then be bf16); ``seed`` seeds it (the same seed gives the same bits).
        maximize, amsgrad, foreach, fused, capturable, differentiable: accepted only with a
            false value (what this optimizer does); anything else raises ValueError.
    """

    #: The format of the classes below (``Adam8bit``: "8bit", ``Adam4bit``: "4bit", ...).
    state_format: str = "8bit"
    #: Added to each parameter's index (its place among the parameters of one step) in the stochastic
    #: rounding key: the public hook :func:`adam8lib.release.release_gradients` sets while it steps one
    #: parameter, so that it rounds with the index it has in a full step.
    rounding_offset: int = 0

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        blocksize: int | None = None,
        min_8bit_size: int = 4096,
        backend: str = "auto",
        state_format: str | StateFormat | None = None,
        stochastic_rounding: bool = False,
        seed: int = 0,
        **torch_flags: Any,
    ) -> None:
        for key in torch_flags:
            if key not in UNSUPPORTED_FLAGS:
                raise TypeError(f"{type(self).__name__}.__init__() got an unexpected keyword argument {key!r}")
        _check_flags(torch_flags, f"{type(self).__name__}()", type(self).__name__)
        _check_backend_name(backend)
        fmt = get_format(type(self).state_format if state_format is None else state_format)
        kernels_here = backends_of(fmt)
        if backend not in kernels_here:
            raise ValueError(f"state_format={fmt.name!r} has the backends {', '.join(map(repr, kernels_here))}; "
                             f"backend {backend!r} has no step for its states")
        if not isinstance(stochastic_rounding, bool):
            raise TypeError(f"stochastic_rounding must be a bool, got {type(stochastic_rounding).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        if blocksize is not None:  # the block size has one home: the format (the groups show it)
            fmt = fmt.with_blocksize(check_blocksize(blocksize))
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
            blocksize=fmt.blocksize, min_8bit_size=min_8bit_size,
        )
        self.format = fmt
        self._check_group(defaults, "the defaults")
        self.backend = backend
        self.stochastic_rounding = stochastic_rounding
        self.seed = seed
        self.qmap1 = dynamic_map(signed=True)
        self.qmap2 = dynamic_map(signed=False)
        self._device_maps: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        super().__init__(params, defaults)

    # ------------------------------------------------------------------ groups
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            group["betas"] = tuple(group["betas"])
            self._check_group(group, f"param group {len(self.param_groups) - 1}")
            for p in group["params"]:
                if p.dtype not in PARAM_DTYPES:
                    raise TypeError(
                        f"{type(self).__name__} supports fp32, bf16 and fp16 parameters; got one of shape "
                        f"{tuple(p.shape)} with dtype {p.dtype}"
                    )
                if self.stochastic_rounding and p.dtype != torch.bfloat16:
                    raise TypeError(
                        f"stochastic_rounding=True writes bf16 parameters; got one of shape {tuple(p.shape)} with "
                        f"dtype {p.dtype} (cast the model with .to(torch.bfloat16), or turn stochastic rounding off)"
                    )
        except (ValueError, TypeError):
            self.param_groups.pop()
            raise

    # ------------------------------------------------------------------ state
    def init_state(self, params: Iterable[torch.Tensor] | None = None) -> "LowBitAdam":
        """Create the states of ``params`` (default: every parameter) now, as the first
        ``step()`` would (codes and absmax, or fp32 moments; ``step = 0``). Parameters that
        already have a state keep it. Returns the optimizer (for chaining).

        Useful to measure an optimizer's memory before training, or to shard/save states.
        """
        wanted = None if params is None else {id(p) for p in params}
        for group in self.param_groups:
            for p in group["params"]:
                if (wanted is None or id(p) in wanted) and not self.state[p]:
                    self.state[p].update(self._new_state(group, p))
        return self

    def _check_group(self, group: dict[str, Any], where: str) -> None:
        """ValueError naming the setting unless ``group`` is one this optimizer can step with: its
        hyper-parameters valid, and its ``blocksize`` the optimizer's (the format's: one block size for
        the whole optimizer, which every group shows and none may change)."""
        _check_group(group, where, type(self).__name__)
        if group["blocksize"] != self.format.blocksize:
            raise ValueError(
                f"{where} has blocksize={group['blocksize']!r}, this {type(self).__name__} stores its states in blocks "
                f"of {self.format.blocksize}: the block size is a setting of the whole optimizer (its state format), "
                f"not of a group; build the optimizer with blocksize={group['blocksize']!r} instead")

    def _new_state(self, group: dict[str, Any], p: torch.Tensor) -> dict[str, Any]:
        # a sharded (DTensor) parameter: low-bit or not by the FULL size, states sized to the local shard
        # (blocks of the shard; rank-1 row maxima of its rows and column maxima of the whole tensor, see
        # _step_by_format); every moment starts at 0: the codes of 0, scales 0 (8-bit: codes 127 and 0)
        full, p = p.numel(), local_tensor(p)
        if full >= group["min_8bit_size"]:
            return {"step": 0, **self.format.new_state(tuple(p.shape), p.device)}
        return {
            "step": 0,
            "exp_avg": torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format),
            "exp_avg_sq": torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format),
        }

    def _maps(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The two quantization maps on ``device`` (one copy per device, made on first use)."""
        maps = self._device_maps.get(device)
        if maps is None:
            maps = self._device_maps[device] = (self.qmap1.to(device), self.qmap2.to(device))
        return maps

    # ------------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure=None):
        """One optimizer step. Checks every parameter and gradient first, so a bad one changes nothing."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_and_update()
        return loss

    @kernels.run_eagerly
    def _check_and_update(self) -> None:
        """The step proper, always eager (under torch.compile: one graph break, real tensors)."""
        # everything a step reads is checked before the first state or parameter changes: every group's
        # settings, every parameter and gradient, every existing state's keys and sizes
        work = []
        for gi, group in enumerate(self.param_groups):
            self._check_group(group, f"param group {gi}")
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                work.append((group, p, *self._local_tensors(p, gi, pi)))
                state = self.state.get(p)  # (not self.state[p]: a defaultdict would make an empty one)
                if state:
                    self._check_live_state(p, state, f"the state of parameter {pi} of group {gi}")
        pending: dict[int, dict] = {}  # states counted but not yet updated: uncounted if the update raises
        try:
            self._run(work, pending)
        except BaseException:
            for state in pending.values():
                state["step"] -= 1
            raise

    def _run(self, work: list, pending: dict[int, dict]) -> None:
        if type(self)._step_map_codes is not LowBitAdam._step_map_codes or not self._map_kernels or self.stochastic_rounding:
            # a subclass with its own 8-bit step, a format the map-code kernels do not step, or stochastic
            # rounding: one parameter at a time
            for index, (group, p, param, grad) in enumerate(work):
                self._update(group, p, param, grad, index, pending)
            return
        # the 8-bit tensors of each group (and device) go to the backend together: one call for
        # the group where the backend can take them at once (the cpu backends), which saves most
        # of the per-tensor cost of crossing into the kernel; the same result, bit for bit
        # (and the small tensors with fp32 states likewise, per group, device and step count,
        # with torch's _foreach ops: the same operations as one tensor at a time, bit for bit on
        # the CPU)
        batches: dict[tuple[int, torch.device], tuple[dict[str, Any], list]] = {}
        small: dict[tuple[int, torch.device, int], tuple[dict[str, Any], list]] = {}
        own_32bit = type(self)._step_32bit is not LowBitAdam._step_32bit
        for group, p, param, grad in work:
            state = self._prepare(group, p, param)
            pending[id(state)] = state
            if "state1" not in state:
                if own_32bit or not _fp32_batchable(param, state):
                    self._step_32bit(group, param, grad, state)
                    del pending[id(state)]
                else:
                    key = (id(group), param.device, state["step"])
                    small.setdefault(key, (group, []))[1].append((param, grad, state))
            elif param.numel():  # an empty shard (more ranks than rows): nothing to update here
                batches.setdefault((id(group), param.device), (group, []))[1].append((param, grad, state))
            else:
                del pending[id(state)]
        for step_many, groups in ((self._step_32bit_many, small), (self._step_map_codes_many, batches)):
            for group, entries in groups.values():
                step_many(group, entries)
                for _, _, state in entries:
                    del pending[id(state)]

    def _local_tensors(self, p: torch.Tensor, group_index: int, param_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(parameter, gradient)`` as the update sees them, after checking them.

        A plain parameter is ``(p, p.grad)``; a sharded one (an FSDP2 DTensor, with a DTensor
        gradient placed alike) is its local shard ``(p.to_local(), p.grad.to_local())``. This is
        the one place where sharding is mapped; the update only ever sees plain dense tensors.
        """
        param, grad = local_param_and_grad(p)  # TypeError for a DTensor/plain mix
        _check_param_and_grad(param, grad, group_index, param_index, p.shape, type(self).__name__)
        return param, grad

    @property
    def _map_kernels(self) -> bool:
        """Whether the low-bit states go through the map-code kernels of :mod:`adam8lib.kernels`
        (:func:`~adam8lib.kernels.adam8bit_step_many`, every registered backend, batched per group): a
        format whose codes align with the elements (one byte per code into a map, blockwise scales), keeps
        signs and has one block size (:func:`map_kernels_step`). Other formats take :meth:`_step_by_format`."""
        return map_kernels_step(self.format)

    def _state_spec(self, shape: tuple[int, ...]) -> dict[str, tuple[int, torch.dtype]]:
        """``{key: (elements, dtype)}`` of the low-bit state of a (local) tensor of ``shape``: the format's
        (:meth:`~adam8lib.formats.StateFormat.state_spec`); a subclass with other scales says so here."""
        return self.format.state_spec(shape)

    def _check_live_state(self, p: torch.Tensor, state: dict[str, Any], where: str) -> None:
        """ValueError unless the state a step is about to read has the keys, dtypes and sizes this
        optimizer makes for ``p`` (its state format and block size, on the local shard): a state edited by
        hand, or a group's block size changed after the states exist, is found before anything changes."""
        local = local_tensor(p)
        if "state1" in state:
            expected = self._state_spec(tuple(local.shape))
        else:
            expected = {k: (local.numel(), torch.float32) for k in _STATE_KEYS_32BIT}
        for key, (count, dtype) in expected.items():
            value = state.get(key)
            if not torch.is_tensor(value) or value.numel() != count or (key in _STATE_KEYS_8BIT and value.dtype != dtype):
                got = f"{value.dtype}[{value.numel()}]" if torch.is_tensor(value) else type(value).__name__
                raise ValueError(
                    f"{where}: {key!r} is {got}, but this {type(self).__name__} (state format {self.format.name!r}, "
                    f"blocks of {self.format.blocksize}) keeps {dtype}[{count}] for a parameter of shape "
                    f"{tuple(local.shape)}: the state was not made with these settings")
        step = state.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"{where}: 'step' must be a Python int >= 0, got {step!r}")

    def _prepare(self, group: dict[str, Any], p: torch.Tensor, param: torch.Tensor) -> dict[str, Any]:
        """A parameter's states, created or moved to its device, with the step counted."""
        state = self.state[p]
        if not state:
            state.update(self._new_state(group, p))
        else:
            _follow_device(state, param.device)
        state["step"] += 1
        return state

    def _update(self, group: dict[str, Any], p: torch.Tensor, param: torch.Tensor, grad: torch.Tensor,
                index: int = 0, pending: dict[int, dict] | None = None) -> None:
        """Update one parameter: create or move its states, count the step, run the update. With
        stochastic rounding the update works on an fp32 copy of the (bf16) parameter, which is then
        rounded stochastically, keyed by the step count, the parameter's ``index`` and each element's
        index in the whole parameter; a parameter with blockwise low-bit states is updated and rounded
        :data:`SR_CHUNK` elements at a time (whole blocks: the same bits as at once), so the fp32 copy
        is one chunk's, not the parameter's."""
        state = self._prepare(group, p, param)
        if pending is not None:
            pending[id(state)] = state
        if not self.stochastic_rounding:
            self._step_state(group, p, param, grad, state)
        else:
            key, offset = element_key(self.seed, state["step"], self.rounding_offset + index), global_offset(p)
            for a, b, part in self._rounding_chunks(p, param, state):
                flat = param if part is state else param.view(-1)[a:b]
                target = flat.float()
                self._step_state(group, p, target, grad if part is state else grad.reshape(-1)[a:b], part)
                stochastic_round_to_bf16(target, key=key, start=offset + a, out=flat)
        if pending is not None:
            del pending[id(state)]

    def _step_state(self, group: dict[str, Any], p: torch.Tensor, target: torch.Tensor, grad: torch.Tensor,
                    state: dict[str, Any]) -> None:
        """The update of ``target`` (the local parameter, its fp32 copy, or a chunk of that) with ``state``."""
        if "state1" in state and not self._map_kernels:
            self._step_by_format(group, target, grad, state, reduce_maxima=self._maxima_reducer(group, p))
        elif "state1" in state:
            self._step_map_codes(group, target, grad, state)
        else:
            self._step_32bit(group, target, grad, state)

    def _rounding_chunks(self, p: torch.Tensor, param: torch.Tensor, state: dict[str, Any]):
        """``(start, stop, state)`` pieces a stochastically rounded update steps: ``[(0, n, state)]`` (the
        whole tensor), or, for blockwise low-bit states of a contiguous parameter larger than
        :data:`SR_CHUNK`, chunks of whole blocks with views of the states' codes and scales (blocks are
        independent, the rule elementwise, the rounding keyed by the element: the same bits). Rank-1
        scales need the whole tensor, and a subclass with its own 8-bit step may scale otherwise."""
        n, fmt, shape = param.numel(), self.format, tuple(p.shape)
        if ("state1" not in state or n <= SR_CHUNK or not param.is_contiguous()
                or type(self)._step_map_codes is not LowBitAdam._step_map_codes
                or fmt.m.uses_rank1(shape) or fmt.v.uses_rank1(shape)
                or fmt.m.blocksize != fmt.v.blocksize or SR_CHUNK % fmt.m.blocksize):
            return [(0, n, state)]
        return state_chunks(n, state, [(s.codes_key, s.scales_key, fmt.m if s.stored_as == "m" else fmt.v)
                                       for s in STATE_SPECS], chunk=SR_CHUNK)

    def _maxima_reducer(self, group: dict[str, Any], p: torch.Tensor):
        """The all-reduce that gives a shard of a sharded (FSDP2) parameter the rank-1 scales of the
        whole tensor (:func:`adam8lib.distributed.rank1_maxima_reducer`), or None: a plain
        parameter, or no moment of this format with rank-1 scales for ``p``'s (full) shape."""
        fmt = self.format
        if not (fmt.m.uses_rank1(tuple(p.shape)) or fmt.v.uses_rank1(tuple(p.shape))):
            return None
        return rank1_maxima_reducer(p)

    def _step_by_format(self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any],
                     reduce_maxima=None) -> None:
        """The reference step of any state format: decode m and v, the fp32 update, encode them again.
        (fp32 temporaries the size of the tensor; the 8-bit format has fused backends instead.)

        ``reduce_maxima`` (the local shard of a sharded parameter with rank-1 scales): the hook that
        all-reduces the shard's axis maxima into the whole tensor's (:meth:`_maxima_reducer`). Such a
        step takes part in a collective on every rank, an empty shard too, and always runs the
        reference step (a fused kernel computes its scales from the shard alone)."""
        fmt, shape = self.format, tuple(p.shape)
        if not p.numel():
            if reduce_maxima is not None:  # nothing to update, but this rank's part of the all-reduce
                empty = torch.zeros(0, dtype=torch.float32, device=p.device)
                fmt.encode_(state, empty, empty, shape, reduce_maxima)
            return
        fused = None if reduce_maxima is not None else self._fused_step(fmt, p.device)
        beta1, beta2 = group["betas"]
        if fused is not None:
            flat = p.view(-1) if p.is_contiguous() else p.contiguous().view(-1)
            states = tuple((state[s.codes_key], state[s.scales_key]) for s in STATE_SPECS)
            fused.fn(flat, grad.reshape(-1).contiguous(), states, rule=_ADAMW, fmt=fmt, shape=shape,
                     step=state["step"], group=dict(lr=group["lr"], betas=(beta1, beta2), eps=group["eps"],
                                                    weight_decay=group["weight_decay"]))
            if flat.data_ptr() != p.data_ptr():
                p.copy_(flat.view(shape))
            return
        format_reference_step(p, grad, state, fmt, shape=shape, reduce_maxima=reduce_maxima, step=state["step"],
                              lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                              weight_decay=group["weight_decay"])

    def _fused_step(self, fmt: StateFormat, device: torch.device):
        """The fused step (:class:`adam8lib.kernels.FusedStep`) this low-bit step runs, or None for the
        reference step: the one registry's ``("adamw", fmt, backend)`` step
        (:func:`adam8lib.kernels.find_step`): the backend named, or with ``"auto"`` the first of
        :data:`adam8lib.kernels.AUTO_ORDER` that has one and runs on ``device`` (never the Triton
        interpreter). Both moments need one block size."""
        if self.backend == "torch" or fmt.m.blocksize != fmt.v.blocksize:
            return None
        return kernels.find_step(_ADAMW, fmt, self.backend, device)

    def _step_map_codes_many(self, group: dict[str, Any], entries: list[tuple[torch.Tensor, torch.Tensor, dict]]) -> None:
        """The 8-bit update of several (non-empty) parameters of one group on one device, each stepped as if
        on its own: the batched form (``many``) of the one registry's fused AdamW step for this format and
        backend (:func:`adam8lib.kernels.find_step`; one call of the backend's ``step_many`` where it has one),
        or, with ``backend="torch"`` (no fused step: the map-code reference kernel) or maps other than the
        format's (:class:`~adam8lib.variants.Adam8bitVariant`'s linear ones),
        :func:`adam8lib.kernels.adam8bit_step_many` with this optimizer's maps."""
        items, copies = [], []
        for p, grad, state in entries:
            flat = p.view(-1) if p.is_contiguous() else p.contiguous().view(-1)
            if not p.is_contiguous():
                copies.append((p, flat))  # we work on a contiguous copy: written back below
            grad = grad.reshape(-1)
            if not grad.is_contiguous():
                grad = grad.contiguous()
            items.append((flat, grad, ((state["state1"], state["absmax1"]), (state["state2"], state["absmax2"]))))
        device, steps = entries[0][0].device, [state["step"] for _, _, state in entries]
        fused = self._map_codes_step(device) if self._format_maps() else None
        if fused is not None and fused.many is not None:
            fused.many(items, rule=_ADAMW, fmt=self.format, shapes=[p.shape for p, _, _ in entries], steps=steps,
                       group=group)
        else:
            kernels.adam8bit_step_items(items, *self._maps(device), steps=steps, group=group,
                                        blocksize=self.format.blocksize, backend=self.backend)
        for p, flat in copies:
            p.copy_(flat.view(p.shape))

    def _map_codes_step(self, device: torch.device):
        """:meth:`_fused_step` of this optimizer's format on ``device``, remembered until the backend, the format
        or the registry changes (a batched step of many small tensors does not look it up again each time)."""
        key = (kernels.find_step, kernels.registry.version(), self.backend, device, self.format)
        known = self.__dict__.get("_map_codes_step_known")
        if known is not None and known[0] == key:
            return known[1]
        fused = self._fused_step(self.format, device)
        key = (kernels.find_step, kernels.registry.version(), self.backend, device, self.format)  # the lookup may
        # have imported an optional backend, which registers its steps (a new version)
        self.__dict__["_map_codes_step_known"] = (key, fused)
        return fused

    def _format_maps(self) -> bool:
        """Whether this optimizer's maps are its format's (what the registry's fused steps decode with); the
        answer is kept for the map tensors it was given for (one comparison, not one per step)."""
        known = self.__dict__.get("_format_maps_known")
        if known is not None and known[0] is self.qmap1 and known[1] is self.qmap2 and known[2] is self.format:
            return known[3]
        m, v = self.format.m.qmap(), self.format.v.qmap()
        same = all(ours is theirs or (theirs is not None and ours.shape == theirs.shape and ours.dtype == theirs.dtype
                                      and ours.device == theirs.device and torch.equal(ours, theirs))
                   for ours, theirs in ((self.qmap1, m), (self.qmap2, v)))
        self.__dict__["_format_maps_known"] = (self.qmap1, self.qmap2, self.format, same)
        return same

    def _step_map_codes(self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]) -> None:
        """The 8-bit update of one parameter (what a subclass overrides to change the step)."""
        if p.numel():  # an empty shard (more ranks than rows): nothing to update here
            self._step_map_codes_many(group, [(p, grad, state)])

    def _step_32bit(self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]) -> None:
        """fp32 states for small tensors: the AdamW rule's fp32 update, non-finite rule included."""
        p.copy_(_ADAMW.update(p.float(), grad.float(), state, step=state["step"], group=group))

    def _step_32bit_many(self, group: dict[str, Any], entries: list[tuple[torch.Tensor, torch.Tensor, dict]]) -> None:
        """:meth:`_step_32bit` for several parameters of one group on one device with the same
        step count, in one :meth:`AdamWRule.update_many <adam8lib.rules.adamw.AdamWRule.update_many>`
        (:func:`~adam8lib.kernels.reference.adam_update_fp32_many`; on the CPU bit for bit the same)."""
        work = [(p, p.float()) for p, _, _ in entries]  # fp32 p: itself (updated in place)
        _ADAMW.update_many([w for _, w in work], [g.float() for _, g, _ in entries], [st for _, _, st in entries],
                           step=entries[0][2]["step"], group=group)
        for p, w in work:
            if w is not p:
                p.copy_(w)

    # ------------------------------------------------------------------ copy / pickle
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()  # defaults, state, param_groups (as torch.optim)
        state = {k: v for k, v in state.items()  # caches, made again on use
                 if k not in ("_format_maps_known", "_map_codes_step_known")}
        state.update(backend=self.backend, qmap1=self.qmap1, qmap2=self.qmap2, format=self.format,
                     stochastic_rounding=self.stochastic_rounding, seed=self.seed)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        backend = state.pop("backend", "auto")
        qmap1, qmap2 = state.pop("qmap1", None), state.pop("qmap2", None)
        self.format = get_format(state.pop("format", type(self).state_format))
        self.stochastic_rounding = state.pop("stochastic_rounding", False)
        self.seed = state.pop("seed", 0)
        super().__setstate__(state)
        self.defaults.pop("differentiable", None)  # torch adds it; not a hyperparameter here
        blocksize = self.defaults.get("blocksize", self.format.blocksize)
        if blocksize != self.format.blocksize:  # pickled before the block size lived in the format
            self.format = self.format.with_blocksize(blocksize)
        self.backend = backend
        self.qmap1 = dynamic_map(signed=True) if qmap1 is None else qmap1
        self.qmap2 = dynamic_map(signed=False) if qmap2 is None else qmap2
        self._device_maps = {}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """As ``torch.optim``; the 8-bit states of a DTensor (FSDP2) parameter come as DTensors
        that ``torch.distributed.checkpoint`` can save and reshard (see :mod:`adam8lib.distributed`).

        The saved state of every parameter with 8-bit states also carries ``"qmap_fingerprint"``,
        the fingerprint of the two maps its codes index (:func:`adam8lib.quant.map_fingerprint`):
        a checkpoint is loaded only into an optimizer with the same maps, so its codes decode to
        the same values on any machine."""
        sd = super().state_dict()
        params = [(group, p) for group in self.param_groups for p in group["params"]]
        for index, (group, p) in enumerate(params):
            if index in sd["state"]:
                saved = to_checkpoint_state(p, sd["state"][index], self.format.blocksize, self.format)
                if "state1" in saved:
                    saved = {**saved, MAPS_KEY: self._codes_fingerprint()}
                sd["state"][index] = saved
        return sd

    def _codes_fingerprint(self) -> str:
        """What a saved state's codes need to be decoded (:func:`codes_fingerprint` of this optimizer's
        format and maps)."""
        return codes_fingerprint(self.format, self.qmap1, self.qmap2)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a checkpoint of this class (``state_dict()``), keeping uint8 codes and fp32 absmax
        as they are (torch would cast states to the parameter dtype).

        As torch does, the load-state-dict pre-hooks see (and may replace) the checkpoint first
        and the post-hooks run once the state is in place. Everything is checked before anything
        changes: a checkpoint of another optimizer (torch.optim.AdamW, bitsandbytes), or one with
        wrong sizes or dtypes, unknown keys, a non-finite absmax or a bad step count raises
        ValueError naming the problem and leaves this optimizer as it was.
        """
        if not isinstance(state_dict, dict):
            raise ValueError(f"state_dict must be a dict from Optimizer.state_dict(), got {type(state_dict).__name__}")
        state_dict = state_dict.copy()  # as torch does: hooks may edit the top level freely
        for hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        groups, state = self._checked_checkpoint(state_dict)
        self.param_groups = groups
        self.state = defaultdict(dict, state)
        for hook in self._optimizer_load_state_dict_post_hooks.values():
            hook(self)

    def _checked_checkpoint(self, state_dict: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[torch.Tensor, dict]]:
        """Validate a checkpoint; return (new param_groups, new state) without changing anything."""
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError("state_dict must have 'state' and 'param_groups' (from Optimizer.state_dict())")
        saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
        if not isinstance(saved_groups, (list, tuple)) or not isinstance(saved_state, dict):
            raise ValueError("state_dict['param_groups'] must be a list and state_dict['state'] a dict")
        origin = _foreign_origin(state_dict)
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"loaded state dict has {len(saved_groups)} parameter groups, this optimizer has {len(self.param_groups)}"
            )
        for pid, saved in saved_state.items():  # states in another format: say so first, in the user's terms
            if isinstance(saved, dict) and "state1" in saved:
                self._check_maps(saved.get(MAPS_KEY), f"the state of parameter {pid!r}", origin)
        new_groups, id_to_param, id_to_group = [], {}, {}
        for gi, (current, saved) in enumerate(zip(self.param_groups, saved_groups)):
            where = f"param group {gi} of the loaded state dict"
            if not isinstance(saved, dict) or not isinstance(saved.get("params"), (list, tuple)):
                raise ValueError(f"{where} must be a dict with a 'params' list")
            missing = [k for k in _GROUP_KEYS if k not in saved]
            if missing:
                raise ValueError(f"{where} has no {', '.join(map(repr, missing))}: not an "
                                 f"{type(self).__name__} checkpoint{origin}")
            if len(saved["params"]) != len(current["params"]):
                raise ValueError(
                    f"{where} has {len(saved['params'])} parameters, this optimizer's group has {len(current['params'])}"
                )
            group = {k: v for k, v in saved.items() if k != "params"}
            group["params"] = current["params"]
            if "param_names" in current and "param_names" not in group:
                group["param_names"] = current["param_names"]
            try:
                group["betas"] = tuple(group["betas"])
            except TypeError:
                raise ValueError(f"{where}: betas must be a pair of floats, got {group['betas']!r}") from None
            self._check_group(group, where)
            new_groups.append(group)
            for pid, p in zip(saved["params"], current["params"]):
                id_to_param[pid], id_to_group[pid] = p, group
        new_state = {}
        for pid, saved in saved_state.items():
            if pid not in id_to_param:
                raise ValueError(f"state for unknown parameter id {pid!r}")
            p = id_to_param[pid]
            where = f"state of parameter {pid!r} (shape {tuple(p.shape)})"
            if isinstance(saved, dict) and "state1" in saved:
                self._check_maps(saved.get(MAPS_KEY), where, origin)
                saved = {k: v for k, v in saved.items() if k != MAPS_KEY}
            if isinstance(saved, dict):  # DCP / another world size: this rank's plain local state
                saved = to_local_state(p, saved, self.format.blocksize, (self.qmap1, self.qmap2),
                                       self.format)
            _check_saved_state(p, saved, self.format, where, origin)
            new_state[p] = {
                k: (v.detach().to(p.device).reshape(local_tensor(p).shape if k in _STATE_KEYS_32BIT else -1).clone(
                    memory_format=torch.contiguous_format) if torch.is_tensor(v) else v)
                for k, v in saved.items()
            }
        return new_groups, new_state

    def _check_maps(self, saved: Any, where: str, origin: str) -> None:
        """ValueError unless a saved state's codes are in this optimizer's format, with its maps (the same
        fingerprint). The refusal names both formats as a user writes them (``'8bit'``, ``'4bit'``)."""
        ours = self._codes_fingerprint()
        if saved == ours:
            return
        name, fmt = type(self).__name__, self.format
        mine = f"{fmt.name!r} (blocks of {fmt.blocksize})"
        if saved is None:
            if not fmt.byte_codes_into_maps:  # checkpoints of this format always named it
                raise ValueError(
                    f"{where} has low-bit states but no {MAPS_KEY!r}, which every checkpoint of a {name} with state "
                    f"format {fmt.name!r} carries{origin}: it was removed, or the states come from elsewhere. "
                    f"Decoded in the wrong format every state would change. If it was saved by a {name} with state "
                    f"format {mine}, set {MAPS_KEY!r} to {ours!r} in each saved state that has 'state1' and load it "
                    f"again.")
            raise ValueError(
                f"{where} has low-bit states but no {MAPS_KEY!r}: it was saved before checkpoints named the maps "
                f"their codes index{origin}. Its codes cannot be decoded safely: maps built then depended on the CPU. "
                f"If it was saved on a CPU with AVX2 or AVX-512 by a {name} with state format {fmt.name!r}, its maps "
                f"were the canonical ones; then set {MAPS_KEY!r} to {ours!r} in each saved state that has 'state1' "
                f"and load it again."
            )
        if not isinstance(saved, str):
            raise ValueError(f"{where}: {MAPS_KEY!r} must be a string, got {type(saved).__name__}")
        theirs = saved_format_name(saved)
        if theirs is not None and (":" in saved or ":" in ours):  # another state format
            raise ValueError(
                f"{where}: its low-bit states were stored in format {theirs}; this {name} stores {mine}: decoded in "
                f"this format, every state would change. Load it into an optimizer with the state format (and "
                f"blocksize) that saved it.")
        known = {v: k for k, v in MAP_FINGERPRINTS.items()}
        raise ValueError(
            f"{where}: its codes index quantization maps with fingerprint {saved!r}, this {name}'s maps "
            f"have {ours!r} ({known.get(map_fingerprint(self.qmap1), 'custom')} / "
            f"{known.get(map_fingerprint(self.qmap2), 'custom')}): decoded with these maps, every state would change. "
            f"Load it into an optimizer with the maps that saved it."
        )

    def __repr__(self) -> str:
        return super().__repr__().replace(type(self).__name__ + " (", f"{type(self).__name__} (backend: {self.backend}", 1)


class Adam8bit(LowBitAdam):
    """Adam with 8-bit states (lesson 07): uint8 codes into the dynamic maps, one fp32 absmax per block
    of 256, fp32 states for tensors under ``min_8bit_size``; the fused backends of
    :mod:`adam8lib.kernels`. Arguments: :class:`LowBitAdam`'s."""

    state_format = "8bit"


class AdamW8bit(Adam8bit):
    """:class:`Adam8bit` with AdamW's default ``weight_decay=1e-2`` (decay is decoupled in both)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, **kwargs):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kwargs)


class Adam4bit(LowBitAdam):
    """Adam with 4-bit states (lesson 12; Li et al. 2023): two codes per byte; m on the 4-bit
    dynamic map with blocks of 128, v on a map without zero with rank-1 normalization for matrices
    (blocks of 128 for vectors). About 1 byte per parameter. Arguments: :class:`LowBitAdam`'s."""

    state_format = "4bit"


class AdamW4bit(Adam4bit):
    """:class:`Adam4bit` with AdamW's default ``weight_decay=1e-2``."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, **kwargs):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kwargs)


class AdamFp8(LowBitAdam):
    """Adam with FP8 states (lesson 12; as torchao's ``AdamWFp8``): float8 e4m3 numbers, one fp32
    scale per block of 256. About 2 bytes per parameter. Arguments: :class:`LowBitAdam`'s."""

    state_format = "fp8"


class AdamWFp8(AdamFp8):
    """:class:`AdamFp8` with AdamW's default ``weight_decay=1e-2``."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, **kwargs):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kwargs)


# ---------------------------------------------------------------------- validation helpers
def map_kernels_step(fmt: StateFormat) -> bool:
    """Whether the map-code kernels of :mod:`adam8lib.kernels` (``adam8bit_step``: every backend) step
    states in ``fmt``: codes aligned with the elements (one byte per code into a map, blockwise scales),
    the keep-sign rule and one block size for both moments (what those kernels compute)."""
    return (fmt.byte_codes_into_maps and fmt.m.keep_sign and fmt.v.keep_sign
            and fmt.m.blocksize == fmt.v.blocksize)


def backends_of(fmt: StateFormat) -> tuple[str, ...]:
    """The ``backend=`` values an optimizer with states in ``fmt`` accepts: ``"auto"``, ``"torch"`` (the
    reference step) and the fused steps registered for it."""
    if map_kernels_step(fmt):
        return tuple(kernels.known_backend_names())
    return ("auto", "torch") + kernels.backends_for(_ADAMW, fmt)


def codes_fingerprint(fmt: StateFormat, qmap1: torch.Tensor, qmap2: torch.Tensor) -> str:
    """The :data:`MAPS_KEY` a checkpoint of states in ``fmt`` carries. A format whose codes align with
    the elements (:attr:`~adam8lib.formats.StateFormat.byte_codes_into_maps`: one code per byte into
    a map, blockwise scales, bitsandbytes' layout) is named by its two maps
    (:func:`~adam8lib.quant.map_fingerprint`: the block size is checked by the number of scales), the
    others by the whole format (:meth:`~adam8lib.formats.StateFormat.fingerprint`: name, maps, packing,
    scales, sign rule)."""
    return map_fingerprint(qmap1, qmap2) if fmt.byte_codes_into_maps else fmt.fingerprint()


def saved_format_name(fingerprint: str) -> str | None:
    """A saved :data:`MAPS_KEY` in the user's terms: ``"'4bit' (blocks of 128)"``, ``"'8bit'"`` for the
    canonical maps' fingerprint; None for a map fingerprint of no known format (custom maps)."""
    if ":" in fingerprint:
        name, rest = fingerprint.split(":", 1)
        blocks = [part[1:] for part in rest.replace("rank1-", "").split("/") if part[:1] == "b" and part[1:].isdigit()]
        return f"{name!r}" + (f" (blocks of {blocks[0]})" if blocks else "")
    for fmt in FORMATS.values():
        if fmt.byte_codes_into_maps and fingerprint == map_fingerprint(fmt.m.qmap(), fmt.v.qmap()):
            return repr(fmt.name)
    return None


def _check_backend_name(backend: str) -> None:
    if backend not in kernels.known_backend_names():
        raise ValueError(f"Unknown backend {backend!r}; choose one of {list(kernels.known_backend_names())}")
    if backend not in ("auto", "torch") and backend not in kernels.available_backends():
        raise ValueError(f"Backend {backend!r} is unavailable here: {kernels.unavailable_reason(backend)}")


def _check_flags(group: dict[str, Any], where: str, name: str = "LowBitAdam") -> None:
    for key, instead in UNSUPPORTED_FLAGS.items():
        value = group.get(key)
        if value:
            raise ValueError(f"{key}={value!r} is not supported by {name} ({where}): {instead}")


def _check_group(group: dict[str, Any], where: str, name: str = "LowBitAdam") -> None:
    _check_flags(group, where, name)
    _ADAMW.check(group)
    check_blocksize(group["blocksize"])
    size = group["min_8bit_size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"Invalid min_8bit_size: {size!r} (must be an int >= 0)")


def _check_param_and_grad(
    p: torch.Tensor, grad: torch.Tensor, group_index: int, param_index: int, shape: torch.Size, name: str = "LowBitAdam"
) -> None:
    """Checks of the (local) parameter and gradient a step will update; ``shape`` is the full one.
    The usual case (plain dense tensors that fit) is a few cheap tests; the messages are built
    only for a failing check (this runs for every parameter at every step)."""
    if (is_usual_tensor(p) and is_usual_tensor(grad) and p.dtype in PARAM_DTYPES and grad.is_floating_point()
            and grad.shape == p.shape and grad.device == p.device):
        return
    where = f"parameter {param_index} of group {group_index} (shape {tuple(shape)})"
    if grad.is_sparse or grad.layout != torch.strided:
        raise RuntimeError(f"{name} does not support sparse gradients: {where}; use torch.optim.SparseAdam")
    if grad.is_complex() or p.is_complex():
        raise RuntimeError(f"{name} does not support complex parameters or gradients: {where}")
    check_plain_tensor(p, where)
    check_plain_tensor(grad, f"the gradient of {where}")
    if p.dtype not in PARAM_DTYPES:
        raise TypeError(f"{where} must be fp32, bf16 or fp16, got {p.dtype}")
    if grad.shape != p.shape:
        raise ValueError(f"gradient shape {tuple(grad.shape)} does not match {where}")
    if not grad.is_floating_point():
        raise TypeError(f"gradient of {where} must be floating point, got {grad.dtype}")
    if grad.device != p.device:
        raise ValueError(f"gradient of {where} is on {grad.device}, the parameter on {p.device}")


def _fp32_batchable(param: torch.Tensor, state: dict[str, Any]) -> bool:
    """Whether a parameter with fp32 states can join the batched fp32 update: fp32 states as
    created (anything else, e.g. states loaded in another dtype, goes one at a time), on a CPU
    or CUDA device (``_prepare`` has already moved them to the parameter's)."""
    return (state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32
            and param.device.type in ("cpu", "cuda"))


def _follow_device(state: dict[str, Any], device: torch.device) -> None:
    """Move a parameter's states to ``device`` (the model was moved after the states were made)."""
    for key, value in state.items():
        if torch.is_tensor(value) and value.device != device:
            state[key] = value.to(device)


def _foreign_origin(state_dict: dict[str, Any]) -> str:
    """A hint naming the optimizer a foreign checkpoint probably comes from ('' if none)."""
    groups = state_dict.get("param_groups") or []
    keys = set().union(*(g.keys() for g in groups if isinstance(g, dict))) if groups else set()
    states = state_dict.get("state") or {}
    state_keys = set().union(*(s.keys() for s in states.values() if isinstance(s, dict))) if states else set()
    bnb_group_keys = {"optim_bits", "percentile_clipping", "block_wise", "max_unorm", "is_paged", "t_alpha", "t_beta3"}
    if keys & bnb_group_keys or state_keys & {"qmap1", "__bnb_optimizer_quant_state__"}:
        return " (it looks like a bitsandbytes optimizer's checkpoint; its states use other maps and layouts)"
    if keys & {"amsgrad", "foreach", "fused", "capturable", "decoupled_weight_decay"} or "exp_avg" in state_keys and "blocksize" not in keys:
        return " (it looks like a torch.optim Adam/AdamW checkpoint: fp32 states, no blocksize)"
    return ""


def _check_saved_state(p: torch.Tensor, saved: Any, fmt: StateFormat, where: str, origin: str) -> None:
    if not isinstance(saved, dict):
        raise ValueError(f"{where} must be a dict, got {type(saved).__name__}")
    local = local_tensor(p)  # a DTensor (FSDP2) parameter keeps the states of its local shard
    if "state1" in saved:
        expected = {k: ((count,), dtype) for k, (count, dtype) in fmt.state_spec(tuple(local.shape)).items()}
    elif "exp_avg" in saved:
        expected = {k: (tuple(local.shape), torch.float32) for k in _STATE_KEYS_32BIT}
    else:
        raise ValueError(f"{where} has none of the low-bit Adam state keys (got {sorted(map(str, saved))}){origin}")
    unknown = sorted(set(map(str, saved)) - set(expected) - {"step"})
    if unknown:
        raise ValueError(f"{where} has unexpected keys {unknown}{origin}")
    step = saved.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        got = f"a tensor ({step.dtype})" if torch.is_tensor(step) else repr(step)
        raise ValueError(f"{where}: 'step' must be a Python int >= 0, got {got}{origin}")
    for key, (shape, dtype) in expected.items():
        value = saved.get(key)
        if not torch.is_tensor(value):
            raise ValueError(f"{where}: {key!r} should be a {dtype} tensor, got {type(value).__name__}{origin}")
        try:
            check_plain_tensor(value, f"{where}: {key!r}")
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        if value.dtype != dtype or value.numel() != math.prod(shape):
            raise ValueError(
                f"{where}: {key!r} should be {dtype}[{math.prod(shape)}], got {value.dtype}[{value.numel()}]{origin}"
            )
        if key in ("state1", "state2"):
            if not (fmt.m if key == "state1" else fmt.v).codes_are_valid(value):  # fp8 bytes that are NaN
                raise ValueError(f"{where}: {key!r} has codes that decode to NaN (a corrupt checkpoint)")
            continue
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{where}: {key!r} has NaN or Inf values (a corrupt checkpoint)")
        if key != "exp_avg" and bool((value < 0).any()):
            raise ValueError(f"{where}: {key!r} has negative values (it must be >= 0)")
