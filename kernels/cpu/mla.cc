// mla_qkv / mla_qkv_bwd / mla_out / mla_out_bwd: multi-latent attention's layout between its
// projections and the attention core (loom/ops/mla.h). With D = dr + dn, per (b, t, h):
//   Q = [q[dn : D], q[0 : dn]],  K = [kpe[b, t], kv[0 : dn]],  V = [kv[dn : dn + dv], 0]
//   dq = [dQ[dr : D], dQ[0 : dr]],  dkv = [dK[dr : D], dV[0 : dv]],
//   dkpe[b, t] = sum over h (in head order, f32) of dK[b, t, h, 0 : dr]
//   Y = O[0 : dv],  dO = [dY, 0]
// Every output is one dtype with its inputs, so all but dkpe are bit copies.
//   reference: element by element through load / store.
//   fast: OpenMP over the (b, t) rows, memcpy of contiguous runs; dkpe summed in f32.
#include <loom/cpp/op_checks/mla.h>
#include <loom/cpp/tensor.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::MlaShape;

MlaShape check_qkv(const OpCall* call, bool shapes_only) {
  return op_checks::check_mla_qkv(call, shapes_only, DeviceType::kCpu);
}
MlaShape check_qkv_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_mla_qkv_bwd(call, shapes_only, DeviceType::kCpu);
}
MlaShape check_out(const OpCall* call, bool shapes_only) {
  return op_checks::check_mla_out(call, shapes_only, DeviceType::kCpu);
}
MlaShape check_out_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_mla_out_bwd(call, shapes_only, DeviceType::kCpu);
}

// n elements from src[si] to dst[di] (same dtype).
void copy_ref(const TensorView& dst, int64_t di, const TensorView& src, int64_t si, int64_t n) {
  for (int64_t j = 0; j < n; ++j) store(dst, di + j, load(src, si + j));
}
void zero_ref(const TensorView& dst, int64_t di, int64_t n) {
  for (int64_t j = 0; j < n; ++j) store(dst, di + j, 0.0f);
}

Status mla_qkv_ref(const OpCall* call) {
  return guard([&] {
    const MlaShape s = check_qkv(call, false);
    const int64_t dn = s.attrs.nope_dim, dr = s.attrs.rope_dim, dv = s.attrs.v_dim, d = dn + dr;
    const TensorView &q = call->inputs[0], &kv = call->inputs[1], &kpe = call->inputs[2];
    const TensorView &qo = call->outputs[0], &ko = call->outputs[1], &vo = call->outputs[2];
    for (int64_t bt = 0; bt < s.b * s.t; ++bt)
      for (int64_t h = 0; h < s.h; ++h) {
        const int64_t r = bt * s.h + h;  // row of (B, T, H, *)
        copy_ref(qo, r * d, q, r * d + dn, dr);
        copy_ref(qo, r * d + dr, q, r * d, dn);
        copy_ref(ko, r * d, kpe, bt * dr, dr);
        copy_ref(ko, r * d + dr, kv, r * (dn + dv), dn);
        copy_ref(vo, r * d, kv, r * (dn + dv) + dn, dv);
        zero_ref(vo, r * d + dv, d - dv);
      }
  });
}

Status mla_qkv_bwd_ref(const OpCall* call) {
  return guard([&] {
    const MlaShape s = check_qkv_bwd(call, false);
    const int64_t dn = s.attrs.nope_dim, dr = s.attrs.rope_dim, dv = s.attrs.v_dim, d = dn + dr;
    const TensorView &dQ = call->inputs[0], &dK = call->inputs[1], &dV = call->inputs[2];
    const TensorView &dq = call->outputs[0], &dkv = call->outputs[1], &dkpe = call->outputs[2];
    for (int64_t bt = 0; bt < s.b * s.t; ++bt) {
      for (int64_t h = 0; h < s.h; ++h) {
        const int64_t r = bt * s.h + h;
        copy_ref(dq, r * d, dQ, r * d + dr, dn);
        copy_ref(dq, r * d + dn, dQ, r * d, dr);
        copy_ref(dkv, r * (dn + dv), dK, r * d + dr, dn);
        copy_ref(dkv, r * (dn + dv) + dn, dV, r * d, dv);
      }
      for (int64_t j = 0; j < dr; ++j) {
        float acc = 0.0f;  // f32 in head order, as every library sums
        for (int64_t h = 0; h < s.h; ++h) acc += load(dK, (bt * s.h + h) * d + j);
        store(dkpe, bt * dr + j, acc);
      }
    }
  });
}

Status mla_out_ref(const OpCall* call) {
  return guard([&] {
    const MlaShape s = check_out(call, false);
    const int64_t dv = s.attrs.v_dim, d = static_cast<int64_t>(s.attrs.nope_dim) + s.attrs.rope_dim;
    for (int64_t r = 0; r < s.b * s.t * s.h; ++r)
      copy_ref(call->outputs[0], r * dv, call->inputs[0], r * d, dv);
  });
}

Status mla_out_bwd_ref(const OpCall* call) {
  return guard([&] {
    const MlaShape s = check_out_bwd(call, false);
    const int64_t dv = s.attrs.v_dim, d = static_cast<int64_t>(s.attrs.nope_dim) + s.attrs.rope_dim;
    for (int64_t r = 0; r < s.b * s.t * s.h; ++r) {
      copy_ref(call->outputs[0], r * d, call->inputs[0], r * dv, dv);
      zero_ref(call->outputs[0], r * d + dv, d - dv);
    }
  });
}

LOOM_CPU_FAST_BEGIN

// Byte views of a tensor, for copies of whole runs.
struct Bytes {
  char* p;
  size_t es;
  explicit Bytes(const TensorView& v)
      : p(static_cast<char*>(v.data)), es(static_cast<size_t>(dtype_size(v.dtype))) {}
  char* at(int64_t i) const { return p + static_cast<size_t>(i) * es; }
};

// n elements from src[si] to dst[di] (same dtype); a no-op for n == 0 (data may be null).
inline void copy_fast(const Bytes& dst, int64_t di, const Bytes& src, int64_t si, int64_t n) {
  if (n > 0) std::memcpy(dst.at(di), src.at(si), static_cast<size_t>(n) * dst.es);
}
inline void zero_fast(const Bytes& dst, int64_t di, int64_t n) {
  if (n > 0) std::memset(dst.at(di), 0, static_cast<size_t>(n) * dst.es);  // +0 in every dtype
}

Status mla_qkv_fast(const OpCall* call) {
  return guard([&] {
    const MlaShape s = check_qkv(call, false);
    const int64_t dn = s.attrs.nope_dim, dr = s.attrs.rope_dim, dv = s.attrs.v_dim, d = dn + dr;
    const Bytes q(call->inputs[0]), kv(call->inputs[1]), kpe(call->inputs[2]);
    const Bytes qo(call->outputs[0]), ko(call->outputs[1]), vo(call->outputs[2]);
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < s.b * s.t; ++bt)
      for (int64_t h = 0; h < s.h; ++h) {
        const int64_t r = bt * s.h + h;
        copy_fast(qo, r * d, q, r * d + dn, dr);
        copy_fast(qo, r * d + dr, q, r * d, dn);
        copy_fast(ko, r * d, kpe, bt * dr, dr);
        copy_fast(ko, r * d + dr, kv, r * (dn + dv), dn);
        copy_fast(vo, r * d, kv, r * (dn + dv) + dn, dv);
        zero_fast(vo, r * d + dv, d - dv);
      }
  });
}

Status mla_qkv_bwd_fast(const OpCall* call) {
  return guard([&] {
    const MlaShape s = check_qkv_bwd(call, false);
    const int64_t dn = s.attrs.nope_dim, dr = s.attrs.rope_dim, dv = s.attrs.v_dim, d = dn + dr;
    const TensorView &dK = call->inputs[1], &dkpe = call->outputs[2];
    const Bytes bdQ(call->inputs[0]), bdK(dK), bdV(call->inputs[2]);
    const Bytes bdq(call->outputs[0]), bdkv(call->outputs[1]);
#pragma omp parallel
    {
      std::vector<float> acc(static_cast<size_t>(dr)), row(static_cast<size_t>(dr));
#pragma omp for schedule(static)
      for (int64_t bt = 0; bt < s.b * s.t; ++bt) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t h = 0; h < s.h; ++h) {
          const int64_t r = bt * s.h + h;
          copy_fast(bdq, r * d, bdQ, r * d + dr, dn);
          copy_fast(bdq, r * d + dn, bdQ, r * d, dr);
          copy_fast(bdkv, r * (dn + dv), bdK, r * d + dr, dn);
          copy_fast(bdkv, r * (dn + dv) + dn, bdV, r * d, dv);
          if (dr > 0) {
            load_row(dK.data, dK.dtype, r * d, dr, row.data());
            for (int64_t j = 0; j < dr; ++j) acc[j] += row[j];
          }
        }
        if (dr > 0) store_row(dkpe.data, dkpe.dtype, bt * dr, dr, acc.data());
      }
    }
  });
}

Status mla_out_fast(const OpCall* call) {
  return guard([&] {
    const MlaShape s = check_out(call, false);
    const int64_t dv = s.attrs.v_dim, d = static_cast<int64_t>(s.attrs.nope_dim) + s.attrs.rope_dim;
    const Bytes o(call->inputs[0]), y(call->outputs[0]);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < s.b * s.t * s.h; ++r) copy_fast(y, r * dv, o, r * d, dv);
  });
}

Status mla_out_bwd_fast(const OpCall* call) {
  return guard([&] {
    const MlaShape s = check_out_bwd(call, false);
    const int64_t dv = s.attrs.v_dim, d = static_cast<int64_t>(s.attrs.nope_dim) + s.attrs.rope_dim;
    const Bytes dy(call->inputs[0]), dO(call->outputs[0]);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < s.b * s.t * s.h; ++r) {
      copy_fast(dO, r * d, dy, r * dv, dv);
      zero_fast(dO, r * d + dv, d - dv);
    }
  });
}

LOOM_CPU_FAST_END

// Pure data movement: no FLOPs but mla_qkv_bwd's head sum (about one per dkpe input).
LOOM_CPU_HOOKS(mla_qkv, check_qkv, 0.0)
LOOM_CPU_HOOKS(mla_qkv_bwd, check_qkv_bwd, 0.0)
LOOM_CPU_HOOKS(mla_out, check_out, 0.0)
LOOM_CPU_HOOKS(mla_out_bwd, check_out_bwd, 0.0)

}  // namespace

void add_mla_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kMlaQkv, mla_qkv);
  LOOM_CPU_REGISTER(out, ops::kMlaQkvBwd, mla_qkv_bwd);
  LOOM_CPU_REGISTER(out, ops::kMlaOut, mla_out);
  LOOM_CPU_REGISTER(out, ops::kMlaOutBwd, mla_out_bwd);
}

}  // namespace loom::kernels::cpu
