"""Check cells of workbook 09 (ex09_memory_maths): pass on the solution, fail with a named hint on each plausible wrong answer."""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():  # before any @triton.jit below: Triton's interpreter on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from adam8lib.course import checks  # noqa: E402
from adam8lib.kernels.reference import adam8bit_step  # noqa: E402
from adam8lib.quant import dequantize_blocks, nearest_code, num_blocks  # noqa: E402

from tests._check_helpers import SOLUTIONS, fails_with, solution, stub  # noqa: E402,F401



# ------------------------------------------------------------------ 09 · memory maths
def make_megabytes(*, divisor=2**20, absmax=8, ceil=True):
    def state_megabytes(num_params, kind="adam8bit", blocksize=256):
        if kind == "adamw":
            return 8 * num_params / divisor
        blocks = -(-num_params // blocksize) if ceil else num_params // blocksize
        return (2 * num_params + absmax * blocks) / divisor

    return state_megabytes


@pytest.mark.parametrize("fn, hint", [
    (make_megabytes(divisor=1e6), "divide by 2**20, not 10**6"),
    (make_megabytes(absmax=0), "you forgot the absmax"),
    (make_megabytes(ceil=False), "the ragged tail is a block too"),
    (stub, "not implemented yet"),
])
def test_state_megabytes_fails(fn, hint):
    fails_with(checks.check_state_megabytes, fn, hint)


def make_budget(*, grads=True, itemsize=None, small_rule=True):
    def training_memory(model, optimizer="adamw", blocksize=256, min_8bit_size=4096):
        w = g = s = 0
        for p in model.parameters():
            n = p.numel()
            w += n * (itemsize or p.element_size())
            g += n * (itemsize or p.element_size()) if grads else 0
            big = n >= min_8bit_size or not small_rule
            s += 2 * n + 8 * (-(-n // blocksize)) if optimizer == "adam8bit" and big else 8 * n
        return {"weights": w, "gradients": g, "optimizer": s, "total": w + g + s}

    return training_memory


@pytest.mark.parametrize("fn, hint", [
    (make_budget(grads=False), "gradients take as much memory as the weights"),
    (make_budget(itemsize=4), "bf16/fp16 weights and gradients take 2 bytes"),
    (make_budget(small_rule=False), "small-tensor rule"),
    (stub, "not implemented yet"),
])
def test_training_memory_fails(fn, hint):
    fails_with(checks.check_training_memory, fn, hint)


def test_ex09_checks_pass_on_the_solution(capsys):
    checks.check_state_megabytes(solution("09", "state_megabytes"))
    checks.check_training_memory(solution("09", "training_memory"))
    assert capsys.readouterr().out.count("all checks passed") == 2


def test_distilbert_shapes_match_the_model():
    """The check's DistilBERT shapes are those of the transformers model (built on the meta device)."""
    from adam8lib.course.checks.ex09_memory_maths import distilbert_shapes
    from adam8lib.course.finetune import build_distilbert

    with torch.device("meta"):
        model = build_distilbert()
    assert sorted(tuple(p.shape) for p in model.parameters()) == sorted(distilbert_shapes())


# ------------------------------------------------------------------ 09.3 · the seed's 131,566,188
def test_adamw_state_elements_check_passes_the_solution():
    checks.check_adamw_state_elements(solution("09", "adamw_state_elements"))


@pytest.mark.parametrize("fn, hint", [
    (lambda m: sum(2 * p.numel() for p in m.parameters() if p.requires_grad), "keeps a `step` counter"),
    (lambda m: sum(2 * p.numel() + 1 for p in m.parameters()), "frozen parameters"),
    (lambda m: sum(3 * p.numel() for p in m.parameters() if p.requires_grad), "one element per tensor"),
    (lambda m: 2 * sum(p.numel() for p in m.parameters()), "keeps a `step` counter"),  # the first model has no frozen part
    (stub, "not implemented yet"),
])
def test_adamw_state_elements_check_names_the_mistake(fn, hint):
    fails_with(checks.check_adamw_state_elements, fn, hint)


# ------------------------------------------------------------------ 09.4 · Adam8bit as the seed builds it
def make_seed_adam8bit(*, betas=True, eps=True, lr=True, decay_all=False, wd=True, library=False):
    def seed_adam8bit(model, args):
        import bitsandbytes as bnb
        from torch import nn
        from transformers.trainer_pt_utils import get_parameter_names

        from adam8lib.optim import Adam8bit

        decay = [n for n in get_parameter_names(model, [nn.LayerNorm]) if decay_all or "bias" not in n]
        if decay_all:
            decay = [n for n, _ in model.named_parameters()]
        groups = [{"params": [p for n, p in model.named_parameters() if n in decay],
                   "weight_decay": args.weight_decay if wd else 0.0},
                  {"params": [p for n, p in model.named_parameters() if n not in decay], "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
        kw = dict(betas=(args.adam_beta1, args.adam_beta2) if betas else (0.9, 0.999),
                  eps=args.adam_epsilon if eps else 1e-8, lr=args.learning_rate if lr else 1e-3)
        return Adam8bit(groups, **kw) if library else bnb.optim.Adam8bit(groups, **kw)

    return seed_adam8bit


def test_seed_adam8bit_check_passes_the_solution_and_a_rewrite():
    checks.check_seed_adam8bit(solution("09", "seed_adam8bit"))
    checks.check_seed_adam8bit(make_seed_adam8bit())


@pytest.mark.parametrize("fn, hint", [
    (make_seed_adam8bit(betas=False), "betas=(args.adam_beta1, args.adam_beta2)"),
    (make_seed_adam8bit(eps=False), "eps=args.adam_epsilon"),
    (make_seed_adam8bit(lr=False), "lr=args.learning_rate"),
    (make_seed_adam8bit(decay_all=True), "every parameter decays"),
    (make_seed_adam8bit(wd=False), "TrainingArguments' default is 0.0"),
    (make_seed_adam8bit(library=True), "the seed builds bitsandbytes' optimizer"),
    (stub, "not implemented yet"),
])
def test_seed_adam8bit_check_names_the_mistake(fn, hint):
    fails_with(checks.check_seed_adam8bit, fn, hint)


def test_a_value_error_that_does_not_name_the_kind_is_refused():
    def state_megabytes(num_params, kind="adam8bit", blocksize=256):
        if kind == "adamw":
            return 8 * num_params / 2**20
        if kind == "adam8bit":
            return (2 * num_params + 8 * -(-num_params // blocksize)) / 2**20
        raise ValueError("unknown optimizer")

    fails_with(checks.check_state_megabytes, state_megabytes, "an error that names the kind")


def test_a_tied_weight_counted_twice_is_named():
    def adamw_state_elements(model):
        return sum(2 * p.numel() + 1 for _, p in model.named_parameters(remove_duplicate=False) if p.requires_grad)

    fails_with(checks.check_adamw_state_elements, adamw_state_elements, "you counted the tied weight twice")
