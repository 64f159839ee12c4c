"""adam8lib.trainer_names: every Trainer ``optim=`` name of bitsandbytes/torchao maps to the adam8lib class
with the same rule and state width, and gets the hyper-parameters Trainer itself would give (compared with
``Trainer.get_optimizer_cls_and_kwargs``); trained side by side through Trainer, the two stay close."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from adam8lib.trainer_names import TRAINER_NAMES, markdown_table, trainer_optimizer
from tests._tiny_classifier import TinyClassifier, tiny_dataset

transformers = pytest.importorskip("transformers")
pytest.importorskip("bitsandbytes")

ROOT = Path(__file__).resolve().parents[1]
STEPS = 4
BNB = [n for n, e in TRAINER_NAMES.items() if e.library == "bitsandbytes"]
# Not the defaults, so that a translation that ignores TrainingArguments fails.
ARGS = dict(learning_rate=3e-3, adam_beta1=0.85, adam_beta2=0.98, adam_epsilon=1e-7, weight_decay=0.05)
OPTIM_ARGS = {"ademamix": "beta3=0.999,alpha=4.0,t_alpha=10", "rmsprop": "alpha=0.9,eps=1e-6"}


def _args(tmp_path, name, optim_args=True, **more):
    optim_args = next((v for k, v in OPTIM_ARGS.items() if k in name), None) if optim_args else None
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), optim=name, optim_args=optim_args, max_steps=STEPS, per_device_train_batch_size=8,
        report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True, **ARGS, **more)


def _numbers(kwargs):
    """Trainer hands RMSprop its optim_args as strings: compare them as numbers."""
    return {k: float(v) if isinstance(v, str) else v for k, v in kwargs.items()}


@pytest.mark.parametrize("name", BNB)
def test_the_kwargs_are_the_ones_trainer_gives_bitsandbytes(tmp_path, name):
    args = _args(tmp_path, name)
    theirs_cls, theirs = transformers.Trainer.get_optimizer_cls_and_kwargs(args)
    ours_cls, ours = trainer_optimizer(name, args)
    bits = theirs.pop("optim_bits")
    theirs.pop("is_paged", None)
    fmt = ours.pop("state_format", None)
    assert ours == _numbers(theirs)
    e = TRAINER_NAMES[name]
    assert e.theirs.startswith(theirs_cls.__name__) and f"optim_bits={bits}" in e.theirs
    assert ("paged" in name) == ("paged" in e.theirs)
    p = nn.Parameter(torch.zeros(8192))
    opt = ours_cls([p], **ours, **({"state_format": fmt} if fmt else {}))
    p.grad = torch.ones_like(p)
    opt.step()
    quantized = any(torch.is_tensor(t) and t.dtype == torch.uint8 for t in opt.state[p].values())
    assert quantized == (bits == 8), (name, list(opt.state[p]))
    rule = {"AdamW": "adam", "Lion": "lion", "AdEMAMix": "ademamix", "RMSprop": "rmsprop"}[theirs_cls.__name__]
    assert e.hyper == rule


@pytest.mark.parametrize("name", ["adamw_torch_8bit", "adamw_torch_4bit"])
def test_torchao_names_get_adams_kwargs(tmp_path, name):
    """Trainer gives torchao's AdamW8bit/AdamW4bit the same lr, betas and eps as bitsandbytes' AdamW (its
    adam_kwargs); torchao is not installed for the tests, so the comparison is with adamw_8bit's."""
    args = _args(tmp_path, "adamw_8bit")
    _, theirs = transformers.Trainer.get_optimizer_cls_and_kwargs(args)
    cls, ours = trainer_optimizer(name, args)
    assert ours == {k: theirs[k] for k in ("lr", "betas", "eps")}
    assert cls.__name__ == ("AdamW8bit" if "8bit" in name else "AdamW4bit")


def _train(tmp_path, name, **trainer_kwargs):
    """Trainer(optim=name) hands bitsandbytes' RMSprop its optim_args as strings, which it cannot take (a
    transformers bug): RMSprop trains here without optim_args (the kwargs test above covers them)."""
    model = TinyClassifier()
    args = _args(tmp_path, name, optim_args="rmsprop" not in name)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=tiny_dataset(), **trainer_kwargs)
    trainer.train()
    opt = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    return model, opt


@pytest.mark.parametrize("name", ["adamw_8bit", "lion_8bit", "ademamix_8bit", "rmsprop_bnb_8bit", "lion_32bit"])
def test_trained_through_trainer_the_two_stay_close(tmp_path, name):
    theirs_model, theirs_opt = _train(tmp_path / "theirs", name)
    args = _args(tmp_path / "ours", name, optim_args="rmsprop" not in name)
    ours_model, ours_opt = _train(tmp_path / "ours", name, optimizer_cls_and_kwargs=trainer_optimizer(name, args))
    assert type(ours_opt).__module__.startswith("adam8lib")
    for g_ours, g_theirs in zip(ours_opt.param_groups, theirs_opt.param_groups):
        assert g_ours["weight_decay"] == g_theirs["weight_decay"] and g_ours["lr"] == g_theirs["lr"]
        assert tuple(map(float, g_ours["betas"] if "betas" in g_ours else ())) == \
            tuple(map(float, g_theirs["betas"] if "betas" in g_ours else ()))
        for key in {"eps", "alpha", "t_alpha", "t_beta3"} & set(g_ours) & set(g_theirs):
            assert g_ours[key] == g_theirs[key] or float(g_ours[key]) == float(g_theirs[key]), key
    lr = ARGS["learning_rate"]
    start = TinyClassifier()
    for (n, a), b, s in zip(ours_model.named_parameters(), theirs_model.parameters(), start.parameters()):
        moved = (b.detach() - s.detach()).abs().mean()
        diff = (a.detach() - b.detach()).abs()
        assert moved > 0.1 * lr, (name, n, float(moved))  # it trained
        assert float(diff.mean()) <= 0.05 * float(moved), (name, n, float(diff.mean()), float(moved))


def test_bad_names_and_arguments_are_refused(tmp_path):
    args = _args(tmp_path, "adamw_8bit")
    with pytest.raises(ValueError, match="'adamw_9bit' is not a Trainer optimizer name"):
        trainer_optimizer("adamw_9bit", args)
    with pytest.raises(TypeError, match="must be a Trainer optimizer name"):
        trainer_optimizer(None, args)
    with pytest.raises(TypeError, match="args must be TrainingArguments"):
        trainer_optimizer("lion_8bit", {"learning_rate": 1e-3})
    bad = _args(tmp_path, "rmsprop_bnb_8bit")
    bad.optim_args = "alpha=0.9,beta9=1"
    with pytest.raises(ValueError, match=r"optim_args \['beta9'\] mean nothing to RMSprop8bit"):
        trainer_optimizer("rmsprop_bnb_8bit", bad)


def test_every_trainer_name_of_bitsandbytes_and_torchao_is_in_the_map_and_the_readme():
    names = {o.value for o in transformers.training_args.OptimizerNames}
    theirs = {n for n in names if re.search(r"8bit|32bit|_bnb|^lion|^ademamix|torch_4bit|torch_8bit", n)
              and not n.startswith("galore")}
    assert theirs == set(TRAINER_NAMES), sorted(theirs ^ set(TRAINER_NAMES))
    assert markdown_table() in (ROOT / "README.md").read_text()
