// A small fixed-width vector layer for the per-target kernels (internal).
//
// VF holds 16 floats, VD 8 doubles, on every target:
//   AVX-512: one __m512 / __m512d;
//   AVX2:    two __m256 / __m256d (lanes 0..7, 8..15 of VF; 0..3, 4..7 of VD);
//   scalar:  plain arrays (GCC auto-vectorizes them to SSE2).
// Every operation is lane-wise IEEE arithmetic (add, sub, mul, float→double conversion, which is exact)
// with the same lane semantics on each target, and the horizontal sum hsum() combines lanes by one fixed
// tree. No operation fuses a multiply and an add (the kernels are compiled with -ffp-contract=off and
// the intrinsics used are plain mul/add), so a kernel written against this layer produces the same bits
// on every target. Tails use zero-filled loads and masked stores, which never change a result.
//
// Include only from a file compiled per target (row_kernels-inl.h) with NL_TARGET defined; the code
// lives in namespace normlab::kernels::NL_TARGET::vec, so the per-target definitions never collide.
#pragma once

#ifndef NL_TARGET
#error "define NL_TARGET before including simd/vec.h"
#endif

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define NL_VEC_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__)
#define NL_VEC_AVX2 1
#include <immintrin.h>
#else
#define NL_VEC_SCALAR 1
#endif

namespace normlab::kernels::NL_TARGET::vec {

inline constexpr int kF = 16;  // floats per VF
inline constexpr int kD = 8;   // doubles per VD

// Whether stream() issues non-temporal stores on this target (it needs a 64-byte aligned address).
inline bool aligned64(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 63) == 0; }

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
// Lanes [0, k) of a, the others 0.
inline VF keep_n(VF a, int k) { return {_mm512_maskz_mov_ps(static_cast<__mmask16>((1u << k) - 1u), a.v)}; }
inline VF add(VF a, VF b) { return {_mm512_add_ps(a.v, b.v)}; }
inline VF sub(VF a, VF b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline VF mul(VF a, VF b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline VD add(VD a, VD b) { return {_mm512_add_pd(a.v, b.v)}; }
inline VD loadd(const double* p) { return {_mm512_loadu_pd(p)}; }
inline void stored(double* p, VD a) { _mm512_storeu_pd(p, a.v); }
// Exact conversions: lanes 0..7 / 8..15 of a; 8 floats at p.
// (The maskz forms with an all-ones mask and __builtin_shufflevector for the low half avoid GCC 12's
// false -Wmaybe-uninitialized on the plain intrinsics and casts.)
inline VD cvt8(__m256 a) { return {_mm512_maskz_cvtps_pd(0xFF, a)}; }
inline VD cvt_lo(VF a) { return cvt8(__builtin_shufflevector(a.v, a.v, 0, 1, 2, 3, 4, 5, 6, 7)); }
inline VD cvt_hi(VF a) { return cvt8(_mm512_maskz_extractf32x8_ps(0xFF, a.v, 1)); }
inline VD load_cvt(const float* p) { return cvt8(_mm256_loadu_ps(p)); }
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)): lanes l and l+4, then l and l+2, then 0 and 1.
inline double hsum(VD a) {
  const __m256d t = _mm256_add_pd(__builtin_shufflevector(a.v, a.v, 0, 1, 2, 3), _mm512_maskz_extractf64x4_pd(0xF, a.v, 1));
  const __m128d u = _mm_add_pd(_mm256_castpd256_pd128(t), _mm256_extractf128_pd(t, 1));
  return _mm_cvtsd_f64(_mm_add_sd(u, _mm_unpackhi_pd(u, u)));
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
inline void store_n(float* p, VF a, int k) {
  _mm256_maskstore_ps(p, lane_mask8(k), a.lo);
  _mm256_maskstore_ps(p + 8, lane_mask8(k - 8), a.hi);
}
inline void stream(float* p, VF a) {
  _mm256_stream_ps(p, a.lo);
  _mm256_stream_ps(p + 8, a.hi);
}
inline void stream_fence() { _mm_sfence(); }
inline VF keep_n(VF a, int k) {
  return {_mm256_and_ps(a.lo, _mm256_castsi256_ps(lane_mask8(k))),
          _mm256_and_ps(a.hi, _mm256_castsi256_ps(lane_mask8(k - 8)))};
}
inline VF add(VF a, VF b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline VF sub(VF a, VF b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline VF mul(VF a, VF b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline VD add(VD a, VD b) { return {_mm256_add_pd(a.lo, b.lo), _mm256_add_pd(a.hi, b.hi)}; }
inline VD loadd(const double* p) { return {_mm256_loadu_pd(p), _mm256_loadu_pd(p + 4)}; }
inline void stored(double* p, VD a) {
  _mm256_storeu_pd(p, a.lo);
  _mm256_storeu_pd(p + 4, a.hi);
}
inline VD cvt8(__m256 a) {
  return {_mm256_cvtps_pd(_mm256_castps256_ps128(a)), _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1))};
}
inline VD cvt_lo(VF a) { return cvt8(a.lo); }
inline VD cvt_hi(VF a) { return cvt8(a.hi); }
inline VD load_cvt(const float* p) { return {_mm256_cvtps_pd(_mm_loadu_ps(p)), _mm256_cvtps_pd(_mm_loadu_ps(p + 4))}; }
inline double hsum(VD a) {
  const __m256d t = _mm256_add_pd(a.lo, a.hi);
  const __m128d u = _mm_add_pd(_mm256_castpd256_pd128(t), _mm256_extractf128_pd(t, 1));
  return _mm_cvtsd_f64(_mm_add_sd(u, _mm_unpackhi_pd(u, u)));
}

#else  // scalar

struct VF { float v[kF]; };
struct VD { double v[kD]; };

inline VF zerof() { return VF{}; }
inline VD zerod() { return VD{}; }
inline VF bcast(float a) {
  VF r;
  for (int l = 0; l < kF; ++l) r.v[l] = a;
  return r;
}
inline VF load(const float* p) {
  VF r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline VF load_n(const float* p, int k) {
  VF r{};
  for (int l = 0; l < k; ++l) r.v[l] = p[l];
  return r;
}
inline void store(float* p, VF a) { std::memcpy(p, a.v, sizeof a.v); }
inline void store_n(float* p, VF a, int k) {
  for (int l = 0; l < k; ++l) p[l] = a.v[l];
}
inline void stream(float* p, VF a) { store(p, a); }
inline void stream_fence() {}
inline VF keep_n(VF a, int k) {
  for (int l = k; l < kF; ++l) a.v[l] = 0.0f;
  return a;
}
inline VF add(VF a, VF b) {
  for (int l = 0; l < kF; ++l) a.v[l] += b.v[l];
  return a;
}
inline VF sub(VF a, VF b) {
  for (int l = 0; l < kF; ++l) a.v[l] -= b.v[l];
  return a;
}
inline VF mul(VF a, VF b) {
  for (int l = 0; l < kF; ++l) a.v[l] *= b.v[l];
  return a;
}
inline VD add(VD a, VD b) {
  for (int l = 0; l < kD; ++l) a.v[l] += b.v[l];
  return a;
}
inline VD loadd(const double* p) {
  VD r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline void stored(double* p, VD a) { std::memcpy(p, a.v, sizeof a.v); }
inline VD cvt_lo(VF a) {
  VD r;
  for (int l = 0; l < kD; ++l) r.v[l] = static_cast<double>(a.v[l]);
  return r;
}
inline VD cvt_hi(VF a) {
  VD r;
  for (int l = 0; l < kD; ++l) r.v[l] = static_cast<double>(a.v[l + kD]);
  return r;
}
inline VD load_cvt(const float* p) {
  VD r;
  for (int l = 0; l < kD; ++l) r.v[l] = static_cast<double>(p[l]);
  return r;
}
inline double hsum(VD a) {
  double t[4], u[2];
  for (int l = 0; l < 4; ++l) t[l] = a.v[l] + a.v[l + 4];
  for (int l = 0; l < 2; ++l) u[l] = t[l] + t[l + 2];
  return u[0] + u[1];
}

#endif

}  // namespace normlab::kernels::NL_TARGET::vec
