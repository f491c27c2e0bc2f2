// Storage-conversion kernels for bf16/fp16 storage and the elementwise helpers of the fused norms
// (internal).
//
// One source file (convert_kernels-inl.h) is compiled once per instruction set next to the row kernels
// (src/simd/kernels_*.cpp include it); convert_kernels() hands out the table of the active target
// (normlab::active_isa()). Every entry produces the same bits on every target: the conversions are the
// exact ones of normlab::bfloat16 / normlab::float16 (include/normlab/tensor.h; AVX-512 and AVX2 use
// F16C for fp16 and integer round-to-nearest-even for bf16), and the arithmetic entries are IEEE
// operations in a fixed order, compiled with -ffp-contract=off.
#pragma once

#include <normlab/tensor.h>

#include <cstdint>
#include <type_traits>

#include "norm/row_kernels.h"

namespace normlab::kernels {

// Index into the per-format entries below.
enum StorageFormat : int { kBf16 = 0, kF16 = 1 };

struct ConvertKernels {
  // dst[i] = float(src[i]) (exact)
  void (*widen[2])(float* dst, const std::uint16_t* src, Index n);
  // dst[i] = round-to-nearest-even(src[i]); non-temporal stores when `stream` (for outputs that do not
  // fit in cache; the caller has no use for them in cache afterwards). dst must not overlap src.
  void (*narrow[2])(std::uint16_t* dst, const float* src, Index n, bool stream);
  // xc[i] = float(((y[i] − b[i])·inv_w[i])·inv_rstd) in double, with inv_w[i] = 1/γ_i and inv_rstd = 1/rstd
  // (double): the centred input x − mean = (y − β)/(γ·rstd) recovered from a norm's output, within about
  // 3 double ulps before the one rounding to fp32 (inv_w, b may be null: γ = 1, β = 0). xc may equal y.
  // Prefetches y's lines 1 KiB ahead, and those of pf (may be null) as far past pf + i as y's are past y + i,
  // one line per 16 elements: pf is the caller's next operand, then read from memory along with y instead
  // of after it.
  void (*recover_centered)(float* xc, const float* y, Index n, double inv_rstd, const double* inv_w,
                           const float* b, const float* pf);
  // The fused LayerNorm/RMSNorm row kernels (row_kernels.h) on bf16 / fp16 rows: the same code as
  // RowKernels::rows_forward / rows_backward, reading and writing the 16-bit type directly.
  void (*rows_forward_bf16)(const RowsForwardOf<bfloat16>& args);
  void (*rows_forward_f16)(const RowsForwardOf<float16>& args);
  void (*rows_backward_bf16)(const RowsBackwardOf<bfloat16>& args);
  void (*rows_backward_f16)(const RowsBackwardOf<float16>& args);
};

// The entries of ConvertKernels that round to bf16, as the avx512bf16 target compiles them (its table is
// avx512's with these in place; normlab/simd.h).
struct Bf16Kernels {
  void (*narrow)(std::uint16_t* dst, const float* src, Index n, bool stream);
  void (*rows_forward)(const RowsForwardOf<bfloat16>& args);
  void (*rows_backward)(const RowsBackwardOf<bfloat16>& args);
};

// The entries for storage type T (bfloat16 or float16).
template <typename T>
auto rows_forward_for(const ConvertKernels& cv) {
  if constexpr (std::is_same_v<T, bfloat16>) return cv.rows_forward_bf16;
  else return cv.rows_forward_f16;
}
template <typename T>
auto rows_backward_for(const ConvertKernels& cv) {
  if constexpr (std::is_same_v<T, bfloat16>) return cv.rows_backward_bf16;
  else return cv.rows_backward_f16;
}

// The table for the active instruction set (see normlab/simd.h).
const ConvertKernels& convert_kernels();

}  // namespace normlab::kernels
