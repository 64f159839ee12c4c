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
from .adan import AdanRule
from .base import StateSpec, UpdateRule
from .lion import LionRule
from .muon import MuonRule
from .rmsprop import AdagradRule, RMSpropRule
from .sgd import SGDMomentumRule

__all__ = ["StateSpec", "UpdateRule", "LionRule", "AdEMAMixRule", "RMSpropRule", "AdagradRule",
           "SGDMomentumRule", "AdamWRule", "MuonRule", "AdanRule", "LIBRARY_RULES", "is_library_rule"]

#: The library's rules by name: what a fused step registered under that name (:mod:`adam8lib.kernels.registry`)
#: computes.
LIBRARY_RULES = {cls.name: cls for cls in (AdamWRule, LionRule, AdEMAMixRule, RMSpropRule, AdagradRule,
                                           SGDMomentumRule, MuonRule, AdanRule)}
_COMPUTES = ("update", "update_unquantized", "states", "elementwise")


def is_library_rule(rule: UpdateRule) -> bool:
    """Whether ``rule`` computes what the library's rule of its name computes: its ``update``,
    ``update_unquantized``, ``states`` and ``elementwise`` are that rule's (a subclass that only checks
    hyper-parameters otherwise still is), none replaced on the instance. A rule of the same name that
    computes something else (a learner's Lion in lesson 13's workbook) is not, and never runs a fused
    step written for the library's. True for a name the library has no rule of (its own registered steps)."""
    cls = LIBRARY_RULES.get(getattr(rule, "name", None))
    if cls is None:
        return True
    return (isinstance(rule, UpdateRule) and not any(k in vars(rule) for k in _COMPUTES)
            and all(getattr(type(rule), k) is getattr(cls, k) for k in _COMPUTES))
