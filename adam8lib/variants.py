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

``Adam8bitVariant(params, quantization="dynamic", blockwise=True, keep_sign=True)`` is exactly ``Adam8bit``.
The variant is for experiments only: its per-tensor states cannot be loaded back with
``load_state_dict`` (whose checks assume blocks of ``blocksize``), and ``blockwise=False``
always runs the pure-PyTorch reference backend (the compiled ones take blocks of 64…4096).

By default one rule of the step is kept in every variant: requantizing *keeps signs*
(:func:`adam8lib.quant.nearest_code` with ``keep_sign=True``), so a small positive ``v``
never rounds to 0; with the linear map it rounds up to ``absmax / 255`` instead. That is a
safeguard the paper's linear baseline did not have. ``keep_sign=False`` switches it off
(plain nearest code, as lessons 04-06 quantize): then a state smaller than half the first
step of its map rounds to exactly 0, and an element whose ``v`` became 0 while its ``m`` did
not takes the step ``lr * m_hat / eps`` next time. With the linear map (first step 1/255 of
the absmax) that happens to every ``v`` below 1/510 of its absmax, and the LM in
``bench/convergence.py ablation`` diverges on every seed (bench/README.md, "Convergence").

Every variant other than the default one runs the reference step's phases (dequantize, the fp32
update :func:`~adam8lib.kernels.reference.adam_update_fp32` with its non-finite rule,
requantize) from the library's pieces, on the whole tensor at once (fp32 temporaries the
size of the tensor: an experiment's tool, not a memory saver). The requantization is one
method, :meth:`Adam8bitVariant._requantize`; a subclass that overrides it (and sets
``custom_requantize = True``) can try another rounding rule, e.g. another library's
quantizer, with everything else unchanged.
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
        keep_sign: ``True`` (the library's rule): a non-zero state never requantizes to 0 or
            to the other sign. ``False``: plain nearest code (small states can become 0).
        other arguments: as :class:`~adam8lib.optim.Adam8bit`.
    """

    #: Set by a subclass that overrides :meth:`_requantize` (its step then runs the phases here).
    custom_requantize = False

    def __init__(self, params, *args: Any, quantization: str = "dynamic", blockwise: bool = True,
                 keep_sign: bool = True, **kwargs: Any):
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
        for name, value in (("blockwise", blockwise), ("keep_sign", keep_sign)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
        own_phases = not blockwise or not keep_sign or self.custom_requantize
        if own_phases:
            if kwargs.get("backend", "torch") not in ("torch", "auto"):
                what = ("blockwise=False" if not blockwise else "keep_sign=False" if not keep_sign
                        else f"{type(self).__name__} (its own requantization)")
                raise ValueError(f"{what} runs the reference backend only (backend='torch')")
            kwargs["backend"] = "torch"
        super().__init__(params, *args, **kwargs)
        self.quantization = quantization
        self.blockwise = blockwise
        self.keep_sign = keep_sign
        self._own_phases = own_phases
        if quantization == "linear":
            self.qmap1, self.qmap2 = linear_map(signed=True), linear_map(signed=False)

    def _new_state(self, group: dict[str, Any], p: torch.Tensor) -> dict[str, Any]:
        state = super()._new_state(group, p)
        if not self.blockwise and "state1" in state:
            state["absmax1"] = state["absmax1"][:1].clone()  # one scale for the whole tensor
            state["absmax2"] = state["absmax2"][:1].clone()
        return state

    def _state_spec(self, shape: tuple[int, ...]) -> dict[str, tuple[int, torch.dtype]]:
        spec = super()._state_spec(shape)
        if not self.blockwise:  # one scale for the whole tensor
            spec = {**spec, "absmax1": (1, torch.float32), "absmax2": (1, torch.float32)}
        return spec

    def _requantize(self, x: torch.Tensor, code: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Requantize a flat fp32 state: ``(codes uint8, absmax per block)``, with this variant's sign rule."""
        return quantize_blocks(x, code, blocksize, keep_sign=self.keep_sign)

    def _step_map_codes(self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]) -> None:
        if not self._own_phases:
            super()._step_map_codes(group, p, grad, state)
            return
        # The reference step's phases (dequantize, fp32 update with the non-finite rule,
        # requantize) from the library's own pieces; one block = the whole tensor when per-tensor.
        n = p.numel()
        if n == 0:
            return
        blocksize = group["blocksize"] if self.blockwise else n
        beta1, beta2 = group["betas"]
        qmap1, qmap2 = self._maps(p.device)
        m = dequantize_blocks(state["state1"], state["absmax1"], qmap1, blocksize)
        v = dequantize_blocks(state["state2"], state["absmax2"], qmap2, blocksize)
        new = adam_update_fp32(p.reshape(-1).float(), grad.reshape(-1).float(), m, v, step=state["step"],
                               lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                               weight_decay=group["weight_decay"])
        p.copy_(new.view(p.shape))
        state["state1"], state["absmax1"] = self._requantize(m, qmap1, blocksize)
        state["state2"], state["absmax2"] = self._requantize(v, qmap2, blocksize)

    def __repr__(self) -> str:
        scales = "blockwise" if self.blockwise else "per-tensor"
        signs = "" if self.keep_sign else ", signs not kept"
        return super().__repr__().replace("(backend:", f"({self.quantization} map, {scales} scales{signs}, backend:", 1)
