"""The whole bill of DistilBERT, row by row, each row measured with adam8lib.memory_tracker (issue 37).

    python bench/whole_bill.py            # full DistilBERT (65,783,042 parameters), a few minutes on a CPU
    python bench/whole_bill.py --small    # the 2-layer DistilBERT: seconds
    python bench/whole_bill.py --json bench/results/whole_bill.json   # (and adam8lib/course/results/, for lesson 14)
    python bench/whole_bill.py --readme   # bench/README.md's section: these bytes + the LM's evidence
                                          # (bench/convergence.py bill -> adam8lib/course/results/whole_bill_lm.json)

Each row: a model built from config (offline), one warm-up training step untracked (the optimizer makes
its state), then one step tracked (batch of 1 x 8 tokens). "between" is weights + gradients + optimizer
state when backward ends (the gradients an ordinary step holds until ``step()``; none with gradient
release); "peak bill" the highest weights + gradients + state during the step, with the largest gradient
alive then; "peak live" the highest weights + gradients + state + the step's temporaries (everything but
activations: where memory runs out), with its largest part named; "peak all" everything live at the highest
point (activations too).
All bytes per parameter, from live tensor storages (not an estimate).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from adam8lib import AdamW8bit, LowBitAdam, release_gradients  # noqa: E402
from adam8lib.course.finetune import build_distilbert  # noqa: E402
from adam8lib.memory_tracker import BILL, track_step  # noqa: E402

#: everything live but activations: weights, gradients, optimizer state and the step's temporaries
LIVE = BILL + ("transient",)


def _rows():
    def adamw(ps):
        return torch.optim.AdamW(ps, lr=1e-5, weight_decay=0.01)

    def w8(sr):
        return lambda ps: AdamW8bit(ps, lr=1e-5, weight_decay=0.01, stochastic_rounding=sr)

    def w4(sr):
        return lambda ps: LowBitAdam(ps, lr=1e-5, weight_decay=0.01, state_format="4bit", stochastic_rounding=sr)

    # name, weights dtype, optimizer, release, compressed-master bits (None: no master)
    return [
        ("fp32 AdamW", torch.float32, adamw, False, None),
        ("fp32 weights + 8-bit AdamW", torch.float32, w8(False), False, None),
        ("bf16 + SR + 8-bit", torch.bfloat16, w8(True), False, None),
        ("bf16 + SR + 8-bit + release", torch.bfloat16, w8(True), True, None),
        ("bf16 + SR + 4-bit + release", torch.bfloat16, w4(True), True, None),
        ("24-bit master + 4-bit + release", torch.float32, w4(False), True, 8),
    ]


def measure(name, dtype, make, release, master_bits, small):
    model = build_distilbert(small=small).to(dtype)
    opt = make(model.parameters())
    also = None
    if master_bits is not None:
        try:
            from adam8lib.master_weights import CompressedMasterWeights
        except ImportError as err:
            return {"row": name, "skipped": f"adam8lib.master_weights not available ({err})"}
        masters = CompressedMasterWeights(model, opt, bits=master_bits)
        also = {"parameters": list(masters.corrections.values())}
    handle = release_gradients(model, opt) if release else None
    batch = {"input_ids": torch.randint(0, 28996, (1, 8), generator=torch.Generator().manual_seed(0)),
             "labels": torch.tensor([1])}
    start = time.perf_counter()
    model(**batch).loss.backward()
    if not release:
        opt.step()
        opt.zero_grad(set_to_none=True)
    t = track_step(model, opt, lambda: model(**batch).loss, also=also)
    seconds = time.perf_counter() - start
    if handle:
        handle.remove()
    n = t.num_params
    between, bill, top = t.at_end_of("backward"), t.peak(categories=BILL), t.peak()
    live = t.peak(categories=LIVE)  # where memory runs out, activations apart: the bill + the step's temporaries
    live_parts = {c: live.bytes[c] for c in LIVE}
    per = {c: round(v / n, 4) for c, v in between.bytes.items()}
    return {"row": name, "num_params": n, "between": round(between.bytes_per_param(n), 4), "parts": per,
            "peak_bill": round(bill.sum() / n, 4), "peak_bill_phase": bill.phase,
            "largest_gradient": bill.largest_gradient, "peak_all": round(top.total / n, 4),
            "peak_all_phase": top.phase, "peak_all_parts": {c: round(v / n, 4) for c, v in top.bytes.items()},
            "peak_live": round(sum(live_parts.values()) / n, 4), "peak_live_phase": live.phase,
            "peak_live_parts": {c: round(v / n, 4) for c, v in live_parts.items()},
            "peak_live_largest": max(live_parts, key=live_parts.get),
            "peak_live_largest_gradient": live.largest_gradient,
            "seconds_two_steps": round(seconds, 1)}


def table(results):
    lines = ["| row | between steps (B/param) | weights | grads | state | peak of weights+grads+state (phase) "
             "| largest gradient then | peak of everything but activations (phase; its temporaries) "
             "| peak, all live (phase) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['row']} | skipped: {r['skipped']} | | | | | | | |")
            continue
        p = r["parts"]
        g = r["largest_gradient"]
        gtxt = f"{g[0]} ({g[1] / r['num_params']:.3f} B/param)" if g else "none"
        lines.append(f"| {r['row']} | **{r['between']:.3f}** | {p['parameters']:.3f} | {p['gradients']:.3f} | "
                     f"{p['optimizer_state']:.3f} | {r['peak_bill']:.3f} ({r['peak_bill_phase']}) | {gtxt} | "
                     f"**{r['peak_live']:.3f}** ({r['peak_live_phase']}; {r['peak_live_parts']['transient']:.3f}) | "
                     f"{r['peak_all']:.3f} ({r['peak_all_phase']}) |")
    return "\n".join(lines)


ROOT = Path(__file__).resolve().parents[1]
PACKAGED = ROOT / "adam8lib" / "course" / "results"
#: The LM rows of ``bench/convergence.py bill``, with the DistilBERT row whose bytes they have.
LM_ROWS = [("adamw", "fp32 AdamW"), ("bf16_sr_8bit", "bf16 + SR + 8-bit"),
           ("bf16_sr_8bit_release", "bf16 + SR + 8-bit + release"),
           ("bf16_sr_4bit_release", "bf16 + SR + 4-bit + release"),
           ("master24_4bit_release", "24-bit master + 4-bit + release")]


def _ci(d):
    return f"{100 * d['mean']:+.2f} % [{100 * d['ci_low']:+.2f}, {100 * d['ci_high']:+.2f}]"


def evidence_table(lm, bert):
    """The LM's paired evidence for the bill's rows, with DistilBERT's measured bytes per parameter."""
    by = {r["row"]: r for r in bert}
    lines = ["| row | DistilBERT bill between steps (B/param, measured) | peak of the bill during a step | "
             "peak of everything but activations | Δ valid loss vs AdamW [95 % CI] | diverged |",
             "|---|---|---|---|---|---|"]
    for kind, row in LM_ROWS:
        e, b = lm["optimizers"][kind], by[row]
        delta = "–" if kind == "adamw" else _ci(lm["paired_vs_adamw"][kind]["valid_loss"])
        lines.append(f"| {row} | {b['between']:.3f} | {b['peak_bill']:.3f} | {b['peak_live']:.3f} | {delta} | "
                     f"{e['diverged']}/{e['n']} |")
    return "\n".join(lines)


def readme_section(lm, bert):
    pairs = lm["pairs"]
    same = pairs["bf16_sr_8bit_release_vs_bf16_sr_8bit"]["bit_identical"]
    noise = lm["noise_floor"]["seed_to_seed_relative_std"]
    lines = [
        "DistilBERT's bill (65,783,042 parameters; `python bench/whole_bill.py`), every row measured by "
        "`adam8lib.memory_tracker` from live storages, B/param:", "", table(bert), "",
        "How they train: the course's LM (`bench/convergence.py bill`: 250 steps, global-norm clipping at 1.0 "
        "done with `ReleaseHandle.backward_clipped` in the release rows; seeds "
        f"{lm['seeds']}, each paired with fp32 AdamW on its seed):", "", evidence_table(lm, bert), "",
        f"- **The check, not new evidence**: bf16 + SR + 8-bit with gradient release equals the same runs without it "
        f"bit for bit (loss curves and final loss) on {sum(same)}/{len(same)} seeds.",
        "- The bf16 rows (and the 24-bit master, whose model computes in bf16) were run on one machine "
        "(bf16 arithmetic differs between CPUs), with `bf16_sr_8bit` re-run there; the fp32 rows (AdamW, 8-bit, "
        "4-bit) are the LM benchmark's own runs.",
        f"- Noise floor: AdamW's seed-to-seed spread {100 * noise:.2f} % (relative std of the final loss).",
    ]
    for key, pair in pairs.items():
        if "valid_loss" in pair and key != "bf16_sr_8bit_release_vs_bf16_sr_8bit":
            d = pair["valid_loss"]
            verdict = "contains 0: no difference resolved" if d["ci_low"] <= 0 <= d["ci_high"] else "excludes 0"
            lines.append(f"- {pair['label']}: {_ci(d)} (n={d['n']}); {verdict}.")
    lines.append(f"- Measured on: {lm['environment'].get('cpu')}, torch {lm['environment'].get('torch')}.")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="the 2-layer DistilBERT (seconds)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--only", help="comma-separated row numbers (1-based)")
    parser.add_argument("--readme", action="store_true",
                        help="write bench/README.md's section from the stored results (runs nothing)")
    args = parser.parse_args(argv)
    if args.readme:
        import json as _json

        from readme_section import write_section

        lm = _json.loads((PACKAGED / "whole_bill_lm.json").read_text())
        bert = _json.loads((PACKAGED / "whole_bill.json").read_text())
        write_section("<!-- whole-bill:start -->", "<!-- whole-bill:end -->", readme_section(lm, bert),
                      "The whole bill: gradient release, 4-bit states, 24-bit master weights")
        print(readme_section(lm, bert))
        return
    torch.set_num_threads(1)
    rows = _rows()
    if args.only:
        rows = [rows[int(i) - 1] for i in args.only.split(",")]
    results = []
    for row in rows:
        results.append(measure(*row, small=args.small))
        print(json.dumps(results[-1]), flush=True)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
        if not args.small and not args.only:  # the full table: lesson 14 reads the packaged copy
            (PACKAGED / "whole_bill.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
