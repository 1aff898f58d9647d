#!/usr/bin/env python3
"""PyTorch's attention at attention_bench's shapes, on the same GPU: the baseline of its rows.

Runs with a GPU machine's PyTorch 2 (the `python3` there). For each shape of
tools/bench/attention_bench.cc (GPT-2 124M at B=32, T=1024, H=12, D=64; the 1.3B LLaMA-style
model at B=4, T=2048, H=16, D=128), bf16, causal, it times F.scaled_dot_product_attention
on PyTorch's cuDNN and flash backends, forward alone and forward + backward, by CUDA events
over N calls after warm-up, in two layouts:
  qkv:    q, k, v as views of one (B, T, 3, H, D) projection output, transposed to
          (B, H, T, D): how GPT-2 models (and tools/bench/torch_gpt.py) call it, and how
          loom's layers hand q, k, v to attention (views of the QKV projection);
  packed: contiguous (B, H, T, D) tensors.
and prints Markdown rows in attention_bench's columns; TFLOP/s by the same count (4 * pairs
* D forward, 8 * pairs * D backward, pairs = B * H * T (T + 1) / 2 visible pairs).

usage: torch_sdpa.py [--iterations N]
"""
import argparse
import sys

SHAPES = [(32, 1024, 12, 64), (4, 2048, 16, 128)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=20)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"torch_sdpa: needs PyTorch 2.3 or later ({e})", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("torch_sdpa: no CUDA device", file=sys.stderr)
        return 1
    dev = torch.device("cuda")
    print(f"torch_sdpa: PyTorch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
          f"cuDNN {torch.backends.cudnn.version()}, bf16, causal, {args.iterations} iterations\n")
    print("| B, T, H, D | kernel | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | note |")
    print("|---|---|---|---|---|---|---|")

    def timed(fn):
        for _ in range(3):
            fn()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(args.iterations):
            fn()
        stop.record()
        torch.cuda.synchronize()
        return start.elapsed_time(stop) / args.iterations

    for b, t, h, d in SHAPES:
        pairs = b * h * t * (t + 1) / 2
        f_fwd, f_bwd = 4 * pairs * d, 8 * pairs * d
        gen = torch.Generator(device=dev).manual_seed(1)
        for layout in ("qkv", "packed"):
            if layout == "qkv":
                base = torch.randn(b, t, 3, h, d, device=dev, dtype=torch.bfloat16, generator=gen)
                base.requires_grad_(True)
                leaves = [base]

                def qkv():
                    return [base[:, :, i].transpose(1, 2) for i in range(3)]
            else:
                leaves = [torch.randn(b, h, t, d, device=dev, dtype=torch.bfloat16, generator=gen)
                          .requires_grad_(True) for _ in range(3)]

                def qkv():
                    return leaves
            dout = torch.randn(b, h, t, d, device=dev, dtype=torch.bfloat16, generator=gen)
            for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                                  ("flash", SDPBackend.FLASH_ATTENTION)):
                def fwd():
                    with sdpa_kernel([backend]):
                        q, k, v = qkv()
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

                def both():
                    out = fwd()
                    grads = torch.autograd.grad(out, leaves, dout)
                    del grads

                try:
                    with torch.no_grad():
                        fwd_ms = timed(fwd)
                    both_ms = timed(both)
                except RuntimeError as e:  # the backend refuses the shape or layout
                    msg = str(e).splitlines()[0][:100]
                    print(f"| {b}, {t}, {h}, {d} | torch {name} ({layout}) | - | - | - | - | {msg} |")
                    continue
                print(f"| {b}, {t}, {h}, {d} | torch {name} ({layout}) | {fwd_ms:.3f} | "
                      f"{f_fwd / (fwd_ms * 1e9):.1f} | {both_ms:.3f} | "
                      f"{(f_fwd + f_bwd) / (both_ms * 1e9):.1f} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
