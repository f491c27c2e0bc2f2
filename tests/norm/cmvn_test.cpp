// CMVN: Kaldi apply-cmvn-sliding golden files (numpy transcription of Kaldi and torchaudio), Kaldi/WeNet
// stats round trips, apply-cmvn by hand and against double references, sliding == per-utterance CMN for
// short utterances, causal streaming == offline, per-frame streaming LayerNorm == offline, masked batches
// == per-sequence, backward against the float64 LayerNorm reference, and bad input.
#include <normlab/cmvn.h>
#include <normlab/norm.h>
#include <normlab/npy.h>
#include <normlab/parallel.h>
#include <normlab/reference.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "support/random.h"
#include "support/tolerance.h"

namespace normlab {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::random_tensor;
using testing::Tol;

const std::string kFixtures = std::string(NORMLAB_FIXTURES_DIR) + "/cmvn/";

Tensor run_sliding(ConstView x, const SlidingCmvnOptions& o) {
  Tensor y(x.shape());
  sliding_cmvn(y.view(), x, o);
  return y;
}
Tensor run_per_utt(ConstView x, const CmvnOptions& o) {
  Tensor y(x.shape());
  apply_cmvn_per_utterance(y.view(), x, o);
  return y;
}
// A [D, T] copy of a [T, D] tensor, as a contiguous tensor.
Tensor transposed_copy(ConstView x) {
  return Tensor::copy_of(x.transpose(0, 1));
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("normlab_cmvn_" + name)).string();
}

// ---- options -------------------------------------------------------------------------------------

TEST(CmvnOptions, DefaultsArePinnedToKaldi) {
  const SlidingCmvnOptions s;
  EXPECT_EQ(s.cmn_window, 600);
  EXPECT_EQ(s.min_cmn_window, 100);
  EXPECT_FALSE(s.center);
  EXPECT_FALSE(s.norm_vars);
  EXPECT_EQ(s.time_axis, 0);
  const CmvnOptions a;
  EXPECT_TRUE(a.norm_means);
  EXPECT_FALSE(a.norm_vars);
  EXPECT_EQ(a.time_axis, 0);
}

// ---- golden files ------------------------------------------------------------------------------

TEST(CmvnFixtures, SlidingMatchesKaldiTranscriptionAndTorchaudio) {
  std::ifstream f(kFixtures + "manifest.json");
  ASSERT_TRUE(f.good()) << "missing " << kFixtures << "manifest.json; HINT: run /usr/bin/python3 "
                        << "tests/fixtures/make_cmvn_fixtures.py";
  const nlohmann::json m = nlohmann::json::parse(f);
  int variants = 0, torchaudio_files = 0;
  for (const auto& c : m["cases"]) {
    const std::string name = c["name"];
    const Tensor x = load_npy(kFixtures + name + ".x.npy");
    ASSERT_EQ(x.shape(), (Dims{c["frames"].get<Index>(), c["dims"].get<Index>()})) << name;
    const Tensor xt = transposed_copy(x.cview());
    for (const auto& v : c["variants"]) {
      SCOPED_TRACE(name + " " + v["variant"].get<std::string>());
      SlidingCmvnOptions o;
      o.cmn_window = c["cmn_window"];
      o.min_cmn_window = c["min_cmn_window"];
      o.center = v["center"];
      o.norm_vars = v["norm_vars"];
      const Tensor y = run_sliding(x.cview(), o);
      // Outputs are O(1) (norm_vars) or O(feature spread); fp32 rounding of y is the only visible error.
      const Tol tol{4, 1.0};
      EXPECT_TRUE(
          all_close(y.cview(), load_npy_f64(kFixtures + v["kaldi"].get<std::string>()), tol, "kaldi"));
      if (!v["torchaudio"].is_null()) {
        ++torchaudio_files;
        EXPECT_TRUE(all_close(y.cview(), load_npy_f64(kFixtures + v["torchaudio"].get<std::string>()), tol,
                              "torchaudio"));
      }
      // The [D, T] layout through time_axis = 1 gives the same bits.
      o.time_axis = 1;
      const Tensor yt = run_sliding(xt.cview(), o);
      EXPECT_TRUE(bitwise_equal(yt.cview().transpose(0, 1), y.cview(), "time_axis 1"));
      // Constant bands give exactly 0 (torchaudio gives NaN there with norm_vars).
      for (const auto& col : c["constant_bands"])
        for (Index t = 0; t < x.size(0); ++t) EXPECT_EQ(y.cview().at({t, col.get<Index>()}), 0.0f) << t;
      ++variants;
    }
  }
  EXPECT_EQ(variants, 36);
  EXPECT_EQ(torchaudio_files, 32);
}

// ---- stats --------------------------------------------------------------------------------------

TEST(CmvnStats, AccumulatesOverUtterancesAndMerges) {
  std::mt19937_64 rng(1);
  const Tensor a = random_tensor({30, 5}, rng, 2.0, 3.0), b = random_tensor({12, 5}, rng, 1.0, -4.0);
  CmvnStats s;
  EXPECT_EQ(s.dim(), 0);
  s.add(a.cview());
  s.add(transposed_copy(b.cview()).cview(), /*time_axis=*/1);
  EXPECT_EQ(s.dim(), 5);
  EXPECT_EQ(s.count(), 42.0);
  double sum0 = 0, sq0 = 0;
  for (Index t = 0; t < 30; ++t)
    sum0 += a.cview().at({t, 0}), sq0 += double(a.cview().at({t, 0})) * a.cview().at({t, 0});
  for (Index t = 0; t < 12; ++t)
    sum0 += b.cview().at({t, 0}), sq0 += double(b.cview().at({t, 0})) * b.cview().at({t, 0});
  EXPECT_EQ(s.sum()[0], sum0);
  EXPECT_EQ(s.sum_sq()[0], sq0);
  // Merging two accumulators: same count, sums equal up to double rounding.
  CmvnStats sa, sb;
  sa.add(a.cview());
  sb.add(b.cview());
  sa.add(sb);
  EXPECT_EQ(sa.count(), 42.0);
  for (Index d = 0; d < 5; ++d) {
    EXPECT_NEAR(sa.sum()[d], s.sum()[d], 1e-12 * std::fabs(s.sum_sq()[d]));
    EXPECT_NEAR(sa.sum_sq()[d], s.sum_sq()[d], 1e-12 * s.sum_sq()[d]);
  }
}

TEST(CmvnStats, KaldiLayoutAndNpyRoundTrip) {
  CmvnStats s;
  const Tensor x(Dims{2, 2}, {1, 2, 3, 6});
  s.add(x.cview());
  const BasicTensor<double> m = s.to_kaldi_matrix();
  ASSERT_EQ(m.shape(), (Dims{2, 3}));
  const std::vector<double> expect = {4, 8, 2, 10, 40, 0};  // [Σx..., count; Σx²..., 0]
  for (Index i = 0; i < 6; ++i) EXPECT_EQ(m[i], expect[static_cast<std::size_t>(i)]) << i;
  std::mt19937_64 rng(2);
  CmvnStats r;
  r.add(random_tensor({50, 7}, rng, 3.0, 10.0).cview());
  const std::string path = temp_path("stats.npy");
  r.save_kaldi_npy(path);
  const CmvnStats back = CmvnStats::load_kaldi_npy(path);
  std::remove(path.c_str());
  EXPECT_EQ(back.count(), r.count());
  for (Index d = 0; d < 7; ++d) {
    EXPECT_EQ(back.sum()[d], r.sum()[d]);
    EXPECT_EQ(back.sum_sq()[d], r.sum_sq()[d]);
  }
}

TEST(CmvnStats, WenetJsonRoundTrip) {
  std::mt19937_64 rng(3);
  CmvnStats r;
  r.add(random_tensor({64, 6}, rng, 3.0, -10.0).cview());
  const nlohmann::json j = nlohmann::json::parse(r.to_wenet_json());
  EXPECT_TRUE(j["frame_num"].is_number_integer());
  EXPECT_EQ(j["frame_num"].get<Index>(), 64);
  ASSERT_EQ(j["mean_stat"].size(), 6u);
  const std::string path = temp_path("global_cmvn.json");
  r.save_wenet_json(path);
  const CmvnStats back = CmvnStats::load_wenet_json(path);
  std::remove(path.c_str());
  EXPECT_EQ(back.count(), 64.0);
  for (Index d = 0; d < 6; ++d) {
    EXPECT_EQ(back.sum()[d], r.sum()[d]);  // doubles survive the text round trip exactly
    EXPECT_EQ(back.sum_sq()[d], r.sum_sq()[d]);
  }
  // A file as WeNet's tools/compute_cmvn_stats.py writes it.
  const CmvnStats w =
      CmvnStats::from_wenet_json(R"({"mean_stat": [4.0, 8], "var_stat": [10, 40], "frame_num": 2})");
  Tensor y(Dims{2, 2});
  apply_cmvn(y.view(), Tensor(Dims{2, 2}, {1, 2, 3, 6}).cview(), w, {.norm_vars = true});
  EXPECT_TRUE(bitwise_equal(y.cview(), Tensor(Dims{2, 2}, {-1, -1, 1, 1}).cview()));
}

// ---- apply-cmvn ---------------------------------------------------------------------------------

TEST(CmvnApply, HandComputedMeansAndVariances) {
  const Tensor x(Dims{2, 2}, {1, 2, 3, 6});  // mean [2, 4], biased var [1, 4]
  CmvnStats s;
  s.add(x.cview());
  Tensor y(Dims{2, 2});
  apply_cmvn(y.view(), x.cview(), s);  // means only by default (Kaldi --norm-vars=false)
  EXPECT_TRUE(bitwise_equal(y.cview(), Tensor(Dims{2, 2}, {-1, -2, 1, 2}).cview()));
  apply_cmvn(y.view(), x.cview(), s, {.norm_vars = true});
  EXPECT_TRUE(bitwise_equal(y.cview(), Tensor(Dims{2, 2}, {-1, -1, 1, 1}).cview()));
  EXPECT_TRUE(bitwise_equal(run_per_utt(x.cview(), {.norm_vars = true}).cview(), y.cview()));
  apply_cmvn(y.view(), x.cview(), s, {.norm_means = false});
  EXPECT_TRUE(bitwise_equal(y.cview(), x.cview()));
}

TEST(CmvnApply, GlobalStatsMatchDoubleReferenceInBothLayouts) {
  std::mt19937_64 rng(4);
  CmvnStats s;
  for (int u = 0; u < 3; ++u) s.add(random_tensor({40, 8}, rng, 2.0, 5.0).cview());
  const Tensor x = random_tensor({25, 8}, rng, 2.0, 5.0);
  for (bool nv : {false, true}) {
    BasicTensor<double> ref(x.shape());
    for (Index t = 0; t < 25; ++t)
      for (Index d = 0; d < 8; ++d) {
        const double mean = s.sum()[d] / s.count();
        const double var = s.sum_sq()[d] / s.count() - mean * mean;
        ref[t * 8 + d] = (x.cview().at({t, d}) - mean) / (nv ? std::sqrt(var) : 1.0);
      }
    Tensor y(x.shape());
    apply_cmvn(y.view(), x.cview(), s, {.norm_vars = nv});
    EXPECT_TRUE(all_close(y.cview(), ref, Tol{2, 1.0}));
    const Tensor xt = transposed_copy(x.cview());
    Tensor yt(xt.shape());
    apply_cmvn(yt.view(), xt.cview(), s, {.norm_vars = nv, .time_axis = 1});
    EXPECT_TRUE(bitwise_equal(yt.cview().transpose(0, 1), y.cview()));
  }
}

TEST(CmvnApply, PerUtteranceSurvivesLargeOffsetAndConstantBands) {
  std::mt19937_64 rng(5);
  Tensor x = random_tensor({300, 6}, rng, 1.0, 1e4);
  for (Index t = 0; t < 300; ++t) x.view().at({t, 5}) = 0.1f;  // a constant band
  const Tensor y = run_per_utt(x.cview(), {.norm_vars = true});
  // Double two-pass reference on the first five bands.
  const ref::LayerNormOut r = ref::layer_norm_forward(x.cview().slice(1, 0, 5), {}, {}, Axes{0}, 0.0);
  EXPECT_TRUE(all_close(y.cview().slice(1, 0, 5), r.y, Tol{4, 1.0}));
  for (Index t = 0; t < 300; ++t) EXPECT_EQ(y.cview().at({t, 5}), 0.0f);
}

// ---- apply-cmvn-sliding ---------------------------------------------------------------------------

// speech.md: "For ≤ 100 frames the sliding result equals per-utterance CMN exactly." With the default
// options every frame's window is then the whole utterance; both paths share the same sums, so the bits
// agree (with norm_vars too, as long as no variance falls between the two floors 1e-20 and 1e-10).
TEST(CmvnSliding, ShortUtterancesEqualPerUtteranceCmnBitwise) {
  std::mt19937_64 rng(6);
  for (Index T : {1, 2, 17, 99, 100}) {
    const Tensor x = random_tensor({T, 13}, rng, 3.0, -7.0);
    for (bool nv : {false, true}) {
      for (bool center : {false, true}) {
        SlidingCmvnOptions o;
        o.norm_vars = nv;
        o.center = center;
        EXPECT_TRUE(bitwise_equal(run_sliding(x.cview(), o).cview(),
                                  run_per_utt(x.cview(), {.norm_vars = nv}).cview(),
                                  "T=" + std::to_string(T)));
      }
    }
  }
  // At 101 frames the non-centred window of the last frame is [0, 101) but that of frame 0 is [0, 100).
  const Tensor x = random_tensor({101, 3}, rng, 3.0, 0.0);
  EXPECT_FALSE(bitwise_equal(run_sliding(x.cview(), {}).cview(), run_per_utt(x.cview(), {}).cview()));
}

TEST(CmvnSliding, OneFrameWindowGivesZeroAndInPlaceWorks) {
  const Tensor one(Dims{1, 3}, {5.0f, -2.0f, 7.5f});
  for (bool nv : {false, true}) {
    SlidingCmvnOptions o;
    o.norm_vars = nv;
    EXPECT_TRUE(bitwise_equal(run_sliding(one.cview(), o).cview(), Tensor(Dims{1, 3}).cview()));
  }
  std::mt19937_64 rng(7);
  Tensor x = random_tensor({80, 4}, rng, 2.0, 1.0);
  SlidingCmvnOptions o{.cmn_window = 9, .min_cmn_window = 5, .center = false, .norm_vars = true};
  const Tensor expect = run_sliding(x.cview(), o);
  sliding_cmvn(x.view(), x.cview(), o);
  EXPECT_TRUE(bitwise_equal(x.cview(), expect.cview()));
}

// Pins the causal semantics: with min_cmn_window 0 (or 1) frame t uses [max(0, t − cmn_window), t]
// (cmn_window + 1 frames, Kaldi's convention), checked against a direct double computation.
// Also at a large common offset (1e4 + N(0, 1)), where the running sums are taken around the first frame.
TEST(CmvnSliding, MinWindowZeroIsTheCausalWindow) {
  std::mt19937_64 rng(8);
  const int W = 10;
  for (double offset : {4.0, 1e4})
    for (bool nv : {false, true}) {
      const Tensor x = random_tensor({60, 3}, rng, offset > 100 ? 1.0 : 2.0, offset);
      BasicTensor<double> ref(x.shape());
      for (Index t = 0; t < 60; ++t)
        for (Index d = 0; d < 3; ++d) {
          const Index s = std::max<Index>(0, t - W), n = t - s + 1;
          double mean = 0, var = 0;
          for (Index u = s; u <= t; ++u) mean += x.cview().at({u, d});
          mean /= static_cast<double>(n);
          for (Index u = s; u <= t; ++u) var += std::pow(x.cview().at({u, d}) - mean, 2);
          var /= static_cast<double>(n);
          ref[t * 3 + d] = n == 1 ? 0.0 : (x.cview().at({t, d}) - mean) / (nv ? std::sqrt(var) : 1.0);
        }
      SlidingCmvnOptions o{.cmn_window = W, .min_cmn_window = 0, .center = false, .norm_vars = nv};
      const Tensor y0 = run_sliding(x.cview(), o);
      EXPECT_TRUE(all_close(y0.cview(), ref, Tol{16, 1.0}));
      o.min_cmn_window = 1;
      EXPECT_TRUE(bitwise_equal(run_sliding(x.cview(), o).cview(), y0.cview()));
    }
}

// ---- streaming -----------------------------------------------------------------------------------

// Bitwise: the stream and the offline function run the same window sums with the same updates in the
// same order, from the same origin (the first frame); chunking only changes when frames arrive.
TEST(CmvnStreaming, CausalStreamEqualsOfflineSlidingBitwise) {
  std::mt19937_64 rng(9);
  const Index T = 700, D = 5;
  const Tensor x = random_tensor({T, D}, rng, 3.0, 2.0);
  for (int min_win : {0, 1})
    for (bool nv : {false, true})
      for (Index chunk : {1, 7, 64, 700}) {
        SlidingCmvnOptions o;
        o.min_cmn_window = min_win;
        o.norm_vars = nv;
        const Tensor offline = run_sliding(x.cview(), o);
        StreamingCmvn s(D, o);
        Tensor y(x.shape());
        for (Index t0 = 0; t0 < T; t0 += chunk) {
          const Index t1 = std::min(T, t0 + chunk);
          s.accept(y.view().slice(0, t0, t1), x.cview().slice(0, t0, t1));
        }
        EXPECT_EQ(s.frames_seen(), T);
        EXPECT_TRUE(bitwise_equal(y.cview(), offline.cview(), "chunk " + std::to_string(chunk)));
      }
}

TEST(CmvnStreaming, DLayoutInPlaceAndReset) {
  std::mt19937_64 rng(10);
  const Tensor x = random_tensor({50, 4}, rng, 1.0, 0.0);
  SlidingCmvnOptions o{.cmn_window = 8, .min_cmn_window = 0, .center = false, .norm_vars = true};
  const Tensor offline = run_sliding(x.cview(), o);
  o.time_axis = 1;
  StreamingCmvn s(4, o);
  for (int pass = 0; pass < 2; ++pass) {
    Tensor xt = transposed_copy(x.cview());  // [D, T], normalized in place in chunks of 3 frames
    for (Index t0 = 0; t0 < 50; t0 += 3) {
      View part = xt.view().slice(1, t0, std::min<Index>(50, t0 + 3));
      s.accept(part, part);
    }
    EXPECT_TRUE(bitwise_equal(xt.cview().transpose(0, 1), offline.cview()));
    s.reset();
    EXPECT_EQ(s.frames_seen(), 0);
  }
}

TEST(CmvnStreaming, RejectsLookAhead) {
  EXPECT_NL_ERROR(StreamingCmvn(3, SlidingCmvnOptions{}), "min_cmn_window must be 0 or 1, got 100");
  EXPECT_NL_ERROR(StreamingCmvn(3, SlidingCmvnOptions{.min_cmn_window = 0, .center = true}), "center");
  StreamingCmvn s(3, SlidingCmvnOptions{.min_cmn_window = 0});
  Tensor y(Dims{2, 4});
  EXPECT_NL_ERROR(s.accept(y.view(), y.cview()), "wrong width");
}

// Bitwise: each frame is its own LayerNorm group, and the kernel's result for a group depends only on
// that group's values (docs/numerics.md), so chunking cannot change it.
TEST(StreamingLayerNormF, EqualsOfflineLayerNormBitwise) {
  std::mt19937_64 rng(11);
  const Index T = 37, F = 40;
  const Tensor x = random_tensor({T, F}, rng, 2.0, 3.0);
  const Tensor w = random_tensor({F}, rng, 0.5, 1.0), b = random_tensor({F}, rng, 0.5, 0.0);
  for (bool affine : {false, true}) {
    ConstView wv = affine ? w.cview() : ConstView{}, bv = affine ? b.cview() : ConstView{};
    Tensor offline(x.shape());
    layer_norm_forward(offline.view(), {}, {}, x.cview(), wv, bv, Axes{1}, 1e-5);
    for (int time_axis : {0, 1}) {
      StreamingLayerNormF s(F, wv, bv, 1e-5, time_axis);
      const Tensor xin = time_axis == 0 ? x.clone() : transposed_copy(x.cview());
      Tensor y(xin.shape());
      for (Index t0 = 0, chunk = 1; t0 < T; t0 += chunk, chunk = chunk % 5 + 1) {
        const Index t1 = std::min(T, t0 + chunk);
        s.accept(y.view().slice(time_axis, t0, t1), xin.cview().slice(time_axis, t0, t1));
      }
      EXPECT_EQ(s.frames_seen(), T);
      EXPECT_TRUE(bitwise_equal(time_axis == 0 ? y.cview() : y.cview().transpose(0, 1), offline.cview()));
    }
  }
}

// ---- masked batches ------------------------------------------------------------------------------

TEST(CmvnMasked, EqualsEachSequenceCutToItsLength) {
  std::mt19937_64 rng(12);
  const Index B = 4, T = 130, D = 5;
  const Tensor x = random_tensor({B, T, D}, rng, 2.0, 6.0);
  const std::vector<Index> lengths = {130, 7, 0, 101};
  const Tensor dy = random_tensor({B, T, D}, rng, 1.0, 0.0);
  for (int time_axis : {0, 1}) {
    // [B, D, T] copies for time_axis 1.
    const Tensor xb = time_axis == 0 ? x.clone() : Tensor::copy_of(x.cview().transpose(1, 2));
    const Tensor dyb = time_axis == 0 ? dy.clone() : Tensor::copy_of(dy.cview().transpose(1, 2));
    for (bool nv : {false, true}) {
      const CmvnOptions o{.norm_means = true, .norm_vars = nv, .time_axis = time_axis};
      const SlidingCmvnOptions so{
          .cmn_window = 50, .min_cmn_window = 20, .center = false, .norm_vars = nv, .time_axis = time_axis};
      Tensor y(xb.shape()), ys(xb.shape()), dx(xb.shape());
      apply_cmvn_masked(y.view(), xb.cview(), lengths, o);
      sliding_cmvn_masked(ys.view(), xb.cview(), lengths, so);
      apply_cmvn_masked_backward(dx.view(), dyb.cview(), xb.cview(), lengths, o);
      for (Index b = 0; b < B; ++b) {
        const Index len = lengths[static_cast<std::size_t>(b)];
        auto cut = [&](const Tensor& t) {  // sequence b as a [len, D] view
          ConstView v = t.cview().select(0, b);
          return (time_axis == 1 ? v.transpose(0, 1) : v).slice(0, 0, len);
        };
        auto pad = [&](const Tensor& t) {
          ConstView v = t.cview().select(0, b);
          return (time_axis == 1 ? v.transpose(0, 1) : v).slice(0, len, T);
        };
        const Tensor zeros(Dims{T - len, D});
        for (const Tensor* out : {&y, &ys, &dx}) EXPECT_TRUE(bitwise_equal(pad(*out), zeros.cview()));
        if (len == 0) continue;
        const Tensor seq = Tensor::copy_of(x.cview().select(0, b).slice(0, 0, len));
        const CmvnOptions o2{.norm_means = true, .norm_vars = nv};
        EXPECT_TRUE(bitwise_equal(cut(y), run_per_utt(seq.cview(), o2).cview(), "per-utterance"));
        SlidingCmvnOptions so2 = so;
        so2.time_axis = 0;
        EXPECT_TRUE(bitwise_equal(cut(ys), run_sliding(seq.cview(), so2).cview(), "sliding"));
        Tensor dxs(seq.shape());
        apply_cmvn_per_utterance_backward(
            dxs.view(), Tensor::copy_of(dy.cview().select(0, b).slice(0, 0, len)).cview(), seq.cview(), o2);
        EXPECT_TRUE(bitwise_equal(cut(dx), dxs.cview(), "backward"));
      }
    }
  }
}

TEST(CmvnMasked, SameBitsForOneAndThreeThreads) {
  std::mt19937_64 rng(15);
  const Tensor x = random_tensor({6, 40, 3}, rng, 2.0, 1.0);
  const std::vector<Index> lengths = {40, 3, 17, 0, 39, 1};
  const int saved = num_threads();
  Tensor y1(x.shape()), y3(x.shape());
  set_num_threads(1);
  sliding_cmvn_masked(y1.view(), x.cview(), lengths,
                      {.cmn_window = 10, .min_cmn_window = 4, .norm_vars = true});
  set_num_threads(3);
  sliding_cmvn_masked(y3.view(), x.cview(), lengths,
                      {.cmn_window = 10, .min_cmn_window = 4, .norm_vars = true});
  set_num_threads(saved);
  EXPECT_TRUE(bitwise_equal(y1.cview(), y3.cview()));
}

// ---- backward --------------------------------------------------------------------------------------

TEST(CmvnBackward, PerUtteranceEqualsInstanceNormOverTimeInDouble) {
  std::mt19937_64 rng(13);
  const Tensor x = random_tensor({90, 6}, rng, 2.0, 30.0), dy = random_tensor({90, 6}, rng, 1.0, 0.5);
  Tensor dx(x.shape());
  // norm_vars: LayerNorm backward over the time axis (axis 0) with eps = 0, no affine, in double.
  apply_cmvn_per_utterance_backward(dx.view(), dy.cview(), x.cview(), {.norm_vars = true});
  const ref::LayerNormGrads g = ref::layer_norm_backward(dy.cview(), x.cview(), {}, Axes{0}, 0.0);
  EXPECT_TRUE(all_close(dx.cview(), g.dx, Tol{8, 1.0}));
  // means only: dx = dy − mean_t(dy).
  apply_cmvn_per_utterance_backward(dx.view(), dy.cview(), x.cview(), {});
  BasicTensor<double> ref(x.shape());
  for (Index d = 0; d < 6; ++d) {
    double m = 0;
    for (Index t = 0; t < 90; ++t) m += dy.cview().at({t, d});
    for (Index t = 0; t < 90; ++t) ref[t * 6 + d] = dy.cview().at({t, d}) - m / 90;
  }
  EXPECT_TRUE(all_close(dx.cview(), ref, Tol{4, 1.0}));
}

TEST(CmvnBackward, PerUtteranceMatchesFiniteDifferences) {
  // Float forward, so a coarse check: central differences of L = Σ w·y with h = 1e-2 on O(1) data.
  std::mt19937_64 rng(14);
  Tensor x = random_tensor({12, 3}, rng, 1.0, 0.0);
  const Tensor w = random_tensor({12, 3}, rng, 1.0, 0.0);
  for (bool nv : {false, true}) {
    const CmvnOptions o{.norm_means = true, .norm_vars = nv};
    Tensor dx(x.shape());
    apply_cmvn_per_utterance_backward(dx.view(), w.cview(), x.cview(), o);
    auto loss = [&] {
      const Tensor y = run_per_utt(x.cview(), o);
      double l = 0;
      for (Index i = 0; i < y.numel(); ++i) l += double(w[i]) * y[i];
      return l;
    };
    for (Index i = 0; i < x.numel(); i += 5) {
      const float keep = x[i];
      const float h = 1.0f / 64;
      x[i] = keep + h;
      const double lp = loss();
      x[i] = keep - h;
      const double lm = loss();
      x[i] = keep;
      EXPECT_NEAR(dx[i], (lp - lm) / (2 * h), 2e-3 * (1 + std::fabs(dx[i]))) << i << " nv=" << nv;
    }
  }
}

TEST(CmvnBackward, GlobalStatsScaleByIstd) {
  const Tensor x(Dims{2, 2}, {1, 2, 3, 6});  // var [1, 4] → istd [1, 0.5]
  CmvnStats s;
  s.add(x.cview());
  const Tensor dy(Dims{2, 2}, {1, 1, 2, -4});
  Tensor dx(Dims{2, 2});
  apply_cmvn_backward(dx.view(), dy.cview(), s, {.norm_vars = true});
  EXPECT_TRUE(bitwise_equal(dx.cview(), Tensor(Dims{2, 2}, {1, 0.5f, 2, -2}).cview()));
  apply_cmvn_backward(dx.view(), dy.cview(), s, {});
  EXPECT_TRUE(bitwise_equal(dx.cview(), dy.cview()));
}

// ---- bad input --------------------------------------------------------------------------------------

TEST(CmvnErrors, MessagesNameTheProblem) {
  const Tensor x(Dims{4, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3});
  Tensor y(Dims{4, 3});
  CmvnStats s2;
  s2.add(Tensor(Dims{3, 2}).cview());
  EXPECT_NL_ERROR(apply_cmvn(y.view(), x.cview(), s2), "stats of the wrong width");
  EXPECT_NL_ERROR(s2.add(x.cview()), "stats of the wrong width");
  CmvnStats half =
      CmvnStats::from_kaldi_matrix(BasicTensor<double>(Dims{2, 4}, {1, 2, 3, 0.5, 1, 1, 1, 0}).view());
  EXPECT_NL_ERROR(apply_cmvn(y.view(), x.cview(), half), "count 0.5 is < 1");
  EXPECT_NL_ERROR(apply_cmvn(y.view(), x.cview(), CmvnStats(3)), "count 0 is < 1");
  EXPECT_NL_ERROR(apply_cmvn(y.view(), x.cview(), CmvnStats(3), {.norm_means = false, .norm_vars = true}),
                  "norm_vars needs norm_means");
  const Tensor empty(Dims{0, 3});
  Tensor ey(Dims{0, 3});
  EXPECT_NL_ERROR(apply_cmvn_per_utterance(ey.view(), empty.cview()), "empty features");
  EXPECT_NL_ERROR(sliding_cmvn(ey.view(), empty.cview()), "empty features");
  EXPECT_NL_ERROR(sliding_cmvn(y.view(), x.cview(), {.cmn_window = 0}), "cmn_window must be ≥ 1, got 0");
  EXPECT_NL_ERROR(sliding_cmvn(y.view(), x.cview(), {.min_cmn_window = -1}), "min_cmn_window must be ≥ 0");
  EXPECT_NL_ERROR(sliding_cmvn(y.view(), x.cview(), {.time_axis = 2}), "time_axis 2 is out of range");
  Tensor y3(Dims{4, 4});
  EXPECT_NL_ERROR(apply_cmvn_per_utterance(y3.view(), x.cview()), "differs from input shape");
  const Tensor xb(Dims{2, 5, 3});
  Tensor yb(Dims{2, 5, 3});
  const std::vector<Index> neg = {3, -1}, longer = {6, 2}, few = {3};
  EXPECT_NL_ERROR(apply_cmvn_masked(yb.view(), xb.cview(), neg), "length -1 of sequence 1 is negative");
  EXPECT_NL_ERROR(apply_cmvn_masked(yb.view(), xb.cview(), longer),
                  "length 6 of sequence 0 is longer than the time axis (5 frames)");
  EXPECT_NL_ERROR(sliding_cmvn_masked(yb.view(), xb.cview(), longer), "longer than the time axis");
  EXPECT_NL_ERROR(apply_cmvn_masked(yb.view(), xb.cview(), few), "1 lengths for a batch of 2");
}

TEST(CmvnErrors, MalformedStatsFiles) {
  EXPECT_NL_ERROR(CmvnStats::from_wenet_json("{\"mean_stat\": [1, 2"), "malformed WeNet CMVN JSON");
  EXPECT_NL_ERROR(CmvnStats::from_wenet_json("[1, 2]"), "expected an object");
  EXPECT_NL_ERROR(CmvnStats::from_wenet_json(R"({"mean_stat": [1], "var_stat": [1]})"),
                  "missing \"frame_num\"");
  EXPECT_NL_ERROR(CmvnStats::from_wenet_json(R"({"mean_stat": [1, 2], "var_stat": [1], "frame_num": 3})"),
                  "mean_stat has 2 entries, var_stat 1");
  EXPECT_NL_ERROR(
      CmvnStats::from_wenet_json(R"({"mean_stat": [1, "a"], "var_stat": [1, 2], "frame_num": 3})"),
      "entry 1 of mean_stat or var_stat is not a number");
  EXPECT_NL_ERROR(CmvnStats::from_wenet_json(R"({"mean_stat": [1], "var_stat": [1], "frame_num": "3"})"),
                  "frame_num must be a number");
  EXPECT_NL_ERROR(CmvnStats::load_wenet_json(temp_path("does_not_exist.json")), "cannot open");
  EXPECT_NL_ERROR(CmvnStats::from_kaldi_matrix(BasicTensor<double>(Dims{3, 4}).view()), "shape [2, D+1]");
  EXPECT_NL_ERROR(CmvnStats::from_kaldi_matrix(BasicTensor<double>(Dims{2, 1}).view()), "shape [2, D+1]");
  EXPECT_NL_ERROR(CmvnStats::from_kaldi_matrix(BasicTensor<double>(Dims{2, 2}, {1, -2, 1, 0}).view()),
                  "negative count -2");
  const std::string path = temp_path("bad_stats.npy");
  save_npy(path, BasicTensor<double>(Dims{2, 5, 1}).view());
  EXPECT_NL_ERROR(CmvnStats::load_kaldi_npy(path), "shape [2, D+1]");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace normlab
