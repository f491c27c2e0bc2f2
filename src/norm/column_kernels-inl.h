// Column kernels, compiled once per target: include with NL_TARGET defined to the target's name.
// See column_kernels.h for the contract. No include guard on purpose.
//
// The tile kernels are written against simd/vec.h (VF: 16 floats, VD: 8 doubles, the same lane-wise
// IEEE operations on every target), one VF per row holding 16 neighbouring columns. The per-column
// constants (mean, rstd, the backward's means) are computed 8 columns at a time with GCC vector
// extensions (v8d: 8 doubles), whose arithmetic is also defined lane by lane; with -ffp-contract=off no
// target fuses a multiply-add. segment_sums (channel-norm engine) uses v8d as well. On AVX2 (16 registers
// of 8 floats) Σx and the second pass take a block's two 8-column halves one after the other, with the
// same operations on every column's lane: a whole block's double accumulators would not fit in registers.
#ifndef NL_TARGET
#error "define NL_TARGET before including column_kernels-inl.h"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "norm/column_kernels.h"
#include "norm/mean_split.h"
#include "simd/vec.h"

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
#define NL_SQRT8D(dst, v) (dst) = (v8d)_mm512_mask_sqrt_pd(_mm512_setzero_pd(), 0xFF, (__m512d)(v))
#define NL_MAX0_8D(v) (v) = (v) < 0.0 ? v8d{} : (v)
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
#if defined(__AVX2__)
// The square root and the clamp at 0 of v8d as two 4-double instructions each: GCC 12 takes the lanes one
// at a time otherwise (on AVX-512 the generic form gives one instruction).
#define NL_SQRT8D(dst, v)               \
  do {                                  \
    __m256d h_[2];                      \
    std::memcpy(h_, &(v), sizeof h_);   \
    h_[0] = _mm256_sqrt_pd(h_[0]);      \
    h_[1] = _mm256_sqrt_pd(h_[1]);      \
    std::memcpy(&(dst), h_, sizeof h_); \
  } while (0)
#define NL_MAX0_8D(v)                                  \
  do {                                                 \
    __m256d h_[2];                                     \
    std::memcpy(h_, &(v), sizeof h_);                  \
    h_[0] = _mm256_max_pd(_mm256_setzero_pd(), h_[0]); \
    h_[1] = _mm256_max_pd(_mm256_setzero_pd(), h_[1]); \
    std::memcpy(&(v), h_, sizeof h_);                  \
  } while (0)
#else
#define NL_SQRT8D(dst, v)                                           \
  do {                                                              \
    double l_[8];                                                   \
    std::memcpy(l_, &(v), sizeof l_);                               \
    for (int k_ = 0; k_ < 8; ++k_) l_[k_] = __builtin_sqrt(l_[k_]); \
    std::memcpy(&(dst), l_, sizeof l_);                             \
  } while (0)
#define NL_MAX0_8D(v) (v) = (v) < 0.0 ? v8d{} : (v)
#endif
#endif
#define NL_LOAD8D(dst, p) std::memcpy(&(dst), (p), sizeof(v8d))
#define NL_STORE8D(p, v) std::memcpy((p), &(v), sizeof(v8d))

// ---- tile kernels ------------------------------------------------------------------------------------
//
// A tile is processed in blocks of 16 columns (the last one may have k < 16 valid columns: masked
// loads read zeros there, and nothing of those lanes is stored or summed). Per block: Σx, the second
// pass, the per-column constants, then the output pass, all over the block's n rows (one cache line or
// two per row, still in L1 from the first pass; a tile whose rows crowd a few L1 sets reads a copy of the
// block instead, see "crowded tiles").

using namespace vec;  // NOLINT: the vector layer of this target

struct VD2 {
  VD lo, hi;  // columns 0..7, 8..15 of a block
};
inline VD2 add2(VD2 a, VD2 b) {
  return {add(a.lo, b.lo), add(a.hi, b.hi)};
}
inline VD2 zero2() {
  return {zerod(), zerod()};
}
inline VD2 acc2(VD2 a, VF v) {
  return {add(a.lo, cvt_lo(v)), add(a.hi, cvt_hi(v))};
}
// The tree of vec::hsum applied column-wise to the partials part(0..7):
// ((S0 + S4) + (S2 + S6)) + ((S1 + S5) + (S3 + S7)), the partials formed in that order.
template <typename Part>
inline VD2 tree8(Part&& part) {
  const VD2 s0 = part(0), s4 = part(4);
  const VD2 u04 = add2(s0, s4);
  const VD2 s2 = part(2), s6 = part(6);
  const VD2 a = add2(u04, add2(s2, s6));
  const VD2 s1 = part(1), s5 = part(5);
  const VD2 u15 = add2(s1, s5);
  const VD2 s3 = part(3), s7 = part(7);
  return add2(a, add2(u15, add2(s3, s7)));
}

template <bool Full>
inline VF ld(const float* p, int k) {
  if constexpr (Full) return load(p);
  return load_n(p, k);
}
// The store of one row of a block: its first k columns (a partial block), or all 16, non-temporal when
// `streaming` and the row is 64-byte aligned.
template <bool Full>
inline void put(float* p, VF v, int k, bool streaming) {
  if constexpr (!Full)
    store_n(p, v, k);
  else if (streaming && aligned64(p))
    stream(p, v);
  else
    store(p, v);
}

// Per-column values of one block of 16 columns.
struct Block {
  alignas(64) double sum[16], sq[16], sg[16], sge[16], mean[16], rstd[16];
  alignas(64) float mh[16], ml[16], r[16], c0[16], c2[16];
};

// a + the 16 floats at p (the first k of them) converted to double. A full block converts straight from
// memory, 8 floats at a time: one instruction less per row than a 16-float load split in two.
template <bool Full>
inline VD2 acc2_at(VD2 a, const float* p, int k) {
  if constexpr (Full) return {add(a.lo, load_cvt(p)), add(a.hi, load_cvt(p + 8))};
  return acc2(a, load_n(p, k));
}

// Prefetches the cache line of p, the first of a block's 16 floats in one row, into the L2 cache (locality
// hint 1). Used kColumnPrefetch blocks ahead for the inputs and for the output too: a read prefetch brings
// an output line close before the store needs it for ownership (the row path's contiguous stores get that
// from the hardware prefetcher; a tile's n short runs far apart do not). The blocks of a row follow each
// other 16 floats (one line) apart, so the first float of each falls in each line of the row once: the
// second line of a misaligned block is the first of the next block's. Prefetching both lines of every
// block (until the sixteenth session) issued twice the prefetches; with one, the [B,F,T] forward and
// backward at [32, 80, 1000] took 0.95-0.99 of the time (paired medians of two runs; same bits).
inline void prefetch16(const float* p) {
  __builtin_prefetch(p, 0, 1);
}

// The prefetches a statistics pass issues for the rows it visits: prefetch16 of row i at p + off[i] (none
// when p is null). The backward spreads its look-ahead over its passes this way (see backward_block).
struct RowAhead {
  const float* p = nullptr;
  const Index* off = nullptr;
  NL_FORCE_INLINE void row(Index i) const {
    if (p) prefetch16(p + off[i]);
  }
};

#if !NL_VEC_AVX2
// S_l = (P_l + P_{8+l}) + (P_{16+l} + P_{24+l}) of the block at x: the partials of rows l + 8q (mod 32).
template <bool Full>
inline VD2 sum_part(const float* x, const Index* off, Index n, int k, int l, RowAhead pf = {}) {
  VD2 a[4] = {zero2(), zero2(), zero2(), zero2()};
  Index i0 = 0;
  // Scalar math: P[q][j] += double(x[off[i0 + 8q + l] + j]), i0 = 0, 32, 64, ...
  for (; i0 + 32 <= n; i0 += 32)
    for (int q = 0; q < 4; ++q) {
      pf.row(i0 + 8 * q + l);
      a[q] = acc2_at<Full>(a[q], x + off[i0 + 8 * q + l], k);
    }
  for (int q = 0; q < 4; ++q)
    if (i0 + 8 * q + l < n) {
      pf.row(i0 + 8 * q + l);
      a[q] = acc2_at<Full>(a[q], x + off[i0 + 8 * q + l], k);
    }
  return add2(add2(a[0], a[1]), add2(a[2], a[3]));
}
#endif

// Σx per column in the order of the row kernels' row_sum (see column_kernels.h).
template <bool Full>
inline void block_sum(Block& bk, const float* x, const Index* off, Index n, int k, RowAhead pf = {}) {
#if NL_VEC_AVX2
  // AVX2: the two halves of the block (columns 0..7, 8..15) one after the other, each with its own four
  // accumulators: the same sums of the same terms (lanes are columns). Both halves at once would hold 16
  // double accumulators in AVX2's 16 registers and spill.
  for (int h = 0; h < 2; ++h) {
    auto term = [&](Index row) NL_FORCE_INLINE {
      if (h == 0) pf.row(row);
      if constexpr (Full) return load_cvt(x + off[row] + 8 * h);
      const VF v = load_n(x + off[row], k);
      return h ? cvt_hi(v) : cvt_lo(v);
    };
    auto part = [&](int l) NL_FORCE_INLINE {
      VD a[4] = {zerod(), zerod(), zerod(), zerod()};
      Index i0 = 0;
      // Scalar math: P[q][j] += double(x[off[i0 + 8q + l] + j]), i0 = 0, 32, 64, ...
      for (; i0 + 32 <= n; i0 += 32)
        for (int q = 0; q < 4; ++q) a[q] = add(a[q], term(i0 + 8 * q + l));
      for (int q = 0; q < 4; ++q)
        if (i0 + 8 * q + l < n) a[q] = add(a[q], term(i0 + 8 * q + l));
      return add(add(a[0], a[1]), add(a[2], a[3]));
    };
    // tree8's tree: ((S0 + S4) + (S2 + S6)) + ((S1 + S5) + (S3 + S7))
    const VD s04 = add(part(0), part(4));
    const VD a = add(s04, add(part(2), part(6)));
    const VD s15 = add(part(1), part(5));
    stored(bk.sum + 8 * h, add(a, add(s15, add(part(3), part(7)))));
  }
#else
  const VD2 s = tree8([&](int l) { return sum_part<Full>(x, off, n, k, l, pf); });
  stored(bk.sum, s.lo);
  stored(bk.sum + 8, s.hi);
#endif
}

// The second pass (see column_kernels.h): Σe² and, with dy, Σg and Σg·e, e = x − m_hi, g = dy·γ_r.
// WithSq = false leaves Σe² out (the backward from saved statistics).
template <bool Center, bool WithDy, bool W, bool Full, bool WithSq = true>
inline void block_second(Block& bk, const float* x, const Index* xoff, const float* dy, const Index* dyoff,
                         const float* wt, Index n, int k, RowAhead pf = {}) {
#if NL_VEC_AVX2
  // AVX2: the two halves of the block (columns 0..7, 8..15) one after the other, as block_sum: the same
  // operations on each column's lane, with half the accumulators live (a whole block's spilled).
  const __m256 zf = _mm256_setzero_ps();
  for (int c = 0; c < 2; ++c) {
    const int kc = k - 8 * c;  // valid columns of this half (≤ 0: none, ≥ 8: all)
    auto ld8 = [&](const float* p) NL_FORCE_INLINE {
      if constexpr (Full) return _mm256_loadu_ps(p + 8 * c);
      return kc <= 0 ? zf : _mm256_maskload_ps(p + 8 * c, lane_mask8(kc));
    };
    const __m256 mhc = _mm256_loadu_ps(bk.mh + 8 * c);
    VD tq[8], tg[8], tp[8];
    for (int l = 0; l < 8; ++l) {
      VD q[2] = {zerod(), zerod()}, g[2] = {zerod(), zerod()}, p[2] = {zerod(), zerod()};
      // Scalar math: as below, on 8 columns
      auto lane = [&](Index i0, int h, bool tail) NL_FORCE_INLINE {
        const int L = l + 8 * h;
        __m256 e[4], gv[4];
        for (int u = 0; u < 4; ++u) {
          const Index i = i0 + 16 * u + L;
          const bool in = !tail || i < n;
          if (c == 0 && in) pf.row(i);
          const __m256 xv = in ? ld8(x + xoff[i]) : zf;
          e[u] = in ? (Center ? _mm256_sub_ps(xv, mhc) : xv) : zf;
          if constexpr (WithDy) {
            const __m256 dv = in ? ld8(dy + dyoff[i]) : zf;
            gv[u] = in ? (W ? _mm256_mul_ps(dv, _mm256_set1_ps(wt[i])) : dv) : zf;
          }
        }
        auto tree4 = [](__m256 a, __m256 b, __m256 c2, __m256 d)
                         NL_FORCE_INLINE { return _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c2, d)); };
        if constexpr (WithSq)
          q[h] = add(q[h], cvt8(tree4(_mm256_mul_ps(e[0], e[0]), _mm256_mul_ps(e[1], e[1]),
                                      _mm256_mul_ps(e[2], e[2]), _mm256_mul_ps(e[3], e[3]))));
        if constexpr (WithDy) {
          g[h] = add(g[h], cvt8(tree4(gv[0], gv[1], gv[2], gv[3])));
          p[h] = add(p[h], cvt8(tree4(_mm256_mul_ps(gv[0], e[0]), _mm256_mul_ps(gv[1], e[1]),
                                      _mm256_mul_ps(gv[2], e[2]), _mm256_mul_ps(gv[3], e[3]))));
        }
      };
      Index i0 = 0;
      for (; i0 + 64 <= n; i0 += 64) {
        lane(i0, 0, false);
        lane(i0, 1, false);
      }
      if (i0 < n) {
        lane(i0, 0, true);
        lane(i0, 1, true);
      }
      tq[l] = add(q[0], q[1]);
      if constexpr (WithDy) {
        tg[l] = add(g[0], g[1]);
        tp[l] = add(p[0], p[1]);
      }
    }
    // tree8's tree: ((T0 + T4) + (T2 + T6)) + ((T1 + T5) + (T3 + T7))
    auto tree = [](const VD* t) NL_FORCE_INLINE {
      return add(add(add(t[0], t[4]), add(t[2], t[6])), add(add(t[1], t[5]), add(t[3], t[7])));
    };
    if constexpr (WithSq) stored(bk.sq + 8 * c, tree(tq));
    if constexpr (WithDy) {
      stored(bk.sg + 8 * c, tree(tg));
      stored(bk.sge + 8 * c, tree(tp));
    }
  }
#else
  const VF mh = load(bk.mh), z = zerof();
  VD2 tq[8], tg[8], tp[8];
  for (int l = 0; l < 8; ++l) {
    VD2 q[2] = {zero2(), zero2()}, g[2] = {zero2(), zero2()}, p[2] = {zero2(), zero2()};
    // Scalar math (lane L = l, l + 8 of each block of 64 rows; rows ≥ n give e = g = 0):
    //   q = (e₀² + e₁²) + (e₂² + e₃²), s = (g₀ + g₁) + (g₂ + g₃), t = (g₀e₀ + g₁e₁) + (g₂e₂ + g₃e₃) in float,
    //   e_u, g_u of row i0 + 16u + L; Q_L += double(q) (likewise s, t)
    auto lane = [&](Index i0, int h, bool tail) {
      const int L = l + 8 * h;
      if constexpr (!WithDy) {
        // The forward's last block of 64 rows: only the m ≤ 4 rows present, whose squares' sums are those
        // of the tree with zeros for the rest (s + 0 = s: the sums of squares are never −0).
        if (tail) {
          const Index left = n - i0 - L;  // rows i0 + L + 16u of this lane, u < 4, while 16u < left
          if (left <= 0) return;          // none: q[h] + 0 = q[h]
          auto sq = [&](int u) NL_FORCE_INLINE {
            const VF xv = ld<Full>(x + xoff[i0 + 16 * u + L], k);
            const VF d = Center ? sub(xv, mh) : xv;
            return mul(d, d);
          };
          if (left <= 16)
            q[h] = acc2(q[h], sq(0));
          else if (left <= 32)
            q[h] = acc2(q[h], add(sq(0), sq(1)));
          else if (left <= 48)
            q[h] = acc2(q[h], add(add(sq(0), sq(1)), sq(2)));
          else
            q[h] = acc2(q[h], add(add(sq(0), sq(1)), add(sq(2), sq(3))));
          return;
        }
      }
      VF e[4], gv[4];
      for (int u = 0; u < 4; ++u) {
        const Index i = i0 + 16 * u + L;
        const bool in = !tail || i < n;
        if (in) pf.row(i);
        const VF xv = in ? ld<Full>(x + xoff[i], k) : z;
        e[u] = in ? (Center ? sub(xv, mh) : xv) : z;
        if constexpr (WithDy) {
          const VF dv = in ? ld<Full>(dy + dyoff[i], k) : z;
          gv[u] = in ? (W ? mul(dv, bcast(wt[i])) : dv) : z;
        }
      }
      if constexpr (WithSq)
        q[h] = acc2(q[h], add(add(mul(e[0], e[0]), mul(e[1], e[1])), add(mul(e[2], e[2]), mul(e[3], e[3]))));
      if constexpr (WithDy) {
        g[h] = acc2(g[h], add(add(gv[0], gv[1]), add(gv[2], gv[3])));
        p[h] =
            acc2(p[h], add(add(mul(gv[0], e[0]), mul(gv[1], e[1])), add(mul(gv[2], e[2]), mul(gv[3], e[3]))));
      }
    };
    Index i0 = 0;
    for (; i0 + 64 <= n; i0 += 64) {
      lane(i0, 0, false);
      lane(i0, 1, false);
    }
    if (i0 < n) {
      lane(i0, 0, true);
      lane(i0, 1, true);
    }
    tq[l] = add2(q[0], q[1]);
    if constexpr (WithDy) {
      tg[l] = add2(g[0], g[1]);
      tp[l] = add2(p[0], p[1]);
    }
  }
  if constexpr (WithSq) {
    const VD2 sq = tree8([&](int l) { return tq[l]; });
    stored(bk.sq, sq.lo);
    stored(bk.sq + 8, sq.hi);
  }
  if constexpr (WithDy) {
    const VD2 sg = tree8([&](int l) { return tg[l]; }), sp = tree8([&](int l) { return tp[l]; });
    stored(bk.sg, sg.lo);
    stored(bk.sg + 8, sg.hi);
    stored(bk.sge, sp.lo);
    stored(bk.sge + 8, sp.hi);
  }
#endif
}

// m_hi, m_lo from Σx (as the row kernels' row_mean).
template <bool Center>
inline void block_mean(Block& bk, Index n) {
  const double nd = static_cast<double>(n);
  for (int h = 0; h < 2; ++h) {
    v8d s, mean;
    NL_LOAD8D(s, bk.sum + 8 * h);
    // Scalar math: mean = Σx/n; m_hi = float(mean); m_lo = float(mean − m_hi)   (0 when !Center)
    mean = Center ? s / nd : v8d{};
    NL_STORE8D(bk.mean + 8 * h, mean);
    NL_STORE8F(bk.mh + 8 * h, mean);
    v8d mh;
    NL_LOAD8F(mh, bk.mh + 8 * h);
    const v8d lo = mean - mh;
    NL_STORE8F(bk.ml + 8 * h, lo);
  }
}

// m_hi, m_lo, rstd and r from saved statistics (as block_mean and block_rstd form them from the same
// double values): columns [0, k) from smean, srstd; the other lanes as for a zero column.
template <bool Center>
inline void block_saved(Block& bk, const double* smean, const double* srstd, int k) {
  for (int j = 0; j < 16; ++j) {
    const double mean = Center && j < k ? smean[j] : 0.0;
    bk.mean[j] = mean;
    const MeanSplit m = split_mean(mean);
    bk.mh[j] = m.hi;
    bk.ml[j] = m.lo;
    bk.rstd[j] = j < k ? srstd[j] : 1.0;
    bk.r[j] = static_cast<float>(bk.rstd[j]);
  }
}

// rstd and r from Σe² (as the row kernels' finish_rstd), or (Saved) the rstd already in bk; with dy,
// c0 and c2 of the backward.
template <bool Center, bool WithDy, bool Saved = false>
inline void block_rstd(Block& bk, Index n, double eps) {
  const double nd = static_cast<double>(n);
  for (int h = 0; h < 2; ++h) {
    v8d ml, rstd;
    NL_LOAD8F(ml, bk.ml + 8 * h);
    if constexpr (Saved) {
      NL_LOAD8D(rstd, bk.rstd + 8 * h);
    } else {
      v8d sq, var, sd;
      NL_LOAD8D(sq, bk.sq + 8 * h);
      // Scalar math: var = max(Σe²/n − m_lo², 0); rstd = 1/√(var + eps); r = float(rstd)
      var = sq / nd - ml * ml;
      NL_MAX0_8D(var);  // (0 > var) ? 0 : var, as std::max(var, 0.0): NaN stays NaN
      const v8d ve = var + eps;
      NL_SQRT8D(sd, ve);
      rstd = 1.0 / sd;
      NL_STORE8D(bk.rstd + 8 * h, rstd);
      NL_STORE8F(bk.r + 8 * h, rstd);
    }
    if constexpr (WithDy) {
      v8d sg, sge;
      NL_LOAD8D(sg, bk.sg + 8 * h);
      NL_LOAD8D(sge, bk.sge + 8 * h);
      // Scalar math: mean_g = Σg/n (0 when !Center); Σg·d = Σg·e − m_lo·Σg; mean_gx̂ = rstd·Σg·d/n;
      //              c0 = float(mean_g); c2 = float(rstd·mean_gx̂)
      const v8d mean_g = Center ? sg / nd : v8d{};
      const v8d sgd = sge - ml * sg;
      const v8d mean_gxh = rstd * sgd / nd;
      const v8d c2 = rstd * mean_gxh;
      NL_STORE8F(bk.c0 + 8 * h, mean_g);
      NL_STORE8F(bk.c2 + 8 * h, c2);
    }
  }
}

// The block kColumnPrefetch blocks after the one at c0 of a tile of w columns at t (next: the next
// tile, or null); kColumnPrefetchCrowded blocks for a crowded tile (ColumnForward::stage).
inline const float* ahead(const float* t, const float* next, Index c0, Index w, bool crowded) {
  const Index c = c0 + kF * (crowded ? kColumnPrefetchCrowded : kColumnPrefetch);
  return c < w ? t + c : next ? next + (c - w) : nullptr;
}

template <bool Center>
inline VF dev(VF x, VF mh, VF ml) {
  if constexpr (Center) return sub(sub(x, mh), ml);
  return x;
}

// ---- crowded tiles (ColumnForward::stage) ---------------------------------------------------------------
// A tile whose rows crowd a few sets of the L1 data cache loses a block's rows between the passes over
// them, and every pass then reads from L2: rows 1, 2 or 4 KiB apart (T = 256, 512 or 1024 floats) fall
// into 4, 2 or 1 of its 64 sets (8 ways on Zen 3 and Zen 4). The forward took 2.6× the time per element
// at [4, 80, 1024] as at [4, 80, 1000] (docs/PERFORMANCE.md, tenth session). With stage, each block is
// first copied row by row into a contiguous buffer, and the passes read the copy: the same values in the
// same order, so the same bits.
struct StageOffsets {
  Index v[kColumnStageRows];
  constexpr StageOffsets() : v() {
    for (Index i = 0; i < kColumnStageRows; ++i) v[i] = kF * i;
  }
};
inline constexpr StageOffsets kStageOff{};

// The thread's buffer, for the backward. Not on the stack: from there the staged backward took 1.4-1.9×
// the unstaged time, from this buffer 0.67-0.74× (the forward is the other way round, see forward_staged;
// the cause was not pinned down).
inline float* stage_buffer() {
  alignas(64) static thread_local float buf[kColumnStageRows * kF];
  return buf;
}

// buf[16·i + j] = p[off[i] + j], j < 16 (zeros beyond k in a partial block), i < n.
template <bool Full>
inline void stage(float* buf, const float* p, const Index* off, Index n, int k) {
  // Scalar math: a copy
  for (Index i = 0; i < n; ++i) store(buf + kF * i, ld<Full>(p + off[i], k));
}

// The forward's look-ahead for x with x_ahead_in_sum, issued while Σx of the block at column c0 is formed:
// the rows of the tile's own x (xoff, also when the block is staged) kColumnPrefetch blocks ahead (without
// it, in the output pass with y's, OutputPass). Paired (scripts/ab-rows 99d33e0 col-fwd; docs/PERFORMANCE.md,
// twenty-sixth session): in the Σx pass [32, 80, 1000] took 0.92 of the time and [4, 80, 1024] 0.86, but
// [1, 80, 1000], in L2, 1.04 (its prefetches, L2 hits, then compete with the pass's own loads from L2).
inline RowAhead x_ahead(const ColumnForward& a, Index c0) {
  if (!a.x_ahead_in_sum) return {};
  return RowAhead{ahead(a.x, a.next_x, c0, a.w, a.stage), a.xoff};
}

// The forward's statistics of the block at column c0 (its first k columns) into the caller's arrays.
inline void write_stats(const ColumnForward& a, const Block& bk, Index c0, int k) {
  if (a.mean)
    for (int j = 0; j < k; ++j) a.mean[c0 + j] = bk.mh[j];
  if (a.rstd)
    for (int j = 0; j < k; ++j) a.rstd[c0 + j] = bk.r[j];
  if (a.smean)
    for (int j = 0; j < k; ++j) a.smean[c0 + j] = bk.mean[j];
  if (a.srstd)
    for (int j = 0; j < k; ++j) a.srstd[c0 + j] = bk.rstd[j];
}

// The output pass of the block at column c0, rows [i0, i1) at a time. Members rather than the argument
// block's fields: the stores to y could alias those (reloaded every row otherwise).
template <bool Center, bool W, bool B, bool Full>
struct OutputPass {
  const float* x;
  const Index* xoff;   // x's rows (the staged copy's, see stage)
  const Index* pxoff;  // the rows of the tile's own x (the prefetches)
  float* y;
  const Index* yoff;
  const float* wt;
  const float* bt;
  const float* pf;  // x's rows kColumnPrefetch blocks ahead, or null (also with x_ahead_in_sum: x_ahead)
  const float* pfy;
  VF mh, ml, r;
  int k;
  bool st;

  OutputPass(const ColumnForward& a, const Block& bk, Index c0, int k_, const float* x_, const Index* xoff_)
      : x(x_),
        xoff(xoff_),
        pxoff(a.xoff),
        y(a.y + c0),
        yoff(a.yoff),
        wt(a.wt),
        bt(a.b),
        pf(a.x_ahead_in_sum ? nullptr : ahead(a.x, a.next_x, c0, a.w, a.stage)),
        pfy(ahead(a.y, a.next_y, c0, a.w, a.stage)),
        mh(load(bk.mh)),
        ml(load(bk.ml)),
        r(load(bk.r)),
        k(k_),
        st(a.stream) {}

  NL_FORCE_INLINE void rows(Index i0, Index i1) const {
    // Scalar math: y = ((x − m_hi) − m_lo)·r·γ_i + β_i in float, left to right (RMSNorm: x·r·γ_i)
    for (Index i = i0; i < i1; ++i) {
      const Index yo = yoff[i];
      if (pf) prefetch16(pf + pxoff[i]);
      if (pfy) prefetch16(pfy + yo);
      VF v = mul(dev<Center>(ld<Full>(x + xoff[i], k), mh, ml), r);
      if constexpr (W) v = mul(v, bcast(wt[i]));
      if constexpr (B) v = add(v, bcast(bt[i]));
      put<Full>(y + yo, v, k, st);
    }
  }
};

template <bool Center, bool W, bool B, bool Full, bool Staged>
[[gnu::flatten]] void forward_block(const ColumnForward& a, Index c0, int k, float* buf) {
  Block bk;
  const float* x = a.x + c0;
  const Index n = a.n;
  // The rows are read at x + xoff[i], or (Staged) from buf (a crowded tile, see stage).
  const Index* xoff = a.xoff;
  if constexpr (Staged) {
    stage<Full>(buf, x, xoff, n, k);
    x = buf;
    xoff = kStageOff.v;
  }
  block_sum<Full>(bk, x, xoff, n, k, x_ahead(a, c0));
  block_mean<Center>(bk, n);
  block_second<Center, false, false, Full>(bk, x, xoff, nullptr, nullptr, nullptr, n, k);
  block_rstd<Center, false>(bk, n, a.eps);
  write_stats(a, bk, c0, k);
  const OutputPass<Center, W, B, Full> out(a, bk, c0, k, x, xoff);
  out.rows(0, n);
}

#if !NL_VEC_AVX2
// LayerNorm's forward of the first nb (full) blocks of a tile, software-pipelined: the output pass of block v
// runs in eight runs of rows, each after one part of block v + 1's Σx (sum_part), which does not depend on
// block v's statistics. The out-of-order core finds that work while the output waits for rstd, and block
// v + 1's rows come into L1 while block v's are still there. Each column gets forward_block's operations in
// their order (only independent columns' work is reordered): the same bits. Paired (scripts/ab-rows
// col-fwd, docs/PERFORMANCE.md, twenty-second session): 0.94-0.96 of the time of the blocks one after the
// other, from [1, 80, 1000] to [32, 80, 1000]. Not on AVX2, whose block_sum takes a block's two halves one
// after the other (its registers do not hold both): pipelined with parts that do the same, the avx2 kernels
// took 1.10-1.15× the time on Zen 4.
template <bool W, bool B>
[[gnu::flatten]] void forward_pipelined(const ColumnForward& a, Index nb) {
  constexpr bool Center = true;
  const Index n = a.n, run = (n + 7) / 8;
  Block bk[2];
  VD2 S[8];
  auto finish_sum = [&](Block& b) NL_FORCE_INLINE {
    const VD2 s = tree8([&](int l) { return S[l]; });
    stored(b.sum, s.lo);
    stored(b.sum + 8, s.hi);
    block_mean<Center>(b, n);
  };
  for (int l = 0; l < 8; ++l) S[l] = sum_part<true>(a.x, a.xoff, n, kF, l, x_ahead(a, 0));
  finish_sum(bk[0]);
  for (Index v = 0; v < nb; ++v) {
    Block& b = bk[v & 1];
    const Index c0 = kF * v;
    const float* x = a.x + c0;
    block_second<Center, false, false, true>(b, x, a.xoff, nullptr, nullptr, nullptr, n, kF);
    block_rstd<Center, false>(b, n, a.eps);
    write_stats(a, b, c0, kF);
    const OutputPass<Center, W, B, true> out(a, b, c0, kF, x, a.xoff);
    const bool next = v + 1 < nb;
    for (int l = 0; l < 8; ++l) {
      if (next) S[l] = sum_part<true>(x + kF, a.xoff, n, kF, l, x_ahead(a, c0 + kF));
      out.rows(std::min(n, l * run), std::min(n, (l + 1) * run));
    }
    if (next) finish_sum(bk[(v + 1) & 1]);
  }
}
#endif

template <bool Center, bool W, bool B, bool Staged>
void forward_tile(const ColumnForward& a, float* buf) {
  Index c0 = 0;
#if !NL_VEC_AVX2
  if constexpr (Center && !Staged) {  // (RMSNorm has no Σx to interleave)
    const Index nb = a.w / kF;
    if (nb > 0) forward_pipelined<W, B>(a, nb);
    c0 = kF * nb;
  }
#endif
  for (; c0 < a.w; c0 += kF) {
    if (c0 + kF <= a.w)
      forward_block<Center, W, B, true, Staged>(a, c0, kF, buf);
    else
      forward_block<Center, W, B, false, Staged>(a, c0, static_cast<int>(a.w - c0), buf);
  }
}

// A crowded tile, with its buffer on the stack (forward_impl's frame stays small): from there the forward
// took 0.50 of the unstaged time at [4, 80, 1024], from stage_buffer() 0.69.
template <bool Center, bool W, bool B>
[[gnu::noinline]] void forward_staged(const ColumnForward& a) {
  alignas(64) float buf[kColumnStageRows * kF];
  forward_tile<Center, W, B, true>(a, buf);
}

template <bool Center, bool W, bool B>
void forward_impl(const ColumnForward& a) {
  if (a.stage && a.n <= kColumnStageRows)
    forward_staged<Center, W, B>(a);
  else
    forward_tile<Center, W, B, false>(a, nullptr);
  if (a.stream) stream_fence();
}

void forward(const ColumnForward& a) {
  const bool w = a.wt != nullptr, b = a.b != nullptr;
  if (a.center) {
    if (w && b) return forward_impl<true, true, true>(a);
    if (w) return forward_impl<true, true, false>(a);
    if (b) return forward_impl<true, false, true>(a);
    return forward_impl<true, false, false>(a);
  }
  if (w) return forward_impl<false, true, false>(a);
  return forward_impl<false, false, false>(a);
}

// flatten (also on forward_block): the block passes inlined whatever the compiler's inlining budget for
// the rest of this file (out of line they measured 5-20% slower).
template <bool Center, bool W, bool Full, bool Saved, bool Staged>
[[gnu::flatten]] void backward_block(const ColumnBackward& a, Index c0, int k, bool first, float* buf) {
  Block bk;
  const float* x = a.x + c0;
  const float* dy = a.dy + c0;
  float* dx = a.dx + c0;
  const Index n = a.n;
  // The rows are read at x + xoff[i] and dy + dyoff[i], or (Staged) from buf (a crowded tile, see
  // stage): x in its first n rows, dy in the next n.
  const Index* xoff = a.xoff;
  const Index* dyoff = a.dyoff;
  if constexpr (Staged) {
    stage<Full>(buf, x, xoff, n, k);
    stage<Full>(buf + kF * n, dy, dyoff, n, k);
    x = buf;
    dy = buf + kF * n;
    xoff = dyoff = kStageOff.v;
  }
  // The look-ahead (the rows of x, dy and dx kColumnPrefetch blocks ahead) spread over the passes, one
  // operand per pass: x while Σx is formed, dy in the second pass, dx in the output pass (from saved
  // statistics, without Σx, x in the output pass too). All three in the output pass, as until the
  // twenty-sixth session, left the statistics passes without memory traffic and crowded the output pass's.
  // Paired (scripts/ab-rows 99d33e0 col-bwd; docs/PERFORMANCE.md, twenty-sixth session): 0.86 of the time at
  // [32, 80, 1000], 0.91 at [4, 80, 1024], 0.96 at [1, 80, 1000] (in L2). Prefetches change no value.
  const Index* const pxoff = Staged ? a.xoff : xoff;  // (the prefetches: x's and dy's own rows)
  const Index* const pdyoff = Staged ? a.dyoff : dyoff;
  const float* pfx = ahead(a.x, a.next_x, c0, a.w, a.stage);
  const float* pfd = ahead(a.dy, a.next_dy, c0, a.w, a.stage);
  const float* pfo = ahead(a.dx, a.next_dx, c0, a.w, a.stage);
  if constexpr (Saved) {
    block_saved<Center>(bk, a.smean ? a.smean + c0 : nullptr, a.srstd + c0, k);
  } else {
    block_sum<Full>(bk, x, xoff, n, k, RowAhead{pfx, pxoff});
    block_mean<Center>(bk, n);
  }
  block_second<Center, true, W, Full, !Saved>(bk, x, xoff, dy, dyoff, a.wt, n, k, RowAhead{pfd, pdyoff});
  block_rstd<Center, true, Saved>(bk, n, a.eps);
  const VF mh = load(bk.mh), ml = load(bk.ml), r = load(bk.r), c0v = load(bk.c0), c2v = load(bk.c2);
  double* lw = a.lanes;
  double* lb = a.lanes + 8 * n;
  // Locals: the stores to dx could alias the argument block otherwise (reloaded every row).
  const Index* const dxoff = a.dxoff;
  const float* const wt = a.wt;
  const bool st = a.stream, want_w = a.dw != nullptr, want_b = a.db != nullptr;
  // Scalar math: d = (x − m_hi) − m_lo; g = dy·γ_i; dx = r·((g − c0) − d·c2) in float (RMSNorm: r·(g −
  // d·c2)); with t_j = dy·(d·r) of column c0 + j (0 beyond k), in float t_j + t_{j+8}, then
  //              lanes_w[i][j] += double(t_j + t_{j+8}); lanes_b[i][j] += double(dy_j + dy_{j+8}), j < 8
  for (Index i = 0; i < n; ++i) {
    const Index dxo = dxoff[i];
    if (Saved && pfx) prefetch16(pfx + pxoff[i]);
    if (pfo) prefetch16(pfo + dxo);
    const VF xv = ld<Full>(x + xoff[i], k), dyv = ld<Full>(dy + dyoff[i], k);
    const VF d = dev<Center>(xv, mh, ml);
    const VF g = W ? mul(dyv, bcast(wt[i])) : dyv;
    const VF gc = Center ? sub(g, c0v) : g;
    const VF v = mul(r, sub(gc, mul(d, c2v)));
    put<Full>(dx + dxo, v, k, st);
    if (want_w) {
      VF t = mul(dyv, mul(d, r));
      if constexpr (!Full) t = keep_n(t, k);  // the zero-padded columns may hold NaN (eps = 0)
      const VD base = first ? zerod() : loadd(lw + 8 * i);
      stored(lw + 8 * i, add(base, cvt_fold(t)));
    }
    if (want_b) {
      const VD base = first ? zerod() : loadd(lb + 8 * i);
      stored(lb + 8 * i, add(base, cvt_fold(dyv)));
    }
  }
}

template <bool Center, bool W, bool Saved, bool Staged>
void backward_tile(const ColumnBackward& a, float* buf) {
  for (Index c0 = 0; c0 < a.w; c0 += kF) {
    if (c0 + kF <= a.w)
      backward_block<Center, W, true, Saved, Staged>(a, c0, kF, c0 == 0, buf);
    else
      backward_block<Center, W, false, Saved, Staged>(a, c0, static_cast<int>(a.w - c0), c0 == 0, buf);
  }
}

template <bool Center, bool W, bool Saved>
void backward_impl(const ColumnBackward& a) {
  if (a.stage && a.n <= kColumnStageRows / 2)  // (x and dy share the buffer)
    backward_tile<Center, W, Saved, true>(a, stage_buffer());
  else
    backward_tile<Center, W, Saved, false>(a, nullptr);
  // Scalar math: dw[i] += hsum(lanes_w[i]); db[i] += hsum(lanes_b[i])
  if (a.dw)
    for (Index i = 0; i < a.n; ++i) a.dw[i] += hsum(loadd(a.lanes + 8 * i));
  if (a.db)
    for (Index i = 0; i < a.n; ++i) a.db[i] += hsum(loadd(a.lanes + 8 * a.n + 8 * i));
  if (a.stream) stream_fence();
}

template <bool Saved>
void backward_of(const ColumnBackward& a) {
  const bool w = a.wt != nullptr;
  if (a.center) return w ? backward_impl<true, true, Saved>(a) : backward_impl<true, false, Saved>(a);
  return w ? backward_impl<false, true, Saved>(a) : backward_impl<false, false, Saved>(a);
}

void backward(const ColumnBackward& a) {
  if (a.srstd) return backward_of<true>(a);
  backward_of<false>(a);
}

#undef NL_LOAD8F
#undef NL_LOAD8D
#undef NL_STORE8D
#undef NL_STORE8F
#undef NL_SQRT8D
#undef NL_MAX0_8D

}  // namespace
}  // namespace column_impl

extern const ColumnKernels kColumnTable;
const ColumnKernels kColumnTable = {vec::leave_clean<column_impl::forward>,
                                    vec::leave_clean<column_impl::backward>};

}  // namespace normlab::kernels::NL_TARGET
