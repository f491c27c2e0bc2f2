// RMSNorm over any axes: a hand-computed case, the float64 reference on swept layouts, float64 finite
// differences, determinism, defaults and bad input.
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/reference.h>
#include <normlab/simd.h>
#include <fmt/format.h>

#include <cfloat>
#include <cmath>
#include <random>

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

TEST(RmsNorm, HandComputedRow) {
  // rms of (3, 4) = sqrt((9 + 16)/2) = sqrt(12.5); with eps 0: y = (3, 4)/sqrt(12.5).
  Tensor x({1, 2}, {3, 4}), y({1, 2}), rstd({1});
  rms_norm_forward(y.view(), rstd.view(), x.cview(), {}, {1}, 0.0);
  EXPECT_FLOAT_EQ(rstd[0], static_cast<float>(1 / std::sqrt(12.5)));
  EXPECT_FLOAT_EQ(y[0], static_cast<float>(3 / std::sqrt(12.5)));
  EXPECT_FLOAT_EQ(y[1], static_cast<float>(4 / std::sqrt(12.5)));
  // Unlike LayerNorm, a constant row is not centred: (2, 2) → (1, 1).
  Tensor c({1, 2}, {2, 2});
  rms_norm_forward(y.view(), {}, c.cview(), {}, {1}, 0.0);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 1.0f);
}

TEST(RmsNorm, DefaultsArePinned) {
  EXPECT_EQ(kRmsNormEps, 1e-6);
  EXPECT_EQ(kTorchRmsNormEps, static_cast<double>(FLT_EPSILON));
}

TEST(RmsNorm, MatchesFloat64ReferenceOnLayouts) {
  std::mt19937_64 rng(21);
  for (int i = 0; i < 60; ++i) {
    const Index a = 1 + static_cast<Index>(rng() % 9), b = 1 + static_cast<Index>(rng() % 40),
                c = 1 + static_cast<Index>(rng() % 7);
    Tensor parent = testing::random_tensor({a, b + 1, c}, rng, 2.0, 0.5);
    ConstView x = parent.cview().slice(1, 1, b + 1);
    if (i % 2) x = x.permute({2, 0, 1});
    const Axes axes = i % 3 == 0 ? Axes{1} : i % 3 == 1 ? Axes{-1} : Axes{0, 2};
    const Dims ns = normalized_shape(x.shape(), axes);
    Tensor w = testing::random_tensor(ns, rng, 0.5, 1.0);
    const double eps = i % 4 ? kRmsNormEps : 0.0;
    SCOPED_TRACE(fmt::format("case {}: shape {} axes [{}]", i, x.shape().str(), fmt::join(axes, ",")));
    Tensor y(x.shape()), rstd(kept_shape(x.shape(), axes));
    rms_norm_forward(y.view(), rstd.view(), x, w.cview(), axes, eps);
    ref::LayerNormOut r = ref::rms_norm_forward(x, w.cview(), axes, eps);
    ASSERT_TRUE(all_close(y.cview(), r.y, Tol{4, 1}, "y"));
    ASSERT_TRUE(all_close(rstd.cview(), r.rstd, Tol{2, 1e-30}, "rstd"));
    Tensor dy = testing::random_tensor(x.shape(), rng, 1.0, 0.0), dx(x.shape()), dw(ns);
    rms_norm_backward(dx.view(), dw.view(), dy.cview(), x, w.cview(), axes, eps);
    ref::LayerNormGrads g = ref::rms_norm_backward(dy.cview(), x, w.cview(), axes, eps);
    // dx in float from O(rstd·|g|) terms that cancel (docs/numerics.md): scale rstd·|dy|·|γ|.
    ASSERT_TRUE(all_close(dx.cview(), g.dx, Tol{16, dx_scale(g.dx, r.rstd, dy.cview(), w.cview())}, "dx"));
    ASSERT_TRUE(all_close(dw.cview(), g.dweight, Tol{4, max_abs(g.dweight)}, "dweight"));
  }
}

TEST(RmsNorm, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(22);
  const Axes axes{0, 2};
  ref::DTensor x = testing::random_dtensor({3, 2, 4}, rng, 1.0, 0.3);
  ref::DTensor w = testing::random_dtensor({3, 4}, rng, 0.5, 1.0);
  ref::DTensor r = testing::random_dtensor({3, 2, 4}, rng, 1.0, 0.0);
  const double eps = 1e-6, h = 1e-6;
  auto loss = [&]() {
    ref::LayerNormOut o = ref::rms_norm_forward(x.view(), w.view(), axes, eps);
    double s = 0;
    for (Index i = 0; i < o.y.numel(); ++i) s += o.y[i] * r[i];
    return s;
  };
  ref::LayerNormGrads g = ref::rms_norm_backward(r.view(), x.view(), w.view(), axes, eps);
  for (ref::DTensor* p : {&x, &w}) {
    const ref::DTensor& grad = p == &x ? g.dx : g.dweight;
    for (Index i = 0; i < p->numel(); ++i) {
      const double fd = testing::central_difference((*p)[i], loss, h);
      EXPECT_NEAR(grad[i], fd, 1e-7 * std::max(1.0, std::fabs(fd))) << (p == &x ? "dx" : "dweight") << i;
    }
  }
}

TEST(RmsNorm, SameBitsForOneTwoAndThreeThreads) {
  std::mt19937_64 rng(23);
  Tensor x = testing::random_tensor({500, 80}, rng, 1.0, 0.0), dy = testing::random_tensor({500, 80}, rng, 1.0, 0.0);
  const int saved = num_threads();
  std::vector<Tensor> ys, dxs, dws;
  for (int t : {1, 2, 3}) {
    set_num_threads(t);
    ys.emplace_back(Dims{500, 80});
    dxs.emplace_back(Dims{500, 80});
    dws.emplace_back(Dims{80});
    rms_norm_forward(ys.back().view(), {}, x.cview(), {}, {1});
    rms_norm_backward(dxs.back().view(), dws.back().view(), dy.cview(), x.cview(), {}, {1});
  }
  set_num_threads(saved);
  for (int i = 1; i < 3; ++i) {
    EXPECT_TRUE(bitwise_equal(ys[0].cview(), ys[static_cast<std::size_t>(i)].cview(), "y"));
    EXPECT_TRUE(bitwise_equal(dxs[0].cview(), dxs[static_cast<std::size_t>(i)].cview(), "dx"));
    EXPECT_TRUE(bitwise_equal(dws[0].cview(), dws[static_cast<std::size_t>(i)].cview(), "dweight"));
  }
}

// Every SIMD target gives the same bits (the fused row kernels, simd/vec.h), for row lengths around the
// vector width and the 64-element block of the second pass, and row counts that leave partial blocks.
TEST(RmsNorm, SameBitsOnEverySimdTarget) {
  std::mt19937_64 rng(24);
  for (Index d : {1, 7, 16, 33, 64, 80, 129, 256, 1029}) {
    const Index rows = 37;
    Tensor x = testing::random_tensor({rows, d}, rng, 1.0, 0.3), dy = testing::random_tensor({rows, d}, rng, 1.0, 0.0);
    Tensor w = testing::random_tensor({d}, rng, 1.0, 1.0);
    const Isa saved = active_isa();
    std::vector<Tensor> ys, rs, dxs, dws;
    for (Isa isa : supported_isas()) {
      set_isa(isa);
      ys.emplace_back(Dims{rows, d});
      rs.emplace_back(Dims{rows});
      dxs.emplace_back(Dims{rows, d});
      dws.emplace_back(Dims{d});
      rms_norm_forward(ys.back().view(), rs.back().view(), x.cview(), w.cview(), {1});
      rms_norm_backward(dxs.back().view(), dws.back().view(), dy.cview(), x.cview(), w.cview(), {1});
    }
    set_isa(saved);
    for (std::size_t i = 1; i < ys.size(); ++i) {
      const std::string what = fmt::format("D={} {}", d, isa_name(supported_isas()[i]));
      EXPECT_TRUE(bitwise_equal(ys[0].cview(), ys[i].cview(), what + " y"));
      EXPECT_TRUE(bitwise_equal(rs[0].cview(), rs[i].cview(), what + " rstd"));
      EXPECT_TRUE(bitwise_equal(dxs[0].cview(), dxs[i].cview(), what + " dx"));
      EXPECT_TRUE(bitwise_equal(dws[0].cview(), dws[i].cview(), what + " dweight"));
    }
  }
}

TEST(RmsNorm, BadInputGetsClearMessages) {
  Tensor x({2, 3}), y({2, 3}), w({2}), empty({0, 3});
  EXPECT_NL_ERROR(rms_norm_forward(y.view(), {}, x.cview(), {}, {3}), "rms_norm_forward: axis 3 is out of range");
  EXPECT_NL_ERROR(rms_norm_forward(y.view(), {}, x.cview(), w.cview(), {1}), "weight has shape [2] but [3]");
  EXPECT_NL_ERROR(rms_norm_forward(y.view(), {}, x.cview(), {}, {1}, -1.0), "eps must be finite and ≥ 0");
  EXPECT_NL_ERROR(rms_norm_forward(y.view(), {}, empty.cview(), {}, {1}), "x is empty");
  Tensor dx({2, 3}), dy({2, 3});
  EXPECT_NL_ERROR(rms_norm_backward(dx.view(), w.view(), dy.cview(), x.cview(), {}, {1}), "dweight has shape [2]");
}

}  // namespace
}  // namespace normlab
