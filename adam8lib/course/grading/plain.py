"""Plain data between the check process and the learner process: what may cross, and how.

The check process (:mod:`adam8lib.course.grading.checker`) and the sandboxed learner process
(:mod:`adam8lib.course.grading.learner`) exchange only *plain data*: ``None``, booleans, integers,
floats, complex numbers, strings, bytes, lists, tuples, sets and dicts of them, torch tensors (any dtype,
as their bytes), ``torch.Size`` / ``torch.dtype`` / ``torch.device`` / ``torch.Generator`` (its
state), NumPy arrays and NumPy scalars (a dict's ``keys()`` / ``values()`` / ``items()`` cross as a list). :func:`encode` turns such a value into a tree of tagged
tuples of builtins, and :func:`dumps` pickles that tree; :func:`loads` unpickles with an
unpickler that refuses every global (``find_class``), so bytes from the learner can build
nothing but builtin containers, numbers, strings and bytes, which :func:`decode` turns back into
tensors and arrays. A learner object (function, class instance, tensor subclass with its
``__torch_function__``) never crosses: :func:`encode` raises :class:`NotPlainData` for it (a tensor
subclass crosses as a plain tensor of its data).

Messages travel length-prefixed (:func:`send` / :func:`receive`) on pipes, at most
:data:`MAX_MESSAGE` bytes each.
"""

from __future__ import annotations

import io
import os
import pickle
import struct

__all__ = ["NotPlainData", "tensors", "encode", "decode", "dumps", "loads", "send", "receive", "MAX_MESSAGE", "Arg"]

MAX_MESSAGE = 512 * 2**20
_DEPTH = 64


class NotPlainData(TypeError):
    """A value that is not plain data was to cross between the processes."""


class Arg:
    """Decoding marker: the learner returned (an element that *is*) the check's argument number ``index``."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def _torch():
    import torch

    return torch


def _tensor_bytes(t) -> bytes:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(_torch().uint8).numpy().tobytes()


def encode(value, *, args: list | None = None, depth: int = 0, memo: dict | None = None):
    """``value`` as a tree of tagged tuples of builtins; ``args`` (the call's tensors) are sent as
    references, and a tensor met twice as a reference to its first time (shared tensors stay shared)."""
    memo = {} if memo is None else memo
    if depth > _DEPTH:
        raise NotPlainData("nested more than 64 levels deep")
    if value is None or type(value) in (bool, int, float, str, bytes):
        return ("v", value)
    if type(value) is complex:
        return ("c", value.real, value.imag)
    torch = _torch()
    if isinstance(value, torch.Tensor):
        if args is not None:
            for i, a in enumerate(args):
                if a is value:
                    return ("a", i)
        if id(value) in memo:
            return ("r", memo[id(value)][0])
        memo[id(value)] = (len(memo), value)  # the value kept alive: its id stays unique
        plain = value
        if type(value) is not torch.Tensor:
            # a subclass's own __torch_function__ runs here, in the learner process (where the
            # guard reports it), and what crosses is a plain tensor of its data
            plain = value.detach()
            if not isinstance(plain, torch.Tensor):
                raise NotPlainData(f"a {type(value).__qualname__} whose detach() is not a tensor")
            plain = plain.as_subclass(torch.Tensor)
        return ("T", str(plain.dtype).replace("torch.", ""), list(plain.shape), _tensor_bytes(plain),
                bool(plain.requires_grad), str(plain.device))
    if isinstance(value, torch.Size):
        return ("S", [int(n) for n in value])
    if isinstance(value, torch.dtype):
        return ("D", str(value).replace("torch.", ""))
    if isinstance(value, torch.device):
        return ("V", str(value))
    if isinstance(value, torch.Generator):
        return ("G", _tensor_bytes(value.get_state()), str(value.device))
    if type(value) in (type({}.keys()), type({}.values()), type({}.items())):  # a dict's view: its items, as a list
        value = list(value)
    if type(value) in (list, tuple):
        return ("l" if type(value) is list else "t", [encode(v, args=args, depth=depth + 1, memo=memo) for v in value])
    if type(value) in (set, frozenset):
        return ("s" if type(value) is set else "f", [encode(v, depth=depth + 1, memo=memo) for v in value])
    if type(value) is dict:
        return ("d", [(encode(k, depth=depth + 1, memo=memo), encode(v, args=args, depth=depth + 1, memo=memo))
                      for k, v in value.items()])
    np = __import__("sys").modules.get("numpy")
    if np is not None:
        if type(value) is np.ndarray:
            data = np.ascontiguousarray(value)
            return ("N", data.dtype.str, list(data.shape), data.tobytes())
        if isinstance(value, np.generic) and type(value).__module__ == "numpy":
            return ("n", np.dtype(type(value)).str, np.asarray(value).tobytes())
    if isinstance(value, (bool, int, float, str)):  # a subclass: its plain value
        for base in (bool, int, float, str):
            if isinstance(value, base):
                return ("v", base(value))
    raise NotPlainData(f"a {type(value).__module__}.{type(value).__qualname__} is not plain data "
                       "(tensors, numbers, strings and tuples / lists / dicts of them)")


def _dtype(name: str):
    torch = _torch()
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise NotPlainData(f"unknown dtype {name!r}")
    return dtype


def decode(tree, *, args: list | None = None, memo: list | None = None):
    """The value :func:`encode` encoded (``args``: the call's tensors, for references)."""
    memo = [] if memo is None else memo
    if type(tree) is not tuple or not tree or type(tree[0]) is not str:
        raise NotPlainData("malformed plain data")
    tag = tree[0]
    if tag == "v":
        return tree[1]
    if tag == "c":
        return complex(tree[1], tree[2])
    if tag in ("l", "t"):
        items = [decode(v, args=args, memo=memo) for v in tree[1]]
        return items if tag == "l" else tuple(items)
    if tag in ("s", "f"):
        items = [decode(v, memo=memo) for v in tree[1]]
        return set(items) if tag == "s" else frozenset(items)
    if tag == "d":
        return {decode(k, memo=memo): decode(v, args=args, memo=memo) for k, v in tree[1]}
    if tag == "a":
        if args is None or not 0 <= int(tree[1]) < len(args):
            raise NotPlainData("a reference to an argument that does not exist")
        return args[int(tree[1])]
    if tag == "r":
        if not 0 <= int(tree[1]) < len(memo):
            raise NotPlainData("a reference to a tensor not sent before")
        return memo[int(tree[1])]
    torch = _torch()
    if tag == "T":
        _, name, shape, data, grad, device = tree
        dtype = _dtype(name)
        shape = [int(n) for n in shape]
        if not data:
            t = torch.empty(shape, dtype=dtype)
        else:
            t = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
        if device != "cpu":
            try:
                t = t.to(device)
            except (RuntimeError, AssertionError):
                pass
        t = t.requires_grad_(True) if grad and (t.is_floating_point() or t.is_complex()) else t
        memo.append(t)
        return t
    if tag == "S":
        return torch.Size([int(n) for n in tree[1]])
    if tag == "D":
        return _dtype(tree[1])
    if tag == "V":
        return torch.device(str(tree[1]))
    if tag == "G":
        gen = torch.Generator()
        gen.set_state(torch.frombuffer(bytearray(tree[1]), dtype=torch.uint8).clone())
        return gen
    if tag in ("N", "n"):
        import numpy as np

        if tag == "n":
            return np.frombuffer(tree[2], dtype=np.dtype(str(tree[1])))[0]
        return np.frombuffer(bytearray(tree[3]), dtype=np.dtype(str(tree[1]))).reshape([int(n) for n in tree[2]])
    raise NotPlainData(f"unknown plain-data tag {tag!r}")


class _Builtins(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"{module}.{name} may not cross between the grading processes")


def dumps(message) -> bytes:
    return pickle.dumps(message, protocol=4)


def loads(data: bytes):
    return _Builtins(io.BytesIO(data)).load()


def send(fd: int, message) -> None:
    data = dumps(message)
    if len(data) > MAX_MESSAGE:
        raise NotPlainData(f"a message of {len(data)} bytes is over the limit of {MAX_MESSAGE}")
    view = memoryview(struct.pack("<Q", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read(fd: int, n: int) -> bytes:
    parts, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other grading process closed its pipe")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def receive(fd: int):
    (size,) = struct.unpack("<Q", _read(fd, 8))
    if size > MAX_MESSAGE:
        raise NotPlainData(f"a message of {size} bytes is over the limit of {MAX_MESSAGE}")
    return loads(_read(fd, size))


def tensors(value, found: list | None = None, depth: int = 0) -> list:
    """The tensors in ``value`` (lists, tuples, dict values), depth first: the arguments a call may change."""
    found = [] if found is None else found
    torch = _torch()
    if depth > _DEPTH:
        return found
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif type(value) in (list, tuple, type({}.keys()), type({}.values()), type({}.items())):  # as encode walks them
        for v in value:
            tensors(v, found, depth + 1)
    elif type(value) is dict:
        for v in value.values():
            tensors(v, found, depth + 1)
    return found
