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

// |a − b| ≤ ulps·ulp_bf16(max(|a|, |b|)) + kTorchK·ε·C at every element.
::testing::AssertionResult close_bf16(const Tensor& a, const Tensor& b, double ulps, double C, const char* what) {
  for (Index i = 0; i < a.numel(); ++i) {
    const double x = a[i], y = b[i];
    const double bound = ulps * testing::storage_ulp<bfloat16>(std::max(std::fabs(x), std::fabs(y))) + kTorchK * FLT_EPSILON * C;
    if (!(std::fabs(x - y) <= bound))
      return ::testing::AssertionFailure() << what << ": flat index " << i << ": " << x << " vs " << y << " (bound " << bound << ")";
  }
  return ::testing::AssertionSuccess();
}

TEST(TorchLowPrecision, Bf16LayerNormForwardAndBackwardAgreeWithLibTorch) {
  at::set_num_threads(1);
  std::mt19937_64 rng(41);
  for (const Dims& shape : {Dims{7, 33}, Dims{3, 1025}, Dims{64, 768}, Dims{2, 3, 80}, Dims{5, 1}}) {
    SCOPED_TRACE("shape " + shape.str());
    const Index d = shape[shape.size() - 1];
    const BF16Tensor x = testing::convert_copy<bfloat16>(testing::random_tensor(shape, rng, 1.5, 0.5).cview());
    const BF16Tensor dy = testing::convert_copy<bfloat16>(testing::random_tensor(shape, rng, 1.0, 0.0).cview());
    const Tensor w = Tensor::copy_of(testing::convert_copy<bfloat16>(testing::random_tensor(Dims{d}, rng, 0.5, 1.0).cview()).cview());
    const Tensor b = Tensor::copy_of(testing::convert_copy<bfloat16>(testing::random_tensor(Dims{d}, rng, 0.5, 0.0).cview()).cview());
    // normlab, bf16 storage
    BF16Tensor y(shape), dx(shape);
    Tensor dw(Dims{d}), db(Dims{d});
    const Axes axes{static_cast<int>(shape.size()) - 1};
    layer_norm_forward(y.view(), {}, {}, x.cview(), w.cview(), b.cview(), axes);
    layer_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), axes);
    // LibTorch, bf16 tensors and parameters
    at::Tensor tx = torch_float(Tensor::copy_of(x.cview()).cview()).to(at::kBFloat16).requires_grad_(true);
    at::Tensor tw = torch_float(w.cview()).to(at::kBFloat16).requires_grad_(true);
    at::Tensor tb = torch_float(b.cview()).to(at::kBFloat16).requires_grad_(true);
    at::Tensor ty = at::layer_norm(tx, {d}, tw, tb, 1e-5);
    ASSERT_EQ(ty.scalar_type(), at::kBFloat16);
    ty.backward(torch_float(Tensor::copy_of(dy.cview()).cview()).to(at::kBFloat16));
    // Magnitudes LibTorch rounds in fp32: y's intermediates ~ max|x̂|·max|γ| + max|β|; dx's ~ rstd·|g|·(1+x̂²).
    const ref::LayerNormOut r = ref::layer_norm_forward(Tensor::copy_of(x.cview()).cview(), w.cview(), b.cview(), axes, 1e-5);
    const ref::LayerNormOut xh = ref::layer_norm_forward(Tensor::copy_of(x.cview()).cview(), {}, {}, axes, 1e-5);
    const double max_xhat = max_abs(xh.y), max_w = max_abs(w), max_rstd = max_abs(r.rstd);
    const double max_g = max_abs(Tensor::copy_of(dy.cview())) * max_w;
    const double cy = max_xhat * max_w + max_abs(b);
    const double cdx = max_rstd * max_g * (1 + max_xhat * max_xhat);
    EXPECT_TRUE(close_bf16(Tensor::copy_of(y.cview()), from_torch(ty), 1, cy, "y"));
    EXPECT_TRUE(close_bf16(Tensor::copy_of(dx.cview()), from_torch(tx.grad()), 1, cdx, "dx"));
    // LibTorch returns dγ, dβ in bf16 (its γ is bf16): normlab's fp32 sums rounded to bf16 are within one bf16
    // ulp of them, plus LibTorch's fp32 summation error over the groups.
    const double groups = static_cast<double>(x.numel() / d);
    const Tensor dw_b = Tensor::copy_of(testing::convert_copy<bfloat16>(dw.cview()).cview());
    const Tensor db_b = Tensor::copy_of(testing::convert_copy<bfloat16>(db.cview()).cview());
    EXPECT_TRUE(close_bf16(dw_b, from_torch(tw.grad()), 1, groups * max_abs(Tensor::copy_of(dy.cview())) * max_xhat, "dγ"));
    EXPECT_TRUE(close_bf16(db_b, from_torch(tb.grad()), 1, groups * max_abs(Tensor::copy_of(dy.cview())), "dβ"));
  }
}

TEST(TorchLowPrecision, Fp16LayerNormWhereLibTorchHasACpuKernel) {
  const at::Tensor x = at::randn({4, 33}).to(at::kHalf);
  try {
    (void)at::layer_norm(x, {33}, {}, {}, 1e-5);
  } catch (const std::exception&) {
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no CPU layer_norm for fp16: fp16 is checked against the "
                 << "fp32 path rounded once (tests/norm/lowp_norm_test.cpp) only";
  }
  std::mt19937_64 rng(42);
  const F16Tensor xh = testing::convert_copy<float16>(testing::random_tensor(Dims{16, 65}, rng, 1.0, 0.0).cview());
  F16Tensor y(xh.shape());
  layer_norm_forward(y.view(), {}, {}, xh.cview(), {}, {}, {1});
  const at::Tensor ty = at::layer_norm(torch_float(Tensor::copy_of(xh.cview()).cview()).to(at::kHalf), {65}, {}, {}, 1e-5);
  // fp16 has 3 more mantissa bits than bf16: compare in fp16 ulps.
  const Tensor a = Tensor::copy_of(y.cview()), b = from_torch(ty);
  for (Index i = 0; i < a.numel(); ++i)
    EXPECT_LE(std::fabs(double{a[i]} - b[i]), testing::storage_ulp<float16>(std::fabs(b[i])) + kTorchK * FLT_EPSILON * 4.0)
        << i;
}

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
