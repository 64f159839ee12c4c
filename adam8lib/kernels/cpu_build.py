"""Building and loading the C++ CPU steps (:mod:`adam8lib.kernels.cpu`, :mod:`.cpu_formats`, :mod:`.cpu_rules`).

One shared library from ``csrc/step_cpu.cpp`` (one translation unit including ``simd.h``,
``codes8.h``, ``adam8bit.h``, ``adam4bit.h`` and ``rules.h``), no torch headers, called through ctypes.

How it is built
    On first use, with ``torch.utils.cpp_extension.load`` as a plain shared library (no torch
    headers, so a few seconds; a C++17 compiler and ninja are needed; flags
    ``-O3 -march=native -fopenmp -ffp-contract=off``). The build is cached under
    ``~/.cache/adam8lib/`` (or ``$ADAM8LIB_CACHE_DIR``), keyed by every source file, the flags, the
    torch and Python versions and the CPU model, so a later process just loads it. Builds take an
    ``flock`` that dies with its holder (a stale ``lock`` file left by a killed build is removed;
    a build by another process that runs longer than ``$ADAM8LIB_BUILD_LOCK_TIMEOUT`` seconds, 600
    by default, ends in a clear error instead of a hang). Importing never fails: where the kernel
    cannot be built (no compiler, no ninja, a compiler error, a torch whose rounding it cannot
    reproduce) the backends report ``supports() == False``, :func:`unavailable_reason` says why,
    and ``"auto"`` falls back to ``"torch"`` (with one warning for a failed build).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from .code_table import cache_root

__all__ = ["SOURCE", "SOURCES", "CFLAGS", "load_extension", "build_directory", "knockout_build", "using_build",
           "simd_level", "byte_planes", "supports", "unavailable_reason", "mark_unavailable"]

log = logging.getLogger(__name__)

#: The folder of the kernel sources.
CSRC = Path(__file__).with_name("csrc")
#: The translation unit that is compiled (it includes the headers next to it).
SOURCE = CSRC / "step_cpu.cpp"
#: Every file of the kernel (the build cache is keyed by all of them).
SOURCES = (SOURCE, *(CSRC / name for name in ("simd.h", "codes8.h", "adam8bit.h", "adam4bit.h", "rules.h")))
#: Compiler flags. -ffp-contract=off: the compiler must not fuse a*b+c on its own, since the
#: reference rounds them separately (the fused ones are written as std::fma in the source).
#: ``$ADAM8LIB_CPU_CFLAGS`` adds flags after these (the cache is keyed by them), e.g. ``-mno-avx512f``
#: to build the kernel as for a CPU without AVX-512 (the course's second-machine run does).
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno",
          *os.environ.get("ADAM8LIB_CPU_CFLAGS", "").split())
LDFLAGS = ("-fopenmp",)


def _toolchain_problem() -> str | None:
    """Why the extension cannot be built here (None if a compiler and ninja are found)."""
    from torch.utils.cpp_extension import is_ninja_available

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler!r} not on PATH; install g++ or set CXX)"
    if not is_ninja_available():
        return "ninja is not installed (pip install ninja)"
    if not SOURCE.is_file():
        return f"kernel source {SOURCE} is missing"
    return None

    if not all(path.is_file() for path in SOURCES):
        return f"kernel source {next(path for path in SOURCES if not path.is_file())} is missing"
    return None

#: whose rounding the kernel cannot reproduce, or the compiler's error. See unavailable_reason().
_unavailable: str | None = _toolchain_problem()


def unavailable_reason() -> str | None:
    """Why ``backend="cpu"`` cannot run on this machine, or None if it can.

    The reason names what is missing (a C++ compiler, ninja), or quotes the compiler's error
    if the build failed. Asking builds the kernel if it has not been built yet.
    """
    if _unavailable is None and _extension is None:
        try:
            load_extension()
        except RuntimeError:
            pass
    return _unavailable


def mark_unavailable(reason: str) -> None:
    """Turn the CPU backends off with ``reason`` (e.g. a torch build whose rounding cannot be reproduced)."""
    global _unavailable
    _unavailable = _unavailable or reason


# ---------------------------------------------------------------------------------------
# Building and loading the extension
# ---------------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags")):
                    return line + next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_directory() -> Path:
    """Where the compiled kernel is cached; a new folder for each source/flags/torch/CPU."""
    root = cache_root()
    tag = hashlib.sha256(
        "\n".join([*(path.read_text() for path in SOURCES), " ".join(CFLAGS + LDFLAGS), torch.__version__, sys.version, _cpu_model()]).encode()
    ).hexdigest()[:16]
    return Path(root) / f"cpu_step-py{sys.version_info[0]}{sys.version_info[1]}-{tag}"


_lock = threading.Lock()
_extension = None
#: Seconds a build waits for another process's build of the same kernel before giving up.
BUILD_LOCK_TIMEOUT = float(os.environ.get("ADAM8LIB_BUILD_LOCK_TIMEOUT", "600"))


@contextmanager
def _build_lock(directory: Path, timeout: float):
    """Hold an exclusive lock on ``directory`` for a build, waiting at most ``timeout`` seconds.

    torch's own build lock is a plain file (``lock``) that a build killed mid-compile leaves
    behind, and every later build then waits for it forever. This lock is ``flock`` on
    ``directory/build.flock``: the kernel releases it when its holder dies, so it can never go
    stale. Whoever holds it is the only process building here, so a ``lock`` file found then
    was left by a dead build: it is removed (with a warning). Where ``flock`` does not exist
    (Windows), a ``lock`` file older than ``timeout`` counts as stale.
    """
    stale = directory / "lock"
    try:
        import fcntl
    except ImportError:  # no flock: fall back to the age of torch's lock file
        if stale.exists() and time.time() - stale.stat().st_mtime > timeout:
            warnings.warn(f"adam8lib: removing a stale build lock {stale}", RuntimeWarning, stacklevel=3)
            stale.unlink(missing_ok=True)
        yield
        return
    with open(directory / "build.flock", "a+") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"another process has been building the adam8lib CPU kernel in {directory} for more than "
                        f"{timeout:.0f} s (ADAM8LIB_BUILD_LOCK_TIMEOUT); if no such build is running, delete that "
                        "folder and retry"
                    ) from None
                time.sleep(0.1)
        try:
            if stale.exists():
                warnings.warn(f"adam8lib: removing a stale build lock left by an interrupted build: {stale}",
                              RuntimeWarning, stacklevel=3)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def load_extension() -> ctypes.CDLL:
    """Build (first time, a few seconds) or load the compiled kernel.

    RuntimeError naming the reason if it cannot (no compiler or ninja, the compiler's error, a
    build of the same kernel by another process that does not finish within
    :data:`BUILD_LOCK_TIMEOUT` seconds); the same error on every later call.
    """
    global _extension, _unavailable
    with _lock:
        if _extension is not None:
            return _extension
        if _unavailable is not None:
            raise RuntimeError(f"adam8lib cpu backend unavailable: {_unavailable}")
        directory = build_directory()
        try:
            log.info("adam8lib: building/loading the CPU kernel in %s", directory)
            lib = _build(directory, "adam8lib_cpu_step", ())
        except Exception as exc:  # compiler errors arrive as RuntimeError/OSError/CalledProcessError
            _unavailable = f"building the kernel failed: {type(exc).__name__}: {exc}"
            raise RuntimeError(f"adam8lib cpu backend unavailable: {_unavailable}") from exc
        _extension = lib
        return lib


def _build(directory: Path, name: str, defines: tuple[str, ...]) -> ctypes.CDLL:
    """Compile (or reuse) the kernel in ``directory`` under the build lock, with ``-D`` for each of
    ``defines``, as a plain shared library (no Python module, no torch headers: quick to build),
    and load it with its entry points declared."""
    from torch.utils.cpp_extension import load

    directory.mkdir(parents=True, exist_ok=True)
    with _build_lock(directory, BUILD_LOCK_TIMEOUT):
        path = load(name=name, sources=[str(SOURCE)],
                    extra_cflags=[*CFLAGS, *("-D" + d for d in defines)],  # fresh lists: torch appends to them
                    extra_ldflags=list(LDFLAGS), build_directory=str(directory), is_python_module=False,
                    verbose=False)
    lib = ctypes.CDLL(path)
    _declare(lib)
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    """The ctypes signatures of the step entry points."""
    ptr, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    lib.adam8bit_step_cpu.argtypes = [ptr, ptr, i32, i32, ptr, ptr, ptr, ptr, i64, i64,
                                      ptr, ptr, i32, ptr, ptr, i32,
                                      f32, f32, f32, f32, f32, f32, f32, f32, f32,
                                      i32, i32, ptr, i64, i32, i32, i32]
    lib.adam8bit_step_cpu.restype = i32
    lib.adam8bit_step_cpu_many.argtypes = [i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64,
                                           ptr, ptr, i32, ptr, ptr, i32,
                                           f32, f32, f32, f32, ptr, ptr, f32, ptr, ptr,
                                           i32, i32, ptr, i64, i32, i32, i32]
    lib.adam8bit_step_cpu_many.restype = i32
    lib.adam4bit_step_cpu.argtypes = [ptr, ptr, i32, i32, ptr, ptr, ptr, ptr, i64, i64, i64, i64,
                                      ptr, ptr, i32, ptr, ptr, i32,
                                      f32, f32, f32, f32, f32, f32, f32, f32, i32, ptr, i64, i32, i32, i32]
    lib.adam4bit_step_cpu.restype = i32
    lib.rule_step_cpu.argtypes = [i32, ptr, ptr, i32, i32, i64, i64, i32, ptr, ptr, ptr, ptr, ptr, ptr, i32,
                                  i32, ptr, i64, i32, i32, i32]
    lib.rule_step_cpu.restype = i32


def knockout_build(define: str) -> ctypes.CDLL:
    """A separate build of the kernel with the preprocessor symbol ``define`` set (cached next to
    the real one), for ``bench/profile_step.py``'s knock-out rows: such a build leaves out a piece
    of work to time what it costs, and its results are wrong on purpose. Never used by a
    backend; :func:`using_build` runs the backend's functions on it for a while."""
    if not define.isidentifier():
        raise ValueError(f"define must be a C identifier, got {define!r}")
    real = build_directory()
    return _build(real.with_name(f"{real.name}-{define.lower()}"), f"adam8lib_cpu_step_{define.lower()}", (define,))


@contextmanager
def using_build(lib: ctypes.CDLL):
    """Run this module's step functions on ``lib`` (a :func:`knockout_build`) inside the block."""
    global _extension
    real = load_extension()
    _extension = lib
    try:
        yield
    finally:
        _extension = real


def simd_level() -> int:
    """The widest SIMD loops the built kernel has: 0 scalar only, 1 AVX2, 2 AVX-512."""
    return int(load_extension().adam8bit_cpu_simd_level())


def byte_planes() -> bool:
    """True if the AVX-512 loops dequantize with byte shuffles (AVX-512 VBMI) instead of gathers."""
    return bool(load_extension().adam8bit_cpu_byte_planes())


def supports(device: torch.device) -> bool:
    """True for CPU devices once the kernel is built (builds it on the first CPU query).

    False, with the reason in :func:`unavailable_reason`, where it cannot be built; a failed
    build is also reported once as a warning.
    """
    if torch.device(device).type != "cpu":
        return False
    if _extension is not None:
        return True
    if _unavailable is not None:
        return False
    try:
        load_extension()
    except RuntimeError as exc:
        warnings.warn(f"{exc}; falling back to the 'torch' backend", RuntimeWarning, stacklevel=2)
        return False
    return True
