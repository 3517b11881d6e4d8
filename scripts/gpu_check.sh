#!/usr/bin/env bash
# One command for a GPU machine: the CUDA kernel tests (and the CPU property suite of the decomposed kernel under
# that machine's torch), then a short decomposed-vs-SDPA/flex benchmark and a profile. 67-97 s of command time on one
# H200 (six runs), plus the machine's start.
# Usage: scripts/gpu_check.sh [OUT_DIR]   (writes OUT_DIR/pytest.log, OUT_DIR/gpu_bench.json, OUT_DIR/gpu_bench.log,
# OUT_DIR/gpu_profile.txt;
# default runs/gpu_check). Exit status: the tests' (the benchmark runs either way).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3 || command -v python)}
OUT=${1:-${OUT:-runs/gpu_check}}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA device visible to torch; nothing to check" >&2
  exit 2
fi
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
timeout 200 $PY -m pytest -q --maxfail=15 -p no:cacheprovider tests/kernels/test_cuda.py tests/kernels/test_decomposed.py \
  -o addopts="" -rs 2>&1 | tee "$OUT/pytest.log" | tail -25
status=${PIPESTATUS[0]}
timeout 270 $PY scripts/gpu_bench.py --profile --out "$OUT/gpu_bench.json" 2>&1 | tee "$OUT/gpu_bench.log" | cut -c1-400
echo "gpu_check: tests exit $status, benchmark exit ${PIPESTATUS[0]}"
exit "$status"
