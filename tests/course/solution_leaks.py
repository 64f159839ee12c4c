"""Find a workbook solution's body in a lesson: normalised ASTs, compared exactly and nearly.

A *body* is the code of a solution function between ``### BEGIN SOLUTION`` and ``### END SOLUTION``
in ``solutions/*.ipynb``. A *candidate* is what a learner reads in a lesson: every function body and
every whole code cell of ``notebooks/*.ipynb``.

Both are normalised as ASTs: docstrings and comments dropped; local names (arguments and every name a
unit assigns) renamed ``_0, _1, ...`` in order of first use, so renaming ``grid`` to ``g`` hides
nothing; the array libraries ``torch``/``np``/``numpy`` read as one name, and ``dtype=`` arguments and
``.float()``/``.double()`` casts are dropped, so a copy "up to the dtype" is still a copy. Library
names and attributes (``linspace``, ``amax``) are kept.

* **exact**: a candidate's normalised code is the body's;
* **near**: runs of at least :data:`RUN` tokens of the candidate's normalised code cover at least
  :data:`SHARE` of the body's tokens (bodies shorter than :data:`MIN_TOKENS` tokens, a one-line
  ``return``, are idioms every lesson uses and are only compared exactly).
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

import nbformat

from adam8lib.course.grading.conventions import BEGIN, END, cell_source

SHARE = 0.5
RUN = 4
MIN_TOKENS = 30
ARRAY_LIBS = {"torch", "np", "numpy"}
CASTS = {"float", "double", "half", "bfloat16"}


@dataclass(frozen=True)
class Unit:
    """A normalised piece of code: where it comes from, its normalised source and its tokens."""

    where: str
    code: str
    tokens: tuple[str, ...]


def _parsable(source: str) -> ast.Module | None:
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _drop_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def _bound_names(nodes: list[ast.AST], args: ast.arguments | None) -> set[str]:
    names = set()
    if args is not None:
        names |= {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                names.add(sub.id)
            elif isinstance(sub, ast.arg):
                names.add(sub.arg)
    return names


class _Normalise(ast.NodeTransformer):
    def __init__(self, local: set[str]):
        self.local, self.renamed = local, {}

    def _name(self, name: str) -> str:
        if name in ARRAY_LIBS:
            return "LIB"
        if name not in self.local:
            return name
        return self.renamed.setdefault(name, f"_{len(self.renamed)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(id=self._name(node.id), ctx=node.ctx), node)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        return ast.copy_location(ast.arg(arg=self._name(node.arg)), node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        node.keywords = [k for k in node.keywords if k.arg != "dtype"]
        if isinstance(node.func, ast.Attribute) and node.func.attr in CASTS and not node.args and not node.keywords:
            return node.func.value  # x.float() -> x
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.body = _drop_docstring(node.body)
        node.decorator_list, node.returns = [], None
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef


def normalise(body: list[ast.stmt], args: ast.arguments | None = None) -> str:
    """The normalised source of the statements ``body`` (of a function with ``args``, if given)."""
    body = _drop_docstring(body)
    renamer = _Normalise(_bound_names(body, args))
    module = ast.Module(body=[renamer.visit(s) for s in body], type_ignores=[])
    return ast.unparse(ast.fix_missing_locations(module))


def tokens(code: str) -> tuple[str, ...]:
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER, tokenize.COMMENT}
    return tuple(t.string for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type not in skip)


def unit(where: str, body: list[ast.stmt], args: ast.arguments | None = None) -> Unit:
    code = normalise(body, args)
    return Unit(where, code, tokens(code))


def coverage(body: Unit, candidate: Unit) -> float:
    """Share of ``body``'s tokens found in ``candidate`` in the same order, in runs of at least RUN tokens."""
    matcher = difflib.SequenceMatcher(None, body.tokens, candidate.tokens, autojunk=False)
    return sum(b.size for b in matcher.get_matching_blocks() if b.size >= RUN) / max(1, len(body.tokens))


def leak(body: Unit, candidate: Unit) -> str | None:
    """'exact' or 'near (NN %)' when ``candidate`` shows ``body``; None when it does not."""
    if body.code == candidate.code:
        return "exact"
    if len(body.tokens) >= MIN_TOKENS and (share := coverage(body, candidate)) >= SHARE:
        return f"near ({share:.0%})"
    return None


def solution_bodies(path: Path) -> list[Unit]:
    """The normalised body of every solution function of a workbook (the code between the markers)."""
    units = []
    for index, cell in enumerate(nbformat.read(str(path), as_version=4).cells):
        source = cell_source(cell)
        if cell.cell_type != "code" or BEGIN not in source:
            continue
        tree = _parsable(source)
        assert tree is not None, f"{path.name} cell {index}: solution cell does not parse"
        marks = [n for n, line in enumerate(source.splitlines(), 1) if line.strip() in (BEGIN, END)]
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and any(node.lineno <= line <= node.end_lineno for line in marks):
                inside = [s for s in node.body if any(a < s.lineno <= b for a, b in zip(marks[::2], marks[1::2]))]
                units.append(unit(f"{path.stem}:{node.name}", inside, node.args))
    return units


def lesson_candidates(path: Path) -> list[Unit]:
    """Every function body and every whole code cell of a lesson, normalised."""
    units = []
    for index, cell in enumerate(nbformat.read(str(path), as_version=4).cells):
        tree = _parsable(cell_source(cell)) if cell.cell_type == "code" else None
        if tree is None:
            continue
        units.append(unit(f"{path.stem} cell {index}", tree.body))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                units.append(unit(f"{path.stem} cell {index}: {node.name}", node.body, node.args))
    return units


def leaks(solutions: list[Path], lessons: list[Path]) -> list[str]:
    """'<solution> in <lesson cell>: exact|near' for every body a lesson shows."""
    bodies = [b for path in solutions for b in solution_bodies(path)]
    found = []
    for path in lessons:
        for candidate in lesson_candidates(path):
            for body in bodies:
                if (kind := leak(body, candidate)) is not None:
                    found.append(f"{body.where} in {candidate.where}: {kind}")
    return found


def body_of(source: str) -> Unit:
    """The normalised unit of a function's source (for tests): its body, its arguments local."""
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef)
    return unit(node.name, node.body, node.args)


def cell_units(source: str, where: str = "cell") -> list[Unit]:
    """The units a lesson cell with this source gives (for tests)."""
    tree = ast.parse(re.sub(r"^\s*[%!].*$", "", source, flags=re.M))
    return [unit(where, tree.body)] + [unit(f"{where}: {n.name}", n.body, n.args)
                                       for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
