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

// ---- BatchNorm, InstanceNorm, GroupNorm (norm.h's channel-norm family), masked or not ----------------
// Every element of x is assigned its channel and group and whether it is a real frame; then each group
// is normalized on its own from the list of its real elements. Padded elements give y = 0, dx = 0.
struct ChannelNormOut {
  DTensor y, mean, rstd;  // mean, rstd: [C] (BatchNorm), [axes before C..., C] (Instance), [..., G] (Group)
};
struct BatchNormOut {
  DTensor y, mean, rstd;              // in eval: the running mean and 1/sqrt(running_var + eps)
  DTensor running_mean, running_var;  // updated (training with running stats), else copies/empty
  Index num_batches_tracked = 0;      // after this step
};
// running_mean/running_var optional (both or neither); num_batches_tracked is the count BEFORE the step.
BatchNormOut batch_norm_forward(DView x, DView weight, DView bias, DView running_mean, DView running_var,
                                Index num_batches_tracked, std::span<const Index> lengths,
                                const BatchNormOptions& opt);
// Training: batch statistics from x; eval: the running statistics (then required).
LayerNormGrads batch_norm_backward(DView dy, DView x, DView weight, DView running_mean, DView running_var,
                                   std::span<const Index> lengths, const BatchNormOptions& opt);
ChannelNormOut instance_norm_forward(DView x, DView weight, DView bias, std::span<const Index> lengths,
                                     const InstanceNormOptions& opt);
LayerNormGrads instance_norm_backward(DView dy, DView x, DView weight, std::span<const Index> lengths,
                                      const InstanceNormOptions& opt);
ChannelNormOut group_norm_forward(DView x, DView weight, DView bias, int groups, const GroupNormOptions& opt);
LayerNormGrads group_norm_backward(DView dy, DView x, DView weight, int groups, const GroupNormOptions& opt);

// The same for float inputs (converted exactly to double).
BatchNormOut batch_norm_forward(ConstView x, ConstView weight, ConstView bias, ConstView running_mean,
                                ConstView running_var, Index num_batches_tracked,
                                std::span<const Index> lengths, const BatchNormOptions& opt);
LayerNormGrads batch_norm_backward(ConstView dy, ConstView x, ConstView weight, ConstView running_mean,
                                   ConstView running_var, std::span<const Index> lengths,
                                   const BatchNormOptions& opt);
ChannelNormOut instance_norm_forward(ConstView x, ConstView weight, ConstView bias,
                                     std::span<const Index> lengths, const InstanceNormOptions& opt);
LayerNormGrads instance_norm_backward(ConstView dy, ConstView x, ConstView weight,
                                      std::span<const Index> lengths, const InstanceNormOptions& opt);
ChannelNormOut group_norm_forward(ConstView x, ConstView weight, ConstView bias, int groups,
                                  const GroupNormOptions& opt);
LayerNormGrads group_norm_backward(ConstView dy, ConstView x, ConstView weight, int groups,
                                   const GroupNormOptions& opt);

}  // namespace normlab::ref
