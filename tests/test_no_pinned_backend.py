"""No lesson, workbook or library default pins a device-specific backend for training.

An optimizer built with ``backend="cpu"`` before ``model.to("cuda")`` (as the Hugging Face
``Trainer`` does) fails at its first step on the GPU. ``backend="auto"`` chooses per device at
each step, so that is the only default; ``"torch"`` (the reference, any device) and ``"triton"``
(lesson 08's demonstration) may be named explicitly, ``"cpu"`` may not. The helper that used to
return ``"cpu"`` (``default_backend``) must not come back.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for folder in ("notebooks", "solutions", "exercises") for p in (ROOT / folder).glob("*.ipynb"))
LIBRARY = sorted((ROOT / "adam8lib").rglob("*.py"))
PINNED = re.compile(r"""backend\s*=\s*(?:T\.|training\.)?(?:["']cpu["']|default_backend)""")


def code_of(path: Path) -> str:
    return "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.relative_to(ROOT).as_posix() for p in NOTEBOOKS])
def test_notebook_code_does_not_pin_the_cpu_backend(path):
    code = code_of(path)
    assert not PINNED.search(code), f"{path.name}: {PINNED.search(code).group(0)!r}; use the default backend='auto'"
    assert "default_backend" not in code, f"{path.name} uses default_backend (removed: it pinned 'cpu')"


def _backend_defaults(tree: ast.AST):
    """(function, default) for every parameter named ``backend`` that has a default."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            for arg, default in pairs:
                if arg.arg == "backend":
                    yield node.name, default


def _backend_keywords(tree: ast.AST):
    """Every ``backend=<constant>`` keyword in a call."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "backend" and isinstance(kw.value, ast.Constant):
                    yield kw.value.value


@pytest.mark.parametrize("path", LIBRARY, ids=[p.relative_to(ROOT).as_posix() for p in LIBRARY])
def test_library_defaults_choose_the_backend_per_device(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for name, default in _backend_defaults(tree):
        assert isinstance(default, ast.Constant) and default.value == "auto", (
            f"{path.name}: {name}(backend=...) defaults to {ast.unparse(default)}, not 'auto'"
        )
    assert "cpu" not in set(_backend_keywords(tree)), f"{path.name} calls something with backend='cpu'"
    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert "default_backend" not in names, f"{path.name} defines default_backend again"


def test_the_checks_can_see_a_pinned_backend():
    """The patterns catch what lesson 10 used to do, in its spellings."""
    for bad in ('Adam8bit(groups, lr=1e-3, backend="cpu")', "make_optimizer(m, backend='cpu')",
                'Adam8bit(ps, backend=T.default_backend("cpu"))'):
        assert PINNED.search(bad), bad
    assert not PINNED.search('Adam8bit(ps, backend="torch")') and not PINNED.search('Adam8bit(ps, backend="auto")')
    tree = ast.parse('def f(x, backend="cpu"):\n    g(backend="cpu")\ndef default_backend(d): ...')
    assert [ast.unparse(d) for _, d in _backend_defaults(tree)] == ["'cpu'"]
    assert list(_backend_keywords(tree)) == ["cpu"]
