#!/usr/bin/env bash
# loom against PyTorch: dump a tiny model's logits, loss, gradients and 10 AdamW steps from
# loom, then rebuild it in PyTorch (Debian's /usr/bin/python3 with python3-torch) from
# loom's weights and compare. usage: reference_test.sh SPEC
# A spec's "reference": {"layouts": {NAME: {"nproc": N, "parallel": {...}}}} also trains
# the same model with `loom train --nproc N` in each of those layouts (the spec without its
# "reference", with that "parallel" section); the checker replays the same steps in PyTorch
# and compares each run's losses, grad norms and final weights (its checkpoint) too.
set -euo pipefail
spec=$1
# Under the ASan build, without LeakSanitizer's exit-time scan: in the Bazel sandbox its
# tracer crashes ("Tracer caught signal 11") after clean runs of some of these processes, and
# which ones moves with unrelated allocations (tests/util/test_plugins.h, WithoutLeakCheck).
# Every other ASan and UBSan check stays; the in-process tests check leaks.
if [[ -n "${ASAN_OPTIONS:-}" ]]; then
  export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
fi
if ! /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
  echo "reference_test: Debian's python3-torch and python3-numpy are required (run tools/setup)" >&2
  exit 1
fi
out="${TEST_TMPDIR:-/tmp}/$(basename "$spec" .json)"
tests/reference/dump_reference "$spec" "$out" kernels/cpu plugins/transformer \
  plugins/fused_attention plugins/optim plugins/moe
layouts=()
while read -r name nproc; do
  [[ -n "$name" ]] || continue
  run="$out/layout_$name"
  rm -rf "$run" && mkdir -p "$run"
  /usr/bin/python3 - "$spec" "$name" "$run/spec.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
layout = spec.pop("reference")["layouts"][sys.argv[2]]
spec["parallel"] = layout["parallel"]
spec["train"]["log_interval"] = 1  # every step's loss, grad norm and LR in metrics.jsonl
spec["train"]["eval_interval"] = spec["train"]["steps"] + 1
spec["checkpoint"] = {"save_at_end": True}
json.dump(spec, open(sys.argv[3], "w"), indent=1)
PY
  if ! tools/loom train "$run/spec.json" --run-dir "$run" --nproc "$nproc" > "$run/train.log" 2>&1; then
    cat "$run/train.log"
    echo "reference_test: loom train in layout $name failed" >&2
    exit 1
  fi
  layouts+=("$name=$run")
done < <(/usr/bin/python3 -c '
import json, sys
for name, layout in json.load(open(sys.argv[1])).get("reference", {}).get("layouts", {}).items():
    print(name, layout["nproc"])' "$spec")
OMP_NUM_THREADS=2 /usr/bin/python3 tests/reference/check_against_torch.py "$spec" "$out" "${layouts[@]}"
