#!/usr/bin/env bash
# One command for a GPU machine: the CUDA kernel tests, then a short benchmark of the decomposed kernel and the
# group-sorted FlexAttention prefill against SDPA (prefill and decode), then the whole model with random weights of
# real shapes (scripts/gpu_model_bench.py), then auto's break-evens there (bench-dispatch --device cuda). At most
# 6.3 min (each step has its timeout; every JSON is written row by row, so a step cut short still reports), plus the
# machine's start. The 2026-12-04 run (9.5 min of timeouts) spent
# most of them compiling FlexAttention kernels (~25 s per shape and variant): those come last now, and few.
# Usage: scripts/gpu_check.sh [--dry-run] [OUT_DIR]   (writes OUT_DIR/pytest.log, OUT_DIR/gpu_bench.json,
# OUT_DIR/gpu_bench.log, OUT_DIR/gpu_model_bench.json and .log; default runs/gpu_check). Exit status: the tests' (the
# benchmark runs either way). --dry-run, on a machine without a GPU: the CPU tests of the GPU path (eager
# FlexAttention, sync and launch counts) and the benchmark at tiny lengths on the CPU, so the script itself is checked
# before a GPU is lent (no numbers).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3 || command -v python)}
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT=${1:-${OUT:-runs/gpu_check}}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
if [ "$DRY" = 1 ]; then
  timeout 300 $PY -m pytest -q -p no:cacheprovider tests/kernels/test_flex_sorted.py tests/kernels/test_cuda.py \
    -o addopts="" 2>&1 | tee "$OUT/pytest.log" | tail -5
  status=${PIPESTATUS[0]}
  timeout 600 $PY scripts/gpu_bench.py --dry-run --out "$OUT/gpu_bench.json" > "$OUT/gpu_bench.log" 2>&1
  bench=$?
  timeout 300 $PY scripts/gpu_model_bench.py --dry-run --shapes smollm2-135m-32k --backends auto flex-sorted \
    --out "$OUT/gpu_model_bench.json" \
    > "$OUT/gpu_model_bench.log" 2>&1 || bench=$?
  # the flex-sorted diagnosis (run on its own on a GPU: python scripts/flex_sorted_diag.py), checked at a tiny length
  timeout 120 $PY scripts/flex_sorted_diag.py --length 300 --time-length 0 > "$OUT/flex_sorted_diag.log" 2>&1 \
    || bench=$?
  echo "gpu_check --dry-run: tests exit $status, benchmark exit $bench ($OUT/gpu_bench.json, not a measurement)"
  [ "$status" = 0 ] && [ "$bench" = 0 ]
  exit $?
fi
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA device visible to torch; nothing to check" >&2
  exit 2
fi
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
timeout 110 $PY -m pytest -q --maxfail=15 -p no:cacheprovider tests/kernels/test_cuda.py -o addopts="" -rs 2>&1 \
  | tee "$OUT/pytest.log" | tail -25
status=${PIPESTATUS[0]}
# kernels: decomposed vs SDPA at 4K-64K, then decode steps, then the flex-sorted prefill (its compiles last)
timeout 130 $PY scripts/gpu_bench.py --repeats 5 --out "$OUT/gpu_bench.json" 2>&1 | tee "$OUT/gpu_bench.log" \
  | cut -c1-400
bench=${PIPESTATUS[0]}
# the whole model, random weights of real shapes (a Llama-3.2-1B-shaped GQA config, SmolLM2-135M at 32K positions):
# prefill and decode against SDPA; stops starting rows after 50 s
timeout 80 $PY scripts/gpu_model_bench.py --budget-s 50 --out "$OUT/gpu_model_bench.json" 2>&1 \
  | tee "$OUT/gpu_model_bench.log" | cut -c1-400
model=${PIPESTATUS[0]}
# backend="auto"'s break-evens on this GPU (none measured yet: auto takes the sparse engines at every length there);
# OUT/dispatch/dispatch.json is the table to install (focusattn bench-dispatch --device cuda ... --install)
timeout 60 $PY -m focusattn bench-dispatch --device cuda --out "$OUT/dispatch" --lengths 4096 8192 16384 32768 65536 \
  --top-k 1 2 --decode-lengths 8192 32768 65536 131072 --repeats 3 --decode-steps 10 \
  --routing-file docs/results/data/routing-smollm2-135m-focus-k8.safetensors 2>&1 | tail -30
echo "gpu_check: tests exit $status, benchmark exit $bench, model benchmark exit $model, dispatch exit ${PIPESTATUS[0]}"
exit "$status"
