"""Tables and plots of the convergence results (``bench/convergence.py report``).

Reads the packaged summaries in ``adam8lib/course/results/`` and writes the plots to
``bench/results/`` and the tables into ``bench/README.md`` (between the
``convergence:start``/``convergence:end`` markers).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

PACKAGED = ROOT / "adam8lib" / "course" / "results"
PLOTS = ROOT / "bench" / "results"


def _ci(d: dict[str, Any], scale: float = 1.0, unit: str = "", digits: int = 2) -> str:
    f = f"+.{digits}f"
    return f"{scale * d['mean']:{f}}{unit} [{scale * d['ci_low']:{f}}, {scale * d['ci_high']:{f}}]"


def text_summary(result: dict[str, Any]) -> str:
    """A few lines for the terminal: per optimizer mean, paired differences vs AdamW."""
    lines = []
    task = result["experiment"]
    for kind, e in result["optimizers"].items():
        if task == "cls":
            lines.append(f"{e['label']:48s} accuracy {100 * e['accuracy']['mean']:.2f} ± {100 * e['accuracy']['std']:.2f}"
                         f"  F1 {100 * e['f1']['mean']:.2f}  loss {e['valid_loss']['mean']:.4f}  (n={e['n']})")
        else:
            loss = ("all diverged" if e["diverged"] == e["n"]
                    else f"{e['valid_loss']['mean']:.4f} ± {e['valid_loss']['std']:.4f}")
            lines.append(f"{e['label']:48s} valid loss {loss}"
                         f"  spikes {sum(e['spikes'])}  diverged {e['diverged']}/{e['n']}  (n={e['n']})")
    for kind, comp in result.get("paired_vs_adamw", {}).items():
        parts = []
        if "valid_loss" in comp:
            parts.append(f"valid loss {_ci(comp['valid_loss'], 100, '%')}")
        if "accuracy" in comp:
            parts.append(f"accuracy {_ci(comp['accuracy'], 100, ' pt')}")
        if parts:
            lines.append(f"  {kind} - adamw (paired, 95% CI): " + ", ".join(parts))
    if "adam8bit_vs_bnb8bit" in result:
        comp = result["adam8bit_vs_bnb8bit"]
        lines.append("  adam8bit - bnb8bit (paired, 95% CI): " + ", ".join(
            f"{m} {_ci(c, 100, '%' if c['relative'] else ' pt')}" for m, c in comp.items()))
    for kind, rc in result.get("root_cause", {}).items():
        for other in ("bnb8bit", "adam8bit"):
            if "valid_loss" in rc.get(f"vs_{other}", {}):
                same = sum(rc[f"identical_to_{other}"])
                lines.append(f"  {kind} - {other} (paired, 95% CI): valid loss {_ci(rc[f'vs_{other}']['valid_loss'], 100, '%', 3)}"
                             f"  (bit-identical runs: {same}/{len(rc[f'identical_to_{other}'])})")
    floor = result.get("noise_floor", {})
    if "threads" in floor:
        t = floor["threads"]
        lines.append(f"  noise floor: {t['label']} - 1 thread (seeds {t['seeds']}): valid loss {_ci(t['valid_loss'], 100, '%', 4)}"
                     f"  (bit-identical: {sum(t['bit_identical'])}/{len(t['bit_identical'])})")
    if "rerun" in floor:
        t = floor["rerun"]
        lines.append(f"  noise floor: {t['label']} - adamw (seeds {t['seeds']}): valid loss {_ci(t['valid_loss'], 100, '%')}")
    if "seed_to_seed_relative_std" in floor:
        lines.append(f"  noise floor: seed-to-seed std of adamw valid loss {100 * floor['seed_to_seed_relative_std']:.2f}%")
    return "\n".join(lines)


def load(name: str) -> dict[str, Any] | None:
    path = PACKAGED / name
    return json.loads(path.read_text()) if path.exists() else None


def _env_line(result: dict[str, Any]) -> str:
    e = result["environment"]
    return (f"{e['cpu']}, {e['cores']} cores shared with other jobs (load average {e['load_average_1min_at_end']:.1f} "
            f"at the end), torch threads per run {e['threads_per_run']}, python {e['python']}, torch {e['torch']}, "
            f"transformers {e['transformers']}, bitsandbytes {e['bitsandbytes']}, torchao {e['torchao']}, {e['date']}")


def _per_seed(comparison: dict[str, Any]) -> str:
    """A noise-floor comparison's per-seed validation-loss differences, in percent."""
    return ", ".join(f"{100 * x:+.4f}" for x in comparison["valid_loss"]["diffs"])


def section(results: dict[str, dict[str, Any]]) -> str:
    """The README section: one table per experiment, with the noise floor and the environment."""
    from adam8lib.course import evidence

    out = []
    lm = results.get("convergence_lm")
    if lm:
        d, c = lm["description"], lm["description"]["config"]
        floor = lm.get("noise_floor", {})
        out += [f"**Language model** ({d['parameters']:,} parameters, {c['n_layer']} layers, width {c['n_embd']}, "
                f"context {c['context']}; {c['steps']} steps of {c['batch_size']} windows, lr {c['lr']:g}, "
                f"{d['tokens_seen']:,} training bytes seen; corpus: {len(d['corpus']['files']['train'])} train / "
                f"{len(d['corpus']['files']['valid'])} validation stdlib files, "
                f"{d['corpus']['bytes']['train']:,} / {d['corpus']['bytes']['valid']:,} bytes, "
                f"sha256 `{d['corpus']['sha256'][:16]}…`). Seeds {lm['seeds']}.", "",
                evidence.markdown_table(lm), ""]
        out += [f"- {line}." for line in evidence.verdict(lm).split("\n")]
        for kind, rc in lm.get("root_cause", {}).items():
            parts = []
            for other, name in (("bnb8bit", "bitsandbytes Adam8bit"), ("adam8bit", "adam8lib Adam8bit")):
                d = rc[f"vs_{other}"].get("valid_loss")
                if d:
                    same = sum(rc[f"identical_to_{other}"])
                    parts.append(f"minus {name} {_ci(d, 100, ' %', 3)} (the same run to the bit on {same} of "
                                 f"{len(rc[f'identical_to_{other}'])} seeds)")
            if parts:
                out.append(f"- Root cause: {rc['label']} " + "; ".join(parts) + ".")
        if "threads" in floor:
            t = floor["threads"]
            out.append(f"- Noise floor, thread count: {t['label']} minus the same seed with 1 thread (seeds {t['seeds']}; "
                       f"per seed {_per_seed(t)} %): {_ci(t['valid_loss'], 100, '%', 4)}; bit-identical on "
                       f"{sum(t['bit_identical'])} of {len(t['bit_identical'])} seeds.")
        if "rerun" in floor:
            t = floor["rerun"]
            out.append(f"- Noise floor: {t['label']} minus AdamW (seeds {t['seeds']}; per seed {_per_seed(t)} %): "
                       f"{_ci(t['valid_loss'], 100, '%', 4)}; seed-to-seed standard deviation of AdamW's validation "
                       f"loss: {100 * floor['seed_to_seed_relative_std']:.2f} %.")
        out += [f"- Measured on: {_env_line(lm)}.", "", "![LM convergence](results/convergence_lm.png)", ""]
    cls = results.get("convergence_cls")
    if cls:
        d, c = cls["description"], cls["description"]["config"]
        out += [f"**Classification** (synpara, small DistilBERT from scratch, {d['parameters']:,} parameters; "
                f"{d['train_pairs']:,} training / {d['validation_pairs']:,} validation pairs, {c['epochs']} epochs, "
                f"batch {c['batch_size']}, lr {c['lr']:g}, fp32). Seeds {cls['seeds']}.", "",
                evidence.markdown_table(cls), ""]
        out += [f"- {line}." for line in evidence.verdict(cls).split("\n")]
        sd = cls["noise_floor"]["seed_to_seed_std"]
        out.append(f"- Seed-to-seed standard deviation of AdamW: accuracy {100 * sd['accuracy']:.1f} points, "
                   f"validation loss {sd['valid_loss']:.4f}.")
        out += [f"- Measured on: {_env_line(cls)}.", "", "![classification](results/convergence_cls.png)", ""]
    ab = results.get("ablation")
    if ab:
        c = ab["description"]["config"]
        same = lm is not None and lm["description"]["config"] == c
        where = (f"the LM above, at its own lr {c['lr']:g}: the AdamW and blockwise rows are its runs" if same
                 else f"the LM above at lr {c['lr']:g}, otherwise the same")
        out += [f"**Ablation** ({where}; seeds {ab['seeds']}; "
                "a loss spike is a step whose training loss exceeds 1.5x the median of the previous 20; "
                "diverged: a non-finite loss or a final validation loss above ln 256; a diverged run is "
                "counted, and left out of the mean and of the paired interval).", "",
                evidence.markdown_table(ab), "", f"- Measured on: {_env_line(ab)}.", "",
                "![ablation](results/ablation.png)", ""]
    beyond = results.get("beyond_8_bits")
    if beyond:
        same = lm is not None and lm["description"]["config"] == beyond["description"]["config"]
        out += [f"**Beyond 8 bits** (lesson 12; {'the LM above: its AdamW, adam8lib 8-bit and bitsandbytes rows are its runs' if same else 'the LM above, same configuration'}; "
                f"seeds {beyond['seeds']}; bf16 rows train bf16 weights, their loss in fp32; diverged and spikes as in the "
                "ablation).", "", evidence.markdown_table(beyond), ""]
        verdict = evidence.verdict(beyond).split("\n")
        out += [f"- {line}." for line in verdict]
        out += [f"- {len(verdict)} intervals at 95 % each: even with no real difference about one in twenty would "
                "exclude 0 by chance, so one small resolved difference is weak evidence on its own (lesson 12; lesson 10 "
                "explains the adam8lib-vs-bitsandbytes gap).",
                "- The bf16 rows depend on the machine: bf16 arithmetic differs between CPUs (native or emulated), and "
                "a re-run on another CPU reproduced AdamW to 8e-6 and 4-bit to 2e-4 (relative) but bf16 + stochastic "
                "rounding only to 0.14–0.21 %.",
                f"- Measured on: {_env_line(beyond)}.", "", "![beyond 8 bits](results/beyond_8_bits.png)", ""]
    return "\n".join(out).rstrip()


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from adam8lib.course import evidence
    from readme_section import write_section

    results = {}
    for name in evidence.EXPERIMENTS:
        result = evidence.load(name)
        if result is None:
            continue
        results[name] = result
        print(f"== {name}")
        print(text_summary(result))
        fig = evidence.plot(result)
        PLOTS.mkdir(parents=True, exist_ok=True)
        fig.savefig(PLOTS / f"{name}.png", dpi=110, bbox_inches="tight")  # the legends sit below the axes
        plt.close(fig)
    write_section("<!-- convergence:start (bench/convergence.py report writes this) -->", "<!-- convergence:end -->",
                  section(results), "Convergence")
    print("wrote bench/README.md and the plots in bench/results/")


if __name__ == "__main__":
    main()
