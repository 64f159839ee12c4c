"""adam8lib.training: decay groups (equal to Trainer's), precision, make_optimizer, training_step."""

from __future__ import annotations

import gzip
import json
import math

import pytest
import torch
from torch import nn

from adam8lib import memory as M
from adam8lib import training as T
from adam8lib.course import data as D
from adam8lib.course import finetune as F
from adam8lib.memory import compute_optimizer_size
from adam8lib.optim import Adam8bit

from tests._finetune import _batch, _offline, _overfit_set, full_model, task, tiny_model, trainer_decay_names  # noqa: F401


@pytest.mark.parametrize("small", [False, True])
def test_decay_names_equal_trainer(small, full_model):
    model = full_model if not small else F.build_distilbert(small=True)
    ours = T.decay_parameter_names(model)
    theirs = trainer_decay_names(model)
    assert sorted(ours) == sorted(theirs)
    assert len(ours) == len(set(ours))
    assert ours == [n for n, _ in model.named_parameters() if n in set(ours)]  # named_parameters order
    no_decay = {n for n, _ in model.named_parameters()} - set(ours)
    assert all(n.endswith("bias") or "layer_norm" in n or "LayerNorm" in n for n in no_decay)
    assert "distilbert.embeddings.word_embeddings.weight" in ours


def test_make_param_groups_counts_and_decays(full_model):
    groups = T.make_param_groups(full_model, 0.05)
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0]
    n_decay = sum(p.numel() for p in groups[0]["params"])
    n_no = sum(p.numel() for p in groups[1]["params"])
    assert n_decay + n_no == 65_783_042
    names = dict((id(p), n) for n, p in full_model.named_parameters())
    assert {names[id(p)] for p in groups[0]["params"]} == set(trainer_decay_names(full_model))
    # 6 layers x (4 attention + 2 FFN linear biases + 2 LayerNorms x 2) + embedding LN (2) + 2 head biases
    assert len(groups[1]["params"]) == 6 * (6 + 4) + 2 + 2


def test_make_param_groups_skips_frozen_and_checks_decay():
    model = F.build_distilbert(small=True)
    for p in model.distilbert.embeddings.parameters():
        p.requires_grad_(False)
    groups = T.make_param_groups(model, 0.01)
    in_groups = {id(p) for g in groups for p in g["params"]}
    assert not any(id(p) in in_groups for p in model.distilbert.embeddings.parameters())
    assert sum(len(g["params"]) for g in groups) == sum(p.requires_grad for p in model.parameters())
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError, match="weight_decay"):
            T.make_param_groups(model, bad)
    with pytest.raises(TypeError):
        T.decay_parameter_names("not a model")


def test_zero_decay_keeps_two_groups_and_drops_empty_ones():
    lin = nn.Sequential(nn.Linear(3, 3, bias=False))
    groups = T.make_param_groups(lin, 0.1)
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.1


def test_make_optimizer_kinds():
    model = tiny_model(100)
    opt = T.make_optimizer(model, "adam8bit", lr=1e-3, weight_decay=0.02)
    assert isinstance(opt, Adam8bit) and opt.backend != "triton"  # no interpreter in training loops
    assert [g["weight_decay"] for g in opt.param_groups] == [0.02, 0.0]
    assert isinstance(T.make_optimizer(model, "adamw"), torch.optim.AdamW)
    import bitsandbytes as bnb

    assert isinstance(T.make_optimizer(model, "bnb8bit"), bnb.optim.Adam8bit)
    with pytest.raises(ValueError, match="kind"):
        T.make_optimizer(model, "sgd")
    assert T.pick_precision("cpu") == "bf16"
    assert T.autocast_dtype("fp16") is torch.float16 and T.autocast_dtype("no") is None
    with pytest.raises(ValueError, match="precision"):
        T.autocast_dtype("fp8")


def test_training_step_bf16_autocast_keeps_fp32_params(task):
    model = tiny_model(len(task[1]))
    batch = _batch(task)
    seen = []
    model.pre_classifier.register_forward_hook(lambda m, i, o: seen.append((o.dtype, torch.is_autocast_enabled("cpu"))))
    opt = T.make_optimizer(model, "adam8bit", lr=2e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** (s // 10))
    losses = [T.training_step(model, batch, opt, sched, dtype=torch.bfloat16) for _ in range(25)]
    assert seen[0] == (torch.bfloat16, True)
    assert all(p.dtype == torch.float32 and p.grad is None for p in model.parameters())
    assert sched.last_epoch == 25 and opt.param_groups[0]["lr"] == pytest.approx(2e-3 / 4)
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5]), losses  # it memorizes the batch
    state = opt.state[model.distilbert.embeddings.word_embeddings.weight]
    assert state["state1"].dtype == torch.uint8 and state["step"] == 25


def test_training_step_fp16_with_grad_scaler_and_fp32(task):
    batch = _batch(task, 16)
    for dtype, scaler in ((torch.float16, torch.amp.GradScaler("cpu", init_scale=2.0**10)), (None, None)):
        model = tiny_model(len(task[1]))
        opt = T.make_optimizer(model, "adamw", lr=2e-3)
        losses = [T.training_step(model, batch, opt, dtype=dtype, scaler=scaler) for _ in range(8)]
        assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]

