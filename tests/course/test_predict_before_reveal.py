"""Predict before the reveal: every lesson asks at least two questions *before* the experiment answers them.

A prediction cell (metadata ``adam8.predicts = "NN.x"``) calls ``ask("NN.x", ...)``; a later cell
(metadata ``adam8.reveals = "NN.x"``) ends the experiment with ``reveal("NN.x", ...)`` and is stored
collapsed (``jupyter.outputs_hidden``), so its answer is not on screen before the learner runs it.
Questions that no experiment answers sit at the end, under a heading with the word "Recap".
:func:`order_problems` says what is wrong with one notebook; the tests run it on every lesson and
on synthetic notebooks that break one rule each.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from adam8lib.course.grading.conventions import cell_source

REPO = Path(__file__).resolve().parents[2]
LESSONS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MIN_PREDICTIONS = 2
_ASK = re.compile(r'\bask\(\s*"(\d\d\.[a-z])"')
_REVEAL = re.compile(r'\breveal\(\s*"(\d\d\.[a-z])"')
_HEADING = re.compile(r"^#{1,6}\s+(.*)$", re.M)


def _outputs_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(str(out["data"].get("text/plain", "")))
    return "".join(parts)


def _collapsed(cell) -> bool:
    return cell.get("metadata", {}).get("jupyter", {}).get("outputs_hidden") is True


def order_problems(nb) -> list[str]:
    """Every broken rule of predict-then-reveal in notebook ``nb`` (empty: the notebook follows it)."""
    problems: list[str] = []
    predicts: dict[str, int] = {}
    reveals: dict[str, int] = {}
    for index, cell in enumerate(nb.cells):
        tags = cell.get("metadata", {}).get("adam8", {})
        source = cell_source(cell)
        for key, table, pattern, call in (("predicts", predicts, _ASK, "ask"), ("reveals", reveals, _REVEAL, "reveal")):
            qid = tags.get(key)
            if qid is None:
                continue
            if qid in table:
                problems.append(f"cell {index}: question {qid} {key} twice (first in cell {table[qid]})")
            table[qid] = index
            if cell.cell_type != "code" or qid not in pattern.findall(source):
                problems.append(f"cell {index}: marked {key} {qid} but does not call {call}({qid!r}, ...)")
    for qid, index in reveals.items():
        if not _collapsed(nb.cells[index]):
            problems.append(f"cell {index}: reveals {qid} but its output is not collapsed (jupyter.outputs_hidden)")
        if qid not in predicts:
            problems.append(f"cell {index}: reveals {qid}, which no cell asks before it (adam8.predicts)")
        elif predicts[qid] > index:
            problems.append(f"question {qid} is asked in cell {predicts[qid]}, after its reveal in cell {index}")
        lines = [line for line in _outputs_text(nb.cells[index]).splitlines() if line.startswith("▶")]
        if not any(f"Question {qid}" in line for line in lines):
            problems.append(f"cell {index}: reveals {qid} but its stored output has no reveal line (run the notebook)")
        for earlier in range(index):
            cell = nb.cells[earlier]
            if cell.cell_type == "code" and not _collapsed(cell) and any(line in _outputs_text(cell) for line in lines):
                problems.append(f"cell {earlier}: shows the answer of {qid} before its collapsed reveal (cell {index})")
    for qid, index in predicts.items():
        if qid not in reveals:
            problems.append(f"cell {index}: asks {qid} as a prediction but no later cell reveals it")
    answered = [qid for qid in predicts if qid in reveals and predicts[qid] < reveals[qid]]
    if len(answered) < MIN_PREDICTIONS:
        problems.append(f"only {len(answered)} prediction(s) placed before their reveal ({answered}); "
                        f"at least {MIN_PREDICTIONS} needed")
    # Every other question is a recap: after the last reveal, under a heading that says so.
    last_reveal = max(reveals.values(), default=-1)
    heading = None
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            found = _HEADING.findall(cell_source(cell))
            heading = found[-1] if found else heading
            continue
        if cell.cell_type != "code":
            continue
        asked = [qid for qid in _ASK.findall(cell_source(cell)) if predicts.get(qid) != index]
        if not asked:
            continue
        if index < last_reveal:
            problems.append(f"cell {index}: asks {asked} without being a prediction, before the last reveal")
        elif heading is None or "recap" not in heading.lower():
            problems.append(f"cell {index}: asks {asked} at the end under the heading {heading!r}, not a Recap")
    return problems


@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_each_lesson_asks_before_it_reveals(lesson):
    problems = order_problems(nbformat.read(str(lesson), as_version=4))
    assert not problems, f"{lesson.name}:\n  " + "\n  ".join(problems)


# ---------------------------------------------------------------------------------------------
# The checker itself, on small notebooks that keep or break one rule each

def _code(source, meta=None, output=None):
    cell = nbformat.v4.new_code_cell(source, metadata=meta or {})
    if output is not None:
        cell.outputs = [nbformat.v4.new_output("stream", text=output)]
    return cell


def _good_notebook():
    md = nbformat.v4.new_markdown_cell
    return nbformat.v4.new_notebook(cells=[
        md("# 99 · a lesson\n\nAn experiment is coming."),
        md("**Predict 99.a.** How many?"),
        _code('ask("99.a", prediction)', {"adam8": {"predicts": "99.a"}}),
        _code("x = 1 + 1"),
        _code('reveal("99.a", x)', {"adam8": {"reveals": "99.a"}, "jupyter": {"outputs_hidden": True}},
              "▶ Question 99.a: the experiment says 2 (you made no prediction above).\n"),
        md("**Predict 99.b.** Which one?"),
        _code('ask("99.b", prediction)', {"adam8": {"predicts": "99.b"}}),
        _code('reveal("99.b", "a")', {"adam8": {"reveals": "99.b"}, "jupyter": {"outputs_hidden": True}},
              "▶ Question 99.b: the experiment says (a) (you made no prediction above).\n"),
        md("## Recap: check yourself"),
        _code('ask("99.c", prediction)'),
    ])


def test_the_checker_passes_a_notebook_that_asks_first():
    assert order_problems(_good_notebook()) == []


def test_the_checker_fails_a_question_moved_after_its_reveal():
    nb = _good_notebook()
    question = nb.cells.pop(2)
    nb.cells.insert(5, question)  # now after the reveal of 99.a
    problems = order_problems(nb)
    assert any("99.a" in p and "after its reveal" in p for p in problems), problems


def test_the_checker_fails_a_reveal_that_is_not_collapsed():
    nb = _good_notebook()
    del nb.cells[4].metadata["jupyter"]
    problems = order_problems(nb)
    assert any("not collapsed" in p and "99.a" in p for p in problems), problems


def test_the_checker_fails_an_answer_shown_before_the_collapsed_reveal():
    nb = _good_notebook()
    nb.cells[3].outputs = [nbformat.v4.new_output("stream", text=nb.cells[4].outputs[0].text)]
    assert any("shows the answer of 99.a" in p for p in order_problems(nb))


@pytest.mark.parametrize("break_it, expected", [
    (lambda nb: nb.cells.__setitem__(8, nbformat.v4.new_markdown_cell("## Check yourself")), "not a Recap"),
    (lambda nb: nb.cells[7].metadata.pop("adam8"), "at least 2 needed"),
    (lambda nb: nb.cells.__setitem__(4, _code("print(x)", nb.cells[4].metadata)), "does not call reveal"),
    (lambda nb: nb.cells.insert(3, _code('ask("99.d", prediction)')), "without being a prediction"),
    (lambda nb: setattr(nb.cells[7], "outputs", []), "no reveal line"),
])
def test_the_checker_names_each_other_broken_rule(break_it, expected):
    nb = _good_notebook()
    break_it(nb)
    problems = order_problems(nb)
    assert any(expected in p for p in problems), problems
