"""adam8lib.kernels: one dispatch point, backend choice and errors."""

import pytest
import torch

from adam8lib import kernels
from adam8lib.kernels import reference


def test_torch_backend_always_available_and_auto_resolves():
    assert "torch" in kernels.available_backends("cpu")
    assert kernels.get_backend("torch", "cpu").step is reference.adam8bit_step
    auto = kernels.get_backend("auto", "cpu")
    assert auto.name in kernels.available_backends("cpu") and auto.name != "triton"  # never the interpreter


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="Unknown or unavailable backend 'nope'"):
        kernels.get_backend("nope", "cpu")


def test_registered_backend_is_used_by_the_optimizer():
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs["blocksize"])
        reference.adam8bit_step(*args, **kwargs)

    kernels.register_backend("spy", spy, lambda device: device.type == "cpu")
    try:
        from adam8lib import Adam8bit

        p = torch.nn.Parameter(torch.randn(5000))
        opt = Adam8bit([p], backend="spy", blocksize=512)
        p.grad = torch.randn(5000)
        opt.step()
        assert calls == [512]
        with pytest.raises(ValueError, match="cannot run on device meta"):
            kernels.get_backend("spy", "meta")
    finally:
        kernels._BACKENDS.pop("spy")


@pytest.mark.parametrize("chunk_size", [256, 1024, 1 << 16])
def test_reference_result_does_not_depend_on_chunk_size(chunk_size):
    from adam8lib.quant import dynamic_map

    n = 10_003
    outs = []
    for cs in (chunk_size, 1 << 20):
        torch.manual_seed(0)
        p = torch.randn(n)
        s1, s2 = torch.full((n,), 127, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)
        a1, a2 = torch.zeros(40), torch.zeros(40)
        for step in (1, 2):
            g = torch.randn(n)
            reference.adam8bit_step(p, g, s1, s2, a1, a2, dynamic_map(True), dynamic_map(False), step=step,
                                    lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01,
                                    blocksize=256, chunk_size=cs)
        outs.append((p, s1, s2, a1, a2))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
