#include "core/optim/distributed_optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/cpp/error.h"
#include "loom/cpp/half.h"
#include "loom/cpp/tensor.h"

namespace loom::core {

DistributedOptimizer::DistributedOptimizer(IHost& host, ParameterSet& params, IOptimizer& optimizer,
                                           const OptimizerSetup& setup, const GroupOf& groups)
    : host_(host),
      params_(params),
      optimizer_(optimizer),
      setup_(setup),
      tensor_(groups(ParallelRole::kTensor)),
      grad_norm_group_(groups(ParallelRole::kGradNorm)),
      world_(groups(ParallelRole::kWorld)),
      embedding_(groups(ParallelRole::kEmbedding)),
      grad_sync_(params, groups, setup.sharded, host),
      readiness_(params, embedding_.size() > 1) {
  // The destructor does not run when the constructor throws: whatever was allocated is
  // freed here then.
  state_dtypes_ = state_dtypes(optimizer_);
  try {
    const Device device = setup_.device;
    for (const Segment& seg : grad_sync_.segments()) {
      Parameter& p = params_.all()[seg.param];
      states_.push_back(std::make_unique<ParamState>());
      ParamState* st = states_.back().get();
      st->param = &p;
      st->segment = seg;
      st->decay = (p.info.flags & kParamNoWeightDecay) == 0;
      st->expert = (p.info.flags & kParamExpert) != 0;
      local_experts_ = local_experts_ || st->expert;
      if (st->expert)  // the expert grid: split over etp, replicated (or sharded) over edp
        st->in_norm = (p.info.tp_split_dim >= 0 || setup_.expert_tp_rank == 0) &&
                      (setup_.sharded || setup_.expert_dp_rank == 0);
      else
        st->in_norm = (p.info.tp_split_dim >= 0 || setup_.tp_rank == 0) &&
                      !(setup_.tied_replica && (p.info.flags & kParamTiedEmbedding) != 0);
      int64_t n = seg.length;
      auto alloc = [&](DType dtype) {  // zeroed
        void* mem = nullptr;
        const uint64_t bytes = static_cast<uint64_t>(n) * dtype_size(dtype);
        throw_if_error(host_.allocate(device, bytes, 64, &mem));
        st->owned.push_back(mem);
        if (mem != nullptr) throw_if_error(host_.fill_zero(device, mem, bytes));
        return make_view(mem, dtype, {n}, device);
      };
      if (p.info.dtype == DType::kF32) {
        st->master = param_shard(*st);
      } else {
        st->master = alloc(DType::kF32);
        std::vector<float> staging(static_cast<size_t>(n));
        load_floats(host_, param_shard(*st), staging.data());
        copy_from_host(host_, staging.data(), st->master);
      }
      for (DType dtype : state_dtypes_) st->states.push_back(alloc(dtype));
    }
    sumsq_ = Kernel(host_, ops::kSumSq, device, DType::kF32);
    sumsq_multi_ = Kernel::optional(host_, ops::kSumSqMulti, device, DType::kF32);
    if (device.type != DeviceType::kCpu) throw_if_error(host_.allocate(device, 8, 64, &norm_acc_));
    if (setup_.params_dtype != DType::kF32) cast_ = Kernel(host_, ops::kCast, device, DType::kF32);
  } catch (...) {
    release();
    throw;
  }
}

DistributedOptimizer::~DistributedOptimizer() { release(); }

void DistributedOptimizer::release() {
  for (auto& st : states_)
    for (void* p : st->owned) host_.deallocate(setup_.device, p);
  states_.clear();
  host_.deallocate(setup_.device, norm_acc_);
  norm_acc_ = nullptr;
}

TensorView DistributedOptimizer::param_shard(const ParamState& st) const {
  const Parameter& p = *st.param;
  char* value = static_cast<char*>(p.value.data) +
                st.segment.begin * static_cast<int64_t>(dtype_size(p.info.dtype));
  return make_view(value, p.info.dtype, {st.segment.length}, setup_.device);
}

uint64_t DistributedOptimizer::master_bytes() const {
  if (setup_.params_dtype == DType::kF32) return 0;
  uint64_t n = 0;
  for (const auto& st : states_) n += static_cast<uint64_t>(st->segment.length) * sizeof(float);
  return n;
}

uint64_t DistributedOptimizer::state_bytes() const {
  uint64_t n = 0;
  for (const auto& st : states_)
    for (const TensorView& s : st->states) n += nbytes(s);
  return n;
}

std::vector<DType> state_dtypes(const IOptimizer& optimizer) {
  std::vector<DType> dtypes;
  const bool asked = has_state_dtype(optimizer);
  for (int32_t s = 0; s < optimizer.state_count(); ++s) {
    const DType dtype = asked ? optimizer.state_dtype(s) : DType::kF32;
    if (dtype != DType::kF32 && dtype != DType::kBF16) {
      const char* name = optimizer.state_name(s);
      fail(Code::kInvalidArgument,
           fmt::format("the optimizer's state {} ('{}') has dtype {}: loom keeps optimizer "
                       "states in f32 or bf16 (IOptimizer::state_dtype, "
                       "sdk/include/loom/kinds/optimizer.h); fix the optimizer plugin",
                       s, name != nullptr ? name : "?", dtype_name(dtype)));
    }
    dtypes.push_back(dtype);
  }
  return dtypes;
}

void DistributedOptimizer::begin_step(bool keep_overwrite) {
  params_.zero_grads(keep_overwrite);
  readiness_.reset();
}

void DistributedOptimizer::grads_ready(const void* owner) {
  for (size_t b : readiness_.mark(owner)) {
    // A kept overwrite gradient that got no write this step (begin_step(true)) holds an
    // earlier step's values: zero it before the reduction reads the bucket.
    params_.zero_unclaimed(params_.buckets()[b]);
    reduce_bucket(b);
  }
}

void DistributedOptimizer::reduce_bucket(size_t b) {
  reduce_sequence_parallel_grads(b);
  reduce_tied_grads(b);
  grad_sync_.start(b);
}

void DistributedOptimizer::reduce_tied_grads(size_t b) {
  // Each stage of the embedding group holds one tied table: one all-reduce per step on
  // each, in the same order on both. Its bucket is held back until finish_reduction
  // (readiness_), after every pipeline pass, so neither stage waits in the middle of one.
  if (embedding_.size() == 1) return;
  for (size_t i : params_.buckets()[b].params) {
    Parameter& p = params_.all()[i];
    if ((p.info.flags & kParamTiedEmbedding) == 0 || (p.info.flags & kParamFrozen) != 0) continue;
    TensorView g = make_view(p.grad.data, DType::kF32, {p.numel()}, setup_.device);
    throw_if_error(embedding_.all_reduce(&g, ReduceOp::kSum, nullptr),
                   fmt::format("all-reduce of the tied embedding gradient '{}' over the "
                               "embedding group (first and last pipeline stage)",
                               p.name));
  }
}

void DistributedOptimizer::reduce_sequence_parallel_grads(size_t b) {
  if (tensor_.size() == 1) return;
  for (size_t i : params_.buckets()[b].params) {
    Parameter& p = params_.all()[i];
    if ((p.info.flags & kParamSequenceParallel) == 0) continue;
    TensorView g = make_view(p.grad.data, DType::kF32, {p.numel()}, setup_.device);
    throw_if_error(tensor_.all_reduce(&g, ReduceOp::kSum, nullptr),
                   fmt::format("sequence-parallel gradient all-reduce of {}", p.name));
  }
}

void DistributedOptimizer::finish_reduction() {
  // The buckets not handed over during backward, in order (BucketReadiness keeps the order
  // the same on every rank).
  for (size_t b : readiness_.release_rest()) {
    reduce_sequence_parallel_grads(b);
    reduce_tied_grads(b);
  }
  grad_sync_.finish();
}

double DistributedOptimizer::grad_norm(double loss_scale) {
  // sumsq accumulates in f64 where the gradients live; one read back per step.
  // The dense parameters' squares add up over the grad-norm group, the experts' (each piece
  // counted on one rank, in_norm) over every rank.
  double total = 0;
  for (bool experts : {false, true}) {
    if (experts && !setup_.experts && !local_experts_) break;
    double sumsq = 0;
    TensorView acc =
        make_view(norm_acc_ != nullptr ? norm_acc_ : &sumsq, DType::kF64, {1}, setup_.device);
    throw_if_error(host_.fill_zero(setup_.device, acc.data, 8));
    add_sumsq(experts, acc);
    if (acc.data != &sumsq) copy_to_host(host_, acc, &sumsq);
    ICommunicator& group = experts ? world_ : grad_norm_group_;
    if (group.size() > 1) {
      TensorView v = make_view(&sumsq, DType::kF64, {1});
      throw_if_error(group.all_reduce(&v, ReduceOp::kSum, nullptr),
                     experts ? "all-reduce of the experts' squared gradient norm over every rank"
                             : "all-reduce of the squared gradient norm over the grad-norm group");
    }
    total += sumsq;
  }
  return std::sqrt(total) / loss_scale;
}

void DistributedOptimizer::add_sumsq(bool experts, const TensorView& acc) {
  std::vector<TensorView> grads;
  for (auto& st : states_) {
    if ((st->param->info.flags & kParamFrozen) || !st->in_norm || st->expert != experts) continue;
    grads.push_back(grad_sync_.grad_of(st->segment));
  }
  // One multi-tensor call where a kernel serves it (the CPU's equals these sumsq calls bit
  // for bit; a GPU's launches once per few hundred tensors instead of once per tensor).
  if (sumsq_multi_ && !grads.empty()) {
    TensorView outs[1] = {acc};
    sumsq_multi_.run(std::span<const TensorView>(grads), std::span<TensorView>(outs),
                     ops::SumSqMultiAttrs{static_cast<int32_t>(grads.size())});
  } else {
    for (const TensorView& g : grads) sumsq_({g}, {acc});
  }
}

void DistributedOptimizer::grad_sumsq(const TensorView& acc) {
  // grad_norm sums the dense and the experts' squares over two groups of ranks and adds
  // the two totals on the host; a device-only sum is for one process without experts.
  if (grad_norm_group_.size() > 1 || world_.size() > 1 || setup_.experts || local_experts_)
    fail(Code::kFailedPrecondition,
         "DistributedOptimizer::grad_sumsq: the gradient norm of several ranks, or of "
         "experts' parameters, is summed on the host; a device-only norm is for one process "
         "without experts");
  throw_if_error(host_.fill_zero(setup_.device, acc.data, 8));
  add_sumsq(false, acc);
}

void DistributedOptimizer::update(const OptimizerStep& hp, bool verify_cast) {
  if (has_update_many(optimizer_))
    update_all(hp, verify_cast);
  else
    update_each(hp);
  grad_sync_.gather_values();
}

void DistributedOptimizer::update_all(const OptimizerStep& hp, bool verify_cast) {
  // Every shard in one call, so a GPU optimizer can update them in a few multi-tensor
  // launches; a non-f32 parameter's view receives its new master there (an f32 one is its
  // own master).
  std::vector<OptimizerShard> shards;
  shards.reserve(states_.size());
  for (auto& st : states_) {
    const Parameter& p = *st->param;
    if (p.info.flags & kParamFrozen) continue;
    OptimizerShard s{};
    s.struct_size = sizeof(OptimizerShard);
    s.decay = st->decay ? 1 : 0;
    s.master = st->master;
    s.grad = grad_sync_.grad_of(st->segment);
    s.states = st->states.data();
    s.param = p.info.dtype != DType::kF32 ? param_shard(*st) : empty_view();
    shards.push_back(s);
  }
  throw_if_error(
      optimizer_.update_many(&hp, static_cast<int32_t>(shards.size()), shards.data(), nullptr),
      "optimizer update");
  if (!cast_checked_ && verify_cast) {
    cast_checked_ = true;
    for (auto& st : states_)
      if (!(st->param->info.flags & kParamFrozen) && st->param->info.dtype != DType::kF32 &&
          st->segment.length > 0) {
        check_cast(*st);
        break;
      }
  }
}

void DistributedOptimizer::check_cast(const ParamState& st) {
  const Parameter& p = *st.param;
  const DType dt = p.info.dtype;
  if (dt != DType::kBF16 && dt != DType::kF16) return;
  // A prefix of the shard is enough: an optimizer that forgets the cast forgets it all.
  const int64_t n = std::min<int64_t>(st.segment.length, 4096);
  std::vector<float> master(static_cast<size_t>(n));
  std::vector<uint16_t> param(static_cast<size_t>(n));
  TensorView shard = param_shard(st);
  throw_if_error(host_.copy(kCpu, master.data(), setup_.device, st.master.data,
                            static_cast<uint64_t>(n) * sizeof(float)),
                 "optimizer update: reading the master weights back");
  throw_if_error(host_.copy(kCpu, param.data(), setup_.device, shard.data,
                            static_cast<uint64_t>(n) * sizeof(uint16_t)),
                 "optimizer update: reading the parameter back");
  for (int64_t i = 0; i < n; ++i) {
    const float m = master[static_cast<size_t>(i)];
    if (std::isnan(m)) continue;
    const uint16_t got = param[static_cast<size_t>(i)];
    const float want = dt == DType::kBF16 ? bf16_to_f32(f32_to_bf16(m)) : f16_to_f32(f32_to_f16(m));
    const float have = dt == DType::kBF16 ? bf16_to_f32(got) : f16_to_f32(got);
    if (have != want)
      fail(Code::kInvalidArgument,
           fmt::format("optimizer: after update_many, parameter {} element {} is {} but its "
                       "master weight {} rounds to {} in {}: the optimizer must write each "
                       "shard's master, cast to the parameter's dtype, into OptimizerShard::param "
                       "when that view is present (sdk/include/loom/kinds/optimizer.h)",
                       p.name, st.segment.begin + i, have, m, want, dtype_name(dt)));
  }
}

void DistributedOptimizer::update_each(const OptimizerStep& hp) {
  // An optimizer built against optimizer 1.0: one update per shard, then the cast.
  for (auto& st : states_) {
    Parameter& p = *st->param;
    if (p.info.flags & kParamFrozen) continue;
    TensorView grad = grad_sync_.grad_of(st->segment);
    OptimizerStep h = hp;
    if (!st->decay) h.weight_decay = 0;
    throw_if_error(optimizer_.update(&h, st->decay, &st->master, &grad, st->states.data(), nullptr),
                   fmt::format("optimizer update of {}", p.name));
    if (p.info.dtype != DType::kF32) cast_({st->master}, {param_shard(*st)});
  }
}

}  // namespace loom::core
