// Channel kernels: the inner loops of the channel-norm engine (BatchNorm, InstanceNorm, GroupNorm; see
// channel_norm.h) over one contiguous SEGMENT of n floats (internal).
//
// One source file (channel_kernels-inl.h) is compiled once per instruction set (src/simd/kernels_*.cpp),
// written against simd/vec.h (16-float and 8-double vectors with the same lane-wise IEEE operations on
// every target, no FMA contraction), so every target computes the same bits. The numerics are those of
// the fused LayerNorm kernels (docs/numerics.md, "Precision"): sums in double from exactly converted
// floats, the mean carried as a float pair (m_hi, m_lo), squares and products in fp32 accumulated in
// double, every elementwise output in fp32 at full vector width.
#pragma once

#include <normlab/tensor.h>

namespace normlab::kernels {

// Statistics of one segment x[0..n) (n ≥ 1), and with dy of the training backward:
//   sum  = Σx                       double sum of the exact conversions (blocks of 32: element i goes
//                                   to accumulator (i / 8) mod 4, lane i mod 8; hsum((a0 + a1) + (a2 + a3)))
//   mean = sum / n,  m_hi = float(mean),  m_lo = float(mean − m_hi)
//   m2   = Σ(x − mean)² = Σe² − n·m_lo², floored at 0, with e = x − m_hi in fp32: the squares e² in fp32
//          summed in blocks of 128 elements while 128 remain (eight vectors v: ((v0 + v1) + (v2 + v3)) +
//          ((v4 + v5) + (v6 + v7))), then a block of 64 if 64 remain ((v0 + v1) + (v2 + v3)), then the
//          rest as a zero-padded block of 64; each block's 16 lanes added to two double accumulators
//          (lanes 0-7, 8-15), total hsum(acc0 + acc1)
//   sdy  = Σdy                      double, like sum (exact terms)
//   sdyd = Σdy·(x − mean) = Σdy·e − m_lo·Σdy, Σdy·e from fp32 products in the same blocks as Σe²
// Tails are zero-padded (e masked to 0), which adds exact zeros.
struct SegmentStats {
  double sum = 0, mean = 0, m2 = 0, sdy = 0, sdyd = 0;
};
// The same statistics of many segments as columns (segment i's in sum[i], mean[i], ...).
struct SegmentColumns {
  double *sum = nullptr, *mean = nullptr, *m2 = nullptr, *sdy = nullptr, *sdyd = nullptr;
};
// Segment i's statistics s into the columns (sdy and sdyd only with dy).
inline void put(const SegmentColumns& out, Index i, const SegmentStats& s, bool dy = true) {
  out.sum[i] = s.sum;
  out.mean[i] = s.mean;
  out.m2[i] = s.m2;
  if (dy) {
    out.sdy[i] = s.sdy;
    out.sdyd[i] = s.sdyd;
  }
}

// Constants of the elementwise passes (fp32), per segment:
//   normalize:  y  = ((x − mh) − ml)·s + b                        (evaluated left to right)
//   input_grad: dx = r·((dy·w − c0) − ((x − mh) − ml)·c2)
struct NormalizeConsts {
  float mh = 0, ml = 0, s = 1, b = 0;
};
struct InputGradConsts {
  float mh = 0, ml = 0, r = 0, w = 1, c0 = 0, c2 = 0;
};

// Where segment_stats' first pass prefetches: the floats kStatsPrefetchBytes past the element it reads, in
// x (and dy) while that is below x + end, i.e. past the segment's end into what follows it in memory (the
// caller's next segments); from there on, as far past x_next (dy_next) as it would have been past x + end,
// or nothing when x_next is null. When the look-ahead reaches beyond a run of `run` floats from x_next
// (run > 0), it goes on at the start of the following run, x_step (dy_step) floats further, for `runs` runs
// in all from x_next's, and then stops. The default: follow x in memory without limit.
inline constexpr Index kNoPrefetchEnd = Index{1} << 60;
struct StatsPrefetch {
  Index end = kNoPrefetchEnd;
  const float* x_next = nullptr;
  const float* dy_next = nullptr;
  Index run = 0, runs = 1;
  Index x_step = 0, dy_step = 0;
};

// Channel rows: BatchNorm with the channels innermost (every segment a single element, channel_norm.cpp):
// the channels [0, nc) of `rows` rows, row r of x at x + xo[r] (of dy at dy + dyo[r], of the output at
// out + oo[r]). The per-channel arrays (sums in double, constants in fp32) hold a multiple of kRowsPad
// entries (the lanes past nc are scratch). Every per-channel sum starts at 0.0 and adds row after row, so
// channel c's sum is the one the segment path forms over its one-element segments, operation for
// operation (for one element, SegmentStats gives sum = mean = x, m2 = 0, sdy = dy, sdyd = 0).
inline constexpr Index kRowsPad = 16;
struct ChannelRows {
  const float* x = nullptr;
  const Index* xo = nullptr;
  const float* dy = nullptr;
  const Index* dyo = nullptr;
  float* out = nullptr;
  const Index* oo = nullptr;
  Index rows = 0, nc = 0;
};
// Per-channel sums of a training backward from the group statistics mean, rstd and γ (w, double; null:
// 1): with sdy = double(dy), sdyxh = rstd·(0 + (double(x) − mean)·sdy),
//   mg += w·sdy, mgx += w·sdyxh, dw += sdyxh, db += sdy      (mg, mgx may be null)
struct RowGradSums {
  double *mg = nullptr, *mgx = nullptr, *dw = nullptr, *db = nullptr;
};
// Terms of single-element segments (GroupNorm / InstanceNorm sample rows, channel_norm.cpp) for channels
// c in [0, n) of one row, each with its group's mean gmean[c] and rstd grstd[c] (double, per channel), from
// the segment statistics of x[c] alone as segment_stats forms them for n = 1 (Σx = 0 + x, mean_s = Σx/1 =
// Σx, m_hi = float(mean_s), m_lo = float(mean_s − m_hi), e = x − m_hi in fp32, M2 = double(e·e) − m_lo·m_lo,
// Σdy = 0 + dy, Σdy·(x − mean_s) = double(dy·e + 0) − m_lo·Σdy; for finite x: mean_s = x, e = m_lo = 0, so
// M2 = +0, and for x = ±Inf or NaN M2 is NaN: segment_stats' floor of M2 at 0 never applies):
//   var:   u[c] = M2 + d·d, d = mean_s − gmean[c]
//   grads: sdy[c] = Σdy, sdyxh[c] = grstd[c]·(Σdy·(x − mean_s) + (mean_s − gmean[c])·Σdy),
//          wsdy[c] = w_c·sdy[c], wsdyxh[c] = w_c·sdyxh[c] (w null: 1)
// The double arrays hold a multiple of kRowsPad entries (the lanes past n are scratch).
struct SingleGradTerms {
  double *sdy = nullptr, *sdyxh = nullptr, *wsdy = nullptr, *wsdyxh = nullptr;
};

// Per-channel fp32 constants of the elementwise row passes (per segment for segments_normalize /
// segments_input_grad), as NormalizeConsts / InputGradConsts.
struct RowNormalizeConsts {
  const float *mh, *ml, *s, *b;
};
struct RowInputGradConsts {
  const float *mh, *ml, *r, *w, *c0, *c2;
};
// Where single_input_grad_consts writes: RowInputGradConsts' arrays but w.
struct InputGradOut {
  float *mh, *ml, *r, *c0, *c2;
};

// How segments_stats forms the lane vectors of its sixteen segments at a time (channel_kernels-inl.h,
// load_lanes) for segments of fewer than 16 floats but 2, 4 and 8, and for the elements from the 17th on: one
// gather per element, or sixteen loads and a 16 × 16 transpose in registers per sixteen elements. The
// same values either way; only AVX-512 transposes (the other targets gather either way). A machine choice
// (channel_norm.cpp, lane_loads): gathers on Intel; the transpose on AMD, where GroupNorm of [N, 256, S] took
// 0.67-0.98 of the time with it on the Zen 5 at S = 5 .. 40 (S = 16 loads no other elements), forward and
// backward, 1 and 2 threads (docs/PERFORMANCE.md, forty-third session).
enum class LaneLoads { kGather, kTranspose };

struct ChannelKernels {
  // dy may be null (then sdy = sdyd = 0). The first pass prefetches its inputs 4 KiB ahead (pf).
  void (*segment_stats)(SegmentStats* out, const float* x, const float* dy, Index n, const StatsPrefetch& pf);
  // segment_stats of `count` consecutive segments of n floats (segment i at x + i·n, dy + i·n) into the
  // columns' entries [0, count) (sdy and sdyd only with dy), with the default prefetch: one kernel entry for
  // many short segments. For n ≤ 40 (channel_kernels-inl.h, kLanesUpTo) the segments go sixteen at a time,
  // one per lane (the same operations on the same values: the same bits), their lane vectors formed as
  // `loads` says.
  void (*segments_stats)(const SegmentColumns& out, const float* x, const float* dy, Index n, Index count,
                         LaneLoads loads);
  // segment_stats with dy of a segment whose mean is known (a backward given the forward's statistics):
  // `mean` in place of Σx/n, without the Σx pass and the squares; out->mean = mean, sdy and sdyd by
  // segment_stats' operations, sum = m2 = 0. The same mean, sdy and sdyd as segment_stats where mean is
  // its Σx/n (InstanceNorm: a group's mean (0 + Σx)/n is, but for Σx = −0), so a mean of ±0 runs
  // segment_stats itself. segments_grad_stats: likewise for segments_stats' segments, means[i] for
  // segment i (the columns' sum and m2 entries are not written, but where a mean is ±0). segment_grad_stats
  // prefetches as segment_stats (pf).
  void (*segment_grad_stats)(SegmentStats* out, const float* x, const float* dy, Index n, double mean,
                             const StatsPrefetch& pf);
  void (*segments_grad_stats)(const SegmentColumns& out, const float* x, const float* dy, Index n,
                              Index count, const double* means, LaneLoads loads);
  // y may equal x. stream: non-temporal stores from the first 64-byte boundary of y on (ordinary
  // stores before it and at the tail; the values are the same). Call fence() before another thread
  // may read what was streamed.
  void (*normalize)(float* y, const float* x, Index n, const NormalizeConsts& k, bool stream);
  // dx may equal dy or x. stream as for normalize.
  void (*input_grad)(float* dx, const float* dy, const float* x, Index n, const InputGradConsts& k,
                     bool stream);
  // normalize / input_grad of `count` consecutive segments of n floats (segment i at y + i·n, x + i·n, ...)
  // with segment i's constants at entry i of k's arrays (count entries each; only those are read). For
  // n < 16 (and for n = 16, 32, 64 streamed to an output not 64-byte aligned) the run goes as one stream of
  // vectors, each lane with its segment's constants, otherwise n = 16 as one vector per segment (the same
  // values).
  void (*segments_normalize)(float* y, const float* x, Index n, Index count, const RowNormalizeConsts& k,
                             bool stream);
  void (*segments_input_grad)(float* dx, const float* dy, const float* x, Index n, Index count,
                              const RowInputGradConsts& k, bool stream);
  void (*fence)();
  // Channel rows (above). rows_sum: sum[c] = Σ_r double(x). rows_sqdev: q[c] = Σ_r d·d, d = double(x) −
  // mean[c]. rows_grads: RowGradSums. rows_normalize, rows_input_grad: the elementwise passes into out
  // (which may equal x or dy), stream as for normalize (per row).
  void (*rows_sum)(double* sum, const ChannelRows& a);
  void (*rows_sqdev)(double* q, const double* mean, const ChannelRows& a);
  void (*rows_grads)(const RowGradSums& g, const double* mean, const double* rstd, const double* w,
                     const ChannelRows& a);
  void (*rows_normalize)(const RowNormalizeConsts& k, const ChannelRows& a, bool stream);
  void (*rows_input_grad)(const RowInputGradConsts& k, const ChannelRows& a, bool stream);
  // Single-element segments' terms (above): x, dy, w the row's n floats (w may be null).
  // single_moments: the moments of the `groups` groups of spg consecutive channels of one such row (each
  // group of count elements, count 0: every result 0) as combine_group forms them from those segments,
  // every sum from 0.0 in channel order: mean[g] = (Σ_j mean_s) / count, var[g] = (Σ_j u) / count with u
  // as above (gmean = mean[g]), rstd[g] = 1/√(var[g] + eps) (group_rstd).
  // group_means: acc[g] = (Σ_j t[g·spg + j]) / count from 0.0 in j order (count 0: 0), as group_grads'
  // mg and mgx from the grads terms wsdy, wsdyxh.
  // Both take eight groups at a time, group g + l in lane l (its channels spg apart: single_moments reads
  // them as columns of 8x8 blocks and gathers the last spg mod 8, group_means gathers), the rest one by
  // one: the same operations on the same values, so the bits of the scalar chains.
  void (*single_moments)(double* mean, double* var, double* rstd, const float* x, Index spg, Index groups,
                         double count, double eps);
  void (*group_means)(double* acc, const double* t, Index spg, Index groups, double count);
  // The constants of a sample row's normalize pass (normalize_consts of channel_norm.cpp, without β) from
  // its groups' mean and rstd: for channel c = g·spg + j, mh[c] = float(mean[g]), ml[c] =
  // float(mean[g] − mh[c]), s[c] = float(rstd[g]·double(w[c])) (w null: float(rstd[g])). Only the
  // spg·groups entries are written.
  void (*single_normalize_consts)(float* mh, float* ml, float* s, const double* mean, const double* rstd,
                                  const float* w, Index spg, Index groups);
  // The constants of an input_grad pass (input_grad_consts of channel_norm.cpp, without γ) from the groups'
  // statistics: for channel c = g·spg + j, mh[c] = float(mean[g]), ml[c] = float(mean[g] − mh[c]), r[c] =
  // float(rstd[g]), c0[c] = float(mg[g]), c2[c] = float(rstd[g]·mgx[g]). Only the spg·groups entries are
  // written. Both take sixteen groups per vector when spg = 1 (InstanceNorm), the same operations.
  void (*single_input_grad_consts)(const InputGradOut& o, const double* mean, const double* rstd,
                                   const double* mg, const double* mgx, Index spg, Index groups);
  // out[g·spg + j] = v[g] for j < spg, g < groups: the groups' values at their channels (only those
  // entries are written).
  void (*spread_groups)(float* out, const float* v, Index spg, Index groups);
  void (*spread_groupsd)(double* out, const double* v, Index spg, Index groups);
  void (*single_grad_terms)(const SingleGradTerms& o, const float* x, const float* dy, const float* w,
                            const double* gmean, const double* grstd, Index n);
  // A sample run's groups (channel_norm.cpp): `groups` groups of spg consecutive segments of st's entries
  // (segment s = g·spg + j), each segment of ns floats, each group of count elements (count 0: every
  // result 0); every group's sums from 0.0 in j order, as combine_group and group_grads form them:
  //   run_moments: mean[g] = (Σ_j sum[s]) / count, var[g] = (Σ_j (m2[s] + (ns·d)·d)) / count with
  //                d = mean_s[s] − mean[g] (mean_s: st.mean), rstd[g] = 1/√(var[g] + eps) (group_rstd);
  //   run_grads:   sdyxh[s] = rstd[g]·(sdyd[s] + (mean_s[s] − mean[g])·sdy[s]), mg[g] = (Σ_j w_s·sdy[s]) /
  //                count, mgx[g] = (Σ_j w_s·sdyxh[s]) / count, w_s = double(w[s]) (1 when w is null).
  // Eight groups at a time, group g + l in lane l (st's entries gathered spg apart), the rest one by one:
  // the same operations on the same values, so the bits of the scalar chains.
  void (*run_moments)(double* mean, double* var, double* rstd, const SegmentColumns& st, Index spg,
                      Index groups, double ns, double count, double eps);
  void (*run_grads)(double* mg, double* mgx, double* sdyxh, const SegmentColumns& st, const double* mean,
                    const double* rstd, const float* w, Index spg, Index groups, double count);
};

// The table for the active instruction set (see normlab/simd.h).
const ChannelKernels& channel_kernels();

}  // namespace normlab::kernels
