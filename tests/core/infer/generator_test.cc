// KV-cache decoding against its oracle, the full-sequence forward pass: at every position
// the logits of incremental decoding equal those of recomputing the whole sequence, for a
// GPT-2-style model (learned positions, LayerNorm, GELU, biases, tied embeddings) and a
// LLaMA-style one (RoPE, RMSNorm, SwiGLU, GQA with 2 key/value groups for 4 heads), with
// both attention cores, prefills of 1 and several tokens, chunks of several tokens after
// the prefill, and a batch of 2 through the cache. Greedy generation equals the arg max of
// recomputed logits, token after token; generation stops at the end-of-document token and
// at the model's maximum length. A Mamba-2 hybrid decodes through the cache's per-layer
// states (its convolution window and SSM state) to the same logits, and a multi-latent
// attention model through the cache as well.
#include "core/infer/generator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>

#include "core/plugin/catalog.h"
#include "core/plugin/plugin_manager.h"
#include "core/runtime/forward_context.h"
#include "core/runtime/kv_cache.h"
#include "loom/cpp/tensor.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 64;
constexpr int64_t kMaxPositions = 24;
// f32 logits of the same model computed in a different order (one (T, S) attention versus
// T passes over a growing cache): a few ulps of values of order 1.
constexpr double kTolerance = 2e-5;

nlohmann::json gpt2_model(const std::string& attention) {
  nlohmann::json m = nlohmann::json::parse(R"({
    "impl": "gpt", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
    "vocab_size": 64, "max_position_embeddings": 24, "position_embedding": "learned",
    "init_std": 0.2,
    "layer": {"impl": "transformer_layer", "norm": {"impl": "layernorm"},
              "mlp": {"impl": "mlp", "activation": "gelu"}},
    "final_norm": {"impl": "layernorm"}
  })");
  m["layer"]["attention"] = {{"impl", attention}};
  return m;
}

nlohmann::json llama_model(const std::string& attention) {
  nlohmann::json m = nlohmann::json::parse(R"({
    "impl": "gpt", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
    "num_query_groups": 2, "ffn_hidden_size": 48, "vocab_size": 64,
    "max_position_embeddings": 24, "position_embedding": "rope",
    "rotary": {"base": 10000, "percent": 1.0}, "add_bias_linear": false,
    "tie_embeddings": false, "init_std": 0.2,
    "layer": {"impl": "transformer_layer", "norm": {"impl": "rmsnorm", "eps": 1e-6},
              "mlp": {"impl": "mlp", "activation": "swiglu"}},
    "final_norm": {"impl": "rmsnorm", "eps": 1e-6}
  })");
  m["layer"]["attention"] = {{"impl", attention}};
  return m;
}

// A Mamba-2 hybrid (Nemotron-H style, no positions): Mamba, attention-only, Mamba and
// MLP-only layers. Its mixers carry their convolution window and SSM state through the
// cache; the scan's chunks (4 steps) do not divide the prefills or the sequence.
nlohmann::json hybrid_model(const std::string& attention) {
  nlohmann::json m = nlohmann::json::parse(R"({
    "impl": "gpt", "num_layers": 4, "hybrid_layer_pattern": "M*M-", "hidden_size": 32,
    "num_attention_heads": 4, "num_query_groups": 2, "ffn_hidden_size": 48, "vocab_size": 64,
    "max_position_embeddings": 24, "position_embedding": "none", "add_bias_linear": false,
    "tie_embeddings": false, "init_std": 0.2,
    "layer": {"impl": "transformer_layer", "norm": {"impl": "rmsnorm", "eps": 1e-6},
              "mlp": {"impl": "mlp", "activation": "swiglu"}},
    "mamba_layer": {"impl": "mamba_layer", "norm": {"impl": "rmsnorm", "eps": 1e-6},
                    "mixer": {"impl": "mamba2", "state_dim": 8, "head_dim": 8, "num_groups": 2,
                              "expand": 2, "d_conv": 4, "chunk_size": 4}},
    "final_norm": {"impl": "rmsnorm", "eps": 1e-6}
  })");
  m["layer"]["attention"] = {{"impl", attention}};
  return m;
}

// DeepSeek-style multi-latent attention: the cache holds the assembled keys and values
// (after the shared rotary key is rotated); YaRN's attention factor on q and k.
nlohmann::json mla_model(const std::string& attention) {
  nlohmann::json m = llama_model(attention);
  m.erase("num_query_groups");
  m["multi_latent_attention"] = {{"q_lora_rank", 12}, {"kv_lora_rank", 10}, {"qk_head_dim", 6},
                                 {"qk_pos_emb_head_dim", 4}, {"v_head_dim", 8}};
  m["rotary"]["scaling"] = {{"type", "yarn"}, {"factor", 4},
                            {"original_max_position_embeddings", 8}};
  return m;
}

struct Case {
  std::string name;
  nlohmann::json model;
  nlohmann::json kernels = nlohmann::json::object();  // GeneratorOptions::kernels
};

// Both models with both attention cores on the default (fastest) kernels, the LLaMA
// model once more with the attention ops pinned to the plain reference kernels, and once
// with Qwen3's per-head q/k norms (normed before rope, and before the keys are cached).
std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* attention : {"dot_product", "fused"}) {
    out.push_back({std::string("gpt2/") + attention, gpt2_model(attention)});
    out.push_back({std::string("llama/") + attention, llama_model(attention)});
    out.push_back({std::string("llama/") + attention + "/reference kernels",
                   llama_model(attention),
                   {{"pin",
                     {{"attention_fwd", "cpu.ref"},
                      {"masked_softmax_fwd", "cpu.ref"},
                      {"rope_fwd", "cpu.ref"}}}}});
    nlohmann::json qk = llama_model(attention);
    qk["qk_layernorm"] = true;
    out.push_back({std::string("llama/") + attention + "/qk_layernorm", qk});
    out.push_back({std::string("hybrid/") + attention, hybrid_model(attention)});
    out.push_back({std::string("mla/") + attention, mla_model(attention)});
    out.push_back({std::string("hybrid/") + attention + "/reference kernels",
                   hybrid_model(attention),
                   {{"pin", {{"ssd_scan", "cpu.ref"}, {"causal_conv1d", "cpu.ref"}}}}});
  }
  return out;
}

std::unique_ptr<core::PluginManager> make_plugins() {
  std::vector<core::SearchRoot> roots;
  for (const char* dir :
       {"kernels/cpu", "plugins/transformer", "plugins/fused_attention", "plugins/mamba"})
    roots.push_back({fs::absolute(dir), "test"});
  return std::make_unique<core::PluginManager>(core::Catalog(roots), nlohmann::json::object(), 1);
}

std::vector<int32_t> random_tokens(int64_t n, uint64_t seed) {
  std::vector<int32_t> out;
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out.push_back(static_cast<int32_t>((x >> 33) % kVocab));
  }
  return out;
}

// max |a[row a_row + i] - b[row b_row + i]| over `rows` rows of V.
double max_diff(const std::vector<float>& a, int64_t a_row, const std::vector<float>& b,
                int64_t b_row, int64_t rows) {
  double worst = 0;
  for (int64_t i = 0; i < rows * kVocab; ++i)
    worst = std::max(worst, std::abs(double(a[a_row * kVocab + i]) - b[b_row * kVocab + i]));
  return worst;
}

TEST(Generator, CachedLogitsEqualRecomputedAtEveryPosition) {
  for (const Case& c : cases()) {
    for (int64_t prefill : {1, 5}) {
      SCOPED_TRACE(c.name + ", prefill " + std::to_string(prefill));
      auto plugins = make_plugins();
      core::Generator gen(*plugins, c.model, {.kernels = c.kernels, .init_seed = 11});
      ASSERT_EQ(gen.vocab_size(), kVocab);
      ASSERT_EQ(gen.max_sequence(), kMaxPositions);
      std::vector<int32_t> tokens = random_tokens(kMaxPositions, 3);
      std::vector<float> full = gen.logits_full(tokens);  // (24, V)
      ASSERT_EQ(full.size(), static_cast<size_t>(kMaxPositions * kVocab));
      // The logits depend on the position: the comparison below is not trivially true.
      EXPECT_GT(max_diff(full, 0, full, 1, 1), 1e-2);

      gen.reset();
      std::vector<int32_t> first(tokens.begin(), tokens.begin() + prefill);
      std::vector<float> got = gen.extend(first);
      EXPECT_LT(max_diff(got, 0, full, 0, prefill), kTolerance);
      int64_t pos = prefill;
      // One token at a time, then a chunk of 3 (T > 1 over a non-empty cache), then singles.
      while (pos < kMaxPositions) {
        int64_t t = pos == prefill + 4 ? 3 : 1;
        t = std::min(t, kMaxPositions - pos);
        std::vector<int32_t> next(tokens.begin() + pos, tokens.begin() + pos + t);
        got = gen.extend(next);
        ASSERT_EQ(got.size(), static_cast<size_t>(t * kVocab));
        EXPECT_LT(max_diff(got, 0, full, pos, t), kTolerance) << "at position " << pos;
        pos += t;
      }
      EXPECT_EQ(gen.cached_length(), kMaxPositions);
      if (c.kernels.contains("pin")) {  // the pins were honoured
        int pinned = 0;
        for (const auto& r : plugins->host().resolutions())
          if (c.kernels["pin"].contains(r.op)) {
            EXPECT_EQ(r.kernel, "cpu.ref") << r.op;
            ++pinned;
          }
        EXPECT_GE(pinned, 2);
      }
      // The cache is full: one more position is refused, naming the capacity.
      try {
        gen.extend({1});
        ADD_FAILURE() << "extend past the maximum sequence succeeded";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Code::kOutOfRange);
        EXPECT_NE(std::string(e.what()).find("24"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(Generator, GreedyEqualsArgmaxOfRecomputedLogits) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    auto plugins = make_plugins();
    core::Generator gen(*plugins, c.model, {.kernels = c.kernels, .init_seed = 5});
    std::vector<int32_t> prompt = random_tokens(4, 9);
    core::GenerateOptions options;
    options.max_new_tokens = 12;
    options.sampling.temperature = 0;
    std::vector<int32_t> streamed;
    core::Generation g =
        gen.generate(prompt, options, std::nullopt, [&](int32_t t) { streamed.push_back(t); });
    EXPECT_EQ(g.stop, core::StopReason::kMaxNewTokens);
    ASSERT_EQ(g.tokens.size(), 12u);
    EXPECT_EQ(streamed, g.tokens);

    std::vector<int32_t> sequence = prompt;
    for (int32_t token : g.tokens) {
      std::vector<float> full = gen.logits_full(sequence);
      const float* last = full.data() + (sequence.size() - 1) * kVocab;
      EXPECT_EQ(token, core::Sampler::argmax(last, kVocab)) << "after " << sequence.size();
      sequence.push_back(token);
    }
  }
}

TEST(Generator, StopsAtEndOfDocument) {
  auto plugins = make_plugins();
  core::Generator gen(*plugins, llama_model("fused"), {.init_seed = 5});
  core::GenerateOptions options;
  options.max_new_tokens = 10;
  options.sampling.temperature = 0;
  std::vector<int32_t> prompt = random_tokens(3, 1);
  core::Generation free_run = gen.generate(prompt, options);
  ASSERT_EQ(free_run.tokens.size(), 10u);
  // The end-of-document token: the fourth token, at its first occurrence.
  int32_t eod = free_run.tokens[3];
  size_t first =
      std::find(free_run.tokens.begin(), free_run.tokens.end(), eod) - free_run.tokens.begin();
  core::Generation g = gen.generate(prompt, options, eod);
  EXPECT_EQ(g.stop, core::StopReason::kEod);
  ASSERT_EQ(g.tokens.size(), first + 1);
  EXPECT_EQ(g.tokens.back(), eod);
  EXPECT_TRUE(std::equal(g.tokens.begin(), g.tokens.end(), free_run.tokens.begin()));
  EXPECT_STREQ(core::stop_reason_name(g.stop), "eod");
}

TEST(Generator, StopsAtTheModelsMaximumLength) {
  auto plugins = make_plugins();
  core::Generator gen(*plugins, gpt2_model("dot_product"), {.init_seed = 2});
  core::GenerateOptions options;
  options.max_new_tokens = 100;
  options.sampling.temperature = 0.8;
  options.sampling.top_k = 10;
  core::Generation g = gen.generate(random_tokens(20, 4), options);
  EXPECT_EQ(g.stop, core::StopReason::kMaxSequence);
  EXPECT_EQ(g.tokens.size(), static_cast<size_t>(kMaxPositions - 20));
  // A prompt that fills the model leaves no room; a longer one is refused.
  g = gen.generate(random_tokens(kMaxPositions, 4), options);
  EXPECT_EQ(g.stop, core::StopReason::kMaxSequence);
  EXPECT_TRUE(g.tokens.empty());
  EXPECT_THROW(gen.generate(random_tokens(kMaxPositions + 1, 4), options), Error);
  EXPECT_THROW(gen.generate({}, options), Error);
  // Learned positions cap the length the generator may be asked for.
  auto plugins2 = make_plugins();
  try {
    core::Generator too_long(*plugins2, gpt2_model("fused"), {.max_sequence = 25});
    ADD_FAILURE() << "max_sequence beyond the position table was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_position_embeddings"), std::string::npos) << e.what();
  }
}

TEST(Generator, SamplingIsReproducibleAndRespectsVocabLimit) {
  auto plugins = make_plugins();
  core::Generator gen(*plugins, llama_model("dot_product"), {.init_seed = 8});
  core::GenerateOptions options;
  options.max_new_tokens = 15;
  options.sampling = {1.0, 0, 0.95, 42};
  options.vocab_limit = 20;
  std::vector<int32_t> prompt = random_tokens(2, 6);
  core::Generation a = gen.generate(prompt, options);
  core::Generation b = gen.generate(prompt, options);
  EXPECT_EQ(a.tokens, b.tokens);
  for (int32_t t : a.tokens) EXPECT_LT(t, 20);
  options.sampling.top_p = 0;
  EXPECT_THROW(gen.generate(prompt, options), Error);
}

TEST(Generator, CopiesParametersByName) {
  auto plugins = make_plugins();
  core::Generator a(*plugins, llama_model("fused"), {.init_seed = 1});
  core::Generator b(*plugins, llama_model("fused"), {.init_seed = 2});
  std::vector<int32_t> tokens = random_tokens(6, 2);
  std::vector<float> la = a.logits_full(tokens), lb = b.logits_full(tokens);
  EXPECT_GT(max_diff(la, 0, lb, 0, 6), 1e-3);
  b.copy_parameters_from(a.params());
  EXPECT_EQ(max_diff(la, 0, b.logits_full(tokens), 0, 6), 0.0);
  // A model of another shape is refused, naming the parameter.
  nlohmann::json wider = llama_model("fused");
  wider["ffn_hidden_size"] = 64;
  core::Generator c(*plugins, wider, {});
  try {
    c.copy_parameters_from(a.params());
    ADD_FAILURE() << "copy between differently shaped models succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_fc1.weight"), std::string::npos) << e.what();
  }
}

// A batch of two sequences through one cache (B > 1: the cache gathers each sequence's
// prefix into a contiguous scratch) gives each sequence's full-forward logits.
TEST(Generator, BatchOfTwoThroughTheCache) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    auto plugins = make_plugins();
    core::Generator gen(*plugins, c.model, {.kernels = c.kernels, .init_seed = 4});
    IModel& model = gen.model();
    const int64_t b = 2, l = 10;
    std::vector<int32_t> tokens = random_tokens(b * l, 12);  // (2, 10)
    auto run = [&](core::ForwardContext& ctx, std::vector<int32_t> ids, int64_t t, int64_t first,
                   bool positions) {
      std::vector<int32_t> labels(ids.size(), 0), pos(ids.size());
      std::vector<float> mask(ids.size(), 0.f);
      for (int64_t i = 0; i < b * t; ++i) pos[i] = static_cast<int32_t>(first + i % t);
      TensorView in[5] = {
          make_view(ids.data(), DType::kI32, {b, t}), make_view(labels.data(), DType::kI32, {b, t}),
          make_view(mask.data(), DType::kF32, {b, t}),
          positions ? make_view(pos.data(), DType::kI32, {b, t}) : empty_view(), empty_view()};
      TensorView out[2] = {};
      throw_if_error(model.forward(&ctx, in, 5, out, 2));
      std::vector<float> all(static_cast<size_t>(numel(out[1])));
      core::load_floats(out[1], all.data());
      // (2, t, Vp): the vocabulary of 64 padded to 128 columns, whose padding is 0.
      const int64_t columns = out[1].shape[2];
      EXPECT_EQ(columns, 128);
      std::vector<float> logits;
      for (int64_t r = 0; r < b * t; ++r)
        for (int64_t j = 0; j < columns; ++j) {
          const float x = all[static_cast<size_t>(r * columns + j)];
          if (j < kVocab) logits.push_back(x);
          else EXPECT_EQ(x, 0.f) << "padding logit " << j;
        }
      return logits;  // (2, t, V)
    };
    core::ForwardContext full_ctx(plugins->host(), false, RecomputePolicy::kNone, 0, 0, 1);
    std::vector<float> full = run(full_ctx, tokens, l, 0, false);

    core::KvCache cache(plugins->host(), b, l);
    int64_t pos = 0;
    for (int64_t t : {3, 1, 1, 2, 1, 1, 1}) {
      std::vector<int32_t> chunk;
      for (int64_t s = 0; s < b; ++s)
        for (int64_t i = 0; i < t; ++i) chunk.push_back(tokens[s * l + pos + i]);
      core::ForwardContext ctx(plugins->host(), false, RecomputePolicy::kNone, 0, 0, 1);
      ctx.set_kv_cache(&cache);
      std::vector<float> got = run(ctx, chunk, t, pos, true);
      cache.advance(t);
      for (int64_t s = 0; s < b; ++s)
        EXPECT_LT(max_diff(got, s * t, full, s * l + pos, t), kTolerance)
            << "sequence " << s << " at position " << pos;
      pos += t;
    }
    EXPECT_EQ(pos, l);
  }
}

TEST(Generator, CacheRefusesSegmentIdsMissingPositionsAndTraining) {
  auto plugins = make_plugins();
  core::Generator gen(*plugins, llama_model("fused"), {});
  core::KvCache cache(plugins->host(), 1, 8);
  std::vector<int32_t> ids = {1, 2}, zeros = {0, 0}, segments = {0, 0};
  std::vector<float> mask = {0, 0};
  auto forward = [&](bool with_segments) {
    core::ForwardContext ctx(plugins->host(), false, RecomputePolicy::kNone, 0, 0, 1);
    ctx.set_kv_cache(&cache);
    TensorView in[5] = {
        make_view(ids.data(), DType::kI32, {1, 2}), make_view(zeros.data(), DType::kI32, {1, 2}),
        make_view(mask.data(), DType::kF32, {1, 2}), empty_view(),
        with_segments ? make_view(segments.data(), DType::kI32, {1, 2}) : empty_view()};
    TensorView out[2] = {};
    Status s = gen.model().forward(&ctx, in, 5, out, 2);
    Code code = s.code;
    std::string message = code == Code::kOk ? "" : take_message(&s);
    return std::make_pair(code, message);
  };
  auto [code, message] = forward(true);
  EXPECT_EQ(code, Code::kInvalidArgument);
  EXPECT_NE(message.find("segment ids"), std::string::npos) << message;
  // At position 0 no position ids are needed; after it they are.
  std::tie(code, message) = forward(false);
  EXPECT_EQ(code, Code::kOk) << message;
  cache.advance(2);
  std::tie(code, message) = forward(false);
  EXPECT_EQ(code, Code::kInvalidArgument);
  EXPECT_NE(message.find("position ids"), std::string::npos) << message;

  core::ForwardContext training(plugins->host(), true, RecomputePolicy::kNone, 0, 0, 1);
  EXPECT_THROW(training.set_kv_cache(&cache), Error);
}

TEST(Generator, NeedsALengthAndKnownKernels) {
  auto plugins = make_plugins();
  nlohmann::json model = llama_model("fused");
  model.erase("max_position_embeddings");
  try {
    core::Generator gen(*plugins, model, {});
    ADD_FAILURE() << "a model without a length was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("seq_length"), std::string::npos) << e.what();
  }
  core::Generator gen(*plugins, model, {.seq_length = 16});
  EXPECT_EQ(gen.max_sequence(), 16);
  core::GeneratorOptions pinned{.seq_length = 16};
  pinned.kernels = {{"pin", {{"gemm", "no.such.kernel"}}}};
  EXPECT_THROW(core::Generator(*plugins, model, pinned), Error);
  pinned.kernels = {{"libraries", {"kernels_nowhere"}}};
  EXPECT_THROW(core::Generator(*plugins, model, pinned), Error);
}

}  // namespace
}  // namespace loom
