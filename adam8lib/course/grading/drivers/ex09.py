"""Drivers of workbook 09 (:mod:`adam8lib.course.checks.ex09_memory_maths`): the learner's functions are handed
models, which cannot cross between the processes as plain data; these drivers build the same models here, by the
case the check names (shapes on the meta device, small modules from a fixed seed), call the learner's function on
them and return plain data: the learner's answer, or, for an optimizer the learner builds, what it is and which
settings each named parameter got."""

from __future__ import annotations

import torch
from torch import nn

from . import described, driver

__all__ = ["distilbert_shapes", "ShapesModel", "TiedLM", "budget_models", "element_models", "SeedTiny",
           "training_memory_run", "state_elements_run", "seed_optimizer_run"]


def distilbert_shapes(vocab_size: int = 28996, dim: int = 768, hidden: int = 3072, layers: int = 6,
                      positions: int = 512, labels: int = 2) -> list[tuple[int, ...]]:
    """Parameter shapes of DistilBertForSequenceClassification (distilbert-base-cased, 2 labels)."""
    shapes: list[tuple[int, ...]] = [(vocab_size, dim), (positions, dim), (dim,), (dim,)]  # embeddings + LayerNorm
    for _ in range(layers):
        for _ in range(4):  # q, k, v, out projections
            shapes += [(dim, dim), (dim,)]
        shapes += [(dim,), (dim,)]  # sa_layer_norm
        shapes += [(hidden, dim), (hidden,), (dim, hidden), (dim,)]  # feed-forward
        shapes += [(dim,), (dim,)]  # output_layer_norm
    shapes += [(dim, dim), (dim,), (labels, dim), (labels,)]  # pre_classifier, classifier
    return shapes


class ShapesModel(nn.Module):
    """A model with the given parameter shapes on the meta device (no memory, instant)."""

    def __init__(self, shapes, dtype=torch.float32):
        super().__init__()
        self.weights = nn.ParameterList([nn.Parameter(torch.empty(s, device="meta", dtype=dtype)) for s in shapes])


class TiedLM(nn.Module):
    """A tiny language model whose output layer shares the embedding table (tied weights), with a
    BatchNorm whose running statistics are buffers, not parameters."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5000, 16)
        self.norm = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 5000, bias=False)
        self.head.weight = self.embed.weight  # one tensor, two names


def budget_models() -> list[tuple[str, nn.Module, str, int, int]]:
    """09.2's cases: (label, model, kind, blocksize, min_8bit_size)."""
    bert = ShapesModel(distilbert_shapes())
    mlp = nn.Sequential(nn.Linear(100, 64), nn.LayerNorm(64), nn.Linear(64, 10))
    return [("DistilBERT (fp32)", bert, "adamw", 256, 4096), ("DistilBERT (fp32)", bert, "adam8bit", 256, 4096),
            ("DistilBERT in bf16", ShapesModel(distilbert_shapes(), torch.bfloat16), "adam8bit", 256, 4096),
            ("a small MLP", mlp, "adam8bit", 256, 4096), ("a small MLP", mlp, "adamw", 256, 4096),
            ("a small MLP, blocksize 64, min_8bit_size 0", mlp, "adam8bit", 64, 0),
            ("a small MLP in fp16", nn.Linear(100, 64).to(torch.float16), "adam8bit", 256, 4096),
            ("a 64x64 layer (its weight has exactly min_8bit_size elements)", nn.Linear(64, 64), "adam8bit",
             256, 4096),
            ("a tiny LM with tied embedding/output weights and a BatchNorm (buffers)", TiedLM(), "adam8bit", 256,
             4096),
            ("two layers whose weights (7,000 and 6,300 elements) are not multiples of the blocksize",
             nn.Sequential(nn.Linear(100, 70), nn.Linear(70, 90)), "adam8bit", 256, 4096)]


def element_models() -> list[tuple[str, nn.Module]]:
    """09.3's cases: (label, model)."""
    mlp = nn.Sequential(nn.Linear(10, 20), nn.LayerNorm(20), nn.Linear(20, 3))
    frozen = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 2))
    frozen[0].weight.requires_grad_(False)  # a frozen embedding: AdamW never sees a gradient for it
    tied = nn.ModuleDict({"embed": nn.Embedding(40, 6), "head": nn.Linear(6, 40, bias=False), "norm": nn.LayerNorm(6)})
    tied["head"].weight = tied["embed"].weight  # one tensor in two modules, as a language model ties its embedding
    return [("an MLP", mlp), ("a model with a frozen embedding", frozen),
            ("a model whose output layer shares the embedding's weight (tied)", tied),
            ("DistilBERT (meta tensors)", ShapesModel(distilbert_shapes()))]


class SeedTiny(nn.Module):
    """09.4's model: an embedding, a LayerNorm, a linear layer and a head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 16)
        self.ln = nn.LayerNorm(16)
        self.lin = nn.Linear(16, 16)
        self.head = nn.Linear(16, 2)


@driver
def training_memory_run(training_memory, case: int, defaults: bool = False):
    """``training_memory(model, kind, blocksize=..., min_8bit_size=...)`` on 09.2's case number ``case`` (with
    ``defaults``: only ``(model, kind)``): the learner's answer (:func:`described`)."""
    _, model, kind, blocksize, min_size = budget_models()[case]
    got = training_memory(model, kind) if defaults else training_memory(model, kind, blocksize=blocksize,
                                                                        min_8bit_size=min_size)
    return _dict_or_value(got)


@driver
def state_elements_run(adamw_state_elements, case: int):
    """``adamw_state_elements(model)`` on 09.3's case number ``case``: the learner's answer."""
    return _dict_or_value(adamw_state_elements(element_models()[case][1]))


def _dict_or_value(got):
    if type(got) is dict:
        return {"dict": {k: described(v) for k, v in got.items() if "plain" in described(k)}}
    return {"value": described(got)}


@driver
def seed_optimizer_run(seed_adam8bit, args: dict) -> dict:
    """``seed_adam8bit(model, args)`` on :class:`SeedTiny` (seeded) with ``args`` as attributes: which class the
    optimizer is (and whether it is bitsandbytes' Adam8bit or AdamW8bit) and, per parameter name, the settings of
    every group that holds it."""
    from types import SimpleNamespace

    import bitsandbytes as bnb

    torch.manual_seed(0)
    model = SeedTiny()
    names = {id(p): n for n, p in model.named_parameters()}
    opt = seed_adam8bit(model, SimpleNamespace(**args))
    out = {"type": f"{type(opt).__module__}.{type(opt).__name__}", "adam8bit": isinstance(opt, bnb.optim.Adam8bit),
           "adamw8bit": isinstance(opt, bnb.optim.AdamW8bit), "torch": type(opt).__module__.startswith("torch.optim"),
           "class": type(opt).__name__, "groups": {}}
    if out["adam8bit"]:
        for group in opt.param_groups:
            settings = {key: described(group.get(key)).get("plain") for key in ("weight_decay", "lr", "betas", "eps")}
            for p in group["params"]:
                out["groups"].setdefault(names.get(id(p), "<not a parameter of the model>"), []).append(settings)
    return out
