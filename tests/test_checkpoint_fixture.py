"""A checkpoint written by main before issue 35's core (commit 544a2bb) loads and resumes bit for bit.

tests/fixtures/checkpoints/main_checkpoints.pt holds, for Adam8bit, AdamW8bit, Adam4bit, AdamW4bit,
AdamWFp8 and the "4bit-naive" format, the parameters and ``state_dict()`` after 3 steps, and a SHA-256
of the parameters and states 4 steps later, as that code computed them (its builder, next to it, says
how). Here the current code loads each checkpoint, takes the same 4 steps and must land on the same bits.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "checkpoints"
sys.path.insert(0, str(FIXTURES))

import build_main_checkpoints as builder  # noqa: E402

from adam8lib import optim  # noqa: E402
from adam8lib.kernels.reference import torch_uses_fma  # noqa: E402

SAVED = torch.load(FIXTURES / "main_checkpoints.pt", weights_only=False)


def test_fixture_is_small_and_from_main_before_the_core():
    assert (FIXTURES / "main_checkpoints.pt").stat().st_size < 200_000
    assert SAVED["commit"].startswith("544a2bb")
    assert set(SAVED["configs"]) == {name for name, _, _ in builder.CONFIGS}


@pytest.mark.parametrize("name", [name for name, _, _ in builder.CONFIGS])
def test_main_checkpoint_resumes_bit_for_bit(name):
    if torch_uses_fma() != SAVED["torch_uses_fma"]:
        pytest.skip("the continuation was computed where torch rounds the moments "
                    f"{'with' if SAVED['torch_uses_fma'] else 'without'} fused multiply-adds; this machine differs")
    config = SAVED["configs"][name]
    params = [torch.nn.Parameter(p.clone()) for p in config["params"]]
    opt = getattr(optim, config["class"])(params, backend="torch", **config["kwargs"])
    opt.load_state_dict(config["state_dict"])
    assert opt.state[params[0]]["step"] == builder.STEPS_BEFORE
    builder.run_steps(opt, params, builder.STEPS_BEFORE + 1, builder.STEPS_AFTER)
    assert torch.equal(params[0].detach().reshape(-1)[:4], config["final_weight_head"])
    assert builder.digest(params, opt) == config["final_digest"]


def test_a_changed_continuation_is_noticed():
    # the digest sees one step more, and one flipped bit of a saved code
    config = SAVED["configs"]["AdamW8bit"]
    params = [torch.nn.Parameter(p.clone()) for p in config["params"]]
    opt = optim.AdamW8bit(params, backend="torch", **config["kwargs"])
    opt.load_state_dict(config["state_dict"])
    builder.run_steps(opt, params, builder.STEPS_BEFORE + 1, builder.STEPS_AFTER + 1)
    assert builder.digest(params, opt) != config["final_digest"]
    state_dict = {**config["state_dict"], "state": {k: dict(v) for k, v in config["state_dict"]["state"].items()}}
    codes = state_dict["state"][0]["state1"].clone()
    codes[5] ^= 1
    state_dict["state"][0]["state1"] = codes
    params = [torch.nn.Parameter(p.clone()) for p in config["params"]]
    opt = optim.AdamW8bit(params, backend="torch", **config["kwargs"])
    opt.load_state_dict(state_dict)
    builder.run_steps(opt, params, builder.STEPS_BEFORE + 1, builder.STEPS_AFTER)
    assert builder.digest(params, opt) != config["final_digest"]
