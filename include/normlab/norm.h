// normlab/norm.h — normalization kernels over any set of axes of a strided tensor.
//
// Vocabulary: x has rank r ≤ 8. The NORMALIZED axes N (given in `axes`, negative counts from the end,
// any order, no duplicates) form one group per combination of the KEPT axes K (all other axes).
// Every group is normalized on its own:
//     mean = Σx/n,  var = Σ(x−mean)²/n (biased),  rstd = 1/sqrt(var+eps),
//     y = γ⊙(x−mean)·rstd + β,                 n = number of elements in a group.
// Shapes:
//     y, dy, dx          like x
//     mean, rstd         x's shape with the normalized axes removed (kept axes in x's order); rank 0
//                        when every axis is normalized
//     weight γ, bias β   x's sizes at the normalized axes, in increasing axis order
//     dweight, dbias     like weight and bias
// Any argument marked "optional" may be an undefined view (View{}), meaning "not given / not wanted".
// Views may have arbitrary strides (non-contiguous, sliced, negative). Outputs may alias inputs
// exactly (same data pointer and strides) but must not partially overlap them.
//
// Numerics (LayerNorm, RMSNorm; docs/numerics.md): inputs and outputs are fp32. The mean and every sum
// are computed in double, the mean is carried as a float pair (hi, lo) so that x − mean loses nothing
// to the mean's own rounding, and the elementwise work (deviations, y, dx, the dγ terms) is fp32. Rows
// at a large common offset (x = 1e4 + N(0,1)) normalize to within a few fp32 roundings of the output
// (PyTorch's fp32 kernels are ≈1e-3 off there). The reduction order is fixed by the data layout alone:
// results are bitwise identical for any thread count and any SIMD target.
//
// NaN policy: no value checks are made on the data. A NaN or Inf in a group makes that group's mean,
// rstd and outputs NaN; other groups are unaffected. With eps = 0 a constant group has var = 0 and
// rstd = +Inf, and its outputs are NaN (as in PyTorch). Range: the row kernels square deviations in
// fp32, so a group with |x − mean| above √FLT_MAX ≈ 1.8e19 gets var = +Inf, rstd = 0 and y = β
// (dx = 0); the strided-axis column path and the channel norms work in double and do not overflow there.
#pragma once

#include <normlab/tensor.h>

#include <optional>
#include <span>
#include <vector>

namespace normlab {

// A list of axes; negative values count from the end.
using Axes = std::vector<int>;

// LayerNorm forward over `axes`.
//   y:          output, shape of x (written =)
//   mean, rstd: optional outputs, shape of the kept axes (written =)
//   x:          input
//   weight γ, bias β: optional inputs, shape of the normalized axes
//   eps:        ≥ 0, added to the variance inside the square root
void layer_norm_forward(View y, View mean, View rstd, ConstView x, ConstView weight, ConstView bias,
                        const Axes& axes, double eps = 1e-5);

// Gradient accumulation rule for parameter gradients.
enum class GradMode {
  kOverwrite,   // dweight = ..., dbias = ...   (default)
  kAccumulate,  // dweight += ..., dbias += ... (for training loops that sum several contributions)
};

// LayerNorm backward over `axes`.
//   dx:               output, shape of x, always written = (never accumulated)
//   dweight, dbias:   optional outputs, shape of the normalized axes, written per `mode`
//   dy, x:            inputs, shape of x
//   weight γ:         optional; without it γ = 1
//   eps:              the forward pass's eps
// The statistics are recomputed from x (exactly as the forward computes them) rather than taken from
// the forward pass: a saved fp32 mean is ≈1e-3 off at an offset of 1e4. The extra pass reads a group
// that is already in cache.
void layer_norm_backward(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                         const Axes& axes, double eps = 1e-5, GradMode mode = GradMode::kOverwrite);

// Statistics a LayerNorm/RMSNorm forward keeps for its backward (optional). They are the exact double
// values the kernels compute (docs/numerics.md: the mean, and rstd before its rounding to float), so a
// backward given them returns bitwise what it returns when it recomputes them from x; it only skips
// the work (the pass that sums x, and Σ(x − mean)²). The fp32 `mean`/`rstd` outputs cannot serve: the
// backward needs the mean to better than fp32 (docs/numerics.md), and rstd in double.
//   Filled by layer_norm_forward / rms_norm_forward when passed (every field is overwritten); taken by
//   layer_norm_backward_saved / rms_norm_backward_saved. `mean` and `rstd` hold one value per group,
//   the kept axes in row-major order (`mean` is empty for RMSNorm), on every layout (contiguous rows,
//   the strided [B,F,T]-over-F column path, gathered groups). The backward checks that x has the
//   forward's shape, axes and norm and that the stats hold one value per group, and takes eps from here;
//   like PyTorch's saved mean/rstd, it cannot check that x holds the forward's values.
struct NormStats {
  bool center = true;  // LayerNorm (true) or RMSNorm (false)
  Dims x_shape;        // the forward's x shape
  Dims axes;           // the normalized axes, increasing, non-negative
  double eps = 0;
  std::vector<double> mean;
  std::vector<double> rstd;
};

// As above, also filling `stats` (not null) for layer_norm_backward_saved below.
void layer_norm_forward(View y, View mean, View rstd, ConstView x, ConstView weight, ConstView bias,
                        const Axes& axes, double eps, NormStats* stats);
// layer_norm_backward with the statistics of layer_norm_forward(…, stats): axes and eps come from
// `stats`; dx, dweight, dbias are bitwise those of layer_norm_backward.
void layer_norm_backward_saved(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                               const NormStats& stats, GradMode mode = GradMode::kOverwrite);

// RMSNorm over `axes` (Zhang & Sennrich 2019; PyTorch nn.RMSNorm):
//     rstd = 1/sqrt(Σx²/n + eps),  y = x·rstd·γ
// No centring and no bias. normlab's default eps is 1e-6; PyTorch's default (eps=None) is the
// dtype's machine epsilon: pass kTorchRmsNormEps for it.
inline constexpr double kRmsNormEps = 1e-6;
inline constexpr double kTorchRmsNormEps = 1.1920928955078125e-07;  // FLT_EPSILON

//   y:        output, shape of x (written =)
//   rstd:     optional output, shape of the kept axes
//   weight γ: optional, shape of the normalized axes
void rms_norm_forward(View y, View rstd, ConstView x, ConstView weight, const Axes& axes,
                      double eps = kRmsNormEps);
// dx = rstd·(g − x̂·mean(g·x̂)) with g = dy·γ, x̂ = x·rstd (written =); dweight = Σ dy·x̂ (per mode).
// rstd is recomputed from x, as for LayerNorm.
void rms_norm_backward(View dx, View dweight, ConstView dy, ConstView x, ConstView weight, const Axes& axes,
                       double eps = kRmsNormEps, GradMode mode = GradMode::kOverwrite);
// With the statistics of the forward (NormStats above): rms_norm_forward fills `stats`, and
// rms_norm_backward_saved takes axes and eps from it; same bits as rms_norm_backward.
void rms_norm_forward(View y, View rstd, ConstView x, ConstView weight, const Axes& axes, double eps,
                      NormStats* stats);
void rms_norm_backward_saved(View dx, View dweight, ConstView dy, ConstView x, ConstView weight,
                             const NormStats& stats, GradMode mode = GradMode::kOverwrite);

// Shapes the functions above expect, for callers that allocate outputs.
Dims kept_shape(const Dims& x_shape, const Axes& axes);        // shape of mean / rstd
Dims normalized_shape(const Dims& x_shape, const Axes& axes);  // shape of weight / bias

// ---- The channel-norm family: BatchNorm, InstanceNorm, GroupNorm ---------------------------------
//
// x is seen as [B, C, S...]: C is the size of the CHANNEL axis (`channel_axis`, default 1, negative
// counts from the end), B the product of the axes before it (the batch items) and S the axes after it.
// One mechanism, three groupings of the same (b, c) segments (a segment = the S elements of one b, c):
//     BatchNorm     one group per channel c:          all (b, s)
//     InstanceNorm  one group per (b, c):              all s
//     GroupNorm     one group per (b, g), G | C:       the C/G channels of g, all s
// Every group: mean = Σx/n, var = Σ(x−mean)²/n (biased), rstd = 1/sqrt(var+eps),
// y = (x−mean)·rstd·γ_c + β_c with γ, β of shape [C] (per channel, optional).
// Backward per group with g = dy·γ_c: dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) (written =);
// dγ_c = Σ dy·x̂, dβ_c = Σ dy over all (b, s) of channel c (written = or += per GradMode).
// Shapes:
//     y, dy, dx                     like x
//     weight, bias, dweight, dbias  [C]
//     BatchNorm save_mean/save_rstd, running_mean/running_var  [C]
//     InstanceNorm save_mean/save_rstd  x's axes before the channel axis, then C   (e.g. [N, C])
//     GroupNorm save_mean/save_rstd     x's axes before the channel axis, then G   (e.g. [N, G])
// Numerics, determinism, aliasing and NaN policy as for LayerNorm above: moments in double, partial
// sums per segment combined in (b, c) order, the same bits for any thread count.
//
// Padding-aware (masked) BatchNorm and InstanceNorm: `lengths` holds one length per batch item b
// (B entries, each 0 ≤ len ≤ size of the time axis) for a TIME axis (`time_axis`, default the last
// axis of x; it must come after the channel axis). Only real frames t < len[b] enter the statistics
// and the parameter gradients; y and dx at padded frames (t ≥ len[b]) are written exactly 0. An empty
// span means unmasked. A batch item of length 0 contributes nothing to BatchNorm; in InstanceNorm all
// of its groups are empty: y and dx are written 0 there and save_mean = save_rstd = 0 for them (no
// error, no NaN).

// BatchNorm options (PyTorch defaults).
struct BatchNormOptions {
  int channel_axis = 1;
  double eps = 1e-5;
  // Weight of the NEW batch statistic (PyTorch); nullopt = cumulative average 1/num_batches_tracked.
  // With RunningStatsConvention::kOnnx it weights the OLD value instead (ONNX's default is 0.9).
  std::optional<double> momentum = 0.1;
  bool training = true;  // true: batch statistics (and running-stat updates); false: running statistics
  enum class RunningStatsConvention {
    kPyTorch,  // running ← (1−m)·running + m·batch; running_var gets the UNBIASED variance n/(n−1)
    kOnnx,     // running ← m·running + (1−m)·batch; running_var gets the population (biased) variance
  } convention = RunningStatsConvention::kPyTorch;
  int time_axis = -1;  // the masked axis when lengths are given
  // ONNX BatchNormalization defaults: momentum 0.9 on the old value, population variance.
  static BatchNormOptions onnx() {
    BatchNormOptions o;
    o.momentum = 0.9;
    o.convention = RunningStatsConvention::kOnnx;
    return o;
  }
};

// BatchNorm forward.
//   y:                        output, like x (written =; 0 at padded frames)
//   save_mean, save_rstd:     optional outputs [C]: the statistics used (batch ones in training, the
//                             running mean and 1/sqrt(running_var+eps) in eval)
//   running_mean, running_var: optional [C], both or neither. Training: updated in place when given
//                             (momentum, convention above). Eval: required, read only.
//   num_batches_tracked:      optional (null); incremented by one per training step with running stats;
//                             required for momentum = nullopt (cumulative average)
//   x:                        input [B, C, S...] (channel axis per options)
//   weight γ, bias β:         optional [C]
//   lengths:                  per batch item, or empty (unmasked)
// Training needs more than one (real) value per channel ("Expected more than 1 value per channel when
// training", as PyTorch).
void batch_norm_forward(View y, View save_mean, View save_rstd, View running_mean, View running_var,
                        Index* num_batches_tracked, ConstView x, ConstView weight, ConstView bias,
                        std::span<const Index> lengths = {}, const BatchNormOptions& opt = {});

// Statistics a BatchNorm training forward keeps for its backward (optional), as ChannelNormStats below does
// for InstanceNorm and GroupNorm: every channel's mean and rstd as the double values the forward computed
// (save_mean and save_rstd are their fp32 roundings, too coarse for the backward: docs/numerics.md), and
// where the forward ran channel block by channel block (an input larger than the cache with each segment's
// frames consecutive) every (item, channel) segment's own mean. The backward given them
// (batch_norm_backward_saved) returns bitwise what batch_norm_backward in training mode returns; where it
// runs channel block by channel block too it skips the work of recomputing them: each segment's Σx and
// Σ(x − mean)² (it sums only Σdy and Σdy·(x − mean) over the segment) and the combination of the segments'
// moments. Elsewhere it recomputes them, with the same result.
//   Filled by batch_norm_forward in training mode when passed (every field is overwritten). The backward
//   takes the options from them (channel axis, time axis, eps, lengths, checked against x as the forward
//   checks them) and checks that x has the forward's shape and that they hold one value per channel (and
//   one per segment, or none); like PyTorch's saved mean and rstd, it cannot check that x holds the
//   forward's values.
struct BatchNormStats {
  Dims x_shape;                // the forward's x shape
  int channel_axis = 1;        // as given to the forward
  int time_axis = -1;          // the masked axis, as given
  std::vector<Index> lengths;  // as given (empty: unmasked)
  double eps = 0;
  std::vector<double> mean, rstd;    // one per channel
  std::vector<double> segment_mean;  // one per segment (b·C + c) where the forward ran blocked, else empty
};

// As above in training mode, also filling `stats` (not null; opt.training must be true).
void batch_norm_forward(View y, View save_mean, View save_rstd, View running_mean, View running_var,
                        Index* num_batches_tracked, ConstView x, ConstView weight, ConstView bias,
                        std::span<const Index> lengths, const BatchNormOptions& opt, BatchNormStats* stats);

// BatchNorm backward.
//   dx:               output, like x, written = (0 at padded frames)
//   dweight, dbias:   optional outputs [C], written per `mode`
//   dy, x:            inputs, like x
//   weight γ:         optional [C]
//   running_mean, running_var: [C], required in eval (opt.training = false), ignored in training
// Training: batch statistics recomputed from x in double (as layer_norm_backward), the full formula.
// Eval: the statistics are constants: dx = dy·γ·rstd_running, x̂ = (x − running_mean)·rstd_running.
void batch_norm_backward(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                         ConstView running_mean, ConstView running_var, std::span<const Index> lengths = {},
                         const BatchNormOptions& opt = {}, GradMode mode = GradMode::kOverwrite);
// The training backward with the forward's statistics (BatchNormStats above): options and lengths come from
// `stats`; dx, dweight, dbias are bitwise those of batch_norm_backward in training mode.
void batch_norm_backward_saved(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                               const BatchNormStats& stats, GradMode mode = GradMode::kOverwrite);

// InstanceNorm options (PyTorch defaults; affine via optional weight/bias). Running statistics
// (track_running_stats=True) are not offered: PyTorch's default is False.
struct InstanceNormOptions {
  int channel_axis = 1;
  double eps = 1e-5;
  int time_axis = -1;  // the masked axis when lengths are given
};

// InstanceNorm forward: y like x; save_mean, save_rstd optional, shape instance_stats_shape(x).
void instance_norm_forward(View y, View save_mean, View save_rstd, ConstView x, ConstView weight,
                           ConstView bias, std::span<const Index> lengths = {},
                           const InstanceNormOptions& opt = {});
// InstanceNorm backward: dx like x (=); dweight, dbias optional [C] (per mode).
void instance_norm_backward(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                            std::span<const Index> lengths = {}, const InstanceNormOptions& opt = {},
                            GradMode mode = GradMode::kOverwrite);

struct GroupNormOptions {
  int channel_axis = 1;
  double eps = 1e-5;
};

// GroupNorm forward with `groups` groups of C/groups consecutive channels (groups must divide C).
// y like x; save_mean, save_rstd optional, shape group_stats_shape(x, groups).
void group_norm_forward(View y, View save_mean, View save_rstd, ConstView x, ConstView weight, ConstView bias,
                        int groups, const GroupNormOptions& opt = {});
// GroupNorm backward: dx like x (=); dweight, dbias optional [C] (per mode).
void group_norm_backward(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                         int groups, const GroupNormOptions& opt = {}, GradMode mode = GradMode::kOverwrite);

// Statistics an InstanceNorm / GroupNorm forward keeps for its backward (optional), as NormStats does for
// LayerNorm: every group's mean and rstd as the double values the forward computed (save_mean and
// save_rstd are their fp32 roundings, too coarse for the backward: docs/numerics.md). The backward given
// them (instance_norm_backward_saved, group_norm_backward_saved) returns bitwise what instance_norm_backward
// / group_norm_backward return, and skips the work of recomputing them: the combination of the segments'
// moments, and with one channel per group (InstanceNorm; GroupNorm with groups = C) each segment's Σx and
// Σ(x − mean)² (the backward then sums only Σdy and Σdy·(x − mean) over the segment). GroupNorm of short
// segments (four or more channels per group, 2 ≤ S ≤ 32) on contiguous operands, which runs each group as a
// LayerNorm row, recomputes them (no faster with them: docs/PERFORMANCE.md, "forty-ninth session").
//   Filled by instance_norm_forward / group_norm_forward when passed (every field is overwritten). The
//   backward takes the options from them (channel axis, eps, groups; InstanceNorm's time axis and lengths,
//   checked against x as the forward checks them) and checks that they come from the op, that x has the
//   forward's shape and that they hold one value per group; like PyTorch's saved mean and rstd, it cannot
//   check that x holds the forward's values. Where the forward ran GroupNorm as LayerNorm
//   rows (their arithmetic) and the backward's operands do not (a non-contiguous dx, say), the statistics
//   are recomputed from x too, so the result is the same either way.
struct ChannelNormStats {
  bool group = false;          // GroupNorm (true) or InstanceNorm (false)
  Dims x_shape;                // the forward's x shape
  int channel_axis = 1;        // as given to the forward
  int groups = 1;              // GroupNorm's groups
  int time_axis = -1;          // InstanceNorm's masked axis, as given
  std::vector<Index> lengths;  // InstanceNorm's lengths (empty: unmasked)
  double eps = 0;
  bool layer_norm_rows = false;  // which kernels formed them: GroupNorm as LayerNorm rows (above)
  std::vector<double> mean;      // one per group, in save_mean's order
  std::vector<double> rstd;
};

// As above, also filling `stats` (not null).
void instance_norm_forward(View y, View save_mean, View save_rstd, ConstView x, ConstView weight,
                           ConstView bias, std::span<const Index> lengths, const InstanceNormOptions& opt,
                           ChannelNormStats* stats);
void group_norm_forward(View y, View save_mean, View save_rstd, ConstView x, ConstView weight, ConstView bias,
                        int groups, const GroupNormOptions& opt, ChannelNormStats* stats);
// The backward with the forward's statistics: options, groups and lengths come from `stats`; dx, dweight,
// dbias are bitwise those of instance_norm_backward / group_norm_backward.
void instance_norm_backward_saved(View dx, View dweight, View dbias, ConstView dy, ConstView x,
                                  ConstView weight, const ChannelNormStats& stats,
                                  GradMode mode = GradMode::kOverwrite);
void group_norm_backward_saved(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                               const ChannelNormStats& stats, GradMode mode = GradMode::kOverwrite);

// Shapes of the saved statistics, for callers that allocate outputs.
Dims instance_stats_shape(const Dims& x_shape, int channel_axis = 1);        // [axes before C..., C]
Dims group_stats_shape(const Dims& x_shape, int groups, int channel_axis = 1);  // [axes before C..., G]

// ---- bf16 / fp16 storage: LayerNorm and RMSNorm -------------------------------------------------
//
// The same functions with x, y, dy, dx stored as bfloat16 or float16 (normlab/tensor.h). Everything
// else is fp32: γ, β, dγ, dβ, mean and rstd, as in PyTorch's mixed-precision recipe (an fp16/bf16
// activation with fp32 parameters: torch.autocast keeps layer_norm in fp32, Apex's MixedFusedLayerNorm
// and ATen's CPU layer_norm (PyTorch ≥ 2.0) take bf16 input with fp32 γ/β and return fp32 mean/rstd).
// A caller with 16-bit γ/β widens them once (they are O(normalized size)).
// Numerics: each group is widened exactly to fp32 and goes through the fp32 kernels (moments in
// double); each output element is rounded ONCE from the fp32 kernels' result to the storage type
// (round to nearest even). So y_bf16 = round_bf16(layer_norm_forward(fp32 x widened from x_bf16)):
// within half a storage ulp of the fp32 result, at most 1 ulp from the exact value.
// dγ, dβ: bitwise those of the fp32 backward on the widened inputs (also for the fused add + norm
// backward below). NaN/Inf policy as above.
void layer_norm_forward(BF16View y, View mean, View rstd, ConstBF16View x, ConstView weight, ConstView bias,
                        const Axes& axes, double eps = 1e-5);
void layer_norm_forward(F16View y, View mean, View rstd, ConstF16View x, ConstView weight, ConstView bias,
                        const Axes& axes, double eps = 1e-5);
void layer_norm_backward(BF16View dx, View dweight, View dbias, ConstBF16View dy, ConstBF16View x,
                         ConstView weight, const Axes& axes, double eps = 1e-5, GradMode mode = GradMode::kOverwrite);
void layer_norm_backward(F16View dx, View dweight, View dbias, ConstF16View dy, ConstF16View x, ConstView weight,
                         const Axes& axes, double eps = 1e-5, GradMode mode = GradMode::kOverwrite);
void rms_norm_forward(BF16View y, View rstd, ConstBF16View x, ConstView weight, const Axes& axes,
                      double eps = kRmsNormEps);
void rms_norm_forward(F16View y, View rstd, ConstF16View x, ConstView weight, const Axes& axes,
                      double eps = kRmsNormEps);
void rms_norm_backward(BF16View dx, View dweight, ConstBF16View dy, ConstBF16View x, ConstView weight,
                       const Axes& axes, double eps = kRmsNormEps, GradMode mode = GradMode::kOverwrite);
void rms_norm_backward(F16View dx, View dweight, ConstF16View dy, ConstF16View x, ConstView weight,
                       const Axes& axes, double eps = kRmsNormEps, GradMode mode = GradMode::kOverwrite);
// With NormStats, as for fp32 (the stats are those of the fp32 forward on the widened x; the saved
// backward has the bits of the recomputing one).
void layer_norm_forward(BF16View y, View mean, View rstd, ConstBF16View x, ConstView weight, ConstView bias,
                        const Axes& axes, double eps, NormStats* stats);
void layer_norm_forward(F16View y, View mean, View rstd, ConstF16View x, ConstView weight, ConstView bias,
                        const Axes& axes, double eps, NormStats* stats);
void layer_norm_backward_saved(BF16View dx, View dweight, View dbias, ConstBF16View dy, ConstBF16View x,
                               ConstView weight, const NormStats& stats,
                               GradMode mode = GradMode::kOverwrite);
void layer_norm_backward_saved(F16View dx, View dweight, View dbias, ConstF16View dy, ConstF16View x,
                               ConstView weight, const NormStats& stats,
                               GradMode mode = GradMode::kOverwrite);
void rms_norm_forward(BF16View y, View rstd, ConstBF16View x, ConstView weight, const Axes& axes, double eps,
                      NormStats* stats);
void rms_norm_forward(F16View y, View rstd, ConstF16View x, ConstView weight, const Axes& axes, double eps,
                      NormStats* stats);
void rms_norm_backward_saved(BF16View dx, View dweight, ConstBF16View dy, ConstBF16View x, ConstView weight,
                             const NormStats& stats, GradMode mode = GradMode::kOverwrite);
void rms_norm_backward_saved(F16View dx, View dweight, ConstF16View dy, ConstF16View x, ConstView weight,
                             const NormStats& stats, GradMode mode = GradMode::kOverwrite);

// ---- Fused residual add + norm (pre-norm Transformer blocks) --------------------------------------
//
// Forward, one pass over memory:
//     s = x + residual      (fp32 add; for bf16/fp16 storage rounded once to the storage type)
//     y = norm(s)           (exactly layer_norm_forward / rms_norm_forward applied to the stored s)
//   s:    output, like x: the new residual stream, returned to the caller (written =). It may be
//         x or residual itself (same view: the residual stream updated in place).
//   y:    output, like x (written =); must not overlap s.
//   mean, rstd, weight, bias, axes, eps: as layer_norm_forward.
// fp32: s and y are bitwise those of the unfused composition (add, then layer_norm_forward on s).
//
// Backward. In a block, s feeds two paths: the norm (y = norm(s)) and the skip connection to the next
// residual add. The gradient of the loss with respect to s is the sum of both:
//     dx = dresidual = norm_backward(dy; s) + ds
//   dx:     output, like x (written =): the gradient of x and of residual alike (both are summed into s).
//           It may be ds itself (the residual stream's gradient updated in place) or dy.
//   dy:     the gradient flowing into y (from the sublayer)
//   ds:     optional: the gradient flowing into s from the skip path (undefined = 0)
//   s:      the forward's s (the backward reads s, never x or residual)
//   dweight, dbias, weight, eps, mode: as layer_norm_backward.
// fp32: dx is bitwise the unfused composition (layer_norm_backward, then dx + ds in fp32). bf16/fp16:
// dnorm + ds is added in fp32 and rounded once (the unfused composition would round twice). dγ, dβ are
// bitwise those of layer_norm_backward (fp32: on s; bf16/fp16: on the widened dy and s).
void add_layer_norm_forward(View s, View y, View mean, View rstd, ConstView x, ConstView residual,
                            ConstView weight, ConstView bias, const Axes& axes, double eps = 1e-5);
void add_layer_norm_forward(BF16View s, BF16View y, View mean, View rstd, ConstBF16View x,
                            ConstBF16View residual, ConstView weight, ConstView bias, const Axes& axes,
                            double eps = 1e-5);
void add_layer_norm_forward(F16View s, F16View y, View mean, View rstd, ConstF16View x, ConstF16View residual,
                            ConstView weight, ConstView bias, const Axes& axes, double eps = 1e-5);
void add_layer_norm_backward(View dx, View dweight, View dbias, ConstView dy, ConstView ds, ConstView s,
                             ConstView weight, const Axes& axes, double eps = 1e-5,
                             GradMode mode = GradMode::kOverwrite);
void add_layer_norm_backward(BF16View dx, View dweight, View dbias, ConstBF16View dy, ConstBF16View ds,
                             ConstBF16View s, ConstView weight, const Axes& axes, double eps = 1e-5,
                             GradMode mode = GradMode::kOverwrite);
void add_layer_norm_backward(F16View dx, View dweight, View dbias, ConstF16View dy, ConstF16View ds,
                             ConstF16View s, ConstView weight, const Axes& axes, double eps = 1e-5,
                             GradMode mode = GradMode::kOverwrite);
void add_rms_norm_forward(View s, View y, View rstd, ConstView x, ConstView residual, ConstView weight,
                          const Axes& axes, double eps = kRmsNormEps);
void add_rms_norm_forward(BF16View s, BF16View y, View rstd, ConstBF16View x, ConstBF16View residual,
                          ConstView weight, const Axes& axes, double eps = kRmsNormEps);
void add_rms_norm_forward(F16View s, F16View y, View rstd, ConstF16View x, ConstF16View residual,
                          ConstView weight, const Axes& axes, double eps = kRmsNormEps);
void add_rms_norm_backward(View dx, View dweight, ConstView dy, ConstView ds, ConstView s, ConstView weight,
                           const Axes& axes, double eps = kRmsNormEps, GradMode mode = GradMode::kOverwrite);
void add_rms_norm_backward(BF16View dx, View dweight, ConstBF16View dy, ConstBF16View ds, ConstBF16View s,
                           ConstView weight, const Axes& axes, double eps = kRmsNormEps,
                           GradMode mode = GradMode::kOverwrite);
void add_rms_norm_backward(F16View dx, View dweight, ConstF16View dy, ConstF16View ds, ConstF16View s,
                           ConstView weight, const Axes& axes, double eps = kRmsNormEps,
                           GradMode mode = GradMode::kOverwrite);
// With the statistics of the forward (NormStats above), as layer_norm_backward_saved: the forward fills
// `stats` (not null) with the statistics of the norm of s (bf16/fp16: of the fp32 forward on the widened
// stored s); the backward takes axes and eps from them instead of recomputing the statistics from s, and
// returns bitwise what add_layer_norm_backward / add_rms_norm_backward return (dx with or without ds, dγ,
// dβ). The stats also serve layer_norm_backward_saved / rms_norm_backward_saved on s.
void add_layer_norm_forward(View s, View y, View mean, View rstd, ConstView x, ConstView residual,
                            ConstView weight, ConstView bias, const Axes& axes, double eps, NormStats* stats);
void add_layer_norm_forward(BF16View s, BF16View y, View mean, View rstd, ConstBF16View x,
                            ConstBF16View residual, ConstView weight, ConstView bias, const Axes& axes,
                            double eps, NormStats* stats);
void add_layer_norm_forward(F16View s, F16View y, View mean, View rstd, ConstF16View x, ConstF16View residual,
                            ConstView weight, ConstView bias, const Axes& axes, double eps, NormStats* stats);
void add_layer_norm_backward_saved(View dx, View dweight, View dbias, ConstView dy, ConstView ds, ConstView s,
                                   ConstView weight, const NormStats& stats,
                                   GradMode mode = GradMode::kOverwrite);
void add_layer_norm_backward_saved(BF16View dx, View dweight, View dbias, ConstBF16View dy, ConstBF16View ds,
                                   ConstBF16View s, ConstView weight, const NormStats& stats,
                                   GradMode mode = GradMode::kOverwrite);
void add_layer_norm_backward_saved(F16View dx, View dweight, View dbias, ConstF16View dy, ConstF16View ds,
                                   ConstF16View s, ConstView weight, const NormStats& stats,
                                   GradMode mode = GradMode::kOverwrite);
void add_rms_norm_forward(View s, View y, View rstd, ConstView x, ConstView residual, ConstView weight,
                          const Axes& axes, double eps, NormStats* stats);
void add_rms_norm_forward(BF16View s, BF16View y, View rstd, ConstBF16View x, ConstBF16View residual,
                          ConstView weight, const Axes& axes, double eps, NormStats* stats);
void add_rms_norm_forward(F16View s, F16View y, View rstd, ConstF16View x, ConstF16View residual,
                          ConstView weight, const Axes& axes, double eps, NormStats* stats);
void add_rms_norm_backward_saved(View dx, View dweight, ConstView dy, ConstView ds, ConstView s,
                                 ConstView weight, const NormStats& stats,
                                 GradMode mode = GradMode::kOverwrite);
void add_rms_norm_backward_saved(BF16View dx, View dweight, ConstBF16View dy, ConstBF16View ds,
                                 ConstBF16View s, ConstView weight, const NormStats& stats,
                                 GradMode mode = GradMode::kOverwrite);
void add_rms_norm_backward_saved(F16View dx, View dweight, ConstF16View dy, ConstF16View ds, ConstF16View s,
                                 ConstView weight, const NormStats& stats,
                                 GradMode mode = GradMode::kOverwrite);

// ---- Memory-efficient backward (recompute x̂ from the output) -------------------------------------
//
// The backward without x: x̂ = (y − β)/γ is recovered from the forward's OUTPUT y and the forward's
// saved rstd (Apex's and Triton's "memory_efficient" LayerNorm), so a training step can free x and
// keep only y (which the next layer keeps anyway). Per group:
//     x − mean = (y − β)/(γ·rstd)   (in double, rounded to fp32 once),
//     then dx = rstd·(g − mean(g) − x̂·mean(g·x̂)),  dγ = Σ dy·x̂,  dβ = Σ dy  (RMSNorm: no mean(g), no β)
// with the arithmetic of the standard backward from saved statistics (layer_norm_backward_saved) on
// x − mean, the saved mean 0 and the forward's rstd.
//   dx:      output, like y (written =)
//   dy, y:   inputs, like x; y exactly as the forward wrote it (same weight and bias)
//   rstd:    the forward's rstd output (kept axes), required
//   weight γ, bias β: the forward's; optional (γ = 1, β = 0)
// Failure mode: where γ = 0, y = β carries no information about x and x̂ cannot be recovered: any zero
// entry in γ throws normlab::Error (naming its index); use the backward that reads x there.
// Accuracy: y is rounded to fp32, so x̂ carries an extra error of about ulp(y)/(2|γ|), i.e. relative
// FLT_EPSILON·(|γ·x̂| + |β|)/|γ·x̂|: small |γ| or |β| ≫ |γ·x̂| loses digits that the standard backward
// keeps, and rstd is the forward's fp32 value instead of a double recomputation.
void layer_norm_backward_from_output(View dx, View dweight, View dbias, ConstView dy, ConstView y,
                                     ConstView rstd, ConstView weight, ConstView bias, const Axes& axes,
                                     GradMode mode = GradMode::kOverwrite);
void rms_norm_backward_from_output(View dx, View dweight, ConstView dy, ConstView y, ConstView rstd,
                                   ConstView weight, const Axes& axes, GradMode mode = GradMode::kOverwrite);

}  // namespace normlab
