// The process grid and its role groups against Megatron-Core's own algorithm: the rank
// groups of RankGenerator (parallel_state.py, generate_masked_orthogonal_rank_groups with
// order "tp-cp-ep-dp-pp"), written out again below as the oracle, for the dense generator
// (ep 1, Megatron's dp = loom's ep x dp) and the experts' generator (tp = etp, cp = 1,
// dp = edp), and the embedding group of its first and last pipeline stage. Every rank of
// several layouts must find its group, with the members in the same order.
#include "core/parallel/grid.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/parallel/roles.h"
#include "core/util/errors.h"

namespace loom::core {
namespace {

using Groups = std::vector<std::vector<int>>;

// Megatron's generate_masked_orthogonal_rank_groups(world, sizes, mask).
Groups megatron_groups(int world, const std::vector<int>& sizes, const std::vector<bool>& mask) {
  auto prefix_product = [](const std::vector<int>& a) {
    std::vector<int> r{1};
    for (int v : a) r.push_back(r.back() * v);
    return r;
  };
  auto decompose = [&](int index, const std::vector<int>& shape) {
    std::vector<int> stride = prefix_product(shape), idx;
    for (size_t i = 0; i < shape.size(); ++i) idx.push_back((index / stride[i]) % shape[i]);
    return idx;
  };
  std::vector<int> masked_shape, unmasked_shape, masked_stride, unmasked_stride;
  std::vector<int> global_stride = prefix_product(sizes);
  for (size_t i = 0; i < sizes.size(); ++i) {
    (mask[i] ? masked_shape : unmasked_shape).push_back(sizes[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(global_stride[i]);
  }
  int group_size = prefix_product(masked_shape).back();
  Groups out;
  for (int g = 0; g < world / group_size; ++g) {
    std::vector<int> gi = decompose(g, unmasked_shape), ranks;
    for (int r = 0; r < group_size; ++r) {
      std::vector<int> ri = decompose(r, masked_shape);
      int rank = 0;
      for (size_t i = 0; i < ri.size(); ++i) rank += ri[i] * masked_stride[i];
      for (size_t i = 0; i < gi.size(); ++i) rank += gi[i] * unmasked_stride[i];
      ranks.push_back(rank);
    }
    out.push_back(ranks);
  }
  return out;
}

// RankGenerator(tp, ep, dp, pp, cp, order="tp-cp-ep-dp-pp").get_ranks(token), token like
// "tp-pp": the dimensions it names are the masked ones.
Groups megatron_ranks(int tp, int cp, int ep, int dp, int pp, const std::string& token) {
  const std::vector<std::string> names = {"tp", "cp", "ep", "dp", "pp"};
  std::vector<int> sizes = {tp, cp, ep, dp, pp};
  std::vector<bool> mask(5, false);
  size_t start = 0;
  while (start <= token.size()) {
    size_t dash = token.find('-', start);
    std::string name = token.substr(start, dash == std::string::npos ? dash : dash - start);
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) mask[i] = true;
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  return megatron_groups(tp * cp * ep * dp * pp, sizes, mask);
}

std::vector<int> group_of(const Groups& groups, int rank) {
  for (const auto& g : groups)
    for (int r : g)
      if (r == rank) return g;
  return {};
}

struct Layout {
  int tp, cp, ep, dp, pp, etp;
};

class GridAgainstMegatron : public ::testing::TestWithParam<Layout> {};

TEST_P(GridAgainstMegatron, EveryRoleGroupIsMegatronsWithTheSameOrder) {
  const Layout l = GetParam();
  const int world = l.tp * l.cp * l.ep * l.dp * l.pp;
  const int etp = l.etp > 0 ? l.etp : l.tp;
  const int edp = world / l.pp / (etp * l.ep);
  // Megatron's dense generator has ep 1 and dp = loom's ep x dp; its experts' generator
  // tp = etp, cp = 1, dp = edp.
  auto dense = [&](const std::string& token) {
    return megatron_ranks(l.tp, l.cp, 1, l.ep * l.dp, l.pp, token);
  };
  auto expert = [&](const std::string& token) {
    return megatron_ranks(etp, 1, l.ep, edp, l.pp, token);
  };
  const std::map<ParallelRole, Groups> want = {
      {ParallelRole::kWorld, dense("tp-cp-dp-pp")}, {ParallelRole::kTensor, dense("tp")},
      {ParallelRole::kContext, dense("cp")},        {ParallelRole::kPipeline, dense("pp")},
      {ParallelRole::kData, dense("cp-dp")},        {ParallelRole::kExpert, expert("ep")},
      {ParallelRole::kExpertTensor, expert("tp")},  {ParallelRole::kExpertData, expert("dp")},
      {ParallelRole::kGradNorm, dense("tp-pp")},    {ParallelRole::kAmax, dense("tp-cp-dp")},
  };
  for (int rank = 0; rank < world; ++rank) {
    ProcessGrid grid({l.tp, l.cp, l.ep, l.dp, l.pp}, rank, l.etp);
    for (const auto& [role, groups] : want) {
      GridGroup g = role_group(grid, role, RoleOptions{});
      EXPECT_EQ(g.ranks, group_of(groups, rank))
          << "rank " << rank << " role " << parallel_role_name(role);
      EXPECT_EQ(g.ranks[static_cast<size_t>(g.rank)], rank) << parallel_role_name(role);
    }
    // With the distributed optimizer the gradient norm spans the data dimensions too.
    EXPECT_EQ(role_group(grid, ParallelRole::kGradNorm, RoleOptions{true}).ranks,
              group_of(dense("tp-cp-dp-pp"), rank));
    // The embedding group: the first and last rank of this rank's pipeline (Megatron's
    // _EMBEDDING_GROUP), or this rank alone on a middle stage and without pp.
    std::vector<int> pipeline = group_of(dense("pp"), rank);
    std::vector<int> embedding = {pipeline.front()};
    if (pipeline.size() > 1) embedding.push_back(pipeline.back());
    if (rank != pipeline.front() && rank != pipeline.back()) embedding = {rank};
    GridGroup e = role_group(grid, ParallelRole::kEmbedding, RoleOptions{});
    EXPECT_EQ(e.ranks, embedding) << "rank " << rank;
    EXPECT_EQ(e.ranks[static_cast<size_t>(e.rank)], rank);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, GridAgainstMegatron,
                         ::testing::Values(Layout{1, 1, 1, 1, 1, 0}, Layout{2, 1, 1, 2, 1, 0},
                                           Layout{2, 2, 1, 2, 2, 0}, Layout{1, 1, 2, 2, 2, 0},
                                           Layout{2, 1, 2, 1, 2, 1}, Layout{4, 1, 2, 2, 1, 2},
                                           Layout{2, 2, 2, 2, 1, 4}, Layout{1, 3, 1, 2, 3, 0}));

TEST(ProcessGrid, OneSetOfRanksHasOneNameWhateverDimensionsOfSizeOneAreAsked) {
  ProcessGrid grid({2, 1, 1, 2, 1}, 3);
  EXPECT_EQ(grid.group("cp,ep,dp").key, grid.group("dp").key);
  EXPECT_EQ(grid.group("dp").key, "dp/1");
  EXPECT_EQ(grid.group("tp,cp,ep,dp,pp").key, grid.group("world").key);
  EXPECT_EQ(grid.group("cp").key, "cp/3");  // a size-1 group keeps its name
  // An expert group is its own communicator, even over a dense group's ranks.
  EXPECT_EQ(grid.expert_group("ep").ranks, grid.group("ep").ranks);
  EXPECT_NE(grid.expert_group("ep").key, grid.group("ep").key);
}

TEST(ProcessGrid, BadDimensionsAndExpertSizesAreRefused) {
  EXPECT_THROW(ProcessGrid({2, 1, 1, 1, 1}, 0).group("tp,xx"), InvalidArgument);
  EXPECT_THROW(ProcessGrid({2, 1, 1, 1, 1}, 0).expert_group("cp"), InvalidArgument);
  try {
    ProcessGrid({2, 1, 2, 1, 1}, 0, 3);
    ADD_FAILURE() << "etp 3 over 4 ranks was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("choose an etp that divides 2"));
  }
}

}  // namespace
}  // namespace loom::core
