// LayerNorm over any set of axes: the row-group engine (row_norm.cpp) with centring on.
#include "norm/norm_plan.h"
#include "norm/row_norm.h"

namespace normlab {

Dims kept_shape(const Dims& x_shape, const Axes& axes) {
  return plan::split_axes(x_shape, axes, "kept_shape").k_shape;
}

Dims normalized_shape(const Dims& x_shape, const Axes& axes) {
  return plan::split_axes(x_shape, axes, "normalized_shape").n_shape;
}

// x is any shape; y like x; mean, rstd like the kept axes; weight, bias like the normalized axes.
void layer_norm_forward(View y, View mean, View rstd, ConstView x, ConstView weight, ConstView bias,
                        const Axes& axes, double eps) {
  row_norm_forward(kLayerNormKind, y, mean, rstd, x, weight, bias, axes, eps, nullptr);
}

void layer_norm_forward(View y, View mean, View rstd, ConstView x, ConstView weight, ConstView bias,
                        const Axes& axes, double eps, NormStats* stats) {
  NL_CHECK(stats != nullptr, "layer_norm_forward: stats is null (use the overload without it)");
  row_norm_forward(kLayerNormKind, y, mean, rstd, x, weight, bias, axes, eps, stats);
}

// dy, x any shape; dx like x; weight, dweight, dbias like the normalized axes.
void layer_norm_backward(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                         const Axes& axes, double eps, GradMode mode) {
  row_norm_backward(kLayerNormKind, dx, dweight, dbias, dy, x, weight, axes, eps, mode, nullptr);
}

void layer_norm_backward_saved(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                               const NormStats& stats, GradMode mode) {
  row_norm_backward(kLayerNormKind, dx, dweight, dbias, dy, x, weight,
                    Axes(stats.axes.begin(), stats.axes.end()), stats.eps, mode, &stats);
}

}  // namespace normlab
