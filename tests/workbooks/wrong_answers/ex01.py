"""Workbook 01 · optimizer memory: what learners write instead of the solution."""

from __future__ import annotations

import math

import numpy as np
import torch

from adam8lib.course import checks

from . import Right, Wrong


# ---------------------------------------------------------------------------- 01.1
def bytes_per_param(*, adamw=8.0, codes=2.0, absmax_bytes=4.0, absmax_states=2, fixed_blocksize=None,
                    unknown="raise"):
    def state_bytes_per_param(kind, blocksize=256):
        b = fixed_blocksize or blocksize
        if kind == "adamw":
            return adamw
        if kind == "adam8bit":
            return codes + absmax_states * absmax_bytes / b
        if unknown == "raise":
            raise ValueError(kind)
        if unknown == "key":
            return {"adamw": 8.0}[kind]
        return None

    return state_bytes_per_param


def bytes_per_param_in_bits(kind, blocksize=256):
    if kind not in ("adamw", "adam8bit"):
        raise ValueError(kind)
    bits = 2 * 32 if kind == "adamw" else 2 * 8 + 2 * 32 / blocksize
    return bits


def bytes_per_param_from_table(kind, blocksize=256):
    table = {"adamw": lambda b: 2 * torch.finfo(torch.float32).bits // 8,
             "adam8bit": lambda b: 2 * (torch.iinfo(torch.uint8).bits / 8 + torch.finfo(torch.float32).bits / 8 / b)}
    if kind not in table:
        raise ValueError(f"no such optimizer {kind}")
    return table[kind](blocksize)


def bytes_per_param_from_bits(kind, blocksize=256):
    if kind == "adamw":
        bits = 2 * 32
    elif kind == "adam8bit":
        bits = 2 * 8 + 2 * 32 / blocksize
    else:
        raise ValueError(kind)
    return bits / 8


# ---------------------------------------------------------------------------- 01.2
def state_bytes(*, ceil=True, absmax_per_block=8, small_rule=True, strict=False, per_tensor=True,
                small_bytes=8, adamw_as_8bit=False, first_dim=False, as_float=False):
    def optimizer_state_bytes(shapes, kind="adam8bit", blocksize=256, min_8bit_size=4096):
        sizes = [(s[0] if s else 1) if first_dim else math.prod(s) for s in shapes]
        if kind == "adamw" and not adamw_as_8bit:
            return 8 * sum(sizes)
        total, big = 0, []
        for n in sizes:
            is_small = small_rule and (n <= min_8bit_size if strict else n < min_8bit_size)
            if is_small:
                total += small_bytes * n
            else:
                big.append(n)
        blocks = (lambda n: -(-n // blocksize)) if ceil else (lambda n: n // blocksize)
        nblocks = sum(blocks(n) for n in big) if per_tensor else blocks(sum(big))
        total += 2 * sum(big) + absmax_per_block * nblocks
        return float(total) if as_float else total

    return optimizer_state_bytes


def state_bytes_with_numpy(shapes, kind="adam8bit", blocksize=256, min_8bit_size=4096):
    sizes = np.array([np.prod(s, dtype=np.int64) for s in shapes], dtype=np.int64)
    if kind == "adamw":
        return np.sum(sizes) * 8
    small = sizes < min_8bit_size
    big = sizes[~small]
    return np.sum(8 * sizes[small]) + np.sum(2 * big) + 8 * np.sum(np.ceil(big / blocksize).astype(np.int64))


def state_bytes_per_tensor_function(shapes, kind="adam8bit", blocksize=256, min_8bit_size=4096):
    def one(n):
        if kind != "adam8bit" or n < min_8bit_size:
            return 2 * 4 * n
        return 2 * (n + 4 * math.ceil(n / blocksize))

    return sum((one(math.prod(shape)) for shape in shapes), 0)


# ---------------------------------------------------------------------------- 01.3
def optimizer_size(*, divisor=2**20, dedupe=True, itemsize=None, swap=False, only_moments=False,
                   count_tensors=False, two_passes=False, skip_0d=False):
    moment_keys = {"exp_avg", "exp_avg_sq", "state1", "state2"}

    def compute_optimizer_size(optimizer_states):
        def tensors(states):
            seen = set()
            for state in states:
                for key, value in state.items():
                    if not torch.is_tensor(value) or (only_moments and key not in moment_keys) \
                            or (skip_0d and value.dim() == 0):
                        continue
                    if dedupe and id(value) in seen:
                        continue
                    seen.add(id(value))
                    yield value

        if two_passes:  # fine: optimizer.state.values() is a view, it can be looped over again
            nbytes = sum(t.numel() * t.element_size() for t in tensors(optimizer_states))
            elements = sum(t.numel() for t in tensors(optimizer_states))
        else:
            found = list(tensors(optimizer_states))
            nbytes = sum(t.numel() * (itemsize or t.element_size()) for t in found)
            elements = len(found) if count_tensors else sum(t.numel() for t in found)
        out = (nbytes / divisor, elements)
        return out[::-1] if swap else out

    return compute_optimizer_size


def optimizer_size_by_nbytes(optimizer_states):
    unique = {}
    for state in list(optimizer_states):
        unique.update({id(t): t for t in state.values() if isinstance(t, torch.Tensor)})
    return sum(t.nbytes for t in unique.values()) / 1024 / 1024, sum(int(t.numel()) for t in unique.values())


def optimizer_size_by_storage(optimizer_states):
    seen, nbytes, elements = [], 0, 0
    for state in optimizer_states:
        for value in state.values():
            if isinstance(value, torch.Tensor) and not any(value is s for s in seen):
                seen.append(value)
                nbytes += value.nelement() * value.itemsize
                elements += value.nelement()
    return nbytes / (1 << 20), elements


_C1, _C2, _C3 = checks.check_state_bytes_per_param, checks.check_optimizer_state_bytes, \
    checks.check_compute_optimizer_size

WRONG = [
    # 01.1
    Wrong("01.1", _C1, bytes_per_param(adamw=4.0), "AdamW counted with one state",
          "you counted ONE fp32 state for AdamW", True),
    Wrong("01.1", _C1, bytes_per_param(adamw=16.0), "parameters and gradients counted as state",
          "you counted the parameter and its gradient too", True),
    Wrong("01.1", _C1, bytes_per_param(absmax_states=0), "8-bit Adam without the absmax",
          "you forgot the absmax", True),
    Wrong("01.1", _C1, bytes_per_param(absmax_states=1), "one absmax per block instead of one per state",
          "you counted one absmax per block, for one state only", True),
    Wrong("01.1", _C1, bytes_per_param(codes=1.0), "8-bit Adam counted with one state",
          "you counted ONE uint8 code", True),
    Wrong("01.1", _C1, bytes_per_param(fixed_blocksize=256), "blocksize hard-coded to 256",
          "you ignored the blocksize argument", True),
    Wrong("01.1", _C1, bytes_per_param(absmax_bytes=32.0), "absmax counted as 32 bytes (its bits)",
          "you counted the absmax as 32 bytes", True),
    Wrong("01.1", _C1, bytes_per_param_in_bits, "bits instead of bytes", "you counted bits", True),
    Wrong("01.1", _C1, bytes_per_param(unknown="none"), "an unknown kind returns None",
          "you returned None for an unknown kind", True),
    Wrong("01.1", _C1, bytes_per_param(unknown="key"), "a dict lookup raises KeyError",
          "raised KeyError, expected ValueError", True),
    # 01.2
    Wrong("01.2", _C2, state_bytes(ceil=False), "floor division for the block count",
          "you dropped the ragged tail", True),
    Wrong("01.2", _C2, state_bytes(absmax_per_block=0), "absmax not counted", "you forgot the absmax", True),
    Wrong("01.2", _C2, state_bytes(absmax_per_block=4), "one absmax per block for both states",
          "you counted one absmax per block", True),
    Wrong("01.2", _C2, state_bytes(small_rule=False), "no small-tensor rule",
          "you made every tensor 8-bit", True),
    Wrong("01.2", _C2, state_bytes(strict=True), "n > min_8bit_size instead of >=",
          "you kept a tensor of exactly min_8bit_size elements in fp32", True),
    Wrong("01.2", _C2, state_bytes(per_tensor=False), "blocks counted over the whole model",
          "you counted blocks over all tensors together", True),
    Wrong("01.2", _C2, state_bytes(small_bytes=4), "small tensors with one fp32 state",
          "you counted ONE fp32 state for the small tensors", True),
    Wrong("01.2", _C2, state_bytes(adamw_as_8bit=True), "kind='adamw' ignored",
          "you ignored kind='adamw'", True),
    Wrong("01.2", _C2, state_bytes(first_dim=True), "n = shape[0] (a 1-D habit)",
          "you counted only the first dimension", True),
    Wrong("01.2", _C2, state_bytes(as_float=True), "float bytes", "you returned a float", True),
    # 01.3
    Wrong("01.3", _C3, optimizer_size(divisor=1e6), "MB = 1e6 bytes", "you divided by 10**6", True),
    Wrong("01.3", _C3, optimizer_size(divisor=1), "bytes returned as megabytes",
          "you returned bytes, not megabytes", True),
    Wrong("01.3", _C3, optimizer_size(dedupe=False), "shared qmap counted in every state",
          "you counted the shared qmap tensors once per state", True),
    Wrong("01.3", _C3, optimizer_size(itemsize=4), "every element counted as 4 bytes",
          "you counted every element as 4 bytes", True),
    Wrong("01.3", _C3, optimizer_size(swap=True), "(elements, megabytes)",
          "you returned (elements, megabytes)", True),
    Wrong("01.3", _C3, optimizer_size(only_moments=True), "only the moments counted",
          "you left out some of the state's tensors", True),
    Wrong("01.3", _C3, optimizer_size(skip_0d=True), "0-d tensors (the step counters) skipped",
          "you left out some of the state's tensors", True),
    Wrong("01.3", _C3, optimizer_size(count_tensors=True), "number of tensors as the element count",
          "you counted tensors, not elements", True),
]

RIGHT = [
    Right("01.1", _C1, bytes_per_param_from_table, how="dict of lambdas from torch.finfo/iinfo bit widths"),
    Right("01.1", _C1, bytes_per_param_from_bits, how="count bits, divide by 8"),
    Right("01.2", _C2, state_bytes_with_numpy, how="vectorised with NumPy (numpy integers)"),
    Right("01.2", _C2, state_bytes_per_tensor_function, how="a helper per tensor, math.ceil of a true division"),
    Right("01.3", _C3, optimizer_size_by_nbytes, how="dict keyed by id, Tensor.nbytes, / 1024 / 1024"),
    Right("01.3", _C3, optimizer_size(two_passes=True), how="two passes over optimizer.state.values() (a dict view)"),
    Right("01.3", _C3, optimizer_size_by_storage, how="identity test against a list, nelement() * itemsize"),
]
