"""Tests of adam8lib.course.plots (the lessons' shared plotting helpers)."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from adam8lib.course.plots import error_by_decade, levels_per_decade, stacked_bars  # noqa: E402
from adam8lib.quant import dequantize_blocks, dynamic_map, linear_map, quantize_blocks  # noqa: E402


def test_error_by_decade_counts_and_errors():
    x = torch.tensor([1.0, -0.5, 0.05, 0.02, 0.003, 0.0, 1e-9])
    x_hat = torch.tensor([1.0, -0.4, 0.05, 0.0, 0.0033, 7.0, 0.0])
    d = error_by_decade(x, x_hat, lowest=-4)
    assert d.decades == [-4, -3, -2, -1]
    # 6 non-zero entries: 1e-9 is lumped into the lowest decade, x = 0 is left out
    assert d.share == pytest.approx([1 / 6, 1 / 6, 2 / 6, 2 / 6])
    assert d.median_error[3] == pytest.approx(0.1)  # errors 0 and 0.2
    assert d.median_error[2] == pytest.approx(0.5)  # errors 0 and 1 (0.02 -> 0)
    assert d.median_error[1] == pytest.approx(0.1)
    assert d.zeroed == pytest.approx([1.0, 0.0, 0.5, 0.0])


def test_error_by_decade_empty_decade_is_nan():
    d = error_by_decade(torch.tensor([1.0, 0.5]), torch.tensor([1.0, 0.5]), lowest=-3)
    assert math.isnan(d.median_error[0]) and math.isnan(d.zeroed[0])
    assert d.share == [0.0, 0.0, 1.0]


def test_dynamic_map_error_is_flatter_than_linear():
    # the lesson-05 claim, on a log-uniform sample: linear zeroes the small decades, dynamic does not
    torch.manual_seed(0)
    x = 10 ** (-5 * torch.rand(20_000))
    n = x.numel()

    def decades(code):
        codes, absmax = quantize_blocks(x, code, n)  # one block: a single absmax for the tensor
        return error_by_decade(x, dequantize_blocks(codes, absmax, code, n), lowest=-5)

    linear, dynamic = decades(linear_map(False)), decades(dynamic_map(False))
    assert linear.zeroed[0] > 0.99 and linear.median_error[-1] < 0.01
    assert max(dynamic.zeroed) == 0.0 and max(dynamic.median_error) < 0.1


@pytest.mark.parametrize(
    "x, x_hat, lowest, exc",
    [
        ([1.0, 2.0], [1.0], -3, ValueError),
        ([0.0, 0.0], [0.0, 0.0], -3, ValueError),
        ([1.0, float("inf")], [1.0, 1.0], -3, ValueError),
        ([1.0], [1.0], 0, ValueError),
        ([1.0], [1.0], True, ValueError),
    ],
)
def test_error_by_decade_rejects_bad_input(x, x_hat, lowest, exc):
    with pytest.raises(exc):
        error_by_decade(torch.tensor(x), torch.tensor(x_hat), lowest=lowest)
    with pytest.raises(TypeError):
        error_by_decade([1.0], torch.tensor([1.0]))


def test_stacked_bars_heights_and_totals():
    fig, ax = plt.subplots()
    parts = {"weights": [4.0, 4.0], "states": [8.0, 2.0]}
    containers = stacked_bars(ax, ["AdamW", "8-bit"], parts, total_format="{:.1f}")
    assert len(containers) == 2
    tops = [rect.get_y() + rect.get_height() for rect in containers[-1]]
    assert tops == [12.0, 6.0]
    assert [t.get_text() for t in ax.texts] == ["12.0", "6.0"]
    with pytest.raises(ValueError):
        stacked_bars(ax, ["a"], {"x": [1.0, 2.0]})
    with pytest.raises(ValueError):
        stacked_bars(ax, ["a"], {"x": [-1.0]})
    with pytest.raises(ValueError):
        stacked_bars(ax, ["a"], {})
    plt.close(fig)


def test_levels_per_decade_counts_against_hand_counted_maps():
    # 1, 0.5, 0.2 in the top decade; 0.09 and 0.05 in the second; 0.0002 in the fourth; 0, -1, inf left out
    levels = torch.tensor([1.0, 0.5, 0.2, 0.09, 0.05, 2e-4, 0.0, -1.0, float("inf")])
    assert levels_per_decade(levels, 5) == [3, 2, 0, 1, 0]
    assert levels_per_decade(levels * 448, 5) == [3, 2, 0, 1, 0]  # relative to the largest level


def test_levels_per_decade_of_the_dynamic_map_and_e4m3():
    from adam8lib.quant import dynamic_map

    assert levels_per_decade(dynamic_map(True)) == [65, 32, 16, 8, 4, 2, 1]
    assert levels_per_decade(dynamic_map(False)) == [129, 64, 32, 16, 8, 4, 2]
    e4m3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    assert levels_per_decade(e4m3) == [27, 27, 26, 27, 17, 2, 0]  # 126 positive finite values, 2^-9 .. 448
    assert sum(levels_per_decade(e4m3, 12)) == 126


def test_levels_per_decade_rejects_bad_input():
    with pytest.raises(TypeError):
        levels_per_decade([1.0, 0.5])
    with pytest.raises(TypeError):
        levels_per_decade(torch.tensor([1, 2]))
    with pytest.raises(ValueError):
        levels_per_decade(torch.tensor([1.0]), 0)
    with pytest.raises(ValueError):
        levels_per_decade(torch.tensor([0.0, -1.0]))
