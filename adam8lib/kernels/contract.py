"""The contract every 8-bit Adam backend's arguments obey, checked in one place.

A backend step ``step(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, *, step, lr, beta1,
beta2, eps, weight_decay, blocksize, ...)`` receives, for ``n = p.numel()`` and
``blocks = ceil(n / blocksize)``:

==========  ==========================  ===========
argument    dtype                       elements
==========  ==========================  ===========
p           fp32, bf16 or fp16          n
g           any floating point          n
state1/2    uint8                       n
absmax1/2   fp32                        blocks
qmap1/2     fp32                        256
==========  ==========================  ===========

and every one of them is a *plain dense tensor with storage*: exactly ``torch.Tensor`` (or
``nn.Parameter``), strided layout, 1-D, contiguous, on one device, not a meta tensor. Kernels
written in C++ or Triton read raw memory, so anything else (a DTensor shard, a tensor subclass,
a sparse or meta tensor, a strided view) would be read as garbage or crash the process;
:func:`check_step_args` turns all of these into a TypeError or ValueError that names the
argument. ``step`` is an int >= 1 and ``blocksize`` one of
:data:`adam8lib.quant.SUPPORTED_BLOCKSIZES`.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import torch

from ..quant import check_blocksize, num_blocks

__all__ = ["check_plain_tensor", "check_step", "check_step_args", "check_each", "checked_for_backend", "PARAM_DTYPES"]

#: Parameter dtypes every backend accepts.
PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_STRIDED = torch.strided


def _is_dtensor(t: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return False
    return isinstance(t, DTensor)


def is_usual_tensor(t: object) -> bool:
    """True for the usual case :func:`check_plain_tensor` accepts (a plain dense tensor with
    memory), in a few cheap attribute reads; False means: ask check_plain_tensor for the verdict.
    For checks that run for every tensor at every step."""
    return (type(t) in _PLAIN_TYPES and t.layout is _STRIDED and not t.is_quantized and not t.is_nested
            and not t.is_meta)


def check_plain_tensor(t: object, name: str) -> None:
    """Raise TypeError/ValueError unless ``t`` is a plain dense tensor that owns storage.

    Rejects (with the reason in the message): non-tensors, DTensors (FSDP2 / tensor
    parallel: pass the local shard), other tensor subclasses, sparse/other layouts,
    quantized and nested tensors, and meta tensors (no memory behind them).
    """
    if type(t) not in _PLAIN_TYPES:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if _is_dtensor(t):
            raise TypeError(
                f"{name} is a DTensor (FSDP2 / tensor parallel); adam8lib's 8-bit step needs plain tensors: "
                "pass the local shard (dtensor.to_local()); Adam8bit/AdamW8bit do that for DTensor parameters themselves"
            )
        raise TypeError(
            f"{name} is a tensor subclass ({type(t).__module__}.{type(t).__qualname__}); adam8lib's 8-bit step "
            "needs plain torch.Tensor / nn.Parameter objects that own their memory"
        )
    if t.layout != torch.strided or t.is_sparse:
        raise TypeError(f"{name} has layout {t.layout}; only dense (strided) tensors are supported")
    if t.is_quantized or t.is_nested:
        raise TypeError(f"{name} is a {'quantized' if t.is_quantized else 'nested'} tensor; only dense tensors are supported")
    if t.device.type == "meta":
        raise ValueError(
            f"{name} is a meta tensor (no memory); materialize the model first, e.g. model.to_empty(device=...) "
            "and re-initialize it"
        )


def check_step(step: object) -> None:
    """ValueError unless ``step`` (a step count) is an int >= 1 (a bool is not)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step must be an int >= 1, got {step!r}")


def check_each(tensors, steps, check) -> tuple[list, list]:
    """The arguments of a many-tensor step: ``tensors`` as lists of ``(p, g, state1, state2,
    absmax1, absmax2)``, one step count each in ``steps``; ``check(item, step)`` raises for a bad
    one, and every p must be on the first one's device; a TypeError/ValueError comes back naming
    the tensor's position. Returns both lists."""
    tensors, steps = list(tensors), list(steps)
    if len(steps) != len(tensors):
        raise ValueError(f"steps must give one step count per tensor: {len(steps)} for {len(tensors)} tensors")
    for i, (item, step) in enumerate(zip(tensors, steps)):
        try:
            if not isinstance(item, (tuple, list)) or len(item) != 6:
                raise TypeError("each entry must be (p, g, state1, state2, absmax1, absmax2)")
            check_step(step)
            check(item, step)
            if item[0].device != tensors[0][0].device:
                raise ValueError(f"p is on {item[0].device}, the first tensor's p on {tensors[0][0].device}")
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"tensor {i} of {len(tensors)}: {exc}") from None
    return tensors, steps


_just_checked = threading.local()  # .keys: the arguments the dispatcher checked, while it calls the backend


@contextlib.contextmanager
def checked_for_backend(calls: list[tuple], blocksize: object) -> Iterator[None]:
    """While the dispatcher (:func:`adam8lib.kernels.adam8bit_step`), having just checked these
    arguments (``calls``: the eight tensors of each step it checked), calls a backend: the
    backend's own :func:`check_step_args` of the *same objects* with the same blocksize returns
    at once instead of checking them a second time (~20 us per call, per parameter tensor).
    Per thread, and only for the duration of that one call."""
    _just_checked.keys = {(tuple(map(id, tensors)), blocksize) for tensors in calls}
    try:
        yield
    finally:
        _just_checked.keys = None


def check_step_args(
    p: torch.Tensor,
    g: torch.Tensor,
    state1: torch.Tensor,
    state2: torch.Tensor,
    absmax1: torch.Tensor,
    absmax2: torch.Tensor,
    qmap1: torch.Tensor,
    qmap2: torch.Tensor,
    *,
    blocksize: int,
    step: int | None = None,
) -> None:
    """Check a backend's arguments against the contract above; TypeError/ValueError if broken.

    Nothing is modified, so a caller that checks first changes nothing on a bad call.
    ``step`` is checked when given.
    """
    keys = getattr(_just_checked, "keys", None)
    if keys and (tuple(map(id, (p, g, state1, state2, absmax1, absmax2, qmap1, qmap2))), blocksize) in keys:
        if step is not None:
            check_step(step)
        return  # checked by the dispatcher a moment ago (see checked_for_backend)
    tensors = (("p", p), ("g", g), ("state1", state1), ("state2", state2), ("absmax1", absmax1),
               ("absmax2", absmax2), ("qmap1", qmap1), ("qmap2", qmap2))
    for name, t in tensors:
        if not is_usual_tensor(t):
            check_plain_tensor(t, name)
    device = p.device
    for name, t in tensors:
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but p is on {device}; all tensors must share one device")
        if t.ndim != 1 or not t.is_contiguous():
            raise ValueError(
                f"{name} must be a flat contiguous 1-D tensor (backends update flat memory in place), "
                f"got shape {tuple(t.shape)} with strides {t.stride()}"
            )
    check_blocksize(blocksize)
    if step is not None:
        check_step(step)
    if p.dtype not in PARAM_DTYPES:
        raise TypeError(f"p must be fp32, bf16 or fp16, got {p.dtype}")
    if not g.is_floating_point():
        raise TypeError(f"g must be a floating-point tensor, got {g.dtype}")
    n = p.numel()
    blocks = num_blocks(n, blocksize)
    for name, t, size, dtype in (
        ("g", g, n, g.dtype),
        ("state1", state1, n, torch.uint8), ("state2", state2, n, torch.uint8),
        ("absmax1", absmax1, blocks, torch.float32), ("absmax2", absmax2, blocks, torch.float32),
        ("qmap1", qmap1, 256, torch.float32), ("qmap2", qmap2, 256, torch.float32),
    ):
        if t.dtype != dtype:
            raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
        if t.numel() != size:
            raise ValueError(
                f"{name} must have {size} elements (n={n}, blocksize={blocksize}), got {t.numel()}"
            )
