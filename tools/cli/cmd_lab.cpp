// `normlab lab [--out DIR] [--quick] [--only CLAIM,...] [--seeds N] [--threads N] [--no-report] [--resume]`
// `normlab lab --compare A.json B.json`
//
// The lab measures every claim of the LayerNorm logic chain (docs/LAB.md; the experiments and verdict rules
// live in src/lab/): claim 1 in-process (the worked examples and the exercise), the others as runs in
// separate processes of this binary (the hidden `lab-job` subcommand), --threads at a time. It prints
// progress and a verdict per claim, writes DIR/results.json (docs/lab-results.schema.json), then runs
// scripts/lab_report.py with /usr/bin/python3 to write DIR/*.png and DIR/index.html.
//
// Exit status: 0 when every run completed and the report was written, whatever the verdicts; 1 when a run
// failed or the report could not be written (results.json is written first in either case).
#include <fmt/ranges.h>
#include <normlab/error.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cli.h"
#include "lab/experiments.h"
#include "lab/results.h"
#include "lab/runner.h"

#ifndef NORMLAB_SOURCE_DIR
#define NORMLAB_SOURCE_DIR ""
#endif

namespace normlab::cli {

namespace {

namespace fs = std::filesystem;

constexpr const char* kPython = "/usr/bin/python3";

// Thresholds for the exercise's checks (x has σ = 5, so LayerNorm's variance is 1 − eps/25 ≈ 1 − 4e-7).
constexpr double kExerciseDiffTol = 1e-5;
constexpr double kExerciseMeanTol = 1e-5;
constexpr double kExerciseVarTol = 1e-3;

std::vector<lab::ExtraCheck> check_exercise(const ExerciseResult& r) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double worst_mean = 0, worst_var = 0;
  for (const auto& row : r.token_mean)
    for (double v : row) worst_mean = std::isnan(v) ? kInf : std::max(worst_mean, std::fabs(v));
  for (const auto& row : r.token_var)
    for (double v : row) worst_var = std::isnan(v) ? kInf : std::max(worst_var, std::fabs(v - 1.0));
  const bool shapes = r.output_shape == r.input_shape && r.block_ln_shape == r.block_x_shape &&
                      r.block_linear_shape == r.block_x_shape && r.block_y_shape == r.block_x_shape;
  return {
      {"exercise: kernel vs textbook", r.max_abs_diff <= kExerciseDiffTol,
       fmt::format("max abs diff {:.3e} (tolerance {:g})", r.max_abs_diff, kExerciseDiffTol)},
      {"exercise: per-token mean ≈ 0", worst_mean <= kExerciseMeanTol,
       fmt::format("max |mean| {:.3e} (tolerance {:g})", worst_mean, kExerciseMeanTol)},
      {"exercise: per-token variance ≈ 1", worst_var <= kExerciseVarTol,
       fmt::format("max |var - 1| {:.3e} (tolerance {:g})", worst_var, kExerciseVarTol)},
      {"exercise: Pre-Norm block keeps the shape", shapes,
       fmt::format("x {} -> y {}", r.block_x_shape.str(), r.block_y_shape.str())},
  };
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  NL_CHECK(f.good(), "lab: cannot read '{}'", p.string());
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string self_exe() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  NL_CHECK(!ec, "lab: cannot locate the normlab binary (/proc/self/exe): {}", ec.message());
  return p.string();
}

// scripts/lab_report.py: $NORMLAB_LAB_REPORT, else the source tree this binary was built from, else next to
// the binary's build folder.
std::string report_script() {
  if (const char* env = std::getenv("NORMLAB_LAB_REPORT"); env && *env) return env;
  std::vector<fs::path> candidates;
  if (*NORMLAB_SOURCE_DIR) candidates.push_back(fs::path(NORMLAB_SOURCE_DIR) / "scripts" / "lab_report.py");
  const fs::path exe_dir = fs::path(self_exe()).parent_path();
  candidates.push_back(exe_dir / ".." / ".." / "scripts" / "lab_report.py");
  candidates.push_back(exe_dir / "scripts" / "lab_report.py");
  for (const fs::path& c : candidates)
    if (fs::exists(c)) return fs::weakly_canonical(c).string();
  throw Error("lab: scripts/lab_report.py not found (set NORMLAB_LAB_REPORT to its path)");
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Fails clearly, before any long run, when the report cannot be made.
void check_report_prerequisites() {
  NL_CHECK(::access(kPython, X_OK) == 0,
           "lab: {} not found: the report needs Debian's python3 with python3-matplotlib (scripts/install-deps), "
           "or pass --no-report",
           kPython);
  const int rc = std::system(fmt::format("{} -c 'import matplotlib' >/dev/null 2>&1", kPython).c_str());
  NL_CHECK(rc == 0,
           "lab: {} cannot import matplotlib: install python3-matplotlib (scripts/install-deps), or pass --no-report",
           kPython);
}

std::string iso_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

struct Options {
  std::string out = "lab-out";
  bool quick = false;
  std::vector<int> only;
  int seeds = 0;    // 0: 3, or 1 with --quick
  int threads = 0;  // 0: the number of cores
  std::string data = "fortunes";
  bool no_report = false;
  bool resume = false;
  std::vector<std::string> compare;
  std::string argv_line;
};

void run_compare(const Options& o) {
  NL_CHECK(o.compare.size() == 2, "--compare needs two results.json files, got {}", o.compare.size());
  nlohmann::json a, b;
  for (int i = 0; i < 2; ++i) {
    nlohmann::json j = nlohmann::json::parse(read_text(o.compare[static_cast<std::size_t>(i)]), nullptr, false);
    NL_CHECK(!j.is_discarded() && j.is_object() && j.contains("claims"), "--compare: '{}' is not a lab results.json",
             o.compare[static_cast<std::size_t>(i)]);
    (i == 0 ? a : b) = std::move(j);
  }
  fmt::print("{}", lab::compare_results(a, b));
}

void run_lab(const Options& o) {
  if (!o.compare.empty()) return run_compare(o);
  const auto t0 = std::chrono::steady_clock::now();
  NL_CHECK(!o.out.empty(), "--out must name a directory");
  for (int c : o.only)
    NL_CHECK(c >= 1 && c <= lab::kLastClaim, "--only: claims are numbered 1..{}, got {}", lab::kLastClaim, c);
  NL_CHECK(o.seeds >= 0, "--seeds must be ≥ 1, got {}", o.seeds);
  NL_CHECK(o.threads >= 0, "--threads must be ≥ 1, got {}", o.threads);
  std::error_code ec;
  fs::create_directories(o.out, ec);
  NL_CHECK(!ec && fs::is_directory(o.out), "--out: cannot create directory '{}': {}", o.out,
           ec ? ec.message() : "a file of that name exists");
  std::string script;
  if (!o.no_report) {
    check_report_prerequisites();
    script = report_script();
  }

  lab::LabOptions opt;
  opt.quick = o.quick;
  opt.data = o.data;
  const int nseeds = o.seeds > 0 ? o.seeds : (o.quick ? 1 : 3);
  opt.seeds.clear();
  for (int s = 0; s < nseeds; ++s) opt.seeds.push_back(s);
  opt.only.insert(o.only.begin(), o.only.end());
  const int parallel =
      o.threads > 0 ? o.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));

  const std::vector<lab::Job> jobs = lab::plan_jobs(opt);
  fmt::print("normlab lab{}: claims {}, seeds {}, {} run(s), {} at a time -> {}\n", o.quick ? " --quick" : "",
             opt.only.empty() ? fmt::format("1-{}", lab::kLastClaim) : fmt::format("{}", fmt::join(opt.only, ",")), nseeds, jobs.size(),
             parallel, o.out);
  std::fflush(stdout);

  std::vector<lab::ExtraCheck> extra;
  if (opt.wants(1)) extra = check_exercise(run_exercise(0));

  nlohmann::json outputs = nlohmann::json::object();
  if (!jobs.empty())
    outputs =  lab::run_jobs(jobs, {self_exe(), o.out, parallel, o.resume}, [](const std::string& line) {
      fmt::print("{}\n", line);
      std::fflush(stdout);
    });
  int failed_runs = 0;
  for (const auto& [k, v] : outputs.items()) failed_runs += v.contains("error") ? 1 : 0;

  lab::LabResults res;
  res.version = "0.1.0";
  res.quick = o.quick;
  res.seeds = opt.seeds;
  res.jobs = parallel;
  res.command = o.argv_line;
  res.started = iso_now();
  res.claims = lab::assemble(opt, outputs, extra);
  res.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  lab::write_results(o.out, res);

  fmt::print("\n{:>5}  {:<28} {}\n", "claim", "verdict", "title");
  for (const lab::ClaimResult& c : res.claims) {
    fmt::print("{:>5}  {:<28} {}\n", c.id, lab::verdict_name(c.verdict.verdict), c.title);
    fmt::print("       {}\n", c.verdict.reason);
  }
  const fs::path results_path = fs::path(o.out) / "results.json";
  fmt::print("\nresults: {}\n", results_path.string());
  std::fflush(stdout);

  if (!o.no_report) {
    const std::string cmd = fmt::format("{} {} {} {}", kPython, shell_quote(script), shell_quote(results_path.string()),
                                        shell_quote(o.out));
    const int rc = std::system(cmd.c_str());
    NL_CHECK(rc == 0, "lab: the report failed ({} exited with status {})", cmd, rc);
    fmt::print("report: {}\n", (fs::path(o.out) / "index.html").string());
  }
  fmt::print("wall time {:.1f} s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  NL_CHECK(failed_runs == 0, "lab: {} of {} runs FAILED (see {})", failed_runs, jobs.size(), results_path.string());
}

}  // namespace

void add_lab_command(CLI::App& app) {
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("lab", "Measure every claim of the LayerNorm logic chain and write a report");
  cmd->footer(
      "Claims (docs/LAB.md): 1 LayerNorm math, 2 LN vs BN, 3 F vs T on speech, 4 identity path, 5 gradient norms at "
      "init, 6 warmup, 7 shallow Post-LN, 8 layer utilization, 9 token similarity; beyond lab.md: 10 residual-stream "
      "norm growth, 11 placement variants without warmup, 12 Post-LN's warmup threshold vs depth. Writes "
      "DIR/results.json, "
      "DIR/*.png and DIR/index.html; each claim's section shows the command that reruns it alone. The default run "
      "follows lab.md's designs (3 seeds, ≈ 15-20 min on 2 cores); --quick uses smaller sizes and 1 seed (≈ 2 min). "
      "Exits 1 if a run fails or the report cannot be written; verdicts do not change the exit status.");
  cmd->add_option("--out", opts->out, "Directory for results.json, the plots and index.html (created if missing)")
      ->capture_default_str();
  cmd->add_flag("--quick", opts->quick, "Smaller sizes and 1 seed (CI)");
  cmd->add_option("--only", opts->only, "Claims to run, e.g. --only 5,6 (default: all)")->delimiter(',');
  cmd->add_option("--seeds", opts->seeds, "Seeds per arm (0, 1, ..., N-1; default 3, or 1 with --quick)");
  cmd->add_option("--threads", opts->threads, "Runs in parallel, one process and one thread each (default: cores)");
  cmd->add_option("--data", opts->data, "Training text: `fortunes` (the lab's corpus) or a file")->capture_default_str();
  cmd->add_flag("--no-report", opts->no_report, "Write results.json only (no plots, no index.html)");
  cmd->add_flag("--resume", opts->resume,
                "Reuse the runs already in DIR/runs whose spec is unchanged (an interrupted or extended lab)");
  cmd->add_option("--compare", opts->compare, "Print what changed between two results.json files: --compare A B")
      ->expected(2);
  cmd->callback([opts] {
    std::string line = "normlab lab";
    if (opts->quick) line += " --quick";
    if (!opts->only.empty()) line += fmt::format(" --only {}", fmt::join(opts->only, ","));
    if (opts->seeds > 0) line += fmt::format(" --seeds {}", opts->seeds);
    if (opts->threads > 0) line += fmt::format(" --threads {}", opts->threads);
    if (opts->data != "fortunes") line += " --data " + opts->data;
    line += " --out " + opts->out;
    opts->argv_line = line;
    run_lab(*opts);
  });

  // Hidden: one run of the lab, in its own process (src/lab/runner.h).
  struct JobOptions {
    std::string spec, dir;
  };
  auto jo = std::make_shared<JobOptions>();
  CLI::App* job = app.add_subcommand("lab-job", "");
  job->group("");  // hidden from --help
  job->add_option("--spec", jo->spec)->required();
  job->add_option("--dir", jo->dir)->required();
  job->callback([jo] { lab::run_job_files(jo->spec, jo->dir); });
}

}  // namespace normlab::cli
