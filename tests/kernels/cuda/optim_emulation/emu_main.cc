// Runs AdamW's CUDA kernels (kernels/cuda/optim/adamw_kernel.cuh: adamw_kernel, the
// multi-tensor adamw_multi_kernel and its host planner plan_multi) on the CPU under emulation
// (the shared emulation prelude and scheduler: one fiber per CUDA thread) and checks:
//  - f32 moments against an f64 AdamW written here (loom/ops/optim.h's formula), at 1e-5;
//  - bf16 moments (Megatron's precision-aware optimizer): the kernel's master, param and
//    moments are, bit for bit, those of the same kernel with f32 moments holding the same
//    values, the new moments then rounded to bf16 (the SDK's f32_to_bf16), over six steps;
//  - adamw_multi_kernel through plan_multi gives adamw_kernel's bits on every shard, over
//    300 shards (two tables of one group) that mix grad-, param- and moment dtypes, empty
//    shards, lengths around the 4096-element chunk, pack-aligned and unaligned pointers
//    (UBSan's alignment check: a pack the plan took where a pointer is off), and step
//    scalars with and without the skip flag;
//  - the plan: each launch holds one group's dtypes, at most kMultiMaxShards shards, and
//    every shard is in exactly one launch.
// No GPU or nvcc involved.
#include <gtest/gtest.h>
#include <loom/cpp/half.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/optim/adamw_kernel.cuh"
#include "tests/kernels/cuda/emulation/emu_runner.h"
#include "tests/kernels/cuda/pointwise_emulation/emu_buf.h"

namespace loom::kernels::cuda::optim {
namespace {

using pointwise::emu_test::Buf;
using pointwise::emu_test::name;
using pointwise::emu_test::with_type;

// One shard: grad, master, moments and param (p.n == 0: none), each `off` elements past a
// 16-byte boundary.
struct Shard {
  Buf g, w, m, v, p;
  Shard(DType gt, DType pt, DType mt, DType vt, int64_t n, int off, std::mt19937& rng)
      : g(gt, n, off),
        w(DType::kF32, n, off),
        m(mt, n, off),
        v(vt, n, off),
        p(pt, pt == DType::kInvalid ? 0 : n, off) {
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t i = 0; i < n; ++i) {
      g.set(i, u(rng));
      w.set(i, u(rng));
      m.set(i, 0.1 * u(rng));
      v.set(i, 0.005 * (u(rng) + 1));
    }
  }
  DType param_dtype() const { return p.n > 0 ? p.dt : DType::kF32; }
  void* param() { return p.n > 0 ? p.p : nullptr; }
  // A copy with the moments widened to f32 (exactly), the oracle's run.
  Shard f32_moments() const {
    Shard c = copy();
    c.m = widen(m);
    c.v = widen(v);
    return c;
  }
  Shard copy() const {
    Shard c;
    for (auto [to, from] : {std::pair{&c.g, &g}, {&c.w, &w}, {&c.m, &m}, {&c.v, &v}, {&c.p, &p}})
      *to = clone(*from);
    return c;
  }
  // Elements `b` starts past a 16-byte boundary (0 for an absent param's dtype).
  static int offset(const Buf& b) {
    const size_t e = dtype_size(b.dt);
    return e == 0 ? 0 : static_cast<int>((reinterpret_cast<uintptr_t>(b.p) % 16) / e);
  }
  static Buf clone(const Buf& b) {
    const int off = offset(b);
    Buf c(b.dt, b.n, off);
    std::memcpy(c.p, b.p, static_cast<size_t>(b.n) * dtype_size(b.dt));
    return c;
  }
  static Buf widen(const Buf& b) {
    Buf c(DType::kF32, b.n, offset(b));
    for (int64_t i = 0; i < b.n; ++i) c.set(i, b.get(i));
    return c;
  }

 private:
  Shard() = default;
};

// Rounds an f32 buffer's values to bf16 (the oracle's cast), in a bf16 buffer.
Buf narrow(const Buf& b) {
  Buf c(DType::kBF16, b.n, 0);
  for (int64_t i = 0; i < b.n; ++i)
    reinterpret_cast<uint16_t*>(c.p)[i] = f32_to_bf16(static_cast<float>(b.get(i)));
  return c;
}

// adamw_kernel over shard `s` on `grid` blocks; packs when `vec` (the launcher's choice:
// every pointer aligned for them).
void run_single(Shard& s, const AdamCoef& c, const double* scalars, unsigned grid) {
  const bool vec = is_aligned(s.g.p, pack_bytes(s.g.dt)) && is_aligned(s.w.p, 16) &&
                   is_aligned(s.m.p, pack_bytes(s.m.dt)) && is_aligned(s.v.p, pack_bytes(s.v.dt)) &&
                   is_aligned(s.param(), pack_bytes(s.param_dtype()));
  with_type(s.g.dt, [&](auto* gt) {
    with_type(s.param_dtype(), [&](auto* pt) {
      with_type(s.m.dt, [&](auto* mt) {
        with_type(s.v.dt, [&](auto* vt) {
          using G = std::remove_pointer_t<decltype(gt)>;
          using P = std::remove_pointer_t<decltype(pt)>;
          using M = std::remove_pointer_t<decltype(mt)>;
          using V = std::remove_pointer_t<decltype(vt)>;
          auto* g = reinterpret_cast<const G*>(s.g.p);
          auto* w = reinterpret_cast<float*>(s.w.p);
          auto* m = reinterpret_cast<M*>(s.m.p);
          auto* v = reinterpret_cast<V*>(s.v.p);
          auto* p = static_cast<P*>(s.param());
          emu::run_grid(grid, kThreads, [&] {
            if (vec)
              adamw_kernel<G, P, M, V, true>(g, w, m, v, p, s.g.n, c, scalars);
            else
              adamw_kernel<G, P, M, V, false>(g, w, m, v, p, s.g.n, c, scalars);
          });
        });
      });
    });
  });
}

AdamCoef coef(int64_t step, float wd = 0.1f) {
  return adamw_coef(1e-2f, 0.9f, 0.95f, 1e-8f, wd, 0.5f, step);
}

TEST(AdamWEmulation, F32MomentsMatchF64AdamW) {
  std::mt19937 rng(1);
  for (DType gt : {DType::kF32, DType::kBF16, DType::kF16})
    for (int off : {0, 1}) {
      SCOPED_TRACE(std::string(name(gt)) + " off " + std::to_string(off));
      const int64_t n = 1029;
      Shard s(gt, DType::kBF16, DType::kF32, DType::kF32, n, off, rng);
      std::vector<double> w(n), m(n), v(n);
      for (int64_t i = 0; i < n; ++i) w[i] = s.w.get(i), m[i] = s.m.get(i), v[i] = s.v.get(i);
      for (int64_t step = 1; step <= 3; ++step) {
        run_single(s, coef(step), nullptr, 2);  // 2 blocks: the grid-stride loop
        for (int64_t i = 0; i < n; ++i) {
          const double g = s.g.get(i) * 0.5;
          m[i] = 0.9 * m[i] + 0.1 * g;
          v[i] = 0.95 * v[i] + 0.05 * g * g;
          const double mh = m[i] / (1 - std::pow(0.9, step));
          const double vh = v[i] / (1 - std::pow(0.95, step));
          w[i] -= 1e-2 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * w[i]);
        }
      }
      double worst = 0;
      for (int64_t i = 0; i < n; ++i) {
        worst = std::max(worst, std::abs(s.w.get(i) - w[i]) / (1 + std::abs(w[i])));
        worst = std::max(worst, std::abs(s.m.get(i) - m[i]) / (1e-3 + std::abs(m[i])));
        worst = std::max(worst, std::abs(s.v.get(i) - v[i]) / (1e-6 + std::abs(v[i])));
        ASSERT_EQ(s.p.get(i), static_cast<double>(__bfloat162float(
                                  __float2bfloat16_rn(static_cast<float>(s.w.get(i))))))
            << "param " << i << " is not the master rounded to bf16";
      }
      std::printf("f32 moments, grad %s, off %d: worst relative error %.3g\n", name(gt), off,
                  worst);
      EXPECT_LT(worst, 1e-4);  // three f32 steps (the CPU op tests' f32 level is 1e-4)
    }
}

TEST(AdamWEmulation, Bf16MomentsAreTheF32UpdateRoundedToBf16) {
  std::mt19937 rng(2);
  for (int mix : {1, 2, 3})  // bf16: exp_avg, exp_avg_sq, both
    for (int off : {0, 1, 2})
      for (int64_t n : {3, 4099}) {
        SCOPED_TRACE("mix " + std::to_string(mix) + " off " + std::to_string(off) + " n " +
                     std::to_string(n));
        const DType mt = mix & 1 ? DType::kBF16 : DType::kF32;
        const DType vt = mix & 2 ? DType::kBF16 : DType::kF32;
        Shard s(DType::kBF16, DType::kBF16, mt, vt, n, off, rng);
        Shard ref = s.f32_moments();
        for (int64_t step = 1; step <= 6; ++step) {
          run_single(s, coef(step), nullptr, 3);
          run_single(ref, coef(step), nullptr, 3);
          if (mt == DType::kBF16) ref.m = Shard::widen(narrow(ref.m));  // the oracle's cast
          if (vt == DType::kBF16) ref.v = Shard::widen(narrow(ref.v));
        }
        EXPECT_TRUE(s.w.same_bits(ref.w)) << "master";
        EXPECT_TRUE(s.p.same_bits(ref.p)) << "param";
        auto moment_ok = [](const Buf& got, const Buf& want) {
          if (got.dt == DType::kF32) return got.same_bits(want);
          for (int64_t i = 0; i < got.n; ++i)
            if (reinterpret_cast<const uint16_t*>(got.p)[i] !=
                f32_to_bf16(static_cast<float>(want.get(i))))
              return false;
          return true;
        };
        EXPECT_TRUE(moment_ok(s.m, ref.m)) << "exp_avg";
        EXPECT_TRUE(moment_ok(s.v, ref.v)) << "exp_avg_sq";
      }
}

// A multi-tensor call's tensors: views for plan_multi and the shards they point into.
struct MultiCall {
  std::vector<Shard> shards;
  std::vector<TensorView> in, out;
  std::vector<float> decay;
  ops::AdamWMultiAttrs attrs{};
  OpCall call{};

  static TensorView view(const Buf& b) {
    if (b.n == 0 && b.raw.empty()) return TensorView{};
    return make_view(b.p, b.dt, {b.n}, Device{DeviceType::kCuda, 0});
  }
  // `scalars` (kStepScalarCount f64) or null.
  void build(int64_t step, double* scalars) {
    in.clear();
    out.clear();
    for (Shard& s : shards) {
      in.push_back(view(s.g));
      for (const Buf* b : {&s.w, &s.m, &s.v}) out.push_back(view(*b));
      out.push_back(s.p.n > 0 ? view(s.p) : TensorView{});
    }
    if (scalars != nullptr)
      in.push_back(
          make_view(scalars, DType::kF64, {ops::kStepScalarCount}, Device{DeviceType::kCuda, 0}));
    const int32_t k = static_cast<int32_t>(shards.size());
    attrs = ops::AdamWMultiAttrs{1e-2f, 0.9f, 0.95f, 1e-8f, 0.5f, k, step, decay.data()};
    call = OpCall{};
    call.struct_size = sizeof(OpCall);
    call.inputs = in.data();
    call.num_inputs = static_cast<int32_t>(in.size());
    call.outputs = out.data();
    call.num_outputs = static_cast<int32_t>(out.size());
    call.attrs = &attrs;
    call.attrs_size = sizeof(attrs);
  }
};

// Runs every launch plan_multi makes, under emulation; returns the launches' (group, shard
// count) and the shards' grads seen, to check the plan.
struct Launch {
  MultiGroup group;
  int32_t count;
  std::vector<const void*> grads;
};

std::vector<Launch> run_multi(MultiCall& mc) {
  std::vector<Launch> launches;
  MultiTable table;
  const DType grad = mc.shards[0].g.dt;
  plan_multi(&mc.call, table, [&](const MultiTable& t, const MultiGroup& group) {
    Launch l{group, t.count, {}};
    for (int32_t i = 0; i < t.count; ++i) l.grads.push_back(t.shard[i].grad);
    launches.push_back(l);
    with_type(grad, [&](auto* gt) {
      with_type(group.param, [&](auto* pt) {
        with_type(group.m, [&](auto* mt) {
          with_type(group.v, [&](auto* vt) {
            using G = std::remove_pointer_t<decltype(gt)>;
            using P = std::remove_pointer_t<decltype(pt)>;
            using M = std::remove_pointer_t<decltype(mt)>;
            using V = std::remove_pointer_t<decltype(vt)>;
            emu::run_grid(static_cast<unsigned>(t.block_start[t.count]), kThreads,
                          [&] { adamw_multi_kernel<G, P, M, V>(t); });
          });
        });
      });
    });
  });
  return launches;
}

TEST(AdamWEmulation, MultiIsAdamWStepPerShardBitForBit) {
  std::mt19937 rng(3);
  const DType params[] = {DType::kBF16, DType::kF32, DType::kInvalid, DType::kF16};
  const DType moments[] = {DType::kF32, DType::kBF16};
  for (DType gt : {DType::kF32, DType::kBF16})
    for (int scalar_case : {0, 1, 2}) {  // none, scalars, scalars with the skip flag
      SCOPED_TRACE(std::string("grad ") + name(gt) + " scalars case " +
                   std::to_string(scalar_case));
      MultiCall mc;
      // 300 shards: more than one table for the most common group; lengths 0 to 9000
      // (around the 4096-element chunk: 4095, 4096, 4097), most of them small.
      for (int i = 0; i < 300; ++i) {
        const int64_t n = i % 50 == 7    ? 4095 + i % 3
                          : i % 60 == 11 ? 9000
                          : i % 13 == 5  ? 0
                                         : 1 + (i * 37) % 200;
        const DType pt = i < 200 ? DType::kBF16 : params[i % 4];
        const DType mt = i < 200 ? DType::kBF16 : moments[(i / 2) % 2];
        const DType vt = i < 200 ? DType::kBF16 : moments[(i / 3) % 2];
        mc.shards.emplace_back(gt, pt, mt, vt, n, i % 5 == 4 ? 1 : 0, rng);
        mc.decay.push_back(i % 3 == 0 ? 0.0f : 0.1f);
      }
      std::vector<Shard> single;
      for (const Shard& s : mc.shards) single.push_back(s.copy());
      double scalars[ops::kStepScalarCount] = {};
      scalars[ops::kStepLr] = 3e-3;
      scalars[ops::kStepIndex] = 5;
      scalars[ops::kStepGradScale] = 0.25;
      scalars[ops::kStepSkip] = scalar_case == 2 ? 1 : 0;
      mc.build(2, scalar_case > 0 ? scalars : nullptr);
      const std::vector<Launch> launches = run_multi(mc);

      // The plan: one group's dtypes a launch, at most kMultiMaxShards shards, every
      // nonempty shard in exactly one launch.
      std::map<const void*, int> seen;
      for (const Launch& l : launches) {
        EXPECT_LE(l.count, kMultiMaxShards);
        for (const void* g : l.grads) ++seen[g];
      }
      for (size_t i = 0; i < mc.shards.size(); ++i) {
        const Shard& s = mc.shards[i];
        EXPECT_EQ(seen[s.g.p], 1) << "shard " << i;
        for (const Launch& l : launches)
          for (const void* g : l.grads)
            if (g == s.g.p) {
              EXPECT_EQ(l.group.m, s.m.dt) << "shard " << i;
              EXPECT_EQ(l.group.v, s.v.dt) << "shard " << i;
              if (s.p.n > 0) {
                EXPECT_EQ(l.group.param, s.p.dt) << "shard " << i;
              }
            }
      }
      EXPECT_GE(launches.size(), 2u);

      // The update happened (or, with the skip flag, wrote nothing): `single` still holds
      // the shards as they were.
      for (size_t i = 0; i < single.size(); ++i)
        if (single[i].g.n > 0)
          EXPECT_EQ(mc.shards[i].w.same_bits(single[i].w), scalar_case == 2) << "shard " << i;

      // The bits: adamw_kernel per shard with that shard's weight decay.
      for (size_t i = 0; i < single.size(); ++i) {
        AdamCoef c = adamw_coef(mc.attrs.lr, mc.attrs.beta1, mc.attrs.beta2, mc.attrs.eps,
                                mc.decay[i], mc.attrs.grad_scale, mc.attrs.step);
        if (single[i].g.n > 0) run_single(single[i], c, scalar_case > 0 ? scalars : nullptr, 2);
        const Shard &a = mc.shards[i], &b = single[i];
        EXPECT_TRUE(a.w.same_bits(b.w) && a.m.same_bits(b.m) && a.v.same_bits(b.v) &&
                    a.p.same_bits(b.p))
            << "shard " << i << " (n " << a.g.n << ", moments " << name(a.m.dt) << "/"
            << name(a.v.dt) << ") differs from adamw_kernel's";
      }
    }
}

}  // namespace
}  // namespace loom::kernels::cuda::optim
