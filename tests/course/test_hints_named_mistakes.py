"""Levels 1 and 3 of ``hint("NN.k")`` on the mistakes cold learners planted (issue 51, item 3): each aims at the
learner's own mistake, or — when the check's hint only restates the rule — says what the check saw and how to find
the mistake, never a neighbouring mistake picked from the rule's words.

Each case builds its wrong answer here, runs the workbook's check on it and reads levels 1–3. The texts the cold
learners found misleading are quoted, and must be gone.
"""

from __future__ import annotations

import contextlib
import io
import math

import pytest
import torch
from torch import nn

from adam8lib.course import checks
from adam8lib.course.checks._common import last_failure
from adam8lib.course.hint_text import EXERCISES, LOCATE, RULES
from adam8lib.course.hints import NO_MISTAKE_NAMED, UNNAMED, aim, next_hint, restates_the_rule
from adam8lib.formats import FORMATS
from adam8lib.quant import dequantize_blocks, quantize_blocks
from tests.course._hint_state import forget_hints, fresh_hints  # noqa: F401 (fresh_hints: autouse)

WHERE = "Where your last check failed:"


def _levels(exercise, check, answer) -> tuple[str, str, str]:
    """Run ``check(answer)`` (it must fail and leave a record), then the bodies of levels 1, 2 and 3."""
    with pytest.raises(AssertionError), contextlib.redirect_stdout(io.StringIO()):
        check(answer)
    assert last_failure(exercise) is not None
    texts = [next_hint(exercise).text for _ in range(3)]
    return tuple(t.split("\n", 1)[1].rsplit("\n", 1)[0] for t in texts)


def _where(level1: str) -> str:
    [line] = [ln for ln in level1.splitlines() if ln.startswith(WHERE)]
    return line


def _aimed(exercise: str, key: str) -> tuple[str, str]:
    item = EXERCISES[exercise]
    return f"{WHERE} {item.parts[key]}.", item.nudges[key]


# ------------------------------------------------------------------------------------------------ 07.1
def _step(*, eps_in_the_corrected_root=False, m_map_unsigned=False):
    @torch.no_grad()
    def adam8bit_step(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, *, step, lr, beta1, beta2, eps,
                      weight_decay, blocksize):
        m = dequantize_blocks(state1, absmax1, qmap2 if m_map_unsigned else qmap1, blocksize)
        v = dequantize_blocks(state2, absmax2, qmap2, blocksize)
        g32, p32 = g.float(), p.float()
        finite = torch.isfinite(g32)
        m = torch.where(finite, beta1 * m + (1 - beta1) * g32, 0.0)
        v = torch.where(finite, beta2 * v + (1 - beta2) * g32 * g32, 0.0)
        c1, c2 = 1 - beta1 ** step, math.sqrt(1 - beta2 ** step)
        if eps_in_the_corrected_root:  # m / ((sqrt(v) + eps) / sqrt(c2)): eps scaled by the correction too
            update = m / c1 / ((v.sqrt() + eps) / c2)
        else:
            update = m / c1 / (v.sqrt() / c2 + eps)
        p.copy_(torch.where(finite, p32 * (1 - lr * weight_decay) - lr * update, p32))
        state1[:], absmax1[:] = quantize_blocks(m, qmap1, blocksize, keep_sign=True)
        state2[:], absmax2[:] = quantize_blocks(v, qmap2, blocksize, keep_sign=True)

    return adam8bit_step


def test_07_1_eps_in_the_wrong_place_the_check_restates_the_rule_so_no_mistake_is_guessed():
    """Before: 'requantizing — a fresh absmax per block …' and 'which absmax must the codes be divided by'."""
    first, _, third = _levels("07.1", checks.check_adam8bit_step, _step(eps_in_the_corrected_root=True))
    failure = last_failure("07.1")
    assert restates_the_rule(failure) and aim(failure) == (NO_MISTAKE_NAMED, True)
    where = _where(first)
    assert "p differs from the reference at 2 of 1000 elements" in where and "after step 1" in where
    assert "could not tell which part" in where and "absmax" not in where
    assert third.startswith(UNNAMED) and "p differs from the reference at 2 of 1000 elements" in third
    assert LOCATE["07.1"] in third and "eps" in third
    assert EXERCISES["07.1"].nudges["absmax"] not in third


def test_07_1_m_decoded_with_the_unsigned_map_names_m_s_path():
    """Before: 'the size of one quantity … off by a constant' (the hint says 'not one constant')."""
    first, _, third = _levels("07.1", checks.check_adam8bit_step, _step(m_map_unsigned=True))
    assert aim(last_failure("07.1")) == ("m_path", True)
    part, nudge = _aimed("07.1", "m_path")
    assert part in first and "constant" not in _where(first)
    assert third == nudge and "map" in third


def test_07_1_the_rule_in_capitals_only_is_a_named_mistake():
    """'requantized with the OLD absmax' still names the absmax; the rule's 'fresh absmax' alone does not."""
    from tests.workbooks.wrong_answers.ex07 import make_step

    first, _, third = _levels("07.1", checks.check_adam8bit_step, make_step("old_absmax", old_absmax=True))
    part, nudge = _aimed("07.1", "absmax")
    assert part in first and third == nudge


# ------------------------------------------------------------------------------------------------ 07.2
def test_07_2_the_optimizers_defaults_instead_of_the_groups_names_the_groups_not_the_step_counter():
    from tests.workbooks.wrong_answers.ex07 import make_optimizer

    first, second, third = _levels("07.2", checks.check_adam8bit_optimizer,
                                   make_optimizer("defaults_only", defaults_only=True))
    hint = last_failure("07.2").hint
    if not any(w in hint for w in ("group", "hyper")):
        pytest.skip("the check's hint does not name the groups yet")
    assert aim(last_failure("07.2"))[0] == "decay"
    part, nudge = _aimed("07.2", "decay")
    assert part in first and third == nudge
    assert "step counter" not in first and "step count" not in third.lower()


@pytest.mark.parametrize("hint", [
    "every group stepped with the optimizer's defaults: read lr from each param group, not from self.defaults",
    "a parameter group's own lr was ignored: read the hyper-parameters from param_groups inside step()",
    "the second group's lr is not used: each group may set its own hyperparameters (group['lr'])",
    # check 07.2's words for one setting read from self.defaults (the cold learner's self.defaults["lr"])
    "the groups' parameters moved with lr=0.001 (your optimizer's default) instead of their own group's lr (0.01, "
    "0.003): read lr, betas, eps, weight_decay from each param group (group['lr']), not from self.defaults — each "
    "group sets its own.",
])
def test_07_2_words_for_the_groups_never_select_the_step_counter(hint):
    from adam8lib.course.checks import _common

    _common._OUTCOMES["07.2"] = _common.Failure("07.2", "adam8bit_optimizer", "check", "Adam8bit on two groups",
                                                 "parameters after 3 steps differ", hint)
    assert aim(last_failure("07.2")) == ("decay", True)


# ------------------------------------------------------------------------------------------------ 07.3
def _embedding_with_config(config):
    bnb = pytest.importorskip("bitsandbytes")

    class StableEmbedding(nn.Module):
        def __init__(self, num_embeddings, embedding_dim):
            super().__init__()
            self.embedding = nn.Embedding(num_embeddings, embedding_dim)
            nn.init.xavier_uniform_(self.embedding.weight)
            self.norm = nn.LayerNorm(embedding_dim)
            bnb.optim.GlobalOptimManager.get_instance().register_module_override(self.embedding, "weight", config)

        def forward(self, x):
            return self.norm(self.embedding(x))

    return StableEmbedding


def test_07_3_a_wrong_config_key_names_the_config_not_the_module_or_the_parameter():
    """Before: 'which module and which parameter name does the manager need?' (both were right)."""
    first, _, third = _levels("07.3", checks.check_stable_embedding, _embedding_with_config({"bits": 32}))
    assert aim(last_failure("07.3")) == ("config", True)
    part, nudge = _aimed("07.3", "config")
    assert part in first and third == nudge
    assert EXERCISES["07.3"].nudges["state"] not in third


# ------------------------------------------------------------------------------------------------ 13.1
def test_13_1_swapped_betas_name_the_pair_not_the_order_of_the_updates():
    """Before: 'the order of the three updates — decay, the sign step, then the state'."""
    from tests.workbooks.wrong_answers.ex13 import lion_betas_swapped, lion_class

    first, _, third = _levels("13.1", checks.check_lion8bit, lion_class(lion_betas_swapped))
    assert aim(last_failure("13.1")) == ("betas", True)
    part, nudge = _aimed("13.1", "betas")
    assert part in first and third == nudge
    assert "the order of the three updates" not in first


def test_13_1_m_updated_first_still_names_the_order():
    from tests.workbooks.wrong_answers.ex13 import lion_class, lion_state_updated_first

    first, _, _ = _levels("13.1", checks.check_lion8bit, lion_class(lion_state_updated_first))
    assert "the order of the three updates" in first


# ------------------------------------------------------------------------------------------------ 13.2
def _bytes(*, rank1_in_8bit=False, fp8_like_4bit=False):
    def state_bytes(shape, stored_as, state_format):
        n = math.prod(shape)
        if state_format == "fp32" or n < 4096:
            return 4 * n
        rank1 = stored_as == "v" and len(shape) >= 2
        if state_format == "4bit" or (fp8_like_4bit and state_format == "fp8"):
            return -(-n // 2) + 4 * (sum(shape) if rank1 else -(-n // 128))
        return n + 4 * (sum(shape) if rank1 and rank1_in_8bit else -(-n // 256))

    return state_bytes


@pytest.mark.parametrize("kind, key", [("rank1_in_8bit", "rank1_where"), ("fp8_like_4bit", "fp8")])
def test_13_2_rank1_scales_in_8_bit_and_fp8_counted_like_4_bit_are_named(kind, key):
    """Before: 'the bytes of each part — codes by format, …' and the generic checklist, whatever the mistake; once
    check 13.2 named rank-1 scales in 8-bit, levels 1 and 3 said rank-1 scales apply to every tensor of two or more
    dimensions — the opposite of the fix."""
    first, _, third = _levels("13.2", checks.check_state_bytes, _bytes(**{kind: True}))
    failure = last_failure("13.2")
    if restates_the_rule(failure):  # a check that cannot tell: what it saw and how to find the mistake
        assert aim(failure) == (NO_MISTAKE_NAMED, True)
        assert "state_bytes((" in _where(first) and "expected" in _where(first)
        assert third.startswith(UNNAMED) and "Your result minus the expected one:" in third
        assert LOCATE["13.2"] in third
        return
    assert aim(failure) == (key, True)
    part, nudge = _aimed("13.2", key)
    assert part in first and third == nudge
    assert EXERCISES["13.2"].nudges["axis"] not in third and EXERCISES["13.2"].nudges["factor"] not in third


def test_13_2_a_rule_restated_alone_gets_the_case_and_the_parts_to_work():
    from adam8lib.course.checks import _common

    _common._OUTCOMES["13.2"] = _common.Failure(
        "13.2", "state_bytes", "values", "state_bytes((768, 3072), 'v', '8bit')",
        "state_bytes((768, 3072), 'v', '8bit') = 2374656, expected 2396160.", RULES["13.2"][0] + " …",
        got="2374656", expected="2396160")
    first, _, third = (next_hint("13.2").text for _ in range(3))
    assert "state_bytes((768, 3072), 'v', '8bit') = 2374656, expected 2396160 — the check's hint only restates" in first
    assert UNNAMED in third and "Your result minus the expected one: -21,504." in third and LOCATE["13.2"] in third


# ------------------------------------------------------------------------------------------------ 13.3
def flips_small_m_uncoded(m, g, beta1, state_format):
    fmt = FORMATS[state_format].m
    stored = m if m.numel() < 4096 else fmt.dequantize(*fmt.quantize(m.reshape(-1), m.shape), m.shape).view(m.shape)
    return torch.sign(beta1 * stored + (1 - beta1) * g) != torch.sign(beta1 * m + (1 - beta1) * g)


def flips_m_not_flattened(m, g, beta1, state_format):
    fmt = FORMATS[state_format].m
    stored = fmt.dequantize(*fmt.quantize(m, m.shape), m.shape).reshape(m.shape)
    return torch.sign(beta1 * stored + (1 - beta1) * g) != torch.sign(beta1 * m + (1 - beta1) * g)


def test_13_3_small_m_left_uncoded():
    """Before (the check's 'x > 0' hint): 'the sign that matters — the interpolation's, not m's'."""
    first, _, third = _levels("13.3", checks.check_lion_flips, flips_small_m_uncoded)
    hint = last_failure("13.3").hint
    if "x > 0" in hint:
        pytest.skip("the check still gives the 'x > 0' hint here")
    assert aim(last_failure("13.3")) == ("small", True)
    part, nudge = _aimed("13.3", "small")
    assert part in first and third == nudge


def test_13_3_m_not_flattened_before_quantize_names_the_shapes_the_format_takes():
    first, _, third = _levels("13.3", checks.check_lion_flips, flips_m_not_flattened)
    assert aim(last_failure("13.3")) == ("error", True)
    assert f"{WHERE} {EXERCISES['13.3'].parts['error']}." in first
    assert third == EXERCISES["13.3"].nudges["error"] and "flattened" in third


# ------------------------------------------------------------------------------------------------ 14.1
def release_steps_only(model, make_optimizer):
    handles = []
    for p in model.parameters():
        if p.requires_grad:
            def hook(tensor, opt=make_optimizer([p])):
                opt.step()

            handles.append(p.register_post_accumulate_grad_hook(hook))
    return handles


def test_14_1_a_gradient_never_freed_names_the_freeing_not_the_kind_of_hook():
    """Before: 'the hook — the kind that runs once the gradient is complete' (the kind was right)."""
    first, _, third = _levels("14.1", checks.check_release_by_hand, release_steps_only)
    assert aim(last_failure("14.1")) == ("free", True)
    part, nudge = _aimed("14.1", "free")
    assert part in first and third == nudge
    assert EXERCISES["14.1"].nudges["hook"] not in third


# ------------------------------------------------------------------------------------------------ the rules
def test_a_restated_rule_never_selects_a_mistake_key_in_any_exercise():
    """Every opening of :data:`RULES`, recorded alone as a check's hint, gives the 'could not tell' levels."""
    from adam8lib.course.checks import _common

    for exercise, openings in RULES.items():
        for opening in openings:
            forget_hints()
            _common._OUTCOMES[exercise] = _common.Failure(exercise, EXERCISES[exercise].check, "values",
                                                          "f(x) on 3 elements", "the result differs at 1 of 3 "
                                                          "elements; worst at index (1,)", opening + " …")
            first, _, third = (next_hint(exercise).text for _ in range(3))
            assert "could not tell which part" in first and "worst at" not in first, exercise
            assert UNNAMED in third, exercise


@pytest.mark.parametrize("mistake, key, before", [
    ("states created in __init__", "lazy_state", "the step counter"),
    ("step counts in self.steps", "checkpoint", "the hyperparameters of each group"),
])
def test_07_2_course_wrong_answers_that_had_a_neighbouring_mistakes_part(mistake, key, before):
    """A state made in __init__ got 'the step counter' ('first step' in the hint), attributes lost in a checkpoint got
    the groups' hyperparameters ('param groups' in the hint)."""
    from tests.workbooks.wrong_answers import collect

    wrong, _ = collect()
    [w] = [w for w in wrong if w.exercise == "07.2" and w.mistake.startswith(mistake)]
    with pytest.raises(AssertionError), contextlib.redirect_stdout(io.StringIO()):
        w.run()
    assert aim(last_failure("07.2")) == (key, True)
    first, _, third = (next_hint("07.2").text for _ in range(3))
    part, nudge = _aimed("07.2", key)
    assert part in first and nudge in third and before not in first


# ------------------------------------------------------------------- a second cold judge's planted mistakes
@pytest.mark.parametrize("exercise, hint, key, not_before", [
    ("07.2", "keep every state (codes, absmax, fp32 moments, the step count) in self.state[p]: that is what "
             "state_dict() saves; attributes of your own (self.codes = {...}) are lost.", "checkpoint",
     "The step counter starts at 0"),
    ("14.2", "that counts activations and transient buffers too: the bill is weights + gradients + state only",
     "bill_only", "sum of their maxima"),
])  # fmt: skip
def test_the_check_words_a_second_cold_judge_met_select_their_own_mistake(exercise, hint, key, not_before):
    """Before: 07.2's step counts kept outside self.state got 'the step counter starts at 0' at level 3; 14.2's
    'between' summed over every category got the peak's 'sum of their maxima' at levels 1 and 3."""
    from adam8lib.course.checks import _common

    _common._OUTCOMES[exercise] = _common.Failure(exercise, EXERCISES[exercise].check, "values", "f(...)",
                                                  "a result differs", hint)
    first, _, third = (next_hint(exercise).text for _ in range(3))
    part, nudge = _aimed(exercise, key)
    assert part in first and nudge in third and not_before not in first + third
