#!/usr/bin/env bash
# Does updating BatchNorm running statistics during fine-tuning move EfficientNet-Lite0's test retrieval on its
# own? Two runs with a learning rate of 1e-9 (weights practically fixed), 24 steps of random triplets on the
# Fashion-MNIST train classes, 128 px, evaluated on a seeded 300-image subset of the test classes before and after:
# (1) the default, BatchNorm frozen: before and after must be identical; (2) --train-batchnorm.
# Usage: scripts/cpu_batchnorm_check.sh [OUT_DIR]   (default runs/bn-check); prints the regis summaries.
set -euo pipefail
OUT=${1:-runs/bn-check}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
PY=${PYTHON:-python}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
common=(--data "$DATA" --backbone efficientnet-lite0 --image-size 128 --lr 1e-9 --steps 24 --warmup-steps 2
        --sampler random --triplets-per-batch 10 --eval-max-images 300 --eval-batch-size 100 --log-every 6
        --num-workers 0 --device cpu --quiet)
for mode in frozen train; do
  extra=()
  [ "$mode" = train ] && extra=(--train-batchnorm)
  echo "\$ $PY -m regis train triplet --out $OUT/$mode ${common[*]} ${extra[*]}"
  "$PY" -m regis train triplet --out "$OUT/$mode" "${common[@]}" "${extra[@]}"
done
