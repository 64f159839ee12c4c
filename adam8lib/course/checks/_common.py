"""Shared helpers for the workbook checks (``adam8lib/course/checks/exNN_*.py``).

A check takes the learner's function, compares it with the library's reference on several
inputs, raises :class:`AssertionError` with a *hint* naming the likely mistake, and on
success prints exactly one line (stored as the check cell's output and compared by nbval)::

    from adam8lib.course.checks._common import assert_close, assert_equal, call, passed

    def check_ema_update(ema_update):
        for beta in (0.0, 0.9, 0.999):
            got = call(ema_update, avg, x, beta)               # stub -> "not implemented yet"
            assert_close(got, reference(avg, x, beta),
                         hint="avg = beta*avg + (1-beta)*x: is beta on the old average?",
                         what=f"ema_update(beta={beta})")
        passed("Exercise 02.1 · EMA update")                   # ✔ Exercise 02.1 · EMA update: all checks passed

Helpers
-------
``call(fn, *args, may_change=(), **kwargs)``
    Call the learner's function. Its tensor / array arguments must come back unchanged (bitwise, same
    shape and dtype) unless ``may_change`` lists them (indices or parameter names; ``ALL_ARGS`` for a
    kernel that writes into its pointers): "your function modified its argument `m` in place". The stub's own ``raise NotImplementedError(...)`` becomes an
    AssertionError "<name> is not implemented yet"; a ``NotImplementedError`` raised by torch
    (an operation that has no kernel for these dtypes, e.g. ``<<`` on a float tensor) and any
    other exception become an AssertionError that names the function, the exception and the
    inputs (chained, so the traceback stays visible), with a hint where one applies.
``is_stub(exc)``
    True when a ``NotImplementedError`` is the workbook stub's own raise (decided by where it was
    raised: a ``raise NotImplementedError`` line in the learner's code), not torch's.
``assert_close(actual, expected, *, hint, rtol, atol, what, dtype, check_dtype)``
    Tensors / arrays / numbers / (nested) tuples and lists: checks ``None`` (forgotten
    ``return``), type, shape, optionally dtype, non-finite values, then closeness; the message
    gives the worst element, its index and the hint.
``assert_equal(actual, expected, *, hint, what)``
    Exact equality (codes, counts, shapes, strings, sets of names), same reporting.
``fail(message, hint=None)``
    Raise the AssertionError in the common format (for checks of your own).
``require_callable(fn, name)``
    TypeError when the check was given something that is not a function.
``passed(title)``
    Print ``✔ <title>: all checks passed`` (the one fixed success line).

The record a failing check leaves
---------------------------------
Every failure raised through these helpers inside a workbook check (``check_*`` of an ``exNN_*``
module) is recorded for :func:`adam8lib.course.hints.hint`: the exercise ("13.1"), the check,
``what`` was called, the *property* that failed (``kind``: the stub, no ``return``, the type, an
error raised, an input changed in place, the shape, the dtype, NaN/Inf, the values, or a property
the check names in its own words), the check's first line and its hint
(:func:`last_failure`). The message gets one more line, before its ``Hint:`` (which stays last,
as the feedback pages read it): the property and the exact call that asks for help, e.g.
``→ property that failed: the shape · stuck? run  hint("04.1")``. ``passed`` records the pass.
A failure outside a workbook check is not recorded and its message is unchanged. In a notebook, importing
the checks (a workbook's check cell) binds ``hint`` in the learner's namespace when that name is free, so the
line works as typed; where it cannot, the line carries its import.
"""

from __future__ import annotations

import linecache
import math
import numbers
import os
import re
import sys
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

__all__ = [
    "Failure",
    "last_failure",
    "outcome",
    "forget_outcomes",
    "SUCCESS_MARK",
    "success_line",
    "passed",
    "fail",
    "refail",
    "call",
    "ALL_ARGS",
    "is_stub",
    "torch_not_implemented_hint",
    "require_callable",
    "exception_hint",
    "assert_close",
    "assert_equal",
    "require_tensor",
    "require_type",
]

SUCCESS_MARK = "✔"


def success_line(title: str) -> str:
    """The fixed success line of a check: ``✔ <title>: all checks passed``."""
    if not isinstance(title, str) or not title.strip():
        raise ValueError("a check's title must be a non-empty string")
    return f"{SUCCESS_MARK} {title.strip()}: all checks passed"


def passed(title: str) -> None:
    """Print the one success line of a check (nbval compares it with the stored output)."""
    line = success_line(title)
    _record_pass(title)
    print(line)


# ---------------------------------------------------------------------------------------------------------
# The record a failing check leaves, for hint("NN.k") (adam8lib/course/hints.py)
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Failure:
    """What the last failed run of an exercise's check got wrong.

    ``kind`` is the property that failed: ``"stub"`` (the function is still the workbook's stub),
    ``"none"`` (nothing returned), ``"type"``, ``"error"`` (the learner's code raised), ``"in_place"`` (an
    input changed), ``"shape"``, ``"dtype"``, ``"nonfinite"`` (NaN/Inf where there should be none, or the
    other way round), ``"keys"``, ``"values"``, or ``"check"`` (a property the check states in its own words,
    e.g. an argument ``check(group)`` must refuse). ``got``/``expected``: the two sides where known (shapes,
    dtypes, the worst element), as short text. ``serial`` grows with every failure recorded. ``words``: the
    property in the check's own few words, where the kind alone would not say it (the property line shows them)."""

    exercise: str
    check: str
    kind: str
    what: str
    message: str
    hint: str | None
    got: str = ""
    expected: str = ""
    serial: int = 0
    words: str = ""


#: exercise id -> its last failure (None after a pass); only exercises whose check ran in this process
_OUTCOMES: dict[str, Failure | None] = {}
_LAST: list[Failure] = []  # the last failure recorded (to keep its kind when a check re-raises its message)
_SERIAL = [0]
_INVITE_MARK = "→ property that failed:"
_INVITE_LINE = re.compile(r"^→ property that failed:.*$\n?", re.MULTILINE)
_TITLE_ID = re.compile(r"\bExercise (\d\d\.\d+)\b")


def last_failure(exercise: str) -> Failure | None:
    """The last failure recorded for ``exercise`` ("13.1"); None when its check has not failed in this
    process, or passed since. (:func:`outcome` tells the two apart.)"""
    return _OUTCOMES.get(exercise)


def outcome(exercise: str) -> str:
    """``"failed"``, ``"passed"`` or ``"not run"``: the last run of ``exercise``'s check in this process."""
    if exercise not in _OUTCOMES:
        return "not run"
    return "passed" if _OUTCOMES[exercise] is None else "failed"


def forget_outcomes() -> None:
    """Forget every recorded outcome (tests)."""
    _OUTCOMES.clear()
    _LAST.clear()


def _exercise_on_stack() -> tuple[str, str] | None:
    """(exercise id, check name) of the outermost workbook check running now, or None."""
    try:
        from ..hint_text import EXERCISE_OF_CHECK
    except Exception:  # noqa: BLE001 - the record is a help, never a reason for a check to crash
        return None
    found = None
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_name
        module = frame.f_globals.get("__name__", "")
        if name.startswith("check_") and module.startswith("adam8lib.course.checks.ex"):
            exercise = EXERCISE_OF_CHECK.get(name[len("check_"):])
            if exercise is not None:
                found = (exercise, name[len("check_"):])
        frame = frame.f_back
    return found


def _record_pass(title: str) -> None:
    found = _TITLE_ID.search(title) if isinstance(title, str) else None
    if found:
        _OUTCOMES[found.group(1)] = None


def _bind_hint() -> bool:
    """In a notebook (IPython), bind ``hint`` in the learner's namespace when the name is free; True when
    ``hint`` there is the course's."""
    try:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
        if shell is None:
            return False
        from .. import hint

        namespace = shell.user_ns
        if "hint" not in namespace:
            namespace["hint"] = hint
        return namespace.get("hint") is hint
    except Exception:  # noqa: BLE001 - a help, never a reason for a check to crash
        return False


def _hint_call(exercise: str) -> str:
    """The exact line a learner types for a hint: ``hint("NN.k")`` where that name works in their notebook
    (it is bound there when free), else with its import."""
    plain = f'hint("{exercise}")'
    return plain if _bind_hint() else f"from adam8lib.course import hint; {plain}"


def _with_record(message: str, hint: str | None, kind: str | None, what: str | None, got: str = "",
                 expected: str = "", words: str = "") -> str:
    """``message`` with the property line, after recording the failure (unchanged outside a workbook check)."""
    message = _INVITE_LINE.sub("", message).rstrip()
    try:
        where = _exercise_on_stack()
        if where is None:
            return message
        exercise, check = where
        first = next((ln.strip() for ln in message.splitlines() if ln.strip()), "")
        previous = _LAST[0] if _LAST else None
        if kind is None and previous is not None and previous.exercise == exercise and previous.message \
                and first == previous.message:
            # the check re-raises a message it caught (with a better hint): the property stays the same
            kind, what = previous.kind, what or previous.what
            got, expected = got or previous.got, expected or previous.expected
            words = words or previous.words
        _SERIAL[0] += 1
        failure = Failure(exercise=exercise, check=check, kind=kind or "check", what=what or "", message=first,
                          hint=hint, got=got, expected=expected, serial=_SERIAL[0], words=words)
        _OUTCOMES[exercise] = failure
        _LAST[:] = [failure]
        from ..hints import property_words

        line = f"{_INVITE_MARK} {property_words(failure)} · stuck? run  {_hint_call(exercise)}"
        lines = message.splitlines()
        at = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("Hint:")), len(lines))
        return "\n".join(lines[:at] + [line] + lines[at:])  # every "Hint:" line stays after it
    except Exception:  # noqa: BLE001 - the record is a help, never a reason for a check to crash
        return message


def fail(message: str, hint: str | None = None, *, kind: str | None = None, what: str | None = None,
         got: str = "", expected: str = "", prop: str = "") -> NoReturn:
    """Raise an AssertionError ``message`` followed by ``Hint: hint``.

    Inside a workbook check the failure is recorded for ``hint("NN.k")`` (``kind``: the property that failed,
    see :class:`Failure`; ``what``: which call; ``got``/``expected``: the two sides), and a line naming the
    property and the call to type goes before the hint (``prop``: the property in a few words of the check's
    own, for a property the kind alone does not say, e.g. "the state after 10 steps (the parameters are right)")."""
    text = _with_record(str(message), hint, kind, what, got, expected, prop)
    if hint:
        text += f"\nHint: {hint}"
    raise AssertionError(text)


def refail(exc: AssertionError, hint: str, *, kind: str | None = None) -> NoReturn:
    """Fail again on a failure a check caught (the report :func:`call` made of a learner's error), with the
    exercise's own ``hint`` in place of the general one: the report's first line kept, one property line, one Hint,
    and the learner's own error still the cause (its traceback stays visible)."""
    try:
        cause = exc.__cause__
        fail(str(exc).split("\n", 1)[0], hint, kind=kind or ("error" if cause is not None else None),
             got=type(cause).__name__ if cause is not None else "")
    except AssertionError as sharper:
        raise sharper from exc.__cause__


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def require_callable(fn: Any, name: str = "your function") -> Callable:
    """Return ``fn`` if it is callable, else raise TypeError (the check got a wrong argument)."""
    if not callable(fn):
        raise TypeError(f"pass {name} itself (a function) to the check, got {type(fn).__name__}: {fn!r:.80}")
    return fn


def _short(value: Any) -> str:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return f"tensor(shape={tuple(value.shape)}, dtype={value.dtype})"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _library_dirs() -> tuple[str, ...]:
    """Folders whose code is not the learner's: the standard library, installed packages, adam8lib."""
    dirs = {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}  # adam8lib/course
    dirs.add(os.path.dirname(dirs.copy().pop()))  # adam8lib
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(os.path.abspath(path))
    return tuple(sorted(dirs))


def _in_library(filename: str) -> bool:
    if not filename or filename.startswith("<"):
        return False  # an interactive cell ("<ipython-input-...>", "<string>")
    path = os.path.abspath(filename)
    if "site-packages" in path.split(os.sep) or "dist-packages" in path.split(os.sep):
        return True
    return any(path == d or path.startswith(d + os.sep) for d in _library_dirs())


_RAISE_LINE = re.compile(r"\braise\s+NotImplementedError\b")
_STUB_MESSAGE = re.compile(r"^(Exercise \d+\.\d+\b.*)?$")


def is_stub(exc: BaseException) -> bool:
    """Is this NotImplementedError the workbook stub's ``raise NotImplementedError("Exercise NN.k: ...")``?

    Decided by where it was raised. Raised inside torch (or another library) -> not the stub. Raised
    on a line of the learner's code: the stub when that line is a ``raise NotImplementedError``; a
    line such as ``x << 4`` on a float tensor raises torch's NotImplementedError from C++ with the
    learner's line as the innermost Python frame, so the line's text decides. When the source is not
    available, the message does (the stub's is "Exercise NN.k: <name>" or empty)."""
    if not isinstance(exc, NotImplementedError):
        return False
    tb = exc.__traceback__
    if tb is None:
        return bool(_STUB_MESSAGE.match(str(exc)))
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename, lineno = tb.tb_frame.f_code.co_filename, tb.tb_lineno
    if _in_library(filename):
        return False
    line = linecache.getline(filename, lineno, tb.tb_frame.f_globals)
    code = line.split("#", 1)[0]
    if code.strip():
        return bool(_RAISE_LINE.search(code))
    return bool(_STUB_MESSAGE.match(str(exc)))


_DTYPE_WORDS = {"Float": "float32", "Double": "float64", "BFloat16": "bfloat16", "Half": "float16",
                "Byte": "uint8", "Char": "int8", "Int": "int32", "Long": "int64", "Bool": "bool"}


def torch_not_implemented_hint(exc: BaseException) -> str:
    """Learner's terms for torch's NotImplementedError: which operation has no kernel for which dtype."""
    text = str(exc)
    found = re.search(r'"(\w+?)(?:_cpu|_cuda)?(?:_kernel)?"\s+not implemented for\s+\'(\w+)\'', text)
    if found:
        op, dtype = found.group(1), _DTYPE_WORDS.get(found.group(2), found.group(2))
        bitwise = "shift" in op or op.startswith("bitwise") or op.strip("_") in ("and", "or", "xor", "invert")
        if bitwise:
            return (f"torch's `{op}` (a bit operation: <<, >>, &, |, ^) does not exist for {dtype} tensors: bit "
                    "operations work on integer tensors only, so convert the operand to an integer dtype first "
                    "(this is torch's error in your code, not the exercise's stub).")
        return (f"torch has no `{op}` for {dtype} tensors: convert the operand to a dtype that op supports "
                "(this is torch's error in your code, not the exercise's stub).")
    return ("torch raised NotImplementedError inside your code: an operation you used does not exist for these "
            "inputs (usually their dtype or device) — the traceback shows which line. This is not the exercise's "
            "stub: your code ran.")


#: ``may_change`` value for a function whose contract is to write into every argument (a Triton kernel)
ALL_ARGS = "all"


def _tensors_in(value: Any, path: str, depth: int = 0):
    """(path, tensor-or-array) pairs in ``value``: itself, or inside a list/tuple/dict (two levels deep)."""
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    if torch is not None and isinstance(value, torch.Tensor):
        yield path, value
    elif np is not None and isinstance(value, np.ndarray):
        yield path, value
    elif depth < 2 and isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _tensors_in(item, f"{path}[{i}]", depth + 1)
    elif depth < 2 and isinstance(value, Mapping):
        for key, item in value.items():
            yield from _tensors_in(item, f"{path}[{key!r}]", depth + 1)


def _param_names(fn: Callable, n_args: int) -> list[str]:
    """The names of ``fn``'s first ``n_args`` positional parameters (``arg0``, ... where unknown)."""
    import inspect

    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"argument {i + 1}" for i in range(n_args)]


def _snapshot(fn: Callable, args: tuple, kwargs: dict, may_change: Any) -> list:
    """Copies of the tensors and arrays ``fn`` receives and must give back unchanged."""
    if may_change == ALL_ARGS:
        return []
    keep = set(may_change or ())
    names = _param_names(fn, len(args))
    taken = []
    for i, (name, arg) in enumerate(zip(names, args)):
        if i in keep or name in keep:
            continue
        taken.extend(_tensors_in(arg, name))
    for key, arg in kwargs.items():
        if key not in keep:
            taken.extend(_tensors_in(arg, key))
    copies = []
    for path, value in taken:
        try:
            if hasattr(value, "detach"):
                copies.append((path, value, value.detach().clone(), tuple(value.shape), value.dtype))
            else:
                copies.append((path, value, value.copy(), tuple(value.shape), value.dtype))
        except Exception:  # noqa: BLE001 - an argument we cannot copy is simply not watched
            continue
    return copies


_SAME_SIZE_INT = {8: "int64", 4: "int32", 2: "int16", 1: "uint8"}


def _bitwise_same(before: Any, now: Any) -> bool:
    """Same bits (a NaN stays the same NaN, -0.0 is not 0.0)."""
    if hasattr(now, "detach"):
        import torch

        now = now.detach()
        if now.device != before.device or now.dtype != before.dtype:
            return False
        if now.dtype.is_floating_point:
            as_int = getattr(torch, _SAME_SIZE_INT[now.element_size()])
            try:
                return bool(torch.equal(now.contiguous().view(as_int), before.contiguous().view(as_int)))
            except RuntimeError:
                pass
        return bool(torch.equal(now, before))
    import numpy as np

    if now.dtype.kind == "f":
        return bool(np.array_equal(np.ascontiguousarray(now).view(f"u{now.itemsize}"),
                                   np.ascontiguousarray(before).view(f"u{before.itemsize}")))
    return bool(np.array_equal(now, before))


def _require_unchanged(fn: Callable, copies: list) -> None:
    """Fail when the learner's function changed one of its inputs (values, shape or dtype)."""
    for path, value, before, shape, dtype in copies:
        changed = None
        if tuple(value.shape) != shape:
            changed = f"its shape changed from {shape} to {tuple(value.shape)}"
        elif value.dtype != dtype:
            changed = f"its dtype changed from {dtype} to {value.dtype}"
        elif not _bitwise_same(before, value):
            n = int((value != before).sum()) if value.shape == before.shape else value.size
            changed = f"{n} of its values changed"
        if changed:
            fail(f"{_name(fn)} changed its input `{path}` in place: {changed} after the call.", kind="in_place",
                 what=f"{_name(fn)}(...)", got=path,
                 hint=f"your function modified its argument `{path}` in place (an in-place method such as "
                      "add_/mul_/div_/abs_/clamp_, an `x[...] = ...` assignment or `+=` on it, or a view of it that "
                      "you then changed): the caller still needs its input as it was. Work on a new tensor "
                      "(an out-of-place operation, or a .clone() first) and return that.")


def _non_contiguous(args: tuple, kwargs: dict) -> list[str]:
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    found = []
    for i, value in enumerate(list(args) + list(kwargs.values())):
        if isinstance(value, torch.Tensor) and not value.is_contiguous():
            found.append(f"shape {tuple(value.shape)}, strides {value.stride()}")
    return found


def exception_hint(exc: BaseException, args: tuple = (), kwargs: dict | None = None) -> str:
    """A hint naming the learner's mistake behind a common torch error, or ''."""
    text = str(exc)
    strided = _non_contiguous(args, kwargs or {})
    if "view size is not compatible" in text or ("view" in text and "contiguous" in text):
        where = f" (this call passed a non-contiguous tensor: {strided[0]})" if strided else ""
        return ("`.view` needs memory laid out contiguously, and a transposed or sliced tensor is not" + where +
                ": your function only works on contiguous inputs. `.reshape` (or `.contiguous()` first) "
                "handles every layout.")
    if isinstance(exc, (IndexError,)) or "out of bounds" in text or "out of range" in text:
        return ("an index ran past the end of a tensor: check the sizes your code assumes (a ragged last block, "
                "a length that is not a multiple of the block, a first or last element).")
    if "must match the size of tensor" in text or ("shape" in text and "invalid" in text):
        return ("two tensors your code combines have shapes that do not broadcast: check which axis you reduced "
                "(keepdim), and that your code works for every input shape, not only the example's.")
    if "expected scalar type" in text or "can't be cast to the desired output type" in text \
            or "dtype" in text.lower() and "expected" in text.lower():
        return ("two tensors in one operation have different dtypes: decide the dtype each result must have "
                "(the statement says) and convert explicitly.")
    return ""


def call(fn: Callable, *args: Any, may_change: Any = (), **kwargs: Any) -> Any:
    """Call the learner's ``fn``; turn its exceptions into AssertionErrors that say what happened.

    The tensors and NumPy arrays among the arguments (also inside lists, tuples and dicts) must come back
    unchanged, bit for bit, with the same shape and dtype; ``may_change`` names those the exercise's
    contract updates in place (positional indices or parameter names, or ``ALL_ARGS``)."""
    require_callable(fn)
    copies = _snapshot(fn, args, kwargs, may_change)
    try:
        result = fn(*args, **kwargs)
    except NotImplementedError as exc:
        if is_stub(exc):
            raise AssertionError(_with_record(
                f"{_name(fn)} is not implemented yet: replace the `raise NotImplementedError(...)` line "
                "in the exercise cell with your code, run that cell, then run this check again.",
                None, "stub", f"{_name(fn)}(...)")
            ) from exc
        inputs = ", ".join([_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in kwargs.items()])
        hint = torch_not_implemented_hint(exc)
        raise AssertionError(_with_record(f"{_name(fn)}({inputs}) raised NotImplementedError inside torch: {exc}",
                                          hint, "error", f"{_name(fn)}({inputs})", got="NotImplementedError")
                             + f"\nHint: {hint}") from exc
    except AssertionError:
        raise
    except Exception as exc:
        inputs = ", ".join([_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in kwargs.items()])
        hint = exception_hint(exc, args, kwargs)
        raise AssertionError(_with_record(f"{_name(fn)}({inputs}) raised {type(exc).__name__}: {exc}", hint, "error",
                                          f"{_name(fn)}({inputs})", got=type(exc).__name__)
                             + (f"\nHint: {hint}" if hint else "")) from exc
    _require_unchanged(fn, copies)
    return result


def _to_tensor(value: Any):
    """``value`` as a torch tensor if it is a tensor or a NumPy array, else None."""
    torch = sys.modules.get("torch")  # not imported yet -> value cannot be a tensor
    if torch is not None and isinstance(value, torch.Tensor):
        return value
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        import torch

        return torch.from_numpy(value)
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def _kind_of(value: Any) -> str:
    """A learner-facing name for what ``value`` is."""
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "a bool"
    if torch is not None and isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if np is not None and isinstance(value, np.ndarray):
        return f"a NumPy array ({value.dtype}, shape {value.shape})"
    if np is not None and isinstance(value, np.generic):
        return f"a NumPy scalar ({type(value).__name__})"
    if isinstance(value, numbers.Number):
        return f"a Python {type(value).__name__}"
    return f"a {type(value).__name__}"


def require_tensor(value: Any, what: str, *, dtype: Any = None, ndim: int | None = None,
                   shape: tuple | None = None) -> Any:
    """Fail unless ``value`` is a torch tensor (of ``dtype``, with ``ndim`` dimensions / ``shape``)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        kind = _kind_of(value)
        if _is_number(value) or (sys.modules.get("numpy") is not None
                                 and isinstance(value, sys.modules["numpy"].generic)):
            why = ("you turned the tensor into a plain number (`.item()`, `float(...)` or `int(...)`): "
                   "keep it a tensor, as the statement asks (a 0-d tensor holds one number).")
        elif isinstance(value, (list, tuple)):
            why = "you returned a Python list/tuple of values: return one torch tensor."
        elif value is None:
            why = "you returned None: end the function with a `return` of the tensor."
        else:
            why = f"you returned {kind}: the statement asks for a torch tensor."
        fail(f"{what} is {kind}, expected a torch tensor.", hint=why, kind="none" if value is None else "type",
             what=what, got=kind, expected="a torch tensor")
    if dtype is not None and value.dtype != dtype:
        fail(f"{what} has dtype {value.dtype}, expected {dtype}.",
             hint=f"your {what.split(':')[-1].strip()} is {value.dtype}: the statement asks for {dtype}.",
             kind="dtype", what=what, got=str(value.dtype), expected=str(dtype))
    if ndim is not None and value.dim() != ndim:
        extra = (" — a 0-d tensor (shape ()), not one with a length-1 dimension (keepdim / reshape(1) / [x])"
                 if ndim == 0 and value.numel() == 1 else "")
        fail(f"{what} has shape {tuple(value.shape)}, expected {ndim} dimension(s).",
             hint=f"the dimensions of your result are off: it should have {ndim}{extra}.",
             kind="shape", what=what, got=str(tuple(value.shape)), expected=f"{ndim} dimension(s)")
    if shape is not None and tuple(value.shape) != tuple(shape):
        fail(f"{what} has shape {tuple(value.shape)}, expected {tuple(shape)}.",
             hint=f"the shape of your result is off: {tuple(value.shape)} instead of {tuple(shape)}.",
             kind="shape", what=what, got=str(tuple(value.shape)), expected=str(tuple(shape)))
    return value


def require_type(value: Any, expected: type | tuple, what: str) -> Any:
    """Fail unless ``value`` is an instance of ``expected`` (e.g. a tuple, not a list)."""
    if isinstance(value, expected):
        return value
    names = " or ".join(t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,)))
    kind = _kind_of(value)
    swap = ""
    if isinstance(value, list) and tuple in (expected if isinstance(expected, tuple) else (expected,)):
        swap = " `[a, b]` is a list and `(a, b)` a tuple: different types, and a caller may depend on which."
    fail(f"{what} is {kind}, expected a {names}.",
         hint=f"the type of your result is off: you returned {kind} where the statement asks for a {names}.{swap}",
         kind="none" if value is None else "type", what=what, got=kind, expected=f"a {names}")


def assert_close(
    actual: Any,
    expected: Any,
    *,
    hint: str | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    what: str = "your result",
    dtype: Any = None,
    check_dtype: bool = False,
) -> None:
    """Assert ``actual`` ≈ ``expected`` (``|a-e| <= atol + rtol*|e|``, NaNs must match).

    ``expected`` may be a tensor, a NumPy array, a number, or a tuple/list/dict of those
    (compared item by item). ``dtype`` requires that dtype of a tensor result;
    ``check_dtype=True`` requires the dtype of ``expected``.
    """
    if actual is None and expected is not None:
        fail(f"{what} is None.", hint="did you forget to `return` the result?", kind="none", what=what, got="None")
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            fail(f"{what} should be a dict, got {type(actual).__name__}.", hint, kind="type", what=what,
                 got=_kind_of(actual), expected="a dict")
        if set(actual) != set(expected):
            fail(f"{what} has keys {sorted(map(str, actual))}, expected {sorted(map(str, expected))}.", hint,
                 kind="keys", what=what, got=str(sorted(map(str, actual))), expected=str(sorted(map(str, expected))))
        for key in expected:
            assert_close(actual[key], expected[key], hint=hint, rtol=rtol, atol=atol, what=f"{what}[{key!r}]",
                         dtype=dtype, check_dtype=check_dtype)
        return
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)):
            fail(f"{what} should be a {type(expected).__name__} of {len(expected)} items, "
                 f"got {type(actual).__name__}.", hint, kind="type", what=what, got=_kind_of(actual),
                 expected=f"a {type(expected).__name__} of {len(expected)} items")
        if len(actual) != len(expected):
            fail(f"{what} has {len(actual)} items, expected {len(expected)}.", hint, kind="type", what=what,
                 got=f"{len(actual)} items", expected=f"{len(expected)} items")
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, hint=hint, rtol=rtol, atol=atol, what=f"{what}[{i}]", dtype=dtype,
                         check_dtype=check_dtype)
        return

    exp_t = _to_tensor(expected)
    if exp_t is None:
        if not _is_number(expected):
            raise TypeError(f"assert_close cannot compare with {type(expected).__name__}; use assert_equal")
        act_t = _to_tensor(actual)
        if act_t is not None and act_t.numel() == 1:
            actual = act_t.item()
        if not _is_number(actual):
            fail(f"{what} should be a number, got {type(actual).__name__}: {_short(actual)}.", hint,
                 kind="none" if actual is None else "type", what=what, got=_kind_of(actual), expected="a number")
        a, e = complex(actual), complex(expected)
        if a.imag or e.imag:
            ok = abs(a - e) <= atol + rtol * abs(e)
        else:
            a, e = a.real, e.real
            ok = (math.isnan(a) and math.isnan(e)) or a == e or abs(a - e) <= atol + rtol * abs(e)
        if not ok:
            fail(f"{what} = {actual!r}, expected {expected!r} (difference {abs(a - e):.3g}).", hint,
                 kind="nonfinite" if isinstance(a, float) and not math.isfinite(a) else "values", what=what,
                 got=repr(actual), expected=repr(expected))
        return

    import torch

    act_t = _to_tensor(actual)
    if act_t is None:
        fail(f"{what} should be a tensor, got {type(actual).__name__}: {_short(actual)}.", hint, kind="type",
             what=what, got=_kind_of(actual), expected="a tensor")
    if tuple(act_t.shape) != tuple(exp_t.shape):
        fail(f"{what} has shape {tuple(act_t.shape)}, expected {tuple(exp_t.shape)}.", hint, kind="shape",
             what=what, got=str(tuple(act_t.shape)), expected=str(tuple(exp_t.shape)))
    want_dtype = exp_t.dtype if check_dtype else dtype
    if want_dtype is not None and act_t.dtype != want_dtype:
        fail(f"{what} has dtype {act_t.dtype}, expected {want_dtype}.", hint, kind="dtype", what=what,
             got=str(act_t.dtype), expected=str(want_dtype))
    if exp_t.numel() == 0:
        return
    a = act_t.detach().cpu()
    e = exp_t.detach().cpu()
    if a.is_complex() or e.is_complex():
        a, e = a.to(torch.complex128), e.to(torch.complex128)
    else:
        a, e = a.to(torch.float64), e.to(torch.float64)
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if not torch.equal(nan_a, nan_e):
        idx = torch.nonzero(nan_a != nan_e)[0].tolist()
        fail(f"{what} is {a[tuple(idx)].item()} at index {tuple(idx)}, expected {e[tuple(idx)].item()} "
             "(NaN where there should be none, or the other way round).", hint, kind="nonfinite", what=what,
             got=f"{a[tuple(idx)].item()} at index {tuple(idx)}", expected=f"{e[tuple(idx)].item()}")
    a = torch.where(nan_a, torch.zeros_like(a), a)
    e = torch.where(nan_e, torch.zeros_like(e), e)
    same = a == e  # equal infinities are fine
    diff = torch.where(same, torch.zeros_like(a.real if a.is_complex() else a), (a - e).abs())
    bound = atol + rtol * e.abs()
    bad = diff > bound
    if bool(bad.any()):
        excess = torch.where(bad, diff - bound, torch.full_like(diff, -1.0))
        flat = int(torch.argmax(excess.reshape(-1)))
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(e.shape))) if e.dim() else ()
        n_bad, n = int(bad.sum()), bad.numel()
        fail(
            f"{what} differs from the reference at {n_bad} of {n} elements; worst at index {idx}: "
            f"got {a[idx].item():.6g}, expected {e[idx].item():.6g} (tolerance rtol={rtol:g}, atol={atol:g}).",
            hint, kind="nonfinite" if not math.isfinite(a[idx].real.item() if a.is_complex() else a[idx].item())
            else "values", what=what, got=f"{a[idx].item():.6g} at index {idx} ({n_bad} of {n} elements wrong)",
            expected=f"{e[idx].item():.6g}",
        )


def assert_equal(actual: Any, expected: Any, *, hint: str | None = None, what: str = "your result") -> None:
    """Assert exact equality; tensors/arrays element by element (shape and values, dtype-agnostic)."""
    if actual is None and expected is not None:
        fail(f"{what} is None.", hint="did you forget to `return` the result?", kind="none", what=what, got="None")
    exp_t = _to_tensor(expected)
    if exp_t is not None:
        act_t = _to_tensor(actual)
        if act_t is None:
            fail(f"{what} should be a tensor, got {type(actual).__name__}: {_short(actual)}.", hint, kind="type",
                 what=what, got=_kind_of(actual), expected="a tensor")
        if tuple(act_t.shape) != tuple(exp_t.shape):
            fail(f"{what} has shape {tuple(act_t.shape)}, expected {tuple(exp_t.shape)}.", hint, kind="shape",
                 what=what, got=str(tuple(act_t.shape)), expected=str(tuple(exp_t.shape)))
        import torch

        a, e = act_t.detach().cpu(), exp_t.detach().cpu()
        if a.dtype != e.dtype:
            a, e = a.to(torch.float64), e.to(torch.float64)
        neq = a != e
        if bool(neq.any()):
            idx = tuple(int(i) for i in torch.nonzero(neq)[0]) if neq.dim() else ()
            fail(f"{what} differs at {int(neq.sum())} of {neq.numel()} elements; first at index {idx}: "
                 f"got {a[idx].item()!r}, expected {e[idx].item()!r}.", hint, kind="values", what=what,
                 got=f"{a[idx].item()!r} at index {idx} ({int(neq.sum())} of {neq.numel()} elements wrong)",
                 expected=f"{e[idx].item()!r}")
        return
    if isinstance(expected, Sequence) and not isinstance(expected, str) and isinstance(actual, Sequence) \
            and not isinstance(actual, str) and len(actual) == len(expected):
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_equal(a, e, hint=hint, what=f"{what}[{i}]")
        return
    if actual != expected:
        fail(f"{what} = {_short(actual)}, expected {_short(expected)}.", hint,
             kind="type" if type(actual) is not type(expected) and not (_is_number(actual) and _is_number(expected))
             else "values", what=what, got=_short(actual), expected=_short(expected))


_bind_hint()  # a workbook's first check cell imports the checks: from then on hint("NN.k") works there
