// Normalization layers over the last axis: DyT, and thin adapters to normlab's LayerNorm / RMSNorm
// (float: the library kernels of include/normlab/norm.h; double: the same formulas in plain loops).
// See include/normlab/nn/layers.h.
#include <normlab/nn/layers.h>
#include <normlab/norm.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "nn/checks.h"
#include "nn/elementwise.h"
#include "nn/scratch.h"
#include "parallel/parallel.h"

namespace normlab::nn {

namespace {

void check_rows(const char* layer, Index N, Index C) {
  detail::check_size(layer, "N", N);
  detail::check_size(layer, "C", C);
}

void check_eps(const char* layer, double eps) {
  NL_CHECK(std::isfinite(eps) && eps >= 0, "{}: eps must be finite and ≥ 0, got {}", layer, eps);
}

ConstView rows_view(const float* p, Index N, Index C) { return p ? ConstView(p, {N, C}) : ConstView(); }
ConstView vec_view(const float* p, Index C) { return p ? ConstView(p, {C}) : ConstView(); }
View vec_view(float* p, Index C) { return p ? View(p, {C}) : View(); }

// dinp += dx for the float library paths, which write dx with "=".
void accumulate(float* dinp, const float* dx, Index n) {
  detail::for_chunks(n, [&](Index i0, Index i1) {
    // Scalar math: dinp[i] = dinp[i] + dx[i]
    for (Index i = i0; i < i1; ++i) dinp[i] += dx[i];
  });
}

}  // namespace

// ---- DyT ------------------------------------------------------------------------------------------

template <typename Real>
void dyt_forward(Real* out, const Real* inp, const Real* alpha, const Real* gamma, const Real* beta, Index N,
                 Index C) {
  // out, inp are (N,C); alpha is (1); gamma, beta are (C)
  check_rows("dyt", N, C);
  const Real a = *alpha;
  parallel::parallel_for(N, [&](Index n) {
    for (Index c = 0; c < C; ++c) out[n * C + c] = gamma[c] * std::tanh(a * inp[n * C + c]) + beta[c];
  });
}

template <typename Real>
void dyt_backward(Real* dinp, Real* dalpha, Real* dgamma, Real* dbeta, const Real* dout, const Real* inp,
                  const Real* alpha, const Real* gamma, Index N, Index C) {
  // dinp (nullable) (N,C); dalpha (1); dgamma, dbeta (C); dout, inp (N,C). Sums in double, row order.
  check_rows("dyt", N, C);
  const double a = static_cast<double>(*alpha);
  double da = 0;
  std::vector<double> dg(static_cast<std::size_t>(C), 0.0), db(static_cast<std::size_t>(C), 0.0);
  for (Index n = 0; n < N; ++n)
    for (Index c = 0; c < C; ++c) {
      const double x = inp[n * C + c], dy = dout[n * C + c];
      const double s = std::tanh(a * x), ds = dy * static_cast<double>(gamma[c]) * (1 - s * s);  // d(out)/d(a·x)
      if (dinp) dinp[n * C + c] += static_cast<Real>(ds * a);
      da += ds * x;
      dg[static_cast<std::size_t>(c)] += dy * s;
      db[static_cast<std::size_t>(c)] += dy;
    }
  *dalpha += static_cast<Real>(da);
  for (Index c = 0; c < C; ++c) {
    dgamma[c] += static_cast<Real>(dg[static_cast<std::size_t>(c)]);
    dbeta[c] += static_cast<Real>(db[static_cast<std::size_t>(c)]);
  }
}

// ---- LayerNorm / RMSNorm ------------------------------------------------------------------------------
//
// The double path: per row, mean and rstd in two passes (mean ≡ 0 for RMSNorm), then
//   forward   y = x̂·γ + β,  x̂ = (x − mean)·rstd
//   backward  g = dy·γ;  dx = rstd·(g − mean(g) − x̂·mean(g·x̂))   (RMSNorm: no mean(g) term)

namespace {

void norm_rows_forward(double* out, double* mean_out, double* rstd_out, const double* inp, const double* w,
                       const double* b, Index N, Index C, double eps, bool centre) {
  for (Index n = 0; n < N; ++n) {
    const double* x = inp + n * C;
    double mean = 0;
    if (centre) {
      for (Index c = 0; c < C; ++c) mean += x[c];
      mean /= static_cast<double>(C);
    }
    double var = 0;
    for (Index c = 0; c < C; ++c) var += (x[c] - mean) * (x[c] - mean);
    var /= static_cast<double>(C);
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (Index c = 0; c < C; ++c) out[n * C + c] = (x[c] - mean) * rstd * (w ? w[c] : 1.0) + (b ? b[c] : 0.0);
    if (mean_out) mean_out[n] = mean;
    if (rstd_out) rstd_out[n] = rstd;
  }
}

void norm_rows_backward(double* dinp, double* dw, double* db, const double* dout, const double* inp,
                        const double* w, Index N, Index C, double eps, bool centre) {
  std::vector<double> xhat(static_cast<std::size_t>(C));
  for (Index n = 0; n < N; ++n) {
    const double* x = inp + n * C;
    const double* dy = dout + n * C;
    double mean = 0;
    if (centre) {
      for (Index c = 0; c < C; ++c) mean += x[c];
      mean /= static_cast<double>(C);
    }
    double var = 0;
    for (Index c = 0; c < C; ++c) var += (x[c] - mean) * (x[c] - mean);
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(C) + eps);
    double mg = 0, mgx = 0;  // mean(g), mean(g·x̂)
    for (Index c = 0; c < C; ++c) {
      const double xh = (x[c] - mean) * rstd, g = dy[c] * (w ? w[c] : 1.0);
      xhat[static_cast<std::size_t>(c)] = xh;
      mg += g;
      mgx += g * xh;
      if (dw) dw[c] += dy[c] * xh;
      if (db) db[c] += dy[c];
    }
    mg = centre ? mg / static_cast<double>(C) : 0.0;
    mgx /= static_cast<double>(C);
    if (dinp)
      for (Index c = 0; c < C; ++c) {
        const double g = dy[c] * (w ? w[c] : 1.0);
        dinp[n * C + c] += rstd * (g - mg - xhat[static_cast<std::size_t>(c)] * mgx);
      }
  }
}

}  // namespace

template <typename Real>
void layernorm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const Real* weight, const Real* bias,
                       Index N, Index C, double eps) {
  // out, inp are (N,C); mean, rstd (nullable) are (N); weight, bias (nullable) are (C)
  check_rows("layernorm", N, C);
  check_eps("layernorm", eps);
  if constexpr (std::is_same_v<Real, float>) {
    layer_norm_forward(View(out, {N, C}), mean ? View(mean, {N}) : View(), rstd ? View(rstd, {N}) : View(),
                       rows_view(inp, N, C), vec_view(weight, C), vec_view(bias, C), {-1}, eps);
  } else {
    norm_rows_forward(out, mean, rstd, inp, weight, bias, N, C, eps, /*centre=*/true);
  }
}

template <typename Real>
void layernorm_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                        const Real* weight, Index N, Index C, double eps) {
  // dinp (nullable) (N,C); dweight, dbias (nullable) (C); dout, inp (N,C); weight (nullable) (C)
  check_rows("layernorm", N, C);
  check_eps("layernorm", eps);
  if constexpr (std::is_same_v<Real, float>) {
    // the library writes dx with "=": into scratch, then dinp += dx
    float* dx = detail::scratch<float>(detail::kNormDx, N * C);
    layer_norm_backward(View(dx, {N, C}), vec_view(dweight, C), vec_view(dbias, C),
                        rows_view(dout, N, C), rows_view(inp, N, C), vec_view(weight, C), {-1}, eps,
                        GradMode::kAccumulate);
    if (dinp) accumulate(dinp, dx, N * C);
  } else {
    norm_rows_backward(dinp, dweight, dbias, dout, inp, weight, N, C, eps, /*centre=*/true);
  }
}

template <typename Real>
void rmsnorm_forward(Real* out, Real* rstd, const Real* inp, const Real* weight, Index N, Index C, double eps) {
  // out, inp are (N,C); rstd (nullable) is (N); weight (nullable) is (C)
  check_rows("rmsnorm", N, C);
  check_eps("rmsnorm", eps);
  if constexpr (std::is_same_v<Real, float>) {
    rms_norm_forward(View(out, {N, C}), rstd ? View(rstd, {N}) : View(), rows_view(inp, N, C), vec_view(weight, C),
                     {-1}, eps);
  } else {
    norm_rows_forward(out, nullptr, rstd, inp, weight, nullptr, N, C, eps, /*centre=*/false);
  }
}

template <typename Real>
void rmsnorm_backward(Real* dinp, Real* dweight, const Real* dout, const Real* inp, const Real* weight, Index N,
                      Index C, double eps) {
  // dinp (nullable) (N,C); dweight (nullable) (C); dout, inp (N,C); weight (nullable) (C)
  check_rows("rmsnorm", N, C);
  check_eps("rmsnorm", eps);
  if constexpr (std::is_same_v<Real, float>) {
    float* dx = detail::scratch<float>(detail::kNormDx, N * C);
    rms_norm_backward(View(dx, {N, C}), vec_view(dweight, C), rows_view(dout, N, C),
                      rows_view(inp, N, C), vec_view(weight, C), {-1}, eps, GradMode::kAccumulate);
    if (dinp) accumulate(dinp, dx, N * C);
  } else {
    norm_rows_backward(dinp, dweight, nullptr, dout, inp, weight, N, C, eps, /*centre=*/false);
  }
}

// ---- BatchNorm over the sequence ------------------------------------------------------------------------

namespace {

void check_bn(std::span<const Index> lengths, Index B, Index T, Index C, bool training, double momentum,
              double eps, const void* running_mean, const void* running_var) {
  detail::check_size("batchnorm", "B", B);
  detail::check_size("batchnorm", "T", T);
  detail::check_size("batchnorm", "C", C);
  detail::check_lengths("batchnorm", lengths, B, T);
  check_eps("batchnorm", eps);
  NL_CHECK(std::isfinite(momentum) && momentum >= 0 && momentum <= 1, "batchnorm: momentum must lie in [0, 1], got {}",
           momentum);
  NL_CHECK((running_mean == nullptr) == (running_var == nullptr),
           "batchnorm: give both running_mean and running_var, or neither");
  NL_CHECK(training || running_mean != nullptr, "batchnorm: eval mode needs the running statistics");
}

// The real rows (b, t < len_b) of a (B,T,C) tensor, in order: f(row index in (B·T), compact index).
template <typename F>
Index for_real_rows(std::span<const Index> lengths, Index B, Index T, F&& f) {
  Index n = 0;
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < detail::length_of(lengths, b, T); ++t) f(b * T + t, n++);
  return n;
}

Index count_real(std::span<const Index> lengths, Index B, Index T) {
  return for_real_rows(lengths, B, T, [](Index, Index) {});
}

BatchNormOptions bn_options(bool training, double momentum, double eps) {
  BatchNormOptions o;
  o.channel_axis = 1;  // the compact (n, C) rows: C is the channel axis, the n rows the batch
  o.eps = eps;
  o.momentum = momentum;
  o.training = training;
  return o;
}

// double path: per channel mean and biased variance over the real rows (two passes)
void bn_moments(std::vector<double>& mean, std::vector<double>& var, const double* inp,
                std::span<const Index> lengths, Index B, Index T, Index C) {
  mean.assign(static_cast<std::size_t>(C), 0.0);
  var.assign(static_cast<std::size_t>(C), 0.0);
  const Index n = for_real_rows(lengths, B, T, [&](Index r, Index) {
    for (Index c = 0; c < C; ++c) mean[static_cast<std::size_t>(c)] += inp[r * C + c];
  });
  for (double& m : mean) m /= static_cast<double>(n);
  for_real_rows(lengths, B, T, [&](Index r, Index) {
    for (Index c = 0; c < C; ++c) {
      const double d = inp[r * C + c] - mean[static_cast<std::size_t>(c)];
      var[static_cast<std::size_t>(c)] += d * d;
    }
  });
  for (double& v : var) v /= static_cast<double>(n);
}

}  // namespace

template <typename Real>
void batchnorm_forward(Real* out, Real* running_mean, Real* running_var, const Real* inp, const Real* weight,
                       const Real* bias, std::span<const Index> lengths, Index B, Index T, Index C,
                       bool training, double momentum, double eps, const BatchNormKernels* kernels) {
  // out, inp are (B,T,C); running_mean, running_var, weight, bias are (C)
  check_bn(lengths, B, T, C, training, momentum, eps, running_mean, running_var);
  NL_CHECK((!kernels || std::is_same_v<Real, float>), "batchnorm: kernels replace the float path only");
  const Index n = count_real(lengths, B, T);
  // With other kernels (SyncBatchNorm) the counts that matter are over every rank, and every rank must call.
  NL_CHECK(kernels || !training || n >= 2,
           "batchnorm: training needs more than 1 value per channel, got {} real positions", n);
  std::fill_n(out, B * T * C, Real(0));  // padded rows stay 0
  if (n == 0 && !kernels) return;
  if constexpr (std::is_same_v<Real, float>) {
    const bool padded = n != B * T;
    const float* x = inp;
    float* y = out;
    if (padded) {  // gather the real rows
      float* xs = detail::scratch<float>(detail::kBnInp, n * C);
      for_real_rows(lengths, B, T, [&](Index r, Index i) { std::copy_n(inp + r * C, C, xs + i * C); });
      x = xs;
      y = detail::scratch<float>(detail::kBnOut, n * C);
    }
    if (kernels)
      kernels->forward(View(y, {n, C}), vec_view(running_mean, C), vec_view(running_var, C),
                       ConstView(x, {n, C}), vec_view(weight, C), vec_view(bias, C),
                       bn_options(training, momentum, eps));
    else
      batch_norm_forward(View(y, {n, C}), View(), View(), vec_view(running_mean, C), vec_view(running_var, C),
                         nullptr, ConstView(x, {n, C}), vec_view(weight, C), vec_view(bias, C), {},
                         bn_options(training, momentum, eps));
    if (padded) for_real_rows(lengths, B, T, [&](Index r, Index i) { std::copy_n(y + i * C, C, out + r * C); });
  } else {
    std::vector<double> mean, var;
    if (training) {
      bn_moments(mean, var, inp, lengths, B, T, C);
      if (running_mean)
        for (Index c = 0; c < C; ++c) {
          const std::size_t k = static_cast<std::size_t>(c);
          running_mean[c] = (1 - momentum) * running_mean[c] + momentum * mean[k];
          running_var[c] = (1 - momentum) * running_var[c] +
                           momentum * var[k] * static_cast<double>(n) / static_cast<double>(n - 1);
        }
    } else {
      mean.assign(running_mean, running_mean + C);
      var.assign(running_var, running_var + C);
    }
    for_real_rows(lengths, B, T, [&](Index r, Index) {
      for (Index c = 0; c < C; ++c) {
        const std::size_t k = static_cast<std::size_t>(c);
        out[r * C + c] = (inp[r * C + c] - mean[k]) / std::sqrt(var[k] + eps) * (weight ? weight[c] : 1.0) +
                         (bias ? bias[c] : 0.0);
      }
    });
  }
}

template <typename Real>
void batchnorm_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                        const Real* weight, const Real* running_mean, const Real* running_var,
                        std::span<const Index> lengths, Index B, Index T, Index C, bool training, double eps,
                        const BatchNormKernels* kernels) {
  // dinp (nullable) (B,T,C); dweight, dbias (nullable) (C); dout, inp (B,T,C)
  check_bn(lengths, B, T, C, training, 0.0, eps, running_mean, running_var);
  NL_CHECK((!kernels || std::is_same_v<Real, float>), "batchnorm: kernels replace the float path only");
  const Index n = count_real(lengths, B, T);
  if (n == 0 && !kernels) return;
  if constexpr (std::is_same_v<Real, float>) {
    const bool padded = n != B * T;
    const float* x = inp;
    const float* dy = dout;
    if (padded) {
      float* xs = detail::scratch<float>(detail::kBnInp, n * C);
      float* dys = detail::scratch<float>(detail::kBnOut, n * C);
      for_real_rows(lengths, B, T, [&](Index r, Index i) {
        std::copy_n(inp + r * C, C, xs + i * C);
        std::copy_n(dout + r * C, C, dys + i * C);
      });
      x = xs, dy = dys;
    }
    float* dx = detail::scratch<float>(detail::kBnDx, n * C);
    const ConstView rm = running_mean ? ConstView(running_mean, {C}) : ConstView();
    const ConstView rv = running_var ? ConstView(running_var, {C}) : ConstView();
    if (kernels)
      kernels->backward(View(dx, {n, C}), vec_view(dweight, C), vec_view(dbias, C), ConstView(dy, {n, C}),
                        ConstView(x, {n, C}), vec_view(weight, C), rm, rv, bn_options(training, 0.1, eps),
                        GradMode::kAccumulate);
    else
      batch_norm_backward(View(dx, {n, C}), vec_view(dweight, C), vec_view(dbias, C), ConstView(dy, {n, C}),
                          ConstView(x, {n, C}), vec_view(weight, C), rm, rv, {},
                          bn_options(training, 0.1, eps), GradMode::kAccumulate);
    if (dinp)
      for_real_rows(lengths, B, T, [&](Index r, Index i) { accumulate(dinp + r * C, dx + i * C, C); });
  } else {
    std::vector<double> mean, var;
    if (training) {
      bn_moments(mean, var, inp, lengths, B, T, C);
    } else {
      mean.assign(running_mean, running_mean + C);
      var.assign(running_var, running_var + C);
    }
    std::vector<double> rstd(static_cast<std::size_t>(C)), mg(static_cast<std::size_t>(C), 0.0),
        mgx(static_cast<std::size_t>(C), 0.0);
    for (Index c = 0; c < C; ++c) rstd[static_cast<std::size_t>(c)] = 1.0 / std::sqrt(var[static_cast<std::size_t>(c)] + eps);
    // sums over the real rows: mean(g), mean(g·x̂) (training), dweight, dbias
    for_real_rows(lengths, B, T, [&](Index r, Index) {
      for (Index c = 0; c < C; ++c) {
        const std::size_t k = static_cast<std::size_t>(c);
        const double xh = (inp[r * C + c] - mean[k]) * rstd[k], dy = dout[r * C + c];
        const double g = dy * (weight ? weight[c] : 1.0);
        mg[k] += g;
        mgx[k] += g * xh;
        if (dweight) dweight[c] += dy * xh;
        if (dbias) dbias[c] += dy;
      }
    });
    if (!dinp) return;
    for_real_rows(lengths, B, T, [&](Index r, Index) {
      for (Index c = 0; c < C; ++c) {
        const std::size_t k = static_cast<std::size_t>(c);
        const double xh = (inp[r * C + c] - mean[k]) * rstd[k];
        const double g = dout[r * C + c] * (weight ? weight[c] : 1.0);
        dinp[r * C + c] += training ? rstd[k] * (g - mg[k] / static_cast<double>(n) - xh * mgx[k] / static_cast<double>(n))
                                    : rstd[k] * g;
      }
    });
  }
}

#define NL_INSTANTIATE(Real)                                                                                \
  template void dyt_forward<Real>(Real*, const Real*, const Real*, const Real*, const Real*, Index, Index); \
  template void dyt_backward<Real>(Real*, Real*, Real*, Real*, const Real*, const Real*, const Real*,       \
                                   const Real*, Index, Index);                                              \
  template void batchnorm_forward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*,         \
                                        std::span<const Index>, Index, Index, Index, bool, double, double,  \
                                        const BatchNormKernels*);                                           \
  template void batchnorm_backward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*,        \
                                         const Real*, const Real*, std::span<const Index>, Index, Index,    \
                                         Index, bool, double, const BatchNormKernels*);                     \
  template void layernorm_forward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, Index,  \
                                        Index, double);                                                     \
  template void layernorm_backward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, Index, \
                                         Index, double);                                                    \
  template void rmsnorm_forward<Real>(Real*, Real*, const Real*, const Real*, Index, Index, double);        \
  template void rmsnorm_backward<Real>(Real*, Real*, const Real*, const Real*, const Real*, Index, Index,   \
                                       double);
NL_INSTANTIATE(float)
NL_INSTANTIATE(double)
#undef NL_INSTANTIATE

}  // namespace normlab::nn
