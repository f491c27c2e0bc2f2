// Helpers shared by the normlab subcommands (see common.h): axis lists, .npy inputs and outputs, and
// the option set common to every `normlab norm <kind>` command.
#include "common.h"

#include <normlab/error.h>
#include <normlab/npy.h>
#include <normlab/parallel.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>
#include <utility>

namespace normlab::cli {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

Axes parse_axes(const std::vector<std::string>& items, const std::string& option) {
  Axes axes;
  for (const std::string& item : items) {
    std::string_view rest = item;
    for (;;) {
      const std::size_t comma = rest.find(',');
      const std::string_view tok = trim(rest.substr(0, comma));
      int value = 0;
      const char* end = tok.data() + tok.size();
      const auto [ptr, ec] = std::from_chars(tok.data(), end, value);
      NL_CHECK(!tok.empty() && ec == std::errc() && ptr == end,
               "{}: '{}' is not an integer axis (expected a comma-separated list such as 1,2 or -1)", option,
               tok);
      axes.push_back(value);
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  NL_CHECK(!axes.empty(), "{}: no axes given", option);
  return axes;
}

void check_axes(const Dims& shape, const Axes& axes, const std::string& option) {
  const int rank = shape.size();
  NL_CHECK(rank >= 1, "{}: the input is a scalar (rank 0); there is no axis to normalize over", option);
  std::vector<int> given_as(static_cast<std::size_t>(rank), std::numeric_limits<int>::min());
  for (int a : axes) {
    NL_CHECK(a >= -rank && a < rank, "{}: axis {} is out of range for an input of shape {} (valid: {}..{})",
             option, a, shape.str(), -rank, rank - 1);
    const auto k = static_cast<std::size_t>(a < 0 ? a + rank : a);
    NL_CHECK(given_as[k] == std::numeric_limits<int>::min(),
             "{}: axis {} is given twice ({} and {} both name it for an input of shape {})", option, k,
             given_as[k], a, shape.str());
    given_as[k] = a;
  }
}

void check_shape(const std::string& option, const Tensor& t, const Dims& expected, const std::string& what) {
  NL_CHECK(t.shape() == expected, "{} has shape {}, but {} is {}", option, t.shape().str(), what,
           expected.str());
}

Tensor load_tensor(const std::string& path, const std::string& role) {
  try {
    return load_npy(path);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", role, e.what()));
  }
}

std::optional<Tensor> load_optional(const std::string& path, const std::string& role) {
  if (path.empty()) return std::nullopt;
  return load_tensor(path, role);
}

ConstView view_or_none(const std::optional<Tensor>& t) {
  return t ? t->cview() : ConstView{};
}

void check_eps(double eps, const std::string& option) {
  NL_CHECK(std::isfinite(eps) && eps >= 0, "{} must be finite and ≥ 0, got {}", option, eps);
}

void add_norm_io_options(CLI::App* cmd, NormOptions& opts, const NormFlags& flags) {
  cmd->add_option("input", opts.input, "Input tensor x (.npy, float32 or float64)")
      ->required()
      ->type_name("IN.npy");
  cmd->add_option("-o,--output", opts.output, "Where to write y (.npy, float32)")
      ->required()
      ->type_name("OUT.npy");
  if (flags.eps) {
    CLI::Option* eps =
        cmd->add_option("--eps", opts.eps, "Added to the variance inside the square root (≥ 0)")
            ->capture_default_str();
    if (flags.eps_torch) {
      // The word is replaced by the number before CLI11 converts it; 2^-23 prints exactly.
      eps->description(
             "Added to the mean square inside the square root (≥ 0), or `torch` for PyTorch's default "
             "(FLT_EPSILON = 1.1920928955078125e-07)")
          ->transform(CLI::Transformer({{"torch", fmt::format("{:.17g}", kTorchRmsNormEps)}}));
    } else {
      eps->check(CLI::Validator(
          [](std::string& v) -> std::string {
            return v == "torch"
                       ? "`torch` (PyTorch's RMSNorm default) is accepted only by `normlab norm rms`; "
                         "give a number"
                       : std::string();
          },
          "", "no torch"));
    }
  }
  if (flags.weight)
    cmd->add_option("--weight", opts.weight, "Scale γ (.npy), " + flags.param_shape)->type_name("W.npy");
  if (flags.bias)
    cmd->add_option("--bias", opts.bias, "Shift β (.npy), " + flags.param_shape)->type_name("B.npy");
  if (flags.stats) cmd->add_option("--stats-out", opts.stats_out, flags.stats_help)->type_name("PREFIX");
  auto* bwd = cmd->add_option_group("backward", "Backward pass (runs when --dy is given)");
  bwd->add_option("--dy", opts.dy, "Upstream gradient dL/dy (.npy), shaped like x; needs --dx-out")
      ->type_name("DY.npy");
  bwd->add_option("--dx-out", opts.dx_out, "Where to write dL/dx (.npy); needs --dy")->type_name("DX.npy");
  if (flags.weight)
    bwd->add_option("--dweight-out", opts.dweight_out, "Where to write dL/dγ (.npy); needs --dy")
        ->type_name("DW.npy");
  if (flags.bias)
    bwd->add_option("--dbias-out", opts.dbias_out, "Where to write dL/dβ (.npy); needs --dy")
        ->type_name("DB.npy");
  cmd->add_option_function<int>(
         "--threads", [&opts](const int& n) { opts.threads = n; },
         "Threads for the kernels (≥ 1; default: all cores). Results do not depend on it")
      ->type_name("N");
}

void OutputSet::add(std::string path, Tensor t) {
  items_.emplace_back(std::move(path), std::move(t));
}

void OutputSet::write_all() const {
  for (const auto& [path, t] : items_) save_npy(path, t.cview());
}

NormInputs load_norm_inputs(const NormOptions& opts) {
  check_eps(opts.eps);
  NL_CHECK(opts.dx_out.empty() || !opts.dy.empty(),
           "--dx-out needs --dy: the backward pass needs the upstream gradient dL/dy");
  NL_CHECK(opts.dy.empty() || !opts.dx_out.empty(),
           "--dy needs --dx-out: say where to write the input gradient dL/dx");
  NL_CHECK(opts.dweight_out.empty() || !opts.dy.empty(), "--dweight-out needs --dy (and --dx-out)");
  NL_CHECK(opts.dbias_out.empty() || !opts.dy.empty(), "--dbias-out needs --dy (and --dx-out)");
  if (opts.threads) {
    NL_CHECK(*opts.threads >= 1, "--threads must be at least 1, got {}", *opts.threads);
    set_num_threads(*opts.threads);
  }
  NormInputs in;
  in.x = load_tensor(opts.input, "input");
  in.weight = load_optional(opts.weight, "--weight");
  in.bias = load_optional(opts.bias, "--bias");
  in.dy = load_optional(opts.dy, "--dy");
  return in;
}

void add_stat_output(OutputSet& out, const NormOptions& opts, const std::string& name, Tensor t) {
  if (!opts.stats_out.empty()) out.add(opts.stats_out + "." + name + ".npy", std::move(t));
}

std::vector<Index> load_lengths(const std::string& path, const std::string& role) {
  try {
    return load_npy_index(path);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", role, e.what()));
  }
}

void check_lengths(std::span<const Index> lengths, Index batch, Index frames, const std::string& batch_what,
                   const std::string& time_what, const std::string& role) {
  NL_CHECK(static_cast<Index>(lengths.size()) == batch, "{} has {} entries, but there are {} {}", role,
           lengths.size(), batch, batch_what);
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    NL_CHECK(lengths[i] >= 0, "{}: length {} of item {} is negative", role, lengths[i], i);
    NL_CHECK(lengths[i] <= frames, "{}: length {} of item {} is longer than the time axis ({}: {} frames)",
             role, lengths[i], i, time_what, frames);
  }
}

void check_unused(const std::string& value, const std::string& flag, const std::string& why) {
  NL_CHECK(value.empty(), "{} {}", flag, why);
}

}  // namespace normlab::cli
