// ChannelNormStats: the double statistics an InstanceNorm / GroupNorm forward keeps for its backward. The
// backward that takes them must return bitwise what the backward that recomputes them returns (dx, dγ, dβ)
// on every SIMD target and thread count and every route of the channel-norm engine (sample rows, sample runs
// sixteen segments at a time and one by one, the segment path with gathers, masked InstanceNorm, GroupNorm
// as LayerNorm rows); the forward with them must not change y, save_mean or save_rstd; the kept values are
// the double statistics (hand case, float64 reference) and the backward really takes them where it says it
// does; misuse is an error.
#include <fmt/format.h>
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/reference.h>
#include <normlab/simd.h>

#include <cfloat>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/random.h"
#include "support/tolerance.h"

namespace normlab {
namespace {

using testing::bitwise_equal;
using Lengths = std::vector<Index>;

struct Grads {
  Tensor dx, dw, db;
};

// One case: InstanceNorm (groups 0) or GroupNorm, its options, and a way to view the operands.
struct Case {
  Dims shape;
  int groups;        // 0: InstanceNorm
  int channel_axis;  // as given to the op
  Lengths lengths;   // InstanceNorm over the last axis
  bool strided;      // x, dy, dx as views of a transposed parent (the segment path with gathers)
  double eps;
  Case(Dims s, int g = 0, int axis = 1, Lengths len = {}, bool st = false, double e = 1e-5)
      : shape(s), groups(g), channel_axis(axis), lengths(std::move(len)), strided(st), eps(e) {}
  std::string str() const {
    return fmt::format("{} {}{}{}{}", groups ? fmt::format("GroupNorm({})", groups) : "InstanceNorm",
                       shape.str(), channel_axis != 1 ? fmt::format(" channel axis {}", channel_axis) : "",
                       lengths.empty() ? "" : " masked", strided ? " strided" : "");
  }
};

// An operand of the case's shape: contiguous, or (strided) the last two axes of a contiguous parent seen
// transposed; `parent` keeps the storage.
View operand(const Case& c, Tensor& parent, std::mt19937_64& rng, double scale, double offset) {
  if (!c.strided) {
    parent = testing::random_tensor(c.shape, rng, scale, offset);
    return parent.view();
  }
  Dims ps = c.shape;
  std::swap(ps[ps.size() - 1], ps[ps.size() - 2]);
  parent = testing::random_tensor(ps, rng, scale, offset);
  return parent.view().transpose(ps.size() - 1, ps.size() - 2);
}

Dims stats_shape(const Case& c) {
  return c.groups ? group_stats_shape(c.shape, c.groups, c.channel_axis)
                  : instance_stats_shape(c.shape, c.channel_axis);
}

// The forward with stats: y, save_mean, save_rstd bitwise those of the forward without; returns the stats.
ChannelNormStats forward_keeping(const Case& c, ConstView x, ConstView w, ConstView b,
                                 const std::string& what) {
  const Dims ss = stats_shape(c);
  Tensor y0(c.shape), m0(ss), r0(ss), y1(c.shape), m1(ss), r1(ss);
  ChannelNormStats st;
  if (c.groups) {
    const GroupNormOptions opt{c.channel_axis, c.eps};
    group_norm_forward(y0.view(), m0.view(), r0.view(), x, w, b, c.groups, opt);
    group_norm_forward(y1.view(), m1.view(), r1.view(), x, w, b, c.groups, opt, &st);
  } else {
    const InstanceNormOptions opt{c.channel_axis, c.eps, -1};
    instance_norm_forward(y0.view(), m0.view(), r0.view(), x, w, b, c.lengths, opt);
    instance_norm_forward(y1.view(), m1.view(), r1.view(), x, w, b, c.lengths, opt, &st);
  }
  EXPECT_TRUE(bitwise_equal(y0.cview(), y1.cview(), what + " y"));
  EXPECT_TRUE(bitwise_equal(m0.cview(), m1.cview(), what + " save_mean"));
  EXPECT_TRUE(bitwise_equal(r0.cview(), r1.cview(), what + " save_rstd"));
  // save_mean and save_rstd are the kept values rounded to float.
  EXPECT_EQ(st.mean.size(), static_cast<std::size_t>(m1.numel())) << what;
  EXPECT_EQ(st.rstd.size(), static_cast<std::size_t>(r1.numel())) << what;
  for (Index i = 0; i < m1.numel() && i < static_cast<Index>(st.mean.size()); ++i) {
    const float m = static_cast<float>(st.mean[static_cast<std::size_t>(i)]);
    EXPECT_TRUE(m1[i] == m || (std::isnan(m1[i]) && std::isnan(m))) << what << " mean " << i;
  }
  return st;
}

// The backward into dx (a view like x's, of the case's layout), with or without stats.
Grads backward(const Case& c, View dx, ConstView dy, ConstView x, ConstView w, const ChannelNormStats* st,
               GradMode mode, Tensor* dw0 = nullptr, Tensor* db0 = nullptr) {
  const Index C = c.shape[c.channel_axis < 0 ? c.shape.size() + c.channel_axis : c.channel_axis];
  Grads g{Tensor(c.shape), dw0 ? Tensor::copy_of(dw0->cview()) : Tensor({C}),
          db0 ? Tensor::copy_of(db0->cview()) : Tensor({C})};
  if (c.groups) {
    if (st)
      group_norm_backward_saved(dx, g.dw.view(), g.db.view(), dy, x, w, *st, mode);
    else
      group_norm_backward(dx, g.dw.view(), g.db.view(), dy, x, w, c.groups, {c.channel_axis, c.eps}, mode);
  } else {
    if (st)
      instance_norm_backward_saved(dx, g.dw.view(), g.db.view(), dy, x, w, *st, mode);
    else
      instance_norm_backward(dx, g.dw.view(), g.db.view(), dy, x, w, c.lengths, {c.channel_axis, c.eps, -1},
                             mode);
  }
  g.dx = Tensor::copy_of(ConstView(dx));
  return g;
}

void expect_same_grads(const Grads& a, const Grads& b, const std::string& what) {
  EXPECT_TRUE(bitwise_equal(a.dx.cview(), b.dx.cview(), what + " dx"));
  EXPECT_TRUE(bitwise_equal(a.dw.cview(), b.dw.cview(), what + " dweight"));
  EXPECT_TRUE(bitwise_equal(a.db.cview(), b.db.cview(), what + " dbias"));
}

TEST(ChannelNormStats, HandCase) {
  // InstanceNorm of [1, 2, 3] = [[1, 2, 3], [3, 4, 5]]: means 2 and 4, variance 2/3.
  Tensor x({1, 2, 3}), y({1, 2, 3});
  const float v[6] = {1, 2, 3, 3, 4, 5};
  for (int i = 0; i < 6; ++i) x[i] = v[i];
  ChannelNormStats st;
  instance_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, {}, {1, 0.0, -1}, &st);
  EXPECT_FALSE(st.group);
  EXPECT_EQ(st.x_shape, Dims({1, 2, 3}));
  EXPECT_EQ(st.channel_axis, 1);
  EXPECT_EQ(st.eps, 0.0);
  EXPECT_TRUE(st.lengths.empty());
  ASSERT_EQ(st.mean.size(), 2u);
  ASSERT_EQ(st.rstd.size(), 2u);
  EXPECT_EQ(st.mean[0], 2.0);
  EXPECT_EQ(st.mean[1], 4.0);
  const double want = 1.0 / std::sqrt(2.0 / 3.0);
  for (double r : st.rstd) EXPECT_NEAR(r, want, 4 * DBL_EPSILON * want);
  // GroupNorm of [1, 4, 1] = [1, 3, 2, 6] in 2 groups: means 2 and 4, variances 1 and 4.
  Tensor xg({1, 4, 1}), yg({1, 4, 1});
  const float u[4] = {1, 3, 2, 6};
  for (int i = 0; i < 4; ++i) xg[i] = u[i];
  ChannelNormStats sg;
  group_norm_forward(yg.view(), {}, {}, xg.cview(), {}, {}, 2, {1, 0.0}, &sg);
  EXPECT_TRUE(sg.group);
  EXPECT_EQ(sg.groups, 2);
  ASSERT_EQ(sg.mean.size(), 2u);
  EXPECT_EQ(sg.mean[0], 2.0);
  EXPECT_EQ(sg.mean[1], 4.0);
  EXPECT_EQ(sg.rstd[0], 1.0);
  EXPECT_EQ(sg.rstd[1], 0.5);
  // Masked: the lengths and the time axis are kept; an empty batch item's groups keep 0.
  Tensor xm({2, 2, 3}), ym({2, 2, 3});
  for (int i = 0; i < 12; ++i) xm[i] = static_cast<float>(i % 5);
  ChannelNormStats sm;
  const Lengths len = {2, 0};
  instance_norm_forward(ym.view(), {}, {}, xm.cview(), {}, {}, len, {1, 1e-5, 2}, &sm);
  EXPECT_EQ(sm.lengths, len);
  EXPECT_EQ(sm.time_axis, 2);
  ASSERT_EQ(sm.mean.size(), 4u);
  EXPECT_EQ(sm.mean[0], 0.5);  // x[0, 0, :2] = 0, 1
  EXPECT_EQ(sm.mean[2], 0.0);
  EXPECT_EQ(sm.rstd[3], 0.0);
}

// The kept values against the float64 reference, at an offset where an fp32 mean would be far off.
TEST(ChannelNormStats, KeptValuesAreTheDoubleStatistics) {
  std::mt19937_64 rng(61);
  Tensor x = testing::random_tensor({3, 8, 37}, rng, 1.0, 1e4);
  Tensor y(x.shape());
  for (const int groups : {0, 4}) {
    ChannelNormStats st;
    ref::ChannelNormOut r;
    if (groups) {
      group_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, groups, {}, &st);
      r = ref::group_norm_forward(x.cview(), ConstView{}, ConstView{}, groups, {});
    } else {
      instance_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, {}, {}, &st);
      r = ref::instance_norm_forward(x.cview(), ConstView{}, ConstView{}, {}, {});
    }
    ASSERT_EQ(st.mean.size(), static_cast<std::size_t>(r.mean.numel()));
    for (Index g = 0; g < r.mean.numel(); ++g) {
      const double m = r.mean[g], rs = r.rstd[g];
      EXPECT_NEAR(st.mean[static_cast<std::size_t>(g)], m, 1e-12 * std::abs(m)) << groups << " " << g;
      EXPECT_NEAR(st.rstd[static_cast<std::size_t>(g)], rs, 1e-6 * rs) << groups << " " << g;  // fp32 squares
    }
  }
}

// Every route of the engine (channel_norm.cpp): the backward with stats has the bits of the backward
// without, on every SIMD target, at 1 and 2 threads (sample runs take another route at 1 thread), with and
// without γ, written and accumulated. The cases: sample runs with segments of 16, 8 and 37 floats (sixteen
// at a time, with one-by-one tails: 33 channels), 64 (one by one) and with the channel axis third; the
// segment path (S = 100; strided views, gathered); sample rows (S = 1, where InstanceNorm's dx is 0, and
// GroupNorm's with the channels last); masked InstanceNorm (an empty item, an item cut short); GroupNorm
// with one, two and three channels per group and as LayerNorm rows (four or more per group: recomputed),
// the latter with a strided dx against contiguous x (its stats from the rows).
// Special segments: one all −0.0 (a mean of −0 recomputed), one constant, one at 1e4, eps 0.
TEST(ChannelNormStats, BackwardHasTheBitsOfTheRecomputingBackwardEverywhere) {
  std::mt19937_64 rng(67);
  const std::vector<Case> cases = {
      {{4, 32, 16}},
      {{3, 33, 8}},
      {{2, 33, 37}},
      {{2, 20, 64}},
      {{2, 7, 100}},
      {{3, 5, 9, 6}, 0, 1, {}, true},
      {{50, 24}},
      {{3, 6, 5, 8}, 0, 2},
      {{3, 6, 32}, 8, -1},
      {{3, 4, 9}, 0, 1, {5, 0, 9}},
      {{2, 3, 4, 7}, 0, 1, {7, 2}},
      {{4, 32, 16}, 32},
      {{3, 34, 12}, 17},
      {{2, 12, 100}, 4},
      {{40, 24}, 6},
      {{4, 32, 16}, 4},
      {{4, 12, 9}, 3, 1, {}, true},
      {{3, 16, 5}, 16, 1, {}, false, 0.0},
  };
  const Isa saved_isa = active_isa();
  const int saved_threads = num_threads();
  for (const Case& c : cases) {
    Tensor xp, dyp, dxp;
    View xv = operand(c, xp, rng, 2.0, 3.0);
    const ConstView dy = operand(c, dyp, rng, 1.0, 0.0);
    View dx = operand(c, dxp, rng, 1.0, 0.0);
    // Special segments: (0, 0) all −0.0, (0, 1) constant, (last item, 0) at an offset of 1e4.
    const Index C = c.shape[c.channel_axis < 0 ? c.shape.size() + c.channel_axis : c.channel_axis];
    if (c.channel_axis == 1 && c.shape.size() >= 3) {
      std::vector<Index> idx(static_cast<std::size_t>(c.shape.size()), 0);
      const Index S = c.shape.product() / (c.shape[0] * C);
      for (Index s = 0; s < S; ++s) {
        Index rest = s;
        for (int d = c.shape.size() - 1; d >= 2; --d) {
          idx[static_cast<std::size_t>(d)] = rest % c.shape[d];
          rest /= c.shape[d];
        }
        idx[0] = 0;
        idx[1] = 0;
        xv.at(std::span<const Index>(idx)) = -0.0f;
        idx[1] = 1;
        xv.at(std::span<const Index>(idx)) = 1.25f;
        idx[0] = c.shape[0] - 1;
        idx[1] = 0;
        xv.at(std::span<const Index>(idx)) = 1e4f + static_cast<float>(s % 5);
      }
    }
    const ConstView x = xv;
    Tensor w = testing::random_tensor({C}, rng, 1.0, 1.0), b = testing::random_tensor({C}, rng, 1.0, 0.0);
    for (Isa isa : supported_isas()) {
      set_isa(isa);
      for (int t : {1, 2}) {
        set_num_threads(t);
        const std::string what = fmt::format("{} {} {} threads", c.str(), isa_name(isa), t);
        const ChannelNormStats st = forward_keeping(c, x, w.cview(), b.cview(), what);
        for (bool with_w : {true, false}) {
          const ConstView wv = with_w ? w.cview() : ConstView{};
          const std::string wh = what + (with_w ? " with γ" : " without γ");
          expect_same_grads(backward(c, dx, dy, x, wv, nullptr, GradMode::kOverwrite),
                            backward(c, dx, dy, x, wv, &st, GradMode::kOverwrite), wh);
          if (!with_w) continue;
          Tensor dw0 = testing::random_tensor({C}, rng, 1.0, 0.0),
                 db0 = testing::random_tensor({C}, rng, 1.0, 0.0);
          expect_same_grads(backward(c, dx, dy, x, wv, nullptr, GradMode::kAccumulate, &dw0, &db0),
                            backward(c, dx, dy, x, wv, &st, GradMode::kAccumulate, &dw0, &db0),
                            wh + " accumulated");
        }
      }
    }
    set_isa(saved_isa);
    set_num_threads(saved_threads);
  }
  // GroupNorm as LayerNorm rows in the forward (contiguous x, y), not in the backward (a strided dx): the
  // kept values are the rows' and are not taken; the result is the recomputing backward's.
  const Case c{{4, 32, 16}, 4};
  Tensor xp = testing::random_tensor(c.shape, rng, 2.0, 3.0),
         dyp = testing::random_tensor(c.shape, rng, 1.0, 0.0);
  const Case strided{{4, 32, 16}, 4, 1, {}, true};
  Tensor dxp;
  const View dx = operand(strided, dxp, rng, 1.0, 0.0);
  ChannelNormStats st = forward_keeping(c, xp.cview(), {}, {}, "rows forward");
  EXPECT_TRUE(st.layer_norm_rows);
  expect_same_grads(backward(c, dx, dyp.cview(), xp.cview(), {}, nullptr, GradMode::kOverwrite),
                    backward(c, dx, dyp.cview(), xp.cview(), {}, &st, GradMode::kOverwrite), "rows forward");
}

// The kept values are what the backward uses where it says so (so the test above compares two routes, not
// one): a changed rstd changes dx on sample runs, the segment path, sample rows, masked InstanceNorm and
// GroupNorm with two channels per group; GroupNorm as LayerNorm rows recomputes (the same dx).
TEST(ChannelNormStats, TheBackwardTakesTheKeptValues) {
  std::mt19937_64 rng(71);
  const std::vector<Case> cases = {{{3, 32, 16}},     {{2, 7, 100}},
                                   {{30, 24}, 6},     {{3, 4, 9}, 0, 1, {5, 3, 9}},
                                   {{3, 32, 16}, 16}, {{4, 12, 9}, 3, 1, {}, true},
                                   {{4, 32, 16}, 4}};
  for (const Case& c : cases) {
    Tensor xp, dyp, dxp;
    const ConstView x = operand(c, xp, rng, 2.0, 1.0);
    const ConstView dy = operand(c, dyp, rng, 1.0, 0.0);
    const View dx = operand(c, dxp, rng, 1.0, 0.0);
    ChannelNormStats st = forward_keeping(c, x, {}, {}, c.str());
    const Grads g0 = backward(c, dx, dy, x, {}, &st, GradMode::kOverwrite);
    for (double& r : st.rstd) r *= 2;
    const Grads g1 = backward(c, dx, dy, x, {}, &st, GradMode::kOverwrite);
    if (st.layer_norm_rows)
      EXPECT_TRUE(bitwise_equal(g0.dx.cview(), g1.dx.cview(), c.str()));
    else
      EXPECT_FALSE(bitwise_equal(g0.dx.cview(), g1.dx.cview())) << c.str();
  }
}

TEST(ChannelNormStats, MisuseGetsClearMessages) {
  Tensor x({2, 4, 3}), y({2, 4, 3}), dx({2, 4, 3}), dy({2, 4, 3}), x2({3, 4, 3}), dx2({3, 4, 3}),
      dy2({3, 4, 3});
  ChannelNormStats in, gn;
  instance_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, {}, {}, &in);
  group_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, 2, {}, &gn);
  EXPECT_NL_ERROR(instance_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, {}, {}, nullptr),
                  "instance_norm_forward: stats is null");
  EXPECT_NL_ERROR(group_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, 2, {}, nullptr),
                  "group_norm_forward: stats is null");
  EXPECT_NL_ERROR(instance_norm_backward_saved(dx.view(), {}, {}, dy.cview(), x.cview(), {}, gn),
                  "instance_norm_backward: stats come from a GroupNorm forward");
  EXPECT_NL_ERROR(group_norm_backward_saved(dx.view(), {}, {}, dy.cview(), x.cview(), {}, in),
                  "group_norm_backward: stats come from a InstanceNorm forward");
  EXPECT_NL_ERROR(instance_norm_backward_saved(dx2.view(), {}, {}, dy2.cview(), x2.cview(), {}, in),
                  "x has shape [3, 4, 3], the stats' forward had [2, 4, 3]");
  EXPECT_NL_ERROR(instance_norm_backward_saved(dx.view(), {}, {}, dy.cview(), {}, {}, in),
                  "x and dy are required");
  EXPECT_NL_ERROR(group_norm_backward_saved(dx.view(), {}, {}, {}, x.cview(), {}, gn),
                  "x and dy are required");
  ChannelNormStats bad = gn;
  bad.rstd.pop_back();
  EXPECT_NL_ERROR(group_norm_backward_saved(dx.view(), {}, {}, dy.cview(), x.cview(), {}, bad),
                  "4 mean and 3 rstd values for 4 groups");
  ChannelNormStats regrouped = gn;
  regrouped.groups = 3;
  EXPECT_NL_ERROR(group_norm_backward_saved(dx.view(), {}, {}, dy.cview(), x.cview(), {}, regrouped),
                  "groups = 3 does not divide");
  ChannelNormStats masked = in;
  masked.lengths = {3};  // one length for two batch items
  EXPECT_NL_ERROR(instance_norm_backward_saved(dx.view(), {}, {}, dy.cview(), x.cview(), {}, masked),
                  "1 lengths given");
  ChannelNormStats unset;  // default: no shape
  EXPECT_NL_ERROR(instance_norm_backward_saved(dx.view(), {}, {}, dy.cview(), x.cview(), {}, unset),
                  "the stats' forward had");
  // The backward's own checks still run (dx's shape).
  EXPECT_NL_ERROR(instance_norm_backward_saved(dx2.view(), {}, {}, dy.cview(), x.cview(), {}, in), "dx");
}

}  // namespace
}  // namespace normlab
