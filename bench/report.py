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


def _ci(d: dict[str, Any], scale: float = 1.0, unit: str = "") -> str:
    return (f"{scale * d['mean']:+.2f}{unit} [{scale * d['ci_low']:+.2f}, {scale * d['ci_high']:+.2f}]")


def text_summary(result: dict[str, Any]) -> str:
    """A few lines for the terminal: per optimizer mean, paired differences vs AdamW."""
    lines = []
    task = result["experiment"]
    for kind, e in result["optimizers"].items():
        if task == "cls":
            lines.append(f"{e['label']:48s} accuracy {100 * e['accuracy']['mean']:.2f} ± {100 * e['accuracy']['std']:.2f}"
                         f"  F1 {100 * e['f1']['mean']:.2f}  loss {e['valid_loss']['mean']:.4f}  (n={e['n']})")
        else:
            lines.append(f"{e['label']:48s} valid loss {e['valid_loss']['mean']:.4f} ± {e['valid_loss']['std']:.4f}"
                         f"  spikes {sum(e['spikes'])}  diverged {e['diverged']}/{e['n']}  (n={e['n']})")
    for kind, comp in result.get("paired_vs_adamw", {}).items():
        parts = []
        if "valid_loss" in comp:
            parts.append(f"valid loss {_ci(comp['valid_loss'], 100, '%')}")
        if "accuracy" in comp:
            parts.append(f"accuracy {_ci(comp['accuracy'], 100, ' pt')}")
        lines.append(f"  {kind} - adamw (paired, 95% CI): " + ", ".join(parts))
    if "adam8bit_vs_bnb8bit" in result:
        comp = result["adam8bit_vs_bnb8bit"]
        lines.append("  adam8bit - bnb8bit (paired, 95% CI): " + ", ".join(
            f"{m} {_ci(c, 100, '%' if c['relative'] else ' pt')}" for m, c in comp.items()))
    floor = result.get("noise_floor", {})
    if "threads" in floor:
        t = floor["threads"]
        lines.append(f"  noise floor: adamw {t['other_threads']} threads - 1 thread (seeds {t['seeds']}): "
                     f"valid loss {_ci(t['valid_loss'], 100, '%')}")
    if "seed_to_seed_relative_std" in floor:
        lines.append(f"  noise floor: seed-to-seed std of adamw valid loss {100 * floor['seed_to_seed_relative_std']:.2f}%")
    return "\n".join(lines)


def load(name: str) -> dict[str, Any] | None:
    path = PACKAGED / name
    return json.loads(path.read_text()) if path.exists() else None


def main() -> None:
    for name in ("convergence_lm.json", "convergence_cls.json", "ablation.json"):
        result = load(name)
        if result is not None:
            print(f"== {name}")
            print(text_summary(result))


if __name__ == "__main__":
    main()
