#!/usr/bin/python3
"""A Mamba-2 hybrid against a pure-attention model of the same shape at long sequences.

Runs with Debian's /usr/bin/python3 (standard library only). Takes configs/hybrid_tiny.json
(pattern "M-M*M-": three Mamba layers, one attention layer, two MLP layers) and the same spec
with every Mamba layer replaced by an attention layer ("*-***-"), trains each
for a few steps at micro-batch 1 and sequence length T (constant LR, no evaluation), and reads
metrics.jsonl: ms per step and tokens/s (the mean of the steps after the first) and the host
allocator's peak. Prints a Markdown table.

usage: hybrid.py [--seq 2048,8192] [--steps 3] [--threads 2] [--models attention,hybrid]
                 [--loom tools/loom]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(args, name, spec, seq, workdir):
    spec = json.loads(json.dumps(spec))
    spec["model"]["max_position_embeddings"] = seq
    spec["lr_schedule"] = {"impl": "constant"}
    spec["train"].update({"steps": args.steps, "micro_batch_size": 1, "global_batch_size": 1,
                          "seq_length": seq, "log_interval": 1, "eval_interval": 1000000})
    spec["checkpoint"] = {"save_at_end": False}
    path = os.path.join(workdir, f"{name}_{seq}.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    run_dir = os.path.join(workdir, f"{name}_{seq}")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
               OPENBLAS_NUM_THREADS=str(args.threads))
    out = subprocess.run([args.loom, "train", path, "--run-dir", run_dir], env=env,
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    params = re.search(r"model: gpt, ([0-9]+) parameters", out.stdout)
    ms, tps, peak = [], [], 0
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if "step_ms" not in rec:
                continue
            peak = max(peak, rec["peak_mem_bytes"])
            if rec["step"] > 1:
                ms.append(rec["step_ms"])
                tps.append(rec["tokens_per_s"])
    return int(params.group(1)) if params else 0, sum(ms) / len(ms), sum(tps) / len(tps), peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", default="2048,8192")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="attention,hybrid",
                    help="which rows to run (the first one run is the 1.00x of its T)")
    ap.add_argument("--loom", default="tools/loom")
    args = ap.parse_args()
    with open(os.path.join(ROOT, "configs", "hybrid_tiny.json")) as f:
        hybrid = json.load(f)
    attention = json.loads(json.dumps(hybrid))
    attention["model"]["hybrid_layer_pattern"] = hybrid["model"]["hybrid_layer_pattern"].replace(
        "M", "*")
    mib = 2.0**20
    print("| T | model | pattern | parameters | ms/step | tokens/s | peak memory |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as workdir:
        for seq in [int(s) for s in args.seq.split(",")]:
            base = None
            for name, spec in (("attention", attention), ("hybrid", hybrid)):
                if name not in args.models.split(","):
                    continue
                params, ms, tps, peak = run(args, name, spec, seq, workdir)
                base = base or (ms, peak)
                print(f"| {seq} | {name} | {spec['model']['hybrid_layer_pattern']} | {params} | "
                      f"{ms:.0f} ({base[0] / ms:.2f}x) | {tps:.0f} | {peak / mib:.1f} MiB "
                      f"({peak / base[1]:.2f}x) |", flush=True)


if __name__ == "__main__":
    main()
