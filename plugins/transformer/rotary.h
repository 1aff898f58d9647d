// Rotary position embedding settings: the inverse frequencies of RoPE, computed once when a
// layer is built (base, rotary dimension, and the "linear", Llama 3 (HF's
// `_compute_llama3_parameters`) or YaRN (HF's `_compute_yarn_parameters`, Megatron-Core's
// YarnRotaryEmbedding) scaling), and kept in device memory for the rope_fwd / rope_bwd ops.
#pragma once

#include <loom/cpp/tensor.h>

#include <nlohmann/json.hpp>
#include <vector>

namespace loom::transformer {

/// The rotary dimension for head dimension `head_dim` and the "rotary" options node
/// (`percent` of the head, even). Throws with "/rotary/..." pointers when invalid.
int32_t rotary_dim(const nlohmann::json& rotary, int64_t head_dim);

/// inv_freq[i] = 1 / base^(2i / rotary_dim), i < rotary_dim / 2, then scaled. Validates the
/// "scaling" node; throws with "/rotary/scaling/..." pointers.
std::vector<float> rotary_inv_freq(const nlohmann::json& rotary, int32_t rotary_dim);

/// The factor that multiplies cos and sin (YaRN's attention temperature, "mscale"): for
/// scaling type yarn, attention_factor if given, else mscale(s, mscale) /
/// mscale(s, mscale_all_dim) when both are non-zero (DeepSeek), else 0.1 ln(s) + 1, with
/// s = factor and mscale(s, m) = 0.1 m ln(s) + 1 (1 for s <= 1); 1 for every other type.
/// loom multiplies all of q and k by it after rope, so a factor != 1 needs
/// rotary_dim == head_dim (refused with "/rotary/percent" otherwise).
double rotary_attention_factor(const nlohmann::json& rotary, int32_t rotary_dim, int64_t head_dim);

/// The inverse frequencies in device memory (from the host's allocator), freed with it.
class RotaryTable {
 public:
  RotaryTable(IHost& host, Device device, const std::vector<float>& inv_freq);
  ~RotaryTable();
  RotaryTable(const RotaryTable&) = delete;
  RotaryTable& operator=(const RotaryTable&) = delete;
  /// (rotary_dim / 2) f32.
  const TensorView& view() const { return view_; }

 private:
  IHost& host_;
  TensorView view_{};
};

}  // namespace loom::transformer
