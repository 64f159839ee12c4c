"""What a grading child (:mod:`adam8lib.course.grading.runner`) installs before any learner code runs.

In the workbooks graded by a check process of their own (:mod:`adam8lib.course.grading.checker`)
the guard runs in the learner process, a second line of defence: there it reports course
references used and tampering. In the others the learner's exercise cells and the checks share
one process, so the guard keeps what decides a grade (the checks' locals — the expected values —, the runner's result sender and its token, the
guard's own state) out of the learner's reach, and reports what it sees on a pipe of its own, the
*alarm channel*, that only the gradebook reads (written at once, it cannot be taken back):

* an **audit hook** (PEP 578; it cannot be removed from Python) *blocks* — raises RuntimeError and
  reports — every way Python code obtains a stack frame or walks the heap: ``sys._getframe`` /
  ``sys._current_frames``, a traceback's ``tb_frame``, a generator's or coroutine's frame,
  ``gc.get_objects`` / ``get_referrers`` / ``get_referents``, ``sys.settrace`` / ``setprofile``,
  ``sys.addaudithook``, new code or function objects, a function's ``__code__`` replaced,
  ``ctypes``, ``/proc/.../mem`` (and other ``/proc`` files), code compiled under a library's file
  name — when the code asking is the learner's. Library code (the course's, torch's, the standard
  library's, found by its module and file) may do so, except the modules that hand frames to
  their caller (``inspect``, ``traceback``, ``logging``, ``asyncio``, ``ctypes``, …), which count as
  their caller. ``sys.gettrace`` / ``getprofile`` and ``signal.signal`` (a handler receives the
  interrupted frame) are wrapped the same way;
* while a check runs, a **profile hook** reports (a) a call of a *course reference* — a function
  or class of the checks' modules, an ``adam8lib`` function the checks import, or an implementation
  the manifest names, not among the manifest's ``library_imports`` — made from learner code,
  whatever name or import path it was reached by, and (b) learner-written ``__torch_function__`` /
  ``__torch_dispatch__`` code running (a TorchFunctionMode, a TorchDispatchMode or a tensor
  subclass that changes what the checks' comparisons see);
* :meth:`Guard.modes` lists torch function / dispatch modes written by the learner that are still
  pushed (checked after every cell and around every check), and :func:`references` finds course
  references a learner function *is*, wraps or names (closures, defaults, globals, modules).

Lines on the alarm channel: ``alarm <text>`` (tampering: the workbook scores 0), ``ref <exercise>
<text>`` (a course reference used: scored as the instructor configures) and, last, ``end
<token>`` written by the runner when it finishes (without it, learner code closed the channel).
The process is also made non-dumpable, so no other process of the learner can ptrace it or
read its memory.
"""

from __future__ import annotations

import _signal
import os
import sys
import threading
import types

__all__ = ["Guard", "install", "references", "FRAME_ATTRS", "DISPENSERS"]

#: Attributes that hand out a frame (audited by CPython as ``object.__getattr__``).
FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
#: Audit events that are refused to learner code.
BLOCKED = frozenset({"sys._getframe", "sys._current_frames", "sys._getframemodulename", "gc.get_objects",
                     "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile", "sys.addaudithook",
                     "code.__new__", "function.__new__", "cpython.PyInterpreterState_Clear",
                     "cpython._PySys_ClearAuditHooks", "sys.monitoring.register_callback"})  # fmt: skip
#: Library modules that give frames (or raw memory) to their caller: their calls count as the caller's.
DISPENSERS = ("inspect", "traceback", "logging", "asyncio", "ctypes", "bdb", "pdb", "signal", "cgitb", "pydoc")


class Guard:
    """The runner's handle (kept in the runner's locals only)."""

    def __init__(self, state):
        self._state = state

    def alarm(self, text: str) -> None:
        self._state["alarm"](f"alarm {text}")

    def ref(self, exercise: str, text: str) -> None:
        self._state["alarm"](f"ref {exercise} {text}")

    def profile(self, exercise: str | None) -> None:
        """Watch a check (``exercise``) with the profile hook, or stop watching (None)."""
        self._state["set_profile"](exercise)

    def modes(self) -> list[str]:
        return self._state["modes"]()

    def trust(self, code: types.CodeType) -> None:
        """The runner's own compiled code (a check call) counts as library code."""
        self._state["trust"](code)

    def end(self, token: str) -> None:
        self._state["alarm"](f"end {token}")


def _realpath(path: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return path


def install(alarm_fd: int, *, roots: list[str], forbidden: dict, allowed: list) -> Guard:
    """Install the hooks; ``forbidden`` maps course references (functions, classes) to their names,
    ``allowed`` lists library functions whose callees are not the learner's calls."""
    getframe, write, modules, ident = sys._getframe, os.write, sys.modules, threading.get_ident
    setprofile, real_gettrace, real_getprofile, real_signal = sys.setprofile, sys.gettrace, sys.getprofile, _signal.signal
    root_prefixes = tuple(sorted({_realpath(r).rstrip(os.sep) + os.sep for r in roots if r}))
    cache: dict[int, tuple] = {}
    trusted_ids: dict[int, object] = {}
    busy: set[int] = set()
    broken: list[str] = []
    sent: set[str] = set()

    def alarm(line: str) -> None:
        line = " ".join(line.split())[:500]
        if line in sent or (len(sent) > 200 and not line.startswith("end ")):
            return  # said already (a learner's torch mode reports every operation)
        sent.add(line)
        data = (line + "\n").encode("utf-8", "replace")
        try:
            write(alarm_fd, data)
        except OSError as exc:
            broken.append(str(exc))

    def trusted(frame) -> bool:
        code = frame.f_code
        key = id(code)
        hit = cache.get(key)
        if hit is not None and hit[0] is code:
            return hit[1] and frame.f_globals is hit[2]
        if key in trusted_ids and trusted_ids[key] is code:
            return True
        ok, g = False, frame.f_globals
        name = g.get("__name__") if type(g) is dict else None
        module = modules.get(name) if type(name) is str else None
        if module is not None and getattr(module, "__dict__", None) is g:
            filename = code.co_filename
            if filename.startswith("<frozen "):
                ok = filename == f"<frozen {name}>" or name.startswith(("importlib", "_frozen_importlib"))
            else:
                declared = g.get("__file__")
                real = _realpath(filename)
                ok = (type(declared) is str and real == _realpath(declared) and real.startswith(root_prefixes))
        cache[key] = (code, ok, g)
        return ok

    def module_of(frame) -> str:
        name = frame.f_globals.get("__name__")
        return name if type(name) is str else ""

    def learner_asking(depth: int):
        """The first frame outside the frame dispensers, if it is not library code (else None)."""
        frame = getframe(depth)
        while frame is not None and trusted(frame) and module_of(frame).split(".")[0] in DISPENSERS:
            if frame.f_code.co_name == "findCaller" and module_of(frame) == "logging":
                return None  # logging reads the caller's file and line, and hands back only those
            frame = frame.f_back
        if frame is None or trusted(frame):
            return None
        return frame

    def where(frame) -> str:
        return f"{frame.f_code.co_filename}:{frame.f_lineno}"

    def refuse(what: str, depth: int) -> None:
        """Alarm and raise when the learner's code is the one asking (called from a hook or wrapper)."""
        me = ident()
        if me in busy:
            return
        busy.add(me)
        try:
            frame = learner_asking(depth + 1)
            if frame is None:
                return
            place = where(frame)
        finally:
            busy.discard(me)
        alarm(f"alarm learner code {what} ({place})")
        raise RuntimeError(f"grading: learner code may not {what}")

    def hook(event: str, args: tuple) -> None:
        if ident() in busy:
            return
        if event in BLOCKED:
            refuse(f"call {event}", 2)
        elif event == "object.__getattr__":
            if len(args) > 1 and args[1] in FRAME_ATTRS:
                refuse(f"read {args[1]} (a stack frame)", 2)
        elif event == "object.__setattr__":
            if len(args) > 1 and args[1] in ("__code__", "__globals__", "__closure__"):
                refuse(f"replace a function's {args[1]}", 2)
        elif event.startswith("ctypes."):
            refuse(f"use ctypes ({event})", 2)
        elif event == "open":
            path = args[0] if args else None
            if isinstance(path, bytes):
                path = path.decode("utf-8", "replace")
            if isinstance(path, str):
                real = _realpath(path)
                if real.startswith("/proc/") or os.path.basename(real) in ("mem", "pagemap", "kcore"):
                    refuse(f"open {path}", 2)
            elif isinstance(path, int):
                pass
        elif event == "compile":
            filename = args[1] if len(args) > 1 else None
            if isinstance(filename, bytes):
                filename = filename.decode("utf-8", "replace")
            if isinstance(filename, str) and (filename.startswith("<frozen") or
                                              _realpath(filename).startswith(root_prefixes)):  # fmt: skip
                refuse(f"compile code under the file name {filename}", 2)

    def gettrace():
        refuse("call sys.gettrace", 2)
        return real_gettrace()

    def getprofile():
        refuse("call sys.getprofile", 2)
        return real_getprofile()

    def signal(signalnum, handler):
        if callable(handler):
            refuse("install a signal handler (it would receive the interrupted frame)", 2)
        return real_signal(signalnum, handler)

    # the course references by the identity of their code (whatever name they are reached by)
    forbidden_codes: dict[int, str] = {}
    keep = []
    for obj, name in forbidden.items():
        for code in _codes_of(obj):
            forbidden_codes[id(code)] = name
            keep.append(code)
    allowed_codes = frozenset(id(c) for obj in allowed for c in _codes_of(obj))
    keep.extend(c for obj in allowed for c in _codes_of(obj))
    forbidden_view = types.MappingProxyType(forbidden_codes)
    watching: list = [None]

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        name = forbidden_view.get(id(code))
        if name is None:
            if code.co_name in ("__torch_function__", "__torch_dispatch__") and not trusted(frame):
                alarm(f"alarm learner code ran {code.co_name} while a check ran (a torch mode or tensor subclass "
                      f"that changes what the check sees; {where(frame)})")
            return
        caller = frame.f_back  # the direct caller: a library the learner called may use references itself
        if caller is None or id(caller.f_code) in allowed_codes or id(caller.f_code) in forbidden_view:
            return
        if not trusted(caller):
            alarm(f"ref {watching[0]} learner code called the course reference {name} ({where(caller)})")

    def set_profile(exercise):
        watching[0] = exercise
        setprofile(profile if exercise is not None else None)

    def modes() -> list[str]:
        torch = modules.get("torch")
        found = []
        if torch is None:
            return found
        C = torch._C
        for length, at, kind in ((C._len_torch_function_stack, C._get_function_stack_at, "TorchFunctionMode"),
                                 (C._len_torch_dispatch_stack, C._get_dispatch_stack_at, "TorchDispatchMode")):
            for i in range(length()):
                mode = at(i)
                handler = getattr(type(mode), "__torch_function__" if kind == "TorchFunctionMode" else "__torch_dispatch__", None)
                codes = _codes_of(handler)
                if not codes or any(not _code_trusted(c, root_prefixes) for c in codes):
                    found.append(f"a {kind} of the learner's ({type(mode).__name__}) is active")
        return found

    def trust(code):
        for c in _walk_codes(code):
            trusted_ids[id(c)] = c

    # no other process of this user may ptrace this one or read its memory
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass
    sys.gettrace, sys.getprofile, _signal.signal = gettrace, getprofile, signal
    sys.addaudithook(hook)
    state = {"alarm": alarm, "set_profile": set_profile, "modes": modes, "trust": trust, "keep": keep}
    return Guard(types.MappingProxyType(state))


def _code_trusted(code, root_prefixes) -> bool:
    filename = code.co_filename
    return not filename.startswith("<") and _realpath(filename).startswith(root_prefixes)


def _walk_codes(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _walk_codes(const)


def _codes_of(obj) -> list:
    """The code objects that run when ``obj`` (a function, method, class, property, partial) is used."""
    seen, out, stack = set(), [], [obj]
    while stack:
        item = stack.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, types.FunctionType) and getattr(item, "__wrapped__", None) is not None:
            stack.append(item.__wrapped__)  # a decorator's wrapper code is shared by everything it decorates
        elif isinstance(item, types.FunctionType):
            out.append(item.__code__)
        elif isinstance(item, (types.MethodType, staticmethod, classmethod)):
            stack.append(item.__func__)
        elif isinstance(item, property):
            stack.extend([item.fget, item.fset, item.fdel])
        elif isinstance(item, type):
            stack.extend(v for v in vars(item).values() if isinstance(v, (types.FunctionType, staticmethod,
                                                                         classmethod, property)))  # fmt: skip
        elif hasattr(item, "__wrapped__"):
            stack.append(getattr(item, "__wrapped__", None))
    return out


def references(value, forbidden: dict, learner_code, limit: int = 2000) -> list[str]:
    """Names of course references that ``value`` (a learner function, class or object) is, wraps or
    names: reached through ``__wrapped__``, ``functools.partial``, closures, defaults, the globals
    its code names (and attributes of modules there), its class's methods, recursively through
    the learner's own functions. ``learner_code(code)`` tells a learner's code from a library's."""
    found, seen, stack = [], set(), [(value, 0)]
    by_code = {id(c): name for obj, name in forbidden.items() for c in _codes_of(obj)}
    by_id = {id(obj): name for obj, name in forbidden.items()}

    def note(name):
        if name not in found:
            found.append(name)

    while stack and len(seen) < limit:
        item, depth = stack.pop()
        if id(item) in seen or depth > 8:
            continue
        seen.add(id(item))
        if id(item) in by_id:
            note(by_id[id(item)])
            continue
        if isinstance(item, types.FunctionType):
            if id(item.__code__) in by_code:
                note(by_code[id(item.__code__)])
                continue
            if not learner_code(item.__code__):
                continue
            stack.extend((c.cell_contents, depth + 1) for c in (item.__closure__ or ()) if _filled(c))
            stack.extend((d, depth + 1) for d in (item.__defaults__ or ()))
            stack.extend((d, depth + 1) for d in (item.__kwdefaults__ or {}).values())
            names = set()
            for code in _walk_codes(item.__code__):
                names.update(code.co_names)
            g = item.__globals__
            builtins_ns = g.get("__builtins__")
            for n in names:
                if n in g:
                    target = g[n]
                elif isinstance(builtins_ns, dict) and n in builtins_ns:
                    continue
                else:
                    continue
                stack.append((target, depth + 1))
                if isinstance(target, types.ModuleType):
                    for attr in names:
                        sub = getattr(target, attr, None) if attr in vars(target) else None
                        if sub is not None:
                            stack.append((sub, depth + 1))
                            if isinstance(sub, types.ModuleType):
                                for attr2 in names:
                                    if attr2 in vars(sub):
                                        stack.append((vars(sub)[attr2], depth + 2))
        elif isinstance(item, (types.MethodType, staticmethod, classmethod)):
            stack.append((item.__func__, depth + 1))
        elif isinstance(item, property):
            stack.extend((f, depth + 1) for f in (item.fget, item.fset, item.fdel) if f is not None)
        elif isinstance(item, type):
            for base in item.__mro__[1:]:
                if id(base) in by_id:
                    note(by_id[id(base)])
            if any(learner_code(c) for c in _codes_of(item)) or not getattr(item, "__module__", "").startswith(
                    ("torch", "builtins", "numpy", "adam8lib", "transformers")):  # fmt: skip
                stack.extend((v, depth + 1) for v in vars(item).values())
        elif isinstance(item, (tuple, list, set, frozenset)):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif type(item).__name__ == "partial" and hasattr(item, "func"):
            stack.append((item.func, depth + 1))
            stack.extend((a, depth + 1) for a in getattr(item, "args", ()))
            stack.extend((a, depth + 1) for a in (getattr(item, "keywords", None) or {}).values())
        elif isinstance(item, types.ModuleType):
            if item.__name__.startswith("adam8lib.course.checks"):
                note(f"the module {item.__name__}")
        else:
            wrapped = getattr(type(item), "__call__", None)
            if wrapped is not None and isinstance(wrapped, types.FunctionType) and learner_code(wrapped.__code__):
                stack.append((wrapped, depth + 1))
                stack.extend((v, depth + 1) for v in getattr(item, "__dict__", {}).values())
    return found


def _filled(cell) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False
