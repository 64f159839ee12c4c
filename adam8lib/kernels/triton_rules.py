"""The Triton template of the family's elementwise rules: Lion, AdEMAMix, RMSprop, Adagrad, Adan (issues 35, 52).

One kernel, :func:`_rule_kernel`, for every rule: lesson 08's tile (:mod:`adam8lib.kernels.triton`: a
program owns ``ROWS`` whole blocks), decoding each state (``map[code] * absmax``), the rule's update in
fp32, the non-finite rule (an element whose new state is not finite has every state reset to 0 and
keeps its parameter), and each state's new absmax and codes with lesson 08's coding (the exact table,
signs kept; ``FP8``: float8 e4m3 bytes). A rule has up to :data:`MAX_STATES` states (six slots, each
decoded, updated and stored only if the rule has it: ``STATES``), any of them kept in a plain dtype
(:attr:`adam8lib.rules.base.StateSpec.kept`, the bits of ``KEPT``: Adan's previous gradient), loaded and
stored as it is, with no codes or scales. The rule itself is two small ``@triton.jit`` functions (its
moments, its parameter update), picked by the ``RULE`` constexpr, each line the reference's line of
:mod:`adam8lib.rules` with torch's rounding: ``x.add_(y, alpha=a)`` and ``x.addcmul_(y, z, value=c)``
as fused multiply-adds where torch's kernels fuse them (``FUSED_MOMENTS``), ``addcdiv`` as
``x + (c*y)/z``, divisions and square roots correctly rounded (``div_rn``, ``sqrt_rn``). The scalars are
:func:`adam8lib.kernels.rule_args.rule_scalars`' (the C++ template's too).

Registered as ``(rule, 8-bit/FP8 blockwise, "triton")`` in :mod:`adam8lib.kernels.registry`; the calling
convention is the registry's: ``rule_step_triton(p, g, states, *, rule, fmt, shape, step, group)``.
What holds in the interpreter (tests/kernels/test_triton_rules.py): states (codes and absmax) and
parameters bit for bit the reference step's for Lion (no square root); for the rules with a square root
(AdEMAMix, RMSprop, Adagrad, Adan) the states too (Adan's kept previous gradient included), and the parameters
within 1e-5 of a learning rate per step (measured up to 7.5e-6 lr). That is not "a few ulp" of the parameter: a review measured up to 512 ulp for
RMSprop and Adagrad, on weights much smaller than their step. The cause: torch's CPU ``sqrt`` is MKL's vector
square root, which is not always correctly rounded (the kernel's is), and the step's rounding error is
relative to the update, not to the weight. On a GPU (the CUDA twins) the same comparison runs on CUDA tensors against
the reference step on the same device.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import triton
import triton.language as tl

from ..quant import check_blocksize, num_blocks
from . import triton as lesson
from .contract import check_step
from .registry import register_step
from .rule_args import RULES, accepts, checked_tensors, rule_scalars
from .triton import FLT_MAX, FUSED_MOMENTS
from .triton import quantize_tile as _quantize_tile, tile as _tile, to_dtype as _to_dtype
from .triton_fp8 import fp8_table

__all__ = ["rule_step_triton"]

LION, ADEMAMIX, RMSPROP, ADAGRAD, ADAN = (tl.constexpr(RULES[name])
                                         for name in ("lion", "ademamix", "rmsprop", "adagrad", "adan"))
#: The most states a rule of the template has (its kernel's state slots; a kept state takes one too).
MAX_STATES = 6
#: The most fp32 scalars a rule reads (:func:`adam8lib.kernels.rule_args.rule_scalars`).
MAX_SCALARS = 13


# ---- torch's operations ---------------------------------------------------------------------
@triton.jit
def _add_alpha(x, y, a):
    """``x.add(y, alpha=a)``: fma(y, a, x) where torch fuses it."""
    if FUSED_MOMENTS:
        return tl.math.fma(y, a, x)
    else:
        return x + a * y


@triton.jit
def _addcmul(x, y, z, c):
    """``x.addcmul(y, z, value=c)``: fma(c*y, z, x) where torch fuses it."""
    if FUSED_MOMENTS:
        return tl.math.fma(c * y, z, x)
    else:
        return x + (c * y) * z


@triton.jit
def _sign(x):
    """``torch.sign``: (0 < x) - (x < 0), so 0 for +-0 and NaN."""
    return tl.where(x > 0, 1.0, 0.0) - tl.where(x < 0, 1.0, 0.0)


# ---- the rules: moments (the new states, and what the parameter update needs besides them) ------------
@triton.jit
def _moments(RULE: tl.constexpr, g, p, s0, s1, s2, s3, s4, s5, h0, h1, h2, h3, h4, h5, h6):
    aux = g
    if RULE == LION:  # h: beta1, 1 - beta1, beta2, 1 - beta2
        aux = _sign(s0 * h0 + g * h1)                    # sign(m.mul(beta1) + g.mul(1 - beta1))
        s0 = _add_alpha(s0 * h2, g, h3)                  # m.mul_(beta2).add_(g, alpha=1 - beta2)
    elif RULE == ADEMAMIX:  # h: beta1, 1 - beta1, beta3_t, 1 - beta3_t, beta2, 1 - beta2
        s0 = _add_alpha(s0 * h0, g, h1)                  # m1.mul_(beta1).add_(g, alpha=1 - beta1)
        s1 = _add_alpha(s1 * h2, g, h3)                  # m2.mul_(beta3).add_(g, alpha=1 - beta3)
        s2 = _addcmul(s2 * h4, g, g, h5)                 # nu.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    elif RULE == RMSPROP:  # h: weight_decay, alpha, 1 - alpha
        aux = _add_alpha(g, p, h0)                       # g = g.add(p, alpha=wd)
        s0 = _addcmul(s0 * h1, aux, aux, h2)             # s.mul_(alpha).addcmul_(g, g, value=1 - alpha)
    elif RULE == ADAGRAD:  # h: weight_decay
        aux = _add_alpha(g, p, h0)                       # g = g.add(p, alpha=wd)
        s0 = _addcmul(s0, aux, aux, 1.0)                 # s.addcmul_(g, g, value=1.0)
    else:  # ADAN; h: beta1, 1 - beta1, beta2, 1 - beta2, beta3, 1 - beta3, first (1 on step 1)
        d = g - tl.where(h6 != 0.0, g, s3)               # d = g - (g if step == 1 else prev)
        s0 = _add_alpha(s0 * h0, g, h1)                  # m.mul_(beta1).add_(g, alpha=1 - beta1)
        s1 = _add_alpha(s1 * h2, d, h3)                  # e.mul_(beta2).add_(d, alpha=1 - beta2)
        u = _add_alpha(d * h2, g, 1.0)                   # u = d.mul_(beta2).add_(g)
        s2 = _addcmul(s2 * h4, u, u, h5)                 # n.mul_(beta3).addcmul_(u, u, value=1 - beta3)
        s3 = g                                           # prev.copy_(g)
    return aux, s0, s1, s2, s3, s4, s5


# ---- the rules: the new parameter -------------------------------------------------------------
@triton.jit
def _param(RULE: tl.constexpr, p, aux, s0, s1, s2, s3, s4, s5, h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11,
           h12):
    if RULE == LION:  # h4: decay, h5: -lr
        new = _add_alpha(p * h4, aux, h5)                # p.mul_(1 - lr*wd); p.add_(sign, alpha=-lr)
    elif RULE == ADEMAMIX:  # h6: 1 - beta1^t, h7: alpha_t, h8: sqrt(1 - beta2^t), h9: eps, h10: decay, h11: -lr
        num = tl.math.div_rn(s0, h6) + s1 * h7           # m1 / c1 + alpha * m2
        den = tl.math.div_rn(tl.math.sqrt_rn(s2), h8) + h9  # nu.sqrt() / c2 + eps
        new = _add_alpha(p * h10, tl.math.div_rn(num, den), h11)
    elif RULE == RMSPROP:  # h3: eps, h4: -lr
        new = p + tl.math.div_rn(h4 * aux, tl.math.sqrt_rn(s0) + h3)  # p.addcdiv_(g, s.sqrt().add_(eps), value=-lr)
    elif RULE == ADAGRAD:  # h1: eps, h2: -lr
        new = p + tl.math.div_rn(h2 * aux, tl.math.sqrt_rn(s0) + h1)
    else:  # ADAN; h7: sqrt(1 - beta3^t), h8: eps, h9: decay, h10: -lr / c1, h11: -lr*beta2 / c2, h12: prox
        den = tl.math.div_rn(tl.math.sqrt_rn(s2), h7) + h8  # n.sqrt().div_(c3).add_(eps)
        new = p * h9                                        # p.mul_(1 - lr*wd)
        new = new + tl.math.div_rn(h10 * s0, den)           # p.addcdiv_(m, den, value=-lr / c1)
        new = new + tl.math.div_rn(h11 * s1, den)           # p.addcdiv_(e, den, value=-lr*beta2 / c2)
        new = tl.math.div_rn(new, h12)                      # p.div_(1 + lr*wd)
    return new


@triton.jit
def _decode(codes_ptr, absmax_ptr, qmap_ptr, blocks, offsets, mask, block_mask):
    code = tl.load(codes_ptr + offsets, mask=mask, other=0).to(tl.int32)
    absmax = tl.load(absmax_ptr + blocks, mask=block_mask, other=0.0)
    return tl.load(qmap_ptr + code) * absmax[:, None]


@triton.jit
def _encode(x, codes_ptr, absmax_ptr, qmap_ptr, steps_ptr, blocks, offsets, mask, block_mask,
            USE_TABLE: tl.constexpr, FP8: tl.constexpr):
    codes, absmax = _quantize_tile(x, qmap_ptr, steps_ptr, True, USE_TABLE, FP8)
    tl.store(codes_ptr + offsets, codes.to(tl.uint8), mask=mask)
    tl.store(absmax_ptr + blocks, absmax, mask=block_mask)


@triton.jit
def _load(K: tl.constexpr, STATES: tl.constexpr, KEPT: tl.constexpr, c_ptr, a_ptr, q_ptr, blocks, offsets, mask,
          block_mask, like):
    """State slot ``K``'s fp32 values: decoded, loaded as they are (a kept state), or 0 (a slot the rule lacks)."""
    if K >= STATES:
        return tl.zeros_like(like)
    elif (KEPT >> K) & 1:
        return tl.load(c_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    else:
        return _decode(c_ptr, a_ptr, q_ptr, blocks, offsets, mask, block_mask)


@triton.jit
def _store(K: tl.constexpr, STATES: tl.constexpr, KEPT: tl.constexpr, x, c_ptr, a_ptr, q_ptr, t_ptr, blocks, offsets,
           mask, block_mask, USE_TABLE: tl.constexpr, FP8: tl.constexpr):
    """State slot ``K``'s new values: coded with a new absmax, or stored in its own dtype (a kept state)."""
    if K < STATES:
        if (KEPT >> K) & 1:
            tl.store(c_ptr + offsets, x.to(c_ptr.dtype.element_ty), mask=mask)
        else:
            _encode(x, c_ptr, a_ptr, q_ptr, t_ptr, blocks, offsets, mask, block_mask, USE_TABLE, FP8)


@triton.jit
def _finite(K: tl.constexpr, STATES: tl.constexpr, x):
    if K < STATES:
        return tl.abs(x) <= FLT_MAX
    else:
        return x == x  # (a slot the rule lacks holds 0)


@triton.jit
def _rule_kernel(p_ptr, g_ptr, c0_ptr, a0_ptr, q0_ptr, t0_ptr, c1_ptr, a1_ptr, q1_ptr, t1_ptr,
                 c2_ptr, a2_ptr, q2_ptr, t2_ptr, c3_ptr, a3_ptr, q3_ptr, t3_ptr, c4_ptr, a4_ptr, q4_ptr, t4_ptr,
                 c5_ptr, a5_ptr, q5_ptr, t5_ptr, n, n_blocks,
                 h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12,
                 RULE: tl.constexpr, STATES: tl.constexpr, KEPT: tl.constexpr, BLOCKSIZE: tl.constexpr,
                 ROWS: tl.constexpr, USE_TABLE: tl.constexpr, FP8: tl.constexpr, INT64: tl.constexpr):
    """One step of ``RULE`` on one program's ``[ROWS, BLOCKSIZE]`` tile; ``STATES`` (1 to 6) states in
    slots 0, 1, ..., each its codes, absmax, decode map and code table, or (the bits of ``KEPT``) its values in
    their own dtype as ``c`` (unused pointers: any valid ones)."""
    blocks, offsets, mask = _tile(n, BLOCKSIZE, ROWS, INT64)
    block_mask = blocks < n_blocks
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    p = tl.load(p_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    s0 = _load(0, STATES, KEPT, c0_ptr, a0_ptr, q0_ptr, blocks, offsets, mask, block_mask, p)
    s1 = _load(1, STATES, KEPT, c1_ptr, a1_ptr, q1_ptr, blocks, offsets, mask, block_mask, p)
    s2 = _load(2, STATES, KEPT, c2_ptr, a2_ptr, q2_ptr, blocks, offsets, mask, block_mask, p)
    s3 = _load(3, STATES, KEPT, c3_ptr, a3_ptr, q3_ptr, blocks, offsets, mask, block_mask, p)
    s4 = _load(4, STATES, KEPT, c4_ptr, a4_ptr, q4_ptr, blocks, offsets, mask, block_mask, p)
    s5 = _load(5, STATES, KEPT, c5_ptr, a5_ptr, q5_ptr, blocks, offsets, mask, block_mask, p)
    aux, s0, s1, s2, s3, s4, s5 = _moments(RULE, g, p, s0, s1, s2, s3, s4, s5, h0, h1, h2, h3, h4, h5, h6)
    # the non-finite rule (elements past the end count as reset: 0, so they leave every maximum alone)
    finite = mask & _finite(0, STATES, s0) & _finite(1, STATES, s1) & _finite(2, STATES, s2)
    finite = finite & _finite(3, STATES, s3) & _finite(4, STATES, s4) & _finite(5, STATES, s5)
    s0 = tl.where(finite, s0, 0.0)
    s1 = tl.where(finite, s1, 0.0)
    s2 = tl.where(finite, s2, 0.0)
    s3 = tl.where(finite, s3, 0.0)
    s4 = tl.where(finite, s4, 0.0)
    s5 = tl.where(finite, s5, 0.0)
    new_p = _param(RULE, p, aux, s0, s1, s2, s3, s4, s5, h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12)
    new_p = tl.where(finite, new_p, p)
    tl.store(p_ptr + offsets, _to_dtype(new_p, p_ptr.dtype.element_ty), mask=mask)
    _store(0, STATES, KEPT, s0, c0_ptr, a0_ptr, q0_ptr, t0_ptr, blocks, offsets, mask, block_mask, USE_TABLE, FP8)
    _store(1, STATES, KEPT, s1, c1_ptr, a1_ptr, q1_ptr, t1_ptr, blocks, offsets, mask, block_mask, USE_TABLE, FP8)
    _store(2, STATES, KEPT, s2, c2_ptr, a2_ptr, q2_ptr, t2_ptr, blocks, offsets, mask, block_mask, USE_TABLE, FP8)
    _store(3, STATES, KEPT, s3, c3_ptr, a3_ptr, q3_ptr, t3_ptr, blocks, offsets, mask, block_mask, USE_TABLE, FP8)
    _store(4, STATES, KEPT, s4, c4_ptr, a4_ptr, q4_ptr, t4_ptr, blocks, offsets, mask, block_mask, USE_TABLE, FP8)
    _store(5, STATES, KEPT, s5, c5_ptr, a5_ptr, q5_ptr, t5_ptr, blocks, offsets, mask, block_mask, USE_TABLE, FP8)


def _maps(rule: Any, fmt: Any, device: torch.device) -> tuple[list, bool, bool]:
    """Each state's (decode map, code table) on ``device`` (a kept state: None); whether every table is exact; FP8
    or not."""
    fp8 = fmt.m.coding == "fp8"
    if fp8 != (fmt.v.coding == "fp8"):
        raise ValueError("the Triton rule template needs both moments in one coding (maps or FP8)")
    out, use_table = [], True
    for spec in rule.states:
        moment = fmt.m if spec.stored_as == "m" else fmt.v
        if spec.kept is not None:
            out.append(None)
        elif fp8:
            table = fp8_table(device)
            out.append((table, table))
        else:
            qmap = moment.qmap().to(device=device, dtype=torch.float32).contiguous()
            steps, exact = lesson.nearest_code_table(qmap, moment.keep_sign)
            use_table &= exact
            out.append((qmap, steps))
    if not fp8 and not all(m.keep_sign for m in (fmt.m, fmt.v)):
        raise ValueError("the Triton rule template codes states with the sign rule (keep_sign) of the 8-bit formats")
    return out, use_table, fp8


def _check(p: torch.Tensor, g: torch.Tensor, states, rule: Any, fmt: Any, shape: tuple[int, ...]) -> None:
    """TypeError/ValueError before a launch: the templates' checks (:func:`~adam8lib.kernels.rule_args.checked_tensors`),
    a block size the kernel tiles, every tensor on p's device."""
    tensors = checked_tensors(p, g, states, rule, fmt, shape, template="Triton", most_states=MAX_STATES)
    check_blocksize(fmt.m.blocksize)
    for name, t in tensors:
        if t.device != p.device:
            raise ValueError(f"{name} is on {t.device}, p on {p.device}")


@torch.no_grad()
def rule_step_triton(p: torch.Tensor, g: torch.Tensor, states, *, rule: Any, fmt: Any, shape: tuple[int, ...],
                     step: int, group: Mapping[str, Any], tile: int | None = None,
                     num_warps: int | None = None) -> None:
    """One step of ``rule`` on flat CUDA tensors (or CPU tensors under ``TRITON_INTERPRET=1``), in
    place: the registry's calling convention (:mod:`adam8lib.kernels.registry`)."""
    _check(p, g, states, rule, fmt, tuple(shape))
    check_step(step)
    lesson.check_runnable(p.device)
    n = p.numel()
    if n == 0:
        return
    maps, use_table, fp8 = _maps(rule, fmt, p.device)
    scalars = rule_scalars(rule.name, step, group)
    scalars += [0.0] * (MAX_SCALARS - len(scalars))
    blocksize = fmt.m.blocksize
    rows, warps = lesson.launch_config(blocksize, tile, num_warps)
    n_blocks = num_blocks(n, blocksize)
    per_state, kept = [], 0
    for k, (spec, entry, tables) in enumerate(zip(rule.states, states, maps)):
        if spec.kept is not None:  # its values in the codes' slot; the other pointers unused (p: a valid one)
            kept |= 1 << k
            per_state += [entry[0], p, p, p]
        else:
            per_state += [entry[0], entry[1], tables[0], tables[1]]
    per_state += per_state[-4:] * (MAX_STATES - len(states))  # slots the rule lacks: never read
    int64 = n_blocks * blocksize + rows * blocksize >= 2**31
    lesson.launch(_rule_kernel, n_blocks, rows, warps, p, g, *per_state, n, n_blocks, *scalars,
                  RULE=RULES[rule.name], STATES=len(states), KEPT=kept, BLOCKSIZE=blocksize, USE_TABLE=use_table,
                  FP8=fp8, INT64=int64)


def _supports(device: torch.device) -> bool:
    return lesson.supports(device)


for _name in RULES:
    register_step(_name, "triton", rule_step_triton, formats=accepts, supports=_supports)
