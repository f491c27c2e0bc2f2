// RMSNorm over any set of axes: the row-group engine (row_norm.cpp) with centring off.
#include "norm/row_norm.h"

namespace normlab {

// x is any shape; y like x; rstd like the kept axes; weight like the normalized axes.
void rms_norm_forward(View y, View rstd, ConstView x, ConstView weight, const Axes& axes, double eps) {
  row_norm_forward(kRmsNormKind, y, View{}, rstd, x, weight, ConstView{}, axes, eps, nullptr);
}

void rms_norm_forward(View y, View rstd, ConstView x, ConstView weight, const Axes& axes, double eps,
                      NormStats* stats) {
  NL_CHECK(stats != nullptr, "rms_norm_forward: stats is null (use the overload without it)");
  row_norm_forward(kRmsNormKind, y, View{}, rstd, x, weight, ConstView{}, axes, eps, stats);
}

// dy, x any shape; dx like x; weight, dweight like the normalized axes.
void rms_norm_backward(View dx, View dweight, ConstView dy, ConstView x, ConstView weight, const Axes& axes,
                       double eps, GradMode mode) {
  row_norm_backward(kRmsNormKind, dx, dweight, View{}, dy, x, weight, axes, eps, mode, nullptr);
}

void rms_norm_backward_saved(View dx, View dweight, ConstView dy, ConstView x, ConstView weight,
                             const NormStats& stats, GradMode mode) {
  row_norm_backward(kRmsNormKind, dx, dweight, View{}, dy, x, weight,
                    Axes(stats.axes.begin(), stats.axes.end()), stats.eps, mode, &stats);
}

}  // namespace normlab
