// normlab/reference.h — plain scalar references in double, beside the fast kernels.
//
// These follow the mathematical definitions in norm.h literally, one group at a time, with every
// operation in double. They are slow on purpose and serve as the oracle for the kernels' tests and for
// float64 finite-difference checks. Inputs may be float or double views; outputs are double tensors
// (contiguous). Same shapes and argument checks as the kernels.
#pragma once

#include <normlab/norm.h>
#include <normlab/tensor.h>

namespace normlab::ref {

using DTensor = BasicTensor<double>;
using DView = TensorView<const double>;

struct LayerNormOut {
  DTensor y, mean, rstd;  // y like x; mean, rstd like the kept axes
};
struct LayerNormGrads {
  DTensor dx, dweight, dbias;  // dweight, dbias like the normalized axes (γ given or not)
};

// weight and bias are optional (undefined views).
LayerNormOut layer_norm_forward(DView x, DView weight, DView bias, const Axes& axes, double eps);
LayerNormGrads layer_norm_backward(DView dy, DView x, DView weight, const Axes& axes, double eps);

// RMSNorm: the LayerNorm formulas with mean ≡ 0 and no bias (out.mean is all zeros).
LayerNormOut rms_norm_forward(DView x, DView weight, const Axes& axes, double eps);
LayerNormGrads rms_norm_backward(DView dy, DView x, DView weight, const Axes& axes, double eps);

// Conveniences for float inputs (converted exactly to double).
DTensor to_double(ConstView v);
LayerNormOut layer_norm_forward(ConstView x, ConstView weight, ConstView bias, const Axes& axes, double eps);
LayerNormGrads layer_norm_backward(ConstView dy, ConstView x, ConstView weight, const Axes& axes, double eps);
LayerNormOut rms_norm_forward(ConstView x, ConstView weight, const Axes& axes, double eps);
LayerNormGrads rms_norm_backward(ConstView dy, ConstView x, ConstView weight, const Axes& axes, double eps);

}  // namespace normlab::ref
