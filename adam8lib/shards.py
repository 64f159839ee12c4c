"""Where a shard of a parameter lies: a DTensor (FSDP2) parameter's local tensor, its rank's flat range of the whole
tensor, and the shapes of every rank's shard (``torch.chunk`` on dim 0 of a 1-D mesh).

The floor under :mod:`adam8lib.global_blocks` (a shard's states in the whole tensor's blocks) and
:mod:`adam8lib.distributed` (lesson 11: sharded steps and checkpoints), which both read these facts; it imports
neither. :mod:`adam8lib.distributed` names every function here too (its public names since lesson 11).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch

__all__ = ["is_dtensor", "is_sharded", "local_tensor", "local_param_and_grad", "global_offset", "shard_ranges",
           "shard_shapes", "local_range"]


def is_dtensor(t: Any) -> bool:
    """True for a ``torch.distributed.tensor.DTensor``. No DTensor can exist before that module is
    imported, so this never imports it (single-process steps pay nothing)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def is_sharded(p: Any) -> bool:
    """A DTensor parameter with a ``Shard`` placement (FSDP2): each rank holds part of it."""
    if not is_dtensor(p):
        return False
    from torch.distributed.tensor import Shard

    return any(isinstance(pl, Shard) for pl in p.placements)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: ``t.to_local()`` for a DTensor (shares its storage), else ``t``."""
    return t.to_local() if is_dtensor(t) else t


def local_param_and_grad(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(p, p.grad)`` as this rank holds them. A DTensor parameter needs a DTensor gradient
    placed the same way (FSDP2 makes it so); a mix raises TypeError instead of stepping a
    shard with a full gradient."""
    grad = p.grad
    if is_dtensor(p) != is_dtensor(grad):
        raise TypeError(
            f"parameter is a {type(p).__name__} but its gradient is a {type(grad).__name__}: a sharded (DTensor) "
            "parameter needs a DTensor gradient with the same placements"
        )
    if is_dtensor(p):
        if grad.placements != p.placements or grad.device_mesh != p.device_mesh:
            raise TypeError(f"gradient placements {grad.placements} differ from the parameter's {p.placements}")
        return p.to_local(), grad.to_local()
    return p, grad


def global_offset(p: torch.Tensor) -> int:
    """The flat index, in the whole parameter, of the first element this rank holds: 0 for a plain or
    replicated parameter, the start of this rank's chunk for one sharded on dim 0 of a 1-D mesh (FSDP2).
    What keys per-element randomness (stochastic rounding) to the element, not to the shard."""
    if not is_dtensor(p):
        return 0
    return local_range(p)[0] if is_sharded(p) else 0


def shard_ranges(shape: tuple[int, ...] | torch.Size, world_size: int) -> list[tuple[int, int]]:
    """Flat ``[start, stop)`` element ranges of each rank's shard of a tensor split on dim 0
    into ``world_size`` chunks the way FSDP2 and DTensor ``Shard(0)`` do (``torch.chunk``)."""
    shape = tuple(shape)
    splits = _row_splits(shape, world_size)
    if not shape:
        return [(0, 1)] + [(1, 1)] * (world_size - 1)
    row = math.prod(shape[1:])
    return [(start * row, stop * row) for start, stop in splits]


def _row_splits(shape: tuple[int, ...], world_size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` rows of each rank's chunk of dim 0 (``torch.chunk``'s split: ``ceil(rows / W)``
    rows each, the last ranks fewer or none)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    rows = shape[0] if shape else 1
    per = -(-rows // world_size)
    return [(min(r * per, rows), min((r + 1) * per, rows)) for r in range(world_size)]


def _check_layout(p: torch.Tensor) -> tuple[int, int]:
    """(rank, world size) of a DTensor sharded on dim 0 of a 1-D mesh; clear error otherwise."""
    from torch.distributed.tensor import Shard

    mesh, placements = p.device_mesh, p.placements
    if mesh.ndim != 1 or len(placements) != 1 or not isinstance(placements[0], Shard) or placements[0].dim != 0:
        raise NotImplementedError(
            f"sharded optimizer states (and their checkpoints) support DTensor parameters sharded on dim 0 of a "
            f"1-D mesh (FSDP2's fully_shard); "
            f"got placements {placements} on a {mesh.ndim}-D mesh"
        )
    return mesh.get_local_rank(), mesh.size()


def local_range(p: torch.Tensor) -> tuple[int, int]:
    """Flat ``[start, stop)`` of this rank's shard in the full parameter (``(0, numel)`` if plain)."""
    if not is_dtensor(p):
        return 0, p.numel()
    rank, world = _check_layout(p)
    start, stop = shard_ranges(p.shape, world)[rank]
    if stop - start != p.to_local().numel():
        raise ValueError(f"local shard of shape {tuple(p.to_local().shape)} is not chunk {rank} of {tuple(p.shape)}")
    return start, stop


def shard_shapes(shape: tuple[int, ...] | torch.Size, world_size: int) -> list[tuple[int, ...]]:
    """The local shape of each rank's shard of a tensor split on dim 0 (as :func:`shard_ranges`)."""
    shape = tuple(shape)
    splits = _row_splits(shape, world_size)
    if not shape:
        return [()] + [(0,)] * (world_size - 1)
    return [(stop - start, *shape[1:]) for start, stop in splits]
