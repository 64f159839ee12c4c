"""Where a learner's code runs when the gradebook grades it: a bubblewrap sandbox, else a child process.

:func:`wrap` turns the command of one grading child into the command that runs it confined:

* ``prlimit`` caps the child's address space (``--as``, the memory limit), the size of any file
  it writes (``--fsize``) and core dumps (util-linux; without it the caps are not applied and
  :func:`wrap` says so);
* with **bubblewrap** (``bwrap``; Debian/Ubuntu package ``bubblewrap``) the child sees a *learner view* of the
  machine, read-only: the system's folders (:data:`SYSTEM`: ``/usr``, ``/etc``, ``/lib``…), the Python
  environment (the interpreter's prefixes and every folder on its ``sys.path``), the installed package and
  the ``PYTHONPATH`` entries, and its own empty scratch folder (read-write, its ``HOME`` and ``TMPDIR``, in a
  private ``/tmp``). Every other top-level folder (``/root``, ``/home``, ``/work``, ``/srv``, ``/opt``, ``/var``,
  ``/mnt``…: other clones of the course, home folders) is an empty read-only folder, and so are the folders in
  ``hide`` (the submissions, the gradebook's output folder) and the course repository (solutions/, exercises/,
  tests/, .git, …) around the package bound back. It runs in new user, PID,
  network, IPC and UTS namespaces as ``nobody`` with no capabilities, so it cannot see or signal
  the gradebook or any other process, has no network, and every process it starts dies with it
  (``--die-with-parent``; the PID namespace ends when the child exits).

:func:`available` answers whether bubblewrap works here (it needs user namespaces, or root).
Without it (mode ``"none"``) the child is only a separate process in its own session with the
caps above: learners' code can then read and write whatever the grader's account can, so grade
untrusted work in a container (README, *Grading a class*) or install bubblewrap.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["available", "wrap", "repository_root", "MODES"]

MODES = ("auto", "bwrap", "none")
_NOBODY = "65534"
#: The learner's scratch folder inside the sandbox.
SANDBOX_HOME = "/tmp/learner"
#: The top-level folders of the machine the sandbox shows as they are (read-only): the system's. Every other
#: top-level folder is covered, with what the learner's Python needs from inside it bound back.
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys", "/nix", "/gnu")


@functools.lru_cache(maxsize=None)
def available() -> str | None:
    """None when bubblewrap runs a confined command here, else the reason it cannot."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    probe = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all",
             "--unshare-user", "--uid", _NOBODY, "--gid", _NOBODY, "--cap-drop", "ALL", "--die-with-parent", "true"]  # fmt: skip
    try:
        proc = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap failed to start: {exc}"
    if proc.returncode != 0:
        return f"bwrap cannot create a sandbox here (user namespaces disabled?): {proc.stderr.strip()[:200]}"
    return None


def repository_root() -> Path | None:
    """The course repository when adam8lib is installed from a checkout (editable), else None."""
    import adam8lib

    root = Path(adam8lib.__file__).resolve().parents[1]
    return root if (root / "solutions").is_dir() or (root / ".git").exists() else None


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def _unshown() -> list[Path]:
    """The top-level folders of the machine that the learner view covers: every folder of ``/`` but the system's
    (:data:`SYSTEM`), ``/dev``, ``/proc`` and ``/tmp`` (which the sandbox makes its own). A symbolic link is
    left alone: where it leads is shown or covered by its own name."""
    out = []
    for entry in sorted(Path("/").iterdir()):
        try:
            if entry.is_symlink() or not entry.is_dir():
                continue
        except OSError:
            continue
        if str(entry) not in (*SYSTEM, "/dev", "/proc", "/tmp"):
            out.append(entry)
    return out


def _bound_back(hidden: list[Path], keep_out: list[Path] = ()) -> list[tuple[Path, Path]]:
    """What the child needs from inside hidden folders, as ``(path, where it is bound)``: the package,
    the Python environment (the interpreter's prefixes, the folders on its ``sys.path``) and the ``PYTHONPATH``
    entries, each at its resolved path and also at the path it is named by when that one goes through a symbolic
    link the sandbox would not show (a virtual environment reached through a link: its interpreter and
    ``pyvenv.cfg`` are found there). A folder that holds a hidden one (the course repository, on ``sys.path`` for
    an editable install, as the working folder or on ``PYTHONPATH``; ``keep_out``) is never bound back: only what
    lies inside it is."""
    import adam8lib

    named = [Path(adam8lib.__file__).parent, Path(sys.executable).parent.parent]
    named += [Path(entry) for entry in [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
                                        *os.environ.get("PYTHONPATH", "").split(os.pathsep), *sys.path] if entry]
    binds: dict[Path, Path] = {}
    for name in named:
        real = name.resolve()
        if not real.exists() or (real.is_file() and real.suffix != ".zip"):
            continue
        if any(_inside(h, real) for h in [*hidden, *keep_out]):
            continue  # (is or holds a hidden folder: "/", the repository, a home folder)
        if any(_inside(real, h) and real != h for h in hidden):
            binds[real] = real
        shown = Path(os.path.abspath(name))
        if shown != real and any(_inside(shown, h) and shown != h for h in hidden):
            binds[shown] = real
    pairs = [(real, where) for where, real in binds.items()]
    # (a folder bound at its own path inside another bound at its own path is already there)
    pairs = [(real, where) for real, where in pairs
             if not (real == where and any(r == w and r != real and _inside(real, r) for r, w in pairs))]
    return sorted(pairs, key=lambda pair: (len(pair[1].parts), str(pair[1])))


def wrap(
    argv: list[str],
    *,
    scratch: Path,
    hide: list[Path] = (),
    mode: str = "auto",
    memory_mb: int | None = None,
    file_mb: int | None = None,
    conceal: list[tuple[Path, list[str]]] = (),
    replace: list[tuple[Path, Path]] = (),
) -> tuple[list[str], str, Path]:
    """The confined command for ``argv``, the mode used (``"bwrap"`` or ``"none"``), and the
    path of ``scratch`` as the child sees it (its working folder, ``HOME`` and ``TMPDIR``).

    ``conceal``: ``(folder, kept)`` pairs — under bubblewrap each folder (inside what is bound back, e.g. the
    package's ``course/checks``) is covered by an empty read-only folder that shows only the files named in
    ``kept`` (without a sandbox nothing can be concealed).

    ``mode="bwrap"`` raises RuntimeError when bubblewrap does not work; ``"auto"`` falls back
    to ``"none"`` (the gradebook itself never asks for ``auto``: it refuses to grade without a
    sandbox unless told ``--sandbox none``).
    """
    if mode not in MODES:
        raise ValueError(f"sandbox mode must be one of {MODES}, got {mode!r}")
    used = "none"
    if mode != "none":
        reason = available()
        if reason is None:
            used = "bwrap"
        elif mode == "bwrap":
            raise RuntimeError(f"--sandbox bwrap: {reason}")
    cmd, workdir = list(argv), scratch
    if used == "bwrap":
        workdir = Path(SANDBOX_HOME)
        box = [shutil.which("bwrap"), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
               "--unshare-all", "--unshare-user", "--uid", _NOBODY, "--gid", _NOBODY, "--cap-drop", "ALL",
               "--die-with-parent", "--new-session"]  # fmt: skip
        covered = {Path(p).resolve() for p in hide if Path(p).exists()}
        root = repository_root()
        if root is not None:
            covered.add(root)
        covered.update(_unshown())
        tmp = Path("/tmp")
        covered = sorted((p for p in covered if not _inside(p, tmp)), key=lambda p: len(p.parts))
        for path in covered:
            box += ["--tmpfs", str(path)]
        box += ["--tmpfs", "/tmp"]  # a private /tmp: hides every other learner's scratch folder
        for path, where in _bound_back([*covered, tmp], keep_out=[root] if root is not None else []):
            box += ["--ro-bind", str(path), str(where)]
        box += ["--bind", str(scratch.resolve()), SANDBOX_HOME]
        concealed = []
        for folder, kept in conceal:
            folder = Path(folder).resolve()
            if not folder.is_dir():
                continue
            box += ["--tmpfs", str(folder)]
            for name in kept:
                if (folder / name).is_file():
                    box += ["--ro-bind", str(folder / name), str(folder / name)]
            concealed.append(folder)
        for file, original in replace:
            if Path(original).is_file():
                box += ["--ro-bind", str(Path(file).resolve()), str(original)]
        for path in [*covered, *concealed]:
            box += ["--remount-ro", str(path)]
        box += ["--chdir", SANDBOX_HOME, "--"]
        cmd = box + cmd
    limits = []
    if memory_mb:
        limits.append(f"--as={int(memory_mb) * 2**20}")
    if file_mb:
        limits.append(f"--fsize={int(file_mb) * 2**20}")
    if limits and shutil.which("prlimit"):
        cmd = [shutil.which("prlimit"), *limits, "--core=0", "--", *cmd]
    return cmd, used, workdir
