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
