"""Hugging Face ``Trainer``'s optimizer names and the adam8lib class that does the same.

``TrainingArguments(optim="lion_8bit")`` makes ``Trainer`` build bitsandbytes' ``Lion`` with 8-bit
states; ``optim="adamw_torch_4bit"`` torchao's ``AdamW4bit``. :data:`TRAINER_NAMES` maps each of those
names (transformers 5.24's ``OptimizerNames``) to the adam8lib class with the same update rule and the
same state width, and :func:`trainer_optimizer` gives the ``(class, kwargs)`` pair for
``Trainer(optimizer_cls_and_kwargs=...)``, with the hyper-parameters read from the ``TrainingArguments``
exactly as ``Trainer`` reads them for that name (``learning_rate``, ``adam_beta1/2``, ``adam_epsilon``,
``optim_args``)::

    args = TrainingArguments(..., learning_rate=3e-4)
    trainer = Trainer(model=model, args=args, optimizer_cls_and_kwargs=trainer_optimizer("lion_8bit", args))

Weight decay is not in the kwargs: ``Trainer`` puts it in its two parameter groups (biases and norms
without), for the named optimizers and for ``optimizer_cls_and_kwargs`` alike.

What is not the same: ``paged_*`` names page bitsandbytes' states to CPU memory under GPU memory
pressure (adam8lib has no paging: the row names the unpaged class); the codes of adam8lib's 8-bit
states are the exact nearest ones, bitsandbytes' its CPU/GPU kernels' rounding (equal with
bitsandbytes' rounding plugged in: ``tests/test_family_bnb.py``); torchao's 4-bit and 8-bit formats
are blockwise like adam8lib's but with their own maps and block sizes (lesson 12).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Equivalent", "TRAINER_NAMES", "trainer_optimizer", "markdown_table"]


@dataclass(frozen=True)
class Equivalent:
    """The adam8lib class for one ``Trainer`` optimizer name."""

    library: str  # who Trainer builds for the name: "bitsandbytes" or "torchao"
    theirs: str  # the class Trainer builds, with its state width
    ours: str  # the adam8lib class (or torch.optim's, for fp32 AdamW)
    state_format: str | None  # passed as state_format=..., or None for the class's own
    hyper: str  # which TrainingArguments set the hyper-parameters: "adam", "lion", "ademamix", "rmsprop"
    note: str = ""


def _bnb(theirs: str, ours: str, fmt: str | None, hyper: str, note: str = "") -> Equivalent:
    return Equivalent("bitsandbytes", theirs, ours, fmt, hyper, note)


PAGED = "paged states are a bitsandbytes feature (GPU memory pressure); this is the unpaged class"
#: Every ``Trainer`` name that builds a bitsandbytes or torchao optimizer with quantized or fp32 states.
TRAINER_NAMES: dict[str, Equivalent] = {
    "adamw_8bit": _bnb("AdamW, optim_bits=8", "AdamW8bit", None, "adam"),
    "adamw_bnb_8bit": _bnb("AdamW, optim_bits=8", "AdamW8bit", None, "adam"),
    "paged_adamw_8bit": _bnb("AdamW, optim_bits=8, paged", "AdamW8bit", None, "adam", PAGED),
    "paged_adamw_32bit": _bnb("AdamW, optim_bits=32, paged", "torch.optim.AdamW", None, "adam",
                              PAGED + " (fp32 states: torch's own AdamW)"),
    "lion_8bit": _bnb("Lion, optim_bits=8", "Lion8bit", None, "lion"),
    "lion_32bit": _bnb("Lion, optim_bits=32", "Lion", None, "lion"),
    "paged_lion_8bit": _bnb("Lion, optim_bits=8, paged", "Lion8bit", None, "lion", PAGED),
    "paged_lion_32bit": _bnb("Lion, optim_bits=32, paged", "Lion", None, "lion", PAGED),
    "ademamix_8bit": _bnb("AdEMAMix, optim_bits=8", "AdEMAMix8bit", None, "ademamix"),
    "ademamix": _bnb("AdEMAMix, optim_bits=32", "AdEMAMix", None, "ademamix"),
    "paged_ademamix_8bit": _bnb("AdEMAMix, optim_bits=8, paged", "AdEMAMix8bit", None, "ademamix", PAGED),
    "paged_ademamix_32bit": _bnb("AdEMAMix, optim_bits=32, paged", "AdEMAMix", None, "ademamix", PAGED),
    "rmsprop_bnb_8bit": _bnb("RMSprop, optim_bits=8", "RMSprop8bit", None, "rmsprop"),
    "rmsprop_bnb": _bnb("RMSprop, optim_bits=32", "RMSprop8bit", "fp32", "rmsprop"),
    "rmsprop_bnb_32bit": _bnb("RMSprop, optim_bits=32", "RMSprop8bit", "fp32", "rmsprop"),
    "adamw_torch_8bit": Equivalent("torchao", "AdamW8bit (torchao.optim)", "AdamW8bit", None, "adam",
                                   "torchao's 8-bit map and blocks of 256; the same state bytes"),
    "adamw_torch_4bit": Equivalent("torchao", "AdamW4bit (torchao.optim)", "AdamW4bit", None, "adam",
                                   "both 4-bit and blockwise; the maps and block layout differ (lesson 12)"),
}


def _cls(name: str):
    if name == "torch.optim.AdamW":
        import torch

        return torch.optim.AdamW
    import adam8lib

    return getattr(adam8lib, name)


def _optim_args(args: Any) -> dict[str, str]:
    """``TrainingArguments.optim_args`` ("key=value,key=value") as Trainer parses it."""
    text = getattr(args, "optim_args", None) or ""
    out = {}
    for item in text.replace(" ", "").split(","):
        if item:
            key, _, value = item.partition("=")
            out[key] = value
    return out


def _hyper(kind: str, args: Any) -> dict[str, Any]:
    lr = float(args.learning_rate)
    extra = _optim_args(args)
    if kind == "adam":
        return {"lr": lr, "betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}
    if kind == "lion":
        return {"lr": lr, "betas": (args.adam_beta1, args.adam_beta2)}
    if kind == "ademamix":
        out = {"lr": lr,
               "betas": (float(extra.get("beta1", args.adam_beta1)), float(extra.get("beta2", args.adam_beta2)),
                         float(extra.get("beta3", 0.9999))),
               "alpha": float(extra.get("alpha", 5.0)), "eps": float(extra.get("eps", args.adam_epsilon))}
        for key in ("t_alpha", "t_beta3"):
            if key in extra:
                out[key] = int(extra[key])
        return out
    if kind == "rmsprop":  # Trainer passes optim_args through as given (strings); here as numbers
        known = {"alpha": float, "eps": float, "momentum": float, "centered": lambda v: v.lower() in ("1", "true")}
        unknown = sorted(set(extra) - set(known))
        if unknown:
            raise ValueError(f"optim_args {unknown} mean nothing to RMSprop8bit; it takes {sorted(known)}")
        return {"lr": lr, **{k: known[k](v) for k, v in extra.items()}}
    raise AssertionError(kind)


def trainer_optimizer(name: str, args: Any) -> tuple[type, dict[str, Any]]:
    """``(class, kwargs)`` for ``Trainer(optimizer_cls_and_kwargs=...)``: the adam8lib optimizer that does
    what ``TrainingArguments(optim=name)`` would build, with the hyper-parameters ``Trainer`` would give it."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a Trainer optimizer name (a string), got {type(name).__name__}")
    if name not in TRAINER_NAMES:
        raise ValueError(f"{name!r} is not a Trainer optimizer name with an adam8lib equivalent; "
                         f"known: {', '.join(TRAINER_NAMES)}")
    for field in ("learning_rate", "adam_beta1", "adam_beta2", "adam_epsilon"):
        if not hasattr(args, field):
            raise TypeError(f"args must be TrainingArguments (or have .{field}), got {type(args).__name__}")
    e = TRAINER_NAMES[name]
    kwargs = _hyper(e.hyper, args)
    if e.state_format is not None:
        kwargs["state_format"] = e.state_format
    return _cls(e.ours), kwargs


def markdown_table() -> str:
    """The README's table: Trainer name, what Trainer builds, the adam8lib class, what differs."""
    lines = ["| `optim=` | Trainer builds | adam8lib | note |", "|---|---|---|---|"]
    for name, e in TRAINER_NAMES.items():
        ours = f"`{e.ours}`" + (f" (`state_format=\"{e.state_format}\"`)" if e.state_format else "")
        lines.append(f"| `{name}` | {e.library} `{e.theirs}` | {ours} | {e.note} |")
    return "\n".join(lines)
