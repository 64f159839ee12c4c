"""Every lesson runs top to bottom in JupyterLab in a real Chromium (``make browser-test``).

For each ``notebooks/NN_*.ipynb`` (found by glob): open it in Lab, Run ▸ Run All Cells, wait for
the kernel, save, and compare with the stored notebook (a full run by ``make outputs``): every
code cell executed, no error output, no "Error displaying widget", as many plots and widgets in
the page and in the saved file as the stored run has. A screenshot per lesson goes to
``browser-artifacts/``. A lesson with an error cell must fail the same check.
"""

from __future__ import annotations


import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from .conftest import ROOT
from .lab import Counts, expected, problems, run_notebook

LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_runs_in_the_browser(lesson, lab, page, artifacts):
    rel = f"notebooks/{lesson.name}"
    try:
        seen = run_notebook(page, lab, rel)
    finally:
        page.screenshot(path=str(artifacts / f"{lesson.stem}.png"))
    with open(artifacts / "times.txt", "a") as f:
        f.write(f"{lesson.stem}\t{seen.seconds:.1f} s\n")
    found = problems(seen, expected(lesson))
    assert not found, f"{rel} in the browser:\n  " + "\n  ".join(found)


def test_a_lesson_with_an_error_fails(lab, page, artifacts):
    """The check is not blind: an error cell (and the cells Run All then skips) is reported."""
    nb = new_notebook(cells=[
        new_markdown_cell("# broken lesson"),
        new_code_cell("import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()"),
        new_code_cell("1 / 0"),
        new_code_cell("print('never runs')"),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, lab.root / "notebooks" / "zz_broken.ipynb")
    try:
        seen = run_notebook(page, lab, "notebooks/zz_broken.ipynb", timeout_s=120)
    finally:
        page.screenshot(path=str(artifacts / "zz_broken.png"))
    found = problems(seen, Counts(code_cells=3, plots=1, widgets=0))
    assert any("ZeroDivisionError" in p for p in found), found
    assert any("not executed: [3]" in p for p in found), found
    # and a missing plot is noticed too
    assert any(p.startswith("plots:") for p in problems(seen, Counts(code_cells=3, plots=2)))
