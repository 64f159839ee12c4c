"""Exact nearest-code tables: the code of any fp32 value from its bits, one probe, one compare.

The reference finds each code with a binary search over the 256-entry map
(:func:`adam8lib.quant.nearest_code`). That function is a step function of ``x``; order the
fp32 values by a sortable integer key (their bits, with the magnitude bits of negative values
flipped) and split the keys into 65,536 buckets by their top 16 bits. :func:`code_table`
samples the reference once per map and stores, per bucket, the code at the bucket's start
(``lo``), the one other code inside it (``hi``) and where it starts (the low 16 bits of the
key, ``where``), packed as ``lo | hi << 8 | where << 16``::

    code(x) = hi if (low 16 bits of key(x)) >= where else lo

exactly the reference's answer, ties, NaN and the keep-sign rule included (a map whose code
changes twice inside one bucket is refused with ValueError; the dynamic and linear maps are
fine).

The kernels look the same table up by the float's *raw* bits, which saves the key arithmetic
(``CodeTable.raw_steps``, used by both fast backends: the C++ kernel, ``cpu``, and the Triton
kernel, ``triton``). A raw bucket (the top 16 bits of the bits) holds the same floats as one
sortable bucket, in the same order for ``x >= 0`` and in reverse order for negative ``x``, so
each entry re-packs as ``B | A << 8 | (T - 1) << 16``::

    code(x) = A if (bits(x) << 16) > entry else B        (unsigned 32-bit compare)

i.e. ``A`` from the low 16 bits ``T`` on: one shift and one compare, no sign handling.
Building a table takes a second or two; it is cached on disk (under ``cache_root()``) keyed
by the map, the rule and the source of ``nearest_code``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..quant import nearest_code

__all__ = ["code_table", "encode_table", "CodeTable", "cache_root", "BUCKET_BITS"]

#: Top bits of the sortable key that index the tables.
BUCKET_BITS = 16


#: Bumped when the packing of a table changes (part of the on-disk cache key).
_FORMAT = b"lo|hi|where, NaN inside, v2"


def cache_root() -> Path:
    """adam8lib's cache folder: ``$ADAM8LIB_CACHE_DIR``, else ``$XDG_CACHE_HOME/adam8lib`` or ``~/.cache/adam8lib``."""
    return Path(os.environ.get("ADAM8LIB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "adam8lib"
    ))


_KEY_MIN = 0x007FFFFF  # sortable key of -inf (smaller keys are negative NaNs)
_KEY_MAX = 0xFF800000  # sortable key of +inf (larger keys are positive NaNs)


def _keys_to_floats(keys: torch.Tensor) -> torch.Tensor:
    """Inverse of the kernel's sortable_key, on an int64 tensor of keys in [0, 2**32)."""
    bits = torch.where(keys >= 2**31, keys - 2**31, (~keys) & 0xFFFFFFFF)
    bits = torch.where(bits >= 2**31, bits - 2**32, bits)
    return bits.to(torch.int32).view(torch.float32)


@dataclass(frozen=True)
class CodeTable:
    """A map plus its exact nearest-code tables (see the module docstring)."""

    qmap: torch.Tensor  # (256,) fp32: the value of each code before scaling (a map, or FP8's bytes / 448)
    steps: torch.Tensor  # (65536,) int32 per bucket: code below | code from `where` on << 8 | where << 16
    nan_code: int  # the reference's code for NaN
    #: the same table indexed by raw bits: B | A << 8 | (T - 1) << 16 (see the module docstring)
    raw_steps: torch.Tensor = field(init=False, repr=False, compare=False)
    #: no negative map value (a state requantized with this map dequantizes to >= 0)
    nonnegative: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "raw_steps", _raw_layout(self.steps))
        object.__setattr__(self, "nonnegative", bool((self.qmap >= 0).all()))


def _raw_layout(steps: torch.Tensor) -> torch.Tensor:
    """Re-pack a sortable-key table for lookups by raw bits (exact: a pure re-indexing).

    Raw bucket ``r`` (bits ``r << 16 ...``) is sortable bucket ``r + 0x8000`` for ``x >= 0``;
    for negative ``x`` (``r >= 0x8000``) the key flips the 31 low bits, so it is bucket
    ``((r - 0x10000) ^ 0x7FFF) + 0x8000`` and the low 16 bits run backwards: the sortable
    rule "hi from key ``where`` on" becomes "lo from raw ``0x10000 - where`` on"."""
    entry = steps.long() & 0xFFFFFFFF
    raw = torch.arange(1 << BUCKET_BITS, dtype=torch.int64)
    negative = raw >= 0x8000
    bucket = torch.where(negative, ((raw - 0x10000) ^ 0x7FFF) + 0x8000, raw + 0x8000)
    e = entry[bucket]
    lo, hi, where = e & 0xFF, (e >> 8) & 0xFF, e >> 16
    at = torch.where(negative, 0x10000 - where, where)  # T: A from raw low bits T on
    a = torch.where(negative, lo, hi)
    b = torch.where(negative, hi, lo)
    b = torch.where(at == 0, a, b)  # A everywhere: the compare's answer does not matter
    packed = b | (a << 8) | (((at - 1) & 0xFFFF) << 16)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


#: The tables of the last few map tensors seen, by identity: (tensor, its version counter, data
#: pointer, keep_sign) -> table. An optimizer passes the same two map tensors at every step, and
#: this skips reading them back and hashing their bytes (~5 us a call). The entry holds the tensor,
#: so its id cannot be reused while it is cached; writing to the map bumps its version.
_BY_TENSOR: dict[tuple[int, bool], tuple[torch.Tensor, int, int, "CodeTable"]] = {}
_BY_TENSOR_SIZE = 8


def code_table(qmap: torch.Tensor, keep_sign: bool) -> CodeTable:
    """Tables that give ``nearest_code(x, qmap, keep_sign=keep_sign)`` exactly for every fp32 x.

    Raises ValueError for a map whose code changes twice inside one bucket (two entries
    closer than ~1/128 of their magnitude); the dynamic and linear maps are fine.
    """
    if not isinstance(qmap, torch.Tensor) or qmap.shape != (256,) or not qmap.is_floating_point():
        raise ValueError(f"qmap must be a 256-entry float tensor, got {getattr(qmap, 'shape', type(qmap))}")
    try:
        version = qmap._version
    except RuntimeError:  # an inference-mode tensor has no version counter: not cached by identity
        version = None
    key = (id(qmap), bool(keep_sign))
    seen = _BY_TENSOR.get(key)
    if seen is not None and version is not None and seen[0] is qmap and seen[1] == version and seen[2] == qmap.data_ptr():
        return seen[3]
    flat = qmap.detach().to("cpu", torch.float32).contiguous()
    table = _cached_code_table(flat.numpy().tobytes(), bool(keep_sign))
    if version is not None:
        if len(_BY_TENSOR) >= _BY_TENSOR_SIZE:
            _BY_TENSOR.pop(next(iter(_BY_TENSOR)))
        _BY_TENSOR[key] = (qmap, version, qmap.data_ptr(), table)
    return table


@functools.lru_cache(maxsize=16)
def _cached_code_table(qmap_bytes: bytes, keep_sign: bool) -> CodeTable:
    """Building a table takes a second or two; keep it next to the compiled kernel, keyed by
    the map, the rule and the source of ``nearest_code`` (the spec it samples)."""
    qmap = torch.frombuffer(bytearray(qmap_bytes), dtype=torch.float32)
    if not bool(torch.isfinite(qmap).all()) or bool((qmap[1:] < qmap[:-1]).any()):
        raise ValueError("qmap must be finite and sorted ascending")
    spec = inspect.getsource(nearest_code).encode() + bytes([keep_sign, BUCKET_BITS]) + _FORMAT
    return _cached_table(qmap_bytes, spec, lambda x: nearest_code(x, qmap, keep_sign=keep_sign))


def encode_table(decode: torch.Tensor, encode: Callable[[torch.Tensor], torch.Tensor], spec: bytes) -> CodeTable:
    """The exact table of any code function: ``encode`` (flat fp32 -> integer codes below 256) must
    be a step function of each value alone that changes at most once per bucket (ValueError
    otherwise); ``decode`` (fp32, 256 entries, any order, NaN allowed) is what the kernel
    multiplies by the scale to dequantize a code (a 16-entry map of 4-bit codes is padded with
    zeros). ``spec`` names ``encode`` for the caches (its source and parameters): a table is built
    once per ``(decode, spec)`` and kept on disk like :func:`code_table`'s. The FP8 and 4-bit
    formats sample :meth:`adam8lib.formats.MomentFormat.code` this way."""
    flat = decode.detach().to("cpu", torch.float32).contiguous().reshape(-1)
    if flat.numel() > 256:
        raise ValueError(f"a decode table has at most 256 entries, got {flat.numel()}")
    flat = torch.cat([flat, flat.new_zeros(256 - flat.numel())])
    return _cached_table(flat.numpy().tobytes(), bytes(spec) + bytes([BUCKET_BITS]) + _FORMAT, encode)


def _cached_table(qmap_bytes: bytes, spec: bytes, encode: Callable[[torch.Tensor], torch.Tensor]) -> CodeTable:
    """The table of ``encode`` from disk (``cache_root()/tables``, keyed by the decode values and
    ``spec``), or built (a second or two) and saved. (Its callers keep the tables they use in memory:
    :func:`_cached_code_table`, :func:`adam8lib.kernels.cpu_formats.moment_table`.)"""
    qmap = torch.frombuffer(bytearray(qmap_bytes), dtype=torch.float32)
    path = cache_root() / "tables" / f"{hashlib.sha256(qmap_bytes + spec).hexdigest()[:24]}.pt"
    try:
        saved = torch.load(path, weights_only=True)
        table = CodeTable(qmap, saved["steps"], int(saved["nan_code"]))
    except Exception:  # not there yet (or unreadable): build it
        table = _build_code_table(qmap, encode)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            torch.save({"steps": table.steps, "nan_code": table.nan_code}, tmp)
            os.replace(tmp, path)  # atomic: concurrent processes never see half a file
        except OSError:
            pass
    return table


def _build_code_table(qmap: torch.Tensor, encode: Callable[[torch.Tensor], torch.Tensor]) -> CodeTable:
    def code_at(keys: torch.Tensor) -> torch.Tensor:
        return encode(_keys_to_floats(keys)).long()

    # each bucket: the code at its first and at its last key (NaN keys excluded)
    width = 1 << (32 - BUCKET_BITS)
    first = torch.arange(1 << BUCKET_BITS, dtype=torch.int64) * width
    first, last = first.clamp(_KEY_MIN, _KEY_MAX), (first + width - 1).clamp(_KEY_MIN, _KEY_MAX)
    base, top = code_at(first), code_at(last)
    # where the code changes inside a bucket: bisection for the first key whose code != base
    stepping = (top != base).nonzero().flatten()
    lo, hi = first[stepping], last[stepping]  # code(lo) == base, code(hi) != base
    while bool((hi - lo > 1).any()):
        mid = (lo + hi) // 2
        moved = code_at(mid) != base[stepping]
        hi, lo = torch.where(moved, mid, hi), torch.where(moved, lo, mid)
    thresh = torch.full_like(base, _KEY_MAX + 1)
    thresh[stepping] = hi
    # the table is exact if each bucket's code changes at most once: check that next to the
    # change and at 16 keys spread over every bucket
    samples = first[:, None] + (last - first)[:, None] * torch.arange(16) // 15
    expected = torch.where(samples < thresh[:, None], base[:, None], top[:, None])
    if not (torch.equal(code_at(samples), expected) and torch.equal(code_at(hi - 1), base[stepping])
            and torch.equal(code_at(hi), top[stepping])):
        raise ValueError("this map's codes change more than once within a lookup bucket; use backend='torch'")
    where = torch.where(thresh <= _KEY_MAX, thresh & 0xFFFF, 0)  # low 16 bits of the key of the change
    nan_code = int(encode(torch.tensor([float("nan")]))[0])
    # NaN keys (below -inf's, above +inf's) get the reference's code for NaN, so a lookup needs
    # no NaN test: whole buckets of NaNs, and the two buckets that hold -inf / +inf and NaNs
    bucket = torch.arange(1 << BUCKET_BITS, dtype=torch.int64)
    neg_inf_bucket, pos_inf_bucket = _KEY_MIN >> (32 - BUCKET_BITS), _KEY_MAX >> (32 - BUCKET_BITS)
    all_nan = (bucket < neg_inf_bucket) | (bucket > pos_inf_bucket)
    base = torch.where(all_nan, nan_code, base)
    top = torch.where(all_nan, nan_code, top)
    where = torch.where(all_nan, 0, where)
    # -inf is the last key of its bucket (0xFFFF), +inf the first (NaNs from key 0x0001 on)
    base[neg_inf_bucket], where[neg_inf_bucket] = nan_code, _KEY_MIN & 0xFFFF
    top[pos_inf_bucket], where[pos_inf_bucket] = nan_code, (_KEY_MAX & 0xFFFF) + 1
    packed = base | (top << 8) | (where << 16)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return CodeTable(qmap, packed, nan_code)


