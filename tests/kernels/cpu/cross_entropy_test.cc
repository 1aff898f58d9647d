// cross_entropy: the reference against f64, fast against reference over dtypes and odd
// vocabularies, backward of the reference against finite differences, masks and labels
// out of range; the one-pass cross_entropy_fwd_bwd against the two ops and f64, in place;
// vocab-parallel cross entropy (shard stats, combine, backward of a shard) against the unsplit ops;
// a padded vocabulary against the unpadded one.
#include <cmath>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

struct CeInputs {
  Tensor logits, labels, mask;
};

CeInputs make(DType dt, int64_t n, int64_t v, bool with_mask, std::mt19937& rng) {
  std::vector<int32_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>(rng() % v);
  CeInputs in{Tensor::random(dt, {n, v}, rng, -5, 5), Tensor::i32({n}, labels), Tensor()};
  if (with_mask) {
    in.mask = Tensor(DType::kF32, {n});
    for (int64_t i = 0; i < n; ++i) in.mask.set(i, i % 3 == 1 ? 0.0 : 1.0);
  }
  return in;
}

class CrossEntropyTest : public ::testing::TestWithParam<DType> {};

TEST_P(CrossEntropyTest, ReferenceMatchesF64AndFastMatchesReference) {
  std::mt19937 rng(1);
  DType dt = GetParam();
  for (int64_t n : {1, 7, 33})
    for (int64_t v : {1, 7, 65, 1000})
      for (bool with_mask : {false, true}) {
        CeInputs in = make(dt, n, v, with_mask, rng);
        Tensor loss(DType::kF32, {n}), lse(DType::kF32, {n}), mean(DType::kF32, {1});
        run_ref(ops::kCrossEntropyFwd, dt, {&in.logits, &in.labels, &in.mask},
                {&loss, &lse, &mean});
        std::vector<double> el(n), expected_lse(n);
        double num = 0, den = 0;
        for (int64_t i = 0; i < n; ++i) {
          double m = -INFINITY, s = 0;
          for (int64_t j = 0; j < v; ++j) m = std::max(m, in.logits.get(i * v + j));
          for (int64_t j = 0; j < v; ++j) s += std::exp(in.logits.get(i * v + j) - m);
          expected_lse[i] = m + std::log(s);
          el[i] = expected_lse[i] - in.logits.get(i * v + static_cast<int64_t>(in.labels.get(i)));
          double w = with_mask ? in.mask.get(i) : 1.0;
          num += w * el[i];
          den += w;
        }
        expect_close(loss, el, DType::kF32, "loss");
        expect_close(lse, expected_lse, DType::kF32, "lse");
        expect_close(mean, {den > 0 ? num / den : 0.0}, DType::kF32, "mean");
        expect_fast_matches_ref(
            ops::kCrossEntropyFwd, dt, {in.logits, in.labels, in.mask},
            {Tensor(DType::kF32, {n}), Tensor(DType::kF32, {n}), Tensor(DType::kF32, {1})});
        Tensor dmean = Tensor::filled(DType::kF32, {1}, 1.7);
        expect_fast_matches_ref(ops::kCrossEntropyBwd, dt,
                                {in.logits, in.labels, in.mask, lse, dmean}, {Tensor(dt, {n, v})});
      }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CrossEntropyTest, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

TEST(CrossEntropyGradient, ReferenceMatchesFiniteDifferences) {
  std::mt19937 rng(2);
  for (bool with_mask : {false, true}) {
    CeInputs in = make(DType::kF32, 4, 5, with_mask, rng);
    auto forward = [&] {
      Tensor loss(DType::kF32, {4}), lse(DType::kF32, {4}), mean(DType::kF32, {1});
      run_ref(ops::kCrossEntropyFwd, DType::kF32, {&in.logits, &in.labels, &in.mask},
              {&loss, &lse, &mean});
      return mean.values();
    };
    Tensor loss(DType::kF32, {4}), lse(DType::kF32, {4}), mean(DType::kF32, {1});
    run_ref(ops::kCrossEntropyFwd, DType::kF32, {&in.logits, &in.labels, &in.mask},
            {&loss, &lse, &mean});
    Tensor dmean = Tensor::filled(DType::kF32, {1}, 0.8), dx(DType::kF32, {4, 5});
    run_ref(ops::kCrossEntropyBwd, DType::kF32, {&in.logits, &in.labels, &in.mask, &lse, &dmean},
            {&dx});
    expect_close(dx.values(), numeric_grad(in.logits, {0.8}, forward), fd_tolerance(), "dlogits");
  }
}

TEST(CrossEntropyLabels, OutOfRangeIsAnErrorUnlessMasked) {
  Tensor logits = Tensor::filled(DType::kF32, {3, 4}, 0.5), none;
  Tensor labels = Tensor::i32({3}, {1, 4, -100});
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    Tensor loss(DType::kF32, {3}), lse(DType::kF32, {3}), mean(DType::kF32, {1});
    Status s = call_kernel(ops::kCrossEntropyFwd, name, DType::kF32, {&logits, &labels, &none},
                           {&loss, &lse, &mean});
    EXPECT_EQ(s.code, Code::kOutOfRange) << name;
    std::string msg = take_message(&s);
    EXPECT_NE(msg.find("cross_entropy_fwd: labels[1] = 4 is outside [0, 4)"), std::string::npos)
        << msg;
    // Masked out, the same labels are fine and get loss 0.
    Tensor mask = Tensor::filled(DType::kF32, {3}, 1.0);
    mask.set(1, 0.0);
    mask.set(2, 0.0);
    run(ops::kCrossEntropyFwd, name, DType::kF32, {&logits, &labels, &mask}, {&loss, &lse, &mean});
    EXPECT_EQ(loss.get(1), 0.0);
    EXPECT_EQ(loss.get(2), 0.0);
    EXPECT_NEAR(mean.get(0), std::log(4.0), 1e-6);  // uniform logits: loss = log V
    Tensor dmean = Tensor::filled(DType::kF32, {1}, 1.0), dx(DType::kF32, {3, 4});
    run(ops::kCrossEntropyBwd, name, DType::kF32, {&logits, &labels, &mask, &lse, &dmean}, {&dx});
    EXPECT_NEAR(dx.get(1), 0.25 - 1.0, 1e-6);
    for (int64_t j = 4; j < 12; ++j) EXPECT_EQ(dx.get(j), 0.0) << j;
  }
}

TEST(CrossEntropyMask, AllZeroMaskGivesZeroMeanAndGradient) {
  std::mt19937 rng(3);
  CeInputs in = make(DType::kF32, 3, 6, true, rng);
  for (int i = 0; i < 3; ++i) in.mask.set(i, 0.0);
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    Tensor loss(DType::kF32, {3}), lse(DType::kF32, {3}),
        mean = Tensor::filled(DType::kF32, {1}, 9);
    run(ops::kCrossEntropyFwd, name, DType::kF32, {&in.logits, &in.labels, &in.mask},
        {&loss, &lse, &mean});
    EXPECT_EQ(mean.get(0), 0.0) << name;
    Tensor dmean = Tensor::filled(DType::kF32, {1}, 1.0),
           dx = Tensor::filled(DType::kF32, {3, 6}, 5);
    run(ops::kCrossEntropyBwd, name, DType::kF32, {&in.logits, &in.labels, &in.mask, &lse, &dmean},
        {&dx});
    for (int64_t j = 0; j < 18; ++j) EXPECT_EQ(dx.get(j), 0.0) << name << " " << j;
  }
}

// ---- One pass: cross_entropy_fwd_bwd -----------------------------------------------------

class CrossEntropyFwdBwdTest : public ::testing::TestWithParam<DType> {};

// The fused op against the two ops of the same kernel (bit for bit: each kernel computes a
// row the same way in both) and against the f64 gradient dmean * mask / sum(mask) *
// (softmax - onehot); in place (dlogits = logits) the same bits again. With and without
// padding columns (vocab_size < V: their gradient is 0) and masks.
TEST_P(CrossEntropyFwdBwdTest, OnePassEqualsTheTwoOpsAndTheF64Gradient) {
  std::mt19937 rng(7);
  DType dt = GetParam();
  std::vector<const char*> names = {"cpu.ref"};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) names.push_back("cpu.fast");
  for (int64_t n : {1, 7, 33})
    for (int64_t v : {1, 7, 65, 1000})
      for (int64_t pad : {0, 3})
        for (bool with_mask : {false, true}) {
          const int64_t vocab = v, cols = v + pad;  // columns [vocab, cols) are padding
          CeInputs in = make(dt, n, vocab, with_mask, rng);
          Tensor logits = Tensor::random(dt, {n, cols}, rng, -5, 5);
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < vocab; ++j)
              logits.set(i * cols + j, in.logits.get(i * vocab + j));
          ops::CrossEntropyShardAttrs at{0, vocab};
          Tensor dmean = Tensor::filled(DType::kF32, {1}, 1.7);
          const std::string what = "N " + std::to_string(n) + ", V " + std::to_string(vocab) +
                                   ", padding " + std::to_string(pad) + (with_mask ? ", mask" : "");
          // The f64 oracle.
          std::vector<double> grad(static_cast<size_t>(n * cols), 0.0);
          double total = 0;
          for (int64_t i = 0; i < n; ++i) total += with_mask ? in.mask.get(i) : 1.0;
          for (int64_t i = 0; i < n; ++i) {
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j < vocab; ++j) m = std::max(m, logits.get(i * cols + j));
            for (int64_t j = 0; j < vocab; ++j) sum += std::exp(logits.get(i * cols + j) - m);
            double w = 1.7 * (with_mask ? in.mask.get(i) : 1.0) / total;
            for (int64_t j = 0; j < vocab; ++j)
              grad[static_cast<size_t>(i * cols + j)] =
                  w * (std::exp(logits.get(i * cols + j) - m) / sum -
                       (j == static_cast<int64_t>(in.labels.get(i)) ? 1.0 : 0.0));
          }
          for (const char* name : names) {
            Tensor loss(DType::kF32, {n}), lse(DType::kF32, {n}), mean(DType::kF32, {1});
            Tensor dx(dt, {n, cols});
            run(ops::kCrossEntropyFwd, name, dt, {&logits, &in.labels, &in.mask},
                {&loss, &lse, &mean}, &at);
            run(ops::kCrossEntropyBwd, name, dt, {&logits, &in.labels, &in.mask, &lse, &dmean},
                {&dx}, &at);
            Tensor floss(DType::kF32, {n}), flse(DType::kF32, {n}), fmean(DType::kF32, {1});
            Tensor fdx = Tensor::filled(dt, {n, cols}, 3.0);
            run(ops::kCrossEntropyFwdBwd, name, dt, {&logits, &in.labels, &in.mask, &dmean},
                {&floss, &flse, &fmean, &fdx}, &at);
            EXPECT_EQ(floss.values(), loss.values()) << name << " loss, " << what;
            EXPECT_EQ(flse.values(), lse.values()) << name << " lse, " << what;
            EXPECT_EQ(fmean.values(), mean.values()) << name << " mean, " << what;
            EXPECT_EQ(fdx.values(), dx.values()) << name << " dlogits, " << what;
            expect_close(fdx, grad, dt, std::string(name) + " dlogits against f64, " + what);
            Tensor inplace = logits;  // its own copy, overwritten by its gradient
            run(ops::kCrossEntropyFwdBwd, name, dt, {&inplace, &in.labels, &in.mask, &dmean},
                {&floss, &flse, &fmean, &inplace}, &at);
            EXPECT_EQ(inplace.values(), dx.values()) << name << " in place, " << what;
            EXPECT_EQ(floss.values(), loss.values()) << name << " in-place loss, " << what;
          }
          expect_fast_matches_ref(ops::kCrossEntropyFwdBwd, dt, {logits, in.labels, in.mask, dmean},
                                  {Tensor(DType::kF32, {n}), Tensor(DType::kF32, {n}),
                                   Tensor(DType::kF32, {1}), Tensor(dt, {n, cols})},
                                  &at, what);
        }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CrossEntropyFwdBwdTest, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

// Rows whose staged copy (the CUDA kernel's dynamic shared memory, V elements + 16 bytes) sits
// just under 48 KiB, where the kernel's static shared memory takes the block past the 48 KiB a
// kernel gets without opting in, and just over. On a device the launch needs the opt-in in both
// (allow_dynamic_smem now asks the kernel's own limit; it used to opt in only past 48 KiB of
// dynamic memory) and its results match cpu.ref; on the CPU, cpu.fast against cpu.ref.
TEST(CrossEntropyFwdBwd, RowsAtTheEdgeOf48KiBOfSharedMemory) {
  std::mt19937 rng(11);
  for (auto [dt, v] : {std::pair{DType::kBF16, int64_t{24440}},
                       {DType::kBF16, int64_t{24448}},
                       {DType::kBF16, int64_t{24576}},
                       {DType::kF32, int64_t{12224}}}) {
    const int64_t n = 3;
    CeInputs in = make(dt, n, v, true, rng);
    ops::CrossEntropyShardAttrs at{0, v};
    expect_fast_matches_ref(ops::kCrossEntropyFwdBwd, dt,
                            {in.logits, in.labels, in.mask, Tensor::filled(DType::kF32, {1}, 1.0)},
                            {Tensor(DType::kF32, {n}), Tensor(DType::kF32, {n}),
                             Tensor(DType::kF32, {1}), Tensor(dt, {n, v})},
                            &at, std::string(dtype_name(dt)) + " V " + std::to_string(v));
  }
}

TEST(CrossEntropyFwdBwd, LabelsOutOfRangeAndOverlappingOutputsAreRefused) {
  Tensor logits = Tensor::filled(DType::kF32, {3, 4}, 0.5), none;
  Tensor labels = Tensor::i32({3}, {1, 4, -100}), dmean = Tensor::filled(DType::kF32, {1}, 1.0);
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    Tensor loss(DType::kF32, {3}), lse(DType::kF32, {3}), mean(DType::kF32, {1});
    Tensor dx(DType::kF32, {3, 4});
    Status s = call_kernel(ops::kCrossEntropyFwdBwd, name, DType::kF32,
                           {&logits, &labels, &none, &dmean}, {&loss, &lse, &mean, &dx});
    EXPECT_EQ(s.code, Code::kOutOfRange) << name;
    std::string msg = take_message(&s);
    EXPECT_NE(msg.find("cross_entropy_fwd_bwd: labels[1] = 4 is outside [0, 4)"), std::string::npos)
        << msg;
    // dlogits one element into the logits: neither in place nor apart.
    Tensor mask = Tensor::filled(DType::kF32, {3}, 1.0);
    CallHolder h({&logits, &labels, &mask, &dmean}, {&loss, &lse, &mean, &logits},
                 static_cast<const NoAttrs*>(nullptr));
    h.out[3].data = static_cast<float*>(h.out[3].data) + 1;
    h.out[3].shape[0] = 3;
    s = kernel(ops::kCrossEntropyFwdBwd, DType::kF32, name).fn(&h.call);
    EXPECT_EQ(s.code, Code::kInvalidArgument) << name;
    msg = take_message(&s);
    EXPECT_NE(msg.find("cross_entropy_fwd_bwd: outputs[3] (dlogits) overlaps inputs[0] (logits) "
                       "without being them"),
              std::string::npos)
        << msg;
  }
}

// ---- Vocab-parallel ----------------------------------------------------------------------

// Columns [b, e) of (N, V) logits.
Tensor columns(const Tensor& x, int64_t b, int64_t e) {
  int64_t n = x.shape()[0], v = x.shape()[1];
  Tensor y(x.dtype(), {n, e - b});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = b; j < e; ++j) y.set(i * (e - b) + j - b, x.get(i * v + j));
  return y;
}

class CrossEntropyShardTest : public ::testing::TestWithParam<DType> {};

// Split the logits over P uneven shards, compute each shard's stats, stack them (in
// reverse order: combine takes any order) and combine: loss, lse and mean are those of
// cross_entropy_fwd on the whole logits; each shard's backward with the combined lse is its
// columns of the whole backward.
TEST_P(CrossEntropyShardTest, ShardsCombineToTheWholeVocabulary) {
  std::mt19937 rng(4);
  DType dt = GetParam();
  for (int64_t n : {1, 33})
    for (int64_t v : {1, 7, 65, 1000})
      for (bool with_mask : {false, true}) {
        CeInputs in = make(dt, n, v, with_mask, rng);
        if (with_mask) {
          // Masked rows (i % 3 == 1) may carry labels outside the vocabulary.
          if (n > 1) in.labels.set(1, -100);
          if (n > 4) in.labels.set(4, static_cast<double>(v));
        }
        Tensor loss(DType::kF32, {n}), lse(DType::kF32, {n}), mean(DType::kF32, {1});
        run_ref(ops::kCrossEntropyFwd, dt, {&in.logits, &in.labels, &in.mask},
                {&loss, &lse, &mean});
        Tensor dmean = Tensor::filled(DType::kF32, {1}, 1.7), dx(dt, {n, v});
        run_ref(ops::kCrossEntropyBwd, dt, {&in.logits, &in.labels, &in.mask, &lse, &dmean}, {&dx});
        for (int64_t p : {1, 2, 3}) {
          std::string what = "V " + std::to_string(v) + ", N " + std::to_string(n) + ", " +
                             std::to_string(p) + " shards" + (with_mask ? ", mask" : "");
          std::vector<int64_t> b = uneven_split(v, p);
          std::vector<Tensor> parts;
          Tensor stacked(DType::kF32, {p, n, 3});
          for (int64_t k = 0; k < p; ++k) {
            ops::CrossEntropyShardAttrs at{b[k], v};
            parts.push_back(columns(in.logits, b[k], b[k + 1]));
            Tensor stats(DType::kF32, {n, 3});
            run_ref(ops::kCrossEntropyShardStats, dt, {&parts[k], &in.labels, &in.mask}, {&stats},
                    &at);
            expect_fast_matches_ref(ops::kCrossEntropyShardStats, dt,
                                    {parts[k], in.labels, in.mask}, {Tensor(DType::kF32, {n, 3})},
                                    &at, what);
            for (int64_t i = 0; i < 3 * n; ++i) stacked.set((p - 1 - k) * 3 * n + i, stats.get(i));
          }
          ops::CrossEntropyShardAttrs whole{0, v};
          Tensor closs(DType::kF32, {n}), clse(DType::kF32, {n}), cmean(DType::kF32, {1});
          run_ref(ops::kCrossEntropyCombine, DType::kF32, {&stacked, &in.labels, &in.mask},
                  {&closs, &clse, &cmean}, &whole);
          expect_close(closs, loss.values(), DType::kF32, "combined loss, " + what);
          expect_close(clse, lse.values(), DType::kF32, "combined lse, " + what);
          expect_close(cmean, mean.values(), DType::kF32, "combined mean, " + what);
          if (with_mask && n > 4) {
            EXPECT_EQ(closs.get(1), 0.0) << what;  // masked, label -100
            EXPECT_EQ(closs.get(4), 0.0) << what;  // masked, label V
          }
          expect_fast_matches_ref(
              ops::kCrossEntropyCombine, DType::kF32, {stacked, in.labels, in.mask},
              {Tensor(DType::kF32, {n}), Tensor(DType::kF32, {n}), Tensor(DType::kF32, {1})},
              &whole, what);
          for (int64_t k = 0; k < p; ++k) {
            ops::CrossEntropyShardAttrs at{b[k], v};
            Tensor dpart(dt, {n, b[k + 1] - b[k]});
            run_ref(ops::kCrossEntropyBwd, dt, {&parts[k], &in.labels, &in.mask, &clse, &dmean},
                    {&dpart}, &at);
            expect_close(dpart, columns(dx, b[k], b[k + 1]).values(), dt,
                         "dlogits of shard " + std::to_string(k) + ", " + what);
            expect_fast_matches_ref(ops::kCrossEntropyBwd, dt,
                                    {parts[k], in.labels, in.mask, clse, dmean},
                                    {Tensor(dt, {n, b[k + 1] - b[k]})}, &at, what);
          }
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CrossEntropyShardTest, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

// ---- Padded vocabulary ------------------------------------------------------------------

// (N, V + pad) logits: the (N, V) logits with `pad` columns after each row holding
// `filler`, values that would dominate the softmax if they took part.
Tensor padded(const Tensor& x, int64_t pad, double filler) {
  int64_t n = x.shape()[0], v = x.shape()[1];
  Tensor y = Tensor::filled(x.dtype(), {n, v + pad}, filler);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < v; ++j) y.set(i * (v + pad) + j, x.get(i * v + j));
  return y;
}

class CrossEntropyPaddingTest : public ::testing::TestWithParam<DType> {};

// A vocabulary of V padded to V + pad columns (attrs vocab_size V): loss, lse and mean are
// those of the unpadded (N, V) logits, the gradient is theirs with exact zeros in the padding,
// also when the padded logits are split over tensor-parallel shards whose last ones hold
// only padding (Megatron's layout: ceil(V / (128 tp)) 128 tp columns, tp equal shards).
TEST_P(CrossEntropyPaddingTest, PaddingTakesNoPartAndGetsZeroGradient) {
  std::mt19937 rng(6);
  DType dt = GetParam();
  for (int64_t n : {1, 33})
    for (int64_t v : {7, 65, 1000})
      for (int64_t pad : {1, 9, 128})
        for (bool with_mask : {false, true}) {
          std::string what = "V " + std::to_string(v) + " + " + std::to_string(pad) + ", N " +
                             std::to_string(n) + (with_mask ? ", mask" : "");
          CeInputs in = make(dt, n, v, with_mask, rng);
          Tensor loss(DType::kF32, {n}), lse(DType::kF32, {n}), mean(DType::kF32, {1});
          run_ref(ops::kCrossEntropyFwd, dt, {&in.logits, &in.labels, &in.mask},
                  {&loss, &lse, &mean});
          Tensor dmean = Tensor::filled(DType::kF32, {1}, 1.7), dx(dt, {n, v});
          run_ref(ops::kCrossEntropyBwd, dt, {&in.logits, &in.labels, &in.mask, &lse, &dmean},
                  {&dx});
          const int64_t vp = v + pad;
          Tensor wide = padded(in.logits, pad, 40.0);
          ops::CrossEntropyShardAttrs vocab{0, v};
          Tensor ploss(DType::kF32, {n}), plse(DType::kF32, {n}), pmean(DType::kF32, {1});
          run_ref(ops::kCrossEntropyFwd, dt, {&wide, &in.labels, &in.mask}, {&ploss, &plse, &pmean},
                  &vocab);
          expect_close(ploss, loss.values(), DType::kF32, "padded loss, " + what);
          expect_close(plse, lse.values(), DType::kF32, "padded lse, " + what);
          expect_close(pmean, mean.values(), DType::kF32, "padded mean, " + what);
          expect_fast_matches_ref(
              ops::kCrossEntropyFwd, dt, {wide, in.labels, in.mask},
              {Tensor(DType::kF32, {n}), Tensor(DType::kF32, {n}), Tensor(DType::kF32, {1})},
              &vocab, what);
          // The gradient: the unpadded one, and 0 in the padding (the filler is not 0).
          Tensor dwide = Tensor::filled(dt, {n, vp}, 3.0);
          run_ref(ops::kCrossEntropyBwd, dt, {&wide, &in.labels, &in.mask, &plse, &dmean}, {&dwide},
                  &vocab);
          expect_close(columns(dwide, 0, v), dx.values(), dt, "padded dlogits, " + what);
          expect_close(columns(dwide, v, vp), std::vector<double>(n * pad, 0.0), DType::kF32,
                       "padding's dlogits, " + what);
          expect_fast_matches_ref(ops::kCrossEntropyBwd, dt,
                                  {wide, in.labels, in.mask, plse, dmean},
                                  {Tensor::filled(dt, {n, vp}, 3.0)}, &vocab, what);
          // Vocab-parallel over p equal shards of the padded columns.
          for (int64_t p : {2, 4}) {
            if (vp % p != 0) continue;
            const int64_t w = vp / p;
            Tensor stacked(DType::kF32, {p, n, 3});
            std::vector<Tensor> parts;
            for (int64_t k = 0; k < p; ++k) {
              ops::CrossEntropyShardAttrs at{k * w, v};
              parts.push_back(columns(wide, k * w, (k + 1) * w));
              Tensor stats(DType::kF32, {n, 3});
              run_ref(ops::kCrossEntropyShardStats, dt, {&parts[k], &in.labels, &in.mask}, {&stats},
                      &at);
              expect_fast_matches_ref(ops::kCrossEntropyShardStats, dt,
                                      {parts[k], in.labels, in.mask}, {Tensor(DType::kF32, {n, 3})},
                                      &at, what);
              for (int64_t i = 0; i < 3 * n; ++i) stacked.set(k * 3 * n + i, stats.get(i));
            }
            Tensor closs(DType::kF32, {n}), clse(DType::kF32, {n}), cmean(DType::kF32, {1});
            run_ref(ops::kCrossEntropyCombine, DType::kF32, {&stacked, &in.labels, &in.mask},
                    {&closs, &clse, &cmean}, &vocab);
            const std::string shards = std::to_string(p) + " shards, " + what;
            expect_close(closs, loss.values(), DType::kF32, "combined loss, " + shards);
            expect_close(clse, lse.values(), DType::kF32, "combined lse, " + shards);
            for (int64_t k = 0; k < p; ++k) {
              ops::CrossEntropyShardAttrs at{k * w, v};
              Tensor dpart = Tensor::filled(dt, {n, w}, 3.0);
              run_ref(ops::kCrossEntropyBwd, dt, {&parts[k], &in.labels, &in.mask, &clse, &dmean},
                      {&dpart}, &at);
              std::vector<double> expected = columns(dwide, k * w, (k + 1) * w).values();
              expect_close(dpart, expected, dt,
                           "dlogits of shard " + std::to_string(k) + ", " + shards);
              expect_fast_matches_ref(ops::kCrossEntropyBwd, dt,
                                      {parts[k], in.labels, in.mask, clse, dmean},
                                      {Tensor::filled(dt, {n, w}, 3.0)}, &at, shards);
            }
          }
        }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CrossEntropyPaddingTest, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

TEST(CrossEntropyPadding, LabelsInThePaddingAreOutOfRange) {
  // Vocabulary 3 padded to 4 columns: label 3 is padding, an error unless masked.
  Tensor logits = Tensor::filled(DType::kF32, {2, 4}, 0.5), none, labels = Tensor::i32({2}, {0, 3}),
         loss(DType::kF32, {2}), lse(DType::kF32, {2}), mean(DType::kF32, {1});
  ops::CrossEntropyShardAttrs vocab{0, 3};
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    Status s = call_kernel(ops::kCrossEntropyFwd, name, DType::kF32, {&logits, &labels, &none},
                           {&loss, &lse, &mean}, &vocab);
    EXPECT_EQ(s.code, Code::kOutOfRange) << name;
    EXPECT_EQ(take_message(&s),
              "cross_entropy_fwd: labels[1] = 3 is outside [0, 3) (the "
              "vocabulary); fix the data or set its mask to 0");
    Tensor mask = Tensor::filled(DType::kF32, {2}, 1.0);
    mask.set(1, 0.0);
    run(ops::kCrossEntropyFwd, name, DType::kF32, {&logits, &labels, &mask}, {&loss, &lse, &mean},
        &vocab);
    expect_close(lse, {0.5 + std::log(3.0), 0.5 + std::log(3.0)}, DType::kF32, name);
  }
}

TEST(CrossEntropyShardLabels, OutOfRangeIsAnErrorUnlessMasked) {
  // Columns [4, 6) of a vocabulary of 6; label 5 is in this shard, 1 in another one.
  ops::CrossEntropyShardAttrs at{4, 6};
  Tensor logits = Tensor::filled(DType::kF32, {3, 2}, 0.5), none;
  logits.set(1, 2.0);
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    for (int32_t bad : {6, -1}) {
      Tensor labels = Tensor::i32({3}, {5, bad, 1}), stats(DType::kF32, {3, 3});
      Status s = call_kernel(ops::kCrossEntropyShardStats, name, DType::kF32,
                             {&logits, &labels, &none}, {&stats}, &at);
      EXPECT_EQ(s.code, Code::kOutOfRange) << name;
      EXPECT_EQ(take_message(&s), "cross_entropy_shard_stats: labels[1] = " + std::to_string(bad) +
                                      " is outside [0, 6) (the vocabulary); fix the data or set "
                                      "its mask to 0");
      Tensor three = Tensor::filled(DType::kF32, {1, 3, 3}, 1.0), loss(DType::kF32, {3}),
             lse(DType::kF32, {3}), mean(DType::kF32, {1});
      s = call_kernel(ops::kCrossEntropyCombine, name, DType::kF32, {&three, &labels, &none},
                      {&loss, &lse, &mean}, &at);
      EXPECT_EQ(s.code, Code::kOutOfRange) << name;
      EXPECT_NE(take_message(&s).find("cross_entropy_combine: labels[1] = "), std::string::npos);
      Tensor lse_in(DType::kF32, {3}), dmean = Tensor::filled(DType::kF32, {1}, 1.0),
                                       dx(DType::kF32, {3, 2});
      s = call_kernel(ops::kCrossEntropyBwd, name, DType::kF32,
                      {&logits, &labels, &none, &lse_in, &dmean}, {&dx}, &at);
      EXPECT_EQ(s.code, Code::kOutOfRange) << name;
      EXPECT_NE(take_message(&s).find("cross_entropy_bwd: labels[1] = " + std::to_string(bad) +
                                      " is outside [0, 6)"),
                std::string::npos);
      // Masked out, the same labels are fine: no label logit from that row.
      Tensor mask = Tensor::filled(DType::kF32, {3}, 1.0);
      mask.set(1, 0.0);
      run(ops::kCrossEntropyShardStats, name, DType::kF32, {&logits, &labels, &mask}, {&stats},
          &at);
      // Rows: (m, s, t) with label 5 at column 1; masked; label 1 in another shard.
      expect_close(stats, {2.0, 1.0 + std::exp(-1.5), 2.0, 0.5, 2.0, 0.0, 0.5, 2.0, 0.0},
                   DType::kF32, std::string("stats ") + name);
    }
  }
}

TEST(CrossEntropyShardAttrs, BadOrMissingAttrsAreRefused) {
  Tensor logits(DType::kF32, {2, 3}), labels = Tensor::i32({2}, {0, 1}), none,
                                      stats(DType::kF32, {2, 3});
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    const KernelDesc& k = kernel(ops::kCrossEntropyShardStats, DType::kF32, name);
    // (3, 5) places the 3 columns partly in the padding after a vocabulary of 5: allowed.
    for (ops::CrossEntropyShardAttrs at :
         {ops::CrossEntropyShardAttrs{-1, 5}, ops::CrossEntropyShardAttrs{0, -5}}) {
      CallHolder h({&logits, &labels, &none}, {&stats}, &at);
      EXPECT_FALSE(k.supports(&h.call)) << name;
      Status s = k.fn(&h.call);
      EXPECT_EQ(s.code, Code::kInvalidArgument);
      EXPECT_EQ(take_message(&s),
                "cross_entropy_shard_stats: attrs vocab_start = " + std::to_string(at.vocab_start) +
                    ", vocab_size = " + std::to_string(at.vocab_size) + ": both must be >= 0");
      Tensor lse(DType::kF32, {2}), dmean(DType::kF32, {1}), dx(DType::kF32, {2, 3});
      CallHolder hb({&logits, &labels, &none, &lse, &dmean}, {&dx}, &at);
      EXPECT_FALSE(kernel(ops::kCrossEntropyBwd, DType::kF32, name).supports(&hb.call)) << name;
    }
    // The forward takes the whole vocabulary: vocab_start 0, 1 <= vocab_size <= V.
    for (ops::CrossEntropyShardAttrs at :
         {ops::CrossEntropyShardAttrs{1, 2}, ops::CrossEntropyShardAttrs{0, 4},
          ops::CrossEntropyShardAttrs{0, 0}}) {
      Tensor loss(DType::kF32, {2}), lse(DType::kF32, {2}), mean(DType::kF32, {1});
      const KernelDesc& f = kernel(ops::kCrossEntropyFwd, DType::kF32, name);
      CallHolder hf({&logits, &labels, &none}, {&loss, &lse, &mean}, &at);
      EXPECT_FALSE(f.supports(&hf.call)) << name;
      Status s = f.fn(&hf.call);
      EXPECT_EQ(s.code, Code::kInvalidArgument);
      EXPECT_NE(take_message(&s).find(
                    "cross_entropy_fwd: attrs vocab_start = " + std::to_string(at.vocab_start) +
                    ", vocab_size = " + std::to_string(at.vocab_size) +
                    ": the op takes the whole vocabulary, padded or not"),
                std::string::npos);
    }
    // Shard stats need their attrs (the shard's place in the vocabulary).
    CallHolder h({&logits, &labels, &none}, {&stats}, static_cast<const NoAttrs*>(nullptr));
    EXPECT_FALSE(k.supports(&h.call)) << name;
    Status s = k.fn(&h.call);
    EXPECT_EQ(s.code, Code::kInvalidArgument);
    EXPECT_NE(take_message(&s).find("cross_entropy_shard_stats: attrs must point to the op's "
                                    "attributes struct of 16 bytes (got null)"),
              std::string::npos);
    // Combine: stats must be (P, N, 3).
    ops::CrossEntropyShardAttrs at{0, 3};
    Tensor bad(DType::kF32, {2, 2, 2}), loss(DType::kF32, {2}), lse(DType::kF32, {2}),
        mean(DType::kF32, {1});
    const KernelDesc& c = kernel(ops::kCrossEntropyCombine, DType::kF32, name);
    CallHolder hc({&bad, &labels, &none}, {&loss, &lse, &mean}, &at);
    EXPECT_FALSE(c.supports(&hc.call)) << name;
    s = c.fn(&hc.call);
    EXPECT_EQ(s.code, Code::kInvalidArgument);
    EXPECT_EQ(take_message(&s),
              "cross_entropy_combine: input 0 (stats) has shape (2, 2, 2), expected (P, N, 3) "
              "with P >= 1 shards and N = 2 (the labels)");
  }
}

TEST(CrossEntropyShardAttrs, SupportsAcceptsShapesOnlyCallsWithAndWithoutAttrs) {
  Tensor logits(DType::kBF16, {4, 8}), labels(DType::kI32, {4}), none, lse(DType::kF32, {4}),
      dmean(DType::kF32, {1}), dx(DType::kBF16, {4, 8}), stats(DType::kF32, {4, 3}),
      stacked(DType::kF32, {2, 4, 3}), loss(DType::kF32, {4}), mean(DType::kF32, {1});
  ops::CrossEntropyShardAttrs at{8, 16};
  auto shapes_only = [](CallHolder& h) {
    for (TensorView& v : h.in) v.data = nullptr;
    for (TensorView& v : h.out) v.data = nullptr;
    return &h.call;
  };
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    CallHolder plain({&logits, &labels, &none, &lse, &dmean}, {&dx},
                     static_cast<const NoAttrs*>(nullptr));
    CallHolder sharded({&logits, &labels, &none, &lse, &dmean}, {&dx}, &at);
    EXPECT_TRUE(kernel(ops::kCrossEntropyBwd, DType::kBF16, name).supports(shapes_only(plain)));
    EXPECT_TRUE(kernel(ops::kCrossEntropyBwd, DType::kBF16, name).supports(shapes_only(sharded)));
    CallHolder st({&logits, &labels, &none}, {&stats}, &at);
    EXPECT_TRUE(kernel(ops::kCrossEntropyShardStats, DType::kBF16, name).supports(shapes_only(st)));
    CallHolder comb({&stacked, &labels, &none}, {&loss, &lse, &mean}, &at);
    EXPECT_TRUE(kernel(ops::kCrossEntropyCombine, DType::kF32, name).supports(shapes_only(comb)));
  }
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
