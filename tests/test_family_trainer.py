"""Hugging Face ``Trainer`` drives the family: ``optimizer_cls_and_kwargs=(cls, kwargs)`` and
``optimizers=(opt, None)`` (the tiny model of tests/_tiny_classifier.py, offline)."""

from __future__ import annotations

import pytest
import torch

from adam8lib import AdEMAMix8bit, Adan8bit, Lion8bit, Muon8bit, RMSprop8bit, SGD8bit
from tests._tiny_classifier import TinyClassifier, tiny_dataset

transformers = pytest.importorskip("transformers")

STEPS = 3


def _args(tmp_path):
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=STEPS, per_device_train_batch_size=8, report_to=[], use_cpu=True,
        save_strategy="no", logging_strategy="no", weight_decay=0.01, disable_tqdm=True)


def _check_trained(opt, cls, model, start):
    assert type(opt) is cls
    hidden = opt.state[model.hidden.weight]
    assert hidden["step"] == STEPS and any(k.endswith("_codes") for k in hidden)
    assert not any(k.endswith("_codes") for k in opt.state[model.out.weight])
    assert not torch.equal(model.hidden.weight.detach(), start)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("cls, kwargs", [(Lion8bit, {"lr": 1e-3}), (AdEMAMix8bit, {"lr": 1e-3}),
                                         (RMSprop8bit, {"lr": 1e-3}), (SGD8bit, {"lr": 1e-2}),
                                         (Muon8bit, {"lr": 0.02}), (Adan8bit, {"lr": 1e-3})],
                         ids=lambda v: getattr(v, "__name__", ""))
def test_trainer_builds_the_optimizer_from_class_and_kwargs(tmp_path, cls, kwargs):
    model = TinyClassifier()
    start = model.hidden.weight.detach().clone()
    trainer = transformers.Trainer(model=model, args=_args(tmp_path), train_dataset=tiny_dataset(),
                                   optimizer_cls_and_kwargs=(cls, kwargs))
    trainer.train()
    opt = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    _check_trained(opt, cls, model, start)
    # Trainer's two groups: decay (the weights) and no decay (the biases), weight_decay from its arguments
    assert sorted(g["weight_decay"] for g in opt.param_groups) == [0.0, 0.01]


def test_trainer_steps_an_optimizer_passed_in(tmp_path):
    model = TinyClassifier()
    start = model.hidden.weight.detach().clone()
    opt = Lion8bit(model.parameters(), lr=1e-3, weight_decay=0.1)
    trainer = transformers.Trainer(model=model, args=_args(tmp_path), train_dataset=tiny_dataset(),
                                   optimizers=(opt, None))
    trainer.train()
    _check_trained(opt, Lion8bit, model, start)
