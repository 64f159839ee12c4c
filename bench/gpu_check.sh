#!/usr/bin/env bash
# GPU check of the fused Triton 8-bit Adam step, on one CUDA GPU (about 3-5 minutes on an H100/H200):
#   1. the kernel tests on CUDA (tests/kernels -m gpu: Triton kernels vs the reference backend, the
#      batched fp32 update of small tensors vs one at a time);
#   2. timings at 1e8 and 1e9 fp32 parameters: device-to-device copy, our fused step,
#      bitsandbytes AdamW8bit, torch AdamW(fused=True) -> bandwidths and ratios (bench/gpu_bench.py),
#      after a sweep of a few launch configs (tile, num_warps) of our kernel at 1e8.
# Needs about 20 GB of GPU memory (1e9 params: p + g = 8 GB, AdamW's states another 8 GB).
#
#   bash bench/gpu_check.sh                      # the full check
#   bash bench/gpu_check.sh --json gpu.json      # extra arguments go to bench/gpu_bench.py
#   bash bench/gpu_check.sh --cpu-smoke          # no GPU: tiny run under the Triton interpreter
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [[ " $* " == *" --cpu-smoke "* ]]; then
  echo "== CPU smoke run (Triton interpreter): checks the script, measures nothing"
  TRITON_INTERPRET=1 "$PYTHON" bench/gpu_bench.py --sweep "$@"
  exit 0
fi

"$PYTHON" - <<'EOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("No CUDA GPU visible. On a CPU, run: bash bench/gpu_check.sh --cpu-smoke")
print("GPU:", torch.cuda.get_device_name(0))
EOF
if [[ "${TRITON_INTERPRET:-0}" == "1" ]]; then
  echo "TRITON_INTERPRET=1 would time the interpreter, not the GPU: unset it." >&2
  exit 1
fi

echo "== 1/2 kernel tests on CUDA"
"$PYTHON" -m pytest tests/kernels -m gpu -q -p no:cacheprovider

echo "== 2/2 timings"
"$PYTHON" bench/gpu_bench.py --sweep "$@"
