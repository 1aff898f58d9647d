#include "core/util/gather_text.h"

#include <algorithm>
#include <cstdint>

#include "loom/cpp/error.h"
#include "loom/cpp/tensor.h"

namespace loom::core {

std::vector<std::string> all_gather_text(ICommunicator& comm, const std::string& text,
                                         const std::string& what) {
  const int32_t n = comm.size();
  if (n == 1) return {text};
  std::vector<int64_t> lengths(static_cast<size_t>(n));
  int64_t length = static_cast<int64_t>(text.size());
  TensorView in = make_view(&length, DType::kI64, {1});
  TensorView out = make_view(lengths.data(), DType::kI64, {n});
  throw_if_error(comm.all_gather(&in, &out, nullptr), what + " (their sizes)");
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::vector<std::string> texts(static_cast<size_t>(n));
  if (longest == 0) return texts;
  std::string padded = text + std::string(static_cast<size_t>(longest - length), ' ');
  std::vector<char> all(static_cast<size_t>(longest * n));
  in = make_view(padded.data(), DType::kU8, {longest});
  out = make_view(all.data(), DType::kU8, {longest * n});
  throw_if_error(comm.all_gather(&in, &out, nullptr), what);
  for (int32_t r = 0; r < n; ++r)
    texts[static_cast<size_t>(r)].assign(all.data() + r * longest,
                                         static_cast<size_t>(lengths[static_cast<size_t>(r)]));
  return texts;
}

}  // namespace loom::core
