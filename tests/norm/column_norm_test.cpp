// The column path of LayerNorm and RMSNorm (src/norm/column_norm.cpp): normalized axes whose elements
// are strided while the innermost kept axis is contiguous, e.g. [B,F,T] over F. Float64 reference over
// odd sizes (tiles of 64 columns, blocks of 16, partial blocks), sliced and permuted views, eps 0, with
// the row path's budgets (docs/numerics.md "Precision"); the same bits as the row path on the
// transposed copy; float64 finite differences of the backward; the large-offset case and the fp32
// square range; the same bits for every thread count and SIMD target; in place; accumulate mode.
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/reference.h>
#include <normlab/simd.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "norm/column_kernels.h"
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

struct Out {
  Tensor y, mean, rstd, dx, dw, db;
};

// Forward and backward of LayerNorm (rms = false) or RMSNorm into fresh contiguous tensors.
Out run(bool rms, ConstView x, ConstView w, ConstView b, ConstView dy, const Axes& axes, double eps) {
  const Dims ks = kept_shape(x.shape(), axes), ns = normalized_shape(x.shape(), axes);
  Out o{Tensor(x.shape()), Tensor(ks), Tensor(ks), Tensor(x.shape()), Tensor(ns), Tensor(ns)};
  if (rms) {
    rms_norm_forward(o.y.view(), o.rstd.view(), x, w, axes, eps);
    rms_norm_backward(o.dx.view(), w.defined() ? o.dw.view() : View{}, dy, x, w, axes, eps);
  } else {
    layer_norm_forward(o.y.view(), o.mean.view(), o.rstd.view(), x, w, b, axes, eps);
    layer_norm_backward(o.dx.view(), o.dw.view(), o.db.view(), dy, x, w, axes, eps);
  }
  return o;
}

// Every output against the float64 reference with the row path's budgets (docs/numerics.md: y within
// 3.75ε of |x̂·γ| ≤ |y| + |β| plus 0.5ε of |y|; dx within a few ε of rstd·|dy|·|γ|).
void expect_matches_reference(bool rms, ConstView x, ConstView w, ConstView b, ConstView dy, const Axes& axes,
                              double eps, const std::string& what) {
  const Out o = run(rms, x, w, b, dy, axes, eps);
  const ref::LayerNormOut r =
      rms ? ref::rms_norm_forward(x, w, axes, eps) : ref::layer_norm_forward(x, w, b, axes, eps);
  const ref::LayerNormGrads g =
      rms ? ref::rms_norm_backward(dy, x, w, axes, eps) : ref::layer_norm_backward(dy, x, w, axes, eps);
  EXPECT_TRUE(all_close(o.y.cview(), r.y, Tol{4.5, std::max(1.0, max_abs(r.y) + (b.defined() ? max_abs(b) : 0.0))},
                        what + " y"));
  if (!rms) {
    EXPECT_TRUE(all_close(o.mean.cview(), r.mean, Tol{2, max_abs(r.mean) + 1e-30}, what + " mean"));
  }
  EXPECT_TRUE(all_close(o.rstd.cview(), r.rstd, Tol{2, 1e-30}, what + " rstd"));
  EXPECT_TRUE(all_close(o.dx.cview(), g.dx, Tol{16, dx_scale(g.dx, r.rstd, dy, w)}, what + " dx"));
  // dγ, dβ: a few ε of the sums of their terms' magnitudes (docs/numerics.md).
  const testing::ParamGradScales ps = testing::param_grad_scales(dy, x, r.mean, r.rstd, axes);
  if (w.defined()) {
    EXPECT_TRUE(
        all_close(o.dw.cview(), g.dweight, Tol{8, std::max(max_abs(g.dweight), ps.dw)}, what + " dweight"));
  }
  if (!rms) {
    EXPECT_TRUE(all_close(o.db.cview(), g.dbias, Tol{8, std::max(max_abs(g.dbias), ps.db)}, what + " dbias"));
  }
}

// A [B, F, T] view whose T axis is contiguous but whose rows are padded (a sliced parent), at a
// misaligned start.
View sliced_bft(Tensor& parent, Index F, Index T) {
  return parent.view().slice(1, 1, F + 1).slice(2, 3, T + 3);
}

TEST(ColumnNorm, MatchesFloat64OnOddSizesAndViews) {
  std::mt19937_64 rng(61);
  for (const bool rms : {false, true})
    for (const Index F : {1, 7, 33, 80})
      for (const Index T : {1, 7, 8, 9, 33, 71, 130}) {
        const Index B = 2;
        const std::string what = fmt::format("{} [{},{},{}] over F", rms ? "RMSNorm" : "LayerNorm", B, F, T);
        Tensor x = testing::random_tensor({B, F, T}, rng, 2.0, 0.5),
               dy = testing::random_tensor({B, F, T}, rng, 1.0, 0.0);
        Tensor w = testing::random_tensor({F}, rng, 0.5, 1.0), b = testing::random_tensor({F}, rng, 0.5, 0.0);
        expect_matches_reference(rms, x.cview(), w.cview(), rms ? ConstView{} : b.cview(), dy.cview(), {1},
                                 1e-5, what);
        // Sliced (padded rows, misaligned) x and dy.
        Tensor px = testing::random_tensor({B, F + 2, T + 5}, rng, 2.0, 0.5),
               pdy = testing::random_tensor({B, F + 2, T + 5}, rng, 1.0, 0.0);
        expect_matches_reference(rms, sliced_bft(px, F, T), w.cview(), rms ? ConstView{} : b.cview(),
                                 sliced_bft(pdy, F, T), {1}, 1e-5, what + " sliced");
      }
}

TEST(ColumnNorm, LongAxesAndOtherAxisSets) {
  std::mt19937_64 rng(62);
  for (const bool rms : {false, true}) {
    // F = 1025 rows, T = 1025 columns (16 full tiles and a tile of 1 column).
    Tensor x = testing::random_tensor({1, 1025, 1025}, rng, 1.0, 3.0),
           dy = testing::random_tensor({1, 1025, 1025}, rng, 1.0, 0.0);
    Tensor w = testing::random_tensor({1025}, rng, 0.5, 1.0);
    expect_matches_reference(rms, x.cview(), w.cview(), {}, dy.cview(), {1}, 1e-5, "[1,1025,1025] over 1");
    // [T, F] over T (the kept F is the contiguous axis), [B, F1, F2, T] over (F1, F2), [B, F, T] over
    // (B, F), and over F of a [B, T, F] parent permuted to [B, F, T] with T the padded axis.
    Tensor tf = testing::random_tensor({257, 40}, rng, 1.0, -1.0),
           dtf = testing::random_tensor({257, 40}, rng, 1.0, 0.0);
    expect_matches_reference(rms, tf.cview(), {}, {}, dtf.cview(), {0}, 1e-5, "[257,40] over 0");
    Tensor x4 = testing::random_tensor({3, 5, 6, 21}, rng, 1.0, 0.0),
           d4 = testing::random_tensor({3, 5, 6, 21}, rng, 1.0, 0.0);
    Tensor w4 = testing::random_tensor({5, 6}, rng, 0.5, 1.0),
           b4 = testing::random_tensor({5, 6}, rng, 0.5, 0.0);
    expect_matches_reference(rms, x4.cview(), w4.cview(), rms ? ConstView{} : b4.cview(), d4.cview(), {1, 2},
                             1e-5, "[3,5,6,21] over (1,2)");
    Tensor x3 = testing::random_tensor({4, 9, 40}, rng, 1.0, 0.0),
           d3 = testing::random_tensor({4, 9, 40}, rng, 1.0, 0.0);
    expect_matches_reference(rms, x3.cview(), {}, {}, d3.cview(), {0, 1}, 1e-5, "[4,9,40] over (0,1)");
  }
}

TEST(ColumnNorm, EpsZero) {
  std::mt19937_64 rng(63);
  Tensor x = testing::random_tensor({3, 11, 77}, rng, 1.0, 0.0),
         dy = testing::random_tensor({3, 11, 77}, rng, 1.0, 0.0);
  for (const bool rms : {false, true})
    expect_matches_reference(rms, x.cview(), {}, {}, dy.cview(), {1}, 0.0, "eps 0");
  // A constant column with eps 0 is NaN (rstd = +Inf), as on the row path and in PyTorch; its
  // neighbours are unaffected.
  for (Index f = 0; f < 11; ++f) x.view().data()[f * 77 + 5] = 2.5f;
  const Out o = run(false, x.cview(), {}, {}, dy.cview(), {1}, 0.0);
  EXPECT_TRUE(std::isnan(o.y[5]));
  EXPECT_TRUE(std::isinf(o.rstd[5]));
  EXPECT_FALSE(std::isnan(o.y[4]));
  EXPECT_FALSE(std::isnan(o.y[6]));
}

TEST(ColumnNorm, OffsetTenThousandWithinOneMicro) {
  std::mt19937_64 rng(64);
  std::normal_distribution<double> nd(0.0, 1.0);
  Tensor x({4, 80, 100});
  for (Index i = 0; i < x.numel(); ++i) x[i] = static_cast<float>(1e4 + nd(rng));
  const Out o = run(false, x.cview(), {}, {}, x.cview(), {1}, 1e-5);
  const ref::LayerNormOut r = ref::layer_norm_forward(x.cview(), {}, {}, {1}, 1e-5);
  double worst = 0;
  for (Index i = 0; i < x.numel(); ++i) worst = std::max(worst, std::fabs(o.y[i] - r.y[i]));
  EXPECT_LE(worst, 1e-6) << "max abs error at offset 1e4 over F";
}

// The column kernels form every per-column quantity with the row kernels' operations in their order
// (column_kernels.h), so y, mean, rstd and dx are bitwise those of the row path on the transposed
// contiguous copy; dγ and dβ sum over the groups in another order and agree within their budget.
TEST(ColumnNorm, SameBitsAsTheTransposedRowPath) {
  std::mt19937_64 rng(69);
  // F: one row, below and above one block of 32/64 rows (the second pass's last block of 64 rows with 1 to 4
  // rows per lane: 33, 63, 80, 130), the row path's pipelined kernel (256);
  // T: one block of 16 columns, a partial block, several tiles and a tail; T = 64 and 256 put the rows
  // into 16 and 4 sets of the L1 cache, so from F = 65 and 17 the kernels copy each block first
  // (ColumnForward::stage; the backward up to F = 128, the forward up to 256).
  for (const bool rms : {false, true})
    for (const Index F : {1, 2, 7, 31, 33, 63, 64, 65, 80, 130, 256})
      for (const Index T : {8, 16, 23, 64, 203, 256}) {
        const Index B = 2;
        const std::string what = fmt::format("{} [{},{},{}]", rms ? "RMSNorm" : "LayerNorm", B, F, T);
        Tensor x = testing::random_tensor({B, F, T}, rng, 2.0, 3.0),
               dy = testing::random_tensor({B, F, T}, rng, 1.0, 0.0);
        Tensor w = testing::random_tensor({F}, rng, 0.5, 1.0), b = testing::random_tensor({F}, rng, 0.5, 0.0);
        const ConstView bias = rms ? ConstView{} : b.cview();
        for (const bool affine : {false, true}) {
          const ConstView wv = affine ? w.cview() : ConstView{}, bv = affine ? bias : ConstView{};
          const Out col = run(rms, x.cview(), wv, bv, dy.cview(), {1}, 1e-5);
          const Tensor xt = Tensor::copy_of(x.cview().permute({0, 2, 1})),
                       dyt = Tensor::copy_of(dy.cview().permute({0, 2, 1}));
          const Out row = run(rms, xt.cview(), wv, bv, dyt.cview(), {2}, 1e-5);
          const std::string tag = what + (affine ? " affine" : "");
          EXPECT_TRUE(bitwise_equal(col.y.cview(), row.y.cview().permute({0, 2, 1}), tag + " y"));
          if (!rms) {
            EXPECT_TRUE(bitwise_equal(col.mean.cview(), row.mean.cview(), tag + " mean"));
          }
          EXPECT_TRUE(bitwise_equal(col.rstd.cview(), row.rstd.cview(), tag + " rstd"));
          EXPECT_TRUE(bitwise_equal(col.dx.cview(), row.dx.cview().permute({0, 2, 1}), tag + " dx"));
          if (affine) {
            EXPECT_TRUE(all_close(col.dw.cview(), ref::to_double(row.dw.cview()), Tol{8, max_abs(row.dw)},
                                  tag + " dweight"));
          }
          if (!rms) {
            EXPECT_TRUE(all_close(col.db.cview(), ref::to_double(row.db.cview()), Tol{8, max_abs(row.db)},
                                  tag + " dbias"));
          }
        }
      }
}

// docs/numerics.md "Range": deviations are squared in fp32 on the column path too, so |x − mean| = 4e19
// overflows the sum of squares of its column: rstd = 0, y = β, dx = 0; the other columns are unaffected.
TEST(ColumnNorm, DeviationsBeyondFloatSquareRangeGiveBeta) {
  const Index F = 2, T = 9;
  Tensor x({F, T}), dy({F, T});
  for (Index i = 0; i < F * T; ++i) {
    x[i] = static_cast<float>(i % 5);
    dy[i] = 1.0f;
  }
  x[3] = -4e19f;
  x[T + 3] = 4e19f;
  Tensor w({F}, {2, 3}), b({F}, {0.5f, -0.25f});
  const Out o = run(false, x.cview(), w.cview(), b.cview(), dy.cview(), {0}, 1e-5);
  EXPECT_EQ(o.rstd[3], 0.0f);
  EXPECT_EQ(o.y[3], 0.5f);
  EXPECT_EQ(o.y[T + 3], -0.25f);
  EXPECT_EQ(o.dx[3], 0.0f);
  EXPECT_EQ(o.dx[T + 3], 0.0f);
  const ref::LayerNormOut r = ref::layer_norm_forward(x.cview(), w.cview(), b.cview(), {0}, 1e-5);
  for (const Index j : {0, 1, 2, 4, 5, 6, 7, 8})
    EXPECT_NEAR(o.y[j], r.y[j], 4.5 * FLT_EPSILON * 4) << "column " << j;
}

// Outputs at or above the streaming-store threshold (norm/streaming.h; 16 MiB, here lowered to 64 KiB)
// are written with non-temporal stores where a row is aligned (column_norm.cpp): the same bits as the row
// path on the transposed copy.
TEST(ColumnNorm, StreamingStoresGiveTheSameBits) {
  std::mt19937_64 rng(70);
  const kernels::ScopedStreamMinBytes lowered(Index{64} << 10);
  const Dims shape{4, 80, 1040};  // 1.3 MB per tensor; rows of 4160 bytes, every block row aligned
  Tensor x = testing::random_tensor(shape, rng, 1.0, 2.0), dy = testing::random_tensor(shape, rng, 1.0, 0.0);
  Tensor w = testing::random_tensor({80}, rng, 0.5, 1.0), b = testing::random_tensor({80}, rng, 0.5, 0.0);
  const Out col = run(false, x.cview(), w.cview(), b.cview(), dy.cview(), {1}, 1e-5);
  const Tensor xt = Tensor::copy_of(x.cview().permute({0, 2, 1})), dyt = Tensor::copy_of(dy.cview().permute({0, 2, 1}));
  const Out row = run(false, xt.cview(), w.cview(), b.cview(), dyt.cview(), {2}, 1e-5);
  EXPECT_TRUE(bitwise_equal(col.y.cview(), row.y.cview().permute({0, 2, 1}), "y"));
  EXPECT_TRUE(bitwise_equal(col.dx.cview(), row.dx.cview().permute({0, 2, 1}), "dx"));
}

// Float64 central differences of the float64 forward, against the fp32 kernel's backward.
TEST(ColumnNorm, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(65);
  for (const bool rms : {false, true}) {
    const Dims shape{2, 5, 19};  // T = 19: two blocks of 8 and three tail columns
    Tensor x = testing::random_tensor(shape, rng, 1.0, 0.0), r = testing::random_tensor(shape, rng, 1.0, 0.0);
    Tensor w = testing::random_tensor({5}, rng, 0.5, 1.0), b = testing::random_tensor({5}, rng, 0.5, 0.0);
    ref::DTensor xd = ref::to_double(x.cview()), wd = ref::to_double(w.cview()),
                 bd = ref::to_double(b.cview());
    ref::DTensor rd = ref::to_double(r.cview());
    auto loss = [&]() {
      const ref::LayerNormOut o = rms ? ref::rms_norm_forward(xd.view(), wd.view(), {1}, 1e-5)
                                      : ref::layer_norm_forward(xd.view(), wd.view(), bd.view(), {1}, 1e-5);
      double s = 0;
      for (Index i = 0; i < o.y.numel(); ++i) s += o.y[i] * rd[i];
      return s;
    };
    auto fd_of = [&](ref::DTensor& p) {
      ref::DTensor out(p.shape());
      for (Index i = 0; i < p.numel(); ++i) out[i] = testing::central_difference(p[i], loss, 1e-6);
      return out;
    };
    const Out o = run(rms, x.cview(), w.cview(), rms ? ConstView{} : b.cview(), r.cview(), {1}, 1e-5);
    const ref::DTensor fdx = fd_of(xd), fdw = fd_of(wd);
    const std::string what = rms ? "RMSNorm" : "LayerNorm";
    EXPECT_TRUE(all_close(o.dx.cview(), fdx, Tol{64, max_abs(fdx)}, what + " dx vs FD"));
    EXPECT_TRUE(all_close(o.dw.cview(), fdw, Tol{64, max_abs(fdw)}, what + " dweight vs FD"));
    if (!rms) {
      const ref::DTensor fdb = fd_of(bd);
      EXPECT_TRUE(all_close(o.db.cview(), fdb, Tol{64, max_abs(fdb)}, what + " dbias vs FD"));
    }
  }
}

void expect_same_bits(const Out& a, const Out& b, bool rms, const std::string& what) {
  EXPECT_TRUE(bitwise_equal(a.y.cview(), b.y.cview(), what + " y"));
  if (!rms) {
    EXPECT_TRUE(bitwise_equal(a.mean.cview(), b.mean.cview(), what + " mean"));
  }
  EXPECT_TRUE(bitwise_equal(a.rstd.cview(), b.rstd.cview(), what + " rstd"));
  EXPECT_TRUE(bitwise_equal(a.dx.cview(), b.dx.cview(), what + " dx"));
  EXPECT_TRUE(bitwise_equal(a.dw.cview(), b.dw.cview(), what + " dweight"));
  if (!rms) {
    EXPECT_TRUE(bitwise_equal(a.db.cview(), b.db.cview(), what + " dbias"));
  }
}

TEST(ColumnNorm, SameBitsForEveryThreadCountAndSimdTarget) {
  std::mt19937_64 rng(66);
  // T = 203: three full tiles and a tile of 11 columns (one block, three tail columns); 24 units, so
  // dγ/dβ are reduced over several chunks. T = 1024: rows 4 KiB apart, in one L1 set, so each block
  // is copied first (ColumnForward::stage).
  for (const Dims& shape : {Dims{8, 37, 203}, Dims{3, 37, 1024}}) {
    SCOPED_TRACE(shape.str());
    Tensor x = testing::random_tensor(shape, rng, 2.0, 1.0),
           dy = testing::random_tensor(shape, rng, 1.0, 0.0);
    Tensor w = testing::random_tensor({37}, rng, 0.5, 1.0), b = testing::random_tensor({37}, rng, 0.5, 0.0);
    const int saved_threads = num_threads();
    const Isa saved_isa = active_isa();
    for (const bool rms : {false, true}) {
      const ConstView bias = rms ? ConstView{} : b.cview();
      set_isa(saved_isa);
      set_num_threads(1);
      const Out base = run(rms, x.cview(), w.cview(), bias, dy.cview(), {1}, 1e-5);
      for (const Isa isa : supported_isas())
        for (const int t : {1, 2, 3}) {
          set_isa(isa);
          set_num_threads(t);
          expect_same_bits(base, run(rms, x.cview(), w.cview(), bias, dy.cview(), {1}, 1e-5), rms,
                           fmt::format("{} {} threads {}", rms ? "RMSNorm" : "LayerNorm", isa_name(isa), t));
        }
    }
    set_isa(saved_isa);
    set_num_threads(saved_threads);
  }
}

// The kernels' test of crowded rows (column_kernels.h): rows 1 KiB apart start in 4 of the 64 sets, so
// 17 of them crowd one set; rows 1000 bytes apart, or 64 bytes, spread over the sets.
TEST(ColumnNorm, CrowdedRowsAreThoseInFewL1Sets) {
  alignas(64) static float base[20000];  // (the rows below lie inside it)
  auto rows = [](Index n, Index step) {
    std::vector<Index> off;
    for (Index i = 0; i < n; ++i) off.push_back(i * step);
    return off;
  };
  EXPECT_FALSE(kernels::crowds_l1(base, rows(16, 256).data(), 16));
  EXPECT_TRUE(kernels::crowds_l1(base, rows(17, 256).data(), 17));
  EXPECT_TRUE(kernels::crowds_l1(base, rows(5, 1024).data(), 5));
  EXPECT_FALSE(kernels::crowds_l1(base, rows(80, 250).data(), 80));
  EXPECT_FALSE(kernels::crowds_l1(base, rows(256, 16).data(), 256));
  EXPECT_TRUE(kernels::crowds_l1(base, rows(257, 16).data(), 257));
}

// A column's result depends neither on which tile it falls in nor on the path: normalizing [F, T] over
// F in chunks of frames gives the bits of one call, whether a chunk takes the column path (≥ 8 frames)
// or is gathered onto the row path (fewer).
TEST(ColumnNorm, ColumnsDoNotDependOnTheTiling) {
  std::mt19937_64 rng(68);
  const Index F = 40, T = 300;
  Tensor x = testing::random_tensor({F, T}, rng, 2.0, 3.0), w = testing::random_tensor({F}, rng, 0.5, 1.0);
  Tensor whole({F, T}), chunked({F, T});
  layer_norm_forward(whole.view(), {}, {}, x.cview(), w.cview(), {}, {0}, 1e-5);
  const std::vector<Index> cuts = {0, 8, 17, 81, 82, 85, 100, 163, 170, 240, 300};  // chunks of 1 to 70 frames
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i)
    layer_norm_forward(chunked.view().slice(1, cuts[i], cuts[i + 1]), {}, {},
                       x.cview().slice(1, cuts[i], cuts[i + 1]), w.cview(), {}, {0}, 1e-5);
  EXPECT_TRUE(bitwise_equal(chunked.cview(), whole.cview(), "chunks of frames vs one call"));
}

TEST(ColumnNorm, InPlaceAccumulateAndStridedStatistics) {
  std::mt19937_64 rng(67);
  const Dims shape{3, 12, 50};
  Tensor x = testing::random_tensor(shape, rng, 1.0, 0.0), dy = testing::random_tensor(shape, rng, 1.0, 0.0);
  Tensor w = testing::random_tensor({12}, rng, 0.5, 1.0), b = testing::random_tensor({12}, rng, 0.5, 0.0);
  const Out o = run(false, x.cview(), w.cview(), b.cview(), dy.cview(), {1}, 1e-5);
  // y in place of x.
  Tensor xi = x.clone();
  layer_norm_forward(xi.view(), {}, {}, xi.cview(), w.cview(), b.cview(), {1}, 1e-5);
  EXPECT_TRUE(bitwise_equal(xi.cview(), o.y.cview(), "y in place"));
  // dx in place of dy; dγ, dβ accumulated onto 1.
  Tensor dyi = dy.clone(), dw({12}), db({12});
  for (Index i = 0; i < 12; ++i) dw[i] = db[i] = 1.0f;
  layer_norm_backward(dyi.view(), dw.view(), db.view(), dyi.cview(), x.cview(), w.cview(), {1}, 1e-5,
                      GradMode::kAccumulate);
  EXPECT_TRUE(bitwise_equal(dyi.cview(), o.dx.cview(), "dx in place of dy"));
  for (Index i = 0; i < 12; ++i) {
    EXPECT_EQ(dw[i], 1.0f + o.dw[i]);
    EXPECT_EQ(db[i], 1.0f + o.db[i]);
  }
  // mean and rstd written through a transposed view ([B, T] seen from a [T, B] buffer).
  Tensor mt({50, 3}), rt({50, 3}), y({3, 12, 50});
  layer_norm_forward(y.view(), mt.view().transpose(0, 1), rt.view().transpose(0, 1), x.cview(), w.cview(),
                     b.cview(), {1}, 1e-5);
  EXPECT_TRUE(bitwise_equal(mt.cview().transpose(0, 1), o.mean.cview(), "mean through a transposed view"));
  EXPECT_TRUE(bitwise_equal(rt.cview().transpose(0, 1), o.rstd.cview(), "rstd through a transposed view"));
}

}  // namespace
}  // namespace normlab
