// Mel filter banks. Semantics follow Kaldi's src/feat/mel-computations.cc (MelBanks::MelBanks,
// MelBanks::Compute), restated; the contract is in include/normlab/speech/mel_banks.h.
#include <normlab/error.h>
#include <normlab/speech/mel_banks.h>

#include <algorithm>
#include <cmath>

namespace normlab::speech {

std::string MelBanksOptions::ToString() const {
  return fmt::format("num_bins={} low_freq={} high_freq={} vtln_low={} vtln_high={} htk_mode={}", num_bins,
                     low_freq, high_freq, vtln_low, vtln_high, htk_mode);
}

double MelBanks::VtlnWarpFreq(double vtln_low_cutoff, double vtln_high_cutoff, double low_freq, double high_freq,
                             double vtln_warp_factor, double freq) {
  if (freq < low_freq || freq > high_freq) return freq;
  NL_CHECK(vtln_low_cutoff > low_freq, "vtln-low {} must be above low-freq {}", vtln_low_cutoff, low_freq);
  NL_CHECK(vtln_high_cutoff < high_freq, "vtln-high {} must be below high-freq {} (or negative)",
           vtln_high_cutoff, high_freq);
  const double one = 1.0;
  // Inflection points l, h (unwarped) with min(l, F(l)) = vtln_low and max(h, F(h)) = vtln_high.
  const double l = vtln_low_cutoff * std::max(one, vtln_warp_factor);
  const double h = vtln_high_cutoff * std::min(one, vtln_warp_factor);
  const double scale = 1.0 / vtln_warp_factor;
  const double fl = scale * l, fh = scale * h;  // F(l), F(h)
  NL_CHECK(l > low_freq && h < high_freq, "VTLN inflection points {} and {} Hz outside ({}, {}) Hz", l, h,
           low_freq, high_freq);
  const double scale_left = (fl - low_freq) / (l - low_freq);
  const double scale_right = (high_freq - fh) / (high_freq - h);
  if (freq < l) return low_freq + scale_left * (freq - low_freq);
  if (freq < h) return scale * freq;
  return high_freq + scale_right * (freq - high_freq);
}

double MelBanks::VtlnWarpMelFreq(double vtln_low_cutoff, double vtln_high_cutoff, double low_freq, double high_freq,
                                double vtln_warp_factor, double mel_freq) {
  return MelScale(VtlnWarpFreq(vtln_low_cutoff, vtln_high_cutoff, low_freq, high_freq, vtln_warp_factor,
                               InverseMelScale(mel_freq)));
}

MelBanks::MelBanks(const MelBanksOptions& opts, const FrameExtractionOptions& frame_opts,
                   double vtln_warp_factor) {
  frame_opts.Validate();
  NL_CHECK(opts.num_bins >= 3, "num-mel-bins must be ≥ 3, got {}", opts.num_bins);
  const double samp_freq = frame_opts.samp_freq;
  const std::int32_t padded = frame_opts.PaddedWindowSize();
  const std::int32_t num_fft_bins = padded / 2;  // the Nyquist bin (index N/2) is never used
  const double nyquist = 0.5 * samp_freq;
  const double low_freq = opts.low_freq;
  const double high_freq = opts.high_freq > 0.0 ? opts.high_freq : nyquist + opts.high_freq;
  NL_CHECK(std::isfinite(low_freq) && std::isfinite(high_freq) && low_freq >= 0.0 && low_freq < nyquist &&
               high_freq > 0.0 && high_freq <= nyquist && high_freq > low_freq,
           "bad mel frequency range: low-freq {} and high-freq {} vs. nyquist {} (need 0 ≤ low-freq < "
           "high-freq ≤ nyquist; high-freq ≤ 0 is an offset from nyquist)",
           opts.low_freq, opts.high_freq, nyquist);
  const double vtln_low = opts.vtln_low;
  const double vtln_high = opts.vtln_high < 0.0 ? opts.vtln_high + nyquist : opts.vtln_high;
  NL_CHECK(std::isfinite(vtln_low) && std::isfinite(vtln_high), "vtln-low {} and vtln-high {} must be finite",
           opts.vtln_low, opts.vtln_high);
  NL_CHECK(std::isfinite(vtln_warp_factor) && vtln_warp_factor > 0.0, "vtln-warp must be > 0, got {}",
           vtln_warp_factor);
  const bool warp = vtln_warp_factor != 1.0;
  NL_CHECK(!warp || (vtln_low >= 0.0 && vtln_low > low_freq && vtln_low < high_freq && vtln_high > 0.0 &&
                     vtln_high < high_freq && vtln_high > vtln_low),
           "bad VTLN options: vtln-low {} and vtln-high {} (= {} Hz), versus low-freq {} and high-freq {} (need "
           "low-freq < vtln-low < vtln-high < high-freq; vtln-high < 0 is an offset from nyquist {}), as "
           "Kaldi requires for vtln-warp {} ≠ 1",
           vtln_low, opts.vtln_high, vtln_high, low_freq, high_freq, nyquist, vtln_warp_factor);

  const double fft_bin_width = samp_freq / static_cast<double>(padded);
  const double mel_low = MelScale(low_freq), mel_high = MelScale(high_freq);
  const double mel_delta = (mel_high - mel_low) / static_cast<double>(opts.num_bins + 1);

  num_fft_bins_ = static_cast<std::size_t>(num_fft_bins);
  center_freqs_.resize(static_cast<std::size_t>(opts.num_bins));
  bins_.resize(static_cast<std::size_t>(opts.num_bins));
  for (std::int32_t b = 0; b < opts.num_bins; ++b) {
    double left = mel_low + static_cast<double>(b) * mel_delta;
    double center = mel_low + static_cast<double>(b + 1) * mel_delta;
    double right = mel_low + static_cast<double>(b + 2) * mel_delta;
    if (warp) {
      left = VtlnWarpMelFreq(vtln_low, vtln_high, low_freq, high_freq, vtln_warp_factor, left);
      center = VtlnWarpMelFreq(vtln_low, vtln_high, low_freq, high_freq, vtln_warp_factor, center);
      right = VtlnWarpMelFreq(vtln_low, vtln_high, low_freq, high_freq, vtln_warp_factor, right);
    }
    center_freqs_[static_cast<std::size_t>(b)] = InverseMelScale(center);
    std::vector<double> weights(static_cast<std::size_t>(num_fft_bins), 0.0);
    std::int32_t first = -1, last = -1;
    for (std::int32_t i = 0; i < num_fft_bins; ++i) {
      const double mel = MelScale(fft_bin_width * static_cast<double>(i));
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
    if (opts.htk_mode && b == 0 && mel_low != 0.0) weights[static_cast<std::size_t>(first)] = 0.0;
    const std::int32_t size = last - first + 1, padded_size = (size + 3) / 4 * 4;
    bins_[static_cast<std::size_t>(b)] = {first, static_cast<std::int32_t>(weights_.size()), size, padded_size};
    weights_.insert(weights_.end(), weights.begin() + first, weights.begin() + last + 1);
    weights_.resize(weights_.size() + static_cast<std::size_t>(padded_size - size), 0.0);
    padded_spectrum_size_ = std::max(padded_spectrum_size_, static_cast<std::size_t>(first + padded_size));
  }
}

}  // namespace normlab::speech
