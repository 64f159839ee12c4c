"""Checks for workbook 07 · the 8-bit Adam step (dequantize -> update in fp32 -> requantize).

07.1 calls the learner's ``adam8bit_step`` on this check's tensors (plain data: when graded, those it updates in
place come back from the learner's process as plain tensors). 07.2-07.4 hand the learner's class or function to
course drivers (:mod:`adam8lib.course.grading.drivers.ex07`): they build the parameters and every step's gradients
this check sends into the learner's optimizer and step it, build the learner's embedding from a fixed seed and move
it as training would, run the learner's training loop, and return plain data — parameters, what the states hold,
outputs, losses — which this check compares with its own recomputation (adam8lib's Adam8bit, F.layer_norm of the
embedding's table moved as this check said, torch.optim.Adam's losses). When graded, the drivers run in the learner's process and
everything here in the check process; in a notebook both run in the kernel."""

from __future__ import annotations

import math
import re

import torch

from ...kernels.reference import adam8bit_step
from ...quant import dequantize_blocks, dynamic_map, nearest_code, num_blocks, quantize_blocks
from ..grading.drivers import drive, reraise
from ..grading.drivers import ex07 as _drivers
from ..grading.drivers.ex07 import mlp_task  # noqa: F401 - 07.4's task: the exercise cell imports it from here
from ._common import assert_close, call, fail, passed, refail, require_callable
from ._properties import describe_step

__all__ = ["check_adam8bit_step", "check_adam8bit_optimizer", "check_stable_embedding", "check_trains_like_adam",
           "mlp_task", "train_side_by_side"]

_FIELDS = ("p", "state1", "state2", "absmax1", "absmax2")


def _fresh_state(n: int, blocksize: int) -> dict[str, torch.Tensor]:
    nb = num_blocks(n, blocksize)
    return {"state1": torch.full((n,), 127, dtype=torch.uint8), "state2": torch.zeros(n, dtype=torch.uint8),
            "absmax1": torch.zeros(nb), "absmax2": torch.zeros(nb)}


def _variant(pre, g, qmap1, qmap2, hp, *, keep_sign=True, keep_sign_v=True, bias=True, nan_rule=True,
             fresh_absmax=True, decay_on_m=False, swap_maps=False, step_offset=0, sqrt_c2=True, eps_inside=False,
             decay_lr=True, v_signed_map=False, square=True, sign=1.0, update_with="new", decay_after=False):
    """One 8-bit step with one deliberate mistake (plain fp32 maths, no chunks)."""
    bs, t = hp["blocksize"], hp["step"] + step_offset
    b1, b2, lr, eps, wd = hp["beta1"], hp["beta2"], hp["lr"], hp["eps"], hp["weight_decay"]
    map_m, map_v = (qmap2, qmap1) if swap_maps else (qmap1, qmap1 if v_signed_map else qmap2)
    m = dequantize_blocks(pre["state1"], pre["absmax1"], map_m, bs)
    v = dequantize_blocks(pre["state2"], pre["absmax2"], map_v, bs)
    m_old, v_old = m, v
    p = pre["p"].float()
    grad = g.float()
    if decay_on_m and wd:
        grad = grad + wd * p
    finite = torch.isfinite(grad)
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * (grad * grad if square else grad)
    if nan_rule:
        m, v = m.masked_fill(~finite, 0.0), v.masked_fill(~finite, 0.0)
    new = p * (1 - (lr if decay_lr else 1.0) * wd) if (wd and not decay_on_m) else p.clone()
    c1 = 1 - b1**t if bias else 1.0
    c2 = (math.sqrt(1 - b2**t) if sqrt_c2 else 1 - b2**t) if bias else 1.0
    m_u, v_u = m, v
    if update_with == "old":  # the moments from before this step's EMA
        m_u, v_u = m_old, v_old
    elif update_with == "stored":  # the moments after a round trip through their 8-bit codes
        m_u = dequantize_blocks(*quantize_blocks(m, map_m, bs, keep_sign=True), map_m, bs)
        v_u = dequantize_blocks(*quantize_blocks(v, map_v, bs, keep_sign=True), map_v, bs)
    denom = (v_u / c2**2 + eps).sqrt() if eps_inside else v_u.sqrt() / c2 + eps
    new = new - sign * lr / c1 * m_u / denom
    if decay_after and wd:  # bitsandbytes' CUDA kernel's order: the update first, then the decay of the result
        new = (p - sign * lr / c1 * m_u / denom) * (1 - lr * wd)
    if nan_rule:
        new = torch.where(finite, new, p)
    out = {"p": new.to(pre["p"].dtype)}
    if fresh_absmax:
        out["state1"], out["absmax1"] = quantize_blocks(m, map_m, bs, keep_sign=keep_sign)
        out["state2"], out["absmax2"] = quantize_blocks(v, map_v, bs, keep_sign=keep_sign_v)
    else:  # normalize by the OLD absmax (clipped to the map's range)
        for key, val, qmap, am, keep in (("1", m, map_m, pre["absmax1"], keep_sign),
                                         ("2", v, map_v, pre["absmax2"], keep_sign_v)):
            scale = torch.where(am > 0, am, torch.ones_like(am))
            blocks = torch.nn.functional.pad(val, (0, am.numel() * bs - val.numel())).view(-1, bs) / scale[:, None]
            out["state" + key] = nearest_code(blocks.reshape(-1)[: val.numel()], qmap, keep_sign=keep)
            out["absmax" + key] = am.clone()
    return out


_OLD_MOMENTS = ("you updated p with m and v from BEFORE this step's EMA: first m = beta1 * m + (1 - beta1) * g "
                "(and v), then the parameter update with the new m and v.")

# (hint, knobs of _variant): the first variant the learner's result matches names the mistake
_STEP_SLIPS = [
    ("sign lost on requantize: a small non-zero m must keep a code of its own sign, never 0 "
     "(keep_sign=True when quantizing m and v).", {"keep_sign": False, "keep_sign_v": False}),
    ("sign lost on requantize: a small non-zero m must keep a code of its own sign (keep_sign=True for m).",
     {"keep_sign": False}),
    ("v loses its sign on requantize: a tiny positive v must not round to 0 (keep_sign=True for v "
     "too), or the next update is m / eps.", {"keep_sign_v": False}),
    ("no bias correction: step size lr / (1 - beta1**step), denominator "
     "sqrt(v) / sqrt(1 - beta2**step) + eps.", {"bias": False}),
    ("your bias correction is off by one step: `step` is already the number of this step (1 on the first "
     "call), so use 1 - beta1**step and 1 - beta2**step, not step + 1.", {"step_offset": 1}),
    ("you divided sqrt(v) by (1 - beta2**step): the second moment's correction goes under the square root, "
     "sqrt(v) / sqrt(1 - beta2**step).", {"sqrt_c2": False}),
    ("you added eps under the square root: eps goes OUTSIDE the square root, sqrt(v_hat) + eps.",
     {"eps_inside": True}),
    ("you applied weight decay through the gradient (g + weight_decay * p): that is Adam with L2, not "
     "AdamW. Decay p directly: p *= 1 - lr * weight_decay.", {"decay_on_m": True}),
    ("you decayed p by (1 - weight_decay): the decay is scaled by lr, p *= 1 - lr * weight_decay.",
     {"decay_lr": False}),
    ("you decayed p AFTER the update, (p - update) * (1 - lr * weight_decay) — the order of bitsandbytes' CUDA "
     "kernel, which the lesson mentions. The workbook's formula decays p FIRST and then subtracts the update: "
     "p * (1 - lr * weight_decay) - lr * m_hat / (sqrt(v_hat) + eps); the two orders differ by lr * weight_decay "
     "times the update.", {"decay_after": True}),
    ("you requantized with the OLD absmax: take a FRESH absmax per block from the updated m and v (max "
     "|m|, max v of the updated values), not the old one.", {"fresh_absmax": False}),
    ("the maps are swapped: m (signed) uses qmap1, v (non-negative) uses qmap2.", {"swap_maps": True}),
    ("v is quantized with the signed map qmap1: v is non-negative, dequantize and requantize it with the "
     "unsigned map qmap2 (all 256 codes for values >= 0).", {"v_signed_map": True}),
    ("NaN handling is missing: where the gradient is not finite, reset m and v to 0 and leave p unchanged.",
     {"nan_rule": False}),
    ("v is the average of g * g: v = beta2 * v + (1 - beta2) * g * g (you averaged g, so v goes negative "
     "and sqrt(v) is NaN).", {"square": False}),
    ("you ADDED the update: Adam steps against the gradient, p = p - lr * m_hat / (sqrt(v_hat) + eps).",
     {"sign": -1.0}),
    (_OLD_MOMENTS, {"update_with": "old"}),
    ("you updated p from the requantized (8-bit) m and v: update p with the fp32 m and v, then requantize them "
     "— the codes are only how the states are stored between steps.", {"update_with": "stored"}),
]


def _states_kept_where_not_finite(got: dict, finite: torch.Tensor, qmap1, qmap2, blocksize: int) -> bool:
    """Whether the learner's decoded m or v is non-zero at an element whose gradient was NaN/Inf (must be 0 there)."""
    try:
        m = dequantize_blocks(got["state1"], got["absmax1"], qmap1, blocksize)
        v = dequantize_blocks(got["state2"], got["absmax2"], qmap2, blocksize)
    except Exception:  # noqa: BLE001 - only for a hint
        return False
    bad = ~finite.reshape(-1)
    return bool(torch.isfinite(m[bad]).all() and torch.isfinite(v[bad]).all()) and bool(
        ((m[bad] != 0) | (v[bad] != 0)).any())


def _close(got: dict, want: dict, pdtype) -> str | None:
    """None when got ≈ want, else the name of the first field that differs."""
    ptol = 1e-2 if pdtype != torch.float32 else 1e-5
    for key in _FIELDS:
        a, e = got[key], want[key]
        if a.shape != e.shape:
            return key
        if key.startswith("state"):
            diff = (a.long() - e.long()).abs()
            if diff.numel() and (diff.max() > 1 or int((diff > 0).sum()) > max(1, diff.numel() // 200)):
                return key
        else:
            tol = ptol if key == "p" else 1e-5
            if not torch.allclose(a.float(), e.float(), rtol=tol, atol=tol * 1e-2, equal_nan=True):
                return key
    return None


def _unwritten_states(mine: dict, ref: dict, pre: dict, pdtype) -> list[str]:
    """The state tensors that came back exactly as given while the reference changed them, when everything else
    (p, the other states) is right: the learner computed them but never wrote them into the caller's tensors."""
    kept = [k for k in _FIELDS[1:] if torch.equal(mine[k], pre[k]) and not torch.equal(ref[k], pre[k])]
    if not kept or _close({**mine, **{k: ref[k] for k in kept}}, ref, pdtype) is not None:
        return []
    return kept


def _apart_by_rounding(mine: dict, ref: dict, pre: dict, pdtype) -> bool:
    """Whether a 16-bit case's result is off only by about that dtype's rounding: codes at most one apart, absmax
    within a few of the dtype's relative steps, p within a few steps of the larger of its old and new value (what
    arithmetic in bf16/fp16 instead of fp32 gives)."""
    eps = torch.finfo(pdtype).eps
    try:
        for key in ("state1", "state2"):
            if mine[key].shape != ref[key].shape or int((mine[key].long() - ref[key].long()).abs().max()) > 1:
                return False
        for key, rel in (("absmax1", 4 * eps), ("absmax2", 8 * eps), ("p", 4 * eps)):
            a, e = mine[key].float(), ref[key].float()
            scale = torch.maximum(e.abs(), pre[key].float().abs()) if key == "p" else e.abs()
            if a.shape != e.shape or not bool(((a - e).abs() <= rel * scale + 1e-6).all()):
                return False
    except Exception:  # noqa: BLE001 - only for a hint
        return False
    return True


def _step_property(pre, mine, ref, g, qmap1, qmap2, bs, pdtype) -> str | None:
    """Which of p / m / v / absmax went wrong, compared as VALUES (codes dequantized), and how."""
    def values(d):
        return {"p": d["p"].float(), "m": dequantize_blocks(d["state1"], d["absmax1"], qmap1, bs),
                "v": dequantize_blocks(d["state2"], d["absmax2"], qmap2, bs),
                "absmax of m": d["absmax1"], "absmax of v": d["absmax2"]}

    try:
        got, want, before = values(mine), values(ref), values(pre)
    except Exception:  # noqa: BLE001 - states of the wrong size: the field check reports those
        return None
    ptol = 1e-2 if pdtype != torch.float32 else 1e-5
    # one code of rounding (1/127 of the absmax near the top of the map) is not a mistake
    found = describe_step(before, got, want, rtol=max(ptol, 2e-2), atol=1e-7, blocksize=bs, moments=("m", "v"),
                          g=g.float())
    if found is None:
        return None
    finite = torch.isfinite(g.float())
    if not bool(finite.all()):
        found += " (this input has NaN/Inf gradient elements)"
    return found


def _require_rounded_once(got: torch.Tensor, want: torch.Tensor, pdtype, what: str) -> None:
    """A 16-bit parameter must be updated in fp32 and rounded ONCE: bitwise equal but for rare ties."""
    differ = got.view(-1) != want.view(-1)
    n = int(differ.sum())
    if n > max(2, got.numel() // 100):
        ulps = (got.view(-1).float() - want.view(-1).float()).abs()[differ]
        fail(f"{what}: p differs from the reference in {n} of {got.numel()} {pdtype} values (by up to "
             f"{float(ulps.max()):.3g}), more than rounding ties explain.",
             hint=f"your {pdtype} parameter was updated in {pdtype} arithmetic: every intermediate result "
                  "(the decay product, the update, the subtraction) was rounded to 16 bits. The statement asks for "
                  "the update in fp32: compute the new value from the parameter converted to fp32 and round to "
                  f"{pdtype} once, when you write it back.")


def _cases():
    gen = torch.Generator().manual_seed(7)
    tiny = torch.full((512,), -1e-9)
    tiny[::128] = 1.0  # per block: one large gradient, the rest tiny and negative
    nan = torch.randn(512, generator=gen)
    nan[[3, 200, 511]] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    base = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)
    return [
        ("1000 fp32 parameters, blocksize 256 (ragged tail)", 1000, torch.float32, dict(base, blocksize=256), {}, 3),
        ("4096 parameters, weight_decay=0.1, betas (0.8, 0.99)", 4096, torch.float32,
         dict(base, blocksize=256, weight_decay=0.1, beta1=0.8, beta2=0.99, eps=1e-6), {}, 2),
        ("777 bf16 parameters, blocksize 64", 777, torch.bfloat16, dict(base, blocksize=64), {}, 2),
        ("999 fp16 parameters, weight_decay=0.1, blocksize 128", 999, torch.float16,
         dict(base, blocksize=128, weight_decay=0.1), {}, 2),
        ("tiny negative gradients next to a large one", 512, torch.float32, dict(base, blocksize=128),
         {1: tiny, 2: tiny}, 2),
        ("NaN and Inf gradient elements, weight_decay=0.1", 512, torch.float32,
         dict(base, blocksize=128, weight_decay=0.1), {2: nan}, 2),
    ]


def check_adam8bit_step(adam8bit_step_fn) -> None:
    """The learner's in-place 8-bit step must match :func:`adam8lib.kernels.reference.adam8bit_step`."""
    require_callable(adam8bit_step_fn, "adam8bit_step")
    qmap1, qmap2 = dynamic_map(True), dynamic_map(False)
    gen = torch.Generator().manual_seed(70)
    for label, n, pdtype, hp, fixed_g, steps in _cases():  # fixed_g: {step: gradient}, else random
        ref = {"p": torch.randn(n, generator=gen).to(pdtype), **_fresh_state(n, hp["blocksize"])}
        for t in range(1, steps + 1):
            g = fixed_g.get(t, torch.randn(n, generator=gen)).to(pdtype)
            pre = {k: v.clone() for k, v in ref.items()}
            kw = dict(hp, step=t)
            adam8bit_step(ref["p"], g.clone(), ref["state1"], ref["state2"], ref["absmax1"], ref["absmax2"],
                          qmap1, qmap2, **kw)
            mine = {k: v.clone() for k, v in pre.items()}
            call(adam8bit_step_fn, mine["p"], g.clone(), mine["state1"], mine["state2"], mine["absmax1"],
                 mine["absmax2"], qmap1.clone(), qmap2.clone(), **kw, may_change=(0, 2, 3, 4, 5))
            what = f"after step {t} on {label}"
            for key in _FIELDS:
                if mine[key].dtype != pre[key].dtype or mine[key].shape != pre[key].shape:
                    fail(f"{what}: {key} changed to dtype {mine[key].dtype}, shape {tuple(mine[key].shape)}.",
                         hint="update p, state1, state2, absmax1 and absmax2 IN PLACE (p.copy_(...), state1[:] = ...):"
                              " their dtypes and shapes stay as they are.")
            bad = _close(mine, ref, pdtype)
            if bad is None and pdtype != torch.float32:
                _require_rounded_once(mine["p"], ref["p"], pdtype, what)
            if bad is None:
                continue
            finite = torch.isfinite(g.float())
            nan_p = torch.isnan(mine["p"].float()) & ~torch.isnan(ref["p"].float())
            unwritten = _unwritten_states(mine, ref, pre, pdtype)
            if all(torch.equal(mine[k], pre[k]) for k in _FIELDS):
                hint = ("nothing changed: the five tensors you were given come back as they went in. A result returned, "
                        "or a new tensor bound to an argument's name inside your function, is lost to the caller: "
                        "update p and the four state tensors IN PLACE (copy_ / slice assignment).")
            elif unwritten:
                it, them = ("it", "it") if len(unwritten) == 1 else ("they", "them")
                hint = (f"nothing was written in place into {', '.join(unwritten)}: {it} came back exactly as you "
                        f"were given {them}, although p is right (the moments were computed), so the new codes and "
                        "absmax never reached the tensors the caller holds. A new tensor bound to the argument's name inside your function "
                        "is lost when it returns; write the new values INTO the given tensors, in place (copy_ or "
                        "slice assignment), as you did for p.")
            elif pdtype != torch.float32 and _apart_by_rounding(mine, ref, pre, pdtype):
                hint = (f"{pdtype} rounding in the middle of the step: your step is right on the fp32 parameters "
                        f"(the cases before passed), but on {pdtype} parameters p, the codes or the absmax differ from "
                        f"the reference by about {pdtype}'s own rounding, so the arithmetic was done in {pdtype} (the gradient, the parameter or the moments "
                        "not converted to fp32). Compute in fp32 — the gradient, the parameter and the moments converted to "
                        f"float32 — and cast the new p to {pdtype} once, when you write it back.")
            elif torch.equal(mine["p"], pre["p"]) and not torch.equal(ref["p"], pre["p"]):
                # p stuck: rebinding `p = ...`, or an update from the moments before the EMA (0 on step 1)?
                probe = {k: v.clone() for k, v in mine.items()}
                call(adam8bit_step_fn, probe["p"], g.clone(), probe["state1"], probe["state2"], probe["absmax1"],
                     probe["absmax2"], qmap1.clone(), qmap2.clone(), **dict(kw, step=t + 1),
                     may_change=(0, 2, 3, 4, 5))
                if torch.equal(probe["p"], mine["p"]):
                    hint = ("p did not change although the states did: `p = ...` only rebinds the name inside your "
                            "function; write into the parameter with p.copy_(...) (or p[:] = ...).")
                else:
                    hint = _OLD_MOMENTS  # p moves on step 2: the update used m and v from before the EMA
            elif not bool(finite.all()) and _states_kept_where_not_finite(mine, finite, qmap1, qmap2, hp["blocksize"]):
                hint = ("where the gradient is NaN or Inf your m (or v) is not 0 after the step: the non-finite rule "
                        "resets BOTH states there to 0 (and leaves p as it was). Zeroing the gradient alone leaves "
                        "beta1 * m and beta2 * v, and masking p alone leaves the states as they were.")
            elif not bool(finite.all()) and not bool(nan_p.any()) and bool(
                    (~torch.isclose(mine["p"].float(), ref["p"].float(), rtol=1e-5, atol=1e-7) & finite).sum() == 0):
                zeroed = bool((mine["p"].float()[~finite] == 0).all())
                hint = ("only the elements where the gradient is NaN or Inf are wrong" +
                        (" (you set them to 0)" if zeroed else "") +
                        ": there the parameter must stay exactly as it was this step — no Adam update and no "
                        "weight decay either (apply the finite-mask to the whole new value of p, decay included).")
            elif bool(nan_p.any()) and bool((~finite | ~nan_p).all()):
                hint = ("NaN handling is missing: where the gradient is NaN or Inf, reset m and v to 0 and leave the parameter "
                        "unchanged (torch.isfinite(g) gives the mask).")
            else:
                hint = ("dequantize m and v (qmap[state] * absmax of the block), update them and p in fp32 like AdamW, "
                        "then requantize with a fresh absmax per block.")
                found = _step_property(pre, mine, ref, g, qmap1, qmap2, hp["blocksize"], pdtype)
                if found:
                    hint = f"{found}. The rule: {hint}"
                for h, kwv in _STEP_SLIPS:
                    try:
                        if _close(mine, _variant(pre, g, qmap1, qmap2, kw, **kwv), pdtype) is None:
                            hint = h
                            break
                    except Exception:  # noqa: BLE001
                        continue
            a, e = mine[bad], ref[bad]
            if bad.startswith("state"):
                assert_close(a.long(), e.long(), what=f"{what}: {bad} (codes)", hint=hint, rtol=0, atol=0)
            tol = 1e-2 if (bad == "p" and pdtype != torch.float32) else 1e-5
            assert_close(a.float(), e.float(), what=f"{what}: {bad}", hint=hint, rtol=tol, atol=tol * 1e-2)
            fail(f"{what}: {bad} differs from the reference in more codes than rounding explains.", hint)
    passed("Exercise 07.1 · The 8-bit Adam step")


# ---------------------------------------------------------------------------- 07.2
# The parameters of the 07.2 check, and what each one tests (index: shape, role):
_PARAMS = [
    ((64, 128), "an 8192-element weight (8-bit states, 32 blocks)"),
    ((128, 32), "a 4096-element weight (exactly min_8bit_size: 8-bit, the threshold is inclusive)"),
    ((4095,), "a 4095-element tensor (one below min_8bit_size: fp32 states)"),
    ((32,), "a 32-element bias (fp32 states)"),
    ((16,), "a parameter that never gets a gradient"),
    ((65, 100), "a 6500-element weight (8-bit; 6500 is not a multiple of the blocksize 256: a partial last block)"),
    ((5120,), "a 5120-element weight whose FIRST gradient comes at step 2 (its own step count starts then)"),
]
_NEVER, _RAGGED, _LATE = 4, 5, 6


def _optimizer_params(seed: int = 0) -> list[torch.nn.Parameter]:
    """The parameters of :data:`_PARAMS` (the same values on every call)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen) * 0.1) for shape, _ in _PARAMS]


def _groups(params, **overrides):
    first = dict(params=params[:2], lr=1e-2, weight_decay=0.1)
    second = dict(params=params[2:], lr=5e-3, betas=(0.8, 0.99), weight_decay=0.05)
    return [{**first, **overrides}, {**second, **overrides}] if overrides else [first, second]


def _group_spec(**overrides) -> list[dict]:
    """:func:`_groups` with the parameters named by their index in :data:`_PARAMS` (what the driver is sent)."""
    return _groups(list(range(len(_PARAMS))), **overrides)


def _grad_step(gen, step_index: int) -> list:
    """Gradients of one step, one entry per parameter: every parameter but the one that never gets any (None);
    the late one from step 2."""
    out = []
    for i, (shape, _) in enumerate(_PARAMS):
        if i == _NEVER:
            out.append(None)
            continue
        g = torch.randn(shape, generator=gen) * 0.01
        out.append(None if (i == _LATE and step_index == 0) else g)
    return out


def _grads(steps: int, seed: int = 1) -> list[list]:
    """Every step's gradients (:func:`_grad_step`) of a run of ``steps`` steps."""
    gen = torch.Generator().manual_seed(seed)
    return [_grad_step(gen, k) for k in range(steps)]


#: the gradients of the step after a checkpoint's round trip
def _last_step() -> list:
    return _grad_step(torch.Generator().manual_seed(7), 1)


def _step_with(opt, params, grads) -> None:
    for p, g in zip(params, grads):
        p.grad = g
    opt.step()


def _run(make, steps: int, params, *, grad_seed: int = 1):
    opt = make(params)
    for grads in _grads(steps, grad_seed):
        _step_with(opt, params, grads)
    return opt


def _differing(a, b) -> list[int]:
    """Indices of the parameters that differ between two runs."""
    return [i for i, (x, y) in enumerate(zip(a, b)) if not torch.allclose(x.detach(), y.detach(), rtol=1e-4, atol=1e-6)]


def _property_hint(bad: list[int]) -> str | None:
    """Which KIND of parameter went wrong says where to look."""
    roles = {i: _PARAMS[i][1] for i in bad}
    listing = "; ".join(roles.values())
    if bad == [_LATE]:
        return (f"only {_PARAMS[_LATE][1]} is wrong: its bias correction used the wrong step. Count steps PER "
                "PARAMETER in self.state[p] (1 on its own first update), not per call of step() or per optimizer.")
    if bad == [_RAGGED]:
        return (f"only {_PARAMS[_RAGGED][1]} is wrong: the partial last block. num_blocks = ceil(n / blocksize), and "
                "the 8-bit step gets the whole flat tensor (no element dropped, none padded into the parameter).")
    if set(bad) <= {0, 1, _RAGGED, _LATE}:
        return (f"only the 8-bit parameters are wrong ({listing}); the fp32 ones are right: look at the 8-bit path "
                "(fresh codes 127 / 0 and absmax 0 for a new state, the flat views, the step's arguments).")
    if set(bad) <= {2, 3}:
        return (f"only the fp32-state parameters are wrong ({listing}); the 8-bit ones are right: look at the fp32 "
                "AdamW path (its bias correction, eps, weight decay, reading the group's lr and betas).")
    return None


def _reference(params, **overrides):
    from ...optim import Adam8bit

    return Adam8bit(_groups(params, **overrides), backend="torch")


def _same(a, b) -> bool:
    return all(torch.allclose(x.detach(), y.detach(), rtol=1e-4, atol=1e-6) for x, y in zip(a, b))


class _StepRuleAdam8bit(torch.optim.Optimizer):
    """The 07.2 optimizer with a wrong step count: "always_one" (never grows), "global" (one counter
    increased for every parameter of every step) or "per_call" (one counter increased per call of step())."""

    def __init__(self, params, rule: str):
        super().__init__(params, dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0))
        self.rule, self.count = rule, 0
        self.maps = dynamic_map(True), dynamic_map(False)

    @torch.no_grad()
    def step(self):
        from ...adam import adam_step

        calls = getattr(self, "calls", 0) + 1
        self.calls = calls
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    n = p.numel()
                    st.update(_fresh_state(n, 256) if n >= 4096 else
                              dict(exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p)))
                self.count += 1
                st["n"] = st.get("n", 0) + 1
                t = {"always_one": 1, "per_call": calls, "l2_small": st["n"]}.get(self.rule, self.count)
                kw = dict(step=t, lr=group["lr"], eps=group["eps"], weight_decay=group["weight_decay"])
                if "state1" in st:
                    adam8bit_step(p.view(-1), p.grad.view(-1), st["state1"], st["state2"], st["absmax1"],
                                  st["absmax2"], *self.maps, beta1=b1, beta2=b2, blocksize=256, **kw)
                else:
                    adam_step(p, p.grad, st["exp_avg"], st["exp_avg_sq"], betas=(b1, b2),
                              decoupled=self.rule != "l2_small", **kw)


def _crash_hint(text: str) -> str | None:
    """A hint for the usual ways a learner's optimizer crashes in step()."""
    if "NoneType" in text:
        return ("skip parameters whose .grad is None (no update, no state for them): one parameter here never gets "
                "a gradient.")
    sizes = re.search(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)", text)
    if sizes and abs(int(sizes.group(1)) - int(sizes.group(2))) == 1:
        return ("two tensors are one block apart (one per block: the codes' blocks and your absmax): a tensor whose "
                "size is not a multiple of the blocksize (here 6500 = 25 x 256 + 100) has a partial last block with "
                "its own absmax, so there are ceil(n / blocksize) blocks, -(-n // blocksize), not n // blocksize.")
    if re.search(r"\bg must be a flat contiguous 1-D", text):  # the parameter was flat, its gradient not
        return ("flatten the gradient too: the 8-bit step works on flat tensors, and you gave it a flat view of the "
                "parameter but the gradient in the parameter's own shape — pass p.view(-1) AND p.grad.view(-1).")
    if "must match the size" in text or "flat contiguous 1-D" in text:
        return ("the 8-bit step works on flat 1-D tensors, and a tensor of another shape reached it: give it flat "
                "views of BOTH the parameter and its gradient (p.view(-1) and p.grad.view(-1)) — the gradient has "
                "the parameter's shape, and the states are flat.")
    if re.search(r"'(dict|list)' object has no attribute '(grad|numel|view|data|shape|dtype|add_|copy_|mul_)'", text) \
            or re.search(r"object has no attribute '(param_groups|state|defaults)'", text):
        return ("your optimizer met a dict (or a list) where it expected a parameter: the check hands it param GROUPS, "
                "a list of dicts each with its own 'params' and lr. Call super().__init__(params, defaults) in "
                "__init__: torch.optim.Optimizer builds self.param_groups from params and defaults (a plain list of "
                "tensors becomes one group; each group dict gets the settings it does not give from defaults) and "
                "creates the per-parameter state.")
    if "absmax" in text and "must have" in text:
        return ("a tensor whose size is not a multiple of the blocksize (here 6500 = 25 x 256 + 100) has a partial "
                "last block, and it needs its own absmax: the partial last block counts, number of blocks = "
                "ceil(n / blocksize), -(-n // blocksize).")
    if ("step" in text and "got 0" in text) or "ZeroDivisionError" in text:
        return ("the first update ran with step = 0 (1 - beta1**0 = 0 divides by zero): increase the count BEFORE "
                "the update, so the first step is step 1.")
    return None


def _named(fn, name: str):
    """``fn`` under ``name`` (the learner's class or function), so that :func:`call` reports a stub or an exception
    as theirs."""
    fn.__name__ = fn.__qualname__ = str(name)
    return fn


def _replay(record, name: str, result=None):
    """A function named ``name`` that raises again what a driver recorded (:func:`attempt`) — the learner's
    exception, where it happened — or returns ``result``: :func:`call` then reports it as it reports a call."""

    def replay(*args, **kwargs):
        if record is not None:
            reraise(record)
        return result

    return _named(replay, name)


def _shapes_kept(name: str, got: list, before: list) -> None:
    """The driver's parameters are the check's, in number and shape (an optimizer updates them in place)."""
    if len(got) != len(before):
        fail(f"{name}: {len(got)} parameters came back from {len(before)}", "update the parameters in place.")
    for i, (a, b) in enumerate(zip(got, before)):
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            fail(f"{name}: parameter #{i} ({_PARAMS[i][1]}) became {a.dtype} of shape {tuple(a.shape)}, was "
                 f"{b.dtype} of shape {tuple(b.shape)}",
                 "update each parameter in place (p.copy_(...), or through p.view(-1)): its shape and dtype stay.")


def check_adam8bit_optimizer(optimizer_class) -> None:
    """``optimizer_class(params_or_groups, lr, betas, eps, weight_decay, blocksize=256, min_8bit_size=4096)``."""
    require_callable(optimizer_class, "the optimizer class")
    name = getattr(optimizer_class, "__name__", "your optimizer")
    before = [p.detach().clone() for p in _optimizer_params()]
    try:
        def three_steps_of_your_optimizer():  # built and stepped by the course's driver, on this check's scenario
            return drive(optimizer_class, _drivers.step_optimizer, _group_spec(), before, _grads(3))

        ran = call(three_steps_of_your_optimizer)
    except AssertionError as err:
        hint = _crash_hint(str(err))
        if hint is None:
            raise
        refail(err, hint)
    if not ran["optimizer"]:
        fail(f"{name}(...) is a {ran['type']}", "subclass torch.optim.Optimizer and call super().__init__(params, defaults).")
    params, states = ran["params"], ran["states"]
    _shapes_kept(name, params, before)
    if not torch.equal(params[_NEVER], before[_NEVER]):
        fail(f"{name}: a parameter without a gradient changed", "skip parameters whose .grad is None.")
    if not states[_NEVER]["empty"]:
        fail(f"{name}: a parameter that never got a gradient has a state",
             "create a parameter's state on its first step, in step() (`if not state: ...`), not in __init__: a "
             "parameter that never gets a gradient has no state.")
    for i, (p, kind) in enumerate(zip(before, ("8-bit", "8-bit", "fp32", "fp32", None, "8-bit", "8-bit"))):
        if kind is None:
            continue
        tensors = [t for t in states[i]["tensors"] if t["numel"] > 1]
        has_codes = any(t["dtype"] == torch.uint8 and t["numel"] == p.numel() for t in tensors)
        if kind == "8-bit" and not has_codes:
            if p.numel() == 4096:
                hint = ("min_8bit_size is inclusive: a tensor with n >= min_8bit_size elements (4096 too) gets 8-bit "
                        "states")
            elif states[i]["empty"]:
                hint = ("self.state[p] is empty: keep the two states of a large tensor as uint8 codes (+ fp32 absmax "
                        "per block) in self.state[p] — state_dict() saves only that, not attributes of your own.")
            elif p.dim() > 1 and p.shape[0] < 4096 and tensors:
                hint = (f"count elements with p.numel() ({' x '.join(map(str, p.shape))} = {p.numel()}), not len(p) "
                        "or p.shape[0]: the rule is about the number of elements.")
            else:
                hint = "keep the two states of a large tensor as uint8 codes (+ fp32 absmax per block) in self.state[p]."
            fail(f"{name}: the {p.numel()}-element parameter has no uint8 codes in its state", hint)
        if kind == "fp32" and (has_codes or not any(t["dtype"] == torch.float32 and tuple(t["shape"]) == tuple(p.shape)
                                                    for t in tensors)):
            fail(f"{name}: the {p.numel()}-element parameter should keep fp32 states exp_avg/exp_avg_sq",
                 "you gave this small tensor 8-bit states: tensors with fewer than min_8bit_size elements keep fp32 "
                 "states (and the plain fp32 Adam update).")
    ref_params = _optimizer_params()
    _run(_reference, 3, ref_params)
    if not _same(params, ref_params):
        own = ran["defaults"]  # the learner's optimizer's defaults, as plain data
        variants = [
            ("every group stepped with the optimizer's defaults: read lr, betas, eps and weight_decay from each "
             "param group (group['lr'], group['betas'], …) inside step(), not from self.defaults — a group may set "
             "its own.", own),
            ("read lr, betas, eps and weight_decay from each param group (group['lr'], group['betas'], …), not from the defaults.",
             dict(lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0)),
            ("no weight decay was applied: apply each group's weight_decay (decoupled: p *= 1 - lr * weight_decay, "
             "inside the step).", dict(weight_decay=0.0)),
        ]
        groups = _group_spec()
        for key in ("lr", "betas", "eps", "weight_decay"):  # ONE setting read from self.defaults, the rest right
            if key == "weight_decay" and own.get(key) == 0:
                continue  # the same parameters as no decay at all: the "no weight decay" hint below names that
            if key in own and any(g.get(key, own[key]) != own[key] for g in groups):
                theirs = ", ".join(str(g[key]) for g in groups if key in g)
                variants.insert(0, (
                    f"the groups' parameters moved with {key}={own[key]} (your optimizer's default) instead of their "
                    f"own group's {key} ({theirs}): read lr, betas, eps, weight_decay from each param group "
                    f"(group['{key}']), not from self.defaults — each group sets its own.", {key: own[key]}))
        for hint, kw in variants:
            alt = _optimizer_params()
            try:
                _run(lambda ps, kw=kw: _reference(ps, **kw), 3, alt)
            except Exception:  # noqa: BLE001 - defaults the library refuses: not this mistake
                continue
            if _same(params, alt):
                fail(f"{name}: parameters after 3 steps differ from adam8lib.optim.Adam8bit", hint)
        for hint, rule in [
            ("the step count stays at 1: it must grow, 1, 2, 3 … per parameter (kept in its state, increased before "
             "each update), or the bias correction keeps dividing as if every step were the first.", "always_one"),
            ("you keep one counter for all parameters (increased for every tensor): each parameter needs its own "
             "count in self.state[p]['step'], 1 on its first update.", "global"),
            ("you count calls of step() (one counter for the optimizer), not updates of each parameter: a parameter "
             "whose first gradient comes at step 2 then starts its bias correction at 2. Keep the count in "
             "self.state[p]['step'], 1 on that parameter's own first update.", "per_call"),
            ("the small tensors (fp32 states) got L2 weight decay, added to the gradient (Adam's coupled rule, "
             "`decoupled=False`), while the 8-bit path decays the weights directly: both paths must use AdamW's "
             "DECOUPLED decay, p *= 1 - lr * weight_decay.", "l2_small"),
        ]:
            alt = _optimizer_params()
            _run(lambda ps, rule=rule: _StepRuleAdam8bit(_groups(ps), rule), 3, alt)
            if _same(params, alt):
                fail(f"{name}: parameters after 3 steps differ from adam8lib.optim.Adam8bit", hint)
        bad = _differing(params, ref_params)
        which = "; ".join(f"#{i} {_PARAMS[i][1]}" for i in bad)
        hint = _property_hint(bad)
        if hint is not None:
            fail(f"{name}: after 3 steps these parameters differ from adam8lib.optim.Adam8bit: {which}", hint)
        fail(f"{name}: after 3 steps these parameters differ from adam8lib.optim.Adam8bit: {which} (groups with "
             "different lr, betas, weight_decay; 8-bit and fp32 tensors)",
             "keep a step count per parameter in self.state[p] and increase it before each update (bias correction "
             "uses it); call the 8-bit step on flat views p.view(-1), p.grad.view(-1) and write into the state in place.")
    # state_dict round trip (by the course's driver): two steps, save, load into a fresh optimizer, one more step on
    # both; and the same two steps and one more with the reference, here
    start = [p.detach().clone() for p in _optimizer_params()]
    trip = drive(optimizer_class, _drivers.checkpoint_run, _group_spec(), start, _grads(2), _last_step())
    if trip["load_error"] is not None:
        call(_replay(trip["load_error"], "load_state_dict"))
    raised = trip.get("step_error")
    if raised is not None:
        fail(f"{name}: after load_state_dict() into a new optimizer your step() raised {raised['type']}: "
             f"{raised['text']}",
             "everything step() needs must be in self.state[p] (or built in __init__): a new optimizer that loads a "
             "checkpoint gets only the param groups and self.state back, never attributes set during earlier steps.")
    _shapes_kept(name, trip["a"], start)
    _shapes_kept(name, trip["b"], start)
    if not _same(trip["a"], trip["b"]):
        fail(f"{name}: after state_dict() / load_state_dict() the next step differs from the original optimizer's",
             "keep every state (codes, absmax, fp32 moments, the step count) in self.state[p]: that is what "
             "state_dict() saves; attributes of your own (self.codes = {...}) are lost.")
    ref_params = _optimizer_params()
    _step_with(_run(_reference, 2, ref_params), ref_params, _last_step())
    if not _same(trip["b"], ref_params):
        fail(f"{name}: after two steps, a checkpoint and one more step the parameters differ from "
             "adam8lib.optim.Adam8bit's", "step() must depend only on the parameters, their gradients, the param "
             "groups and self.state[p]: run twice on the same inputs, your optimizer must give the same result.")
    passed("Exercise 07.2 · The Adam8bit optimizer")


# ---------------------------------------------------------------------------- 07.3
class _Foreign:
    """A value of the learner's answer that is not plain data: only its type's name and repr crossed."""

    def __init__(self, described: dict):
        self.kind, self.shown = str(described.get("kind")), str(described.get("repr"))

    def __repr__(self) -> str:
        return self.shown


def _answer(described: dict | None):
    """The learner's value as a driver described it (:func:`~adam8lib.course.grading.drivers.described`)."""
    if described is None:
        return None
    return described["plain"] if "plain" in described else _Foreign(described)


def _moves(table_shape=(1000, 64), dim: int = 64) -> dict:
    """What a few optimizer steps do to the embedding: the table moved a little, the LayerNorm's scale and shift
    away from 1 and 0 (sent to the driver, which applies them; this check computes what the module must give)."""
    gen = torch.Generator().manual_seed(73)
    return {"table": torch.randn(table_shape, generator=gen) * 0.05,
            "scale": 1.0 + torch.randn(dim, generator=gen) * 0.5, "shift": torch.randn(dim, generator=gen) * 0.5}


def check_stable_embedding(stable_embedding_class) -> None:
    """``StableEmbedding(num_embeddings, embedding_dim)``: xavier-uniform Embedding + LayerNorm, 32-bit optimizer states."""
    require_callable(stable_embedding_class, "StableEmbedding")
    name = getattr(stable_embedding_class, "__name__", "StableEmbedding")
    x = torch.tensor([[1, 5, 999], [0, 0, 42]])
    moves = _moves()
    # built (torch.manual_seed(0)), run, moved and run again, trained by bitsandbytes: by the course's driver
    ran = drive(stable_embedding_class, _drivers.embedding_run, x, moves)
    call(_replay(ran["build_error"], name), 1000, 64)
    if "table" not in ran:
        emb_kind, norm_kind = ran["parts"]
        fail(f"StableEmbedding has embedding={emb_kind}, norm={norm_kind}",
             "keep the table in self.embedding (an nn.Embedding) and the LayerNorm in self.norm.")
    w, scale, shift, eps = ran["table"], ran["scale"], ran["shift"], ran["eps"]
    if tuple(w.shape) == (64, 1000):
        fail("self.embedding.weight has shape (64, 1000), expected (1000, 64)",
             "you swapped the arguments: nn.Embedding(num_embeddings, embedding_dim) has one row of embedding_dim "
             "values per token.")
    if tuple(ran["normalized_shape"]) != (64,):
        fail(f"self.norm normalises over {tuple(ran['normalized_shape'])}, expected (64,)",
             "the LayerNorm normalises each embedding VECTOR: nn.LayerNorm(embedding_dim), not num_embeddings.")
    bound = math.sqrt(6.0 / (1000 + 64))
    std_ratio = w.std().item() * math.sqrt(3) / bound
    if w.abs().max() > bound * 1.0001 or not (0.9 < std_ratio < 1.1):
        std, top, mean = w.std().item(), w.abs().max().item(), w.mean().item()
        # a uniform draw on [-b, b] has std b / sqrt(3), so max |w| ~ sqrt(3) std; a normal's max over 64,000
        # values lies near 4.4 std
        uniform = std > 0 and top < 2.2 * std
        if std > 0 and abs(mean) > 0.2 * std:
            hint = (f"your values are not centred on 0 (mean {mean:.4f}, std {std:.4f}): xavier-uniform draws "
                    f"from -bound to +bound, bound = sqrt(6 / (num_embeddings + embedding_dim)) = {bound:.4f}.")
        elif uniform:
            which = {"num_embeddings": math.sqrt(6.0 / 1000), "embedding_dim": math.sqrt(6.0 / 64),
                     "num_embeddings * embedding_dim": math.sqrt(6.0 / (1000 * 64))}
            named = next((k for k, b in which.items() if math.isclose(top, b, rel_tol=0.02)), None)
            hint = ("your table is drawn uniformly but not within xavier's bound, which uses BOTH dimensions of the "
                    f"table, rows plus columns (fan_in + fan_out): max |w| {top:.4f} is about sqrt(3) times the std, "
                    f"as for a uniform draw, so your bound is {top:.4f}, where xavier's is "
                    f"sqrt(6 / (num_embeddings + embedding_dim)) = sqrt(6 / 1064) = {bound:.4f}" +
                    (f"; yours is sqrt(6 / {named})." if named else "."))
        elif 0.9 < std_ratio < 1.1:
            hint = ("the std is right but values reach past the bound: that is a NORMAL initialisation "
                    f"(xavier_normal_?) — max |w| is {top / std:.1f} times the std, where a uniform draw stops at "
                    "sqrt(3) = 1.7 times it. The paper's layer draws uniformly, within xavier's bound "
                    "(nn.init's xavier_uniform_, not xavier_normal_).")
        elif 0.9 < w.std().item() < 1.1:
            hint = ("the table still has nn.Embedding's default init N(0, 1): call "
                    "the paper's table is drawn xavier-uniform in __init__ (nn.init's xavier_uniform_ on the table).")
        else:
            hint = ("your table's spread is neither xavier-uniform's nor nn.Embedding's default N(0, 1): the table is "
                    f"drawn uniformly within +-sqrt(6 / (num_embeddings + embedding_dim)) = +-{bound:.4f} "
                    "(nn.init's xavier_uniform_).")
        fail(f"embedding weights: std {w.std().item():.4f}, max |w| {w.abs().max().item():.3f}; "
             f"xavier-uniform gives std {bound / math.sqrt(3):.4f}, |w| <= {bound:.3f}", hint)
    if scale is None or shift is None:
        fail(f"self.norm has weight={_short_param(scale)}, bias={_short_param(shift)}: it cannot learn a "
             "scale and shift", "you built the LayerNorm without its affine parameters (elementwise_affine=False or "
             "bias=False): the stable embedding's LayerNorm learns a per-feature scale and shift, the nn.LayerNorm "
             "default.")
    if ran["frozen"]:
        fail(f"StableEmbedding: {', '.join(ran['frozen'])} has requires_grad=False",
             "you froze part of the layer (requires_grad=False, or requires_grad_(False)): an optimizer never "
             "updates a frozen parameter, but the paper's layer trains its table AND its LayerNorm's scale and "
             "shift. Leave every parameter trainable.")
    if ran["missing"]:
        fail(f"StableEmbedding.parameters() does not list {', '.join(ran['missing'])}",
             "a parameter the module does not register (kept in a plain list/dict, or a tensor that is not an "
             "nn.Parameter) is invisible to module.parameters(), so no optimizer trains it.")
    out = call(_replay(ran["forward_error"], name, _answer(ran["output"])), x)
    want = torch.nn.functional.layer_norm(w[x], (64,), scale, shift, eps)
    if isinstance(out, torch.Tensor) and out.shape != want.shape:
        fail(f"StableEmbedding(x) for x of shape {tuple(x.shape)} has shape {tuple(out.shape)}, expected "
             f"{tuple(want.shape)}", "one embedding_dim vector per token id: look up all of x (any shape) and normalise "
                                     "over the LAST dimension only.")
    if isinstance(out, torch.Tensor) and out.shape == want.shape and torch.allclose(out, w[x]):
        fail("StableEmbedding(x) returns the looked-up vectors unchanged", "apply self.norm to the looked-up vectors.")
    if isinstance(out, torch.Tensor) and out.shape == want.shape and \
            torch.allclose(out, torch.nn.functional.normalize(w[x], dim=-1), atol=1e-6):
        fail("StableEmbedding(x) has vectors of length 1",
             "that is L2 normalisation (F.normalize): apply the LayerNorm self.norm, which subtracts each vector's "
             "mean, divides by its std, then scales and shifts.")
    if isinstance(out, torch.Tensor) and out.shape == want.shape:
        _wrong_dimension(out, w[x], scale, shift, eps)
    assert_close(out, want, what="StableEmbedding(x)", hint=_FORWARD_RULE)
    _check_trained(ran, name, x, moves, eps)
    _check_override(ran, name)
    passed("Exercise 07.3 · The stable embedding")


#: what 07.3's forward must give, as a property (the hint when no known mistake matches)
_FORWARD_RULE = ("your output differs: the layer norm of each looked-up vector — over the LAST dimension, the "
                 "embedding_dim values of one token — with self.norm's weight and bias.")


def _wrong_dimension(out, looked_up, scale, shift, eps) -> None:
    """Fail when the output is a layer norm of the looked-up vectors over another dimension than the last."""
    for d in range(looked_up.dim() - 1):
        mean = looked_up.mean(dim=d, keepdim=True)
        var = looked_up.var(dim=d, keepdim=True, unbiased=False)
        for normed in ((looked_up - mean) / (var + eps).sqrt(), (looked_up - mean) / looked_up.std(dim=d, keepdim=True)):
            if torch.allclose(out, normed * scale + shift, atol=1e-4) or torch.allclose(out, normed, atol=1e-4):
                fail(f"StableEmbedding(x) for x of shape {tuple(looked_up.shape[:-1])}: your output is normalised "
                     f"over dimension {d} (across tokens), not over each looked-up vector",
                     f"you normalised over dimension {d} of the looked-up tensor of shape {tuple(looked_up.shape)}: "
                     "a layer norm normalises each token's vector on its own, over the LAST dimension (its "
                     "embedding_dim values).")


def _short_param(t) -> str:
    return "None" if t is None else f"a tensor of shape {tuple(t.shape)}"


def _check_trained(ran: dict, name: str, x, moves: dict, eps: float) -> None:
    """After training, the output must follow the module's CURRENT parameters (table, scale, shift): the driver
    moved them by ``moves``; what the module must give is computed here from the table it had and the moves."""
    if "trained_error" not in ran:  # the driver could not move a table of another shape (a check above says so)
        fail(f"StableEmbedding: self.embedding.weight has shape {tuple(ran['table'].shape)}, expected (1000, 64)",
             "nn.Embedding(num_embeddings, embedding_dim): one row of embedding_dim values per token.")
    w, scale, shift = ran["table"] + moves["table"], moves["scale"], moves["shift"]
    out = call(_replay(ran["trained_error"], name, _answer(ran["trained"])), x)
    want = torch.nn.functional.layer_norm(w[x], (w.shape[1],), scale, shift, eps)
    if not isinstance(out, torch.Tensor) or out.shape != want.shape:
        assert_close(out, want, what="StableEmbedding(x) after training", hint=_FORWARD_RULE)
    plain = torch.nn.functional.layer_norm(w[x], (w.shape[1],), None, None, eps)
    what = "StableEmbedding(x) after training (self.norm.weight != 1, self.norm.bias != 0, the table moved)"
    if torch.allclose(out, plain, atol=1e-5):
        fail(f"{what} ignores the LayerNorm's scale and shift",
             "your forward normalises without self.norm's weight and bias (F.layer_norm without them, or a "
             "hand-written (x - mean) / std): the untrained scale 1 and shift 0 hid it; once trained they matter. "
             "Call self.norm itself.")
    if torch.allclose(out, scale * plain, atol=1e-5) or torch.allclose(out, plain + shift, atol=1e-5):
        fail(f"{what} uses only one of the LayerNorm's scale and shift",
             "your normalisation applies self.norm.weight or self.norm.bias but not both: call self.norm itself.")
    if not ran["trained_grad"]:
        fail(f"{what} carries no gradient",
             "the output is detached (torch.no_grad(), .detach() or .data in forward): the table and the LayerNorm "
             "could not learn.")
    assert_close(out, want, what=what,
                 hint="the output does not follow the module's current parameters: compute it from self.embedding and "
                      "self.norm in forward every call (no copy of the table or of the LayerNorm taken in __init__).",
                 atol=1e-5, rtol=1e-5)


def _check_override(ran: dict, name: str) -> None:
    """bitsandbytes' Adam8bit keeps the learner's embedding table in 32-bit states (trained one step by the driver)."""
    found = ran.get("override") or {"bnb": False}
    if not found["bnb"]:  # no bitsandbytes: the 32-bit override cannot be checked here
        return
    if found["error"] is not None:
        reraise(found["error"])
    if found["attribute_error"] is not None:  # a registered (module, name) pair that is not a parameter
        fail(f"bitsandbytes' Adam8bit could not apply your override: {found['attribute_error']}",
             "register the table itself: the override names a module and the name of ITS parameter (the "
             "nn.Embedding and its 'weight'), not a module without that parameter.")
    if found["dtype"] is None:
        fail("bitsandbytes' Adam8bit gave the embedding's table no state: no gradient reached self.embedding.weight",
             "forward must look up self.embedding itself (no copy of the table taken in __init__).")
    if found["dtype"] != torch.float32:
        what = f"bitsandbytes' Adam8bit keeps the embedding's state as {found['dtype']}"
        if not found["registered"]:
            fail(what, "you did not register the table for 32-bit states: the table's state is still 8-bit, as "
                       "bitsandbytes gives every large tensor unless its GlobalOptimManager holds an override for "
                       "THIS parameter (self.embedding's weight), registered in __init__ (register_module_override).")
        configs = found.get("configs") or []
        if configs and not any(c.get("optim_bits") == 32 for c in configs):
            shown = ", ".join(repr(c) for c in configs)
            fail(what, f"the table's state is still {found['dtype']}: your override is registered for the table, but "
                       f"its config {shown} does not ask bitsandbytes for 32-bit states — which key (and value) "
                       "does the manager read for the number of bits of a parameter's states?")
        fail(what, "your override is registered for the table, yet its state is not 32-bit: the manager must hold it "
                   "before the optimizer is built (register it in __init__), with the config that asks for 32-bit "
                   "states.")


# ---------------------------------------------------------------------------- 07.4
#: the full-batch training loop of :func:`mlp_task` (the course's, in the drivers: the same loop trains the learner's
#: optimizer in the learner's process and the references here)
_train = _drivers.train_losses


def train_side_by_side(optimizer_class, steps: int = 200, lr: float = 1e-2) -> dict[str, list[float]]:
    """Losses of :func:`mlp_task`'s MLP trained with ``optimizer_class(params, lr=lr)`` (by the course's driver) and
    with ``torch.optim.Adam(params, lr=lr)`` (same data, same initial weights, full batch)."""
    require_callable(optimizer_class, "the optimizer class")
    name = getattr(optimizer_class, "__name__", "your optimizer")
    yours = call(_named(lambda: drive(optimizer_class, _drivers.train_with, steps, lr), name))
    if type(yours) is not list or len(yours) != steps or not all(type(v) is float for v in yours):
        fail(f"{name}: training with it gave no list of {steps} losses", "train with your optimizer in the notebook.")
    return {name: yours, "torch.optim.Adam": _train(lambda ps: torch.optim.Adam(ps, lr=lr), steps)}


def _curve_property(got: list[float], want: list[float], rule: str) -> str:
    """How a loss curve differs from the reference loop's: its first point, a factor, a shift, where it departs."""
    from ._properties import describe

    if len(got) != len(want):
        return f"your curve has {len(got)} losses for {len(want)} steps: one loss per step. The rule: {rule}"
    found = describe(torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64),
                     rtol=1e-4, atol=1e-7)
    if found and not any(w in found for w in ("times the expected", "half the expected", "twice the expected",
                                               "moved one position", "shifted by a constant")):
        found = None  # losses are positive: "right sign, wrong size" says nothing about a curve
    if not math.isclose(got[0], want[0], rel_tol=1e-4, abs_tol=1e-7):
        where = (f"already the first loss differs ({got[0]:.6g}, the untrained model on the whole batch gives "
                 f"{want[0]:.6g}): the loss itself is computed otherwise — on other points than all 256, or not as "
                 "the mean squared error of an output shaped like y")
    else:
        k = next(i for i, (a, b) in enumerate(zip(got, want)) if not math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-7))
        where = (f"the first {k} losses are right, from step {k + 1} on they differ: the loss is right, the "
                 "UPDATE between steps is not (the gradients, the optimizer, zero_grad)")
    return f"{where}{'; ' + found if found else ''}. The rule: {rule}"


#: what 07.4's loop must do, as properties (the hint's rule when no known mistake matches)
_TRAIN_RULE = ("one loss per update, recorded before that update, as a Python float; every step on the WHOLE batch "
               "(all 256 points); the loss is the mean squared error of the model's output, of y's shape (256, 1), "
               "against y; each step's gradient from that step's loss alone; one optimizer for the whole run, over "
               "the model's parameters with train's lr.")


def _check_lr_passed(train_fn, lr: float = 3e-3, steps: int = 5) -> None:
    """A few steps at another lr than the check's 1e-2: train's lr must reach the optimizer (a hard-coded 1e-2 gives
    the same curve at every lr)."""
    got = call(_named(lambda optimizer_class, steps, lr: drive(train_fn, _drivers.train_run, "torch.optim.Adam", steps,
                                                               lr), getattr(train_fn, "__name__", "train")),
               torch.optim.Adam, steps=steps, lr=lr)
    curve = [float(v) for v in got.get("values") or []] if got.get("numbers") else []
    want = _train(lambda ps: torch.optim.Adam(ps, lr=lr), steps)
    if len(curve) == steps and all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-7) for a, b in zip(curve, want)):
        return
    at_check_lr = _train(lambda ps: torch.optim.Adam(ps, lr=1e-2), steps)
    if len(curve) == steps and all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-7) for a, b in zip(curve, at_check_lr)):
        hint = (f"train(..., lr={lr:g}) gave the curve of lr=1e-2: the learning rate is fixed inside your train, "
                "so the lr it is given never reaches the optimizer — build the optimizer with train's lr.")
    else:
        hint = _curve_property(curve, want, _TRAIN_RULE)
    fail(f"train(torch.optim.Adam, steps={steps}, lr={lr:g}) gave {curve[:3]}...; the reference loop at lr={lr:g} "
         f"gives {[round(v, 6) for v in want[:3]]}...", hint)


def check_trains_like_adam(train_fn, optimizer_class) -> None:
    """``train_fn(optimizer_class, steps=200, lr=1e-2)`` must give the reference loop's losses with
    torch.optim.Adam; trained 200 steps, ``optimizer_class``'s final loss must be at most 2x that of
    torch.optim.Adam + 0.001."""
    require_callable(train_fn, "train")
    require_callable(optimizer_class, "the optimizer class")
    want_curve = _train(lambda ps: torch.optim.Adam(ps, lr=1e-2), 20)
    # the learner's train() run with torch.optim.Adam by the course's driver: its answer, described as plain data
    got = call(_named(lambda optimizer_class, steps, lr: drive(train_fn, _drivers.train_run, "torch.optim.Adam", steps,
                                                               lr), getattr(train_fn, "__name__", "train")),
               torch.optim.Adam, steps=20, lr=1e-2)
    if got["none"]:
        fail("train(torch.optim.Adam, steps=20) returned None", "return the list of losses.")
    if got["tensor"] or not got["sequence"]:
        fail(f"train(torch.optim.Adam, steps=20) returned a {got['type']}, expected a list of 20 floats",
             "the answer is a list with one Python float per step, the loss of that step: return the list.")
    tensor = got["first_tensor"]
    if tensor is not None:
        graph = " and keeps its autograd graph alive (memory grows every step)" if tensor["requires_grad"] else ""
        fail(f"train(...) recorded {tensor['type']}s of shape {tuple(tensor['shape'])} per step, not floats",
             f"you appended the loss tensor itself: a tensor per step is not a number{graph}; record its value as a "
             "Python float (.item()).")
    if not got["numbers"]:
        fail(f"train(...) recorded values of type {got['kinds']} per step, expected float",
             "record one Python float per step: the value of the loss you backpropagate.")
    if got.get("course_loops"):
        fail("train(torch.optim.Adam, steps=20) ran the course's own training loop (the grader's "
             "adam8lib.course.grading.drivers.ex07.train_losses), not a loop of its own",
             "07.4 asks for your loop: write it in train() from the task's properties.", prop="your own loop")
    got_curve = [float(v) for v in got["values"]]
    def same(curve, reference):
        return len(curve) == len(reference) and all(
            math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-7) for a, b in zip(curve, reference))

    if not same(got_curve, want_curve):
        hint = _TRAIN_RULE
        adam = lambda ps: torch.optim.Adam(ps, lr=1e-2)  # noqa: E731
        broadcast = _train(adam, 20, shape="broadcast")
        if len(got_curve) != 20 and same(got_curve[:20], want_curve):
            hint = (f"take `steps` steps: the check called train(..., steps=20) and got {len(got_curve)} losses "
                    "(the number of steps is train's argument, not a fixed number).")
        elif got_curve and math.isclose(got_curve[0], broadcast[0], rel_tol=1e-4, abs_tol=1e-7):
            hint = (f"the model's output and y have different shapes, which mse_loss broadcast: your first loss "
                    f"{got_curve[0]:.6g} is the mean over every output paired with EVERY target — an output of "
                    "shape (256,) against y of shape (256, 1), or the reverse, becomes a 256 x 256 table (torch "
                    "warns about it). The loss compares each "
                    "output with its own target: the output must have y's shape, (256, 1).")
        elif any(n != 256 for n in got.get("batches", [])):
            sizes = ", ".join(str(n) for n in got["batches"])
            first = (f", and your first loss {got_curve[0]:.6g} is not the whole batch's {want_curve[0]:.6g}"
                     if got_curve else "")
            hint = (f"your model was run on batches of {sizes} points (the task has 256){first}: each step's loss "
                    "came from a selection of the points (mini-batches). This task trains on the WHOLE batch: every step's loss "
                    "is the mean squared error over all 256 points, so that the curve compares optimizers, not "
                    "draws of data.")
        else:
            for h, make in [
                ("you recorded the loss AFTER opt.step(): each recorded loss must be the loss you backpropagate, "
                 "taken before the step that follows it (the first entry is the untrained model's loss).",
                 lambda: _train(adam, 20, record="after")),
                ("pass lr to the optimizer: your curve is the one of the optimizer's DEFAULT learning rate — the "
                 "optimizer must be built with train's lr.", lambda: _train(lambda ps: torch.optim.Adam(ps), 20)),
                ("the gradients add up across steps: backward() adds into .grad, so they must be cleared every "
                 "step, before backward (opt.zero_grad()).", lambda: _train(adam, 20, zero="none")),
                ("you zeroed the gradients between backward() and step(): the step then sees no gradient. Clear "
                 "them before backward instead.", lambda: _train(adam, 20, zero="between")),
                ("build the optimizer ONCE, before the loop: a new optimizer every step forgets m, v and the step "
                 "count.", lambda: _train(adam, 20, fresh_optimizer=True)),
                ("you summed the squared errors: the loss is their MEAN (mse_loss's default reduction).",
                 lambda: _train(adam, 20, reduction="sum")),
            ]:
                if same(got_curve, make()):
                    hint = h
                    break
            else:
                hint = _curve_property(got_curve, want_curve, hint)
        fail(f"train(torch.optim.Adam, steps=20) gave {len(got_curve)} losses {got_curve[:3]}...; the reference loop "
             f"gives 20: {[round(v, 6) for v in want_curve[:3]]}...", hint)
    _check_lr_passed(train_fn)
    curves = train_side_by_side(optimizer_class)
    (name, yours), (_, ref) = curves.items()
    first, last, want = yours[0], yours[-1], ref[-1]
    if not all(math.isfinite(v) for v in yours):
        bad = next(v for v in yours if not math.isfinite(v))
        fail(f"{name}: the loss became {bad} (not finite) during training (torch.optim.Adam: {want:.3g})",
             "a v that rounds to 0 makes the update m / eps (keep_sign=True for both states); check eps is added "
             "after the square root and the bias correction divides (not multiplies) m and v.")
    if last > 0.9 * first:
        fail(f"{name}: the loss went from {first:.3g} to {last:.3g} in 200 steps; torch.optim.Adam reached {want:.3g}",
             "the optimizer does not learn: does step() write into the parameters in place (a view of p shares "
             "its storage, a new tensor bound to the name p does not) and subtract the update, not add it? Do "
             "parameters with a gradient get a state and a step?")
    if last > 2 * want + 0.001:
        fail(f"{name}: final loss {last:.3g} after 200 steps, torch.optim.Adam {want:.3g} (allowed: up to "
             f"{2 * want + 0.001:.3g})",
             "it learns, but more slowly than Adam: the bias correction (1 - beta**step, step counted per parameter "
             "from 1), lr read from the param group, sqrt(v) in the denominator, and requantizing with a fresh "
             "absmax every step.")
    passed("Exercise 07.4 · Training with your optimizer")
