"""What the Triton kernel tests share: import this before ``adam8lib.kernels.triton`` (it turns the
interpreter on where there is no GPU), then parametrize over :data:`DEVICES` — the CPU twin in the
interpreter, and the same test on CUDA, skipped only without a GPU."""

import os

import pytest
import torch

if not torch.cuda.is_available():  # before adam8lib.kernels.triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from adam8lib.kernels import triton as kt  # noqa: E402

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        not kt.INTERPRETED, reason="the CPU twin needs TRITON_INTERPRET=1 (set automatically without a GPU)")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU")]),
]
#: the four state tensors of a low-bit parameter
KEYS = ("state1", "state2", "absmax1", "absmax2")


def step_twins(model, twin, ours, ref, steps: int) -> None:
    """``steps`` steps of ``ours`` on ``model`` and ``ref`` on its copy ``twin`` (a 32-feature input),
    with the same gradients: ``model``'s, copied to ``twin``."""
    device = next(model.parameters()).device
    for _ in range(steps):
        loss = model(torch.randn(16, 32, device=device)).square().mean()
        ours.zero_grad()
        loss.backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            q.grad = p.grad.clone()
        ours.step()
        ref.step()
