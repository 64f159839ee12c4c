"""``Muon8bit``: torch.optim.Muon's update with its momentum in a state format (8 bits by default).

Muon is not elementwise (:mod:`adam8lib.rules.muon`: momentum, then Newton-Schulz orthogonalization of
the whole matrix), so it has no fused kernel: the core (:mod:`adam8lib.quantized_state`) decodes the
momentum buffer, the rule runs in fp32 (the orthogonalization in bf16, as torch's), and the buffer is
encoded again, blockwise (Gupta et al. 2025, "Effective Quantization of Muon Optimizer States": 8-bit
blockwise momentum). With ``state_format="fp32"`` a 2-D fp32 parameter's step equals ``torch.optim.Muon``'s bit
for bit (tests/test_muon.py). (A bf16 parameter is updated in fp32 and rounded once; torch's Muon
decays and updates it in bf16, two roundings.)

**Which parameters Muon takes.** torch.optim.Muon accepts 2-D parameters only, and its documentation says
that the others, "such as bias, and embedding, should be optimized by a standard method such as AdamW".
Here one optimizer does both: a parameter is stepped by Muon when its group's ``use_muon`` is ``True``,
or when it is ``None`` (the default) and the parameter is 2-D; every other parameter by AdamW
(:class:`~adam8lib.rules.adamw.AdamWRule`, the library's Adam rule: bias-corrected, decoupled decay) with
the group's ``lr`` and ``weight_decay`` and its ``adamw_betas`` and ``adamw_eps``, its two states in the
same state format (fp32 under ``min_8bit_size``). Embeddings and output heads are 2-D: put them in a
group with ``use_muon=False`` (and the AdamW learning rate you want), as torch's documentation advises for
embeddings and Keller Jordan's Muon write-up (which it cites) for the embeddings and the output head::

    Muon8bit([{"params": hidden_matrices},
              {"params": embeddings_heads_biases_norms, "use_muon": False, "lr": 3e-4}], lr=0.02)

``use_muon=True`` on a parameter that is not 2-D raises ValueError.

**FSDP2.** Newton–Schulz orthogonalizes the whole matrix and a shard holds only some of its rows, so a
sharded (DTensor) matrix that the Muon rule would step is refused with a ValueError naming it, at
construction and at ``step()``: keep those matrices unsharded (do not ``fully_shard`` the modules that own
them) or put them in a group with ``use_muon=False``. The AdamW group's parameters may be sharded
(:mod:`adam8lib.quantized_state`).
"""

from __future__ import annotations

from typing import Any

import torch

from .quantized_state import QuantizedStateOptimizer
from .rules import AdamWRule, MuonRule
from .rules.muon import NS_COEFFICIENTS, NS_EPS, NS_STEPS

__all__ = ["Muon8bit"]

_MUON = MuonRule()
_ADAMW = AdamWRule()


class Muon8bit(QuantizedStateOptimizer):
    """Muon (torch.optim.Muon's arguments and defaults) with its momentum in a state format, and AdamW for
    the parameters Muon does not take (see the module docstring).

    Args: ``lr``, ``weight_decay``, ``momentum``, ``nesterov``, ``ns_coefficients``, ``eps``, ``ns_steps``,
    ``adjust_lr_fn`` as torch.optim.Muon; ``adamw_betas`` (0.9, 0.95) and ``adamw_eps`` (1e-8) for the AdamW
    parameters; ``use_muon`` (per group: None, True or False); ``state_format``, ``blocksize``,
    ``min_8bit_size``, ``backend`` as every class of the family.
    """

    rule = _MUON
    state_format = "8bit"

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                 eps: float = NS_EPS, ns_steps: int = NS_STEPS, adjust_lr_fn: str | None = None, *,
                 adamw_betas: tuple[float, float] = (0.9, 0.95), adamw_eps: float = 1e-8,
                 use_muon: bool | None = None, **kwargs: Any) -> None:
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=tuple(ns_coefficients), eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn,
                        adamw_betas=tuple(adamw_betas), adamw_eps=adamw_eps, use_muon=use_muon)
        super().__init__(params, defaults, **kwargs)

    def rule_for(self, p: torch.Tensor, group: dict[str, Any]):
        use = group["use_muon"]
        if use is None:
            return _MUON if p.dim() == 2 else _ADAMW
        if use and p.dim() != 2:
            raise ValueError(f"use_muon=True on a parameter of shape {tuple(p.shape)}: Muon orthogonalizes 2-D "
                             f"parameters only; give it a group with use_muon=False (AdamW) or None")
        return _MUON if use else _ADAMW

    def group_rules(self, group: dict[str, Any]):
        if group["use_muon"] not in (None, True, False):
            raise ValueError(f"use_muon must be None, True or False, got {group['use_muon']!r}")
        return [_MUON, _ADAMW]

    def rule_group(self, rule, group: dict[str, Any]) -> dict[str, Any]:
        if rule is _ADAMW or isinstance(rule, AdamWRule):
            return {"lr": group["lr"], "betas": group["adamw_betas"], "eps": group["adamw_eps"],
                    "weight_decay": group["weight_decay"]}
        return group
