// Row kernels: the inner loops of the normalization family over one contiguous group of n floats
// (internal).
//
// One source file (row_kernels-inl.h) is compiled once per instruction set (src/simd/kernels_*.cpp);
// src/simd/dispatch.cpp hands out the table of the active target. Every reduction accumulates in
// double over kLanes interleaved lanes (element i goes to lane i % kLanes) and combines the lanes by a
// fixed pairwise tree, so every target computes the same bits. Elementwise math is double with one
// final rounding to float.
#pragma once

#include <normlab/tensor.h>

namespace normlab::kernels {

inline constexpr int kLanes = 16;

struct RowKernels {
  // Σ x[i]
  double (*sum)(const float* x, Index n);
  // Σ (x[i] − mean)²
  double (*sum_sq_dev)(const float* x, Index n, double mean);
  // y[i] = (x[i] − mean)·rstd·w[i] + b[i]; w and b may be null (γ = 1, β = 0). y may equal x.
  void (*forward)(float* y, const float* x, Index n, double mean, double rstd, const float* w,
                  const float* b);
  // With g = dy·w and x̂ = (x − mean)·rstd: sums[0] = Σ g, sums[1] = Σ g·x̂; and, when not null,
  // dw[i] += dy[i]·x̂[i], db[i] += dy[i] (double accumulators of one chunk of groups).
  void (*backward_sums)(double* sums, double* dw, double* db, const float* dy, const float* x, Index n,
                        double mean, double rstd, const float* w);
  // dx[i] = rstd·(g[i] − mean_g − x̂[i]·mean_gx). dx may equal dy or x.
  void (*backward_dx)(float* dx, const float* dy, const float* x, Index n, double mean, double rstd,
                      const float* w, double mean_g, double mean_gx);
  // The channel-norm family (one γ, β per row): y[i] = (x[i] − mean)·rstd·w + b with scalars w, b
  // (pass w = 1, b = 0 for no affine). y may equal x. Also dx = dy·w·rstd with x = dy, mean = 0, b = 0.
  void (*forward_scalar)(float* y, const float* x, Index n, double mean, double rstd, double w, double b);
  // dx[i] = rstd·(dy[i]·w − mean_g − x̂[i]·mean_gx), x̂ = (x[i] − mean)·rstd, scalar w. dx may equal dy or x.
  void (*backward_dx_scalar)(float* dx, const float* dy, const float* x, Index n, double mean, double rstd,
                             double w, double mean_g, double mean_gx);
};

// The table for the active instruction set (see normlab/simd.h).
const RowKernels& row_kernels();

}  // namespace normlab::kernels
