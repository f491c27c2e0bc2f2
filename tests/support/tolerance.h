// The one numeric-tolerance helper for normlab's tests.
//
// An fp32 result r is accepted against a reference ref (double) when
//     |r − ref| ≤ k · FLT_EPSILON · max(|ref|, scale)
// k is a small budget in units of fp32 epsilon; `scale` is the magnitude below which absolute error is
// what matters (e.g. the size of typical values of the quantity). NaNs must match NaNs. Exactly
// representable cases use expect_bitwise instead.
#pragma once

#include <gtest/gtest.h>
#include <normlab/tensor.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>
#include <string>

namespace normlab::testing {

struct Tol {
  double k = 8;        // budget in fp32 epsilons
  double scale = 1.0;  // magnitude floor
  double bound(double ref) const { return k * FLT_EPSILON * std::max(std::fabs(ref), scale); }
};

// The largest |value| of a contiguous tensor: the magnitude scale of a quantity, for Tol::scale.
template <typename T>
double max_abs(const BasicTensor<T>& t) {
  double m = 0;
  for (Index i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(static_cast<double>(t[i])));
  return m;
}

// The largest |value| of any strided float view.
inline double max_abs(ConstView v) {
  double m = 0;
  for_each_offset(v.shape(), v.strides(), [&](Index off) { m = std::max(m, std::fabs(double{v.data()[off]})); });
  return m;
}

// The scale for dx of a normalization, dx = rstd·(g − mean(g) − x̂·mean(g·x̂)): the magnitude of the terms
// that cancel, rstd·|dy|·|γ| (w may be undefined: γ = 1). A group of two elements has dx ≡ 0 exactly, so
// max|dx| alone is no scale.
inline double dx_scale(const BasicTensor<double>& dx, const BasicTensor<double>& rstd, ConstView dy, ConstView w) {
  const double wmax = w.defined() ? max_abs(w) : 1.0;
  return std::max(max_abs(dx), max_abs(rstd) * max_abs(dy) * wmax);
}

// The scales of dγ and dβ of a LayerNorm/RMSNorm over `axes` (negative counts from the end): per normalized
// element j the sums over the groups of the magnitudes of the terms the kernels add up, Σ_g |dy·x̂| and
// Σ_g |dy| (x̂ from the reference's double mean, rstd per group; mean empty for RMSNorm), their maxima over
// j. docs/numerics.md bounds dγ's error by ≈ 4.75ε and dβ's by 1.5ε of these sums; when the terms cancel,
// max|dγ| and max|dβ| are no scale.
struct ParamGradScales {
  double dw = 0, db = 0;
};
inline ParamGradScales param_grad_scales(ConstView dy, ConstView x, const BasicTensor<double>& mean,
                                         const BasicTensor<double>& rstd, const std::vector<int>& axes) {
  const int rank = x.rank();
  std::vector<bool> normalized(static_cast<std::size_t>(rank), false);
  for (int a : axes) normalized[static_cast<std::size_t>(a < 0 ? a + rank : a)] = true;
  Index n = 1;
  for (int d = 0; d < rank; ++d)
    if (normalized[static_cast<std::size_t>(d)]) n *= x.size(d);
  std::vector<double> sw(static_cast<std::size_t>(n), 0.0), sb(static_cast<std::size_t>(n), 0.0);
  std::vector<Index> idx(static_cast<std::size_t>(rank), 0);
  for (Index e = 0; e < x.numel(); ++e) {
    Index g = 0, j = 0, xo = 0, dyo = 0;
    for (int d = 0; d < rank; ++d) {
      const Index i = idx[static_cast<std::size_t>(d)];
      if (normalized[static_cast<std::size_t>(d)])
        j = j * x.size(d) + i;
      else
        g = g * x.size(d) + i;
      xo += i * x.stride(d);
      dyo += i * dy.stride(d);
    }
    const double m = mean.numel() ? mean[g] : 0.0, dyv = dy.data()[dyo];
    sw[static_cast<std::size_t>(j)] += std::fabs(dyv * (double{x.data()[xo]} - m) * rstd[g]);
    sb[static_cast<std::size_t>(j)] += std::fabs(dyv);
    for (int d = rank - 1; d >= 0 && ++idx[static_cast<std::size_t>(d)] == x.size(d); --d)
      idx[static_cast<std::size_t>(d)] = 0;
  }
  ParamGradScales s;
  for (std::size_t j = 0; j < sw.size(); ++j) {
    s.dw = std::max(s.dw, sw[j]);
    s.db = std::max(s.db, sb[j]);
  }
  return s;
}

// Compares every element of `actual` (any strided float view) with `ref` (contiguous double, same
// shape), reporting the worst element. Returns the worst error in units of the bound.
template <typename Ref>
::testing::AssertionResult all_close(ConstView actual, const Ref& ref, Tol tol, const std::string& what = "") {
  if (actual.shape() != ref.shape())
    return ::testing::AssertionFailure() << what << ": shape " << actual.shape().str() << " vs reference "
                                         << ref.shape().str();
  Index i = 0, worst_i = -1, bad = 0;
  double worst = 0, worst_a = 0, worst_r = 0;
  for_each_offset(actual.shape(), actual.strides(), [&](Index off) {
    const double a = actual.data()[off], r = static_cast<double>(ref.data()[i]);
    const bool both_nan = std::isnan(a) && std::isnan(r);
    const double ratio = both_nan ? 0 : (std::isnan(a) || std::isnan(r)) ? INFINITY : std::fabs(a - r) / tol.bound(r);
    if (ratio > 1) ++bad;
    if (ratio > worst || worst_i < 0) {
      worst = ratio;
      worst_i = i;
      worst_a = a;
      worst_r = r;
    }
    ++i;
  });
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << i << " elements out of tolerance (k=" << tol.k
                                       << " eps, scale " << tol.scale << "); worst at flat index " << worst_i
                                       << ": got " << worst_a << ", reference " << worst_r << " (" << worst
                                       << "× the bound)";
}

// Bitwise equality of two float views of the same shape. Contiguous views are compared in place with one
// memcmp (strided ones are copied first): the large-output tests compare tens of millions of elements, and an
// element-by-element walk at the sanitizer build's -O0 took longer than the kernels under test.
inline ::testing::AssertionResult bitwise_equal(ConstView a, ConstView b, const std::string& what = "") {
  if (a.shape() != b.shape()) return ::testing::AssertionFailure() << what << ": shapes differ";
  Tensor ca, cb;
  const float* pa = a.data();
  const float* pb = b.data();
  if (!a.is_contiguous()) pa = (ca = Tensor::copy_of(a)).data();
  if (!b.is_contiguous()) pb = (cb = Tensor::copy_of(b)).data();
  const Index n = a.numel();
  if (n == 0 || std::memcmp(pa, pb, static_cast<std::size_t>(n) * sizeof(float)) == 0)
    return ::testing::AssertionSuccess();
  Index i = 0;
  while (std::memcmp(pa + i, pb + i, sizeof(float)) == 0) ++i;
  return ::testing::AssertionFailure()
         << what << ": first difference at flat index " << i << ": " << pa[i] << " vs " << pb[i];
}

// Expects `stmt` to throw normlab::Error whose message contains `needle`.
#define EXPECT_NL_ERROR(stmt, needle)                                                        \
  do {                                                                                       \
    try {                                                                                    \
      stmt;                                                                                  \
      ADD_FAILURE() << "expected normlab::Error containing \"" << (needle) << "\"";          \
    } catch (const ::normlab::Error& nl_error_) {                                            \
      EXPECT_NE(std::string(nl_error_.what()).find(needle), std::string::npos)               \
          << "message \"" << nl_error_.what() << "\" lacks \"" << (needle) << "\"";          \
    }                                                                                        \
  } while (0)

}  // namespace normlab::testing
