// Framing and per-frame processing. Semantics follow Kaldi's src/feat/feature-window.cc (restated, not
// copied); the contract is in include/normlab/speech/feature_window.h.
#include <immintrin.h>
#include <normlab/error.h>
#include <normlab/simd.h>
#include <normlab/speech/feature_window.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <numbers>
#include <vector>

#include "simd/isa_select.h"

namespace normlab::speech {

namespace {
std::int32_t round_up_to_power_of_two(std::int32_t n) {
  std::int32_t p = 1;
  while (p < n) p *= 2;
  return p;
}
}  // namespace

std::int32_t FrameExtractionOptions::WindowShift() const {
  return static_cast<std::int32_t>(static_cast<double>(samp_freq) * 0.001 *
                                   frame_shift_ms);  // in double, as Kaldi
}
std::int32_t FrameExtractionOptions::WindowSize() const {
  return static_cast<std::int32_t>(static_cast<double>(samp_freq) * 0.001 * frame_length_ms);
}
std::int32_t FrameExtractionOptions::PaddedWindowSize() const {
  return round_to_power_of_two ? round_up_to_power_of_two(WindowSize()) : WindowSize();
}

void FrameExtractionOptions::Validate() const {
  NL_CHECK(std::isfinite(samp_freq) && samp_freq > 0, "sample-frequency must be > 0 Hz, got {}", samp_freq);
  NL_CHECK(std::isfinite(frame_shift_ms) && frame_shift_ms > 0, "frame-shift must be > 0 ms, got {}",
           frame_shift_ms);
  NL_CHECK(std::isfinite(frame_length_ms) && frame_length_ms > 0, "frame-length must be > 0 ms, got {}",
           frame_length_ms);
  NL_CHECK(WindowShift() >= 1, "frame-shift {} ms at {} Hz is less than one sample", frame_shift_ms,
           samp_freq);
  NL_CHECK(WindowSize() >= 2,
           "frame-length {} ms at {} Hz gives {} samples; a frame needs at least 2 samples", frame_length_ms,
           samp_freq, WindowSize());
  NL_CHECK(WindowSize() <= (1 << 24), "frame-length {} ms at {} Hz gives {} samples (at most 2^24)",
           frame_length_ms, samp_freq, WindowSize());
  NL_CHECK(std::isfinite(dither) && dither >= 0, "dither must be ≥ 0, got {}", dither);
  NL_CHECK(std::isfinite(preemph_coeff) && preemph_coeff >= 0 && preemph_coeff <= 1,
           "preemphasis-coefficient must be in [0, 1], got {}", preemph_coeff);
  NL_CHECK(window_type == "povey" || window_type == "hamming" || window_type == "hanning" ||
               window_type == "sine" || window_type == "rectangular" || window_type == "blackman",
           "unknown window-type \"{}\" (valid: povey, hamming, hanning, sine, rectangular, blackman)",
           window_type);
  NL_CHECK(std::isfinite(blackman_coeff), "blackman-coeff must be finite, got {}", blackman_coeff);
}

std::string FrameExtractionOptions::ToString() const {
  return fmt::format(
      "samp_freq={} frame_shift_ms={} frame_length_ms={} dither={} preemph_coeff={} remove_dc_offset={} "
      "window_type={} round_to_power_of_two={} blackman_coeff={} snip_edges={} dither_seed={}",
      samp_freq, frame_shift_ms, frame_length_ms, dither, preemph_coeff, remove_dc_offset, window_type,
      round_to_power_of_two, blackman_coeff, snip_edges, dither_seed);
}

std::int64_t NumFrames(std::int64_t num_samples, const FrameExtractionOptions& opts, bool flush) {
  const std::int64_t shift = opts.WindowShift(), length = opts.WindowSize();
  if (opts.snip_edges) return num_samples < length ? 0 : 1 + (num_samples - length) / shift;
  // Frames are centred on f·shift + shift/2: the count rounds num_samples/shift to nearest.
  std::int64_t n = (num_samples + shift / 2) / shift;
  if (flush) return n;
  // Without flushing, drop the trailing frames that would read past the last sample.
  std::int64_t end = FirstSampleOfFrame(n - 1, opts) + length;
  while (n > 0 && end > num_samples) {
    --n;
    end -= shift;
  }
  return n;
}

std::int64_t FirstSampleOfFrame(std::int64_t frame, const FrameExtractionOptions& opts) {
  const std::int64_t shift = opts.WindowShift();
  if (opts.snip_edges) return frame * shift;
  const std::int64_t midpoint = shift * frame + shift / 2;
  return midpoint - opts.WindowSize() / 2;
}

FeatureWindowFunction::FeatureWindowFunction(const FrameExtractionOptions& opts) {
  const std::int32_t n = opts.WindowSize();
  window_.resize(static_cast<std::size_t>(n));
  const double a = 2 * std::numbers::pi / (n - 1);
  const std::string& t = opts.window_type;
  for (std::int32_t i = 0; i < n; ++i) {
    const double x = i;
    double w = 1.0;  // rectangular
    if (t == "hanning") {
      w = 0.5 - 0.5 * std::cos(a * x);
    } else if (t == "sine") {
      w = std::sin(0.5 * a * x);  // half a sine period over the frame
    } else if (t == "hamming") {
      w = 0.54 - 0.46 * std::cos(a * x);
    } else if (t == "povey") {
      w = std::pow(0.5 - 0.5 * std::cos(a * x), 0.85);  // a Hann window raised to 0.85: zero at the ends
    } else if (t == "blackman") {
      w = opts.blackman_coeff - 0.5 * std::cos(a * x) + (0.5 - opts.blackman_coeff) * std::cos(2 * a * x);
    } else {
      NL_CHECK(t == "rectangular",
               "unknown window-type \"{}\" (valid: povey, hamming, hanning, sine, rectangular, blackman)", t);
    }
    window_[static_cast<std::size_t>(i)] = w;
  }
}

// Σ x[i] and Σ (x[i] − mean)², i < n, with eight partial sums (lane j takes i ≡ j mod 8) added pairwise
// at the end: a fixed order, so the same bits everywhere, without a serial chain of n dependent adds.
namespace {
[[gnu::always_inline]] inline double CombineLanes(const double (&acc)[8]) {
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// T = double, or float samples (each converted exactly to double first: the same sums).
template <typename T>
[[gnu::always_inline]] inline double SumOfInline(const T* x, std::size_t n) {
  double acc[8] = {};
  std::size_t i = 0;
  // Scalar math: acc[j] += x[i + j], eight independent lanes.
  for (; i + 8 <= n; i += 8)
    for (std::size_t j = 0; j < 8; ++j) acc[j] += static_cast<double>(x[i + j]);
  for (std::size_t j = 0; i < n; ++i, ++j) acc[j] += static_cast<double>(x[i]);
  return CombineLanes(acc);
}

template <typename T>
[[gnu::always_inline]] inline double SumOfSquaresAboutInline(const T* x, std::size_t n, double mean) {
  double acc[8] = {};
  std::size_t i = 0;
  // Scalar math: acc[j] += (x[i + j] − mean)², eight independent lanes.
  for (; i + 8 <= n; i += 8)
    for (std::size_t j = 0; j < 8; ++j) {
      const double d = static_cast<double>(x[i + j]) - mean;
      acc[j] += d * d;
    }
  for (std::size_t j = 0; i < n; ++i, ++j) {
    const double d = static_cast<double>(x[i]) - mean;
    acc[j] += d * d;
  }
  return CombineLanes(acc);
}

// DC removal, raw energy, pre-emphasis and window of one frame (after the dither), from the n samples x
// (float samples of the buffer, or doubles) into y, which must not overlap x, then the zero padding
// y[n..padded):
//   mean = Σx/n (or 0), energy = Σ(x − mean)², y[0] = w[0]·((x[0] − mean) − c·(x[0] − mean)),
//   y[i] = w[i]·((x[i] − mean) − c·(x[i−1] − mean)), i = 1..n−1,
// the same operations, in the same order, as the DC removal followed by Preemphasize() and the window on
// a double copy (float samples are converted exactly where they are read). Compiled for the baseline
// x86-64 instruction set, with AVX2 and with AVX-512F (chosen by normlab::active_isa(); lanes never
// combine differently, so all three give the same bits).
template <typename T>
[[gnu::always_inline]] inline void WindowKernel(double* y, std::size_t padded, const T* x, std::size_t n,
                                                const double* w, double c, bool remove_dc, double* energy) {
  const double mean = remove_dc ? SumOfInline(x, n) / static_cast<double>(n) : 0.0;
  if (energy != nullptr) *energy = SumOfSquaresAboutInline(x, n, mean);
  if (c == 0.0) {
    // Scalar math: y[i] = w[i]·(x[i] − mean).
    for (std::size_t i = 0; i < n; ++i) y[i] = w[i] * (static_cast<double>(x[i]) - mean);
  } else {
    y[0] = w[0] * ((static_cast<double>(x[0]) - mean) - c * (static_cast<double>(x[0]) - mean));
    // Scalar math: y[i] = w[i]·((x[i] − mean) − c·(x[i−1] − mean)).
    for (std::size_t i = 1; i < n; ++i)
      y[i] = w[i] * ((static_cast<double>(x[i]) - mean) - c * (static_cast<double>(x[i - 1]) - mean));
  }
  for (std::size_t i = n; i < padded; ++i) y[i] = 0.0;
}
template <typename T>
using WindowKernelFn = void (*)(double*, std::size_t, const T*, std::size_t, const double*, double, bool,
                                double*);
template <typename T>
void WindowKernelBaseline(double* y, std::size_t padded, const T* x, std::size_t n, const double* w, double c,
                          bool remove_dc, double* energy) {
  WindowKernel(y, padded, x, n, w, c, remove_dc, energy);
}
template <typename T>
[[gnu::target("avx2")]] void WindowKernelAvx2(double* y, std::size_t padded, const T* x, std::size_t n,
                                              const double* w, double c, bool remove_dc, double* energy) {
  WindowKernel(y, padded, x, n, w, c, remove_dc, energy);
  _mm256_zeroupper();  // as GCC does when optimizing (fbank.cpp, PowerAndMel)
}
template <typename T>
[[gnu::target("avx512f,prefer-vector-width=512")]] void WindowKernelAvx512(double* y, std::size_t padded,
                                                                           const T* x, std::size_t n,
                                                                           const double* w, double c,
                                                                           bool remove_dc, double* energy) {
  WindowKernel(y, padded, x, n, w, c, remove_dc, energy);
  _mm256_zeroupper();  // as GCC does when optimizing (fbank.cpp, PowerAndMel)
}
template <typename T>
WindowKernelFn<T> window_kernel_for(Isa isa) {
  return for_isa(isa, WindowKernelBaseline<T>, WindowKernelAvx2<T>, WindowKernelAvx512<T>);
}

// log(max(E, FLT_EPSILON)) of a frame energy E, as Kaldi's log_energy_pre_window.
float LogEnergy(double energy) {
  return static_cast<float>(std::log(std::max(energy, static_cast<double>(FLT_EPSILON))));
}

}  // namespace

double SumOf(const double* x, std::size_t n) {
  return SumOfInline(x, n);
}

double SumOfSquaresAbout(const double* x, std::size_t n, double mean) {
  return SumOfSquaresAboutInline(x, n, mean);
}

void DitherState::Apply(std::span<double> samples, float dither) {
  for (double& s : samples) s += static_cast<double>(dither * normal_(rng_));
}

void Preemphasize(std::span<double> x, float coeff) {
  if (x.empty() || coeff == 0.0f) return;
  for (std::size_t i = x.size() - 1; i > 0; --i) x[i] -= coeff * x[i - 1];
  x[0] -= coeff * x[0];
}

void ProcessWindow(const FrameExtractionOptions& opts, const FeatureWindowFunction& window_function,
                   DitherState& dither, std::span<double> window, float* log_energy_pre_window) {
  const std::size_t n = static_cast<std::size_t>(opts.WindowSize());
  NL_DCHECK(window.size() >= n && window_function.window().size() == n && n >= 2);
  if (opts.dither != 0.0f) dither.Apply(window.first(n), opts.dither);
  // The kernel reads its samples from a copy (it writes out of place); one scratch buffer per thread.
  thread_local std::vector<double> samples;
  samples.assign(window.begin(), window.begin() + static_cast<std::ptrdiff_t>(n));
  double energy = 0;
  window_kernel_for<double>(active_isa())(
      window.data(), n, samples.data(), n, window_function.window().data(), opts.preemph_coeff,
      opts.remove_dc_offset, log_energy_pre_window != nullptr ? &energy : nullptr);
  if (log_energy_pre_window != nullptr) *log_energy_pre_window = LogEnergy(energy);
}

void ExtractWindow(std::int64_t sample_offset, std::span<const float> wave, std::int64_t frame,
                   const FrameExtractionOptions& opts, const FeatureWindowFunction& window_function,
                   DitherState& dither, std::vector<double>& window, float* log_energy_pre_window) {
  const std::int64_t length = opts.WindowSize();
  const std::int64_t padded = opts.PaddedWindowSize();
  const std::int64_t start = FirstSampleOfFrame(frame, opts) - sample_offset;  // in `wave` coordinates
  const std::int64_t n = static_cast<std::int64_t>(wave.size());
  NL_CHECK(n > 0, "cannot extract frame {} from an empty waveform buffer", frame);
  if (window.size() != static_cast<std::size_t>(padded)) window.assign(static_cast<std::size_t>(padded), 0.0);
  if (opts.dither == 0.0f && start >= 0 && start + length <= n && length >= 2) {
    // The common case: the kernel reads the float samples of the buffer directly (no double copy); the
    // same bits as the general path below.
    const FeatureWindowFunction& wf = window_function;
    NL_DCHECK(wf.window().size() == static_cast<std::size_t>(length));
    double energy = 0;
    window_kernel_for<float>(active_isa())(window.data(), static_cast<std::size_t>(padded),
                                           wave.data() + start, static_cast<std::size_t>(length),
                                           wf.window().data(), opts.preemph_coeff, opts.remove_dc_offset,
                                           log_energy_pre_window != nullptr ? &energy : nullptr);
    if (log_energy_pre_window != nullptr) *log_energy_pre_window = LogEnergy(energy);
    return;
  }
  std::fill(window.begin() + length, window.end(), 0.0);  // the zero padding up to the FFT length
  if (start >= 0 && start + length <= n) {
    // Scalar math: float → double.
    for (std::int64_t s = 0; s < length; ++s)
      window[static_cast<std::size_t>(s)] = wave[static_cast<std::size_t>(start + s)];
  } else {
    // Mirror at the stream's edges, in stream coordinates: −1 → 0, total → total−1 (repeated for very
    // short streams). The buffer's end is the stream's end whenever a frame reaches past it.
    const std::int64_t total = sample_offset + n;
    for (std::int64_t s = 0; s < length; ++s) {
      std::int64_t k = sample_offset + start + s;
      while (k < 0 || k >= total) k = k < 0 ? -k - 1 : 2 * total - 1 - k;
      NL_CHECK(k >= sample_offset, "internal: frame {} needs sample {}, but the buffer starts at sample {}",
               frame, k, sample_offset);
      window[static_cast<std::size_t>(s)] = wave[static_cast<std::size_t>(k - sample_offset)];
    }
  }
  ProcessWindow(opts, window_function, dither, std::span<double>(window), log_energy_pre_window);
}

}  // namespace normlab::speech
