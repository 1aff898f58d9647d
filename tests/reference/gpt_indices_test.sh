#!/usr/bin/env bash
# loom's GPT dataset indices against Megatron's algorithm rebuilt in numpy (Debian's
# /usr/bin/python3 with python3-numpy).
set -euo pipefail
if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  echo "gpt_indices_test: Debian's python3-numpy is required (run tools/setup)" >&2
  exit 1
fi
out="${TEST_TMPDIR:-/tmp}/gpt_indices"
rm -rf "$out"
tests/reference/gpt_indices "$out"
/usr/bin/python3 tests/reference/check_gpt_indices.py "$out"
