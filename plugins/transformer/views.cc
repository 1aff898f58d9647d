#include "plugins/transformer/views.h"

#include <algorithm>

namespace loom::transformer {

void expect(const TensorView& view, std::vector<int64_t> shape, DType dtype, const char* what) {
  bool ok = view.data != nullptr && view.ndim == static_cast<int32_t>(shape.size()) &&
            view.dtype == dtype && is_contiguous(view);
  for (size_t d = 0; ok && d < shape.size(); ++d) ok = shape[d] < 0 || view.shape[d] == shape[d];
  if (ok) return;
  std::string want = "(";
  for (size_t d = 0; d < shape.size(); ++d)
    want += (d ? ", " : "") + (shape[d] < 0 ? std::string("*") : std::to_string(shape[d]));
  want += ")";
  fail(Code::kInvalidArgument,
       detail::concat(what, ": expected a contiguous ", dtype_name(dtype), " tensor ", want,
                      ", got ", view.data == nullptr ? "none" : dtype_name(view.dtype),
                      shape_string(view), is_contiguous(view) ? "" : " (strided)"));
}

TensorView rows(const TensorView& view, int64_t cols) {
  LOOM_CHECK(cols > 0 && numel(view) % cols == 0, "cols=", cols, " numel=", numel(view));
  return make_view(view.data, view.dtype, {numel(view) / cols, cols}, view.device);
}

TensorView allocate_like(IForwardContext& ctx, const TensorView& like, DType dtype) {
  std::vector<int64_t> shape(like.shape, like.shape + like.ndim);
  return allocate_shape(ctx, dtype == DType::kInvalid ? like.dtype : dtype, shape, like.device);
}

TensorView allocate_shape(IForwardContext& ctx, DType dtype, const std::vector<int64_t>& shape,
                          Device device) {
  TensorView out{};
  throw_if_error(
      ctx.allocate(dtype, static_cast<int32_t>(shape.size()), shape.data(), device, &out));
  return out;
}

void save(IForwardContext& ctx, const void* owner, int32_t slot, const TensorView& view) {
  throw_if_error(ctx.save(owner, slot, &view));
}

TensorView load(IForwardContext& ctx, const void* owner, int32_t slot) {
  TensorView out{};
  throw_if_error(ctx.load(owner, slot, &out));
  return out;
}

void expect_count(const char* what, int32_t got, int32_t at_least) {
  if (got < at_least)
    fail(Code::kInvalidArgument,
         detail::concat(what, ": called with ", got, ", needs at least ", at_least));
}

void release_all(IForwardContext& ctx, std::initializer_list<TensorView> tensors,
                 std::initializer_list<TensorView> keep) {
  std::vector<const void*> done;
  for (const TensorView& k : keep) done.push_back(k.data);
  for (const TensorView& t : tensors) {
    if (!present(t) || std::find(done.begin(), done.end(), t.data) != done.end()) continue;
    done.push_back(t.data);
    release(ctx, t);
  }
}

}  // namespace loom::transformer
