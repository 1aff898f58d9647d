// comm_backend "nccl" loaded through the core: the manifest and registration, the refusals
// that need no GPU (the CPU, bad ranks, no device), and with a GPU every operation of a
// 1-rank communicator, in both waiting modes. NCCL runs one rank per GPU, so groups of
// several ranks are in multi_gpu_test.cc.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "loom/cpp/comm_work.h"
#include "loom/kinds.h"
#include "tests/plugins/comm_nccl/nccl_env.h"

namespace loom::testing {
namespace {

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

ICommBackend* backend_of(const ObjectPtr& object) {
  return interface_cast<ICommBackend>(object.get());
}

Outcome create(const ObjectPtr& backend, const std::string& key, int rank, int size,
               DeviceType device, CommPtr* comm, IRendezvousStore* store = nullptr) {
  ICommunicator* raw = nullptr;
  Outcome o = outcome(backend_of(backend)->create_communicator(
      store, StringView{key.data(), key.size()}, rank, size, device, &raw));
  EXPECT_EQ(o.code == Code::kOk, raw != nullptr);
  comm->reset(raw);
  return o;
}

TEST(Plugin, SidecarManifestDeclaresTheBackend) {
  std::ifstream file("plugins/comm_nccl/plugin.json");
  ASSERT_TRUE(file.good()) << "plugins/comm_nccl/plugin.json is not in the runfiles";
  const nlohmann::json manifest = nlohmann::json::parse(file);
  EXPECT_EQ(manifest.value("name", ""), "comm_nccl");
  ASSERT_TRUE(manifest["components"].is_array());
  ASSERT_EQ(manifest["components"].size(), 1u);
  const nlohmann::json& c = manifest["components"][0];
  EXPECT_EQ(c.value("kind", ""), "comm_backend");
  EXPECT_EQ(c.value("name", ""), "nccl");
  EXPECT_EQ(c["options"]["properties"]["blocking_wait"]["default"], false);
}

TEST(Plugin, RegistersAndBuildsWithoutAGpu) {
  ObjectPtr backend = make_nccl_backend();
  ASSERT_NE(backend_of(backend), nullptr);
  ObjectPtr blocking = make_nccl_backend({{"impl", "nccl"}, {"blocking_wait", true}});
  EXPECT_NE(backend_of(blocking), nullptr);
}

TEST(Plugin, CpuCommunicatorIsUnimplemented) {
  ObjectPtr backend = make_nccl_backend();
  CommPtr comm;
  Outcome o = create(backend, "tp/0", 0, 2, DeviceType::kCpu, &comm);
  EXPECT_EQ(o.code, Code::kUnimplemented);
  EXPECT_TRUE(has(o.message, "create_communicator for group 'tp/0' (rank 0 of 2)")) << o.message;
  EXPECT_TRUE(has(o.message, "comm_backend 'gloo'")) << o.message;
}

TEST(Plugin, BadRankAndMissingStoreAreInvalidArgument) {
  ObjectPtr backend = make_nccl_backend();
  CommPtr comm;
  Outcome o = create(backend, "dp/0", 2, 2, DeviceType::kCuda, &comm);
  EXPECT_EQ(o.code, Code::kInvalidArgument);
  EXPECT_TRUE(has(o.message, "rank must be in [0, size)")) << o.message;
  o = create(backend, "dp/0", 0, 2, DeviceType::kCuda, &comm, nullptr);
  EXPECT_EQ(o.code, Code::kInvalidArgument);
  EXPECT_TRUE(has(o.message, "the rendezvous store is null")) << o.message;
}

TEST(Plugin, WithoutAGpuCreatingACommunicatorSaysWhy) {
  std::string reason;
  if (cuda_devices(&reason) > 0) {
    GTEST_SKIP() << "a CUDA device is present; the no-device message is checked where there is "
                    "none";
  }
  ObjectPtr backend = make_nccl_backend();
  CommPtr comm;
  Outcome o = create(backend, "solo", 0, 1, DeviceType::kCuda, &comm);
  EXPECT_EQ(o.code, Code::kUnavailable);
  EXPECT_TRUE(has(o.message,
                  "create_communicator for group 'solo' (rank 0 of 1): comm_backend "
                  "'nccl' needs a CUDA device: no CUDA device: cudaGetDeviceCount"))
      << o.message;
  EXPECT_FALSE(has(o.message, "\n")) << o.message;
}

// ---- one rank on GPU 0, with and without blocking_wait -----------------------------------

class OneRank : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    LOOM_NEED_GPUS(1);
    ASSERT_TRUE(cuda_ok(cudaSetDevice(0), "cudaSetDevice"));
    backend_ = make_nccl_backend({{"impl", "nccl"}, {"blocking_wait", GetParam()}});
    Outcome o = create(backend_, "solo", 0, 1, DeviceType::kCuda, &comm_, &store_);
    ASSERT_EQ(o.code, Code::kOk) << o.message;
    comm_->set_timeout_ms(60000);
  }
  void TearDown() override {
    comm_.reset();
    backend_.reset();
  }

  static HostTensor ramp(DType dtype, size_t n, double from) {
    HostTensor t(dtype, n);
    for (size_t i = 0; i < n; ++i) t.set(i, from + static_cast<double>(i));
    return t;
  }

  InMemoryStore store_;
  ObjectPtr backend_;
  CommPtr comm_;
};

TEST_P(OneRank, RankSizeAndVersion) {
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->size(), 1);
  EXPECT_TRUE(has_async(*comm_));
}

// One rank reduces with itself: the tensor comes back unchanged (avg divides by 1), in
// place, for every dtype and op; the values go through NCCL's kernels for each type.
TEST_P(OneRank, AllReduceEveryDtypeAndOp) {
  for (DType dtype : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32, DType::kI64,
                      DType::kU8}) {
    const bool floating = dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kBF16 ||
                          dtype == DType::kF16;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      if (op == ReduceOp::kAvg && !floating) continue;
      HostTensor in = ramp(dtype, 37, 3);
      DeviceTensor t(dtype, 37);
      t.upload(in);
      TensorView v = t.view();
      Outcome o = outcome(comm_->all_reduce(&v, op, nullptr));
      ASSERT_EQ(o.code, Code::kOk) << dtype_name(dtype) << ": " << o.message;
      EXPECT_EQ(t.download().values(), in.values()) << dtype_name(dtype);
    }
  }
}

TEST_P(OneRank, ReduceScatterAndAllGatherOutOfPlaceAndInPlace) {
  HostTensor in = ramp(DType::kF32, 8, 1);
  DeviceTensor a(DType::kF32, 8), b(DType::kF32, 8);
  a.upload(in);
  TensorView av = a.view(), bv = b.view();
  ASSERT_EQ(outcome(comm_->reduce_scatter(&av, &bv, ReduceOp::kSum, nullptr)).code, Code::kOk);
  EXPECT_EQ(b.download().values(), in.values());
  // In place: the output is the input's chunk 0 (the whole tensor for one rank).
  ASSERT_EQ(outcome(comm_->reduce_scatter(&av, &av, ReduceOp::kMax, nullptr)).code, Code::kOk);
  EXPECT_EQ(a.download().values(), in.values());
  b.upload(ramp(DType::kF32, 8, 100));
  ASSERT_EQ(outcome(comm_->all_gather(&av, &bv, nullptr)).code, Code::kOk);
  EXPECT_EQ(b.download().values(), in.values());
  ASSERT_EQ(outcome(comm_->all_gather(&bv, &bv, nullptr)).code, Code::kOk);
  EXPECT_EQ(b.download().values(), in.values());
}

TEST_P(OneRank, BroadcastAndBarrier) {
  HostTensor in = ramp(DType::kBF16, 5, -2);
  DeviceTensor t(DType::kBF16, 5);
  t.upload(in);
  TensorView v = t.view();
  ASSERT_EQ(outcome(comm_->broadcast(&v, 0, nullptr)).code, Code::kOk);
  EXPECT_EQ(t.download().values(), in.values());
  EXPECT_EQ(outcome(comm_->barrier()).code, Code::kOk);
}

// One rank's all-to-all is its own slice, copied from send_offsets[0] to recv_offsets[0];
// the rest of the output is left alone.
TEST_P(OneRank, AllToAllCopiesTheOwnSlice) {
  DeviceTensor in(DType::kI64, 10), out(DType::kI64, 10);
  in.upload(ramp(DType::kI64, 10, 0));
  out.upload(ramp(DType::kI64, 10, 100));
  TensorView iv = in.view(), ov = out.view();
  const int64_t send_counts[] = {4}, send_offsets[] = {3}, recv_counts[] = {4},
                recv_offsets[] = {5};
  Outcome o = outcome(
      comm_->all_to_all(&iv, send_counts, send_offsets, &ov, recv_counts, recv_offsets, nullptr));
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  EXPECT_EQ(out.download().values(),
            (std::vector<double>{100, 101, 102, 103, 104, 3, 4, 5, 6, 109}));
}

TEST_P(OneRank, AsyncHandlesGiveTheSameResults) {
  HostTensor in = ramp(DType::kF16, 16, 1);
  DeviceTensor a(DType::kF16, 16), b(DType::kF16, 16), c(DType::kF16, 16);
  a.upload(in);
  TensorView av = a.view(), bv = b.view(), cv = c.view();
  ICommWork* w1 = nullptr;
  ICommWork* w2 = nullptr;
  ICommWork* w3 = nullptr;
  ASSERT_EQ(outcome(comm_->all_reduce_async(&av, ReduceOp::kSum, nullptr, &w1)).code, Code::kOk);
  ASSERT_EQ(outcome(comm_->all_gather_async(&av, &bv, nullptr, &w2)).code, Code::kOk);
  ASSERT_EQ(outcome(comm_->reduce_scatter_async(&bv, &cv, ReduceOp::kMin, nullptr, &w3)).code,
            Code::kOk);
  CommWorkPtr h1(w1), h2(w2), h3(w3);
  // Waited in reverse order: each wait orders the compute stream after its operation.
  EXPECT_EQ(outcome(h3->wait()).code, Code::kOk);
  EXPECT_EQ(outcome(h2->wait()).code, Code::kOk);
  EXPECT_EQ(outcome(h1->wait()).code, Code::kOk);
  EXPECT_EQ(c.download().values(), in.values());
  EXPECT_TRUE(h1->done() && h2->done() && h3->done());
}

TEST_P(OneRank, BadArgumentsLeaveTheCommunicatorUsable) {
  HostTensor cpu(DType::kF32, 4);
  TensorView cv = cpu.view();
  Outcome o = outcome(comm_->all_reduce(&cv, ReduceOp::kSum, nullptr));
  EXPECT_EQ(o.code, Code::kInvalidArgument);
  EXPECT_TRUE(has(o.message,
                  "all_reduce on group 'solo' (rank 0 of 1): tensor (4) is a CPU "
                  "tensor"))
      << o.message;
  EXPECT_TRUE(has(o.message, "use comm_backend 'gloo' for CPU tensors")) << o.message;

  DeviceTensor t(DType::kI32, 4);
  TensorView tv = t.view();
  o = outcome(comm_->all_reduce(&tv, ReduceOp::kAvg, nullptr));
  EXPECT_EQ(o.code, Code::kInvalidArgument);
  EXPECT_TRUE(has(o.message, "avg needs a floating-point tensor")) << o.message;

  TensorView elsewhere = tv;
  elsewhere.device.index = 7;
  o = outcome(comm_->broadcast(&elsewhere, 0, nullptr));
  EXPECT_TRUE(has(o.message, "is on cuda:7 but this communicator serves cuda:0")) << o.message;

  o = outcome(comm_->send(&tv, 0, 0, nullptr));  // to itself
  EXPECT_TRUE(has(o.message, "peer 0 must be another rank of the group")) << o.message;

  // The asynchronous form hands the refusal out through the handle.
  ICommWork* raw = nullptr;
  ASSERT_EQ(outcome(comm_->all_reduce_async(&cv, ReduceOp::kSum, nullptr, &raw)).code, Code::kOk);
  CommWorkPtr work(raw);
  EXPECT_TRUE(work->done());
  EXPECT_EQ(outcome(work->wait()).code, Code::kInvalidArgument);

  t.upload(ramp(DType::kI32, 4, 7));
  EXPECT_EQ(outcome(comm_->all_reduce(&tv, ReduceOp::kMax, nullptr)).code, Code::kOk);
  EXPECT_EQ(t.download().values(), (std::vector<double>{7, 8, 9, 10}));
}

// The communicator's stream waits for the work queued on the caller's stream before it, and
// the caller's stream waits for the operation: an upload queued behind a 200 ms host function
// is what gets gathered, and the download queued after the call reads the result, with no
// host synchronisation in between.
TEST_P(OneRank, OrderedAfterAndBeforeTheCallersStream) {
  constexpr size_t kN = 1 << 20;
  cudaStream_t stream = nullptr;
  ASSERT_TRUE(cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  DeviceTensor in(DType::kF32, kN), out(DType::kF32, kN);
  in.upload(ramp(DType::kF32, kN, 0));
  out.upload(ramp(DType::kF32, kN, 0));
  // Pinned, so that both copies are truly asynchronous.
  float* fresh = nullptr;
  float* back = nullptr;
  ASSERT_TRUE(cuda_ok(cudaMallocHost(reinterpret_cast<void**>(&fresh), kN * sizeof(float)),
                      "cudaMallocHost"));
  ASSERT_TRUE(cuda_ok(cudaMallocHost(reinterpret_cast<void**>(&back), kN * sizeof(float)),
                      "cudaMallocHost"));
  for (size_t i = 0; i < kN; ++i) {
    fresh[i] = 5000.0f + static_cast<float>(i % 1000);
    back[i] = 0;
  }
  auto sleep_200ms = [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };
  ASSERT_TRUE(cuda_ok(cudaLaunchHostFunc(stream, sleep_200ms, nullptr), "cudaLaunchHostFunc"));
  ASSERT_TRUE(
      cuda_ok(cudaMemcpyAsync(in.data(), fresh, kN * sizeof(float), cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync"));
  TensorView iv = in.view(), ov = out.view();
  ASSERT_EQ(outcome(comm_->all_gather(&iv, &ov, stream)).code, Code::kOk);
  ASSERT_TRUE(
      cuda_ok(cudaMemcpyAsync(back, out.data(), kN * sizeof(float), cudaMemcpyDeviceToHost, stream),
              "cudaMemcpyAsync"));
  ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  size_t wrong = 0;
  for (size_t i = 0; i < kN; ++i) wrong += back[i] != fresh[i];
  EXPECT_EQ(wrong, 0u);
  (void)cudaFreeHost(fresh);
  (void)cudaFreeHost(back);
  (void)cudaStreamDestroy(stream);
}

// An operation's timeout counts from when it can run: 300 ms of work before it on the
// caller's stream does not time out a 100 ms timeout.
TEST_P(OneRank, TheTimeoutCountsFromWhenTheOperationRuns) {
  cudaStream_t stream = nullptr;
  ASSERT_TRUE(cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  comm_->set_timeout_ms(100);
  auto sleep_300ms = [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); };
  ASSERT_TRUE(cuda_ok(cudaLaunchHostFunc(stream, sleep_300ms, nullptr), "cudaLaunchHostFunc"));
  DeviceTensor t(DType::kF32, 64);
  t.upload(ramp(DType::kF32, 64, 1));
  TensorView v = t.view();
  EXPECT_EQ(outcome(comm_->all_reduce(&v, ReduceOp::kSum, stream)).code, Code::kOk);
  ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the watchdog look
  EXPECT_EQ(outcome(comm_->barrier()).code, Code::kOk);
  (void)cudaStreamDestroy(stream);
}

TEST_P(OneRank, HandlesOutliveTheCommunicator) {
  HostTensor in = ramp(DType::kF64, 9, 1);
  DeviceTensor t(DType::kF64, 9);
  t.upload(in);
  TensorView v = t.view();
  ICommWork* raw = nullptr;
  ASSERT_EQ(outcome(comm_->all_reduce_async(&v, ReduceOp::kSum, nullptr, &raw)).code, Code::kOk);
  CommWorkPtr work(raw);
  comm_.reset();  // waits for the pending operation, then frees NCCL's communicator
  EXPECT_TRUE(work->done());
  EXPECT_EQ(outcome(work->wait()).code, Code::kOk);
  EXPECT_EQ(t.download().values(), in.values());
}

TEST_P(OneRank, EmptyTensorsMoveNothing) {
  DeviceTensor t(DType::kF32, 0);
  TensorView v = t.view();
  EXPECT_EQ(outcome(comm_->all_reduce(&v, ReduceOp::kSum, nullptr)).code, Code::kOk);
  ICommWork* raw = nullptr;
  ASSERT_EQ(outcome(comm_->broadcast_async(&v, 0, nullptr, &raw)).code, Code::kOk);
  CommWorkPtr work(raw);
  EXPECT_TRUE(work->done());
  EXPECT_EQ(outcome(work->wait()).code, Code::kOk);
}

INSTANTIATE_TEST_SUITE_P(Waits, OneRank, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "BlockingWait" : "StreamOrdered";
                         });

}  // namespace
}  // namespace loom::testing
