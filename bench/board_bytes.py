"""State bytes per parameter, measured from what an optimizer has allocated on the LM.

:func:`state_bytes` walks ``optimizer.state``: every tensor in it (a tensor subclass such as torchao's
quantized states is opened with ``__tensor_flatten__`` down to its plain tensors), each storage counted
once (a map shared between parameters is one allocation), its ``untyped_storage().nbytes()``. Python
numbers (a step counter kept as an int) take no tensor memory and count 0. The bytes are split by
the parameter they belong to: tensors of fewer than 4096 elements (``SMALL``: biases, norm weights of
the LM; bitsandbytes' and adam8lib's ``min_8bit_size``) keep fp32 states in every library here, so they
are reported apart.

:func:`measure` builds the LM (seed 0), takes one step of the row's optimizer on one training batch and
measures: the states exist, at their final size, after the first step.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

SMALL = 4096


def _leaves(t: torch.Tensor):
    if hasattr(t, "__tensor_flatten__") and type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        names, _ = t.__tensor_flatten__()
        for name in names:
            yield from _leaves(getattr(t, name))
    else:
        yield t


def _walk(value: Any):
    if isinstance(value, torch.Tensor):
        yield from _leaves(value)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _walk(v)


def state_bytes(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Bytes of every tensor in ``optimizer.state`` (each storage once), in total and split by the
    size of the parameter they belong to (``SMALL``)."""
    seen: set[tuple[int, int]] = set()
    out = {"total": 0, "small_params_bytes": 0, "large_params_bytes": 0, "tensors": 0}
    for p, st in optimizer.state.items():
        where = "small_params_bytes" if p.numel() < SMALL else "large_params_bytes"
        for t in _walk(st):
            storage = t.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            if key in seen:
                continue
            seen.add(key)
            out["total"] += storage.nbytes()
            out[where] += storage.nbytes()
            out["tensors"] += 1
    return out


def measure(make_optimizer: Callable[[list[dict[str, Any]], Any], torch.optim.Optimizer], cfg,
            named: Callable | None = None) -> dict[str, Any]:
    """One step of ``make_optimizer(groups, cfg)`` on the LM (seed 0), then :func:`state_bytes`, per parameter.

    ``named(model)`` (optional) is called on the model first (the board tags the parameters' names)."""
    import lm_task
    from adam8lib.training import make_param_groups

    model = lm_task.build_model(cfg, 0)
    if named is not None:
        named(model)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    n_small = sum(p.numel() for p in params if p.numel() < SMALL)
    opt = make_optimizer(make_param_groups(model, cfg.weight_decay), cfg)
    batch = next(lm_task.batches(lm_task.load_corpus()["train"], cfg, 0))
    lm_task.lm_loss(model, batch).backward()
    opt.step()
    b = state_bytes(opt)
    return {
        "bytes_per_param": b["total"] / n,
        "large_tensors_bytes_per_param": b["large_params_bytes"] / (n - n_small),
        "small_tensors_bytes_per_param": b["small_params_bytes"] / n_small if n_small else 0.0,
        "state_bytes": b["total"], "parameters": n, "small_tensor_parameters": n_small,
        "state_tensors": b["tensors"],
    }
