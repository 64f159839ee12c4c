"""The check process: what decides a score, in a process the learner's code cannot reach.

    python -P -m adam8lib.course.grading.checker --result-fd N --alarm-fd A  < job.json

For the workbooks in :data:`SPLIT` the gradebook starts this process instead of
:mod:`~adam8lib.course.grading.runner`. It holds everything a grade depends on — the checks (imported,
located and hashed before any learner code exists), the inputs they make, their expected values,
their comparisons, the captured success line and the result channel's token — and never runs a
line of the learner's code. It starts one **learner process** (:mod:`~adam8lib.course.grading.learner`,
in the sandbox: the command comes from the gradebook, already wrapped) that runs the learner's
exercise cells, then calls each check with *proxies* (:class:`LearnerFunction`) in place of the
learner's functions: calling one sends the check's inputs to the learner process and returns the
plain data it answers (:mod:`~adam8lib.course.grading.plain`; a tensor argument changed in place is
copied back into the check's tensor). The learner process cannot see this one: under bubblewrap it
is in another PID namespace, and in any mode it has only its two pipes and the guard's alarm pipe
(on which the learner process writes the ``end <token>`` line once every result is sent; this
process is also made non-dumpable, so without a sandbox the learner cannot ptrace it or open its
``/proc`` memory and file descriptors).

A learner function that hangs past the check's time limit, or a learner process that dies, ends
that check (timeout / failed) and the learner process is started afresh for the next check.
"""

from __future__ import annotations

import ast
import builtins
import json
import linecache
import os
import signal
import subprocess
import sys

from . import drivers, plain, reaper
from .runner import (GradingTimeout, _alarm, _Capped, _disarm, _first_line, _message, _split_check, file_digest,
                     kernel_problem, output_verdict, warnings_to_log)

__all__ = ["main", "LearnerFunction", "Learner", "SPLIT"]

#: Workbooks graded with the check process / learner process split: their checks hand the learner's
#: functions plain data only, or hand the learner's class or function to a course *driver*
#: (:mod:`adam8lib.course.grading.drivers`) that runs it in the learner process on the scenario the check sends and
#: returns plain data (07: the learner's optimizer class built and stepped, its embedding module built and moved as
#: training would, its training loop run; 08: the learner's Triton kernel launched on copies of the check's
#: sentinel-padded buffers, which come back whole; 09: the learner's functions given models the driver builds; 10: the
#: learner's training code run on the models, optimizers, schedules, loaders, accelerators, Trainer arguments and
#: GradScalers the driver builds, with a spy recording its calls; 13: the learner's optimizer class built and stepped;
#: 14: the learner's hooks registered on a model the driver builds, the learner's function given a tracker the driver
#: measures). Every workbook of the course is split; :mod:`~adam8lib.course.grading.runner` grades a notebook that is
#: not in this list (and every workbook with ``--one-process``) in one guarded process.
SPLIT = ("01_optimizer_memory.ipynb", "02_ema.ipynb", "03_adam_rule.ipynb", "04_linear_quantization.ipynb",
         "05_dynamic_map.ipynb", "06_blockwise_quantization.ipynb", "07_adam8bit_step.ipynb", "08_triton_kernel.ipynb",
         "09_memory_maths.ipynb", "10_mixed_precision_finetune.ipynb", "11_at_scale.ipynb", "12_beyond_8_bits.ipynb",
         "13_one_state_many_optimizers.ipynb", "14_the_whole_bill.ipynb")

_STUB_FILE = "<the learner's exercise cell>"
_EXCEPTIONS = {c.__name__: c for c in (ValueError, TypeError, IndexError, KeyError, RuntimeError, AssertionError,
                                       ZeroDivisionError, OverflowError, AttributeError, NameError, LookupError,
                                       ArithmeticError, NotImplementedError, RecursionError, MemoryError,
                                       UnboundLocalError, FloatingPointError)}  # fmt: skip


class LearnerGone(RuntimeError):
    """The learner process ended (or was stopped) while a check was talking to it. ``unstarted``: it ended
    before it said ``started``, so before any learner code ran — the grader's problem (sandbox, interpreter,
    kernel), never the learner's."""

    def __init__(self, text: str, unstarted: bool = False):
        super().__init__(text)
        self.unstarted = unstarted


def _raise_stub(message: str):
    # a NotImplementedError raised on a "raise NotImplementedError" line of non-library code: what
    # the checks' is_stub recognises as the workbook stub (decided in the learner process)
    line = "raise NotImplementedError(__message__)"
    linecache.cache[_STUB_FILE] = (len(line) + 1, None, [line + "\n"], _STUB_FILE)
    exec(compile(line, _STUB_FILE, "exec"), {"__message__": message, "__builtins__": builtins})


class Learner:
    """The check process's handle on the learner process (start, requests, restart, end)."""

    def __init__(self, job: dict, alarm_fd: int):
        self.job, self.alarm_fd, self.proc, self.notes, self.generation = job, alarm_fd, None, [], 0
        #: cells stopped by this process's clock (they ignored the learner process's own alarm): not run again
        self.skip: list[int] = []
        self.stopped_notes: list[str] = []
        self.since, self.subreaper = reaper.now(), reaper.become_subreaper()

    def start(self) -> None:
        self.launch()
        self.ready()

    def launch(self) -> None:
        """Start the learner process and give it its job (it runs the exercise cells at once)."""
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        names = {"{requests}": str(req_r), "{replies}": str(rep_w), "{alarm}": str(self.alarm_fd)}
        cmd = [names.get(part, part) for part in self.job["learner_cmd"]]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, pass_fds=(req_r, rep_w, self.alarm_fd),
                                         cwd=self.job.get("learner_cwd"), env=self.job.get("learner_env"))  # fmt: skip
        finally:
            os.close(req_r)
            os.close(rep_w)
        self.req, self.rep = req_w, rep_r
        self.generation += 1
        job = {k: v for k, v in self.job.items() if k in ("notebook", "cells", "modules", "cell_timeout", "max_output",
                                                          "course_setup", "library_imports", "implementations",
                                                          "references")}
        job["checks"] = [{"exercise": c["exercise"], "source": c["source"]} for c in self.job["checks"]]
        job["skip_cells"] = list(self.skip)
        try:
            self.proc.stdin.write(json.dumps(job).encode())
            self.proc.stdin.close()
        except OSError:
            pass

    def ready(self) -> None:
        """Wait for the learner process to have run the exercise cells."""
        # the first learner process of a workbook starts in a folder no learner code has touched: if it fails
        # before it says "started", the grader failed; a later one may fail because of what the learner left there
        first = self.generation == 1
        if self._receive(unstarted=first) != ("started",):
            self.stop()
            raise LearnerGone("the learner process did not say it started", unstarted=first)
        timeout = float(self.job.get("cell_timeout", 120))
        limit = float(self.job.get("phase_limit", timeout + 10))
        cell = None
        while True:
            try:
                message = self._receive()
            except GradingTimeout:  # this process's clock: a cell that ignored its own process's alarm
                _disarm()
                self.stop()
                self.skip.append(cell)
                self.stopped_notes.append(f"cell {cell} (exercise cell) ran past {timeout:g} s, ignoring its time limit, "
                                          "and was stopped from outside by the grader; graded again without it")  # fmt: skip
                self.launch()
                if self._receive() != ("started",):
                    self.stop()
                    raise LearnerGone("the learner process did not say it started") from None
                continue
            if type(message) is tuple and len(message) == 2 and message[0] == "cell" and type(message[1]) is int:
                cell = message[1]
                _alarm(limit)
                continue
            _disarm()
            break
        if type(message) is not tuple or not message or message[0] != "ready":
            raise LearnerGone("the learner process did not start")
        self.notes = self.stopped_notes + [str(n)[:300] for n in message[1]][:50]

    def _receive(self, unstarted: bool = False):
        try:
            return plain.receive(self.rep)
        except (EOFError, OSError) as exc:
            try:
                code = self.proc.wait(timeout=5) if unstarted else self.proc.poll()
            except subprocess.TimeoutExpired:
                code = None
            self.stop()
            raise LearnerGone(f"the learner's process ended ({code}): {exc}", unstarted) from None
        except Exception as exc:  # noqa: BLE001 - bytes that are not a message: out of step for good
            self.stop()
            raise LearnerGone(f"the learner's process sent something that is not plain data ({type(exc).__name__})",
                              unstarted) from None

    def request(self, message):
        if self.proc is None:
            self.start()
        try:
            plain.send(self.req, message)
            reply = self._receive()
        except BaseException:
            self.stop()  # a timeout or a broken pipe mid-exchange: this process is out of step
            raise
        if type(reply) is not tuple or not reply or type(reply[0]) is not str:
            self.stop()
            raise LearnerGone("the learner process answered something that is not a reply")
        return reply

    def stop(self) -> None:
        if self.proc is None:
            return
        for fd in (self.req, self.rep):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            if self.proc.poll() is None:
                reaper.kill_tree(self.proc.pid)  # everything it started, whatever its session or group
            self.proc.kill()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.proc = None
        reaper.sweep(since=self.since)  # and the orphans re-parented here (this process starts nothing else now)

    def end(self, token: str) -> None:
        """Have the learner process write the guard's end marker and exit. One that is not running
        (it died or was stopped in the last check) is started again for it, so that a learner who
        closed the alarm pipe cannot hide that by ending their process."""
        try:
            self.request(("end", token))
            self.proc.wait(timeout=10)
        except LearnerGone as exc:
            if exc.unstarted:
                raise
        except (OSError, subprocess.TimeoutExpired, AttributeError):
            pass
        self.stop()

    def call(self, fn: "LearnerFunction", args: tuple, kwargs: dict):
        local = plain.tensors([list(args), kwargs])
        message = ("call", fn._handle, plain.encode(list(args)), plain.encode(dict(kwargs)), fn._exercise)
        return self._answer(fn, message, local)

    def drive(self, fn: "LearnerFunction", driver: str, args: tuple, kwargs: dict):
        """Have the learner process run the course driver ``driver`` (``module:function`` of
        :mod:`adam8lib.course.grading.drivers`) on the learner's object: its plain result (nothing of the check's
        is changed in place: a driver's arguments are its scenario, sent as copies)."""
        message = ("drive", fn._handle, str(driver), plain.encode(list(args)), plain.encode(dict(kwargs)), fn._exercise)
        return self._answer(fn, message, [])

    def _answer(self, fn: "LearnerFunction", message: tuple, local: list):
        import torch

        if fn._generation != self.generation or self.proc is None:
            raise LearnerGone(f"{fn.__name__}: the learner's process was restarted after a timeout or a crash")
        reply = self.request(message)
        if reply[0] in ("ok", "raise") and len(reply) in (4, 5) and type(reply[-1]) is str:
            printed, reply = reply[-1], reply[:-1]
            if printed:
                sys.stdout.write(printed)
        if reply[0] == "ok":
            after = [plain.decode(t) for t in reply[2]]
            if len(after) != len(local):
                raise plain.NotPlainData("the learner process changed the number of arguments")
            with torch.no_grad():
                for mine, theirs in zip(local, after):
                    if mine.shape == theirs.shape and mine.dtype == theirs.dtype:
                        if not torch.equal(mine, theirs.to(mine.device)):
                            mine.copy_(theirs)
                    else:
                        mine.data = theirs
            return plain.decode(reply[1], args=local)
        if reply[0] == "raise":
            _, names, text, stub = reply
            if stub:
                _raise_stub(str(text))
            kind = next((_EXCEPTIONS[n] for n in names[1:] if n in _EXCEPTIONS), None)
            if kind is None:
                raise RuntimeError(f"{names[0] if names else 'an exception'}: {text}")
            raise kind(str(text) if names[0] == kind.__name__ else f"{names[0]}: {text}")
        raise LearnerGone("the learner process answered something that is not a reply")


@drivers.remote
class LearnerFunction:
    """Stands for a learner's function (or class) in a check: calling it calls it in the learner process."""

    def __init__(self, learner: Learner, handle: int, name: str, is_class: bool, exercise: str):
        self._learner, self._handle, self._exercise = learner, handle, exercise
        self._generation, self._is_class = learner.generation, is_class
        self.__name__ = self.__qualname__ = str(name)
        self.__doc__ = None

    def __call__(self, *args, **kwargs):
        return self._learner.call(self, args, kwargs)

    def __repr__(self) -> str:
        return f"<the learner's {self.__name__}>"


class Foreign:
    """Stands for a learner value that is neither plain data nor callable (a check rejects it by its type)."""

    def __init__(self, type_name: str):
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<a {self.type_name} of the learner's>"


def _argument(learner: Learner, expression: ast.expr, exercise: str):
    reply = learner.request(("get", ast.unparse(expression), exercise))
    if reply[0] == "plain":
        return plain.decode(reply[1])
    if reply[0] == "callable":
        return LearnerFunction(learner, int(reply[1]), str(reply[2]), bool(reply[3]), exercise)
    if reply[0] == "raise":
        kind = next((_EXCEPTIONS[n] for n in reply[1][1:] if n in _EXCEPTIONS), RuntimeError)
        raise kind(str(reply[2]))
    return Foreign(str(reply[1]))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    fd = int(argv[argv.index("--result-fd") + 1])
    alarm_fd = int(argv[argv.index("--alarm-fd") + 1])
    job = json.loads(sys.stdin.read())
    channel = os.fdopen(fd, "w", encoding="utf-8")
    token = job.pop("token", "")
    try:  # no process of this user (the learner's, without a sandbox) may ptrace this one or read its memory
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass
    real_stdout, real_stderr = sys.stdout, sys.stderr
    warnings_to_log(real_stderr)

    def send(**message) -> None:
        channel.write(json.dumps({**message, "token": token}) + "\n")
        channel.flush()

    def grader_failed(text: str) -> None:  # no learner code ran: the gradebook stops the run, nobody is scored
        send(kind="grader", text=text)
        channel.close()
        learner.stop()
        os._exit(0)

    cell_timeout = float(job.get("cell_timeout", 120))
    cap = int(job.get("max_output", 65536))
    modules: dict = job.get("modules", {})
    learner = Learner(job, alarm_fd)
    if job.get("early_start"):
        # in the sandbox (read-only files) the learner process may start while this one imports
        # the checks: nothing it does can change what is imported here
        learner.launch()
    if job.get("course_setup"):
        from adam8lib.course import setup

        setup(verbose=False)
    resolved = {}
    for spec in job["checks"]:
        name = f"check_{spec['exercise']}"
        try:
            imports, call = _split_check(spec["source"], name)
            namespace: dict = {"__builtins__": builtins}
            exec(compile(ast.Module(body=imports, type_ignores=[]), f"<check {name}>", "exec"), namespace)
            resolved[spec["exercise"]] = (namespace[name], call)
        except Exception as exc:  # a course error, reported as such
            send(kind="result", exercise=spec["exercise"], status="error",
                 detail=f"the check could not be loaded: {type(exc).__name__}: {exc}")  # fmt: skip
    bad = []
    for name, info in modules.items():
        loaded = getattr(sys.modules.get(name), "__file__", None)
        if loaded is None or os.path.realpath(loaded) != os.path.realpath(info["origin"]):
            bad.append(f"{name} loaded from {loaded}, expected {info['origin']}")
        bad += [f"{path} changed" for path, digest in info["files"].items() if file_digest(path) != digest]
    if bad:  # no learner code runs here: the checks on disk are not those the gradebook read (the grader's problem)
        grader_failed("the check process: the checks are not the course's the gradebook read at its start: "
                      + "; ".join(bad)[:600])
    problem = kernel_problem(job)
    if problem:
        grader_failed(f"the check process: {problem}")
    send(kind="started")

    try:
        if learner.proc is None:
            learner.launch()
        learner.ready()
    except LearnerGone as exc:
        if exc.unstarted:
            grader_failed(f"the learner's process could not start (sandbox, interpreter or kernel build): {exc}")
        send(kind="note", text=f"the learner process could not run the exercise cells: {exc}")
    for text in learner.notes:
        send(kind="note", text=text)
    for spec in job["checks"]:
        exercise = spec["exercise"]
        if exercise not in resolved:
            continue
        function, call = resolved[exercise]
        out = _Capped(max(cap, 2 * len(spec["expected_output"])))
        status, detail, error = "passed", "", ""
        try:
            if learner.proc is None:  # stopped or gone in an earlier check: a fresh one, outside this check's time
                learner.start()
            _alarm(cell_timeout)
            learner.request(("begin", exercise))
            args = [_argument(learner, a, exercise) for a in call.args]
            kwargs = {k.arg: _argument(learner, k.value, exercise) for k in call.keywords}
            sys.stdout = sys.stderr = out
            try:
                function(*args, **kwargs)
            finally:
                sys.stdout, sys.stderr = real_stdout, real_stderr
            learner.request(("finish", exercise))
            _disarm()
        except GradingTimeout:
            _disarm()
            learner.stop()
            status, detail = "timeout", f"Timeout of {cell_timeout:g} s exceeded in the check of {exercise}"
        except BaseException as exc:  # noqa: BLE001
            _disarm()
            if isinstance(exc, LearnerGone) and exc.unstarted:
                grader_failed(f"the learner's process could not start again (sandbox, interpreter or kernel build): {exc}")
            status, detail = "failed", f"{type(exc).__name__}: {_first_line(exc)}"
            error = _message(f"{type(exc).__name__}: {exc}")
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        if status == "passed":
            status, detail = output_verdict(out, spec["expected_output"]) or (status, detail)
        send(kind="result", exercise=exercise, status=status, detail=detail, **({"error": error} if error else {}))
    try:
        learner.end(token)
    except LearnerGone as exc:
        grader_failed(f"the learner's process could not start again to end (sandbox, interpreter or kernel build): {exc}")
    send(kind="done")
    channel.close()
    os._exit(0)


if __name__ == "__main__":
    main()
