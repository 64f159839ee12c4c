"""The convergence evidence shipped with the course: load it, tabulate it, plot it (lesson 10).

``bench/convergence.py`` (in the repository) trains each optimizer with the same seeds and
stores one summary per experiment in ``adam8lib/course/results/`` — inside the installed
package, so a pip or Colab install has it too:

* ``convergence_lm`` — a byte-level GPT-2-style LM trained from scratch on the Python
  standard library's source; validation loss (nats per byte);
* ``convergence_cls`` — the lesson's paraphrase fine-tune (synpara, small DistilBERT);
  validation accuracy, F1 and loss;
* ``ablation`` — the LM with linear vs dynamic maps, per-tensor vs blockwise scales, and
  with or without the keep-sign rule (the paper's Table 3, in miniature).

Each optimizer is compared with 32-bit AdamW *per seed* (same initial weights, same data
order): the mean of the per-seed differences and its 95 % Student-t confidence interval.
Loss differences are relative (``(loss - loss_AdamW) / loss_AdamW``), accuracy differences
in percentage points. The noise floor is what the same comparison gives between two runs
that should be equal (AdamW and AdamW with ``fused=True``: the same maths, rounded
differently in a few last bits; AdamW with 2 torch threads instead of 1) and the seed-to-seed
spread. The LM summary also has ``root_cause``: adam8lib's step requantized by
bitsandbytes' CPU quantizer, and with plain nearest rounding, each compared per seed with
both libraries.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

__all__ = ["EXPERIMENTS", "LOSS_TARGET", "load", "rows", "table", "markdown_table", "verdict", "plot"]

#: The stored experiments (file ``results/<name>.json``).
EXPERIMENTS = ("convergence_lm", "convergence_cls", "ablation", "beyond_8_bits")
#: The course's target for the LM: 8-bit's validation loss within ±1 % (relative) of AdamW's,
#: with the whole 95 % confidence interval inside that band.
LOSS_TARGET = 0.01


def load(name: str) -> dict[str, Any] | None:
    """The stored summary of experiment ``name`` (one of :data:`EXPERIMENTS`), or None if absent."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose one of {EXPERIMENTS}")
    path = resources.files("adam8lib.course") / "results" / f"{name}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def _ci(d: dict[str, Any] | None, scale: float, unit: str) -> str:
    if not d:
        return "–"
    return f"{scale * d['mean']:+.2f}{unit} [{scale * d['ci_low']:+.2f}, {scale * d['ci_high']:+.2f}]"


def rows(result: dict[str, Any]) -> list[dict[str, str]]:
    """One row per optimizer: the means over seeds and the paired differences vs AdamW."""
    out = []
    paired = result.get("paired_vs_adamw", {})
    for kind, e in result["optimizers"].items():
        comp = paired.get(kind, {})
        row = {"optimizer": e["label"], "n seeds": str(e["n"])}
        if result["experiment"] == "cls":
            row["accuracy %"] = f"{100 * e['accuracy']['mean']:.1f} ± {100 * e['accuracy']['std']:.1f}"
            row["F1 %"] = f"{100 * e['f1']['mean']:.1f} ± {100 * e['f1']['std']:.1f}"
            row["Δ accuracy vs AdamW, points [95% CI]"] = _ci(comp.get("accuracy"), 100, "")
            row["Δ F1, points [95% CI]"] = _ci(comp.get("f1"), 100, "")
            row["Δ valid loss, % [95% CI]"] = _ci(comp.get("valid_loss"), 100, "")
        else:
            loss = e["valid_loss"]  # mean over the runs that did not diverge
            kept = e["n"] - e["diverged"]
            row["valid loss (nats/byte)"] = ("– (all diverged)" if kept == 0
                                             else f"{loss['mean']:.4f} ± {loss['std']:.4f}"
                                             + (f" ({kept} runs that did not diverge)" if e["diverged"] else ""))
            d = comp.get("valid_loss")
            row["Δ valid loss vs AdamW, % [95% CI]"] = _ci(d, 100, "") + (
                f" (n={d['n']}: diverged seeds left out)" if d and d.get("excluded_diverged") else "")
            row["loss spikes"] = str(sum(e["spikes"]))
            row["diverged"] = f"{e['diverged']}/{e['n']}"
        out.append(row)
    return out


def table(result: dict[str, Any]) -> str:
    """:func:`rows` as aligned plain text."""
    rs = rows(result)
    keys = list(rs[0])
    width = {k: max(len(k), *(len(r[k]) for r in rs)) for k in keys}
    lines = ["  ".join(k.ljust(width[k]) for k in keys)]
    lines += ["  ".join(r[k].ljust(width[k]) for k in keys) for r in rs]
    return "\n".join(lines)


def markdown_table(result: dict[str, Any]) -> str:
    """:func:`rows` as a Markdown table."""
    rs = rows(result)
    keys = list(rs[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(r[k] for k in keys) + " |" for r in rs]
    return "\n".join(lines)


def verdict(result: dict[str, Any]) -> str:
    """What the paired comparisons resolve, one sentence per 8-bit optimizer, from the numbers."""
    lines = []
    cls = result["experiment"] == "cls"
    metric, scale, unit = ("accuracy", 100, " points") if cls else ("valid_loss", 100, " %")
    comps = [(result["optimizers"][k]["label"] + " vs AdamW", c[metric])
             for k, c in result.get("paired_vs_adamw", {}).items() if metric in c]
    if metric in result.get("adam8bit_vs_bnb8bit", {}):
        comps.append(("adam8lib vs bitsandbytes", result["adam8bit_vs_bnb8bit"][metric]))
    for rc in result.get("root_cause", {}).values():  # adam8lib's step with another rounding rule
        if metric in rc.get("vs_bnb8bit", {}):
            comps.append((rc["label"] + " vs bitsandbytes", rc["vs_bnb8bit"][metric]))
    for pair in result.get("pairs", {}).values():  # beyond 8 bits: fixes vs ablations, formats vs anchors
        if metric in pair:
            comps.append((pair["label"], pair[metric]))
    for name, d in comps:
        lo, hi = scale * d["ci_low"], scale * d["ci_high"]
        text = f"{name}: {scale * d['mean']:+.2f}{unit}, 95% CI [{lo:+.2f}, {hi:+.2f}]{unit} (n={d['n']})"
        if d.get("excluded_diverged"):
            text += f" [{d['excluded_diverged']} diverged seeds left out: this interval is of the survivors only]"
        if lo <= 0 <= hi:
            text += "; contains 0: no difference resolved"
        else:
            text += "; excludes 0: a " + ("gain" if (d["mean"] > 0) == cls else "loss") + " resolved"
        if not cls:
            inside = -LOSS_TARGET <= d["ci_low"] and d["ci_high"] <= LOSS_TARGET
            text += f"; {'inside' if inside else 'not inside'} ±{100 * LOSS_TARGET:g} %"
        else:
            text += f"; rules out differences beyond {max(abs(lo), abs(hi)):.1f} points"
        lines.append(text)
    return "\n".join(lines)


def plot(result: dict[str, Any], fig=None):
    """Left: validation loss over training, mean of seeds with its 95 % band (LM runs) or
    accuracy per seed (classification). Right: each optimizer minus AdamW, per-seed paired
    mean with its 95 % CI; the grey band is the noise floor (AdamW vs AdamW with
    ``fused=True``: the same maths, other last bits) where it was measured. Returns the figure."""
    import matplotlib.pyplot as plt

    if fig is None:
        fig = plt.figure(figsize=(11, 3.8 + 0.3 * len(result["optimizers"])))  # room for the legend below
    ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.3, 1]})
    cls = result["experiment"] == "cls"
    kinds = list(result["optimizers"])
    for i, kind in enumerate(kinds):
        e = result["optimizers"][kind]
        if cls:
            acc = [100 * a for a in e["accuracy"]["per_seed"]]
            ax.plot(range(len(acc)), acc, "o-", color=f"C{i}", label=e["label"], alpha=0.8)
        else:
            c = e["curve"]  # from the runs that did not diverge
            label = e["label"] + (f" (diverged {e['diverged']}/{e['n']}: no curve)" if e["diverged"] == e["n"]
                                  else f" (diverged {e['diverged']}/{e['n']}: curve of the other {e['n'] - e['diverged']})"
                                  if e["diverged"] else "")
            ax.plot(c["steps"], c["mean"], color=f"C{i}", label=label)
            ax.fill_between(c["steps"], c["ci_low"], c["ci_high"], color=f"C{i}", alpha=0.2)
    if cls:
        ax.set(xlabel="seed", ylabel="validation accuracy (%)", title="same seeds, every optimizer")
    else:
        ax.set(xlabel="step", ylabel="validation loss (nats/byte)", title="mean of seeds, 95% band")
        last = [result["optimizers"][k]["curve"]["mean"][-1] for k in kinds if result["optimizers"][k]["curve"]["mean"]]
        if last:
            ax.set_ylim(min(last) - 0.1, max(last) + 0.5)
    # below the axes, not over the curves
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.2), ncol=1, frameon=False)
    metric, scale, unit = ("accuracy", 100, "points") if cls else ("valid_loss", 100, "%")
    paired = result.get("paired_vs_adamw", {})
    names = [k for k in kinds if metric in paired.get(k, {})]
    for y, kind in enumerate(names):
        d = paired[kind][metric]
        bx.errorbar(scale * d["mean"], y, xerr=[[scale * (d["mean"] - d["ci_low"])], [scale * (d["ci_high"] - d["mean"])]],
                    fmt="o", color=f"C{kinds.index(kind)}", capsize=5)
    floor = result.get("noise_floor", {}).get("rerun", {}).get(metric)
    if floor:
        bx.axvspan(scale * floor["ci_low"], scale * floor["ci_high"], color="grey", alpha=0.25,
                   label="AdamW vs AdamW fused (noise floor)")
        bx.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    bx.axvline(0, color="k", lw=0.8)
    bx.set_yticks(range(len(names)), [result["optimizers"][k]["label"].replace(" (", "\n(") for k in names], fontsize=8)
    what = "accuracy" if cls else "validation loss"
    bx.set(xlabel=f"{what} minus AdamW's ({unit}), paired, 95% CI", ylim=(-0.7, len(names) - 0.3))
    fig.tight_layout()
    return fig
