"""Teaching variants of :class:`~adam8lib.optim.Adam8bit` for the ablation (the paper's Table 3).

The 8-bit optimizers paper attributes 8-bit Adam's stability to two ideas: the **dynamic
map** (lesson 05: fine steps near 0, coarse near ±1) and **blockwise** scales (lesson 06:
one ``absmax`` per block of 256, so an outlier only coarsens its own block). To see what
each buys, :class:`Adam8bitVariant` switches them off one at a time, reusing the library's
own step unchanged: a variant is ``Adam8bit`` with another state format (the maps, the sign rule) and, for
per-tensor scales, the core's decode and quantize hooks (:class:`~adam8lib.quantized_state.QuantizedStateOptimizer`):

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

A variant with blockwise scales and signs kept (the dynamic or the linear map) runs the fused kernels of
:mod:`adam8lib.kernels` with its format's maps. Every other variant runs the core's reference step (dequantize,
the fp32 AdamW update with its non-finite rule, requantize), on the whole tensor at once (fp32 temporaries the
size of the tensor: an experiment's tool, not a memory saver). The requantization is one
method, :meth:`Adam8bitVariant._requantize`; a subclass that overrides it (and sets
``custom_requantize = True``) can try another rounding rule, e.g. another library's
quantizer, with everything else unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from .formats import StateFormat, get_format
from .optim import Adam8bit
from .quant import dequantize_blocks, linear_map, quantize_blocks

__all__ = ["Adam8bitVariant", "QUANTIZATIONS"]

#: The quantization maps a variant can use.
QUANTIZATIONS = ("dynamic", "linear")


def _linear_signed() -> torch.Tensor:
    return linear_map(signed=True)


def _linear_unsigned() -> torch.Tensor:
    return linear_map(signed=False)


@functools.lru_cache(maxsize=None)
def variant_format(quantization: str, keep_sign: bool, blocksize: int) -> StateFormat:
    """The 8-bit format with ``quantization``'s maps and the sign rule ``keep_sign`` (``"8bit"`` itself for the
    dynamic maps with signs kept), blocks of ``blocksize``."""
    fmt = get_format("8bit").with_blocksize(blocksize)
    if quantization == "dynamic" and keep_sign:
        return fmt
    m, v = fmt.m, fmt.v
    if quantization == "linear":
        m = dataclasses.replace(m, map_builder=_linear_signed, map_name="linear-signed")
        v = dataclasses.replace(v, map_builder=_linear_unsigned, map_name="linear-unsigned")
    m, v = dataclasses.replace(m, keep_sign=keep_sign), dataclasses.replace(v, keep_sign=keep_sign)
    name = "8bit-" + quantization + ("" if keep_sign else "-nearest")
    return StateFormat(name, m, v, f"{fmt.summary} ({quantization} maps{'' if keep_sign else ', plain nearest code'})")


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

    #: Set by a subclass that overrides :meth:`_requantize` (its step then runs the reference step).
    custom_requantize = False

    def __init__(self, params, *args: Any, quantization: str = "dynamic", blockwise: bool = True,
                 keep_sign: bool = True, **kwargs: Any):
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
        for name, value in (("blockwise", blockwise), ("keep_sign", keep_sign)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
        if "state_format" in kwargs:
            raise TypeError(f"{type(self).__name__} makes its own state format (quantization=, keep_sign=); "
                            f"state_format is not one of its arguments")
        own_phases = not blockwise or not keep_sign or self.custom_requantize
        if own_phases:
            if kwargs.get("backend", "torch") not in ("torch", "auto"):
                what = ("blockwise=False" if not blockwise else "keep_sign=False" if not keep_sign
                        else f"{type(self).__name__} (its own requantization)")
                raise ValueError(f"{what} runs the reference backend only (backend='torch')")
            kwargs["backend"] = "torch"
        blocksize = kwargs.get("blocksize")
        fmt = variant_format(quantization, keep_sign, get_format("8bit").blocksize if blocksize is None else blocksize)
        self.quantization = quantization
        self.blockwise = blockwise
        self.keep_sign = keep_sign
        self._own_phases = own_phases
        super().__init__(params, *args, state_format=fmt, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(quantization=self.quantization, blockwise=self.blockwise, keep_sign=self.keep_sign,
                     own_phases=self._own_phases)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.quantization = state.pop("quantization", "dynamic")
        self.blockwise = state.pop("blockwise", True)
        self.keep_sign = state.pop("keep_sign", True)
        self._own_phases = state.pop("own_phases", not self.blockwise or not self.keep_sign or self.custom_requantize)
        super().__setstate__(state)

    # the core's hooks: per-tensor scales, and the requantization a subclass may override
    def _custom_quantize(self) -> bool:
        return self._own_phases

    def _expected_state(self, p, rule, group, quantized):
        expected = dict(super()._expected_state(p, rule, group, quantized))  # (the core's is remembered: a copy)
        if not self.blockwise:  # one scale for the whole tensor
            for spec in self.state_specs(rule):
                if spec.scales_key in expected:
                    expected[spec.scales_key] = ((1,), torch.float32)
        return expected

    def decode(self, state, spec, p, target=None):
        if not self._own_phases or spec.name in state:
            return super().decode(state, spec, p, target)
        target = p if target is None else target
        n = target.numel()
        values = dequantize_blocks(state[spec.codes_key], state[spec.scales_key], self.moment(spec).qmap().to(target.device),
                                   self.format.blocksize if self.blockwise else max(n, 1))
        return values.view(target.shape)

    def quantize(self, spec, x, fmt, shape):
        return self._requantize(x, fmt.qmap().to(x.device), fmt.blocksize if self.blockwise else max(x.numel(), 1))

    def _requantize(self, x: torch.Tensor, code: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Requantize a flat fp32 state: ``(codes uint8, absmax per block)``, with this variant's sign rule."""
        return quantize_blocks(x, code, blocksize, keep_sign=self.keep_sign)

    def __repr__(self) -> str:
        scales = "blockwise" if self.blockwise else "per-tensor"
        signs = "" if self.keep_sign else ", signs not kept"
        return super().__repr__().replace("(backend:", f"({self.quantization} map, {scales} scales{signs}, backend:", 1)
