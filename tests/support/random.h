// Seeded random tensors for tests: offset + scale·N(0, 1).
#pragma once

#include <normlab/tensor.h>

#include <random>

namespace normlab::testing {

inline Tensor random_tensor(Dims shape, std::mt19937_64& rng, double scale, double offset) {
  std::normal_distribution<double> nd(0.0, 1.0);
  Tensor t(shape);
  for (Index i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(offset + scale * nd(rng));
  return t;
}

inline BasicTensor<double> random_dtensor(Dims shape, std::mt19937_64& rng, double scale, double offset) {
  std::normal_distribution<double> nd(0.0, 1.0);
  BasicTensor<double> t(shape);
  for (Index i = 0; i < t.numel(); ++i) t[i] = offset + scale * nd(rng);
  return t;
}

}  // namespace normlab::testing
