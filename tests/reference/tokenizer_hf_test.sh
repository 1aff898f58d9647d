#!/usr/bin/env bash
# loom's byte-level BPE tokenizer against Hugging Face `tokenizers`: the same ids and decoded
# text for tokenizers trained by `tokenizers` (tokenizer.json, vocab.json + merges.txt) and by
# `loom tokenizer train`. Needs the python3 first on PATH to have tokenizers==0.23.3
# (tools/requirements.txt, installed by tools/setup).
set -euo pipefail
if ! python3 -c 'import tokenizers' 2>/dev/null; then
  echo "tokenizer_hf_test: $(command -v python3 || echo 'no python3 on PATH') cannot import" \
    "tokenizers; run tools/setup (it installs tools/requirements.txt)" >&2
  exit 1
fi
python3 -c 'import tokenizers; print("tokenizers", tokenizers.__version__)'
work="${TEST_TMPDIR:-$(mktemp -d)}/tokenizer_hf"
mkdir -p "$work"
python3 tests/reference/check_tokenizer_hf.py tools/loom "$work"
