#!/usr/bin/env bash
# One GPU call for the ResNet-18 rows of the breaching parity (docs/attacks.md "Parity with breaching: DLG and
# Inverting Gradients on the ReLU ConvNet", docs/performance.md "GPU"): breaching 0.1.2's shipped
# `invertinggradients` attacker and ours matched to it (benchmarks/breaching_parity.py --part ig), both sides on the
# same gradient of torchvision's ResNet-18 (the models registry's `resnet18`, ImageNet stem) on
# IMAGE_SIZE photo_tiles (64x64 by default: at 32x32 its last BatchNorm sees 1x1 maps, which a training-mode
# gradient of one image cannot pass; 9 classes) trained TRAIN_EPOCHS epochs, in training
# mode (no buffers sent), the two settings of the anchors run side by side on the one GPU:
#   1. FedSGD: one image a gradient, IMAGES gradients of ITERATIONS Adam steps;
#   2. FedAvg: breaching's `local_updates` user, 4 local SGD steps of one image each (lr 1e-3), FEDAVG_IMAGES
#      updates of FEDAVG_ITERATIONS steps.
# Each part runs under a timeout of PART_S seconds (rows are written as each image finishes), so the call ends
# inside PART_S plus start-up: 8 minutes by default. BREACHING_PATH: the site-packages holding breaching 0.1.2 and
# hydra-core (python3.11 -m venv /work/breaching-venv && /work/breaching-venv/bin/pip install torch==2.14.1
# torchvision==0.29.1 breaching==0.1.2 hydra-core); without it the script exits 2. Results: ig_fedsgd.jsonl,
# ig_fedavg.jsonl and machine.txt in OUT_DIR. Run from the repo root:
#   BREACHING_PATH=/work/breaching-venv/lib/python3.11/site-packages bash benchmarks/gpu_breaching.sh runs/gpu_breaching
# CPU smoke test: DEVICE=cpu IMAGES=1 ITERATIONS=2 FEDAVG_ITERATIONS=2 TRAIN_EPOCHS=1 BREACHING_PATH=... \
#   bash benchmarks/gpu_breaching.sh /tmp/gpu_breaching
set -u
out=${1:-runs/gpu_breaching}
mkdir -p "$out"
: "${DEVICE:=cuda}" "${IMAGES:=2}" "${ITERATIONS:=2000}" "${FEDAVG_IMAGES:=1}" "${FEDAVG_ITERATIONS:=1000}"
: "${IMAGE_SIZE:=64}" "${TRAIN_EPOCHS:=5}" "${PART_S:=420}" "${PYTHON:=python3}" "${BREACHING_PATH:=}"
if [ -z "$BREACHING_PATH" ]; then
  echo "give BREACHING_PATH=DIR (the site-packages holding breaching 0.1.2 and hydra-core)" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 WANDB_MODE=offline PYTHONPATH="$PWD:$BREACHING_PATH"
{
  [ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PYTHON -c "import torch; from importlib.metadata import version; print('torch', torch.__version__, 'breaching', version('breaching'))"
} > "$out/machine.txt" 2>&1
run=(benchmarks/breaching_parity.py --part ig --backbone resnet18 --device "$DEVICE"
  --image-size "$IMAGE_SIZE" --train-epochs "$TRAIN_EPOCHS" --sides breaching "ours matched")
timeout "$PART_S" $PYTHON "${run[@]}" --images "$IMAGES" --iterations "$ITERATIONS" \
  > "$out/ig_fedsgd.jsonl" 2> "$out/ig_fedsgd.err" &
timeout "$PART_S" $PYTHON "${run[@]}" --images "$FEDAVG_IMAGES" --iterations "$FEDAVG_ITERATIONS" --local-steps 4 \
  > "$out/ig_fedavg.jsonl" 2> "$out/ig_fedavg.err"
fedavg=$?
wait %1
fedsgd=$?
echo "fedsgd rc $fedsgd, fedavg rc $fedavg, ${SECONDS}s in all" >> "$out/machine.txt"
cat "$out"/ig_fed*.jsonl "$out/machine.txt"
[ "$fedsgd" = 0 ] && [ "$fedavg" = 0 ]
