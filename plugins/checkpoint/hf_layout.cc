#include "plugins/checkpoint/hf_layout.h"

#include <loom/sdk.h>

#include <cstring>
#include <string>

namespace loom::checkpoint {
namespace {

// Builds a layout; `add` registers one loom tensor made of blocks.
class Builder {
 public:
  explicit Builder(HfLayout& out) : out_(out) {}

  // A loom tensor that is the HF tensor `hf` as is (or transposed, for 2-D).
  void same(const std::string& loom, const std::string& hf, std::vector<int64_t> shape,
            bool transposed = false) {
    std::vector<int64_t> hf_shape = shape;
    if (transposed) std::swap(hf_shape[0], hf_shape[1]);
    hf_tensor(hf, hf_shape);
    int64_t rows = shape[0];
    add(loom, std::move(shape), {{hf, 0, 0, rows, transposed}});
  }
  void hf_tensor(const std::string& hf, std::vector<int64_t> shape) {
    out_.hf_shapes[hf] = std::move(shape);
  }
  void add(const std::string& loom, std::vector<int64_t> shape, std::vector<RowBlock> blocks) {
    out_.tensors.push_back({loom, std::move(shape), std::move(blocks)});
  }
  // An HF tensor loom has no counterpart of, exported as zeros.
  void zeros(const std::string& hf, std::vector<int64_t> shape) {
    hf_tensor(hf, std::move(shape));
    out_.zeros.push_back(hf);
  }

 private:
  HfLayout& out_;
};

void gpt2(const HfModel& m, Builder& b) {
  const int64_t c = m.hidden, f = m.ffn, d = m.head_dim, h = m.heads;
  b.same("embedding.word_embeddings.weight", "transformer.wte.weight", {m.vocab, c});
  b.same("embedding.position_embeddings.weight", "transformer.wpe.weight", {m.positions, c});
  for (int64_t i = 0; i < m.layers; ++i) {
    std::string loom = "decoder.layers." + std::to_string(i) + ".";
    std::string hf = "transformer.h." + std::to_string(i) + ".";
    for (const char* p : {"weight", "bias"}) {
      b.same(loom + "input_layernorm." + p, hf + "ln_1." + p, {c});
      b.same(loom + "pre_mlp_layernorm." + p, hf + "ln_2." + p, {c});
    }
    // c_attn columns [q | k | v] -> rows per head [q_h; k_h; v_h].
    std::vector<RowBlock> w, bias;
    for (int64_t head = 0; head < h; ++head)
      for (int64_t part = 0; part < 3; ++part) {
        w.push_back(
            {hf + "attn.c_attn.weight", (3 * head + part) * d, part * c + head * d, d, true});
        bias.push_back({hf + "attn.c_attn.bias", (3 * head + part) * d, part * c + head * d, d});
      }
    b.hf_tensor(hf + "attn.c_attn.weight", {c, 3 * c});
    b.hf_tensor(hf + "attn.c_attn.bias", {3 * c});
    b.add(loom + "self_attention.linear_qkv.weight", {3 * c, c}, std::move(w));
    b.add(loom + "self_attention.linear_qkv.bias", {3 * c}, std::move(bias));
    b.same(loom + "self_attention.linear_proj.weight", hf + "attn.c_proj.weight", {c, c}, true);
    b.same(loom + "self_attention.linear_proj.bias", hf + "attn.c_proj.bias", {c});
    b.same(loom + "mlp.linear_fc1.weight", hf + "mlp.c_fc.weight", {f, c}, true);
    b.same(loom + "mlp.linear_fc1.bias", hf + "mlp.c_fc.bias", {f});
    b.same(loom + "mlp.linear_fc2.weight", hf + "mlp.c_proj.weight", {c, f}, true);
    b.same(loom + "mlp.linear_fc2.bias", hf + "mlp.c_proj.bias", {c});
  }
  b.same("decoder.final_layernorm.weight", "transformer.ln_f.weight", {c});
  b.same("decoder.final_layernorm.bias", "transformer.ln_f.bias", {c});
}

// loom's swiglu fc1 (2, F, C) = [gate; up] (a "row" of it is a whole (F, C) projection) and
// fc2 (C, F), from three Hugging Face projections.
void swiglu(Builder& b, const std::string& fc1, const std::string& fc2, const std::string& gate,
            const std::string& up, const std::string& down, int64_t f, int64_t c) {
  b.hf_tensor(gate, {f, c});
  b.hf_tensor(up, {f, c});
  b.add(fc1, {2, f, c}, {{gate, 0, 0, 1}, {up, 1, 0, 1}});
  b.same(fc2, down, {c, f});
}

// linear_qkv.weight (or .bias) in loom's grouped layout from q_proj, k_proj and v_proj.
void qkv(const HfModel& m, Builder& b, const std::string& loom, const std::string& hf,
         const std::string& what) {
  const int64_t c = m.hidden, d = m.head_dim, h = m.heads, g = m.groups;
  const int64_t per = h / g;  // query heads per group
  std::vector<RowBlock> blocks;
  for (int64_t group = 0; group < g; ++group) {
    int64_t row = group * (per + 2) * d;
    blocks.push_back({hf + "q_proj." + what, row, group * per * d, per * d});
    blocks.push_back({hf + "k_proj." + what, row + per * d, group * d, d});
    blocks.push_back({hf + "v_proj." + what, row + (per + 1) * d, group * d, d});
  }
  auto shape = [&](int64_t rows) {
    return what == "weight" ? std::vector<int64_t>{rows, c} : std::vector<int64_t>{rows};
  };
  b.hf_tensor(hf + "q_proj." + what, shape(h * d));
  b.hf_tensor(hf + "k_proj." + what, shape(g * d));
  b.hf_tensor(hf + "v_proj." + what, shape(g * d));
  b.add(loom + "linear_qkv." + what, shape(g * (per + 2) * d), std::move(blocks));
}

// A mixture-of-experts layer's mlp: `loom` "decoder.layers.i.mlp.", `hf` the HF block's.
void moe_mlp(const HfModel& m, Builder& b, const std::string& loom, const std::string& hf) {
  const HfMoe& e = *m.moe;
  const int64_t c = m.hidden, f = e.ffn;
  const bool mixtral = m.family == HfFamily::kMixtral;
  b.same(loom + "router.weight", hf + "gate.weight", {e.experts, c});
  for (int64_t g = 0; g < e.experts; ++g) {
    std::string ex = hf + "experts." + std::to_string(g) + ".", n = std::to_string(g);
    swiglu(b, loom + "experts.linear_fc1.weight" + n, loom + "experts.linear_fc2.weight" + n,
           ex + (mixtral ? "w1" : "gate_proj") + ".weight",
           ex + (mixtral ? "w3" : "up_proj") + ".weight",
           ex + (mixtral ? "w2" : "down_proj") + ".weight", f, c);
  }
  if (m.family != HfFamily::kQwen2Moe) return;  // Mixtral and Qwen3-MoE: no shared expert
  const std::string shared = hf + "shared_expert.";
  if (e.shared_ffn == 0) {  // Qwen2-MoE always has one: of width 0, and its gate
    b.zeros(shared + "gate_proj.weight", {0, c});
    b.zeros(shared + "up_proj.weight", {0, c});
    b.zeros(shared + "down_proj.weight", {c, 0});
    b.zeros(hf + "shared_expert_gate.weight", {1, c});
    return;
  }
  swiglu(b, loom + "shared_experts.linear_fc1.weight", loom + "shared_experts.linear_fc2.weight",
         shared + "gate_proj.weight", shared + "up_proj.weight", shared + "down_proj.weight",
         e.shared_ffn, c);
  b.same(loom + "shared_experts.gate_weight", hf + "shared_expert_gate.weight", {1, c});
}

// LLaMA, Mixtral, Qwen2-MoE and Qwen3-MoE.
void rope_decoder(const HfModel& m, Builder& b) {
  const int64_t c = m.hidden, f = m.ffn, d = m.head_dim, h = m.heads, g = m.groups;
  b.same("embedding.word_embeddings.weight", "model.embed_tokens.weight", {m.vocab, c});
  for (int64_t i = 0; i < m.layers; ++i) {
    std::string loom = "decoder.layers." + std::to_string(i) + ".";
    std::string hf = "model.layers." + std::to_string(i) + ".";
    b.same(loom + "input_layernorm.weight", hf + "input_layernorm.weight", {c});
    b.same(loom + "pre_mlp_layernorm.weight", hf + "post_attention_layernorm.weight", {c});
    qkv(m, b, loom + "self_attention.", hf + "self_attn.", "weight");
    if (m.qk_norm) {  // Qwen3-MoE: one (D) weight per layer for all heads, each of q and k
      b.same(loom + "self_attention.q_layernorm.weight", hf + "self_attn.q_norm.weight", {d});
      b.same(loom + "self_attention.k_layernorm.weight", hf + "self_attn.k_norm.weight", {d});
    }
    if (m.qkv_bias) {
      qkv(m, b, loom + "self_attention.", hf + "self_attn.", "bias");
    } else if (m.family == HfFamily::kQwen2Moe) {  // it always has them
      b.zeros(hf + "self_attn.q_proj.bias", {h * d});
      b.zeros(hf + "self_attn.k_proj.bias", {g * d});
      b.zeros(hf + "self_attn.v_proj.bias", {g * d});
    }
    b.same(loom + "self_attention.linear_proj.weight", hf + "self_attn.o_proj.weight", {c, h * d});
    if (m.moe && m.moe->sparse[i]) {
      moe_mlp(m, b, loom + "mlp.",
              hf + (m.family == HfFamily::kMixtral ? "block_sparse_moe." : "mlp."));
    } else {
      swiglu(b, loom + "mlp.linear_fc1.weight", loom + "mlp.linear_fc2.weight",
             hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight", hf + "mlp.down_proj.weight", f,
             c);
    }
  }
  b.same("decoder.final_layernorm.weight", "model.norm.weight", {c});
}

}  // namespace

const TensorLayout* HfLayout::find(const std::string& loom_name) const {
  for (const TensorLayout& t : tensors)
    if (t.loom == loom_name) return &t;
  return nullptr;
}

HfLayout hf_layout(const HfModel& model) {
  HfLayout out;
  Builder b(out);
  if (model.family == HfFamily::kGpt2) {
    out.base_prefix = "transformer.";
    gpt2(model, b);
  } else {
    out.base_prefix = "model.";
    rope_decoder(model, b);
  }
  if (!model.tied) b.same("output_layer.weight", "lm_head.weight", {model.vocab, model.hidden});
  return out;
}

void copy_block(const RowBlock& b, const std::vector<int64_t>& loom_shape,
                const std::vector<int64_t>& hf_shape, size_t elem, unsigned char* loom,
                unsigned char* hf, bool to_loom) {
  int64_t cols = 1;  // elements per loom row
  for (size_t i = 1; i < loom_shape.size(); ++i) cols *= loom_shape[i];
  const size_t row_bytes = static_cast<size_t>(cols) * elem;
  if (!b.transposed) {
    unsigned char* l = loom + static_cast<size_t>(b.row) * row_bytes;
    unsigned char* h = hf + static_cast<size_t>(b.src_row) * row_bytes;
    size_t n = static_cast<size_t>(b.rows) * row_bytes;
    to_loom ? std::memcpy(l, h, n) : std::memcpy(h, l, n);
    return;
  }
  // loom[row + r][k] <-> hf[k][src_row + r]; hf is (cols, N).
  LOOM_CHECK(hf_shape.size() == 2 && hf_shape[0] == cols, "block of ", b.hf);
  const int64_t n = hf_shape[1];
  for (int64_t r = 0; r < b.rows; ++r)
    for (int64_t k = 0; k < cols; ++k) {
      unsigned char* l = loom + (static_cast<size_t>(b.row + r) * cols + k) * elem;
      unsigned char* h = hf + (static_cast<size_t>(k) * n + b.src_row + r) * elem;
      to_loom ? std::memcpy(l, h, elem) : std::memcpy(h, l, elem);
    }
}

}  // namespace loom::checkpoint
