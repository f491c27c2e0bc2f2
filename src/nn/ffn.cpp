// Activations (ReLU, GELU exact and tanh) and the FFN Linear(C,F) → act → Linear(F,C).
// See include/normlab/nn/layers.h.
#include <normlab/nn/layers.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "nn/checks.h"
#include "nn/gemm.h"
#include "nn/scratch.h"
#include "parallel/parallel.h"

namespace normlab::nn {

namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440;      // 1/√2
constexpr double kInvSqrt2Pi = 0.39894228040143267794;    // 1/√(2π)
constexpr double kSqrt2OverPi = 0.79788456080286535588;   // √(2/π)
constexpr double kGeluTanhCubic = 0.044715;

// Scalar math, evaluated in Real (float for the engine, double for the reference).
template <typename Real>
[[gnu::always_inline]] inline Real act_value(Real x, Activation act) {
  switch (act) {
    case Activation::kRelu:
      return x > Real(0) ? x : Real(0);
    case Activation::kGelu:  // 0.5·x·(1 + erf(x/√2))
      return Real(0.5) * x * (Real(1) + std::erf(x * Real(kInvSqrt2)));
    case Activation::kGeluTanh: {  // 0.5·x·(1 + tanh(u)), u = √(2/π)(x + 0.044715x³)
      const Real u = Real(kSqrt2OverPi) * (x + Real(kGeluTanhCubic) * x * x * x);
      return Real(0.5) * x * (Real(1) + std::tanh(u));
    }
  }
  return x;
}

template <typename Real>
[[gnu::always_inline]] inline Real act_derivative(Real x, Activation act) {
  switch (act) {
    case Activation::kRelu:
      return x > Real(0) ? Real(1) : Real(0);
    case Activation::kGelu:  // Φ(x) + x·φ(x)
      return Real(0.5) * (Real(1) + std::erf(x * Real(kInvSqrt2))) +
             x * Real(kInvSqrt2Pi) * std::exp(Real(-0.5) * x * x);
    case Activation::kGeluTanh: {  // 0.5(1 + tanh u) + 0.5·x·(1 − tanh²u)·u'
      const Real u = Real(kSqrt2OverPi) * (x + Real(kGeluTanhCubic) * x * x * x);
      const Real th = std::tanh(u);
      const Real du = Real(kSqrt2OverPi) * (Real(1) + Real(3 * kGeluTanhCubic) * x * x);
      return Real(0.5) * (Real(1) + th) + Real(0.5) * x * (Real(1) - th * th) * du;
    }
  }
  return Real(1);
}

constexpr Index kChunk = 4096;  // elementwise work per parallel chunk
Index chunks(Index n) { return (n + kChunk - 1) / kChunk; }

}  // namespace

// Calls body(tag) with tag an std::integral_constant<Activation, act>: the elementwise loops below are
// compiled once per activation, with no switch inside them.
template <typename Body>
void with_activation(Activation act, Body&& body) {
  switch (act) {
    case Activation::kRelu: return body(std::integral_constant<Activation, Activation::kRelu>{});
    case Activation::kGelu: return body(std::integral_constant<Activation, Activation::kGelu>{});
    case Activation::kGeluTanh: return body(std::integral_constant<Activation, Activation::kGeluTanh>{});
  }
}

template <typename Real>
void activation_forward(Real* out, const Real* inp, Index N, Activation act) {
  // out, inp are (N)
  detail::check_size("activation", "N", N);
  with_activation(act, [&](auto a) {
    parallel::parallel_for(chunks(N), [&](Index c) {
      const Index end = std::min(N, (c + 1) * kChunk);
      // Scalar math: out[i] = act(inp[i])
      for (Index i = c * kChunk; i < end; ++i) out[i] = act_value(inp[i], a.value);
    });
  });
}

template <typename Real>
void activation_backward(Real* dinp, const Real* dout, const Real* inp, Index N, Activation act) {
  // dinp, dout, inp are (N)
  detail::check_size("activation", "N", N);
  with_activation(act, [&](auto a) {
    parallel::parallel_for(chunks(N), [&](Index c) {
      const Index end = std::min(N, (c + 1) * kChunk);
      // Scalar math: dinp[i] += act'(inp[i])·dout[i]
      for (Index i = c * kChunk; i < end; ++i) dinp[i] += act_derivative(inp[i], a.value) * dout[i];
    });
  });
}

template <typename Real>
void ffn_forward(Real* out, Real* h, Real* a, const Real* inp, const Real* w1, const Real* b1, const Real* w2,
                 const Real* b2, Index N, Index C, Index F, Activation act) {
  // out is (N,C), h and a are (N,F), inp is (N,C), w1 is (F,C), w2 is (C,F)
  detail::check_size("ffn", "F", F);
  linear_forward(h, inp, w1, b1, N, C, F);
  activation_forward(a, h, N * F, act);
  linear_forward(out, a, w2, b2, N, F, C);
}

template <typename Real>
void ffn_backward(Real* dinp, Real* dw1, Real* db1, Real* dw2, Real* db2, const Real* dout, const Real* inp,
                  const Real* h, const Real* a, const Real* w1, const Real* w2, Index N, Index C, Index F,
                  Activation act) {
  // The literal reverse of ffn_forward. One (N,F) scratch holds da, then (in place) dh.
  detail::check_size("ffn", "N", N);
  detail::check_size("ffn", "C", C);
  detail::check_size("ffn", "F", F);
  Real* d = detail::scratch<Real>(detail::kFfnDhidden, N * F);
  // out = a·w2ᵀ + b2:  da = dout·w2 (=), dw2 += doutᵀ·a, db2 += Σ dout
  gemm<Real>(false, false, N, F, C, Real(1), dout, C, w2, F, Real(0), d, F);
  linear_backward(static_cast<Real*>(nullptr), dw2, db2, dout, a, w2, N, F, C);
  // a = act(h):  dh = act'(h)·da (=, in place)
  with_activation(act, [&](auto ac) {
    parallel::parallel_for(chunks(N * F), [&](Index c) {
      const Index end = std::min(N * F, (c + 1) * kChunk);
      // Scalar math: d[i] = act'(h[i])·d[i]
      for (Index i = c * kChunk; i < end; ++i) d[i] = act_derivative(h[i], ac.value) * d[i];
    });
  });
  // h = inp·w1ᵀ + b1
  linear_backward(dinp, dw1, db1, d, inp, w1, N, C, F);
}

#define NL_INSTANTIATE(Real)                                                                                  \
  template void activation_forward<Real>(Real*, const Real*, Index, Activation);                              \
  template void activation_backward<Real>(Real*, const Real*, const Real*, Index, Activation);                \
  template void ffn_forward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, const Real*,    \
                                  const Real*, Index, Index, Index, Activation);                              \
  template void ffn_backward<Real>(Real*, Real*, Real*, Real*, Real*, const Real*, const Real*, const Real*, \
                                   const Real*, const Real*, const Real*, Index, Index, Index, Activation);
NL_INSTANTIATE(float)
NL_INSTANTIATE(double)
#undef NL_INSTANTIATE

}  // namespace normlab::nn
