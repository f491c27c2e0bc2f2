// normlab/speech/wav.h — reading and writing mono WAV files (libsndfile).
//
// Contract:
//   * read_wav accepts RIFF/WAVE files (incl. WAVE_FORMAT_EXTENSIBLE) holding one channel of 16-bit PCM or
//     32-bit float samples. By default samples are scaled like Kaldi's wave reader: int16 values as floats
//     (±32768), float files multiplied by 32768; with `normalize` both come back in [−1, 1] (int16/32768).
//     16-bit samples are converted exactly in both scalings.
//   * Errors throw normlab::Error naming the file: unreadable, not a WAV file, truncated (the data chunk
//     claims more bytes than the file holds), more than one channel, another sample format, no samples,
//     and a sample rate other than `expected_samp_freq` (when > 0; Kaldi's "sample frequency mismatch" —
//     normlab never resamples).
//   * write_wav writes 16-bit PCM (samples on the int16 scale, rounded and clipped to [−32768, 32767]) or
//     32-bit float (samples written as given divided by 32768 when `from_int16_scale`, else as given; no
//     clipping). It writes PATH.tmp and renames it over PATH.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace normlab::speech {

struct WavReadOptions {
  float expected_samp_freq = 16000.0f;  // required rate in Hz; ≤ 0 accepts any rate
  bool normalize = false;               // false: int16 scale (Kaldi); true: [−1, 1]
};

enum class WavSampleFormat { kPcm16, kFloat32 };

struct Waveform {
  std::vector<float> samples;  // mono
  float samp_freq = 0;         // Hz
  WavSampleFormat format = WavSampleFormat::kPcm16;
};

Waveform read_wav(const std::string& path, const WavReadOptions& opts = {});

struct WavWriteOptions {
  WavSampleFormat format = WavSampleFormat::kPcm16;
  bool from_int16_scale = true;  // samples are on the int16 scale (±32768) rather than [−1, 1]
};

void write_wav(const std::string& path, std::span<const float> samples, int samp_freq,
               const WavWriteOptions& opts = {});

}  // namespace normlab::speech
