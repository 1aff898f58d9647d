"""Reads a loom run's TensorBoard event file with TensorBoard's own reader and checks every
scalar against metrics.jsonl, and checks the PNG `loom plot` drew.

Runs with the python3 first on PATH, which has tensorboard (tools/requirements.txt).

usage: check_tensorboard.py RUN_DIR PNG
"""
import glob
import json
import math
import sys

from tensorboard.backend.event_processing import event_accumulator

run_dir, png = sys.argv[1], sys.argv[2]
files = glob.glob(f"{run_dir}/events.out.tfevents.*")
assert len(files) == 1, f"expected one event file in {run_dir}, found {files}"
acc = event_accumulator.EventAccumulator(files[0], size_guidance={"scalars": 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
print("TensorBoard reads tags:", sorted(tags))

# metrics.jsonl key -> TensorBoard tag
names = {"loss": "lm loss", "lr": "learning-rate", "grad_norm": "grad-norm",
         "tokens_per_s": "throughput/tokens_per_s", "step_ms": "throughput/step_ms",
         "pipeline_bubble": "pipeline_bubble", "valid_loss": "lm loss validation"}
expected = {}
with open(f"{run_dir}/metrics.jsonl") as f:
    for line in f:
        rec = json.loads(line)
        for key, tag in names.items():
            if key in rec and rec[key] is not None:
                expected.setdefault(tag, []).append((rec["step"], rec[key]))
checked = 0
for tag, points in expected.items():
    assert tag in tags, f"tag {tag!r} missing from the event file"
    got = [(e.step, e.value) for e in acc.Scalars(tag)]
    assert [s for s, _ in got] == [s for s, _ in points], (tag, got, points)
    for (step, value), (_, want) in zip(got, points):
        # simple_value is a float32
        assert math.isclose(value, want, rel_tol=1e-6, abs_tol=1e-12), (tag, step, value, want)
        checked += 1
for tag in ("lm loss", "learning-rate", "grad-norm", "pipeline_bubble", "lm loss validation"):
    assert tag in expected, f"the run logged no {tag}"
print(f"{checked} scalars equal to metrics.jsonl (float32)")

with open(png, "rb") as f:
    head = f.read()
assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
assert len(head) > 10000, f"the plot is only {len(head)} bytes"
print(f"plot: {png}, {len(head)} bytes")
