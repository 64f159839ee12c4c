"""adam8lib — 8-bit Adam built from scratch, the library of the adam8 course.

Modules, in the order the course builds them:

* :mod:`adam8lib.ema` — moving averages of g and g², bias correction (lesson 02)
* :mod:`adam8lib.adam` — the fp32 Adam/AdamW rule, equal to torch.optim (lesson 03)
* :mod:`adam8lib.quant` — absmax int8, the dynamic map, blockwise quantization (04–06)
* :mod:`adam8lib.optim` — ``Adam8bit`` / ``AdamW8bit`` (07), stepping through
  :mod:`adam8lib.kernels` (reference PyTorch, Triton (08), fast CPU); ``Adam4bit``, ``AdamFp8``
  and bf16 weights with stochastic rounding (12), formats in :mod:`adam8lib.formats`
* :mod:`adam8lib.family`, :mod:`adam8lib.muon` — ``Lion8bit``, ``AdEMAMix8bit``, ``RMSprop8bit``,
  ``Adagrad8bit``, ``SGD8bit``, ``Adan8bit``, ``Muon8bit``: update rules (:mod:`adam8lib.rules`) on one quantized-state
  core (:mod:`adam8lib.quantized_state`; FSDP2 shards in the whole tensor's blocks: :mod:`adam8lib.global_blocks`)
* :mod:`adam8lib.memory` — estimated and measured optimizer memory (01, 09)
* :mod:`adam8lib.release` — gradient release: each parameter stepped inside backward, its gradient freed
* :mod:`adam8lib.memory_tracker` — measured live tensor bytes per category over a training step
* :mod:`adam8lib.master_weights` — compressed master weights: bf16 + an int16 (exact) or int8 (24-bit) correction
* :mod:`adam8lib.training` — weight-decay groups and DistilBERT for fine-tuning (10)
* :mod:`adam8lib.distributed` — FSDP2 shards (DTensor), checkpoints that reshard (11)
"""

from .adam import adam_step
from .ema import adam_moments, bias_correction, ema_update
from .family import AdEMAMix, AdEMAMix8bit, Adagrad8bit, Adan, Adan8bit, Lion, Lion4bit, Lion8bit, RMSprop8bit, SGD8bit
from .memory import compute_optimizer_size, estimate_optimizer_memory
from .master_weights import CompressedMasterWeights, join_master, split_master
from .memory_tracker import MemoryTracker, track_step
from .muon import Muon8bit
from .optim import Adam4bit, Adam8bit, AdamFp8, AdamW4bit, AdamW8bit, AdamWFp8, LowBitAdam
from .release import GradientReleasedError, ReleaseHandle, release_gradients
from .quant import (
    absmax_dequantize,
    absmax_quantize,
    dequantize_blockwise,
    dynamic_map,
    quantize_blockwise,
)
from .training import decay_parameter_names, make_param_groups

__version__ = "0.1.0"

__all__ = [
    "Adam8bit",
    "AdamW8bit",
    "Adam4bit",
    "AdamW4bit",
    "AdamFp8",
    "AdamWFp8",
    "LowBitAdam",
    "Lion",
    "Lion8bit",
    "Lion4bit",
    "AdEMAMix",
    "AdEMAMix8bit",
    "RMSprop8bit",
    "Adagrad8bit",
    "SGD8bit",
    "Adan",
    "Adan8bit",
    "Muon8bit",
    "adam_step",
    "adam_moments",
    "bias_correction",
    "ema_update",
    "absmax_quantize",
    "absmax_dequantize",
    "dynamic_map",
    "quantize_blockwise",
    "dequantize_blockwise",
    "estimate_optimizer_memory",
    "compute_optimizer_size",
    "decay_parameter_names",
    "make_param_groups",
    "release_gradients",
    "ReleaseHandle",
    "GradientReleasedError",
    "MemoryTracker",
    "track_step",
    "CompressedMasterWeights",
    "split_master",
    "join_master",
]
