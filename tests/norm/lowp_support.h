// Helpers for the bf16/fp16 storage tests: narrowing and widening copies, the storage ulp, and a
// comparison in storage ulps.
#pragma once

#include <gtest/gtest.h>
#include <normlab/tensor.h>

#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

namespace normlab::testing {

// A contiguous copy of any float view, each element rounded to T (or any T view widened to float).
template <typename T, typename U>
BasicTensor<T> convert_copy(const TensorView<U>& v) {
  return BasicTensor<T>::copy_of(v);
}

template <typename T>
constexpr const char* type_name() {
  return std::is_same_v<T, bfloat16> ? "bf16" : std::is_same_v<T, float16> ? "fp16" : "fp32";
}

// The spacing of T's values at |v| (for |v| at most T's largest finite value).
template <typename T>
double storage_ulp(double v) {
  constexpr int kMant = std::is_same_v<T, bfloat16> ? 7 : std::is_same_v<T, float16> ? 10 : 23;
  constexpr int kEmin = std::is_same_v<T, float16> ? -14 : -126;
  int e = (v == 0 || !std::isfinite(v)) ? kEmin : std::ilogb(std::fabs(v));
  if (e < kEmin) e = kEmin;
  return std::ldexp(1.0, e - kMant);
}

// Every element of `a` (T, any strides) is within `ulps` storage ulps of `b` (T, same shape): the ulp
// taken at the larger magnitude of the two. NaN must meet NaN, ±Inf the same ±Inf. `*exact` counts
// bitwise-equal elements.
template <typename T>
::testing::AssertionResult within_ulps(TensorView<const T> a, TensorView<const T> b, double ulps,
                                       const std::string& what, Index* exact = nullptr) {
  if (a.shape() != b.shape()) return ::testing::AssertionFailure() << what << ": shapes differ";
  // The same bits everywhere (what the same-bits tests expect): one memcmp when both views are contiguous.
  // Element by element, at the sanitizer build's -O0, this check took longer than the kernels under test.
  if (a.is_contiguous() && b.is_contiguous() &&
      std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(T)) == 0) {
    if (exact) *exact = a.numel();
    return ::testing::AssertionSuccess();
  }
  BasicTensor<T> ca = BasicTensor<T>::copy_of(a), cb = BasicTensor<T>::copy_of(b);
  Index same = 0;
  for (Index i = 0; i < ca.numel(); ++i) {
    if (ca[i].bits == cb[i].bits) {
      ++same;
      continue;
    }
    const double x = static_cast<float>(ca[i]), y = static_cast<float>(cb[i]);
    const bool ok = std::isfinite(x) && std::isfinite(y) &&
                    std::fabs(x - y) <= ulps * storage_ulp<T>(std::max(std::fabs(x), std::fabs(y)));
    if (!ok)
      return ::testing::AssertionFailure() << what << ": flat index " << i << ": " << x << " vs " << y << " (bits "
                                           << ca[i].bits << " vs " << cb[i].bits << "), more than " << ulps
                                           << " " << type_name<T>() << " ulp apart";
  }
  if (exact) *exact = same;
  return ::testing::AssertionSuccess();
}

}  // namespace normlab::testing
