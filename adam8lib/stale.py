"""Stale second moments: where round-to-nearest 8-bit states stop following fp32 Adam (lesson 07).

Each step requantizes ``v`` to the nearest entry of the unsigned map times its block's absmax.
When ``v`` changes by less than half the distance to the neighbouring code, the nearest code is
the one it already had, and the stored ``v`` does not move at all. With ``beta2 = 0.999`` and a
zero gradient ``v`` shrinks by ``1 - beta2 = 0.1 %`` per step, less than half a code gap anywhere
on the unsigned map (the smallest, between its two top entries, is 0.18 %: see
:func:`relative_half_gaps`). So an entry whose gradient stops, in a block whose absmax another
entry keeps up, keeps its code for good: its ``v`` is frozen (or, if that absmax grows, even
rises) while fp32 Adam's decays by ``beta2`` per step. Too large a ``v`` means too small a step
when the gradient comes back.

:func:`stale_v_block` runs that scenario on one block, 8-bit (the reference step,
:func:`adam8lib.kernels.reference.adam8bit_step`) and fp32 side by side, from the same gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kernels.reference import adam8bit_step, adam_update_fp32
from .quant import dequantize_blocks, dynamic_map

__all__ = ["relative_half_gaps", "StaleV", "stale_v_block"]


def relative_half_gaps(qmap: torch.Tensor) -> torch.Tensor:
    """For each non-zero entry ``Q[k]`` of a sorted map: ``(Q[k] - Q[k-1]) / (2 Q[k])``.

    A value stored at code ``k`` keeps that code under round-to-nearest until it falls by more
    than this fraction (the rounding boundary is halfway to the entry below). Entry ``k`` of the
    result belongs to ``Q[k + 1]``; the map's first entry (0 for the unsigned map) has none.
    """
    q = qmap.double()
    return ((q[1:] - q[:-1]) / (2 * q[1:])).float()


@dataclass(frozen=True)
class StaleV:
    """Per-step series of :func:`stale_v_block` (index ``t - 1`` holds step ``t``).

    ``v_ratio``: median over the entries whose gradient stops of 8-bit ``v`` / fp32 ``v`` after
    the step; ``step_8bit``, ``step_fp32``: median of those entries' parameter moves, in units of
    ``lr``; ``codes_changed``: how many of their ``v`` codes changed in the step.
    """

    stop: int
    resume: int
    v_ratio: torch.Tensor
    step_8bit: torch.Tensor
    step_fp32: torch.Tensor
    codes_changed: torch.Tensor

    @property
    def step_ratio(self) -> torch.Tensor:
        """8-bit step / fp32 step (median moves), per step."""
        return self.step_8bit / self.step_fp32


def stale_v_block(steps: int = 3500, stop: int = 1000, resume: int = 3000, *, blocksize: int = 256,
                  beta1: float = 0.9, beta2: float = 0.999, lr: float = 1e-3, eps: float = 1e-8,
                  seed: int = 0) -> StaleV:
    """One block: every entry gets a gradient of its own fixed size and sign; entry 0 (the largest,
    1.0) keeps it at every step and holds the block's absmax; the others get 0 from step ``stop + 1``
    to step ``resume`` and their gradient back after that. 8-bit (reference step) and fp32 Adam
    run side by side on the same gradients; see :class:`StaleV` for what is recorded.
    """
    if not 0 < stop < resume <= steps:
        raise ValueError(f"need 0 < stop < resume <= steps, got stop={stop}, resume={resume}, steps={steps}")
    gen = torch.Generator().manual_seed(seed)
    size = torch.empty(blocksize).uniform_(0.1, 1.0, generator=gen)
    size[0] = 1.0
    sign = torch.randint(0, 2, (blocksize,), generator=gen).float().mul_(2).sub_(1)
    g_on = size * sign
    stops = torch.ones(blocksize, dtype=torch.bool)
    stops[0] = False
    g_off = torch.where(stops, 0.0, g_on)

    qmap1, qmap2 = dynamic_map(signed=True), dynamic_map(signed=False)
    p8, p32 = torch.zeros(blocksize), torch.zeros(blocksize)
    state1, state2 = torch.full((blocksize,), 127, dtype=torch.uint8), torch.zeros(blocksize, dtype=torch.uint8)
    absmax1, absmax2 = torch.zeros(1), torch.zeros(1)
    m32, v32 = torch.zeros(blocksize), torch.zeros(blocksize)
    hyper = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=0.0)
    series = {k: torch.empty(steps) for k in ("v_ratio", "step_8bit", "step_fp32", "codes_changed")}
    for t in range(1, steps + 1):
        g = g_off if stop < t <= resume else g_on
        before8, before32, codes = p8.clone(), p32.clone(), state2.clone()
        adam8bit_step(p8, g, state1, state2, absmax1, absmax2, qmap1, qmap2, step=t, blocksize=blocksize, **hyper)
        p32 = adam_update_fp32(p32, g, m32, v32, step=t, **hyper)
        v8 = dequantize_blocks(state2, absmax2, qmap2, blocksize)
        series["v_ratio"][t - 1] = (v8[stops] / v32[stops]).median()
        series["step_8bit"][t - 1] = ((p8 - before8).abs()[stops] / lr).median()
        series["step_fp32"][t - 1] = ((p32 - before32).abs()[stops] / lr).median()
        series["codes_changed"][t - 1] = (state2 != codes)[stops].sum()
    return StaleV(stop=stop, resume=resume, **series)


class ShadowV:
    """An fp32 second moment kept beside a low-bit optimizer, from the gradients it steps with.

    Call :meth:`observe` right before each ``optimizer.step()`` (after any gradient clipping):
    it updates ``v32 = beta2 v32 + (1 - beta2) g^2`` for every parameter with a gradient.
    :meth:`ratios` then gives, for every entry of every tensor with 8-bit states, the optimizer's
    dequantized ``v`` divided by the fp32 one: 1 where the 8-bit state follows fp32 Adam, above 1
    where it has gone stale on the high side. (Non-finite gradients are not handled: a clean run.)
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.v: dict[torch.Tensor, torch.Tensor] = {}

    @torch.no_grad()
    def observe(self) -> None:
        for group in self.optimizer.param_groups:
            beta2 = group["betas"][1]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.detach().reshape(-1).float()
                v = self.v.setdefault(p, torch.zeros_like(g))
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)

    @torch.no_grad()
    def ratios(self) -> torch.Tensor:
        """8-bit ``v`` / fp32 ``v`` for every entry with 8-bit states (entries whose fp32 ``v`` is 0 left out)."""
        out = []
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                state = self.optimizer.state.get(p, {})
                if "state2" not in state or p not in self.v:
                    continue
                v8 = dequantize_blocks(state["state2"], state["absmax2"], self.optimizer.qmap2.to(p.device),
                                       group["blocksize"])
                v32 = self.v[p]
                keep = v32 > 0
                out.append(v8[keep] / v32[keep])
        return torch.cat(out) if out else torch.empty(0)
