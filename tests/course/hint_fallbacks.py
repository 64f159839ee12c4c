"""How often ``hint("NN.k")`` falls back to words that name no mistake, over the course's plausible wrong answers.

Each wrong answer of ``tests/workbooks/wrong_answers`` runs through its check (outcomes and hints reset first);
when the check fails and leaves a record (:func:`adam8lib.course.checks._common.last_failure`), levels 1, 2 and 3
of ``next_hint`` are read, and two things counted:

* **level 1 generic** — the level-1 text is the one given with no failure recorded (the section and the idea,
  whatever went wrong), so it says nothing tied to the failing property;
* **level 3 fallback** — the level-3 text is the exercise's ``"default"`` nudge or a general fallback
  (``GENERAL_NUDGES["values"]``/``["check"]``): not keyed to the mistake;
* **level 3 from the check** — the level-3 text is built on the check's own hint (no nudge is keyed to the
  mistake; :data:`adam8lib.course.hints.FROM_CHECK`): aimed at the mistake only through the check's words;
* **unnamed** — the check's hint only restates the rule (:func:`adam8lib.course.hints.restates_the_rule`): level 1
  says what the check saw and that it could not tell which part, level 3 how to find it
  (:data:`adam8lib.course.hints.UNNAMED`) — honest, but the check itself could name more.

::

    python -m tests.course.hint_fallbacks            # per workbook: caught, level-1 generic, level-3 fallback
    python -m tests.course.hint_fallbacks --list     # and each fallback: exercise, mistake key, wrong answer
    python -m tests.course.hint_fallbacks ex13 ex14  # only these workbooks

``tests/course/test_hints.py`` bounds the two shares with :func:`measure`.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections import defaultdict
from dataclasses import dataclass

from adam8lib.course.checks._common import last_failure
from adam8lib.course.hint_text import EXERCISES, GENERAL_NUDGES
from adam8lib.course.hints import FROM_CHECK, UNNAMED, _from_check, aim, next_hint
from tests.course._hint_state import forget_hints

__all__ = ["Row", "measure", "summary", "main"]


@dataclass(frozen=True)
class Row:
    """One caught wrong answer and what its hints said."""

    workbook: str  # "ex13"
    exercise: str
    mistake: str  # the wrong answer's own words
    key: str  # aim(failure)[0]
    plain: bool
    level1_generic: bool
    level3_fallback: bool
    level3_from_check: bool
    texts: tuple[str, str, str]
    probe: str = ""  # the level-3 question built on the check's words, were no nudge keyed to the mistake
    hint: str = ""  # the check's own hint
    unnamed: bool = False  # the check's hint restates the rule: levels 1 and 3 say how to find the mistake


def _generic_level1(exercise: str) -> str:
    """The level-1 text of ``exercise`` with no failure recorded (without its header line)."""
    forget_hints()
    return next_hint(exercise).text


def _fallbacks(exercise: str) -> set[str]:
    return {EXERCISES[exercise].nudges.get("default", ""), GENERAL_NUDGES["values"], GENERAL_NUDGES["check"]}


def measure(workbooks: list[str] | None = None) -> list[Row]:
    """A :class:`Row` per wrong answer whose check fails with a recorded failure (``workbooks``: "ex02", ...)."""
    from tests.workbooks.wrong_answers import collect

    wrong, _ = collect()
    rows: list[Row] = []
    generic: dict[str, str] = {}
    for w in wrong:
        workbook = w.check.__module__.rsplit(".", 1)[-1][:4]
        if workbooks and workbook not in workbooks:
            continue
        if w.exercise not in generic:
            generic[w.exercise] = _generic_level1(w.exercise)
        forget_hints()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                w.run()
            except AssertionError:
                pass
            except Exception:  # noqa: BLE001 - a crashing check leaves no hint to measure
                continue
        failure = last_failure(w.exercise)
        if failure is None:
            continue
        key, plain = aim(failure)
        texts = tuple(next_hint(w.exercise).text for _ in range(3))
        body3 = texts[2].split("\n", 1)[1].rsplit("\n", 1)[0]
        rows.append(Row(workbook, w.exercise, w.mistake, key, plain,
                        level1_generic=texts[0] == generic[w.exercise],
                        level3_fallback=body3.strip() in _fallbacks(w.exercise),
                        level3_from_check=body3.startswith(FROM_CHECK),
                        texts=texts, probe=_from_check(failure) if failure.hint else "", hint=failure.hint or "",
                        unnamed=body3.startswith(UNNAMED)))
    forget_hints()
    return rows


def summary(rows: list[Row]) -> dict[str, dict[str, int]]:
    """Per workbook (and "all"): caught, level1_generic, level3_fallback, level3_from_check, unnamed."""
    out: dict[str, dict[str, int]] = defaultdict(
        lambda: {"caught": 0, "level1_generic": 0, "level3_fallback": 0, "level3_from_check": 0, "unnamed": 0})
    for r in rows:
        for wb in (r.workbook, "all"):
            out[wb]["caught"] += 1
            out[wb]["level1_generic"] += r.level1_generic
            out[wb]["level3_fallback"] += r.level3_fallback
            out[wb]["level3_from_check"] += r.level3_from_check
            out[wb]["unnamed"] += r.unnamed
    return dict(sorted(out.items(), key=lambda kv: (kv[0] == "all", kv[0])))


def main(argv: list[str]) -> int:
    listing = "--list" in argv
    workbooks = [a for a in argv if not a.startswith("--")] or None
    rows = measure(workbooks)
    print(f"{'workbook':<9}{'caught':>7}{'L1 generic':>12}{'L3 fallback':>13}{'L3 from check':>15}{'unnamed':>9}")
    for wb, c in summary(rows).items():
        print(f"{wb:<9}{c['caught']:>7}{c['level1_generic']:>12}{c['level3_fallback']:>13}"
              f"{c['level3_from_check']:>15}{c['unnamed']:>9}")
    if listing:
        for r in rows:
            flags = (("L1 " if r.level1_generic else "   ") + ("L3 " if r.level3_fallback else "   ")
                     + ("CK " if r.level3_from_check else "   ") + ("UN" if r.unnamed else "  "))
            print(f"{flags} {r.exercise} key={r.key}{'' if r.plain else '?'}: {r.mistake}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
