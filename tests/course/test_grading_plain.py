"""What may cross between the check process and the learner process (adam8lib.course.grading.plain)."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from adam8lib.course.grading import plain


def roundtrip(value, args=None):
    return plain.decode(plain.loads(plain.dumps(plain.encode(value, args=args))), args=args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8,
                                   torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool])  # fmt: skip
def test_tensors_of_every_dtype_cross_bit_for_bit(dtype):
    gen = torch.Generator().manual_seed(0)
    t = (torch.randn(3, 5, generator=gen) * 50).to(dtype)
    back = roundtrip(t)
    assert type(back) is torch.Tensor and back.dtype == dtype and back.shape == t.shape
    assert torch.equal(back.view(torch.uint8) if dtype != torch.bool else back, t.view(torch.uint8) if dtype != torch.bool else t)


def test_empty_strided_and_grad_tensors_keep_their_values():
    base = torch.arange(12.0).reshape(3, 4)
    assert torch.equal(roundtrip(base.t()), base.t()) and roundtrip(base.t()).is_contiguous()
    assert roundtrip(torch.empty(0, 7, dtype=torch.int8)).shape == (0, 7)
    leaf = torch.ones(2, requires_grad=True)
    assert roundtrip(leaf).requires_grad and not roundtrip(leaf.detach()).requires_grad


def test_nested_containers_numbers_and_torch_types():
    value = {"a": [1, 2.5, True, None, "s", b"b", 1 + 2j, {"x", 1}, frozenset({2})], "t": (torch.Size([2, 3]), torch.int8, torch.device("cpu"))}
    back = roundtrip(value)
    assert back == value and type(back["t"]) is tuple and type(back["a"]) is list
    assert type(back["a"][2]) is bool and type(back["a"][0]) is int


def test_numpy_arrays_and_scalars_keep_their_type():
    arr = np.arange(6, dtype=np.int16).reshape(2, 3)
    back = roundtrip([arr, np.float64(2.5), np.int64(7)])
    assert back[0].dtype == np.int16 and (back[0] == arr).all()
    assert type(back[1]) is np.float64 and back[1] == 2.5 and type(back[2]) is np.int64


def test_a_generator_crosses_as_its_state():
    gen = torch.Generator().manual_seed(41)
    other = roundtrip(gen)
    assert torch.equal(torch.rand(4, generator=other), torch.rand(4, generator=gen))


def test_an_argument_returned_comes_back_as_the_same_object():
    t = torch.zeros(3)
    out = roundtrip((t, torch.zeros(3)), args=[t])
    assert out[0] is t and out[1] is not t


class Sneaky(torch.Tensor):
    pass


@pytest.mark.parametrize("value", [print, lambda x: x, object(), type, range(3), os])
def test_functions_objects_and_modules_do_not_cross(value):
    with pytest.raises(plain.NotPlainData, match="is not plain data"):
        plain.encode([1, value])


def test_a_tensor_subclass_crosses_as_a_plain_tensor():
    t = torch.arange(3.0).as_subclass(Sneaky)
    back = roundtrip(t)
    assert type(back) is torch.Tensor and torch.equal(back, torch.arange(3.0))


def test_bytes_from_the_learner_can_build_no_object_but_builtins():
    for evil in (pickle.dumps(os.system), pickle.dumps(torch.zeros(2)), pickle.dumps(Sneaky)):
        with pytest.raises(pickle.UnpicklingError, match="may not cross"):
            plain.loads(evil)
    with pytest.raises(plain.NotPlainData):
        plain.decode(("X", 1))
    with pytest.raises(plain.NotPlainData, match="unknown dtype"):
        plain.decode(("T", "system", [1], b"\0", False, "cpu"))
    with pytest.raises(plain.NotPlainData, match="argument that does not exist"):
        plain.decode(("a", 3), args=[])


def test_messages_travel_whole_through_a_pipe():
    r, w = os.pipe()
    try:
        message = ("ok", plain.encode(torch.arange(10)), [])
        plain.send(w, message)
        assert plain.receive(r) == message
        os.close(w)
        w = None
        with pytest.raises(EOFError):
            plain.receive(r)
    finally:
        os.close(r)
        if w is not None:
            os.close(w)


def test_a_dicts_views_cross_as_lists():
    d = {"a": torch.ones(2), "b": 3}
    assert roundtrip(d.keys()) == ["a", "b"] and roundtrip(d.items())[1] == ("b", 3)
    assert torch.equal(roundtrip(d.values())[0], torch.ones(2))


def test_both_sides_find_the_same_argument_tensors():
    """The check process and the learner process must agree on which tensors a call may change."""
    states = {"p": {"exp_avg": torch.zeros(2), "step": torch.ones(())}}
    args = [states.values(), (torch.ones(1), [3, {"k": torch.zeros(3)}])]
    sent = plain.decode(plain.loads(plain.dumps(plain.encode(args))))
    mine, theirs = plain.tensors(args), plain.tensors(sent)
    assert len(mine) == len(theirs) == 4
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs))


def test_a_tensor_met_twice_stays_one_tensor():
    """bitsandbytes-style states share one qmap tensor: counted once by id, so it must stay shared."""
    qmap = torch.linspace(-1, 1, 256)
    states = [{"qmap1": qmap, "m": torch.zeros(4)}, {"qmap1": qmap, "m": torch.zeros(4)}]
    back = roundtrip(states)
    assert back[0]["qmap1"] is back[1]["qmap1"] and back[0]["m"] is not back[1]["m"]
    with pytest.raises(plain.NotPlainData, match="not sent before"):
        plain.decode(("l", [("r", 0)]))
