"""Check cells of workbook 13 (ex13_one_state_many_optimizers): a plausible wrong answer gets the hint that names it."""

from __future__ import annotations

import pytest


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


def test_lion_gradient_changed_in_place_is_named_even_when_the_numbers_are_right():
    """A rule that scales g in place inside the EMA steps and stores exactly as Lion does, but leaves the caller a
    changed gradient: the statement forbids it, and the check says so in words."""
    import pytest
    import torch

    from adam8lib.course import checks
    from tests.workbooks.wrong_answers.ex13 import _hyper, lion_class

    def update(p, g, m, group):
        beta1, beta2, lr, wd = _hyper(group)
        p.mul_(1 - lr * wd)
        p.add_(torch.sign(beta1 * m + (1 - beta1) * g), alpha=-lr)
        m.mul_(beta2).add_(g.mul_(1 - beta2))
        return p

    with pytest.raises(AssertionError, match="you change the gradient in place"):
        checks.check_lion8bit(lion_class(update))


@pytest.mark.parametrize("name, words", [
    ("lion_betas_swapped", "your two betas are swapped"),
    ("lion_sign_of_old_m", "your parameters did not move"),
    ("lion_sign_of_g", "follows the current gradient alone"),
    ("lion_sign_of_new_m", "the sign of the momentum after its update"),
])
def test_lion_direction_mistakes_are_named(name, words):
    """Swapped betas, sign(m) (old or updated) and sign(g) in place of the interpolation: each named, not generic."""
    from adam8lib.course import checks
    from tests.workbooks.wrong_answers import ex13

    with pytest.raises(AssertionError, match=words) as err:
        checks.check_lion8bit(ex13.lion_class(getattr(ex13, name)))
    assert "not as any of the usual mistakes" not in str(err.value)
