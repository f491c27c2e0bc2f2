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
// How far ahead recover_centered prefetches y and pf, in bytes. The memory-efficient backward out of cache
// (docs/PERFORMANCE.md, twenty-eighth session; Intel Xeon, 1 thread, single runs): 1 KiB took 0.90-0.95 of
// the time of 512 bytes and 0.96-0.98 of 2 KiB; without y's prefetch and with pf's at the element itself
// (no look-ahead) the time was 1.11-1.20 of 1 KiB's.
inline constexpr std::uintptr_t kRecoverPrefetchBytes = 1024;

template <bool W, bool B>
void recover_centered_impl(float* xc, const float* y, Index n, double inv_rstd, const double* inv_w,
                           const float* b, const float* pf) {
  const vec::VD ir = vec::bcastd(inv_rstd);
  Index i = 0;
  // Scalar math: xc[i] = float(((y[i] − b[i])·inv_w[i])·inv_rstd) in double
  //              (without inv_w: (y[i] − b[i])·inv_rstd; without b: y[i] in place of y[i] − b[i])
  for (; i + kW <= n; i += kW) {
    if (pf) vec::prefetch_lines(reinterpret_cast<std::uintptr_t>(pf + i) + kRecoverPrefetchBytes, 1);
    vec::prefetch_lines(reinterpret_cast<std::uintptr_t>(y + i) + kRecoverPrefetchBytes, 1);
    const vec::VF yv = vec::load(y + i);
    vec::VF bv{};
    if constexpr (B) bv = vec::load(b + i);
    vec::VD out[2];
    for (int h = 0; h < 2; ++h) {
      vec::VD v = h ? vec::cvt_hi(yv) : vec::cvt_lo(yv);
      if constexpr (B) v = vec::sub(v, h ? vec::cvt_hi(bv) : vec::cvt_lo(bv));
      if constexpr (W) v = vec::mul(v, vec::loadd(inv_w + i + h * vec::kD));
      out[h] = vec::mul(v, ir);
    }
    vec::store(xc + i, vec::narrow_pd(out[0], out[1]));
  }
  for (; i < n; ++i) {
    double v = B ? static_cast<double>(y[i]) - static_cast<double>(b[i]) : static_cast<double>(y[i]);
    if (W) v = v * inv_w[i];
    xc[i] = static_cast<float>(v * inv_rstd);
  }
}

void recover_centered(float* xc, const float* y, Index n, double inv_rstd, const double* inv_w,
                      const float* b, const float* pf) {
  if (inv_w && b) return recover_centered_impl<true, true>(xc, y, n, inv_rstd, inv_w, b, pf);
  if (inv_w) return recover_centered_impl<true, false>(xc, y, n, inv_rstd, inv_w, b, pf);
  if (b) return recover_centered_impl<false, true>(xc, y, n, inv_rstd, inv_w, b, pf);
  recover_centered_impl<false, false>(xc, y, n, inv_rstd, inv_w, b, pf);
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
