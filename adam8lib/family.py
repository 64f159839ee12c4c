"""The 8-bit optimizer family beyond Adam (issue 35): each class is an update rule of :mod:`adam8lib.rules`
on the one core, :class:`adam8lib.quantized_state.QuantizedStateOptimizer`, with a default state format.

=================  ==========================  =====================================================
class              rule                        states (format by default)
=================  ==========================  =====================================================
``Lion``           Lion                        ``exp_avg`` (fp32)
``Lion8bit``       Lion                        ``exp_avg`` (8-bit, signed map)
``Lion4bit``       Lion                        ``exp_avg`` (4-bit, signed 4-bit map, blocks of 128)
``AdEMAMix``       AdEMAMix                    ``exp_avg_fast``, ``exp_avg_slow``, ``exp_avg_sq`` (fp32)
``AdEMAMix8bit``   AdEMAMix                    the same three, 8-bit (signed, signed, unsigned map)
``RMSprop8bit``    RMSprop                     ``square_avg`` (8-bit, signed map, as bitsandbytes)
``Adagrad8bit``    Adagrad                     ``sum`` (8-bit, signed map, as bitsandbytes)
``SGD8bit``        SGD with momentum           ``momentum_buffer`` (8-bit, signed map)
``Adan``           Adan                        ``exp_avg``, ``exp_avg_diff``, ``exp_avg_sq``, ``prev_grad`` (fp32)
``Adan8bit``       Adan                        the first three 8-bit (signed, signed, unsigned map); ``prev_grad``
                                               kept in fp32 (not a moment)
=================  ==========================  =====================================================

Their arguments and defaults are bitsandbytes 0.50.2's, but two of ``SGD8bit``: ``lr`` defaults to 1e-3
(bitsandbytes requires it) and ``momentum`` to 0.9 (bitsandbytes' default, 0, is refused by its own class).
bitsandbytes' ``args``, ``optim_bits`` and ``is_paged`` are not taken (no paging here). bitsandbytes has no Adan:
``Adan``'s arguments and defaults are pytorch-optimizer 3.11.0's (:mod:`adam8lib.rules.adan`), less its
global-norm clipping.
Every class takes ``state_format`` (any format of :mod:`adam8lib.formats`, or ``"fp32"``), ``blocksize``,
``min_8bit_size`` (4096), ``backend`` (the reference step), and ``stochastic_rounding``/``seed`` (bf16 weights, as
``AdamW8bit``: the same core); every class steps FSDP2 (DTensor) shards with the unsharded run's bits (see
:mod:`adam8lib.quantized_state`). On the CPU, with bitsandbytes' rounding plugged into
:meth:`~adam8lib.quantized_state.QuantizedStateOptimizer.quantize`, their states and parameters equal
bitsandbytes' classes bit for bit (tests/test_family_bnb.py). Options bitsandbytes does not implement
(RMSprop's momentum and centered, Adagrad's lr_decay and initial accumulator, SGD's dampening and
Nesterov) raise ValueError unless left at their defaults; bitsandbytes' CPU step silently ignores
RMSprop's momentum.
"""

from __future__ import annotations

from typing import Any

from .quantized_state import QuantizedStateOptimizer
from .rules import AdagradRule, AdanRule, AdEMAMixRule, LionRule, RMSpropRule, SGDMomentumRule

__all__ = ["Lion", "Lion8bit", "Lion4bit", "AdEMAMix", "AdEMAMix8bit", "RMSprop8bit", "Adagrad8bit", "SGD8bit",
           "Adan", "Adan8bit"]


def _refuse(name: str, value: Any, default: Any, why: str) -> None:
    if value != default:
        raise ValueError(f"{name}={value!r} is not supported ({why}); leave it at {default!r}")


class Lion(QuantizedStateOptimizer):
    """Lion (:mod:`adam8lib.rules.lion`: sign update, decoupled weight decay scaled by lr, as
    bitsandbytes >= 0.50.0) with fp32 states; ``Lion8bit``/``Lion4bit`` store them in 8 or 4 bits."""

    rule = LionRule()
    state_format = "fp32"

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0,
                 **kwargs: Any) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay), **kwargs)


class Lion8bit(Lion):
    """:class:`Lion` with its momentum in 8 bits (bitsandbytes' ``Lion8bit``)."""

    state_format = "8bit"


class Lion4bit(Lion):
    """:class:`Lion` with its momentum in 4 bits (the ``"4bit"`` format's m: signed 4-bit map, blocks of 128)."""

    state_format = "4bit"


class AdEMAMix(QuantizedStateOptimizer):
    """AdEMAMix (:mod:`adam8lib.rules.ademamix`) with fp32 states; ``AdEMAMix8bit`` stores them in 8 bits."""

    rule = AdEMAMixRule()
    state_format = "fp32"

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
                 alpha: float = 5.0, t_alpha: int | None = None, t_beta3: int | None = None, eps: float = 1e-8,
                 weight_decay: float = 1e-2, **kwargs: Any) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas), alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3,
                                      eps=eps, weight_decay=weight_decay), **kwargs)


class AdEMAMix8bit(AdEMAMix):
    """:class:`AdEMAMix` with its three states in 8 bits (bitsandbytes' ``AdEMAMix8bit``)."""

    state_format = "8bit"


class RMSprop8bit(QuantizedStateOptimizer):
    """RMSprop (:mod:`adam8lib.rules.rmsprop`) with its state in 8 bits (bitsandbytes' ``RMSprop8bit``)."""

    rule = RMSpropRule()

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0,
                 momentum: float = 0.0, centered: bool = False, **kwargs: Any) -> None:
        _refuse("momentum", momentum, 0.0, "bitsandbytes' CPU step ignores it; this rule has no momentum buffer")
        _refuse("centered", centered, False, "centered RMSprop is not implemented, as in bitsandbytes")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay), **kwargs)


class Adagrad8bit(QuantizedStateOptimizer):
    """Adagrad (:mod:`adam8lib.rules.rmsprop`) with its sum in 8 bits (bitsandbytes' ``Adagrad8bit``)."""

    rule = AdagradRule()

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, **kwargs: Any) -> None:
        _refuse("lr_decay", lr_decay, 0.0, "not implemented, as in bitsandbytes")
        _refuse("initial_accumulator_value", initial_accumulator_value, 0.0, "not implemented, as in bitsandbytes")
        super().__init__(params, dict(lr=lr, eps=eps, weight_decay=weight_decay), **kwargs)


class SGD8bit(QuantizedStateOptimizer):
    """SGD with momentum (:mod:`adam8lib.rules.sgd`), the buffer in 8 bits (bitsandbytes' ``SGD8bit``)."""

    rule = SGDMomentumRule()

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.9, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, **kwargs: Any) -> None:
        _refuse("dampening", dampening, 0.0, "not implemented, as in bitsandbytes")
        _refuse("nesterov", nesterov, False, "not implemented, as in bitsandbytes")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay), **kwargs)


class Adan(QuantizedStateOptimizer):
    """Adan (:mod:`adam8lib.rules.adan`, as pytorch-optimizer's ``Adan``) with fp32 states; ``Adan8bit`` stores its
    three moments in 8 bits. The previous gradient stays fp32 in every format. ``max_grad_norm`` (pytorch-optimizer's
    global-norm clipping) is refused unless 0: clip the gradients before the step instead."""

    rule = AdanRule()
    state_format = "fp32"

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float, float] = (0.98, 0.92, 0.99),
                 weight_decay: float = 0.0, weight_decouple: bool = False, max_grad_norm: float = 0.0,
                 eps: float = 1e-8, **kwargs: Any) -> None:
        _refuse("max_grad_norm", max_grad_norm, 0.0, "a global norm, not an elementwise step; clip the gradients "
                "before the step (torch.nn.utils.clip_grad_norm_)")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      weight_decouple=weight_decouple), **kwargs)


class Adan8bit(Adan):
    """:class:`Adan` with its three moments in 8 bits (signed, signed, unsigned map) and the previous gradient in fp32."""

    state_format = "8bit"
