"""The checks never mistake torch's NotImplementedError for the workbook stub, and never crash on an answer."""

import contextlib
import io

import pytest
import torch

from adam8lib.course import checks
from adam8lib.course.checks._common import call, is_stub


def _message(fn, *args) -> str:
    with pytest.raises(AssertionError) as info:
        call(fn, *args)
    return str(info.value)


def stub(x):
    raise NotImplementedError("Exercise 04.1: absmax_quantize")


def bare_stub(x):
    raise NotImplementedError


def shifts_a_float(x):
    return x >> 1  # torch raises NotImplementedError from C++: the innermost Python frame is this line


def lerps_integers(x):
    return torch.lerp(x.long(), x.long(), 0.5)


class _NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2


def backward_inside_torch(x):
    y = _NoBackward.apply(x.requires_grad_())
    y.sum().backward()  # torch.autograd.Function.backward (torch's Python code) raises NotImplementedError
    return y


def _cell(source: str, name: str, filename: str):
    scope: dict = {"torch": torch}
    exec(compile(source, filename, "exec"), scope)
    return scope[name]


@pytest.mark.parametrize("fn", [stub, bare_stub])
def test_the_stub_is_named_as_not_implemented(fn):
    assert "is not implemented yet" in _message(fn, torch.randn(3))


@pytest.mark.parametrize("fn, words", [
    (shifts_a_float, ["raised NotImplementedError inside torch", "float32", "integer"]),
    (lerps_integers, ["raised NotImplementedError inside torch", "int64"]),
    (backward_inside_torch, ["raised NotImplementedError inside torch", "not the exercise's stub"]),
])
def test_torch_errors_are_not_the_stub(fn, words):
    text = _message(fn, torch.randn(3))
    assert "not implemented yet" not in text
    for word in words:
        assert word in text


def test_a_notebook_cell_is_judged_by_its_line():
    """Code from a Jupyter cell (filename "<ipython-input-…>"; its source is in linecache or not at all)."""
    cell_stub = _cell("def f(x):\n    raise NotImplementedError('Exercise 06.1: quantize_blockwise')\n", "f",
                      "<ipython-input-3-1a2b>")
    cell_shift = _cell("def g(x):\n    return x.float() << 2\n", "g", "<ipython-input-4-3c4d>")
    assert "is not implemented yet" in _message(cell_stub, torch.randn(2))
    assert "inside torch" in _message(cell_shift, torch.randn(2))


def test_is_stub_only_for_not_implemented_errors():
    assert not is_stub(ValueError("Exercise 01.1"))
    try:
        shifts_a_float(torch.randn(2))
    except NotImplementedError as exc:
        assert not is_stub(exc)


def test_every_check_reports_torchs_error_in_learner_terms():
    """A learner whose 06.1 answer uses a bit operation on a float tensor is not told to replace the stub."""
    def quantize_with_shift(x, code, blocksize):
        return (x >> 1), x

    with pytest.raises(AssertionError) as info, contextlib.redirect_stdout(io.StringIO()):
        checks.check_quantize_blockwise(quantize_with_shift)
    assert "not implemented yet" not in str(info.value) and "integer" in str(info.value)


def test_stable_embedding_without_affine_gets_a_hint_not_a_crash():
    from torch import nn

    class NoAffine(nn.Module):
        def __init__(self, num_embeddings, embedding_dim):
            super().__init__()
            self.embedding = nn.Embedding(num_embeddings, embedding_dim)
            nn.init.xavier_uniform_(self.embedding.weight)
            self.norm = nn.LayerNorm(embedding_dim, elementwise_affine=False)

        def forward(self, x):
            return self.norm(self.embedding(x))

    with pytest.raises(AssertionError) as info:
        checks.check_stable_embedding(NoAffine)
    assert "affine" in str(info.value)
