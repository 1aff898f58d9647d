#!/usr/bin/python3
"""A tiny mixture of experts against the dense model of the same active parameters, and the
two token dispatchers at ep2, on this machine's CPU ranks.

Runs with Debian's /usr/bin/python3 (standard library only). Trains configs/llama_tiny.json
(dense, MLP width 688) and configs/mixtral_tiny.json (8 experts of width 344, top-2: the
same active MLP parameters per token, 4x the MLP parameters) for a few steps on one rank,
then mixtral_tiny over 2 ranks as data replicas (dp2: every rank all 8 experts) and with
expert parallelism (ep2: 4 experts per rank) through the alltoall and the allgather
dispatchers, with expert tensor parallelism (etp2 over the two data ranks: every rank half
of every expert's F) and padded to a capacity, one OpenMP and one OpenBLAS thread per rank. Reads rank 0's metrics.jsonl:
ms per step and tokens/s (the mean of the steps after the first), MFU (active parameters),
the host allocator's peak. Prints a Markdown table.

usage: moe.py [--steps 4] [--batch 8] [--seq 256] [--loom tools/loom]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(args, name, config, extra, workdir, nproc=1):
    run_dir = os.path.join(workdir, name)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = [args.loom, "train", config, "--run-dir", run_dir,
           "--set", f"train.steps={args.steps}", "--set", "train.log_interval=1",
           "--set", "train.eval_interval=1000000", "--set", "checkpoint.save_at_end=false",
           "--set", f"train.micro_batch_size={args.batch}",
           "--set", f"train.seq_length={args.seq}",
           "--set", 'lr_schedule={"impl": "constant"}'] + extra
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    params = next((line.split("model: gpt, ")[1].split(" parameters")[0]
                   for line in out.stdout.splitlines() if "model: gpt, " in line), "?")
    ms, tps, mfu, peak = [], [], [], 0
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if "step_ms" not in rec or rec["step"] <= 1:
                continue
            ms.append(rec["step_ms"])
            tps.append(rec["tokens_per_s"])
            mfu.append(rec["mfu"])
            peak = max(peak, rec["peak_mem_bytes"])
    mean = lambda v: sum(v) / len(v)
    return params, mean(ms), mean(tps), mean(mfu), peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--loom", default="tools/loom")
    args = ap.parse_args()
    mib = 2.0**20
    dense, moe = "configs/llama_tiny.json", "configs/mixtral_tiny.json"
    gather = ["--set", 'model.layer.mlp.dispatcher.impl="allgather"']
    rows = [
        ("dense (llama_tiny), 1 rank", dense, [], 1),
        ("MoE 8 x top-2 (mixtral_tiny), 1 rank", moe, [], 1),
        ("MoE, dp2 (all experts on each rank)", moe, ["--set", "parallel.dp=2"], 2),
        ("MoE, ep2 alltoall", moe, ["--set", "parallel.ep=2"], 2),
        ("MoE, ep2 allgather", moe, ["--set", "parallel.ep=2"] + gather, 2),
        ("MoE, etp2 over dp2 (each expert's F split)", moe,
         ["--set", "parallel.dp=2", "--set", "parallel.etp=2"], 2),
        ("MoE, ep2 alltoall, capacity 1.25 padded", moe,
         ["--set", "parallel.ep=2", "--set", "model.layer.mlp.expert_capacity_factor=1.25",
          "--set", "model.layer.mlp.pad_to_capacity=true"], 2),
    ]
    print("| run | parameters | ms/step | tokens/s (all ranks) | MFU | peak memory per rank |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as workdir:
        for i, (name, config, extra, nproc) in enumerate(rows):
            params, ms, tps, mfu, peak = run(args, f"run{i}", config, extra, workdir, nproc)
            print(f"| {name} | {params} | {ms:.0f} | {tps:.0f} | {100 * mfu:.1f}% | "
                  f"{peak / mib:.1f} MiB |", flush=True)


if __name__ == "__main__":
    main()
