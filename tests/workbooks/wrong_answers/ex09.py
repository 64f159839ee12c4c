"""Workbook 09 · memory maths: what learners write instead of the solution."""

from __future__ import annotations

import math

import torch
from torch import nn

from adam8lib.course import checks
from tests.workbooks.wrong_answers import Right, Wrong

MB, BUDGET = checks.check_state_megabytes, checks.check_training_memory
ELEMENTS, SEED = checks.check_adamw_state_elements, checks.check_seed_adam8bit


# ------------------------------------------------------------------ 09.1 · the seed numbers
def make_megabytes(name, *, unit=2**20, code_bytes=2, adamw_bytes=8, absmax_bytes=8, blocks="ceil",
                   always_8bit=False):
    def state_megabytes(num_params, kind="adam8bit", blocksize=256):
        if kind == "adamw" and not always_8bit:
            return adamw_bytes * num_params / unit
        nb = {"ceil": -(-num_params // blocksize), "floor": num_params // blocksize,
              "float": num_params / blocksize}[blocks]
        nbytes = code_bytes * num_params + absmax_bytes * nb
        return nbytes if unit == 1 else nbytes / unit

    state_megabytes.__name__ = name
    return state_megabytes


def megabytes_with_math_ceil(num_params, kind="adam8bit", blocksize=256):
    """Right: math.ceil, per-state bytes summed, 1024 * 1024."""
    per_kind = {"adamw": lambda: 4 * num_params, "adam8bit": lambda: num_params + 4 * math.ceil(num_params / blocksize)}
    if kind not in per_kind:
        raise ValueError(f"kind must be one of {sorted(per_kind)}, got {kind!r}")
    per_state = per_kind[kind]()
    return 2 * per_state / (1024 * 1024)


# ------------------------------------------------------------------ 09.2 · the training budget
def make_budget(name, *, grads=True, weight_size=None, grad_size=None, small_rule=True, strict=False, absmax=True,
                state_in_param_dtype=False, total_without_grads=False, unit=1, tensors="parameters"):
    def training_memory(model, optimizer="adamw", blocksize=256, min_8bit_size=4096):
        w = g = s = 0
        listed = {"parameters": lambda: model.parameters(), "state_dict": lambda: model.state_dict().values(),
                  "named_all": lambda: (p for _, p in model.named_parameters(remove_duplicate=False))}[tensors]()
        for p in listed:
            n = p.numel()
            w += n * (weight_size or p.element_size())
            g += n * (grad_size or p.element_size()) if grads else 0
            big = (n > min_8bit_size if strict else n >= min_8bit_size) or not small_rule
            if optimizer == "adam8bit" and big:
                s += 2 * n + (8 * (-(-n // blocksize)) if absmax else 0)
            else:
                s += 2 * n * (p.element_size() if state_in_param_dtype else 4)
        total = w + s + (0 if total_without_grads else g)
        if unit != 1:
            return {"weights": w / unit, "gradients": g / unit, "optimizer": s / unit, "total": total / unit}
        return {"weights": w, "gradients": g, "optimizer": s, "total": total}

    training_memory.__name__ = name
    return training_memory


def budget_model_blocks(model, optimizer="adamw", blocksize=256, min_8bit_size=4096):
    """Blocks counted over all the 8-bit elements of the model together, not per tensor."""
    params = list(model.parameters())
    w = sum(p.numel() * p.element_size() for p in params)
    big = [p.numel() for p in params if optimizer == "adam8bit" and p.numel() >= min_8bit_size]
    small = [p.numel() for p in params if not (optimizer == "adam8bit" and p.numel() >= min_8bit_size)]
    s = 2 * sum(big) + 8 * (-(-sum(big) // blocksize)) + 8 * sum(small)
    return {"weights": w, "gradients": w, "optimizer": s, "total": 2 * w + s}


def budget_from_state_spec(model, optimizer="adamw", blocksize=256, min_8bit_size=4096):
    """Right: weights counted once and doubled for gradients, the state with a generator and integer maths."""
    params = list(model.parameters())
    weights = sum(p.nelement() * p.element_size() for p in params)

    def state(n):
        if optimizer == "adam8bit" and n >= min_8bit_size:
            return 2 * (n + 4 * ((n + blocksize - 1) // blocksize))
        return 8 * n

    opt = sum(state(p.numel()) for p in params)
    return {"weights": weights, "gradients": weights, "optimizer": opt, "total": 2 * weights + opt}


# ------------------------------------------------------------------ 09.3 · the seed's 131,566,188
def elements_without_step(model):
    return sum(2 * p.numel() for p in model.parameters() if p.requires_grad)


def elements_with_frozen(model):
    return sum(2 * p.numel() + 1 for p in model.parameters())


def elements_step_per_element(model):
    return sum(3 * p.numel() for p in model.parameters() if p.requires_grad)


def elements_one_moment(model):
    return sum(p.numel() + 1 for p in model.parameters() if p.requires_grad)


def elements_one_step_in_all(model):
    return 2 * sum(p.numel() for p in model.parameters() if p.requires_grad) + 1


def elements_in_bytes(model):
    return sum((2 * p.numel() + 1) * 4 for p in model.parameters() if p.requires_grad)


def elements_with_len(model):
    return sum(2 * len(p) + 1 for p in model.parameters() if p.requires_grad)


def adamw_elements_via_named_parameters(model):
    """Right: named_parameters, numel * 2 + 1 written as a comprehension over a filtered list."""
    trainable = [p for _, p in model.named_parameters() if p.requires_grad]
    return sum(p.numel() * 2 for p in trainable) + len(trainable)


# ------------------------------------------------------------------ 09.4 · Adam8bit as the seed builds it
def make_seed(name, *, decay_rule="seed", wd=True, betas=True, eps=True, lr=True, builder="bnb.Adam8bit",
              groups_wd="explicit", groups="both"):
    """The solution with one slip. decay_rule: "seed" (right), "all", "bias_only" (LayerNorm weight decays),
    "layernorm_only" (biases decay), "name_has_layernorm" (looks for "LayerNorm" in the names)."""

    def seed_adam8bit(model, args):
        import bitsandbytes as bnb
        from transformers.trainer_pt_utils import get_parameter_names

        named = list(model.named_parameters())
        if decay_rule == "seed":
            decay = [n for n in get_parameter_names(model, [nn.LayerNorm]) if "bias" not in n]
        elif decay_rule == "all":
            decay = [n for n, _ in named]
        elif decay_rule == "bias_only":
            decay = [n for n, _ in named if "bias" not in n]
        elif decay_rule == "layernorm_only":
            decay = get_parameter_names(model, [nn.LayerNorm])
        else:  # "name_has_layernorm"
            decay = [n for n, _ in named if "bias" not in n and "LayerNorm" not in n]
        first = {"params": [p for n, p in named if n in decay]}
        second = {"params": [p for n, p in named if n not in decay] if groups != "duplicate" else [p for _, p in named]}
        extra = {}
        if groups_wd == "explicit":
            first["weight_decay"] = args.weight_decay if wd else 0.0
            second["weight_decay"] = 0.0
        else:  # one weight_decay for the whole optimizer
            extra["weight_decay"] = args.weight_decay
        param_groups = [g for g in ([first, second] if groups != "decay_only" else [first]) if g["params"]]
        kw = dict(betas=(args.adam_beta1, args.adam_beta2) if betas else (0.9, 0.999),
                  eps=args.adam_epsilon if eps else 1e-8, lr=args.learning_rate if lr else 1e-3, **extra)
        cls = {"bnb.Adam8bit": bnb.optim.Adam8bit, "bnb.AdamW8bit": bnb.optim.AdamW8bit,
               "torch.AdamW": torch.optim.AdamW}.get(builder)
        if cls is None:  # the course's own optimizer
            from adam8lib.optim import Adam8bit as cls
        return cls(param_groups, **kw)

    seed_adam8bit.__name__ = name
    return seed_adam8bit


def seed_by_module_walk(model, args):
    """Right: LayerNorm parameters found by walking the modules, groups built from id()s."""
    import bitsandbytes as bnb

    no_decay = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    no_decay |= {id(p) for n, p in model.named_parameters() if n.endswith("bias")}
    params = list(model.parameters())
    return bnb.optim.Adam8bit(
        [{"params": [p for p in params if id(p) not in no_decay], "weight_decay": args.weight_decay},
         {"params": [p for p in params if id(p) in no_decay], "weight_decay": 0.0}],
        lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)


WRONG = [
    Wrong("09.1", MB, make_megabytes("silent_fallback"), "no ValueError: any kind but 'adamw' counted as adam8bit",
          "your function treats an unknown kind as one of the two it knows", True),
    Wrong("09.1", MB, make_megabytes("decimal_megabytes", unit=1e6), "MB = 10**6 bytes instead of MiB",
          "divide by 2**20, not 10**6", True),
    Wrong("09.1", MB, make_megabytes("gibibytes", unit=2**30), "divided by 2**30 (GiB)", "you divided by 2**30",
          True),
    Wrong("09.1", MB, make_megabytes("bytes", unit=1), "bytes returned, not MiB", "you returned bytes", True),
    Wrong("09.1", MB, make_megabytes("no_absmax", absmax_bytes=0), "absmax bytes forgotten", "you forgot the absmax",
          True),
    Wrong("09.1", MB, make_megabytes("floor_blocks", blocks="floor"), "n // blocksize blocks",
          "the ragged tail is a block too", True),
    Wrong("09.1", MB, make_megabytes("fractional_blocks", blocks="float"), "n / blocksize blocks (not an integer)",
          "a whole number of blocks", True),
    Wrong("09.1", MB, make_megabytes("one_state_8bit", code_bytes=1), "1 byte per parameter (one state)",
          "you counted ONE state", True),
    Wrong("09.1", MB, make_megabytes("one_state_adamw", adamw_bytes=4), "adamw: 4 bytes per parameter (one state)",
          "you counted ONE state", True),
    Wrong("09.1", MB, make_megabytes("one_absmax", absmax_bytes=4), "one fp32 absmax per block for both states",
          "you counted one absmax per block", True),
    Wrong("09.1", MB, make_megabytes("kind_ignored", always_8bit=True), "kind ignored: adamw counted as 8-bit",
          "kind='adamw' keeps fp32 m and v", True),
    Wrong("09.2", BUDGET, make_budget("no_gradients", grads=False), "gradients not counted",
          "you left out the gradients", True),
    Wrong("09.2", BUDGET, make_budget("four_bytes_always", weight_size=4, grad_size=4), "4 bytes per weight whatever "
          "the dtype", "you counted 4 bytes per element", True),
    Wrong("09.2", BUDGET, make_budget("fp32_gradients", grad_size=4), "gradients always fp32",
          "gradients have the parameter's dtype", True),
    Wrong("09.2", BUDGET, make_budget("no_small_rule", small_rule=False), "every tensor 8-bit",
          "you gave every tensor 8-bit states", True),
    Wrong("09.2", BUDGET, make_budget("strict_threshold", strict=True), "n > min_8bit_size",
          "min_8bit_size is inclusive", True),
    Wrong("09.2", BUDGET, make_budget("no_absmax", absmax=False), "8-bit state without the absmax bytes",
          "you left out the absmax", True),
    Wrong("09.2", BUDGET, make_budget("state_in_param_dtype", state_in_param_dtype=True), "fp32 states sized by the "
          "parameter's dtype", "Adam's fp32 states take 8 bytes per parameter whatever", True),
    Wrong("09.2", BUDGET, make_budget("total_without_gradients", total_without_grads=True), "total leaves out the "
          "gradients", "the total is weights + gradients + optimizer", True),
    Wrong("09.2", BUDGET, budget_model_blocks, "blocks counted over the whole model, not per tensor",
          "you counted the blocks over the whole model", True),
    Wrong("09.2", BUDGET, make_budget("state_dict", tensors="state_dict"), "iterates model.state_dict(): buffers and "
          "tied weights counted", "you counted the model's buffers", True),
    Wrong("09.2", BUDGET, make_budget("tied_twice", tensors="named_all"), "a tied weight counted once per name",
          "you counted the tied weight twice", True),
    Wrong("09.2", BUDGET, make_budget("mebibytes", unit=2**20), "MiB floats instead of bytes",
          "return BYTES as ints", True),
    Wrong("09.3", ELEMENTS, elements_without_step,
          "no step counter", "keeps a `step` counter", True),
    Wrong("09.3", ELEMENTS, elements_with_frozen, "frozen parameters counted",
          "you counted frozen parameters", True),
    Wrong("09.3", ELEMENTS, elements_step_per_element,
          "one step per element", "one element per tensor", True),
    Wrong("09.3", ELEMENTS, elements_one_moment,
          "one moment tensor only", "two moment tensors", True),
    Wrong("09.3", ELEMENTS, elements_one_step_in_all,
          "one step counter for the whole optimizer", "one step counter per parameter TENSOR", True),
    Wrong("09.3", ELEMENTS, elements_in_bytes,
          "bytes instead of elements", "count elements, not bytes", True),
    Wrong("09.3", ELEMENTS, elements_with_len,
          "len(p) instead of numel()", "len(p) is only the first dimension", True),
    Wrong("09.4", SEED, make_seed("default_betas", betas=False), "betas left at the default",
          "betas=(args.adam_beta1, args.adam_beta2)", True),
    Wrong("09.4", SEED, make_seed("default_eps", eps=False), "eps left at the default", "eps=args.adam_epsilon", True),
    Wrong("09.4", SEED, make_seed("default_lr", lr=False), "lr left at the default", "lr=args.learning_rate", True),
    Wrong("09.4", SEED, make_seed("decay_everything", decay_rule="all"), "every parameter decays",
          "every parameter decays", True),
    Wrong("09.4", SEED, make_seed("layernorm_weight_decays", decay_rule="bias_only"), "only biases excluded",
          "is a LayerNorm parameter", True),
    Wrong("09.4", SEED, make_seed("bias_decays", decay_rule="layernorm_only"), "biases not excluded",
          "is a bias", True),
    Wrong("09.4", SEED, make_seed("layernorm_by_name", decay_rule="name_has_layernorm"), "LayerNorm looked for by "
          "name", "is a LayerNorm parameter", True),
    Wrong("09.4", SEED, make_seed("zero_decay", wd=False), "decay group with weight_decay 0.0",
          "TrainingArguments' default is 0.0", True),
    Wrong("09.4", SEED, make_seed("global_weight_decay", groups_wd="global"), "weight_decay given once for all "
          "groups", "every parameter decays", True),
    Wrong("09.4", SEED, make_seed("adamw8bit", builder="bnb.AdamW8bit"), "bnb.optim.AdamW8bit",
          "you built bitsandbytes.optim.AdamW8bit", True),
    Wrong("09.4", SEED, make_seed("torch_adamw", builder="torch.AdamW"), "torch.optim.AdamW", "you built torch.optim",
          True),
    Wrong("09.4", SEED, make_seed("course_adam8bit", builder="adam8lib"), "adam8lib's Adam8bit",
          "the seed builds bitsandbytes' optimizer", True),
    Wrong("09.4", SEED, make_seed("parameter_twice", groups="duplicate"), "second group holds every parameter",
          "in exactly one group", True),
    Wrong("09.4", SEED, make_seed("decay_group_only", groups="decay_only"), "the no-decay group left out",
          "are in no group", True),
]

RIGHT = [
    Right("09.1", MB, megabytes_with_math_ceil, "math.ceil, per-state bytes doubled, 1024 * 1024"),
    Right("09.2", BUDGET, budget_from_state_spec, "gradients = weights, integer ceil, total = 2 w + state"),
    Right("09.3", ELEMENTS, adamw_elements_via_named_parameters, "numel * 2 summed + number of trainable tensors"),
    Right("09.4", SEED, seed_by_module_walk, "LayerNorm parameters found by walking modules, groups by id()"),
]


# ---------------------------------------------------------------- mistakes named by a PROPERTY of the result
def _megabytes(*, adamw=8, unit=2**20, fixed_blocksize=None, min_blocks=0, integer=False):
    def state_megabytes(num_params, kind="adam8bit", blocksize=256):
        bs = fixed_blocksize or blocksize
        total = adamw * num_params if kind == "adamw" else 2 * num_params + 8 * max(min_blocks, -(-num_params // bs))
        return total // unit if integer else total / unit

    return state_megabytes


WRONG += [
    Wrong("09.1", MB, _megabytes(unit=1024), "bytes / 1024 (KiB, not MiB)", "1024 times", True),
    Wrong("09.1", MB, _megabytes(adamw=12), "AdamW counted with 12 bytes per parameter",
          "wrong exactly on the 2 with kind='adamw'", True),
    Wrong("09.1", MB, _megabytes(min_blocks=1), "at least one block, even for 0 parameters",
          "wrong exactly on the 1 with num_params=0", True),
    Wrong("09.1", MB, _megabytes(fixed_blocksize=256), "blocksize argument ignored (always 256)",
          "with a blocksize other than the default 256", True),
    Wrong("09.1", MB, _megabytes(integer=True), "bytes // 2**20 (integer division)", "rounded to a whole number", True),
]
