#!/usr/bin/python3
"""PyTorch baseline for `loom bench`: the same model, batch and thread count.

Runs with Debian's /usr/bin/python3 (python3-torch 1.13, an OpenBLAS-OpenMP build) on the
CPU, or with a GPU machine's PyTorch on `--device cuda`. Builds the model a loom spec
describes (GPT-2 or LLaMA style, or Mixtral style when the layer's mlp is a mixture of
experts: a softmax top-K router renormalised over the K chosen, eager per-expert SwiGLU
MLPs over the tokens that chose them, as Hugging Face's eager Mixtral runs), then times
full training steps (forward, backward, AdamW) on random tokens, after warm-up, and
prints one JSON object: tokens/s, ms/step, model FLOPs (6N + 6LTC per token, as loom
counts them, N the active parameters: K experts per MoE layer). With the spec's
precision.params bf16 the forward runs under bf16 autocast (f32 weights and AdamW).
On a GPU with PyTorch 2 attention is F.scaled_dot_product_attention (causal) and AdamW fused,
as the strongest eager baseline. With --compile the model runs through torch.compile (PyTorch 2; the first warm-up step
compiles, about a minute for GPT-2: "first_step_s" reports it; the timed steps exclude it).

usage: torch_gpt.py SPEC [--batch B] [--seq T] [--steps N] [--warmup N] [--threads N]
                    [--device cpu|cuda] [--compile]
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        C, H = m["hidden_size"], m["num_attention_heads"]
        G = m.get("num_query_groups", H)
        D = m.get("kv_channels", C // H)
        Fh = m.get("ffn_hidden_size", 4 * C)
        bias = m.get("add_bias_linear", True)
        self.H, self.G, self.D = H, G, D
        self.rms = m["layer"]["norm"]["impl"] == "rmsnorm"
        self.swiglu = m["layer"]["mlp"].get("activation") == "swiglu"
        self.rope = m.get("position_embedding", "learned") == "rope"
        Norm = (lambda c: nn.LayerNorm(c)) if not self.rms else (lambda c: RMSNorm(c))
        self.ln1, self.ln2 = Norm(C), Norm(C)
        self.qkv = nn.Linear(C, (H + 2 * G) * D, bias=m.get("add_qkv_bias", bias))
        self.proj = nn.Linear(H * D, C, bias=bias)
        mlp = m["layer"]["mlp"]
        self.moe = mlp.get("impl") == "moe"
        if self.moe:
            E, Fe = mlp["num_experts"], mlp.get("moe_ffn_hidden_size") or Fh
            self.topk = mlp.get("router", {}).get("topk", 2)
            self.router = nn.Linear(C, E, bias=False)
            self.experts = nn.ModuleList(
                nn.ModuleDict({"fc1": nn.Linear(C, 2 * Fe, bias=False),
                               "fc2": nn.Linear(Fe, C, bias=False)}) for _ in range(E))
        else:
            self.fc1 = nn.Linear(C, 2 * Fh if self.swiglu else Fh, bias=bias)
            self.fc2 = nn.Linear(Fh, C, bias=bias)

    def moe_mlp(self, x):
        B, T, C = x.shape
        h = x.reshape(B * T, C)
        logits = self.router(h).float()
        top, chosen = logits.topk(self.topk, dim=-1)  # softmax over the K chosen logits
        probs = top.softmax(-1).to(h.dtype)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            a, b = expert["fc1"](h[rows]).chunk(2, dim=-1)
            y = expert["fc2"](F.silu(a) * b) * probs[rows, slot, None]
            out = out.index_add(0, rows, y)
        return out.reshape(B, T, C)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(
            [self.H * self.D, self.G * self.D, self.G * self.D], dim=-1)
        q = q.view(B, T, self.H, self.D).transpose(1, 2)
        k = k.view(B, T, self.G, self.D).transpose(1, 2)
        v = v.view(B, T, self.G, self.D).transpose(1, 2)
        if self.rope:
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if self.G != self.H:
            k = k.repeat_interleave(self.H // self.G, dim=1)
            v = v.repeat_interleave(self.H // self.G, dim=1)
        if x.is_cuda and hasattr(F, "scaled_dot_product_attention"):
            # PyTorch 2 on a GPU: SDPA (flash / cuDNN / memory-efficient, PyTorch's choice).
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.D)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        y = y.transpose(1, 2).reshape(B, T, self.H * self.D)
        x = x + self.proj(y)
        if self.moe:
            return x + self.moe_mlp(self.ln2(x))
        h = self.fc1(self.ln2(x))
        if self.swiglu:
            a, b = h.chunk(2, dim=-1)
            h = F.silu(a) * b
        else:
            h = F.gelu(h, approximate="tanh")
        return x + self.fc2(h)


class RMSNorm(nn.Module):
    def __init__(self, c, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(c)), eps

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class GPT(nn.Module):
    def __init__(self, m, T):
        super().__init__()
        C, V = m["hidden_size"], m["vocab_size"]
        self.wte = nn.Embedding(V, C)
        self.learned = m.get("position_embedding", "learned") == "learned"
        if self.learned:
            self.wpe = nn.Embedding(m["max_position_embeddings"], C)
        self.blocks = nn.ModuleList(Block(m) for _ in range(m["num_layers"]))
        self.ln_f = RMSNorm(C) if m["final_norm"]["impl"] == "rmsnorm" else nn.LayerNorm(C)
        self.tied = m.get("tie_embeddings", True)
        if not self.tied:
            self.head = nn.Linear(C, V, bias=False)
        D = m.get("kv_channels", C // m["num_attention_heads"])
        f = 1.0 / (m.get("rotary", {}).get("base", 10000) ** (torch.arange(0, D, 2) / D))
        ang = torch.arange(T)[:, None] * f[None]
        self.cos, self.sin = ang.cos(), ang.sin()

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx)
        if self.learned:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        cos, sin = self.cos[:T].to(idx.device), self.sin[:T].to(idx.device)
        for b in self.blocks:
            x = b(x, cos, sin)
        x = self.ln_f(x)
        logits = x @ (self.wte.weight if self.tied else self.head.weight).T
        return F.cross_entropy(logits.view(B * T, -1), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (PyTorch 2); the warm-up includes compiling")
    a = ap.parse_args()
    if a.compile and not hasattr(torch, "compile"):
        raise SystemExit(f"torch_gpt.py: --compile needs PyTorch 2 (this is {torch.__version__})")
    if a.compile and a.warmup < 1:
        raise SystemExit("torch_gpt.py: --compile needs --warmup >= 1 (the first step compiles)")
    spec = json.load(open(a.spec))
    m = spec["model"]
    B = a.batch or spec["train"].get("micro_batch_size", 1)
    T = a.seq or spec["train"].get("seq_length", 1024)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    model = GPT(m, T).to(dev)
    run = torch.compile(model) if a.compile else model
    # Fused AdamW on a GPU (PyTorch 2), the fastest PyTorch has; the loop of tensors on a CPU.
    fused = {"fused": True} if dev.type == "cuda" and hasattr(torch, "compile") else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            **fused)
    bf16 = spec.get("precision", {}).get("params") == "bf16"
    V = m["vocab_size"]
    times, first_step_s = [], None
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for i in range(a.warmup + a.steps):
        idx = torch.randint(0, V, (B, T), device=dev)
        tgt = torch.randint(0, V, (B, T), device=dev)
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = run(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        if i == 0:
            first_step_s = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    n = sum(p.numel() for p in model.parameters())
    for blk in model.blocks:  # a token passes through K experts of each MoE layer
        if blk.moe:
            per = sum(p.numel() for p in blk.experts[0].parameters())
            n -= per * (len(blk.experts) - blk.topk)
    L, C = m["num_layers"], m.get("kv_channels", m["hidden_size"] // m["num_attention_heads"]) * m["num_attention_heads"]
    flops = (6 * n + 6 * L * T * C) * B * T
    mean = sum(times) / len(times)
    print(json.dumps({"torch": torch.__version__, "device": a.device, "threads": a.threads,
                      "mode": "compile" if a.compile else "eager", "first_step_s": first_step_s,
                      "batch": B, "seq": T,
                      "active_params": n, "ms_per_step_mean": 1e3 * mean,
                      "ms_per_step_median": 1e3 * sorted(times)[len(times) // 2],
                      "tokens_per_s": B * T / mean, "model_gflops_per_s": flops / mean / 1e9}))


if __name__ == "__main__":
    main()
