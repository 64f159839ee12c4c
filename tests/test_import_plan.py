"""The import plan of adam8lib (issue 52): no module imports one of a higher floor, and no import circle.

The floors, from the bottom: what a module of a floor may import is its own floor's modules and those below. Every
import counts, those inside functions too (a circle through a deferred import is still a circle: the two modules
cannot be understood, or tested, one without the other). The plan is computed here from the source (``ast``), not
from what happens to be imported at run time. ``adam8lib.course`` is not the library (the library never imports it).
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "adam8lib"

#: The floors, bottom first: a name or a pattern of module names each.
FLOORS = (
    ("numbers", ("adam8lib.ema", "adam8lib.adam", "adam8lib.quant")),
    ("formats, rules and shards", ("adam8lib.formats", "adam8lib.rounding", "adam8lib.rules", "adam8lib.rules.*",
                                   "adam8lib.shards")),
    ("kernels", ("adam8lib.kernels", "adam8lib.kernels.*")),
    ("storage", ("adam8lib.state_layout", "adam8lib.global_blocks", "adam8lib.rank1_chunks", "adam8lib.distributed",
                 "adam8lib.state_checkpoint", "adam8lib.batched_step", "adam8lib.chunked_update")),
    ("the core", ("adam8lib.quantized_state",)),
    ("optimizers", ("adam8lib.optim", "adam8lib.family", "adam8lib.muon", "adam8lib.variants", "adam8lib.stale")),
    ("around an optimizer", ("adam8lib.memory", "adam8lib.memory_tracker", "adam8lib.release",
                             "adam8lib.master_weights", "adam8lib.training")),
    ("the package", ("adam8lib",)),
    ("by name", ("adam8lib.trainer_names",)),
)


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if name == "adam8lib.course" or name.startswith("adam8lib.course."):
            continue
        out[name] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The adam8lib modules ``name`` imports anywhere in its source (``from . import x`` names module ``x``)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            prefix = ".".join(p for p in (base, node.module or "") if p)
            targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix for a in node.names]
        for target in targets:
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                found.add(target)
    return found


def _floor(name: str) -> int:
    for level, (_, patterns) in enumerate(FLOORS):
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return level
    raise AssertionError(f"{name} has no floor in tests/test_import_plan.py's FLOORS: name the floor it belongs to")


def import_plan() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def circles(plan: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle (a strongly connected component of more than one module; Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(plan[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(plan):
        if v not in index:
            visit(v)
    return out


def test_the_plan_sees_the_imports_it_must():
    plan = import_plan()
    assert "adam8lib.quantized_state" in plan and "adam8lib.rules.adamw" in plan
    assert "adam8lib.course.setup" not in plan
    assert {"adam8lib.distributed", "adam8lib.global_blocks"} <= plan["adam8lib.quantized_state"]
    assert "adam8lib.rules.base" in plan["adam8lib.rules.adamw"]
    assert "adam8lib.kernels" in plan["adam8lib.kernels.cpu"]  # (from . import register_backend)
    assert "adam8lib.global_blocks" in plan["adam8lib.distributed"]


def test_no_import_circle():
    found = circles(import_plan())
    assert not found, f"import circles among adam8lib's modules: {found}"


def test_nothing_imports_from_a_higher_floor():
    plan = import_plan()
    upward = [f"{m} ({FLOORS[_floor(m)][0]}) imports {d} ({FLOORS[_floor(d)][0]})"
              for m in sorted(plan) for d in sorted(plan[m]) if _floor(d) > _floor(m)]
    assert not upward, "imports that run back up a floor:\n" + "\n".join(upward)


@pytest.mark.parametrize("plan, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_the_circle_finder_finds_circles(plan, expected):
    assert circles(plan) == expected


def test_the_fp32_adamw_update_lives_with_its_rule():
    """rules/ sits below kernels/: the fp32 AdamW update is the rule's; the reference module names it too (lesson
    07 and the backends import it from there)."""
    from adam8lib.kernels import reference
    from adam8lib.rules import adamw

    assert reference.adam_update_fp32 is adamw.adam_update_fp32
    assert reference.adam_update_fp32_many is adamw.adam_update_fp32_many
    assert reference.bias_corrections is adamw.bias_corrections
    assert adamw.adam_update_fp32.__module__ == "adam8lib.rules.adamw"
