"""Course tests of the grading system (adam8lib/course/grading): generator, nbval plugin, gradebook.

* exercises/ is in sync with solutions/, every solution span is stubbed, every check cell is
  in the manifest and calls a check that exists;
* the generator on the tiny fixture workbook (tests/fixtures/tiny): stubs, tags, links, the
  generator's mark, manifest, ``--check``; a clear error (exit 2, nothing written) for each
  malformed solution, misspelled marker, swapped arguments and the lessons folder;
* ``pytest --nbval`` on an untouched workbook fails on exactly its check cells (taken from the
  official manifest, not a forged one next to it) while the solution passes; the score summary
  and ``--grade-report``; integrity: edited / deleted check cells and learner-added nbval markers;
  the self-check command ignores a learner's conftest.py / pytest.ini / manifest and cuts huge
  check outputs;
* the gradebook (issue 16's cheats, on fake learners of the tiny course): in the bubblewrap
  sandbox C1 (monkeypatched checks), C2a/C2b (IPython exception handler / input transformer),
  C4a + C5 (writing another learner's notebook, reports, the gradebook, the checks, the
  manifest), C4b (a detached report writer, forged results), C8 (out of memory, killed),
  C9 (a grandchild holding the pipes), C10 (killing the grader), C11 (garbage results), a loop,
  a swallowed timeout and a 50 MB print; without a sandbox C5 (course files restored), C4a
  (graded from the copy read at the start) and C10 (the CSV keeps finished rows); a real
  workbook graded without false alarms;
* the workbook unit tests (tests/workbooks) fail on every stub of exercises/.

Kernels and grading processes make this slow, so each scenario runs once: NBVAL_WORKBOOK
(2 exercises) and CLASS_WORKBOOK (3 exercises) of the course, and the tiny workbook.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest

from adam8lib.course.grading import gradebook, sandbox
from adam8lib.course.grading.generate import generate, generate_notebook, learner_dependent, main as generate_main
from adam8lib.course.grading.conventions import (
    BEGIN,
    MANIFEST_NAME,
    SOLUTION_TAG,
    Manifest,
    WorkbookError,
    cell_source,
    check_calls,
    source_hash,
)
from adam8lib.course.grading.plugin import write_report
from adam8lib.course.grading.workbook import WorkbookLoader, find_workbook, load_workbook

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"
EXERCISES = REPO / "exercises"
TINY = REPO / "tests" / "fixtures" / "tiny"
NBVAL_WORKBOOK = "05_dynamic_map.ipynb"
CLASS_WORKBOOK = "01_optimizer_memory.ipynb"
#: Per-cell timeout for the class: above the slowest honest cell (the setup cell imports torch
#: and bitsandbytes) even on a loaded 2-core machine; the looping learner waits it out once.
CELL_TIMEOUT = 40


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return Manifest.load(EXERCISES / MANIFEST_NAME)


def code_cells(path: Path) -> list:
    return [c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]


# ---------------------------------------------------------------------------------------------
# exercises/ against solutions/
# ---------------------------------------------------------------------------------------------
def test_exercises_in_sync_with_solutions(capsys):
    assert generate(SOLUTIONS, EXERCISES, check=True) == [], "exercises/ is out of sync: run `make exercises`"
    assert generate_main([str(SOLUTIONS), str(EXERCISES), "--check"]) == 0
    assert "in sync" in capsys.readouterr().out


def test_manifest_lists_every_check_cell_of_the_solutions(manifest):
    from adam8lib.course.checks import CHECKS

    assert list(manifest.notebooks) == sorted(p.name for p in SOLUTIONS.glob("*.ipynb"))
    ids = [spec.exercise for spec in manifest.checks]
    assert len(ids) == len(set(ids)) >= 15
    for name, specs in manifest.notebooks.items():
        cells = code_cells(SOLUTIONS / name)
        in_notebook = [(i, check_calls(cell_source(c))[0]) for i, c in enumerate(cells) if check_calls(cell_source(c))]
        assert in_notebook == [(s.cell, s.check) for s in specs], name
        for spec in specs:
            assert spec.exercise in CHECKS, f"{name} calls {spec.check}, which adam8lib.course.checks does not define"
            assert source_hash(cell_source(cells[spec.cell])) == spec.sha256
            assert cells[spec.cell].outputs[0]["text"] == spec.expected_output
    assert manifest.total_points == sum(s.points for s in manifest.checks)


def test_every_solution_span_is_stubbed(manifest):
    for name in manifest.notebooks:
        sol, ex = code_cells(SOLUTIONS / name), code_cells(EXERCISES / name)
        assert len(sol) == len(ex), name
        solution = nbformat.read(str(SOLUTIONS / name), as_version=4)
        runs_learner_code = {cell_source(solution.cells[i]) for i in learner_dependent(solution)}
        stubs = 0
        for s, e in zip(sol, ex):
            src, out = cell_source(s), cell_source(e)
            assert BEGIN not in out and "END SOLUTION" not in out, name
            if BEGIN in src:
                stubs += src.count(BEGIN)
                assert out.count("raise NotImplementedError(\"Exercise ") == src.count(BEGIN), (name, out)
                assert SOLUTION_TAG in e.metadata["tags"] and "nbval-ignore-output" in e.metadata["tags"]
                assert e.outputs == [] and e.execution_count is None
            elif check_calls(src):  # check cells: source kept, stored success line removed
                assert out == src and e.outputs == [] and e.execution_count is None, name
            elif src in runs_learner_code:  # the solution's result is not shown before the learner's code exists
                assert out == src and e.outputs == [] and e.execution_count is None, name
            else:
                assert out == src and e.outputs == s.outputs, name
        assert stubs >= len(manifest.notebooks[name]), name


# ---------------------------------------------------------------------------------------------
# the generator on the tiny fixture workbook
# ---------------------------------------------------------------------------------------------
@pytest.fixture()
def tiny(tmp_path) -> Path:
    """A copy of the tiny course: <tmp>/solutions/01_tiny.ipynb, generated <tmp>/exercises/."""
    shutil.copytree(TINY / "solutions", tmp_path / "solutions")
    assert generate_main([str(tmp_path / "solutions"), str(tmp_path / "exercises")]) == 0
    return tmp_path


def test_generator_stubs_tags_links_and_manifest(tiny):
    nb = nbformat.read(str(tiny / "exercises" / "01_tiny.ipynb"), as_version=4)
    sources = [cell_source(c) for c in nb.cells]
    assert "blob/main/exercises/01_tiny.ipynb" in sources[0] and "solutions/" not in sources[0]
    assert sources[3] == 'def square(x):\n    """x squared."""\n    raise NotImplementedError("Exercise 01.1: square")'
    assert sources[6] == (
        "def clamp(values, lo, hi):\n    out = []\n    for v in values:\n"
        '        raise NotImplementedError("Exercise 01.2: clamp")\n    return out'
    )
    for index in (3, 6):
        assert nb.cells[index].metadata["tags"] == ["nbval-ignore-output", "solution"]
        assert nb.cells[index].outputs == [] and nb.cells[index].execution_count is None
    assert nb.cells[4].outputs == [] and nb.cells[4].execution_count is None  # check cell: no stored success
    assert nb.cells[1].metadata["tags"] == ["nbval-ignore-output"]  # other cells untouched

    manifest = Manifest.load(tiny / "exercises" / MANIFEST_NAME)
    assert [(s.exercise, s.label, s.title, s.cell, s.points) for s in manifest.checks] == [
        ("square", "01.1", "Square", 2, 1),
        ("clamp", "01.2", "Clamp", 4, 2),
    ]
    assert manifest.total_points == 3
    assert manifest.match("01_tiny.ipynb") == manifest.match("01_tiny_alice.ipynb") == "01_tiny.ipynb"
    assert manifest.match("02_other.ipynb") is None


def test_generator_check_detects_every_kind_of_drift(tiny, capsys):
    solutions, exercises = str(tiny / "solutions"), str(tiny / "exercises")
    assert generate_main([solutions, exercises, "--check"]) == 0
    target = tiny / "exercises" / "01_tiny.ipynb"
    target.write_text(target.read_text().replace("Exercise 01.1: square", "done"))
    shutil.copyfile(target, tiny / "exercises" / "09_stale.ipynb")  # written by the generator once
    (tiny / "exercises" / MANIFEST_NAME).unlink()
    capsys.readouterr()
    assert generate_main([solutions, exercises, "--check"]) == 1
    err = capsys.readouterr().err
    assert "out of sync" in err and "01_tiny.ipynb" in err and "09_stale.ipynb" in err and MANIFEST_NAME in err
    assert generate_main([solutions, exercises]) == 0
    assert not (tiny / "exercises" / "09_stale.ipynb").exists()
    assert generate_main([solutions, exercises, "--check"]) == 0


BROKEN = {
    "unclosed": ("def f():\n    ### BEGIN SOLUTION\n    return 1\n", "without '### END SOLUTION'"),
    "nested": ("def f():\n    ### BEGIN SOLUTION\n    ### BEGIN SOLUTION\n    ### END SOLUTION\n", "nested"),
    "stray end": ("def f():\n    return 1\n    ### END SOLUTION\n", "without '### BEGIN SOLUTION'"),
    "top level": ("### BEGIN SOLUTION\nX = 1\n### END SOLUTION\n", "not inside a function"),
    "two checks": ("check_square(square)\ncheck_clamp(clamp)\n", "exactly one check"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_generator_rejects_malformed_solutions(tiny, case, capsys):
    source, message = BROKEN[case]
    path = tiny / "solutions" / "01_tiny.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nb.cells[3].source = source
    nbformat.write(nb, str(path))
    with pytest.raises(WorkbookError, match=re.escape(message)):
        generate(tiny / "solutions", tiny / "out")
    assert generate_main([str(tiny / "solutions"), str(tiny / "out")]) == 2
    assert "01_tiny.ipynb, cell 3" in capsys.readouterr().err


def test_generator_rejects_unrun_check_cells_and_reused_ids(tiny):
    path = tiny / "solutions" / "01_tiny.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nb.cells[4].outputs, nb.cells[4].execution_count = [], None
    nbformat.write(nb, str(tiny / "solutions" / "02_unrun.ipynb"))
    with pytest.raises(WorkbookError, match="exactly one stored output"):
        generate(tiny / "solutions", tiny / "out")
    (tiny / "solutions" / "02_unrun.ipynb").unlink()
    shutil.copyfile(path, tiny / "solutions" / "02_copy.ipynb")
    with pytest.raises(WorkbookError, match="'square'.*used in 01_tiny.ipynb and 02_copy.ipynb"):
        generate(tiny / "solutions", tiny / "out")


# ---------------------------------------------------------------------------------------------
# the workbook loader (fixture `workbook` of tests/workbooks)
# ---------------------------------------------------------------------------------------------
def test_workbook_loader_runs_only_the_solution_cells(tiny):
    solved = WorkbookLoader(tiny / "solutions")("01")
    assert solved.square(3) == 9 and solved.clamp([-1, 0.5, 4], 0, 1) == [0, 0.5, 1]
    assert solved.cells == 2 and solved.errors == []
    assert "check_square" not in solved  # check cells are not run
    stubbed = load_workbook(tiny / "exercises" / "01_tiny.ipynb")
    with pytest.raises(NotImplementedError, match="Exercise 01.1: square"):
        stubbed.square(3)
    with pytest.raises(AttributeError, match="defines no 'cube'.*clamp, square"):
        stubbed.cube
    path = tiny / "exercises" / "01_tiny.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nb.cells[6].source = "def clamp(values, lo, hi):\n    return [\n"  # a learner's syntax error
    nbformat.write(nb, str(path))
    broken = load_workbook(path)
    assert broken.square.__name__ == "square" and len(broken.errors) == 1 and "SyntaxError" in broken.errors[0]
    with pytest.raises(AttributeError, match="cells that failed to run: cell 6: SyntaxError"):
        broken.clamp
    with pytest.raises(FileNotFoundError, match="expected one workbook 02_"):
        find_workbook(tiny / "solutions", 2)
    with pytest.raises(ValueError, match="like 5 or '05'"):
        find_workbook(tiny / "solutions", "five")


def test_workbook_unit_tests_fail_on_every_stub(tmp_path):
    """The solutions pass tests/workbooks in the main run; on exercises/ every test must fail."""
    numbers = [name[:2] for name in Manifest.load(EXERCISES / MANIFEST_NAME).notebooks]
    untested = [nn for nn in numbers if not list((REPO / "tests" / "workbooks").glob(f"test_ex{nn}_*.py"))]
    assert not untested, f"no workbook unit tests for workbook(s) {untested}: add tests/workbooks/test_exNN_*.py"
    xml = tmp_path / "stubs.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(REPO / "tests" / "workbooks"), "--workbook-dir", str(EXERCISES),
         "-p", "no:cacheprovider", "-q", f"--junitxml={xml}"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    suite = ET.parse(xml).getroot().find("testsuite")
    tests, failures, errors, skipped = (int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped"))
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert tests > 0 and failures == tests and errors == skipped == 0, proc.stdout[-3000:]
    classes = " ".join(case.get("classname") for case in suite.iter("testcase"))
    assert all(f"test_ex{nn}_" in classes for nn in numbers), classes


# ---------------------------------------------------------------------------------------------
# pytest --nbval with the grading plugin
# ---------------------------------------------------------------------------------------------
def _outcomes(stdout: str) -> dict[str, str]:
    """{"path::Cell N": "PASSED" | "FAILED" | ...} from a ``-rA`` short summary."""
    found = re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+::Cell \d+)", stdout, re.M)
    return {node: outcome for outcome, node in found}


def test_nbval_fails_exactly_on_the_check_cells_and_scores(pytester, manifest):
    """One run: an untouched exercise workbook and its solution, with a JSON grade report."""
    for folder in ("exercises", "solutions"):
        (pytester.path / folder).mkdir()
        shutil.copyfile(REPO / folder / NBVAL_WORKBOOK, pytester.path / folder / NBVAL_WORKBOOK)
    # a forged manifest next to the workbook (100 points per check): the official one wins
    forged = json.loads((EXERCISES / MANIFEST_NAME).read_text())
    for spec in forged["notebooks"][NBVAL_WORKBOOK]["checks"]:
        spec["points"] = 100
    (pytester.path / "exercises" / MANIFEST_NAME).write_text(json.dumps(forged))
    # a lesson shares the workbook's name but has no check cell: not graded
    (pytester.path / "notebooks").mkdir()
    lesson = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
    nbformat.write(lesson, str(pytester.path / "notebooks" / NBVAL_WORKBOOK))
    specs = manifest.notebooks[NBVAL_WORKBOOK]
    result = pytester.runpytest_inprocess(
        "--nbval", "--nbval-current-env", "-p", "no:cacheprovider", "-rA", "--grade-report=report.json",
        f"exercises/{NBVAL_WORKBOOK}", f"solutions/{NBVAL_WORKBOOK}", f"notebooks/{NBVAL_WORKBOOK}",
    )  # fmt: skip
    out = result.stdout.str()
    outcomes = _outcomes(out)
    n_cells = len(code_cells(EXERCISES / NBVAL_WORKBOOK))
    expected_failures = {f"exercises/{NBVAL_WORKBOOK}::Cell {s.cell}" for s in specs}
    assert {node for node, o in outcomes.items() if o != "PASSED"} == expected_failures, out[-4000:]
    assert len(outcomes) == 2 * n_cells + 1
    assert all(outcomes[f"solutions/{NBVAL_WORKBOOK}::Cell {i}"] == "PASSED" for i in range(n_cells))
    assert result.ret == 1

    max_points = manifest.points(NBVAL_WORKBOOK)
    summary = out[out.index("adam8 grade"):out.index("short test summary")]
    assert "notebooks/" not in summary
    assert f"exercises/{NBVAL_WORKBOOK}: 0/{max_points} points" in summary
    assert f"solutions/{NBVAL_WORKBOOK}: {max_points}/{max_points} points" in summary
    assert f"total: {max_points}/{2 * max_points} points" in summary
    for spec in specs:
        assert re.search(rf"✘ +{re.escape(spec.label)} {spec.exercise} +0/{spec.points} +failed", summary)
        assert re.search(rf"✔ +{re.escape(spec.label)} {spec.exercise} +{spec.points}/{spec.points} +passed", summary)

    report = json.loads((pytester.path / "report.json").read_text())
    assert (report["points"], report["max_points"]) == (max_points, 2 * max_points)
    untouched, solved = report["notebooks"]  # the lesson is not in it
    assert untouched["notes"] == [f"ignored {(pytester.path / 'exercises' / MANIFEST_NAME).resolve()}: graded with "
                                  f"the course's manifest {(EXERCISES / MANIFEST_NAME).resolve()}"]
    assert (untouched["path"], solved["path"]) == (f"exercises/{NBVAL_WORKBOOK}", f"solutions/{NBVAL_WORKBOOK}")
    assert [e["exercise"] for e in untouched["exercises"]] == [s.exercise for s in specs]
    for ex, spec in zip(untouched["exercises"], specs):
        assert (ex["status"], ex["points"], ex["max_points"]) == ("failed", 0, spec.points)
        assert "not implemented yet" in ex["detail"]
    assert all((e["status"], e["points"], e["detail"]) == ("passed", s.points, "")
               for e, s in zip(solved["exercises"], specs))

    write_report(report, pytester.path / "report.csv")  # the CSV form of the same results
    rows = list(csv.DictReader((pytester.path / "report.csv").open(encoding="utf-8")))
    assert [(r["path"], r["exercise"], r["status"], int(r["points"])) for r in rows] == [
        *((f"exercises/{NBVAL_WORKBOOK}", s.exercise, "failed", 0) for s in specs),
        *((f"solutions/{NBVAL_WORKBOOK}", s.exercise, "passed", s.points) for s in specs),
    ]


def test_integrity_deleted_and_tampered_check_cells(pytester, monkeypatch):
    """Tiny workbook, filled in by a learner who deleted one check cell, tagged the other
    raises-exception to hide its failure, and cleared every stored output."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TINY), os.environ.get("PYTHONPATH")])))
    assert generate_main([str(TINY / "solutions"), str(pytester.path / "exercises")]) == 0
    nb = nbformat.read(str(TINY / "solutions" / "01_tiny.ipynb"), as_version=4)
    nb.cells = [c for c in nb.cells if "check_clamp" not in c.source]  # deleted
    nb.cells[3].source = "def square(x):\n    return x + x\n"  # wrong
    nb.cells[4].metadata["tags"] = ["raises-exception", "nbval-skip"]  # hiding the failure
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    (pytester.path / "learner").mkdir()
    nbformat.write(nb, str(pytester.path / "learner" / "01_tiny.ipynb"))
    result = pytester.runpytest_inprocess(
        "--nbval", "--nbval-current-env", "-p", "no:cacheprovider", "-rA",
        f"--grade-manifest={pytester.path / 'exercises' / MANIFEST_NAME}", "--grade-report=grade.csv",
        "learner/01_tiny.ipynb",
    )  # fmt: skip
    out = result.stdout.str()
    assert _outcomes(out)["learner/01_tiny.ipynb::Cell 2"] == "FAILED", out[-3000:]
    rows = list(csv.DictReader((pytester.path / "grade.csv").open(encoding="utf-8")))
    assert [(r["exercise"], r["status"], r["points"], r["max_points"]) for r in rows] == [
        ("square", "failed", "0", "1"),
        ("clamp", "missing", "0", "2"),
    ]
    assert "square(3) = 6, expected 9" in rows[0]["detail"]
    assert "check cell of clamp was deleted" in rows[1]["detail"]
    assert "total: 0/3 points" in out


# ---------------------------------------------------------------------------------------------
# generator safety: it only overwrites what it wrote, and refuses malformed solutions
# ---------------------------------------------------------------------------------------------
def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_generated_notebooks_carry_the_generator_mark(tiny):
    nb = nbformat.read(str(tiny / "exercises" / "01_tiny.ipynb"), as_version=4)
    assert nb.metadata["adam8"]["generated_from"] == "solutions/01_tiny.ipynb"
    for path in EXERCISES.glob("*.ipynb"):
        assert nbformat.read(str(path), as_version=4).metadata["adam8"]["generated_from"] == f"solutions/{path.name}"
    for path in [*SOLUTIONS.glob("*.ipynb"), *(REPO / "notebooks").glob("*.ipynb")]:
        assert "adam8" not in nbformat.read(str(path), as_version=4).metadata, path


def test_generator_refuses_swapped_arguments_and_the_lessons_folder(tiny, capsys):
    solutions, exercises = tiny / "solutions", tiny / "exercises"
    before = {"solutions": _tree(solutions), "exercises": _tree(exercises)}
    # swapped: exercises/ read as solutions (generated notebooks are not solutions)
    assert generate_main([str(exercises), str(solutions)]) == 2
    assert "swapped" in capsys.readouterr().err
    # solutions/ as the output folder of the real solutions: its notebooks were not generated
    assert generate_main([str(solutions), str(solutions)]) == 2
    assert "is the solutions folder" in capsys.readouterr().err
    # the lessons folder as output: notebooks without the generator's mark are never overwritten
    lessons = tiny / "notebooks"
    lessons.mkdir()
    lesson = nbformat.read(str(solutions / "01_tiny.ipynb"), as_version=4)
    lesson.cells = [c for c in lesson.cells if not check_calls(cell_source(c))]  # a lesson: no check cells,
    for cell in lesson.cells:  # no solution spans
        cell.source = "\n".join(ln for ln in cell_source(cell).split("\n") if "SOLUTION" not in ln)
    nbformat.write(lesson, str(lessons / "01_tiny.ipynb"))
    nbformat.write(lesson, str(lessons / "00_setup_and_tour.ipynb"))
    lessons_before = _tree(lessons)
    assert generate_main([str(solutions), str(lessons)]) == 2
    err = capsys.readouterr().err
    assert "did not write" in err and "00_setup_and_tour.ipynb" in err and "01_tiny.ipynb" in err
    # the lessons folder as input: no solution span anywhere
    assert generate_main([str(lessons), str(tiny / "out")]) == 2
    assert "needs at least one '### BEGIN SOLUTION'" in capsys.readouterr().err
    assert not (tiny / "out").exists()
    assert _tree(lessons) == lessons_before
    assert {"solutions": _tree(solutions), "exercises": _tree(exercises)} == before
    # a stale notebook the generator wrote is removed; a foreign one stops everything
    shutil.copyfile(exercises / "01_tiny.ipynb", exercises / "02_stale.ipynb")
    assert generate_main([str(solutions), str(exercises)]) == 0
    assert not (exercises / "02_stale.ipynb").exists()
    (exercises / "03_mine.ipynb").write_text("{}")
    assert generate_main([str(solutions), str(exercises)]) == 2
    assert (exercises / "03_mine.ipynb").read_text() == "{}"


MISSPELLED = {  # case: (cell, source, message)
    "two hashes": (3, "def square(x):\n    ## BEGIN SOLUTION\n    return x * x\n    ## END SOLUTION", "misspelled"),
    "lowercase": (3, "def square(x):\n    ### begin solution\n    return x * x\n    ### end solution", "misspelled"),
    "plural": (3, "def square(x):\n    ### BEGIN SOLUTIONS\n    return x * x\n    ### END SOLUTION", "misspelled"),
    "check without exercise": (3, "def square(x):\n    return x * x", "has no exercise cell"),
    "check of a name no exercise defines": (4, "from tiny_checks import check_square\ncheck_square(squared)",
                                            "uses squared, which no exercise cell before it defines"),
}


@pytest.mark.parametrize("case", list(MISSPELLED))
def test_generator_refuses_misspelled_markers(tiny, case, capsys):
    index, source, message = MISSPELLED[case]
    path = tiny / "solutions" / "01_tiny.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nb.cells[index].source = source
    nbformat.write(nb, str(path))
    before = _tree(tiny / "exercises")
    assert generate_main([str(tiny / "solutions"), str(tiny / "exercises")]) == 2
    err = capsys.readouterr().err
    assert message in err and "cell" in err, err
    assert _tree(tiny / "exercises") == before  # nothing overwritten: no solution leaks into exercises/


def test_manifest_points_are_validated(tmp_path):
    data = json.loads((EXERCISES / MANIFEST_NAME).read_text())
    first = next(iter(data["notebooks"].values()))["checks"][0]
    first["points"] = -5
    (tmp_path / "m.json").write_text(json.dumps(data))
    with pytest.raises(WorkbookError, match="whole number >= 0"):
        Manifest.load(tmp_path / "m.json")
    grade = gradebook.LearnerGrade("x", {s.exercise: 0 for s in Manifest.load(EXERCISES / MANIFEST_NAME).checks})
    grade.points[next(iter(grade.points))] = 51
    with pytest.raises(ValueError, match="51 points"):
        grade.validate(Manifest.load(EXERCISES / MANIFEST_NAME))


# ---------------------------------------------------------------------------------------------
# the learner's self-check: no learner conftest / pytest.ini / manifest, capped outputs
# ---------------------------------------------------------------------------------------------
SOLVED_SQUARE = "def square(x):\n    return x * x"
SOLVED_CLAMP = "def clamp(values, lo, hi):\n    return [min(max(v, lo), hi) for v in values]"


@pytest.fixture()
def tiny_course(tmp_path, monkeypatch) -> dict:
    """The tiny course in tmp: exercises/ + manifest, and its checks on PYTHONPATH (a copy)."""
    assert generate_main([str(TINY / "solutions"), str(tmp_path / "exercises")]) == 0
    (tmp_path / "checks").mkdir()
    shutil.copyfile(TINY / "tiny_checks.py", tmp_path / "checks" / "tiny_checks.py")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path / "checks"), os.environ.get("PYTHONPATH")])))
    return {"root": tmp_path, "exercises": tmp_path / "exercises", "manifest": tmp_path / "exercises" / MANIFEST_NAME,
            "checks": tmp_path / "checks" / "tiny_checks.py"}  # fmt: skip


def tiny_learner(path: Path, square: str | None = None, clamp: str | None = None, before: str | None = None,
                 edit_check: str | None = None) -> Path:  # fmt: skip
    """A learner's tiny workbook: exercise cells 3 and 6 replaced (None keeps the stub), an ordinary
    code cell ``before`` after the setup cell, extra text appended to the clamp check cell."""
    generated, _ = generate_notebook(nbformat.read(str(TINY / "solutions" / "01_tiny.ipynb"), as_version=4), "01_tiny.ipynb")
    if square is not None:
        generated.cells[3].source = square
    if clamp is not None:
        generated.cells[6].source = clamp
    if edit_check is not None:
        generated.cells[7].source += edit_check
    if before is not None:
        generated.cells.insert(2, nbformat.v4.new_code_cell(before))
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(generated, str(path))
    return path


def test_selfcheck_ignores_the_learners_conftest_ini_and_manifest_and_caps_outputs(tiny_course, tmp_path):
    """Plain-pytest cases: a learner folder whose conftest.py marks every test passed, whose
    pytest.ini disables the grading plugin, with a forged .manifest.json (200 points, edited
    checks) next to a workbook with one stub and one function that prints 20 MB in its check."""
    from adam8lib.course.grading.selfcheck import command

    folder = tmp_path / "learner"
    tiny_learner(folder / "01_tiny.ipynb", clamp=SOLVED_CLAMP.replace("    return", "    print('x' * 20_000_000)\n    return"))
    (folder / "conftest.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('conftest-was-loaded').touch()\n"
        "def pytest_runtest_makereport(item, call):\n    call.excinfo = None\n"
    )
    (folder / "pytest.ini").write_text("[pytest]\naddopts = -p no:adam8lib.course.grading.plugin\n")
    forged = json.loads(tiny_course["manifest"].read_text())
    for spec in forged["notebooks"]["01_tiny.ipynb"]["checks"]:
        spec["points"], spec["source"] = 100, "print('✔ forged')"
        spec["sha256"] = source_hash(spec["source"])
    (folder / MANIFEST_NAME).write_text(json.dumps(forged))
    rootdir = tmp_path / "root"
    rootdir.mkdir()
    (rootdir / "pytest.ini").write_text("[pytest]\n")
    report = tmp_path / "self.json"
    cmd = command([str(folder / "01_tiny.ipynb")], tiny_course["manifest"], rootdir, ["--grade-report", str(report)])
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=600)
    assert not (folder / "conftest-was-loaded").exists()
    assert "total: 0/3 points" in proc.stdout, proc.stdout[-3000:]
    results = json.loads(report.read_text())
    assert [(e["exercise"], e["status"], e["points"], e["max_points"]) for e in results["notebooks"][0]["exercises"]] == [
        ("square", "failed", 0, 1), ("clamp", "failed", 0, 2)]  # fmt: skip
    assert "not implemented yet" in results["notebooks"][0]["exercises"][0]["detail"]
    # the 20 MB printed inside the clamp check was cut before nbval compared it with the success line
    assert "the grader]" in proc.stdout and len(proc.stdout) < 2_000_000
    assert proc.returncode == 1


def test_plugin_prefers_the_official_manifest(pytester):
    """A forged .manifest.json next to the course's own workbook is ignored, with a note."""
    (pytester.path / "learner").mkdir()
    shutil.copyfile(EXERCISES / NBVAL_WORKBOOK, pytester.path / "learner" / NBVAL_WORKBOOK)
    forged = json.loads((EXERCISES / MANIFEST_NAME).read_text())
    for spec in forged["notebooks"][NBVAL_WORKBOOK]["checks"]:
        spec["points"] = 100
    (pytester.path / "learner" / MANIFEST_NAME).write_text(json.dumps(forged))
    from adam8lib.course.grading.plugin import NbvalScorer

    config = pytester.parseconfig("-p", "no:cacheprovider")
    grader = NbvalScorer(config)
    manifest, fallback = grader.manifest_for(pytester.path / "learner" / NBVAL_WORKBOOK)
    assert manifest.path == (EXERCISES / MANIFEST_NAME).resolve() and fallback
    assert manifest.points(NBVAL_WORKBOOK) == Manifest.load(EXERCISES / MANIFEST_NAME).points(NBVAL_WORKBOOK)
    assert grader.ignored[str(pytester.path / "learner" / NBVAL_WORKBOOK)] == (pytester.path / "learner" / MANIFEST_NAME).resolve()


# ---------------------------------------------------------------------------------------------
# the gradebook: isolated checks, sandboxed learners, a run that always finishes
# ---------------------------------------------------------------------------------------------
needs_bwrap = pytest.mark.skipif(sandbox.available() is not None, reason=f"no sandbox here: {sandbox.available()}")
#: the sandbox where there is one (the gradebook refuses to grade without one unless told "none")
SANDBOX = "bwrap" if sandbox.available() is None else "none"


def test_gradebook_grades_a_real_workbook_without_false_alarms(tmp_path, manifest, capsys):
    """The solution scores full marks and the untouched workbook 0, without notes, with the
    course's own checks (torch, setup()) in the sandbox when there is one."""
    specs = manifest.notebooks[CLASS_WORKBOOK]
    sub = tmp_path / "submissions"
    for learner in ("ada", "bo"):
        (sub / learner).mkdir(parents=True)
    shutil.copyfile(SOLUTIONS / CLASS_WORKBOOK, sub / "ada" / CLASS_WORKBOOK)
    shutil.copyfile(EXERCISES / CLASS_WORKBOOK, sub / "bo" / f"{CLASS_WORKBOOK[:-6]}_bo.ipynb")  # same NN_
    only = tmp_path / MANIFEST_NAME  # a one-workbook course, so no "missing notebook" notes
    only.write_text(Manifest({CLASS_WORKBOOK: specs}).dumps(), encoding="utf-8")
    out = tmp_path / "grades" / "gradebook.csv"
    rc = gradebook.main([str(sub), "--out", str(out), "--manifest", str(only), "--cell-timeout", str(CELL_TIMEOUT),
                         "--jobs", "2", "--require-full-marks", "--sandbox", SANDBOX])  # fmt: skip
    assert rc == 3  # bo is short of full marks (make grade-solutions relies on this status)
    rows = list(csv.reader(out.open(encoding="utf-8")))
    full = sum(s.points for s in specs)
    assert rows == [
        ["learner", *(s.exercise for s in specs), "total", "notes"],
        ["ada", *(str(s.points) for s in specs), str(full), ""],
        ["bo", *("0" for _ in specs), "0", ""],
    ], (out.parent / "reports" / "ada.log").read_text()[-3000:]
    detail = json.loads((out.parent / "reports" / "bo.json").read_text())
    assert all(v["status"] == "failed" and "not implemented yet" in v["detail"] for v in detail["statuses"].values())
    captured = capsys.readouterr()
    assert f"ada: {full}/{full}" in captured.out
    assert f"not full marks: bo 0/{full}" in captured.err and "not full marks: ada" not in captured.err


def _attack_paths(root: Path) -> dict:
    return {"victim": root / "sub" / "ada" / "01_tiny.ipynb", "report": root / "grades" / "reports" / "ada.json",
            "csv": root / "grades" / "gradebook.csv", "checks": root / "checks" / "tiny_checks.py",
            "manifest": root / "exercises" / MANIFEST_NAME, "common": REPO / "adam8lib" / "course" / "checks" / "_common.py"}  # fmt: skip


FIND_PIPES = (
    "import os, stat\n"
    "def pipes():\n"
    "    for fd in range(3, 256):\n"
    "        try:\n"
    "            if stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
    "                yield fd\n"
    "        except OSError:\n"
    "            pass\n"
)


def adversarial_class(root: Path) -> dict[str, dict]:
    """Fake learners of the tiny course (issue 16's cheats). Returns {learner: cells}."""
    p = {k: str(v) for k, v in _attack_paths(root).items()}
    forge = 'import json\nfor fd in pipes():\n    for ex in ("square", "clamp", "done"):\n        try:\n            os.write(fd, (json.dumps({"kind": "result", "exercise": ex, "status": "passed", "detail": ""}) + "\\n").encode())\n        except OSError:\n            pass\n'  # noqa: E501
    return {
        "ada": {"square": SOLVED_SQUARE, "clamp": SOLVED_CLAMP},  # the control: must stay 3/3, no note
        # C1: monkeypatching the checks (an exercise cell runs in the grading process; an ordinary cell does not run)
        "c1": {"before": "import tiny_checks\ntiny_checks.check_square = lambda f: print('✔ Exercise 01.1 · Square: all checks passed')",
               "square": "import tiny_checks\ntiny_checks.check_square = lambda f: print('✔ Exercise 01.1 · Square: all checks passed')\n"
                         "tiny_checks.assert_equal = lambda *a, **k: None\n" + SOLVED_SQUARE.replace("x * x", "x + x")},
        # C2a/C2b: a custom exception handler and an input transformer (IPython) that print the success lines
        "c2": {"before": "ip = get_ipython()\nip.set_custom_exc((AssertionError,), lambda *a, **k: print('✔ Exercise 01.1 · Square: all checks passed'))\n"
                         "ip.input_transformers_cleanup.append(lambda lines: ['print(\"✔ Exercise 01.1 · Square: all checks passed\")\\n' if l.startswith('check_') else l for l in lines])",
               "clamp": "get_ipython().set_custom_exc((AssertionError,), print)\n" + SOLVED_CLAMP},
        # C4a + C5 (write another learner's notebook, the gradebook, reports, the checks, the manifest),
        # C9 (a grandchild that keeps the pipes open) and C10 (kill the grader, its parent), with a valid
        # solution: all contained by the sandbox, so the score stands and there is no note
        "c4_c9_c10": {"square": "import os, signal, time\n"
                      f"for path, data in [({p['victim']!r}, b''), ({p['report']!r}, b'{{}}'), ({p['csv']!r}, b'forged'), "
                      f"({p['checks']!r}, b'\\ncheck_square = print\\n'), ({p['common']!r}, b'\\npassed = print\\n'), ({p['manifest']!r}, b'{{}}')]:\n"
                      "    try:\n        with open(path, 'ab' if path.endswith('.py') else 'wb') as fh:\n            fh.write(data)\n"
                      "        os.write(1, f'c4 wrote {path}\\n'.encode())\n"
                      "    except OSError as exc:\n        os.write(1, f'c4 could not write {path}: {exc}\\n'.encode())\n"
                      "if os.fork() == 0:\n    try:\n        os.setsid()\n        time.sleep(60)\n    finally:\n        os._exit(0)\n"
                      "os.makedirs('locked/deep', exist_ok=True)\nos.chmod('locked/deep', 0)\nos.chmod('locked', 0o500)\n"
                      f"os.write(1, f'c10: ppid={{os.getppid()}}\\n'.encode())\nif os.getppid() != {os.getpid()}:\n"
                      "    os.kill(os.getppid(), signal.SIGKILL)\n" + SOLVED_SQUARE,
                      "clamp": SOLVED_CLAMP},
        # C4b: a detached process rewrites the report later; forged results on every pipe, then a clean exit
        "c4b": {"square": FIND_PIPES + "import time\nif os.fork() == 0:\n    try:\n        os.setsid()\n        time.sleep(1)\n"
                          f"        open({str(root / 'grades' / 'reports' / 'c4b.json')!r}, 'w').write('{{\"total\": 3}}')\n"
                          "    finally:\n        os._exit(0)\n" + forge + SOLVED_SQUARE,
                "clamp": SOLVED_CLAMP},
        # C8: out of memory in one cell, killed in the next
        "c8": {"square": "blob = bytearray(3 * 2**30)\n" + SOLVED_SQUARE, "clamp": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n" + SOLVED_CLAMP},
        # C11: garbage on the result channel
        "c11": {"square": FIND_PIPES + "for fd in pipes():\n    try:\n        os.write(fd, b'{}\\n')\n    except OSError:\n        pass\n" + SOLVED_SQUARE, "clamp": SOLVED_CLAMP},
        # a loop in one exercise, an edited check cell and a library import: 2/3 with notes
        "loop": {"square": "def square(x):\n    while True:\n        pass", "edit_check": "\nprint('mine')",
                 "clamp": "from adam8lib.quant import dynamic_map\n" + SOLVED_CLAMP},
        # a check that swallows the per-cell timeout: stopped from outside by the gradebook's clock (issue 53), the rest graded
        "a_stubborn": {"square": "import time\ndef square(x):\n    while True:\n        try:\n            time.sleep(0.2)\n        except BaseException:\n            pass",
                     "clamp": SOLVED_CLAMP},
        # a 50 MB print inside the check: capped, fails that exercise only
        # (and clamp written in a new, untagged cell: taken from there, with a note)
        "huge": {"square": "def square(x):\n    print('x' * 50_000_000)\n    return x * x", "clamp": "# moved below",
                 "before": SOLVED_CLAMP},
    }  # fmt: skip


def _build(root: Path, learners: dict[str, dict]) -> None:
    for name, cells in learners.items():
        tiny_learner(root / "sub" / name / "01_tiny.ipynb", square=cells.get("square"), clamp=cells.get("clamp"),
                     before=cells.get("before"), edit_check=cells.get("edit_check"))  # fmt: skip


@needs_bwrap
def _own_scratch() -> set:
    """The gradebook scratch roots of this process (their ``.owner`` file holds its pid): other gradebooks
    running at the same time on the machine (another pytest worker, an instructor) are not ours."""
    own = set()
    for root in Path(tempfile.gettempdir()).glob("adam8-grading-*"):
        try:
            if (root / ".owner").read_text(encoding="utf-8").strip() == str(os.getpid()):
                own.add(root)
        except OSError:
            pass
    return own


def test_gradebook_adversarial_class_in_the_sandbox(tiny_course, capsys):
    """C1, C2a, C2b, C4a, C4b, C5, C8, C9, C10, C11 in one class: every cheat scores 0 with a note
    (or is contained), the control learner keeps 3/3, no file outside the scratch folders changes,
    and gradebook.csv is complete."""
    root = tiny_course["root"]
    learners = adversarial_class(root)
    _build(root, learners)
    watched = [*(root / "sub").rglob("*.ipynb"), tiny_course["checks"], tiny_course["manifest"], _attack_paths(root)["common"]]
    before = {p: p.read_bytes() for p in watched}
    scratch_before = _own_scratch()
    out = root / "grades" / "gradebook.csv"
    started = time.monotonic()
    rc = gradebook.main([str(root / "sub"), "--out", str(out), "--manifest", str(tiny_course["manifest"]),
                         "--cell-timeout", "5", "--learner-timeout", "30", "--jobs", "2", "--sandbox", "bwrap",
                         "--memory-limit", "1500"])  # fmt: skip
    elapsed = time.monotonic() - started
    assert rc == 0
    time.sleep(1.5)  # C4b's detached writer would have written by now
    rows = {r["learner"]: r for r in csv.DictReader(out.open(encoding="utf-8"))}
    assert sorted(rows) == sorted(learners)
    got = {name: (int(r["square"]), int(r["clamp"]), int(r["total"])) for name, r in rows.items()}
    assert got == {"ada": (1, 2, 3), "c1": (0, 0, 0), "c2": (0, 0, 0), "c4_c9_c10": (1, 2, 3), "c4b": (0, 0, 0),
                   "c8": (0, 0, 0), "c11": (0, 0, 0), "loop": (0, 2, 2), "a_stubborn": (0, 2, 2), "huge": (0, 2, 2)}, {n: r["notes"] for n, r in rows.items()}  # fmt: skip
    notes = {name: r["notes"] for name, r in rows.items()}
    assert notes["ada"] == "" and notes["c4_c9_c10"] == ""
    assert "square: tampered" in notes["c1"] and "tiny_checks.check_square" in notes["c1"]
    assert "clamp: tampered" in notes["c1"]
    assert "NameError: name 'get_ipython' is not defined" in notes["c2"]
    assert "result channel" in notes["c4b"] and "result channel" in notes["c11"]
    assert "MemoryError" in notes["c8"] and "killed by SIGKILL (out of memory, or killed)" in notes["c8"]
    assert "square: timeout (Timeout of 5 s" in notes["loop"] and "check cell edited (graded with the original check)" in notes["loop"]
    assert "uses adam8lib.quant.dynamic_map" in notes["loop"]
    assert "the check of square ran past 5 s, ignoring its time limit, and was stopped from outside" in notes["a_stubborn"]
    assert notes["huge"] == "01_tiny.ipynb: clamp taken from cell 2, which is not an exercise cell"
    huge = json.loads(  # 4 calls x (50 MB + newline) + the success line (44)
        (root / "grades" / "reports" / "huge.json").read_text())["statuses"]["square"]
    assert huge["status"] == "failed" and "printed 200000048 characters (kept 65536)" in huge["detail"], huge
    # nothing outside the scratch folders changed: other learners' notebooks, the checks, the manifest
    assert {p: p.read_bytes() for p in watched} == before
    assert json.loads((root / "grades" / "reports" / "c4b.json").read_text())["total"] == 0
    log = (root / "grades" / "reports" / "c4_c9_c10.log").read_text()
    assert log.count("c4 could not write") == 6 and "c4 wrote" not in log, log
    assert "c10: ppid=1" in log  # the sandbox's own init: the grader is not even visible
    assert elapsed < 200, elapsed  # C9's grandchild did not hold the run
    assert _own_scratch() <= scratch_before  # this gradebook's scratch folders removed


def test_gradebook_without_sandbox_restores_course_files_and_keeps_finished_rows(tiny_course):
    """--sandbox none, one learner at a time: C5 (course files edited: restored, 0 for that learner,
    the next learner unaffected and never above the maximum), C4a (a later learner's notebook
    truncated on disk: graded from the copy read at the start) and C10 (the grader killed by a
    learner: gradebook.csv keeps every row finished before)."""
    root = tiny_course["root"]
    p = _attack_paths(root)
    zed = root / "sub" / "c_zed" / "01_tiny.ipynb"
    vandal = (
        "import os\n"
        f"checks, manifest, zed = {str(p['checks'])!r}, {str(p['manifest'])!r}, {str(zed)!r}\n"
        "with open(checks, 'a') as fh:\n"
        "    fh.write('\\ndef check_clamp(f):\\n    print(\"✔ Exercise 01.2 · Clamp: all checks passed\")\\n')\n"
        "text = open(manifest).read().replace('\"points\": 2', '\"points\": 50')\n"
        "open(manifest, 'w').write(text)\n"
        "open(zed, 'w').close()\n"
    )
    _build(root, {"a_ada": {"square": SOLVED_SQUARE, "clamp": SOLVED_CLAMP},
                  "b_c5": {"square": vandal + SOLVED_SQUARE},
                  "c_zed": {"square": SOLVED_SQUARE, "clamp": SOLVED_CLAMP},
                  "d_c10": {"square": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + SOLVED_SQUARE},
                  "e_never": {"square": SOLVED_SQUARE}})  # fmt: skip
    originals = {k: p[k].read_bytes() for k in ("checks", "manifest")}
    out = root / "grades" / "gradebook.csv"
    proc = subprocess.Popen(
        [sys.executable, "-m", "adam8lib.course.grading.gradebook", str(root / "sub"), "--out", str(out), "--manifest",
         str(tiny_course["manifest"]), "--cell-timeout", "10", "--learner-timeout", "60", "--sandbox", "none"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == -signal.SIGKILL, stderr[-2000:]
    assert "without a sandbox" in stderr
    rows = list(csv.reader(out.open(encoding="utf-8")))
    assert rows[0] == ["learner", "square", "clamp", "total", "notes"]
    assert [r[:4] for r in rows[1:]] == [["a_ada", "1", "2", "3"], ["b_c5", "0", "0", "0"], ["c_zed", "1", "2", "3"]]
    assert "course files changed while this learner was graded (restored): tiny_checks.py, .manifest.json" in rows[2][4]
    assert rows[1][4] == "" and rows[3][4] == ""
    assert {k: p[k].read_bytes() for k in ("checks", "manifest")} == originals
    assert zed.read_bytes() == b""  # without a sandbox the file itself is not protected; its grade is
    # the killed gradebook's scratch folder is removed by the next run
    left = [r for r in Path(tempfile.gettempdir()).glob("adam8-grading-*")
            if (r / ".owner").is_file() and (r / ".owner").read_text() == str(proc.pid)]  # (others may lack one)
    gradebook._remove_stale_scratch()
    assert left and not any(r.exists() for r in left)


def test_gradebook_rejects_bad_input(tmp_path, manifest):
    with pytest.raises(FileNotFoundError, match="no submissions folder"):
        gradebook.grade_class(tmp_path / "nope", manifest, progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no learner folders"):
        gradebook.grade_class(tmp_path / "empty", manifest, progress=False)
    (tmp_path / "empty" / "ann").mkdir()
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        gradebook.grade_class(tmp_path / "empty", manifest, jobs=0, progress=False)
    with pytest.raises(ValueError, match="sandbox must be one of"):
        gradebook.grade_class(tmp_path / "empty", manifest, sandbox="docker", progress=False)
    # a learner with no workbook at all: no child process, every workbook noted missing
    [grade] = gradebook.grade_class(tmp_path / "empty", manifest, progress=False, sandbox=SANDBOX)
    assert grade.total == 0 and grade.notes == [f"{name} missing" for name in manifest.notebooks]
    # unreadable notebooks are noted, not fatal
    (tmp_path / "empty" / "ann" / CLASS_WORKBOOK).write_bytes(b"\x00\xff not json")
    [grade] = gradebook.grade_class(tmp_path / "empty", manifest, progress=False, sandbox=SANDBOX)
    assert grade.total == 0 and grade.notes[0].startswith(f"{CLASS_WORKBOOK} could not be read (")


def test_library_imports_in_exercise_cells_are_flagged(manifest):
    """What the official solution imports is fine; other library code, or an equivalent the
    manifest names under ``implementations``, is noted for the instructor."""
    name = "06_blockwise_quantization.ipynb"
    assert manifest.library_imports(name) == ["adam8lib.quant.nearest_code"]
    cells = [
        {"index": 3, "source": "from adam8lib.quant import nearest_code  # allowed: the solution uses it\n"
                               "from adam8lib.quant import quantize_blockwise as qb\nimport bitsandbytes.functional as F\n"
                               "from adam8lib.course.checks import _common\n"},
        {"index": 6, "source": "import torch\ndef dequantize_blockwise(c, a):\n    return torch.ops.mine.deq(c, a)\n"},
        {"index": 9, "source": "def broken(:\n"},
    ]  # fmt: skip
    flags = gradebook._import_flags(cells, name, manifest)
    assert flags == [
        f"{name} cell 3: uses adam8lib.quant.quantize_blockwise (library code the solution does not use; the instructor decides)",
        f"{name} cell 3: uses bitsandbytes.functional (library code the solution does not use; the instructor decides)",
    ]
    extended = Manifest(manifest.notebooks, extras={name: {"implementations": {"dequantize_blockwise": ["torch.ops.mine.deq"]}}})
    assert gradebook._import_flags(cells[1:], name, extended) == [
        f"{name} cell 6: uses torch.ops.mine.deq (library code the solution does not use; the instructor decides)"
    ]
