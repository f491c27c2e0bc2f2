// normlab/speech/mel_banks.h — triangular mel filter banks on a power spectrum.
//
// Follows the semantics of Kaldi's src/feat/mel-computations.{h,cc} (MelBanksOptions, MelBanks), restated:
//   * HTK mel scale: mel(f) = 1127·ln(1 + f/700); the weights are evaluated in float like Kaldi
//     (torchaudio's differ from them by ~1e-5); the weighted sums are taken in double.
//   * num_bins triangles equally spaced in mel between low_freq and high_freq (high_freq ≤ 0 means
//     Nyquist + high_freq); bin b spans mel [m_b, m_{b+2}] with its peak (1.0) at m_{b+1}. Weights are
//     evaluated at the FFT bin centres i·samp_freq/N for i = 0..N/2−1 (the Nyquist bin is never used),
//     with no area normalization.
//   * A bin that covers no FFT bin is an error, as in Kaldi ("you may have set --num-mel-bins too large").
//   * VTLN (vtln_low, vtln_high and a warp factor) is NOT implemented: the options exist so that the flag
//     set and defaults match Kaldi, and are validated, but no warping is applied.
//   * htk_mode (HTK-compatible zeroing of the first bin's DC weight) is kept for completeness.
// Defaults mirror compute-fbank-feats (--num-mel-bins 23 --low-freq 20 --high-freq 0 --vtln-low 100
// --vtln-high -500). Kaldi's MelBanksOptions struct itself defaults num_bins to 25 and FbankOptions
// overrides it with 23; this struct holds the fbank value directly.
#pragma once

#include <normlab/speech/feature_window.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace normlab::speech {

struct MelBanksOptions {
  std::int32_t num_bins = 23;  // --num-mel-bins
  float low_freq = 20.0f;      // --low-freq (Hz)
  float high_freq = 0.0f;      // --high-freq (Hz); ≤ 0: offset from Nyquist
  float vtln_low = 100.0f;     // --vtln-low (Hz); VTLN is not implemented, see above
  float vtln_high = -500.0f;   // --vtln-high (Hz); ≤ 0: offset from Nyquist
  bool htk_mode = false;       // set by FbankOptions::htk_compat

  std::string ToString() const;
};

class MelBanks {
 public:
  // Throws normlab::Error for bad frequencies ("low-freq 20 and high-freq 9000 vs. nyquist 8000") and for
  // an empty bin (naming the bin, its frequency range and the FFT resolution).
  MelBanks(const MelBanksOptions& opts, const FrameExtractionOptions& frame_opts);

  static float MelScale(float freq) { return 1127.0f * std::log(1.0f + freq / 700.0f); }
  static float InverseMelScale(float mel) { return 700.0f * (std::exp(mel / 1127.0f) - 1.0f); }

  // mel_energies[b] = Σ_i weight_b[i]·power_spectrum[first_b + i]; power_spectrum holds ≥ N/2 values.
  void Compute(std::span<const double> power_spectrum, std::span<double> mel_energies) const;

  std::int32_t NumBins() const { return static_cast<std::int32_t>(bins_.size()); }
  // Centre frequency of each bin (Hz).
  std::span<const float> CenterFreqs() const { return center_freqs_; }
  // Bin b's first FFT index and its weights.
  std::int32_t BinOffset(std::int32_t b) const { return bins_[static_cast<std::size_t>(b)].first; }
  std::span<const float> BinWeights(std::int32_t b) const {
    return bins_[static_cast<std::size_t>(b)].second;
  }

 private:
  std::vector<float> center_freqs_;
  std::vector<std::pair<std::int32_t, std::vector<float>>> bins_;
};

}  // namespace normlab::speech
