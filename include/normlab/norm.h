// normlab/norm.h — normalization kernels over any set of axes of a strided tensor.
//
// Vocabulary: x has rank r ≤ 8. The NORMALIZED axes N (given in `axes`, negative counts from the end,
// any order, no duplicates) form one group per combination of the KEPT axes K (all other axes).
// Every group is normalized on its own:
//     mean = Σx/n,  var = Σ(x−mean)²/n (biased),  rstd = 1/sqrt(var+eps),
//     y = γ⊙(x−mean)·rstd + β,                 n = number of elements in a group.
// Shapes:
//     y, dy, dx          like x
//     mean, rstd         x's shape with the normalized axes removed (kept axes in x's order); rank 0
//                        when every axis is normalized
//     weight γ, bias β   x's sizes at the normalized axes, in increasing axis order
//     dweight, dbias     like weight and bias
// Any argument marked "optional" may be an undefined view (View{}), meaning "not given / not wanted".
// Views may have arbitrary strides (non-contiguous, sliced, negative). Outputs may alias inputs
// exactly (same data pointer and strides) but must not partially overlap them.
//
// Numerics: inputs and outputs are fp32; moments and every intermediate are computed in double
// (see docs/numerics.md), so rows at a large common offset (x = 1e4 + N(0,1)) normalize to within
// fp32 output rounding. The reduction order is fixed by the data layout alone: results are bitwise
// identical for any thread count and any SIMD target.
//
// NaN policy: no value checks are made on the data. A NaN or Inf in a group makes that group's mean,
// rstd and outputs NaN; other groups are unaffected. With eps = 0 a constant group has var = 0 and
// rstd = +Inf, and its outputs are NaN (as in PyTorch).
#pragma once

#include <normlab/tensor.h>

#include <vector>

namespace normlab {

// A list of axes; negative values count from the end.
using Axes = std::vector<int>;

// LayerNorm forward over `axes`.
//   y:          output, shape of x (written =)
//   mean, rstd: optional outputs, shape of the kept axes (written =)
//   x:          input
//   weight γ, bias β: optional inputs, shape of the normalized axes
//   eps:        ≥ 0, added to the variance inside the square root
void layer_norm_forward(View y, View mean, View rstd, ConstView x, ConstView weight, ConstView bias,
                        const Axes& axes, double eps = 1e-5);

// Gradient accumulation rule for parameter gradients.
enum class GradMode {
  kOverwrite,   // dweight = ..., dbias = ...   (default)
  kAccumulate,  // dweight += ..., dbias += ... (for training loops that sum several contributions)
};

// LayerNorm backward over `axes`.
//   dx:               output, shape of x, always written = (never accumulated)
//   dweight, dbias:   optional outputs, shape of the normalized axes, written per `mode`
//   dy, x:            inputs, shape of x
//   weight γ:         optional; without it γ = 1
//   eps:              the forward pass's eps
// The statistics are recomputed from x in double rather than taken from the forward pass: the fp32
// mean is ≈1e-3 off at an offset of 1e4, and an fp32 rstd would limit dx to ≈1e-7 relative to the
// terms that cancel in it. The two extra passes read a group that is already in cache.
void layer_norm_backward(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                         const Axes& axes, double eps = 1e-5, GradMode mode = GradMode::kOverwrite);

// RMSNorm over `axes` (Zhang & Sennrich 2019; PyTorch nn.RMSNorm):
//     rstd = 1/sqrt(Σx²/n + eps),  y = x·rstd·γ
// No centring and no bias. normlab's default eps is 1e-6; PyTorch's default (eps=None) is the
// dtype's machine epsilon: pass kTorchRmsNormEps for it.
inline constexpr double kRmsNormEps = 1e-6;
inline constexpr double kTorchRmsNormEps = 1.1920928955078125e-07;  // FLT_EPSILON

//   y:        output, shape of x (written =)
//   rstd:     optional output, shape of the kept axes
//   weight γ: optional, shape of the normalized axes
void rms_norm_forward(View y, View rstd, ConstView x, ConstView weight, const Axes& axes,
                      double eps = kRmsNormEps);
// dx = rstd·(g − x̂·mean(g·x̂)) with g = dy·γ, x̂ = x·rstd (written =); dweight = Σ dy·x̂ (per mode).
// rstd is recomputed from x in double, as for LayerNorm.
void rms_norm_backward(View dx, View dweight, ConstView dy, ConstView x, ConstView weight, const Axes& axes,
                       double eps = kRmsNormEps, GradMode mode = GradMode::kOverwrite);

// Shapes the functions above expect, for callers that allocate outputs.
Dims kept_shape(const Dims& x_shape, const Axes& axes);        // shape of mean / rstd
Dims normalized_shape(const Dims& x_shape, const Axes& axes);  // shape of weight / bias

}  // namespace normlab
