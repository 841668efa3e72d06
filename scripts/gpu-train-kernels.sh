#!/usr/bin/env bash
# On a machine with a CUDA GPU: what the compiled training step at shape B (25,024 target
# tokens) spends outside its matrix products. The step next to both peers (the 1.3x target is
# read within one run), the step without dropout (what dropout's kernels cost), and the
# compiler's generated code for the step, where the fused layer-norm, dropout and residual
# kernels can be read (docs/performance.md). Writes to the folder given (default
# benchmarks/results/gpu-kernels-DATE); every step has a time limit so the whole fits ~9
# minutes. Needs transformers for the HF Marian peer.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results/gpu-kernels-$(date +%F)}"
STEP_TAIL=6
source scripts/gpu-common.sh
step 240 peers.txt "$py" "${speed[@]}" --impls tformer,hf-marian,torch.nn.Transformer
step 120 no-dropout.txt "$py" "${speed[@]}" --impls tformer --dropout 0
step 120 output-code.txt env TORCH_LOGS=output_code "$py" benchmarks/train_speed.py \
    --one tformer B bf16 2 --batch "$b_batch" --device cuda --compile
