"""Checks for workbook 09 · memory maths (the seed numbers for DistilBERT, a full training budget).

09.2-09.4 hand the learner's functions models: course drivers (:mod:`adam8lib.course.grading.drivers.ex09`) build
the same models where the learner's function runs (when graded: the learner's process) and return its answer as
plain data; this check compares it with its own count on its own copy of each model."""

from __future__ import annotations

import contextlib
import io
import math

import torch

from ...memory import MB, estimate_optimizer_memory
from ..finetune import DISTILBERT_NUM_PARAMS
from ..grading.drivers import drive
from ..grading.drivers import ex09 as _drivers
from ..grading.drivers.ex09 import distilbert_shapes
from ._common import call, fail, passed, require_callable
from ._properties import case_pattern
from ._variants import expect_close, matches

__all__ = ["check_state_megabytes", "check_training_memory", "check_adamw_state_elements", "check_seed_adam8bit", "distilbert_shapes"]


_ShapesModel, _TiedLM = _drivers.ShapesModel, _drivers.TiedLM


class _Foreign:
    """A value of the learner's answer that is not plain data: only its type's name and repr crossed."""

    def __init__(self, described: dict):
        self.kind, self.shown = str(described.get("kind")), str(described.get("repr"))

    def __repr__(self) -> str:
        return self.shown


def _answer(crossed: dict):
    """The learner's answer as a driver returned it (a dict key by key, or one value)."""

    def one(described: dict):
        return described["plain"] if "plain" in described else _Foreign(described)

    if "dict" in crossed:
        return {key: one(value) for key, value in crossed["dict"].items()}
    return one(crossed["value"])


def _as(fn, run):
    """``run`` under the learner's function's name (what :func:`call` reports)."""
    run.__name__ = run.__qualname__ = getattr(fn, "__name__", "your function")
    return run


def _quiet_call(fn, *args):
    """The learner's answer, or None when it raises (the main loop reports the error itself)."""
    try:
        return fn(args[0], args[1], blocksize=args[2])
    except Exception:  # noqa: BLE001
        return None


# ---------------------------------------------------------------------------- 09.1
def check_state_megabytes(state_megabytes) -> None:
    """``state_megabytes(num_params, kind="adam8bit", blocksize=256)`` -> MiB of optimizer state."""
    require_callable(state_megabytes, "state_megabytes")
    n_bert = DISTILBERT_NUM_PARAMS
    cases = [(n_bert, "adam8bit", 256), (n_bert, "adamw", 256), (n_bert, "adam8bit", 2048),
             (1000, "adam8bit", 256), (4096, "adam8bit", 64), (0, "adam8bit", 256), (100, "adam8bit", 256),
             (7_000_000_000, "adam8bit", 256), (7_000_000_000, "adamw", 256)]

    def want_of(n, kind, bs):
        return estimate_optimizer_memory(n, kind, blocksize=bs, min_8bit_size=0).megabytes  # all large

    def tags(n, kind, bs):
        return [f"with kind={kind!r}", f"with blocksize={bs}",
                "with a blocksize other than the default 256" if bs != 256 else "with blocksize 256",
                "smaller than one block" if 0 < n < bs else "of at least one block (or none)",
                "with num_params=0" if n == 0 else "with num_params > 0",
                "whose num_params is not a multiple of blocksize (a partial last block)" if n % bs else
                "whose num_params is a multiple of blocksize",
                "with billions of parameters" if n >= 10**9 else "with fewer than a billion parameters"]

    pattern = case_pattern([(tags(*c), matches(_quiet_call(state_megabytes, *c), want_of(*c), rtol=1e-9, atol=1e-9))
                            for c in cases])
    for n, kind, bs in cases:
        want = want_of(n, kind, bs)
        got = call(state_megabytes, n, kind, blocksize=bs)
        blocks = -(-n // bs)
        codes = 2 * n if kind == "adam8bit" else 8 * n
        absmax = 8 * blocks if kind == "adam8bit" else 0
        expect_close(got, want, what=f"state_megabytes({n:,}, {kind!r}, blocksize={bs})", rtol=1e-9, atol=1e-9,
                     context=pattern,
                     default="adamw: 8 bytes/param; adam8bit: 2 bytes/param + 2 fp32 absmax per block "
                             "(ceil(n / blocksize) blocks); MB = 2**20 bytes.",
                     variants=[
                         ("'MB' here is MiB (2**20 bytes), as in the chapter: divide by 2**20, not 10**6.",
                          lambda: (codes + absmax) / 1e6),
                         ("you divided by 2**30 (GiB): the result is in MiB, bytes / 2**20.",
                          lambda: (codes + absmax) / 2**30),
                         ("you returned bytes: return MiB, the bytes divided by 2**20.",
                          lambda: codes + absmax),
                         ("you forgot the absmax: 2 fp32 scales (8 bytes) per block of blocksize parameters.",
                          lambda: codes / MB),
                         ("the ragged tail is a block too, with a full absmax: a whole number of blocks, "
                          "ceil(n / blocksize) — not n // blocksize, nor the fraction n / blocksize.",
                          lambda: (codes + 8 * (n // bs)) / MB),
                         ("the ragged tail is a block too, with a full absmax: a whole number of blocks, "
                          "ceil(n / blocksize) — not n // blocksize, nor the fraction n / blocksize.",
                          lambda: (codes + (8 * n / bs if kind == "adam8bit" else 0)) / MB),
                         ("you counted ONE state: Adam keeps two (m and v), 2 bytes/param in 8-bit (one code each), "
                          "8 in fp32.", lambda: (codes + absmax) / 2 / MB),
                         ("you counted ONE state: Adam keeps two (m and v), so 2 bytes/param of codes in 8-bit.",
                          lambda: (codes / 2 + absmax) / MB),
                         ("you counted one absmax per block: there is one absmax per block for EACH of the two "
                          "states (8 bytes per block).",
                          lambda: (codes + absmax / 2) / MB),
                         ("kind='adamw' keeps fp32 m and v: 8 bytes per parameter, no codes and no absmax.",
                          lambda: (2 * n + 8 * blocks) / MB),
                     ])
    for bad in ("adam", "sgd", "Adam8bit"):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                got = state_megabytes(1000, bad, blocksize=256)
        except ValueError as exc:
            if bad in str(exc):
                continue
            fail(f"state_megabytes(1000, {bad!r}) raised ValueError({str(exc)!r}), which does not name the kind.",
                 hint=f"the task asks for an error that names the kind: put the refused kind ({bad!r} here) in the "
                      "message, and the kinds you accept, so the user sees what they typed.")
        except Exception as exc:  # noqa: BLE001 - the wrong kind of error
            fail(f"state_megabytes(1000, {bad!r}) raised {type(exc).__name__}: {exc}",
                 hint=f"an unknown kind should raise ValueError, not {type(exc).__name__}: `raise ValueError(...)` "
                      "naming the kind.")
        fail(f"state_megabytes(1000, {bad!r}) returned {got!r}; expected a ValueError for an unknown kind.",
             hint="your function treats an unknown kind as one of the two it knows (a silent fallback, e.g. an "
                  "`else:` branch that computes adam8bit's bytes): a typo then prints a plausible wrong number. "
                  "Check the kind and raise ValueError for anything else.")
    passed("Exercise 09.1 · The seed numbers")


# ---------------------------------------------------------------------------- 09.2
def _tensors_of(model, how: str):
    """Tensors as a learner might enumerate them: 'params' (right), 'state_dict' (buffers and tied names
    included), 'named_all' (every name of a tied tensor: named_parameters(remove_duplicate=False))."""
    if how == "state_dict":
        return list(model.state_dict().values())
    if how == "model_blocks":
        return list(model.parameters())
    if how == "named_all":
        return [p for _, p in model.named_parameters(remove_duplicate=False)]
    return list(model.parameters())


def _budget_variant(model, kind, bs, min_size, *, grads=True, itemsize=None, grad_itemsize=None, small_rule=True,
                    strict=False, absmax=True, state_itemsize=False, total_grads=True, unit=1, how="params"):
    params = _tensors_of(model, how)
    w = sum(p.numel() * (itemsize or p.element_size()) for p in params)
    g = sum(p.numel() * (grad_itemsize or itemsize or p.element_size()) for p in params) if grads else 0
    opt = 0
    for p in params:
        n = p.numel()
        big = kind == "adam8bit" and (not small_rule or (n > min_size if strict else n >= min_size))
        if big:
            opt += 2 * n + (8 * (-(-n // bs)) if absmax else 0)
        else:
            opt += 2 * n * (p.element_size() if state_itemsize else 4)
    if how == "model_blocks" and kind == "adam8bit":  # blocks counted over all 8-bit tensors together
        big = [p.numel() for p in params if not small_rule or (p.numel() > min_size if strict else p.numel() >= min_size)]
        opt += 8 * (-(-sum(big) // bs)) - sum(8 * (-(-n // bs)) for n in big)
    out = {"weights": w, "gradients": g, "optimizer": opt, "total": w + opt + (g if total_grads else 0)}
    return out if unit == 1 else {k: v / unit for k, v in out.items()}


def check_training_memory(training_memory) -> None:
    """``training_memory(model, optimizer, blocksize=256, min_8bit_size=4096)`` -> bytes per part."""
    require_callable(training_memory, "training_memory")
    cases = _drivers.budget_models()  # the check's copies; the driver builds the same ones for the learner's function
    bert = cases[1][1]
    n_bert = sum(p.numel() for p in bert.parameters())
    assert n_bert == DISTILBERT_NUM_PARAMS, n_bert  # the shapes above are DistilBERT's
    for index, (label, model, kind, bs, min_size) in enumerate(cases):
        want = _budget_variant(model, kind, bs, min_size)
        run = _as(training_memory, lambda *_, index=index, **__: _answer(
            drive(training_memory, _drivers.training_memory_run, index)))
        got = call(run, model, kind, blocksize=bs, min_8bit_size=min_size)
        what = f"training_memory({label}, {kind!r}, blocksize={bs}, min_8bit_size={min_size})"
        if not isinstance(got, dict):
            fail(f"{what} returned {type(got).__name__}, expected a dict.",
                 hint="return {'weights': ..., 'gradients': ..., 'optimizer': ..., 'total': ...} in bytes")
        expect_close(got, want, what=what, rtol=0, atol=0,
                     default="weights and gradients: numel * element_size of each parameter; optimizer: the "
                             "per-tensor state bytes of exercise 01.2; total: their sum (bytes, ints).",
                     variants=[
                         ("you left out the gradients: gradients take as much memory as the weights (one per "
                          "parameter, same dtype).",
                          lambda: _budget_variant(model, kind, bs, min_size, grads=False)),
                         ("you counted 4 bytes per element: use each parameter's element_size(): bf16/fp16 weights "
                          "and gradients take 2 bytes.",
                          lambda: _budget_variant(model, kind, bs, min_size, itemsize=4)),
                         ("you counted the gradients as fp32: gradients have the parameter's dtype (2 bytes each "
                          "for bf16/fp16 parameters).",
                          lambda: _budget_variant(model, kind, bs, min_size, grad_itemsize=4)),
                         ("you gave every tensor 8-bit states: the small-tensor rule keeps tensors under "
                          "min_8bit_size elements in fp32 (8 bytes/param).",
                          lambda: _budget_variant(model, kind, bs, min_size, small_rule=False)),
                         ("min_8bit_size is inclusive: a tensor with exactly min_8bit_size elements (4096 here) "
                          "gets 8-bit states (n >= min_8bit_size).",
                          lambda: _budget_variant(model, kind, bs, min_size, strict=True)),
                         ("you left out the absmax: each 8-bit tensor also stores 2 fp32 absmax per block "
                          "(8 bytes per block of blocksize elements).",
                          lambda: _budget_variant(model, kind, bs, min_size, absmax=False)),
                         ("Adam's fp32 states take 8 bytes per parameter whatever the parameter's dtype (m and v "
                          "are fp32 even for bf16 weights).",
                          lambda: _budget_variant(model, kind, bs, min_size, state_itemsize=True)),
                         ("the total is weights + gradients + optimizer: you left the gradients out of it.",
                          lambda: _budget_variant(model, kind, bs, min_size, total_grads=False)),
                         ("return BYTES as ints, not MiB: the caller divides by 2**20 when it prints.",
                          lambda: _budget_variant(model, kind, bs, min_size, unit=MB)),
                         ("you counted the model's buffers (state_dict() also holds BatchNorm's running statistics, "
                          "which are not trained: no gradient, no optimizer state) and a tied tensor once per name: "
                          "count the parameters, each tensor once (model.parameters() does both).",
                          lambda: _budget_variant(model, kind, bs, min_size, how="state_dict")),
                         ("you counted the blocks over the whole model (all 8-bit elements together): blocks "
                          "belong to ONE tensor each, so every 8-bit tensor has its own ceil(numel / blocksize) "
                          "blocks, its own partial last block included.",
                          lambda: _budget_variant(model, kind, bs, min_size, how="model_blocks")),
                         ("you counted the tied weight twice: the output layer and the embedding share ONE tensor "
                          "(one set of bytes, one gradient, one optimizer state); count each parameter tensor once, "
                          "as model.parameters() lists it.",
                          lambda: _budget_variant(model, kind, bs, min_size, how="named_all")),
                     ])
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in got.values()):
            fail(f"{what}: the values should be ints (bytes).", hint="count bytes with integer arithmetic")
    run = _as(training_memory, lambda *_: _answer(drive(training_memory, _drivers.training_memory_run, 1, defaults=True)))
    got = call(run, bert, "adam8bit")
    mib = got["optimizer"] / MB
    if not math.isclose(mib, _budget_variant(bert, "adam8bit", 256, 4096)["optimizer"] / MB):
        fail(f"training_memory(DistilBERT, 'adam8bit') with the defaults gives {mib:.1f} MiB of state.",
             hint="the defaults are blocksize=256 and min_8bit_size=4096, as in bitsandbytes.")
    passed("Exercise 09.2 · A full training memory budget")


# ---------------------------------------------------------------------------- 09.3
def _adamw_elements(model, *, steps=True, frozen=False, per_param_step=False, moments=2, size=None,
                    duplicates=False) -> int:
    every = [p for _, p in model.named_parameters(remove_duplicate=False)] if duplicates else model.parameters()
    params = [p for p in every if frozen or p.requires_grad]
    size = size or (lambda p: p.numel())
    return sum(moments * size(p) + ((size(p) if per_param_step else 1) if steps else 0) for p in params)


def check_adamw_state_elements(adamw_state_elements) -> None:
    """``adamw_state_elements(model)`` -> elements in torch AdamW's state after one step (the seed's 131,566,188)."""
    require_callable(adamw_state_elements, "adamw_state_elements")
    cases = _drivers.element_models()  # the check's copies; the driver builds the same ones for the learner's function
    for index, (label, model) in enumerate(cases):
        if label != "DistilBERT (meta tensors)":  # measure the truth on a real AdamW
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
            for p in model.parameters():
                if p.requires_grad:
                    p.grad = torch.ones_like(p)
            opt.step()
            truth = sum(v.numel() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
            assert truth == _adamw_elements(model), (label, truth)
        run = _as(adamw_state_elements, lambda *_, index=index: _answer(
            drive(adamw_state_elements, _drivers.state_elements_run, index)))
        got = call(run, model)
        expect_close(got, _adamw_elements(model), what=f"adamw_state_elements({label})", rtol=0, atol=0,
                     default="per trainable parameter tensor: exp_avg and exp_avg_sq (numel each) + one 1-element step tensor.",
                     variants=[
                         ("torch's AdamW also keeps a `step` counter per parameter tensor, as a 1-element tensor: "
                          "2 * numel + 1 per tensor (the seed's 131,566,188 = 2 * 65,783,042 + 104 tensors).",
                          lambda: _adamw_elements(model, steps=False)),
                         ("you counted frozen parameters: frozen parameters (requires_grad=False) get no gradient "
                          "and no state.",
                          lambda: _adamw_elements(model, frozen=True)),
                         ("you counted frozen parameters: frozen parameters (requires_grad=False) get no gradient "
                          "and no state.",
                          lambda: _adamw_elements(model, frozen=True, steps=False)),
                         ("the step counter is one element per tensor, not one per parameter.",
                          lambda: _adamw_elements(model, per_param_step=True)),
                         ("AdamW keeps two moment tensors per parameter, exp_avg (m) and exp_avg_sq (v): "
                          "2 * numel + 1 per tensor.",
                          lambda: _adamw_elements(model, moments=1)),
                         ("one step counter per parameter TENSOR (104 for DistilBERT), not one for the whole "
                          "optimizer.",
                          lambda: _adamw_elements(model, steps=False) + 1),
                         ("count elements, not bytes: the seed's number is numel() summed over the state tensors "
                          "(you multiplied by 4 bytes).",
                          lambda: 4 * _adamw_elements(model)),
                         ("numel() counts every element; len(p) is only the first dimension of p.",
                          lambda: _adamw_elements(model, size=len)),
                         ("you counted the tied weight twice: a tensor shared by two modules is ONE parameter, and "
                          "AdamW keeps one state for it (model.parameters() yields it once; "
                          "named_parameters(remove_duplicate=False) or a walk over the modules yields it twice).",
                          lambda: _adamw_elements(model, duplicates=True)),
                     ])
    passed("Exercise 09.3 · The seed's 131,566,188")


# ---------------------------------------------------------------------------- 09.4
def _seed_args(**overrides):
    from types import SimpleNamespace

    base = dict(learning_rate=3e-4, adam_beta1=0.85, adam_beta2=0.995, adam_epsilon=1e-7, weight_decay=0.05)
    return SimpleNamespace(**{**base, **overrides})


def check_seed_adam8bit(seed_adam8bit) -> None:
    """``seed_adam8bit(model, args)`` -> bitsandbytes' Adam8bit built exactly as the seed builds it."""
    require_callable(seed_adam8bit, "seed_adam8bit")
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        import bitsandbytes  # noqa: F401 - the driver builds the learner's optimizer with it
    model = _drivers.SeedTiny()  # the check's copy: the driver builds the same model for the learner's function
    names = dict(model.named_parameters())
    decay = {"emb.weight", "lin.weight", "head.weight"}
    args = _seed_args()
    run = _as(seed_adam8bit, lambda *_: drive(seed_adam8bit, _drivers.seed_optimizer_run, dict(vars(args))))
    try:
        opt = call(run, model, args)  # what the learner's optimizer is and which settings each parameter got
    except AssertionError as err:
        if "more than one parameter group" not in str(err):
            raise
        fail(str(err), "each parameter must be in exactly one group: build the no-decay list from the names NOT in "
                       "the decay list.")
    if not opt["adam8bit"]:
        kind = opt["type"]
        hint = "the seed builds bitsandbytes' optimizer: bnb.optim.Adam8bit(groups, betas=..., eps=..., lr=...)."
        if opt["adamw8bit"]:
            hint = ("you built bitsandbytes.optim.AdamW8bit: the seed builds bnb.optim.Adam8bit (whose decay comes "
                    "from the groups' weight_decay).")
        elif opt["torch"]:
            hint = (f"you built torch.optim.{opt['class']}: the seed's optimizer is bitsandbytes' 8-bit Adam, "
                    "bnb.optim.Adam8bit(groups, betas=..., eps=..., lr=...).")
        fail(f"seed_adam8bit returned a {kind}", hint)
    by_param = {name: groups[-1] for name, groups in opt["groups"].items()}  # as {id(p): group}: the last group wins
    if set(by_param) != set(names):
        missing = [n for n in names if n not in by_param]
        fail("the optimizer's groups do not hold every parameter exactly once",
             f"{', '.join(missing)} are in no group: the second group holds the biases and LayerNorm parameters, "
             "with weight_decay 0.0." if missing else "two groups: decay and no-decay.")
    wrong = {n for n in names if by_param[n]["weight_decay"] != (args.weight_decay if n in decay else 0.0)}
    if wrong and wrong == set(names) - decay:
        fail(f"{', '.join(sorted(wrong))} have weight_decay {args.weight_decay}, expected 0.0",
             "every parameter decays: biases and LayerNorm parameters need their own group with 'weight_decay': 0.0 "
             "(a weight_decay given to the optimizer applies to every group that does not set its own).")
    for name in names:
        g = by_param[name]
        want_wd = args.weight_decay if name in decay else 0.0
        if g["weight_decay"] != want_wd:
            if name in decay and g["weight_decay"] == 0.0:
                hint = "the decay group takes args.weight_decay (TrainingArguments' default is 0.0, so the check sets it)."
            elif name == "ln.weight":
                hint = ("ln.weight is a LayerNorm parameter: LayerNorm weights get no decay either. The seed finds "
                        "them by module type, get_parameter_names(model, [nn.LayerNorm]); the class name is not in "
                        "the parameter's name.")
            elif name.endswith("bias"):
                hint = f"{name} is a bias: biases get weight_decay 0.0 (drop names containing 'bias' from the decay list)."
            else:
                hint = ("weight decay (args.weight_decay) for weights outside LayerNorm; 0.0 for biases and LayerNorm "
                        "parameters (the seed's get_parameter_names(model, [nn.LayerNorm]) minus names with 'bias').")
            fail(f"{name} has weight_decay {g['weight_decay']}, expected {want_wd}", hint)
        for key, want, hint in [("lr", args.learning_rate, "lr=args.learning_rate"),
                                ("betas", (args.adam_beta1, args.adam_beta2), "betas=(args.adam_beta1, args.adam_beta2)"),
                                ("eps", args.adam_epsilon, "eps=args.adam_epsilon")]:
            if tuple(g[key]) != want if key == "betas" else g[key] != want:
                fail(f"{name}: {key} = {g[key]}, expected {want}", f"take the hyperparameters from TrainingArguments: {hint}.")
    passed("Exercise 09.4 · Adam8bit as the seed builds it")
