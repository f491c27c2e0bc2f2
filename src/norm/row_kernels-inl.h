// Row kernels, compiled once per target: include with NL_TARGET defined to the target's name.
// See row_kernels.h for the contract. No include guard on purpose.
#ifndef NL_TARGET
#error "define NL_TARGET before including row_kernels-inl.h"
#endif

#include "norm/row_kernels.h"

namespace normlab::kernels::NL_TARGET {
namespace {

// Combines the lanes pairwise in a fixed order: (0+8)+(4+12)... for 16 lanes.
inline double lane_tree(double* acc) {
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

double sum(const float* x, Index n) {
  double acc[kLanes] = {};
  Index i = 0;
  // Scalar math: acc[i % kLanes] += x[i]
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += static_cast<double>(x[i + l]);
  for (int l = 0; i + l < n; ++l) acc[l] += static_cast<double>(x[i + l]);
  return lane_tree(acc);
}

double sum_sq_dev(const float* x, Index n, double mean) {
  double acc[kLanes] = {};
  Index i = 0;
  // Scalar math: d = x[i] − mean; acc[i % kLanes] += d·d
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const double d = static_cast<double>(x[i + l]) - mean;
      acc[l] += d * d;
    }
  for (int l = 0; i + l < n; ++l) {
    const double d = static_cast<double>(x[i + l]) - mean;
    acc[l] += d * d;
  }
  return lane_tree(acc);
}

void forward(float* y, const float* x, Index n, double mean, double rstd, const float* w, const float* b) {
  // Scalar math: y[i] = float((x[i] − mean)·rstd·w[i] + b[i])
  if (w && b) {
    for (Index i = 0; i < n; ++i)
      y[i] = static_cast<float>((static_cast<double>(x[i]) - mean) * rstd * static_cast<double>(w[i]) +
                                static_cast<double>(b[i]));
  } else if (w) {
    for (Index i = 0; i < n; ++i)
      y[i] = static_cast<float>((static_cast<double>(x[i]) - mean) * rstd * static_cast<double>(w[i]));
  } else if (b) {
    for (Index i = 0; i < n; ++i)
      y[i] = static_cast<float>((static_cast<double>(x[i]) - mean) * rstd + static_cast<double>(b[i]));
  } else {
    for (Index i = 0; i < n; ++i) y[i] = static_cast<float>((static_cast<double>(x[i]) - mean) * rstd);
  }
}

void backward_sums(double* sums, double* dw, double* db, const float* dy, const float* x, Index n,
                   double mean, double rstd, const float* w) {
  double sg[kLanes] = {}, sgx[kLanes] = {};
  // Scalar math: x̂ = (x[i] − mean)·rstd; g = dy[i]·w[i]; Σg += g; Σgx̂ += g·x̂;
  //              dw[i] += dy[i]·x̂; db[i] += dy[i]
  auto step = [&](Index i, int l) {
    const double xh = (static_cast<double>(x[i]) - mean) * rstd;
    const double d = static_cast<double>(dy[i]);
    const double g = w ? d * static_cast<double>(w[i]) : d;
    sg[l] += g;
    sgx[l] += g * xh;
  };
  Index i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) step(i + l, l);
  for (int l = 0; i + l < n; ++l) step(i + l, l);
  sums[0] = lane_tree(sg);
  sums[1] = lane_tree(sgx);
  if (dw)
    for (Index j = 0; j < n; ++j)
      dw[j] += static_cast<double>(dy[j]) * ((static_cast<double>(x[j]) - mean) * rstd);
  if (db)
    for (Index j = 0; j < n; ++j) db[j] += static_cast<double>(dy[j]);
}

void backward_dx(float* dx, const float* dy, const float* x, Index n, double mean, double rstd,
                 const float* w, double mean_g, double mean_gx) {
  // Scalar math: dx[i] = float(rstd·(dy[i]·w[i] − mean_g − x̂·mean_gx)), x̂ = (x[i] − mean)·rstd
  for (Index i = 0; i < n; ++i) {
    const double xh = (static_cast<double>(x[i]) - mean) * rstd;
    const double g = w ? static_cast<double>(dy[i]) * static_cast<double>(w[i]) : static_cast<double>(dy[i]);
    dx[i] = static_cast<float>(rstd * (g - mean_g - xh * mean_gx));
  }
}

void forward_scalar(float* y, const float* x, Index n, double mean, double rstd, double w, double b) {
  // Scalar math: y[i] = float((x[i] − mean)·rstd·w + b)
  for (Index i = 0; i < n; ++i) y[i] = static_cast<float>((static_cast<double>(x[i]) - mean) * rstd * w + b);
}

void backward_dx_scalar(float* dx, const float* dy, const float* x, Index n, double mean, double rstd,
                        double w, double mean_g, double mean_gx) {
  // Scalar math: dx[i] = float(rstd·(dy[i]·w − mean_g − x̂·mean_gx)), x̂ = (x[i] − mean)·rstd
  for (Index i = 0; i < n; ++i) {
    const double xh = (static_cast<double>(x[i]) - mean) * rstd;
    dx[i] = static_cast<float>(rstd * (static_cast<double>(dy[i]) * w - mean_g - xh * mean_gx));
  }
}

}  // namespace

extern const RowKernels kTable;
const RowKernels kTable = {sum,         sum_sq_dev,     forward,           backward_sums,
                           backward_dx, forward_scalar, backward_dx_scalar};

}  // namespace normlab::kernels::NL_TARGET
