"""The low-bit Adam classes decide by what a state format stores, not by its name (issue 35, item 1).

* No ``"8bit"`` special case in ``optim.py`` or ``distributed.py``: the step path, the backends, the
  checkpoint fingerprint and the DCP form follow from the format's data
  (:attr:`~adam8lib.formats.StateFormat.byte_codes_into_maps`, its sign rule, its block sizes). A
  format made by a user with the 8-bit format's moments under another name is stepped, saved and
  refused exactly as ``"8bit"``; the same moments without the keep-sign rule take the reference step.
* The block size has one place, the format: every group shows it, none may change it (constructor,
  ``add_param_group``, ``load_state_dict``; ``step`` in tests/test_step_faults.py).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path

import pytest
import torch

import adam8lib
from adam8lib import Adam8bit, AdamW4bit
from adam8lib.formats import FORMATS, StateFormat
from adam8lib.optim import MAPS_KEY, LowBitAdam, backends_of, map_kernels_step

EIGHT = FORMATS["8bit"]
MINE = StateFormat("mine", EIGHT.m, EIGHT.v, "the 8-bit moments under another name")
NEAREST = StateFormat("nearest8", dataclasses.replace(EIGHT.m, keep_sign=False),
                      dataclasses.replace(EIGHT.v, keep_sign=False))


def test_no_format_name_is_a_special_case_in_the_optimizer_or_its_distributed_paths():
    root = Path(adam8lib.__file__).parent
    for name in ("optim.py", "distributed.py"):
        code = (root / name).read_text()
        assert not re.search(r"""(==|!=)\s*["']8bit["']|["']8bit["']\s*(==|!=)""", code), name
        assert not re.search(r"""\.name\s*(==|!=|in)\s""", code), name


def test_what_decides_is_data_of_the_format():
    assert EIGHT.byte_codes_into_maps and MINE.byte_codes_into_maps and NEAREST.byte_codes_into_maps
    assert not any(FORMATS[n].byte_codes_into_maps for n in ("4bit", "4bit-naive", "fp8"))
    assert map_kernels_step(EIGHT) and map_kernels_step(MINE) and not map_kernels_step(NEAREST)
    assert "cpu_fast" in backends_of(MINE) and "cpu_fast" not in backends_of(FORMATS["fp8"])


def test_every_layout_predicate_is_spelled_once_on_the_format():
    """What the 8-bit Adam kernels step, what the rule templates step and "one block size" are properties of the
    format; the registry, the optimizer and the kernels' checks read them (no copy of the conditions elsewhere)."""
    from adam8lib import kernels
    from adam8lib.kernels import rule_args
    from adam8lib.rules import LionRule

    split = StateFormat("split", EIGHT.m, dataclasses.replace(EIGHT.v, blocksize=128))
    fp8 = FORMATS["fp8"]
    assert not split.one_blocksize and not split.steps_in_map_kernels and not split.one_byte_per_element
    for fmt in [*FORMATS.values(), MINE, NEAREST, split]:
        assert map_kernels_step(fmt) == fmt.steps_in_map_kernels
        assert rule_args.accepts(fmt) == fmt.one_byte_per_element
        assert ("cpu_fast" in backends_of(fmt)) == fmt.steps_in_map_kernels
        assert (kernels.find_step(LionRule(), fmt, "auto", "cpu") is not None) == (
            fmt.one_byte_per_element and "cpu" in kernels.available_backends())
    assert fp8.one_byte_per_element and not fp8.steps_in_map_kernels
    root = Path(adam8lib.__file__).parent
    for path in root.rglob("*.py"):
        if path.name == "formats.py" or "course" in path.parts:
            continue
        code = path.read_text()
        assert not re.search(r"\bm\.blocksize\s*[!=]=\s*\S*\bv\.blocksize", code), path


def _run(fmt, backend, steps=3):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in ((33, 64), (1500,), (5,))]
    opt = LowBitAdam(params, lr=1e-2, weight_decay=0.1, state_format=fmt, backend=backend, min_8bit_size=1000)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return opt, params


def _same(a, b):
    (oa, pa), (ob, pb) = a, b
    for x, y in zip(pa, pb):
        assert torch.equal(x.detach(), y.detach())
        assert set(oa.state[x]) == set(ob.state[y])
        for key, value in oa.state[x].items():
            assert (torch.equal(value, ob.state[y][key]) if torch.is_tensor(value) else value == ob.state[y][key]), key


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_a_user_format_with_the_8bit_moments_steps_and_saves_as_8bit(backend):
    mine, eight = _run(MINE, backend), _run("8bit", backend)
    _same(mine, eight)
    sd_mine, sd_eight = mine[0].state_dict(), eight[0].state_dict()
    assert [s.get(MAPS_KEY) for s in sd_mine["state"].values()] == [s.get(MAPS_KEY) for s in sd_eight["state"].values()]
    other = LowBitAdam(eight[1], state_format=MINE, min_8bit_size=1000, lr=1e-2, weight_decay=0.1)
    other.load_state_dict(copy.deepcopy(sd_eight))  # the same codes: it loads
    for p in eight[1]:
        for key, value in eight[0].state[p].items():
            assert (torch.equal(other.state[p][key], value) if torch.is_tensor(value) else other.state[p][key] == value)


def test_the_8bit_moments_without_the_sign_rule_take_the_reference_step():
    """The map-code kernels keep signs; a format that does not is stepped by the format's reference step
    (decode, the fp32 rule, nearest code) and refuses those kernels."""
    with pytest.raises(ValueError, match="has no step for its states"):
        LowBitAdam([torch.nn.Parameter(torch.zeros(3))], state_format=NEAREST, backend="cpu_fast")
    opt, params = _run(NEAREST, "torch")
    ref, rparams = _run(NEAREST, "auto")
    _same((opt, params), (ref, rparams))
    m = NEAREST.m.dequantize(opt.state[params[0]]["state1"], opt.state[params[0]]["absmax1"], (33, 64))
    codes, _ = NEAREST.m.quantize(m, (33, 64))
    assert torch.equal(codes, opt.state[params[0]]["state1"])  # stored as the nearest codes


# ---------------------------------------------------------------------- the block size: one place
@pytest.mark.parametrize("cls", [Adam8bit, AdamW4bit])
def test_the_block_size_lives_in_the_format_and_every_group_shows_it(cls):
    p, q = torch.nn.Parameter(torch.zeros(5000)), torch.nn.Parameter(torch.zeros(5000))
    opt = cls([p], blocksize=512)
    assert opt.format.blocksize == opt.format.m.blocksize == opt.format.v.blocksize == 512
    assert opt.param_groups[0]["blocksize"] == 512
    with pytest.raises(ValueError, match=r"blocksize=1024.*setting of the whole optimizer"):
        cls([{"params": [p], "blocksize": 1024}])
    with pytest.raises(ValueError, match=r"blocksize=256.*setting of the whole optimizer"):
        opt.add_param_group({"params": [q], "blocksize": 256})
    assert len(opt.param_groups) == 1
    opt.add_param_group({"params": [q]})
    assert opt.param_groups[1]["blocksize"] == 512


def test_a_checkpoint_with_another_block_size_is_refused_naming_it():
    p = torch.nn.Parameter(torch.randn(5000))
    saved = Adam8bit([p], blocksize=2048)
    p.grad = torch.randn(5000)
    saved.step()
    opt = Adam8bit([p])
    p.grad = torch.randn(5000)
    opt.step()
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(ValueError, match=r"blocksize=2048.*build the optimizer with blocksize=2048"):
        opt.load_state_dict(saved.state_dict())
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"]
    assert all(torch.equal(after["state"][0][k], before["state"][0][k]) for k in ("state1", "absmax1"))
    Adam8bit([p], blocksize=2048).load_state_dict(saved.state_dict())  # the block size that saved it
