"""What the learner view leaves out of the library: the implementations an exercise asks the learner to write.

The manifest's ``implementations`` (``{exercise: [dotted names]}``, from the ``adam8`` metadata of the solution's
check cells) name, per exercise, the library's and bitsandbytes' own versions of what the learner writes
(``adam8lib.rounding.stochastic_round_to_bf16`` for 12.4). Under bubblewrap the gradebook shows the learner process
each module that defines one as a *withheld copy*: the same file with that definition's lines replaced by a stand-in
of the same name, so the module still imports and everything else in it works, and the definition's code is
nowhere in the learner view (the module's compiled ``__pycache__`` files are shown empty, so Python compiles the
copy). A withheld function is a stand-in that raises; a withheld class keeps its bases and class attributes (other
modules read them at import) and each of its own methods is such a stand-in. Calling one raises
:class:`RuntimeError`::

    adam8lib.rounding.stochastic_round_to_bf16 is not available while grading 12.4: exercise 12.4 asks you to
    write it, so the gradebook's learner view leaves it out

and the gradebook notes every exercise whose result carries that message (:func:`used`).

Only top-level functions and classes can be withheld, and only when the module still imports without them
(:func:`withheld_sources` refuses the others by name); the check process is never shown the copies: its
references are the library's own.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import io
import logging
import re
import sys
import types
import warnings
from pathlib import Path

__all__ = ["MARK", "Withheld", "resolve", "resolved", "withheld_sources", "write_view", "used"]

#: the words of every stand-in's error; :func:`used` finds them in a result
MARK = "is not available while grading"
_USED = re.compile(r"([A-Za-z_][\w.]*) " + re.escape(MARK) + r" (\d\d\.\d+)")


class Withheld(ValueError):
    """A name of the manifest's ``implementations`` that cannot be withheld (not found, not a top-level function or
    class, not in a Python source file)."""


def resolve(dotted: str):
    """The object a dotted name stands for (the longest importable module prefix, then attributes)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = _quietly_imported(".".join(parts[:cut]))
        except Exception:  # noqa: BLE001 - not importable (whatever it raised): try a shorter module name
            continue
        try:
            for attr in parts[cut:]:
                value = getattr(value, attr)
        except AttributeError:
            raise Withheld(f"{dotted}: {'.'.join(parts[:cut])} has no {'.'.join(parts[cut:])}") from None
        return value
    raise Withheld(f"{dotted}: no module of that name imports")


def resolved(dotted: str):
    """:func:`resolve`, or None where the name does not resolve (the guard's references use it too)."""
    try:
        return resolve(dotted)
    except Withheld:
        return None


def _quietly_imported(name: str) -> types.ModuleType:
    """``importlib.import_module(name)`` without the notes a library prints when first imported (bitsandbytes
    logs its optional kernels): the gradebook's output is the instructor's."""
    if name in sys.modules:
        return sys.modules[name]
    previous = logging.root.manager.disable
    logging.disable(max(previous, logging.WARNING))
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    finally:
        logging.disable(previous)


def _definition(dotted: str, value) -> tuple[Path, str]:
    """The source file and the top-level name of ``dotted``'s definition, ``value`` (re-exports followed to it)."""
    if not isinstance(value, (types.FunctionType, type)):
        raise Withheld(f"{dotted}: only functions and classes can be withheld, not {type(value).__name__}")
    home, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
    if not home or "." in qualname or "<" in qualname:
        raise Withheld(f"{dotted}: only top-level definitions can be withheld ({home}.{qualname})")
    try:
        path = Path(inspect.getsourcefile(sys.modules[home]) or "")
    except (KeyError, TypeError):
        path = Path()
    if path.suffix != ".py" or not path.is_file():
        raise Withheld(f"{dotted}: its module {home} has no Python source file to withhold it from")
    return path.resolve(), qualname


def _raising(name: str, message: str, decorators: list) -> ast.FunctionDef:
    """``def name(*args, **kwargs): raise RuntimeError(message)`` (an ``__init__`` does nothing instead)."""
    body = ([ast.Pass()] if name == "__init__" else
            [ast.Raise(exc=ast.Call(func=ast.Name("RuntimeError", ast.Load()), args=[ast.Constant(message)],
                                    keywords=[]), cause=None)])
    args = ast.arguments(posonlyargs=[], args=[], vararg=ast.arg("args"), kwonlyargs=[], kw_defaults=[],
                         kwarg=ast.arg("kwargs"), defaults=[])
    extra = {"type_params": []} if "type_params" in ast.FunctionDef._fields else {}
    return ast.FunctionDef(name=name, args=args, body=body, decorator_list=decorators, returns=None, **extra)


def _stand_in(node: ast.stmt, message: str) -> list[str]:
    """The lines that replace a top-level definition: a function raises ``message``; a class keeps its bases,
    decorators and declarations (its class attributes: other modules read them at import) and each of its own
    methods raises (its ``__init__`` accepts anything and does nothing)."""
    if isinstance(node, ast.ClassDef):
        def methods(cls: ast.ClassDef) -> ast.ClassDef:
            body = []
            for stmt in cls.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    body.append(_raising(stmt.name, message, stmt.decorator_list))
                elif isinstance(stmt, ast.ClassDef):
                    body.append(methods(stmt))
                else:
                    body.append(stmt)
            extra = {"type_params": cls.type_params} if "type_params" in ast.ClassDef._fields else {}
            return ast.ClassDef(name=cls.name, bases=cls.bases, keywords=cls.keywords, body=body or [ast.Pass()],
                                decorator_list=cls.decorator_list, **extra)
        new = methods(node)
    else:
        new = _raising(node.name, message, [])
    return ast.unparse(ast.fix_missing_locations(ast.Module(body=[new], type_ignores=[]))).splitlines()


def withheld_sources(implementations: dict[str, list[str]], keep: list[str] = ()) -> dict[Path, str]:
    """``{source file: its withheld copy's text}`` for ``implementations`` ({exercise label: [dotted names]}),
    leaving out the names in ``keep`` (the solution's ``library_imports``: it uses them). :class:`Withheld` for a
    name that cannot be withheld."""
    kept = {id(value) for value in map(resolved, keep) if value is not None}
    asked: dict[str, tuple[object, list[str]]] = {}
    for exercise, names in sorted(implementations.items()):
        for dotted in names:
            value = asked[dotted][0] if dotted in asked else resolve(dotted)
            if id(value) not in kept:
                asked.setdefault(dotted, (value, []))[1].append(exercise)
    by_file: dict[Path, dict[str, str]] = {}
    for dotted, (value, exercises) in asked.items():
        path, name = _definition(dotted, value)
        which = (f"exercise {exercises[0]} asks" if len(exercises) == 1
                 else f"exercises {', '.join(exercises[:-1])} and {exercises[-1]} ask")
        message = f"{dotted} {MARK} {exercises[0]}: {which} you to write it, so the gradebook's learner view leaves it out"
        by_file.setdefault(path, {}).setdefault(name, message)
    out = {}
    for path, names in by_file.items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        spans = []
        for node in ast.parse(text).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in names:
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                spans.append((start, node.end_lineno, node.name, _stand_in(node, names[node.name])))
        missing = set(names) - {span[2] for span in spans}
        if missing:
            raise Withheld(f"{', '.join(sorted(missing))}: not defined at the top level of {path}")
        for start, end, _, stand_in in sorted(spans, reverse=True):
            lines[start - 1:end] = stand_in
        out[path] = "\n".join(lines) + "\n"
    return out


def write_view(implementations: dict[str, list[str]], keep: list[str], folder: Path) -> list[tuple[Path, Path]]:
    """Write the withheld copies into ``folder`` (outside the learner view) and return what the sandbox binds:
    ``(the copy, the original file)`` for each module, and ``(an empty file, a compiled file)`` for each of its
    ``__pycache__`` files, so that no compiled form of a withheld definition is shown either."""
    folder.mkdir(parents=True, exist_ok=True)
    empty = folder / "empty"
    empty.write_bytes(b"")
    pairs = []
    for path, text in sorted(withheld_sources(implementations, keep).items()):
        copy = folder / f"{hashlib.sha256(str(path).encode()).hexdigest()[:16]}-{path.name}"
        copy.write_text(text, encoding="utf-8")
        pairs.append((copy, path))
        pairs += [(empty, compiled) for compiled in _compiled(path)]
    return pairs


def _compiled(path: Path) -> list[Path]:
    """The compiled forms of ``path`` there are: in its ``__pycache__`` (any interpreter, any optimization level) and
    where this interpreter's ``sys.pycache_prefix`` puts them."""
    found = set((path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"))
    for level in ("", 1, 2):
        try:
            found.add(Path(importlib.util.cache_from_source(str(path), optimization=level)))
        except (NotImplementedError, ValueError):
            pass
    return sorted(p for p in found if p.is_file())


def used(text: str) -> list[tuple[str, str]]:
    """``(dotted name, exercise)`` of each withheld implementation whose stand-in ``text`` (a result's detail or
    error, a cell's error) reports was called."""
    return list(dict.fromkeys(_USED.findall(text or "")))
