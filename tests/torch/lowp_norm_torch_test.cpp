// LibTorch as a peer for bf16 storage and for the fused residual add + norm (Debian's libtorch 1.13, CPU).
//
// bf16: at::layer_norm on a bf16 tensor with bf16 γ/β. γ and β are drawn as bf16 values, so normlab's
// fp32 γ/β hold exactly the same numbers. LibTorch computes each group in fp32 and rounds y once to bf16,
// as normlab does from its double moments; the two differ before the rounding by LibTorch's fp32 error
// (≤ kTorchK·ε·C, C the magnitude of its intermediates, see layer_norm_torch_test.cpp), so after it they
// are within one bf16 ulp plus that error. Where LibTorch 1.13 has no CPU kernel (fp16), nothing is
// compared and the test says so.
// Fused: fp32 autograd of s = x + residual, y = layer_norm(s), L = Σ dy·y + Σ ds·s against
// add_layer_norm_forward/backward, within the fp32 budgets of layer_norm_torch_test.cpp.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <normlab/norm.h>
#include <normlab/reference.h>
#include <torch/torch.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <random>

#include "norm/lowp_support.h"
#include "support/random.h"
#include "support/tolerance.h"

namespace normlab {
namespace {

using testing::all_close;
using testing::max_abs;
using testing::Tol;

constexpr double kTorchK = 16;

at::Tensor torch_float(ConstView v) {
  Tensor c = Tensor::copy_of(v);
  return at::from_blob(c.data(), std::vector<int64_t>(c.shape().begin(), c.shape().end()), at::kFloat).clone();
}
Tensor from_torch(const at::Tensor& t) {
  at::Tensor c = t.to(at::kFloat).contiguous();
  Tensor out(Dims(std::vector<Index>(c.sizes().begin(), c.sizes().end())));
  std::copy(c.data_ptr<float>(), c.data_ptr<float>() + c.numel(), out.data());
  return out;
}

// LibTorch 1.13's CPU bf16 layer_norm rounds intermediates to bf16 (measured below: its y is up to ~14 bf16
// ulps of y away from the float64 value at |y| ≈ 0.01, i.e. ~0.1 u·C with C ≈ 5). Its error budget is
// therefore in units of bf16's unit roundoff u = 2^-8 relative to the magnitude C of its intermediates,
// plus one ulp of the result: |torch − ref| ≤ ulp_bf16(ref) + kBf16K·u·C. The worst measured over these
// cases is printed; kBf16K = 2 leaves a margin over it.
constexpr double kBf16U = 0x1p-8;
constexpr double kBf16K = 2;

// Worst |a − ref| in units of the bound ulps·ulp_bf16(ref) + k·u·C; NaN if any a is NaN.
double worst_ratio(const Tensor& a, const ref::DTensor& ref, double ulps, double k, double C) {
  double worst = 0;
  for (Index i = 0; i < a.numel(); ++i) {
    const double bound = ulps * testing::storage_ulp<bfloat16>(std::fabs(ref[i])) + k * kBf16U * C;
    const double r = std::fabs(double{a[i]} - ref[i]) / bound;
    worst = std::isnan(r) ? r : std::max(worst, r);
  }
  return worst;
}
double max_err(const Tensor& a, const ref::DTensor& ref) {
  double m = 0;
  for (Index i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(double{a[i]} - ref[i]));
  return m;
}

TEST(TorchLowPrecision, Bf16LayerNormForwardAndBackwardAgreeWithLibTorch) {
  at::set_num_threads(1);
  std::mt19937_64 rng(41);
  double worst_torch = 0;
  for (const Dims& shape : {Dims{7, 33}, Dims{3, 1025}, Dims{64, 768}, Dims{2, 3, 80}, Dims{5, 1}}) {
    SCOPED_TRACE("shape " + shape.str());
    const Index d = shape[shape.size() - 1];
    const BF16Tensor x = testing::convert_copy<bfloat16>(testing::random_tensor(shape, rng, 1.5, 0.5).cview());
    const BF16Tensor dy = testing::convert_copy<bfloat16>(testing::random_tensor(shape, rng, 1.0, 0.0).cview());
    const Tensor w = Tensor::copy_of(testing::convert_copy<bfloat16>(testing::random_tensor(Dims{d}, rng, 0.5, 1.0).cview()).cview());
    const Tensor b = Tensor::copy_of(testing::convert_copy<bfloat16>(testing::random_tensor(Dims{d}, rng, 0.5, 0.0).cview()).cview());
    const Tensor xf = Tensor::copy_of(x.cview()), dyf = Tensor::copy_of(dy.cview());
    // normlab, bf16 storage
    BF16Tensor y(shape), dx(shape);
    Tensor dw(Dims{d}), db(Dims{d});
    const Axes axes{static_cast<int>(shape.size()) - 1};
    layer_norm_forward(y.view(), {}, {}, x.cview(), w.cview(), b.cview(), axes);
    layer_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), axes);
    // LibTorch, bf16 tensors and parameters
    at::Tensor tx = torch_float(xf.cview()).to(at::kBFloat16).requires_grad_(true);
    at::Tensor tw = torch_float(w.cview()).to(at::kBFloat16).requires_grad_(true);
    at::Tensor tb = torch_float(b.cview()).to(at::kBFloat16).requires_grad_(true);
    at::Tensor ty = at::layer_norm(tx, {d}, tw, tb, 1e-5);
    ASSERT_EQ(ty.scalar_type(), at::kBFloat16);
    ty.backward(torch_float(dyf.cview()).to(at::kBFloat16));
    // float64 on the same (widened) numbers
    const ref::LayerNormOut r = ref::layer_norm_forward(xf.cview(), w.cview(), b.cview(), axes, 1e-5);
    const ref::LayerNormGrads rg = ref::layer_norm_backward(dyf.cview(), xf.cview(), w.cview(), axes, 1e-5);
    const ref::LayerNormOut xh = ref::layer_norm_forward(xf.cview(), {}, {}, axes, 1e-5);
    // Magnitudes of LibTorch's intermediates: y = (x·rstd − mean·rstd)·γ + β ~ κ·|γ| + |β| with
    // κ = (max|x| + |mean|)·rstd (layer_norm_torch_test.cpp; large for one-element groups, rstd = 1/√eps);
    // dx ~ rstd·|g|·(1 + x̂²); dγ, dβ: sums over the groups.
    const double max_xhat = max_abs(xh.y), max_w = max_abs(w), max_rstd = max_abs(r.rstd), max_dy = max_abs(dyf);
    const double groups = static_cast<double>(x.numel() / d);
    const double kappa = (max_abs(xf) + max_abs(r.mean)) * max_rstd;
    const double cy = std::max(max_xhat, kappa) * max_w + max_abs(b), cdx = max_rstd * max_dy * max_w * (1 + max_xhat * max_xhat);
    const double cdw = groups * max_dy * max_xhat, cdb = groups * max_dy;
    const Tensor ny = Tensor::copy_of(y.cview()), ndx = Tensor::copy_of(dx.cview());
    const Tensor ty_f = from_torch(ty), tdx = from_torch(tx.grad()), tdw = from_torch(tw.grad()), tdb = from_torch(tb.grad());
    // LibTorch within its bf16 budget; normlab within half an ulp + fp32 noise (0 extra intermediates).
    const double ratios[] = {worst_ratio(ty_f, r.y, 1, kBf16K, cy), worst_ratio(tdx, rg.dx, 1, kBf16K, cdx),
                             worst_ratio(tdw, rg.dweight, 1, kBf16K, cdw), worst_ratio(tdb, rg.dbias, 1, kBf16K, cdb)};
    const char* names[] = {"y", "dx", "dγ", "dβ"};
    for (int q = 0; q < 4; ++q) {
      EXPECT_LE(ratios[q], 1.0) << "LibTorch " << names[q] << " vs float64";
      worst_torch = std::max(worst_torch, ratios[q]);
    }
    // normlab: half a bf16 ulp of the fp32 result, which is within the fp32 budgets (Tol{4} for y, Tol{16} for dx).
    EXPECT_LE(worst_ratio(ny, r.y, 0.5, 8 * FLT_EPSILON / kBf16U, std::max(cy, 1.0)), 1.0) << "normlab y vs float64";
    EXPECT_LE(worst_ratio(ndx, rg.dx, 0.5, 16 * FLT_EPSILON / kBf16U, cdx), 1.0) << "normlab dx vs float64";
    EXPECT_TRUE(all_close(dw.cview(), rg.dweight, Tol{16, cdw}, "normlab dγ (fp32)"));
    EXPECT_TRUE(all_close(db.cview(), rg.dbias, Tol{16, cdb}, "normlab dβ (fp32)"));
    // More exact than the peer, and the two agree within the peer's budget.
    EXPECT_LE(max_err(ny, r.y), max_err(ty_f, r.y) + 1e-30);
    EXPECT_LE(max_err(ndx, rg.dx), max_err(tdx, rg.dx) + 1e-30);
    EXPECT_LE(worst_ratio(ny, ref::to_double(ty_f.cview()), 2, kBf16K, cy), 1.0) << "normlab vs LibTorch y";
    EXPECT_LE(worst_ratio(ndx, ref::to_double(tdx.cview()), 2, kBf16K, cdx), 1.0) << "normlab vs LibTorch dx";
  }
  std::printf("LibTorch 1.13 bf16 layer_norm: worst error %.3g of the budget ulp + %g·u·C\n", worst_torch, kBf16K);
}

// fp16 has no LibTorch oracle here: LibTorch 1.13 has no CPU layer_norm kernel for Half (it throws). fp16 is
// checked against the fp32 path rounded once and against the float64 reference (tests/norm/lowp_norm_test.cpp).

TEST(TorchFusedAddNorm, ForwardAndAutogradOfTheComposition) {
  at::set_num_threads(1);
  std::mt19937_64 rng(43);
  for (const Dims& shape : {Dims{7, 33}, Dims{3, 1025}, Dims{16, 256}}) {
    for (bool center : {true, false}) {
      SCOPED_TRACE(fmt::format("shape {} centre={}", shape.str(), center));
      const Index d = shape[1];
      const Tensor x = testing::random_tensor(shape, rng, 1.0, 0.5), r = testing::random_tensor(shape, rng, 2.0, 0.0);
      const Tensor w = testing::random_tensor(Dims{d}, rng, 0.5, 1.0), b = testing::random_tensor(Dims{d}, rng, 0.5, 0.0);
      const Tensor dy = testing::random_tensor(shape, rng, 1.0, 0.0), ds = testing::random_tensor(shape, rng, 1.0, 0.0);
      Tensor s(shape), y(shape), dx(shape), dw(Dims{d});
      if (center) {
        add_layer_norm_forward(s.view(), y.view(), {}, {}, x.cview(), r.cview(), w.cview(), b.cview(), {1});
        add_layer_norm_backward(dx.view(), dw.view(), {}, dy.cview(), ds.cview(), s.cview(), w.cview(), {1});
      } else {
        add_rms_norm_forward(s.view(), y.view(), {}, x.cview(), r.cview(), w.cview(), {1});
        add_rms_norm_backward(dx.view(), dw.view(), dy.cview(), ds.cview(), s.cview(), w.cview(), {1});
      }
      at::Tensor tx = torch_float(x.cview()).requires_grad_(true), tr = torch_float(r.cview()).requires_grad_(true);
      at::Tensor tw = torch_float(w.cview()).requires_grad_(true);
      at::Tensor ts = tx + tr;
      at::Tensor ty = center ? at::layer_norm(ts, {d}, tw, torch_float(b.cview()), 1e-5)
                             : ts * at::rsqrt(ts.pow(2).mean({1}, true) + kRmsNormEps) * tw;
      at::Tensor loss = (ty * torch_float(dy.cview())).sum() + (ts * torch_float(ds.cview())).sum();
      loss.backward();
      const Tensor s_t = from_torch(ts.detach());
      EXPECT_TRUE(testing::bitwise_equal(s.cview(), s_t.cview(), "s (one fp32 add)"));
      // Magnitudes as in layer_norm_torch_test.cpp: y ~ max|x̂|·|γ| + |β|; dx ~ rstd·|g|·(1 + max x̂²) + |ds|.
      const ref::LayerNormOut xh = center ? ref::layer_norm_forward(s.cview(), {}, {}, {1}, 1e-5)
                                          : ref::rms_norm_forward(s.cview(), {}, {1}, kRmsNormEps);
      const double max_xhat = max_abs(xh.y), max_g = max_abs(dy) * max_abs(w);
      const double cy = max_xhat * max_abs(w) + max_abs(b);
      const double cdx = max_abs(xh.rstd) * max_g * (1 + max_xhat * max_xhat) + max_abs(ds);
      const double cdw = static_cast<double>(shape[0]) * max_abs(dy) * max_xhat;
      EXPECT_TRUE(all_close(y.cview(), ref::to_double(from_torch(ty.detach()).cview()), Tol{kTorchK, cy}, "y"));
      EXPECT_TRUE(all_close(dx.cview(), ref::to_double(from_torch(tx.grad()).cview()), Tol{kTorchK, cdx}, "dx"));
      EXPECT_TRUE(all_close(dx.cview(), ref::to_double(from_torch(tr.grad()).cview()), Tol{kTorchK, cdx}, "dresidual"));
      EXPECT_TRUE(all_close(dw.cview(), ref::to_double(from_torch(tw.grad()).cview()), Tol{kTorchK, cdw}, "dγ"));
    }
  }
}

}  // namespace
}  // namespace normlab
