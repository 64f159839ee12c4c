"""Fine-tuning the course's DistilBERT with 8-bit Adam, three ways (lesson 10).

* :func:`adam8lib.training.training_step` — plain PyTorch (the library);
* :func:`make_trainer` — ``transformers.Trainer(..., optimizers=(Adam8bit(groups), None))``
  with accuracy + F1 as ``compute_metrics``;
* :func:`train_with_accelerate` — an ``accelerate`` loop: ``prepare`` (which also wraps the
  forward in autocast), ``accelerator.backward``,
  a linear warm-up/decay schedule, tqdm progress bars.

Also the model (distilbert-base-cased for 2-label classification: pretrained from the hub when
it answers, else built from its config, offline), data loaders and metrics. Course machinery:
``import adam8lib`` does not import this module (nor transformers).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch
from torch import nn

from ..training import autocast_dtype, make_optimizer, pick_precision
from .data import hub_available

__all__ = [
    "DISTILBERT_NUM_PARAMS",
    "distilbert_config",
    "build_distilbert",
    "load_distilbert",
    "accuracy_f1",
    "compute_metrics",
    "make_dataloaders",
    "evaluate",
    "fresh_accelerator",
    "train_with_accelerate",
    "make_trainer",
]

#: distilbert-base-cased with a 2-label classification head, as in the source chapter.
DISTILBERT_NUM_PARAMS = 65_783_042


def distilbert_config(small: bool = False, **overrides: Any):
    """``DistilBertConfig`` for distilbert-base-cased with 2 labels, built offline.

    ``small=True`` gives a 2-layer, 128-wide model of the same architecture for fast CPU runs.
    """
    from transformers import DistilBertConfig

    kwargs: dict[str, Any] = dict(vocab_size=28996, num_labels=2)
    if small:
        kwargs.update(n_layers=2, dim=128, hidden_dim=512, n_heads=2, max_position_embeddings=128)
    kwargs.update(overrides)
    return DistilBertConfig(**kwargs)


def build_distilbert(small: bool = False, seed: int = 0, **overrides: Any):
    """``DistilBertForSequenceClassification`` from config (random init, no download)."""
    from transformers import DistilBertForSequenceClassification

    torch.manual_seed(seed)
    return DistilBertForSequenceClassification(distilbert_config(small=small, **overrides))


def load_distilbert(small: bool = False, seed: int = 0, source: str = "auto", **overrides: Any):
    """DistilBERT for 2-label classification: pretrained when the hub is reachable, else from config.

    ``source="hub"`` loads ``distilbert-base-cased`` weights (the classifier head is new);
    ``"offline"`` builds from :func:`distilbert_config` (random init, no download); ``"auto"``
    picks the hub only where it answers (:func:`adam8lib.course.data.hub_available`). ``small`` and
    ``overrides`` apply to the offline model only.
    """
    if source not in ("auto", "hub", "offline"):
        raise ValueError(f"source must be 'auto', 'hub' or 'offline', got {source!r}")
    if source == "hub" or (source == "auto" and hub_available()):
        from transformers import DistilBertForSequenceClassification

        torch.manual_seed(seed)  # the new classifier head
        return DistilBertForSequenceClassification.from_pretrained("distilbert-base-cased", num_labels=2)
    return build_distilbert(small=small, seed=seed, **overrides)


def accuracy_f1(predictions: Iterable[int], labels: Iterable[int]) -> dict[str, float]:
    """Accuracy and F1 of the positive class (label 1 = paraphrase), as GLUE reports MRPC."""
    pred = torch.as_tensor(list(predictions) if not torch.is_tensor(predictions) else predictions).long().flatten()
    gold = torch.as_tensor(list(labels) if not torch.is_tensor(labels) else labels).long().flatten()
    if pred.shape != gold.shape:
        raise ValueError(f"{pred.numel()} predictions for {gold.numel()} labels")
    if gold.numel() == 0:
        raise ValueError("no predictions to score")
    tp = int(((pred == 1) & (gold == 1)).sum())
    fp = int(((pred == 1) & (gold != 1)).sum())
    fn = int(((pred != 1) & (gold == 1)).sum())
    f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    return {"accuracy": float((pred == gold).float().mean()), "f1": f1}


def compute_metrics(eval_pred) -> dict[str, float]:
    """``Trainer``'s ``compute_metrics``: logits → argmax → accuracy and F1."""
    logits, labels = eval_pred[0], eval_pred[1]
    logits = logits[0] if isinstance(logits, tuple) else logits
    return accuracy_f1(torch.as_tensor(logits).argmax(-1), torch.as_tensor(labels))


def make_dataloaders(data, tokenizer, batch_size: int = 32, seed: int = 0, eval_batch_size: int = 256):
    """Shuffled train and ordered validation ``DataLoader``s that pad each batch dynamically."""
    from torch.utils.data import DataLoader
    from transformers import DataCollatorWithPadding

    collate = DataCollatorWithPadding(tokenizer, return_tensors="pt")
    gen = torch.Generator().manual_seed(seed)
    train = DataLoader(data["train"].with_format("torch"), batch_size=batch_size, shuffle=True,
                       collate_fn=collate, generator=gen)
    valid = DataLoader(data["validation"].with_format("torch"), batch_size=eval_batch_size, collate_fn=collate)
    return train, valid


@torch.no_grad()
def evaluate(model: nn.Module, loader, precision: str = "no", accelerator=None) -> dict[str, float]:
    """Accuracy/F1 (and mean loss) of ``model`` on ``loader``, under autocast when asked."""
    dtype = autocast_dtype(precision)
    device = next(model.parameters()).device
    model.eval()
    preds, golds, losses = [], [], []
    for batch in loader:
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            out = model(**batch)
        logits, labels = out.logits, batch["labels"]
        if accelerator is not None:
            logits, labels = accelerator.gather_for_metrics((logits, labels))
        preds.append(logits.argmax(-1).cpu())
        golds.append(labels.cpu())
        losses.append(float(out.loss) * len(batch["labels"]))
    model.train()
    metrics = accuracy_f1(torch.cat(preds), torch.cat(golds))
    metrics["loss"] = sum(losses) / sum(len(g) for g in golds)
    return metrics


def fresh_accelerator(**kwargs: Any):
    """``Accelerator(**kwargs)`` after forgetting any earlier one in this process.

    ``accelerate`` keeps one global state: a second ``Accelerator`` with another
    ``mixed_precision`` (or a ``Trainer`` after an ``Accelerator``) raises unless it is reset.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    return Accelerator(**kwargs)


def train_with_accelerate(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    train_loader,
    eval_loader=None,
    *,
    epochs: int = 1,
    precision: str = "auto",
    warmup_ratio: float = 0.1,
    max_grad_norm: float | None = 1.0,
    progress: bool = True,
    on_step: Callable[[int, float], None] | None = None,
) -> dict[str, Any]:
    """Fine-tune with ``accelerate``: prepare → (forward, ``accelerator.backward``, clip, step,
    schedule) per batch → evaluate after each epoch.

    With mixed precision on, ``accelerator.prepare`` replaces ``model.forward`` by one that runs
    under autocast and returns fp32 outputs, so the loop opens no autocast of its own.

    ``precision`` is ``"no"`` (fp32), ``"bf16"``, ``"fp16"`` (GPU only; accelerate adds the
    ``GradScaler``) or ``"auto"`` (:func:`pick_precision`: bf16 on bf16 GPUs and on CPUs with
    native bf16, fp16 on older GPUs, fp32 on other CPUs). The schedule warms up linearly
    for ``warmup_ratio`` of the steps, then decays linearly to 0. Returns
    ``{"loss": [per step], "lr": [per step], "eval": [per epoch], "precision": ...}``.
    """
    from tqdm.auto import tqdm
    from transformers import get_linear_schedule_with_warmup

    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
    if not 0.0 <= warmup_ratio < 1.0:
        raise ValueError(f"warmup_ratio must be in [0, 1), got {warmup_ratio}")
    use_cuda = torch.cuda.is_available()  # prepare() moves the model there
    if precision == "auto":
        precision = pick_precision("cuda" if use_cuda else "cpu")
    autocast_dtype(precision)  # validates
    if precision == "fp16" and not use_cuda:
        raise ValueError("fp16 mixed precision needs a CUDA GPU here; use 'bf16' on the CPU")
    accelerator = fresh_accelerator(mixed_precision=precision, cpu=not use_cuda)
    total = epochs * len(train_loader)
    scheduler = get_linear_schedule_with_warmup(optimizer, math.ceil(warmup_ratio * total), total)
    model, optimizer, train_loader, scheduler = accelerator.prepare(model, optimizer, train_loader, scheduler)
    if eval_loader is not None:
        eval_loader = accelerator.prepare(eval_loader)
    history: dict[str, Any] = {"loss": [], "lr": [], "eval": [], "precision": precision}
    bar = tqdm(total=total, desc=f"train ({'fp32' if precision == 'no' else precision})", disable=not progress or not accelerator.is_local_main_process)
    model.train()
    for epoch in range(epochs):
        for batch in train_loader:
            loss = model(**batch).loss  # prepare() wrapped forward in the accelerator's autocast
            accelerator.backward(loss)
            if max_grad_norm is not None:
                accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
            history["lr"].append(scheduler.get_last_lr()[0])
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            history["loss"].append(float(loss.detach()))
            bar.update(1)
            bar.set_postfix(loss=f"{history['loss'][-1]:.3f}")
            if on_step is not None:
                on_step(len(history["loss"]), history["loss"][-1])
        if eval_loader is not None:
            metrics = evaluate(model, eval_loader, precision=precision, accelerator=accelerator)
            history["eval"].append({"epoch": epoch + 1, **metrics})
    bar.close()
    history["model"] = accelerator.unwrap_model(model)
    return history


def make_trainer(
    model: nn.Module,
    tokenizer,
    train_dataset,
    eval_dataset=None,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    epochs: float = 1,
    batch_size: int = 32,
    precision: str = "auto",
    warmup_ratio: float = 0.1,
    output_dir: str | None = None,
    seed: int = 0,
    logging_steps: int = 10,
    max_steps: int = -1,
    progress: bool = True,
):
    """``transformers.Trainer`` with 8-bit Adam: ``optimizers=(Adam8bit(groups, lr=lr), None)``.

    The parameter groups come from :func:`make_param_groups` (no decay on biases and norm
    weights); ``None`` lets the Trainer build its linear schedule around our optimizer.
    ``compute_metrics`` reports accuracy and F1. Precision ``"auto"`` is :func:`pick_precision`'s:
    bf16 on bf16 GPUs and on CPUs with native bf16, fp16 on older GPUs (the Trainer adds the
    ``GradScaler``), fp32 (``"no"``) on other CPUs.
    """
    import tempfile

    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    use_cuda = torch.cuda.is_available()
    if precision == "auto":
        precision = pick_precision("cuda" if use_cuda else "cpu")
    autocast_dtype(precision)
    if precision == "fp16" and not use_cuda:
        raise ValueError("fp16 mixed precision needs a CUDA GPU here; use 'bf16' on the CPU")
    if optimizer is None:
        optimizer = make_optimizer(model.to("cuda" if use_cuda else "cpu"), "adam8bit", lr=lr,
                                   weight_decay=weight_decay)
    args = TrainingArguments(
        output_dir=output_dir or tempfile.mkdtemp(prefix="adam8-trainer-"),
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=4 * batch_size,
        num_train_epochs=epochs,
        max_steps=max_steps,
        learning_rate=lr,  # only shown in logs: the optimizer we pass keeps its own lr
        warmup_steps=warmup_ratio,  # a float < 1 is a fraction of the total steps
        lr_scheduler_type="linear",
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        use_cpu=not use_cuda,
        eval_strategy="epoch" if eval_dataset is not None else "no",
        save_strategy="no",
        logging_steps=logging_steps,
        report_to="none",
        seed=seed,
        data_seed=seed,
        disable_tqdm=not progress,
        dataloader_num_workers=0,
    )
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # see fresh_accelerator
    return Trainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        optimizers=(optimizer, None),
        compute_metrics=compute_metrics,
    )
