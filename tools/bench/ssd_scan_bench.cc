// ssd_scan_bench: the CPU ssd_scan kernels against each other, forward and forward +
// backward: cpu.ref (the plain recurrence, one step at a time) and cpu.fast (the chunked SSD
// algorithm), at a few sequence lengths, on f32 tensors of a Mamba-2 mixer's shape.
// Prints a Markdown table of ms per call and the speedup. (The CUDA kernels need a GPU:
// tools/gpu_check.)
//
// usage: ssd_scan_bench [--batch 1] [--heads 16] [--head-dim 64] [--state 128] [--groups 2]
//                       [--chunk 64] [--seq 512,2048,8192] [--repeat 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "loom/cpp/error.h"
#include "loom/ops.h"

namespace {

using loom::DType;
using loom::KernelDesc;
using loom::OpCall;
using loom::TensorView;

struct Buffer {
  std::vector<float> data;
  TensorView view{};
  Buffer(std::vector<int64_t> shape, bool random, uint32_t seed, float scale = 1.f) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    data.assign(static_cast<size_t>(n), 0.f);
    if (random) {
      std::mt19937 gen(seed);
      std::normal_distribution<float> dist(0.f, scale);
      for (float& v : data) v = dist(gen);
    }
    view.data = data.data();
    view.dtype = DType::kF32;
    view.device = loom::Device{loom::DeviceType::kCpu, 0};
    view.ndim = static_cast<int32_t>(shape.size());
    int64_t stride = 1;
    for (int32_t d = view.ndim - 1; d >= 0; --d) {
      view.shape[d] = shape[static_cast<size_t>(d)];
      view.strides[d] = stride;
      stride *= shape[static_cast<size_t>(d)];
    }
  }
};

const KernelDesc& find(const char* op, const char* name) {
  for (const KernelDesc& k : loom::kernels::cpu::all_kernels())
    if (std::strcmp(k.op, op) == 0 && std::strcmp(k.name, name) == 0 && k.dtype == DType::kF32)
      return k;
  std::fprintf(stderr, "ssd_scan_bench: no %s kernel %s (f32)\n", op, name);
  std::exit(1);
}

double call_ms(const KernelDesc& k, std::vector<TensorView> in, std::vector<TensorView> out,
               const loom::ops::SsdScanAttrs& attrs, int repeat) {
  OpCall c{};
  c.struct_size = sizeof(OpCall);
  c.inputs = in.data();
  c.num_inputs = static_cast<int32_t>(in.size());
  c.outputs = out.data();
  c.num_outputs = static_cast<int32_t>(out.size());
  c.attrs = &attrs;
  c.attrs_size = sizeof(attrs);
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    loom::Status s = k.fn(&c);
    auto t1 = std::chrono::steady_clock::now();
    if (s.code != loom::Code::kOk) {
      std::fprintf(stderr, "ssd_scan_bench: %s %s failed: %s\n", k.op, k.name,
                   loom::take_message(&s).c_str());
      std::exit(1);
    }
    best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 1, heads = 16, head_dim = 64, state = 128, groups = 2, chunk = 64;
  int repeat = 3;
  std::vector<int64_t> seqs = {512, 2048, 8192};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string key = argv[i], value = argv[i + 1];
    if (key == "--batch") batch = std::stol(value);
    else if (key == "--heads") heads = std::stol(value);
    else if (key == "--head-dim") head_dim = std::stol(value);
    else if (key == "--state") state = std::stol(value);
    else if (key == "--groups") groups = std::stol(value);
    else if (key == "--chunk") chunk = std::stol(value);
    else if (key == "--repeat") repeat = std::stoi(value);
    else if (key == "--seq") {
      seqs.clear();
      std::stringstream ss(value);
      std::string item;
      while (std::getline(ss, item, ',')) seqs.push_back(std::stol(item));
    } else {
      std::fprintf(stderr, "ssd_scan_bench: unknown option %s\n", key.c_str());
      return 2;
    }
  }
  const int64_t width = heads / groups * head_dim + 2 * state;
  const loom::ops::SsdScanAttrs attrs{static_cast<int32_t>(head_dim), static_cast<int32_t>(state),
                                      static_cast<int32_t>(groups), static_cast<int32_t>(chunk),
                                      1};
  std::printf("B = %ld, H = %ld, P = %ld, N = %ld, G = %ld, chunk %ld, f32, best of %d\n\n",
              static_cast<long>(batch), static_cast<long>(heads), static_cast<long>(head_dim),
              static_cast<long>(state), static_cast<long>(groups), static_cast<long>(chunk),
              repeat);
  std::printf("| T | forward ref (ms) | forward fast (ms) | speedup | backward ref (ms) | "
              "backward fast (ms) | speedup |\n|---|---|---|---|---|---|---|\n");
  for (int64_t t : seqs) {
    Buffer xbc({batch, t, groups, width}, true, 1, 0.5f), dt({batch, t, heads}, true, 2, 0.5f);
    Buffer a_log({heads}, true, 3, 0.5f), d({heads}, true, 4), dt_bias({heads}, true, 5, 0.5f);
    Buffer y({batch, t, heads, head_dim}, false, 0), dy({batch, t, heads, head_dim}, true, 6);
    Buffer dxbc({batch, t, groups, width}, false, 0), ddt({batch, t, heads}, false, 0);
    Buffer da({heads}, false, 0), dd({heads}, false, 0), ddtb({heads}, false, 0);
    const TensorView none{};
    double fwd[2], bwd[2];
    const char* names[2] = {"cpu.ref", "cpu.fast"};
    for (int k = 0; k < 2; ++k) {
      fwd[k] = call_ms(find(loom::ops::kSsdScan, names[k]),
                       {xbc.view, dt.view, a_log.view, d.view, dt_bias.view, none},
                       {y.view, none}, attrs, repeat);
      bwd[k] = call_ms(find(loom::ops::kSsdScanBwd, names[k]),
                       {dy.view, xbc.view, dt.view, a_log.view, d.view, dt_bias.view, none},
                       {dxbc.view, ddt.view, da.view, dd.view, ddtb.view}, attrs, repeat);
    }
    std::printf("| %ld | %.1f | %.1f | %.2fx | %.1f | %.1f | %.2fx |\n", static_cast<long>(t),
                fwd[0], fwd[1], fwd[0] / fwd[1], bwd[0], bwd[1], bwd[0] / bwd[1]);
    std::fflush(stdout);
  }
  return 0;
}
