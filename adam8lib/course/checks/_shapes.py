"""A learner's function that works on 1-D tensors and breaks on other shapes.

Loops over ``x`` (``for row in x``, ``range(len(x))``, ``float(x[i])``) handle a vector and
fail on a matrix (each item is a row) or a 0-d tensor (``len()`` of a 0-d tensor). When the
check's 1-D inputs have passed, a crash on another shape is most likely that::

    got = call_any_shape(absmax_quantize_fn, x.shape, x.clone())
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._common import call, fail

__all__ = ["call_any_shape"]


def call_any_shape(fn: Callable, shape: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(fn, *args, **kwargs)``; a crash on an input of ``shape`` other than 1-D gets a hint about shapes."""
    try:
        return call(fn, *args, **kwargs)
    except AssertionError as err:
        cause = err.__cause__
        if cause is None or isinstance(cause, NotImplementedError) or len(tuple(shape)) == 1:
            raise
        kind = "a 0-d tensor" if len(tuple(shape)) == 0 else f"a tensor of shape {tuple(shape)}"
        fail(str(err), hint=f"your function failed on {kind}: a loop over x (or len(x), float(x[i])) only works "
                            "for 1-D tensors; write it with whole-tensor operations, which work for any shape.")
