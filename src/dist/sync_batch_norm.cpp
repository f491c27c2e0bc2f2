// SyncBatchNorm: BatchNorm with the statistics of every rank's batch (include/normlab/dist.h), on the
// channel-norm engine (src/norm/channel_norm.h): local moments and per-segment gradient sums, merged across
// ranks in rank order, then the engine's normalize / input_grad with the merged statistics.
#include <normlab/dist.h>
#include <normlab/error.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "norm/channel_norm.h"

namespace normlab::dist {

namespace {

constexpr const char* kFwd = "sync_batch_norm_forward";
constexpr const char* kBwd = "sync_batch_norm_backward";

const float* ptr_or_null(const std::vector<float>& v) {
  return v.empty() ? nullptr : v.data();
}

// Per channel: the merged count, mean and biased variance of every rank's real elements. Every rank sends
// (n_r, mean_r, var_r) per channel; the merge runs in rank order on every rank (Chan et al.'s combination,
// written around m_ref, the mean of the first rank with elements, and with weights n_r / n):
//   n = Σ n_r,  mean = m_ref + Σ (n_r/n)·(mean_r − m_ref),  var = Σ (n_r/n)·(var_r + (mean_r − mean)²).
// With one rank this returns that rank's mean and var exactly (1·0 and 1·var), so SyncBatchNorm on one rank
// has BatchNorm's bits.
chnorm::Moments global_moments(const Comm& comm, const chnorm::Plan& p, ConstView x) {
  const chnorm::Moments m = chnorm::moments(p, x);
  const std::size_t C = static_cast<std::size_t>(p.C);
  std::vector<double> local(3 * C);
  for (std::size_t c = 0; c < C; ++c) {
    local[c] = m.count[c];
    local[C + c] = m.mean[c];
    local[2 * C + c] = m.var[c];
  }
  const std::vector<double> all = comm.allgather(local);
  chnorm::Moments g;
  g.count.assign(C, 0.0);
  g.mean.assign(C, 0.0);
  g.var.assign(C, 0.0);
  const auto at = [&](int r, std::size_t k) { return all[static_cast<std::size_t>(r) * 3 * C + k]; };
  for (std::size_t c = 0; c < C; ++c) {
    double n = 0, ref = 0;
    bool have_ref = false;
    for (int r = 0; r < comm.size(); ++r) {
      n += at(r, c);
      if (!have_ref && at(r, c) > 0) {
        ref = at(r, C + c);
        have_ref = true;
      }
    }
    if (n == 0) continue;  // an empty channel: mean = var = 0, as chnorm::moments
    double shift = 0;
    for (int r = 0; r < comm.size(); ++r)
      if (at(r, c) > 0) shift += at(r, c) / n * (at(r, C + c) - ref);
    const double mean = ref + shift;
    double var = 0;
    for (int r = 0; r < comm.size(); ++r)
      if (at(r, c) > 0) {
        const double d = at(r, C + c) - mean;
        var += at(r, c) / n * (at(r, 2 * C + c) + d * d);
      }
    g.count[c] = n;
    g.mean[c] = mean;
    g.var[c] = var;
  }
  return g;
}

void check_training_counts(const chnorm::Moments& m, const char* op) {
  for (std::size_t c = 0; c < m.count.size(); ++c)
    NL_CHECK(
        m.count[c] > 1,
        "{}: Expected more than 1 value per channel when training, got {} real value(s) in channel {} over "
        "all ranks",
        op, m.count[c], c);
}

// Runs `local_checks` and agrees on the outcome with every rank (all go on or all throw).
template <class F>
auto checked(const Comm& comm, F&& local_checks) {
  std::string err;
  std::optional<chnorm::Plan> plan;
  try {
    plan = local_checks();
  } catch (const Error& e) {
    err = e.what();
  }
  comm.agree(err);
  return *plan;
}

}  // namespace

// x [B_r, C, S...]; y like x; save_mean, save_rstd, running_mean, running_var, weight, bias [C].
void sync_batch_norm_forward(const Comm& comm, View y, View save_mean, View save_rstd, View running_mean,
                             View running_var, Index* num_batches_tracked, ConstView x, ConstView weight,
                             ConstView bias, std::span<const Index> lengths, const BatchNormOptions& opt) {
  if (!opt.training) {  // the running statistics: nothing to exchange
    batch_norm_forward(y, save_mean, save_rstd, running_mean, running_var, num_batches_tracked, x, weight,
                       bias, lengths, opt);
    return;
  }
  const char* op = kFwd;
  std::vector<float> w, b;
  const chnorm::Plan p = checked(comm, [&] {
    NL_CHECK(x.defined(), "{}: x is required", op);
    chnorm::Plan plan = chnorm::make_plan(x.shape(), opt.channel_axis, chnorm::Grouping::kBatch, 1, lengths,
                                          opt.time_axis, op);
    chnorm::check_bn_options(opt, op);
    chnorm::check_full_output(y, x, {}, "y", op);
    w = chnorm::channel_vector(weight, plan.C, "weight", op);
    b = chnorm::channel_vector(bias, plan.C, "bias", op);
    const Dims cs{plan.C};
    chnorm::check_part_output(save_mean, cs, x, {}, "save_mean", op);
    chnorm::check_part_output(save_rstd, cs, x, {}, "save_rstd", op);
    chnorm::check_part_output(running_mean, cs, x, {}, "running_mean", op);
    chnorm::check_part_output(running_var, cs, x, {}, "running_var", op);
    NL_CHECK(running_mean.defined() == running_var.defined(),
             "{}: running_mean and running_var must be given together", op);
    NL_CHECK(!running_mean.defined() || opt.momentum || num_batches_tracked,
             "{}: momentum = nullopt (cumulative average) needs num_batches_tracked", op);
    return plan;
  });
  const double channels = static_cast<double>(p.C);
  comm.check_same({&channels, 1}, std::string(op) + ": the number of channels");

  const chnorm::Moments m = global_moments(comm, p, x);
  check_training_counts(m, op);  // the same merged counts on every rank: all throw or none
  const std::vector<double> rstd = chnorm::rstd_of(m, opt.eps);
  chnorm::normalize(p, y, x, m.mean, rstd, ptr_or_null(w), ptr_or_null(b));
  chnorm::write_stats(save_mean, m.mean);
  chnorm::write_stats(save_rstd, rstd);
  if (!running_mean.defined()) return;
  chnorm::update_running_stats(running_mean, running_var, num_batches_tracked, m, opt);  // merged moments
}

// dy, x, dx [B_r, C, S...]; weight, dweight, dbias, running_mean, running_var [C].
void sync_batch_norm_backward(const Comm& comm, View dx, View dweight, View dbias, ConstView dy, ConstView x,
                              ConstView weight, ConstView running_mean, ConstView running_var,
                              std::span<const Index> lengths, const BatchNormOptions& opt, GradMode mode) {
  if (!opt.training) {
    batch_norm_backward(dx, dweight, dbias, dy, x, weight, running_mean, running_var, lengths, opt, mode);
    return;
  }
  const char* op = kBwd;
  std::vector<float> w;
  const chnorm::Plan p = checked(comm, [&] {
    NL_CHECK(x.defined() && dy.defined(), "{}: x and dy are required", op);
    chnorm::Plan plan = chnorm::make_plan(x.shape(), opt.channel_axis, chnorm::Grouping::kBatch, 1, lengths,
                                          opt.time_axis, op);
    chnorm::check_bn_options(opt, op);
    NL_CHECK(dy.shape() == x.shape(), "{}: dy has shape {} but x has shape {}", op, dy.shape().str(),
             x.shape().str());
    chnorm::check_full_output(dx, x, dy, "dx", op);
    w = chnorm::channel_vector(weight, plan.C, "weight", op);
    const Dims cs{plan.C};
    chnorm::check_part_output(dweight, cs, x, dy, "dweight", op);
    chnorm::check_part_output(dbias, cs, x, dy, "dbias", op);
    return plan;
  });
  const double channels = static_cast<double>(p.C);
  comm.check_same({&channels, 1}, std::string(op) + ": the number of channels");

  const chnorm::Moments m = global_moments(comm, p, x);
  check_training_counts(m, op);
  const std::vector<double> rstd = chnorm::rstd_of(m, opt.eps);
  // Per segment (b, c): Σ dy and Σ dy·x̂ with the merged statistics. Per channel, as batch_norm_backward forms
  // them (chnorm::grad_stats): Σ_b γ_c·Σdy and Σ_b γ_c·Σdy·x̂ in b order; then over ranks in rank order.
  // (Channels innermost, every segment one element: the channel-rows sums, the same values.)
  const std::size_t C = static_cast<std::size_t>(p.C);
  std::vector<double> sums(2 * C, 0.0);
  std::vector<double> sdy, sdyxh;
  chnorm::ChannelSums rows;
  const bool on_rows = chnorm::channel_rows(p, {x, dy});
  if (on_rows) {
    rows = chnorm::channel_grad_sums(p, dy, x, m.mean, rstd, ptr_or_null(w), true);
    std::copy(rows.wdy.begin(), rows.wdy.end(), sums.begin());
    std::copy(rows.wdyxh.begin(), rows.wdyxh.end(), sums.begin() + static_cast<std::ptrdiff_t>(C));
  } else {
    chnorm::grad_sums(p, dy, x, m.mean, rstd, sdy, sdyxh);
    for (Index bi = 0; bi < p.B; ++bi)
      for (std::size_t c = 0; c < C; ++c) {
        const std::size_t seg = static_cast<std::size_t>(bi) * C + c;
        const double wc = w.empty() ? 1.0 : static_cast<double>(w[c]);
        sums[c] += wc * sdy[seg];
        sums[C + c] += wc * sdyxh[seg];
      }
  }
  comm.allreduce_sum(sums);
  // mean(g) and mean(g·x̂) per channel, g = dy·γ_c.
  std::vector<double> mg(C), mgx(C);
  for (std::size_t c = 0; c < C; ++c) {
    mg[c] = m.count[c] > 0 ? sums[c] / m.count[c] : 0.0;
    mgx[c] = m.count[c] > 0 ? sums[C + c] / m.count[c] : 0.0;
  }
  chnorm::input_grad(p, dx, dy, x, m.mean, rstd, ptr_or_null(w), mg, mgx);
  // This rank's sums (PyTorch's SyncBatchNorm).
  if (on_rows)
    chnorm::write_channel_grads(dweight, dbias, rows.dweight, rows.dbias, mode);
  else
    chnorm::write_param_grads(p, dweight, dbias, sdy, sdyxh, mode);
}

}  // namespace normlab::dist
