// Scalar float64 references for the normalization kernels. Deliberately simple: one group at a time,
// textbook two-pass moments, no vectorization, no threading.
#include <normlab/reference.h>

#include <cmath>
#include <vector>

#include "norm/norm_plan.h"

namespace normlab::ref {

namespace {

// Element offsets of every element of every group: offsets[g][e] for x's strides.
struct GroupIndex {
  plan::AxisSplit s;
  std::vector<Index> k_off;  // per group, for a contiguous tensor of x's shape
  std::vector<Index> n_off;  // per element within a group
};

GroupIndex index_for(const Dims& shape, const Dims& strides, const Axes& axes, const char* op) {
  GroupIndex gi;
  gi.s = plan::split_axes(shape, axes, op);
  Dims ks, ns;
  for (int d : gi.s.k_axes) ks.push_back(strides[d]);
  for (int d : gi.s.n_axes) ns.push_back(strides[d]);
  for_each_offset(gi.s.k_shape, ks, [&](Index o) { gi.k_off.push_back(o); });
  for_each_offset(gi.s.n_shape, ns, [&](Index o) { gi.n_off.push_back(o); });
  return gi;
}

const double* optional_part(DView v, const Dims& expect, const char* name, const char* op, DTensor& storage) {
  if (!v.defined()) return nullptr;
  NL_CHECK(v.shape() == expect, "{}: {} has shape {} but {} is expected", op, name, v.shape().str(), expect.str());
  storage = DTensor::copy_of(v);
  return storage.data();
}

}  // namespace

DTensor to_double(ConstView v) {
  if (!v.defined()) return DTensor();
  return DTensor::copy_of(v);
}

namespace {

LayerNormOut row_forward(bool center, DView x, DView weight, DView bias, const Axes& axes, double eps) {
  const char* op = center ? "ref::layer_norm_forward" : "ref::rms_norm_forward";
  NL_CHECK(eps >= 0, "{}: eps must be ≥ 0, got {}", op, eps);
  const GroupIndex gi = index_for(x.shape(), x.strides(), axes, op);
  DTensor ws, bs;
  const double* w = optional_part(weight, gi.s.n_shape, "weight", op, ws);
  const double* b = optional_part(bias, gi.s.n_shape, "bias", op, bs);
  const GroupIndex yi = index_for(x.shape(), contiguous_strides(x.shape()), axes, op);
  LayerNormOut out{DTensor(x.shape()), DTensor(gi.s.k_shape), DTensor(gi.s.k_shape)};
  const double n = static_cast<double>(gi.s.n);
  for (std::size_t g = 0; g < gi.k_off.size(); ++g) {
    const double* xg = x.data() + gi.k_off[g];
    double sum = 0;
    for (Index o : gi.n_off) sum += xg[o];
    const double mean = center ? sum / n : 0.0;
    double ss = 0;
    for (Index o : gi.n_off) ss += (xg[o] - mean) * (xg[o] - mean);
    const double rstd = 1.0 / std::sqrt(ss / n + eps);
    for (std::size_t e = 0; e < gi.n_off.size(); ++e) {
      double v = (xg[gi.n_off[e]] - mean) * rstd;
      if (w) v *= w[e];
      if (b) v += b[e];
      out.y[yi.k_off[g] + yi.n_off[e]] = v;
    }
    out.mean[static_cast<Index>(g)] = mean;
    out.rstd[static_cast<Index>(g)] = rstd;
  }
  return out;
}

LayerNormGrads row_backward(bool center, DView dy, DView x, DView weight, const Axes& axes, double eps) {
  const char* op = center ? "ref::layer_norm_backward" : "ref::rms_norm_backward";
  NL_CHECK(dy.shape() == x.shape(), "{}: dy has shape {} but x has shape {}", op, dy.shape().str(), x.shape().str());
  const GroupIndex gi = index_for(x.shape(), x.strides(), axes, op);
  const GroupIndex di = index_for(dy.shape(), dy.strides(), axes, op);
  const GroupIndex oi = index_for(x.shape(), contiguous_strides(x.shape()), axes, op);
  DTensor ws;
  const double* w = optional_part(weight, gi.s.n_shape, "weight", op, ws);
  LayerNormGrads out{DTensor(x.shape()), DTensor(gi.s.n_shape), DTensor(gi.s.n_shape)};
  const double n = static_cast<double>(gi.s.n);
  std::vector<double> xh(gi.n_off.size()), g(gi.n_off.size());
  for (std::size_t k = 0; k < gi.k_off.size(); ++k) {
    const double* xg = x.data() + gi.k_off[k];
    const double* dyg = dy.data() + di.k_off[k];
    double sum = 0;
    for (Index o : gi.n_off) sum += xg[o];
    const double mean = center ? sum / n : 0.0;
    double ss = 0;
    for (Index o : gi.n_off) ss += (xg[o] - mean) * (xg[o] - mean);
    const double rstd = 1.0 / std::sqrt(ss / n + eps);
    double mg = 0, mgx = 0;
    for (std::size_t e = 0; e < gi.n_off.size(); ++e) {
      xh[e] = (xg[gi.n_off[e]] - mean) * rstd;
      const double d = dyg[di.n_off[e]];
      g[e] = w ? d * w[e] : d;
      mg += g[e];
      mgx += g[e] * xh[e];
      out.dweight[static_cast<Index>(e)] += d * xh[e];
      out.dbias[static_cast<Index>(e)] += d;
    }
    mg = center ? mg / n : 0.0;
    mgx /= n;
    for (std::size_t e = 0; e < gi.n_off.size(); ++e)
      out.dx[oi.k_off[k] + oi.n_off[e]] = rstd * (g[e] - mg - xh[e] * mgx);
  }
  return out;
}

}  // namespace

LayerNormOut layer_norm_forward(DView x, DView weight, DView bias, const Axes& axes, double eps) {
  return row_forward(true, x, weight, bias, axes, eps);
}
LayerNormGrads layer_norm_backward(DView dy, DView x, DView weight, const Axes& axes, double eps) {
  return row_backward(true, dy, x, weight, axes, eps);
}
LayerNormOut rms_norm_forward(DView x, DView weight, const Axes& axes, double eps) {
  return row_forward(false, x, weight, DView{}, axes, eps);
}
LayerNormGrads rms_norm_backward(DView dy, DView x, DView weight, const Axes& axes, double eps) {
  return row_backward(false, dy, x, weight, axes, eps);
}

LayerNormOut layer_norm_forward(ConstView x, ConstView weight, ConstView bias, const Axes& axes, double eps) {
  const DTensor xd = to_double(x), wd = to_double(weight), bd = to_double(bias);
  return layer_norm_forward(xd.view(), weight.defined() ? wd.view() : DView{}, bias.defined() ? bd.view() : DView{},
                            axes, eps);
}

LayerNormGrads layer_norm_backward(ConstView dy, ConstView x, ConstView weight, const Axes& axes, double eps) {
  const DTensor dyd = to_double(dy), xd = to_double(x), wd = to_double(weight);
  return layer_norm_backward(dyd.view(), xd.view(), weight.defined() ? wd.view() : DView{}, axes, eps);
}

LayerNormOut rms_norm_forward(ConstView x, ConstView weight, const Axes& axes, double eps) {
  const DTensor xd = to_double(x), wd = to_double(weight);
  return rms_norm_forward(xd.view(), weight.defined() ? wd.view() : DView{}, axes, eps);
}

LayerNormGrads rms_norm_backward(ConstView dy, ConstView x, ConstView weight, const Axes& axes, double eps) {
  const DTensor dyd = to_double(dy), xd = to_double(x), wd = to_double(weight);
  return rms_norm_backward(dyd.view(), xd.view(), weight.defined() ? wd.view() : DView{}, axes, eps);
}

}  // namespace normlab::ref
