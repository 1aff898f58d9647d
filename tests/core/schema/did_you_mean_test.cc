#include "core/schema/did_you_mean.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace loom::core {
namespace {

TEST(EditDistance, CountsEachEditOnce) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("layer", "layer"), 0u);
  EXPECT_EQ(edit_distance("layr", "layer"), 1u);    // insertion
  EXPECT_EQ(edit_distance("layers", "layer"), 1u);  // deletion
  EXPECT_EQ(edit_distance("lazer", "layer"), 1u);   // substitution
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

TEST(EditDistance, AdjacentSwapCostsOne) {
  EXPECT_EQ(edit_distance("layre", "layer"), 1u);
  EXPECT_EQ(edit_distance("stpes", "steps"), 1u);
  EXPECT_EQ(edit_distance("ab", "ba"), 1u);
  // Optimal string alignment: a swapped pair is not edited again.
  EXPECT_EQ(edit_distance("ca", "abc"), 3u);
}

TEST(DidYouMean, SuggestsTheClosestCandidate) {
  const std::vector<std::string> keys = {"layer", "embedding", "norm", "num_layers"};
  EXPECT_EQ(did_you_mean("layre", keys), " (did you mean 'layer'?)");
  EXPECT_EQ(did_you_mean("embeding", keys), " (did you mean 'embedding'?)");
  EXPECT_EQ(did_you_mean("nrom", keys), " (did you mean 'norm'?)");
  EXPECT_EQ(did_you_mean("num_layer", keys), " (did you mean 'num_layers'?)");
}

TEST(DidYouMean, PrefersTheSmallerDistanceThenTheEarlierCandidate) {
  EXPECT_EQ(did_you_mean("cosin", {"linear", "cosine", "cosines"}), " (did you mean 'cosine'?)");
  EXPECT_EQ(did_you_mean("ab", {"ax", "xb"}), " (did you mean 'ax'?)");
  EXPECT_EQ(did_you_mean("ab", {"xb", "ax"}), " (did you mean 'xb'?)");
}

TEST(DidYouMean, ThresholdIsTwoOrAThirdOfTheLength) {
  // Short words: up to 2 edits.
  EXPECT_EQ(did_you_mean("lrate", {"lr_rate"}), " (did you mean 'lr_rate'?)");
  EXPECT_EQ(did_you_mean("lrat", {"lr_rate"}), "");  // 3 edits
  // 12 characters: up to 4 edits (12 / 3).
  EXPECT_EQ(did_you_mean("warmup_stuff", {"warmup_steps"}), " (did you mean 'warmup_steps'?)");
  EXPECT_EQ(did_you_mean("warmup_xxxxx", {"warmup_steps"}), "");  // 5 edits
}

TEST(DidYouMean, NothingForUnrelatedWordsOrNoCandidates) {
  EXPECT_EQ(did_you_mean("optimizer", {"model", "train", "data"}), "");
  EXPECT_EQ(did_you_mean("x", {}), "");
  // A total rewrite is within two edits of a two-letter word but is not a typo of it.
  EXPECT_EQ(did_you_mean("ab", {"xy"}), "");
  EXPECT_EQ(did_you_mean("a", {"b"}), "");
  // An exact match is not a suggestion.
  EXPECT_EQ(did_you_mean("norm", {"norm"}), "");
  EXPECT_EQ(did_you_mean("norm", {"norm", "form"}), " (did you mean 'form'?)");
}

TEST(JoinNames, QuotesAndJoinsWithOr) {
  EXPECT_EQ(join_names({}), "");
  EXPECT_EQ(join_names({"a"}), "'a'");
  EXPECT_EQ(join_names({"a", "b"}), "'a' or 'b'");
  EXPECT_EQ(join_names({"a", "b", "c"}), "'a', 'b' or 'c'");
  EXPECT_EQ(join_names({"adam", "sgd", "lion", "muon"}), "'adam', 'sgd', 'lion' or 'muon'");
}

}  // namespace
}  // namespace loom::core
