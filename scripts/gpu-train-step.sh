#!/usr/bin/env bash
# On a machine with a CUDA GPU: the compiled training step at the paper's base shape (B) with a
# GPU user's batch (782 x 32 = 25,024 target tokens), next to the peers, then tformer's step
# with one thing changed at a time (the step replayed as CUDA graphs, then also with the
# compiler tuning its kernels, which compiles for over 150 s), then a profile of the default
# step. docs/performance.md says what each measures (train_speed.py --dropout 0 measures what
# dropout costs). Writes to the folder given (default benchmarks/results/gpu-train-DATE); every
# step has a time limit so the whole fits ~9 minutes. Needs transformers for the HF Marian peer.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results/gpu-train-$(date +%F)}"
STEP_TAIL=6
source scripts/gpu-common.sh
step 200 peers.txt "$py" "${speed[@]}" --impls tformer,hf-marian,torch.nn.Transformer
step 80 graphs.txt "$py" "${speed[@]}" --impls tformer --compile-mode reduce-overhead
step 220 tuned-graphs.txt env TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 "$py" "${speed[@]}" \
    --impls tformer --compile-mode reduce-overhead
step 60 profile.txt "$py" benchmarks/train_speed.py --one tformer B bf16 3 --batch "$b_batch" \
    --device cuda --compile --profile
