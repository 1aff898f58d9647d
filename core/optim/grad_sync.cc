#include "core/optim/grad_sync.h"

#include <algorithm>

#include "loom/cpp/error.h"
#include "loom/cpp/tensor.h"
#include "loom/ops.h"

namespace loom::core {

GradSync::GradSync(ParameterSet& params, const GroupOf& groups, bool sharded, IHost& host)
    : params_(params), host_(host), device_(params.flat_grads().device) {
  for (const Bucket& b : params_.buckets()) {
    ICommunicator& comm = groups(b.group);
    if (comm.size() > 1 && !has_async(comm))
      throw Error(Code::kInternal,
                  "GradSync: the data-parallel communicator has no asynchronous collectives (the "
                  "core's TimedCommunicator always has them)");
    comms_.push_back(&comm);
    sharded_ = sharded_ || (sharded && comm.size() > 1);
    // An expert's gradient sums the tokens of every rank that routed to it; averaging over
    // its edp replicas, then times edp / |data group|, gives the dense parameters' average
    // over the data group (Megatron-Core pre-scales expert gradients by EDP / (DP x CP)).
    double factor = 1.0;
    if (b.group == ParallelRole::kExpertData)
      factor = static_cast<double>(comm.size()) /
               static_cast<double>(groups(ParallelRole::kData).size());
    factors_.push_back(factor);
    if (factor != 1.0 && !scale_) scale_ = Kernel(host, ops::kScale, device_, DType::kF32);
  }
  const std::vector<Parameter>& all = params_.all();
  started_.assign(params_.buckets().size(), false);
  if (!sharded_) {
    for (size_t i = 0; i < all.size(); ++i)
      segments_.push_back({i, 0, all[i].numel(), all[i].offset, -1});
    return;
  }
  if (params_.flat_values().data == nullptr)
    throw Error(Code::kInvalidArgument,
                "spec /parallel/distributed_optimizer: the model's parameters do not share one "
                "dtype, which the sharded parameter all-gather needs; turn it off");
  int64_t total = 0, largest = 0;
  for (size_t bi = 0; bi < params_.buckets().size(); ++bi) {
    const Bucket& b = params_.buckets()[bi];
    int64_t n = comms_[bi]->size(), r = comms_[bi]->rank();
    int64_t chunk = b.size / n;  // buckets are padded to a multiple of their group's size
    int64_t lo = b.offset + r * chunk, hi = lo + chunk;
    shard_base_.push_back(total);
    // Segments in flat order, so that the shard is filled front to back.
    std::vector<size_t> order(b.params.begin(), b.params.end());
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t c) { return all[a].offset < all[c].offset; });
    for (size_t i : order) {
      int64_t begin = std::max(lo, all[i].offset);
      int64_t end = std::min(hi, all[i].offset + all[i].numel());
      if (begin < end)
        segments_.push_back({i, begin - all[i].offset, end - begin, begin, total + (begin - lo)});
    }
    total += chunk;
    largest = std::max(largest, chunk);
  }
  throw_if_error(host_.allocate(device_, static_cast<uint64_t>(total) * 4, 64, &grad_shard_mem_));
  grad_shard_ = make_view(grad_shard_mem_, DType::kF32, {total}, device_);
  const uint64_t gather_bytes =
      static_cast<uint64_t>(largest) * dtype_size(params_.flat_values().dtype);
  throw_if_error(host_.allocate(device_, gather_bytes, 64, &gather_mem_));
  shard_buffer_bytes_ = static_cast<uint64_t>(total) * 4 + gather_bytes;
}

GradSync::~GradSync() {
  pending_.clear();  // destroying a handle waits for its operation, which uses the buffers
  host_.deallocate(device_, grad_shard_mem_);
  host_.deallocate(device_, gather_mem_);
}

TensorView GradSync::grad_of(const Segment& s) const {
  if (sharded_)
    return make_view(static_cast<float*>(grad_shard_.data) + s.shard, DType::kF32, {s.length},
                     device_);
  return make_view(static_cast<float*>(params_.flat_grads().data) + s.flat, DType::kF32, {s.length},
                   device_);
}

void GradSync::start(size_t b) {
  ICommunicator& comm = *comms_[b];
  if (started_[b]) return;
  started_[b] = true;
  const Bucket& bucket = params_.buckets()[b];
  if (comm.size() == 1) {
    // Nothing to reduce; with other buckets sharded (the experts' data group of one rank
    // beside a larger dense one) its shard is the whole bucket, read from the shard buffer.
    if (sharded_)
      throw_if_error(host_.copy(device_, static_cast<float*>(grad_shard_.data) + shard_base_[b],
                                device_,
                                static_cast<float*>(params_.flat_grads().data) + bucket.offset,
                                static_cast<uint64_t>(bucket.size) * 4),
                     "copying a gradient bucket of a one-rank group into its shard");
    return;
  }
  TensorView in = make_view(static_cast<float*>(params_.flat_grads().data) + bucket.offset,
                            DType::kF32, {bucket.size}, device_);
  TensorView out{};
  if (sharded_)
    out = make_view(static_cast<float*>(grad_shard_.data) + shard_base_[b], DType::kF32,
                    {bucket.size / comm.size()}, device_);
  const char* what = sharded_ ? "distributed-optimizer gradient reduce-scatter"
                              : "data-parallel gradient all-reduce";
  ICommWork* work = nullptr;
  throw_if_error(sharded_ ? comm.reduce_scatter_async(&in, &out, ReduceOp::kAvg, nullptr, &work)
                          : comm.all_reduce_async(&in, ReduceOp::kAvg, nullptr, &work),
                 what);
  pending_.push_back({CommWorkPtr(work), what});
}

void GradSync::finish() {
  for (size_t b = 0; b < started_.size(); ++b) start(b);
  std::fill(started_.begin(), started_.end(), false);
  // Every reduction is waited for before the first failure is thrown: the buffers are not
  // handed back while an operation may still use them.
  std::vector<Pending> pending = std::move(pending_);
  pending_.clear();
  Status first = ok_status();
  const char* first_what = "";
  for (Pending& p : pending) {
    Status status = p.work->wait();
    if (first.code == Code::kOk) {
      first = status;
      first_what = p.what;
    } else {
      status_release(&status);
    }
  }
  throw_if_error(first, first_what);
  for (size_t b = 0; b < factors_.size(); ++b) {
    if (factors_[b] == 1.0) continue;
    const Bucket& bucket = params_.buckets()[b];
    TensorView g =
        sharded_ ? make_view(static_cast<float*>(grad_shard_.data) + shard_base_[b], DType::kF32,
                             {bucket.size / comms_[b]->size()}, device_)
                 : make_view(static_cast<float*>(params_.flat_grads().data) + bucket.offset,
                             DType::kF32, {bucket.size}, device_);
    scale_({g}, {g}, ops::ScaleAttrs{static_cast<float>(factors_[b])});
  }
}

void GradSync::gather_values() {
  if (!sharded_) return;
  const TensorView& values = params_.flat_values();
  size_t e = dtype_size(values.dtype);
  for (size_t bi = 0; bi < params_.buckets().size(); ++bi) {
    const Bucket& b = params_.buckets()[bi];
    ICommunicator& comm = *comms_[bi];
    int64_t n = comm.size(), r = comm.rank();
    int64_t chunk = b.size / n;
    char* base = static_cast<char*>(values.data) + b.offset * static_cast<int64_t>(e);
    throw_if_error(host_.copy(values.device, gather_mem_, values.device,
                              base + r * chunk * static_cast<int64_t>(e),
                              static_cast<uint64_t>(chunk) * e));
    TensorView in = make_view(gather_mem_, values.dtype, {chunk}, values.device);
    TensorView out = make_view(base, values.dtype, {b.size}, values.device);
    throw_if_error(comm.all_gather(&in, &out, nullptr),
                   "distributed-optimizer parameter all-gather");
  }
}

}  // namespace loom::core
