"""The gradebook's side of a grading child: start it, feed it its job, read what it says, end it.

:func:`converse` starts the command (in its own session), writes the job to its stdin from a
thread, and reads two pipes with one selector until the child says ``done``, both pipes close,
or the deadline passes — every read waits at most until the deadline, so a child (or a
grandchild holding a pipe open) can never block the gradebook. The result pipe and the alarm pipe
(what :mod:`adam8lib.course.grading.guard` reports) are created here; the child gets only their
write ends (``{fd}`` and ``{alarm}`` in the command); the alarm pipe is read to its end marker. Its combined stdout/stderr is kept
up to 256 KiB; more than 1 MiB on the result pipe is abuse. Afterwards the child's whole process
tree is killed (its descendants, its process group, and — the gradebook being a child subreaper,
:mod:`~adam8lib.course.grading.reaper` — every orphan a learner's double fork left behind) and reaped.

:class:`Phases` is the gradebook's clock on each cell and check of a child that runs learner code in
its own process (the runner): the child announces each phase on the result pipe, and one that runs
past its limit — a learner's code that ignores or blocks the child's own ``SIGALRM`` — is killed from
outside (``stalled``), whatever the learner's code did to its process's signals.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import threading
import time

from . import reaper

__all__ = ["converse", "kill", "died", "signal_name", "Phases"]

_LOG_CAP = 256 * 1024
_CHANNEL_CAP = 1024 * 1024


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def died(returncode: int | None) -> str:
    if returncode is None:
        return "did not exit"
    number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if number:
        why = " (out of memory, or killed)" if number == signal.SIGKILL else ""
        return f"was killed by {signal_name(number)}{why}"
    return f"exited with status {returncode}"


def kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except OSError:
        pass


class Phases:
    """The phases (``("cell", index)``, then ``("check", exercise)``) a child announces with ``{"kind": "phase",
    ...}`` messages, and the time each may take (``limit`` seconds, from its announcement to the next one).

    Only forward moves count (a phase announced again, or out of order, is ignored), so a child can never
    buy more than one limit per phase; ``expired`` is the phase that ran past its limit.
    """

    def __init__(self, cells, checks, limit: float, token: str):
        self.order = [("cell", int(i)) for i in cells] + [("check", str(e)) for e in checks]
        self.limit, self.token = float(limit), token
        self.at, self.until, self.expired = -1, None, None

    def seen(self, message) -> None:
        if not isinstance(message, dict) or message.get("kind") != "phase" or message.get("token") != self.token:
            return
        phase = message.get("phase")
        key = (phase, message.get("index") if phase == "cell" else message.get("exercise"))
        try:
            self.at = self.order.index(key, self.at + 1)
        except ValueError:
            return
        self.until = time.monotonic() + self.limit

    @property
    def current(self):
        return self.order[self.at] if self.at >= 0 else None


def converse(cmd, env, cwd, job: bytes, deadline: float, active: set, lock: threading.Lock, phases: Phases | None = None,
             since: int | None = None):  # fmt: skip
    """Run one child; return (messages, or None if the channel was abused; log; returncode; timed_out;
    the alarm pipe's text). With ``phases``, a phase that runs past its limit ends the child (``phases.expired``).
    ``since``: the grader's start (:func:`reaper.now`); orphans started after it are ended with the child.

    ``{fd}`` and ``{alarm}`` in ``cmd`` become the child's ends of the result and alarm pipes. The
    job goes in through stdin (from a thread); every read waits at most until ``deadline``; the log
    and the alarm text are capped.
    """
    read_fd, write_fd = os.pipe()
    alarm_read, alarm_write = os.pipe()
    cmd = [str(write_fd) if part == "{fd}" else str(alarm_write) if part == "{alarm}" else part for part in cmd]
    try:
        with lock:  # started and known at once: a sweep (under the same lock) never takes it for an orphan
            proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, pass_fds=(write_fd, alarm_write), start_new_session=True)  # fmt: skip
            active.add(proc)
    except BaseException:
        os.close(read_fd)
        os.close(alarm_read)
        raise
    finally:
        os.close(write_fd)
        os.close(alarm_write)
    return _collect(proc, read_fd, alarm_read, job, deadline, active, lock, phases, since)


def _collect(proc, read_fd, alarm_fd, job, deadline, active, lock, phases=None, since=None):
    def feed():
        try:
            proc.stdin.write(job)
            proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass

    threading.Thread(target=feed, daemon=True).start()
    channel, log, log_total, alarms = bytearray(), bytearray(), 0, bytearray()
    abused, done, timed_out = False, False, False
    sel = selectors.DefaultSelector()
    sel.register(read_fd, selectors.EVENT_READ, "channel")
    sel.register(proc.stdout, selectors.EVENT_READ, "log")
    sel.register(alarm_fd, selectors.EVENT_READ, "alarm")
    fds = {"channel": read_fd, "alarm": alarm_fd}
    parsed = 0  # how much of the channel has been read as lines (for the phases)
    try:
        while sel.get_map() and not done:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                timed_out = True
                break
            if phases is not None and phases.until is not None:
                if phases.until <= now:
                    phases.expired = phases.current
                    break
                remaining = min(remaining, phases.until - now)
            for key, _ in sel.select(timeout=min(remaining, 1.0)):
                fd = fds.get(key.data) or proc.stdout.fileno()
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                if key.data == "alarm":
                    alarms += chunk[: max(0, _LOG_CAP - len(alarms))]
                elif key.data == "log":
                    log_total += len(chunk)
                    log += chunk[: max(0, _LOG_CAP - len(log))]
                else:
                    channel += chunk
                    if len(channel) > _CHANNEL_CAP:
                        abused = done = True
                    elif b"\"kind\": \"done\"" in channel:
                        done = True
                    while phases is not None and not abused:
                        end = channel.find(b"\n", parsed)
                        if end < 0:
                            break
                        try:
                            phases.seen(json.loads(bytes(channel[parsed:end])))
                        except (ValueError, UnicodeDecodeError):
                            pass
                        parsed = end + 1
        # what the guard wrote before the child said "done" is in the alarm pipe already
        os.set_blocking(alarm_fd, False)
        while len(alarms) < _LOG_CAP:
            try:
                chunk = os.read(alarm_fd, 65536)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            alarms += chunk
    finally:
        sel.close()
        os.close(read_fd)
        os.close(alarm_fd)
        if done:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:  # not reaped: its pid is still its own
            reaper.kill_tree(proc.pid)  # what it started, in any session or group, while they are still below it
        kill(proc)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        proc.stdout.close()
        with lock:
            active.discard(proc)
            # orphans of this (or any finished) child, re-parented to the gradebook: ended before any row is written
            if since is not None:
                reaper.sweep(keep={p.pid for p in active}, since=since)
    text = log.decode("utf-8", "replace")
    if log_total > len(log):
        text += f"\n[output truncated: {log_total} bytes, kept {len(log)}]\n"
    alarm_text = bytes(alarms).decode("utf-8", "replace")
    if abused:
        return None, text, proc.returncode, timed_out, alarm_text
    messages = []
    for line in bytes(channel).decode("utf-8", "replace").splitlines():
        try:
            messages.append(json.loads(line))
        except json.JSONDecodeError:
            return None, text, proc.returncode, timed_out, alarm_text
    return messages, text, proc.returncode, timed_out, alarm_text
