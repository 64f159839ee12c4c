"""Compressed master weights: a bf16 weight plus the low-order bits of its fp32 master (issue 37).

Mixed-precision training keeps an fp32 *master* copy of every weight (4 bytes) beside the bf16 copy the
model computes with (2 bytes), because Adam's updates are often smaller than half a bf16 ulp and would
vanish if written into bf16. Stochastic rounding (:mod:`adam8lib.rounding`) is one way to drop the
master copy; this module is the other: keep the bits of the master that bf16 drops.

An fp32 number is 32 bits: sign, 8 exponent bits, 23 mantissa bits. A bf16 number is its upper 16 bits.
So the master splits into

* ``hi``, a bf16 tensor: the master rounded to the nearest bf16 number (ties away from zero), which the
  model computes with, and
* ``lo``, a correction: the signed difference between the master's bit pattern and ``hi``'s, shifted,

and joins back as ``bits(master) = (bits(hi) << 16) + lo`` (16-bit correction) or
``((bits(hi) << 8) + lo) << 8`` (8-bit correction), integer arithmetic on the bit patterns. (With 8 bits
the master that is split is the 24-bit one below, and ``hi`` is that master rounded to bf16.)

=========  ============  ==============================================================================
``bits``   correction    what the join gives back
=========  ============  ==============================================================================
16         int16         the fp32 master **exactly**, bit for bit (the 16 low bits that
                         TransformerEngine's FusedAdam can keep beside a bf16 parameter):
                         2 + 2 = 4 bytes per parameter instead of 2 + 4 = 6
8          int8          a **24-bit master** (FlashOptim, arXiv 2602.23349: bf16 + an 8-bit
                         correction): the fp32 master rounded to 16 significant bits, its
                         8 lowest mantissa bits dropped: 2 + 1 = 3 bytes per parameter
=========  ============  ==============================================================================

What the 24-bit master loses: each ``split`` rounds the master to the nearest fp32 number whose 8 low
bits are zero (ties away from zero), an error of at most ``2**-16 * |x|`` for normal numbers (at most
``2**-142`` for subnormals); a finite master above the largest such number (``0x7F7FFF00``, about
3.4028e38) is clamped to it rather than rounded to infinity. An update of a weight below about
``2**-17 * |w|`` is therefore lost again, as with round-to-nearest (e.g. ``lr=1e-6`` on a weight of
1), where the 16-bit correction keeps every fp32 update.

Why ties away from zero and not to even (torch's ``x.to(torch.bfloat16)``): a remainder of exactly half
an ulp, either way, would need 17 bits. The two roundings differ only at exact ties.

Special values: ``±0``, subnormals, ``±inf`` and every finite number split and join exactly (bits=16;
bits=8: after the rounding above); a master that rounds to past bf16's largest finite number gets
``hi = ±inf`` (as torch's own conversion does) and still joins back exactly. A NaN keeps its sign and
the NaN-ness: ``hi`` is NaN (its quiet bit set) and the join gives the master's bits with the quiet bit
set (exact for quiet NaNs such as torch's; with ``bits=8`` also without its 8 lowest payload bits).

:class:`CompressedMasterWeights` applies any optimizer's fp32 step to the joined master: its step hooks
join each bf16 parameter with its correction into fp32 right before ``optimizer.step()`` and split it
right after, so any optimizer's own code is unchanged (and gradient release, which steps one parameter
at a time, joins one parameter at a time). An optimizer of the quantized-state core (the library's Adams and
the 8-bit family) adopts the masters instead (``adopt_master_weights``): its step joins, steps and splits each
plain bf16 parameter a chunk at a time, so no whole fp32 copy of a parameter or its gradient exists (the same
bits). A fused kernel that joins and splits inside itself, with no fp32 chunk at all, is not written.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

__all__ = ["split_master", "join_master", "master_rounding", "CompressedMasterWeights", "CORRECTION_DTYPES"]

#: The correction's dtype for each ``bits``.
CORRECTION_DTYPES = {16: torch.int16, 8: torch.int8}
_MASK32 = 0xFFFFFFFF
#: Elements per chunk of split/join (their int64 temporaries: about 70 bytes per element, 18 MB per chunk).
CHUNK = 1 << 18
#: The largest finite fp32 magnitude whose 8 low bits are zero (a 24-bit master's largest).
_MAX24 = 0x7F7FFF00


def _check_bits(bits: Any) -> int:
    if isinstance(bits, bool) or bits not in CORRECTION_DTYPES:
        raise ValueError(f"bits must be 16 (an exact fp32 master) or 8 (a 24-bit master), got {bits!r}")
    return bits


def _pattern(x: torch.Tensor) -> torch.Tensor:
    """The fp32 bit patterns of ``x`` as non-negative int64."""
    return x.contiguous().view(torch.int32).to(torch.int64) & _MASK32  # a chunk: a slice of a flat tensor


def _from_pattern(bits: torch.Tensor) -> torch.Tensor:
    """fp32 values of int64 bit patterns in [0, 2**32)."""
    signed = torch.where(bits >= 1 << 31, bits - (1 << 32), bits)
    return signed.to(torch.int32).view(torch.float32)


def _int16_from_upper(upper: torch.Tensor) -> torch.Tensor:
    """int64 16-bit patterns in [0, 2**16) as int16 (the bits of bf16 numbers)."""
    return torch.where(upper >= 1 << 15, upper - (1 << 16), upper).to(torch.int16)


def _round24(b: torch.Tensor, nan: torch.Tensor) -> torch.Tensor:
    """Patterns rounded to a 24-bit master (8 low bits zero; ties away from zero; finite stays finite)."""
    sign, mag = b & (1 << 31), b & 0x7FFFFFFF
    finite = mag < 0x7F800000
    rounded = (mag + 0x80) & ~0xFF
    rounded = torch.where(finite, torch.clamp(rounded, max=_MAX24), rounded)
    return torch.where(nan, b, sign | rounded)


def master_rounding(x: torch.Tensor, bits: int = 16) -> torch.Tensor:
    """The fp32 value ``join_master(*split_master(x, bits))`` gives back: ``x`` itself for bits=16 (NaN:
    quiet), ``x`` rounded to a 24-bit master for bits=8."""
    hi, lo = split_master(x, bits)
    return join_master(hi, lo)


def split_master(x: torch.Tensor, bits: int = 16, *,
                 out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hi, lo)``: ``x`` (fp32) as a bf16 tensor and an int16 (``bits=16``) or int8 (``bits=8``)
    correction of the same shape (see the module docstring). ``out``: a (bf16, correction) pair of
    ``x``'s shape to write into. Works through :data:`CHUNK` elements at a time, so its temporaries
    stay a few MB whatever the size of ``x``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"split_master takes a tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"split_master takes an fp32 master, got {x.dtype}")
    bits = _check_bits(bits)
    if out is None:
        hi = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
        lo = torch.empty(x.shape, dtype=CORRECTION_DTYPES[bits], device=x.device)
    else:
        hi, lo = out
        _check_out(hi, torch.bfloat16, x, "out[0]")
        _check_out(lo, CORRECTION_DTYPES[bits], x, "out[1]")
    flat = x.reshape(-1)
    hi_flat, lo_flat = hi.view(-1), lo.view(-1)
    for start in range(0, flat.numel(), CHUNK):
        h, c = _split_chunk(flat[start:start + CHUNK], bits)
        hi_flat[start:start + CHUNK].view(torch.int16).copy_(h)
        lo_flat[start:start + CHUNK].copy_(c)
    return hi, lo


def _split_chunk(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of :func:`split_master`: (bf16 bit patterns as int16, the correction)."""
    b = _pattern(x)
    nan = torch.isnan(x)
    shift = 32 - 16 - bits  # 0 for 16, 8 for 8: the bits dropped below the correction
    if bits == 8:
        b = _round24(b, nan)
    kept = b >> shift  # the master's pattern without its dropped bits: 32 - shift bits
    # hi: nearest bf16, ties away from zero (+ half of the correction's range on the magnitude; the sign
    # bit never changes: only a NaN's magnitude could carry into it)
    hi = (kept + (1 << (bits - 1))) >> bits
    hi = torch.where(nan, (b >> 16) | 0x40, hi)  # NaN: its upper half, quiet
    lo = kept - (hi << bits)
    low_bits = kept & ((1 << bits) - 1)
    lo = torch.where(nan, torch.where(low_bits >= 1 << (bits - 1), low_bits - (1 << bits), low_bits), lo)
    return _int16_from_upper(hi), lo.to(CORRECTION_DTYPES[bits])


def join_master(hi: torch.Tensor, lo: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """The fp32 master of a bf16 tensor and its correction (int16: exact; int8: a 24-bit master).
    ``out``: an fp32 tensor of their shape to write into. Works :data:`CHUNK` elements at a time."""
    if not isinstance(hi, torch.Tensor) or not isinstance(lo, torch.Tensor):
        raise TypeError("join_master takes two tensors (the bf16 half and its correction)")
    if hi.dtype != torch.bfloat16:
        raise TypeError(f"the upper half must be bf16, got {hi.dtype}")
    bits = {torch.int16: 16, torch.int8: 8}.get(lo.dtype)
    if bits is None:
        raise TypeError(f"the correction must be int16 (16 bits) or int8 (8 bits), got {lo.dtype}")
    if hi.shape != lo.shape:
        raise ValueError(f"the bf16 half has shape {tuple(hi.shape)}, the correction {tuple(lo.shape)}")
    if out is None:
        out = torch.empty(hi.shape, dtype=torch.float32, device=hi.device)
    else:
        _check_out(out, torch.float32, hi, "out")
    hi_flat, lo_flat, out_flat = hi.reshape(-1), lo.reshape(-1), out.view(-1)
    for start in range(0, hi_flat.numel(), CHUNK):
        out_flat[start:start + CHUNK].copy_(_join_chunk(hi_flat[start:start + CHUNK], lo_flat[start:start + CHUNK],
                                                        bits))
    return out


def _join_chunk(hi: torch.Tensor, lo: torch.Tensor, bits: int) -> torch.Tensor:
    upper = hi.view(torch.int16).to(torch.int64) & 0xFFFF
    r = lo.to(torch.int64)
    shift = 32 - 16 - bits
    b = ((upper << bits) + r) << shift
    nan = torch.isnan(hi)
    b = torch.where(nan, (upper << 16) | ((r & ((1 << bits) - 1)) << shift), b)
    return _from_pattern(b & _MASK32)


def _check_out(t: Any, dtype: torch.dtype, like: torch.Tensor, what: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.shape != like.shape or t.device != like.device \
            or not t.is_contiguous():
        raise ValueError(f"{what} must be a contiguous {dtype} tensor of shape {tuple(like.shape)} on {like.device}")


class CompressedMasterWeights:
    """bf16 parameters whose fp32 master lives in the parameter plus a correction (see the module docstring).

    ``CompressedMasterWeights(model_or_params, optimizer, bits=16)`` splits every fp32 parameter in place
    (``p.data`` becomes its bf16 half; the optimizer and the model keep the same Parameter objects) and
    keeps the corrections; a bf16 parameter starts with a zero correction (its master is its value).
    Then every ``optimizer.step()`` (a step pre-hook) joins each parameter that has a gradient into an
    fp32 tensor, with an fp32 gradient, and after the step (a post-hook) splits it back. The optimizer
    must step fp32 parameters; one that rounds bf16 weights stochastically is refused (there is no bf16
    rounding left to do). If a step raises, its parameters stay fp32 until :meth:`restore`.

    ``optimizer.step(closure)`` works too: the optimizer gets a closure that splits any joined parameter back,
    runs yours (the forward and backward on the bf16 weights; its loss is what ``step`` returns) and joins the
    parameters that then have a gradient, so the step is on the fp32 master as without a closure. A closure
    that raises leaves the bf16 weights, their gradients and the corrections as they were.

    Memory during a step: an optimizer of the quantized-state core (:mod:`adam8lib.quantized_state`: the
    library's Adams and the 8-bit family) adopts the masters (``adopt_master_weights``) and steps each parameter
    on its fp32 master a chunk at a time (join, step, split; a moment with rank-1 scales in two passes,
    :mod:`adam8lib.rank1_chunks`): a chunk's temporaries, the same bits. Any other optimizer (torch's): each
    joined parameter is an fp32 tensor (4 bytes per element) with an fp32 gradient (4 more, for a bf16
    gradient) until it is split again, plus one chunk's temporaries of the split and the join. With gradient
    release that is one parameter at a time (the largest sets the peak).

    Checkpoints: ``state_dict()`` holds the corrections (with the model's bf16 state dict and the
    optimizer's, the whole master); ``load_state_dict`` puts them back.
    """

    def __init__(self, model_or_params: torch.nn.Module | Iterable[torch.Tensor], optimizer: torch.optim.Optimizer,
                 bits: int = 16) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if getattr(optimizer, "stochastic_rounding", False):
            raise ValueError("the optimizer rounds bf16 weights stochastically; with compressed master weights it "
                             "steps the fp32 master: build it with stochastic_rounding=False")
        self.bits = _check_bits(bits)
        given = list(model_or_params.parameters()) if isinstance(model_or_params, torch.nn.Module) \
            else list(model_or_params)
        params, seen = [], set()
        for p in given:
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"model_or_params must hold tensors, got a {type(p).__name__}")
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        if not params:
            raise ValueError("no parameters")
        in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
        for p in params:
            if id(p) not in in_optimizer:
                raise ValueError(f"a parameter of shape {tuple(p.shape)} is not in the optimizer")
            if p.dtype not in (torch.float32, torch.bfloat16):
                raise TypeError(f"compressed master weights take fp32 or bf16 parameters, got {p.dtype}")
            if p.grad is not None:
                raise ValueError("split the weights before the first backward (a parameter already has a gradient)")
        self.optimizer = optimizer
        self.params = params
        self.corrections: dict[int, torch.Tensor] = {}
        for p in params:
            if p.dtype == torch.float32:
                hi, lo = split_master(p.detach(), self.bits)
                p.data = hi
            else:
                lo = torch.zeros(p.shape, dtype=CORRECTION_DTYPES[self.bits], device=p.device)
            self.corrections[id(p)] = lo
        self._joined: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._hooks = [optimizer.register_step_pre_hook(self._join), optimizer.register_step_post_hook(self._split)]
        # an optimizer of the quantized-state core steps the masters itself, chunk by chunk (no whole fp32 copy)
        adopt = getattr(optimizer, "adopt_master_weights", None)
        self._adopted = bool(adopt(self)) if callable(adopt) else False

    # ------------------------------------------------------------------ for an optimizer that adopts them
    def join(self, hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
        """The fp32 master of a piece of a parameter (``hi``) and of its correction (``lo``): a new tensor."""
        return join_master(hi, lo)

    def split(self, x: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor) -> None:
        """Write the fp32 master ``x`` of a piece of a parameter into its bf16 half ``hi`` and correction ``lo``."""
        if hi.is_contiguous() and lo.is_contiguous():
            split_master(x, self.bits, out=(hi, lo))
        else:
            h, c = split_master(x, self.bits)
            hi.copy_(h)
            lo.copy_(c)

    # ------------------------------------------------------------------ the hooks
    def _join(self, optimizer, args, kwargs):
        self._join_all(optimizer)
        # (torch passes the step's arguments with the optimizer first: (optimizer, closure) or closure=...)
        closure = args[1] if len(args) > 1 else kwargs.get("closure")
        if closure is None:
            return None
        stepped = self._on_the_master(closure)
        if len(args) > 1:
            return (args[0], stepped, *args[2:]), kwargs
        return args, {**kwargs, "closure": stepped}

    def _on_the_master(self, closure):
        """``closure`` for a step on the joined masters: the model computes its loss and gradients with its bf16
        weights (the parameters joined for the step are split back first), then the parameters that have a
        gradient are joined again for the step. Called any number of times (L-BFGS evaluates it more than once)."""
        def closure_on_the_master():
            self.restore()
            loss = closure()
            self._join_all(self.optimizer)
            return loss
        return closure_on_the_master

    def _join_all(self, optimizer) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in self.corrections or p.grad is None or p.dtype != torch.bfloat16:
                    continue
                if self._adopted and optimizer.steps_own_master(p):  # the optimizer joins and splits it in chunks
                    continue
                grad = p.grad
                p.grad = None
                p.data = join_master(p.detach(), self.corrections[id(p)])
                p.grad = grad.float() if grad.dtype != torch.float32 else grad
                self._joined.append((p, grad))

    def _split(self, optimizer, args, kwargs) -> None:
        self.restore()

    def restore(self) -> None:
        """Split the parameters joined for a step back into bf16 + correction (after a step that raised)."""
        joined, self._joined = self._joined, []
        for p, grad in joined:
            hi = torch.empty(p.shape, dtype=torch.bfloat16, device=p.device)
            split_master(p.detach(), self.bits, out=(hi, self.corrections[id(p)]))
            p.grad = None
            p.data = hi
            p.grad = grad

    # ------------------------------------------------------------------ what it holds
    def master(self, p: torch.Tensor) -> torch.Tensor:
        """The fp32 master of parameter ``p`` (a new tensor)."""
        if id(p) not in self.corrections:
            raise ValueError(f"a parameter of shape {tuple(p.shape)} has no compressed master here")
        return join_master(p.detach(), self.corrections[id(p)])

    def nbytes(self) -> dict[str, int]:
        """Bytes of the bf16 weights and of their corrections (counted from the tensors)."""
        return {"weights": sum(p.element_size() * p.numel() for p in self.params),
                "corrections": sum(c.element_size() * c.numel() for c in self.corrections.values())}

    def state_dict(self) -> dict[str, Any]:
        return {"bits": self.bits, "corrections": [self.corrections[id(p)].clone() for p in self.params]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or "corrections" not in state or "bits" not in state:
            raise ValueError("a CompressedMasterWeights state dict has 'bits' and 'corrections'")
        if state["bits"] != self.bits:
            raise ValueError(f"the checkpoint keeps {state['bits']}-bit corrections, this one {self.bits}-bit")
        saved = state["corrections"]
        if len(saved) != len(self.params):
            raise ValueError(f"the checkpoint has {len(saved)} corrections, there are {len(self.params)} parameters")
        for p, c in zip(self.params, saved):
            if not isinstance(c, torch.Tensor) or c.dtype != CORRECTION_DTYPES[self.bits] or c.shape != p.shape:
                raise ValueError(f"a correction for a parameter of shape {tuple(p.shape)} must be a "
                                 f"{CORRECTION_DTYPES[self.bits]} tensor of that shape")
        for p, c in zip(self.params, saved):
            self.corrections[id(p)].copy_(c)

    def remove(self) -> None:
        """Remove the step hooks (the parameters stay bf16; the corrections are dropped)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._adopted:
            self.optimizer.adopt_master_weights(None)
            self._adopted = False

    def __repr__(self) -> str:
        return f"CompressedMasterWeights({len(self.params)} parameters, bits={self.bits})"
