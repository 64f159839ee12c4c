"""Update rules of the optimizer family (issue 35): each one the states it keeps, its hyper-parameters
and their checks, and its step in fp32 (:class:`~adam8lib.rules.base.UpdateRule`). The optimizers that
store those states in a format are in :mod:`adam8lib.quantized_state` and :mod:`adam8lib.family`."""

from .ademamix import AdEMAMixRule
from .adamw import AdamWRule
from .base import StateSpec, UpdateRule
from .lion import LionRule
from .muon import MuonRule
from .rmsprop import AdagradRule, RMSpropRule
from .sgd import SGDMomentumRule

__all__ = ["StateSpec", "UpdateRule", "LionRule", "AdEMAMixRule", "RMSpropRule", "AdagradRule",
           "SGDMomentumRule", "AdamWRule", "MuonRule"]
