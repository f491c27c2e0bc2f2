// Row kernels, compiled once per target: include with NL_TARGET defined to the target's name.
// See row_kernels.h for the contract. No include guard on purpose.
// NL_BF16_ONLY (the avx512bf16 target, src/simd/kernels_avx512bf16.cpp) and NL_ROWS_FOR_CONVERT (the
// scalar target's second unit, src/simd/kernels_scalar_convert.cpp): only the kernel templates, for
// convert_kernels-inl.h's bf16/fp16 entries; the float entries and kTable are left out.
#if defined(NL_BF16_ONLY) || defined(NL_ROWS_FOR_CONVERT)
#define NL_ROWS_TEMPLATES_ONLY 1
#endif
#ifndef NL_TARGET
#error "define NL_TARGET before including row_kernels-inl.h"
#endif

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "norm/mean_split.h"
#include "norm/row_kernels.h"
#include "simd/vec.h"

namespace normlab::kernels::NL_TARGET {
namespace {

// ---- Fused row kernels (LayerNorm / RMSNorm over contiguous rows) -------------------------------------
//
// Written against simd/vec.h (16-float and 8-double vectors with the same lane semantics on every
// target), so every target gives the same bits. The numerics are those of docs/numerics.md
// ("Precision"): mean in double from the exactly converted floats; d = (x − m_hi) − m_lo in float with
// m_hi = float(mean), m_lo = float(mean − m_hi); Σd² from float squares added in pairs, accumulated in
// double; every elementwise output in float.
// The fused kernels are templates on the storage type T of the full-shaped operands (x, y; dy, dx):
// float, or bfloat16 / float16 through the 16-bit loads and stores of simd/vec.h (exact widening, one
// rounding at the store), so the arithmetic is the same code for every storage type.

using namespace vec;  // NOLINT: the vector layer of this target

struct RowStats {
  double mean = 0, rstd = 0;
  float mh = 0, ml = 0, r = 0;  // float(mean), float(mean − mh), float(rstd)
};

// st.mean and its fp32 pair (split_mean) (every kernel that takes the mean sets it here).
inline void set_mean(RowStats& st, double mean) {
  const MeanSplit m = split_mean(mean);
  st.mean = mean;
  st.mh = m.hi;
  st.ml = m.lo;
}

template <bool Center>
inline VF dev(VF x, VF mh, VF ml) {
  if constexpr (Center) return sub(sub(x, mh), ml);
  return x;
}

// Σ x[i] in double. Blocks of 32: acc0 += x[i..i+8), acc1 += x[i+8..i+16), acc2, acc3 likewise, from
// 0; a tail shorter than 32 is zero-padded; result hsum((acc0 + acc1) + (acc2 + acc3)).
// row_sum_vec returns the vector before the hsum, computed without the additions of zeros (the first
// block initializes the accumulators; the zero lanes of a tail are not added). An addition of +0.0
// changes at most the sign of a zero, and the sum from +0 is never −0, so (hsum of this) + 0.0 has the
// bits of the sum defined above: the callers (row_sum, mean8) add that +0.0.
// bf16 rows of kPairsMinN or more on AVX-512 take the paired widening (vec.h, load_cvt_pairs; same lane sums,
// same bits): one shift and one mask per 16 elements instead of two zero-extensions and two shifts. Paired
// runs (scripts/ab-rows, 1 thread, in L3; docs/PERFORMANCE.md, "nineteenth session"): the bf16 LayerNorm
// forward took 0.96 of the time at 1024x500 and 0.98 at 2048x200, and in the pipelined forward (mean_block64)
// 0.95 at 1365x768 and 128x4096, 0.97 at 2048x256; at D = 64 and 80 it gained nothing (1.00, 1.01: the four
// permutes per row that undo the pairing), so shorter rows keep the plain widening.
inline constexpr Index kPairsMinN = 128;
// Out of cache (a.stream: an output of 16 MiB or more), the pipelined forward prefetches rows of
// a.tuning.prefetch_min_n or more elements (row_kernels.h, RowTuning: 256 on the Xeon, 1024 on a Zen 4, 512
// on a Zen 5) kRowPrefetchBytes ahead of the pass that first reads them (Σx, or RMSNorm's Σx²): the lines of
// the 64 elements at p + kRowPrefetchBytes, into L1 (not when a.x_cached: the fused add's s, just written).
// Without it the statistics passes of long rows waited on memory: at 8192x4096 the forward took longer than
// its in-L3 time plus a streaming copy of its bytes. Paired runs (scripts/ab-rows, 1 thread, 128 MiB of x;
// docs/PERFORMANCE.md, "sixteenth session", a Zen 4): the fp32 LayerNorm forward 13-17 % faster at
// D = 1024-4096, RMSNorm 7 %, bf16 LayerNorm 13 %, the same in L3; at D = 512 and 768 the gain came and went
// between runs, and D = 256 was 4 % slower.
// The backward's groups of four rows (rows_backward_impl) prefetch likewise, rows of
// a.tuning.backward_prefetch_min_n or more elements (every row but on a Zen 4: 1024), x in
// the Σx pass and dy in the second pass (both in the second pass where there is no Σx pass: from saved
// statistics, RMSNorm), not when a.cached (the memory-efficient backward's scratch rows). Paired runs on the
// Intel Xeon (scripts/ab-rows, 1 thread, 128 MiB of x; docs/PERFORMANCE.md, "thirtieth session"): the
// LayerNorm backward 0.90-0.99 of the time from D = 128 to 4096, from saved statistics 0.86-0.95, bf16
// 0.72-0.79; 1 KiB ahead gained less, 4 KiB lost at D = 768 and 4096; in L3 it changed 1.05-0.96, so only
// out of cache. Their column pass also prefetches the next group's rows into L2 (next_group_rows below).
inline constexpr Index kRowPrefetchBytes = 2048;
template <typename T>
NL_FORCE_INLINE inline void prefetch_ahead64(const T* p) {
  prefetch_ahead<kRowPrefetchBytes, static_cast<int>(sizeof(T))>(p);  // 64 elements: sizeof(T) lines
}

// (acc0 + acc1) + (acc2 + acc3) of row_sum_vec from its accumulators in the paired layout: a0, a1 the even
// and odd lanes of acc0 and acc1, a2, a3 those of acc2 and acc3. (A template, as row_sum_pairs below.)
template <typename V = VD>
inline V pairs_total(V a0, V a1, V a2, V a3) {
  return add(add(unpair_lo(a0, a1), unpair_hi(a0, a1)), add(unpair_lo(a2, a3), unpair_hi(a2, a3)));
}
// row_sum_vec of a bf16 row in the paired layout (vec.h, load_cvt_pairs): a0, a1 the even and odd elements of
// each block's first 16, a2, a3 of its last 16; from +0, with the zero-padded tail added (which the callers'
// + 0.0 makes the same bits). (A template: only instantiated where kBf16Pairs defines the pairing.)
template <typename T>
inline VD row_sum_pairs(const T* x, Index n, bool pf) {
  VD a0 = zerod(), a1 = zerod(), a2 = zerod(), a3 = zerod();
  Index i = 0;
  VD e, o;
  // Scalar math: acc[(i / 8) % 4][i % 8] += double(x[i])
  for (; i + 32 <= n; i += 32) {
    if (pf && i % 64 == 0) prefetch_ahead64(x + i);
    load_cvt_pairs(x + i, e, o);
    a0 = add(a0, e);
    a1 = add(a1, o);
    load_cvt_pairs(x + i + 16, e, o);
    a2 = add(a2, e);
    a3 = add(a3, o);
  }
  if (i < n) {
    const int k = static_cast<int>(n - i);
    load_cvt_pairs_n(x + i, std::min(k, kF), e, o);
    a0 = add(a0, e);
    a1 = add(a1, o);
    if (k > kF) {
      load_cvt_pairs_n(x + i + kF, k - kF, e, o);
      a2 = add(a2, e);
      a3 = add(a3, o);
    }
  }
  return pairs_total(a0, a1, a2, a3);
}
template <typename T>
inline VD row_sum_vec(const T* x, Index n, bool pf = false) {
  VD a0 = zerod(), a1 = zerod(), a2 = zerod(), a3 = zerod();
  Index i = 0;
  if constexpr (kIsBf16<T> && kBf16Pairs)
    if (n >= kPairsMinN) return row_sum_pairs(x, n, pf);
  if (n >= 32) {
    a0 = load_cvt(x);
    a1 = load_cvt(x + 8);
    a2 = load_cvt(x + 16);
    a3 = load_cvt(x + 24);
    i = 32;
  }
  // Scalar math: acc[(i / 8) % 4][i % 8] += double(x[i])
  for (; i + 32 <= n; i += 32) {
    if (pf && i % 64 == 0) prefetch_ahead64(x + i);
    a0 = add(a0, load_cvt(x + i));
    a1 = add(a1, load_cvt(x + i + 8));
    a2 = add(a2, load_cvt(x + i + 16));
    a3 = add(a3, load_cvt(x + i + 24));
  }
  if (i < n) {
    const int k = static_cast<int>(n - i);
    const VF u = load_n(x + i, std::min(k, kF));
    a0 = add(a0, cvt_lo(u));
    if (k > 8) a1 = add(a1, cvt_hi(u));
    if (k > kF) {
      const VF v = load_n(x + i + kF, k - kF);
      a2 = add(a2, cvt_lo(v));
      if (k > 24) a3 = add(a3, cvt_hi(v));
    }
  }
  return add(add(a0, a1), add(a2, a3));
}
template <typename T>
inline double row_sum(const T* x, Index n, bool pf = false) {
  return hsum(row_sum_vec(x, n, pf)) + 0.0;
}

// The second pass, around m_hi = float(mean) (Center) or 0 (RMSNorm): e = x − m_hi in float. Blocks of 64
// elements (four VF a, b, c, d; a tail is zero-padded and its e masked to 0):
//   q = (ea·ea + eb·eb) + (ec·ec + ed·ed)                          (float)
// and with dy, g = dy·w:
//   sg = (ga + gb) + (gc + gd),  sge = (ga·ea + gb·eb) + (gc·ec + gd·ed)   (float)
// In a tail block the all-zero vectors are left out of the float block sums: a sum of squares gains
// nothing from + 0, and Σg, Σg·e get their + 0.0 at the end (below).
// Each float block sum is added to two double accumulators (its lanes 0..7 and 8..15), from 0; a total
// is hsum(acc_lo + acc_hi). The first block initializes the accumulators instead (see row_sum_vec:
// Σe² is never −0 either way; row_second_pass adds the +0.0 to Σg and Σg·e). The caller corrects for m_lo =
// mean − m_hi exactly in double:
//   Σ(x − mean)² = Σe² − n·m_lo²,  Σg·(x − mean) = Σg·e − m_lo·Σg.
struct SecondPass {
  double sq = 0, sg = 0, sge = 0;
};
struct SecondPassVec {  // the accumulators before the hsum
  VD sq, sg, sge;
};

// The float sum of a second-pass block's live vectors (1 to 4; a tail block leaves out its all-zero ones):
// term(0), term(0) + term(1), (term(0) + term(1)) + term(2), (term(0) + term(1)) + (term(2) + term(3)).
template <typename F>
NL_FORCE_INLINE inline VF block_tree(int live, F&& term) {
  if (live == 1) return term(0);
  if (live == 2) return add(term(0), term(1));
  if (live == 3) return add(add(term(0), term(1)), term(2));
  return add(add(term(0), term(1)), add(term(2), term(3)));
}

// WithSq = false leaves Σe² out (a backward from saved statistics needs only Σg and Σg·e).
// Always inlined: within its inlining budget GCC left the bf16/fp16 instantiations out of line in the
// avx2 unit's short-row forward, a call per row that returned the accumulators through memory (the bf16
// LayerNorm forward at D = 64 took 1.47× the time; docs/PERFORMANCE.md, twelfth session).
template <bool Center, bool WithDy, bool W, bool WithSq = true, typename T>
NL_FORCE_INLINE inline SecondPassVec row_second_pass_vec(const T* x, std::type_identity_t<const T*> dy,
                                                         const float* w, Index n, VF mh, bool pf_x = false,
                                                         bool pf_dy = false) {
  VD q0 = zerod(), q1 = zerod(), g0 = zerod(), g1 = zerod(), p0 = zerod(), p1 = zerod();
  const VF z = zerof();
  auto dev0 = [&](VF v) NL_FORCE_INLINE { return Center ? sub(v, mh) : v; };
  // k[] = valid lanes of each of the four vectors (16 except in the tail).
  auto block = [&](Index i, const int* k, bool tail, bool first) NL_FORCE_INLINE {
    VF e[4], g[4];
    for (int u = 0; u < 4; ++u) {
      if (tail && k[u] == 0) {  // never summed (see live below)
        e[u] = g[u] = z;
        continue;
      }
      const VF xv = !tail ? load(x + i + u * kF) : load_n(x + i + u * kF, k[u]);
      e[u] = dev0(xv);
      if (tail) e[u] = keep_n(e[u], k[u]);
      if constexpr (WithDy) {
        const VF dyv = !tail ? load(dy + i + u * kF) : load_n(dy + i + u * kF, k[u]);
        if constexpr (W) {
          const VF wv = !tail ? load(w + i + u * kF) : load_n(w + i + u * kF, k[u]);
          g[u] = mul(dyv, wv);
        } else {
          g[u] = dyv;
        }
      }
    }
    // live: the vectors with elements (4 except in a tail); block_tree sums those in the tree of four.
    const int live = !tail ? 4 : (k[1] == 0 ? 1 : k[2] == 0 ? 2 : k[3] == 0 ? 3 : 4);
    if constexpr (WithSq) {
      const VF q = block_tree(live, [&](int u) { return mul(e[u], e[u]); });
      q0 = first ? cvt_lo(q) : add(q0, cvt_lo(q));
      q1 = first ? cvt_hi(q) : add(q1, cvt_hi(q));
    }
    if constexpr (WithDy) {
      const VF sg = block_tree(live, [&](int u) { return g[u]; });
      const VF sge = block_tree(live, [&](int u) { return mul(g[u], e[u]); });
      g0 = first ? cvt_lo(sg) : add(g0, cvt_lo(sg));
      g1 = first ? cvt_hi(sg) : add(g1, cvt_hi(sg));
      p0 = first ? cvt_lo(sge) : add(p0, cvt_lo(sge));
      p1 = first ? cvt_hi(sge) : add(p1, cvt_hi(sge));
    }
  };
  static constexpr int kFull[4] = {kF, kF, kF, kF};
  Index i = 0;
  // Scalar math: e = x[i] − m_hi; Σe² (and Σg, Σg·e with g = dy[i]·w[i]) as described above
  for (; i + 4 * kF <= n; i += 4 * kF) {
    if (pf_x) prefetch_ahead64(x + i);
    if (WithDy && pf_dy) prefetch_ahead64(dy + i);
    block(i, kFull, false, i == 0);
  }
  if (i < n) {
    // (rem < 64 here; computed in int, which keeps GCC's range analysis from a false overflow warning)
    const int rem = static_cast<int>(n - i);
    int k[4];
    for (int u = 0; u < 4; ++u) k[u] = std::clamp(rem - u * kF, 0, kF);
    block(i, k, true, i == 0);
  }
  SecondPassVec s{WithSq ? add(q0, q1) : zerod(), zerod(), zerod()};
  if constexpr (WithDy) {
    s.sg = add(g0, g1);
    s.sge = add(p0, p1);
  }
  return s;
}

template <bool Center, bool WithDy, bool W, bool WithSq = true, typename T>
inline SecondPass row_second_pass(const T* x, std::type_identity_t<const T*> dy, const float* w, Index n,
                                  VF mh, bool pf_x = false, bool pf_dy = false) {
  const SecondPassVec v = row_second_pass_vec<Center, WithDy, W, WithSq>(x, dy, w, n, mh, pf_x, pf_dy);
  SecondPass s;
  if constexpr (WithSq) s.sq = hsum(v.sq);
  if constexpr (WithDy) {
    s.sg = hsum(v.sg) + 0.0;
    s.sge = hsum(v.sge) + 0.0;
  }
  return s;
}

template <bool Center, typename T>
inline double row_mean(const T* x, Index n, RowStats& st, bool pf = false) {
  set_mean(st, Center ? row_sum(x, n, pf) / static_cast<double>(n) : 0.0);
  return st.mean;
}

// row_mean and finish_rstd's results from a saved double mean and rstd (the same values, so the same
// m_hi, m_lo and r).
template <bool Center>
inline void saved_stats(RowStats& st, const double* smean, const double* srstd, Index row) {
  set_mean(st, Center ? smean[row] : 0.0);
  st.rstd = srstd[row];
  st.r = static_cast<float>(st.rstd);
}

// var = (Σe² − n·m_lo²)/n = Σe²/n − m_lo², floored at 0 (it can only go below by rounding).
inline void finish_rstd(RowStats& st, double sq, Index n, double eps) {
  const double ml = static_cast<double>(st.ml);
  const double var = std::max(sq / static_cast<double>(n) - ml * ml, 0.0);
  st.rstd = 1.0 / std::sqrt(var + eps);
  st.r = static_cast<float>(st.rstd);
}

// ---- Statistics of eight rows at once ---------------------------------------------------------------
// The horizontal sums, divisions and square roots of the per-row statistics, done for eight rows with
// one vector instruction each (two on AVX2) instead of eight scalar chains. IEEE division and square root
// are correctly rounded and the transposes keep hsum's tree, so every result has the bits of the per-row
// code (row_mean, finish_rstd). The scalar target runs the per-row code.

// out[r] = hsum(v[r]) for r = 0..7, by transpose-and-add: lanes l and l + 4, then l and l + 2, then
// 0 and 1, exactly hsum's tree.
NL_FORCE_INLINE inline void hsum8(double* out, const VD* v) {
#if NL_VEC_AVX512
  // (The all-ones maskz forms avoid GCC 12's false -Wmaybe-uninitialized on the plain intrinsics.)
  __m512d t[4], u[2];
  for (int p = 0; p < 4; ++p) {  // lanes 0..3: row 2p, lanes 4..7: row 2p + 1; lane l: a[l] + a[l + 4]
    const __m512d a = v[2 * p].v, b = v[2 * p + 1].v;
    t[p] = _mm512_add_pd(_mm512_maskz_shuffle_f64x2(0xFF, a, b, 0x44),
                         _mm512_maskz_shuffle_f64x2(0xFF, a, b, 0xEE));
  }
  for (int p = 0; p < 2; ++p)  // 128-bit lane k: row 4p + k, (t[0] + t[2], t[1] + t[3])
    u[p] = _mm512_add_pd(_mm512_maskz_shuffle_f64x2(0xFF, t[2 * p], t[2 * p + 1], 0x88),
                         _mm512_maskz_shuffle_f64x2(0xFF, t[2 * p], t[2 * p + 1], 0xDD));
  // lane 2k: row k, lane 2k + 1: row k + 4
  const __m512d s =
      _mm512_add_pd(_mm512_maskz_unpacklo_pd(0xFF, u[0], u[1]), _mm512_maskz_unpackhi_pd(0xFF, u[0], u[1]));
  _mm512_storeu_pd(out, _mm512_maskz_permutexvar_pd(0xFF, _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), s));
#elif NL_VEC_AVX2
  for (int q = 0; q < 2; ++q) {  // rows 4q .. 4q + 3
    __m256d u[4];
    for (int j = 0; j < 4; ++j) u[j] = _mm256_add_pd(v[4 * q + j].lo, v[4 * q + j].hi);  // t = lo + hi
    // rows a, b: (t_a0 + t_a2, t_a1 + t_a3, t_b0 + t_b2, t_b1 + t_b3), hsum's 128-bit step
    const __m256d ab =
        _mm256_add_pd(_mm256_permute2f128_pd(u[0], u[1], 0x20), _mm256_permute2f128_pd(u[0], u[1], 0x31));
    const __m256d cd =
        _mm256_add_pd(_mm256_permute2f128_pd(u[2], u[3], 0x20), _mm256_permute2f128_pd(u[2], u[3], 0x31));
    // hadd: (a, c, b, d), each the sum of its two lanes as hsum's last step; then rows in order
    _mm256_storeu_pd(out + 4 * q, _mm256_permute4x64_pd(_mm256_hadd_pd(ab, cd), _MM_SHUFFLE(3, 1, 2, 0)));
  }
#else
  for (int r = 0; r < 8; ++r) out[r] = hsum(v[r]);
#endif
}

struct Stats8 {
  alignas(64) double mean[8];
  alignas(64) double rstd[8];
  alignas(32) float mh[8];
  alignas(32) float ml[8];
  alignas(32) float r[8];
};

// row_mean for eight rows from hsum(row_sum_vec) (which wants + 0.0): mean = Σx/n, m_hi = float(mean), m_lo =
// float(mean − m_hi).
inline void mean8(Stats8& st, const double* sum, double n) {
#if NL_VEC_AVX512
  const __m512d m =
      _mm512_div_pd(_mm512_add_pd(_mm512_loadu_pd(sum), _mm512_setzero_pd()), _mm512_set1_pd(n));
  const __m256 mh = _mm512_maskz_cvtpd_ps(0xFF, m);
  _mm512_store_pd(st.mean, m);
  _mm256_store_ps(st.mh, mh);
  _mm256_store_ps(st.ml, _mm512_maskz_cvtpd_ps(0xFF, _mm512_sub_pd(m, _mm512_maskz_cvtps_pd(0xFF, mh))));
#elif NL_VEC_AVX2
  for (int h = 0; h < 2; ++h) {
    const __m256d m =
        _mm256_div_pd(_mm256_add_pd(_mm256_loadu_pd(sum + 4 * h), _mm256_setzero_pd()), _mm256_set1_pd(n));
    const __m128 mh = _mm256_cvtpd_ps(m);
    _mm256_store_pd(st.mean + 4 * h, m);
    _mm_store_ps(st.mh + 4 * h, mh);
    _mm_store_ps(st.ml + 4 * h, _mm256_cvtpd_ps(_mm256_sub_pd(m, _mm256_cvtps_pd(mh))));
  }
#else
  for (int j = 0; j < 8; ++j) {
    st.mean[j] = (sum[j] + 0.0) / n;
    st.mh[j] = static_cast<float>(st.mean[j]);
    st.ml[j] = static_cast<float>(st.mean[j] - static_cast<double>(st.mh[j]));
  }
#endif
}

// finish_rstd for eight rows: var = max(Σe²/n − m_lo², 0), rstd = 1/√(var + eps), r = float(rstd).
inline void rstd8(Stats8& st, const double* sq, double n, double eps) {
#if NL_VEC_AVX512
  const __m512d ml = _mm512_maskz_cvtps_pd(0xFF, _mm256_load_ps(st.ml));
  __m512d var = _mm512_sub_pd(_mm512_div_pd(_mm512_loadu_pd(sq), _mm512_set1_pd(n)), _mm512_mul_pd(ml, ml));
  var = _mm512_maskz_max_pd(0xFF, _mm512_setzero_pd(), var);  // (0 > var) ? 0 : var, as std::max(var, 0.0)
  const __m512d rstd =
      _mm512_div_pd(_mm512_set1_pd(1.0), _mm512_maskz_sqrt_pd(0xFF, _mm512_add_pd(var, _mm512_set1_pd(eps))));
  _mm512_store_pd(st.rstd, rstd);
  _mm256_store_ps(st.r, _mm512_maskz_cvtpd_ps(0xFF, rstd));
#elif NL_VEC_AVX2
  for (int h = 0; h < 2; ++h) {
    const __m256d ml = _mm256_cvtps_pd(_mm_load_ps(st.ml + 4 * h));
    __m256d var =
        _mm256_sub_pd(_mm256_div_pd(_mm256_loadu_pd(sq + 4 * h), _mm256_set1_pd(n)), _mm256_mul_pd(ml, ml));
    var = _mm256_max_pd(_mm256_setzero_pd(), var);  // (0 > var) ? 0 : var, as std::max(var, 0.0)
    const __m256d rstd =
        _mm256_div_pd(_mm256_set1_pd(1.0), _mm256_sqrt_pd(_mm256_add_pd(var, _mm256_set1_pd(eps))));
    _mm256_store_pd(st.rstd + 4 * h, rstd);
    _mm_store_ps(st.r + 4 * h, _mm256_cvtpd_ps(rstd));
  }
#else
  for (int j = 0; j < 8; ++j) {
    const double ml = static_cast<double>(st.ml[j]);
    const double var = std::max(sq[j] / n - ml * ml, 0.0);
    st.rstd[j] = 1.0 / std::sqrt(var + eps);
    st.r[j] = static_cast<float>(st.rstd[j]);
  }
#endif
}

// y = ((x − mh) − ml)·r·w + b of one row, all in float. Always inlined, as row_second_pass_vec: GCC left
// two of its bf16/fp16 instantiations (LayerNorm without β, RMSNorm with β) out of line in the avx2 unit.
template <bool Center, bool W, bool B, typename T>
NL_FORCE_INLINE inline void row_output(T* y, const T* x, Index n, const float* w, const float* b, float mhs,
                                       float mls, float rs, bool nt) {
  const VF z = zerof();
  const VF mh = bcast(mhs), ml = bcast(mls), r = bcast(rs);
  auto out = [&](VF xv, VF wv, VF bv) NL_FORCE_INLINE {
    VF v = mul(dev<Center>(xv, mh, ml), r);
    if constexpr (W) v = mul(v, wv);
    if constexpr (B) v = add(v, bv);
    return v;
  };
  Index i = 0;
  // Scalar math: y[i] = ((x[i] − mh) − ml)·r·w[i] + b[i], all in float
  if (nt && stream_ok(y)) {
    for (; i + kF <= n; i += kF) stream(y + i, out(load(x + i), W ? load(w + i) : z, B ? load(b + i) : z));
  } else {
    for (; i + kF <= n; i += kF) store(y + i, out(load(x + i), W ? load(w + i) : z, B ? load(b + i) : z));
  }
  if (i < n) {
    const int k = static_cast<int>(n - i);
    store_n(y + i, out(load_n(x + i, k), W ? load_n(w + i, k) : z, B ? load_n(b + i, k) : z), k);
  }
}

// The forward for short rows (n ≤ kBatchMaxN), in blocks of eight rows, software-pipelined over
// blocks: step s runs the outputs of block s − 2, the second passes of block s − 1 and their rstd
// together (rstd8), and Σx of block s and their means together (hsum8, mean8), in this order (each
// stage uses results of the previous step only). So the long dependency chains of a block's statistics
// (horizontal sums, division, square root) overlap the work of the other two blocks. The arithmetic of every
// row is that of rows_forward_impl (same bits); only the horizontal sums, divisions and square roots of eight
// rows share instructions. A last block of fewer than eight rows repeats its last row in the unused slots
// (computed, never written). NC > 0: n == NC, known at compile time. y may equal x: a block's outputs are
// written after its statistics are complete. (kBatchMaxN: row_kernels.h.)
// kSecondFirst (RMSNorm, whose Σx stage is empty, at the compile-time lengths and of 16-bit rows): the
// outputs of block s − 2 come after the second passes of block s − 1, so that the out-of-order window has the
// outputs' independent work behind the rstd chain (hsum8, division, square root, division: about 80 cycles)
// instead of only the next step's Σx stage, which RMSNorm does not have. (LayerNorm's Σx stage stands there
// already; a perf profile of its forward at 512x64 had the retirement waiting on the rstd chain for about a
// fifth of its samples.) Paired runs on a Zen 5 (scripts/ab-rows, 1 thread; docs/PERFORMANCE.md, "forty-first
// session"): the fp32 RMSNorm forward 0.89-0.94 of the time at D = 64 and 80 in L2 and L3, bf16 0.94-0.97 at
// D = 32 to 200, but fp32 at D = 32 and 200 (no compile-time length) 1.02-1.04, so not there. The same bits:
// only the order of independent work changes. The LayerNorm forward in this order measured 0.93-1.04
// (0.93-0.96 in L1 and L2 at D = 64, 1.02-1.04 in L3 and of bf16 rows), so it keeps its order.

// Out of cache, where a.tuning.batched_prefetch (16-bit rows) or a.tuning.batched_prefetch_fp32 (fp32 rows)
// says so (row_kernels.h, RowTuning), step s of the eight-row forward first prefetches the rows of block
// s + kBatchPrefetchBlocks (every line of each, into L1), which its Σx pass (RMSNorm: second pass) reads two
// steps later. Paired runs (scripts/ab-rows, 1 thread): on an Intel Xeon (docs/PERFORMANCE.md,
// "twenty-seventh session") the bf16 LayerNorm forward 0.86-0.93 of the time at D = 32, 64, 80, RMSNorm
// 0.82-0.97; four blocks ahead 0.88-0.93; the fp32 forward 1.15-1.19 (and on a Zen 4 1.05-1.27, "eighteenth
// session"). On a Zen 5 ("thirty-ninth session") the fp32 forward 0.55-0.79 at D = 64 and 80 (one block ahead
// 0.63-0.78, four 0.76-0.87), about even at 32. The eight-row backward does the same for x and dy of 16-bit
// rows (step s, block s + kBatchPrefetchBlocks; "thirtieth session"): bf16 0.83-0.89 of the time at D = 64
// and 80 (one block ahead 0.83-0.90, four 0.83-0.89), fp32 1.11-1.17 (on a Zen 5 0.96-1.43), so 16-bit rows
// only.
inline constexpr Index kBatchPrefetchBlocks = 2;

// Save (here and in rows_forward_impl / rows_forward_pipelined): the kernel writes NormStats' smean and
// srstd. A separate instantiation, so that a plain forward runs the loop it had before NormStats: with the
// stores compiled in (and never run) the forward measured 6-30 % slower out of cache at 1 thread (D = 64,
// 80 and 768; 2026-11-30, docs/PERFORMANCE.md).
template <bool Center, bool W, bool B, int NC, bool Save, typename T>
void rows_forward_batched(const RowsForwardOf<T>& a) {
  const Index n = NC > 0 ? NC : a.n;
  const double nd = static_cast<double>(n);
  const Index blocks = (a.rows + 7) / 8;
  Stats8 st[3];  // by block index mod 3
  auto row_ptrs = [&](Index blk, const T** xs) {
    const Index r0 = blk * 8, last = a.rows - 1;
    for (int j = 0; j < 8; ++j) xs[j] = a.x + std::min(r0 + j, last) * a.ldx;
  };
  // Locals: the vector stores to y could alias the argument block, which the loops would then reload.
  const float* const wp = a.w;
  const float* const bp = a.b;
  const bool ahead = (sizeof(T) == 2 ? a.tuning.batched_prefetch : a.tuning.batched_prefetch_fp32) &&
                     a.stream && !a.x_cached;
  const Index row_lines = (n * Index{sizeof(T)} + 63) / 64;
  const bool nt = stream_rows(a);
  constexpr bool kSecondFirst = !Center && (NC > 0 || sizeof(T) == 2);
  for (Index s = 0; s < blocks + 2; ++s) {
    const T* xs[8];
    VD acc[8];
    double t[8];
    if (ahead && s + kBatchPrefetchBlocks < blocks) {
      const Index r0 = (s + kBatchPrefetchBlocks) * 8, r1 = std::min<Index>(a.rows, r0 + 8);
      for (Index r = r0; r < r1; ++r)
        prefetch_lines(reinterpret_cast<std::uintptr_t>(a.x + r * a.ldx), row_lines);
    }
    // The outputs of block s − 2: before the second passes, or after them where kSecondFirst (see above).
    auto outputs = [&]() NL_FORCE_INLINE {
      const Index blk = s - 2;
      const Stats8& sc = st[blk % 3];
      const Index r0 = blk * 8;
      const int nr = static_cast<int>(std::min<Index>(8, a.rows - r0));
      int j = 0;
      if (NC > 0 && NC % kF == 0 && !a.stream) {  // two rows at a time: one load of γ and β for both
        for (; j + 2 <= nr; j += 2) {
          const T* xa = a.x + (r0 + j) * a.ldx;
          const T* xb = xa + a.ldx;
          T* ya = a.y + (r0 + j) * a.ldy;
          T* yb = ya + a.ldy;
          const VF mha = bcast(sc.mh[j]), mla = bcast(sc.ml[j]), ra = bcast(sc.r[j]);
          const VF mhb = bcast(sc.mh[j + 1]), mlb = bcast(sc.ml[j + 1]), rb = bcast(sc.r[j + 1]);
          // Scalar math: y[i] = ((x[i] − mh) − ml)·r·w[i] + b[i], all in float (as row_output)
          for (Index i = 0; i < n; i += kF) {
            const VF wv = W ? load(wp + i) : zerof(), bv = B ? load(bp + i) : zerof();
            VF va = mul(dev<Center>(load(xa + i), mha, mla), ra);
            VF vb = mul(dev<Center>(load(xb + i), mhb, mlb), rb);
            if constexpr (W) {
              va = mul(va, wv);
              vb = mul(vb, wv);
            }
            if constexpr (B) {
              va = add(va, bv);
              vb = add(vb, bv);
            }
            store(ya + i, va);
            store(yb + i, vb);
          }
        }
      }
      for (; j < nr; ++j)
        row_output<Center, W, B>(a.y + (r0 + j) * a.ldy, a.x + (r0 + j) * a.ldx, n, a.w, a.b, sc.mh[j],
                                 sc.ml[j], sc.r[j], nt);
    };
    if (!kSecondFirst && s >= 2) outputs();
    if (s >= 1 && s - 1 < blocks) {  // the second passes and rstd of block s − 1
      const Index blk = s - 1;
      Stats8& sb = st[blk % 3];
      row_ptrs(blk, xs);
      for (int j = 0; j < 8; ++j)
        acc[j] = row_second_pass_vec<Center, false, false>(xs[j], nullptr, nullptr, n, bcast(sb.mh[j])).sq;
      hsum8(t, acc);
      rstd8(sb, t, nd, a.eps);
      const Index r0 = blk * 8;
      const int nr = static_cast<int>(std::min<Index>(8, a.rows - r0));
      if (a.mean)
        for (int j = 0; j < nr; ++j) a.mean[(r0 + j) * a.ld_stats] = sb.mh[j];
      if (a.rstd)
        for (int j = 0; j < nr; ++j) a.rstd[(r0 + j) * a.ld_stats] = sb.r[j];
      if constexpr (Save) {
        if (a.smean)
          for (int j = 0; j < nr; ++j) a.smean[r0 + j] = sb.mean[j];
        if (a.srstd)
          for (int j = 0; j < nr; ++j) a.srstd[r0 + j] = sb.rstd[j];
      }
    }
    if (kSecondFirst && s >= 2) outputs();
    if (s < blocks) {  // Σx and the means of block s
      Stats8& sa = st[s % 3];
      if constexpr (Center) {
        row_ptrs(s, xs);
        for (int j = 0; j < 8; ++j) acc[j] = row_sum_vec(xs[j], n);
        hsum8(t, acc);
        mean8(sa, t, nd);
      } else {
        for (int j = 0; j < 8; ++j) sa.mh[j] = sa.ml[j] = 0.0f;
      }
    }
  }
  if (a.stream) stream_fence();
}

// Rows are handled in blocks of up to kMaxBlock (about 16 KiB of x): each stage (Σx, second pass,
// rstd, output) runs over all rows of the block before the next, so that the short dependency chains
// of different rows overlap. The block changes only the order of independent work, never a result.
inline constexpr int kMaxBlock = 8;
inline int block_rows(Index n) {
  return static_cast<int>(std::clamp<Index>(4096 / n, 1, kMaxBlock));
}

template <bool Center, bool W, bool B, bool Save, typename T>
void rows_forward_impl(const RowsForwardOf<T>& a) {
  const Index n = a.n;
  const int block = block_rows(n);
  const bool nt = stream_rows(a);
  for (Index r0 = 0; r0 < a.rows; r0 += block) {
    const int nr = static_cast<int>(std::min<Index>(block, a.rows - r0));
    RowStats st[kMaxBlock];
    const T* xs[kMaxBlock];
    for (int j = 0; j < nr; ++j) xs[j] = a.x + (r0 + j) * a.ldx;
    for (int j = 0; j < nr; ++j) row_mean<Center>(xs[j], n, st[j]);
    double sq[kMaxBlock];
    for (int j = 0; j < nr; ++j)
      sq[j] = row_second_pass<Center, false, false>(xs[j], nullptr, nullptr, n, bcast(st[j].mh)).sq;
    for (int j = 0; j < nr; ++j) {
      finish_rstd(st[j], sq[j], n, a.eps);
      if (a.mean) a.mean[(r0 + j) * a.ld_stats] = st[j].mh;
      if (a.rstd) a.rstd[(r0 + j) * a.ld_stats] = st[j].r;
      if constexpr (Save) {
        if (a.smean) a.smean[r0 + j] = st[j].mean;
        if (a.srstd) a.srstd[r0 + j] = st[j].rstd;
      }
    }
    for (int j = 0; j < nr; ++j)
      row_output<Center, W, B>(a.y + (r0 + j) * a.ldy, xs[j], n, a.w, a.b, st[j].mh, st[j].ml, st[j].r, nt);
  }
  if (a.stream) stream_fence();
}

// The same arithmetic as rows_forward_impl for n a multiple of 64, software-pipelined over rows: step s
// runs Σx of row s, the second pass of row s − 1 and the output of row s − 2 in one loop over the
// columns. The output pass is bound by memory traffic and the two statistics passes by arithmetic;
// interleaving them lets the two overlap. Every pass keeps its own accumulators and order, so the
// results are those of rows_forward_impl bit for bit.
// Add: the fused residual add (a.r). The pass that reads a row first (Σx; RMSNorm's Σx²) forms it, 64
// elements at a time, as add_rows does: s = x + r stored to a.s (streaming stores where a.stream and the row
// allows) and, with a.work (out of cache), to a ring of three rows there, from which the passes read it
// (else from a.s). So the passes read the stored s from cache, and the loads of x and r from memory overlap
// the other rows' arithmetic. Against the chunks it replaced (s of 64 KiB formed, then normalized) on a Zen
// 5 at 1 thread (docs/PERFORMANCE.md, "fifty-first session"; normlab_bench, old and new binaries
// alternating): out of cache fp32 0.76-0.96 of the time, bf16 and fp16 0.85-0.93; in L3 fp32 0.80-0.99,
// bf16 and fp16 0.97-1.04.
// (Both block helpers always inlined: GCC left mean_block64<true, float16> out of line in the avx2 unit, a
// call per 64 elements of the fp16 pipelined forward with its accumulators in memory.)
template <bool Center, typename T>
NL_FORCE_INLINE inline void mean_block64(VD& a0, VD& a1, VD& a2, VD& a3, const T* x) {
  if constexpr (kIsBf16<T> && kBf16Pairs) {
    // In the paired layout (vec.h, load_cvt_pairs; see kPairsMinN): a0, a1 hold the even and odd elements of
    // each block's first 16, a2, a3 of its last 16; rows_forward_pipelined unpairs them before the hsum.
    for (int h = 0; h < 64; h += 16) {
      VD e, o;
      load_cvt_pairs(x + h, e, o);
      if (h % 32 == 0) {
        a0 = add(a0, e);
        a1 = add(a1, o);
      } else {
        a2 = add(a2, e);
        a3 = add(a3, o);
      }
    }
    return;
  }
  a0 = add(a0, load_cvt(x));
  a1 = add(a1, load_cvt(x + 8));
  a2 = add(a2, load_cvt(x + 16));
  a3 = add(a3, load_cvt(x + 24));
  a0 = add(a0, load_cvt(x + 32));
  a1 = add(a1, load_cvt(x + 40));
  a2 = add(a2, load_cvt(x + 48));
  a3 = add(a3, load_cvt(x + 56));
}

template <bool Center, typename T>
NL_FORCE_INLINE inline void second_block64(VD& q0, VD& q1, const T* x, VF mh) {
  VF e[4];
  for (int u = 0; u < 4; ++u) e[u] = Center ? sub(load(x + u * kF), mh) : load(x + u * kF);
  const VF q = add(add(mul(e[0], e[0]), mul(e[1], e[1])), add(mul(e[2], e[2]), mul(e[3], e[3])));
  q0 = add(q0, cvt_lo(q));
  q1 = add(q1, cvt_hi(q));
}

// One vector of the fused residual add's s = x + r (the float sum of the widened values), elements k to
// k + kF − 1: stored to s, with a streaming store where nt, and to copy where given (ordinary store);
// returned for the passes that follow. The pipelined kernel, add_rows and the register kernel form s with it.
// (The offset apart from the pointers keeps `copy` a test the compiler hoists out of the caller's loop.)
template <typename T>
NL_FORCE_INLINE inline VF add_vec(T* s, bool nt, std::type_identity_t<T*> copy,
                                  std::type_identity_t<const T*> x, std::type_identity_t<const T*> r,
                                  Index k) {
  // Scalar math: s[i] = round_T(float(x[i]) + float(r[i]))   (copy[i] likewise)
  const VF v = add(load(x + k), load(r + k));
  if (copy) store(copy + k, v);
  if (nt)
    stream(s + k, v);
  else
    store(s + k, v);
  return v;
}

template <bool Center, bool W, bool B, bool Save, bool Add, typename T>
void rows_forward_pipelined(const RowsForwardOf<T>& a) {
  const Index n = a.n, rows = a.rows;
  // Locals: the vector stores to y could alias the argument block, which the loop would then reload.
  const float* const wp = a.w;
  const float* const bp = a.b;
  RowStats st[3];  // by row index mod 3
  const bool ahead = a.stream && !a.x_cached && n >= a.tuning.prefetch_min_n;
  T* const ring = Add && a.stream ? a.work : nullptr;
  for (Index s = 0; s < rows + 2; ++s) {
    const bool do_mean = Center && s < rows;
    const bool do_second = s >= 1 && s - 1 < rows;
    const bool do_out = s >= 2;
    const T* xa = a.x + s * a.ldx;
    const T* xb = a.x + (s - 1) * a.ldx;
    const T* xc = a.x + (s - 2) * a.ldx;
    if constexpr (Add) {  // the rows of s (k ≥ −2)
      auto row = [&](Index k) -> const T* { return ring ? ring + (k + 3) % 3 * n : a.s + k * a.lds; };
      xa = row(s);
      xb = row(s - 1);
      xc = row(s - 2);
    }
    T* yc = a.y + (s - 2) * a.ldy;
    RowStats& sb = st[(s + 2) % 3];  // row s − 1
    RowStats& sc = st[(s + 1) % 3];  // row s − 2
    const VF mhb = bcast(sb.mh);
    const VF mhc = bcast(sc.mh), mlc = bcast(sc.ml), rc = bcast(sc.r);
    const bool st_c = do_out && a.stream && stream_ok(yc);
    VD a0 = zerod(), a1 = zerod(), a2 = zerod(), a3 = zerod(), q0 = zerod(), q1 = zerod();
    // Scalar math: as rows_forward_impl (Σx in blocks of 32; Σe² in blocks of 64; y per element)
    // (the row read first from memory: row s for Σx, row s − 1 for RMSNorm's Σx²)
    const T* const first = Center ? xa : xb;
    const bool pf = ahead && (Center ? do_mean : do_second);
    // Add: that row's x and r, its s, the ring's copy (first), and whether s goes out with streaming stores.
    const bool add_f = Add && (Center ? do_mean : do_second);
    const Index f = Center ? s : s - 1;
    const T* const xf = add_f ? a.x + f * a.ldx : nullptr;
    const T* const rf = add_f ? a.r + f * a.ldr : nullptr;
    T* const sf = add_f ? a.s + f * a.lds : nullptr;
    T* const cf = add_f && ring ? ring + f % 3 * n : nullptr;
    [[maybe_unused]] const bool st_f = cf && stream_ok(sf);  // (used only where Add)
    // With `late` (output_late), each block's outputs are stored after the next block's loads (pend).
    const bool late = do_out && output_late(yc, xc);
    VF pend[4] = {zerof(), zerof(), zerof(), zerof()};
    auto put = [&](const VF* v, Index i0) NL_FORCE_INLINE {
      for (int u = 0; u < 4; ++u) {
        if (st_c)
          stream(yc + i0 + u * kF, v[u]);
        else
          store(yc + i0 + u * kF, v[u]);
      }
    };
    auto columns = [&](auto late_c) NL_FORCE_INLINE {
      constexpr bool Late = decltype(late_c)::value;
      for (Index i = 0; i < n; i += 64) {
        if constexpr (Add) {
          if (add_f) {
            if (pf) {
              prefetch_ahead64(xf + i);
              prefetch_ahead64(rf + i);
            }
            for (int u = 0; u < 4; ++u) add_vec(sf, st_f, cf, xf, rf, i + u * kF);
          }
        } else if (pf) {
          prefetch_ahead64(first + i);
        }
        if (do_mean) mean_block64<Center>(a0, a1, a2, a3, xa + i);
        if (do_second) second_block64<Center>(q0, q1, xb + i, mhb);
        if (do_out) {
          VF v[4];
          for (int u = 0; u < 4; ++u) {
            const Index k = i + u * kF;
            v[u] = mul(dev<Center>(load(xc + k), mhc, mlc), rc);
            if constexpr (W) v[u] = mul(v[u], load(wp + k));
            if constexpr (B) v[u] = add(v[u], load(bp + k));
          }
          if constexpr (!Late) {
            put(v, i);
          } else {
            if (i > 0) put(pend, i - 64);
            for (int u = 0; u < 4; ++u) pend[u] = v[u];
          }
        }
      }
      if constexpr (Late) put(pend, n - 64);
    };
    if (late)
      columns(std::true_type{});
    else
      columns(std::false_type{});
    if (do_second) {
      finish_rstd(sb, hsum(add(q0, q1)), n, a.eps);
      if (a.mean) a.mean[(s - 1) * a.ld_stats] = sb.mh;
      if (a.rstd) a.rstd[(s - 1) * a.ld_stats] = sb.r;
      if constexpr (Save) {
        if (a.smean) a.smean[s - 1] = sb.mean;
        if (a.srstd) a.srstd[s - 1] = sb.rstd;
      }
    }
    if (s < rows) {
      RowStats& sa = st[s % 3];
      sa = RowStats{};
      if (Center) {
        VD sum;
        if constexpr (kIsBf16<T> && kBf16Pairs)
          sum = pairs_total(a0, a1, a2, a3);
        else
          sum = add(add(a0, a1), add(a2, a3));
        set_mean(sa, hsum(sum) / static_cast<double>(n));
      }
    }
  }
  if (a.stream) stream_fence();
}

// Out of cache on a Zen 5 (forward_in_registers, row_kernels.h): fp32 LayerNorm rows of NC = 64, 80, 128, 192
// or 256 elements, each loaded once into NC/kF vectors on which its three passes run, y written with ordinary
// stores (no streaming stores, no software prefetch). Each row's arithmetic is that of rows_forward_impl term
// by term: Σx as row_sum_vec (acc0..acc3 over consecutive eight-element pieces, the pieces of one vector
// being its cvt_lo and cvt_hi), the second pass as row_second_pass_vec (blocks of four vectors, a last block
// of fewer without the zero vectors), finish_rstd, row_output; so the same bits. Why (docs/PERFORMANCE.md,
// "forty-fifth session"): out of cache the eight-row blocks with streaming stores took about their in-L3 time
// plus a streaming copy of their bytes, or more, on this machine; this kernel (then one row at a time), of
// their time: at 1 thread 0.73-0.92 (scripts/ab-rows) at D = 64, 80, 128 and 0.75 at 192; with a copy of it
// beside the library in one process 0.61-0.92 at 1 thread and 0.68-1.16 at 2 (0.52-0.93 at 192). In cache it
// takes 1.2-1.55 times theirs, so only out of cache. D = 256 (16 vectors, one row at a time) since the
// fifty-fifth session: against the pipelined kernel through the driver's calls 0.85-0.99 of the time at 1
// thread and 0.76-0.89 at 2 in most runs (two runs at 2 threads, in one slow phase of the host, 1.11-1.14);
// with the fused add 0.74-0.78 and 0.70-0.84 (1.07-1.14 in that phase). Not taken: RMSNorm (no Σx stage in
// its eight-row blocks; 0.99-1.07), D = 96 and 160 (gains of 0-40 % at one thread count and none at the
// other), 384 (24 vectors, a loss), any length at run time (the row on the stack: 0.34-1.04), streaming
// stores at 256 (0.99-1.12 of the pipelined kernel's time where ordinary stores took 0.83-0.95;
// scripts/ab-rows, 1 thread).
// With Add (the fused residual add, RowsForwardOf::r), the row loaded is s = x + r, formed vector by vector
// and stored to a.s with ordinary stores before the passes run on it; so y, mean and rstd are those of the
// plain kernel on the stored s. Against the chunks of rows_add_forward (s formed for 64 KiB of rows, stored
// with streaming stores and copied into the scratch, then the eight-row blocks on the copy) 0.64, 0.69, 0.74
// and 0.74 of the time at D = 64, 80, 128 and 192 (scripts/ab-rows, 1 thread, 64 MiB per operand;
// docs/PERFORMANCE.md, "fifty-second session").
// Rows of 64 and 80 have their stages skewed (register_skew below). One row's steps form one chain (Σx, its
// horizontal sum, the division, the second pass and its sum, the square root, the output), and one row at a
// time the kernel was bound by it more than by memory: a row of 64 took 20.6 ns in L2 and 21.9 out of cache
// (the streaming copy of its bytes about 11; "fifty-third session"). With the stages of consecutive rows side
// by side in program order, each step's work waits on statistics that the step before computed.
// Without the fused add, rows of a.tuning.register_prefetch_min_n or more elements (row_kernels.h, RowTuning:
// 192) are prefetched kRegisterPrefetchBytes ahead as each row's Σx stage starts: every line of x that far
// on, into L1. Paired on a Zen 5 (docs/PERFORMANCE.md, "fifty-seventh session"; the kernel called as the
// driver calls it, the choice alternated round by round, 128 MiB per operand): at D = 256 0.91-0.98 of the
// time at 1 thread and 0.91-0.98 at 2 (0.86-0.91 in a slow phase of the host), at 192 0.92-1.00; at 128
// 1.01-1.08, and at 64 and 80 1.00-1.04 where the host was fast (0.93-0.96 only in its slow phases); 2 KiB
// ahead 0.94 at 256, 8 KiB 0.90-0.95, 16 KiB 0.99. With the fused add (x and r prefetched) 1.01-1.02 at 256,
// so not there; y's lines prefetched for writing as well (prefetchw, the same distance) 1.01-1.05.
inline constexpr Index kRegisterPrefetchBytes = 4096;

// What the register kernel reads of its argument block, copied once: the vector stores to y and s could
// alias the block (the vector types may alias anything), which the loop would otherwise reload after each
// row.
struct RegisterArgs {
  const float* x;
  const float* xr;
  float* s;
  float* y;
  const float* w;
  const float* b;
  float* mean;
  float* rstd;
  double* smean;
  double* srstd;
  Index ldx, ldr, lds, ldy, ld_stats;
  double eps;
  bool prefetch;  // the rows kRegisterPrefetchBytes ahead (rows_forward_registers)
  RegisterArgs(const RowsForwardOf<float>& a, bool prefetch_rows)
      : x(a.x),
        xr(a.r),
        s(a.s),
        y(a.y),
        w(a.w),
        b(a.b),
        mean(a.mean),
        rstd(a.rstd),
        smean(a.smean),
        srstd(a.srstd),
        ldx(a.ldx),
        ldr(a.ldr),
        lds(a.lds),
        ldy(a.ldy),
        ld_stats(a.ld_stats),
        eps(a.eps),
        prefetch(prefetch_rows) {}
};

// Stage 1 of row r: its vectors (with Add, s = x + r formed and stored vector by vector), Σx, the mean and
// mh, ml (as row_mean). (GCC 12.2's SLP vectorizer, pairing two rows' mh/ml, computed ml as mean − mean = 0:
// docs/PERFORMANCE.md, "fifty-third session". Nothing pairs them here: no vsubp[sd] x, x in the library's
// code; the register-row tests fail if anything does.)
// Scalar math: acc[(i / 8) % 4][i % 8] += double(x[i]); mean = hsum((acc0 + acc1) + (acc2 + acc3)) / n
template <int NC, bool Add>
NL_FORCE_INLINE inline void register_row_mean(VF* v, RowStats& st, const RegisterArgs& g, Index r) {
  constexpr int kV = NC / kF;
  const float* const x = g.x + r * g.ldx;
  if (g.prefetch) prefetch_ahead<kRegisterPrefetchBytes, (NC * static_cast<int>(sizeof(float)) + 63) / 64>(x);
  if constexpr (Add) {
    const float* const xr = g.xr + r * g.ldr;
    float* const s = g.s + r * g.lds;
    for (int j = 0; j < kV; ++j) v[j] = add_vec(s, false, nullptr, x, xr, j * kF);
  } else {
    for (int j = 0; j < kV; ++j) v[j] = load(x + j * kF);
  }
  VD a0 = cvt_lo(v[0]), a1 = cvt_hi(v[0]), a2 = cvt_lo(v[1]), a3 = cvt_hi(v[1]);
  for (int j = 2; j + 1 < kV; j += 2) {
    a0 = add(a0, cvt_lo(v[j]));
    a1 = add(a1, cvt_hi(v[j]));
    a2 = add(a2, cvt_lo(v[j + 1]));
    a3 = add(a3, cvt_hi(v[j + 1]));
  }
  if constexpr (kV % 2 == 1) {
    a0 = add(a0, cvt_lo(v[kV - 1]));
    a1 = add(a1, cvt_hi(v[kV - 1]));
  }
  set_mean(st, (hsum(add(add(a0, a1), add(a2, a3))) + 0.0) / static_cast<double>(NC));
}

// Stage 2: the second pass and rstd (as row_second_pass_vec and finish_rstd).
// Scalar math: e = x[i] − m_hi; per block of four vectors q = (e0·e0 + e1·e1) + (e2·e2 + e3·e3) in float,
// its lanes 0..7 and 8..15 added to two double accumulators; Σe² = hsum(acc_lo + acc_hi)
template <int NC>
NL_FORCE_INLINE inline void register_row_rstd(const VF* v, RowStats& st, double eps) {
  constexpr int kV = NC / kF;
  const VF mhv = bcast(st.mh);
  VD q0 = zerod(), q1 = zerod();
  for (int k = 0; k < kV; k += 4) {
    const int live = std::min(4, kV - k);
    VF e[4];
    for (int u = 0; u < live; ++u) e[u] = sub(v[k + u], mhv);
    const VF s2 = block_tree(live, [&](int u) { return mul(e[u], e[u]); });
    q0 = k == 0 ? cvt_lo(s2) : add(q0, cvt_lo(s2));
    q1 = k == 0 ? cvt_hi(s2) : add(q1, cvt_hi(s2));
  }
  finish_rstd(st, hsum(add(q0, q1)), NC, eps);
}

// Stage 3: row r's y with ordinary stores, and its statistics.
// Scalar math: y[i] = ((x[i] − mh) − ml)·r·w[i] + b[i], all in float (as row_output)
template <bool W, bool B, int NC, bool Save>
NL_FORCE_INLINE inline void register_row_output(const VF* v, const RowStats& st, const RegisterArgs& g,
                                                Index r) {
  constexpr int kV = NC / kF;
  if (g.mean) g.mean[r * g.ld_stats] = st.mh;
  if (g.rstd) g.rstd[r * g.ld_stats] = st.r;
  if constexpr (Save) {
    if (g.smean) g.smean[r] = st.mean;
    if (g.srstd) g.srstd[r] = st.rstd;
  }
  const VF mhv = bcast(st.mh), mlv = bcast(st.ml), rv = bcast(st.r);
  float* const y = g.y + r * g.ldy;
  for (int u = 0; u < kV; ++u) {
    VF o = mul(dev<true>(v[u], mhv, mlv), rv);
    if constexpr (W) o = mul(o, load(g.w + u * kF));
    if constexpr (B) o = add(o, load(g.b + u * kF));
    store(y + u * kF, o);
  }
}

// Whether the register kernel skews its rows' stages: each step writes row r's output, then takes row
// r + 2's Σx and row r + 1's second pass (three rows' vectors live), rather than each row's three stages in
// turn. Rows of 64 and 80 without the fused add. Through the library on a Zen 5 (its kernels called as the
// driver calls them, 16384 floats of rows per call, against the kernel before: one row at a time, rows of 64
// two at a time with their stages interleaved; 1 thread, 128 MiB per operand, the same bits;
// docs/PERFORMANCE.md, "fifty-fourth session") 0.85-0.91 of the time at D = 64 and 0.71-0.75 at 80. Not
// taken: with the fused add 0.96 at 64 and 1.02-1.04 at 80; at 128 1.25-1.5 (but 0.53-0.87 in one call over
// all rows, as scripts/ab-rows timed the forward until it took the driver's call size); a two-row skew (row
// r's output, then row r + 1's Σx and second pass) with the fused add 0.99-1.02 at 128 and 1.3-1.4 at 192.
template <int NC, bool Add>
constexpr bool register_skew() {
  return NC <= 80 && !Add;
}

template <bool W, bool B, int NC, bool Save, bool Add>
void rows_forward_registers(const RowsForwardOf<float>& a) {
  static_assert(NC % kF == 0 && NC >= 2 * kF);
  constexpr int kV = NC / kF;
  const RegisterArgs g(a, !Add && NC >= a.tuning.register_prefetch_min_n);
  const Index rows = a.rows;
  // A row's stages on its vectors v and statistics st.
  auto mean_of = [&](VF* v, RowStats& st, Index i)
                     NL_FORCE_INLINE { register_row_mean<NC, Add>(v, st, g, i); };
  auto rstd_of = [&](const VF* v, RowStats& st) NL_FORCE_INLINE { register_row_rstd<NC>(v, st, g.eps); };
  auto output = [&](const VF* v, const RowStats& st, Index i)
                    NL_FORCE_INLINE { register_row_output<W, B, NC, Save>(v, st, g, i); };
  if constexpr (register_skew<NC, Add>()) {
    if (rows >= 3) {
      VF v0[kV], v1[kV], v2[kV];
      RowStats s0, s1, s2;
      mean_of(v0, s0, 0);
      rstd_of(v0, s0);
      mean_of(v1, s1, 1);
      // c: row i (statistics done), m: row i + 1 (its mean done), n: row i + 2
      auto step = [&](const VF* cv, const RowStats& cs, const VF* mv, RowStats& ms, VF* nv, RowStats& ns,
                      Index i) NL_FORCE_INLINE {
        output(cv, cs, i);
        mean_of(nv, ns, i + 2);
        rstd_of(mv, ms);
      };
      auto finish = [&](const VF* cv, const RowStats& cs, const VF* mv, RowStats& ms,
                        Index i) NL_FORCE_INLINE {  // rows i, i + 1 the last two
        rstd_of(mv, ms);
        output(cv, cs, i);
        output(mv, ms, i + 1);
      };
      Index r = 0;
      for (; r + 5 <= rows; r += 3) {  // the three rows' roles rotate (no copies between them)
        step(v0, s0, v1, s1, v2, s2, r);
        step(v1, s1, v2, s2, v0, s0, r + 1);
        step(v2, s2, v0, s0, v1, s1, r + 2);
      }
      if (rows - r == 2) {  // rows r and r + 1 are in v0 and v1
        finish(v0, s0, v1, s1, r);
      } else if (rows - r == 3) {
        step(v0, s0, v1, s1, v2, s2, r);
        finish(v1, s1, v2, s2, r + 1);
      } else {  // 4
        step(v0, s0, v1, s1, v2, s2, r);
        step(v1, s1, v2, s2, v0, s0, r + 1);
        finish(v2, s2, v0, s0, r + 2);
      }
      return;
    }
  }
  for (Index r = 0; r < rows; ++r) {  // one row at a time, and calls of fewer rows than the skew takes
    VF v[kV];
    RowStats st;
    mean_of(v, st, r);
    rstd_of(v, st);
    output(v, st, r);
  }
}

template <bool W, bool B, bool Save, bool Add>
void rows_forward_registers_n(const RowsForwardOf<float>& a) {
  switch (a.n) {
    case 64:
      return rows_forward_registers<W, B, 64, Save, Add>(a);
    case 80:
      return rows_forward_registers<W, B, 80, Save, Add>(a);
    case 128:
      return rows_forward_registers<W, B, 128, Save, Add>(a);
    case 192:
      return rows_forward_registers<W, B, 192, Save, Add>(a);
    default:  // 256 (forward_in_registers)
      return rows_forward_registers<W, B, 256, Save, Add>(a);
  }
}

// The eight-row kernels at a compile-time length (NC) for the lengths listed, the run-time length otherwise;
// the same bits either way. fp32 rows of 8, 16, 24, 32 and 48 too: paired on a Zen 5 (scripts/ab-rows, 1
// thread; docs/PERFORMANCE.md, "forty-eighth session") the LayerNorm forward took 0.55-0.66 of the time at
// D = 8 to 24, 0.64-0.80 at 32 and 0.80-0.83 at 48, the backward 0.55-0.97 (D = 96 gained nothing). Not the
// 16-bit rows: the instantiations for three storage types would lengthen the kernels' compile by half.
template <bool Center, bool W, bool B, bool Save, typename T>
void rows_forward_batched_n(const RowsForwardOf<T>& a) {
  if constexpr (std::is_same_v<T, float>) {
    switch (a.n) {
      case 8:
        return rows_forward_batched<Center, W, B, 8, Save, T>(a);
      case 16:
        return rows_forward_batched<Center, W, B, 16, Save, T>(a);
      case 24:
        return rows_forward_batched<Center, W, B, 24, Save, T>(a);
      case 32:
        return rows_forward_batched<Center, W, B, 32, Save, T>(a);
      case 48:
        return rows_forward_batched<Center, W, B, 48, Save, T>(a);
      default:
        break;
    }
  }
  switch (a.n) {
    case 64:
      return rows_forward_batched<Center, W, B, 64, Save, T>(a);
    case 80:
      return rows_forward_batched<Center, W, B, 80, Save, T>(a);
    case 128:
      return rows_forward_batched<Center, W, B, 128, Save, T>(a);
    default:
      return rows_forward_batched<Center, W, B, 0, Save, T>(a);
  }
}

// Calls f(C, W, B) with std::bool_constant arguments for the runtime flags centre, weight, bias.
template <typename F>
void with_flags(bool center, bool w, bool b, F&& f) {
  auto on_b = [&](auto c, auto wc) {
    if (b)
      f(c, wc, std::true_type{});
    else
      f(c, wc, std::false_type{});
  };
  auto on_w = [&](auto c) {
    if (w)
      on_b(c, std::true_type{});
    else
      on_b(c, std::false_type{});
  };
  if (center)
    on_w(std::true_type{});
  else
    on_w(std::false_type{});
}

// The forward kernel for the row length: rows from registers where forward_in_registers says so
// (fp32 LayerNorm rows of 64, 80, 128, 192 or 256 out of cache on a Zen 5), eight-row blocks for short rows
// (forward_batched), the pipelined kernel where forward_pipelined says so (row_kernels.h: multiples of 64
// from 256 on, but on some machines not long fp32 LayerNorm rows out of cache), rows_forward_impl otherwise.
template <typename T>
void rows_forward_plain(const RowsForwardOf<T>& a) {
  const bool pipelined = forward_pipelined(a);
  const bool batched = forward_batched(a);
  const bool save = a.smean || a.srstd;
  with_flags(a.center, a.w != nullptr, a.b != nullptr, [&](auto c, auto w, auto b) {
    constexpr bool C = decltype(c)::value, W = decltype(w)::value, B = decltype(b)::value;
    auto run = [&](auto sv) {
      constexpr bool S = decltype(sv)::value;
      if constexpr (std::is_same_v<T, float> && C) {
        if (forward_in_registers(a)) {
          if (a.r) return rows_forward_registers_n<W, B, S, true>(a);
          return rows_forward_registers_n<W, B, S, false>(a);
        }
      }
      if (batched)
        rows_forward_batched_n<C, W, B, S>(a);
      else if (pipelined && a.r)
        rows_forward_pipelined<C, W, B, S, true>(a);
      else if (pipelined)
        rows_forward_pipelined<C, W, B, S, false>(a);
      else
        rows_forward_impl<C, W, B, S>(a);
    };
    if (save)
      run(std::true_type{});
    else
      run(std::false_type{});
  });
}

// s = x + r over `rows` rows of n (RowsForwardOf::r): the float sum of the widened values, rounded once
// to T by the store. With `copy` (ld n), s is also stored there with ordinary stores and goes to memory
// with non-temporal ones (rows whose start allows them). s may equal x or r (element by element).
template <typename T>
void add_rows(T* s, Index lds, T* copy, const T* x, Index ldx, const T* r, Index ldr, Index rows, Index n) {
  for (Index j = 0; j < rows; ++j) {
    T* sj = s + j * lds;
    const T* xj = x + j * ldx;
    const T* rj = r + j * ldr;
    T* cj = copy ? copy + j * n : nullptr;
    const bool nt = cj && stream_ok(sj);
    Index i = 0;
    for (; i + kF <= n; i += kF) add_vec(sj, nt, cj, xj, rj, i);
    if (i < n) {
      // Scalar math: as add_vec, the last k < kF elements (ordinary stores)
      const int k = static_cast<int>(n - i);
      const VF v = add(load_n(xj + i, k), load_n(rj + i, k));
      if (cj) store_n(cj + i, v, k);
      store_n(sj + i, v, k);
    }
  }
}

// The fused residual add + norm forward (RowsForwardOf::r) for rows that do not take the pipelined kernel:
// per chunk of rows, s, then the plain kernel on the stored s (or on its copy in work).
template <typename T>
void rows_add_forward(const RowsForwardOf<T>& a) {
  const Index chunk = add_chunk_rows(a.n);
  const bool nt = a.stream && a.work;
  for (Index r0 = 0; r0 < a.rows; r0 += chunk) {
    const Index nr = std::min(chunk, a.rows - r0);
    T* s = a.s + r0 * a.lds;
    add_rows(s, a.lds, nt ? a.work : nullptr, a.x + r0 * a.ldx, a.ldx, a.r + r0 * a.ldr, a.ldr, nr, a.n);
    RowsForwardOf<T> b = a;
    b.r = nullptr;
    b.s = b.work = nullptr;
    b.x = nt ? a.work : s;
    b.x_cached = true;
    b.ldx = nt ? a.n : a.lds;
    b.y = a.y + r0 * a.ldy;
    b.rows = nr;
    if (b.mean) b.mean += r0 * a.ld_stats;
    if (b.rstd) b.rstd += r0 * a.ld_stats;
    if (b.smean) b.smean += r0;
    if (b.srstd) b.srstd += r0;
    rows_forward_plain(b);
  }
  if (nt) stream_fence();
}

// The fused add: in the pipelined kernel or from registers where the rows take them (row by row), else by
// chunks.
template <typename T>
void rows_forward_of(const RowsForwardOf<T>& a) {
  if (a.r && !forward_fuses_add(a)) return rows_add_forward(a);
  rows_forward_plain(a);
}

// The column pass of a full group of long rows (n ≥ kSplitMinN) runs in two halves when the group's stores
// to dx start near its loads of x and dy modulo 4 KiB (column_halves): per chunk of kSplitChunk columns,
// rows 0 and 1, then rows 2 and 3, with the pair sums t0 + t1 of the dγ/dβ terms kept in float in an L1
// scratch, so that the group sum (t0 + t1) + (t2 + t3) and every result keep their bits. Such layouts are
// what separate allocations of rows of 1024·k floats get (each buffer at the same offset in its page):
// twelve streams of loads and stores at the same offsets in their pages. There, the LayerNorm backward took
// 1.5-1.8× the time of a layout with dx 1-2 KiB away from x and dy (paired runs at 512x1024 and 128x4096,
// 1 thread, in L3; docs/PERFORMANCE.md, "seventeenth session"); the halves run it 1.3-1.6× faster there.
// In layouts that do not need them they cost 3-12 %, so column_halves picks them by the addresses.
inline constexpr Index kSplitChunk = 256;

// The column pass of the backward over one group of nr ≤ kParamGradRowGroup rows starting at row r0 of
// the call: dx of the rows and the group's dγ/dβ contributions (row_norm.cpp: groups of four rows from
// the first row of a call; the first group of a call with init assigns the partial rows).
// NR > 0: nr == NR, known at compile time. Halves (with NR == 4): the pass in two halves (above).
// next[0 .. nnext): rows of the next group (next_group_rows) whose lines the pass prefetches into L2, line
// i of each at column i (the halves split them between them).
// (GCC 12 warns that tw may be unset where group(tw) sums it: it is set wherever want_w is, and only then
// summed. Setting it to zero otherwise changed the code GCC made of the loop: 2-7 % slower at D = 256, 768.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <bool Center, bool W, int NR, bool Halves = false, typename T>
inline void backward_columns(const RowsBackwardOf<T>& a, Index r0, int nr_, const float* mhs,
                             const float* mls, const float* rs, const float* c0s, const float* c2s,
                             std::type_identity_t<const T* const*> next, int nnext) {
  constexpr int R = kParamGradRowGroup;
  const int nr = NR > 0 ? NR : nr_;
  const Index n = a.n;
  // Locals: the stores to dx could alias the argument block otherwise.
  const float* const wp = a.w;
  double* const dwp = a.dw;
  double* const dbp = a.db;
  const bool with_ds = a.ds != nullptr;
  const T* xs[R];
  const T* dys[R];
  const T* dss[R];
  T* dxs[R];
  bool st_ok[R];
  const bool nt = stream_rows(a);  // streaming stores where a row's vectors are aligned for them
  VF mh[R], ml[R], r[R], c0[R], c2[R];
  for (int j = 0; j < nr; ++j) {
    xs[j] = a.x + (r0 + j) * a.ldx;
    dys[j] = a.dy + (r0 + j) * a.lddy;
    dss[j] = with_ds ? a.ds + (r0 + j) * a.ldds : nullptr;
    dxs[j] = a.dx + (r0 + j) * a.lddx;
    st_ok[j] = nt && stream_ok(dxs[j]);
    mh[j] = bcast(mhs[j]);
    ml[j] = bcast(mls[j]);
    r[j] = bcast(rs[j]);
    c0[j] = bcast(c0s[j]);
    c2[j] = bcast(c2s[j]);
  }
  const bool first = a.init && r0 == 0;
  const VF z = zerof();
  // Scalar math (per column i, rows j of the group in order):
  //   d = (x[j][i] − mh) − ml; g = dy[j][i]·w[i]; dx[j][i] = r·((g − c0) − d·c2) (+ ds[j][i]),
  //   c0 = float(mean_g), c2 = float(rstd·mean_gx̂);
  //   tw[j] = dy[j][i]·(d·r); tb[j] = dy[j][i]                       (float)
  //   pw = (tw[0] + tw[1]) + (tw[2] + tw[3]) in float (fewer rows: the terms there are); pb likewise
  //   dw[i] = (first ? 0 : dw[i]) + double(pw); db likewise
  // (Summing the group in float needs one conversion to double per column and group instead of one per
  // element: the backward gains up to 1.27× in L3, docs/PERFORMANCE.md.)
  // The loop over the columns, with three conditions fixed at compile time: Fast (no ds, no streaming
  // stores, dγ wanted: the common case, whose loop then tests nothing per row), FastB (with Fast: dβ wanted
  // too; LayerNorm wants it, RMSNorm has no β) and First (this group assigns the partial rows).
  auto columns = [&](auto fast_c, auto fast_b_c, auto first_c) NL_FORCE_INLINE {
    constexpr bool Fast = decltype(fast_c)::value;
    constexpr bool FastB = Fast && decltype(fast_b_c)::value;
    constexpr bool First = decltype(first_c)::value;
    // Whether dγ, dβ are summed: fixed at compile time with Fast, else per call.
    const bool want_w = Fast || dwp, want_b = Fast ? FastB : dbp != nullptr;
    // The floats at columns i .. i + k of the row at p (the tail: k < kF, the rest of the vector 0).
    auto cols = [](const auto* p, Index i, int k, bool tail)
                    NL_FORCE_INLINE { return tail ? load_n(p + i, k) : load(p + i); };
    // dx of row j at columns i .. i + k from its loaded x and dy (xv, dyv), stored; its dγ, dβ terms into
    // tw, tb.
    auto row_dx = [&](int j, Index i, int k, bool tail, VF xv, VF dyv, VF wv, VF& tw, VF& tb)
                      NL_FORCE_INLINE {
                        const VF d = dev<Center>(xv, mh[j], ml[j]);
                        const VF g = W ? mul(dyv, wv) : dyv;
                        VF gc = g;
                        if constexpr (Center) gc = sub(gc, c0[j]);
                        VF dx = mul(r[j], sub(gc, mul(d, c2[j])));
                        if (!Fast && with_ds) dx = add(dx, cols(dss[j], i, k, tail));
                        if (tail)
                          store_n(dxs[j] + i, dx, k);
                        else if (!Fast && st_ok[j])
                          stream(dxs[j] + i, dx);
                        else
                          store(dxs[j] + i, dx);
                        if (want_w) tw = mul(dyv, mul(d, r[j]));
                        tb = dyv;  // (summed only where want_b)
                      };
    // The group's float sums of the terms at columns i .. i + k (gw, gb), converted to double and added to
    // (First: assigned to) the partial rows dw, db.
    auto flush_sums = [&](Index i, int k, bool tail, VF gw, VF gb) NL_FORCE_INLINE {
      auto flush = [&](double* part, VD p0, VD p1) NL_FORCE_INLINE {
        if (!tail) {
          if (First) {
            stored(part + i, p0);
            stored(part + i + kD, p1);
          } else {
            stored(part + i, add(loadd(part + i), p0));
            stored(part + i + kD, add(loadd(part + i + kD), p1));
          }
          return;
        }
        double t[kF];
        stored(t, p0);
        stored(t + kD, p1);
        for (int l = 0; l < k; ++l) part[i + l] = First ? t[l] : part[i + l] + t[l];
      };
      if (want_w) flush(dwp, cvt_lo(gw), cvt_hi(gw));
      if (want_b) flush(dbp, cvt_lo(gb), cvt_hi(gb));
    };
    // The line at column i of each of next[j0 .. j1), into L2, at the columns that start a line of the row
    // (every vector of 16 floats; every other one of 8 floats or of 16-bit types). Not Fast: next is only
    // given out of cache (streaming stores). (A separate instantiation for nnext == 0 made the kernel up to
    // 5 % slower at D = 256, where it has none: GCC then compiled the rest differently.)
    auto prefetch_next = [&](Index i, int j0, int j1) NL_FORCE_INLINE {
      constexpr Index kLineStep = std::max<Index>(1, 64 / Index{sizeof(T) * kF}) * kF;
      if (!Fast && i % kLineStep == 0)
        for (int j = j0; j < j1; ++j) __builtin_prefetch(next[j] + i, 0, 2);
    };
    auto column = [&](Index i, int k, bool tail) NL_FORCE_INLINE {
      prefetch_next(i, 0, nnext);
      const VF wv = W ? cols(wp, i, k, tail) : z;
      VF tw[R], tb[R];  // the rows' fp32 terms of dγ, dβ
      for (int j = 0; j < nr; ++j) {
        row_dx(j, i, k, tail, cols(xs[j], i, k, tail), cols(dys[j], i, k, tail), wv, tw[j], tb[j]);
      }
      // The group's sum of the terms in fp32, (t0 + t1) + (t2 + t3) (fewer rows: the terms there are).
      auto group = [&](const VF* t) NL_FORCE_INLINE {
        if (nr == 1) return t[0];
        if (nr == 2) return add(t[0], t[1]);
        if (nr == 3) return add(add(t[0], t[1]), t[2]);
        return add(add(t[0], t[1]), add(t[2], t[3]));
      };
      flush_sums(i, k, tail, want_w ? group(tw) : z, want_b ? group(tb) : z);
    };
    // Full groups of long rows: per chunk of kSplitChunk columns, rows 0 and 1, then rows 2 and 3, the
    // pair sums (t0 + t1) of the first half kept in float in an L1 scratch (the same bits as column()).
    if constexpr (Halves && NR == 4) {
      alignas(64) float sw[kSplitChunk], sb[kSplitChunk];
      auto half = [&](Index cb, Index i, int k, bool tail, int h) NL_FORCE_INLINE {
        prefetch_next(i, h * nnext / 2, (h + 1) * nnext / 2);
        const VF wv = W ? cols(wp, i, k, tail) : z;
        VF tw[2], tb[2];
        VF xv[2], dyv[2];
        for (int u = 0; u < 2; ++u) {
          const int j = 2 * h + u;
          xv[u] = cols(xs[j], i, k, tail);
          dyv[u] = cols(dys[j], i, k, tail);
        }
        for (int u = 0; u < 2; ++u) row_dx(2 * h + u, i, k, tail, xv[u], dyv[u], wv, tw[u], tb[u]);
        float* const pw = sw + (i - cb);
        float* const pb = sb + (i - cb);
        if (h == 0) {
          if (want_w) store(pw, add(tw[0], tw[1]));
          if (want_b) store(pb, add(tb[0], tb[1]));
          return;
        }
        flush_sums(i, k, tail, want_w ? add(load(pw), add(tw[0], tw[1])) : z,
                   want_b ? add(load(pb), add(tb[0], tb[1])) : z);
      };
      for (Index cb = 0; cb < n; cb += kSplitChunk) {
        const Index ce = std::min(n, cb + kSplitChunk);
        for (int h = 0; h < 2; ++h) {
          Index i = cb;
          for (; i + kF <= ce; i += kF) half(cb, i, kF, false, h);
          if (i < ce) half(cb, i, static_cast<int>(ce - i), true, h);
        }
      }
      return;
    }
    Index i = 0;
    for (; i + kF <= n; i += kF) column(i, kF, false);
    if (i < n) column(i, static_cast<int>(n - i), true);
  };
  const bool fast = !with_ds && !nt && dwp;
  auto on_first = [&](auto fast_c, auto fast_b_c) NL_FORCE_INLINE {
    if (first)
      columns(fast_c, fast_b_c, std::true_type{});
    else
      columns(fast_c, fast_b_c, std::false_type{});
  };
  if (fast && dbp)
    on_first(std::true_type{}, std::true_type{});
  else if (fast)
    on_first(std::true_type{}, std::false_type{});
  else
    on_first(std::false_type{}, std::false_type{});
}
#pragma GCC diagnostic pop

// The per-group constants of the backward from the statistics of a row (docs/numerics.md, 6-7):
// dx = rstd·(g − mean_g − x̂·mean_gx̂) = r·((g − mean_g) − d·(rstd·mean_gx̂)), mean_g = Σg/n (Center),
// mean_gx̂ = rstd·Σg·d/n with Σg·d = Σg·e − m_lo·Σg; c0 = float(mean_g), c2 = float(rstd·mean_gx̂).
template <bool Center>
inline void backward_consts(float* c0, float* c2, double sg, double sge, double rstd, float ml, double nd) {
  const double mean_g = Center ? sg / nd : 0.0;
  const double sgd = sge - static_cast<double>(ml) * sg;
  const double mean_gxh = rstd * sgd / nd;
  *c0 = static_cast<float>(mean_g);
  *c2 = static_cast<float>(rstd * mean_gxh);
}

// backward_consts for eight rows (the batched backward), from hsum8's sums (which want + 0.0): one vector
// instruction per operation instead of eight scalar chains with two divisions each. The same IEEE
// operations per lane, so the same bits.
template <bool Center>
inline void backward_consts8(float* c0, float* c2, const double* sg, const double* sge, const double* rstd,
                             const float* ml, double nd) {
#if NL_VEC_AVX512
  const __m512d z = _mm512_setzero_pd(), n = _mm512_set1_pd(nd);
  const __m512d s = _mm512_add_pd(_mm512_loadu_pd(sg), z);
  const __m512d se = _mm512_add_pd(_mm512_loadu_pd(sge), z);
  const __m512d r = _mm512_loadu_pd(rstd);
  const __m512d mean_g = Center ? _mm512_div_pd(s, n) : z;
  const __m512d sgd = _mm512_sub_pd(se, _mm512_mul_pd(_mm512_maskz_cvtps_pd(0xFF, _mm256_loadu_ps(ml)), s));
  const __m512d mean_gxh = _mm512_div_pd(_mm512_mul_pd(r, sgd), n);
  _mm256_storeu_ps(c0, _mm512_maskz_cvtpd_ps(0xFF, mean_g));
  _mm256_storeu_ps(c2, _mm512_maskz_cvtpd_ps(0xFF, _mm512_mul_pd(r, mean_gxh)));
#elif NL_VEC_AVX2
  for (int h = 0; h < 2; ++h) {
    const __m256d z = _mm256_setzero_pd(), n = _mm256_set1_pd(nd);
    const __m256d s = _mm256_add_pd(_mm256_loadu_pd(sg + 4 * h), z);
    const __m256d se = _mm256_add_pd(_mm256_loadu_pd(sge + 4 * h), z);
    const __m256d r = _mm256_loadu_pd(rstd + 4 * h);
    const __m256d mean_g = Center ? _mm256_div_pd(s, n) : z;
    const __m256d sgd = _mm256_sub_pd(se, _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(ml + 4 * h)), s));
    const __m256d mean_gxh = _mm256_div_pd(_mm256_mul_pd(r, sgd), n);
    _mm_storeu_ps(c0 + 4 * h, _mm256_cvtpd_ps(mean_g));
    _mm_storeu_ps(c2 + 4 * h, _mm256_cvtpd_ps(_mm256_mul_pd(r, mean_gxh)));
  }
#else
  for (int j = 0; j < 8; ++j)
    backward_consts<Center>(&c0[j], &c2[j], sg[j] + 0.0, sge[j] + 0.0, rstd[j], ml[j], nd);
#endif
}

// Out of cache (with the prefetches of rows_backward_impl, `ahead`), the column pass of a group of four rows
// prefetches rows of the next group of the call into L2 (backward_columns), so that the next group's first
// passes find them there, read while this group's pass (which reads nothing from memory) streams dx out: x
// where a Σx pass reads it first (the LayerNorm backward recomputing its statistics), or, for the kernels
// without one (from saved statistics, RMSNorm), x where LayerNorm rows have kNextGroupSavedMinN elements or
// more, x and dy from kNextGroupBothMinN. Paired runs on the Intel Xeon (1 thread, 128 MiB of x;
// docs/PERFORMANCE.md, "thirty-sixth session"), normlab_bench's kernels new against old at D = 256, 768,
// 4096: the LayerNorm backward 0.95, 0.98, 0.90 of the time, from saved statistics 0.99, 0.97, 0.85, RMSNorm
// 0.98, 0.95, 0.87, bf16 LayerNorm 1.01, 0.91, 0.92 (2 threads: 0.85-0.92 at 4096); scripts/ab-rows on AVX2
// 0.85-0.91 at 4096, 0.93-1.00 at 768. RMSNorm from saved statistics lost 1-2 % with x alone at 512 and 768,
// and LayerNorm from saved statistics at 256; prefetching dy too where there is a Σx pass gained nothing
// more. Returns how many rows it put in next (at most 2·R).
inline constexpr Index kNextGroupSavedMinN = 512;
inline constexpr Index kNextGroupBothMinN = 2048;
template <bool Center, bool Saved, typename T>
inline int next_group_rows(const RowsBackwardOf<T>& a, Index r0, const T** next) {
  constexpr int R = kParamGradRowGroup;
  const Index n = a.n, first = r0 + R;
  if (first >= a.rows) return 0;
  const bool sum_pass = Center && !Saved;
  const bool with_x = sum_pass || (Center && n >= kNextGroupSavedMinN) || n >= kNextGroupBothMinN;
  const bool with_dy = !sum_pass && n >= kNextGroupBothMinN;
  const int rows = static_cast<int>(std::min<Index>(R, a.rows - first));
  int k = 0;
  if (with_x)
    for (int j = 0; j < rows; ++j) next[k++] = a.x + (first + j) * a.ldx;
  if (with_dy)
    for (int j = 0; j < rows; ++j) next[k++] = a.dy + (first + j) * a.lddy;
  return k;
}

template <bool Center, bool W, bool Saved, typename T>
void rows_backward_impl(const RowsBackwardOf<T>& a) {
  const Index n = a.n;
  constexpr int R = kParamGradRowGroup;
  const double nd = static_cast<double>(n);
  const bool ahead = a.stream && !a.cached && n >= a.tuning.backward_prefetch_min_n;
  for (Index r0 = 0; r0 < a.rows; r0 += R) {
    const int nr = static_cast<int>(std::min<Index>(R, a.rows - r0));
    const T* xs[R];
    const T* dys[R];
    RowStats st[R];
    float mh[R], ml[R], r[R], c0[R], c2[R];
    for (int j = 0; j < nr; ++j) {
      xs[j] = a.x + (r0 + j) * a.ldx;
      dys[j] = a.dy + (r0 + j) * a.lddy;
      if constexpr (Saved)
        saved_stats<Center>(st[j], a.smean, a.srstd, r0 + j);
      else
        row_mean<Center>(xs[j], n, st[j], ahead && Center);
    }
    SecondPass sp[R];
    for (int j = 0; j < nr; ++j)
      sp[j] = row_second_pass<Center, true, W, !Saved>(xs[j], dys[j], a.w, n, bcast(st[j].mh),
                                                       ahead && (Saved || !Center), ahead);
    for (int j = 0; j < nr; ++j) {
      if constexpr (!Saved) finish_rstd(st[j], sp[j].sq, n, a.eps);
      backward_consts<Center>(&c0[j], &c2[j], sp[j].sg, sp[j].sge, st[j].rstd, st[j].ml, nd);
      mh[j] = st[j].mh;
      ml[j] = st[j].ml;
      r[j] = st[j].r;
    }
    const T* next[2 * R];
    const int nnext = ahead ? next_group_rows<Center, Saved>(a, r0, next) : 0;
    if (nr == R && n >= kSplitMinN && column_halves(a, r0))
      backward_columns<Center, W, R, true>(a, r0, nr, mh, ml, r, c0, c2, next, nnext);
    else if (nr == R)
      backward_columns<Center, W, R>(a, r0, nr, mh, ml, r, c0, c2, next, nnext);
    else
      backward_columns<Center, W, 0>(a, r0, nr, mh, ml, r, c0, c2, next, nnext);
  }
  if (a.stream) stream_fence();
}

// The backward for short rows (n ≤ kBatchMaxN, where backward_batched says so) in blocks of eight rows (two
// groups of the dγ/dβ order), software-pipelined like rows_forward_batched: step s runs the column passes of
// block s − 2, the second passes of block s − 1 with their rstd and constants together, and Σx of block s
// with the means together. Same arithmetic and bits as rows_backward_impl. dx may equal dy or x: a row's dx
// is written by the column pass after both statistics passes have read the row.
template <bool Center, bool W, int NC, bool Saved, typename T>
void rows_backward_batched(const RowsBackwardOf<T>& a) {
  const Index n = NC > 0 ? NC : a.n;
  const double nd = static_cast<double>(n);
  const Index blocks = (a.rows + 7) / 8;
  struct Block {
    Stats8 st;
    alignas(32) float c0[8];
    alignas(32) float c2[8];
  };
  Block bl[3];  // by block index mod 3
  const bool ahead = sizeof(T) == 2 && a.tuning.batched_prefetch && a.stream && !a.cached;
  const Index row_lines = (n * Index{sizeof(T)} + 63) / 64;
  for (Index s = 0; s < blocks + 2; ++s) {
    VD acc[8];
    double t[8];
    if (ahead && s + kBatchPrefetchBlocks < blocks) {
      const Index r0 = (s + kBatchPrefetchBlocks) * 8, r1 = std::min<Index>(a.rows, r0 + 8);
      for (Index r = r0; r < r1; ++r) {
        prefetch_lines(reinterpret_cast<std::uintptr_t>(a.x + r * a.ldx), row_lines);
        prefetch_lines(reinterpret_cast<std::uintptr_t>(a.dy + r * a.lddy), row_lines);
      }
    }
    if (s >= 2) {  // the column passes of block s − 2, in groups of kParamGradRowGroup rows
      const Index blk = s - 2;
      const Block& c = bl[blk % 3];
      const Index r0 = blk * 8;
      const int nr = static_cast<int>(std::min<Index>(8, a.rows - r0));
      for (int j = 0; j < nr; j += kParamGradRowGroup) {
        const int g = std::min(kParamGradRowGroup, nr - j);
        if (g == kParamGradRowGroup)
          backward_columns<Center, W, kParamGradRowGroup>(a, r0 + j, g, c.st.mh + j, c.st.ml + j, c.st.r + j,
                                                          c.c0 + j, c.c2 + j, nullptr, 0);
        else
          backward_columns<Center, W, 0>(a, r0 + j, g, c.st.mh + j, c.st.ml + j, c.st.r + j, c.c0 + j,
                                         c.c2 + j, nullptr, 0);
      }
    }
    if (s >= 1 && s - 1 < blocks) {  // the second passes, rstd and constants of block s − 1
      const Index blk = s - 1;
      Block& b = bl[blk % 3];
      const Index r0 = blk * 8, last = a.rows - 1;
      // The accumulators go through memory: kept in arrays of VD, GCC 12 split them on AVX2 into 64-bit
      // pieces moved through general registers (vmovq/vpinsrq), and the backward at D = 64 and 80 took
      // 1.09–1.17× as long (docs/PERFORMANCE.md, eighth session).
      alignas(64) double vq[8][kD], vg[8][kD], vge[8][kD];
      for (int j = 0; j < 8; ++j) {
        const Index row = std::min(r0 + j, last);
        const SecondPassVec v = row_second_pass_vec<Center, true, W, !Saved>(
            a.x + row * a.ldx, a.dy + row * a.lddy, a.w, n, bcast(b.st.mh[j]));
        if constexpr (!Saved) stored(vq[j], v.sq);
        stored(vg[j], v.sg);
        stored(vge[j], v.sge);
      }
      auto hsum8_of = [&](double* out, const double(*m)[kD]) NL_FORCE_INLINE {
        VD u[8];
        for (int j = 0; j < 8; ++j) u[j] = loadd(m[j]);
        hsum8(out, u);
      };
      if constexpr (!Saved) {
        hsum8_of(t, vq);
        rstd8(b.st, t, nd, a.eps);
      }
      double sg[8], sge[8];
      hsum8_of(sg, vg);
      hsum8_of(sge, vge);
      backward_consts8<Center>(b.c0, b.c2, sg, sge, b.st.rstd, b.st.ml, nd);
    }
    if (s < blocks) {  // Σx and the means of block s
      Stats8& st = bl[s % 3].st;
      if constexpr (Saved) {  // the saved mean and rstd instead (row_mean's and rstd8's values)
        const Index r0 = s * 8, last = a.rows - 1;
        for (int j = 0; j < 8; ++j) {
          RowStats rs;
          saved_stats<Center>(rs, a.smean, a.srstd, std::min(r0 + j, last));
          st.mean[j] = rs.mean;
          st.mh[j] = rs.mh;
          st.ml[j] = rs.ml;
          st.rstd[j] = rs.rstd;
          st.r[j] = rs.r;
        }
      } else if constexpr (Center) {
        const Index r0 = s * 8, last = a.rows - 1;
        for (int j = 0; j < 8; ++j) acc[j] = row_sum_vec(a.x + std::min(r0 + j, last) * a.ldx, n);
        hsum8(t, acc);
        mean8(st, t, nd);
      } else {
        for (int j = 0; j < 8; ++j) st.mh[j] = st.ml[j] = 0.0f;
      }
    }
  }
  if (a.stream) stream_fence();
}

// As rows_forward_batched_n, for the backward.
template <bool Center, bool W, bool Saved, typename T>
void rows_backward_batched_n(const RowsBackwardOf<T>& a) {
  if constexpr (std::is_same_v<T, float>) {
    switch (a.n) {
      case 8:
        return rows_backward_batched<Center, W, 8, Saved>(a);
      case 16:
        return rows_backward_batched<Center, W, 16, Saved>(a);
      case 24:
        return rows_backward_batched<Center, W, 24, Saved>(a);
      case 32:
        return rows_backward_batched<Center, W, 32, Saved>(a);
      case 48:
        return rows_backward_batched<Center, W, 48, Saved>(a);
      default:
        break;
    }
  }
  switch (a.n) {
    case 64:
      return rows_backward_batched<Center, W, 64, Saved>(a);
    case 80:
      return rows_backward_batched<Center, W, 80, Saved>(a);
    default:
      return rows_backward_batched<Center, W, 0, Saved>(a);
  }
}

template <bool Saved, typename T>
void rows_backward_saved(const RowsBackwardOf<T>& a) {
  const bool w = a.w != nullptr;
  if (backward_batched(a)) {
    if (a.center)
      return w ? rows_backward_batched_n<true, true, Saved>(a)
               : rows_backward_batched_n<true, false, Saved>(a);
    return w ? rows_backward_batched_n<false, true, Saved>(a)
             : rows_backward_batched_n<false, false, Saved>(a);
  }
  if (a.center)
    return w ? rows_backward_impl<true, true, Saved>(a) : rows_backward_impl<true, false, Saved>(a);
  return w ? rows_backward_impl<false, true, Saved>(a) : rows_backward_impl<false, false, Saved>(a);
}

template <typename T>
void rows_backward_of(const RowsBackwardOf<T>& a) {
  if (a.srstd) return rows_backward_saved<true>(a);
  rows_backward_saved<false>(a);
}

#ifndef NL_ROWS_TEMPLATES_ONLY
void rows_forward(const RowsForward& a) {
  rows_forward_of(a);
}
void rows_backward(const RowsBackward& a) {
  rows_backward_of(a);
}
#endif

}  // namespace

#ifndef NL_ROWS_TEMPLATES_ONLY
extern const RowKernels kTable;
const RowKernels kTable = {vec::leave_clean<rows_forward>, vec::leave_clean<rows_backward>};
#endif

}  // namespace normlab::kernels::NL_TARGET

#undef NL_ROWS_TEMPLATES_ONLY
