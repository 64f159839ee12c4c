"""bench/bench_formats.py counts state bytes the way the library's estimate does, and reports a
missing library as such (no timing here: speed is measured by `make bench`, never by a test)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import bench_formats  # noqa: E402

from adam8lib import AdamW4bit, AdamWFp8  # noqa: E402
from adam8lib.memory import estimate_optimizer_memory  # noqa: E402


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(96, 128), torch.nn.ReLU(), torch.nn.Linear(128, 40))


def test_state_bytes_equal_the_estimate_for_the_new_formats():
    for cls, kind in ((AdamW4bit, "adam4bit"), (AdamWFp8, "adamfp8")):
        model = _model()
        opt = cls(model.parameters())
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
        assert bench_formats.state_bytes(opt) == estimate_optimizer_memory(model, kind).total_bytes


def test_state_bytes_of_fp32_adamw_are_eight_per_parameter_plus_steps():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    n = sum(p.numel() for p in model.parameters())
    assert bench_formats.state_bytes(opt) == 8 * n + 4 * len(list(model.parameters()))  # + a float32 step each


def test_render_lists_every_row_and_says_what_is_missing():
    names = [name for name, _ in bench_formats.optimizers()]
    races = {"64K": {names[0]: (1.0, 1.0, 1.0, 0.9, 1.1, 12.5), names[-1]: "not installed (bitsandbytes)"}}
    text = bench_formats.render(races, {names[0]: 8.0}, {"cpu": "test"}, 1.0)
    assert all(f"| {name} |" in text for name in names)
    assert "| 8.0000 | 12.5 | 1.00 [0.90, 1.10] |" in text
    assert "not installed (bitsandbytes)" in text
