"""The gradebook's child: grade one learner's workbook in a process their notebook never ran in.

    python -P -m adam8lib.course.grading.runner --result-fd N  < job.json

The gradebook (:mod:`adam8lib.course.grading.gradebook`) starts one such process per learner
workbook, inside the sandbox (:mod:`adam8lib.course.grading.sandbox`), and writes the job to its
stdin: the learner's *exercise cells* (the cells tagged ``solution``, read by the gradebook, not by
this process) and, from the grading manifest it loaded, every check cell's source and expected
success line, plus the files the checks come from and their sha256. In order, this process

1. imports every check **before any learner code runs** (the import lines of the manifest's
   check cells) and keeps the check functions; it verifies that each comes from the expected
   file with the expected hash, and takes a *snapshot* of the checks' modules, of ``adam8lib``,
   of ``builtins``/``sys``/``os``/``io``/``json``/``signal`` and of ``torch``/``numpy`` (the identity
   of every function, class and module in them, and of each function's code);
2. runs the exercise cells (each under the per-cell timeout, output discarded beyond a cap), in
   one namespace — no IPython, so input transformers, custom exception handlers or magics of a
   notebook do not exist here;
3. for each check, verifies the snapshot and the files again, calls the kept check function with
   the manifest's arguments evaluated in the learner's namespace (timeout, captured and capped
   output), and verifies again afterwards. An exercise passes when the check returns and prints
   exactly its success line. A changed snapshot or file makes the exercise ``tampered`` (0 points).

Results go to the parent through ``--result-fd``, a pipe the gradebook owns, one JSON line per
exercise (a failed check also sends the first lines of its message, hint included, as ``error``)
and a last ``{"kind": "done"}``, each carrying the job's random token; the gradebook
never reads a file the learner could write, and points are computed by the gradebook from its
own manifest. New threads or trace/profile hooks left by learner code also count as tampering.
This process exits with ``os._exit`` so no learner ``atexit`` hook runs.

Before any learner code runs, :mod:`adam8lib.course.grading.guard` is installed (``--alarm-fd``):
learner code cannot take a stack frame, walk the heap, trace, use ctypes or read this process's
memory (refused, and reported on the alarm pipe: the workbook is tampered), and while a check
runs, calls of course references and learner-written torch modes / ``__torch_function__`` are
reported. What this does not stop: native code the learner brings, and library functions that
read frames for their caller; the sandbox bounds what remains to the learner's own grade.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import io
import json
import os
import signal
import sys
import sysconfig
import threading
import types

from . import withheld
from .guard import install, references

__all__ = ["main", "file_digest", "Snapshot"]

#: Modules (besides the checks' own and adam8lib's) whose functions a check relies on.
WATCHED = ("builtins", "sys", "os", "io", "json", "signal", "_signal", "math", "traceback", "contextlib", "functools",
           "operator", "torch", "torch.nn.functional", "torch.testing", "torch.overrides", "numpy", "numpy.testing")  # fmt: skip


class GradingTimeout(BaseException):
    """Raised by SIGALRM in the cell or check that ran past its time."""


def file_digest(path: str) -> str:
    """sha256 of a file's bytes (a module's source)."""
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


class Snapshot:
    """The identity of every function, class and module reachable from the watched modules.

    A learner cell that rebinds ``check_x``, a helper of the checks, ``print``, ``sys.stdout``,
    ``torch.allclose``, a method of ``torch.Tensor`` or of an adam8lib class, or a function's
    ``__code__``, changes it. Attributes added later (lazy imports) are not changes.
    """

    def __init__(self, module_names):
        self.entries: dict[tuple[str, str], tuple] = {}
        for name in module_names:
            module = sys.modules.get(name)
            if module is None:
                continue
            self._add(name, vars(module), owner=name, deep=True)
        torch = sys.modules.get("torch")
        if torch is not None:
            self._add("torch.Tensor", vars(torch.Tensor), owner=None, deep=False)
        for attr in ("stdout", "stderr"):
            self.entries[("sys", attr)] = (id(getattr(sys, attr)),)

    @staticmethod
    def _key(value) -> tuple | None:
        # torch.optim wraps a subclass's ``step`` in its own profiling hook (functools.wraps) the
        # first time an optimizer is built: a wrapper whose code is torch's stands for the original
        torch = sys.modules.get("torch")
        root = os.path.dirname(getattr(torch, "__file__", "") or "") if torch is not None else ""
        while (root and isinstance(value, types.FunctionType) and hasattr(value, "__wrapped__")
               and value.__code__.co_filename.startswith(root + os.sep)):  # fmt: skip
            value = value.__wrapped__
        if isinstance(value, types.FunctionType):
            return (id(value), id(value.__code__), id(value.__globals__), value.__defaults__, id(value.__kwdefaults__))
        if isinstance(value, (types.BuiltinFunctionType, types.ModuleType, type, staticmethod, classmethod,
                              property, types.MethodType, types.WrapperDescriptorType,
                              types.MethodDescriptorType)) or callable(value):  # fmt: skip
            return (id(value),)
        return None

    def _add(self, prefix: str, namespace: dict, owner: str | None, deep: bool) -> None:
        for attr, value in list(namespace.items()):
            key = self._key(value)
            if key is None:
                continue
            self.entries[(prefix, attr)] = key
            if deep and isinstance(value, type) and getattr(value, "__module__", None) == owner:
                self._add(f"{prefix}.{attr}", dict(vars(value)), owner=None, deep=False)

    def changes(self) -> list[str]:
        """What differs from this snapshot now (``module.attr`` names), at most a few."""
        now = Snapshot.__new__(Snapshot)
        now.entries = {}
        seen_modules = {prefix for prefix, _ in self.entries}
        for name in seen_modules:
            module = sys.modules.get(name)
            if module is not None and isinstance(module, types.ModuleType):
                now._add(name, vars(module), owner=name, deep=True)
        torch = sys.modules.get("torch")
        if torch is not None:
            now._add("torch.Tensor", vars(torch.Tensor), owner=None, deep=False)
        for attr in ("stdout", "stderr"):
            now.entries[("sys", attr)] = (id(getattr(sys, attr)),)
        changed = [f"{p}.{a}" for (p, a), key in self.entries.items() if now.entries.get((p, a)) != key]
        return changed


class _Capped(io.TextIOBase):
    """A text sink that keeps at most ``limit`` characters (and counts the rest)."""

    def __init__(self, limit: int):
        self.limit, self.parts, self.kept, self.total = limit, [], 0, 0

    def writable(self) -> bool:
        return True

    def write(self, text) -> int:
        text = str(text)
        self.total += len(text)
        room = self.limit - self.kept
        if room > 0:
            self.parts.append(text[:room])
            self.kept += min(room, len(text))
        return len(text)

    def getvalue(self) -> str:
        return "".join(self.parts)


def warnings_to_log(stream) -> None:
    """Send every warning (``warnings.warn``: a library's ``RuntimeWarning: adam8lib cpu backend unavailable …``,
    torch's) and logging's last-resort messages to ``stream`` — the grading process's own stderr, which is the
    gradebook's log — instead of ``sys.stderr`` at the time, which during a check is the output compared with
    the success line. A warning is never the learner's output, so it never costs a point."""
    import logging
    import warnings

    def show(message, category, filename, lineno, file=None, line=None):
        try:
            stream.write(warnings.formatwarning(message, category, filename, lineno, line))
            stream.flush()
        except Exception:  # noqa: BLE001 - a log that cannot be written loses the warning, nothing else
            pass

    warnings.showwarning = show
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.WARNING)
    logging.lastResort = handler


def kernel_problem(job: dict) -> str | None:
    """Why the gradebook's build of adam8lib's CPU kernel (copied into this process's cache folder when the
    job says ``kernel``) does not load here, or None: the grader's problem, reported before any learner code runs."""
    if not job.get("kernel"):
        return None
    from adam8lib.kernels import cpu_build

    reason = cpu_build.unavailable_reason()
    return None if reason is None else f"the gradebook's build of adam8lib's CPU kernel does not load here: {reason}"


def grader_failed(text: str) -> None:
    """End a grading process that could not set itself up, before any learner code ran (the gradebook
    sees no ``started`` message and stops the run with the log, which holds ``text``)."""
    sys.__stderr__.write(f"grader: {text}\n")
    sys.__stderr__.flush()
    os._exit(70)


def _alarm(seconds: float) -> None:
    def handler(signum, frame):
        raise GradingTimeout()

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, max(float(seconds), 0.001))


def _disarm() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)


def _first_line(text: str, limit: int = 200) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _message(text: str, lines: int = 12, width: int = 300) -> str:
    """What a feedback page shows of a failed check's message: its first ``lines`` non-blank
    lines, each cut to ``width`` characters, and its hint (the last line starting ``Hint:``
    and what follows it, as the checks' ``fail`` writes it) even when the message is longer."""
    every = [ln.rstrip() for ln in str(text).splitlines() if ln.strip()]
    at = max((i for i, ln in enumerate(every) if ln.lstrip().startswith("Hint:")), default=len(every))
    kept = every[:at][:lines] + every[at:][:4]
    return "\n".join(ln if len(ln) <= width else ln[: width - 3] + "..." for ln in kept)


def run_exercise_cells(job: dict, namespace: dict, sink: "_Capped", cell_timeout: float, note, guard, announce=None) -> None:
    """Execute the learner's exercise cells in ``namespace`` (output into ``sink``), each under ``cell_timeout``;
    ``note(text)`` gets what went wrong in a cell, and a guard (if any) raises its alarm for a torch mode a cell
    left pushed. ``announce(index)`` tells the parent (whose clock stops a cell that ignores this process's
    alarm) that a cell starts; the cells of ``job["skip_cells"]`` (stopped that way before) are not run."""
    real_stdout, real_stderr = sys.stdout, sys.stderr
    skipped = {int(i) for i in job.get("skip_cells", ())}
    for cell in job["cells"]:
        if cell["index"] in skipped:
            continue
        if announce is not None:
            announce(cell["index"])
        sys.stdout = sys.stderr = sink
        try:
            _alarm(cell_timeout)
            exec(compile(cell["source"], f"<{job['notebook']} cell {cell['index']}>", "exec"), namespace)
            _disarm()
        except GradingTimeout:
            _disarm()
            note(f"cell {cell['index']} (exercise cell) ran past {cell_timeout:g} s and was stopped")
        except BaseException as exc:  # noqa: BLE001 - a learner's cell may raise anything
            _disarm()
            note(f"cell {cell['index']} (exercise cell) raised {type(exc).__name__}: {_first_line(exc)}")
        finally:
            sys.stdout, sys.stderr = real_stdout, real_stderr
        if guard is not None:
            for found in guard.modes():
                guard.alarm(f"after exercise cell {cell['index']}: {found}")


def output_verdict(out: "_Capped", expected: str) -> tuple[str, str] | None:
    """``("failed", why)`` when a check that raised nothing printed more or other than its success line."""
    if out.total > out.kept:
        return "failed", f"the check printed {out.total} characters (kept {out.kept}), not its success line"
    text = out.getvalue()
    if text != expected:
        return "failed", f"the check printed {_first_line(text)!r}, not its success line"
    return None


def _split_check(source: str, check: str) -> tuple[list[ast.stmt], ast.Call]:
    """The import statements of a manifest check cell and its ``check_x(...)`` call."""
    tree = ast.parse(source)
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    for node in tree.body:
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id == check):  # fmt: skip
            return imports, node.value
    raise ValueError(f"the manifest's check cell does not call {check}(...)")


def expression_args(spec: dict, exercise: str) -> list[ast.expr]:
    """The argument expressions of a manifest check call (``check_x(a, b)`` -> ``[a, b]``)."""
    _, call = _split_check(spec["source"], f"check_{exercise}")
    return list(call.args) + [k.value for k in call.keywords]


def trusted_roots(modules: dict) -> list[str]:
    """Folders whose modules count as library code: the Python installation, site-packages,
    adam8lib, the PYTHONPATH entries and the folders the checks come from."""
    import adam8lib

    paths = sysconfig.get_paths()
    roots = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    roots += [sys.prefix, sys.exec_prefix, sys.base_prefix, os.path.dirname(adam8lib.__file__)]
    roots += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    roots += [os.path.dirname(info["origin"]) for info in modules.values()]
    return [os.path.realpath(r) for r in roots if r]


def _learner_code(roots: list[str]):
    prefixes = tuple(r.rstrip(os.sep) + os.sep for r in roots)

    def learner_code(code) -> bool:
        name = code.co_filename
        return name.startswith("<") or not os.path.realpath(name).startswith(prefixes)

    return learner_code


def course_references(check_modules, library_imports, implementations) -> tuple[dict, list]:
    """``{object: dotted name}`` of what the checks compare against — every private function and
    check the checks' modules define, and every ``adam8lib`` function they import — plus the
    manifest's ``implementations``, less its ``library_imports`` (the solution uses those); and
    the allowed objects."""
    resolve = withheld.resolved  # the longest importable module, then attributes; None where nothing resolves

    allowed = [v for v in (resolve(d) for d in library_imports) if v is not None and not isinstance(v, types.ModuleType)]
    allowed_ids = {id(v) for v in allowed}
    forbidden: dict = {}
    names = {n for n in sys.modules if any(n == m or n.startswith(m + ".") for m in check_modules)}
    for name in sorted(names):
        module = sys.modules.get(name)
        for attr, value in list(vars(module).items()) if module is not None else []:
            # functions only: classes of the checks (models, spies, optimizers) are handed to the
            # learner's code, which calls their methods; generators are context managers of the checks
            if not isinstance(value, types.FunctionType) or value.__code__.co_flags & 0x20:
                continue
            home = getattr(value, "__module__", "") or ""
            if home in names:
                # public helpers (mlp_task, ...) are the course's tools; reference_* are what a check compares with
                if attr.startswith(("_", "check_", "reference_")):
                    forbidden.setdefault(value, f"{home}.{getattr(value, '__qualname__', attr)}")
            elif home.startswith("adam8lib.") and not home.startswith("adam8lib.course"):
                forbidden.setdefault(value, f"{home}.{getattr(value, '__qualname__', attr)}")
    for dotted in implementations:
        value = resolve(dotted)
        if value is not None and not isinstance(value, types.ModuleType):
            forbidden.setdefault(value, dotted)
    return {k: v for k, v in forbidden.items() if id(k) not in allowed_ids}, allowed


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    fd = int(argv[argv.index("--result-fd") + 1])
    alarm_fd = int(argv[argv.index("--alarm-fd") + 1]) if "--alarm-fd" in argv else None
    job = json.loads(sys.stdin.read())
    channel = os.fdopen(fd, "w", encoding="utf-8")
    real_stdout, real_stderr = sys.stdout, sys.stderr
    warnings_to_log(real_stderr)
    dumps, write, flush = json.dumps, channel.write, channel.flush

    def sender(token: str):
        def send(**message) -> None:
            write(dumps({**message, "token": token}) + "\n")
            flush()

        return send

    token = job.pop("token", "")
    send = sender(token)

    cap = int(job.get("max_output", 65536))
    cell_timeout = float(job.get("cell_timeout", 120))
    checks = job["checks"]
    modules: dict[str, dict] = job.get("modules", {})

    # 1. the course's environment and the checks, before any learner code
    if job.get("course_setup"):
        from adam8lib.course import setup

        setup(verbose=False)
    resolved = {}
    for spec in checks:
        name = f"check_{spec['exercise']}"
        try:
            imports, call = _split_check(spec["source"], name)
            namespace: dict = {"__builtins__": builtins}
            exec(compile(ast.Module(body=imports, type_ignores=[]), f"<check {name}>", "exec"), namespace)
            function = namespace[name]
            call.func = ast.Name(id="__adam8_check__", ctx=ast.Load())
            expression = compile(ast.fix_missing_locations(ast.Expression(body=call)), f"<check {name}>", "eval")
            resolved[spec["exercise"]] = (function, expression)
        except Exception as exc:  # a course error, reported as such
            send(kind="result", exercise=spec["exercise"], status="error",
                 detail=f"the check could not be loaded: {type(exc).__name__}: {exc}")  # fmt: skip
    problem = kernel_problem(job)  # before the guard: the kernel is loaded with ctypes
    if problem:
        grader_failed(problem)
    origins = {name: info["origin"] for name, info in modules.items()}

    def files_changed() -> list[str]:
        bad = []
        for name, info in modules.items():
            module = sys.modules.get(name)
            loaded = getattr(module, "__file__", None)
            if loaded is None or os.path.realpath(loaded) != os.path.realpath(info["origin"]):
                bad.append(f"{name} loaded from {loaded}, expected {info['origin']}")
            for path, digest in info["files"].items():
                try:
                    if file_digest(path) != digest:
                        bad.append(f"{path} changed")
                except OSError as exc:
                    bad.append(f"{path}: {exc}")
        for exercise, (function, _) in resolved.items():
            source = getattr(getattr(function, "__code__", None), "co_filename", "")
            if not any(os.path.realpath(source) in info["files"] for info in modules.values()):
                bad.append(f"check_{exercise} comes from {source}, not from the course's checks")
        return bad

    guard = None
    if alarm_fd is not None:
        forbidden, allowed = course_references(origins, job.get("library_imports", []), job.get("implementations", []))
        guard = install(alarm_fd, roots=trusted_roots(modules), forbidden=forbidden, allowed=allowed)
        for _, expression in resolved.values():
            guard.trust(expression)
    learner_code = _learner_code(trusted_roots(modules))
    watched = sorted({*WATCHED, *origins, *(n for n in sys.modules if n == "adam8lib" or n.startswith("adam8lib."))})
    snapshot = Snapshot(watched)
    baseline = files_changed()
    if baseline:  # before any learner code: the checks on disk are not those the gradebook read (the grader's problem)
        grader_failed("the checks are not the course's the gradebook read at its start: " + "; ".join(baseline)[:600])

    threads = set(threading.enumerate())

    def hooks_changed() -> list[str]:
        bad = [f"thread {t.name}" for t in threading.enumerate() if t not in threads and t.is_alive()]
        if sys.gettrace() is not None or sys.getprofile() is not None:
            bad.append("sys.settrace/setprofile hook")
        return bad

    send(kind="started")  # from here on, learner code runs: what goes wrong may be the learner's

    # 2. the learner's exercise cells
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    run_exercise_cells(job, namespace, _Capped(cap), cell_timeout, lambda text: send(kind="note", text=text), guard,
                       announce=lambda index: send(kind="phase", phase="cell", index=index))  # fmt: skip

    # 3. the checks
    skipped = set(job.get("skip_checks", ()))
    for spec in checks:
        exercise = spec["exercise"]
        if exercise not in resolved or exercise in skipped:
            continue
        send(kind="phase", phase="check", exercise=exercise)
        changed = snapshot.changes() + files_changed() + hooks_changed() + (guard.modes() if guard else [])
        if changed:
            send(kind="result", exercise=exercise, status="tampered",
                 detail="learner code changed the checks or what they rely on: " + ", ".join(changed[:5]))  # fmt: skip
            continue
        function, expression = resolved[exercise]
        if guard is not None:
            try:
                arguments = ast.Expression(body=ast.Tuple(elts=expression_args(spec, exercise), ctx=ast.Load()))
                values = eval(compile(ast.fix_missing_locations(arguments), "<check arguments>", "eval"), dict(namespace))
            except Exception:  # noqa: BLE001 - a missing name fails in the check itself, with its message
                values = ()
            for value in values:
                for name in references(value, forbidden, learner_code):
                    guard.ref(exercise, f"the learner's {getattr(value, '__name__', type(value).__name__)} is, wraps "
                                        f"or names the course reference {name}")
        out = _Capped(max(cap, 2 * len(spec["expected_output"])))
        status, detail, error = "passed", "", ""
        sys.stdout = sys.stderr = out
        try:
            _alarm(cell_timeout)
            if guard is not None:
                guard.profile(exercise)
            try:
                eval(expression, {**namespace, "__adam8_check__": function})
            finally:
                if guard is not None:
                    guard.profile(None)
            _disarm()
        except GradingTimeout:
            _disarm()
            status, detail = "timeout", f"Timeout of {cell_timeout:g} s exceeded in the check of {exercise}"
        except BaseException as exc:  # noqa: BLE001
            _disarm()
            status, detail = "failed", f"{type(exc).__name__}: {_first_line(exc)}"
            error = _message(f"{type(exc).__name__}: {exc}")
        finally:
            sys.stdout, sys.stderr = real_stdout, real_stderr
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        if status == "passed":
            status, detail = output_verdict(out, spec["expected_output"]) or (status, detail)
        changed = snapshot.changes() + files_changed() + hooks_changed() + (guard.modes() if guard else [])
        if changed:
            status, detail, error = "tampered", "learner code changed the checks or what they rely on: " + ", ".join(changed[:5]), ""
        send(kind="result", exercise=exercise, status=status, detail=detail, **({"error": error} if error else {}))
    if guard is not None:
        guard.end(token)
    send(kind="done")
    channel.close()
    os._exit(0)


if __name__ == "__main__":
    main()
