"""Optimizer steps on seeded random gradients (the tests that compare two optimizers step them alike)."""

from __future__ import annotations

import torch


def random_steps(opt, params, steps: int, seed: int = 1) -> None:
    """``steps`` steps of ``opt``, each with a fresh gradient for every one of ``params`` (standard normal, from a
    generator seeded with ``seed``, in the parameter's dtype)."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
        opt.step()
