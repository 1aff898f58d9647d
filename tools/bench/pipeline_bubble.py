#!/usr/bin/python3
"""Measured pipeline bubble against the theory, on this machine's CPU ranks.

Runs with Debian's /usr/bin/python3 (standard library only). For each schedule and number
of micro-batches M, trains a GPT of 2 layers per pipeline stage (`tools/loom train ...
--nproc P --set parallel.pp=P`, one OpenMP and one OpenBLAS thread per rank) for a few
steps and reads the measured bubble from metrics.jsonl (pipeline_bubble: each rank's idle
share of its plan's span, averaged over ranks; steps after the first). The theory is the
bubble with a backward twice a forward (core/train/plan_simulator.h): (P-1)/(M+P-1) for
1f1b, (P-1)/(V M+P-1) for interleaved, (P-1)/(3M+P-1) for zb_h1. Prints a Markdown table.

usage: pipeline_bubble.py [--stages P] [--micro-batches 4,8,16] [--steps N] [--hidden C]
                          [--seq T] [--schedules 1f1b,interleaved,zb_h1]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def theory(schedule, p, m, v):
    if schedule == "interleaved":
        return (p - 1) / (v * m + p - 1)
    if schedule == "zb_h1":
        return (p - 1) / (3 * m + p - 1)
    return (p - 1) / (m + p - 1)


def run(args, schedule, m, workdir):
    p = args.stages
    vpp = 2 if schedule == "interleaved" else 1
    spec = {
        "model": {"impl": "gpt", "num_layers": 2 * p, "hidden_size": args.hidden,
                  "num_attention_heads": 4, "vocab_size": 512,
                  "max_position_embeddings": args.seq,
                  "layer": {"impl": "transformer_layer", "norm": {"impl": "layernorm"},
                            "attention": {"impl": "fused"}, "mlp": {"impl": "mlp"}},
                  "final_norm": {"impl": "layernorm"}},
        "optimizer": {"impl": "adamw", "lr": 1e-4},
        "data": {"mock": True},
        "parallel": {"pp": p, "vpp": vpp, "pipeline_schedule": {"impl": schedule}},
        "train": {"steps": args.steps, "micro_batch_size": 1, "global_batch_size": m,
                  "seq_length": args.seq, "log_interval": 1, "eval_interval": 1000000},
        "checkpoint": {"save_at_end": False},
        "log": {"trace_steps": 0},
    }
    path = os.path.join(workdir, f"{schedule}_{m}.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    run_dir = os.path.join(workdir, f"{schedule}_{m}")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([args.loom, "train", path, "--run-dir", run_dir, "--nproc", str(p)],
                         env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{schedule} M={m} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    bubbles, ms = [], []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if "pipeline_bubble" in rec and rec["step"] > 1:
                bubbles.append(rec["pipeline_bubble"])
                ms.append(rec["step_ms"])
    return sum(bubbles) / len(bubbles), sum(ms) / len(ms), vpp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--micro-batches", default="4,8,16")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--schedules", default="1f1b,interleaved,zb_h1")
    ap.add_argument("--loom", default="tools/loom")
    args = ap.parse_args()
    print(f"| schedule | M | measured bubble | theory (B = 2F) | ms/step |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as workdir:
        for schedule in args.schedules.split(","):
            for m in [int(x) for x in args.micro_batches.split(",")]:
                bubble, ms, vpp = run(args, schedule, m, workdir)
                name = schedule + (f" (vpp {vpp})" if vpp > 1 else "")
                print(f"| {name} | {m} | {100 * bubble:.1f}% | "
                      f"{100 * theory(schedule, args.stages, m, vpp):.1f}% | {ms:.0f} |",
                      flush=True)


if __name__ == "__main__":
    main()
