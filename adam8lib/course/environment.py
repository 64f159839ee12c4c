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
from pathlib import Path

__all__ = ["setup", "Environment", "in_colab", "repo_url", "REPO_URL", "colab_url", "COLAB_BADGE", "SETUP_CELL", "setup_cell"]

def repo_url() -> str:
    """The repository's address: ``Repository`` in pyproject's ``[project.urls]``.

    Read from the installed package's metadata (``Project-URL: Repository, ...``), so a pip or
    Colab install knows it without the source tree. A source checkout whose installed metadata
    predates that entry falls back to the ``pyproject.toml`` next to the package.
    """
    from importlib import metadata

    try:
        entries = metadata.metadata("adam8lib").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        entries = []
    for entry in entries:
        label, _, url = entry.partition(",")
        if label.strip().lower() == "repository":
            return url.strip()
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.is_file():
        import re

        section = pyproject.read_text(encoding="utf-8").split("[project.urls]", 1)[-1].split("\n[", 1)[0]
        found = re.search(r'^Repository\s*=\s*"([^"]+)"', section, re.M)
        if found:
            return found.group(1)
    raise RuntimeError("adam8lib's metadata has no Project-URL 'Repository': reinstall the package (pip install -e .)")


#: Where the course lives (used for Colab links and the Colab install line).
REPO_URL = repo_url()

#: The image of the "Open In Colab" badge in cell 0 of every notebook.
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"

def setup_cell(repo_url: str | None = None) -> str:
    """The source of cell 1 (code, tagged ``nbval-ignore-output``) of every notebook."""
    return f"""# Setup: on Colab, install the course library (errors stay visible; Colab's torch/triton are kept)
import sys
if "google.colab" in sys.modules:
    %pip install -q "adam8lib[course] @ git+{repo_url or REPO_URL}"
from adam8lib.course import setup
env = setup()"""


#: The source of cell 1 (code, tagged ``nbval-ignore-output``) of every notebook.
SETUP_CELL = setup_cell()


def in_colab() -> bool:
    """True inside Google Colab."""
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def colab_url(path: str, branch: str = "main", repo_url: str | None = None) -> str:
    """The "Open in Colab" address of a notebook of this repository (``repo_url``: :data:`REPO_URL`)."""
    repo = (repo_url or REPO_URL).removesuffix(".git").split("github.com/")[1]
    return f"https://colab.research.google.com/github/{repo}/blob/{branch}/{path}"


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


class _OnFirstImport:
    """A ``sys.meta_path`` finder that wraps the first import of one module.

    ``quiet``: the module's code runs with stderr muted; ``after(module)`` runs once it is loaded.
    bitsandbytes prints one-off "no GPU" / "kernels" messages while it imports; importing it eagerly
    in :func:`setup` to mute them cost every notebook (and every grading process) the seconds it
    takes (it pulls in torch's compiler stack). So its first import, wherever it happens, is muted,
    and lessons that never use it never pay. The same for ``torch._inductor.config``, which
    ``torch.use_deterministic_algorithms`` would import only to set one flag.
    """

    def __init__(self, name: str, quiet: bool = False, after=None):
        self.name, self.quiet, self.after = name, quiet, after

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        import importlib.util

        sys.meta_path.remove(self)  # once: out of the way of this and every later import
        spec = importlib.util.find_spec(fullname)  # the real module, found by the other finders
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            run, quiet, after = spec.loader.exec_module, self.quiet, self.after

            def exec_module(module):
                import contextlib
                import io

                with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
                    run(module)
                if after is not None:
                    after(module)

            spec.loader.exec_module = exec_module
        return spec


def _on_first_import(name: str, quiet: bool = False, after=None) -> None:
    """Run ``after(module)`` now if ``name`` is imported, else at its first import (see :class:`_OnFirstImport`)."""
    if name in sys.modules:
        if after is not None:
            after(sys.modules[name])
        return
    for finder in list(sys.meta_path):  # setup() again: one finder per module
        if isinstance(finder, _OnFirstImport) and finder.name == name:
            sys.meta_path.remove(finder)
    sys.meta_path.insert(0, _OnFirstImport(name, quiet, after))


def _deterministic() -> None:
    """``torch.use_deterministic_algorithms(True, warn_only=True)`` without importing the compiler stack.

    torch's function sets the dispatcher's flag and ``torch._inductor.config.deterministic``; it imports
    the second (about a second) to do so. Here the flag is set now and inductor's when it is imported.
    """
    import torch

    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(True, warn_only=True)
        return
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    _on_first_import("torch._inductor.config", after=lambda config: setattr(config, "deterministic", True))


def _quiet_bitsandbytes() -> None:
    warnings.filterwarnings("ignore", module="bitsandbytes")
    warnings.filterwarnings("ignore", message=".*bitsandbytes.*")
    # torchao (installed by `make bench`) logs load failures of its CUDA extensions, and the
    # torch pytree deprecation notes it triggers, whenever transformers imports it
    for name in ("bitsandbytes", "bitsandbytes.cextension", "bitsandbytes.backends", "torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # its import-time messages: muted when (and if) a cell first imports it (see _QuietImport)
    _on_first_import("bitsandbytes", quiet=True)


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
        _deterministic()
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
