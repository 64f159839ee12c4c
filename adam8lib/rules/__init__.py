"""Update rules of the optimizer family (issue 35): each one the states it keeps, its hyper-parameters
and their checks, and its step in fp32 (:class:`~adam8lib.rules.base.UpdateRule`). The optimizers that
store those states in a format are in :mod:`adam8lib.quantized_state` and :mod:`adam8lib.family`.

Adding an optimizer: write its rule (a module here: ``states``, ``hyperparameters``, ``check``, an fp32
``update`` that changes its states in place and returns the new parameter), then a class of a few lines::

    class MyRule8bit(QuantizedStateOptimizer):
        rule = MyRule()
        state_format = "8bit"        # or "4bit", "fp8", "fp32", ...

        def __init__(self, params, lr=1e-3, weight_decay=0.0, **kwargs):
            super().__init__(params, dict(lr=lr, weight_decay=weight_decay), **kwargs)

Checkpoints, bad-input checks, the non-finite rule (elementwise rules), torch.optim's conventions and
every state format come with the core; tests/test_torch_optim_conventions.py's ``FAMILY`` list runs the
conventions over a new class once it is added there."""

from .ademamix import AdEMAMixRule
from .adamw import AdamWRule
from .base import StateSpec, UpdateRule
from .lion import LionRule
from .muon import MuonRule
from .rmsprop import AdagradRule, RMSpropRule
from .sgd import SGDMomentumRule

__all__ = ["StateSpec", "UpdateRule", "LionRule", "AdEMAMixRule", "RMSpropRule", "AdagradRule",
           "SGDMomentumRule", "AdamWRule", "MuonRule"]
