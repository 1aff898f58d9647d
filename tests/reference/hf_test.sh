#!/usr/bin/env bash
# loom against Hugging Face transformers through the safetensors checkpoint format.
#   export: tiny GPT-2, LLaMA, Qwen2, Mixtral and Qwen2-MoE-style loom models exported,
#           loaded by from_pretrained of GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM,
#           MixtralForCausalLM and Qwen2MoeForCausalLM, same logits (qwen2_moe_plain: a mixture of experts Mixtral
#           cannot express, for its unnormalised top-K, written as a Qwen2-MoE with zero
#           q/k/v biases and a shared expert of width 0); Qwen3 and Qwen3-MoE
#           (qk_layernorm), which transformers 4.40 lacks, against the re-implementation in
#           qwen3_moe_ref.py;
#   import: random tiny models of those seven families saved by transformers'
#           save_pretrained (Qwen3, Qwen3-MoE: by qwen3_moe_ref.py in their layout), read by
#           loom (spec from config.json, weights by loom name), same logits.
# Needs the Hugging Face environment of tools/setup at $LOOM_PYREF (tools/loom test passes
# it; default ~/.cache/loom/pyref). usage: hf_test.sh export|import
set -euo pipefail
direction=$1
# Bazel runs tests without HOME; the account's home directory is where tools/setup put it.
home="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"
pyref="${LOOM_PYREF:-${XDG_CACHE_HOME:-$home/.cache}/loom/pyref}"
py="$pyref/bin/python"
if ! "$py" -c 'import torch, transformers, safetensors' 2>/dev/null; then
  echo "hf_test: $py cannot import torch, transformers and safetensors: the Hugging Face" \
    "environment is missing; run tools/setup (or set LOOM_PYREF to it)" >&2
  exit 1
fi
plugins=(kernels/cpu plugins/transformer plugins/fused_attention plugins/moe plugins/optim
  plugins/checkpoint)
work="${TEST_TMPDIR:-$(mktemp -d)}/hf_$direction"
rm -rf "$work" && mkdir -p "$work"
export OMP_NUM_THREADS=2
if [[ "$direction" == export ]]; then
  for spec in gpt2_tiny llama_tiny qwen2_hf_tiny qwen3_hf_tiny mixtral_hf_tiny qwen2_moe_hf_tiny qwen2_moe_plain_hf_tiny \
    qwen3_moe_hf_tiny; do
    tests/reference/hf_reference export "tests/reference/$spec.json" "$work/$spec" "${plugins[@]}"
    "$py" tests/reference/check_hf.py check-export "$work/$spec"
  done
else
  for family in gpt2 llama qwen2 qwen3 mixtral qwen2_moe qwen3_moe; do
    "$py" tests/reference/check_hf.py make "$work/$family" "$family"
    tests/reference/hf_reference import "$work/$family" "${plugins[@]}"
    "$py" tests/reference/check_hf.py check-import "$work/$family"
  done
fi
