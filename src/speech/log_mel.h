// The log of the log-mel features (internal): y = float(ln(max(m, FLT_EPSILON))) for double mel energies m,
// vectorizable, in double. Inline so that src/speech/fbank.cpp compiles it once per instruction set.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace normlab::speech::detail {

// y[b] = float(ln(max(m[b], FLT_EPSILON))) for the log-mel features, vectorized and in double, so that
// the result is the natural log rounded once to float (error ≈ 1e-15 relative before that rounding),
// one rounding closer than Kaldi's and torchaudio's logf(float(m)). Elementwise IEEE operations only
// (no FMA, -ffp-contract=off), so the baseline, AVX2 and AVX-512 builds give the same bits. Valid for finite
// m ≥ FLT_EPSILON (normal doubles); an infinite or NaN energy (only from absurd float WAVs) takes
// std::log after the loop.
//   m = 2^e·f, f ∈ [1, 2); if f > √2: f ← f/2, e ← e + 1, so f ∈ (√½, √2]
//   s = (f − 1)/(f + 1) (|s| ≤ 0.1716; f − 1 is exact), z = s²
//   ln f = 2s·(1 + z/3 + z²/5 + … + z⁹/19)   (truncation < 2e-16 relative: z¹⁰/21 < 1e-16)
//   ln m = e·ln 2 + ln f
// GCC vector extensions (four doubles): the baseline build splits them into SSE2 operations, the AVX2 and
// AVX-512 builds use whole registers; all perform the same IEEE operations.
using V4d = double __attribute__((vector_size(32)));
using V4u = std::uint64_t __attribute__((vector_size(32)));
using V4i = std::int64_t __attribute__((vector_size(32)));
// out[j] = ln(in[j]) (arrays, not vector values, at the function boundary: no vector ABI involved).
[[gnu::always_inline]] inline void LogV4(const double* in, double* out) {
  V4d v;
  std::memcpy(&v, in, sizeof v);
  constexpr double kLn2 = 0.69314718055994530942;
  constexpr double kSqrt2 = 1.41421356237309504880;
  constexpr double kTwo52 = 4503599627370496.0;  // 2^52: exponent bits → double by the 2^52 trick
  const V4u bits = reinterpret_cast<V4u>(v);
  V4d f = reinterpret_cast<V4d>((bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);
  V4d e = reinterpret_cast<V4d>((bits >> 52) | 0x4330000000000000ull) - kTwo52 - 1023.0;
  const V4i big = f > kSqrt2;
  f = big ? f * 0.5 : f;
  e = big ? e + 1.0 : e;
  const V4d s = (f - 1.0) / (f + 1.0);
  const V4d z = s * s;
  V4d p = z * (1.0 / 19) + 1.0 / 17;
  p = p * z + 1.0 / 15;
  p = p * z + 1.0 / 13;
  p = p * z + 1.0 / 11;
  p = p * z + 1.0 / 9;
  p = p * z + 1.0 / 7;
  p = p * z + 1.0 / 5;
  p = p * z + 1.0 / 3;
  const V4d ln_f = 2.0 * s + 2.0 * s * (z * p);
  const V4d r = e * kLn2 + ln_f;
  std::memcpy(out, &r, sizeof r);
}
[[gnu::always_inline]] inline void LogMel(float* y, const double* m, std::size_t n) {
  const double lo = static_cast<double>(FLT_EPSILON);
  auto clamp = [lo](double v) { return v < lo ? lo : v; };  // max(v, FLT_EPSILON); NaN stays NaN
  std::size_t b = 0;
  // Scalar math: y[b] = float(ln(max(m[b], FLT_EPSILON))) as above, four elements at a time.
  double v[4], r[4];
  for (; b + 4 <= n; b += 4) {
    for (std::size_t j = 0; j < 4; ++j) v[j] = clamp(m[b + j]);
    LogV4(v, r);
    for (std::size_t j = 0; j < 4; ++j) y[b + j] = static_cast<float>(r[j]);
  }
  if (b < n) {
    for (std::size_t j = 0; j < 4; ++j) v[j] = b + j < n ? clamp(m[b + j]) : 1.0;
    LogV4(v, r);
    for (std::size_t j = 0; b + j < n; ++j) y[b + j] = static_cast<float>(r[j]);
  }
  for (b = 0; b < n; ++b)
    if (!(m[b] <= DBL_MAX)) y[b] = static_cast<float>(std::log(m[b]));
}

}  // namespace normlab::speech::detail
