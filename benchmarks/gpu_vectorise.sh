#!/usr/bin/env bash
# One GPU call for vectorised clients (docs/performance.md "Vectorised clients"), on one device, both sides in one
# process each, the sequential path first:
#   1. vectorise_speed.py: 100 clients a round of the LeNet quickstart (digits, Dirichlet 0.5, Adam, 3 local
#      epochs), clients trained one by one (the Trainer path on the GPU) against vectorised, on the same GPU (the
#      wall-time ratio is the figure), then the quickstart itself (10 clients, 5 a round);
#   2. loop_overhead.py --device cuda: the quickstart (5 clients a round), sequential / vectorised / hand-written.
# Results in OUT_DIR (default runs/gpu_vectorise): machine.txt, vectorise_100.txt, vectorise_quickstart.txt,
# loop_overhead.txt. From the repo root:
#   bash benchmarks/gpu_vectorise.sh runs/gpu_vectorise
# CPU smoke test: ACCELERATOR=cpu DEVICE=cpu ROUNDS=1 bash benchmarks/gpu_vectorise.sh /tmp/gpu_vectorise
set -u
out=${1:-runs/gpu_vectorise}
mkdir -p "$out"
: "${ACCELERATOR:=gpu}" "${DEVICE:=cuda}" "${ROUNDS:=5}" "${PYTHON:=python3}"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 WANDB_MODE=offline
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1; nproc; uptime; } > "$out/machine.txt"
timeout 240 $PYTHON benchmarks/vectorise_speed.py --accelerator "$ACCELERATOR" --clients 100 --per-round 100 \
  --rounds "$ROUNDS" --repeats 2 2>&1 | grep -v Warning | tee "$out/vectorise_100.txt"
timeout 120 $PYTHON benchmarks/vectorise_speed.py --accelerator "$ACCELERATOR" --clients 10 --per-round 5 \
  --rounds "$ROUNDS" --repeats 2 2>&1 | grep -v Warning | tee "$out/vectorise_quickstart.txt"
timeout 200 $PYTHON benchmarks/loop_overhead.py --device "$DEVICE" --rounds "$ROUNDS" --repeats 1 2>&1 \
  | grep -v Warning | tee "$out/loop_overhead.txt"
