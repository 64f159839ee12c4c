"""Check cells of workbook 07 (ex07_adam8bit_step): pass on the solution, fail with a named hint on each plausible wrong answer."""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():  # before any @triton.jit below: Triton's interpreter on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from adam8lib.course import checks  # noqa: E402
from adam8lib.kernels.reference import adam8bit_step  # noqa: E402
from adam8lib.quant import dequantize_blocks, nearest_code, num_blocks  # noqa: E402

from tests._check_helpers import SOLUTIONS, fails_with, solution, stub  # noqa: E402,F401



# ------------------------------------------------------------------ 07 · the 8-bit step
def _requantize(x, qmap, blocksize, keep_sign, absmax=None):
    n = x.numel()
    nb = num_blocks(n, blocksize)
    blocks = torch.nn.functional.pad(x, (0, nb * blocksize - n)).view(nb, blocksize)
    new_absmax = blocks.abs().amax(dim=1) if absmax is None else absmax
    scale = torch.where(new_absmax > 0, new_absmax, torch.ones_like(new_absmax))
    return nearest_code((blocks / scale[:, None]).reshape(-1)[:n], qmap, keep_sign=keep_sign), new_absmax


def make_8bit(*, keep_sign=True, keep_sign_v=True, bias=True, nan_rule=True, fresh_absmax=True, swap=False):
    @torch.no_grad()
    def step_fn(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, *, step, lr, beta1, beta2, eps,
                weight_decay, blocksize):
        map_m, map_v = (qmap2, qmap1) if swap else (qmap1, qmap2)
        m = dequantize_blocks(state1, absmax1, map_m, blocksize)
        v = dequantize_blocks(state2, absmax2, map_v, blocksize)
        grad = g.float()
        ok = torch.isfinite(grad) if nan_rule else torch.ones_like(grad, dtype=torch.bool)
        m = torch.where(ok, beta1 * m + (1 - beta1) * grad, 0.0)
        v = torch.where(ok, beta2 * v + (1 - beta2) * grad * grad, 0.0)
        c1, c2 = (1 - beta1**step, math.sqrt(1 - beta2**step)) if bias else (1.0, 1.0)
        old = p.float()
        new = old * (1 - lr * weight_decay) - lr / c1 * m / (v.sqrt() / c2 + eps)
        p.copy_(torch.where(ok, new, old))
        s1, a1 = _requantize(m, map_m, blocksize, keep_sign, None if fresh_absmax else absmax1.clone())
        s2, a2 = _requantize(v, map_v, blocksize, keep_sign_v, None if fresh_absmax else absmax2.clone())
        state1.copy_(s1), absmax1.copy_(a1), state2.copy_(s2), absmax2.copy_(a2)

    return step_fn


@pytest.mark.parametrize("fn, hint", [
    (make_8bit(keep_sign=False, keep_sign_v=False), "sign lost on requantize"),
    (make_8bit(keep_sign=False), "keep_sign=True for m"),
    (make_8bit(keep_sign_v=False), "a tiny positive v must not round to 0"),
    (make_8bit(bias=False), "no bias correction"),
    (make_8bit(nan_rule=False), "NaN handling"),
    (make_8bit(fresh_absmax=False), "FRESH absmax"),
    (make_8bit(swap=True), "the maps are swapped"),
    (stub, "not implemented yet"),
])
def test_adam8bit_step_fails(fn, hint):
    fails_with(checks.check_adam8bit_step, fn, hint)


def test_adam8bit_step_check_wants_in_place_updates():
    def not_in_place(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, **kw):
        adam8bit_step(p.clone(), g, state1.clone(), state2.clone(), absmax1.clone(), absmax2.clone(), qmap1, qmap2,
                      **kw)

    fails_with(checks.check_adam8bit_step, not_in_place, "IN PLACE")


def test_ex07_check_passes_on_the_solution_and_the_reference(capsys):
    checks.check_adam8bit_step(solution("07", "adam8bit_step"))
    checks.check_adam8bit_step(adam8bit_step)
    assert capsys.readouterr().out.count("✔ Exercise 07.1 · The 8-bit Adam step: all checks passed") == 2


# ------------------------------------------------------------------ 07.2 · the optimizer class
def make_optimizer_class(*, strict=False, defaults_only=False, no_decay=False, quantize_all=False,
                         own_attributes=False, touch_no_grad=False, step_from_one=False, floor_blocks=False,
                         own_defaults=None):
    """A learner's MyAdam8bit with one plausible slip switched on."""
    from adam8lib.adam import adam_step
    from adam8lib.quant import dynamic_map as dmap

    class Wrong(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                     blocksize=256, min_8bit_size=4096):
            super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                          blocksize=blocksize, min_8bit_size=min_8bit_size))
            self.defaults_seen = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
            self.q1, self.q2, self.mine = dmap(True), dmap(False), {}

        def load_state_dict(self, sd):
            super().load_state_dict(sd)
            for st in self.state.values():
                for k in ("state1", "state2"):
                    if k in st:
                        st[k] = st[k].to(torch.uint8)

        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                hp = self.defaults_seen if defaults_only else group
                b1, b2 = hp["betas"]
                wd = 0.0 if no_decay else hp["weight_decay"]
                for p in group["params"]:
                    if p.grad is None:
                        if touch_no_grad:
                            p.mul_(1 - hp["lr"] * 0.1)
                        continue
                    st = self.mine.setdefault(p, {}) if own_attributes else self.state[p]
                    n = p.numel()
                    big = quantize_all or (n > group["min_8bit_size"] if strict else n >= group["min_8bit_size"])
                    if not st:
                        st["step"] = 0
                        if big:
                            nb = n // group["blocksize"] if floor_blocks else -(-n // group["blocksize"])
                            st.update(state1=torch.full((n,), 127, dtype=torch.uint8), state2=torch.zeros(n, dtype=torch.uint8),
                                      absmax1=torch.zeros(nb), absmax2=torch.zeros(nb))
                        else:
                            st.update(exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                    st["step"] = 1 if step_from_one else st["step"] + 1
                    kw = dict(step=st["step"], lr=hp["lr"], eps=hp["eps"], weight_decay=wd)
                    if "state1" in st:
                        adam8bit_step(p.view(-1), p.grad.view(-1), st["state1"], st["state2"], st["absmax1"], st["absmax2"],
                                      self.q1, self.q2, beta1=b1, beta2=b2, blocksize=group["blocksize"], **kw)
                    else:
                        adam_step(p, p.grad, st["exp_avg"], st["exp_avg_sq"], betas=(b1, b2), **kw)

    return Wrong


def test_adam8bit_optimizer_check_passes_the_solution_the_library_and_a_rewrite():
    from adam8lib.optim import Adam8bit

    checks.check_adam8bit_optimizer(solution("07", "MyAdam8bit"))
    checks.check_adam8bit_optimizer(lambda params, **kw: Adam8bit(params, backend="torch", **kw))
    checks.check_adam8bit_optimizer(make_optimizer_class())


@pytest.mark.parametrize("fn, hint", [
    (make_optimizer_class(strict=True), "min_8bit_size is inclusive"),
    (make_optimizer_class(quantize_all=True), "fewer than min_8bit_size elements keep fp32 states"),
    (make_optimizer_class(defaults_only=True), "from each param group"),
    (make_optimizer_class(no_decay=True), "apply each group's weight_decay"),
    (make_optimizer_class(step_from_one=True), "the step count stays at 1"),
    (make_optimizer_class(touch_no_grad=True), "skip parameters whose .grad is None"),
    (make_optimizer_class(own_attributes=True), "no uint8 codes in its state"),
    (stub, "not implemented yet"),
])
def test_adam8bit_optimizer_check_names_the_mistake(fn, hint):
    fails_with(checks.check_adam8bit_optimizer, fn, hint)


# ------------------------------------------------------------------ 07.3 · stable embedding
def make_stable_embedding(*, xavier=True, norm=True, override=True):
    import bitsandbytes as bnb

    class Wrong(torch.nn.Module):
        def __init__(self, num, dim):
            super().__init__()
            self.embedding = torch.nn.Embedding(num, dim)
            if xavier:
                torch.nn.init.xavier_uniform_(self.embedding.weight)
            self.norm = torch.nn.LayerNorm(dim)
            if override:
                bnb.optim.GlobalOptimManager.get_instance().register_module_override(
                    self.embedding, "weight", {"optim_bits": 32})

        def forward(self, x):
            return self.norm(self.embedding(x)) if norm else self.embedding(x)

    return Wrong


def test_stable_embedding_check_passes_the_solution():
    checks.check_stable_embedding(solution("07", "StableEmbedding"))
    checks.check_stable_embedding(make_stable_embedding())


@pytest.mark.parametrize("fn, hint", [
    (make_stable_embedding(xavier=False), "xavier_uniform_"),
    (make_stable_embedding(norm=False), "apply self.norm"),
    (make_stable_embedding(override=False), "register_module_override"),
    (lambda num, dim: torch.nn.Embedding(num, dim), "self.embedding (an nn.Embedding)"),
    (stub, "not implemented yet"),
])
def test_stable_embedding_check_names_the_mistake(fn, hint):
    fails_with(checks.check_stable_embedding, fn, hint)


# ------------------------------------------------------------------ 07.4 · training with the learner's optimizer
def make_training_optimizer(*, sign=1.0, update=True, bias=True):
    """An Adam-like optimizer with fp32 states and one slip: the update's sign, no update, no bias correction."""

    class Wrong(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
            super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                b1, b2 = group["betas"]
                for p in group["params"]:
                    st = self.state[p]
                    if not st:
                        st.update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                    st["step"] += 1
                    st["m"].mul_(b1).add_(p.grad, alpha=1 - b1)
                    st["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                    c1, c2 = (1 - b1 ** st["step"], 1 - b2 ** st["step"]) if bias else (1.0, 1.0)
                    new = p - sign * group["lr"] / c1 * st["m"] / ((st["v"] / c2).sqrt() + group["eps"])
                    if update:
                        p.copy_(new)
                    else:
                        p = new  # a fresh tensor: the parameter never changes

    return Wrong


def reference_train(optimizer_class, steps=200, lr=1e-2):
    """A learner's own full-batch loop (07.4 refuses a train() that runs the course's loop)."""
    x, y, model = checks.ex07_adam8bit_step.mlp_task()
    opt = optimizer_class(list(model.parameters()), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses


def test_training_check_passes_the_solution_and_the_library(capsys):
    from adam8lib.optim import Adam8bit

    checks.check_trains_like_adam(solution("07", "train"), solution("07", "MyAdam8bit"))
    checks.check_trains_like_adam(reference_train, lambda params, **kw: Adam8bit(params, backend="torch", **kw))
    checks.check_trains_like_adam(reference_train, make_training_optimizer())  # plain fp32 Adam: torch's curve
    assert capsys.readouterr().out.count("✔ Exercise 07.4 · Training with your optimizer: all checks passed") == 3


def test_training_curves_start_equal_and_the_library_tracks_torch():
    from adam8lib.optim import Adam8bit

    curves = checks.ex07_adam8bit_step.train_side_by_side(lambda params, **kw: Adam8bit(params, backend="torch", **kw))
    (_, ours), (_, ref) = curves.items()
    assert len(ours) == len(ref) == 200 and ours[0] == ref[0]  # same data, same initial weights
    assert ref[-1] < 0.01 * ref[0] and ours[-1] < 2 * ref[-1] + 1e-3


@pytest.mark.parametrize("fn, hint", [
    (make_training_optimizer(update=False), "does not learn"),
    (make_training_optimizer(sign=-1.0), "subtract the update"),
    (lambda params, lr: torch.optim.SGD(params, lr=lr), "more slowly than Adam"),  # learns, far above Adam
    (stub, "not implemented yet"),
])
def test_training_check_names_the_optimizers_mistake(fn, hint):
    fails_with(lambda opt: checks.check_trains_like_adam(reference_train, opt), fn, hint)


def _loss_after_step(optimizer_class, steps=200, lr=1e-2):
    x, y, model = checks.ex07_adam8bit_step.mlp_task()
    opt, losses = optimizer_class(model.parameters(), lr=lr), []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(torch.nn.functional.mse_loss(model(x), y).item())
    return losses


@pytest.mark.parametrize("train_fn, hint", [
    (_loss_after_step, "you recorded the loss AFTER opt.step()"),
    (lambda optimizer_class, steps=200, lr=1e-2: reference_train(optimizer_class, steps, 1e-3),
     "pass lr to the optimizer"),
    (lambda optimizer_class, steps=200, lr=1e-2: None, "return the list of losses"),
    (stub, "not implemented yet"),
])
def test_training_check_names_the_loops_mistake(train_fn, hint):
    fails_with(lambda fn: checks.check_trains_like_adam(fn, make_training_optimizer()), train_fn, hint)


def _nan_keeps_states(p, g, state1, state2, absmax1, absmax2, qmap1, qmap2, *, step, lr, beta1, beta2, eps,
                      weight_decay, blocksize):
    """A cold learner's 07.1: the NaN gradient zeroed and p masked, but m and v not reset there."""
    bad = ~torch.isfinite(g.float())
    g32 = torch.where(bad, torch.zeros_like(g.float()), g.float())
    m = beta1 * dequantize_blocks(state1, absmax1, qmap1, blocksize) + (1 - beta1) * g32
    v = beta2 * dequantize_blocks(state2, absmax2, qmap2, blocksize) + (1 - beta2) * g32 * g32
    p32 = p.float()
    new = p32 * (1 - lr * weight_decay) - lr / (1 - beta1**step) * m / (v.sqrt() / math.sqrt(1 - beta2**step) + eps)
    p.copy_(torch.where(bad, p32, new).to(p.dtype))
    from adam8lib.quant import quantize_blocks

    c1, a1 = quantize_blocks(m, qmap1, blocksize, keep_sign=True)
    c2, a2 = quantize_blocks(v, qmap2, blocksize, keep_sign=True)
    state1.copy_(c1), state2.copy_(c2), absmax1.copy_(a1), absmax2.copy_(a2)


def test_states_kept_at_a_nan_gradient_are_named():
    fails_with(checks.check_adam8bit_step, _nan_keeps_states, "resets BOTH states there to 0")


def test_blocks_counted_with_floor_division_are_named_once():
    with pytest.raises(AssertionError) as info:
        checks.check_adam8bit_optimizer(make_optimizer_class(floor_blocks=True))
    text = str(info.value)
    assert "ceil(n / blocksize)" in text and text.count("Hint:") == 1, text
    assert "three_steps_of_your_optimizer() raised" in text and info.value.__cause__ is not None


# ------------------------------------------------------------------ 07.2-07.4 run by the course's drivers (issue 53)
def _agreeing_tensor_class():
    """A tensor subclass whose torch-function handler says every comparison is equal."""

    def handler(cls, func, types, args=(), kwargs=None):
        if func in (torch.equal, torch.allclose, torch.Tensor.equal, torch.Tensor.__eq__, torch.Tensor.__ne__):
            return True
        return torch.Tensor.__torch_function__.__func__(cls, func, types, args, kwargs or {})

    class Agree(torch.Tensor):
        pass

    Agree.__torch_function__ = classmethod(handler)
    return Agree


def test_an_embedding_whose_output_lies_fails_in_the_kernel_too():
    """The driver's answer crosses as plain data in a notebook as well: a subclass that claims equality is a plain
    tensor of zeros by the time the check compares it."""
    agree = _agreeing_tensor_class()
    right = solution("07", "StableEmbedding")

    class Lying(right):
        def forward(self, x):
            return torch.zeros(*x.shape, 64).as_subclass(agree)

    Lying.__name__ = "StableEmbedding"
    fails_with(checks.check_stable_embedding, Lying, "StableEmbedding(x)")


def test_losses_that_lie_fail_as_plain_floats():
    class Yes(float):
        def __eq__(self, other):
            return True

        __hash__ = float.__hash__

    def train(optimizer_class, steps=200, lr=1e-2):
        return [Yes(0.0)] * steps

    fails_with(lambda fn: checks.check_trains_like_adam(fn, make_training_optimizer()), train, "gave 20 losses [0.0")


def test_the_drivers_return_plain_data_only():
    from adam8lib.course.grading import drivers, plain
    from adam8lib.course.grading.drivers import ex07

    ex = checks.ex07_adam8bit_step
    before = [p.detach().clone() for p in ex._optimizer_params()]
    ran = drivers.drive(solution("07", "MyAdam8bit"), ex07.step_optimizer, ex._group_spec(), before, ex._grads(3))
    assert plain.decode(plain.encode(ran)) is not None and ran["optimizer"] and ran["type"] == "MyAdam8bit"
    assert [type(p) for p in ran["params"]] == [torch.Tensor] * len(before)
    assert ran["defaults"] == {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    assert ran["states"][4] == {"empty": True, "tensors": []}
    x = torch.tensor([[1, 5, 999], [0, 0, 42]])
    emb = drivers.drive(solution("07", "StableEmbedding"), ex07.embedding_run, x, ex._moves())
    assert emb["build_error"] is None and emb["parts"] == ["Embedding", "LayerNorm"] and emb["trained_grad"]
    assert emb["override"]["dtype"] == torch.float32 and emb["override"]["registered"]


def test_a_checkpoint_that_loads_but_steps_unlike_the_reference_is_caught():
    """07.2's round trip is compared with the check's own run too: an optimizer that agrees with its reloaded twin
    but steps unlike Adam8bit once a checkpoint was saved or loaded (here: without decay) fails."""
    base = solution("07", "MyAdam8bit")

    class Drifts(base):
        def _drift(self):
            for group in self.param_groups:
                group["weight_decay"] = 0.0

        def state_dict(self):
            out = super().state_dict()
            self._drift()  # the original drifts once it has been saved
            return out

        def load_state_dict(self, state_dict):
            super().load_state_dict(state_dict)
            self._drift()

    Drifts.__name__ = "MyAdam8bit"
    fails_with(checks.check_adam8bit_optimizer, Drifts, "differ from adam8lib.optim.Adam8bit")


# ------------------------------------------------------------------ a cold learner's mistakes, named (issue 51)
def _wrong(name):
    from tests.workbooks.wrong_answers import ex07

    return next(w for w in ex07.WRONG if getattr(w.answer, "__name__", "") == name)


def _message(name) -> str:
    w = _wrong(name)
    with pytest.raises(AssertionError) as info:
        w.run()
    return str(info.value)


@pytest.mark.parametrize("name, says", [
    ("rebinds_states", ["nothing was written in place into state1, state2, absmax1, absmax2", "lost when it returns"]),
    ("bf16_everything", ["torch.bfloat16 rounding in the middle of the step", "cast the new p to torch.bfloat16 once"]),
    ("decay_after_update", ["you decayed p AFTER the update", "decays p FIRST"]),
])
def test_the_8bit_steps_cold_mistakes_are_named(name, says):
    text = _message(name)
    assert all(s in text for s in says), text
    assert "a term that changes from entry to entry" not in text, text


def test_the_16bit_rounding_hint_needs_a_16bit_case():
    """An fp32 slip (the update doubled) is not called 16-bit rounding: the first case is fp32."""
    text = _message("adam8bit_step_lr_twice")
    assert "rounding in the middle of the step" not in text, text


def test_an_optimizer_without_super_init_gets_a_hint():
    text = _message("Adam8bitWithoutSuperInit")
    assert "'dict' object has no attribute 'grad'" in text and "super().__init__(params, defaults)" in text, text


def test_the_flatten_hint_says_too_only_when_the_parameter_was_flat():
    assert "flatten the gradient too" in _message("grad_not_flat")
    text = _message("nothing_flat")
    assert "too" not in text.split("Hint:")[-1] and "BOTH the parameter and its gradient" in text, text


def test_a_uniform_draw_with_the_wrong_bound_is_not_called_normal():
    text = _message("bound_from_rows")
    assert "NORMAL" not in text and "uses BOTH dimensions of the table" in text, text
    assert "that is a NORMAL initialisation" in _message("xavier_normal")


@pytest.mark.parametrize("name, says", [
    ("output_squeezed", "paired with EVERY target"),
    ("random_minibatches", "your model was run on batches of 32 points"),
])
def test_the_loops_cold_mistakes_are_named_without_dictating_the_loop(name, says):
    text = _message(name)
    assert says in text, text
    for code in ("opt.zero_grad(), loss =", "loss = mse_loss(model(x), y)", "optimizer_class(model.parameters(), lr=lr)",
                 "loss.backward(), record"):
        assert code not in text, text


def test_no_07_4_message_dictates_the_loop():
    """The fallback states properties (one loss per update, before it; the whole batch; the output of y's shape)."""
    import inspect

    source = inspect.getsource(checks.ex07_adam8bit_step.check_trains_like_adam)
    rule = checks.ex07_adam8bit_step._TRAIN_RULE
    for code in ("opt.zero_grad(), loss", "optimizer_class(model.parameters(), lr=lr)", "losses.append("):
        assert code not in source and code not in rule
    assert "before that update" in rule and "WHOLE batch" in rule and "y's shape" in rule
