"""Load what a workbook's solution cells define, without running the rest of the notebook.

The workbook unit tests (tests/workbooks, minitorch style) call the learner's functions
directly::

    wb = load_workbook("exercises/05_dynamic_map.ipynb")
    wb.dynamic_map_from_scratch(signed=True)

Only the *solution cells* are executed — cells with ``### BEGIN SOLUTION`` (solutions/) or
the ``solution`` tag the generator puts on them (exercises/ and learners' copies) — in
notebook order, in one shared namespace, so a later cell may use an earlier cell's function.
A cell that raises is recorded (see :attr:`Workbook.errors`) and the others still load; asking
for a name that was not defined says which names exist and which cells failed.
"""

from __future__ import annotations

import builtins
import linecache
from pathlib import Path
from typing import Any

import nbformat

from .conventions import cell_source, is_solution_cell

__all__ = ["Workbook", "load_workbook", "find_workbook", "WorkbookLoader"]


class Workbook:
    """The names defined by a notebook's solution cells (attribute access)."""

    def __init__(self, path: Path, names: dict[str, Any], errors: list[str], cells: int):
        self._path = path
        self._names = names
        self.errors = errors
        self.cells = cells

    @property
    def path(self) -> Path:
        return self._path

    def __getattr__(self, name: str) -> Any:
        names = self.__dict__.get("_names", {})
        if name in names:
            return names[name]
        defined = ", ".join(sorted(n for n, v in names.items() if callable(v) and not isinstance(v, type(builtins))))
        message = f"{self.__dict__.get('_path')} defines no {name!r} in its solution cells (defined: {defined or 'nothing'})"
        if self.__dict__.get("errors"):
            message += "; cells that failed to run: " + " | ".join(self.errors)
        raise AttributeError(message)

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def __dir__(self):
        return sorted(set(self._names) | {"path", "errors", "cells"})

    def __repr__(self) -> str:
        return f"<Workbook {self._path.name}: {self.cells} solution cell(s), {len(self.errors)} error(s)>"


def load_workbook(path: str | Path) -> Workbook:
    """Execute the solution cells of the notebook at ``path``; return their definitions."""
    path = Path(path)
    if path.suffix != ".ipynb":
        raise ValueError(f"not a notebook: {path}")
    nb = nbformat.read(str(path), as_version=4)
    namespace: dict[str, Any] = {"__name__": f"workbook_{path.stem}", "__builtins__": builtins}
    errors: list[str] = []
    count = 0
    for index, cell in enumerate(nb.cells):
        if not is_solution_cell(cell):
            continue
        count += 1
        source = cell_source(cell)
        filename = f"<{path.name} cell {index}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        try:
            exec(compile(source, filename, "exec"), namespace)
        except BaseException as exc:  # noqa: BLE001 - a learner's cell may raise anything
            if isinstance(exc, KeyboardInterrupt):
                raise
            errors.append(f"cell {index}: {type(exc).__name__}: {exc}")
    names = {k: v for k, v in namespace.items() if not k.startswith("__")}
    return Workbook(path, names, errors, count)


def find_workbook(folder: str | Path, number: int | str) -> Path:
    """The one ``NN_*.ipynb`` of ``folder`` (``number`` like 5 or ``"05"``)."""
    folder = Path(folder)
    try:
        nn = f"{int(number):02d}"
    except (TypeError, ValueError):
        raise ValueError(f"workbook number must be like 5 or '05', got {number!r}") from None
    matches = sorted(folder.glob(f"{nn}_*.ipynb"))
    if len(matches) != 1:
        found = ", ".join(p.name for p in matches) or "none"
        raise FileNotFoundError(f"expected one workbook {nn}_*.ipynb in {folder}, found {found}")
    return matches[0]


class WorkbookLoader:
    """``loader("05")`` → :class:`Workbook` of ``<folder>/05_*.ipynb`` (cached per file version)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise FileNotFoundError(f"no workbook folder {self.folder}")
        self._cache: dict[tuple[Path, float], Workbook] = {}

    def __call__(self, number: int | str) -> Workbook:
        path = find_workbook(self.folder, number)
        key = (path.resolve(), path.stat().st_mtime)
        if key not in self._cache:
            self._cache[key] = load_workbook(path)
        return self._cache[key]
