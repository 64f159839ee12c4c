"""Checks for workbook 01 · optimizer memory (bytes per parameter, measuring a live optimizer)."""

from __future__ import annotations

import math

import torch

from ...memory import MB, compute_optimizer_size, estimate_optimizer_memory
from ...optim import Adam8bit
from ...quant import dynamic_map
from ._common import assert_equal, call, fail, passed, require_callable
from ._variants import expect_close

__all__ = ["check_state_bytes_per_param", "check_optimizer_state_bytes", "check_compute_optimizer_size"]


# ---------------------------------------------------------------------------- 01.1
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
                         variants=[
                             ("AdamW keeps TWO fp32 states (m and v): 2 x 4 bytes.", lambda: 4.0),
                             ("count only the optimizer's states: parameters and gradients are the same for every "
                              "optimizer and are not part of this figure.", lambda: 16.0),
                             ("you forgot the absmax: each block of `blocksize` values stores an fp32 absmax "
                              "(4 bytes) for m and another for v.", lambda: 2.0),
                             ("one absmax per block for each of the TWO states: 2 x 4 / blocksize.",
                              lambda b=blocksize: 2 + 4 / b),
                             ("8-bit Adam has two states (m and v), one byte each, plus their absmax.",
                              lambda b=blocksize: 1 + 4 / b),
                         ])
    got = call(state_bytes_per_param, "adam8bit")
    expect_close(got, 2 + 8 / 256, what="state_bytes_per_param('adam8bit') with the default blocksize",
                 rtol=1e-9, atol=1e-12, default="the default blocksize is 256 (as in bitsandbytes).")
    try:
        state_bytes_per_param("sgd")
    except ValueError:
        pass
    except NotImplementedError:
        raise AssertionError("state_bytes_per_param is not implemented yet") from None
    except Exception as exc:  # noqa: BLE001 - any other error is the wrong kind
        fail(f"state_bytes_per_param('sgd') raised {type(exc).__name__}, expected ValueError.",
             hint="raise ValueError for an unknown optimizer kind.")
    else:
        fail("state_bytes_per_param('sgd') returned a value.", hint="raise ValueError for an unknown optimizer kind.")
    passed("Exercise 01.1 · Bytes of state per parameter")


# ---------------------------------------------------------------------------- 01.2
def _variant_bytes(shapes, kind, blocksize, min_8bit_size, *, absmax_per_block=8, ceil=True, strict=False,
                   small_rule=True, per_tensor=True, adamw=8):
    sizes = [math.prod(s) for s in shapes]
    if kind == "adamw":
        return adamw * sum(sizes)
    big = [n for n in sizes if not small_rule or (n > min_8bit_size if strict else n >= min_8bit_size)]
    small = sum(sizes) - sum(big)
    blocks = (lambda n: -(-n // blocksize)) if ceil else (lambda n: n // blocksize)
    nblocks = sum(blocks(n) for n in big) if per_tensor else blocks(sum(big))
    return 2 * sum(big) + absmax_per_block * nblocks + 8 * small


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
    for shapes, kind, blocksize, min_size in _STATE_CASES:
        expected = estimate_optimizer_memory(shapes, kind, blocksize=blocksize, min_8bit_size=min_size).total_bytes
        got = call(optimizer_state_bytes, list(shapes), kind, blocksize=blocksize, min_8bit_size=min_size)
        what = f"optimizer_state_bytes({shapes}, {kind!r}, blocksize={blocksize}, min_8bit_size={min_size})"

        def v(**kw):
            return lambda: _variant_bytes(shapes, kind, blocksize, min_size, **kw)

        expect_close(got, expected, what=what, rtol=0, atol=0, default=(
            "per tensor: n >= min_8bit_size -> 2 bytes/param + 2 fp32 absmax per block (ceil(n / blocksize) "
            "blocks); smaller tensors -> 8 bytes/param (fp32 m and v)."), variants=[
            ("AdamW keeps two fp32 states: 8 bytes per parameter.", v(adamw=4)),
            ("the ragged tail is a block too: use ceil(n / blocksize) blocks, not n // blocksize.", v(ceil=False)),
            ("you forgot the absmax: 2 fp32 values (m's and v's) per block.", v(absmax_per_block=0)),
            ("one absmax per block for EACH state: 2 x 4 bytes per block.", v(absmax_per_block=4)),
            ("small-tensor rule missing: tensors with fewer than min_8bit_size elements keep fp32 states "
             "(8 bytes/param).", v(small_rule=False)),
            ("the rule is n >= min_8bit_size for 8-bit states (a tensor of exactly 4096 elements is 8-bit).",
             v(strict=True)),
            ("blocks are counted per tensor (each tensor's last block may be short), not over the whole model.",
             v(per_tensor=False)),
        ])
        if not isinstance(got, int) or isinstance(got, bool):
            fail(f"{what} returned {type(got).__name__}, expected an int number of bytes.",
                 hint="bytes are whole numbers: use integer arithmetic (// and a ceil division) and return an int.")
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


def _variant_size(states, *, divisor=MB, dedupe=True, itemsize=None):
    seen, nbytes, elements = set(), 0, 0
    for state in states:
        for value in state.values():
            if not torch.is_tensor(value):
                continue
            if dedupe:
                if id(value) in seen:
                    continue
                seen.add(id(value))
            nbytes += value.numel() * (itemsize or value.element_size())
            elements += value.numel()
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
        got = call(compute_optimizer_size_fn, iter(states))  # optimizer.state.values() is an iterable view
        if not isinstance(got, tuple) or len(got) != 2:
            fail(f"for {label}: returned {type(got).__name__}, expected a tuple (megabytes, elements).",
                 hint="return megabytes, number_of_elements")
        expect_close(got, expected, what=f"for {label}: (megabytes, elements)", rtol=1e-9, atol=1e-12,
                     default="sum numel() * element_size() over every tensor of every state dict; MB = 2**20 bytes.",
                     variants=[
                         ("'MB' here is MiB: divide the bytes by 2**20, not 10**6.",
                          lambda: _variant_size(states, divisor=1e6)),
                         ("a tensor shared by several states (bitsandbytes keeps ONE qmap in each) must be "
                          "counted once: remember the tensors you have seen.",
                          lambda: _variant_size(states, dedupe=False)),
                         ("bytes = numel() * element_size(): uint8 codes take 1 byte, fp32 4.",
                          lambda: _variant_size(states, itemsize=4)),
                         ("return (megabytes, elements) in that order.",
                          lambda: tuple(reversed(compute_optimizer_size(states)))),
                     ])
        assert_equal(type(got[1]).__name__, "int", what=f"for {label}: type of the element count",
                     hint="the number of elements is an int (sum of numel()).")
    passed("Exercise 01.3 · Measuring a live optimizer")
