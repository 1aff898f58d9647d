#!/usr/bin/python3
"""Checks loom against PyTorch on the same tiny model (DESIGN.md section 9).

Run by Debian's /usr/bin/python3 (python3-torch and python3-numpy, installed by
tools/setup). Reads what dump_reference wrote from the spec SPEC, builds the same network
in PyTorch (float64) from loom's initial weights, and compares:
  - the logits and the loss of batch 0,
  - the gradient of every parameter,
  - the loss at each of the recorded AdamW steps (same batches, same learning rates),
  - the parameters after the last step.
Mixture-of-experts models (model.layer.mlp.impl = "moe") are rebuilt with Megatron-Core's
semantics (router top-k, capacity dropping, shared experts, load-balancing and z losses,
expert-bias updates); see the section "Mixture of experts" below.
Dropout (model.hidden_dropout, model.attention_dropout): the masks are drawn here from the
definition of loom's random streams (section "Dropout"), not read from loom.
bf16 and f16 parameters (precision.params): the forward and backward passes use the
rounded weights and round activations and their gradients where loom stores them; the f32
master weights are compared at the end, at levels of their own (LOW_TOLERANCES).
Each LAYOUT=RUN_DIR is a `loom train` run of the same spec in another layout (tensor and
sequence parallelism: reference_test.sh makes them): its step losses, grad norms and final
weights (its sharded checkpoint) are compared with PyTorch replaying the same steps.
Exit status 0 when every figure is within its tolerance; otherwise each failure is printed.

usage: check_against_torch.py SPEC DUMP_DIR [LAYOUT=RUN_DIR...]
"""
import json
import math
import struct
import sys

import numpy as np
import torch

torch.set_default_dtype(torch.float64)

# Tolerances: loom computes in f32, the reference in f64. Figures are compared as
# max|loom - torch| <= atol + rtol * max|torch| over each tensor (for a scalar: its
# relative error). These are the levels README.md states ("Correctness"); each run prints
# what it achieved per category, and across the reference specs the worst is a fifth to
# two thirds of these (logits 7.1e-7, loss 4.0e-8, gradients 2.2e-6, step losses 5.9e-7,
# step grad norms 1.6e-5, final weights 1.3e-4 after 6 to 10 AdamW steps). Adam
# turns a gradient that is nearly zero into a step of up to lr whatever its rounding
# noise, so the final weights drift from the f64 run step by step more than the rest.
TOLERANCES = {
    "logits": (0.0, 2e-6),
    "loss": (0.0, 2e-7),
    "grad": (1e-10, 5e-6),
    "step_loss": (0.0, 2e-6),
    "step_grad_norm": (0.0, 5e-5),
    "final": (1e-9, 2e-4),
}


# bf16 and f16 parameters (see "bf16 and f16 parameters" below): levels about 4 times what
# the reference specs achieve (bf16: logits 0, loss 3.8e-8, gradients 1.5e-2, step losses
# 1.8e-3, step grad norms 2.2e-3, final master weights 7.0e-2; f16: 4.9e-4, 2.7e-7, 1.6e-3,
# 2.7e-4, 1.0e-3, 1.4e-2), read against one unit in the last place, 2^-8 to 2^-7 relative for
# bf16 and 2^-11 to 2^-10 for f16. The forward pass rounds where the reference does (bf16
# logits agree exactly), so a logit may differ by one unit where a value lies at a rounding
# boundary (the f16 run has one: 1.95e-3 at 3.x; one unit at the largest logit is 7.8e-3 of
# it in bf16, 9.8e-4 in f16), and the loss by that over the B T positions. The
# backward pass rounds at points the reference does not all model (gradients: a few units).
# The steps round each master update to the type: an element within lr of a boundary rounds
# the other way (step losses differ from step 2 on), and Adam turns the gradient differences
# into update differences of up to lr per step (the final master weights).
LOW_TOLERANCES = {
    "bf16": {"logits": (0.0, 1e-2), "loss": (0.0, 5e-4), "grad": (1e-9, 6e-2),
             "step_loss": (0.0, 1e-2), "step_grad_norm": (0.0, 1e-2), "final": (1e-9, 0.25)},
    "f16": {"logits": (0.0, 2e-3), "loss": (0.0, 1e-4), "grad": (1e-9, 8e-3),
            "step_loss": (0.0, 1.5e-3), "step_grad_norm": (0.0, 5e-3), "final": (1e-9, 5e-2)},
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
        self.hidden_dropout = float(m.get("hidden_dropout", 0.0))
        self.attention_dropout = float(m.get("attention_dropout", 0.0))
        layer = m["layer"]
        self.norm = layer["norm"]["impl"]
        self.eps = layer["norm"].get("eps", 1e-5)
        self.final_eps = m["final_norm"].get("eps", 1e-5)
        self.activation = layer["mlp"].get("activation", "gelu_tanh")  # of the dense MLPs
        self.bias = m.get("add_bias_linear", True)
        self.qkv_bias = m.get("add_qkv_bias", self.bias)
        self.qk_layernorm = m.get("qk_layernorm", False)  # per head over D, before rope
        # Multi-latent attention (DeepSeek-V2/V3): {q_lora_rank, kv_lora_rank, qk_head_dim,
        # qk_pos_emb_head_dim, v_head_dim} or None.
        self.mla = m.get("multi_latent_attention")
        # Mixture of experts: self.moe holds the MoE block's options, self.moe_layers says
        # which layers have it; the others use the dense MLP node layer.dense_mlp.
        self.moe = None
        self.moe_layers = [False] * self.L
        if layer["mlp"].get("impl") == "moe":
            ffn = m.get("ffn_hidden_size") or 4 * self.C
            self.moe = MoeConfig(layer["mlp"], ffn)
            dense = layer.get("dense_mlp") or {}
            self.activation = _opt(dense, "activation", "gelu")  # the mlp node's default
            self.dense_F = ffn
            freq = _opt(m, "moe_layer_freq", 1)
            if isinstance(freq, list):
                if len(freq) != self.L or any(f not in (0, 1) for f in freq):
                    raise ValueError(f"moe_layer_freq {freq}: need {self.L} entries of 0 or 1")
                self.moe_layers = [f == 1 for f in freq]
            else:
                self.moe_layers = [i % freq == 0 for i in range(self.L)]


def _opt(d, key, default):
    """d[key], or default when the key is missing or null."""
    v = d.get(key)
    return default if v is None else v


class MoeConfig:
    """The options of an MoE block (model.layer.mlp with impl "moe"), defaults filled in."""

    AUX_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss")

    def __init__(self, mlp, ffn_hidden_size):
        self.E = mlp["num_experts"]
        self.F = _opt(mlp, "moe_ffn_hidden_size", ffn_hidden_size)
        self.activation = _opt(mlp, "activation", "gelu")
        r = mlp.get("router") or {}
        self.K = _opt(r, "topk", 2)
        self.score = _opt(r, "score_function", "softmax")
        if self.score not in ("softmax", "sigmoid"):
            raise ValueError(f"router score_function {self.score!r}")
        self.pre_softmax = _opt(r, "pre_softmax", False)
        self.scaling = r.get("topk_scaling_factor")
        self.num_groups = _opt(r, "num_groups", 1)
        self.group_topk = r.get("group_topk")
        if self.num_groups > 1:
            if not self.group_topk or self.E % self.num_groups or self.K % self.group_topk:
                raise ValueError("group-limited routing needs group_topk dividing topk and "
                                 "num_groups dividing num_experts")
        types = _opt(r, "load_balancing_type", "aux_loss")
        types = [types] if isinstance(types, str) else list(types)
        coeffs = _opt(r, "aux_loss_coeff", 0.0)
        coeffs = list(coeffs) if isinstance(coeffs, list) else [coeffs] * len(types)
        if len(coeffs) != len(types):
            raise ValueError(f"load_balancing_type {types} and aux_loss_coeff {coeffs}: "
                             "lengths differ")
        for t in types:
            if t != "none" and t not in self.AUX_TYPES:
                raise ValueError(f"load_balancing_type {t!r}")
        self.aux = [(t, float(c)) for t, c in zip(types, coeffs) if t != "none" and c > 0]
        # The router dtype (Megatron's moe_router_dtype): the reference is f64 throughout, so
        # fp32 and fp64 rebuild alike; loom's fp64 path must then agree at least as well.
        self.router_dtype = _opt(r, "dtype", "fp32")
        if self.router_dtype not in ("fp32", "fp64"):
            raise ValueError(f"router dtype {self.router_dtype!r}")
        self.z = r.get("z_loss_coeff")
        self.expert_bias = _opt(r, "enable_expert_bias", False)
        if self.expert_bias and self.score != "sigmoid":
            raise ValueError("enable_expert_bias needs the sigmoid score function")
        self.bias_rate = _opt(r, "bias_update_rate", 1e-3)
        self.capacity_factor = mlp.get("expert_capacity_factor")
        self.drop_policy = _opt(mlp, "token_drop_policy", "probs")
        if self.drop_policy not in ("probs", "position"):
            raise ValueError(f"token_drop_policy {self.drop_policy!r}")
        # pad_to_capacity runs filler rows of prob 0 through the experts (Megatron's
        # moe_pad_expert_input_to_capacity): the result is the unpadded one, which this
        # reference computes.
        if _opt(mlp, "pad_to_capacity", False) and self.capacity_factor is None:
            raise ValueError("pad_to_capacity needs expert_capacity_factor")
        self.shared = mlp.get("shared_expert_intermediate_size")
        self.shared_gate = _opt(mlp, "shared_expert_gate", False)


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
    elif s.get("type") == "yarn":  # YaRN (Peng et al. 2023), as HF's _compute_yarn_parameters
        factor, old = s["factor"], s["original_max_position_embeddings"]
        # c(r): the (fractional) pair index whose wavelength fits r times into `old`.
        def c(r):
            return rot_dim * math.log(old / (2 * math.pi * r)) / (2 * math.log(cfg.rope_base))

        low, high = c(s.get("beta_fast", 32)), c(s.get("beta_slow", 1))
        if s.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, rot_dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(rot_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        f = (1 - ramp) * f + ramp * f / factor  # extrapolate below low, interpolate above high
    return f, rot_dim


def rope_attention_factor(cfg):
    # YaRN's factor on cos and sin: attention_factor, else DeepSeek's mscale ratio when
    # mscale and mscale_all_dim are both non-zero, else 0.1 ln(factor) + 1.
    s = cfg.rope_scaling
    if s.get("type") != "yarn":
        return 1.0
    if s.get("attention_factor"):
        return s["attention_factor"]

    def mscale(scale, m):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if s.get("mscale") and s.get("mscale_all_dim"):
        return mscale(s["factor"], s["mscale"]) / mscale(s["factor"], s["mscale_all_dim"])
    return mscale(s["factor"], 1.0)


def rope(x, cfg, positions=None):
    # x (B, T, heads, D); GPT-NeoX / Llama layout: channel i pairs with i + rot/2.
    # positions (B, T), or None for 0..T-1 in every row.
    f, r = inv_freq(cfg)
    B, T = x.shape[0], x.shape[1]
    if positions is None:
        positions = torch.arange(T).expand(B, T)
    ang = positions.to(torch.float64)[..., None] * f  # (B, T, r/2)
    m = rope_attention_factor(cfg)
    cos, sin = m * ang.cos()[:, :, None, :], m * ang.sin()[:, :, None, :]
    x1, x2, rest = x[..., : r // 2], x[..., r // 2 : r], x[..., r:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def mla_attention(h, g, cfg):
    """Multi-latent attention from the normed hidden h (B, T, C) to the heads' outputs
    (B, T, H * v_head_dim), written from DeepSeek-V3's modeling code (inference/model.py,
    class MLA): q through the optional latent, [c_kv ; k_pe] = h W_dkv, the rotary part of q
    (per head) and k_pe (one key for all heads) rotated, scores over [nope ; pe] / sqrt(dn +
    dr), times YaRN's attention factor squared (loom scales all of q and k by it)."""
    a = cfg.mla
    B, T, _ = h.shape
    H, dn, dr, dv, kvl = cfg.H, a["qk_head_dim"], a["qk_pos_emb_head_dim"], a["v_head_dim"], \
        a["kv_lora_rank"]
    if a.get("q_lora_rank"):
        cq = norm(h @ g("self_attention.linear_q_down_proj.weight").T,
                  g("self_attention.q_layernorm.weight"), None, cfg.norm, cfg.eps)
        q = cq @ g("self_attention.linear_q_up_proj.weight").T
    else:
        q = h @ g("self_attention.linear_q_proj.weight").T
    q = q.view(B, T, H, dn + dr)
    down = h @ g("self_attention.linear_kv_down_proj.weight").T
    ckv, kpe = down[..., :kvl], down[..., kvl:]
    kv = norm(ckv, g("self_attention.kv_layernorm.weight"), None, cfg.norm, cfg.eps)
    kv = (kv @ g("self_attention.linear_kv_up_proj.weight").T).view(B, T, H, dn + dv)
    k_nope, v = kv[..., :dn], kv[..., dn:]

    class Rot:  # the rotary settings over the dr channels
        D, rope_percent, rope_base, rope_scaling = dr, 1.0, cfg.rope_base, {"type": "none"}
    Rot.rope_scaling = cfg.rope_scaling
    f, _ = inv_freq(Rot)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * f[None, :]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]

    def rot(x):
        x1, x2 = x[..., : dr // 2], x[..., dr // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    m = rope_attention_factor(cfg)
    q_pe, k_pe = rot(q[..., dn:]), rot(kpe.view(B, T, 1, dr))
    s = (torch.einsum("bthd,bshd->bhts", q[..., :dn], k_nope) +
         torch.einsum("bthd,bsd->bhts", q_pe, k_pe[:, :, 0])) * (m * m) / math.sqrt(dn + dr)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    s = s.masked_fill(~causal, float("-inf"))
    return torch.einsum("bhts,bshd->bthd", s.softmax(-1), v).reshape(B, T, H * dv)


def norm(x, w, b, kind, eps):
    if kind == "rmsnorm":
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


# ---------------------------------------------------------------------------------------
# Mixture of experts (Megatron-Core's MoELayer: TopKRouter, token dropping, experts, shared
# experts). Everything in float64. Discrete choices (top-k, groups, capacity) are made on
# detached numpy copies, with ties going to the lower expert (group, token) index; the
# probabilities are then gathered from the differentiable tensors.
# ---------------------------------------------------------------------------------------


def trained(name):
    """False for parameters the optimizer leaves alone (the router's expert bias)."""
    return not name.endswith(".router.expert_bias")


def activate(h, kind):
    if kind == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up
    if kind == "gelu_tanh":
        return torch.nn.functional.gelu(h, approximate="tanh")
    return torch.nn.functional.gelu(h)


def expert_ffn(x, w1, w2, kind):
    """fc2(act(fc1 x)) without biases; a swiglu fc1 (2, F, C) is the (2F, C) [gate; up]."""
    return activate(x @ w1.reshape(-1, x.shape[-1]).T, kind) @ w2.T


def topk_rows(scores, k):
    """(indices (N, k) of each row's k largest scores in descending order, smallest gap
    between a row's k-th and (k+1)-th score). Ties go to the lower index (stable sort);
    -inf marks ineligible entries."""
    order = np.argsort(-scores, axis=1, kind="stable")
    idx = order[:, :k]
    gap = math.inf
    if k < scores.shape[1]:
        rows = np.arange(scores.shape[0])
        kth, nxt = scores[rows, order[:, k - 1]], scores[rows, order[:, k]]
        ok = np.isfinite(nxt)
        if ok.any():
            gap = float(np.min(kth[ok] - nxt[ok]))
    return idx, gap


class MoeRun:
    """What one micro-batch's (or one step's) forward through the MoE layers leaves behind:
    the aux terms of the objective, the routed (token, choice) counts per expert for the
    expert-bias update, the counts global_aux_loss accumulates over the step's
    micro-batches, and the smallest margin of any discrete routing decision."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.aux = torch.zeros(())
        self.aux_terms = {}  # "layer i type" -> value, for printing
        self.routed = {}  # layer -> (E) counts of the actual routing
        self.global_counts = {}  # layer -> [(E) summed aux counts, micro-batches]
        self.margin = math.inf

    def note(self, gap):
        self.margin = min(self.margin, gap)

    def update_bias(self, p):
        """Megatron's aux-loss-free balancing after an optimizer step: each expert's bias
        moves by bias_update_rate towards the mean load, sign(mean(c) - c) (sign(0) = 0)."""
        moe = self.cfg.moe
        if not moe.expert_bias:
            return
        for i, c in self.routed.items():
            name = f"decoder.layers.{i}.mlp.router.expert_bias"
            p[name] = p[name] + moe.bias_rate * torch.tensor(np.sign(c.mean() - c))


def route(logits, moe, bias, run):
    """Megatron-Core's topk_routing_with_score_function: probs (N, K) (differentiable) and
    experts (N, K) (numpy)."""
    N, E = logits.shape
    K = moe.K
    if moe.score == "softmax":
        s = logits.softmax(-1)
        sel = s.detach().numpy() if moe.pre_softmax else logits.detach().numpy()
    else:
        s = torch.sigmoid(logits)
        sel = s.detach().numpy()
        if bias is not None:
            sel = sel + bias  # the bias steers the selection, never the probabilities
    if moe.num_groups > 1:
        # Group-limited routing: G contiguous groups of E / G experts; a group's score is
        # the sum of its K / group_topk best selection scores; only the group_topk best
        # groups' experts stay eligible.
        G, keep_groups = moe.num_groups, moe.group_topk
        grouped = -np.sort(-sel.reshape(N, G, E // G), axis=2)[:, :, : K // keep_groups]
        best, gap = topk_rows(grouped.sum(axis=2), keep_groups)
        run.note(gap)
        eligible = np.zeros((N, G), dtype=bool)
        eligible[np.arange(N)[:, None], best] = True
        sel = np.where(np.repeat(eligible, E // G, axis=1), sel, -np.inf)
    idx, gap = topk_rows(sel, K)
    run.note(gap)
    it = torch.as_tensor(idx)
    if moe.score == "softmax":
        probs = s.gather(1, it) if moe.pre_softmax else logits.gather(1, it).softmax(-1)
    else:
        probs = s.gather(1, it)
        if K > 1:
            probs = probs / (probs.sum(-1, keepdim=True) + 1e-20)
    if moe.scaling is not None:
        probs = probs * moe.scaling
    return probs, idx


def capacity_keep(probs, idx, moe, run):
    """Token dropping (Megatron's apply_router_token_dropping without padding): the (N, K)
    mask of the (token, choice) pairs each expert keeps, at most
    capacity = ceil(N * K / E * capacity_factor) per expert (N: the micro-batch's tokens on
    this, the only, rank). Policy "probs" keeps the highest probabilities (ties: lower token),
    "position" the first tokens."""
    N, K = idx.shape
    capacity = math.ceil(N * K / moe.E * moe.capacity_factor)
    keep = np.ones((N, K), dtype=bool)
    for e in range(moe.E):
        t, k = np.nonzero(idx == e)  # in token order
        if len(t) <= capacity:
            continue
        if moe.drop_policy == "probs":
            pr = probs[t, k]
            order = np.lexsort((t, -pr))
            run.note(float(pr[order[capacity - 1]] - pr[order[capacity]]) if capacity else math.inf)
        else:
            order = np.argsort(t, kind="stable")
        keep[t[order[capacity:]], k[order[capacity:]]] = False
    return keep


def aux_losses(logits, B, T, moe, layer, run):
    """The load-balancing losses and the z-loss of one MoE layer (added to the objective,
    not to the reported loss). Their scores are the softmax over all experts (softmax
    router) or sigmoid(logits) normalised by its row sum (sigmoid router), whatever
    pre_softmax, the expert bias, groups or capacity do to the routing; the counts come
    from the top-K of those scores and carry no gradient."""
    N, E = logits.shape
    K = moe.K
    total = torch.zeros(())
    if moe.aux:
        if moe.score == "softmax":
            s = logits.softmax(-1)
        else:
            s = torch.sigmoid(logits)
            s = s / (s.sum(-1, keepdim=True) + 1e-20)
        top, gap = topk_rows(s.detach().numpy(), K)
        run.note(gap)
        routed = np.zeros((N, E))
        routed[np.arange(N)[:, None], top] = 1.0
        for kind, c in moe.aux:
            if kind == "aux_loss":
                counts = torch.tensor(routed.sum(0))
                term = c * E / (K * N * N) * (counts * s.sum(0)).sum()
            elif kind == "seq_aux_loss":
                # Per sequence b of S = T tokens, then averaged over the B sequences.
                counts = torch.tensor(routed.reshape(B, T, E).sum(1))
                term = c * E / (K * T * T) * (counts * s.reshape(B, T, E).sum(1)).sum() / B
            else:  # global_aux_loss
                # Megatron's _apply_global_aux_loss (router.py) with
                # switch_load_balancing_loss_func (moe_utils.py): the counts summed over the
                # data-parallel ranks (one rank here) are added to a buffer that lives for the
                # optimizer step; each micro-batch uses the buffer divided by the micro-batches
                # added so far (this one included), while T stays this micro-batch's tokens
                # (times the data-parallel ranks):
                #   coeff * E / (K T^2) * sum_e (sum_{i<=m} c_ie / m) * sum_t s_te
                acc = run.global_counts.setdefault(layer, [np.zeros(E), 0])
                acc[0] = acc[0] + routed.sum(0)
                acc[1] += 1
                counts = torch.tensor(acc[0] / acc[1])
                term = c * E / (K * N * N) * (counts * s.sum(0)).sum()
            run.aux_terms[f"layer {layer} {kind}"] = term.item()
            total = total + term
    if moe.z is not None:
        term = moe.z * (torch.logsumexp(logits, -1) ** 2).mean()
        run.aux_terms[f"layer {layer} z_loss"] = term.item()
        total = total + term
    return total


def moe_mlp(h, g, cfg, layer, run):
    """The MoE block of layer `layer` on the pre-MLP-normed h (B, T, C); adds its aux terms
    to run.aux and its routed counts to run.routed."""
    moe = cfg.moe
    B, T, C = h.shape
    x = h.reshape(B * T, C)  # tokens in (b, t) order
    logits = x @ g("mlp.router.weight").T  # (N, E)
    bias = g("mlp.router.expert_bias")
    probs, idx = route(logits, moe, None if bias is None else bias.detach().numpy(), run)
    keep = np.ones(idx.shape, dtype=bool)
    if moe.capacity_factor is not None:
        keep = capacity_keep(probs.detach().numpy(), idx, moe, run)
        probs = probs * torch.tensor(keep, dtype=torch.float64)  # dropped: 0, no renormalising
    out = torch.zeros(B * T, C)
    for e in range(moe.E):
        t, k = np.nonzero((idx == e) & keep)
        if len(t) == 0:
            continue
        tt = torch.as_tensor(t)
        y = expert_ffn(x[tt], g(f"mlp.experts.linear_fc1.weight{e}"),
                       g(f"mlp.experts.linear_fc2.weight{e}"), moe.activation)
        out = out.index_add(0, tt, y * probs[tt, torch.as_tensor(k)][:, None])
    if moe.shared:
        y = expert_ffn(x, g("mlp.shared_experts.linear_fc1.weight"),
                       g("mlp.shared_experts.linear_fc2.weight"), moe.activation)
        if moe.shared_gate:
            y = y * torch.sigmoid(x @ g("mlp.shared_experts.gate_weight").T)
        out = out + y
    counts = np.bincount(idx[keep], minlength=moe.E).astype(np.float64)
    run.routed[layer] = run.routed.get(layer, 0) + counts
    run.aux = run.aux + aux_losses(logits, B, T, moe, layer, run)
    return out.reshape(B, T, C)


def expected_moe_shapes(cfg):
    """Name -> shape of every MLP parameter of an MoE model, as loom must name them."""
    moe, C = cfg.moe, cfg.C
    want = {}

    def fc1(F, act):
        return (2, F, C) if act == "swiglu" else (F, C)

    for i in range(cfg.L):
        pre = f"decoder.layers.{i}.mlp."
        if not cfg.moe_layers[i]:
            F = cfg.dense_F
            want[pre + "linear_fc1.weight"] = fc1(F, cfg.activation)
            want[pre + "linear_fc2.weight"] = (C, F)
            continue
        want[pre + "router.weight"] = (moe.E, C)
        if moe.expert_bias:
            want[pre + "router.expert_bias"] = (moe.E,)
        for e in range(moe.E):
            F = moe.F
            want[pre + f"experts.linear_fc1.weight{e}"] = fc1(F, moe.activation)
            want[pre + f"experts.linear_fc2.weight{e}"] = (C, F)
        if moe.shared:
            F = moe.shared
            want[pre + "shared_experts.linear_fc1.weight"] = fc1(F, moe.activation)
            want[pre + "shared_experts.linear_fc2.weight"] = (C, F)
            if moe.shared_gate:
                want[pre + "shared_experts.gate_weight"] = (1, C)
    return want


def check_moe_names(weights, cfg):
    """loom's MLP parameters of an MoE model: every expected name with its shape, and in the
    MoE layers nothing else."""
    want = expected_moe_shapes(cfg)
    for name, shape in want.items():
        if name not in weights:
            failures.append(f"parameter {name} {shape}: missing from loom's weights")
        elif tuple(weights[name].shape) != shape:
            failures.append(f"parameter {name}: shape {tuple(weights[name].shape)}, "
                            f"expected {shape}")
    moe_prefixes = tuple(f"decoder.layers.{i}.mlp." for i in range(cfg.L) if cfg.moe_layers[i])
    for name in weights:
        if name.startswith(moe_prefixes) and name not in want:
            failures.append(f"parameter {name}: not expected in an MoE layer")


def mlp_block(h, g, cfg, i, moe_run):
    """Layer i's MLP (its MoE block, or the dense MLP) of the normed h."""
    if cfg.moe_layers[i]:
        return moe_mlp(h, g, cfg, i, moe_run)
    # swiglu's fc1 is (2, F, C) [gate; up]: as rows, the (2F, C) matrix.
    h = h @ g("mlp.linear_fc1.weight").reshape(-1, cfg.C).T
    if g("mlp.linear_fc1.bias") is not None:
        h = h + g("mlp.linear_fc1.bias").reshape(-1)
    h = rnd(h)
    if cfg.activation == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        h = torch.nn.functional.silu(gate) * up
    elif cfg.activation == "gelu_tanh":
        h = torch.nn.functional.gelu(h, approximate="tanh")
    else:
        h = torch.nn.functional.gelu(h)
    h = rnd(h) @ g("mlp.linear_fc2.weight").T
    if g("mlp.linear_fc2.bias") is not None:
        h = h + g("mlp.linear_fc2.bias")
    return rnd(h)


# ---------------------------------------------------------------------------------------
# bf16 and f16 parameters (precision.params): loom keeps the weights and activations in the
# low-precision type (its kernels compute in f32 and round what they store) and f32 master
# weights and gradients. The reference computes in f64 from the same rounded weights and
# rounds its activations where loom stores them (the outputs of the embeddings, norms,
# linear layers, attention scores, probabilities and outputs, activation functions, residual
# adds and logits) and their gradients on the way back (f16: scaled by the step's loss
# scale, as loom's are). Rounding points inside loom's kernels, and the order of its f32
# sums, are not modelled: a value near a rounding boundary may round the other way, an
# error of one unit in the last place (bf16 2^-8, f16 2^-11 relative) that the steps carry on.
# ---------------------------------------------------------------------------------------

LOW = {"dtype": None, "scale": 1.0}  # the run being rebuilt: rounding type, loss scale


class _Round(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.to(LOW["dtype"]).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        s = LOW["scale"]
        return (g * s).to(LOW["dtype"]).to(g.dtype) / s


def rnd(x):
    """x rounded to the run's low-precision type (forward and gradient); x itself in f32."""
    return x if LOW["dtype"] is None else _Round.apply(x)


def low_weights(p):
    """The weights the forward pass uses: the masters rounded to the parameters' type."""
    if LOW["dtype"] is None:
        return p
    return {k: v.detach().to(LOW["dtype"]).to(v.dtype) for k, v in p.items()}


def forward(p, cfg, tokens, labels, mask, moe_run=None, positions=None, segments=None,
            drop=None):
    """(logits, mean CE). An MoE model's aux terms go to moe_run.aux (a MoeRun). Packed
    documents: positions (B, T) restart in each document, segments (B, T) its index;
    attention stays within a document. drop: the micro-batch's Dropout, or None (none)."""
    B, T = tokens.shape
    if drop is None:
        drop = lambda x, *_: x
    elif cfg.mla or cfg.moe:
        raise ValueError("dropout: rebuilt for dense models with dot-product attention only")
    hp = cfg.hidden_dropout
    x = p["embedding.word_embeddings.weight"][tokens]
    if cfg.pos == "learned":
        pos = torch.arange(T).expand(B, T) if positions is None else positions
        x = x + p["embedding.position_embeddings.weight"][pos]
    x = rnd(drop(rnd(x), "embedding", 1, hp))
    per = cfg.H // cfg.G
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    if segments is not None:
        if cfg.mla:
            raise ValueError("packed documents: not rebuilt for multi-latent attention")
        causal = causal[None, None] & (segments[:, None, :, None] == segments[:, None, None, :])
    for i in range(cfg.L):
        pre = f"decoder.layers.{i}."
        g = lambda n: p.get(pre + n)
        h = rnd(norm(x, g("input_layernorm.weight"), g("input_layernorm.bias"), cfg.norm, cfg.eps))
        if cfg.mla:
            a = mla_attention(h, g, cfg) @ g("self_attention.linear_proj.weight").T
            if g("self_attention.linear_proj.bias") is not None:
                a = a + g("self_attention.linear_proj.bias")
            x = x + a
            h = norm(x, g("pre_mlp_layernorm.weight"), g("pre_mlp_layernorm.bias"), cfg.norm,
                     cfg.eps)
            x = x + mlp_block(h, g, cfg, i, moe_run)
            continue
        qkv = h @ g("self_attention.linear_qkv.weight").T
        if g("self_attention.linear_qkv.bias") is not None:
            qkv = qkv + g("self_attention.linear_qkv.bias")
        qkv = rnd(qkv)
        qkv = qkv.view(B, T, cfg.G, (per + 2) * cfg.D)  # Megatron's grouped layout
        q = qkv[..., : per * cfg.D].reshape(B, T, cfg.H, cfg.D)
        k = qkv[..., per * cfg.D : (per + 1) * cfg.D]
        v = qkv[..., (per + 1) * cfg.D :]
        if cfg.qk_layernorm:  # Megatron's q_layernorm / k_layernorm: weights (D), all heads
            for n in ("q_layernorm", "k_layernorm"):
                if g(f"self_attention.{n}.weight") is None:
                    raise ValueError(f"qk_layernorm: loom has no {pre}self_attention.{n}.weight")
            q = norm(q, g("self_attention.q_layernorm.weight"), g("self_attention.q_layernorm.bias"),
                     cfg.norm, cfg.eps)
            k = norm(k, g("self_attention.k_layernorm.weight"), g("self_attention.k_layernorm.bias"),
                     cfg.norm, cfg.eps)
        if cfg.pos == "rope":
            q, k = rope(q, cfg, positions), rope(k, cfg, positions)
        k = k.repeat_interleave(per, dim=2)
        v = v.repeat_interleave(per, dim=2)
        s = rnd(torch.einsum("bthd,bshd->bhts", q, k)) / math.sqrt(cfg.D)
        s = s.masked_fill(~causal, float("-inf"))
        probs = rnd(s.softmax(-1))
        if cfg.attention_dropout > 0:  # each tensor-parallel rank draws its heads' own stream
            tp = getattr(drop, "tp", 1)
            probs = torch.cat([drop(c, pre + "self_attention.core_attention", 1 + (r << 32),
                                    cfg.attention_dropout)
                               for r, c in enumerate(probs.chunk(tp, dim=1))], dim=1)
        a = rnd(torch.einsum("bhts,bshd->bthd", rnd(probs), v)).reshape(B, T, cfg.H * cfg.D)
        a = rnd(a @ g("self_attention.linear_proj.weight").T)
        if g("self_attention.linear_proj.bias") is not None:
            a = rnd(a + g("self_attention.linear_proj.bias"))
        x = rnd(x + rnd(drop(a, pre[:-1], 1, hp)))
        h = rnd(norm(x, g("pre_mlp_layernorm.weight"), g("pre_mlp_layernorm.bias"), cfg.norm,
                     cfg.eps))
        x = rnd(x + rnd(drop(mlp_block(h, g, cfg, i, moe_run), pre[:-1], 2, hp)))
    x = rnd(norm(x, p["decoder.final_layernorm.weight"], p.get("decoder.final_layernorm.bias"),
                 cfg.norm, cfg.final_eps))
    w_out = p["embedding.word_embeddings.weight"] if cfg.tied else p["output_layer.weight"]
    logits = rnd(x @ w_out.T)
    ce = torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), labels.reshape(-1),
                                           reduction="none")
    m = mask.reshape(-1)
    return logits, (ce * m).sum() / m.sum().clamp(min=1)


# ---------------------------------------------------------------------------------------
# Dropout, with loom's masks drawn here independently from their definition: the stream of
# (module, purpose) has the key of ForwardContext::rng (core/runtime/forward_context.cc),
#   k = mix64(seed ^ "loomrand"), then k = mix64(k ^ x) for x = step, micro-batch, module id,
#   purpose; counter 0;
# the module id is the FNV-1a hash of the module's path (ParameterSet::walk); element i of
# the (contiguous) tensor uses word i % 4 of Philox4x32-10 block (key, counter + i / 4)
# (loom/ops.h, loom/cpp/philox.h) and is kept when (word >> 8) * 2^-24 >= p, kept elements
# scaled by 1 / (1 - p). Sites (Megatron's): the embeddings' output ("embedding", purpose 1),
# the attention probabilities (B, H, T, S) (the layer's "self_attention.core_attention",
# purpose 1 + (tensor-parallel rank << 32)), the attention projection's output (the layer,
# purpose 1) and the MLP's output (the layer, purpose 2), the last three before the residual
# add, each with the bias added.
# ---------------------------------------------------------------------------------------

_M32 = 0xFFFFFFFF


def philox4x32_10(key, counters):
    """The four output words (4, N) of Philox4x32-10 (Salmon et al., SC'11) for the 64-bit
    key (k0 its low half) and 64-bit block counters (N,) (words c0, c1 their low and high
    halves, c2 = c3 = 0), as numpy uint64 arrays of 32-bit values."""
    ctr = np.asarray(counters, dtype=np.uint64)
    c = [ctr & np.uint64(_M32), ctr >> np.uint64(32), np.zeros_like(ctr), np.zeros_like(ctr)]
    return philox_rounds(c, key & _M32, key >> 32)


def philox_rounds(c, k0, k1):
    c0, c1, c2, c3 = (np.asarray(x, dtype=np.uint64) for x in c)
    m32 = np.uint64(_M32)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0  # 32 x 32 bits: exact in 64
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & m32,
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & m32)
        k0, k1 = (k0 + 0x9E3779B9) & _M32, (k1 + 0xBB67AE85) & _M32
    return np.stack([c0, c1, c2, c3])


def check_philox():
    """Random123's known-answer vectors for philox4x32_10 (kat_vectors): a wrong
    implementation here would make every dropout comparison meaningless."""
    kat = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
           ((_M32,) * 4, (_M32, _M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
           ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, (k0, k1), want in kat:
        got = philox_rounds([[x] for x in ctr], k0, k1)[:, 0]
        if [int(x) for x in got] != list(want):
            return False
    return True


def fnv1a(text):
    h = 0xCBF29CE484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001B3) & _M64
    return h


def stream_key(seed, step, micro_batch, path, purpose):
    k = mix64(seed ^ 0x6C6F6F6D72616E64)  # "loomrand"
    for x in (step, micro_batch, fnv1a(path), purpose):
        k = mix64(k ^ (x & _M64))
    return k


def keep_mask(key, shape, p):
    """The (shape) bool mask of kept elements of one dropout call at (key, counter 0)."""
    n = int(np.prod(shape))
    i = np.arange(n, dtype=np.uint64)
    words = philox4x32_10(key, i // np.uint64(4))
    word = np.take_along_axis(words, (i % np.uint64(4)).astype(np.int64)[None], 0)[0]
    threshold = math.ceil(float(np.float32(p)) * 2.0 ** 24)  # loom's p is an f32
    return (word >> np.uint64(8) >= np.uint64(threshold)).reshape(shape)


class Dropout:
    """The dropout masks of one micro-batch (seed, step, micro-batch) of a model; records the
    module paths it used and how many elements it kept of how many."""

    def __init__(self, seed, step, micro_batch, tp=1):
        self.seed, self.step, self.micro_batch = seed, step, micro_batch
        self.tp = tp  # tensor-parallel size: the attention probabilities' streams per rank
        self.paths = set()
        self.kept = {}  # p -> [kept, total]

    def __call__(self, x, path, purpose, p):
        if p <= 0:
            return x
        self.paths.add(path)
        keep = keep_mask(stream_key(self.seed, self.step, self.micro_batch, path, purpose),
                         tuple(x.shape), p)
        count = self.kept.setdefault(p, [0, 0])
        count[0] += int(keep.sum())
        count[1] += keep.size
        scale = 1.0 / (1.0 - float(np.float32(p)))
        return x * torch.tensor(keep, dtype=x.dtype) * scale


# ---------------------------------------------------------------------------------------
# loom's mock data (core/data/mock_data.cc), regenerated so that a step of several
# micro-batches can be replayed: dump_reference records only each step's first micro-batch.
# ---------------------------------------------------------------------------------------

_M64 = (1 << 64) - 1


def mix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class MockTokens:
    """Sample stream i (one row of T tokens and labels) of MockData(vocab, seed)."""

    def __init__(self, vocab, seed, branching=4):
        self.vocab, self.seed, self.branching = vocab, seed, branching
        x = mix64(seed ^ 0x6D6F636B)  # "mock"
        self.succ = []
        for _ in range(vocab * branching):
            x = mix64(x)
            self.succ.append(x % vocab)

    def rows(self, first, B, T):
        tokens, labels = np.zeros((B, T), dtype=np.int64), np.zeros((B, T), dtype=np.int64)
        for b in range(B):
            x = mix64(self.seed ^ mix64(first + b))
            token = x % self.vocab
            for t in range(T):
                x = mix64(x)
                nxt = self.succ[token * self.branching + x % self.branching]
                tokens[b, t], labels[b, t] = token, nxt
                token = nxt
        return torch.tensor(tokens), torch.tensor(labels)


failures = []
worst = {}  # kind -> (max |loom - torch| / (atol + rtol * scale), what): printed for MoE models
achieved = {}  # kind -> (max |loom - torch| / max |torch|, what, err, scale): always printed


def compare(what, loom, ref, kind):
    atol, rtol = TOLERANCES[kind.split()[-1]]  # "tp2 final": the tolerance of "final"
    loom = np.asarray(loom, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if loom.shape != ref.shape:
        failures.append(f"{what}: shape {loom.shape} vs torch {ref.shape}")
        return
    err = float(np.max(np.abs(loom - ref))) if loom.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    ratio = err / (atol + rtol * scale)
    if kind not in worst or not ratio <= worst[kind][0]:
        worst[kind] = (ratio, what, err)
    rel = err / scale if scale > 0 else (0.0 if err == 0 else math.inf)
    if kind not in achieved or not rel <= achieved[kind][0]:
        achieved[kind] = (rel, what, err, scale)
    if not err <= atol + rtol * scale:
        failures.append(f"{what}: max |loom - torch| = {err:.3g} > {atol:g} + {rtol:g} * {scale:.3g}")


def check_dropout_draws(drops, dump):
    """The masks' module paths are loom's (modules.json lists them: a path of this script's
    that loom does not have would draw a stream loom never uses), and each probability's
    keep rate over every mask drawn is 1 - p within 5 standard deviations."""
    modules = set(json.load(open(f"{dump}/modules.json")))
    used = set().union(*(d.paths for d in drops))
    for path in sorted(used - modules):
        failures.append(f"dropout: no module {path!r} in loom's model (modules.json)")
    kept = {}
    for d in drops:
        for p, (k, n) in d.kept.items():
            kept.setdefault(p, [0, 0])
            kept[p][0] += k
            kept[p][1] += n
    for p, (k, n) in sorted(kept.items()):
        sd = math.sqrt(p * (1 - p) / n)
        rate = k / n
        print(f"dropout p {p}: kept {k} of {n} ({rate:.4f}; 1 - p = {1 - p:.4f}, "
              f"{abs(rate - (1 - p)) / sd:.2f} standard deviations) over {len(drops)} micro-batches")
        if abs(rate - (1 - p)) > 5 * sd:
            failures.append(f"dropout p {p}: keep rate {rate:.4f} is not 1 - p")


def read_train_run(run_dir):
    """(per-step records {step, loss, grad_norm, lr}, final weights by Megatron name,
    tensor-parallel size) of a `loom train` run directory: metrics.jsonl and the latest
    checkpoint, read here from loom's sharded format (each rank's shards/rank_N.json lists
    its tensors' boxes in the global shape; replicated tensors are written once)."""
    records = []
    for line in open(f"{run_dir}/metrics.jsonl"):
        m = json.loads(line) if line.strip() else {}
        if "loss" in m:
            if m.get("skipped"):
                raise ValueError(f"{run_dir}: step {m['step']} was skipped")
            records.append({k: m[k] for k in ("step", "loss", "grad_norm", "lr")})
    tp = json.load(open(f"{run_dir}/spec.resolved.json")).get("parallel", {}).get("tp", 1)
    ckpt = f"{run_dir}/checkpoints/" + open(f"{run_dir}/checkpoints/latest").read().strip()
    meta = json.load(open(f"{ckpt}/metadata.json"))
    kinds = {"f32": np.float32}
    final, covered = {}, {}
    import glob
    for index in sorted(glob.glob(f"{ckpt}/shards/rank_*.json")):
        shard = json.load(open(index))
        body = open(f"{ckpt}/shards/{shard['bin']}", "rb").read()
        for t in shard["tensors"]:
            if not t["name"].startswith("model."):
                continue
            name = t["name"][len("model."):]
            arr = np.frombuffer(body[t["byte_offset"] : t["byte_offset"] + t["nbytes"]],
                                dtype=kinds[t["dtype"]]).reshape(t["shape"])
            if name not in final:
                final[name] = np.zeros(t["global_shape"], dtype=np.float64)
                covered[name] = np.zeros(t["global_shape"], dtype=np.int64)
            box = tuple(slice(o, o + n) for o, n in zip(t["offset"], t["shape"]))
            final[name][box] = arr
            covered[name][box] += 1
    for name, c in covered.items():
        if c.min() != 1 or c.max() != 1:
            raise ValueError(f"{ckpt}: {name} is not covered exactly once by the shards")
    if meta.get("loom", {}).get("iteration") != records[-1]["step"]:
        raise ValueError(f"{ckpt}: not the checkpoint of the last step {records[-1]['step']}")
    return records, final, tp


def main():
    spec_path, dump, layouts = sys.argv[1], sys.argv[2], sys.argv[3:]
    spec = json.load(open(spec_path))
    cfg = Config(spec)
    weights = read_safetensors(f"{dump}/weights.safetensors")
    fwd = read_safetensors(f"{dump}/forward.safetensors")
    params = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in weights.items()}
    if cfg.moe:
        check_moe_names(weights, cfg)
        if failures:  # the model cannot be rebuilt from these weights
            print("FAILED: loom's MoE parameters are not as the spec says")
            for f in failures:
                print("  " + f)
            return 1

    tokens = torch.tensor(fwd["tokens"], dtype=torch.long)
    labels = torch.tensor(fwd["labels"], dtype=torch.long)
    mask = torch.tensor(fwd["loss_mask"], dtype=torch.float64)
    positions = torch.tensor(fwd["position_ids"], dtype=torch.long) if "position_ids" in fwd else None
    segments = torch.tensor(fwd["segment_ids"], dtype=torch.long) if "segment_ids" in fwd else None
    if spec.get("reference", {}).get("packed_documents"):
        if positions is None or segments is None or mask.min() != 0:
            print("FAILED: packed_documents: loom's dump has no position_ids, segment_ids or "
                  "masked positions")
            return 1
        print(f"batch 0: packed documents, {int(segments.max()) + 1} in the longest row; "
              f"{int((mask == 0).sum())} positions masked out of the loss")
    seed = spec["train"]["seed"]
    dropout = cfg.hidden_dropout > 0 or cfg.attention_dropout > 0
    drops = []  # every micro-batch's Dropout, for the paths and keep rates

    def dropout_of(step, micro_batch):  # training step `step` (batch 0 is step 1's)
        if not dropout:
            return None
        drops.append(Dropout(seed, step, micro_batch))
        return drops[-1]

    if dropout:
        if not check_philox():
            print("FAILED: this script's Philox4x32-10 misses Random123's known answers")
            return 1
        print(f"dropout: hidden {cfg.hidden_dropout}, attention {cfg.attention_dropout}; masks "
              "drawn here from loom's Philox stream definition (known answers checked)")
    precision = spec.get("precision", {}).get("params", "f32")
    if precision != "f32":
        if cfg.moe or cfg.mla:
            print(f"FAILED: {precision} parameters: rebuilt for dense models only")
            return 1
        LOW["dtype"] = {"bf16": torch.bfloat16, "f16": torch.float16}[precision]
        TOLERANCES.update(LOW_TOLERANCES[precision])
        print(f"{precision} parameters: activations and their gradients rounded to {precision} "
              "here where loom stores them; f32 master weights")
    LOW["scale"] = 1.0  # batch 0: loss gradient 1, no loss scaling
    run = MoeRun(cfg) if cfg.moe else None
    logits, loss = forward(params, cfg, tokens, labels, mask, run, positions, segments,
                           dropout_of(1, 0))
    # The gradients are those of the objective: the CE plus an MoE model's aux terms; the
    # loss compared is the CE alone.
    (loss if run is None else loss + run.aux).backward()
    compare("logits", fwd["logits"], logits.detach().numpy(), "logits")
    compare("loss", fwd["loss"], loss.item(), "loss")
    compared = 0
    for name, t in params.items():
        key = f"grad.{name}"
        if key not in fwd:
            if not trained(name):
                continue  # the expert bias: loom may keep no gradient for it
            failures.append(f"grad {name}: missing from loom's dump")
            continue
        # An untrained parameter (the expert bias) gets no gradient here: loom's must be 0.
        ref = t.grad.numpy() if t.grad is not None else np.zeros(tuple(t.shape))
        compare(f"grad {name}", fwd[key], ref, "grad")
        compared += 1
        if key in fwd and fwd[key].shape == ref.shape:
            scale = float(np.max(np.abs(ref))) if ref.size else 0.0
            err = float(np.max(np.abs(fwd[key] - ref))) if ref.size else 0.0
            print(f"  grad {name}: max |loom - torch| {err:.3g}, max |torch| {scale:.3g}, "
                  f"ratio {err / scale if scale > 0 else 0.0:.3g}")
    print(f"batch 0: loss loom {float(fwd['loss']):.7f} torch {loss.item():.7f}; "
          f"{compared} parameter gradients compared")
    if run is not None:
        terms = ", ".join(f"{k} {v:.6g}" for k, v in run.aux_terms.items())
        print(f"batch 0: MoE aux terms (in the gradients, not the loss): {terms or 'none'}; "
              f"smallest routing margin {run.margin:.3g}")

    # AdamW steps with loom's recorded learning rates (the schedule has its own tests).
    opt = spec["optimizer"]
    b1, b2, eps, wd = opt["beta1"], opt["beta2"], opt["eps"], opt["weight_decay"]
    # Moments kept in bf16 (Megatron's precision-aware optimizer, Transformer Engine's
    # FusedAdam): the f32 update, then each moment rounded to bf16, every step.
    def moment_store(name):
        if opt.get(name, "f32") == "f32":
            return lambda x: x
        return lambda x: x.to(torch.float32).to(torch.bfloat16).to(x.dtype)
    store_m, store_v = moment_store("exp_avg_dtype"), moment_store("exp_avg_sq_dtype")
    clip = spec["train"].get("grad_clip", 1.0)
    steps = json.load(open(f"{dump}/train.json"))
    B, T = tokens.shape
    # Gradient accumulation: M micro-batches per step (one data-parallel rank). Their
    # losses and gradients are averaged; an MoE model's aux terms are weighted 1/M too
    # (loom's aux_loss_weight, Megatron's grad_scale / M), and global_aux_loss's counts
    # accumulate over the step's micro-batches (one MoeRun per step).
    M = spec["train"].get("global_batch_size", B) // B
    mock = None
    if M > 1:
        if not spec.get("data", {}).get("mock"):
            print("FAILED: a reference spec with several micro-batches per step needs mock data "
                  "(the later micro-batches are regenerated here)")
            return 1
        mock = MockTokens(spec["data"].get("vocab_size") or cfg.V, spec["train"]["seed"])
        for rec in steps:
            t = rec["step"]
            if not torch.equal(mock.rows((t - 1) * M * B, B, T)[0],
                               torch.tensor(rec["tokens"]).view(B, T)):
                print(f"FAILED: step {t}: the regenerated mock tokens differ from loom's first "
                      "micro-batch (core/data/mock_data.cc changed?)")
                return 1

    def compared(k):
        """The elements of parameter k whose final values are compared: all but the key
        bias, which has an exactly zero gradient (softmax ignores a constant shift of every
        score in a row), so both sides compute rounding noise there, which Adam normalises
        into full-size steps of either sign: of the QKV bias, the Q and V parts only."""
        keep = torch.ones(weights[k].shape, dtype=torch.bool)
        if k.endswith("linear_qkv.bias"):
            per = cfg.H // cfg.G
            keep = keep.view(cfg.G, (per + 2) * cfg.D)
            keep[:, per * cfg.D : (per + 1) * cfg.D] = False
            keep = keep.reshape(-1)
        return keep

    def replay(records, label, tp=1):
        """The AdamW steps of `records` (loom's loss, grad norm and LR per step; the batches
        are the dump's) from loom's initial weights, each step's loss and grad norm compared
        (categories `label`step_loss and `label`step_grad_norm); returns the final weights.
        tp: the tensor-parallel size of the run (its attention dropout streams)."""
        p = {k: torch.tensor(v, dtype=torch.float64) for k, v in weights.items()}
        m = {k: torch.zeros_like(v) for k, v in p.items()}
        v2 = {k: torch.zeros_like(v) for k, v in p.items()}
        batch_of = {rec["step"]: rec for rec in steps}
        smallest = (math.inf, None, None)  # the smallest nonzero |gradient element|
        for rec in records:
            t = rec["step"]
            if rec.get("skipped"):
                failures.append(f"{label}step {t}: skipped by loom (not modelled here)")
                return p
            LOW["scale"] = rec.get("loss_scale", 1.0)
            leaf = {k: x.clone().requires_grad_(True) for k, x in low_weights(p).items()}
            tok = torch.tensor(batch_of[t]["tokens"], dtype=torch.long).view(B, T)
            lab = torch.tensor(batch_of[t]["labels"], dtype=torch.long).view(B, T)
            batches = [(tok, lab)]
            for j in range(1, M):
                batches.append(mock.rows(((t - 1) * M + j) * B, B, T))
            run = MoeRun(cfg) if cfg.moe else None
            l = torch.zeros(())
            for j, (tok_j, lab_j) in enumerate(batches):
                if run is not None:
                    run.aux = torch.zeros(())
                drop = dropout_of(t, j)
                if drop is not None:
                    drop.tp = tp
                _, l_j = forward(leaf, cfg, tok_j, lab_j, torch.ones(B, T), run, drop=drop)
                ((l_j if run is None else l_j + run.aux) / M).backward()  # the loss: CE alone
                l = l + l_j.detach() / M
            compare(f"{label}step {t} loss", rec["loss"], l.item(), label + "step_loss")
            grads = [x.grad for x in leaf.values() if x.grad is not None]  # None: unused expert
            norm_ = math.sqrt(sum(float((g ** 2).sum()) for g in grads))
            compare(f"{label}step {t} grad norm", rec["grad_norm"], norm_,
                    label + "step_grad_norm")
            coeff = min(1.0, clip / (norm_ + 1e-6)) if clip > 0 else 1.0
            lr = rec["lr"]
            with torch.no_grad():
                for k in p:
                    if not trained(k):
                        continue  # the expert bias moves only by update_bias below
                    g = leaf[k].grad
                    if g is None:  # an expert no token reached: zero gradient, Adam moves it
                        g = torch.zeros_like(p[k])
                    g = g * coeff
                    nonzero = g.abs()[compared(k) & (g != 0)]
                    if nonzero.numel() and float(nonzero.min()) < smallest[0]:
                        smallest = (float(nonzero.min()), k, t)
                    m[k] = store_m(b1 * m[k] + (1 - b1) * g)
                    v2[k] = store_v(b2 * v2[k] + (1 - b2) * g * g)
                    mhat = m[k] / (1 - b1 ** t)
                    vhat = v2[k] / (1 - b2 ** t)
                    decay = wd if p[k].dim() >= 2 else 0.0  # no decay on norms and biases
                    p[k] = p[k] - lr * (mhat / (vhat.sqrt() + eps) + decay * p[k])
                if run is not None:
                    run.update_bias(p)  # after the optimizer step, from this step's routing
            print(f"{label}step {t}: loss loom {rec['loss']:.7f} torch {l.item():.7f} "
                  f"lr {lr:.3e}"
                  + ("" if run is None else f" aux {run.aux.item():.6g} margin {run.margin:.3g}"))
        # Adam's update of an element is a steep function of its gradient where |g| is near
        # eps (the gain on rounding noise reaches lr / eps): such an element turns f32 noise
        # into a visible difference in the final weights. Printed to read a failure by.
        print(f"{label}smallest nonzero |gradient element| in these steps: {smallest[0]:.3g} "
              f"({smallest[1]}, step {smallest[2]}); Adam eps {eps:g}")
        return p

    def compare_final(final, p, label):
        for k in p:
            if k not in final:
                failures.append(f"{label}final {k}: missing from loom's weights")
                continue
            keep = compared(k).numpy()
            loom_final, ref_final = final[k][keep], p[k].numpy()[keep]
            compare(f"{label}final {k}", loom_final, ref_final, label + "final")

    # With bf16 or f16 parameters the f32 master weights are compared (master.safetensors).
    final_file = "master" if precision != "f32" else "final"
    compare_final(read_safetensors(f"{dump}/{final_file}.safetensors"), replay(steps, ""), "")
    if precision != "f32":  # loom's parameters are its masters rounded to nearest (even)
        final, master = (read_safetensors(f"{dump}/{f}.safetensors") for f in ("final", "master"))
        for k, v in master.items():
            want = torch.tensor(v).to(LOW["dtype"]).to(torch.float32).numpy()
            if not np.array_equal(final[k], want):
                failures.append(f"final {k}: loom's {precision} parameter is not its master "
                                "weight rounded to nearest")
        print(f"final: every {precision} parameter is its f32 master weight rounded to nearest")

    # Runs of `loom train` in other layouts (reference_test.sh): the same steps from the same
    # initial weights, compared with PyTorch at the same levels.
    for layout in layouts:
        name, run_dir = layout.split("=", 1)
        records, final, tp = read_train_run(run_dir)
        print(f"{name}: `loom train` in {run_dir}, tensor-parallel size {tp}, "
              f"{len(records)} steps")
        if [r["step"] for r in records] != [r["step"] for r in steps]:
            failures.append(f"{name}: steps {[r['step'] for r in records]}, not the dump's")
            continue
        for r, d in zip(records, steps):
            if r["lr"] != d["lr"]:
                failures.append(f"{name}: step {r['step']} lr {r['lr']} is not the dump's {d['lr']}")
        compare_final(final, replay(records, name + " ", tp), name + " ")

    if dropout:
        check_dropout_draws(drops, dump)

    # What was achieved, per category: the worst tensor's max |loom - torch| over its max
    # |torch|, and that as a fraction of the tolerance.
    for kind in achieved:
        rel, what, err, scale = achieved[kind]
        ratio, worst_what, _ = worst[kind]
        print(f"achieved {kind}: max |loom - torch| / max |torch| = {rel:.3g} ({what}: "
              f"{err:.3g} of {scale:.3g}); worst against the tolerance: {worst_what}, "
              f"{ratio:.3g} of it")
    if failures:
        print(f"FAILED: {len(failures)} comparisons out of tolerance")
        for f in failures:
            print("  " + f)
        return 1
    print("all figures agree with PyTorch within tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
