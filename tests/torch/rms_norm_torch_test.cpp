// Differential tests of normlab's RMSNorm against LibTorch. LibTorch 1.13 has no RMSNorm op, so the
// oracle is RMSNorm as users compose it: y = x · rsqrt(mean(x², axes) + eps) · γ, with autograd for
// the gradients (fp32, CPU). Random shapes (rank 1–5, sizes incl. 1, 7, 33), strided views (offsets,
// steps, permutations), any subset of axes, with and without γ, eps 0, 1e-6 and PyTorch's default.
//
// Checks per quantity, through testing::all_close / Tol:
//   normlab vs float64 reference: tight budgets (normlab computes in double and rounds once);
//   LibTorch vs float64 reference and normlab vs LibTorch: Tol{16, C}, where C is the magnitude of
//   the terms LibTorch rounds in fp32: for y, max|x̂·γ|; for dx, the two terms that cancel,
//   rstd·max|g|·(1 + max|x̂|²) with g = dy·γ; for dγ, the sum of |dy·x̂| over the groups.
#include <ATen/ATen.h>
#include <normlab/norm.h>
#include <normlab/reference.h>
#include <torch/torch.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <random>

#include "support/random.h"
#include "support/tolerance.h"

namespace normlab {
namespace {

using testing::all_close;
using testing::max_abs;
using testing::Tol;

at::Tensor torch_copy(ConstView v) {
  Tensor c = Tensor::copy_of(v);
  return at::from_blob(c.data(), std::vector<int64_t>(c.shape().begin(), c.shape().end()), at::kFloat).clone();
}

// A contiguous double tensor holding a torch result, for all_close against normlab.
ref::DTensor to_dtensor(const at::Tensor& t) {
  at::Tensor c = t.to(at::kDouble).contiguous();
  ref::DTensor d(Dims(std::vector<Index>(c.sizes().begin(), c.sizes().end())));
  std::copy(c.data_ptr<double>(), c.data_ptr<double>() + c.numel(), d.data());
  return d;
}

TEST(TorchRmsNorm, ComposedRmsNormForwardAndAutogradOnRandomLayouts) {
  at::set_num_threads(1);
  std::mt19937_64 rng(31);
  static const Index kSizes[] = {1, 2, 3, 7, 16, 33};
  int cases = 0;
  for (int i = 0; i < 300; ++i) {
    const int rank = 1 + static_cast<int>(rng() % 5);
    Dims shape, pshape;
    for (int d = 0; d < rank; ++d) {
      Index s = kSizes[rng() % 6];
      if (shape.product() * s > 20000) s = 1;
      shape.push_back(s);
      pshape.push_back(s + static_cast<Index>(rng() % 2));
    }
    Tensor parent = testing::random_tensor(pshape, rng, 1.5, 0.25);
    ConstView x = parent.cview();
    for (int d = 0; d < rank; ++d)
      if (pshape[d] != shape[d]) x = x.slice(d, 1, pshape[d]);
    if (rank >= 2 && rng() % 2) x = x.transpose(0, rank - 1);
    Axes axes;
    for (int d = 0; d < rank; ++d)
      if (rng() % 2) axes.push_back(d);
    if (axes.empty()) axes.push_back(rank - 1);
    const bool use_w = rng() % 2;
    const double eps = i % 3 == 0 ? 0.0 : i % 3 == 1 ? kRmsNormEps : kTorchRmsNormEps;
    const Dims ns = normalized_shape(x.shape(), axes);
    Tensor w = testing::random_tensor(ns, rng, 0.5, 1.0);
    Tensor dy = testing::random_tensor(x.shape(), rng, 1.0, 0.0);
    SCOPED_TRACE(fmt::format("case {}: shape {} strides {} axes [{}] γ={} eps={}", i, x.shape().str(),
                             x.strides().str(), fmt::join(axes, ","), use_w, eps));
    ConstView wv = use_w ? w.cview() : ConstView{};

    // normlab
    Tensor y(x.shape()), dx(x.shape()), dw(ns);
    rms_norm_forward(y.view(), {}, x, wv, axes, eps);
    rms_norm_backward(dx.view(), dw.view(), dy.cview(), x, wv, axes, eps);
    // float64 reference
    ref::LayerNormOut r = ref::rms_norm_forward(x, wv, axes, eps);
    ref::LayerNormGrads rg = ref::rms_norm_backward(dy.cview(), x, wv, axes, eps);
    // LibTorch, composed
    at::Tensor tx = torch_copy(x).requires_grad_(true);
    std::vector<int64_t> dims(axes.begin(), axes.end());
    at::Tensor tw = torch_copy(w.cview()).requires_grad_(true);
    // γ broadcast: view it with size 1 on the kept axes.
    std::vector<int64_t> wshape;
    for (int d = 0, j = 0; d < rank; ++d)
      wshape.push_back(std::find(axes.begin(), axes.end(), d) != axes.end() ? ns[j++] : 1);
    at::Tensor ty = tx * at::rsqrt(tx.pow(2).mean(dims, /*keepdim=*/true) + eps);
    if (use_w) ty = ty * tw.reshape(wshape);
    ty.backward(torch_copy(dy.cview()));

    // Magnitudes of the terms LibTorch rounds in fp32.
    double max_rstd = 0;
    for (Index k = 0; k < r.rstd.numel(); ++k) max_rstd = std::max(max_rstd, r.rstd[k]);
    if (!std::isfinite(max_rstd) || max_rstd > 1e6) continue;  // eps 0 on an all-zero group
    const double max_w = use_w ? max_abs(ref::to_double(w.cview())) : 1.0;
    const double max_xhat = max_abs(ref::rms_norm_forward(x, {}, axes, eps).y);
    const double max_dy = max_abs(ref::to_double(dy.cview()));
    const double max_g = max_dy * max_w;
    ++cases;
    const double cy = std::max(max_abs(r.y), max_xhat * max_w);
    const double cdx = std::max(max_abs(rg.dx), max_rstd * max_g * (1 + max_xhat * max_xhat));
    const double cdw =
        std::max(max_abs(rg.dweight), max_dy * max_xhat * static_cast<double>(x.numel() / ns.product()));

    ASSERT_TRUE(all_close(y.cview(), r.y, Tol{4, 1}, "normlab y"));
    // dx in fp32 from O(rstd·|dy·γ|) terms that cancel (docs/numerics.md): that is its scale.
    ASSERT_TRUE(all_close(dx.cview(), rg.dx, Tol{16, std::max(max_abs(rg.dx), max_rstd * max_g)}, "normlab dx"));
    // dγ = Σ_groups dy·x̂ with x̂ rounded in fp32: scale Σ|dy·x̂|, the reference dγ of |dy| and |x|.
    Tensor ady = Tensor::copy_of(dy.cview()), ax = Tensor::copy_of(x);
    for (Index k = 0; k < ady.numel(); ++k) ady[k] = std::fabs(ady[k]);
    for (Index k = 0; k < ax.numel(); ++k) ax[k] = std::fabs(ax[k]);
    const double dw_terms = max_abs(ref::rms_norm_backward(ady.cview(), ax.cview(), {}, axes, eps).dweight);
    ASSERT_TRUE(all_close(dw.cview(), rg.dweight, Tol{4, std::max(max_abs(rg.dweight), dw_terms)}, "normlab dweight"));
    const ref::DTensor ty_d = to_dtensor(ty.detach()), tdx = to_dtensor(tx.grad());
    Tensor ty_f = Tensor::copy_of(TensorView<const double>(ty_d.data(), ty_d.shape()));
    Tensor tdx_f = Tensor::copy_of(TensorView<const double>(tdx.data(), tdx.shape()));
    ASSERT_TRUE(all_close(ty_f.cview(), r.y, Tol{16, cy}, "LibTorch y vs float64"));
    ASSERT_TRUE(all_close(y.cview(), ty_d, Tol{16, cy}, "normlab vs LibTorch y"));
    ASSERT_TRUE(all_close(tdx_f.cview(), rg.dx, Tol{16, cdx}, "LibTorch dx vs float64"));
    ASSERT_TRUE(all_close(dx.cview(), tdx, Tol{16, cdx}, "normlab vs LibTorch dx"));
    if (use_w) {
      const ref::DTensor tdw = to_dtensor(tw.grad());
      ASSERT_TRUE(all_close(dw.cview(), tdw, Tol{16, cdw}, "normlab vs LibTorch dweight"));
    }
  }
  EXPECT_GE(cases, 250) << "too few usable random cases";
}

}  // namespace
}  // namespace normlab
