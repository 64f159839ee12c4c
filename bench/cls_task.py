"""The classification fine-tune for convergence evidence: synpara with a small DistilBERT.

The course's lesson-10 scenario, made reproducible and small enough for many seeds:

* data: the offline paraphrase task synpara (``adam8lib.course.data.load_task("offline")``), the
  first ``train_pairs`` training pairs and all 1,000 validation pairs;
* model: ``build_distilbert(small=True)`` (2 layers, width 128) with the task's vocabulary,
  initialised from the seed (no download);
* loop: plain PyTorch (no ``accelerate``, whose data-loader wrapping re-seeds shuffling):
  fp32, dropout masks from ``torch.manual_seed(seed)``, shuffling from a generator seeded
  with the seed, linear warm-up for ``warmup`` of the steps then linear decay to 0, gradient
  clipping at 1.0, decoupled weight decay on the ``make_param_groups`` groups;
* metrics: validation accuracy, F1 of the paraphrase class, and mean validation loss.

Same seed and threads give the same numbers (``torch.use_deterministic_algorithms(True)``).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class ClsConfig:
    train_pairs: int = 2000
    epochs: int = 3
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    warmup: float = 0.1
    clip: float = 1.0


@lru_cache(maxsize=None)
def load(train_pairs: int):
    from adam8lib.course import data as D

    data, tok, name = D.load_task("offline")
    data = dict(data)
    if train_pairs < len(data["train"]):
        data["train"] = data["train"].select(range(train_pairs))
    return data, tok, name


def run(make_optimizer: Callable[[list[dict[str, Any]], ClsConfig], torch.optim.Optimizer], seed: int,
        cfg: ClsConfig = ClsConfig(), *, threads: int = 1) -> dict[str, Any]:
    """Fine-tune once with ``make_optimizer(param_groups, cfg)``; return metrics and the loss curve."""
    from adam8lib.course import finetune as F
    from adam8lib.training import make_param_groups

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    data, tok, _ = load(cfg.train_pairs)
    model = F.build_distilbert(small=True, seed=seed, vocab_size=len(tok), max_position_embeddings=64)
    train, valid = F.make_dataloaders(data, tok, batch_size=cfg.batch_size, seed=seed)
    opt = make_optimizer(make_param_groups(model, cfg.weight_decay), cfg)
    total = cfg.epochs * len(train)
    warm = max(1, math.ceil(cfg.warmup * total))
    peak = [g["lr"] for g in opt.param_groups]
    torch.manual_seed(seed)  # dropout masks
    losses: list[float] = []
    step = 0
    start = time.perf_counter()
    model.train()
    for _ in range(cfg.epochs):
        for batch in train:
            scale = (step + 1) / warm if step < warm else max(0.0, (total - step) / max(1, total - warm))
            for g, base in zip(opt.param_groups, peak):
                g["lr"] = base * scale
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            step += 1
    seconds = time.perf_counter() - start
    metrics = F.evaluate(model, valid)
    return {"seed": seed, "threads": threads, "accuracy": metrics["accuracy"], "f1": metrics["f1"],
            "valid_loss": metrics["loss"], "seconds": seconds, "loss": losses}


def describe(cfg: ClsConfig) -> dict[str, Any]:
    from adam8lib.course import finetune as F

    data, tok, name = load(cfg.train_pairs)
    model = F.build_distilbert(small=True, seed=0, vocab_size=len(tok), max_position_embeddings=64)
    return {"task": f"{name} paraphrase classification, small DistilBERT from scratch", "config": asdict(cfg),
            "parameters": sum(p.numel() for p in model.parameters()),
            "train_pairs": len(data["train"]), "validation_pairs": len(data["validation"])}
