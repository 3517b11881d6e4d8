#!/usr/bin/env bash
# One command for a GPU machine: the CUDA kernel tests, then a short decomposed-vs-SDPA timing (< 5 minutes).
# Usage: scripts/gpu_check.sh [OUT_DIR]   (writes OUT_DIR/gpu_bench.json; default runs/gpu_check)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${1:-${OUT:-runs/gpu_check}}
mkdir -p "$OUT"
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA device visible to torch; nothing to check" >&2
  exit 2
fi
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
PYTHONPATH=src timeout 180 $PY -m pytest -q -s tests/kernels/test_cuda.py tests/kernels/test_decomposed.py -x \
  -p no:cacheprovider 2>&1 | tail -20
PYTHONPATH=src timeout 120 $PY scripts/gpu_bench.py --out "$OUT/gpu_bench.json"
