// speech/corrupt.h — the test-set corruptions of the spoken-digit data (docs: /work/shared speech.md,
// "Test corruptions"): constant gain, segment-wise gain, and a fixed random channel filter.
//
// Samples are float on any scale; processing is in double, results rounded to float once. Nothing clips:
// the corrupted copies are written as float WAV. Filters are RBJ "Audio EQ Cookbook" biquads (Robert
// Bristow-Johnson's formulas for LPF, HPF and peaking EQ), run in transposed direct form II from a zero
// state. All randomness comes from the caller's generator, so a seed fixes every parameter.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace normlab::speech {

// y[n] = b0·x[n] + b1·x[n−1] + b2·x[n−2] − a1·y[n−1] − a2·y[n−2] (coefficients normalized by a0).
struct Biquad {
  double b0 = 1, b1 = 0, b2 = 0, a1 = 0, a2 = 0;

  static Biquad Lowpass(double samp_freq, double f0, double q);
  static Biquad Highpass(double samp_freq, double f0, double q);
  static Biquad Peaking(double samp_freq, double f0, double q, double gain_db);

  // Magnitude response at frequency f (Hz), for tests and documentation.
  double MagnitudeAt(double samp_freq, double f) const;
  void Process(std::span<double> x) const;  // in place, zero initial state
};

// x *= 10^(db/20).
void ApplyGainDb(std::span<float> x, double db);

// Splits x into consecutive segments of uniform random length in [min_ms, max_ms] and scales each by
// ±U(min_db, max_db) dB (random sign). Returns the gains (dB), one per segment, in order.
std::vector<double> ApplySegmentGain(std::span<float> x, double samp_freq, std::mt19937_64& rng,
                                     double min_ms = 50, double max_ms = 100, double min_db = 20,
                                     double max_db = 30);

// A fixed channel: highpass (Q 1/√2) → lowpass (Q 1/√2) → peaking equalizer (Q 1).
struct ChannelFilter {
  double highpass_hz = 0, lowpass_hz = 0, eq_hz = 0, eq_db = 0;

  // highpass U(100, 600) Hz, lowpass U(2500, 5000) Hz, equalizer at U(500, 3000) Hz with U(−10, 10) dB.
  static ChannelFilter Random(std::mt19937_64& rng);
  void Apply(std::span<float> x, double samp_freq) const;
  std::string ToString() const;  // "hp=312.4Hz lp=3810.2Hz eq=1200.5Hz/-6.31dB"
};

}  // namespace normlab::speech
