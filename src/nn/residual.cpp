// Residual add and its backward. See include/normlab/nn/layers.h.
#include <normlab/nn/layers.h>

#include "nn/checks.h"
#include "nn/elementwise.h"

namespace normlab::nn {

template <typename Real>
void residual_forward(Real* out, const Real* inp1, const Real* inp2, Index N) {
  // out, inp1, inp2 are (N)
  detail::check_size("residual", "N", N);
  detail::for_chunks(N, [&](Index i0, Index i1) {
    // Scalar math: out[i] = inp1[i] + inp2[i]
    for (Index i = i0; i < i1; ++i) out[i] = inp1[i] + inp2[i];
  });
}

template <typename Real>
void residual_backward(Real* dinp1, Real* dinp2, const Real* dout, Index N) {
  // dinp1, dinp2 (each nullable), dout are (N); both accumulate (+=)
  detail::check_size("residual", "N", N);
  detail::for_chunks(N, [&](Index i0, Index i1) {
    // Scalar math: dinp1[i] += dout[i]; dinp2[i] += dout[i]
    if (dinp1)
      for (Index i = i0; i < i1; ++i) dinp1[i] += dout[i];
    if (dinp2)
      for (Index i = i0; i < i1; ++i) dinp2[i] += dout[i];
  });
}

template void residual_forward<float>(float*, const float*, const float*, Index);
template void residual_forward<double>(double*, const double*, const double*, Index);
template void residual_backward<float>(float*, float*, const float*, Index);
template void residual_backward<double>(double*, double*, const double*, Index);

}  // namespace normlab::nn
