// Helpers shared by the normlab subcommands: parsing axis lists, loading required and optional .npy
// inputs, writing outputs, and the option set every `normlab norm <kind>` command has in common
// (input, output, eps, affine parameters, statistics, backward pass, threads).
//
// A new norm kind registers itself in cmd_norm.cpp with add_norm_io_options() and, in its callback,
// calls load_norm_inputs(), runs its kernels, and collects the results in an OutputSet that is written
// only once everything has succeeded. Everything here
// reports bad input by throwing normlab::Error; main.cpp turns that into "normlab: error: ..." and
// exit code 1.
#pragma once

#include <normlab/norm.h>
#include <normlab/tensor.h>

#include <CLI/CLI.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace normlab::cli {

// Parses axis lists such as {"1,2", "-1"} (each item may hold several comma-separated integers) into
// Axes. Throws normlab::Error naming `option` for an empty list or a token that is not an integer.
// Range and duplicate checks are left to the kernels, which know the tensor's rank.
Axes parse_axes(const std::vector<std::string>& items, const std::string& option = "--axes");

// Checks `axes` against an input of shape `shape` with messages that name `option`: every axis in
// range (negative counts from the end) and none given twice.
void check_axes(const Dims& shape, const Axes& axes, const std::string& option = "--axes");

// Throws normlab::Error unless `t` (loaded from option `option`) has shape `expected`; `what` names
// the expected shape: "--weight has shape [5], but <what> is [4]".
void check_shape(const std::string& option, const Tensor& t, const Dims& expected, const std::string& what);

// Loads a float .npy file; `role` ("input", "--weight", ...) prefixes any error message.
Tensor load_tensor(const std::string& path, const std::string& role);
// As load_tensor, or std::nullopt when `path` is empty (the option was not given).
std::optional<Tensor> load_optional(const std::string& path, const std::string& role);
// The tensor's view, or an undefined view ("not given") for std::nullopt.
ConstView view_or_none(const std::optional<Tensor>& t);

// Throws normlab::Error unless eps is finite and ≥ 0 (checked before any file is read).
void check_eps(double eps, const std::string& option = "--eps");

// The options of every `normlab norm <kind>` command.
struct NormOptions {
  std::string input;           // positional IN.npy
  std::string output;          // -o OUT.npy
  double eps = 1e-5;           // --eps
  std::string weight;          // --weight W.npy (optional)
  std::string bias;            // --bias B.npy (optional)
  std::string stats_out;       // --stats-out PREFIX: PREFIX.<name>.npy per statistic (optional)
  std::string dy;              // --dy DY.npy: runs the backward pass (needs --dx-out)
  std::string dx_out;          // --dx-out DX.npy
  std::string dweight_out;     // --dweight-out DW.npy (needs --dy)
  std::string dbias_out;       // --dbias-out DB.npy (needs --dy)
  std::optional<int> threads;  // --threads N (not given: keep the default)

  bool backward() const { return !dy.empty(); }
};

// Which options of NormOptions a command offers (add_norm_io_options registers only these; CLI11 then
// rejects the others as unexpected arguments). The defaults are the full LayerNorm set.
struct NormFlags {
  bool eps = true;         // --eps
  bool eps_torch = false;  // --eps also accepts the word `torch` (PyTorch's RMSNorm default, FLT_EPSILON)
  bool weight = true;      // --weight (and --dweight-out)
  bool bias = true;        // --bias (and --dbias-out)
  bool stats = true;       // --stats-out
  std::string param_shape = "shaped like the normalized axes";  // help text of --weight / --bias
  std::string stats_help =
      "Also write the statistics as PREFIX.<name>.npy (e.g. PREFIX.mean.npy, PREFIX.rstd.npy)";
};

// Registers the options of NormOptions on `cmd` (the caller keeps `opts` alive, e.g. in a shared_ptr
// captured by the command's callback). The default of --eps shown in --help is opts.eps at the time of
// the call. Without flags.eps_torch, `--eps torch` is rejected with a message that points to `norm rms`.
void add_norm_io_options(CLI::App* cmd, NormOptions& opts, const NormFlags& flags = {});

// The loaded inputs of a norm command.
struct NormInputs {
  Tensor x;
  std::optional<Tensor> weight, bias, dy;
};

// Named outputs waiting to be written; nothing is written until every computation has succeeded, so
// a failing command leaves no partial results behind.
class OutputSet {
 public:
  void add(std::string path, Tensor t);
  void write_all() const;  // save_npy for each, in the order added

 private:
  std::vector<std::pair<std::string, Tensor>> items_;
};

// Validates the flag combinations (eps, backward flags, threads), applies --threads, and loads every
// input file named in `opts`.
NormInputs load_norm_inputs(const NormOptions& opts);

// Adds PREFIX.<name>.npy to `out` when --stats-out was given.
void add_stat_output(OutputSet& out, const NormOptions& opts, const std::string& name, Tensor t);

// Loads per-sequence lengths (.npy of integers, or floats holding exact integers; flattened) for
// option `role` ("--lengths").
std::vector<Index> load_lengths(const std::string& path, const std::string& role = "--lengths");

// Throws normlab::Error (messages name `role`) unless `lengths` has exactly `batch` entries, each in
// [0, frames]. `batch_what` and `time_what` describe the batch items and the time axis of the input,
// e.g. "batch items (the axes before --channel-axis 1 of x of shape [2, 3, 8])" and "--time-axis -1".
void check_lengths(std::span<const Index> lengths, Index batch, Index frames, const std::string& batch_what,
                   const std::string& time_what, const std::string& role = "--lengths");

// Throws normlab::Error unless `option` (e.g. "--running-mean-out") is empty; `why` completes
// "<flag> <why>".
void check_unused(const std::string& value, const std::string& flag, const std::string& why);

}  // namespace normlab::cli
