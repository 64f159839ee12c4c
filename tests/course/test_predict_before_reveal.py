"""Predict before the reveal: every lesson asks at least two questions *before* the experiment answers them.

A prediction cell (metadata ``adam8.predicts = "NN.x"``) calls ``ask("NN.x", ...)``; a later cell
(metadata ``adam8.reveals = "NN.x"``) ends the experiment with ``reveal("NN.x", ...)`` and is stored
collapsed (``jupyter.outputs_hidden``, for JupyterLab) and shows nothing but what ``reveal`` displays:
its answer folded in a ``<details>`` element, for every other front end. The cell right after a reveal
is its explanation, a markdown cell that is one ``<details>`` block. Nothing above the reveal states
the answer: no markdown cell and no output before it holds the stored answer's number (see
:func:`answer_tokens`). Questions that no experiment answers sit at the end, under a heading with the
word "Recap". :func:`order_problems` says what is wrong with one notebook; the tests run it on every
lesson and on synthetic notebooks that break one rule each. ``test_reveals_render_folded.py`` renders
the lessons to HTML and checks that every answer and explanation sits inside a ``<details>``.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from adam8lib.course.checks.questions import QUESTIONS, Revealed, reveal_line
from adam8lib.course.grading.conventions import cell_source

REPO = Path(__file__).resolve().parents[2]
LESSONS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MIN_PREDICTIONS = 2
_ASK = re.compile(r'\bask\(\s*"(\d\d\.[a-z])"')
_REVEAL = re.compile(r'\breveal\(\s*"(\d\d\.[a-z])"')
_HEADING = re.compile(r"^#{1,6}\s+(.*)$", re.M)
EXPLANATION_OPEN = "<details><summary>Why? (open after you have run the reveal)</summary>"
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


def answer_tokens(qid: str) -> list[str]:
    """The forms of question ``qid``'s answer that no cell above its reveal may print or state.

    The first number of the answer as displayed (``"501.9"`` of "501.9 MiB", ``"2.03"`` of "≈ 2.03 (...)")
    and the answer itself in ``%g`` form — only those distinctive enough not to be a coincidence: a whole
    number of three digits or more, or a decimal with two significant digits or more. A lone 8 or a 20
    stands in too many unrelated places ("8 bytes", "20 steps") to tell an answer given away from a
    coincidence; those questions, and letter answers, are checked by reading.
    """
    q = QUESTIONS[qid]
    if q.choices:
        return []
    shown = _NUMBER.findall(q.display())
    forms = {shown[0]} if shown else set()
    forms.add(f"{q.answer:g}")
    def distinctive(token):
        mantissa = re.split(r"e", token)[0].replace(",", "")
        if "." in mantissa:
            return len(mantissa.replace(".", "").strip("0")) >= 2
        return len(mantissa) >= 3
    return sorted(t for t in forms if distinctive(t))


def _states(text: str, token: str) -> bool:
    """Whether ``text`` holds the number ``token`` on its own (not as a part of a longer number)."""
    return re.search(rf"(?<![\d.,]){re.escape(token)}(?![\d]|[.,]\d)", text) is not None


def _is_explanation(cell) -> bool:
    source = cell_source(cell).strip()
    return cell.cell_type == "markdown" and source.startswith(EXPLANATION_OPEN) and source.endswith("</details>") \
        and source.count("<details>") == 1


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


def _folded_only(cell) -> bool:
    """Whether every stored output of ``cell`` is a reveal's folded display (no print, figure or error beside it)."""
    outputs = cell.get("outputs", [])
    return bool(outputs) and all(
        out.get("output_type") in ("display_data", "execute_result")
        and str(out.get("data", {}).get("text/html", "")).lstrip().startswith('<details class="adam8-reveal">')
        for out in outputs)


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
        elif not _folded_only(nb.cells[index]):
            problems.append(f"cell {index}: reveals {qid} but shows more than the folded reveal "
                            f"(print inside withheld() and pass it to reveal)")
        following = nb.cells[index + 1] if index + 1 < len(nb.cells) else None
        if following is None or not _is_explanation(following):
            problems.append(f"cell {index + 1}: the explanation after the reveal of {qid} is not one markdown "
                            f"<details> block opening with {EXPLANATION_OPEN!r}")
        for earlier in range(index):
            cell = nb.cells[earlier]
            if cell.cell_type == "code" and not _collapsed(cell) and any(line in _outputs_text(cell) for line in lines):
                problems.append(f"cell {earlier}: shows the answer of {qid} before its collapsed reveal (cell {index})")
        for token in answer_tokens(qid):
            for earlier in range(index):
                cell = nb.cells[earlier]
                text = cell_source(cell) if cell.cell_type == "markdown" else _outputs_text(cell)
                if earlier != predicts.get(qid) and _states(text, token):
                    where = "its text" if cell.cell_type == "markdown" else "its output"
                    problems.append(f"cell {earlier}: {where} states {token}, the answer of {qid}, "
                                    f"above its reveal (cell {index})")
    # Collapsing hides an output in JupyterLab only; anywhere else a collapsed experiment cell shows its answer.
    for index, cell in enumerate(nb.cells):
        if _collapsed(cell) and index not in reveals.values():
            problems.append(f"cell {index}: collapsed (jupyter.outputs_hidden) but reveals nothing: its output is on "
                            f"screen outside JupyterLab (fold it into the reveal with withheld())")
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


def _revealed(qid, measured):
    """A reveal cell with the output reveal() stores."""
    line = reveal_line(qid, measured)
    shown = Revealed(qid, line)
    cell = _code(f'reveal("{qid}", {measured!r})', {"adam8": {"reveals": qid}, "jupyter": {"outputs_hidden": True}})
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/plain": repr(shown),
                                                                  "text/html": shown._repr_html_()})]
    return cell


def _explanation(text):
    return nbformat.v4.new_markdown_cell(f"{EXPLANATION_OPEN}\n\n{text}\n\n</details>")


def _good_notebook():
    """Questions 05.a (127, the zero code of the signed map) and 05.d ((b)), asked and revealed in order."""
    md = nbformat.v4.new_markdown_cell
    return nbformat.v4.new_notebook(cells=[
        md("# 99 · a lesson\n\nAn experiment is coming: 256 levels, one of them zero."),
        md("**Predict 05.a.** Which code?"),
        _code('ask("05.a", prediction)', {"adam8": {"predicts": "05.a"}}),
        _code("print(len(levels))", output="256\n"),
        _revealed("05.a", 127),
        _explanation("Because the map is sorted."),
        md("**Predict 05.d.** Which one?"),
        _code('ask("05.d", prediction)', {"adam8": {"predicts": "05.d"}}),
        _revealed("05.d", "b"),
        _explanation("Because (b)."),
        md("## Recap: check yourself"),
        _code('ask("05.c", prediction)'),
    ])


def test_the_checker_passes_a_notebook_that_asks_first():
    assert order_problems(_good_notebook()) == []


def test_the_checker_fails_a_question_moved_after_its_reveal():
    nb = _good_notebook()
    question = nb.cells.pop(2)
    nb.cells.insert(5, question)  # now after the reveal of 05.a
    problems = order_problems(nb)
    assert any("05.a" in p and "after its reveal" in p for p in problems), problems


def test_the_checker_fails_a_reveal_that_is_not_collapsed():
    nb = _good_notebook()
    del nb.cells[4].metadata["jupyter"]
    problems = order_problems(nb)
    assert any("not collapsed" in p and "05.a" in p for p in problems), problems


def test_the_checker_fails_an_answer_shown_before_the_collapsed_reveal():
    nb = _good_notebook()
    nb.cells[3].outputs = [nbformat.v4.new_output("stream", text=nb.cells[4].outputs[0].data["text/plain"])]
    assert any("shows the answer of 05.a" in p for p in order_problems(nb))


@pytest.mark.parametrize("where, text", [
    (0, "# 99 · a lesson\n\nThe zero sits at code 127."),                  # prose above the question
    (1, "**Predict 05.a.** Which code, 127 or 128?"),                      # the question itself
    (3, "levels [0..255], zero at 127\n"),                                # an ordinary cell's output
])
def test_the_checker_fails_an_answer_stated_above_its_reveal(where, text):
    nb = _good_notebook()
    if nb.cells[where].cell_type == "markdown":
        nb.cells[where].source = text
    else:
        nb.cells[where].outputs = [nbformat.v4.new_output("stream", text=text)]
    problems = order_problems(nb)
    assert any(f"cell {where}:" in p and "states 127, the answer of 05.a" in p for p in problems), problems


def test_the_checker_does_not_take_a_longer_number_for_the_answer():
    nb = _good_notebook()
    nb.cells[3].outputs = [nbformat.v4.new_output("stream", text="1270 levels, 0.127, 127.5, 1,127 and 3127\n")]
    assert order_problems(nb) == []


def test_answer_tokens_skip_letters_and_lone_digits():
    assert answer_tokens("05.a") == ["127"]
    assert answer_tokens("05.d") == [] and answer_tokens("06.a") == [] and answer_tokens("08.c") == []  # (b); 4; ≈ 20
    assert answer_tokens("07.e") == ["11.1"] and "0.34" in answer_tokens("09.b") and answer_tokens("04.a") == []
    assert "1003.8" in answer_tokens("01.a") and "131,566,188" in answer_tokens("09.a")


def test_the_checker_fails_a_print_beside_the_folded_reveal():
    nb = _good_notebook()
    nb.cells[4].outputs.insert(0, nbformat.v4.new_output("stream", text="the zero is the 128th level\n"))
    assert any("shows more than the folded reveal" in p and "05.a" in p for p in order_problems(nb))


@pytest.mark.parametrize("explanation", [
    "Because the map is sorted.",                                            # plain markdown
    "<details><summary>Why</summary>\n\nBecause.\n\n</details>",          # another summary
    f"{EXPLANATION_OPEN}\n\nBecause.\n\n</details>\n\nAnd the answer is 127.",  # text after the fold
])
def test_the_checker_fails_an_explanation_that_is_not_folded(explanation):
    nb = _good_notebook()
    nb.cells[5].source = explanation
    assert any("explanation after the reveal of 05.a" in p for p in order_problems(nb)), order_problems(nb)


def test_the_checker_fails_a_collapsed_cell_that_reveals_nothing():
    nb = _good_notebook()
    nb.cells[3].metadata["jupyter"] = {"outputs_hidden": True}
    assert any("cell 3: collapsed" in p for p in order_problems(nb))


def test_the_checker_fails_a_reveal_without_an_explanation_after_it():
    nb = _good_notebook()
    del nb.cells[9]
    assert any("explanation after the reveal of 05.d" in p for p in order_problems(nb))


@pytest.mark.parametrize("break_it, expected", [
    (lambda nb: nb.cells.__setitem__(10, nbformat.v4.new_markdown_cell("## Check yourself")), "not a Recap"),
    (lambda nb: nb.cells[8].metadata.pop("adam8"), "at least 2 needed"),
    (lambda nb: nb.cells.__setitem__(4, _code("print(x)", nb.cells[4].metadata)), "does not call reveal"),
    (lambda nb: nb.cells.insert(3, _code('ask("05.b", prediction)')), "without being a prediction"),
    (lambda nb: setattr(nb.cells[8], "outputs", []), "no reveal line"),
])
def test_the_checker_names_each_other_broken_rule(break_it, expected):
    nb = _good_notebook()
    break_it(nb)
    problems = order_problems(nb)
    assert any(expected in p for p in problems), problems
