"""The board's rows: every update rule x every state format, the library anchors, and the lr sweep grid.

A row is a :class:`Row`: a key (the run files' name), the rule it belongs to, its state format, who
implements it, and ``make(groups, cfg, lr)`` -> a torch optimizer over the LM's param groups (each
group carries its weight decay: 0.01 on the matrices, 0 on biases and norms, ``make_param_groups``).

Rows that are the LM benchmark's own runs (``bench/convergence.py lm`` and ``beyond``: fp32 AdamW, adam8lib
Adam8bit / Adam4bit / AdamFp8, bitsandbytes Adam8bit, torchao AdamW4bit, all at the LM's lr 2e-3) name
their stored kind in ``reuse``: the board reads those runs instead of repeating them.

**Hyper-parameters besides the lr.** Each rule keeps the LM's weight decay groups and its own usual betas,
except where the LM's AdamW setting is the natural one to share:

* Lion: betas (0.9, 0.99) (the paper's and bitsandbytes' default); decoupled decay lr x wd, as bitsandbytes.
* AdEMAMix: the LM's (beta1, beta2) = (0.9, 0.98) and the paper's beta3 = 0.9999, alpha = 5, with both
  warm-ups over the whole run (t_alpha = t_beta3 = steps, as the paper sets them to the run length).
  250 steps is short for an EMA of horizon 10,000 steps: the slow EMA's warm-up schedule starts at
  beta1 and only reaches 0.9999 at the last step, so what is measured is AdEMAMix as it behaves on a
  short run, not the long-run regime the paper reports.
* RMSprop: alpha 0.99, eps 1e-8, no momentum (bitsandbytes' CPU step has none); its weight decay is
  L2 (added to the gradient), as torch's and bitsandbytes' RMSprop.
* Muon: torch.optim.Muon's defaults (momentum 0.95, Nesterov, 5 Newton-Schulz steps, the "original" lr
  adjustment) on the hidden matrices; the embeddings (token and position; the output head is tied to the
  token embedding), biases and norm weights go to its AdamW group, as torch's documentation advises,
  at the LM's AdamW lr 2e-3 and betas (0.9, 0.98). Only the Muon lr is swept.
* Adan: adam8lib's defaults, which are pytorch-optimizer's (betas (0.98, 0.92, 0.99), eps 1e-8, weight decay
  not decoupled: the groups' 0.01 on the matrices as Adan's own decay); fp32 and 8-bit states only (Adan8bit:
  its three moments in 8 bits, the previous gradient in fp32).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

#: The LM benchmark's AdamW learning rate and betas (bench/lm_task.py LMConfig).
ADAMW_LR = 2e-3
LION_BETAS = (0.9, 0.99)
ADEMAMIX_BETA3 = 0.9999
ADEMAMIX_ALPHA = 5.0

RULES = ("adamw", "lion", "ademamix", "rmsprop", "muon", "adan")
RULE_LABELS = {"adamw": "AdamW", "lion": "Lion", "ademamix": "AdEMAMix", "rmsprop": "RMSprop", "muon": "Muon",
               "adan": "Adan"}
FORMATS = ("fp32", "8bit", "4bit", "fp8")

#: The lr sweep (fp32 states, seeds SWEEP_SEEDS): about each rule's usual scale, factors of 2.
SWEEP_LRS = {
    "adamw": (1e-3, 2e-3, 4e-3),
    "lion": (2.5e-4, 5e-4, 1e-3),
    "ademamix": (1e-3, 2e-3, 4e-3),
    "rmsprop": (2.5e-4, 5e-4, 1e-3, 2e-3),
    "muon": (5e-3, 1e-2, 2e-2, 4e-2),
    "adan": (2e-3, 4e-3, 8e-3, 1.6e-2),
}
SWEEP_SEEDS = (100, 101)


@dataclass(frozen=True)
class Row:
    key: str
    rule: str
    state_format: str  # "fp32", "8bit", "4bit", "fp8"
    library: str  # "torch", "adam8lib", "bitsandbytes", "torchao", or "custom"
    label: str
    make: Callable[[list[dict[str, Any]], Any, float], torch.optim.Optimizer] = field(compare=False)
    reuse: str | None = None  # the kind of bench/results/runs/lm/ these runs are (lr 2e-3 only)


# ---------------------------------------------------------------------- factories
def _adamw(groups, cfg, lr):
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(cfg.betas))


def _adam8lib_adam(fmt):
    def make(groups, cfg, lr):
        if fmt == "8bit":
            from adam8lib import Adam8bit

            return Adam8bit(groups, lr=lr, betas=tuple(cfg.betas))
        from adam8lib.optim import LowBitAdam

        return LowBitAdam(groups, lr=lr, betas=tuple(cfg.betas), state_format=fmt)
    return make


def _bnb_adam8bit(groups, cfg, lr):
    import bitsandbytes as bnb

    return bnb.optim.Adam8bit(groups, lr=lr, betas=tuple(cfg.betas))


def _torchao_adamw4bit(groups, cfg, lr):
    from torchao.optim import AdamW4bit

    return AdamW4bit(groups, lr=lr, betas=tuple(cfg.betas))


def _lion(fmt):
    def make(groups, cfg, lr):
        from adam8lib import Lion

        return Lion(groups, lr=lr, betas=LION_BETAS, state_format=fmt)
    return make


def _bnb_lion8bit(groups, cfg, lr):
    import bitsandbytes as bnb

    return bnb.optim.Lion8bit(groups, lr=lr, betas=LION_BETAS)


def ademamix_kwargs(cfg) -> dict[str, Any]:
    b1, b2 = cfg.betas
    return dict(betas=(b1, b2, ADEMAMIX_BETA3), alpha=ADEMAMIX_ALPHA, t_alpha=cfg.steps, t_beta3=cfg.steps)


def _ademamix(fmt):
    def make(groups, cfg, lr):
        from adam8lib import AdEMAMix

        return AdEMAMix(groups, lr=lr, state_format=fmt, **ademamix_kwargs(cfg))
    return make


def _bnb_ademamix8bit(groups, cfg, lr):
    import bitsandbytes as bnb

    return bnb.optim.AdEMAMix8bit(groups, lr=lr, **ademamix_kwargs(cfg))


def _rmsprop(fmt):
    def make(groups, cfg, lr):
        from adam8lib import RMSprop8bit

        return RMSprop8bit(groups, lr=lr, alpha=0.99, eps=1e-8, state_format=fmt)
    return make


#: Attribute the board puts on each LM parameter (its name in the model), so Muon's groups can be split.
NAME_ATTR = "_board_name"


def muon_groups(groups: list[dict[str, Any]], cfg) -> list[dict[str, Any]]:
    """Split the LM's groups: hidden 2-D matrices to Muon, everything else (embeddings, biases, norms) to
    Muon8bit's AdamW at the LM's AdamW lr and betas. Needs the names :data:`NAME_ATTR`."""
    out = []
    for group in groups:
        names = [getattr(p, NAME_ATTR, None) for p in group["params"]]
        if None in names:
            raise ValueError("muon rows need the parameters' names (run them through bench.board)")
        hidden = [p for p, n in zip(group["params"], names) if p.dim() == 2 and ".wte." not in f".{n}"
                  and ".wpe." not in f".{n}"]
        other = [p for p in group["params"] if not any(p is q for q in hidden)]
        if hidden:
            out.append({**group, "params": hidden, "use_muon": True})
        if other:
            out.append({**group, "params": other, "use_muon": False, "lr": ADAMW_LR,
                        "adamw_betas": tuple(cfg.betas)})
    return out


def _muon(fmt):
    def make(groups, cfg, lr):
        from adam8lib import Muon8bit

        return Muon8bit(muon_groups(groups, cfg), lr=lr, state_format=fmt)
    return make


def _adan(fmt):
    def make(groups, cfg, lr):
        from adam8lib import Adan, Adan8bit

        return (Adan8bit if fmt == "8bit" else Adan)(groups, lr=lr)
    return make


# ---------------------------------------------------------------------- the rows
def _rows() -> dict[str, Row]:
    rows = [
        Row("adamw", "adamw", "fp32", "torch", "torch AdamW (fp32 states): the baseline", _adamw, reuse="adamw"),
        Row("adamw-8bit", "adamw", "8bit", "adam8lib", "adam8lib AdamW8bit", _adam8lib_adam("8bit"), reuse="adam8bit"),
        Row("adamw-4bit", "adamw", "4bit", "adam8lib", "adam8lib AdamW4bit", _adam8lib_adam("4bit"), reuse="adam4bit"),
        Row("adamw-fp8", "adamw", "fp8", "adam8lib", "adam8lib AdamWFp8", _adam8lib_adam("fp8"), reuse="adamfp8"),
        Row("bnb-adamw8bit", "adamw", "8bit", "bitsandbytes", "bitsandbytes AdamW8bit (= its Adam8bit here)",
            _bnb_adam8bit, reuse="bnb8bit"),
        Row("torchao-adamw4bit", "adamw", "4bit", "torchao", "torchao AdamW4bit", _torchao_adamw4bit,
            reuse="torchao4bit"),
    ]
    for rule, maker in (("lion", _lion), ("ademamix", _ademamix), ("rmsprop", _rmsprop), ("muon", _muon)):
        name = RULE_LABELS[rule]
        for fmt in FORMATS:
            shown = {"8bit": "8-bit", "4bit": "4-bit", "fp8": "FP8 (e4m3)"}.get(fmt, fmt)
            label = f"adam8lib {name} (fp32 states)" if fmt == "fp32" else f"adam8lib {name}, {shown} states"
            rows.append(Row(f"{rule}-{fmt}", rule, fmt, "adam8lib", label, maker(fmt)))
    rows += [
        Row("bnb-lion8bit", "lion", "8bit", "bitsandbytes", "bitsandbytes Lion8bit", _bnb_lion8bit),
        Row("bnb-ademamix8bit", "ademamix", "8bit", "bitsandbytes", "bitsandbytes AdEMAMix8bit", _bnb_ademamix8bit),
        Row("adan-fp32", "adan", "fp32", "adam8lib", "adam8lib Adan (fp32 states)", _adan("fp32")),
        Row("adan-8bit", "adan", "8bit", "adam8lib", "adam8lib Adan8bit", _adan("8bit")),
    ]
    return {r.key: r for r in rows}


ROWS = _rows()

def sweep_row(rule: str) -> Row:
    """The row the sweep runs for ``rule``: its fp32 states."""
    return ROWS["adamw" if rule == "adamw" else f"{rule}-fp32"]
