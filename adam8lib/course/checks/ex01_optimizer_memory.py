"""Checks for workbook 01 · optimizer memory (bytes per parameter, measuring a live optimizer)."""

from __future__ import annotations

import math
import numbers

import torch

from ...memory import MB, compute_optimizer_size, estimate_optimizer_memory
from ...optim import Adam8bit
from ...quant import dynamic_map
from ._common import assert_equal, call, fail, is_stub, passed, require_callable, torch_not_implemented_hint
from ._properties import case_pattern
from ._variants import expect_close, matches

__all__ = ["check_state_bytes_per_param", "check_optimizer_state_bytes", "check_compute_optimizer_size"]


# ---------------------------------------------------------------------------- 01.1
def _bytes_per_param_variants(kind: str, b: int):
    """(hint, value) of the usual wrong counts for one kind and blocksize."""
    if kind == "adamw":
        return [
            ("you counted ONE fp32 state for AdamW: it keeps m and v, 2 x 4 bytes.", lambda: 4.0),
            ("you counted the parameter and its gradient too: they are not optimizer state (every optimizer "
             "has them); AdamW's state is m and v, 2 x 4 bytes.", lambda: 16.0),
            ("you counted the parameter too: only m and v are optimizer state, 2 x 4 bytes.", lambda: 12.0),
            ("you counted bits: an fp32 value is 4 bytes (32 bits), so m and v are 8 bytes.", lambda: 64.0),
        ]
    return [
        ("you forgot the absmax: each of the two states also stores one fp32 absmax (4 bytes) per block of "
         "`blocksize` values, 2 x 4 / blocksize per parameter.", lambda: 2.0),
        ("you counted one absmax per block, for one state only: m and v each have their own absmax, "
         "2 x 4 / blocksize per parameter.", lambda: 2 + 4 / b),
        ("you counted ONE uint8 code: 8-bit Adam keeps two states (m and v), one byte each, plus their absmax.",
         lambda: 1 + 4 / b),
        ("you counted ONE uint8 code: 8-bit Adam keeps two states (m and v), one byte each, plus their absmax.",
         lambda: 1 + 8 / b),
        ("you ignored the blocksize argument (your figure is the one for blocksize=256): the absmax costs "
         "2 x 4 / blocksize.", lambda: 2 + 8 / 256),
        ("you counted the absmax as 32 bytes: an fp32 absmax is 4 bytes (32 bits).", lambda: 2 + 64 / b),
        ("you counted bits: a uint8 code is 1 byte and an fp32 absmax 4 bytes.", lambda: 16 + 64 / b),
        ("you counted the absmax as a per-parameter value (4 bytes each): it is one fp32 number per BLOCK of "
         "`blocksize` values.", lambda: 2 + 8.0),
    ]


def check_state_bytes_per_param(state_bytes_per_param) -> None:
    """``state_bytes_per_param(kind, blocksize=256)``: 8 for AdamW, 2 + 8/blocksize for 8-bit Adam."""
    require_callable(state_bytes_per_param, "state_bytes_per_param")
    for kind in ("adamw", "adam8bit"):
        for blocksize in (256, 2048, 64):
            n = blocksize * 1000  # every block full: the per-parameter figure is exact
            expected = estimate_optimizer_memory(n, kind, blocksize=blocksize).bytes_per_param
            got = call(state_bytes_per_param, kind, blocksize=blocksize)
            expect_close(got, expected, what=f"state_bytes_per_param({kind!r}, blocksize={blocksize})",
                         rtol=1e-9, atol=1e-12,
                         default="AdamW: two fp32 states; 8-bit Adam: two uint8 codes + two fp32 absmax per block.",
                         variants=_bytes_per_param_variants(kind, blocksize))
    got = call(state_bytes_per_param, "adam8bit")
    expect_close(got, 2 + 8 / 256, what="state_bytes_per_param('adam8bit') with the default blocksize",
                 rtol=1e-9, atol=1e-12, default="the default blocksize is 256 (as in bitsandbytes).")
    try:
        got = state_bytes_per_param("sgd")
    except ValueError:
        pass
    except NotImplementedError as exc:
        if is_stub(exc):
            raise AssertionError("state_bytes_per_param is not implemented yet") from None
        fail(f"state_bytes_per_param('sgd') raised NotImplementedError inside torch: {exc}",
             hint=torch_not_implemented_hint(exc))
    except Exception as exc:  # noqa: BLE001 - any other error is the wrong kind
        hint = "raise ValueError for an unknown optimizer kind."
        if isinstance(exc, KeyError):
            hint = "a dict lookup raises KeyError: test the kind yourself and raise ValueError for an unknown one."
        fail(f"state_bytes_per_param('sgd') raised {type(exc).__name__}, expected ValueError.", hint=hint)
    else:
        if got is None:
            fail("state_bytes_per_param('sgd') returned None.",
                 hint="you returned None for an unknown kind: raise ValueError instead, so that a typo "
                      "('adam8bits') is an error and not a silent None.")
        fail(f"state_bytes_per_param('sgd') returned {got!r}.",
             hint="you returned a value for an unknown kind: raise ValueError for an unknown optimizer kind "
                  "(anything but 'adamw' and 'adam8bit').")
    passed("Exercise 01.1 · Bytes of state per parameter")


# ---------------------------------------------------------------------------- 01.2
def _variant_bytes(shapes, kind, blocksize, min_8bit_size, *, absmax_per_block=8, ceil=True, strict=False,
                   small_rule=True, per_tensor=True, adamw=8, small_bytes=8, first_dim=False, adamw_as_8bit=False):
    sizes = [(s[0] if s else 1) if first_dim else math.prod(s) for s in shapes]
    if kind == "adamw" and not adamw_as_8bit:
        return adamw * sum(sizes)
    big = [n for n in sizes if not small_rule or (n > min_8bit_size if strict else n >= min_8bit_size)]
    small = sum(sizes) - sum(big)
    blocks = (lambda n: -(-n // blocksize)) if ceil else (lambda n: n // blocksize)
    nblocks = sum(blocks(n) for n in big) if per_tensor else blocks(sum(big))
    return 2 * sum(big) + absmax_per_block * nblocks + small_bytes * small


_STATE_CASES = [
    # (shapes, kind, blocksize, min_8bit_size)
    ([(4096,)], "adam8bit", 256, 4096),
    ([(768, 768), (768,)], "adam8bit", 256, 4096),
    ([(3, 5000)], "adam8bit", 256, 4096),  # 15000 = 58 full blocks + a ragged tail
    ([(4095,), (4096,), (4097,)], "adam8bit", 256, 4096),  # the threshold itself
    ([(1000, 1000), (10,), (300,)], "adam8bit", 256, 4096),
    ([(5000,)], "adam8bit", 2048, 4096),
    ([(10,), (300, 3)], "adam8bit", 64, 0),  # min_8bit_size=0: everything 8-bit
    ([], "adam8bit", 256, 4096),
    ([(768, 768), (768,)], "adamw", 256, 4096),
    ([(2, 3, 4)], "adamw", 256, 4096),
]


def check_optimizer_state_bytes(optimizer_state_bytes) -> None:
    """``optimizer_state_bytes(shapes, kind, blocksize=256, min_8bit_size=4096)`` in bytes (an int)."""
    require_callable(optimizer_state_bytes, "optimizer_state_bytes")
    def want_of(shapes, kind, blocksize, min_size):
        return estimate_optimizer_memory(shapes, kind, blocksize=blocksize, min_8bit_size=min_size).total_bytes

    def tags(shapes, kind, blocksize, min_size):
        sizes = [math.prod(s) for s in shapes]
        big = [n for n in sizes if n >= min_size]
        return [f"with kind={kind!r}", "with no tensors" if not shapes else "with tensors",
                "with a tensor of exactly min_8bit_size elements" if min_size in sizes else
                "without a tensor of exactly min_8bit_size elements",
                "with a tensor smaller than min_8bit_size" if len(big) < len(sizes) else
                "where every tensor has 8-bit states (or none)",
                "with a multi-dimensional tensor" if any(len(s) > 1 for s in shapes) else "with 1-D tensors only",
                "with an 8-bit tensor that is not a whole number of blocks" if kind == "adam8bit" and
                any(n % blocksize for n in big) else "whose 8-bit tensors are whole blocks (or none)",
                "with min_8bit_size=0" if min_size == 0 else "with min_8bit_size > 0",
                "with a blocksize other than 256" if blocksize != 256 else "with blocksize 256"]

    outcomes = []
    for case in _STATE_CASES:
        try:
            answer = optimizer_state_bytes(list(case[0]), case[1], blocksize=case[2], min_8bit_size=case[3])
        except Exception:  # noqa: BLE001 - the main loop reports it
            answer = None
        outcomes.append((tags(*case), answer is not None and matches(answer, want_of(*case), rtol=0, atol=0)))
    pattern = case_pattern(outcomes)
    for shapes, kind, blocksize, min_size in _STATE_CASES:
        expected = want_of(shapes, kind, blocksize, min_size)
        got = call(optimizer_state_bytes, list(shapes), kind, blocksize=blocksize, min_8bit_size=min_size)
        what = f"optimizer_state_bytes({shapes}, {kind!r}, blocksize={blocksize}, min_8bit_size={min_size})"

        def v(**kw):
            return lambda: _variant_bytes(shapes, kind, blocksize, min_size, **kw)

        expect_close(got, expected, what=what, rtol=0, atol=0, context=pattern, default=(
            "per tensor: n >= min_8bit_size -> 2 bytes/param + 2 fp32 absmax per block (ceil(n / blocksize) "
            "blocks); smaller tensors -> 8 bytes/param (fp32 m and v)."), variants=[
            ("you counted ONE fp32 state for AdamW: it keeps m and v, 8 bytes per parameter.", v(adamw=4)),
            ("you ignored kind='adamw': with AdamW every tensor costs 8 bytes per parameter (fp32 m and v), "
             "whatever its size.", v(adamw_as_8bit=True)),
            ("you dropped the ragged tail: n // blocksize misses a tensor's last, short block; use "
             "ceil(n / blocksize) = -(-n // blocksize) blocks.", v(ceil=False)),
            ("you forgot the absmax: an 8-bit tensor also stores 2 fp32 absmax (m's and v's) per block, "
             "8 bytes per block.", v(absmax_per_block=0)),
            ("you counted one absmax per block: m and v have one each, 2 x 4 bytes per block.",
             v(absmax_per_block=4)),
            ("you made every tensor 8-bit: the small-tensor rule keeps tensors with fewer than min_8bit_size "
             "elements in fp32 (8 bytes/param).", v(small_rule=False)),
            ("you kept a tensor of exactly min_8bit_size elements in fp32: the rule is n >= min_8bit_size "
             "for 8-bit states.", v(strict=True)),
            ("you counted blocks over all tensors together: each tensor has its own blocks (and its own short "
             "last block).", v(per_tensor=False)),
            ("you counted ONE fp32 state for the small tensors: they keep m and v in fp32, 8 bytes/param.",
             v(small_bytes=4)),
            ("you counted only the first dimension of each shape: a (768, 768) tensor has math.prod(shape) "
             "elements.", v(first_dim=True)),
        ])
        if not isinstance(got, numbers.Integral) or isinstance(got, bool):
            fail(f"{what} returned {type(got).__name__} {got!r}, expected an int number of bytes.",
                 hint=f"you returned a {type(got).__name__}: bytes are whole numbers; count with integers "
                      "(// and a ceil division, no true division) and return an int.")
    passed("Exercise 01.2 · Optimizer state bytes of a model")


# ---------------------------------------------------------------------------- 01.3
def _states_adamw() -> list[dict]:
    model = torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.LayerNorm(30), torch.nn.Linear(30, 5))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 20)).square().mean().backward()
    opt.step()
    return list(opt.state.values())


def _states_adam8bit() -> list[dict]:
    model = torch.nn.Sequential(torch.nn.Linear(80, 70), torch.nn.Linear(70, 3))  # 5600 weights: 8-bit
    opt = Adam8bit(model.parameters(), lr=1e-3, backend="torch")
    model(torch.randn(4, 80)).square().mean().backward()
    opt.step()
    return list(opt.state.values())


def _states_shared_map() -> list[dict]:
    """States laid out as bitsandbytes keeps them: every state holds the SAME qmap tensors."""
    qmap1, qmap2 = dynamic_map(True), dynamic_map(False)
    states = []
    for n in (5000, 4096):
        blocks = -(-n // 256)
        states.append({"step": 3, "state1": torch.zeros(n, dtype=torch.uint8), "qmap1": qmap1,
                       "state2": torch.zeros(n, dtype=torch.uint8), "qmap2": qmap2,
                       "absmax1": torch.zeros(blocks), "absmax2": torch.zeros(blocks)})
    return states


_MOMENT_KEYS = {"exp_avg", "exp_avg_sq", "state1", "state2"}


def _variant_size(states, *, divisor=MB, dedupe=True, itemsize=None, only_moments=False, count_tensors=False,
                  skip_0d=False):
    seen, nbytes, elements = set(), 0, 0
    for state in states:
        for key, value in state.items():
            if not torch.is_tensor(value) or (only_moments and key not in _MOMENT_KEYS) \
                    or (skip_0d and value.dim() == 0):
                continue
            if dedupe:
                if id(value) in seen:
                    continue
                seen.add(id(value))
            nbytes += value.numel() * (itemsize or value.element_size())
            elements += 1 if count_tensors else value.numel()
    return nbytes / divisor, elements


def check_compute_optimizer_size(compute_optimizer_size_fn) -> None:
    """``compute_optimizer_size(optimizer.state.values())`` -> ``(megabytes, elements)``."""
    require_callable(compute_optimizer_size_fn, "compute_optimizer_size")
    cases = [("torch.optim.AdamW states (fp32 m, v and a step tensor)", _states_adamw),
             ("adam8lib Adam8bit states (uint8 codes, fp32 absmax, fp32 states for small tensors)", _states_adam8bit),
             ("bitsandbytes-style states that share one qmap1/qmap2 tensor", _states_shared_map),
             ("an optimizer that has not stepped yet (no states)", lambda: [])]
    for label, make in cases:
        states = make()
        expected = compute_optimizer_size(states)
        # what optimizer.state.values() is: a view of a dict (it can be looped over more than once)
        got = call(compute_optimizer_size_fn, dict(enumerate(states)).values())
        if not isinstance(got, tuple) or len(got) != 2:
            fail(f"for {label}: returned {type(got).__name__}, expected a tuple (megabytes, elements).",
                 hint="return megabytes, number_of_elements")
        expect_close(got, expected, what=f"for {label}: (megabytes, elements)", rtol=1e-9, atol=1e-12,
                     default="sum numel() * element_size() over every tensor of every state dict; MB = 2**20 bytes.",
                     variants=[
                         ("you divided by 10**6: 'MB' here means MiB, 2**20 bytes.",
                          lambda: _variant_size(states, divisor=1e6)),
                         ("you returned bytes, not megabytes: divide the bytes by 2**20.",
                          lambda: _variant_size(states, divisor=1)),
                         ("you counted the shared qmap tensors once per state: bitsandbytes puts the SAME "
                          "qmap1/qmap2 tensor in every state; count each tensor once (remember id(tensor)).",
                          lambda: _variant_size(states, dedupe=False)),
                         ("you counted every element as 4 bytes: uint8 codes take 1 byte; use "
                          "numel() * element_size().", lambda: _variant_size(states, itemsize=4)),
                         ("you returned (elements, megabytes): return (megabytes, elements), in that order.",
                          lambda: tuple(reversed(compute_optimizer_size(states)))),
                         ("you left out some of the state's tensors (only the moments counted, or the 0-d `step` "
                          "tensors skipped): count every tensor of each state dict, absmax, qmap and step too.",
                          lambda: _variant_size(states, only_moments=True)),
                         ("you left out some of the state's tensors (the 0-d `step` tensors): count every tensor "
                          "of each state dict, step counters included.", lambda: _variant_size(states, skip_0d=True)),
                         ("you counted tensors, not elements: the element count is the sum of numel().",
                          lambda: (expected[0], _variant_size(states, count_tensors=True)[1])),
                     ])
        assert_equal(type(got[1]).__name__, "int", what=f"for {label}: type of the element count",
                     hint="the number of elements is an int (sum of numel()).")
    passed("Exercise 01.3 · Measuring a live optimizer")
