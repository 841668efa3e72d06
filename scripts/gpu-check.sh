#!/usr/bin/env bash
# On a machine with a CUDA GPU: the CUDA tests, then decoding and training speed on the GPU
# (docs/performance.md says what each measures). Writes its outputs to the folder given
# (default benchmarks/results/gpu-DATE); each step has a time limit so the whole fits ~10 min.
# The Multi30k card is a separate run: python benchmarks/multi30k.py --time-budget 4m (needs
# ../shared/data/multi30k).
# Needs tformer's packages importable by $PYTHON (default python3), transformers for the peers.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results/gpu-$(date +%F)}"
source scripts/gpu-common.sh
step 200 cuda-tests.txt "$py" -m pytest tests/test_cuda.py -v -p no:cacheprovider -o timeout=180
step 60 decode-small.txt "$py" benchmarks/decode_speed.py --device cuda --shape small --cache-only
step 80 decode-base.txt "$py" benchmarks/decode_speed.py --device cuda --shape base --cache-only
# Training: the paper's base shape at a GPU user's batch (b_batch, from gpu-common.sh) in
# fp32, TF32 and bf16 next to the peers, then all three compiled; shape S at ~4,000 tokens.
step 150 train-B.txt "$py" benchmarks/train_speed.py --device cuda --shapes B --batch "$b_batch" \
    --precisions fp32,tf32,bf16 --repeats 5
step 200 train-B-compiled.txt "$py" benchmarks/train_speed.py --device cuda --shapes B \
    --batch "$b_batch" --precisions none --compile --repeats 3
step 60 train-S.txt "$py" benchmarks/train_speed.py --device cuda --shapes S --batch 125 \
    --precisions bf16 --repeats 5
