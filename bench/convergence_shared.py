"""Is the 8-bit *step* as good as AdamW's, once the chaos of training is taken out?

``bench/convergence.py`` trains each optimizer in its own run, so each run's gradients come
from its own parameters and small differences grow chaotically (a different data order alone
moves final accuracy by several points). Here one fp32 AdamW run computes the gradients
(bf16 autocast, clipping at 1.0) and the *same* gradients are fed to adam8lib ``Adam8bit`` and
bitsandbytes ``Adam8bit`` copies of the model, each with the same schedule. Validation
accuracy of all three is printed after every epoch.

Run: ``python bench/convergence_shared.py [--seed 0] [--epochs 5]`` (about 3 min on 2 cores).
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adam8lib import Adam8bit  # noqa: E402
from adam8lib.course import data as D  # noqa: E402
from adam8lib import training as T  # noqa: E402


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=5e-4)
    args = parser.parse_args(argv)

    import bitsandbytes as bnb
    from transformers import get_linear_schedule_with_warmup

    data, tok, _ = D.load_task("offline")
    train, valid = F.make_dataloaders(data, tok, batch_size=32, seed=args.seed)
    ref = F.build_distilbert(small=True, seed=args.seed, vocab_size=len(tok), max_position_embeddings=64)
    models = {"AdamW (fp32)": ref, "adam8lib Adam8bit": copy.deepcopy(ref), "bnb Adam8bit": copy.deepcopy(ref)}
    makers = [torch.optim.AdamW, Adam8bit, bnb.optim.Adam8bit]
    opts = {k: make(T.make_param_groups(m, 0.01), lr=args.lr) for (k, m), make in zip(models.items(), makers)}
    total = args.epochs * len(train)
    scheds = [get_linear_schedule_with_warmup(o, math.ceil(0.1 * total), total) for o in opts.values()]
    accuracy: dict[str, float] = {}
    for epoch in range(args.epochs):
        for batch in train:
            for m in models.values():
                m.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = ref(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
            for m in list(models.values())[1:]:
                for p, r in zip(m.parameters(), ref.parameters()):
                    p.grad = None if r.grad is None else r.grad.clone()
            for opt, sched in zip(opts.values(), scheds):
                opt.step()
                sched.step()
        accuracy = {k: F.evaluate(m, valid, precision="bf16")["accuracy"] for k, m in models.items()}
        print(f"epoch {epoch + 1}: " + "  ".join(f"{k} {100 * a:.1f}%" for k, a in accuracy.items()), flush=True)
    return accuracy


if __name__ == "__main__":
    main()
