// `normlab norm batch|instance|group`: the channel-norm family of normlab/norm.h on .npy files.
//
//   normlab norm batch    IN.npy -o OUT.npy [--channel-axis 1] [--eps 1e-5] [--weight W.npy] [--bias B.npy]
//                         [--train | --eval] [--momentum 0.1 | --momentum none] [--onnx]
//                         [--running-mean RM.npy --running-var RV.npy] [--num-batches-tracked N]
//                         [--running-mean-out RM2.npy] [--running-var-out RV2.npy]
//                         [--lengths L.npy [--time-axis -1]] [--stats-out PREFIX]
//                         [--dy DY.npy --dx-out DX.npy [--dweight-out DW.npy] [--dbias-out DB.npy]]
//                         [--threads N]
//   normlab norm instance IN.npy -o OUT.npy [--channel-axis 1] [--eps 1e-5] [--weight W.npy] [--bias B.npy]
//                         [--lengths L.npy [--time-axis -1]] [--stats-out PREFIX] [--dy ... (as batch)]
//   normlab norm group    IN.npy -o OUT.npy --groups G [--channel-axis 1] [--eps 1e-5] [--weight W.npy]
//                         [--bias B.npy] [--stats-out PREFIX] [--dy ... (as batch)]
//
// x is [B..., C, S...] around --channel-axis; weight, bias, running statistics and parameter gradients
// are [C]. --stats-out writes PREFIX.mean.npy and PREFIX.rstd.npy: the saved statistics of the forward
// pass ([C] for batch, [B..., C] for instance, [B..., G] for group).
#include <normlab/error.h>
#include <normlab/norm.h>

#include <charconv>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "common.h"

namespace normlab::cli {

namespace {

enum class Kind { kBatch, kInstance, kGroup };

struct ChannelOptions {
  Kind kind = Kind::kBatch;
  NormOptions io;
  int channel_axis = 1;
  // batch and instance
  std::string lengths;
  int time_axis = -1;
  // group
  int groups = 0;
  // batch
  bool train = false, eval = false;
  std::string momentum;  // empty: the default (0.1, or 0.9 with --onnx); "none": cumulative average
  bool onnx = false;
  std::string running_mean, running_var, running_mean_out, running_var_out;
  Index num_batches_tracked = 0;
};

std::optional<double> parse_momentum(const std::string& text, bool onnx) {
  if (text.empty()) return onnx ? 0.9 : 0.1;
  if (text == "none") return std::nullopt;
  double m = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, m);
  NL_CHECK(ec == std::errc() && ptr == end, "--momentum must be a number in [0, 1] or `none`, got '{}'",
           text);
  NL_CHECK(m >= 0 && m <= 1, "--momentum must be in [0, 1] (or `none`), got {}", text);
  return m;
}

void run_channel(const ChannelOptions& o) {
  const NormOptions& io = o.io;
  const bool is_batch = o.kind == Kind::kBatch;
  const bool training = !o.eval;
  const bool have_running = !o.running_mean.empty() || !o.running_var.empty();
  // Flag combinations first: nothing is read before they make sense.
  BatchNormOptions bopt = o.onnx ? BatchNormOptions::onnx() : BatchNormOptions{};
  if (is_batch) {
    bopt.momentum = parse_momentum(o.momentum, o.onnx);
    NL_CHECK(o.running_mean.empty() == o.running_var.empty(),
             "--running-mean and --running-var go together: give both or neither");
    NL_CHECK(
        training || have_running,
        "--eval needs --running-mean RM.npy and --running-var RV.npy: eval mode normalizes with the running "
        "statistics");
    NL_CHECK(
        training || (o.running_mean_out.empty() && o.running_var_out.empty()),
        "--running-mean-out/--running-var-out need training: --eval does not update the running statistics");
    NL_CHECK(o.num_batches_tracked >= 0, "--num-batches-tracked must be ≥ 0, got {}", o.num_batches_tracked);
  }
  if (o.kind == Kind::kGroup) NL_CHECK(o.groups >= 1, "--groups must be at least 1, got {}", o.groups);

  NormInputs in = load_norm_inputs(io);
  std::optional<Tensor> rm_in = load_optional(o.running_mean, "--running-mean");
  std::optional<Tensor> rv_in = load_optional(o.running_var, "--running-var");
  std::optional<std::vector<Index>> lengths;
  if (!o.lengths.empty()) lengths = load_lengths(o.lengths);

  // Geometry: x = [B..., C, S...].
  const Dims& shape = in.x.shape();
  check_axes(shape, {o.channel_axis}, "--channel-axis");
  const int ca = o.channel_axis < 0 ? o.channel_axis + shape.size() : o.channel_axis;
  const Index C = shape[ca];
  const std::string cwhat =
      fmt::format("the channel count (axis {} of the input of shape {})", ca, shape.str());
  if (o.kind == Kind::kGroup)
    NL_CHECK(C % o.groups == 0,
             "--groups {} does not divide the {} channels (axis {} of the input of shape {})", o.groups, C,
             ca, shape.str());
  for (const auto& [opt, t] : {std::pair{"--weight", &in.weight}, std::pair{"--bias", &in.bias},
                               std::pair{"--running-mean", &rm_in}, std::pair{"--running-var", &rv_in}})
    if (*t) check_shape(opt, **t, Dims{C}, cwhat);
  if (in.dy) check_shape("--dy", *in.dy, shape, "the input's shape");
  if (lengths) {
    check_axes(shape, {o.time_axis}, "--time-axis");
    const int ta = o.time_axis < 0 ? o.time_axis + shape.size() : o.time_axis;
    NL_CHECK(ta > ca, "--time-axis {} must come after --channel-axis {} (input of shape {})", o.time_axis,
             o.channel_axis, shape.str());
    Index B = 1;
    for (int i = 0; i < ca; ++i) B *= shape[i];
    check_lengths(*lengths, B, shape[ta],
                  fmt::format("batch items (the axes before --channel-axis {} of the input of shape {})",
                              o.channel_axis, shape.str()),
                  fmt::format("--time-axis {}", o.time_axis));
  }
  const std::span<const Index> len = lengths ? std::span<const Index>(*lengths) : std::span<const Index>{};

  OutputSet out;
  const bool stats = !io.stats_out.empty();
  const Dims sshape = is_batch                    ? Dims{C}
                      : o.kind == Kind::kInstance ? instance_stats_shape(shape, o.channel_axis)
                                                  : group_stats_shape(shape, o.groups, o.channel_axis);
  Tensor y(shape), mean(stats ? sshape : Dims{0}), rstd(stats ? sshape : Dims{0});
  const View mean_v = stats ? mean.view() : View{}, rstd_v = stats ? rstd.view() : View{};
  InstanceNormOptions iopt;
  iopt.channel_axis = o.channel_axis;
  iopt.eps = io.eps;
  iopt.time_axis = o.time_axis;
  GroupNormOptions gopt;
  gopt.channel_axis = o.channel_axis;
  gopt.eps = io.eps;
  bopt.channel_axis = o.channel_axis;
  bopt.eps = io.eps;
  bopt.training = training;
  bopt.time_axis = o.time_axis;

  if (is_batch) {
    // Training tracks running statistics when they are given or asked for; without input files they
    // start as PyTorch initializes them (mean 0, var 1). Eval reads them.
    const bool track = have_running || !o.running_mean_out.empty() || !o.running_var_out.empty();
    Tensor rm(Dims{track ? C : 0}), rv(Dims{track ? C : 0});
    if (have_running) {
      rm = rm_in->clone();
      rv = rv_in->clone();
    } else {
      for (Index c = 0; c < rv.numel(); ++c) rv[c] = 1.0f;
    }
    Index nbt = o.num_batches_tracked;
    batch_norm_forward(y.view(), mean_v, rstd_v, track ? rm.view() : View{}, track ? rv.view() : View{},
                       track && training ? &nbt : nullptr, in.x.cview(), view_or_none(in.weight),
                       view_or_none(in.bias), len, bopt);
    if (!o.running_mean_out.empty()) out.add(o.running_mean_out, std::move(rm));
    if (!o.running_var_out.empty()) out.add(o.running_var_out, std::move(rv));
  } else if (o.kind == Kind::kInstance) {
    instance_norm_forward(y.view(), mean_v, rstd_v, in.x.cview(), view_or_none(in.weight),
                          view_or_none(in.bias), len, iopt);
  } else {
    group_norm_forward(y.view(), mean_v, rstd_v, in.x.cview(), view_or_none(in.weight), view_or_none(in.bias),
                       o.groups, gopt);
  }
  out.add(io.output, std::move(y));
  add_stat_output(out, io, "mean", std::move(mean));
  add_stat_output(out, io, "rstd", std::move(rstd));

  if (io.backward()) {
    const bool want_dw = !io.dweight_out.empty(), want_db = !io.dbias_out.empty();
    Tensor dx(shape), dw(Dims{want_dw ? C : 0}), db(Dims{want_db ? C : 0});
    const View dw_v = want_dw ? dw.view() : View{}, db_v = want_db ? db.view() : View{};
    const ConstView dy = in.dy->cview(), x = in.x.cview(), w = view_or_none(in.weight);
    if (is_batch)
      // Eval: the statistics are the (input) running ones; training recomputes the batch statistics.
      batch_norm_backward(dx.view(), dw_v, db_v, dy, x, w, view_or_none(rm_in), view_or_none(rv_in), len,
                          bopt);
    else if (o.kind == Kind::kInstance)
      instance_norm_backward(dx.view(), dw_v, db_v, dy, x, w, len, iopt);
    else
      group_norm_backward(dx.view(), dw_v, db_v, dy, x, w, o.groups, gopt);
    out.add(io.dx_out, std::move(dx));
    if (want_dw) out.add(io.dweight_out, std::move(dw));
    if (want_db) out.add(io.dbias_out, std::move(db));
  }
  out.write_all();
}

// Options every channel norm has: the channel axis and the shared set (eps, affine, stats, backward).
std::shared_ptr<ChannelOptions> add_channel_options(CLI::App* cmd, Kind kind, const std::string& stats_help) {
  auto opts = std::make_shared<ChannelOptions>();
  opts->kind = kind;
  cmd->add_option("--channel-axis", opts->channel_axis,
                  "The channel axis C of x (negative counts from the end); the axes before it are the batch")
      ->capture_default_str();
  NormFlags flags;
  flags.param_shape = "of shape [C] (one per channel)";
  flags.stats_help = stats_help;
  add_norm_io_options(cmd, opts->io, flags);
  return opts;
}

void add_lengths_options(CLI::App* cmd, ChannelOptions& o) {
  cmd->add_option(
         "--lengths", o.lengths,
         "Real lengths along --time-axis, one per batch item (.npy of integers); frames at t >= length "
         "are padding: excluded from the statistics, written 0 in y and dx")
      ->type_name("L.npy");
  cmd->add_option("--time-axis", o.time_axis, "The padded axis for --lengths; must come after --channel-axis")
      ->capture_default_str();
}

void add_batch_command(CLI::App* norm) {
  CLI::App* cmd = norm->add_subcommand(
      "batch",
      "BatchNorm: one group per channel over all batch items and positions (PyTorch BatchNorm1d/2d/3d)");
  cmd->footer(
      "Training (--train, the default) normalizes with the batch statistics and, when running statistics are "
      "given (--running-mean/--running-var) or asked for (--running-mean-out/--running-var-out; they then "
      "start "
      "at PyTorch's mean 0, var 1), updates them: PyTorch: running = (1-m)*running + m*batch with the "
      "unbiased "
      "variance; --onnx: running = m*running + (1-m)*batch with the population variance and a default m of "
      "0.9; --momentum none: cumulative average over --num-batches-tracked + 1 batches. --eval normalizes "
      "with the running statistics (required). --stats-out writes PREFIX.mean.npy and PREFIX.rstd.npy [C]: "
      "the statistics used. No file is written unless every computation succeeds.");
  auto opts = add_channel_options(cmd, Kind::kBatch,
                                  "Also write the statistics used as PREFIX.mean.npy and "
                                  "PREFIX.rstd.npy, shape [C]");
  auto* train = cmd->add_flag("--train", opts->train, "Training mode: batch statistics (the default)");
  cmd->add_flag("--eval", opts->eval, "Eval mode: normalize with --running-mean/--running-var")
      ->excludes(train);
  cmd->add_option("--momentum", opts->momentum,
                  "Weight of the new batch statistic (default 0.1; with --onnx the weight of the old value, "
                  "default 0.9), or `none` for a cumulative average")
      ->type_name("M|none");
  cmd->add_flag("--onnx", opts->onnx,
                "ONNX BatchNormalization convention for the running statistics (see below)");
  cmd->add_option("--running-mean", opts->running_mean,
                  "Running mean [C] (.npy): read in eval, updated in training")
      ->type_name("RM.npy");
  cmd->add_option("--running-var", opts->running_var, "Running variance [C] (.npy), with --running-mean")
      ->type_name("RV.npy");
  cmd->add_option("--running-mean-out", opts->running_mean_out, "Where to write the updated running mean")
      ->type_name("RM.npy");
  cmd->add_option("--running-var-out", opts->running_var_out, "Where to write the updated running variance")
      ->type_name("RV.npy");
  cmd->add_option("--num-batches-tracked", opts->num_batches_tracked,
                  "Batches seen before this one (for --momentum none)")
      ->capture_default_str();
  add_lengths_options(cmd, *opts);
  cmd->callback([opts] { run_channel(*opts); });
}

void add_instance_command(CLI::App* norm) {
  CLI::App* cmd = norm->add_subcommand(
      "instance",
      "InstanceNorm: one group per (batch item, channel) over the positions after the channel axis");
  cmd->footer(
      "No running statistics (PyTorch's default track_running_stats=False). --stats-out writes "
      "PREFIX.mean.npy "
      "and PREFIX.rstd.npy shaped [axes before C..., C]; with --lengths an item of length 0 gets 0 there and "
      "in y. No file is written unless every computation succeeds.");
  auto opts = add_channel_options(cmd, Kind::kInstance,
                                  "Also write the statistics as PREFIX.mean.npy and "
                                  "PREFIX.rstd.npy, shape [axes before C..., C]");
  add_lengths_options(cmd, *opts);
  cmd->callback([opts] { run_channel(*opts); });
}

void add_group_command(CLI::App* norm) {
  CLI::App* cmd = norm->add_subcommand(
      "group",
      "GroupNorm: one group per (batch item, G consecutive channel groups) over those channels' positions");
  cmd->footer(
      "--groups must divide the channel count. --stats-out writes PREFIX.mean.npy and PREFIX.rstd.npy shaped "
      "[axes before C..., G]. No file is written unless every computation succeeds.");
  auto opts = add_channel_options(cmd, Kind::kGroup,
                                  "Also write the statistics as PREFIX.mean.npy and "
                                  "PREFIX.rstd.npy, shape [axes before C..., G]");
  cmd->add_option("--groups", opts->groups, "Number of groups G (must divide the channel count)")
      ->required()
      ->type_name("G");
  cmd->callback([opts] { run_channel(*opts); });
}

}  // namespace

void add_norm_channel_commands(CLI::App* norm) {
  add_batch_command(norm);
  add_instance_command(norm);
  add_group_command(norm);
}

}  // namespace normlab::cli
