// Moving tensors between normlab and LibTorch in the differential tests (tests/torch/), and the one
// three-way agreement check the norm tests share.
#pragma once

#include <normlab/reference.h>
#include <normlab/tensor.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "support/tolerance.h"

namespace normlab::testing {

inline std::vector<int64_t> vec_of(const Dims& d) { return {d.begin(), d.end()}; }

// A normlab view of a (float) torch tensor's memory, strides included; the tensor must outlive the view.
inline ConstView view_of(const at::Tensor& t) {
  return ConstView(t.data_ptr<float>(), Dims(std::vector<Index>(t.sizes().begin(), t.sizes().end())),
                   Dims(std::vector<Index>(t.strides().begin(), t.strides().end())));
}

// A contiguous torch copy of any normlab view.
inline at::Tensor torch_copy(ConstView v) {
  Tensor c = Tensor::copy_of(v);
  return at::from_blob(c.data(), vec_of(c.shape()), at::kFloat).clone();
}

// normlab and LibTorch both within budget of the float64 reference, and of each other. normlab's scale is
// max(max|ref|, floor) (floor: the magnitude of the terms that cancel, for dx). LibTorch forms its results
// in fp32 from intermediates up to (1 + κ) times larger, κ = max|x|·max rstd (e.g.
// y = x·rstd·γ + (β − mean·rstd·γ)), so its scale is normlab's times (1 + κ), with budget k_torch.
inline ::testing::AssertionResult agree(ConstView ours, const at::Tensor& theirs, const ref::DTensor& r, double k_ours,
                                        const std::string& what, double kappa, double floor, double k_torch) {
  const double scale = std::max({max_abs(r), floor, 1e-6}), torch_scale = scale * (1 + kappa);
  auto a = all_close(ours, r, Tol{k_ours, scale}, what + " normlab vs float64");
  if (!a) return a;
  const at::Tensor t = theirs.contiguous();
  auto b = all_close(view_of(t), r, Tol{k_torch, torch_scale}, what + " LibTorch vs float64");
  if (!b) return b;
  return all_close(ours, ref::to_double(view_of(t)), Tol{k_torch, torch_scale}, what + " normlab vs LibTorch");
}

}  // namespace normlab::testing
