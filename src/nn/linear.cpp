// Linear layer y = x·Wᵀ + b (PyTorch weight layout (OC, C)). See include/normlab/nn/layers.h.
#include <normlab/nn/layers.h>

#include <algorithm>

#include "nn/checks.h"
#include "nn/gemm.h"
#include "parallel/parallel.h"

namespace normlab::nn {

namespace {
constexpr Index kRowChunk = 128;  // rows of the bias broadcast per parallel chunk
constexpr Index kColChunk = 64;   // columns of the bias gradient per parallel chunk
}  // namespace

template <typename Real>
void linear_forward(Real* out, const Real* inp, const Real* weight, const Real* bias, Index N, Index C,
                    Index OC) {
  // out is (N,OC), inp is (N,C), weight is (OC,C), bias is (OC) or null
  detail::check_size("linear", "N", N);
  detail::check_size("linear", "C", C);
  detail::check_size("linear", "OC", OC);
  // out = bias in every row, then out += inp (N,C) · weightᵀ (C,OC) (beta = 1), as PyTorch's addmm;
  // without a bias the product is written (beta = 0).
  if (bias)
    parallel::parallel_for((N + kRowChunk - 1) / kRowChunk, [&](Index k) {
      for (Index n = k * kRowChunk; n < std::min(N, (k + 1) * kRowChunk); ++n) std::copy(bias, bias + OC, out + n * OC);
    });
  gemm<Real>(false, true, N, OC, C, Real(1), inp, C, weight, C, bias ? Real(1) : Real(0), out, OC);
}

template <typename Real>
void linear_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                     const Real* weight, Index N, Index C, Index OC) {
  // dinp is (N,C) or null, dweight is (OC,C), dbias is (OC) or null; dout is (N,OC)
  detail::check_size("linear", "N", N);
  detail::check_size("linear", "C", C);
  detail::check_size("linear", "OC", OC);
  // dinp += dout (N,OC) · weight (OC,C)
  if (dinp) gemm<Real>(false, false, N, C, OC, Real(1), dout, OC, weight, C, Real(1), dinp, C);
  // dweight += doutᵀ (OC,N) · inp (N,C)
  gemm<Real>(true, false, OC, C, N, Real(1), dout, OC, inp, C, Real(1), dweight, C);
  // dbias += Σ_n dout[n,:], summed over rows in order; columns in parallel chunks (each column's sum
  // is done by one chunk, in row order: the same bits for any thread count)
  if (dbias)
    parallel::parallel_for((OC + kColChunk - 1) / kColChunk, [&](Index k) {
      const Index o0 = k * kColChunk, o1 = std::min(OC, o0 + kColChunk);
      for (Index n = 0; n < N; ++n)
        // Scalar math: dbias[o] += dout[n, o]
        for (Index o = o0; o < o1; ++o) dbias[o] += dout[n * OC + o];
    });
}

#define NL_INSTANTIATE(Real)                                                                                \
  template void linear_forward<Real>(Real*, const Real*, const Real*, const Real*, Index, Index, Index);     \
  template void linear_backward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, Index, Index, \
                                      Index);
NL_INSTANTIATE(float)
NL_INSTANTIATE(double)
#undef NL_INSTANTIATE

}  // namespace normlab::nn
