// Test-set corruptions; the contract is in src/speech/corrupt.h. Biquad coefficients follow the RBJ
// Audio EQ Cookbook formulas (restated from the published formulas).
#include "speech/corrupt.h"

#include <normlab/error.h>

#include <cmath>
#include <complex>
#include <numbers>

namespace normlab::speech {
namespace {

struct Rbj {
  double w0, cosw, alpha;
  Rbj(double fs, double f0, double q) {
    NL_CHECK(fs > 0 && f0 > 0 && f0 < fs / 2 && q > 0, "biquad: need 0 < f0 ({}) < fs/2 ({}) and q ({}) > 0",
             f0, fs / 2, q);
    w0 = 2 * std::numbers::pi * f0 / fs;
    cosw = std::cos(w0);
    alpha = std::sin(w0) / (2 * q);
  }
};

Biquad normalized(double b0, double b1, double b2, double a0, double a1, double a2) {
  return Biquad{b0 / a0, b1 / a0, b2 / a0, a1 / a0, a2 / a0};
}

}  // namespace

Biquad Biquad::Lowpass(double fs, double f0, double q) {
  const Rbj r(fs, f0, q);
  const double b1 = 1 - r.cosw;
  return normalized(b1 / 2, b1, b1 / 2, 1 + r.alpha, -2 * r.cosw, 1 - r.alpha);
}

Biquad Biquad::Highpass(double fs, double f0, double q) {
  const Rbj r(fs, f0, q);
  const double b1 = -(1 + r.cosw);
  return normalized(-b1 / 2, b1, -b1 / 2, 1 + r.alpha, -2 * r.cosw, 1 - r.alpha);
}

Biquad Biquad::Peaking(double fs, double f0, double q, double gain_db) {
  const Rbj r(fs, f0, q);
  const double a = std::pow(10.0, gain_db / 40);
  return normalized(1 + r.alpha * a, -2 * r.cosw, 1 - r.alpha * a, 1 + r.alpha / a, -2 * r.cosw,
                    1 - r.alpha / a);
}

double Biquad::MagnitudeAt(double fs, double f) const {
  const std::complex<double> z1 = std::polar(1.0, -2 * std::numbers::pi * f / fs), z2 = z1 * z1;
  return std::abs((b0 + b1 * z1 + b2 * z2) / (1.0 + a1 * z1 + a2 * z2));
}

void Biquad::Process(std::span<double> x) const {
  double s1 = 0, s2 = 0;  // transposed direct form II state
  for (double& v : x) {
    const double in = v, out = b0 * in + s1;
    s1 = b1 * in - a1 * out + s2;
    s2 = b2 * in - a2 * out;
    v = out;
  }
}

void ApplyGainDb(std::span<float> x, double db) {
  const double g = std::pow(10.0, db / 20);
  for (float& v : x) v = static_cast<float>(v * g);
}

std::vector<double> ApplySegmentGain(std::span<float> x, double fs, std::mt19937_64& rng, double min_ms,
                                     double max_ms, double min_db, double max_db) {
  NL_CHECK(min_ms > 0 && max_ms >= min_ms && max_db >= min_db,
           "segment gain: bad ranges [{}, {}] ms, [{}, {}] dB", min_ms, max_ms, min_db, max_db);
  std::uniform_real_distribution<double> len_ms(min_ms, max_ms), mag(min_db, max_db);
  std::vector<double> gains;
  std::size_t pos = 0;
  while (pos < x.size()) {
    const auto len =
        std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(len_ms(rng) * fs / 1000)));
    const double db = (rng() & 1 ? 1.0 : -1.0) * mag(rng);
    const std::size_t end = std::min(x.size(), pos + len);
    ApplyGainDb(x.subspan(pos, end - pos), db);
    gains.push_back(db);
    pos = end;
  }
  return gains;
}

ChannelFilter ChannelFilter::Random(std::mt19937_64& rng) {
  ChannelFilter c;
  c.highpass_hz = std::uniform_real_distribution<double>(100, 600)(rng);
  c.lowpass_hz = std::uniform_real_distribution<double>(2500, 5000)(rng);
  c.eq_hz = std::uniform_real_distribution<double>(500, 3000)(rng);
  c.eq_db = std::uniform_real_distribution<double>(-10, 10)(rng);
  return c;
}

void ChannelFilter::Apply(std::span<float> x, double fs) const {
  std::vector<double> y(x.begin(), x.end());
  Biquad::Highpass(fs, highpass_hz, std::numbers::sqrt2 / 2).Process(y);
  Biquad::Lowpass(fs, lowpass_hz, std::numbers::sqrt2 / 2).Process(y);
  Biquad::Peaking(fs, eq_hz, 1.0, eq_db).Process(y);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(y[i]);
}

std::string ChannelFilter::ToString() const {
  return fmt::format("hp={:.1f}Hz lp={:.1f}Hz eq={:.1f}Hz/{:+.2f}dB", highpass_hz, lowpass_hz, eq_hz, eq_db);
}

}  // namespace normlab::speech
