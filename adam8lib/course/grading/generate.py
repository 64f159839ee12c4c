"""Generate the learner workbooks: ``python -m adam8lib.course.grading.generate solutions exercises``.

``make exercises`` runs it. For every ``solutions/*.ipynb`` it writes ``exercises/<same name>``:

* each solution span (``### BEGIN SOLUTION`` … ``### END SOLUTION``) becomes
  ``raise NotImplementedError("Exercise NN.k: <function>")`` at the same indentation;
  the cell's outputs are cleared and it is tagged ``nbval-ignore-output`` and ``solution``;
* check cells keep their source but lose their stored outputs (a learner never sees
  "all checks passed" under an unsolved exercise); their expected success line
  ``✔ <title>: all checks passed`` is written to the manifest, and the grading plugin gives it
  back to nbval when it runs the cell, so a stub fails exactly there;
* a cell that runs the learner's code — it uses a function or class an exercise cell defines, or a
  name that such a cell assigned — loses its stored outputs too and is tagged ``nbval-ignore-output``:
  its stored result came from the solution, and a learner must not see it before writing anything
  (:func:`learner_dependent`); other cells are kept as they are;
* Colab badges and links to ``…/solutions/…`` point to ``…/exercises/…``;

and it writes ``exercises/.manifest.json`` (see :mod:`adam8lib.course.grading.conventions`).

Solutions are validated on the way: unbalanced or misspelled markers (``## BEGIN SOLUTION``,
``### begin solution``), a span outside a function, a notebook with no solution span or no
check cell, a check cell with no exercise cell since the previous check, a check call whose
arguments use a name no exercise cell defines (the gradebook runs only exercise cells), a check
cell without
exactly one stored success line, or an exercise id used twice is an error.

It never overwrites what it did not write: every notebook it writes carries
``metadata["adam8"]["generated_from"]``, and it refuses (exit 2, nothing written) to write into a
folder holding a notebook without that mark (the lessons, the solutions: e.g. swapped
arguments), to read notebooks that carry it as solutions, or to write into the solutions folder.

``--check`` writes nothing and exits 1 when exercises/ differs from what it would write
(the CI test runs it).
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import re
import sys
from pathlib import Path

import nbformat

from .conventions import (
    BEGIN,
    END,
    EXERCISE_HEADING,
    GENERATED_KEY,
    IGNORE_OUTPUT_TAG,
    MANIFEST_NAME,
    SOLUTION_TAG,
    SUCCESS_LINE,
    CheckSpec,
    Manifest,
    WorkbookError,
    cell_source,
    cell_tags,
    check_arguments,
    check_calls,
    has_markers,
    has_solution,
    defined_names,
    points_of,
    source_hash,
    strip_solutions,
    unique,
)

__all__ = ["generate_notebook", "generate", "learner_dependent", "main"]

_LINK = re.compile(r"(/blob/[^/\s)\"']+/)solutions/")
#: Anything that looks like a solution marker (the exact ones are ``### BEGIN/END SOLUTION``).
_MARKERISH = re.compile(r"^\s*#+\s*(begin|end)[\s_-]*solutions?\b", re.I | re.M)


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


def _check_markers(source: str, where: str) -> None:
    for m in _MARKERISH.finditer(source):
        line = source[m.start():].split("\n", 1)[0]
        if line.strip() not in (BEGIN, END):
            raise WorkbookError(f"{where}: misspelled solution marker {line.strip()!r}: write exactly '{BEGIN}' / '{END}'")


def _library_imports(source: str) -> list[str]:
    """Dotted names the cell imports from adam8lib (not adam8lib.course) or bitsandbytes."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return [d for d in found if d.split(".")[0] in ("adam8lib", "bitsandbytes") and not d.startswith("adam8lib.course")]


def _check_arguments(source: str, check: str, defined: set[str], where: str) -> None:
    """The gradebook evaluates a check call's arguments among the exercise cells' names only."""
    import builtins

    missing = sorted(check_arguments(source, check) - defined - set(dir(builtins)))
    if missing:
        raise WorkbookError(
            f"{where}: {check}(...) uses {', '.join(missing)}, which no exercise cell before it defines "
            "(the gradebook runs only the exercise cells, then the check)"
        )


def _loaded_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _exercise_definitions(source: str) -> set[str]:
    """Top-level functions and classes of an exercise cell (those the learner writes or completes)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _assigned_names(source: str) -> set[str]:
    """Names a cell binds at its top level, imports left out (an import does not carry the learner's code)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif not isinstance(node, (ast.Import, ast.ImportFrom)):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
    return names


def learner_dependent(nb) -> list[int]:
    """Indices of the code cells that are neither exercise nor check cells but run the learner's code.

    The learner's code is every function or class an exercise cell (one with solution markers)
    defines; a cell that uses one of them, or a name assigned by such a cell (transitively), runs it.
    """
    learner: set[str] = set()
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        source = cell_source(cell)
        if has_markers(source):
            learner |= _exercise_definitions(source)
        elif not check_calls(source) and _loaded_names(source) & learner:
            found.append(index)
            learner |= _assigned_names(source)
    return found


def notebook_extras(nb) -> dict:
    """The manifest's optional fields for solution notebook ``nb`` (see conventions.Manifest)."""
    imports: list[str] = []
    implementations: dict[str, list[str]] = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        source = cell_source(cell)
        if has_solution(source):
            imports += _library_imports(source)
        calls = check_calls(source)
        extra = (cell.metadata.get(GENERATED_KEY) or {}).get("implementations")
        if calls and extra:
            implementations[calls[0][len("check_"):]] = sorted(map(str, extra))
    return {"library_imports": sorted(set(imports)), "implementations": implementations}


def generate_notebook(nb, name: str, source_path: str | None = None) -> tuple[nbformat.NotebookNode, list[CheckSpec]]:
    """The exercise version of solution notebook ``nb`` (named ``name``) and its check cells."""
    if GENERATED_KEY in nb.metadata:
        raise WorkbookError(
            f"{name} was written by this generator (metadata {GENERATED_KEY!r}), it is not a solution notebook: "
            "are the two folders swapped? (python -m adam8lib.course.grading.generate SOLUTIONS EXERCISES)"
        )
    nb = copy.deepcopy(nb)
    _ensure_ids(nb, name)
    number = name.split("_", 1)[0]
    label, title = None, ""
    ordinal = 0
    code_index = 0
    checks: list[CheckSpec] = []
    solved_since_check = solved_any = False
    defined: set[str] = set()
    runs_learner_code = set(learner_dependent(nb))
    for index, cell in enumerate(nb.cells):
        where = f"{name}, cell {index}"
        source = cell_source(cell)
        _check_markers(source, where)
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
            solved_since_check = solved_since_check or has_solution(source)
            solved_any = solved_any or has_solution(source)
            defined |= defined_names(source)
            cell.outputs = []
            cell.execution_count = None
            cell.metadata["tags"] = unique([*cell_tags(cell), IGNORE_OUTPUT_TAG, SOLUTION_TAG])
        elif calls:
            if len(calls) != 1:
                raise WorkbookError(f"{where}: a check cell calls exactly one check, found {', '.join(calls)}")
            exercise = calls[0][len("check_"):]
            if not solved_since_check:
                raise WorkbookError(
                    f"{where}: check cell {calls[0]} has no exercise cell (with '{BEGIN}') before it "
                    "since the previous check cell"
                )
            solved_since_check = False
            _check_arguments(source, calls[0], defined, where)
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
            cell.outputs = []
            cell.execution_count = None
        elif index in runs_learner_code:
            cell.outputs = []
            cell.execution_count = None
            cell.metadata["tags"] = unique([*cell_tags(cell), IGNORE_OUTPUT_TAG])
        code_index += 1
    if not solved_any or not checks:
        raise WorkbookError(
            f"{name}: a solution notebook needs at least one '{BEGIN}' … '{END}' span and one check cell "
            "(is this a lesson? lessons are not generated)"
        )
    nb.metadata[GENERATED_KEY] = {
        "generated_from": source_path or f"solutions/{name}",
        "generator": "python -m adam8lib.course.grading.generate (make exercises); do not edit",
    }
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
    extras: dict[str, dict] = {}
    for path in sorted(solutions.glob("*.ipynb")):
        solution = _read(path)
        nb, checks = generate_notebook(solution, path.name, f"{solutions.resolve().name}/{path.name}")
        extras[path.name] = notebook_extras(solution)
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
    files[MANIFEST_NAME] = Manifest(notebooks, extras=extras).dumps()
    return files


def _refuse_to_overwrite(solutions: Path, exercises: Path, names: list[str], wanted: dict[str, str]) -> None:
    """WorkbookError unless every file about to be replaced or deleted was written by the generator.

    Ours: a notebook with the ``adam8`` metadata, or one equal to what it would write now but
    without that metadata (written before the mark existed).
    """
    if exercises.resolve() == solutions.resolve():
        raise WorkbookError(f"the output folder {exercises} is the solutions folder: nothing written")
    foreign = []
    for name in names:
        path = exercises / name
        if not path.exists():
            continue
        if name == MANIFEST_NAME:
            try:
                Manifest.load(path)
            except (WorkbookError, OSError) as exc:
                foreign.append(f"{name} ({exc})")
            continue
        try:
            nb = nbformat.read(str(path), as_version=4)
        except Exception:  # noqa: BLE001 - unreadable: not ours either
            foreign.append(name)
            continue
        if GENERATED_KEY in nb.metadata:
            continue
        if name in wanted:
            nb.metadata[GENERATED_KEY] = nbformat.reads(wanted[name], as_version=4).metadata[GENERATED_KEY]
            if nbformat.writes(nb) + "\n" == wanted[name]:
                continue
        foreign.append(name)
    if foreign:
        raise WorkbookError(
            f"{exercises} holds notebooks this generator did not write ({', '.join(foreign)}): nothing written. "
            "Is it the lessons or the solutions folder (arguments swapped?)? The output folder is exercises/."
        )


def _existing(exercises: Path) -> dict[str, str]:
    if not exercises.is_dir():
        return {}
    paths = [*exercises.glob("*.ipynb"), exercises / MANIFEST_NAME]
    return {p.name: p.read_text(encoding="utf-8", errors="replace") for p in paths if p.is_file()}


def generate(solutions: str | Path, exercises: str | Path, check: bool = False) -> list[str]:
    """Write (or, with ``check``, only compare) exercises/; return the out-of-sync file names."""
    solutions, exercises = Path(solutions), Path(exercises)
    wanted = _render(solutions)
    have = _existing(exercises)
    stale = sorted(set(have) - set(wanted))
    changed = sorted(name for name, text in wanted.items() if have.get(name) != text)
    if not check:
        _refuse_to_overwrite(solutions, exercises, changed + stale, wanted)
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
