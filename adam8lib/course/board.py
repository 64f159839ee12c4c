"""The bytes-vs-loss board shipped with the course (lesson 13): load it, tabulate it, plot it.

``python -m bench.board`` (in the repository) trains every update rule with fp32, 8-bit, 4-bit and FP8
states, and bitsandbytes' / torchao's classes as anchors, on the course's byte-level LM with paired
seeds; ``python -m bench.board --report`` writes the summary to ``bench/results/board.json`` and a
compact copy (what this module reads) to ``adam8lib/course/results/board.json``, inside the package,
so a pip or Colab install has it too.

Each point: state bytes per parameter (measured from the LM's allocated states) and the mean of the
per-seed relative differences of the final validation loss against fp32 AdamW on the same seed, with
its 95 % Student-t interval. The Pareto front: the points that no other point beats on both axes
(fewer bytes and a lower mean Δ).
"""

from __future__ import annotations

import json
import math
from importlib import resources
from typing import Any

__all__ = ["COLORS", "MARKERS", "compact", "delta_text", "load", "order_key", "paired_table", "row", "table", "plot"]

#: One colour per update rule, one marker per library.
COLORS = {"adamw": "#1f77b4", "lion": "#d62728", "ademamix": "#2ca02c", "rmsprop": "#9467bd", "muon": "#ff7f0e",
          "adan": "#8c564b", "custom": "#7f7f7f"}
MARKERS = {"torch": "*", "adam8lib": "o", "bitsandbytes": "s", "torchao": "^", "custom": "D"}
#: What the compact copy keeps of each row.
ROW_KEYS = ("key", "label", "rule", "state_format", "library", "lr", "n", "n_wanted", "diverged", "bytes_per_param",
            "large_tensors_bytes_per_param", "pareto")

#: What it keeps of each paired within-rule comparison (a format against its rule's fp32 row, seed by seed).
WITHIN_KEYS = ("key", "versus", "mean", "ci_low", "ci_high", "std", "n")


def compact(result: dict[str, Any], rule_labels: dict[str, str]) -> dict[str, Any]:
    """The part of a full board summary that the lesson shows (no per-run paths or environments)."""
    rows = []
    for e in result["rows"]:
        row = {k: e[k] for k in ROW_KEYS}
        d = e.get("delta_pct")
        row["delta_pct"] = None if d is None else {k: d[k] for k in ("mean", "ci_low", "ci_high", "std", "n")}
        rows.append(row)
    desc = result["description"]
    return {"parameters": desc["parameters"], "steps": desc["config"]["steps"], "seeds": list(result["seeds"]),
            "rule_labels": dict(rule_labels), "lrs": {r: s["used_lr"] for r, s in result["sweep"].items() if s},
            "noise_floor": result.get("noise_floor", {}), "rows": rows,
            "within_rule": [{k: w[k] for k in WITHIN_KEYS} for w in result.get("within_rule", [])]}


def load() -> dict[str, Any] | None:
    """The packaged compact board, or None if this install has none."""
    path = resources.files("adam8lib.course") / "results" / "board.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def row(board: dict[str, Any], key: str) -> dict[str, Any]:
    """The row ``key`` (e.g. ``"lion-8bit"``, ``"bnb-adamw8bit"``); KeyError naming the keys there are."""
    for e in board["rows"]:
        if e["key"] == key:
            return e
    raise KeyError(f"no row {key!r} on the board; it has {', '.join(e['key'] for e in board['rows'])}")


def order_key(e: dict[str, Any], rules: list[str]) -> tuple:
    """Sort key of a row: by rule (in ``rules``' order, others after), then most bytes first, then key."""
    return (rules.index(e["rule"]) if e["rule"] in rules else len(rules), -e["bytes_per_param"], e["key"])


def delta_text(e: dict[str, Any], minus: str = "-", baseline: str = "0 (the baseline)") -> str:
    """A row's Δ as "mean % [low, high]" (``minus``: the sign character, e.g. "−" for the README)."""
    d = e.get("delta_pct")
    if e["key"] == "adamw":
        return baseline
    if d is None:
        return "–"
    return f"{d['mean']:+.2f} % [{d['ci_low']:+.2f}, {d['ci_high']:+.2f}]".replace("-", minus)


def table(board: dict[str, Any]) -> str:
    """One line per row, in rule order: state bytes per parameter, Δ [95 % CI], seeds, Pareto."""
    rules = list(board["rule_labels"])
    lines = [f"{'rule':9s} {'optimizer (states)':46s} {'bytes/param':>11s}  {'Δ valid loss vs fp32 AdamW [95 % CI]':38s}"
             f" seeds  front"]
    for e in sorted(board["rows"], key=lambda e: order_key(e, rules)):
        lines.append(f"{board['rule_labels'].get(e['rule'], e['rule']):9s} {e['label'][:46]:46s} "
                     f"{e['bytes_per_param']:11.2f}  {delta_text(e):38s} {e['n']:5d}  {'yes' if e['pareto'] else ''}".rstrip())
    return "\n".join(lines)


def paired_table(board: dict[str, Any]) -> str:
    """The paired within-rule comparisons (each format against its own rule's fp32 row, seed by seed): one line
    each, Δ [95 % CI] and the seeds."""
    head = "Δ valid loss vs the rule's fp32 row, paired [95 % CI]"
    lines = [f"{'row':18s} {'against':14s} {head:54s} seeds"]
    for w in board.get("within_rule", []):
        lines.append(f"{w['key']:18s} {w['versus']:14s} "
                     f"{w['mean']:+.2f} % [{w['ci_low']:+.2f}, {w['ci_high']:+.2f}]".ljust(89) + f"{w['n']:5d}")
    return "\n".join(lines)


def _stack(desired: list[float], line: float) -> list[float]:
    """Bottoms of names stacked in the order given (top first): the lowest stays where it is wanted, each name above
    it as near its wanted bottom as it can be without overlapping the one below (moved up only), so the names
    keep the vertical order of their points and none moves below its own."""
    out = list(desired)
    for k in range(len(out) - 2, -1, -1):
        out[k] = max(out[k], out[k + 1] + line)
    return out


def _place_labels(ax, labels: list[tuple[float, float, str]], fontsize: float = 7) -> None:
    """Write each point's name just above its marker's right (above the Pareto staircase, which runs right from
    its points). Points at the same x (a column: one rule's formats, or an anchor and the row it matches) get their
    names stacked in the order of the points, the lowest beside its marker and each other one moved up only as far
    as the names' height needs, so a name never sits beside a neighbour's marker out of order; a name that would
    cover another point's marker or an earlier name is then moved up or down. A name moved more than about half a line
    gets a thin leader line from its lower left corner, left of the names stacked below it.
    Positions are worked out in points on the axes' final scale."""
    ax.autoscale_view()
    to_points = 72.0 / ax.figure.dpi
    line = 1.25 * fontsize  # the height one name takes
    anchors = [tuple(v * to_points for v in ax.transData.transform((x, y))) for x, y, _ in labels]
    order = sorted(range(len(labels)), key=lambda i: (anchors[i][0], -anchors[i][1]))
    columns: list[list[int]] = []
    for i in order:  # points less than 3 points apart in x share a column
        if columns and anchors[i][0] - anchors[columns[-1][0]][0] < 3:
            columns[-1].append(i)
        else:
            columns.append([i])
    wanted: dict[int, float] = {}
    for col in columns:
        col.sort(key=lambda i: -anchors[i][1])
        for i, y0 in zip(col, _stack([anchors[i][1] + 1 for i in col], line)):
            wanted[i] = y0
    boxes: list[tuple[float, float, float, float]] = []  # x0, x1, y0, y1 of the names placed so far
    for i in sorted(range(len(labels)), key=lambda i: -anchors[i][1]):
        (x, y, name), (px, py) = labels[i], anchors[i]
        width = 0.55 * fontsize * len(name)
        x0, x1 = px + 6, px + 6 + width
        for shift in [0] + [s * k * line for k in range(1, 12) for s in (1, -1)]:
            y0 = wanted[i] + shift
            y1 = y0 + line
            clear = all(x1 <= b0 or x0 >= b1 or y1 <= c0 or y0 >= c1 for b0, b1, c0, c1 in boxes)
            clear = clear and all(not (x0 - 4 <= qx <= x1 and y0 - 3 <= qy <= y1 + 3)
                                  for k, (qx, qy) in enumerate(anchors) if k != i)
            if clear:
                break
        boxes.append((x0, x1, y0, y1))
        beside = abs(y0 - (py + 1)) <= 0.6 * line  # the name sits just above its marker's right, as if unmoved
        arrow = None if beside else dict(arrowstyle="-", color="0.5", lw=0.5, shrinkA=0, shrinkB=3, relpos=(0, 0))
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(6, y0 - py), fontsize=fontsize, va="bottom",
                    arrowprops=arrow)


def plot(board: dict[str, Any], ax=None):
    """State bytes per parameter (x, log 2) vs Δ validation loss (y) with the 95 % intervals and the Pareto
    front; returns the figure."""
    import matplotlib
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    if ax is None:
        fig, ax = plt.subplots(figsize=(9.5, 6))
    fig = ax.figure
    ax.axhline(0.0, color="0.6", lw=0.8, zorder=0)
    pts = [e for e in board["rows"] if e.get("delta_pct") is not None or e["key"] == "adamw"]
    labels_to_place: list[tuple[float, float, str]] = []
    for e in pts:
        d = e.get("delta_pct")
        y = 0.0 if d is None else d["mean"]
        lo, hi = (0.0, 0.0) if d is None else (y - d["ci_low"], d["ci_high"] - y)
        color, marker = COLORS.get(e["rule"], "#7f7f7f"), MARKERS.get(e["library"], "o")
        face = color if e["library"] in ("adam8lib", "torch", "custom") else "white"
        ax.errorbar(e["bytes_per_param"], y, yerr=[[lo], [hi]], fmt=marker, color=color, mfc=face,
                    ms=8 if marker != "*" else 13, capsize=3, lw=1.2, zorder=3)
        name = e["key"].replace("bnb-", "bnb ").replace("torchao-", "ao ")
        if e["n"] < e["n_wanted"]:
            name += f" (n={e['n']})"
        labels_to_place.append((e["bytes_per_param"], y, name))
    xs: list[float] = []
    ys: list[float] = []
    for e in sorted((e for e in pts if e["pareto"]), key=lambda e: e["bytes_per_param"]):
        y = 0.0 if e.get("delta_pct") is None else e["delta_pct"]["mean"]
        if xs:  # a staircase: flat until the next point of the front
            xs.append(e["bytes_per_param"])
            ys.append(ys[-1])
        xs.append(e["bytes_per_param"])
        ys.append(y)
    if xs:
        ax.plot(xs, ys, color="k", lw=1, ls="--", zorder=2)
    ax.set_xscale("log", base=2)
    ax.set_xticks([0.5, 1, 2, 4, 8, 16])
    widest = [e["bytes_per_param"] for e in pts]
    ax.set_xlim(min(widest) / 1.25, max(widest) * 1.9)  # room right of the last point for its name
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("optimizer state, bytes per parameter (measured on the LM's allocated states)")
    ax.set_ylabel("Δ final validation loss vs fp32 AdamW, % (mean, 95 % CI)")
    ax.set_title(f"Bytes vs loss: {board['parameters']:,}-parameter byte-level LM, {board['steps']} steps, "
                 f"{len(board['seeds'])} paired seeds", fontsize=10)
    labels = board["rule_labels"]
    handles = [Line2D([], [], color=c, marker="o", ls="", label=labels.get(r, r)) for r, c in COLORS.items()
               if any(e["rule"] == r for e in pts)]
    handles += [Line2D([], [], color="k", marker=m, mfc="white" if lib in ("bitsandbytes", "torchao") else "k",
                       ls="", label=lib) for lib, m in MARKERS.items() if any(e["library"] == lib for e in pts)]
    handles += [Line2D([], [], color="k", ls="--", label="Pareto front (fewer bytes, lower mean Δ)")]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _place_labels(ax, labels_to_place)  # on the final layout: the names are placed in points
    return fig
