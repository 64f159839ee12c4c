"""Workbook 13 · one state, many optimizers: what learners plausibly write instead of the solution."""

from __future__ import annotations

import math

import torch

from adam8lib.course import checks
from adam8lib.formats import FORMATS
from adam8lib.quantized_state import QuantizedStateOptimizer
from adam8lib.rules.base import StateSpec, UpdateRule, check_beta, check_number
from tests.workbooks.wrong_answers import Right, Wrong


# ---------------------------------------------------------------------------------- 13.1
def lion_class(update, *, stored_as="m", check=None, defaults=(1e-4, (0.9, 0.99), 0.0), whole_states=False):
    """A learner's Lion8bit: the workbook's class around a rule whose ``update`` is ``update(p, g, m, group)``
    (``whole_states``: ``update(p, g, states, group)``, the dict itself)."""

    def default_check(self, group):
        check_number(group["lr"], "lr")
        check_number(group["weight_decay"], "weight_decay")
        for i, beta in enumerate(group["betas"]):
            check_beta(beta, f"betas[{i}]")

    rule_cls = type("LearnerLionRule", (UpdateRule,), {
        "name": "lion", "states": (StateSpec("exp_avg", stored_as),),
        "hyperparameters": {"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.0},
        "check": check or default_check,
        "update": lambda self, p, g, states, *, step, group: update(p, g, states if whole_states
                                                                     else states["exp_avg"], group),
    })
    lr0, betas0, wd0 = defaults

    class LearnerLion8bit(QuantizedStateOptimizer):
        rule = rule_cls()
        state_format = "8bit"

        def __init__(self, params, lr=lr0, betas=betas0, weight_decay=wd0, **kwargs):
            super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay), **kwargs)

    return LearnerLion8bit


def _hyper(group):
    beta1, beta2 = group["betas"]
    return beta1, beta2, group["lr"], group["weight_decay"]


def lion_right(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.mul_(1 - lr * wd)
    p.add_(torch.sign(beta1 * m + (1 - beta1) * g), alpha=-lr)
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    return p


def lion_minus_gradient(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.mul_(1 - lr * wd)
    p.sub_(lr * torch.sign(beta1 * m - (1 - beta1) * g))
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    return p


def lion_beta2_in_the_sign(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.mul_(1 - lr * wd)
    p.sub_(lr * torch.sign(beta2 * m + (1 - beta2) * g))
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    return p


def lion_state_with_beta1(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.mul_(1 - lr * wd)
    p.sub_(lr * torch.sign(beta1 * m + (1 - beta1) * g))
    m.mul_(beta1).add_(g, alpha=1 - beta1)
    return p


def lion_state_updated_first(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    p.mul_(1 - lr * wd)
    p.sub_(lr * torch.sign(beta1 * m + (1 - beta1) * g))
    return p


def lion_coupled_decay(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    g = g + wd * p
    p.sub_(lr * torch.sign(beta1 * m + (1 - beta1) * g))
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    return p


def lion_decay_without_lr(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.mul_(1 - wd)
    p.sub_(lr * torch.sign(beta1 * m + (1 - beta1) * g))
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    return p


def lion_decay_after_the_step(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.sub_(lr * torch.sign(beta1 * m + (1 - beta1) * g))
    p.mul_(1 - lr * wd)
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    return p


def lion_without_sign(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.mul_(1 - lr * wd)
    p.sub_(lr * (beta1 * m + (1 - beta1) * g))
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    return p


def lion_state_not_in_place(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.mul_(1 - lr * wd)
    p.sub_(lr * torch.sign(beta1 * m + (1 - beta1) * g))
    m = beta2 * m + (1 - beta2) * g  # a new tensor: the optimizer's state never sees it
    return p


def lion_state_rebound_in_the_dict(p, g, states, group):
    beta1, beta2, lr, wd = _hyper(group)
    m = states["exp_avg"]
    p.mul_(1 - lr * wd)
    p.add_(torch.sign(beta1 * m + (1 - beta1) * g), alpha=-lr)
    states["exp_avg"] = beta2 * m + (1 - beta2) * g  # a new tensor in the dict: an fp32 state keeps the old one
    return p


def lion_state_copied_and_put_in_the_dict(p, g, states, group):
    """Right: the new momentum copied into the tensor handed, and that value put in the dict as well."""
    beta1, beta2, lr, wd = _hyper(group)
    m = states["exp_avg"]
    p.mul_(1 - lr * wd)
    p.add_(torch.sign(beta1 * m + (1 - beta1) * g), alpha=-lr)
    new_m = beta2 * m + (1 - beta2) * g
    m.copy_(new_m)
    states["exp_avg"] = new_m
    return p


def lion_written_with_lerp(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    if wd:
        p.mul_(1 - lr * wd)
    p.sub_(lr * torch.lerp(g, m, beta1).sign())
    m.lerp_(g, 1 - beta2)
    return p


def lion_written_out(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    direction = torch.where(beta1 * m + (1 - beta1) * g > 0, 1.0, 0.0) - torch.where(
        beta1 * m + (1 - beta1) * g < 0, 1.0, 0.0)
    new_p = p * (1 - lr * wd) - lr * direction
    m.copy_(beta2 * m + (1 - beta2) * g)
    return new_p


def check_accepting_anything(self, group):
    pass


def lion_interpolation_in_m(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.mul_(1 - lr * wd)
    m.mul_(beta1).add_(g, alpha=1 - beta1)  # the interpolation written into the state
    p.add_(torch.sign(m), alpha=-lr)
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    return p


def lion_gradient_scaled_in_place(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.mul_(1 - lr * wd)
    g.mul_(1 - beta1)
    p.add_(torch.sign(beta1 * m + g), alpha=-lr)
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    return p


def lion_betas_swapped(p, g, m, group):
    beta2, beta1 = group["betas"]  # the pair read in the wrong order
    lr, wd = group["lr"], group["weight_decay"]
    p.mul_(1 - lr * wd)
    p.add_(torch.sign(beta1 * m + (1 - beta1) * g), alpha=-lr)
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    return p


def lion_gradient_scaled_in_the_ema(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.mul_(1 - lr * wd)
    p.add_(torch.sign(beta1 * m + (1 - beta1) * g), alpha=-lr)
    m.mul_(beta2).add_(g.mul_(1 - beta2))  # right numbers, but g is changed for whoever reads it next
    return p


def lion_interpolation_in_g(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.mul_(1 - lr * wd)
    p.add_(torch.sign(g.lerp_(m, beta1)), alpha=-lr)  # the interpolation written into the gradient
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    return p


def lion_sign_of_new_m(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.mul_(1 - lr * wd)
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    p.add_(torch.sign(m), alpha=-lr)
    return p


def lion_sign_of_old_m(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.mul_(1 - lr * wd)
    p.add_(torch.sign(m), alpha=-lr)
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    return p


def lion_sign_of_g(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.mul_(1 - lr * wd)
    p.add_(torch.sign(g), alpha=-lr)
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    return p


def bytes_threshold_inclusive(shape, stored_as, state_format):
    n = math.prod(shape)
    if state_format == "fp32" or n <= 4096:
        return 4 * n
    if state_format == "4bit":
        scales = sum(shape) if (stored_as == "v" and len(shape) >= 2) else -(-n // 128)
        return -(-n // 2) + 4 * scales
    return n + 4 * -(-n // 256)


def lion_paper_form(p, g, m, group):
    """The Lion paper's own form: the decay inside the update, update = sign(c) + wd * p; p -= lr * update."""
    beta1, beta2, lr, wd = _hyper(group)
    update = torch.sign(beta1 * m + (1 - beta1) * g) + wd * p
    p.sub_(lr * update)
    m.mul_(beta2).add_(g, alpha=1 - beta2)
    return p


def lion_without_return(p, g, m, group):
    beta1, beta2, lr, wd = _hyper(group)
    p.mul_(1 - lr * wd)
    p.add_(torch.sign(beta1 * m + (1 - beta1) * g), alpha=-lr)
    m.mul_(beta2).add_(g, alpha=1 - beta2)


def check_beta_up_to_one(self, group):
    check_number(group["lr"], "lr")
    check_number(group["weight_decay"], "weight_decay")
    for beta in group["betas"]:
        if not 0 <= beta <= 1:
            raise ValueError(f"each beta must be in [0, 1], got {beta}")


def check_refusing_lr_zero(self, group):
    check_number(group["lr"], "lr")
    if not group["lr"] > 0:
        raise ValueError(f"lr must be > 0, got {group['lr']}")
    check_number(group["weight_decay"], "weight_decay")
    for i, beta in enumerate(group["betas"]):
        check_beta(beta, f"betas[{i}]")


def check_letting_nan_through(self, group):
    for key in ("lr", "weight_decay"):
        if isinstance(group[key], bool) or not isinstance(group[key], (int, float)):
            raise TypeError(f"{key} must be a number")
        if group[key] < 0:
            raise ValueError(f"{key} must be >= 0, got {group[key]}")
    for i, beta in enumerate(group["betas"]):
        check_beta(beta, f"betas[{i}]")


def check_value_error_for_a_string(self, group):
    for key in ("lr", "weight_decay"):
        value = group[key]
        if not isinstance(value, (int, float)) or not value >= 0:  # a string refused, but as a ValueError
            raise ValueError(f"{key} must be a number >= 0, got {value!r}")
    for i, beta in enumerate(group["betas"]):
        check_beta(beta, f"betas[{i}]")


def check_naming_nothing(self, group):
    bad = not (group["lr"] >= 0 and group["weight_decay"] >= 0) or not all(0 <= b < 1 for b in group["betas"])
    if isinstance(group["lr"], str) or bad:
        raise ValueError("invalid hyper-parameter")


_CASE_131 = "13.1"
WRONG = [
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_minus_gradient),
          mistake="sign(beta1 * m - (1 - beta1) * g)", hint="a PLUS between the two terms", names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_beta2_in_the_sign),
          mistake="the update interpolates with beta2", hint="you interpolate with beta2", names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_state_with_beta1),
          mistake="the state is updated with beta1", hint="your state is updated with beta1", names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_state_updated_first),
          mistake="m updated before the sign is taken", hint="you update m before taking the sign",
          names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_coupled_decay),
          mistake="weight decay added to the gradient (coupled)", hint="your weight decay is coupled",
          names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_decay_without_lr),
          mistake="p *= 1 - weight_decay (bitsandbytes < 0.50's 8-bit decay)", hint="your decay is p * (1 - weight_decay)",
          names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_decay_after_the_step),
          mistake="decay after the step", hint="the decay order: decay the weight FIRST", names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_without_sign),
          mistake="steps by the interpolation, no sign", hint="your step is the interpolation itself",
          names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_right, stored_as="v"),
          mistake="the momentum declared stored_as='v' (unsigned map)", hint="your state is declared stored_as='v'",
          names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_state_not_in_place),
          mistake="m rebound to a new tensor instead of updated in place",
          hint="your momentum never changes", names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_right, check=check_accepting_anything),
          mistake="check(group) accepts a negative learning rate", hint="lr=-1e-3) was accepted", names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_interpolation_in_m),
          mistake="the interpolation computed in place on m", hint="you compute the interpolation in m itself",
          names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_gradient_scaled_in_place),
          mistake="g scaled in place by (1 - beta1)", hint="you scale the gradient in place", names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_without_return),
          mistake="update() without return p", hint="End update with `return p`", names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_right, check=check_beta_up_to_one),
          mistake="check(group) lets beta = 1.0 through", hint="beta = 1.0 means the EMA never moves", names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_right, check=check_refusing_lr_zero),
          mistake="check(group) refuses lr = 0", hint="lr = 0 is a valid setting", names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_right, check=check_letting_nan_through),
          mistake="check(group) written as lr < 0: NaN passes", hint="NaN passes a test written as", names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_state_rebound_in_the_dict, whole_states=True),
          mistake="states['exp_avg'] = a new tensor (the state rebound in the dict, not updated in place)",
          hint="keeps the tensor it handed your rule", names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_right, check=check_value_error_for_a_string),
          mistake="check(group) refuses a string lr with ValueError (the task asks for TypeError)",
          hint="a value of the wrong TYPE, which Python refuses with a TypeError", names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_right, check=check_naming_nothing),
          mistake="a refusal that names no argument", hint="does not name the argument", names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_right, defaults=(1e-3, (0.9, 0.999), 0.0)),
          mistake="Adam's defaults (lr 1e-3, betas (0.9, 0.999))", hint="Lion8bit's, bitsandbytes'", names_mistake=False),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_betas_swapped),
          mistake="beta2, beta1 = group['betas']: the betas swapped", hint="your two betas are swapped",
          names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_gradient_scaled_in_the_ema),
          mistake="g scaled in place inside the EMA (right numbers, g changed)", hint="you change the gradient in place",
          names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_interpolation_in_g),
          mistake="the interpolation written into g (g.lerp_)", hint="you change the gradient in place",
          names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_sign_of_new_m),
          mistake="sign(m) after the EMA in place of the interpolation", hint="the sign of the momentum after its update",
          names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_sign_of_old_m),
          mistake="sign(m) of the old momentum in place of the interpolation", hint="your parameters did not move",
          names_mistake=True),
    Wrong(_CASE_131, checks.check_lion8bit, lion_class(lion_sign_of_g),
          mistake="sign(g) alone (signSGD) in place of the interpolation", hint="follows the current gradient alone",
          names_mistake=True),
]
RIGHT = [
    Right(_CASE_131, checks.check_lion8bit, lion_class(lion_right), how="the workbook's solution, via a factory"),
    Right(_CASE_131, checks.check_lion8bit, lion_class(lion_written_with_lerp),
          how="torch.lerp for the interpolation and the EMA, decay skipped when weight_decay is 0"),
    Right(_CASE_131, checks.check_lion8bit, lion_class(lion_paper_form),
          how="the Lion paper's form: update = sign(c) + wd * p; p -= lr * update (another rounding order)"),
    Right(_CASE_131, checks.check_lion8bit, lion_class(lion_state_copied_and_put_in_the_dict, whole_states=True),
          how="the new momentum copied into the tensor handed (m.copy_) and put in the dict too"),
    Right(_CASE_131, checks.check_lion8bit, lion_class(lion_written_out),
          how="the sign written with torch.where, a new parameter tensor returned, m.copy_ of the EMA"),
]


# ---------------------------------------------------------------------------------- 13.2
def bytes_right(shape, stored_as, state_format):
    n = math.prod(shape)
    if state_format == "fp32" or n < 4096:
        return 4 * n
    if state_format == "4bit":
        scales = sum(shape) if (stored_as == "v" and len(shape) >= 2) else -(-n // 128)
        return -(-n // 2) + 4 * scales
    return n + 4 * -(-n // 256)


def bytes_rank1_only_for_matrices(shape, stored_as, state_format):
    n = math.prod(shape)
    if state_format == "fp32" or n < 4096:
        return 4 * n
    if state_format == "4bit":
        scales = sum(shape) if (stored_as == "v" and len(shape) == 2) else -(-n // 128)  # 3-D: blocks, wrongly
        return -(-n // 2) + 4 * scales
    return n + 4 * -(-n // 256)


def bytes_rank1_first_axis_and_the_rest(shape, stored_as, state_format):
    n = math.prod(shape)
    if state_format == "fp32" or n < 4096:
        return 4 * n
    if state_format == "4bit":
        # rows + columns, with the "columns" of a 3-D tensor taken as everything after the first axis
        scales = shape[0] + math.prod(shape[1:]) if (stored_as == "v" and len(shape) >= 2) else -(-n // 128)
        return -(-n // 2) + 4 * scales
    return n + 4 * -(-n // 256)


def bytes_without_min_size(shape, stored_as, state_format):
    n = math.prod(shape)
    if state_format == "fp32":
        return 4 * n
    if state_format == "4bit":
        scales = sum(shape) if (stored_as == "v" and len(shape) >= 2) else -(-n // 128)
        return -(-n // 2) + 4 * scales
    return n + 4 * -(-n // 256)


def bytes_without_scales(shape, stored_as, state_format):
    n = math.prod(shape)
    if state_format == "fp32" or n < 4096:
        return 4 * n
    return -(-n // 2) if state_format == "4bit" else n


def bytes_blocks_rounded_down(shape, stored_as, state_format):
    n = math.prod(shape)
    if state_format == "fp32" or n < 4096:
        return 4 * n
    if state_format == "4bit":
        scales = sum(shape) if (stored_as == "v" and len(shape) >= 2) else -(-n // 128)
        return -(-n // 2) + 4 * scales
    return n + 4 * (n // 256)


def bytes_four_bit_one_code_per_byte(shape, stored_as, state_format):
    n = math.prod(shape)
    if state_format == "fp32" or n < 4096:
        return 4 * n
    if state_format == "4bit":
        scales = sum(shape) if (stored_as == "v" and len(shape) >= 2) else -(-n // 128)
        return n + 4 * scales
    return n + 4 * -(-n // 256)


def bytes_no_rank1(shape, stored_as, state_format):
    n = math.prod(shape)
    if state_format == "fp32" or n < 4096:
        return 4 * n
    if state_format == "4bit":
        return -(-n // 2) + 4 * -(-n // 128)
    return n + 4 * -(-n // 256)


def bytes_absmax_one_byte(shape, stored_as, state_format):
    n = math.prod(shape)
    if state_format == "fp32" or n < 4096:
        return 4 * n
    if state_format == "4bit":
        scales = sum(shape) if (stored_as == "v" and len(shape) >= 2) else -(-n // 128)
        return -(-n // 2) + 4 * scales
    return n + -(-n // 256)


def bytes_fp8_two_bytes(shape, stored_as, state_format):
    n = math.prod(shape)
    if state_format == "fp32" or n < 4096:
        return 4 * n
    if state_format == "4bit":
        scales = sum(shape) if (stored_as == "v" and len(shape) >= 2) else -(-n // 128)
        return -(-n // 2) + 4 * scales
    return (2 if state_format == "fp8" else 1) * n + 4 * -(-n // 256)


def bytes_float_division(shape, stored_as, state_format):
    n = math.prod(shape)
    if state_format == "fp32" or n < 4096:
        return 4 * n
    if state_format == "4bit":
        scales = sum(shape) if (stored_as == "v" and len(shape) == 2) else n / 128
        return n / 2 + 4 * scales
    return n + 4 * n / 256


def bytes_with_numpy(shape, stored_as, state_format):
    import numpy as np

    n = int(np.prod(shape))
    if state_format == "fp32" or n < 4096:
        return 4 * n
    codes = (n + 1) // 2 if state_format == "4bit" else n
    if state_format == "4bit" and stored_as == "v" and len(shape) >= 2:
        return codes + 4 * int(np.sum(shape))
    block = 128 if state_format == "4bit" else 256
    return codes + 4 * int(np.ceil(n / block))


_CASE_132 = "13.2"
WRONG += [
    Wrong(_CASE_132, checks.check_state_bytes, bytes_threshold_inclusive,
          mistake="n <= 4096 kept in fp32", hint="4,096 elements is already quantized", names_mistake=True),
    Wrong(_CASE_132, checks.check_state_bytes, bytes_rank1_only_for_matrices,
          mistake="rank-1 scales only when len(shape) == 2 (a 3-D v gets blocks)",
          hint="every tensor of two or more dimensions", names_mistake=True),
    Wrong(_CASE_132, checks.check_state_bytes, bytes_rank1_first_axis_and_the_rest,
          mistake="rank-1 scales of a 3-D v counted as shape[0] + prod(shape[1:])",
          hint="as a matrix of its first axis by the rest flattened", names_mistake=True),
    Wrong(_CASE_132, checks.check_state_bytes, bytes_without_min_size, mistake="small tensors quantized too",
          hint="keeps its state in fp32 (4 bytes per element) in every format: min_8bit_size", names_mistake=True),
    Wrong(_CASE_132, checks.check_state_bytes, bytes_without_scales, mistake="codes only, no absmax",
          hint="you forgot the scales", names_mistake=True),
    Wrong(_CASE_132, checks.check_state_bytes, bytes_blocks_rounded_down, mistake="n // 256 blocks",
          hint="round the number of blocks UP", names_mistake=True),
    Wrong(_CASE_132, checks.check_state_bytes, bytes_four_bit_one_code_per_byte, mistake="4-bit: a byte per code",
          hint="4-bit codes are two per byte", names_mistake=True),
    Wrong(_CASE_132, checks.check_state_bytes, bytes_no_rank1, mistake="4-bit v of a matrix with block scales",
          hint="a matrix's 'v' state has rank-1 scales in 4 bits", names_mistake=True),
    Wrong(_CASE_132, checks.check_state_bytes, bytes_absmax_one_byte, mistake="an absmax counted as one byte",
          hint="an absmax is an fp32 number: 4 bytes per block", names_mistake=True),
    Wrong(_CASE_132, checks.check_state_bytes, bytes_fp8_two_bytes, mistake="FP8 codes counted as 2 bytes",
          hint="an FP8 (e4m3) code is one byte", names_mistake=True),
    Wrong(_CASE_132, checks.check_state_bytes, bytes_float_division, mistake="float division, no rounding",
          hint="bytes are a whole number", names_mistake=True),
]
RIGHT += [
    Right(_CASE_132, checks.check_state_bytes, bytes_right, how="ceil written as -(-n // k)"),
    Right(_CASE_132, checks.check_state_bytes, bytes_with_numpy, how="numpy's prod and ceil, (n + 1) // 2"),
]


# ---------------------------------------------------------------------------------- 13.3
def _stored(m, state_format, moment="m"):
    fmt = getattr(FORMATS[state_format], moment)
    shape = tuple(m.shape)
    return fmt.dequantize(*fmt.quantize(m.reshape(-1), shape), shape).view(shape)


def flips_right(m, g, beta1, state_format):
    fmt = FORMATS[state_format].m
    codes, scales = fmt.quantize(m.flatten(), m.shape)
    stored = fmt.dequantize(codes, scales, m.shape).reshape(m.shape)
    return (beta1 * stored + (1 - beta1) * g).sign().ne((beta1 * m + (1 - beta1) * g).sign())


def flips_sign_of_m(m, g, beta1, state_format):
    return torch.sign(_stored(m, state_format)) != torch.sign(m)


def flips_any_change(m, g, beta1, state_format):
    return _stored(m, state_format) != m


def flips_v_moment(m, g, beta1, state_format):
    stored = _stored(m, state_format, "v")
    return torch.sign(beta1 * stored + (1 - beta1) * g) != torch.sign(beta1 * m + (1 - beta1) * g)


def flips_swapped_weights(m, g, beta1, state_format):
    stored = _stored(m, state_format)
    return torch.sign((1 - beta1) * stored + beta1 * g) != torch.sign((1 - beta1) * m + beta1 * g)


def flips_inverted(m, g, beta1, state_format):
    stored = _stored(m, state_format)
    return torch.sign(beta1 * stored + (1 - beta1) * g) == torch.sign(beta1 * m + (1 - beta1) * g)


def flips_gradient_quantized(m, g, beta1, state_format):
    stored, g_stored = _stored(m, state_format), _stored(g, state_format)
    return torch.sign(beta1 * stored + (1 - beta1) * g_stored) != torch.sign(beta1 * m + (1 - beta1) * g)


def flips_share(m, g, beta1, state_format):
    stored = _stored(m, state_format)
    return (torch.sign(beta1 * stored + (1 - beta1) * g) != torch.sign(beta1 * m + (1 - beta1) * g)).float().mean()


def flips_as_integers(m, g, beta1, state_format):
    stored = _stored(m, state_format)
    return (torch.sign(beta1 * stored + (1 - beta1) * g) - torch.sign(beta1 * m + (1 - beta1) * g)).abs()


def flips_decoded_left_flat(m, g, beta1, state_format):
    fmt = FORMATS[state_format].m
    codes, scales = fmt.quantize(m, m.shape)  # a 2-D m handed to quantize
    stored = fmt.dequantize(codes, scales, m.shape)  # the decoded state comes back flat, not reshaped to m's
    return torch.sign(beta1 * stored + (1 - beta1) * g) != torch.sign(beta1 * m + (1 - beta1) * g)


def flips_beta1_hard_coded(m, g, beta1, state_format):
    stored = _stored(m, state_format)
    b = 0.99  # a fixed beta in place of the argument
    return torch.sign(b * stored + (1 - b) * g) != torch.sign(b * m + (1 - b) * g)


_CASE_133 = "13.3"
WRONG += [
    Wrong(_CASE_133, checks.check_lion_flips, flips_sign_of_m, mistake="compares sign(m) only",
          hint="you compared the signs of m alone", names_mistake=True),
    Wrong(_CASE_133, checks.check_lion_flips, flips_any_change, mistake="flags every changed m",
          hint="you flagged every entry whose stored m differs from m", names_mistake=True),
    Wrong(_CASE_133, checks.check_lion_flips, flips_v_moment, mistake="m stored with the 'v' moment format",
          hint="you stored m with the format's 'v' moment", names_mistake=True),
    Wrong(_CASE_133, checks.check_lion_flips, flips_swapped_weights, mistake="beta1 on g, 1 - beta1 on m",
          hint="the weights are swapped", names_mistake=True),
    Wrong(_CASE_133, checks.check_lion_flips, flips_inverted, mistake="== instead of !=",
          hint="the mask is inverted", names_mistake=True),
    Wrong(_CASE_133, checks.check_lion_flips, flips_gradient_quantized, mistake="the gradient quantized too",
          hint="you quantized the gradient too", names_mistake=True),
    Wrong(_CASE_133, checks.check_lion_flips, flips_share, mistake="returns the share, not the mask",
          hint="return the mask itself", names_mistake=True),
    Wrong(_CASE_133, checks.check_lion_flips, flips_as_integers, mistake="|difference of signs| (0, 1 or 2) as floats",
          hint="compare the two signs with != : that gives a bool tensor", names_mistake=False),
]
WRONG += [
    Wrong(_CASE_133, checks.check_lion_flips, flips_decoded_left_flat,
          mistake="the 2-D m handed to quantize, the decoded m left flat: quantize raises first",
          hint="quantize takes the values flat", names_mistake=True),
    Wrong(_CASE_133, checks.check_lion_flips, flips_beta1_hard_coded, mistake="beta1 hard-coded (0.99)",
          hint="your mask does not change with beta1", names_mistake=True),
]
RIGHT += [
    Right(_CASE_133, checks.check_lion_flips, flips_right, how="flatten/reshape, Tensor.ne, the shape as torch.Size"),
]


# ------------------------------------------------------------------ issue 51: what fresh cold learners wrote
def flips_small_m_uncoded(m, g, beta1, state_format):
    """Wrong: m under 4,096 elements left in fp32 (the optimizer's min_8bit_size carried over)."""
    stored = _stored(m, state_format) if m.numel() >= 4096 else m
    return torch.sign(beta1 * stored + (1 - beta1) * g) != torch.sign(beta1 * m + (1 - beta1) * g)


def flips_quantize_given_2d(m, g, beta1, state_format):
    """Wrong: the 2-D m handed to quantize (the decoded values reshaped to m's shape afterwards)."""
    fmt = FORMATS[state_format].m
    codes, scales = fmt.quantize(m, m.shape)
    stored = fmt.dequantize(codes, scales, m.shape).reshape(m.shape)
    return torch.sign(beta1 * stored + (1 - beta1) * g) != torch.sign(beta1 * m + (1 - beta1) * g)


def flips_decode_not_reshaped(m, g, beta1, state_format):
    """Wrong: m flattened for quantize, but the decoded values left flat."""
    fmt = FORMATS[state_format].m
    stored = fmt.dequantize(*fmt.quantize(m.reshape(-1), m.shape), m.shape).reshape(-1)
    return torch.sign(beta1 * stored + (1 - beta1) * g) != torch.sign(beta1 * m + (1 - beta1) * g)


def bytes_rank1_in_8bit_too(shape, stored_as, state_format):
    """Wrong: rank-1 scales for a 'v' of two or more dimensions in every quantized format, 8-bit and FP8 too."""
    n = math.prod(shape)
    if state_format == "fp32" or n < 4096:
        return 4 * n
    rank1 = stored_as == "v" and len(shape) >= 2
    if state_format == "4bit":
        return -(-n // 2) + 4 * (sum(shape) if rank1 else -(-n // 128))
    return n + 4 * (sum(shape) if rank1 else -(-n // 256))


def bytes_fp8_like_4bit(shape, stored_as, state_format):
    """Wrong: FP8 counted like 4-bit (two codes per byte)."""
    n = math.prod(shape)
    if state_format == "fp32" or n < 4096:
        return 4 * n
    if state_format in ("4bit", "fp8"):
        scales = sum(shape) if (stored_as == "v" and len(shape) >= 2) else -(-n // 128)
        return -(-n // 2) + 4 * scales
    return n + 4 * -(-n // 256)


WRONG_COLD_LEARNERS = [
    Wrong(_CASE_132, checks.check_state_bytes, bytes_rank1_in_8bit_too, mistake="rank-1 scales in 8-bit too",
          hint="you counted rank-1 scales (768 + 3072 = 3840); in 8bit every state has one fp32 absmax per block",
          names_mistake=True),
    Wrong(_CASE_132, checks.check_state_bytes, bytes_fp8_like_4bit, mistake="FP8 codes counted like 4-bit ones",
          hint="'fp8' codes take one byte each, not half", names_mistake=True),
    Wrong(_CASE_133, checks.check_lion_flips, flips_small_m_uncoded, mistake="m under 4,096 elements not coded",
          hint="code m whatever its size", names_mistake=True),
    Wrong(_CASE_133, checks.check_lion_flips, flips_quantize_given_2d, mistake="the 2-D m given to quantize",
          hint="quantize takes the values flat", names_mistake=True),
    Wrong(_CASE_133, checks.check_lion_flips, flips_decode_not_reshaped, mistake="m flattened for quantize, the "
          "decoded values left flat", hint="A decoded state comes back flat unless it is given m's shape",
          names_mistake=True),
]
WRONG += WRONG_COLD_LEARNERS

