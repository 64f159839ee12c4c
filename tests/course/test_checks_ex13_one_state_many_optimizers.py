"""Check cells of workbook 13 (ex13_one_state_many_optimizers): a plausible wrong answer gets the hint that names it."""

from __future__ import annotations


def test_lion_flips_positive_or_not_is_named():
    """'x > 0' in place of the sign misses an update that goes from -1 to 0 (an m coded 0 with g = 0)."""
    import pytest
    import torch

    from adam8lib.course import checks
    from adam8lib.formats import FORMATS

    def lion_flips(m, g, beta1, state_format):
        fmt = FORMATS[state_format].m
        codes, scales = fmt.quantize(m.reshape(-1).float(), tuple(m.shape))
        stored = fmt.dequantize(codes, scales, tuple(m.shape)).view(m.shape)
        return ((beta1 * stored + (1 - beta1) * g) > 0) != ((beta1 * m + (1 - beta1) * g) > 0)

    with pytest.raises(AssertionError, match="positive or not"):
        checks.check_lion_flips(lion_flips)
