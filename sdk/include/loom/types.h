// Value types that cross the plugin boundary: string views, dtypes, devices, tensor views
// and interface versions. All are trivially copyable structs of C types; fields are only
// ever appended.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace loom {

/// A borrowed UTF-8 string: `data` need not be NUL-terminated. Valid for the duration of
/// the call it is passed to, unless the callee documents otherwise.
struct StringView {
  const char* data;  ///< first byte, may be null when size == 0
  size_t size;       ///< length in bytes
};

/// Makes a StringView of a NUL-terminated string (null gives an empty view).
inline StringView make_string_view(const char* text) noexcept {
  size_t n = 0;
  if (text != nullptr)
    while (text[n] != '\0') ++n;
  return StringView{text, n};
}

/// Element types. Values are ABI: only append.
enum class DType : int32_t {
  kInvalid = 0,
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kF8E4M3 = 4,  ///< OCP FP8 E4M3 (fn: finite, no infinities), max 448
  kF8E5M2 = 5,  ///< OCP FP8 E5M2, max 57344
  kF64 = 6,
  kI8 = 7,
  kU8 = 8,
  kI16 = 9,
  kU16 = 10,
  kI32 = 11,
  kI64 = 12,
  kBool = 13,
  kF8E8M0 = 14,  ///< exponent-only scale type of MXFP8 blocks
};

/// Size in bytes of one element of `dtype` (0 for kInvalid or unknown values).
inline size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
    case DType::kU16:
      return 2;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF8E8M0:
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
    case DType::kInvalid:
      return 0;
  }
  return 0;
}

/// The spec's name of a dtype ("f32", "bf16", "fp8_e4m3", ...); "invalid" otherwise.
inline const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF8E4M3:
      return "fp8_e4m3";
    case DType::kF8E5M2:
      return "fp8_e5m2";
    case DType::kF64:
      return "f64";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
    case DType::kI16:
      return "i16";
    case DType::kU16:
      return "u16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kBool:
      return "bool";
    case DType::kF8E8M0:
      return "fp8_e8m0";
    case DType::kInvalid:
      return "invalid";
  }
  return "invalid";
}

/// The dtype whose spec name is `name`: the inverse of dtype_name, e.g.
/// dtype_from_name("bf16") == DType::kBF16. Which dtypes a caller accepts is its own
/// business (parameters take only f32, bf16 and f16): this only maps the name.
/// \param name  a NUL-terminated spec name ("f32", "fp8_e4m3", ...; case-sensitive); may
///              be null
/// \return the dtype, or kInvalid for null or a name that is no dtype's ("invalid" included)
inline DType dtype_from_name(const char* name) noexcept {
  if (name == nullptr) return DType::kInvalid;
  auto same = [](const char* a, const char* b) {
    while (*a != '\0' && *a == *b) ++a, ++b;
    return *a == *b;
  };
  // The values run from 1 without holes (appended only), up to the first without a name:
  // a dtype appended with its name in dtype_name is found without touching this loop.
  for (int32_t value = 1;; ++value) {
    const char* candidate = dtype_name(static_cast<DType>(value));
    if (same(candidate, "invalid")) return DType::kInvalid;
    if (same(name, candidate)) return static_cast<DType>(value);
  }
}

/// Device families. Values are ABI: only append.
enum class DeviceType : int32_t {
  kCpu = 1,
  kCuda = 2,
};

/// A device: family plus ordinal (0 for the CPU).
struct Device {
  DeviceType type;
  int32_t index;
};

/// Maximum rank of a tensor that crosses the boundary.
inline constexpr int32_t kMaxDims = 8;

/// A borrowed, strided view of a tensor's memory. Shapes and strides are in elements;
/// unused trailing entries are zero. The memory belongs to whoever handed out the view
/// (usually the core's allocator); a view never frees anything.
struct TensorView {
  void* data;                 ///< address of element [0, 0, ...]
  DType dtype;                ///< element type
  Device device;              ///< where `data` lives
  int32_t ndim;               ///< number of dimensions, 0..kMaxDims
  int64_t shape[kMaxDims];    ///< extent of each dimension
  int64_t strides[kMaxDims];  ///< elements between neighbours along each dimension
};

/// Number of elements of `view` (1 for a scalar, ndim == 0).
inline int64_t numel(const TensorView& view) noexcept {
  int64_t n = 1;
  for (int32_t i = 0; i < view.ndim; ++i) n *= view.shape[i];
  return n;
}

/// True when `view` is densely packed in row-major order.
inline bool is_contiguous(const TensorView& view) noexcept {
  int64_t expected = 1;
  for (int32_t i = view.ndim - 1; i >= 0; --i) {
    if (view.shape[i] != 1 && view.strides[i] != expected) return false;
    expected *= view.shape[i];
  }
  return true;
}

/// Identifies an interface and its version, TensorRT style: the core refuses an object
/// whose kind differs from the slot it fills or whose major differs from the core's.
struct InterfaceInfo {
  const char* kind;  ///< static string, e.g. "attention"
  int32_t major;     ///< changes break callers
  int32_t minor;     ///< methods appended
};

/// Severity for IHost::log.
enum class LogLevel : int32_t {
  kDebug = 0,
  kInfo = 1,
  kWarning = 2,
  kError = 3,
};

}  // namespace loom
