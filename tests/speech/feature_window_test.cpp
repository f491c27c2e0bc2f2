// Framing, window functions and the per-frame pipeline (Kaldi's feature-window.cc semantics).
#include <gtest/gtest.h>
#include <normlab/simd.h>
#include <normlab/speech/feature_window.h>
#include <normlab/speech/mel_banks.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "support/tolerance.h"

namespace normlab::speech {
namespace {

TEST(FeatureWindow, NumFramesSnipEdges) {
  FrameExtractionOptions o;
  EXPECT_EQ(NumFrames(0, o), 0);
  EXPECT_EQ(NumFrames(399, o), 0);
  EXPECT_EQ(NumFrames(400, o), 1);
  EXPECT_EQ(NumFrames(559, o), 1);
  EXPECT_EQ(NumFrames(560, o), 2);
  EXPECT_EQ(NumFrames(16000, o), 98);
  EXPECT_EQ(FirstSampleOfFrame(3, o), 480);
}

TEST(FeatureWindow, NumFramesNoSnipEdges) {
  FrameExtractionOptions o;
  o.snip_edges = false;
  EXPECT_EQ(NumFrames(79, o), 0);
  EXPECT_EQ(NumFrames(80, o), 1);
  EXPECT_EQ(NumFrames(16000, o), 100);
  EXPECT_EQ(FirstSampleOfFrame(0, o), -120);  // centred on 80
  EXPECT_EQ(FirstSampleOfFrame(1, o), 40);
  // Without flushing, frames that reach past the end are held back.
  EXPECT_EQ(NumFrames(16000, o, false), 99);  // frame 98 ends at 15960
  EXPECT_EQ(NumFrames(279, o, false), 0);
  EXPECT_EQ(NumFrames(280, o, false), 1);
}

TEST(FeatureWindow, WindowFunctions) {
  FrameExtractionOptions o;
  const int n = o.WindowSize();
  const double a = 2 * std::numbers::pi / (n - 1);
  for (const char* type : {"povey", "hamming", "hanning", "sine", "rectangular", "blackman"}) {
    SCOPED_TRACE(type);
    o.window_type = type;
    FeatureWindowFunction f(o);
    ASSERT_EQ(f.window().size(), static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      const std::string t = type;
      const double c = std::cos(a * i);
      const double ref = t == "povey"     ? std::pow(0.5 - 0.5 * c, 0.85)
                         : t == "hamming" ? 0.54 - 0.46 * c
                         : t == "hanning" ? 0.5 - 0.5 * c
                         : t == "sine"    ? std::sin(0.5 * a * i)
                         : t == "blackman"
                             ? double(0.42f) - 0.5 * c + (0.5 - double(0.42f)) * std::cos(2 * a * i)
                             : 1.0;
      ASSERT_NEAR(f.window()[static_cast<std::size_t>(i)], ref, 1e-12) << "i " << i;
    }
  }
}

TEST(FeatureWindow, PreemphasisRunsBackwards) {
  std::vector<double> x = {1, 2, 4, 8};
  Preemphasize(x, 0.5f);
  EXPECT_EQ(x, (std::vector<double>{0.5, 1.5, 3, 6}));
}

TEST(FeatureWindow, ProcessWindowOrderAndRawEnergy) {
  FrameExtractionOptions o;
  o.dither = 0;
  o.frame_length_ms = 0.25f;  // 4 samples at 16 kHz
  o.frame_shift_ms = 0.25f;
  o.window_type = "rectangular";
  o.preemph_coeff = 0.5f;
  FeatureWindowFunction wf(o);
  DitherState d(0);
  std::vector<double> w = {1, 2, 3, 6, 0, 0, 0, 0};
  float e = 0;
  ProcessWindow(o, wf, d, w, &e);
  // DC removed (mean 3): −2 −1 0 3; energy 14; then pre-emphasis.
  EXPECT_FLOAT_EQ(e, std::log(14.0f));
  EXPECT_EQ(w, (std::vector<double>{-1, 0, 0.5, 3, 0, 0, 0, 0}));
}

TEST(FeatureWindow, MirroringRepeatsTheEdgeSampleLikeKaldiAndTorchaudio) {
  FrameExtractionOptions o;
  o.dither = 0;
  o.remove_dc_offset = false;
  o.preemph_coeff = 0;
  o.window_type = "rectangular";
  o.snip_edges = false;
  o.frame_length_ms = 0.5f;  // 8 samples
  o.frame_shift_ms = 0.25f;  // 4: frame 0 starts at 2 − 4 = −2
  o.round_to_power_of_two = false;
  FeatureWindowFunction wf(o);
  DitherState d(0);
  const std::vector<float> x = {10, 11, 12, 13, 14, 15};
  std::vector<double> w;
  ExtractWindow(0, x, 0, o, wf, d, w, nullptr);
  EXPECT_EQ(w, (std::vector<double>{11, 10, 10, 11, 12, 13, 14, 15}));
  ExtractWindow(0, x, 1, o, wf, d, w, nullptr);  // starts at 2: 12..15, then 15 14 13 12
  EXPECT_EQ(w, (std::vector<double>{12, 13, 14, 15, 15, 14, 13, 12}));
}

// A frame inside the buffer with no dither takes the one-pass kernel that reads the float samples; it
// must give the bits of the general path (convert to double, then ProcessWindow) for every window
// type, pre-emphasis on and off, DC removal on and off, the raw energy, and every instruction set.
TEST(FeatureWindow, FramesInsideTheBufferGiveTheBitsOfProcessWindow) {
  std::vector<float> x(1200);
  std::uint32_t state = 12345;
  for (float& v : x) {  // int16-range samples plus a DC offset
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int>(state >> 16) - 32768) * 0.5f + 300.0f;
  }
  const Isa saved = active_isa();
  for (Isa isa : supported_isas()) {
    set_isa(isa);
    for (const char* type : {"povey", "hamming", "hanning", "sine", "rectangular", "blackman"})
      for (float preemph : {0.97f, 0.0f})
        for (bool dc : {true, false}) {
          SCOPED_TRACE(std::string(type) + " preemph " + std::to_string(preemph) + " dc " +
                       std::to_string(dc) + " " + isa_name(isa));
          FrameExtractionOptions o;
          o.dither = 0;
          o.window_type = type;
          o.preemph_coeff = preemph;
          o.remove_dc_offset = dc;
          FeatureWindowFunction wf(o);
          DitherState d(0);
          for (std::int64_t frame : {0, 3, 4}) {  // frame 4 ends at sample 1040 ≤ 1200
            std::vector<double> fast;
            float e_fast = 0;
            ExtractWindow(0, x, frame, o, wf, d, fast, &e_fast);
            const std::int64_t start = FirstSampleOfFrame(frame, o);
            ASSERT_LE(start + o.WindowSize(), static_cast<std::int64_t>(x.size()));
            std::vector<double> ref(static_cast<std::size_t>(o.PaddedWindowSize()), 0.0);
            for (std::int64_t s = 0; s < o.WindowSize(); ++s)
              ref[static_cast<std::size_t>(s)] = x[static_cast<std::size_t>(start + s)];
            float e_ref = 0;
            ProcessWindow(o, wf, d, ref, &e_ref);
            ASSERT_EQ(fast.size(), ref.size());
            for (std::size_t k = 0; k < ref.size(); ++k)
              ASSERT_EQ(std::bit_cast<std::uint64_t>(fast[k]), std::bit_cast<std::uint64_t>(ref[k])) << k;
            ASSERT_EQ(std::bit_cast<std::uint32_t>(e_fast), std::bit_cast<std::uint32_t>(e_ref));
          }
        }
  }
  set_isa(saved);
}

TEST(FrameExtractionOptions, ValidateNamesTheOption) {
  FrameExtractionOptions o;
  o.frame_length_ms = 0.05f;
  EXPECT_NL_ERROR(o.Validate(), "frame-length");
  o = {};
  o.dither = -1;
  EXPECT_NL_ERROR(o.Validate(), "dither must be ≥ 0");
  o = {};
  o.samp_freq = 0;
  EXPECT_NL_ERROR(o.Validate(), "sample-frequency");
  o = {};
  EXPECT_NE(o.ToString().find("window_type=povey"), std::string::npos);
}

TEST(MelBanks, TrianglesPeakAtTheirCentresAndSkipTheNyquistBin) {
  FrameExtractionOptions fo;
  MelBanksOptions mo;
  const MelBanks mb(mo, fo);
  ASSERT_EQ(mb.NumBins(), 23);
  EXPECT_NEAR(MelBanks::MelScale(700.0f), 1127.0 * std::log(2.0), 1e-3);
  EXPECT_NEAR(MelBanks::InverseMelScale(MelBanks::MelScale(1234.5f)), 1234.5f, 1e-2);
  for (int b = 0; b < mb.NumBins(); ++b) {
    const auto w = mb.BinWeights(b);
    EXPECT_GE(mb.BinOffset(b), 0);
    EXPECT_LE(mb.BinOffset(b) + static_cast<int>(w.size()), 256);  // index 256 (Nyquist) never used
    double mx = 0;
    for (double v : w) {
      EXPECT_GT(v, 0.0);
      EXPECT_LE(v, 1.0);
      mx = std::max(mx, v);
    }
    EXPECT_GT(mx, 0.5);
  }
  EXPECT_GT(mb.CenterFreqs()[0], 20.0f);
  EXPECT_LT(mb.CenterFreqs()[22], 8000.0f);
  // A flat power spectrum of ones gives each bin the sum of its weights.
  std::vector<double> ones(257, 1.0), mel(23);
  mb.Compute(ones, mel);
  for (int b = 0; b < 23; ++b) {
    double s = 0;
    for (double v : mb.BinWeights(b)) s += v;
    EXPECT_DOUBLE_EQ(mel[static_cast<std::size_t>(b)], s);
  }
}

}  // namespace
}  // namespace normlab::speech
