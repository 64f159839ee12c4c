"""The learner process: runs a learner's exercise cells and, on request, their functions — nothing else.

    python -P -m adam8lib.course.grading.learner --requests R --replies W --alarm-fd A  < job.json

Started (in the sandbox) by the check process (:mod:`adam8lib.course.grading.checker`), one per
workbook and reused for all its checks. Its job (stdin) holds the learner's exercise cells and the
import lines of the workbook's check cells — no expected output, no token, no check is called
here. It imports the course's drivers (:mod:`adam8lib.course.grading.drivers`) and, where it can see them, the
checks' modules (under bubblewrap it is not shown ``adam8lib/course/checks`` but its ``__init__`` and
``_common``: the learner view; the library functions the checks compare with come by name in the job, so
that :mod:`~adam8lib.course.grading.guard` knows the course references by identity), installs the guard on the alarm pipe (the second line of defence:
frames, heap walks, tracing, ctypes refused and reported; course references used, torch modes left
pushed, watched modules rebound reported), runs the cells, then answers requests on ``R`` with
replies on ``W``, in plain data only (:mod:`adam8lib.course.grading.plain`):

* ``("get", expression, exercise)`` — the value of a check call's argument in the learner's
  namespace: plain data, or a *handle* for a callable (the learner's function or class);
* ``("call", handle, args, kwargs, exercise)`` — call it on the check's inputs; the reply is its
  result and the values of every tensor argument afterwards (the check process copies them back
  into its own tensors, so in-place updates are seen), or the exception's type names, message and
  whether it is the workbook stub's ``raise NotImplementedError``;
* ``("drive", handle, driver, args, kwargs, exercise)`` — run the course driver named ``driver``
  (``module:function`` of :mod:`adam8lib.course.grading.drivers`, imported before any learner code ran;
  nothing else can be named) on the learner's object with the check's plain arguments: the driver
  builds what the exercise needs (parameters and gradients, a model from a seed), runs the learner's
  class or function on it, and its plain result is the reply (or the exception, as for ``call``);
* ``("begin" | "finish", exercise)`` — look for tampering around one exercise's check;
* ``("end", token)`` — write the guard's end marker (``end <token>``) on the alarm pipe and exit
  (``os._exit``: no learner ``atexit`` hook runs). The check process sends it after every result
  has gone to the gradebook; a learner who closed the alarm pipe loses that line, and the
  gradebook marks the workbook tampered.

``--no-guard`` (tests only; the gradebook never passes it) runs without the guard and without the
snapshot and reference checks, to show what the split alone keeps out of reach.

What the learner's code can reach here is its own process: the checks' code and the course
package (readable in any case), never the check process's expected values, comparisons or token.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import json
import os
import sys
import threading

from . import drivers, plain
from .guard import install, references
from .runner import (WATCHED, Snapshot, _Capped, _split_check, course_references, grader_failed, kernel_problem,
                     trusted_roots, _learner_code, run_exercise_cells, warnings_to_log)  # fmt: skip

__all__ = ["main"]


def _stub(exc: BaseException) -> bool:
    from adam8lib.course.checks._common import is_stub

    try:
        return bool(is_stub(exc))
    except Exception:  # noqa: BLE001 - a hostile exception: not the stub
        return False


def _raised(exc: BaseException) -> tuple:
    names = [type(exc).__name__] + [c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins"]
    try:
        text = str(exc)[:4000]
    except Exception:  # noqa: BLE001 - a learner's __str__ may raise
        text = "<unprintable>"
    return ("raise", names, text, _stub(exc))


class _Unguarded:
    """``--no-guard``: what the guard's handle does, without hooks (tests of the split alone)."""

    def __init__(self, alarm_fd: int):
        self.fd = alarm_fd

    def alarm(self, text: str) -> None:
        os.write(self.fd, f"alarm {text}\n".encode())

    def ref(self, exercise: str, text: str) -> None:
        os.write(self.fd, f"ref {exercise} {text}\n".encode())

    def end(self, token: str) -> None:
        os.write(self.fd, f"end {token}\n".encode())

    def profile(self, exercise) -> None:
        pass

    def modes(self) -> list:
        return []


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    req = int(argv[argv.index("--requests") + 1])
    rep = int(argv[argv.index("--replies") + 1])
    alarm_fd = int(argv[argv.index("--alarm-fd") + 1])
    guarded = "--no-guard" not in argv
    job = json.loads(sys.stdin.read())
    real_stdout, real_stderr = sys.stdout, sys.stderr
    warnings_to_log(real_stderr)  # a warning in here never travels back as what the learner's function printed
    receive, send = plain.receive, plain.send
    cap = int(job.get("max_output", 65536))
    cell_timeout = float(job.get("cell_timeout", 120))
    modules: dict = job.get("modules", {})
    if job.get("course_setup"):
        from adam8lib.course import setup

        setup(verbose=False)
    for module in drivers.DRIVER_MODULES:  # the course's drivers, imported before any learner code (and watched)
        importlib.import_module(module)
    for spec in job["checks"]:
        try:
            imports, _ = _split_check(spec["source"], f"check_{spec['exercise']}")
            exec(compile(ast.Module(body=imports, type_ignores=[]), "<check imports>", "exec"), {"__builtins__": builtins})
        except Exception:  # noqa: BLE001 - the check process reports a check that does not load
            pass
    problem = kernel_problem(job)  # before the guard: the kernel is loaded with ctypes
    if problem:
        grader_failed(problem)
    origins = {name: info["origin"] for name, info in modules.items()}
    # the checks' references: those of the check modules loaded here (without a sandbox) and, by name, the library
    # functions the checks import (the gradebook found them; under bubblewrap this process is not shown the checks)
    forbidden, allowed = course_references(origins, job.get("library_imports", []),
                                           [*job.get("implementations", []), *job.get("references", [])])
    guard = install(alarm_fd, roots=trusted_roots(modules), forbidden=forbidden, allowed=allowed) if guarded else _Unguarded(alarm_fd)
    learner_code = _learner_code(trusted_roots(modules))
    watched = sorted({*WATCHED, *origins, *(n for n in sys.modules if n == "adam8lib" or n.startswith("adam8lib."))})
    snapshot = Snapshot(watched)
    threads = set(threading.enumerate())

    def tampering() -> list[str]:
        if not guarded:
            return []
        bad = snapshot.changes() + [f"thread {t.name}" for t in threading.enumerate() if t not in threads and t.is_alive()]
        if sys.gettrace() is not None or sys.getprofile() is not None:
            bad.append("sys.settrace/setprofile hook")
        return bad + guard.modes()

    send(rep, ("started",))  # the check process counts what fails before this as the grader's problem
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    notes: list[str] = []
    run_exercise_cells(job, namespace, _Capped(cap), cell_timeout, notes.append, guard,
                       announce=lambda index: send(rep, ("cell", index)))  # the check process's clock
    send(rep, ("ready", notes))

    handles: dict[int, object] = {}
    while True:
        try:
            request = receive(req)
        except EOFError:
            os._exit(0)
        op = request[0]
        if op == "end":
            guard.end(str(request[1]))
            send(rep, ("ok",))
            os._exit(0)
        if op in ("begin", "finish"):
            changed = tampering()
            if changed:
                guard.alarm(f"{op} of the check of {request[1]}: learner code changed what the checks rely on: "
                            + ", ".join(changed[:5]))
            send(rep, ("ok",))
            continue
        if op == "get":
            _, source, exercise = request
            try:
                value = eval(compile(source, "<check argument>", "eval"), dict(namespace))
            except BaseException as exc:  # noqa: BLE001 - a missing name: the check process raises it
                send(rep, _raised(exc))
                continue
            for name in references(value, forbidden, learner_code) if guarded else ():
                guard.ref(exercise, f"the learner's {getattr(value, '__name__', type(value).__name__)} is, wraps "
                                    f"or names the course reference {name}")
            try:
                send(rep, ("plain", plain.encode(value)))
                continue
            except plain.NotPlainData:
                pass
            if callable(value):
                handles[len(handles)] = value
                name = getattr(value, "__name__", None)
                send(rep, ("callable", len(handles) - 1, name if type(name) is str else type(value).__name__,
                           isinstance(value, type)))
            else:
                send(rep, ("other", type(value).__name__))
            continue
        if op in ("call", "drive"):
            if op == "drive":  # a course driver run on the learner's object: ("drive", handle, driver, args, kwargs, exercise)
                _, handle, name, args, kwargs, exercise = request
                try:
                    course_driver = drivers.resolve(name)
                except Exception as exc:  # noqa: BLE001 - not a course driver: the check process says so
                    send(rep, _raised(exc) + ("",))
                    continue
            else:
                _, handle, args, kwargs, exercise = request
                course_driver = None
            fn = handles.get(handle)
            args, kwargs = plain.decode(args), plain.decode(kwargs)
            inputs = plain.tensors([args, kwargs]) if course_driver is None else []
            printed = _Capped(cap)
            sys.stdout = sys.stderr = printed
            guard.profile(exercise)
            try:
                if course_driver is None:
                    result = fn(*args, **kwargs)
                else:
                    result = course_driver(fn, *args, **kwargs)
                reply = ("ok", plain.encode(result, args=inputs), [plain.encode(t) for t in inputs])
            except BaseException as exc:  # noqa: BLE001 - the learner's exception goes to the check
                reply = _raised(exc)
            finally:
                guard.profile(None)
                sys.stdout, sys.stderr = real_stdout, real_stderr
            # what the learner's function printed goes to the check's output, as in the learner's own notebook
            # (where a print inside a checked function lands in the check cell's output)
            send(rep, reply + (printed.getvalue(),))
            continue
        send(rep, ("raise", ["ValueError"], f"unknown request {op!r}", False))


if __name__ == "__main__":
    main()
