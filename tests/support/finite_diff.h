// Float64 central differences for the gradient tests.
#pragma once

namespace normlab::testing {

// (L(v + h) − L(v − h)) / 2h for one variable v of the loss; v is restored afterwards.
template <typename Loss>
double central_difference(double& v, Loss&& loss, double h) {
  const double keep = v;
  v = keep + h;
  const double lp = loss();
  v = keep - h;
  const double lm = loss();
  v = keep;
  return (lp - lm) / (2 * h);
}

}  // namespace normlab::testing
