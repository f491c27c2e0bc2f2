// Differential tests of the layout fast paths against LibTorch 1.13 (CPU, fp32):
//   [B,F,T] over F (normlab's column path): LayerNorm against ATen's permute route
//   (permute(0,2,1).contiguous() → at::native_layer_norm / _backward → permute back), RMSNorm against the
//   composition users write (x·rsqrt(mean(x², F) + eps)·γ) with autograd gradients; x and dy are sliced
//   views (padded rows, misaligned starts), T spans full tiles, partial tiles and tail columns.
//   BatchNorm training on [N,C,T] (per-segment moments, streaming stores above 16 MiB):
//   at::native_batch_norm and at::native_batch_norm_backward.
// As in channel_norm_torch_test.cpp: normlab vs float64 with the unit tests' budgets, LibTorch vs
// float64 and normlab vs LibTorch with Tol{kTorchK, scale·(1 + κ)}.
#include <normlab/norm.h>
#include <normlab/reference.h>
#include <torch/torch.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "support/random.h"
#include "support/tolerance.h"
#include "support/torch_bridge.h"

namespace normlab {
namespace {

using testing::all_close;
using testing::max_abs;
using testing::Tol;

constexpr double kTorchK = 128;

using testing::torch_copy;
using testing::view_of;
// normlab vs float64 and LibTorch: support/torch_bridge.h, with this file's LibTorch budget.
::testing::AssertionResult agree(ConstView ours, const at::Tensor& theirs, const ref::DTensor& r, double k_ours,
                                 const std::string& what, double kappa, double floor = 0) {
  return testing::agree(ours, theirs, r, k_ours, what, kappa, floor, kTorchK);
}

// A [B, F, T] view of a padded parent (rows of T + 3, F + 1 rows per item), starting at (·, 1, 2).
View sliced(Tensor& parent, std::mt19937_64& rng, Index B, Index F, Index T, double scale, double offset) {
  parent = testing::random_tensor({B, F + 1, T + 3}, rng, scale, offset);
  return parent.view().slice(1, 1, F + 1).slice(2, 2, T + 2);
}

TEST(TorchLayouts, LayerNormAndRmsNormOverFOfBft) {
  std::mt19937_64 rng(606);
  // T = 1 and 7 are below the column path's 8 frames (gathered onto the row path), 9 and 33 a partial
  // block of 16 columns, 100 and 203 several blocks, 1025 sixteen tiles and one column.
  const std::vector<Dims> shapes = {{4, 80, 100}, {2, 33, 1025}, {3, 7, 203}, {1, 1025, 9},
                                    {2, 80, 33},  {3, 40, 7},    {3, 24, 1}};
  for (const Dims& shape : shapes) {
    const Index B = shape[0], F = shape[1], T = shape[2];
    SCOPED_TRACE(shape.str());
    Tensor px, pdy;
    View x = sliced(px, rng, B, F, T, 2.0, 1.0), dy = sliced(pdy, rng, B, F, T, 1.0, 0.0);
    Tensor w = testing::random_tensor({F}, rng, 0.5, 1.0), b = testing::random_tensor({F}, rng, 0.5, 0.0);
    const double eps = 1e-5;
    at::Tensor tx = torch_copy(x), tdy = torch_copy(dy), tw = torch_copy(w.cview()),
               tb = torch_copy(b.cview());

    // LayerNorm: the permute route.
    Tensor y(shape), mean({B, T}), rstd({B, T}), dx(shape), dw({F}), db({F});
    layer_norm_forward(y.view(), mean.view(), rstd.view(), x, w.cview(), b.cview(), {1}, eps);
    layer_norm_backward(dx.view(), dw.view(), db.view(), dy, x, w.cview(), {1}, eps);
    const ref::LayerNormOut r = ref::layer_norm_forward(x, w.cview(), b.cview(), {1}, eps);
    const ref::LayerNormGrads rg = ref::layer_norm_backward(dy, x, w.cview(), {1}, eps);
    const at::Tensor xt = tx.permute({0, 2, 1}).contiguous(), dyt = tdy.permute({0, 2, 1}).contiguous();
    auto [ty, tmean, trstd] = at::native_layer_norm(xt, {F}, tw, tb, eps);
    auto [tdx, tdw, tdb] =
        at::native_layer_norm_backward(dyt, xt, {F}, tmean, trstd, tw, tb, {true, true, true});
    const double kappa = max_abs(ref::to_double(x)) * max_abs(r.rstd) + 1;
    const double dxf = max_abs(r.rstd) * max_abs(ref::to_double(dy)) * max_abs(w.cview());
    ASSERT_TRUE(agree(y.cview(), ty.permute({0, 2, 1}), r.y, 4, "LayerNorm y", kappa));
    ASSERT_TRUE(agree(mean.cview(), tmean.reshape({B, T}), r.mean, 2, "mean", kappa));
    ASSERT_TRUE(agree(rstd.cview(), trstd.reshape({B, T}), r.rstd, 2, "rstd", kappa));
    ASSERT_TRUE(agree(dx.cview(), tdx.permute({0, 2, 1}), rg.dx, 16, "LayerNorm dx", kappa, dxf));
    ASSERT_TRUE(agree(dw.cview(), tdw, rg.dweight, 8, "LayerNorm dweight", kappa));
    ASSERT_TRUE(agree(db.cview(), tdb, rg.dbias, 8, "LayerNorm dbias", kappa));

    // RMSNorm: composed over dim 1, gradients by autograd.
    Tensor ry(shape), rr({B, T}), rdx(shape), rdw({F});
    rms_norm_forward(ry.view(), rr.view(), x, w.cview(), {1}, eps);
    rms_norm_backward(rdx.view(), rdw.view(), dy, x, w.cview(), {1}, eps);
    const ref::LayerNormOut rr64 = ref::rms_norm_forward(x, w.cview(), {1}, eps);
    const ref::LayerNormGrads rrg = ref::rms_norm_backward(dy, x, w.cview(), {1}, eps);
    at::Tensor ax = tx.clone().requires_grad_(true), aw = tw.clone().requires_grad_(true);
    at::Tensor ay = ax * at::rsqrt(ax.pow(2).mean({1}, true) + eps) * aw.view({1, F, 1});
    ay.backward(tdy);
    const double rkappa = max_abs(ref::to_double(x)) * max_abs(rr64.rstd) + 1;
    ASSERT_TRUE(agree(ry.cview(), ay.detach(), rr64.y, 4, "RMSNorm y", rkappa));
    ASSERT_TRUE(agree(rdx.cview(), ax.grad(), rrg.dx, 16, "RMSNorm dx", rkappa,
                      max_abs(rr64.rstd) * max_abs(ref::to_double(dy)) * max_abs(w.cview())));
    ASSERT_TRUE(agree(rdw.cview(), aw.grad(), rrg.dweight, 8, "RMSNorm dweight", rkappa));
  }
}

TEST(TorchLayouts, BatchNormTrainingOnNct) {
  std::mt19937_64 rng(607);
  // [16, 64, 400]; [4, 8, 2^17 + 5] writes 16 MiB outputs (streaming stores, misaligned segments).
  for (const Dims& shape : {Dims{16, 64, 400}, Dims{4, 8, (Index{1} << 17) + 5}}) {
    SCOPED_TRACE(shape.str());
    const Index C = shape[1];
    Tensor x = testing::random_tensor(shape, rng, 1.5, 0.5),
           dy = testing::random_tensor(shape, rng, 1.0, 0.0);
    Tensor w = testing::random_tensor({C}, rng, 0.5, 1.0), b = testing::random_tensor({C}, rng, 1.0, 0.0);
    BatchNormOptions opt;
    Tensor y(shape), sm({C}), sr({C}), dx(shape), dw({C}), db({C});
    batch_norm_forward(y.view(), sm.view(), sr.view(), {}, {}, nullptr, x.cview(), w.cview(), b.cview(), {},
                       opt);
    batch_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), {}, {}, {}, opt);
    const ref::BatchNormOut r = ref::batch_norm_forward(x.cview(), w.cview(), b.cview(), {}, {}, 0, {}, opt);
    const ref::LayerNormGrads rg =
        ref::batch_norm_backward(dy.cview(), x.cview(), w.cview(), {}, {}, {}, opt);
    at::Tensor tx = torch_copy(x.cview()), tw = torch_copy(w.cview()), tb = torch_copy(b.cview());
    auto [ty, tsm, tsr] = at::native_batch_norm(tx, tw, tb, {}, {}, true, 0.1, opt.eps);
    auto [tdx, tdw, tdb] = at::native_batch_norm_backward(torch_copy(dy.cview()), tx, tw, {}, {}, tsm, tsr,
                                                          true, opt.eps, {true, true, true});
    const double kappa = max_abs(ref::to_double(x.cview())) * max_abs(r.rstd);
    const double dxf = max_abs(r.rstd) * max_abs(ref::to_double(dy.cview())) * max_abs(w.cview());
    ASSERT_TRUE(agree(y.cview(), ty, r.y, 4, "y", kappa));
    ASSERT_TRUE(agree(sm.cview(), tsm, r.mean, 2, "save_mean", kappa));
    ASSERT_TRUE(agree(sr.cview(), tsr, r.rstd, 2, "save_rstd", kappa));
    ASSERT_TRUE(agree(dx.cview(), tdx, rg.dx, 16, "dx", kappa, dxf));
    ASSERT_TRUE(agree(dw.cview(), tdw, rg.dweight, 8, "dweight", kappa));
    ASSERT_TRUE(agree(db.cview(), tdb, rg.dbias, 8, "dbias", kappa));
  }
}

}  // namespace
}  // namespace normlab
