#!/bin/bash
# Builds the attention emulation test with g++ (no nvcc, no GPU) and runs it in both cp.async
# modes. Run from the repository root: tests/kernels/cuda/attention_emulation/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../../.." && pwd)"
out="${TMPDIR:-/tmp}/attention_emulation_$$"
cuda="${CUDA_HOME:-/usr/local/cuda}"
# The emulation directory comes first on the include path so that its attention_mma.cuh
# replaces the inline-PTX one.
g++ -std=c++20 -O2 -Wno-attributes -include "$here/emu_prelude.h" -I"$here" -I"$root" \
  -I"$root/sdk/include" -I"$cuda/include" "$here/emu_main.cc" -o "$out"
trap 'rm -f "$out"' EXIT
"$out" immediate
"$out" deferred
