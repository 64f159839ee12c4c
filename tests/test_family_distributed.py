"""The optimizer family (QuantizedStateOptimizer) under FSDP2: 2 gloo ranks on the CPU (issue 35, part C).

One subprocess (tests/family_distributed_worker.py) runs every 2-rank scenario once; the tests compare what
it wrote with unsharded runs made here. The shards keep the whole tensor's blocks (adam8lib.global_blocks),
so every check is bit for bit, shard boundaries inside a block included.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from adam8lib.distributed import load_checkpoint, save_checkpoint, shard_ranges  # noqa: E402
from adam8lib.formats import unpack_nibbles  # noqa: E402
from adam8lib.quant import num_blocks  # noqa: E402

pytestmark = pytest.mark.slow  # one 2-rank subprocess for the whole module

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import family_distributed_worker as worker  # noqa: E402

NAMES = list(worker.FAMILY)
CUT = ("net.0.weight", "net.2.weight")  # a shard boundary inside a block


def single(name, steps):
    model = worker.make_model(name)
    opt = worker.make(name, model.parameters())
    worker.train(model, opt, steps)
    return model, opt


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("family_dist")
    singles = {}
    for name in NAMES:
        model, opt = single(name, worker.STEPS)
        states = worker.local_states(model, opt)
        save_checkpoint(model, opt, str(out / f"ckpt1_{name}"))
        worker.train(model, opt, worker.MORE, first_step=worker.STEPS)
        singles[name] = dict(states=states, opt=opt, afterN=None, after_more=worker.full_params(model))
        singles[name]["afterN"] = worker.full_params(single(name, worker.STEPS)[0])
    proc = subprocess.run([sys.executable, str(HERE / "family_distributed_worker.py"), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = {f.stem: torch.load(f, weights_only=False) for f in out.glob("*_rank*.pt")}
    return dict(out=out, singles=singles, ranks=ranks, shapes={k: tuple(v.shape) for k, v in worker.Net().named_parameters()})


def both(runs, name):
    return [runs["ranks"][f"{name}_rank{r}"] for r in range(2)]


def test_the_model_has_the_shards_the_tests_need():
    shapes = {k: tuple(v.shape) for k, v in worker.Net().named_parameters()}
    for pname in CUT:
        n = math.prod(shapes[pname])
        (a0, b0), (a1, b1) = shard_ranges(shapes[pname], 2)
        assert b0 % 256 and b0 % 128 and n % 256 and n >= 4096 and b0 < 4096 and b1 - a1 < 4096, pname
    assert shard_ranges(shapes["row"], 2)[1] == (4500, 4500)  # rank 1 holds nothing
    assert all(b % 256 == 0 for _, b in shard_ranges(shapes["net.4.weight"], 2))
    assert math.prod(shapes["net.0.bias"]) < 4096


def slice_state(opt, pname, shape, state, a, b):
    """The unsharded state's entries that a shard [a, b) of the whole tensor keeps: its codes (4-bit unpacked)
    and the scales of the global blocks it touches (rank-1: its rows' and every column's maxima)."""
    out = {}
    for key, value in state.items():
        if not torch.is_tensor(value):
            continue
        if not key.endswith(("_codes", "_absmax")):
            out[key] = value.reshape(-1)[a:b]
            continue
        spec = max((s for s in opt.rule_for(torch.empty(shape), opt.param_groups[0]).states
                    if key.startswith(s.name + "_")), key=lambda s: len(s.name))  # (exp_avg_sq_codes: exp_avg_sq's)
        moment = opt.moment(spec)
        if key.endswith("_codes"):
            codes = unpack_nibbles(value, math.prod(shape)) if moment.bits == 4 else value
            out[key] = codes[a:b]
        elif b <= a:
            out[key] = value[:0]
        elif moment.uses_rank1(shape):
            cols = math.prod(shape[1:])
            out[key] = torch.cat([value[a // cols: b // cols], value[shape[0]:]])
        else:
            B = moment.blocksize
            out[key] = value[a // B: -(-b // B)]
    return out


def unpacked(opt, pname, shape, state, local_n):
    out = {}
    for key, value in state.items():
        if torch.is_tensor(value):
            if key.endswith("_codes") and value.dtype == torch.uint8 and opt.format is not None and \
                    opt.format.m.bits == 4:
                value = unpack_nibbles(value, local_n)
            out[key] = value.reshape(-1)
    return out


def assert_states_are_slices(runs, name, got_states, single_states):
    opt = runs["singles"][name]["opt"]
    for r, got in enumerate(got_states):
        for pname, st in single_states.items():
            shape = runs["shapes"][pname]
            a, b = shard_ranges(shape, 2)[r]
            want = slice_state(opt, pname, shape, st, a, b)
            mine = unpacked(opt, pname, shape, got[pname], b - a)
            assert got[pname]["step"] == st["step"], (name, pname)
            assert sorted(mine) == sorted(want), (name, pname)
            for key in want:
                assert torch.equal(mine[key], want[key]), (name, pname, r, key)


@pytest.mark.parametrize("name", NAMES)
def test_fsdp2_equals_unsharded_bit_for_bit(runs, name):
    """Parameters after 3 steps on 2 ranks equal the unsharded run's; each rank's states are the unsharded
    states' codes of its elements and scales of the blocks it touches, a block cut by the boundary kept
    by both ranks with the whole block's scale."""
    for rank in both(runs, name):
        for pname, value in runs["singles"][name]["afterN"].items():
            assert torch.equal(rank["afterN"][pname], value), (name, pname)
    assert_states_are_slices(runs, name, [r["states"] for r in both(runs, name)], runs["singles"][name]["states"])


@pytest.mark.parametrize("name", NAMES)
def test_quantized_or_fp32_is_decided_by_the_whole_parameter(runs, name):
    for r, rank in enumerate(both(runs, name)):
        for pname, st in rank["states"].items():
            big = math.prod(runs["shapes"][pname]) >= 4096
            assert any(k.endswith("_codes") for k in st) == big, (name, pname, r)


def test_fused_steps_run_on_whole_block_shards_only(runs):
    """Lion8bit on the CPU: the shards of net.4.weight (whole blocks) take the fused step, those cut inside a
    block the reference step (whose scales are reduced across the ranks)."""
    for rank in both(runs, "lion8"):
        assert rank["fused"]["net.4.weight"] is True
        assert not any(rank["fused"][p] for p in CUT)


@pytest.mark.parametrize("name", NAMES)
def test_dcp_save_and_resume_on_two_ranks_is_bit_identical(runs, name):
    for rank in both(runs, name):
        for pname in rank["continued"]:
            assert torch.equal(rank["resumed"][pname], rank["continued"][pname]), (name, pname)
    assert_states_are_slices(runs, name, [r["loaded"] for r in both(runs, name)], runs["singles"][name]["states"])


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip_on_two_ranks_is_bit_identical(runs, name):
    """``state_dict()`` of a sharded optimizer (DTensors), through torch.save, into a fresh one on the same ranks."""
    for rank in both(runs, name):
        assert rank["sd_loaded"].keys() == rank["states"].keys()
        for pname, st in rank["states"].items():
            for key, value in st.items():
                got = rank["sd_loaded"][pname][key]
                assert torch.equal(got, value) if torch.is_tensor(value) else got == value, (name, pname, key)


@pytest.mark.parametrize("name", NAMES)
def test_one_process_checkpoint_loads_on_two_ranks_and_resumes_bit_identically(runs, name):
    assert_states_are_slices(runs, name, [r["from1_loaded"] for r in both(runs, name)], runs["singles"][name]["states"])
    for rank in both(runs, name):
        for pname, value in runs["singles"][name]["after_more"].items():
            assert torch.equal(rank["from1"][pname], value), (name, pname)


@pytest.mark.parametrize("name", NAMES)
def test_two_rank_checkpoint_loads_on_one_process_and_resumes_bit_identically(runs, name):
    model = worker.make_model(name)
    opt = worker.make(name, model.parameters())
    load_checkpoint(model, opt, str(runs["out"] / f"ckpt2_{name}"))
    loaded = worker.local_states(model, opt)
    for pname, st in runs["singles"][name]["states"].items():
        for key, value in st.items():
            assert torch.equal(loaded[pname][key], value) if torch.is_tensor(value) else loaded[pname][key] == value, \
                (name, pname, key)
    worker.train(model, opt, worker.MORE, first_step=worker.STEPS)
    for pname, value in worker.full_params(model).items():
        assert torch.equal(value, runs["singles"][name]["after_more"][pname]), (name, pname)


def test_a_step_that_raises_on_a_shard_changes_nothing(runs):
    """Lion8bit on 2 ranks, net.4.weight's codes cut short: ValueError before any parameter or state (or
    collective) of the step, on every rank (net.0.weight, stepped first, is unchanged)."""
    for rank in both(runs, "fault"):
        assert rank["raised"] is not None and "exp_avg_codes" in rank["raised"]
        (params, states), (params2, states2) = rank["before"], rank["after"]
        for pname, value in params.items():
            assert torch.equal(params2[pname], value), pname
        for pname, st in states.items():
            for key, value in st.items():
                assert torch.equal(states2[pname][key], value) if torch.is_tensor(value) else states2[pname][key] == value


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    out = tmp_path_factory.mktemp("family_three")
    proc = subprocess.run([sys.executable, str(HERE / "family_distributed_worker.py"), str(out), "3"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [torch.load(out / f"three_rank{r}.pt", weights_only=False) for r in range(3)]
    model = worker.make_small()
    opt = worker.make_small_opt(model.parameters())
    worker.train_small(model, opt, worker.STEPS, ranks[0]["grads"])  # the sharded run's (averaged) gradients
    return dict(out=out, model=model, opt=opt, ranks=ranks)


def test_blocks_shared_by_three_shards_equal_the_unsharded_run_bit_for_bit(three):
    """3 ranks, every tensor inside one or two blocks of 256: a block's scale is the MAX over every shard that holds
    part of it (rank 1 of net.0.weight holds the middle of block 0 only), so parameters and states are the
    unsharded run's."""
    model, opt = three["model"], three["opt"]
    states = worker.local_states(model, opt)
    shapes = {k: tuple(v.shape) for k, v in model.named_parameters()}
    for r, rank in enumerate(three["ranks"]):
        for pname, value in worker.full_params(model).items():
            assert torch.equal(rank["afterN"][pname], value), pname
        for pname, st in states.items():
            a, b = shard_ranges(shapes[pname], 3)[r]
            want = slice_state(opt, pname, shapes[pname], st, a, b)
            got = rank["states"][pname]
            assert sorted(k for k in got if torch.is_tensor(got[k])) == sorted(want), pname
            for key in want:
                assert torch.equal(got[key].reshape(-1), want[key]), (pname, r, key)
    cut = three["ranks"][1]["states"]["net.0.weight"]["exp_avg_sq_absmax"]
    assert cut.numel() == 1 and torch.equal(cut, states["net.0.weight"]["exp_avg_sq_absmax"][:1])


def test_a_three_rank_checkpoint_loads_on_one_process_bit_for_bit(three):
    model = worker.make_small()
    opt = worker.make_small_opt(model.parameters())
    load_checkpoint(model, opt, str(three["out"] / "ckpt3_small"))
    for pname, st in worker.local_states(three["model"], three["opt"]).items():
        got = worker.local_states(model, opt)[pname]
        for key, value in st.items():
            assert torch.equal(got[key], value) if torch.is_tensor(value) else got[key] == value, (pname, key)
    for pname, value in worker.full_params(model).items():
        assert torch.equal(value, worker.full_params(three["model"])[pname]), pname


def test_the_muon_rule_refuses_a_sharded_matrix_naming_it(runs):
    for rank in both(runs, "muon_refused"):
        message = rank["refused"]
        assert message is not None and message.startswith("ValueError")
        assert "'0.weight'" in message and "Muon8bit" in message and "muon rule" in message.lower()
        assert "unsharded" in message and "use_muon=False" in message


def test_state_numbers_in_the_model_are_what_global_blocks_keep(runs):
    """net.0.weight on rank 1 holds elements 2300 (= 8*256 + 252) ... 4499: the 10 blocks of 256 from block 8 to
    block 17 (rank 0 keeps block 8 too: 9 blocks, 0 ... 8)."""
    st = both(runs, "lion8")[1]["states"]["net.0.weight"]
    a, b = shard_ranges((45, 100), 2)[1]
    assert st["exp_avg_codes"].numel() == b - a
    assert st["exp_avg_absmax"].numel() == num_blocks(a % 256 + b - a, 256) == 10
    assert both(runs, "lion8")[0]["states"]["net.0.weight"]["exp_avg_absmax"].numel() == 9
