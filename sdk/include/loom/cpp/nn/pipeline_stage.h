// Which layers a pipeline stage owns: the one rule every model plugin follows, so that a
// layout means the same in every model (kinds/model.h, ModelInfo::layer_begin/layer_end).
//
// The core hands a model built as a stage the inherited option
//   "pipeline": {"rank": r, "size": P, "chunk": c, "chunks": V,
//                "layout": "...",                      (optional, Megatron's layout string)
//                "first_stage_layers": n, "last_stage_layers": n,        (optional)
//                "account_for_embedding": bool, "account_for_loss": bool} (optional)
// Chunk c of rank r is virtual stage s = c * P + r of S = P * V; layers are numbered in the
// order of the virtual stages, so stage s owns [sum of the counts of stages < s, + its own).
// The counts per virtual stage come from, in this order:
//
//   layout    Megatron's --pipeline-model-parallel-layout: commas are dropped, "(X)*n"
//             repeats X n times (no nesting), "c*n" repeats the character c, "|" cuts the
//             stages (empty stages are allowed: they pass their input through). Symbols: E
//             the embedding (first element, once), t a decoder layer, L the loss and output
//             layer (last element, once); m (multi-token prediction) is not available yet.
//             S stages must be P * V (V is inferred by the core when parallel.vpp is 1), and
//             the t's must be the model's layers. E.g. "Et*3|(tt|)*29,m|L" is Megatron's own.
//   first_stage_layers / last_stage_layers
//             Megatron's --num-layers-in-first/last-pipeline-stage: the first (last) rank
//             holds that many layers over its V chunks (a multiple of V, at least V); the
//             other ranks split the rest evenly, each chunk an equal share.
//   account_for_embedding / account_for_loss
//             the embedding (the loss) counts as one layer of the even split: num_layers
//             plus those must divide into S stages, and the first (last) stage holds one layer
//             fewer.
//   otherwise an even split: num_layers / S layers per stage.
//
// Every rule broken is an error naming the rule ("/pipeline: ..." at the model's node, or
// "#/parallel/...: ..." at the option the user set).
#pragma once

#include <loom/cpp/error.h>

#include <cctype>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

namespace loom::nn {

/// Expands Megatron's layout string into its stages (each a string of E, t, m, L), without
/// checking what they hold. Throws kInvalidArgument "#/parallel/pipeline_layout: ..." for a
/// malformed string (a symbol other than E t m L | ( ) * , and digits, a count that is not
/// a number, nested parentheses).
inline std::vector<std::string> expand_pipeline_layout(const std::string& text) {
  const std::string where = "#/parallel/pipeline_layout: '" + text + "' ";
  std::string s;
  for (char ch : text)
    if (ch != ',' && !std::isspace(static_cast<unsigned char>(ch))) s += ch;
  // (X)*n first (one pass, no nesting), then c*n.
  static const std::regex group(R"(\(([^()]*)\)\*([0-9]+))");
  std::string out;
  std::sregex_iterator it(s.begin(), s.end(), group), end;
  size_t last = 0;
  for (; it != end; ++it) {
    out += s.substr(last, static_cast<size_t>(it->position()) - last);
    const long n = std::stol((*it)[2].str());
    for (long i = 0; i < n; ++i) out += (*it)[1].str();
    last = static_cast<size_t>(it->position() + it->length());
  }
  out += s.substr(last);
  if (out.find_first_of("()") != std::string::npos)
    fail(Code::kInvalidArgument,
         where + "has parentheses that are not a group \"(X)*n\" (groups do not nest)");
  std::string flat;
  for (size_t i = 0; i < out.size(); ++i) {
    if (i + 1 < out.size() && out[i + 1] == '*') {
      size_t j = i + 2;
      while (j < out.size() && std::isdigit(static_cast<unsigned char>(out[j]))) ++j;
      if (j == i + 2)
        fail(Code::kInvalidArgument, where + "has '*' without a count after '" + out[i] + "'");
      flat += std::string(static_cast<size_t>(std::stol(out.substr(i + 2, j - i - 2))), out[i]);
      i = j - 1;
      continue;
    }
    const char ch = out[i];
    if (ch != 'E' && ch != 't' && ch != 'm' && ch != 'L' && ch != '|')
      fail(Code::kInvalidArgument, where + "has '" + std::string(1, ch) +
                                       "': the symbols are E (embedding), t (decoder layer), "
                                       "m (MTP layer), L (loss) and | between stages");
    flat += ch;
  }
  std::vector<std::string> stages(1);
  for (char ch : flat) {
    if (ch == '|')
      stages.emplace_back();
    else
      stages.back() += ch;
  }
  return stages;
}

/// Layers per virtual stage (S = size * chunks entries, in virtual-stage order) for a model
/// of `num_layers` layers, from the "pipeline" option described above. Throws
/// kInvalidArgument naming the rule broken.
inline std::vector<int64_t> pipeline_stage_layers(const nlohmann::json& pipeline,
                                                  int64_t num_layers) {
  auto integer = [&](const char* key, int64_t fallback) {
    auto it = pipeline.find(key);
    if (it == pipeline.end() || it->is_null()) return fallback;
    if (!it->is_number_integer())
      fail(Code::kInvalidArgument, std::string("/pipeline/") + key + ": expected an integer, got " +
                                       it->dump());
    return it->get<int64_t>();
  };
  const int64_t p = integer("size", 1), v = integer("chunks", 1), stages = p * v;
  const std::string n = std::to_string(num_layers);
  std::vector<int64_t> counts(static_cast<size_t>(stages), 0);
  if (pipeline.contains("layout") && pipeline["layout"].is_string()) {
    const std::string text = pipeline["layout"].get<std::string>();
    const std::string where = "#/parallel/pipeline_layout: '" + text + "' ";
    std::vector<std::string> parts = expand_pipeline_layout(text);
    if (static_cast<int64_t>(parts.size()) != stages)
      fail(Code::kInvalidArgument,
           where + "has " + std::to_string(parts.size()) + " stages, but parallel.pp " +
               std::to_string(p) + " x " + std::to_string(v) +
               " virtual chunks make " + std::to_string(stages) +
               " (the stages must be a multiple of parallel.pp)");
    std::string all;
    for (const std::string& part : parts) all += part;
    if (all.empty() || all.front() != 'E' || all.find('E', 1) != std::string::npos)
      fail(Code::kInvalidArgument, where + "must start with E (the embedding) and hold it once");
    if (all.back() != 'L' || all.find('L') != all.size() - 1)
      fail(Code::kInvalidArgument, where + "must end with L (the loss) and hold it once");
    if (all.find('m') != std::string::npos)
      fail(Code::kInvalidArgument,
           where + "places m (multi-token prediction) layers, which this model does not have");
    int64_t layers = 0;
    for (int64_t s = 0; s < stages; ++s) {
      for (char ch : parts[static_cast<size_t>(s)])
        if (ch == 't') ++counts[static_cast<size_t>(s)];
      layers += counts[static_cast<size_t>(s)];
    }
    if (layers != num_layers)
      fail(Code::kInvalidArgument, where + "places " + std::to_string(layers) +
                                       " decoder layers (t), but the model has " + n +
                                       " (/model/num_layers)");
    return counts;
  }
  const int64_t first = integer("first_stage_layers", -1), last = integer("last_stage_layers", -1);
  if (first >= 0 || last >= 0) {
    if (p < 2)
      fail(Code::kInvalidArgument,
           "#/parallel/num_layers_in_first_pipeline_stage: uneven first or last stages need "
           "parallel.pp > 1");
    for (auto [count, key] : {std::pair{first, "first"}, std::pair{last, "last"}})
      if (count >= 0 && (count < v || count % v != 0))
        fail(Code::kInvalidArgument,
             std::string("#/parallel/num_layers_in_") + key + "_pipeline_stage: " +
                 std::to_string(count) + " layers must be a positive multiple of the " +
                 std::to_string(v) + " virtual chunks per rank");
    const int64_t middle_ranks = p - (first >= 0 ? 1 : 0) - (last >= 0 ? 1 : 0);
    const int64_t middle = num_layers - std::max<int64_t>(first, 0) - std::max<int64_t>(last, 0);
    if (middle < 0 || (middle_ranks == 0 && middle != 0) ||
        (middle_ranks > 0 && middle % (middle_ranks * v) != 0))
      fail(Code::kInvalidArgument,
           "#/parallel/num_layers_in_first_pipeline_stage: the " + n + " layers less the first "
           "and last stages' leave " + std::to_string(middle) + " for " +
               std::to_string(middle_ranks) + " other ranks x " + std::to_string(v) +
               " chunks, which do not split evenly");
    for (int64_t s = 0; s < stages; ++s) {
      const int64_t rank = s % p;
      counts[static_cast<size_t>(s)] =
          rank == 0 && first >= 0       ? first / v
          : rank == p - 1 && last >= 0  ? last / v
                                        : middle / (middle_ranks * v);
    }
    return counts;
  }
  auto flag = [&](const char* key) { return pipeline.value(key, false); };
  const bool embedding = flag("account_for_embedding"), loss = flag("account_for_loss");
  const int64_t slots = num_layers + (embedding ? 1 : 0) + (loss ? 1 : 0);
  if (slots % stages != 0)
    fail(Code::kInvalidArgument,
         std::string("/num_layers: ") + n + " layers" +
             (embedding || loss ? " (plus the embedding and/or loss counted as layers)" : "") +
             " do not split evenly over " + std::to_string(p) + " pipeline stages x " +
             std::to_string(v) + " virtual chunks; choose a multiple of " +
             std::to_string(stages) +
             " or an uneven split (parallel.pipeline_layout, parallel.num_layers_in_first/"
             "last_pipeline_stage)");
  for (int64_t s = 0; s < stages; ++s) counts[static_cast<size_t>(s)] = slots / stages;
  if (embedding) --counts.front();
  if (loss) --counts.back();
  return counts;
}

}  // namespace loom::nn
