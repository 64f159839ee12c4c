"""The workbook conventions as code (the README's "Checking your work and grading" explains them to people): one place for every rule.

* **Solution cell** — a code cell with a span between a line ``### BEGIN SOLUTION`` and a line
  ``### END SOLUTION``. In exercises/ the span becomes
  ``raise NotImplementedError("Exercise NN.k: <function>")`` at the marker's indentation and
  the cell carries the tags ``nbval-ignore-output`` and ``solution``.
* **Check cell** — a code cell with a call ``check_<id>(`` at the start of a line (the regex
  :data:`CHECK_CALL`); ``<id>`` is the exercise id. Points: ``# points: N`` on the first
  line, else 1. Its stored output is one line ``✔ <title>: all checks passed``.
* **Manifest** — ``exercises/.manifest.json``, written by the generator from solutions/: for
  each notebook, its check cells (exercise id, label, title, code-cell index, points, the
  source and its hash, the expected output). Graders compare learners' check cells with it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BEGIN",
    "END",
    "SOLUTION_TAG",
    "IGNORE_OUTPUT_TAG",
    "MANIFEST_NAME",
    "CHECK_CALL",
    "WorkbookError",
    "cell_source",
    "cell_tags",
    "check_calls",
    "points_of",
    "source_hash",
    "has_solution",
    "has_markers",
    "is_solution_cell",
    "strip_solutions",
    "SUCCESS_LINE",
    "CheckSpec",
    "Manifest",
    "notebook_number",
    "defined_names",
    "check_arguments",
]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
SOLUTION_TAG = "solution"
IGNORE_OUTPUT_TAG = "nbval-ignore-output"
MANIFEST_NAME = ".manifest.json"
#: Optional notebook-level manifest fields (see :class:`Manifest`).
EXTRAS = ("library_imports", "implementations")
#: Metadata the generator puts on every notebook it writes (``nb.metadata["adam8"]``): it only
#: ever overwrites notebooks that carry it.
GENERATED_KEY = "adam8"

#: A check call on a line of its own: ``check_dynamic_map(dynamic_map_from_scratch)``.
CHECK_CALL = re.compile(r"^[ \t]*(check_\w+)\(", re.M)
POINTS = re.compile(r"^\s*#\s*points\s*:\s*(\d+)\s*$", re.I)
#: ``## Exercise 05.1 · Title`` (the separator may be ·, :, - or —).
EXERCISE_HEADING = re.compile(r"^\s*#{1,6}\s*Exercise\s+(\d+\.\d+)\s*(?:[·:\-—–]\s*)?(.*?)\s*$", re.M)
#: The one stored output line of a check cell.
SUCCESS_LINE = re.compile(r"^✔ .+: all checks passed\n?$")
_DEF = re.compile(r"^([ \t]*)(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)")
_NUMBER = re.compile(r"^(\d+)_")


class WorkbookError(ValueError):
    """A workbook breaks the conventions (the message names the notebook and the cell)."""


def cell_source(cell: Any) -> str:
    src = cell.get("source", "") if isinstance(cell, dict) else getattr(cell, "source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def cell_tags(cell: Any) -> list[str]:
    tags = (cell.get("metadata") or {}).get("tags") or []
    return [t for t in tags if isinstance(t, str)]


def check_calls(source: str) -> list[str]:
    """Names of the check functions called (each at the start of a line) in ``source``."""
    return CHECK_CALL.findall(source)


def points_of(source: str) -> int:
    """``# points: N`` on the first line, else 1."""
    first = source.lstrip("\n").split("\n", 1)[0]
    m = POINTS.match(first)
    return int(m.group(1)) if m else 1


def normalize(source: str) -> str:
    """Source without trailing spaces and blank lines at either end (CRLF → LF)."""
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n")


def source_hash(source: str) -> str:
    """sha256 of :func:`normalize` d source — what integrity compares."""
    return hashlib.sha256(normalize(source).encode("utf-8")).hexdigest()


def _marker(line: str) -> str | None:
    stripped = line.strip()
    if stripped == BEGIN:
        return "begin"
    if stripped == END:
        return "end"
    return None


def has_solution(source: str) -> bool:
    return any(_marker(line) == "begin" for line in source.split("\n"))


def has_markers(source: str) -> bool:
    """Any ``### BEGIN/END SOLUTION`` line (a stray END is an error the generator reports)."""
    return any(_marker(line) for line in source.split("\n"))


def is_solution_cell(cell: Any) -> bool:
    """A cell where the learner writes code: solution markers (solutions/) or the tag (exercises/)."""
    return cell.get("cell_type") == "code" and (SOLUTION_TAG in cell_tags(cell) or has_solution(cell_source(cell)))


def strip_solutions(source: str, label: str, where: str = "cell", *, markdown: bool = False) -> str:
    """Replace each solution span of ``source`` by the stub (code) or an answer prompt (markdown).

    ``label`` is the exercise label (``"Exercise 05.1"``) used in the stub's message; the stub
    names the enclosing function. A span at the top level of a code cell is an error: the
    stub would make the cell itself fail, not just the check.
    """
    out: list[str] = []
    inside = False
    for number, line in enumerate(source.split("\n"), 1):
        kind = _marker(line)
        if kind == "begin":
            if inside:
                raise WorkbookError(f"{where}, line {number}: nested '{BEGIN}'")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            if markdown:
                out.append(f"{indent}*Write your answer here.*")
                continue
            name = None
            for previous in reversed(out):
                m = _DEF.match(previous)
                if m and len(m.group(1)) < len(indent):
                    name = m.group(2)
                    break
            if name is None:
                raise WorkbookError(
                    f"{where}, line {number}: '{BEGIN}' is not inside a function; the stub would make "
                    "the cell itself fail in exercises/. Put the solution in a function body."
                )
            out.append(f'{indent}raise NotImplementedError("{label}: {name}")')
        elif kind == "end":
            if not inside:
                raise WorkbookError(f"{where}, line {number}: '{END}' without '{BEGIN}'")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise WorkbookError(f"{where}: '{BEGIN}' without '{END}'")
    return "\n".join(out)


def defined_names(source: str) -> set[str]:
    """Names a cell binds at its top level (functions, classes, assignments, imports)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def check_arguments(source: str, check: str) -> set[str]:
    """The names used in the arguments of the call ``check(...)`` in ``source``."""
    import ast

    used: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == check:
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                used.update(n.id for n in ast.walk(arg) if isinstance(n, ast.Name))
    return used


def notebook_number(name: str) -> str | None:
    """``"05"`` for ``05_dynamic_map.ipynb``."""
    m = _NUMBER.match(Path(name).name)
    return m.group(1) if m else None


@dataclass(frozen=True)
class CheckSpec:
    """One check cell of the manifest."""

    notebook: str
    exercise: str  # check function name without "check_"
    label: str  # "05.1"
    title: str  # "Dynamic map from scratch"
    cell: int  # index among the notebook's code cells (nbval's "Cell N")
    points: int
    sha256: str
    source: str
    expected_output: str

    @property
    def check(self) -> str:
        return f"check_{self.exercise}"

    def to_json(self) -> dict:
        return {
            "exercise": self.exercise,
            "label": self.label,
            "title": self.title,
            "cell": self.cell,
            "points": self.points,
            "sha256": self.sha256,
            "source": self.source,
            "expected_output": self.expected_output,
        }


class Manifest:
    """``exercises/.manifest.json``: the check cells of every workbook, in course order."""

    def __init__(self, notebooks: dict[str, list[CheckSpec]], path: Path | None = None, extras: dict | None = None):
        self.notebooks = notebooks
        self.path = path
        #: optional per-notebook fields (format 1, additive): ``library_imports`` — what the
        #: solution's exercise cells import from adam8lib/bitsandbytes (not flagged in a learner's
        #: cells); ``implementations`` — {exercise: [dotted names]} of other equivalents that are
        #: flagged when an exercise cell uses them (from the check cell's ``adam8`` metadata).
        self.extras: dict[str, dict] = {nb: dict(v) for nb, v in (extras or {}).items()}

    def library_imports(self, notebook: str) -> list[str]:
        return list(self.extras.get(notebook, {}).get("library_imports", []))

    def implementations(self, notebook: str) -> list[str]:
        found = self.extras.get(notebook, {}).get("implementations", {})
        return [name for names in found.values() for name in names]

    def implementations_by_label(self, notebook: str) -> dict[str, list[str]]:
        """``{exercise label ("12.4"): [dotted names]}`` of the notebook's ``implementations``."""
        found = self.extras.get(notebook, {}).get("implementations", {})
        labels = {spec.exercise: spec.label for spec in self.notebooks.get(notebook, [])}
        return {labels.get(exercise, exercise): list(names) for exercise, names in found.items()}

    # -- queries -------------------------------------------------------------------------
    @property
    def checks(self) -> list[CheckSpec]:
        return [spec for specs in self.notebooks.values() for spec in specs]

    @property
    def total_points(self) -> int:
        return sum(spec.points for spec in self.checks)

    def points(self, notebook: str) -> int:
        return sum(spec.points for spec in self.notebooks[notebook])

    def match(self, filename: str) -> str | None:
        """The manifest notebook a (learner's) file stands for: same name, else same ``NN_``."""
        name = Path(filename).name
        if name in self.notebooks:
            return name
        number = notebook_number(name)
        if number is None:
            return None
        same = [nb for nb in self.notebooks if notebook_number(nb) == number]
        return same[0] if len(same) == 1 else None

    # -- (de)serialisation ----------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "about": "Generated from solutions/ by `python -m adam8lib.course.grading.generate` (make exercises). "
            "Do not edit: graders compare learners' check cells with it.",
            "format": 1,
            "total_points": self.total_points,
            "notebooks": {
                nb: {"points": self.points(nb), "checks": [spec.to_json() for spec in specs],
                     **{k: v for k, v in sorted(self.extras.get(nb, {}).items()) if v}}
                for nb, specs in self.notebooks.items()
            },
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def load(cls, path: str | Path) -> "Manifest":
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"no grading manifest at {path}: run `make exercises`") from None
        except json.JSONDecodeError as exc:
            raise WorkbookError(f"{path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != 1 or not isinstance(data.get("notebooks"), dict):
            raise WorkbookError(f"{path} is not an adam8 grading manifest (format 1)")
        try:
            notebooks = {
                nb: [CheckSpec(notebook=nb, **spec) for spec in entry["checks"]] for nb, entry in data["notebooks"].items()
            }
            extras = {nb: {k: entry[k] for k in EXTRAS if k in entry} for nb, entry in data["notebooks"].items()}
            for specs in notebooks.values():
                for spec in specs:
                    if not isinstance(spec.points, int) or isinstance(spec.points, bool) or spec.points < 0:
                        raise ValueError(f"points of {spec.exercise} must be a whole number >= 0, got {spec.points!r}")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise WorkbookError(f"{path} is not a valid adam8 grading manifest: {exc}") from None
        return cls(notebooks, path.resolve(), extras)


def unique(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        seen.setdefault(item, None)
    return list(seen)
