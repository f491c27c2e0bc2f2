// WAV reading/writing: scaling, formats, and the errors for bad files.
#include <gtest/gtest.h>
#include <normlab/speech/wav.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/tolerance.h"

namespace normlab::speech {
namespace {

namespace fs = std::filesystem;

class WavTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("normlab_wav_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

void put16(std::string& s, std::uint16_t v) {
  s += static_cast<char>(v & 0xff);
  s += static_cast<char>(v >> 8);
}
void put32(std::string& s, std::uint32_t v) {
  put16(s, static_cast<std::uint16_t>(v & 0xffff));
  put16(s, static_cast<std::uint16_t>(v >> 16));
}

// A hand-made RIFF/WAVE file: format tag 1 (PCM) or 3 (float); `declared` overrides the data chunk size.
std::string make_wav(int channels, int bits, int rate, const std::string& data, int format_tag = 1,
                     std::int64_t declared = -1) {
  std::string s = "RIFF";
  put32(s, static_cast<std::uint32_t>(36 + data.size()));
  s += "WAVEfmt ";
  put32(s, 16);
  put16(s, static_cast<std::uint16_t>(format_tag));
  put16(s, static_cast<std::uint16_t>(channels));
  put32(s, static_cast<std::uint32_t>(rate));
  put32(s, static_cast<std::uint32_t>(rate * channels * bits / 8));
  put16(s, static_cast<std::uint16_t>(channels * bits / 8));
  put16(s, static_cast<std::uint16_t>(bits));
  s += "data";
  put32(s, static_cast<std::uint32_t>(declared >= 0 ? declared : static_cast<std::int64_t>(data.size())));
  return s + data;
}

std::string pcm16(const std::vector<int>& v) {
  std::string s;
  for (int x : v) put16(s, static_cast<std::uint16_t>(static_cast<std::int16_t>(x)));
  return s;
}

void write_file(const std::string& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST_F(WavTest, Pcm16IsReadOnTheInt16ScaleByDefaultAndExactlyNormalized) {
  write_file(path("a.wav"), make_wav(1, 16, 16000, pcm16({0, 1, -1, 32767, -32768, 1234})));
  const Waveform w = read_wav(path("a.wav"));
  EXPECT_EQ(w.samp_freq, 16000.0f);
  EXPECT_EQ(w.format, WavSampleFormat::kPcm16);
  EXPECT_EQ(w.samples, (std::vector<float>{0, 1, -1, 32767, -32768, 1234}));
  const Waveform n = read_wav(path("a.wav"), {.normalize = true});
  EXPECT_EQ(n.samples,
            (std::vector<float>{0, 1 / 32768.0f, -1 / 32768.0f, 32767 / 32768.0f, -1.0f, 1234 / 32768.0f}));
}

TEST_F(WavTest, FloatRoundTripsAndScalesByInt16) {
  const std::vector<float> x = {0.0f, 0.5f, -0.25f, 3.0f /* > 1: kept, no clipping */, -1e-6f};
  write_wav(path("f.wav"), x, 8000, {.format = WavSampleFormat::kFloat32, .from_int16_scale = false});
  const Waveform n = read_wav(path("f.wav"), {.expected_samp_freq = 8000, .normalize = true});
  EXPECT_EQ(n.format, WavSampleFormat::kFloat32);
  EXPECT_EQ(n.samples, x);
  const Waveform k = read_wav(path("f.wav"), {.expected_samp_freq = 0});
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(k.samples[i], x[i] * 32768.0f);
  EXPECT_FALSE(fs::exists(path("f.wav.tmp")));
}

TEST_F(WavTest, Pcm16WriteRoundsAndClips) {
  write_wav(path("p.wav"), std::vector<float>{0.4f, -0.6f, 40000.0f, -40000.0f, 12.5f}, 16000);
  EXPECT_EQ(read_wav(path("p.wav")).samples, (std::vector<float>{0, -1, 32767, -32768, 12}));
}

TEST_F(WavTest, SameSamplesGiveSameBytes) {
  const std::vector<float> x = {0.1f, 0.2f, -0.3f};
  const WavWriteOptions f{.format = WavSampleFormat::kFloat32, .from_int16_scale = false};
  write_wav(path("1.wav"), x, 16000, f);
  write_wav(path("2.wav"), x, 16000, f);
  std::ifstream a(path("1.wav"), std::ios::binary), b(path("2.wav"), std::ios::binary);
  const std::string sa((std::istreambuf_iterator<char>(a)), {}), sb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_EQ(sa, sb);
}

TEST_F(WavTest, NotAWav) {
  write_file(path("text.wav"), "this is not audio at all, just some text that is long enough");
  EXPECT_NL_ERROR(read_wav(path("text.wav")), "is not a WAV file");
  EXPECT_NL_ERROR(read_wav(path("text.wav")), path("text.wav"));
  write_file(path("tiny.wav"), "RIF");
  EXPECT_NL_ERROR(read_wav(path("tiny.wav")), "is not a WAV file");
  EXPECT_NL_ERROR(read_wav(path("missing.wav")), "missing.wav");
}

TEST_F(WavTest, Truncated) {
  const std::string full = make_wav(1, 16, 16000, pcm16(std::vector<int>(1000, 7)));
  write_file(path("cut.wav"), full.substr(0, full.size() - 100));  // data chunk claims 100 more bytes
  EXPECT_NL_ERROR(read_wav(path("cut.wav")), "is truncated");
  EXPECT_NL_ERROR(read_wav(path("cut.wav")), "cut.wav");
  write_file(path("header.wav"), full.substr(0, 30));  // inside the fmt chunk
  EXPECT_NL_ERROR(read_wav(path("header.wav")), "truncated");
}

TEST_F(WavTest, StereoIsRejected) {
  write_file(path("st.wav"), make_wav(2, 16, 16000, pcm16({1, 2, 3, 4})));
  EXPECT_NL_ERROR(read_wav(path("st.wav")), "has 2 channels; only mono");
}

TEST_F(WavTest, WrongRateIsRejectedLikeKaldi) {
  write_file(path("8k.wav"), make_wav(1, 16, 8000, pcm16({1, 2, 3})));
  EXPECT_NL_ERROR(read_wav(path("8k.wav")), "sample frequency mismatch in");
  EXPECT_NL_ERROR(read_wav(path("8k.wav")), "expected 16000 Hz but the file has 8000 Hz");
  EXPECT_EQ(read_wav(path("8k.wav"), {.expected_samp_freq = 8000}).samples.size(), 3u);
  EXPECT_EQ(read_wav(path("8k.wav"), {.expected_samp_freq = 0}).samp_freq, 8000.0f);
}

TEST_F(WavTest, EmptyAudioIsRejected) {
  write_file(path("empty.wav"), make_wav(1, 16, 16000, ""));
  EXPECT_NL_ERROR(read_wav(path("empty.wav")), "holds no audio");
}

TEST_F(WavTest, OtherSampleFormatsAreRejected) {
  write_file(path("24.wav"), make_wav(1, 24, 16000, std::string(30, '\0')));
  EXPECT_NL_ERROR(read_wav(path("24.wav")), "24-bit PCM samples; supported: 16-bit PCM and 32-bit float");
}

}  // namespace
}  // namespace normlab::speech
