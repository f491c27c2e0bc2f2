// Mel filter banks. Semantics follow Kaldi's src/feat/mel-computations.cc (MelBanks::MelBanks,
// MelBanks::Compute), restated; the contract is in include/normlab/speech/mel_banks.h.
#include <normlab/error.h>
#include <normlab/speech/mel_banks.h>

#include <cmath>

namespace normlab::speech {

std::string MelBanksOptions::ToString() const {
  return fmt::format("num_bins={} low_freq={} high_freq={} vtln_low={} vtln_high={} htk_mode={}", num_bins,
                     low_freq, high_freq, vtln_low, vtln_high, htk_mode);
}

MelBanks::MelBanks(const MelBanksOptions& opts, const FrameExtractionOptions& frame_opts) {
  frame_opts.Validate();
  NL_CHECK(opts.num_bins >= 3, "num-mel-bins must be ≥ 3, got {}", opts.num_bins);
  const float samp_freq = frame_opts.samp_freq;
  const std::int32_t padded = frame_opts.PaddedWindowSize();
  const std::int32_t num_fft_bins = padded / 2;  // the Nyquist bin (index N/2) is never used
  const float nyquist = 0.5f * samp_freq;
  const float low_freq = opts.low_freq;
  const float high_freq = opts.high_freq > 0.0f ? opts.high_freq : nyquist + opts.high_freq;
  NL_CHECK(std::isfinite(low_freq) && std::isfinite(high_freq) && low_freq >= 0.0f && low_freq < nyquist &&
               high_freq > 0.0f && high_freq <= nyquist && high_freq > low_freq,
           "bad mel frequency range: low-freq {} and high-freq {} vs. nyquist {} (need 0 ≤ low-freq < "
           "high-freq ≤ nyquist; high-freq ≤ 0 is an offset from nyquist)",
           opts.low_freq, opts.high_freq, nyquist);
  // VTLN is not applied; the cut-offs are still checked the way Kaldi checks them when warping.
  const float vtln_high = opts.vtln_high < 0.0f ? opts.vtln_high + nyquist : opts.vtln_high;
  NL_CHECK(std::isfinite(opts.vtln_low) && std::isfinite(vtln_high),
           "vtln-low {} and vtln-high {} must be finite", opts.vtln_low, opts.vtln_high);

  const float fft_bin_width = samp_freq / static_cast<float>(padded);
  const float mel_low = MelScale(low_freq), mel_high = MelScale(high_freq);
  const float mel_delta = (mel_high - mel_low) / static_cast<float>(opts.num_bins + 1);

  center_freqs_.resize(static_cast<std::size_t>(opts.num_bins));
  bins_.resize(static_cast<std::size_t>(opts.num_bins));
  for (std::int32_t b = 0; b < opts.num_bins; ++b) {
    const float left = mel_low + static_cast<float>(b) * mel_delta;
    const float center = mel_low + static_cast<float>(b + 1) * mel_delta;
    const float right = mel_low + static_cast<float>(b + 2) * mel_delta;
    center_freqs_[static_cast<std::size_t>(b)] = InverseMelScale(center);
    std::vector<float> weights(static_cast<std::size_t>(num_fft_bins), 0.0f);
    std::int32_t first = -1, last = -1;
    for (std::int32_t i = 0; i < num_fft_bins; ++i) {
      const float mel = MelScale(fft_bin_width * static_cast<float>(i));
      if (mel > left && mel < right) {
        weights[static_cast<std::size_t>(i)] =
            mel <= center ? (mel - left) / (center - left) : (right - mel) / (right - center);
        if (first == -1) first = i;
        last = i;
      }
    }
    NL_CHECK(first != -1,
             "mel bin {} of {} ({:.1f}–{:.1f} Hz) contains no FFT bin (FFT resolution {:.2f} Hz with "
             "{}-point FFT at {} Hz); you may have set --num-mel-bins too large (Kaldi rejects this too)",
             b, opts.num_bins, InverseMelScale(left), InverseMelScale(right), fft_bin_width, padded,
             samp_freq);
    auto& bin = bins_[static_cast<std::size_t>(b)];
    bin.first = first;
    bin.second.assign(weights.begin() + first, weights.begin() + last + 1);
    if (opts.htk_mode && b == 0 && mel_low != 0.0f) bin.second[0] = 0.0f;
  }
}

void MelBanks::Compute(std::span<const double> power_spectrum, std::span<double> mel_energies) const {
  NL_DCHECK(mel_energies.size() == bins_.size());
  for (std::size_t b = 0; b < bins_.size(); ++b) {
    const auto& [first, w] = bins_[b];
    const double* p = power_spectrum.data() + first;
    NL_DCHECK(static_cast<std::size_t>(first) + w.size() <= power_spectrum.size());
    // Four interleaved partial sums (lane j takes i ≡ j mod 4), added pairwise: a fixed order without a
    // serial chain of dependent adds.
    double acc[4] = {0, 0, 0, 0};
    const std::size_t n = w.size();
    std::size_t i = 0;
    // Scalar math: acc[j] += w[i + j]·p[i + j].
    for (; i + 4 <= n; i += 4)
      for (std::size_t j = 0; j < 4; ++j) acc[j] += static_cast<double>(w[i + j]) * p[i + j];
    for (std::size_t j = 0; i < n; ++i, ++j) acc[j] += static_cast<double>(w[i]) * p[i];
    mel_energies[b] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  }
}

}  // namespace normlab::speech
