"""Checks for workbook 09 · memory maths (the seed numbers for DistilBERT, a full training budget)."""

from __future__ import annotations

import math

import torch

from ...memory import MB, estimate_optimizer_memory
from ..finetune import DISTILBERT_NUM_PARAMS
from ._common import call, fail, passed, require_callable
from ._variants import expect_close

__all__ = ["check_state_megabytes", "check_training_memory", "distilbert_shapes"]


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


class _ShapesModel(torch.nn.Module):
    """A model with the given parameter shapes on the meta device (no memory, instant)."""

    def __init__(self, shapes, dtype=torch.float32):
        super().__init__()
        self.weights = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.empty(s, device="meta", dtype=dtype)) for s in shapes])


# ---------------------------------------------------------------------------- 09.1
def check_state_megabytes(state_megabytes) -> None:
    """``state_megabytes(num_params, kind="adam8bit", blocksize=256)`` -> MiB of optimizer state."""
    require_callable(state_megabytes, "state_megabytes")
    n_bert = DISTILBERT_NUM_PARAMS
    for n, kind, bs in [(n_bert, "adam8bit", 256), (n_bert, "adamw", 256), (n_bert, "adam8bit", 2048),
                        (1000, "adam8bit", 256), (4096, "adam8bit", 64), (0, "adam8bit", 256),
                        (7_000_000_000, "adam8bit", 256), (7_000_000_000, "adamw", 256)]:
        want = estimate_optimizer_memory(n, kind, blocksize=bs, min_8bit_size=0).megabytes  # all large
        got = call(state_megabytes, n, kind, blocksize=bs)
        blocks = -(-n // bs)
        codes = 2 * n if kind == "adam8bit" else 8 * n
        absmax = 8 * blocks if kind == "adam8bit" else 0
        expect_close(got, want, what=f"state_megabytes({n:,}, {kind!r}, blocksize={bs})", rtol=1e-9, atol=1e-9,
                     default="adamw: 8 bytes/param; adam8bit: 2 bytes/param + 2 fp32 absmax per block "
                             "(ceil(n / blocksize) blocks); MB = 2**20 bytes.",
                     variants=[
                         ("'MB' here is MiB (2**20 bytes), as in the chapter: divide by 2**20, not 10**6.",
                          lambda: (codes + absmax) / 1e6),
                         ("you forgot the absmax: 2 fp32 scales (8 bytes) per block of blocksize parameters.",
                          lambda: codes / MB),
                         ("the ragged tail is a block too: ceil(n / blocksize) blocks.",
                          lambda: (codes + 8 * (n // bs)) / MB),
                         ("Adam has two states (m and v): 2 bytes/param in 8-bit, 8 in fp32.",
                          lambda: (codes + absmax) / 2 / MB),
                         ("one absmax per block for EACH of the two states (8 bytes per block).",
                          lambda: (codes + absmax / 2) / MB),
                     ])
    passed("Exercise 09.1 · The seed numbers")


# ---------------------------------------------------------------------------- 09.2
def _budget_variant(model, kind, bs, min_size, *, grads=True, itemsize=None, small_rule=True):
    params = list(model.parameters())
    w = sum(p.numel() * (itemsize or p.element_size()) for p in params)
    opt = estimate_optimizer_memory([p.shape for p in params], kind, blocksize=bs,
                                    min_8bit_size=min_size if small_rule else 0).total_bytes
    g = w if grads else 0
    return {"weights": w, "gradients": g, "optimizer": opt, "total": w + g + opt}


def check_training_memory(training_memory) -> None:
    """``training_memory(model, optimizer, blocksize=256, min_8bit_size=4096)`` -> bytes per part."""
    require_callable(training_memory, "training_memory")
    bert = _ShapesModel(distilbert_shapes())
    n_bert = sum(p.numel() for p in bert.parameters())
    assert n_bert == DISTILBERT_NUM_PARAMS, n_bert  # the shapes above are DistilBERT's
    mlp = torch.nn.Sequential(torch.nn.Linear(100, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 10))
    cases = [("DistilBERT (fp32)", bert, "adamw", 256, 4096), ("DistilBERT (fp32)", bert, "adam8bit", 256, 4096),
             ("DistilBERT in bf16", _ShapesModel(distilbert_shapes(), torch.bfloat16), "adam8bit", 256, 4096),
             ("a small MLP", mlp, "adam8bit", 256, 4096), ("a small MLP", mlp, "adamw", 256, 4096),
             ("a small MLP, blocksize 64, min_8bit_size 0", mlp, "adam8bit", 64, 0),
             ("a small MLP in fp16", torch.nn.Linear(100, 64).to(torch.float16), "adam8bit", 256, 4096)]
    for label, model, kind, bs, min_size in cases:
        want = _budget_variant(model, kind, bs, min_size)
        got = call(training_memory, model, kind, blocksize=bs, min_8bit_size=min_size)
        what = f"training_memory({label}, {kind!r}, blocksize={bs}, min_8bit_size={min_size})"
        if not isinstance(got, dict):
            fail(f"{what} returned {type(got).__name__}, expected a dict.",
                 hint="return {'weights': ..., 'gradients': ..., 'optimizer': ..., 'total': ...} in bytes")
        expect_close(got, want, what=what, rtol=0, atol=0,
                     default="weights and gradients: numel * element_size of each parameter; optimizer: the "
                             "per-tensor state bytes of exercise 01.2; total: their sum (bytes, ints).",
                     variants=[
                         ("gradients take as much memory as the weights (one per parameter, same dtype).",
                          lambda: _budget_variant(model, kind, bs, min_size, grads=False)),
                         ("use each parameter's element_size(): bf16/fp16 weights and gradients take 2 bytes.",
                          lambda: _budget_variant(model, kind, bs, min_size, itemsize=4)),
                         ("small-tensor rule: tensors under min_8bit_size elements keep fp32 states (8 bytes/param).",
                          lambda: _budget_variant(model, kind, bs, min_size, small_rule=False)),
                     ])
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in got.values()):
            fail(f"{what}: the values should be ints (bytes).", hint="count bytes with integer arithmetic")
    got = call(training_memory, bert, "adam8bit")
    mib = got["optimizer"] / MB
    if not math.isclose(mib, _budget_variant(bert, "adam8bit", 256, 4096)["optimizer"] / MB):
        fail(f"training_memory(DistilBERT, 'adam8bit') with the defaults gives {mib:.1f} MiB of state.",
             hint="the defaults are blocksize=256 and min_8bit_size=4096, as in bitsandbytes.")
    passed("Exercise 09.2 · A full training memory budget")
