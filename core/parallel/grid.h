// ProcessGrid: the ranks of a run arranged on named dimensions, in Megatron's order
// tp, cp, ep, dp, pp (tp varies fastest), as Megatron-Core's HyperCommGrid does
// (DESIGN.md section 5). It answers, for any combination of dimensions, which ranks form
// this rank's group, this rank's place in it, and a key that names the group on every rank.
//
// Experts see the same ranks on their own dimensions etp, ep, edp, pp (Megatron's "parallel
// folding", RankGenerator with tp = etp, cp = 1, dp = edp): etp x ep x edp covers the
// tp x cp x ep x dp ranks of one pipeline stage, etp varies fastest. With etp = tp and cp = 1
// the experts' ep and edp groups are the dense grid's ep and dp groups.
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
  /// The same, with `expert_tp` (etp) ranks splitting each expert: it must divide
  /// tp x cp x ep x dp / ep; throws naming the rule otherwise.
  ProcessGrid(std::array<int, 5> sizes, int rank, int expert_tp);

  int world_size() const { return world_; }
  int rank() const { return rank_; }
  /// Size of dimension `dim` ("tp", ...); throws on an unknown name.
  int size(const std::string& dim) const;
  /// This rank's coordinate along `dim`.
  int coord(const std::string& dim) const;
  /// The group of this rank spanning `dims`: a comma-separated list of dimension names in
  /// any order ("dp", "tp,dp", "world" for every rank). Throws on an unknown name, naming it.
  /// Dimensions of size 1 are left out of the group's canonical `dims` and `key` (so "cp,dp"
  /// with cp = 1 is the "dp" group), unless every one is 1.
  GridGroup group(const std::string& dims) const;
  /// The group of this rank on the experts' dimensions ("etp", "ep", "edp", "pp", in any
  /// order and combination); its key starts with "expert:" (an expert group is its own
  /// communicator, even where its ranks are those of a dense group).
  GridGroup expert_group(const std::string& dims) const;
  /// The first and the last pipeline stage of this rank's pipeline (the same coordinates on
  /// every other dimension), in that order: where tied embeddings are summed. This rank alone
  /// when pp is 1, and on a middle stage (which holds no embedding).
  GridGroup embedding_group() const;
  /// Ranks splitting each expert (etp), experts' ep, and expert replicas (edp).
  int expert_tp() const { return expert_sizes_[0]; }
  int expert_dp() const { return expert_sizes_[2]; }
  /// "tp=2 cp=1 ep=1 dp=2 pp=1".
  std::string describe() const;

 private:
  int index_of(const std::string& dim) const;
  // The group spanning the dimensions marked `in` of a grid with `sizes` and this rank's
  // `coords` (the rank is linear in them, the first varying fastest); `names` name them.
  GridGroup make_group(const std::array<bool, 5>& in, const std::array<int, 5>& sizes,
                       const std::array<int, 5>& coords, const std::array<const char*, 5>& names,
                       int ndims, const std::string& prefix) const;
  std::array<int, 5> sizes_;
  std::array<int, 5> coords_;
  // The experts' grid: etp, ep, edp, pp (the fifth entry unused, 1).
  std::array<int, 5> expert_sizes_{1, 1, 1, 1, 1};
  std::array<int, 5> expert_coords_{};
  int world_ = 1;
  int rank_ = 0;
};

}  // namespace loom::core
