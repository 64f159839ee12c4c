"""The rule for outputs that ``pytest --nbval`` compares, and a linter that enforces it.

**The rule.** A cell whose output nbval compares prints only what holds on any supported
machine (Intel or AMD with or without AVX-512, Apple silicon, one thread or many, a GPU):

* exact integers and counts, shapes and dtypes, sizes computed from them;
* words from assertions: a claim and its band (:mod:`adam8lib.course.bands`), ``True``/``False``
  of a comparison that cannot flip (e.g. an exact equality the library guarantees);
* numbers written in the cell's own source (a band's limits, a hyperparameter);
* the line ``reveal()`` prints: a question's stored answer, not the measurement it checked.

Anything that depends on the order or rounding of floating-point operations, the BLAS path,
the thread count, the device or timing (losses, accuracies, errors of trained states, drift,
speed, memory read from an allocator) goes in a cell tagged ``nbval-ignore-output``, with a
compared check next to it that asserts the band the lesson claims.

**The linter.** Every number a compared output prints must either equal a number literal of
the cell's source, or the cell must say why its numbers are exact on any machine, in its
metadata: ``{"adam8": {"portable": "parameter counts of a model built from its config"}}``
(:data:`PORTABLE_KEY`). Check cells of workbooks are exempt (the grading manifest fixes their
output). The linter cannot prove a reason true; ``make test-second-machine`` tries it, by
running the notebooks under another numeric configuration.

``python -m adam8lib.course.compared notebooks solutions`` lists the cells that break the rule.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = ["PORTABLE_KEY", "is_compared", "compared_text", "unexplained_numbers", "problems", "main"]

#: ``cell.metadata["adam8"]["portable"]``: why the numbers of a compared output are exact anywhere.
PORTABLE_KEY = "portable"
_IGNORE_TAGS = {"nbval-ignore-output", "nbval-skip"}
_IGNORE_MARKERS = re.compile(r"^\s*#\s*NBVAL_(IGNORE_OUTPUT|SKIP)\b", re.M)
_CHECK_CALL = re.compile(r"^[ \t]*check_\w+\(", re.M)
_REVEAL_CALL = re.compile(r"^[ \t]*reveal\(", re.M)
#: the line reveal() prints: the stored answer (adam8lib.course.checks.questions), the same on every machine
_REVEAL_LINE = re.compile(r"^▶ Question \d\d\.[a-z]: .*$", re.M)
#: a number on its own (not part of a name such as float32 or sm_90): 1,234  0.5  1e-6  -3
_NUMBER = re.compile(r"(?<![A-Za-z_\d.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?![A-Za-z_\d])")
_MIN_REASON = 12


def _source(cell: Any) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def is_compared(cell: Any) -> bool:
    """True for a code cell whose outputs nbval compares (no ignore-output/skip tag or marker)."""
    if cell.get("cell_type") != "code":
        return False
    tags = set(cell.get("metadata", {}).get("tags", []))
    return not (tags & _IGNORE_TAGS) and not _IGNORE_MARKERS.search(_source(cell))


def compared_text(cell: Any) -> str:
    """The text nbval compares: streams and the text/plain of results (images are not compared)."""
    parts = []
    for output in cell.get("outputs", []):
        kind = output.get("output_type")
        if kind == "stream":
            parts.append(output.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            data = output.get("data", {})
            if "text/plain" in data and not any(k.startswith("image/") for k in data):
                text = data["text/plain"]
                parts.append("".join(text) if isinstance(text, list) else text)
        elif kind == "error":
            parts.append(f"{output.get('ename')}: {output.get('evalue')}")
    return "".join(parts)


def _value(token: str) -> float:
    return float(token.replace(",", ""))


def unexplained_numbers(cell: Any) -> list[str]:
    """The numbers of a compared output that its source does not write and no reason explains."""
    if not is_compared(cell) or _CHECK_CALL.search(_source(cell)):
        return []
    reason = cell.get("metadata", {}).get("adam8", {}).get(PORTABLE_KEY)
    if isinstance(reason, str) and len(reason.strip()) >= _MIN_REASON:
        return []
    written = {_value(t) for t in _NUMBER.findall(_source(cell))}
    text = compared_text(cell)
    if _REVEAL_CALL.search(_source(cell)):
        text = _REVEAL_LINE.sub("", text)
    return [t for t in _NUMBER.findall(text) if _value(t) not in written]


def problems(nb: Any) -> list[str]:
    """One line per compared cell that prints numbers without a reason they hold anywhere."""
    found = []
    for index, cell in enumerate(nb.cells):
        reason = cell.get("metadata", {}).get("adam8", {}).get(PORTABLE_KEY)
        if reason is not None and (not isinstance(reason, str) or len(reason.strip()) < _MIN_REASON):
            found.append(f"cell {index}: metadata adam8.{PORTABLE_KEY} must be a sentence saying why the "
                         f"numbers are exact on any machine, got {reason!r}")
            continue
        numbers = unexplained_numbers(cell)
        if numbers:
            shown = ", ".join(dict.fromkeys(numbers[:8]))
            found.append(f"cell {index}: compared output prints {shown}{' ...' if len(numbers) > 8 else ''}: "
                         f"move measured figures to an nbval-ignore-output cell with a band check next to it, "
                         f"or give the reason they are exact in metadata adam8.{PORTABLE_KEY}")
    return found


def _notebooks(paths: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        out.extend(sorted(path.glob("*.ipynb")) if path.is_dir() else [path])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import nbformat

    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m adam8lib.course.compared NOTEBOOK_OR_FOLDER ...", file=sys.stderr)
        return 2
    bad = 0
    for path in _notebooks(args):
        found = problems(nbformat.read(path, as_version=4))
        bad += bool(found)
        for line in found:
            print(f"{path}: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
