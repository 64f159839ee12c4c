"""Course tests of the grading system (adam8lib/course/grading): generator, nbval plugin, gradebook.

* exercises/ is in sync with solutions/, every solution span is stubbed, every check cell is
  in the manifest and calls a check that exists;
* the generator on the tiny fixture workbook (tests/fixtures/tiny): stubs, tags, links,
  manifest, ``--check``, and a clear error for each malformed solution;
* ``pytest --nbval`` on an untouched workbook fails on exactly its check cells (taken from the
  manifest) while the solution passes; the score summary and ``--grade-report`` contents;
* integrity: edited / deleted check cells and learner-added nbval markers;
* a gradebook of three learners: complete, untouched, and one whose code loops forever in
  one exercise and who edited another exercise's check cell;
* the workbook unit tests (tests/workbooks) fail on every stub of exercises/.

Kernels make this slow, so the notebook runs use the smallest workbooks and run once per
scenario: NBVAL_WORKBOOK (2 exercises) and CLASS_WORKBOOK (3 independent exercises).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest

from adam8lib.course.grading import gradebook
from adam8lib.course.grading.generate import generate, main as generate_main
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
        stubs = 0
        for s, e in zip(sol, ex):
            src, out = cell_source(s), cell_source(e)
            assert BEGIN not in out and "END SOLUTION" not in out, name
            if BEGIN in src:
                stubs += src.count(BEGIN)
                assert out.count("raise NotImplementedError(\"Exercise ") == src.count(BEGIN), (name, out)
                assert SOLUTION_TAG in e.metadata["tags"] and "nbval-ignore-output" in e.metadata["tags"]
                assert e.outputs == [] and e.execution_count is None
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
    assert nb.cells[4].outputs[0]["text"] == "✔ Exercise 01.1 · Square: all checks passed\n"
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
    (tiny / "exercises" / "09_stale.ipynb").write_text("{}")
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
    shutil.copyfile(EXERCISES / MANIFEST_NAME, pytester.path / "exercises" / MANIFEST_NAME)
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


def test_gradebook_of_a_class(tmp_path, manifest, capsys):
    """complete / untouched / a learner who loops forever in one exercise and edited a check."""
    specs = manifest.notebooks[CLASS_WORKBOOK]
    assert len(specs) >= 3, "the class scenario needs three exercises: a loop, an edit and a pass"
    looping, edited = specs[0], specs[1]
    sub = tmp_path / "submissions"
    for learner in ("ada", "bo", "cy"):
        (sub / learner).mkdir(parents=True)
    shutil.copyfile(SOLUTIONS / CLASS_WORKBOOK, sub / "ada" / CLASS_WORKBOOK)
    shutil.copyfile(EXERCISES / CLASS_WORKBOOK, sub / "bo" / CLASS_WORKBOOK)
    nb = nbformat.read(str(SOLUTIONS / CLASS_WORKBOOK), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    solution = code[looping.cell - 1]
    lines = solution.source.split("\n")
    at = next(i for i, line in enumerate(lines) if line.strip() == BEGIN)
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    lines[at + 1: at + 1] = [f"{indent}while True:", f"{indent}    pass"]
    solution.source = "\n".join(lines)
    code[edited.cell].source += "\nprint('my own check')"
    # calling a check from one's own cell too is fine while the original check cell is there
    code[specs[2].cell - 1].source += "\n" + code[specs[2].cell].source
    nbformat.write(nb, str(sub / "cy" / f"{CLASS_WORKBOOK[:-6]}_cy.ipynb"))  # another name, same NN_
    only = tmp_path / MANIFEST_NAME  # a one-workbook course, so no "missing notebook" notes
    only.write_text(Manifest({CLASS_WORKBOOK: specs}).dumps(), encoding="utf-8")

    out = tmp_path / "grades" / "gradebook.csv"
    rc = gradebook.main([str(sub), "--out", str(out), "--manifest", str(only),
                         "--cell-timeout", str(CELL_TIMEOUT), "--jobs", "3"])  # fmt: skip
    assert rc == 0
    rows = list(csv.reader(out.open(encoding="utf-8")))
    ids = [s.exercise for s in specs]
    full = sum(s.points for s in specs)
    assert rows[0] == ["learner", *ids, "total", "notes"]
    assert rows[1] == ["ada", *(str(s.points) for s in specs), str(full), ""], rows
    assert rows[2] == ["bo", *("0" for _ in specs), "0", ""], rows
    cy_points = [0, 0, *(s.points for s in specs[2:])]
    assert rows[3][:-1] == ["cy", *map(str, cy_points), str(sum(cy_points))], rows
    notes = rows[3][-1].split("; ")
    assert notes[0].startswith(f"{CLASS_WORKBOOK} {looping.label} {looping.exercise}: timeout (Timeout of {CELL_TIMEOUT}")
    assert notes[1] == (
        f"{CLASS_WORKBOOK} {edited.label} {edited.exercise}: edited (check cell of {edited.exercise} was edited: "
        f"restore it from exercises/{CLASS_WORKBOOK})"
    )
    assert len(notes) == 2
    printed = capsys.readouterr().out
    assert f"ada: {full}/{full}" in printed and f"cy: {sum(cy_points)}/{full} (see notes)" in printed
    detail = json.loads((out.parent / "reports" / "cy.json").read_text())
    assert [e["status"] for e in detail["notebooks"][0]["exercises"]] == ["timeout", "edited", *["passed"] * (len(specs) - 2)]
    assert "Integrity" in (out.parent / "reports" / "cy.log").read_text()


def test_gradebook_rejects_bad_input(tmp_path, manifest):
    with pytest.raises(FileNotFoundError, match="no submissions folder"):
        gradebook.grade_class(tmp_path / "nope", manifest, progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no learner folders"):
        gradebook.grade_class(tmp_path / "empty", manifest, progress=False)
    (tmp_path / "empty" / "ann").mkdir()
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        gradebook.grade_class(tmp_path / "empty", manifest, jobs=0, progress=False)
    # a learner with no workbook at all: no pytest run, every workbook noted missing
    [grade] = gradebook.grade_class(tmp_path / "empty", manifest, progress=False)
    assert grade.total == 0 and grade.notes == [f"{name} missing" for name in manifest.notebooks]
