// Rotary position embedding settings: the inverse frequencies of RoPE, computed once when a
// layer is built (base, rotary dimension, and the "linear" or Llama 3 scaling of HF's
// `_compute_llama3_parameters`), and kept in device memory for the rope_fwd / rope_bwd ops.
#pragma once

#include <loom/cpp/tensor.h>

#include <nlohmann/json.hpp>
#include <vector>

namespace loom::transformer {

/// The rotary dimension for head dimension `head_dim` and the "rotary" options node
/// (`percent` of the head, even). Throws with "/rotary/..." pointers when invalid.
int32_t rotary_dim(const nlohmann::json& rotary, int64_t head_dim);

/// inv_freq[i] = 1 / base^(2i / rotary_dim), i < rotary_dim / 2, then scaled.
std::vector<float> rotary_inv_freq(const nlohmann::json& rotary, int32_t rotary_dim);

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
