"""Checks for workbook 13 · one state, many optimizers: Lion8bit written on the library's core (an update rule
on :class:`~adam8lib.quantized_state.QuantizedStateOptimizer`), the bytes of one state in each format, and the
entries of Lion's update that quantizing m flips.

13.1 hands the learner's class to course drivers (:mod:`adam8lib.course.grading.drivers.ex13`): they build and
step it over the scenario this check makes (its parameters, every step's gradients) and return plain data — the
parameters, the states, the defaults, the settings refused — which this check compares with its own Lion8bit (and
bitsandbytes') run on the same scenario. When graded, the drivers run in the learner's process and everything here
in the check process; in a notebook both run in the kernel."""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from ...family import Lion8bit
from ...formats import FORMATS
from ...quantized_state import QuantizedStateOptimizer
from ...rules import LionRule
from ...rules.base import StateSpec, UpdateRule
from ..grading.drivers import drive
from ..grading.drivers import ex13 as _drivers
from ..grading.drivers.ex13 import with_bnb_rounding  # noqa: F401 - the plug, importable here as before
from ._common import assert_equal, call, fail, passed, refail, require_callable

__all__ = ["check_lion8bit", "check_state_bytes", "check_lion_flips"]


# ---------------------------------------------------------------------------- 13.1
STEPS = 10
DEFAULTS = {"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.0}


def _params(dtype=torch.float32) -> list[torch.nn.Parameter]:
    """A matrix of 70 x 61 = 4,270 elements (8-bit states, not a whole number of blocks), a vector of 4,100
    (8-bit states, a short last block) and a bias of 61 (under min_8bit_size: fp32 states)."""
    gen = torch.Generator().manual_seed(3)
    return [torch.nn.Parameter(torch.randn(70, 61, generator=gen).to(dtype)),
            torch.nn.Parameter(torch.randn(4100, generator=gen).to(dtype)),
            torch.nn.Parameter(torch.randn(61, generator=gen).to(dtype))]


def _grads(steps: int = STEPS) -> list[list[torch.Tensor]]:
    """Normal gradients; every third step spread over seven decades (tiny states, where codes are coarse)."""
    gen = torch.Generator().manual_seed(7)
    out = []
    for t in range(steps):
        step = []
        for shape in ((70, 61), (4100,), (61,)):
            g = torch.randn(shape, generator=gen)
            if t % 3 == 2:
                g = g * 10.0 ** (-7 * torch.rand(shape, generator=gen))
            step.append(g)
        out.append(step)
    return out


def _scenario(steps: int = STEPS, dtype=torch.float32) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """The parameters (as plain tensors) and every step's gradients that :func:`_run` steps over."""
    return [p.detach() for p in _params(dtype)], [[g.to(dtype) for g in step] for step in _grads(steps)]


def _learner_run(cls, kwargs: dict, bnb_rounding: bool = False) -> tuple[list[torch.Tensor], list[dict], bool, list]:
    """The learner's class stepped over :func:`_scenario` by the course's driver: its parameters and states,
    whether a step changed the gradient it was handed, and the parameters after every step."""
    params, grads = _scenario()
    ran = drive(cls, _drivers.step_optimizer, dict(kwargs), params, grads, bnb_rounding=bnb_rounding, trace=True)
    return ran["params"], ran["states"], bool(ran.get("grads_changed")), ran.get("trace") or []


def _run(make, steps: int = STEPS, dtype=torch.float32, trace: list | None = None):
    params = _params(dtype)
    opt = make(params)
    for grads in _grads(steps):
        for p, g in zip(params, grads):
            p.grad = g.to(dtype)
        opt.step()
        if trace is not None:
            trace.append([p.detach().clone() for p in params])
    return params, opt


_TENSORS = ("the 70 x 61 matrix (8-bit state)", "the vector of 4,100 (8-bit state)", "the bias of 61 (fp32 state)")


def _first_off(ours: list, ref: list, lr: float) -> str:
    """Where the learner's parameters first leave the reference's: 'from step k of N, on <tensor>, ...'."""
    for k, (a, b) in enumerate(zip(ours, ref), start=1):
        if not _params_close(a, b, lr):
            off = [name for name, x, y in zip(_TENSORS, a, b) if not _params_close([x], [y], lr)]
            on = "every tensor" if len(off) == len(_TENSORS) else " and ".join(off)
            return f"from step {k} of {len(ref)} on, on {on}"
    return f"after {len(ref)} steps"


def _states(opt, params) -> list[dict[str, torch.Tensor]]:
    """Each parameter's state tensors under the names m / m_codes / m_absmax, whatever the rule calls its state."""
    out = []
    for p in params:
        name = opt.rule.states[0].name
        st = opt.state[p]
        renamed = {}
        for suffix in ("", "_codes", "_absmax"):
            if torch.is_tensor(st.get(name + suffix)):
                renamed["m" + suffix] = st[name + suffix]
        out.append(renamed)
    return out


def _bnb_states(opt, params) -> list[dict[str, torch.Tensor]]:
    out = []
    for p in params:
        st = opt.state[p]
        if "absmax1" in st:
            out.append({"m_codes": st["state1"].reshape(-1), "m_absmax": st["absmax1"].reshape(-1)})
        else:
            out.append({"m": st["state1"]})
    return out


def _variant_rule(**mistake: bool) -> type[UpdateRule]:
    """Lion with one plausible mistake switched on (for naming the learner's)."""

    class Variant(UpdateRule):
        name = "lion-variant"
        states = (StateSpec("exp_avg", "v" if mistake.get("unsigned") else "m"),)
        hyperparameters = dict(DEFAULTS)

        def check(self, group):
            LionRule().check(group)

        def update(self, p, g, states, *, step, group):
            m = states["exp_avg"]
            beta1, beta2 = group["betas"]
            if mistake.get("betas_swapped"):  # the pair read in the wrong order
                beta2, beta1 = group["betas"]
            lr, wd = group["lr"], group["weight_decay"]
            if mistake.get("coupled"):
                g = g + wd * p
            elif not mistake.get("decay_after") and not mistake.get("no_decay"):
                p.mul_(1.0 - (wd if mistake.get("decay_without_lr") else lr * wd))
            if mistake.get("ema_first"):
                m.mul_(beta2).add_(g, alpha=1.0 - beta2)
            if mistake.get("interp_in_m"):  # the interpolation written into m itself
                b = beta1
                m.mul_(b).add_(g, alpha=1.0 - b)
                p.add_(torch.sign(m), alpha=-lr)
                m.mul_(beta2).add_(g, alpha=1.0 - beta2)
                return p
            if mistake.get("g_in_place"):  # the gradient scaled in place by (1 - beta1) before the EMA reads it
                g.mul_(1.0 - beta1)
                p.add_(torch.sign(m.mul(beta1) + g), alpha=-lr)
                m.mul_(beta2).add_(g, alpha=1.0 - beta2)
                return p
            b = beta2 if mistake.get("beta2_in_sign") else beta1
            if mistake.get("minus_g"):
                inner = m.mul(b) - g.mul(1.0 - b)
            elif mistake.get("swapped"):
                inner = m.mul(1.0 - b) + g.mul(b)
            else:
                inner = m.mul(b) + g.mul(1.0 - b)
            if mistake.get("sign_old_m"):  # the direction from the old momentum alone
                inner = m.clone()
            elif mistake.get("sign_of_g"):  # the direction from the gradient alone
                inner = g
            step_dir = inner if mistake.get("no_sign") else torch.sign(inner)
            p.add_(step_dir, alpha=lr if mistake.get("ascent") else -lr)
            if mistake.get("decay_after"):
                p.mul_(1.0 - lr * wd)
            if not mistake.get("ema_first") and not mistake.get("no_state_update"):
                b_state = beta1 if mistake.get("beta1_in_state") else beta2
                m.mul_(b_state).add_(g, alpha=1.0 - b_state)
            return p

    return Variant


def _variant_class(**mistake: bool):
    rule = _variant_rule(**mistake)()

    class VariantLion(QuantizedStateOptimizer):
        state_format = "8bit"

        def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, **kwargs):
            super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay), **kwargs)

    VariantLion.rule = rule
    return VariantLion


#: (mistake switches, hint): the usual ways to get Lion wrong, each named.
LION_MISTAKES = [
    ({"minus_g"}, "the sign of the interpolation is wrong: Lion's direction is sign(beta1 * m + (1 - beta1) * g), "
                  "a PLUS between the two terms (you subtract the gradient's share)."),
    ({"swapped"}, "the interpolation weights are swapped: beta1 multiplies the momentum m and (1 - beta1) the "
                  "gradient, sign(beta1 * m + (1 - beta1) * g)."),
    ({"betas_swapped"}, "your two betas are swapped: the FIRST of the pair (0.9 by default) weighs the old momentum "
                        "against the gradient in the step's direction, the SECOND (0.99) is the momentum's own rate "
                        "when it is updated. You used each in the other's place: check the order in which you read "
                        "the pair."),
    ({"beta2_in_sign"}, "you interpolate with beta2 (or take the sign of the momentum after its update, which is the "
                        "same thing): the step's direction weighs the OLD momentum with the first beta (0.9) against "
                        "the gradient; the second beta (0.99) is only the momentum's own rate."),
    ({"sign_old_m"}, "on the first step, with the momentum still 0, your parameters did not move (only the decay "
                     "acted): your step's direction is the sign of the old momentum alone. Lion's direction mixes the "
                     "old momentum with the CURRENT gradient (weighted by the first beta) before taking the sign, so "
                     "the gradient moves the weights from the very first step."),
    ({"sign_of_g"}, "your step's direction follows the current gradient alone, as signSGD would: the momentum you "
                    "keep (it is updated right) never reaches the step. Lion's direction mixes the old momentum with "
                    "the gradient, weighted by the first beta, before taking the sign."),
    ({"beta1_in_state"}, "your state is updated with beta1: Lion's momentum m <- beta2 * m + (1 - beta2) * g uses "
                         "beta2 (0.99), beta1 is only for the update's direction."),
    ({"ema_first"}, "you update m before taking the sign: Lion takes sign(beta1 * m + (1 - beta1) * g) with the OLD "
                    "m, and only then m <- beta2 * m + (1 - beta2) * g."),
    ({"coupled"}, "your weight decay is coupled (added to the gradient): Lion decays the weight itself, decoupled, "
                  "p <- p * (1 - lr * weight_decay), and the gradient stays as it is."),
    ({"decay_without_lr"}, "your decay is p * (1 - weight_decay): since bitsandbytes 0.50.0 (and in the paper) it "
                           "is scaled by the learning rate, p * (1 - lr * weight_decay)."),
    ({"decay_after"}, "the decay order: decay the weight FIRST, p <- p * (1 - lr * weight_decay), then subtract "
                      "lr * sign(...); decaying after the step also shrinks the step."),
    ({"no_decay"}, "your optimizer does not decay the weights: with weight_decay > 0, p <- p * (1 - lr * "
                   "weight_decay) before the step."),
    ({"ascent"}, "your step climbs the loss: subtract, p <- p - lr * sign(...)."),
    ({"no_sign"}, "your step is the interpolation itself: Lion steps by its SIGN, every entry by exactly lr, "
                  "p <- p - lr * sign(beta1 * m + (1 - beta1) * g)."),
    ({"no_state_update"}, "your momentum never changes: the optimizer keeps only what your rule writes into the "
                          "tensor it was handed in states; giving the name m a new value makes a new tensor that nobody "
                          "keeps. Look at the line that updates the state: does it change that tensor in place?"),
    ({"interp_in_m"}, "you compute the interpolation in m itself, in place: m is the state, so its own update then "
                      "starts from the interpolation instead of the old momentum (the step is right, the momentum "
                      "drifts). Compute the step's direction into a new tensor and leave the state for its update."),
    ({"g_in_place"}, "you scale the gradient in place by (1 - beta1): the momentum's update then reads the scaled "
                     "gradient. The statement says g is left as it is: compute the weighted gradient into a new "
                     "tensor."),
    ({"unsigned"}, "your state is declared stored_as='v', the map for numbers that are never negative: Lion's "
                   "momentum has both signs, so it takes the signed map ('m'). Look at your rule's states."),
]


#: the hint for a rule that puts a new tensor into the states dict instead of updating the one it was handed
REBOUND_STATE = ("your rule does not update its state in place: it writes the new momentum into the dict as a new "
                 "tensor (states['exp_avg'] = ...) instead of updating the tensor it was handed. The optimizer keeps "
                 "the tensor it handed your rule, and for an fp32 state (a tensor under 4,096 elements, like the bias "
                 "here) that is the tensor it stores, so a new tensor put in the dict is lost and that momentum never "
                 "moves. Update the state in place (mul_ and add_, lerp_, or copy_ of the new value into it).")


#: the hint for a rule that writes into the gradient it is handed (whatever else it gets right)
G_IN_PLACE = ("you change the gradient in place: after your rule ran, g holds other numbers (scaled, decayed, or the "
              "interpolation written into it). The statement says g is left as it is: the momentum's update must "
              "read the gradient as it came, and so does anything that looks at the gradient after the step "
              "(logging, clipping, accumulation). Compute what you need from g into new tensors.")


def _params_equal(a, b) -> bool:
    return all(torch.equal(x.detach(), y.detach()) for x, y in zip(a, b))


#: How far a right answer's parameters may be from Lion8bit's, in learning rates, after STEPS steps: another order
#: of the same arithmetic (the paper's ``p -= lr * (sign(c) + wd * p)``, ``torch.lerp`` for the interpolation)
#: rounds differently, a few 1e-4 lr at most here; every listed mistake is a lr * wd * |p| or lr^2 * wd away per
#: step (>= 1e-3 lr), or a sign (2 lr).
RIGHT_TOLERANCE_LR = 5e-4


def _params_close(a, b, lr: float) -> bool:
    """Bit for bit, or within :data:`RIGHT_TOLERANCE_LR` learning rates everywhere (another rounding order)."""
    if _params_equal(a, b):
        return True
    return all(x.shape == y.shape and bool(torch.isfinite(x).all())
               and float((x.detach() - y.detach()).abs().max()) <= RIGHT_TOLERANCE_LR * lr for x, y in zip(a, b))


#: (setting, as printed, the argument a refusal must name): what check(group) must refuse
BAD_SETTINGS = [
    (dict(lr=-1e-3), "lr=-1e-3", "lr"),
    (dict(lr=float("nan")), "lr=nan", "lr"),
    (dict(lr="1e-3"), "lr='1e-3' (a string)", "lr"),
    (dict(betas=(0.9, 1.5)), "betas=(0.9, 1.5)", "beta"),
    (dict(betas=(0.9, 1.0)), "betas=(0.9, 1.0)", "beta"),
    (dict(betas=(1.0, 0.99)), "betas=(1.0, 0.99)", "beta"),
    (dict(weight_decay=-0.1), "weight_decay=-0.1", "weight_decay"),
]
#: settings of the wrong type: the refusal must be a TypeError
WRONG_TYPE = {"lr='1e-3' (a string)"}
BAD_HINTS = {
    "lr=nan": "NaN passes a test written as `if lr < 0: raise`, because every comparison with NaN is False: write "
              "the test so that NaN fails it (`if not lr >= 0: raise`).",
    "lr='1e-3' (a string)": "a string is not a learning rate: check the type first (a TypeError naming lr), before "
                            "comparing it with 0.",
    "betas=(0.9, 1.0)": "beta = 1.0 means the EMA never moves (m <- 1 * m + 0 * g): each beta must be in [0, 1), "
                        "1 itself excluded.",
    "betas=(1.0, 0.99)": "beta = 1.0 means the EMA never moves (m <- 1 * m + 0 * g): each beta must be in [0, 1), "
                         "1 itself excluded.",
}


def _names(message: str, arg: str) -> bool:
    text = message.lower()
    return arg in text or arg.replace("_", " ") in text or (arg == "beta" and "β" in text)


def _check_update_returns_p(cls) -> None:
    """The rule's update, called once on small tensors, returns the parameter tensor (the core writes it back)."""
    p = torch.zeros(4)
    out = call(_as_learner(lambda: drive(cls, _drivers.update_once, p, torch.ones(4), torch.zeros(4), 1,
                                         dict(DEFAULTS, weight_decay=0.1)), cls))
    if not out["tensor"]:
        shown = "None (no return statement reached)" if out["none"] else f"a {out['type']}"
        fail(f"{cls.__name__}.rule.update(p, g, states, ...) returned {shown}, not the updated parameter.",
             hint="update changes p and the state in place and returns p: the core writes what you return into the "
                  "parameter. End update with `return p`.", prop="what update() returns (the parameter p)")
    if tuple(out["shape"]) != tuple(p.shape):
        fail(f"{cls.__name__}.rule.update returned a tensor of shape {tuple(out['shape'])} for a parameter of shape "
             f"{tuple(p.shape)}.", hint="return the parameter itself (p), not the state or a reduction of it.",
             prop="the shape of what update() returns (the parameter's)")
    if out.get("state_rebound") and not out.get("state_kept"):
        fail(f"{cls.__name__}.rule.update(p, g, states, ...) put a new tensor in states['exp_avg'] and left the "
             "tensor it was handed there unchanged.",
             hint=REBOUND_STATE, prop="the state tensor update() was handed (updated in place)")


def _states_track(got: list[dict], want: list[dict]) -> str | None:
    """None when the learner's states are the reference's up to the last bits of the EMA's rounding (fp32
    states within 1e-6, absmax within 1e-5, codes off by at most one in under 1 % of the entries), else why not."""
    for k, (g, w) in enumerate(zip(got, want)):
        if set(g) != set(w):
            return f"tensor {k}: state entries {sorted(g)}, expected {sorted(w)}"
        for key in w:
            a, b = g[key], w[key]
            if a.shape != b.shape:
                return f"tensor {k}: {key} of shape {tuple(a.shape)}, expected {tuple(b.shape)}"
            if key.endswith("_codes"):
                diff = (a.long() - b.long()).abs()
                if int(diff.max()) > 1 or float((diff > 0).double().mean()) > 0.01:
                    return f"tensor {k}: {int((diff > 0).sum())} of {diff.numel()} codes differ"
            elif not torch.allclose(a.float(), b.float(), rtol=1e-5 if key.endswith("_absmax") else 1e-6,
                                    atol=1e-6 * float(b.float().abs().max()) + 1e-30):
                return f"tensor {k}: {key} differs by up to {float((a.float() - b.float()).abs().max()):.3g}"
    return None


def _probe_scenario() -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One tensor of 4,096 entries (8-bit state) and three steps' gradients."""
    gen = torch.Generator().manual_seed(5)
    p = torch.randn(4096, generator=gen)
    return p, [torch.randn(4096, generator=gen) for _ in range(3)]


def _probe(make, kwargs) -> tuple[list[torch.Tensor], list[dict]]:
    """The parameter after each of three steps of ``make``'s optimizer on :func:`_probe_scenario`, and its state."""
    start, grads = _probe_scenario()
    p = torch.nn.Parameter(start.clone())
    opt = make([p], **kwargs)
    out = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        out.append(p.detach().clone())
    return out, _states(opt, [p])


def _learner_probe(cls, kwargs) -> tuple[list[torch.Tensor], list[dict]]:
    """:func:`_probe` of the learner's class, stepped by the course's driver."""
    start, grads = _probe_scenario()
    ran = drive(cls, _drivers.step_optimizer, dict(kwargs), [start], [[g] for g in grads], trace=True)
    return [after[0] for after in ran["trace"]], ran["states"]


def _name_lion_mistake(cls, kwargs) -> str | None:
    """The hint of the listed mistake whose three-step trajectory the learner's class follows (to rounding); of
    several (two mistakes can step alike: a direction from the gradient alone, or from a momentum never updated),
    the one whose state matches too."""
    try:
        ours, our_states = _learner_probe(cls, kwargs)
    except Exception:  # noqa: BLE001 - the probe only names the mistake
        return None
    alike = []
    for switches, hint in LION_MISTAKES:
        theirs, their_states = _probe(_variant_class(**dict.fromkeys(switches, True)), kwargs)
        if all(torch.allclose(a, b, rtol=1e-6, atol=1e-9) for a, b in zip(ours, theirs)):
            try:
                if _states_track(our_states, their_states) is None:
                    return hint
            except Exception:  # noqa: BLE001 - a state the learner's rule shaped otherwise: the steps decide
                pass
            alike.append(hint)
    return alike[0] if alike else None


def _hyper(cls) -> dict[str, Any]:
    return drive(cls, _drivers.optimizer_defaults, list(DEFAULTS))


def _as_learner(fn, cls):
    """``fn`` under the learner's class name, so that :func:`call` reports a stub as theirs."""
    fn.__name__ = fn.__qualname__ = cls.__name__
    return fn


#: the library's Lion classes (what 13.1 compares with): a class or rule built on one is not the learner's own
_LIBRARY_LION = {f"{c.__module__}.{c.__qualname__}" for c in (*Lion8bit.__mro__, *LionRule.__mro__)
                 if c.__module__.startswith("adam8lib.") and c.__name__.startswith("Lion")}


def check_lion8bit(cls) -> None:
    """``cls``: a :class:`QuantizedStateOptimizer` subclass with a Lion rule; it must step as adam8lib's Lion8bit
    (parameters bit for bit, states up to the EMA's last bits) and, with bitsandbytes' rounding plugged in, as
    ``bitsandbytes.optim.Lion8bit``."""
    require_callable(cls, "your optimizer class")
    made = drive(cls, _drivers.describe_optimizer)  # what the class is made of, said by the course's driver
    if not made["core"]:
        fail(f"got {getattr(cls, '__name__', type(cls).__name__)}, not a subclass of QuantizedStateOptimizer.",
             hint="build on the library's core: the optimizer must subclass QuantizedStateOptimizer, as the class "
                  "the workbook gives you does; keep that class and change only the rule.",
             prop="the class your optimizer subclasses (QuantizedStateOptimizer)")
    library = [name for name in made["built_on"] if name in _LIBRARY_LION]
    if library:
        fail(f"{cls.__name__} is built on the library's {library[0]}: that is the Lion your class is compared with, "
             "not yours.",
             hint="write the rule yourself: subclass UpdateRule (your update and check) and QuantizedStateOptimizer, "
                  "as the class the workbook gives you does, without adam8lib's Lion, Lion8bit or LionRule.",
             prop="a rule of your own (not the library's Lion)")
    if not made["rule_ok"]:
        fail(f"{cls.__name__}.rule is {made['rule_repr']}, not an UpdateRule instance.",
             hint="the class attribute rule must be an instance of your UpdateRule subclass (not the class itself, "
                  "nor a function): look at where the class sets it.", prop="the class's rule (an UpdateRule instance)")
    if not made["specs_ok"]:
        fail(f"your rule declares the states {made['specs_repr']}; Lion keeps exactly one.",
             hint="Lion keeps one state, its momentum, stored on the signed map: look at your rule's states "
                  "declaration (one StateSpec).", prop="the states your rule declares (exactly one)")
    if made["state_format"].get("plain") != "8bit":
        fail(f"{cls.__name__}.state_format is {made['state_format_repr']}, expected '8bit'.",
             hint="state_format = '8bit' on the class: the format is data, the rule knows nothing of it.",
             prop="the class's state_format ('8bit')")
    hyper = call(_as_learner(lambda: _hyper(cls), cls))
    if hyper != DEFAULTS:
        fail(f"{cls.__name__}'s defaults are {hyper}, expected {DEFAULTS} (Lion8bit's, bitsandbytes').",
             hint="your class's default arguments are not Lion's: Lion takes a smaller learning rate than Adam and "
                  "a beta2 of 0.99, without decay by default. Look at the __init__ signature and what it passes on.",
             prop="the default arguments (lr, betas, weight_decay)")
    # each setting built once by the course's driver: accepted, or refused with which exception and message
    answers = drive(cls, _drivers.refusals, [bad for bad, _, _ in BAD_SETTINGS] + [dict(lr=0.0)])
    for (bad, what, arg), answer in zip(BAD_SETTINGS, answers):
        refusing = f"check(group) refusing {what}"
        if not answer["accepted"]:
            kind, message = answer["type"], answer["message"]
            if answer["value_or_type"]:
                if answer["type_error"] and "not supported between" in message:
                    fail(f"{cls.__name__}(params, {what}) crashed inside your check: {message}",
                         hint="your check compares the value with a number before making sure it is one: test the "
                              "type first and raise a TypeError naming the argument.",
                         prop=f"{refusing} (a TypeError of your own, naming {arg})")
                if what in WRONG_TYPE and not answer["type_error"]:
                    fail(f"{cls.__name__}(params, {what}) raised {kind}: {message}; a value of the wrong type is "
                         "refused with a TypeError.",
                         hint=f"a string must be refused with a TypeError, not a ValueError: a string is not a "
                              f"learning rate at all, a value of the wrong TYPE, which Python refuses with a "
                              f"TypeError (a ValueError is for a number of the right type but a wrong value, like a "
                              f"negative {arg}). Check the type first and raise TypeError naming {arg!r}, before "
                              "comparing the value with 0.",
                         prop=f"{refusing} with a TypeError (the task asks for one)")
                if not _names(message, arg):
                    fail(f"{cls.__name__}(params, {what}) was refused, but the message does not name the argument: "
                         f"{kind}: {message}",
                         hint=f"a refusal says what was wrong in the user's terms: put the argument's name ({arg!r}) "
                              "and the value you got in the message.",
                         prop=f"{refusing}: the message names the argument ({arg})")
                continue
            fail(f"{cls.__name__}(params, {what}) raised {kind}: {message}",
                 hint="the rule's check(group) raises ValueError (or TypeError) naming the argument, nothing else.",
                 prop=f"{refusing}: the kind of exception (ValueError or TypeError)")
        fail(f"{cls.__name__}(params, {what}) was accepted.",
             hint=BAD_HINTS.get(what, "the rule's check(group) must refuse it with a ValueError naming the argument: "
                                      "lr and weight_decay >= 0, each beta in [0, 1)."),
             prop=f"{refusing} (it was accepted)")
    zero = answers[len(BAD_SETTINGS)]
    if not zero["accepted"]:
        fail(f"{cls.__name__}(params, lr=0.0) was refused ({zero['type']}: {zero['message']}).",
             hint="lr = 0 is a valid setting (a warm-up that starts at 0, a frozen group): refuse only what is below "
                  "0 or not a number.", prop="check(group) accepting lr=0.0 (a valid setting)")
    _check_update_returns_p(cls)
    for kwargs, label in ((dict(lr=1e-2, weight_decay=0.1), "lr=1e-2, weight_decay=0.1"),
                          (dict(lr=3e-3, betas=(0.8, 0.95)), "lr=3e-3, betas=(0.8, 0.95), no decay")):
        ours, ours_states, grads_changed, ours_trace = call(_as_learner(lambda: _learner_run(cls, kwargs), cls))
        ref_trace: list = []
        ref, ref_opt = _run(lambda ps: Lion8bit(ps, **kwargs), trace=ref_trace)  # the check's own run, same scenario
        what = f"{cls.__name__}({label}) after {STEPS} steps"
        if grads_changed:
            named = _name_lion_mistake(cls, kwargs)
            fail(f"{what}: after a step, the gradient your rule was handed is not the one the optimizer gave it.",
                 kind="in_place", what=what, got="g (the gradient update() is handed)",
                 hint=named if named is not None and "in place" in named else G_IN_PLACE,
                 prop="the gradient g after a step (left as it was handed)")
        if not _params_close(ours, ref, kwargs["lr"]):
            named = _name_lion_mistake(cls, kwargs)
            if named is None:
                worst = max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(ours, ref))
                named = (f"your parameters differ from Lion8bit's by up to {worst:.3g} (lr = {kwargs['lr']:g}), and "
                         "not as any of the usual mistakes does: compare your update line by line with the three "
                         "steps of the statement (the decay, the sign step, the state's EMA): which beta each uses, "
                         "their order, and the dtype you compute in.")
            where = _first_off(ours_trace, ref_trace, kwargs["lr"])
            fail(f"{what}: the parameters are not Lion8bit's ({where}).", hint=named,
                 prop=f"the parameters, {where}")
        why = _states_track(ours_states, _states(ref_opt, ref))
        if why:
            fail(f"{what}: the parameters are right but the state is not Lion8bit's ({why}).",
                 hint="the update is right, so look at what your rule writes back into the state: which beta its "
                      "EMA uses, whether it writes into the tensor it was given (in place), and whether it does so "
                      "after the update.",
                 prop=f"the state after {STEPS} steps ({label}; the parameters are right)")
    _check_against_bnb(cls)
    passed("Exercise 13.1 · Lion8bit on the core")


def _check_against_bnb(cls) -> None:
    try:
        import bitsandbytes as bnb  # noqa: F401 - imported quietly by the course's setup
    except Exception:  # noqa: BLE001 - bitsandbytes is optional on some machines
        return
    kwargs = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    ours, ours_states, _, _ = _learner_run(cls, kwargs, bnb_rounding=True)
    theirs, theirs_opt = _run(lambda ps: bnb.optim.Lion8bit(ps, **kwargs))
    if not _params_close(ours, theirs, kwargs["lr"]):
        worst = max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(ours, theirs))
        fail(f"with bitsandbytes' rounding plugged in, {cls.__name__}'s parameters differ from "
             f"bitsandbytes.optim.Lion8bit's by up to {worst:.3g}.",
             hint="adam8lib's Lion8bit matched above, so look at what differs with another quantizer: does your "
                  "class override quantize, decode or step? Keep to rule + state_format + __init__.",
             prop=f"the parameters after {STEPS} steps with bitsandbytes' rounding")
    why = _states_track(ours_states, _bnb_states(theirs_opt, theirs))
    if why:
        fail(f"with bitsandbytes' rounding plugged in, the state is not bitsandbytes' ({why}).",
             hint="keep the state's name and layout to the core's: one StateSpec, stored as 'm'.",
             prop=f"the state after {STEPS} steps with bitsandbytes' rounding")


# ---------------------------------------------------------------------------- 13.2
class _OneState(QuantizedStateOptimizer):
    """A bare optimizer with one state, to read the layout the core creates (``expected_state``)."""

    state_format = "8bit"

    def __init__(self, params, rule, **kwargs):
        self.rule = rule
        super().__init__(params, {}, **kwargs)


def _one_state_rule(stored_as: str) -> UpdateRule:
    class One(UpdateRule):
        name = "one-state"
        states = (StateSpec("s", stored_as),)

        def check(self, group):
            pass

    return One()


def reference_state_bytes(shape: tuple[int, ...], stored_as: str, state_format: str) -> int:
    """Bytes of one state of a tensor of ``shape``, as the core lays it out (min_8bit_size 4,096)."""
    p = torch.nn.Parameter(torch.empty(shape, device="meta"))
    rule = _one_state_rule(stored_as)
    opt = _OneState([p], rule, state_format=state_format)
    return sum(math.prod(s) * torch.empty((), dtype=d).element_size()
               for s, d in opt.expected_state(p, rule).values())


STATE_BYTES_CASES = [
    ((768, 3072), "m"), ((768, 3072), "v"), ((4100,), "m"), ((4100,), "v"), ((70, 61), "v"), ((61,), "m"),
    ((4095,), "m"), ((4096,), "v"), ((2, 768), "m"), ((28996, 768), "v"), ((4097,), "m"), ((63, 65), "v"),
    ((4, 32, 64), "v"), ((4, 32, 64), "m"),  # rank-1 scales for every tensor of two or more dimensions
]


def _state_bytes_variants(shape, stored_as, fmt) -> list[tuple[str, int]]:
    n = math.prod(shape)
    blocks = lambda b: math.ceil(n / b)  # noqa: E731
    codes4 = math.ceil(n / 2)
    rank1 = len(shape) >= 2 and stored_as == "v"
    scales4 = sum(shape) if rank1 else blocks(128)
    out = []
    if n < 4096:
        quantized = {"8bit": n + 4 * blocks(256), "fp8": n + 4 * blocks(256), "4bit": codes4 + 4 * scales4}
        if fmt in quantized:
            out.append(("a tensor under 4,096 elements keeps its state in fp32 (4 bytes per element) in every format: "
                        "min_8bit_size.", quantized[fmt]))
    else:
        if n == 4096 and fmt != "fp32":
            out.append(("4,096 elements is already quantized: only a tensor with FEWER than 4,096 elements "
                        "(n < min_8bit_size) keeps fp32 states.", 4 * n))
        out += [("fp32 keeps 4 bytes per element, not one.", n) if fmt == "fp32" else
                ("you forgot the scales: one fp32 absmax (4 bytes) per block.", codes4 if fmt == "4bit" else n)]
        if fmt in ("8bit", "fp8") and rank1:
            out.append((f"{shape} {stored_as!r} in {fmt!r}: you counted rank-1 scales ({' + '.join(map(str, shape))} "
                        f"= {sum(shape)}); in {fmt} every state has one fp32 absmax per block of 256 — rank-1 scales "
                        "are the 4-bit format's, for 'v' only.", n + 4 * sum(shape)))
        if fmt == "fp8":
            out += [(f"'fp8' codes take one byte each, not half: an FP8 (e4m3) code is 8 bits, so {shape} keeps {n} "
                     "bytes of codes, laid out like the 8-bit format (one fp32 absmax per block of 256).", v)
                    for v in dict.fromkeys((codes4 + 4 * scales4, codes4 + 4 * blocks(256), codes4 + 4 * blocks(128)))]
        if fmt in ("8bit", "fp8"):
            out += [("the last block is short but still has its absmax: round the number of blocks UP, "
                     "ceil(n / 256).", n + 4 * (n // 256)),
                    ("an absmax is an fp32 number: 4 bytes per block, not 1.", n + blocks(256)),
                    ("an FP8 (e4m3) code is one byte, like an 8-bit code.", 2 * n + 4 * blocks(256))]
        if fmt == "4bit":
            if len(shape) > 2 and stored_as == "v":
                out.append((f"rank-1 scales are for every tensor of two or more dimensions, not only matrices: a "
                            f"{len(shape)}-D 'v' keeps one scale per index of each axis, sum(shape) = {sum(shape)} "
                            "fp32 numbers, as lesson 12's format does.", codes4 + 4 * blocks(128)))
            first, rest = shape[0], math.prod(shape[1:])
            last, before = shape[-1], math.prod(shape[:-1])
            each = " + ".join(str(s) for s in shape)
            out += [(f"you counted the {len(shape)}-D 'v' as a matrix of its first axis by the rest flattened, "
                     f"{first} + {rest} scales: rank-1 scales keep one scale per index of EACH axis, "
                     f"{each} = {sum(shape)} for {shape}, not first axis + the product of the others.",
                     codes4 + 4 * (first + rest)),
                    (f"you counted the {len(shape)}-D 'v' as a matrix of the leading axes flattened by the last, "
                     f"{before} + {last} scales: rank-1 scales keep one scale per index of EACH axis, "
                     f"{each} = {sum(shape)} for {shape}.", codes4 + 4 * (before + last))]
            out += [("4-bit codes are two per byte: ceil(n / 2) bytes of codes.", n + 4 * scales4),
                    ("the 4-bit format's blocks are 128 elements, not 256.", codes4 + 4 * (sum(shape) if rank1
                                                                                            else blocks(256))),
                    ("a matrix's 'v' state has rank-1 scales in 4 bits: one per row and one per column "
                     "(rows + columns fp32 numbers), not one per block.", codes4 + 4 * blocks(128)),
                    ("rank-1 scales are for the 'v' state of a matrix only; 'm' and vectors have one absmax per "
                     "block of 128.", codes4 + 4 * (sum(shape) if len(shape) >= 2 else n)),
                    ("two codes per byte: an odd count rounds UP, ceil(n / 2).", n // 2 + 4 * scales4)]
    return out


def check_state_bytes(state_bytes) -> None:
    """``state_bytes(shape, stored_as, state_format) -> int``: bytes of one state (codes + scales, or fp32)."""
    require_callable(state_bytes, "state_bytes")
    for fmt in ("fp32", "8bit", "fp8", "4bit"):
        for shape, stored_as in STATE_BYTES_CASES:
            want = reference_state_bytes(shape, stored_as, fmt)
            got = call(state_bytes, shape, stored_as, fmt)
            what = f"state_bytes({shape}, {stored_as!r}, {fmt!r})"
            if isinstance(got, torch.Tensor) and got.numel() == 1:
                got = got.item()
            if isinstance(got, float) and got.is_integer():
                got = int(got)
            if isinstance(got, bool) or not isinstance(got, int):
                fail(f"{what} returned {got!r} ({type(got).__name__}), expected an int.",
                     hint="bytes are a whole number: use integer arithmetic (math.ceil(n / 256) or -(-n // 256)).")
            if got == want:
                continue
            hint = next((h for h, v in _state_bytes_variants(shape, stored_as, fmt) if v == got and v != want), None)
            if hint is None:
                hint = ("codes: n bytes in 8-bit and FP8, ceil(n / 2) in 4-bit; scales: 4 bytes each, one per block "
                        "(256; 4-bit: 128), or, for a 4-bit 'v' of two or more dimensions, one per index of each "
                        "axis (for (4, 32, 64): 4 + 32 + 64 = 100 scales); under 4,096 elements 4 * n in fp32.")
            assert_equal(got, want, what=what, hint=hint)
    passed("Exercise 13.2 · The bytes of one state")


# ---------------------------------------------------------------------------- 13.3
def reference_lion_flips(m: torch.Tensor, g: torch.Tensor, beta1: float, state_format: str) -> torch.Tensor:
    fmt = FORMATS[state_format].m
    shape = tuple(m.shape)
    stored = fmt.dequantize(*fmt.quantize(m.reshape(-1).float(), shape), shape).view(shape)
    return torch.sign(beta1 * stored + (1 - beta1) * g) != torch.sign(beta1 * m + (1 - beta1) * g)


def _stored(m, state_format, moment="m"):
    fmt = getattr(FORMATS[state_format], moment)
    shape = tuple(m.shape)
    return fmt.dequantize(*fmt.quantize(m.reshape(-1).float(), shape), shape).view(shape)


def _flip_cases():
    gen = torch.Generator().manual_seed(13)
    g = torch.randn(64, 256, generator=gen)
    m = 0.1 * torch.randn(64, 256, generator=gen) * torch.logspace(-4, 0, 256)[torch.randperm(256, generator=gen)]
    close = -(1 - 0.9) / 0.9 * g * (1 + 0.02 * torch.randn(64, 256, generator=gen))  # interpolations near 0
    mixed = torch.where(torch.rand(64, 256, generator=gen) < 0.5, m, close)
    zeros = m.clone()
    zeros[:, ::4] = 0.0
    stalled = torch.full((4, 256), -1e-3)  # the 4-bit m codes these 0: the update goes from -1 to 0, a change
    stalled[:, ::128] = 1.0
    return [("m over four decades, 8-bit", m, g, 0.9, "8bit"),
            ("m often close to cancelling the gradient, 8-bit", mixed, g, 0.9, "8bit"),
            ("the same, 4-bit", mixed, g, 0.9, "4bit"),
            ("the same, FP8, beta1 = 0.95", mixed, g, 0.95, "fp8"),
            ("a quarter of m exactly 0, 4-bit", zeros, g, 0.9, "4bit"),
            ("small negative m beside one large entry per block, g = 0, 4-bit", stalled, torch.zeros(4, 256), 0.9,
             "4bit")]


_SIZES = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")


def _flips_call(lion_flips, m, g, beta1, fmt):
    """The learner's mask for one case; a crash on two shapes that do not broadcast gets a hint that says what
    differs: a decoded state left flat where one size is all of m's entries, the reduction's hint (keepdim) only
    where both sizes are sizes of m's axes (an axis dropped shifts the others)."""
    try:
        return call(lion_flips, m.clone(), g.clone(), beta1, fmt)
    except AssertionError as err:
        sizes = _SIZES.search(str(err).split("\n", 1)[0])  # the learner's error, as call() reported it
        if sizes is None:
            raise
        a, b = int(sizes.group(1)), int(sizes.group(2))
        n, axes = m.numel(), tuple(m.shape)
        if n in (a, b) and _raised_in_quantize(lion_flips, m, g, beta1, fmt):
            hint = (f"the error comes from inside the format's quantize: your m of shape {axes} reached it as it is. "
                    "quantize takes the values flat (and m's shape as its second argument): reshape(-1) before "
                    f"quantize, and give the decoded values m's shape {axes} again after dequantize.")
        elif n in (a, b):
            hint = (f"two tensors your code combines have different shapes (sizes {a} and {b} on one axis), and "
                    f"nothing was reduced: {n} is all of m's entries in one flat row. A decoded state comes back "
                    f"flat unless it is given m's shape: reshape the stored m to m's shape {axes} before combining "
                    "it with g.")
        elif a in axes and b in axes:
            hint = (f"two tensors your code combines line up an axis of {a} with one of {b}, both sizes of m's axes: "
                    "an axis is missing from one of them, as after a reduction without keepdim. Check which axis "
                    "you reduced (keepdim), and print the shape of each tensor you combine.")
        else:
            hint = (f"two tensors your code combines have shapes that do not broadcast (sizes {a} and {b} on one "
                    "axis): print the shape of each. A decoded state comes back flat unless it is given m's shape "
                    f"{axes}.")
        refail(err, hint, kind="error")


def _raised_in_quantize(lion_flips, m, g, beta1, fmt) -> bool:
    """Whether the learner's function raised from inside a format's quantize (its m handed over unflattened)."""
    try:
        found = drive(lion_flips, _drivers.where_flips_raised, m.clone(), g.clone(), beta1, fmt)
    except Exception:  # noqa: BLE001 - only for a hint
        return False
    return bool(isinstance(found, dict) and found.get("in_quantize"))


def _name_uncoded_small(lion_flips, got, m, g, beta1, fmt) -> str | None:
    """The hint for a function that leaves a small m uncoded (no flips under 4,096 elements, min_8bit_size's rule
    carried over from the optimizer) while it codes a large one, or None."""
    n = m.numel()
    if n >= 4096 or bool(got.any()) or m.dim() < 1:
        return None
    k = -(-4096 // n) + 1
    big_m, big_g = m.repeat(k, *([1] * (m.dim() - 1))), g.repeat(k, *([1] * (g.dim() - 1)))
    try:
        big = _flips_call(lion_flips, big_m, big_g, beta1, fmt)
    except AssertionError:
        return None
    if not (isinstance(big, torch.Tensor) and torch.equal(big, reference_lion_flips(big_m, big_g, beta1, fmt))):
        return None
    flips = int(reference_lion_flips(m, g, beta1, fmt).sum())
    return (f"for a tensor of {n} elements your function found no flips where coding in {fmt} flips {flips}, and "
            f"the same values repeated to {big_m.numel()} elements gave the right mask: your function leaves an m "
            "under 4,096 elements uncoded — the optimizer's min_8bit_size rule, which this question does not have: "
            "code m whatever its size.")


#: beta1 values a learner may have written in place of the argument (Lion's, Adam's, the EMA's)
_FIXED_BETAS = (0.9, 0.95, 0.99, 0.999, 0.98, 0.5)


def _name_fixed_beta(lion_flips, got, m, g, beta1, fmt) -> str | None:
    """The hint for a mask that does not follow beta1 (a fixed value written in its place), or None."""
    other = 0.5 if beta1 != 0.5 else 0.8
    try:
        with_other = _flips_call(lion_flips, m, g, other, fmt)
    except AssertionError:
        return None
    if not (isinstance(with_other, torch.Tensor) and with_other.shape == got.shape and torch.equal(with_other, got)):
        return None
    if torch.equal(reference_lion_flips(m, g, other, fmt), reference_lion_flips(m, g, beta1, fmt)):
        return None  # this case cannot tell
    fixed = next((b for b in _FIXED_BETAS if b != beta1 and torch.equal(got, reference_lion_flips(m, g, b, fmt))),
                 None)
    named = f": it is the mask of beta1 = {fixed:g}, a fixed value" if fixed is not None else ""
    return (f"your mask does not change with beta1: with beta1 = {beta1:g} and with beta1 = {other:g} you return the "
            f"same mask{named}. The interpolation weighs m by the beta1 the function is given (and g by 1 - beta1): "
            "use the argument, not a number of your own.")


def check_lion_flips(lion_flips) -> None:
    """``lion_flips(m, g, beta1, state_format) -> bool mask``: the entries of Lion's update that change when m is
    stored in ``state_format`` (coded and decoded by the format's m) instead of fp32."""
    require_callable(lion_flips, "lion_flips")
    first_miss = None
    for label, m, g, beta1, fmt in _flip_cases():
        want = reference_lion_flips(m, g, beta1, fmt)
        got = _flips_call(lion_flips, m, g, beta1, fmt)
        what = f"lion_flips({label})"
        if not isinstance(got, torch.Tensor):
            fail(f"{what} returned {type(got).__name__}, expected a bool tensor shaped like m.",
                 hint="return the mask itself (True where the update changes), not a count or a share.")
        if got.shape != want.shape:
            fail(f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}.",
                 hint="return the mask itself (True where the update changes), not a count or a share."
                 if got.numel() == 1 else "one True/False per entry of m, in m's shape.")
        if got.dtype != torch.bool:
            fail(f"{what} has dtype {got.dtype}, expected torch.bool.",
                 hint="compare the two signs with != : that gives a bool tensor.")
        if torch.equal(got, want):
            continue
        uncoded = _name_uncoded_small(lion_flips, got, m, g, beta1, fmt)
        if uncoded is not None:
            assert_equal(got, want, what=what, hint=uncoded)
        stored = _stored(m, fmt)
        exact = torch.sign(beta1 * m + (1 - beta1) * g)
        variants = [
            ("you compared the signs of m alone: Lion's update is the sign of the INTERPOLATION beta1 * m + (1 - beta1) "
             "* g, so compare that, once with the stored m and once with fp32 m.",
             torch.sign(stored) != torch.sign(m)),
            ("you flagged every entry whose stored m differs from m: most of those errors change the size of m but not "
             "the sign of the interpolation, and Lion's update sees only the sign.", stored != m),
            ("you stored m with the format's 'v' moment (for numbers that are never negative): m is signed, use "
             "FORMATS[state_format].m.", torch.sign(beta1 * _stored(m, fmt, "v") + (1 - beta1) * g) != exact),
            ("the weights are swapped: beta1 multiplies m, (1 - beta1) multiplies g.",
             torch.sign((1 - beta1) * stored + beta1 * g) != torch.sign((1 - beta1) * m + beta1 * g)),
            ("the mask is inverted: True where the update CHANGES.", ~want),
            ("you quantized the gradient too: only the state is stored in the format; g arrives in fp32 every step.",
             torch.sign(beta1 * stored + (1 - beta1) * _stored(g, fmt)) != exact),
            ("you compared 'positive or not' (x > 0), not the sign: an interpolation that becomes exactly 0 once m is "
             "stored (an m coded 0, with g = 0) gives an update of 0 instead of -1 — a change your test cannot see. "
             "Compare the signs, -1, 0 or +1.",
             ((beta1 * stored + (1 - beta1) * g) > 0) != ((beta1 * m + (1 - beta1) * g) > 0)),
        ]
        matching = [h for h, v in variants if torch.equal(got, v)]
        if not matching:
            fixed = _name_fixed_beta(lion_flips, got, m, g, beta1, fmt)
            if fixed is not None:
                assert_equal(got, want, what=what, hint=fixed)
        if len(matching) == 1:  # this case tells the listed mistakes apart: name it now
            assert_equal(got, want, what=what, hint=matching[0])
        first_miss = first_miss or (got, want, what, matching)
    if first_miss is not None:
        got, want, what, matching = first_miss
        hint = matching[0] if matching else (
            "none of the usual mistakes: re-read the statement for which moment format codes m (the signed one), "
            "in which shape it is decoded, and which two update directions the mask compares.")
        assert_equal(got, want, what=what, hint=hint)
    passed("Exercise 13.3 · The signs Lion loses")
