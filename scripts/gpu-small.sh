#!/usr/bin/env bash
# On a machine with a CUDA GPU, in about 3 minutes: decoding at the small shape next to HF
# generate and CTranslate2 on the GPU, then the eager bf16 training step at shape S next to
# the peers, and tformer's step compiled and replayed as CUDA graphs (S is launch-bound).
# Writes to the folder given (default benchmarks/results/gpu-small-DATE).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results/gpu-small-$(date +%F)}"
STEP_TAIL=8
source scripts/gpu-common.sh
step 70 decode-small.txt "$py" benchmarks/decode_speed.py --device cuda --shape small --cache-only
step 60 train-S.txt "$py" benchmarks/train_speed.py --device cuda --shapes S --batch 125 \
    --precisions bf16 --repeats 5
step 70 train-S-graphs.txt "$py" benchmarks/train_speed.py --device cuda --shapes S \
    --batch 125 --precisions none --compile --compile-mode reduce-overhead --impls tformer \
    --repeats 5
