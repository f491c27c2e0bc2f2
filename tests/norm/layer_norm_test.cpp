// LayerNorm over any axes: hand-computed cases, the float64 reference over swept shapes and layouts,
// float64 finite differences, large-offset stability, determinism across threads and SIMD targets,
// aliasing, and bad input.
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/reference.h>
#include <normlab/simd.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "norm/convert_kernels.h"
#include "norm/row_kernels.h"
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

// Runs the forward into fresh tensors and returns them.
struct Fwd {
  Tensor y, mean, rstd;
};
Fwd run_forward(ConstView x, ConstView w, ConstView b, const Axes& axes, double eps) {
  Fwd f{Tensor(x.shape()), Tensor(kept_shape(x.shape(), axes)), Tensor(kept_shape(x.shape(), axes))};
  layer_norm_forward(f.y.view(), f.mean.view(), f.rstd.view(), x, w, b, axes, eps);
  return f;
}
struct Bwd {
  Tensor dx, dw, db;
};
Bwd run_backward(ConstView dy, ConstView x, ConstView w, const Axes& axes, double eps) {
  const Dims ns = normalized_shape(x.shape(), axes);
  Bwd b{Tensor(x.shape()), Tensor(ns), Tensor(ns)};
  layer_norm_backward(b.dx.view(), b.dw.view(), b.db.view(), dy, x, w, axes, eps);
  return b;
}

// ---- the seed's worked examples, exactly ----------------------------------------------------------

TEST(LayerNormExamples, LayerOutputMeanIsTwo) {
  Tensor x({3}, {1, 2, 3});
  Fwd f = run_forward(x.cview(), {}, {}, {0}, 0.0);
  EXPECT_EQ(f.mean[0], 2.0f);
  EXPECT_FLOAT_EQ(f.rstd[0], static_cast<float>(1.0 / std::sqrt(2.0 / 3.0)));
  EXPECT_FLOAT_EQ(f.y[0], -1.2247449f);
  EXPECT_EQ(f.y[1], 0.0f);
  EXPECT_FLOAT_EQ(f.y[2], 1.2247449f);
}

TEST(LayerNormExamples, SpeechOverFGivesMinusOneAndOne) {
  // [F=2, T=3]: each frame (column) is (1,3), (2,4), (3,5): mean ± 1 exactly.
  Tensor x({2, 3}, {1, 2, 3, 3, 4, 5});
  Fwd f = run_forward(x.cview(), {}, {}, {0}, 0.0);
  Tensor expect({2, 3}, {-1, -1, -1, 1, 1, 1});
  EXPECT_TRUE(bitwise_equal(f.y.cview(), expect.cview(), "over F"));
  Tensor mean_expect({3}, {2, 3, 4});
  EXPECT_TRUE(bitwise_equal(f.mean.cview(), mean_expect.cview(), "frame means"));
  // The same data as a batch [B=1, F=2, T=3], normalized over F per frame.
  Fwd fb = run_forward(x.cview().reshape({1, 2, 3}), {}, {}, {1}, 0.0);
  EXPECT_TRUE(bitwise_equal(fb.y.cview(), expect.cview().reshape({1, 2, 3}), "[B,F,T] over F"));
}

TEST(LayerNormExamples, SpeechOverTGivesScaledRows) {
  Tensor x({2, 3}, {1, 2, 3, 3, 4, 5});
  Fwd f = run_forward(x.cview(), {}, {}, {1}, 0.0);
  const double s = std::sqrt(1.5);  // 1/sqrt(var), var = 2/3
  ref::DTensor expect({2, 3}, {-s, 0, s, -s, 0, s});
  EXPECT_TRUE(all_close(f.y.cview(), expect, Tol{1, 1}, "over T"));
  EXPECT_NEAR(f.y[0], -1.2247, 1e-4);
  // Negative axis counts from the end: -1 is T.
  Fwd fn = run_forward(x.cview(), {}, {}, {-1}, 0.0);
  EXPECT_TRUE(bitwise_equal(fn.y.cview(), f.y.cview(), "axis -1"));
}

TEST(LayerNormExamples, AffineAppliesPerFeature) {
  Tensor x({2, 3}, {1, 2, 3, 3, 4, 5});
  Tensor w({2}, {2, 0.5f}), b({2}, {1, -1});
  Fwd f = run_forward(x.cview(), w.cview(), b.cview(), {0}, 0.0);
  Tensor expect({2, 3}, {-1, -1, -1, -0.5f, -0.5f, -0.5f});
  EXPECT_TRUE(bitwise_equal(f.y.cview(), expect.cview(), "γ, β over F"));
}

TEST(LayerNormExamples, DeviationsBeyondFloatSquareRangeGiveBeta) {
  // docs/numerics.md "Range": the row path squares deviations in fp32, so |x − mean| = 4e19 > √FLT_MAX
  // overflows the sum of squares: var = +Inf, rstd = 0, y = β, dx = 0. Other rows are unaffected.
  Tensor x({2, 2}, {-4e19f, 4e19f, 1, 3});
  Tensor w({2}, {2, 3}), b({2}, {0.5f, -0.25f});
  Fwd f = run_forward(x.cview(), w.cview(), b.cview(), {1}, 1e-5);
  EXPECT_EQ(f.rstd[0], 0.0f);
  EXPECT_EQ(f.y[0], 0.5f);
  EXPECT_EQ(f.y[1], -0.25f);
  EXPECT_NEAR(f.y[2], -2 * 0.99999500003750f + 0.5f, 4e-7);
  Tensor dy({2, 2}, {1, 1, 1, 1});
  Bwd g = run_backward(dy.cview(), x.cview(), w.cview(), {1}, 1e-5);
  EXPECT_EQ(g.dx[0], 0.0f);
  EXPECT_EQ(g.dx[1], 0.0f);
}

// ---- the float64 reference over swept shapes, axes and layouts ----------------------------------

// One random case: a strided view of some parent buffer, axes, optional γ/β.
struct Case {
  std::string name;
  Tensor parent;
  View x;
  Axes axes;
  Tensor w, b;
  bool use_w = false, use_b = false;
  double eps = 1e-5;
};

Case make_case(std::mt19937_64& rng, int idx) {
  static const Index kSizes[] = {1, 2, 3, 7, 16, 33};
  std::uniform_int_distribution<int> rank_d(1, 5), coin(0, 1), size_d(0, 5);
  Case c;
  const int rank = rank_d(rng);
  Dims shape;
  Index total = 1;
  for (int d = 0; d < rank; ++d) {
    Index s = kSizes[size_d(rng)];
    if (total * s > 20000) s = 1;
    total *= s;
    shape.push_back(s);
  }
  // Occasionally one long axis (1025) with everything else small: the other axes together at most 64
  // elements (the largest of them set to 1 until they are). Without this cap a few cases had millions of
  // elements (case 292 was [1025, 33, 16, 1, 33], 18 million, gathered at strides of 132 KiB): this test
  // took 5 s at -O3 and 284 s under AddressSanitizer (181 s in that case alone), 0.2 s and 3 s with it.
  if (idx % 17 == 3) {
    const int long_axis = static_cast<int>(rng() % static_cast<unsigned>(rank));
    shape[long_axis] = 1;
    while (shape.product() > 64) {
      int largest = 0;
      for (int d = 1; d < rank; ++d)
        if (shape[d] > shape[largest]) largest = d;
      shape[largest] = 1;
    }
    shape[long_axis] = 1025;
  }
  // The parent is larger: every axis padded by 1 so that slicing makes a non-contiguous view.
  Dims pshape = shape;
  for (int d = 0; d < rank; ++d) pshape[d] = shape[d] + (coin(rng) ? 1 : 0);
  c.parent = testing::random_tensor(pshape, rng, 1.5, 0.25);
  View v = c.parent.view();
  for (int d = 0; d < rank; ++d) {
    if (pshape[d] != shape[d]) v = v.slice(d, 1, pshape[d]);  // misaligned start
  }
  if (rank >= 2 && coin(rng)) {  // permute the axes
    std::vector<int> order(static_cast<std::size_t>(rank));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    v = v.permute(std::span<const int>(order));
  }
  if (coin(rng) && v.size(0) > 1) v = v.slice(0, v.size(0) - 1, -1, -1);  // reversed axis
  c.x = v;
  // Axes: a random non-empty subset, in random order, sometimes negative.
  for (int d = 0; d < rank; ++d)
    if (coin(rng)) c.axes.push_back(coin(rng) ? d : d - rank);
  if (c.axes.empty()) c.axes.push_back(rank - 1);
  std::shuffle(c.axes.begin(), c.axes.end(), rng);
  c.use_w = coin(rng);
  c.use_b = coin(rng);
  const Dims ns = normalized_shape(v.shape(), c.axes);
  c.w = testing::random_tensor(ns, rng, 1.0, 1.0);
  c.b = testing::random_tensor(ns, rng, 1.0, 0.0);
  c.eps = coin(rng) ? 0.0 : 1e-5;
  c.name = fmt::format("case {}: shape {} strides {} axes [{}] γ={} β={} eps={}", idx, v.shape().str(),
                       v.strides().str(), fmt::join(c.axes, ","), c.use_w, c.use_b, c.eps);
  return c;
}

TEST(LayerNormReference, ForwardAndBackwardMatchFloat64OnRandomLayouts) {
  std::mt19937_64 rng(20261129);
  for (int i = 0; i < 400; ++i) {
    Case c = make_case(rng, i);
    SCOPED_TRACE(c.name);
    ConstView w = c.use_w ? c.w.cview() : ConstView{}, b = c.use_b ? c.b.cview() : ConstView{};
    Fwd f = run_forward(c.x, w, b, c.axes, c.eps);
    ref::LayerNormOut r = ref::layer_norm_forward(c.x, w, b, c.axes, c.eps);
    // y = x̂·γ + β computed in float (docs/numerics.md): at most 4 eps of |x̂·γ| plus half an eps of |y|.
    // |x̂·γ| ≤ |y| + |β|, so the scale is max|y| + max|β| (at least 1).
    const double y_scale = std::max(1.0, max_abs(r.y) + (c.use_b ? max_abs(c.b) : 0.0));
    ASSERT_TRUE(all_close(f.y.cview(), r.y, Tol{4.5, y_scale}, "y"));
    ASSERT_TRUE(all_close(f.mean.cview(), r.mean, Tol{1, 1e-30}, "mean"));
    ASSERT_TRUE(all_close(f.rstd.cview(), r.rstd, Tol{2, 1e-30}, "rstd"));

    Tensor dy = testing::random_tensor(c.x.shape(), rng, 1.0, 0.0);
    Bwd g = run_backward(dy.cview(), c.x, w, c.axes, c.eps);
    ref::LayerNormGrads rg = ref::layer_norm_backward(dy.cview(), c.x, w, c.axes, c.eps);
    // dx is a difference of O(rstd·|g|) terms computed in float (docs/numerics.md): the bound scales with
    // those terms, rstd·|dy|·|γ| (dx_scale), as for BatchNorm and GroupNorm.
    ASSERT_TRUE(all_close(g.dx.cview(), rg.dx, Tol{16, dx_scale(rg.dx, r.rstd, dy.cview(), w)}, "dx"));
    ASSERT_TRUE(all_close(g.dw.cview(), rg.dweight, Tol{4, max_abs(rg.dweight)}, "dweight"));
    ASSERT_TRUE(all_close(g.db.cview(), rg.dbias, Tol{4, max_abs(rg.dbias)}, "dbias"));
  }
}

TEST(LayerNormReference, OddLengthsAndMisalignedRows) {
  std::mt19937_64 rng(7);
  for (Index n : {1, 2, 7, 15, 16, 17, 33, 63, 1025, 4099}) {
    for (Index misalign : {0, 1, 3}) {
      Tensor parent = testing::random_tensor({3, n + misalign}, rng, 2.0, -1.0);
      ConstView x = parent.cview().slice(1, misalign, n + misalign);
      SCOPED_TRACE(fmt::format("n={} misalign={}", n, misalign));
      Fwd f = run_forward(x, {}, {}, {1}, 1e-5);
      ASSERT_TRUE(all_close(f.y.cview(), ref::layer_norm_forward(x, {}, {}, {1}, 1e-5).y, Tol{4, 1}, "y"));
    }
  }
}

TEST(LayerNormReference, OneElementGroupsGiveZero) {
  Tensor x({4, 1}, {1, -2, 3e6f, 0});
  Fwd f = run_forward(x.cview(), {}, {}, {1}, 1e-5);
  for (Index i = 0; i < 4; ++i) EXPECT_EQ(f.y[i], 0.0f);
  for (Index i = 0; i < 4; ++i) EXPECT_EQ(f.mean[i], x[i]);
}

TEST(LayerNormReference, SpeechAxesWithoutTranspose) {
  // [B,F,T] over F, over T and over (F,T); video [B,T,N,D] over D. A strided axis whose groups are
  // gathered (here T = 5 < 8 frames, too few for the column path) gives exactly the bits of normalizing
  // a physically transposed contiguous copy (same row kernel, same order within the group). The column
  // path (T = 37) forms the same sums in the same order with the same fp32 elementwise operations
  // (docs/numerics.md), so it gives those bits too.
  std::mt19937_64 rng(3);
  Tensor xs = testing::random_tensor({4, 80, 5}, rng, 3.0, 5.0);
  Tensor xst = Tensor::copy_of(xs.cview().permute({0, 2, 1}));  // [B,T,F] contiguous
  Fwd gathered = run_forward(xs.cview(), {}, {}, {1}, 1e-5);
  Fwd gathered_t = run_forward(xst.cview(), {}, {}, {2}, 1e-5);
  EXPECT_TRUE(bitwise_equal(gathered.y.cview(), gathered_t.y.cview().permute({0, 2, 1}), "over F vs transposed"));
  EXPECT_TRUE(bitwise_equal(gathered.mean.cview(), gathered_t.mean.cview(), "frame means"));
  Tensor x = testing::random_tensor({4, 80, 37}, rng, 3.0, 5.0);
  Tensor xt = Tensor::copy_of(x.cview().permute({0, 2, 1}));
  Fwd over_f = run_forward(x.cview(), {}, {}, {1}, 1e-5);
  Fwd over_f_t = run_forward(xt.cview(), {}, {}, {2}, 1e-5);
  const Tensor over_f_t_back = Tensor::copy_of(over_f_t.y.cview().permute({0, 2, 1}));
  EXPECT_TRUE(bitwise_equal(over_f.y.cview(), over_f_t_back.cview(), "column vs row path"));
  EXPECT_TRUE(bitwise_equal(over_f.mean.cview(), over_f_t.mean.cview(), "column vs row path means"));
  for (const Axes& axes : {Axes{1}, Axes{2}, Axes{1, 2}, Axes{0, 2}}) {
    Fwd f = run_forward(x.cview(), {}, {}, axes, 1e-5);
    EXPECT_TRUE(all_close(f.y.cview(), ref::layer_norm_forward(x.cview(), {}, {}, axes, 1e-5).y, Tol{4, 1}));
  }
  Tensor video = testing::random_tensor({2, 5, 3, 64}, rng, 1.0, 0.0);
  Fwd fv = run_forward(video.cview(), {}, {}, {3}, 1e-5);
  EXPECT_EQ(fv.mean.shape(), (Dims{2, 5, 3}));
  EXPECT_TRUE(all_close(fv.y.cview(), ref::layer_norm_forward(video.cview(), {}, {}, {3}, 1e-5).y, Tol{4, 1}));
}

// ---- float64 finite differences -----------------------------------------------------------------

// L(x, γ, β) = Σ r ⊙ y with a fixed random r: dL/dy = r. Central differences in double, step h.
TEST(LayerNormGradients, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(11);
  const Axes axes{1, 3};
  const Dims shape{2, 3, 2, 5};
  ref::DTensor x = testing::random_dtensor(shape, rng, 1.0, 0.5);
  ref::DTensor w = testing::random_dtensor({3, 5}, rng, 1.0, 1.0);
  ref::DTensor b = testing::random_dtensor({3, 5}, rng, 1.0, 0.0);
  ref::DTensor r = testing::random_dtensor(shape, rng, 1.0, 0.0);
  const double eps = 1e-5, h = 1e-6;
  auto loss = [&]() {
    ref::LayerNormOut o = ref::layer_norm_forward(x.view(), w.view(), b.view(), axes, eps);
    double s = 0;
    for (Index i = 0; i < o.y.numel(); ++i) s += o.y[i] * r[i];
    return s;
  };
  ref::LayerNormGrads g = ref::layer_norm_backward(r.view(), x.view(), w.view(), axes, eps);
  auto check = [&](ref::DTensor& p, const ref::DTensor& grad, const char* what) {
    for (Index i = 0; i < p.numel(); ++i) {
      const double fd = testing::central_difference(p[i], loss, h);
      EXPECT_NEAR(grad[i], fd, 1e-7 * std::max(1.0, std::fabs(fd))) << what << "[" << i << "]";
    }
  };
  check(x, g.dx, "dx");
  check(w, g.dweight, "dweight");
  check(b, g.dbias, "dbias");
}

TEST(LayerNormGradients, KernelBackwardMatchesFiniteDifferencesOfTheReference) {
  // The fp32 kernel's gradients against float64 central differences of the float64 forward, on
  // fp32-representable inputs: ties the kernel directly to the math, not only to the reference.
  std::mt19937_64 rng(12);
  for (const Axes& axes : {Axes{1}, Axes{0, 2}, Axes{2}}) {
    Tensor x = testing::random_tensor({3, 4, 5}, rng, 1.0, 0.0);
    Tensor w = testing::random_tensor(normalized_shape(x.shape(), axes), rng, 1.0, 1.0);
    Tensor r = testing::random_tensor(x.shape(), rng, 1.0, 0.0);
    ref::DTensor xd = ref::to_double(x.cview()), wd = ref::to_double(w.cview()), rd = ref::to_double(r.cview());
    auto loss = [&]() {
      ref::LayerNormOut o = ref::layer_norm_forward(xd.view(), wd.view(), {}, axes, 1e-5);
      double s = 0;
      for (Index i = 0; i < o.y.numel(); ++i) s += o.y[i] * rd[i];
      return s;
    };
    Bwd g = run_backward(r.cview(), x.cview(), w.cview(), axes, 1e-5);
    const double h = 1e-6;
    auto fd_of = [&](ref::DTensor& p) {
      ref::DTensor out(p.shape());
      for (Index i = 0; i < p.numel(); ++i) {
        out[i] = testing::central_difference(p[i], loss, h);
      }
      return out;
    };
    const ref::DTensor fdx = fd_of(xd), fdw = fd_of(wd);
    // Finite differences carry ~1e-9 error; the kernel's fp32 output rounding dominates.
    EXPECT_TRUE(all_close(g.dx.cview(), fdx, Tol{64, max_abs(fdx)}, "dx vs FD"));
    EXPECT_TRUE(all_close(g.dw.cview(), fdw, Tol{64, max_abs(fdw)}, "dweight vs FD"));
  }
}

TEST(LayerNormGradients, AccumulateModeAddsToParameterGradients) {
  std::mt19937_64 rng(5);
  Tensor x = testing::random_tensor({6, 10}, rng, 1.0, 0.0), dy = testing::random_tensor({6, 10}, rng, 1.0, 0.0);
  Bwd once = run_backward(dy.cview(), x.cview(), {}, {1}, 1e-5);
  Tensor dx({6, 10}), dw({10}), db({10});
  for (Index i = 0; i < 10; ++i) dw[i] = db[i] = 1.0f;
  layer_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x.cview(), {}, {1}, 1e-5, GradMode::kAccumulate);
  for (Index i = 0; i < 10; ++i) {
    EXPECT_EQ(dw[i], 1.0f + once.dw[i]);
    EXPECT_EQ(db[i], 1.0f + once.db[i]);
  }
  EXPECT_TRUE(bitwise_equal(dx.cview(), once.dx.cview(), "dx is written, not accumulated"));
}

// ---- large common offset ------------------------------------------------------------------------

TEST(LayerNormNumerics, OffsetTenThousandRowsNormalizeWithinOneMicro) {
  std::mt19937_64 rng(1);
  std::normal_distribution<double> nd(0.0, 1.0);
  const Index rows = 64, d = 768;
  Tensor x({rows, d});
  for (Index i = 0; i < x.numel(); ++i) x[i] = static_cast<float>(1e4 + nd(rng));
  Fwd f = run_forward(x.cview(), {}, {}, {1}, 1e-5);
  ref::LayerNormOut r = ref::layer_norm_forward(x.cview(), {}, {}, {1}, 1e-5);
  double worst = 0;
  for (Index i = 0; i < x.numel(); ++i) worst = std::max(worst, std::fabs(f.y[i] - r.y[i]));
  EXPECT_LE(worst, 1e-6) << "max abs error at offset 1e4";
  // Backward at the same offset (mean recomputed in double).
  Tensor dy = testing::random_tensor({rows, d}, rng, 1.0, 0.0);
  Bwd g = run_backward(dy.cview(), x.cview(), {}, {1}, 1e-5);
  ref::LayerNormGrads rg = ref::layer_norm_backward(dy.cview(), x.cview(), {}, {1}, 1e-5);
  EXPECT_TRUE(all_close(g.dx.cview(), rg.dx, Tol{16, max_abs(rg.dx)}, "dx at offset 1e4"));
}

// ---- determinism: threads and SIMD targets ------------------------------------------------------

struct AllOutputs {
  Fwd f;
  Bwd b;
};
AllOutputs run_all(ConstView x, ConstView w, ConstView dy, const Axes& axes) {
  return {run_forward(x, w, {}, axes, 1e-5), run_backward(dy, x, w, axes, 1e-5)};
}
void expect_same_bits(const AllOutputs& a, const AllOutputs& b, const std::string& what) {
  EXPECT_TRUE(bitwise_equal(a.f.y.cview(), b.f.y.cview(), what + " y"));
  EXPECT_TRUE(bitwise_equal(a.f.mean.cview(), b.f.mean.cview(), what + " mean"));
  EXPECT_TRUE(bitwise_equal(a.f.rstd.cview(), b.f.rstd.cview(), what + " rstd"));
  EXPECT_TRUE(bitwise_equal(a.b.dx.cview(), b.b.dx.cview(), what + " dx"));
  EXPECT_TRUE(bitwise_equal(a.b.dw.cview(), b.b.dw.cview(), what + " dweight"));
  EXPECT_TRUE(bitwise_equal(a.b.db.cview(), b.b.db.cview(), what + " dbias"));
}

TEST(LayerNormDeterminism, SameBitsForOneTwoAndThreeThreads) {
  std::mt19937_64 rng(9);
  Tensor x = testing::random_tensor({700, 96}, rng, 2.0, 1.0), dy = testing::random_tensor({700, 96}, rng, 1.0, 0.0);
  Tensor w = testing::random_tensor({96}, rng, 1.0, 1.0);
  Tensor xs = testing::random_tensor({8, 40, 300}, rng, 2.0, 1.0), dys = testing::random_tensor({8, 40, 300}, rng, 1.0, 0.0);
  Tensor ws = testing::random_tensor({40}, rng, 1.0, 1.0);
  const int saved = num_threads();
  std::vector<AllOutputs> rows, cols;
  for (int t : {1, 2, 3}) {
    set_num_threads(t);
    rows.push_back(run_all(x.cview(), w.cview(), dy.cview(), {1}));
    cols.push_back(run_all(xs.cview(), ws.cview(), dys.cview(), {1}));
  }
  set_num_threads(saved);
  for (std::size_t i = 1; i < rows.size(); ++i) {
    expect_same_bits(rows[0], rows[i], fmt::format("rows, {} threads", i + 1));
    expect_same_bits(cols[0], cols[i], fmt::format("[B,F,T] over F, {} threads", i + 1));
  }
}

TEST(LayerNormDeterminism, SameBitsOnEverySimdTarget) {
  std::mt19937_64 rng(10);
  Tensor x = testing::random_tensor({37, 1029}, rng, 2.0, 1.0), dy = testing::random_tensor({37, 1029}, rng, 1.0, 0.0);
  Tensor w = testing::random_tensor({1029}, rng, 1.0, 1.0);
  const Isa saved = active_isa();
  std::vector<AllOutputs> out;
  std::vector<Isa> isas = supported_isas();
  for (Isa isa : isas) {
    set_isa(isa);
    out.push_back(run_all(x.cview(), w.cview(), dy.cview(), {1}));
  }
  set_isa(saved);
  ASSERT_FALSE(out.empty());
  for (std::size_t i = 1; i < out.size(); ++i) expect_same_bits(out[0], out[i], isa_name(isas[i]));
  // Short rows (the small-D paths: blocks of rows, tails of the 16-lane vectors and 64-element blocks),
  // with γ and β, on every target.
  for (Index d : {1, 7, 64, 80, 100, 256}) {
    Tensor xs = testing::random_tensor({29, d}, rng, 2.0, 1.0), dys = testing::random_tensor({29, d}, rng, 1.0, 0.0);
    Tensor ws = testing::random_tensor({d}, rng, 1.0, 1.0);
    std::vector<AllOutputs> o;
    for (Isa isa : isas) {
      set_isa(isa);
      o.push_back(run_all(xs.cview(), ws.cview(), dys.cview(), {1}));
    }
    set_isa(saved);
    for (std::size_t i = 1; i < o.size(); ++i) expect_same_bits(o[0], o[i], fmt::format("D={} {}", d, isa_name(isas[i])));
  }
  // Each target also agrees with the float64 reference.
  EXPECT_TRUE(all_close(out.back().f.y.cview(), ref::layer_norm_forward(x.cview(), w.cview(), {}, {1}, 1e-5).y,
                        Tol{4, 1}));
}

// The fused kernels take short rows in blocks (eight at a time, statistics of a block computed
// together, a short last block padded; fp32 rows of 8, 16, 24, 32, 48, 64, 80 and 128 at compile-time
// lengths) and long rows one by one; a one-row call takes the per-row code.
// Every row of a block must come out with the bits of the same row computed alone, on every target,
// for LayerNorm and RMSNorm, forward (y, mean, rstd) and backward (dx) — including rows of zeros of
// either sign (the sums skip additions of zeros), constant rows and rows far from 0.
TEST(LayerNormDeterminism, RowBlocksGiveTheBitsOfSingleRows) {
  std::mt19937_64 rng(17);
  const Isa saved = active_isa();
  for (Isa isa : supported_isas()) {
    set_isa(isa);
    for (Index d : {1, 7, 8, 16, 24, 32, 33, 48, 64, 80, 100, 128, 300}) {
      for (Index rows : {2, 7, 8, 9, 19}) {
        Tensor x = testing::random_tensor({rows, d}, rng, 2.0, 0.5);
        Tensor dy = testing::random_tensor({rows, d}, rng, 1.0, 0.0);
        Tensor w = testing::random_tensor({d}, rng, 1.0, 1.0), b = testing::random_tensor({d}, rng, 0.5, 0.0);
        for (Index j = 0; j < d; ++j) {
          x[j] = -0.0f;                                      // row 0: all −0
          x[d + j] = j % 2 ? -0.0f : 0.0f;                   // row 1: zeros of both signs
          if (rows > 2) x[2 * d + j] = 3.0f;                 // row 2: constant
          if (rows > 3) x[3 * d + j] = 1e4f + x[3 * d + j];  // row 3: far from 0
        }
        const std::string what = fmt::format("{} D={} rows={}", isa_name(isa), d, rows);
        for (bool affine : {false, true}) {
          const ConstView wv = affine ? w.cview() : ConstView{}, bv = affine ? b.cview() : ConstView{};
          Fwd all = run_forward(x.cview(), wv, bv, {1}, 1e-5);
          Bwd all_b = run_backward(dy.cview(), x.cview(), wv, {1}, 1e-5);
          Tensor rms_y({rows, d}), rms_r({rows}), rms_dx({rows, d});
          rms_norm_forward(rms_y.view(), rms_r.view(), x.cview(), wv, {1}, 1e-5);
          rms_norm_backward(rms_dx.view(), {}, dy.cview(), x.cview(), wv, {1}, 1e-5);
          for (Index r = 0; r < rows; ++r) {
            Tensor xr({1, d}), dyr({1, d});
            for (Index j = 0; j < d; ++j) {
              xr[j] = x[r * d + j];
              dyr[j] = dy[r * d + j];
            }
            Fwd one = run_forward(xr.cview(), wv, bv, {1}, 1e-5);
            Bwd one_b = run_backward(dyr.cview(), xr.cview(), wv, {1}, 1e-5);
            const std::string wr = fmt::format("{} row {} affine {}", what, r, affine);
            ASSERT_TRUE(bitwise_equal(all.y.cview().select(0, r), one.y.cview().select(0, 0), wr + " y"));
            ASSERT_TRUE(bitwise_equal(all.mean.cview().select(0, r), one.mean.cview().select(0, 0), wr + " mean"));
            ASSERT_TRUE(bitwise_equal(all.rstd.cview().select(0, r), one.rstd.cview().select(0, 0), wr + " rstd"));
            ASSERT_TRUE(bitwise_equal(all_b.dx.cview().select(0, r), one_b.dx.cview().select(0, 0), wr + " dx"));
            Tensor y1({1, d}), r1({1}), dx1({1, d});
            rms_norm_forward(y1.view(), r1.view(), xr.cview(), wv, {1}, 1e-5);
            rms_norm_backward(dx1.view(), {}, dyr.cview(), xr.cview(), wv, {1}, 1e-5);
            ASSERT_TRUE(bitwise_equal(rms_y.cview().select(0, r), y1.cview().select(0, 0), wr + " RMS y"));
            ASSERT_TRUE(bitwise_equal(rms_r.cview().select(0, r), r1.cview().select(0, 0), wr + " RMS rstd"));
            ASSERT_TRUE(bitwise_equal(rms_dx.cview().select(0, r), dx1.cview().select(0, 0), wr + " RMS dx"));
          }
        }
      }
    }
  }
  set_isa(saved);
}

// ---- buffer layouts: where x, dy and the output start in their pages (row_kernels.h) -------------

// k regions of whole 4 KiB pages, each with room for n floats and one more page (for an offset into it).
struct PageRegions {
  Index stride;
  std::vector<float> store;
  float* base;
  PageRegions(int k, Index n)
      : stride((n + 1023) / 1024 * 1024 + 1024), store(static_cast<std::size_t>(k * stride + 1024)) {
    base = reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(store.data()) + 4095) / 4096 * 4096);
  }
  float* operator[](int i) const { return base + i * stride; }
};

// Rows of dx that start (modulo 4 KiB) at the offsets of the rows of x and dy, as separate allocations of
// rows of 1024·k floats do, take the column pass in two halves; rows of dx 2 KiB away, or rows whose
// starts drift apart from row to row, do not. Within two cache lines only in cache (no streaming stores).
TEST(LayerNormLayouts, ColumnPassHalvesAreChosenByTheBufferOffsets) {
  alignas(4096) static float buf[3 * 16384];                           // three regions of 64 KiB
  auto args = [&](Index n, Index dy_off, Index dx_off, bool stream) {  // offsets in floats, within a region
    kernels::RowsBackward a;
    a.x = buf;
    a.dy = buf + 16384 + dy_off;
    a.dx = buf + 2 * 16384 + dx_off;
    a.ldx = a.lddy = a.lddx = n;
    a.rows = 4;
    a.n = n;
    a.stream = stream;
    return a;
  };
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streaming stores" : "in cache");
    EXPECT_TRUE(kernels::column_halves(args(1024, 0, 0, stream), 0));       // all at one offset
    EXPECT_TRUE(kernels::column_halves(args(1024, 256, 256, stream), 0));   // dx at dy's offset
    EXPECT_FALSE(kernels::column_halves(args(1024, 256, 512, stream), 0));  // dx 1 KiB from dy, 2 from x
    EXPECT_FALSE(kernels::column_halves(args(4000, 0, 0, stream), 0));      // rows 384 B apart modulo 4 KiB
    EXPECT_FALSE(kernels::column_halves(args(1024, 0, 1024 - 48, stream), 0));  // 192 B either way
  }
  // dx one line behind dy and two behind x: in cache only.
  EXPECT_TRUE(kernels::column_halves(args(1024, 16, 32, false), 0));
  EXPECT_FALSE(kernels::column_halves(args(1024, 16, 32, true), 0));
}

// Either way the column pass gives the same bits: dx, dγ and dβ of LayerNorm (the statistics recomputed,
// or saved) and RMSNorm with dx at the page offset of x and dy (halves) and 2 KiB away (not), on every
// SIMD target; rows of 1024, 1030 (a tail in the last chunk) and 2048, in groups of four and a last row.
TEST(LayerNormLayouts, SameBitsWhicheverWayTheColumnPassRuns) {
  std::mt19937_64 rng(23);
  const Isa saved = active_isa();
  for (const Index d : {1024, 1030, 2048}) {
    constexpr Index kRows = 9;
    const Index size = kRows * d;
    // Page-aligned regions: x, dy, and dx at page offset 0 or 2048 bytes.
    const PageRegions reg(4, size);
    float* const x = reg[0];
    float* const dy = reg[1];
    float* const dx_same = reg[2];
    float* const dx_apart = reg[3] + 512;
    const Tensor xt = testing::random_tensor({kRows, d}, rng, 2.0, 1.0),
                 dyt = testing::random_tensor({kRows, d}, rng, 1.0, 0.0),
                 w = testing::random_tensor({d}, rng, 1.0, 1.0);
    std::copy(xt.data(), xt.data() + size, x);
    std::copy(dyt.data(), dyt.data() + size, dy);
    kernels::RowsBackward probe;
    probe.x = x;
    probe.dy = dy;
    probe.ldx = probe.lddy = probe.lddx = d;
    probe.dx = dx_same;
    ASSERT_TRUE(kernels::column_halves(probe, 0));
    probe.dx = dx_apart;
    ASSERT_FALSE(kernels::column_halves(probe, 0));
    const ConstView xv(x, {kRows, d}), dyv(dy, {kRows, d});
    NormStats ln_stats, rms_stats;
    Tensor y({kRows, d}), mean({kRows}), rstd({kRows});
    layer_norm_forward(y.view(), mean.view(), rstd.view(), xv, w.cview(), {}, {1}, 1e-5, &ln_stats);
    rms_norm_forward(y.view(), rstd.view(), xv, w.cview(), {1}, 1e-5, &rms_stats);
    for (const Isa isa : supported_isas()) {
      set_isa(isa);
      for (int kind = 0; kind < 3; ++kind) {  // LayerNorm, LayerNorm from saved statistics, RMSNorm
        Tensor dw[2] = {Tensor({d}), Tensor({d})}, db[2] = {Tensor({d}), Tensor({d})};
        float* const outs[2] = {dx_same, dx_apart};
        for (int v = 0; v < 2; ++v) {
          const View dx(outs[v], {kRows, d});
          if (kind == 0) layer_norm_backward(dx, dw[v].view(), db[v].view(), dyv, xv, w.cview(), {1}, 1e-5);
          if (kind == 1)
            layer_norm_backward_saved(dx, dw[v].view(), db[v].view(), dyv, xv, w.cview(), ln_stats);
          if (kind == 2) rms_norm_backward(dx, dw[v].view(), dyv, xv, w.cview(), {1}, 1e-5);
        }
        const std::string what = fmt::format("{} D={} kind {}", isa_name(isa), d, kind);
        EXPECT_TRUE(
            bitwise_equal(ConstView(dx_same, {kRows, d}), ConstView(dx_apart, {kRows, d}), what + " dx"));
        EXPECT_TRUE(bitwise_equal(dw[0].cview(), dw[1].cview(), what + " dweight"));
        if (kind < 2) {
          EXPECT_TRUE(bitwise_equal(db[0].cview(), db[1].cview(), what + " dbias"));
        }
      }
    }
    set_isa(saved);
  }
}

// The pipelined forward (rows of a multiple of 64 from 256 on) stores each block of outputs after the next
// block's loads where y starts one to five cache lines after x modulo 4 KiB (row_kernels.h, output_late).
TEST(LayerNormLayouts, LateOutputStoresAreChosenByTheBufferOffsets) {
  alignas(4096) static float buf[2048];
  EXPECT_FALSE(kernels::output_late(buf, buf));        // in place, or the same page offset
  EXPECT_TRUE(kernels::output_late(buf + 16, buf));    // y one line after x
  EXPECT_TRUE(kernels::output_late(buf + 80, buf));    // five lines
  EXPECT_FALSE(kernels::output_late(buf + 96, buf));   // six
  EXPECT_FALSE(kernels::output_late(buf, buf + 32));   // y before x
  EXPECT_TRUE(kernels::output_late(buf + 1056, buf));  // one line after, modulo 4 KiB
}

// Either way the forward gives the same bits: y, mean and rstd of LayerNorm and y, rstd of RMSNorm with y
// 128 bytes after x (late stores) and 2 KiB after (not), on every SIMD target; rows of 256, 768 and 1024.
TEST(LayerNormLayouts, ForwardSameBitsWhereverTheOutputLies) {
  std::mt19937_64 rng(29);
  const Isa saved = active_isa();
  for (const Index d : {256, 768, 1024}) {
    constexpr Index kRows = 7;
    const Index size = kRows * d;
    const PageRegions reg(3, size);
    float* const x = reg[0];
    float* const y_late = reg[1] + 32;
    float* const y_apart = reg[2] + 512;
    ASSERT_TRUE(kernels::output_late(y_late, x));
    ASSERT_FALSE(kernels::output_late(y_apart, x));
    const Tensor xt = testing::random_tensor({kRows, d}, rng, 2.0, 1.0),
                 w = testing::random_tensor({d}, rng, 1.0, 1.0),
                 b = testing::random_tensor({d}, rng, 0.5, 0.0);
    std::copy(xt.data(), xt.data() + size, x);
    const ConstView xv(x, {kRows, d});
    for (const Isa isa : supported_isas()) {
      set_isa(isa);
      Tensor mean[2] = {Tensor({kRows}), Tensor({kRows})}, rstd[2] = {Tensor({kRows}), Tensor({kRows})};
      float* const ys[2] = {y_late, y_apart};
      const std::string what = fmt::format("{} D={}", isa_name(isa), d);
      for (int v = 0; v < 2; ++v)
        layer_norm_forward(View(ys[v], {kRows, d}), mean[v].view(), rstd[v].view(), xv, w.cview(), b.cview(),
                           {1}, 1e-5);
      EXPECT_TRUE(bitwise_equal(ConstView(y_late, {kRows, d}), ConstView(y_apart, {kRows, d}), what + " y"));
      EXPECT_TRUE(bitwise_equal(mean[0].cview(), mean[1].cview(), what + " mean"));
      EXPECT_TRUE(bitwise_equal(rstd[0].cview(), rstd[1].cview(), what + " rstd"));
      for (int v = 0; v < 2; ++v)
        rms_norm_forward(View(ys[v], {kRows, d}), rstd[v].view(), xv, w.cview(), {1}, 1e-6);
      EXPECT_TRUE(
          bitwise_equal(ConstView(y_late, {kRows, d}), ConstView(y_apart, {kRows, d}), what + " RMS y"));
      EXPECT_TRUE(bitwise_equal(rstd[0].cview(), rstd[1].cview(), what + " RMS rstd"));
    }
    set_isa(saved);
  }
}

// The row kernels' arguments for `rows` contiguous rows of d elements at x (y set by the caller), γ w and
// β b, eps 1e-5, statistics at stride 1.
template <typename T>
kernels::RowsForwardOf<T> contiguous_rows(const T* x, Index rows, Index d, const float* w, const float* b) {
  kernels::RowsForwardOf<T> a;
  a.x = x;
  a.ldx = a.ldy = d;
  a.rows = rows;
  a.n = d;
  a.w = w;
  a.b = b;
  a.eps = 1e-5;
  a.ld_stats = 1;
  return a;
}

// The fused backward's arguments for `rows` contiguous rows of d floats (eps 1e-5): dx, and dγ, dβ partial
// rows (dw, db: sized and assigned, init), from the forward's saved statistics where srstd is not null
// (smean: the LayerNorm's mean, else null).
kernels::RowsBackward backward_rows(float* dx, std::vector<double>& dw, std::vector<double>& db,
                                    const float* dy, const float* x, const float* w, Index rows, Index d,
                                    bool center, const double* smean, const double* srstd) {
  kernels::RowsBackward a;
  a.dx = dx;
  a.dy = dy;
  a.x = x;
  a.lddx = a.lddy = a.ldx = d;
  a.rows = rows;
  a.n = d;
  a.w = w;
  a.eps = 1e-5;
  a.center = center;
  dw.assign(static_cast<std::size_t>(d), 0.0);
  db.assign(static_cast<std::size_t>(d), 0.0);
  a.dw = dw.data();
  a.db = db.data();
  a.init = true;
  a.smean = smean;
  a.srstd = srstd;
  return a;
}

// Long fp32 LayerNorm rows out of cache (streaming stores) take the kernel of row blocks instead of the
// pipelined one (kernels::forward_pipelined) where tuning.long_rows_blocked says so (by default on AMD
// processors, kernels::machine_row_tuning): the same y, mean and rstd (and the saved double statistics) bit
// for bit, on every SIMD target. RMSNorm and the 16-bit types stay pipelined.
TEST(LayerNormLayouts, LongRowsOutOfCacheTakeTheRowBlocksWithTheSameBits) {
  std::mt19937_64 rng(31);
  const Isa saved = active_isa();
  for (const Index d : {kernels::kUnpipelinedMinN, Index{4096}}) {
    constexpr Index kRows = 5;
    const Tensor x = testing::random_tensor({kRows, d}, rng, 2.0, 3.0),
                 w = testing::random_tensor({d}, rng, 1.0, 1.0),
                 b = testing::random_tensor({d}, rng, 0.5, 0.0);
    kernels::RowsForward a = contiguous_rows(x.data(), kRows, d, w.data(), b.data());
    const bool machine_blocked = kernels::machine_row_tuning().long_rows_blocked;
    EXPECT_EQ(a.tuning.long_rows_blocked, machine_blocked);
    a.stream = true;
    EXPECT_EQ(kernels::forward_pipelined(a), !machine_blocked);
    a.tuning.long_rows_blocked = false;
    EXPECT_TRUE(kernels::forward_pipelined(a));
    a.tuning.long_rows_blocked = true;
    a.stream = false;
    EXPECT_TRUE(kernels::forward_pipelined(a));
    a.stream = true;
    EXPECT_FALSE(kernels::forward_pipelined(a));
    kernels::RowsForwardOf<bfloat16> a16;
    a16.n = d;
    a16.stream = true;
    a16.tuning.long_rows_blocked = true;
    EXPECT_TRUE(kernels::forward_pipelined(a16));
    a.center = false;
    EXPECT_TRUE(kernels::forward_pipelined(a));
    a.center = true;
    for (const Isa isa : supported_isas()) {
      set_isa(isa);
      const std::string what = fmt::format("{} D={}", isa_name(isa), d);
      Tensor y[2] = {Tensor({kRows, d}), Tensor({kRows, d})}, mean[2] = {Tensor({kRows}), Tensor({kRows})},
             rstd[2] = {Tensor({kRows}), Tensor({kRows})};
      double smean[2][kRows], srstd[2][kRows];
      for (int v = 0; v < 2; ++v) {
        a.stream = v == 1;
        a.y = y[v].data();
        a.mean = mean[v].data();
        a.rstd = rstd[v].data();
        a.smean = smean[v];
        a.srstd = srstd[v];
        kernels::row_kernels().rows_forward(a);
      }
      EXPECT_TRUE(bitwise_equal(y[0].cview(), y[1].cview(), what + " y"));
      EXPECT_TRUE(bitwise_equal(mean[0].cview(), mean[1].cview(), what + " mean"));
      EXPECT_TRUE(bitwise_equal(rstd[0].cview(), rstd[1].cview(), what + " rstd"));
      EXPECT_EQ(std::memcmp(smean[0], smean[1], sizeof smean[0]), 0) << what;
      EXPECT_EQ(std::memcmp(srstd[0], srstd[1], sizeof srstd[0]), 0) << what;
    }
    set_isa(saved);
  }
}

// The row kernels' machine choices (kernels::RowTuning) as docs/PERFORMANCE.md measured them on each machine,
// pinned: the Xeon's (every processor but AMD's), the Zen 4's (AMD before family 0x1A) and the Zen 5's.
TEST(LayerNormLayouts, RowTuningPerMachine) {
  using kernels::CpuKind;
  const kernels::RowTuning xeon = kernels::row_tuning_for(CpuKind::kIntel),
                           zen4 = kernels::row_tuning_for(CpuKind::kZen4),
                           zen5 = kernels::row_tuning_for(CpuKind::kZen5);
  EXPECT_FALSE(xeon.long_rows_blocked);
  EXPECT_EQ(xeon.prefetch_min_n, 256);
  EXPECT_TRUE(xeon.batched_prefetch);
  EXPECT_FALSE(xeon.batched_prefetch_fp32);
  EXPECT_EQ(xeon.backward_prefetch_min_n, 0);
  EXPECT_TRUE(zen4.long_rows_blocked);
  EXPECT_EQ(zen4.prefetch_min_n, 1024);
  EXPECT_FALSE(zen4.batched_prefetch);
  EXPECT_FALSE(zen4.batched_prefetch_fp32);
  EXPECT_EQ(zen4.backward_prefetch_min_n, 1024);
  EXPECT_FALSE(zen5.long_rows_blocked);
  EXPECT_EQ(zen5.prefetch_min_n, 512);
  EXPECT_TRUE(zen5.batched_prefetch);
  EXPECT_TRUE(zen5.batched_prefetch_fp32);
  EXPECT_EQ(zen5.backward_prefetch_min_n, 0);
  EXPECT_FALSE(xeon.rows_in_registers);
  EXPECT_FALSE(zen4.rows_in_registers);
  EXPECT_TRUE(zen5.rows_in_registers);
  for (const kernels::RowTuning& t : {xeon, zen4, zen5}) EXPECT_EQ(t.register_prefetch_min_n, 192);
  EXPECT_TRUE(xeon.stream_ragged_rows);
  EXPECT_TRUE(zen4.stream_ragged_rows);
  EXPECT_FALSE(zen5.stream_ragged_rows);
  for (const CpuKind kind : {CpuKind::kIntel, CpuKind::kZen4, CpuKind::kZen5})
    EXPECT_EQ(kernels::parse_cpu_kind(kernels::cpu_kind_name(kind)), kind);
  for (const char* bad : {"", "zen6", "Intel", "xeon"})
    EXPECT_THROW(
        {
          try {
            kernels::parse_cpu_kind(bad);
          } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("NORMLAB_ROW_TUNING must be intel, zen4 or zen5"),
                      std::string::npos);
            throw;
          }
        },
        Error)
        << bad;
  const kernels::RowTuning m = kernels::machine_row_tuning(),
                           k = kernels::row_tuning_for(kernels::machine_cpu_kind());
  EXPECT_EQ(m.long_rows_blocked, k.long_rows_blocked);
  EXPECT_EQ(m.prefetch_min_n, k.prefetch_min_n);
  EXPECT_EQ(m.batched_prefetch, k.batched_prefetch);
  EXPECT_EQ(m.batched_prefetch_fp32, k.batched_prefetch_fp32);
  EXPECT_EQ(m.backward_prefetch_min_n, k.backward_prefetch_min_n);
  EXPECT_EQ(m.rows_in_registers, k.rows_in_registers);
  EXPECT_EQ(m.register_prefetch_min_n, k.register_prefetch_min_n);
  EXPECT_EQ(m.stream_ragged_rows, k.stream_ragged_rows);
}

// The machine choices never change a bit: the row forward out of cache (streaming stores) with every
// prefetch choice on and with every one off gives the y, mean and rstd of the forward in cache, for rows of
// the eight-row blocks (D = 24, 32, 40, 64, 80, 128, 192; a last block of fewer rows; with rows_in_registers
// the fp32 LayerNorm at 64, 80, 128, 192 and 256 from registers, with and without their prefetch: every
// length on, none off; rows of 24 and 40, not whole vectors, with and without stream_ragged_rows), of the
// pipelined kernel (256, 512) and of the row blocks (2048), LayerNorm and RMSNorm, fp32 and bf16, on every
// SIMD target.
TEST(LayerNormLayouts, RowTuningKeepsTheBits) {
  std::mt19937_64 rng(43);
  const Isa saved = active_isa();
  kernels::RowTuning on = kernels::row_tuning_for(kernels::CpuKind::kZen5), off = on;
  on.prefetch_min_n = on.backward_prefetch_min_n = on.register_prefetch_min_n = 1;
  on.batched_prefetch = on.batched_prefetch_fp32 = on.rows_in_registers = on.stream_ragged_rows = true;
  off.prefetch_min_n = off.backward_prefetch_min_n = off.register_prefetch_min_n = Index{1} << 40;
  off.batched_prefetch = off.batched_prefetch_fp32 = off.rows_in_registers = off.stream_ragged_rows = false;
  for (const Index d : {Index{24}, Index{32}, Index{40}, Index{64}, Index{80}, Index{128}, Index{192},
                        Index{256}, Index{512}, kernels::kUnpipelinedMinN}) {
    const Index rows = d <= kernels::kBatchMaxN ? 45 : 5;
    const Tensor x = testing::random_tensor({rows, d}, rng, 2.0, 3.0),
                 w = testing::random_tensor({d}, rng, 1.0, 1.0),
                 b = testing::random_tensor({d}, rng, 0.5, 0.0);
    std::vector<bfloat16> x16(static_cast<std::size_t>(rows * d));
    for (std::size_t i = 0; i < x16.size(); ++i) x16[i] = bfloat16(x.data()[i]);
    for (const Isa isa : supported_isas()) {
      set_isa(isa);
      for (const bool center : {true, false}) {
        const std::string what = fmt::format("{} D={} center={}", isa_name(isa), d, center);
        // v = 0: in cache; 1: streaming with every prefetch; 2: streaming with none; also long_rows_blocked
        // on for 1 and off for 2.
        std::vector<float> y[3], mean[3], rstd[3];
        std::vector<bfloat16> y16[3];
        for (int v = 0; v < 3; ++v) {
          y[v].assign(static_cast<std::size_t>(rows * d), 0.0f);
          y16[v].assign(y[v].size(), bfloat16(0.0f));
          mean[v].assign(static_cast<std::size_t>(rows), 0.0f);
          rstd[v] = mean[v];
          kernels::RowsForward a = contiguous_rows(x.data(), rows, d, w.data(), b.data());
          a.center = center;
          a.stream = v > 0;
          a.tuning = v == 2 ? off : on;
          a.tuning.long_rows_blocked = v == 1;
          a.y = y[v].data();
          a.mean = mean[v].data();
          a.rstd = rstd[v].data();
          kernels::row_kernels().rows_forward(a);
          kernels::RowsForwardOf<bfloat16> a16 = contiguous_rows(x16.data(), rows, d, w.data(), b.data());
          a16.center = center;
          a16.stream = a.stream;
          a16.tuning = a.tuning;
          a16.y = y16[v].data();
          kernels::convert_kernels().rows_forward_bf16(a16);
        }
        for (int v = 1; v < 3; ++v) {
          EXPECT_EQ(std::memcmp(y[0].data(), y[v].data(), y[0].size() * sizeof(float)), 0)
              << what << " y " << v;
          EXPECT_EQ(std::memcmp(mean[0].data(), mean[v].data(), mean[0].size() * sizeof(float)), 0) << what;
          EXPECT_EQ(std::memcmp(rstd[0].data(), rstd[v].data(), rstd[0].size() * sizeof(float)), 0) << what;
          EXPECT_EQ(std::memcmp(y16[0].data(), y16[v].data(), y16[0].size() * sizeof(bfloat16)), 0)
              << what << " bf16 y " << v;
        }
      }
    }
  }
  set_isa(saved);
}

// One out-of-cache forward call of the register-kernel tests below and its outputs: y (kRows rows ld floats
// apart, filled with -7 beyond what the call writes), mean and rstd at a stride of 4, the saved double
// statistics. run() calls the active target's kernel on `a` with rows_in_registers as given, after checking
// that forward_in_registers says the same, and returns the arguments it called it with.
struct RegisterRowsOutputs {
  static constexpr Index kRows = 21, kPad = 16;  // rows kPad floats apart beyond their length
  // The calls' counts of rows: every count up to six (the register kernel's first and last rows of a call,
  // skewed, take their own steps) and all kRows.
  static constexpr Index kCounts[] = {1, 2, 3, 4, 5, 6, kRows};
  Index ld;
  std::vector<float> y, stats;
  double smean[kRows] = {}, srstd[kRows] = {};
  explicit RegisterRowsOutputs(Index d)
      : ld(d + kPad), y(static_cast<std::size_t>(kRows * ld), -7.0f), stats(4 * kRows, -7.0f) {}
  kernels::RowsForward run(kernels::RowsForward a, bool in_registers, const std::string& what) {
    a.stream = true;
    a.tuning.rows_in_registers = in_registers;
    EXPECT_EQ(kernels::forward_in_registers(a), in_registers) << what;
    a.y = y.data();
    a.mean = stats.data();
    a.rstd = stats.data() + 1;
    a.ld_stats = 4;
    a.smean = smean;
    a.srstd = srstd;
    kernels::row_kernels().rows_forward(a);
    return a;
  }
  // y's first `rows` rows (not the padding between them, which is the callers') and every statistic bitwise
  // those of o.
  void expect_same(const RegisterRowsOutputs& o, Index rows, Index d, const std::string& what) const {
    for (Index i = 0; i < rows; ++i)
      EXPECT_EQ(std::memcmp(o.y.data() + i * ld, y.data() + i * ld, d * sizeof(float)), 0)
          << what << " y row " << i;
    EXPECT_EQ(std::memcmp(o.stats.data(), stats.data(), stats.size() * sizeof(float)), 0) << what;
    EXPECT_EQ(std::memcmp(o.smean, smean, sizeof smean), 0) << what;
    EXPECT_EQ(std::memcmp(o.srstd, srstd, sizeof srstd), 0) << what;
  }
};

// Out of cache, where tuning.rows_in_registers says so (a Zen 5), fp32 LayerNorm rows of 64, 80, 128, 192 and
// 256 elements run from registers (kernels::forward_in_registers): the y, mean, rstd and saved double
// statistics of the eight-row blocks (at 256 the pipelined kernel) bit for bit, with and without γ and β,
// rows apart in memory, statistics at a stride, in place (y = x), every count of rows up to six (the first
// and last rows of the kernel's skewed stages) and 21, on every SIMD target. (The fused residual add on such
// rows: FusedAddInRegistersHasTheChunksBits below.)
TEST(LayerNormLayouts, ShortRowsOutOfCacheInRegistersHaveTheSameBits) {
  std::mt19937_64 rng(47);
  const Isa saved = active_isa();
  kernels::RowsForward p;
  p.rows = 3;
  p.stream = true;
  p.tuning.rows_in_registers = true;
  for (const Index d :
       {Index{32}, Index{64}, Index{80}, Index{96}, Index{128}, Index{192}, Index{256}, Index{320}}) {
    p.n = d;
    EXPECT_EQ(kernels::forward_in_registers(p), d == 64 || d == 80 || d == 128 || d == 192 || d == 256) << d;
  }
  p.n = 64;
  for (auto off :
       {&kernels::RowsForward::stream, &kernels::RowsForward::center, &kernels::RowsForward::x_cached}) {
    kernels::RowsForward q = p;
    q.*off = off == &kernels::RowsForward::x_cached;
    EXPECT_FALSE(kernels::forward_in_registers(q));
  }
  p.tuning.rows_in_registers = false;
  EXPECT_FALSE(kernels::forward_in_registers(p));
  kernels::RowsForwardOf<bfloat16> p16;
  p16.n = 64;
  p16.stream = true;
  p16.tuning.rows_in_registers = true;
  EXPECT_FALSE(kernels::forward_in_registers(p16));

  for (const Index d : {Index{64}, Index{80}, Index{128}, Index{192}, Index{256}}) {
    const Index rows = RegisterRowsOutputs::kRows, ld = d + RegisterRowsOutputs::kPad;
    const Tensor x = testing::random_tensor({rows, ld}, rng, 2.0, 3.0),
                 w = testing::random_tensor({d}, rng, 1.0, 1.0),
                 b = testing::random_tensor({d}, rng, 0.5, 0.0);
    for (const Isa isa : supported_isas()) {
      set_isa(isa);
      for (const int affine : {0, 1, 2, 3}) {
        const std::string what = fmt::format("{} D={} affine={}", isa_name(isa), d, affine);
        for (const Index m : RegisterRowsOutputs::kCounts) {
          // v = 0: the eight-row blocks (256: the pipelined kernel); 1: in registers; 2: in registers, in
          // place
          std::vector<RegisterRowsOutputs> out(3, RegisterRowsOutputs(d));
          for (int v = 0; v < 3; ++v) {
            if (v == 2) std::copy(x.data(), x.data() + rows * ld, out[v].y.begin());
            kernels::RowsForward a =
                contiguous_rows(v == 2 ? out[v].y.data() : x.data(), m, d, affine & 1 ? w.data() : nullptr,
                                affine & 2 ? b.data() : nullptr);
            a.ldx = a.ldy = ld;
            out[v].run(a, v > 0, what);
          }
          // (in place, the rows past m keep x)
          for (int v = 1; v < 3; ++v)
            out[v].expect_same(out[0], m, d, fmt::format("{} rows {} v {}", what, m, v));
        }
      }
    }
  }
  set_isa(saved);
}

// The fused residual add (RowsForward::r) on the rows from registers (kernels::forward_fuses_add): s, y,
// mean, rstd and the saved double statistics bitwise those of the chunks (rows_in_registers off: s formed,
// streamed and copied into the scratch, then the eight-row blocks on the copy; at D = 256 the pipelined
// kernel, which forms s row by row), with and without γ and β,
// rows apart in memory, s over x and over r, every count of rows up to six and 21, on every SIMD target.
TEST(LayerNormLayouts, FusedAddInRegistersHasTheChunksBits) {
  std::mt19937_64 rng(48);
  const Isa saved = active_isa();
  kernels::RowsForward p;
  p.n = 64;
  p.rows = 3;
  p.stream = true;
  p.tuning.rows_in_registers = true;
  EXPECT_TRUE(kernels::forward_fuses_add(p));
  p.tuning.rows_in_registers = false;
  EXPECT_FALSE(kernels::forward_fuses_add(p));
  p.n = 256;
  EXPECT_TRUE(kernels::forward_fuses_add(p));  // the pipelined kernel
  for (const Index d : {Index{64}, Index{80}, Index{128}, Index{192}, Index{256}}) {
    const Index rows = RegisterRowsOutputs::kRows, ld = d + RegisterRowsOutputs::kPad;
    const Tensor x = testing::random_tensor({rows, ld}, rng, 2.0, 3.0),
                 r = testing::random_tensor({rows, ld}, rng, 1.0, -1.0),
                 w = testing::random_tensor({d}, rng, 1.0, 1.0),
                 b = testing::random_tensor({d}, rng, 0.5, 0.0);
    std::vector<float> work(static_cast<std::size_t>(kernels::add_chunk_rows(d) * d));
    for (const Isa isa : supported_isas()) {
      set_isa(isa);
      for (const int affine : {0, 1, 2, 3}) {
        const std::string what = fmt::format("{} D={} affine={}", isa_name(isa), d, affine);
        for (const Index m : RegisterRowsOutputs::kCounts) {
          // v = 0: the chunks (at D = 256 the pipelined kernel's fused add); 1: in registers; 2: in
          // registers, s over x; 3: in registers, s over r
          std::vector<RegisterRowsOutputs> out(4, RegisterRowsOutputs(d));
          std::vector<float> sv[4];
          for (int v = 0; v < 4; ++v) {
            std::vector<float> xv(x.data(), x.data() + rows * ld), rv(r.data(), r.data() + rows * ld);
            sv[v].assign(xv.size(), -7.0f);
            kernels::RowsForward a = contiguous_rows(xv.data(), m, d, affine & 1 ? w.data() : nullptr,
                                                     affine & 2 ? b.data() : nullptr);
            a.ldx = a.ldy = a.ldr = a.lds = ld;
            a.r = rv.data();
            a.s = v == 2 ? xv.data() : v == 3 ? rv.data() : sv[v].data();
            a.work = work.data();
            const kernels::RowsForward called = out[v].run(a, v > 0, what);
            EXPECT_EQ(kernels::forward_fuses_add(called), v > 0 || d == 256) << what;
            if (v == 2) sv[v] = xv;
            if (v == 3) sv[v] = rv;
          }
          for (int v = 1; v < 4; ++v) {
            out[v].expect_same(out[0], m, d, fmt::format("{} rows {} v {}", what, m, v));
            for (Index i = 0; i < m; ++i)
              EXPECT_EQ(std::memcmp(sv[0].data() + i * ld, sv[v].data() + i * ld, d * sizeof(float)), 0)
                  << what << " s row " << i << " v " << v;
          }
          // s is x + r in float.
          for (Index i = 0; i < m; ++i)
            for (Index j = 0; j < d; ++j)
              ASSERT_EQ(sv[1][static_cast<std::size_t>(i * ld + j)],
                        x.data()[i * ld + j] + r.data()[i * ld + j])
                  << what;
        }
      }
    }
  }
  set_isa(saved);
}

// Out of cache (streaming stores) the backward of rows from kBatchStreamMaxN to kBatchMaxN takes the groups
// of four rows instead of the eight-row blocks (kernels::backward_batched): the same dx and dγ/dβ partials
// bit for bit, from saved statistics and recomputing them, LayerNorm and RMSNorm, on every SIMD target.
TEST(LayerNormLayouts, ShortRowsOutOfCacheTakeTheRowGroupsWithTheSameBits) {
  std::mt19937_64 rng(37);
  const Isa saved = active_isa();
  kernels::RowsBackward c;
  c.rows = 2;
  for (const Index d : {Index{1}, Index{64}, Index{80}, kernels::kBatchStreamMaxN, Index{256},
                        kernels::kBatchMaxN, kernels::kBatchMaxN + 1}) {
    c.n = d;
    c.stream = false;
    EXPECT_EQ(kernels::backward_batched(c), d <= kernels::kBatchMaxN) << d;
    c.stream = true;
    EXPECT_EQ(kernels::backward_batched(c), d < kernels::kBatchStreamMaxN) << d;
  }
  c.rows = 1;
  c.stream = false;
  c.n = 64;
  EXPECT_FALSE(kernels::backward_batched(c));  // one row: the group kernel
  for (const Index d : {Index{96}, Index{256}, Index{333}}) {
    constexpr Index kRows = 13;  // three blocks of eight rows and groups of four, each with a short last one
    const Tensor x = testing::random_tensor({kRows, d}, rng, 2.0, 3.0),
                 dy = testing::random_tensor({kRows, d}, rng, 1.0, 0.0),
                 w = testing::random_tensor({d}, rng, 1.0, 1.0);
    for (const bool center : {true, false}) {
      // The forward's saved double statistics.
      kernels::RowsForward f = contiguous_rows(x.data(), kRows, d, w.data(), nullptr);
      Tensor y({kRows, d});
      double smean[kRows], srstd[kRows];
      f.y = y.data();
      f.center = center;
      f.smean = center ? smean : nullptr;
      f.srstd = srstd;
      kernels::row_kernels().rows_forward(f);
      for (const bool with_saved : {false, true}) {
        for (const Isa isa : supported_isas()) {
          set_isa(isa);
          const std::string what =
              fmt::format("{} D={} {} {}", isa_name(isa), d, center ? "LayerNorm" : "RMSNorm",
                          with_saved ? "saved" : "recomputing");
          Tensor dx[2] = {Tensor({kRows, d}), Tensor({kRows, d})};
          std::vector<double> dw[2], db[2];
          for (int v = 0; v < 2; ++v) {
            kernels::RowsBackward a =
                backward_rows(dx[v].data(), dw[v], db[v], dy.data(), x.data(), w.data(), kRows, d, center,
                              with_saved && center ? smean : nullptr, with_saved ? srstd : nullptr);
            a.stream = v == 1;
            ASSERT_EQ(kernels::backward_batched(a), v == 0) << what;
            kernels::row_kernels().rows_backward(a);
          }
          EXPECT_TRUE(bitwise_equal(dx[0].cview(), dx[1].cview(), what + " dx"));
          EXPECT_EQ(std::memcmp(dw[0].data(), dw[1].data(), dw[0].size() * sizeof(double)), 0)
              << what << " dγ";
          EXPECT_EQ(std::memcmp(db[0].data(), db[1].data(), db[0].size() * sizeof(double)), 0)
              << what << " dβ";
        }
        set_isa(saved);
      }
    }
  }
}

// Out of cache, rows that are not whole 16-element vectors (24 and 40: the eight-row backward; 100: the
// groups of four) write dx with streaming stores where tuning.stream_ragged_rows says so
// (kernels::stream_rows: not on a Zen 5) and with ordinary ones otherwise: the dx, dγ and dβ of the backward
// in cache bit for bit either way, LayerNorm and RMSNorm, recomputing and from the forward's saved
// statistics, on every SIMD target. Rows of whole vectors stream whatever the choice.
TEST(LayerNormLayouts, RaggedRowsOutOfCacheKeepTheBits) {
  kernels::RowsBackward c;
  c.n = 64;
  c.stream = true;
  c.tuning.stream_ragged_rows = false;
  EXPECT_TRUE(kernels::stream_rows(c));
  c.n = 24;
  EXPECT_FALSE(kernels::stream_rows(c));
  c.tuning.stream_ragged_rows = true;
  EXPECT_TRUE(kernels::stream_rows(c));
  c.stream = false;
  EXPECT_FALSE(kernels::stream_rows(c));
  std::mt19937_64 rng(53);
  const Isa saved = active_isa();
  for (const Index d : {Index{24}, Index{40}, Index{100}}) {
    constexpr Index kRows = 21;  // rows starting on and off 64-byte boundaries; short last blocks and groups
    const Tensor x = testing::random_tensor({kRows, d}, rng, 2.0, 3.0),
                 dy = testing::random_tensor({kRows, d}, rng, 1.0, 0.0),
                 w = testing::random_tensor({d}, rng, 1.0, 1.0);
    for (const bool center : {true, false}) {
      kernels::RowsForward f = contiguous_rows(x.data(), kRows, d, w.data(), nullptr);
      Tensor y({kRows, d});
      double smean[kRows], srstd[kRows];
      f.y = y.data();
      f.center = center;
      f.smean = center ? smean : nullptr;
      f.srstd = srstd;
      kernels::row_kernels().rows_forward(f);
      for (const bool with_saved : {false, true}) {
        for (const Isa isa : supported_isas()) {
          set_isa(isa);
          const std::string what =
              fmt::format("{} D={} {} {}", isa_name(isa), d, center ? "LayerNorm" : "RMSNorm",
                          with_saved ? "saved" : "recomputing");
          // v = 0: in cache; 1: out of cache, ragged rows streamed; 2: out of cache, ordinary stores
          Tensor dx[3] = {Tensor({kRows, d}), Tensor({kRows, d}), Tensor({kRows, d})};
          std::vector<double> dw[3], db[3];
          for (int v = 0; v < 3; ++v) {
            kernels::RowsBackward a =
                backward_rows(dx[v].data(), dw[v], db[v], dy.data(), x.data(), w.data(), kRows, d, center,
                              with_saved && center ? smean : nullptr, with_saved ? srstd : nullptr);
            a.stream = v > 0;
            a.tuning.stream_ragged_rows = v == 1;
            ASSERT_EQ(kernels::stream_rows(a), v == 1) << what;
            kernels::row_kernels().rows_backward(a);
          }
          for (int v = 1; v < 3; ++v) {
            EXPECT_TRUE(bitwise_equal(dx[0].cview(), dx[v].cview(), fmt::format("{} dx {}", what, v)));
            EXPECT_EQ(std::memcmp(dw[0].data(), dw[v].data(), dw[0].size() * sizeof(double)), 0)
                << what << " dγ " << v;
            EXPECT_EQ(std::memcmp(db[0].data(), db[v].data(), db[0].size() * sizeof(double)), 0)
                << what << " dβ " << v;
          }
        }
        set_isa(saved);
      }
    }
  }
}

// Kept axes in another order than memory's: a [B, T, C] view of [T, B, C] memory normalized over C. The
// engine visits the groups in memory order (row_norm.cpp, Runs), so y, dx and dγ/dβ have the bits of the
// same calls on the memory's own [T, B, C] layout; mean and rstd land in their own [B, T] layout and
// NormStats holds the statistics by group number. With B not a multiple of four (the kernels' row groups)
// and rows from one element to several vectors; LayerNorm and RMSNorm; 1 and 3 threads; the backward
// recomputing the statistics and from NormStats.
TEST(LayerNormLayouts, PermutedKeptAxesGiveTheBitsOfTheMemoryLayout) {
  std::mt19937_64 rng(41);
  const int saved_threads = num_threads();
  constexpr Index T = 37, B = 6;
  const int bt[3] = {1, 0, 2};
  for (const Index c : {Index{1}, Index{7}, Index{80}, Index{300}}) {
    const Tensor x = testing::random_tensor({T, B, c}, rng, 2.0, 1.0),
                 dy = testing::random_tensor({T, B, c}, rng, 1.0, 0.0);
    const Tensor w = testing::random_tensor({c}, rng, 1.0, 1.0),
                 b = testing::random_tensor({c}, rng, 1.0, 0.0);
    const ConstView xp = x.cview().permute(bt), dyp = dy.cview().permute(bt);
    for (const bool center : {true, false}) {
      for (const int threads : {1, 3}) {
        set_num_threads(threads);
        const std::string what =
            fmt::format("{} C={} {} threads", center ? "LayerNorm" : "RMSNorm", c, threads);
        Tensor y0({T, B, c}), m0({T, B}), r0({T, B}), y1({T, B, c}), m1({B, T}), r1({B, T});
        NormStats s0, s1;
        if (center) {
          layer_norm_forward(y0.view(), m0.view(), r0.view(), x.cview(), w.cview(), b.cview(), {2}, 1e-5,
                             &s0);
          layer_norm_forward(y1.view().permute(bt), m1.view(), r1.view(), xp, w.cview(), b.cview(), {2}, 1e-5,
                             &s1);
          EXPECT_TRUE(bitwise_equal(m1.cview(), m0.cview().permute({1, 0}), what + " mean"));
        } else {
          rms_norm_forward(y0.view(), r0.view(), x.cview(), w.cview(), {2}, 1e-5, &s0);
          rms_norm_forward(y1.view().permute(bt), r1.view(), xp, w.cview(), {2}, 1e-5, &s1);
        }
        EXPECT_TRUE(bitwise_equal(y1.cview(), y0.cview(), what + " y"));
        EXPECT_TRUE(bitwise_equal(r1.cview(), r0.cview().permute({1, 0}), what + " rstd"));
        bool stats_equal = true;
        for (Index i = 0; i < B; ++i) {
          for (Index t = 0; t < T; ++t) {
            const std::size_t g1 = static_cast<std::size_t>(i * T + t),
                              g0 = static_cast<std::size_t>(t * B + i);
            stats_equal =
                stats_equal && s1.rstd[g1] == s0.rstd[g0] && (!center || s1.mean[g1] == s0.mean[g0]);
          }
        }
        EXPECT_TRUE(stats_equal) << what << " NormStats";
        for (const bool from_saved : {false, true}) {
          Tensor dx0({T, B, c}), dx1({T, B, c}), dw0({c}), dw1({c}), db0({c}), db1({c});
          if (center && from_saved) {
            layer_norm_backward_saved(dx0.view(), dw0.view(), db0.view(), dy.cview(), x.cview(), w.cview(),
                                      s0);
            layer_norm_backward_saved(dx1.view().permute(bt), dw1.view(), db1.view(), dyp, xp, w.cview(), s1);
          } else if (center) {
            layer_norm_backward(dx0.view(), dw0.view(), db0.view(), dy.cview(), x.cview(), w.cview(), {2},
                                1e-5);
            layer_norm_backward(dx1.view().permute(bt), dw1.view(), db1.view(), dyp, xp, w.cview(), {2},
                                1e-5);
          } else if (from_saved) {
            rms_norm_backward_saved(dx0.view(), dw0.view(), dy.cview(), x.cview(), w.cview(), s0);
            rms_norm_backward_saved(dx1.view().permute(bt), dw1.view(), dyp, xp, w.cview(), s1);
          } else {
            rms_norm_backward(dx0.view(), dw0.view(), dy.cview(), x.cview(), w.cview(), {2}, 1e-5);
            rms_norm_backward(dx1.view().permute(bt), dw1.view(), dyp, xp, w.cview(), {2}, 1e-5);
          }
          const std::string tag = what + (from_saved ? " from NormStats" : " recomputing");
          EXPECT_TRUE(bitwise_equal(dx1.cview(), dx0.cview(), tag + " dx"));
          EXPECT_TRUE(bitwise_equal(dw1.cview(), dw0.cview(), tag + " dγ"));
          if (center) {
            EXPECT_TRUE(bitwise_equal(db1.cview(), db0.cview(), tag + " dβ"));
          }
        }
      }
    }
  }
  set_num_threads(saved_threads);
}

// ---- aliasing, NaN policy -----------------------------------------------------------------------

TEST(LayerNormAliasing, InPlaceEqualsOutOfPlace) {
  std::mt19937_64 rng(13);
  Tensor x = testing::random_tensor({5, 3, 17}, rng, 1.0, 0.0);
  for (const Axes& axes : {Axes{2}, Axes{1}}) {
    Fwd f = run_forward(x.cview(), {}, {}, axes, 1e-5);
    Tensor inplace = x.clone();
    layer_norm_forward(inplace.view(), {}, {}, inplace.cview(), {}, {}, axes, 1e-5);
    EXPECT_TRUE(bitwise_equal(inplace.cview(), f.y.cview(), "in place"));
  }
}

// The same on the eight-row kernels (D = 64, 80, 128; 100 without a compile-time length), with blocks enough
// that a block's outputs are written in the step where the next blocks' statistics passes read their rows
// (row_kernels-inl.h, rows_forward_batched), LayerNorm and RMSNorm with γ and β, on every target.
TEST(LayerNormAliasing, InPlaceOnRowBlocksEqualsOutOfPlace) {
  std::mt19937_64 rng(15);
  const Isa saved = active_isa();
  for (Isa isa : supported_isas()) {
    set_isa(isa);
    for (Index d : {64, 80, 100, 128}) {
      const Index rows = 41;
      const Tensor x = testing::random_tensor({rows, d}, rng, 1.0, 0.5);
      const Tensor w = testing::random_tensor({d}, rng, 1.0, 1.0),
                   b = testing::random_tensor({d}, rng, 0.5, 0.0);
      const std::string what = fmt::format("{} D={}", isa_name(isa), d);
      Fwd f = run_forward(x.cview(), w.cview(), b.cview(), {1}, 1e-5);
      Tensor inplace = x.clone();
      layer_norm_forward(inplace.view(), {}, {}, inplace.cview(), w.cview(), b.cview(), {1}, 1e-5);
      EXPECT_TRUE(bitwise_equal(inplace.cview(), f.y.cview(), what + " LayerNorm in place"));
      Tensor rms_y({rows, d}), rms_r({rows});
      rms_norm_forward(rms_y.view(), rms_r.view(), x.cview(), w.cview(), {1}, 1e-5);
      Tensor rms_inplace = x.clone();
      rms_norm_forward(rms_inplace.view(), {}, rms_inplace.cview(), w.cview(), {1}, 1e-5);
      EXPECT_TRUE(bitwise_equal(rms_inplace.cview(), rms_y.cview(), what + " RMSNorm in place"));
    }
  }
  set_isa(saved);
}

// γ and β are read in place when contiguous; an output that overlaps them (y written over the buffer
// that holds γ) must still see the γ of the call, as with a copy.
TEST(LayerNormAliasing, OutputOverWeightSeesTheWeightOfTheCall) {
  std::mt19937_64 rng(14);
  for (Index d : {5, 64, 80}) {
    Tensor x = testing::random_tensor({3, d}, rng, 1.0, 0.0);
    Tensor buf = testing::random_tensor({3, d}, rng, 1.0, 1.0);  // row 1 holds γ
    const Tensor w = Tensor::copy_of(buf.cview().select(0, 1));
    Fwd expect = run_forward(x.cview(), w.cview(), w.cview(), {1}, 1e-5);
    Tensor mean({3}), rstd({3});
    layer_norm_forward(buf.view(), mean.view(), rstd.view(), x.cview(), buf.cview().select(0, 1),
                       buf.cview().select(0, 1), {1}, 1e-5);
    EXPECT_TRUE(bitwise_equal(buf.cview(), expect.y.cview(), fmt::format("D={} y over γ", d)));
    Tensor dy = testing::random_tensor({3, d}, rng, 1.0, 0.0), dbuf = testing::random_tensor({3, d}, rng, 1.0, 1.0);
    const Tensor w2 = Tensor::copy_of(dbuf.cview().select(0, 2));
    Bwd expect_b = run_backward(dy.cview(), x.cview(), w2.cview(), {1}, 1e-5);
    layer_norm_backward(dbuf.view(), {}, {}, dy.cview(), x.cview(), dbuf.cview().select(0, 2), {1}, 1e-5);
    EXPECT_TRUE(bitwise_equal(dbuf.cview(), expect_b.dx.cview(), fmt::format("D={} dx over γ", d)));
  }
}

TEST(LayerNormNaN, NaNStaysInItsGroup) {
  Tensor x({3, 4}, {1, 2, 3, 4, 1, NAN, 3, 4, 5, 6, 7, 8});
  Fwd f = run_forward(x.cview(), {}, {}, {1}, 1e-5);
  for (Index j = 0; j < 4; ++j) {
    EXPECT_FALSE(std::isnan(f.y[j]));
    EXPECT_TRUE(std::isnan(f.y[4 + j]));
    EXPECT_FALSE(std::isnan(f.y[8 + j]));
  }
  EXPECT_TRUE(std::isnan(f.mean[1]));
}

TEST(LayerNormNaN, ConstantGroupWithZeroEpsIsNaNLikePyTorch) {
  Tensor x({1, 3}, {2, 2, 2});
  Fwd f = run_forward(x.cview(), {}, {}, {1}, 0.0);
  EXPECT_TRUE(std::isinf(f.rstd[0]));
  EXPECT_TRUE(std::isnan(f.y[0]));
  Fwd g = run_forward(x.cview(), {}, {}, {1}, 1e-5);
  EXPECT_EQ(g.y[0], 0.0f);
}

// ---- bad input ----------------------------------------------------------------------------------

TEST(LayerNormErrors, BadInputGetsClearMessages) {
  Tensor x({2, 3}), y({2, 3}), m({2}), r({2}), w({3}), wbad({2}), empty({0, 3}), yempty({0, 3});
  auto fwd = [&](const Axes& axes, double eps = 1e-5, ConstView weight = {}) {
    layer_norm_forward(y.view(), {}, {}, x.cview(), weight, {}, axes, eps);
  };
  EXPECT_NL_ERROR(fwd({2}), "axis 2 is out of range");
  EXPECT_NL_ERROR(fwd({-3}), "axis -3 is out of range");
  EXPECT_NL_ERROR(fwd({1, -1}), "axis 1 is given twice");
  EXPECT_NL_ERROR(fwd({}), "no axes");
  EXPECT_NL_ERROR(fwd({1}, -1e-5), "eps must be finite and ≥ 0");
  EXPECT_NL_ERROR(fwd({1}, NAN), "eps must be finite");
  EXPECT_NL_ERROR(fwd({1}, 1e-5, wbad.cview()), "weight has shape [2] but [3] is expected");
  EXPECT_NL_ERROR(layer_norm_forward(yempty.view(), {}, {}, empty.cview(), {}, {}, {1}), "x is empty");
  EXPECT_NL_ERROR(layer_norm_forward(y.view(), r.view(), {}, x.cview(), {}, {}, {0}), "mean has shape [2] but [3]");
  Tensor y_wrong({3, 2});
  EXPECT_NL_ERROR(layer_norm_forward(y_wrong.view(), {}, {}, x.cview(), {}, {}, {1}), "y has shape [3, 2]");
  // A broadcast (stride-0) output and a partially overlapping output.
  View bcast(y.data(), {2, 3}, {0, 1});
  EXPECT_NL_ERROR(layer_norm_forward(bcast, {}, {}, x.cview(), {}, {}, {1}), "stride 0");
  Tensor big({4, 3});
  View shifted(big.data() + 3, {2, 3});
  EXPECT_NL_ERROR(layer_norm_forward(shifted, {}, {}, big.cview().slice(0, 0, 2), {}, {}, {1}), "overlaps input x");
  // Backward.
  Tensor dx({2, 3}), dy({2, 3}), dy_bad({2, 4});
  EXPECT_NL_ERROR(layer_norm_backward(dx.view(), {}, {}, dy_bad.cview(), x.cview(), {}, {1}), "dy has shape [2, 4]");
  EXPECT_NL_ERROR(layer_norm_backward(dx.view(), wbad.view(), {}, dy.cview(), x.cview(), {}, {1}),
                  "dweight has shape [2] but [3]");
  EXPECT_NL_ERROR(layer_norm_backward(dx.view(), {}, {}, dy.cview(), x.cview(), wbad.cview(), {1}),
                  "weight has shape [2] but [3]");
  EXPECT_NL_ERROR(layer_norm_backward(dx.view(), {}, {}, dy.cview(), x.cview(), {}, {1}, -1.0), "eps");
  EXPECT_NL_ERROR(layer_norm_backward(shifted, {}, {}, big.cview().slice(0, 0, 2), x.cview(), {}, {1}),
                  "output dx overlaps input dy");
}

}  // namespace
}  // namespace normlab
