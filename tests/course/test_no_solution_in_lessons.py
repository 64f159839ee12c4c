"""No lesson shows a workbook solution's body: the learner meets the idea in the lesson and writes the body.

Every solution function's body (``solutions/*.ipynb``, between the solution markers) is compared, as a
normalised AST, with every function body and every code cell of every lesson (``notebooks/*.ipynb``),
exactly and nearly (:mod:`tests.course.solution_leaks` says how). Near matches are measured in tokens
of the normalised code, not in whole statements, because a copy that folds ``values.append(d)`` and
``if signed: values.append(-d)`` into one ``values += [d, -d] if signed else [d]`` is still a copy.
"""

from __future__ import annotations

from pathlib import Path

from tests.course.solution_leaks import (MIN_TOKENS, SHARE, body_of, cell_units, leak, leaks, solution_bodies,
                                         tokens)

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((REPO / "solutions").glob("*.ipynb"))
LESSONS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_no_lesson_shows_a_solution_body():
    found = leaks(SOLUTIONS, LESSONS)
    assert not found, ("lessons show workbook solutions (show the idea or the library's result, and leave the "
                       "body to the workbook):\n  " + "\n  ".join(found))


# lesson 05, cell 17, before issue 29: exercise 05.1's body in NumPy float64, renamed and restructured
LESSON_05_TREE_MAP_FLOAT64 = '''def tree_map_float64(signed=True):
    parts = [np.array([0.0, 1.0])]
    for i in range(7):
        grid = np.linspace(0.1, 1.0, (2**i if signed else 2 ** (i + 1)) + 1)  # float64
        d = (grid[:-1] + grid[1:]) / 2 / 10 ** (6 - i)
        parts += [d, -d] if signed else [d]
    return torch.from_numpy(np.sort(np.concatenate(parts))).float()  # rounded to fp32 once, at the end


for signed in (True, False):
    t64 = tree_map_float64(signed)
    differ = (t64 != dynamic_map(signed)).sum().item()
    print(f"signed={signed!s:5s}: {differ} of 256 entries differ when computed in float64 "
          f"(within 2 ulp: {within_ulps(dynamic_map(signed), t64, 2)})")
'''

# lesson 05, cell 13, before issue 29: the same body on a given grid, in NumPy float32
LESSON_05_TREE_MAP_FROM = '''def tree_map_from(linspace, signed=True):
    # the dynamic map built on a given linspace: fp32 midpoints, scaled in fp32 by 10**(i - 6)
    values = [0.0, 1.0]
    for i in range(7):
        grid = np.array(linspace(0.1, 1.0, (2**i if signed else 2 ** (i + 1)) + 1), dtype=np.float32)
        decade = (grid[:-1] + grid[1:]) / np.float32(2) * np.float32(10.0 ** (i - 6))
        values += decade.tolist() + ((-decade).tolist() if signed else [])
    return torch.tensor(sorted(values))
'''

# lesson 05 before issue 13: the same algorithm in torch float64
OLD_LESSON_05 = '''def tree_map_float64(signed=True):
    parts = [torch.tensor([0.0, 1.0], dtype=torch.float64)]
    for i in range(7):
        grid = torch.linspace(0.1, 1.0, (2**i if signed else 2 ** (i + 1)) + 1, dtype=torch.float64)
        d = (grid[:-1] + grid[1:]) / 2 * 10.0 ** (i - 6)
        parts += [d, -d] if signed else [d]
    return torch.sort(torch.cat(parts)).values.float()'''


def _exercise(path_stem: str, name: str):
    path = REPO / "solutions" / f"{path_stem}.ipynb"
    return next(b for b in solution_bodies(path) if b.where.endswith(f":{name}"))


def test_the_detector_flags_lesson_05s_old_float64_map():
    body = _exercise("05_dynamic_map", "dynamic_map_from_scratch")
    assert len(body.tokens) >= MIN_TOKENS
    kinds = [leak(body, u) for u in cell_units(LESSON_05_TREE_MAP_FLOAT64)]
    assert any(k and k.startswith("near") for k in kinds), kinds
    assert any(leak(body, u) for u in cell_units(LESSON_05_TREE_MAP_FROM))
    assert any(leak(body, u) for u in cell_units(OLD_LESSON_05))


def test_the_detector_passes_the_library_call_and_an_idea_in_words():
    body = _exercise("05_dynamic_map", "dynamic_map_from_scratch")
    calls = cell_units("q = dynamic_map(signed=True)\nprint(q[q > 0].min(), q.numel())\n"
                       "t64 = tree_map_from(float64_linspace, signed=True)")
    assert [leak(body, u) for u in calls] == [None]


def test_an_exact_copy_is_flagged_whatever_its_names_comments_and_docstring():
    body = _exercise("04_linear_quantization", "absmax_dequantize")  # a one-line body: compared exactly only
    assert len(body.tokens) < MIN_TOKENS
    renamed = body_of('def back(codes, scale):\n    """Doc."""\n    return codes.float() * (scale / 127)  # c\n')
    assert leak(body, renamed) == "exact"
    assert leak(body, body_of("def back(codes, scale):\n    return codes.float() * (scale / 255)\n")) is None


def test_normalisation_keeps_library_names_and_drops_local_ones():
    a = body_of("def f(x):\n    y = x.amax(1)  # c\n    return torch.sqrt(y)\n")
    b = body_of("def g(t):\n    '''doc'''\n    m = t.amax(1)\n    return np.sqrt(m)\n")
    assert a.code == b.code == "_0 = _1.amax(1)\nreturn LIB.sqrt(_0)"
    assert tokens("x.amax(1)") != tokens("x.amin(1)")
    assert 0 < SHARE < 1
