"""adam8lib.course.finetune and .data: DistilBERT offline, the shipped data and tokenizer, metrics, Trainer and accelerate paths."""

from __future__ import annotations

import gzip
import json
import math

import pytest
import torch
from torch import nn

from adam8lib import memory as M
from adam8lib import training as T
from adam8lib.course import data as D
from adam8lib.course import finetune as F
from adam8lib.memory import compute_optimizer_size
from adam8lib.optim import Adam8bit

from tests._finetune import _batch, _offline, _overfit_set, full_model, task, tiny_model, trainer_decay_names  # noqa: F401


def test_distilbert_has_exactly_the_chapters_parameter_count(full_model):
    assert sum(p.numel() for p in full_model.parameters()) == F.DISTILBERT_NUM_PARAMS == 65_783_042


def test_shipped_data_is_what_the_generator_writes(tmp_path):
    regenerated = D.write_synpara(tmp_path / "s.jsonl.gz")
    assert regenerated.read_bytes() == D.SYNPARA_FILE.read_bytes()
    splits = D.read_synpara()
    assert {k: len(v) for k, v in splits.items()} == D.SPLITS
    rows = splits["train"] + splits["validation"]
    assert set(rows[0]) == {"sentence1", "sentence2", "label", "idx"}  # MRPC's columns
    assert sum(r["label"] for r in rows) == len(rows) // 2
    assert D.generate_pairs(50, seed=1) == D.generate_pairs(50, seed=1) != D.generate_pairs(50, seed=2)
    with pytest.raises(ValueError):
        D.generate_pairs(-1)


def test_shipped_tokenizer_is_rebuilt_identically_and_covers_the_data():
    rows = D.read_synpara()["train"]
    texts = [t for r in rows for t in (r["sentence1"], r["sentence2"])]
    rebuilt = json.loads(D.train_tokenizer(texts).to_str())
    assert rebuilt == json.loads(D.TOKENIZER_FILE.read_text())
    tok = D.offline_tokenizer()
    enc = tok(rows[0]["sentence1"], rows[0]["sentence2"])
    assert enc["input_ids"][0] == tok.cls_token_id and enc["input_ids"].count(tok.sep_token_id) == 2
    ids = [i for r in rows[:500] for i in tok(r["sentence1"], r["sentence2"])["input_ids"]]
    assert tok.unk_token_id not in ids
    assert tok.decode(tok(rows[0]["sentence1"])["input_ids"], skip_special_tokens=True) == rows[0]["sentence1"]


def test_offline_task_tokenized_for_distilbert(task):
    data, tok = task
    assert set(data["train"].column_names) == {"input_ids", "attention_mask", "labels"}
    assert len(data["train"]) == 4000 and len(data["validation"]) == 1000
    assert max(len(x) for x in data["train"]["input_ids"]) < 64


def test_hub_is_skipped_offline(monkeypatch):
    assert D.hub_available() is False  # HF_HUB_OFFLINE=1 (fixture): no connection attempted
    model = F.load_distilbert(small=True, source="auto")
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in F.build_distilbert(small=True).parameters())
    for bad in ("online", ""):
        with pytest.raises(ValueError, match="source"):
            F.load_distilbert(source=bad)
        with pytest.raises(ValueError, match="source"):
            D.load_pairs(bad)


def test_accuracy_f1_matches_sklearn():
    from sklearn.metrics import accuracy_score, f1_score

    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        pred, gold = torch.randint(0, 2, (97,), generator=g), torch.randint(0, 2, (97,), generator=g)
        m = F.accuracy_f1(pred, gold)
        assert m["accuracy"] == pytest.approx(accuracy_score(gold, pred))
        assert m["f1"] == pytest.approx(f1_score(gold, pred))
    logits = torch.tensor([[2.0, -1.0], [0.0, 3.0], [1.0, 0.5]])
    assert F.compute_metrics((logits.numpy(), [0, 1, 1])) == pytest.approx({"accuracy": 2 / 3, "f1": 2 / 3})
    with pytest.raises(ValueError):
        F.accuracy_f1([0, 1], [1])


def test_accelerate_loop_bf16_trains_with_schedule(task):
    from torch.utils.data import DataLoader
    from transformers import DataCollatorWithPadding

    train, tok = _overfit_set(task)
    collate = DataCollatorWithPadding(tok)
    loader = DataLoader(train.with_format("torch"), batch_size=8, shuffle=True, collate_fn=collate,
                        generator=torch.Generator().manual_seed(0))
    model = tiny_model(len(tok))
    before = F.evaluate(model, loader)["loss"]
    opt = T.make_optimizer(model, "adam8bit", lr=2e-3)
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    dtypes = []  # the loop opens no autocast itself: prepare() must have wrapped the forward
    hook = linear.register_forward_hook(lambda m, i, o: dtypes.append((torch.is_grad_enabled(), o.dtype)))
    hist = F.train_with_accelerate(model, opt, loader, loader, epochs=15, precision="bf16", progress=False,
                                   warmup_ratio=0.1)
    hook.remove()
    assert hist["precision"] == "bf16" and len(hist["loss"]) == 30 and len(hist["eval"]) == 15
    assert {d for training, d in dtypes if training} == {torch.bfloat16}, "training forward not under bf16 autocast"
    lrs = hist["lr"]
    assert lrs[0] == 0.0 and max(lrs) == pytest.approx(2e-3) and lrs[-1] < lrs[len(lrs) // 2]
    assert hist["eval"][-1]["loss"] < 0.7 * before, (before, hist["eval"])  # it memorizes 16 pairs
    assert hist["model"] is model
    with pytest.raises(ValueError, match="fp16"):
        F.train_with_accelerate(model, opt, loader, precision="fp16", progress=False)


def test_trainer_with_adam8bit_learns_and_reports_accuracy_f1(task, tmp_path):
    train, tok = _overfit_set(task)
    model = tiny_model(len(tok))
    trainer = F.make_trainer(model, tok, train, train, lr=2e-3, epochs=15, batch_size=8, precision="bf16",
                             output_dir=str(tmp_path), progress=False, warmup_ratio=0.1)
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    assert {"eval_accuracy", "eval_f1", "eval_loss"} <= set(after)
    assert after["eval_loss"] < 0.75 * before["eval_loss"], (before, after)  # it memorizes 16 pairs
    assert trainer.args.bf16 and trainer.args.use_cpu
    opt = trainer.optimizer
    assert isinstance(getattr(opt, "optimizer", opt), Adam8bit)
    mb, n = compute_optimizer_size(opt.state.values())
    assert mb > 0 and any(s.get("state1") is not None and s["state1"].dtype == torch.uint8 for s in opt.state.values())


def test_adam8bit_state_of_full_distilbert_is_a_quarter_of_adamw(full_model):
    # the lesson's numbers; a real 8-bit step on 65M parameters is slow on 2 cores, so the states
    # are created as the first step would (that equivalence is checked on the small model below)
    opt8 = M.materialize_state(T.make_optimizer(full_model, "adam8bit", lr=1e-3))
    mb8, _ = compute_optimizer_size(opt8.state.values())
    opt32 = M.materialize_state(torch.optim.AdamW(T.make_param_groups(full_model, 0.0), lr=1e-3))
    mb32, _ = compute_optimizer_size(opt32.state.values())
    assert round(mb8) == 128 and round(mb32) == 502
    assert opt32.param_groups[0]["lr"] == 1e-3 and all(p.grad is None for p in full_model.parameters())

