// testfakecuda: a fake CUDA device (see BUILD). One device, "device 0", whose memory is
// host memory seen through tagged pointers, and every CPU kernel registered again for
// DeviceType::kCuda.
//
// Tagging: a device pointer is the host address with bit 62 set. x86-64 user addresses are
// below 2^47, so a tagged pointer is not canonical and any load or store through it faults;
// offsets into a block keep the tag, so views into device memory work as on a GPU.
#include <loom/ops/moe.h>
#include <loom/ops/optim.h>
#include <loom/sdk.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/runtime/caching_allocator.h"

namespace {

using loom::Code;
using loom::DeviceType;
using loom::KernelDesc;
using loom::OpCall;
using loom::Status;
using loom::TensorView;

constexpr uintptr_t kTag = uintptr_t{1} << 62;

void* tag(void* p) {
  return p == nullptr ? nullptr : reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) | kTag);
}
bool tagged(const void* p) { return (reinterpret_cast<uintptr_t>(p) & kTag) != 0; }
void* untag(const void* p) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~kTag);
}

// ---- The runtime ------------------------------------------------------------------------

// The "driver": host memory, handed out full of garbage as cudaMalloc's is.
class HostDriver final : public loom::kernels::cuda::RawMemory {
 public:
  void* alloc(uint64_t bytes) override {
    void* p = std::aligned_alloc(loom::kernels::cuda::CachingAllocator::kMinAlignment, bytes);
    if (p != nullptr) std::memset(p, 0xA5, bytes);
    return p;
  }
  void free(void* pointer) noexcept override { std::free(pointer); }
};

// A captured graph: the work issued while capturing, in order, and the allocator's private
// pool that holds the memory it uses.
struct FakeGraph {
  std::vector<std::function<Status()>> work;
  uint64_t pool = 0;
};

// The device's memory comes from loom's CUDA caching allocator over that driver, so a whole
// training run exercises its splitting, coalescing and figures.
//
// Graphs behave as CUDA stream capture does (loom/device.h): while capturing, kernel calls,
// device-to-device copies and zero fills are recorded and not run, allocations come from a
// private pool of the allocator, and host copies and synchronize are refused; a replay runs
// the records in order. A training step whose captured work depends on anything but its
// device memory (a value the host changes between replays, a host read) gives different
// numbers on replay than when run directly, which is what the tests look for.
class FakeRuntime final : public loom::IDeviceRuntime {
 public:
  loom::InterfaceInfo interface_info() const noexcept override {
    return loom::kinds::kDeviceRuntime;
  }
  DeviceType device_type() const noexcept override { return DeviceType::kCuda; }
  int32_t device_count() const noexcept override { return 1; }
  loom::StringView unavailable_reason() const noexcept override { return {nullptr, 0}; }

  Status properties(int32_t index, loom::DeviceProperties* out) noexcept override {
    return loom::guard([&] {
      check_index(index);
      *out = loom::DeviceProperties{};
      std::strncpy(out->name, "fake CUDA device (host memory)", sizeof(out->name) - 1);
      out->major = 9;
      out->multiprocessors = 1;
      out->total_memory = kTotal;
      out->peak_bf16_flops = 1e12;
    });
  }

  Status allocate(int32_t index, uint64_t bytes, void** out) noexcept override {
    return loom::guard([&] {
      check_index(index);
      *out = nullptr;
      if (bytes == 0) return;
      void* p = cache_.allocate(bytes);
      // A reused block holds the last user's values, as on a GPU: garbage, never zeros.
      std::memset(p, 0xA5, bytes);
      *out = tag(p);
    });
  }

  void deallocate(int32_t index, void* pointer) noexcept override {
    if (pointer == nullptr) return;
    try {
      if (!tagged(pointer)) throw loom::Error(Code::kInvalidArgument, "not a device pointer");
      cache_.deallocate(untag(pointer));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fake device: bad deallocate: %s\n", e.what());
      std::abort();  // a test double: fail loudly
    }
  }

  Status memory_stats(int32_t index, loom::DeviceMemoryStats* out) noexcept override {
    return loom::guard([&] {
      check_index(index);
      *out = cache_.stats();
    });
  }
  void reset_peak(int32_t) noexcept override { cache_.reset_peak(); }
  Status empty_cache(int32_t) noexcept override {
    return loom::guard([&] { cache_.empty_cache(); });
  }

  Status copy(int32_t index, void* dst, const void* src, uint64_t bytes,
              loom::CopyKind kind) noexcept override {
    return loom::guard([&] {
      check_index(index);
      bool dst_dev = kind != loom::CopyKind::kDeviceToHost;
      bool src_dev = kind != loom::CopyKind::kHostToDevice;
      check_side(dst, dst_dev, "destination");
      check_side(src, src_dev, "source");
      void* to = dst_dev ? untag(dst) : dst;
      const void* from = src_dev ? untag(src) : src;
      if (kind != loom::CopyKind::kDeviceToDevice) {
        refuse_while_capturing(kind == loom::CopyKind::kHostToDevice ? "a host-to-device copy"
                                                                     : "a device-to-host copy");
      } else if (record([=] {
                   std::memmove(to, from, bytes);
                   return loom::ok_status();
                 })) {
        return;
      }
      std::memmove(to, from, bytes);
    });
  }
  Status fill_zero(int32_t index, void* pointer, uint64_t bytes) noexcept override {
    return loom::guard([&] {
      check_index(index);
      check_side(pointer, true, "fill_zero target");
      void* to = untag(pointer);
      if (record([=] {
            std::memset(to, 0, bytes);
            return loom::ok_status();
          }))
        return;
      std::memset(to, 0, bytes);
    });
  }
  void* compute_stream(int32_t) noexcept override { return nullptr; }
  Status synchronize(int32_t index) noexcept override {
    return loom::guard([&] {
      check_index(index);
      refuse_while_capturing("synchronize");
    });
  }

  Status capture_begin(int32_t index) noexcept override {
    return loom::guard([&] {
      check_index(index);
      std::lock_guard<std::mutex> lock(mutex_);
      if (capturing_.load())
        throw loom::Error(Code::kFailedPrecondition,
                          "fake device: capture_begin: a graph capture is already under way");
      graph_ = std::make_unique<FakeGraph>();
      graph_->pool = next_pool_++;
      cache_.begin_private_pool(graph_->pool);
      capture_error_.clear();
      capturing_.store(true);
      ++captures;
    });
  }
  Status capture_end(int32_t index, void** graph) noexcept override {
    return loom::guard([&] {
      check_index(index);
      if (graph == nullptr) throw loom::Error(Code::kInvalidArgument, "capture_end: null graph");
      *graph = nullptr;
      std::lock_guard<std::mutex> lock(mutex_);
      if (!capturing_.load())
        throw loom::Error(Code::kFailedPrecondition,
                          "fake device: capture_end: no graph capture is under way");
      capturing_.store(false);
      cache_.end_private_pool();
      std::unique_ptr<FakeGraph> g = std::move(graph_);
      if (!capture_error_.empty()) {
        cache_.release_private_pool(g->pool);
        throw loom::Error(Code::kFailedPrecondition, capture_error_);
      }
      *graph = g.release();
    });
  }
  Status graph_replay(int32_t index, void* graph) noexcept override {
    return loom::guard([&] {
      check_index(index);
      if (graph == nullptr) throw loom::Error(Code::kInvalidArgument, "graph_replay: null graph");
      refuse_while_capturing("graph_replay");
      ++replays;
      for (auto& work : static_cast<FakeGraph*>(graph)->work) loom::throw_if_error(work());
    });
  }
  void graph_destroy(int32_t, void* graph) noexcept override {
    if (graph == nullptr) return;
    std::unique_ptr<FakeGraph> g(static_cast<FakeGraph*>(graph));
    try {
      cache_.release_private_pool(g->pool);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fake device: graph_destroy: %s\n", e.what());
      std::abort();
    }
  }

  bool capturing() const { return capturing_.load(); }

  // Records `work` instead of running it when a capture is under way; false otherwise.
  bool record(std::function<Status()> work) {
    if (!capturing_.load()) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    graph_->work.push_back(std::move(work));
    return true;
  }

  // Graph figures for tests (testfakecuda's own; nothing in loom reads them).
  std::atomic<int64_t> captures{0}, replays{0};

 private:
  static constexpr uint64_t kTotal = uint64_t{8} << 30;

  static void check_index(int32_t index) {
    if (index != 0)
      throw loom::Error(Code::kOutOfRange,
                        "fake device: device " + std::to_string(index) + " does not exist");
  }
  static void check_side(const void* p, bool device, const char* what) {
    if (p != nullptr && tagged(p) != device)
      throw loom::Error(Code::kInvalidArgument,
                        std::string("fake device: copy ") + what + " is " +
                            (device ? "host memory where device memory was expected"
                                    : "device memory where host memory was expected"));
  }

  void refuse_while_capturing(const std::string& what) {
    if (!capturing_.load()) return;
    std::string message = "fake device: " + what +
                          " while a graph is being captured: captured work has not run, so the "
                          "host can neither read its results nor hand it host memory to read at "
                          "replay; move it before or after the capture, or turn graphs off";
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (capture_error_.empty()) capture_error_ = message;
    }
    throw loom::Error(Code::kFailedPrecondition, message);
  }

  HostDriver driver_;
  loom::kernels::cuda::CachingAllocator cache_{&driver_, "fake cuda:0", kTotal};
  std::mutex mutex_;
  std::atomic<bool> capturing_{false};
  std::unique_ptr<FakeGraph> graph_;
  std::string capture_error_;
  uint64_t next_pool_ = 1;
};

FakeRuntime g_runtime;

// ---- The kernels ------------------------------------------------------------------------

// The CPU kernels registered for kCuda, by trampoline index.
std::vector<KernelDesc> g_cpu;

// A CPU call from a device call: each view's pointer untagged and its device the CPU. A
// view that is present but not device memory is refused, as a GPU would fault on it. As
// many views as the call has (adamw_step_multi passes 4 per shard, hundreds in a step).
struct HostCall {
  std::vector<TensorView> in, out;
  OpCall call{};
  bool ok = true;
  std::string error;

  explicit HostCall(const OpCall* c) : call(*c) {
    if (c->num_inputs < 0 || c->num_outputs < 0) {
      ok = false;
      error = "fake device: negative tensor count";
      return;
    }
    // A null array goes through as it is, for the kernel's own check to name it.
    if (c->inputs != nullptr) {
      in.resize(static_cast<size_t>(c->num_inputs));
      for (int32_t i = 0; i < c->num_inputs; ++i) in[i] = convert(c->inputs[i], "input", i);
      call.inputs = in.data();
    }
    if (c->outputs != nullptr) {
      out.resize(static_cast<size_t>(c->num_outputs));
      for (int32_t i = 0; i < c->num_outputs; ++i) out[i] = convert(c->outputs[i], "output", i);
      call.outputs = out.data();
    }
    if (c->workspace != nullptr) call.workspace = untag(c->workspace);
  }

  TensorView convert(const TensorView& v, const char* what, int32_t i) {
    TensorView h = v;
    if (v.device.type == DeviceType::kCuda) h.device = loom::Device{DeviceType::kCpu, 0};
    if (v.data == nullptr) return h;
    if (v.device.type != DeviceType::kCuda || !tagged(v.data)) {
      ok = false;
      error =
          std::string("fake device: ") + what + " " + std::to_string(i) +
          " is not device memory (" +
          (v.device.type == DeviceType::kCuda ? "a host pointer labelled cuda" : "a host tensor") +
          ")";
      return h;
    }
    h.data = untag(v.data);
    return h;
  }
};

// Ops whose attrs carry device pointers (grouped_gemm's host array of weight pointers): the
// CPU kernel gets them untagged, each checked to be device memory as a view's is.
bool untag_attr_pointers(const char* op, HostCall& h, loom::ops::GroupedGemmAttrs& attrs,
                         std::vector<void*>& pointers) {
  const std::string name = op;
  if (name != loom::ops::kGroupedGemm && name != loom::ops::kGroupedGemmWgrad) return true;
  if (h.call.attrs == nullptr || h.call.attrs_size != sizeof(attrs))
    return true;  // kernel names it
  attrs = *static_cast<const loom::ops::GroupedGemmAttrs*>(h.call.attrs);
  if (attrs.weights == nullptr || attrs.groups < 0) return true;
  pointers.assign(attrs.weights, attrs.weights + attrs.groups);
  for (void*& p : pointers) {
    if (p == nullptr) continue;
    if (!tagged(p)) {
      h.ok = false;
      h.error = std::string("fake device: ") + op + " weight pointer is not device memory";
      return false;
    }
    p = untag(p);
  }
  attrs.weights = pointers.data();
  h.call.attrs = &attrs;
  return true;
}

// A kernel call kept for replay: its own copies of the views, the attrs' bytes, the
// grouped GEMM's pointer array and adamw_step_multi's weight decays (host arrays the call
// reads when it is made), as a CUDA graph keeps a launch's arguments.
struct RecordedCall {
  std::vector<TensorView> in, out;
  std::vector<unsigned char> attrs;
  std::vector<void*> pointers;
  std::vector<float> decays;
  OpCall call{};

  RecordedCall(const char* op, const OpCall& c, const std::vector<void*>& weights) : call(c) {
    if (c.inputs != nullptr) in.assign(c.inputs, c.inputs + c.num_inputs);
    if (c.outputs != nullptr) out.assign(c.outputs, c.outputs + c.num_outputs);
    if (c.attrs != nullptr && c.attrs_size > 0) {
      const auto* bytes = static_cast<const unsigned char*>(c.attrs);
      attrs.assign(bytes, bytes + c.attrs_size);
    }
    pointers = weights;
    if (std::string(op) == loom::ops::kAdamWStepMulti &&
        attrs.size() == sizeof(loom::ops::AdamWMultiAttrs)) {
      const auto* a = reinterpret_cast<const loom::ops::AdamWMultiAttrs*>(attrs.data());
      if (a->weight_decay != nullptr && a->count > 0)
        decays.assign(a->weight_decay, a->weight_decay + a->count);
    }
  }
  const OpCall* prepare() {
    call.inputs = call.inputs != nullptr ? in.data() : nullptr;
    call.outputs = call.outputs != nullptr ? out.data() : nullptr;
    if (!attrs.empty()) {
      call.attrs = attrs.data();
      if (!pointers.empty())  // untag_attr_pointers made these the GroupedGemmAttrs' weights
        reinterpret_cast<loom::ops::GroupedGemmAttrs*>(attrs.data())->weights = pointers.data();
      if (!decays.empty())
        reinterpret_cast<loom::ops::AdamWMultiAttrs*>(attrs.data())->weight_decay = decays.data();
    }
    return &call;
  }
};

template <size_t I>
Status run(const OpCall* c) {
  HostCall h(c);
  loom::ops::GroupedGemmAttrs attrs{};
  std::vector<void*> pointers;
  if (h.ok) untag_attr_pointers(g_cpu[I].op, h, attrs, pointers);
  if (!h.ok) return loom::make_status(Code::kInvalidArgument, h.error.c_str());
  if (g_runtime.capturing()) {
    auto recorded = std::make_shared<RecordedCall>(g_cpu[I].op, h.call, pointers);
    if (g_runtime.record([recorded] { return g_cpu[I].fn(recorded->prepare()); }))
      return loom::ok_status();
  }
  return g_cpu[I].fn(&h.call);
}
template <size_t I>
bool supports(const OpCall* c) {
  HostCall h(c);  // shapes only: data may be null, which convert() lets through
  return g_cpu[I].supports == nullptr || g_cpu[I].supports(&h.call);
}
template <size_t I>
Status cost(const OpCall* c, loom::OpCost* out) {
  HostCall h(c);
  return g_cpu[I].cost(&h.call, out);
}

constexpr size_t kMaxKernels = 512;

template <size_t... I>
constexpr auto make_table(std::index_sequence<I...>) {
  struct Fns {
    loom::KernelFn fn;
    loom::KernelSupportsFn supports;
    loom::KernelCostFn cost;
  };
  return std::array<Fns, sizeof...(I)>{Fns{&run<I>, &supports<I>, &cost<I>}...};
}
const auto kTable = make_table(std::make_index_sequence<kMaxKernels>{});

class FakeCuda final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override {
    g_cpu = loom::kernels::cpu::all_kernels();
    if (g_cpu.size() > kMaxKernels)
      throw loom::Error(Code::kInternal, "testfakecuda: raise kMaxKernels");
    r.device_runtime(&g_runtime);
    for (size_t i = 0; i < g_cpu.size(); ++i) {
      KernelDesc k = g_cpu[i];
      k.device = DeviceType::kCuda;
      k.fn = kTable[i].fn;
      k.supports = kTable[i].supports;
      k.cost = g_cpu[i].cost != nullptr ? kTable[i].cost : nullptr;
      r.kernel(k);
    }
  }
};

}  // namespace

LOOM_PLUGIN(FakeCuda)
