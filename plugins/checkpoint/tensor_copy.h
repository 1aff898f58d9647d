// Copying N-d regions between strided arrays, converting f32 / bf16 / f16 on the way, and
// the box arithmetic of slices (where a saved slice and a requested one overlap).
//
// Coordinates are global: an array covers the box [origin, origin + shape) of the whole
// tensor, and a region is copied between two arrays that both contain it.
#pragma once

#include <loom/sdk.h>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::checkpoint {

/// A hyper-rectangle [start, start + size) of an N-d tensor (N = ndim, 0 for a scalar).
struct Box {
  int32_t ndim = 0;
  int64_t start[kMaxDims] = {};
  int64_t size[kMaxDims] = {};
};

/// Elements in `box` (1 for a scalar).
int64_t volume(const Box& box);
/// The overlap of `a` and `b` (same ndim); false when it is empty.
bool intersect(const Box& a, const Box& b, Box* overlap);
/// "[0:4, 8:16]" for messages.
std::string box_text(const Box& box);
/// "[4, 16]" for messages.
std::string shape_text(const int64_t* shape, int32_t ndim);
std::string shape_text(const std::vector<int64_t>& shape);

/// One side of a copy: `data` holds the box starting at `origin` with element strides
/// `strides` (a contiguous array: strides of its shape), in `dtype`.
struct Strided {
  void* data;
  DType dtype;
  int32_t ndim;
  int64_t origin[kMaxDims];
  int64_t strides[kMaxDims];
};

/// A contiguous array of `shape` whose element [0, ...] sits at global `origin`.
Strided contiguous(const void* data, DType dtype, const int64_t* origin, const int64_t* shape,
                   int32_t ndim);

/// True when values of dtype `from` can be stored as `to`: equal dtypes (bytes are copied),
/// or both of f32, bf16, f16 (round to nearest even).
bool convertible(DType from, DType to);

/// Copies the elements of `region` from `src` to `dst` (both contain it), converting the
/// dtype (convertible() must hold).
void copy_region(const Strided& src, const Strided& dst, const Box& region);

/// Converts `count` contiguous elements of `from` at `src` to `to` at `dst`.
void convert(const void* src, DType from, void* dst, DType to, int64_t count);

}  // namespace loom::checkpoint
