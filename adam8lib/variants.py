"""Teaching variants of :class:`~adam8lib.optim.Adam8bit` for the ablation (the paper's Table 3).

The 8-bit optimizers paper attributes 8-bit Adam's stability to two ideas: the **dynamic
map** (lesson 05: fine steps near 0, coarse near ±1) and **blockwise** scales (lesson 06:
one ``absmax`` per block of 256, so an outlier only coarsens its own block). To see what
each buys, :class:`Adam8bitVariant` switches them off one at a time, reusing the library's
own step (:mod:`adam8lib.kernels`) unchanged:

* ``quantization="linear"``: the two maps become :func:`adam8lib.quant.linear_map`
  (256 evenly spaced values; signed ``[-1, 1]`` for ``m``, unsigned ``[0, 1]`` for ``v``),
  i.e. absmax int8-style quantization of the states;
* ``blockwise=False``: one block per tensor (a single ``absmax`` for the whole state, as
  in lesson 04), by running the reference step's phases with ``blocksize = numel``.

``Adam8bitVariant(params, quantization="dynamic", blockwise=True)`` is exactly ``Adam8bit``.
The variant is for experiments only: its per-tensor states cannot be loaded back with
``load_state_dict`` (whose checks assume blocks of ``blocksize``), and ``blockwise=False``
always runs the pure-PyTorch reference backend (the compiled ones take blocks of 64…4096).

One rule of the step is kept in every variant: requantizing *keeps signs*
(:func:`adam8lib.quant.nearest_code` with ``keep_sign=True``), so a small positive ``v``
never rounds to 0; with the linear map it rounds up to ``absmax / 255`` instead. That is a
safeguard the paper's linear baseline did not have, so this ablation can only show the part
of the linear map's harm that remains with it.
"""

from __future__ import annotations

from typing import Any

import torch

from .optim import Adam8bit
from .kernels.reference import adam_update_fp32
from .quant import dequantize_blocks, linear_map, quantize_blocks

__all__ = ["Adam8bitVariant", "QUANTIZATIONS"]

#: The quantization maps a variant can use.
QUANTIZATIONS = ("dynamic", "linear")


class Adam8bitVariant(Adam8bit):
    """``Adam8bit`` with a choice of quantization map and of blockwise or per-tensor scales.

    Args:
        quantization: ``"dynamic"`` (the library's maps) or ``"linear"`` (evenly spaced).
        blockwise: ``True`` for one absmax per ``blocksize`` block (the library's rule),
            ``False`` for one absmax per tensor.
        other arguments: as :class:`~adam8lib.optim.Adam8bit`.
    """

    def __init__(self, params, *args: Any, quantization: str = "dynamic", blockwise: bool = True, **kwargs: Any):
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
        if not isinstance(blockwise, bool):
            raise TypeError(f"blockwise must be a bool, got {type(blockwise).__name__}")
        if not blockwise:
            if kwargs.get("backend", "torch") not in ("torch", "auto"):
                raise ValueError("blockwise=False runs the reference backend only (backend='torch')")
            kwargs["backend"] = "torch"
        super().__init__(params, *args, **kwargs)
        self.quantization = quantization
        self.blockwise = blockwise
        if quantization == "linear":
            self.qmap1, self.qmap2 = linear_map(signed=True), linear_map(signed=False)

    def _new_state(self, group: dict[str, Any], p: torch.Tensor) -> dict[str, Any]:
        state = super()._new_state(group, p)
        if not self.blockwise and "state1" in state:
            state["absmax1"] = state["absmax1"][:1].clone()  # one scale for the whole tensor
            state["absmax2"] = state["absmax2"][:1].clone()
        return state

    def _step_8bit(self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]) -> None:
        if self.blockwise:
            super()._step_8bit(group, p, grad, state)
            return
        # One block = the whole tensor: the reference step's phases (dequantize, fp32 update with
        # the non-finite rule, requantize) from the library's own pieces, with blocksize = numel.
        n = p.numel()
        if n == 0:
            return
        beta1, beta2 = group["betas"]
        qmap1, qmap2 = self._maps(p.device)
        m = dequantize_blocks(state["state1"], state["absmax1"], qmap1, n)
        v = dequantize_blocks(state["state2"], state["absmax2"], qmap2, n)
        new = adam_update_fp32(p.reshape(-1).float(), grad.reshape(-1).float(), m, v, step=state["step"],
                               lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                               weight_decay=group["weight_decay"])
        p.copy_(new.view(p.shape))
        state["state1"], state["absmax1"] = quantize_blocks(m, qmap1, n, keep_sign=True)
        state["state2"], state["absmax2"] = quantize_blocks(v, qmap2, n, keep_sign=True)

    def __repr__(self) -> str:
        scales = "blockwise" if self.blockwise else "per-tensor"
        return super().__repr__().replace("(backend:", f"({self.quantization} map, {scales} scales, backend:", 1)
