"""One map on every machine: the quantization maps have the same bits under every CPU vector
path, and checkpoints name the maps their codes index.

torch.linspace rounds differently on torch's generic and vectorized CPU kernels
(``ATEN_CPU_CAPABILITY=default`` vs AVX2/AVX-512), so a map built with it would change with the
machine. adam8lib builds its maps from scalars (each grid point rounded once); these tests run
the builders in fresh processes under two capabilities and compare the bits, and move a
checkpoint from one to the other.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from fractions import Fraction

import numpy
import pytest
import torch
from torch import nn

from adam8lib import Adam8bit, AdamW8bit
from adam8lib.optim import MAPS_KEY
from adam8lib.quant import (
    MAP_FINGERPRINTS,
    dequantize_blocks,
    dynamic_map,
    exact_linspace,
    linear_map,
    map_fingerprint,
)
from adam8lib.variants import Adam8bitVariant
from tests._bnb import bnbF

#: The maps under test, by the names MAP_FINGERPRINTS gives them.
BUILDERS = {
    "dynamic, signed, 8 bits": lambda: dynamic_map(True),
    "dynamic, unsigned, 8 bits": lambda: dynamic_map(False),
    "dynamic, signed, 4 bits": lambda: dynamic_map(True, 3, 4),
    "dynamic, unsigned, 4 bits": lambda: dynamic_map(False, 3, 4),
    "linear, signed, 8 bits": lambda: linear_map(True),
    "linear, unsigned, 8 bits": lambda: linear_map(False),
}


def native_capability() -> str:
    return torch.backends.cpu.get_cpu_capability().lower()


def run_under(capability: str, code: str, *args: str) -> dict:
    """Run ``code`` in a fresh Python with torch's CPU kernels forced to ``capability``; it prints
    one JSON object as its last line, which is returned."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env, capture_output=True,
                         text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


FINGERPRINTS = """
    import json, torch
    from adam8lib.quant import dynamic_map, linear_map, map_fingerprint
    maps = {"dynamic, signed, 8 bits": dynamic_map(True), "dynamic, unsigned, 8 bits": dynamic_map(False),
            "dynamic, signed, 4 bits": dynamic_map(True, 3, 4), "dynamic, unsigned, 4 bits": dynamic_map(False, 3, 4),
            "linear, signed, 8 bits": linear_map(True), "linear, unsigned, 8 bits": linear_map(False)}
    grid = torch.cat([torch.linspace(0.1, 1.0, 2**i + 1) for i in range(8)] + [torch.linspace(-1.0, 1.0, 256)])
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(),
                      "adam8lib": {k: map_fingerprint(v) for k, v in maps.items()},
                      "torch.linspace": map_fingerprint(grid)}))
"""


@pytest.fixture(scope="module")
def two_capabilities():
    """The fingerprints computed under torch's generic kernels and under this CPU's own."""
    if native_capability() == "default":
        pytest.skip("this CPU has no vector path beyond torch's generic kernels (no AVX2): one configuration only")
    return run_under("default", FINGERPRINTS), run_under(native_capability(), FINGERPRINTS)


def test_maps_have_identical_bits_under_two_cpu_capabilities(two_capabilities):
    generic, native = two_capabilities
    assert generic["capability"] == "DEFAULT" and native["capability"] != "DEFAULT"
    # the configurations really round differently: torch.linspace's grid points differ ...
    assert generic["torch.linspace"] != native["torch.linspace"]
    # ... and adam8lib's maps do not, and they are the canonical ones
    assert generic["adam8lib"] == native["adam8lib"] == MAP_FINGERPRINTS
    # (and this process agrees)
    assert {name: map_fingerprint(build()) for name, build in BUILDERS.items()} == MAP_FINGERPRINTS


def _round_once(x: Fraction) -> numpy.float32:
    """An independent rounding to float32 for values that a float64 holds exactly."""
    assert Fraction(float(x)) == x, "test values are exact in float64"
    return numpy.float32(float(x))


@pytest.mark.parametrize("start, end, steps", [(0.1, 1.0, n) for n in (2, 3, 5, 9, 17, 33, 65, 129, 257)]
                         + [(-1.0, 1.0, 256), (0.0, 1.0, 256), (-3.7, 12.25, 1001)])
def test_exact_linspace_rounds_torchs_formula_once(start, end, steps):
    start32, end32 = numpy.float32(start), numpy.float32(end)
    step32 = (end32 - start32) / numpy.float32(steps - 1)
    want = [_round_once(Fraction(float(start32)) + Fraction(float(step32)) * k) if k < steps // 2 else
            _round_once(Fraction(float(end32)) - Fraction(float(step32)) * (steps - 1 - k)) for k in range(steps)]
    assert exact_linspace(start, end, steps) == [float(w) for w in want]
    # within 2 ulp of what any torch kernel computes here
    torch_grid = torch.linspace(start, end, steps, dtype=torch.float32)
    ours = torch.tensor(exact_linspace(start, end, steps))
    ulp = (torch.nextafter(ours.abs(), torch.tensor(float("inf"))) - ours.abs())
    assert bool(((torch_grid - ours).abs() <= 2 * ulp).all())


def test_dynamic_map_equals_bitsandbytes_where_torch_rounds_linspace_once():
    """bitsandbytes builds its map with torch.linspace: bit-identical where torch's kernel rounds
    each grid point once (AVX2/AVX-512: this is checked, not assumed), within 2 ulp elsewhere."""
    rounds_once = all(torch.linspace(0.1, 1.0, n).tolist() == exact_linspace(0.1, 1.0, n) for n in (33, 65, 129, 257))
    for signed in (True, False):
        ours, theirs = dynamic_map(signed), bnbF.create_dynamic_map(signed=signed).float()
        if rounds_once:
            assert torch.equal(ours, theirs)
        else:
            ulp = torch.nextafter(ours.abs(), torch.tensor(float("inf"))) - ours.abs()
            assert bool(((ours - theirs).abs() <= 2 * ulp).all()) and not torch.equal(ours, theirs)


@pytest.mark.parametrize("bits, max_exponent_bits", [(8, 6), (4, 2), (0, -1), (True, 7)])
def test_dynamic_map_rejects_layouts_it_does_not_build(bits, max_exponent_bits):
    with pytest.raises(ValueError, match="bits"):
        dynamic_map(True, max_exponent_bits, bits)


def test_four_bit_maps_equal_bitsandbytes_nonzero_entries():
    for signed in (True, False):
        ours = dynamic_map(signed, 3, 4)
        assert ours.shape == (16,) and float(ours[7 if signed else 0]) == 0.0 and float(ours[-1]) == 1.0
        # bitsandbytes pads its 4-bit map to 256 entries with zeros
        assert torch.equal(ours, torch.unique(bnbF.create_dynamic_map(signed, 3, 4).float()))


# ------------------------------------------------------------------ checkpoints
def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 4))


def _train(model, opt, steps, seed=1):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(16, 64, generator=gen), torch.randint(0, 4, (16,), generator=gen)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def _decoded(opt) -> dict[str, list[float]]:
    """Every 8-bit state decoded with the optimizer's own maps, as lists of floats."""
    out = {}
    for i, (p, st) in enumerate(opt.state.items()):
        if "state1" in st:
            for codes, absmax, qmap, name in (("state1", "absmax1", opt.qmap1, "m"), ("state2", "absmax2", opt.qmap2, "v")):
                out[f"{i}.{name}"] = dequantize_blocks(st[codes], st[absmax], qmap, opt.param_groups[0]["blocksize"]).tolist()
    return out


SAVE = """
    import json, sys, torch
    from tests.test_canonical_maps import _model, _train, _decoded
    from adam8lib import AdamW8bit
    model = _model()
    opt = AdamW8bit(model.parameters(), lr=1e-2, backend="torch")
    _train(model, opt, 7)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, sys.argv[1])
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "decoded": _decoded(opt)}))
"""

LOAD = """
    import json, sys, torch
    from tests.test_canonical_maps import _model, _decoded
    from adam8lib import AdamW8bit
    ckpt = torch.load(sys.argv[1], weights_only=True)
    model = _model(seed=5)
    model.load_state_dict(ckpt["model"])
    opt = AdamW8bit(model.parameters(), lr=3.0)
    opt.load_state_dict(ckpt["opt"])
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "decoded": _decoded(opt)}))
"""


def test_checkpoint_saved_under_one_capability_decodes_to_the_same_values_under_another(tmp_path):
    if native_capability() == "default":
        pytest.skip("this CPU has no vector path beyond torch's generic kernels (no AVX2): one configuration only")
    path = str(tmp_path / "ckpt.pt")
    for saver, loader in (("default", native_capability()), (native_capability(), "default")):
        saved = run_under(saver, SAVE, path)
        loaded = run_under(loader, LOAD, path)
        assert saved["capability"] != loaded["capability"]
        assert saved["decoded"] and loaded["decoded"] == saved["decoded"]  # exactly the values it had when saved
        states = torch.load(path, weights_only=True)["opt"]["state"].values()
        assert {s.get(MAPS_KEY) for s in states if "state1" in s} == {MAP_PAIR}


#: The fingerprint of Adam8bit's two maps.
MAP_PAIR = map_fingerprint(dynamic_map(True), dynamic_map(False))


def _eight_bit(sd: dict) -> list[dict]:
    return [s for s in sd["state"].values() if "state1" in s]


def _trained(cls=AdamW8bit, **kwargs):
    model = _model()
    opt = cls(model.parameters(), lr=1e-2, **kwargs)
    _train(model, opt, 3)
    return model, opt


def _same_state(a: dict, b: dict) -> bool:
    return a["param_groups"] == b["param_groups"] and all(
        torch.equal(v, b["state"][k][key]) if torch.is_tensor(v) else v == b["state"][k][key]
        for k in a["state"] for key, v in a["state"][k].items())


def test_state_dict_names_its_maps_and_loads_where_they_match():
    _, opt = _trained()
    sd = opt.state_dict()
    assert [s[MAPS_KEY] for s in _eight_bit(sd)] == [MAP_PAIR, MAP_PAIR] == [map_fingerprint(opt.qmap1, opt.qmap2)] * 2
    assert all(MAPS_KEY not in s for s in sd["state"].values() if "state1" not in s)  # fp32 states index no map
    assert all(MAPS_KEY not in s for s in opt.state.values())  # the live states hold tensors and the step only
    _, other = _trained()
    other.load_state_dict(copy.deepcopy(sd))
    assert all(MAPS_KEY not in s for s in other.state.values()) and _same_state(other.state_dict(), sd)


def test_checkpoint_of_other_maps_is_refused_and_changes_nothing():
    _, linear = _trained(Adam8bitVariant, quantization="linear", weight_decay=0.01)
    _, opt = _trained()
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(ValueError, match=r"fingerprint '[0-9a-f]{16}'.*dynamic, signed, 8 bits / dynamic, unsigned"):
        opt.load_state_dict(linear.state_dict())
    forged = copy.deepcopy(before)
    _eight_bit(forged)[1][MAPS_KEY] = "0" * 16  # one parameter's states: the whole load is refused
    with pytest.raises(ValueError, match="every state would change"):
        opt.load_state_dict(forged)
    _eight_bit(forged)[1][MAPS_KEY] = 7
    with pytest.raises(ValueError, match="must be a string"):
        opt.load_state_dict(forged)
    assert _same_state(opt.state_dict(), before)


def test_checkpoint_without_a_map_fingerprint_is_refused_with_what_to_do():
    _, opt = _trained()
    legacy = copy.deepcopy(opt.state_dict())
    for s in _eight_bit(legacy):
        del s[MAPS_KEY]
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(ValueError, match="no 'qmap_fingerprint'") as err:
        opt.load_state_dict(copy.deepcopy(legacy))
    assert _same_state(opt.state_dict(), before)
    # the message says exactly what to set, and doing it loads the checkpoint
    assert repr(MAP_PAIR) in str(err.value)
    for s in _eight_bit(legacy):
        s[MAPS_KEY] = MAP_PAIR
    opt.load_state_dict(legacy)


def test_checkpoint_of_only_fp32_states_needs_no_maps():
    model = nn.Linear(8, 2)  # every tensor under min_8bit_size: no codes anywhere
    opt = Adam8bit(model.parameters())
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    sd = opt.state_dict()
    assert all(MAPS_KEY not in s for s in sd["state"].values())
    Adam8bit(model.parameters()).load_state_dict(sd)
