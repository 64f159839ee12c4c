"""Course conventions of every notebook, and the notebook runner ``adam8lib.course.outputs``.

The convention tests read the stored notebooks (no kernel): cell 0 is the title and the Colab
badge, cell 1 the setup cell; lessons and solutions hold outputs from one full run (what
``make outputs`` stores), without stored errors or stray stderr. The runner tests execute tiny
notebooks in a real kernel.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from adam8lib.course import outputs as runner
from adam8lib.course import COLAB_BADGE, SETUP_CELL, colab_url

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
ALL = LESSONS + SOLUTIONS + EXERCISES
EXECUTED = LESSONS + SOLUTIONS  # exercises/ are stubs: generated, never run as a whole
NAME = re.compile(r"^(\d\d)_[a-z0-9]+(?:_[a-z0-9]+)*\.ipynb$")


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def read(path: Path):
    return nbformat.read(path, as_version=4)


def tags(cell) -> set[str]:
    return set(cell.metadata.get("tags", []))


def ids(paths):
    return [rel(p) for p in paths]


# ----------------------------------------------------------------------------------------
# Conventions of the stored notebooks
# ----------------------------------------------------------------------------------------
def test_the_course_has_lessons():
    numbers = [NAME.match(p.name).group(1) for p in LESSONS if NAME.match(p.name)]
    assert {"00", "01", "02", "03", "04"} <= set(numbers), f"lessons found: {ids(LESSONS)}"


def course_map() -> str:
    """The README's ``## Course map`` section."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Course map" in readme, "README.md needs a '## Course map' section"
    return readme.split("## Course map", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_names_follow_the_course_map(path):
    # one concept, one name: notebooks/, solutions/ and exercises/ share NN_topic.ipynb
    assert NAME.match(path.name), f"{rel(path)}: name it NN_topic.ipynb (lower case, underscores)"
    assert f"(notebooks/{path.name})" in course_map(), f"{rel(path)}: no lesson notebooks/{path.name} in the course map"


def test_one_lesson_per_number():
    numbers = [p.name[:2] for p in LESSONS]
    assert len(numbers) == len(set(numbers)), ids(LESSONS)


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_first_cell_is_title_and_colab_badge(path):
    cell = read(path).cells[0]
    assert cell.cell_type == "markdown", f"{rel(path)}: cell 0 must be markdown (title + badge)"
    title = cell.source.splitlines()[0]
    assert re.match(rf"^# {path.name[:2]} · \S", title), f"{rel(path)}: cell 0 must start with '# {path.name[:2]} · Title'"
    # a workbook's badge opens the learner's copy (exercises/), whichever folder it sits in
    target = f"exercises/{path.name}" if path.parent.name == "solutions" else rel(path)
    badge = f"[![Open In Colab]({COLAB_BADGE})]({colab_url(target)})"
    assert badge in cell.source, f"{rel(path)}: cell 0 needs the Colab badge {badge}"


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_second_cell_is_the_setup_cell(path):
    cell = read(path).cells[1]
    assert cell.cell_type == "code"
    assert cell.source.strip() == SETUP_CELL, f"{rel(path)}: cell 1 must be adam8lib.course.SETUP_CELL"
    assert "nbval-ignore-output" in tags(cell), f"{rel(path)}: tag the setup cell nbval-ignore-output"


@pytest.mark.parametrize("path", EXECUTED, ids=ids(EXECUTED))
def test_outputs_come_from_one_full_run(path):
    problems = runner.check_notebook(path)
    assert not problems, f"{rel(path)}: run `make outputs` —\n" + "\n".join(problems)


@pytest.mark.parametrize("path", EXECUTED, ids=ids(EXECUTED))
def test_no_stored_errors_or_stray_stderr(path):
    for index, cell in enumerate(read(path).cells):
        if cell.cell_type != "code":
            continue
        ignored = bool(tags(cell) & {"nbval-ignore-output", "nbval-skip"}) or "# NBVAL_IGNORE_OUTPUT" in cell.source
        raises = "raises-exception" in tags(cell) or "# NBVAL_RAISES_EXCEPTION" in cell.source
        for output in cell.outputs:
            if output.output_type == "error":
                assert raises, f"{rel(path)} cell {index}: stored error {output.ename}: {output.evalue}"
            if output.output_type == "stream" and output.name == "stderr":
                assert ignored, f"{rel(path)} cell {index}: stderr stored in a checked cell: {output.text[:200]!r}"


# "parameters (are stored) in FP8" in one sentence: the source chapter's mistake
FP8_CLAIM = re.compile(r"param\w*[^.\n]{0,40}\bFP8\b|\bFP8\b[^.\n]{0,40}param", re.IGNORECASE)


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_fp8_claim_only_as_correction(path):
    for index, cell in enumerate(read(path).cells):
        if FP8_CLAIM.search(cell.source):
            assert re.search(r"\b(wrong|not|never|no)\b", cell.source, re.IGNORECASE), (
                f"{rel(path)} cell {index} links parameters and FP8 without correcting it: 8-bit Adam keeps "
                "parameters in their own dtype; only the optimizer states are 8-bit codes"
            )


def test_a_lesson_corrects_the_fp8_claim():
    for path in LESSONS:
        for cell in read(path).cells:
            text = cell.source
            if cell.cell_type == "markdown" and FP8_CLAIM.search(text) and "wrong" in text and "own dtype" in text:
                return
    pytest.fail("no lesson says that 'stores parameters in FP8' is wrong (parameters keep their own dtype)")


def test_readme_course_map_links_every_lesson():
    section = course_map()
    for path in LESSONS:
        assert colab_url(rel(path)) in section, f"README course map lacks the Colab link of {rel(path)}"
        assert f"({rel(path)})" in section, f"README course map lacks a link to {rel(path)}"


# ----------------------------------------------------------------------------------------
# The runner: python -m adam8lib.course.outputs execute/check
# ----------------------------------------------------------------------------------------
def _write(path: Path, cells) -> Path:
    nb = new_notebook(cells=cells)
    nbformat.write(nb, path)
    return path


def test_execute_runs_this_python_on_cpu_from_the_notebook_folder(tmp_path, monkeypatch):
    # a user-level "python3" kernelspec pointing elsewhere must not be used
    fake = tmp_path / "jupyter" / "kernels" / "python3"
    fake.mkdir(parents=True)
    (fake / "kernel.json").write_text(json.dumps({"argv": ["/bin/false", "{connection_file}"],
                                                  "display_name": "wrong", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    path = _write(tmp_path / "tiny.ipynb", [
        new_markdown_cell("# tiny"),
        new_code_cell("import os, sys\nprint(sys.executable)\nprint(os.getcwd())\n"
                      "print([os.environ[k] for k in ('CUDA_VISIBLE_DEVICES', 'TRITON_INTERPRET', 'PYTHONHASHSEED')])"),
        new_code_cell(""),
        new_code_cell("import ipywidgets\nipywidgets.IntSlider(3)"),
        new_code_cell("6 * 7"),
    ])
    results = runner.execute_notebooks([tmp_path], progress=False, timeout=60)
    assert [r.ok for r in results] == [True], results
    assert results[0].seconds > 0

    nb = read(path)
    assert runner.check_notebook(nb) == []
    assert [c.get("execution_count") for c in nb.cells] == [None, 1, None, 2, 3]
    executable, cwd, env = nb.cells[1].outputs[0].text.splitlines()
    assert Path(executable).resolve() == Path(sys.executable).resolve()
    assert Path(cwd).resolve() == tmp_path.resolve()
    assert env == "['', '1', '0']"
    assert nb.cells[4].outputs[0]["data"]["text/plain"] == "42"
    assert nb.cells[4].outputs[0]["execution_count"] == 3
    assert nb.metadata.kernelspec.name == "python3"
    assert all("execution" not in c.metadata for c in nb.cells), "per-cell timing must not be stored"
    # a small widget state is kept, together with the widget's view
    slider = nb.cells[3].outputs[0]["data"]
    assert "application/vnd.jupyter.widget-view+json" in slider
    assert "application/vnd.jupyter.widget-state+json" in nb.metadata.widgets

    # over the size limit, the state goes, and so do the views that need it (text stays)
    bulky = runner.clean_notebook(copy.deepcopy(nb), max_widget_state_bytes=10)
    assert "widgets" not in bulky.metadata
    assert list(bulky.cells[3].outputs[0]["data"]) == ["text/plain"]
    assert "IntSlider" in bulky.cells[3].outputs[0]["data"]["text/plain"]


def test_failing_notebook_is_reported_and_left_untouched(tmp_path, capsys):
    path = _write(tmp_path / "broken.ipynb", [new_code_cell("print('before')"), new_code_cell("raise ValueError('boom')")])
    before = path.read_bytes()
    with pytest.raises(CellExecutionError, match="boom"):
        runner.execute_notebook(path, timeout=60)
    assert path.read_bytes() == before
    assert runner.main(["execute", str(path), "--timeout", "60"]) == 1
    assert path.read_bytes() == before
    assert "FAILED" in capsys.readouterr().err


def _unrun_notebook():
    ran = new_code_cell("x = 1", execution_count=1)
    stale = new_code_cell("print(x)", outputs=[new_output("stream", name="stdout", text="1\n")])  # count null
    return new_notebook(cells=[new_markdown_cell("# t"), ran, stale])


def test_check_reports_outputs_without_a_run(tmp_path, capsys):
    problems = runner.check_notebook(_unrun_notebook())
    assert len(problems) == 1 and "cell 2" in problems[0] and "never executed" in problems[0]

    not_run = new_notebook(cells=[new_code_cell("x = 1", execution_count=1), new_code_cell("y = 2")])
    assert runner.check_notebook(not_run) == ["cell 1: not executed"]

    out_of_order = new_notebook(cells=[new_code_cell("a", execution_count=2), new_code_cell("b", execution_count=1)])
    assert len(runner.check_notebook(out_of_order)) == 2

    good = new_notebook(cells=[new_code_cell("a", execution_count=1), new_code_cell(""), new_code_cell("b", execution_count=2)])
    assert runner.check_notebook(good) == []

    nbformat.write(_unrun_notebook(), tmp_path / "stale.ipynb")
    nbformat.write(good, tmp_path / "good.ipynb")
    assert runner.main(["check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "stale.ipynb:" in out and "good.ipynb:" not in out and "1/2 notebooks" in out
    assert runner.main(["check", str(tmp_path / "good.ipynb")]) == 0


def test_clean_renumbers_merges_streams_and_drops_timing():
    prints = [new_output("stream", name="stdout", text="a\n"), new_output("stream", name="stdout", text="b\n"),
              new_output("stream", name="stderr", text="warn\n"), new_output("stream", name="stdout", text="c\n")]
    nb = new_notebook(cells=[
        new_code_cell("a", execution_count=4, outputs=prints, metadata={"execution": {"iopub.status.busy": "x"}, "tags": ["t"]}),
        new_code_cell("b", execution_count=9, outputs=[new_output("execute_result", data={"text/plain": "1"}, execution_count=9)]),
    ])
    runner.clean_notebook(nb)
    assert [c.execution_count for c in nb.cells] == [1, 2]
    assert nb.cells[1].outputs[0].execution_count == 2
    assert nb.cells[0].metadata == {"tags": ["t"]}
    assert [(o.name, o.text) for o in nb.cells[0].outputs] == [("stdout", "a\nb\n"), ("stderr", "warn\n"), ("stdout", "c\n")]


def test_find_notebooks(tmp_path):
    for name in ("b.ipynb", "a.ipynb", "notes.txt"):
        (tmp_path / name).write_text("{}")
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "a-checkpoint.ipynb").write_text("{}")
    assert [p.name for p in runner.find_notebooks([tmp_path])] == ["a.ipynb", "b.ipynb"]
    assert [p.name for p in runner.find_notebooks([tmp_path / "b.ipynb", tmp_path])] == ["b.ipynb", "a.ipynb"]
    with pytest.raises(ValueError, match="no such"):
        runner.find_notebooks([tmp_path / "missing"])
    with pytest.raises(ValueError, match="not a notebook"):
        runner.find_notebooks([tmp_path / "notes.txt"])
    with pytest.raises(ValueError, match="timeout"):
        runner.execute_notebook(tmp_path / "a.ipynb", timeout=0)
