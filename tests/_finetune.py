"""Shared fixtures of the fine-tuning tests: offline hub, the full and tiny DistilBERT, the offline task."""

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


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    D.hub_available.cache_clear()
    yield
    D.hub_available.cache_clear()


@pytest.fixture(scope="module")
def full_model():
    """The full model without its random init (slow on 2 cores): built on the meta device,
    then given real, uninitialized CPU storage. Names, shapes and optimizer states are what matter."""
    with torch.device("meta"):
        model = F.build_distilbert(small=False)
    return model.to_empty(device="cpu")


@pytest.fixture(scope="module")
def task():
    data, tok, name = D.load_task("offline")
    return data, tok


def tiny_model(vocab_size: int, seed: int = 0):
    return F.build_distilbert(small=True, seed=seed, vocab_size=vocab_size, max_position_embeddings=64)


def trainer_decay_names(model):
    from transformers import Trainer

    return Trainer.get_decay_parameter_names(None, model)  # does not use self


def _overfit_set(task, n=16):
    data, tok = task
    return data["train"].select(range(n)), tok


def _batch(task, n=32):
    from transformers import DataCollatorWithPadding

    data, tok = task
    return DataCollatorWithPadding(tok, return_tensors="pt")([data["train"][i] for i in range(n)])

