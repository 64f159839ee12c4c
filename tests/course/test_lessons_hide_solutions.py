"""Lessons motivate and show the library's result; the function itself is left to the workbook.

For every solution span in ``solutions/NN_*.ipynb`` (the code between ``### BEGIN SOLUTION`` and
``### END SOLUTION``), no code cell of the lesson ``notebooks/NN_*.ipynb`` *before* its workbook
pointer (the first markdown cell that names ``exercises/NN_…``) may contain most of it.

Code is compared *normalised*: Python tokens without comments, strings and layout, with local
names replaced by one placeholder (so renaming ``grid`` to ``g`` does not hide a copy) but
attributes and library names kept (``torch.linspace``, ``.amax``). A cell reveals a span when
runs of ≥ 4 matching tokens cover ``SHARE`` of the span's tokens; spans shorter than ``MIN_TOKENS``
(a one-line ``sum(...)``) are idioms, not solutions, and are not compared.
"""

from __future__ import annotations

import difflib
import io
import keyword
import re
import tokenize
from pathlib import Path

import nbformat
import pytest

from adam8lib.course.grading.conventions import BEGIN, END, cell_source

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((REPO / "solutions").glob("*.ipynb"))
SHARE = 0.4  # share of a span's tokens that a lesson cell may not contain
MIN_TOKENS = 30  # shorter spans (one-line sums, a return) are idioms every lesson uses, not solutions
KEEP = {"torch", "tl", "triton", "nn", "F", "math", "np"}
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
         tokenize.ENDMARKER, tokenize.STRING}


def tokens(code: str) -> list[str]:
    """Normalised tokens of ``code`` (dedented line by line; unparsable tails are dropped)."""
    code = "\n".join(line.strip() for line in code.splitlines() if not line.strip().startswith(("%", "!")))
    out: list[str] = []
    prev = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type in _SKIP:
                continue
            text = tok.string
            if (tok.type == tokenize.NAME and not keyword.iskeyword(text) and text not in KEEP
                    and not (prev is not None and prev.string == ".")):
                text = "N"
            out.append(text)
            prev = tok
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def coverage(span: list[str], cell: list[str]) -> float:
    """Share of ``span``'s tokens found in ``cell`` in the same order, in runs of at least 4 tokens."""
    matcher = difflib.SequenceMatcher(None, span, cell, autojunk=False)
    return sum(b.size for b in matcher.get_matching_blocks() if b.size >= 4) / max(1, len(span))


def solution_spans(path: Path) -> list[tuple[str, list[str]]]:
    """(function name, normalised tokens) for every solution span of a workbook."""
    spans = []
    for cell in nbformat.read(str(path), as_version=4).cells:
        source = cell_source(cell)
        if cell.cell_type != "code" or BEGIN not in source:
            continue
        name = re.search(r"(?:def|class)\s+(\w+)", source)
        for body in re.findall(re.escape(BEGIN) + r"\n(.*?)^[ \t]*" + re.escape(END), source, re.S | re.M):
            spans.append((name.group(1) if name else "?", tokens(body)))
    return spans


def cells_before_pointer(lesson: Path, number: str) -> list[tuple[int, list[str]]]:
    out = []
    for index, cell in enumerate(nbformat.read(str(lesson), as_version=4).cells):
        source = cell_source(cell)
        if cell.cell_type == "markdown" and f"exercises/{number}_" in source:
            break
        if cell.cell_type == "code":
            out.append((index, tokens(source)))
    return out


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_lesson_does_not_show_the_workbook_solution_before_the_pointer(solution):
    number = solution.name.split("_", 1)[0]
    lessons = sorted((REPO / "notebooks").glob(f"{number}_*.ipynb"))
    assert lessons, f"no lesson for {solution.name}"
    cells = cells_before_pointer(lessons[0], number)
    shown = [f"{name} (cell {index}: {share:.0%})" for name, span in solution_spans(solution) if len(span) >= MIN_TOKENS
             for index, cell in cells if (share := coverage(span, cell)) >= SHARE]
    assert not shown, (
        f"{lessons[0].name} shows workbook solutions before pointing to exercises/{solution.name}: "
        f"{', '.join(shown)}; show the library's result and leave the function to the workbook"
    )


SOLUTION_05_1 = '''values = [torch.tensor([0.0, 1.0])]
for i in range(7):
    n_points = (2**i if signed else 2 ** (i + 1)) + 1
    grid = torch.linspace(0.1, 1.0, n_points, dtype=torch.float32)
    decade = (grid[:-1] + grid[1:]) / 2 * 10.0 ** (i - 6)
    values.append(decade)
    if signed:
        values.append(-decade)
return torch.sort(torch.cat(values)).values'''

# lesson 05 before issue 13: the same algorithm, renamed and split over two helpers
OLD_LESSON_05 = '''def tree_map_float64(signed=True):
    parts = [torch.tensor([0.0, 1.0], dtype=torch.float64)]
    for i in range(7):
        grid = torch.linspace(0.1, 1.0, (2**i if signed else 2 ** (i + 1)) + 1, dtype=torch.float64)
        d = (grid[:-1] + grid[1:]) / 2 * 10.0 ** (i - 6)
        parts += [d, -d] if signed else [d]
    return torch.sort(torch.cat(parts)).values.float()'''


def test_the_detector_flags_a_renamed_copy_and_passes_the_library_call():
    span = tokens(SOLUTION_05_1)
    assert len(span) >= MIN_TOKENS
    assert coverage(span, tokens(OLD_LESSON_05)) >= SHARE
    assert coverage(span, tokens("q = dynamic_map(signed=True)\nprint(q[q > 0].min(), q.numel())")) < SHARE
    assert tokens("x = y.amax(1)  # c") == tokens("a = b.amax(1)") == ["N", "=", "N", ".", "amax", "(", "1", ")"]
