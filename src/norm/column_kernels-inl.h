// Column kernels, compiled once per target: include with NL_TARGET defined to the target's name.
// See column_kernels.h for the contract. No include guard on purpose.
//
// The blocks of 8 columns use GCC vector extensions (v8d: 8 doubles). Their arithmetic is defined
// lane by lane, so a target that splits a v8d into narrower registers (SSE2, AVX2) performs the same
// IEEE operations on every lane as AVX-512 does; with -ffp-contract=off no target fuses a multiply-add.
// The columns left over after the blocks (w mod 8) run the same formulas one column at a time.
#ifndef NL_TARGET
#error "define NL_TARGET before including column_kernels-inl.h"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "norm/column_kernels.h"

namespace normlab::kernels::NL_TARGET {
namespace column_impl {  // apart from the row kernels' names (sum, forward, ...) of the same target
namespace {

typedef double v8d __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));

// Macros rather than functions: a function taking or returning v8d would change the ABI per target.
// float ↔ double conversions are exact (load) or round to nearest like static_cast<float> (store). On
// AVX-512 they are spelled with intrinsics: GCC 12 splits __builtin_convertvector into three
// instructions there.
#if defined(__AVX512F__)
#define NL_LOAD8F(dst, p) (dst) = (v8d)_mm512_mask_cvtps_pd(_mm512_setzero_pd(), 0xFF, _mm256_loadu_ps(p))
#define NL_STORE8F(p, v) _mm256_storeu_ps((p), _mm512_mask_cvtpd_ps(_mm256_setzero_ps(), 0xFF, (__m512d)(v)))
#else
#define NL_LOAD8F(dst, p)                     \
  do {                                        \
    v8f f_;                                   \
    std::memcpy(&f_, (p), sizeof f_);         \
    (dst) = __builtin_convertvector(f_, v8d); \
  } while (0)
#define NL_STORE8F(p, v)                              \
  do {                                                \
    const v8f f_ = __builtin_convertvector((v), v8f); \
    std::memcpy((p), &f_, sizeof f_);                 \
  } while (0)
#endif
#define NL_LOAD8D(dst, p) std::memcpy(&(dst), (p), sizeof(v8d))

constexpr int kMaxBlocks = static_cast<int>(kColumnTile / 8);

template <int NB>
void stats_blocks(double* mean, double* rstd, const float* x, const Index* xoff, Index n, Index w, double eps,
                  bool center) {
  constexpr Index c0 = 8 * NB;
  constexpr int nb = NB > 0 ? NB : 1;
  const double nn = static_cast<double>(n);
  v8d acc[nb], mu[nb];
  double tail[8] = {};
  for (int b = 0; b < NB; ++b) acc[b] = v8d{};
  if (center) {
    // Scalar math: s[j] += x[xoff[r] + j], r = 0, 1, ..., n − 1; mean[j] = s[j] / n
    for (Index r = 0; r < n; ++r) {
      const float* p = x + xoff[r];
      for (int b = 0; b < NB; ++b) {
        v8d v;
        NL_LOAD8F(v, p + 8 * b);
        acc[b] += v;
      }
      for (Index j = c0; j < w; ++j) tail[j - c0] += static_cast<double>(p[j]);
    }
    for (int b = 0; b < NB; ++b) mu[b] = acc[b] / nn;
    for (Index j = c0; j < w; ++j) mean[j] = tail[j - c0] / nn;
  } else {
    for (int b = 0; b < NB; ++b) mu[b] = v8d{};
    for (Index j = c0; j < w; ++j) mean[j] = 0.0;
  }
  if (NB > 0) std::memcpy(mean, mu, sizeof(v8d) * NB);
  for (int b = 0; b < NB; ++b) acc[b] = v8d{};
  for (int j = 0; j < 8; ++j) tail[j] = 0.0;
  // Scalar math: d = x[xoff[r] + j] − mean[j]; s[j] += d·d, r = 0, 1, ..., n − 1
  for (Index r = 0; r < n; ++r) {
    const float* p = x + xoff[r];
    for (int b = 0; b < NB; ++b) {
      v8d v;
      NL_LOAD8F(v, p + 8 * b);
      const v8d d = v - mu[b];
      acc[b] += d * d;
    }
    for (Index j = c0; j < w; ++j) {
      const double d = static_cast<double>(p[j]) - mean[j];
      tail[j - c0] += d * d;
    }
  }
  // Scalar math: rstd[j] = 1/√(s[j]/n + eps) (sqrt and division are correctly rounded everywhere)
  for (int b = 0; b < NB; ++b) {
    const v8d v = acc[b] / nn + eps;
#if defined(__AVX512F__)
    const v8d r = 1.0 / (v8d)_mm512_mask_sqrt_pd(_mm512_setzero_pd(), 0xFF, (__m512d)v);
    std::memcpy(rstd + 8 * b, &r, sizeof r);
#else
    double l[8];
    std::memcpy(l, &v, sizeof l);
    for (int k = 0; k < 8; ++k) rstd[8 * b + k] = 1.0 / __builtin_sqrt(l[k]);
#endif
  }
  for (Index j = c0; j < w; ++j) rstd[j] = 1.0 / __builtin_sqrt(tail[j - c0] / nn + eps);
}

// Fixed tree over the 8 lanes of a block sum: (0+4)+(2+6) ... as documented in column_kernels.h.
inline double lane_tree8(double* l) {
  for (int k = 4; k >= 1; k /= 2)
    for (int i = 0; i < k; ++i) l[i] += l[i + k];
  return l[0];
}

template <int NB>
void backward_sums_blocks(double* sg, double* sgx, double* dw, double* db, const float* dy,
                          const Index* dyoff, const float* x, const Index* xoff, Index n, Index w,
                          const double* mean, const double* rstd, const float* wt) {
  constexpr Index c0 = 8 * NB;
  v8d ag[NB > 0 ? NB : 1], agx[NB > 0 ? NB : 1], mu[NB > 0 ? NB : 1], rs[NB > 0 ? NB : 1];
  double tg[8] = {}, tgx[8] = {};
  for (int b = 0; b < NB; ++b) {
    ag[b] = v8d{};
    agx[b] = v8d{};
    NL_LOAD8D(mu[b], mean + 8 * b);
    NL_LOAD8D(rs[b], rstd + 8 * b);
  }
  const bool params = dw || db;
  // Scalar math: x̂ = (x − mean[j])·rstd[j]; g = dy·wt[r]; sg[j] += g; sgx[j] += g·x̂;
  //              dw[r] += Σ_j dy·x̂; db[r] += Σ_j dy (order over j: see column_kernels.h)
  for (Index r = 0; r < n; ++r) {
    const float* px = x + xoff[r];
    const float* pd = dy + dyoff[r];
    const double wr = wt ? static_cast<double>(wt[r]) : 1.0;
    v8d pw = v8d{}, pb = v8d{};
    for (int b = 0; b < NB; ++b) {
      v8d xv, dv;
      NL_LOAD8F(xv, px + 8 * b);
      NL_LOAD8F(dv, pd + 8 * b);
      const v8d xh = (xv - mu[b]) * rs[b];
      const v8d g = wt ? dv * wr : dv;
      ag[b] += g;
      agx[b] += g * xh;
      if (params) {
        pw += dv * xh;
        pb += dv;
      }
    }
    double rw = 0, rb = 0;
    if (params && NB > 0) {
      double l[8];
      std::memcpy(l, &pw, sizeof l);
      rw = lane_tree8(l);
      std::memcpy(l, &pb, sizeof l);
      rb = lane_tree8(l);
    }
    for (Index j = c0; j < w; ++j) {
      const double d = static_cast<double>(pd[j]);
      const double xh = (static_cast<double>(px[j]) - mean[j]) * rstd[j];
      const double g = wt ? d * wr : d;
      tg[j - c0] += g;
      tgx[j - c0] += g * xh;
      rw += d * xh;
      rb += d;
    }
    if (dw) dw[r] += rw;
    if (db) db[r] += rb;
  }
  if (NB > 0) {
    std::memcpy(sg, ag, sizeof(v8d) * NB);
    std::memcpy(sgx, agx, sizeof(v8d) * NB);
  }
  for (Index j = c0; j < w; ++j) {
    sg[j] = tg[j - c0];
    sgx[j] = tgx[j - c0];
  }
}

// Calls fn<NB>(...) with NB = ⌊w/8⌋ as a constant (w ≤ kColumnTile).
#define NL_DISPATCH_BLOCKS(fn, ...) \
  switch (w / 8) {                  \
    case 0:                         \
      return fn<0>(__VA_ARGS__);    \
    case 1:                         \
      return fn<1>(__VA_ARGS__);    \
    case 2:                         \
      return fn<2>(__VA_ARGS__);    \
    case 3:                         \
      return fn<3>(__VA_ARGS__);    \
    case 4:                         \
      return fn<4>(__VA_ARGS__);    \
    case 5:                         \
      return fn<5>(__VA_ARGS__);    \
    case 6:                         \
      return fn<6>(__VA_ARGS__);    \
    case 7:                         \
      return fn<7>(__VA_ARGS__);    \
    default:                        \
      return fn<8>(__VA_ARGS__);    \
  }
static_assert(kMaxBlocks == 8, "NL_DISPATCH_BLOCKS covers 0..8 blocks");

void stats(double* mean, double* rstd, const float* x, const Index* xoff, Index n, Index w, double eps,
           bool center) {
  NL_DISPATCH_BLOCKS(stats_blocks, mean, rstd, x, xoff, n, w, eps, center)
}

void backward_sums(double* sg, double* sgx, double* dw, double* db, const float* dy, const Index* dyoff,
                   const float* x, const Index* xoff, Index n, Index w, const double* mean,
                   const double* rstd, const float* wt) {
  NL_DISPATCH_BLOCKS(backward_sums_blocks, sg, sgx, dw, db, dy, dyoff, x, xoff, n, w, mean, rstd, wt)
}

template <int NB>
void forward_blocks(float* y, const Index* yoff, const float* x, const Index* xoff, Index n, Index w,
                    const double* mean, const double* rstd, const float* wt, const float* b) {
  constexpr Index c0 = 8 * NB;
  constexpr int nb = NB > 0 ? NB : 1;
  v8d mu[nb], rs[nb];
  for (int k = 0; k < NB; ++k) {
    NL_LOAD8D(mu[k], mean + 8 * k);
    NL_LOAD8D(rs[k], rstd + 8 * k);
  }
  // Scalar math: y[yoff[r] + j] = float((x[xoff[r] + j] − mean[j])·rstd[j]·wt[r] + b[r])
  for (Index r = 0; r < n; ++r) {
    const float* px = x + xoff[r];
    float* py = y + yoff[r];
    const double wr = wt ? static_cast<double>(wt[r]) : 1.0, br = b ? static_cast<double>(b[r]) : 0.0;
    for (int k = 0; k < NB; ++k) {
      v8d xv;
      NL_LOAD8F(xv, px + 8 * k);
      v8d v = (xv - mu[k]) * rs[k];
      if (wt) v = v * wr;
      if (b) v = v + br;
      NL_STORE8F(py + 8 * k, v);
    }
    for (Index j = c0; j < w; ++j) {
      double v = (static_cast<double>(px[j]) - mean[j]) * rstd[j];
      if (wt) v = v * wr;
      if (b) v = v + br;
      py[j] = static_cast<float>(v);
    }
  }
}

void forward(float* y, const Index* yoff, const float* x, const Index* xoff, Index n, Index w,
             const double* mean, const double* rstd, const float* wt, const float* b) {
  NL_DISPATCH_BLOCKS(forward_blocks, y, yoff, x, xoff, n, w, mean, rstd, wt, b)
}

template <int NB>
void backward_dx_blocks(float* dx, const Index* dxoff, const float* dy, const Index* dyoff, const float* x,
                        const Index* xoff, Index n, Index w, const double* mean, const double* rstd,
                        const float* wt, const double* mg, const double* mgx) {
  constexpr Index c0 = 8 * NB;
  constexpr int nb = NB > 0 ? NB : 1;
  v8d mu[nb], rs[nb];
  for (int k = 0; k < NB; ++k) {
    NL_LOAD8D(mu[k], mean + 8 * k);
    NL_LOAD8D(rs[k], rstd + 8 * k);
  }
  // Scalar math: dx = float(rstd[j]·(dy·wt[r] − mg[j] − x̂·mgx[j])), x̂ = (x − mean[j])·rstd[j]
  for (Index r = 0; r < n; ++r) {
    const float* px = x + xoff[r];
    const float* pd = dy + dyoff[r];
    float* po = dx + dxoff[r];
    const double wr = wt ? static_cast<double>(wt[r]) : 1.0;
    for (int k = 0; k < NB; ++k) {
      v8d xv, dv, a, ax;
      NL_LOAD8F(xv, px + 8 * k);
      NL_LOAD8F(dv, pd + 8 * k);
      NL_LOAD8D(a, mg + 8 * k);
      NL_LOAD8D(ax, mgx + 8 * k);
      const v8d xh = (xv - mu[k]) * rs[k];
      const v8d g = wt ? dv * wr : dv;
      NL_STORE8F(po + 8 * k, rs[k] * (g - a - xh * ax));
    }
    for (Index j = c0; j < w; ++j) {
      const double xh = (static_cast<double>(px[j]) - mean[j]) * rstd[j];
      const double d = static_cast<double>(pd[j]);
      const double g = wt ? d * wr : d;
      po[j] = static_cast<float>(rstd[j] * (g - mg[j] - xh * mgx[j]));
    }
  }
}

void backward_dx(float* dx, const Index* dxoff, const float* dy, const Index* dyoff, const float* x,
                 const Index* xoff, Index n, Index w, const double* mean, const double* rstd, const float* wt,
                 const double* mg, const double* mgx) {
  NL_DISPATCH_BLOCKS(backward_dx_blocks, dx, dxoff, dy, dyoff, x, xoff, n, w, mean, rstd, wt, mg, mgx)
}

// Fixed tree over 16 lanes held as two blocks of 8 (lanes 0-7 and 8-15).
inline double lane_tree16(const double* lo, const double* hi) {
  double l[16];
  for (int i = 0; i < 8; ++i) {
    l[i] = lo[i];
    l[i + 8] = hi[i];
  }
  for (int k = 8; k >= 1; k /= 2)
    for (int i = 0; i < k; ++i) l[i] += l[i + k];
  return l[0];
}

void segment_sums(double* s, const float* x, const float* dy, Index n, double c) {
  v8d a0 = v8d{}, a1 = v8d{}, q0 = v8d{}, q1 = v8d{}, g0 = v8d{}, g1 = v8d{}, h0 = v8d{}, h1 = v8d{};
  Index i = 0;
  if (dy) {
    // Scalar math: d = x[i] − c; Σd += d; Σd² += d·d; Σdy += dy[i]; Σdy·d += dy[i]·d (lane i mod 16)
    for (; i + 16 <= n; i += 16) {
      v8d x0, x1, y0, y1;
      NL_LOAD8F(x0, x + i);
      NL_LOAD8F(x1, x + i + 8);
      NL_LOAD8F(y0, dy + i);
      NL_LOAD8F(y1, dy + i + 8);
      const v8d d0 = x0 - c, d1 = x1 - c;
      a0 += d0;
      a1 += d1;
      q0 += d0 * d0;
      q1 += d1 * d1;
      g0 += y0;
      g1 += y1;
      h0 += y0 * d0;
      h1 += y1 * d1;
    }
  } else {
    // Scalar math: d = x[i] − c; Σd += d; Σd² += d·d (lane i mod 16)
    for (; i + 16 <= n; i += 16) {
      v8d x0, x1;
      NL_LOAD8F(x0, x + i);
      NL_LOAD8F(x1, x + i + 8);
      const v8d d0 = x0 - c, d1 = x1 - c;
      a0 += d0;
      a1 += d1;
      q0 += d0 * d0;
      q1 += d1 * d1;
    }
  }
  double lo[8], hi[8];
  auto tree = [&](const v8d& u, const v8d& v) {
    std::memcpy(lo, &u, sizeof lo);
    std::memcpy(hi, &v, sizeof hi);
    return lane_tree16(lo, hi);
  };
  double sd = tree(a0, a1), sq = tree(q0, q1), sg = dy ? tree(g0, g1) : 0.0, sh = dy ? tree(h0, h1) : 0.0;
  for (; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - c;
    sd += d;
    sq += d * d;
    if (dy) {
      const double g = static_cast<double>(dy[i]);
      sg += g;
      sh += g * d;
    }
  }
  s[0] = sd;
  s[1] = sq;
  if (dy) {
    s[2] = sg;
    s[3] = sh;
  }
}

void copy_stream(float* dst, const float* src, Index n) {
  Index i = 0;
  // Scalar math: dst[i] = src[i] (ordinary stores up to the first 64-byte boundary, then non-temporal)
  for (; i < n && (reinterpret_cast<std::uintptr_t>(dst + i) & 63) != 0; ++i) dst[i] = src[i];
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
#elif defined(__AVX__)
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
#else
  for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
#endif
  for (; i < n; ++i) dst[i] = src[i];
}

void store_fence() {
  _mm_sfence();
}

#undef NL_DISPATCH_BLOCKS
#undef NL_LOAD8F
#undef NL_LOAD8D
#undef NL_STORE8F

}  // namespace
}  // namespace column_impl

extern const ColumnKernels kColumnTable;
const ColumnKernels kColumnTable = {
    column_impl::stats,        column_impl::forward,     column_impl::backward_sums, column_impl::backward_dx,
    column_impl::segment_sums, column_impl::copy_stream, column_impl::store_fence};

}  // namespace normlab::kernels::NL_TARGET
