"""Workbook 09 · memory maths: unit tests of the learner's functions (run: -m ex09)."""

import pytest
import torch

from adam8lib.memory import compute_optimizer_size
from adam8lib.optim import Adam8bit

pytestmark = pytest.mark.ex09

DISTILBERT = 65_783_042


def test_distilbert_seed_numbers(workbook):
    fn = workbook("09").state_megabytes
    assert round(fn(DISTILBERT, "adamw"), 1) == 501.9  # = the measured torch AdamW state
    assert round(2 * DISTILBERT / 2**20) == 125  # the chapter's "125 MB" of codes ...
    assert fn(DISTILBERT, "adam8bit") == pytest.approx((2 * DISTILBERT + 8 * 256_965) / 2**20)  # ... plus absmax
    assert abs(fn(DISTILBERT, "adam8bit") - 127.9) < 0.5  # measured bitsandbytes Adam8bit: 127.9 MiB


def test_state_megabytes_scales_linearly_and_blocks_matter(workbook):
    fn = workbook("09").state_megabytes
    assert fn(0, "adamw") == 0 and fn(0, "adam8bit") == 0
    assert fn(2**20, "adamw") == 8.0
    assert fn(2**20, "adam8bit", blocksize=4096) == pytest.approx(2 + 8 / 4096)
    assert fn(1, "adam8bit", blocksize=64) * 2**20 == pytest.approx(2 + 8)


def _measured(model, kind):
    """Bytes of weights, gradients and states after one real training step."""
    opt = (torch.optim.AdamW(model.parameters(), foreach=False) if kind == "adamw"
           else Adam8bit(model.parameters(), backend="torch"))
    x = torch.randn(4, model[0].in_features, dtype=next(model.parameters()).dtype)
    model(x).float().sum().backward()
    opt.step()
    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params)
    states = [{k: v for k, v in s.items() if k != "step"} for s in opt.state.values()]
    return weights, grads, round(compute_optimizer_size(states)[0] * 2**20)


# (torch's AdamW keeps bf16 states for bf16 parameters, so that pair is not compared: the course's
# budget assumes fp32 states, as 8-bit Adam's small tensors and mixed-precision training have.)
@pytest.mark.parametrize("kind, dtype", [("adamw", torch.float32), ("adam8bit", torch.float32),
                                         ("adam8bit", torch.bfloat16)])
def test_training_memory_equals_what_a_real_step_allocates(workbook, kind, dtype):
    model = torch.nn.Sequential(torch.nn.Linear(90, 80), torch.nn.LayerNorm(80), torch.nn.Linear(80, 3)).to(dtype)
    got = workbook("09").training_memory(model, kind)
    weights, grads, states = _measured(model, kind)
    assert got == {"weights": weights, "gradients": grads, "optimizer": states,
                   "total": weights + grads + states}


def test_training_memory_of_distilbert_on_the_meta_device(workbook):
    from adam8lib.course.checks.ex09_memory_maths import distilbert_shapes

    params = [torch.nn.Parameter(torch.empty(s, device="meta")) for s in distilbert_shapes()]
    model = torch.nn.Module()
    model.params = torch.nn.ParameterList(params)
    adamw = workbook("09").training_memory(model, "adamw")
    eight = workbook("09").training_memory(model, "adam8bit")
    assert adamw["weights"] == adamw["gradients"] == 4 * DISTILBERT
    assert round(adamw["optimizer"] / 2**20, 1) == 501.9
    assert 125 < eight["optimizer"] / 2**20 < 128.5  # the small tensors keep fp32 states
    assert adamw["total"] / eight["total"] == pytest.approx(16 / (8 + 2 + 8 / 256), rel=0.01)
