// Mono WAV reading and writing through libsndfile; the contract is in include/normlab/speech/wav.h.
// Kaldi's wave reader (src/feat/wave-reader.cc) is the model for the default sample scale (int16 values
// as floats) and for refusing a rate other than the configured one.
#include <normlab/error.h>
#include <normlab/speech/wav.h>
#include <sndfile.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

namespace normlab::speech {
namespace {

constexpr float kInt16Scale = 32768.0f;

struct SndfileCloser {
  void operator()(SNDFILE* f) const { sf_close(f); }
};
using SndfilePtr = std::unique_ptr<SNDFILE, SndfileCloser>;

std::uint32_t le32(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

// Walks the RIFF chunks ourselves: libsndfile silently shortens a truncated data chunk.
void check_riff_structure(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  NL_CHECK(in.good(), "cannot open WAV file {}: {}", path, std::strerror(errno));
  std::error_code ec;
  const auto file_size = static_cast<std::uint64_t>(std::filesystem::file_size(path, ec));
  NL_CHECK(!ec, "cannot read the size of WAV file {}: {}", path, ec.message());
  std::array<unsigned char, 12> head{};
  in.read(reinterpret_cast<char*>(head.data()), 12);
  NL_CHECK(in.gcount() == 12 && std::memcmp(head.data(), "RIFF", 4) == 0 &&
               std::memcmp(head.data() + 8, "WAVE", 4) == 0,
           "{} is not a WAV file (no RIFF/WAVE header; {} bytes)", path, file_size);
  std::uint64_t off = 12;
  bool have_fmt = false;
  while (off + 8 <= file_size) {
    std::array<unsigned char, 8> ch{};
    in.seekg(static_cast<std::streamoff>(off));
    in.read(reinterpret_cast<char*>(ch.data()), 8);
    NL_CHECK(in.gcount() == 8, "cannot read WAV file {} at byte {}", path, off);
    const std::uint32_t size = le32(ch.data() + 4);
    if (std::memcmp(ch.data(), "fmt ", 4) == 0) have_fmt = true;
    if (std::memcmp(ch.data(), "data", 4) == 0) {
      NL_CHECK(have_fmt, "WAV file {} has a data chunk before its fmt chunk", path);
      const std::uint64_t available = file_size - (off + 8);
      // 0 and 0xFFFFFFFF are what streaming writers leave when they cannot seek back.
      NL_CHECK(size == 0 || size == 0xFFFFFFFFu || size <= available,
               "WAV file {} is truncated: its data chunk declares {} bytes but only {} follow", path, size,
               available);
      return;
    }
    off += 8 + static_cast<std::uint64_t>(size) + (size & 1u);
  }
  NL_CHECK(false, "WAV file {} is truncated or malformed: no data chunk in its {} bytes{}", path, file_size,
           have_fmt ? "" : " (and no fmt chunk)");
}

const char* describe_subtype(int subtype) {
  switch (subtype) {
    case SF_FORMAT_PCM_S8:
      return "8-bit signed PCM";
    case SF_FORMAT_PCM_U8:
      return "8-bit unsigned PCM";
    case SF_FORMAT_PCM_24:
      return "24-bit PCM";
    case SF_FORMAT_PCM_32:
      return "32-bit PCM";
    case SF_FORMAT_DOUBLE:
      return "64-bit float";
    case SF_FORMAT_ULAW:
      return "u-law";
    case SF_FORMAT_ALAW:
      return "A-law";
    default:
      return "an unsupported encoding";
  }
}

}  // namespace

Waveform read_wav(const std::string& path, const WavReadOptions& opts) {
  check_riff_structure(path);
  SF_INFO info{};
  SndfilePtr f(sf_open(path.c_str(), SFM_READ, &info));
  NL_CHECK(f != nullptr, "cannot read WAV file {}: {}", path, sf_strerror(nullptr));
  const int major = info.format & SF_FORMAT_TYPEMASK, subtype = info.format & SF_FORMAT_SUBMASK;
  NL_CHECK(major == SF_FORMAT_WAV || major == SF_FORMAT_WAVEX,
           "{} is not a WAV file (libsndfile format 0x{:x})", path, major);
  NL_CHECK(info.channels == 1, "WAV file {} has {} channels; only mono audio is supported (mix down first)",
           path, info.channels);
  NL_CHECK(subtype == SF_FORMAT_PCM_16 || subtype == SF_FORMAT_FLOAT,
           "WAV file {} holds {} samples; supported: 16-bit PCM and 32-bit float", path,
           describe_subtype(subtype));
  NL_CHECK(info.frames > 0, "WAV file {} holds no audio (0 samples)", path);
  NL_CHECK(opts.expected_samp_freq <= 0 || static_cast<float>(info.samplerate) == opts.expected_samp_freq,
           "sample frequency mismatch in {}: expected {} Hz but the file has {} Hz (normlab does not "
           "resample; pass --sample-frequency {} or resample the audio)",
           path, opts.expected_samp_freq, info.samplerate, info.samplerate);

  Waveform w;
  w.samp_freq = static_cast<float>(info.samplerate);
  const auto n = static_cast<std::size_t>(info.frames);
  w.samples.resize(n);
  sf_count_t got = 0;
  if (subtype == SF_FORMAT_PCM_16) {
    w.format = WavSampleFormat::kPcm16;
    std::vector<short> buf(n);
    got = sf_read_short(f.get(), buf.data(), info.frames);
    const float scale = opts.normalize ? 1.0f / kInt16Scale : 1.0f;  // a power of two: exact
    for (std::size_t i = 0; i < n; ++i) w.samples[i] = static_cast<float>(buf[i]) * scale;
  } else {
    w.format = WavSampleFormat::kFloat32;
    got = sf_read_float(f.get(), w.samples.data(), info.frames);
    if (!opts.normalize)
      for (float& s : w.samples) s *= kInt16Scale;
  }
  NL_CHECK(got == info.frames, "WAV file {} is truncated: read {} of {} samples ({})", path, got, info.frames,
           sf_strerror(f.get()));
  for (std::size_t i = 0; i < n; ++i)
    NL_CHECK(std::isfinite(w.samples[i]), "WAV file {} has a non-finite sample ({}) at index {}", path,
             w.samples[i], i);
  return w;
}

void write_wav(const std::string& path, std::span<const float> samples, int samp_freq,
               const WavWriteOptions& opts) {
  NL_CHECK(samp_freq > 0, "write_wav {}: sample rate must be > 0, got {}", path, samp_freq);
  const std::string tmp = path + ".tmp";
  SF_INFO info{};
  info.samplerate = samp_freq;
  info.channels = 1;
  info.format = SF_FORMAT_WAV | (opts.format == WavSampleFormat::kPcm16 ? SF_FORMAT_PCM_16 : SF_FORMAT_FLOAT);
  sf_count_t written = 0;
  {
    SndfilePtr f(sf_open(tmp.c_str(), SFM_WRITE, &info));
    NL_CHECK(f != nullptr, "cannot write WAV file {}: {}", tmp, sf_strerror(nullptr));
    // The PEAK chunk carries a time stamp: leave it out so that equal samples give equal bytes.
    sf_command(f.get(), SFC_SET_ADD_PEAK_CHUNK, nullptr, SF_FALSE);
    const auto n = static_cast<sf_count_t>(samples.size());
    if (opts.format == WavSampleFormat::kPcm16) {
      std::vector<short> buf(samples.size());
      const float scale = opts.from_int16_scale ? 1.0f : kInt16Scale;
      for (std::size_t i = 0; i < samples.size(); ++i) {
        const float v = std::nearbyint(samples[i] * scale);
        buf[i] = static_cast<short>(std::clamp(v, -32768.0f, 32767.0f));
      }
      written = sf_write_short(f.get(), buf.data(), n);
    } else {
      std::vector<float> buf(samples.begin(), samples.end());
      if (opts.from_int16_scale)
        for (float& s : buf) s /= kInt16Scale;
      written = sf_write_float(f.get(), buf.data(), n);
    }
    if (written != n) {
      const std::string why = sf_strerror(f.get());
      f.reset();
      std::remove(tmp.c_str());
      NL_CHECK(false, "cannot write WAV file {}: wrote {} of {} samples ({})", path, written, n, why);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    NL_CHECK(false, "cannot rename {} to {}: {}", tmp, path, ec.message());
  }
}

}  // namespace normlab::speech
