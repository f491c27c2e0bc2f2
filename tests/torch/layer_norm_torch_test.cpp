// Differential tests of normlab's LayerNorm against LibTorch (at::native_layer_norm and
// at::native_layer_norm_backward, Debian's libtorch 1.13, CPU, fp32).
//
// Compared, on random shapes (rank 1-5, sizes incl. 1, 7, 33, 1025), strided views (offsets, steps,
// permutations, negative strides), with and without γ/β, eps 0 and 1e-5, any subset of axes:
//   y, mean, rstd, dx, and (when γ is given) dweight, dbias.
// LibTorch only normalizes TRAILING dims: trailing axes are compared directly; any other subset is
// run on x.permute(kept..., normalized...).contiguous() (both lists increasing, so the normalized
// shape equals normlab's weight shape) and the results are permuted back.
//
// Three checks per quantity, each through testing::all_close / Tol:
//   normlab vs float64 ref:   the unit tests' tight budgets (normlab computes in double, rounds once).
//   LibTorch vs float64 ref:  Tol{kTorchK, C}. LibTorch computes in fp32, in the form
//                             y = (x·rstd − mean·rstd)·γ + β, dx = rstd·γ·dy + b·x + c, dγ = Σ dy·x̂.
//                             Its rounding errors are relative to those intermediates, not to the
//                             result: for a group with κ = (max|x| + |mean|)·rstd (large when a group
//                             of 2-3 values has tiny spread, or sits at an offset) y is off by
//                             ~ε·κ·|γ| even when |y| ≈ 1. So C is the magnitude of the largest such
//                             intermediate (see torch_scales), never below max |ref| of the quantity.
//   normlab vs LibTorch:      the same Tol (normlab's own error is ≤ 16 ε of max|ref|, far inside).
// And "more exact than the oracle": max|normlab − ref| ≤ max|torch − ref| + ε·max|ref| (one fp32 ulp
// at the largest magnitude, the most that rounding a double result to float can add).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <normlab/norm.h>
#include <normlab/reference.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <iostream>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/random.h"
#include "support/tolerance.h"
#include "support/torch_bridge.h"

namespace normlab {
namespace {

using testing::all_close;
using testing::Tol;

constexpr double kEps32 = FLT_EPSILON;
// Budget for LibTorch's fp32 error, in ε of the intermediate magnitude C. The worst measured over
// all cases is ≈ 1.5 ε·C (dweight, an fp32 sum over up to thousands of groups; printed by the random
// test), so 16 leaves a 10× margin, yet a relative change of 1e-5 in rstd (eps 1e-5 vs 3e-5) fails.
constexpr double kTorchK = 16;

using testing::torch_copy;
using testing::vec_of;
using testing::view_of;  // tensors to and from LibTorch: support/torch_bridge.h
// The same memory when every stride is ≥ 0 (as_strided over the parent buffer), else a contiguous copy.
at::Tensor torch_input(const Tensor& parent, ConstView v) {
  if (std::any_of(v.strides().begin(), v.strides().end(), [](Index s) { return s < 0; }))
    return torch_copy(v);
  at::Tensor flat = at::from_blob(const_cast<float*>(parent.data()), {parent.numel()}, at::kFloat);
  return flat.as_strided(vec_of(v.shape()), vec_of(v.strides()), v.data() - parent.data());
}

double max_abs(const ref::DTensor& t) {
  double m = 0;
  for (Index i = 0; i < t.numel(); ++i)
    if (std::isfinite(t[i])) m = std::max(m, std::fabs(t[i]));
  return m;
}
// max |a − r| over elements; equal non-finite pairs count 0, a non-finite mismatch is +Inf.
double max_err(ConstView a, const ref::DTensor& r) {
  double m = 0;
  Index i = 0;
  for_each_offset(a.shape(), a.strides(), [&](Index off) {
    const double x = a.data()[off], y = r[i++];
    if (std::isfinite(x) && std::isfinite(y))
      m = std::max(m, std::fabs(x - y));
    else if (!(std::isnan(x) && std::isnan(y)) && x != y)
      m = INFINITY;
  });
  return m;
}

// What normlab and LibTorch produce for one case, all in x's axis order.
struct Results {
  Tensor y, mean, rstd, dx, dw, db;            // normlab
  at::Tensor ty, tmean, trstd, tdx, tdw, tdb;  // LibTorch (views of its outputs)
};
struct Problem {
  const Tensor* parent;  // x is a view of *parent
  ConstView x, dy, w, b;
  Axes axes;
  double eps;
};

// The permutation kept..., normalized... (both increasing) that moves the normalized axes to the end.
std::vector<int> torch_perm(int rank, const Axes& axes) {
  std::vector<bool> is_norm(static_cast<std::size_t>(rank), false);
  for (int a : axes) is_norm[static_cast<std::size_t>(normalize_axis(a, rank))] = true;
  std::vector<int> perm;
  for (int pass = 0; pass < 2; ++pass)
    for (int d = 0; d < rank; ++d)
      if (is_norm[static_cast<std::size_t>(d)] == (pass == 1)) perm.push_back(d);
  return perm;
}

Results run_both(const Problem& p) {
  const Dims ks = kept_shape(p.x.shape(), p.axes), ns = normalized_shape(p.x.shape(), p.axes);
  Results r;
  r.y = Tensor(p.x.shape());
  r.dx = Tensor(p.x.shape());
  r.mean = Tensor(ks);
  r.rstd = Tensor(ks);
  r.dw = Tensor(ns);
  r.db = Tensor(ns);
  layer_norm_forward(r.y.view(), r.mean.view(), r.rstd.view(), p.x, p.w, p.b, p.axes, p.eps);
  layer_norm_backward(r.dx.view(), r.dw.view(), r.db.view(), p.dy, p.x, p.w, p.axes, p.eps);

  const std::vector<int> perm = torch_perm(p.x.rank(), p.axes);
  std::vector<int64_t> perm64(perm.begin(), perm.end()), back(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i)
    back[static_cast<std::size_t>(perm[i])] = static_cast<int64_t>(i);
  const bool trailing = std::is_sorted(perm.begin(), perm.end());
  at::Tensor x = torch_input(*p.parent, p.x), dy = torch_copy(p.dy);
  if (!trailing) {
    x = x.permute(perm64).contiguous();
    dy = dy.permute(perm64).contiguous();
  }
  const std::vector<int64_t> nshape = vec_of(ns);
  at::Tensor w = p.w.defined() ? torch_copy(p.w) : at::Tensor();
  at::Tensor b = p.b.defined() ? torch_copy(p.b) : at::Tensor();
  auto [y, mean, rstd] = at::native_layer_norm(x, nshape, w, b, p.eps);
  // The backward only reads β's shape (to allocate dβ): give it zeros when β was not used.
  at::Tensor b_shape = b.defined() || !w.defined() ? b : at::zeros(nshape, at::kFloat);
  auto [dx, dw, db] =
      at::native_layer_norm_backward(dy, x, nshape, mean, rstd, w, b_shape, {true, w.defined(), w.defined()});
  r.ty = trailing ? y : y.permute(back);
  r.tdx = trailing ? dx : dx.permute(back);
  r.tmean = mean.reshape(vec_of(ks));  // [kept..., 1, ...] -> kept shape
  r.trstd = rstd.reshape(vec_of(ks));
  r.tdw = dw;
  r.tdb = db;
  return r;
}

// Magnitudes of LibTorch's fp32 intermediates (see the top comment). Per element i of group g at
// normalized position j: a_i = (|x_i| + |mean_g|)·rstd_g, κ_g = max_i a_i.
//   y:      max |γ_j|·a_i + |β_j|            (x·rstd and mean·rstd cancel in y)
//   mean:   max |x|                          (a sum of x)
//   rstd:   max rstd_g·κ_g                   (var from deviations x − mean, each off by ε·|x|)
//   dx:     max rstd_g·max|dy·γ|·κ_g²        (b·x + c cancel, b ∝ rstd³·Σ dy·γ·x)
//   dγ, dβ: max_j Σ_g |dy|·a_i and Σ_g |dy|  (fp32 sums over the groups)
// Groups with a non-finite rstd (eps = 0 and constant) are NaN in every output and left out.
struct Scales {
  double y = 0, mean = 0, rstd = 0, dx = 0, dw = 0, db = 0;
  double dx_terms = 0;  // max rstd_g·max|dy·γ|: the terms normlab's dx cancels
  double dw_terms = 0;  // max_j Σ_g |dy·x̂|: the terms normlab sums for dγ (those of dβ: db)
};
Scales torch_scales(const Problem& p, const ref::LayerNormOut& r) {
  const std::vector<int> perm = torch_perm(p.x.rank(), p.axes);
  const ConstView xp = p.x.permute(perm), dyp = p.dy.permute(perm);
  std::vector<double> xs, dys;
  for_each_offset(xp.shape(), xp.strides(), [&](Index o) { xs.push_back(xp.data()[o]); });
  for_each_offset(dyp.shape(), dyp.strides(), [&](Index o) { dys.push_back(dyp.data()[o]); });
  const Index n = normalized_shape(p.x.shape(), p.axes).product(), groups = r.mean.numel();
  auto wj = [&](Index j) { return p.w.defined() ? std::fabs(static_cast<double>(p.w.data()[j])) : 1.0; };
  auto bj = [&](Index j) { return p.b.defined() ? std::fabs(static_cast<double>(p.b.data()[j])) : 0.0; };
  std::vector<double> sum_w(static_cast<std::size_t>(n), 0), sum_b(static_cast<std::size_t>(n), 0);
  std::vector<double> sum_xh(static_cast<std::size_t>(n), 0);
  Scales s;
  for (Index g = 0; g < groups; ++g) {
    const double mean = std::fabs(r.mean[g]), rstd = r.rstd[g];
    double xmax = 0, gmax = 0;
    for (Index j = 0; j < n; ++j) {
      const auto i = static_cast<std::size_t>(g * n + j);
      xmax = std::max(xmax, std::fabs(xs[i]));
      gmax = std::max(gmax, std::fabs(dys[i]) * wj(j));
      sum_b[static_cast<std::size_t>(j)] += std::fabs(dys[i]);
    }
    s.mean = std::max(s.mean, xmax);
    if (!std::isfinite(rstd)) continue;
    const double kappa = (xmax + mean) * rstd;
    s.rstd = std::max(s.rstd, rstd * kappa);
    s.dx = std::max(s.dx, rstd * gmax * kappa * kappa);
    s.dx_terms = std::max(s.dx_terms, rstd * gmax);
    for (Index j = 0; j < n; ++j) {
      const auto i = static_cast<std::size_t>(g * n + j);
      const double a = (std::fabs(xs[i]) + mean) * rstd;
      s.y = std::max(s.y, wj(j) * a + bj(j));
      sum_w[static_cast<std::size_t>(j)] += std::fabs(dys[i]) * a;
      sum_xh[static_cast<std::size_t>(j)] += std::fabs(dys[i] * (xs[i] - r.mean[g]) * rstd);
    }
  }
  s.dw = *std::max_element(sum_w.begin(), sum_w.end());
  s.dw_terms = *std::max_element(sum_xh.begin(), sum_xh.end());
  s.db = *std::max_element(sum_b.begin(), sum_b.end());
  return s;
}

// Worst errors over all cases, in ε of max|ref| (normlab, torch) and of C (torch, what is asserted).
struct Worst {
  double nl = 0, torch = 0, torch_budget = 0;
};
std::map<std::string, Worst>& worst() {
  static std::map<std::string, Worst> w;
  return w;
}

// All checks for one quantity. `ordinary` is normlab's budget against the float64 reference.
void check(const std::string& what, ConstView nl, const at::Tensor& torch, const ref::DTensor& r,
           Tol ordinary, double c) {
  const ConstView tv = view_of(torch);
  const double mag = max_abs(r), cc = std::max(c, mag);
  const Tol torch_tol{kTorchK, cc};
  EXPECT_TRUE(all_close(nl, r, ordinary, what + ": normlab vs float64"));
  EXPECT_TRUE(all_close(tv, r, torch_tol, what + ": LibTorch vs float64"));
  EXPECT_TRUE(all_close(tv, ref::to_double(nl), torch_tol, what + ": LibTorch vs normlab"));
  const double e_nl = max_err(nl, r), e_t = max_err(tv, r);
  // normlab rounds in fp32 too (docs/numerics.md), so "as exact" is up to one ε of the magnitude its own
  // budget is relative to (ordinary.scale: the terms of y, of dx, of the dγ/dβ sums).
  EXPECT_LE(e_nl, e_t + kEps32 * std::max(mag, ordinary.scale)) << what << ": normlab is less exact than LibTorch";
  Worst& w = worst()[what];
  if (mag > 0) w.nl = std::max(w.nl, e_nl / (kEps32 * mag));
  if (mag > 0) w.torch = std::max(w.torch, e_t / (kEps32 * mag));
  if (cc > 0) w.torch_budget = std::max(w.torch_budget, e_t / (kEps32 * cc));
}

void check_problem(const Problem& p) {
  const Results res = run_both(p);
  const ref::LayerNormOut r = ref::layer_norm_forward(p.x, p.w, p.b, p.axes, p.eps);
  const ref::LayerNormGrads g = ref::layer_norm_backward(p.dy, p.x, p.w, p.axes, p.eps);
  const Scales s = torch_scales(p, r);
  // normlab's budgets are the unit tests' (tests/norm/layer_norm_test.cpp).
  // y = x̂·γ + β in fp32: 4 ε of |x̂·γ| ≤ |y| + |β| and half an ε of |y| (docs/numerics.md).
  const double y_scale = std::max(1.0, max_abs(r.y) + (p.b.defined() ? testing::max_abs(p.b) : 0.0));
  check("y", res.y.cview(), res.ty, r.y, Tol{4.5, y_scale}, s.y);
  check("mean", res.mean.cview(), res.tmean, r.mean, Tol{1, 1e-30}, s.mean);
  check("rstd", res.rstd.cview(), res.trstd, r.rstd, Tol{2, 1e-30}, s.rstd);
  // dx is formed in fp32 from O(rstd·|dy·γ|) terms that cancel (docs/numerics.md): that is its scale.
  check("dx", res.dx.cview(), res.tdx, g.dx, Tol{16, std::max(max_abs(g.dx), s.dx_terms)}, s.dx);
  if (p.w.defined()) {
    // Sums over the groups whose terms are rounded and partly summed in fp32 (docs/numerics.md): the
    // scale is the sum of the terms' magnitudes.
    check("dweight", res.dw.cview(), res.tdw, g.dweight, Tol{5, std::max(max_abs(g.dweight), s.dw_terms)},
          s.dw);
    check("dbias", res.db.cview(), res.tdb, g.dbias, Tol{4, std::max(max_abs(g.dbias), s.db)}, s.db);
  } else {  // LibTorch computes no parameter gradients without γ; normlab's still match float64.
    EXPECT_TRUE(all_close(res.dw.cview(), g.dweight, Tol{5, std::max(max_abs(g.dweight), s.dw_terms)}, "dweight (no γ)"));
    EXPECT_TRUE(all_close(res.db.cview(), g.dbias, Tol{4, std::max(max_abs(g.dbias), s.db)}, "dbias (no γ)"));
  }
}

// One random case: a strided view of a padded parent buffer.
struct Case {
  std::string name;
  Tensor parent, w, b, dy;
  View x;
  Axes axes;
  bool use_w = false, use_b = false;
  double eps = 1e-5;
};

Case make_case(std::mt19937_64& rng, int idx) {
  static const Index kSizes[] = {1, 2, 3, 7, 16, 33};
  constexpr Index kMaxElems = 40000;
  std::uniform_int_distribution<int> rank_d(1, 5), coin(0, 1), size_d(0, 5), four(0, 3);
  Case c;
  const int rank = rank_d(rng);
  Dims shape;
  for (int d = 0; d < rank; ++d) shape.push_back(kSizes[size_d(rng)]);
  if (idx % 8 == 3) shape[static_cast<int>(rng() % static_cast<unsigned>(rank))] = 1025;  // one long axis
  for (int d = rank - 1; d >= 0 && shape.product() > kMaxElems; --d)
    if (shape[d] != 1025) shape[d] = 1;
  // Per axis: start offset 0/1, step 1 or 2 (one in four), trailing padding 0/1.
  Dims pshape = shape, start = shape, step = shape;
  for (int d = 0; d < rank; ++d) {
    start[d] = coin(rng);
    step[d] = four(rng) == 0 ? 2 : 1;
    pshape[d] = start[d] + (shape[d] - 1) * step[d] + 1 + coin(rng);
  }
  c.parent = testing::random_tensor(pshape, rng, 1.5, 0.25);
  View v = c.parent.view();
  for (int d = 0; d < rank; ++d) v = v.slice(d, start[d], start[d] + (shape[d] - 1) * step[d] + 1, step[d]);
  if (rank >= 2 && coin(rng)) {
    std::vector<int> order(static_cast<std::size_t>(rank));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    v = v.permute(std::span<const int>(order));
  }
  if (coin(rng)) {  // reverse one axis (negative stride)
    const int a = static_cast<int>(rng() % static_cast<unsigned>(rank));
    if (v.size(a) > 1) v = v.slice(a, v.size(a) - 1, -1, -1);
  }
  c.x = v;
  if (idx % 3 == 0) {  // trailing axes: LibTorch's own layout, compared without permutation
    const int k = std::uniform_int_distribution<int>(1, rank)(rng);
    for (int d = rank - k; d < rank; ++d) c.axes.push_back(coin(rng) ? d : d - rank);
  } else {  // any non-empty subset, any order, sometimes negative
    for (int d = 0; d < rank; ++d)
      if (coin(rng)) c.axes.push_back(coin(rng) ? d : d - rank);
    if (c.axes.empty()) c.axes.push_back(static_cast<int>(rng() % static_cast<unsigned>(rank)));
    std::shuffle(c.axes.begin(), c.axes.end(), rng);
  }
  c.use_w = coin(rng);
  c.use_b = coin(rng);
  const Dims ns = normalized_shape(v.shape(), c.axes);
  c.w = testing::random_tensor(ns, rng, 1.0, 1.0);
  c.b = testing::random_tensor(ns, rng, 1.0, 0.0);
  c.dy = testing::random_tensor(v.shape(), rng, 1.0, 0.0);
  c.eps = coin(rng) ? 0.0 : 1e-5;
  c.name = fmt::format("case {}: shape {} strides {} axes [{}] γ={} β={} eps={}", idx, v.shape().str(),
                       v.strides().str(), fmt::join(c.axes, ","), c.use_w, c.use_b, c.eps);
  return c;
}

class LayerNormTorch : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { at::set_num_threads(1); }
};

TEST_F(LayerNormTorch, RandomShapesLayoutsAndAxesMatchLibTorch) {
  constexpr int kCases = 320;
  std::mt19937_64 rng(20240611);
  worst().clear();
  for (int i = 0; i < kCases; ++i) {
    Case c = make_case(rng, i);
    SCOPED_TRACE(c.name);
    const ConstView w = c.use_w ? c.w.cview() : ConstView{}, b = c.use_b ? c.b.cview() : ConstView{};
    check_problem(Problem{&c.parent, c.x, c.dy.cview(), w, b, c.axes, c.eps});
    ASSERT_FALSE(HasFailure()) << "stopping at the first failing case";
  }
  for (const auto& [what, w] : worst()) {
    std::cout << fmt::format(
        "[ worst {:7} ] normlab {:6.3f} ε·max|ref|   LibTorch {:9.3g} ε·max|ref|, "
        "{:6.3f} ε·C (budget {})\n",
        what, w.nl, w.torch, w.torch_budget, kTorchK);
    RecordProperty("worst_" + what, fmt::format("normlab {:.3g}, torch {:.3g}, torch/C {:.3g}", w.nl, w.torch,
                                                w.torch_budget));
  }
}

TEST_F(LayerNormTorch, SpeechAndVideoAxes) {
  // [B,F,T] over F, over (B,T), over (F,T), over T; video [B,T,N,D] over D and over (T,D).
  std::mt19937_64 rng(4);
  Tensor speech = testing::random_tensor({4, 80, 37}, rng, 3.0, 5.0);
  Tensor video = testing::random_tensor({2, 5, 3, 64}, rng, 1.0, 0.0);
  struct Item {
    const Tensor* x;
    Axes axes;
  };
  for (const Item& it : {Item{&speech, {1}}, Item{&speech, {0, 2}}, Item{&speech, {1, 2}},
                         Item{&speech, {-1}}, Item{&video, {3}}, Item{&video, {3, 1}}}) {
    SCOPED_TRACE(fmt::format("shape {} axes [{}]", it.x->shape().str(), fmt::join(it.axes, ",")));
    const Dims ns = normalized_shape(it.x->shape(), it.axes);
    Tensor w = testing::random_tensor(ns, rng, 1.0, 1.0), b = testing::random_tensor(ns, rng, 1.0, 0.0);
    Tensor dy = testing::random_tensor(it.x->shape(), rng, 1.0, 0.0);
    check_problem(Problem{it.x, it.x->cview(), dy.cview(), w.cview(), b.cview(), it.axes, 1e-5});
  }
}

TEST_F(LayerNormTorch, OffsetTenThousandRowsAreExactInNormlabNotInLibTorch) {
  // Rows x = 1e4 + N(0,1), D = 768 (fp32 spacing at 1e4 is ~1e-3): LibTorch's fp32 moments and its
  // x·rstd − mean·rstd lose ~1e-3 in y; normlab's double moments give y within fp32 output rounding.
  std::mt19937_64 rng(1);
  std::normal_distribution<double> nd(0.0, 1.0);
  const Index rows = 64, d = 768;
  Tensor x({rows, d});
  for (Index i = 0; i < x.numel(); ++i) x[i] = static_cast<float>(1e4 + nd(rng));
  Tensor dy = testing::random_tensor({rows, d}, rng, 1.0, 0.0);
  const Problem p{&x, x.cview(), dy.cview(), {}, {}, {1}, 1e-5};
  const Results res = run_both(p);
  const ref::LayerNormOut r = ref::layer_norm_forward(p.x, {}, {}, p.axes, p.eps);
  const ref::LayerNormGrads g = ref::layer_norm_backward(p.dy, p.x, {}, p.axes, p.eps);
  const double nl_y = max_err(res.y.cview(), r.y), torch_y = max_err(view_of(res.ty), r.y);
  const double nl_dx = max_err(res.dx.cview(), g.dx), torch_dx = max_err(view_of(res.tdx), g.dx);
  std::cout << fmt::format(
      "[ offset 1e4, D=768 ] max|y − y64|: normlab {:.3g}, LibTorch {:.3g};  "
      "max|dx − dx64| / max|dx64|: normlab {:.3g}, LibTorch {:.3g}\n",
      nl_y, torch_y, nl_dx / max_abs(g.dx), torch_dx / max_abs(g.dx));
  RecordProperty("normlab_y_max_abs_err", fmt::format("{:.3g}", nl_y));
  RecordProperty("libtorch_y_max_abs_err", fmt::format("{:.3g}", torch_y));
  EXPECT_LE(nl_y, 1e-6);
  EXPECT_GT(torch_y, nl_y);
  EXPECT_TRUE(all_close(res.dx.cview(), g.dx, Tol{16, max_abs(g.dx)}, "normlab dx at offset 1e4"));
  EXPECT_LE(nl_dx, torch_dx + kEps32 * max_abs(g.dx));
}

}  // namespace
}  // namespace normlab
