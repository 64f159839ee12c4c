"""Scale benchmark: per-rank optimizer-state bytes and step time, world size 1 and 2 (CPU, gloo).

For DDP, ZeRO-1 (ZeroRedundancyOptimizer) and FSDP2 (fully_shard), torch AdamW (fp32 states,
foreach=False) side by side with adam8lib AdamW8bit (default backend) on the same model,
sharded the same way. Each configuration runs as its own torchrun job
(adam8lib.course.at_scale); the step time is the median ``optimizer.step()`` (communication of
ZeRO's parameter broadcast included, FSDP2's all-gathers not: they happen in forward).

    python bench/scale.py            # writes bench/results/scale.json and a section of bench/README.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from readme_section import write_section  # noqa: E402

from adam8lib.course import at_scale  # noqa: E402

START = "<!-- scale:start (bench/scale.py writes this) -->"
END = "<!-- scale:end -->"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world in (1, 2):
            results[world] = at_scale.run(world, Path(tmp) / f"w{world}.json", width=args.width, depth=args.depth,
                                          steps=args.steps, timeout=1800)
    load = os.getloadavg()[0]
    (HERE / "results" / "scale.json").write_text(json.dumps({"load_average": load, "results": results}, indent=1))
    rows = ["| world | strategy | optimizer | state MiB / rank | weights+grads MiB / rank | step ms (median) |",
            "|---|---|---|---|---|---|"]
    for world, res in results.items():
        for row in res["ranks"][0]:
            rows.append(f"| {world} | {row['strategy']} | {row['optimizer']} | {row['states'] / 2**20:.2f} | "
                        f"{(row['weights'] + row['gradients']) / 2**20:.1f} | {row['step_ms']:.1f} |")
    n = results[1]["ranks"][0][0]["num_params"]
    section = "\n".join([
        f"{args.depth} bias-free {args.width}x{args.width} linear layers ({n:,} parameters), rank 0 shown, "
        f"1 thread per rank, load average {load:.1f} when measured (the machine is shared: step times are "
        "indicative; bytes are exact and equal `adam8lib.course.at_scale.estimate`). torch AdamW runs with "
        "`foreach=False` (its plain per-tensor loop) under every sharding; for fused AdamW on one process see "
        "the CPU step section above. ZeRO-1's step includes its parameter broadcast; FSDP2's all-gathers "
        "happen in forward and are not in the step time.",
        "", *rows,
    ])
    write_section(START, END, section, "Scale: DDP, ZeRO-1 and FSDP2 on CPU ranks")
    print(section)


if __name__ == "__main__":
    main()
