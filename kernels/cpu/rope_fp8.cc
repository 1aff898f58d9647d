// rope_fp8_bwd (loom/ops/fp8.h): the QKV projection's output gradient turned back by rope
// (query and key heads; value heads pass through) and quantised as fp8_quantize would
// quantise it, without the tensor in between.
//   reference: one element at a time: rope_bwd's reference pair (rope.h) for a query or key
//              channel below rotary_dim, else dX's own value; rounded to dX's dtype; then
//              fp8_quantize's reference loop (fp8.h);
//   fast:      rope_bwd's fast cosines and rotation (rope.h) over each query and key head of
//              a row, the row rounded to dX's dtype as rope's store does, through
//              fp8_quantize's fast tiles.
// Each therefore gives the bits of split_qkv, rope_bwd, merge_qkv and fp8_quantize of its own
// name, one after the other.
#include <loom/cpp/op_checks/fp8.h>

#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/rope.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::RopeFp8Shape;

RopeFp8Shape check_rope_fp8_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_rope_fp8_bwd(call, shapes_only, DeviceType::kCpu);
}

constexpr double kBackward = -1.0;  // rope_bwd turns by minus the angle

// The position of token `row` = b T + t: positions[b, t], or t without them.
double position(const OpCall* call, const RopeFp8Shape& s, int64_t row) {
  const TensorView& pos = call->inputs[1];
  return pos.data != nullptr ? static_cast<double>(i32(pos)[row]) : static_cast<double>(row % s.t);
}

// ---- reference ----------------------------------------------------------------------------

Status rope_fp8_bwd_ref(const OpCall* call) {
  return guard([&] {
    const RopeFp8Shape s = check_rope_fp8_bwd(call, false);
    const TensorView& X = call->inputs[0];
    const float* inv_freq = f32(call->inputs[2]);
    const Fp8Outs o = fp8_outs(call, s.out);
    const int64_t width = s.heads * s.d, k = s.g * width;  // a group's columns; a row's
    quantize_elements_ref(
        s.b * s.t, k, f32(call->inputs[3])[0], s.out.out_dtype, o.y, o.yt, o.amax, o.scale_inv,
        [&](int64_t row, int64_t col) {
          const int64_t at = row * k + col, head = col % width / s.d, ch = col % s.d;
          // A value head (the group's last) or a channel past rotary_dim: dX itself.
          if (head == s.heads - 1 || ch >= 2 * s.half) return load(X, at);
          const bool first = ch < s.half;
          const int64_t x1 = first ? at : at - s.half;  // the pair's channel i
          float y1, y2;
          rope_ref_pair(position(call, s, row), inv_freq[first ? ch : ch - s.half], kBackward,
                        load(X, x1), load(X, x1 + s.half), &y1, &y2);
          return rounded_to(X.dtype, first ? y1 : y2);
        });
  });
}

// ---- fast ---------------------------------------------------------------------------------

// One OpenMP thread's buffers, kept from row to row and from call to call.
struct RopeRowScratch {
  std::vector<float> cs, sn;
  std::vector<uint16_t> rounding;
  static RopeRowScratch& of_this_thread(int64_t half) {
    thread_local RopeRowScratch s;
    if (s.cs.size() < static_cast<size_t>(half)) {
      s.cs.resize(static_cast<size_t>(half));
      s.sn.resize(static_cast<size_t>(half));
    }
    return s;
  }
};

LOOM_CPU_FAST_BEGIN

Status rope_fp8_bwd_fast(const OpCall* call) {
  return guard([&] {
    const RopeFp8Shape s = check_rope_fp8_bwd(call, false);
    const TensorView& X = call->inputs[0];
    const float* inv_freq = f32(call->inputs[2]);
    const Fp8Outs o = fp8_outs(call, s.out);
    const int64_t width = s.heads * s.d, k = s.g * width;
    quantize_rows_fast(s.b * s.t, k, f32(call->inputs[3])[0], s.out.out_dtype, o.y, o.yt, o.amax,
                       o.scale_inv, [&](int64_t row, float* out) {
                         RopeRowScratch& r = RopeRowScratch::of_this_thread(s.half);
                         load_row(X.data, X.dtype, row * k, k, out);
                         if (s.half > 0) {
                           rope_cos_sin_fast(position(call, s, row), inv_freq, s.half, kBackward,
                                             r.cs.data(), r.sn.data());
                           for (int64_t g = 0; g < s.g; ++g)
                             for (int64_t h = 0; h + 1 < s.heads; ++h)  // queries, then the key
                               rope_rotate_fast(out + g * width + h * s.d, r.cs.data(), r.sn.data(),
                                                s.half);
                         }
                         round_row(X.dtype, out, k, r.rounding);
                       });
  });
}

LOOM_CPU_FAST_END

// rope's 6 FLOPs a rotated pair (3 an element) plus the quantisation's 2.
LOOM_CPU_HOOKS(rope_fp8_bwd, check_rope_fp8_bwd, 5)

}  // namespace

void add_rope_fp8_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kRopeFp8Bwd, rope_fp8_bwd);
}

}  // namespace loom::kernels::cpu
