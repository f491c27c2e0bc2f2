// The channel-norm engine behind BatchNorm, InstanceNorm and GroupNorm (internal).
//
// x is viewed as [B, C, S...]: B = product of the axes before the channel axis, C the channel axis,
// S the axes after it. The unit of work is a SEGMENT (b, c): the S elements of one batch item and one
// channel (with masking: only the real frames t < len[b] of the time axis, a sub-box of S). A grouping
// maps segments to statistic groups:
//     kBatch     group c                   (segments (0,c), (1,c), ... in b order)
//     kInstance  group b·C + c             (one segment)
//     kGroup     group b·G + c/(C/G)       (segments (b, g·C/G) ... (b, (g+1)·C/G − 1) in c order)
// Each pass runs the channel kernels (channel_kernels.h) on every segment (gathered to a contiguous
// buffer when its valid elements are not already n consecutive floats), stores a few doubles per
// segment, and the per-group values are then combined serially in segment order (b major, c minor).
// Each segment's (and group's) arithmetic is its own, whichever thread runs it, so results are bitwise
// identical for any thread count. The passes walk memory in order: a BatchNorm forward reads x twice
// (moments, normalize), a training backward reads x and dy twice (grad_stats, input_grad), except where the
// blocked passes apply (batch_forward_blocked, batch_backward_blocked: channel block by channel block, the
// second read from cache); InstanceNorm and GroupNorm, whose groups are whole segments of one batch item,
// run both passes group by group and read their inputs from memory once (per_sample_forward,
// per_sample_backward).
// BatchNorm whose segments are single elements with the channels consecutive (channel axis last) sweeps
// rows of channels instead (channel_rows below; the same bits); InstanceNorm and GroupNorm with such
// segments ([N, C], channels-last [N, T, C]) take each batch item's row of channels at once (its groups'
// statistics eight groups at a time in vector lanes, one channel-rows elementwise call per row; the same
// bits). GroupNorm of short contiguous segments with four or more channels per group runs each group as one
// LayerNorm row instead (group_rows_apply below; its own arithmetic: the fused LayerNorm kernels').
// Outputs larger than the last-level cache are written with streaming (non-temporal) stores. Numerics
// (docs/numerics.md): sums in double, elementwise work in fp32 at full vector width, as in the fused
// LayerNorm kernels.
//
// Contract of the passes: y, dx written = at every element (0 at padded frames); the per-segment
// sums are written = into vectors of size B·C.
#pragma once

#include <normlab/norm.h>
#include <normlab/tensor.h>

#include <cmath>
#include <initializer_list>
#include <span>
#include <vector>

namespace normlab::chnorm {

enum class Grouping { kBatch, kInstance, kGroup };

struct Plan {
  const char* op = "";
  Grouping grouping = Grouping::kBatch;
  int rank = 0;
  int channel_axis = 0;
  Dims b_axes, b_shape;  // axes before the channel axis (B = product of b_shape)
  Dims s_axes, s_shape;  // axes after it (S = product of s_shape)
  Index B = 1, C = 1, S = 1;
  Index G = 1;                // channel groups (kGroup); 1 otherwise
  Index cpg = 1;              // channels per group (kGroup)
  int time = -1;              // index into s_shape of the masked axis; -1 when unmasked
  Index T = 1;                // size of the time axis (when masked)
  bool time_leading = false;  // every S axis before the time axis has size 1 (real frames are a prefix)
  std::vector<Index> len;     // per batch item (empty when unmasked)
  Index groups = 1;           // number of statistic groups

  Index segments() const { return B * C; }
  bool masked() const { return time >= 0; }
  Index valid(Index b) const {  // real elements in a segment of batch item b
    return masked() ? S / T * len[static_cast<std::size_t>(b)] : S;
  }
  Index group_of(Index b, Index c) const {
    switch (grouping) {
      case Grouping::kBatch:
        return c;
      case Grouping::kInstance:
        return b * C + c;
      case Grouping::kGroup:
        return b * G + c / cpg;
    }
    return 0;
  }
};

// Validates x's shape, the channel axis, groups (kGroup), lengths and the time axis; builds the plan.
// `groups` is used by kGroup only; `lengths` empty means unmasked.
Plan make_plan(const Dims& x_shape, int channel_axis, Grouping grouping, Index groups,
               std::span<const Index> lengths, int time_axis, const char* op);

// Shape of per-group statistics: [C] for kBatch, b_shape + [C] or b_shape + [G] otherwise.
Dims stats_shape(const Plan& p);

// Element count of every group (real elements only).
std::vector<double> group_counts(const Plan& p);

// Whether the passes write their outputs with streaming stores: outputs of kernels::stream_min_bytes() or
// more (norm/streaming.h), but not InstanceNorm's and GroupNorm's where the segments are longer than a vector
// and not whole vectors (S = 49, 100, 196 ...: each segment's aligned vectors streamed, its head and tail
// ordinary stores) on a machine that writes such rows with ordinary stores throughout
// (kernels::RowTuning::stream_ragged_rows: a Zen 5). Measured there (processes alternating;
// docs/PERFORMANCE.md, "forty-eighth session"; 64 MiB, S = 36, 49, 100, 196) ordinary stores took 0.66-0.85
// of the forward's time and 0.76-0.96 of the backward's; BatchNorm's (blocked over channels) came out 0.91
// to 1.20, so it keeps them. Shorter segments go through their runs as one stream of vectors and keep them
// too.
bool stream_output(const Plan& p);

// Per-group biased moments of x over real elements: mean = Σx/n, var = Σ(x−mean)²/n, in one pass over
// memory: per segment s (n_s real elements, in cache) Σx in double and M2_s = Σ(x − mean_s)² with
// mean_s = Σx/n_s (kernels::SegmentStats: fp32 squares around the fp32 pair of mean_s, accumulated in
// double); per group, in segment order, mean = Σ_s Σx / n and M2 = Σ_s (M2_s + n_s·(mean_s − mean)²)
// (Chan et al.'s exact combination), var = M2/n. Empty groups (n = 0) get mean = var = 0.
struct Moments {
  std::vector<double> mean, var, count;
};
Moments moments(const Plan& p, ConstView x);

// The statistics of a training backward in one pass over x and dy: the moments above, rstd per group
// (0 for empty groups) and, per segment, sdy = Σ dy (double, exact terms) and sdyxh = Σ dy·x̂, formed
// from the segment's own Σ dy·(x − mean_s) (fp32 products, double accumulation) as
// rstd_g·(Σ dy·(x − mean_s) + (mean_s − mean_g)·Σ dy) (0 for empty segments), combined in segment order
// (b major, c minor; nothing per segment is kept):
//   mg_g  = Σ_seg γ_c·sdy / n_g,  mgx_g = Σ_seg γ_c·sdyxh / n_g  (0 for empty groups; γ = 1 when w is null)
//   dweight_c = Σ_b sdyxh[b, c],  dbias_c = Σ_b sdy[b, c]         (double, in b order)
struct GradStats {
  Moments m;
  std::vector<double> rstd, mg, mgx, dweight, dbias;
};
GradStats grad_stats(const Plan& p, ConstView dy, ConstView x, double eps, const float* w);

// y = (x − mean_g)·rstd_g·γ_c + β_c at real elements, 0 at padded ones, in fp32 as
// ((x − m_hi) − m_lo)·float(rstd_g·γ_c) + β_c with (m_hi, m_lo) the fp32 pair of mean_g. mean, rstd per
// group; w, b per channel or null. Groups with rstd_g given as an empty-group marker still get their elements
// written by the same formula (callers zero their statistics).
void normalize(const Plan& p, View y, ConstView x, const std::vector<double>& mean,
               const std::vector<double>& rstd, const float* w, const float* b);

// Per segment over real elements, with x̂ = (x − mean_g)·rstd_g: sdy[seg] = Σ dy, sdyxh[seg] = Σ dy·x̂
// (formed as in grad_stats).
void grad_sums(const Plan& p, ConstView dy, ConstView x, const std::vector<double>& mean,
               const std::vector<double>& rstd, std::vector<double>& sdy, std::vector<double>& sdyxh);

// Training-mode dx = rstd_g·(dy·γ_c − mean_g[g] − x̂·mean_gx[g]) at real elements, 0 at padded ones, in
// fp32 as r·((dy·γ_c − float(mean_g)) − ((x − m_hi) − m_lo)·float(rstd_g·mean_gx)), r = float(rstd_g).
void input_grad(const Plan& p, View dx, ConstView dy, ConstView x, const std::vector<double>& mean,
                const std::vector<double>& rstd, const float* w, const std::vector<double>& mean_g,
                const std::vector<double>& mean_gx);

// Constant-statistics dx = dy·float(γ_c·rstd_g) (fp32 product) at real elements, 0 at padded ones.
void input_grad_const(const Plan& p, View dx, ConstView dy, const std::vector<double>& rstd, const float* w);

// grad_sums and input_grad_const in one pass over the segments (the constant-statistics backward with
// dγ, dβ): per segment its sums, then its dx from dy while dy is still in cache. The same bits as the two
// passes; dx may equal dy or x.
void grad_sums_input_grad_const(const Plan& p, View dx, ConstView dy, ConstView x,
                                const std::vector<double>& mean, const std::vector<double>& rstd,
                                const float* w, std::vector<double>& sdy, std::vector<double>& sdyxh);

// BatchNorm on channel rows: every segment a single element (S = 1, the channel axis last: [N, T, C],
// [N, C]) and the channels consecutive floats in every operand, unmasked. moments, grad_stats, normalize,
// input_grad and input_grad_const then sweep rows of C channels with the channel-rows kernels
// (channel_kernels.h), with the bits of the segment passes; block_channels declines. channel_rows says
// whether that holds for the listed operands. channel_grad_sums: a backward's per-channel sums on channel
// rows with given statistics (mean, rstd per channel), each from 0.0 in b order: dweight = Σ_b Σdy·x̂ and
// dbias = Σ_b Σdy (write_param_grads' sums of grad_sums' values, for write_channel_grads), and when
// `weighted` wdy = Σ_b γ_c·Σdy and wdyxh = Σ_b γ_c·Σdy·x̂ (w null: γ = 1).
struct ChannelSums {
  std::vector<double> dweight, dbias, wdy, wdyxh;
};
bool channel_rows(const Plan& p, std::initializer_list<ConstView> operands);
ChannelSums channel_grad_sums(const Plan& p, ConstView dy, ConstView x, const std::vector<double>& mean,
                              const std::vector<double>& rstd, const float* w, bool weighted);

// BatchNorm's training passes blocked over channels. The channels are cut into blocks of at most kc whose
// segments (every batch item's) of the inputs fill at most a quarter of this core's L2 cache, an equal share
// of the channels for each thread (channel_norm.cpp, for_blocks); per block the statistics pass, the
// block's per-channel combination and the elementwise pass run back to back, so the elementwise pass finds
// its inputs in cache instead of reading them from memory a second time. Each channel's arithmetic is that
// of moments + rstd_of + normalize (forward) and grad_stats + input_grad (backward), operation for
// operation, so the outputs have the same bits whatever kc (and thread count).
// block_channels: kc for `inputs` input tensors (1 forward, 2 backward) and the listed full-shaped
// operands, or 0 when the blocked passes do not apply (kBatch with every segment S consecutive floats,
// unmasked or masked with the time axis leading, so that a segment's real frames are its first valid(b)
// floats; one channel's inputs within the budget; the whole input beyond it). Padded frames of y and dx
// are written 0, as by the separate passes.
Index block_channels(const Plan& p, int inputs, std::initializer_list<ConstView> operands);
// y, save statistics as moments + normalize; rstd per channel (rstd_of). segment_means (optional): every
// segment's own mean (Σx/n, segment s = b·C + c; 0 for an empty one), for a backward given them.
Moments batch_forward_blocked(const Plan& p, Index kc, View y, ConstView x, double eps, const float* w,
                              const float* b, std::vector<double>& rstd,
                              std::vector<double>* segment_means = nullptr);
// dx as input_grad with grad_stats' statistics, which it returns.
// saved (optional): a blocked forward's statistics of the same x (batch_forward_blocked: every channel's
// mean and rstd, every segment's mean), which replace their recomputation: each segment's Σx and squares
// (the kernels' segment_grad_stats) and the combination of its channel's moments are skipped. The same bits
// as without them (a segment's mean of ±0 recomputes its Σx: channel_kernels.h). The returned moments'
// var is then not formed (0).
struct SavedBatch {
  const double* mean = nullptr;          // C
  const double* rstd = nullptr;          // C
  const double* segment_mean = nullptr;  // B·C
};
GradStats batch_backward_blocked(const Plan& p, Index kc, View dx, ConstView dy, ConstView x, double eps,
                                 const float* w, const SavedBatch* saved = nullptr);

// InstanceNorm and GroupNorm (every group is whole segments of one batch item): the forward (moments,
// rstd per group, normalize) and the training backward's dx with the per-segment sdy, sdyxh, group by
// group: a group's segments are read from memory for the statistics and again from cache for y or dx.
// The arithmetic is that of moments + normalize and grad_stats + input_grad with the backward's means of
// g and g·x̂ (as grad_stats forms them), operation for operation, so the bits are the same.
// Single-element segments with the channels consecutive in every operand run row by row (channel_norm.cpp,
// "sample rows"; the backward, at 1 thread or with enough groups per row, adds each row's terms to the
// per-channel sums as it goes), short consecutive segments a run of groups at a time ("sample runs").
// m, rstd: every group's moments and rstd (resized; the storage they hold is reused, so a caller that
// keeps them between calls saves their page faults: 4 MiB per call at GroupNorm of [4096, 1024]).
void per_sample_forward(const Plan& p, View y, ConstView x, double eps, const float* w, const float* b,
                        Moments& m, std::vector<double>& rstd);
// sw, sb: the per-channel sums of dγ and dβ as param_grad_sums forms them from the per-segment Σdy·x̂ and
// Σdy (C entries each).
// saved (optional): every group's mean and rstd as per_sample_forward formed them off group rows (the
// caller's check: group rows form them with the row kernels' arithmetic), which replace their
// recomputation: the moments' combination is skipped, and with one segment per group (InstanceNorm;
// GroupNorm with G = C) the segments' Σx and squares as well (the kernels' segment_grad_stats), each
// segment's mean being its group's. The same bits as without them (a group's mean of ±0 recomputes its
// segment's Σx: channel_kernels.h). Group rows (group_rows_apply) recompute them: the row kernels' backward
// from saved statistics took 0.96-1.10 of the time there (rows of 64 and 128 floats in tiles of four; a
// scratch program, docs/PERFORMANCE.md, "forty-ninth session").
struct SavedGroups {
  const double* mean = nullptr;
  const double* rstd = nullptr;
};
void per_sample_backward(const Plan& p, View dx, ConstView dy, ConstView x, double eps, const float* w,
                         std::vector<double>& sw, std::vector<double>& sb,
                         const SavedGroups* saved = nullptr);

// GroupNorm of short segments through the LayerNorm row kernels (group_rows.cpp): where group_rows_apply
// says so (GroupNorm, unmasked, at least kGroupRowsMinCpg channels per group, 2 ≤ S ≤ kGroupRowsMaxS, rows of
// n = (C/G)·S floats with n a multiple of 16 or n ≥ 64, every operand contiguous), each group is one row of n
// consecutive floats and per_sample_forward / per_sample_backward run it as a LayerNorm row with γ_c, β_c
// repeated over each channel's S elements: the group's mean and rstd (double) are those of
// layer_norm_forward on the row, y and dx its elementwise formulas; sw, sb as per_sample_backward's (C
// entries each). Tiles of batch items, group by group within a tile; the same bits for any thread count.
// Why these bounds (docs/PERFORMANCE.md, "forty-sixth session"; paired in one process, 2^22 floats, 1
// thread): with 4 to 32 channels per group the rows took 0.26-0.79 of the segment path's time forward and
// backward from S = 2 to 32, but 1.03-1.33 at S = 3 with 8 channels per group (rows of 24 floats), 1.03-1.72
// backward at S = 49 and 64, and 1.2-1.4 with 2 channels per group at S = 4 and 16 (rows of 8 and 32).
// GroupNorm with G = C (one channel per group) keeps the segment path, so that it stays InstanceNorm's bits.
inline constexpr Index kGroupRowsMinCpg = 4;
inline constexpr Index kGroupRowsMaxS = 32;
bool group_rows_apply(const Plan& p, std::initializer_list<ConstView> operands);
void group_rows_forward(const Plan& p, float* y, const float* x, double eps, const float* w, const float* b,
                        std::vector<double>& mean, std::vector<double>& rstd);
void group_rows_backward(const Plan& p, float* dx, const float* dy, const float* x, double eps,
                         const float* w, std::vector<double>& sw, std::vector<double>& sb);

// sw[c] = Σ_b sdyxh[b, c], sb[c] = Σ_b sdy[b, c] (double, from 0.0 in b order).
void param_grad_sums(const Plan& p, const std::vector<double>& sdy, const std::vector<double>& sdyxh,
                     std::vector<double>& sw, std::vector<double>& sb);
// dweight_c = Σ_b sdyxh[b, c], dbias_c = Σ_b sdy[b, c] (param_grad_sums), written per mode.
void write_param_grads(const Plan& p, View dweight, View dbias, const std::vector<double>& sdy,
                       const std::vector<double>& sdyxh, GradMode mode);

// dweight_c = sw[c], dbias_c = sb[c] (rounded to float), written per mode.
void write_channel_grads(View dweight, View dbias, const std::vector<double>& sw,
                         const std::vector<double>& sb, GradMode mode);

// Shared argument checks.
void check_eps(double eps, const char* op);
// An optional [C] input read into a contiguous vector (empty when not given).
std::vector<float> channel_vector(ConstView v, Index C, const char* name, const char* op);
// Checks a required full-shaped output against x (shape, writable, overlap with the listed inputs).
void check_full_output(View out, ConstView x, ConstView other, const char* name, const char* op);
// Checks an optional output of shape `expect` (shape, writable, no overlap with x / other).
void check_part_output(View out, const Dims& expect, ConstView x, ConstView other, const char* name,
                       const char* op);
// A group's rstd, 1/√(var + eps); an empty group (count 0) gets 0 (its elements are all padding).
inline double group_rstd(double count, double var, double eps) {
  return count > 0 ? 1.0 / std::sqrt(var + eps) : 0.0;
}
// rstd per group (group_rstd).
std::vector<double> rstd_of(const Moments& m, double eps);
// BatchNorm's option checks: eps (check_eps) and momentum in [0, 1] when given.
void check_bn_options(const BatchNormOptions& opt, const char* op);
// BatchNorm's running statistics [C] (given) updated in place with the batch moments m: PyTorch's rule
// (running ← (1−momentum)·running + momentum·batch, the unbiased variance n/(n−1)), ONNX's per
// opt.convention, or the cumulative average when opt.momentum is nullopt (counting in *num_batches_tracked).
void update_running_stats(View running_mean, View running_var, Index* num_batches_tracked, const Moments& m,
                          const BatchNormOptions& opt);
// Writes a per-group double vector into an optional float view of shape stats_shape.
void write_stats(View out, const std::vector<double>& v);

}  // namespace normlab::chnorm
