"""Check cells of workbook 14 (ex14_the_whole_bill): a plausible wrong answer gets the hint that names it."""

from __future__ import annotations


def test_release_with_register_hook_that_never_sees_a_grad_is_named():
    """Tensor.register_hook runs before p.grad is written: a hook that only calls step() steps nothing."""
    import pytest

    from adam8lib.course import checks

    def release_by_hand(model, make_optimizer):
        handles = []
        for p in model.parameters():
            if p.requires_grad:
                opt = make_optimizer([p])

                def hook(grad, opt=opt, p=p):
                    opt.step()
                    p.grad = None

                handles.append(p.register_hook(hook))
        return handles

    with pytest.raises(AssertionError, match="register_post_accumulate_grad_hook"):
        checks.check_release_by_hand(release_by_hand)


def test_bill_peak_as_the_sum_of_each_parts_maximum_is_named():
    """The first steps' parts peak at different moments (the gradients in backward, the state once made): their
    maxima added are above the real peak, and the check names that (it passed every row made after a first step)."""
    import pytest

    from adam8lib.course import checks
    from tests.workbooks.wrong_answers import ex14

    with pytest.raises(AssertionError, match="you added each part's own maximum"):
        checks.check_bill_row(ex14.bill_peak_as_sum_of_maxima)


def test_bill_read_at_another_moment_is_named():
    """Weights and state read after the step, and a largest gradient read before backward (None): each named."""
    import pytest

    from adam8lib.course import checks
    from tests.workbooks.wrong_answers import ex14

    with pytest.raises(AssertionError, match="you read it after the step"):
        checks.check_bill_row(ex14.bill_state_read_after_the_step)
    with pytest.raises(AssertionError, match="you say no gradient is alive at the bill's peak"):
        checks.check_bill_row(ex14.bill_largest_read_before_backward)


def test_bill_with_floor_division_is_named_and_an_int_is_refused():
    """Issue 51: values computed with // ('gradients' 3 for 3.9992) got the generic hint, and an int 4 for
    'weights' was accepted though the task asks for floats."""
    import pytest

    from adam8lib.course import checks
    from tests.workbooks.wrong_answers import ex14

    with pytest.raises(AssertionError, match="rounded down to a whole number: floor division") as err:
        checks.check_bill_row(ex14.bill_floor_division)
    assert "'gradients' is 3," in str(err.value)
    with pytest.raises(AssertionError, match="'weights' is the int 4, expected a Python float"):
        checks.check_bill_row(ex14.bill_weights_as_an_int)
