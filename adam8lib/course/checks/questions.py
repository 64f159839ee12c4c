"""Predict-then-check questions for the lessons.

A lesson asks a question in a markdown cell, and the learner writes a prediction in the code cell
below it and runs it::

    from adam8lib.course.checks.questions import ask
    prediction = None  # your answer: a number
    ask("05.a", prediction)

:func:`ask` prints one line and never the answer of a question that an experiment answers: for a
prediction it says what it recorded ("recorded: you predict 0.1 — now run the experiment below"); only
:func:`reveal`, after the experiment ran, judges it. A recap (a question answered from the text, at a
lesson's end; :data:`RECAPS`) is judged at once: right, or not quite with the answer. It never raises for
a wrong answer — a lesson keeps running — only for a question id that does not exist or an answer of the
wrong kind. Answers live here, in :data:`QUESTIONS`, so the lesson's source does not give
them away; ``tests/course/test_questions.py`` checks each one against the library.

Predict before the reveal: a question placed *before* the experiment that answers it is asked
with :func:`ask` (which remembers the prediction), and the experiment's cell ends with
:func:`reveal`, which checks the measured value against the stored answer (an AssertionError if the
experiment and the answer disagree) and compares it with the learner's prediction::

    ask("03.a", prediction)            # the question cell  (metadata adam8.predicts = "03.a")
    ...                                # the experiment
    reveal("03.a", measured)           # the revealing cell (metadata adam8.reveals = "03.a",
                                       #  its output collapsed: jupyter.outputs_hidden)

The line :func:`reveal` prints shows the stored answer (rounded as the question states), never
the raw measurement, so a compared output is the same on every machine.

Hidden until the learner acts, everywhere: :func:`reveal` displays its answer folded in an HTML
``<details>`` element (:class:`Revealed`), closed under a summary that does not give it away, so it
stays hidden in JupyterLab, Colab, VS Code, GitHub's notebook view and nbconvert's HTML alike
(``jupyter.outputs_hidden`` alone is honoured by JupyterLab only); its ``text/plain`` form, which nbval
compares, is the answer line. An experiment whose printout gives the answer away prints it inside
:func:`withheld` and hands it to :func:`reveal`, which shows it inside the same fold. The explanation
after a reveal is a markdown cell that is one ``<details>`` block::

    <details><summary>Why? (open after you have run the reveal)</summary>

    ...explanation...

    </details>

Numeric answers are right within ``rel_tol`` (relative) of the value; multiple-choice answers
are one letter, case-insensitive.
"""

from __future__ import annotations

import contextlib
import html
import io
import math
import numbers
from dataclasses import dataclass

__all__ = ["Question", "QUESTIONS", "RECAPS", "Revealed", "Withheld", "ask", "verdict", "reveal", "reveal_line", "withheld"]


@dataclass(frozen=True)
class Question:
    """One question: a number (with a relative tolerance) or a letter among ``choices``."""

    answer: float | str
    rel_tol: float = 0.01
    choices: str = ""  # e.g. "abc" for multiple choice; empty for a number
    shown: str = ""  # how the answer is printed (defaults to the answer itself)

    def __post_init__(self) -> None:
        if self.choices:
            if not isinstance(self.answer, str) or self.answer not in self.choices:
                raise ValueError(f"a multiple-choice answer must be one of {self.choices!r}, got {self.answer!r}")
        elif isinstance(self.answer, bool) or not isinstance(self.answer, numbers.Real):
            raise ValueError(f"a numeric question needs a number as its answer, got {self.answer!r}")

    def display(self) -> str:
        return self.shown or (f"({self.answer})" if self.choices else f"{self.answer:g}")

    def letter(self, prediction) -> str:
        """``prediction`` as one lower-case letter of :attr:`choices`: "c", " C ", "(c)" and "c)" are all "c"."""
        letter = prediction.strip().lower().strip("()").strip() if isinstance(prediction, str) else None
        if letter is None or len(letter) != 1 or letter not in self.choices:
            raise TypeError(f"answer with one letter of {', '.join(self.choices)} (a string), got {prediction!r}")
        return letter

    def is_right(self, prediction) -> bool:
        if self.choices:
            return self.letter(prediction) == self.answer
        if isinstance(prediction, bool) or not isinstance(prediction, numbers.Real):
            raise TypeError(f"answer with a number, got {type(prediction).__name__} {prediction!r}")
        return math.isclose(float(prediction), float(self.answer), rel_tol=self.rel_tol, abs_tol=1e-12)


MiB = 2**20
DISTILBERT = 65_783_042

QUESTIONS: dict[str, Question] = {
    # 00 · tour
    "00.a": Question("c", choices="abc", shown="(c) over 60 %: 89.6 % of the small model is its token embedding"),
    "00.b": Question(4, rel_tol=0.01, shown="4 (bf16 exp_avg and exp_avg_sq: torch keeps the parameter's dtype)"),
    "00.c": Question("c", choices="abcd"),
    # 01 · optimizer memory
    "01.a": Question(16 * DISTILBERT / MiB, rel_tol=0.005, shown="1003.8 MiB (16 bytes per parameter: 4 + 4 + 8)"),
    "01.b": Question(768 * 8, rel_tol=0, shown="6,144 bytes (fp32 m and v: below min_8bit_size, 768 is not quantized)"),
    "01.c": Question(8 / (2 + 8 / 256), rel_tol=0.01, shown="≈ 3.9 (8 / 2.03)"),
    "01.d": Question("c", choices="abc", shown="(c) over 10 %: a real layer's v is not rank 1"),
    # 02 · EMA
    "02.a": Question(1 - 0.999**1000, rel_tol=0.06, shown="≈ 0.632 (1 − 0.999^1000 ≈ 1 − 1/e: over a third short)"),
    "02.b": Question("b", choices="abc", shown="(b) it first grows, to 6.57 at step 12, then shrinks"),
    "02.c": Question("c", choices="abc", shown="(c) more than 6: about ten decades"),
    "02.d": Question(1000, rel_tol=0.3, shown="about 1000 (1 / (1 − β2))"),
    # 03 · the Adam rule
    "03.a": Question(1.0, rel_tol=1e-3, shown="1 (the first step moves each weight by lr)"),
    "03.b": Question(1 - 1e-3 * 0.01, rel_tol=1e-9, shown="0.99999"),
    "03.c": Question("a", choices="ab"),
    "03.d": Question("c", choices="abc", shown="(c) above 0.9: L2's decay is divided by the busy weight's large √v̂"),
    "03.e": Question("c", choices="abc", shown="(c) at about the same step: with L2, λ cancels out of m̂/√v̂"),
    # 04 · linear quantization
    "04.a": Question("c", choices="abc", shown="(c) over 60 %: half a step now reaches 1.8 standard deviations"),
    "04.b": Question(0.0, rel_tol=0, shown="0.0"),
    "04.c": Question("b", choices="abc", shown="(b) between 5 % and 30 %: where v is lost, m mostly is too"),
    "04.d": Question(math.log10(254), rel_tol=0.02, shown="≈ 2.4 (log10 254: absmax / (Δ/2) = 254)"),
    "04.e": Question(1e8, rel_tol=0.01, shown="10^8 (1 / eps: the denominator is sqrt(0) + 1e-8)"),
    # 05 · dynamic map
    "05.a": Question(127, rel_tol=0),
    "05.b": Question(5.5e-7, rel_tol=1e-3),
    "05.c": Question(128, rel_tol=0),
    "05.d": Question("b", choices="abc"),
    # 06 · blockwise
    "06.a": Question(4, rel_tol=0),
    "06.b": Question(4 / 256, rel_tol=1e-9, shown="0.015625 (4 / 256)"),
    "06.c": Question("c", choices="abc"),
    "06.d": Question("b", choices="abc", shown="(b) between 20 and 500: v spans twice the decades of m inside a block"),
    # 07 · the 8-bit step
    "07.a": Question(127, rel_tol=0),
    "07.b": Question("b", choices="abc"),
    "07.c": Question(2 + 8 / 256, rel_tol=1e-3, shown="2.03125"),
    "07.d": Question(0, rel_tol=0, shown="0 (v / absmax falls by at most 0.16 % per step, less than the smallest half "
                                         "gap, 0.176 %: every code stays)"),
    "07.e": Question(11.1, rel_tol=0.1, shown="≈ 11 (frozen codes times an absmax that grew 1.5×, against fp32's 0.999^2000 ≈ 1 / 7.4)"),
    # 08 · Triton
    "08.a": Question(16, rel_tol=0),
    "08.b": Question("c", choices="abc", shown="(c) more than 200: about 810 bytes per parameter in 192 torch operations"),
    "08.c": Question(20, rel_tol=0.25, shown="≈ 20"),
    "08.d": Question(0, rel_tol=0, shown="0 (the table is the search's answer, sampled wherever it changes)"),
    "08.e": Question("c", choices="abc", shown="(c) more than 10: 51 buckets, up to 5 changes in one"),
    # 09 · memory maths
    "09.a": Question(2 * DISTILBERT + 104, rel_tol=0, shown="131,566,188"),
    "09.b": Question(22_662_144 / DISTILBERT, rel_tol=0.04, shown="0.34 (34 %)"),
    "09.c": Question(2 * DISTILBERT / MiB, rel_tol=0.005, shown="125.5 MiB"),
    "09.d": Question(7.06, rel_tol=0.08, shown="≈ 7 (the attention scores grow 16×, the rest 4×)"),
    "09.e": Question(294.4, rel_tol=0.05, shown="≈ 294 MiB (of 423.2: the s × s scores are gone, not only the masks)"),
    # 10 · mixed precision fine-tuning
    "10.a": Question("b", choices="abc"),
    "10.b": Question(0.78, rel_tol=0.05),
    "10.c": Question(0.0, rel_tol=0, shown="0.0"),
    # 11 · at scale
    "11.a": Question((2 * 2**20 + 8 * 2**20 // 256) / MiB, rel_tol=0.01, shown="2.03125 MiB"),
    "11.b": Question(0.0829, rel_tol=0.15, shown="≈ 0.08 (8 %: 58.7 → 53.8 GiB per rank)"),
    "11.c": Question("b", choices="abc"),
    "11.d": Question(8, rel_tol=0),
    "11.e": Question((2 * 2**19 + 8 * 2**19 // 256) / MiB, rel_tol=0.02, shown="1.015625 MiB"),
    # 12 · beyond 8 bits
    "12.a": Question(768 * 3072, rel_tol=0, shown="2,359,296 (two half-byte codes per parameter: 1 byte)"),
    "12.b": Question("c", choices="abc", shown="(c) far more than 1,000 learning rates: m / eps, with v decoded 0"),
    "12.c": Question(0.1, rel_tol=0.25, shown="≈ 0.1 learning rates per step (m restarts from 0 at every step)"),
    "12.d": Question("a", choices="abc", shown="(a) the 8-bit dynamic map: its median error of m is about half e4m3's"),
    "12.e": Question(1.0, rel_tol=0, shown="1.0 (every step is lost)"),
    # 13 · one state, many optimizers
    "13.a": Question(3 * 768 * 768, rel_tol=0, shown="1,769,472 (three states, one byte of code per element each)"),
    "13.b": Question("c", choices="abc", shown="(c) many, over 10 %: an exact 0 is coded as a tiny positive m"),
    "13.c": Question("b", choices="abc", shown="(b) several times larger: the slow EMA keeps its rounding errors"),
    "13.d": Question("b", choices="abc", shown="(b) most of the matrix, not all: bf16 rounds the smallest changes away"),
    "13.e": Question(90_871_408 / DISTILBERT, rel_tol=0.01,
                     shown="≈ 1.38 (90,871,408 bytes: the embeddings and the head keep AdamW's two states)"),
    # 14 · the whole bill
    "14.a": Question("a", choices="abc", shown="(a) about 0.4: 0.443 bytes per parameter (a feed-forward matrix + a part of the tied embedding)"),
    "14.b": Question("a", choices="abc", shown="(a) identical, bit for bit"),
    "14.c": Question("b", choices="abc", shown="(b) at 1.0: every update is lost"),
    "14.d": Question("c", choices="abc", shown="(c) the token embedding (28,996 x 768)"),
}


#: Questions answered from the text (a lesson's recap): no experiment reveals them, so :func:`ask` judges them
#: at once. Every other question is a prediction: :func:`ask` records it and :func:`reveal` judges it.
RECAPS = frozenset({"00.c", "01.a", "01.c", "02.d", "03.b", "04.b", "04.d", "04.e", "05.b", "06.b", "07.a", "07.c",
                    "03.a", "03.c", "05.c", "06.a",
                    "08.a", "08.c", "08.d", "09.a", "09.b", "09.c", "11.a", "11.c", "12.a",
                    "13.a", "13.e"})


def verdict(question_id: str, prediction) -> str:
    """The one line :func:`ask` prints: for a prediction, what was recorded (never the answer)."""
    if question_id not in QUESTIONS:
        raise ValueError(f"unknown question {question_id!r}; known: {', '.join(QUESTIONS)}")
    q = QUESTIONS[question_id]
    if prediction is None:
        kind = "a letter" if q.choices else "a number"
        return f"✎ Question {question_id}: no prediction yet — set `prediction` to {kind} and run this cell again."
    if question_id not in RECAPS:
        q.is_right(prediction)  # the kind of answer is checked now (a TypeError names it), the value after the run
        shown = q.letter(prediction) if q.choices else f"{prediction!r}"
        return (f"✎ Question {question_id}: recorded — you predict {shown}. Now run the experiment below; its "
                f"reveal judges your prediction.")
    if q.is_right(prediction):
        return f"✔ Question {question_id}: right — {q.display()}."
    return f"✘ Question {question_id}: not quite — you said {prediction!r}; the answer is {q.display()}. See why below."


#: The learner's latest prediction per question (set by :func:`ask`, read by :func:`reveal`).
PREDICTIONS: dict[str, object] = {}


def ask(question_id: str, prediction) -> None:
    """Print whether ``prediction`` answers lesson question ``question_id`` (None: not answered yet)."""
    line = verdict(question_id, prediction)  # validates the id and the kind of answer first
    if prediction is None:
        PREDICTIONS.pop(question_id, None)
    else:
        PREDICTIONS[question_id] = prediction
    print(line)


def reveal_line(question_id: str, measured, prediction=None) -> str:
    """The line :func:`reveal` prints; raises AssertionError when ``measured`` is not the answer."""
    if question_id not in QUESTIONS:
        raise ValueError(f"unknown question {question_id!r}; known: {', '.join(QUESTIONS)}")
    q = QUESTIONS[question_id]
    try:
        agrees = q.is_right(measured)
    except TypeError as err:
        raise TypeError(f"reveal({question_id!r}, ...): the measured value is of the wrong kind: {err}") from None
    if not agrees:
        raise AssertionError(f"Question {question_id}: the experiment measured {measured!r}, but the stored answer "
                             f"is {q.display()} (tolerance {q.rel_tol:g} relative): the lesson and its answer disagree")
    head = f"▶ Question {question_id}: the experiment says {q.display()}"
    if prediction is None:
        return head + " (you made no prediction above)."
    mark = "✔ your prediction was right" if q.is_right(prediction) else f"✘ you predicted {prediction!r}"
    return f"{head}; {mark}."


#: The text a revealed answer sits under, closed, until the learner opens it.
REVEAL_SUMMARY = "▶ Question {qid}: the experiment's answer (open it once you have made your prediction)"


class Withheld:
    """What an experiment printed while :func:`withheld` held it back, for :func:`reveal` to show folded."""

    def __init__(self) -> None:
        self.text = ""

    def __str__(self) -> str:
        return self.text


@contextlib.contextmanager
def withheld():
    """Hold back what the block prints, so that a reveal can show it folded with its answer::

        with withheld() as table:
            print(...)                      # the experiment's figures, which give the answer away
        reveal("01.a", measured, table)     # shown inside the reveal's <details>, not above it
    """
    held = Withheld()
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield held
    finally:
        held.text = buffer.getvalue()


class Revealed:
    """The answer of a question, folded: an HTML ``<details>`` element, with a plain-text fallback.

    Jupyter front ends (JupyterLab, Notebook, Colab, VS Code), GitHub's notebook view and nbconvert's
    HTML export all render the ``text/html`` form, in which the answer stays closed under a summary
    until the learner opens it; ``text/plain`` (what nbval compares, and what a terminal prints) has
    the answer line and the experiment's held-back output, the same on every machine.
    """

    def __init__(self, question_id: str, line: str, shows: str = "") -> None:
        self.question_id, self.line, self.shows = question_id, line, shows

    def __repr__(self) -> str:
        return self.line + ("\n" + self.shows.rstrip("\n") if self.shows.strip() else "")

    def _repr_html_(self) -> str:
        summary = html.escape(REVEAL_SUMMARY.format(qid=self.question_id))
        body = f"<p>{html.escape(self.line)}</p>"
        if self.shows.strip():
            body += f"<pre>{html.escape(self.shows.rstrip())}</pre>"
        return f'<details class="adam8-reveal"><summary>{summary}</summary>\n{body}\n</details>'


def reveal(question_id: str, measured, shows: Withheld | str = "") -> None:
    """End an experiment: check ``measured`` against the stored answer and show it, folded, with the prediction.

    ``shows`` (what :func:`withheld` held back, or a string) is shown inside the same fold, after the
    answer line: the experiment's own printout, which would give the answer away above the fold.
    """
    if not isinstance(shows, (Withheld, str)):
        raise TypeError(f"reveal({question_id!r}, ...): shows must be a string or what withheld() held back, "
                        f"got {type(shows).__name__}")
    revealed = Revealed(question_id, reveal_line(question_id, measured, PREDICTIONS.get(question_id)), str(shows))
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # plain Python without IPython: the text form
        get_ipython = display = None
    if get_ipython is not None and get_ipython() is not None:
        display(revealed)
    else:
        print(repr(revealed))
