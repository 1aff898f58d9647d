#include "plugins/checkpoint/tensor_copy.h"

#include <loom/cpp/half.h>

#include <algorithm>
#include <cstring>

namespace loom::checkpoint {
namespace {

bool is_float(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

float load(const unsigned char* p, DType d) {
  uint16_t h;
  switch (d) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kBF16:
      std::memcpy(&h, p, 2);
      return bf16_to_f32(h);
    default:
      std::memcpy(&h, p, 2);
      return f16_to_f32(h);
  }
}

void store(unsigned char* p, DType d, float f) {
  uint16_t h;
  switch (d) {
    case DType::kF32:
      std::memcpy(p, &f, 4);
      return;
    case DType::kBF16:
      h = f32_to_bf16(f);
      break;
    default:
      h = f32_to_f16(f);
      break;
  }
  std::memcpy(p, &h, 2);
}

// Copies `n` elements with element strides `ss` / `ds` (in elements).
void copy_line(const unsigned char* s, DType sd, int64_t ss, unsigned char* d, DType dd, int64_t ds,
               int64_t n) {
  const size_t se = dtype_size(sd), de = dtype_size(dd);
  if (sd == dd && ss == 1 && ds == 1) {
    std::memcpy(d, s, static_cast<size_t>(n) * se);
  } else if (sd == dd) {
    for (int64_t i = 0; i < n; ++i) std::memcpy(d + i * ds * de, s + i * ss * se, se);
  } else {
    for (int64_t i = 0; i < n; ++i) store(d + i * ds * de, dd, load(s + i * ss * se, sd));
  }
}

}  // namespace

int64_t volume(const Box& box) {
  int64_t n = 1;
  for (int32_t i = 0; i < box.ndim; ++i) n *= box.size[i];
  return n;
}

bool intersect(const Box& a, const Box& b, Box* overlap) {
  Box o;
  o.ndim = a.ndim;
  for (int32_t i = 0; i < a.ndim; ++i) {
    int64_t lo = std::max(a.start[i], b.start[i]);
    int64_t hi = std::min(a.start[i] + a.size[i], b.start[i] + b.size[i]);
    if (hi <= lo) return false;
    o.start[i] = lo;
    o.size[i] = hi - lo;
  }
  *overlap = o;
  return true;
}

std::string box_text(const Box& box) {
  std::string s = "[";
  for (int32_t i = 0; i < box.ndim; ++i)
    s += (i ? ", " : "") + std::to_string(box.start[i]) + ":" +
         std::to_string(box.start[i] + box.size[i]);
  return s + "]";
}

std::string shape_text(const int64_t* shape, int32_t ndim) {
  std::string s = "[";
  for (int32_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string shape_text(const std::vector<int64_t>& shape) {
  return shape_text(shape.data(), static_cast<int32_t>(shape.size()));
}

Strided contiguous(const void* data, DType dtype, const int64_t* origin, const int64_t* shape,
                   int32_t ndim) {
  Strided s{const_cast<void*>(data), dtype, ndim, {}, {}};
  int64_t stride = 1;
  for (int32_t i = ndim - 1; i >= 0; --i) {
    s.origin[i] = origin[i];
    s.strides[i] = stride;
    stride *= shape[i];
  }
  return s;
}

bool convertible(DType from, DType to) { return from == to || (is_float(from) && is_float(to)); }

void copy_region(const Strided& src, const Strided& dst, const Box& region) {
  LOOM_CHECK(convertible(src.dtype, dst.dtype), dtype_name(src.dtype), " -> ",
             dtype_name(dst.dtype));
  if (volume(region) == 0) return;
  const auto* s = static_cast<const unsigned char*>(src.data);
  auto* d = static_cast<unsigned char*>(dst.data);
  const auto se = static_cast<int64_t>(dtype_size(src.dtype));
  const auto de = static_cast<int64_t>(dtype_size(dst.dtype));
  if (region.ndim == 0) {
    copy_line(s, src.dtype, 1, d, dst.dtype, 1, 1);
    return;
  }
  // Odometer over every dimension but the last; the last is one copy_line.
  const int32_t last = region.ndim - 1;
  int64_t index[kMaxDims] = {};
  while (true) {
    int64_t so = 0, doff = 0;
    for (int32_t i = 0; i < region.ndim; ++i) {
      int64_t g = region.start[i] + index[i];
      so += (g - src.origin[i]) * src.strides[i];
      doff += (g - dst.origin[i]) * dst.strides[i];
    }
    copy_line(s + so * se, src.dtype, src.strides[last], d + doff * de, dst.dtype,
              dst.strides[last], region.size[last]);
    int32_t i = last - 1;
    while (i >= 0 && ++index[i] == region.size[i]) index[i--] = 0;
    if (i < 0) return;
  }
}

void convert(const void* src, DType from, void* dst, DType to, int64_t count) {
  copy_line(static_cast<const unsigned char*>(src), from, 1, static_cast<unsigned char*>(dst), to,
            1, count);
}

}  // namespace loom::checkpoint
