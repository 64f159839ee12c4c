"""The ``"cpu"`` and ``"cpu_fast"`` backends: the 8-bit Adam step as a small C++ kernel (OpenMP + SIMD).

The same kernel is the ``"cpu"`` step of the other state formats (:mod:`adam8lib.kernels.cpu_lowbit`,
registered from here): ``"fp8"`` runs the 8-bit loops unchanged with FP8's 256 code values as the
map and a table sampled from the format's code function; ``"4bit"``/``"4bit-naive"`` run a 4-bit
loop of the same source (two codes per byte, rank-1 scales for ``v`` of a matrix) on the same
per-element helpers. Both are bit for bit the reference step of their format.

``"cpu"``: the same maths as :mod:`adam8lib.kernels.reference`, bit for bit (codes, absmax,
parameters), in one pass over memory per block instead of a dozen chunk-sized temporaries
(bench/README.md has the numbers). ``"cpu_fast"`` (``exact=False``, asked for by name, never
picked by ``"auto"``): the same codes and absmax, but the parameter update uses the IEEE
square root and a multiply by ``1/sqrt(1 - beta2^t)`` instead of torch's MKL square root and a
division, so the parameters differ from the reference by about an ulp (tolerance tested). The
kernel is ``csrc/adam8bit_cpu.cpp``; read it next to the reference: each scalar line there is
one line of the reference, and the AVX2/AVX-512 loops do the same 8 or 16 elements at a time.

How it is built
    On first use, with ``torch.utils.cpp_extension.load`` as a plain shared library (no torch
    headers, so a few seconds; a C++17 compiler and ninja are needed; flags
    ``-O3 -march=native -fopenmp -ffp-contract=off``), called through ctypes. The build is
    cached under ``~/.cache/adam8lib/`` (or ``$ADAM8LIB_CACHE_DIR``), keyed by the source, the
    flags, the torch and Python versions and the CPU model, so a later process just loads it,
    together with the nearest-code tables of each map. Builds take an ``flock`` that dies with
    its holder (a stale ``lock`` file left by a killed build is removed; a build by another
    process that runs longer than ``$ADAM8LIB_BUILD_LOCK_TIMEOUT`` seconds, 600 by default,
    ends in a clear error instead of a hang). Importing never fails: where the kernel cannot
    be built (no compiler, no ninja, a compiler error, a torch whose rounding it cannot
    reproduce) the backends report ``supports() == False``, :func:`unavailable_reason` says
    why, and ``"auto"`` falls back to ``"torch"`` (with one warning for a failed build).

Safe to call from anywhere
    Every scalar goes to C by value; the only pointers are the data of the tensors passed in
    (and of the cached tables), alive for the call. Anything the kernel must not read (a
    tensor subclass such as DTensor, a meta, sparse or non-contiguous tensor) raises
    TypeError/ValueError first. Under ``torch.compile`` the step runs eagerly
    (``torch.compiler.disable``: a graph break).

Exact nearest code, fast
    :mod:`adam8lib.kernels.code_table` samples the reference's ``nearest_code`` once per map
    (or any code function: :func:`~adam8lib.kernels.code_table.encode_table`, as FP8 and 4 bits do)
    into a table indexed by the top 16 bits of a sortable key of ``x``; the kernel needs one
    table load and one integer compare per value and returns exactly the reference's code.
    Dequantizing needs no gather on CPUs with AVX-512 VBMI: the map's 256 fp32 values are
    held as four byte planes and looked up 64 codes at a time with byte shuffles.

The non-finite rule
    An element whose new ``m`` or ``v`` is not finite (a NaN/Inf gradient, or one so large
    that ``g*g`` overflows) restarts from ``m = v = 0`` and keeps its parameter, as in the
    reference; absmax is taken after that, so it stays finite.

Rounding
    torch's ``add_(g, alpha=a)`` and ``addcmul_`` use fused multiply-adds on AVX2/AVX-512
    builds (:func:`torch_uses_fma` asks this torch build once), and ``torch.sqrt`` on x86
    Linux wheels is Intel MKL's ``vmsSqrt``, which is not always correctly rounded
    (:func:`torch_sqrt` finds it); the kernel does the same, so even the parameters match:
    with AVX-512 it computes MKL's algorithm inline (MKL has one for Intel's AVX-512 CPUs and
    another for the rest, AMD's included; :func:`mkl_sqrt_inline` finds the one that equals
    ``torch.sqrt`` bit for bit here), else it calls ``vmsSqrt`` on each tile.
"""

from __future__ import annotations

import ctypes
import functools
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

import numpy
import torch

from ..quant import num_blocks
from . import register_backend
from .contract import check_each, check_step, check_step_args
from .reference import bias_corrections, probe_inputs, torch_uses_fma
from .code_table import BUCKET_BITS, CodeTable, cache_root, code_table  # noqa: F401 (re-exported)

__all__ = ["adam8bit_step", "adam8bit_step_fast", "adam8bit_step_many", "code_table", "CodeTable", "torch_uses_fma", "load_extension",
           "supports", "unavailable_reason", "SOURCE"]

log = logging.getLogger(__name__)

#: The kernel source.
SOURCE = Path(__file__).with_name("csrc") / "adam8bit_cpu.cpp"
#: Compiler flags. -ffp-contract=off: the compiler must not fuse a*b+c on its own, since the
#: reference rounds them separately (the fused ones are written as std::fma in the source).
#: ``$ADAM8LIB_CPU_CFLAGS`` adds flags after these (the cache is keyed by them), e.g. ``-mno-avx512f``
#: to build the kernel as for a CPU without AVX-512 (the course's second-machine run does).
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno",
          *os.environ.get("ADAM8LIB_CPU_CFLAGS", "").split())
LDFLAGS = ("-fopenmp",)

#: dtype codes of the C entry point
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


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


#: Why this backend cannot run here (None while it can): no compiler, no ninja, a torch build
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
        "\n".join([SOURCE.read_text(), " ".join(CFLAGS + LDFLAGS), torch.__version__, sys.version, _cpu_model()]).encode()
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
    """The ctypes signatures of the two step entry points."""
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


# ---------------------------------------------------------------------------------------
# Matching torch's rounding
# ---------------------------------------------------------------------------------------
#: The mode torch passes to MKL's vector math (VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE).
MKL_VML_MODE = 0x2 | 0x140000 | 0x100


@functools.lru_cache(maxsize=None)
def torch_sqrt() -> tuple[int | None, str]:
    """How this torch build computes ``torch.sqrt`` on fp32: ``(None, "ieee")`` when it is the
    correctly rounded square root, ``(address of vmsSqrt, "mkl")`` when it is Intel MKL's
    vector sqrt (x86 Linux wheels), which is not always correctly rounded. ImportError if
    neither reproduces it (then the kernel could not match the reference bit for bit)."""
    gen = torch.Generator().manual_seed(1)
    # v-like values, and random bit patterns over every non-negative finite float (denormals included):
    # MKL's generic code (AMD CPUs, or MKL_ENABLE_INSTRUCTIONS=AVX2) is correctly rounded on [0, 1]
    # samples but not on about 1 in 1,200 patterns of the whole range, so a narrow probe would take
    # it for the IEEE root
    patterns = torch.randint(0, 0x7F800000, (1 << 18,), generator=gen, dtype=torch.int32).view(torch.float32)
    x = torch.cat([probe_inputs()[2], torch.rand(4099, generator=gen) ** 4, patterns])
    expected = torch.sqrt(x)
    if bool((torch.from_numpy(numpy.sqrt(x.numpy())) == expected).all()):
        return None, "ieee"
    for lib_name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
        path = Path(torch.__file__).parent / "lib" / lib_name
        if not path.exists():
            continue
        try:
            vms_sqrt = ctypes.CDLL(str(path)).vmsSqrt
        except (OSError, AttributeError):
            continue
        vms_sqrt.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        vms_sqrt.restype = None
        out = torch.empty_like(x)
        vms_sqrt(x.numel(), x.data_ptr(), out.data_ptr(), MKL_VML_MODE)
        if torch.equal(out, expected):
            return ctypes.cast(vms_sqrt, ctypes.c_void_p).value, "mkl"
    raise ImportError("torch.sqrt is neither IEEE sqrt nor MKL's vmsSqrt here; cpu backend disabled")


MKL_ROOTS = {1: "MKL's AVX-512 code (vrsqrt14ps, one fused correction)",
              2: "MKL's generic SSE code (rsqrtps, two Newton steps without fused multiply-adds)"}


@functools.lru_cache(maxsize=None)
def mkl_sqrt_inline() -> int:
    """Which of MKL's square-root algorithms the kernel may compute inline instead of calling
    ``vmsSqrt`` per tile: 0 for none, else a key of :data:`MKL_ROOTS`. MKL chooses its code
    path by CPU (its AVX-512 code on Intel CPUs with AVX-512, its generic SSE code on others,
    AMD's included), so each is tried: it is used only if torch uses MKL's sqrt, the build has
    the loops it needs (AVX-512 for the first, AVX2 for the second), and the inline version
    equals ``torch.sqrt`` bit for bit on every probe: a million
    random non-negative bit patterns, every denormal, the range below 2^-78 where the AVX-512
    code rescales, the largest floats (where the SSE code takes its scalar path), powers of two
    and their neighbours, zeros and infinity."""
    if torch_sqrt()[1] != "mkl" or simd_level() < 1:
        return 0
    gen = torch.Generator().manual_seed(2)
    bits = torch.randint(0, 0x7F800001, (1 << 20,), generator=gen, dtype=torch.int64).to(torch.int32)
    denormals = torch.arange(1, 0x800000, dtype=torch.int32)
    largest = torch.arange(0x7F7FE000, 0x7F800000, dtype=torch.int32)
    powers = torch.tensor([2.0**k for k in range(-149, 128)], dtype=torch.float32)
    x = torch.cat([bits.view(torch.float32), denormals.view(torch.float32), largest.view(torch.float32), powers,
                   torch.nextafter(powers, torch.tensor(0.0)), torch.nextafter(powers, torch.tensor(float("inf"))),
                   torch.rand(4096, generator=gen) * 2.0**-70, torch.tensor([0.0, -0.0, 1e-45, float("inf")])])
    expected = torch.sqrt(x).view(torch.int32)
    out = torch.empty_like(x)
    for root in MKL_ROOTS:  # (-1: no inline version of that one in this build)
        if load_extension().adam8bit_cpu_mkl_sqrt_inline(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                                                          ctypes.c_int64(x.numel()), ctypes.c_int(root)) != 0:
            continue
        if torch.equal(out.view(torch.int32), expected):
            return root
    return 0


# ---------------------------------------------------------------------------------------
# The step
# ---------------------------------------------------------------------------------------

_NAMES = ("p", "g", "state1", "state2", "absmax1", "absmax2", "qmap1", "qmap2")


def _check(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, blocksize, *, maps_checked=False) -> None:
    """TypeError/ValueError for anything the kernel must not touch, before any data pointer is read:
    the shared backend contract (:func:`adam8lib.kernels.contract.check_step_args`), plus CPU tensors
    whose memory is really there (``maps_checked``: the caller checked qmap1/qmap2's memory once
    for several calls)."""
    check_step_args(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, blocksize=blocksize)
    if p.device.type != "cpu":
        raise ValueError(f"the cpu backend needs CPU tensors; p is on {p.device}")
    if p.numel():
        tensors = (p, g, state1, state2, absmax1, absmax2) if maps_checked else (
            p, g, state1, state2, absmax1, absmax2, qmap1, qmap2)
        for name, t in zip(_NAMES, tensors):
            _check_memory(t, name)


def _check_memory(t: torch.Tensor, name: str) -> None:
    """ValueError if ``t`` has elements but its storage has no memory (freed, e.g. by
    ``untyped_storage().resize_(0)`` as FSDP does between uses): the kernel would read address 0.
    Cheap first test: the data pointer is the storage's plus the offset, so it can only equal the
    offset alone when the storage's pointer is 0."""
    if t.data_ptr() == t.storage_offset() * t.element_size() and t.numel() and t.untyped_storage().data_ptr() == 0:
        raise ValueError(f"{name} has no storage (data pointer 0): its memory was freed")


@torch.compiler.disable
@torch.no_grad()
def adam8bit_step(
    p: torch.Tensor,
    g: torch.Tensor,
    state1: torch.Tensor,
    state2: torch.Tensor,
    absmax1: torch.Tensor,
    absmax2: torch.Tensor,
    qmap1: torch.Tensor,
    qmap2: torch.Tensor,
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    blocksize: int,
    chunk_size: int | None = None,  # accepted for the reference's signature; blocks are the unit here
    simd: int | None = None,
    exact: bool = True,
) -> None:
    """One 8-bit Adam/AdamW step, in place, on flat contiguous CPU tensors (see the reference).

    ``exact=True`` (the ``"cpu"`` backend): bit-identical to the reference backend, parameters
    included. ``exact=False`` (the ``"cpu_fast"`` backend): the same codes and absmax (the
    moments are computed identically), but the parameter update uses the IEEE square root and
    multiplies by ``1/sqrt(1 - beta2^t)`` (fused with ``+ eps``) instead of torch's MKL square
    root and a division; the parameters then differ from the reference by about an ulp of the
    update (tests/kernels/test_cpu.py states the tolerance).

    ``simd`` picks the kernel's loops: 0 scalar only, 1 AVX2, 2 AVX-512, None the best this
    build has (:func:`simd_level`). They all give the same result (tested).

    Runs eagerly under ``torch.compile`` (``torch.compiler.disable``: a graph break), so it
    always sees real tensors; every scalar goes to C by value.
    """
    _check(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, blocksize)
    check_step(step)
    lib = load_extension()
    tables, maps, modes = _shared_args(qmap1, qmap2, exact, simd)  # (tables: kept alive for the call)
    g = _kernel_grad(p, g)
    decay, bias_correction2_sqrt, neg_step_size, inv_bc2_sqrt = _scalars(step, lr, beta1, beta2, weight_decay)
    status = lib.adam8bit_step_cpu(
        p.data_ptr(), g.data_ptr(), _DTYPE_CODES[p.dtype], _DTYPE_CODES[g.dtype],
        state1.data_ptr(), state2.data_ptr(), absmax1.data_ptr(), absmax2.data_ptr(), p.numel(), blocksize, *maps,
        beta1, 1.0 - beta1, beta2, 1.0 - beta2, decay, bias_correction2_sqrt, eps, neg_step_size, inv_bc2_sqrt,
        *modes,
    )
    if status != 0:
        raise RuntimeError(f"cpu kernel rejected its arguments (status {status})")


@torch.compiler.disable
@torch.no_grad()
def adam8bit_step_many(
    tensors,
    qmap1: torch.Tensor,
    qmap2: torch.Tensor,
    *,
    steps,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    blocksize: int,
    simd: int | None = None,
    exact: bool = True,
) -> None:
    """:func:`adam8bit_step` for several tensors in one call into the kernel.

    ``tensors``: a sequence of ``(p, g, state1, state2, absmax1, absmax2)``, each as
    :func:`adam8bit_step` takes them; ``steps``: each one's step count. The maps and the other
    hyperparameters are shared (one parameter group). Every tensor is checked before any is
    changed (TypeError/ValueError naming the tensor's position); each is then stepped exactly
    as :func:`adam8bit_step` would step it, bit for bit. What this saves is Python: one call
    for the group instead of one per tensor (see "Each parameter tensor's own cost" in
    bench/README.md).
    """
    tensors, steps = check_each(tensors, steps,
                                lambda item, step: _check(*item, qmap1, qmap2, blocksize, maps_checked=True))
    if not tensors:
        return
    _check_memory(qmap1, "qmap1")  # once for all tensors (the contract checked them with each)
    _check_memory(qmap2, "qmap2")
    lib = load_extension()
    tables, maps, modes = _shared_args(qmap1, qmap2, exact, simd)  # (tables: kept alive for the call)
    grads = [_kernel_grad(p, g) for p, g, *_ in tensors]  # (kept alive for the call)
    count = len(tensors)
    pointers = [(ctypes.c_void_p * count)(*(t.data_ptr() for t in column))
                for column in zip(*((item[0], grad, *item[2:]) for item, grad in zip(tensors, grads)))]
    scalars = [_scalars(step, lr, beta1, beta2, weight_decay) for step in steps]
    decay, bc2_sqrt, neg_step, inv_bc2_sqrt = ((ctypes.c_float * count)(*column) for column in zip(*scalars))
    status = lib.adam8bit_step_cpu_many(
        count, pointers[0], pointers[1],
        (ctypes.c_int * count)(*(_DTYPE_CODES[item[0].dtype] for item in tensors)),
        (ctypes.c_int * count)(*(_DTYPE_CODES[grad.dtype] for grad in grads)),
        *pointers[2:], (ctypes.c_int64 * count)(*(item[0].numel() for item in tensors)), blocksize, *maps,
        beta1, 1.0 - beta1, beta2, 1.0 - beta2, decay, bc2_sqrt, eps, neg_step, inv_bc2_sqrt, *modes,
    )
    if status != 0:
        raise RuntimeError(f"cpu kernel rejected its arguments (status {status})")


def _kernel_grad(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The gradient as the kernel reads it: p's dtype or fp32 (exact for bf16/fp16; fp64 grads
    round as the reference's ``g.float()`` does)."""
    return g.float() if g.dtype != p.dtype and g.dtype != torch.float32 else g


def _shared_args(qmap1: torch.Tensor, qmap2: torch.Tensor, exact: bool, simd: int | None) -> tuple[tuple, tuple, tuple]:
    """The kernel arguments every call shares: the two maps with their nearest-code tables (both
    states keep their signs when requantized, as in the reference), and the rounding, sqrt and
    loop choices that follow the last scalar. Returns ``(tables, map arguments, mode arguments)``;
    the caller holds ``tables`` until the kernel returns (the pointers are into them)."""
    return _table_args(code_table(qmap1, keep_sign=True), code_table(qmap2, keep_sign=True), exact, simd)


def _table_args(t1: CodeTable, t2: CodeTable, exact: bool, simd: int | None) -> tuple[tuple, tuple, tuple]:
    """:func:`_shared_args` for two tables made elsewhere (the FP8 format's, :mod:`.cpu_lowbit`)."""
    maps = (t1.qmap.data_ptr(), t1.raw_steps.data_ptr(), t1.nan_code, t2.qmap.data_ptr(), t2.raw_steps.data_ptr(),
            t2.nan_code)
    modes = (torch_uses_fma(), bool(exact), torch_sqrt()[0] if exact else None, MKL_VML_MODE,
             mkl_sqrt_inline() if exact and t2.nonnegative else 0,  # v >= 0: no NaN from a negative v
             simd_level() if simd is None else simd, torch.get_num_threads())
    return (t1, t2), maps, modes


def _scalars(step: int, lr: float, beta1: float, beta2: float, weight_decay: float) -> tuple[float, float, float, float]:
    """(decay, sqrt(1 - beta2^t), -step_size, 1/sqrt(1 - beta2^t)) as the reference computes them
    (Python floats; ctypes rounds each to fp32 once, as torch rounds its kernels' scalars)."""
    step_size, bias_correction2_sqrt = bias_corrections(step, lr, beta1, beta2)
    decay = 1.0 - lr * weight_decay if weight_decay != 0 else 1.0  # p * 1.0 == p: no decay
    return decay, bias_correction2_sqrt, -step_size, 1.0 / bias_correction2_sqrt


def adam8bit_step_many_fast(*args, **kwargs) -> None:
    """The ``"cpu_fast"`` backend's :func:`adam8bit_step_many` (``exact=False``)."""
    kwargs.pop("exact", None)
    adam8bit_step_many(*args, exact=False, **kwargs)


def adam8bit_step_fast(*args, **kwargs) -> None:
    """The ``"cpu_fast"`` backend: :func:`adam8bit_step` with ``exact=False`` (not bit-identical
    parameters; same states). Never chosen by ``"auto"``: ask for it by name."""
    kwargs.pop("exact", None)
    adam8bit_step(*args, exact=False, **kwargs)


try:  # can this torch build's rounding be reproduced? (else the backend stays off, saying why)
    torch_uses_fma(), torch_sqrt()
except ImportError as exc:
    _unavailable = _unavailable or str(exc)
register_backend("cpu", adam8bit_step, supports, step_many=adam8bit_step_many)
register_backend("cpu_fast", adam8bit_step_fast, supports, step_many=adam8bit_step_many_fast)

from . import cpu_lowbit  # noqa: E402,F401 (registers the "cpu" steps of the fp8 and 4-bit formats)
