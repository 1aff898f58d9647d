#include "core/train/test_fault.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>
#include <vector>

#include "loom/cpp/error.h"
#include "loom/cpp/tensor.h"

namespace loom::core {

const TestFault& test_fault() {
  static const TestFault fault = [] {
    TestFault f;
    const char* env = std::getenv("LOOM_TEST_FAULT");
    if (env == nullptr) return f;
    std::string text(env);
    size_t a = text.find(':'), b = text.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) return f;
    f.kind = text.substr(0, a);
    f.rank = std::atoi(text.substr(a + 1, b - a - 1).c_str());
    f.step = std::atoll(text.substr(b + 1).c_str());
    return f;
  }();
  return fault;
}

bool test_fault_set() { return !test_fault().kind.empty(); }

namespace {

void announce(const TestFault& f, int rank, int64_t step) {
  std::fprintf(stderr, "LOOM_TEST_FAULT: %s rank %d at step %lld\n", f.kind.c_str(), rank,
               static_cast<long long>(step));
  std::fflush(stderr);
}

// Sets element 0 of the first parameter's gradient to `value`.
void poison_gradient(IHost& host, ParameterSet& params, float value) {
  for (Parameter& p : params.all()) {
    if (p.grad.data == nullptr) continue;
    std::vector<float> g(static_cast<size_t>(numel(p.grad)));
    load_floats(host, p.grad, g.data());
    g[0] = value;
    store_floats(host, g.data(), p.grad);
    return;
  }
}

}  // namespace

void inject_fault_after_backward(int rank, int64_t step) {
  const TestFault& f = test_fault();
  if (f.rank != rank) return;
  if (f.kind == "slow") {
    std::this_thread::sleep_for(std::chrono::milliseconds(f.step));
    return;
  }
  if (f.step != step || (f.kind != "kill" && f.kind != "hang" && f.kind != "throw")) return;
  announce(f, rank, step);
  if (f.kind == "kill") raise(SIGKILL);
  if (f.kind == "hang")
    for (;;) pause();
  throw Error(Code::kInternal,
              fmt::format("LOOM_TEST_FAULT: rank {} fails at step {}", rank, step));
}

void inject_fault_after_zero_fill(int rank, int64_t step, IHost& host, ParameterSet& params) {
  const TestFault& f = test_fault();
  if (f.kind != "poison_overwrite" || f.rank != rank || step < f.step) return;
  if (step == f.step) announce(f, rank, step);
  for (Parameter& p : params.all()) {
    if ((p.info.flags & kParamGradOverwrite) == 0 || p.grad.data == nullptr) continue;
    std::vector<float> nan(static_cast<size_t>(numel(p.grad)),
                           std::numeric_limits<float>::quiet_NaN());
    store_floats(host, nan.data(), p.grad);
  }
}

void inject_fault_after_reduction(int rank, int64_t step, int attempt, IHost& host,
                                  ParameterSet& params) {
  const TestFault& f = test_fault();
  if (f.rank != rank || f.step != step) return;
  const bool first = attempt == 0;
  if ((f.kind == "nan" && first) || f.kind == "nan_always") {
    announce(f, rank, step);
    poison_gradient(host, params, std::numeric_limits<float>::quiet_NaN());
  } else if (f.kind == "inf" && first) {
    announce(f, rank, step);
    poison_gradient(host, params, std::numeric_limits<float>::infinity());
  }
}

void inject_fault_into_fp8_scale(int rank, int64_t step, IHost& host, Device device,
                                 const TensorView& scale) {
  const TestFault& f = test_fault();
  if (f.kind != "fp8_skew" || f.rank != rank || f.step != step || scale.data == nullptr) return;
  announce(f, rank, step);
  float value = 0;
  throw_if_error(host.copy(kCpu, &value, device, scale.data, 4), "LOOM_TEST_FAULT: fp8_skew");
  value *= 2;
  throw_if_error(host.copy(device, scale.data, kCpu, &value, 4), "LOOM_TEST_FAULT: fp8_skew");
}

double inject_fault_into_loss(int rank, int64_t step, int attempt, double loss) {
  const TestFault& f = test_fault();
  if (f.rank != rank || f.step != step) return loss;
  if ((f.kind == "spike" && attempt == 0) || f.kind == "spike_always") {
    announce(f, rank, step);
    return loss + 1000.0;
  }
  return loss;
}

}  // namespace loom::core
