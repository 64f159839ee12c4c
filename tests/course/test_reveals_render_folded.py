"""Reveals stay folded in nbconvert's HTML: every answer and every explanation sits inside a ``<details>``.

JupyterLab honours ``jupyter.outputs_hidden``; nbconvert's HTML (the feedback pages link to it), GitHub's
notebook view and Colab do not, and show every stored output. So each lesson is rendered with
nbconvert's ``HTMLExporter`` and the HTML is parsed: in a reveal cell's output area and in the
explanation cell after it, nothing is visible outside a ``<details>`` element but its ``<summary>``; no
image sits outside one; and the words of a reveal line ("the experiment says") appear nowhere on the
page outside a fold.
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from nbconvert import HTMLExporter

from adam8lib.course.checks.questions import Revealed, reveal_line

REPO = Path(__file__).resolve().parents[2]
LESSONS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
REVEAL_WORDS = "the experiment says"


class _Cell:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.visible = {"input": [], "output": []}  # text outside any <details>
        self.summaries: list[str] = []
        self.images_outside = 0
        self.folds = 0


class RenderedCells(HTMLParser):
    """The cells of an nbconvert page: per cell, the text a reader sees without opening any ``<details>``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.cells: list[_Cell] = []
        self.visible_page: list[str] = []
        self._divs = 0
        self._cell_at = None  # div depth at which the current cell opened
        self._output_at = None
        self._details = 0
        self._summary = 0
        self._skip = 0  # inside <script> or <style>

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        if tag in ("script", "style"):
            self._skip += 1
        elif tag == "div":
            self._divs += 1
            if self._cell_at is None and "jp-Cell" in classes:
                self._cell_at = self._divs
                self.cells.append(_Cell("markdown" if "jp-MarkdownCell" in classes else "code"))
            elif self._cell_at is not None and self._output_at is None and "jp-OutputArea" in classes:
                self._output_at = self._divs
        elif tag == "details":
            self._details += 1
            if self._cell_at is not None:
                self.cells[-1].folds += 1
        elif tag == "summary":
            self._summary += 1
        elif tag == "img" and self._details == 0 and self._cell_at is not None:
            self.cells[-1].images_outside += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1
        elif tag == "div":
            if self._output_at is not None and self._divs == self._output_at:
                self._output_at = None
            if self._cell_at is not None and self._divs == self._cell_at:
                self._cell_at = None
            self._divs -= 1
        elif tag == "details":
            self._details -= 1
        elif tag == "summary":
            self._summary -= 1

    def handle_data(self, data):
        if self._skip or not data.strip():
            return
        if self._details and not self._summary:
            return  # folded: seen only after the reader opens it
        self.visible_page.append(data)
        if self._cell_at is None:
            return
        cell = self.cells[-1]
        if self._summary:
            cell.summaries.append(data.strip())
        else:
            cell.visible["output" if self._output_at is not None else "input"].append(data.strip())


def rendered_cells(nb) -> RenderedCells:
    body, _ = HTMLExporter().from_notebook_node(nb)
    page = RenderedCells()
    page.feed(body)
    page.close()
    return page


def fold_problems(nb) -> list[str]:
    """Every reveal answer or explanation of ``nb`` that its nbconvert HTML shows outside a ``<details>``."""
    page = rendered_cells(nb)
    if len(page.cells) != len(nb.cells):
        return [f"the HTML has {len(page.cells)} cells, the notebook {len(nb.cells)}: cannot match them"]
    problems = []
    for index, (cell, shown) in enumerate(zip(nb.cells, page.cells)):
        qid = cell.get("metadata", {}).get("adam8", {}).get("reveals")
        if qid is None:
            continue
        if shown.visible["output"] or shown.images_outside:
            seen = " | ".join(shown.visible["output"])[:160]
            problems.append(f"cell {index} (reveal of {qid}): visible outside <details>: "
                            f"{shown.images_outside} image(s), text {seen!r}")
        if not shown.folds:
            problems.append(f"cell {index} (reveal of {qid}): no <details> in its output")
        if index + 1 < len(nb.cells):
            after = page.cells[index + 1]
            if nb.cells[index + 1].cell_type != "markdown" or not after.folds:
                problems.append(f"cell {index + 1} (explanation of {qid}): not a folded markdown cell")
            elif after.visible["input"] or after.visible["output"] or after.images_outside:
                seen = " | ".join(after.visible["input"])[:160]
                problems.append(f"cell {index + 1} (explanation of {qid}): visible outside <details>: {seen!r}")
    if any(REVEAL_WORDS in text for text in page.visible_page):
        problems.append(f"the page shows {REVEAL_WORDS!r} outside a fold")
    return problems


@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_each_lesson_renders_its_reveals_folded(lesson):
    problems = fold_problems(nbformat.read(str(lesson), as_version=4))
    assert not problems, f"{lesson.name}:\n  " + "\n  ".join(problems)


# ---------------------------------------------------------------------------------------------
# The check itself, on a small notebook: folded passes; each way of showing the answer fails

def _reveal_cell(with_print=""):
    shown = Revealed("05.a", reveal_line("05.a", 127))
    cell = nbformat.v4.new_code_cell('reveal("05.a", 127)', metadata={"adam8": {"reveals": "05.a"}})
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/plain": repr(shown),
                                                                  "text/html": shown._repr_html_()})]
    if with_print:
        cell.outputs.insert(0, nbformat.v4.new_output("stream", text=with_print))
    return cell


def _notebook(explanation="<details><summary>Why?</summary>\n\nThe zero is code **127**.\n\n</details>"):
    md = nbformat.v4.new_markdown_cell
    return nbformat.v4.new_notebook(cells=[md("# 99\n\nA question."), nbformat.v4.new_code_cell("x = 1"),
                                           _reveal_cell(), md(explanation), md("## Next")])


def test_a_folded_reveal_and_explanation_pass():
    page = rendered_cells(_notebook())
    assert fold_problems(_notebook()) == []
    assert page.cells[2].summaries and page.cells[3].summaries == ["Why?"]  # the summaries stay visible


def test_an_unfolded_explanation_fails():
    problems = fold_problems(_notebook("The zero is code **127**."))
    assert any("explanation of 05.a" in p for p in problems), problems


def test_text_after_the_fold_of_an_explanation_fails():
    problems = fold_problems(_notebook("<details><summary>Why?</summary>\n\nBecause.\n\n</details>\n\nIt is 127."))
    assert any("explanation of 05.a" in p and "127" in p for p in problems), problems


def test_a_print_beside_the_reveal_fails():
    nb = _notebook()
    nb.cells[2] = _reveal_cell(with_print="zero at code 127\n")
    problems = fold_problems(nb)
    assert any("reveal of 05.a" in p and "zero at code 127" in p for p in problems), problems


def test_a_reveal_printed_as_plain_text_fails():
    nb = _notebook()
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", text=reveal_line("05.a", 127) + "\n")]
    problems = fold_problems(nb)
    assert any("no <details>" in p for p in problems) and any(REVEAL_WORDS in p for p in problems), problems


def test_a_figure_beside_the_reveal_fails():
    nb = _notebook()
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGBgAAAABQABpfZFQAAAAABJRU5ErkJggg=="
    nb.cells[2].outputs.append(nbformat.v4.new_output("display_data", data={"image/png": png, "text/plain": "<Figure>"}))
    assert any("1 image(s)" in p for p in fold_problems(nb))
