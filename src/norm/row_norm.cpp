// The row-group engine behind LayerNorm and RMSNorm over any set of axes of a strided tensor.
//
// Contract (see include/normlab/norm.h): y, dx written =; dweight, dbias written = or += (GradMode).
// Algorithm per group (docs/numerics.md); RMSNorm is the same with centring off (mean ≡ 0, no β):
//   forward:  mean = Σx/n in double; e = x − m_hi in float (m_hi = float(mean), m_lo = float(mean − m_hi));
//             var = Σe²/n − m_lo² (float squares in blocks, double accumulation), rstd = 1/√(var+eps)
//             in double; y = ((x − m_hi) − m_lo)·float(rstd)·γ + β in float.
//   backward: mean and rstd recomputed exactly as in the forward (or, with NormStats, the forward's
//             double mean and rstd, the same values); g = dy·γ, x̂ = d·rstd;
//             dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) in float; dγ = Σ_groups dy·x̂; dβ = Σ_groups dy in
//             double. (RMSNorm: dx = rstd·(g − x̂·mean(g·x̂)).)
// Contiguous rows go to the fused kernels (RowKernels::rows_forward, rows_backward) a block of rows per
// call: all at one stride (the common case), or, when the kept axes do not collapse, in runs of rows at
// one stride (Runs below); groups whose elements are not consecutive floats are gathered into a
// contiguous row one at a time, and the result scattered.
// Parallelism: groups are independent (any schedule gives the same bits). dγ/dβ are reduced per fixed
// chunk of groups (row_chunks, a function of the shape only) and the chunk partials are then summed in
// chunk order, in parallel over columns.
#include "norm/row_norm.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "norm/column_norm.h"
#include "norm/norm_plan.h"
#include "norm/row_kernels.h"
#include "norm/streaming.h"
#include "parallel/parallel.h"

namespace normlab {

namespace {

// A group's data as a contiguous pointer: the tensor itself when its layout allows, else a gather.
const float* group_input(const plan::FullOperand& op, Index koff, const plan::AxisSplit& s, float* scratch) {
  const float* p = reinterpret_cast<const float*>(op.base) + koff;
  if (op.n_contiguous) return p;
  plan::gather(scratch, p, s.n_shape, op.n_strides);
  return scratch;
}

struct GroupOutput {
  float* ptr;
  bool needs_scatter;
};
GroupOutput group_output(const plan::FullOperand& op, Index koff, float* scratch) {
  float* p = reinterpret_cast<float*>(op.base) + koff;
  return op.n_contiguous ? GroupOutput{p, false} : GroupOutput{scratch, true};
}

// The trailing kept axes (size-1 axes ignored) along which this operand's groups lie at one fixed stride:
// returns how many consecutive groups they span (1 when there is no such axis, all of them when every kept
// axis collapses), and in *ld the stride between consecutive groups there (0 for a single group).
Index collapsed_run(const Dims& k_shape, const Dims& k_strides, Index* ld) {
  *ld = 0;
  Index span = 0;  // groups covered by the axes seen so far (0: none yet)
  for (int d = k_shape.size() - 1; d >= 0; --d) {
    if (k_shape[d] == 1) continue;
    if (span == 0) {
      *ld = k_strides[d];
      span = k_shape[d];
    } else {
      if (k_strides[d] != *ld * span) break;
      span *= k_shape[d];
    }
  }
  return std::max<Index>(span, 1);
}

// True when group g of an operand starts at g·ld for every g (the kept axes collapse to one stride);
// size-1 axes are ignored, and a single group gives ld = 0.
bool linear_groups(const Dims& k_shape, const Dims& k_strides, Index* ld) {
  Index groups = 1;
  for (Index e : k_shape) groups *= e;
  return collapsed_run(k_shape, k_strides, ld) == groups;
}

// How the paths for layouts other than linear rows visit the groups: in an order h = 0 .. groups − 1 cut
// into runs of `len` consecutive groups that lie at one stride in every operand, a run per kernel call.
// The order is the groups' own (row-major over the kept axes) unless x's kept axis of smallest stride is
// not its last one; then that axis goes innermost, the others keep their order. The runs are the trailing
// axes of that order that collapse to one stride in every operand. (The rows of a [B, T, C] view of
// [T, B, C] memory: visited t by t, b by b, which is their order in memory, one run of every group; in the
// groups' own order they would be runs of T rows B·C floats apart.) Groups whose elements are not
// consecutive floats are gathered: runs of one.
struct Runs {
  Index len = 1;
  bool reordered = false;      // the visiting order is not the groups' own
  Dims vshape;                 // the kept axes' sizes in visiting order (outermost first)
  std::vector<int> order;      // the kept axis at each visiting position
  std::vector<Index> gstride;  // the group-number stride of the axis at each visiting position

  // The group number of the h-th group visited.
  Index group(Index h) const {
    if (!reordered) return h;
    Index g = 0;
    for (int d = static_cast<int>(vshape.size()) - 1; d >= 0; --d) {
      g += (h % vshape[d]) * gstride[static_cast<std::size_t>(d)];
      h /= vshape[d];
    }
    return g;
  }
  // An operand's kept strides in visiting order.
  Dims visiting(const Dims& k_strides) const {
    Dims v = vshape;
    for (std::size_t d = 0; d < order.size(); ++d) v[d] = k_strides[order[d]];
    return v;
  }
  // The element stride between consecutive groups of a run in an operand with these kept strides.
  Index step(const Dims& k_strides) const {
    Index ld = 0;
    collapsed_run(vshape, visiting(k_strides), &ld);
    return ld;
  }
};

// The runs for operands with these kept strides (x's first); runs of one when `gathered`.
Runs make_runs(const Dims& k_shape, const std::vector<const Dims*>& strides, bool gathered) {
  const int rank = static_cast<int>(k_shape.size());
  std::vector<Index> gs(static_cast<std::size_t>(rank), 1);
  Index groups = 1;
  for (int d = rank - 1; d >= 0; --d) {
    gs[static_cast<std::size_t>(d)] = groups;
    groups *= k_shape[d];
  }
  const Dims& xs = *strides.front();
  int last = -1, smallest = -1;
  for (int d = 0; d < rank; ++d) {
    if (k_shape[d] == 1) continue;
    last = d;
    if (smallest < 0 || std::abs(xs[d]) <= std::abs(xs[smallest])) smallest = d;
  }
  Runs r;
  r.reordered = !gathered && smallest != last;
  for (int d = 0; d < rank; ++d)
    if (!r.reordered || d != smallest) r.order.push_back(d);
  if (r.reordered) r.order.push_back(smallest);
  r.vshape = k_shape;
  for (std::size_t d = 0; d < r.order.size(); ++d) {
    r.vshape[d] = k_shape[r.order[d]];
    r.gstride.push_back(gs[static_cast<std::size_t>(r.order[d])]);
  }
  if (gathered) return r;
  r.len = groups;
  for (const Dims* st : strides) {
    Index ld = 0;
    r.len = std::min(r.len, collapsed_run(r.vshape, r.visiting(*st), &ld));
  }
  return r;
}

// Calls f(h0, h1) for the runs of consecutive groups in [t0, t1) of the visiting order that lie within
// one run of `len` (h0 / len == (h1 − 1) / len).
template <typename F>
void for_runs(Index t0, Index t1, Index len, F&& f) {
  for (Index h = t0; h < t1;) {
    const Index e = std::min(t1, (h / len + 1) * len);
    f(h, e);
    h = e;
  }
}

// Chunks of contiguous rows for the fused backward (a function of the shape only): at most 64 chunks
// (and at most ~64 MiB of double partials in all), each at least 32 rows, a multiple of the kernel's row
// group, and 256 KiB of x where that still leaves 8 chunks. Each chunk writes two partial rows of n
// doubles and the reduction reads them all, so fewer chunks move less: with 64 KiB chunks (22 of them at
// 682x768) the backward from saved statistics took 171–174 µs at 1 thread and 100–101 at 2, with 8 chunks
// 158–165 and 87–91 (docs/PERFORMANCE.md, sixth session).
plan::Chunks row_chunks(Index groups, Index n) {
  const Index group = kernels::kParamGradRowGroup;
  const Index by_memory = std::max<Index>(1, (Index{64} << 20) / (16 * n));
  const Index max_chunks = std::min<Index>(64, by_memory);
  const Index target = std::min(((Index{1} << 16) + n - 1) / n, std::max<Index>(32, (groups + 7) / 8));
  Index size = std::max({(groups + max_chunks - 1) / max_chunks, Index{32}, target});
  size = (size + group - 1) / group * group;
  plan::Chunks c;
  c.size = size;
  c.count = std::max<Index>(1, (groups + size - 1) / size);
  return c;
}

// The bytes [lo, hi) a view can touch.
struct ByteSpan {
  const char* lo;
  const char* hi;
};
ByteSpan byte_span(const View& v) {
  const char* base = reinterpret_cast<const char*>(v.data());
  Index lo = 0, hi = 0;
  for (int d = 0; d < v.rank(); ++d) {
    const Index reach = (v.size(d) - 1) * v.stride(d);
    (reach < 0 ? lo : hi) += reach;
  }
  return {base + lo * Index{sizeof(float)}, base + (hi + 1) * Index{sizeof(float)}};
}

// γ or β as n consecutive floats (row-major over the normalized axes): the operand itself when its
// layout already is that and no output of the call overlaps it (the common case; no copy per call),
// else a gathered copy in `scratch`.
const float* part_floats(const plan::PartOperand& p, const Dims& shape, std::initializer_list<View> outs,
                         std::vector<float>& scratch) {
  if (!p.defined) return nullptr;
  const bool contiguous = plan::part_contiguous(p, shape);
  const char* lo = p.base;
  const char* hi = p.base + shape.product() * Index{sizeof(float)};
  bool apart = true;
  for (const View& out : outs) {
    if (!out.defined() || out.empty()) continue;
    const ByteSpan o = byte_span(out);
    if (!(o.hi <= lo || hi <= o.lo)) apart = false;
  }
  if (contiguous && apart) return reinterpret_cast<const float*>(p.base);
  scratch = plan::gather_part(p, shape);
  return scratch.data();
}

void check_eps(double eps, const char* op) {
  NL_CHECK(std::isfinite(eps) && eps >= 0, "{}: eps must be finite and ≥ 0, got {}", op, eps);
}

}  // namespace

// x is any shape; y like x; mean, rstd like the kept axes; weight, bias like the normalized axes.
void row_norm_forward(const RowNormKind& kind, View y, View mean, View rstd, ConstView x, ConstView weight,
                      ConstView bias, const Axes& axes, double eps, NormStats* stats) {
  const char* kFwd = kind.forward_name;
  NL_CHECK(x.defined(), "{}: x is required", kFwd);
  NL_CHECK(y.defined(), "{}: y is required", kFwd);
  const plan::AxisSplit s = plan::split_axes(x.shape(), axes, kFwd);
  check_eps(eps, kFwd);
  plan::check_same_shape(x.shape(), y.shape(), "y", kFwd);
  plan::check_writable(y.shape(), y.strides(), "y", kFwd);
  plan::check_no_partial_overlap(y, x, "y", "x", kFwd);
  const plan::PartOperand w = plan::part_operand(weight, s.n_shape, "weight", kFwd);
  const plan::PartOperand b = plan::part_operand(bias, s.n_shape, "bias", kFwd);
  const plan::PartOperand pm = plan::part_operand(mean, s.k_shape, "mean", kFwd);
  const plan::PartOperand pr = plan::part_operand(rstd, s.k_shape, "rstd", kFwd);
  NL_CHECK(kind.center || !pm.defined, "{}: there is no mean to write (the norm does not centre)", kFwd);
  NL_CHECK(kind.center || !b.defined, "{}: takes no bias", kFwd);
  if (pm.defined) {
    plan::check_writable(mean.shape(), mean.strides(), "mean", kFwd);
    plan::check_no_partial_overlap(mean, x, "mean", "x", kFwd);
  }
  if (pr.defined) {
    plan::check_writable(rstd.shape(), rstd.strides(), "rstd", kFwd);
    plan::check_no_partial_overlap(rstd, x, "rstd", "x", kFwd);
  }

  const plan::FullOperand xo = plan::full_operand(x, s, "x");
  const plan::FullOperand yo = plan::full_operand(y, s, "y");
  std::vector<float> wv, bv;
  const float* wp = part_floats(w, s.n_shape, {y, mean, rstd}, wv);
  const float* bp = part_floats(b, s.n_shape, {y, mean, rstd}, bv);
  // Strided normalized axes next to a contiguous kept axis ([B,F,T] over F): the column path.
  const bool column_path = column::applies(s, {&xo, &yo});
  const StatsOut so = stats ? prepare_stats(stats, kind.center, x.shape(), s, eps) : StatsOut{};
  double* const smean = so.mean;
  double* const srstd = so.rstd;
  if (column_path) return column::forward(kind, s, yo, xo, wp, bp, pm, pr, eps, smean, srstd);
  const kernels::RowKernels& k = kernels::row_kernels();
  const bool scratch_needed = !xo.n_contiguous || !yo.n_contiguous;

  // The groups in runs at one stride in every operand (Runs), a run per call; groups whose elements are not
  // consecutive floats one at a time, gathered (y scattered). The kernel takes one stride for mean and rstd.
  std::vector<const Dims*> strides{&xo.k_strides, &yo.k_strides};
  if (pm.defined) strides.push_back(&pm.strides);
  if (pr.defined) strides.push_back(&pr.strides);
  Runs runs = make_runs(s.k_shape, strides, scratch_needed);
  if (pm.defined && pr.defined && runs.step(pm.strides) != runs.step(pr.strides))
    runs = make_runs(s.k_shape, strides, true);
  const Index ldx = runs.step(xo.k_strides), ldy = runs.step(yo.k_strides);
  const Index lstats = pm.defined ? runs.step(pm.strides) : pr.defined ? runs.step(pr.strides) : 0;
  // Fast path: every group in one run in its own order (the last axes normalized, the kept axes collapsing
  // to one stride in every operand): the rows split evenly between the threads.
  const bool rows_path = !scratch_needed && !runs.reordered && runs.len == s.groups;
  kernels::RowsForward args;
  args.n = s.n;
  args.w = wp;
  args.b = bp;
  args.eps = eps;
  args.center = kind.center;
  // (A layout through per-group scratch writes y from the scratch, without streaming stores.)
  args.stream = !scratch_needed && kernels::stream_output_bytes(s.groups * s.n * Index{sizeof(float)});
  // Each thread a range of groups, cut into tasks (split_rows); the split only affects scheduling, never
  // results.
  const plan::RowSplit split =
      plan::split_rows(s.groups, s.n, plan::task_rows(s.n, args.stream), num_threads());
  if (rows_path) {
    parallel::parallel_for(split.tasks, [&](Index t) {
      const Index g0 = split.first(t);
      kernels::RowsForward a = args;
      a.rows = split.rows(t);
      if (a.rows == 0) return;
      a.x = reinterpret_cast<const float*>(xo.base) + g0 * ldx;
      a.ldx = ldx;
      a.y = reinterpret_cast<float*>(yo.base) + g0 * ldy;
      a.ldy = ldy;
      a.ld_stats = lstats;
      a.mean = pm.defined ? reinterpret_cast<float*>(pm.base) + g0 * lstats : nullptr;
      a.rstd = pr.defined ? reinterpret_cast<float*>(pr.base) + g0 * lstats : nullptr;
      a.smean = smean ? smean + g0 : nullptr;
      a.srstd = srstd ? srstd + g0 : nullptr;
      k.rows_forward(a);
    });
    return;
  }

  // Any other layout: a run per call, in visiting order (the task's range of it).
  parallel::parallel_for(split.tasks, [&](Index t) {
    const Index h_first = split.first(t), count = split.rows(t);
    if (count == 0) return;
    std::vector<float> xs(scratch_needed ? static_cast<std::size_t>(s.n) : 0);
    std::vector<float> ys(scratch_needed ? static_cast<std::size_t>(s.n) : 0);
    // NormStats' double statistics of a run in visiting order, when that is not the groups' order.
    const Index most = std::min(runs.len, count);
    std::vector<double> saved(runs.reordered && (smean || srstd) ? static_cast<std::size_t>(2 * most) : 0);
    for_runs(h_first, h_first + count, runs.len, [&](Index h0, Index h1) {
      const Index g0 = runs.group(h0);
      kernels::RowsForward a = args;
      a.rows = h1 - h0;
      a.x = group_input(xo, plan::group_offset(g0, s.k_shape, xo.k_strides), s, xs.data());
      a.ldx = ldx;
      const Index yoff = plan::group_offset(g0, s.k_shape, yo.k_strides);
      const GroupOutput yr = group_output(yo, yoff, ys.data());
      a.y = yr.ptr;
      a.ldy = ldy;
      a.ld_stats = lstats;
      if (pm.defined)
        a.mean = reinterpret_cast<float*>(pm.base) + plan::group_offset(g0, s.k_shape, pm.strides);
      if (pr.defined)
        a.rstd = reinterpret_cast<float*>(pr.base) + plan::group_offset(g0, s.k_shape, pr.strides);
      const bool via = !saved.empty();
      if (smean) a.smean = via ? saved.data() : smean + g0;
      if (srstd) a.srstd = via ? saved.data() + most : srstd + g0;
      k.rows_forward(a);
      for (Index r = 0; via && r < a.rows; ++r) {
        const Index g = runs.group(h0 + r);
        if (smean) smean[g] = saved[static_cast<std::size_t>(r)];
        if (srstd) srstd[g] = saved[static_cast<std::size_t>(most + r)];
      }
      if (yr.needs_scatter)
        plan::scatter(reinterpret_cast<float*>(yo.base) + yoff, yr.ptr, s.n_shape, yo.n_strides);
    });
  });
}

// dy, x are any shape; dx like x; weight, dweight, dbias like the normalized axes. Literal reverse of
// the forward: recompute mean, rstd and x̂ (or take mean and rstd from the forward's stats: the same
// values), then dx, and dγ/dβ in the same pass.
void row_norm_backward(const RowNormKind& kind, View dx, View dweight, View dbias, ConstView dy, ConstView x,
                       ConstView weight, const Axes& axes, double eps, GradMode mode,
                       const NormStats* stats) {
  const char* kBwd = kind.backward_name;
  NL_CHECK(x.defined() && dy.defined(), "{}: x and dy are required", kBwd);
  NL_CHECK(dx.defined(), "{}: dx is required", kBwd);
  if (stats) check_stats_source(*stats, kind.center, x.shape(), kBwd);  // before the axes, which come from it
  const plan::AxisSplit s = plan::split_axes(x.shape(), axes, kBwd);
  check_eps(eps, kBwd);
  plan::check_same_shape(x.shape(), dy.shape(), "dy", kBwd);
  plan::check_same_shape(x.shape(), dx.shape(), "dx", kBwd);
  plan::check_writable(dx.shape(), dx.strides(), "dx", kBwd);
  plan::check_no_partial_overlap(dx, x, "dx", "x", kBwd);
  plan::check_no_partial_overlap(dx, dy, "dx", "dy", kBwd);
  const plan::PartOperand w = plan::part_operand(weight, s.n_shape, "weight", kBwd);
  const plan::PartOperand dw = plan::part_operand(dweight, s.n_shape, "dweight", kBwd);
  const plan::PartOperand db = plan::part_operand(dbias, s.n_shape, "dbias", kBwd);
  NL_CHECK(kind.center || !db.defined, "{}: there is no bias gradient (the norm has no bias)", kBwd);
  if (dw.defined) {
    plan::check_writable(dweight.shape(), dweight.strides(), "dweight", kBwd);
    plan::check_no_partial_overlap(dweight, x, "dweight", "x", kBwd);
    plan::check_no_partial_overlap(dweight, dy, "dweight", "dy", kBwd);
  }
  if (db.defined) {
    plan::check_writable(dbias.shape(), dbias.strides(), "dbias", kBwd);
    plan::check_no_partial_overlap(dbias, x, "dbias", "x", kBwd);
    plan::check_no_partial_overlap(dbias, dy, "dbias", "dy", kBwd);
  }

  const plan::FullOperand xo = plan::full_operand(x, s, "x");
  const plan::FullOperand dyo = plan::full_operand(dy, s, "dy");
  const plan::FullOperand dxo = plan::full_operand(dx, s, "dx");
  std::vector<float> wv;
  const float* wp = part_floats(w, s.n_shape, {dx}, wv);
  const StatsIn si = stats ? saved_stats(*stats, kind.center, s, kBwd) : StatsIn{};
  const double* const smean = si.mean;
  const double* const srstd = si.rstd;
  if (column::applies(s, {&xo, &dyo, &dxo}))  // see row_norm_forward
    return column::backward(kind, s, dxo, dw, db, dyo, xo, wp, eps, mode, smean, srstd);
  const kernels::RowKernels& k = kernels::row_kernels();
  const bool scratch_needed = !xo.n_contiguous || !dyo.n_contiguous || !dxo.n_contiguous;
  const bool param_grads = dw.defined || db.defined;
  const std::size_t nn = static_cast<std::size_t>(s.n);

  kernels::RowsBackward args;
  args.n = s.n;
  args.w = wp;
  args.eps = eps;
  args.center = kind.center;

  // The groups in runs at one stride in x, dy and dx (Runs: every group in one run when the normalized
  // axes are last and contiguous, the common case), a run per call; groups whose elements are not
  // consecutive floats one at a time, gathered (dx scattered).
  const Runs runs = make_runs(s.k_shape, {&xo.k_strides, &dyo.k_strides, &dxo.k_strides}, scratch_needed);
  if (!scratch_needed) args.stream = kernels::stream_output_bytes(s.groups * s.n * Index{sizeof(float)});
  const Index ldx = runs.step(xo.k_strides), lddy = runs.step(dyo.k_strides), lddx = runs.step(dxo.k_strides);
  // Chunks of the visiting order (row_chunks, shape only): each owns one partial row of dγ and dβ (double)
  // when they are wanted, part.dw_row(c) and db_row(c) (plan::PartialRows: 64-byte aligned rows). Every
  // chunk's first call assigns its partial rows (init), so the buffer is reused unzeroed.
  const plan::Chunks ch = row_chunks(s.groups, s.n);
  thread_local std::vector<double> partials;
  const plan::PartialRows part(partials, ch.count, s.n, dw.defined, db.defined);
  parallel::parallel_for(ch.count, [&](Index c) {
    std::vector<float> xs(scratch_needed ? nn : 0), dys(scratch_needed ? nn : 0),
        dxs(scratch_needed ? nn : 0);
    // The saved statistics of a run in visiting order, when given and that is not the groups' order.
    const Index most = std::min(runs.len, ch.size);
    std::vector<double> saved(runs.reordered && srstd ? static_cast<std::size_t>(2 * most) : 0);
    const Index h_begin = c * ch.size;
    for_runs(h_begin, std::min(s.groups, h_begin + ch.size), runs.len, [&](Index h0, Index h1) {
      const Index g0 = runs.group(h0);
      kernels::RowsBackward a = args;
      a.rows = h1 - h0;
      a.dw = part.dw_row(c);
      a.db = part.db_row(c);
      a.init = h0 == h_begin;
      a.x = group_input(xo, plan::group_offset(g0, s.k_shape, xo.k_strides), s, xs.data());
      a.ldx = ldx;
      a.dy = group_input(dyo, plan::group_offset(g0, s.k_shape, dyo.k_strides), s, dys.data());
      a.lddy = lddy;
      const Index dxoff = plan::group_offset(g0, s.k_shape, dxo.k_strides);
      const GroupOutput dxr = group_output(dxo, dxoff, dxs.data());
      a.dx = dxr.ptr;
      a.lddx = lddx;
      if (!saved.empty()) {
        for (Index r = 0; r < a.rows; ++r) {
          const Index g = runs.group(h0 + r);
          if (smean) saved[static_cast<std::size_t>(r)] = smean[g];
          saved[static_cast<std::size_t>(most + r)] = srstd[g];
        }
        a.smean = smean ? saved.data() : nullptr;
        a.srstd = saved.data() + most;
      } else {
        a.smean = smean ? smean + g0 : nullptr;
        a.srstd = srstd ? srstd + g0 : nullptr;
      }
      k.rows_backward(a);
      if (dxr.needs_scatter)
        plan::scatter(reinterpret_cast<float*>(dxo.base) + dxoff, dxr.ptr, s.n_shape, dxo.n_strides);
    });
  });
  if (!param_grads) return;

  // Sum the chunk partials in chunk order (per column: 0 + p_0 + p_1 + ...), round once, write or add.
  if (dw.defined) plan::write_chunk_sums(dw, s.n_shape, part.dw(), ch.count, mode);
  if (db.defined) plan::write_chunk_sums(db, s.n_shape, part.db(), ch.count, mode);
}

StatsOut prepare_stats(NormStats* stats, bool center, const Dims& x_shape, const plan::AxisSplit& s,
                       double eps) {
  stats->center = center;
  stats->x_shape = x_shape;
  stats->axes = s.n_axes;
  stats->eps = eps;
  const std::size_t groups = static_cast<std::size_t>(s.groups);
  stats->mean.assign(center ? groups : 0, 0.0);
  stats->rstd.assign(groups, 0.0);
  return {center ? stats->mean.data() : nullptr, stats->rstd.data()};
}

void check_stats_source(const NormStats& stats, bool center, const Dims& x_shape, const char* op) {
  NL_CHECK(stats.center == center, "{}: stats come from a {} forward", op,
           stats.center ? "LayerNorm" : "RMSNorm");
  NL_CHECK(stats.x_shape == x_shape, "{}: x has shape {}, the stats' forward had {}", op, x_shape.str(),
           stats.x_shape.str());
}

StatsIn saved_stats(const NormStats& stats, bool center, const plan::AxisSplit& s, const char* op) {
  const std::size_t groups = static_cast<std::size_t>(s.groups);
  NL_CHECK(stats.rstd.size() == groups && stats.mean.size() == (center ? groups : std::size_t{0}),
           "{}: stats hold {} mean and {} rstd values for {} groups", op, stats.mean.size(),
           stats.rstd.size(), groups);
  return {center ? stats.mean.data() : nullptr, stats.rstd.data()};
}

plan::Chunks fused_row_chunks(Index groups, Index n) { return row_chunks(groups, n); }
bool groups_at_fixed_stride(const Dims& k_shape, const Dims& k_strides, Index* ld) {
  return linear_groups(k_shape, k_strides, ld);
}

}  // namespace normlab
