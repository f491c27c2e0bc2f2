// Log-mel filterbank: torchaudio.compliance.kaldi.fbank golden files (tests/fixtures/make_fbank_fixtures.py),
// streaming == whole waveform bitwise, Kaldi's defaults, errors.
#include <gtest/gtest.h>
#include <normlab/npy.h>
#include <normlab/simd.h>
#include <normlab/speech/fbank.h>
#include <normlab/speech/wav.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "speech/log_mel.h"
#include "speech/real_fft.h"
#include "support/tolerance.h"

namespace normlab::speech {
namespace {

using normlab::testing::bitwise_equal;

const std::string kDir = std::string(NORMLAB_FIXTURES_DIR) + "/fbank/";

// The same table as CASES in make_fbank_fixtures.py.
struct Case {
  const char* name;
  const char* wav;
  void (*set)(FbankOptions&);
};

void base(FbankOptions& o) {
  o.frame_opts.dither = 0.0f;
}

const Case kCases[] = {
    {"default_16k", "tone16k", [](FbankOptions&) {}},
    {"bins40_nosnip_hamming_16k", "tone16k",
     [](FbankOptions& o) {
       o.mel_opts.num_bins = 40;
       o.frame_opts.snip_edges = false;
       o.frame_opts.window_type = "hamming";
     }},
    {"bins80_16k", "tone16k", [](FbankOptions& o) { o.mel_opts.num_bins = 80; }},
    {"bins80_nosnip_16k", "tone16k",
     [](FbankOptions& o) {
       o.mel_opts.num_bins = 80;
       o.frame_opts.snip_edges = false;
     }},
    {"bins23_8k", "tone8k", [](FbankOptions& o) { o.frame_opts.samp_freq = 8000; }},
    {"bins40_nosnip_hamming_8k", "tone8k",
     [](FbankOptions& o) {
       o.frame_opts.samp_freq = 8000;
       o.mel_opts.num_bins = 40;
       o.frame_opts.snip_edges = false;
       o.frame_opts.window_type = "hamming";
     }},
    {"hanning_nodc_16k", "tone16k",
     [](FbankOptions& o) {
       o.frame_opts.window_type = "hanning";
       o.frame_opts.remove_dc_offset = false;
     }},
    {"rect_nopreemph_16k", "tone16k",
     [](FbankOptions& o) {
       o.frame_opts.window_type = "rectangular";
       o.frame_opts.preemph_coeff = 0.0f;
     }},
    {"blackman_400fft_16k", "tone16k",
     [](FbankOptions& o) {
       o.frame_opts.window_type = "blackman";
       o.frame_opts.round_to_power_of_two = false;
     }},
    {"freqs_bins30_16k", "tone16k",
     [](FbankOptions& o) {
       o.mel_opts.low_freq = 60;
       o.mel_opts.high_freq = -400;
       o.mel_opts.num_bins = 30;
     }},
    {"energy_16k", "tone16k",
     [](FbankOptions& o) {
       o.use_energy = true;
       o.frame_opts.frame_length_ms = 20;
       o.frame_opts.frame_shift_ms = 8;
     }},
    {"vtln090_16k", "tone16k", [](FbankOptions& o) { o.vtln_warp = 0.9f; }},
    {"vtln110_bins40_16k", "tone16k",
     [](FbankOptions& o) {
       o.vtln_warp = 1.1f;
       o.mel_opts.num_bins = 40;
     }},
    {"vtln085_lowhigh_8k", "tone8k",
     [](FbankOptions& o) {
       o.frame_opts.samp_freq = 8000;
       o.vtln_warp = 0.85f;
       o.mel_opts.vtln_low = 200;
       o.mel_opts.vtln_high = 3200;
     }},
    {"vtln115_bins80_nosnip_16k", "tone16k",
     [](FbankOptions& o) {
       o.vtln_warp = 1.15f;
       o.mel_opts.num_bins = 80;
       o.frame_opts.snip_edges = false;
       o.mel_opts.vtln_low = 300;
       o.mel_opts.vtln_high = -1000;
     }},
};

FbankOptions options_of(const Case& c) {
  FbankOptions o;
  base(o);
  c.set(o);
  return o;
}

double max_abs_diff(ConstView a, ConstView b) {
  double m = 0;
  for (Index i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(double(a.data()[i]) - b.data()[i]));
  return m;
}

// <case>.npy is torchaudio in float32 (the acceptance bound: 2e-4 max abs); <case>.f64.npy is torchaudio in
// float64, the algorithm's value, which normlab (double per frame, double mel weights) must match more
// tightly (1e-4; what is left is torchaudio's float32 mel weights, which the f64 run keeps except in the
// VTLN cases, ~1e-5 off in a weight). The printed numbers go to docs/PERFORMANCE.md.
TEST(FbankTorchaudio, MatchesGoldenFiles) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const FbankOptions o = options_of(c);
    const Waveform w = read_wav(kDir + c.wav + ".wav", {.expected_samp_freq = o.frame_opts.samp_freq});
    const Tensor got = ComputeFbank(o, w.samples, w.samp_freq);
    const Tensor ref32 = load_npy(kDir + std::string(c.name) + ".npy");
    const Tensor ref64 = load_npy(kDir + std::string(c.name) + ".f64.npy");
    ASSERT_EQ(got.shape(), ref32.shape()) << "frame count or feature dim differs from torchaudio";
    ASSERT_EQ(got.shape(), ref64.shape());
    const double err32 = max_abs_diff(got.cview(), ref32.cview());
    const double err64 = max_abs_diff(got.cview(), ref64.cview());
    const double ta = max_abs_diff(ref32.cview(), ref64.cview());
    std::printf(
        "  %-26s [%3lld, %2lld]  |normlab - ta32| %.2e  |normlab - ta64| %.2e  (|ta32 - ta64| %.2e)\n",
        c.name, static_cast<long long>(got.size(0)), static_cast<long long>(got.size(1)), err32, err64, ta);
    EXPECT_LE(err32, 2e-4);
    EXPECT_LE(err64, 1e-4);
  }
}

// The per-frame FFT and mel sums run in a baseline and an AVX2 build (src/speech/fbank.cpp); every
// instruction set must give the same bits, for every golden option set.
TEST(FbankTorchaudio, SameBitsOnEveryInstructionSet) {
  const Isa saved = active_isa();
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const FbankOptions o = options_of(c);
    const Waveform w = read_wav(kDir + c.wav + ".wav", {.expected_samp_freq = o.frame_opts.samp_freq});
    set_isa(Isa::kScalar);
    const Tensor ref = ComputeFbank(o, w.samples, w.samp_freq);
    for (Isa isa : supported_isas()) {
      set_isa(isa);
      EXPECT_TRUE(bitwise_equal(ComputeFbank(o, w.samples, w.samp_freq).cview(), ref.cview()))
          << isa_name(isa);
    }
  }
  set_isa(saved);
}

// The log-mel kernel (src/speech/log_mel.h) is the natural log rounded once to float: against logl
// rounded to float, over energies from below the FLT_EPSILON floor to 1e300 (random in log space, the
// √2 split point, powers of two, 1), every length 1..9 for the tail, and the non-finite fall-back.
TEST(LogMel, IsTheLogRoundedOnceToFloat) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> log10_of(-12.0, 300.0);
  std::vector<double> m = {0.0,
                           -1.0,
                           1e-30,
                           FLT_EPSILON,
                           std::nextafter(double{FLT_EPSILON}, 0.0),
                           1.0,
                           std::sqrt(2.0),
                           std::nextafter(std::sqrt(2.0), 2.0),
                           std::nextafter(std::sqrt(2.0), 1.0),
                           0.5,
                           2.0,
                           1e300,
                           DBL_MAX};
  for (int e = -23; e <= 1000; e += 7) m.push_back(std::ldexp(1.0, e));
  for (int i = 0; i < 20000; ++i) m.push_back(std::pow(10.0, log10_of(rng)));
  std::vector<float> y(m.size());
  detail::LogMel(y.data(), m.data(), m.size());
  for (std::size_t i = 0; i < m.size(); ++i) {
    const long double v = std::max<long double>(m[i], FLT_EPSILON);
    ASSERT_EQ(y[i], static_cast<float>(std::log(v))) << "m = " << m[i];
  }
  for (std::size_t n = 1; n <= 9; ++n) {  // the tail of a length that is not a multiple of 4
    std::vector<float> t(n);
    detail::LogMel(t.data(), m.data() + 20, n);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(t[i], y[20 + i]) << n;
  }
  const double odd[3] = {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(),
                         4.0};
  float r[3];
  detail::LogMel(r, odd, 3);
  EXPECT_EQ(r[0], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(r[1]));
  EXPECT_EQ(r[2], static_cast<float>(std::log(4.0L)));
}

TEST(FbankTorchaudio, FtLayoutIsTheTranspose) {
  FbankOptions o = options_of(kCases[0]);
  const Waveform w = read_wav(kDir + "tone16k.wav");
  const Tensor tf = ComputeFbank(o, w.samples, w.samp_freq, FeatureLayout::kTF);
  const Tensor ft = ComputeFbank(o, w.samples, w.samp_freq, FeatureLayout::kFT);
  ASSERT_EQ(ft.shape(), (Dims{tf.size(1), tf.size(0)}));
  EXPECT_TRUE(bitwise_equal(ft.cview(), tf.cview().transpose(0, 1)));
}

TEST(Fbank, EmptyMelBinIsAnErrorLikeKaldi) {
  FbankOptions o;
  o.mel_opts.num_bins = 128;  // 512-point FFT at 16 kHz: the lowest bins are narrower than 31.25 Hz
  EXPECT_NL_ERROR(FbankComputer c(o), "contains no FFT bin");
  EXPECT_NL_ERROR(FbankComputer c(o), "num-mel-bins too large");
  o.mel_opts.num_bins = 80;
  EXPECT_NO_THROW(FbankComputer c(o));
}

TEST(Fbank, BadFrequencyRangeNamesTheValues) {
  FbankOptions o;
  o.mel_opts.high_freq = 9000;
  EXPECT_NL_ERROR(FbankComputer c(o), "high-freq 9000 vs. nyquist 8000");
  o.mel_opts.high_freq = 0;
  o.mel_opts.low_freq = 8000;
  EXPECT_NL_ERROR(FbankComputer c(o), "low-freq 8000");
  o.mel_opts.low_freq = 20;
  o.mel_opts.num_bins = 2;
  EXPECT_NL_ERROR(FbankComputer c(o), "num-mel-bins must be ≥ 3");
  o.mel_opts.num_bins = 23;
  o.frame_opts.window_type = "kaiser";
  EXPECT_NL_ERROR(FbankComputer c(o), "unknown window-type \"kaiser\"");
}

// The power-of-two real FFT (src/speech/real_fft.h) against a float64 direct DFT (long double accumulation,
// exact twiddles), for every length 2..4096: radix-4 passes only (4^k·2 and 4^k lengths both occur).
TEST(RealFft, PowerSpectrumMatchesADirectDft) {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> nd(0.0, 1000.0);
  for (std::int32_t n = 2; n <= 4096; n *= 2) {
    SCOPED_TRACE(n);
    std::vector<double> x(static_cast<std::size_t>(n));
    for (double& v : x) v = nd(rng);
    x[0] += 5000;  // a DC component
    detail::RealFftPow2 fft(n);
    std::vector<double> power(static_cast<std::size_t>(n / 2 + 1), -1.0);
    fft.PowerSpectrum(x.data(), power.data());
    double energy = 0;
    for (double v : x) energy += v * v;
    std::vector<long double> c(static_cast<std::size_t>(n)), sn(static_cast<std::size_t>(n));
    for (std::int32_t m = 0; m < n; ++m) {
      const long double a = -2.0L * 3.14159265358979323846264338327950288L * m / n;
      c[static_cast<std::size_t>(m)] = std::cos(a);
      sn[static_cast<std::size_t>(m)] = std::sin(a);
    }
    for (std::int32_t k = 0; k <= n / 2; ++k) {
      long double re = 0, im = 0;
      for (std::int32_t j = 0; j < n; ++j) {
        const std::size_t m = static_cast<std::size_t>((static_cast<std::int64_t>(j) * k) % n);
        re += x[static_cast<std::size_t>(j)] * c[m];
        im += x[static_cast<std::size_t>(j)] * sn[m];
      }
      const double ref = static_cast<double>(re * re + im * im);
      // Rounding error of an FFT: ~ε·log2(n) relative to the frame's energy (Parseval: Σ|X|² = n·Σx²).
      ASSERT_NEAR(power[static_cast<std::size_t>(k)], ref, 64 * DBL_EPSILON * n * energy) << "k " << k;
    }
  }
  EXPECT_FALSE(detail::RealFftPow2::Supports(400));
  EXPECT_FALSE(detail::RealFftPow2::Supports(0));
  EXPECT_TRUE(detail::RealFftPow2::Supports(512));
}

// Kaldi's VTLN warp by hand: low_freq 20, high_freq 8000, vtln_low 100, vtln_high 7500, α = 0.8:
// l = 100·max(1, 0.8) = 100, h = 7500·0.8 = 6000, F(f) = f/0.8 in between; left slope
// (100/0.8 − 20)/(100 − 20) = 1.3125, right slope (8000 − 7500)/(8000 − 6000) = 0.25.
TEST(MelBanksVtln, WarpFunctionByHand) {
  const auto F = [](double f, double a) { return MelBanks::VtlnWarpFreq(100, 7500, 20, 8000, a, f); };
  EXPECT_DOUBLE_EQ(F(20, 0.8), 20.0);      // F(low_freq) = low_freq
  EXPECT_DOUBLE_EQ(F(8000, 0.8), 8000.0);  // F(high_freq) = high_freq
  EXPECT_EQ(F(10, 0.8), 10.0);             // outside [low_freq, high_freq]: unchanged
  EXPECT_DOUBLE_EQ(F(60, 0.8), 20 + 1.3125 * 40);
  EXPECT_DOUBLE_EQ(F(1000, 0.8), 1250.0);
  EXPECT_DOUBLE_EQ(F(7000, 0.8), 8000 + 0.25 * (7000 - 8000));
  // α = 1.25: l = 125, h = 7500, F(f) = 0.8·f in between; F(l) = 100 = vtln_low; right slope
  // (8000 − 6000)/(8000 − 7500) = 4.
  EXPECT_DOUBLE_EQ(F(125, 1.25), 100.0);
  EXPECT_DOUBLE_EQ(F(4000, 1.25), 3200.0);
  EXPECT_DOUBLE_EQ(F(7750, 1.25), 7000.0);
  for (double a : {0.8, 1.0, 1.25}) {  // continuous and increasing on [low_freq, high_freq]: slopes ≤ 4
    double prev = F(20, a);
    for (double f = 21; f <= 8000; f += 1) {
      const double v = F(f, a);
      ASSERT_GT(v, prev) << "alpha " << a << " f " << f;
      ASSERT_LE(v - prev, 4.0 + 1e-9) << "alpha " << a << " f " << f;
      prev = v;
    }
  }
  // The mel version is mel(F(mel⁻¹(m))).
  const double m = MelBanks::MelScale(1000);
  EXPECT_DOUBLE_EQ(MelBanks::VtlnWarpMelFreq(100, 7500, 20, 8000, 0.8, m),
                   MelBanks::MelScale(F(MelBanks::InverseMelScale(m), 0.8)));
}

TEST(MelBanksVtln, WarpMovesTheBinsAndOneIsNoWarp) {
  FbankOptions o;
  const MelBanks plain(o.mel_opts, o.frame_opts);
  const MelBanks same(o.mel_opts, o.frame_opts, 1.0f);
  const MelBanks lo(o.mel_opts, o.frame_opts, 0.9f), hi(o.mel_opts, o.frame_opts, 1.1f);
  for (std::int32_t b = 0; b < plain.NumBins(); ++b) {
    EXPECT_EQ(same.CenterFreqs()[b], plain.CenterFreqs()[b]);
    // α < 1 stretches the bins up (F(f) = f/α), α > 1 squeezes them down, in the linear middle part.
    EXPECT_GT(lo.CenterFreqs()[b], plain.CenterFreqs()[b]) << b;
    EXPECT_LT(hi.CenterFreqs()[b], plain.CenterFreqs()[b]) << b;
  }
  EXPECT_NEAR(lo.CenterFreqs()[10], plain.CenterFreqs()[10] / 0.9, 1e-6 * plain.CenterFreqs()[10]);
}

// Kaldi's "Bad values in options: vtln-low ... and vtln-high ..., versus low-freq ... and high-freq ..."
// cases, checked only when the warp factor is not 1.
TEST(MelBanksVtln, BadCutoffsAreErrorsLikeKaldi) {
  FbankOptions o;
  o.vtln_warp = 0.9f;
  EXPECT_NO_THROW(FbankComputer c(o));
  const auto bad = [&](float low, float high) {
    FbankOptions b = o;
    b.mel_opts.vtln_low = low;
    b.mel_opts.vtln_high = high;
    SCOPED_TRACE(::testing::Message() << "vtln-low " << low << " vtln-high " << high);
    EXPECT_NL_ERROR(FbankComputer c(b), "bad VTLN options");
    b.vtln_warp = 1.0f;  // no warp: the cut-offs are not used, as in Kaldi
    EXPECT_NO_THROW(FbankComputer c(b));
  };
  bad(10, -500);     // vtln-low ≤ low-freq (20)
  bad(20, -500);     // vtln-low = low-freq
  bad(-5, -500);     // negative vtln-low
  bad(8000, -500);   // vtln-low ≥ high-freq
  bad(100, 8000);    // vtln-high = high-freq (Nyquist)
  bad(100, 9000);    // vtln-high above high-freq
  bad(100, -9000);   // Nyquist + vtln-high ≤ 0
  bad(5000, 4000);   // vtln-high ≤ vtln-low
  bad(5000, -3000);  // the same with a Nyquist offset (8000 − 3000 = 5000)
  {
    FbankOptions b = o;
    b.mel_opts.high_freq = 6000;  // vtln-high (7500) above a lowered high-freq
    EXPECT_NL_ERROR(FbankComputer c(b), "high-freq 6000");
  }
  for (float a : {0.0f, -1.0f, std::nanf("")}) {
    FbankOptions b = o;
    b.vtln_warp = a;
    EXPECT_NL_ERROR(FbankComputer c(b), "vtln-warp must be > 0");
  }
}

std::vector<float> synthetic(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1000.0f);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = std::round(nd(rng) + 3000.0f * std::sin(0.05f * static_cast<float>(i)));
  return x;
}

Tensor stream(const FbankOptions& o, const std::vector<float>& x, std::mt19937_64& rng,
              std::size_t max_chunk) {
  OnlineFbank f(o);
  std::uniform_int_distribution<std::size_t> len(1, max_chunk);
  std::size_t pos = 0;
  while (pos < x.size()) {
    const std::size_t k = std::min(x.size() - pos, rng() % 4 == 0 ? std::size_t{1} : len(rng));
    f.AcceptWaveform(o.frame_opts.samp_freq, std::span<const float>(x).subspan(pos, k));
    pos += k;
  }
  f.InputFinished();
  return f.Features();
}

TEST(OnlineFbank, RandomChunksEqualWholeWaveformBitwise) {
  std::mt19937_64 rng(7);
  for (bool snip : {true, false})
    for (float dither : {0.0f, 1.0f})
      for (bool energy : {false, true})
        for (std::size_t n : {std::size_t{401}, std::size_t{1000}, std::size_t{8123}, std::size_t{150}})
          for (std::size_t max_chunk :
               {std::size_t{1}, std::size_t{37}, std::size_t{700}, std::size_t{5000}}) {
            if (snip && n < 400) continue;  // no frame at all: ComputeFbank refuses (tested below)
            FbankOptions o;
            o.frame_opts.snip_edges = snip;
            o.frame_opts.dither = dither;
            o.frame_opts.dither_seed = 99;
            o.use_energy = energy;
            SCOPED_TRACE(::testing::Message() << "snip " << snip << " dither " << dither << " energy "
                                              << energy << " n " << n << " max_chunk " << max_chunk);
            const std::vector<float> x = synthetic(n, n);
            const Tensor whole = ComputeFbank(o, x, 16000);
            const Tensor chunked = stream(o, x, rng, max_chunk);
            ASSERT_TRUE(bitwise_equal(chunked.cview(), whole.cview()));
            ASSERT_EQ(whole.size(0), NumFrames(static_cast<std::int64_t>(n), o.frame_opts));
          }
}

// One extractor reused across waveforms (what `normlab fbank --list` does per thread) gives for each
// exactly what a fresh ComputeFbank does, dither included (the generator restarts from the seed), in any
// order; OnlineFbank::Reset likewise.
TEST(FbankExtractor, ReuseEqualsAFreshComputationBitwise) {
  for (bool snip : {true, false}) {
    FbankOptions o;  // dither 1.0
    o.frame_opts.snip_edges = snip;
    o.frame_opts.dither_seed = 11;
    o.use_energy = true;
    const std::vector<std::vector<float>> waves = {synthetic(4000, 1), synthetic(401, 2),
                                                   synthetic(16000, 3)};
    FbankExtractor ex(o);
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t k = 0; k < waves.size(); ++k) {
        const std::vector<float>& x = waves[pass == 0 ? k : waves.size() - 1 - k];
        ASSERT_TRUE(bitwise_equal(ex.Compute(x, 16000).cview(), ComputeFbank(o, x, 16000).cview()))
            << "snip " << snip << " pass " << pass << " k " << k;
      }
    OnlineFbank online(o);
    online.AcceptWaveform(16000, waves[0]);
    online.Reset();
    online.AcceptWaveform(16000, waves[2]);
    online.InputFinished();
    EXPECT_TRUE(bitwise_equal(online.Features().cview(), ComputeFbank(o, waves[2], 16000).cview()));
    EXPECT_NL_ERROR(ex.Compute(std::vector<float>(10, 1.0f), 16000), "too short");
  }
}

TEST(OnlineFbank, FramesBecomeReadyAsSoonAsTheyFit) {
  FbankOptions o;
  o.frame_opts.dither = 0;
  OnlineFbank f(o);
  const std::vector<float> x = synthetic(1000, 1);
  f.AcceptWaveform(16000, std::span<const float>(x).first(399));
  EXPECT_EQ(f.NumFramesReady(), 0);
  f.AcceptWaveform(16000, std::span<const float>(x).subspan(399, 1));
  EXPECT_EQ(f.NumFramesReady(), 1);
  f.AcceptWaveform(16000, std::span<const float>(x).subspan(400));
  EXPECT_EQ(f.NumFramesReady(), 4);  // 1 + (1000 − 400)/160
  f.InputFinished();
  EXPECT_TRUE(f.IsLastFrame(3));
  EXPECT_NL_ERROR(f.AcceptWaveform(16000, x), "after InputFinished");
  EXPECT_NL_ERROR(f.GetFrame(4), "not ready");
}

TEST(Fbank, DitherIsSeededAndDeterministic) {
  const std::vector<float> x = synthetic(4000, 3);
  FbankOptions o;  // dither 1.0 (Kaldi's default)
  const Tensor a = ComputeFbank(o, x, 16000), b = ComputeFbank(o, x, 16000);
  EXPECT_TRUE(bitwise_equal(a.cview(), b.cview()));
  o.frame_opts.dither_seed = 1;
  const Tensor c = ComputeFbank(o, x, 16000);
  EXPECT_FALSE(bitwise_equal(a.cview(), c.cview()));
  o.frame_opts.dither = 0;
  const Tensor d = ComputeFbank(o, x, 16000);
  EXPECT_LT(max_abs_diff(a.cview(), d.cview()), 0.05);  // dither of 1 on samples of ~±3000: tiny effect
}

TEST(Fbank, SilenceIsFlooredAtLogFltEpsilon) {
  FbankOptions o;
  o.frame_opts.dither = 0;
  const std::vector<float> x(1600, 0.0f);
  const Tensor t = ComputeFbank(o, x, 16000);
  for (Index i = 0; i < t.numel(); ++i) ASSERT_EQ(t[i], std::log(FLT_EPSILON));
  EXPECT_NEAR(std::log(FLT_EPSILON), -15.942385, 1e-5);
}

// Mel energies beyond float's range (samples of 1e18 from a float WAV) give finite logs, as in double.
TEST(Fbank, EnergiesBeyondFloatRangeStayFinite) {
  FbankOptions o;
  o.frame_opts.dither = 0;
  std::vector<float> x = synthetic(1600, 4);
  for (float& v : x) v *= 1e15f;
  const Tensor t = ComputeFbank(o, x, 16000);
  const Tensor ref = ComputeFbank(o, synthetic(1600, 4), 16000);
  for (Index i = 0; i < t.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(t[i])) << i;
    ASSERT_NEAR(t[i], ref[i] + 2 * std::log(1e15), 1e-4 * std::fabs(t[i])) << i;  // gain g: + 2 ln g
  }
}

TEST(Fbank, ShorterThanOneFrameIsAnError) {
  FbankOptions o;
  const std::vector<float> x(399, 1.0f);
  EXPECT_NL_ERROR(ComputeFbank(o, x, 16000), "too short for one 400-sample frame");
  EXPECT_EQ(NumFrames(399, o.frame_opts), 0);  // what Kaldi would output (with a warning)
  // snip_edges = false: Kaldi mirrors short input into frames; only < shift/2 samples give none.
  o.frame_opts.snip_edges = false;
  EXPECT_EQ(ComputeFbank(o, x, 16000).size(0), 2);
  EXPECT_NL_ERROR(ComputeFbank(o, std::vector<float>(79, 1.0f), 16000), "too short");
  EXPECT_NL_ERROR(ComputeFbank(o, std::vector<float>(), 16000), "0 samples");
}

TEST(Fbank, SampleRateMismatchIsAnError) {
  FbankOptions o;
  EXPECT_NL_ERROR(ComputeFbank(o, synthetic(1000, 1), 8000), "sample frequency mismatch");
  EXPECT_NL_ERROR(ComputeFbank(o, synthetic(1000, 1), 8000), "does not resample");
}

TEST(FbankOptions, DefaultsArePinnedToKaldi) {
  const FbankOptions o;
  EXPECT_FALSE(o.use_energy);
  EXPECT_EQ(o.energy_floor, 0.0f);
  EXPECT_TRUE(o.raw_energy);
  EXPECT_FALSE(o.htk_compat);
  EXPECT_TRUE(o.use_log_fbank);
  EXPECT_TRUE(o.use_power);
  const FrameExtractionOptions& f = o.frame_opts;
  EXPECT_EQ(f.samp_freq, 16000.0f);
  EXPECT_EQ(f.frame_shift_ms, 10.0f);
  EXPECT_EQ(f.frame_length_ms, 25.0f);
  EXPECT_EQ(f.dither, 1.0f);
  EXPECT_EQ(f.preemph_coeff, 0.97f);
  EXPECT_TRUE(f.remove_dc_offset);
  EXPECT_EQ(f.window_type, "povey");
  EXPECT_TRUE(f.round_to_power_of_two);
  EXPECT_EQ(f.blackman_coeff, 0.42f);
  EXPECT_TRUE(f.snip_edges);
  EXPECT_EQ(f.dither_seed, 0u);
  EXPECT_EQ(f.WindowShift(), 160);
  EXPECT_EQ(f.WindowSize(), 400);
  EXPECT_EQ(f.PaddedWindowSize(), 512);
  const MelBanksOptions& m = o.mel_opts;
  EXPECT_EQ(m.num_bins, 23);
  EXPECT_EQ(m.low_freq, 20.0f);
  EXPECT_EQ(m.high_freq, 0.0f);
  EXPECT_EQ(m.vtln_low, 100.0f);
  EXPECT_EQ(m.vtln_high, -500.0f);
  EXPECT_FALSE(m.htk_mode);
  EXPECT_EQ(o.vtln_warp, 1.0f);
  EXPECT_EQ(FbankComputer(o).Dim(), 23);
  FbankOptions e;
  e.use_energy = true;
  EXPECT_EQ(FbankComputer(e).Dim(), 24);
}

}  // namespace
}  // namespace normlab::speech
