"""adam8lib.training: decay groups (equal to Trainer's), precision, make_optimizer, training_step."""

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


@pytest.mark.parametrize("small", [False, True])
def test_decay_names_equal_trainer(small, full_model):
    model = full_model if not small else F.build_distilbert(small=True)
    ours = T.decay_parameter_names(model)
    theirs = trainer_decay_names(model)
    assert sorted(ours) == sorted(theirs)
    assert len(ours) == len(set(ours))
    assert ours == [n for n, _ in model.named_parameters() if n in set(ours)]  # named_parameters order
    no_decay = {n for n, _ in model.named_parameters()} - set(ours)
    assert all(n.endswith("bias") or "layer_norm" in n or "LayerNorm" in n for n in no_decay)
    assert "distilbert.embeddings.word_embeddings.weight" in ours


def test_make_param_groups_counts_and_decays(full_model):
    groups = T.make_param_groups(full_model, 0.05)
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0]
    n_decay = sum(p.numel() for p in groups[0]["params"])
    n_no = sum(p.numel() for p in groups[1]["params"])
    assert n_decay + n_no == 65_783_042
    names = dict((id(p), n) for n, p in full_model.named_parameters())
    assert {names[id(p)] for p in groups[0]["params"]} == set(trainer_decay_names(full_model))
    # 6 layers x (4 attention + 2 FFN linear biases + 2 LayerNorms x 2) + embedding LN (2) + 2 head biases
    assert len(groups[1]["params"]) == 6 * (6 + 4) + 2 + 2


def test_make_param_groups_skips_frozen_and_checks_decay():
    model = F.build_distilbert(small=True)
    for p in model.distilbert.embeddings.parameters():
        p.requires_grad_(False)
    groups = T.make_param_groups(model, 0.01)
    in_groups = {id(p) for g in groups for p in g["params"]}
    assert not any(id(p) in in_groups for p in model.distilbert.embeddings.parameters())
    assert sum(len(g["params"]) for g in groups) == sum(p.requires_grad for p in model.parameters())
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError, match="weight_decay"):
            T.make_param_groups(model, bad)
    with pytest.raises(TypeError):
        T.decay_parameter_names("not a model")


def test_zero_decay_keeps_two_groups_and_drops_empty_ones():
    lin = nn.Sequential(nn.Linear(3, 3, bias=False))
    groups = T.make_param_groups(lin, 0.1)
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.1


def test_make_optimizer_kinds():
    model = tiny_model(100)
    opt = T.make_optimizer(model, "adam8bit", lr=1e-3, weight_decay=0.02)
    assert isinstance(opt, Adam8bit) and opt.backend != "triton"  # no interpreter in training loops
    assert [g["weight_decay"] for g in opt.param_groups] == [0.02, 0.0]
    assert isinstance(T.make_optimizer(model, "adamw"), torch.optim.AdamW)
    import bitsandbytes as bnb

    assert isinstance(T.make_optimizer(model, "bnb8bit"), bnb.optim.Adam8bit)
    with pytest.raises(ValueError, match="kind"):
        T.make_optimizer(model, "sgd")
    assert T.autocast_dtype("fp16") is torch.float16 and T.autocast_dtype("no") is None
    with pytest.raises(ValueError, match="precision"):
        T.autocast_dtype("fp8")


def test_training_step_bf16_autocast_keeps_fp32_params(task):
    model = tiny_model(len(task[1]))
    batch = _batch(task)
    seen = []
    model.pre_classifier.register_forward_hook(lambda m, i, o: seen.append((o.dtype, torch.is_autocast_enabled("cpu"))))
    opt = T.make_optimizer(model, "adam8bit", lr=2e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** (s // 10))
    losses = [T.training_step(model, batch, opt, sched, dtype=torch.bfloat16) for _ in range(25)]
    assert seen[0] == (torch.bfloat16, True)
    assert all(p.dtype == torch.float32 and p.grad is None for p in model.parameters())
    assert sched.last_epoch == 25 and opt.param_groups[0]["lr"] == pytest.approx(2e-3 / 4)
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5]), losses  # it memorizes the batch
    state = opt.state[model.distilbert.embeddings.word_embeddings.weight]
    assert state["state1"].dtype == torch.uint8 and state["step"] == 25


def test_training_step_fp16_with_grad_scaler_and_fp32(task):
    batch = _batch(task, 16)
    for dtype, scaler in ((torch.float16, torch.amp.GradScaler("cpu", init_scale=2.0**10)), (None, None)):
        model = tiny_model(len(task[1]))
        opt = T.make_optimizer(model, "adamw", lr=2e-3)
        losses = [T.training_step(model, batch, opt, dtype=dtype, scaler=scaler) for _ in range(8)]
        assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]



# ---------------------------------------------------------------------- precision per GPU (faked on the CPU)
@pytest.mark.parametrize("capability, gpu, expected", [
    ((7, 5), "Tesla T4 (Colab's free GPU)", "fp16"),
    ((7, 0), "Tesla V100", "fp16"),
    ((8, 0), "A100", "bf16"),
    ((8, 6), "RTX 3090", "bf16"),
    ((9, 0), "H100/H200", "bf16"),
])
def test_pick_precision_by_compute_capability(monkeypatch, capability, gpu, expected):
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: asked.append(device) or capability)
    # torch says True on a T4 too (bf16 emulated); that must not decide
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert T.pick_precision("cuda") == expected, gpu
    assert T.pick_precision() == expected, gpu  # default device: the GPU when there is one
    assert T.pick_precision(torch.device("cuda", 0)) == expected
    assert asked and all(torch.device(d).type == "cuda" for d in asked)
    why = T.pick_precision("cuda").reason
    assert f"{capability[0]}.{capability[1]}" in why and why.startswith(expected)
    fake_cpu(monkeypatch, avx512_bf16=False, onednn=False)
    assert T.pick_precision("cpu") == "no"  # the CPU rule is asked for the CPU, whatever the GPU


# ---------------------------------------------------------------------- precision per CPU (faked capabilities)
def fake_cpu(monkeypatch, *, avx512_bf16: bool, onednn: bool, machine: str = "x86_64") -> None:
    """Make torch answer as a CPU with (or without) AVX512-BF16 and oneDNN bf16 kernels would."""
    for var in (T.CPU_BF16_ENV, "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: onednn)
    monkeypatch.setattr(T.platform, "machine", lambda: machine)


@pytest.mark.parametrize("avx512_bf16, onednn, cpu, expected, because", [
    (True, True, "Zen 4 / Sapphire Rapids (AVX512-BF16, AMX)", "bf16", "has AVX512-BF16"),
    (False, False, "AVX2 only: the issue's EPYC, most laptops", "no", "no AVX512-BF16"),
    (False, True, "AVX-512 without BF16 (Skylake-X, Ice Lake): oneDNN converts", "no", "no AVX512-BF16"),
    (True, False, "AVX512-BF16 with oneDNN capped (ONEDNN_MAX_CPU_ISA=AVX2)", "no", "oneDNN may not use it"),
])
def test_pick_precision_by_cpu_capability(monkeypatch, avx512_bf16, onednn, cpu, expected, because):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: pytest.fail("asked a GPU"))
    fake_cpu(monkeypatch, avx512_bf16=avx512_bf16, onednn=onednn)
    for device in (None, "cpu", torch.device("cpu")):
        p = T.pick_precision(device)
        assert p == expected and isinstance(p, str) and isinstance(p, T.Precision), cpu
        assert because in p.reason and p.reason.startswith("bf16" if expected == "bf16" else "fp32"), (cpu, p.reason)
    assert T.cpu_bf16_native()[0] is (expected == "bf16")
    assert T.autocast_dtype(p) is (torch.bfloat16 if expected == "bf16" else None)


@pytest.mark.parametrize("cap, expected", [("AVX512_CORE", "no"), ("avx512_core_vnni", "no"), ("AVX2", "no"),
                                          ("AVX512_CORE_BF16", "bf16"), ("AVX512_CORE_AMX", "bf16"), ("ALL", "bf16")])
def test_a_onednn_cap_below_bf16_means_fp32(monkeypatch, cap, expected):
    # torch's oneDNN check lets an AVX512_CORE cap through (it only needs AVX-512), so the cap is read too
    fake_cpu(monkeypatch, avx512_bf16=True, onednn=True)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    p = T.pick_precision("cpu")
    assert p == expected, p.reason
    assert expected == "bf16" or f"ONEDNN_MAX_CPU_ISA={cap.upper()}" in p.reason


@pytest.mark.parametrize("onednn", [True, False])
def test_pick_precision_off_x86_asks_onednn_only(monkeypatch, onednn):
    # on ARM the AVX-512 check is meaningless (always False); oneDNN's answer is the CPU's BF16 extension
    fake_cpu(monkeypatch, avx512_bf16=False, onednn=onednn, machine="aarch64")
    assert T.pick_precision("cpu") == ("bf16" if onednn else "no")


@pytest.mark.parametrize("forced, expected", [("0", "no"), ("1", "bf16"), (" 0 ", "no")])
def test_cpu_bf16_override_wins_over_the_capabilities(monkeypatch, forced, expected):
    for native in (True, False):
        fake_cpu(monkeypatch, avx512_bf16=native, onednn=native)
        monkeypatch.setenv(T.CPU_BF16_ENV, forced)
        p = T.pick_precision("cpu")
        assert p == expected and T.CPU_BF16_ENV in p.reason, p.reason
    fake_cpu(monkeypatch, avx512_bf16=False, onednn=False)
    monkeypatch.setenv(T.CPU_BF16_ENV, "")  # empty: as if unset
    assert T.pick_precision("cpu") == "no" and T.CPU_BF16_ENV not in T.pick_precision("cpu").reason


@pytest.mark.parametrize("bad", ["yes", "bf16", "2", "true"])
def test_cpu_bf16_override_rejects_other_values(monkeypatch, bad):
    monkeypatch.setenv(T.CPU_BF16_ENV, bad)
    with pytest.raises(ValueError, match=T.CPU_BF16_ENV):
        T.pick_precision("cpu")


def test_pick_precision_rejects_other_devices():
    with pytest.raises(ValueError, match="meta"):
        T.pick_precision("meta")


def test_precision_is_its_name_with_a_reason():
    import copy
    import pickle

    p = T.Precision("bf16", "bf16: because")
    assert p == "bf16" and str(p) == "bf16" and f"{p}" == "bf16" and {"bf16": 1}[p] == 1 and p.reason == "bf16: because"
    for q in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p)):
        assert q == "bf16" and q.reason == "bf16: because"
    with pytest.raises(ValueError, match="precision"):
        T.Precision("fp8", "because")
    with pytest.raises(TypeError, match="reason"):
        T.Precision("no", "")


def test_pick_precision_on_this_cpu_follows_torchs_two_checks(monkeypatch):
    """Not faked: the answer on the machine running the tests is the conjunction of torch's checks."""
    import os
    import platform

    monkeypatch.delenv(T.CPU_BF16_ENV, raising=False)
    onednn = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if platform.machine().lower() in ("x86_64", "amd64"):
        cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
        native = torch.cpu._is_avx512_bf16_supported() and onednn and cap not in T._ONEDNN_ISAS_WITHOUT_BF16
    else:
        native = onednn
    assert T.pick_precision("cpu") == ("bf16" if native else "no")


@pytest.mark.skipif(__import__("platform").machine().lower() not in ("x86_64", "amd64"), reason="oneDNN ISA cap is x86")
def test_onednn_capped_at_avx2_picks_fp32_in_a_fresh_process():
    """The second-machine configuration caps oneDNN at AVX2: torch's own check then says no bf16 kernels,
    so an AVX512-BF16 CPU emulates an AVX2 laptop without any override. Capped at AVX512_CORE (Skylake-X's
    ISA, no BF16) the same check says yes wherever there is AVX-512: it alone is not the test of native bf16,
    and pick_precision reads that cap itself."""
    import os
    import subprocess
    import sys

    code = ("import torch; from adam8lib import training as T; p = T.pick_precision('cpu'); "
            "print(p, torch.ops.mkldnn._is_mkldnn_bf16_supported(), sep='|')")
    for isa, onednn_expected in (("AVX2", False), ("AVX512_CORE", torch.cpu._is_avx512_supported())):
        env = {k: v for k, v in os.environ.items() if k != T.CPU_BF16_ENV} | {"ONEDNN_MAX_CPU_ISA": isa}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        mode, onednn = out.strip().split("|")
        assert onednn == str(onednn_expected), (isa, out)
        if isa == "AVX2":
            assert mode == "no", out
        assert mode == "no", out  # under either cap oneDNN has no bf16 kernels, whatever the CPU
