#!/usr/bin/env bash
# A pipelined run's TensorBoard scalars read back by TensorBoard's own reader and equal to
# metrics.jsonl (loss, LR, grad norm, throughput, validation loss, the measured bubble), and
# `loom plot` drawing the run. Needs tensorboard for the python3 first on PATH and
# matplotlib for /usr/bin/python3 (tools/setup installs both).
set -euo pipefail
if ! python3 -c 'import tensorboard' 2>/dev/null; then
  echo "tensorboard_plot_test: $(command -v python3 || echo 'no python3 on PATH') cannot import" \
    "tensorboard; run tools/setup (it installs tools/requirements.txt)" >&2
  exit 1
fi
work="${TEST_TMPDIR:-$(mktemp -d)}/tensorboard_plot"
rm -rf "$work" && mkdir -p "$work"
cat > "$work/spec.json" <<'JSON'
{
  "model": {"impl": "gpt", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
            "vocab_size": 64, "max_position_embeddings": 16,
            "layer": {"impl": "transformer_layer", "norm": {"impl": "layernorm"},
                      "attention": {"impl": "fused"}, "mlp": {"impl": "mlp"}},
            "final_norm": {"impl": "layernorm"}},
  "optimizer": {"impl": "adamw", "lr": 0.01},
  "lr_schedule": {"impl": "cosine", "warmup_steps": 2},
  "data": {"mock": true},
  "parallel": {"pp": 2},
  "train": {"steps": 6, "micro_batch_size": 2, "global_batch_size": 8, "seq_length": 16,
            "log_interval": 2, "eval_interval": 3, "eval_steps": 2},
  "checkpoint": {"save_at_end": false}
}
JSON
tools/loom train "$work/spec.json" --run-dir "$work/run" --nproc 2 > "$work/train.log" 2>&1 ||
  { cat "$work/train.log"; exit 1; }
tools/loom plot "$work/run" --out "$work/metrics.png"
python3 tests/tools/check_tensorboard.py "$work/run" "$work/metrics.png"
# A directory without a run: one message naming the file, exit 5 (a file).
set +e
err=$(tools/loom plot "$work/nothing" 2>&1 >/dev/null)
code=$?
set -e
echo "$err"
[[ $code -eq 5 && "$err" == *"metrics.jsonl does not exist"* ]] ||
  { echo "expected exit 5 naming metrics.jsonl, got $code: $err" >&2; exit 1; }
echo "ok"
