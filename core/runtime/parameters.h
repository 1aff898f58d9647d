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

/// This rank's coordinate along the split dimension (ParamInfo::tp_split_dim) of each
/// parameter: its tensor-parallel rank, or for an expert's parameter (kParamExpert) its
/// expert-tensor-parallel rank (experts are split over etp, Megatron's parallel folding).
struct SplitRanks {
  int64_t tp = 0;   ///< coordinate in the tensor-parallel group
  int64_t etp = 0;  ///< coordinate in the expert-tensor-parallel group
  /// The coordinate that slices a parameter declared as `info`.
  int64_t of(const ParamInfo& info) const { return (info.flags & kParamExpert) != 0 ? etp : tp; }
};

/// One parameter of the tree.
struct Parameter {
  std::string name;       ///< path within the model
  IModule* module;        ///< the module that declares it
  int32_t index;          ///< its index in that module
  ParamInfo info;         ///< as declared (name points into the module)
  TensorView value;       ///< storage, info.dtype
  TensorView grad;        ///< f32, same shape
  int64_t offset = 0;     ///< where value and grad start in the flat buffers (elements)
  int64_t numel() const;  ///< elements on this rank
  /// Where this rank's part starts in the whole tensor along dimension `d`: slice
  /// `ranks.of(info)` along the split dimension, 0 elsewhere.
  int64_t slice_start(int32_t d, const SplitRanks& ranks) const {
    return d == info.tp_split_dim ? ranks.of(info) * info.shape[d] : 0;
  }
  /// Rows of dimension 0 of the whole tensor that hold values (ParamInfo::valid_rows; the
  /// rest is padding): all of them unless the module padded it. 1 for a scalar.
  int64_t valid_rows() const {
    if (info.ndim == 0) return 1;
    return info.valid_rows > 0 ? info.valid_rows : info.global_shape[0];
  }
  /// This rank's rows of dimension 0 that hold values: a prefix of its slice (padding comes
  /// last), 0 when the slice is padding whole. Checkpoints hold only these rows.
  int64_t local_valid_rows(const SplitRanks& ranks) const {
    if (info.ndim == 0) return 1;
    const int64_t rows = valid_rows() - slice_start(0, ranks);
    return rows <= 0 ? 0 : rows < info.shape[0] ? rows : info.shape[0];
  }
  /// The group whose replicas of this parameter average its gradient: the experts' data
  /// group for an expert's parameter (kParamExpert), else the dense one.
  ParallelRole reduce_group() const {
    return (info.flags & kParamExpert) != 0 ? ParallelRole::kExpertData : ParallelRole::kData;
  }
};

/// A run of whole parameters that is contiguous in the flat buffers: the unit of
/// gradient reduction (data parallelism) and of sharding (distributed optimizer). Its
/// parameters share one reduction group (Parameter::reduce_group).
struct Bucket {
  int64_t offset = 0;          ///< first element in the flat buffers
  int64_t size = 0;            ///< elements, padding included (a multiple of pad_multiple)
  std::vector<size_t> params;  ///< indices into ParameterSet::all(), in backward order
  ParallelRole group = ParallelRole::kData;  ///< whose replicas reduce its gradients
};

/// How the flat buffers are cut into buckets.
struct BucketOptions {
  /// A bucket closes once it holds at least this many elements (0: one bucket for all).
  int64_t bucket_elements = 0;
  /// Every bucket's size is padded up to a multiple of this (the data-parallel size, so
  /// that it splits evenly into shards).
  int64_t pad_multiple = 1;
  /// The same for the buckets of expert parameters (the experts' data-parallel size).
  int64_t expert_pad_multiple = 1;
};

class ParameterSet {
 public:
  /// Walks `root`, allocates and binds every parameter on `device`. Throws on a module that
  /// declares a bad parameter (naming it). Values and f32 gradients live in two flat
  /// buffers, cut into buckets in backward order (the last parameters first: their
  /// gradients are ready first), the dense parameters' buckets first, then the experts'
  /// (each group's contiguous); parameters of different dtypes get one buffer each and
  /// no flat value buffer.
  ParameterSet(IHost& host, IModule& root, Device device, const BucketOptions& buckets = {});
  /// The same over several trees walked in order, each from the path "": the virtual
  /// pipeline chunks of one rank, whose parameters keep the whole model's names.
  ParameterSet(IHost& host, const std::vector<IModule*>& roots, Device device,
               const BucketOptions& buckets = {});
  ~ParameterSet();
  ParameterSet(const ParameterSet&) = delete;
  ParameterSet& operator=(const ParameterSet&) = delete;

  /// Initialises every parameter from its ParamInit rule and `seed`. A parameter split
  /// over tensor-parallel (or, an expert's, expert-tensor-parallel) ranks gets this rank's
  /// slice (`ranks`) of the values the whole tensor would have: the model starts the same
  /// in every layout.
  void initialize(uint64_t seed, const SplitRanks& ranks = {});
  /// Sets every gradient to zero, and makes every kParamGradOverwrite gradient's next write
  /// the step's first again (claim_grad). With `keep_overwrite`, the kParamGradOverwrite
  /// gradients keep their values (their first write of the step overwrites them): only the
  /// rest of the flat buffer is zeroed, and zero_unclaimed must follow the step's passes.
  void zero_grads(bool keep_overwrite = false);
  /// After the passes of a step whose zero_grads kept the kParamGradOverwrite gradients:
  /// zeroes those that no write claimed (a parameter that got no gradient this step), so
  /// that no earlier step's values remain. Nothing otherwise.
  void zero_unclaimed();
  /// The same for the parameters of `bucket` (one of buckets()) alone, while the passes
  /// still run: before the bucket goes to an overlapped reduction, every gradient in it
  /// final. A gradient zeroed here counts as claimed, so that neither a later write
  /// overwrites it nor zero_unclaimed zeroes the reduced values.
  void zero_unclaimed(const Bucket& bucket);
  /// True for the first call with the gradient of a kParamGradOverwrite parameter (its
  /// first element's address) since zero_grads; false for any later one, for any other
  /// address and for null (IForwardContext::grad_first_write).
  bool claim_grad(const void* grad);

  /// The flat gradient elements the last zero_grads left alone: every kParamGradOverwrite
  /// gradient's when it kept them, 0 when it zeroed everything.
  int64_t kept_elements() const { return kept_elements_; }

  std::vector<Parameter>& all() { return params_; }
  const std::vector<Parameter>& all() const { return params_; }
  /// The parameter called `name`, or null.
  Parameter* find(const std::string& name);
  /// Total number of elements (padding excluded).
  int64_t numel() const;
  /// The buckets, in backward order.
  const std::vector<Bucket>& buckets() const { return buckets_; }
  /// Elements of the flat buffers, padding included.
  int64_t flat_size() const { return flat_size_; }
  /// The flat f32 gradient buffer (flat_size) and the flat value buffer (flat_size, the
  /// parameters' dtype), or an empty view when the parameters do not share one dtype.
  const TensorView& flat_grads() const { return flat_grads_; }
  const TensorView& flat_values() const { return flat_values_; }
  /// Stable ids of every module in the tree (a hash of its path: the same module has the
  /// same id in every layout), for ForwardContext::rng.
  const std::unordered_map<const void*, uint64_t>& module_ids() const { return module_ids_; }
  /// Every module with its path, in tree order (root first, path "").
  const std::vector<std::pair<std::string, IModule*>>& modules() const { return modules_; }

 private:
  void walk(IModule& module, const std::string& path);
  void allocate_flat(const BucketOptions& options);
  IHost& host_;
  Device device_;
  std::vector<Parameter> params_;
  std::vector<Bucket> buckets_;
  int64_t flat_size_ = 0;
  TensorView flat_grads_{}, flat_values_{};
  // claim_grad: the kParamGradOverwrite gradients by address (allocate_flat), and whether
  // each was claimed since zero_grads.
  std::unordered_map<const void*, size_t> overwrite_index_;
  std::vector<uint8_t> claimed_;
  void index_overwrites();
  // The claim slot of parameter `p`'s gradient, or null when it has none (no flag).
  uint8_t* claim_of(const Parameter& p);
  // The element ranges [begin, end) of the flat gradients outside every kParamGradOverwrite
  // parameter (padding included): what zero_grads(true) zeroes.
  std::vector<std::pair<int64_t, int64_t>> kept_complement_;
  bool kept_ = false;  // the last zero_grads kept the overwrite gradients
  int64_t overwrite_elements_ = 0, kept_elements_ = 0;
  std::vector<std::pair<std::string, IModule*>> modules_;
  std::unordered_map<const void*, uint64_t> module_ids_;
  std::vector<void*> blocks_;
};

/// Fills `count` floats with normal(0, std) draws that depend only on (seed, stream).
void fill_normal(float* out, int64_t count, float std, uint64_t seed, uint64_t stream);
/// Fills `count` floats with uniform(-bound, bound) draws that depend only on (seed, stream).
void fill_uniform(float* out, int64_t count, float bound, uint64_t seed, uint64_t stream);
/// Writes f32 `values` (host memory) into `view` (f32, bf16 or f16, on any device),
/// converting; a device view is written through `host` (IHost::copy).
void store_floats(IHost& host, const float* values, const TensorView& view);
/// Reads `view` (f32, bf16 or f16, on any device) into f32 `values` (host memory).
void load_floats(IHost& host, const TensorView& view, float* values);
/// Keeps the first `keep` floats of every row of `columns` in `rows` (row-major, in place):
/// (N, columns) -> (N, keep). Nothing happens when keep >= columns. A padded vocabulary's
/// logits lose their padding columns with it.
void keep_columns(std::vector<float>& rows, int64_t columns, int64_t keep);
/// The same for a view in host memory (throws for a device view: use the IHost overloads).
void store_floats(const float* values, const TensorView& view);
void load_floats(const TensorView& view, float* values);
/// Copies `view` (any device) into host memory `out` of nbytes(view) bytes.
void copy_to_host(IHost& host, const TensorView& view, void* out);
/// Copies host memory `in` of nbytes(view) bytes into `view` (any device).
void copy_from_host(IHost& host, const void* in, const TensorView& view);
/// FNV-1a hash of a string (parameter names to random streams).
uint64_t hash_name(const std::string& text);

}  // namespace loom::core
