#!/usr/bin/env bash
# loom's .bin/.idx writer against a numpy reader written from the format description the way
# Megatron's IndexedDataset reads it (Debian's /usr/bin/python3 with python3-numpy).
set -euo pipefail
if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  echo "indexed_numpy_test: Debian's python3-numpy is required (run tools/setup)" >&2
  exit 1
fi
out="${TEST_TMPDIR:-/tmp}/indexed_numpy"
rm -rf "$out"
mkdir -p "$out"
tests/reference/write_indexed "$out" >"$out/expected.json"
/usr/bin/python3 tests/reference/check_indexed_numpy.py "$out/expected.json"
