"""A generated workbook never shows a result of the learner's code before the learner wrote it.

A cell that calls a function an exercise cell defines (a plot of "your" optimizer's losses) kept
its stored output in exercises/: the solution's result, on screen under an unsolved exercise.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from adam8lib.course.grading.conventions import IGNORE_OUTPUT_TAG, cell_source
from adam8lib.course.grading.generate import generate_notebook, learner_dependent

REPO = Path(__file__).resolve().parents[2]


def _stream(text: str):
    return nbformat.v4.new_output("stream", name="stdout", text=text)


def _code(source: str, output: str | None = None, count: int = 1, tags=()):
    cell = nbformat.v4.new_code_cell(source, execution_count=count)
    cell.outputs = [_stream(output)] if output else []
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def _workbook():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("## Exercise 01.1 · Double"),
        _code("import math\n\nresult_of_setup = math.pi", "setup\n"),  # 1: no learner code
        _code("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"),  # 2: exercise
        _code("check_double(double)", "✔ Exercise 01.1 · Double: all checks passed\n"),  # 3: check
        _code("values = [double(k) for k in range(3)]\nprint(values)", "[0, 2, 4]\n"),  # 4: runs it
        _code("print(sum(values))", "6\n", tags=["keep-me"]),  # 5: uses its result
        _code("import math\nprint(math.sqrt(result_of_setup))", "1.77\n"),  # 6: does not
    ]
    return nb


def test_cells_that_run_learner_code_are_found_directly_and_through_their_results():
    assert learner_dependent(_workbook()) == [4, 5]


def test_generated_cells_that_run_learner_code_carry_no_stored_result():
    nb, _ = generate_notebook(_workbook(), "01_tiny.ipynb")
    for index in (4, 5):
        cell = nb.cells[index]
        assert cell.outputs == [] and cell.execution_count is None, index
        assert IGNORE_OUTPUT_TAG in cell.metadata["tags"], index
    assert "keep-me" in nb.cells[5].metadata["tags"]
    assert nb.cells[1].outputs[0]["text"] == "setup\n" and nb.cells[6].outputs[0]["text"] == "1.77\n"
    assert "tags" not in nb.cells[6].metadata


@pytest.mark.parametrize("path", sorted((REPO / "solutions").glob("*.ipynb")), ids=lambda p: p.name)
def test_no_shipped_workbook_shows_a_result_of_unwritten_code(path):
    """exercises/07 used to ship "MyAdam8bit (yours) loss 3.516 -> 5.20e-05" before anything was written."""
    exercise = nbformat.read(str(REPO / "exercises" / path.name), as_version=4)
    solution = nbformat.read(str(path), as_version=4)
    for index in learner_dependent(solution):
        cell = exercise.cells[index]
        assert cell_source(cell) == cell_source(solution.cells[index])
        assert cell.outputs == [] and cell.execution_count is None, (path.name, index, cell.outputs)
