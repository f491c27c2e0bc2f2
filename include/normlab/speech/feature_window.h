// normlab/speech/feature_window.h — framing a waveform and the per-frame processing before the FFT.
//
// Follows the semantics of Kaldi's src/feat/feature-window.{h,cc} (FrameExtractionOptions,
// FeatureWindowFunction, NumFrames, FirstSampleOfFrame, ExtractWindow, ProcessWindow), restated in our
// own code. Option names and defaults mirror Kaldi's command-line flags (tests/speech pin them):
//   --sample-frequency 16000  --frame-shift 10  --frame-length 25  --dither 1  --preemphasis-coefficient 0.97
//   --remove-dc-offset true   --window-type povey  --round-to-power-of-two true  --blackman-coeff 0.42
//   --snip-edges true
//
// Vocabulary: samples are floats on Kaldi's int16 scale (±32768); a "window" holds WindowSize() samples of
// one frame followed by zeros up to PaddedWindowSize() (the FFT length).
//
// Precision: Kaldi processes a frame in float. normlab processes it in double (window function, DC
// removal, pre-emphasis, FFT, mel weights and sums), rounds each mel energy to float once and takes its
// log in float (within 2 float ulps of the double log, as fbank.h says). A float pipeline's rounding acts
// like white noise at ~1e-7 of the frame's energy, which in weak bands (the lowest of 80 mel bins after
// pre-emphasis, or a narrow-band dip) reaches 1e-3 in log-mel; in double the features are the algorithm's
// values, and Kaldi's and torchaudio's float results each scatter around them (docs/PERFORMANCE.md and
// tests/speech/fbank_test.cpp measure this).
//
// Per frame (ProcessWindow): dither → remove DC → (raw log-energy) → pre-emphasis → window function.
//   * dither: x += dither·N(0, 1), drawn from a std::mt19937_64 seeded with `dither_seed` (normlab's
//     addition; Kaldi seeds its own generator). Draws are taken frame by frame, in frame order, so the
//     streaming and whole-waveform paths draw identical numbers.
//   * pre-emphasis runs backwards: x[i] −= c·x[i−1] for i = N−1..1, then x[0] −= c·x[0].
//   * snip_edges = false: frame f is centred at f·shift + shift/2 and samples outside [0, n) are mirrored
//     the way Kaldi (and torchaudio) do it: index −1 reads sample 0, index n reads sample n−1 (the edge
//     sample IS repeated — "symmetric" mirroring; this is what both references compute).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace normlab::speech {

struct FrameExtractionOptions {
  float samp_freq = 16000.0f;         // --sample-frequency (Hz); the waveform must have this rate
  float frame_shift_ms = 10.0f;       // --frame-shift
  float frame_length_ms = 25.0f;      // --frame-length
  float dither = 1.0f;                // --dither: stddev of the Gaussian dither (int16 units); 0 = off
  float preemph_coeff = 0.97f;        // --preemphasis-coefficient; 0 = off
  bool remove_dc_offset = true;       // --remove-dc-offset
  std::string window_type = "povey";  // --window-type: povey|hamming|hanning|sine|rectangular|blackman
  bool round_to_power_of_two = true;  // --round-to-power-of-two: FFT length = next power of two
  float blackman_coeff = 0.42f;       // --blackman-coeff
  bool snip_edges = true;             // --snip-edges: only frames that fit entirely in the waveform
  std::uint64_t dither_seed = 0;      // normlab only (CLI --seed): seed of the dither generator

  std::int32_t WindowShift() const;       // samples between frame starts: int(samp_freq·shift_ms/1000)
  std::int32_t WindowSize() const;        // samples per frame: int(samp_freq·length_ms/1000)
  std::int32_t PaddedWindowSize() const;  // FFT length
  // Throws normlab::Error naming the bad option and its valid range.
  void Validate() const;
  std::string ToString() const;  // "samp_freq=16000 frame_shift_ms=10 ..." (for logs and errors)
};

// Number of complete frames in `num_samples` samples. With snip_edges = false and flush = false (the
// streaming case before the input is finished) only frames that do not reach past the last sample count.
std::int64_t NumFrames(std::int64_t num_samples, const FrameExtractionOptions& opts, bool flush = true);

// Index of the first sample of frame `frame` (negative for early frames when snip_edges = false).
std::int64_t FirstSampleOfFrame(std::int64_t frame, const FrameExtractionOptions& opts);

// The window function of WindowSize() samples, in double.
class FeatureWindowFunction {
 public:
  explicit FeatureWindowFunction(const FrameExtractionOptions& opts);
  std::span<const double> window() const { return window_; }

 private:
  std::vector<double> window_;
};

// Per-frame state that must persist across frames (the dither generator).
class DitherState {
 public:
  explicit DitherState(std::uint64_t seed) : rng_(seed) {}
  void Apply(std::span<double> samples, float dither);  // samples[i] += dither·N(0, 1) (float draws)

 private:
  std::mt19937_64 rng_;
  std::normal_distribution<float> normal_{0.0f, 1.0f};
};

// Copies frame `frame` out of `wave`, whose first sample is sample `sample_offset` of the whole stream,
// into `window` (resized to PaddedWindowSize(), zero padded), then runs ProcessWindow on it. When
// `log_energy_pre_window` is not null it receives log(max(Σx², FLT_EPSILON)) taken after DC removal and
// before pre-emphasis. The frame's samples must lie in `wave` (after mirroring at the stream's edges);
// internal callers guarantee this.
void ExtractWindow(std::int64_t sample_offset, std::span<const float> wave, std::int64_t frame,
                   const FrameExtractionOptions& opts, const FeatureWindowFunction& window_function,
                   DitherState& dither, std::vector<double>& window, float* log_energy_pre_window);

// The in-place per-frame pipeline on the first WindowSize() samples of `window`.
void ProcessWindow(const FrameExtractionOptions& opts, const FeatureWindowFunction& window_function,
                   DitherState& dither, std::span<double> window, float* log_energy_pre_window);

// Σ x[i] and Σ (x[i] − mean)² over i < n, summed in a fixed order (eight interleaved partial sums).
double SumOf(const double* x, std::size_t n);
double SumOfSquaresAbout(const double* x, std::size_t n, double mean);

// x[i] −= coeff·x[i−1] for i = n−1..1; x[0] −= coeff·x[0].
void Preemphasize(std::span<double> x, float coeff);

}  // namespace normlab::speech
