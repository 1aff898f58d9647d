#!/usr/bin/env bash
# Side by side on this machine, one command: loom bench and the PyTorch CPU baseline on the
# same spec, batch, sequence length and thread count.
#   tools/bench/compare.sh SPEC BATCH SEQ [STEPS]
# Example (the BENCHMARKS.md figures): tools/bench/compare.sh configs/gpt2_124m.json 8 128
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
spec=$1 batch=$2 seq=$3 steps=${4:-10}
threads=$(nproc)
echo "== loom bench ($threads threads)"
OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads "$root/tools/loom" bench "$spec" \
  --set train.micro_batch_size="$batch" --set train.seq_length="$seq" --steps "$steps" --json
echo "== PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') ($threads threads)"
OMP_NUM_THREADS=$threads /usr/bin/python3 "$root/tools/bench/torch_gpt.py" "$spec" \
  --batch "$batch" --seq "$seq" --steps "$steps" --threads "$threads"
