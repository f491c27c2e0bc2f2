// `normlab norm <kind>`: run one normalization on .npy files, forward and optionally backward.
//
//   normlab norm layer IN.npy -o OUT.npy --axes 1[,2...] [--eps 1e-5] [--weight W.npy] [--bias B.npy]
//                      [--stats-out PREFIX] [--dy DY.npy --dx-out DX.npy [--dweight-out DW.npy]
//                      [--dbias-out DB.npy]] [--threads N]
//
// `norm` is a parent command; each kind (layer today; rms, batch, instance, group, cmvn later) is a
// child that adds its own options (e.g. --axes) to the shared set in common.h and supplies a run
// function: load inputs, check shapes, call the kernels, collect outputs, write them all at the end.
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

}  // namespace

void add_norm_command(CLI::App& app) {
  CLI::App* norm =
      app.add_subcommand("norm", "Run a normalization on .npy files (forward, optionally backward)");
  norm->require_subcommand(1);
  add_layer_command(norm);
}

}  // namespace normlab::cli
