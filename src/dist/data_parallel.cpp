// Data-parallel training helpers: gradient averaging and parameter broadcast (include/normlab/dist.h).
#include <normlab/dist.h>
#include <normlab/error.h>

#include <cmath>
#include <vector>

#include "dist/train_hooks.h"

namespace normlab::dist {

namespace {

// The parameter list's shape signature: count, then per parameter its rank, dims and a hash of its name,
// so that ranks holding different models stop with an error instead of mixing unrelated gradients.
std::vector<double> signature(std::span<const nn::ParamRef> params) {
  std::vector<double> s{static_cast<double>(params.size())};
  for (const nn::ParamRef& p : params) {
    std::uint32_t h = 2166136261u;  // FNV-1a of the name
    for (unsigned char ch : p.name) h = (h ^ ch) * 16777619u;
    s.push_back(static_cast<double>(h));
    s.push_back(static_cast<double>(p.shape.size()));
    for (Index d : p.shape) s.push_back(static_cast<double>(d));
  }
  return s;
}

std::string check_local(std::span<const nn::ParamRef> params, bool need_grad, const char* op) {
  for (const nn::ParamRef& p : params) {
    if (!p.data) return fmt::format("{}: parameter {} has no data", op, p.name);
    if (need_grad && !p.grad) return fmt::format("{}: parameter {} has no gradient", op, p.name);
  }
  return {};
}

}  // namespace

void average_gradients(const Comm& comm, std::span<const nn::ParamRef> params, double weight) {
  const char* op = "average_gradients";
  std::string err = check_local(params, true, op);
  if (err.empty() && !(std::isfinite(weight) && weight >= 0))
    err = fmt::format("{}: weight must be finite and ≥ 0, got {}", op, weight);
  comm.agree(err);
  comm.check_same(signature(params), std::string(op) + ": the parameter list (names and shapes)");

  std::vector<double> weights{weight};
  const std::vector<double> all_w = comm.allgather(weights);
  double total = 0;
  for (double w : all_w) total += w;                                   // rank order
  NL_CHECK(total > 0, "{}: the weights sum to 0 over all ranks", op);  // the same on every rank
  // Each rank's gradients in double, scaled by its weight and summed over ranks in rank order.
  Index n = 0;
  for (const nn::ParamRef& p : params) n += p.numel();
  std::vector<double> sum(static_cast<std::size_t>(n));
  std::size_t k = 0;
  for (const nn::ParamRef& p : params)
    for (Index i = 0; i < p.numel(); ++i) sum[k++] = static_cast<double>(p.grad[i]);
  comm.weighted_sum(sum, all_w);
  k = 0;
  for (const nn::ParamRef& p : params)
    for (Index i = 0; i < p.numel(); ++i) p.grad[i] = static_cast<float>(sum[k++] / total);
}

void broadcast_params(const Comm& comm, std::span<const nn::ParamRef> params, int root) {
  const char* op = "broadcast_params";
  std::string err = check_local(params, false, op);
  if (err.empty() && (root < 0 || root >= comm.size()))
    err = fmt::format("{}: root {} is not a rank (size {})", op, root, comm.size());
  comm.agree(err);
  comm.check_same(signature(params), std::string(op) + ": the parameter list (names and shapes)");
  for (const nn::ParamRef& p : params) {
    const int rc = MPI_Bcast(p.data, static_cast<int>(p.numel()), MPI_FLOAT, root, comm.handle());
    NL_CHECK(rc == MPI_SUCCESS, "{}: MPI_Bcast failed for {}", op, p.name);
  }
}

double weighted_mean(const Comm& comm, double value, double weight) {
  const std::vector<double> all = comm.allgather(std::vector<double>{value, weight});
  double s = 0, w = 0;
  for (int r = 0; r < comm.size(); ++r) {  // rank order
    s += all[2 * static_cast<std::size_t>(r) + 1] * all[2 * static_cast<std::size_t>(r)];
    w += all[2 * static_cast<std::size_t>(r) + 1];
  }
  NL_CHECK(w > 0, "weighted_mean: the weights sum to 0 over all ranks");
  return s / w;
}

nn::DataParallel data_parallel(const Comm& comm) {
  nn::DataParallel dp;
  dp.rank = comm.rank();
  dp.size = comm.size();
  dp.broadcast = [comm](std::span<const nn::ParamRef> p) { broadcast_params(comm, p, 0); };
  dp.average_gradients = [comm](std::span<const nn::ParamRef> p, double w) { average_gradients(comm, p, w); };
  dp.weighted_mean = [comm](double v, double w) { return weighted_mean(comm, v, w); };
  dp.batch_norm.forward = [comm](View y, View rm, View rv, ConstView x, ConstView w, ConstView b,
                                 const BatchNormOptions& opt) {
    sync_batch_norm_forward(comm, y, View(), View(), rm, rv, nullptr, x, w, b, {}, opt);
  };
  dp.batch_norm.backward = [comm](View dx, View dw, View db, ConstView dy, ConstView x, ConstView w,
                                  ConstView rm, ConstView rv, const BatchNormOptions& opt, GradMode mode) {
    sync_batch_norm_backward(comm, dx, dw, db, dy, x, w, rm, rv, {}, opt, mode);
  };
  return dp;
}

}  // namespace normlab::dist
