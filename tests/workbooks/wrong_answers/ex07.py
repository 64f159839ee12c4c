"""Workbook 07 · the 8-bit Adam step, the optimizer, the stable embedding, training: what learners write."""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from adam8lib.adam import adam_step
from adam8lib.course import checks
from adam8lib.course.checks.ex07_adam8bit_step import mlp_task
from adam8lib.kernels.reference import adam8bit_step as reference_step
from adam8lib.quant import dequantize_blocks, dynamic_map, nearest_code, quantize_blocks
from tests.workbooks.wrong_answers import Right, Wrong

STEP, OPT = checks.check_adam8bit_step, checks.check_adam8bit_optimizer
EMB, TRAIN = checks.check_stable_embedding, checks.check_trains_like_adam


# ------------------------------------------------------------------ 07.1 · the 8-bit step
def _requantize_with(x, qmap, blocksize, absmax):
    """Codes of x normalised by a given absmax per block (keep_sign), e.g. the OLD one."""
    n = x.numel()
    scale = torch.where(absmax > 0, absmax, torch.ones_like(absmax)).repeat_interleave(blocksize)[:n]
    return nearest_code(x / scale, qmap, keep_sign=True)


def make_step(name, *, sign_m=True, sign_v=True, bias=True, step_offset=0, sqrt_c2=True, eps_inside=False,
              l2=False, decay_lr=True, old_absmax=False, swap_maps=False, v_signed_map=False, nan_rule=True,
              square=True, sign=1.0, update_with="new", param_dtype_math=False,
              nan_decays=False, decay_after=False):
    """The solution's step with one slip, as a learner would write it."""

    @torch.no_grad()
    def adam8bit_step(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, *, step, lr, beta1, beta2, eps,
                      weight_decay, blocksize):
        map_m, map_v = (qmap2, qmap1) if swap_maps else (qmap1, qmap1 if v_signed_map else qmap2)
        m = dequantize_blocks(state1, absmax1, map_m, blocksize)
        v = dequantize_blocks(state2, absmax2, map_v, blocksize)
        m_before, v_before = m, v
        grad = g.float()
        param = p.float()
        if param_dtype_math:  # the update done in p's own (16-bit) dtype
            param = p.clone()
        if l2:
            grad = grad + weight_decay * param  # Adam's L2 decay, through the gradient
        finite = torch.isfinite(grad)
        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * (grad * grad if square else grad)
        if nan_rule:
            m, v = torch.where(finite, m, 0.0), torch.where(finite, v, 0.0)
        new = param if l2 else param * (1 - (lr if decay_lr else 1.0) * weight_decay)
        t = step + step_offset
        c1 = 1 - beta1**t if bias else 1.0
        c2 = (math.sqrt(1 - beta2**t) if sqrt_c2 else 1 - beta2**t) if bias else 1.0
        if update_with == "stored":  # requantize first, then read the states back for the update
            state1[:], absmax1[:] = quantize_blocks(m, map_m, blocksize, keep_sign=sign_m)
            state2[:], absmax2[:] = quantize_blocks(v, map_v, blocksize, keep_sign=sign_v)
            m = dequantize_blocks(state1, absmax1, map_m, blocksize)
            v = dequantize_blocks(state2, absmax2, map_v, blocksize)
        mu, vu = (m_before, v_before) if update_with == "old" else (m, v)
        denom = (vu / c2**2 + eps).sqrt() if eps_inside else vu.sqrt() / c2 + eps
        if decay_after:  # bitsandbytes' CUDA kernel's order: (p - update) * (1 - lr * weight_decay)
            new = (param - (sign * lr / c1 * mu / denom).to(param.dtype)) * (1 - lr * weight_decay)
        else:
            new = new - (sign * lr / c1 * mu / denom).to(new.dtype)
        kept = param * (1 - lr * weight_decay) if nan_decays else param  # nan_decays: the skipped element still decays
        p.copy_(torch.where(finite, new, kept) if nan_rule else new)
        if update_with == "stored":
            return
        if old_absmax:
            state1[:] = _requantize_with(m, map_m, blocksize, absmax1)
            state2[:] = _requantize_with(v, map_v, blocksize, absmax2)
        else:
            state1[:], absmax1[:] = quantize_blocks(m, map_m, blocksize, keep_sign=sign_m)
            state2[:], absmax2[:] = quantize_blocks(v, map_v, blocksize, keep_sign=sign_v)

    adam8bit_step.__name__ = name
    return adam8bit_step


@torch.no_grad()
def rebinds_p(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, *, step, lr, beta1, beta2, eps,
              weight_decay, blocksize):
    """States written in place, but `p = ...` only rebinds the name: the caller's parameter never moves."""
    m = dequantize_blocks(state1, absmax1, qmap1, blocksize)
    v = dequantize_blocks(state2, absmax2, qmap2, blocksize)
    grad = g.float()
    finite = torch.isfinite(grad)
    m = torch.where(finite, beta1 * m + (1 - beta1) * grad, 0.0)
    v = torch.where(finite, beta2 * v + (1 - beta2) * grad * grad, 0.0)
    new = p.float() * (1 - lr * weight_decay)
    new = new - lr / (1 - beta1**step) * m / (v.sqrt() / math.sqrt(1 - beta2**step) + eps)
    p = torch.where(finite, new, p.float()).to(p.dtype)  # noqa: F841 - the slip
    state1[:], absmax1[:] = quantize_blocks(m, qmap1, blocksize, keep_sign=True)
    state2[:], absmax2[:] = quantize_blocks(v, qmap2, blocksize, keep_sign=True)


@torch.no_grad()
def rebinds_states(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, *, step, lr, beta1, beta2, eps,
                   weight_decay, blocksize):
    """A cold learner's 07.1: p written in place, but `state1 = c1; absmax1 = a1` only rebinds the names: the
    caller's state tensors never change."""
    m = dequantize_blocks(state1, absmax1, qmap1, blocksize)
    v = dequantize_blocks(state2, absmax2, qmap2, blocksize)
    grad, param = g.float(), p.float()
    finite = torch.isfinite(grad)
    m = torch.where(finite, beta1 * m + (1 - beta1) * grad, 0.0)
    v = torch.where(finite, beta2 * v + (1 - beta2) * grad * grad, 0.0)
    new = param * (1 - lr * weight_decay) - lr / (1 - beta1**step) * m / (v.sqrt() / math.sqrt(1 - beta2**step) + eps)
    p.copy_(torch.where(finite, new, param))
    c1, a1 = quantize_blocks(m, qmap1, blocksize, keep_sign=True)
    c2, a2 = quantize_blocks(v, qmap2, blocksize, keep_sign=True)
    state1, absmax1, state2, absmax2 = c1, a1, c2, a2  # noqa: F841 - the slip


@torch.no_grad()
def rebinds_absmax(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, *, step, lr, beta1, beta2, eps,
                   weight_decay, blocksize):
    """The codes written in place, the absmax only rebound (`absmax1 = a1`)."""
    m = dequantize_blocks(state1, absmax1, qmap1, blocksize)
    v = dequantize_blocks(state2, absmax2, qmap2, blocksize)
    grad, param = g.float(), p.float()
    finite = torch.isfinite(grad)
    m = torch.where(finite, beta1 * m + (1 - beta1) * grad, 0.0)
    v = torch.where(finite, beta2 * v + (1 - beta2) * grad * grad, 0.0)
    new = param * (1 - lr * weight_decay) - lr / (1 - beta1**step) * m / (v.sqrt() / math.sqrt(1 - beta2**step) + eps)
    p.copy_(torch.where(finite, new, param))
    state1[:], absmax1 = quantize_blocks(m, qmap1, blocksize, keep_sign=True)
    state2[:], absmax2 = quantize_blocks(v, qmap2, blocksize, keep_sign=True)


def step_in_low_precision(name, *, moments_too):
    """A cold learner's 07.1 for 16-bit parameters: no upcast to fp32 — the gradient and the parameter used in their
    own dtype; with ``moments_too`` the dequantized m and v cast to it as well (every product rounded to 16 bits)."""

    @torch.no_grad()
    def adam8bit_step(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, *, step, lr, beta1, beta2, eps,
                      weight_decay, blocksize):
        m = dequantize_blocks(state1, absmax1, qmap1, blocksize)
        v = dequantize_blocks(state2, absmax2, qmap2, blocksize)
        if moments_too:
            m, v = m.to(p.dtype), v.to(p.dtype)
        finite = torch.isfinite(g)
        m = torch.where(finite, beta1 * m + (1 - beta1) * g, 0.0)
        v = torch.where(finite, beta2 * v + (1 - beta2) * g * g, 0.0)
        new = p * (1 - lr * weight_decay) - lr / (1 - beta1**step) * m / (v.sqrt() / math.sqrt(1 - beta2**step) + eps)
        p.copy_(torch.where(finite, new, p))
        state1[:], absmax1[:] = quantize_blocks(m.float(), qmap1, blocksize, keep_sign=True)
        state2[:], absmax2[:] = quantize_blocks(v.float(), qmap2, blocksize, keep_sign=True)

    adam8bit_step.__name__ = name
    return adam8bit_step


@torch.no_grad()
def returns_new_tensors(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, **hp):
    """Everything computed right, returned as new tensors; nothing written into the arguments."""
    p2, s1, s2, a1, a2 = p.clone(), state1.clone(), state2.clone(), absmax1.clone(), absmax2.clone()
    reference_step(p2, g, s1, s2, a1, a2, qmap1, qmap2, **hp)
    return p2, s1, s2, a1, a2


@torch.no_grad()
def step_with_lerp_and_masked_fill(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, *, step, lr, beta1,
                                   beta2, eps, weight_decay, blocksize):
    """Right: torch.lerp / addcmul for the moments, masked_fill for the NaN rule, bias correction folded
    into the step size, in-place ops on p."""
    m = dequantize_blocks(state1, absmax1, qmap1, blocksize)
    v = dequantize_blocks(state2, absmax2, qmap2, blocksize)
    grad = g.float()
    bad = ~torch.isfinite(grad)
    grad = grad.masked_fill(bad, 0.0)
    m = torch.lerp(m, grad, 1 - beta1).masked_fill(bad, 0.0)
    v = (v * beta2).addcmul(grad, grad, value=1 - beta2).masked_fill(bad, 0.0)
    step_size = lr * math.sqrt(1 - beta2**step) / (1 - beta1**step)
    eps_hat = eps * math.sqrt(1 - beta2**step)
    param = p.float()
    new = param * (1 - lr * weight_decay) - step_size * m / (v.sqrt() + eps_hat)
    p.copy_(torch.where(bad, param, new))
    c1, a1 = quantize_blocks(m, qmap1, blocksize, keep_sign=True)
    c2, a2 = quantize_blocks(v, qmap2, blocksize, keep_sign=True)
    state1.copy_(c1), absmax1.copy_(a1), state2.copy_(c2), absmax2.copy_(a2)


@torch.no_grad()
def step_block_by_block(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, *, step, lr, beta1, beta2, eps,
                        weight_decay, blocksize):
    """Right: a Python loop over blocks, each dequantized, updated and requantized on its own."""
    for b, start in enumerate(range(0, p.numel(), blocksize)):
        sl = slice(start, start + blocksize)
        m = qmap1[state1[sl].long()] * absmax1[b]
        v = qmap2[state2[sl].long()] * absmax2[b]
        grad = g[sl].float()
        ok = torch.isfinite(grad)
        m = torch.where(ok, beta1 * m + (1 - beta1) * grad, torch.zeros_like(m))
        v = torch.where(ok, beta2 * v + (1 - beta2) * grad**2, torch.zeros_like(v))
        old = p[sl].float()
        new = old * (1 - lr * weight_decay) - lr / (1 - beta1**step) * m / (
            (v / (1 - beta2**step)).sqrt() + eps)
        p[sl] = torch.where(ok, new, old).to(p.dtype)
        state1[sl], absmax1[b: b + 1] = quantize_blocks(m, qmap1, blocksize, keep_sign=True)
        state2[sl], absmax2[b: b + 1] = quantize_blocks(v, qmap2, blocksize, keep_sign=True)


WRONG_STEP = [
    Wrong("07.1", STEP, make_step("no_keep_sign", sign_m=False, sign_v=False), "keep_sign off for m and v",
          "sign lost on requantize", True),
    Wrong("07.1", STEP, make_step("no_keep_sign_m", sign_m=False), "keep_sign off for m only",
          "keep_sign=True for m", True),
    Wrong("07.1", STEP, make_step("no_keep_sign_v", sign_v=False), "keep_sign off for v (bitsandbytes' rule)",
          "a tiny positive v must not round to 0", True),
    Wrong("07.1", STEP, make_step("no_bias_correction", bias=False), "no bias correction",
          "no bias correction", True),
    Wrong("07.1", STEP, make_step("bias_step_plus_one", step_offset=1), "bias correction with step + 1",
          "bias correction is off by one step", True),
    Wrong("07.1", STEP, make_step("bias2_without_sqrt", sqrt_c2=False), "sqrt(v) divided by (1 - beta2**t), no sqrt",
          "under the square root", True),
    Wrong("07.1", STEP, make_step("eps_inside_sqrt", eps_inside=True), "eps added under the square root",
          "eps goes OUTSIDE the square root", True),
    Wrong("07.1", STEP, make_step("l2_decay", l2=True), "weight decay through the gradient (Adam's L2)",
          "you applied weight decay through the gradient", True),
    Wrong("07.1", STEP, make_step("decay_without_lr", decay_lr=False), "p *= 1 - weight_decay (no lr)",
          "the decay is scaled by lr", True),
    Wrong("07.1", STEP, make_step("old_absmax", old_absmax=True), "requantized with the old absmax",
          "FRESH absmax", True),
    Wrong("07.1", STEP, make_step("swapped_maps", swap_maps=True), "m with qmap2 and v with qmap1",
          "the maps are swapped", True),
    Wrong("07.1", STEP, make_step("v_with_signed_map", v_signed_map=True), "v quantized with the signed map qmap1",
          "v is quantized with the signed map qmap1", True),
    Wrong("07.1", STEP, make_step("no_nan_rule", nan_rule=False), "NaN/Inf gradients not handled",
          "NaN handling is missing", True),
    Wrong("07.1", STEP, make_step("g_not_squared", square=False), "v = beta2 v + (1 - beta2) g (not g * g)",
          "v is the average of g * g", True),
    Wrong("07.1", STEP, make_step("update_added", sign=-1.0), "update added to p instead of subtracted",
          "you ADDED the update", True),
    Wrong("07.1", STEP, make_step("update_with_old_moments", update_with="old"), "p updated with m and v from "
          "before the EMA", "m and v from BEFORE this step's EMA", True),
    Wrong("07.1", STEP, make_step("update_after_requantize", update_with="stored"), "states requantized first, p "
          "updated from the 8-bit m and v", "you updated p from the requantized (8-bit) m and v", True),
    Wrong("07.1", STEP, make_step("bf16_arithmetic", param_dtype_math=True), "a 16-bit p updated in its own dtype "
          "(decay and update rounded to 16 bits), not in fp32", "arithmetic: every intermediate result", True),
    Wrong("07.1", STEP, make_step("nan_still_decays", nan_decays=True), "a non-finite-gradient element still "
          "decays", "no Adam update and no weight decay either", True),
    Wrong("07.1", STEP, rebinds_p, "p = ... rebinds the name, p never changes", "`p = ...` only rebinds", True),
    Wrong("07.1", STEP, returns_new_tensors, "returns new tensors instead of writing in place", "nothing changed",
          True),
    Wrong("07.1", STEP, rebinds_states, "state1 = c1; absmax1 = a1 (…) rebinds the names: the given states never "
          "change", "nothing was written in place into state1, state2, absmax1, absmax2", True),
    Wrong("07.1", STEP, rebinds_absmax, "codes written in place, absmax1 = a1 only rebinds the name",
          "nothing was written in place into absmax1, absmax2", True),
    Wrong("07.1", STEP, step_in_low_precision("bf16_everything", moments_too=True), "a 16-bit step computed in "
          "bf16/fp16: gradient, parameter and moments never converted to fp32", "the arithmetic was done in", True),
    Wrong("07.1", STEP, step_in_low_precision("no_upcast", moments_too=False), "the gradient and the parameter used "
          "in their 16-bit dtype (no .float())", "arithmetic", True),
    Wrong("07.1", STEP, make_step("decay_after_update", decay_after=True), "weight decay after the update, "
          "(p - u) * (1 - lr * wd): bitsandbytes' CUDA order", "you decayed p AFTER the update", True),
]
RIGHT_STEP = [
    Right("07.1", STEP, step_with_lerp_and_masked_fill, "lerp/addcmul moments, masked_fill, folded bias correction"),
    Right("07.1", STEP, step_block_by_block, "a Python loop over blocks"),
]


# ------------------------------------------------------------------ 07.2 · the optimizer class
def make_optimizer(name, *, strict=False, quantize_all=False, defaults_only=False, no_decay=False, step_rule="state",
                   own_attributes=False, skip_none=True, flat_grad=True, eager_state=False, count="numel",
                   blocks_rule="ceil", small_l2=False, flat_p=True, from_defaults=(), lazy_steps=False):
    """The solution's MyAdam8bit with one slip. step_rule: "state" (right), "always_one", "after" (increased
    after the update, so the first update runs with step 0), "global" (one counter for all parameters),
    "per_call" (one counter increased per call of step()). blocks_rule "floor": n // blocksize absmax entries.
    from_defaults: the settings read from self.defaults (the rest from the group); lazy_steps: the step counts kept in
    self.steps, a dict created in the first call of step() (while self.state is empty)."""

    class MyAdam8bit(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, blocksize=256,
                     min_8bit_size=4096):
            defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, blocksize=blocksize,
                            min_8bit_size=min_8bit_size)
            super().__init__(params, defaults)
            self.hyper = defaults  # the constructor's values, for the defaults_only slip
            self.qmap1, self.qmap2 = dynamic_map(signed=True), dynamic_map(signed=False)
            self.mine, self.t = {}, 0
            if eager_state:
                for group in self.param_groups:
                    for p in group["params"]:
                        self._init_state(self.state[p], p, group)

        def _init_state(self, state, p, group):
            n = p.numel() if count == "numel" else p.shape[0]
            state["step"] = 0
            big = quantize_all or (n > group["min_8bit_size"] if strict else n >= group["min_8bit_size"])
            if big:
                blocks = -(-p.numel() // group["blocksize"]) if blocks_rule == "ceil" else \
                    p.numel() // group["blocksize"]
                state["state1"] = torch.full((p.numel(),), 127, dtype=torch.uint8)
                state["state2"] = torch.zeros(p.numel(), dtype=torch.uint8)
                state["absmax1"], state["absmax2"] = torch.zeros(blocks), torch.zeros(blocks)
            else:
                state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)

        def load_state_dict(self, state_dict):
            super().load_state_dict(state_dict)
            for state in self.state.values():
                for key in ("state1", "state2"):
                    if key in state:
                        state[key] = state[key].to(torch.uint8)

        @torch.no_grad()
        def step(self):
            self.calls = getattr(self, "calls", 0) + 1
            if lazy_steps and not self.state:  # the first call: nothing stepped yet
                self.steps = {}
            for group in self.param_groups:
                hp = self.hyper if defaults_only else group
                if from_defaults:
                    hp = {**group, **{k: self.defaults[k] for k in from_defaults}}
                beta1, beta2 = hp["betas"]
                for p in group["params"]:
                    if p.grad is None and skip_none:
                        continue
                    state = self.mine.setdefault(p, {}) if own_attributes else self.state[p]
                    if not state:
                        self._init_state(state, p, group)
                    if lazy_steps:
                        self.steps[p] = self.steps.get(p, 0) + 1
                        state["step"] = self.steps[p]
                    elif step_rule == "global":
                        self.t += 1
                        state["step"] = self.t
                    elif step_rule == "always_one":
                        state["step"] = 1
                    elif step_rule == "per_call":
                        state["step"] = self.calls
                    elif step_rule == "state":
                        state["step"] += 1
                    common = dict(step=state["step"], lr=hp["lr"], eps=hp["eps"],
                                  weight_decay=0.0 if no_decay else hp["weight_decay"])
                    if "state1" in state:
                        reference_step(p.view(-1) if flat_p else p, p.grad.view(-1) if flat_grad else p.grad,
                                       state["state1"],
                                       state["state2"], state["absmax1"], state["absmax2"], self.qmap1, self.qmap2,
                                       beta1=beta1, beta2=beta2, blocksize=group["blocksize"], **common)
                    else:
                        adam_step(p, p.grad, state["exp_avg"], state["exp_avg_sq"], betas=(beta1, beta2),
                                  decoupled=not small_l2, **common)
                    if step_rule == "after":
                        state["step"] += 1

    MyAdam8bit.__name__ = name
    return MyAdam8bit


class Adam8bitInlineFp32(torch.optim.Optimizer):
    """Right: fp32 states updated inline (AdamW maths written out), states made with torch.full_like,
    views by p.flatten(), the step count kept as a Python int."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, blocksize=256,
                 min_8bit_size=4096):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "blocksize": blocksize, "min_8bit_size": min_8bit_size})
        self.maps = (dynamic_map(True), dynamic_map(False))

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("state1", "state2"):
                if key in state:
                    state[key] = state[key].to(torch.uint8)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in (q for q in group["params"] if q.grad is not None):
                st = self.state[p]
                if len(st) == 0:
                    st["step"] = 0
                    if p.numel() < group["min_8bit_size"]:
                        st["exp_avg"], st["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                    else:
                        flat = p.flatten()
                        nb = (p.numel() + group["blocksize"] - 1) // group["blocksize"]
                        st["state1"] = torch.full_like(flat, 127, dtype=torch.uint8)
                        st["state2"] = torch.zeros_like(flat, dtype=torch.uint8)
                        st["absmax1"], st["absmax2"] = torch.zeros(nb), torch.zeros(nb)
                st["step"] += 1
                t = st["step"]
                if "exp_avg" in st:
                    m, v = st["exp_avg"], st["exp_avg_sq"]
                    p.mul_(1 - lr * wd)
                    m.mul_(b1).add_(p.grad, alpha=1 - b1)
                    v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                    denom = (v / (1 - b2**t)).sqrt().add_(eps)
                    p.addcdiv_(m, denom, value=-lr / (1 - b1**t))
                else:
                    reference_step(p.flatten(), p.grad.flatten(), st["state1"], st["state2"], st["absmax1"],
                                   st["absmax2"], *self.maps, step=t, lr=lr, beta1=b1, beta2=b2, eps=eps,
                                   weight_decay=wd, blocksize=group["blocksize"])


class Adam8bitWithoutSuperInit(torch.optim.Optimizer):
    """A cold learner's 07.2: no super().__init__(params, defaults); the groups built by hand from a list of
    parameters — the check's groups (dicts) end up where parameters should be."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, blocksize=256,
                 min_8bit_size=4096):
        self.defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, blocksize=blocksize,
                             min_8bit_size=min_8bit_size)
        self.param_groups = [dict(self.defaults, params=list(params))]
        self.state = {}
        self.maps = (dynamic_map(True), dynamic_map(False))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state.setdefault(p, {"step": 0, "exp_avg": torch.zeros_like(p),
                                               "exp_avg_sq": torch.zeros_like(p)})
                st["step"] += 1
                adam_step(p, p.grad, st["exp_avg"], st["exp_avg_sq"], step=st["step"], lr=group["lr"],
                          betas=group["betas"], eps=group["eps"], weight_decay=group["weight_decay"])


WRONG_OPTIMIZER = [
    Wrong("07.2", OPT, make_optimizer("small_l2", small_l2=True), "L2 (coupled) decay for the fp32-state tensors "
          "(adam_step(..., decoupled=False))", "both paths must use AdamW's DECOUPLED decay", True),
    Wrong("07.2", OPT, make_optimizer("strict_threshold", strict=True), "n > min_8bit_size (4096 stays fp32)",
          "min_8bit_size is inclusive", True),
    Wrong("07.2", OPT, make_optimizer("all_8bit", quantize_all=True), "small tensors not kept in fp32",
          "you gave this small tensor 8-bit states", True),
    Wrong("07.2", OPT, make_optimizer("defaults_only", defaults_only=True), "hyperparameters from the constructor, "
          "not the param group", "from each param group", True),
    Wrong("07.2", OPT, make_optimizer("no_weight_decay", no_decay=True), "weight_decay never passed to the step",
          "no weight decay was applied", True),
    Wrong("07.2", OPT, make_optimizer("step_always_one", step_rule="always_one"), "step count never grows (always 1)",
          "the step count stays at 1", True),
    Wrong("07.2", OPT, make_optimizer("step_increased_after", step_rule="after"), "step increased after the update "
          "(the first update runs with step 0)", "increase the count BEFORE the update", True),
    Wrong("07.2", OPT, make_optimizer("global_step", step_rule="global"), "one step counter for all parameters",
          "one counter for all parameters", True),
    Wrong("07.2", OPT, make_optimizer("own_attributes", own_attributes=True), "states kept in self.mine, "
          "not self.state[p]", "self.state[p] is empty", True),
    Wrong("07.2", OPT, make_optimizer("no_none_skip", skip_none=False), "parameters without .grad not skipped",
          "skip parameters whose .grad is None", True),
    Wrong("07.2", OPT, make_optimizer("grad_not_flat", flat_grad=False), "p.view(-1) but p.grad unflattened",
          "flatten the gradient too", True),
    Wrong("07.2", OPT, make_optimizer("nothing_flat", flat_grad=False, flat_p=False), "neither p nor p.grad "
          "flattened for the 8-bit step", "flat views of BOTH the parameter and its gradient", True),
    Wrong("07.2", OPT, Adam8bitWithoutSuperInit, "no super().__init__(params, defaults): param_groups built by hand "
          "from a list of parameters", "Call super().__init__(params, defaults)", True),
    Wrong("07.2", OPT, make_optimizer("state_in_init", eager_state=True), "states created in __init__ for every "
          "parameter", "create a parameter's state on its first step", True),
    Wrong("07.2", OPT, make_optimizer("len_not_numel", count="len"), "size compared with p.shape[0], not numel()",
          "count elements with p.numel()", True),
    Wrong("07.2", OPT, make_optimizer("step_per_call", step_rule="per_call"), "one step counter per call of step(), "
          "so a parameter whose first gradient comes late starts at step 2", "you count calls of step()", True),
    Wrong("07.2", OPT, make_optimizer("floor_blocks", blocks_rule="floor"), "n // blocksize absmax entries (the "
          "partial last block has none)", "partial last block", True),
]
RIGHT_OPTIMIZER = [
    Right("07.2", OPT, Adam8bitInlineFp32, "fp32 AdamW written inline, p.flatten() views, full_like states"),
    Right("07.2", OPT, make_optimizer("solution_twin"), "the solution's structure with a helper for the state"),
]


# ------------------------------------------------------------------ 07.3 · the stable embedding
def make_embedding(name, *, init="xavier_uniform", norm="layer", override="embedding", swap_args=False,
                   norm_dim="embedding_dim", affine=True, freeze=None):
    """The solution's StableEmbedding with one slip."""
    import bitsandbytes as bnb

    class StableEmbedding(nn.Module):
        def __init__(self, num_embeddings, embedding_dim):
            super().__init__()
            self.embedding = nn.Embedding(*((embedding_dim, num_embeddings) if swap_args
                                            else (num_embeddings, embedding_dim)))
            if init == "xavier_uniform":
                nn.init.xavier_uniform_(self.embedding.weight)
            elif init == "xavier_normal":
                nn.init.xavier_normal_(self.embedding.weight)
            elif init == "bound_rows":  # a cold learner's bound: sqrt(6 / rows), the number of rows only
                bound = math.sqrt(6.0 / num_embeddings)
                nn.init.uniform_(self.embedding.weight, -bound, bound)
            self.norm = nn.LayerNorm(embedding_dim if norm_dim == "embedding_dim" else num_embeddings,
                                     elementwise_affine=affine)
            if freeze is not None:  # e.g. "norm": the LayerNorm kept fixed
                getattr(self, freeze).requires_grad_(False)
            target = {"embedding": self.embedding, "self": self, "norm": self.norm}.get(override)
            if target is not None:
                bnb.optim.GlobalOptimManager.get_instance().register_module_override(target, "weight",
                                                                                     {"optim_bits": 32})

        def forward(self, x):
            e = self.embedding(x)
            if norm == "layer":
                return self.norm(e)
            if norm == "l2":
                return nn.functional.normalize(e, dim=-1)
            if norm == "functional_plain":  # the normalisation without the LayerNorm's own scale and shift
                return nn.functional.layer_norm(e, (e.shape[-1],))
            if norm == "detached":
                return self.norm(e).detach()
            if norm == "weight_only":
                return nn.functional.layer_norm(e, (e.shape[-1],), self.norm.weight, None, self.norm.eps)
            return e

    StableEmbedding.__name__ = name
    return StableEmbedding


def plain_embedding(num_embeddings, embedding_dim):
    return nn.Embedding(num_embeddings, embedding_dim)


class StableEmbeddingFrozenCopy(nn.Module):
    """Wrong: forward looks up a copy of the table taken in __init__ (training never reaches it)."""

    def __init__(self, num_embeddings, embedding_dim):
        super().__init__()
        import bitsandbytes as bnb

        self.embedding = nn.Embedding(num_embeddings, embedding_dim)
        nn.init.xavier_uniform_(self.embedding.weight)
        self.table = self.embedding.weight.detach().clone()
        self.norm = nn.LayerNorm(embedding_dim)
        bnb.optim.GlobalOptimManager.get_instance().register_module_override(self.embedding, "weight",
                                                                             {"optim_bits": 32})

    def forward(self, x):
        return self.norm(self.table[x])


class StableEmbeddingByHand(nn.Module):
    """Right: the uniform bound written out, F.layer_norm with the module's parameters, the override
    registered with a dict() config."""

    def __init__(self, num_embeddings, embedding_dim):
        super().__init__()
        import bitsandbytes as bnb

        bound = math.sqrt(6.0 / (num_embeddings + embedding_dim))
        self.embedding = nn.Embedding(num_embeddings, embedding_dim,
                                      _weight=torch.empty(num_embeddings, embedding_dim).uniform_(-bound, bound))
        self.norm = nn.LayerNorm(embedding_dim)
        bnb.optim.GlobalOptimManager.get_instance().register_module_override(self.embedding, "weight",
                                                                             dict(optim_bits=32))

    def forward(self, x):
        n = self.norm
        return nn.functional.layer_norm(self.embedding(x), n.normalized_shape, n.weight, n.bias, n.eps)


WRONG_EMBEDDING = [
    Wrong("07.3", EMB, make_embedding("frozen_norm", freeze="norm"), "the LayerNorm frozen (requires_grad False)",
          "you froze part of the layer", True),
    Wrong("07.3", EMB, make_embedding("frozen_table", freeze="embedding"), "the table frozen (requires_grad False)",
          "you froze part of the layer", True),
    Wrong("07.3", EMB, make_embedding("default_init", init="default"), "nn.Embedding's N(0, 1) init kept",
          "still has nn.Embedding's default init", True),
    Wrong("07.3", EMB, make_embedding("xavier_normal", init="xavier_normal"), "xavier_normal_ instead of uniform",
          "that is a NORMAL initialisation", True),
    Wrong("07.3", EMB, make_embedding("bound_from_rows", init="bound_rows"), "uniform with the bound "
          "sqrt(6 / num_embeddings) (the rows only)", "yours is sqrt(6 / num_embeddings)", True),
    Wrong("07.3", EMB, make_embedding("no_layer_norm", norm="none"), "StableEmbedding without the layer norm",
          "apply self.norm", True),
    Wrong("07.3", EMB, make_embedding("l2_normalize", norm="l2"), "F.normalize (L2) instead of the LayerNorm",
          "that is L2 normalisation", True),
    Wrong("07.3", EMB, make_embedding("no_override", override=None), "no 32-bit override for the table",
          "you did not register the table for 32-bit states", True),
    Wrong("07.3", EMB, make_embedding("override_on_self", override="self"), "override registered on the module "
          "itself, which has no .weight", "register the table itself", True),
    Wrong("07.3", EMB, make_embedding("override_on_norm", override="norm"), "override registered on the LayerNorm",
          "you did not register the table for 32-bit states", True),
    Wrong("07.3", EMB, plain_embedding, "a plain nn.Embedding", "self.embedding (an nn.Embedding)", True),
    Wrong("07.3", EMB, make_embedding("norm_over_vocab", norm_dim="num_embeddings"), "nn.LayerNorm(num_embeddings)",
          "LayerNorm normalises each embedding VECTOR", True),
    Wrong("07.3", EMB, make_embedding("swapped_args", swap_args=True), "nn.Embedding(embedding_dim, num_embeddings)",
          "you swapped the arguments", True),
    Wrong("07.3", EMB, make_embedding("no_affine", affine=False), "nn.LayerNorm(embedding_dim, "
          "elementwise_affine=False): no scale and shift to learn", "without its affine parameters", True),
    Wrong("07.3", EMB, make_embedding("functional_without_params", norm="functional_plain"), "F.layer_norm without "
          "the LayerNorm's weight and bias (right only while untrained)", "ignores the LayerNorm's scale and shift",
          True),
    Wrong("07.3", EMB, make_embedding("weight_without_bias", norm="weight_only"), "F.layer_norm with the scale but "
          "not the shift", "uses only one of the LayerNorm's scale and shift", True),
    Wrong("07.3", EMB, make_embedding("detached_output", norm="detached"), "forward returns a detached tensor",
          "carries no gradient", True),
    Wrong("07.3", EMB, StableEmbeddingFrozenCopy, "forward reads a copy of the table made in __init__",
          "does not follow the module's current parameters", True),
]
RIGHT_EMBEDDING = [
    Right("07.3", EMB, StableEmbeddingByHand, "uniform bound by hand, F.layer_norm with the module's parameters"),
]


# ------------------------------------------------------------------ 07.4 · training with the optimizer
def make_train(name, *, record="before", use_lr=True, zero="before", fresh_optimizer=False, reduction="mean",
               fixed_steps=None, give_back=True, keep="item", squeeze=False, batch=None):
    """The solution's train() with one slip. zero: "before" (right), "none", "between" (after backward, before
    the step)."""

    def train(optimizer_class, steps=200, lr=1e-2):
        x, y, model = mlp_task()
        make = (lambda: optimizer_class(model.parameters(), lr=lr)) if use_lr else \
            (lambda: optimizer_class(model.parameters()))
        opt = make()
        losses = []
        for _ in range(fixed_steps or steps):
            if fresh_optimizer:
                opt = make()
            if zero == "before":
                opt.zero_grad()
            xs, ys = x, y
            if batch is not None:  # random mini-batches (torch's global generator)
                idx = torch.randint(0, x.shape[0], (batch,))
                xs, ys = x[idx], y[idx]
            out = model(xs).squeeze(-1) if squeeze else model(xs)  # squeeze: an output of shape (256,)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch warns about the broadcast
                loss = nn.functional.mse_loss(out, ys, reduction=reduction)
            loss.backward()
            if record == "before":
                losses.append(loss.item() if keep == "item" else loss if keep == "tensor" else loss.detach())
            if zero == "between":
                opt.zero_grad()
            opt.step()
            if record == "after":
                losses.append(nn.functional.mse_loss(model(x), y, reduction=reduction).item())
        return losses if give_back else None

    train.__name__ = name
    return train


def train_with_module_loss(optimizer_class, steps=200, lr=1e-2):
    """Right: nn.MSELoss, model.zero_grad(set_to_none=True), loss.item() read after the step (same value)."""
    x, y, model = mlp_task()
    criterion = nn.MSELoss()
    opt = optimizer_class(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # after the step, but the tensor still holds the loss from before it
    return losses


_SOLUTION_OPTIMIZER = make_optimizer("MyAdam8bit")  # the 07.2 solution, for 07.4's second argument


def train_with_the_course_loop(optimizer_class, steps=200, lr=1e-2):
    """No loop of its own: the course's driver loop, found in the learner process, handed back."""
    from adam8lib.course.grading.drivers.ex07 import train_losses

    return train_losses(lambda ps: optimizer_class(ps, lr=lr), steps)

WRONG_TRAIN = [
    Wrong("07.4", TRAIN, make_train("loss_after_step", record="after"), "loss recorded after opt.step()",
          "you recorded the loss AFTER opt.step()", True, (_SOLUTION_OPTIMIZER,)),
    Wrong("07.4", TRAIN, make_train("lr_not_passed", use_lr=False), "optimizer built without lr=lr",
          "pass lr to the optimizer", True, (_SOLUTION_OPTIMIZER,)),
    Wrong("07.4", TRAIN, make_train("no_zero_grad", zero="none"), "opt.zero_grad() never called",
          "gradients add up across steps", True, (_SOLUTION_OPTIMIZER,)),
    Wrong("07.4", TRAIN, make_train("zero_grad_before_step", zero="between"), "zero_grad between backward and step",
          "zeroed the gradients between backward() and step()", True, (_SOLUTION_OPTIMIZER,)),
    Wrong("07.4", TRAIN, make_train("optimizer_in_loop", fresh_optimizer=True), "a new optimizer every step",
          "build the optimizer ONCE", True, (_SOLUTION_OPTIMIZER,)),
    Wrong("07.4", TRAIN, make_train("summed_loss", reduction="sum"), "sum of squared errors, not the mean",
          "you summed the squared errors", True, (_SOLUTION_OPTIMIZER,)),
    Wrong("07.4", TRAIN, make_train("steps_ignored", fixed_steps=200), "200 steps whatever `steps` says",
          "take `steps` steps", True, (_SOLUTION_OPTIMIZER,)),
    Wrong("07.4", TRAIN, make_train("no_return", give_back=False), "losses not returned",
          "return the list of losses", True, (_SOLUTION_OPTIMIZER,)),
    Wrong("07.4", TRAIN, make_train("loss_tensors", keep="tensor"), "the loss tensor appended (graph kept alive)",
          "you appended the loss tensor itself", True, (_SOLUTION_OPTIMIZER,)),
    Wrong("07.4", TRAIN, make_train("output_squeezed", squeeze=True), "the model's output squeezed to (256,) "
          "against y of shape (256, 1): mse_loss broadcasts", "paired with EVERY target", True,
          (_SOLUTION_OPTIMIZER,)),
    Wrong("07.4", TRAIN, make_train("random_minibatches", batch=32), "random mini-batches of 32 points instead of "
          "the whole batch", "your model was run on batches of 32 points", True, (_SOLUTION_OPTIMIZER,)),
    Wrong("07.4", TRAIN, make_train("minibatch_and_squeeze", batch=64, squeeze=True), "random mini-batches AND "
          "a squeezed output", "your model was run on batches of 64 points", True, (_SOLUTION_OPTIMIZER,)),
    Wrong("07.4", TRAIN, make_train("detached_tensors", keep="detach"), "loss.detach() appended: tensors, not floats",
          "you appended the loss tensor itself", True, (_SOLUTION_OPTIMIZER,)),
    Wrong("07.4", TRAIN, train_with_the_course_loop, "the course's own training loop (the grader's driver) returned "
          "as the learner's", "ran the course's own training loop", True, (_SOLUTION_OPTIMIZER,)),
]
RIGHT_TRAIN = [
    Right("07.4", TRAIN, train_with_module_loss, "nn.MSELoss, model.zero_grad, loss.item() read after the step",
          (_SOLUTION_OPTIMIZER,)),
]

# ------------------------------------------------------------------ 07.1 · mistakes named by a PROPERTY
def step_with(slip):
    """The solution's 8-bit step with a slip in the parameter update or the stored m (not one of the named variants)."""

    @torch.no_grad()
    def adam8bit_step(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, *, step, lr, beta1, beta2, eps,
                      weight_decay, blocksize):
        m = dequantize_blocks(state1, absmax1, qmap1, blocksize)
        v = dequantize_blocks(state2, absmax2, qmap2, blocksize)
        grad, param = g.float(), p.float()
        finite = torch.isfinite(grad)
        m = torch.where(finite, beta1 * m + (1 - beta1) * grad, 0.0)
        v = torch.where(finite, beta2 * v + (1 - beta2) * grad * grad, 0.0)
        c1, c2 = 1 - beta1**step, math.sqrt(1 - beta2**step)
        new = param * (1 - lr * weight_decay) - (2 * lr if slip == "lr_twice" else lr) / c1 * m / (v.sqrt() / c2 + eps)
        p.copy_(torch.where(finite, new, 0.0 if slip == "nan_p_zero" else param))
        state1[:], absmax1[:] = quantize_blocks(m, qmap1, blocksize, keep_sign=True)
        state2[:], absmax2[:] = quantize_blocks(v, qmap2, blocksize, keep_sign=True)
        if slip == "absmax_halved":
            absmax1.mul_(0.5)

    adam8bit_step.__name__ = f"adam8bit_step_{slip}"
    return adam8bit_step


WRONG_STEP_PROPERTIES = [
    Wrong("07.1", STEP, step_with("lr_twice"), "the step size doubled (2 * lr)", "the update p_new - p is twice", True),
    Wrong("07.1", STEP, step_with("nan_p_zero"), "p set to 0 where the gradient is not finite",
          "only the elements where the gradient is NaN or Inf are wrong", True),
    Wrong("07.1", STEP, step_with("absmax_halved"), "the stored absmax of m halved", "m is half the expected", True),
]

WRONG = WRONG_STEP + WRONG_STEP_PROPERTIES + WRONG_OPTIMIZER + WRONG_EMBEDDING + WRONG_TRAIN
RIGHT = RIGHT_STEP + RIGHT_OPTIMIZER + RIGHT_EMBEDDING + RIGHT_TRAIN

# ------------------------------------------------------------------ issue 51: what fresh cold learners wrote
class StableEmbeddingBitsKey(make_embedding("bits_key", override=None)):
    """Wrong: the override registered for the table with a config bitsandbytes does not read ({'bits': 32})."""

    def __init__(self, num_embeddings, embedding_dim):
        import bitsandbytes as bnb

        super().__init__(num_embeddings, embedding_dim)
        bnb.optim.GlobalOptimManager.get_instance().register_module_override(self.embedding, "weight", {"bits": 32})


class StableEmbeddingNormOverTokens(make_embedding("norm_over_tokens")):
    """Wrong: the layer norm written by hand over the tokens of a row (dim 1), not over each vector."""

    def forward(self, x):
        e = self.embedding(x)
        mean, var = e.mean(dim=1, keepdim=True), e.var(dim=1, keepdim=True, unbiased=False)
        return (e - mean) / (var + self.norm.eps).sqrt() * self.norm.weight + self.norm.bias


def train_lr_hard_coded(optimizer_class, steps=200, lr=1e-2):
    """Wrong: the optimizer built with lr=1e-2 whatever train's lr (a cold learner's torch.optim.Adam(params, lr=1e-2))."""
    return make_train("train_lr_hard_coded")(optimizer_class, steps, 1e-2)


WRONG_COLD_LEARNERS = [
    Wrong("07.2", OPT, make_optimizer("lr_from_defaults", from_defaults=("lr",)), "lr = self.defaults['lr'] (betas, "
          "weight_decay from the group)", "moved with lr=0.001 (your optimizer's default)", True),
    Wrong("07.2", OPT, make_optimizer("steps_made_lazily", lazy_steps=True), "step counts in self.steps, a dict set "
          "only in the first step() (missing after load_state_dict into a new optimizer)",
          "after load_state_dict() into a new optimizer your step() raised AttributeError", True),
    Wrong("07.3", EMB, StableEmbeddingBitsKey, "override registered for the table with {'bits': 32} (a key "
          "bitsandbytes does not read)", "does not ask bitsandbytes for 32-bit states", True),
    Wrong("07.3", EMB, StableEmbeddingNormOverTokens, "layer norm by hand over dim 1 (the tokens), not the last",
          "you normalised over dimension 1", True),
    Wrong("07.4", TRAIN, train_lr_hard_coded, "optimizer built with lr=1e-2 whatever train's lr",
          "gave the curve of lr=1e-2", True, (_SOLUTION_OPTIMIZER,)),
]
WRONG += WRONG_COLD_LEARNERS
