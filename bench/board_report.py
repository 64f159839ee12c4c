"""The board's table, its picture and its README sections, from ``bench/results/board.json``.

``python -m bench.board --report`` calls these (no runs). The picture: state bytes per parameter (x,
measured) vs mean Δ validation loss against fp32 AdamW (y) with the 95 % intervals as bars, the Pareto
front (no other point has fewer bytes and a lower mean Δ) drawn as a staircase.
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from typing import Any

import board_rows as R
import stats

from adam8lib.course import board as course_board

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
START, END = "<!-- board:start -->", "<!-- board:end -->"
COMMAND = "python -m bench.board"


def _delta(e: dict[str, Any]) -> str:
    return course_board.delta_text(e, minus="−", baseline="0 (baseline)")


def _seeds(e: dict[str, Any]) -> str:
    text = f"{e['n']}"
    return text if e["n"] == e["n_wanted"] else f"{text} of {e['n_wanted']} (incomplete)"


def _order(e: dict[str, Any]) -> tuple:
    return course_board.order_key(e, list(R.RULES) + ["custom"])


def table(result: dict[str, Any], full: bool = True) -> str:
    head = ("| rule | optimizer (states) | lr | state bytes/param | of it, tensors ≥ 4096 | "
            "Δ valid loss vs fp32 AdamW [95 % CI] | seeds | diverged | Pareto |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    if not full:
        lines = ["| rule | optimizer (states) | bytes/param | Δ valid loss vs fp32 AdamW [95 % CI] | seeds |",
                 "|---|---|---|---|---|"]
    for e in sorted(result["rows"], key=_order):
        rule = R.RULE_LABELS.get(e["rule"], e["rule"])
        if full:
            lines.append(f"| {rule} | {e['label']} | {e['lr']:g} | {e['bytes_per_param']:.3f} | "
                         f"{e['large_tensors_bytes_per_param']:.3f} | {_delta(e)} | {_seeds(e)} | "
                         f"{e['diverged']}/{e['n']} | {'yes' if e['pareto'] else ''} |")
        else:
            lines.append(f"| {rule} | {e['label']} | {e['bytes_per_param']:.2f} | {_delta(e)} | {_seeds(e)} |")
    return "\n".join(lines)


def within_rule_table(result: dict[str, Any]) -> str:
    """The paired within-rule comparisons as a Markdown table."""
    lines = ["| row | against | Δ valid loss vs the rule's fp32 row, paired [95 % CI] | seeds |", "|---|---|---|---|"]
    for w in result.get("within_rule") or within_rule(result):
        d = f"{w['mean']:+.2f} % [{w['ci_low']:+.2f}, {w['ci_high']:+.2f}]".replace("-", "−")
        lines.append(f"| {w['key']} | {w['versus']} | {d} | {w['n']} |")
    return "\n".join(lines)


def sweep_table(result: dict[str, Any]) -> str:
    lines = ["| rule | lr | valid loss, seed 100 | seed 101 | mean | chosen |", "|---|---|---|---|---|---|"]
    for rule, s in result.get("sweep", {}).items():
        if not s:
            lines.append(f"| {R.RULE_LABELS[rule]} | (not run yet) | | | | |")
            continue
        for e in s["lrs"]:
            chosen = ""
            if e["lr"] == s["used_lr"]:
                chosen = "**used**" + (" (edge of the grid)" if s["best_at_edge"] else "")
            if rule == "adamw" and e["lr"] == s["best_lr"]:
                chosen = (chosen + "; " if chosen else "") + "sweep's best"
            mean = "diverged" if e["diverged"] else f"{e['mean']:.4f}"
            losses = " | ".join(f"{v:.4f}" for v in e["valid_loss"])
            lines.append(f"| {R.RULE_LABELS[rule]} | {e['lr']:g} | {losses} | {mean} | {chosen} |")
    return "\n".join(lines)


def resolution(result: dict[str, Any]) -> str:
    """What the intervals can and cannot resolve, in numbers from the result."""
    rows = [e for e in result["rows"] if e.get("delta_pct")]
    n = len(rows)
    half = [0.5 * (e["delta_pct"]["ci_high"] - e["delta_pct"]["ci_low"]) for e in rows]
    sd = [e["delta_pct"]["std"] for e in rows]
    nf = result.get("noise_floor", {})
    parts = []
    if "seed_to_seed_relative_std_pct" in nf:
        parts.append(f"fp32 AdamW's final loss varies by {nf['seed_to_seed_relative_std_pct']:.2f} % (sd) from seed to "
                     f"seed; pairing by seed removes most of that")
    if half:
        adamw = [h for h, e in zip(half, rows) if e["rule"] == "adamw"]
        other = [h for h, e in zip(half, rows) if e["rule"] != "adamw"]
        groups = ""
        if adamw and other:
            groups = (f": {min(adamw):.2f}–{max(adamw):.2f} % for AdamW's rows, {min(other):.2f}–{max(other):.2f} % for "
                      f"the other rules'")
        parts.append(f"the paired differences have an sd of {min(sd):.2f}–{max(sd):.2f} % over seeds, so the 95 % "
                     f"half-widths are {min(half):.2f}–{max(half):.2f} % (median {statistics.median(half):.2f} %)"
                     f"{groups}: a row's difference from AdamW smaller than its half-width is not resolved")
    if "threads" in nf:
        t = nf["threads"]
        parts.append(f"the machine's own floor is far below that: {t['label']} moves the loss by at most "
                     f"{t['max_abs_pct']:.4f} % (n = {t['n']})")
    text = "; ".join(parts) + "." if parts else ""
    if half:
        text += (" Two rows are not compared by whether their intervals overlap (that would need a difference of about "
                 "the sum of their half-widths): every row runs on the same seeds, so a format is compared with its "
                 "rule's fp32 row seed by seed (paired, below).")
    if n:
        hits = result.get("excluding_zero", [])
        text += (f" With {n} comparisons at 95 %, about {n / 20:.1f} would exclude 0 by chance alone even if no "
                 f"optimizer differed from AdamW; {len(hits)} do here")
        text += (f" ({', '.join(hits)})." if hits else ".")
        by = {e["key"]: e for e in rows}
        strong = [k for k in hits if _excludes_zero_at(by[k], 0.99)]
        marginal = [k for k in hits if k not in strong]
        df = max(e["delta_pct"].get("n", e["n"]) for e in rows) - 1
        if strong:
            text += (f" Still excluding 0 at 99 % (|t| above {_t_quantile(0.995, df):.2f} with {df} degrees of freedom; "
                     f"~{n / 100:.2f} such hits expected by chance): {', '.join(strong)}: real differences.")
        if marginal:
            text += (f" Excluding 0 at 95 % only: {', '.join(marginal)}: with ~{n / 20:.1f} such hits expected by chance,"
                     f" one of these alone is weak evidence (the LM benchmark's own write-up discusses bitsandbytes' "
                     f"−0.23 %).")
        text += (" The Pareto front is drawn through the means, so its order among points whose difference is not "
                 "resolved is not a ranking.")
    return text


def within_rule(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each row against its own rule's fp32 row, seed by seed: every row runs on the same seeds (same init, same
    batches), so a format's effect is the mean of the per-seed relative differences of the final validation loss,
    100 · (loss − fp32 row's loss) / fp32 row's loss, with its 95 % Student-t interval — much tighter than comparing
    the two rows' intervals against AdamW by overlap. Seeds: those where neither row nor fp32 AdamW diverged (the
    seeds of each row's own Δ). AdamW's rows are left out (their Δ against fp32 AdamW is already this), and rules
    with no fp32 row (a custom optimizer)."""
    by = {e["key"]: e for e in result["rows"]}
    out = []
    for e in sorted(result["rows"], key=_order):
        base = by.get(f"{e['rule']}-fp32")
        if e["rule"] == "adamw" or base is None or base is e or not e.get("delta_pct") or not base.get("delta_pct"):
            continue
        seeds = [s for s in e["delta_pct"]["seeds"] if s in base["delta_pct"]["seeds"]]
        if len(seeds) < 2:
            continue
        loss = {k: dict(zip(by[k]["seeds"], by[k]["valid_loss"])) for k in (e["key"], base["key"])}
        p = stats.paired([loss[base["key"]][s] for s in seeds], [loss[e["key"]][s] for s in seeds], relative=True)
        out.append({"key": e["key"], "versus": base["key"], "mean": 100 * p["mean"], "ci_low": 100 * p["ci_low"],
                    "ci_high": 100 * p["ci_high"], "std": 100 * p["std"], "n": p["n"], "seeds": seeds})
    return out


def within_rule_text(result: dict[str, Any]) -> str:
    """What the paired within-rule comparisons (:func:`within_rule`) resolve, with the chance caveat."""
    pairs = result.get("within_rule") or within_rule(result)
    if not pairs:
        return ""
    n = len(pairs)
    df = max(w["n"] for w in pairs) - 1
    half = [0.5 * (w["ci_high"] - w["ci_low"]) for w in pairs]

    def shown(w):
        return f"{w['key']} " + f"{w['mean']:+.2f} % [{w['ci_low']:+.2f}, {w['ci_high']:+.2f}]".replace("-", "−")

    keys = {w["key"] for w in pairs}
    vs_adamw = [0.5 * (e["delta_pct"]["ci_high"] - e["delta_pct"]["ci_low"]) for e in result["rows"]
                if e["key"] in keys and e.get("delta_pct")]
    hits = [w for w in pairs if w["ci_low"] > 0 or w["ci_high"] < 0]
    rest = [w for w in pairs if w not in hits]
    text = (f"Formats within a rule, paired by seed: each row against its own rule's fp32 row on the same seeds "
            f"(mean of per-seed (loss − fp32 row's loss) / fp32 row's loss, 95 % interval; half-widths "
            f"{min(half):.2f}–{max(half):.2f} %"
            + (f", against {min(vs_adamw):.2f}–{max(vs_adamw):.2f} % for the same rows' Δ vs AdamW" if vs_adamw else "")
            + "). ")
    if hits:
        text += "Resolved: " + "; ".join(map(shown, hits)) + ". "
    if rest:
        text += f"Not resolved ({len(rest)}): " + "; ".join(map(shown, rest)) + ". "
    strong = [w["key"] for w in hits if _excludes_zero_at({"delta_pct": w, "n": w["n"]}, 0.99)]
    text += (f"With {n} such comparisons at 95 %, about {n / 20:.1f} would exclude 0 by chance alone even if no format "
             f"mattered; {len(hits)} do")
    if hits:
        text += (f": still excluding 0 at 99 % (|t| above {_t_quantile(0.995, df):.2f}): "
                 f"{', '.join(strong) if strong else 'none'}; the others are weak evidence one by one.")
    else:
        text += "."
    return text


def _t_quantile(q: float, df: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(q, df))


def _excludes_zero_at(row: dict[str, Any], level: float) -> bool:
    """Whether the Student-t interval at ``level`` around the row's mean paired difference excludes 0."""
    delta = row["delta_pct"]
    n = delta.get("n", row["n"])
    half = _t_quantile(0.5 + level / 2, n - 1) * delta["std"] / math.sqrt(n)
    return abs(delta["mean"]) > half


def small_tensors(result: dict[str, Any]) -> str:
    rows = [e for e in result["rows"] if e["key"] in ("adamw", "adamw-8bit", "lion-8bit", "adamw-4bit")]
    if not rows:
        return ""
    e0 = rows[0]
    frac = e0["small_tensor_parameters"] / e0["parameters"]
    by = {e["key"]: e for e in rows}
    bits = [f"{by[k]['label']}: {by[k]['bytes_per_param']:.3f} over all parameters vs "
            f"{by[k]['large_tensors_bytes_per_param']:.3f} over the large tensors" for k in
            ("adamw-8bit", "adamw-4bit", "lion-8bit") if k in by]
    return (f"The LM's tensors under 4,096 elements (biases and norm weights: {e0['small_tensor_parameters']:,} of "
            f"{e0['parameters']:,} parameters, {100 * frac:.1f} %) keep fp32 states in every library here "
            f"(min_8bit_size), so they lift each low-bit point a little to the right: " + "; ".join(bits) +
            ". The large-tensor figure is what a model whose parameters are nearly all in large matrices would show.")


def plot(result: dict[str, Any], path: Path) -> None:
    """The picture, drawn by the course's own plot (adam8lib.course.board) from the compact summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = course_board.plot(course_board.compact(result, R.RULE_LABELS))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine(result: dict[str, Any]) -> str:
    """The machines the stored runs ran on (a row reused from the LM benchmark may come from another one)."""
    env = result.get("environment", {})
    cpus: dict[str, int] = {}
    libs: dict[str, set] = {"torch": set(), "bitsandbytes": set(), "torchao": set()}
    for e in result.get("rows", []):
        for r in e.get("run_environments", []):
            cpus[r["cpu"] or "machine not recorded"] = cpus.get(r["cpu"] or "machine not recorded", 0) + r["runs"]
            for lib in libs:
                if r.get(lib):
                    libs[lib].add(r[lib])
    if not cpus:
        cpus = {env.get("cpu", "unknown CPU"): 0}
    where = "; ".join(f"{c} ({n} runs)" if n else c for c, n in sorted(cpus.items(), key=lambda kv: -kv[1]))
    versions = ", ".join(f"{lib} {'/'.join(sorted(v)) or env.get(lib)}" for lib, v in libs.items())
    return (f"{where}; {env.get('cores', '?')} cores shared with other jobs, one torch thread per run; "
            f"Python {env.get('python')}, {versions}")


def _replace_block(text: str, block: str, before: str) -> str:
    if START in text and END in text:
        return re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    if before in text:
        i = text.index(before)
        return text[:i] + block + "\n\n" + text[i:]
    return text.rstrip() + "\n\n" + block + "\n"


def not_run(result: dict[str, Any]) -> str:
    """The board's rows with no run yet, or with fewer seeds than wanted (said, never hidden)."""
    have = {e["key"]: e for e in result["rows"]}
    missing = [k for k in R.ROWS if k not in have]
    short = [f"{k} ({have[k]['n']} of {have[k]['n_wanted']} seeds)" for k in R.ROWS
             if k in have and have[k]["n"] < have[k]["n_wanted"]]
    parts = []
    if missing:
        parts.append("Not run yet: " + ", ".join(missing) + ".")
    if short:
        parts.append("Incomplete: " + ", ".join(short) + ".")
    if parts:
        parts.append(f"`{COMMAND}` resumes them (stored runs are skipped).")
    return " ".join(parts)


def _fewer_formats() -> str:
    """The rules whose rows cover only some of the state formats (e.g. Adan: fp32 and 8-bit), said in the text."""
    shown = {"fp32": "fp32", "8bit": "8-bit", "4bit": "4-bit", "fp8": "FP8"}
    fewer = []
    for rule in R.RULES:
        fmts = [f for f in R.FORMATS if any(r.rule == rule and r.state_format == f and r.library == "adam8lib"
                                            for r in R.ROWS.values())]
        if rule != "adamw" and len(fmts) < len(R.FORMATS):
            fewer.append(f"{R.RULE_LABELS[rule]} with {' and '.join(shown[f] for f in fmts)} only")
    return f" ({'; '.join(fewer)})" if fewer else ""


def readme_block(result: dict[str, Any]) -> str:
    lrs = ", ".join(f"{R.RULE_LABELS[r]} {s['used_lr']:g}" for r, s in result["sweep"].items() if s)
    text = [
        START,
        "### The bytes-vs-loss board: every rule, every state format",
        "",
        "![bytes vs loss](bench/results/board.png)",
        "",
        f"The same LM and paired seeds ({len(result['seeds'])}), for each update rule with fp32, 8-bit, 4-bit and FP8 "
        f"states{_fewer_formats()}{' (rows not run yet are named below)' if not_run(result) else ''}, with bitsandbytes' and torchao's classes as anchors; each rule at its own lr from a sweep with fp32 "
        f"states on seeds 100 and 101 ({lrs}); x is measured from the LM's allocated states (its small tensors keep fp32 "
        f"states, so each low-bit point sits a little right of its nominal bytes, about 1 per 8-bit state and ½ per 4-bit "
        f"state; Muon's points also hold AdamW's two states for the embeddings, biases and norms, which the board gives "
        f"to AdamW as torch's documentation advises).",
        "",
        table(result, full=False),
        "",
        resolution(result) + (" " + not_run(result) if not_run(result) else ""),
        "",
        within_rule_text(result),
        "",
        f"Machine: {machine(result)}. Command: `{COMMAND}` (resumable; `--report` redraws from the stored runs; "
        f"`--optimizer package.module:Class --lr 1e-3 --kwargs '{{...}}'` adds your optimizer: `--lr` its peak lr, 2e-3 by "
        f"default, `--kwargs` the other arguments). The full table, the lr sweep and "
        f"the notes are in [bench/README.md](bench/README.md#the-bytes-vs-loss-board).",
        END,
    ]
    return "\n".join(t for t in text)


def bench_section(result: dict[str, Any]) -> str:
    desc = result["description"]
    parts = [
        f"`{COMMAND}` ({desc['parameters']:,} parameters, {desc['config']['steps']} steps, seeds "
        f"{result['seeds'][0]}–{result['seeds'][-1]}, paired; Δ = mean of per-seed (loss − AdamW's loss) / AdamW's "
        f"loss with a 95 % Student-t interval). Packaged: `bench/results/board.json`, the runs under "
        f"`bench/results/runs/board/` (the rows that are the LM benchmark's own runs are read from "
        f"`bench/results/runs/lm/`), the picture `bench/results/board.png`.",
        "",
        "![bytes vs loss](results/board.png)",
        "",
        table(result),
        "",
        "**Reading it.** " + resolution(result) + (" " + not_run(result) if not_run(result) else ""),
        "",
        "**" + within_rule_text(result).replace(": each row", "**: each row", 1),
        "",
        within_rule_table(result),
        "",
        "**Bytes.** " + small_tensors(result) + " bitsandbytes' states also point at its two 256-entry fp32 code maps, one storage each shared "
        "by every tensor (counted once: 2 KiB, its 0.005 bytes/param over adam8lib's 8-bit row); adam8lib's state holds codes and "
        "scales only (its maps are constants of the library).",
        "",
        "**Learning rates** (" + result["lr_rule"].replace("the lr of SWEEP_LRS", "the lr of the grid below") +
        "; a grid whose best lr is at an edge is extended by a factor 2 past it, at most twice):",
        "",
        sweep_table(result),
        "",
        "**Settings besides the lr** (`bench/board_rows.py`):" + _settings(),
        "",
        f"Machine: {machine(result)}.",
    ]
    if result.get("reproducibility"):
        r = result["reproducibility"]
        parts.append(f"\nReproducibility: fp32 AdamW seed {r['seed']} re-run by the board's runner gave "
                     f"{r['rerun_valid_loss']:.10f} against the LM benchmark's stored {r['stored_valid_loss']:.10f} "
                     f"(relative {r['relative_difference']:.1e}; bit identical: {r['bit_identical']}): not the same "
                     f"bits, but well inside the machine's own floor (another thread count moves it by up to 7e-6), so "
                     f"the stored runs are reused.")
    return "\n".join(parts)


def _settings() -> str:
    """The rows' docstring paragraph on hyper-parameters, as Markdown (bullets kept)."""
    import textwrap

    body = textwrap.dedent(R.__doc__.split("**Hyper-parameters besides the lr.**")[1])
    out = []
    for line in body.strip().splitlines():
        if line.startswith("* ") or not out:
            out.append(line)
        else:
            out[-1] += " " + line.strip()
    return " " + out[0] + "\n\n" + "\n".join(out[1:])


def write_readmes(result: dict[str, Any], readme: Path = README) -> None:
    from readme_section import write_section

    text = readme.read_text()
    readme.write_text(_replace_block(text, readme_block(result), "## The library in one screen"))
    write_section("<!-- board-full:start -->", "<!-- board-full:end -->", bench_section(result),
                  "The bytes-vs-loss board")
