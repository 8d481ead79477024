#!/usr/bin/env bash
# One GPU call for the attack benchmarks that need a GPU (docs/performance.md "GPU", docs/attacks.md "Parity"):
#   1. Inverting Gradients parity on ResNet-18 (benchmarks/attack_parity.py --attacks ig): each side's cost per
#      iteration alone, then every case at once in WORKERS processes, with an iteration budget chosen from a short
#      probe of that concurrency so that the run ends inside BUDGET_S seconds;
#   2. GRNN's largest batch on digits (benchmarks/batch_recovery.py --attack grnn), B = 16, 64, 256, alongside.
# Results (7 files): JSON, log.txt, budget.txt and machine.txt in OUT_DIR (default runs/gpu_attacks). Run from the repo root:
#   bash benchmarks/gpu_attacks.sh runs/gpu_attacks
# CPU smoke test: DEVICE=cpu WORKERS=2 IMAGES=1 MAX_ITERATIONS=20 PROBE_ITERATIONS=3 BUDGET_S=120 \
#   GRNN_BATCHES="4" bash benchmarks/gpu_attacks.sh /tmp/gpu_attacks
set -u
out=${1:-runs/gpu_attacks}
mkdir -p "$out"
: "${DEVICE:=cuda}" "${WORKERS:=16}" "${IMAGES:=4}" "${MAX_ITERATIONS:=4800}" "${PROBE_ITERATIONS:=50}"
: "${BUDGET_S:=500}" "${GRNN_BATCHES:=16 64 256}" "${PYTHON:=python3}"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 WANDB_MODE=offline
started=$SECONDS
# CUDA MPS lets the workers' small kernels run side by side; used when it starts and answers, else plain sharing.
mps=off
if [ "$DEVICE" = cuda ] && [ "${MPS:-1}" = 1 ] && command -v nvidia-cuda-mps-control > /dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d && timeout 40 $PYTHON -c "import torch; torch.ones(1, device='cuda').sum().item()"; then
    mps=on
  else
    echo quit | nvidia-cuda-mps-control
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
fi
ig=(benchmarks/attack_parity.py --attacks ig --device "$DEVICE" --seeds 0 --ig-epochs 0 2)
{
  [ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PYTHON -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__)"
  echo "mps $mps"
} > "$out/machine.txt" 2>&1
# Each side alone, 200 iterations on one case: the per-iteration cost without contention.
timeout 120 $PYTHON "${ig[@]}" --images 1 --ig-epochs 0 --ig-iterations 200 --workers 1 \
  --output "$out/ig_alone.json" >> "$out/log.txt" 2>&1
# The contended cost: every job at once for PROBE_ITERATIONS iterations.
timeout 120 $PYTHON "${ig[@]}" --images "$IMAGES" --ig-iterations "$PROBE_ITERATIONS" --workers "$WORKERS" \
  --output "$out/ig_probe.json" >> "$out/log.txt" 2>&1
left=$((BUDGET_S - (SECONDS - started)))
iterations=$($PYTHON - "$out/ig_probe.json" "$PROBE_ITERATIONS" "$left" "$MAX_ITERATIONS" <<'PY'
import json, sys
results = json.load(open(sys.argv[1]))["results"]
per_iteration = max(r["cpu_s"] for r in results) / int(sys.argv[2])
usable = 0.8 * (float(sys.argv[3]) - 40)  # start-up of the workers, and a margin
print(max(200, min(int(sys.argv[4]), int(usable / per_iteration) // 200 * 200)))
PY
)
echo "seconds left $left, contended probe -> $iterations iterations" | tee "$out/budget.txt"
for b in $GRNN_BATCHES; do
  timeout 120 $PYTHON benchmarks/batch_recovery.py --attack grnn --data digits --batch-size "$b" --device "$DEVICE"
done > "$out/grnn_batch.jsonl" 2>&1 &
timeout $((left + 30)) $PYTHON "${ig[@]}" --images "$IMAGES" --ig-iterations "$iterations" --workers "$WORKERS" \
  --deadline-s $((left - 15)) --output "$out/ig_parity.json" >> "$out/log.txt" 2>&1
wait
[ "$mps" = on ] && echo quit | nvidia-cuda-mps-control
echo "total ${SECONDS}s" >> "$out/budget.txt"
grep -h "SUMMARY" -A 8 "$out/log.txt"; cat "$out/budget.txt" "$out/grnn_batch.jsonl"
