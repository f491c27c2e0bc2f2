// A harness for the nn layers' tests: one generic "layer" callable checked three ways.
//
// A layer under test is a generic lambda
//     layer(const Vecs<R>& in, const std::vector<R>* dy, Vecs<R>* grads) -> std::vector<R> y
// templated on the scalar R through its arguments. It runs the forward on the differentiable inputs
// `in` (one flat vector per tensor; integer inputs such as tokens are captured) and returns y; when
// dy is given it also runs the backward with dout = dy, ACCUMULATING into grads (the layers' += rule).
//
// check_layer():
//   1. float64 central finite differences of L = Σ r⊙y (r random) against the double backward:
//      |analytic − fd| ≤ 1e-6 · max(|fd|, max|analytic of that tensor|), h = 1e-6.
//      (Gradients that are identically 0 in exact arithmetic: see LayerCheck::zero_grads.)
//   2. accumulation: a second backward into the same buffers doubles every gradient (+= convention).
//   3. the float instantiation against the double one on the same (fp32-representable) inputs:
//      all_close with Tol{k, max|ref|} for y and every gradient (k in fp32 epsilons, per layer).
#pragma once

#include <gtest/gtest.h>
#include <normlab/tensor.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "support/tolerance.h"

namespace normlab::testing {

template <typename R>
using Vecs = std::vector<std::vector<R>>;

// n values offset + scale·N(0,1), rounded to fp32 so that the float and double runs see the same inputs.
inline std::vector<double> randn(std::size_t n, std::mt19937_64& rng, double scale = 1.0, double offset = 0.0) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = static_cast<float>(offset + scale * nd(rng));
  return v;
}

template <typename To, typename From>
std::vector<To> cast_vec(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}
template <typename To, typename From>
Vecs<To> cast_vecs(const Vecs<From>& v) {
  Vecs<To> out;
  for (const auto& x : v) out.push_back(cast_vec<To>(x));
  return out;
}
template <typename R>
Vecs<R> zeros_like(const Vecs<double>& v) {
  Vecs<R> out;
  for (const auto& x : v) out.emplace_back(x.size(), R(0));
  return out;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// float result vs double reference, elementwise: |f − d| ≤ k·ε₃₂·max(|d|, max|d|).
// scale_floor: a magnitude below which absolute error is what matters (0: max|d| alone).
inline ::testing::AssertionResult float_matches(const std::vector<float>& f, const std::vector<double>& d, double k,
                                                const std::string& what, double scale_floor = 0.0) {
  if (f.size() != d.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  if (f.empty()) return ::testing::AssertionSuccess();
  BasicTensor<double> ref({static_cast<Index>(d.size())});
  std::copy(d.begin(), d.end(), ref.data());
  const double scale = std::max({max_abs(d), scale_floor, 1e-30});
  return all_close(ConstView(f.data(), {static_cast<Index>(f.size())}), ref, Tol{k, scale}, what);
}

struct LayerCheck {
  std::vector<std::string> names;  // one per input, for messages
  double k_out = 16;               // float vs double budget for y
  double k_grad = 32;              // ... and for the gradients
  std::size_t max_fd = 200;        // finite-difference probes per input (evenly spaced)
  bool check_fd = true;
  // Inputs whose gradient is identically 0 in exact arithmetic (e.g. the key bias of attention: softmax
  // is invariant to adding q·bk to every score of a row). Their computed gradient is pure rounding, so
  // it is measured against the largest gradient of the layer instead of against itself.
  std::vector<std::size_t> zero_grads = {};
};

template <typename Layer>
void check_layer(Layer&& layer, const Vecs<double>& inputs, const LayerCheck& opt, std::mt19937_64& rng) {
  // 1. finite differences on the double instantiation
  Vecs<double> in = inputs;
  const std::vector<double> y = layer(in, static_cast<const std::vector<double>*>(nullptr),
                                      static_cast<Vecs<double>*>(nullptr));
  const std::vector<double> r = randn(y.size(), rng);
  Vecs<double> g = zeros_like<double>(inputs);
  layer(in, &r, &g);
  auto loss = [&]() {
    const std::vector<double> yy = layer(in, static_cast<const std::vector<double>*>(nullptr),
                                         static_cast<Vecs<double>*>(nullptr));
    double s = 0;
    for (std::size_t i = 0; i < yy.size(); ++i) s += r[i] * yy[i];
    return s;
  };
  const double h = 1e-6;
  double gmax = 0;  // the largest gradient of any input
  for (const auto& gt : g) gmax = std::max(gmax, max_abs(gt));
  auto is_zero_grad = [&](std::size_t t) {
    return std::find(opt.zero_grads.begin(), opt.zero_grads.end(), t) != opt.zero_grads.end();
  };
  for (std::size_t t = 0; t < in.size() && opt.check_fd; ++t) {
    const double gscale = is_zero_grad(t) ? gmax : max_abs(g[t]);
    const std::size_t n = in[t].size(), step = std::max<std::size_t>(1, n / opt.max_fd);
    int bad = 0;
    for (std::size_t i = 0; i < n; i += step) {
      const double keep = in[t][i];
      in[t][i] = keep + h;
      const double lp = loss();
      in[t][i] = keep - h;
      const double lm = loss();
      in[t][i] = keep;
      const double fd = (lp - lm) / (2 * h);
      const double tol = 1e-6 * std::max(std::fabs(fd), gscale);
      if (std::fabs(g[t][i] - fd) > tol && bad++ < 3)
        ADD_FAILURE() << "d" << opt.names[t] << "[" << i << "]: analytic " << g[t][i] << " vs finite difference "
                      << fd << " (tolerance " << tol << ")";
    }
  }
  // 2. a second backward accumulates: every gradient doubles (exactly, up to one rounding)
  Vecs<double> g2 = g;
  layer(in, &r, &g2);
  for (std::size_t t = 0; t < g.size(); ++t)
    for (std::size_t i = 0; i < g[t].size(); ++i)
      ASSERT_NEAR(g2[t][i], 2 * g[t][i], 1e-12 * std::max(1.0, std::fabs(g[t][i])))
          << "d" << opt.names[t] << "[" << i << "] does not accumulate (+=)";
  // 3. float vs double
  Vecs<float> inf = cast_vecs<float>(inputs);
  const std::vector<float> rf = cast_vec<float>(r);
  const std::vector<float> yf = layer(inf, static_cast<const std::vector<float>*>(nullptr),
                                      static_cast<Vecs<float>*>(nullptr));
  EXPECT_TRUE(float_matches(yf, y, opt.k_out, "y"));
  Vecs<float> gf = zeros_like<float>(inputs);
  layer(inf, &rf, &gf);
  for (std::size_t t = 0; t < g.size(); ++t)
    EXPECT_TRUE(float_matches(gf[t], g[t], opt.k_grad, "d" + opt.names[t], is_zero_grad(t) ? gmax : 0.0));
}

}  // namespace normlab::testing
