"""adam8lib.memory: estimates vs measured optimizer state, and the source chapter's numbers."""

import pytest
import torch
from torch import nn
from transformers.optimization import Adafactor

from adam8lib import Adam8bit
from adam8lib.memory import MB, compute_optimizer_size, estimate_optimizer_memory
from adam8lib.course.finetune import DISTILBERT_NUM_PARAMS, build_distilbert
from tests._bnb import bnb
from adam8lib import memory as M
from adam8lib import training as T
from adam8lib.course import finetune as F
from tests._finetune import _batch, _offline, task, tiny_model  # noqa: F401


def one_step(model, opt):
    for p in model.parameters():
        p.grad = torch.ones_like(p) * 1e-3
    opt.step()
    return compute_optimizer_size(opt.state.values())


@pytest.fixture(scope="module")
def distilbert():
    return build_distilbert()


def test_distilbert_seed_numbers(distilbert):
    """The chapter: 65,783,042 params; 2-bytes estimate 125 MB; measured ≈128 MB (8-bit)
    vs ≈502 MB (AdamW). Measured here: adam8lib 127.79, bnb 127.80, AdamW 501.89 (MiB)."""
    model = distilbert
    assert sum(p.numel() for p in model.parameters()) == DISTILBERT_NUM_PARAMS == 65_783_042
    estimate = estimate_optimizer_memory(DISTILBERT_NUM_PARAMS, "adam8bit")
    assert round(estimate.code_megabytes) == 125
    exact = estimate_optimizer_memory(model, "adam8bit")
    ours_mb, ours_n = one_step(model, Adam8bit(model.parameters()))
    assert round(ours_mb) == 128
    # the estimate from shapes is the measurement, minus 8 bytes per param tensor (no step tensor)
    assert ours_mb * MB == exact.total_bytes
    bnb.optim.GlobalOptimManager.get_instance().initialize()  # no override left by another test (keyed by id)
    bnb_mb, _ = one_step(model, bnb.optim.Adam8bit(model.parameters()))
    assert abs(bnb_mb - ours_mb) < 0.01  # bnb adds its two shared 1 KiB maps
    adamw_mb, adamw_n = one_step(model, torch.optim.AdamW(model.parameters()))
    assert round(adamw_mb) == 502
    assert adamw_n == 2 * DISTILBERT_NUM_PARAMS + len(list(model.parameters()))  # + step counters
    assert adamw_mb / ours_mb == pytest.approx(3.93, abs=0.01)  # "1/4"


def test_adamw_and_adam8bit_estimates():
    assert estimate_optimizer_memory(1000, "adamw").bytes_per_param == 8
    e = estimate_optimizer_memory(1 << 20, "adam8bit")
    assert e.bytes_per_param == 2 + 8 / 256
    assert estimate_optimizer_memory(1 << 20, "adam8bit", blocksize=2048).bytes_per_param == 2 + 8 / 2048
    small = estimate_optimizer_memory([(4095,), (4096,), (257, 1)], "adam8bit")
    assert small.fp32_bytes == 8 * (4095 + 257) and small.code_bytes == 2 * 4096 and small.absmax_bytes == 8 * 16
    ragged = estimate_optimizer_memory([(5000,)], "adam8bit")
    assert ragged.absmax_bytes == 2 * 4 * 20  # ceil(5000 / 256) = 20 blocks


def test_adafactor_estimate_matches_transformers_adafactor():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(300, 200), nn.LayerNorm(200), nn.Linear(200, 50))
    opt = Adafactor(model.parameters(), lr=1e-3, relative_step=False, scale_parameter=False)
    measured = {k: v for k, v in zip(["mb", "n"], one_step(model, opt))}
    estimate = estimate_optimizer_memory(model, "adafactor")
    # transformers also keeps a 1-element RMS and a step per tensor: ≤ 8 bytes each
    extra = measured["mb"] * MB - estimate.total_bytes
    assert 0 <= extra <= 8 * len(list(model.parameters()))
    assert estimate.factored_bytes == 4 * ((200 + 300) + (50 + 200))


def test_compute_optimizer_size_counts_shared_tensors_once():
    shared = torch.zeros(256)
    states = [{"a": torch.zeros(10), "map": shared, "step": 3}, {"b": torch.zeros(5, dtype=torch.uint8), "map": shared}]
    mb, n = compute_optimizer_size(states)
    assert n == 10 + 256 + 5 and mb * MB == 40 + 1024 + 5


def test_bad_input():
    with pytest.raises(ValueError, match="Unknown optimizer kind"):
        estimate_optimizer_memory(10, "sgd")
    with pytest.raises(ValueError, match="shapes"):
        estimate_optimizer_memory(10, "adafactor")
    with pytest.raises(ValueError, match=">= 0"):
        estimate_optimizer_memory(-1)
    with pytest.raises(ValueError, match="blocksize"):
        estimate_optimizer_memory(10, blocksize=100)
    with pytest.raises(TypeError, match="state dicts"):
        compute_optimizer_size([torch.zeros(3)])


# ---------------------------------------------------------------------- measuring: activations, materialized states
def test_autocast_bf16_shrinks_saved_activations(task):
    model = tiny_model(len(task[1]))
    batch = _batch(task)
    fp32 = M.saved_activation_bytes(model, batch)
    bf16 = M.saved_activation_bytes(model, batch, torch.bfloat16)
    assert 0.3 * fp32 < bf16 < 0.85 * fp32


@pytest.mark.parametrize("kind", ["adam8bit", "adamw"])
def test_materialize_state_equals_the_first_steps_state(kind):
    model = tiny_model(100)
    a = M.materialize_state(T.make_optimizer(model, kind, lr=1e-3))
    b = T.make_optimizer(model, kind, lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    before = [p.detach().clone() for p in model.parameters()]
    b.step()
    for p, p0 in zip(model.parameters(), before):
        p.data.copy_(p0)
    sa, sb = compute_optimizer_size(a.state.values()), compute_optimizer_size(b.state.values())
    assert sa == sb and sa[0] > 0
    for p in model.parameters():
        assert {k: (v.dtype, v.shape) for k, v in a.state[p].items() if torch.is_tensor(v)} == \
               {k: (v.dtype, v.shape) for k, v in b.state[p].items() if torch.is_tensor(v)}



@pytest.mark.parametrize("kind, cls", [("adam4bit", "AdamW4bit"), ("adamfp8", "AdamWFp8"), ("adam8bit", "AdamW8bit")])
def test_low_bit_estimates_equal_the_measured_state_of_distilbert(distilbert, kind, cls):
    """The full DistilBERT (65,783,042 parameters): the estimate from shapes, in exact bytes, equals
    the bytes the optimizer allocates (states created without a step)."""
    import adam8lib

    opt = M.materialize_state(getattr(adam8lib, cls)(distilbert.parameters()))
    measured = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values() if torch.is_tensor(t))
    estimate = estimate_optimizer_memory(distilbert, kind)
    assert estimate.total_bytes == measured
    per_param = {"adam4bit": (1.03, 1.06), "adamfp8": (2.03, 2.04), "adam8bit": (2.03, 2.04)}[kind]
    assert per_param[0] < estimate.bytes_per_param < per_param[1]
    # a bare count takes every tensor as one vector: blocks only, no rank-1 scales
    flat = estimate_optimizer_memory(DISTILBERT_NUM_PARAMS, kind)
    assert flat.code_bytes == (DISTILBERT_NUM_PARAMS if kind == "adam4bit" else 2 * DISTILBERT_NUM_PARAMS)


def test_mib_is_the_unit_and_the_chapters_mb_names_stay_aliases():
    """The course prints 2**20 bytes as MiB; MB / megabytes / code_megabytes keep working (same values)."""
    from adam8lib import memory

    assert memory.MiB == memory.MB == 2**20
    est = estimate_optimizer_memory(DISTILBERT_NUM_PARAMS, "adam8bit")
    assert est.mebibytes == est.megabytes == est.total_bytes / 2**20
    assert est.code_mebibytes == est.code_megabytes == 2 * DISTILBERT_NUM_PARAMS / 2**20
    assert round(est.code_mebibytes, 1) == 125.5


def test_compute_optimizer_size_counts_the_tensors_a_subclass_holds_once_each():
    """torchao's states are wrapper subclasses (codes, scales, a map); their logical shape says nothing
    about their bytes. A stand-in: torch's TwoTensor holds two tensors of its shape."""
    from torch.testing._internal.two_tensor import TwoTensor

    codes, scale = torch.zeros(1000, dtype=torch.float16), torch.ones(1000, dtype=torch.float16)
    shared = torch.zeros(16)
    states = [{"exp_avg": TwoTensor(codes, scale), "qmap": shared}, {"qmap": shared, "step": torch.tensor(1.0)}]
    mib, elements = compute_optimizer_size(states)
    assert elements == 1000 + 1000 + 16 + 1  # not 1000 (the subclass's shape); the shared map once
    assert round(mib * 2**20) == 1000 * 2 * 2 + 16 * 4 + 4
