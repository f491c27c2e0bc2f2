// BatchNorm's training passes blocked over channels (chnorm::batch_forward_blocked / batch_backward_blocked,
// src/norm/channel_norm.cpp): the same bits as the separate passes (moments + rstd_of + normalize,
// grad_stats + input_grad) for every block size, thread count and layout the blocked passes accept, in place
// too, and the blocked backward given the blocked forward's statistics (SavedBatch) likewise; where they
// apply; and that the public BatchNorm takes them with those bits, also the backward given the forward's
// BatchNormStats (batch_norm_backward_saved). And the eval-mode backward's single pass
// (chnorm::grad_sums_input_grad_const) against its two passes.
#include <normlab/norm.h>
#include <normlab/parallel.h>

#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <tuple>

#include "norm/channel_norm.h"
#include "support/random.h"
#include "support/tolerance.h"

namespace normlab {
namespace {

using testing::bitwise_equal;

constexpr double kEps = 1e-5;

// The layouts whose segments are S consecutive floats: contiguous; every other channel of a [B, 2C, S]
// tensor (channel stride 2S); a slice [1, S + 1) of a [B, C, S + 1] tensor (channel stride S + 1, segments
// misaligned).
enum class Layout { kContiguous, kEveryOtherChannel, kMisaligned };

struct Operand {
  Tensor parent;
  View v;
};
Operand make(Layout l, const Dims& shape, std::mt19937_64& rng, double scale, double offset) {
  const Index B = shape[0], C = shape[1], S = shape[2];
  Operand o;
  switch (l) {
    case Layout::kContiguous:
      o.parent = testing::random_tensor(shape, rng, scale, offset);
      o.v = o.parent.view();
      break;
    case Layout::kEveryOtherChannel:
      o.parent = testing::random_tensor({B, 2 * C, S}, rng, scale, offset);
      o.v = o.parent.view().slice(1, 0, 2 * C, 2);
      break;
    case Layout::kMisaligned:
      o.parent = testing::random_tensor({B, C, S + 1}, rng, scale, offset);
      o.v = o.parent.view().slice(2, 1, S + 1);
      break;
  }
  return o;
}

void expect_same(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(double))) << what << " differs";
}

// A backward's statistics (mean, rstd, mean(g), mean(g·x̂), dγ, dβ) against the separate passes', bit for bit.
void expect_same_grads(const chnorm::GradStats& got, const chnorm::GradStats& want, const std::string& how) {
  expect_same(got.m.mean, want.m.mean, "backward mean" + how);
  expect_same(got.rstd, want.rstd, "backward rstd" + how);
  expect_same(got.mg, want.mg, "mean(g)" + how);
  expect_same(got.mgx, want.mgx, "mean(g·x̂)" + how);
  expect_same(got.dweight, want.dweight, "dweight" + how);
  expect_same(got.dbias, want.dbias, "dbias" + how);
}

// The blocked passes against the separate ones on plan p (x, dy of its shape), for block sizes 1, 2, 3,
// C − 1, C at 1, 2 and 3 threads (for_blocks cuts the channels into a range per thread: ranges of unequal
// sizes, ranges with an empty block, fewer channels than threads), without and with γ, β; the backward also
// given the forward's statistics (its channels' mean and rstd, its segments' means). The outputs start out
// non-zero, so that padded frames must be written 0 as the separate passes write them.
void check_blocked(const chnorm::Plan& p, ConstView x, ConstView dy, const Tensor& w, const Tensor& b) {
  const Dims& shape = x.shape();
  const Index C = p.C;
  const int saved = num_threads();
  for (const bool affine : {false, true}) {
    const float* wp = affine ? w.data() : nullptr;
    const float* bp = affine ? b.data() : nullptr;
    Tensor y_sep(shape), dx_sep(shape);
    const chnorm::Moments m = chnorm::moments(p, x);
    const std::vector<double> rstd = chnorm::rstd_of(m, kEps);
    chnorm::normalize(p, y_sep.view(), x, m.mean, rstd, wp, bp);
    const chnorm::GradStats g = chnorm::grad_stats(p, dy, x, kEps, wp);
    chnorm::input_grad(p, dx_sep.view(), dy, x, g.m.mean, g.rstd, wp, g.mg, g.mgx);
    for (const int threads : {1, 2, 3}) {
      set_num_threads(threads);
      for (const Index kc : {Index{1}, Index{2}, Index{3}, C - 1, C}) {
        if (kc < 1 || kc > C) continue;
        SCOPED_TRACE(fmt::format("affine {}, {} threads, {} channels per block", affine, threads, kc));
        Tensor y(shape), dx(shape);
        for (Index i = 0; i < y.numel(); ++i) y[i] = dx[i] = 7.0f;
        std::vector<double> rstd_b, seg_mean;
        const chnorm::Moments mb =
            chnorm::batch_forward_blocked(p, kc, y.view(), x, kEps, wp, bp, rstd_b, &seg_mean);
        EXPECT_EQ(seg_mean.size(), static_cast<std::size_t>(p.segments()));
        EXPECT_TRUE(bitwise_equal(y.cview(), y_sep.cview(), "y"));
        expect_same(mb.mean, m.mean, "mean");
        expect_same(mb.var, m.var, "var");
        expect_same(mb.count, m.count, "count");
        expect_same(rstd_b, rstd, "rstd");
        const chnorm::GradStats gb = chnorm::batch_backward_blocked(p, kc, dx.view(), dy, x, kEps, wp);
        EXPECT_TRUE(bitwise_equal(dx.cview(), dx_sep.cview(), "dx"));
        expect_same_grads(gb, g, "");
        Tensor dxs(shape);
        for (Index i = 0; i < dxs.numel(); ++i) dxs[i] = 7.0f;
        const chnorm::SavedBatch sv{mb.mean.data(), rstd_b.data(), seg_mean.data()};
        const chnorm::GradStats gs = chnorm::batch_backward_blocked(p, kc, dxs.view(), dy, x, kEps, wp, &sv);
        EXPECT_TRUE(bitwise_equal(dxs.cview(), dx_sep.cview(), "dx given the statistics"));
        expect_same_grads(gs, g, " given the statistics");
      }
    }
    set_num_threads(saved);
  }
}

TEST(BatchNormBlocked, SameBitsAsTheSeparatePassesForEveryBlockSize) {
  std::mt19937_64 rng(31);
  for (const Dims& shape :
       {Dims{3, 7, 33}, Dims{2, 5, 1025}, Dims{4, 6, 1}, Dims{1, 9, 17}, Dims{5, 4, 130}, Dims{3, 2, 40}}) {
    // Lengths from 0 to T for the masked plans (a batch item of length 0 and one of full length).
    std::vector<Index> len(static_cast<std::size_t>(shape[0]));
    for (std::size_t i = 0; i < len.size(); ++i) len[i] = static_cast<Index>(i * 5 + 3) % (shape[2] + 1);
    len[len.size() / 2] = 0;
    if (len.size() > 2) len.back() = shape[2];
    for (const Layout layout : {Layout::kContiguous, Layout::kEveryOtherChannel, Layout::kMisaligned}) {
      const Index C = shape[1];
      const Operand x = make(layout, shape, rng, 2.0, 3.0), dy = make(layout, shape, rng, 1.0, 0.1);
      const Tensor w = testing::random_tensor({C}, rng, 1.0, 1.0),
                   b = testing::random_tensor({C}, rng, 0.5, 0.0);
      for (const bool masked : {false, true}) {
        SCOPED_TRACE(
            fmt::format("shape {}, layout {}, masked {}", shape.str(), static_cast<int>(layout), masked));
        const std::span<const Index> lengths =
            masked ? std::span<const Index>(len) : std::span<const Index>{};
        check_blocked(chnorm::make_plan(shape, 1, chnorm::Grouping::kBatch, 1, lengths, -1, "test"), x.v,
                      dy.v, w, b);
      }
    }
  }
}

// y may be x, and dx may be dy or x, as for the separate passes: a block reads all of its inputs before it
// writes, and writes only its own channels.
TEST(BatchNormBlocked, InPlaceGivesTheSameBits) {
  std::mt19937_64 rng(32);
  const Dims shape{4, 5, 77};
  const Tensor x = testing::random_tensor(shape, rng, 2.0, -1.0),
               dy = testing::random_tensor(shape, rng, 1.0, 0.0);
  const chnorm::Plan p = chnorm::make_plan(shape, 1, chnorm::Grouping::kBatch, 1, {}, -1, "test");
  for (const Index kc : {1, 2, 5}) {
    SCOPED_TRACE(fmt::format("{} channels per block", kc));
    Tensor y(shape), dx(shape);
    std::vector<double> r1, r2;
    chnorm::batch_forward_blocked(p, kc, y.view(), x.cview(), kEps, nullptr, nullptr, r1);
    Tensor xy = x.clone();
    chnorm::batch_forward_blocked(p, kc, xy.view(), xy.cview(), kEps, nullptr, nullptr, r2);
    EXPECT_TRUE(bitwise_equal(xy.cview(), y.cview(), "y over x"));
    chnorm::batch_backward_blocked(p, kc, dx.view(), dy.cview(), x.cview(), kEps, nullptr);
    Tensor dydx = dy.clone();
    chnorm::batch_backward_blocked(p, kc, dydx.view(), dydx.cview(), x.cview(), kEps, nullptr);
    EXPECT_TRUE(bitwise_equal(dydx.cview(), dx.cview(), "dx over dy"));
    Tensor xdx = x.clone();
    chnorm::batch_backward_blocked(p, kc, xdx.view(), dy.cview(), xdx.cview(), kEps, nullptr);
    EXPECT_TRUE(bitwise_equal(xdx.cview(), dx.cview(), "dx over x"));
  }
}

TEST(BatchNormBlocked, AppliesOnlyWhereItKeepsInputsInCache) {
  // [64, 64, 250]: 64 KB a channel (128 KB with dy), 4 MB in all: blocked on any L2 from 512 KB to 16 MB.
  const Dims big{64, 64, 250};
  Tensor x(big), y(big), dy(big);
  const chnorm::Plan p = chnorm::make_plan(big, 1, chnorm::Grouping::kBatch, 1, {}, -1, "test");
  const Index kf = chnorm::block_channels(p, 1, {x.cview(), y.cview()});
  const Index kb = chnorm::block_channels(p, 2, {x.cview(), dy.cview(), y.cview()});
  EXPECT_GE(kf, 1);
  EXPECT_GE(kb, 1);
  EXPECT_LE(kb, kf);
  EXPECT_LT(kf, 64);  // (all 64 channels within the budget: not blocked)
  // Not for: a small tensor (already in cache), segments that are not consecutive floats, and the
  // per-sample groupings.
  const Dims small{4, 8, 100};
  Tensor xs(small);
  EXPECT_EQ(
      0, chnorm::block_channels(chnorm::make_plan(small, 1, chnorm::Grouping::kBatch, 1, {}, -1, "test"), 1,
                                {xs.cview(), xs.cview()}));
  Tensor xt({64, 250, 64});
  EXPECT_EQ(0, chnorm::block_channels(p, 1, {xt.cview().permute({0, 2, 1}), y.cview()}));
  // Masked: with the time axis leading (a segment's real frames come first), yes; behind another axis, no.
  const std::vector<Index> len(64, 200);
  EXPECT_GE(chnorm::block_channels(chnorm::make_plan(big, 1, chnorm::Grouping::kBatch, 1, len, -1, "test"), 1,
                                   {x.cview(), y.cview()}),
            1);
  const Dims big4{64, 64, 5, 50};
  Tensor x4(big4), y4(big4);
  EXPECT_EQ(0, chnorm::block_channels(chnorm::make_plan(big4, 1, chnorm::Grouping::kBatch, 1,
                                                        std::vector<Index>(64, 40), 3, "test"),
                                      1, {x4.cview(), y4.cview()}));
  EXPECT_EQ(
      0, chnorm::block_channels(chnorm::make_plan(big, 1, chnorm::Grouping::kInstance, 1, {}, -1, "test"), 1,
                                {x.cview(), y.cview()}));
}

// The public BatchNorm on a shape the blocked passes take: the bits of the separate passes, and the same
// for one, two and three threads.
TEST(BatchNormBlocked, PublicBatchNormGivesTheSeparatePassesBits) {
  std::mt19937_64 rng(33);
  const Dims shape{64, 64, 250};
  const Tensor x = testing::random_tensor(shape, rng, 2.0, 3.0),
               dy = testing::random_tensor(shape, rng, 1.0, 0.0);
  const Tensor w = testing::random_tensor({64}, rng, 1.0, 1.0),
               b = testing::random_tensor({64}, rng, 0.5, 0.0);
  const chnorm::Plan p = chnorm::make_plan(shape, 1, chnorm::Grouping::kBatch, 1, {}, -1, "test");
  Tensor y_sep(shape), dx_sep(shape);
  const chnorm::Moments m = chnorm::moments(p, x.cview());
  chnorm::normalize(p, y_sep.view(), x.cview(), m.mean, chnorm::rstd_of(m, kEps), w.data(), b.data());
  const chnorm::GradStats g = chnorm::grad_stats(p, dy.cview(), x.cview(), kEps, w.data());
  chnorm::input_grad(p, dx_sep.view(), dy.cview(), x.cview(), g.m.mean, g.rstd, w.data(), g.mg, g.mgx);
  const int saved = num_threads();
  for (const int threads : {1, 2, 3}) {
    set_num_threads(threads);
    SCOPED_TRACE(fmt::format("{} threads", threads));
    ASSERT_GE(chnorm::block_channels(p, 2, {x.cview(), dy.cview(), dx_sep.cview()}), 1);
    Tensor y(shape), mean({64}), rstd({64}), dx(shape), dw({64}), db({64});
    batch_norm_forward(y.view(), mean.view(), rstd.view(), View{}, View{}, nullptr, x.cview(), w.cview(),
                       b.cview());
    batch_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), {}, {});
    EXPECT_TRUE(bitwise_equal(y.cview(), y_sep.cview(), "y"));
    EXPECT_TRUE(bitwise_equal(dx.cview(), dx_sep.cview(), "dx"));
    for (Index c = 0; c < 64; ++c) {
      const std::size_t i = static_cast<std::size_t>(c);
      EXPECT_EQ(mean[c], static_cast<float>(m.mean[i]));
      EXPECT_EQ(dw[c], static_cast<float>(g.dweight[i]));
      EXPECT_EQ(db[c], static_cast<float>(g.dbias[i]));
    }
  }
  set_num_threads(saved);
}

// BatchNormStats: the forward that keeps them writes what the forward without them writes (y, save_mean,
// save_rstd, the running statistics) and keeps the double statistics (against the separate passes'
// moments; one mean per segment where it ran blocked, none elsewhere); the backward given them returns
// bitwise what batch_norm_backward returns, at 1, 2 and 3 threads, on the blocked route (contiguous, with
// segments of all −0.0, all +0.0, a constant and a NaN, whose means of ±0 recompute their Σx), masked with
// an item of length 0, without γ, with only dx, accumulating into dγ, dβ, and on routes that recompute
// (a small tensor, the channels innermost); on the blocked route it takes the kept values (a changed mean
// changes dx).
TEST(BatchNormStats, BackwardGivenThemHasTheRecomputingBackwardsBits) {
  std::mt19937_64 rng(35);
  struct Case {
    Dims shape;
    int channel_axis;
    bool masked, blocked;
  };
  const Index C = 64;
  for (const Case& k : {Case{{64, C, 250}, 1, false, true}, Case{{64, C, 250}, 1, true, true},
                        Case{{4, 8, 33}, 1, false, false}, Case{{64, 250, C}, 2, false, false}}) {
    const Dims& shape = k.shape;
    Tensor x = testing::random_tensor(shape, rng, 2.0, 3.0);
    const Tensor dy = testing::random_tensor(shape, rng, 1.0, 0.0);
    if (k.blocked) {  // segments (b, c) = (1, 3), (2, 5), (3, 7), (4, 9): −0.0, +0.0, constant, a NaN
      for (Index t = 0; t < shape[2]; ++t) {
        x.data()[(1 * C + 3) * shape[2] + t] = -0.0f;
        x.data()[(2 * C + 5) * shape[2] + t] = 0.0f;
        x.data()[(3 * C + 7) * shape[2] + t] = 1.25f;
      }
      x.data()[(4 * C + 9) * shape[2] + 17] = std::numeric_limits<float>::quiet_NaN();
    }
    std::vector<Index> len(static_cast<std::size_t>(shape[0]), shape[2]);
    if (k.masked) {
      for (std::size_t i = 0; i < len.size(); ++i) len[i] = static_cast<Index>(i * 37 + 11) % (shape[2] + 1);
      len[5] = 0;
    }
    const std::span<const Index> lengths = k.masked ? std::span<const Index>(len) : std::span<const Index>{};
    BatchNormOptions opt;
    opt.channel_axis = k.channel_axis;
    const Index nc = shape[static_cast<std::size_t>(k.channel_axis)];
    const Tensor w = testing::random_tensor({nc}, rng, 1.0, 1.0),
                 b = testing::random_tensor({nc}, rng, 0.5, 0.0);
    const int saved_threads = num_threads();
    for (const int threads : {1, 2, 3}) {
      set_num_threads(threads);
      SCOPED_TRACE(fmt::format("shape {}, masked {}, {} threads", shape.str(), k.masked, threads));
      Tensor y0(shape), y1(shape), m0({nc}), m1({nc}), r0({nc}), r1({nc});
      Tensor rm0({nc}), rv0({nc}), rm1({nc}), rv1({nc});
      for (Index c = 0; c < nc; ++c) rm0[c] = rm1[c] = 0.5f, rv0[c] = rv1[c] = 2.0f;
      batch_norm_forward(y0.view(), m0.view(), r0.view(), rm0.view(), rv0.view(), nullptr, x.cview(),
                         w.cview(), b.cview(), lengths, opt);
      BatchNormStats st;
      batch_norm_forward(y1.view(), m1.view(), r1.view(), rm1.view(), rv1.view(), nullptr, x.cview(),
                         w.cview(), b.cview(), lengths, opt, &st);
      for (const auto& [a, c, what] :
           {std::tuple{&y0, &y1, "y"}, std::tuple{&m0, &m1, "save_mean"}, std::tuple{&r0, &r1, "save_rstd"},
            std::tuple{&rm0, &rm1, "running_mean"}, std::tuple{&rv0, &rv1, "running_var"}})
        EXPECT_TRUE(bitwise_equal(c->cview(), a->cview(), what));
      const chnorm::Plan p =
          chnorm::make_plan(shape, k.channel_axis, chnorm::Grouping::kBatch, 1, lengths, -1, "test");
      const chnorm::Moments mm = chnorm::moments(p, x.cview());
      expect_same(st.mean, mm.mean, "kept mean");
      expect_same(st.rstd, chnorm::rstd_of(mm, opt.eps), "kept rstd");
      EXPECT_EQ(st.x_shape, shape);
      EXPECT_EQ(st.channel_axis, k.channel_axis);
      EXPECT_EQ(st.eps, opt.eps);
      EXPECT_EQ(st.lengths, k.masked ? len : std::vector<Index>{});
      EXPECT_EQ(st.segment_mean.size(), k.blocked ? static_cast<std::size_t>(p.segments()) : std::size_t{0});
      for (const bool with_w : {true, false}) {
        for (const bool params : {true, false}) {
          for (const GradMode mode : {GradMode::kOverwrite, GradMode::kAccumulate}) {
            if (!params && mode == GradMode::kAccumulate) continue;
            SCOPED_TRACE(
                fmt::format("γ {}, dγ/dβ {}, accumulate {}", with_w, params, mode == GradMode::kAccumulate));
            Tensor dx0(shape), dx1(shape), dw0({nc}), db0({nc}), dw1({nc}), db1({nc});
            for (Index c = 0; c < nc; ++c) dw0[c] = dw1[c] = 0.25f, db0[c] = db1[c] = -1.5f;
            const ConstView wv = with_w ? w.cview() : ConstView{};
            batch_norm_backward(dx0.view(), params ? dw0.view() : View{}, params ? db0.view() : View{},
                                dy.cview(), x.cview(), wv, {}, {}, lengths, opt, mode);
            batch_norm_backward_saved(dx1.view(), params ? dw1.view() : View{}, params ? db1.view() : View{},
                                      dy.cview(), x.cview(), wv, st, mode);
            EXPECT_TRUE(bitwise_equal(dx1.cview(), dx0.cview(), "dx"));
            EXPECT_TRUE(bitwise_equal(dw1.cview(), dw0.cview(), "dweight"));
            EXPECT_TRUE(bitwise_equal(db1.cview(), db0.cview(), "dbias"));
          }
        }
      }
      if (k.blocked) {  // the kept values are what it takes: a changed channel mean changes that channel's dx
        BatchNormStats changed = st;
        changed.mean[11] += 0.5;
        Tensor dx0(shape), dx1(shape);
        batch_norm_backward_saved(dx0.view(), View{}, View{}, dy.cview(), x.cview(), w.cview(), st);
        batch_norm_backward_saved(dx1.view(), View{}, View{}, dy.cview(), x.cview(), w.cview(), changed);
        EXPECT_NE(dx0[11 * shape[2]], dx1[11 * shape[2]]);
        EXPECT_EQ(dx0[12 * shape[2]], dx1[12 * shape[2]]);
      }
    }
    set_num_threads(saved_threads);
  }
}

TEST(BatchNormStats, MisuseGetsClearMessages) {
  const Dims shape{4, 3, 10};
  Tensor x(shape), y(shape), dy(shape), dx(shape);
  for (Index i = 0; i < x.numel(); ++i) x[i] = static_cast<float>(i % 7), dy[i] = 1.0f;
  BatchNormStats st;
  batch_norm_forward(y.view(), View{}, View{}, View{}, View{}, nullptr, x.cview(), {}, {}, {}, {}, &st);
  EXPECT_NL_ERROR(batch_norm_forward(y.view(), View{}, View{}, View{}, View{}, nullptr, x.cview(), {}, {}, {},
                                     {}, nullptr),
                  "stats is null");
  BatchNormOptions eval;
  eval.training = false;
  Tensor rm({3}), rv({3});
  for (Index c = 0; c < 3; ++c) rm[c] = 0.0f, rv[c] = 1.0f;
  EXPECT_NL_ERROR(batch_norm_forward(y.view(), View{}, View{}, rm.view(), rv.view(), nullptr, x.cview(), {},
                                     {}, {}, eval, &st),
                  "training mode only");
  Tensor x2({4, 3, 11}), dy2({4, 3, 11}), dx2({4, 3, 11});
  EXPECT_NL_ERROR(batch_norm_backward_saved(dx2.view(), View{}, View{}, dy2.cview(), x2.cview(), {}, st),
                  "the stats' forward had [4, 3, 10]");
  EXPECT_NL_ERROR(batch_norm_backward_saved(dx.view(), View{}, View{}, ConstView{}, x.cview(), {}, st),
                  "x and dy are required");
  BatchNormStats bad = st;
  bad.rstd.pop_back();
  EXPECT_NL_ERROR(batch_norm_backward_saved(dx.view(), View{}, View{}, dy.cview(), x.cview(), {}, bad),
                  "stats hold 3 mean and 2 rstd values for 3 channels");
  bad = st;
  bad.segment_mean.assign(5, 0.0);
  EXPECT_NL_ERROR(batch_norm_backward_saved(dx.view(), View{}, View{}, dy.cview(), x.cview(), {}, bad),
                  "stats hold 5 segment means for 12 segments");
  bad = st;
  bad.eps = -1;
  EXPECT_NL_ERROR(batch_norm_backward_saved(dx.view(), View{}, View{}, dy.cview(), x.cview(), {}, bad),
                  "eps");
  bad = st;
  bad.lengths = {10, 10};
  EXPECT_NL_ERROR(batch_norm_backward_saved(dx.view(), View{}, View{}, dy.cview(), x.cview(), {}, bad),
                  "lengths");
}

// The eval-mode backward with dγ, dβ in one pass: the bits of grad_sums + input_grad_const on contiguous,
// permuted (gathered) and masked layouts, and with dx over dy or over x.
TEST(BatchNormEvalBackward, OnePassGivesTheTwoPassesBits) {
  std::mt19937_64 rng(34);
  const Dims shape{3, 5, 6, 41};  // [B, C, F, T]
  const Tensor xp = testing::random_tensor(shape, rng, 2.0, 1.0),
               dyp = testing::random_tensor(shape, rng, 1.0, 0.0);
  const Tensor w = testing::random_tensor({5}, rng, 1.0, 1.0);
  std::vector<double> mean(5), rstd(5);
  for (std::size_t c = 0; c < 5; ++c) {
    mean[c] = 0.3 * static_cast<double>(c) - 0.5;
    rstd[c] = 0.7 + 0.1 * static_cast<double>(c);
  }
  const std::vector<Index> len{41, 0, 17};
  struct Case {
    const char* name;
    bool permuted;  // x, dy as [B, C, T, F] views of [B, C, F, T] memory: segments gathered
    bool masked;    // lengths over the last axis (T leads only when not permuted)
  };
  for (const Case cs : {Case{"contiguous", false, false}, Case{"contiguous masked", false, true},
                        Case{"permuted", true, false}, Case{"permuted masked", true, true}}) {
    SCOPED_TRACE(cs.name);
    const ConstView x = cs.permuted ? xp.cview().permute({0, 1, 3, 2}) : xp.cview();
    const ConstView dy = cs.permuted ? dyp.cview().permute({0, 1, 3, 2}) : dyp.cview();
    const std::span<const Index> lengths = cs.masked ? std::span<const Index>(len) : std::span<const Index>{};
    const int ta = cs.permuted ? 2 : 3;
    const chnorm::Plan p = chnorm::make_plan(x.shape(), 1, chnorm::Grouping::kBatch, 1, lengths, ta, "test");
    for (const bool affine : {false, true}) {
      const float* wp = affine ? w.data() : nullptr;
      Tensor dx2(x.shape()), dx1(x.shape());
      std::vector<double> sdy2, sdyxh2, sdy1, sdyxh1;
      chnorm::grad_sums(p, dy, x, mean, rstd, sdy2, sdyxh2);
      chnorm::input_grad_const(p, dx2.view(), dy, rstd, wp);
      chnorm::grad_sums_input_grad_const(p, dx1.view(), dy, x, mean, rstd, wp, sdy1, sdyxh1);
      EXPECT_TRUE(bitwise_equal(dx1.cview(), dx2.cview(), "dx"));
      expect_same(sdy1, sdy2, "sdy");
      expect_same(sdyxh1, sdyxh2, "sdyxh");
    }
    // In place (contiguous operands of the view's shape): dx over dy, dx over x.
    const Tensor xc = Tensor::copy_of(x), dyc = Tensor::copy_of(dy);
    Tensor dx(x.shape());
    std::vector<double> a, b2;
    chnorm::grad_sums_input_grad_const(p, dx.view(), dyc.cview(), xc.cview(), mean, rstd, w.data(), a, b2);
    Tensor over_dy = dyc.clone(), over_x = xc.clone();
    chnorm::grad_sums_input_grad_const(p, over_dy.view(), over_dy.cview(), xc.cview(), mean, rstd, w.data(),
                                       a, b2);
    chnorm::grad_sums_input_grad_const(p, over_x.view(), dyc.cview(), over_x.cview(), mean, rstd, w.data(), a,
                                       b2);
    EXPECT_TRUE(bitwise_equal(over_dy.cview(), dx.cview(), "dx over dy"));
    EXPECT_TRUE(bitwise_equal(over_x.cview(), dx.cview(), "dx over x"));
  }
}

}  // namespace
}  // namespace normlab
