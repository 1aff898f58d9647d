// ParameterSet: the parameters of a built module tree, owned by the core.
//
// The set walks the tree (IModule::child), names every parameter by its path
// ("decoder.layers.0.self_attention.linear_qkv.weight"), allocates its storage (the
// declared dtype) and an f32 gradient, binds both to the module, and initialises them
// reproducibly: each parameter's values depend only on the seed and its name, never on
// the order of the walk or on the parallel layout.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/host.h"
#include "loom/kinds/module.h"

namespace loom::core {

/// One parameter of the tree.
struct Parameter {
  std::string name;       ///< path within the model
  IModule* module;        ///< the module that declares it
  int32_t index;          ///< its index in that module
  ParamInfo info;         ///< as declared (name points into the module)
  TensorView value;       ///< storage, info.dtype
  TensorView grad;        ///< f32, same shape
  int64_t numel() const;  ///< elements on this rank
};

class ParameterSet {
 public:
  /// Walks `root`, allocates and binds every parameter on `device`. Throws on a module that
  /// declares a bad parameter (naming it).
  ParameterSet(IHost& host, IModule& root, Device device);
  ~ParameterSet();
  ParameterSet(const ParameterSet&) = delete;
  ParameterSet& operator=(const ParameterSet&) = delete;

  /// Initialises every parameter from its ParamInit rule and `seed`.
  void initialize(uint64_t seed);
  /// Sets every gradient to zero.
  void zero_grads();

  std::vector<Parameter>& all() { return params_; }
  const std::vector<Parameter>& all() const { return params_; }
  /// The parameter called `name`, or null.
  Parameter* find(const std::string& name);
  /// Total number of elements.
  int64_t numel() const;
  /// Stable ids of every module in the tree (tree order), for ForwardContext::rng.
  const std::unordered_map<const void*, uint64_t>& module_ids() const { return module_ids_; }
  /// Every module with its path, in tree order (root first, path "").
  const std::vector<std::pair<std::string, IModule*>>& modules() const { return modules_; }

 private:
  void walk(IModule& module, const std::string& path);
  IHost& host_;
  Device device_;
  std::vector<Parameter> params_;
  std::vector<std::pair<std::string, IModule*>> modules_;
  std::unordered_map<const void*, uint64_t> module_ids_;
  std::vector<void*> blocks_;
};

/// Fills `count` floats with normal(0, std) draws that depend only on (seed, stream).
void fill_normal(float* out, int64_t count, float std, uint64_t seed, uint64_t stream);
/// Fills `count` floats with uniform(-bound, bound) draws that depend only on (seed, stream).
void fill_uniform(float* out, int64_t count, float bound, uint64_t seed, uint64_t stream);
/// Writes f32 `values` into `view` (f32, bf16 or f16), converting.
void store_floats(const float* values, const TensorView& view);
/// Reads `view` (f32, bf16 or f16) into f32 `values`.
void load_floats(const TensorView& view, float* values);
/// FNV-1a hash of a string (parameter names to random streams).
uint64_t hash_name(const std::string& text);

}  // namespace loom::core
