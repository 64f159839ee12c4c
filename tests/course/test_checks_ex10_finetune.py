"""The checks of workbook 10 pass on the reference and on the solution, and say "not implemented
yet" for the workbook's stubs. (Plausible wrong answers, each failing with the hint written for it,
are in tests/workbooks/wrong_answers/ex10.py, run by tests/course/test_wrong_answers.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from adam8lib.course.checks import ex10_finetune as ex10
from adam8lib.training import decay_parameter_names, training_step
from tests.workbooks.wrong_answers.ex10 import make_amp, make_epoch

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"
SUCCESS_1 = "✔ Exercise 10.1 · Weight-decay parameter names: all checks passed\n"
SUCCESS_2 = "✔ Exercise 10.2 · Mixed-precision training step: all checks passed\n"


def stub(*args, **kwargs):
    raise NotImplementedError


def solution(name: str):
    from adam8lib.course.grading.workbook import find_workbook, load_workbook

    return getattr(load_workbook(find_workbook(SOLUTIONS, "10")), name)


def test_decay_check_passes_reference_and_solution(capsys):
    ex10.check_decay_parameter_names(decay_parameter_names)
    ex10.check_decay_parameter_names(lambda m: list(reversed(decay_parameter_names(m))))  # any order
    ex10.check_decay_parameter_names(solution("get_decay_parameter_names"))
    assert capsys.readouterr().out == SUCCESS_1 * 3


def test_decay_check_rejects_a_non_function():
    with pytest.raises(TypeError):
        ex10.check_decay_parameter_names(["a.weight"])


def test_step_check_passes_reference_and_solution(capsys):
    ex10.check_training_step(training_step)
    ex10.check_training_step(solution("training_step"))
    assert capsys.readouterr().out == SUCCESS_2 * 2


def test_trainer_8bit_check_passes_the_solution():
    ex10.check_trainer_8bit(solution("make_trainer_8bit"))


def test_accelerate_epoch_check_passes_the_solution():
    ex10.check_accelerate_epoch(solution("train_epoch"))
    ex10.check_accelerate_epoch(make_epoch())


def test_amp_step_check_passes_the_solution():
    ex10.check_amp_step(solution("amp_step"))
    ex10.check_amp_step(make_amp())


@pytest.mark.parametrize("check", [ex10.check_decay_parameter_names, ex10.check_training_step,
                                   ex10.check_trainer_8bit, ex10.check_accelerate_epoch, ex10.check_amp_step],
                         ids=lambda c: c.__name__)
def test_a_stub_is_reported_as_not_implemented(check):
    with pytest.raises(AssertionError, match="not implemented yet"):
        check(stub)
