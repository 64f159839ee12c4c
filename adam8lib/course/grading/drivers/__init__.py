"""Course-written drivers: what a check runs on a learner's class or function, in the learner's process.

Some exercises cannot be checked by calling the learner's function on plain data: an optimizer class is
built and stepped (13.1), a hook is registered on a model and fires during backward (14.1), a function reads
a :class:`~adam8lib.MemoryTracker` (14.2) or is handed a model (09.2-09.4). A **driver** is a course function that does that work — it builds the
model or the parameters from the plain data it is given (a seed, a configuration, the initial tensors and
every step's gradients), runs the learner's object on them, and returns **plain data only** (numbers,
strings, tensors: :mod:`adam8lib.course.grading.plain`). The check keeps everything that decides the
score — the scenario it sends, its own reference recomputed from that scenario, the comparisons, the
hints — and reads only what the driver returned::

    from adam8lib.course.grading.drivers import drive
    from adam8lib.course.grading.drivers import ex13 as drivers

    ran = drive(cls, drivers.step_optimizer, {"lr": 1e-2}, params, grads)   # plain data back
    ours = _reference(params, grads)                                        # the check's own run
    compare(ran["params"], ours)

:func:`drive` runs ``driver(target, *args, **kwargs)`` where ``target`` is: in a learner's notebook, in the
workbook tests and in ``--one-process`` grading, the learner's own object (the driver runs right there and
its result is passed through :func:`~adam8lib.course.grading.plain.encode` / ``decode``, so the check sees
the same plain data as when graded); in the gradebook's check process, a
:class:`~adam8lib.course.grading.checker.LearnerFunction` (the learner's object lives in the sandboxed
learner process): the driver is then named (``module:function``) in a ``("drive", …)`` request, and the
learner process runs it there — only drivers of this package, marked with :func:`driver`, can be named.

What a driver returns is the learner's process's word, so nothing it returns is trusted as anything but
the learner's answer: an object of the learner's never reaches the check (a tensor subclass crosses as a
plain tensor, an ``int`` subclass as an ``int``), and a driver the learner's code replaced or a table it
emptied changes only what the learner's own answer is, never what it is compared with.

Exceptions: a learner exception raised while a driver runs reaches the check as an exception of the same
builtin kind and message (the workbook stub's ``raise NotImplementedError`` stays recognisable). A driver
that must report an exception *among* other results (a hook that raised during the second backward pass)
records it with :func:`attempt` and the check raises it again at that point with :func:`reraise`.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from .. import plain

__all__ = ["driver", "remote", "drive", "resolve", "name_of", "attempt", "reraise", "described", "DRIVER_MODULES"]

#: the modules that hold drivers (imported by the learner process before any learner code runs)
DRIVER_MODULES = (f"{__name__}.ex07", f"{__name__}.ex08", f"{__name__}.ex09", f"{__name__}.ex10",
                  f"{__name__}.ex13", f"{__name__}.ex14")
_MARK = "__course_driver__"

#: exceptions a driver recorded with :func:`attempt`, by key, in this process: when the check runs in the same
#: process (a notebook, a test) :func:`reraise` raises the original, with its traceback into the learner's code
_ORIGINALS: dict[str, BaseException] = {}


def driver(fn: Callable) -> Callable:
    """Mark ``fn`` as a driver (only marked functions of this package can be named in a drive request)."""
    setattr(fn, _MARK, True)
    return fn


def name_of(fn: Callable) -> str:
    """``module:function`` of a driver (what a drive request names)."""
    if not getattr(fn, _MARK, False):
        raise ValueError(f"{fn!r} is not a course driver")
    return f"{fn.__module__}:{fn.__qualname__}"


def resolve(name: str) -> Callable:
    """The driver named ``module:function`` (a module of this package, a function marked with :func:`driver`)."""
    module, _, qualname = str(name).partition(":")
    if not module.startswith(__name__ + ".") or not qualname.isidentifier():
        raise ValueError(f"{name!r} is not a course driver")
    fn = getattr(importlib.import_module(module), qualname, None)
    if fn is None or not getattr(fn, _MARK, False):
        raise ValueError(f"{name!r} is not a course driver")
    return fn


#: the check process's stand-ins for a learner's object (:class:`~adam8lib.course.grading.checker.LearnerFunction`,
#: registered by :func:`remote` where the check process defines it, whatever its module is called there)
_REMOTE: list[type] = []


def remote(cls: type) -> type:
    """Register ``cls`` as a stand-in for an object living in the learner process: :func:`drive` sends its driver
    there (``target._learner.drive(target, name, args, kwargs)``)."""
    _REMOTE.append(cls)
    return cls


def drive(target: Any, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Run the driver ``fn`` on the learner's ``target`` with plain ``args`` / ``kwargs``: plain data back."""
    if _REMOTE and isinstance(target, tuple(_REMOTE)):
        return target._learner.drive(target, name_of(fn), args, kwargs)
    name_of(fn)  # a course driver, here too
    _ORIGINALS.clear()
    return plain.decode(plain.encode(fn(target, *args, **kwargs)))


def attempt(work: Callable[[], Any]) -> tuple[Any, dict | None]:
    """``(work(), None)``, or ``(None, record)`` when it raised an ``Exception``: the record is plain data
    (the exception's type names, message, whether it is the workbook stub) for :func:`reraise`."""
    try:
        return work(), None
    except Exception as exc:  # noqa: BLE001 - the learner's code raised: the check says so, where it happened
        key = f"{id(exc):x}.{len(_ORIGINALS)}"
        _ORIGINALS[key] = exc
        names = [type(exc).__name__] + [c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins"]
        try:
            text = str(exc)[:4000]
        except Exception:  # noqa: BLE001 - a learner's __str__ may raise
            text = "<unprintable>"
        return None, {"names": names, "text": text, "key": key, "stub": _is_stub(exc)}


def _is_stub(exc: BaseException) -> bool:
    """Whether ``exc`` is the workbook stub's own ``raise NotImplementedError`` (decided where it was raised)."""
    try:
        from ...checks._common import is_stub

        return bool(is_stub(exc))
    except Exception:  # noqa: BLE001 - a hostile exception, or the checks not importable here: not the stub
        return False


_STUB_FILE = "<the learner's exercise cell>"


def _raise_stub(message: str) -> None:
    # a NotImplementedError raised on a "raise NotImplementedError" line of code that is not a library's: what
    # the checks' is_stub recognises as the workbook stub (decided in the learner process)
    import builtins
    import linecache

    line = "raise NotImplementedError(__message__)"
    linecache.cache[_STUB_FILE] = (len(line) + 1, None, [line + "\n"], _STUB_FILE)
    exec(compile(line, _STUB_FILE, "exec"), {"__message__": message, "__builtins__": builtins})


_KINDS = {c.__name__: c for c in (ValueError, TypeError, IndexError, KeyError, RuntimeError, AssertionError,
                                  ZeroDivisionError, OverflowError, AttributeError, NameError, LookupError,
                                  ArithmeticError, NotImplementedError, RecursionError, MemoryError,
                                  UnboundLocalError, FloatingPointError)}  # fmt: skip


def reraise(record: dict) -> None:
    """Raise the exception :func:`attempt` recorded: the original where it was recorded in this process,
    else a builtin exception of its kind with its message (the learner's own class never crosses)."""
    original = _ORIGINALS.pop(str(record.get("key")), None)
    if original is not None:
        raise original
    names = [str(n) for n in record.get("names", [])] or ["Exception"]
    text = str(record.get("text", ""))
    if record.get("stub") is True:
        _raise_stub(text)
    kind = next((_KINDS[n] for n in names[1:] if n in _KINDS), None)
    if kind is None:
        raise RuntimeError(f"{names[0]}: {text}")
    raise kind(text if names[0] == kind.__name__ else f"{names[0]}: {text}")


def described(value: Any) -> dict:
    """``{"plain": value}`` when ``value`` can cross as plain data, else ``{"kind": its type's name, "repr": …}``
    (a learner's object the check must describe, never handle)."""
    try:
        plain.encode(value)
        return {"plain": value}
    except plain.NotPlainData:
        pass
    try:
        shown = repr(value)[:200]
    except Exception:  # noqa: BLE001 - a learner's __repr__ may raise
        shown = f"<{type(value).__name__}>"
    return {"kind": type(value).__name__, "repr": shown}
