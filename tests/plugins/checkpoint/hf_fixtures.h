// Tiny GPT-2, LLaMA and mixture-of-experts models for the safetensors tests: their loom
// spec and the loom weights (names and shapes written out here independently of the
// plugin's own layout code), and a writer of Hugging Face directories.
#pragma once

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "plugins/checkpoint/safetensors_file.h"
#include "tests/plugins/checkpoint/checkpoint_env.h"

namespace loom::testing {

/// Sizes of a tiny model: C hidden, H heads, G groups, F ffn, V vocab, P positions, L layers.
struct Tiny {
  int64_t c = 8, h = 2, g = 2, f = 32, v = 11, p = 6, l = 2;
  bool tied = true;
  bool llama = false;
  /// With experts > 0 (and llama): layer.mlp is a moe of `experts` swiglu experts of width
  /// moe_f under a softmax top-k router, a gated shared expert of width shared_f (0: none);
  /// the layers `freq` marks 0 (empty: none) take the dense mlp of width f.
  int64_t experts = 0, k = 2, moe_f = 4, shared_f = 0;
  bool pre_softmax = false, qkv_bias = false;
  std::vector<int> freq;
  int64_t d() const { return c / h; }
  bool sparse(int64_t layer) const { return experts > 0 && (freq.empty() || freq[layer] == 1); }
};

/// The resolved-looking spec of `m` (GPT-2 style, or LLaMA style when m.llama, with a
/// mixture of experts when m.experts > 0).
nlohmann::json tiny_spec(const Tiny& m);

/// Random loom weights of `m` ("model." names) in `dtype`.
std::vector<OwnedTensor> tiny_weights(const Tiny& m, DType dtype, std::mt19937& rng);

/// The weight called `name` in `tensors`.
const OwnedTensor& by_name(const std::vector<OwnedTensor>& tensors, const std::string& name);

/// Element [i][j] of a row-major 2-D f32 tensor with `cols` columns.
float at(const OwnedTensor& t, int64_t i, int64_t j, int64_t cols);

/// A JSON file read whole, and `j` written to `path` (indented).
nlohmann::json read_json(const std::filesystem::path& path);
void write_json(const std::filesystem::path& path, const nlohmann::json& j);

/// The floats of Hugging Face tensor `name` in `file` (any dtype; a zero-width tensor gives
/// none). Throws when the file has no such tensor.
std::vector<float> hf_floats(const checkpoint::SafetensorsReader& file, const std::string& name);

/// v[begin, begin + n).
std::vector<float> part(const std::vector<float>& v, size_t begin, size_t n);

/// Writes `tensors` (Hugging Face names) to dir/file as safetensors (no loom metadata).
void write_hf_weights(const std::filesystem::path& file, const std::vector<OwnedTensor>& tensors);

}  // namespace loom::testing
