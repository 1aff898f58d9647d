#!/usr/bin/python3
"""Context parallelism against one rank at a long sequence, on this machine's CPU ranks.

Runs with Debian's /usr/bin/python3 (standard library only). Trains a small GPT (learned
positions, fused attention) at sequence length T for a few steps, once on one rank and then
with each sequence split over cp ranks (`tools/loom train ... --nproc CP --set
parallel.cp=CP`, p2p ring and all_gather), one OpenMP and one OpenBLAS thread per rank, and
reads rank 0's metrics.jsonl: ms per step and tokens/s (steps after the first), and the peak
of the host allocator. Activation memory is that peak minus what the run's memory estimate
counts as weights, gradients, master weights and optimizer state (the same on every layout
here: no distributed optimizer). Prints a Markdown table.

usage: context_parallel.py [--seq 2048] [--cp 2] [--steps 4] [--hidden 256] [--layers 2]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile


def run(args, name, cp, comm, workdir):
    spec = {
        "model": {"impl": "gpt", "num_layers": args.layers, "hidden_size": args.hidden,
                  "num_attention_heads": 4, "vocab_size": 512,
                  "max_position_embeddings": args.seq,
                  "layer": {"impl": "transformer_layer", "norm": {"impl": "layernorm"},
                            "attention": {"impl": "fused"}, "mlp": {"impl": "mlp"}},
                  "final_norm": {"impl": "layernorm"}},
        "optimizer": {"impl": "adamw", "lr": 1e-4},
        "data": {"mock": True},
        "parallel": {"cp": cp, "cp_comm_type": comm},
        "train": {"steps": args.steps, "micro_batch_size": 1, "global_batch_size": 1,
                  "seq_length": args.seq, "log_interval": 1, "eval_interval": 1000000},
        "checkpoint": {"save_at_end": False},
    }
    path = os.path.join(workdir, f"{name}.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    run_dir = os.path.join(workdir, name)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = [args.loom, "train", path, "--run-dir", run_dir]
    if cp > 1:
        cmd += ["--nproc", str(cp)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    m = re.search(r"memory estimate: [0-9.e+-]+ GiB: weights ([0-9.e+-]+), grads ([0-9.e+-]+), "
                  r"master ([0-9.e+-]+), optimizer ([0-9.e+-]+)", out.stdout)
    if m is None:
        sys.exit(f"{name}: no memory estimate in the output")
    static = sum(float(x) for x in m.groups()) * 2**30
    ms, tps, peak = [], [], 0
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if "step_ms" not in rec or rec["step"] <= 1:
                continue
            ms.append(rec["step_ms"])
            tps.append(rec["tokens_per_s"])
            peak = max(peak, rec["peak_mem_bytes"])
    return sum(ms) / len(ms), sum(tps) / len(tps), peak, peak - static


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--cp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--loom", default="tools/loom")
    args = ap.parse_args()
    mib = 2.0**20
    print("| layout | ms/step | tokens/s | peak memory per rank | activations per rank |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as workdir:
        rows = [("one rank", 1, "p2p"), (f"cp{args.cp} p2p", args.cp, "p2p"),
                (f"cp{args.cp} all_gather", args.cp, "all_gather")]
        base = None
        for name, cp, comm in rows:
            ms, tps, peak, act = run(args, name.replace(" ", "_"), cp, comm, workdir)
            base = base or (ms, act)
            print(f"| {name} | {ms:.0f} ({base[0] / ms:.2f}x) | {tps:.0f} | {peak / mib:.1f} MiB | "
                  f"{act / mib:.1f} MiB ({act / base[1]:.2f}x) |", flush=True)


if __name__ == "__main__":
    main()
