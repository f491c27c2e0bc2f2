// BatchNorm, InstanceNorm and GroupNorm: forward and backward, on the channel-norm engine.
//
// Contract (include/normlab/norm.h): y, dx written = (0 at padded frames); save_mean/save_rstd
// written =; running_mean/running_var updated in place (BatchNorm training); dweight, dbias written = or
// += per GradMode. The three ops differ only in the grouping of (b, c) segments (channel_norm.h):
//   forward:  mean_g, var_g = moments over the group's real elements (two passes over each segment in
//             cache, segments combined exactly in double: chnorm::moments), rstd_g = 1/√(var_g+eps),
//             y = (x − mean_g)·rstd_g·γ_c + β_c (fp32 elementwise, docs/numerics.md).
//   backward: with per-segment Σdy and Σdy·x̂ (double sums, chnorm::grad_stats): mean(g)_g = Σ_seg γ_c·Σdy /
//   n_g,
//             mean(g·x̂)_g = Σ_seg γ_c·Σdy·x̂ / n_g; dx = rstd_g·(dy·γ_c − mean(g) − x̂·mean(g·x̂));
//             dγ_c = Σ_b Σdy·x̂, dβ_c = Σ_b Σdy (b order).
//   BatchNorm eval: the running statistics are constants: y as above with them, dx = dy·γ_c·rstd_c.
//   BatchNorm training on inputs larger than the cache: the same arithmetic channel block by channel block
//             where the layout allows (chnorm::batch_forward_blocked/_backward_blocked), so that each
//             block's data is read from memory once per pass pair.
//   InstanceNorm, GroupNorm: the same arithmetic group by group (chnorm::per_sample_forward/_backward),
//             so that a group's data is read from memory once per pass pair. GroupNorm of short
//             contiguous segments with four or more channels per group: each group one LayerNorm row
//             through the row kernels, with their arithmetic (chnorm::group_rows_apply; docs/numerics.md).
// Every check runs before anything is written.
#include <cmath>
#include <utility>
#include <vector>

#include "norm/channel_norm.h"

namespace normlab {

namespace {

using chnorm::Grouping;
using chnorm::Plan;

constexpr const char* kBnFwd = "batch_norm_forward";
constexpr const char* kBnBwd = "batch_norm_backward";
constexpr const char* kInFwd = "instance_norm_forward";
constexpr const char* kInBwd = "instance_norm_backward";
constexpr const char* kGnFwd = "group_norm_forward";
constexpr const char* kGnBwd = "group_norm_backward";

const float* ptr_or_null(const std::vector<float>& v) {
  return v.empty() ? nullptr : v.data();
}

// Training needs more than one real value per channel.
void check_training_counts(const Plan& p, const Dims& x_shape) {
  const std::vector<double> count = chnorm::group_counts(p);
  for (std::size_t c = 0; c < count.size(); ++c)
    NL_CHECK(count[c] > 1,
             "{}: Expected more than 1 value per channel when training, got input of shape {}{}", p.op,
             x_shape.str(),
             p.masked() ? fmt::format(" with {} real value(s) in channel {}", count[c], c) : "");
}

// Statistics of groups in training mode: forward outputs.
void train_forward(const Plan& p, View y, View save_mean, View save_rstd, ConstView x, const float* w,
                   const float* b, const chnorm::Moments& m, const std::vector<double>& rstd) {
  chnorm::normalize(p, y, x, m.mean, rstd, w, b);
  chnorm::write_stats(save_mean, m.mean);
  chnorm::write_stats(save_rstd, rstd);
}

// The full backward with batch (group) statistics recomputed from x (one pass over x and dy for the
// statistics, one for dx).
// saved (optional): a blocked forward's statistics (BatchNorm), used where the backward runs blocked too.
void train_backward(const Plan& p, View dx, View dweight, View dbias, ConstView dy, ConstView x,
                    const float* w, double eps, GradMode mode, const chnorm::SavedBatch* saved = nullptr) {
  // mean(g) and mean(g·x̂) per group, g = dy·γ_c, and dγ, dβ: formed by grad_stats in segment order
  // (or channel block by channel block, with the same bits).
  if (const Index kc = chnorm::block_channels(p, 2, {x, dy, dx})) {
    const chnorm::GradStats st = chnorm::batch_backward_blocked(p, kc, dx, dy, x, eps, w, saved);
    chnorm::write_channel_grads(dweight, dbias, st.dweight, st.dbias, mode);
    return;
  }
  const chnorm::GradStats st = chnorm::grad_stats(p, dy, x, eps, w);
  chnorm::input_grad(p, dx, dy, x, st.m.mean, st.rstd, w, st.mg, st.mgx);
  chnorm::write_channel_grads(dweight, dbias, st.dweight, st.dbias, mode);
}

// Running statistics [C] read in double, and the rstd they give.
struct RunningStats {
  std::vector<double> mean, var, rstd;
};
RunningStats read_running(ConstView rm, ConstView rv, Index C, double eps) {
  RunningStats r;
  for (Index c = 0; c < C; ++c) {
    r.mean.push_back(static_cast<double>(rm.data()[c * rm.stride(0)]));
    r.var.push_back(static_cast<double>(rv.data()[c * rv.stride(0)]));
    r.rstd.push_back(1.0 / std::sqrt(r.var.back() + eps));
  }
  return r;
}

}  // namespace

// ---- BatchNorm ------------------------------------------------------------------------------------

namespace {

// x [B, C, S...]; y like x; save_mean, save_rstd, running_mean, running_var, weight, bias [C].
// stats (optional, training): the statistics for batch_norm_backward_saved.
void bn_forward(View y, View save_mean, View save_rstd, View running_mean, View running_var,
                Index* num_batches_tracked, ConstView x, ConstView weight, ConstView bias,
                std::span<const Index> lengths, const BatchNormOptions& opt, BatchNormStats* stats) {
  const char* op = kBnFwd;
  NL_CHECK(x.defined(), "{}: x is required", op);
  const Plan p =
      chnorm::make_plan(x.shape(), opt.channel_axis, Grouping::kBatch, 1, lengths, opt.time_axis, op);
  chnorm::check_bn_options(opt, op);
  chnorm::check_full_output(y, x, {}, "y", op);
  const std::vector<float> w = chnorm::channel_vector(weight, p.C, "weight", op);
  const std::vector<float> b = chnorm::channel_vector(bias, p.C, "bias", op);
  const Dims cs{p.C};
  chnorm::check_part_output(save_mean, cs, x, {}, "save_mean", op);
  chnorm::check_part_output(save_rstd, cs, x, {}, "save_rstd", op);
  chnorm::check_part_output(running_mean, cs, x, {}, "running_mean", op);
  chnorm::check_part_output(running_var, cs, x, {}, "running_var", op);
  NL_CHECK(running_mean.defined() == running_var.defined(),
           "{}: running_mean and running_var must be given together (got only {})", op,
           running_mean.defined() ? "running_mean" : "running_var");
  const bool tracking = running_mean.defined();

  if (!opt.training) {
    NL_CHECK(tracking, "{}: eval mode (training = false) needs running_mean and running_var", op);
    const RunningStats r = read_running(running_mean, running_var, p.C, opt.eps);
    chnorm::normalize(p, y, x, r.mean, r.rstd, ptr_or_null(w), ptr_or_null(b));
    chnorm::write_stats(save_mean, r.mean);
    chnorm::write_stats(save_rstd, r.rstd);
    return;
  }
  NL_CHECK(!tracking || opt.momentum || num_batches_tracked,
           "{}: momentum = nullopt (cumulative average) needs num_batches_tracked", op);
  check_training_counts(p, x.shape());
  chnorm::Moments m;
  std::vector<double> rstd, segment_mean;
  if (const Index kc = chnorm::block_channels(p, 1, {x, y})) {
    // Channel block by channel block, with the same bits as moments + train_forward.
    m = chnorm::batch_forward_blocked(p, kc, y, x, opt.eps, ptr_or_null(w), ptr_or_null(b), rstd,
                                      stats ? &segment_mean : nullptr);
    chnorm::write_stats(save_mean, m.mean);
    chnorm::write_stats(save_rstd, rstd);
  } else {
    m = chnorm::moments(p, x);
    rstd = chnorm::rstd_of(m, opt.eps);
    train_forward(p, y, save_mean, save_rstd, x, ptr_or_null(w), ptr_or_null(b), m, rstd);
  }
  if (tracking) chnorm::update_running_stats(running_mean, running_var, num_batches_tracked, m, opt);
  if (stats) {
    stats->x_shape = x.shape();
    stats->channel_axis = opt.channel_axis;
    stats->time_axis = opt.time_axis;
    stats->lengths = std::vector<Index>(lengths.begin(), lengths.end());  // (lengths may be stats->lengths)
    stats->eps = opt.eps;
    stats->mean = m.mean;
    stats->rstd = std::move(rstd);
    stats->segment_mean = std::move(segment_mean);
  }
}

}  // namespace

void batch_norm_forward(View y, View save_mean, View save_rstd, View running_mean, View running_var,
                        Index* num_batches_tracked, ConstView x, ConstView weight, ConstView bias,
                        std::span<const Index> lengths, const BatchNormOptions& opt) {
  bn_forward(y, save_mean, save_rstd, running_mean, running_var, num_batches_tracked, x, weight, bias,
             lengths, opt, nullptr);
}

void batch_norm_forward(View y, View save_mean, View save_rstd, View running_mean, View running_var,
                        Index* num_batches_tracked, ConstView x, ConstView weight, ConstView bias,
                        std::span<const Index> lengths, const BatchNormOptions& opt, BatchNormStats* stats) {
  NL_CHECK(stats, "{}: stats is null", kBnFwd);
  NL_CHECK(opt.training, "{}: stats are kept in training mode only (the eval backward needs none)", kBnFwd);
  bn_forward(y, save_mean, save_rstd, running_mean, running_var, num_batches_tracked, x, weight, bias,
             lengths, opt, stats);
}

namespace chnorm {

std::vector<double> rstd_of(const Moments& m, double eps) {
  std::vector<double> r(m.var.size());
  for (std::size_t g = 0; g < r.size(); ++g) r[g] = group_rstd(m.count[g], m.var[g], eps);
  return r;
}

void check_bn_options(const BatchNormOptions& opt, const char* op) {
  chnorm::check_eps(opt.eps, op);
  if (opt.momentum)
    NL_CHECK(std::isfinite(*opt.momentum) && *opt.momentum >= 0 && *opt.momentum <= 1,
             "{}: momentum must be in [0, 1], got {}", op, *opt.momentum);
}

void update_running_stats(View running_mean, View running_var, Index* num_batches_tracked, const Moments& m,
                          const BatchNormOptions& opt) {
  // Weights of the old value and of the batch statistic.
  Index k = 0;
  if (num_batches_tracked) k = ++*num_batches_tracked;
  const bool onnx = opt.convention == BatchNormOptions::RunningStatsConvention::kOnnx;
  double w_old, w_new;
  if (!opt.momentum) {
    w_new = 1.0 / static_cast<double>(k);
    w_old = 1.0 - w_new;
  } else if (onnx) {
    w_old = *opt.momentum;
    w_new = 1.0 - *opt.momentum;
  } else {
    w_new = *opt.momentum;
    w_old = 1.0 - *opt.momentum;
  }
  for (std::size_t i = 0; i < m.count.size(); ++i) {
    const Index c = static_cast<Index>(i);
    const double n = m.count[i];
    const double var = onnx ? m.var[i] : m.var[i] * n / (n - 1);  // PyTorch stores the unbiased variance
    float& rm = running_mean.data()[c * running_mean.stride(0)];
    float& rv = running_var.data()[c * running_var.stride(0)];
    rm = static_cast<float>(w_old * static_cast<double>(rm) + w_new * m.mean[i]);
    rv = static_cast<float>(w_old * static_cast<double>(rv) + w_new * var);
  }
}

}  // namespace chnorm

namespace {

// The checks of a channel norm backward's operands on plan p (dy like x, dx, dweight, dbias, weight), before
// anything is written; returns γ (empty: none).
std::vector<float> check_backward_operands(const Plan& p, View dx, View dweight, View dbias, ConstView dy,
                                           ConstView x, ConstView weight, const char* op) {
  NL_CHECK(dy.shape() == x.shape(), "{}: dy has shape {} but x has shape {}", op, dy.shape().str(),
           x.shape().str());
  chnorm::check_full_output(dx, x, dy, "dx", op);
  const std::vector<float> w = chnorm::channel_vector(weight, p.C, "weight", op);
  const Dims cs{p.C};
  chnorm::check_part_output(dweight, cs, x, dy, "dweight", op);
  chnorm::check_part_output(dbias, cs, x, dy, "dbias", op);
  return w;
}

}  // namespace

// dy, x, dx [B, C, S...]; weight, dweight, dbias, running_mean, running_var [C].
void batch_norm_backward(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                         ConstView running_mean, ConstView running_var, std::span<const Index> lengths,
                         const BatchNormOptions& opt, GradMode mode) {
  const char* op = kBnBwd;
  NL_CHECK(x.defined() && dy.defined(), "{}: x and dy are required", op);
  const Plan p =
      chnorm::make_plan(x.shape(), opt.channel_axis, Grouping::kBatch, 1, lengths, opt.time_axis, op);
  chnorm::check_bn_options(opt, op);
  const std::vector<float> w = check_backward_operands(p, dx, dweight, dbias, dy, x, weight, op);

  if (!opt.training) {
    NL_CHECK(running_mean.defined() && running_var.defined(),
             "{}: eval mode (training = false) needs running_mean and running_var", op);
    chnorm::channel_vector(running_mean, p.C, "running_mean", op);
    chnorm::channel_vector(running_var, p.C, "running_var", op);
    const RunningStats r = read_running(running_mean, running_var, p.C, opt.eps);
    if ((dweight.defined() || dbias.defined()) && chnorm::channel_rows(p, {x, dy, dx})) {
      // Channel rows: the per-channel sums, then dx (which may alias x or dy), the same bits.
      const chnorm::ChannelSums sums = chnorm::channel_grad_sums(p, dy, x, r.mean, r.rstd, nullptr, false);
      chnorm::input_grad_const(p, dx, dy, r.rstd, ptr_or_null(w));
      chnorm::write_channel_grads(dweight, dbias, sums.dweight, sums.dbias, mode);
    } else if (dweight.defined() || dbias.defined()) {
      // One pass: each segment's sums, then its dx (the bits of grad_sums + input_grad_const).
      std::vector<double> sdy, sdyxh;
      chnorm::grad_sums_input_grad_const(p, dx, dy, x, r.mean, r.rstd, ptr_or_null(w), sdy, sdyxh);
      chnorm::write_param_grads(p, dweight, dbias, sdy, sdyxh, mode);
    } else {
      chnorm::input_grad_const(p, dx, dy, r.rstd, ptr_or_null(w));
    }
    return;
  }
  check_training_counts(p, x.shape());
  train_backward(p, dx, dweight, dbias, dy, x, ptr_or_null(w), opt.eps, mode);
}

void batch_norm_backward_saved(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                               const BatchNormStats& stats, GradMode mode) {
  const char* op = kBnBwd;
  NL_CHECK(x.defined() && dy.defined(), "{}: x and dy are required", op);
  NL_CHECK(stats.x_shape == x.shape(), "{}: x has shape {}, the stats' forward had {}", op, x.shape().str(),
           stats.x_shape.str());
  const Plan p = chnorm::make_plan(x.shape(), stats.channel_axis, Grouping::kBatch, 1, stats.lengths,
                                   stats.time_axis, op);
  chnorm::check_eps(stats.eps, op);
  const std::vector<float> w = check_backward_operands(p, dx, dweight, dbias, dy, x, weight, op);
  const std::size_t nc = static_cast<std::size_t>(p.C), ns = static_cast<std::size_t>(p.segments());
  NL_CHECK(stats.mean.size() == nc && stats.rstd.size() == nc,
           "{}: stats hold {} mean and {} rstd values for {} channels", op, stats.mean.size(),
           stats.rstd.size(), p.C);
  NL_CHECK(stats.segment_mean.empty() || stats.segment_mean.size() == ns,
           "{}: stats hold {} segment means for {} segments (items x channels)", op,
           stats.segment_mean.size(), p.segments());
  check_training_counts(p, x.shape());
  const chnorm::SavedBatch saved{stats.mean.data(), stats.rstd.data(), stats.segment_mean.data()};
  train_backward(p, dx, dweight, dbias, dy, x, ptr_or_null(w), stats.eps, mode,
                 stats.segment_mean.empty() ? nullptr : &saved);
}

// ---- InstanceNorm and GroupNorm -------------------------------------------------------------------

namespace {

// Shared forward of the per-sample groupings. y like x; save_* of stats_shape(p).
// stats (optional): the groups' double mean and rstd (the caller fills the rest).
void grouped_forward(const Plan& p, View y, View save_mean, View save_rstd, ConstView x, ConstView weight,
                     ConstView bias, double eps, ChannelNormStats* stats = nullptr) {
  const char* op = p.op;
  chnorm::check_eps(eps, op);
  chnorm::check_full_output(y, x, {}, "y", op);
  const std::vector<float> w = chnorm::channel_vector(weight, p.C, "weight", op);
  const std::vector<float> b = chnorm::channel_vector(bias, p.C, "bias", op);
  const Dims ss = chnorm::stats_shape(p);
  chnorm::check_part_output(save_mean, ss, x, {}, "save_mean", op);
  chnorm::check_part_output(save_rstd, ss, x, {}, "save_rstd", op);
  // The calling thread's statistics, reused from call to call (no page faults for fresh vectors).
  thread_local chnorm::Moments m;
  thread_local std::vector<double> rstd;
  chnorm::per_sample_forward(p, y, x, eps, ptr_or_null(w), ptr_or_null(b), m, rstd);
  chnorm::write_stats(save_mean, m.mean);
  chnorm::write_stats(save_rstd, rstd);
  if (stats) {
    stats->x_shape = x.shape();
    stats->eps = eps;
    stats->layer_norm_rows = chnorm::group_rows_apply(p, {x, y});
    stats->mean = m.mean;
    stats->rstd = rstd;
  }
}

// stats (optional): a forward's (checked against p and x by the caller), used where the backward runs on
// the forward's kernels (per_sample_backward's saved statistics), else recomputed.
void grouped_backward(const Plan& p, View dx, View dweight, View dbias, ConstView dy, ConstView x,
                      ConstView weight, double eps, GradMode mode, const ChannelNormStats* stats = nullptr) {
  const char* op = p.op;
  chnorm::check_eps(eps, op);
  const std::vector<float> w = check_backward_operands(p, dx, dweight, dbias, dy, x, weight, op);
  std::vector<double> sw, sb;
  chnorm::SavedGroups saved;
  if (stats) {
    NL_CHECK(stats->mean.size() == static_cast<std::size_t>(p.groups) &&
                 stats->rstd.size() == static_cast<std::size_t>(p.groups),
             "{}: stats hold {} mean and {} rstd values for {} groups", op, stats->mean.size(),
             stats->rstd.size(), p.groups);
    saved = {stats->mean.data(), stats->rstd.data()};
  }
  // (group rows recompute; statistics from group rows are of the row kernels' arithmetic:
  // per_sample_backward)
  const bool use = stats && !stats->layer_norm_rows && !chnorm::group_rows_apply(p, {x, dy, dx});
  chnorm::per_sample_backward(p, dx, dy, x, eps, ptr_or_null(w), sw, sb, use ? &saved : nullptr);
  chnorm::write_channel_grads(dweight, dbias, sw, sb, mode);
}

// The checks of a backward given a forward's statistics: the op, x's shape.
void check_stats_source(const ChannelNormStats& stats, bool group, ConstView x, const char* op) {
  NL_CHECK(stats.group == group, "{}: stats come from a {} forward", op,
           stats.group ? "GroupNorm" : "InstanceNorm");
  NL_CHECK(x.defined(), "{}: x and dy are required", op);
  NL_CHECK(stats.x_shape == x.shape(), "{}: x has shape {}, the stats' forward had {}", op, x.shape().str(),
           stats.x_shape.str());
}

}  // namespace

void instance_norm_forward(View y, View save_mean, View save_rstd, ConstView x, ConstView weight,
                           ConstView bias, std::span<const Index> lengths, const InstanceNormOptions& opt) {
  NL_CHECK(x.defined(), "{}: x is required", kInFwd);
  const Plan p =
      chnorm::make_plan(x.shape(), opt.channel_axis, Grouping::kInstance, 1, lengths, opt.time_axis, kInFwd);
  grouped_forward(p, y, save_mean, save_rstd, x, weight, bias, opt.eps);
}

void instance_norm_backward(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                            std::span<const Index> lengths, const InstanceNormOptions& opt, GradMode mode) {
  NL_CHECK(x.defined() && dy.defined(), "{}: x and dy are required", kInBwd);
  const Plan p =
      chnorm::make_plan(x.shape(), opt.channel_axis, Grouping::kInstance, 1, lengths, opt.time_axis, kInBwd);
  grouped_backward(p, dx, dweight, dbias, dy, x, weight, opt.eps, mode);
}

void instance_norm_forward(View y, View save_mean, View save_rstd, ConstView x, ConstView weight,
                           ConstView bias, std::span<const Index> lengths, const InstanceNormOptions& opt,
                           ChannelNormStats* stats) {
  NL_CHECK(stats, "{}: stats is null", kInFwd);
  NL_CHECK(x.defined(), "{}: x is required", kInFwd);
  const Plan p =
      chnorm::make_plan(x.shape(), opt.channel_axis, Grouping::kInstance, 1, lengths, opt.time_axis, kInFwd);
  grouped_forward(p, y, save_mean, save_rstd, x, weight, bias, opt.eps, stats);
  stats->group = false;
  stats->channel_axis = opt.channel_axis;
  stats->groups = 1;
  stats->time_axis = opt.time_axis;
  stats->lengths = std::vector<Index>(lengths.begin(), lengths.end());  // (lengths may be stats->lengths)
}

void instance_norm_backward_saved(View dx, View dweight, View dbias, ConstView dy, ConstView x,
                                  ConstView weight, const ChannelNormStats& stats, GradMode mode) {
  check_stats_source(stats, false, x, kInBwd);
  NL_CHECK(dy.defined(), "{}: x and dy are required", kInBwd);
  const Plan p = chnorm::make_plan(x.shape(), stats.channel_axis, Grouping::kInstance, 1, stats.lengths,
                                   stats.time_axis, kInBwd);
  grouped_backward(p, dx, dweight, dbias, dy, x, weight, stats.eps, mode, &stats);
}

void group_norm_forward(View y, View save_mean, View save_rstd, ConstView x, ConstView weight, ConstView bias,
                        int groups, const GroupNormOptions& opt) {
  NL_CHECK(x.defined(), "{}: x is required", kGnFwd);
  const Plan p = chnorm::make_plan(x.shape(), opt.channel_axis, Grouping::kGroup, groups, {}, -1, kGnFwd);
  grouped_forward(p, y, save_mean, save_rstd, x, weight, bias, opt.eps);
}

void group_norm_backward(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                         int groups, const GroupNormOptions& opt, GradMode mode) {
  NL_CHECK(x.defined() && dy.defined(), "{}: x and dy are required", kGnBwd);
  const Plan p = chnorm::make_plan(x.shape(), opt.channel_axis, Grouping::kGroup, groups, {}, -1, kGnBwd);
  grouped_backward(p, dx, dweight, dbias, dy, x, weight, opt.eps, mode);
}

void group_norm_forward(View y, View save_mean, View save_rstd, ConstView x, ConstView weight, ConstView bias,
                        int groups, const GroupNormOptions& opt, ChannelNormStats* stats) {
  NL_CHECK(stats, "{}: stats is null", kGnFwd);
  NL_CHECK(x.defined(), "{}: x is required", kGnFwd);
  const Plan p = chnorm::make_plan(x.shape(), opt.channel_axis, Grouping::kGroup, groups, {}, -1, kGnFwd);
  grouped_forward(p, y, save_mean, save_rstd, x, weight, bias, opt.eps, stats);
  stats->group = true;
  stats->channel_axis = opt.channel_axis;
  stats->groups = groups;
  stats->time_axis = -1;
  stats->lengths.clear();
}

void group_norm_backward_saved(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                               const ChannelNormStats& stats, GradMode mode) {
  check_stats_source(stats, true, x, kGnBwd);
  NL_CHECK(dy.defined(), "{}: x and dy are required", kGnBwd);
  const Plan p =
      chnorm::make_plan(x.shape(), stats.channel_axis, Grouping::kGroup, stats.groups, {}, -1, kGnBwd);
  grouped_backward(p, dx, dweight, dbias, dy, x, weight, stats.eps, mode, &stats);
}

Dims instance_stats_shape(const Dims& x_shape, int channel_axis) {
  return chnorm::stats_shape(
      chnorm::make_plan(x_shape, channel_axis, Grouping::kInstance, 1, {}, -1, "instance_stats_shape"));
}

Dims group_stats_shape(const Dims& x_shape, int groups, int channel_axis) {
  return chnorm::stats_shape(
      chnorm::make_plan(x_shape, channel_axis, Grouping::kGroup, groups, {}, -1, "group_stats_shape"));
}

}  // namespace normlab
