// The optimizer's side of checkpoints: master weights and optimizer states by name, gathered
// from the distributed optimizer's shards, and read back into them.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "core/checkpoint/param_slices.h"
#include "core/optim/distributed_optimizer.h"

namespace loom::core {
namespace {

std::string master_name(const Parameter& p) { return "optim.master." + p.name; }

std::string state_name(const IOptimizer& optimizer, int32_t s, const Parameter& p) {
  return fmt::format("optim.{}.{}", optimizer.state_name(s), p.name);
}

}  // namespace

void DistributedOptimizer::prepare_checkpoint() {
  // What each parameter's optimizer data is: [master if not f32, states...], arrays of its
  // local elements, each in its own dtype (the master f32, a state its state_dtype). With the
  // distributed optimizer each rank holds only segments: they are gathered first (every
  // rank's segments widened to f32 into flat buffers, summed over each bucket's data group:
  // exact, as every element is held by one rank and zero elsewhere), then narrowed back to
  // the kind's dtype (exact too: the values came from it).
  const int32_t kinds = optimizer_.state_count() + 1;  // kind 0: master
  const bool need_master = setup_.params_dtype != DType::kF32;
  std::vector<Parameter>& all = params_.all();
  checkpoint_data_.assign(all.size() * static_cast<size_t>(kinds), nullptr);
  checkpoint_scratch_.clear();
  checkpoint_on_host_ = grad_sync_.sharded();
  auto index_of = [&](const Parameter* p) { return static_cast<size_t>(p - all.data()); };
  if (!grad_sync_.sharded()) {
    for (const auto& st : states_) {
      size_t i = index_of(st->param);
      checkpoint_data_[i * kinds] = st->master.data;
      for (int32_t s = 0; s < kinds - 1; ++s)
        checkpoint_data_[i * kinds + 1 + static_cast<size_t>(s)] =
            st->states[static_cast<size_t>(s)].data;
    }
    return;
  }
  const int64_t flat_size = params_.flat_size();
  std::vector<float> flat(static_cast<size_t>(flat_size));
  for (int32_t k = need_master ? 0 : 1; k < kinds; ++k) {
    std::fill(flat.begin(), flat.end(), 0.f);
    for (const auto& st : states_)
      load_floats(host_, k == 0 ? st->master : st->states[static_cast<size_t>(k - 1)],
                  flat.data() + st->segment.flat);
    // Each bucket's range over its own group (the ranges of one group are adjacent).
    const std::vector<Bucket>& buckets = params_.buckets();
    for (size_t b = 0; b < buckets.size();) {
      size_t end = b;
      while (end < buckets.size() && &grad_sync_.comm_of(end) == &grad_sync_.comm_of(b)) ++end;
      int64_t begin = buckets[b].offset, size = buckets[end - 1].offset + buckets[end - 1].size;
      TensorView v = make_view(flat.data() + begin, DType::kF32, {size - begin}, kCpu);
      throw_if_error(grad_sync_.comm_of(b).all_reduce(&v, ReduceOp::kSum, nullptr),
                     "checkpoint: gathering the distributed optimizer's states");
      b = end;
    }
    const DType dtype = kind_dtype(k);
    const size_t width = dtype_size(dtype);
    checkpoint_scratch_.emplace_back((static_cast<size_t>(flat_size) * width + 7) / 8);
    char* bytes = reinterpret_cast<char*>(checkpoint_scratch_.back().data());
    store_floats(flat.data(), make_view(bytes, dtype, {flat_size}, kCpu));
    for (Parameter& p : all)
      checkpoint_data_[index_of(&p) * kinds + static_cast<size_t>(k)] =
          bytes + static_cast<size_t>(p.offset) * width;
  }
}

DType DistributedOptimizer::kind_dtype(int32_t kind) const {
  return kind == 0 ? DType::kF32 : state_dtypes_[static_cast<size_t>(kind - 1)];
}

void DistributedOptimizer::append_checkpoint_tensors(const Parameter& p,
                                                     std::vector<SaveTensor>& out) const {
  const size_t kinds = static_cast<size_t>(optimizer_.state_count()) + 1;
  const size_t i = static_cast<size_t>(&p - params_.all().data());
  if (setup_.params_dtype != DType::kF32)
    append_save_tensor(out, master_name(p), p, setup_.split_ranks(), checkpoint_data_[i * kinds],
                       DType::kF32);
  for (int32_t s = 0; s < optimizer_.state_count(); ++s)
    append_save_tensor(out, state_name(optimizer_, s, p), p, setup_.split_ranks(),
                       checkpoint_data_[i * kinds + 1 + static_cast<size_t>(s)], kind_dtype(s + 1));
}

void DistributedOptimizer::restore(CheckpointReader& reader, const std::string& saved_optimizer,
                                   const std::string& this_optimizer) {
  // With the distributed optimizer each rank reads its parameters' whole local boxes into
  // flat f32 buffers and keeps its segments (converted into each state's dtype); otherwise
  // straight into the states, in their dtypes. The reader converts a tensor saved in another
  // float dtype (a run with f32 moments resumed with bf16 ones, or back).
  const bool sharded = grad_sync_.sharded();
  const int32_t state_count = optimizer_.state_count();
  const bool need_master = setup_.params_dtype != DType::kF32;
  const std::string where = reader.dir().string();
  std::vector<std::vector<float>> flats;
  if (sharded)
    for (int32_t k = 0; k < state_count + 1; ++k)
      flats.emplace_back(k == 0 && !need_master ? 0 : static_cast<size_t>(params_.flat_size()),
                         0.f);
  std::vector<std::string> names;
  std::vector<CheckpointTensor> requests;
  names.reserve(params_.all().size() * 3);
  auto request = [&](std::string name, const Parameter& p, void* into, DType dtype) {
    if (!holds_values(p, setup_.split_ranks())) return;  // padding whole: stays 0
    if (!reader.has(name))
      throw Error(Code::kNotFound,
                  fmt::format("checkpoint {}: no tensor '{}' (saved with optimizer '{}', this run "
                              "uses '{}'); to keep only the weights set checkpoint.init_from",
                              where, name, saved_optimizer, this_optimizer));
    names.push_back(std::move(name));
    // The flat buffers of the distributed optimizer are host memory.
    requests.push_back(request_of(names.back(), p, setup_.split_ranks(), into, dtype,
                                  sharded ? kCpu : setup_.device));
  };
  if (sharded) {
    for (Parameter& p : params_.all()) {
      if (need_master) request(master_name(p), p, flats[0].data() + p.offset, DType::kF32);
      for (int32_t s = 0; s < state_count; ++s)
        request(state_name(optimizer_, s, p), p,
                flats[static_cast<size_t>(s) + 1].data() + p.offset, DType::kF32);
    }
  } else {
    for (auto& st : states_) {
      const Parameter& p = *st->param;
      if (need_master) request(master_name(p), p, st->master.data, DType::kF32);
      for (int32_t s = 0; s < state_count; ++s)
        request(state_name(optimizer_, s, p), p, st->states[static_cast<size_t>(s)].data,
                kind_dtype(s + 1));
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) requests[i].name = names[i].c_str();
  reader.read(requests);
  if (!sharded) return;
  for (auto& st : states_) {
    if (need_master) store_floats(host_, flats[0].data() + st->segment.flat, st->master);
    for (int32_t s = 0; s < state_count; ++s)  // rounded to nearest even into a bf16 state
      store_floats(host_, flats[static_cast<size_t>(s) + 1].data() + st->segment.flat,
                   st->states[static_cast<size_t>(s)]);
  }
}

void DistributedOptimizer::refresh_masters() {
  for (auto& st : states_) {  // the master weights of this rank's segments
    if (st->param->info.dtype == DType::kF32) continue;
    std::vector<float> staging(static_cast<size_t>(st->segment.length));
    load_floats(host_, param_shard(*st), staging.data());
    copy_from_host(host_, staging.data(), st->master);
  }
}

}  // namespace loom::core
