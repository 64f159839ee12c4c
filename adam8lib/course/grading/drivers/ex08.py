"""Drivers of workbook 08 (:mod:`adam8lib.course.checks.ex08_triton_kernel`): the learner's ``@triton.jit`` kernel
described (is it a kernel at all, built for the interpreter or a GPU) and launched on buffers the check sends.

The check makes its inputs and outputs inside larger buffers filled with sentinels (so that a kernel writing past
``n`` is caught) and sends the buffers, as plain tensors, with the view of each one the kernel is given (offset,
shape, stride): :func:`launch` rebuilds the same views on copies of those buffers — on the GPU when there is one —,
launches ``kernel[grid](...)`` on them, and returns the whole buffers as they are afterwards. The check copies them
back into its own buffers and compares there, with its own reference; nothing the kernel's object is or says
reaches it. The workbook stub (``raise NotImplementedError`` in the kernel's body, which Triton's interpreter wraps
in an error of its own) is recognised here, where it was raised."""

from __future__ import annotations

import os

import torch

from . import _is_stub, driver

__all__ = ["describe_kernel", "launch"]


def _name(obj) -> str:
    name = getattr(obj, "__name__", None)
    return name if type(name) is str else type(obj).__name__


@driver
def describe_kernel(kernel) -> dict:
    """What the learner's object is: launchable as ``kernel[grid]``, built by Triton's interpreter, whether this
    process has a GPU, what ``TRITON_INTERPRET`` is here, the object's and the kernel function's names."""
    interpret = os.environ.get("TRITON_INTERPRET")
    return {"launchable": hasattr(kernel, "__getitem__"), "interpreted": type(kernel).__name__ == "InterpretedFunction",
            "cuda": torch.cuda.is_available(), "interpret": interpret if type(interpret) is str else None,
            "name": _name(kernel), "fn_name": _name(getattr(kernel, "fn", kernel))}


def _stub_raised(exc: BaseException) -> bool:
    """The workbook stub's ``raise NotImplementedError`` in the kernel's body (the interpreter wraps it: its message
    names the exercise, its cause is the stub's exception)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a learner's __str__ may raise
        return False
    cause = exc.__cause__
    return "NotImplementedError" in text and ("Exercise 08." in text or isinstance(cause, NotImplementedError)
                                              and _is_stub(cause))


@driver
def launch(kernel, grid: list, buffers: list, args: list, kwargs: dict) -> dict:
    """``kernel[grid](*args, **kwargs)`` with each argument ``{"buffer": i, "offset": …, "shape": …, "stride": …}``
    replaced by that view of (a copy of) ``buffers[i]``, on the GPU when there is one: ``{"stub": True}`` when the
    kernel is the workbook stub, else ``{"stub": False, "buffers": [every buffer afterwards, on the CPU]}``."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    made = [torch.as_tensor(b).detach().clone().to(device) for b in buffers]

    def view(a):
        if type(a) is dict and "buffer" in a:
            return made[int(a["buffer"])].as_strided(tuple(a["shape"]), tuple(a["stride"]), int(a["offset"]))
        return a

    try:
        kernel[tuple(grid)](*[view(a) for a in args], **{k: view(v) for k, v in kwargs.items()})
    except Exception as exc:
        if _stub_raised(exc):
            return {"stub": True, "buffers": None}
        raise
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"stub": False, "buffers": [b.detach().to("cpu", copy=True) for b in made]}
