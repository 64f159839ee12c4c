"""Ending a learner's whole process tree, sandbox or not (Linux ``/proc`` and ``prctl``).

Without bubblewrap (``--sandbox none``) a learner's code can start processes that leave the grading
child's process group and session (``os.setsid``) and, by forking twice, its tree: the orphan is
re-parented — to init, out of the gradebook's reach, unless an ancestor is a *child subreaper*
(``prctl(PR_SET_CHILD_SUBREAPER)``, Linux ≥ 3.4). So the gradebook (and the check process, for its
learner processes) makes itself one: every orphan of a grading child becomes its own child. After
each grading child it ends the child's descendants (:func:`kill_tree`, found through ``/proc``) and
then every process that became its child without being started by it (:func:`sweep`), and reaps
them, before the learner's row is written.

Processes started before the grader (``since``, in clock ticks since boot) are never touched: a
program that runs the gradebook in its own process (a test) keeps its other children.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

__all__ = ["become_subreaper", "release_subreaper", "now", "descendants", "kill_tree", "sweep"]

PR_SET_CHILD_SUBREAPER = 36
_users = 0
_users_lock = threading.Lock()


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (counted: :func:`release_subreaper` undoes
    it when the last user is done). False where the system has no such thing (then only process groups and
    the descendants still linked to their parents are ended)."""
    global _users
    with _users_lock:
        _users += 1
        return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def release_subreaper() -> None:
    global _users
    with _users_lock:
        _users = max(0, _users - 1)
        if _users == 0:
            _prctl(PR_SET_CHILD_SUBREAPER, 0)


def now() -> int:
    """The current time in the unit of a process's start time in ``/proc/<pid>/stat`` (clock ticks since boot)."""
    try:
        with open("/proc/uptime", encoding="ascii") as fh:
            return int(float(fh.read().split()[0]) * os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        return 0


def _table() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, start time)} of every process this one can see."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                data = fh.read()
            fields = data[data.rindex(b")") + 2:].split()  # after "pid (comm) ": state, ppid, ..., starttime
            table[int(name)] = (int(fields[1]), int(fields[19]))
        except (OSError, ValueError, IndexError):
            continue
    return table


def descendants(pid: int, table: dict | None = None) -> list[int]:
    """Every process below ``pid`` (children, their children, …)."""
    table = _table() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tree(pid: int, rounds: int = 20) -> None:
    """SIGKILL every descendant of ``pid`` (not ``pid`` itself), again until none is left (a process forking
    while it is being killed leaves orphans, which :func:`sweep` finds)."""
    for _ in range(rounds):
        found = descendants(pid)
        if not found:
            return
        for child in found:
            _kill(child)


def sweep(keep=(), since: int = 0, rounds: int = 100) -> int:
    """Kill and reap every child of this process that it did not start (an orphan re-parented to it as the
    subreaper), with everything below it: children whose pid is in ``keep`` (the grader's own, running) or
    that started before ``since`` are left alone. Returns how many were ended."""
    me, ended = os.getpid(), 0
    for _ in range(rounds):
        table = _table()
        strays = [pid for pid, (parent, started) in table.items()
                  if parent == me and pid not in keep and started >= since]  # fmt: skip
        if not strays:
            break
        for pid in strays:
            for below in descendants(pid, table):
                _kill(below)
            _kill(pid)
        deadline = time.monotonic() + 5
        for pid in strays:
            while True:
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    break
                if done or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        ended += len(strays)
    return ended
