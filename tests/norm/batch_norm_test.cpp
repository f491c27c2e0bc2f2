// BatchNorm (channel-norm engine): hand-computed values, the float64 reference on random shapes and
// strided layouts (train and eval, running statistics over several steps, PyTorch and ONNX
// conventions), masked BatchNorm's defining properties, float64 finite differences, determinism across
// thread counts, and bad input.
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/reference.h>
#include <normlab/simd.h>

#include <cmath>
#include <numeric>
#include <random>

#include "norm/channel_norm.h"
#include "norm/streaming.h"
#include "support/finite_diff.h"
#include "support/random.h"
#include "support/tolerance.h"

namespace normlab {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::dx_scale;
using testing::max_abs;
using testing::Tol;
using Lengths = std::vector<Index>;
using ref::LayerNormGrads;

struct BnFwd {
  Tensor y, mean, rstd, rm, rv;
  Index nbt = 0;
};
// Forward into fresh outputs; running stats (copied from rm0/rv0) only when given.
BnFwd bn_forward(ConstView x, ConstView w, ConstView b, const Tensor* rm0, const Tensor* rv0,
                 const Lengths& len, const BatchNormOptions& opt, Index nbt = 0) {
  const Index C = x.size(opt.channel_axis);
  BnFwd f{Tensor(x.shape()),
          Tensor({C}),
          Tensor({C}),
          rm0 ? rm0->clone() : Tensor(),
          rv0 ? rv0->clone() : Tensor(),
          nbt};
  batch_norm_forward(f.y.view(), f.mean.view(), f.rstd.view(), rm0 ? f.rm.view() : View{},
                     rv0 ? f.rv.view() : View{}, &f.nbt, x, w, b, len, opt);
  return f;
}
struct Grads {
  Tensor dx, dw, db;
};
Grads bn_backward(ConstView dy, ConstView x, ConstView w, ConstView rm, ConstView rv, const Lengths& len,
                  const BatchNormOptions& opt) {
  const Index C = x.size(opt.channel_axis);
  Grads g{Tensor(x.shape()), Tensor({C}), Tensor({C})};
  batch_norm_backward(g.dx.view(), g.dw.view(), g.db.view(), dy, x, w, rm, rv, len, opt);
  return g;
}

// A random strided view: parent padded by one on some axes (sliced, misaligned), maybe permuted.
View random_view(std::mt19937_64& rng, Tensor& parent, const Dims& shape, double scale, double offset) {
  std::uniform_int_distribution<int> coin(0, 1);
  Dims ps = shape;
  for (int d = 0; d < shape.size(); ++d) ps[d] += coin(rng);
  std::vector<int> order(static_cast<std::size_t>(shape.size()));
  std::iota(order.begin(), order.end(), 0);
  if (coin(rng)) std::shuffle(order.begin(), order.end(), rng);
  Dims pshape;  // the parent is laid out in the permuted order
  for (int d : order) pshape.push_back(ps[d]);
  parent = testing::random_tensor(pshape, rng, scale, offset);
  View v = parent.view();
  for (int i = 0; i < shape.size(); ++i)
    if (pshape[i] != shape[order[static_cast<std::size_t>(i)]]) v = v.slice(i, 1, pshape[i]);
  std::vector<int> inverse(order.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    inverse[static_cast<std::size_t>(order[i])] = static_cast<int>(i);
  v = v.permute(std::span<const int>(inverse));
  if (coin(rng) && v.size(0) > 1) v = v.slice(0, v.size(0) - 1, -1, -1);  // a reversed axis
  return v;
}

// Copies the real frames of x [B, C, ..T..] into [1, C, ..Σlen..]: the concatenated batch.
Tensor concat_real(ConstView x, const Lengths& len, int time_axis) {
  Dims shape = x.shape();
  shape[0] = 1;
  shape[time_axis] = std::accumulate(len.begin(), len.end(), Index{0});
  Tensor out(shape);
  Index at = 0;
  for (std::size_t b = 0; b < len.size(); ++b) {
    if (len[b] == 0) continue;
    Tensor src = Tensor::copy_of(x.select(0, static_cast<Index>(b)).slice(time_axis - 1, 0, len[b]));
    View dst = out.view().select(0, 0).slice(time_axis - 1, at, at + len[b]);
    const float* s = src.data();
    for_each_offset(dst.shape(), dst.strides(), [&](Index off) { dst.data()[off] = *s++; });
    at += len[b];
  }
  return out;
}

// Whether every padded frame (t ≥ len[b] on time_axis) of v is exactly 0.
bool padded_zero(ConstView v, const Lengths& len, int time_axis) {
  bool ok = true;
  for (std::size_t b = 0; b < len.size(); ++b) {
    ConstView pad = v.select(0, static_cast<Index>(b)).slice(time_axis - 1, len[b], v.size(time_axis));
    for_each_offset(pad.shape(), pad.strides(), [&](Index off) { ok = ok && pad.data()[off] == 0.0f; });
  }
  return ok;
}

Lengths random_lengths(std::mt19937_64& rng, Index B, Index T) {
  std::uniform_int_distribution<Index> d(0, T);
  Lengths len(static_cast<std::size_t>(B));
  for (Index& l : len) l = d(rng);
  len[0] = T;  // the full length
  if (B > 1) len[1] = 1;
  if (B > 3) len[3] = 0;  // a fully padded item
  return len;
}

// ---- hand-computed -------------------------------------------------------------------------------

TEST(BatchNormExamples, TwoChannelsOverBatchAndTime) {
  // x [B=2, C=2, T=2]: channel 0 holds 1,2,3,4 (mean 2.5, var 1.25); channel 1 holds 5,5,7,7 (mean 6, var 1).
  Tensor x({2, 2, 2}, {1, 2, 5, 5, 3, 4, 7, 7});
  BatchNormOptions opt;
  opt.eps = 0;
  Tensor rm({2}, {0, 0}), rv({2}, {1, 1});
  BnFwd f = bn_forward(x.cview(), {}, {}, &rm, &rv, {}, opt);
  EXPECT_EQ(f.mean[0], 2.5f);
  EXPECT_EQ(f.mean[1], 6.0f);
  EXPECT_FLOAT_EQ(f.rstd[0], static_cast<float>(1 / std::sqrt(1.25)));
  EXPECT_EQ(f.rstd[1], 1.0f);
  for (Index i = 0; i < 2; ++i) EXPECT_EQ(f.y[2 + i], -1.0f);
  for (Index i = 0; i < 2; ++i) EXPECT_EQ(f.y[6 + i], 1.0f);
  // running ← 0.9·running + 0.1·batch, with the unbiased variance (n = 4): 1.25·4/3 and 4/3.
  EXPECT_FLOAT_EQ(f.rm[0], 0.25f);
  EXPECT_FLOAT_EQ(f.rm[1], 0.6f);
  EXPECT_FLOAT_EQ(f.rv[0], static_cast<float>(0.9 + 0.1 * 1.25 * 4 / 3));
  EXPECT_FLOAT_EQ(f.rv[1], static_cast<float>(0.9 + 0.1 * 4.0 / 3));
  EXPECT_EQ(f.nbt, 1);
  // Eval with running stats (0, 1), eps 0: y = x·γ + β.
  opt.training = false;
  Tensor w({2}, {2, 3}), b({2}, {1, -1}), z({2}, {0, 0}), one({2}, {1, 1});
  BnFwd e = bn_forward(x.cview(), w.cview(), b.cview(), &z, &one, {}, opt);
  EXPECT_EQ(e.y[0], 3.0f);
  EXPECT_EQ(e.y[2], 14.0f);
  EXPECT_TRUE(bitwise_equal(e.rm.cview(), z.cview(), "eval leaves running stats"));
}

// ---- the float64 reference on random layouts ----------------------------------------------------

TEST(BatchNormReference, TrainAndEvalMatchFloat64OnRandomLayouts) {
  static const Index kSizes[] = {1, 2, 3, 7, 33};
  std::mt19937_64 rng(424242);
  std::uniform_int_distribution<int> rank_d(1, 4), coin(0, 1), size_d(0, 4);
  int trained = 0;
  for (int i = 0; i < 250; ++i) {
    const int rank = rank_d(rng);
    Dims shape;
    Index total = 1;
    for (int d = 0; d < rank; ++d) {
      Index s = kSizes[size_d(rng)];
      if (total * s > 6000) s = 1;
      total *= s;
      shape.push_back(s);
    }
    Tensor parent;
    View x = random_view(rng, parent, shape, 1.5, coin(rng) ? 0.25 : 100.0);
    BatchNormOptions opt;
    opt.channel_axis = std::uniform_int_distribution<int>(-rank, rank - 1)(rng);
    opt.eps = coin(rng) ? 0.0 : 1e-5;
    opt.momentum = coin(rng) ? std::optional<double>(0.1) : std::nullopt;
    if (coin(rng) && coin(rng))
      opt = [&] {
        auto o = BatchNormOptions::onnx();
        o.channel_axis = opt.channel_axis;
        return o;
      }();
    const Index C = x.size(opt.channel_axis);
    Tensor w = testing::random_tensor({C}, rng, 1.0, 1.0), b = testing::random_tensor({C}, rng, 1.0, 0.0);
    Tensor rm = testing::random_tensor({C}, rng, 1.0, 0.0), rv = testing::random_tensor({C}, rng, 0.2, 1.0);
    const bool use_w = coin(rng), use_b = coin(rng);
    ConstView wv = use_w ? w.cview() : ConstView{}, bv = use_b ? b.cview() : ConstView{};
    SCOPED_TRACE(fmt::format("case {}: shape {} strides {} channel_axis {} eps {} γ={} β={}", i,
                             x.shape().str(), x.strides().str(), opt.channel_axis, opt.eps, use_w, use_b));
    Tensor dy = testing::random_tensor(x.shape(), rng, 1.0, 0.0);
    for (bool training : {true, false}) {
      opt.training = training;
      if (training && total / C <= 1) {
        EXPECT_NL_ERROR(bn_forward(x, wv, bv, &rm, &rv, {}, opt, 3),
                        "Expected more than 1 value per channel");
        continue;
      }
      trained += training;
      BnFwd f = bn_forward(x, wv, bv, &rm, &rv, {}, opt, 3);
      ref::BatchNormOut r = ref::batch_norm_forward(x, wv, bv, rm.cview(), rv.cview(), 3, {}, opt);
      ASSERT_TRUE(all_close(f.y.cview(), r.y, Tol{4, 1}, "y"));
      ASSERT_TRUE(all_close(f.mean.cview(), r.mean, Tol{2, 1e-5}, "save_mean"));
      ASSERT_TRUE(all_close(f.rstd.cview(), r.rstd, Tol{2, 1e-30}, "save_rstd"));
      ASSERT_TRUE(all_close(f.rm.cview(), r.running_mean, Tol{4, 1e-5}, "running_mean"));
      ASSERT_TRUE(all_close(f.rv.cview(), r.running_var, Tol{4, 1e-5}, "running_var"));
      EXPECT_EQ(f.nbt, r.num_batches_tracked);
      Grads g = bn_backward(dy.cview(), x, wv, rm.cview(), rv.cview(), {}, opt);
      LayerNormGrads rg = ref::batch_norm_backward(dy.cview(), x, wv, rm.cview(), rv.cview(), {}, opt);
      ASSERT_TRUE(all_close(g.dx.cview(), rg.dx, Tol{16, dx_scale(rg.dx, r.rstd, dy.cview(), wv)}, "dx"));
      ASSERT_TRUE(all_close(g.dw.cview(), rg.dweight, Tol{8, max_abs(rg.dweight)}, "dweight"));
      ASSERT_TRUE(all_close(g.db.cview(), rg.dbias, Tol{8, max_abs(rg.dbias)}, "dbias"));
    }
  }
  EXPECT_GT(trained, 100);
}

TEST(BatchNormRunningStats, SeveralStepsWithMomentumCumulativeAndOnnx) {
  std::mt19937_64 rng(77);
  BatchNormOptions cumulative;
  cumulative.momentum = std::nullopt;
  for (const BatchNormOptions& opt : {BatchNormOptions{}, cumulative, BatchNormOptions::onnx()}) {
    Tensor rm({5}), rv({5});
    for (Index c = 0; c < 5; ++c) rv[c] = 1.0f;
    ref::DTensor rrm = ref::to_double(rm.cview()), rrv = ref::to_double(rv.cview());
    Index nbt = 0;
    for (int step = 0; step < 6; ++step) {
      Tensor x = testing::random_tensor({4, 5, 9}, rng, 1.0 + step, 0.5 * step);
      BnFwd f = bn_forward(x.cview(), {}, {}, &rm, &rv, {}, opt, nbt);
      ref::BatchNormOut r = ref::batch_norm_forward(x.cview(), {}, {}, rm.cview(), rv.cview(), nbt, {}, opt);
      ref::BatchNormOut r64 = ref::batch_norm_forward(ref::to_double(x.cview()).view(), {}, {}, rrm.view(),
                                                      rrv.view(), nbt, {}, opt);
      EXPECT_TRUE(all_close(f.rm.cview(), r.running_mean, Tol{2, 1e-6}, "running_mean step"));
      EXPECT_TRUE(all_close(f.rv.cview(), r.running_var, Tol{2, 1e-6}, "running_var step"));
      // Over all steps: fp32 storage of the running stats adds ≤ one rounding per step.
      EXPECT_TRUE(all_close(f.rm.cview(), r64.running_mean, Tol{8, 1}, "running_mean vs float64 chain"));
      EXPECT_TRUE(all_close(f.rv.cview(), r64.running_var, Tol{8, 1}, "running_var vs float64 chain"));
      rm = f.rm.clone();
      rv = f.rv.clone();
      rrm = r64.running_mean.clone();
      rrv = r64.running_var.clone();
      nbt = f.nbt;
    }
    EXPECT_EQ(nbt, 6);
  }
  // Cumulative average after k steps of constant batches is exactly their plain average.
  Tensor rm({1}), rv({1});
  Index nbt = 0;
  for (float v : {1.0f, 3.0f, 8.0f}) {
    Tensor x({2, 1}, {v - 1, v + 1});
    BnFwd f = bn_forward(x.cview(), {}, {}, &rm, &rv, {}, cumulative, nbt);
    rm = f.rm.clone();
    rv = f.rv.clone();
    nbt = f.nbt;
  }
  EXPECT_EQ(rm[0], 4.0f);
  EXPECT_EQ(rv[0], 2.0f);  // unbiased variance of (v−1, v+1) is 2 every step
}

// ---- masked BatchNorm -----------------------------------------------------------------------------

TEST(BatchNormMasked, EqualsUnmaskedBatchNormOnTheConcatenatedRealFrames) {
  std::mt19937_64 rng(31337);
  struct Layout {
    Dims shape;
    int time_axis;
  };
  for (const Layout& l : {Layout{{6, 3, 17}, 2}, Layout{{5, 4, 33, 2}, 2}, Layout{{7, 2, 3, 9}, 3},
                          Layout{{4, 3, 1}, 2}, Layout{{9, 5, 7}, -1}}) {
    for (int rep = 0; rep < 4; ++rep) {
      Tensor parent;
      View x = random_view(rng, parent, l.shape, 2.0, 1.0);
      const int ta = l.time_axis < 0 ? l.time_axis + l.shape.size() : l.time_axis;
      const Lengths len = random_lengths(rng, l.shape[0], l.shape[ta]);
      BatchNormOptions opt;
      opt.time_axis = l.time_axis;
      const Index C = l.shape[1];
      Tensor w = testing::random_tensor({C}, rng, 1.0, 1.0), b = testing::random_tensor({C}, rng, 1.0, 0.0);
      Tensor rm = testing::random_tensor({C}, rng, 1.0, 0.0), rv = testing::random_tensor({C}, rng, 0.2, 1.0);
      Tensor dy = testing::random_tensor(x.shape(), rng, 1.0, 0.0);
      SCOPED_TRACE(fmt::format("shape {} strides {} time_axis {} lengths [{}]", x.shape().str(),
                               x.strides().str(), l.time_axis, fmt::join(len, ",")));
      const Tensor xc = concat_real(x, len, ta), dyc = concat_real(dy.cview(), len, ta);
      for (bool training : {true, false}) {
        opt.training = training;
        BnFwd f = bn_forward(x, w.cview(), b.cview(), &rm, &rv, len, opt);
        BnFwd fc = bn_forward(xc.cview(), w.cview(), b.cview(), &rm, &rv, {}, opt);
        // y and dx are computed elementwise in fp32 (docs/numerics.md), so the masked and the
        // concatenated runs are each compared with the float64 reference of the concatenation, within
        // the documented bounds: y within 4 eps of max|y| + max|β| (|x̂·γ| ≤ |y| + |β|), dx within 16 eps
        // of rstd·|dy|·|γ|. The statistics are double: the two runs agree to 2 eps.
        const ref::BatchNormOut rc =
            ref::batch_norm_forward(xc.cview(), w.cview(), b.cview(), rm.cview(), rv.cview(), 0, {}, opt);
        const double y_scale = std::max(1.0, max_abs(rc.y) + max_abs(b));
        EXPECT_TRUE(
            all_close(concat_real(f.y.cview(), len, ta).cview(), rc.y, Tol{4, y_scale}, "y at real frames"));
        EXPECT_TRUE(all_close(fc.y.cview(), rc.y, Tol{4, y_scale}, "y of the concatenation"));
        EXPECT_TRUE(padded_zero(f.y.cview(), len, ta)) << "y at padded frames";
        EXPECT_TRUE(all_close(f.mean.cview(), ref::to_double(fc.mean.cview()), Tol{2, 1e-5}, "save_mean"));
        EXPECT_TRUE(all_close(f.rm.cview(), ref::to_double(fc.rm.cview()), Tol{2, 1e-5}, "running_mean"));
        EXPECT_TRUE(all_close(f.rv.cview(), ref::to_double(fc.rv.cview()), Tol{2, 1e-5}, "running_var"));
        Grads g = bn_backward(dy.cview(), x, w.cview(), rm.cview(), rv.cview(), len, opt);
        Grads gc = bn_backward(dyc.cview(), xc.cview(), w.cview(), rm.cview(), rv.cview(), {}, opt);
        const LayerNormGrads rgc =
            ref::batch_norm_backward(dyc.cview(), xc.cview(), w.cview(), rm.cview(), rv.cview(), {}, opt);
        const double dxs = dx_scale(rgc.dx, rc.rstd, dyc.cview(), w.cview());
        EXPECT_TRUE(all_close(concat_real(g.dx.cview(), len, ta).cview(), rgc.dx, Tol{16, dxs}, "dx real"));
        EXPECT_TRUE(all_close(gc.dx.cview(), rgc.dx, Tol{16, dxs}, "dx of the concatenation"));
        EXPECT_TRUE(padded_zero(g.dx.cview(), len, ta)) << "dx at padded frames";
        const ref::DTensor dwc = ref::to_double(gc.dw.cview()), dbc = ref::to_double(gc.db.cview());
        EXPECT_TRUE(all_close(g.dw.cview(), dwc, Tol{8, max_abs(dwc)}, "dweight"));
        EXPECT_TRUE(all_close(g.db.cview(), dbc, Tol{8, max_abs(dbc)}, "dbias"));
        // And the masked float64 reference.
        ref::BatchNormOut r =
            ref::batch_norm_forward(x, w.cview(), b.cview(), rm.cview(), rv.cview(), 0, len, opt);
        EXPECT_TRUE(all_close(f.y.cview(), r.y, Tol{4, 1}, "y vs masked reference"));
        LayerNormGrads rg =
            ref::batch_norm_backward(dy.cview(), x, w.cview(), rm.cview(), rv.cview(), len, opt);
        EXPECT_TRUE(all_close(g.dx.cview(), rg.dx, Tol{16, dx_scale(rg.dx, r.rstd, dy.cview(), w.cview())},
                              "dx vs masked reference"));
      }
    }
  }
}

TEST(BatchNormMasked, FullLengthsEqualUnmaskedBitwise) {
  std::mt19937_64 rng(8);
  Tensor x = testing::random_tensor({3, 4, 10}, rng, 1.0, 0.0),
         dy = testing::random_tensor({3, 4, 10}, rng, 1.0, 0);
  const Lengths full{10, 10, 10};
  BnFwd a = bn_forward(x.cview(), {}, {}, nullptr, nullptr, full, {}),
        b = bn_forward(x.cview(), {}, {}, nullptr, nullptr, {}, {});
  EXPECT_TRUE(bitwise_equal(a.y.cview(), b.y.cview(), "y"));
  Grads ga = bn_backward(dy.cview(), x.cview(), {}, {}, {}, full, {}),
        gb = bn_backward(dy.cview(), x.cview(), {}, {}, {}, {}, {});
  EXPECT_TRUE(bitwise_equal(ga.dx.cview(), gb.dx.cview(), "dx"));
}

TEST(BatchNormMasked, TooFewRealValuesIsTheTrainingError) {
  Tensor x({2, 3, 4});
  BatchNormOptions opt;
  EXPECT_NL_ERROR(bn_forward(x.cview(), {}, {}, nullptr, nullptr, {1, 0}, opt),
                  "Expected more than 1 value per channel");
  EXPECT_NL_ERROR(bn_forward(x.cview(), {}, {}, nullptr, nullptr, {0, 0}, opt),
                  "Expected more than 1 value per channel");
  opt.training = false;  // eval needs no batch statistics: every item may be empty
  Tensor rm({3}), rv({3});
  BnFwd f = bn_forward(x.cview(), {}, {}, &rm, &rv, {0, 0}, opt);
  for (Index i = 0; i < f.y.numel(); ++i) EXPECT_EQ(f.y[i], 0.0f);
}

// ---- float64 finite differences -------------------------------------------------------------------

// Central differences of L = Σ r⊙y(x, γ, β) for every entry of x, γ, β, against `grads`.
template <typename Forward>
void expect_fd(Forward&& forward, ref::DTensor& x, ref::DTensor& w, ref::DTensor& b, const ref::DTensor& r,
               const LayerNormGrads& grads, double tol, const std::string& what) {
  auto loss = [&] {
    const ref::DTensor y = forward();
    double s = 0;
    for (Index i = 0; i < y.numel(); ++i) s += y[i] * r[i];
    return s;
  };
  const double h = 1e-6;
  auto check = [&](ref::DTensor& p, const ref::DTensor& grad, const char* name) {
    for (Index i = 0; i < p.numel(); ++i) {
      const double fd = testing::central_difference(p[i], loss, h);
      EXPECT_NEAR(grad[i], fd, tol * std::max(1.0, std::fabs(fd))) << what << " " << name << "[" << i << "]";
    }
  };
  check(x, grads.dx, "dx");
  check(w, grads.dweight, "dweight");
  check(b, grads.dbias, "dbias");
}

TEST(BatchNormGradients, ReferenceAndKernelMatchFiniteDifferences) {
  std::mt19937_64 rng(99);
  const Dims shape{3, 2, 5};
  for (int variant = 0; variant < 4; ++variant) {
    // 0: train, 1: train masked, 2: eval, 3: eval masked.
    BatchNormOptions opt;
    opt.training = variant < 2;
    const Lengths len = variant % 2 ? Lengths{5, 2, 0} : Lengths{};
    Tensor xf = testing::random_tensor(shape, rng, 1.0, 0.5), wf = testing::random_tensor({2}, rng, 0.5, 1.0);
    Tensor bf = testing::random_tensor({2}, rng, 1.0, 0.0), rf = testing::random_tensor(shape, rng, 1.0, 0.0);
    Tensor rm = testing::random_tensor({2}, rng, 1.0, 0.0), rv = testing::random_tensor({2}, rng, 0.2, 1.0);
    ref::DTensor x = ref::to_double(xf.cview()), w = ref::to_double(wf.cview()),
                 b = ref::to_double(bf.cview());
    const ref::DTensor r = ref::to_double(rf.cview()), rmd = ref::to_double(rm.cview()),
                       rvd = ref::to_double(rv.cview());
    auto forward = [&] {
      return ref::batch_norm_forward(x.view(), w.view(), b.view(), rmd.view(), rvd.view(), 0, len, opt).y;
    };
    const std::string what = fmt::format("variant {}", variant);
    LayerNormGrads rg =
        ref::batch_norm_backward(r.view(), x.view(), w.view(), rmd.view(), rvd.view(), len, opt);
    expect_fd(forward, x, w, b, r, rg, 1e-7, what + " reference");
    // The fp32 kernel against the same float64 finite differences.
    Grads g = bn_backward(rf.cview(), xf.cview(), wf.cview(), rm.cview(), rv.cview(), len, opt);
    EXPECT_TRUE(all_close(g.dx.cview(), rg.dx, Tol{64, max_abs(rg.dx)}, what + " kernel dx"));
    EXPECT_TRUE(all_close(g.dw.cview(), rg.dweight, Tol{64, max_abs(rg.dweight)}, what + " kernel dweight"));
    EXPECT_TRUE(all_close(g.db.cview(), rg.dbias, Tol{64, max_abs(rg.dbias)}, what + " kernel dbias"));
  }
}

TEST(BatchNormGradients, AccumulateModeAndInPlace) {
  std::mt19937_64 rng(4);
  Tensor x = testing::random_tensor({4, 3, 6}, rng, 1.0, 0.0),
         dy = testing::random_tensor({4, 3, 6}, rng, 1.0, 0.0);
  Grads once = bn_backward(dy.cview(), x.cview(), {}, {}, {}, {}, {});
  Tensor dx({4, 3, 6}), dw({3}, {1, 1, 1}), db({3}, {1, 1, 1});
  batch_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x.cview(), {}, {}, {}, {}, {},
                      GradMode::kAccumulate);
  for (Index c = 0; c < 3; ++c) {
    EXPECT_EQ(dw[c], 1.0f + once.dw[c]);
    EXPECT_EQ(db[c], 1.0f + once.db[c]);
  }
  Tensor inplace = dy.clone();  // dx written over dy
  batch_norm_backward(inplace.view(), {}, {}, inplace.cview(), x.cview(), {}, {}, {}, {}, {});
  EXPECT_TRUE(bitwise_equal(inplace.cview(), once.dx.cview(), "dx in place of dy"));
  Tensor yin = x.clone();
  batch_norm_forward(yin.view(), {}, {}, {}, {}, nullptr, yin.cview(), {}, {});
  EXPECT_TRUE(bitwise_equal(yin.cview(), bn_forward(x.cview(), {}, {}, nullptr, nullptr, {}, {}).y.cview(),
                            "y in place"));
}

// ---- determinism ----------------------------------------------------------------------------------

TEST(BatchNormDeterminism, SameBitsForOneTwoAndThreeThreads) {
  std::mt19937_64 rng(6);
  Tensor x = testing::random_tensor({16, 12, 300}, rng, 2.0, 3.0),
         dy = testing::random_tensor({16, 12, 300}, rng, 1, 0);
  Tensor w = testing::random_tensor({12}, rng, 1.0, 1.0), rm({12}), rv({12});
  const Lengths len = random_lengths(rng, 16, 300);
  const int saved = num_threads();
  std::vector<std::vector<Tensor>> out;
  for (int t : {1, 2, 3}) {
    set_num_threads(t);
    std::vector<Tensor> o;
    for (const Lengths& l : {Lengths{}, len}) {
      BnFwd f = bn_forward(x.cview(), w.cview(), {}, &rm, &rv, l, {});
      Grads g = bn_backward(dy.cview(), x.cview(), w.cview(), {}, {}, l, {});
      for (Tensor* p : {&f.y, &f.mean, &f.rstd, &f.rm, &f.rv, &g.dx, &g.dw, &g.db})
        o.push_back(std::move(*p));
    }
    out.push_back(std::move(o));
  }
  set_num_threads(saved);
  for (std::size_t t = 1; t < out.size(); ++t)
    for (std::size_t i = 0; i < out[0].size(); ++i)
      EXPECT_TRUE(bitwise_equal(out[0][i].cview(), out[t][i].cview(),
                                fmt::format("{} threads, output {}", t + 1, i)));
}

TEST(BatchNormDeterminism, SameBitsOnEverySimdTarget) {
  std::mt19937_64 rng(9);
  Tensor x = testing::random_tensor({5, 7, 333}, rng, 2.0, 3.0),
         dy = testing::random_tensor({5, 7, 333}, rng, 1, 0);
  Tensor w = testing::random_tensor({7}, rng, 1.0, 1.0), b = testing::random_tensor({7}, rng, 0.5, 0.0);
  const Lengths len = random_lengths(rng, 5, 333);
  const Isa saved = active_isa();
  std::vector<std::vector<Tensor>> out;
  for (const Isa isa : supported_isas()) {
    set_isa(isa);
    std::vector<Tensor> o;
    for (const Lengths& l : {Lengths{}, len}) {
      BnFwd f = bn_forward(x.cview(), w.cview(), b.cview(), nullptr, nullptr, l, {});
      Grads g = bn_backward(dy.cview(), x.cview(), w.cview(), {}, {}, l, {});
      for (Tensor* p : {&f.y, &f.mean, &f.rstd, &g.dx, &g.dw, &g.db}) o.push_back(std::move(*p));
    }
    out.push_back(std::move(o));
  }
  set_isa(saved);
  for (std::size_t t = 1; t < out.size(); ++t)
    for (std::size_t i = 0; i < out[0].size(); ++i)
      EXPECT_TRUE(bitwise_equal(out[0][i].cview(), out[t][i].cview(),
                                fmt::format("{}, output {}", isa_name(supported_isas()[t]), i)));
}

// Channels innermost ([N, T, C], [N, C]: every segment a single element): the channel-rows passes
// (chnorm::channel_rows) give the segment path's bits. The same values with every other float of a wider
// buffer (channel stride 2) take the segment path; y, the statistics, the running statistics, dx, dγ and
// dβ are compared bitwise, training and eval, with and without γ/β, on every SIMD target and at 1 and 3
// threads; channel counts around the 16-float vectors and the 64-channel thread blocks.
TEST(BatchNormChannelRows, SameBitsAsTheSegmentPath) {
  std::mt19937_64 rng(43);
  const Isa saved_isa = active_isa();
  const int saved_threads = num_threads();
  for (const Dims& shape :
       {Dims{2, 1}, Dims{5, 7}, Dims{3, 11, 16}, Dims{4, 9, 80}, Dims{2, 33, 300}, Dims{3, 5, 129}}) {
    const int ca = shape.size() - 1;
    const Index C = shape[ca];
    Dims wide = shape;
    wide[ca] = 2 * C;
    const Tensor x = testing::random_tensor(shape, rng, 2.0, 3.0),
                 dy = testing::random_tensor(shape, rng, 1.0, 0.0);
    Tensor xw(wide), dyw(wide);
    Dims wst = xw.view().strides();
    wst[ca] = 2;
    const View xs(xw.data(), shape, wst), dys(dyw.data(), shape, wst);
    testing::copy_into(xs, x);
    testing::copy_into(dys, dy);
    const Tensor w = testing::random_tensor({C}, rng, 1.0, 1.0),
                 b = testing::random_tensor({C}, rng, 0.5, 0.0);
    Tensor rm0 = testing::random_tensor({C}, rng, 0.5, 0.0),
           rv0 = testing::random_tensor({C}, rng, 0.25, 1.0);
    BatchNormOptions opt;
    opt.channel_axis = ca;
    const chnorm::Plan p = chnorm::make_plan(shape, ca, chnorm::Grouping::kBatch, 1, {}, -1, "test");
    ASSERT_TRUE(chnorm::channel_rows(p, {x.cview(), dy.cview()})) << shape.str();
    ASSERT_FALSE(chnorm::channel_rows(p, {ConstView(xs)})) << shape.str();
    for (const Isa isa : supported_isas()) {
      set_isa(isa);
      for (const int threads : {1, 3}) {
        set_num_threads(threads);
        for (const bool affine : {true, false}) {
          const ConstView wv = affine ? w.cview() : ConstView{}, bv = affine ? b.cview() : ConstView{};
          for (const bool training : {true, false}) {
            opt.training = training;
            const std::string what = fmt::format("{} {} {} threads{}{}", shape.str(), isa_name(isa), threads,
                                                 affine ? " affine" : "", training ? " training" : " eval");
            BnFwd f[2] = {bn_forward(x.cview(), wv, bv, &rm0, &rv0, {}, opt),
                          bn_forward(xs, wv, bv, &rm0, &rv0, {}, opt)};
            EXPECT_TRUE(bitwise_equal(f[0].y.cview(), f[1].y.cview(), what + " y"));
            EXPECT_TRUE(bitwise_equal(f[0].mean.cview(), f[1].mean.cview(), what + " mean"));
            EXPECT_TRUE(bitwise_equal(f[0].rstd.cview(), f[1].rstd.cview(), what + " rstd"));
            EXPECT_TRUE(bitwise_equal(f[0].rm.cview(), f[1].rm.cview(), what + " running_mean"));
            EXPECT_TRUE(bitwise_equal(f[0].rv.cview(), f[1].rv.cview(), what + " running_var"));
            Grads g[2] = {bn_backward(dy.cview(), x.cview(), wv, rm0.cview(), rv0.cview(), {}, opt),
                          bn_backward(dys, xs, wv, rm0.cview(), rv0.cview(), {}, opt)};
            EXPECT_TRUE(bitwise_equal(g[0].dx.cview(), g[1].dx.cview(), what + " dx"));
            EXPECT_TRUE(bitwise_equal(g[0].dw.cview(), g[1].dw.cview(), what + " dγ"));
            EXPECT_TRUE(bitwise_equal(g[0].db.cview(), g[1].db.cview(), what + " dβ"));
            if (!training) {  // eval without dγ/dβ: dx alone
              Tensor dx(shape);
              batch_norm_backward(dx.view(), {}, {}, dy.cview(), x.cview(), wv, rm0.cview(), rv0.cview(), {},
                                  opt);
              EXPECT_TRUE(bitwise_equal(dx.cview(), g[1].dx.cview(), what + " dx alone"));
            }
          }
        }
      }
    }
  }
  set_isa(saved_isa);
  set_num_threads(saved_threads);
}

// An infinite dy on the channel rows (docs/numerics.md, "NaN, Inf, eps"): the segment kernel forms a
// one-element segment's Σdy·(x − mean_s) as dy·0 (NaN), the channel rows form no such term, so that channel's
// dγ is NaN on one path and ±Inf on the other: non-finite on both. The other channels' dγ, every dβ and
// the other channels' dx keep the same bits.
TEST(BatchNormChannelRows, InfiniteDyMakesItsChannelNonFiniteOnBothPaths) {
  std::mt19937_64 rng(44);
  const Dims shape{6, 5};
  const Index C = 5, c_inf = 2;
  const Tensor x = testing::random_tensor(shape, rng, 2.0, 3.0);
  Tensor dy = testing::random_tensor(shape, rng, 1.0, 0.0);
  dy.data()[1 * C + c_inf] = std::numeric_limits<float>::infinity();
  Tensor xw({6, 2 * C}), dyw({6, 2 * C});
  const View xs(xw.data(), shape, {2 * C, 2}), dys(dyw.data(), shape, {2 * C, 2});
  testing::copy_into(xs, x);
  testing::copy_into(dys, dy);
  BatchNormOptions opt;
  opt.channel_axis = 1;
  Grads g[2] = {bn_backward(dy.cview(), x.cview(), ConstView{}, ConstView{}, ConstView{}, {}, opt),
                bn_backward(dys, xs, ConstView{}, ConstView{}, ConstView{}, {}, opt)};
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(std::isfinite(g[i].dw[c_inf])) << "path " << i;
  EXPECT_TRUE(bitwise_equal(g[0].db.cview(), g[1].db.cview(), "dβ"));
  for (Index c = 0; c < C; ++c) {
    if (c == c_inf) continue;
    EXPECT_TRUE(bitwise_equal(g[0].dw.cview().slice(0, c, c + 1), g[1].dw.cview().slice(0, c, c + 1),
                              fmt::format("dγ of channel {}", c)));
    EXPECT_TRUE(bitwise_equal(g[0].dx.cview().slice(1, c, c + 1), g[1].dx.cview().slice(1, c, c + 1),
                              fmt::format("dx of channel {}", c)));
  }
}

// Segment lengths around the channel kernels' blocks (16-float vectors, blocks of 32, 64 and 128) on
// misaligned segments (a slice at offset 1), BatchNorm and InstanceNorm: the float64 reference within the
// documented bounds (docs/numerics.md), and the same bits on every SIMD target.
TEST(BatchNormReference, SegmentLengthsAroundTheVectorBlocks) {
  std::mt19937_64 rng(77);
  for (Index S : {1, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 192, 200, 1025}) {
    const Index B = 3, C = 2;
    SCOPED_TRACE(fmt::format("S = {}", S));
    Tensor parent = testing::random_tensor({B, C, S + 1}, rng, 2.0, 0.5);
    const ConstView x = parent.cview().slice(2, 1, S + 1);
    Tensor dy = testing::random_tensor({B, C, S}, rng, 1.0, 0.0);
    Tensor w = testing::random_tensor({C}, rng, 1.0, 1.0), b = testing::random_tensor({C}, rng, 1.0, 0.0);
    const ref::BatchNormOut r = ref::batch_norm_forward(x, w.cview(), b.cview(), {}, {}, 0, {}, {});
    const LayerNormGrads rg = ref::batch_norm_backward(dy.cview(), x, w.cview(), {}, {}, {}, {});
    const ref::ChannelNormOut ri = ref::instance_norm_forward(x, w.cview(), b.cview(), {}, {});
    const LayerNormGrads rgi = ref::instance_norm_backward(dy.cview(), x, w.cview(), {}, {});
    // y's bound is 4 eps of |x̂·γ| ≤ |y| + |β| (docs/numerics.md).
    const double ys = std::max(1.0, max_abs(r.y) + max_abs(b)),
                 ysi = std::max(1.0, max_abs(ri.y) + max_abs(b));
    const Isa saved = active_isa();
    std::vector<std::vector<Tensor>> out;
    for (const Isa isa : supported_isas()) {
      set_isa(isa);
      BnFwd f = bn_forward(x, w.cview(), b.cview(), nullptr, nullptr, {}, {});
      Grads g = bn_backward(dy.cview(), x, w.cview(), {}, {}, {}, {});
      EXPECT_TRUE(all_close(f.y.cview(), r.y, Tol{4, ys}, "BatchNorm y"));
      EXPECT_TRUE(all_close(f.mean.cview(), r.mean, Tol{2, 1e-5}, "BatchNorm save_mean"));
      EXPECT_TRUE(all_close(f.rstd.cview(), r.rstd, Tol{2, 1e-30}, "BatchNorm save_rstd"));
      EXPECT_TRUE(all_close(g.dx.cview(), rg.dx, Tol{16, dx_scale(rg.dx, r.rstd, dy.cview(), w.cview())},
                            "BatchNorm dx"));
      EXPECT_TRUE(all_close(g.dw.cview(), rg.dweight, Tol{8, max_abs(rg.dweight)}, "BatchNorm dweight"));
      EXPECT_TRUE(all_close(g.db.cview(), rg.dbias, Tol{8, max_abs(rg.dbias)}, "BatchNorm dbias"));
      Tensor yi({B, C, S}), dxi({B, C, S}), dwi({C}), dbi({C});
      instance_norm_forward(yi.view(), {}, {}, x, w.cview(), b.cview());
      instance_norm_backward(dxi.view(), dwi.view(), dbi.view(), dy.cview(), x, w.cview());
      EXPECT_TRUE(all_close(yi.cview(), ri.y, Tol{4, ysi}, "InstanceNorm y"));
      EXPECT_TRUE(all_close(dxi.cview(), rgi.dx, Tol{16, dx_scale(rgi.dx, ri.rstd, dy.cview(), w.cview())},
                            "InstanceNorm dx"));
      EXPECT_TRUE(all_close(dwi.cview(), rgi.dweight, Tol{8, max_abs(rgi.dweight)}, "InstanceNorm dweight"));
      std::vector<Tensor> o;
      for (Tensor* t : {&f.y, &f.mean, &f.rstd, &g.dx, &g.dw, &g.db, &yi, &dxi, &dwi, &dbi})
        o.push_back(std::move(*t));
      out.push_back(std::move(o));
    }
    set_isa(saved);
    for (std::size_t t = 1; t < out.size(); ++t)
      for (std::size_t i = 0; i < out[0].size(); ++i)
        EXPECT_TRUE(bitwise_equal(out[0][i].cview(), out[t][i].cview(),
                                  fmt::format("{}, output {}", isa_name(supported_isas()[t]), i)));
  }
}

// Per-segment sums are double and the moments are taken around the fp32 pair of the mean
// (channel_kernels.h), so a large common offset costs no accuracy: y within 1e-6 of float64 at
// 1e4 + N(0, 1) and at 1e6 + N(0, 1) (where the data's own fp32 step is 1/16), the backward within the
// usual budget.
TEST(BatchNormNumerics, LargeOffsetsWithinOneMicro) {
  for (const double offset : {1e4, 1e6}) {
    SCOPED_TRACE(fmt::format("offset {}", offset));
    std::mt19937_64 rng(8);
    std::normal_distribution<double> nd(0.0, 1.0);
    Tensor x({8, 6, 300});
    for (Index i = 0; i < x.numel(); ++i) x[i] = static_cast<float>(offset + nd(rng));
    Tensor dy = testing::random_tensor(x.shape(), rng, 1.0, 0.0);
    const BnFwd f = bn_forward(x.cview(), {}, {}, nullptr, nullptr, {}, {});
    const ref::BatchNormOut r = ref::batch_norm_forward(x.cview(), {}, {}, {}, {}, 0, {}, {});
    double worst = 0;
    for (Index i = 0; i < x.numel(); ++i) worst = std::max(worst, std::fabs(f.y[i] - r.y[i]));
    EXPECT_LE(worst, 1e-6) << "max abs error of y";
    EXPECT_TRUE(all_close(f.mean.cview(), r.mean, Tol{2, 1e-5}, "save_mean"));
    const Grads g = bn_backward(dy.cview(), x.cview(), {}, {}, {}, {}, {});
    const LayerNormGrads rg = ref::batch_norm_backward(dy.cview(), x.cview(), {}, {}, {}, {}, {});
    EXPECT_TRUE(all_close(g.dx.cview(), rg.dx, Tol{16, dx_scale(rg.dx, r.rstd, dy.cview(), {})}, "dx"));
    EXPECT_TRUE(all_close(g.dw.cview(), rg.dweight, Tol{8, max_abs(rg.dweight)}, "dweight"));
  }
}

// Outputs at or above the streaming-store threshold (norm/streaming.h; 16 MiB, here lowered to 64 KiB)
// go through scratch and streaming stores (channel_norm.cpp) when a segment of the output is consecutive
// floats: the same bits as the ordinary path, which an output with a step of 2 along T takes (its
// segments are scattered), at 1 and 2 threads. Also against the float64 reference.
TEST(BatchNormDeterminism, StreamingStoresGiveTheSameBits) {
  std::mt19937_64 rng(7);
  const kernels::ScopedStreamMinBytes lowered(Index{64} << 10);
  const Index B = 4, C = 8, T = (Index{1} << 11) + 5;  // 256 KiB + 80 B; segments misaligned
  Tensor x = testing::random_tensor({B, C, T}, rng, 2.0, 3.0),
         dy = testing::random_tensor({B, C, T}, rng, 1, 0);
  Tensor w = testing::random_tensor({C}, rng, 1.0, 1.0), b = testing::random_tensor({C}, rng, 0.5, 0.0);
  Tensor py({B, C, 2 * T}), pdx({B, C, 2 * T}), sm({C}), sr({C}), dw({C}), db({C});
  View ys = py.view().slice(2, 0, 2 * T, 2), dxs = pdx.view().slice(2, 0, 2 * T, 2);
  const int saved = num_threads();
  for (int t : {1, 2}) {
    set_num_threads(t);
    const BnFwd a = bn_forward(x.cview(), w.cview(), b.cview(), nullptr, nullptr, {}, {});
    batch_norm_forward(ys, sm.view(), sr.view(), {}, {}, nullptr, x.cview(), w.cview(), b.cview(), {}, {});
    EXPECT_TRUE(bitwise_equal(a.y.cview(), ys, "y streamed vs ordinary stores"));
    EXPECT_TRUE(bitwise_equal(a.rstd.cview(), sr.cview(), "rstd"));
    const Grads ga = bn_backward(dy.cview(), x.cview(), w.cview(), {}, {}, {}, {});
    batch_norm_backward(dxs, dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), {}, {}, {}, {});
    EXPECT_TRUE(bitwise_equal(ga.dx.cview(), dxs, "dx streamed vs ordinary stores"));
    EXPECT_TRUE(bitwise_equal(ga.dw.cview(), dw.cview(), "dweight"));
    EXPECT_TRUE(bitwise_equal(ga.db.cview(), db.cview(), "dbias"));
    if (t == 1) {
      const ref::BatchNormOut r = ref::batch_norm_forward(x.cview(), w.cview(), b.cview(), {}, {}, 0, {}, {});
      EXPECT_TRUE(all_close(a.y.cview(), r.y, Tol{4, 1}, "y vs float64"));
    }
  }
  set_num_threads(saved);
}

// ---- bad input ------------------------------------------------------------------------------------

TEST(BatchNormErrors, BadInputGetsClearMessages) {
  Tensor x({2, 3, 4}), y({2, 3, 4}), rm({3}), rv({3}), bad({4}), dx({2, 3, 4}), dy({2, 3, 4});
  auto fwd = [&](const Lengths& len, BatchNormOptions opt, View m = {}, View v = {}) {
    batch_norm_forward(y.view(), {}, {}, m, v, nullptr, x.cview(), {}, {}, len, opt);
  };
  BatchNormOptions opt;
  opt.channel_axis = 3;
  EXPECT_NL_ERROR(fwd({}, opt), "channel_axis 3 is out of range for x of shape [2, 3, 4]");
  opt = {};
  opt.eps = -1e-3;
  EXPECT_NL_ERROR(fwd({}, opt), "eps must be finite and ≥ 0");
  EXPECT_NL_ERROR(fwd({5, 1}, {}), "lengths[0] = 5 exceeds the size 4 of the time axis 2");
  EXPECT_NL_ERROR(fwd({2, -1}, {}), "lengths[1] = -1 is negative");
  EXPECT_NL_ERROR(fwd({2, 2, 2}, {}), "3 lengths given but x of shape [2, 3, 4] has 2 batch items");
  opt = {};
  opt.time_axis = 1;
  EXPECT_NL_ERROR(fwd({2, 2}, opt), "time_axis 1 must come after the channel axis 1");
  opt = {};
  opt.training = false;
  EXPECT_NL_ERROR(fwd({}, opt), "eval mode (training = false) needs running_mean and running_var");
  EXPECT_NL_ERROR(batch_norm_backward(dx.view(), {}, {}, dy.cview(), x.cview(), {}, {}, {}, {}, opt),
                  "eval mode (training = false) needs running_mean and running_var");
  EXPECT_NL_ERROR(fwd({}, {}, bad.view(), rv.view()), "running_mean has shape [4] but [3] is expected");
  EXPECT_NL_ERROR(fwd({}, {}, rm.view(), bad.view()), "running_var has shape [4] but [3] is expected");
  EXPECT_NL_ERROR(fwd({}, {}, rm.view(), {}), "running_mean and running_var must be given together");
  opt = {};
  opt.momentum = std::nullopt;
  EXPECT_NL_ERROR(fwd({}, opt, rm.view(), rv.view()), "needs num_batches_tracked");
  opt.momentum = 1.5;
  EXPECT_NL_ERROR(fwd({}, opt), "momentum must be in [0, 1]");
  Tensor x1({1, 3}), y1({1, 3});
  EXPECT_NL_ERROR(batch_norm_forward(y1.view(), {}, {}, {}, {}, nullptr, x1.cview(), {}, {}),
                  "Expected more than 1 value per channel when training, got input of shape [1, 3]");
  EXPECT_NL_ERROR(batch_norm_forward(y.view(), bad.view(), {}, {}, {}, nullptr, x.cview(), {}, {}),
                  "save_mean has shape [4] but [3] is expected");
  EXPECT_NL_ERROR(batch_norm_forward(y.view(), {}, {}, {}, {}, nullptr, x.cview(), bad.cview(), {}),
                  "weight has shape [4] but [3] is expected");
  EXPECT_NL_ERROR(batch_norm_backward(dx.view(), bad.view(), {}, dy.cview(), x.cview(), {}, {}, {}),
                  "dweight has shape [4] but [3] is expected");
  Tensor dy_bad({2, 3, 5});
  EXPECT_NL_ERROR(batch_norm_backward(dx.view(), {}, {}, dy_bad.cview(), x.cview(), {}, {}, {}),
                  "dy has shape [2, 3, 5]");
  // Nothing was written by the failed calls.
  for (Index i = 0; i < 3; ++i) EXPECT_EQ(rm[i], 0.0f);
}

}  // namespace
}  // namespace normlab
