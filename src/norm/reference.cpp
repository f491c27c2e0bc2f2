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

// ---- BatchNorm, InstanceNorm, GroupNorm ----------------------------------------------------------

namespace {

enum class ChanMode { kBatch, kInstance, kGroup };

// Every element of x in row-major order: its offset in x, channel, group, and whether it is real.
struct ChannelIndex {
  std::vector<Index> x_off, chan, group;
  std::vector<char> real;
  std::vector<std::vector<Index>> members;  // per group: flat (row-major) indices of its real elements
  Index C = 1;
  Dims stats_shape;
};

ChannelIndex channel_index(const Dims& shape, const Dims& strides, int channel_axis, ChanMode mode,
                           int groups, std::span<const Index> lengths, int time_axis, const char* op) {
  const int rank = shape.size();
  const int ca = normalize_axis(channel_axis, rank);
  NL_CHECK(shape.product() > 0, "{}: x is empty (shape {})", op, shape.str());
  ChannelIndex ci;
  ci.C = shape[ca];
  Index B = 1;
  Dims b_shape;
  for (int d = 0; d < ca; ++d) {
    B *= shape[d];
    b_shape.push_back(shape[d]);
  }
  if (mode == ChanMode::kGroup)
    NL_CHECK(groups >= 1 && ci.C % groups == 0, "{}: groups = {} does not divide C = {}", op, groups, ci.C);
  const Index G = mode == ChanMode::kGroup ? groups : 1;
  ci.stats_shape = b_shape;
  if (mode == ChanMode::kBatch)
    ci.stats_shape = Dims{ci.C};
  else
    ci.stats_shape.push_back(mode == ChanMode::kInstance ? ci.C : G);
  const Index n_groups = ci.stats_shape.product();
  const int ta = lengths.empty() ? -1 : normalize_axis(time_axis, rank);
  if (!lengths.empty()) {
    NL_CHECK(ta > ca, "{}: time_axis must come after the channel axis", op);
    NL_CHECK(static_cast<Index>(lengths.size()) == B, "{}: {} lengths for {} batch items", op, lengths.size(),
             B);
    for (Index l : lengths) NL_CHECK(l >= 0 && l <= shape[ta], "{}: length {} out of range", op, l);
  }
  ci.members.resize(static_cast<std::size_t>(n_groups));
  std::vector<Index> idx(static_cast<std::size_t>(rank), 0);
  for (Index i = 0; i < shape.product(); ++i) {
    Index rest = i, off = 0, b = 0;
    for (int d = rank - 1; d >= 0; --d) {
      idx[static_cast<std::size_t>(d)] = rest % shape[d];
      rest /= shape[d];
      off += idx[static_cast<std::size_t>(d)] * strides[d];
    }
    for (int d = 0; d < ca; ++d) b = b * shape[d] + idx[static_cast<std::size_t>(d)];
    const Index c = idx[static_cast<std::size_t>(ca)];
    const Index g = mode == ChanMode::kBatch      ? c
                    : mode == ChanMode::kInstance ? b * ci.C + c
                                                  : b * G + c / (ci.C / G);
    const bool real = ta < 0 || idx[static_cast<std::size_t>(ta)] < lengths[static_cast<std::size_t>(b)];
    ci.x_off.push_back(off);
    ci.chan.push_back(c);
    ci.group.push_back(g);
    ci.real.push_back(real);
    if (real) ci.members[static_cast<std::size_t>(g)].push_back(i);
  }
  return ci;
}

std::vector<double> channel_values(DView v, Index C, const char* name, const char* op) {
  if (!v.defined()) return {};
  NL_CHECK(v.shape() == Dims{C}, "{}: {} has shape {} but [{}] is expected", op, name, v.shape().str(), C);
  std::vector<double> out;
  for (Index c = 0; c < C; ++c) out.push_back(v.data()[c * v.stride(0)]);
  return out;
}

// Moments of every group from its real elements: mean = Σx/n, var = Σ(x−mean)²/n. Empty groups: 0, 0.
struct GroupMoments {
  std::vector<double> mean, var, n;
};
GroupMoments group_moments(const ChannelIndex& ci, const double* x) {
  GroupMoments m;
  for (const std::vector<Index>& mem : ci.members) {
    double sum = 0, ss = 0;
    for (Index i : mem) sum += x[ci.x_off[static_cast<std::size_t>(i)]];
    const double n = static_cast<double>(mem.size());
    const double mean = mem.empty() ? 0.0 : sum / n;
    for (Index i : mem) {
      const double d = x[ci.x_off[static_cast<std::size_t>(i)]] - mean;
      ss += d * d;
    }
    m.mean.push_back(mean);
    m.var.push_back(mem.empty() ? 0.0 : ss / n);
    m.n.push_back(n);
  }
  return m;
}

// y = (x − mean_g)·rstd_g·γ_c + β_c at real elements (y = 0 elsewhere, already zero-initialized).
DTensor channel_apply(const ChannelIndex& ci, const Dims& shape, const double* x,
                      const std::vector<double>& mean, const std::vector<double>& rstd,
                      const std::vector<double>& w, const std::vector<double>& b) {
  DTensor y(shape);
  for (std::size_t g = 0; g < ci.members.size(); ++g)
    for (Index i : ci.members[g]) {
      const std::size_t e = static_cast<std::size_t>(i);
      const std::size_t c = static_cast<std::size_t>(ci.chan[e]);
      double v = (x[ci.x_off[e]] - mean[g]) * rstd[g];
      if (!w.empty()) v *= w[c];
      if (!b.empty()) v += b[c];
      y[i] = v;
    }
  return y;
}

// Backward per group; with `constant_stats` the statistics are constants (BatchNorm eval): dx = g·rstd.
LayerNormGrads channel_grads(const ChannelIndex& ci, const Dims& shape, DView dy, const double* x,
                             const std::vector<double>& mean, const std::vector<double>& rstd,
                             const std::vector<double>& w, bool constant_stats) {
  NL_CHECK(dy.shape() == shape, "ref: dy has shape {} but x has shape {}", dy.shape().str(), shape.str());
  ChannelIndex di = ci;  // dy's offsets
  for (Index i = 0; i < shape.product(); ++i) {
    Index rest = i, off = 0;
    for (int d = shape.size() - 1; d >= 0; --d) {
      off += (rest % shape[d]) * dy.strides()[d];
      rest /= shape[d];
    }
    di.x_off[static_cast<std::size_t>(i)] = off;
  }
  LayerNormGrads out{DTensor(shape), DTensor(Dims{ci.C}), DTensor(Dims{ci.C})};
  for (std::size_t g = 0; g < ci.members.size(); ++g) {
    const std::vector<Index>& mem = ci.members[g];
    double mg = 0, mgx = 0;
    for (Index i : mem) {
      const std::size_t e = static_cast<std::size_t>(i);
      const Index c = ci.chan[e];
      const double d = dy.data()[di.x_off[e]], xh = (x[ci.x_off[e]] - mean[g]) * rstd[g];
      const double gg = w.empty() ? d : d * w[static_cast<std::size_t>(c)];
      mg += gg;
      mgx += gg * xh;
      out.dweight[c] += d * xh;
      out.dbias[c] += d;
    }
    if (!mem.empty()) {
      mg /= static_cast<double>(mem.size());
      mgx /= static_cast<double>(mem.size());
    }
    for (Index i : mem) {
      const std::size_t e = static_cast<std::size_t>(i);
      const double d = dy.data()[di.x_off[e]], xh = (x[ci.x_off[e]] - mean[g]) * rstd[g];
      const double gg = w.empty() ? d : d * w[static_cast<std::size_t>(ci.chan[e])];
      out.dx[i] = constant_stats ? gg * rstd[g] : rstd[g] * (gg - mg - xh * mgx);
    }
  }
  return out;
}

std::vector<double> rstd_from(const GroupMoments& m, double eps) {
  std::vector<double> r;
  for (std::size_t g = 0; g < m.var.size(); ++g)
    r.push_back(m.n[g] > 0 ? 1.0 / std::sqrt(m.var[g] + eps) : 0.0);
  return r;
}

DTensor stats_tensor(const Dims& shape, const std::vector<double>& v) {
  DTensor t(shape);
  for (std::size_t i = 0; i < v.size(); ++i) t[static_cast<Index>(i)] = v[i];
  return t;
}

ChannelNormOut grouped_forward(DView x, DView weight, DView bias, ChanMode mode, int groups,
                               std::span<const Index> lengths, int channel_axis, int time_axis, double eps,
                               const char* op) {
  const ChannelIndex ci =
      channel_index(x.shape(), x.strides(), channel_axis, mode, groups, lengths, time_axis, op);
  const GroupMoments m = group_moments(ci, x.data());
  const std::vector<double> rstd = rstd_from(m, eps);
  return {channel_apply(ci, x.shape(), x.data(), m.mean, rstd, channel_values(weight, ci.C, "weight", op),
                        channel_values(bias, ci.C, "bias", op)),
          stats_tensor(ci.stats_shape, m.mean), stats_tensor(ci.stats_shape, rstd)};
}

LayerNormGrads grouped_backward(DView dy, DView x, DView weight, ChanMode mode, int groups,
                                std::span<const Index> lengths, int channel_axis, int time_axis, double eps,
                                const char* op) {
  const ChannelIndex ci =
      channel_index(x.shape(), x.strides(), channel_axis, mode, groups, lengths, time_axis, op);
  const GroupMoments m = group_moments(ci, x.data());
  return channel_grads(ci, x.shape(), dy, x.data(), m.mean, rstd_from(m, eps),
                       channel_values(weight, ci.C, "weight", op), false);
}

DView dview_or_none(const DTensor& t, ConstView v) {
  return v.defined() ? t.view() : DView{};
}

}  // namespace

BatchNormOut batch_norm_forward(DView x, DView weight, DView bias, DView running_mean, DView running_var,
                                Index num_batches_tracked, std::span<const Index> lengths,
                                const BatchNormOptions& opt) {
  const char* op = "ref::batch_norm_forward";
  const ChannelIndex ci = channel_index(x.shape(), x.strides(), opt.channel_axis, ChanMode::kBatch, 1,
                                        lengths, opt.time_axis, op);
  const std::vector<double> w = channel_values(weight, ci.C, "weight", op),
                            b = channel_values(bias, ci.C, "bias", op);
  std::vector<double> rm = channel_values(running_mean, ci.C, "running_mean", op);
  std::vector<double> rv = channel_values(running_var, ci.C, "running_var", op);
  BatchNormOut out;
  out.num_batches_tracked = num_batches_tracked;
  if (!opt.training) {
    NL_CHECK(!rm.empty() && !rv.empty(), "{}: eval mode needs running_mean and running_var", op);
    std::vector<double> rstd;
    for (double v : rv) rstd.push_back(1.0 / std::sqrt(v + opt.eps));
    out.y = channel_apply(ci, x.shape(), x.data(), rm, rstd, w, b);
    out.mean = stats_tensor({ci.C}, rm);
    out.rstd = stats_tensor({ci.C}, rstd);
    out.running_mean = stats_tensor({ci.C}, rm);
    out.running_var = stats_tensor({ci.C}, rv);
    return out;
  }
  const GroupMoments m = group_moments(ci, x.data());
  for (double n : m.n) NL_CHECK(n > 1, "{}: Expected more than 1 value per channel when training", op);
  const std::vector<double> rstd = rstd_from(m, opt.eps);
  out.y = channel_apply(ci, x.shape(), x.data(), m.mean, rstd, w, b);
  out.mean = stats_tensor({ci.C}, m.mean);
  out.rstd = stats_tensor({ci.C}, rstd);
  if (rm.empty()) return out;
  out.num_batches_tracked = num_batches_tracked + 1;
  const bool onnx = opt.convention == BatchNormOptions::RunningStatsConvention::kOnnx;
  // Weight of the batch statistic: momentum (PyTorch), 1 − momentum (ONNX), 1/k (cumulative).
  const double f = !opt.momentum ? 1.0 / static_cast<double>(out.num_batches_tracked)
                   : onnx        ? 1.0 - *opt.momentum
                                 : *opt.momentum;
  for (std::size_t c = 0; c < rm.size(); ++c) {
    const double var = onnx ? m.var[c] : m.var[c] * m.n[c] / (m.n[c] - 1);
    rm[c] = (1 - f) * rm[c] + f * m.mean[c];
    rv[c] = (1 - f) * rv[c] + f * var;
  }
  out.running_mean = stats_tensor({ci.C}, rm);
  out.running_var = stats_tensor({ci.C}, rv);
  return out;
}

LayerNormGrads batch_norm_backward(DView dy, DView x, DView weight, DView running_mean, DView running_var,
                                   std::span<const Index> lengths, const BatchNormOptions& opt) {
  const char* op = "ref::batch_norm_backward";
  if (opt.training)
    return grouped_backward(dy, x, weight, ChanMode::kBatch, 1, lengths, opt.channel_axis, opt.time_axis,
                            opt.eps, op);
  const ChannelIndex ci = channel_index(x.shape(), x.strides(), opt.channel_axis, ChanMode::kBatch, 1,
                                        lengths, opt.time_axis, op);
  const std::vector<double> rm = channel_values(running_mean, ci.C, "running_mean", op);
  const std::vector<double> rv = channel_values(running_var, ci.C, "running_var", op);
  NL_CHECK(!rm.empty() && !rv.empty(), "{}: eval mode needs running_mean and running_var", op);
  std::vector<double> rstd;
  for (double v : rv) rstd.push_back(1.0 / std::sqrt(v + opt.eps));
  return channel_grads(ci, x.shape(), dy, x.data(), rm, rstd, channel_values(weight, ci.C, "weight", op),
                       true);
}

ChannelNormOut instance_norm_forward(DView x, DView weight, DView bias, std::span<const Index> lengths,
                                     const InstanceNormOptions& opt) {
  return grouped_forward(x, weight, bias, ChanMode::kInstance, 1, lengths, opt.channel_axis, opt.time_axis,
                         opt.eps, "ref::instance_norm_forward");
}
LayerNormGrads instance_norm_backward(DView dy, DView x, DView weight, std::span<const Index> lengths,
                                      const InstanceNormOptions& opt) {
  return grouped_backward(dy, x, weight, ChanMode::kInstance, 1, lengths, opt.channel_axis, opt.time_axis,
                          opt.eps, "ref::instance_norm_backward");
}
ChannelNormOut group_norm_forward(DView x, DView weight, DView bias, int groups,
                                  const GroupNormOptions& opt) {
  return grouped_forward(x, weight, bias, ChanMode::kGroup, groups, {}, opt.channel_axis, -1, opt.eps,
                         "ref::group_norm_forward");
}
LayerNormGrads group_norm_backward(DView dy, DView x, DView weight, int groups, const GroupNormOptions& opt) {
  return grouped_backward(dy, x, weight, ChanMode::kGroup, groups, {}, opt.channel_axis, -1, opt.eps,
                          "ref::group_norm_backward");
}

BatchNormOut batch_norm_forward(ConstView x, ConstView weight, ConstView bias, ConstView running_mean,
                                ConstView running_var, Index num_batches_tracked,
                                std::span<const Index> lengths, const BatchNormOptions& opt) {
  const DTensor xd = to_double(x), wd = to_double(weight), bd = to_double(bias),
                rmd = to_double(running_mean), rvd = to_double(running_var);
  return batch_norm_forward(xd.view(), dview_or_none(wd, weight), dview_or_none(bd, bias),
                            dview_or_none(rmd, running_mean), dview_or_none(rvd, running_var),
                            num_batches_tracked, lengths, opt);
}
LayerNormGrads batch_norm_backward(ConstView dy, ConstView x, ConstView weight, ConstView running_mean,
                                   ConstView running_var, std::span<const Index> lengths,
                                   const BatchNormOptions& opt) {
  const DTensor dyd = to_double(dy), xd = to_double(x), wd = to_double(weight), rmd = to_double(running_mean),
                rvd = to_double(running_var);
  return batch_norm_backward(dyd.view(), xd.view(), dview_or_none(wd, weight),
                             dview_or_none(rmd, running_mean), dview_or_none(rvd, running_var), lengths, opt);
}
ChannelNormOut instance_norm_forward(ConstView x, ConstView weight, ConstView bias,
                                     std::span<const Index> lengths, const InstanceNormOptions& opt) {
  const DTensor xd = to_double(x), wd = to_double(weight), bd = to_double(bias);
  return instance_norm_forward(xd.view(), dview_or_none(wd, weight), dview_or_none(bd, bias), lengths, opt);
}
LayerNormGrads instance_norm_backward(ConstView dy, ConstView x, ConstView weight,
                                      std::span<const Index> lengths, const InstanceNormOptions& opt) {
  const DTensor dyd = to_double(dy), xd = to_double(x), wd = to_double(weight);
  return instance_norm_backward(dyd.view(), xd.view(), dview_or_none(wd, weight), lengths, opt);
}
ChannelNormOut group_norm_forward(ConstView x, ConstView weight, ConstView bias, int groups,
                                  const GroupNormOptions& opt) {
  const DTensor xd = to_double(x), wd = to_double(weight), bd = to_double(bias);
  return group_norm_forward(xd.view(), dview_or_none(wd, weight), dview_or_none(bd, bias), groups, opt);
}
LayerNormGrads group_norm_backward(ConstView dy, ConstView x, ConstView weight, int groups,
                                   const GroupNormOptions& opt) {
  const DTensor dyd = to_double(dy), xd = to_double(x), wd = to_double(weight);
  return group_norm_backward(dyd.view(), xd.view(), dview_or_none(wd, weight), groups, opt);
}

}  // namespace normlab::ref
