"""The learner view leaves out what an exercise asks the learner to write (issue 53): the manifest's
``implementations``, withheld by construction (:mod:`adam8lib.course.grading.withheld`).

Under bubblewrap the learner process of a workbook is shown each library module that defines one of its exercises'
``implementations`` as a copy in which that definition is a stand-in raising ``RuntimeError("… is not available
while grading 12.4 …")``: the code is not in the learner view (nor its compiled form), so neither calling it under
a name built at run time nor reading its source gets it back, guard or no guard. The gradebook notes the call. A name
that cannot be withheld is the grader's problem (exit 2), never a learner's 0.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import py_compile
import sys
import types
from pathlib import Path

import nbformat
import pytest

from adam8lib.course.grading import gradebook, sandbox, withheld
from adam8lib.course.grading.conventions import MANIFEST_NAME, Manifest, cell_source, is_solution_cell

from tests.course._one_workbook_class import grade_class, said

REPO = Path(__file__).resolve().parents[2]
MANIFEST = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
WITH_IMPLEMENTATIONS = [nb for nb in MANIFEST.notebooks if any(MANIFEST.implementations_by_label(nb).values())]


def _copy_as_module(path: Path, text: str, tmp_path: Path) -> types.ModuleType:
    """Import the withheld copy of ``path`` beside its package, as a module of its own (the original stays)."""
    original = next(m for m in list(sys.modules.values())
                    if getattr(m, "__file__", None) and Path(m.__file__).resolve() == path)
    package, _, stem = original.__name__.rpartition(".")
    tmp_path.mkdir(parents=True, exist_ok=True)
    copy = tmp_path / f"{stem}.py"
    copy.write_text(text, encoding="utf-8")
    name = f"{package}._withheld_{stem}"
    spec = importlib.util.spec_from_file_location(name, copy)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


def test_some_exercises_of_most_workbooks_declare_what_they_ask_for():
    """The manifest names the library's versions of what the learners write (at least the README's examples)."""
    assert len(WITH_IMPLEMENTATIONS) >= 10, WITH_IMPLEMENTATIONS
    assert "adam8lib.rounding.stochastic_round_to_bf16" in MANIFEST.implementations("12_beyond_8_bits.ipynb")
    assert "bitsandbytes.functional.quantize_blockwise" in MANIFEST.implementations("06_blockwise_quantization.ipynb")


@pytest.mark.parametrize("notebook", WITH_IMPLEMENTATIONS)
def test_every_declared_implementation_is_withheld_and_its_module_still_imports(notebook, tmp_path):
    wanted = MANIFEST.implementations_by_label(notebook)
    copies = withheld.withheld_sources(wanted, MANIFEST.library_imports(notebook))
    assert copies, notebook
    for exercise, names in wanted.items():
        for dotted in names:
            value = withheld.resolve(dotted)
            path = Path(inspect.getsourcefile(sys.modules[value.__module__])).resolve()
            tree = ast.parse(copies[path])
            node = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == value.__name__)
            original = next(n for n in ast.parse(path.read_text(encoding="utf-8")).body
                            if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == value.__name__)
            # the definition's code is gone: no statement of its (or its methods') body is left in the copy
            code = [f for f in ast.walk(original) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
            gone = [ast.dump(s) for f in code for s in ast.walk(f) if isinstance(s, (ast.Return, ast.Assign, ast.AugAssign))]
            kept = {ast.dump(s) for s in ast.walk(node)}
            assert not [s for s in gone if s in kept], dotted
            said = ast.unparse(node)
            asked = said.split(" ask")[0].split("exercise")[-1]  # "s 03.1 and 03.2" / " 12.4"
            assert f"{dotted} {withheld.MARK} " in said and exercise in asked, said[:300]
    for path, text in copies.items():
        if "site-packages" in str(path):  # bitsandbytes registers torch ops on import: compiled only
            compile(text, str(path), "exec")
            continue
        module = _copy_as_module(path, text, tmp_path / path.stem)
        for exercise, names in wanted.items():
            for dotted in names:
                value = withheld.resolve(dotted)
                if Path(inspect.getsourcefile(sys.modules[value.__module__])).resolve() != path:
                    continue
                stand_in = getattr(module, value.__name__)
                if isinstance(stand_in, type):  # its declarations kept (modules read them at import), its methods not
                    own = [k for k, v in vars(value).items() if inspect.isfunction(v) and k != "__init__"]
                    assert own and all(k in vars(stand_in) for k in own), dotted
                    declared = {k: v for k, v in vars(value).items()
                                if isinstance(v, (str, int, float, tuple, dict)) and k != "__module__"}
                    assert declared == {k: vars(stand_in).get(k) for k in declared}, dotted
                    stand_in()  # an instance can be made (a class body may make one at import)
                    call = getattr(stand_in, own[0])
                else:
                    call = stand_in
                with pytest.raises(RuntimeError, match=f"{dotted} {withheld.MARK} .*{exercise}"):
                    call(1.0)
                assert withheld.used(f"your code raised RuntimeError: {dotted} {withheld.MARK} {exercise}: ...") == [
                    (dotted, exercise)]  # fmt: skip


def test_what_the_solution_uses_is_not_withheld():
    kept = withheld.withheld_sources({"12.4": ["adam8lib.rounding.stochastic_round_to_bf16"]},
                                     keep=["adam8lib.rounding.stochastic_round_to_bf16"])
    assert kept == {}


@pytest.mark.parametrize("dotted, why", [
    ("adam8lib.formats.MomentFormat.quantize", "only top-level definitions"),
    ("adam8lib.rounding.no_such_function", "has no no_such_function"),
    ("adam8lib.formats.FORMATS", "only functions and classes"),
    ("no_such_package.f", "no module of that name imports"),
])  # fmt: skip
def test_a_name_that_cannot_be_withheld_is_refused_by_name(dotted, why):
    with pytest.raises(withheld.Withheld, match=why):
        withheld.withheld_sources({"12.4": [dotted]})


def test_compiled_forms_are_shown_empty(tmp_path, monkeypatch):
    """A compiled copy of a withheld module (in ``__pycache__``) would give the definition back: each is shown
    empty, and Python then compiles the withheld copy."""
    package = tmp_path / "wpkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    source = package / "impl.py"
    source.write_text("def secret(x):\n    return x * 41 + 1\n\n\ndef other():\n    return 2\n", encoding="utf-8")
    compiled = Path(py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source))))
    monkeypatch.syspath_prepend(str(tmp_path))
    pairs = withheld.write_view({"99.1": ["wpkg.impl.secret"]}, [], tmp_path / "view")
    copy, original = pairs[0]
    assert original == source.resolve() and "41" not in copy.read_text() and "def other" in copy.read_text()
    assert (tmp_path / "view" / "empty", compiled) in pairs and (tmp_path / "view" / "empty").read_bytes() == b""


def test_a_manifest_naming_what_cannot_be_withheld_stops_the_gradebook(tmp_path, capsys):
    if sandbox.available() is not None:
        pytest.skip(f"no bubblewrap here: {sandbox.available()}")
    name = "12_beyond_8_bits.ipynb"
    broken = Manifest({name: MANIFEST.notebooks[name]},
                      extras={name: {**MANIFEST.extras[name], "implementations": {"stochastic_round": [
                          "adam8lib.formats.MomentFormat.quantize"]}}})  # fmt: skip
    (tmp_path / MANIFEST_NAME).write_text(broken.dumps(), encoding="utf-8")
    (tmp_path / "sub" / "ada").mkdir(parents=True)
    nbformat.write(nbformat.read(str(REPO / "exercises" / name), as_version=4), str(tmp_path / "sub" / "ada" / name))
    rc = gradebook.main([str(tmp_path / "sub"), "--out", str(tmp_path / "g" / "gradebook.csv"), "--manifest",
                         str(tmp_path / MANIFEST_NAME), "--sandbox", "bwrap"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "the grader failed, not the learners" in err and "cannot be withheld" in err, err
    assert not (tmp_path / "g" / "gradebook.csv").exists() or "ada" not in (tmp_path / "g" / "gradebook.csv").read_text()


# -- a class of workbook 12, graded in the sandbox with the guard switched off: what the construction alone does --
WB12 = "12_beyond_8_bits.ipynb"
EX12 = ("pack_nibbles", "zero_point_victims", "rank1_scale", "stochastic_round")
SOLVED12 = dict(zip(EX12, [cell_source(c) for c in nbformat.read(str(REPO / "solutions" / WB12), as_version=4).cells
                           if c.cell_type == "code" and is_solution_cell(c)]))  # fmt: skip
CALLS = '''
import importlib
def stochastic_round(x, generator):
    return importlib.import_module("adam8lib.round" + "ing").stochastic_round_to_bf16(x, generator)
'''
READS = '''
import importlib
_module = importlib.import_module("adam8lib.round" + "ing")
_found = {}
exec(compile(open(_module.__file__).read(), "<read from the learner view>", "exec"), dict(vars(_module)), _found)
def stochastic_round(x, generator):
    return _found["stochastic_round_to_bf16"](x, generator)
'''
PACKS = '''
import importlib
_formats = importlib.import_module("adam8lib.for" + "mats")
def pack_nibbles(codes):
    return _formats.pack_nibbles(codes)
def unpack_nibbles(packed, n):
    return _formats.unpack_nibbles(packed, n)
'''


@pytest.fixture(scope="module")
def graded12(tmp_path_factory):
    if sandbox.available() is not None:
        pytest.skip(f"no bubblewrap here (the learner view needs it): {sandbox.available()}")
    learners = {"honest": SOLVED12, "calls": {**SOLVED12, "stochastic_round": CALLS},
                "reads": {**SOLVED12, "stochastic_round": READS}, "packs": {**SOLVED12, "pack_nibbles": PACKS}}
    return grade_class(tmp_path_factory.mktemp("withheld12"), WB12, EX12, learners, "bwrap", 120,
                       learner_flags=("--no-guard",))


def test_the_honest_learner_keeps_full_marks_without_a_note(graded12):
    row = graded12["honest"]
    assert [int(row[e]) for e in EX12] == [1, 1, 1, 1] and row["notes"] == "", row


@pytest.mark.parametrize("learner, exercise, dotted", [
    ("calls", "stochastic_round", "adam8lib.rounding.stochastic_round_to_bf16"),
    ("reads", "stochastic_round", "adam8lib.rounding.stochastic_round_to_bf16"),
    ("packs", "pack_nibbles", "adam8lib.formats.pack_nibbles"),
])  # fmt: skip
def test_the_librarys_version_of_an_exercise_is_not_in_the_learner_view(graded12, learner, exercise, dotted):
    """Called under a name built at run time, or rebuilt from the module's source as the learner view shows it, the
    library's version is a stand-in: 0 for that exercise, a note naming it, the other exercises keep their points."""
    row = graded12[learner]
    points = {e: int(row[e]) for e in EX12}
    assert points[exercise] == 0 and sum(points.values()) == 3, (points, row["notes"])
    assert f"called {dotted}, which exercise 12." in row["notes"], row["notes"]
    assert f"{dotted} {withheld.MARK} 12." in said(row, exercise), said(row, exercise)
