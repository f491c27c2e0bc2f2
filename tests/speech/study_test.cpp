// The speech study (src/speech/study.h): the front ends' exact algebra on synthetic log-mel matrices (which
// axis removes which kind of shift), the residual metric, the manifest reader, and a tiny end-to-end run of
// `normlab speech-study --quick` on `normlab speech-data --limit 2` output. espeak-ng and sox are required
// for the end-to-end test (a missing tool is a failure, not a skip), as in dataset_test.cpp.
#include "speech/study.h"

#include <gtest/gtest.h>
#include <normlab/error.h>
#include <normlab/speech/wav.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace normlab::speech {
namespace {

namespace fs = std::filesystem;

// A synthetic "log-mel" matrix: bands with different means and spreads (as real log-mel bands have), so
// that variance normalization over one axis does not commute with a shift along the other.
FeatureMatrix synthetic(Index T, Index F, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  FeatureMatrix x{T, F, std::vector<float>(static_cast<std::size_t>(T * F))};
  for (Index t = 0; t < T; ++t)
    for (Index f = 0; f < F; ++f)
      x.data[static_cast<std::size_t>(t * F + f)] =
          static_cast<float>(8.0 - 0.1 * static_cast<double>(f) + (0.5 + 0.08 * static_cast<double>(f)) * nd(rng));
  return x;
}

// x[t, f] + c + s[t] + b[f].
FeatureMatrix shifted(const FeatureMatrix& x, double c, const std::vector<double>& s, const std::vector<double>& b) {
  FeatureMatrix y = x;
  for (Index t = 0; t < x.frames; ++t)
    for (Index f = 0; f < x.dims; ++f)
      y.data[static_cast<std::size_t>(t * x.dims + f)] = static_cast<float>(
          x.data[static_cast<std::size_t>(t * x.dims + f)] + c + (s.empty() ? 0.0 : s[static_cast<std::size_t>(t)]) +
          (b.empty() ? 0.0 : b[static_cast<std::size_t>(f)]));
  return y;
}

std::vector<double> random_shifts(std::size_t n, std::uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::bernoulli_distribution sign(0.5);
  std::vector<double> v(n);
  for (double& x : v) x = (sign(rng) ? 1 : -1) * u(rng);
  return v;
}

double rms(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s / static_cast<double>(v.size()));
}

// fp32 outputs of O(1) (normalized) or O(10) (raw) values: "removed exactly" means rounding level.
constexpr double kExact = 2e-5;
// "Not removed": a residual of at least this much.
constexpr double kClearly = 0.05;

constexpr Index kT = 60, kF = 40;

TEST(SpeechStudyFrontEnd, NamesRoundTrip) {
  for (FrontEnd fe : kAllFrontEnds) EXPECT_EQ(parse_front_end(front_end_name(fe)), fe);
  EXPECT_THROW(parse_front_end("layernorm"), Error);
}

TEST(SpeechStudyFrontEnd, RmsDistanceIsPerCellRms) {
  const FeatureMatrix a{2, 2, {0, 0, 0, 0}}, b{2, 2, {3, 4, 0, 0}};
  EXPECT_DOUBLE_EQ(rms_distance(a, b), 2.5);  // sqrt((9 + 16) / 4)
  EXPECT_DOUBLE_EQ(rms_distance(b, b), 0.0);
  const FeatureMatrix c{1, 4, {0, 0, 0, 0}};
  EXPECT_THROW(rms_distance(a, c), Error);
}

TEST(SpeechStudyFrontEnd, FrontEndsComputeTheirDefinitions) {
  const FeatureMatrix x = synthetic(kT, kF, 1);
  const double eps = 1e-5;
  const FeatureMatrix fln = apply_front_end(FrontEnd::kFLn, x, eps), tcmvn = apply_front_end(FrontEnd::kTCmvn, x, eps),
                      tcmn = apply_front_end(FrontEnd::kTCmn, x, eps), fmean = apply_front_end(FrontEnd::kFMean, x, eps);
  auto at = [](const FeatureMatrix& m, Index t, Index f) { return double(m.data[static_cast<std::size_t>(t * m.dims + f)]); };
  for (Index t = 0; t < kT; ++t) {  // per frame over F
    double m = 0, v = 0;
    for (Index f = 0; f < kF; ++f) m += at(x, t, f);
    m /= kF;
    for (Index f = 0; f < kF; ++f) v += (at(x, t, f) - m) * (at(x, t, f) - m);
    v /= kF;
    for (Index f = 0; f < kF; ++f) {
      EXPECT_NEAR(at(fln, t, f), (at(x, t, f) - m) / std::sqrt(v + eps), 1e-5);
      EXPECT_NEAR(at(fmean, t, f), at(x, t, f) - m, 1e-5);
    }
  }
  for (Index f = 0; f < kF; ++f) {  // per band over T
    double m = 0, v = 0;
    for (Index t = 0; t < kT; ++t) m += at(x, t, f);
    m /= kT;
    for (Index t = 0; t < kT; ++t) v += (at(x, t, f) - m) * (at(x, t, f) - m);
    v /= kT;
    for (Index t = 0; t < kT; ++t) {
      EXPECT_NEAR(at(tcmvn, t, f), (at(x, t, f) - m) / std::sqrt(v), 1e-5);
      EXPECT_NEAR(at(tcmn, t, f), at(x, t, f) - m, 1e-5);
    }
  }
  // Compositions apply the first-named axis first.
  EXPECT_EQ(apply_front_end(FrontEnd::kTThenF, x, eps).data, apply_front_end(FrontEnd::kFLn, tcmvn, eps).data);
  EXPECT_EQ(apply_front_end(FrontEnd::kFThenT, x, eps).data, apply_front_end(FrontEnd::kTCmvn, fln, eps).data);
  EXPECT_EQ(apply_front_end(FrontEnd::kTThenFMean, x, eps).data, apply_front_end(FrontEnd::kFMean, tcmn, eps).data);
  EXPECT_EQ(apply_front_end(FrontEnd::kFThenTMean, x, eps).data, apply_front_end(FrontEnd::kTCmn, fmean, eps).data);
  EXPECT_EQ(apply_front_end(FrontEnd::kNone, x, eps).data, x.data);
}

TEST(SpeechStudyResidual, ConstantShiftIsRemovedExactlyByBothAxes) {
  const FeatureMatrix x = synthetic(kT, kF, 2);
  for (double c : {4.605, -9.21}) {  // ±20 dB and −40 dB of gain: 2·ln(10^(dB/20))
    const FeatureMatrix y = shifted(x, c, {}, {});
    EXPECT_NEAR(front_end_residual(FrontEnd::kNone, x, y), std::abs(c), 1e-5);
    for (FrontEnd fe : kAllFrontEnds) {
      if (fe == FrontEnd::kNone) continue;
      EXPECT_LT(front_end_residual(fe, x, y), kExact) << front_end_name(fe) << " c=" << c;
    }
  }
}

TEST(SpeechStudyResidual, PerFrameShiftIsRemovedOnlyByFNorm) {
  const FeatureMatrix x = synthetic(kT, kF, 3);
  const std::vector<double> s = random_shifts(kT, 30, 2.3, 3.5);  // ±20–30 dB segment gains in log-mel units
  const FeatureMatrix y = shifted(x, 0, s, {});
  EXPECT_NEAR(front_end_residual(FrontEnd::kNone, x, y), rms(s), 1e-5);
  // Removed exactly: everything whose LAST per-frame step (or only step) is over F, and the means-only pair.
  for (FrontEnd fe : {FrontEnd::kFLn, FrontEnd::kFMean, FrontEnd::kFThenT, FrontEnd::kFThenTMean, FrontEnd::kTThenFMean})
    EXPECT_LT(front_end_residual(fe, x, y), kExact) << front_end_name(fe);
  // Not removed: normalization over T alone; and T-CMVN first scales each band's copy of the shift by its
  // own 1/σ_f, which F-LN then cannot remove (the order matters with variance normalization).
  for (FrontEnd fe : {FrontEnd::kTCmvn, FrontEnd::kTCmn, FrontEnd::kTThenF})
    EXPECT_GT(front_end_residual(fe, x, y), kClearly) << front_end_name(fe);
  // T-CMN leaves the shift's deviation from its time average in every band: residual = RMS(s − mean(s)).
  double m = 0;
  for (double v : s) m += v;
  m /= static_cast<double>(s.size());
  std::vector<double> centred;
  for (double v : s) centred.push_back(v - m);
  EXPECT_NEAR(front_end_residual(FrontEnd::kTCmn, x, y), rms(centred), 1e-4);
}

TEST(SpeechStudyResidual, PerBandShiftIsRemovedOnlyByTNorm) {
  const FeatureMatrix x = synthetic(kT, kF, 4);
  const std::vector<double> b = random_shifts(kF, 40, 0.5, 3.0);  // a channel: a fixed offset per band
  const FeatureMatrix y = shifted(x, 0, {}, b);
  EXPECT_NEAR(front_end_residual(FrontEnd::kNone, x, y), rms(b), 1e-5);
  for (FrontEnd fe : {FrontEnd::kTCmvn, FrontEnd::kTCmn, FrontEnd::kTThenF, FrontEnd::kTThenFMean, FrontEnd::kFThenTMean})
    EXPECT_LT(front_end_residual(fe, x, y), kExact) << front_end_name(fe);
  for (FrontEnd fe : {FrontEnd::kFLn, FrontEnd::kFMean, FrontEnd::kFThenT})
    EXPECT_GT(front_end_residual(fe, x, y), kClearly) << front_end_name(fe);
  // F-mean leaves the band offsets' deviation from their mean in every frame: residual = RMS(b − mean(b)).
  double m = 0;
  for (double v : b) m += v;
  m /= static_cast<double>(b.size());
  std::vector<double> centred;
  for (double v : b) centred.push_back(v - m);
  EXPECT_NEAR(front_end_residual(FrontEnd::kFMean, x, y), rms(centred), 1e-4);
}

TEST(SpeechStudyResidual, MeansOnlyVariantsRemoveBothShiftsInEitherOrder) {
  const FeatureMatrix x = synthetic(kT, kF, 5);
  const FeatureMatrix y = shifted(x, 3.0, random_shifts(kT, 50, 2.3, 3.5), random_shifts(kF, 51, 0.5, 3.0));
  EXPECT_LT(front_end_residual(FrontEnd::kTThenFMean, x, y), kExact);
  EXPECT_LT(front_end_residual(FrontEnd::kFThenTMean, x, y), kExact);
  // The two orders commute: both are x − row mean − column mean + grand mean.
  EXPECT_LT(rms_distance(apply_front_end(FrontEnd::kTThenFMean, x), apply_front_end(FrontEnd::kFThenTMean, x)), 1e-5);
  // With variances, neither order removes both at once, and no single axis does.
  for (FrontEnd fe : {FrontEnd::kFLn, FrontEnd::kTCmvn, FrontEnd::kTThenF, FrontEnd::kFThenT, FrontEnd::kTCmn,
                      FrontEnd::kFMean})
    EXPECT_GT(front_end_residual(fe, x, y), kClearly) << front_end_name(fe);
}

// Through the real front end: a constant gain on a float WAV shifts every unfloored log-mel cell by
// 2·ln(g) = dB·ln(10)/10, and both axes remove it.
TEST(SpeechStudyResidual, ConstantGainOnAudioShiftsLogMelByTwoLnG) {
  const fs::path dir = fs::temp_directory_path() / ("normlab_study_gain_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::mt19937_64 rng(9);
  std::normal_distribution<double> nd(0.0, 0.05);
  std::vector<float> x(16000), g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(nd(rng) * (1.0 + 0.8 * std::sin(static_cast<double>(i) * 0.001)));
    g[i] = static_cast<float>(x[i] * 10.0);  // +20 dB
  }
  const WavWriteOptions wo{.format = WavSampleFormat::kFloat32, .from_int16_scale = false};
  write_wav((dir / "a.wav").string(), x, 16000, wo);
  write_wav((dir / "b.wav").string(), g, 16000, wo);
  const FeatureMatrix a = study_features((dir / "a.wav").string()), b = study_features((dir / "b.wav").string());
  ASSERT_EQ(a.dims, 40);
  ASSERT_EQ(a.frames, 98);  // (16000 − 400) / 160 + 1
  EXPECT_NEAR(front_end_residual(FrontEnd::kNone, a, b), 2.0 * std::log(10.0), 1e-4);
  EXPECT_LT(front_end_residual(FrontEnd::kFLn, a, b), 1e-4);
  EXPECT_LT(front_end_residual(FrontEnd::kTCmvn, a, b), 1e-4);
  fs::remove_all(dir);
}

TEST(SpeechStudyManifest, ReadsRowsAndRejectsBadFiles) {
  const fs::path dir = fs::temp_directory_path() / ("normlab_study_manifest_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "manifest.csv");
    f << "file,split,digit,voice,speed,pitch,corruption,params\n"
         "test/v_3_0.wav,test,3,en-us+m6,150,40,clean,\n"
         "test-corrupt/channel/v_3_0.wav,test,3,en-us+m6,150,40,channel,hp=1Hz, lp=2Hz\n";
  }
  const std::vector<ManifestRow> rows = read_manifest(dir.string());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].file, "test/v_3_0.wav");
  EXPECT_EQ(rows[0].digit, 3);
  EXPECT_EQ(rows[0].speed, 150);
  EXPECT_EQ(rows[0].corruption, "clean");
  EXPECT_EQ(rows[0].params, "");
  EXPECT_EQ(rows[1].params, "hp=1Hz, lp=2Hz");
  {
    std::ofstream f(dir / "manifest.csv");
    f << "file,split,digit,voice,speed,pitch,corruption,params\ntest/x.wav,test,eleven,v,1,2,clean,\n";
  }
  EXPECT_THROW(read_manifest(dir.string()), Error);
  fs::remove_all(dir);
  EXPECT_THROW(read_manifest(dir.string()), Error);
}

int run(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(SpeechStudyCli, QuickRunOnATinyDataSetWritesTheJsonStructure) {
  ASSERT_EQ(run("espeak-ng --version >/dev/null 2>&1"), 0) << "espeak-ng is missing: run scripts/install-deps";
  ASSERT_EQ(run("sox --version >/dev/null 2>&1"), 0) << "sox is missing: run scripts/install-deps";
  const fs::path dir = fs::temp_directory_path() / ("normlab_study_cli_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string cli = NORMLAB_CLI;
  ASSERT_EQ(run(cli + " speech-data --quiet --out " + (dir / "sd").string() + " --limit 2 --seed 0 > " +
                (dir / "data.log").string() + " 2>&1"),
            0)
      << slurp(dir / "data.log");
  ASSERT_EQ(run(cli + " speech-study --data " + (dir / "sd").string() + " --out " + (dir / "study.json").string() +
                " --quick --seeds 2 --steps 4 --eval-every 2 --batch 4 --layers 1 --d-model 16 --heads 2 --ffn 16 "
                "2> " + (dir / "study.log").string()),
            0)
      << slurp(dir / "study.log");
  const nlohmann::json j = nlohmann::json::parse(slurp(dir / "study.json"));
  EXPECT_TRUE(j.contains("seconds"));
  ASSERT_TRUE(j.contains("config"));
  EXPECT_EQ(j["config"]["num_bins"], 40);
  EXPECT_EQ(j["config"]["test_utterances"], 20);  // --limit 2: 2 voices × 2 digits × 5 renditions

  const auto& r = j.at("residuals");
  const std::vector<std::string> rows = {"clean",     "gain+20dB",    "gain-20dB", "gain+40dB",
                                         "gain-40dB", "segment-gain", "channel"};
  EXPECT_EQ(r["corruptions"].get<std::vector<std::string>>(), rows);
  ASSERT_EQ(r["front_ends"].size(), std::size(kAllFrontEnds));
  for (const std::string& row : rows)
    for (FrontEnd fe : kAllFrontEnds) {
      const std::string n = front_end_name(fe);
      ASSERT_TRUE(r["mean"][row][n].is_number()) << row << " " << n;
      ASSERT_TRUE(r["sd"][row][n].is_number());
      const double v = r["mean"][row][n];
      EXPECT_GE(v, 0.0);
      if (row == "clean") {
        EXPECT_EQ(v, 0.0) << n;  // the control
      }
    }
  // Without normalization a ±20 dB gain moves every unfloored cell by 2·ln(10) = 4.61.
  EXPECT_NEAR(r["mean"]["gain+20dB"]["none"].get<double>(), 2 * std::log(10.0), 0.3);
  for (FrontEnd fe : kAllFrontEnds) EXPECT_TRUE(r["scale"][front_end_name(fe)].is_number());

  const auto& c = j.at("classifier");
  EXPECT_EQ(c["status"], "run");
  const std::vector<std::string> fes = {"none", "f-ln", "t-cmvn", "t-then-f"};
  EXPECT_EQ(c["front_ends"].get<std::vector<std::string>>(), fes);
  EXPECT_EQ(c["config"]["steps"], 4);
  ASSERT_EQ(c["per_seed"].size(), fes.size() * 2);
  for (const auto& run : c["per_seed"]) {
    EXPECT_EQ(run["steps"], 4);
    for (const std::string& s : rows) {
      const double a = run["test_acc"][s];
      EXPECT_GE(a, 0.0);
      EXPECT_LE(a, 1.0);
    }
  }
  for (const std::string& fe : fes)
    for (const std::string& s : rows) {
      EXPECT_TRUE(c["summary"][fe][s]["mean"].is_number());
      EXPECT_TRUE(c["summary"][fe][s]["sd"].is_number());
      EXPECT_EQ(c["summary"][fe][s]["values"].size(), 2u);
    }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace normlab::speech
