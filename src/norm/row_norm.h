// The row-group engine shared by LayerNorm and RMSNorm (internal). See row_norm.cpp.
#pragma once

#include <normlab/norm.h>

namespace normlab {

struct RowNormKind {
  bool center;  // LayerNorm: subtract the mean; RMSNorm: mean ≡ 0 and no bias
  const char* forward_name;
  const char* backward_name;
};
inline constexpr RowNormKind kLayerNormKind{true, "layer_norm_forward", "layer_norm_backward"};
inline constexpr RowNormKind kRmsNormKind{false, "rms_norm_forward", "rms_norm_backward"};

// Same arguments as layer_norm_forward / layer_norm_backward (norm.h). For RMSNorm, mean and bias
// must be undefined; "var" is the mean square.
void row_norm_forward(const RowNormKind& kind, View y, View mean, View rstd, ConstView x, ConstView weight,
                      ConstView bias, const Axes& axes, double eps);
void row_norm_backward(const RowNormKind& kind, View dx, View dweight, View dbias, ConstView dy, ConstView x,
                       ConstView weight, const Axes& axes, double eps, GradMode mode);

}  // namespace normlab
