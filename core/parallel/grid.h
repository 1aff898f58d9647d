// ProcessGrid: the ranks of a run arranged on named dimensions, in Megatron's order
// tp, cp, ep, dp, pp (tp varies fastest), as Megatron-Core's HyperCommGrid does
// (DESIGN.md section 5). It answers, for any combination of dimensions, which ranks form
// this rank's group, this rank's place in it, and a key that names the group on every rank.
//
// The grid is a value handed to components; there is no global grid.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::core {

/// One process group of the grid, as seen from one rank.
struct GridGroup {
  std::string dims;        ///< canonical dimension list, e.g. "tp,dp" (grid order)
  std::string key;         ///< unique on the grid, the same on every member: "tp,dp/3"
  std::vector<int> ranks;  ///< global ranks of the members, in group-rank order
  int rank = 0;            ///< this rank's index in `ranks`
  int size() const { return static_cast<int>(ranks.size()); }
};

class ProcessGrid {
 public:
  /// The dimension names, in order (tp varies fastest).
  static constexpr std::array<const char*, 5> kDims = {"tp", "cp", "ep", "dp", "pp"};

  /// \param sizes  the size of each dimension of kDims, each >= 1
  /// \param rank   this process's global rank, in [0, product of sizes)
  ProcessGrid(std::array<int, 5> sizes, int rank);

  int world_size() const { return world_; }
  int rank() const { return rank_; }
  /// Size of dimension `dim` ("tp", ...); throws on an unknown name.
  int size(const std::string& dim) const;
  /// This rank's coordinate along `dim`.
  int coord(const std::string& dim) const;
  /// The group of this rank spanning `dims`: a comma-separated list of dimension names in
  /// any order ("dp", "tp,dp", "world" for every rank). Throws on an unknown name, naming it.
  GridGroup group(const std::string& dims) const;
  /// "tp=2 cp=1 ep=1 dp=2 pp=1".
  std::string describe() const;

 private:
  int index_of(const std::string& dim) const;
  std::array<int, 5> sizes_;
  std::array<int, 5> coords_;
  int world_ = 1;
  int rank_ = 0;
};

}  // namespace loom::core
