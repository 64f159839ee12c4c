"""Checks for workbook 07 · the 8-bit Adam step (dequantize -> update in fp32 -> requantize)."""

from __future__ import annotations

import math

import torch

from ...kernels.reference import adam8bit_step
from ...quant import dequantize_blocks, dynamic_map, nearest_code, num_blocks, quantize_blocks
from ._common import assert_close, call, fail, passed, require_callable

__all__ = ["check_adam8bit_step"]

_FIELDS = ("p", "state1", "state2", "absmax1", "absmax2")


def _fresh_state(n: int, blocksize: int) -> dict[str, torch.Tensor]:
    nb = num_blocks(n, blocksize)
    return {"state1": torch.full((n,), 127, dtype=torch.uint8), "state2": torch.zeros(n, dtype=torch.uint8),
            "absmax1": torch.zeros(nb), "absmax2": torch.zeros(nb)}


def _variant(pre, g, qmap1, qmap2, hp, *, keep_sign=True, keep_sign_v=True, bias=True, nan_rule=True,
             fresh_absmax=True, decay_on_m=False, swap_maps=False):
    """One 8-bit step with one deliberate mistake (plain fp32 maths, no chunks)."""
    bs, t = hp["blocksize"], hp["step"]
    b1, b2, lr, eps, wd = hp["beta1"], hp["beta2"], hp["lr"], hp["eps"], hp["weight_decay"]
    map_m, map_v = (qmap2, qmap1) if swap_maps else (qmap1, qmap2)
    m = dequantize_blocks(pre["state1"], pre["absmax1"], map_m, bs)
    v = dequantize_blocks(pre["state2"], pre["absmax2"], map_v, bs)
    p = pre["p"].float()
    grad = g.float()
    if decay_on_m and wd:
        grad = grad + wd * p
    finite = torch.isfinite(grad)
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad * grad
    if nan_rule:
        m, v = m.masked_fill(~finite, 0.0), v.masked_fill(~finite, 0.0)
    new = p * (1 - lr * wd) if (wd and not decay_on_m) else p.clone()
    c1, c2 = (1 - b1**t, math.sqrt(1 - b2**t)) if bias else (1.0, 1.0)
    new = new - lr / c1 * m / (v.sqrt() / c2 + eps)
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
        ("tiny negative gradients next to a large one", 512, torch.float32, dict(base, blocksize=128),
         {1: tiny, 2: tiny}, 2),
        ("NaN and Inf gradient elements", 512, torch.float32, dict(base, blocksize=128), {2: nan}, 2),
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
                 mine["absmax2"], qmap1.clone(), qmap2.clone(), **kw)
            what = f"after step {t} on {label}"
            for key in _FIELDS:
                if mine[key].dtype != pre[key].dtype or mine[key].shape != pre[key].shape:
                    fail(f"{what}: {key} changed to dtype {mine[key].dtype}, shape {tuple(mine[key].shape)}.",
                         hint="update p, state1, state2, absmax1 and absmax2 IN PLACE (p.copy_(...), state1[:] = ...):"
                              " their dtypes and shapes stay as they are.")
            bad = _close(mine, ref, pdtype)
            if bad is None:
                continue
            if torch.isnan(mine["p"].float()).any() and not torch.isnan(ref["p"].float()).any():
                hint = ("NaN handling: where the gradient is NaN or Inf, reset m and v to 0 and leave the parameter "
                        "unchanged (torch.isfinite(g) gives the mask).")
            elif all(torch.equal(mine[k], pre[k]) for k in _FIELDS):
                hint = "nothing changed: update p and the four state tensors IN PLACE (copy_ / slice assignment)."
            else:
                hint = ("dequantize m and v (qmap[state] * absmax of the block), update them and p in fp32 like AdamW, "
                        "then requantize with a fresh absmax per block.")
                for h, kwv in [
                    ("sign lost on requantize: a small non-zero m must keep a code of its own sign, never 0 "
                     "(keep_sign=True when quantizing m and v).", {"keep_sign": False, "keep_sign_v": False}),
                    ("sign lost on requantize: a small non-zero m must keep a code of its own sign (keep_sign=True for m).",
                     {"keep_sign": False}),
                    ("v loses its sign on requantize: a tiny positive v must not round to 0 (keep_sign=True for v "
                     "too), or the next update is m / eps.", {"keep_sign_v": False}),
                    ("no bias correction: step size lr / (1 - beta1**step), denominator "
                     "sqrt(v) / sqrt(1 - beta2**step) + eps.", {"bias": False}),
                    ("requantize with a FRESH absmax per block (max |m|, max v of the updated values), not the old one.",
                     {"fresh_absmax": False}),
                    ("decay applied to m (through the gradient): 8-bit AdamW decays p directly, "
                     "p *= 1 - lr * weight_decay.", {"decay_on_m": True}),
                    ("the maps are swapped: m (signed) uses qmap1, v (non-negative) uses qmap2.", {"swap_maps": True}),
                    ("NaN handling: where the gradient is not finite, reset m and v to 0 and leave p unchanged.",
                     {"nan_rule": False}),
                ]:
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
