"""Cell 0 of every notebook: ``from adam8lib.course import setup; setup()`` (lesson 00).

On Colab the notebook's first cell installs the package (``%pip install``, errors shown) and
then calls :func:`setup`. :func:`setup` itself never installs anything; it

* sets ``TRITON_INTERPRET=1`` when there is no GPU, *before* triton is imported, so the
  Triton lessons run on the CPU;
* silences bitsandbytes' CPU-only warnings on stderr (they would otherwise fail nbval);
* seeds Python, NumPy and torch, and makes torch deterministic on the CPU;
* returns (and prints, when ``verbose``) a short environment summary.
"""

from __future__ import annotations

import logging
import os
import platform
import random
import sys
import warnings
from dataclasses import dataclass

__all__ = ["setup", "Environment", "in_colab", "REPO_URL", "colab_url", "COLAB_BADGE", "SETUP_CELL"]

#: Where the course lives (used for Colab links and the Colab install line).
REPO_URL = "https://github.com/adam8-course/adam8"

#: The image of the "Open In Colab" badge in cell 0 of every notebook.
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"

#: The source of cell 1 (code, tagged ``nbval-ignore-output``) of every notebook.
SETUP_CELL = f"""# Setup: on Colab, install the course library (errors stay visible; Colab's torch/triton are kept)
import sys
if "google.colab" in sys.modules:
    %pip install -q "adam8lib[course] @ git+{REPO_URL}"
from adam8lib.course import setup
env = setup()"""


def in_colab() -> bool:
    """True inside Google Colab."""
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def colab_url(path: str, branch: str = "main") -> str:
    """The "Open in Colab" address of a notebook of this repository."""
    return f"https://colab.research.google.com/github/{REPO_URL.split('github.com/')[1]}/blob/{branch}/{path}"


@dataclass(frozen=True)
class Environment:
    device: str
    gpu_name: str | None
    torch: str
    triton: str | None
    bitsandbytes: str | None
    python: str
    colab: bool
    triton_interpret: bool

    def __str__(self) -> str:
        where = f"GPU ({self.gpu_name})" if self.gpu_name else "CPU (Triton kernels run in interpreter mode)"
        return (
            f"device: {where}\npython {self.python} | torch {self.torch} | triton {self.triton or 'not installed'}"
            f" | bitsandbytes {self.bitsandbytes or 'not installed'}"
        )


def _version(module: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return None


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _quiet_bitsandbytes() -> None:
    warnings.filterwarnings("ignore", module="bitsandbytes")
    warnings.filterwarnings("ignore", message=".*bitsandbytes.*")
    # torchao (installed by `make bench`) logs load failures of its CUDA extensions, and the
    # torch pytree deprecation notes it triggers, whenever transformers imports it
    for name in ("bitsandbytes", "bitsandbytes.cextension", "bitsandbytes.backends", "torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # importing now, with stderr muted, swallows the one-off "no GPU" / "kernels" messages
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            pass


def setup(seed: int = 0, verbose: bool = True) -> Environment:
    """Prepare a notebook: Triton interpreter on CPU, quiet bitsandbytes, seeds. Idempotent."""
    import torch

    if not _has_cuda() and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    _quiet_bitsandbytes()
    warnings.filterwarnings("ignore", category=FutureWarning)
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    if not _has_cuda():
        torch.use_deterministic_algorithms(True, warn_only=True)
    env = Environment(
        device="cuda" if _has_cuda() else "cpu",
        gpu_name=torch.cuda.get_device_name(0) if _has_cuda() else None,
        torch=torch.__version__.split("+")[0],
        triton=_version("triton"),
        bitsandbytes=_version("bitsandbytes"),
        python=platform.python_version(),
        colab=in_colab(),
        triton_interpret=os.environ.get("TRITON_INTERPRET") == "1",
    )
    if verbose:
        print(env)
    return env
