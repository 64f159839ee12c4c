"""The whole bill of DistilBERT, row by row, each row measured with adam8lib.memory_tracker (issue 37).

    python bench/whole_bill.py            # full DistilBERT (65,783,042 parameters), a few minutes on a CPU
    python bench/whole_bill.py --small    # the 2-layer DistilBERT: seconds
    python bench/whole_bill.py --json bench/results/whole_bill.json

Each row: a model built from config (offline), one warm-up training step untracked (the optimizer makes
its state), then one step tracked (batch of 1 x 8 tokens). "between" is weights + gradients + optimizer
state when backward ends (the gradients an ordinary step holds until ``step()``; none with gradient
release); "peak bill" the highest weights + gradients + state during the step, with the largest gradient
alive then; "peak all" everything live at the highest point (activations and transient buffers too).
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

from adam8lib import AdamW8bit, LowBitAdam, release_gradients  # noqa: E402
from adam8lib.course.finetune import build_distilbert  # noqa: E402
from adam8lib.memory_tracker import BILL, track_step  # noqa: E402


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
    per = {c: round(v / n, 4) for c, v in between.bytes.items()}
    return {"row": name, "num_params": n, "between": round(between.bytes_per_param(n), 4), "parts": per,
            "peak_bill": round(bill.sum() / n, 4), "peak_bill_phase": bill.phase,
            "largest_gradient": bill.largest_gradient, "peak_all": round(top.total / n, 4),
            "peak_all_phase": top.phase, "peak_all_parts": {c: round(v / n, 4) for c, v in top.bytes.items()},
            "seconds_two_steps": round(seconds, 1)}


def table(results):
    lines = ["| row | between steps (B/param) | weights | grads | state | peak of weights+grads+state (phase) "
             "| largest gradient then | peak, all live (phase) |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['row']} | skipped: {r['skipped']} | | | | | | |")
            continue
        p = r["parts"]
        g = r["largest_gradient"]
        gtxt = f"{g[0]} ({g[1] / r['num_params']:.3f} B/param)" if g else "none"
        lines.append(f"| {r['row']} | **{r['between']:.3f}** | {p['parameters']:.3f} | {p['gradients']:.3f} | "
                     f"{p['optimizer_state']:.3f} | {r['peak_bill']:.3f} ({r['peak_bill_phase']}) | {gtxt} | "
                     f"{r['peak_all']:.3f} ({r['peak_all_phase']}) |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="the 2-layer DistilBERT (seconds)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--only", help="comma-separated row numbers (1-based)")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    main()
