// Fused residual add + LayerNorm/RMSNorm and the memory-efficient (from-output) backward (norm.h): the
// storage engine (storage_norm.h) with a residual operand, or with statistics recovered from y.
#include "norm/storage_norm.h"

namespace normlab {

namespace {
constexpr storage::FwdNames kAddLnFwd{"add_layer_norm_forward", true};
constexpr storage::BwdNames kAddLnBwd{"add_layer_norm_backward", true};
constexpr storage::FwdNames kAddRmsFwd{"add_rms_norm_forward", false};
constexpr storage::BwdNames kAddRmsBwd{"add_rms_norm_backward", false};

// keep: the overload with NormStats (which must then be given).
template <typename T>
void add_ln_forward(TensorView<T> s, View y_mean, TensorView<T> y, View rstd, TensorView<const T> x,
                    TensorView<const T> residual, ConstView weight, ConstView bias, const Axes& axes,
                    double eps, const storage::FwdNames& nm, bool keep = false, NormStats* stats = nullptr) {
  NL_CHECK(!keep || stats != nullptr, "{}: stats is null (use the overload without it)", nm.op);
  NL_CHECK(x.defined() && residual.defined(), "{}: x and residual are required", nm.op);
  storage::forward<T>(nm, s, y, y_mean, rstd, x, residual, weight, bias, axes, eps, stats);
}
template <typename T>
void add_ln_backward(TensorView<T> dx, View dweight, View dbias, TensorView<const T> dy,
                     TensorView<const T> ds, TensorView<const T> s, ConstView weight, const Axes& axes,
                     double eps, GradMode mode, const storage::BwdNames& nm,
                     const NormStats* stats = nullptr) {
  NL_CHECK(s.defined(), "{}: s and dy are required", nm.op);
  storage::backward<T>(nm, dx, dweight, dbias, dy, ds, s, {}, {}, weight, {}, axes, eps, mode, stats);
}
// The backward with the forward's statistics: axes and eps from them.
template <typename T>
void add_ln_backward_saved(TensorView<T> dx, View dweight, View dbias, TensorView<const T> dy,
                           TensorView<const T> ds, TensorView<const T> s, ConstView weight,
                           const NormStats& stats, GradMode mode, const storage::BwdNames& nm) {
  add_ln_backward<T>(dx, dweight, dbias, dy, ds, s, weight, Axes(stats.axes.begin(), stats.axes.end()),
                     stats.eps, mode, nm, &stats);
}
}  // namespace

void add_layer_norm_forward(View s, View y, View mean, View rstd, ConstView x, ConstView residual, ConstView weight,
                            ConstView bias, const Axes& axes, double eps) {
  add_ln_forward<float>(s, mean, y, rstd, x, residual, weight, bias, axes, eps, kAddLnFwd);
}
void add_layer_norm_forward(BF16View s, BF16View y, View mean, View rstd, ConstBF16View x, ConstBF16View residual,
                            ConstView weight, ConstView bias, const Axes& axes, double eps) {
  add_ln_forward<bfloat16>(s, mean, y, rstd, x, residual, weight, bias, axes, eps, kAddLnFwd);
}
void add_layer_norm_forward(F16View s, F16View y, View mean, View rstd, ConstF16View x, ConstF16View residual,
                            ConstView weight, ConstView bias, const Axes& axes, double eps) {
  add_ln_forward<float16>(s, mean, y, rstd, x, residual, weight, bias, axes, eps, kAddLnFwd);
}
void add_layer_norm_backward(View dx, View dweight, View dbias, ConstView dy, ConstView ds, ConstView s,
                             ConstView weight, const Axes& axes, double eps, GradMode mode) {
  add_ln_backward<float>(dx, dweight, dbias, dy, ds, s, weight, axes, eps, mode, kAddLnBwd);
}
void add_layer_norm_backward(BF16View dx, View dweight, View dbias, ConstBF16View dy, ConstBF16View ds,
                             ConstBF16View s, ConstView weight, const Axes& axes, double eps, GradMode mode) {
  add_ln_backward<bfloat16>(dx, dweight, dbias, dy, ds, s, weight, axes, eps, mode, kAddLnBwd);
}
void add_layer_norm_backward(F16View dx, View dweight, View dbias, ConstF16View dy, ConstF16View ds,
                             ConstF16View s, ConstView weight, const Axes& axes, double eps, GradMode mode) {
  add_ln_backward<float16>(dx, dweight, dbias, dy, ds, s, weight, axes, eps, mode, kAddLnBwd);
}

void add_rms_norm_forward(View s, View y, View rstd, ConstView x, ConstView residual, ConstView weight,
                          const Axes& axes, double eps) {
  add_ln_forward<float>(s, {}, y, rstd, x, residual, weight, {}, axes, eps, kAddRmsFwd);
}
void add_rms_norm_forward(BF16View s, BF16View y, View rstd, ConstBF16View x, ConstBF16View residual,
                          ConstView weight, const Axes& axes, double eps) {
  add_ln_forward<bfloat16>(s, {}, y, rstd, x, residual, weight, {}, axes, eps, kAddRmsFwd);
}
void add_rms_norm_forward(F16View s, F16View y, View rstd, ConstF16View x, ConstF16View residual,
                          ConstView weight, const Axes& axes, double eps) {
  add_ln_forward<float16>(s, {}, y, rstd, x, residual, weight, {}, axes, eps, kAddRmsFwd);
}

void add_rms_norm_backward(View dx, View dweight, ConstView dy, ConstView ds, ConstView s, ConstView weight,
                           const Axes& axes, double eps, GradMode mode) {
  add_ln_backward<float>(dx, dweight, {}, dy, ds, s, weight, axes, eps, mode, kAddRmsBwd);
}
void add_rms_norm_backward(BF16View dx, View dweight, ConstBF16View dy, ConstBF16View ds, ConstBF16View s,
                           ConstView weight, const Axes& axes, double eps, GradMode mode) {
  add_ln_backward<bfloat16>(dx, dweight, {}, dy, ds, s, weight, axes, eps, mode, kAddRmsBwd);
}
void add_rms_norm_backward(F16View dx, View dweight, ConstF16View dy, ConstF16View ds, ConstF16View s,
                           ConstView weight, const Axes& axes, double eps, GradMode mode) {
  add_ln_backward<float16>(dx, dweight, {}, dy, ds, s, weight, axes, eps, mode, kAddRmsBwd);
}

void add_layer_norm_forward(View s, View y, View mean, View rstd, ConstView x, ConstView residual,
                            ConstView weight, ConstView bias, const Axes& axes, double eps,
                            NormStats* stats) {
  add_ln_forward<float>(s, mean, y, rstd, x, residual, weight, bias, axes, eps, kAddLnFwd, true, stats);
}
void add_layer_norm_forward(BF16View s, BF16View y, View mean, View rstd, ConstBF16View x,
                            ConstBF16View residual, ConstView weight, ConstView bias, const Axes& axes,
                            double eps, NormStats* stats) {
  add_ln_forward<bfloat16>(s, mean, y, rstd, x, residual, weight, bias, axes, eps, kAddLnFwd, true, stats);
}
void add_layer_norm_forward(F16View s, F16View y, View mean, View rstd, ConstF16View x, ConstF16View residual,
                            ConstView weight, ConstView bias, const Axes& axes, double eps,
                            NormStats* stats) {
  add_ln_forward<float16>(s, mean, y, rstd, x, residual, weight, bias, axes, eps, kAddLnFwd, true, stats);
}

void add_layer_norm_backward_saved(View dx, View dweight, View dbias, ConstView dy, ConstView ds, ConstView s,
                                   ConstView weight, const NormStats& stats, GradMode mode) {
  add_ln_backward_saved<float>(dx, dweight, dbias, dy, ds, s, weight, stats, mode, kAddLnBwd);
}
void add_layer_norm_backward_saved(BF16View dx, View dweight, View dbias, ConstBF16View dy, ConstBF16View ds,
                                   ConstBF16View s, ConstView weight, const NormStats& stats, GradMode mode) {
  add_ln_backward_saved<bfloat16>(dx, dweight, dbias, dy, ds, s, weight, stats, mode, kAddLnBwd);
}
void add_layer_norm_backward_saved(F16View dx, View dweight, View dbias, ConstF16View dy, ConstF16View ds,
                                   ConstF16View s, ConstView weight, const NormStats& stats, GradMode mode) {
  add_ln_backward_saved<float16>(dx, dweight, dbias, dy, ds, s, weight, stats, mode, kAddLnBwd);
}

void add_rms_norm_forward(View s, View y, View rstd, ConstView x, ConstView residual, ConstView weight,
                          const Axes& axes, double eps, NormStats* stats) {
  add_ln_forward<float>(s, {}, y, rstd, x, residual, weight, {}, axes, eps, kAddRmsFwd, true, stats);
}
void add_rms_norm_forward(BF16View s, BF16View y, View rstd, ConstBF16View x, ConstBF16View residual,
                          ConstView weight, const Axes& axes, double eps, NormStats* stats) {
  add_ln_forward<bfloat16>(s, {}, y, rstd, x, residual, weight, {}, axes, eps, kAddRmsFwd, true, stats);
}
void add_rms_norm_forward(F16View s, F16View y, View rstd, ConstF16View x, ConstF16View residual,
                          ConstView weight, const Axes& axes, double eps, NormStats* stats) {
  add_ln_forward<float16>(s, {}, y, rstd, x, residual, weight, {}, axes, eps, kAddRmsFwd, true, stats);
}

void add_rms_norm_backward_saved(View dx, View dweight, ConstView dy, ConstView ds, ConstView s,
                                 ConstView weight, const NormStats& stats, GradMode mode) {
  add_ln_backward_saved<float>(dx, dweight, {}, dy, ds, s, weight, stats, mode, kAddRmsBwd);
}
void add_rms_norm_backward_saved(BF16View dx, View dweight, ConstBF16View dy, ConstBF16View ds,
                                 ConstBF16View s, ConstView weight, const NormStats& stats, GradMode mode) {
  add_ln_backward_saved<bfloat16>(dx, dweight, {}, dy, ds, s, weight, stats, mode, kAddRmsBwd);
}
void add_rms_norm_backward_saved(F16View dx, View dweight, ConstF16View dy, ConstF16View ds, ConstF16View s,
                                 ConstView weight, const NormStats& stats, GradMode mode) {
  add_ln_backward_saved<float16>(dx, dweight, {}, dy, ds, s, weight, stats, mode, kAddRmsBwd);
}

void layer_norm_backward_from_output(View dx, View dweight, View dbias, ConstView dy, ConstView y, ConstView rstd,
                                     ConstView weight, ConstView bias, const Axes& axes, GradMode mode) {
  constexpr storage::BwdNames kNames{"layer_norm_backward_from_output", true};
  NL_CHECK(y.defined(), "{}: y and dy are required", kNames.op);
  storage::backward<float>(kNames, dx, dweight, dbias, dy, {}, {}, y, rstd, weight, bias, axes, 0.0, mode);
}
void rms_norm_backward_from_output(View dx, View dweight, ConstView dy, ConstView y, ConstView rstd,
                                   ConstView weight, const Axes& axes, GradMode mode) {
  constexpr storage::BwdNames kNames{"rms_norm_backward_from_output", false};
  NL_CHECK(y.defined(), "{}: y and dy are required", kNames.op);
  storage::backward<float>(kNames, dx, dweight, {}, dy, {}, {}, y, rstd, weight, {}, axes, 0.0, mode);
}

}  // namespace normlab
