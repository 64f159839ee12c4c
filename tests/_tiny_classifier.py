"""The tiny offline classifier the Trainer tests train: 64 -> 80 -> 2, whose first weight (5,120 elements)
gets quantized states and the rest fp32 (under min_8bit_size 4,096), and its fixed dataset."""

from __future__ import annotations

import torch
from torch import nn


class TinyClassifier(nn.Module):
    """The same initial weights every time it is built (seed 0)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.hidden, self.out = nn.Linear(64, 80), nn.Linear(80, 2)

    def forward(self, x, labels=None):
        logits = self.out(torch.tanh(self.hidden(x)))
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def tiny_dataset(n: int = 32) -> list[dict]:
    """``n`` examples of Trainer's dict form, from a fixed generator."""
    gen = torch.Generator().manual_seed(1)
    xs, ys = torch.randn(n, 64, generator=gen), torch.randint(0, 2, (n,), generator=gen)
    return [{"x": x, "labels": int(y)} for x, y in zip(xs, ys)]
