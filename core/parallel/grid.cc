#include "core/parallel/grid.h"

#include <fmt/format.h>

#include "core/util/errors.h"

namespace loom::core {

ProcessGrid::ProcessGrid(std::array<int, 5> sizes, int rank) : sizes_(sizes), rank_(rank) {
  for (size_t d = 0; d < kDims.size(); ++d) {
    if (sizes_[d] < 1)
      throw InvalidArgument(fmt::format("process grid: {} = {} must be >= 1", kDims[d], sizes_[d]));
    world_ *= sizes_[d];
  }
  if (rank < 0 || rank >= world_)
    throw InvalidArgument(
        fmt::format("process grid: rank {} is outside the world of {} ranks", rank, world_));
  int rest = rank;
  for (size_t d = 0; d < kDims.size(); ++d) {
    coords_[d] = rest % sizes_[d];
    rest /= sizes_[d];
  }
}

int ProcessGrid::index_of(const std::string& dim) const {
  for (size_t d = 0; d < kDims.size(); ++d)
    if (dim == kDims[d]) return static_cast<int>(d);
  throw InvalidArgument(fmt::format(
      "process grid: unknown dimension '{}' (the dimensions are tp, cp, ep, dp, pp)", dim));
}

int ProcessGrid::size(const std::string& dim) const { return sizes_[index_of(dim)]; }
int ProcessGrid::coord(const std::string& dim) const { return coords_[index_of(dim)]; }

GridGroup ProcessGrid::group(const std::string& dims) const {
  std::array<bool, 5> in{};
  if (dims == "world") {
    in.fill(true);
  } else {
    size_t start = 0;
    while (start <= dims.size()) {
      size_t comma = dims.find(',', start);
      std::string name = dims.substr(start, comma == std::string::npos ? comma : comma - start);
      if (!name.empty()) in[index_of(name)] = true;
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  GridGroup g;
  for (size_t d = 0; d < kDims.size(); ++d)
    if (in[d]) g.dims += (g.dims.empty() ? "" : ",") + std::string(kDims[d]);
  if (g.dims.empty()) throw InvalidArgument("process grid: a group needs at least one dimension");
  // The group's index: the coordinates of the dimensions outside it, linearised.
  int index = 0, stride = 1;
  for (size_t d = 0; d < kDims.size(); ++d)
    if (!in[d]) {
      index += coords_[d] * stride;
      stride *= sizes_[d];
    }
  g.key = fmt::format("{}/{}", g.dims, index);
  // Members: vary the group's dimensions (first one fastest), keep the others.
  int members = 1;
  for (size_t d = 0; d < kDims.size(); ++d)
    if (in[d]) members *= sizes_[d];
  for (int m = 0; m < members; ++m) {
    std::array<int, 5> c = coords_;
    int rest = m;
    for (size_t d = 0; d < kDims.size(); ++d)
      if (in[d]) {
        c[d] = rest % sizes_[d];
        rest /= sizes_[d];
      }
    int r = 0, s = 1;
    for (size_t d = 0; d < kDims.size(); ++d) {
      r += c[d] * s;
      s *= sizes_[d];
    }
    if (r == rank_) g.rank = m;
    g.ranks.push_back(r);
  }
  return g;
}

std::string ProcessGrid::describe() const {
  std::string s;
  for (size_t d = 0; d < kDims.size(); ++d)
    s += fmt::format("{}{}={}", d ? " " : "", kDims[d], sizes_[d]);
  return s;
}

}  // namespace loom::core
