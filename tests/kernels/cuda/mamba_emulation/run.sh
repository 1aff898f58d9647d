#!/bin/bash
# Builds the Mamba-2 kernels' emulation test with g++ (no nvcc, no GPU) and runs it. Run from
# the repository root: tests/kernels/cuda/mamba_emulation/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../../.." && pwd)"
out="${TMPDIR:-/tmp}/mamba_emulation_$$"
cuda="${CUDA_HOME:-/usr/local/cuda}"
g++ -std=c++20 -O2 -Wno-attributes -Wno-unknown-pragmas \
  -include "$root/tests/kernels/cuda/emulation/emu_prelude.h" -I"$root" \
  -I"$root/sdk/include" -I"$cuda/include" "$here/emu_main.cc" -o "$out"
trap 'rm -f "$out"' EXIT
"$out"
