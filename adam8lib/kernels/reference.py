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

The non-finite rule (:func:`adam8lib.rules.adamw.adam_update_fp32`, the one fp32 update, shared with the
optimizer's fp32 small-tensor path): ``m'`` and ``v'`` are computed in fp32; where either is
not finite — a NaN or ±Inf gradient, or a huge finite one whose ``(1 - beta2) g^2``
overflows fp32 (``|g|`` above about 6e20 for beta2 = 0.999) — that element's ``m`` and ``v``
are reset to 0 and its parameter is left unchanged this step (no update, no decay). The
block's new ``absmax`` is taken *after* the reset, so it stays finite and the element's
neighbours are quantized as if it were absent. (torch.optim.AdamW on the same gradients keeps
``v = inf`` and freezes that element from then on; here it restarts from zero moments on the
next step.)

Memory: the work runs over *chunks* of whole blocks, so the fp32 temporaries are a few
chunk-sized buffers (``chunk_size`` elements, 64 Ki by default, about 2 MB in all) whatever
the parameter's size: there is never a full fp32 copy of the states or the parameter.
"""

from __future__ import annotations

import functools

import torch

from ..quant import dequantize_blocks, quantize_blocks
# the fp32 AdamW update lives with its rule (rules/ is a floor below kernels/); named here too, as lesson 07 and
# the backends have always imported it from the reference module
from ..rules.adamw import adam_update_fp32, adam_update_fp32_many, bias_corrections  # noqa: F401
from .contract import check_step_args

#: Elements per chunk (a multiple of every supported blocksize).
CHUNK_SIZE = 1 << 16


def format_reference_step(p: torch.Tensor, g: torch.Tensor, state: dict, fmt, *, shape: tuple[int, ...],
                          step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                          reduce_maxima=None) -> None:
    """The reference Adam step of any state format (``fmt``, :class:`adam8lib.formats.StateFormat`):
    decode ``m`` and ``v`` to fp32, :func:`adam_update_fp32`, encode them again. ``p`` (any shape
    holding the ``prod(shape)`` elements of a tensor of ``shape``) is updated in place, ``state``'s
    codes and scales too; ``reduce_maxima``: the rank-1 scales of a shard
    (:meth:`adam8lib.formats.MomentFormat.quantize`). The spec every fused step of those formats
    matches (:func:`adam8lib.kernels.register_adam_step`); fp32 temporaries the size of the tensor."""
    m, v = fmt.decode(state, shape)
    new = adam_update_fp32(p.reshape(-1).float(), g.reshape(-1).float(), m, v, step=step, lr=lr, beta1=beta1,
                           beta2=beta2, eps=eps, weight_decay=weight_decay)
    p.copy_(new.view(p.shape))
    fmt.encode_(state, m, v, shape, reduce_maxima)


def probe_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fixed ``(g, m, v)`` of 4099 elements that the backends use to ask how this torch rounds."""
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(4099, generator=gen)
    return g, torch.randn(4099, generator=gen) * 0.01, torch.rand(4099, generator=gen) * 1e-3


@functools.lru_cache(maxsize=None)
def torch_uses_fma() -> bool:
    """Does this torch build round the moments' ``m.add_(g, alpha=a)`` and ``v.addcmul_(g, g, value=b)``
    as fused multiply-adds? Yes where its vectorized CPU kernels run (AVX2, AVX-512); no with its
    generic kernels (``ATEN_CPU_CAPABILITY=default``, CPUs without AVX2). The compiled backends ask,
    so that on the CPU they round the moments as the reference does on this machine. Raises
    ImportError if it fuses one and not the other, which no backend imitates."""
    g, m, v = probe_inputs()
    a, b = 1.0 - 0.9, 1.0 - 0.999
    add_fused = not torch.equal(m.clone().add_(g, alpha=a), m + g * a)
    addcmul_fused = not torch.equal(v.clone().addcmul_(g, g, value=b), v + (g * b) * g)
    if add_fused != addcmul_fused:
        raise ImportError("this torch build fuses add(alpha) and addcmul differently; no compiled backend imitates it")
    return add_fused


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
    with ``n`` elements; ``absmax1``/``absmax2`` are fp32 with ``ceil(n / blocksize)``
    (checked by :func:`adam8lib.kernels.contract.check_step_args`).
    """
    check_step_args(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, blocksize=blocksize, step=step)
    n = p.numel()
    hyper = dict(step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
    chunk = max(blocksize, chunk_size - chunk_size % blocksize)
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        b0, b1 = start // blocksize, -(-end // blocksize)
        # 1. dequantize this chunk's states to fp32
        m = dequantize_blocks(state1[start:end], absmax1[b0:b1], qmap1, blocksize)
        v = dequantize_blocks(state2[start:end], absmax2[b0:b1], qmap2, blocksize)
        # 2-3. EMA updates and the parameter update in fp32 (non-finite rule included)
        p[start:end].copy_(adam_update_fp32(p[start:end].float(), g[start:end].float(), m, v, **hyper))
        # 4. requantize with fresh per-block absmax (after the reset: always finite)
        state1[start:end], absmax1[b0:b1] = quantize_blocks(m, qmap1, blocksize, keep_sign=True)
        state2[start:end], absmax2[b0:b1] = quantize_blocks(v, qmap2, blocksize, keep_sign=True)
