"""Run the course notebooks and store their outputs; check that stored outputs are real.

The one command that makes stored outputs (``make outputs``)::

    python -m adam8lib.course.outputs execute notebooks solutions      # folders or .ipynb files
    python -m adam8lib.course.outputs check notebooks solutions        # exit 1 on unrun cells

``execute`` runs every notebook top to bottom in a fresh kernel of *this* interpreter
(the kernel named ``python3`` is resolved to ``sys.executable``, whatever kernelspecs the
user has installed), from the notebook's own folder, on the CPU and deterministically:

* ``CUDA_VISIBLE_DEVICES=""`` (no GPU even where there is one), ``TRITON_INTERPRET=1``;
* ``PYTHONHASHSEED=0``; 2 OpenMP/MKL threads (``OMP_NUM_THREADS=2``), as on CI;
* matplotlib's inline backend, so every figure is stored as a PNG;
* Hugging Face libraries offline (nothing is downloaded while making outputs);
* a per-cell timeout.

A notebook that runs without error is written back in place with clean metadata: execution
counts 1…n, no per-cell timing, the kernelspec ``python3``, and no bulky widget state (a
widget's saved state is kept only when it is small; otherwise it is dropped and the cell keeps
the widget's plain-text fallback). A notebook that fails is left untouched and reported.

``check`` reports stored outputs that did not come from such a run: a code cell with outputs
but no execution count, a cell that was not executed, or execution counts out of order.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

__all__ = [
    "KERNEL_NAME",
    "EXECUTION_ENV",
    "ExecutionResult",
    "find_notebooks",
    "execution_env",
    "execute_notebook",
    "execute_notebooks",
    "clean_notebook",
    "check_notebook",
    "main",
]

KERNEL_NAME = "python3"

#: Environment of the kernel that makes stored outputs (added to the current environment).
EXECUTION_ENV: dict[str, str] = {
    "CUDA_VISIBLE_DEVICES": "",
    "TRITON_INTERPRET": "1",
    "PYTHONHASHSEED": "0",
    "OMP_NUM_THREADS": "2",
    "MKL_NUM_THREADS": "2",
    "OPENBLAS_NUM_THREADS": "2",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    # plots are stored as PNGs even where the caller's environment says MPLBACKEND=Agg
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
}

#: Default per-cell timeout (seconds).
CELL_TIMEOUT = 300

#: Saved widget state larger than this (bytes of JSON) is dropped from the notebook.
MAX_WIDGET_STATE_BYTES = 20_000

_WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_CELL_METADATA_DROPPED = ("execution", "ExecuteTime", "collapsed", "scrolled")


@dataclass(frozen=True)
class ExecutionResult:
    path: Path
    seconds: float  # wall time
    code_cells: int
    error: str | None = None
    cpu_seconds: float = 0.0  # CPU time of the kernel (user + system): stable on a busy machine

    @property
    def ok(self) -> bool:
        return self.error is None


# ----------------------------------------------------------------------------------------
# Finding notebooks
# ----------------------------------------------------------------------------------------
def find_notebooks(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Expand folders to their ``*.ipynb`` files (sorted, checkpoints skipped); keep files.

    A path that does not exist, or a file that is not a notebook, raises ValueError.
    """
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(p for p in sorted(path.glob("*.ipynb")) if ".ipynb_checkpoints" not in p.parts)
        elif path.is_file():
            if path.suffix != ".ipynb":
                raise ValueError(f"not a notebook (.ipynb): {path}")
            found.append(path)
        else:
            raise ValueError(f"no such notebook or folder: {path}")
    unique: list[Path] = []
    for path in found:
        if path.resolve() not in {p.resolve() for p in unique}:
            unique.append(path)
    return unique


# ----------------------------------------------------------------------------------------
# The kernel: python3 = this interpreter
# ----------------------------------------------------------------------------------------
def _current_python_spec_manager():
    """A KernelSpecManager whose ``python3`` is ipykernel on ``sys.executable``.

    Without it a user-level ``python3`` kernelspec (``~/.local/share/jupyter/kernels``)
    would win over the virtual environment's, and outputs would come from another Python.
    """
    from ipykernel.kernelspec import RESOURCES, get_kernel_dict
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

    class CurrentPythonKernelSpecManager(KernelSpecManager):
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:  # noqa: D102
            if kernel_name == KERNEL_NAME:
                return KernelSpec(resource_dir=RESOURCES, **get_kernel_dict())
            return super().get_kernel_spec(kernel_name)

    return CurrentPythonKernelSpecManager()


def execution_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The kernel's environment: this process's, plus :data:`EXECUTION_ENV`, plus ``extra``."""
    env = dict(os.environ)
    env.update(EXECUTION_ENV)
    # the venv's scripts first, so that `!pip`/`%pip` and subprocesses find this Python
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if extra:
        env.update(extra)
    return env


# ----------------------------------------------------------------------------------------
# Cleaning
# ----------------------------------------------------------------------------------------
def _drop_widget_views(cell) -> None:
    """Keep only the plain-text fallback of widget views (their state is not stored)."""
    for output in cell.get("outputs", []):
        data = output.get("data")
        if data and _WIDGET_VIEW in data:
            del data[_WIDGET_VIEW]
            data.setdefault("text/plain", "Run the cell to show the widget.")


def _coalesce_streams(outputs: list) -> list:
    """Merge consecutive stream outputs of the same name (how prints split is timing luck)."""
    merged: list = []
    for output in outputs:
        previous = merged[-1] if merged else None
        if (
            output.get("output_type") == "stream"
            and previous is not None
            and previous.get("output_type") == "stream"
            and previous.get("name") == output.get("name")
        ):
            previous["text"] = previous["text"] + output["text"]
        else:
            merged.append(output)
    return merged


def clean_notebook(nb, *, max_widget_state_bytes: int = MAX_WIDGET_STATE_BYTES):
    """Clean an executed notebook in place (and return it).

    Execution counts become 1…n in cell order (outputs included); consecutive prints to the
    same stream become one output; per-cell timing and view-only metadata are dropped; the
    kernelspec is ``python3``; saved widget state over ``max_widget_state_bytes`` is dropped
    together with the widget views that need it (their plain-text fallback stays). Small
    widget state is kept so that a stored widget still renders; its model ids change on
    every run, so tag widget cells ``nbval-ignore-output``.
    """
    widgets = nb.metadata.get("widgets")
    drop_widgets = widgets is not None and (
        _WIDGET_STATE not in widgets
        or len(json.dumps(widgets, sort_keys=True)) > max_widget_state_bytes
    )
    if drop_widgets:
        del nb.metadata["widgets"]
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": KERNEL_NAME}
    count = 0
    for cell in nb.cells:
        for key in _CELL_METADATA_DROPPED:
            cell.metadata.pop(key, None)
        if cell.cell_type != "code":
            continue
        cell.outputs = _coalesce_streams(cell.outputs)
        if drop_widgets or "widgets" not in nb.metadata:
            _drop_widget_views(cell)
        if cell.get("execution_count") is None:
            continue
        count += 1
        cell.execution_count = count
        for output in cell.outputs:
            if output.get("output_type") == "execute_result":
                output["execution_count"] = count
    return nb


# ----------------------------------------------------------------------------------------
# Executing
# ----------------------------------------------------------------------------------------
def execute_notebook(
    path: str | os.PathLike,
    *,
    timeout: int = CELL_TIMEOUT,
    env: dict[str, str] | None = None,
    write: bool = True,
    max_widget_state_bytes: int = MAX_WIDGET_STATE_BYTES,
):
    """Execute one notebook in a fresh ``python3`` kernel (this interpreter), from its folder.

    Returns the cleaned notebook node; writes it back in place when ``write``. Raises
    ``nbclient.exceptions.CellExecutionError`` (file untouched) when a cell fails, and
    ``nbclient.exceptions.CellTimeoutError`` when a cell runs over ``timeout`` seconds.
    """
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no such notebook: {path}")
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    nb = nbformat.read(path, as_version=4)
    km = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=_current_python_spec_manager())
    client = NotebookClient(
        nb,
        km=km,
        kernel_name=KERNEL_NAME,
        timeout=timeout,
        record_timing=False,
        store_widget_state=True,
        resources={"metadata": {"path": str(path.parent.resolve())}},
    )
    try:
        client.execute(env=execution_env(env), cleanup_kc=True)
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    clean_notebook(nb, max_widget_state_bytes=max_widget_state_bytes)
    nbformat.validate(nb)
    if write:
        nbformat.write(nb, path)
    return nb


def _children_cpu_seconds() -> float:
    """User + system CPU time of finished child processes (the kernels), where available."""
    try:
        import resource
    except ImportError:  # Windows
        return 0.0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def execute_notebooks(
    paths: Sequence[str | os.PathLike], *, timeout: int = CELL_TIMEOUT, progress: bool = True
) -> list[ExecutionResult]:
    """Execute every notebook under ``paths``; keep going past failures; report wall times."""
    from nbclient.exceptions import CellExecutionError, CellTimeoutError
    from tqdm.auto import tqdm

    notebooks = find_notebooks(paths)
    results: list[ExecutionResult] = []
    bar = tqdm(notebooks, desc="notebooks", unit="nb", disable=not progress)
    for path in bar:
        bar.set_postfix_str(path.name)
        start, cpu_start = time.perf_counter(), _children_cpu_seconds()
        error = None
        code_cells = 0
        try:
            nb = execute_notebook(path, timeout=timeout)
            code_cells = sum(c.cell_type == "code" for c in nb.cells)
        except (CellExecutionError, CellTimeoutError) as exc:
            error = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        except Exception as exc:  # kernel died, invalid notebook, …: report, go on
            error = f"{type(exc).__name__}: {exc}"
        seconds, cpu = time.perf_counter() - start, _children_cpu_seconds() - cpu_start
        results.append(ExecutionResult(path, seconds, code_cells, error, cpu))
        status = "ok" if error is None else f"FAILED ({error})"
        tqdm.write(f"{seconds:7.1f} s wall {cpu:7.1f} s cpu  {path}  {status}")
    return results


# ----------------------------------------------------------------------------------------
# Checking stored outputs
# ----------------------------------------------------------------------------------------
def check_notebook(nb_or_path) -> list[str]:
    """Problems with a notebook's stored outputs (empty list: it was run top to bottom).

    * a code cell with outputs but ``execution_count`` null (nbval fails on it);
    * a non-empty code cell that was not executed;
    * execution counts that are not 1, 2, … in cell order.
    """
    import nbformat

    nb = nbformat.read(nb_or_path, as_version=4) if isinstance(nb_or_path, (str, os.PathLike)) else nb_or_path
    problems: list[str] = []
    expected = 1
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        count = cell.get("execution_count")
        if count is None:
            if cell.get("outputs"):
                problems.append(f"cell {index}: has stored outputs but was never executed (execution_count null)")
            elif cell.source.strip():
                problems.append(f"cell {index}: not executed")
            continue
        if count != expected:
            problems.append(f"cell {index}: execution count {count}, expected {expected} (not run in order)")
        expected = count + 1
    return problems


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adam8lib.course.outputs", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("execute", help="run notebooks on the CPU and store their outputs in place")
    run.add_argument("paths", nargs="+", help="notebooks or folders of notebooks")
    run.add_argument("--timeout", type=int, default=CELL_TIMEOUT, help="per-cell timeout in seconds")
    chk = sub.add_parser("check", help="report notebooks whose stored outputs are missing or unrun")
    chk.add_argument("paths", nargs="+", help="notebooks or folders of notebooks")
    args = parser.parse_args(argv)
    try:
        notebooks = find_notebooks(args.paths)
    except ValueError as exc:
        parser.error(str(exc))
    if args.command == "execute":
        results = execute_notebooks(notebooks, timeout=args.timeout)
        failed = [r for r in results if not r.ok]
        total = sum(r.seconds for r in results)
        print(f"{len(results) - len(failed)}/{len(results)} notebooks executed in {total:.1f} s")
        for r in failed:
            print(f"FAILED {r.path}: {r.error}", file=sys.stderr)
        return 1 if failed else 0
    bad = 0
    for path in notebooks:
        problems = check_notebook(path)
        if problems:
            bad += 1
            print(f"{path}:")
            for problem in problems:
                print(f"  {problem}")
    print(f"{len(notebooks) - bad}/{len(notebooks)} notebooks have outputs from a full run")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
