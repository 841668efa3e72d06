#!/usr/bin/env bash
# The main job on a fresh clone: set up, train on the bundled date data, score it on the
# held-out test split, then show what the model does: a few generations and one attention map.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
tformer=".venv/bin/tformer"

"$tformer" train --out checkpoints/dates --overwrite
echo
echo "== tformer evaluate (test split) =="
"$tformer" evaluate checkpoints/dates --split test
echo
echo "== tformer generate (greedy) =="
"$tformer" generate checkpoints/dates "Thursday, 6 March 2025" "03/06/25" \
  "the sixth of March 2025" "6 Mar. 2025" "December 31st, 1999"
echo
echo "== tformer generate --temperature 0.8 --num-samples 3 --seed 0 =="
"$tformer" generate checkpoints/dates "the sixth of March 2025" --temperature 0.8 \
  --num-samples 3 --seed 0
echo
echo "== tformer inspect-attention (cross-attention, last layer, mean of heads) =="
"$tformer" inspect-attention checkpoints/dates "Thursday, 6 March 2025"
