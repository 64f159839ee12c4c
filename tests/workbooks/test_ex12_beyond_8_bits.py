"""Workbook 12 · beyond 8 bits: unit tests of the learner's functions (run: -m ex12)."""

import pytest
import torch

from adam8lib.formats import FORMATS, pack_nibbles, rank1_scales
from adam8lib.quant import dynamic_map

pytestmark = pytest.mark.ex12


@pytest.mark.parametrize("n", [0, 1, 2, 3, 128, 1001])
def test_pack_then_unpack_is_the_identity_and_matches_the_library(workbook, n):
    wb = workbook("12")
    codes = torch.randint(0, 16, (n,), generator=torch.Generator().manual_seed(n), dtype=torch.uint8)
    packed = wb.pack_nibbles(codes)
    assert packed.dtype == torch.uint8 and packed.numel() == (n + 1) // 2
    assert torch.equal(packed, pack_nibbles(codes)) if n else packed.numel() == 0
    assert torch.equal(wb.unpack_nibbles(packed, n), codes)


def test_zero_point_victims_are_what_naive_four_bit_loses_and_the_fix_keeps(workbook):
    """The learner's victims are exactly the entries that the "4bit-naive" format decodes to v = 0 while its
    decoded m is not 0; the "4bit" format (a map without zero) has none. The same at a tiny scale of v."""
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(64, 128, generator=gen) * torch.logspace(-3, 0, 128)
    naive = FORMATS["4bit-naive"]
    for scale in (1.0, 1e-6):
        m, v = (0.1 * g).reshape(-1), (scale * 0.001 * g * g).reshape(-1)
        got = workbook("12").zero_point_victims(m, v, dynamic_map(True, 3, 4), dynamic_map(False, 3, 4), 128)
        state = naive.new_state((64, 128), torch.device("cpu"))
        naive.encode_(state, m, v, (64, 128))
        m_hat, v_hat = naive.decode(state, (64, 128))
        assert torch.equal(got, (v_hat == 0) & (m_hat != 0)) and int(got.sum()) > 1000
        assert bool(((m != 0) & (m_hat == 0)).any())  # some m are too small for the 4-bit map: no victims there
    fixed = FORMATS["4bit"]
    state = fixed.new_state((64, 128), torch.device("cpu"))
    fixed.encode_(state, m, v, (64, 128))
    assert not bool((fixed.v.dequantize(state["state2"], state["absmax2"], (64, 128)) == 0).any())


@pytest.mark.parametrize("shape", [(4, 5), (64, 96), (1, 7), (7, 1)])
def test_rank1_scale_bounds_every_entry_and_uses_the_library_maxima(workbook, shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
    scale = workbook("12").rank1_scale(x)
    rows, cols = rank1_scales(x)
    assert torch.equal(scale, torch.minimum(rows[:, None], cols[None, :]))
    assert bool((x.abs() <= scale).all())  # so x / scale lies in [-1, 1]: every entry fits the map


def test_stochastic_round_is_unbiased_and_seeded(workbook):
    fn = workbook("12").stochastic_round
    x = torch.linspace(1.0, 2.0, 5001)
    means = torch.stack([fn(x, torch.Generator().manual_seed(s)).float() for s in range(200)]).mean(0)
    step = 2.0**-7  # bf16's spacing in [1, 2)
    assert float((means - x).abs().max()) < 5 * step / (4 * 200) ** 0.5 + 1e-7  # within 5 standard errors
    assert torch.equal(fn(x, torch.Generator().manual_seed(1)), fn(x, torch.Generator().manual_seed(1)))
