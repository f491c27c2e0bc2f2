// A small fixed-width vector layer for the per-target kernels (internal).
//
// VF holds 16 floats, VD 8 doubles, on every target:
//   AVX-512: one __m512 / __m512d;
//   AVX2:    two __m256 / __m256d (lanes 0..7, 8..15 of VF; 0..3, 4..7 of VD);
//   scalar:  GCC generic vectors of 16 floats / 8 doubles (lowered to SSE2).
// Every operation is lane-wise IEEE arithmetic (add, sub, mul, div, sqrtd, float→double conversion, which
// is exact, and double→float rounding to nearest)
// with the same lane semantics on each target, and the horizontal sum hsum() combines lanes by one fixed
// tree; gather() loads floats a fixed stride apart into the lanes (gatherd() and gather_cvt() doubles and
// floats into double lanes, scatterd() stores them back; load_cols8_cvt() an 8x8 block's columns),
// pick() selects lanes by index. No operation fuses a multiply and an add (the kernels are compiled with
// -ffp-contract=off and the intrinsics used are plain mul/add), so a kernel written against this layer
// produces the same bits on every target.
// Tails use zero-filled loads and masked stores, which never change a result.
//
// Include only from a file compiled per target (row_kernels-inl.h) with NL_TARGET defined; the code
// lives in namespace normlab::kernels::NL_TARGET::vec, so the per-target definitions never collide.
//
// 16-bit storage (bf16, fp16): load / load_n / load_cvt / store / store_n / stream also take bfloat16 and
// float16 pointers (16 halves ↔ one VF). Loads widen exactly; stores round to nearest even with the NaN
// rule of normlab::bfloat16 / normlab::float16 (include/normlab/tensor.h), the same bits on every target
// (AVX-512: integer rounding for bf16, F16C for fp16, with AVX512_BF16 (target avx512bf16) its conversion
// instruction for bf16; AVX2: the same at 8 lanes; scalar: the same rule on generic integer vectors for bf16,
// the functions of tensor.h for fp16). A kernel written for float therefore runs on bf16/fp16 rows unchanged:
// each element is read and written at 2 bytes, and its values are round(the float kernel on the widened
// data).
#pragma once

#ifndef NL_TARGET
#error "define NL_TARGET before including simd/vec.h"
#endif

#include <normlab/tensor.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#if !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__F16C__)
#error "the AVX-512 vector layer needs AVX512BW, AVX512VL and F16C (16-bit storage loads and stores)"
#endif
#define NL_VEC_AVX512 1
#if defined(__AVX512BF16__)
#define NL_VEC_AVX512BF16 1  // the avx512bf16 target: bf16 rounding stores by vcvtneps2bf16
#endif
#include <immintrin.h>
#elif defined(__AVX2__)
#if !defined(__F16C__)
#error "the AVX2 vector layer needs F16C (fp16 storage loads and stores)"
#endif
#define NL_VEC_AVX2 1
#include <immintrin.h>
#else
#define NL_VEC_SCALAR 1
#endif

// NL_FORCE_INLINE: the kernels' hot helpers and lambdas are always inlined where GCC's inlining budget would
// leave some of their instantiations out of line (row_kernels-inl.h says where that cost speed). Without
// optimization (-O0, the sanitizer build) nothing is gained by it, and forced inlining there only builds
// huge functions whose register allocation took most of that build's compile time, so it expands to
// nothing. Inlining never changes a result: the kernels are compiled with -ffp-contract=off.
#ifndef NL_FORCE_INLINE
#ifdef __OPTIMIZE__
#define NL_FORCE_INLINE __attribute__((always_inline))
#else
#define NL_FORCE_INLINE
#endif
#endif

namespace normlab::kernels::NL_TARGET::vec {

inline constexpr int kF = 16;  // floats per VF
inline constexpr int kD = 8;   // doubles per VD

// The 16-bit storage types the vector layer loads and stores.
template <typename T>
concept Half = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;
template <typename T>
inline constexpr bool kIsBf16 = std::is_same_v<T, bfloat16>;

// Whether stream() issues non-temporal stores on this target (it needs a 64-byte aligned address).
inline bool aligned64(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 63) == 0; }

#if NL_VEC_AVX512 || NL_VEC_AVX2
// The 8x8 float block whose row l is at p + l·stride, transposed: r[k] lane l = p[l·stride + k] (for
// load_cols8_cvt; moves only, so the values are exact).
inline void load_transpose8(__m256* r, const float* p, Index stride) {
  __m256 a[8], b[8];
  for (int l = 0; l < 8; ++l) a[l] = _mm256_loadu_ps(p + l * stride);
  for (int l = 0; l < 8; l += 2) {
    b[l] = _mm256_unpacklo_ps(a[l], a[l + 1]);      // lanes: (l,0) (l+1,0) (l,1) (l+1,1) | (l,4) ...
    b[l + 1] = _mm256_unpackhi_ps(a[l], a[l + 1]);  // (l,2) (l+1,2) (l,3) (l+1,3) | (l,6) ...
  }
  for (int h = 0; h < 8; h += 4) {
    a[h] = _mm256_shuffle_ps(b[h], b[h + 2], 0x44);          // column 0 of rows h..h+3 | column 4
    a[h + 1] = _mm256_shuffle_ps(b[h], b[h + 2], 0xEE);      // column 1 | 5
    a[h + 2] = _mm256_shuffle_ps(b[h + 1], b[h + 3], 0x44);  // column 2 | 6
    a[h + 3] = _mm256_shuffle_ps(b[h + 1], b[h + 3], 0xEE);  // column 3 | 7
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_permute2f128_ps(a[k], a[k + 4], 0x20);
    r[k + 4] = _mm256_permute2f128_ps(a[k], a[k + 4], 0x31);
  }
}
#endif

#if NL_VEC_AVX512

struct VF { __m512 v; };
struct VD { __m512d v; };

inline VF zerof() { return {_mm512_setzero_ps()}; }
inline VD zerod() { return {_mm512_setzero_pd()}; }
inline VF bcast(float a) { return {_mm512_set1_ps(a)}; }
inline VF load(const float* p) { return {_mm512_loadu_ps(p)}; }
// Lanes [0, k) from p, the others 0 (0 ≤ k ≤ 16; nothing beyond p + k is read).
inline VF load_n(const float* p, int k) { return {_mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << k) - 1u), p)}; }
inline void store(float* p, VF a) { _mm512_storeu_ps(p, a.v); }
inline void store_n(float* p, VF a, int k) { _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << k) - 1u), a.v); }
// Non-temporal store; p must be 64-byte aligned.
inline void stream(float* p, VF a) { _mm512_stream_ps(p, a.v); }
inline void stream_fence() { _mm_sfence(); }
// Clears the upper halves of the vector registers (vzeroupper): see leave_clean below.
inline void zero_upper() {
  _mm256_zeroupper();
}
// Lanes [0, k) of a, the others 0.
inline VF keep_n(VF a, int k) { return {_mm512_maskz_mov_ps(static_cast<__mmask16>((1u << k) - 1u), a.v)}; }
inline VF add(VF a, VF b) { return {_mm512_add_ps(a.v, b.v)}; }
inline VF sub(VF a, VF b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline VF mul(VF a, VF b) { return {_mm512_mul_ps(a.v, b.v)}; }
// a + b as fma(a, 1, b): a·1 is exact, so the one rounding is that of a + b (same bits). On Zen 4 a 512-bit
// add issues only to the two FP add pipes, which the conversions (vcvtps2pd) and the float adds and
// subtractions also use; the FMA runs on the multiply pipes. The norms' double accumulations add converted
// floats, so moving them there made the LayerNorm kernels 2-10 % faster in L3 at 1 thread
// (docs/PERFORMANCE.md, 2026-11-30; bench/bench_pipes.cpp measures the pipes). The float add and sub stay on
// the add pipes: moving those too measured slower.
inline VD add(VD a, VD b) {
  return {_mm512_fmadd_pd(a.v, _mm512_set1_pd(1.0), b.v)};
}
inline VD sub(VD a, VD b) { return {_mm512_sub_pd(a.v, b.v)}; }
inline VD mul(VD a, VD b) { return {_mm512_mul_pd(a.v, b.v)}; }
inline VD div(VD a, VD b) { return {_mm512_div_pd(a.v, b.v)}; }
inline VD sqrtd(VD a) {
  return {_mm512_maskz_sqrt_pd(0xFF, a.v)};
}
inline VD bcastd(double a) { return {_mm512_set1_pd(a)}; }
// Lanes 0..7 from lo, 8..15 from hi, each rounded to nearest float (as static_cast<float>).
inline VF narrow_pd(VD lo, VD hi) {
  const __m256 l = _mm512_maskz_cvtpd_ps(0xFF, lo.v), h = _mm512_maskz_cvtpd_ps(0xFF, hi.v);
  // (broadcasts under masks rather than a cast: GCC 12 warns about the cast's undefined upper half)
  return {_mm512_mask_broadcast_f32x8(_mm512_maskz_broadcast_f32x8(0x00FF, l), 0xFF00, h)};
}
inline VD loadd(const double* p) { return {_mm512_loadu_pd(p)}; }
inline void stored(double* p, VD a) { _mm512_storeu_pd(p, a.v); }
// Lane l = p[l·stride] (l = 0..7), and p[l·stride] = lane l: only those doubles are read or written.
// gather_cvt: lane l = double(p[l·stride]) of floats.
inline __m512i lane_offsets(Index stride) {
  return _mm512_mullo_epi64(_mm512_set1_epi64(stride), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
}
inline VD gatherd(const double* p, Index stride) {
  return {_mm512_mask_i64gather_pd(_mm512_setzero_pd(), 0xFF, lane_offsets(stride), p, 8)};
}
inline void scatterd(double* p, Index stride, VD a) {
  _mm512_mask_i64scatter_pd(p, 0xFF, lane_offsets(stride), a.v, 8);
}
inline VD gather_cvt(const float* p, Index stride) {
  return {_mm512_maskz_cvtps_pd(
      0xFF, _mm512_mask_i64gather_ps(_mm256_setzero_ps(), 0xFF, lane_offsets(stride), p, 4))};
}
// out[k] lane l = double(p[l·stride + k]) for k, l < 8: the columns of the 8x8 float block whose rows are
// stride apart (eight loads and a transpose: about a third of the time of eight gather_cvt on the Intel
// Xeon of docs/PERFORMANCE.md's thirty-seventh session).
inline void load_cols8_cvt(VD* out, const float* p, Index stride) {
  __m256 r[8];
  load_transpose8(r, p, stride);
  for (int k = 0; k < 8; ++k) out[k] = {_mm512_maskz_cvtps_pd(0xFF, r[k])};  // (maskz: see cvt8)
}
// Lane l = a[l] < 0 ? +0 : a[l] (a NaN stays NaN, −0 stays −0): vmaxpd returns its second operand unless
// the first is greater.
inline VD floor0(VD a) {
  return {_mm512_maskz_max_pd(0xFF, _mm512_setzero_pd(), a.v)};
}
// Lane s = p[s·stride] (s = 0..15; 15·stride fits an int). Reads only those floats.
inline VF gather(const float* p, int stride) {
  const __m512i idx = _mm512_mullo_epi32(
      _mm512_set1_epi32(stride), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  return {_mm512_mask_i32gather_ps(_mm512_setzero_ps(), 0xFFFF, idx, p, 4)};
}
// v[j] lane s = p[stride·s + j] for j, s in [0, 16): sixteen loads and a 16 × 16 transpose, four stages of
// two-source permutes, stage b exchanging bit b of the row (vector) and column (lane) indices.
template <int B>
NL_FORCE_INLINE inline void transpose_stage(__m512* m) {
  // Lane c of row r0 (bit B clear): its own lane c, or row r1's lane c − B; of row r1: r0's lane c + B, or
  // its own lane c (indices ≥ 16 select the second source).
  constexpr auto lo = [](int c) { return (c & B) ? 16 + c - B : c; };
  constexpr auto hi = [](int c) { return (c & B) ? 16 + c : c + B; };
  const __m512i il = _mm512_setr_epi32(lo(0), lo(1), lo(2), lo(3), lo(4), lo(5), lo(6), lo(7), lo(8), lo(9),
                                       lo(10), lo(11), lo(12), lo(13), lo(14), lo(15));
  const __m512i ih = _mm512_setr_epi32(hi(0), hi(1), hi(2), hi(3), hi(4), hi(5), hi(6), hi(7), hi(8), hi(9),
                                       hi(10), hi(11), hi(12), hi(13), hi(14), hi(15));
  for (int r = 0; r < 16; ++r) {
    if (r & B) continue;
    const __m512 a = m[r], c = m[r | B];
    m[r] = _mm512_permutex2var_ps(a, il, c);
    m[r | B] = _mm512_permutex2var_ps(a, ih, c);
  }
}
// v[j] lane s = m[s] lane j for j, s in [0, 16): the four stages.
NL_FORCE_INLINE inline void transpose16(__m512* m, VF* v) {
  transpose_stage<1>(m);
  transpose_stage<2>(m);
  transpose_stage<4>(m);
  transpose_stage<8>(m);
  for (int r = 0; r < 16; ++r) v[r] = {m[r]};
}
NL_FORCE_INLINE inline void load_transposed16(const float* p, int stride, VF* v) {
  __m512 m[16];
  for (int r = 0; r < 16; ++r) m[r] = _mm512_loadu_ps(p + stride * r);
  transpose16(m, v);
}
// v[j] lane s = p[stride·s + j] for j < k ≤ 16, s < 16 (v[k..16) unspecified), where the floats p[0, limit)
// may be read: sixteen loads and the transpose of load_transposed16. Each row is a load of 16 floats where
// they lie within the limit, else of its k floats (masked: nothing past them is read). On the Zen 5 the
// masked loads cost: with every row masked, GroupNorm of [N, 256, S] took 1.1-1.5 times as long at S = 5 ..
// 15 (docs/PERFORMANCE.md, forty-third session).
NL_FORCE_INLINE inline void load_transposed_n(const float* p, int stride, int k, int limit, VF* v) {
  const __mmask16 mask = static_cast<__mmask16>((1u << k) - 1u);
  __m512 m[16];
  for (int r = 0; r < 16; ++r)
    m[r] = stride * r + 16 <= limit ? _mm512_loadu_ps(p + stride * r)
                                    : _mm512_maskz_loadu_ps(mask, p + stride * r);
  transpose16(m, v);
}
// One step of load_deinterleaved<8>: sources a, b hold groups of W consecutive elements (32 / W groups in
// all, a's first); even gets each group's elements at even positions, odd those at odd positions, the
// groups in the same order (W / 2 elements each).
template <int W>
NL_FORCE_INLINE inline void split_positions(__m512 a, __m512 b, __m512& even, __m512& odd) {
  constexpr auto e = [](int l) { return (l / (W / 2)) * W + 2 * (l % (W / 2)); };
  const __m512i ie = _mm512_setr_epi32(e(0), e(1), e(2), e(3), e(4), e(5), e(6), e(7), e(8), e(9), e(10),
                                       e(11), e(12), e(13), e(14), e(15));
  const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
  even = _mm512_permutex2var_ps(a, ie, b);
  odd = _mm512_permutex2var_ps(a, io, b);
}
// v[j] lane s = p[N·s + j] for j < N, s < 16, N = 2, 4 or 8 (16 segments of N floats, element j of segment
// s): N loads of the 16·N floats and, for N = 2, one two-source permute per vector; for N = 4, two stages
// (the even and odd elements of pairs of vectors, then their 256-bit halves put together); for N = 8, three
// (split_positions). Reads only those floats (the gathers of the other targets read the same).
template <int N>
NL_FORCE_INLINE inline void load_deinterleaved(const float* p, VF* v) {
  static_assert(N == 2 || N == 4 || N == 8);
  if constexpr (N == 8) {
    // Three steps of split_positions, each taking one bit of the element index j: the first its bit 0
    // (segments 4m .. 4m + 3 in e1[m], o1[m], elements j = 2q and 2q + 1 at position q), the second bit 1,
    // the third bit 2 (one element of each of the sixteen segments).
    __m512 e1[4], o1[4], ee[2], eo[2], oe[2], oo[2];
    for (int m = 0; m < 4; ++m)
      split_positions<8>(_mm512_loadu_ps(p + 32 * m), _mm512_loadu_ps(p + 32 * m + 16), e1[m], o1[m]);
    for (int h = 0; h < 2; ++h) {
      split_positions<4>(e1[2 * h], e1[2 * h + 1], ee[h], eo[h]);  // j = 0, 4 and 2, 6
      split_positions<4>(o1[2 * h], o1[2 * h + 1], oe[h], oo[h]);  // j = 1, 5 and 3, 7
    }
    split_positions<2>(ee[0], ee[1], v[0].v, v[4].v);
    split_positions<2>(eo[0], eo[1], v[2].v, v[6].v);
    split_positions<2>(oe[0], oe[1], v[1].v, v[5].v);
    split_positions<2>(oo[0], oo[1], v[3].v, v[7].v);
  } else if constexpr (N == 2) {
    const __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    v[0] = {_mm512_permutex2var_ps(a, even, b)};
    v[1] = {_mm512_permutex2var_ps(a, odd, b)};
  } else {
    // Lanes 0..7: element j of the first source's 4 segments and then the second's; lanes 8..15: j + 1.
    const __m512i i01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    const __m512i i23 = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
    const __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16), c = _mm512_loadu_ps(p + 32),
                 d = _mm512_loadu_ps(p + 48);
    const __m512 ab01 = _mm512_permutex2var_ps(a, i01, b), ab23 = _mm512_permutex2var_ps(a, i23, b);
    const __m512 cd01 = _mm512_permutex2var_ps(c, i01, d), cd23 = _mm512_permutex2var_ps(c, i23, d);
    // 0x44: the first source's 128-bit blocks 0, 1, then the second's 0, 1; 0xEE: blocks 2, 3 of each.
    v[0] = {_mm512_maskz_shuffle_f32x4(0xFFFF, ab01, cd01, 0x44)};
    v[1] = {_mm512_maskz_shuffle_f32x4(0xFFFF, ab01, cd01, 0xEE)};
    v[2] = {_mm512_maskz_shuffle_f32x4(0xFFFF, ab23, cd23, 0x44)};
    v[3] = {_mm512_maskz_shuffle_f32x4(0xFFFF, ab23, cd23, 0xEE)};
  }
}
// Lane selectors: VI holds 16 lane indices, each in [0, 16), loaded from 16 bytes; pick(a, i) lane l =
// a[i[l]] (one permute; the maskz forms, as above, for GCC 12's -Wmaybe-uninitialized).
struct VI {
  __m512i v;
};
inline VI load_idx(const std::uint8_t* p) {
  return {_mm512_maskz_cvtepu8_epi32(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
inline VF pick(VF a, VI i) {
  return {_mm512_maskz_permutexvar_ps(0xFFFF, i.v, a.v)};
}
// Exact conversions: lanes 0..7 / 8..15 of a; 8 floats at p.
// (The maskz forms with an all-ones mask and __builtin_shufflevector for the low half avoid GCC 12's
// false -Wmaybe-uninitialized on the plain intrinsics and casts.)
inline VD cvt8(__m256 a) { return {_mm512_maskz_cvtps_pd(0xFF, a)}; }
inline VD cvt_lo(VF a) { return cvt8(__builtin_shufflevector(a.v, a.v, 0, 1, 2, 3, 4, 5, 6, 7)); }
inline VD cvt_hi(VF a) { return cvt8(_mm512_maskz_extractf32x8_ps(0xFF, a.v, 1)); }
inline VD load_cvt(const float* p) { return cvt8(_mm256_loadu_ps(p)); }
// Lane l = double(float(a[l] + a[l + 8])): the two halves added in fp32, then converted exactly.
inline VD cvt_fold(VF a) {
  return cvt8(_mm256_add_ps(__builtin_shufflevector(a.v, a.v, 0, 1, 2, 3, 4, 5, 6, 7),
                            _mm512_maskz_extractf32x8_ps(0xFF, a.v, 1)));
}
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)): lanes l and l+4, then l and l+2, then 0 and 1.
inline double hsum(VD a) {
  const __m256d t = _mm256_add_pd(__builtin_shufflevector(a.v, a.v, 0, 1, 2, 3), _mm512_maskz_extractf64x4_pd(0xF, a.v, 1));
  const __m128d u = _mm_add_pd(_mm256_castpd256_pd128(t), _mm256_extractf128_pd(t, 1));
  return _mm_cvtsd_f64(_mm_add_sd(u, _mm_unpackhi_pd(u, u)));
}

// ---- 16-bit storage: VH holds 16 halves.
using VH = __m256i;
inline __mmask16 mask16(int k) { return static_cast<__mmask16>((1u << k) - 1u); }
inline VH hload(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline VH hload_n(const void* p, int k) { return _mm256_maskz_loadu_epi16(mask16(k), p); }
inline void hstore(void* p, VH h) { _mm256_storeu_si256(static_cast<__m256i*>(p), h); }
inline void hstore_n(void* p, VH h, int k) { _mm256_mask_storeu_epi16(p, mask16(k), h); }
inline void hstream(void* p, VH h) { _mm256_stream_si256(static_cast<__m256i*>(p), h); }  // 32-byte aligned
template <Half T>
inline VF widen(VH h) {
  if constexpr (kIsBf16<T>) {
    // Scalar math: float bits of lane l = h[l] << 16 (one word permute: word l into the high half of
    // lane l, the low halves zeroed by the mask; only words 0..15 are read, so the cast's upper half,
    // left undefined, never matters)
    const __m512i to_high = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0, 6, 0, 5, 0, 4,
                                             0, 3, 0, 2, 0, 1, 0, 0, 0);
    return {_mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, to_high, _mm512_castsi256_si512(h)))};
  } else {
    return {_mm512_maskz_cvtph_ps(0xFFFF, h)};
  }
}
template <Half T>
inline VH narrow(VF a) {
#if NL_VEC_AVX512BF16
  if constexpr (kIsBf16<T>) {
    // Scalar math: bits = x is NaN ? (x >> 16) | 0x40 : (x + 0x7FFF + ((x >> 16) & 1)) >> 16
    // vcvtneps2bf16 computes exactly that, except that it takes a subnormal x as ±0 (Intel SDM,
    // VCVTNEPS2BF16: "DAZ"); a vector with a subnormal lane (fpclass bit 5) therefore takes the integer
    // rounding below, a branch that data away from the subnormal range never takes. One instruction
    // instead of five (bf16 LayerNorm forward 10 % faster on Zen 4; docs/PERFORMANCE.md).
    if (__builtin_expect(_mm512_fpclass_ps_mask(a.v, 0x20) == 0, 1)) return (__m256i)_mm512_cvtneps_pbh(a.v);
  }
#endif
  if constexpr (kIsBf16<T>) {
    // Scalar math: bits = x is NaN ? (x >> 16) | 0x40 : (x + 0x7FFF + ((x >> 16) & 1)) >> 16
    // The rounded value is formed in the high half of each lane (x + 0x7FFF + bit 16 of x; x | 0x400000
    // for NaN), and one word permute gathers the 16 high halves. The NaN lanes are patched under a
    // branch that finite data never takes: the masked forms of the rounding (a test into a mask register
    // and a masked add, a masked or) cost 7 % of the bf16 LayerNorm forward on Zen 4.
    const __m512i x = _mm512_castps_si512(a.v);
    const __m512i bit16 = _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), bit16);
    const __mmask16 nan = _mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q);
    if (__builtin_expect(nan != 0, 0)) r = _mm512_mask_or_epi32(r, nan, x, _mm512_set1_epi32(0x400000));
    const __m512i high_halves = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 31, 29, 27,
                                                 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512i packed = _mm512_permutexvar_epi16(high_halves, r);
    return __builtin_shufflevector(packed, packed, 0, 1, 2, 3);
  } else {
    return _mm512_maskz_cvtps_ph(0xFFFF, a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
}
// 8 halves at p, widened exactly to double.
template <Half T>
inline VD load_cvt(const T* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (kIsBf16<T>)
    return cvt8(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  else
    return cvt8(_mm256_cvtph_ps(h));
}

// Σx of bf16 in pairs: the 16 halves at p, as doubles of the even elements (0, 2, .., 14: lanes 0..7 of even)
// and of the odd ones (odd), each exact. One shift and one mask of the 32-bit pairs instead of two
// zero-extensions and two shifts: a sum kept in this layout (lane j of even holds what lane 2j mod 8 of the
// VD of elements 0..7 (j < 4) or 8..15 (j ≥ 4) would) is taken back by unpair_lo / unpair_hi.
inline constexpr bool kBf16Pairs = true;
inline void cvt_pairs(__m256i d, VD& even, VD& odd) {
  even = cvt8(_mm256_castsi256_ps(_mm256_slli_epi32(d, 16)));
  odd = cvt8(_mm256_castsi256_ps(_mm256_and_si256(d, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)))));
}
inline void load_cvt_pairs(const bfloat16* p, VD& even, VD& odd) {
  cvt_pairs(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), even, odd);
}
// The same of the first k halves at p (0 ≤ k ≤ 16; the others taken as +0, nothing beyond p + k read).
inline void load_cvt_pairs_n(const bfloat16* p, int k, VD& even, VD& odd) {
  cvt_pairs(hload_n(p, k), even, odd);
}
// The VD of elements 0..7 (unpair_lo) and 8..15 (unpair_hi) from the paired layout.
inline VD unpair_lo(VD even, VD odd) {
  return {_mm512_permutex2var_pd(even.v, _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), odd.v)};
}
inline VD unpair_hi(VD even, VD odd) {
  return {_mm512_permutex2var_pd(even.v, _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15), odd.v)};
}

#elif NL_VEC_AVX2

struct VF { __m256 lo, hi; };
struct VD { __m256d lo, hi; };

inline __m256i lane_mask8(int k) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline VF zerof() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline VD zerod() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
inline VF bcast(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
inline VF load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline VF load_n(const float* p, int k) {
  return {_mm256_maskload_ps(p, lane_mask8(k)), _mm256_maskload_ps(p + 8, lane_mask8(k - 8))};
}
inline void store(float* p, VF a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
// The first k (≤ 0: none, ≥ 8: all) lanes of v at p, by plain stores of 8, 4, 2 and 1 lanes: AMD's Zen 2
// and Zen 3 execute vmaskmovps stores slowly (the two of a 72-float row's tail took 14 % of the LayerNorm
// forward on Zen 3).
inline void store8_n(float* p, __m256 v, int k) {
  if (k >= 8) {
    _mm256_storeu_ps(p, v);
    return;
  }
  __m128 h = _mm256_castps256_ps128(v);
  if (k >= 4) {
    _mm_storeu_ps(p, h);
    p += 4;
    k -= 4;
    h = _mm256_extractf128_ps(v, 1);
  }
  if (k >= 2) {
    _mm_storel_pi(reinterpret_cast<__m64*>(p), h);
    p += 2;
    k -= 2;
    h = _mm_movehl_ps(h, h);
  }
  if (k >= 1) _mm_store_ss(p, h);
}
inline void store_n(float* p, VF a, int k) {
  if (k > 8) {
    _mm256_storeu_ps(p, a.lo);
    store8_n(p + 8, a.hi, k - 8);
  } else {
    store8_n(p, a.lo, k);
  }
}
inline void stream(float* p, VF a) {
  _mm256_stream_ps(p, a.lo);
  _mm256_stream_ps(p + 8, a.hi);
}
inline void stream_fence() { _mm_sfence(); }
// Clears the upper halves of the vector registers (vzeroupper): see leave_clean below.
inline void zero_upper() {
  _mm256_zeroupper();
}
inline VF keep_n(VF a, int k) {
  return {_mm256_and_ps(a.lo, _mm256_castsi256_ps(lane_mask8(k))),
          _mm256_and_ps(a.hi, _mm256_castsi256_ps(lane_mask8(k - 8)))};
}
inline VF add(VF a, VF b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline VF sub(VF a, VF b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline VF mul(VF a, VF b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline VD add(VD a, VD b) { return {_mm256_add_pd(a.lo, b.lo), _mm256_add_pd(a.hi, b.hi)}; }
inline VD sub(VD a, VD b) { return {_mm256_sub_pd(a.lo, b.lo), _mm256_sub_pd(a.hi, b.hi)}; }
inline VD mul(VD a, VD b) { return {_mm256_mul_pd(a.lo, b.lo), _mm256_mul_pd(a.hi, b.hi)}; }
inline VD div(VD a, VD b) { return {_mm256_div_pd(a.lo, b.lo), _mm256_div_pd(a.hi, b.hi)}; }
inline VD sqrtd(VD a) {
  return {_mm256_sqrt_pd(a.lo), _mm256_sqrt_pd(a.hi)};
}
inline VD bcastd(double a) { return {_mm256_set1_pd(a), _mm256_set1_pd(a)}; }
inline VF narrow_pd(VD lo, VD hi) {
  return {_mm256_set_m128(_mm256_cvtpd_ps(lo.hi), _mm256_cvtpd_ps(lo.lo)),
          _mm256_set_m128(_mm256_cvtpd_ps(hi.hi), _mm256_cvtpd_ps(hi.lo))};
}
inline VD floor0(VD a) {
  return {_mm256_max_pd(_mm256_setzero_pd(), a.lo), _mm256_max_pd(_mm256_setzero_pd(), a.hi)};
}
inline VF gather(const float* p, int stride) {
  const __m256i idx =
      _mm256_mullo_epi32(_mm256_set1_epi32(stride), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256 ones = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  return {_mm256_mask_i32gather_ps(_mm256_setzero_ps(), p, idx, ones, 4),
          _mm256_mask_i32gather_ps(_mm256_setzero_ps(), p + 8 * stride, idx, ones, 4)};
}
inline void load_transposed16(const float* p, int stride, VF* v) {
  for (int j = 0; j < 16; ++j) v[j] = gather(p + j, stride);
}
inline void load_transposed_n(const float* p, int stride, int k, int, VF* v) {
  for (int j = 0; j < k; ++j) v[j] = gather(p + j, stride);
}
template <int N>
inline void load_deinterleaved(const float* p, VF* v) {
  for (int j = 0; j < N; ++j) v[j] = gather(p + j, N);
}
// Lane selectors (as on AVX-512): each half picks from both halves of a (vpermps reads an index's low three
// bits) and blends by whether the index is ≥ 8.
struct VI {
  __m256i lo, hi;
  __m256 lo_up, hi_up;
};
inline VI load_idx(const std::uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i lo = _mm256_cvtepu8_epi32(b), hi = _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8));
  const __m256i seven = _mm256_set1_epi32(7);
  return {lo, hi, _mm256_castsi256_ps(_mm256_cmpgt_epi32(lo, seven)),
          _mm256_castsi256_ps(_mm256_cmpgt_epi32(hi, seven))};
}
inline VF pick(VF a, VI i) {
  auto half = [&](__m256i idx, __m256 up) {
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(a.lo, idx), _mm256_permutevar8x32_ps(a.hi, idx), up);
  };
  return {half(i.lo, i.lo_up), half(i.hi, i.hi_up)};
}
inline VD loadd(const double* p) { return {_mm256_loadu_pd(p), _mm256_loadu_pd(p + 4)}; }
inline void stored(double* p, VD a) {
  _mm256_storeu_pd(p, a.lo);
  _mm256_storeu_pd(p + 4, a.hi);
}
inline __m256i lane_offsets(Index stride) {
  return _mm256_setr_epi64x(0, stride, 2 * stride, 3 * stride);
}
inline VD gatherd(const double* p, Index stride) {
  const __m256i idx = lane_offsets(stride);
  const __m256d all = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
  return {_mm256_mask_i64gather_pd(_mm256_setzero_pd(), p, idx, all, 8),
          _mm256_mask_i64gather_pd(_mm256_setzero_pd(), p + 4 * stride, idx, all, 8)};
}
inline void scatterd(double* p, Index stride, VD a) {
  alignas(32) double t[kD];
  stored(t, a);
  for (int l = 0; l < kD; ++l) p[l * stride] = t[l];
}
inline VD gather_cvt(const float* p, Index stride) {
  const __m256i idx = lane_offsets(stride);
  const __m128 all = _mm_castsi128_ps(_mm_set1_epi32(-1));
  return {_mm256_cvtps_pd(_mm256_mask_i64gather_ps(_mm_setzero_ps(), p, idx, all, 4)),
          _mm256_cvtps_pd(_mm256_mask_i64gather_ps(_mm_setzero_ps(), p + 4 * stride, idx, all, 4))};
}
inline void load_cols8_cvt(VD* out, const float* p, Index stride) {
  __m256 r[8];
  load_transpose8(r, p, stride);
  for (int k = 0; k < 8; ++k)
    out[k] = {_mm256_cvtps_pd(_mm256_castps256_ps128(r[k])), _mm256_cvtps_pd(_mm256_extractf128_ps(r[k], 1))};
}
inline VD cvt8(__m256 a) {
  return {_mm256_cvtps_pd(_mm256_castps256_ps128(a)), _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1))};
}
inline VD cvt_lo(VF a) { return cvt8(a.lo); }
inline VD cvt_hi(VF a) { return cvt8(a.hi); }
inline VD cvt_fold(VF a) {
  return cvt8(_mm256_add_ps(a.lo, a.hi));
}
inline VD load_cvt(const float* p) { return {_mm256_cvtps_pd(_mm_loadu_ps(p)), _mm256_cvtps_pd(_mm_loadu_ps(p + 4))}; }
inline double hsum(VD a) {
  const __m256d t = _mm256_add_pd(a.lo, a.hi);
  const __m128d u = _mm_add_pd(_mm256_castpd256_pd128(t), _mm256_extractf128_pd(t, 1));
  return _mm_cvtsd_f64(_mm_add_sd(u, _mm_unpackhi_pd(u, u)));
}

// ---- 16-bit storage: VH holds 16 halves (8 in each half).
struct VH { __m128i lo, hi; };
inline VH hload(const void* p) {
  const __m128i* q = static_cast<const __m128i*>(p);
  return {_mm_loadu_si128(q), _mm_loadu_si128(q + 1)};
}
inline VH hload_n(const void* p, int k) {  // AVX2 has no 16-bit masked load: through a zeroed buffer
  alignas(32) std::uint16_t t[kF] = {};
  std::memcpy(t, p, static_cast<std::size_t>(k) * 2);
  return hload(t);
}
inline void hstore(void* p, VH h) {
  __m128i* q = static_cast<__m128i*>(p);
  _mm_storeu_si128(q, h.lo);
  _mm_storeu_si128(q + 1, h.hi);
}
inline void hstore_n(void* p, VH h, int k) {
  alignas(32) std::uint16_t t[kF];
  hstore(t, h);
  std::memcpy(p, t, static_cast<std::size_t>(k) * 2);
}
inline void hstream(void* p, VH h) {  // 16-byte aligned
  __m128i* q = static_cast<__m128i*>(p);
  _mm_stream_si128(q, h.lo);
  _mm_stream_si128(q + 1, h.hi);
}
template <Half T>
inline __m256 widen8(__m128i h) {
  if constexpr (kIsBf16<T>) {
    // The eight halves in both 128-bit lanes (a vbroadcasti128 load where h comes from memory); one
    // in-lane byte shuffle moves halves 0..3 (lane 0) and 4..7 (lane 1) into the high 16 bits of the
    // floats, instead of a lane-crossing widening and a shift: the bf16 LayerNorm kernels took 0.94-0.99×
    // the time on Zen 3 (docs/PERFORMANCE.md).
    const __m256i to_high =
        _mm256_setr_epi8(-128, -128, 0, 1, -128, -128, 2, 3, -128, -128, 4, 5, -128, -128, 6, 7, -128, -128,
                         8, 9, -128, -128, 10, 11, -128, -128, 12, 13, -128, -128, 14, 15);
    return _mm256_castsi256_ps(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(h), to_high));
  } else {
    return _mm256_cvtph_ps(h);
  }
}
template <Half T>
inline __m128i narrow8(__m256 v) {
  if constexpr (kIsBf16<T>) {
    // Scalar math: bits = x is NaN ? (x >> 16) | 0x40 : (x + 0x7FFF + ((x >> 16) & 1)) >> 16
    const __m256i x = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(x, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    // NaN lanes patched under a branch that finite data never takes (as on AVX-512: the blend cost 5 % of
    // the bf16 LayerNorm forward on this target).
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    if (__builtin_expect(_mm256_movemask_ps(nan) != 0, 0))
      r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), _mm256_castps_si256(nan));
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));  // values ≤ 0xFFFF
  } else {
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  }
}
template <Half T>
inline VF widen(VH h) { return {widen8<T>(h.lo), widen8<T>(h.hi)}; }
template <Half T>
inline VH narrow(VF a) { return {narrow8<T>(a.lo), narrow8<T>(a.hi)}; }
template <Half T>
inline VD load_cvt(const T* p) { return cvt8(widen8<T>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))); }

#else  // scalar

// GCC's generic vectors: each operation below is one lane-wise vector operation, which GCC lowers to SSE2
// (four lanes at a time). Plain float[16] arrays, which this target used before, compiled to the same
// arithmetic but took the compiler 13 minutes on this unit (alias walking over the array elements) against
// about 2 for the AVX2 unit. (-Wno-psabi for this unit in CMakeLists.txt: the 64-byte vector arguments of
// these internal functions have no ABI to keep.)
typedef float VFv __attribute__((vector_size(kF * sizeof(float))));
typedef double VDv __attribute__((vector_size(kD * sizeof(double))));
typedef float VF8v __attribute__((vector_size(kD * sizeof(float))));
typedef std::uint32_t VUv __attribute__((vector_size(kF * sizeof(std::uint32_t))));
typedef std::uint16_t VHv __attribute__((vector_size(kF * sizeof(std::uint16_t))));
struct VF {
  VFv v;
};
struct VD {
  VDv v;
};

inline VF zerof() { return VF{}; }
inline VD zerod() { return VD{}; }
inline VF bcast(float a) {
  VF r;
  for (int l = 0; l < kF; ++l) r.v[l] = a;
  return r;
}
inline VF load(const float* p) {
  VF r;
  std::memcpy(&r.v, p, sizeof r.v);
  return r;
}
inline VF load_n(const float* p, int k) {
  VF r{};
  for (int l = 0; l < k; ++l) r.v[l] = p[l];
  return r;
}
inline void store(float* p, VF a) {
  std::memcpy(p, &a.v, sizeof a.v);
}
inline void store_n(float* p, VF a, int k) {
  for (int l = 0; l < k; ++l) p[l] = a.v[l];
}
inline void stream(float* p, VF a) { store(p, a); }
inline void stream_fence() {}
inline void zero_upper() {}
inline VF keep_n(VF a, int k) {
  for (int l = k; l < kF; ++l) a.v[l] = 0.0f;
  return a;
}
inline VF add(VF a, VF b) {
  return VF{a.v + b.v};
}
inline VF sub(VF a, VF b) {
  return VF{a.v - b.v};
}
inline VF mul(VF a, VF b) {
  return VF{a.v * b.v};
}
inline VD add(VD a, VD b) {
  return VD{a.v + b.v};
}
inline VD sub(VD a, VD b) {
  return VD{a.v - b.v};
}
inline VD mul(VD a, VD b) {
  return VD{a.v * b.v};
}
inline VD div(VD a, VD b) {
  return VD{a.v / b.v};
}
inline VD sqrtd(VD a) {
  for (int l = 0; l < kD; ++l) a.v[l] = __builtin_sqrt(a.v[l]);
  return a;
}
inline VD bcastd(double a) {
  VD r;
  for (int l = 0; l < kD; ++l) r.v[l] = a;
  return r;
}
inline VF narrow_pd(VD lo, VD hi) {
  const VF8v l = __builtin_convertvector(lo.v, VF8v), h = __builtin_convertvector(hi.v, VF8v);
  return VF{__builtin_shufflevector(l, h, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)};
}
inline VD floor0(VD a) {
  for (int l = 0; l < kD; ++l) a.v[l] = a.v[l] < 0 ? 0.0 : a.v[l];
  return a;
}
inline VF gather(const float* p, int stride) {
  VF r;
  for (int l = 0; l < kF; ++l) r.v[l] = p[l * stride];
  return r;
}
inline void load_transposed16(const float* p, int stride, VF* v) {
  for (int j = 0; j < 16; ++j) v[j] = gather(p + j, stride);
}
inline void load_transposed_n(const float* p, int stride, int k, int, VF* v) {
  for (int j = 0; j < k; ++j) v[j] = gather(p + j, stride);
}
template <int N>
inline void load_deinterleaved(const float* p, VF* v) {
  for (int j = 0; j < N; ++j) v[j] = gather(p + j, N);
}
struct VI {
  std::uint8_t v[kF];
};
inline VI load_idx(const std::uint8_t* p) {
  VI r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline VF pick(VF a, VI i) {
  VF r;
  for (int l = 0; l < kF; ++l) r.v[l] = a.v[i.v[l]];
  return r;
}
inline VD loadd(const double* p) {
  VD r;
  std::memcpy(&r.v, p, sizeof r.v);
  return r;
}
inline void stored(double* p, VD a) {
  std::memcpy(p, &a.v, sizeof a.v);
}
inline VD gatherd(const double* p, Index stride) {
  VD r;
  for (int l = 0; l < kD; ++l) r.v[l] = p[l * stride];
  return r;
}
inline void scatterd(double* p, Index stride, VD a) {
  for (int l = 0; l < kD; ++l) p[l * stride] = a.v[l];
}
inline VD gather_cvt(const float* p, Index stride) {
  VD r;
  for (int l = 0; l < kD; ++l) r.v[l] = static_cast<double>(p[l * stride]);
  return r;
}
inline void load_cols8_cvt(VD* out, const float* p, Index stride) {
  for (int k = 0; k < kD; ++k) out[k] = gather_cvt(p + k, stride);
}
inline VD cvt_lo(VF a) {
  return VD{__builtin_convertvector(__builtin_shufflevector(a.v, a.v, 0, 1, 2, 3, 4, 5, 6, 7), VDv)};
}
inline VD cvt_hi(VF a) {
  return VD{__builtin_convertvector(__builtin_shufflevector(a.v, a.v, 8, 9, 10, 11, 12, 13, 14, 15), VDv)};
}
inline VD cvt_fold(VF a) {
  const VF8v lo = __builtin_shufflevector(a.v, a.v, 0, 1, 2, 3, 4, 5, 6, 7);
  const VF8v hi = __builtin_shufflevector(a.v, a.v, 8, 9, 10, 11, 12, 13, 14, 15);
  return VD{__builtin_convertvector(lo + hi, VDv)};
}
inline VD load_cvt(const float* p) {
  VF8v h;
  std::memcpy(&h, p, sizeof h);
  return VD{__builtin_convertvector(h, VDv)};
}
inline double hsum(VD a) {
  double t[4], u[2];
  for (int l = 0; l < 4; ++l) t[l] = a.v[l] + a.v[l + 4];
  for (int l = 0; l < 2; ++l) u[l] = t[l] + t[l + 2];
  return u[0] + u[1];
}

// ---- 16-bit storage: VH holds 16 halves. bf16 converts with integer vector operations (the rule of
// detail::bf16_bits_from_float, lane by lane); fp16 calls the per-element functions of tensor.h from one
// out-of-line function per direction, so that the kernels do not inline sixteen copies of them.
struct VH {
  VHv v;
};
inline VH hload(const void* p) {
  VH h;
  std::memcpy(&h.v, p, sizeof h.v);
  return h;
}
inline VH hload_n(const void* p, int k) {
  VH h{};
  std::memcpy(&h.v, p, static_cast<std::size_t>(k) * 2);
  return h;
}
inline void hstore(void* p, VH h) {
  std::memcpy(p, &h.v, sizeof h.v);
}
inline void hstore_n(void* p, VH h, int k) {
  std::memcpy(p, &h.v, static_cast<std::size_t>(k) * 2);
}
inline void hstream(void* p, VH h) {
  hstore(p, h);
}
[[gnu::noinline]] inline VF widen_f16(VH h) {
  VF r;
  for (int l = 0; l < kF; ++l) r.v[l] = detail::float_from_f16_bits(h.v[l]);
  return r;
}
[[gnu::noinline]] inline VH narrow_f16(VF a) {
  VH h;
  for (int l = 0; l < kF; ++l) h.v[l] = detail::f16_bits_from_float(a.v[l]);
  return h;
}
template <Half T>
inline VF widen(VH h) {
  if constexpr (kIsBf16<T>) {
    const VUv u = __builtin_convertvector(h.v, VUv) << 16;
    VF r;
    std::memcpy(&r.v, &u, sizeof u);
    return r;
  } else {
    return widen_f16(h);
  }
}
template <Half T>
inline VH narrow(VF a) {
  if constexpr (kIsBf16<T>) {
    // Scalar math: NaN → (x >> 16) | 0x40; otherwise (x + 0x7FFF + ((x >> 16) & 1)) >> 16 (round to nearest
    // even)
    VUv x;
    std::memcpy(&x, &a.v, sizeof x);
    const VUv m = (VUv)((x & 0x7FFFFFFFu) > 0x7F800000u);  // all ones where NaN
    const VUv rne = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16, quiet = (x >> 16) | 0x0040u;
    return VH{__builtin_convertvector((quiet & m) | (rne & ~m), VHv)};
  } else {
    return narrow_f16(a);
  }
}
template <Half T>
inline VD load_cvt(const T* p) {
  return cvt_lo(widen<T>(hload_n(p, kD)));
}

#endif

#if !NL_VEC_AVX512
// The paired Σx of bf16 (load_cvt_pairs) is AVX-512's only: declared, never defined, for the kernels'
// branches under kBf16Pairs, which are discarded here.
inline constexpr bool kBf16Pairs = false;
void load_cvt_pairs(const bfloat16* p, VD& even, VD& odd);
void load_cvt_pairs_n(const bfloat16* p, int k, VD& even, VD& odd);
VD unpair_lo(VD even, VD odd);
VD unpair_hi(VD even, VD odd);
#endif

// ---- 16-bit storage, every target: the float operations on bfloat16 / float16 pointers.
template <Half T>
inline VF load(const T* p) { return widen<T>(hload(p)); }
template <Half T>
inline VF load_n(const T* p, int k) { return widen<T>(hload_n(p, k)); }
template <Half T>
inline void store(T* p, VF a) { hstore(p, narrow<T>(a)); }
template <Half T>
inline void store_n(T* p, VF a, int k) { hstore_n(p, narrow<T>(a), k); }
// Non-temporal store of 16 elements; p must satisfy stream_ok.
template <Half T>
inline void stream(T* p, VF a) { hstream(p, narrow<T>(a)); }

// Whether stream() may store kF elements of T at p (and at every kF-element step from p): float needs
// 64-byte alignment, a 16-bit type 32 bytes.
template <typename T>
inline bool stream_ok(const T* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & (sizeof(T) * kF - 1)) == 0;
}

// Prefetches, for reading into every cache level (locality hint 3), the `lines` 64-byte lines that start at
// address a, an integer: it may lie past the end of the array (a prefetch never faults, and changes no
// value).
NL_FORCE_INLINE inline void prefetch_lines(std::uintptr_t a, Index lines) {
  for (Index l = 0; l < lines; ++l) __builtin_prefetch(reinterpret_cast<const void*>(a + 64 * l), 0, 3);
}

// prefetch_lines of the Lines lines that start Bytes past p. Used by the row kernels (prefetch_ahead64) and
// the channel statistics.
template <Index Bytes, int Lines>
NL_FORCE_INLINE inline void prefetch_ahead(const void* p) {
  prefetch_lines(reinterpret_cast<std::uintptr_t>(p) + Bytes, Lines);
}

// ---- Entries of the kernel tables, every target.
// leave_clean<f>: a function that calls f and then zero_upper(), for the kernel tables' entries. The code
// that calls through the tables is compiled for the baseline (SSE) instruction set; an AVX-512 or AVX2
// function that returns with the upper halves of ymm0–15/zmm0–15 in use makes that code pay an SSE/AVX
// transition on Intel cores: about 150 ns a call on the Xeon of docs/PERFORMANCE.md's twenty-fourth
// session, where BatchNorm calls the channel statistics once per segment of 400 floats and spent most of
// its time there. GCC puts a vzeroupper at the return of most functions but left it out of some entries
// (the channel statistics, the bf16/fp16 row forward), so the tables do it themselves. Test:
// UpperState.* (tests/simd/upper_state_test.cpp) reads the state after each entry (XGETBV with ECX = 1).
template <auto F>
struct LeaveClean;
template <typename... A, void (*F)(A...)>
struct LeaveClean<F> {
  static void call(A... a) {
    F(a...);
    zero_upper();
  }
};
template <auto F>
inline constexpr auto leave_clean = &LeaveClean<F>::call;

}  // namespace normlab::kernels::NL_TARGET::vec
