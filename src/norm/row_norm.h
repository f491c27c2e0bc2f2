// The row-group engine shared by LayerNorm and RMSNorm (internal). See row_norm.cpp.
#pragma once

#include <normlab/norm.h>

#include "norm/norm_plan.h"

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
// stats (may be null): filled by the forward (NormStats in norm.h); taken by the backward, which then
// checks it against x, axes, eps and kind.
void row_norm_forward(const RowNormKind& kind, View y, View mean, View rstd, ConstView x, ConstView weight,
                      ConstView bias, const Axes& axes, double eps, NormStats* stats);
void row_norm_backward(const RowNormKind& kind, View dx, View dweight, View dbias, ConstView dy, ConstView x,
                       ConstView weight, const Axes& axes, double eps, GradMode mode, const NormStats* stats);

// NormStats plumbing shared by row_norm.cpp and the 16-bit storage engine (storage_norm.h).
// The forward's: fills the fields of `stats` (not null) for x of shape x_shape split as s, and returns
// where the kernels write the per-group double mean (null for RMSNorm) and rstd.
struct StatsOut {
  double* mean = nullptr;
  double* rstd = nullptr;
};
StatsOut prepare_stats(NormStats* stats, bool center, const Dims& x_shape, const plan::AxisSplit& s,
                       double eps);
// The backward's, in two steps: before the axes (which come from the stats) are split, the norm kind and
// x's shape; after, one value per group. Returns the per-group arrays.
struct StatsIn {
  const double* mean = nullptr;
  const double* rstd = nullptr;
};
void check_stats_source(const NormStats& stats, bool center, const Dims& x_shape, const char* op);
StatsIn saved_stats(const NormStats& stats, bool center, const plan::AxisSplit& s, const char* op);

// The chunks of groups (each with its own dγ/dβ partial rows, summed in chunk order) of
// row_norm_backward's contiguous-rows path: a function of the shape only. The bf16/fp16 backward
// (storage_norm.h) uses the same chunks, so its dγ/dβ are bitwise the fp32 function's.
plan::Chunks fused_row_chunks(Index groups, Index n);

// True when group g of an operand with kept axes k_shape / k_strides starts at g·ld for every g (the
// kept axes collapse to one stride; size-1 axes ignored; one group gives ld = 0).
bool groups_at_fixed_stride(const Dims& k_shape, const Dims& k_strides, Index* ld);

}  // namespace normlab
