// Fused residual add + LayerNorm/RMSNorm against the unfused composition (bitwise in fp32, where the
// arithmetic is the same), bf16 and fp16 storage, float64 finite differences of the fused backward, aliasing;
// and the memory-efficient backward (x̂ recovered from y) against the standard backward within a bound derived
// from the extra rounding, with its γ = 0 failure mode.
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/reference.h>
#include <normlab/simd.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <random>

#include "norm/lowp_support.h"
#include "norm/streaming.h"
#include "support/finite_diff.h"
#include "support/random.h"
#include "support/tolerance.h"

namespace normlab {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::max_abs;
using testing::Tol;

Tensor add(ConstView a, ConstView b) {
  Tensor ca = Tensor::copy_of(a), cb = Tensor::copy_of(b), s(a.shape());
  for (Index i = 0; i < s.numel(); ++i) s[i] = ca[i] + cb[i];
  return s;
}

// A random strided view (sliced and/or transposed) of a fresh parent.
struct Strided {
  Tensor parent;
  ConstView v;
};
Strided strided(const Dims& shape, std::mt19937_64& rng, double scale, double offset, bool transpose) {
  Dims pshape = shape;
  pshape[0] += 1;
  Strided s{testing::random_tensor(pshape, rng, scale, offset), {}};
  s.v = s.parent.cview().slice(0, 1, pshape[0]);
  if (transpose) {
    // Same logical shape, other memory order: a transposed parent, transposed back.
    Tensor t = Tensor::copy_of(s.v.transpose(0, shape.size() - 1));
    s.parent = std::move(t);
    s.v = s.parent.cview().transpose(0, shape.size() - 1);
  }
  return s;
}

TEST(FusedAddNorm, Fp32IsTheUnfusedCompositionBitwise) {
  std::mt19937_64 rng(21);
  int cases = 0;
  // ([5, 256] and [2, 512]: rows the pipelined kernel forms one by one; the others in chunks.)
  for (const Dims& shape :
       {Dims{5, 33}, Dims{4, 7, 3}, Dims{3, 1025}, Dims{1, 1}, Dims{8, 64}, Dims{5, 256}, Dims{2, 512}})
    for (const Axes& axes : {Axes{-1}, Axes{0}, Axes{1}})
      for (bool center : {true, false})
        for (int layout = 0; layout < 3; ++layout) {
          if (axes[0] >= shape.size()) continue;
          ++cases;
          SCOPED_TRACE(fmt::format("shape {} axes [{}] centre={} layout {}", shape.str(), axes[0], center, layout));
          const Strided x = strided(shape, rng, 1.0, 0.5, layout == 1), r = strided(shape, rng, 2.0, -1.0, layout == 2);
          const Dims ns = normalized_shape(shape, axes), ks = kept_shape(shape, axes);
          const Tensor w = testing::random_tensor(ns, rng, 0.5, 1.0), b = testing::random_tensor(ns, rng, 0.5, 0.0);
          const Tensor dy = testing::random_tensor(shape, rng, 1.0, 0.0), ds = testing::random_tensor(shape, rng, 1.0, 0.0);
          const ConstView bv = center ? b.cview() : ConstView{};
          // unfused
          const Tensor s_ref = add(x.v, r.v);
          Tensor y_ref(shape), mean_ref(ks), rstd_ref(ks), dn(shape), dw_ref(ns), db_ref(ns);
          if (center) {
            layer_norm_forward(y_ref.view(), mean_ref.view(), rstd_ref.view(), s_ref.cview(), w.cview(), bv, axes);
            layer_norm_backward(dn.view(), dw_ref.view(), db_ref.view(), dy.cview(), s_ref.cview(), w.cview(), axes);
          } else {
            rms_norm_forward(y_ref.view(), rstd_ref.view(), s_ref.cview(), w.cview(), axes);
            rms_norm_backward(dn.view(), dw_ref.view(), dy.cview(), s_ref.cview(), w.cview(), axes);
          }
          const Tensor dx_ref = add(dn.cview(), ds.cview());
          // fused
          Tensor s(shape), y(shape), mean(ks), rstd(ks), dx(shape), dw(ns), db(ns);
          if (center) {
            add_layer_norm_forward(s.view(), y.view(), mean.view(), rstd.view(), x.v, r.v, w.cview(), bv, axes);
            add_layer_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), ds.cview(), s.cview(), w.cview(), axes);
          } else {
            add_rms_norm_forward(s.view(), y.view(), rstd.view(), x.v, r.v, w.cview(), axes);
            add_rms_norm_backward(dx.view(), dw.view(), dy.cview(), ds.cview(), s.cview(), w.cview(), axes);
          }
          EXPECT_TRUE(bitwise_equal(s.cview(), s_ref.cview(), "s"));
          EXPECT_TRUE(bitwise_equal(y.cview(), y_ref.cview(), "y"));
          EXPECT_TRUE(bitwise_equal(rstd.cview(), rstd_ref.cview(), "rstd"));
          if (center) {
            EXPECT_TRUE(bitwise_equal(mean.cview(), mean_ref.cview(), "mean"));
          }
          EXPECT_TRUE(bitwise_equal(dx.cview(), dx_ref.cview(), "dx = dnorm + ds"));
          // dγ, dβ: those of the fp32 backward on s, bit for bit.
          EXPECT_TRUE(bitwise_equal(dw.cview(), dw_ref.cview(), "dγ"));
          if (center) {
            EXPECT_TRUE(bitwise_equal(db.cview(), db_ref.cview(), "dβ"));
          }
          // Without ds the fused backward is the plain backward.
          Tensor dx0(shape);
          if (center)
            add_layer_norm_backward(dx0.view(), {}, {}, dy.cview(), {}, s.cview(), w.cview(), axes);
          else
            add_rms_norm_backward(dx0.view(), {}, dy.cview(), {}, s.cview(), w.cview(), axes);
          EXPECT_TRUE(bitwise_equal(dx0.cview(), dn.cview(), "dx without ds"));
        }
  EXPECT_GT(cases, 30);
}

TEST(FusedAddNorm, ResidualStreamUpdatedInPlace) {
  std::mt19937_64 rng(22);
  const Dims shape{6, 80};
  const Tensor x = testing::random_tensor(shape, rng, 1.0, 0.0), w = testing::random_tensor(Dims{80}, rng, 0.5, 1.0);
  const Tensor r0 = testing::random_tensor(shape, rng, 1.0, 0.0), dy = testing::random_tensor(shape, rng, 1.0, 0.0);
  Tensor s(shape), y(shape), yi(shape);
  add_layer_norm_forward(s.view(), y.view(), {}, {}, x.cview(), r0.cview(), w.cview(), {}, {1});
  Tensor r = r0.clone();  // s written over the residual stream itself
  add_layer_norm_forward(r.view(), yi.view(), {}, {}, x.cview(), r.cview(), w.cview(), {}, {1});
  EXPECT_TRUE(bitwise_equal(r.cview(), s.cview(), "s in place"));
  EXPECT_TRUE(bitwise_equal(yi.cview(), y.cview(), "y"));
  // dx written over ds (the residual gradient accumulated in place).
  const Tensor ds = testing::random_tensor(shape, rng, 1.0, 0.0);
  Tensor dx(shape), inplace = ds.clone();
  add_layer_norm_backward(dx.view(), {}, {}, dy.cview(), ds.cview(), s.cview(), w.cview(), {1});
  add_layer_norm_backward(inplace.view(), {}, {}, dy.cview(), inplace.cview(), s.cview(), w.cview(), {1});
  EXPECT_TRUE(bitwise_equal(inplace.cview(), dx.cview(), "dx in place over ds"));
  EXPECT_NL_ERROR(add_layer_norm_forward(s.view(), s.view(), {}, {}, x.cview(), r0.cview(), {}, {}, {1}),
                  "y and s must not overlap");
}

// Outputs at or above the streaming-store threshold (norm/streaming.h; 16 MiB, here lowered to 64 KiB so
// that the sanitizer build runs it in seconds) take the streaming route (s written with non-temporal
// stores, normalized from a copy in cache): rows of 1025 floats (one in 16 aligned for streaming stores,
// the others stored normally; the per-row kernel on chunks), rows of 64 (all aligned; the eight-row kernel
// on chunks) and rows of 768 (the pipelined kernel, row by row through its ring of three rows), several
// units of work each. Every target gives the unfused composition's bits at 1 and 3 threads (LayerNorm and
// RMSNorm), and dγ, dβ are bitwise those of the fp32 backward on s.
TEST(FusedAddNorm, LargeOutputsEveryTargetAndThreadCountBitwise) {
  std::mt19937_64 rng(25);
  const kernels::ScopedStreamMinBytes lowered(Index{64} << 10);
  for (const Dims& shape : {Dims{100, 1025}, Dims{2000, 64}, Dims{70, 768}}) {
    const Index d = shape[1];
    const Tensor x = testing::random_tensor(shape, rng, 1.0, 0.5), r = testing::random_tensor(shape, rng, 2.0, -1.0);
    const Tensor dy = testing::random_tensor(shape, rng, 1.0, 0.0), ds = testing::random_tensor(shape, rng, 1.0, 0.0);
    const Tensor w = testing::random_tensor(Dims{d}, rng, 0.5, 1.0), b = testing::random_tensor(Dims{d}, rng, 0.5, 0.0);
    const Dims ks{shape[0]};
    const Tensor s_ref = add(x.cview(), r.cview());
    Tensor y_ref(shape), mean_ref(ks), rstd_ref(ks), dn(shape), dw_ref(Dims{d}), db_ref(Dims{d});
    layer_norm_forward(y_ref.view(), mean_ref.view(), rstd_ref.view(), s_ref.cview(), w.cview(), b.cview(), {1});
    layer_norm_backward(dn.view(), dw_ref.view(), db_ref.view(), dy.cview(), s_ref.cview(), w.cview(), {1});
    const Tensor dx_ref = add(dn.cview(), ds.cview());
    Tensor yr_ref(shape), rr_ref(ks);  // RMSNorm
    rms_norm_forward(yr_ref.view(), rr_ref.view(), s_ref.cview(), w.cview(), {1});
    const Isa saved_isa = active_isa();
    const int saved_threads = num_threads();
    for (Isa isa : supported_isas())
      for (int t : {1, 3}) {  // serial, and tasks split unevenly over more threads than cores
        set_isa(isa);
        set_num_threads(t);
        SCOPED_TRACE(fmt::format("{} {} threads shape {}", isa_name(isa), t, shape.str()));
        Tensor s(shape), y(shape), mean(ks), rstd(ks), dx(shape), dw(Dims{d}), db(Dims{d});
        add_layer_norm_forward(s.view(), y.view(), mean.view(), rstd.view(), x.cview(), r.cview(), w.cview(),
                               b.cview(), {1});
        add_layer_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), ds.cview(), s.cview(), w.cview(), {1});
        EXPECT_TRUE(bitwise_equal(s.cview(), s_ref.cview(), "s"));
        EXPECT_TRUE(bitwise_equal(y.cview(), y_ref.cview(), "y"));
        EXPECT_TRUE(bitwise_equal(mean.cview(), mean_ref.cview(), "mean"));
        EXPECT_TRUE(bitwise_equal(rstd.cview(), rstd_ref.cview(), "rstd"));
        EXPECT_TRUE(bitwise_equal(dx.cview(), dx_ref.cview(), "dx"));
        EXPECT_TRUE(bitwise_equal(dw.cview(), dw_ref.cview(), "dγ"));
        EXPECT_TRUE(bitwise_equal(db.cview(), db_ref.cview(), "dβ"));
        {
          Tensor sr(shape), yr(shape), rr(ks);
          add_rms_norm_forward(sr.view(), yr.view(), rr.view(), x.cview(), r.cview(), w.cview(), {1});
          EXPECT_TRUE(bitwise_equal(sr.cview(), s_ref.cview(), "s, RMSNorm"));
          EXPECT_TRUE(bitwise_equal(yr.cview(), yr_ref.cview(), "y, RMSNorm"));
          EXPECT_TRUE(bitwise_equal(rr.cview(), rr_ref.cview(), "rstd, RMSNorm"));
        }
        {
          // With NormStats (streaming stores on, saved statistics in the row kernels): the same bits.
          NormStats st;
          Tensor s2(shape), y2(shape), dx2(shape), dw2(Dims{d}), db2(Dims{d});
          add_layer_norm_forward(s2.view(), y2.view(), {}, {}, x.cview(), r.cview(), w.cview(), b.cview(),
                                 {1}, 1e-5, &st);
          add_layer_norm_backward_saved(dx2.view(), dw2.view(), db2.view(), dy.cview(), ds.cview(),
                                        s2.cview(), w.cview(), st);
          EXPECT_TRUE(bitwise_equal(s2.cview(), s_ref.cview(), "s, stats kept"));
          EXPECT_TRUE(bitwise_equal(y2.cview(), y_ref.cview(), "y, stats kept"));
          EXPECT_TRUE(bitwise_equal(dx2.cview(), dx_ref.cview(), "dx from saved stats"));
          EXPECT_TRUE(bitwise_equal(dw2.cview(), dw_ref.cview(), "dγ from saved stats"));
          EXPECT_TRUE(bitwise_equal(db2.cview(), db_ref.cview(), "dβ from saved stats"));
        }
        if (t == 3) {
          // s over x, y over the residual, dx over ds: the same bits.
          Tensor xs = x.clone(), ry = r.clone(), dsx = ds.clone();
          add_layer_norm_forward(xs.view(), ry.view(), {}, {}, xs.cview(), ry.cview(), w.cview(), b.cview(), {1});
          add_layer_norm_backward(dsx.view(), {}, {}, dy.cview(), dsx.cview(), xs.cview(), w.cview(), {1});
          EXPECT_TRUE(bitwise_equal(xs.cview(), s_ref.cview(), "s in place over x"));
          EXPECT_TRUE(bitwise_equal(ry.cview(), y_ref.cview(), "y in place over the residual"));
          EXPECT_TRUE(bitwise_equal(dsx.cview(), dx_ref.cview(), "dx in place over ds"));
        }
      }
    set_isa(saved_isa);
    set_num_threads(saved_threads);
  }
}

TEST(FusedAddNorm, BackwardMatchesFiniteDifferences) {
  // L = Σ dy·y + Σ ds·s with s = x + residual, y = LayerNorm(s): ∂L/∂x = ∂L/∂residual = dnorm + ds.
  std::mt19937_64 rng(23);
  for (bool center : {true, false}) {
    const Dims shape{3, 7};
    const Tensor x = testing::random_tensor(shape, rng, 1.0, 0.3), r = testing::random_tensor(shape, rng, 1.0, 0.0);
    const Tensor w = testing::random_tensor(Dims{7}, rng, 0.5, 1.0);
    const Tensor dy = testing::random_tensor(shape, rng, 1.0, 0.0), ds = testing::random_tensor(shape, rng, 1.0, 0.0);
    Tensor s(shape), y(shape), dx(shape), dw(Dims{7});
    if (center) {
      add_layer_norm_forward(s.view(), y.view(), {}, {}, x.cview(), r.cview(), w.cview(), {}, {1});
      add_layer_norm_backward(dx.view(), dw.view(), {}, dy.cview(), ds.cview(), s.cview(), w.cview(), {1});
    } else {
      add_rms_norm_forward(s.view(), y.view(), {}, x.cview(), r.cview(), w.cview(), {1});
      add_rms_norm_backward(dx.view(), dw.view(), dy.cview(), ds.cview(), s.cview(), w.cview(), {1});
    }
    ref::DTensor xd = ref::to_double(x.cview()), rd = ref::to_double(r.cview()), wd = ref::to_double(w.cview());
    const ref::DTensor dyd = ref::to_double(dy.cview()), dsd = ref::to_double(ds.cview());
    auto loss = [&]() {
      ref::DTensor sd(shape);
      for (Index i = 0; i < sd.numel(); ++i) sd[i] = xd[i] + rd[i];
      const ref::LayerNormOut o = center ? ref::layer_norm_forward(sd.view(), wd.view(), {}, {1}, 1e-5)
                                         : ref::rms_norm_forward(sd.view(), wd.view(), {1}, kRmsNormEps);
      double l = 0;
      for (Index i = 0; i < sd.numel(); ++i) l += dyd[i] * o.y[i] + dsd[i] * sd[i];
      return l;
    };
    ref::DTensor fdx(shape), fdr(shape), fdw(Dims{7});
    for (Index i = 0; i < xd.numel(); ++i) {
      fdx[i] = testing::central_difference(xd[i], loss, 1e-6);
      fdr[i] = testing::central_difference(rd[i], loss, 1e-6);
    }
    for (Index i = 0; i < wd.numel(); ++i) fdw[i] = testing::central_difference(wd[i], loss, 1e-6);
    // fp32 outputs: the budget of LayerNormGradients.KernelBackwardMatchesFiniteDifferencesOfTheReference.
    EXPECT_TRUE(all_close(dx.cview(), fdx, Tol{64, max_abs(fdx)}, "dx vs FD in x"));
    EXPECT_TRUE(all_close(dx.cview(), fdr, Tol{64, max_abs(fdr)}, "dx vs FD in residual"));
    EXPECT_TRUE(all_close(dw.cview(), fdw, Tol{64, max_abs(fdw)}, "dγ vs FD"));
  }
}

// 16-bit storage T (bf16, fp16): s = round(float(x) + float(residual)), y = the T norm of the stored s, dx
// one rounding of the fp32 dnorm + ds, dγ the fp32 backward's on the widened dy and s.
template <typename T>
void check_rounds_the_sum_once(std::mt19937_64& rng) {
  // [64, 256] (32 KiB of 16-bit s, y) with streaming stores (the pipelined kernel's ring), the smaller
  // shapes without; every SIMD target.
  const kernels::ScopedStreamMinBytes lowered(Index{16} << 10);
  const Isa saved_isa = active_isa();
  for (Isa isa : supported_isas()) {
    set_isa(isa);
    for (const Dims& shape : {Dims{7, 33}, Dims{3, 1025}, Dims{64, 256}}) {
      for (bool center : {true, false}) {
        SCOPED_TRACE(fmt::format("{} shape {} centre={}", isa_name(isa), shape.str(), center));
        const Index d = shape[1];
        const BasicTensor<T> x =
            testing::convert_copy<T>(testing::random_tensor(shape, rng, 1.0, 0.5).cview());
        const BasicTensor<T> r =
            testing::convert_copy<T>(testing::random_tensor(shape, rng, 3.0, 0.0).cview());
        const BasicTensor<T> dy =
            testing::convert_copy<T>(testing::random_tensor(shape, rng, 1.0, 0.0).cview());
        const BasicTensor<T> ds =
            testing::convert_copy<T>(testing::random_tensor(shape, rng, 1.0, 0.0).cview());
        const Tensor w = testing::random_tensor(Dims{d}, rng, 0.5, 1.0),
                     b = testing::random_tensor(Dims{d}, rng, 0.5, 0.0);
        const ConstView bv = center ? b.cview() : ConstView{};
        BasicTensor<T> s(shape), y(shape), dx(shape), y_ref(shape);
        Tensor dw(Dims{d}), dw32(Dims{d}), dn32(shape);
        // s = round(float(x) + float(residual)), as PyTorch's bf16 and fp16 add
        const Tensor s32 = add(Tensor::copy_of(x.cview()).cview(), Tensor::copy_of(r.cview()).cview());
        const BasicTensor<T> s_ref = testing::convert_copy<T>(s32.cview());
        if (center) {
          add_layer_norm_forward(s.view(), y.view(), {}, {}, x.cview(), r.cview(), w.cview(), bv, {1});
          layer_norm_forward(y_ref.view(), {}, {}, s_ref.cview(), w.cview(), bv, {1});
          add_layer_norm_backward(dx.view(), dw.view(), {}, dy.cview(), ds.cview(), s.cview(), w.cview(),
                                  {1});
          layer_norm_backward(dn32.view(), dw32.view(), {}, Tensor::copy_of(dy.cview()).cview(),
                              Tensor::copy_of(s.cview()).cview(), w.cview(), {1});
        } else {
          add_rms_norm_forward(s.view(), y.view(), {}, x.cview(), r.cview(), w.cview(), {1});
          rms_norm_forward(y_ref.view(), {}, s_ref.cview(), w.cview(), {1});
          add_rms_norm_backward(dx.view(), dw.view(), dy.cview(), ds.cview(), s.cview(), w.cview(), {1});
          rms_norm_backward(dn32.view(), dw32.view(), Tensor::copy_of(dy.cview()).cview(),
                            Tensor::copy_of(s.cview()).cview(), w.cview(), {1});
        }
        EXPECT_TRUE(testing::within_ulps<T>(s.cview(), s_ref.cview(), 0, "s"));
        EXPECT_TRUE(
            testing::within_ulps<T>(y.cview(), y_ref.cview(), 0, "y = the 16-bit norm of the stored s"));
        // dx = round(dnorm_fp32 + ds): one rounding (the unfused 16-bit composition would round twice).
        const Tensor dx32 = add(dn32.cview(), Tensor::copy_of(ds.cview()).cview());
        Index exact = 0;
        EXPECT_TRUE(testing::within_ulps<T>(dx.cview(), testing::convert_copy<T>(dx32.cview()).cview(), 1,
                                            "dx vs round(fp32 dnorm + ds)", &exact));
        EXPECT_EQ(exact, dx.numel());
        EXPECT_TRUE(bitwise_equal(dw.cview(), dw32.cview(), "dγ = the fp32 backward's on the widened dy, s"));
      }
    }
  }
  set_isa(saved_isa);
}

TEST(FusedAddNorm, Bf16RoundsTheSumOnceAndNormalizesTheStoredSum) {
  std::mt19937_64 rng(24);
  check_rounds_the_sum_once<bfloat16>(rng);
}

TEST(FusedAddNorm, Fp16RoundsTheSumOnceAndNormalizesTheStoredSum) {
  std::mt19937_64 rng(25);
  check_rounds_the_sum_once<float16>(rng);
}

// ---- memory-efficient backward --------------------------------------------------------------------------

// The standard backward against the from-output backward, with the bound derived from the extra rounding:
// y is fp32, so the recovered x − mean = (y − β)/(γ·rstd) carries |Δ(x̂)| ≤ E_i = (½ulp(y_i) + ½ε|y_i − β_i|)/|γ_i|
// (y's rounding and the fp32 rounding of x − mean; rstd cancels exactly in x̂ = (x − mean)·rstd in math, and
// the double arithmetic adds ~1e-16). With E = max E_i, per group g = dy·γ:
//   |Δdx_i| ≤ rstd·(E·|mean(g·x̂)| + |x̂_i|·max|g|·E) + ½ε·|dx_i| (rstd is the forward's fp32 value) + the
//   standard backward's own Tol{16} budget;  |Δdγ_j| ≤ Σ_groups |dy|·E + Tol{4}.
// The flat index into γ (normalized axes, row-major) of flat element i of a contiguous tensor of `shape`.
Index part_index(Index i, const Dims& shape, const Axes& axes) {
  Index j = 0, jstride = 1;
  for (int d = shape.size() - 1; d >= 0; --d) {
    const Index id = i % shape[d];
    i /= shape[d];
    if (std::find(axes.begin(), axes.end(), d) != axes.end()) {
      j += id * jstride;
      jstride *= shape[d];
    }
  }
  return j;
}

struct MemEffCase {
  Dims shape;
  Axes axes;
  double w_scale, w_offset, b_scale;
};

TEST(MemoryEfficientBackward, MatchesTheStandardBackwardWithinTheDerivedBound) {
  std::mt19937_64 rng(25);
  for (const MemEffCase& mc : {MemEffCase{{6, 33}, {1}, 0.5, 1.0, 0.5}, MemEffCase{{4, 5, 6}, {0, 2}, 0.5, 1.0, 0.5},
                               MemEffCase{{3, 1025}, {1}, 0.3, 1.0, 0.1}, MemEffCase{{8, 64}, {1}, 0.05, 0.1, 2.0}}) {
    for (bool center : {true, false}) {
      SCOPED_TRACE(fmt::format("shape {} centre={} γ ~ {}±{}, β ~ ±{}", mc.shape.str(), center, mc.w_offset,
                               mc.w_scale, mc.b_scale));
      const Dims ns = normalized_shape(mc.shape, mc.axes), ks = kept_shape(mc.shape, mc.axes);
      const Tensor x = testing::random_tensor(mc.shape, rng, 1.5, 0.7), dy = testing::random_tensor(mc.shape, rng, 1.0, 0.0);
      Tensor w = testing::random_tensor(ns, rng, mc.w_scale, mc.w_offset);
      for (Index j = 0; j < w.numel(); ++j)
        if (std::fabs(w[j]) < 1e-3f) w[j] = 1e-3f;
      const Tensor b = testing::random_tensor(ns, rng, mc.b_scale, 0.0);
      const ConstView bv = center ? b.cview() : ConstView{};
      Tensor y(mc.shape), mean(ks), rstd(ks), dx(mc.shape), dw(ns), db(ns), dx_std(mc.shape), dw_std(ns), db_std(ns);
      if (center) {
        layer_norm_forward(y.view(), mean.view(), rstd.view(), x.cview(), w.cview(), bv, mc.axes);
        layer_norm_backward(dx_std.view(), dw_std.view(), db_std.view(), dy.cview(), x.cview(), w.cview(), mc.axes);
        layer_norm_backward_from_output(dx.view(), dw.view(), db.view(), dy.cview(), y.cview(), rstd.cview(), w.cview(),
                                        bv, mc.axes);
      } else {
        rms_norm_forward(y.view(), rstd.view(), x.cview(), w.cview(), mc.axes);
        rms_norm_backward(dx_std.view(), dw_std.view(), dy.cview(), x.cview(), w.cview(), mc.axes);
        rms_norm_backward_from_output(dx.view(), dw.view(), dy.cview(), y.cview(), rstd.cview(), w.cview(), mc.axes);
      }
      // The bound, from the float64 reference's x̂ and the actual y.
      const ref::LayerNormOut r = center ? ref::layer_norm_forward(x.cview(), w.cview(), bv, mc.axes, 1e-5)
                                         : ref::rms_norm_forward(x.cview(), w.cview(), mc.axes, kRmsNormEps);
      const ref::LayerNormOut xh = center ? ref::layer_norm_forward(x.cview(), {}, {}, mc.axes, 1e-5)
                                          : ref::rms_norm_forward(x.cview(), {}, mc.axes, kRmsNormEps);
      const ref::LayerNormGrads rg = center ? ref::layer_norm_backward(dy.cview(), x.cview(), w.cview(), mc.axes, 1e-5)
                                            : ref::rms_norm_backward(dy.cview(), x.cview(), w.cview(), mc.axes, kRmsNormEps);
      // E over all elements (γ, β at each element of x's contiguous layout).
      double E = 0;
      for (Index i = 0; i < y.numel(); ++i) {
        const Index j = part_index(i, mc.shape, mc.axes);
        const double yb = double{y[i]} - (center ? double{b[j]} : 0.0);
        const double e = (0.5 * testing::storage_ulp<float>(y[i]) + 0.5 * FLT_EPSILON * std::fabs(yb)) / std::fabs(w[j]);
        E = std::max(E, e);
      }
      const double max_rstd = max_abs(r.rstd), max_xhat = max_abs(xh.y), max_g = max_abs(dy) * max_abs(w);
      const double max_mgx = max_g * max_xhat;  // |mean(g·x̂)| ≤ max|g|·max|x̂|
      const double dx_bound = max_rstd * E * (max_mgx + max_xhat * max_g) + 0.5 * FLT_EPSILON * max_abs(rg.dx);
      const double groups = static_cast<double>(mc.shape.product() / ns.product());
      const double dw_bound = groups * max_abs(dy) * E;
      const double dx_tol = dx_bound + Tol{16, testing::dx_scale(rg.dx, r.rstd, dy.cview(), w.cview())}.bound(0);
      // + the standard backward's own dγ budget, relative to Σ|dy·x̂| (it may round each product to fp32).
      const double dw_tol = dw_bound + Tol{8, groups * max_abs(dy) * max_xhat}.bound(0);
      double worst_dx = 0, worst_dw = 0;
      for (Index i = 0; i < dx.numel(); ++i) worst_dx = std::max(worst_dx, std::fabs(double{dx[i]} - dx_std[i]));
      for (Index j = 0; j < dw.numel(); ++j) worst_dw = std::max(worst_dw, std::fabs(double{dw[j]} - dw_std[j]));
      EXPECT_LE(worst_dx, dx_tol) << "E = " << E;
      EXPECT_LE(worst_dw, dw_tol) << "E = " << E;
      if (center) {
        EXPECT_TRUE(all_close(db.cview(), ref::to_double(db_std.cview()), Tol{8, groups * max_abs(dy)}, "dβ"));
      }
      // In place: dx written over y.
      Tensor yi = y.clone();
      if (center)
        layer_norm_backward_from_output(yi.view(), {}, {}, dy.cview(), yi.cview(), rstd.cview(), w.cview(), bv, mc.axes);
      else
        rms_norm_backward_from_output(yi.view(), {}, dy.cview(), yi.cview(), rstd.cview(), w.cview(), mc.axes);
      EXPECT_TRUE(bitwise_equal(yi.cview(), dx.cview(), "dx in place over y"));
    }
  }
}

// The memory-efficient backward's double arithmetic runs 16 elements at a time with a scalar tail: every
// target and thread count gives the bits of the scalar target, for lengths around the vector width, with
// and without γ/β, and with a strided normalized axis (gathered route).
TEST(MemoryEfficientBackward, SameBitsForEveryTargetAndThreadCount) {
  std::mt19937_64 rng(26);
  for (const Dims& shape : {Dims{9, 1}, Dims{5, 7}, Dims{6, 16}, Dims{4, 33}, Dims{3, 1025}, Dims{200, 96}})
    for (int affine = 0; affine < 4; ++affine) {
      const bool with_w = affine & 1, with_b = affine & 2;
      SCOPED_TRACE(fmt::format("shape {} γ={} β={}", shape.str(), with_w, with_b));
      const Index d = shape[1];
      const Tensor x = testing::random_tensor(shape, rng, 1.5, 0.7), dy = testing::random_tensor(shape, rng, 1.0, 0.0);
      Tensor w = testing::random_tensor(Dims{d}, rng, 0.5, 1.0);
      for (Index j = 0; j < d; ++j)
        if (std::fabs(w[j]) < 1e-3f) w[j] = 1e-3f;
      const Tensor b = testing::random_tensor(Dims{d}, rng, 0.5, 0.0);
      const ConstView wv = with_w ? w.cview() : ConstView{}, bv = with_b ? b.cview() : ConstView{};
      Tensor y(shape), rstd(Dims{shape[0]});
      layer_norm_forward(y.view(), {}, rstd.view(), x.cview(), wv, bv, {1});
      auto run = [&](ConstView yv, ConstView dyv, const Axes& axes) {
        Tensor dx(yv.shape()), dw(Dims{d}), db(Dims{d});
        layer_norm_backward_from_output(dx.view(), with_w ? dw.view() : View{}, db.view(), dyv, yv, rstd.cview(), wv,
                                        bv, axes);
        return std::tuple(std::move(dx), std::move(dw), std::move(db));
      };
      const Isa saved_isa = active_isa();
      const int saved_threads = num_threads();
      set_isa(Isa::kScalar);
      set_num_threads(1);
      const auto [dx0, dw0, db0] = run(y.cview(), dy.cview(), {1});
      // The same groups through the gathered route: y and dy transposed in memory, the axis given as 0.
      const Tensor yt = Tensor::copy_of(y.cview().transpose(0, 1)), dyt = Tensor::copy_of(dy.cview().transpose(0, 1));
      for (Isa isa : supported_isas())
        for (int t : {1, 2, 3}) {
          set_isa(isa);
          set_num_threads(t);
          SCOPED_TRACE(fmt::format("{} {} threads", isa_name(isa), t));
          const auto [dx, dw, db] = run(y.cview(), dy.cview(), {1});
          EXPECT_TRUE(bitwise_equal(dx.cview(), dx0.cview(), "dx"));
          EXPECT_TRUE(bitwise_equal(dw.cview(), dw0.cview(), "dγ"));
          EXPECT_TRUE(bitwise_equal(db.cview(), db0.cview(), "dβ"));
          const auto [dxt, dwt, dbt] = run(yt.cview().transpose(0, 1), dyt.cview().transpose(0, 1), {1});
          EXPECT_TRUE(bitwise_equal(dxt.cview(), dx0.cview(), "dx (strided)"));
        }
      set_isa(saved_isa);
      set_num_threads(saved_threads);
    }
}

TEST(MemoryEfficientBackward, ZeroGammaIsAClearError) {
  Tensor y(Dims{2, 4}), rstd(Dims{2}), dy(Dims{2, 4}), dx(Dims{2, 4});
  const Tensor w(Dims{4}, {1.0f, 0.5f, 0.0f, 2.0f});
  EXPECT_NL_ERROR(layer_norm_backward_from_output(dx.view(), {}, {}, dy.cview(), y.cview(), rstd.cview(), w.cview(),
                                                  {}, {1}),
                  "weight[2]");
  EXPECT_NL_ERROR(rms_norm_backward_from_output(dx.view(), {}, dy.cview(), y.cview(), {}, {}, {1}), "rstd");
}

TEST(FusedAddNorm, BadInputGetsClearErrors) {
  Tensor x(Dims{4, 8}), r(Dims{4, 8}), s(Dims{4, 8}), y(Dims{4, 8}), dy(Dims{4, 8}), dx(Dims{4, 8});
  Tensor r_bad(Dims{4, 7}), w_bad(Dims{7});
  EXPECT_NL_ERROR(add_layer_norm_forward(s.view(), y.view(), {}, {}, x.cview(), r_bad.cview(), {}, {}, {1}), "residual");
  EXPECT_NL_ERROR(add_layer_norm_forward(s.view(), y.view(), {}, {}, x.cview(), r.cview(), w_bad.cview(), {}, {1}),
                  "weight");
  EXPECT_NL_ERROR(add_layer_norm_forward(s.view(), y.view(), {}, {}, x.cview(), r.cview(), {}, {}, {1}, -1.0), "eps");
  EXPECT_NL_ERROR(add_layer_norm_forward(s.view(), y.view(), {}, {}, x.cview(), r.cview(), {}, {}, {2}), "axis");
  EXPECT_NL_ERROR(add_rms_norm_forward(s.view(), y.view(), {}, x.cview(), {}, {}, {1}), "required");
  EXPECT_NL_ERROR(add_layer_norm_backward(dx.view(), {}, {}, dy.cview(), r_bad.cview(), s.cview(), {}, {1}), "ds");
  Tensor e(Dims{0, 8}), e2(Dims{0, 8}), es(Dims{0, 8}), ey(Dims{0, 8});
  EXPECT_NL_ERROR(add_layer_norm_forward(es.view(), ey.view(), {}, {}, e.cview(), e2.cview(), {}, {}, {1}), "empty");
  // fp16 storage: the same checks.
  F16Tensor hx(Dims{4, 8}), hr(Dims{4, 8}), hr_bad(Dims{4, 7}), hs(Dims{4, 8}), hy(Dims{4, 8}),
      hdx(Dims{4, 8});
  EXPECT_NL_ERROR(
      add_layer_norm_forward(hs.view(), hy.view(), {}, {}, hx.cview(), hr_bad.cview(), {}, {}, {1}),
      "residual");
  EXPECT_NL_ERROR(add_rms_norm_forward(hs.view(), hy.view(), {}, hx.cview(), hr.cview(), {}, {1}, -1.0),
                  "eps");
  EXPECT_NL_ERROR(add_rms_norm_forward(hs.view(), hs.view(), {}, hx.cview(), hr.cview(), {}, {1}), "overlap");
  EXPECT_NL_ERROR(
      add_layer_norm_backward(hdx.view(), {}, {}, hy.cview(), hr_bad.cview(), hs.cview(), {}, {1}), "ds");
  EXPECT_NL_ERROR(add_layer_norm_forward(hs.view(), hy.view(), {}, {}, hx.cview(), hr.cview(), {}, {}, {1},
                                         1e-5, nullptr),
                  "stats");
}

}  // namespace
}  // namespace normlab
