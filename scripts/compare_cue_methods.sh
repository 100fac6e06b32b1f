#!/usr/bin/env bash
# How the default CNN cue method was chosen: the hard instance-retrieval setting (crops keep 10-30 % of the
# area, 10 copies per photo and edit = 1,050 queries) with each cue method of EfficientNet-Lite0.
# Usage: scripts/compare_cue_methods.sh [PYTHON]   (writes docs/results/instance_retrieval_lite0_hard_*.json)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
for m in grid kmeans attention; do
  "$PY" scripts/eval_instance_retrieval.py --cue-method "$m" --repeats 10 --crop-area 0.1 0.3 --seed 1 \
    --json "docs/results/instance_retrieval_lite0_hard_$m.json"
done
