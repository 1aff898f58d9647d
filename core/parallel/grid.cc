#include "core/parallel/grid.h"

#include <fmt/format.h>

#include "core/util/errors.h"

namespace loom::core {
namespace {

constexpr std::array<const char*, 5> kExpertDims = {"etp", "ep", "edp", "pp", ""};

// Marks the dimensions of `dims` ("a,b", "world") among `names` (the first `ndims`).
std::array<bool, 5> parse_dims(const std::string& dims, const std::array<const char*, 5>& names,
                               int ndims, const char* grid) {
  std::array<bool, 5> in{};
  if (dims == "world") {
    for (int d = 0; d < ndims; ++d) in[static_cast<size_t>(d)] = true;
    return in;
  }
  size_t start = 0;
  while (start <= dims.size()) {
    size_t comma = dims.find(',', start);
    std::string name = dims.substr(start, comma == std::string::npos ? comma : comma - start);
    if (!name.empty()) {
      int found = -1;
      for (int d = 0; d < ndims; ++d)
        if (name == names[static_cast<size_t>(d)]) found = d;
      if (found < 0) {
        std::string all;
        for (int d = 0; d < ndims; ++d) all += (d ? ", " : "") + std::string(names[d]);
        throw InvalidArgument(fmt::format(
            "process grid: unknown {}dimension '{}' (the dimensions are {})", grid, name, all));
      }
      in[static_cast<size_t>(found)] = true;
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return in;
}

}  // namespace

ProcessGrid::ProcessGrid(std::array<int, 5> sizes, int rank) : ProcessGrid(sizes, rank, 0) {}

ProcessGrid::ProcessGrid(std::array<int, 5> sizes, int rank, int expert_tp)
    : sizes_(sizes), rank_(rank) {
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
  // The experts' grid over the same ranks of a pipeline stage: etp x ep x edp = tp x cp x ep
  // x dp (etp defaults to tp, as Megatron's --expert-tensor-parallel-size).
  const int etp = expert_tp > 0 ? expert_tp : sizes_[0];
  const int ep = sizes_[2], stage = world_ / sizes_[4];
  if (stage % (etp * ep) != 0)
    throw InvalidArgument(fmt::format(
        "process grid: expert tensor parallel {} x expert parallel {} does not divide the {} "
        "ranks of a pipeline stage (tp x cp x ep x dp); choose an etp that divides {}",
        etp, ep, stage, stage / ep));
  expert_sizes_ = {etp, ep, stage / (etp * ep), sizes_[4], 1};
  rest = rank;
  for (size_t d = 0; d < 4; ++d) {
    expert_coords_[d] = rest % expert_sizes_[d];
    rest /= expert_sizes_[d];
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
  std::array<const char*, 5> names = kDims;
  return make_group(parse_dims(dims, names, 5, ""), sizes_, coords_, names, 5, "");
}

GridGroup ProcessGrid::expert_group(const std::string& dims) const {
  return make_group(parse_dims(dims, kExpertDims, 4, "expert "), expert_sizes_, expert_coords_,
                    kExpertDims, 4, "expert:");
}

GridGroup ProcessGrid::make_group(const std::array<bool, 5>& wanted,
                                  const std::array<int, 5>& sizes, const std::array<int, 5>& coords,
                                  const std::array<const char*, 5>& names, int ndims,
                                  const std::string& prefix) const {
  // Dimensions of size 1 change nothing about the members: leave them out of the name, so
  // that one set of ranks has one name (unless every requested one is 1).
  std::array<bool, 5> in{};
  bool any = false;
  for (int d = 0; d < ndims; ++d) any = any || wanted[d];
  if (!any) throw InvalidArgument("process grid: a group needs at least one dimension");
  for (int d = 0; d < ndims; ++d) in[d] = wanted[d] && sizes[d] > 1;
  bool all_one = true;
  for (int d = 0; d < ndims; ++d) all_one = all_one && !in[d];
  if (all_one)  // keep the first requested dimension: a size-1 group still has a name
    for (int d = 0; d < ndims; ++d)
      if (wanted[d]) {
        in[d] = true;
        break;
      }
  GridGroup g;
  for (int d = 0; d < ndims; ++d)
    if (in[d]) g.dims += (g.dims.empty() ? "" : ",") + std::string(names[d]);
  // The group's index: the coordinates of the dimensions outside it, linearised.
  int index = 0, stride = 1;
  for (int d = 0; d < ndims; ++d)
    if (!in[d]) {
      index += coords[d] * stride;
      stride *= sizes[d];
    }
  g.key = fmt::format("{}{}/{}", prefix, g.dims, index);
  // Members: vary the group's dimensions (first one fastest), keep the others.
  int members = 1;
  for (int d = 0; d < ndims; ++d)
    if (in[d]) members *= sizes[d];
  for (int m = 0; m < members; ++m) {
    std::array<int, 5> c = coords;
    int rest = m;
    for (int d = 0; d < ndims; ++d)
      if (in[d]) {
        c[d] = rest % sizes[d];
        rest /= sizes[d];
      }
    int r = 0, s = 1;
    for (int d = 0; d < ndims; ++d) {
      r += c[d] * s;
      s *= sizes[d];
    }
    if (r == rank_) g.rank = m;
    g.ranks.push_back(r);
  }
  return g;
}

GridGroup ProcessGrid::embedding_group() const {
  GridGroup pipeline = group("pp");
  GridGroup g;
  g.dims = "embedding";
  int first = pipeline.ranks.front(), last = pipeline.ranks.back();
  if (rank_ != first && rank_ != last) {  // a middle stage holds no embedding: alone
    g.key = fmt::format("embedding/alone-{}", rank_);
    g.ranks = {rank_};
    return g;
  }
  // Named by the pipeline it belongs to: the coordinates outside pp.
  g.key = "embedding/" + pipeline.key.substr(pipeline.key.find('/') + 1);
  g.ranks.push_back(first);
  if (last != first) g.ranks.push_back(last);
  g.rank = rank_ == first ? 0 : 1;
  return g;
}

std::string ProcessGrid::describe() const {
  std::string s;
  for (size_t d = 0; d < kDims.size(); ++d)
    s += fmt::format("{}{}={}", d ? " " : "", kDims[d], sizes_[d]);
  if (expert_sizes_[0] != sizes_[0] || sizes_[1] != 1)
    s += fmt::format(" (experts: etp={} ep={} edp={})", expert_sizes_[0], expert_sizes_[1],
                     expert_sizes_[2]);
  return s;
}

}  // namespace loom::core
