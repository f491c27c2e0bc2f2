// Differential tests of normlab's BatchNorm, InstanceNorm and GroupNorm against LibTorch 1.13 (CPU, fp32):
//   BatchNorm:    at::native_batch_norm (train and eval: y, save_mean, save_invstd, running-stat updates) and
//                 at::native_batch_norm_backward (train and eval); torch::nn::BatchNorm1d over several
//                 steps with momentum 0.1 and None (cumulative average, num_batches_tracked).
//   InstanceNorm: at::instance_norm, gradients by autograd.
//   GroupNorm:    at::native_group_norm (y, mean, rstd), at::group_norm gradients by autograd.
//   Masked:       masked BatchNorm vs LibTorch BatchNorm on the concatenated real frames; masked
//                 InstanceNorm vs LibTorch InstanceNorm on each sequence cut to its length.
// normlab's inputs are strided views (sliced parents); LibTorch gets contiguous copies of the same values.
// Every comparison goes through testing::all_close / Tol: normlab vs the float64 reference with the unit
// tests' budgets, and normlab vs LibTorch with Tol{kTorchK, max|ref|} (LibTorch computes in fp32; its
// error is relative to the largest intermediate, of the order of the largest output).
#include <normlab/norm.h>
#include <normlab/reference.h>
#include <torch/torch.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "support/random.h"
#include "support/tolerance.h"
#include "support/torch_bridge.h"

namespace normlab {
namespace {

using ref::LayerNormGrads;
using testing::all_close;
using testing::max_abs;
using testing::Tol;
using Lengths = std::vector<Index>;

constexpr double kTorchK = 128;  // LibTorch's fp32 sums over up to ~10⁴ values, in ε of its scale

using testing::torch_copy;
using testing::view_of;
// normlab vs float64 and LibTorch: support/torch_bridge.h, with this file's LibTorch budget.
::testing::AssertionResult agree(ConstView ours, const at::Tensor& theirs, const ref::DTensor& r,
                                 double k_ours, const std::string& what, double kappa, double floor = 0) {
  return testing::agree(ours, theirs, r, k_ours, what, kappa, floor, kTorchK);
}
// κ of a case, and the scale of the terms of dx: max rstd · max|dy| · max|γ|.
double kappa_of(ConstView x, const ref::DTensor& rstd) {
  return max_abs(ref::to_double(x)) * max_abs(rstd);
}
double dx_floor(const ref::DTensor& rstd, ConstView dy, ConstView w) {
  return max_abs(rstd) * max_abs(ref::to_double(dy)) * max_abs(ref::to_double(w));
}

// The scale of dγ's rounding (docs/numerics.md): its terms dy·(x − mean_s)·rstd (mean_s: the mean of a
// segment of one batch item and channel) are formed from fp32 products, so its error is relative to their
// magnitudes, at most 2·max|x̂|·Σ|dy| per channel. xhat: y of the float64 reference without γ, β;
// sum_abs_dy: the reference's dβ for |dy| (Σ|dy| per channel).
double dw_floor(const ref::DTensor& xhat, const ref::DTensor& sum_abs_dy) {
  return 2 * max_abs(xhat) * max_abs(sum_abs_dy);
}
Tensor abs_of(const Tensor& t) {
  Tensor a = t.clone();
  for (Index i = 0; i < a.numel(); ++i) a[i] = std::fabs(a[i]);
  return a;
}

// A strided view of a fresh parent with every axis padded by one and sliced at offset 1.
View strided(std::mt19937_64& rng, Tensor& parent, const Dims& shape, double scale, double offset) {
  Dims ps = shape;
  for (int d = 0; d < ps.size(); ++d) ps[d] += 1;
  parent = testing::random_tensor(ps, rng, scale, offset);
  View v = parent.view();
  for (int d = 0; d < ps.size(); ++d) v = v.slice(d, 1, ps[d]);
  return v;
}

Dims random_shape(std::mt19937_64& rng) {  // [N, C, *] with rank 2-5
  static const Index kSizes[] = {1, 2, 3, 7, 33};
  std::uniform_int_distribution<int> rank_d(2, 5), size_d(0, 4);
  const int rank = rank_d(rng);
  Dims s;
  Index total = 1;
  for (int d = 0; d < rank; ++d) {
    Index v = kSizes[size_d(rng)];
    if (total * v > 8000) v = 1;
    total *= v;
    s.push_back(v);
  }
  return s;
}

TEST(TorchBatchNorm, TrainAndEvalForwardBackwardAndRunningStats) {
  std::mt19937_64 rng(2024);
  std::uniform_int_distribution<int> coin(0, 1);
  int compared = 0;
  for (int i = 0; i < 120; ++i) {
    const Dims shape = random_shape(rng);
    if (shape.product() / shape[1] < 2) continue;  // training needs two values per channel
    Tensor parent;
    View x = strided(rng, parent, shape, 1.5, 0.5);
    const Index C = shape[1];
    Tensor w = testing::random_tensor({C}, rng, 0.5, 1.0), b = testing::random_tensor({C}, rng, 1.0, 0.0);
    Tensor rm = testing::random_tensor({C}, rng, 1.0, 0.0), rv = testing::random_tensor({C}, rng, 0.2, 1.0);
    Tensor dy = testing::random_tensor(shape, rng, 1.0, 0.0);
    const bool training = coin(rng);
    BatchNormOptions opt;
    opt.training = training;
    opt.eps = coin(rng) ? 1e-5 : 1e-3;
    SCOPED_TRACE(fmt::format("case {}: shape {} training {} eps {}", i, shape.str(), training, opt.eps));

    Tensor y(shape), sm({C}), sr({C}), nrm = rm.clone(), nrv = rv.clone(), dx(shape), dw({C}), db({C});
    batch_norm_forward(y.view(), sm.view(), sr.view(), nrm.view(), nrv.view(), nullptr, x, w.cview(),
                       b.cview(), {}, opt);
    batch_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x, w.cview(), rm.cview(), rv.cview(), {},
                        opt);
    ref::BatchNormOut r =
        ref::batch_norm_forward(x, w.cview(), b.cview(), rm.cview(), rv.cview(), 0, {}, opt);
    const double kappa = kappa_of(x, r.rstd), dxf = dx_floor(r.rstd, dy.cview(), w.cview());
    LayerNormGrads rg = ref::batch_norm_backward(dy.cview(), x, w.cview(), rm.cview(), rv.cview(), {}, opt);
    const double dwf =
        dw_floor(ref::batch_norm_forward(x, {}, {}, rm.cview(), rv.cview(), 0, {}, opt).y,
                 ref::batch_norm_backward(abs_of(dy).cview(), x, {}, rm.cview(), rv.cview(), {}, opt).dbias);

    at::Tensor tx = torch_copy(x), tw = torch_copy(w.cview()), tb = torch_copy(b.cview());
    at::Tensor trm = torch_copy(rm.cview()), trv = torch_copy(rv.cview()), tdy = torch_copy(dy.cview());
    auto [ty, tsm, tsr] = at::native_batch_norm(tx, tw, tb, trm, trv, training, 0.1, opt.eps);
    auto [tdx, tdw, tdb] =
        at::native_batch_norm_backward(tdy, tx, tw, torch_copy(rm.cview()), torch_copy(rv.cview()), tsm, tsr,
                                       training, opt.eps, {true, true, true});
    ASSERT_TRUE(agree(y.cview(), ty, r.y, 4, "y", kappa));
    if (training) {  // LibTorch's eval mode returns empty save_mean/save_invstd
      ASSERT_TRUE(agree(sm.cview(), tsm, r.mean, 2, "save_mean", kappa));
      ASSERT_TRUE(agree(sr.cview(), tsr, r.rstd, 2, "save_rstd", kappa));
    }
    ASSERT_TRUE(agree(nrm.cview(), trm, r.running_mean, 4, "running_mean", kappa));
    ASSERT_TRUE(agree(nrv.cview(), trv, r.running_var, 4, "running_var", kappa));
    ASSERT_TRUE(agree(dx.cview(), tdx, rg.dx, 16, "dx", kappa, dxf));
    ASSERT_TRUE(agree(dw.cview(), tdw, rg.dweight, 8, "dweight", kappa, dwf));
    ASSERT_TRUE(agree(db.cview(), tdb, rg.dbias, 8, "dbias", kappa));
    ++compared;
  }
  EXPECT_GT(compared, 60);
}

TEST(TorchBatchNorm, ModuleRunningStatsOverStepsWithMomentumAndCumulativeAverage) {
  std::mt19937_64 rng(7);
  for (bool cumulative : {false, true}) {
    const Index C = 6;
    torch::nn::BatchNorm1d bn(torch::nn::BatchNorm1dOptions(C).momentum(
        cumulative ? c10::optional<double>() : c10::optional<double>(0.1)));
    bn->train();
    BatchNormOptions opt;
    if (cumulative) opt.momentum = std::nullopt;
    Tensor rm({C}), rv({C});
    for (Index c = 0; c < C; ++c) rv[c] = 1.0f;
    Index nbt = 0;
    for (int step = 0; step < 5; ++step) {
      Tensor x = testing::random_tensor({8, C, 11}, rng, 1.0 + step, 0.3 * step);
      Tensor y(x.shape());
      batch_norm_forward(y.view(), {}, {}, rm.view(), rv.view(), &nbt, x.cview(), {}, {}, {}, opt);
      at::Tensor ty;
      {
        torch::NoGradGuard no_grad;
        ty = bn->forward(torch_copy(x.cview()));
      }
      const ref::DTensor ry = ref::to_double(view_of(ty.contiguous()));
      EXPECT_TRUE(all_close(y.cview(), ry, Tol{kTorchK, 4}, fmt::format("y step {}", step)));
      EXPECT_TRUE(
          all_close(rm.cview(), ref::to_double(view_of(bn->running_mean)), Tol{16, 1}, "running_mean"));
      EXPECT_TRUE(all_close(rv.cview(), ref::to_double(view_of(bn->running_var)), Tol{16, 1}, "running_var"));
      EXPECT_EQ(nbt, bn->num_batches_tracked.item<int64_t>());
    }
  }
}

TEST(TorchBatchNorm, MaskedEqualsTorchOnTheConcatenatedRealFrames) {
  std::mt19937_64 rng(11);
  const Index B = 6, C = 4, T = 23;
  Tensor parent;
  View x = strided(rng, parent, {B, C, T}, 2.0, 1.0);
  const Lengths len{23, 1, 9, 0, 17, 5};
  Tensor w = testing::random_tensor({C}, rng, 0.5, 1.0), b = testing::random_tensor({C}, rng, 1.0, 0.0);
  Tensor rm({C}), rv({C}, {1, 1, 1, 1}), dy = testing::random_tensor({B, C, T}, rng, 1.0, 0.0);
  Tensor y({B, C, T}), dx({B, C, T}), dw({C}), db({C}), nrm = rm.clone(), nrv = rv.clone();
  batch_norm_forward(y.view(), {}, {}, nrm.view(), nrv.view(), nullptr, x, w.cview(), b.cview(), len, {});
  batch_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x, w.cview(), {}, {}, len, {});
  // LibTorch on [1, C, Σlen]: the real frames concatenated along time.
  std::vector<at::Tensor> xs, dys;
  at::Tensor tx_all = torch_copy(x), tdy_all = torch_copy(dy.cview());
  for (Index bi = 0; bi < B; ++bi) {
    xs.push_back(tx_all.slice(0, bi, bi + 1).slice(2, 0, len[static_cast<std::size_t>(bi)]));
    dys.push_back(tdy_all.slice(0, bi, bi + 1).slice(2, 0, len[static_cast<std::size_t>(bi)]));
  }
  at::Tensor tx = at::cat(xs, 2).contiguous(), tdy = at::cat(dys, 2).contiguous();
  at::Tensor trm = torch_copy(rm.cview()), trv = torch_copy(rv.cview());
  auto [ty, tsm, tsr] =
      at::native_batch_norm(tx, torch_copy(w.cview()), torch_copy(b.cview()), trm, trv, true, 0.1, 1e-5);
  auto [tdx, tdw, tdb] = at::native_batch_norm_backward(tdy, tx, torch_copy(w.cview()), {}, {}, tsm, tsr,
                                                        true, 1e-5, {true, true, true});
  // normlab's real frames, concatenated the same way.
  std::vector<at::Tensor> ys, dxs;
  at::Tensor ny = torch_copy(y.cview()), ndx = torch_copy(dx.cview());
  for (Index bi = 0; bi < B; ++bi) {
    const Index l = len[static_cast<std::size_t>(bi)];
    ys.push_back(ny.slice(0, bi, bi + 1).slice(2, 0, l));
    dxs.push_back(ndx.slice(0, bi, bi + 1).slice(2, 0, l));
    EXPECT_EQ(ny.slice(0, bi, bi + 1).slice(2, l, T).abs().sum().item<float>(), 0.0f) << "padded y";
    EXPECT_EQ(ndx.slice(0, bi, bi + 1).slice(2, l, T).abs().sum().item<float>(), 0.0f) << "padded dx";
  }
  const at::Tensor ycat = at::cat(ys, 2).contiguous(), dxcat = at::cat(dxs, 2).contiguous();
  ref::BatchNormOut r =
      ref::batch_norm_forward(view_of(tx), w.cview(), b.cview(), rm.cview(), rv.cview(), 0, {}, {});
  const double kappa = kappa_of(view_of(tx), r.rstd), dxf = dx_floor(r.rstd, view_of(tdy), w.cview());
  LayerNormGrads rg = ref::batch_norm_backward(view_of(tdy), view_of(tx), w.cview(), {}, {}, {}, {});
  const double dwf =
      dw_floor(ref::batch_norm_forward(view_of(tx), {}, {}, {}, {}, 0, {}, {}).y,
               ref::batch_norm_backward(view_of(tdy.abs()), view_of(tx), {}, {}, {}, {}, {}).dbias);
  EXPECT_TRUE(agree(view_of(ycat), ty, r.y, 4, "y", kappa));
  EXPECT_TRUE(agree(nrm.cview(), trm, r.running_mean, 4, "running_mean", kappa));
  EXPECT_TRUE(agree(nrv.cview(), trv, r.running_var, 4, "running_var", kappa));
  EXPECT_TRUE(agree(view_of(dxcat), tdx, rg.dx, 16, "dx", kappa, dxf));
  EXPECT_TRUE(agree(dw.cview(), tdw, rg.dweight, 8, "dweight", kappa, dwf));
  EXPECT_TRUE(agree(db.cview(), tdb, rg.dbias, 8, "dbias", kappa));
}

// LibTorch forward + autograd gradients of L = Σ dy⊙y for x, γ, β.
struct TorchGrads {
  at::Tensor y, dx, dw, db;
};
template <typename F>
TorchGrads torch_autograd(ConstView x, ConstView w, ConstView b, ConstView dy, F&& f) {
  at::Tensor tx = torch_copy(x).requires_grad_(), tw = torch_copy(w).requires_grad_(),
             tb = torch_copy(b).requires_grad_();
  at::Tensor ty = f(tx, tw, tb);
  ty.backward(torch_copy(dy));
  return {ty.detach(), tx.grad(), tw.grad(), tb.grad()};
}

TEST(TorchInstanceNorm, ForwardAndAutogradGradientsMatch) {
  std::mt19937_64 rng(13);
  int compared = 0;
  for (int i = 0; i < 80; ++i) {
    const Dims shape = random_shape(rng);
    if (shape.size() < 3 || shape.product() / (shape[0] * shape[1]) < 2) continue;
    Tensor parent;
    View x = strided(rng, parent, shape, 1.5, 0.5);
    const Index C = shape[1];
    Tensor w = testing::random_tensor({C}, rng, 0.5, 1.0), b = testing::random_tensor({C}, rng, 1.0, 0.0);
    Tensor dy = testing::random_tensor(shape, rng, 1.0, 0.0);
    SCOPED_TRACE(fmt::format("case {}: shape {}", i, shape.str()));
    Tensor y(shape), dx(shape), dw({C}), db({C});
    instance_norm_forward(y.view(), {}, {}, x, w.cview(), b.cview());
    instance_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x, w.cview());
    ref::ChannelNormOut r = ref::instance_norm_forward(x, w.cview(), b.cview(), {}, {});
    const double kappa = kappa_of(x, r.rstd), dxf = dx_floor(r.rstd, dy.cview(), w.cview());
    LayerNormGrads rg = ref::instance_norm_backward(dy.cview(), x, w.cview(), {}, {});
    const double dwf = dw_floor(ref::instance_norm_forward(x, {}, {}, {}, {}).y,
                                ref::instance_norm_backward(abs_of(dy).cview(), x, {}, {}, {}).dbias);
    TorchGrads t =
        torch_autograd(x, w.cview(), b.cview(), dy.cview(), [](at::Tensor a, at::Tensor ww, at::Tensor bb) {
          return at::instance_norm(a, ww, bb, {}, {}, true, 0.1, 1e-5, false);
        });
    ASSERT_TRUE(agree(y.cview(), t.y, r.y, 4, "y", kappa));
    ASSERT_TRUE(agree(dx.cview(), t.dx, rg.dx, 16, "dx", kappa, dxf));
    ASSERT_TRUE(agree(dw.cview(), t.dw, rg.dweight, 8, "dweight", kappa, dwf));
    ASSERT_TRUE(agree(db.cview(), t.db, rg.dbias, 8, "dbias", kappa));
    ++compared;
  }
  EXPECT_GT(compared, 20);
}

TEST(TorchInstanceNorm, MaskedEqualsTorchOnEachSequenceCutToItsLength) {
  std::mt19937_64 rng(17);
  const Index B = 5, C = 3, T = 19;
  Tensor parent;
  View x = strided(rng, parent, {B, C, T}, 2.0, 1.0);
  const Lengths len{19, 2, 11, 0, 7};
  Tensor w = testing::random_tensor({C}, rng, 0.5, 1.0), b = testing::random_tensor({C}, rng, 1.0, 0.0);
  Tensor dy = testing::random_tensor({B, C, T}, rng, 1.0, 0.0), y({B, C, T}), dx({B, C, T});
  instance_norm_forward(y.view(), {}, {}, x, w.cview(), b.cview(), len);
  instance_norm_backward(dx.view(), {}, {}, dy.cview(), x, w.cview(), len);
  for (Index bi = 0; bi < B; ++bi) {
    const Index l = len[static_cast<std::size_t>(bi)];
    if (l == 0) continue;
    ConstView xc = ConstView(x).slice(0, bi, bi + 1).slice(2, 0, l),
              dyc = dy.cview().slice(0, bi, bi + 1).slice(2, 0, l);
    TorchGrads t =
        torch_autograd(xc, w.cview(), b.cview(), dyc, [](at::Tensor a, at::Tensor ww, at::Tensor bb) {
          return at::instance_norm(a, ww, bb, {}, {}, true, 0.1, 1e-5, false);
        });
    ref::ChannelNormOut r = ref::instance_norm_forward(xc, w.cview(), b.cview(), {}, {});
    const double kappa = kappa_of(xc, r.rstd), dxf = dx_floor(r.rstd, dyc, w.cview());
    LayerNormGrads rg = ref::instance_norm_backward(dyc, xc, w.cview(), {}, {});
    SCOPED_TRACE(fmt::format("item {} length {}", bi, l));
    EXPECT_TRUE(agree(y.cview().slice(0, bi, bi + 1).slice(2, 0, l), t.y, r.y, 4, "y", kappa));
    EXPECT_TRUE(agree(dx.cview().slice(0, bi, bi + 1).slice(2, 0, l), t.dx, rg.dx, 16, "dx", kappa, dxf));
  }
}

// Random shapes on strided views, then contiguous shapes with four or more channels per group and short
// segments, which GroupNorm runs as LayerNorm rows (chnorm::group_rows_apply): [4, 32, 8] in 8 groups (rows
// of 32), [2, 64, 4, 4] in 4 (rows of 256), [3, 24, 5, 5] in 6 (rows of 100).
TEST(TorchGroupNorm, NativeForwardAndAutogradGradientsMatch) {
  std::mt19937_64 rng(19);
  int compared = 0;
  auto compare = [&](const Dims& shape, int groups, bool contiguous, const std::string& what) {
    SCOPED_TRACE(what);
    const Index C = shape[1];
    Tensor parent;
    const View x = contiguous ? (parent = testing::random_tensor(shape, rng, 1.5, 0.5)).view()
                              : strided(rng, parent, shape, 1.5, 0.5);
    Tensor w = testing::random_tensor({C}, rng, 0.5, 1.0), b = testing::random_tensor({C}, rng, 1.0, 0.0);
    Tensor dy = testing::random_tensor(shape, rng, 1.0, 0.0);
    const Dims ss = group_stats_shape(shape, groups);
    Tensor y(shape), mean(ss), rstd(ss), dx(shape), dw({C}), db({C});
    group_norm_forward(y.view(), mean.view(), rstd.view(), x, w.cview(), b.cview(), groups);
    group_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x, w.cview(), groups);
    ref::ChannelNormOut r = ref::group_norm_forward(x, w.cview(), b.cview(), groups, {});
    const double kappa = kappa_of(x, r.rstd), dxf = dx_floor(r.rstd, dy.cview(), w.cview());
    LayerNormGrads rg = ref::group_norm_backward(dy.cview(), x, w.cview(), groups, {});
    const double dwf = dw_floor(ref::group_norm_forward(x, {}, {}, groups, {}).y,
                                ref::group_norm_backward(abs_of(dy).cview(), x, {}, groups, {}).dbias);
    const at::Tensor tx = torch_copy(x);
    auto [ty, tmean, trstd] =
        at::native_group_norm(tx, torch_copy(w.cview()), torch_copy(b.cview()), shape[0], C,
                              shape.product() / (shape[0] * C), groups, 1e-5);
    ASSERT_TRUE(agree(y.cview(), ty, r.y, 4, "y", kappa));
    ASSERT_TRUE(agree(mean.cview(), tmean, r.mean, 2, "mean", kappa));
    ASSERT_TRUE(agree(rstd.cview(), trstd, r.rstd, 2, "rstd", kappa));
    TorchGrads t =
        torch_autograd(x, w.cview(), b.cview(), dy.cview(), [&](at::Tensor a, at::Tensor ww, at::Tensor bb) {
          return at::group_norm(a, groups, ww, bb, 1e-5, false);
        });
    ASSERT_TRUE(agree(dx.cview(), t.dx, rg.dx, 16, "dx", kappa, dxf));
    ASSERT_TRUE(agree(dw.cview(), t.dw, rg.dweight, 8, "dweight", kappa, dwf));
    ASSERT_TRUE(agree(db.cview(), t.db, rg.dbias, 8, "dbias", kappa));
    ++compared;
  };
  for (int i = 0; i < 100; ++i) {
    Dims shape = random_shape(rng);
    shape[1] = std::vector<Index>{2, 4, 6, 12}[rng() % 4];
    const Index C = shape[1];
    std::vector<int> divisors;
    for (int g = 1; g <= C; ++g)
      if (C % g == 0) divisors.push_back(g);
    const int groups = divisors[rng() % divisors.size()];
    if (shape.product() / (shape[0] * groups) < 2) continue;
    compare(shape, groups, false, fmt::format("case {}: shape {} groups {}", i, shape.str(), groups));
  }
  EXPECT_GT(compared, 40);
  for (const auto& [shape, groups] :
       {std::pair{Dims{4, 32, 8}, 8}, std::pair{Dims{2, 64, 4, 4}, 4}, std::pair{Dims{3, 24, 5, 5}, 6}})
    compare(shape, groups, true, fmt::format("rows: shape {} groups {}", shape.str(), groups));
}

}  // namespace
}  // namespace normlab
