#!/usr/bin/env python3
"""Tables for the GPU bundle's report (tools/gpu_bundle_run.sh); any python3, stdlib only.

  gpu_bundle_report.py bench-table DIR      one Markdown row per spec from DIR/<name>.loom.json,
                                            <name>.eager.json, <name>.compile.json (any missing
                                            file is a "-" cell, with the reason from <name>.*.err)
  gpu_bundle_report.py first-step LOG       "first step S s" from torch_gpt.py's JSON in LOG
  gpu_bundle_report.py ncu-summary CSV [N]  kernels and GPU time of ONE training step from an
                                            `ncu --csv --metrics gpu__time_duration.sum` log of a
                                            run of several identical steps, and the top N (15)
                                            kernels by time
"""
import csv
import glob
import json
import os
import sys


def _load(path):
    try:
        with open(path) as f:
            text = f.read().strip()
        # The whole file (`loom bench --json` prints one indented object), else the last line
        # that parses (PyTorch's script may log before its one-line object).
        try:
            return json.loads(text)
        except ValueError:
            pass
        for line in reversed(text.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
    except (OSError, ValueError):
        pass
    return None


def _why(path):
    try:
        with open(path) as f:
            lines = [l.strip() for l in f if l.strip()]
        return (lines[-1][:60] if lines else "no output").replace("|", "/")
    except OSError:
        return "not run"


def bench_table(folder):
    names = sorted({os.path.basename(p).split(".")[0] for p in glob.glob(os.path.join(folder, "*.json"))}
                   | {os.path.basename(p).split(".")[0] for p in glob.glob(os.path.join(folder, "*.err"))})
    gib = 2 ** 30
    print("| spec | loom tokens/s | ms/step | MFU | peak mem GiB (vs estimate) | PyTorch eager tokens/s "
          "| torch.compile tokens/s (compile s; loom / compile) | loom / eager | loom unfused tokens/s (fused / unfused) "
          "| loom CUDA graph ms/step (direct / graph) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in names:
        b = _load(os.path.join(folder, n + ".loom.json"))
        e = _load(os.path.join(folder, n + ".eager.json"))
        c = _load(os.path.join(folder, n + ".compile.json"))
        if b:
            est = b.get("estimated_mem_bytes")
            mem = f"{b['peak_mem_bytes'] / gib:.2f}" + (
                f" ({100 * (b['peak_mem_bytes'] / est - 1):+.0f}%)" if est else "")
            cells = [f"{b['tokens_per_s']:.0f}", f"{b['ms_per_step_median']:.1f}",
                     f"{100 * b['mfu']:.1f}%", mem]
        else:
            cells = ["- (" + _why(os.path.join(folder, n + ".loom.err")) + ")", "-", "-", "-"]
        cells.append(f"{e['tokens_per_s']:.0f}" if e else "- (" + _why(os.path.join(folder, n + ".eager.err")) + ")")
        if c:
            vs = f"; loom {b['tokens_per_s'] / c['tokens_per_s']:.3f}x" if b else ""
            cells.append(f"{c['tokens_per_s']:.0f} ({c.get('first_step_s') or 0:.0f} s{vs})")
        elif os.path.exists(os.path.join(folder, n + ".compile.err")):
            cells.append("- (" + _why(os.path.join(folder, n + ".compile.err")) + ")")
        else:
            cells.append("-")
        cells.append(f"{b['tokens_per_s'] / e['tokens_per_s']:.2f}x" if b and e else "-")
        u = _load(os.path.join(folder, n + ".unfused.json"))
        if u:
            ratio = f" ({b['tokens_per_s'] / u['tokens_per_s']:.2f}x)" if b else ""
            cells.append(f"{u['tokens_per_s']:.0f}{ratio}")
        else:
            cells.append(_missing(folder, n, "unfused"))
        g = _load(os.path.join(folder, n + ".graph.json"))
        if g:
            ratio = f" ({b['ms_per_step_median'] / g['ms_per_step_median']:.2f}x)" if b else ""
            cells.append(f"{g['ms_per_step_median']:.2f}{ratio}")
        else:
            cells.append(_missing(folder, n, "graph"))
        print(f"| {n} | " + " | ".join(cells) + " |")
    # Other variants of loom's runs (e.g. dgelu: the gemm_epilogue derivative through
    # cuBLASLt), against the plain loom row.
    known = {"loom", "eager", "compile", "unfused", "graph"}
    others = sorted({tuple(os.path.basename(p).split(".")[:2])
                     for p in glob.glob(os.path.join(folder, "*.*.json"))
                     + glob.glob(os.path.join(folder, "*.*.err"))} - {(n, k) for n in names for k in known})
    if others:
        print()
        print("| spec | variant | tokens/s | ms/step | loom / variant |")
        print("|---|---|---|---|---|")
        for n, k in others:
            v = _load(os.path.join(folder, f"{n}.{k}.json"))
            b = _load(os.path.join(folder, n + ".loom.json"))
            if v:
                ratio = f"{b['tokens_per_s'] / v['tokens_per_s']:.3f}x" if b else "-"
                print(f"| {n} | {k} | {v['tokens_per_s']:.0f} | {v['ms_per_step_median']:.2f} | {ratio} |")
            else:
                print(f"| {n} | {k} | {_missing(folder, n, k)} | - | - |")


def _missing(folder, name, kind):
    """The cell of a variant that gave no figures: why, or '-' when it was not run."""
    err = os.path.join(folder, f"{name}.{kind}.err")
    return "- (" + _why(err) + ")" if os.path.exists(err) else "-"


_UNIT = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
         "second": 1e3, "s": 1e3}


def _period(names):
    """The length P of the repeating tail: names[-P:] == names[-2P:-P], the largest such P."""
    n = len(names)
    for p in range(n // 2, 0, -1):
        if names[n - p:] == names[n - 2 * p:n - p]:
            return p
    return 0


def ncu_summary(path, top=15):
    with open(path, errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.DictReader(lines))
    kernels = []  # (name, ms) in launch order
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            value = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        kernels.append((r.get("Kernel Name") or r.get("Function Name") or "?",
                        value * _UNIT.get(r.get("Metric Unit", "nsecond"), 1e-6)))
    if not kernels:
        print("- ncu: no kernel rows in " + os.path.basename(path))
        return 1
    p = _period([k[0] for k in kernels])
    # A period shorter than 50 launches is a loop inside the step, not the step.
    step = kernels[-p:] if p >= 50 else kernels
    what = "one step (the last of the identical steps)" if p >= 50 else \
        "the whole run (no repeating step found: includes start-up)"
    total = sum(ms for _, ms in step)
    print(f"- {len(kernels)} kernels profiled; {what}: {len(step)} kernels, "
          f"{total:.2f} ms of GPU time (sum of kernel durations, clocks unlocked)")
    by = {}
    for name, ms in step:
        t = by.setdefault(name, [0, 0.0])
        t[0] += 1
        t[1] += ms
    print("")
    print("| kernel | launches | ms | % of step |")
    print("|---|---|---|---|")
    for name, (count, ms) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        short = name if len(name) <= 90 else name[:87] + "..."
        print(f"| `{short.replace('|', '/')}` | {count} | {ms:.3f} | {100 * ms / total:.1f}% |")
    return 0


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "bench-table":
        bench_table(sys.argv[2])
        return 0
    if len(sys.argv) >= 3 and sys.argv[1] == "first-step":
        t = _load(sys.argv[2])
        print(f"first step {t['first_step_s']:.0f} s (compilation included)" if t and t.get("first_step_s")
              else "no result (" + _why(sys.argv[2]) + ")")
        return 0
    if len(sys.argv) >= 3 and sys.argv[1] == "ncu-summary":
        return ncu_summary(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 15)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
