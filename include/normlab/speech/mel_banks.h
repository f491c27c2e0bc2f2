// normlab/speech/mel_banks.h — triangular mel filter banks on a power spectrum.
//
// Follows the semantics of Kaldi's src/feat/mel-computations.{h,cc} (MelBanksOptions, MelBanks), restated:
//   * HTK mel scale: mel(f) = 1127·ln(1 + f/700). Bin edges, VTLN warp and weights are evaluated in
//     double, the algorithm's values (Kaldi evaluates them in float, torchaudio in a float/double mix; each
//     is off by ~1e-5 in a weight, which matters where a tiny edge weight meets a loud tone); the weighted
//     sums are taken in double.
//   * num_bins triangles equally spaced in mel between low_freq and high_freq (high_freq ≤ 0 means
//     Nyquist + high_freq); bin b spans mel [m_b, m_{b+2}] with its peak (1.0) at m_{b+1}. Weights are
//     evaluated at the FFT bin centres i·samp_freq/N for i = 0..N/2−1 (the Nyquist bin is never used),
//     with no area normalization.
//   * A bin that covers no FFT bin is an error, as in Kaldi ("you may have set --num-mel-bins too large").
//   * VTLN (MelBanks::VtlnWarpFreq / VtlnWarpMelFreq in Kaldi): with a warp factor α ≠ 1 the bin edges
//     m_b are moved by a piecewise-linear warp of frequency F, F(low_freq) = low_freq,
//     F(high_freq) = high_freq, F(f) = f/α between the inflection points l = vtln_low·max(1, α) and
//     h = vtln_high·min(1, α) (vtln_high ≤ 0 means Nyquist + vtln_high), linear on either side; the
//     warped edges are mel(F(mel⁻¹(m_b))). The FFT-bin positions are not warped. α ≠ 1 requires
//     low_freq < vtln_low < high_freq and 0 < vtln_high < high_freq and vtln_low < vtln_high (Kaldi's
//     "Bad values in options: vtln-low ..."); α = 1 ignores vtln_low/vtln_high as Kaldi does.
//   * htk_mode (HTK-compatible zeroing of the first bin's DC weight) is kept for completeness.
// Defaults mirror compute-fbank-feats (--num-mel-bins 23 --low-freq 20 --high-freq 0 --vtln-low 100
// --vtln-high -500; the warp factor, --vtln-warp 1.0, is FbankOptions::vtln_warp). Kaldi's MelBanksOptions
// struct itself defaults num_bins to 25 and FbankOptions
// overrides it with 23; this struct holds the fbank value directly.
#pragma once

#include <normlab/error.h>
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
  float vtln_low = 100.0f;     // --vtln-low (Hz): lower inflection point of the VTLN warp
  float vtln_high = -500.0f;   // --vtln-high (Hz): upper inflection point; < 0: offset from Nyquist
  bool htk_mode = false;       // set by FbankOptions::htk_compat

  std::string ToString() const;
};

class MelBanks {
 public:
  // Throws normlab::Error for bad frequencies ("low-freq 20 and high-freq 9000 vs. nyquist 8000") and for
  // an empty bin (naming the bin, its frequency range and the FFT resolution).
  // vtln_warp_factor: the VTLN warp α (1 = none; must be > 0). Throws for bad VTLN cut-offs when α ≠ 1.
  MelBanks(const MelBanksOptions& opts, const FrameExtractionOptions& frame_opts,
           double vtln_warp_factor = 1.0);

  static double MelScale(double freq) { return 1127.0 * std::log(1.0 + freq / 700.0); }
  static double InverseMelScale(double mel) { return 700.0 * (std::exp(mel / 1127.0) - 1.0); }

  // Kaldi's piecewise-linear VTLN warp of `freq` (Hz; returned unchanged outside [low_freq, high_freq]),
  // and the same applied to a mel-scale value. vtln_high_cutoff is absolute (Nyquist already added).
  static double VtlnWarpFreq(double vtln_low_cutoff, double vtln_high_cutoff, double low_freq,
                             double high_freq, double vtln_warp_factor, double freq);
  static double VtlnWarpMelFreq(double vtln_low_cutoff, double vtln_high_cutoff, double low_freq,
                                double high_freq, double vtln_warp_factor, double mel_freq);

  // mel_energies[b] = Σ_i weight_b[i]·power_spectrum[first_b + i]; power_spectrum holds ≥ N/2 values.
  // Each sum is taken as four interleaved partial sums (term i goes to lane i mod 4), added pairwise: a
  // fixed order without a serial chain of dependent adds.
  void Compute(std::span<const double> power_spectrum, std::span<double> mel_energies) const {
    NL_CHECK(mel_energies.size() == bins_.size() && power_spectrum.size() >= num_fft_bins_,
             "MelBanks::Compute: {} mel outputs for {} bins, {} spectrum values for {} FFT bins",
             mel_energies.size(), bins_.size(), power_spectrum.size(), num_fft_bins_);
    for (std::size_t b = 0; b < bins_.size(); ++b) {
      const double* w = weights_.data() + bins_[b].start;
      const double* p = power_spectrum.data() + bins_[b].first;
      double acc[4] = {0, 0, 0, 0};
      for (std::size_t i = 0; i < static_cast<std::size_t>(bins_[b].size); ++i) acc[i % 4] += w[i] * p[i];
      mel_energies[b] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
  }
  // The same sums (the same bits) with every band padded with zero weights to a multiple of 4, so that
  // each bin is whole vectors: power_spectrum must hold PaddedSpectrumSize() values, finite (a padded term
  // adds 0·p = +0 to a lane). Inline so that src/speech/fbank.cpp compiles it into its per-instruction-set
  // frame kernels (elementwise lanes: the same bits on every set).
  std::size_t PaddedSpectrumSize() const { return padded_spectrum_size_; }
  [[gnu::always_inline]] inline void ComputePadded(const double* power_spectrum, double* mel_energies) const {
    for (std::size_t b = 0; b < bins_.size(); ++b) {
      const double* w = weights_.data() + bins_[b].start;
      const double* p = power_spectrum + bins_[b].first;
      double acc[4] = {0, 0, 0, 0};
      // Scalar math: acc[j] += w[i + j]·p[i + j].
      for (std::size_t i = 0; i < static_cast<std::size_t>(bins_[b].padded); i += 4)
        for (std::size_t j = 0; j < 4; ++j) acc[j] += w[i + j] * p[i + j];
      mel_energies[b] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
  }

  std::int32_t NumBins() const { return static_cast<std::int32_t>(bins_.size()); }
  // Centre frequency of each bin (Hz).
  std::span<const double> CenterFreqs() const { return center_freqs_; }
  // Bin b's first FFT index and its weights.
  std::int32_t BinOffset(std::int32_t b) const { return bins_[static_cast<std::size_t>(b)].first; }
  std::span<const double> BinWeights(std::int32_t b) const {
    const Bin& bin = bins_[static_cast<std::size_t>(b)];
    return std::span<const double>(weights_).subspan(static_cast<std::size_t>(bin.start),
                                                      static_cast<std::size_t>(bin.size));
  }

 private:
  struct Bin {
    // First FFT index; where its weights start in weights_; their count; the count padded to a multiple
    // of 4 (zeros follow the weights in weights_).
    std::int32_t first, start, size, padded;
  };
  std::vector<double> center_freqs_;
  std::vector<Bin> bins_;
  std::vector<double> weights_;  // every bin's nonzero band and its zero padding, bin after bin
  std::size_t num_fft_bins_ = 0, padded_spectrum_size_ = 0;
};

}  // namespace normlab::speech
