// The spoken-digit data set (src/speech/dataset.h) through `normlab speech-data`, and its corruptions
// (src/speech/corrupt.h). espeak-ng and sox are required (scripts/install-deps installs them): when they are
// missing the data-set tests FAIL, they do not skip.
#include "speech/dataset.h"

#include <gtest/gtest.h>
#include <normlab/speech/wav.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numbers>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "speech/corrupt.h"
#include "support/tolerance.h"

namespace normlab::speech {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int run(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::vector<std::map<std::string, std::string>> read_csv(const fs::path& p) {
  std::ifstream f(p);
  std::string line;
  std::getline(f, line);
  std::vector<std::string> header;
  std::stringstream hs(line);
  for (std::string h; std::getline(hs, h, ',');) header.push_back(h);
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(f, line)) {
    std::map<std::string, std::string> row;
    std::stringstream ls(line);
    std::string cell;
    for (std::size_t i = 0; i < header.size(); ++i) {
      if (!std::getline(ls, cell, ',')) cell.clear();
      row[header[i]] = cell;
    }
    rows.push_back(row);
  }
  return rows;
}

// Relative path → bytes of every file under `root`.
std::map<std::string, std::string> tree(const fs::path& root) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) m[fs::relative(e.path(), root).string()] = slurp(e.path());
  return m;
}

class SpeechDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("normlab_speech_data_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // Required tools: a missing one is a failure, not a skip.
    ASSERT_EQ(run("espeak-ng --version >/dev/null 2>&1"), 0)
        << "espeak-ng is missing: run scripts/install-deps";
    ASSERT_EQ(run("sox --version >/dev/null 2>&1"), 0) << "sox is missing: run scripts/install-deps";
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  int make(const std::string& out, const std::string& args) {
    return run(std::string(NORMLAB_CLI) + " speech-data --quiet --out " + (dir_ / out).string() + " " + args +
               " >" + (dir_ / (out + ".log")).string() + " 2>&1");
  }
  fs::path dir_;
};

TEST_F(SpeechDataTest, LimitedSetHasTheManifestSplitsAndCorruptions) {
  ASSERT_EQ(make("a", "--limit 2 --seed 5"), 0) << slurp(dir_ / "a.log");
  const auto rows = read_csv(dir_ / "a" / "manifest.csv");
  // 2 voices per split × 3 splits × 2 digits × 5 renditions, + 6 corrupted copies of each of the 20 test
  // clips.
  ASSERT_EQ(rows.size(), 60u + 120u);
  std::map<std::string, std::set<std::string>> voices_of;
  std::map<std::string, int> per_corruption;
  for (const auto& r : rows) {
    SCOPED_TRACE(r.at("file"));
    ASSERT_TRUE(fs::exists(dir_ / "a" / r.at("file")));
    const int speed = std::stoi(r.at("speed")), pitch = std::stoi(r.at("pitch")),
              digit = std::stoi(r.at("digit"));
    EXPECT_GE(speed, 130);
    EXPECT_LE(speed, 210);
    EXPECT_GE(pitch, 25);
    EXPECT_LE(pitch, 75);
    EXPECT_TRUE(digit == 0 || digit == 1);
    voices_of[r.at("split")].insert(r.at("voice"));
    ++per_corruption[r.at("corruption")];
    const Waveform w = read_wav((dir_ / "a" / r.at("file")).string(), {.normalize = true});
    if (r.at("corruption") == "clean") {
      EXPECT_EQ(w.format, WavSampleFormat::kPcm16);
    } else {
      EXPECT_EQ(r.at("split"), "test");
      EXPECT_EQ(w.format, WavSampleFormat::kFloat32);
    }
  }
  EXPECT_EQ(per_corruption["clean"], 60);
  for (const char* k : kCorruptions) EXPECT_EQ(per_corruption[k], 20) << k;
  // Speaker-disjoint: no voice in two splits, and the test accents are not train accents.
  EXPECT_EQ(voices_of["train"], (std::set<std::string>{"en-us+m1", "en-us+m2"}));
  EXPECT_EQ(voices_of["validation"], (std::set<std::string>{"en-us+m6", "en-us+f4"}));
  EXPECT_EQ(voices_of["test"], (std::set<std::string>{"en-gb-x-gbclan+m6", "en-gb-x-gbclan+m7"}));
  // Corrupted copies: a +40 dB copy is 100× the clean clip (float WAV, nothing clipped).
  const Waveform clean = read_wav((dir_ / "a/test/en-gb-x-gbclan+m6_0_0.wav").string(), {.normalize = true});
  const Waveform loud =
      read_wav((dir_ / "a/test-corrupt/gain+40dB/en-gb-x-gbclan+m6_0_0.wav").string(), {.normalize = true});
  ASSERT_EQ(clean.samples.size(), loud.samples.size());
  float peak = 0;
  for (std::size_t i = 0; i < clean.samples.size(); ++i) {
    ASSERT_NEAR(loud.samples[i], 100.0f * clean.samples[i], 1e-5f * (1 + std::fabs(loud.samples[i])));
    peak = std::max(peak, std::fabs(loud.samples[i]));
  }
  EXPECT_GT(peak, 1.0f);
  // Distinct voices: probe hashes differ.
  const auto voices = read_csv(dir_ / "a" / "voices.csv");
  std::set<std::string> hashes;
  for (const auto& v : voices) hashes.insert(v.at("probe_hash"));
  EXPECT_EQ(hashes.size(), voices.size());
}

TEST_F(SpeechDataTest, SameSeedSameBytesAnyThreadCountOtherSeedOtherBytes) {
  ASSERT_EQ(make("a", "--limit 1 --seed 11 --jobs 2"), 0) << slurp(dir_ / "a.log");
  ASSERT_EQ(make("b", "--limit 1 --seed 11 --jobs 1"), 0) << slurp(dir_ / "b.log");
  ASSERT_EQ(make("c", "--limit 1 --seed 12"), 0) << slurp(dir_ / "c.log");
  const auto a = tree(dir_ / "a"), b = tree(dir_ / "b"), c = tree(dir_ / "c");
  ASSERT_EQ(a.size(), 15u + 30u + 2u);  // 15 clips, 5 test clips × 6 copies, manifest.csv, voices.csv
  EXPECT_TRUE(a == b) << "same seed gave different files";
  EXPECT_NE(a.at("manifest.csv"), c.at("manifest.csv"));
  EXPECT_NE(a.at("test/en-gb-x-gbclan+m6_0_0.wav"), c.at("test/en-gb-x-gbclan+m6_0_0.wav"));
}

TEST_F(SpeechDataTest, ALimitedSubsetHasTheFullSetsParameters) {
  ASSERT_EQ(make("one", "--limit 1 --seed 4 --no-corrupt"), 0) << slurp(dir_ / "one.log");
  ASSERT_EQ(make("two", "--limit 2 --seed 4 --no-corrupt"), 0) << slurp(dir_ / "two.log");
  std::map<std::string, std::string> two;
  for (const auto& r : read_csv(dir_ / "two" / "manifest.csv"))
    two[r.at("file")] = r.at("speed") + "/" + r.at("pitch");
  for (const auto& r : read_csv(dir_ / "one" / "manifest.csv"))
    EXPECT_EQ(two.at(r.at("file")), r.at("speed") + "/" + r.at("pitch")) << r.at("file");
}

TEST(DigitVoices, SplitsFollowTheRecipeAndAreSpeakerDisjoint) {
  const auto v = DigitVoices();
  std::map<std::string, std::set<std::string>> names, accents;
  for (const auto& x : v) {
    names[x.split].insert(x.name);
    accents[x.split].insert(x.name.substr(0, x.name.find('+')));
    if (x.name.rfind("en-gb+", 0) == 0)
      EXPECT_EQ(x.espeak_voice, "en+" + x.name.substr(6));  // variant applies
    else
      EXPECT_EQ(x.espeak_voice, x.name);
  }
  EXPECT_EQ(names["train"].size(), 40u);
  EXPECT_EQ(names["validation"].size(), 10u);
  EXPECT_EQ(names["test"].size(), 12u);
  EXPECT_EQ(v.size(), 62u);
  for (const auto& a : accents["test"]) EXPECT_EQ(accents["train"].count(a), 0u) << a;
  EXPECT_EQ(accents["validation"], accents["train"]);
}

TEST(Corrupt, RbjBiquadsHaveTheirNominalResponses) {
  const double fs = 16000;
  const Biquad lp = Biquad::Lowpass(fs, 3000, std::numbers::sqrt2 / 2);
  EXPECT_NEAR(lp.MagnitudeAt(fs, 0), 1.0, 1e-12);
  EXPECT_NEAR(20 * std::log10(lp.MagnitudeAt(fs, 3000)), -3.0103, 1e-3);
  EXPECT_LT(lp.MagnitudeAt(fs, 7000), 0.05);
  const Biquad hp = Biquad::Highpass(fs, 300, std::numbers::sqrt2 / 2);
  EXPECT_NEAR(hp.MagnitudeAt(fs, 8000), 1.0, 1e-12);
  EXPECT_NEAR(20 * std::log10(hp.MagnitudeAt(fs, 300)), -3.0103, 1e-3);
  const Biquad eq = Biquad::Peaking(fs, 1000, 1.0, -7.5);
  EXPECT_NEAR(20 * std::log10(eq.MagnitudeAt(fs, 1000)), -7.5, 1e-9);
  EXPECT_NEAR(eq.MagnitudeAt(fs, 0), 1.0, 1e-9);
  // Filtering a sinusoid gives (after the transient) the predicted amplitude.
  std::vector<double> x(16000);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(2 * std::numbers::pi * 1000 * static_cast<double>(i) / fs);
  eq.Process(x);
  double peak = 0;
  for (std::size_t i = 8000; i < x.size(); ++i) peak = std::max(peak, std::fabs(x[i]));
  EXPECT_NEAR(peak, std::pow(10.0, -7.5 / 20), 1e-3);
}

TEST(Corrupt, GainsAndSegmentsAndChannelAreSeeded) {
  std::vector<float> x(16000, 1.0f);
  ApplyGainDb(x, 20);
  EXPECT_FLOAT_EQ(x[0], 10.0f);
  std::vector<float> y(16000, 1.0f);
  std::mt19937_64 rng(1);
  const auto gains = ApplySegmentGain(y, 16000, rng);
  EXPECT_GE(gains.size(), 10u);  // 1 s in segments of 50–100 ms
  EXPECT_LE(gains.size(), 21u);
  for (double g : gains) {
    EXPECT_GE(std::fabs(g), 20.0);
    EXPECT_LE(std::fabs(g), 30.0);
  }
  EXPECT_FLOAT_EQ(y[0], static_cast<float>(std::pow(10.0, gains[0] / 20)));
  std::mt19937_64 r1(9), r2(9);
  const ChannelFilter a = ChannelFilter::Random(r1), b = ChannelFilter::Random(r2);
  EXPECT_EQ(a.ToString(), b.ToString());
  EXPECT_GE(a.highpass_hz, 100);
  EXPECT_LE(a.highpass_hz, 600);
  EXPECT_GE(a.lowpass_hz, 2500);
  EXPECT_LE(a.lowpass_hz, 5000);
  EXPECT_GE(a.eq_hz, 500);
  EXPECT_LE(a.eq_hz, 3000);
  EXPECT_LE(std::fabs(a.eq_db), 10);
}

}  // namespace
}  // namespace normlab::speech
