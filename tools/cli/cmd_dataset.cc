// loom dataset inspect PREFIX [--show N] [--tokenizer PATH] [--json]
// Opens a Megatron indexed dataset (which validates it) and describes it.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "core/data/indexed_dataset.h"
#include "core/data/tokenizer.h"
#include "core/schema/did_you_mean.h"
#include "core/util/errors.h"
#include "tools/cli/commands.h"

namespace loom::cli {
namespace {

constexpr const char* kInspectUsage =
    "loom dataset inspect PREFIX [--show N] [--tokenizer PATH] [--json]";

// "hello\nworld" -> "hello\\nworld", cut at `limit` bytes.
std::string one_line(const std::string& text, size_t limit) {
  std::string out;
  for (char c : text.substr(0, limit)) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out += c;
    }
  }
  if (text.size() > limit) out += "...";
  return out;
}

int dataset_inspect(const Args& args) {
  const std::string prefix = args.positionals[0];
  int64_t show = args.integer("--show", 5);
  std::unique_ptr<core::Tokenizer> tokenizer;
  if (!args.get("--tokenizer").empty()) tokenizer = core::Tokenizer::load(args.get("--tokenizer"));

  core::IndexedDataset ds(prefix);  // validates the header and every invariant
  const auto lengths = ds.sequence_lengths();
  const auto docs = ds.document_indices();
  int64_t min_len = 0, max_len = 0;
  if (!lengths.empty()) {
    min_len = *std::min_element(lengths.begin(), lengths.end());
    max_len = *std::max_element(lengths.begin(), lengths.end());
  }
  const int64_t width = core::indexed_dtype_size(ds.dtype());
  show = std::min(show, ds.documents());

  // Document d: its sequences' tokens, as ids (and text with --tokenizer).
  auto document_ids = [&](int64_t d) {
    std::vector<int32_t> ids;
    for (int64_t s = docs[d]; s < docs[d + 1]; ++s) {
      std::vector<int32_t> seq = ds.sequence(s);
      ids.insert(ids.end(), seq.begin(), seq.end());
    }
    return ids;
  };

  if (args.flag("--json")) {
    nlohmann::json out = {{"prefix", prefix},
                          {"dtype", core::indexed_dtype_name(ds.dtype())},
                          {"sequences", ds.sequences()},
                          {"documents", ds.documents()},
                          {"tokens", ds.tokens()},
                          {"bin_bytes", ds.tokens() * width},
                          {"min_sequence_length", min_len},
                          {"max_sequence_length", max_len},
                          {"valid", true}};
    nlohmann::json first = nlohmann::json::array();
    for (int64_t d = 0; d < show; ++d) {
      nlohmann::json doc = {{"sequences", docs[d + 1] - docs[d]}};
      std::vector<int32_t> ids = document_ids(d);
      doc["tokens"] = ids.size();
      if (tokenizer) doc["text"] = tokenizer->decode(ids);
      first.push_back(doc);
    }
    out["first_documents"] = first;
    std::printf("%s\n", out.dump(2).c_str());
    return core::kExitOk;
  }

  std::printf("dataset %s: valid\n", prefix.c_str());
  std::printf("  dtype      %s (%lld bytes a token)\n", core::indexed_dtype_name(ds.dtype()),
              static_cast<long long>(width));
  std::printf("  documents  %lld\n", static_cast<long long>(ds.documents()));
  std::printf("  sequences  %lld%s\n", static_cast<long long>(ds.sequences()),
              ds.sequences() == ds.documents() ? " (one per document)" : "");
  std::printf("  tokens     %lld (%.1f MB in .bin)\n", static_cast<long long>(ds.tokens()),
              ds.tokens() * width / 1e6);
  if (!lengths.empty())
    std::printf("  sequence length  min %lld, mean %.1f, max %lld\n",
                static_cast<long long>(min_len), double(ds.tokens()) / double(ds.sequences()),
                static_cast<long long>(max_len));
  if (show > 0) std::printf("first %lld documents:\n", static_cast<long long>(show));
  for (int64_t d = 0; d < show; ++d) {
    std::vector<int32_t> ids = document_ids(d);
    std::string head;
    for (size_t i = 0; i < ids.size() && i < 8; ++i) head += fmt::format(" {}", ids[i]);
    if (ids.size() > 8) head += " ...";
    std::printf("  %lld: %zu tokens in %lld sequence%s:%s\n", static_cast<long long>(d), ids.size(),
                static_cast<long long>(docs[d + 1] - docs[d]),
                docs[d + 1] - docs[d] == 1 ? "" : "s", head.c_str());
    if (tokenizer) std::printf("      %s\n", one_line(tokenizer->decode(ids), 160).c_str());
  }
  return core::kExitOk;
}

}  // namespace

int cmd_dataset(const std::vector<std::string>& argv) {
  if (argv.empty())
    throw core::UsageError(fmt::format("missing subcommand\nusage: {}", kInspectUsage));
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (argv[0] != "inspect")
    throw core::UsageError(fmt::format("unknown subcommand 'dataset {}'{}\nusage: {}", argv[0],
                                       core::did_you_mean(argv[0], {"inspect"}), kInspectUsage));
  return dataset_inspect(
      parse_args(rest, {{"--json"}, {"--show", "--tokenizer"}, 1, 1, kInspectUsage}));
}

}  // namespace loom::cli
