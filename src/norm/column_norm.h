// The column path of LayerNorm and RMSNorm (internal): normalized axes whose elements are strided while
// the innermost kept axis is contiguous, e.g. [B,F,T] over F with T contiguous. The reduction runs down
// the rows of a tile of neighbouring groups, vectorized along the contiguous axis: no transpose, no
// gather, and the row path's bits for y, mean, rstd and dx (docs/numerics.md). row_norm_forward/backward
// call it after their checks (see row_norm.cpp).
#pragma once

#include <initializer_list>

#include "norm/norm_plan.h"
#include "norm/row_norm.h"

namespace normlab::column {

// Whether the column path handles this split: the normalized elements are not contiguous, and the
// innermost kept axis has at least 8 elements and stride 1 in every given full operand.
bool applies(const plan::AxisSplit& s, std::initializer_list<const plan::FullOperand*> ops);

// The forward of row_norm_forward on the column path; w, b are the normalized-shaped parameters
// gathered row-major (or null). smean, srstd (may be null): the double statistics of every group, in
// group order (NormStats).
void forward(const RowNormKind& kind, const plan::AxisSplit& s, const plan::FullOperand& y,
             const plan::FullOperand& x, const float* w, const float* b, const plan::PartOperand& mean,
             const plan::PartOperand& rstd, double eps, double* smean, double* srstd);

// The backward of row_norm_backward on the column path (writes dx, dweight, dbias per mode); with
// srstd (and smean for LayerNorm), the saved statistics of every group instead of recomputing them.
void backward(const RowNormKind& kind, const plan::AxisSplit& s, const plan::FullOperand& dx,
              const plan::PartOperand& dweight, const plan::PartOperand& dbias, const plan::FullOperand& dy,
              const plan::FullOperand& x, const float* w, double eps, GradMode mode, const double* smean,
              const double* srstd);

}  // namespace normlab::column
