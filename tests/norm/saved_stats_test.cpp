// NormStats: the double statistics a LayerNorm/RMSNorm forward keeps for its backward. The backward that
// takes them must return bitwise what the backward that recomputes them returns (same dx, dγ, dβ) on every
// SIMD target and thread count, on every route (contiguous rows short and long, the gathered route, the
// [B,F,T] column path); the forward with them must not change y, mean or rstd; the
// kept values are the exact mean and the double rstd (hand case, float64 reference); misuse is an error.
#include <fmt/format.h>
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/reference.h>
#include <normlab/simd.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "norm/lowp_support.h"
#include "support/random.h"
#include "support/tolerance.h"

namespace normlab {
namespace {

using testing::bitwise_equal;

struct Grads {
  Tensor dx, dw, db;
};

// LayerNorm (center) or RMSNorm backward, with or without the stats.
Grads backward(bool center, ConstView dy, ConstView x, ConstView w, const Axes& axes, double eps,
               const NormStats* stats) {
  const Dims ns = normalized_shape(x.shape(), axes);
  Grads g{Tensor(x.shape()), Tensor(ns), Tensor(ns)};
  if (center) {
    if (stats)
      layer_norm_backward_saved(g.dx.view(), g.dw.view(), g.db.view(), dy, x, w, *stats);
    else
      layer_norm_backward(g.dx.view(), g.dw.view(), g.db.view(), dy, x, w, axes, eps);
  } else {
    if (stats)
      rms_norm_backward_saved(g.dx.view(), g.dw.view(), dy, x, w, *stats);
    else
      rms_norm_backward(g.dx.view(), g.dw.view(), dy, x, w, axes, eps);
  }
  return g;
}

// The forward with stats: y, mean, rstd bitwise those of the forward without; returns the stats.
NormStats forward_keeping(bool center, ConstView x, ConstView w, const Axes& axes, double eps,
                          const std::string& what) {
  const Dims ks = kept_shape(x.shape(), axes);
  Tensor y0(x.shape()), m0(ks), r0(ks), y1(x.shape()), m1(ks), r1(ks);
  NormStats st;
  if (center) {
    layer_norm_forward(y0.view(), m0.view(), r0.view(), x, w, {}, axes, eps);
    layer_norm_forward(y1.view(), m1.view(), r1.view(), x, w, {}, axes, eps, &st);
    EXPECT_TRUE(bitwise_equal(m0.cview(), m1.cview(), what + " mean"));
  } else {
    rms_norm_forward(y0.view(), r0.view(), x, w, axes, eps);
    rms_norm_forward(y1.view(), r1.view(), x, w, axes, eps, &st);
  }
  EXPECT_TRUE(bitwise_equal(y0.cview(), y1.cview(), what + " y"));
  EXPECT_TRUE(bitwise_equal(r0.cview(), r1.cview(), what + " rstd"));
  return st;
}

void expect_same_grads(const Grads& a, const Grads& b, bool center, const std::string& what) {
  EXPECT_TRUE(bitwise_equal(a.dx.cview(), b.dx.cview(), what + " dx"));
  EXPECT_TRUE(bitwise_equal(a.dw.cview(), b.dw.cview(), what + " dweight"));
  if (center) {
    EXPECT_TRUE(bitwise_equal(a.db.cview(), b.db.cview(), what + " dbias"));
  }
}

TEST(NormStats, HandCase) {
  // [[1,2,3],[3,4,5]] over the last axis: means 2 and 4, variance 2/3.
  Tensor x({2, 3}), y({2, 3});
  const float v[6] = {1, 2, 3, 3, 4, 5};
  for (int i = 0; i < 6; ++i) x.data()[i] = v[i];
  NormStats st;
  layer_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, {-1}, 0.0, &st);
  EXPECT_TRUE(st.center);
  EXPECT_EQ(st.x_shape, Dims({2, 3}));
  EXPECT_EQ(st.axes, Dims({1}));
  EXPECT_EQ(st.eps, 0.0);
  ASSERT_EQ(st.mean.size(), 2u);
  ASSERT_EQ(st.rstd.size(), 2u);
  EXPECT_EQ(st.mean[0], 2.0);
  EXPECT_EQ(st.mean[1], 4.0);
  const double want = 1.0 / std::sqrt(2.0 / 3.0);
  for (double r : st.rstd) EXPECT_NEAR(r, want, 4 * DBL_EPSILON * want);
  NormStats rs;
  rms_norm_forward(y.view(), {}, x.cview(), {}, {1}, 0.0, &rs);
  EXPECT_FALSE(rs.center);
  EXPECT_TRUE(rs.mean.empty());
  ASSERT_EQ(rs.rstd.size(), 2u);
  EXPECT_NEAR(rs.rstd[0], 1.0 / std::sqrt(14.0 / 3.0), 4 * DBL_EPSILON);
  EXPECT_NEAR(rs.rstd[1], 1.0 / std::sqrt(50.0 / 3.0), 4 * DBL_EPSILON);
}

// The kept statistics against the float64 reference, at an offset where an fp32 mean would be 1e-3 off.
TEST(NormStats, KeptValuesAreTheDoubleStatistics) {
  std::mt19937_64 rng(41);
  Tensor x = testing::random_tensor({19, 768}, rng, 1.0, 1e4);
  Tensor y(x.shape());
  NormStats st;
  layer_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, {1}, 1e-5, &st);
  const ref::LayerNormOut r = ref::layer_norm_forward(x.cview(), ConstView{}, ConstView{}, {1}, 1e-5);
  for (Index g = 0; g < 19; ++g) {
    const double m = r.mean.data()[g], rs = r.rstd.data()[g];
    EXPECT_NEAR(st.mean[static_cast<std::size_t>(g)], m, 1e-12 * std::abs(m)) << g;
    EXPECT_NEAR(st.rstd[static_cast<std::size_t>(g)], rs, 1e-6 * rs) << g;  // fp32 squares (numerics.md)
  }
}

// Contiguous rows (short rows in blocks of eight, long rows one by one, row counts that leave a partial
// block), the gathered route (non-contiguous groups) and the column path: the backward with stats has the
// bits of the backward without, on every SIMD target, at 1 and 3 threads, for LayerNorm and RMSNorm.
TEST(NormStats, BackwardHasTheBitsOfTheRecomputingBackwardEverywhere) {
  std::mt19937_64 rng(43);
  struct Case {
    Dims shape;
    Axes axes;
    bool transpose;  // x, dy as a transposed view of a contiguous parent (the gathered route)
  };
  const std::vector<Case> cases = {
      {{1, 1}, {1}, false},    {{7, 1}, {1}, false},      {{33, 7}, {1}, false},
      {{29, 64}, {1}, false},  {{70, 80}, {1}, false},    {{13, 100}, {1}, false},
      {{5, 1025}, {1}, false}, {{3, 4096}, {1}, false},   {{2, 9, 33}, {1, 2}, false},
      {{33, 12}, {0}, true},   {{4, 80, 40}, {1}, false},  // the last: [B,F,T] over F
  };
  const Isa saved_isa = active_isa();
  const int saved_threads = num_threads();
  for (const Case& c : cases) {
    for (bool center : {true, false}) {
      Tensor xp = testing::random_tensor(c.shape, rng, 2.0, center ? 3.0 : 0.5);
      Tensor dyp = testing::random_tensor(c.shape, rng, 1.0, 0.0);
      ConstView x = xp.cview(), dy = dyp.cview();
      if (c.transpose) {
        const int order[2] = {1, 0};
        x = x.permute(std::span<const int>(order));
        dy = dy.permute(std::span<const int>(order));
      }
      Tensor w = testing::random_tensor(normalized_shape(x.shape(), c.axes), rng, 1.0, 1.0);
      for (Isa isa : supported_isas()) {
        set_isa(isa);
        for (int t : {1, 3}) {
          set_num_threads(t);
          const std::string what =
              fmt::format("{} {} axes[0]={} {} {} threads", center ? "LayerNorm" : "RMSNorm", x.shape().str(),
                          c.axes[0], isa_name(isa), t);
          const NormStats st = forward_keeping(center, x, w.cview(), c.axes, 1e-5, what);
          EXPECT_EQ(st.rstd.size(), static_cast<std::size_t>(x.numel() / w.numel())) << what;
          for (bool with_w : {true, false}) {
            const ConstView wv = with_w ? w.cview() : ConstView{};
            expect_same_grads(backward(center, dy, x, wv, c.axes, 1e-5, nullptr),
                              backward(center, dy, x, wv, c.axes, 1e-5, &st), center,
                              what + (with_w ? " with γ" : " without γ"));
          }
        }
      }
      set_isa(saved_isa);
      set_num_threads(saved_threads);
    }
  }
}

// The kept values are what the backward uses (so the test above compares two routes, not one): a
// changed rstd changes dx, on contiguous rows, on the gathered route and on the column path.
TEST(NormStats, TheBackwardTakesTheKeptValues) {
  std::mt19937_64 rng(47);
  for (int layout = 0; layout < 3; ++layout) {
    const Dims shape = layout == 2 ? Dims{3, 40, 24} : Dims{24, 40};
    Tensor xp = testing::random_tensor(shape, rng, 2.0, 1.0),
           dyp = testing::random_tensor(shape, rng, 1.0, 0.0);
    ConstView x = xp.cview(), dy = dyp.cview();
    const int order[2] = {1, 0};
    if (layout == 1) {
      x = x.permute(std::span<const int>(order));
      dy = dy.permute(std::span<const int>(order));
    }
    const Axes axes = {1};
    const std::string what = layout == 0 ? "rows" : layout == 1 ? "gathered" : "column";
    NormStats st = forward_keeping(true, x, {}, axes, 1e-5, what);
    const Grads g0 = backward(true, dy, x, {}, axes, 1e-5, &st);
    for (double& r : st.rstd) r *= 2;
    const Grads g1 = backward(true, dy, x, {}, axes, 1e-5, &st);
    EXPECT_FALSE(bitwise_equal(g0.dx.cview(), g1.dx.cview())) << what;
  }
}

// Bitwise equality of two views of any storage type (fp32, bf16, fp16), element by element.
template <typename T>
::testing::AssertionResult same_bits(TensorView<const T> a, TensorView<const T> b, const std::string& what) {
  const BasicTensor<T> ca = BasicTensor<T>::copy_of(a), cb = BasicTensor<T>::copy_of(b);
  if (ca.shape() != cb.shape()) return ::testing::AssertionFailure() << what << ": shapes differ";
  for (Index i = 0; i < ca.numel(); ++i)
    if (std::memcmp(&ca.data()[i], &cb.data()[i], sizeof(T)) != 0)
      return ::testing::AssertionFailure() << what << ": flat index " << i << " differs";
  return ::testing::AssertionSuccess();
}

// bf16/fp16 storage: the forward keeps the stats of the fp32 forward on the widened x (bitwise), leaves
// y, mean, rstd unchanged, and the saved backward has the bits of the recomputing one (dx in storage,
// dγ, dβ), on the direct route (flat rows) and the widening route (a transposed view), every target,
// 1 and 3 threads.
template <typename T>
void check_storage(bool center, const Dims& shape, bool transpose, std::mt19937_64& rng) {
  const BasicTensor<T> xp = testing::convert_copy<T>(testing::random_tensor(shape, rng, 2.0, 1.0).cview());
  const BasicTensor<T> dyp = testing::convert_copy<T>(testing::random_tensor(shape, rng, 1.0, 0.0).cview());
  TensorView<const T> x = xp.cview(), dy = dyp.cview();
  const int order[2] = {1, 0};
  if (transpose) {
    x = x.permute(std::span<const int>(order));
    dy = dy.permute(std::span<const int>(order));
  }
  const Axes axes = {1};
  const Tensor w = testing::random_tensor(normalized_shape(x.shape(), axes), rng, 1.0, 1.0);
  const Tensor xf = testing::convert_copy<float>(x);
  const Dims ks = kept_shape(x.shape(), axes), ns = normalized_shape(x.shape(), axes);
  for (Isa isa : supported_isas()) {
    set_isa(isa);
    for (int t : {1, 3}) {
      set_num_threads(t);
      const std::string what =
          fmt::format("{} {} {}{} {} {} threads", testing::type_name<T>(), center ? "LayerNorm" : "RMSNorm",
                      x.shape().str(), transpose ? " transposed" : "", isa_name(isa), t);
      BasicTensor<T> y0(x.shape()), y1(x.shape());
      Tensor r0(ks), r1(ks), yf(x.shape());
      NormStats st, stf;
      if (center) {
        layer_norm_forward(y0.view(), {}, r0.view(), x, w.cview(), {}, axes, 1e-5);
        layer_norm_forward(y1.view(), {}, r1.view(), x, w.cview(), {}, axes, 1e-5, &st);
        layer_norm_forward(yf.view(), {}, {}, xf.cview(), w.cview(), {}, axes, 1e-5, &stf);
      } else {
        rms_norm_forward(y0.view(), r0.view(), x, w.cview(), axes, 1e-5);
        rms_norm_forward(y1.view(), r1.view(), x, w.cview(), axes, 1e-5, &st);
        rms_norm_forward(yf.view(), {}, xf.cview(), w.cview(), axes, 1e-5, &stf);
      }
      EXPECT_TRUE(same_bits<T>(y0.cview(), y1.cview(), what + " y"));
      EXPECT_TRUE(bitwise_equal(r0.cview(), r1.cview(), what + " rstd"));
      EXPECT_TRUE(st.mean == stf.mean && st.rstd == stf.rstd && st.axes == stf.axes && st.eps == stf.eps)
          << what << ": the stats are not those of the fp32 forward on the widened x";
      BasicTensor<T> dx0(x.shape()), dx1(x.shape());
      Tensor dw0(ns), dw1(ns), db0(ns), db1(ns);
      if (center) {
        layer_norm_backward(dx0.view(), dw0.view(), db0.view(), dy, x, w.cview(), axes, 1e-5);
        layer_norm_backward_saved(dx1.view(), dw1.view(), db1.view(), dy, x, w.cview(), st);
        EXPECT_TRUE(bitwise_equal(db0.cview(), db1.cview(), what + " dbias"));
      } else {
        rms_norm_backward(dx0.view(), dw0.view(), dy, x, w.cview(), axes, 1e-5);
        rms_norm_backward_saved(dx1.view(), dw1.view(), dy, x, w.cview(), st);
      }
      EXPECT_TRUE(same_bits<T>(dx0.cview(), dx1.cview(), what + " dx"));
      EXPECT_TRUE(bitwise_equal(dw0.cview(), dw1.cview(), what + " dweight"));
    }
  }
}

TEST(NormStats, SixteenBitStorage) {
  std::mt19937_64 rng(53);
  const Isa saved_isa = active_isa();
  const int saved_threads = num_threads();
  for (bool center : {true, false}) {
    for (const Dims& shape : {Dims{33, 7}, Dims{29, 64}, Dims{5, 1025}}) {
      check_storage<bfloat16>(center, shape, false, rng);
      check_storage<float16>(center, shape, false, rng);
    }
    check_storage<bfloat16>(center, Dims{24, 40}, true, rng);
    check_storage<float16>(center, Dims{24, 40}, true, rng);
  }
  set_isa(saved_isa);
  set_num_threads(saved_threads);
  // The direct bf16 route takes the kept values too: a changed rstd changes dx.
  const BF16Tensor x =
      testing::convert_copy<bfloat16>(testing::random_tensor({24, 40}, rng, 2.0, 1.0).cview());
  const BF16Tensor dy =
      testing::convert_copy<bfloat16>(testing::random_tensor({24, 40}, rng, 1.0, 0.0).cview());
  BF16Tensor y(x.shape()), dx0(x.shape()), dx1(x.shape());
  NormStats st;
  layer_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, {1}, 1e-5, &st);
  layer_norm_backward_saved(dx0.view(), {}, {}, dy.cview(), x.cview(), {}, st);
  for (double& r : st.rstd) r *= 2;
  layer_norm_backward_saved(dx1.view(), {}, {}, dy.cview(), x.cview(), {}, st);
  EXPECT_FALSE(same_bits<bfloat16>(dx0.cview(), dx1.cview(), "bf16 rows"));
}

// The fused residual add + norm (fp32, bf16 and fp16): the forward with stats writes the s, y, mean and rstd
// of the forward without, and keeps the stats of the fp32 forward on the (widened) stored s; the saved
// backward has the bits of the recomputing one, with and without ds, on the direct route (flat rows: short
// rows in blocks of eight, long rows, a partial block) and the widening route (transposed views), every
// target, 1 and 3 threads.
template <typename T>
void check_fused(bool center, const Dims& shape, bool transpose, std::mt19937_64& rng) {
  auto make = [&](double scale, double offset) {
    return testing::convert_copy<T>(testing::random_tensor(shape, rng, scale, offset).cview());
  };
  const BasicTensor<T> xp = make(2.0, 1.0), rp = make(1.0, 0.5), dyp = make(1.0, 0.0), dsp = make(1.0, 0.0);
  TensorView<const T> x = xp.cview(), r = rp.cview(), dy = dyp.cview(), ds = dsp.cview();
  const int order[2] = {1, 0};
  if (transpose) {
    x = x.permute(std::span<const int>(order));
    r = r.permute(std::span<const int>(order));
    dy = dy.permute(std::span<const int>(order));
    ds = ds.permute(std::span<const int>(order));
  }
  const Axes axes = {1};
  const Tensor w = testing::random_tensor(normalized_shape(x.shape(), axes), rng, 1.0, 1.0);
  const Tensor b = testing::random_tensor(normalized_shape(x.shape(), axes), rng, 1.0, 0.0);
  const Dims ks = kept_shape(x.shape(), axes), ns = normalized_shape(x.shape(), axes);
  const double eps = 1e-5;
  for (Isa isa : supported_isas()) {
    set_isa(isa);
    for (int t : {1, 3}) {
      set_num_threads(t);
      const std::string what = fmt::format("fused {} {} {}{} {} {} threads", testing::type_name<T>(),
                                           center ? "LayerNorm" : "RMSNorm", x.shape().str(),
                                           transpose ? " transposed" : "", isa_name(isa), t);
      BasicTensor<T> s0(x.shape()), s1(x.shape()), y0(x.shape()), y1(x.shape());
      Tensor m0(ks), m1(ks), r0(ks), r1(ks), yf(x.shape());
      NormStats st, stf;
      if (center) {
        add_layer_norm_forward(s0.view(), y0.view(), m0.view(), r0.view(), x, r, w.cview(), b.cview(), axes,
                               eps);
        add_layer_norm_forward(s1.view(), y1.view(), m1.view(), r1.view(), x, r, w.cview(), b.cview(), axes,
                               eps, &st);
        EXPECT_TRUE(bitwise_equal(m0.cview(), m1.cview(), what + " mean"));
      } else {
        add_rms_norm_forward(s0.view(), y0.view(), r0.view(), x, r, w.cview(), axes, eps);
        add_rms_norm_forward(s1.view(), y1.view(), r1.view(), x, r, w.cview(), axes, eps, &st);
      }
      EXPECT_TRUE(same_bits<T>(s0.cview(), s1.cview(), what + " s"));
      EXPECT_TRUE(same_bits<T>(y0.cview(), y1.cview(), what + " y"));
      EXPECT_TRUE(bitwise_equal(r0.cview(), r1.cview(), what + " rstd"));
      // The stats are those of the fp32 forward on the widened stored s.
      const Tensor s_wide = testing::convert_copy<float>(TensorView<const T>(s1.cview()));
      if (center)
        layer_norm_forward(yf.view(), {}, {}, s_wide.cview(), w.cview(), b.cview(), axes, eps, &stf);
      else
        rms_norm_forward(yf.view(), {}, s_wide.cview(), w.cview(), axes, eps, &stf);
      EXPECT_TRUE(st.center == center && st.mean == stf.mean && st.rstd == stf.rstd && st.axes == stf.axes &&
                  st.eps == stf.eps && st.x_shape == stf.x_shape)
          << what << ": the stats are not those of the fp32 forward on the stored s";
      for (bool with_ds : {true, false}) {
        const TensorView<const T> dsv = with_ds ? ds : TensorView<const T>{};
        const std::string wh = what + (with_ds ? " with ds" : " without ds");
        BasicTensor<T> dx0(x.shape()), dx1(x.shape());
        Tensor dw0(ns), dw1(ns), db0(ns), db1(ns);
        if (center) {
          add_layer_norm_backward(dx0.view(), dw0.view(), db0.view(), dy, dsv, s1.cview(), w.cview(), axes,
                                  eps);
          add_layer_norm_backward_saved(dx1.view(), dw1.view(), db1.view(), dy, dsv, s1.cview(), w.cview(),
                                        st);
          EXPECT_TRUE(bitwise_equal(db0.cview(), db1.cview(), wh + " dbias"));
        } else {
          add_rms_norm_backward(dx0.view(), dw0.view(), dy, dsv, s1.cview(), w.cview(), axes, eps);
          add_rms_norm_backward_saved(dx1.view(), dw1.view(), dy, dsv, s1.cview(), w.cview(), st);
        }
        EXPECT_TRUE(same_bits<T>(dx0.cview(), dx1.cview(), wh + " dx"));
        EXPECT_TRUE(bitwise_equal(dw0.cview(), dw1.cview(), wh + " dweight"));
      }
    }
  }
}

TEST(NormStats, FusedAddNormKeepsAndTakesTheStats) {
  std::mt19937_64 rng(59);
  const Isa saved_isa = active_isa();
  const int saved_threads = num_threads();
  for (bool center : {true, false}) {
    for (const Dims& shape :
         {Dims{1, 1}, Dims{33, 7}, Dims{29, 64}, Dims{70, 80}, Dims{5, 1025}, Dims{3, 4096}}) {
      check_fused<float>(center, shape, false, rng);
      check_fused<bfloat16>(center, shape, false, rng);
      check_fused<float16>(center, shape, false, rng);
    }
    check_fused<float>(center, Dims{24, 40}, true, rng);
    check_fused<bfloat16>(center, Dims{24, 40}, true, rng);
    check_fused<float16>(center, Dims{24, 40}, true, rng);
  }
  set_isa(saved_isa);
  set_num_threads(saved_threads);
  // The saved backward takes the kept values (a changed rstd changes dx), on both routes.
  for (bool transpose : {false, true}) {
    Tensor xp = testing::random_tensor({24, 40}, rng, 2.0, 1.0),
           rp = testing::random_tensor({24, 40}, rng, 1.0, 0.0),
           dyp = testing::random_tensor({24, 40}, rng, 1.0, 0.0);
    ConstView x = xp.cview(), r = rp.cview(), dy = dyp.cview();
    const int order[2] = {1, 0};
    if (transpose) {
      x = x.permute(std::span<const int>(order));
      r = r.permute(std::span<const int>(order));
      dy = dy.permute(std::span<const int>(order));
    }
    Tensor s(x.shape()), y(x.shape()), dx0(x.shape()), dx1(x.shape());
    NormStats st;
    add_layer_norm_forward(s.view(), y.view(), {}, {}, x, r, {}, {}, {1}, 1e-5, &st);
    add_layer_norm_backward_saved(dx0.view(), {}, {}, dy, {}, s.cview(), {}, st);
    for (double& v : st.rstd) v *= 2;
    add_layer_norm_backward_saved(dx1.view(), {}, {}, dy, {}, s.cview(), {}, st);
    EXPECT_FALSE(bitwise_equal(dx0.cview(), dx1.cview())) << (transpose ? "transposed" : "rows");
  }
}

TEST(NormStats, MisuseGetsClearMessages) {
  Tensor x({2, 3}), y({2, 3}), dx({2, 3}), dy({2, 3}), x2({3, 3}), dx2({3, 3}), dy2({3, 3});
  NormStats ln, rms;
  layer_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, {1}, 1e-5, &ln);
  rms_norm_forward(y.view(), {}, x.cview(), {}, {1}, 1e-6, &rms);
  EXPECT_NL_ERROR(layer_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, {1}, 1e-5, nullptr),
                  "stats is null");
  EXPECT_NL_ERROR(rms_norm_forward(y.view(), {}, x.cview(), {}, {1}, 1e-6, nullptr), "stats is null");
  EXPECT_NL_ERROR(layer_norm_backward_saved(dx.view(), {}, {}, dy.cview(), x.cview(), {}, rms),
                  "stats come from a RMSNorm forward");
  EXPECT_NL_ERROR(rms_norm_backward_saved(dx.view(), {}, dy.cview(), x.cview(), {}, ln),
                  "stats come from a LayerNorm forward");
  EXPECT_NL_ERROR(layer_norm_backward_saved(dx2.view(), {}, {}, dy2.cview(), x2.cview(), {}, ln),
                  "x has shape [3, 3], the stats' forward had [2, 3]");
  NormStats bad = ln;
  bad.rstd.pop_back();
  EXPECT_NL_ERROR(layer_norm_backward_saved(dx.view(), {}, {}, dy.cview(), x.cview(), {}, bad),
                  "1 rstd values for 2 groups");
  NormStats empty = ln;
  empty.mean.clear();
  empty.rstd.clear();
  EXPECT_NL_ERROR(layer_norm_backward_saved(dx.view(), {}, {}, dy.cview(), x.cview(), {}, empty),
                  "0 mean and 0 rstd values for 2 groups");
  BF16Tensor xb({2, 3}), yb({2, 3}), dxb({2, 3}), dyb({2, 3});
  EXPECT_NL_ERROR(layer_norm_forward(yb.view(), {}, {}, xb.cview(), {}, {}, {1}, 1e-5, nullptr),
                  "stats is null");
  EXPECT_NL_ERROR(layer_norm_backward_saved(dxb.view(), {}, {}, dyb.cview(), xb.cview(), {}, rms),
                  "stats come from a RMSNorm forward");
  EXPECT_NL_ERROR(layer_norm_backward_saved(dxb.view(), {}, {}, dyb.cview(), xb.cview(), {}, empty),
                  "0 mean and 0 rstd values for 2 groups");
  // The fused add + norm.
  Tensor sx({2, 3});
  EXPECT_NL_ERROR(
      add_layer_norm_forward(sx.view(), y.view(), {}, {}, x.cview(), x.cview(), {}, {}, {1}, 1e-5, nullptr),
      "add_layer_norm_forward: stats is null");
  EXPECT_NL_ERROR(add_rms_norm_forward(sx.view(), y.view(), {}, x.cview(), x.cview(), {}, {1}, 1e-6, nullptr),
                  "add_rms_norm_forward: stats is null");
  EXPECT_NL_ERROR(add_layer_norm_backward_saved(dx.view(), {}, {}, dy.cview(), {}, x.cview(), {}, rms),
                  "stats come from a RMSNorm forward");
  EXPECT_NL_ERROR(add_rms_norm_backward_saved(dx.view(), {}, dy.cview(), dy.cview(), x.cview(), {}, ln),
                  "stats come from a LayerNorm forward");
  EXPECT_NL_ERROR(
      add_layer_norm_backward_saved(dx2.view(), {}, {}, dy2.cview(), dy2.cview(), x2.cview(), {}, ln),
      "x has shape [3, 3], the stats' forward had [2, 3]");
  EXPECT_NL_ERROR(add_layer_norm_backward_saved(dxb.view(), {}, {}, dyb.cview(), {}, xb.cview(), {}, empty),
                  "0 mean and 0 rstd values for 2 groups");
  NormStats unset;  // default: no shape
  EXPECT_NL_ERROR(layer_norm_backward_saved(dx.view(), {}, {}, dy.cview(), x.cview(), {}, unset),
                  "the stats' forward had");
}

}  // namespace
}  // namespace normlab
