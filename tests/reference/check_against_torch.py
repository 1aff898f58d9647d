#!/usr/bin/python3
"""Checks loom against PyTorch on the same tiny model (DESIGN.md section 9).

Run by Debian's /usr/bin/python3 (python3-torch and python3-numpy, installed by
tools/setup). Reads what dump_reference wrote from the spec SPEC, builds the same network
in PyTorch (float64) from loom's initial weights, and compares:
  - the logits and the loss of batch 0,
  - the gradient of every parameter,
  - the loss at each of the recorded AdamW steps (same batches, same learning rates),
  - the parameters after the last step.
Exit status 0 when every figure is within its tolerance; otherwise each failure is printed.

usage: check_against_torch.py SPEC DUMP_DIR
"""
import json
import math
import struct
import sys

import numpy as np
import torch

torch.set_default_dtype(torch.float64)

# Tolerances: loom computes in f32, the reference in f64. Figures are compared as
# max|loom - torch| <= atol + rtol * max|torch| over each tensor.
TOLERANCES = {
    "logits": (1e-5, 1e-4),
    "loss": (1e-6, 1e-5),
    "grad": (1e-7, 2e-4),
    "step_loss": (1e-6, 5e-5),
    "final": (1e-6, 2e-4),
}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    kinds = {"F32": np.float32, "I32": np.int32, "F64": np.float64}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        arr = np.frombuffer(body[begin:end], dtype=kinds[t["dtype"]]).reshape(t["shape"])
        out[name] = arr.copy()
    return out


class Config:
    def __init__(self, spec):
        m = spec["model"]
        self.L = m["num_layers"]
        self.C = m["hidden_size"]
        self.H = m["num_attention_heads"]
        self.G = m.get("num_query_groups", self.H)
        self.D = m.get("kv_channels", self.C // self.H)
        self.F = m.get("ffn_hidden_size", 4 * self.C)
        self.V = m["vocab_size"]
        self.pos = m.get("position_embedding", "learned")
        rot = m.get("rotary", {})
        self.rope_base = rot.get("base", 10000.0)
        self.rope_percent = rot.get("percent", 1.0)
        self.rope_scaling = rot.get("scaling", {"type": "none"})
        self.tied = m.get("tie_embeddings", True)
        layer = m["layer"]
        self.norm = layer["norm"]["impl"]
        self.eps = layer["norm"].get("eps", 1e-5)
        self.final_eps = m["final_norm"].get("eps", 1e-5)
        self.activation = layer["mlp"].get("activation", "gelu_tanh")
        self.bias = m.get("add_bias_linear", True)
        self.qkv_bias = m.get("add_qkv_bias", self.bias)


def inv_freq(cfg):
    rot_dim = int(cfg.D * cfg.rope_percent)
    f = 1.0 / (cfg.rope_base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim))
    s = cfg.rope_scaling
    if s.get("type", "none") == "linear":
        f = f / s["factor"]
    elif s.get("type") == "llama3":  # Hugging Face's _compute_llama3_parameters
        factor, low, high = s["factor"], s.get("low_freq_factor", 1), s.get("high_freq_factor", 4)
        old = s.get("original_max_position_embeddings", 8192)
        low_wl, high_wl = old / low, old / high
        wl = 2 * math.pi / f
        scaled = torch.where(wl > low_wl, f / factor, f)
        smooth = (old / wl - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wl >= high_wl) & (wl <= low_wl)
        f = torch.where(is_mid, mid, scaled)
    return f, rot_dim


def rope(x, cfg):
    # x (B, T, heads, D); GPT-NeoX / Llama layout: channel i pairs with i + rot/2.
    f, r = inv_freq(cfg)
    T = x.shape[1]
    ang = torch.arange(T, dtype=torch.float64)[:, None] * f[None, :]  # (T, r/2)
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    x1, x2, rest = x[..., : r // 2], x[..., r // 2 : r], x[..., r:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def norm(x, w, b, kind, eps):
    if kind == "rmsnorm":
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def forward(p, cfg, tokens, labels, mask):
    B, T = tokens.shape
    x = p["embedding.word_embeddings.weight"][tokens]
    if cfg.pos == "learned":
        x = x + p["embedding.position_embeddings.weight"][torch.arange(T)][None]
    per = cfg.H // cfg.G
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg.L):
        pre = f"decoder.layers.{i}."
        g = lambda n: p.get(pre + n)
        h = norm(x, g("input_layernorm.weight"), g("input_layernorm.bias"), cfg.norm, cfg.eps)
        qkv = h @ g("self_attention.linear_qkv.weight").T
        if g("self_attention.linear_qkv.bias") is not None:
            qkv = qkv + g("self_attention.linear_qkv.bias")
        qkv = qkv.view(B, T, cfg.G, (per + 2) * cfg.D)  # Megatron's grouped layout
        q = qkv[..., : per * cfg.D].reshape(B, T, cfg.H, cfg.D)
        k = qkv[..., per * cfg.D : (per + 1) * cfg.D]
        v = qkv[..., (per + 1) * cfg.D :]
        if cfg.pos == "rope":
            q, k = rope(q, cfg), rope(k, cfg)
        k = k.repeat_interleave(per, dim=2)
        v = v.repeat_interleave(per, dim=2)
        s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(cfg.D)
        s = s.masked_fill(~causal, float("-inf"))
        a = torch.einsum("bhts,bshd->bthd", s.softmax(-1), v).reshape(B, T, cfg.H * cfg.D)
        a = a @ g("self_attention.linear_proj.weight").T
        if g("self_attention.linear_proj.bias") is not None:
            a = a + g("self_attention.linear_proj.bias")
        x = x + a
        h = norm(x, g("pre_mlp_layernorm.weight"), g("pre_mlp_layernorm.bias"), cfg.norm, cfg.eps)
        # swiglu's fc1 is (2, F, C) [gate; up]: as rows, the (2F, C) matrix.
        h = h @ g("mlp.linear_fc1.weight").reshape(-1, cfg.C).T
        if g("mlp.linear_fc1.bias") is not None:
            h = h + g("mlp.linear_fc1.bias").reshape(-1)
        if cfg.activation == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = torch.nn.functional.silu(gate) * up
        elif cfg.activation == "gelu_tanh":
            h = torch.nn.functional.gelu(h, approximate="tanh")
        else:
            h = torch.nn.functional.gelu(h)
        h = h @ g("mlp.linear_fc2.weight").T
        if g("mlp.linear_fc2.bias") is not None:
            h = h + g("mlp.linear_fc2.bias")
        x = x + h
    x = norm(x, p["decoder.final_layernorm.weight"], p.get("decoder.final_layernorm.bias"),
             cfg.norm, cfg.final_eps)
    w_out = p["embedding.word_embeddings.weight"] if cfg.tied else p["output_layer.weight"]
    logits = x @ w_out.T
    ce = torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), labels.reshape(-1),
                                           reduction="none")
    m = mask.reshape(-1)
    return logits, (ce * m).sum() / m.sum().clamp(min=1)


failures = []


def compare(what, loom, ref, kind):
    atol, rtol = TOLERANCES[kind]
    loom = np.asarray(loom, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if loom.shape != ref.shape:
        failures.append(f"{what}: shape {loom.shape} vs torch {ref.shape}")
        return
    err = float(np.max(np.abs(loom - ref))) if loom.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    if not err <= atol + rtol * scale:
        failures.append(f"{what}: max |loom - torch| = {err:.3g} > {atol:g} + {rtol:g} * {scale:.3g}")


def main():
    spec_path, dump = sys.argv[1], sys.argv[2]
    spec = json.load(open(spec_path))
    cfg = Config(spec)
    weights = read_safetensors(f"{dump}/weights.safetensors")
    fwd = read_safetensors(f"{dump}/forward.safetensors")
    params = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in weights.items()}

    tokens = torch.tensor(fwd["tokens"], dtype=torch.long)
    labels = torch.tensor(fwd["labels"], dtype=torch.long)
    mask = torch.tensor(fwd["loss_mask"], dtype=torch.float64)
    logits, loss = forward(params, cfg, tokens, labels, mask)
    loss.backward()
    compare("logits", fwd["logits"], logits.detach().numpy(), "logits")
    compare("loss", fwd["loss"], loss.item(), "loss")
    for name, t in params.items():
        compare(f"grad {name}", fwd[f"grad.{name}"], t.grad.numpy(), "grad")
    print(f"batch 0: loss loom {float(fwd['loss']):.7f} torch {loss.item():.7f}; "
          f"{len(params)} parameter gradients compared")

    # AdamW steps with loom's recorded learning rates (the schedule has its own tests).
    opt = spec["optimizer"]
    b1, b2, eps, wd = opt["beta1"], opt["beta2"], opt["eps"], opt["weight_decay"]
    clip = spec["train"].get("grad_clip", 1.0)
    p = {k: torch.tensor(v, dtype=torch.float64) for k, v in weights.items()}
    m = {k: torch.zeros_like(v) for k, v in p.items()}
    v2 = {k: torch.zeros_like(v) for k, v in p.items()}
    steps = json.load(open(f"{dump}/train.json"))
    B, T = tokens.shape
    for rec in steps:
        t = rec["step"]
        leaf = {k: x.clone().requires_grad_(True) for k, x in p.items()}
        tok = torch.tensor(rec["tokens"], dtype=torch.long).view(B, T)
        lab = torch.tensor(rec["labels"], dtype=torch.long).view(B, T)
        _, l = forward(leaf, cfg, tok, lab, torch.ones(B, T))
        l.backward()
        compare(f"step {t} loss", rec["loss"], l.item(), "step_loss")
        norm_ = math.sqrt(sum(float((x.grad ** 2).sum()) for x in leaf.values()))
        compare(f"step {t} grad norm", rec["grad_norm"], norm_, "step_loss")
        coeff = min(1.0, clip / (norm_ + 1e-6)) if clip > 0 else 1.0
        lr = rec["lr"]
        with torch.no_grad():
            for k in p:
                g = leaf[k].grad * coeff
                m[k] = b1 * m[k] + (1 - b1) * g
                v2[k] = b2 * v2[k] + (1 - b2) * g * g
                mhat = m[k] / (1 - b1 ** t)
                vhat = v2[k] / (1 - b2 ** t)
                decay = wd if p[k].dim() >= 2 else 0.0  # no decay on norms and biases
                p[k] = p[k] - lr * (mhat / (vhat.sqrt() + eps) + decay * p[k])
        print(f"step {t}: loss loom {rec['loss']:.7f} torch {l.item():.7f} lr {lr:.3e}")
    final = read_safetensors(f"{dump}/final.safetensors")
    for k in p:
        loom_final, ref_final = final[k], p[k].numpy()
        if k.endswith("linear_qkv.bias"):
            # The key bias has an exactly zero gradient (softmax ignores a constant shift of
            # every score in a row), so both sides compute rounding noise there, which Adam
            # normalises into full-size steps of either sign: compare the Q and V parts only.
            per = cfg.H // cfg.G
            keep = np.ones((cfg.G, (per + 2) * cfg.D), dtype=bool)
            keep[:, per * cfg.D : (per + 1) * cfg.D] = False
            loom_final, ref_final = loom_final[keep.reshape(-1)], ref_final[keep.reshape(-1)]
        compare(f"final {k}", loom_final, ref_final, "final")

    if failures:
        print(f"FAILED: {len(failures)} comparisons out of tolerance")
        for f in failures:
            print("  " + f)
        return 1
    print("all figures agree with PyTorch within tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
