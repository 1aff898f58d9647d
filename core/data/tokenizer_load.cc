// Tokenizer::load: reads GPT-2's vocab.json + merges.txt or Hugging Face's tokenizer.json into a
// ByteLevelBpeConfig, refusing (with the file and the fix) whatever loom does not implement.
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>

#include "core/data/bpe.h"
#include "core/data/tokenizer.h"
#include "core/data/tokenizer_bpe.h"
#include "core/util/errors.h"
#include "core/util/files.h"
#include "loom/cpp/json_input.h"

namespace loom::core {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Every read of a tokenizer file goes through parse_json_input and JsonIn (code kIoError):
// a syntax error, nesting deeper than kMaxJsonDepth (a vocab.json nested 100,000 deep would
// overflow the stack), a number beyond double or a value of the wrong type is an error that
// names the file and the line:column or the JSON pointer, never one of nlohmann's
// exceptions. Tokenizer::load turns them into IoError, the class this file throws.
constexpr Code kCode = Code::kIoError;

json parse_json(const fs::path& file) {
  std::string text = read_file(file);
  try {
    return parse_json_input(text, file.string(), kCode,
                            "the file is not valid JSON for a tokenizer; download or save it "
                            "again");
  } catch (const Error& e) {
    throw IoError(e.what());
  }
}

// A null to view where an optional entry is absent.
const json& null_json() {
  static const json null;
  return null;
}

// node[key], or a null when node has no such entry.
JsonIn optional(const JsonIn& node, const std::string& key) {
  return node.has(key) ? node[key] : JsonIn(null_json(), node.place() + "/" + key, kCode);
}

// A short rendering of a value for messages.
std::string brief(const JsonIn& node) { return json_input_detail::brief(node.json()); }

// A token for messages: its JSON string, cut at 60 characters.
std::string quoted(const std::string& token) {
  std::string text = json(token).dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

// "a b" -> {"a", "b"}; false unless there are exactly two non-empty parts.
bool split_merge(std::string_view line, std::pair<std::string, std::string>& out) {
  size_t space = line.find(' ');
  if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
      line.find(' ', space + 1) != std::string_view::npos)
    return false;
  out = {std::string(line.substr(0, space)), std::string(line.substr(space + 1))};
  return true;
}

void read_vocab(const JsonIn& vocab, ByteLevelBpeConfig& config) {
  if (!vocab.is_object())
    vocab.fail("expected a JSON object mapping each token to its id, got " + brief(vocab));
  config.vocab.reserve(vocab.size());
  // The raw entries, for speed (a vocabulary has 10^5 tokens); a bad one through JsonIn, for
  // its message (file, pointer of the token, what was expected).
  for (auto it = vocab.json().begin(); it != vocab.json().end(); ++it) {
    const json& id = it.value();
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      vocab[it.key()].int64(0, INT32_MAX);  // throws
    config.vocab.emplace_back(it.key(), id.get<int32_t>());
  }
}

// The eos token that tokenizer_config.json (Hugging Face transformers) beside `file` names.
std::optional<std::string> eos_beside(const fs::path& file) {
  fs::path config = file.parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (!fs::is_regular_file(config, ec)) return std::nullopt;
  json j = parse_json(config);
  if (!j.is_object() || !j.contains("eos_token")) return std::nullopt;
  const json& eos = j["eos_token"];
  if (eos.is_string()) return eos.get<std::string>();
  if (eos.is_object() && eos.contains("content") && eos["content"].is_string())
    return eos["content"].get<std::string>();
  return std::nullopt;
}

// The tokenizer's tables are sized by its largest id, so an id from the file is bounded by
// the file: every id must be below 2 x (the tokens, vocabulary and added, counted by
// distinct id) + 1024.
// Real tokenizers number their tokens densely (GPT-2: 50257 tokens, ids 0..50256; Hugging
// Face puts added tokens right after the vocabulary, Qwen2: 151643 tokens, then its added
// ones from 151643), and the few that leave holes (a vocabulary padded to a multiple of
// 64) stay far within the rule; a file of ten tokens with the id 2147483647 would otherwise
// make loom allocate gigabytes.
void check_ids_are_bounded(const ByteLevelBpeConfig& config) {
  // Tokens = distinct ids: an added token is often in the vocabulary too (GPT-2's
  // <|endoftext|> in tokenizer.json; every special token of a vocab.json, load_gpt2).
  std::vector<int32_t> ids;
  ids.reserve(config.vocab.size() + config.added_tokens.size());
  for (const auto& entry : config.vocab) ids.push_back(entry.second);
  for (const AddedToken& t : config.added_tokens) ids.push_back(t.id);
  std::sort(ids.begin(), ids.end());
  const auto total = static_cast<int64_t>(std::unique(ids.begin(), ids.end()) - ids.begin());
  const int64_t limit = 2 * total + 1024;
  auto refuse = [&](const char* what, const std::string& token, int64_t id) {
    throw IoError(
        fmt::format("{}: {} {} has the id {}; ids must be below {} (twice the {} "
                    "tokens of the file, plus 1024), as in every real tokenizer: the "
                    "file is damaged",
                    config.vocab_source, what, quoted(token), id, limit, total));
  };
  for (const auto& [token, id] : config.vocab)
    if (id >= limit) refuse("token", token, id);
  for (const AddedToken& t : config.added_tokens)
    if (t.id >= limit) refuse("added token", t.content, t.id);
}

std::unique_ptr<Tokenizer> finish(ByteLevelBpeConfig config, const std::string& files) {
  check_ids_are_bounded(config);
  int64_t size = 0;
  for (const auto& entry : config.vocab) size = std::max<int64_t>(size, entry.second + 1);
  for (const AddedToken& t : config.added_tokens) size = std::max<int64_t>(size, t.id + 1);
  std::string pre;
  if (config.split == PreTokenPattern::kLlama3) pre = ", Llama-3 pre-tokeniser";
  config.description = fmt::format("byte-level BPE, {} tokens ({}{})", size, files, pre);
  return make_byte_level_bpe(std::move(config));
}

std::unique_ptr<Tokenizer> load_gpt2(const fs::path& vocab_file, const json& vocab,
                                     const fs::path& merges_file) {
  ByteLevelBpeConfig config;
  config.vocab_source = vocab_file.string();
  config.merges_source = merges_file.string();
  read_vocab(JsonIn(vocab, config.vocab_source, kCode), config);
  std::error_code ec;
  if (!fs::is_regular_file(merges_file, ec))
    throw IoError(
        fmt::format("{}: no such file; the GPT-2 format needs the merges file beside {} (one merge "
                    "'left right' per line after a '#version' line)",
                    merges_file.string(), vocab_file.string()));
  std::string text = read_file(merges_file);
  int64_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.starts_with("#version")) continue;
    std::pair<std::string, std::string> merge;
    if (!split_merge(line, merge))
      throw IoError(
          fmt::format("{}:{}: expected a merge 'left right' (two tokens and one space), got '{}'",
                      config.merges_source, line_no, line));
    config.merges.push_back(std::move(merge));
    config.merge_lines.push_back(line_no);
  }
  // GPT-2 files have no list of special tokens: a token that is neither a byte nor made by a
  // merge (GPT-2's <|endoftext|>, the special tokens `loom tokenizer train` appends) can only
  // be one, and is matched in the text as Hugging Face matches added special tokens.
  std::unordered_set<std::string> made;
  for (int b = 0; b < 256; ++b)
    made.insert(bytes_to_byte_level(std::string(1, static_cast<char>(b))));
  for (const auto& [left, right] : config.merges) made.insert(left + right);
  for (const auto& [token, id] : config.vocab) {
    if (made.count(token)) continue;
    AddedToken t;
    t.content = token;
    t.id = id;
    t.special = true;
    t.normalized = false;
    config.added_tokens.push_back(std::move(t));
  }
  config.eos_token = eos_beside(vocab_file);
  return finish(std::move(config),
                vocab_file.filename().string() + " + " + merges_file.filename().string());
}

// The "type" of a tokenizer.json node, or the node itself for messages.
std::string type_of(const JsonIn& node) {
  return node.is_object() && node.has("type") && node["type"].is_string() ? node["type"].string()
                                                                          : brief(node);
}

// node[key] as a bool, `fallback` when absent or null; another type is an error.
bool flag(const JsonIn& node, const char* key, bool fallback) {
  if (!node.has(key) || node[key].is_null()) return fallback;
  return node[key].boolean();
}

void read_pre_tokenizer(const JsonIn& pre, const std::string& file, ByteLevelBpeConfig& config) {
  const std::string supported =
      "loom supports ByteLevel, and Sequence[Split(GPT-2 or Llama-3 regex, Isolated), ByteLevel]";
  if (pre.is_null())
    throw IoError(
        fmt::format("{}: pre_tokenizer is null; a byte-level BPE needs a ByteLevel "
                    "pre-tokeniser ({})",
                    file, supported));
  std::vector<JsonIn> steps;
  if (type_of(pre) == "Sequence" && pre.has("pretokenizers"))
    steps = pre["pretokenizers"].elements();
  else
    steps.push_back(pre);
  if (steps.empty() || type_of(steps.back()) != "ByteLevel" || steps.size() > 2)
    throw IoError(fmt::format("{}: pre_tokenizer {} is not supported; {}", file,
                              pre.json().dump().substr(0, 300), supported));
  if (steps.size() == 2) {
    const JsonIn& split = steps[0];
    if (type_of(split) != "Split")
      throw IoError(fmt::format("{}: pre_tokenizer step '{}' is not supported; {}", file,
                                type_of(split), supported));
    JsonIn pattern = optional(split, "pattern");
    std::string regex =
        pattern.is_object() && pattern.has("Regex") ? pattern["Regex"].string() : std::string();
    if (regex == kGpt2Pattern)
      config.split = PreTokenPattern::kGpt2;
    else if (regex == kLlama3Pattern)
      config.split = PreTokenPattern::kLlama3;
    else
      throw IoError(fmt::format(
          "{}: the Split pre-tokeniser's pattern {} is not supported; loom implements only the "
          "GPT-2 pattern {} and the Llama-3 pattern {}",
          file, pattern.json().dump().substr(0, 300), json(std::string(kGpt2Pattern)).dump(),
          json(std::string(kLlama3Pattern)).dump()));
    std::string behavior = split.has("behavior") ? split["behavior"].string() : "Isolated";
    bool invert = flag(split, "invert", false);
    if (behavior != "Isolated" || invert)
      throw IoError(
          fmt::format("{}: Split with behavior '{}'{} is not supported; loom "
                      "implements behavior 'Isolated' without invert",
                      file, behavior, invert ? ", invert" : ""));
  }
  const JsonIn& byte_level = steps.back();
  config.add_prefix_space = flag(byte_level, "add_prefix_space", true);
  config.byte_level_regex = flag(byte_level, "use_regex", true);
}

std::unique_ptr<Tokenizer> load_tokenizer_json(const fs::path& path, const json& j) {
  std::string file = path.string();
  ByteLevelBpeConfig config;
  config.vocab_source = config.merges_source = file;
  JsonIn root(j, file, kCode);
  JsonIn model = root["model"];
  std::string type =
      model.has("type") ? model["type"].string() : (model.has("merges") ? "BPE" : "unknown");
  if (type != "BPE")
    throw IoError(
        fmt::format("{}: model type '{}' is not supported; loom reads byte-level BPE "
                    "tokenizers (model type BPE with a ByteLevel pre-tokeniser)",
                    file, type));
  JsonIn dropout = optional(model, "dropout");
  if (!dropout.is_null() && !(dropout.json().is_number() && dropout.json().get<double>() == 0))
    throw IoError(
        fmt::format("{}: model.dropout is {}; BPE dropout (random merges, a training "
                    "augmentation) is not supported: set it to null",
                    file, brief(dropout)));
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    JsonIn value = optional(model, key);
    if (!value.is_null() && !(value.is_string() && value.string().empty()))
      throw IoError(
          fmt::format("{}: model.{} is {}; loom's byte-level BPE does not support it "
                      "(it must be null)",
                      file, key, brief(value)));
  }
  // unk_token, fuse_unk and byte_fallback only act on a character without a token, which a
  // byte-level vocabulary never has (every byte has one; make_byte_level_bpe checks).
  config.ignore_merges = flag(model, "ignore_merges", false);
  read_vocab(model["vocab"], config);
  if (model.has("merges")) {
    JsonIn merges = model["merges"];
    merges.expect_array();
    config.merges.reserve(merges.size());
    for (size_t k = 0; k < merges.size(); ++k) {
      const json& m = merges.json()[k];
      std::pair<std::string, std::string> merge;
      bool ok = false;
      if (m.is_string()) {
        ok = split_merge(m.get_ref<const std::string&>(), merge);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merge = {m[0].get<std::string>(), m[1].get<std::string>()};
        ok = true;
      }
      if (!ok)
        merges[k].fail("expected a merge \"left right\" or [\"left\", \"right\"], got " +
                       json_input_detail::brief(m));
      config.merges.push_back(std::move(merge));
    }
  }

  JsonIn normalizer = optional(root, "normalizer");
  bool empty_sequence = type_of(normalizer) == "Sequence" && normalizer.has("normalizers") &&
                        normalizer["normalizers"].size() == 0;
  if (!normalizer.is_null() && !empty_sequence)
    throw IoError(
        fmt::format("{}: normalizer '{}' is not supported; loom's byte-level BPE reads "
                    "tokenizers without a normalizer (as GPT-2's and Llama-3's)",
                    file, type_of(normalizer)));
  read_pre_tokenizer(optional(root, "pre_tokenizer"), file, config);
  JsonIn decoder = optional(root, "decoder");
  if (!decoder.is_null() && type_of(decoder) != "ByteLevel")
    throw IoError(
        fmt::format("{}: decoder '{}' is not supported; a byte-level BPE decodes with "
                    "the ByteLevel decoder",
                    file, type_of(decoder)));
  // post_processor (bos/eos templates) is not applied: loom encodes without special tokens, as
  // `tokenizers` does with add_special_tokens=False; preprocess appends the eod token itself.

  JsonIn added = optional(root, "added_tokens");
  if (!added.is_null()) {
    for (const JsonIn& a : added.elements()) {
      AddedToken t;
      t.content = a["content"].string();
      t.id = static_cast<int32_t>(a["id"].int64(0, INT32_MAX));
      t.special = flag(a, "special", false);
      t.lstrip = flag(a, "lstrip", false);
      t.rstrip = flag(a, "rstrip", false);
      t.normalized = flag(a, "normalized", !t.special);
      if (flag(a, "single_word", false))
        throw IoError(
            fmt::format("{}: added token '{}' has single_word: true, which loom does not "
                        "support; set it to false",
                        file, t.content));
      config.added_tokens.push_back(std::move(t));
    }
  }
  config.eos_token = eos_beside(path);
  return finish(std::move(config), path.filename().string());
}

// The merges file of a GPT-2 vocabulary file: "merges.txt" beside it, or the same name with
// "vocab" replaced (Megatron's gpt2-vocab.json -> gpt2-merges.txt).
fs::path merges_for(const fs::path& vocab_file) {
  std::string name = vocab_file.filename().string();
  size_t at = name.rfind("vocab");
  if (at != std::string::npos) {
    std::string merges = name.substr(0, at) + "merges" + name.substr(at + 5);
    if (merges.size() > 5 && merges.ends_with(".json"))
      merges = merges.substr(0, merges.size() - 5) + ".txt";
    fs::path candidate = vocab_file.parent_path() / merges;
    std::error_code ec;
    if (fs::is_regular_file(candidate, ec)) return candidate;
  }
  return vocab_file.parent_path() / "merges.txt";
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(path / "tokenizer.json", ec)) return load(path / "tokenizer.json");
    if (fs::exists(path / "vocab.json", ec)) return load(path / "vocab.json");
    throw IoError(
        fmt::format("{}: this directory has no tokenizer.json and no vocab.json + "
                    "merges.txt",
                    path.string()));
  }
  if (!fs::exists(path, ec))
    throw IoError(
        fmt::format("{}: no such file or directory (a tokenizer is a directory with "
                    "tokenizer.json or vocab.json + merges.txt, or one of those files)",
                    path.string()));
  if (path.extension() != ".json")
    throw IoError(
        fmt::format("{}: expected tokenizer.json or a GPT-2 vocab.json (its merges.txt "
                    "is read beside it), or a directory holding them",
                    path.string()));
  // tokenizer.json has a "model" object; a vocab.json maps every key (even "model") to an id.
  json j = parse_json(path);
  try {
    if (j.is_object() && j.contains("model") && j["model"].is_object())
      return load_tokenizer_json(path, j);
    return load_gpt2(path, j, merges_for(path));
  } catch (const IoError&) {
    throw;
  } catch (const Error& e) {
    if (e.code() != kCode) throw;
    throw IoError(e.what());  // JsonIn's: a value of the wrong type, an id out of range
  }
}

}  // namespace loom::core
