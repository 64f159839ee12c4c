"""adam8lib's 8-bit step with bitsandbytes' CPU requantizer: the root-cause experiment.

On the CPU, bitsandbytes 0.50.2's ``Adam8bit`` (``backends/cpu/ops.py``,
``_optimizer_update_8bit_blockwise_cpu``) dequantizes both states, runs the same fp32 Adam
update as adam8lib, and requantizes each state with its generic
``torch.ops.bitsandbytes.quantize_blockwise`` (blocks of 256). That quantizer (``quantize_cpu``
in ``csrc/cpu_ops.cpp``) finds the code with a table-driven search (``BinSearch``'s
``Direct2``) followed by one left/right nearest check, and it has no keep-sign rule. Its table
cannot resolve the finest steps of the dynamic map near 0: a normalised value smaller than
about 2e-5 does not get its nearest code. A tiny positive ``m`` lands on code 131 (+2.1e-5),
a tiny negative one on code 123 (-2.1e-5) or, below about 1e-7, on 131 (its sign flips); a
tiny ``v`` lands on code 7 (1.6e-5). So small states are *inflated* to a floor of about
2e-5 of their block's absmax, never rounded to 0 (``tests/test_convergence.py`` pins this).
adam8lib takes the exact nearest code and keeps signs.

:class:`Adam8bitBnbRounding` is :class:`adam8lib.variants.Adam8bitVariant` (blockwise dynamic
maps, i.e. ``Adam8bit``'s maths) with only the requantization swapped for bitsandbytes' CPU
op. If it tracks bitsandbytes run for run, the rounding is the whole difference between the
two libraries. ``tests/test_convergence.py`` checks that, fed the same gradients, it equals
``bnb.optim.Adam8bit`` on the CPU to the bit for 8-bit states. Tensors below
``min_8bit_size`` (biases, norms: fp32 states in both libraries) differ in the last bits:
bitsandbytes' 32-bit CPU update folds the bias corrections into ``lr * sqrt(1 - beta2^t) /
(1 - beta1^t)`` and ``eps * sqrt(1 - beta2^t)``, the same maths rounded differently.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import torch

from adam8lib.variants import Adam8bitVariant

with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import bitsandbytes  # noqa: F401  (registers torch.ops.bitsandbytes; warns on stderr without a GPU)


class Adam8bitBnbRounding(Adam8bitVariant):
    """adam8lib ``Adam8bit`` whose states are requantized by bitsandbytes' CPU quantizer."""

    custom_requantize = True

    def __init__(self, params, *args, **kwargs):
        for fixed in ("quantization", "blockwise", "keep_sign"):
            if fixed in kwargs:
                raise TypeError(f"Adam8bitBnbRounding fixes {fixed} (bitsandbytes' blockwise dynamic maps)")
        super().__init__(params, *args, **kwargs)

    def _requantize(self, x: torch.Tensor, code: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
        if x.device.type != "cpu":
            raise ValueError("Adam8bitBnbRounding reproduces bitsandbytes' CPU quantizer: CPU tensors only")
        return torch.ops.bitsandbytes.quantize_blockwise(x.contiguous(), code, blocksize)
