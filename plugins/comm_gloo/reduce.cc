#include "plugins/comm_gloo/reduce.h"

#include <loom/cpp/comm_checks.h>
#include <loom/cpp/half.h>
#include <stdint.h>

#include <string>
#include <type_traits>

namespace loom::comm_gloo {
namespace {

struct Sum {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      // Unsigned arithmetic: signed overflow is undefined, and a sum of gradients or
      // counters that wraps should wrap the way NCCL's does, not trap.
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
struct Max {
  // a != a: a NaN on either side stays NaN (a silently dropped NaN hides a divergence).
  template <class T>
  static T apply(T a, T b) {
    return (a > b || a != a) ? a : b;
  }
};
struct Min {
  template <class T>
  static T apply(T a, T b) {
    return (a < b || a != a) ? a : b;
  }
};

template <class T, class Op>
void reduce_plain(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Op::apply(x[i], y[i]);
}

// 16-bit floats: each pair in f32, one rounding per pair (what NCCL does per hop).
template <float (*ToF32)(uint16_t), uint16_t (*FromF32)(float), class Op>
void reduce_half(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = FromF32(Op::apply(ToF32(x[i]), ToF32(y[i])));
}

template <class Op>
ReduceFn for_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return &reduce_plain<float, Op>;
    case DType::kF64:
      return &reduce_plain<double, Op>;
    case DType::kBF16:
      return &reduce_half<&bf16_to_f32, &f32_to_bf16, Op>;
    case DType::kF16:
      return &reduce_half<&f16_to_f32, &f32_to_f16, Op>;
    case DType::kI32:
      return &reduce_plain<int32_t, Op>;
    case DType::kI64:
      return &reduce_plain<int64_t, Op>;
    case DType::kU8:
      return &reduce_plain<uint8_t, Op>;
    default:
      return nullptr;
  }
}

}  // namespace

ReduceFn reduce_function(DType dtype, ReduceOp op, const std::string& what) {
  check_comm_reduction(what, dtype, op, "gloo");
  // for_dtype covers exactly comm_reducible's dtypes.
  ReduceFn fn = op == ReduceOp::kMax   ? for_dtype<Max>(dtype)
                : op == ReduceOp::kMin ? for_dtype<Min>(dtype)
                                       : for_dtype<Sum>(dtype);  // sum, and avg before `scale`
  LOOM_CHECK(fn != nullptr, "no gloo reduction for ", dtype_name(dtype));
  return fn;
}

void scale(void* data, DType dtype, size_t n, double factor) {
  switch (dtype) {
    case DType::kF32: {
      float* p = static_cast<float*>(data);
      const float f = static_cast<float>(factor);
      for (size_t i = 0; i < n; ++i) p[i] *= f;
      return;
    }
    case DType::kF64: {
      double* p = static_cast<double*>(data);
      for (size_t i = 0; i < n; ++i) p[i] *= factor;
      return;
    }
    case DType::kBF16:
    case DType::kF16: {
      uint16_t* p = static_cast<uint16_t*>(data);
      const float f = static_cast<float>(factor);
      const bool bf = dtype == DType::kBF16;
      for (size_t i = 0; i < n; ++i)
        p[i] = bf ? f32_to_bf16(bf16_to_f32(p[i]) * f) : f32_to_f16(f16_to_f32(p[i]) * f);
      return;
    }
    default:
      LOOM_CHECK(false, "scale on non-floating dtype ", dtype_name(dtype));
  }
}

}  // namespace loom::comm_gloo
