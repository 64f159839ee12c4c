"""Adam with low-bit states: ``Adam8bit``/``AdamW8bit`` (lesson 07), ``Adam4bit``/``AdamW4bit`` and
``AdamFp8``/``AdamWFp8`` (lesson 12) — one optimizer, :class:`LowBitAdam`, with a *state format*.

:class:`LowBitAdam` is the AdamW update rule (:class:`~adam8lib.rules.adamw.AdamWRule`) on the one core of the
optimizer family, :class:`~adam8lib.quantized_state.QuantizedStateOptimizer` (issue 35), as ``Lion8bit`` or
``AdEMAMix8bit`` are their rules on it: the checks, the step, stochastic rounding, FSDP2 and checkpoints are the
core's. What this module adds are the forms lessons 07, 11 and 12 teach and that earlier checkpoints hold: the
state keys ``state1``/``absmax1``/``state2``/``absmax2`` (:data:`STATE_SPECS`), ``blocksize`` and
``min_8bit_size`` in every param group, a shard's own blocks under FSDP2 (``block_layout = "local"``), the
``"qmap_fingerprint"`` of each saved state, torch's Adam flags, and the messages in these classes' terms.

How the two moments are stored is the state format's business (:mod:`adam8lib.formats`: ``"8bit"``,
``"4bit"``, ``"4bit-naive"``, ``"fp8"``), and what the optimizer does with a format is decided by what the
format stores, never by its name. Every format steps through the one registry of fused steps
(:func:`adam8lib.kernels.find_step`, keyed by rule, format and device): for the 8-bit layout (one byte per
element into a map, blockwise scales, signs kept) the map-code backends of :mod:`adam8lib.kernels` (``"cpu"``,
``"cpu_fast"``, ``"triton"``; with ``backend="torch"`` lesson 07's map-code step in plain PyTorch,
:func:`adam8lib.kernels.map_codes_reference_step`), many small tensors of a group in one call; for ``"fp8"``,
``"4bit"`` and ``"4bit-naive"`` the C++ ``"cpu"`` kernel (``"auto"`` on the CPU;
:mod:`adam8lib.kernels.cpu_formats`) and a Triton kernel (``"auto"`` on CUDA;
:mod:`adam8lib.kernels.triton_fp8`, :mod:`~adam8lib.kernels.triton_4bit`), else the core's reference step
(``backend="torch"``: decode, the fp32 update, encode, in plain PyTorch). Every fused step stores the reference
step's codes and scales bit for bit; the CPU kernel its parameters too. The Triton kernel's fp32 parameters (in
the interpreter, on the CPU) are within 64 units of 2^-23 (2^-17 relative) of the larger of ``|p|`` and the
step's ``|update|`` (bf16/fp16 ones: see tests/kernels/test_triton*.py): the two compute the decay, the update
and the square root in different orders and roundings (torch's CPU square root is not correctly rounded, the
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
  ``torch._foreach_*`` operations, the AdamW rule's ``update_many``: on the CPU the same result
  bit for bit, without ~18 separate torch calls, or GPU kernel launches, per bias or LayerNorm weight).

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
to the shard and low-bit or fp32 decided by the full size; blocks are local to the shard (the core's
``block_layout = "local"``; the family's classes keep the whole tensor's blocks instead). The
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
from .distributed import local_tensor
from .kernels.contract import PARAM_DTYPES, check_plain_tensor, is_usual_tensor
from .quantized_state import SHAPE_KEY, QuantizedStateOptimizer
from .rules.adamw import AdamWRule
from .rules.base import StateSpec
from .formats import FORMATS, StateFormat, get_format
from .quant import MAP_FINGERPRINTS, check_blocksize, dynamic_map, map_fingerprint

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
#: The order of a new low-bit state's keys (:meth:`~adam8lib.formats.StateFormat.new_state`'s, as lessons print them).
_KEY_ORDER_8BIT = tuple(s.codes_key for s in STATE_SPECS) + tuple(s.scales_key for s in STATE_SPECS)
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


class LowBitAdam(QuantizedStateOptimizer):
    """Adam with low-bit, blockwise-scaled states (decoupled weight decay), in a given state format: the AdamW
    rule (:class:`~adam8lib.rules.adamw.AdamWRule`) on the one core,
    :class:`~adam8lib.quantized_state.QuantizedStateOptimizer`, with the keys, param groups, FSDP2 blocks and
    checkpoints of lessons 07, 11 and 12.

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

    rule = _ADAMW
    #: The format of the classes below (``Adam8bit``: "8bit", ``Adam4bit``: "4bit", ...).
    state_format: str = "8bit"
    #: Every group shows ``blocksize`` (the format's; no group may change it) and its ``min_8bit_size``.
    group_settings = ("blocksize", "min_8bit_size")
    #: A shard of a sharded (FSDP2) parameter is cut into its own blocks (lesson 11).
    block_layout = "local"
    format_tag_key = MAPS_KEY

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
        if blocksize is not None:  # the block size has one home: the format (the groups show it)
            fmt = fmt.with_blocksize(check_blocksize(blocksize))
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
            blocksize=fmt.blocksize, min_8bit_size=min_8bit_size,
        )
        self.format = fmt
        self._check_group(defaults, "the defaults")
        super().__init__(params, defaults, state_format=fmt, min_8bit_size=min_8bit_size, backend=backend,
                         stochastic_rounding=stochastic_rounding, seed=seed)

    # ------------------------------------------------------------------ the maps
    @property
    def qmap1(self) -> torch.Tensor:
        """The map the codes of ``m`` index: the format's (:meth:`~adam8lib.formats.StateFormat.with_maps` when set;
        the 8-bit dynamic map for formats that do not code bytes into maps, as their checkpoints never name it)."""
        return self.format.m.qmap() if self.format.byte_codes_into_maps else dynamic_map(signed=True)

    @qmap1.setter
    def qmap1(self, table: torch.Tensor) -> None:
        self._set_maps(m=table)

    @property
    def qmap2(self) -> torch.Tensor:
        """The map the codes of ``v`` index (see :attr:`qmap1`)."""
        return self.format.v.qmap() if self.format.byte_codes_into_maps else dynamic_map(signed=False)

    @qmap2.setter
    def qmap2(self, table: torch.Tensor) -> None:
        self._set_maps(v=table)

    def _set_maps(self, m: torch.Tensor | None = None, v: torch.Tensor | None = None) -> None:
        """Other maps for the codes (the step, the checkpoint tag and a reshard all read them from the format)."""
        if not self.format.byte_codes_into_maps:
            raise ValueError(f"state format {self.format.name!r} does not code bytes into two maps; its coding is "
                             f"part of the format (choose another state_format instead)")
        self.format = self.format.with_maps(m, v)

    # ------------------------------------------------------------------ what differs from the core's defaults
    def state_specs(self, rule):
        """AdamW's ``m`` and ``v`` under this class's keys (:data:`STATE_SPECS`)."""
        return STATE_SPECS if rule is _ADAMW or rule == _ADAMW else rule.states

    def _find_fused(self, rule, device: torch.device):
        """The core's fused step; with ``backend="torch"`` and states in the 8-bit layout, the map-code kernel of
        plain PyTorch (:func:`adam8lib.kernels.map_codes_reference_step`: lesson 07's step, one chunk of blocks at a
        time) rather than decoding whole tensors: the same bits, with fp32 temporaries of one chunk."""
        if self.backend == "torch" and rule == _ADAMW and map_kernels_step(self.format):
            return kernels.map_codes_reference_step()
        return super()._find_fused(rule, device)

    def _check_group(self, group: dict[str, Any], where: str) -> None:
        """ValueError naming the setting unless ``group`` is one this optimizer can step with: its
        hyper-parameters valid, and its ``blocksize`` the optimizer's (the format's: one block size for
        the whole optimizer, which every group shows and none may change)."""
        if isinstance(group.get("betas"), list):
            group["betas"] = tuple(group["betas"])
        _check_group(group, where, type(self).__name__)
        if group["blocksize"] != self.format.blocksize:
            raise ValueError(
                f"{where} has blocksize={group['blocksize']!r}, this {type(self).__name__} stores its states in blocks "
                f"of {self.format.blocksize}: the block size is a setting of the whole optimizer (its state format), "
                f"not of a group; build the optimizer with blocksize={group['blocksize']!r} instead")

    def _check_param_and_grad(self, p: torch.Tensor, grad: torch.Tensor, where: str) -> None:
        _check_param_and_grad(p, grad, where, type(self).__name__)

    def _new_state(self, p: torch.Tensor, rule, group: dict[str, Any] | None = None) -> dict[str, Any]:
        state = super()._new_state(p, rule, group)
        if _STATE_KEYS_8BIT[0] in state:  # the keys in the order lessons 00 and 07 print them
            state = {"step": state["step"], **{k: state[k] for k in _KEY_ORDER_8BIT}}
        return state

    def _check_live_state(self, p: torch.Tensor, rule, where: str, group: dict[str, Any] | None = None,
                          quantized: bool | None = None) -> None:
        """ValueError unless the state a step is about to read has the keys, dtypes and sizes this
        optimizer makes for ``p`` (its state format and block size, on the local shard): a state edited by
        hand, or a group's block size changed after the states exist, is found before anything changes."""
        local, state = local_tensor(p), self.state[p]
        if quantized is None:
            quantized = self._state_kind(p, rule, group, state)
        for key, (shape, dtype) in self._expected_state(p, rule, group, quantized).items():
            count, value = math.prod(shape), state.get(key)
            if not torch.is_tensor(value) or value.numel() != count or (
                    key in _STATE_KEYS_8BIT and (value.dtype != dtype or not value.is_contiguous())):
                got = f"{value.dtype}[{value.numel()}]" if torch.is_tensor(value) else type(value).__name__
                raise ValueError(
                    f"{where}: {key!r} is {got}, but this {type(self).__name__} (state format {self.format.name!r}, "
                    f"blocks of {self.format.blocksize}) keeps {dtype}[{count}] for a parameter of shape "
                    f"{tuple(local.shape)}: the state was not made with these settings")
        step = state.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"{where}: 'step' must be a Python int >= 0, got {step!r}")

    # ------------------------------------------------------------------ copy / pickle
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(qmap1=self.qmap1, qmap2=self.qmap2)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        qmap1, qmap2 = state.pop("qmap1", None), state.pop("qmap2", None)  # the maps it stepped with
        state.setdefault("format", type(self).state_format)  # pickled before the format was kept
        state["format"] = get_format(state["format"])
        defaults = state.get("defaults", {})
        state.setdefault("min_8bit_size", defaults.get("min_8bit_size", 4096))
        super().__setstate__(state)
        blocksize = self.defaults.get("blocksize", self.format.blocksize)
        if blocksize != self.format.blocksize:  # pickled before the block size lived in the format
            self.format = self.format.with_blocksize(blocksize)
        if self.format.byte_codes_into_maps and (qmap1 is not None or qmap2 is not None):
            self.format = self.format.with_maps(qmap1, qmap2)  # (the format's own: the same format)

    # ------------------------------------------------------------------ checkpoints
    def format_tag(self) -> str:
        """The saved ``"qmap_fingerprint"``: :func:`codes_fingerprint` of this optimizer's format and maps."""
        return codes_fingerprint(self.format, self.qmap1, self.qmap2)

    def codes_maps(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.qmap1, self.qmap2

    def foreign_origin(self, state_dict: dict[str, Any]) -> str:
        return _foreign_origin(state_dict)

    def _checked_state(self, p: torch.Tensor, rule, saved: Any, where: str, origin: str,
                       group: dict[str, Any] | None = None) -> dict:
        if isinstance(saved, dict) and "state1" in saved:
            self._check_format_tag(saved.get(MAPS_KEY), where, origin)
            saved = {k: v for k, v in saved.items() if k not in (MAPS_KEY, SHAPE_KEY)}
        _check_saved_state(p, saved, self.format, where, origin)
        local = local_tensor(p)
        return {k: (v.detach().to(local.device).reshape(local.shape if k in _STATE_KEYS_32BIT else -1).clone(
                    memory_format=torch.contiguous_format) if torch.is_tensor(v) else v)
                for k, v in saved.items()}

    def _check_format_tag(self, saved: Any, where: str, origin: str) -> None:
        """ValueError unless a saved state's codes are in this optimizer's format, with its maps (the same
        fingerprint). The refusal names both formats as a user writes them (``'8bit'``, ``'4bit'``)."""
        ours = self.format_tag()
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
        return torch.optim.Optimizer.__repr__(self).replace(type(self).__name__ + " (",
                                                            f"{type(self).__name__} (backend: {self.backend}", 1)


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


def _check_param_and_grad(p: torch.Tensor, grad: torch.Tensor, where: str, name: str = "LowBitAdam") -> None:
    """Checks of the (local) parameter and gradient a step will update (``where``: which parameter, with its full
    shape). The usual case (plain dense tensors that fit) is a few cheap tests; the messages are built only for
    a failing check (this runs for every parameter at every step)."""
    if (is_usual_tensor(p) and is_usual_tensor(grad) and p.dtype in PARAM_DTYPES and grad.is_floating_point()
            and grad.shape == p.shape and grad.device == p.device):
        return
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


def _foreign_origin(state_dict: dict[str, Any]) -> str:
    """A hint naming the optimizer a foreign checkpoint probably comes from ('' if none)."""
    groups = state_dict.get("param_groups") or []
    keys = set().union(*(g.keys() for g in groups if isinstance(g, dict))) if groups else set()
    states = state_dict.get("state") or {}
    state_keys = set().union(*(s.keys() for s in states.values() if isinstance(s, dict))) if states else set()
    if "state_format" in state_keys or any(isinstance(k, str) and k.endswith("_codes") for k in state_keys):
        return (" (it looks like a checkpoint of the family's optimizers, e.g. Lion8bit or AdEMAMix8bit: another "
                "update rule, other state keys)")
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
