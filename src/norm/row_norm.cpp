// The row-group engine behind LayerNorm and RMSNorm over any set of axes of a strided tensor.
//
// Contract (see include/normlab/norm.h): y, dx written =; dweight, dbias written = or += (GradMode).
// Algorithm per group (docs/numerics.md); RMSNorm is the same with centring off (mean ≡ 0, no β):
//   forward:  mean = Σx/n (double), var = Σ(x−mean)²/n (double, second pass), rstd = 1/√(var+eps),
//             y = (x−mean)·rstd·γ + β in double, rounded once to float.
//   backward: mean and rstd recomputed in double; g = dy·γ, x̂ = (x−mean)·rstd;
//             dx = rstd·(g − mean(g) − x̂·mean(g·x̂)); dγ = Σ_groups dy·x̂; dβ = Σ_groups dy.
//             (RMSNorm: dx = rstd·(g − x̂·mean(g·x̂)).)
// Parallelism: groups are independent (any schedule gives the same bits). dγ/dβ are reduced per fixed
// chunk of groups (plan::param_grad_chunks, a function of the shape only) and the chunk partials are
// then summed in chunk order.
#include <cmath>
#include <vector>

#include "norm/row_norm.h"

#include "norm/column_norm.h"
#include "norm/norm_plan.h"
#include "norm/row_kernels.h"
#include "parallel/parallel.h"

namespace normlab {

namespace {

// A group's data as a contiguous pointer: the tensor itself when its layout allows, else a gather.
const float* group_input(const plan::FullOperand& op, Index koff, const plan::AxisSplit& s, float* scratch) {
  const float* p = reinterpret_cast<const float*>(op.base) + koff;
  if (op.n_contiguous) return p;
  plan::gather(scratch, p, s.n_shape, op.n_strides);
  return scratch;
}

struct GroupOutput {
  float* ptr;
  bool needs_scatter;
};
GroupOutput group_output(const plan::FullOperand& op, Index koff, float* scratch) {
  float* p = reinterpret_cast<float*>(op.base) + koff;
  return op.n_contiguous ? GroupOutput{p, false} : GroupOutput{scratch, true};
}

void check_eps(double eps, const char* op) {
  NL_CHECK(std::isfinite(eps) && eps >= 0, "{}: eps must be finite and ≥ 0, got {}", op, eps);
}

}  // namespace

// x is any shape; y like x; mean, rstd like the kept axes; weight, bias like the normalized axes.
void row_norm_forward(const RowNormKind& kind, View y, View mean, View rstd, ConstView x, ConstView weight,
                      ConstView bias, const Axes& axes, double eps) {
  const char* kFwd = kind.forward_name;
  NL_CHECK(x.defined(), "{}: x is required", kFwd);
  NL_CHECK(y.defined(), "{}: y is required", kFwd);
  const plan::AxisSplit s = plan::split_axes(x.shape(), axes, kFwd);
  check_eps(eps, kFwd);
  plan::check_same_shape(x.shape(), y.shape(), "y", kFwd);
  plan::check_writable(y.shape(), y.strides(), "y", kFwd);
  plan::check_no_partial_overlap(y, x, "y", "x", kFwd);
  const plan::PartOperand w = plan::part_operand(weight, s.n_shape, "weight", kFwd);
  const plan::PartOperand b = plan::part_operand(bias, s.n_shape, "bias", kFwd);
  const plan::PartOperand pm = plan::part_operand(mean, s.k_shape, "mean", kFwd);
  const plan::PartOperand pr = plan::part_operand(rstd, s.k_shape, "rstd", kFwd);
  NL_CHECK(kind.center || !pm.defined, "{}: there is no mean to write (the norm does not centre)", kFwd);
  NL_CHECK(kind.center || !b.defined, "{}: takes no bias", kFwd);
  if (pm.defined) {
    plan::check_writable(mean.shape(), mean.strides(), "mean", kFwd);
    plan::check_no_partial_overlap(mean, x, "mean", "x", kFwd);
  }
  if (pr.defined) {
    plan::check_writable(rstd.shape(), rstd.strides(), "rstd", kFwd);
    plan::check_no_partial_overlap(rstd, x, "rstd", "x", kFwd);
  }

  const plan::FullOperand xo = plan::full_operand(x, s, "x");
  const plan::FullOperand yo = plan::full_operand(y, s, "y");
  const std::vector<float> wv = w.defined ? plan::gather_part(w, s.n_shape) : std::vector<float>{};
  const std::vector<float> bv = b.defined ? plan::gather_part(b, s.n_shape) : std::vector<float>{};
  const float* wp = w.defined ? wv.data() : nullptr;
  const float* bp = b.defined ? bv.data() : nullptr;
  // Strided normalized axes next to a contiguous kept axis ([B,F,T] over F): the column path.
  if (column::applies(s, {&xo, &yo})) return column::forward(kind, s, yo, xo, wp, bp, pm, pr, eps);
  const kernels::RowKernels& k = kernels::row_kernels();
  const bool scratch_needed = !xo.n_contiguous || !yo.n_contiguous;
  const double n = static_cast<double>(s.n);

  // One chunk of groups per task; the chunking only affects scheduling, never results.
  const Index per_task = std::max<Index>(1, (Index{1} << 14) / s.n);
  const Index tasks = (s.groups + per_task - 1) / per_task;
  parallel::parallel_for(tasks, [&](Index t) {
    std::vector<float> xs(scratch_needed ? static_cast<std::size_t>(s.n) : 0);
    std::vector<float> ys(scratch_needed ? static_cast<std::size_t>(s.n) : 0);
    const Index g_end = std::min(s.groups, (t + 1) * per_task);
    for (Index g = t * per_task; g < g_end; ++g) {
      const float* xr = group_input(xo, plan::group_offset(g, s.k_shape, xo.k_strides), s, xs.data());
      const double mu = kind.center ? k.sum(xr, s.n) / n : 0.0;
      const double var = k.sum_sq_dev(xr, s.n, mu) / n;
      const double rs = 1.0 / std::sqrt(var + eps);
      const GroupOutput yr = group_output(yo, plan::group_offset(g, s.k_shape, yo.k_strides), ys.data());
      k.forward(yr.ptr, xr, s.n, mu, rs, wp, bp);
      if (yr.needs_scatter)
        plan::scatter(reinterpret_cast<float*>(yo.base) + plan::group_offset(g, s.k_shape, yo.k_strides), yr.ptr,
                      s.n_shape, yo.n_strides);
      if (pm.defined)
        reinterpret_cast<float*>(pm.base)[plan::group_offset(g, s.k_shape, pm.strides)] = static_cast<float>(mu);
      if (pr.defined)
        reinterpret_cast<float*>(pr.base)[plan::group_offset(g, s.k_shape, pr.strides)] = static_cast<float>(rs);
    }
  });
}

// dy, x are any shape; dx like x; weight, dweight, dbias like the normalized axes. Literal reverse of
// the forward: recompute mean, rstd and x̂, then dx, and dγ/dβ in the same pass.
void row_norm_backward(const RowNormKind& kind, View dx, View dweight, View dbias, ConstView dy, ConstView x,
                       ConstView weight, const Axes& axes, double eps, GradMode mode) {
  const char* kBwd = kind.backward_name;
  NL_CHECK(x.defined() && dy.defined(), "{}: x and dy are required", kBwd);
  NL_CHECK(dx.defined(), "{}: dx is required", kBwd);
  const plan::AxisSplit s = plan::split_axes(x.shape(), axes, kBwd);
  check_eps(eps, kBwd);
  plan::check_same_shape(x.shape(), dy.shape(), "dy", kBwd);
  plan::check_same_shape(x.shape(), dx.shape(), "dx", kBwd);
  plan::check_writable(dx.shape(), dx.strides(), "dx", kBwd);
  plan::check_no_partial_overlap(dx, x, "dx", "x", kBwd);
  plan::check_no_partial_overlap(dx, dy, "dx", "dy", kBwd);
  const plan::PartOperand w = plan::part_operand(weight, s.n_shape, "weight", kBwd);
  const plan::PartOperand dw = plan::part_operand(dweight, s.n_shape, "dweight", kBwd);
  const plan::PartOperand db = plan::part_operand(dbias, s.n_shape, "dbias", kBwd);
  NL_CHECK(kind.center || !db.defined, "{}: there is no bias gradient (the norm has no bias)", kBwd);
  if (dw.defined) {
    plan::check_writable(dweight.shape(), dweight.strides(), "dweight", kBwd);
    plan::check_no_partial_overlap(dweight, x, "dweight", "x", kBwd);
    plan::check_no_partial_overlap(dweight, dy, "dweight", "dy", kBwd);
  }
  if (db.defined) {
    plan::check_writable(dbias.shape(), dbias.strides(), "dbias", kBwd);
    plan::check_no_partial_overlap(dbias, x, "dbias", "x", kBwd);
    plan::check_no_partial_overlap(dbias, dy, "dbias", "dy", kBwd);
  }

  const plan::FullOperand xo = plan::full_operand(x, s, "x");
  const plan::FullOperand dyo = plan::full_operand(dy, s, "dy");
  const plan::FullOperand dxo = plan::full_operand(dx, s, "dx");
  const std::vector<float> wv = w.defined ? plan::gather_part(w, s.n_shape) : std::vector<float>{};
  const float* wp = w.defined ? wv.data() : nullptr;
  if (column::applies(s, {&xo, &dyo, &dxo}))  // see row_norm_forward
    return column::backward(kind, s, dxo, dw, db, dyo, xo, wp, eps, mode);
  const kernels::RowKernels& k = kernels::row_kernels();
  const bool scratch_needed = !xo.n_contiguous || !dyo.n_contiguous || !dxo.n_contiguous;
  const double n = static_cast<double>(s.n);
  const bool param_grads = dw.defined || db.defined;

  // Chunks of groups: each owns one partial row of dγ and dβ (double) when they are wanted.
  const plan::Chunks ch = plan::param_grad_chunks(s.groups, s.n);
  const std::size_t nn = static_cast<std::size_t>(s.n);
  std::vector<double> dw_part(dw.defined ? static_cast<std::size_t>(ch.count) * nn : 0);
  std::vector<double> db_part(db.defined ? static_cast<std::size_t>(ch.count) * nn : 0);
  parallel::parallel_for(ch.count, [&](Index c) {
    std::vector<float> xs(scratch_needed ? nn : 0), dys(scratch_needed ? nn : 0), dxs(scratch_needed ? nn : 0);
    double* dwc = dw.defined ? dw_part.data() + static_cast<std::size_t>(c) * nn : nullptr;
    double* dbc = db.defined ? db_part.data() + static_cast<std::size_t>(c) * nn : nullptr;
    const Index g_end = std::min(s.groups, (c + 1) * ch.size);
    for (Index g = c * ch.size; g < g_end; ++g) {
      const float* xr = group_input(xo, plan::group_offset(g, s.k_shape, xo.k_strides), s, xs.data());
      const float* dyr = group_input(dyo, plan::group_offset(g, s.k_shape, dyo.k_strides), s, dys.data());
      const double mu = kind.center ? k.sum(xr, s.n) / n : 0.0;
      const double rs = 1.0 / std::sqrt(k.sum_sq_dev(xr, s.n, mu) / n + eps);
      double sums[2];
      k.backward_sums(sums, dwc, dbc, dyr, xr, s.n, mu, rs, wp);
      const Index dxoff = plan::group_offset(g, s.k_shape, dxo.k_strides);
      const GroupOutput dxr = group_output(dxo, dxoff, dxs.data());
      k.backward_dx(dxr.ptr, dyr, xr, s.n, mu, rs, wp, kind.center ? sums[0] / n : 0.0, sums[1] / n);
      if (dxr.needs_scatter) plan::scatter(reinterpret_cast<float*>(dxo.base) + dxoff, dxr.ptr, s.n_shape, dxo.n_strides);
    }
  });
  if (!param_grads) return;

  // Sum the chunk partials in chunk order, then write (or add) once, in the weight's own layout.
  const Index cols_per_task = 4096;
  const Index col_tasks = (s.n + cols_per_task - 1) / cols_per_task;
  std::vector<float> dw_row(dw.defined ? nn : 0), db_row(db.defined ? nn : 0);
  parallel::parallel_for(col_tasks, [&](Index t) {
    const Index j_end = std::min(s.n, (t + 1) * cols_per_task);
    for (Index j = t * cols_per_task; j < j_end; ++j) {
      double sw = 0, sb = 0;
      for (Index c = 0; c < ch.count; ++c) {
        const std::size_t at = static_cast<std::size_t>(c) * nn + static_cast<std::size_t>(j);
        if (dw.defined) sw += dw_part[at];
        if (db.defined) sb += db_part[at];
      }
      if (dw.defined) dw_row[static_cast<std::size_t>(j)] = static_cast<float>(sw);
      if (db.defined) db_row[static_cast<std::size_t>(j)] = static_cast<float>(sb);
    }
  });
  const bool acc = mode == GradMode::kAccumulate;
  auto write = [&](const plan::PartOperand& p, const std::vector<float>& row) {
    float* base = reinterpret_cast<float*>(p.base);
    const float* src = row.data();
    for_each_offset(s.n_shape, p.strides, [&](Index off) {
      base[off] = acc ? base[off] + *src : *src;
      ++src;
    });
  };
  if (dw.defined) write(dw, dw_row);
  if (db.defined) write(db, db_row);
}

}  // namespace normlab
