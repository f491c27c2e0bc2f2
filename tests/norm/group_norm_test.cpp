// InstanceNorm and GroupNorm (channel-norm engine): hand-computed values, the float64 reference on
// random shapes and strided layouts, masked InstanceNorm's defining property (each sequence cut to its
// length), relations between the groupings, float64 finite differences, determinism across thread
// counts, and bad input.
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/reference.h>
#include <normlab/simd.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>

#include "norm/channel_norm.h"
#include "norm/row_kernels.h"
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

struct Fwd {
  Tensor y, mean, rstd;
};
struct Grads {
  Tensor dx, dw, db;
};
Fwd in_forward(ConstView x, ConstView w, ConstView b, const Lengths& len, const InstanceNormOptions& opt) {
  const Dims ss = instance_stats_shape(x.shape(), opt.channel_axis);
  Fwd f{Tensor(x.shape()), Tensor(ss), Tensor(ss)};
  instance_norm_forward(f.y.view(), f.mean.view(), f.rstd.view(), x, w, b, len, opt);
  return f;
}
Grads in_backward(ConstView dy, ConstView x, ConstView w, const Lengths& len,
                  const InstanceNormOptions& opt) {
  const Index C = x.size(opt.channel_axis);
  Grads g{Tensor(x.shape()), Tensor({C}), Tensor({C})};
  instance_norm_backward(g.dx.view(), g.dw.view(), g.db.view(), dy, x, w, len, opt);
  return g;
}
Fwd gn_forward(ConstView x, ConstView w, ConstView b, int groups, const GroupNormOptions& opt) {
  const Dims ss = group_stats_shape(x.shape(), groups, opt.channel_axis);
  Fwd f{Tensor(x.shape()), Tensor(ss), Tensor(ss)};
  group_norm_forward(f.y.view(), f.mean.view(), f.rstd.view(), x, w, b, groups, opt);
  return f;
}
Grads gn_backward(ConstView dy, ConstView x, ConstView w, int groups, const GroupNormOptions& opt) {
  const Index C = x.size(opt.channel_axis);
  Grads g{Tensor(x.shape()), Tensor({C}), Tensor({C})};
  group_norm_backward(g.dx.view(), g.dw.view(), g.db.view(), dy, x, w, groups, opt);
  return g;
}

// A random strided view of a fresh parent: some axes sliced (misaligned), maybe a reversed axis 0.
View random_view(std::mt19937_64& rng, Tensor& parent, const Dims& shape) {
  std::uniform_int_distribution<int> coin(0, 1);
  Dims ps = shape;
  for (int d = 0; d < shape.size(); ++d) ps[d] += coin(rng);
  parent = testing::random_tensor(ps, rng, 1.5, coin(rng) ? 0.25 : 50.0);
  View v = parent.view();
  for (int d = 0; d < shape.size(); ++d)
    if (ps[d] != shape[d]) v = v.slice(d, 1, ps[d]);
  if (shape.size() >= 3 && coin(rng)) {  // a physically transposed parent, seen in logical order
    Tensor t = testing::random_tensor(shape, rng, 1.5, 0.25);
    parent = Tensor::copy_of(t.cview().transpose(1, 2));
    v = parent.view().transpose(1, 2);
  }
  if (coin(rng) && v.size(0) > 1) v = v.slice(0, v.size(0) - 1, -1, -1);
  return v;
}

Dims random_shape(std::mt19937_64& rng, int min_rank) {
  static const Index kSizes[] = {1, 2, 3, 4, 6, 7, 33};
  std::uniform_int_distribution<int> rank_d(min_rank, 4), size_d(0, 6);
  const int rank = rank_d(rng);
  Dims shape;
  Index total = 1;
  for (int d = 0; d < rank; ++d) {
    Index s = kSizes[size_d(rng)];
    if (total * s > 6000) s = 1;
    total *= s;
    shape.push_back(s);
  }
  return shape;
}

// ---- hand-computed -------------------------------------------------------------------------------

TEST(InstanceNormExamples, EachBatchItemAndChannelOnItsOwn) {
  // x [B=2, C=1, T=3]: (1,2,3) and (10,20,30) both normalize to (−√1.5, 0, √1.5).
  Tensor x({2, 1, 3}, {1, 2, 3, 10, 20, 30});
  InstanceNormOptions opt;
  opt.eps = 0;
  Fwd f = in_forward(x.cview(), {}, {}, {}, opt);
  const double s = std::sqrt(1.5);
  EXPECT_TRUE(all_close(f.y.cview(), ref::DTensor({2, 1, 3}, {-s, 0, s, -s, 0, s}), Tol{2, 1}));
  EXPECT_EQ(f.mean.shape(), (Dims{2, 1}));
  EXPECT_EQ(f.mean[0], 2.0f);
  EXPECT_EQ(f.mean[1], 20.0f);
}

TEST(GroupNormExamples, GroupsOfConsecutiveChannels) {
  // x [1, C=4, 1], groups 2: (1, 3) and (5, 9): each group normalizes to (−1, 1).
  Tensor x({1, 4, 1}, {1, 3, 5, 9}), w({4}, {1, 2, 3, 4}), b({4}, {0, 0, 1, 1});
  GroupNormOptions opt;
  opt.eps = 0;
  Fwd f = gn_forward(x.cview(), w.cview(), b.cview(), 2, opt);
  Tensor expect({1, 4, 1}, {-1, 2, -2, 5});
  EXPECT_TRUE(bitwise_equal(f.y.cview(), expect.cview(), "y"));
  EXPECT_EQ(f.mean.shape(), (Dims{1, 2}));
  EXPECT_EQ(f.mean[1], 7.0f);
  EXPECT_EQ(f.rstd[1], 0.5f);
}

// ---- the float64 reference on random layouts ----------------------------------------------------

TEST(InstanceNormReference, MatchesFloat64OnRandomLayoutsMaskedOrNot) {
  std::mt19937_64 rng(515);
  std::uniform_int_distribution<int> coin(0, 1);
  for (int i = 0; i < 200; ++i) {
    const Dims shape = random_shape(rng, 2);
    Tensor parent;
    View x = random_view(rng, parent, shape);
    const int rank = shape.size();
    InstanceNormOptions opt;
    opt.channel_axis = std::uniform_int_distribution<int>(0, rank - 2)(rng);
    opt.eps = coin(rng) ? 0.0 : 1e-5;
    Lengths len;
    if (coin(rng)) {  // masked over a random later axis
      opt.time_axis = std::uniform_int_distribution<int>(opt.channel_axis + 1, rank - 1)(rng);
      Index B = 1;
      for (int d = 0; d < opt.channel_axis; ++d) B *= shape[d];
      std::uniform_int_distribution<Index> ld(0, shape[opt.time_axis]);
      for (Index b = 0; b < B; ++b) len.push_back(ld(rng));
      if (opt.eps == 0) opt.eps = 1e-5;  // one-frame instances have var 0
    }
    const Index C = shape[opt.channel_axis];
    Tensor w = testing::random_tensor({C}, rng, 1.0, 1.0), b = testing::random_tensor({C}, rng, 1.0, 0.0);
    ConstView wv = coin(rng) ? w.cview() : ConstView{}, bv = coin(rng) ? b.cview() : ConstView{};
    SCOPED_TRACE(fmt::format("case {}: shape {} strides {} channel_axis {} time_axis {} lengths [{}] eps {}",
                             i, x.shape().str(), x.strides().str(), opt.channel_axis, opt.time_axis,
                             fmt::join(len, ","), opt.eps));
    if (opt.eps == 0) {  // avoid constant instances (size-1 spatial extent) with eps 0
      Index S = 1;
      for (int d = opt.channel_axis + 1; d < rank; ++d) S *= shape[d];
      if (S < 2) opt.eps = 1e-5;
    }
    Fwd f = in_forward(x, wv, bv, len, opt);
    ref::ChannelNormOut r = ref::instance_norm_forward(x, wv, bv, len, opt);
    ASSERT_TRUE(all_close(f.y.cview(), r.y, Tol{4, 1}, "y"));
    ASSERT_TRUE(all_close(f.mean.cview(), r.mean, Tol{2, 1e-5}, "save_mean"));
    ASSERT_TRUE(all_close(f.rstd.cview(), r.rstd, Tol{2, 1e-30}, "save_rstd"));
    Tensor dy = testing::random_tensor(x.shape(), rng, 1.0, 0.0);
    Grads g = in_backward(dy.cview(), x, wv, len, opt);
    LayerNormGrads rg = ref::instance_norm_backward(dy.cview(), x, wv, len, opt);
    ASSERT_TRUE(all_close(g.dx.cview(), rg.dx, Tol{16, dx_scale(rg.dx, r.rstd, dy.cview(), wv)}, "dx"));
    ASSERT_TRUE(all_close(g.dw.cview(), rg.dweight, Tol{8, max_abs(rg.dweight)}, "dweight"));
    ASSERT_TRUE(all_close(g.db.cview(), rg.dbias, Tol{8, max_abs(rg.dbias)}, "dbias"));
  }
}

TEST(GroupNormReference, MatchesFloat64OnRandomLayouts) {
  std::mt19937_64 rng(616);
  std::uniform_int_distribution<int> coin(0, 1);
  for (int i = 0; i < 200; ++i) {
    const Dims shape = random_shape(rng, 1);
    Tensor parent;
    View x = random_view(rng, parent, shape);
    GroupNormOptions opt;
    opt.channel_axis = std::uniform_int_distribution<int>(-shape.size(), shape.size() - 1)(rng);
    const Index C = x.size(opt.channel_axis);
    std::vector<int> divisors;
    for (int g = 1; g <= C; ++g)
      if (C % g == 0) divisors.push_back(g);
    const int groups = divisors[rng() % divisors.size()];
    opt.eps = coin(rng) ? 1e-5 : 0.0;
    if (x.numel() / (x.size(0) == 0 ? 1 : 1) < 2) opt.eps = 1e-5;
    Tensor w = testing::random_tensor({C}, rng, 1.0, 1.0), b = testing::random_tensor({C}, rng, 1.0, 0.0);
    ConstView wv = coin(rng) ? w.cview() : ConstView{}, bv = coin(rng) ? b.cview() : ConstView{};
    SCOPED_TRACE(fmt::format("case {}: shape {} strides {} channel_axis {} groups {} eps {}", i,
                             x.shape().str(), x.strides().str(), opt.channel_axis, groups, opt.eps));
    ref::ChannelNormOut r = ref::group_norm_forward(x, wv, bv, groups, opt);
    for (Index k = 0; k < r.rstd.numel(); ++k)
      if (!std::isfinite(r.rstd[k])) opt.eps = 1e-5;  // a one-element group with eps 0
    r = ref::group_norm_forward(x, wv, bv, groups, opt);
    Fwd f = gn_forward(x, wv, bv, groups, opt);
    ASSERT_TRUE(all_close(f.y.cview(), r.y, Tol{4, 1}, "y"));
    ASSERT_TRUE(all_close(f.mean.cview(), r.mean, Tol{2, 1e-5}, "save_mean"));
    ASSERT_TRUE(all_close(f.rstd.cview(), r.rstd, Tol{2, 1e-30}, "save_rstd"));
    Tensor dy = testing::random_tensor(x.shape(), rng, 1.0, 0.0);
    Grads g = gn_backward(dy.cview(), x, wv, groups, opt);
    LayerNormGrads rg = ref::group_norm_backward(dy.cview(), x, wv, groups, opt);
    ASSERT_TRUE(all_close(g.dx.cview(), rg.dx, Tol{16, dx_scale(rg.dx, r.rstd, dy.cview(), wv)}, "dx"));
    ASSERT_TRUE(all_close(g.dw.cview(), rg.dweight, Tol{8, max_abs(rg.dweight)}, "dweight"));
    ASSERT_TRUE(all_close(g.db.cview(), rg.dbias, Tol{8, max_abs(rg.dbias)}, "dbias"));
  }
}

// ---- masked InstanceNorm ----------------------------------------------------------------------------

TEST(InstanceNormMasked, EqualsUnmaskedInstanceNormOfEachSequenceCutToItsLength) {
  std::mt19937_64 rng(717);
  for (const Dims& shape : {Dims{6, 3, 17}, Dims{5, 2, 33, 3}, Dims{4, 4, 1}}) {
    for (int time_axis : {2, -1}) {
      Tensor parent;
      View x = random_view(rng, parent, shape);
      const int ta = time_axis < 0 ? time_axis + shape.size() : time_axis;
      const Index T = shape[ta], B = shape[0], C = shape[1];
      std::uniform_int_distribution<Index> ld(0, T);
      Lengths len(static_cast<std::size_t>(B));
      for (Index& l : len) l = ld(rng);
      len[0] = T;
      len[1] = 1;
      if (B > 3) len[3] = 0;
      InstanceNormOptions opt;
      opt.time_axis = time_axis;
      Tensor w = testing::random_tensor({C}, rng, 1.0, 1.0), b = testing::random_tensor({C}, rng, 1.0, 0.0);
      Tensor dy = testing::random_tensor(x.shape(), rng, 1.0, 0.0);
      SCOPED_TRACE(
          fmt::format("shape {} time_axis {} lengths [{}]", shape.str(), time_axis, fmt::join(len, ",")));
      Fwd f = in_forward(x, w.cview(), b.cview(), len, opt);
      Grads g = in_backward(dy.cview(), x, w.cview(), len, opt);
      Tensor dw_sum({C}), db_sum({C});
      for (Index bi = 0; bi < B; ++bi) {
        const Index l = len[static_cast<std::size_t>(bi)];
        ConstView yb = f.y.cview().slice(0, bi, bi + 1), dxb = g.dx.cview().slice(0, bi, bi + 1);
        if (l > 0) {
          ConstView xcut = ConstView(x).slice(0, bi, bi + 1).slice(ta, 0, l);
          ConstView dycut = dy.cview().slice(0, bi, bi + 1).slice(ta, 0, l);
          Fwd fc = in_forward(xcut, w.cview(), b.cview(), {}, {});
          EXPECT_TRUE(bitwise_equal(yb.slice(ta, 0, l), fc.y.cview(), fmt::format("y of item {}", bi)));
          EXPECT_TRUE(bitwise_equal(f.mean.cview().slice(0, bi, bi + 1), fc.mean.cview(), "save_mean"));
          EXPECT_TRUE(bitwise_equal(f.rstd.cview().slice(0, bi, bi + 1), fc.rstd.cview(), "save_rstd"));
          Grads gc = in_backward(dycut, xcut, w.cview(), {}, {});
          EXPECT_TRUE(bitwise_equal(dxb.slice(ta, 0, l), gc.dx.cview(), fmt::format("dx of item {}", bi)));
          for (Index c = 0; c < C; ++c) {
            dw_sum[c] += gc.dw[c];
            db_sum[c] += gc.db[c];
          }
        } else {  // a fully padded item: zeros, and statistics 0 (documented)
          for (Index c = 0; c < C; ++c) {
            EXPECT_EQ(f.mean.cview().at({bi, c}), 0.0f);
            EXPECT_EQ(f.rstd.cview().at({bi, c}), 0.0f);
          }
        }
        bool zero = true;
        for (ConstView pad : {yb.slice(ta, l, T), dxb.slice(ta, l, T)})
          for_each_offset(pad.shape(), pad.strides(),
                          [&](Index off) { zero = zero && pad.data()[off] == 0.0f; });
        EXPECT_TRUE(zero) << "padded frames of item " << bi;
      }
      // dγ, dβ: the per-item contributions (summed here in fp32, hence the tolerance).
      EXPECT_TRUE(all_close(g.dw.cview(), ref::to_double(dw_sum.cview()), Tol{8, 4}, "dweight"));
      EXPECT_TRUE(all_close(g.db.cview(), ref::to_double(db_sum.cview()), Tol{8, 4}, "dbias"));
    }
  }
}

// ---- short segments on sample rows and sample runs ---------------------------------------------------

// GroupNorm and InstanceNorm whose segments are single elements (S = 1: [N, C], [N, C, 1], channels last
// [N, T, C]) with the channels consecutive run on sample rows (the groups' statistics eight at a time, their
// channels from 8x8 blocks and the rest gathered: [4, 104], 8 groups of 13; [3, 216], 8 groups of 18 and 4
// more one by one; [9, 1024]; [6, 33, 1], 3 channels per group, gathered; channel-rows elementwise
// kernels); short segments (2 ≤ S ≤ 64, [N, C, H, W]; GroupNorm: where the LayerNorm rows below do not
// apply) with the channels S floats apart on sample runs (one
// segments_stats call per run of groups, S ≤ 40 sixteen segments at a time, one per lane, as with
// [3, 40, 4, 4], [2, 48, 20], [3, 32, 6, 6]; segments_normalize / segments_input_grad with each segment's
// constants, for S < 16 one stream of vectors over the run: [3, 12, 2], [3, 35, 3], [4, 6, 3] (one segment
// per group), [40, 256, 3] (two tasks, the first ending within a batch item)); with the channels twice as
// far apart both take the segment path (kernel calls per segment). Both give the same bits, forward and
// backward, every target and thread count. The rows hold -0.0, a group of equal values (variance 0), a NaN
// and an infinity (in a block of eight groups where there are eight), and dy an infinity.
TEST(ChannelNormSampleRows, SameBitsAsTheSegmentPath) {
  std::mt19937_64 rng(47);
  const Isa saved_isa = active_isa();
  const int saved_threads = num_threads();
  struct Case {
    Dims shape;
    int channel_axis;
    int groups;
  };
  for (const Case& k : {Case{{2, 1}, 1, 1},         Case{{5, 12}, 1, 3},       Case{{6, 33, 1}, 1, 11},
                        Case{{3, 5, 48}, 2, 4},     Case{{4, 7, 64}, -1, 64},  Case{{9, 1024}, 1, 32},
                        Case{{3, 12, 2}, 1, 3},     Case{{4, 8, 5, 3}, 1, 2},  Case{{3, 33, 7}, 1, 11},
                        Case{{2, 64, 64}, 1, 32},   Case{{5, 9, 4, 4}, 1, 9},  Case{{7, 48, 8, 8}, 1, 3},
                        Case{{3, 40, 4, 4}, 1, 20}, Case{{3, 35, 3}, 1, 7},    Case{{40, 1024}, 1, 2},
                        Case{{2, 48, 20}, 1, 24},   Case{{3, 32, 6, 6}, 1, 8}, Case{{4, 6, 3}, 1, 6},
                        Case{{40, 256, 3}, 1, 64},  Case{{4, 104}, 1, 8},      Case{{3, 216}, 1, 12}}) {
    const int ca = k.channel_axis < 0 ? k.channel_axis + k.shape.size() : k.channel_axis;
    const Index C = k.shape[ca];
    Tensor x = testing::random_tensor(k.shape, rng, 2.0, 3.0);
    // (GroupNorm of these shapes stays off the LayerNorm rows of GroupNormRows below.)
    ASSERT_FALSE(chnorm::group_rows_apply(
        chnorm::make_plan(k.shape, ca, chnorm::Grouping::kGroup, k.groups, {}, -1, "group_norm_forward"),
        {x.cview()}))
        << k.shape.str();
    Tensor dy = testing::random_tensor(k.shape, rng, 1.0, 0.0);
    x.data()[0] = -0.0f;
    // The elements of a segment of the first row (S of them, consecutive when the channel axis is not last).
    const Index S = ca + 1 == static_cast<int>(k.shape.size()) ? 1 : x.view().stride(ca);
    if (C >= 8)  // channels 4..7 of the first row equal (with 4 channels per group: a constant group)
      for (Index c = 4; c < 8; ++c)
        for (Index e = 0; e < S; ++e) x.data()[c * x.view().stride(ca) + e] = 1.5f;
    if (k.shape[0] >= 3 && C >= 2) {  // a NaN in item 1 and an infinity in item 2 (non-finite statistics)
      x.data()[1 * x.view().stride(0) + 1 * x.view().stride(ca)] = std::numeric_limits<float>::quiet_NaN();
      x.data()[2 * x.view().stride(0)] = std::numeric_limits<float>::infinity();
    }
    if (C >= 4)  // an infinite dy in item 0, channel 3 (the segment kernel's dy·(x − m_hi) is NaN there)
      dy.data()[3 * dy.view().stride(ca)] = std::numeric_limits<float>::infinity();
    Dims wide = k.shape;
    wide[ca] = 2 * C;
    Tensor xw(wide), dyw(wide);
    Dims wst = xw.view().strides();
    wst[ca] *= 2;  // the channels two floats apart; the axes before keep the wide tensor's strides
    const View xs(xw.data(), k.shape, wst), dys(dyw.data(), k.shape, wst);
    testing::copy_into(xs, x);
    testing::copy_into(dys, dy);
    const Tensor w = testing::random_tensor({C}, rng, 1.0, 1.0),
                 b = testing::random_tensor({C}, rng, 0.5, 0.0);
    for (const Isa isa : supported_isas()) {
      set_isa(isa);
      for (const int threads : {1, 3}) {
        set_num_threads(threads);
        for (const bool affine : {true, false}) {
          const ConstView wv = affine ? w.cview() : ConstView{}, bv = affine ? b.cview() : ConstView{};
          const std::string what = fmt::format("{} axis {} groups {} {} {} threads{}", k.shape.str(), ca,
                                               k.groups, isa_name(isa), threads, affine ? " affine" : "");
          GroupNormOptions gopt;
          gopt.channel_axis = ca;
          Fwd f[2] = {gn_forward(x.cview(), wv, bv, k.groups, gopt), gn_forward(xs, wv, bv, k.groups, gopt)};
          EXPECT_TRUE(bitwise_equal(f[0].y.cview(), f[1].y.cview(), what + " GroupNorm y"));
          EXPECT_TRUE(bitwise_equal(f[0].mean.cview(), f[1].mean.cview(), what + " GroupNorm mean"));
          EXPECT_TRUE(bitwise_equal(f[0].rstd.cview(), f[1].rstd.cview(), what + " GroupNorm rstd"));
          Grads g[2] = {gn_backward(dy.cview(), x.cview(), wv, k.groups, gopt),
                        gn_backward(dys, xs, wv, k.groups, gopt)};
          EXPECT_TRUE(bitwise_equal(g[0].dx.cview(), g[1].dx.cview(), what + " GroupNorm dx"));
          EXPECT_TRUE(bitwise_equal(g[0].dw.cview(), g[1].dw.cview(), what + " GroupNorm dγ"));
          EXPECT_TRUE(bitwise_equal(g[0].db.cview(), g[1].db.cview(), what + " GroupNorm dβ"));
          InstanceNormOptions iopt;
          iopt.channel_axis = ca;
          Fwd fi[2] = {in_forward(x.cview(), wv, bv, {}, iopt), in_forward(xs, wv, bv, {}, iopt)};
          EXPECT_TRUE(bitwise_equal(fi[0].y.cview(), fi[1].y.cview(), what + " InstanceNorm y"));
          EXPECT_TRUE(bitwise_equal(fi[0].rstd.cview(), fi[1].rstd.cview(), what + " InstanceNorm rstd"));
          Grads gi[2] = {in_backward(dy.cview(), x.cview(), wv, {}, iopt),
                         in_backward(dys, xs, wv, {}, iopt)};
          EXPECT_TRUE(bitwise_equal(gi[0].dx.cview(), gi[1].dx.cview(), what + " InstanceNorm dx"));
          EXPECT_TRUE(bitwise_equal(gi[0].dw.cview(), gi[1].dw.cview(), what + " InstanceNorm dγ"));
        }
      }
    }
    // The sample-rows results against the float64 reference.
    GroupNormOptions gopt;
    gopt.channel_axis = ca;
    const ref::ChannelNormOut r = ref::group_norm_forward(x.cview(), w.cview(), b.cview(), k.groups, gopt);
    const Fwd f = gn_forward(x.cview(), w.cview(), b.cview(), k.groups, gopt);
    EXPECT_TRUE(all_close(f.y.cview(), r.y, Tol{4, 1}, k.shape.str() + " y against float64"));
  }
  set_isa(saved_isa);
  set_num_threads(saved_threads);
}

// GroupNorm of contiguous short segments with four or more channels per group (2 ≤ S ≤ 32, rows of a
// multiple of 16 floats or of 64 or more: chnorm::group_rows_apply, group_rows.cpp) runs each group as one
// LayerNorm row of (C/G)·S floats with γ_c, β_c repeated over each channel's S elements: y, mean, rstd and dx
// are bitwise those of layer_norm_forward / layer_norm_backward on the group's rows (a strided view of every
// batch item's group g) with the expanded γ and β, on every target and thread count; dγ, dβ within 8 float
// eps (of the terms' magnitude) of the sums of the LayerNorm's per-element dγ, dβ. Shapes: five tiles of up
// to 128 items, the last partial, each its own chunk of partial rows ([600, 32, 4], 8 groups: rows of 16),
// one group per item ([3, 8, 2, 2]), rows of 4·21 = 84 floats (a tail), the largest S ([2, 128, 32]), four
// dimensions; in-place y and dx; with and without γ, β; at 3 threads with streaming stores. The rows hold
// -0.0, a NaN, an infinity and a constant group.
TEST(GroupNormRows, EqualsLayerNormOfEachGroupRow) {
  std::mt19937_64 rng(4242);
  const Isa saved_isa = active_isa();
  const int saved_threads = num_threads();
  struct Case {
    Dims shape;
    int groups;
  };
  for (const Case& k : {Case{{40, 32, 8}, 8}, Case{{3, 8, 2, 2}, 1}, Case{{5, 12, 21}, 3},
                        Case{{2, 128, 32}, 32}, Case{{600, 32, 4}, 8}, Case{{7, 16, 3, 4}, 2}}) {
    const Index B = k.shape[0], C = k.shape[1], S = k.shape.product() / (B * C), G = k.groups, n = C / G * S;
    Tensor x = testing::random_tensor(k.shape, rng, 2.0, 3.0),
           dy = testing::random_tensor(k.shape, rng, 1.0, 0.0);
    ASSERT_TRUE(chnorm::group_rows_apply(
        chnorm::make_plan(k.shape, 1, chnorm::Grouping::kGroup, G, {}, -1, "group_norm_forward"),
        {x.cview()}))
        << k.shape.str();
    for (Index e = 0; e < n; ++e) x.data()[(G - 1) * n + e] = 0.75f;  // a constant group (item 0, group G − 1)
    x.data()[0] = -0.0f;
    if (B >= 3) {  // a NaN in item 1, an infinity in the last element of item 2
      x.data()[1 * C * S + 3] = std::numeric_limits<float>::quiet_NaN();
      x.data()[3 * C * S - 1] = std::numeric_limits<float>::infinity();
    }
    const Tensor w = testing::random_tensor({C}, rng, 1.0, 1.0),
                 b = testing::random_tensor({C}, rng, 0.5, 0.0);
    Tensor we({C * S}), be({C * S});
    for (Index i = 0; i < C * S; ++i) {
      we.data()[i] = w.data()[i / S];
      be.data()[i] = b.data()[i / S];
    }
    // The reference: LayerNorm on each group's rows.
    auto rows = [&](auto v, Index g) { return v.reshape({B, G, n}).select(1, g); };
    auto part = [&](const Tensor& t, Index g) { return ConstView(t.data() + g * n, {n}); };
    for (const bool affine : {true, false}) {
      Tensor ly(k.shape), lmean({B, G}), lrstd({B, G}), ldx(k.shape), ldw({C * S}), ldb({C * S});
      for (Index g = 0; g < G; ++g) {
        layer_norm_forward(rows(ly.view(), g), lmean.view().select(1, g), lrstd.view().select(1, g),
                           rows(x.cview(), g), affine ? part(we, g) : ConstView{},
                           affine ? part(be, g) : ConstView{}, {1});
        layer_norm_backward(rows(ldx.view(), g), View(ldw.data() + g * n, {n}), View(ldb.data() + g * n, {n}),
                            rows(dy.cview(), g), rows(x.cview(), g), affine ? part(we, g) : ConstView{}, {1});
      }
      const ConstView wv = affine ? w.cview() : ConstView{}, bv = affine ? b.cview() : ConstView{};
      for (const Isa isa : supported_isas()) {
        set_isa(isa);
        for (const int threads : {1, 2, 3}) {
          set_num_threads(threads);
          // With 3 threads, every output streamed (non-temporal stores where a row allows them).
          std::optional<kernels::ScopedStreamMinBytes> streamed;
          if (threads == 3) streamed.emplace(0);
          const std::string what = fmt::format("{} groups {} {} {} threads{}", k.shape.str(), G,
                                               isa_name(isa), threads, affine ? " affine" : "");
          const Fwd f = gn_forward(x.cview(), wv, bv, static_cast<int>(G), {});
          EXPECT_TRUE(bitwise_equal(f.y.cview(), ly.cview(), what + " y"));
          EXPECT_TRUE(bitwise_equal(f.mean.cview(), lmean.cview(), what + " mean"));
          EXPECT_TRUE(bitwise_equal(f.rstd.cview(), lrstd.cview(), what + " rstd"));
          const Grads gr = gn_backward(dy.cview(), x.cview(), wv, static_cast<int>(G), {});
          EXPECT_TRUE(bitwise_equal(gr.dx.cview(), ldx.cview(), what + " dx"));
          // dγ, dβ against sums of the LayerNorm's per-element values (each within its own rounding).
          for (Index c = 0; c < C; ++c) {
            double sw = 0, sb = 0, mw = 0, mb = 0;
            for (Index e = 0; e < S; ++e) {
              sw += ldw.data()[c * S + e];
              sb += ldb.data()[c * S + e];
              mw += std::fabs(ldw.data()[c * S + e]);
              mb += std::fabs(ldb.data()[c * S + e]);
            }
            const double eps8 = 8 * std::numeric_limits<float>::epsilon();
            auto expect_sum = [&](float got, double sum, double mag, const char* name) {
              if (std::isfinite(sum)) {
                EXPECT_NEAR(got, sum, eps8 * mag) << what << " " << name << "[" << c << "]";
              } else {
                EXPECT_TRUE(std::isnan(got) || got == static_cast<float>(sum))
                    << what << " " << name << "[" << c << "]";
              }
            };
            expect_sum(gr.dw.data()[c], sw, mw, "dγ");
            expect_sum(gr.db.data()[c], sb, mb, "dβ");
          }
          // In place: y over x, dx over dy.
          Tensor xi = x.clone(), dyi = dy.clone();
          group_norm_forward(xi.view(), {}, {}, xi.cview(), wv, bv, static_cast<int>(G));
          EXPECT_TRUE(bitwise_equal(xi.cview(), ly.cview(), what + " y in place"));
          group_norm_backward(dyi.view(), {}, {}, dyi.cview(), x.cview(), wv, static_cast<int>(G));
          EXPECT_TRUE(bitwise_equal(dyi.cview(), ldx.cview(), what + " dx in place"));
        }
      }
    }
  }
  set_isa(saved_isa);
  set_num_threads(saved_threads);
}

// ---- relations between the groupings --------------------------------------------------------------

TEST(GroupNormRelations, GroupsEqualChannelsIsInstanceNormAndOneGroupIsLayerNorm) {
  std::mt19937_64 rng(818);
  Tensor x = testing::random_tensor({3, 6, 5, 4}, rng, 2.0, 1.0),
         dy = testing::random_tensor({3, 6, 5, 4}, rng, 1, 0);
  Tensor w = testing::random_tensor({6}, rng, 1.0, 1.0), b = testing::random_tensor({6}, rng, 1.0, 0.0);
  Fwd gn = gn_forward(x.cview(), w.cview(), b.cview(), 6, {});
  Fwd in = in_forward(x.cview(), w.cview(), b.cview(), {}, {});
  EXPECT_TRUE(bitwise_equal(gn.y.cview(), in.y.cview(), "y"));
  EXPECT_TRUE(bitwise_equal(gn.mean.cview(), in.mean.cview(), "mean"));
  Grads ggn = gn_backward(dy.cview(), x.cview(), w.cview(), 6, {}),
        gin = in_backward(dy.cview(), x.cview(), w.cview(), {}, {});
  EXPECT_TRUE(bitwise_equal(ggn.dx.cview(), gin.dx.cview(), "dx"));
  EXPECT_TRUE(bitwise_equal(ggn.dw.cview(), gin.dw.cview(), "dweight"));
  // One group: LayerNorm over every axis after the batch axis (no affine).
  Fwd one = gn_forward(x.cview(), {}, {}, 1, {});
  Tensor ly(x.shape());
  layer_norm_forward(ly.view(), {}, {}, x.cview(), {}, {}, {1, 2, 3});
  EXPECT_TRUE(all_close(one.y.cview(), ref::to_double(ly.cview()), Tol{2, 1}, "GroupNorm(1) vs LayerNorm"));
}

// ---- float64 finite differences -------------------------------------------------------------------

template <typename Forward>
void expect_fd(Forward&& forward, ref::DTensor& x, ref::DTensor& w, ref::DTensor& b, const ref::DTensor& r,
               const LayerNormGrads& grads, const std::string& what) {
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
      EXPECT_NEAR(grad[i], fd, 1e-7 * std::max(1.0, std::fabs(fd))) << what << " " << name << "[" << i << "]";
    }
  };
  check(x, grads.dx, "dx");
  check(w, grads.dweight, "dweight");
  check(b, grads.dbias, "dbias");
}

TEST(ChannelNormGradients, InstanceAndGroupNormMatchFiniteDifferences) {
  std::mt19937_64 rng(919);
  // 0: InstanceNorm, 1: masked InstanceNorm, 2: GroupNorm(2) of [3, 4, 5], 3: GroupNorm(2) of [3, 8, 4] (four
  // channels per group of S = 4: the LayerNorm rows of GroupNormRows)
  for (int variant = 0; variant < 4; ++variant) {
    const Dims shape = variant == 3 ? Dims{3, 8, 4} : Dims{3, 4, 5};
    const Index C = shape[1];
    Tensor xf = testing::random_tensor(shape, rng, 1.0, 0.5), wf = testing::random_tensor({C}, rng, 0.5, 1.0);
    Tensor bf = testing::random_tensor({C}, rng, 1.0, 0.0), rf = testing::random_tensor(shape, rng, 1.0, 0.0);
    ref::DTensor x = ref::to_double(xf.cview()), w = ref::to_double(wf.cview()),
                 b = ref::to_double(bf.cview());
    const ref::DTensor r = ref::to_double(rf.cview());
    const Lengths len = variant == 1 ? Lengths{5, 2, 0} : Lengths{};
    const std::string what = fmt::format("variant {}", variant);
    LayerNormGrads rg;
    Grads g;
    if (variant < 2) {
      auto fwd = [&] { return ref::instance_norm_forward(x.view(), w.view(), b.view(), len, {}).y; };
      rg = ref::instance_norm_backward(r.view(), x.view(), w.view(), len, {});
      expect_fd(fwd, x, w, b, r, rg, what);
      g = in_backward(rf.cview(), xf.cview(), wf.cview(), len, {});
    } else {
      auto fwd = [&] { return ref::group_norm_forward(x.view(), w.view(), b.view(), 2, {}).y; };
      rg = ref::group_norm_backward(r.view(), x.view(), w.view(), 2, {});
      expect_fd(fwd, x, w, b, r, rg, what);
      g = gn_backward(rf.cview(), xf.cview(), wf.cview(), 2, {});
    }
    EXPECT_TRUE(all_close(g.dx.cview(), rg.dx, Tol{64, max_abs(rg.dx)}, what + " kernel dx"));
    EXPECT_TRUE(all_close(g.dw.cview(), rg.dweight, Tol{64, max_abs(rg.dweight)}, what + " kernel dweight"));
    EXPECT_TRUE(all_close(g.db.cview(), rg.dbias, Tol{64, max_abs(rg.dbias)}, what + " kernel dbias"));
  }
}

// ---- determinism ----------------------------------------------------------------------------------

TEST(ChannelNormDeterminism, InstanceAndGroupNormSameBitsForOneTwoAndThreeThreads) {
  std::mt19937_64 rng(1010);
  Tensor x = testing::random_tensor({16, 12, 300}, rng, 2.0, 3.0),
         dy = testing::random_tensor({16, 12, 300}, rng, 1, 0);
  Tensor w = testing::random_tensor({12}, rng, 1.0, 1.0);
  Lengths len(16);
  for (Index& l : len) l = static_cast<Index>(rng() % 301);
  const int saved = num_threads();
  std::vector<std::vector<Tensor>> out;
  for (int t : {1, 2, 3}) {
    set_num_threads(t);
    std::vector<Tensor> o;
    Fwd fi = in_forward(x.cview(), w.cview(), {}, len, {});
    Grads gi = in_backward(dy.cview(), x.cview(), w.cview(), len, {});
    Fwd fg = gn_forward(x.cview(), w.cview(), {}, 3, {});
    Grads gg = gn_backward(dy.cview(), x.cview(), w.cview(), 3, {});
    for (Tensor* p :
         {&fi.y, &fi.mean, &gi.dx, &gi.dw, &gi.db, &fg.y, &fg.mean, &fg.rstd, &gg.dx, &gg.dw, &gg.db})
      o.push_back(std::move(*p));
    out.push_back(std::move(o));
  }
  set_num_threads(saved);
  for (std::size_t t = 1; t < out.size(); ++t)
    for (std::size_t i = 0; i < out[0].size(); ++i)
      EXPECT_TRUE(bitwise_equal(out[0][i].cview(), out[t][i].cview(),
                                fmt::format("{} threads, output {}", t + 1, i)));
}

// ---- bad input ------------------------------------------------------------------------------------

// Outputs at or above the streaming-store threshold (norm/streaming.h; 16 MiB, here lowered to 64 KiB)
// are streamed (channel_norm.cpp) when a segment of the output is consecutive floats: the bits of the
// ordinary path, which an output with a step of 2 along T takes; masked InstanceNorm with full lengths
// (input a sliced view) gives the unmasked bits. Segments of 4099 floats (not whole vectors: streamed only
// where the machine streams such rows, chnorm::stream_output) and of 4096.
TEST(ChannelNormDeterminism, StreamingStoresGiveTheSameBits) {
  std::mt19937_64 rng(17);
  const kernels::ScopedStreamMinBytes lowered(Index{64} << 10);
  for (const Index T : {(Index{1} << 12) + 3, Index{1} << 12}) {
    SCOPED_TRACE(fmt::format("T = {}", T));
    const Index B = 2, C = 8;
    Tensor x = testing::random_tensor({B, C, T}, rng, 2.0, -1.0),
           dy = testing::random_tensor({B, C, T}, rng, 1, 0);
    Tensor w = testing::random_tensor({C}, rng, 1.0, 1.0), b = testing::random_tensor({C}, rng, 0.5, 0.0);
    Tensor py({B, C, 2 * T}), pdx({B, C, 2 * T}), m({B, 4}), r({B, 4}), dw({C}), db({C});
    View ys = py.view().slice(2, 0, 2 * T, 2), dxs = pdx.view().slice(2, 0, 2 * T, 2);
    const Fwd a = gn_forward(x.cview(), w.cview(), b.cview(), 4, {});
    group_norm_forward(ys, m.view(), r.view(), x.cview(), w.cview(), b.cview(), 4, {});
    EXPECT_TRUE(bitwise_equal(a.y.cview(), ys, "GroupNorm y"));
    const Grads ga = gn_backward(dy.cview(), x.cview(), w.cview(), 4, {});
    group_norm_backward(dxs, dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), 4, {});
    EXPECT_TRUE(bitwise_equal(ga.dx.cview(), dxs, "GroupNorm dx"));
    EXPECT_TRUE(bitwise_equal(ga.dw.cview(), dw.cview(), "GroupNorm dweight"));
    Tensor px({B, C, T + 2});
    View xv = px.view().slice(2, 1, T + 1);
    for (Index i = 0; i < B * C; ++i)
      for (Index t = 0; t < T; ++t) xv.data()[i * (T + 2) + t] = x[i * T + t];
    const Lengths full{T, T};
    const Fwd ia = in_forward(x.cview(), w.cview(), b.cview(), {}, {}),
              im = in_forward(xv, w.cview(), b.cview(), full, {});
    EXPECT_TRUE(bitwise_equal(ia.y.cview(), im.y.cview(), "InstanceNorm y, masked full lengths"));
    const Grads gi = in_backward(dy.cview(), x.cview(), w.cview(), {}, {}),
                gm = in_backward(dy.cview(), xv, w.cview(), full, {});
    EXPECT_TRUE(bitwise_equal(gi.dx.cview(), gm.dx.cview(), "InstanceNorm dx, masked full lengths"));
    EXPECT_TRUE(all_close(ia.y.cview(), ref::instance_norm_forward(x.cview(), w.cview(), b.cview(), {}, {}).y,
                          Tol{4, 1}, "InstanceNorm y vs float64"));
  }
}

// Which outputs the channel norms stream (chnorm::stream_output), the threshold lowered to 0: every one, but
// InstanceNorm's and GroupNorm's whose segments are longer than a vector and not whole vectors only where the
// machine streams such rows (kernels::RowTuning::stream_ragged_rows; not on a Zen 5). Short segments (their
// runs one stream of vectors) and BatchNorm stream either way.
TEST(ChannelNormDeterminism, RaggedSegmentsStreamWhereTheMachineSaysSo) {
  const kernels::ScopedStreamMinBytes every(0);
  const bool ragged = kernels::machine_row_tuning().stream_ragged_rows;
  using chnorm::Grouping;
  auto streams = [](const Dims& shape, Grouping g, Index groups) {
    return chnorm::stream_output(chnorm::make_plan(shape, 1, g, groups, {}, -1, "test"));
  };
  EXPECT_EQ(streams({2, 8, 49}, Grouping::kInstance, 1), ragged);
  EXPECT_EQ(streams({2, 8, 100}, Grouping::kGroup, 4), ragged);
  EXPECT_EQ(streams({2, 8, 7, 7}, Grouping::kGroup, 2), ragged);
  EXPECT_TRUE(streams({2, 8, 48}, Grouping::kInstance, 1));
  EXPECT_TRUE(streams({2, 8, 64}, Grouping::kGroup, 4));
  EXPECT_TRUE(streams({2, 8, 15}, Grouping::kInstance, 1));
  EXPECT_TRUE(streams({2, 8, 49}, Grouping::kBatch, 1));
  const kernels::ScopedStreamMinBytes never(Index{1} << 40);
  EXPECT_FALSE(streams({2, 8, 64}, Grouping::kGroup, 4));
}

TEST(ChannelNormErrors, BadInputGetsClearMessages) {
  Tensor x({2, 6, 4}), y({2, 6, 4}), dx({2, 6, 4}), dy({2, 6, 4}), bad({5}), stats_bad({2, 3});
  EXPECT_NL_ERROR(group_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, 4),
                  "groups = 4 does not divide the number of channels C = 6");
  EXPECT_NL_ERROR(group_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, 0), "groups must be ≥ 1, got 0");
  EXPECT_NL_ERROR(group_norm_backward(dx.view(), {}, {}, dy.cview(), x.cview(), {}, 5),
                  "groups = 5 does not divide");
  EXPECT_NL_ERROR(group_norm_forward(y.view(), stats_bad.view(), {}, x.cview(), {}, {}, 2),
                  "save_mean has shape [2, 3] but [2, 2] is expected");
  EXPECT_NL_ERROR(group_norm_forward(y.view(), {}, {}, x.cview(), bad.cview(), {}, 2),
                  "weight has shape [5] but [6]");
  GroupNormOptions gopt;
  gopt.channel_axis = -4;
  EXPECT_NL_ERROR(group_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, 2, gopt),
                  "channel_axis -4 is out of range");
  gopt = {};
  gopt.eps = -1;
  EXPECT_NL_ERROR(group_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, 2, gopt),
                  "eps must be finite and ≥ 0");
  const Lengths ok{4, 2};
  EXPECT_NL_ERROR(instance_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, Lengths{4, 5}),
                  "lengths[1] = 5 exceeds");
  EXPECT_NL_ERROR(instance_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, Lengths{-2, 1}),
                  "lengths[0] = -2 is negative");
  EXPECT_NL_ERROR(instance_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, Lengths{4}),
                  "1 lengths given but x");
  EXPECT_NL_ERROR(instance_norm_backward(dx.view(), bad.view(), {}, dy.cview(), x.cview(), {}, ok),
                  "dweight has shape [5] but [6] is expected");
  InstanceNormOptions iopt;
  iopt.channel_axis = 2;
  EXPECT_NL_ERROR(instance_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, ok, iopt),
                  "time_axis 2 must come after the channel axis 2");
  EXPECT_NL_ERROR(instance_norm_forward(y.view(), stats_bad.view(), {}, x.cview(), {}, {}),
                  "save_mean has shape [2, 3] but [2, 6] is expected");
  Tensor empty({0, 6, 4}), yempty({0, 6, 4});
  EXPECT_NL_ERROR(instance_norm_forward(yempty.view(), {}, {}, empty.cview(), {}, {}), "x is empty");
}

}  // namespace
}  // namespace normlab
