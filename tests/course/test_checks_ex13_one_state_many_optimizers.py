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


PROPERTY = "→ property that failed:"


def _property_line(message: str) -> str:
    return next(line for line in message.splitlines() if line.startswith(PROPERTY))


@pytest.mark.parametrize("name, check, words, says", [
    ("lion_minus_gradient", None, "a PLUS between the two terms", "the parameters, from step 1 of 10 on"),
    ("lion_right", "check_beta_up_to_one", "the EMA never moves", "check(group) refusing betas=(0.9, 1.0)"),
    ("lion_right", "check_value_error_for_a_string", "must be refused with a TypeError, not a ValueError",
     "with a TypeError"),
    ("lion_without_return", None, "End update with `return p`", "what update() returns"),
])
def test_lion_failures_state_their_property(name, check, words, says):
    """Issue 51: every 13.1 failure's property line printed 'a property the check names'; it now says which: the
    parameters from which step, which setting check(group) got wrong, what update() returns."""
    from adam8lib.course import checks
    from tests.workbooks.wrong_answers import ex13

    kwargs = {"check": getattr(ex13, check)} if check else {}
    with pytest.raises(AssertionError, match=words) as err:
        checks.check_lion8bit(ex13.lion_class(getattr(ex13, name), **kwargs))
    line = _property_line(str(err.value))
    assert "a property the check names" not in line and says in line, line


def test_lion_string_lr_refused_with_a_value_error_is_named():
    """Issue 51: a check(group) that refuses lr='1e-3' with a ValueError (naming lr) was accepted; the task asks
    for a TypeError for a value of the wrong type."""
    from adam8lib.course import checks
    from tests.workbooks.wrong_answers import ex13

    with pytest.raises(AssertionError, match="a value of the wrong TYPE") as err:
        checks.check_lion8bit(ex13.lion_class(ex13.lion_right, check=ex13.check_value_error_for_a_string))
    assert "raised ValueError" in str(err.value)


def test_lion_state_rebound_in_the_dict_is_named_and_a_copy_into_the_tensor_is_accepted():
    """Issue 51: states['exp_avg'] = new tensor (the fp32 state of the bias never moves) got the generic 'not as any
    of the usual mistakes'; it is named. Copying the new value into the tensor handed, and also putting it in the
    dict, is right and passes."""
    import contextlib
    import io

    from adam8lib.course import checks
    from tests.workbooks.wrong_answers import ex13

    with pytest.raises(AssertionError, match="keeps the tensor it handed your rule") as err:
        checks.check_lion8bit(ex13.lion_class(ex13.lion_state_rebound_in_the_dict, whole_states=True))
    assert "not as any of the usual mistakes" not in str(err.value)
    with contextlib.redirect_stdout(io.StringIO()):
        checks.check_lion8bit(ex13.lion_class(ex13.lion_state_copied_and_put_in_the_dict, whole_states=True))


def test_state_bytes_of_a_3d_v_as_first_axis_plus_the_rest_is_named_and_the_rule_says_each_axis():
    """Issue 51: rank-1 scales of (4, 32, 64) counted as 4 + 32 * 64 got the generic hint, which said 'rows +
    columns for a matrix'; the mistake is named, and the generic hint counts one scale per index of each axis."""
    import math

    from adam8lib.course import checks
    from tests.workbooks.wrong_answers import ex13

    with pytest.raises(AssertionError, match=r"4 \+ 32 \+ 64 = 100") as err:
        checks.check_state_bytes(ex13.bytes_rank1_first_axis_and_the_rest)
    assert "first axis by the rest flattened" in str(err.value)

    def odd(shape, stored_as, state_format):  # a mistake of no listed kind: the generic hint
        right = ex13.bytes_right(shape, stored_as, state_format)
        return right + 1 if math.prod(shape) == 4100 else right

    with pytest.raises(AssertionError) as err:
        checks.check_state_bytes(odd)
    assert "4 + 32 + 64 = 100 scales" in str(err.value) and "rows + columns" not in str(err.value)


def test_lion_flips_decoded_state_left_flat_says_so_not_keepdim():
    """Issue 51: a decoded m left flat crashed on 'size of tensor a (256) must match ... (16384)' with the hint
    'check which axis you reduced (keepdim)', though nothing was reduced."""
    from adam8lib.course import checks
    from tests.workbooks.wrong_answers import ex13

    with pytest.raises(AssertionError, match="comes back flat unless it is given m's shape") as err:
        checks.check_lion_flips(ex13.flips_decode_not_reshaped)
    assert "keepdim" not in str(err.value)
    assert sum(line.startswith("Hint:") for line in str(err.value).splitlines()) == 1


def test_lion_flips_names_a_2d_m_handed_to_quantize():
    """Issue 51 (a fresh cold learner): the 2-D m handed to quantize raises inside quantize, before anything is
    combined: the hint says quantize takes the values flat, not 'reshape the stored m'."""
    from adam8lib.course import checks
    from tests.workbooks.wrong_answers import ex13

    for wrong in (ex13.flips_decoded_left_flat, ex13.flips_quantize_given_2d):
        with pytest.raises(AssertionError, match="quantize takes the values flat") as err:
            checks.check_lion_flips(wrong)
        assert "reshape the stored m" not in str(err.value)


def test_lion_flips_names_a_small_m_left_uncoded():
    from adam8lib.course import checks
    from tests.workbooks.wrong_answers import ex13

    with pytest.raises(AssertionError, match="code m whatever its size") as err:
        checks.check_lion_flips(ex13.flips_small_m_uncoded)
    assert "positive or not" not in str(err.value)


def test_lion_flips_with_a_reduced_axis_keeps_the_keepdim_hint():
    """Where both mismatched sizes are m's own axis sizes (an axis dropped by a reduction), keepdim is the hint."""
    import torch

    from adam8lib.course import checks
    from tests.workbooks.wrong_answers import ex13

    def lion_flips(m, g, beta1, state_format):
        stored = ex13._stored(m, state_format)
        scale = stored.abs().amax(dim=1)  # shape (rows,), no keepdim
        return torch.sign(beta1 * stored / scale + (1 - beta1) * g) != torch.sign(beta1 * m + (1 - beta1) * g)

    with pytest.raises(AssertionError, match="keepdim"):
        checks.check_lion_flips(lion_flips)


def test_lion_flips_with_beta1_hard_coded_is_named():
    """Issue 51: beta1 written as 0.99 in place of the argument got 're-read which moment format codes m'."""
    from adam8lib.course import checks
    from tests.workbooks.wrong_answers import ex13

    with pytest.raises(AssertionError, match="does not change with beta1") as err:
        checks.check_lion_flips(ex13.flips_beta1_hard_coded)
    assert "beta1 = 0.99, a fixed value" in str(err.value)
