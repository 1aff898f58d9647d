#!/usr/bin/env bash
# loom against PyTorch: dump a tiny model's logits, loss, gradients and 10 AdamW steps from
# loom, then rebuild it in PyTorch (Debian's /usr/bin/python3 with python3-torch) from
# loom's weights and compare. usage: reference_test.sh SPEC
set -euo pipefail
spec=$1
if ! /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
  echo "reference_test: Debian's python3-torch and python3-numpy are required (run tools/setup)" >&2
  exit 1
fi
out="${TEST_TMPDIR:-/tmp}/$(basename "$spec" .json)"
tests/reference/dump_reference "$spec" "$out" kernels/cpu plugins/transformer \
  plugins/fused_attention plugins/optim plugins/moe
OMP_NUM_THREADS=2 /usr/bin/python3 tests/reference/check_against_torch.py "$spec" "$out"
