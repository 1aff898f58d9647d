// Runs the CUDA multi-latent attention layout kernels (kernels/cuda/mla/mla_kernel.cuh) on the
// CPU under emulation (tests/kernels/cuda/emulation/emu_prelude.h supplies threadIdx
// & co.) and compares every element with the layouts of loom/ops/mla.h, written out here
// index by index: mla_qkv, mla_qkv_bwd (dq, dkv, and dkpe's head sum), mla_out, mla_out_bwd.
// The kernels have no barriers, so each block's threads run one after another; with two
// blocks of 256 threads the grid-stride loops run twice for the larger cases. f32 storage: the
// kernels copy values (bit exact) and only dkpe sums, in f32 in head order, as here.
//
// It exists because the first GPU run (H200, 2026-11-27) failed tests/kernels/cpu:mla_test on
// the CUDA kernels: mla_qkv_bwd wrote dkv only for channels below D = dn + dr, so with
// dv > dr the last dv - dr channels of each dkv row were never written.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/mla/mla_kernel.cuh"

namespace {

using loom::kernels::cuda::mla::kMlaThreads;
using loom::kernels::cuda::mla::MlaArgs;
namespace mla = loom::kernels::cuda::mla;

// Runs `kernel` over `grid` blocks of kMlaThreads threads, thread after thread.
template <class Kernel>
void run_grid(unsigned grid, Kernel kernel) {
  emu::Fiber fiber;
  emu::g_cur = &fiber;
  emu::g_block_dim = {static_cast<unsigned>(kMlaThreads), 1, 1};
  emu::g_grid_dim = {grid, 1, 1};
  for (unsigned b = 0; b < grid; ++b)
    for (unsigned t = 0; t < static_cast<unsigned>(kMlaThreads); ++t) {
      fiber.tidx = {t, 0, 0};
      fiber.bidx = {b, 0, 0};
      kernel();
    }
}

std::vector<float> random_vector(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Element-by-element equality, with the first mismatches named.
void expect_equal(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && ++bad <= 3)
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
  EXPECT_EQ(bad, 0) << what;
}

TEST(MlaEmulation, LayoutKernelsMatchTheOpDefinitions) {
  std::mt19937 rng(7);
  // dv below, equal to and above dr (and up to D = dn + dr), H = 1 and 3, no rotary part.
  for (int64_t h : {1, 3})
    for (int64_t dr : {0, 2, 4})
      for (int64_t dv : {int64_t{1}, int64_t{3}, 4 + dr}) {
        const int64_t b = 4, t = 8, dn = 4, d = dn + dr, dkv = dn + dv, rows = b * t * h;
        const std::string what = "H " + std::to_string(h) + ", dn 4, dr " + std::to_string(dr) +
                                 ", dv " + std::to_string(dv);
        std::vector<float> q = random_vector(rows * d, rng), kv = random_vector(rows * dkv, rng),
                           kpe = random_vector(b * t * dr, rng);
        // Outputs start as NaN: an element a kernel never writes cannot pass.
        std::vector<float> Q(rows * d, NAN), K(rows * d, NAN), V(rows * d, NAN);
        MlaArgs a{};
        a.rows = rows, a.h = h, a.dn = dn, a.dr = dr, a.dv = dv;
        a.in[0] = q.data(), a.in[1] = kv.data(), a.in[2] = kpe.data();
        a.out[0] = Q.data(), a.out[1] = K.data(), a.out[2] = V.data();
        run_grid(2, [&] { mla::mla_qkv_kernel<float>(a); });
        std::vector<float> eq(rows * d), ek(rows * d), ev(rows * d);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t e = 0; e < d; ++e) {
            eq[r * d + e] = e < dr ? q[r * d + dn + e] : q[r * d + e - dr];
            ek[r * d + e] = e < dr ? kpe[(r / h) * dr + e] : kv[r * dkv + e - dr];
            ev[r * d + e] = e < dv ? kv[r * dkv + dn + e] : 0.f;
          }
        expect_equal(Q, eq, "mla_qkv Q, " + what);
        expect_equal(K, ek, "mla_qkv K, " + what);
        expect_equal(V, ev, "mla_qkv V, " + what);

        // The backward of random dQ, dK, dV (dV's padding channels must not be read: NaN).
        std::vector<float> dQ = random_vector(rows * d, rng), dK = random_vector(rows * d, rng),
                           dV = random_vector(rows * d, rng);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t e = dv; e < d; ++e) dV[r * d + e] = NAN;
        std::vector<float> dq(rows * d, NAN), dkv_out(rows * dkv, NAN), dkpe(b * t * dr, NAN);
        MlaArgs g = a;
        g.in[0] = dQ.data(), g.in[1] = dK.data(), g.in[2] = dV.data();
        g.out[0] = dq.data(), g.out[1] = dkv_out.data(), g.out[2] = dkpe.data();
        run_grid(2, [&] { mla::mla_qkv_bwd_kernel<float>(g); });
        if (dr > 0) run_grid(1, [&] { mla::mla_dkpe_kernel<float>(g); });
        std::vector<float> edq(rows * d), edkv(rows * dkv), edkpe(b * t * dr, 0.f);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t e = 0; e < d; ++e) edq[r * d + e] = e < dn ? dQ[r * d + dr + e] : dQ[r * d + e - dn];
          for (int64_t e = 0; e < dkv; ++e)
            edkv[r * dkv + e] = e < dn ? dK[r * d + dr + e] : dV[r * d + e - dn];
        }
        for (int64_t bt = 0; bt < b * t; ++bt)
          for (int64_t j = 0; j < dr; ++j)
            for (int64_t k = 0; k < h; ++k) edkpe[bt * dr + j] += dK[(bt * h + k) * d + j];
        expect_equal(dq, edq, "mla_qkv_bwd dq, " + what);
        expect_equal(dkv_out, edkv, "mla_qkv_bwd dkv, " + what);
        expect_equal(dkpe, edkpe, "mla_qkv_bwd dkpe, " + what);

        // mla_out and its backward.
        std::vector<float> Y(rows * dv, NAN), dO(rows * d, NAN), ey(rows * dv), edo(rows * d);
        MlaArgs o = a;
        o.in[0] = Q.data(), o.out[0] = Y.data();
        run_grid(2, [&] { mla::mla_out_kernel<float>(o); });
        MlaArgs ob = a;
        ob.in[0] = Y.data(), ob.out[0] = dO.data();
        run_grid(2, [&] { mla::mla_out_bwd_kernel<float>(ob); });
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t e = 0; e < dv; ++e) ey[r * dv + e] = Q[r * d + e];
          for (int64_t e = 0; e < d; ++e) edo[r * d + e] = e < dv ? Q[r * d + e] : 0.f;
        }
        expect_equal(Y, ey, "mla_out, " + what);
        expect_equal(dO, edo, "mla_out_bwd, " + what);
      }
}

}  // namespace
