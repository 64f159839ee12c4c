"""State formats: how a low-bit Adam stores its two moments (lessons 07 and 12).

The optimizer (:class:`adam8lib.optim.Adam8bit` and its siblings ``Adam4bit``, ``AdamFp8``) runs one
step for every format: decode ``m`` and ``v`` to fp32, the fp32 Adam update
(:func:`adam8lib.kernels.reference.adam_update_fp32`), encode them again. What differs from one
format to another is only how a moment is stored, and that is what this file describes.

A :class:`StateFormat` is two :class:`MomentFormat` s, one for ``m`` (signed) and one for ``v``
(never negative). A moment format says how its values are

* **scaled**: divided by one ``absmax`` per block of ``blocksize`` elements, so each block uses
  the whole code range; or, with ``rank1`` and a tensor of two or more dimensions, by
  ``min(max |x| of its row, max |x| of its column)`` (for more dimensions: the smallest of the
  maxima along every axis), which costs ``rows + columns`` floats instead of one per block
  (Li et al. 2023, "rank-1 normalization");
* **coded**: the scaled value in [-1, 1] becomes the index of the nearest entry of a map
  (``qmap``), or a float8 e4m3 number (``fp8``);
* **packed**: one code per byte, or two 4-bit codes per byte (element ``2i`` in the high nibble,
  ``2i + 1`` in the low one);
* and the rule for small values, ``keep_sign``: a non-zero value never codes to 0 or to the other
  sign (it takes the smallest code of its own sign). Without it a tiny ``v`` can code to exactly 0
  while its ``m`` does not, and the next update is ``lr * m / eps``: the **zero-point problem**.

Every moment is stored under two keys of the parameter's state: ``state1``/``state2`` (the packed
codes of m/v, as bytes: uint8 indices, or the bit patterns of float8 e4m3fn numbers) and
``absmax1``/``absmax2`` (fp32 scales: one per block, or the axis maxima one after the other).

The formats (:data:`FORMATS`):

=================  =============================================  ==================================================
name               m                                              v
=================  =============================================  ==================================================
``"8bit"``         dynamic map, 8 bits, blocks of 256, keep sign  unsigned dynamic map, 8 bits, blocks of 256, keep sign
``"4bit"``         dynamic map, 4 bits, blocks of 128, nearest    zero-free linear map (1/16 ... 1), rank-1 for matrices
``"4bit-naive"``   as ``"4bit"``                                  unsigned dynamic map, 4 bits, blocks of 128 (has 0)
``"fp8"``          e4m3, blocks of 256, keep sign                 e4m3, blocks of 256, keep sign
=================  =============================================  ==================================================

``"8bit"`` is the format of lessons 05-07 (bitsandbytes' layout; the optimizer runs it through the
fused backends of :mod:`adam8lib.kernels`). ``"4bit"`` follows Li et al. (arXiv 2309.01507, code
``lpmm``); ``"4bit-naive"`` is its ablation, a 4-bit map with a zero for ``v`` and no sign rule,
which shows the zero-point problem. (4-bit ``m`` takes the plain nearest code: the 4-bit map's
smallest non-zero entry is 0.0055 of the block's absmax, so keeping signs would inflate a tiny ``m``
up to a thousandfold. A tiny ``m`` coded to 0 is safe but not free: Adam's step does not shrink with
the gradient, and an ``m`` reset to 0 at every step leaves only this step's ``(1 - beta1) * g``, so
such an entry moves about a tenth of what fp32 Adam moves it — lesson 12 measures it.) ``"fp8"`` follows torchao's ``AdamWFp8`` (e4m3, one scale per
block of 256). The maps are the canonical ones of :mod:`adam8lib.quant`: the same bits everywhere.

Which backends step each format (``LowBitAdam(backend=...)``; :func:`adam8lib.optim.backends_of`):
``"8bit"`` every backend of :mod:`adam8lib.kernels`; ``"fp8"``, ``"4bit"`` and ``"4bit-naive"`` the
reference step (``"torch"``: :meth:`StateFormat.decode`, the fp32 update, :meth:`StateFormat.encode_`),
the C++ ``"cpu"`` kernel (:mod:`adam8lib.kernels.cpu_formats`; ``"auto"`` on the CPU) and
``"triton"`` (``"auto"`` on CUDA). Every fused step gives the reference step's bits; the CPU
kernel reads each code from a table sampled from :meth:`MomentFormat.code`, so that method is the
one spec of a coding.

**Sharded (FSDP2) parameters.** Every format keeps the states of the local shard, decided low-bit
or fp32 by the full size. Blocks are local to the shard (:mod:`adam8lib.distributed`). Rank-1
scales are not left local: a shard of rows has its rows' maxima but only part of each column, so
the optimizer all-reduces (MAX) the column maxima across the shards at every step (the
``reduce_maxima`` hook of :meth:`MomentFormat.quantize`), and the scales equal the unsharded
tensor's exactly. (The alternative, rank-1 over the local rows, would need no communication but
would make the states, and so the training, depend on the number of ranks.) The optimizer family
(:class:`~adam8lib.quantized_state.QuantizedStateOptimizer`) keeps the whole tensor's blocks on a shard
instead of local ones (``lead`` and ``reduce_blocks`` of :meth:`MomentFormat.quantize`;
:mod:`adam8lib.global_blocks`).

Bytes per parameter of a large matrix (codes + scales): 8bit 2 + 8/256, 4bit 1 + 4/128 +
4 (rows + cols) / (rows x cols), fp8 2 + 8/256; fp32 AdamW 8.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from .quant import dynamic_map, map_fingerprint, nearest_code, num_blocks

__all__ = ["MomentFormat", "StateFormat", "FORMATS", "get_format", "zero_free_map", "pack_nibbles",
           "unpack_nibbles", "rank1_scales", "FP8_MAX"]

#: The largest finite float8 e4m3fn number: a block's absmax is scaled to it.
FP8_MAX = 448.0
#: The smallest positive float8 e4m3fn number (a subnormal, 2^-9): where keep_sign puts a tiny value.
FP8_TINY = 2.0**-9


def zero_free_map(bits: int = 4) -> torch.Tensor:
    """The linear map without zero for 4-bit ``v``: ``k / 2**bits`` for ``k = 1 ... 2**bits``
    (``linspace(0, 1, 17)[1:]``: 1/16, 2/16, ..., 1). Exact binary fractions: the same bits anywhere."""
    steps = 2**bits
    return torch.arange(1, steps + 1, dtype=torch.float64).div(steps).float()


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte: ``byte[i] = codes[2i] << 4 | codes[2i + 1]`` (an odd count is padded
    with a 0 code). ``codes`` is a flat uint8 tensor of values below 16."""
    if codes.numel() % 2:
        codes = torch.cat([codes, codes.new_zeros(1)])
    pairs = codes.view(-1, 2)
    return (pairs[:, 0] << 4) | pairs[:, 1]


def unpack_nibbles(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` 4-bit codes of :func:`pack_nibbles`' bytes, as a flat uint8 tensor."""
    return torch.stack([packed >> 4, packed & 0x0F], dim=1).reshape(-1)[:n]


def rank1_scales(x: torch.Tensor) -> list[torch.Tensor]:
    """The maxima of ``|x|`` along every axis of ``x`` (a tensor of two or more dimensions): for a
    matrix, ``[max of each row, max of each column]``."""
    a = x.abs()
    dims = range(a.dim())
    return [a.amax(dim=tuple(d for d in dims if d != axis)) for axis in dims]


def _rank1_scale(maxima: list[torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
    """The per-element scale of rank-1 normalization: the smallest of the axis maxima that meet there."""
    scale = None
    for axis, m in enumerate(maxima):
        view = m.view([-1 if d == axis else 1 for d in range(len(shape))])
        scale = view if scale is None else torch.minimum(scale, view)
    return scale.expand(shape)


@dataclass(frozen=True)
class MomentFormat:
    """How one moment is stored (see the module docstring)."""

    #: ``"map"`` (codes into ``qmap``) or ``"fp8"`` (float8 e4m3 numbers)
    coding: str
    #: bits per code (8 or 4; 4 packs two per byte)
    bits: int
    #: elements per block of one absmax
    blocksize: int
    #: a non-zero value never codes to 0 or to the other sign
    keep_sign: bool
    #: rank-1 normalization for tensors of two or more dimensions (blockwise otherwise)
    rank1: bool = False
    #: builds the map (``coding == "map"``); the map is made on first use
    map_builder: Callable[[], torch.Tensor] | None = field(default=None, compare=False)
    #: a name for the map, for messages and fingerprints
    map_name: str = ""

    # ---------------------------------------------------------------- layout
    #: codes are stored as bytes (uint8), whatever they mean: float8 bit patterns travel through
    #: pickle, torch.save and DCP like any uint8 tensor
    code_dtype = torch.uint8

    def uses_rank1(self, shape: tuple[int, ...]) -> bool:
        return self.rank1 and len(shape) >= 2 and math.prod(shape) > 0

    def codes_numel(self, n: int) -> int:
        """Bytes of codes for ``n`` elements."""
        return -(-n // 2) if self.bits == 4 else n

    def scales_numel(self, shape: tuple[int, ...]) -> int:
        """fp32 scales for a tensor of ``shape``: the axis maxima (rank-1) or one per block."""
        return sum(shape) if self.uses_rank1(shape) else num_blocks(math.prod(shape), self.blocksize)

    def qmap(self) -> torch.Tensor | None:
        return _cached_map(self.map_builder) if self.coding == "map" else None

    def codes_are_valid(self, codes: torch.Tensor) -> bool:
        """False for bytes that decode to no number (the NaN patterns of float8 e4m3fn): a corrupt checkpoint."""
        return self.coding != "fp8" or bool(torch.isfinite(codes.view(torch.float8_e4m3fn).float()).all())

    def zero_code(self) -> int:
        """The code a fresh (all-zero) state stores: the map's code of 0 (any code where the map has
        no 0: its scale is 0, so it decodes to 0 all the same); packed twice for 4 bits."""
        if self.coding == "fp8":
            return 0
        qmap = self.qmap()
        code = int(torch.argmin(qmap.abs()))
        return code << 4 | code if self.bits == 4 else code

    def describe(self) -> str:
        scale = "rank-1 (blocks of %d for vectors)" % self.blocksize if self.rank1 else f"blocks of {self.blocksize}"
        coding = "float8 e4m3" if self.coding == "fp8" else f"{self.map_name}, {self.bits} bits"
        return f"{coding}, {scale}" + (", keep sign" if self.keep_sign else "")

    def fingerprint(self) -> str:
        """What a checkpoint must match to decode these codes: the map's bits and the layout."""
        table = map_fingerprint(self.qmap()) if self.coding == "map" else "e4m3fn"
        scales = f"rank1-b{self.blocksize}" if self.rank1 else f"b{self.blocksize}"
        return f"{table}/{self.bits}bit/{scales}/{'keep-sign' if self.keep_sign else 'nearest'}"

    # ---------------------------------------------------------------- coding
    def quantize(self, x: torch.Tensor, shape: tuple[int, ...],
                 reduce_maxima: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None,
                 *, lead: int = 0, reduce_blocks: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codes, scales)`` of the flat fp32 values ``x`` of a tensor of ``shape``.

        ``reduce_maxima`` (rank-1 only) turns this tensor's axis maxima into the ones to scale by:
        for the local shard of a sharded tensor, the maxima of the whole tensor (an all-reduce
        (MAX) across the shards, :func:`adam8lib.distributed.rank1_maxima_reducer`). It is called
        for an empty shard too (with zero maxima), so that every shard takes part in the collective.

        Blockwise only: ``lead`` places ``x[0]`` at position ``lead`` of its first block (element ``i``
        is in block ``(lead + i) // blocksize``: the blocks of a whole tensor of which ``x`` is a slice
        starting at an index ``≡ lead (mod blocksize)``; there are ``ceil((lead + n) / blocksize)`` scales,
        none for ``n = 0``), and ``reduce_blocks`` turns those block maxima into the ones to scale by
        (for a shard: the first and last blocks' maxima over every shard that shares them,
        :func:`adam8lib.global_blocks.block_edge_reducer`; called for an empty shard too)."""
        n = x.numel()
        if reduce_maxima is not None and self.rank1 and len(shape) >= 2 and n == 0:
            reduce_maxima([x.new_zeros(size) for size in shape])  # an empty shard: its part of the collective
        if self.uses_rank1(shape):
            maxima = rank1_scales(x.view(shape))
            if reduce_maxima is not None:
                maxima = reduce_maxima(maxima)
            scale = _rank1_scale(maxima, shape).reshape(-1)
            scales = torch.cat(maxima)
        else:
            lead = lead if n else 0
            pad = num_blocks(lead + n, self.blocksize) * self.blocksize - lead - n
            blocks = torch.nn.functional.pad(x, (lead, pad)).view(-1, self.blocksize)
            scales = blocks.abs().amax(dim=1)
            if reduce_blocks is not None:
                scales = reduce_blocks(scales)
            scale = scales.repeat_interleave(self.blocksize)[lead:lead + n]
        inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        codes = self.code(x * inv)
        return (pack_nibbles(codes) if self.bits == 4 else codes), scales

    def code(self, normalized: torch.Tensor) -> torch.Tensor:
        """The code (uint8, one per element, not packed) of each normalized fp32 value: a step
        function of the value alone, which the CPU kernels sample into exact lookup tables
        (:func:`adam8lib.kernels.code_table.encode_table`)."""
        if self.coding == "fp8":
            codes = (normalized * FP8_MAX).to(torch.float8_e4m3fn)
            if self.keep_sign:
                lost = (codes.float() == 0) & (normalized != 0)
                tiny = torch.full_like(normalized, FP8_TINY).copysign(normalized).to(torch.float8_e4m3fn)
                codes = torch.where(lost, tiny, codes)
            return codes.view(torch.uint8)
        return nearest_code(normalized, self.qmap().to(normalized.device), keep_sign=self.keep_sign)

    def decode_values(self) -> torch.Tensor:
        """The fp32 value of every code before scaling (``dequantize`` multiplies it by the
        scale): the map (16 or 256 entries), or each float8 byte / 448 (256, NaN at 0x7F, 0xFF)."""
        if self.coding == "fp8":
            codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
            return codes.view(torch.float8_e4m3fn).float() / FP8_MAX
        return self.qmap()

    def dequantize(self, codes: torch.Tensor, scales: torch.Tensor, shape: tuple[int, ...], *,
                   lead: int = 0) -> torch.Tensor:
        """The flat fp32 values of stored ``codes`` and ``scales`` of a tensor of ``shape`` (``lead``: see
        :meth:`quantize`)."""
        n = math.prod(shape)
        if self.uses_rank1(shape):
            sizes = list(shape)
            scale = _rank1_scale(list(scales.split(sizes)), shape).reshape(-1)
        else:
            lead = lead if n else 0
            scale = scales.repeat_interleave(self.blocksize)[lead:lead + n]
        if self.coding == "fp8":
            values = codes.view(torch.float8_e4m3fn).float() / FP8_MAX
        else:
            idx = unpack_nibbles(codes, n) if self.bits == 4 else codes
            values = self.qmap().to(codes.device)[idx.long()]
        return values * scale


_MAPS: dict[Callable[[], torch.Tensor], torch.Tensor] = {}


class FixedMap:
    """A map builder that gives one given table (:meth:`StateFormat.with_maps`); picklable, compared by identity."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table

    def __call__(self) -> torch.Tensor:
        return self.table


def _cached_map(builder: Callable[[], torch.Tensor]) -> torch.Tensor:
    table = _MAPS.get(builder)
    if table is None:
        table = _MAPS[builder] = builder()
    return table


def _signed8() -> torch.Tensor:
    return dynamic_map(True)


def _unsigned8() -> torch.Tensor:
    return dynamic_map(False)


def _signed4() -> torch.Tensor:
    return dynamic_map(True, 3, 4)


def _unsigned4() -> torch.Tensor:
    return dynamic_map(False, 3, 4)


@dataclass(frozen=True)
class StateFormat:
    """A name and the formats of the two moments."""

    name: str
    m: MomentFormat
    v: MomentFormat
    summary: str = ""

    @property
    def blocksize(self) -> int:
        """The format's block size (m's; :meth:`with_blocksize` gives both moments one)."""
        return self.m.blocksize

    @property
    def byte_codes_into_maps(self) -> bool:
        """Both moments store one byte per element, an index into a map, with one scale per block
        (bitsandbytes' 8-bit layout, lessons 05-07): element ``i``'s code is byte ``i``, so a shard's codes are a
        slice of the whole tensor's, a distributed checkpoint gives them the parameter's shape and a
        reshard re-blocks them through the map (:mod:`adam8lib.distributed`), and a checkpoint names
        the codes by their two maps (the number of scales gives the block size). Packed (4-bit) codes,
        rank-1 scales and float8 bytes take the flat form instead."""
        return all(mf.coding == "map" and mf.bits == 8 and not mf.rank1 for mf in (self.m, self.v))

    @property
    def one_blocksize(self) -> bool:
        """Both moments have one block size (every built-in format; a format built by hand may not): what every
        fused step needs, since it walks one element's codes and its block's scales together."""
        return self.m.blocksize == self.v.blocksize

    @property
    def one_byte_per_element(self) -> bool:
        """What the rule templates step (:mod:`adam8lib.kernels.cpu_rules`, :mod:`~adam8lib.kernels.triton_rules`):
        every moment one byte per element (an 8-bit map or FP8), one scale per block, one block size."""
        return all(mf.bits == 8 and mf.coding in ("map", "fp8") and not mf.rank1 for mf in (self.m, self.v)) \
            and self.one_blocksize

    @property
    def steps_in_map_kernels(self) -> bool:
        """What the 8-bit Adam kernels step (``adam8bit_step`` of every backend, lessons 07-08):
        :attr:`byte_codes_into_maps`, the keep-sign rule and one block size for both moments."""
        return self.byte_codes_into_maps and self.m.keep_sign and self.v.keep_sign and self.one_blocksize

    def with_maps(self, m: torch.Tensor | None = None, v: torch.Tensor | None = None) -> "StateFormat":
        """The same format with other maps (256 fp32 entries each) for ``m`` and/or ``v``: a map-coded format's codes
        then index these (the optimizer's ``qmap1``/``qmap2``); the kernels read the maps from the format."""
        from dataclasses import replace

        moments = []
        for name, moment, table in (("m", self.m, m), ("v", self.v, v)):
            if table is None:
                moments.append(moment)
                continue
            if moment.coding != "map":
                raise ValueError(f"state format {self.name!r} codes {name} as {moment.coding!r}, not into a map")
            if not torch.is_tensor(table) or table.dtype != torch.float32 or table.shape != (2 ** moment.bits,):
                got = f"{table.dtype}{tuple(table.shape)}" if torch.is_tensor(table) else type(table).__name__
                raise ValueError(f"a map for {name} of format {self.name!r} must be a float32 tensor of "
                                 f"{2 ** moment.bits} entries, got {got}")
            if moment.qmap() is not None and torch.equal(table.cpu(), moment.qmap().cpu()):
                moments.append(moment)  # the format's own map
                continue
            moments.append(replace(moment, map_builder=FixedMap(table.detach().cpu().clone()),
                                   map_name=f"custom-{map_fingerprint(table)[:8]}"))
        if moments[0] is self.m and moments[1] is self.v:
            return self
        return StateFormat(self.name, moments[0], moments[1], self.summary)

    def with_blocksize(self, blocksize: int) -> "StateFormat":
        """The same format with another block size for both moments (the optimizer's ``blocksize``)."""
        if blocksize == self.m.blocksize == self.v.blocksize:
            return self
        return StateFormat(self.name, _replace(self.m, blocksize), _replace(self.v, blocksize), self.summary)

    def fingerprint(self) -> str:
        return f"{self.name}:{self.m.fingerprint()}|{self.v.fingerprint()}"

    def state_spec(self, shape: tuple[int, ...]) -> dict[str, tuple[int, torch.dtype]]:
        """``{key: (elements, dtype)}`` of a low-bit state of a tensor of ``shape``."""
        n = math.prod(shape)
        return {
            "state1": (self.m.codes_numel(n), self.m.code_dtype),
            "state2": (self.v.codes_numel(n), self.v.code_dtype),
            "absmax1": (self.m.scales_numel(shape), torch.float32),
            "absmax2": (self.v.scales_numel(shape), torch.float32),
        }

    def state_bytes(self, shape: tuple[int, ...]) -> int:
        """Bytes of a low-bit state of a tensor of ``shape`` (codes and scales)."""
        return sum(count * _itemsize(dtype) for count, dtype in self.state_spec(shape).values())

    def new_state(self, shape: tuple[int, ...], device: torch.device) -> dict[str, torch.Tensor]:
        """A fresh state: every moment 0 (the codes of 0, scales 0), keys in :meth:`state_spec`'s order
        (``state1``, ``state2``, ``absmax1``, ``absmax2``: as lessons 00 and 07 print them)."""
        spec = self.state_spec(shape)
        zero_codes = {"state1": self.m.zero_code(), "state2": self.v.zero_code()}
        return {key: (torch.full((count,), zero_codes[key], dtype=dtype, device=device) if key in zero_codes
                      else torch.zeros((count,), dtype=dtype, device=device))
                for key, (count, dtype) in spec.items()}

    def decode(self, state: dict, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(m, v)`` of a state as flat fp32 tensors."""
        return (self.m.dequantize(state["state1"], state["absmax1"], shape),
                self.v.dequantize(state["state2"], state["absmax2"], shape))

    def encode_(self, state: dict, m: torch.Tensor, v: torch.Tensor, shape: tuple[int, ...],
                reduce_maxima: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None) -> None:
        """Store flat fp32 ``m`` and ``v`` into ``state`` in place (codes and scales); ``reduce_maxima``:
        see :meth:`MomentFormat.quantize` (the rank-1 scales of a shard)."""
        for key, moment, x in (("1", self.m, m), ("2", self.v, v)):
            codes, scales = moment.quantize(x, shape, reduce_maxima)
            state["state" + key].copy_(codes)
            state["absmax" + key].copy_(scales)


def _replace(moment: MomentFormat, blocksize: int) -> MomentFormat:
    from dataclasses import replace

    return replace(moment, blocksize=blocksize)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


#: The formats by name.
FORMATS: dict[str, StateFormat] = {
    "8bit": StateFormat(
        "8bit",
        MomentFormat("map", 8, 256, True, map_builder=_signed8, map_name="signed dynamic map"),
        MomentFormat("map", 8, 256, True, map_builder=_unsigned8, map_name="unsigned dynamic map"),
        "8-bit codes into the dynamic maps, one absmax per block of 256 (bitsandbytes' layout)",
    ),
    "4bit": StateFormat(
        "4bit",
        MomentFormat("map", 4, 128, False, map_builder=_signed4, map_name="signed dynamic map"),
        MomentFormat("map", 4, 128, False, rank1=True, map_builder=zero_free_map, map_name="zero-free linear map"),
        "4-bit codes, two per byte; m: dynamic map, blocks of 128; v: zero-free linear map, rank-1 scales",
    ),
    "4bit-naive": StateFormat(
        "4bit-naive",
        MomentFormat("map", 4, 128, False, map_builder=_signed4, map_name="signed dynamic map"),
        MomentFormat("map", 4, 128, False, map_builder=_unsigned4, map_name="unsigned dynamic map"),
        "4-bit codes; v on a map with 0 and no sign rule: the zero-point problem (an ablation)",
    ),
    "fp8": StateFormat(
        "fp8",
        MomentFormat("fp8", 8, 256, True),
        MomentFormat("fp8", 8, 256, True),
        "float8 e4m3 numbers, one scale per block of 256",
    ),
}


def get_format(state_format: str | StateFormat) -> StateFormat:
    """The :class:`StateFormat` named ``state_format`` (or the format itself)."""
    if isinstance(state_format, StateFormat):
        return state_format
    if not isinstance(state_format, str) or state_format not in FORMATS:
        raise ValueError(f"Unknown state_format {state_format!r}; choose one of {list(FORMATS)}")
    return FORMATS[state_format]
