// Byte-level LM data (src/nn/data.h): the fortunes corpus, the split, seeded training windows, the fixed
// validation windows and the unigram level.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "nn/data.h"
#include "support/tolerance.h"

namespace normlab::nn {
namespace {

// 1000 bytes: training bytes < 128, validation bytes ≥ 128, so a window's split is visible in its bytes.
LmData marked_data() {
  std::vector<std::uint8_t> b(1000);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint8_t>(i < 900 ? i % 128 : 128 + i % 100);
  return LmData(std::move(b), 0.1);
}

TEST(NnData, SplitIsTheLastTenPercent) {
  const LmData d = marked_data();
  EXPECT_EQ(d.size(), 1000);
  EXPECT_EQ(d.train_size(), 900);
  EXPECT_EQ(d.val_size(), 100);
  EXPECT_EQ(d.val()[0], 128);
}

TEST(NnData, TrainingWindowsAreSeededShiftedAndInsideTheTrainingSplit) {
  const LmData d = marked_data();
  const Index B = 16, T = 32;
  std::vector<std::int32_t> x1(B * T), y1(B * T), x2(B * T), y2(B * T), x3(B * T), y3(B * T);
  BatchSampler s1(d, 7), s2(d, 7), s3(d, 8);
  for (int rep = 0; rep < 50; ++rep) {
    s1.sample(x1.data(), y1.data(), B, T);
    s2.sample(x2.data(), y2.data(), B, T);
    EXPECT_EQ(x1, x2);
    EXPECT_EQ(y1, y2);
    for (Index b = 0; b < B; ++b) {
      for (Index t = 0; t < T; ++t) {
        EXPECT_LT(x1[b * T + t], 128);
        EXPECT_LT(y1[b * T + t], 128);
        if (t + 1 < T) {
          EXPECT_EQ(y1[b * T + t], x1[b * T + t + 1]);
        }
      }
    }
  }
  s3.sample(x3.data(), y3.data(), B, T);
  s1.sample(x1.data(), y1.data(), B, T);
  EXPECT_NE(x1, x3);
}

TEST(NnData, RngStateRoundTripContinuesTheStream) {
  const LmData d = marked_data();
  const Index B = 4, T = 8;
  std::vector<std::int32_t> a(B * T), ay(B * T), b(B * T), by(B * T);
  BatchSampler s(d, 3);
  s.sample(a.data(), ay.data(), B, T);
  const std::string state = s.rng_state();
  s.sample(a.data(), ay.data(), B, T);
  BatchSampler r(d, 999);
  r.set_rng_state(state);
  r.sample(b.data(), by.data(), B, T);
  EXPECT_EQ(a, b);
  EXPECT_EQ(ay, by);
  EXPECT_NL_ERROR(r.set_rng_state("not a state"), "malformed random-generator state");
}

TEST(NnData, ValidationWindowsAreFixedAndEvenlySpaced) {
  const LmData d = marked_data();
  const Index T = 9;  // windows of 10 bytes in 100: offsets 0 .. 90
  const std::vector<Index> off = d.validation_offsets(T, 4);
  EXPECT_EQ(off, (std::vector<Index>{0, 30, 60, 90}));
  EXPECT_EQ(d.validation_offsets(T, 1), (std::vector<Index>{0}));
  std::vector<std::int32_t> x(4 * T), y(4 * T);
  d.validation_batch(x.data(), y.data(), off, T);
  EXPECT_EQ(x[0], d.val()[0]);
  EXPECT_EQ(y[0], d.val()[1]);
  EXPECT_EQ(x[3 * T + T - 1], d.val()[98]);
  EXPECT_EQ(y[3 * T + T - 1], d.val()[99]);  // the last window ends at the split's last byte
  for (std::int32_t v : x) EXPECT_GE(v, 128);
  EXPECT_NL_ERROR(d.validation_offsets(100, 4), "shorter than one window");
}

TEST(NnData, UnigramEntropy) {
  const std::vector<std::uint8_t> four = {1, 2, 3, 4, 1, 2, 3, 4};
  EXPECT_NEAR(unigram_entropy(four), std::log(4.0), 1e-15);
  const std::vector<std::uint8_t> one = {7, 7, 7};
  EXPECT_EQ(unigram_entropy(one), 0.0);
  // add-½: p(x) = (count(x) + ½)/(8 + 128) under the frequencies of `four`
  EXPECT_NEAR(unigram_cross_entropy(four, one), -std::log(0.5 / 136.0), 1e-12);
  EXPECT_NEAR(unigram_cross_entropy(four, four), -std::log(2.5 / 136.0), 1e-12);
}

TEST(NnData, MissingCorpusSaysHowToInstallIt) {
  EXPECT_NL_ERROR(load_fortunes("/nonexistent/fortunes"),
                  "fortunes corpus not found at /nonexistent/fortunes; install the Debian packages fortunes and "
                  "fortunes-min (scripts/install-deps)");
  EXPECT_NL_ERROR(load_corpus("/nonexistent/file.txt"), "data file not found: /nonexistent/file.txt");
}

TEST(NnData, FortunesCorpus) {
  // scripts/install-deps installs the corpus: a missing corpus fails here with the install hint.
  const LmData d = LmData::load("fortunes");
  EXPECT_NEAR(static_cast<double>(d.size()), 2.58e6, 0.02e6);  // lab.md: ≈ 2.58 MB
  EXPECT_EQ(d.val_size(), d.size() / 10);
  // lab.md: "a model that only learned byte frequencies scores ≈ 3.36 nats". Measured: the training
  // split's entropy is 3.315, the validation split's 3.355, validation under training frequencies 3.376.
  EXPECT_NEAR(unigram_entropy(d.train()), 3.315, 0.002);
  EXPECT_NEAR(unigram_entropy(d.val()), 3.355, 0.002);
  EXPECT_NEAR(unigram_cross_entropy(d.train(), d.val()), 3.376, 0.002);
  // The first file in sorted order is "art".
  std::ifstream art(std::string(kFortunesDir) + "/art", std::ios::binary);
  std::string head(64, '\0');
  art.read(head.data(), 64);
  EXPECT_EQ(std::string(d.train().begin(), d.train().begin() + 64), head);
}

}  // namespace
}  // namespace normlab::nn
