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
"""

from __future__ import annotations

import torch

__all__ = ["stochastic_round_to_bf16", "step_generator"]

_LOW = (1 << 16) - 1


def step_generator(seed: int, step: int, index: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` seeded from the optimizer's ``seed``, the step count and the parameter's index."""
    mixed = ((int(seed) * 1_000_003 + int(step)) * 1_000_033 + int(index)) % (1 << 63)
    return torch.Generator(device=device).manual_seed(mixed)


def stochastic_round_to_bf16(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``x`` (fp32) rounded to bf16 stochastically: up with probability proportional to the distance
    from the bf16 number below it, so that ``E[result] = x``. Returns a new bf16 tensor."""
    if x.dtype != torch.float32:
        raise TypeError(f"stochastic rounding takes an fp32 tensor, got {x.dtype}")
    x = x.contiguous()
    noise = torch.randint(0, 1 << 16, x.shape, generator=generator, device=x.device, dtype=torch.int32)
    bits = (x.view(torch.int32) + noise) & ~_LOW
    rounded = bits.view(torch.float32)
    rounded = torch.where(torch.isfinite(x), rounded, x)  # NaN and Inf as they are
    return rounded.to(torch.bfloat16)  # exact: the lower 16 bits are zero
