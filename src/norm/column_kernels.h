// Column kernels: the inner loops of LayerNorm/RMSNorm when the normalized elements are strided and
// the innermost kept axis is contiguous (internal; driver in column_norm.cpp).
//
// A TILE is w ≤ kColumnTile neighbouring groups ("columns") that sit side by side in memory: row r of
// the tile (r < n, the r-th normalized element in row-major order of the normalized axes) holds the w
// columns' elements at base + off[r] + j, j < w. Every per-column quantity is a sum over r in
// increasing order in double, one accumulator per column: lanes are independent, so vectorizing along
// j changes nothing and every instruction set computes the same bits. Elementwise math is double with
// one final rounding to float, as in the row kernels. The only cross-column sums are the dγ/dβ
// contributions of a tile (backward_sums), combined in a fixed order described there.
//
// One source file (column_kernels-inl.h) is compiled once per instruction set (src/simd/kernels_*.cpp).
#pragma once

#include <normlab/tensor.h>

namespace normlab::kernels {

inline constexpr Index kColumnTile = 64;  // columns per tile (8 blocks of 8)

struct ColumnKernels {
  // Per column j < w, two passes: mean[j] = Σ_r x[xoff[r] + j] / n (0 when !center), then
  // rstd[j] = 1/√(Σ_r (x − mean[j])² / n + eps).
  void (*stats)(double* mean, double* rstd, const float* x, const Index* xoff, Index n, Index w, double eps,
                bool center);
  // y[yoff[r] + j] = float((x − mean[j])·rstd[j]·wt[r] + b[r]); wt and b may be null. y may equal x.
  void (*forward)(float* y, const Index* yoff, const float* x, const Index* xoff, Index n, Index w,
                  const double* mean, const double* rstd, const float* wt, const float* b);
  // With g = dy·wt[r] and x̂ = (x − mean[j])·rstd[j]: sg[j] = Σ_r g, sgx[j] = Σ_r g·x̂; and, when not
  // null, dw[r] += Σ_j dy·x̂ and db[r] += Σ_j dy, where the sum over j runs as: column j < 8·⌊w/8⌋
  // goes to lane j mod 8 (blocks in increasing order), the 8 lanes are combined by the fixed tree
  // (l += l+4, l += l+2, l += l+1), then the remaining columns are added in increasing j.
  void (*backward_sums)(double* sg, double* sgx, double* dw, double* db, const float* dy, const Index* dyoff,
                        const float* x, const Index* xoff, Index n, Index w, const double* mean,
                        const double* rstd, const float* wt);
  // dx[dxoff[r] + j] = float(rstd[j]·(dy·wt[r] − mg[j] − x̂·mgx[j])). dx may equal dy or x.
  void (*backward_dx)(float* dx, const Index* dxoff, const float* dy, const Index* dyoff, const float* x,
                      const Index* xoff, Index n, Index w, const double* mean, const double* rstd,
                      const float* wt, const double* mg, const double* mgx);
  // Over one contiguous segment of n floats, with d = x[i] − c: s[0] = Σ d, s[1] = Σ d², and when dy is
  // not null s[2] = Σ dy, s[3] = Σ dy·d (also used by the channel-norm engine: moments of a segment
  // around one of its own values, in one pass). Element i < 16·⌊n/16⌋ goes to lane i mod 16, the 16
  // lanes are combined by the fixed tree (l += l+8, +4, +2, +1), then the rest is added in order.
  void (*segment_sums)(double* s, const float* x, const float* dy, Index n, double c);
  // dst[i] = src[i] with non-temporal stores where dst is 64-byte aligned (ordinary stores at the
  // unaligned ends); for outputs that do not fit in cache (also used by the channel-norm engine). Call
  // store_fence() before another thread may read dst.
  void (*copy_stream)(float* dst, const float* src, Index n);
  void (*store_fence)();
};

// The table for the active instruction set (see normlab/simd.h).
const ColumnKernels& column_kernels();

}  // namespace normlab::kernels
