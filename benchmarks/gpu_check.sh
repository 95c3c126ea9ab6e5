#!/usr/bin/env bash
# One prepared GPU check: NCCL pipeline tests, the demo on NCCL, the runtime benchmark with
# CUDA timing, the planner's prediction against a run (max_memory_allocated, CUDA timing). Prints one summary line per part (full logs in $OUT or /tmp/zbkit-gpu-check).
#   bash benchmarks/gpu_check.sh            # from the repository root, after `make setup`
# One GPU: every schedule through LocalPipeline on the GPU against plain autograd, and the
# split backward's time and memory against plain backward and torch's split, on the GPU
# (its caching allocator keeps freed memory: no page faults, unlike glibc on the CPU).
# NCCL runs one rank per GPU: the 4-rank tests need 4 GPUs, the demo and benchmark 2.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LOGS=${OUT:-/tmp/zbkit-gpu-check}
mkdir -p "$LOGS"
gpus=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
echo "gpus: $gpus ($($PY -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no cuda')" 2>&1))"

summary() {  # name, log, command...
  local name=$1 log=$2; shift 2
  local t0=$SECONDS
  if "$@" >"$log" 2>&1; then status=ok; else status="FAILED (exit $?)"; fi
  echo "$name: $status in $((SECONDS - t0)) s; $(grep -E "$SUMMARY" "$log" | tail -${LINES:-1} | tr '\n' ' ')"
}

if [ "$gpus" -ge 1 ]; then
  SUMMARY="passed|failed" summary "local pipelines on cuda, every schedule vs plain autograd" \
    "$LOGS/local.log" env ZBKIT_TEST_DEVICE=cuda $PY -m pytest -q -p no:cacheprovider \
    tests/pipeline/test_pipeline_local.py -k "matches_full_batch or split_first_stage"
  SUMMARY="I\+W / plain|gradients vs|memory MiB" LINES=15 summary "splitgrad on cuda" \
    "$LOGS/splitgrad.log" $PY benchmarks/splitgrad_overhead.py --device cuda --reps 30
else
  echo "local pipelines and splitgrad on cuda: not run (no GPU)"
fi
if [ "$gpus" -ge 4 ]; then
  SUMMARY="passed|failed|skipped" summary "nccl pipeline tests" "$LOGS/tests.log" \
    $PY -m pytest -q -p no:cacheprovider tests/pipeline/test_pipeline_dist.py -k nccl -rs
else
  echo "nccl pipeline tests: not run (they need 4 GPUs, found $gpus)"
fi
if [ "$gpus" -ge 2 ]; then
  ranks=$(( gpus < 4 ? gpus : 4 ))
  SUMMARY="speed-up|bubble|grad" LINES=4 summary "demo --backend nccl --ranks $ranks" "$LOGS/demo.log" \
    "$(dirname "$PY")/zbkit" demo --backend nccl --ranks "$ranks" --out "$LOGS/report"
  SUMMARY="zbkit/torch|ok|MISSED" LINES=3 summary "pipeline_vs_torch --backend nccl" "$LOGS/bench.log" \
    $PY benchmarks/pipeline_vs_torch.py --backend nccl --rounds 20
  SUMMARY="peak bytes|within|same order" LINES=18 summary "plan_accuracy --device cuda" "$LOGS/plan.log" \
    $PY benchmarks/plan_accuracy.py --device cuda
else
  echo "demo and runtime benchmark on nccl: not run (they need 2 GPUs, found $gpus)"
fi
