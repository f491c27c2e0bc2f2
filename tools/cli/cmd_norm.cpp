// `normlab norm <kind>`: run one normalization on .npy files, forward and optionally backward.
//
//   normlab norm layer IN.npy -o OUT.npy --axes 1[,2...] [--eps 1e-5] [--weight W.npy] [--bias B.npy]
//                      [--stats-out PREFIX] [--dy DY.npy --dx-out DX.npy [--dweight-out DW.npy]
//                      [--dbias-out DB.npy]] [--threads N]
//   normlab norm rms   IN.npy -o OUT.npy --axes 1[,2...] [--eps 1e-6 | --eps torch] [--weight W.npy]
//                      [--stats-out PREFIX] [--dy DY.npy --dx-out DX.npy [--dweight-out DW.npy]]
//                      [--threads N]
//   normlab norm batch|instance|group ...   see cmd_norm_channel.cpp
//   normlab norm cmvn ...                   see cmd_cmvn.cpp
//
// `norm` is a parent command; each kind is a child that adds its own options (e.g. --axes) to the
// shared set in common.h and supplies a run function: load inputs, check shapes, call the kernels,
// collect outputs, write them all at the end.
#include <normlab/norm.h>

#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "common.h"

namespace normlab::cli {

namespace {

// ---- layer ------------------------------------------------------------------------------------

struct LayerOptions {
  NormOptions io;
  std::vector<std::string> axes;  // raw --axes items, parsed by parse_axes
};

void run_layer(const LayerOptions& opts) {
  const NormOptions& io = opts.io;
  const Axes axes = parse_axes(opts.axes);
  NormInputs in = load_norm_inputs(io);
  const Dims& shape = in.x.shape();
  check_axes(shape, axes);
  const Dims kshape = kept_shape(shape, axes);
  const Dims nshape = normalized_shape(shape, axes);
  const std::string nwhat = "the input's shape at the normalized axes";
  if (in.weight) check_shape("--weight", *in.weight, nshape, nwhat);
  if (in.bias) check_shape("--bias", *in.bias, nshape, nwhat);
  if (in.dy) check_shape("--dy", *in.dy, shape, "the input's shape");

  OutputSet out;
  const bool stats = !io.stats_out.empty();
  Tensor y(shape), mean(stats ? kshape : Dims{0}), rstd(stats ? kshape : Dims{0});
  layer_norm_forward(y.view(), stats ? mean.view() : View{}, stats ? rstd.view() : View{}, in.x.cview(),
                     view_or_none(in.weight), view_or_none(in.bias), axes, io.eps);
  out.add(io.output, std::move(y));
  add_stat_output(out, io, "mean", std::move(mean));
  add_stat_output(out, io, "rstd", std::move(rstd));

  if (io.backward()) {
    const bool want_dw = !io.dweight_out.empty(), want_db = !io.dbias_out.empty();
    Tensor dx(shape), dw(want_dw ? nshape : Dims{0}), db(want_db ? nshape : Dims{0});
    layer_norm_backward(dx.view(), want_dw ? dw.view() : View{}, want_db ? db.view() : View{}, in.dy->cview(),
                        in.x.cview(), view_or_none(in.weight), axes, io.eps);
    out.add(io.dx_out, std::move(dx));
    if (want_dw) out.add(io.dweight_out, std::move(dw));
    if (want_db) out.add(io.dbias_out, std::move(db));
  }
  out.write_all();
}

void add_layer_command(CLI::App* norm) {
  auto opts = std::make_shared<LayerOptions>();
  CLI::App* cmd = norm->add_subcommand(
      "layer", "LayerNorm over --axes: y = γ⊙(x−mean)·rstd + β per group of the normalized axes");
  cmd->footer(
      "--stats-out writes PREFIX.mean.npy and PREFIX.rstd.npy, shaped like the kept axes (x's shape without "
      "the normalized axes). With --dy, the backward pass also runs (normlab::layer_norm_backward). "
      "No file is written unless every computation succeeds.");
  cmd->add_option("--axes", opts->axes,
                  "Axes to normalize over: a comma-separated list (1,2) or repeated (--axes 1 --axes 2); "
                  "negative axes count from the end")
      ->required()
      ->delimiter(',')
      ->allow_extra_args(false)
      ->type_name("AXES");
  add_norm_io_options(cmd, opts->io);
  cmd->callback([opts] { run_layer(*opts); });
}

// ---- rms --------------------------------------------------------------------------------------

struct RmsOptions {
  NormOptions io;
  std::vector<std::string> axes;
};

void run_rms(const RmsOptions& opts) {
  const NormOptions& io = opts.io;
  const Axes axes = parse_axes(opts.axes);
  NormInputs in = load_norm_inputs(io);
  const Dims& shape = in.x.shape();
  check_axes(shape, axes);
  const Dims kshape = kept_shape(shape, axes);
  const Dims nshape = normalized_shape(shape, axes);
  if (in.weight) check_shape("--weight", *in.weight, nshape, "the input's shape at the normalized axes");
  if (in.dy) check_shape("--dy", *in.dy, shape, "the input's shape");

  OutputSet out;
  const bool stats = !io.stats_out.empty();
  Tensor y(shape), rstd(stats ? kshape : Dims{0});
  rms_norm_forward(y.view(), stats ? rstd.view() : View{}, in.x.cview(), view_or_none(in.weight), axes,
                   io.eps);
  out.add(io.output, std::move(y));
  add_stat_output(out, io, "rstd", std::move(rstd));

  if (io.backward()) {
    const bool want_dw = !io.dweight_out.empty();
    Tensor dx(shape), dw(want_dw ? nshape : Dims{0});
    rms_norm_backward(dx.view(), want_dw ? dw.view() : View{}, in.dy->cview(), in.x.cview(),
                      view_or_none(in.weight), axes, io.eps);
    out.add(io.dx_out, std::move(dx));
    if (want_dw) out.add(io.dweight_out, std::move(dw));
  }
  out.write_all();
}

void add_rms_command(CLI::App* norm) {
  auto opts = std::make_shared<RmsOptions>();
  opts->io.eps = kRmsNormEps;
  CLI::App* cmd = norm->add_subcommand(
      "rms", "RMSNorm over --axes: y = x·rstd·γ with rstd = 1/sqrt(mean(x²) + eps); no centring, no bias");
  cmd->footer(
      "The default eps is normlab's 1e-6; --eps torch is PyTorch's nn.RMSNorm default (eps=None: FLT_EPSILON "
      "for float32). --stats-out writes PREFIX.rstd.npy, shaped like the kept axes. With --dy, the backward "
      "pass also runs (normlab::rms_norm_backward). No file is written unless every computation succeeds.");
  cmd->add_option("--axes", opts->axes,
                  "Axes to normalize over: a comma-separated list (1,2) or repeated (--axes 1 --axes 2); "
                  "negative axes count from the end")
      ->required()
      ->delimiter(',')
      ->allow_extra_args(false)
      ->type_name("AXES");
  NormFlags flags;
  flags.eps_torch = true;
  flags.bias = false;
  flags.stats_help = "Also write 1/sqrt(mean(x²) + eps) as PREFIX.rstd.npy";
  add_norm_io_options(cmd, opts->io, flags);
  cmd->callback([opts] { run_rms(*opts); });
}

}  // namespace

void add_norm_command(CLI::App& app) {
  CLI::App* norm =
      app.add_subcommand("norm", "Run a normalization on .npy files (forward, optionally backward)");
  norm->require_subcommand(1);
  add_layer_command(norm);
  add_rms_command(norm);
  add_norm_channel_commands(norm);
  add_norm_cmvn_command(norm);
}

}  // namespace normlab::cli
