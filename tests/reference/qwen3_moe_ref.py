"""Qwen3MoeForCausalLM and Qwen3ForCausalLM rebuilt in plain PyTorch, for check_hf.py.

transformers 4.40 (the pinned version, over Debian's torch 1.13) has neither Qwen3 nor
Qwen3-MoE, so loom's export and import of both are checked against this model instead. It
was written from the description of transformers' models/qwen3_moe and models/qwen3
(configuration and modeling), not copied. Dense Qwen3 (model_type qwen3) is the model below
with every layer dense (no experts, no mlp.gate) and head_dim defaulting to 128:

  x = embed_tokens[ids]
  per layer i:
    h = RMSNorm(x) (input_layernorm)
    q = q_proj h viewed (B, T, H, D); k, v = k_proj h, v_proj h viewed (B, T, G, D); D = head_dim
    q = RMSNorm_D(q) (q_norm, one (D) weight for every head), k = RMSNorm_D(k) (k_norm),
        both before rope
    q, k = rope(q), rope(k): rotate-half over all of D, inv_freq = theta^(-2j / D)
    attention: causal softmax(q k^T / sqrt(D)) v, key/value head g serves query heads
        g * H/G .. (g + 1) * H/G - 1; o_proj
    x = x + attention
    h = RMSNorm(x) (post_attention_layernorm)
    layer i sparse iff i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0:
      p = softmax(gate h) over all E experts; the K largest; divided by their sum when
      norm_topk_prob; out = sum_k p_k * expert_k(h), expert = down(silu(gate_proj h) * up_proj h)
      (width moe_intermediate_size); no shared expert
    else the same swiglu MLP of width intermediate_size
    x = x + out
  logits = lm_head(RMSNorm(x) (norm)); lm_head = embed_tokens when tie_word_embeddings
  RMSNorm(x) = weight * x / sqrt(mean(x^2) + rms_norm_eps), with mean(x^2) in f32

No biases anywhere (attention_bias false is all loom maps; refused otherwise here too).
Parameter names are the released checkpoints' (model.layers.{i}.self_attn.q_norm.weight,
model.layers.{i}.mlp.experts.{j}.gate_proj.weight, ...).
"""
import json
import os

import torch
from safetensors.torch import load_file, save_file

ARCHITECTURE = "Qwen3MoeForCausalLM"
# model_type -> architecture of the families rebuilt here.
ARCHITECTURES = {"qwen3_moe": ARCHITECTURE, "qwen3": "Qwen3ForCausalLM"}


def rms_norm(x, w, eps):
    var = x.float().pow(2).mean(-1, keepdim=True)
    return w * (x.float() * torch.rsqrt(var + eps)).to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Config:
    def __init__(self, c):
        self.model_type = c.get("model_type")
        if self.model_type not in ARCHITECTURES:
            raise ValueError(f"not a qwen3 or qwen3_moe config: {self.model_type}")
        dense = self.model_type == "qwen3"
        self.V = c["vocab_size"]
        self.C = c["hidden_size"]
        self.F = c["intermediate_size"]
        self.L = c["num_hidden_layers"]
        self.H = c["num_attention_heads"]
        self.G = c.get("num_key_value_heads") or self.H
        # Qwen3Config's head_dim defaults to 128 when the key is absent; null: hidden / heads
        self.D = c.get("head_dim", 128 if dense else None) or self.C // self.H
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.theta = c.get("rope_theta", 10000.0)
        self.tied = c.get("tie_word_embeddings", False)
        if dense:
            self.E = self.K = self.moe_F = 0
            self.norm_topk = False
            self.sparse = [False] * self.L
        else:
            self.E = c.get("num_experts", c.get("num_local_experts"))
            self.K = c["num_experts_per_tok"]
            self.moe_F = c["moe_intermediate_size"]
            self.norm_topk = c.get("norm_topk_prob", False)
            step = c.get("decoder_sparse_step", 1)
            only = c.get("mlp_only_layers") or []
            self.sparse = [i not in only and self.E > 0 and (i + 1) % step == 0
                           for i in range(self.L)]
        if c.get("attention_bias", False):
            raise ValueError("attention_bias is not rebuilt here")
        if c.get("rope_scaling"):
            raise ValueError("rope_scaling is not rebuilt here")
        if c.get("use_sliding_window", False):
            raise ValueError("use_sliding_window is not rebuilt here")
        if c.get("hidden_act", "silu") != "silu":
            raise ValueError("hidden_act must be silu")


def shapes(cfg):
    """HF name -> shape of every parameter."""
    C, D, H, G = cfg.C, cfg.D, cfg.H, cfg.G
    out = {"model.embed_tokens.weight": (cfg.V, C), "model.norm.weight": (C,)}
    if not cfg.tied:
        out["lm_head.weight"] = (cfg.V, C)
    for i in range(cfg.L):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (C,)
        out[p + "post_attention_layernorm.weight"] = (C,)
        out[p + "self_attn.q_proj.weight"] = (H * D, C)
        out[p + "self_attn.k_proj.weight"] = (G * D, C)
        out[p + "self_attn.v_proj.weight"] = (G * D, C)
        out[p + "self_attn.o_proj.weight"] = (C, H * D)
        out[p + "self_attn.q_norm.weight"] = (D,)
        out[p + "self_attn.k_norm.weight"] = (D,)

        def mlp(prefix, F):
            out[prefix + "gate_proj.weight"] = (F, C)
            out[prefix + "up_proj.weight"] = (F, C)
            out[prefix + "down_proj.weight"] = (C, F)

        if cfg.sparse[i]:
            out[p + "mlp.gate.weight"] = (cfg.E, C)
            for e in range(cfg.E):
                mlp(p + f"mlp.experts.{e}.", cfg.moe_F)
        else:
            mlp(p + "mlp.", cfg.F)
    return out


def swiglu(x, w, prefix):
    return (torch.nn.functional.silu(x @ w[prefix + "gate_proj.weight"].T)
            * (x @ w[prefix + "up_proj.weight"].T)) @ w[prefix + "down_proj.weight"].T


def forward(cfg, w, ids, qk_norm=True):
    """Logits (B, T, V) for token ids (B, T). qk_norm=False skips q_norm / k_norm: the
    Qwen2-MoE without biases and shared expert (or, dense, the Qwen2 with zero biases) that
    check_hf.py checks this code against."""
    B, T = ids.shape
    H, G, D = cfg.H, cfg.G, cfg.D
    x = w["model.embed_tokens.weight"][ids]
    inv_freq = 1.0 / (cfg.theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    ang = torch.cat([ang, ang], dim=-1)  # (T, D)
    cos, sin = ang.cos()[None, None].to(x.dtype), ang.sin()[None, None].to(x.dtype)
    mask = torch.full((T, T), float("-inf")).triu(1)
    for i in range(cfg.L):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, T, H, D)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(B, T, G, D)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, T, G, D)
        if qk_norm:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], cfg.eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], cfg.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, D)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // G, dim=1)
        v = v.repeat_interleave(H // G, dim=1)
        s = (q @ k.transpose(2, 3)) * D ** -0.5 + mask
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * D)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.eps)
        if not cfg.sparse[i]:
            x = x + swiglu(h, w, p + "mlp.")
            continue
        flat = h.reshape(B * T, cfg.C)
        probs = (flat @ w[p + "mlp.gate.weight"].T).softmax(-1)
        top, experts = probs.topk(cfg.K, dim=-1)
        if cfg.norm_topk:
            top = top / top.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e in range(cfg.E):
            rows, slot = (experts == e).nonzero(as_tuple=True)
            if len(rows):
                y = swiglu(flat[rows], w, p + f"mlp.experts.{e}.")
                out = out.index_add(0, rows, y * top[rows, slot][:, None])
        x = x + out.view(B, T, cfg.C)
    x = rms_norm(x, w["model.norm.weight"], cfg.eps)
    head = w["model.embed_tokens.weight"] if cfg.tied else w["lm_head.weight"]
    return x @ head.T


def load(directory):
    """(Config, weights) of a Qwen3-MoE or Qwen3 directory: config.json and model.safetensors (or the
    shards of model.safetensors.index.json). Every expected tensor with its shape, nothing
    else (a tied lm_head.weight aside), or ValueError listing what is wrong."""
    config = json.load(open(os.path.join(directory, "config.json")))
    cfg = Config(config)
    index = os.path.join(directory, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index)
             else ["model.safetensors"])
    w = {}
    for f in files:
        w.update(load_file(os.path.join(directory, f)))
    if cfg.tied:
        w.pop("lm_head.weight", None)
    want = shapes(cfg)
    problems = [f"missing {n}" for n in want if n not in w]
    problems += [f"unexpected {n}" for n in w if n not in want]
    problems += [f"{n}: shape {tuple(w[n].shape)}, expected {s}" for n, s in want.items()
                 if n in w and tuple(w[n].shape) != s]
    if problems:
        raise ValueError(f"{directory}: " + "; ".join(problems))
    return cfg, {n: t.float() for n, t in w.items()}


def make(directory, config, seed, model_type="qwen3_moe"):
    """A random Qwen3-MoE (or Qwen3: model_type "qwen3") with weights normal(0, 0.2), norm
    weights around 1, saved as a transformers directory would be; returns (Config, weights)."""
    config = dict(config, architectures=[ARCHITECTURES[model_type]], model_type=model_type,
                  torch_dtype="float32", hidden_act="silu", attention_bias=False)
    cfg = Config(config)
    g = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in shapes(cfg).items():
        t = torch.randn(shape, generator=g) * 0.2
        w[name] = t + 1.0 if "norm" in name else t
    os.makedirs(directory, exist_ok=True)
    save_file({n: t.contiguous() for n, t in w.items()},
              os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return cfg, w
