"""Fine-tuning helpers: weight-decay parameter groups and the course's DistilBERT (lesson 10).

Weight decay pulls weights towards 0. It is not applied to biases or to normalization
weights (LayerNorm's scale should stay near 1, and its bias/shift near wherever the data
puts it). So the parameters are split into two groups::

    [{"params": <decay>,    "weight_decay": wd},
     {"params": <no decay>, "weight_decay": 0.0}]

:func:`decay_parameter_names` gives the same names as
``transformers.Trainer.get_decay_parameter_names`` (tested on DistilBERT).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = [
    "NORM_LAYERS",
    "decay_parameter_names",
    "make_param_groups",
    "distilbert_config",
    "build_distilbert",
    "DISTILBERT_NUM_PARAMS",
]

#: Normalization layers whose parameters never get weight decay.
NORM_LAYERS: tuple[type[nn.Module], ...] = tuple(
    cls for cls in (nn.LayerNorm, getattr(nn, "RMSNorm", None), nn.GroupNorm,
                    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
    if cls is not None
)

#: distilbert-base-cased with a 2-label classification head, as in the source chapter.
DISTILBERT_NUM_PARAMS = 65_783_042


def _is_norm(module: nn.Module) -> bool:
    # isinstance covers torch's norms; the name test covers model-specific ones (e.g. LlamaRMSNorm)
    return isinstance(module, NORM_LAYERS) or type(module).__name__.lower().endswith("norm")


def decay_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters that get weight decay: all but biases and norm-layer weights.

    Ordered as ``model.named_parameters()``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    no_decay: set[str] = set()
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        for name, _ in module.named_parameters(recurse=False):
            if _is_norm(module) or name == "bias":
                no_decay.add(prefix + name)
    return [name for name, _ in model.named_parameters() if name not in no_decay]


def make_param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two optimizer groups: decayed weights, and biases + norm weights with decay 0.

    Parameters with ``requires_grad=False`` are left out; an empty group is dropped.
    """
    if not weight_decay >= 0.0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    decay = set(decay_parameter_names(model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if n in decay], "weight_decay": weight_decay},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


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
