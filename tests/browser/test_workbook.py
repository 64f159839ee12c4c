"""A learner's workbook in the browser: type a correct solution, run its check, see the ✔ line.

Opens ``exercises/02_ema.ipynb`` in JupyterLab, runs the cells above exercise 02.1, types the
solution from ``solutions/02_ema.ipynb`` into the exercise cell with the keyboard, runs it and
the check cell with Shift+Enter, and reads the check's output in the page. Typing a wrong
solution instead must show the check's AssertionError, not the ✔ line.
"""

from __future__ import annotations

import nbformat
import pytest

from .conftest import ROOT
from .lab import CURRENT, menu, open_notebook, select_cell, type_code, wait_idle

WORKBOOK = "02_ema.ipynb"


def exercise(nb, number: int = 1):
    """(index of the exercise cell, index of its check cell) for the ``number``-th exercise."""
    cells = [i for i, c in enumerate(nb.cells) if "solution" in c.metadata.get("tags", [])]
    i = cells[number - 1]
    return i, i + 1


def solution_text(index: int) -> str:
    return nbformat.read(ROOT / "solutions" / WORKBOOK, as_version=4).cells[index].source


def run_typed(page, lab, code: str, artifacts, shot: str) -> str:
    stub = nbformat.read(lab.root / "exercises" / WORKBOOK, as_version=4)
    cell, check = exercise(stub)
    assert "NotImplementedError" in stub.cells[cell].source and "check_" in stub.cells[check].source
    open_notebook(page, lab, f"exercises/{WORKBOOK}")
    select_cell(page, cell)
    menu(page, "Run", "Run All Above Selected Cell")
    wait_idle(page, 300)
    select_cell(page, cell)
    typed = type_code(page, code)
    assert typed == code, f"the editor holds\n{typed}\ninstead of\n{code}"
    page.keyboard.press("Shift+Enter")  # run the exercise cell; the check cell becomes active
    page.wait_for_function(f"() => {CURRENT}.content.activeCellIndex === {check}")
    page.keyboard.press("Shift+Enter")  # run the check cell
    page.wait_for_timeout(500)
    wait_idle(page, 300)
    output = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").nth(check).locator(".jp-Cell-outputArea")
    output.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / shot))
    return output.inner_text()


@pytest.mark.timeout(600)
def test_typed_solution_passes_its_check(lab, page, artifacts):
    stub = nbformat.read(ROOT / "exercises" / WORKBOOK, as_version=4)
    cell, check = exercise(stub)
    text = run_typed(page, lab, solution_text(cell), artifacts, "workbook_02_ema_solved.png")
    stored = nbformat.read(ROOT / "solutions" / WORKBOOK, as_version=4).cells[check].outputs[0]["text"].strip()
    assert stored.startswith("✔")
    assert stored in text, text


@pytest.mark.timeout(600)
def test_typed_wrong_solution_fails_its_check(lab, page, artifacts):
    stub = nbformat.read(ROOT / "exercises" / WORKBOOK, as_version=4)
    cell, _ = exercise(stub)
    wrong = solution_text(cell).replace("(1 - beta2) * g * g", "(1 - beta2) * g")  # v from g, not g²
    assert wrong != solution_text(cell)
    text = run_typed(page, lab, wrong, artifacts, "workbook_02_ema_wrong.png")
    assert "✔" not in text and "AssertionError" in text, text
