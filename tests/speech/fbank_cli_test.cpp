// `normlab fbank` end to end: the CLI's output equals the library's bitwise, --list runs many files in
// parallel, Kaldi-style flags parse, and errors exit 1 with "normlab: error:" and no output file.
#include <gtest/gtest.h>
#include <normlab/npy.h>
#include <normlab/speech/fbank.h>
#include <normlab/speech/wav.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "support/tolerance.h"

namespace normlab::speech {
namespace {

namespace fs = std::filesystem;
using normlab::testing::bitwise_equal;
const std::string kFix = std::string(NORMLAB_FIXTURES_DIR) + "/fbank/";

class FbankCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("normlab_fbank_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  int run(const std::string& args) {
    const int st = std::system((std::string(NORMLAB_CLI) + " fbank " + args + " >" +
                                (dir_ / "out.txt").string() + " 2>" + (dir_ / "err.txt").string())
                                   .c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  std::string err() const {
    std::ifstream f(dir_ / "err.txt");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  std::string p(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(FbankCliTest, SingleFileEqualsTheLibraryBitwise) {
  ASSERT_EQ(
      run(kFix + "tone16k.wav -o " + p("a.npy") +
          " --num-mel-bins 40 --snip-edges=false --window-type hamming --dither 0.5 --seed 3 --layout ft"),
      0)
      << err();
  FbankOptions o;
  o.mel_opts.num_bins = 40;
  o.frame_opts.snip_edges = false;
  o.frame_opts.window_type = "hamming";
  o.frame_opts.dither = 0.5f;
  o.frame_opts.dither_seed = 3;
  const Waveform w = read_wav(kFix + "tone16k.wav");
  const Tensor ref = ComputeFbank(o, w.samples, w.samp_freq, FeatureLayout::kFT);
  EXPECT_TRUE(bitwise_equal(load_npy(p("a.npy")).cview(), ref.cview()));
}

TEST_F(FbankCliTest, KaldiFlagsReachTheOptions) {
  ASSERT_EQ(run(kFix + "tone8k.wav -o " + p("b.npy") +
                " --sample-frequency 8000 --frame-length 20 --frame-shift 5 --dither 0 "
                "--preemphasis-coefficient 0.9"
                " --remove-dc-offset=false --round-to-power-of-two=false --low-freq 100 --high-freq -200"
                " --use-energy --num-mel-bins 15"),
            0)
      << err();
  FbankOptions o;
  o.frame_opts.samp_freq = 8000;
  o.frame_opts.frame_length_ms = 20;
  o.frame_opts.frame_shift_ms = 5;
  o.frame_opts.dither = 0;
  o.frame_opts.preemph_coeff = 0.9f;
  o.frame_opts.remove_dc_offset = false;
  o.frame_opts.round_to_power_of_two = false;
  o.mel_opts.low_freq = 100;
  o.mel_opts.high_freq = -200;
  o.mel_opts.num_bins = 15;
  o.use_energy = true;
  const Waveform w = read_wav(kFix + "tone8k.wav", {.expected_samp_freq = 8000});
  const Tensor ref = ComputeFbank(o, w.samples, w.samp_freq);
  EXPECT_EQ(ref.size(1), 16);
  EXPECT_TRUE(bitwise_equal(load_npy(p("b.npy")).cview(), ref.cview()));
}

TEST_F(FbankCliTest, VtlnFlagsReachTheOptions) {
  ASSERT_EQ(run(kFix + "tone16k.wav -o " + p("v.npy") + " --dither 0 --vtln-warp 1.1 --vtln-low 250 --vtln-high -800"),
            0)
      << err();
  FbankOptions o;
  o.frame_opts.dither = 0;
  o.vtln_warp = 1.1f;
  o.mel_opts.vtln_low = 250;
  o.mel_opts.vtln_high = -800;
  const Waveform w = read_wav(kFix + "tone16k.wav");
  EXPECT_TRUE(bitwise_equal(load_npy(p("v.npy")).cview(), ComputeFbank(o, w.samples, w.samp_freq).cview()));
  EXPECT_EQ(run(kFix + "tone16k.wav -o " + p("bad.npy") + " --dither 0 --vtln-warp 0.9 --vtln-low 10"), 1);
  EXPECT_NE(err().find("bad VTLN options"), std::string::npos) << err();
  EXPECT_FALSE(fs::exists(p("bad.npy")));
}

TEST_F(FbankCliTest, ListRunsEveryFileInParallel) {
  // The same clip under several names plus one 8 kHz clip resampled nowhere: list order and threads must not
  // matter.
  for (int i = 0; i < 5; ++i) fs::copy_file(kFix + "tone16k.wav", p("clip" + std::to_string(i) + ".wav"));
  {
    std::ofstream l(p("list.txt"));
    l << "# five copies\n";
    for (int i = 0; i < 5; ++i) l << p("clip" + std::to_string(i) + ".wav") << "\n\n";
  }
  ASSERT_EQ(run("--list " + p("list.txt") + " --out-dir " + p("feats") + " --dither 0 --jobs 2 --stats"), 0)
      << err();
  const Tensor first = load_npy(p("feats/clip0.npy"));
  EXPECT_EQ(first.shape(), (Dims{48, 23}));
  for (int i = 1; i < 5; ++i)
    EXPECT_TRUE(bitwise_equal(load_npy(p("feats/clip" + std::to_string(i) + ".npy")).cview(), first.cview()));
}

TEST_F(FbankCliTest, ListReportsEveryFailureAndKeepsTheRest) {
  fs::copy_file(kFix + "tone16k.wav", p("good.wav"));
  {
    std::ofstream l(p("list.txt"));
    l << p("good.wav") << "\n" << kFix << "tone8k.wav\n" << p("missing.wav") << "\n";
  }
  EXPECT_EQ(run("--list " + p("list.txt") + " --out-dir " + p("feats")), 1);
  EXPECT_NE(err().find("normlab: error: 2 of 3 files failed"), std::string::npos) << err();
  EXPECT_NE(err().find("sample frequency mismatch"), std::string::npos) << err();
  EXPECT_NE(err().find("missing.wav"), std::string::npos) << err();
  EXPECT_TRUE(fs::exists(p("feats/good.npy")));
}

TEST_F(FbankCliTest, ErrorsExit1WithoutOutput) {
  EXPECT_EQ(run(kFix + "tone8k.wav -o " + p("x.npy")), 1);
  EXPECT_NE(err().find("normlab: error: sample frequency mismatch"), std::string::npos) << err();
  EXPECT_EQ(run(kFix + "tone16k.wav -o " + p("x.npy") + " --num-mel-bins 128"), 1);
  EXPECT_NE(err().find("num-mel-bins too large"), std::string::npos) << err();
  EXPECT_EQ(run(kFix + "manifest.json -o " + p("x.npy")), 1);
  EXPECT_NE(err().find("is not a WAV file"), std::string::npos) << err();
  EXPECT_EQ(run(kFix + "tone16k.wav -o " + p("x.npy") + " --window-type kaiser"), 1);
  EXPECT_EQ(run(kFix + "tone16k.wav"), 1);
  EXPECT_NE(err().find("-o OUT.npy is required"), std::string::npos) << err();
  EXPECT_FALSE(fs::exists(p("x.npy")));
}

}  // namespace
}  // namespace normlab::speech
