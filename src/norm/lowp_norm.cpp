// LayerNorm and RMSNorm with bf16/fp16 storage (norm.h): the storage engine (storage_norm.h) without a
// residual, statistics from x.
#include "norm/storage_norm.h"

namespace normlab {

namespace {
constexpr storage::FwdNames kLnFwd{"layer_norm_forward", true};
constexpr storage::BwdNames kLnBwd{"layer_norm_backward", true};
constexpr storage::FwdNames kRmsFwd{"rms_norm_forward", false};
constexpr storage::BwdNames kRmsBwd{"rms_norm_backward", false};

template <typename T>
void ln_forward(TensorView<T> y, View mean, View rstd, TensorView<const T> x, ConstView weight, ConstView bias,
                const Axes& axes, double eps) {
  storage::forward<T>(kLnFwd, {}, y, mean, rstd, x, {}, weight, bias, axes, eps);
}
template <typename T>
void ln_backward(TensorView<T> dx, View dweight, View dbias, TensorView<const T> dy, TensorView<const T> x,
                 ConstView weight, const Axes& axes, double eps, GradMode mode) {
  NL_CHECK(x.defined(), "layer_norm_backward: x and dy are required");
  storage::backward<T>(kLnBwd, dx, dweight, dbias, dy, {}, x, {}, {}, weight, {}, axes, eps, mode);
}
template <typename T>
void rms_forward(TensorView<T> y, View rstd, TensorView<const T> x, ConstView weight, const Axes& axes, double eps) {
  storage::forward<T>(kRmsFwd, {}, y, {}, rstd, x, {}, weight, {}, axes, eps);
}
template <typename T>
void rms_backward(TensorView<T> dx, View dweight, TensorView<const T> dy, TensorView<const T> x, ConstView weight,
                  const Axes& axes, double eps, GradMode mode) {
  NL_CHECK(x.defined(), "rms_norm_backward: x and dy are required");
  storage::backward<T>(kRmsBwd, dx, dweight, {}, dy, {}, x, {}, {}, weight, {}, axes, eps, mode);
}
template <typename T>
void ln_forward_keep(TensorView<T> y, View mean, View rstd, TensorView<const T> x, ConstView weight,
                     ConstView bias, const Axes& axes, double eps, NormStats* stats) {
  NL_CHECK(stats != nullptr, "layer_norm_forward: stats is null (use the overload without it)");
  storage::forward<T>(kLnFwd, {}, y, mean, rstd, x, {}, weight, bias, axes, eps, stats);
}
template <typename T>
void ln_backward_saved(TensorView<T> dx, View dweight, View dbias, TensorView<const T> dy,
                       TensorView<const T> x, ConstView weight, const NormStats& stats, GradMode mode) {
  NL_CHECK(x.defined(), "layer_norm_backward: x and dy are required");
  storage::backward<T>(kLnBwd, dx, dweight, dbias, dy, {}, x, {}, {}, weight, {},
                       Axes(stats.axes.begin(), stats.axes.end()), stats.eps, mode, &stats);
}
template <typename T>
void rms_forward_keep(TensorView<T> y, View rstd, TensorView<const T> x, ConstView weight, const Axes& axes,
                      double eps, NormStats* stats) {
  NL_CHECK(stats != nullptr, "rms_norm_forward: stats is null (use the overload without it)");
  storage::forward<T>(kRmsFwd, {}, y, {}, rstd, x, {}, weight, {}, axes, eps, stats);
}
template <typename T>
void rms_backward_saved(TensorView<T> dx, View dweight, TensorView<const T> dy, TensorView<const T> x,
                        ConstView weight, const NormStats& stats, GradMode mode) {
  NL_CHECK(x.defined(), "rms_norm_backward: x and dy are required");
  storage::backward<T>(kRmsBwd, dx, dweight, {}, dy, {}, x, {}, {}, weight, {},
                       Axes(stats.axes.begin(), stats.axes.end()), stats.eps, mode, &stats);
}
}  // namespace

void layer_norm_forward(BF16View y, View mean, View rstd, ConstBF16View x, ConstView weight, ConstView bias,
                        const Axes& axes, double eps) {
  ln_forward<bfloat16>(y, mean, rstd, x, weight, bias, axes, eps);
}
void layer_norm_forward(F16View y, View mean, View rstd, ConstF16View x, ConstView weight, ConstView bias,
                        const Axes& axes, double eps) {
  ln_forward<float16>(y, mean, rstd, x, weight, bias, axes, eps);
}
void layer_norm_backward(BF16View dx, View dweight, View dbias, ConstBF16View dy, ConstBF16View x, ConstView weight,
                         const Axes& axes, double eps, GradMode mode) {
  ln_backward<bfloat16>(dx, dweight, dbias, dy, x, weight, axes, eps, mode);
}
void layer_norm_backward(F16View dx, View dweight, View dbias, ConstF16View dy, ConstF16View x, ConstView weight,
                         const Axes& axes, double eps, GradMode mode) {
  ln_backward<float16>(dx, dweight, dbias, dy, x, weight, axes, eps, mode);
}
void rms_norm_forward(BF16View y, View rstd, ConstBF16View x, ConstView weight, const Axes& axes, double eps) {
  rms_forward<bfloat16>(y, rstd, x, weight, axes, eps);
}
void rms_norm_forward(F16View y, View rstd, ConstF16View x, ConstView weight, const Axes& axes, double eps) {
  rms_forward<float16>(y, rstd, x, weight, axes, eps);
}
void rms_norm_backward(BF16View dx, View dweight, ConstBF16View dy, ConstBF16View x, ConstView weight,
                       const Axes& axes, double eps, GradMode mode) {
  rms_backward<bfloat16>(dx, dweight, dy, x, weight, axes, eps, mode);
}
void rms_norm_backward(F16View dx, View dweight, ConstF16View dy, ConstF16View x, ConstView weight,
                       const Axes& axes, double eps, GradMode mode) {
  rms_backward<float16>(dx, dweight, dy, x, weight, axes, eps, mode);
}

// With NormStats (norm.h): the forward keeps its double statistics, the backward takes them.
void layer_norm_forward(BF16View y, View mean, View rstd, ConstBF16View x, ConstView weight, ConstView bias,
                        const Axes& axes, double eps, NormStats* stats) {
  ln_forward_keep<bfloat16>(y, mean, rstd, x, weight, bias, axes, eps, stats);
}
void layer_norm_forward(F16View y, View mean, View rstd, ConstF16View x, ConstView weight, ConstView bias,
                        const Axes& axes, double eps, NormStats* stats) {
  ln_forward_keep<float16>(y, mean, rstd, x, weight, bias, axes, eps, stats);
}
void layer_norm_backward_saved(BF16View dx, View dweight, View dbias, ConstBF16View dy, ConstBF16View x,
                               ConstView weight, const NormStats& stats, GradMode mode) {
  ln_backward_saved<bfloat16>(dx, dweight, dbias, dy, x, weight, stats, mode);
}
void layer_norm_backward_saved(F16View dx, View dweight, View dbias, ConstF16View dy, ConstF16View x,
                               ConstView weight, const NormStats& stats, GradMode mode) {
  ln_backward_saved<float16>(dx, dweight, dbias, dy, x, weight, stats, mode);
}
void rms_norm_forward(BF16View y, View rstd, ConstBF16View x, ConstView weight, const Axes& axes, double eps,
                      NormStats* stats) {
  rms_forward_keep<bfloat16>(y, rstd, x, weight, axes, eps, stats);
}
void rms_norm_forward(F16View y, View rstd, ConstF16View x, ConstView weight, const Axes& axes, double eps,
                      NormStats* stats) {
  rms_forward_keep<float16>(y, rstd, x, weight, axes, eps, stats);
}
void rms_norm_backward_saved(BF16View dx, View dweight, ConstBF16View dy, ConstBF16View x, ConstView weight,
                             const NormStats& stats, GradMode mode) {
  rms_backward_saved<bfloat16>(dx, dweight, dy, x, weight, stats, mode);
}
void rms_norm_backward_saved(F16View dx, View dweight, ConstF16View dy, ConstF16View x, ConstView weight,
                             const NormStats& stats, GradMode mode) {
  rms_backward_saved<float16>(dx, dweight, dy, x, weight, stats, mode);
}

}  // namespace normlab
