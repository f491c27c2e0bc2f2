// Seeded random tensors for tests (offset + scale·N(0, 1)), and a tensor's values copied into a strided view.
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

// dst (any strides) ← src's values, both of the same shape, element by element in row-major order.
inline void copy_into(View dst, const Tensor& src) {
  Index i = 0;
  for_each_offset(dst.shape(), dst.strides(), [&](Index off) { dst.data()[off] = src.data()[i++]; });
}

}  // namespace normlab::testing
