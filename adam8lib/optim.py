"""Adam with low-bit states: ``Adam8bit``/``AdamW8bit`` (lesson 07), ``Adam4bit``/``AdamW4bit`` and
``AdamFp8``/``AdamWFp8`` (lesson 12) — one optimizer, :class:`LowBitAdam`, with a *state format*.

:class:`LowBitAdam` is the AdamW update rule (:class:`~adam8lib.rules.adamw.AdamWRule`) on the one core of the
optimizer family, :class:`~adam8lib.quantized_state.QuantizedStateOptimizer` (issue 35), as ``Lion8bit`` or
``AdEMAMix8bit`` are their rules on it: the checks, the step, stochastic rounding, FSDP2 and checkpoints are the
core's. What differs is data: the storage layout lessons 07, 11 and 12 teach and that earlier checkpoints hold,
:data:`adam8lib.state_layout.ADAM_LAYOUT` (the state keys ``state1``/``absmax1``/``state2``/``absmax2``,
:data:`STATE_SPECS`; ``blocksize`` and ``min_8bit_size`` in every param group; a shard's own blocks under FSDP2;
the ``"qmap_fingerprint"`` of each saved state; torch's Adam flags; the words of the messages), chosen by the
class (``layout = ADAM_LAYOUT``) as the family's classes keep the family's. This module adds the arguments (the
format, its block size and the backends it has), the maps as ``qmap1``/``qmap2``, and the pickles of earlier
versions.

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
  the same fp32 update, :func:`adam8lib.rules.adamw.adam_update_fp32` (the small
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

from typing import Any, Iterable

import torch

from . import kernels
from .formats import StateFormat, get_format
from .quant import check_blocksize, dynamic_map
from .quantized_state import QuantizedStateOptimizer
from .rules.adamw import AdamWRule
from .state_layout import ADAM_LAYOUT

#: The update rule of these optimizers (issue 35: the one core's AdamW rule): its checks of the hyper-parameters,
#: its fp32 update, and the fused steps (:mod:`adam8lib.kernels.registry`) of their low-bit formats.
_ADAMW = AdamWRule()
#: The rule's states as these optimizers store them (their checkpoints' keys, :data:`~adam8lib.state_layout.ADAM_LAYOUT`):
#: ``m`` quantized as ``state1``/``absmax1``, ``v`` as ``state2``/``absmax2``; in fp32 (small tensors)
#: ``exp_avg``/``exp_avg_sq``.
STATE_SPECS = ADAM_LAYOUT.specs(_ADAMW)
#: The key, in the saved state of every parameter with 8-bit states, of the fingerprint of the maps
#: its codes index (:func:`adam8lib.quant.map_fingerprint` of qmap1 and qmap2). It travels with the
#: codes, through torch.save, ZeRO's consolidated state dict and torch.distributed.checkpoint.
MAPS_KEY = ADAM_LAYOUT.tag_key
#: torch.optim.Adam(W) flags this optimizer does not implement, with what to do instead.
UNSUPPORTED_FLAGS = ADAM_LAYOUT.flags

__all__ = ["LowBitAdam", "Adam8bit", "AdamW8bit", "Adam4bit", "AdamW4bit", "AdamFp8", "AdamWFp8", "UNSUPPORTED_FLAGS"]


class LowBitAdam(QuantizedStateOptimizer):
    """Adam with low-bit, blockwise-scaled states (decoupled weight decay), in a given state format: the AdamW
    rule (:class:`~adam8lib.rules.adamw.AdamWRule`) on the one core,
    :class:`~adam8lib.quantized_state.QuantizedStateOptimizer`, in lesson 07's storage layout
    (:data:`~adam8lib.state_layout.ADAM_LAYOUT`: its keys, param groups, FSDP2 blocks and checkpoints).

    Args:
        params: parameters or param groups (each group may set ``lr``, ``betas``, ``eps``,
            ``weight_decay``, ``min_8bit_size``; ``blocksize`` only as the optimizer's).
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
    layout = ADAM_LAYOUT

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
        fmt = get_format(type(self).state_format if state_format is None else state_format)
        kernels_here = backends_of(fmt)
        if isinstance(backend, str) and backend in kernels.known_backend_names() and backend not in kernels_here:
            raise ValueError(f"state_format={fmt.name!r} has the backends {', '.join(map(repr, kernels_here))}; "
                             f"backend {backend!r} has no step for its states")
        if blocksize is not None:  # the block size has one home: the format (the groups show it)
            fmt = fmt.with_blocksize(check_blocksize(blocksize))
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)  # (+ the layout's group settings)
        super().__init__(params, defaults, state_format=fmt, min_8bit_size=min_8bit_size, backend=backend,
                         stochastic_rounding=stochastic_rounding, seed=seed, **torch_flags)

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

    def _find_fused(self, rule, device: torch.device):
        """The core's fused step; with ``backend="torch"`` and states in the 8-bit layout, the map-code kernel of
        plain PyTorch (:func:`adam8lib.kernels.map_codes_reference_step`: lesson 07's step, one chunk of blocks at a
        time, tested against the core's reference step) rather than decoding whole tensors: the same bits, with fp32
        temporaries of one chunk."""
        if self.backend == "torch" and rule == _ADAMW and map_kernels_step(self.format):
            return kernels.map_codes_reference_step()
        return super()._find_fused(rule, device)

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


# ---------------------------------------------------------------------- which backends step a format
def map_kernels_step(fmt: StateFormat) -> bool:
    """Whether the map-code kernels of :mod:`adam8lib.kernels` (``adam8bit_step``: every backend) step
    states in ``fmt``: codes aligned with the elements (one byte per code into a map, blockwise scales),
    the keep-sign rule and one block size for both moments (what those kernels compute)."""
    return fmt.steps_in_map_kernels


def backends_of(fmt: StateFormat) -> tuple[str, ...]:
    """The ``backend=`` values an optimizer with states in ``fmt`` accepts: ``"auto"``, ``"torch"`` (the
    reference step) and the fused steps registered for it."""
    if map_kernels_step(fmt):
        return tuple(kernels.known_backend_names())
    return ("auto", "torch") + kernels.backends_for(_ADAMW, fmt)
