#include "core/data/data_factory.h"

#include <fmt/format.h>

#include "core/data/corpus.h"
#include "core/data/gpt_data.h"
#include "core/data/mock_data.h"
#include "core/data/token_file.h"
#include "core/data/tokenizer.h"
#include "core/util/errors.h"
#include "core/util/log.h"

namespace loom::core {

DataPlan plan_data(const nlohmann::json& data) {
  DataPlan plan;
  plan.node = data;
  if (data.contains("vocab_size")) plan.vocab_size = data["vocab_size"].get<int64_t>();
  if (data.value("mock", false) || data.contains("token_file")) return plan;
  if (!data.contains("paths") && !data.contains("corpus"))
    throw SpecError(
        "/data",
        "no training data: set /data/paths (indexed datasets from `loom preprocess`), "
        "/data/corpus (raw text loom prepares), /data/token_file (a flat file of token ids) "
        "or /data/mock = true (synthetic tokens)");
  if (data.contains("tokenizer")) plan.tokenizer = data["tokenizer"]["path"].get<std::string>();
  if (data.contains("corpus")) {
    if (data.contains("paths"))
      throw SpecError("/data/corpus", "set either /data/corpus or /data/paths, not both");
    PreparedCorpus corpus = prepare_corpus(data["corpus"], "/data/corpus", plan.tokenizer);
    if (corpus.reused)
      log_info("data", fmt::format("corpus: {} (cached; delete it to rebuild)",
                                   corpus.prefix.parent_path().string()));
    plan.prefixes.push_back(corpus.prefix);
    plan.tokenizer = corpus.tokenizer;
  } else {
    parse_data_paths(data["paths"], "/data/paths", plan.prefixes, plan.weights);
  }
  if (plan.tokenizer) {
    std::unique_ptr<Tokenizer> tokenizer = Tokenizer::load(*plan.tokenizer);
    plan.tokenizer_vocab = tokenizer->vocab_size();
    plan.eod = tokenizer->eod();
  }
  if (data.contains("eod_id")) plan.eod = data["eod_id"].get<int32_t>();
  return plan;
}

std::unique_ptr<DataSource> make_data(const DataPlan& plan, const DataShape& shape,
                                      int64_t model_vocab) {
  const nlohmann::json& data = plan.node;
  int64_t vocab = plan.vocab_size > 0 ? plan.vocab_size : model_vocab;
  if (vocab <= 0)
    throw SpecError("/data/vocab_size",
                    "unknown vocabulary size: set it here (the model does not say its own)");
  if (plan.vocab_size > 0 && plan.tokenizer_vocab > plan.vocab_size)
    throw SpecError("/data/vocab_size",
                    fmt::format("{} is smaller than the tokenizer's {} ids ({}); raise it to at "
                                "least {}",
                                plan.vocab_size, plan.tokenizer_vocab, plan.tokenizer->string(),
                                plan.tokenizer_vocab));
  if (data.value("mock", false))
    return std::make_unique<MockData>(vocab, shape.micro_batch, shape.seq_length, shape.seed);
  if (data.contains("token_file"))
    return std::make_unique<TokenFile>(
        data["token_file"].get<std::string>(), data.value("token_dtype", "u16"), vocab,
        shape.micro_batch, shape.seq_length, data["split"].get<std::string>(), shape.seed);
  GptDataOptions o;
  o.spec_pointer = "/data";
  o.prefixes = plan.prefixes;
  o.weights = plan.weights;
  o.eod = plan.eod;
  o.split = data["split"].get<std::string>();
  o.batch = shape.micro_batch;
  o.seq_length = shape.seq_length;
  o.seed = static_cast<uint32_t>(shape.seed);
  o.train_samples = shape.train_samples;
  o.valid_samples = shape.valid_samples;
  if (data.contains("cache_dir")) o.cache_dir = data["cache_dir"].get<std::string>();
  o.vocab_size = vocab;
  o.eod_mask_loss = data["eod_mask_loss"].get<bool>();
  o.reset_position_ids = data["reset_position_ids"].get<bool>();
  o.reset_attention_mask = data["reset_attention_mask"].get<bool>();
  return std::make_unique<GptData>(o);
}

}  // namespace loom::core
