// CMVN on the command line (normlab/cmvn.h):
//
//   normlab norm cmvn IN.npy -o OUT.npy --mode global|utterance|sliding|online [--stats S.npy|S.json]
//                     [--norm-vars] [--norm-means | --no-norm-means] [--window 600] [--min-window 100]
//                     [--center] [--time-axis 0] [--lengths L.npy] [--dy DY.npy --dx-out DX.npy]
//                     [--threads N]
//   normlab cmvn-stats [FILES.npy...] [--list FILES.txt] [-o STATS.npy] [--json STATS.json] [--time-axis 0]
//
// IN is one utterance, [T, D] (--time-axis 0) or [D, T] (--time-axis 1), or a batch [B, T, D] / [B, D, T]
// (utterance, sliding and online modes; with --lengths L.npy of B integers the frames t ≥ L[b] are padding
// and are written 0; without it every sequence has all T frames).
//   global     Kaldi apply-cmvn with the given stats (Kaldi 2×(D+1) .npy or WeNet JSON)
//   utterance  stats from each utterance itself (apply_cmvn_per_utterance / apply_cmvn_masked)
//   sliding    Kaldi apply-cmvn-sliding (sliding_cmvn / sliding_cmvn_masked)
//   online     StreamingCmvn fed one frame at a time: the CAUSAL window [max(0, t − window), t]
//              (no look-ahead, so --min-window must be 0 or 1; default 0; --center is refused)
// Backward (--dy/--dx-out) exists for global (apply_cmvn_backward) and utterance
// (apply_cmvn_per_utterance_backward / apply_cmvn_masked_backward).
#include <normlab/cmvn.h>
#include <normlab/error.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "common.h"

namespace normlab::cli {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Kaldi .npy or WeNet .json, by extension.
CmvnStats load_stats(const std::string& path, const std::string& role) {
  try {
    return ends_with(path, ".json") ? CmvnStats::load_wenet_json(path) : CmvnStats::load_kaldi_npy(path);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", role, e.what()));
  }
}

// --time-axis of a [T, D] / [D, T] feature matrix: 0 or 1 (−2 and −1 count from the end).
int check_feature_time_axis(int time_axis) {
  NL_CHECK(time_axis >= -2 && time_axis <= 1,
           "--time-axis must be 0 (features [T, D]) or 1 (features [D, T]), got {}", time_axis);
  return time_axis < 0 ? time_axis + 2 : time_axis;
}

// ---- norm cmvn ----------------------------------------------------------------------------------

struct CmvnCliOptions {
  NormOptions io;  // input, output, backward flags, threads
  std::string mode;
  std::string stats;
  bool norm_vars = false;
  bool norm_means = true;
  std::optional<int> window, min_window;
  bool center = false;
  int time_axis = 0;
  std::string lengths;
};

void check_mode_flags(const CmvnCliOptions& o) {
  const bool sliding = o.mode == "sliding" || o.mode == "online";
  const std::string mode = "--mode " + o.mode;
  if (o.mode == "global")
    NL_CHECK(!o.stats.empty(), "--mode global needs --stats S.npy (Kaldi layout) or S.json (WeNet)");
  else
    NL_CHECK(o.stats.empty(), "--stats is used only by --mode global ({} computes its own statistics)", mode);
  if (!sliding) {
    NL_CHECK(!o.window, "--window applies only to --mode sliding and online, not {}", mode);
    NL_CHECK(!o.min_window, "--min-window applies only to --mode sliding and online, not {}", mode);
    NL_CHECK(!o.center, "--center applies only to --mode sliding, not {}", mode);
  } else {
    NL_CHECK(o.norm_means,
             "--no-norm-means applies only to --mode global and utterance ({} always "
             "subtracts the window mean)",
             mode);
    NL_CHECK(!o.io.backward(), "--dy: {} has no backward pass (only --mode global and utterance have one)",
             mode);
  }
  if (o.mode == "online") {
    NL_CHECK(!o.center,
             "--center: --mode online is causal (a centred window looks ahead); use --mode sliding");
    NL_CHECK(!o.min_window || *o.min_window <= 1,
             "--min-window {}: --mode online is causal and needs --min-window 0 or 1 (Kaldi's min_cmn_window "
             "looks ahead at the start); use --mode sliding for the look-ahead",
             *o.min_window);
  }
  NL_CHECK(o.norm_means || !o.norm_vars, "--norm-vars needs --norm-means (as in Kaldi apply-cmvn)");
  if (o.window) NL_CHECK(*o.window >= 1, "--window must be at least 1, got {}", *o.window);
  if (o.min_window) NL_CHECK(*o.min_window >= 0, "--min-window must be ≥ 0, got {}", *o.min_window);
  NL_CHECK(
      o.mode != "global" || o.lengths.empty(),
      "--lengths applies to --mode utterance, sliding and online (a batch [B, T, D]); --mode global takes "
      "one utterance [T, D]");
}

// One utterance through StreamingCmvn, frame by frame. x, y: [T, D] per time axis ta (0 or 1).
void run_online(View y, ConstView x, Index frames, const SlidingCmvnOptions& so, int ta) {
  StreamingCmvn stream(x.size(1 - ta), so);
  for (Index t = 0; t < frames; ++t) stream.accept(y.slice(ta, t, t + 1), x.slice(ta, t, t + 1));
}

void run_cmvn(const CmvnCliOptions& o) {
  const NormOptions& io = o.io;
  check_mode_flags(o);
  const int ta = check_feature_time_axis(o.time_axis);
  std::optional<CmvnStats> stats;
  if (!o.stats.empty()) stats = load_stats(o.stats, "--stats");
  NormInputs in = load_norm_inputs(io);
  std::optional<std::vector<Index>> lengths;
  if (!o.lengths.empty()) lengths = load_lengths(o.lengths);

  const Dims& shape = in.x.shape();
  const bool batch = shape.size() == 3;
  if (lengths || o.mode == "global")
    NL_CHECK(shape.size() == (lengths ? 3 : 2), "--mode {}{} takes {}, but the input has shape {}", o.mode,
             lengths ? " with --lengths" : "",
             lengths ? (ta == 0 ? "a batch [B, T, D]" : "a batch [B, D, T]")
                     : (ta == 0 ? "one utterance [T, D]" : "one utterance [D, T]"),
             shape.str());
  NL_CHECK(shape.size() == 2 || shape.size() == 3,
           "the input must be one utterance ({}) or a batch ({}), but it has shape {}",
           ta == 0 ? "[T, D]" : "[D, T]", ta == 0 ? "[B, T, D]" : "[B, D, T]", shape.str());
  const int t_axis = (batch ? 1 : 0) + ta, d_axis = (batch ? 1 : 0) + 1 - ta;
  const Index T = shape[t_axis], D = shape[d_axis];
  if (stats)
    NL_CHECK(stats->dim() == D,
             "--stats has the wrong width: {} dims, but the features have {} (axis {} of the "
             "input of shape {})",
             stats->dim(), D, d_axis, shape.str());
  if (batch && !lengths) lengths = std::vector<Index>(static_cast<std::size_t>(shape[0]), T);
  if (batch)
    check_lengths(*lengths, shape[0], T,
                  fmt::format("sequences (axis 0 of the input of shape {})", shape.str()),
                  fmt::format("axis {} of the input of shape {}", t_axis, shape.str()));
  if (in.dy) check_shape("--dy", *in.dy, shape, "the input's shape");

  const CmvnOptions co{o.norm_means, o.norm_vars, ta};
  SlidingCmvnOptions so;
  so.norm_vars = o.norm_vars;
  so.center = o.center;
  so.time_axis = ta;
  if (o.window) so.cmn_window = *o.window;
  if (o.mode == "online") so.min_cmn_window = 0;
  if (o.min_window) so.min_cmn_window = *o.min_window;

  OutputSet out;
  Tensor y(shape);  // zeros: padded frames of the online mode stay 0
  if (o.mode == "global") {
    apply_cmvn(y.view(), in.x.cview(), *stats, co);
  } else if (o.mode == "utterance") {
    if (batch)
      apply_cmvn_masked(y.view(), in.x.cview(), *lengths, co);
    else
      apply_cmvn_per_utterance(y.view(), in.x.cview(), co);
  } else if (o.mode == "sliding") {
    if (batch)
      sliding_cmvn_masked(y.view(), in.x.cview(), *lengths, so);
    else
      sliding_cmvn(y.view(), in.x.cview(), so);
  } else {  // online
    if (batch)
      for (Index b = 0; b < shape[0]; ++b)
        run_online(y.view().select(0, b), in.x.cview().select(0, b), (*lengths)[static_cast<std::size_t>(b)],
                   so, ta);
    else
      run_online(y.view(), in.x.cview(), T, so, ta);
  }
  out.add(io.output, std::move(y));

  if (io.backward()) {
    Tensor dx(shape);
    if (o.mode == "global")
      apply_cmvn_backward(dx.view(), in.dy->cview(), *stats, co);
    else if (batch)
      apply_cmvn_masked_backward(dx.view(), in.dy->cview(), in.x.cview(), *lengths, co);
    else
      apply_cmvn_per_utterance_backward(dx.view(), in.dy->cview(), in.x.cview(), co);
    out.add(io.dx_out, std::move(dx));
  }
  out.write_all();
}

// ---- cmvn-stats ---------------------------------------------------------------------------------

struct CmvnStatsCliOptions {
  std::vector<std::string> files;
  std::string list;
  std::string output;
  std::string json;
  int time_axis = 0;
};

std::vector<std::string> read_list(const std::string& path) {
  std::ifstream f(path);
  NL_CHECK(f.good(), "--list: cannot open {} for reading", path);
  std::vector<std::string> files;
  std::string line;
  while (std::getline(f, line)) {
    const std::size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    const std::size_t e = line.find_last_not_of(" \t\r");
    files.push_back(line.substr(b, e - b + 1));
  }
  return files;
}

void run_cmvn_stats(const CmvnStatsCliOptions& o) {
  NL_CHECK(!o.output.empty() || !o.json.empty(),
           "say where to write the statistics: -o STATS.npy (Kaldi layout) and/or --json STATS.json (WeNet)");
  const int ta = check_feature_time_axis(o.time_axis);
  std::vector<std::string> files = o.files;
  if (!o.list.empty()) {
    const std::vector<std::string> listed = read_list(o.list);
    files.insert(files.end(), listed.begin(), listed.end());
  }
  NL_CHECK(!files.empty(), "no feature files: give FILES.npy... and/or --list FILES.txt{}",
           o.list.empty() ? "" : fmt::format(" ({} lists none)", o.list));
  CmvnStats stats;
  for (const std::string& file : files) {
    const Tensor feats = load_tensor(file, "features");
    NL_CHECK(feats.rank() == 2, "{}: a feature file must be 2-D ({} with --time-axis {}), got shape {}", file,
             ta == 0 ? "[T, D]" : "[D, T]", ta, feats.shape().str());
    const Index dims = feats.shape()[1 - ta];
    NL_CHECK(stats.dim() == 0 || dims == stats.dim(),
             "{}: stats of the wrong width: the file has {} dims, the files before it have {}", file, dims,
             stats.dim());
    try {
      stats.add(feats.cview(), ta);
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", file, e.what()));
    }
  }
  if (!o.output.empty()) stats.save_kaldi_npy(o.output);
  if (!o.json.empty()) stats.save_wenet_json(o.json);
  std::printf("cmvn-stats: %zu file%s, %.17g frames, %lld dims\n", files.size(), files.size() == 1 ? "" : "s",
              stats.count(), static_cast<long long>(stats.dim()));
}

}  // namespace

void add_norm_cmvn_command(CLI::App* norm) {
  auto opts = std::make_shared<CmvnCliOptions>();
  CLI::App* cmd = norm->add_subcommand(
      "cmvn", "Cepstral mean (and variance) normalization of features, as Kaldi's apply-cmvn[-sliding]");
  cmd->footer(
      "IN is one utterance [T, D] (--time-axis 0) or [D, T] (--time-axis 1), or for --mode utterance, "
      "sliding "
      "and online a batch [B, T, D] / [B, D, T]; --lengths L.npy (B integers) marks frames t >= L[b] as "
      "padding (excluded, written 0). Modes: global = Kaldi apply-cmvn with --stats (Kaldi 2x(D+1) .npy or "
      "WeNet .json); utterance = statistics of each utterance; sliding = Kaldi apply-cmvn-sliding; online = "
      "normlab::StreamingCmvn fed one frame at a time, i.e. the CAUSAL window [max(0, t-window), t] (no "
      "look-ahead: --min-window defaults to 0 and must be <= 1, no --center). Backward (--dy, --dx-out): "
      "global and utterance only. No file is written unless every computation succeeds.");
  cmd->add_option("--mode", opts->mode, "global | utterance | sliding | online")
      ->required()
      ->check(CLI::IsMember({"global", "utterance", "sliding", "online"}))
      ->type_name("MODE");
  cmd->add_option("--stats", opts->stats,
                  "CMVN statistics for --mode global: Kaldi .npy [2, D+1] or WeNet .json")
      ->type_name("S.npy|S.json");
  cmd->add_flag("--norm-vars", opts->norm_vars, "Also divide by the standard deviation");
  cmd->add_flag("--norm-means,!--no-norm-means", opts->norm_means,
                "Subtract the mean (default; --no-norm-means: global and utterance only)");
  cmd->add_option_function<int>(
         "--window", [o = opts.get()](const int& v) { o->window = v; },
         "Sliding / online window in frames (Kaldi --cmn-window; default 600)")
      ->type_name("N");
  cmd->add_option_function<int>(
         "--min-window", [o = opts.get()](const int& v) { o->min_window = v; },
         "Minimum window at the start (Kaldi --min-cmn-window; default 100 for sliding, 0 for online)")
      ->type_name("N");
  cmd->add_flag("--center", opts->center, "Centred sliding window (Kaldi --center; sliding only)");
  cmd->add_option("--time-axis", opts->time_axis, "Time axis of an utterance: 0 for [T, D], 1 for [D, T]")
      ->capture_default_str();
  cmd->add_option("--lengths", opts->lengths, "Lengths of a batch's sequences (.npy of B integers)")
      ->type_name("L.npy");
  NormFlags flags;
  flags.eps = flags.weight = flags.bias = flags.stats = false;
  add_norm_io_options(cmd, opts->io, flags);
  cmd->callback([opts] { run_cmvn(*opts); });
}

void add_cmvn_stats_command(CLI::App& app) {
  auto opts = std::make_shared<CmvnStatsCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "cmvn-stats", "Accumulate CMVN statistics over .npy feature files (Kaldi compute-cmvn-stats)");
  cmd->footer(
      "Every file is one utterance, [T, D] (--time-axis 0) or [D, T] (--time-axis 1), with the same D. "
      "-o writes Kaldi's 2x(D+1) float64 layout [sum(x)..., count; sum(x^2)..., 0]; --json writes WeNet's "
      "global_cmvn JSON {mean_stat, var_stat, frame_num}. Both hold sums, usable by `normlab norm cmvn "
      "--mode "
      "global --stats`. Nothing is written unless every file is read.");
  cmd->add_option("files", opts->files, "Feature files (.npy, float32 or float64)")->type_name("FILES.npy");
  cmd->add_option("--list", opts->list, "A text file naming feature files, one per line ('#' comments)")
      ->type_name("FILES.txt");
  cmd->add_option("-o,--output", opts->output, "Where to write the stats in Kaldi layout (.npy, float64)")
      ->type_name("STATS.npy");
  cmd->add_option("--json", opts->json, "Where to write the stats as WeNet JSON")->type_name("STATS.json");
  cmd->add_option("--time-axis", opts->time_axis, "Time axis of each file: 0 for [T, D], 1 for [D, T]")
      ->capture_default_str();
  cmd->callback([opts] { run_cmvn_stats(*opts); });
}

}  // namespace normlab::cli
