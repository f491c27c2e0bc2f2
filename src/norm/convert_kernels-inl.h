// Storage-conversion kernels, compiled once per target: include with NL_TARGET defined to the target's
// name (src/simd/kernels_*.cpp), after row_kernels-inl.h (the table takes its fused row kernels for
// bf16/fp16). See convert_kernels.h for the contract. No include guard on purpose.
// NL_BF16_ONLY (the avx512bf16 target): only the bf16 entries that round, as kBf16Table.
//
// The vector loops use the widening loads and rounding stores of simd/vec.h (AVX-512, AVX2 + F16C, or
// the scalar functions of normlab/tensor.h, by the including file's target), the same ones the fused row
// kernels use on bf16/fp16 rows. Tails use the scalar functions; tests/norm/lowp_norm_test.cpp checks every
// target against them bit for bit.
#ifndef NL_TARGET
#error "define NL_TARGET before including convert_kernels-inl.h"
#endif

#include <type_traits>

#include "norm/convert_kernels.h"
#include "simd/vec.h"

namespace normlab::kernels::NL_TARGET::cvt {
namespace {

inline std::uint16_t narrow1(float x, int f) {
  return f == kBf16 ? detail::bf16_bits_from_float(x) : detail::f16_bits_from_float(x);
}
inline float widen1(std::uint16_t h, int f) {
  return f == kBf16 ? detail::float_from_bf16_bits(h) : detail::float_from_f16_bits(h);
}

// The 16-bit type of format F.
template <int F>
using HalfT = std::conditional_t<F == kBf16, bfloat16, float16>;
constexpr Index kW = vec::kF;  // elements per vector step

template <int F>
void widen(float* dst, const std::uint16_t* src, Index n) {
  Index i = 0;
  // Scalar math: dst[i] = float(src[i])
  for (; i + kW <= n; i += kW) vec::store(dst + i, vec::widen<HalfT<F>>(vec::hload(src + i)));
  for (; i < n; ++i) dst[i] = widen1(src[i], F);
}

template <int F>
void narrow(std::uint16_t* dst, const float* src, Index n, bool stream) {
  using T = HalfT<F>;
  Index i = 0;
  if (stream) {
    // A scalar head up to the stream alignment, then non-temporal stores.
    for (; i < n && !vec::stream_ok(reinterpret_cast<const T*>(dst + i)); ++i) dst[i] = narrow1(src[i], F);
    // Scalar math: dst[i] = round(src[i])
    for (; i + kW <= n; i += kW) vec::hstream(dst + i, vec::narrow<T>(vec::load(src + i)));
    for (; i < n; ++i) dst[i] = narrow1(src[i], F);
    vec::stream_fence();
    return;
  }
  // Scalar math: dst[i] = round(src[i])
  for (; i + kW <= n; i += kW) vec::hstore(dst + i, vec::narrow<T>(vec::load(src + i)));
  for (; i < n; ++i) dst[i] = narrow1(src[i], F);
}

#ifndef NL_BF16_ONLY
template <bool W, bool B>
void recover_centered_impl(float* xc, const float* y, Index n, double rstd, const float* w, const float* b) {
  const vec::VD rs = vec::bcastd(rstd);
  Index i = 0;
  // Scalar math: xc[i] = float((y[i] − b[i]) / (w[i]·rstd)) in double (without w: / rstd; without b: y[i])
  for (; i + kW <= n; i += kW) {
    const vec::VF yv = vec::load(y + i);
    vec::VF wv{}, bv{};
    if constexpr (W) wv = vec::load(w + i);
    if constexpr (B) bv = vec::load(b + i);
    vec::VD out[2];
    for (int h = 0; h < 2; ++h) {
      vec::VD num = h ? vec::cvt_hi(yv) : vec::cvt_lo(yv);
      if constexpr (B) num = vec::sub(num, h ? vec::cvt_hi(bv) : vec::cvt_lo(bv));
      vec::VD den = rs;
      if constexpr (W) den = vec::mul(h ? vec::cvt_hi(wv) : vec::cvt_lo(wv), rs);
      out[h] = vec::div(num, den);
    }
    vec::store(xc + i, vec::narrow_pd(out[0], out[1]));
  }
  for (; i < n; ++i) {
    const double num = B ? static_cast<double>(y[i]) - static_cast<double>(b[i]) : static_cast<double>(y[i]);
    const double den = W ? static_cast<double>(w[i]) * rstd : rstd;
    xc[i] = static_cast<float>(num / den);
  }
}

void recover_centered(float* xc, const float* y, Index n, double rstd, const float* w, const float* b) {
  if (w && b) return recover_centered_impl<true, true>(xc, y, n, rstd, w, b);
  if (w) return recover_centered_impl<true, false>(xc, y, n, rstd, w, b);
  if (b) return recover_centered_impl<false, true>(xc, y, n, rstd, w, b);
  recover_centered_impl<false, false>(xc, y, n, rstd, w, b);
}
#endif

}  // namespace

#ifdef NL_BF16_ONLY
extern const Bf16Kernels kBf16Table;
const Bf16Kernels kBf16Table = {vec::leave_clean<narrow<kBf16>>,
                                vec::leave_clean<NL_TARGET::rows_forward_of<bfloat16>>,
                                vec::leave_clean<NL_TARGET::rows_backward_of<bfloat16>>};
#else
extern const ConvertKernels kConvertTable;
const ConvertKernels kConvertTable = {{vec::leave_clean<widen<kBf16>>, vec::leave_clean<widen<kF16>>},
                                      {vec::leave_clean<narrow<kBf16>>, vec::leave_clean<narrow<kF16>>},
                                      vec::leave_clean<recover_centered>,
                                      vec::leave_clean<NL_TARGET::rows_forward_of<bfloat16>>,
                                      vec::leave_clean<NL_TARGET::rows_forward_of<float16>>,
                                      vec::leave_clean<NL_TARGET::rows_backward_of<bfloat16>>,
                                      vec::leave_clean<NL_TARGET::rows_backward_of<float16>>};
#endif

}  // namespace normlab::kernels::NL_TARGET::cvt
