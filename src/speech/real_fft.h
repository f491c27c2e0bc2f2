// src/speech/real_fft.h — the power spectrum of a real frame whose length is a power of two, in double.
//
// Why not kissfft here: the fbank front end spends most of its time in the FFT, and kissfft's generic
// recursive C++ template (kissfft<double>, one std::complex at a time) takes ~2.6 µs for the default
// 512-point frame, more than the whole per-frame budget of the speed target (docs/PERFORMANCE.md, "Speech
// front end"). This is the textbook algorithm in a form the compiler vectorizes: a Stockham autosort FFT
// (radix 4, one radix-2 pass when log2 is odd) on split real/imaginary arrays, of the N/2-point complex
// sequence z_j = x_{2j} + i·x_{2j+1}, then the usual real-input post-processing. Lengths that are not a
// power of two (--round-to-power-of-two=false) still go through kissfft (src/speech/fbank.cpp).
// tests/speech/fbank_test.cpp (RealFft.*) checks this transform against a long-double direct DFT.
//
// All arithmetic is double; twiddles are cos/sin of exact multiples of 2π/n, evaluated once per plan.
// The operations and their order are fixed by the code (no reassociation, -ffp-contract=off), so the
// result does not depend on the thread count, on how a waveform is chunked, or on the CPU. The x and y
// buffers of a pass never overlap (`#pragma GCC ivdep` says so to the vectorizer).
#pragma once

#include <normlab/error.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <utility>
#include <vector>

namespace normlab::speech::detail {

class RealFftPow2 {
 public:
  static bool Supports(std::int32_t n) { return n >= 2 && (n & (n - 1)) == 0; }

  explicit RealFftPow2(std::int32_t n) : n_(n), m_(n / 2) {
    NL_CHECK(Supports(n), "internal: RealFftPow2 needs a power-of-two length ≥ 2, got {}", n);
    const std::size_t m = static_cast<std::size_t>(m_);
    work_.resize(4 * WorkStride() + 7);
    // Twiddles of each radix-4 pass (length len = m, m/4, ...; q = len/4): w^p, w^2p, w^3p with
    // w = exp(−2πi/len), p = 0..q−1, stored as six arrays of q values each, pass after pass.
    for (std::int32_t len = m_; len >= 4; len /= 4) {
      const std::int32_t q = len / 4;
      for (int k = 1; k <= 3; ++k)
        for (std::int32_t p = 0; p < q; ++p) {
          const double angle = -2.0 * std::numbers::pi * static_cast<double>(k * p) / len;
          tw_.push_back(std::cos(angle));
        }
      for (int k = 1; k <= 3; ++k)
        for (std::int32_t p = 0; p < q; ++p) {
          const double angle = -2.0 * std::numbers::pi * static_cast<double>(k * p) / len;
          tw_.push_back(std::sin(angle));
        }
    }
    // Post-processing twiddles W^k = exp(−2πik/n), k = 0..m−1.
    post_r_.resize(m);
    post_i_.resize(m);
    for (std::size_t k = 0; k < m; ++k) {
      const double angle = -2.0 * std::numbers::pi * static_cast<double>(k) / n_;
      post_r_[k] = std::cos(angle);
      post_i_[k] = std::sin(angle);
    }
  }

  std::int32_t Length() const { return n_; }

  // power[k] = |X_k|², k = 0..n/2, X = DFT(x) (unnormalized, e^{−2πi jk/n}); x holds n values.
  // Always inlined, so that a caller compiled for a wider instruction set (src/speech/fbank.cpp compiles
  // one with AVX2) vectorizes it for that set; the operations are elementwise, so every set gives the
  // same bits.
  [[gnu::always_inline]] inline void PowerSpectrum(const double* x, double* power) {
    const std::int32_t m = m_;
    if (m == 1) {  // n = 2
      power[0] = (x[0] + x[1]) * (x[0] + x[1]);
      power[1] = (x[0] - x[1]) * (x[0] - x[1]);
      return;
    }
    // Four work arrays of WorkStride() doubles, each on a 64-byte boundary, so that the passes and the
    // split's forward loads are aligned vector loads: a load that straddles two vector stores still in
    // the store buffer cannot be forwarded and waits for them (with the split starting at k = 1 this
    // stall took 30% of the time at n = 512, per perf). Aligned here, not in the constructor, so that
    // copies of the object stay valid.
    double* ar = work_.data();
    while (reinterpret_cast<std::uintptr_t>(ar) % 64 != 0) ++ar;
    double *ai = ar + WorkStride(), *br = ai + WorkStride(), *bi = br + WorkStride();
    double *xr = ar, *xi = ai, *yr = br, *yi = bi;
    const double* tw = tw_.data();
    std::int32_t len = m, s = 1;
    if (m >= 4) {  // the first radix-4 pass reads z_j = x_{2j} + i·x_{2j+1} straight from the frame
      FirstRadix4Pass(m / 4, tw, x, xr, xi);
      tw += 6 * (m / 4);
      len = m / 4;
      s = 4;
    } else {  // m = 2
      xr[0] = x[0];
      xi[0] = x[1];
      xr[1] = x[2];
      xi[1] = x[3];
    }
    for (; len >= 4; len /= 4, s *= 4) {
      Radix4Pass(len / 4, s, tw, xr, xi, yr, yi);
      tw += 6 * (len / 4);
      std::swap(xr, yr);
      std::swap(xi, yi);
    }
    if (len == 2) {
      // Scalar math: the last radix-2 pass, y_q = x_q + x_{q+s}, y_{q+s} = x_q − x_{q+s}.
#pragma GCC ivdep
      for (std::int32_t q = 0; q < s; ++q) {
        const double a_r = xr[q], a_i = xi[q], b_r = xr[q + s], b_i = xi[q + s];
        yr[q] = a_r + b_r;
        yi[q] = a_i + b_i;
        yr[q + s] = a_r - b_r;
        yi[q + s] = a_i - b_i;
      }
      std::swap(xr, yr);
      std::swap(xi, yi);
    }
    // xr/xi now hold Z = DFT_m(z) in natural order. Real-input split: with A = Z_k, B = conj(Z_{m−k}),
    // 2·X_k = (A + B) + W^k·(A − B)/i, and |X_k|² = |2·X_k|²/4 (the factors 2 and 1/4 are exact, so
    // this gives the bits of halving first, short of overflow or subnormals). The loop runs from k = 0
    // (aligned loads; Z_m = Z_0 is stored after the end for its B) and power[0] is overwritten with
    // the exact k = 0 formula after it.
    xr[m] = xr[0];
    xi[m] = xi[0];
    const double* wr = post_r_.data();
    const double* wi = post_i_.data();
    // Scalar math: power_k = |X_k|², k = 0..m−1, from Z_k and Z_{m−k}.
    for (std::int32_t k = 0; k < m; ++k) {
      const double a_r = xr[k], a_i = xi[k], c_r = xr[m - k], c_i = xi[m - k];  // B = c_r − i·c_i
      const double e_r = a_r + c_r, e_i = a_i - c_i;                             // A + B
      const double o_r = a_i + c_i, o_i = c_r - a_r;                             // (A − B)/i
      const double re = e_r + (wr[k] * o_r - wi[k] * o_i);
      const double im = e_i + (wr[k] * o_i + wi[k] * o_r);
      power[k] = 0.25 * (re * re + im * im);
    }
    power[0] = (xr[0] + xi[0]) * (xr[0] + xi[0]);
    power[m] = (xr[0] - xi[0]) * (xr[0] - xi[0]);
  }

 private:
  // The first radix-4 pass (s = 1) of Radix4Pass below, with z_j = x_{2j} + i·x_{2j+1} read from the frame
  // x: one butterfly per p, vectorized over p (outputs interleaved by 4), into yr/yi.
  [[gnu::always_inline]] static inline void FirstRadix4Pass(std::int32_t q, const double* tw, const double* x,
                                                            double* yr, double* yi) {
    const double *w1r = tw, *w2r = tw + q, *w3r = tw + 2 * q;
    const double *w1i = tw + 3 * q, *w2i = tw + 4 * q, *w3i = tw + 5 * q;
    const std::size_t q2 = 2 * static_cast<std::size_t>(q);
    // Scalar math: the butterfly of Radix4Pass with r = 0, s = 1, a = z_p, b = z_{p+q}, c = z_{p+2q},
    // d = z_{p+3q}.
#pragma GCC ivdep
    for (std::size_t p = 0; p < static_cast<std::size_t>(q); ++p) {
      const double* a = x + 2 * p;
      Butterfly<true>(a[0], a[1], a[q2], a[q2 + 1], a[2 * q2], a[2 * q2 + 1], a[3 * q2], a[3 * q2 + 1], w1r[p],
                      w1i[p], w2r[p], w2i[p], w3r[p], w3i[p], yr[4 * p], yi[4 * p], yr[4 * p + 1], yi[4 * p + 1],
                      yr[4 * p + 2], yi[4 * p + 2], yr[4 * p + 3], yi[4 * p + 3]);
    }
  }

  // One radix-4 Stockham pass over sub-transforms of length 4q with stride s: for p < q, r < s,
  // a, b, c, d = x[r + s·(p + {0, q, 2q, 3q})] →
  //   y[r + s·4p] = (a + c) + (b + d),          y[r + s·(4p + 1)] = w^p ·((a − c) − i(b − d)),
  //   y[r + s·(4p + 2)] = w^2p·((a + c) − (b + d)), y[r + s·(4p + 3)] = w^3p·((a − c) + i(b − d)).
  [[gnu::always_inline]] static inline void Radix4Pass(std::int32_t q, std::int32_t s, const double* tw,
                                                       const double* xr, const double* xi, double* yr,
                                                       double* yi) {
    const double *w1r = tw, *w2r = tw + q, *w3r = tw + 2 * q;
    const double *w1i = tw + 3 * q, *w2i = tw + 4 * q, *w3i = tw + 5 * q;
    const std::size_t sq = static_cast<std::size_t>(s) * static_cast<std::size_t>(q);
    const std::size_t ss = static_cast<std::size_t>(s);
    {
      // p = 0: w^0 = 1 (cos 0 = 1, sin −0 = −0 exactly), so the products by the twiddles are left out;
      // they would give the same values up to the sign of zeros, which |X|² squares away. In the last
      // radix-4 pass (q = 1) this is every butterfly.
      double *y1r = yr + ss, *y1i = yi + ss, *y2r = y1r + ss, *y2i = y1i + ss, *y3r = y2r + ss, *y3i = y2i + ss;
      // Scalar math: one radix-4 butterfly without twiddles per r (contiguous in r).
#pragma GCC ivdep
      for (std::size_t r = 0; r < ss; ++r) {
        Butterfly<false>(xr[r], xi[r], xr[r + sq], xi[r + sq], xr[r + 2 * sq], xi[r + 2 * sq], xr[r + 3 * sq],
                         xi[r + 3 * sq], 1, 0, 1, 0, 1, 0, yr[r], yi[r], y1r[r], y1i[r], y2r[r], y2i[r], y3r[r],
                         y3i[r]);
      }
    }
    for (std::size_t p = 1; p < static_cast<std::size_t>(q); ++p) {
      const double c1r = w1r[p], c1i = w1i[p], c2r = w2r[p], c2i = w2i[p], c3r = w3r[p], c3i = w3i[p];
      const double *ar = xr + ss * p, *ai = xi + ss * p;
      const double *br = ar + sq, *bi = ai + sq, *cr = br + sq, *ci = bi + sq, *dr = cr + sq, *di = ci + sq;
      double *y0r = yr + 4 * ss * p, *y0i = yi + 4 * ss * p;
      double *y1r = y0r + ss, *y1i = y0i + ss, *y2r = y1r + ss, *y2i = y1i + ss, *y3r = y2r + ss,
             *y3i = y2i + ss;
      // Scalar math: one radix-4 butterfly per r (independent across r; contiguous in r).
#pragma GCC ivdep
      for (std::size_t r = 0; r < ss; ++r) {
        Butterfly<true>(ar[r], ai[r], br[r], bi[r], cr[r], ci[r], dr[r], di[r], c1r, c1i, c2r, c2i, c3r, c3i,
                        y0r[r], y0i[r], y1r[r], y1i[r], y2r[r], y2i[r], y3r[r], y3i[r]);
      }
    }
  }

  // (a, b, c, d) → (a + c) + (b + d), w1·((a − c) − i(b − d)), w2·((a + c) − (b + d)), w3·((a − c) + i(b − d));
  // without the products by w1, w2, w3 when Twiddled is false (all three are 1).
  template <bool Twiddled>
  [[gnu::always_inline]] static inline void Butterfly(double a_r, double a_i, double b_r, double b_i, double c_r,
                                                      double c_i, double d_r, double d_i, double c1r,
                                                      double c1i, double c2r, double c2i, double c3r,
                                                      double c3i, double& o0r, double& o0i, double& o1r,
                                                      double& o1i, double& o2r, double& o2i, double& o3r,
                                                      double& o3i) {
    const double apc_r = a_r + c_r, apc_i = a_i + c_i;
    const double amc_r = a_r - c_r, amc_i = a_i - c_i;
    const double bpd_r = b_r + d_r, bpd_i = b_i + d_i;
    const double bmd_r = b_r - d_r, bmd_i = b_i - d_i;
    const double t1_r = amc_r + bmd_i, t1_i = amc_i - bmd_r;  // (a − c) − i(b − d)
    const double t2_r = apc_r - bpd_r, t2_i = apc_i - bpd_i;
    const double t3_r = amc_r - bmd_i, t3_i = amc_i + bmd_r;  // (a − c) + i(b − d)
    o0r = apc_r + bpd_r;
    o0i = apc_i + bpd_i;
    if constexpr (!Twiddled) {
      o1r = t1_r;
      o1i = t1_i;
      o2r = t2_r;
      o2i = t2_i;
      o3r = t3_r;
      o3i = t3_i;
      return;
    }
    o1r = c1r * t1_r - c1i * t1_i;
    o1i = c1r * t1_i + c1i * t1_r;
    o2r = c2r * t2_r - c2i * t2_i;
    o2i = c2r * t2_i + c2i * t2_r;
    o3r = c3r * t3_r - c3i * t3_i;
    o3i = c3r * t3_i + c3i * t3_r;
  }

  std::int32_t n_, m_;
  std::vector<double> tw_, post_r_, post_i_;
  // m + 1 values (the split reads Z_m = Z_0), rounded up to a multiple of 8 doubles = 64 bytes.
  std::size_t WorkStride() const { return (static_cast<std::size_t>(m_) + 1 + 7) / 8 * 8; }

  std::vector<double> work_;
};

}  // namespace normlab::speech::detail
