"""Count the calls of the registry's fused steps (so that a silent fallback to the reference step cannot pass)."""

from __future__ import annotations

import dataclasses

from adam8lib import kernels
from adam8lib.kernels import registry


def count_fused_calls(monkeypatch, backend: str) -> list[tuple[str, int]]:
    """Wrap every registered fused step of ``backend`` (for this test) to record ``(rule, elements)`` per call."""
    kernels.registered_steps()  # (the optional backends register first)
    calls: list[tuple[str, int]] = []

    def counted(entry):
        def fn(p, g, states, **kwargs):
            calls.append((entry.rule, p.numel()))
            return entry.fn(p, g, states, **kwargs)

        fn.counted_step = entry.fn
        if entry.many is None:
            return dataclasses.replace(entry, fn=fn)

        def many(items, **kwargs):  # the batched form: one record per tensor it steps
            calls.extend((entry.rule, p.numel()) for p, _, _ in items)
            return entry.many(items, **kwargs)

        return dataclasses.replace(entry, fn=fn, many=many)

    monkeypatch.setattr(registry, "_STEPS", [counted(s) if s.backend == backend else s for s in registry._STEPS])
    monkeypatch.setattr(registry, "_VERSION", [registry.version() + 1])  # the registry changed: steps found before
    # (an optimizer remembers what it found, per registry version) are looked up again
    return calls


def unwrapped(fn):
    """The registered step behind a :func:`count_fused_calls` wrapper (``fn`` itself if not wrapped)."""
    return getattr(fn, "counted_step", fn)
