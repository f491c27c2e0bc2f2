// Log-mel filterbank features. Semantics follow Kaldi's src/feat/feature-fbank.cc (FbankComputer::Compute)
// and src/feat/online-feature.cc (OnlineGenericBaseFeature::ComputeFeatures), restated; the contract is
// in include/normlab/speech/fbank.h.
#include <immintrin.h>
#include <normlab/error.h>
#include <normlab/simd.h>
#include <normlab/speech/fbank.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <complex>
#include <cstdint>
#include <kissfft/kissfft.hh>

#include "simd/isa_select.h"
#include "speech/log_mel.h"
#include "speech/real_fft.h"

namespace normlab::speech {

void FbankOptions::Validate() const {
  frame_opts.Validate();
  NL_CHECK(std::isfinite(energy_floor) && energy_floor >= 0, "energy-floor must be ≥ 0, got {}",
           energy_floor);
  NL_CHECK(std::isfinite(vtln_warp) && vtln_warp > 0, "vtln-warp must be > 0, got {}", vtln_warp);
}

std::string FbankOptions::ToString() const {
  return fmt::format(
      "{} {} use_energy={} energy_floor={} raw_energy={} htk_compat={} use_log_fbank={} use_power={} "
      "vtln_warp={}",
      frame_opts.ToString(), mel_opts.ToString(), use_energy, energy_floor, raw_energy, htk_compat,
      use_log_fbank, use_power, vtln_warp);
}

namespace {
MelBanksOptions with_htk_mode(MelBanksOptions m, bool htk_compat) {
  m.htk_mode = htk_compat;
  return m;
}
const FbankOptions& validated(const FbankOptions& o) {
  o.Validate();
  return o;
}

// Kaldi refuses a waveform whose rate differs from the options' (no resampling).
void CheckSampleFrequency(const FrameExtractionOptions& fo, float samp_freq) {
  NL_CHECK(samp_freq == fo.samp_freq,
           "sample frequency mismatch: the options say {} Hz but the waveform has {} Hz (normlab does not "
           "resample; set --sample-frequency {} or resample the audio)",
           fo.samp_freq, samp_freq, samp_freq);
}

// t × d features, frame after frame, as a [T, F] tensor or transposed into [F, T].
Tensor FeaturesAs(const float* tf, Index t, Index d, FeatureLayout layout) {
  Tensor out(layout == FeatureLayout::kTF ? Dims{t, d} : Dims{d, t});
  float* o = out.data();
  if (layout == FeatureLayout::kTF) {
    std::copy_n(tf, t * d, o);
  } else {
    for (Index f = 0; f < t; ++f)
      for (Index j = 0; j < d; ++j) o[j * t + f] = tf[f * d + j];
  }
  return out;
}
}  // namespace

// The power spectrum |X_k|², k = 0..N/2, of a real frame of N samples, in double (why double:
// feature_window.h, "Precision"). A power-of-two N (the default, --round-to-power-of-two) uses
// src/speech/real_fft.h; any other N kissfft's C++ template (kissfft.hh): the real-input transform (a
// complex FFT of N/2 points) for even N, a complex FFT of N points for odd N.
struct FbankComputer::Fft {
  using Cpx = std::complex<double>;
  explicit Fft(int length)
      : n(length),
        pow2(detail::RealFftPow2::Supports(length)),
        plan(pow2 ? 1 : static_cast<std::size_t>(length % 2 == 0 ? length / 2 : length), false),
        fast(pow2 ? length : 2),
        in(pow2 ? 0 : static_cast<std::size_t>(length % 2 == 0 ? length : 2 * length)),
        out(pow2 ? 0 : static_cast<std::size_t>(length)) {}

  // Not a power of two (kissfft).
  void PowerSpectrumOther(const double* x, double* power) {
    if (n % 2 == 0) {
      for (int i = 0; i < n; ++i) in[static_cast<std::size_t>(i)] = x[i];
      plan.transform_real(in.data(), out.data());  // out[0] = (X_0, X_{N/2}); out[k] = X_k, 0 < k < N/2
      const double dc = out[0].real(), nyq = out[0].imag();
      power[0] = dc * dc;
      power[n / 2] = nyq * nyq;
      for (int k = 1; k < n / 2; ++k) power[k] = std::norm(out[static_cast<std::size_t>(k)]);
    } else {
      for (int i = 0; i < n; ++i) {
        in[static_cast<std::size_t>(2 * i)] = x[i];
        in[static_cast<std::size_t>(2 * i + 1)] = 0.0;
      }
      plan.transform(reinterpret_cast<const Cpx*>(in.data()), out.data());
      for (int k = 0; k <= n / 2; ++k) power[k] = std::norm(out[static_cast<std::size_t>(k)]);
    }
  }

  int n;
  bool pow2;
  kissfft<double> plan;      // not a power of two
  detail::RealFftPow2 fast;  // a power of two
  std::vector<double> in;    // N reals (even N) or N interleaved complex values (odd N)
  std::vector<Cpx> out;
};

namespace {
// |FFT|² then the mel sums of one frame, compiled three times from one inline source: for the baseline
// x86-64 instruction set, with AVX2 and with AVX-512F (GCC target attribute; no FMA, and
// -ffp-contract=off), chosen by normlab::active_isa() (NORMLAB_ISA). The loops are elementwise (lanes
// never combine differently), so all three give the same bits; tests/speech/fbank_test.cpp checks it.
// The AVX2 and AVX-512 versions (and the log-mel ones below) end with vzeroupper, which GCC inserts by
// itself only when optimizing (-O2 and up): the baseline code after them would otherwise pay an SSE/AVX
// transition on Intel cores (src/simd/vec.h, leave_clean; test UpperState.* under the sanitizer build).
[[gnu::always_inline]] inline void PowerAndMel(detail::RealFftPow2& fft, const MelBanks& mel_banks,
                                               const double* x, double* power, double* mel) {
  fft.PowerSpectrum(x, power);
  mel_banks.ComputePadded(power, mel);
}
void PowerAndMelBaseline(detail::RealFftPow2& fft, const MelBanks& mel_banks, const double* x, double* power,
                         double* mel) {
  PowerAndMel(fft, mel_banks, x, power, mel);
}
[[gnu::target("avx2")]] void PowerAndMelAvx2(detail::RealFftPow2& fft, const MelBanks& mel_banks,
                                             const double* x, double* power, double* mel) {
  PowerAndMel(fft, mel_banks, x, power, mel);
  _mm256_zeroupper();  // see the comment above
}
[[gnu::target("avx512f,prefer-vector-width=512")]] void PowerAndMelAvx512(detail::RealFftPow2& fft,
                                                                          const MelBanks& mel_banks,
                                                                          const double* x, double* power,
                                                                          double* mel) {
  PowerAndMel(fft, mel_banks, x, power, mel);
  _mm256_zeroupper();  // see the comment above
}

// The log-mel kernel of src/speech/log_mel.h for each instruction set.
void LogMelBaseline(float* y, const double* m, std::size_t n) {
  detail::LogMel(y, m, n);
}
[[gnu::target("avx2")]] void LogMelAvx2(float* y, const double* m, std::size_t n) {
  detail::LogMel(y, m, n);
  _mm256_zeroupper();
}
[[gnu::target("avx512f,prefer-vector-width=512")]] void LogMelAvx512(float* y, const double* m,
                                                                     std::size_t n) {
  detail::LogMel(y, m, n);
  _mm256_zeroupper();
}
}  // namespace

FbankComputer::FbankComputer(const FbankOptions& opts)
    : opts_(validated(opts)),
      mel_banks_(with_htk_mode(opts.mel_opts, opts.htk_compat), opts.frame_opts, opts.vtln_warp),
      fft_(std::make_unique<Fft>(opts.frame_opts.PaddedWindowSize())),
      // N/2 + 1 values, zeros after them up to the mel banks' padded reads.
      power_(std::max(static_cast<std::size_t>(opts.frame_opts.PaddedWindowSize() / 2 + 1),
                      mel_banks_.PaddedSpectrumSize())),
      mel_(static_cast<std::size_t>(opts.mel_opts.num_bins)) {}

FbankComputer::~FbankComputer() = default;

std::int32_t FbankComputer::Dim() const {
  return opts_.mel_opts.num_bins + (opts_.use_energy ? 1 : 0);
}

void FbankComputer::Compute(float signal_raw_log_energy, std::span<double> window, std::span<float> feature) {
  NL_DCHECK(static_cast<std::int32_t>(window.size()) == opts_.frame_opts.PaddedWindowSize());
  NL_DCHECK(static_cast<std::int32_t>(feature.size()) == Dim());
  if (opts_.use_energy && !opts_.raw_energy) {  // energy of the windowed frame
    double e = 0;
    for (double s : window) e += s * s;
    signal_raw_log_energy = static_cast<float>(std::log(std::max(e, static_cast<double>(FLT_MIN))));
  }
  if (fft_->pow2 && opts_.use_power) {
    for_isa(active_isa(), PowerAndMelBaseline, PowerAndMelAvx2, PowerAndMelAvx512)(
        fft_->fast, mel_banks_, window.data(), power_.data(), mel_.data());
  } else {
    if (fft_->pow2)
      fft_->fast.PowerSpectrum(window.data(), power_.data());
    else
      fft_->PowerSpectrumOther(window.data(), power_.data());
    if (!opts_.use_power)
      for (double& p : power_) p = std::sqrt(p);
    mel_banks_.Compute(power_, mel_);
  }
  const std::size_t mel_offset = (opts_.use_energy && !opts_.htk_compat) ? 1 : 0;
  // The log of the double energy, rounded once to float (detail::LogMel, src/speech/log_mel.h). Kaldi and
  // torchaudio take logf of the energy rounded to float; the two differ by at most ~2 float ulps (≤ 4e-6 for
  // |feature| < 32).
  if (opts_.use_log_fbank) {
    for_isa(active_isa(), LogMelBaseline, LogMelAvx2, LogMelAvx512)(feature.data() + mel_offset, mel_.data(),
                                                                    mel_.size());
  } else {
    for (std::size_t b = 0; b < mel_.size(); ++b) feature[mel_offset + b] = static_cast<float>(mel_[b]);
  }
  if (opts_.use_energy) {
    if (opts_.energy_floor > 0.0f)
      signal_raw_log_energy = std::max(signal_raw_log_energy, std::log(opts_.energy_floor));
    feature[opts_.htk_compat ? mel_.size() : 0] = signal_raw_log_energy;
  }
}

OnlineFbank::OnlineFbank(const FbankOptions& opts)
    : opts_(opts), computer_(opts), window_function_(opts.frame_opts), dither_(opts.frame_opts.dither_seed) {}

void OnlineFbank::AcceptWaveform(float samp_freq, std::span<const float> samples) {
  NL_CHECK(!finished_, "OnlineFbank: AcceptWaveform called after InputFinished");
  CheckSampleFrequency(opts_.frame_opts, samp_freq);
  if (samples.empty()) return;
  remainder_.insert(remainder_.end(), samples.begin(), samples.end());
  ComputeFeatures();
}

void OnlineFbank::Reset() {
  dither_ = DitherState(opts_.frame_opts.dither_seed);
  remainder_.clear();
  waveform_offset_ = 0;
  num_frames_ = 0;
  finished_ = false;
  features_.clear();
}

void OnlineFbank::InputFinished() {
  if (finished_) return;
  finished_ = true;
  ComputeFeatures();
}

std::span<const float> OnlineFbank::GetFrame(std::int64_t frame) const {
  NL_CHECK(frame >= 0 && frame < num_frames_, "frame {} is not ready (0..{} are)", frame, num_frames_ - 1);
  const std::size_t d = static_cast<std::size_t>(Dim());
  return std::span<const float>(features_).subspan(static_cast<std::size_t>(frame) * d, d);
}

void OnlineFbank::ComputeFrames(std::span<const float> wave, std::int64_t offset, std::int64_t first,
                                std::int64_t last, float* out) {
  const std::size_t d = static_cast<std::size_t>(Dim());
  const bool need_energy = computer_.NeedRawLogEnergy();
  for (std::int64_t f = first; f < last; ++f) {
    float raw_log_energy = 0.0f;
    ExtractWindow(offset, wave, f, opts_.frame_opts, window_function_, dither_, window_,
                  need_energy ? &raw_log_energy : nullptr);
    computer_.Compute(raw_log_energy, window_,
                      std::span<float>(out + static_cast<std::size_t>(f - first) * d, d));
  }
}

void OnlineFbank::ComputeFeatures() {
  const FrameExtractionOptions& fo = opts_.frame_opts;
  const std::int64_t total = waveform_offset_ + static_cast<std::int64_t>(remainder_.size());
  const std::int64_t new_frames = NumFrames(total, fo, finished_);
  if (new_frames > num_frames_ && !remainder_.empty()) {
    const std::size_t d = static_cast<std::size_t>(Dim());
    features_.resize(static_cast<std::size_t>(new_frames) * d);
    ComputeFrames(remainder_, waveform_offset_, num_frames_, new_frames,
                  features_.data() + static_cast<std::size_t>(num_frames_) * d);
    num_frames_ = new_frames;
  }
  // Drop the samples no later frame needs, keeping one extra frame length of history: a final frame
  // mirrored at the end of the stream can read up to one sample before its own start, and a very short
  // stream mirrors twice. Both are then still in the buffer (ExtractWindow checks).
  const std::int64_t keep_from = FirstSampleOfFrame(num_frames_, fo) - fo.WindowSize();
  const std::int64_t discard =
      std::min<std::int64_t>(keep_from - waveform_offset_, static_cast<std::int64_t>(remainder_.size()));
  if (discard > 0) {
    remainder_.erase(remainder_.begin(), remainder_.begin() + discard);
    waveform_offset_ += discard;
  }
}

Tensor OnlineFbank::Features(FeatureLayout layout) const {
  return FeaturesAs(features_.data(), num_frames_, Dim(), layout);
}

// The whole waveform at once: the frames of OnlineFbank fed everything and finished, in the same order
// with the same dither sequence (so the same bits), computed straight from `samples` into the result
// without copying the waveform into the stream buffer or the features out of it.
Tensor FbankExtractor::Compute(std::span<const float> samples, float samp_freq, FeatureLayout layout) {
  fbank_.Reset();
  CheckSampleFrequency(opts_.frame_opts, samp_freq);
  const FrameExtractionOptions& fo = opts_.frame_opts;
  const std::int64_t frames =
      samples.empty() ? 0 : NumFrames(static_cast<std::int64_t>(samples.size()), fo, true);
  NL_CHECK(frames > 0,
           "the waveform has {} samples ({:.1f} ms), too short for one {}-sample frame ({} ms at {} Hz{}); "
           "Kaldi would output 0 frames, normlab refuses",
           samples.size(), 1000.0 * static_cast<double>(samples.size()) / fo.samp_freq, fo.WindowSize(),
           fo.frame_length_ms, fo.samp_freq, fo.snip_edges ? ", snip-edges true" : ", snip-edges false");
  const Index d = fbank_.Dim();
  Tensor tf(Dims{frames, d});
  fbank_.ComputeFrames(samples, 0, 0, frames, tf.data());
  if (layout == FeatureLayout::kTF) return tf;
  return FeaturesAs(tf.data(), frames, d, layout);
}

Tensor ComputeFbank(const FbankOptions& opts, std::span<const float> samples, float samp_freq,
                    FeatureLayout layout) {
  return FbankExtractor(opts).Compute(samples, samp_freq, layout);
}

}  // namespace normlab::speech
