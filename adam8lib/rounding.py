"""bf16 weights with stochastic rounding (lesson 12).

A bf16 number has 8 bits of precision: between 1 and 2 its neighbours are 2^-7 = 0.0078 apart. Adam's
update of a weight is about ``lr`` (say 1e-4), far below half of that gap, so with round-to-nearest
``bf16(w + update)`` is ``w`` again: the update is lost, every step, and a pure-bf16 model stops
learning. **Stochastic rounding** rounds ``x`` up to the next bf16 number with probability
``(x - lo) / (hi - lo)`` and down to ``lo`` otherwise, so the *expected* result is ``x``: small updates
survive on average (Gupta et al. 2015; Zamirai et al. 2020, arXiv 2010.06192; torchao's
``bf16_stochastic_round``).

How, in integers: an fp32 number's upper 16 bits are the bf16 number next to it toward zero, its lower
16 bits say how far it is toward the next one. Add a uniform random integer in ``[0, 2^16)`` to the
bits and clear the lower half: the addition carries into the upper half with probability
``lower bits / 2^16``, which is the rounding probability above (for either sign, since floats are sign
and magnitude). NaN and Inf are converted as they are.

Reproducible: :func:`step_generator` seeds the random integers from ``(seed, step, index)``, so the same
seed gives the same bits, and a run resumed from a checkpoint (which holds the step counts) draws the
same numbers as one that never stopped.

**Keyed by the element, not by the stream.** A generator's stream gives the ``i``-th number to the ``i``-th
element *of the tensor it rounds*. Under FSDP2 each rank rounds its own shard, so a generator would give
rank 1's first element the number of the whole tensor's first element, and a sharded run would round
differently from an unsharded one. The optimizers therefore use :func:`element_noise`: the random integer
of an element is a hash of ``(seed, step, index)`` and of the element's **global** flat index in the whole
parameter, so the same element gets the same number on any world size (and on any device: the hash is
integer arithmetic, exact everywhere). :func:`stochastic_round_to_bf16` takes either a generator (the
lesson's form) or such a key and the global index of its first element, and writes into ``out``
chunk by chunk (:data:`CHUNK` elements), so the transient is a few bytes per element of one chunk, not of
the whole tensor.
"""

from __future__ import annotations

import torch

__all__ = ["stochastic_round_to_bf16", "step_generator", "element_key", "element_noise", "state_chunks", "CHUNK",
           "SR_CHUNK"]

_LOW = (1 << 16) - 1
_M32 = (1 << 32) - 1
#: Elements rounded at a time by the keyed form (the transient is ~16 bytes per element of one chunk).
CHUNK = 1 << 16
#: Elements of a parameter an optimizer updates and rounds at a time with ``stochastic_rounding=True``
#: (:func:`state_chunks`; a multiple of every block size: 64 ... 4096).
SR_CHUNK = 1 << 16


def step_generator(seed: int, step: int, index: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` seeded from the optimizer's ``seed``, the step count and the parameter's index."""
    mixed = ((int(seed) * 1_000_003 + int(step)) * 1_000_033 + int(index)) % (1 << 63)
    return torch.Generator(device=device).manual_seed(mixed)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (Wellons' "lowbias32") of int64 tensors holding values in [0, 2^32): every
    product is split in 16-bit halves so that no intermediate passes 2^63 (exact on any device)."""
    for shift, mult in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        x = x ^ (x >> shift)
        lo, hi = x & 0xFFFF, x >> 16
        x = (lo * mult + (((hi * (mult & 0xFFFF)) & 0xFFFF) << 16)) & _M32
    return x ^ (x >> 16)


def _mix32_int(x: int) -> int:
    for shift, mult in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        x ^= x >> shift
        x = (x * mult) & _M32
    return x ^ (x >> 16)


def element_key(seed: int, step: int, index: int) -> tuple[int, int]:
    """The two 32-bit keys of :func:`element_noise` for the parameter ``index`` at ``step`` under ``seed``."""
    k = _mix32_int((int(seed) & _M32) ^ 0x5BD1E995)
    k = _mix32_int(k ^ (int(step) & _M32))
    k = _mix32_int(k ^ (int(index) & _M32))
    return k, _mix32_int(k ^ 0x27D4EB2F ^ ((int(seed) >> 32) & _M32) ^ ((int(step) >> 32) & _M32))


def element_noise(key: tuple[int, int], start: int, count: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The random integers in ``[0, 2^16)`` (int32) of the elements with global flat indices
    ``start ... start + count - 1`` under ``key`` (:func:`element_key`): a hash of the key and the index,
    the same for an element whatever tensor, shard or chunk it is drawn with."""
    g = torch.arange(start, start + count, dtype=torch.int64, device=device)
    h = _mix32((g & _M32) ^ key[0])
    h = _mix32(h ^ (g >> 32) ^ key[1])
    return (h >> 16).to(torch.int32)


def _round_with(x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    bits = (x.view(torch.int32) + noise) & ~_LOW
    rounded = torch.where(torch.isfinite(x), bits.view(torch.float32), x)  # NaN and Inf as they are
    return rounded.to(torch.bfloat16)  # exact: the lower 16 bits are zero


def stochastic_round_to_bf16(x: torch.Tensor, generator: torch.Generator | None = None, *,
                             key: tuple[int, int] | None = None, start: int = 0,
                             out: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` (fp32) rounded to bf16 stochastically: up with probability proportional to the distance
    from the bf16 number below it, so that ``E[result] = x``.

    The random integers come from ``generator`` (the ``i``-th draw for the ``i``-th element), or, with
    ``key`` (:func:`element_key`), from :func:`element_noise` for the global indices ``start, start + 1,
    ...`` of ``x``'s elements (flat, row-major), computed :data:`CHUNK` elements at a time. Returns a new
    bf16 tensor, or writes into ``out`` (bf16, ``x``'s shape) and returns it."""
    if x.dtype != torch.float32:
        raise TypeError(f"stochastic rounding takes an fp32 tensor, got {x.dtype}")
    if (generator is None) == (key is None):
        raise TypeError("stochastic_round_to_bf16 takes a generator or a key (exactly one of them)")
    if out is not None and (out.dtype != torch.bfloat16 or out.shape != x.shape or out.device != x.device):
        raise ValueError(f"out must be a bf16 tensor of shape {tuple(x.shape)} on {x.device}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")
    x = x.contiguous()
    if key is None:
        noise = torch.randint(0, 1 << 16, x.shape, generator=generator, device=x.device, dtype=torch.int32)
        rounded = _round_with(x, noise)
        return rounded if out is None else out.copy_(rounded)
    target = out if out is not None and out.is_contiguous() else torch.empty_like(x, dtype=torch.bfloat16)
    flat_x, flat_out = x.view(-1), target.view(-1)
    for a in range(0, flat_x.numel(), CHUNK):
        b = min(a + CHUNK, flat_x.numel())
        flat_out[a:b] = _round_with(flat_x[a:b], element_noise(key, start + a, b - a, x.device))
    if out is not None and target is not out:
        out.copy_(target)
        return out
    return target


def state_chunks(n: int, state: dict, moments, fp32_keys=(), chunk: int = SR_CHUNK) -> list[tuple[int, int, dict]]:
    """``(start, stop, part)`` pieces of an elementwise update of a flat tensor of ``n`` elements, for an
    optimizer that updates an fp32 copy and rounds it (stochastic rounding) one piece at a time, so the
    copy is one piece's (``chunk`` elements), not the tensor's.

    ``moments``: ``(codes_key, scales_key, moment)`` of each blockwise state in ``state`` (a moment format
    with ``blocksize`` and ``codes_numel``; ``chunk`` a multiple of every block size, and of 2 for packed
    codes); ``fp32_keys``: fp32 states with one value per element. ``part`` holds views of ``state``'s tensors
    over ``[start, stop)`` (codes ``codes_numel(start) ... codes_numel(stop)``, scales of blocks
    ``start // B ... ceil(stop / B)``) and its other entries as they are. Blocks are whole in every piece and
    the update elementwise, so the pieces give the bits of one update of the whole tensor."""
    if n <= chunk:
        return [(0, n, state)]
    pieces = []
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        part = {k: v for k, v in state.items() if not torch.is_tensor(v)}
        for codes, scales, moment in moments:
            part[codes] = state[codes][moment.codes_numel(a): moment.codes_numel(b)]
            part[scales] = state[scales][a // moment.blocksize: -(-b // moment.blocksize)]
        for key in fp32_keys:
            part[key] = state[key].view(-1)[a:b]
        pieces.append((a, b, part))
    return pieces
