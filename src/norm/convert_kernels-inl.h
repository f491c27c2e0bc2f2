// Storage-conversion kernels, compiled once per target: include with NL_TARGET defined to the target's
// name (src/simd/kernels_*.cpp), after row_kernels-inl.h (the table takes its fused row kernels for
// bf16/fp16). See convert_kernels.h for the contract. No include guard on purpose.
//
// The vector paths are chosen by the compiler flags of the including file: AVX-512 (F, BW) for the
// avx512 target, AVX2 + F16C for the avx2 target (every CPU with AVX2 has F16C), the scalar functions of
// normlab/tensor.h otherwise. Tails always use the scalar functions; tests/norm/lowp_norm_test.cpp checks
// every target against them bit for bit.
#ifndef NL_TARGET
#error "define NL_TARGET before including convert_kernels-inl.h"
#endif

#include "norm/convert_kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__F16C__)
#define NL_CVT_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__F16C__)
#define NL_CVT_AVX2 1
#include <immintrin.h>
#endif

namespace normlab::kernels::NL_TARGET::cvt {
namespace {

inline std::uint16_t narrow1(float x, int f) {
  return f == kBf16 ? detail::bf16_bits_from_float(x) : detail::f16_bits_from_float(x);
}
inline float widen1(std::uint16_t h, int f) {
  return f == kBf16 ? detail::float_from_bf16_bits(h) : detail::float_from_f16_bits(h);
}

#if defined(NL_CVT_AVX512)
constexpr Index kW = 16;  // floats per vector
using VecF = __m512;
using VecH = __m256i;  // kW halves
// The maskz forms with a full mask: the unmasked intrinsics of GCC 12 trip -Wmaybe-uninitialized.
constexpr __mmask16 kAll = 0xFFFF;
inline VecF widen_v(const std::uint16_t* p, int f) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if (f == kF16) return _mm512_maskz_cvtph_ps(kAll, h);
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, _mm512_maskz_cvtepu16_epi32(kAll, h), 16));
}
inline VecH narrow_v(VecF v, int f) {
  if (f == kF16) return _mm512_maskz_cvtps_ph(kAll, v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // Scalar math: bits = x ≥ NaN ? (x >> 16) | 0x40 : (x + 0x7FFF + ((x >> 16) & 1)) >> 16
  const __m512i x = _mm512_castps_si512(v);
  const __m512i hi = _mm512_maskz_srli_epi32(kAll, x, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i r = _mm512_maskz_srli_epi32(kAll, _mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  return _mm512_maskz_cvtepi32_epi16(kAll, r);
}
inline VecF loadf(const float* p) { return _mm512_loadu_ps(p); }
inline void storef(float* p, VecF v) { _mm512_storeu_ps(p, v); }
inline void storeh(std::uint16_t* p, VecH h) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h); }
inline void streamh(std::uint16_t* p, VecH h) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h); }
constexpr std::uintptr_t kStreamAlign = 32;
#elif defined(NL_CVT_AVX2)
constexpr Index kW = 8;
using VecF = __m256;
using VecH = __m128i;
inline VecF widen_v(const std::uint16_t* p, int f) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (f == kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline VecH narrow_v(VecF v, int f) {
  if (f == kF16) return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  // Scalar math: bits = x ≥ NaN ? (x >> 16) | 0x40 : (x + 0x7FFF + ((x >> 16) & 1)) >> 16
  const __m256i x = _mm256_castps_si256(v);
  const __m256i hi = _mm256_srli_epi32(x, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));  // values ≤ 0xFFFF
}
inline VecF loadf(const float* p) { return _mm256_loadu_ps(p); }
inline void storef(float* p, VecF v) { _mm256_storeu_ps(p, v); }
inline void storeh(std::uint16_t* p, VecH h) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h); }
inline void streamh(std::uint16_t* p, VecH h) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), h); }
constexpr std::uintptr_t kStreamAlign = 16;
#endif

template <int F>
void widen(float* dst, const std::uint16_t* src, Index n) {
  Index i = 0;
#if defined(NL_CVT_AVX512) || defined(NL_CVT_AVX2)
  // Scalar math: dst[i] = float(src[i])
  for (; i + kW <= n; i += kW) storef(dst + i, widen_v(src + i, F));
#endif
  for (; i < n; ++i) dst[i] = widen1(src[i], F);
}

template <int F>
void narrow(std::uint16_t* dst, const float* src, Index n, bool stream) {
  Index i = 0;
#if defined(NL_CVT_AVX512) || defined(NL_CVT_AVX2)
  if (stream) {
    // A scalar head up to the vector-size boundary, then aligned non-temporal stores.
    for (; i < n && (reinterpret_cast<std::uintptr_t>(dst + i) & (kStreamAlign - 1)) != 0; ++i)
      dst[i] = narrow1(src[i], F);
    // Scalar math: dst[i] = round(src[i])
    for (; i + kW <= n; i += kW) streamh(dst + i, narrow_v(loadf(src + i), F));
    for (; i < n; ++i) dst[i] = narrow1(src[i], F);
    _mm_sfence();
    return;
  }
  // Scalar math: dst[i] = round(src[i])
  for (; i + kW <= n; i += kW) storeh(dst + i, narrow_v(loadf(src + i), F));
#else
  (void)stream;
#endif
  for (; i < n; ++i) dst[i] = narrow1(src[i], F);
}

template <int F>
void round_trip(float* x, Index n) {
  Index i = 0;
#if defined(NL_CVT_AVX512) || defined(NL_CVT_AVX2)
  alignas(64) std::uint16_t h[kW];
  // Scalar math: x[i] = float(round(x[i]))
  for (; i + kW <= n; i += kW) {
    storeh(h, narrow_v(loadf(x + i), F));
    storef(x + i, widen_v(h, F));
  }
#endif
  for (; i < n; ++i) x[i] = widen1(narrow1(x[i], F), F);
}

void add(float* s, const float* x, const float* r, Index n) {
  // Scalar math: s[i] = x[i] + r[i] (fp32)
  for (Index i = 0; i < n; ++i) s[i] = x[i] + r[i];
}

void recover_centered(float* xc, const float* y, Index n, double rstd, const float* w, const float* b) {
  // Scalar math: xc[i] = float((y[i] − b[i]) / (w[i]·rstd))
  if (w && b) {
    for (Index i = 0; i < n; ++i)
      xc[i] = static_cast<float>((static_cast<double>(y[i]) - static_cast<double>(b[i])) /
                                 (static_cast<double>(w[i]) * rstd));
  } else if (w) {
    for (Index i = 0; i < n; ++i)
      xc[i] = static_cast<float>(static_cast<double>(y[i]) / (static_cast<double>(w[i]) * rstd));
  } else if (b) {
    for (Index i = 0; i < n; ++i)
      xc[i] = static_cast<float>((static_cast<double>(y[i]) - static_cast<double>(b[i])) / rstd);
  } else {
    for (Index i = 0; i < n; ++i) xc[i] = static_cast<float>(static_cast<double>(y[i]) / rstd);
  }
}

}  // namespace

extern const ConvertKernels kConvertTable;
const ConvertKernels kConvertTable = {{widen<kBf16>, widen<kF16>},
                                      {narrow<kBf16>, narrow<kF16>},
                                      {round_trip<kBf16>, round_trip<kF16>},
                                      add,
                                      recover_centered,
                                      NL_TARGET::rows_forward_of<bfloat16>,
                                      NL_TARGET::rows_forward_of<float16>,
                                      NL_TARGET::rows_backward_of<bfloat16>,
                                      NL_TARGET::rows_backward_of<float16>};

}  // namespace normlab::kernels::NL_TARGET::cvt

#undef NL_CVT_AVX512
#undef NL_CVT_AVX2
