"""Checks for workbook 10 · mixed-precision fine-tuning: decay groups and the training step."""

from __future__ import annotations

import contextlib
import io
import logging
import math
import warnings
from collections.abc import Callable
from types import SimpleNamespace

import torch
from torch import nn

from ._common import assert_equal, call, fail, passed, require_callable

__all__ = ["check_decay_parameter_names", "check_training_step"]


# ---------------------------------------------------------------------- exercise 10.1
class ScaleNorm(nn.Module):
    """An RMSNorm-like layer of "some model": not a torch class, its name ends in ``Norm``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.gain * x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()


class _Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attn = nn.Linear(dim, dim)  # weight decays, bias does not
        self.ln = nn.LayerNorm(dim)  # a LayerNorm whose *name* says nothing about norms
        self.ffn = nn.Sequential(nn.Linear(dim, 2 * dim, bias=False), nn.GELU(), nn.Linear(2 * dim, dim))


class _CustomNet(nn.Module):
    """Norm layers under names that no name pattern catches, and names that fool substring tests."""

    def __init__(self, dim: int = 8, rms: bool = True) -> None:
        super().__init__()
        self.tok = nn.Embedding(11, dim)
        self.blocks = nn.ModuleList([_Block(dim) for _ in range(2)])
        self.final = ScaleNorm(dim)
        if rms and hasattr(nn, "RMSNorm"):
            self.post = nn.RMSNorm(dim)
        self.denormalizer = nn.Linear(dim, dim)  # "norm" in the name, still a Linear: its weight decays
        self.temperature = nn.Parameter(torch.ones(1))  # a parameter of the model itself: decays
        self.bias = nn.Parameter(torch.zeros(dim))  # ...and one named bias: no decay


@contextlib.contextmanager
def _quiet():
    """Silence the notes that the first transformers model import may log (optional torchao
    kernels and the like): a check cell must print only its success line."""
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)


def _models() -> list[tuple[str, nn.Module]]:
    with _quiet():
        from ..finetune import build_distilbert

        distilbert = build_distilbert(small=True)
    return [
        ("DistilBERT (small)", distilbert),
        ("a custom model (LayerNorm named 'ln', an RMSNorm-like 'ScaleNorm', a Linear named 'denormalizer')",
         _CustomNet()),
        ("nn.Sequential(Linear, LayerNorm, Linear without bias)",
         nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2, bias=False))),
    ]


def _norm_param_names(model: nn.Module) -> dict[str, str]:
    from ...training import _is_norm

    out = {}
    for mod_name, module in model.named_modules():
        if _is_norm(module):
            for name, _ in module.named_parameters(recurse=False):
                out[f"{mod_name}.{name}" if mod_name else name] = type(module).__name__
    return out


def check_decay_parameter_names(get_decay_parameter_names: Callable) -> None:
    """Compare with :func:`adam8lib.training.decay_parameter_names` on three models."""
    from ...training import decay_parameter_names

    require_callable(get_decay_parameter_names, "get_decay_parameter_names")
    for label, model in _models():
        got = call(get_decay_parameter_names, model)
        what = f"get_decay_parameter_names on {label}"
        if got is None:
            fail(f"{what} returned None.", hint="did you forget to `return` the list of names?")
        if isinstance(got, (str, bytes)) or not isinstance(got, (list, tuple)):
            fail(f"{what} should return a list of parameter names, got {type(got).__name__}.",
                 hint="collect the names in a list: [name for name, p in model.named_parameters() if ...]")
        if not all(isinstance(n, str) for n in got):
            fail(f"{what} should contain names (str), got {type(next(n for n in got if not isinstance(n, str))).__name__}.",
                 hint="return the *names* from model.named_parameters(), not the parameters")
        all_names = [n for n, _ in model.named_parameters()]
        if len(set(got)) != len(got):
            dup = next(n for n in got if got.count(n) > 1)
            fail(f"{what} lists {dup!r} more than once.",
                 hint="each parameter once: walk model.named_parameters() (or named_modules with recurse=False)")
        unknown = [n for n in got if n not in all_names]
        if unknown:
            fail(f"{what} returned names that are not parameters of the model, e.g. {unknown[0]!r}.",
                 hint="use the full dotted names of model.named_parameters(), e.g. 'blocks.0.attn.weight'")
        want = decay_parameter_names(model)
        extra = [n for n in got if n not in want]
        missing = [n for n in want if n not in got]
        norms = _norm_param_names(model)
        for name in extra:
            if name in norms:
                cls = norms[name]
                if cls in ("LayerNorm", "RMSNorm"):
                    hint = (f"{name!r} belongs to an nn.{cls} module: find norm layers by their type "
                            "(isinstance), not by their name — here it is not called 'LayerNorm'")
                else:
                    hint = (f"{name!r} belongs to a {cls} module: models bring their own norm classes; "
                            "treat any module whose class name ends in 'Norm' as a norm layer too")
                fail(f"{what}: {name!r} should NOT decay.", hint=hint)
            if name.rsplit(".", 1)[-1] == "bias":
                fail(f"{what}: {name!r} should NOT decay.", hint="biases never get weight decay: drop every parameter named 'bias'")
        if extra:
            fail(f"{what}: {extra[0]!r} should NOT decay.", hint="only weights outside norm layers decay")
        if missing:
            name = missing[0]
            if "norm" in name.lower():
                hint = (f"{name!r} has 'norm' in its name but is a {type(_owner(model, name)).__name__}'s "
                        "weight: decide by the module's type, not by a substring of the name")
            elif "." not in name:
                hint = f"{name!r} is a parameter of the model itself (no submodule): include it too"
            else:
                hint = "every weight outside norm layers decays (embeddings and Linear weights included)"
            fail(f"{what}: {name!r} is missing — it should decay.", hint=hint)
        assert_equal(sorted(got), sorted(want), what=what)
    passed("Exercise 10.1 · Weight-decay parameter names")


def _owner(model: nn.Module, name: str) -> nn.Module:
    return model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model


# ---------------------------------------------------------------------- exercise 10.2
class TinyClassifier(nn.Module):
    """A 2-class bag-of-embeddings model with the Hugging Face call convention
    (``model(input_ids=..., attention_mask=..., labels=...)`` returns ``.loss`` and ``.logits``)."""

    def __init__(self, vocab: int = 128, dim: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)  # 4096 elements: 8-bit states in Adam8bit
        self.hidden = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 2)

    def forward(self, input_ids, attention_mask, labels=None):
        mask = attention_mask.unsqueeze(-1).to(self.emb.weight.dtype)
        pooled = (self.emb(input_ids) * mask).sum(1) / mask.sum(1)
        logits = self.head(self.norm(torch.relu(self.hidden(pooled))))
        loss = nn.functional.cross_entropy(logits.float(), labels) if labels is not None else None
        return SimpleNamespace(loss=loss, logits=logits)


def _tiny_batches(n: int, seed: int, distinct: int = 4) -> list[dict[str, torch.Tensor]]:
    """``n`` steps cycling over ``distinct`` batches; label = is token 1 in the sequence?"""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(distinct):
        ids = torch.randint(2, 128, (16, 12), generator=gen)
        labels = torch.randint(0, 2, (16,), generator=gen)
        ids[labels == 1, 0] = 1
        mask = torch.ones_like(ids)
        mask[:, 10:] = torch.randint(0, 2, (16, 2), generator=gen)
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return [batches[i % distinct] for i in range(n)]


def _setup(seed: int, lr: float = 1e-2):
    from ...optim import Adam8bit
    from ...training import make_param_groups

    torch.manual_seed(seed)
    model = TinyClassifier()
    opt = Adam8bit(make_param_groups(model, 0.01), lr=lr, backend="torch")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / math.sqrt(1 + s))
    return model, opt, sched


def _reference_run(batches, seed, dtype):
    from ...training import training_step

    model, opt, sched = _setup(seed)
    return [training_step(model, b, opt, sched, dtype=dtype) for b in batches]


def check_training_step(training_step: Callable) -> None:
    """Run the learner's step and the reference on the same tiny model and data (Adam8bit,
    a decaying schedule), in bf16 and fp16 autocast: the losses must match step by step."""
    require_callable(training_step, "training_step")
    for dtype in (torch.bfloat16, torch.float16):
        seed = 3 if dtype is torch.bfloat16 else 4
        batches = _tiny_batches(16, seed)
        model, opt, sched = _setup(seed)
        w0 = model.hidden.weight.detach().clone()
        seen: list[tuple[bool, torch.dtype, torch.dtype]] = []
        model.hidden.register_forward_hook(
            lambda m, i, o: seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), o.dtype)))
        losses = []
        name = {torch.bfloat16: "torch.bfloat16", torch.float16: "torch.float16"}[dtype]
        for step, batch in enumerate(batches):
            loss = call(training_step, model, batch, opt, sched, dtype=dtype)
            what = f"training_step(..., dtype={name}) at step {step + 1}"
            if loss is None:
                fail(f"{what} returned None.", hint="return the loss as a Python float: `return loss.item()`")
            if torch.is_tensor(loss):
                fail(f"{what} returned a tensor.",
                     hint="return loss.item() (a float): a tensor keeps the whole graph of the step alive")
            if not isinstance(loss, float):
                fail(f"{what} returned {type(loss).__name__}, expected a float.", hint="return loss.item()")
            if step == 0:
                if not seen:
                    fail(f"{what} never called the model.", hint="loss = model(**batch).loss")
                enabled, ac_dtype, out_dtype = seen[0]
                if not enabled:
                    fail(f"{what}: the forward pass did not run under autocast (the Linear gave {out_dtype}).",
                         hint="wrap the forward in `with torch.autocast(device_type, dtype=dtype):`")
                if out_dtype != dtype:
                    fail(f"{what}: autocast ran in {out_dtype}, asked for {name}.",
                         hint="pass the `dtype` argument to torch.autocast instead of a fixed dtype")
                if torch.equal(model.hidden.weight.detach(), w0):
                    fail(f"{what} did not change the weights.", hint="call optimizer.step() after loss.backward()")
                if model.hidden.weight.dtype != torch.float32:
                    fail(f"{what} changed the weights' dtype to {model.hidden.weight.dtype}.",
                         hint="autocast keeps fp32 weights; do not call model.to(dtype) / .half() / .bfloat16()")
            losses.append(loss)
        want = _reference_run(batches, seed, dtype)
        for step, (got, ref) in enumerate(zip(losses, want)):
            if abs(got - ref) > 1e-4 + 1e-3 * abs(ref):
                hint = _diagnose_step(training_step, dtype, seed)
                fail(f"training_step(..., dtype={name}): loss at step {step + 1} is {got:.5f}, the reference "
                     f"step gives {ref:.5f} (same model, data, optimizer and schedule).", hint=hint)
        first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
        if not last < 0.7 * first:
            fail(f"training_step(..., dtype={name}) did not lower the loss (mean of the first 4 steps "
                 f"{first:.4f}, of the last 4 {last:.4f}).",
                 hint="backward, optimizer.step(), scheduler.step(), zero_grad — all four, every step")
    passed("Exercise 10.2 · Mixed-precision training step")


def _diagnose_step(training_step: Callable, dtype: torch.dtype, seed: int) -> str:
    """Replay two steps and look at what the learner's step left behind."""
    batches = _tiny_batches(2, seed)
    model, opt, sched = _setup(seed)
    lr0 = opt.param_groups[0]["lr"]
    ref_model, ref_opt, ref_sched = _setup(seed)
    from ...training import training_step as reference

    try:
        training_step(model, batches[0], opt, sched, dtype=dtype)
    except Exception:  # noqa: BLE001 — the first call already passed in the check
        return "compare your step with: autocast forward → backward → optimizer.step() → scheduler.step() → zero_grad"
    reference(ref_model, batches[0], ref_opt, ref_sched, dtype=dtype)
    if sched.last_epoch == 0:
        return "call scheduler.step() once per training step (after optimizer.step())"
    if sched.last_epoch > 1:
        return f"scheduler.step() ran {sched.last_epoch} times in one training step: call it once"
    if not torch.allclose(model.hidden.weight, ref_model.hidden.weight, atol=1e-5):
        if opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"] != lr0:
            return ("the first update used the next step's learning rate: call scheduler.step() AFTER "
                    "optimizer.step()")
        return "the update differs: backward on the loss from the autocast forward, then optimizer.step()"
    # one step is right; does a second step see stale gradients?
    training_step(model, batches[1], opt, sched, dtype=dtype)
    reference(ref_model, batches[1], ref_opt, ref_sched, dtype=dtype)
    if not torch.allclose(model.hidden.weight, ref_model.hidden.weight, atol=1e-5):
        return "gradients add up across steps: call optimizer.zero_grad() every step"
    return "compare your step with: autocast forward → backward → optimizer.step() → scheduler.step() → zero_grad"
