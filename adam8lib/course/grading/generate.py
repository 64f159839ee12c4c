"""Generate the learner workbooks: ``python -m adam8lib.course.grading.generate solutions exercises``.

``make exercises`` runs it. For every ``solutions/*.ipynb`` it writes ``exercises/<same name>``:

* each solution span (``### BEGIN SOLUTION`` … ``### END SOLUTION``) becomes
  ``raise NotImplementedError("Exercise NN.k: <function>")`` at the same indentation;
  the cell's outputs are cleared and it is tagged ``nbval-ignore-output`` and ``solution``;
* check cells (and every other cell) are kept with their stored outputs, so nbval compares
  the success line ``✔ <title>: all checks passed`` and a stub fails exactly there;
* Colab badges and links to ``…/solutions/…`` point to ``…/exercises/…``;

and it writes ``exercises/.manifest.json`` (see :mod:`adam8lib.course.grading.conventions`).

Solutions are validated on the way: unbalanced markers, a span outside a function, a check
cell without exactly one stored success line, or an exercise id used twice is an error.

``--check`` writes nothing and exits 1 when exercises/ differs from what it would write
(the CI test runs it).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import re
import sys
from pathlib import Path

import nbformat

from .conventions import (
    EXERCISE_HEADING,
    IGNORE_OUTPUT_TAG,
    MANIFEST_NAME,
    SOLUTION_TAG,
    SUCCESS_LINE,
    CheckSpec,
    Manifest,
    WorkbookError,
    cell_source,
    cell_tags,
    check_calls,
    has_markers,
    points_of,
    source_hash,
    strip_solutions,
    unique,
)

__all__ = ["generate_notebook", "generate", "main"]

_LINK = re.compile(r"(/blob/[^/\s)\"']+/)solutions/")


def _rewrite_links(text: str) -> str:
    return _LINK.sub(r"\1exercises/", text)


def _stored_stdout(cell, where: str) -> str:
    outputs = cell.get("outputs") or []
    if cell.get("execution_count") is None or len(outputs) != 1:
        raise WorkbookError(
            f"{where}: a check cell needs exactly one stored output (its success line) from a real run; "
            f"found {len(outputs)} output(s){' and no execution count' if cell.get('execution_count') is None else ''}. "
            "Run `make outputs`."
        )
    out = outputs[0]
    text = "".join(out.get("text", "")) if isinstance(out.get("text"), list) else out.get("text", "")
    if out.get("output_type") != "stream" or out.get("name") != "stdout" or not SUCCESS_LINE.match(text):
        raise WorkbookError(
            f"{where}: the stored output of a check cell must be the one stdout line "
            f"'✔ <title>: all checks passed', found {out.get('output_type')}: {text[:120]!r}"
        )
    return text if text.endswith("\n") else text + "\n"


def _ensure_ids(nb, name: str) -> None:
    """Give cells without an id a deterministic one (nbformat would invent random ids)."""
    if (nb.nbformat, nb.nbformat_minor) < (4, 5):
        return
    for index, cell in enumerate(nb.cells):
        if not cell.get("id"):
            cell["id"] = hashlib.sha1(f"{name}:{index}".encode()).hexdigest()[:8]


def generate_notebook(nb, name: str) -> tuple[nbformat.NotebookNode, list[CheckSpec]]:
    """The exercise version of solution notebook ``nb`` (named ``name``) and its check cells."""
    nb = copy.deepcopy(nb)
    _ensure_ids(nb, name)
    number = name.split("_", 1)[0]
    label, title = None, ""
    ordinal = 0
    code_index = 0
    checks: list[CheckSpec] = []
    for index, cell in enumerate(nb.cells):
        where = f"{name}, cell {index}"
        source = cell_source(cell)
        if cell.cell_type == "markdown":
            headings = EXERCISE_HEADING.findall(source)
            if headings:
                label, title = headings[-1]
            if has_markers(source):
                source = strip_solutions(source, f"Exercise {label or number}", where, markdown=True)
            cell.source = _rewrite_links(source)
            continue
        if cell.cell_type != "code":
            continue
        calls = check_calls(source)
        if has_markers(source):
            if calls:
                raise WorkbookError(f"{where}: a solution cell must not also be a check cell ({', '.join(calls)})")
            if label is None:
                ordinal += 1
            stub_label = f"Exercise {label}" if label else f"Exercise {number}.{ordinal}"
            cell.source = strip_solutions(source, stub_label, where)
            cell.outputs = []
            cell.execution_count = None
            cell.metadata["tags"] = unique([*cell_tags(cell), IGNORE_OUTPUT_TAG, SOLUTION_TAG])
        elif calls:
            if len(calls) != 1:
                raise WorkbookError(f"{where}: a check cell calls exactly one check, found {', '.join(calls)}")
            exercise = calls[0][len("check_"):]
            checks.append(
                CheckSpec(
                    notebook=name,
                    exercise=exercise,
                    label=label or f"{number}.{len(checks) + 1}",
                    title=title or exercise.replace("_", " "),
                    cell=code_index,
                    points=points_of(source),
                    sha256=source_hash(source),
                    source=source,
                    expected_output=_stored_stdout(cell, where),
                )
            )
        code_index += 1
    return nb, checks


def _read(path: Path):
    try:
        return nbformat.read(str(path), as_version=4)
    except Exception as exc:  # nbformat raises several types for broken JSON/schema
        raise WorkbookError(f"{path}: cannot read notebook: {exc}") from exc


def _render(solutions: Path) -> dict[str, str]:
    """{file name in exercises/: text} for every solution notebook, plus the manifest."""
    if not solutions.is_dir():
        raise FileNotFoundError(f"no solutions folder at {solutions}")
    files: dict[str, str] = {}
    notebooks: dict[str, list[CheckSpec]] = {}
    owner: dict[str, str] = {}
    for path in sorted(solutions.glob("*.ipynb")):
        nb, checks = generate_notebook(_read(path), path.name)
        for spec in checks:
            if spec.exercise in owner:
                raise WorkbookError(
                    f"exercise id {spec.exercise!r} (check_{spec.exercise}) is used in {owner[spec.exercise]} "
                    f"and {path.name}: each check cell calls its own check"
                )
            owner[spec.exercise] = path.name
        notebooks[path.name] = checks
        files[path.name] = nbformat.writes(nb) + "\n"
    if not notebooks:
        raise WorkbookError(f"no notebooks in {solutions}")
    files[MANIFEST_NAME] = Manifest(notebooks).dumps()
    return files


def _existing(exercises: Path) -> dict[str, str]:
    if not exercises.is_dir():
        return {}
    paths = [*exercises.glob("*.ipynb"), exercises / MANIFEST_NAME]
    return {p.name: p.read_text(encoding="utf-8") for p in paths if p.is_file()}


def generate(solutions: str | Path, exercises: str | Path, check: bool = False) -> list[str]:
    """Write (or, with ``check``, only compare) exercises/; return the out-of-sync file names."""
    solutions, exercises = Path(solutions), Path(exercises)
    wanted = _render(solutions)
    have = _existing(exercises)
    stale = sorted(set(have) - set(wanted))
    changed = sorted(name for name, text in wanted.items() if have.get(name) != text)
    if not check:
        exercises.mkdir(parents=True, exist_ok=True)
        for name in changed:
            (exercises / name).write_text(wanted[name], encoding="utf-8")
        for name in stale:
            (exercises / name).unlink()
    return changed + stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m adam8lib.course.grading.generate",
        description="Write the learner workbooks (exercises/) and their grading manifest from solutions/.",
    )
    parser.add_argument("solutions", nargs="?", default="solutions", help="solution notebooks (default: solutions)")
    parser.add_argument("exercises", nargs="?", default="exercises", help="output folder (default: exercises)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the output is out of sync")
    args = parser.parse_args(argv)
    try:
        differ = generate(args.solutions, args.exercises, check=args.check)
    except (WorkbookError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if differ:
            print(f"{args.exercises}/ is out of sync with {args.solutions}/ ({', '.join(differ)}): run `make exercises`",
                  file=sys.stderr)
            return 1
        print(f"{args.exercises}/ is in sync with {args.solutions}/")
        return 0
    print(f"wrote {len(differ)} file(s) in {args.exercises}/" + (f": {', '.join(differ)}" if differ else " (up to date)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
