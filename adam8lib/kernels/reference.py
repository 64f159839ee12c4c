"""The reference 8-bit Adam step in plain PyTorch: the spec every other backend matches.

For each block of ``blocksize`` elements (one ``absmax`` per state per block)::

    m, v   = qmap1[state1] * absmax1,  qmap2[state2] * absmax2        # dequantize (fp32)
    m      = beta1 * m + (1 - beta1) * g                               # EMA of g
    v      = beta2 * v + (1 - beta2) * g * g                           # EMA of g^2
    p      = p * (1 - lr * weight_decay)                               # decoupled decay
    p      = p - lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)
    absmax1, absmax2 = max |m|, max v       (per block, new)
    state1 = nearest code of m / absmax1 in qmap1                      # requantize,
    state2 = nearest code of v / absmax2 in qmap2                      # keeping signs

"Keeping signs" (``nearest_code(..., keep_sign=True)``): a non-zero state never rounds to 0
or to the other sign; it takes the smallest code of its own sign instead. For ``m`` this is
bitsandbytes' rule; for ``v`` it stops a tiny-but-positive ``v`` from becoming 0, which
would make the next update ``m / eps`` — a jump of thousands of learning rates.

A gradient element that is NaN or ±Inf resets that element's ``m`` and ``v`` to 0 and
leaves its parameter unchanged (no update, no decay), as bitsandbytes' GPU kernel does.

Memory: the work runs over *chunks* of whole blocks, so the fp32 temporaries are a few
chunk-sized buffers (``chunk_size`` elements, 64 Ki by default, about 2 MB in all) whatever
the parameter's size: there is never a full fp32 copy of the states or the parameter.
"""

from __future__ import annotations

import math

import torch

from ..quant import dequantize_blocks, quantize_blocks

#: Elements per chunk (a multiple of every supported blocksize).
CHUNK_SIZE = 1 << 16


@torch.no_grad()
def adam8bit_step(
    p: torch.Tensor,
    g: torch.Tensor,
    state1: torch.Tensor,
    state2: torch.Tensor,
    absmax1: torch.Tensor,
    absmax2: torch.Tensor,
    qmap1: torch.Tensor,
    qmap2: torch.Tensor,
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    blocksize: int,
    chunk_size: int = CHUNK_SIZE,
) -> None:
    """One 8-bit Adam/AdamW step, in place, on flat contiguous 1-D tensors.

    ``p`` and ``g`` have ``n`` elements (fp32, bf16 or fp16); ``state1``/``state2`` are uint8
    with ``n`` elements; ``absmax1``/``absmax2`` are fp32 with ``ceil(n / blocksize)``.
    """
    n = p.numel()
    bias_correction1 = 1.0 - beta1**step
    bias_correction2_sqrt = math.sqrt(1.0 - beta2**step)
    step_size = lr / bias_correction1
    chunk = max(blocksize, chunk_size - chunk_size % blocksize)
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        b0, b1 = start // blocksize, -(-end // blocksize)
        # 1. dequantize this chunk's states to fp32
        m = dequantize_blocks(state1[start:end], absmax1[b0:b1], qmap1, blocksize)
        v = dequantize_blocks(state2[start:end], absmax2[b0:b1], qmap2, blocksize)
        # 2. EMA updates in fp32; a non-finite gradient element resets its states
        grad = g[start:end].float()
        m.mul_(beta1).add_(grad, alpha=1.0 - beta1)
        v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        finite = torch.isfinite(m) & torch.isfinite(v)  # non-finite new m or v: reset, skip the update
        m.masked_fill_(~finite, 0.0)
        v.masked_fill_(~finite, 0.0)
        # 3. parameter update in fp32 (decay first, like torch.optim.AdamW)
        param = p[start:end].float()
        new = param.mul(1.0 - lr * weight_decay) if weight_decay != 0 else param.clone()
        denom = v.sqrt().div_(bias_correction2_sqrt).add_(eps)
        new.addcdiv_(m, denom, value=-step_size)
        p[start:end].copy_(torch.where(finite, new, param))
        # 4. requantize with fresh per-block absmax
        state1[start:end], absmax1[b0:b1] = quantize_blocks(m, qmap1, blocksize, keep_sign=True)
        state2[start:end], absmax2[b0:b1] = quantize_blocks(v, qmap2, blocksize, keep_sign=True)
