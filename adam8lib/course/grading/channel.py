"""The gradebook's side of a grading child: start it, feed it its job, read what it says, end it.

:func:`converse` starts the command (in its own session), writes the job to its stdin from a
thread, and reads two pipes with one selector until the child says ``done``, both pipes close,
or the deadline passes — every read waits at most until the deadline, so a child (or a
grandchild holding a pipe open) can never block the gradebook. The result pipe is created here;
the child gets only its write end (``{fd}`` in the command). Its combined stdout/stderr is kept
up to 256 KiB; more than 1 MiB on the result pipe is abuse. Afterwards the whole process group
is killed (stray processes of the learner) and the child reaped.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import threading
import time

__all__ = ["converse", "kill", "died", "signal_name"]

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


def converse(cmd, env, cwd, job: bytes, deadline: float, active: set, lock: threading.Lock):
    """Run one child; return (messages, or None if the channel was abused; log; returncode; timed_out).

    ``{fd}`` in ``cmd`` becomes the child's end of the result pipe. The job goes in through stdin
    (from a thread); every read waits at most until ``deadline``; the log is capped.
    """
    read_fd, write_fd = os.pipe()
    cmd = [str(write_fd) if part == "{fd}" else part for part in cmd]
    try:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, pass_fds=(write_fd,), start_new_session=True)  # fmt: skip
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return _collect(proc, read_fd, job, deadline, active, lock)


def _collect(proc, read_fd, job, deadline, active, lock):
    with lock:
        active.add(proc)

    def feed():
        try:
            proc.stdin.write(job)
            proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass

    threading.Thread(target=feed, daemon=True).start()
    channel, log, log_total = bytearray(), bytearray(), 0
    abused, done, timed_out = False, False, False
    sel = selectors.DefaultSelector()
    sel.register(read_fd, selectors.EVENT_READ, "channel")
    sel.register(proc.stdout, selectors.EVENT_READ, "log")
    try:
        while sel.get_map() and not done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=min(remaining, 1.0)):
                fd = read_fd if key.data == "channel" else proc.stdout.fileno()
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                if key.data == "log":
                    log_total += len(chunk)
                    log += chunk[: max(0, _LOG_CAP - len(log))]
                else:
                    channel += chunk
                    if len(channel) > _CHANNEL_CAP:
                        abused = done = True
                    elif b"\"kind\": \"done\"" in channel:
                        done = True
    finally:
        sel.close()
        os.close(read_fd)
        if done:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        kill(proc)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        proc.stdout.close()
        with lock:
            active.discard(proc)
    text = log.decode("utf-8", "replace")
    if log_total > len(log):
        text += f"\n[output truncated: {log_total} bytes, kept {len(log)}]\n"
    if abused:
        return None, text, proc.returncode, timed_out
    messages = []
    for line in bytes(channel).decode("utf-8", "replace").splitlines():
        try:
            messages.append(json.loads(line))
        except json.JSONDecodeError:
            return None, text, proc.returncode, timed_out
    return messages, text, proc.returncode, timed_out
