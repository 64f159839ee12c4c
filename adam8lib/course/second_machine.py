"""Run a command as if on a second machine: a numeric configuration unlike this one's.

Stored outputs come from one machine (``make outputs``); learners and instructors run the
notebooks on others: CPUs with other vector units (AMD without AVX-512, Apple silicon), one or
two cores, other BLAS paths. A compared output that depends on the order or rounding of
floating-point operations passes here and fails there. ``make test-second-machine`` re-runs the
notebooks (lessons and solutions, with grading) under :data:`SECOND_MACHINE_ENV`, which changes
floating-point results the way another machine would:

* ``ATEN_CPU_CAPABILITY=default``: torch's generic CPU kernels instead of its AVX2/AVX-512 ones
  (other rounding in ``linspace``, ``exp``/``log``, reductions, no fused multiply-adds);
* ``MKL_ENABLE_INSTRUCTIONS=AVX2`` and ``ONEDNN_MAX_CPU_ISA=AVX2``: MKL's and oneDNN's matrix
  kernels as on a CPU without AVX-512 (other blocking, other sums);
* (not here: ``MKL_CBWR=COMPATIBLE``, MKL's one code path for every x86 CPU, also for its vector math
  (``torch.sqrt``). On an AMD CPU it *is* MKL's path, so it would undo the AVX2 variation above; ``make
  test-second-machine`` runs the unit tests that compare bits with stored numbers under it separately. An Intel
  Xeon's native path rounds other elements of a square root: tests/_continuations.py keys by it);
* one thread (``OMP_NUM_THREADS=1``): reductions split differently than with the two threads
  that made the stored outputs;
* ``ADAM8LIB_CPU_CFLAGS=-mno-avx512f``: adam8lib's C++ kernel built without AVX-512.
* ``TORCHINDUCTOR_CACHE_DIR``: a cache of ``torch.compile``'s kernels of its own. Inductor's cache is keyed
  without ``ATEN_CPU_CAPABILITY``, so in the shared one a kernel generated for this CPU's AVX-512 (16 lanes)
  is rebuilt against the capped vector headers (8 lanes) and computes wrong numbers (or does not compile):
  a fault of the emulation, never of a real machine, which has one capability.

``tests/course/test_second_machine.py`` shows that it bites: quantities the lessons compute
change in their last digits, and a planted over-precise print fails under it.

Usage: ``python -m adam8lib.course.second_machine COMMAND [ARGS...]`` runs COMMAND with this
environment (the variables above override the caller's); ``--print`` shows them.
"""

from __future__ import annotations

import getpass
import os
import sys
import tempfile
from typing import Sequence

__all__ = ["SECOND_MACHINE_ENV", "second_machine_env", "main"]

def _inductor_cache() -> str:
    """This configuration's own ``torch.compile`` cache folder (inductor's default is ``<tmp>/torchinductor_<user>``)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name (a container without a passwd entry)
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}_second_machine")


#: The second numeric configuration (added to, and overriding, the caller's environment).
SECOND_MACHINE_ENV: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "ADAM8LIB_CPU_CFLAGS": "-mno-avx512f",
    "TORCHINDUCTOR_CACHE_DIR": _inductor_cache(),
}


def second_machine_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with :data:`SECOND_MACHINE_ENV` on top."""
    env = dict(os.environ if base is None else base)
    env.update(SECOND_MACHINE_ENV)
    return env


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip().split("\n\n")[0])
        print("usage: python -m adam8lib.course.second_machine [--print] COMMAND [ARGS...]")
        return 0 if args else 2
    if args[0] == "--print":
        for key, value in SECOND_MACHINE_ENV.items():
            print(f"{key}={value}")
        return 0
    print("second machine: " + " ".join(f"{k}={v}" for k, v in SECOND_MACHINE_ENV.items()), flush=True)
    os.execvpe(args[0], args, second_machine_env())
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
