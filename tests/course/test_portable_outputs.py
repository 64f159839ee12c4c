"""The rule for compared outputs (adam8lib.course.compared), on the course and on planted cells.

Every number a compared output of a lesson or solution prints is written in the cell's source (a
band, a hyperparameter) or the cell says why it is exact on any machine; measured figures live in
nbval-ignore-output cells. ``test_second_machine.py`` runs the notebooks under another numeric
configuration, which is the empirical half of the rule.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from adam8lib.course import compared
from adam8lib.course.bands import check_band, check_claim

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_compared_outputs_print_only_what_holds_anywhere(path):
    assert compared.problems(nbformat.read(path, as_version=4)) == []


def cell(source, text, *, tags=(), reason=None, kind="stream"):
    c = new_code_cell(source, execution_count=1)
    if tags:
        c.metadata["tags"] = list(tags)
    if reason is not None:
        c.metadata["adam8"] = {compared.PORTABLE_KEY: reason}
    if kind == "stream":
        c.outputs = [new_output("stream", name="stdout", text=text)]
    else:
        c.outputs = [new_output("execute_result", data={"text/plain": text}, execution_count=1)]
    return c


def test_a_reveal_line_is_the_stored_answer_but_the_rest_of_its_cell_is_compared():
    line = "▶ Question 12.b: the experiment says 10,000 (lr x m / eps = lr x 1e-4 / 1e-8) (you made no prediction above)."
    assert compared.unexplained_numbers(cell('reveal("12.b", x)', line + "\n")) == []
    assert compared.unexplained_numbers(cell('reveal("12.b", x, shown)', line + "\nloss 0.0551\n")) == ["0.0551"]
    assert compared.unexplained_numbers(cell("print(x)", line + "\n")) != []  # only a cell that calls reveal


@pytest.mark.parametrize("c, flagged", [
    (cell("print(f'loss {loss:.3f}')", "loss 0.055\n"), ["0.055"]),
    (cell("print(f'drift {d:.0f} %')", "drift 14 %\n"), ["14"]),
    (cell("len(x)", "84,480", kind="result"), ["84,480"]),
    (cell("print(err)", "2.0941e-06\n"), ["2.0941e-06"]),
    (cell("print(-x)", "-0.2015\n"), ["-0.2015"]),
    # numbers written in the source are constants; names with digits are not numbers
    (cell("check_band('error', e, high=0.05, unit=' %')", "✔ error: at most 0.05 %\n"), []),
    (cell("check_band('tiny', e, high=1e-6)", "✔ tiny: at most 1e-6\n"), []),
    (cell("print(p.dtype, 'sm_90')", "torch.float32 bfloat16 sm_90\n"), []),
    (cell("print(f'{n:,} parameters')", "4,141,442 parameters\n", reason="parameter count of a model built from its config"), []),
    # ignored and skipped cells are not compared
    (cell("print(loss)", "0.055\n", tags=["nbval-ignore-output"]), []),
    (cell("# NBVAL_IGNORE_OUTPUT\nprint(loss)", "0.055\n"), []),
    (cell("print(loss)", "0.055\n", tags=["nbval-skip"]), []),
    # check cells of workbooks: the manifest fixes their output
    (cell("from adam8lib.course.checks import check_x\ncheck_x(f)", "✔ Exercise 05.1 · Map: all checks passed\n"), []),
])
def test_linter_flags_measured_numbers_and_nothing_else(c, flagged):
    assert compared.unexplained_numbers(c) == flagged


def test_a_reason_must_be_a_sentence():
    nb = new_notebook(cells=[cell("print(n)", "42\n", reason="exact"), cell("print(n)", "42\n", reason=["x"]),
                             cell("print(n)", "42\n", reason="a count of tensors, exact everywhere")])
    found = compared.problems(nb)
    assert [line.split(":")[0] for line in found] == ["cell 0", "cell 1"]
    assert all("must be a sentence" in line for line in found)


def test_cli_lists_offending_cells_and_exits_1(tmp_path, capsys):
    good, bad = tmp_path / "good.ipynb", tmp_path / "bad.ipynb"
    nbformat.write(new_notebook(cells=[cell("check_claim('ok', True)", "✔ ok\n")]), good)
    nbformat.write(new_notebook(cells=[cell("print(f'{acc:.1f} %')", "94.9 %\n")]), bad)
    assert compared.main([str(good)]) == 0
    assert compared.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "bad.ipynb: cell 0: compared output prints 94.9" in out and "good.ipynb" not in out


# ------------------------------------------------------------------ bands
def test_check_band_prints_the_band_not_the_value(capsys):
    check_band("drift vs bitsandbytes", 14.2, high=30, unit=" %")
    check_band("loss", 0.0551, low=0.01, high=0.1)
    check_band("accuracy", 0.91, low=0.9)
    check_band("error", 3e-7, high=1e-6)
    check_claim("states identical", True)
    assert capsys.readouterr().out.splitlines() == [
        "✔ drift vs bitsandbytes: at most 30 %", "✔ loss: between 0.01 and 0.1", "✔ accuracy: at least 0.9",
        "✔ error: at most 1e-6", "✔ states identical"]


@pytest.mark.parametrize("value, kwargs", [(31.0, dict(high=30)), (0.5, dict(low=0.9)), (float("nan"), dict(high=1)),
                                            (float("inf"), dict(low=0)), (0.2, dict(low=0.3, high=0.4))])
def test_check_band_fails_outside_with_the_measured_value(value, kwargs, capsys):
    with pytest.raises(AssertionError, match=f"measured {value!r}"):
        check_band("figure", value, **kwargs)
    assert capsys.readouterr().out == ""


def test_check_band_and_claim_bad_use():
    with pytest.raises(ValueError, match="low, high or both"):
        check_band("x", 1.0)
    with pytest.raises(ValueError, match="above high"):
        check_band("x", 1.0, low=2, high=1)
    with pytest.raises(AssertionError, match="not true here: same codes \\(99.5 %\\)"):
        check_claim("same codes", False, "99.5 %")
