// The channel-norm engine (see channel_norm.h): segment passes over x viewed as [B, C, S...].
//
// Contract: every pass writes its outputs = (y, dx at every element; per-segment sums at every
// segment). Per segment the channel kernels (channel_kernels.h) run over the real elements in row-major
// order of S, gathered into a contiguous buffer when they are not consecutive floats already; outputs
// whose segments are consecutive floats are written in place (streamed when large), others through a
// scratch row and a scatter. Segments (or groups, or rows) are cut into a range per thread and tasks
// within it (for_item_ranges); each segment's arithmetic is its own and per-group values are combined
// serially in segment order (b major, c minor), so the bits never depend on the split or the thread count
// (docs/numerics.md).
#include "norm/channel_norm.h"

#include <normlab/simd.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>

#include "norm/channel_kernels.h"
#include "norm/mean_split.h"
#include "norm/norm_plan.h"
#include "norm/row_kernels.h"
#include "norm/streaming.h"
#include "parallel/parallel.h"
#include "simd/isa_select.h"

namespace normlab::kernels {
namespace scalar {
extern const ChannelKernels kChannelTable;
}
namespace avx2 {
extern const ChannelKernels kChannelTable;
}
namespace avx512 {
extern const ChannelKernels kChannelTable;
}

const ChannelKernels& channel_kernels() {
  return *for_isa(active_isa(), &scalar::kChannelTable, &avx2::kChannelTable, &avx512::kChannelTable);
}

}  // namespace normlab::kernels

namespace normlab::chnorm {

namespace {

// A full-shaped operand as strides over B, C and S.
struct Operand {
  char* base = nullptr;
  Dims b_strides, s_strides;
  Index c_stride = 0;
  bool s_contiguous = false;  // a segment's S elements are S consecutive floats in row-major order
  std::vector<Index> b_off;   // offset of batch item b (B entries)
};

template <typename T>
Operand operand(const TensorView<T>& v, const Plan& p) {
  Operand o;
  o.base = reinterpret_cast<char*>(const_cast<std::remove_const_t<T>*>(v.data()));
  for (int d : p.b_axes) o.b_strides.push_back(v.stride(d));
  for (int d : p.s_axes) o.s_strides.push_back(v.stride(d));
  o.c_stride = v.stride(p.channel_axis);
  o.b_off.resize(static_cast<std::size_t>(p.B));
  for (Index b = 0; b < p.B; ++b)
    o.b_off[static_cast<std::size_t>(b)] = plan::group_offset(b, p.b_shape, o.b_strides);
  Index expect = 1;
  o.s_contiguous = true;
  for (int i = p.s_shape.size() - 1; i >= 0; --i) {
    if (p.s_shape[i] == 1) continue;
    if (o.s_strides[i] != expect) o.s_contiguous = false;
    expect *= p.s_shape[i];
  }
  return o;
}

Index seg_offset(const Operand& o, const Plan&, Index b, Index c) {
  return o.b_off[static_cast<std::size_t>(b)] + c * o.c_stride;
}

// The box of real elements of batch item b (all of S when unmasked).
Dims valid_shape(const Plan& p, Index b) {
  Dims s = p.s_shape;
  if (p.masked()) s[p.time] = p.len[static_cast<std::size_t>(b)];
  return s;
}

// Whether the real elements of a segment of batch item b are consecutive floats in o's memory.
bool direct(const Operand& o, const Plan& p, Index b) {
  return o.s_contiguous && (!p.masked() || p.time_leading || p.len[static_cast<std::size_t>(b)] == p.T);
}

// The real elements of segment (b, c) as a contiguous pointer (the tensor itself, or a gather).
const float* seg_in(const Operand& o, const Plan& p, Index b, Index c, float* scratch) {
  const float* at = reinterpret_cast<const float*>(o.base) + seg_offset(o, p, b, c);
  if (direct(o, p, b)) return at;
  plan::gather(scratch, at, valid_shape(p, b), o.s_strides);
  return scratch;
}

// Where to write the real elements of segment (b, c): the tensor itself, or scratch to scatter later.
float* seg_out(const Operand& o, const Plan& p, Index b, Index c, float* scratch) {
  return direct(o, p, b) ? reinterpret_cast<float*>(o.base) + seg_offset(o, p, b, c) : scratch;
}

// Scatters scratch (when used) and writes 0 at the padded frames of segment (b, c).
void seg_finish(const Operand& o, const Plan& p, Index b, Index c, const float* written) {
  float* at = reinterpret_cast<float*>(o.base) + seg_offset(o, p, b, c);
  if (written != at) plan::scatter(at, written, valid_shape(p, b), o.s_strides);
  if (!p.masked()) return;
  const Index l = p.len[static_cast<std::size_t>(b)];
  if (l == p.T) return;
  Dims pad = p.s_shape;
  pad[p.time] = p.T - l;
  float* first = at + l * o.s_strides[p.time];
  for_each_offset(pad, o.s_strides, [&](Index off) { first[off] = 0.0f; });
}

// Runs f(first, count) in parallel over `items` consecutive items of about `floats` elements each: each
// thread one contiguous range of items, cut into tasks of at most max_items items (by default about 16 Ki
// elements; plan::split_rows, single items as its blocks), for work whose results do not depend on the
// split (every item's arithmetic is its own). Tasks of a fixed size had left one thread up to a task more:
// at 2 threads, BatchNorm of [16, 64, 100] (1024 segments in tasks of 163) ran 652 segments on one thread
// and 372 on the other.
template <typename F>
void for_item_ranges(Index items, Index floats, F&& f, Index max_items = 0) {
  const Index per_task = max_items > 0 ? max_items : plan::task_rows(floats);
  const plan::RowSplit split = plan::split_rows(items, floats, per_task, normlab::num_threads(), 1);
  parallel::parallel_for(split.tasks, [&](Index t) {
    if (const Index count = split.rows(t)) f(split.first(t), count);
  });
}

// Runs f(b, c, seg, scratch) for every segment; `buffers` scratch rows of S floats per task when
// `need_scratch`. The tasks: for_item_ranges'. `stream`: the kernels stream their outputs; the stores are
// fenced at the end of each task.
template <typename F>
void for_segments(const Plan& p, int buffers, bool need_scratch, F&& f, bool stream = false) {
  for_item_ranges(p.segments(), p.S, [&](Index begin, Index count) {
    std::vector<float> scratch(need_scratch ? static_cast<std::size_t>(buffers * p.S) : 0);
    const Index end = begin + count;
    Index b = begin / p.C, c = begin % p.C;
    for (Index s = begin; s < end; ++s) {
      f(b, c, s, scratch.data());
      if (++c == p.C) {
        c = 0;
        ++b;
      }
    }
    if (stream) kernels::channel_kernels().fence();
  });
}

bool needs_gather(const Operand& o, const Plan& p) {
  return !o.s_contiguous || (p.masked() && !p.time_leading);
}

}  // namespace

bool stream_output(const Plan& p) {
  if (p.grouping != Grouping::kBatch && p.S > 16 &&
      !kernels::stream_rows_of(p.S, kernels::machine_row_tuning()))
    return false;
  return kernels::stream_output_bytes(p.segments() * p.S * Index{sizeof(float)});
}

Plan make_plan(const Dims& x_shape, int channel_axis, Grouping grouping, Index groups,
               std::span<const Index> lengths, int time_axis, const char* op) {
  Plan p;
  p.op = op;
  p.grouping = grouping;
  p.rank = x_shape.size();
  NL_CHECK(p.rank >= 1, "{}: x must have rank ≥ 1, got a rank-0 tensor", op);
  NL_CHECK(channel_axis >= -p.rank && channel_axis < p.rank,
           "{}: channel_axis {} is out of range for x of shape {} (valid: {}..{})", op, channel_axis,
           x_shape.str(), -p.rank, p.rank - 1);
  p.channel_axis = channel_axis < 0 ? channel_axis + p.rank : channel_axis;
  NL_CHECK(x_shape.product() > 0, "{}: x is empty (shape {})", op, x_shape.str());
  for (int d = 0; d < p.rank; ++d) {
    if (d < p.channel_axis) {
      p.b_axes.push_back(d);
      p.b_shape.push_back(x_shape[d]);
      p.B *= x_shape[d];
    } else if (d > p.channel_axis) {
      p.s_axes.push_back(d);
      p.s_shape.push_back(x_shape[d]);
      p.S *= x_shape[d];
    }
  }
  p.C = x_shape[p.channel_axis];
  if (grouping == Grouping::kGroup) {
    NL_CHECK(groups >= 1, "{}: groups must be ≥ 1, got {}", op, groups);
    NL_CHECK(p.C % groups == 0,
             "{}: groups = {} does not divide the number of channels C = {} (x of shape {})", op, groups, p.C,
             x_shape.str());
    p.G = groups;
    p.cpg = p.C / groups;
  }
  p.groups = grouping == Grouping::kBatch ? p.C : grouping == Grouping::kInstance ? p.B * p.C : p.B * p.G;
  if (!lengths.empty()) {
    NL_CHECK(time_axis >= -p.rank && time_axis < p.rank,
             "{}: time_axis {} is out of range for x of shape {} (valid: {}..{})", op, time_axis,
             x_shape.str(), -p.rank, p.rank - 1);
    const int ta = time_axis < 0 ? time_axis + p.rank : time_axis;
    NL_CHECK(ta > p.channel_axis, "{}: time_axis {} must come after the channel axis {} (x of shape {})", op,
             ta, p.channel_axis, x_shape.str());
    NL_CHECK(static_cast<Index>(lengths.size()) == p.B,
             "{}: {} lengths given but x of shape {} has {} batch items (the axes before channel axis {})",
             op, lengths.size(), x_shape.str(), p.B, p.channel_axis);
    p.time = ta - p.channel_axis - 1;
    p.T = x_shape[ta];
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      NL_CHECK(lengths[i] >= 0, "{}: lengths[{}] = {} is negative", op, i, lengths[i]);
      NL_CHECK(lengths[i] <= p.T, "{}: lengths[{}] = {} exceeds the size {} of the time axis {}", op, i,
               lengths[i], p.T, ta);
    }
    p.len.assign(lengths.begin(), lengths.end());
    p.time_leading = true;
    for (int j = 0; j < p.time; ++j)
      if (p.s_shape[j] != 1) p.time_leading = false;
  }
  return p;
}

Dims stats_shape(const Plan& p) {
  if (p.grouping == Grouping::kBatch) return Dims{p.C};
  Dims s = p.b_shape;
  s.push_back(p.grouping == Grouping::kInstance ? p.C : p.G);
  return s;
}

namespace {

// Segments per statistic group: 1 (kInstance), channels per group (kGroup); kBatch's groups span the batch.
Index segments_per_group(const Plan& p) {
  return p.grouping == Grouping::kGroup ? p.cpg : 1;
}

// Calls f(b, c) for the segments of statistic group g in segment order (b major, c minor): channel g of
// every batch item (kBatch), or the group's channels of its batch item (kInstance, kGroup; Plan::group_of).
template <typename F>
void for_group_segments(const Plan& p, Index g, F&& f) {
  if (p.grouping == Grouping::kBatch) {
    for (Index b = 0; b < p.B; ++b) f(b, g);
    return;
  }
  const Index spg = segments_per_group(p), per_batch = p.C / spg;
  const Index b = g / per_batch, c0 = (g % per_batch) * spg;
  for (Index c = c0; c < c0 + spg; ++c) f(b, c);
}

// Group g's element count: Σ n_s over its segments (integers, so their sum in double is exact in any
// order below 2^53: unmasked it is the product, without a pass over the segments).
double group_count(const Plan& p, Index g) {
  if (!p.masked())
    return static_cast<double>((p.grouping == Grouping::kBatch ? p.B : segments_per_group(p)) * p.S);
  double n = 0.0;
  for_group_segments(p, g, [&](Index b, Index) { n += static_cast<double>(p.valid(b)); });
  return n;
}

}  // namespace

std::vector<double> group_counts(const Plan& p) {
  std::vector<double> n(static_cast<std::size_t>(p.groups));
  if (p.grouping == Grouping::kBatch) {  // every channel has the same count
    std::fill(n.begin(), n.end(), group_count(p, 0));
    return n;
  }
  for (Index g = 0; g < p.groups; ++g) n[static_cast<std::size_t>(g)] = group_count(p, g);
  return n;
}

namespace {

// The per-segment statistics (kernels::SegmentStats) of one pass, as arrays of B·C doubles (entry s
// written by kernels::put).
using SegmentArrays = kernels::SegmentColumns;

// One group's moments (channel_norm.h's Moments).
struct GroupMoments {
  double count = 0, mean = 0, var = 0;
};

// Group g's moments from its segments' statistics in st (Σx, mean_s = Σx/n_s, M2_s; see channel_norm.h),
// combined in segment order (for_group_segments; empty segments hold zeros). Every pass forms a group's
// moments here, so the bits do not depend on the pass (separate, blocked, or group by group).
GroupMoments combine_group(const Plan& p, Index g, const SegmentArrays& st) {
  GroupMoments m;
  m.count = group_count(p, g);
  for_group_segments(p, g, [&](Index b, Index c) { m.mean += st.sum[b * p.C + c]; });
  m.mean = m.count > 0 ? m.mean / m.count : 0.0;
  for_group_segments(p, g, [&](Index b, Index c) {
    const double ns = static_cast<double>(p.valid(b));
    if (ns == 0) return;
    const Index s = b * p.C + c;
    const double d = st.mean[s] - m.mean;
    m.var += st.m2[s] + ns * d * d;
  });
  m.var = m.count > 0 ? m.var / m.count : 0.0;
  return m;
}

// Moments with `groups` entries of 0.
Moments sized_moments(Index groups) {
  Moments m;
  const std::size_t n = static_cast<std::size_t>(groups);
  m.count.assign(n, 0.0);
  m.mean.assign(n, 0.0);
  m.var.assign(n, 0.0);
  return m;
}
// m's vectors and rstd sized to `groups` entries for a forward that writes every entry of each (the
// caller's vectors, reused from call to call, are not zeroed first: at GroupNorm of [4096, 1024] that was
// 4 MiB of stores per call).
void size_for_forward(Moments& m, std::vector<double>& rstd, Index groups) {
  const std::size_t n = static_cast<std::size_t>(groups);
  m.count.resize(n);
  m.mean.resize(n);
  m.var.resize(n);
  rstd.resize(n);
}
void store(Moments& m, Index g, const GroupMoments& gm) {
  const std::size_t i = static_cast<std::size_t>(g);
  m.count[i] = gm.count;
  m.mean[i] = gm.mean;
  m.var[i] = gm.var;
}

// Every group's moments (combine_group).
Moments combine_moments(const Plan& p, const SegmentArrays& st) {
  Moments m = sized_moments(p.groups);
  for (Index g = 0; g < p.groups; ++g) store(m, g, combine_group(p, g, st));
  return m;
}

// One row's terms added to the channels' dγ and dβ sums: sw[c] += tw[c], sb[c] += tb[c] for c in [0, n)
// (param_grad_sums row by row; the sample-rows backward as its rows go: one loop for both).
void add_row_terms(double* sw, double* sb, const double* tw, const double* tb, Index n) {
  for (Index c = 0; c < n; ++c) {
    sw[c] += tw[c];
    sb[c] += tb[c];
  }
}

// Per-segment statistics of the calling thread, reused from call to call (a pass over a large tensor
// would otherwise allocate, fault in and zero B·C entries every time). Entry s is written by the task
// that owns segment s.
SegmentArrays segment_workspace(const Plan& p) {
  thread_local std::vector<double> ws;
  const std::size_t n = static_cast<std::size_t>(p.segments());
  if (ws.size() < 5 * n) ws.resize(5 * n);
  double* d = ws.data();
  return {d, d + n, d + 2 * n, d + 3 * n, d + 4 * n};
}

}  // namespace

namespace {

// A segment's Σdy·x̂ in its group (mean, rstd) from the segment's own mean_s, Σdy·(x − mean_s) and Σdy:
// rstd·(Σdy·(x − mean_s) + (mean_s − mean)·Σdy).
double segment_sdyxh(double rstd, double sdyd, double mean_s, double mean, double sdy) {
  return rstd * (sdyd + (mean_s - mean) * sdy);
}

// A group's mean(g) and mean(g·x̂) of a training backward (GradStats in channel_norm.h).
struct GroupGrads {
  double mg = 0, mgx = 0;
};

// Group g's GroupGrads from its segments' Σdy, Σdy·(x − mean_s) and mean_s in st and its moments m and
// rstd, in segment order (for_group_segments); f(b, c, s, sdyxh) receives each segment's Σdy·x̂ (0 for an
// empty segment). Every training backward forms them here (separate, blocked, or group by group).
template <typename F>
GroupGrads group_grads(const Plan& p, Index g, const SegmentArrays& st, const GroupMoments& m, double rstd,
                       const float* w, F&& f) {
  GroupGrads r;
  for_group_segments(p, g, [&](Index b, Index c) {
    const Index s = b * p.C + c;
    const double sdy = st.sdy[s];
    const double sdyxh = p.valid(b) == 0 ? 0.0 : segment_sdyxh(rstd, st.sdyd[s], st.mean[s], m.mean, sdy);
    const double wc = w ? static_cast<double>(w[c]) : 1.0;
    r.mg += wc * sdy;
    r.mgx += wc * sdyxh;
    f(b, c, s, sdyxh);
  });
  r.mg = m.count > 0 ? r.mg / m.count : 0.0;
  r.mgx = m.count > 0 ? r.mgx / m.count : 0.0;
  return r;
}

// The fp32 constants of the elementwise kernels for channel c of a group with these statistics, as every
// pass forms them (w, b may be null: γ = 1, β = 0). normalize: y = ((x − m_hi) − m_lo)·float(rstd·γ_c) + β_c.
float normalize_scale(double rstd, const float* w, Index c) {
  return static_cast<float>(rstd * (w ? static_cast<double>(w[c]) : 1.0));
}
kernels::NormalizeConsts normalize_consts(double mean, double rstd, const float* w, const float* b, Index c) {
  kernels::NormalizeConsts t;
  const kernels::MeanSplit m = kernels::split_mean(mean);
  t.mh = m.hi;
  t.ml = m.lo;
  t.s = normalize_scale(rstd, w, c);
  t.b = b ? b[c] : 0.0f;
  return t;
}
// input_grad: dx = r·((dy·γ_c − float(mean_g)) − ((x − m_hi) − m_lo)·float(rstd·mean_gx)), r = float(rstd).
kernels::InputGradConsts input_grad_consts(double mean, double rstd, const float* w, Index c, double mean_g,
                                           double mean_gx) {
  kernels::InputGradConsts t;
  const kernels::MeanSplit m = kernels::split_mean(mean);
  t.mh = m.hi;
  t.ml = m.lo;
  t.r = static_cast<float>(rstd);
  t.w = w ? w[c] : 1.0f;
  t.c0 = static_cast<float>(mean_g);
  t.c2 = static_cast<float>(rstd * mean_gx);
  return t;
}

// Per-channel arrays for the kernels: C entries padded to a multiple of kernels::kRowsPad.
Index rows_padded(Index c) {
  return (c + kernels::kRowsPad - 1) / kernels::kRowsPad * kernels::kRowsPad;
}

// normalize_consts / input_grad_consts of every channel as the channel-rows kernels take them (arrays
// padded to kRowsPad).
struct RowsNormalize {
  std::vector<float> mh, ml, s, b;
  std::size_t nc;  // channels (the arrays' entries past nc are padding)
  explicit RowsNormalize(Index C)
      : mh(static_cast<std::size_t>(rows_padded(C))),
        ml(mh.size()),
        s(mh.size()),
        b(mh.size()),
        nc(static_cast<std::size_t>(C)) {}
  void set(Index c, const kernels::NormalizeConsts& t) {
    const std::size_t i = static_cast<std::size_t>(c);
    mh[i] = t.mh, ml[i] = t.ml, s[i] = t.s, b[i] = t.b;
  }
  // normalize_consts' b of every channel (it depends on nothing else).
  void set_bias(const float* bias) {
    for (std::size_t c = 0; c < nc; ++c) b[c] = bias ? bias[c] : 0.0f;
  }
  kernels::RowNormalizeConsts at(Index c0) const {
    const std::size_t i = static_cast<std::size_t>(c0);
    return {mh.data() + i, ml.data() + i, s.data() + i, b.data() + i};
  }
};
struct RowsInputGrad {
  std::vector<float> mh, ml, r, w, c0, c2;
  std::size_t nc;  // channels (the arrays' entries past nc are padding)
  explicit RowsInputGrad(Index C)
      : mh(static_cast<std::size_t>(rows_padded(C))),
        ml(mh.size()),
        r(mh.size()),
        w(mh.size()),
        c0(mh.size()),
        c2(mh.size()),
        nc(static_cast<std::size_t>(C)) {}
  void set(Index c, const kernels::InputGradConsts& t) {
    const std::size_t i = static_cast<std::size_t>(c);
    mh[i] = t.mh, ml[i] = t.ml, r[i] = t.r, w[i] = t.w, c0[i] = t.c0, c2[i] = t.c2;
  }
  // input_grad_consts' w of every channel (it depends on nothing else).
  void set_weight(const float* weight) {
    for (std::size_t c = 0; c < nc; ++c) w[c] = weight ? weight[c] : 1.0f;
  }
  kernels::RowInputGradConsts at(Index c) const {
    const std::size_t i = static_cast<std::size_t>(c);
    return {mh.data() + i, ml.data() + i, r.data() + i, w.data() + i, c0.data() + i, c2.data() + i};
  }
  // The arrays but w from channel 0, for single_input_grad_consts.
  kernels::InputGradOut out() { return {mh.data(), ml.data(), r.data(), c0.data(), c2.data()}; }
};

}  // namespace

// ---- BatchNorm on channel rows ----------------------------------------------------------------------
//
// When every segment is a single element (S = 1: the channel axis last, e.g. [N, T, C] or [N, C]) and the
// channels are consecutive floats in every operand, x is rows of C channels, row b at b_off[b]. The
// per-segment passes would then run one kernel call per element; the channel-rows kernels
// (channel_kernels.h) instead sweep the rows once per pass, vectorized over the channels, each channel's
// sums in b order from 0.0: Σx, then Σ(x − mean)² (the moments), and Σdy, Σdy·x̂ and their γ-weighted
// sums (the backward's). For one element SegmentStats gives sum = mean = x, m2 = 0, sdy = dy, sdyd = 0,
// so these are combine_group's and group_grads' operations on the segment path's values, and the bits
// are the segment path's. Threads take blocks of channels (whole rows' lines apart), never split a sum.

namespace {

// BatchNorm whose segments are single elements (S = 1, unmasked): channel rows where the channels are
// consecutive floats.
bool single_element_segments(const Plan& p) {
  return p.grouping == Grouping::kBatch && !p.masked() && p.S == 1;
}
// Whether every operand's segments are S consecutive floats, one channel's after the other's (channel
// stride S): a batch item's channels are one run of C·S floats.
bool consecutive_segments(const Plan& p, std::initializer_list<const Operand*> operands) {
  for (const Operand* o : operands)
    if (o->c_stride != p.S || !o->s_contiguous) return false;
  return true;
}
bool on_channel_rows(const Plan& p, std::initializer_list<const Operand*> operands) {
  return single_element_segments(p) && consecutive_segments(p, operands);
}

// Runs f(c0, nc) over blocks of channels in parallel: one block per thread, of at least 64 channels (a
// row's whole cache lines per thread) and a multiple of kRowsPad; a function of C and the thread count
// only, and no sum is split, so the bits do not depend on it.
template <typename F>
void for_channel_blocks(const Plan& p, bool stream, F&& f) {
  const Index blocks = std::clamp<Index>(p.C / 64, 1, std::max(1, normlab::num_threads()));
  const Index per = rows_padded((p.C + blocks - 1) / blocks);
  parallel::parallel_for((p.C + per - 1) / per, [&](Index i) {
    f(i * per, std::min(p.C, (i + 1) * per) - i * per);
    if (stream) kernels::channel_kernels().fence();
  });
}

// The rows of the operands at channel c0 (x, dy inputs, out the output; any may be null).
kernels::ChannelRows channel_rows_at(const Plan& p, Index c0, Index nc, const Operand* x, const Operand* dy,
                                     const Operand* out) {
  kernels::ChannelRows a;
  if (x) {
    a.x = reinterpret_cast<const float*>(x->base) + c0;
    a.xo = x->b_off.data();
  }
  if (dy) {
    a.dy = reinterpret_cast<const float*>(dy->base) + c0;
    a.dyo = dy->b_off.data();
  }
  if (out) {
    a.out = reinterpret_cast<float*>(out->base) + c0;
    a.oo = out->b_off.data();
  }
  a.rows = p.B;
  a.nc = nc;
  return a;
}

// The moments (as combine_group forms them) on channel rows. Each block's accumulators are its own (the
// kernels store them every row: shared lines between two threads' blocks would bounce).
Moments rows_moments(const Plan& p, const Operand& xo) {
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  Moments m = sized_moments(p.groups);
  m.count = group_counts(p);
  for_channel_blocks(p, false, [&](Index c0, Index nc) {
    const kernels::ChannelRows a = channel_rows_at(p, c0, nc, &xo, nullptr, nullptr);
    std::vector<double> acc(static_cast<std::size_t>(rows_padded(nc))), mean(acc.size(), 0.0);
    k.rows_sum(acc.data(), a);
    for (Index c = 0; c < nc; ++c) {
      const std::size_t i = static_cast<std::size_t>(c0 + c), j = static_cast<std::size_t>(c);
      mean[j] = m.mean[i] = m.count[i] > 0 ? acc[j] / m.count[i] : 0.0;
    }
    k.rows_sqdev(acc.data(), mean.data(), a);
    for (Index c = 0; c < nc; ++c) {
      const std::size_t i = static_cast<std::size_t>(c0 + c);
      m.var[i] = m.count[i] > 0 ? acc[static_cast<std::size_t>(c)] / m.count[i] : 0.0;
    }
  });
  return m;
}

// A per-channel double vector padded for the kernels (w: γ in double, or empty for none).
std::vector<double> rows_vector(const std::vector<double>& v, Index C) {
  std::vector<double> r(static_cast<std::size_t>(rows_padded(C)), 0.0);
  std::copy(v.begin(), v.end(), r.begin());
  return r;
}

// The backward's per-channel sums on channel rows from the group statistics (mean, rstd): ChannelSums,
// Σ_b γ_c·Σdy and Σ_b γ_c·Σdy·x̂ (as group_grads adds them) only when `weighted`.
ChannelSums rows_grad_sums(const Plan& p, const Operand& xo, const Operand& dyo,
                           const std::vector<double>& mean, const std::vector<double>& rstd, const float* w,
                           bool weighted) {
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  const std::size_t np = static_cast<std::size_t>(rows_padded(p.C)), nc = static_cast<std::size_t>(p.C);
  const std::vector<double> mp = rows_vector(mean, p.C), rp = rows_vector(rstd, p.C);
  std::vector<double> wp;
  if (w) {
    wp.assign(np, 0.0);
    for (Index c = 0; c < p.C; ++c) wp[static_cast<std::size_t>(c)] = static_cast<double>(w[c]);
  }
  ChannelSums r;
  r.dweight.assign(nc, 0.0);
  r.dbias.assign(nc, 0.0);
  if (weighted) {
    r.wdy.assign(nc, 0.0);
    r.wdyxh.assign(nc, 0.0);
  }
  for_channel_blocks(p, false, [&](Index c0, Index n) {
    // The block's own accumulators (as in rows_moments), copied out at the end.
    const std::size_t nb = static_cast<std::size_t>(rows_padded(n));
    std::vector<double> acc((weighted ? 4 : 2) * nb);
    kernels::RowGradSums g;
    g.dw = acc.data();
    g.db = acc.data() + nb;
    if (weighted) {
      g.mg = acc.data() + 2 * nb;
      g.mgx = acc.data() + 3 * nb;
    }
    k.rows_grads(g, mp.data() + c0, rp.data() + c0, w ? wp.data() + c0 : nullptr,
                 channel_rows_at(p, c0, n, &xo, &dyo, nullptr));
    for (std::size_t c = 0; c < static_cast<std::size_t>(n); ++c) {
      const std::size_t i = static_cast<std::size_t>(c0) + c;
      r.dweight[i] = g.dw[c];
      r.dbias[i] = g.db[c];
      if (weighted) {
        r.wdy[i] = g.mg[c];
        r.wdyxh[i] = g.mgx[c];
      }
    }
  });
  return r;
}

}  // namespace

bool channel_rows(const Plan& p, std::initializer_list<ConstView> operands) {
  if (!single_element_segments(p)) return false;
  for (const ConstView& v : operands)  // (the channel strides alone: no operand's offsets needed)
    if (v.stride(p.channel_axis) != 1) return false;
  return true;
}

ChannelSums channel_grad_sums(const Plan& p, ConstView dy, ConstView x, const std::vector<double>& mean,
                              const std::vector<double>& rstd, const float* w, bool weighted) {
  return rows_grad_sums(p, operand(x, p), operand(dy, p), mean, rstd, w, weighted);
}

Moments moments(const Plan& p, ConstView x) {
  const Operand xo = operand(x, p);
  if (on_channel_rows(p, {&xo})) return rows_moments(p, xo);
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  const SegmentArrays st = segment_workspace(p);
  for_segments(p, 1, needs_gather(xo, p), [&](Index b, Index c, Index s, float* scratch) {
    const Index n = p.valid(b);
    kernels::SegmentStats t;
    if (n) k.segment_stats(&t, seg_in(xo, p, b, c, scratch), nullptr, n, kernels::StatsPrefetch{});
    st.sum[s] = t.sum;  // (no Σdy terms in a forward)
    st.mean[s] = t.mean;
    st.m2[s] = t.m2;
  });
  return combine_moments(p, st);
}

GradStats grad_stats(const Plan& p, ConstView dy, ConstView x, double eps, const float* w) {
  const Operand xo = operand(x, p), dyo = operand(dy, p);
  if (on_channel_rows(p, {&xo, &dyo})) {
    GradStats r;
    r.m = rows_moments(p, xo);
    r.rstd.resize(r.m.var.size());
    for (std::size_t c = 0; c < r.rstd.size(); ++c) r.rstd[c] = group_rstd(r.m.count[c], r.m.var[c], eps);
    ChannelSums cs = rows_grad_sums(p, xo, dyo, r.m.mean, r.rstd, w, true);
    r.dweight = std::move(cs.dweight);
    r.dbias = std::move(cs.dbias);
    r.mg.resize(r.rstd.size());
    r.mgx.resize(r.rstd.size());
    for (std::size_t c = 0; c < r.mg.size(); ++c) {  // as group_grads
      r.mg[c] = r.m.count[c] > 0 ? cs.wdy[c] / r.m.count[c] : 0.0;
      r.mgx[c] = r.m.count[c] > 0 ? cs.wdyxh[c] / r.m.count[c] : 0.0;
    }
    return r;
  }
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  const SegmentArrays st = segment_workspace(p);
  for_segments(p, 2, needs_gather(xo, p) || needs_gather(dyo, p),
               [&](Index b, Index c, Index s, float* scratch) {
                 const Index n = p.valid(b);
                 kernels::SegmentStats t;
                 if (n)
                   k.segment_stats(&t, seg_in(xo, p, b, c, scratch), seg_in(dyo, p, b, c, scratch + p.S), n,
                                   kernels::StatsPrefetch{});
                 kernels::put(st, s, t);
               });
  GradStats r;
  r.m = sized_moments(p.groups);
  const std::size_t ng = static_cast<std::size_t>(p.groups), nc = static_cast<std::size_t>(p.C);
  r.rstd.assign(ng, 0.0);
  r.mg.assign(ng, 0.0);
  r.mgx.assign(ng, 0.0);
  r.dweight.assign(nc, 0.0);
  r.dbias.assign(nc, 0.0);
  // Group by group; a channel's Σ_b Σdy·x̂ and Σ_b Σdy in b order whatever the grouping (kBatch: a group's
  // segments are its channel's, in b order; per sample: groups in b order).
  for (Index g = 0; g < p.groups; ++g) {
    const GroupMoments gm = combine_group(p, g, st);
    const std::size_t gi = static_cast<std::size_t>(g);
    store(r.m, g, gm);
    r.rstd[gi] = group_rstd(gm.count, gm.var, eps);
    const GroupGrads gg =
        group_grads(p, g, st, gm, r.rstd[gi], w, [&](Index, Index c, Index s, double sdyxh) {
          r.dweight[static_cast<std::size_t>(c)] += sdyxh;
          r.dbias[static_cast<std::size_t>(c)] += st.sdy[s];
        });
    r.mg[gi] = gg.mg;
    r.mgx[gi] = gg.mgx;
  }
  return r;
}

namespace {

// One segment of normalize (scratch: 2 rows of S floats).
void normalize_seg(const kernels::ChannelKernels& k, const Plan& p, const Operand& yo, const Operand& xo,
                   Index bi, Index c, double mean, double rstd, const float* w, const float* b,
                   float* scratch, bool stream) {
  const Index n = p.valid(bi);
  float* out = seg_out(yo, p, bi, c, scratch + p.S);
  if (n)
    k.normalize(out, seg_in(xo, p, bi, c, scratch), n, normalize_consts(mean, rstd, w, b, c),
                stream && direct(yo, p, bi));
  seg_finish(yo, p, bi, c, out);
}

// One segment of input_grad (scratch: 3 rows of S floats).
void input_grad_seg(const kernels::ChannelKernels& k, const Plan& p, const Operand& dxo, const Operand& dyo,
                    const Operand& xo, Index b, Index c, double mean, double rstd, const float* w,
                    double mean_g, double mean_gx, float* scratch, bool stream) {
  const Index n = p.valid(b);
  float* out = seg_out(dxo, p, b, c, scratch + 2 * p.S);
  if (n)
    k.input_grad(out, seg_in(dyo, p, b, c, scratch + p.S), seg_in(xo, p, b, c, scratch), n,
                 input_grad_consts(mean, rstd, w, c, mean_g, mean_gx), stream && direct(dxo, p, b));
  seg_finish(dxo, p, b, c, out);
}

}  // namespace

void normalize(const Plan& p, View y, ConstView x, const std::vector<double>& mean,
               const std::vector<double>& rstd, const float* w, const float* b) {
  const Operand xo = operand(x, p), yo = operand(y, p);
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  const bool stream = stream_output(p);
  if (on_channel_rows(p, {&xo, &yo})) {
    RowsNormalize kc(p.C);
    for (Index c = 0; c < p.C; ++c)
      kc.set(c,
             normalize_consts(mean[static_cast<std::size_t>(c)], rstd[static_cast<std::size_t>(c)], w, b, c));
    for_channel_blocks(p, stream, [&](Index c0, Index nc) {
      k.rows_normalize(kc.at(c0), channel_rows_at(p, c0, nc, &xo, nullptr, &yo), stream);
    });
    return;
  }
  if (p.grouping == Grouping::kBatch && !p.masked() && xo.s_contiguous && yo.s_contiguous) {
    // Every segment is S consecutive floats in x and y: the constants once per channel (as
    // normalize_seg forms them), then the kernel alone per segment.
    std::vector<kernels::NormalizeConsts> kc(static_cast<std::size_t>(p.C));
    for (Index c = 0; c < p.C; ++c) {
      const std::size_t g = static_cast<std::size_t>(c);
      kc[g] = normalize_consts(mean[g], rstd[g], w, b, c);
    }
    const float* xb = reinterpret_cast<const float*>(xo.base);
    float* yb = reinterpret_cast<float*>(yo.base);
    for_segments(
        p, 0, false,
        [&](Index bi, Index c, Index, float*) {
          k.normalize(yb + seg_offset(yo, p, bi, c), xb + seg_offset(xo, p, bi, c), p.S,
                      kc[static_cast<std::size_t>(c)], stream);
        },
        stream);
    return;
  }
  for_segments(
      p, 2, needs_gather(xo, p) || needs_gather(yo, p),
      [&](Index bi, Index c, Index, float* scratch) {
        const std::size_t g = static_cast<std::size_t>(p.group_of(bi, c));
        normalize_seg(k, p, yo, xo, bi, c, mean[g], rstd[g], w, b, scratch, stream);
      },
      stream);
}

void grad_sums(const Plan& p, ConstView dy, ConstView x, const std::vector<double>& mean,
               const std::vector<double>& rstd, std::vector<double>& sdy, std::vector<double>& sdyxh) {
  const Operand xo = operand(x, p), dyo = operand(dy, p);
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  sdy.assign(static_cast<std::size_t>(p.segments()), 0.0);
  sdyxh.assign(static_cast<std::size_t>(p.segments()), 0.0);
  for_segments(p, 2, needs_gather(xo, p) || needs_gather(dyo, p),
               [&](Index b, Index c, Index s, float* scratch) {
                 const Index n = p.valid(b);
                 if (!n) return;
                 const std::size_t g = static_cast<std::size_t>(p.group_of(b, c));
                 kernels::SegmentStats st;
                 k.segment_stats(&st, seg_in(xo, p, b, c, scratch), seg_in(dyo, p, b, c, scratch + p.S), n,
                                 kernels::StatsPrefetch{});
                 sdy[static_cast<std::size_t>(s)] = st.sdy;
                 sdyxh[static_cast<std::size_t>(s)] =
                     segment_sdyxh(rstd[g], st.sdyd, st.mean, mean[g], st.sdy);
               });
}

void input_grad(const Plan& p, View dx, ConstView dy, ConstView x, const std::vector<double>& mean,
                const std::vector<double>& rstd, const float* w, const std::vector<double>& mean_g,
                const std::vector<double>& mean_gx) {
  const Operand xo = operand(x, p), dyo = operand(dy, p), dxo = operand(dx, p);
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  const bool gather = needs_gather(xo, p) || needs_gather(dyo, p) || needs_gather(dxo, p);
  const bool stream = stream_output(p);
  if (on_channel_rows(p, {&xo, &dyo, &dxo})) {
    RowsInputGrad kc(p.C);
    for (Index c = 0; c < p.C; ++c) {
      const std::size_t g = static_cast<std::size_t>(c);
      kc.set(c, input_grad_consts(mean[g], rstd[g], w, c, mean_g[g], mean_gx[g]));
    }
    for_channel_blocks(p, stream, [&](Index c0, Index nc) {
      k.rows_input_grad(kc.at(c0), channel_rows_at(p, c0, nc, &xo, &dyo, &dxo), stream);
    });
    return;
  }
  if (p.grouping == Grouping::kBatch && !p.masked() && xo.s_contiguous && dyo.s_contiguous &&
      dxo.s_contiguous) {
    // Every segment is S consecutive floats in x, dy and dx: the constants once per channel (as
    // input_grad_seg forms them), then the kernel alone per segment.
    std::vector<kernels::InputGradConsts> kc(static_cast<std::size_t>(p.C));
    for (Index c = 0; c < p.C; ++c) {
      const std::size_t g = static_cast<std::size_t>(c);
      kc[g] = input_grad_consts(mean[g], rstd[g], w, c, mean_g[g], mean_gx[g]);
    }
    const float* xb = reinterpret_cast<const float*>(xo.base);
    const float* dyb = reinterpret_cast<const float*>(dyo.base);
    float* dxb = reinterpret_cast<float*>(dxo.base);
    for_segments(
        p, 0, false,
        [&](Index b, Index c, Index, float*) {
          k.input_grad(dxb + seg_offset(dxo, p, b, c), dyb + seg_offset(dyo, p, b, c),
                       xb + seg_offset(xo, p, b, c), p.S, kc[static_cast<std::size_t>(c)], stream);
        },
        stream);
    return;
  }
  for_segments(
      p, 3, gather,
      [&](Index b, Index c, Index, float* scratch) {
        const std::size_t g = static_cast<std::size_t>(p.group_of(b, c));
        input_grad_seg(k, p, dxo, dyo, xo, b, c, mean[g], rstd[g], w, mean_g[g], mean_gx[g], scratch, stream);
      },
      stream);
}

// ---- BatchNorm blocked over channels -------------------------------------------------------------

namespace {

// The block of channels [c0, c1).
struct Block {
  Index c0 = 0, c1 = 0;
};

// The statistics pass over the block's segments, batch item by batch item (the block's segments of one
// item are one run of memory when the channel stride is S); dy null in a forward. The kernel's prefetches
// follow the run to its end and then go on at the start of the next item's run, and past that run's end at
// the start of the item's after it: with runs shorter than the kernel's look-ahead (4 KiB), such as one
// channel of 400 floats, the look-ahead would otherwise land beyond the next run, in lines this block never
// reads, and leave the next run to the hardware (docs/PERFORMANCE.md, twenty-seventh session: the backward
// of [128, 128, 400], blocks of one channel, in 0.77-0.79 of the time).
// segment_mean (with dy; optional): each segment's mean (SavedBatch), so only its Σdy and Σdy·(x − mean).
void block_stats(const kernels::ChannelKernels& k, const Plan& p, const Block& bl, const Operand& xo,
                 const Operand* dyo, const SegmentArrays& st, const double* segment_mean = nullptr) {
  const float* xb = reinterpret_cast<const float*>(xo.base);
  const float* dyb = dyo ? reinterpret_cast<const float*>(dyo->base) : nullptr;
  const bool runs = xo.c_stride == p.S && (!dyo || dyo->c_stride == p.S);
  for (Index b = 0; b < p.B; ++b) {
    for (Index c = bl.c0; c < bl.c1; ++c) {
      // Then the next segment that is not the one following in memory: the next item's run, or when the
      // segments are not consecutive, simply the next segment.
      const bool last = c + 1 == bl.c1;
      const Index nb = runs || last ? b + 1 : b, nc = runs || last ? bl.c0 : c + 1;
      kernels::StatsPrefetch pf;
      pf.end = runs ? (bl.c1 - c) * p.S : p.S;
      if (nb < p.B) {
        pf.x_next = xb + seg_offset(xo, p, nb, nc);
        if (dyo) pf.dy_next = dyb + seg_offset(*dyo, p, nb, nc);
        // The items' runs after the next one, evenly spaced when one axis precedes the channel.
        if (runs && p.b_axes.size() == 1) {
          pf.run = (bl.c1 - bl.c0) * p.S;
          pf.runs = p.B - nb;
          pf.x_step = xo.b_strides[0];
          if (dyo) pf.dy_step = dyo->b_strides[0];
        }
      }
      kernels::SegmentStats t;  // zeros for an empty segment (a batch item of length 0), as the passes
      const Index s = b * p.C + c;
      if (const Index n = p.valid(b)) {
        const float* xs = xb + seg_offset(xo, p, b, c);
        const float* dys = dyo ? dyb + seg_offset(*dyo, p, b, c) : nullptr;
        if (segment_mean && dys)
          k.segment_grad_stats(&t, xs, dys, n, segment_mean[s], pf);
        else
          k.segment_stats(&t, xs, dys, n, pf);
      }
      kernels::put(st, s, t);
    }
  }
}

// Runs f(block) for blocks of at most kc channels, in parallel; fences streamed stores. for_item_ranges over
// the channels, kc at most per task: a range of channels per thread (sizes within one), each cut into
// blocks within one of each other. (Blocks of kc and a shorter last one left a thread up to a block more:
// at 2 threads, BatchNorm of [256, 64, 49] took its 64 channels forward in 7 blocks of up to 10, 40
// channels against 24.) Which thread runs a channel changes nothing in its arithmetic.
template <typename F>
void for_blocks(const Plan& p, Index kc, bool stream, F&& f) {
  for_item_ranges(
      p.C, p.B * p.S,
      [&](Index c0, Index nc) {
        f(Block{c0, c0 + nc});
        if (stream) kernels::channel_kernels().fence();
      },
      kc);
}

}  // namespace

Index block_channels(const Plan& p, int inputs, std::initializer_list<ConstView> operands) {
  // (Masked: only when each segment's real frames are its first valid(b) floats, the time axis leading.)
  if (p.grouping != Grouping::kBatch || (p.masked() && !p.time_leading)) return 0;
  for (const ConstView& v : operands)
    if (!operand(v, p).s_contiguous) return 0;
  if (channel_rows(p, operands)) return 0;  // the channel-rows passes
  const Index per_channel = p.B * p.S * Index{sizeof(float)} * inputs;
  // A quarter of L2: on the Intel Xeon of docs/PERFORMANCE.md's twenty-fifth session (2 MiB) the best blocks
  // of [64, 256, 400] were 300-600 KB (3 channels forward, 2-3 backward); a whole L2's half was slower.
  const Index budget = parallel::l2_cache_bytes() / 4;
  // A channel's inputs beyond the budget: nothing to keep in cache. The whole input within it: the
  // separate passes already read it from cache.
  if (per_channel > budget || p.C * per_channel <= budget) return 0;
  return std::max<Index>(1, budget / per_channel);
}

Moments batch_forward_blocked(const Plan& p, Index kc, View y, ConstView x, double eps, const float* w,
                              const float* b, std::vector<double>& rstd, std::vector<double>* segment_means) {
  const Operand xo = operand(x, p), yo = operand(y, p);
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  const bool stream = stream_output(p);
  const SegmentArrays st = segment_workspace(p);
  Moments m = sized_moments(p.groups);
  rstd.assign(m.count.size(), 0.0);
  const float* xb = reinterpret_cast<const float*>(xo.base);
  float* yb = reinterpret_cast<float*>(yo.base);
  for_blocks(p, kc, stream, [&](const Block& bl) {
    block_stats(k, p, bl, xo, nullptr, st);
    for (Index c = bl.c0; c < bl.c1; ++c) {
      const std::size_t g = static_cast<std::size_t>(c);
      const GroupMoments gm = combine_group(p, c, st);
      store(m, c, gm);
      rstd[g] = group_rstd(gm.count, gm.var, eps);
    }
    // The elementwise pass over the block, its inputs now in cache.
    for (Index c = bl.c0; c < bl.c1; ++c) {
      const std::size_t g = static_cast<std::size_t>(c);
      const kernels::NormalizeConsts kcst = normalize_consts(m.mean[g], rstd[g], w, b, c);
      for (Index bi = 0; bi < p.B; ++bi) {
        float* ys = yb + seg_offset(yo, p, bi, c);
        if (const Index n = p.valid(bi)) k.normalize(ys, xb + seg_offset(xo, p, bi, c), n, kcst, stream);
        seg_finish(yo, p, bi, c, ys);  // 0 at padded frames
      }
    }
  });
  if (segment_means) segment_means->assign(st.mean, st.mean + p.segments());
  return m;
}

GradStats batch_backward_blocked(const Plan& p, Index kc, View dx, ConstView dy, ConstView x, double eps,
                                 const float* w, const SavedBatch* saved) {
  const Operand xo = operand(x, p), dyo = operand(dy, p), dxo = operand(dx, p);
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  const bool stream = stream_output(p);
  const SegmentArrays st = segment_workspace(p);
  GradStats r;
  r.m = sized_moments(p.groups);
  const std::size_t nc = static_cast<std::size_t>(p.C);
  r.rstd.assign(nc, 0.0);
  r.mg.assign(nc, 0.0);
  r.mgx.assign(nc, 0.0);
  r.dweight.assign(nc, 0.0);
  r.dbias.assign(nc, 0.0);
  const float* xb = reinterpret_cast<const float*>(xo.base);
  const float* dyb = reinterpret_cast<const float*>(dyo.base);
  float* dxb = reinterpret_cast<float*>(dxo.base);
  for_blocks(p, kc, stream, [&](const Block& bl) {
    block_stats(k, p, bl, xo, &dyo, st, saved ? saved->segment_mean : nullptr);
    for (Index c = bl.c0; c < bl.c1; ++c) {
      const std::size_t g = static_cast<std::size_t>(c);
      // (The saved mean and rstd are combine_group's and group_rstd's values of the same segments.)
      const GroupMoments gm =
          saved ? GroupMoments{group_count(p, c), saved->mean[g], 0.0} : combine_group(p, c, st);
      store(r.m, c, gm);
      r.rstd[g] = saved ? saved->rstd[g] : group_rstd(gm.count, gm.var, eps);
      const GroupGrads gg = group_grads(p, c, st, gm, r.rstd[g], w, [&](Index, Index, Index s, double sdyxh) {
        r.dweight[g] += sdyxh;
        r.dbias[g] += st.sdy[s];
      });
      r.mg[g] = gg.mg;
      r.mgx[g] = gg.mgx;
      // The elementwise pass over the channel's segments, its inputs in cache.
      const kernels::InputGradConsts t = input_grad_consts(gm.mean, r.rstd[g], w, c, gg.mg, gg.mgx);
      for (Index b = 0; b < p.B; ++b) {
        float* dxs = dxb + seg_offset(dxo, p, b, c);
        if (const Index n = p.valid(b))
          k.input_grad(dxs, dyb + seg_offset(dyo, p, b, c), xb + seg_offset(xo, p, b, c), n, t, stream);
        seg_finish(dxo, p, b, c, dxs);  // 0 at padded frames
      }
    }
  });
  return r;
}

// ---- InstanceNorm / GroupNorm: group by group -----------------------------------------------------

namespace {

// Runs f(g, b, c0, spg, scratch) for every group of a per-sample grouping (group g = batch item b,
// channels c0 .. c0 + spg − 1, spg = segments_per_group); the tasks: for_item_ranges' over the groups.
template <typename F>
void for_groups(const Plan& p, int buffers, bool need_scratch, F&& f, bool stream) {
  const Index spg = segments_per_group(p), per_batch = p.C / spg;
  for_item_ranges(p.groups, p.S * spg, [&](Index begin, Index count) {
    std::vector<float> scratch(need_scratch ? static_cast<std::size_t>(buffers * p.S) : 0);
    const Index end = begin + count;
    for (Index g = begin; g < end; ++g) f(g, g / per_batch, (g % per_batch) * spg, spg, scratch.data());
    if (stream) kernels::channel_kernels().fence();
  });
}

// The statistics of the group's segments (batch item b, channels c0 .. c0 + spg − 1) into st, dy null in
// a forward; zeros for empty segments.
// mean (a backward's, with dy): the one segment's mean, known (segment_grad_stats).
void group_stats(const kernels::ChannelKernels& k, const Plan& p, const Operand& xo, const Operand* dyo,
                 Index b, Index c0, Index spg, const SegmentArrays& st, float* scratch,
                 const double* mean = nullptr) {
  const Index n = p.valid(b);
  for (Index c = c0; c < c0 + spg; ++c) {
    kernels::SegmentStats t;
    if (n && mean)
      k.segment_grad_stats(&t, seg_in(xo, p, b, c, scratch), seg_in(*dyo, p, b, c, scratch + p.S), n, *mean,
                           kernels::StatsPrefetch{});
    else if (n)
      k.segment_stats(&t, seg_in(xo, p, b, c, scratch), dyo ? seg_in(*dyo, p, b, c, scratch + p.S) : nullptr,
                      n, kernels::StatsPrefetch{});
    kernels::put(st, b * p.C + c, t);
  }
}

// ---- InstanceNorm and GroupNorm on sample rows ------------------------------------------------------
//
// With single-element segments (S = 1: GroupNorm or InstanceNorm of [N, C]) and the channels consecutive
// floats in every operand, each batch item is a row of C channels. The group-by-group passes would make two
// kernel calls per element (GroupNorm forward of [4096, 1024], 32 groups: 134 ms at 1 thread). Here the
// segments' statistics are formed exactly as the segment_stats kernel forms them for n = 1 and combined with
// combine_group's and group_grads' operations in their order (channel_kernels.h: the single_moments kernel,
// eight groups at a time in its lanes; for the backward single_grad_terms, vectorized over the row's
// channels, and group_means, eight groups at a time), and the elementwise pass is one channel-rows kernel
// call per row (rows_normalize, rows_input_grad) with every channel's constants as the segment path forms
// them (single_normalize_consts, spread_groups): the same bits. The forward's tasks are for_item_ranges'
// over the rows; the backward's, at 1 thread or with enough groups per row, shares of each row's groups
// over every row (sample_rows_backward).

bool on_sample_rows(const Plan& p, std::initializer_list<const Operand*> operands) {
  return p.grouping != Grouping::kBatch && !p.masked() && p.S == 1 && consecutive_segments(p, operands);
}

// Row b of the operands as the channel-rows kernels take it: channels c0 .. c0 + nc − 1 of one row, each
// operand at its offset entry in b_off (dy may be null).
kernels::ChannelRows sample_row(Index b, Index c0, Index nc, const Operand& x, const Operand* dy,
                                const Operand& out) {
  kernels::ChannelRows a;
  a.x = reinterpret_cast<const float*>(x.base) + c0;
  a.xo = x.b_off.data() + b;
  if (dy) {
    a.dy = reinterpret_cast<const float*>(dy->base) + c0;
    a.dyo = dy->b_off.data() + b;
  }
  a.out = reinterpret_cast<float*>(out.base) + c0;
  a.oo = out.b_off.data() + b;
  a.rows = 1;
  a.nc = nc;
  return a;
}

// Runs f(b0, b1) over the rows in for_item_ranges' tasks, fenced when streaming.
template <typename F>
void for_sample_rows(const Plan& p, bool stream, F&& f) {
  for_item_ranges(p.B, p.C, [&](Index b0, Index nb) {
    f(b0, b0 + nb);
    if (stream) kernels::channel_kernels().fence();
  });
}

// Per-task buffers of the sample-row passes: per-channel doubles padded to kRowsPad (the kernels write
// whole vectors): the groups' mean and rstd per channel, and the single-element gradient terms.
struct SampleRowBuffers {
  std::vector<double> gmean, grstd, sdy, sdyxh, wsdy, wsdyxh;
  explicit SampleRowBuffers(Index C) {
    for (auto* v : {&gmean, &grstd, &sdy, &sdyxh, &wsdy, &wsdyxh})
      v->resize(static_cast<std::size_t>(rows_padded(C)));
  }
};

// group_grads for the groups of one sample row (unmasked single-element segments: n_s = 1, each group
// spg consecutive channels, count = spg), from their mean and rstd (single_moments): the per-channel terms
// from the single_grad_terms kernel, each group's sums in group_grads' order from 0.0 by the group_means
// kernel: mg, mgx per group; each segment's Σdy and Σdy·x̂ into sdy, sdyxh (the row's entries) when
// given, else into buf.sdy, buf.sdyxh.
void row_grads(const kernels::ChannelKernels& k, const float* xr, const float* dyr, Index spg, Index groups,
               double count, const double* mean, const double* rstd, const float* w, double* mg, double* mgx,
               SampleRowBuffers& buf, double* sdy = nullptr, double* sdyxh = nullptr) {
  const Index C = spg * groups;
  k.spread_groupsd(buf.gmean.data(), mean, spg, groups);
  k.spread_groupsd(buf.grstd.data(), rstd, spg, groups);
  // Straight into sdy, sdyxh when given and the kernel's whole vectors end with the row.
  const bool direct = sdy && C % kernels::kRowsPad == 0;
  k.single_grad_terms(
      {direct ? sdy : buf.sdy.data(), direct ? sdyxh : buf.sdyxh.data(), buf.wsdy.data(), buf.wsdyxh.data()},
      xr, dyr, w, buf.gmean.data(), buf.grstd.data(), C);
  if (sdy && !direct) {
    std::copy_n(buf.sdy.data(), C, sdy);
    std::copy_n(buf.sdyxh.data(), C, sdyxh);
  }
  k.group_means(mg, buf.wsdy.data(), spg, groups, count);
  k.group_means(mgx, buf.wsdyxh.data(), spg, groups, count);
}

// per_sample_forward on sample rows.
void sample_rows_forward(const Plan& p, const Operand& yo, const Operand& xo, double eps, const float* w,
                         const float* b, Moments& m, std::vector<double>& rstd) {
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  const bool stream = stream_output(p);
  size_for_forward(m, rstd, p.groups);
  const Index spg = segments_per_group(p), per_row = p.C / spg;
  const double count = group_count(p, 0);  // every group's (unmasked)
  std::fill(m.count.begin(), m.count.end(), count);
  for_sample_rows(p, stream, [&](Index b0, Index b1) {
    RowsNormalize kc(p.C);
    kc.set_bias(b);
    for (Index bi = b0; bi < b1; ++bi) {
      const std::size_t g0 = static_cast<std::size_t>(bi * per_row);
      double* const mean = m.mean.data() + g0;
      double* const var = m.var.data() + g0;
      double* const r = rstd.data() + g0;
      k.single_moments(mean, var, r,
                       reinterpret_cast<const float*>(xo.base) + xo.b_off[static_cast<std::size_t>(bi)], spg,
                       per_row, count, eps);
      k.single_normalize_consts(kc.mh.data(), kc.ml.data(), kc.s.data(), mean, r, w, spg, per_row);
      k.rows_normalize(kc.at(0), sample_row(bi, 0, p.C, xo, nullptr, yo), stream);
    }
  });
}

// The backward of one sample row's groups g0 .. g0 + ng − 1 (channels c0 .. c0 + nc − 1): dx, and each
// segment's Σdy and Σdy·x̂ left in buf.sdy, buf.sdyxh (entries 0 .. nc − 1).
struct SampleRowsBackward {
  const kernels::ChannelKernels& k;
  const Plan& p;
  const Operand &dxo, &dyo, &xo;
  double eps, count;
  bool stream;
  Index spg, ng, c0, nc;
  const float* wc;  // γ of the share's channels (null: 1)
  RowsInputGrad kc;
  SampleRowBuffers buf;
  std::vector<double> t;  // mean, var, rstd, mg, mgx of the share's groups
  const SavedGroups* saved;  // the groups' mean and rstd when given (per_sample_backward)
  Index g0;                  // the share's first group in a row
  SampleRowsBackward(const Plan& p_, const Operand& dx, const Operand& dy, const Operand& x, double eps_,
                     const float* w, Index g0_, Index ng_, const SavedGroups* saved_)
      : k(kernels::channel_kernels()),
        p(p_),
        dxo(dx),
        dyo(dy),
        xo(x),
        eps(eps_),
        count(group_count(p_, 0)),  // every group's (unmasked)
        stream(stream_output(p_)),
        spg(segments_per_group(p_)),
        ng(ng_),
        c0(g0_ * spg),
        nc(ng_ * spg),
        wc(w ? w + c0 : nullptr),
        kc(nc),
        buf(nc),
        t(static_cast<std::size_t>(5 * ng)),
        saved(saved_),
        g0(g0_) {
    kc.set_weight(wc);
  }
  // sdy, sdyxh: where the segments' terms go (null: buf.sdy, buf.sdyxh).
  void row(Index bi, double* sdy = nullptr, double* sdyxh = nullptr) {
    double *mean = t.data(), *var = mean + ng, *r = var + ng, *mg = r + ng, *mgx = mg + ng;
    const std::size_t bs = static_cast<std::size_t>(bi);
    const float* xr = reinterpret_cast<const float*>(xo.base) + xo.b_off[bs] + c0;
    const float* dyr = reinterpret_cast<const float*>(dyo.base) + dyo.b_off[bs] + c0;
    if (saved) {  // single_moments' values, as the forward formed them
      const Index gi = bi * (p.C / spg) + g0;
      std::copy_n(saved->mean + gi, ng, mean);
      std::copy_n(saved->rstd + gi, ng, r);
    } else {
      k.single_moments(mean, var, r, xr, spg, ng, count, eps);
    }
    row_grads(k, xr, dyr, spg, ng, count, mean, r, wc, mg, mgx, buf, sdy, sdyxh);
    // Each group's input_grad_consts (but w, per channel) at its channels: set(c, input_grad_consts(...))'s
    // values for every channel c of the group.
    k.single_input_grad_consts(kc.out(), mean, r, mg, mgx, spg, ng);
    k.rows_input_grad(kc.at(0), sample_row(bi, c0, nc, xo, &dyo, dxo), stream);
  }
};

// The fewest groups in each thread's share of a sample row. Each group's sums are chains of dependent
// additions; a row's groups interleave them. GroupNorm backward of [16384, 256] at 2 threads: with 2 groups
// (one per share) 1.14× the time of whole rows per task, with 32 groups 0.8× (docs/PERFORMANCE.md,
// thirty-second session).
constexpr Index kMinShareGroups = 4;

// per_sample_backward on sample rows, with dγ and dβ per channel (sw, sb). At 1 thread, or with at least
// kMinShareGroups groups per row for each thread, each task takes a share of every row's groups over every
// row in b order and adds each row's terms to its channels' sums from 0.0 as the rows go: param_grad_sums'
// additions in its order, without the B·C arrays of segment terms (64 MiB for [4096, 1024], written and read
// back). Otherwise (e.g. one group) the tasks take ranges of rows (for_sample_rows), keep the terms in B·C
// arrays and param_grad_sums adds them. Either way each group's and channel's operations are the same, in
// the same order.
void sample_rows_backward(const Plan& p, const Operand& dxo, const Operand& dyo, const Operand& xo,
                          double eps, const float* w, std::vector<double>& sw, std::vector<double>& sb,
                          const SavedGroups* saved) {
  const Index per_row = p.C / segments_per_group(p);
  if (num_threads() == 1 || per_row >= kMinShareGroups * num_threads()) {
    sw.assign(static_cast<std::size_t>(p.C), 0.0);
    sb.assign(sw.size(), 0.0);
    const Index tasks = num_threads();
    parallel::parallel_for(tasks, [&](Index task) {
      const Index g0 = per_row * task / tasks;
      SampleRowsBackward s(p, dxo, dyo, xo, eps, w, g0, per_row * (task + 1) / tasks - g0, saved);
      double *tw = sw.data() + s.c0, *tb = sb.data() + s.c0;
      for (Index bi = 0; bi < p.B; ++bi) {
        s.row(bi);
        add_row_terms(tw, tb, s.buf.sdyxh.data(), s.buf.sdy.data(), s.nc);
      }
      if (s.stream) s.k.fence();
    });
    return;
  }
  thread_local std::vector<double> sdy, sdyxh;  // B·C each (reused, as the segment workspace)
  sdy.resize(static_cast<std::size_t>(p.segments()));
  sdyxh.resize(sdy.size());
  // (the calling thread's arrays: a thread_local named inside the tasks would be the worker's own)
  double *const ds = sdy.data(), *const dsx = sdyxh.data();
  for_sample_rows(p, stream_output(p), [&](Index b0, Index b1) {
    SampleRowsBackward s(p, dxo, dyo, xo, eps, w, 0, per_row, saved);
    for (Index bi = b0; bi < b1; ++bi) s.row(bi, ds + bi * p.C, dsx + bi * p.C);
  });
  param_grad_sums(p, sdy, sdyxh, sw, sb);
}

// ---- InstanceNorm and GroupNorm on sample runs ------------------------------------------------------
//
// With short segments (2 ≤ S ≤ kSampleRunsMaxS: GroupNorm or InstanceNorm of [N, C, H, W] with a small
// H·W) consecutive in every operand (channel stride S, each segment's S floats in order), a batch item's
// groups are one run of C·S floats. The group-by-group passes make two kernel calls per segment (GroupNorm
// of [8192, 256, 2], 32 groups: 74 ms forward at 1 thread where [64, 256, 256] takes 1.5). Here a run of
// consecutive groups of one item takes one segments_stats call (segment_stats' loop: the same values), the
// groups' moments and gradient sums are combine_group's and group_grads' operations with the run's groups
// eight at a time in vector lanes (the run_moments, run_grads kernels), and the elementwise pass is one
// segments_normalize / segments_input_grad call with each segment's constants as the segment path forms
// them: the same bits.
// Tasks: for_groups' (for_item_ranges over the groups).

// The longest segments taken on sample runs. GroupNorm of [N, 256, S] (4 Mi floats, 32 groups) at 1 thread
// took 0.68 / 0.71 of the group path's time at S = 2 (forward / backward), 0.71 / 0.76 at S = 8, 0.79 / 0.91
// at S = 32, 0.91 / 0.86 at S = 64, but 1.04 / 0.95 at S = 128 and 1.04 / 1.04 at S = 256, where the group
// path's per-segment calls cost little and each group's elementwise pass still finds its inputs in L1
// (docs/PERFORMANCE.md, thirty-first session).
constexpr Index kSampleRunsMaxS = 64;

bool on_sample_runs(const Plan& p, std::initializer_list<const Operand*> operands) {
  return p.grouping != Grouping::kBatch && !p.masked() && p.S >= 2 && p.S <= kSampleRunsMaxS &&
         consecutive_segments(p, operands);
}

// segments_stats' lane loads on this machine (channel_kernels.h, LaneLoads), decided once: gathers on Intel
// (the Xeon's choice, thirty-fifth session), the transpose on AMD (machine_cpu_kind, as for the row kernels'
// choices; NORMLAB_ROW_TUNING overrides both). Measured on the Zen 5 only; a Zen 4 is taken as AMD.
kernels::LaneLoads lane_loads() {
  static const kernels::LaneLoads loads = kernels::machine_cpu_kind() == kernels::CpuKind::kIntel
                                              ? kernels::LaneLoads::kGather
                                              : kernels::LaneLoads::kTranspose;
  return loads;
}

// A run of groups [g0, g1) of batch item b: channels c0 .. c1 − 1 (c1 − c0 segments of S floats, the first
// at offset c0·S of the item's row).
struct GroupRun {
  Index b, g0, g1, c0, c1;
};

// Runs f(run, task buffers) over the groups in for_groups' tasks, each task's groups split where a batch
// item ends; fenced when streaming. At 1 thread the runs go in order (b major).
template <typename Buffers, typename F>
void for_group_runs(const Plan& p, bool stream, F&& f) {
  const Index spg = segments_per_group(p), per_row = p.C / spg;
  for_item_ranges(p.groups, p.S * spg, [&](Index begin, Index ng) {
    thread_local Buffers buf;  // the calling thread's, reused from task to task and call to call
    buf.reserve(ng * spg, ng);
    const Index end = begin + ng;
    for (Index g0 = begin; g0 < end;) {
      const Index b = g0 / per_row, g1 = std::min(end, (b + 1) * per_row);
      f(GroupRun{b, g0, g1, (g0 - b * per_row) * spg, (g1 - b * per_row) * spg}, buf);
      g0 = g1;
    }
    if (stream) kernels::channel_kernels().fence();
  });
}

// Task buffers (at most a chunk's segments and groups; entry j for the run's segment j): the run's segment
// statistics (Σdy goes to the caller's B·C array; the others in the B·C segment workspace went out to
// memory: 24 or 32 bytes per segment, at S = 4 as much as x and y themselves), its segment constants
// (RowsNormalize or RowsInputGrad) and five doubles per group (the run's moments and sums). Each thread
// keeps its own from call to call (reserve grows them, never shrinks): allocated and zeroed per task they
// cost GroupNorm of [N, 256, S] 1-7 % more time at S = 2 .. 16 (memset and page faults; docs/PERFORMANCE.md,
// thirty-fourth session).
template <typename Consts>
struct RunBuffers {
  Consts kc{0};
  // st: the run's segment statistics (sum, mean, m2, sdyd) and the run's own Σdy and Σdy·x̂ columns
  std::vector<double> t, st;
  Index cap = 0;  // segments of room in each column of st
  void reserve(Index segments, Index groups) {
    if (static_cast<std::size_t>(segments) > kc.nc) kc = Consts(segments);
    if (t.size() < static_cast<std::size_t>(5 * groups)) t.resize(static_cast<std::size_t>(5 * groups));
    if (segments > cap) {
      st.resize(static_cast<std::size_t>(6 * segments));
      cap = segments;
    }
  }
  // The run's statistics columns, entry j for the run's segment j, with Σdy into sdy.
  kernels::SegmentColumns columns(double* sdy) {
    double* d = st.data();
    return {d, d + cap, d + 2 * cap, sdy, d + 3 * cap};
  }
  double* own_sdy() { return st.data() + 4 * cap; }
  double* own_sdyxh() { return st.data() + 5 * cap; }
};

// Operand o's pointer to segment (r.b, r.c0), the run's first.
template <typename T = float>
T* run_at(const Operand& o, const GroupRun& r) {
  return reinterpret_cast<T*>(o.base) + o.b_off[static_cast<std::size_t>(r.b)] + r.c0 * o.c_stride;
}

// The segment statistics of the run (x, and dy when not null) into st (entry j for the run's segment j),
// one segments_stats call.
void run_stats(const kernels::ChannelKernels& k, const Plan& p, const GroupRun& r, const Operand& xo,
               const Operand* dyo, const kernels::SegmentColumns& st) {
  k.segments_stats(st, run_at<const float>(xo, r), dyo ? run_at<const float>(*dyo, r) : nullptr, p.S,
                   r.c1 - r.c0, lane_loads());
}

// combine_group for the groups of a run (every segment unmasked, n_s = S) from its segment statistics st
// (entry j for the run's segment j): each group's operations in combine_group's order from 0.0, the run's
// groups eight at a time in the lanes of the run_moments kernel (independent chains, as single_moments
// for sample rows): the same values; with each group's group_rstd. One entry per group of the run in mean,
// var and rstd.
void run_moments(const kernels::ChannelKernels& k, const Plan& p, const GroupRun& r,
                 const kernels::SegmentColumns& st, double count, double eps, double* mean, double* var,
                 double* rstd) {
  k.run_moments(mean, var, rstd, st, segments_per_group(p), r.g1 - r.g0, static_cast<double>(p.S), count,
                eps);
}

// group_grads for the groups of a run likewise (each group's operations in group_grads' order from 0.0, the
// run_grads kernel): mg, mgx per group, each segment's Σdy·x̂ into sdyxh (entry j for the run's segment j).
void run_grads(const kernels::ChannelKernels& k, const Plan& p, const GroupRun& r,
               const kernels::SegmentColumns& st, double count, const double* mean, const double* rstd,
               const float* w, double* mg, double* mgx, double* sdyxh) {
  k.run_grads(mg, mgx, sdyxh, st, mean, rstd, w ? w + r.c0 : nullptr, segments_per_group(p), r.g1 - r.g0,
              count);
}

// per_sample_forward on sample runs.
void sample_runs_forward(const Plan& p, const Operand& yo, const Operand& xo, double eps, const float* w,
                         const float* b, Moments& m, std::vector<double>& rstd) {
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  const bool stream = stream_output(p);
  size_for_forward(m, rstd, p.groups);
  const Index spg = segments_per_group(p);
  const double count = group_count(p, 0);  // every group's (unmasked)
  using Buffers = RunBuffers<RowsNormalize>;
  for_group_runs<Buffers>(p, stream, [&](const GroupRun& r, Buffers& buf) {
    const kernels::SegmentColumns st = buf.columns(nullptr);
    run_stats(k, p, r, xo, nullptr, st);
    double *const mean = m.mean.data() + r.g0, *const var = m.var.data() + r.g0,
                  *const rs = rstd.data() + r.g0;
    run_moments(k, p, r, st, count, eps, mean, var, rs);
    const float* const wr = w ? w + r.c0 : nullptr;  // the run's channels' γ, β
    std::fill_n(m.count.begin() + r.g0, r.g1 - r.g0, count);
    // Each group's normalize_consts (but β) at its channels: set(c, normalize_consts(...))'s values for every
    // channel c of the group.
    k.single_normalize_consts(buf.kc.mh.data(), buf.kc.ml.data(), buf.kc.s.data(), mean, rs, wr, spg,
                              r.g1 - r.g0);
    for (Index j = 0; j < r.c1 - r.c0; ++j) buf.kc.b[static_cast<std::size_t>(j)] = b ? b[r.c0 + j] : 0.0f;
    k.segments_normalize(run_at(yo, r), run_at<const float>(xo, r), p.S, r.c1 - r.c0, buf.kc.at(0), stream);
  });
}

// The backward of one run: dx, each segment's Σdy into sdy and Σdy·x̂ into sdyxh (entry j for the run's
// segment j).
// With saved statistics (per_sample_backward) the run's groups' mean and rstd are taken from them, and with
// one segment per group the segments' statistics formed from those means (segments_grad_stats).
void run_backward(const kernels::ChannelKernels& k, const Plan& p, const GroupRun& r,
                  RunBuffers<RowsInputGrad>& buf, const Operand& dxo, const Operand& dyo, const Operand& xo,
                  double eps, const float* w, bool stream, double* sdy, double* sdyxh,
                  const SavedGroups* saved) {
  const Index spg = segments_per_group(p), ng = r.g1 - r.g0;
  const double count = group_count(p, 0);  // every group's (unmasked)
  const kernels::SegmentColumns st = buf.columns(sdy);
  double *mean = buf.t.data(), *var = mean + ng, *rs = var + ng, *mg = rs + ng, *mgx = mg + ng;
  const double *gmean = mean, *grstd = rs;
  if (saved) {
    gmean = saved->mean + r.g0;
    grstd = saved->rstd + r.g0;
    if (spg == 1)
      k.segments_grad_stats(st, run_at<const float>(xo, r), run_at<const float>(dyo, r), p.S, r.c1 - r.c0,
                            gmean, lane_loads());
    else
      run_stats(k, p, r, xo, &dyo, st);
  } else {
    run_stats(k, p, r, xo, &dyo, st);
    run_moments(k, p, r, st, count, eps, mean, var, rs);
  }
  run_grads(k, p, r, st, count, gmean, grstd, w, mg, mgx, sdyxh);
  const float* const wr = w ? w + r.c0 : nullptr;  // the run's channels' γ
  // Each group's input_grad_consts (but w, per channel) at its channels: set(c, input_grad_consts(...))'s
  // values for every channel c of the group.
  k.single_input_grad_consts(buf.kc.out(), gmean, grstd, mg, mgx, spg, ng);
  for (Index j = 0; j < r.c1 - r.c0; ++j) buf.kc.w[static_cast<std::size_t>(j)] = wr ? wr[j] : 1.0f;
  k.segments_input_grad(run_at(dxo, r), run_at<const float>(dyo, r), run_at<const float>(xo, r), p.S,
                        r.c1 - r.c0, buf.kc.at(0), stream);
}

// per_sample_backward on sample runs, its segment terms in B·C arrays (each segment's Σdy into sdy, Σdy·x̂
// into sdyxh), for param_grad_sums.
void sample_runs_backward(const Plan& p, const Operand& dxo, const Operand& dyo, const Operand& xo,
                          double eps, const float* w, std::vector<double>& sdy, std::vector<double>& sdyxh,
                          const SavedGroups* saved) {
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  const bool stream = stream_output(p);
  using Buffers = RunBuffers<RowsInputGrad>;
  for_group_runs<Buffers>(p, stream, [&](const GroupRun& r, Buffers& buf) {
    const Index s0 = r.b * p.C + r.c0;  // the run's first segment
    run_backward(k, p, r, buf, dxo, dyo, xo, eps, w, stream, sdy.data() + s0, sdyxh.data() + s0, saved);
  });
}

// per_sample_backward on sample runs at 1 thread, with dγ and dβ per channel (sw, sb), without B·C arrays:
// the runs of for_group_runs in b order, each run's Σdy·x̂ and Σdy added to its channels' sums from 0.0 as
// the runs go (param_grad_sums' additions in its order). Writing the B·C arrays and summing them took
// GroupNorm's backward of [N, 256, S] 1.04-1.2 times as long at S = 2 .. 16 (docs/PERFORMANCE.md,
// thirty-fourth session). With more threads the B·C arrays stay: shares of every row's groups for each
// thread (sample_rows_backward's way of keeping b order) took 1.2-1.3 times as long at 2 threads for
// S = 2 .. 16, each thread's reads of x and dy broken at every row.
void sample_runs_backward_1t(const Plan& p, const Operand& dxo, const Operand& dyo, const Operand& xo,
                             double eps, const float* w, std::vector<double>& sw, std::vector<double>& sb,
                             const SavedGroups* saved) {
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  const bool stream = stream_output(p);
  sw.assign(static_cast<std::size_t>(p.C), 0.0);
  sb.assign(sw.size(), 0.0);
  using Buffers = RunBuffers<RowsInputGrad>;
  for_group_runs<Buffers>(p, stream, [&](const GroupRun& r, Buffers& buf) {
    run_backward(k, p, r, buf, dxo, dyo, xo, eps, w, stream, buf.own_sdy(), buf.own_sdyxh(), saved);
    add_row_terms(sw.data() + r.c0, sb.data() + r.c0, buf.own_sdyxh(), buf.own_sdy(), r.c1 - r.c0);
  });
}

// per_sample_backward's dx and per-segment Σdy, Σdy·x̂ (B·C entries each), on sample runs or group by group.
void per_sample_segment_grads(const Plan& p, const Operand& dxo, const Operand& dyo, const Operand& xo,
                              double eps, const float* w, std::vector<double>& sdy,
                              std::vector<double>& sdyxh, const SavedGroups* saved) {
  if (on_sample_runs(p, {&xo, &dyo, &dxo}))
    return sample_runs_backward(p, dxo, dyo, xo, eps, w, sdy, sdyxh, saved);
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  const bool gather = needs_gather(xo, p) || needs_gather(dyo, p) || needs_gather(dxo, p);
  const bool stream = stream_output(p);
  SegmentArrays st = segment_workspace(p);
  st.sdy = sdy.data();  // the segments' Σdy go straight to the caller
  for_groups(
      p, 3, gather,
      [&](Index g, Index b, Index c0, Index spg, float* scratch) {
        GroupMoments gm;
        double rstd;
        if (saved) {  // combine_group's mean and count, and the group's rstd, as the forward formed them
          gm.count = group_count(p, g);
          gm.mean = saved->mean[g];
          rstd = saved->rstd[g];
          group_stats(k, p, xo, &dyo, b, c0, spg, st, scratch, spg == 1 ? &gm.mean : nullptr);
        } else {
          group_stats(k, p, xo, &dyo, b, c0, spg, st, scratch);
          gm = combine_group(p, g, st);
          rstd = group_rstd(gm.count, gm.var, eps);
        }
        const GroupGrads gg =
            group_grads(p, g, st, gm, rstd, w, [&](Index, Index, Index s, double v) { sdyxh[s] = v; });
        for (Index c = c0; c < c0 + spg; ++c)
          input_grad_seg(k, p, dxo, dyo, xo, b, c, gm.mean, rstd, w, gg.mg, gg.mgx, scratch, stream);
      },
      stream);
}

}  // namespace

void per_sample_forward(const Plan& p, View y, ConstView x, double eps, const float* w, const float* b,
                        Moments& m, std::vector<double>& rstd) {
  if (group_rows_apply(p, {x, y})) {
    m.var.clear();
    m.count.clear();
    return group_rows_forward(p, y.data(), x.data(), eps, w, b, m.mean, rstd);
  }
  const Operand xo = operand(x, p), yo = operand(y, p);
  if (on_sample_rows(p, {&xo, &yo})) return sample_rows_forward(p, yo, xo, eps, w, b, m, rstd);
  if (on_sample_runs(p, {&xo, &yo})) return sample_runs_forward(p, yo, xo, eps, w, b, m, rstd);
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  const bool stream = stream_output(p);
  const SegmentArrays st = segment_workspace(p);
  size_for_forward(m, rstd, p.groups);
  for_groups(
      p, 2, needs_gather(xo, p) || needs_gather(yo, p),
      [&](Index g, Index bi, Index c0, Index spg, float* scratch) {
        group_stats(k, p, xo, nullptr, bi, c0, spg, st, scratch);
        const GroupMoments gm = combine_group(p, g, st);
        const std::size_t gi = static_cast<std::size_t>(g);
        store(m, g, gm);
        rstd[gi] = group_rstd(gm.count, gm.var, eps);
        for (Index c = c0; c < c0 + spg; ++c)
          normalize_seg(k, p, yo, xo, bi, c, gm.mean, rstd[gi], w, b, scratch, stream);
      },
      stream);
}

void per_sample_backward(const Plan& p, View dx, ConstView dy, ConstView x, double eps, const float* w,
                         std::vector<double>& sw, std::vector<double>& sb, const SavedGroups* saved) {
  if (group_rows_apply(p, {x, dy, dx}))
    return group_rows_backward(p, dx.data(), dy.data(), x.data(), eps, w, sw, sb);
  const Operand xo = operand(x, p), dyo = operand(dy, p), dxo = operand(dx, p);
  if (on_sample_rows(p, {&xo, &dyo, &dxo}))
    return sample_rows_backward(p, dxo, dyo, xo, eps, w, sw, sb, saved);
  if (num_threads() == 1 && on_sample_runs(p, {&xo, &dyo, &dxo}))
    return sample_runs_backward_1t(p, dxo, dyo, xo, eps, w, sw, sb, saved);
  // Each segment's Σdy and Σdy·x̂, then their sums per channel. Reused from call to call, as the segment
  // workspace: B·C doubles each, which a fresh pair of vectors would allocate, fault in and zero on every
  // call (GroupNorm of [4096, 1024] on the segment path: a fifth of the backward).
  thread_local std::vector<double> sdy, sdyxh;
  const std::size_t nseg = static_cast<std::size_t>(p.segments());
  sdy.resize(nseg);  // every entry is written below
  sdyxh.resize(nseg);
  per_sample_segment_grads(p, dxo, dyo, xo, eps, w, sdy, sdyxh, saved);
  param_grad_sums(p, sdy, sdyxh, sw, sb);
}

void input_grad_const(const Plan& p, View dx, ConstView dy, const std::vector<double>& rstd, const float* w) {
  const Operand dyo = operand(dy, p), dxo = operand(dx, p);
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  const bool stream = stream_output(p);
  if (on_channel_rows(p, {&dyo, &dxo})) {
    // dx = ((dy − 0) − 0)·float(rstd·γ) + 0, as below
    RowsNormalize kc(p.C);
    for (Index c = 0; c < p.C; ++c)
      kc.set(c, normalize_consts(0.0, rstd[static_cast<std::size_t>(c)], w, nullptr, c));
    for_channel_blocks(p, stream, [&](Index c0, Index nc) {
      k.rows_normalize(kc.at(c0), channel_rows_at(p, c0, nc, &dyo, nullptr, &dxo), stream);
    });
    return;
  }
  for_segments(
      p, 2, needs_gather(dyo, p) || needs_gather(dxo, p),
      [&](Index b, Index c, Index, float* scratch) {
        const Index n = p.valid(b);
        float* out = seg_out(dxo, p, b, c, scratch + p.S);
        // dx = ((dy − 0) − 0)·float(rstd·γ) + 0
        if (n)
          k.normalize(out, seg_in(dyo, p, b, c, scratch), n,
                      normalize_consts(0.0, rstd[static_cast<std::size_t>(p.group_of(b, c))], w, nullptr, c),
                      stream && direct(dxo, p, b));
        seg_finish(dxo, p, b, c, out);
      },
      stream);
}

void grad_sums_input_grad_const(const Plan& p, View dx, ConstView dy, ConstView x,
                                const std::vector<double>& mean, const std::vector<double>& rstd,
                                const float* w, std::vector<double>& sdy, std::vector<double>& sdyxh) {
  const Operand xo = operand(x, p), dyo = operand(dy, p), dxo = operand(dx, p);
  const kernels::ChannelKernels& k = kernels::channel_kernels();
  const bool stream = stream_output(p);
  sdy.assign(static_cast<std::size_t>(p.segments()), 0.0);
  sdyxh.assign(static_cast<std::size_t>(p.segments()), 0.0);
  for_segments(
      p, 3, needs_gather(xo, p) || needs_gather(dyo, p) || needs_gather(dxo, p),
      [&](Index b, Index c, Index s, float* scratch) {
        const Index n = p.valid(b);
        float* out = seg_out(dxo, p, b, c, scratch + 2 * p.S);
        if (n) {
          const std::size_t g = static_cast<std::size_t>(p.group_of(b, c)), si = static_cast<std::size_t>(s);
          // The segment's sums as grad_sums forms them, then its dx from dy, still in cache, as
          // input_grad_const forms it.
          const float* dys = seg_in(dyo, p, b, c, scratch + p.S);
          kernels::SegmentStats st;
          k.segment_stats(&st, seg_in(xo, p, b, c, scratch), dys, n, kernels::StatsPrefetch{});
          sdy[si] = st.sdy;
          sdyxh[si] = segment_sdyxh(rstd[g], st.sdyd, st.mean, mean[g], st.sdy);
          k.normalize(out, dys, n, normalize_consts(0.0, rstd[g], w, nullptr, c),
                      stream && direct(dxo, p, b));
        }
        seg_finish(dxo, p, b, c, out);
      },
      stream);
}

void param_grad_sums(const Plan& p, const std::vector<double>& sdy, const std::vector<double>& sdyxh,
                     std::vector<double>& sw, std::vector<double>& sb) {
  // Each channel's sums from 0.0 in b order, swept row by row (memory order) rather than channel by channel:
  // the same additions in the same order.
  sw.assign(static_cast<std::size_t>(p.C), 0.0);
  sb.assign(sw.size(), 0.0);
  for (Index b = 0; b < p.B; ++b)
    add_row_terms(sw.data(), sb.data(), sdyxh.data() + b * p.C, sdy.data() + b * p.C, p.C);
}

void write_param_grads(const Plan& p, View dweight, View dbias, const std::vector<double>& sdy,
                       const std::vector<double>& sdyxh, GradMode mode) {
  std::vector<double> sw, sb;
  param_grad_sums(p, sdy, sdyxh, sw, sb);
  write_channel_grads(dweight, dbias, sw, sb, mode);
}

void write_channel_grads(View dweight, View dbias, const std::vector<double>& sw,
                         const std::vector<double>& sb, GradMode mode) {
  const bool acc = mode == GradMode::kAccumulate;
  // A NaN is written as the canonical quiet NaN: which of several NaN terms' sign and payload a sum keeps
  // is not fixed (C++ lets the compiler commute an addition), and two paths that add the same terms in the
  // same order must give the same bits (docs/numerics.md, "NaN, Inf, eps").
  auto canonical = [](float v) { return std::isnan(v) ? std::numeric_limits<float>::quiet_NaN() : v; };
  for (std::size_t c = 0; c < sw.size(); ++c) {
    if (dweight.defined()) {
      float& d = dweight.data()[static_cast<Index>(c) * dweight.stride(0)];
      d = canonical(acc ? d + static_cast<float>(sw[c]) : static_cast<float>(sw[c]));
    }
    if (dbias.defined()) {
      float& d = dbias.data()[static_cast<Index>(c) * dbias.stride(0)];
      d = canonical(acc ? d + static_cast<float>(sb[c]) : static_cast<float>(sb[c]));
    }
  }
}

void check_eps(double eps, const char* op) {
  NL_CHECK(std::isfinite(eps) && eps >= 0, "{}: eps must be finite and ≥ 0, got {}", op, eps);
}

std::vector<float> channel_vector(ConstView v, Index C, const char* name, const char* op) {
  if (!v.defined()) return {};
  NL_CHECK(v.shape() == Dims{C}, "{}: {} has shape {} but [{}] is expected", op, name, v.shape().str(), C);
  std::vector<float> out(static_cast<std::size_t>(C));
  for (Index c = 0; c < C; ++c) out[static_cast<std::size_t>(c)] = v.data()[c * v.stride(0)];
  return out;
}

void check_full_output(View out, ConstView x, ConstView other, const char* name, const char* op) {
  NL_CHECK(out.defined(), "{}: {} is required", op, name);
  plan::check_same_shape(x.shape(), out.shape(), name, op);
  plan::check_writable(out.shape(), out.strides(), name, op);
  plan::check_no_partial_overlap(out, x, name, "x", op);
  if (other.defined()) plan::check_no_partial_overlap(out, other, name, "dy", op);
}

void check_part_output(View out, const Dims& expect, ConstView x, ConstView other, const char* name,
                       const char* op) {
  if (!out.defined()) return;
  NL_CHECK(out.shape() == expect, "{}: {} has shape {} but {} is expected", op, name, out.shape().str(),
           expect.str());
  plan::check_writable(out.shape(), out.strides(), name, op);
  plan::check_no_partial_overlap(out, x, name, "x", op);
  if (other.defined()) plan::check_no_partial_overlap(out, other, name, "dy", op);
}

void write_stats(View out, const std::vector<double>& v) {
  if (!out.defined()) return;
  std::size_t i = 0;
  for_each_offset(out.shape(), out.strides(),
                  [&](Index off) { out.data()[off] = static_cast<float>(v[i++]); });
}

}  // namespace normlab::chnorm
