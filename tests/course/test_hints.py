"""hint("NN.k"): three levels per exercise, read from the record a failing check leaves, never the code.

* every graded exercise (43, workbooks 01–14) has hints, a lesson section and a check whose title names it;
* levels: 1 the idea and the section, 2 the property of the last failed check, 3 a nudge (repeated, "that is
  all"); a new failure of another property goes back to 2; levels are per exercise; unknown ids are refused;
* a failing check names the property and the call to type, before its ``Hint:`` (which stays last, for the
  feedback pages); a passing check prints its one success line, unchanged; a missing return, a tuple and a
  torch error are named as such, never a crash;
* no hint text contains a line of the solutions' code.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import re
import sys
import types
from pathlib import Path

import pytest
import torch

import adam8lib.course
from adam8lib.course import checks
from adam8lib.course.checks._common import call, last_failure, outcome, success_line
from adam8lib.course.grading.conventions import BEGIN, END
from adam8lib.course.grading.feedback import split_hint
from adam8lib.course.grading.lessons import SECTIONS
from adam8lib.course.hint_text import EXERCISE_OF_CHECK, EXERCISES, GENERAL_NUDGES, LESSONS
from adam8lib.course.hints import TOPICS, next_hint
from tests.course._hint_state import forget_hints, fresh_hints  # noqa: F401 (fresh_hints: autouse)

ROOT = Path(__file__).resolve().parents[2]
PROPERTY = "→ property that failed:"


def _fails(check, answer, *args) -> str:
    with pytest.raises(AssertionError) as info, contextlib.redirect_stdout(io.StringIO()):
        check(answer, *args)
    return str(info.value)


# --- wrong answers used below (written for these tests, not the workbooks' own lists) --------------------

def late_bias(m, v, beta1, beta2, step):  # 02.2: one step too far
    return m / (1 - beta1 ** (step + 1)), v / (1 - beta2 ** (step + 1))


def no_return(m, v, beta1, beta2, step):  # 02.2: computes, returns nothing
    m / (1 - beta1 ** step)


def right_bias(m, v, beta1, beta2, step):
    return m / (1 - beta1 ** step), v / (1 - beta2 ** step)


def moments_tuple_of_three(m, v, g, beta1, beta2):  # 02.1: a tuple of the wrong length
    return m, v, g


def moments_torch_error(m, v, g, beta1, beta2):  # 02.1: a torch error inside the learner's code
    return m + torch.zeros(m.numel() + 1), v


def quantize_no_return(x):  # 04.1
    torch.round(127 * x / x.abs().max())


def quantize_tuple_for_tensor(x):  # 04.1: the codes as a Python tuple
    absmax = x.abs().max().float()
    q = torch.round(127 * x.float() / absmax.clamp_min(1e-30)).to(torch.int8)
    return tuple(q.reshape(-1).tolist()), absmax


def quantize_torch_error(x):  # 04.1: shapes that do not broadcast
    return x.reshape(-1)[:2] + torch.zeros(3), x.abs().max()


# --- coverage ------------------------------------------------------------------------------------------

def test_every_graded_exercise_has_hints_a_section_and_a_check():
    assert len(EXERCISES) == 43
    assert {item.check for item in EXERCISES.values()} == set(checks.CHECKS)
    assert set(EXERCISE_OF_CHECK.values()) == set(EXERCISES)
    for exercise, item in EXERCISES.items():
        assert item.check in SECTIONS, exercise
        assert exercise[:2] in LESSONS and (ROOT / "notebooks" / LESSONS[exercise[:2]]).is_file()
        source = inspect.getsource(checks.CHECKS[item.check])
        assert f"Exercise {exercise} ·" in source, f"check_{item.check}'s title does not name {exercise}"
        assert item.idea and item.nudges.get("default"), exercise


def test_the_texts_are_small_and_the_idea_is_one_sentence():
    for exercise, item in EXERCISES.items():
        sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z])", item.idea.strip())
        assert len(sentences) == 1 and len(item.idea) <= 320, (exercise, item.idea)
        for key, text in item.nudges.items():
            assert len(text) <= 320, (exercise, key)
            assert key in KEYS or key in {k for k, _ in item.mistakes}, (exercise, key)
        for key, text in item.parts.items():
            assert 10 <= len(text) <= 200 and "\n" not in text, (exercise, key)


KEYS = {"default", "values", *GENERAL_NUDGES, *(topic for topic, _, _ in TOPICS)}


def test_every_mistake_of_an_exercise_has_a_pattern_a_part_and_a_nudge():
    """The exercises' own mistakes (hint_text.FOCUS): each pattern compiles, each key has the part level 1 names and a
    nudge (its own, a general one, or the exercise's for that topic); every keyed nudge has its part."""
    from adam8lib.course.hints import _KIND_PARTS

    for exercise, item in EXERCISES.items():
        for key, pattern in item.mistakes:
            re.compile(pattern)
            assert key in item.parts or key in _KIND_PARTS, (exercise, key)
            assert key in item.nudges or key in GENERAL_NUDGES, (exercise, key)
        for key in item.nudges:
            assert key == "default" or key in item.parts or key in _KIND_PARTS, (exercise, key)


# --- levels --------------------------------------------------------------------------------------------

def test_three_levels_then_the_nudge_again():
    message = _fails(checks.check_bias_correct, late_bias)
    assert last_failure("02.2").kind == "values"
    first = next_hint("02.2")
    assert first.level == 1
    assert "notebooks/02_ema.ipynb, section “Bias correction”" in first.text and "The idea:" in first.text
    second = next_hint("02.2")
    assert second.level == 2
    assert "bias_correct after 1 steps" in second.text and "The values of your result" in second.text
    assert "the first step" in second.text  # the property the check's hint names
    third = next_hint("02.2")
    assert third.level == 3 and EXERCISES["02.2"].nudges["first_step"] in third.text
    assert "That is all the hints for 02.2" in third.text
    again = next_hint("02.2")
    assert again.level == 3 and "(again)" in again.text and EXERCISES["02.2"].nudges["first_step"] in again.text
    assert PROPERTY in message


def test_a_new_failure_of_another_property_goes_back_to_level_2_the_same_one_does_not():
    _fails(checks.check_bias_correct, late_bias)
    for _ in range(3):
        next_hint("02.2")
    _fails(checks.check_bias_correct, late_bias)  # the same mistake again: still the nudge
    assert next_hint("02.2").level == 3
    _fails(checks.check_bias_correct, no_return)  # another property: what is wrong now
    now = next_hint("02.2")
    assert now.level == 2 and "Nothing came back" in now.text
    assert next_hint("02.2").level == 3


def test_levels_are_per_exercise():
    _fails(checks.check_bias_correct, late_bias)
    for _ in range(3):
        next_hint("02.2")
    assert next_hint("02.1").level == 1
    assert next_hint("02.2").level == 3


def test_without_a_recorded_failure_level_2_says_so_and_what_to_run():
    assert next_hint("04.1").level == 1
    second = next_hint("04.1")
    assert second.level == 2 and "No failed check of exercise 04.1 is recorded" in second.text
    assert "check_absmax_quantize" in second.text
    third = next_hint("04.1")
    assert EXERCISES["04.1"].nudges["default"] in third.text and "Run the check cell first" in third.text


def test_after_a_pass_level_2_says_it_passed():
    with contextlib.redirect_stdout(io.StringIO()) as out:
        checks.check_bias_correct(right_bias)
    assert out.getvalue() == success_line("Exercise 02.2 · Bias correction") + "\n"  # unchanged success line
    assert outcome("02.2") == "passed" and last_failure("02.2") is None
    next_hint("02.2")
    assert "passed: there is nothing to fix" in next_hint("02.2").text


def test_unknown_ids_are_refused_with_the_valid_ones_and_other_spellings_work():
    with pytest.raises(ValueError) as info:
        next_hint("15.1")
    assert "01.1" in str(info.value) and "14.2" in str(info.value) and "13.1" in str(info.value)
    with pytest.raises(ValueError):
        next_hint("02.9")
    assert next_hint("2.2").exercise == "02.2"
    assert next_hint("check_lion8bit").exercise == "13.1"
    assert next_hint(13.3).exercise == "13.3"


def test_hint_prints_and_is_exported_by_the_course_package(capsys):
    adam8lib.course.hint("12.3")
    out = capsys.readouterr().out
    assert out.startswith("Hint 1 of 3 · Exercise 12.3 · Rank-1 normalization")
    assert "section “4 · Rank-1 normalization”" in out


# --- what a failing check says -------------------------------------------------------------------------

@pytest.mark.parametrize("check, answer, words, kind", [
    (checks.check_bias_correct, no_return, "nothing returned (None)", "none"),
    (checks.check_adam_moments, moments_tuple_of_three, "the type of what the check got", "type"),
    (checks.check_adam_moments, moments_torch_error, "your code raised RuntimeError", "error"),
    (checks.check_absmax_quantize, quantize_no_return, "nothing returned (None)", "none"),
    (checks.check_absmax_quantize, quantize_tuple_for_tensor, "the type of what the check got", "type"),
    (checks.check_absmax_quantize, quantize_torch_error, "your code raised RuntimeError", "error"),
])
def test_a_missing_return_a_tuple_and_a_torch_error_are_named(check, answer, words, kind):
    message = _fails(check, answer)
    [line] = [ln for ln in message.splitlines() if ln.startswith(PROPERTY)]
    assert words in line and 'hint("' in line
    exercise = re.search(r'hint\("(\d\d\.\d)"\)', line).group(1)
    from adam8lib.course.hints import kind_of

    assert kind_of(last_failure(exercise)) == kind
    next_hint(exercise)
    second = next_hint(exercise).text
    assert {"none": "Nothing came back", "type": "The type of your result",
            "error": "Your code raised RuntimeError"}[kind] in second


def test_the_property_line_comes_before_the_hint_which_stays_last():
    message = _fails(checks.check_bias_correct, late_bias)
    lines = message.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith(PROPERTY))
    assert lines[at + 1].startswith("Hint: ") and at + 2 == len(lines)
    hint, rest = split_hint(message)
    assert hint == lines[-1][len("Hint: "):] and PROPERTY not in hint


def test_a_check_that_re_raises_a_message_keeps_one_property_line():
    """call_any_shape (04.1) re-raises call's message with a hint about shapes: one property line, the error."""
    def loops_over_x(x):
        absmax = max(abs(float(v)) for v in x)
        return torch.tensor([round(127 * float(v) / absmax) for v in x], dtype=torch.int8), torch.tensor(absmax)

    message = _fails(checks.check_absmax_quantize, loops_over_x)
    assert sum(ln.startswith(PROPERTY) for ln in message.splitlines()) == 1


def test_outside_a_check_nothing_is_recorded_and_the_message_is_unchanged():
    def boom(x):
        raise ValueError("nope")

    with pytest.raises(AssertionError) as info:
        call(boom, torch.zeros(2))
    assert PROPERTY not in str(info.value) and not any(outcome(e) != "not run" for e in EXERCISES)


def test_in_a_notebook_hint_is_bound_when_the_name_is_free(monkeypatch):
    shell = types.SimpleNamespace(user_ns={})
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    message = _fails(checks.check_bias_correct, late_bias)
    assert shell.user_ns["hint"] is adam8lib.course.hint
    assert 'stuck? run  hint("02.2")' in message and "import" not in message.split(PROPERTY)[1].splitlines()[0]
    from adam8lib.course.checks._common import _bind_hint

    fresh = types.SimpleNamespace(user_ns={})  # importing the checks binds it too (the check cell's import)
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: fresh))
    assert _bind_hint() and fresh.user_ns["hint"] is adam8lib.course.hint
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    mine = object()
    shell.user_ns["hint"] = mine  # a learner's own `hint` is never replaced: the line then gives the import
    message = _fails(checks.check_bias_correct, late_bias)
    assert shell.user_ns["hint"] is mine and 'from adam8lib.course import hint; hint("02.2")' in message


# --- never the code ------------------------------------------------------------------------------------

def _solution_lines() -> set[str]:
    lines = set()
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            for body in re.findall(re.escape(BEGIN) + r"(.*?)" + re.escape(END), source, flags=re.S):
                for line in body.splitlines():
                    code = " ".join(line.split("#", 1)[0].split())
                    if len(code) >= 8:
                        lines.add(code)
    return lines


SOLUTION_LINES = _solution_lines()


def _leaks(text: str) -> list[str]:
    flat = " ".join(text.split())
    return [line for line in SOLUTION_LINES if line in flat]


def test_the_solutions_are_read():
    assert len(SOLUTION_LINES) > 200


def test_no_idea_or_nudge_contains_a_solution_line():
    texts = [(ex, "idea", item.idea) for ex, item in EXERCISES.items()]
    texts += [(ex, key, text) for ex, item in EXERCISES.items() for key, text in item.nudges.items()]
    texts += [(ex, "part " + key, text) for ex, item in EXERCISES.items() for key, text in item.parts.items()]
    texts += [("general", key, text) for key, text in GENERAL_NUDGES.items()]
    leaks = [(ex, key, found) for ex, key, text in texts for found in _leaks(text)]
    assert not leaks, leaks


@pytest.mark.parametrize("workbook", ["ex02", "ex03", "ex04", "ex05", "ex06", "ex11", "ex12", "ex13"])
def test_every_level_after_planted_wrong_answers_names_the_property_and_leaks_no_solution_line(workbook):
    """The course's planted wrong answers of a workbook (the first four of each exercise): each failure leaves one
    property line, and the three levels it leads to are text without a line of the solutions (levels 1 and 3:
    the hints' own words)."""
    from tests.workbooks.wrong_answers import collect

    wrong, _ = collect()
    tried = [w for w in wrong if w.check.__module__.rsplit(".", 1)[-1].startswith(workbook)]
    tried = [w for i, w in enumerate(tried) if [v.exercise for v in tried[:i]].count(w.exercise) < 4]
    assert len(tried) >= 5
    for w in tried:
        forget_hints()
        with pytest.raises(AssertionError) as info, contextlib.redirect_stdout(io.StringIO()):
            w.run()
        message = str(info.value)
        assert sum(ln.startswith(PROPERTY) for ln in message.splitlines()) == 1, (w.exercise, w.mistake, message)
        assert last_failure(w.exercise) is not None, (w.exercise, w.mistake)
        levels = [next_hint(w.exercise) for _ in range(3)]
        assert [h.level for h in levels] == [1, 2, 3]
        assert "No failed check" not in levels[1].text
        for h in (levels[0], levels[2]):  # level 2 quotes the check's own hint, which the check printed already
            assert not _leaks(h.text), (w.exercise, w.mistake, _leaks(h.text))


# --- levels 1 and 3 aimed at the learner's own mistake (issue 51) --------------------------------------------

def _wrong(exercise: str, mistake: str):
    from tests.workbooks.wrong_answers import collect

    wrong, _ = collect()
    [w] = [w for w in wrong if w.exercise == exercise and w.mistake == mistake]
    return w


def _three_levels(w) -> list:
    with pytest.raises(AssertionError), contextlib.redirect_stdout(io.StringIO()):
        w.run()
    assert last_failure(w.exercise) is not None, (w.exercise, w.mistake)
    return [next_hint(w.exercise) for _ in range(3)]


# wrong answers (the course's own) whose level 3 was the exercise's default nudge, and level 1 the section alone,
# before levels 1 and 3 read the mistake: (exercise, the wrong answer's mistake, the key they aim at now)
AIMED = [
    ("01.1", "AdamW counted with one state", "states"),
    ("02.1", "g not squared for v", "square"),
    ("02.2", "only m corrected", "both"),
    ("03.2", "p, m, v rebound to new tensors", "in_place"),
    ("04.2", "divided by absmax", "scale"),
    ("05.3", "decade = bit_length()", "leading_one"),
    ("06.2", "codes multiplied directly, no map lookup", "map"),
    ("07.3", "the table frozen (requires_grad False)", "trainable"),
    ("08.2", "tl.load(absmax_ptr) without + pid", "block"),
    ("09.4", "torch.optim.AdamW", "optimizer"),
    ("10.1", "'bias' as a substring of the dotted name", "names"),
    ("11.2", "chunks of the flat elements, not rows", "rows"),
    ("12.4", "noise over 2**15, half a step", "noise"),
    ("13.1", "the state is updated with beta1", "state_beta"),
    ("13.3", "m stored with the 'v' moment format", "map"),
    ("14.2", "(name, bytes) instead of the name", "largest"),
]


@pytest.mark.parametrize("exercise, mistake, key", AIMED, ids=[f"{e}-{k}" for e, _, k in AIMED])
def test_levels_1_and_3_name_the_learners_own_mistake(exercise, mistake, key):
    from adam8lib.course.hints import aim

    first, second, third = _three_levels(_wrong(exercise, mistake))
    item = EXERCISES[exercise]
    assert aim(last_failure(exercise)) == (key, True)
    assert "Revisit notebooks/" in first.text and f"The idea: {item.idea}" in first.text  # the section, as before
    assert f"Where your last check failed: {item.parts[key]}." in first.text  # and the part of it that failed
    assert second.level == 2 and "No failed check" not in second.text
    assert item.nudges[key] in third.text and item.nudges["default"] not in third.text
    assert GENERAL_NUDGES["check"] not in third.text and GENERAL_NUDGES["values"] not in third.text


def test_13_1_the_issues_example_section_and_part_then_the_property_then_the_nudge():
    first, second, third = _three_levels(_wrong("13.1", "m updated before the sign is taken"))
    assert "section “" in first.text and "Where your last check failed: the order of the three updates" in first.text
    assert "you update m before taking the sign" in second.text
    assert third.text.splitlines()[1] == EXERCISES["13.1"].nudges["order"]


def test_without_a_failure_level_1_is_the_section_and_the_idea_alone():
    text = next_hint("13.1").text
    assert "Where your last check failed" not in text and "The idea:" in text


def _record(exercise: str, hint: str | None, kind: str = "values") -> None:
    from adam8lib.course.checks import _common

    item = EXERCISES[exercise]
    _common._OUTCOMES[exercise] = _common.Failure(exercise, item.check, kind, "update(p, g, m) on 3 elements",
                                                  "the parameter differs from the reference", hint)


def test_a_mistake_no_nudge_is_keyed_to_gets_a_question_built_on_the_checks_words():
    from adam8lib.course.hints import FROM_CHECK, nudge_source

    _record("13.1", "you squared the gradient before the interpolation: the rule takes g as it is")
    assert nudge_source("13.1", last_failure("13.1")) == "check"
    first, _, third = (next_hint("13.1") for _ in range(3))
    assert "Where your last check failed" not in first.text  # no sure key: the section and the idea only
    body = third.text.splitlines()[1]
    assert body.startswith(FROM_CHECK) and "“you squared the gradient before the interpolation”" in body
    assert "update(p, g, m) on 3 elements" in body and EXERCISES["13.1"].nudges["default"] not in third.text
    assert "the rule takes g as it is" not in body  # the check's rule stays at level 2


def test_without_the_checks_words_level_3_is_the_exercises_default():
    _record("13.1", None)
    third = [next_hint("13.1") for _ in range(3)][2]
    assert EXERCISES["13.1"].nudges["default"] in third.text


def test_the_rule_a_check_restates_does_not_pick_the_mistake():
    """A check's hint that ends with "The rule: ..." is matched on the mistake before it, not on the rule."""
    from adam8lib.course.hints import aim

    _record("07.1", "p is wrong while m, v are right: a factor is off. The rule: p -= lr * m_hat / (sqrt(v_hat) + eps)")
    assert aim(last_failure("07.1")) != ("denominator", True)
    third = [next_hint("07.1") for _ in range(3)][2]
    assert EXERCISES["07.1"].nudges["denominator"] not in third.text


#: bounds from the measurement (tests/course/hint_fallbacks.py over every caught wrong answer of the course): before
#: issue 51's item 3, 322 of 556 level-3 nudges were the exercise's default or a general fallback and every level 1
#: (556) was the section alone; after it, none of either, and none needs the nudge built on the check's words
MAX_LEVEL3_FALLBACK_SHARE = 0.03
MAX_LEVEL3_FROM_CHECK_SHARE = 0.05
MAX_LEVEL1_GENERIC_SHARE = 0.05


@pytest.fixture(scope="module")
def measured():
    """Every caught wrong answer of the course with its three levels (tests/course/hint_fallbacks.py), measured once."""
    from tests.course.hint_fallbacks import measure

    return measure()


def test_over_the_courses_wrong_answers_levels_1_and_3_rarely_fall_back(measured):
    from tests.course.hint_fallbacks import summary

    rows = measured
    total = summary(rows)["all"]
    assert total["caught"] >= 500
    assert total["level3_fallback"] <= MAX_LEVEL3_FALLBACK_SHARE * total["caught"], \
        [(r.exercise, r.key, r.mistake) for r in rows if r.level3_fallback]
    assert total["level3_from_check"] <= MAX_LEVEL3_FROM_CHECK_SHARE * total["caught"], \
        [(r.exercise, r.key, r.mistake) for r in rows if r.level3_from_check]
    assert total["level1_generic"] <= MAX_LEVEL1_GENERIC_SHARE * total["caught"], \
        [(r.exercise, r.key, r.mistake) for r in rows if r.level1_generic]
    for r in rows:  # levels 1 and 3 are words of the hints, never a line of the solutions
        assert not _leaks(r.texts[0]) and not _leaks(r.texts[2]), (r.exercise, r.mistake)


#: the course's wrong answers whose check's hint only restates the rule (levels 1 and 3 then say how to find the
#: mistake, :func:`adam8lib.course.hints.restates_the_rule`): 1 of 565 when this bound was set
MAX_UNNAMED_SHARE = 0.02


def test_a_hint_that_restates_the_rule_is_known_and_rare(measured):
    """Every rule a check restates after its finding ("… The rule: R") opens with one of its exercise's
    :data:`~adam8lib.course.hint_text.RULES`, so the same rule given alone (the check's fallback) is never read as a
    mistake; and few of the course's wrong answers get only the rule."""
    from adam8lib.course.hint_text import RULES
    from tests.course.hint_fallbacks import summary

    for r in measured:
        if "The rule:" in r.hint:
            rule = r.hint.split("The rule:", 1)[1].strip()
            assert rule.startswith(RULES.get(r.exercise, ())), (r.exercise, r.mistake, rule[:80])
        if r.unnamed:
            assert "could not tell which part" in r.texts[0], (r.exercise, r.mistake)
    total = summary(measured)["all"]
    assert total["unnamed"] <= MAX_UNNAMED_SHARE * total["caught"], \
        [(r.exercise, r.mistake) for r in measured if r.unnamed]


def test_the_question_built_on_a_checks_words_never_quotes_its_code(measured):
    """Were no nudge keyed to them, the course's wrong answers would get level 3 built on their check's hint: it
    quotes the hint's first clause only when that holds no code, so it never contains a line of the solutions
    (the check's hints do quote some: 'scaler.update()', 'return loss.item()')."""
    from adam8lib.course.hints import FROM_CHECK

    probes = [r for r in measured if r.probe]
    assert len(probes) >= 500
    for r in probes:
        assert r.probe.startswith(FROM_CHECK) and not _leaks(r.probe), (r.exercise, r.mistake, _leaks(r.probe))
    assert sum("“" in r.probe for r in probes) >= 100  # most checks name the mistake in plain words first
