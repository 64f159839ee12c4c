"""A checkpoint written by main before issue 35's core (commit 544a2bb) loads and resumes bit for bit.

tests/fixtures/checkpoints/main_checkpoints.pt holds, for Adam8bit, AdamW8bit, Adam4bit, AdamW4bit,
AdamWFp8 and the "4bit-naive" format, the parameters and ``state_dict()`` after 3 steps, as that code wrote
them (its builder, next to it, says how). Here the current code loads each checkpoint:

* the load is exact on every machine: the loaded optimizer saves the same bits back;
* the next 4 steps land on the bits that the code of 544a2bb computes from the same checkpoint. Those bits
  depend on the floating-point path of a few primitives (MKL's vector sqrt, fused multiply-adds), so they are
  recorded per numeric key (tests/fixtures/checkpoints/continuations.json, written by the old code) and
  compared where this machine's key, or its key under ``MKL_CBWR=COMPATIBLE``, was recorded
  (tests/_continuations.py).
"""

from __future__ import annotations

import pytest
import torch

from adam8lib.state_checkpoint import SHAPE_KEY

from tests import _continuations as cont

SAVED = cont.saved()
NAMES = [name for name, _, _ in cont.builder.CONFIGS]


def test_fixture_is_small_and_from_main_before_the_core():
    assert (cont.FIXTURES / "main_checkpoints.pt").stat().st_size < 200_000
    assert SAVED["commit"].startswith("544a2bb")
    assert set(SAVED["configs"]) == set(NAMES)
    for digests in cont.recorded().values():
        assert set(digests) == set(NAMES)
    # the digests stored with the checkpoints are the recorded ones for the key they were made on
    assert {name: c["final_digest"] for name, c in SAVED["configs"].items()} in cont.recorded().values()


def _loaded(name: str, state_dict=None):
    return cont.loaded(name, state_dict, SAVED["configs"])


@pytest.mark.parametrize("name", NAMES)
def test_a_loaded_checkpoint_saves_the_same_bits(name):
    old = SAVED["configs"][name]["state_dict"]
    params, opt = _loaded(name)
    assert opt.state[params[0]]["step"] == cont.builder.STEPS_BEFORE
    new = opt.state_dict()
    assert new["param_groups"] == old["param_groups"]
    assert set(new["state"]) == set(old["state"])
    for index, saved in old["state"].items():
        # today's checkpoints also say the parameter's shape beside flat codes (adam8lib.quantized_state.SHAPE_KEY)
        extra = set(new["state"][index]) - set(saved)
        assert extra <= {SHAPE_KEY} and set(saved) <= set(new["state"][index]), (name, index)
        if extra:
            assert new["state"][index][SHAPE_KEY] == list(params[index].shape)
        for key, value in saved.items():
            mine = new["state"][index][key]
            if torch.is_tensor(value):
                assert mine.dtype == value.dtype and mine.shape == value.shape and torch.equal(mine, value), key
            else:
                assert mine == value, key


@pytest.fixture(scope="module")
def continuations():
    computed, expected, why = cont.continuation_digests(lambda: {name: cont.adam_continuation(name) for name in NAMES})
    if computed is None:
        pytest.skip(why)
    return computed, expected, why


@pytest.mark.parametrize("name", NAMES)
def test_main_checkpoint_resumes_bit_for_bit(name, continuations):
    computed, expected, why = continuations
    assert computed[name] == expected[name], f"{name}: the continuation differs from 544a2bb's ({why})"


def test_the_numeric_key_sees_the_paths_that_change_the_digest():
    # torch's generic kernels (no FMA) change the continuation, and the key with it; both paths are recorded,
    # so a second-machine run compares too (tests/_continuations.py)
    keys = list(cont.recorded())
    assert len(keys) >= 2 and cont.numeric_key() in keys


def test_a_changed_continuation_is_noticed():
    # the digest sees one step more, and one flipped bit of a saved code
    config = SAVED["configs"]["AdamW8bit"]
    first = cont.adam_continuation("AdamW8bit")
    params, opt = _loaded("AdamW8bit")
    cont.builder.run_steps(opt, params, cont.builder.STEPS_BEFORE + 1, cont.builder.STEPS_AFTER + 1)
    assert cont.builder.digest(params, opt) != first
    state_dict = {**config["state_dict"], "state": {k: dict(v) for k, v in config["state_dict"]["state"].items()}}
    codes = state_dict["state"][0]["state1"].clone()
    codes[5] ^= 1
    state_dict["state"][0]["state1"] = codes
    params, opt = _loaded("AdamW8bit", state_dict)
    cont.builder.run_steps(opt, params, cont.builder.STEPS_BEFORE + 1, cont.builder.STEPS_AFTER)
    assert cont.builder.digest(params, opt) != first


def test_the_portable_path_lands_on_a_recorded_key():
    # the path a machine with an unrecorded key takes (Intel's MKL AVX-512 sqrt, say): a child process under
    # MKL_CBWR=COMPATIBLE, whose key and digests must be recorded ones
    child = cont._portable_child()
    assert child["key"] in cont.recorded(), child["key"]
    assert child["digests"] == cont.recorded()[child["key"]]
