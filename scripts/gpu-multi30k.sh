#!/usr/bin/env bash
# On a machine with a CUDA GPU: Multi30k en->de cards from two shipped recipes, trained side by
# side on the one GPU (each a separate process with the same wall-clock budget; both are
# launch-bound, so neither fills the GPU), each averaged, chosen on validation and scored on
# test2016 by benchmarks/multi30k.py.
# Usage: gpu-multi30k.sh OUT [BUDGET (default 7m)]. Needs ../shared/data/multi30k and tformer's
# packages importable by $PYTHON (default python3); the logs are written to OUT as they go.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results/gpu-multi30k-$(date +%F)}"
budget="${2:-7m}"
source scripts/gpu-common.sh
recipes=(multi30k-swiglu-rope multi30k-pre-swiglu-rope)
started=$SECONDS
for recipe in "${recipes[@]}"; do
    # Eight threads each: the machine's cores shared between the two runs.
    OMP_NUM_THREADS=8 timeout 560 "$py" benchmarks/multi30k.py --recipe "$recipe" \
        --time-budget "$budget" ${MULTI30K_ARGS:-} > "$out/$recipe.log" 2>&1 &
done
wait
echo "both Multi30k runs ended after $((SECONDS - started)) s"
for recipe in "${recipes[@]}"; do
    tail -n 3 "$out/$recipe.log"
    cp "checkpoints/multi30k-en-de-${recipe#multi30k-}/metrics.jsonl" \
        "$out/$recipe-metrics.jsonl" 2>/dev/null
done
tar -czf "$out/cards.tar.gz" benchmarks/results/multi30k-en-de-*swiglu-rope-"$(date +%F)".* \
    2>/dev/null
