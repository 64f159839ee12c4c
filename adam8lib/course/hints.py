"""Hints on request, in three steps: ``hint("13.1")``.

One level per call, per exercise::

    >>> from adam8lib.course import hint
    >>> hint("02.2")      # 1: the idea to revisit — the lesson section, one sentence, no code — and, after a
    ...                   #    failed check, which part of it the failing property belongs to
    >>> hint("02.2")      # 2: what your last failed check got wrong: which property, on which input
    >>> hint("02.2")      # 3: a nudge for that mistake (never the code); later calls repeat it

Level 2 reads the record the checks leave when they fail (:func:`adam8lib.course.checks._common.last_failure`:
the exercise, ``what`` was called, the property — the stub, no ``return``, the type, an error, an input
changed in place, the shape, the dtype, NaN/Inf, the values —, the check's words and its hint). A new failure
of a different property sends the exercise back to level 2. A failing check ends its message with the line
to type (``→ property that failed: the shape · stuck? run  hint("04.1")``), and binds ``hint`` in the
notebook when that name is free.

Levels 1 and 3 aim at one key per failure (:func:`aim`): the structural property (no return, a type, an error, an
input changed, ...), else the exercise's own mistake whose pattern the check's hint matches (``mistakes`` in
:mod:`adam8lib.course.hint_text`), else a topic the check's words name plainly. Level 1 adds that key's part of the
section; level 3 gives its nudge, and for a mistake no nudge is keyed to, a question built on the check's own words
(which input to work by hand, what to compare) rather than the exercise's default. ``python -m
tests.course.hint_fallbacks`` counts, over the course's wrong answers, how often either level still falls back.

The words are in :mod:`adam8lib.course.hint_text`; the lesson sections in
:data:`adam8lib.course.grading.lessons.SECTIONS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .checks._common import Failure, last_failure, outcome
from .hint_text import EXERCISES, GENERAL_NUDGES, GENERIC_OPENINGS, LESSONS, LOCATE, RULES

__all__ = ["hint", "next_hint", "Hint", "property_words", "kind_of", "mistake_of", "classify", "aim", "nudge_source",
           "reset_hints", "restates_the_rule", "TOPICS", "FROM_CHECK", "UNNAMED", "NO_MISTAKE_NAMED"]

#: (topic, words for the learner, pattern in the check's message and hint), first match wins; a failure of
#: kind "values" or "check" is keyed by the topic its check's words name
TOPICS: list[tuple[str, str, re.Pattern]] = [(t, w, re.compile(p, re.IGNORECASE)) for t, w, p in [
    ("refuse", "an argument that must be refused", r"\brefus|\baccept(ed|s)\b|must raise|raise (a )?(ValueError|TypeError)"),
    ("first_step", "the first step (bias correction, the step count)",
     r"bias[- ]correct|first step|first update|step ?= ?0|step [+-] 1\b|step 1\b|count(s|ing)? from 1|1 - beta\*\*|step count"),
    ("in_place", "an update in place", r"in place|in-place|copy_\(|modified its argument"),
    ("hook", "the gradient hook", r"\bhook"),
    ("order", "the order of two operations",
     r"\border\b|\bswapped\b|(?-i:\bBEFORE\b|\bAFTER\b)|"
     r"\b(before|after) (backward|the update|the Adam update|the step|clipping|the EMA|the max|scaler\.step|step\(\)|it)\b|"
     r"\bright after\b|\bfirst,? then\b"),
    ("last_block", "the last, short block (a size that is not a multiple)",
     r"partial|ragged|short last|last block|the tail|ceil\(|not a multiple|round(s|ed)? up|odd (number|count)"),
    ("sign", "a sign", r"\bsign"),
    ("decay", "weight decay", r"decay"),
    ("zero", "zeros (an all-zero block, 0 / 0, a value coded 0)", r"all-zero|0 / 0|divi(de|sion) by zero|coded 0|== 0\b"),
    ("axis", "an axis or a dimension", r"\baxis|\baxes|dimension|keepdim|transpos|broadcast|\bflat|\brow|\bcolumn"),
    ("rounding", "rounding (nearest, ties)", r"\bround(ing|ed|s)?\b|nearest|\bties?\b|one off|truncat"),
    ("denominator", "eps or the square root", r"\beps\b|sqrt|square root"),
    ("state", "the optimizer's state", r"self\.state|state dict|state_dict|\bexp_avg"),
    ("block", "which block an element belongs to", r"(?<!autocast )\bblocks?\b"),
    ("count", "a count (each thing once, a boundary case)",
     r"\bcount|off-by-one|\bonce\b|\btwice\b|exactly \d|threshold|min_8bit_size"),
    ("factor", "a constant factor or a unit", r"factor|\bMiB\b|\bMB\b|\bbytes\b|2\*\*20|times the expected"),
    ("dtype", "a dtype", r"\bdtype|float32|bfloat16|float16|\bint8\b|\buint8\b"),
]]

#: the sentences of the checks' property finder (checks/_properties.describe) -> the topic they name
_PHRASES: list[tuple[str, re.Pattern]] = [(t, re.compile(p, re.IGNORECASE)) for t, p in [
    ("factor", r"right sign everywhere but the wrong size|up to a constant factor|bytes vs MiB|MB = 10\*\*6"),
    ("sign", r"opposite sign|absolute value of the expected|wrong sign at|where the (input|gradient) is (negative|positive)"),
    ("last_block", r"the partial last block|one fewer than the|only the last entry"),
    ("zero", r"all-zero block|where the (input|gradient) is exactly 0"),
    ("nonfinite", r"where the (input|gradient) is NaN or Inf"),
    ("block", r"block boundaries|every block but the first|only the first block"),
    ("rounding", r"codes are one off|rounded to a whole number"),
    ("count", r"moved one position|off-by-one"),
    ("dtype", r"close but not exact: relative error"),
    ("axis", r"your result is flat|axes are swapped|size-1 dimension|reduced over dimension"),
    ("in_place", r"did not move at all"),
]]

#: a check's first line saying that an argument was accepted or refused when it should not have been
_REFUSAL = re.compile(r"\bwas (accepted|refused)\b|\bnot refused\b|\bshould (refuse|raise)\b")

_KIND_WORDS = {
    "stub": "none yet: the function is still the workbook's stub",
    "none": "nothing returned (None)",
    "type": "the type of what the check got",
    "error": "your code raised an error",
    "in_place": "an input changed in place",
    "shape": "the shape",
    "dtype": "the dtype",
    "nonfinite": "NaN/Inf values",
    "keys": "the keys of the dict",
}
_STRUCTURAL = set(_KIND_WORDS)
#: mistakes whose general nudge fits any exercise (the others get the exercise's own nudge when it has none)
_ANY_EXERCISE = _STRUCTURAL | {"dtype_mix", "refuse"}
_TOPIC_WORDS = {topic: words for topic, words, _ in TOPICS}


#: a check's own words (a ``fail`` of its exNN module) that name a structural property
_WORDED_KINDS = [
    ("none", re.compile(r"\breturned (a )?(builtins\.)?(NoneType|None)\b|\bno `?return\b")),
    ("type", re.compile(r"\breturned (a |an )?[\w.]+(, | instead| where)|\bshould (be|return|contain) (a|an|the)?\b|"
                        r"\bexpected (a|an) (tensor|torch|tuple|pair|number|dict|list|bool|int|float|str|Python)|"
                        r"\bnot (a|an) (\w+ )?(subclass|kernel|tensor|tuple|list|dict)\b|not a Triton kernel|"
                        r"\bnot hook handles\b|\bgot (Tensor|tuple|list|dict|str|int|float)\b|"
                        r"\bhas dtype (tuple|list|dict|int|float|str|bool|NoneType)\b")),
    ("shape", re.compile(r"\bhas shape\b|\bshape \(.*\), expected")),
    ("dtype", re.compile(r"\bhas dtype\b")),
]

_RETURN_A = re.compile(r"return (a|an) (pair|tuple|tensor|[\w-]+ tensor|list|dict|float|int|Python|bool)\b", re.IGNORECASE)


def _without_arguments(text: str) -> str:
    """The words of a message without its call's argument list (``fn(shape=(7,), dtype=...)``)."""
    for _ in range(3):
        text = re.sub(r"\([^()]*\)", "", text)
    return text


def kind_of(failure: Failure) -> str:
    """``failure.kind``, or for a check's own words (``"check"``) the structural property they state."""
    if failure.kind != "check":
        return failure.kind
    words = _without_arguments(failure.message)
    for kind, pattern in _WORDED_KINDS:
        if pattern.search(words):
            return kind
    if failure.hint and _RETURN_A.match(failure.hint):
        return "type"
    return "check"


def _first_clause(text: str) -> str:
    """The words before the first ':', ';', ' — ' or end of sentence: where a check's hint names the mistake."""
    return re.split(r":|;| — |\.\s", text, maxsplit=1)[0]


def _by_priority(text: str) -> str | None:
    return next((topic for topic, _, pattern in TOPICS if pattern.search(text)), None)


def classify(failure: Failure) -> tuple[str, bool]:
    """(the key of ``failure``'s mistake, whether the check's words say it plainly).

    The key is the kind when that says it (none, type, error, in place, shape, dtype, NaN/Inf, keys: plain);
    else the topic the check's hint names — plain when a sentence of the property finder or the first clause
    of the hint names it, not plain when only the rest of the hint or the message does —; else
    ``"values"``/``"check"``."""
    kind = kind_of(failure)
    if kind in _STRUCTURAL:
        if kind == "error" and failure.hint and re.search(r"dtype", failure.hint):
            return "dtype_mix", True
        return kind, True
    hint = failure.hint or ""
    for topic, pattern in _PHRASES:
        if pattern.search(hint):
            return topic, True
    if _REFUSAL.search(failure.message):
        return "refuse", True
    topic = _by_priority(_first_clause(hint))
    if topic:
        return topic, True
    topic = _by_priority(hint) or _by_priority(_without_arguments(failure.message))
    return (topic, False) if topic else (kind, False)


def _own_mistake(failure: Failure) -> str | None:
    """The first of the exercise's own mistakes (:attr:`ExerciseHints.mistakes`) whose pattern the check's hint
    matches — the part before a restated rule ("The rule: ..."): the exercise's vocabulary for a mistake its check
    names in its own words. The message is not read (it holds the learner's numbers and names, not the mistake)."""
    item = EXERCISES.get(failure.exercise)
    if item is None or not item.mistakes or not failure.hint:
        return None
    hint = re.split(r"\bThe rule:", failure.hint, maxsplit=1)[0]
    return next((key for key, pattern in item.mistakes if re.search(pattern, hint, re.IGNORECASE)), None)


#: the key of a failure whose check's hint names no mistake (:func:`restates_the_rule`)
NO_MISTAKE_NAMED = "unnamed"


def restates_the_rule(failure: Failure) -> bool:
    """Whether ``failure``'s hint only restates the rule (:data:`adam8lib.course.hint_text.RULES`): the check's
    fallback when none of the mistakes it knows matched. Its words are the rule's, so a mistake picked from them
    would be a guess (cold learners were sent to "a fresh absmax per block" for an eps in the wrong place)."""
    hint = (failure.hint or "").strip()
    return bool(hint) and hint.startswith(RULES.get(failure.exercise, ()) + GENERIC_OPENINGS)


def aim(failure: Failure) -> tuple[str, bool]:
    """(the key levels 1 and 3 aim at, whether it is sure): a structural kind (:func:`classify`: no return, a type,
    an error, ...); else :data:`NO_MISTAKE_NAMED` when the check's hint only restates the rule; else the exercise's
    own mistake that its check's words match (:attr:`ExerciseHints.mistakes`, the most specific words, listed first);
    else :func:`classify`'s key (sure when the check's words name it plainly)."""
    key, plain = classify(failure)
    if plain and (key == kind_of(failure) or key == "dtype_mix"):  # the property itself (not a topic of that name)
        return key, True
    if restates_the_rule(failure):
        return NO_MISTAKE_NAMED, True
    own = _own_mistake(failure)
    if own is not None:
        return own, True
    return key, plain


def mistake_of(failure: Failure) -> str:
    """The key of ``failure``'s mistake (:func:`aim`): levels 1 and 3 and the reset to level 2 use it."""
    return aim(failure)[0]


def property_words(failure: Failure) -> str:
    """The property that failed, in a few words (the check's message line and level 2 use them): the check's own
    words when it gave some (``fail(..., prop=...)``)."""
    if getattr(failure, "words", ""):
        return failure.words
    kind = kind_of(failure)
    if kind == "error" and failure.got:
        return f"your code raised {failure.got}"
    if kind in _KIND_WORDS:
        return _KIND_WORDS[kind]
    # no guessed topic here: the check's own Hint, printed right below, names the mistake (a topic read from its
    # words named another mistake too often: cold learners found "the last, short block" on exercises with no blocks)
    return "the values" if failure.kind == "values" else "a property the check names"


@dataclass(frozen=True)
class Hint:
    """One hint: the exercise, its level (1–3) and the text printed."""

    exercise: str
    level: int
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass
class _Progress:
    level: int = 0
    mistake: tuple | None = None  # (kind, mistake key) of the failure level 2 or 3 was about


_PROGRESS: dict[str, _Progress] = {}


def reset_hints() -> None:
    """Start every exercise's hints again at level 1."""
    _PROGRESS.clear()


def _exercise_id(exercise) -> str:
    """ "13.1", "13.01", 13.1, "check_lion8bit", "lion8bit" -> "13.1"; ValueError listing the valid ids."""
    text = str(exercise).strip().strip("\"'")
    if text.startswith("check_"):
        text = text[len("check_"):]
    for key, item in EXERCISES.items():
        if text == item.check:
            return key
    found = re.fullmatch(r"(?:Exercise\s+)?(\d{1,2})\.(\d{1,2})", text)
    if found:
        key = f"{int(found.group(1)):02d}.{int(found.group(2))}"
        if key in EXERCISES:
            return key
    raise ValueError(f"no graded exercise {exercise!r}; the exercises with hints are: {', '.join(EXERCISES)}")


def _section(exercise: str) -> str:
    from .grading.lessons import SECTIONS, _plain

    lesson = f"notebooks/{LESSONS[exercise[:2]]}"
    heading = SECTIONS.get(EXERCISES[exercise].check)
    return f"{lesson}, section “{_plain(heading)}”" if heading else lesson


def _clip(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: level 1's part of the section for a structural property, in any exercise
_KIND_PARTS = {
    "stub": "nothing of yours ran yet — the function in your exercise cell is still the workbook's stub",
    "none": "what your function hands back — the statement's sentence on what it returns",
    "type": "the type of your result — the statement's sentence on what it returns, and in which container",
    "error": "an error inside your code — the shapes and dtypes of the tensors the rule combines",
    "in_place": "an input your function changed — which tensors it may write into and which it only reads",
    "shape": "the shape of your result — which dimensions the rule keeps, adds or reduces",
    "dtype": "the dtype of your result — the dtypes the statement asks for",
    "nonfinite": "NaN or Inf in your result — the rule's special cases (a zero denominator, a non-finite input)",
    "keys": "the keys of your result — the names the statement gives",
    "dtype_mix": "two dtypes meeting in one operation — the dtype each intermediate value must have",
    "refuse": "an argument that must be refused — the statement's list of what is invalid and the error to raise",
}


def _part(exercise: str, failure: Failure | None) -> str | None:
    """Which part of the section ``failure``'s property belongs to: the exercise's own words for its mistake key,
    else the words for a structural property; None when no key is sure."""
    if failure is None:
        return None
    key, plain = aim(failure)
    if not plain:
        return None
    if key == NO_MISTAKE_NAMED:
        return (f"{_seen(failure)} — the check's hint only restates the rule, so it could not tell which part of it "
                "your code gets wrong (step 3: how to find it)")
    return EXERCISES[exercise].parts.get(key) or _KIND_PARTS.get(key)


def _seen(failure: Failure) -> str:
    """What the check saw, from its message: the first sentence, without the worst entry's numbers."""
    first = failure.message.strip().split("\n", 1)[0]
    first = re.split(r";\s*(worst|first) ", first, maxsplit=1)[0].rstrip(". ")
    return _clip(first, 240)


def _level1(exercise: str, failure: Failure | None = None) -> str:
    item = EXERCISES[exercise]
    text = (f"Revisit {_section(exercise)}.\n"
            f"The idea: {item.idea}")
    part = _part(exercise, failure)
    if part:
        text += f"\nWhere your last check failed: {part}."
    return text


def _level2(exercise: str, failure: Failure | None) -> str:
    if failure is None:
        if outcome(exercise) == "passed":
            return (f"The last run of exercise {exercise}'s check in this notebook passed: there is nothing to fix. "
                    "(Run the check again after a change to see whether it still does.)")
        return (f"No failed check of exercise {exercise} is recorded in this session: run your exercise cell, then "
                f"its check cell (the one that calls check_{EXERCISES[exercise].check}), and call hint(\"{exercise}\") "
                "again — this step then tells you which property failed on which input.")
    lines = []
    on = f" on {failure.what}" if failure.what else ""
    kind = kind_of(failure)
    if kind != failure.kind and kind != "none":  # the check's own words state it: show them
        lines.append(f"The {kind} of your result{on}: " + _clip(failure.message, 300))
        kind = "reported"
    if kind == "stub":
        lines.append(f"Your function is still the stub{on}: it raises NotImplementedError, so nothing of yours ran "
                     "yet. Replace the stub's raise line with your code and run that cell before the check.")
    elif kind == "none":
        lines.append(f"Nothing came back{on}: the result is None. Your function computes something but has no "
                     "`return` of it (or returns before the end).")
    elif kind == "type":
        got = f" {failure.got}" if failure.got else " something else"
        want = f" where the check expects {failure.expected}" if failure.expected else ""
        lines.append(f"The type of your result{on}: you returned{got}{want}.")
    elif kind == "error":
        lines.append(f"Your code raised {failure.got or 'an error'}{on} — an error inside your function, not a wrong "
                     "number. The check's words: " + _clip(failure.message, 300))
    elif kind == "in_place":
        lines.append(f"Your function changed its input `{failure.got}` in place{on}: the caller still needs it as "
                     "it was.")
    elif kind in ("shape", "dtype", "keys"):
        lines.append(f"The {'keys' if kind == 'keys' else kind} of your result{on}: got {failure.got}, expected "
                     f"{failure.expected}.")
    elif kind == "nonfinite":
        lines.append(f"NaN or Inf{on}: your result is {failure.got} where the reference has {failure.expected} — "
                     "usually a division by zero, or a non-finite input that needs its own rule.")
    elif kind == "values":
        detail = f": got {failure.got}, expected {failure.expected}" if failure.got else ""
        lines.append(f"The values of your result{on}{detail}.")
    elif kind == "check":
        lines.append(f"The check found{on}: " + _clip(failure.message, 300))
    if failure.hint and kind not in ("stub",):
        lines.append("The check's hint: " + _clip(failure.hint))
    return "\n".join(lines)


#: the opening of a level-3 nudge built on the check's own words (no keyed nudge for the mistake)
FROM_CHECK = "Your check named the mistake:"

#: the opening of level 3 when the check's hint named no mistake (:func:`restates_the_rule`)
UNNAMED = "Your check could not name the mistake:"


def _difference(failure: Failure) -> str:
    """" Your result minus the expected one: -21,504." when both sides are whole numbers, else ""."""
    try:
        got, expected = int(str(failure.got).replace(",", "")), int(str(failure.expected).replace(",", ""))
    except ValueError:
        return ""
    return f" Your result minus the expected one: {got - expected:+,}." if got != expected else ""


def _locate(exercise: str, failure: Failure) -> str:
    """Level 3 for a hint that names no mistake: what the check saw, and how to find the mistake on that case."""
    return (f"{UNNAMED} it saw only that {_seen(failure)}.{_difference(failure)} "
            + LOCATE.get(exercise, GENERAL_NUDGES[NO_MISTAKE_NAMED]))


#: a word of code in a check's hint (a call, an assignment, an index, a name with _ or a dot): level 3 never quotes it
_CODE_WORD = re.compile(r"[()=`\[\]_{}]|\*\*|//|\w\.\w|<-")


def _from_check(failure: Failure) -> str:
    """A nudge built on the check's hint: its first clause (where checks name the mistake) unless it holds code, then
    which case to work by hand and what to compare — never a line of code."""
    clause = _clip(_first_clause(failure.hint or "").strip().rstrip("."), 220)
    named = (f"{FROM_CHECK} “{clause}”." if not _CODE_WORD.search(clause)
             else f"{FROM_CHECK} its hint (step 2 shows it again) says what your code does differently.")
    on = f" ({_clip(failure.what, 120)})" if failure.what else ""
    return (f"{named} Do not rewrite the whole function: take the one input the check failed "
            f"on{on}, work it by hand with the lesson's rule, and write each intermediate value next to the one your "
            "code computes. Which is the first value that differs — and does the check's sentence describe the line "
            "that makes it?")


def nudge_source(exercise: str, failure: Failure | None) -> str:
    """Where level 3's nudge for ``failure`` comes from: ``"exercise"`` (the exercise's nudge for its mistake key),
    ``"general"`` (a structural mistake's nudge), ``"located"`` (the check named no mistake: how to find it),
    ``"check"`` (built on the check's hint) or ``"default"``."""
    if failure is None:
        return "default"
    nudges = EXERCISES[exercise].nudges
    key, plain = aim(failure)
    if key == NO_MISTAKE_NAMED:
        return "located"
    if plain and key in nudges and key != "default":
        return "exercise"
    if plain and key in _ANY_EXERCISE:
        return "general"
    if failure.hint and _first_clause(failure.hint).strip():
        return "check"
    return "default"


def _level3(exercise: str, failure: Failure | None) -> str:
    nudges = EXERCISES[exercise].nudges
    if failure is None:
        if outcome(exercise) == "passed":
            return f"The last run of exercise {exercise}'s check passed: there is no mistake to nudge."
        return (nudges.get("default", GENERAL_NUDGES["values"])
                + f"\n(Run the check cell first for a nudge aimed at your own mistake.)")
    source = nudge_source(exercise, failure)
    if source == "exercise":
        return nudges[aim(failure)[0]]
    if source == "general":
        return GENERAL_NUDGES[aim(failure)[0]]
    if source == "located":
        return _locate(exercise, failure)
    if source == "check":  # no nudge keyed to this mistake: a question on the check's own words
        return _from_check(failure)
    return nudges.get("default", GENERAL_NUDGES["check"])


def next_hint(exercise) -> Hint:
    """The next hint for ``exercise`` (and move its level on): see :func:`hint`."""
    key = _exercise_id(exercise)
    failure = last_failure(key)
    mistake = (kind_of(failure), mistake_of(failure)) if failure is not None else None
    progress = _PROGRESS.setdefault(key, _Progress())
    if progress.level >= 2 and mistake is not None and mistake != progress.mistake:
        level = 2  # a new failure of another property: what is wrong now
    else:
        level = min(progress.level + 1, 3)
    repeat = progress.level == 3 and level == 3
    progress.level = level
    if level >= 2:
        progress.mistake = mistake
    item = EXERCISES[key]
    head = f"Hint {level} of 3 · Exercise {key} · {item.title}"
    if level == 1:
        body = _level1(key, failure)
        tail = f'Still stuck? hint("{key}") again says what your last check run got wrong.'
    elif level == 2:
        body = _level2(key, failure)
        tail = f'Still stuck? hint("{key}") again gives a nudge for this mistake.'
    else:
        body = _level3(key, failure)
        tail = (f"That is all the hints for {key}: calling hint(\"{key}\") again repeats this one"
                + (" (a new failure of another kind starts again at step 2)." if failure is not None else "."))
        if repeat:
            head += " (again)"
    return Hint(key, level, f"{head}\n{body}\n{tail}")


def hint(exercise) -> None:
    """Print the next hint for ``exercise`` ("13.1"): the idea to revisit, then what your last failed check got
    wrong, then a nudge for that mistake; further calls repeat the nudge. ValueError for an unknown id."""
    print(next_hint(exercise).text)
