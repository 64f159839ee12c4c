"""How an optimizer stores its states: a **storage layout**, data like a state format (issue 52).

The one core, :class:`adam8lib.quantized_state.QuantizedStateOptimizer`, steps, checks and saves every state
the same way; what differs between lesson 07's Adam classes and the family of lesson 13 is only where and
under which names the bytes go, and how a checkpoint says what they are. That is a :class:`StateLayout`,
chosen by the class (``layout = ADAM_LAYOUT``), never by overridden methods:

=====================  ======================================  ==============================================
                       :data:`FAMILY_LAYOUT` (Lion8bit, ...)    :data:`ADAM_LAYOUT` (Adam8bit, lessons 07-12)
=====================  ======================================  ==============================================
a quantized state      ``<name>_codes``, ``<name>_absmax``     ``state1``/``absmax1`` (m), ``state2``/``absmax2``
an fp32 state          ``<name>``                              ``exp_avg``, ``exp_avg_sq``
a new state's keys     each state's codes, then its scales     every codes key, then every scales key
a shard's blocks       the whole tensor's (``"global"``)       its own (``"local"``, as bitsandbytes, torchao)
the tag key            ``"state_format"``                      ``"qmap_fingerprint"``
the tag                the format's name and fingerprint       the two maps' fingerprint where bytes code into
                                                               maps, the format's fingerprint otherwise
groups show            nothing                                 ``blocksize`` (read-only), ``min_8bit_size``
=====================  ======================================  ==============================================

A layout also holds the torch.optim flags its classes refuse (with the advice each message gives), and the
class-specific words of the core's messages: the hint naming the optimizer a foreign checkpoint comes from
(:meth:`StateLayout.foreign_origin`), the refusal of a checkpoint in another format or with other maps, and
that of a checkpoint saved before checkpoints named their maps (:meth:`StateLayout.check_tag`). The DCP form
of a sharded parameter's state follows from :attr:`StateLayout.block_layout` and the keys
(:func:`adam8lib.distributed.to_checkpoint_state`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

from .quant import MAP_FINGERPRINTS, map_fingerprint
from .rules.base import StateSpec

__all__ = ["StateLayout", "FAMILY_LAYOUT", "ADAM_LAYOUT", "STORED_KEYS", "OPTIMIZER_LEVEL", "describe_tag"]

#: Settings of the whole optimizer (its constructor's arguments), refused in a param group unless a layout's
#: groups show them (:attr:`StateLayout.group_settings`).
OPTIMIZER_LEVEL = ("blocksize", "min_8bit_size")
#: Param-group and state keys of bitsandbytes' optimizers (a foreign checkpoint's origin).
_BNB_GROUP_KEYS = frozenset({"optim_bits", "percentile_clipping", "block_wise", "max_unorm", "is_paged"})
_BNB_STATE_KEYS = frozenset({"state1", "qmap1", "absmax1", "__bnb_optimizer_quant_state__"})


@dataclass(frozen=True)
class StateLayout:
    """Where an optimizer's states go and how its checkpoints name them (see the module docstring).

    Args:
        name: what the layout is called in messages (``"family"``, ``"adam"``).
        keys: ``((state name, (codes key, scales key)), ...)``: the storage keys of the states it names; any
            other state is stored under ``<name>_codes``/``<name>_absmax`` (:class:`~adam8lib.rules.base.StateSpec`).
        codes_first: a new quantized state lists every codes key, then every scales key (``state1``,
            ``state2``, ``absmax1``, ``absmax2``, as lessons 00 and 07 print them); else each state's codes and
            scales in turn.
        block_layout: ``"global"`` (a shard keeps the whole tensor's blocks: the unsharded run's bits on any
            split, :mod:`adam8lib.global_blocks`) or ``"local"`` (a shard is cut into its own blocks, lesson 11).
        tag_key: the key, in every saved state with quantized entries, of what its codes need to be decoded.
        tag_from_maps: the tag is the fingerprint of the two maps (:func:`adam8lib.quant.map_fingerprint`) for a
            format that codes bytes into maps (:attr:`~adam8lib.formats.StateFormat.byte_codes_into_maps`), and
            the format's fingerprint otherwise; else always the format's name and its moments' fingerprints.
        group_settings: which optimizer-level settings (:data:`OPTIMIZER_LEVEL`) param groups hold and show.
        torch_flags: ``((flag, advice), ...)``: torch.optim flags refused unless false, and what to do instead.
        looks_like: the hint a checkpoint of this layout gets when loaded into a class of another layout.
        own_group_keys: param-group keys that mark this layout's checkpoints (the hint's cue).
        torch_hint: the hint for a torch.optim checkpoint, and the group keys that mark one.
        sparse_advice: what the refusal of a sparse gradient advises ('' for nothing).
        bnb_hint, bnb_group_keys: the hint for a bitsandbytes checkpoint, and the group keys beyond bitsandbytes'
            usual ones that mark one.
    """

    name: str
    keys: tuple[tuple[str, tuple[str, str]], ...] = ()
    codes_first: bool = False
    block_layout: str = "global"
    tag_key: str = "state_format"
    tag_from_maps: bool = False
    group_settings: tuple[str, ...] = ()
    torch_flags: tuple[tuple[str, str], ...] = ()
    looks_like: str = ""
    own_group_keys: frozenset = frozenset()
    torch_hint: str = ""
    torch_group_keys: frozenset = frozenset()
    sparse_advice: str = ""
    bnb_hint: str = " (it looks like a bitsandbytes optimizer's checkpoint: other state keys and layouts)"
    bnb_group_keys: frozenset = frozenset()
    _specs: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.block_layout not in ("global", "local"):
            raise ValueError(f"block_layout must be 'global' or 'local', got {self.block_layout!r}")
        unknown = [k for k in self.group_settings if k not in OPTIMIZER_LEVEL]
        if unknown:
            raise ValueError(f"group_settings may hold {OPTIMIZER_LEVEL}, got {unknown}")

    # ------------------------------------------------------------------ keys
    @property
    def flags(self) -> Mapping[str, str]:
        """:attr:`torch_flags` as a mapping ``{flag: advice}``."""
        return MappingProxyType(dict(self.torch_flags))

    def specs(self, rule: Any) -> tuple[StateSpec, ...]:
        """``rule``'s states (:attr:`adam8lib.rules.base.UpdateRule.states`) with this layout's storage keys."""
        found = self._specs.get(rule.states)
        if found is None:
            named = dict(self.keys)
            found = tuple(replace(s, codes=named[s.name][0], scales=named[s.name][1]) if s.name in named else s
                          for s in rule.states)
            self._specs[rule.states] = found
        return found

    def new_state_order(self, specs: tuple[StateSpec, ...]) -> tuple[str, ...]:
        """The keys of a new quantized state (after ``"step"``), in the order it lists them."""
        if self.codes_first:
            return tuple(s.codes_key for s in specs) + tuple(s.scales_key for s in specs)
        return tuple(k for s in specs for k in (s.codes_key, s.scales_key))

    def stored_keys(self) -> tuple[str, ...]:
        """The codes and scales keys this layout names (beyond the ``<name>_codes``/``<name>_absmax`` default)."""
        return tuple(k for _, pair in self.keys for k in pair)

    # ------------------------------------------------------------------ the tag
    def format_tag(self, fmt: Any) -> str:
        """What a saved state's codes in ``fmt`` need to be decoded, saved under :attr:`tag_key`."""
        if self.tag_from_maps:
            return map_fingerprint(fmt.m.qmap(), fmt.v.qmap()) if fmt.byte_codes_into_maps else fmt.fingerprint()
        return f"{fmt.name}:{fmt.m.fingerprint()}|{fmt.v.fingerprint()}"

    def check_tag(self, saved: Any, fmt: Any, where: str, origin: str, name: str) -> None:
        """ValueError unless a saved state's tag (``saved``: its :attr:`tag_key`, None if absent) is
        :meth:`format_tag` of ``fmt`` (None: this optimizer keeps fp32 states). The refusal names both formats as
        users write them (``'8bit'``, ``'4bit' (blocks of 128)``); ``name``: the optimizer's class."""
        ours = None if fmt is None else self.format_tag(fmt)
        if ours is not None and saved == ours:
            return
        own = "fp32 states" if fmt is None else f"{fmt.name!r} (blocks of {fmt.m.blocksize})"
        if self.tag_from_maps and fmt is not None:
            key = self.tag_key
            if saved is None:
                if not fmt.byte_codes_into_maps:  # checkpoints of this format always named it
                    raise ValueError(
                        f"{where} has low-bit states but no {key!r}, which every checkpoint of a {name} with state "
                        f"format {fmt.name!r} carries{origin}: it was removed, or the states come from elsewhere. "
                        f"Decoded in the wrong format every state would change. If it was saved by a {name} with "
                        f"state format {own}, set {key!r} to {ours!r} in each saved state that has "
                        f"{self.specs_of_first_codes()!r} and load it again.")
                raise ValueError(
                    f"{where} has low-bit states but no {key!r}: it was saved before checkpoints named the maps "
                    f"their codes index{origin}. Its codes cannot be decoded safely: maps built then depended on the "
                    f"CPU. If it was saved on a CPU with AVX2 or AVX-512 by a {name} with state format {fmt.name!r}, "
                    f"its maps were the canonical ones; then set {key!r} to {ours!r} in each saved state that has "
                    f"{self.specs_of_first_codes()!r} and load it again.")
            if not isinstance(saved, str):
                raise ValueError(f"{where}: {key!r} must be a string, got {type(saved).__name__}")
            theirs = describe_tag(saved, key, self.tag_from_maps)
            if theirs.startswith("unknown") or (":" not in saved and ":" not in ours):  # other maps, same coding
                known = {v: k for k, v in MAP_FINGERPRINTS.items()}
                raise ValueError(
                    f"{where}: its codes index quantization maps with fingerprint {saved!r}, this {name}'s maps "
                    f"have {ours!r} ({known.get(map_fingerprint(fmt.m.qmap()), 'custom')} / "
                    f"{known.get(map_fingerprint(fmt.v.qmap()), 'custom')}): decoded with these maps, every state "
                    f"would change. Load it into an optimizer with the maps that saved it.")
            raise ValueError(
                f"{where}: its low-bit states were stored in format {theirs}; this {name} stores {own}: decoded in "
                f"this format, every state would change. Load it into an optimizer with the state format (and "
                f"blocksize) that saved it.")
        theirs = describe_tag(saved, self.tag_key, self.tag_from_maps)
        raise ValueError(f"{where} was saved with states in format {theirs}; this {name} stores {own}: decoded in "
                         f"this format, every state would change. Load it into an optimizer with the state format "
                         f"(and blocksize) that saved it.")

    def specs_of_first_codes(self) -> str:
        """The first codes key this layout names (what a legacy-tag message tells the user to look for)."""
        return self.keys[0][1][0] if self.keys else "<name>_codes"

    # ------------------------------------------------------------------ foreign checkpoints
    def foreign_origin(self, state_dict: Mapping[str, Any]) -> str:
        """A hint naming the optimizer a checkpoint that is not of this layout probably comes from ('' if none):
        another layout of this library (by its group settings or its keys), bitsandbytes, torch.optim."""
        groups = [g for g in state_dict.get("param_groups") or [] if isinstance(g, dict)]
        keys = set().union(*(g.keys() for g in groups)) if groups else set()
        states = [s for s in (state_dict.get("state") or {}).values() if isinstance(s, dict)]
        state_keys = set().union(*(s.keys() for s in states)) if states else set()
        for other in LAYOUTS:
            if other is self or other.name == self.name:
                continue
            if keys & other.own_group_keys - self.own_group_keys or (
                    other.tag_key != self.tag_key and other.tag_key in state_keys) or (
                    not other.keys and any(isinstance(k, str) and k.endswith("_codes") for k in state_keys)):
                return other.looks_like
        if keys & (_BNB_GROUP_KEYS | self.bnb_group_keys) or state_keys & (_BNB_STATE_KEYS - set(self.stored_keys())):
            return self.bnb_hint
        if keys & self.torch_group_keys or (
                self.own_group_keys and "exp_avg" in state_keys and not keys & self.own_group_keys):
            return self.torch_hint
        return ""


def describe_tag(tag: Any, key: str = "state_format", from_maps: bool = False) -> str:
    """A saved tag in the user's terms: ``"'4bit' (blocks of 128)"``, ``"'8bit'"`` for the canonical maps'
    fingerprint, ``"unknown (...)"`` for a map fingerprint of no known format (custom maps) or a missing tag."""
    if tag is None:
        return f"unknown (no {key!r})"
    if not isinstance(tag, str):
        return f"unknown ({key!r} is {tag!r})"
    if ":" in tag:
        name, rest = tag.split(":", 1)
        parts = rest.replace("rank1-", "").split("/") if from_maps else rest.split("/")
        blocks = [part[1:] for part in parts if part[:1] == "b" and part[1:].isdigit()]
        return f"{name!r}" + (f" (blocks of {blocks[0]})" if blocks else "")
    if from_maps:
        from .formats import FORMATS

        for fmt in FORMATS.values():
            if fmt.byte_codes_into_maps and tag == map_fingerprint(fmt.m.qmap(), fmt.v.qmap()):
                return repr(fmt.name)
    return f"unknown ({key!r} is {tag!r})"


#: The family's layout (Lion8bit, AdEMAMix8bit, RMSprop8bit, Adagrad8bit, SGD8bit, Muon8bit; issue 35).
FAMILY_LAYOUT = StateLayout(
    name="family",
    torch_flags=(
        ("maximize", "negate the loss instead"),
        ("foreach", "the steps have their own loops; drop the flag"),
        ("fused", "fused steps run by default where the registry has one (backend='auto'); drop the flag"),
        ("capturable", "CUDA-graph capture is not supported"),
        ("differentiable", "the quantized step is not differentiable"),
    ),
    looks_like=(" (it looks like a checkpoint of the family's optimizers, e.g. Lion8bit or AdEMAMix8bit: another "
                "update rule, other state keys)"),
    torch_hint=" (it looks like a torch.optim checkpoint: fp32 states, no state format)",
    torch_group_keys=frozenset({"foreach", "differentiable", "maximize", "capturable"}),
)

#: Lesson 07's layout: the low-bit Adams (Adam8bit, AdamW8bit, Adam4bit, ..., :mod:`adam8lib.optim`), as their
#: checkpoints since lesson 07 hold it.
ADAM_LAYOUT = StateLayout(
    name="adam",
    keys=(("exp_avg", ("state1", "absmax1")), ("exp_avg_sq", ("state2", "absmax2"))),
    codes_first=True,
    block_layout="local",
    tag_key="qmap_fingerprint",
    tag_from_maps=True,
    group_settings=("blocksize", "min_8bit_size"),
    torch_flags=(
        ("maximize", "negate the loss instead"),
        ("amsgrad", "AMSGrad needs a third state, which 8-bit Adam does not keep"),
        ("foreach", "the backends have their own loops; drop the flag"),
        ("fused", "choose a fused kernel with backend='cpu' or 'triton' instead"),
        ("capturable", "CUDA-graph capture is not supported"),
        ("differentiable", "the 8-bit step is not differentiable"),
    ),
    looks_like=(" (it looks like an Adam8bit/AdamW8bit/LowBitAdam checkpoint: they keep blocksize in each param "
                "group)"),
    own_group_keys=frozenset({"blocksize", "min_8bit_size"}),
    torch_hint=" (it looks like a torch.optim Adam/AdamW checkpoint: fp32 states, no blocksize)",
    torch_group_keys=frozenset({"amsgrad", "foreach", "fused", "capturable", "decoupled_weight_decay"}),
    sparse_advice="; use torch.optim.SparseAdam",
    bnb_hint=" (it looks like a bitsandbytes optimizer's checkpoint; its states use other maps and layouts)",
    bnb_group_keys=frozenset({"t_alpha", "t_beta3"}),
)

#: Every layout of the library (a foreign checkpoint's hint names the one it looks like).
LAYOUTS = (FAMILY_LAYOUT, ADAM_LAYOUT)
#: Every codes and scales key a layout names (a sharded checkpoint's entries whose shape depends on the world size).
STORED_KEYS = frozenset(k for layout in LAYOUTS for k in layout.stored_keys())
