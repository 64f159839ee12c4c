"""8-bit Adam under FSDP2, DDP and ZeRO, the other state formats (4-bit, FP8) under FSDP2, and
distributed checkpoints: 2 gloo ranks on the CPU.

One subprocess (tests/distributed_worker.py) runs every 2-rank scenario once; the tests compare
what it wrote with single-process runs of the same model and data made here. Same data on
both ranks, so the averaged gradients equal the single-process ones bit for bit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from adam8lib import AdamW8bit, AdamWFp8, compute_optimizer_size  # noqa: E402
from adam8lib.distributed import (load_checkpoint, reshard_tolerance, save_checkpoint, shard_ranges,  # noqa: E402
                                  shard_shapes)
from adam8lib.quant import dequantize_blocks  # noqa: E402

pytestmark = pytest.mark.slow  # one 2-rank subprocess (~30 s of CPU) for the whole module

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import distributed_worker as worker  # noqa: E402

ALIGNED = ("net.0.weight", "net.2.weight", "row")  # every 2-rank shard starts on a block boundary
UNALIGNED = "net.4.weight"  # 33x128: shards of 17 and 16 rows = 2176 and 2048 elements


def single_run():
    model = worker.make_model()
    opt = AdamW8bit(model.parameters(), lr=worker.LR)
    after1 = {}
    worker.train(model, opt, worker.STEPS, after_first=lambda m: after1.update(worker.full_params(m)))
    return model, opt, after1


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    model, opt, after1 = single_run()
    save_checkpoint(model, opt, str(out / "ckpt1"))
    lowbit = {}
    for name in worker.LOWBIT:  # single-process runs of the other formats, and their checkpoints
        m, a1 = worker.make_model(), {}
        o = worker.make_lowbit(name, m.parameters())
        worker.train(m, o, worker.STEPS, after_first=lambda mm, a1=a1: a1.update(worker.full_params(mm)))
        save_checkpoint(m, o, str(out / f"ckpt1_{name}"))
        lowbit[name] = dict(model=m, opt=o, after1=a1, states=worker.local_states(m, o),
                            size=compute_optimizer_size(o.state.values()))
    sr_model = worker.make_sr_model()
    sr_opt = worker.make_sr(sr_model.parameters())
    worker.train_sr(sr_model, sr_opt, worker.STEPS)
    proc = subprocess.run(
        [sys.executable, str(HERE / "distributed_worker.py"), str(out)], capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    loaded = {f.stem: torch.load(f, weights_only=False) for f in out.glob("*_rank*.pt")}
    lowbit["sr"] = dict(model=sr_model, opt=sr_opt, states=worker.local_states(sr_model, sr_opt))
    return dict(out=out, model=model, opt=opt, after1=after1, ranks=loaded, lowbit=lowbit,
                states=worker.local_states(model, opt), size=compute_optimizer_size(opt.state.values()))


def both(runs, name):
    return [runs["ranks"][f"{name}_rank{r}"] for r in range(2)]


def dequant(state, opt, blocksize=256):
    return [dequantize_blocks(state[c], state[a], q, blocksize) for c, a, q in
            (("state1", "absmax1", opt.qmap1), ("state2", "absmax2", opt.qmap2))]


# ---------------------------------------------------------------------- FSDP2
def test_fsdp2_default_backend_trains_with_half_the_state_per_rank(runs):
    mb_single = runs["size"][0]
    per_rank = [r["size"][0] for r in both(runs, "fsdp")]
    for mb in per_rank:
        assert 0.45 * mb_single < mb < 0.55 * mb_single, (per_rank, mb_single)
    # together the ranks hold the single-process state plus at most one partial block per shard
    assert abs(sum(per_rank) - mb_single) * 2**20 <= 8 * 4 * 2


def test_min_8bit_decision_is_the_same_for_one_and_two_ranks(runs):
    single = {name: "state1" in st for name, st in runs["states"].items()}
    assert single[UNALIGNED] and single["row"]  # 4224 and 4096 elements: 8-bit, though shards are smaller
    for rank in both(runs, "fsdp"):
        assert rank["eight_bit"] == single


def test_fsdp2_matches_single_process(runs):
    """Step 1 does not read the (zero) quantized states: bit-identical. Later steps differ only
    through the blocks that straddle the 33x128 weight's shard boundary (2176 is not a multiple of
    256): a few of its blocks get another absmax, so a few codes land one map step apart, and
    where v is small that moves the update by a part of lr. Bound: every parameter within a
    quarter of one update (0.25·lr) of the single-process run after 3 steps (measured: 0.09·lr,
    on the 33x128 weight; the others follow through the gradients, 0.02·lr)."""
    for rank in both(runs, "fsdp"):
        for name, value in runs["after1"].items():
            assert torch.equal(rank["after1"][name], value), name
        diff = max((rank["afterN"][k] - v).abs().max().item() for k, v in runs["model"].named_parameters())
        assert diff < 0.25 * worker.LR, diff


def test_fsdp2_states_are_sized_to_the_local_shard(runs):
    """Each rank's 8-bit state is sized to its shard (uneven 17/16-row and empty shards included)."""
    ranks = both(runs, "fsdp")
    for name, st in runs["states"].items():
        if "state1" not in st:
            continue
        shape = dict(runs["model"].named_parameters())[name].shape
        for r, rank in enumerate(ranks):
            a, b = shard_ranges(shape, 2)[r]
            assert rank["states"][name]["state1"].numel() == b - a
            assert rank["states"][name]["absmax1"].numel() == -(-(b - a) // 256)
    assert ranks[1]["states"]["row"]["state1"].numel() == 0


# ---------------------------------------------------------------------- checkpoints
def test_dcp_save_resume_is_bit_identical_on_two_ranks(runs):
    for fsdp, resume in zip(both(runs, "fsdp"), both(runs, "resume")):
        for name, st in fsdp["states"].items():
            for key, value in st.items():
                loaded = resume["loaded"][name][key]
                assert (torch.equal(loaded, value) if torch.is_tensor(value) else loaded == value), (name, key)
        for name, value in resume["continued"].items():
            assert torch.equal(resume["resumed"][name], value), name


def test_two_rank_checkpoint_loads_on_one_process(runs):
    """2→1: aligned parameters load bit for bit; the straddling blocks are requantized within
    one map step of their new absmax, and the blocks inside one shard keep their codes."""
    ranks = both(runs, "fsdp")
    model = worker.make_model()
    opt = AdamW8bit(model.parameters(), lr=worker.LR)
    load_checkpoint(model, opt, str(runs["out"] / "ckpt2"))
    params = dict(model.named_parameters())
    for name, value in ranks[0]["afterN"].items():
        assert torch.equal(params[name], value), name
    loaded = worker.local_states(model, opt)
    for name, st in loaded.items():
        assert st["step"] == worker.STEPS
        if "state1" not in st:
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(st[key].reshape(-1), torch.cat([r["states"][name][key].reshape(-1) for r in ranks]))
            continue
        codes = {k: torch.cat([r["states"][name][k] for r in ranks]) for k in ("state1", "state2", "absmax1", "absmax2")}
        if name in ALIGNED:
            for k, v in codes.items():
                assert torch.equal(st[k], v), (name, k)
            continue
        saved = [dequant(r["states"][name], opt) for r in ranks]
        for i, (absmax_key, qmap) in enumerate((("absmax1", opt.qmap1), ("absmax2", opt.qmap2))):
            old = torch.cat([s[i] for s in saved])
            new = dequant(st, opt)[i]
            tol = reshard_tolerance(qmap, st[absmax_key], 256, new.numel())
            assert bool(((new - old).abs() <= tol).all()), name
            assert not torch.equal(st[absmax_key][8:], codes[absmax_key][8:])  # the straddling blocks did change
        assert torch.equal(st["state1"][: 8 * 256], codes["state1"][: 8 * 256])  # rank 0's whole blocks kept


def test_one_process_checkpoint_loads_on_two_ranks(runs):
    single = runs["states"]
    for r, rank in enumerate(both(runs, "from1")):
        for name, value in runs["model"].named_parameters():
            assert torch.equal(rank["params"][name], value), name
        for name, st in rank["states"].items():
            if "state1" not in st:
                continue
            a, b = shard_ranges(dict(runs["model"].named_parameters())[name].shape, 2)[r]
            if name in ALIGNED:
                assert torch.equal(st["state1"], single[name]["state1"][a:b])
                assert torch.equal(st["absmax2"], single[name]["absmax2"][a // 256: -(-b // 256)])
            else:
                new = dequant(st, runs["opt"])[1]
                old = dequantize_blocks(single[name]["state2"], single[name]["absmax2"], runs["opt"].qmap2, 256)[a:b]
                assert bool(((new - old).abs() <= reshard_tolerance(runs["opt"].qmap2, st["absmax2"], 256, b - a)).all())


def snapshot(model, opt):
    return worker.local_states(model, opt), {k: v.detach().clone() for k, v in model.named_parameters()}


def assert_unchanged(model, opt, snap):
    states, params = snap
    after = worker.local_states(model, opt)
    for name, st in states.items():
        for key, value in st.items():
            assert (torch.equal(after[name][key], value) if torch.is_tensor(value) else after[name][key] == value), key
    for name, value in model.named_parameters():
        assert torch.equal(value, params[name]), name


def test_corrupt_or_mismatched_checkpoints_raise_and_change_nothing(runs, tmp_path):
    model = worker.make_model()
    opt = AdamW8bit(model.parameters(), lr=worker.LR)
    worker.train(model, opt, 1)
    snap = snapshot(model, opt)

    broken = tmp_path / "broken"  # rank 1's shard file lost
    broken.mkdir()
    for f in (runs["out"] / "ckpt2").iterdir():
        if f.name != "__1_0.distcp":
            (broken / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ValueError, match="could not be read"):
        load_checkpoint(model, opt, str(broken))
    assert_unchanged(model, opt, snap)

    adamw = tmp_path / "adamw"  # a torch.optim.AdamW checkpoint has no 8-bit states
    ref = worker.make_model()
    ref_opt = torch.optim.AdamW(ref.parameters())
    worker.train(ref, ref_opt, 1)
    save_checkpoint(ref, ref_opt, str(adamw))
    with pytest.raises(ValueError, match=r"no entry 'optim\.state\..*\.state1'"):
        load_checkpoint(model, opt, str(adamw))
    assert_unchanged(model, opt, snap)

    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_checkpoint(model, opt, str(tmp_path / "nothing"))

    wider = worker.make_model()
    wider.net[4] = torch.nn.Linear(128, 34)
    with pytest.raises(ValueError, match=r"net.4.weight' has shape \(33, 128\), this run has \(34, 128\)"):
        load_checkpoint(wider, AdamW8bit(wider.parameters()), str(runs["out"] / "ckpt2"))


def test_corrupt_absmax_in_a_state_dict_raises_and_changes_nothing(runs):
    """A resharded state whose absmax fits no layout is refused by Adam8bit.load_state_dict."""
    model, opt = runs["model"], runs["opt"]
    snap = snapshot(model, opt)
    sd = opt.state_dict()
    ids = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    st = sd["state"][ids[UNALIGNED]]
    full = dict(st, state1=st["state1"].view(33, 128), absmax1=torch.zeros(2, 7))  # 2 shards need 9 blocks each
    sd["state"][ids[UNALIGNED]] = full
    with pytest.raises(ValueError, match="needs 9 per shard"):
        opt.load_state_dict(sd)
    assert_unchanged(model, opt, snap)


# ---------------------------------------------------------------------- the other low-bit formats under FSDP2
LOWBIT = list(worker.LOWBIT)  # AdamW4bit, AdamWFp8, AdamW4bit(state_format="4bit-naive")
#: every 2-rank shard of Net starts on a boundary of the 128-element blocks of the 4-bit formats, and
#: the 4-bit format's rank-1 column maxima are all-reduced: sharded == unsharded, bit for bit
EXACT = ["4bit", "naive"]
#: blockwise formats: a single process stepping the row chunks as the ranks do gives the same bits
#: (fp8's blocks of 256 straddle the 33x128 weight's shard boundary, so it differs from unsharded)
PER_SHARD = ["fp8", "naive"]
_LOWBIT_KEYS = ("state1", "state2", "absmax1", "absmax2")


@pytest.fixture(scope="module")
def per_shard():
    return {name: worker.per_shard_run(name) for name in PER_SHARD}


def lowbit_ranks(runs, name):
    return both(runs, f"lowbit_{name}")


def shapes(runs):
    return {k: tuple(v.shape) for k, v in runs["model"].named_parameters()}


def assert_same_states(got, want, where=""):
    assert set(got) == set(want), where
    for name, st in want.items():
        assert set(got[name]) == set(st), (where, name)
        for key, value in st.items():
            assert (torch.equal(got[name][key], value) if torch.is_tensor(value) else got[name][key] == value), \
                (where, name, key)


@pytest.mark.parametrize("name", LOWBIT)
def test_lowbit_fsdp2_step_1_is_the_unsharded_step(runs, name):
    for rank in lowbit_ranks(runs, name):
        for pname, value in runs["lowbit"][name]["after1"].items():
            assert torch.equal(rank["after1"][pname], value), pname


@pytest.mark.parametrize("name", EXACT)
def test_lowbit_fsdp2_equals_unsharded_bit_for_bit(runs, name):
    """Parameters after 3 steps, and each rank's states: slices of the unsharded run's (packed
    4-bit codes, block scales; for the 4-bit format's rank-1 v the rank's row maxima and the
    whole tensor's column maxima, the same on both ranks)."""
    assert_sharded_equals_unsharded(runs, runs["lowbit"][name], lowbit_ranks(runs, name))


def test_fsdp2_bf16_stochastic_rounding_equals_unsharded_bit_for_bit(runs):
    """bf16 weights, stochastic rounding, 4-bit states, 3 steps on 2 ranks: each element's random bits
    are keyed by its index in the whole parameter, so the shards round as the unsharded tensor does
    (parameters and every rank's states bit for bit; before, parameters differed by a bf16 ulp)."""
    single = runs["lowbit"]["sr"]
    assert all(p.dtype == torch.bfloat16 for p in single["model"].parameters())
    assert_sharded_equals_unsharded(runs, single, both(runs, "sr"))


def assert_sharded_equals_unsharded(runs, single, ranks):
    fmt, blocksize = single["opt"].format, single["opt"].format.blocksize
    for pname, value in single["model"].named_parameters():
        for rank in ranks:
            assert torch.equal(rank["afterN"][pname], value), pname
    for r, rank in enumerate(ranks):
        for pname, st in single["states"].items():
            shape = shapes(runs)[pname]
            a, b = shard_ranges(shape, 2)[r]
            got = rank["states"][pname]
            assert got["step"] == st["step"] == worker.STEPS
            if "state1" not in st:
                for key in ("exp_avg", "exp_avg_sq"):
                    assert torch.equal(got[key].reshape(-1), st[key].reshape(-1)[a:b]), (pname, key)
                continue
            for key in ("state1", "state2"):
                assert torch.equal(got[key], st[key][a // 2: -(-b // 2)]), (pname, key)
            assert torch.equal(got["absmax1"], st["absmax1"][a // blocksize: -(-b // blocksize)]), pname
            if fmt.v.uses_rank1(shape) and a < b:
                rows, cols = shape[0], shape[1]
                r0, r1 = a // cols, b // cols
                assert torch.equal(got["absmax2"], torch.cat([st["absmax2"][r0:r1], st["absmax2"][rows:]])), pname
            elif fmt.v.uses_rank1(shape):
                assert got["absmax2"].numel() == 0  # an empty shard
            else:
                assert torch.equal(got["absmax2"], st["absmax2"][a // blocksize: -(-b // blocksize)]), pname


@pytest.mark.parametrize("name", PER_SHARD)
def test_blockwise_fsdp2_equals_the_per_shard_reference_bit_for_bit(runs, per_shard, name):
    """Blocks are local to a shard (as 8-bit's): each rank's states and the parameters equal a single
    process that steps the same row chunks; fp8 is within a quarter of an update of unsharded."""
    model, opt, pieces = per_shard[name]
    ranks = lowbit_ranks(runs, name)
    for pname, value in model.named_parameters():
        for rank in ranks:
            assert torch.equal(rank["afterN"][pname], value), pname
    names = {id(p): k for k, p in model.named_parameters()}
    chunk = {}
    for p, start, piece in pieces:
        chunk.setdefault(names[id(p)], []).append(piece)
    for pname, chunks in chunk.items():
        for r, piece in enumerate(chunks):
            want = opt.state[piece]
            got = ranks[r]["states"][pname]
            for key, value in want.items():
                assert (torch.equal(got[key], value) if torch.is_tensor(value) else got[key] == value), (pname, key)
    diff = max((ranks[0]["afterN"][k] - v).abs().max().item() for k, v in runs["lowbit"][name]["model"].named_parameters())
    assert diff < 0.25 * worker.LR, diff


@pytest.mark.parametrize("name", LOWBIT)
def test_lowbit_states_are_the_local_shards_and_decided_by_the_full_size(runs, name):
    single = runs["lowbit"][name]
    fmt = single["opt"].format
    ranks = lowbit_ranks(runs, name)
    low = {pname: "state1" in st for pname, st in single["states"].items()}
    assert low[UNALIGNED] and low["row"] and not low["net.0.bias"]  # 4224 elements: low-bit, shards < 4096
    for r, rank in enumerate(ranks):
        assert rank["eight_bit"] == low
        for pname, st in rank["states"].items():
            local = shard_shapes(shapes(runs)[pname], 2)[r]
            if low[pname]:
                for key, (count, dtype) in fmt.state_spec(local).items():
                    assert st[key].numel() == count and st[key].dtype == dtype, (pname, key)
            else:
                assert tuple(st["exp_avg"].shape) == local
        # rank 0 also holds all of the 1x4096 row: 55% of the 4-bit state (1 byte per parameter)
        assert 0.4 * single["size"][0] < rank["size"][0] < 0.6 * single["size"][0], (rank["size"], single["size"])
    # together: the unsharded state, plus the rank-1 column maxima each rank keeps (4-bit: 4 x (256 + 512 +
    # 128) bytes, 1.5% of this small model's state) and partial blocks
    assert single["size"][0] <= sum(r["size"][0] for r in ranks) < 1.02 * single["size"][0]
    assert ranks[1]["states"]["row"]["state1"].numel() == 0


@pytest.mark.parametrize("name", LOWBIT)
def test_lowbit_state_dict_and_dcp_resume_are_bit_identical(runs, name):
    for rank in lowbit_ranks(runs, name):
        assert_same_states(rank["sd_loaded"], rank["states"], "state_dict")
        assert_same_states(rank["loaded"], rank["states"], "dcp")
        for pname, value in rank["continued"].items():
            assert torch.equal(rank["resumed"][pname], value), pname


def assert_close_moments(fmt, state, shape, old_m, old_v, where):
    """Decoded m and v within one step of their map (the largest gap) times the tensor's largest value."""
    m, v = fmt.decode(state, shape)
    if not m.numel():  # an empty shard
        assert old_m.numel() == 0 and all(t.numel() == 0 for k, t in state.items() if k in _LOWBIT_KEYS), where
        return
    for moment, new, old in ((fmt.m, m, old_m), (fmt.v, v, old_v)):
        gap = 32 / 448 if moment.coding == "fp8" else float(moment.qmap().sort().values.diff().max())
        assert float((new - old).abs().max()) <= gap * float(old.abs().max()), where


@pytest.mark.parametrize("name", LOWBIT)
def test_lowbit_two_rank_checkpoint_loads_on_one_process(runs, name):
    """2→1: decoded and re-encoded in one process's layout (the same parameters; states within a map step)."""
    ranks = lowbit_ranks(runs, name)
    model = worker.make_model()
    opt = worker.make_lowbit(name, model.parameters())
    load_checkpoint(model, opt, str(runs["out"] / f"ckpt2_{name}"))
    for pname, value in model.named_parameters():
        assert torch.equal(value, ranks[0]["afterN"][pname]), pname
    fmt = opt.format
    for pname, st in worker.local_states(model, opt).items():
        assert st["step"] == worker.STEPS
        if "state1" not in st:
            assert torch.equal(st["exp_avg"].reshape(-1),
                               torch.cat([r["states"][pname]["exp_avg"].reshape(-1) for r in ranks]))
            continue
        old = [fmt.decode(r["states"][pname], shard_shapes(shapes(runs)[pname], 2)[i]) for i, r in enumerate(ranks)]
        assert_close_moments(fmt, st, shapes(runs)[pname], torch.cat([o[0] for o in old]),
                             torch.cat([o[1] for o in old]), pname)


@pytest.mark.parametrize("name", LOWBIT)
def test_lowbit_one_process_checkpoint_loads_on_two_ranks(runs, name):
    single = runs["lowbit"][name]
    fmt = single["opt"].format
    for r, rank in enumerate(lowbit_ranks(runs, name)):
        for pname, value in single["model"].named_parameters():
            assert torch.equal(rank["from1_params"][pname], value), pname
        for pname, st in rank["from1_states"].items():
            assert st["step"] == worker.STEPS
            if "state1" not in st:
                continue
            shape = shapes(runs)[pname]
            a, b = shard_ranges(shape, 2)[r]
            old_m, old_v = fmt.decode(single["states"][pname], shape)
            assert_close_moments(fmt, st, shard_shapes(shape, 2)[r], old_m[a:b], old_v[a:b], pname)


def test_a_lowbit_checkpoint_in_another_format_raises_and_changes_nothing(runs):
    """A 2-rank 4-bit checkpoint names its format: an 8-bit or FP8 optimizer refuses it, unchanged."""
    for cls in (AdamW8bit, AdamWFp8):
        model = worker.make_model()
        opt = cls(model.parameters(), lr=worker.LR)
        worker.train(model, opt, 1)
        snap = snapshot(model, opt)
        with pytest.raises(ValueError, match="stored in format '4bit'"):
            load_checkpoint(model, opt, str(runs["out"] / "ckpt2_4bit"))
        assert_unchanged(model, opt, snap)


# ---------------------------------------------------------------------- DDP and ZeRO
@pytest.mark.parametrize("name", ["ddp", "zero"])
def test_ddp_and_zero_match_single_process_bit_for_bit(runs, name):
    ranks = both(runs, name)
    for rank in ranks:
        for key, value in runs["model"].named_parameters():
            assert torch.equal(rank["params"][key], value), (name, key)
    # the plain state_dict() (ZeRO: consolidated on rank 0) loads into a single-process optimizer
    model = worker.make_model()
    opt = AdamW8bit(model.parameters(), lr=worker.LR)
    opt.load_state_dict(ranks[0]["state_dict"])
    loaded = worker.local_states(model, opt)
    for pname, st in runs["states"].items():
        for key, value in st.items():
            assert (torch.equal(loaded[pname][key], value) if torch.is_tensor(value) else loaded[pname][key] == value)
    sizes = [r["size"][0] for r in ranks]
    if name == "ddp":
        assert sizes == [runs["size"][0]] * 2  # every rank holds the full state
    else:  # ZeRO-1: each parameter's state on one rank, none twice
        assert sum(sizes) == pytest.approx(runs["size"][0], abs=1e-9)
        assert max(sizes) < 0.75 * runs["size"][0]


# ---------------------------------------------------------------------- no crash on odd tensors
CRASH = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    from torch.distributed.tensor import distribute_tensor, Shard, init_device_mesh
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
    dist.init_process_group("gloo", rank=0, world_size=1)
    from adam8lib import AdamW8bit, kernels
    from adam8lib.quant import dynamic_map
    mesh = init_device_mesh("cpu", (1,))
    p = torch.nn.Parameter(distribute_tensor(torch.randn(64, 128), mesh, [Shard(0)]))
    p.grad = torch.randn(64, 128)  # a plain gradient for a sharded parameter
    try:
        AdamW8bit([p]).step()
        print("optimizer: no error", flush=True)
    except (TypeError, ValueError) as e:
        print("optimizer:", type(e).__name__, e, flush=True)
    from adam8lib import AdamW4bit
    p4 = torch.nn.Parameter(distribute_tensor(torch.randn(64, 128), mesh, [Shard(0)]))
    p4.grad = distribute_tensor(torch.randn(64, 128), mesh, [Shard(0)])
    try:
        AdamW4bit([p4]).step()
        print("4-bit: no error", flush=True)
    except (TypeError, ValueError) as e:
        print("4-bit:", type(e).__name__, e, flush=True)
    q = lambda: distribute_tensor(torch.zeros(8192, dtype=torch.uint8), mesh, [Shard(0)])
    z = lambda: distribute_tensor(torch.zeros(32), mesh, [Shard(0)])
    try:
        d = distribute_tensor(torch.randn(8192), mesh, [Shard(0)])
        kernels.adam8bit_step(d, d.clone(), q(), q(), z(), z(), dynamic_map(True), dynamic_map(False),
                              step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, blocksize=256)
        print("kernel: no error")
    except (TypeError, ValueError) as e:
        print("kernel:", type(e).__name__, e)
    import bitsandbytes as bnb  # lesson 11: what bitsandbytes' 8-bit Adam does with an FSDP2 parameter
    pb = torch.nn.Parameter(distribute_tensor(torch.randn(64, 128), mesh, [Shard(0)]))
    pb.grad = distribute_tensor(torch.randn(64, 128), mesh, [Shard(0)])
    try:
        bnb.optim.AdamW8bit([pb]).step()
        print("bitsandbytes: no error", flush=True)
    except RuntimeError as e:
        print("bitsandbytes:", type(e).__name__, str(e).splitlines()[0], flush=True)
    from adam8lib.distributed import end_rank
    end_rank()  # not the interpreter teardown, which can abort a gloo process
""")


@pytest.fixture(scope="module")
def crash_run():
    env = dict(os.environ, PORT=str(worker.free_port()))
    return subprocess.run([sys.executable, "-c", CRASH], capture_output=True, text=True, timeout=120, env=env)


def test_dtensor_with_plain_gradient_is_a_clear_error_not_a_crash(crash_run):
    assert "optimizer: TypeError" in crash_run.stdout and "needs a DTensor gradient" in crash_run.stdout


def test_sharded_parameter_steps_with_the_4bit_format(crash_run):
    """Every state format shards its states with FSDP2 (a 1-rank mesh here: the rank-1 all-reduce included)."""
    assert "4-bit: no error" in crash_run.stdout, crash_run.stdout + crash_run.stderr[-2000:]


def test_dtensor_at_the_kernel_boundary_is_a_clear_error_not_a_crash(crash_run):
    """The backend contract check (adam8lib/kernels/contract.py) makes the default C++ backend
    refuse a DTensor."""
    assert crash_run.returncode == 0, crash_run.stderr[-3000:]
    assert "kernel: TypeError" in crash_run.stdout or "kernel: ValueError" in crash_run.stdout, crash_run.stdout


def test_bitsandbytes_8bit_adam_refuses_an_fsdp2_parameter_at_its_operator(crash_run):
    """What lesson 11 says of bitsandbytes under FSDP2: the step fails before its kernels, because its
    operator gets DTensor codes (zeros_like of the parameter) next to plain-tensor absmax and map."""
    assert crash_run.returncode == 0, crash_run.stderr[-3000:]
    line = next((l for l in crash_run.stdout.splitlines() if l.startswith("bitsandbytes:")), crash_run.stdout)
    assert "RuntimeError" in line and "optimizer_update_8bit_blockwise" in line, line
    assert "got mixed torch.Tensor and DTensor" in line, line


END_RANK = textwrap.dedent("""
    import atexit, sys, time
    import torch.distributed as dist
    from adam8lib.distributed import end_rank
    rank, port, mark = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if rank >= 0:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    if rank == 1:
        time.sleep(1.5)  # rank 0 reaches end_rank first and must wait for this rank
        open(mark, "w").close()
    atexit.register(lambda: print(" atexit ran"))
    print(f"rank {rank} done", end="")  # no newline: a pipe's buffer, lost unless flushed
    end_rank(3 + rank)
""")
# stdout block-buffered (as in a torchrun worker writing to a pipe), so a missing flush shows
BUFFERED = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def test_end_rank_waits_for_every_rank_flushes_and_exits_with_its_code(tmp_path):
    """adam8lib.distributed.end_rank: rank 0 exits only after rank 1 has done its work (the
    barrier), both outputs arrive (the flush), each exit code is the one asked for, and the
    interpreter's teardown (here an atexit handler) is skipped."""
    port, mark = str(worker.free_port()), str(tmp_path / "rank1_was_here")
    procs = [subprocess.Popen([sys.executable, "-c", END_RANK, str(r), port, mark], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=BUFFERED) for r in (0, 1)]
    out0, err0 = procs[0].communicate(timeout=120)
    rank1_done_before_rank0_left = Path(mark).exists()
    out1, err1 = procs[1].communicate(timeout=120)
    assert (procs[0].returncode, procs[1].returncode) == (3, 4), err0[-2000:] + err1[-2000:]
    assert rank1_done_before_rank0_left
    assert (out0, out1) == ("rank 0 done", "rank 1 done")


def test_end_rank_without_a_process_group_flushes_and_exits():
    proc = subprocess.run([sys.executable, "-c", END_RANK, "-1", "0", "unused"], capture_output=True, text=True,
                          timeout=120, env=BUFFERED)
    assert (proc.returncode, proc.stdout) == (2, "rank -1 done"), proc.stderr[-2000:]
