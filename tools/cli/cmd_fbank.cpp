// `normlab fbank`: Kaldi-compatible log-mel filterbank features of WAV files (compute-fbank-feats).
//
//   normlab fbank IN.wav -o OUT.npy [Kaldi flags] [--layout tf|ft] [--seed S]
//   normlab fbank --list FILES.txt --out-dir DIR [flags] [--jobs N] [--stats]
//
// Flags keep Kaldi's names and defaults (dither 1.0 included: pass --dither 0 for deterministic features
// independent of --seed). Boolean flags accept Kaldi's syntax: --snip-edges=false, --use-energy (= true).
// The WAV must be mono 16-bit PCM or 32-bit float at --sample-frequency (no resampling); samples are
// scaled like Kaldi (int16 range). The output is float32 .npy, [T, F] (--layout tf, default) or [F, T].
// With --list, FILES.txt holds one WAV path per line (blank lines and lines starting with '#' are
// skipped; relative paths are relative to the current directory); DIR/<basename without .wav>.npy is
// written for each, in parallel over files on --jobs threads (default: all cores). Each file uses the
// same options and seed, so a file's features do not depend on the list or the thread count. Every file
// is attempted; failures are reported together at the end (exit 1), the other outputs are kept. Each
// thread builds the mel banks, window and FFT plan once (speech::FbankExtractor) and reuses them.
#include <normlab/error.h>
#include <normlab/npy.h>
#include <normlab/speech/fbank.h>
#include <normlab/speech/wav.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"

namespace normlab::cli {
namespace {

// CPU time of the calling thread: on a shared machine a steadier measure of the work than wall time.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

namespace fs = std::filesystem;
using speech::FbankOptions;
using speech::FeatureLayout;

struct FbankCliOptions {
  std::string input, output, list, out_dir, layout = "tf";
  int jobs = 0;
  bool stats = false;
  FbankOptions fbank;
};

struct FileResult {
  double audio_seconds = 0, compute_seconds = 0, compute_cpu_seconds = 0;
};

// `extractor` holds the options' mel banks, window and FFT plan, built once per thread.
FileResult run_one(const std::string& in, const std::string& out, const FbankCliOptions& o,
                   speech::FbankExtractor& extractor) {
  const speech::Waveform w = speech::read_wav(in, {.expected_samp_freq = o.fbank.frame_opts.samp_freq});
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = thread_cpu_seconds();
  Tensor feats;
  try {
    feats = extractor.Compute(w.samples, w.samp_freq, o.layout == "ft" ? FeatureLayout::kFT : FeatureLayout::kTF);
  } catch (const Error& e) {
    throw Error(in + ": " + e.what());
  }
  const auto t1 = std::chrono::steady_clock::now();
  const double c1 = thread_cpu_seconds();
  save_npy(out, feats.cview());
  return {static_cast<double>(w.samples.size()) / w.samp_freq,
          std::chrono::duration<double>(t1 - t0).count(), c1 - c0};
}

std::vector<std::string> read_list(const std::string& path) {
  std::ifstream f(path);
  NL_CHECK(f.good(), "cannot open --list file {}", path);
  std::vector<std::string> files;
  std::string line;
  while (std::getline(f, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
      line.pop_back();
    const auto start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    files.push_back(line.substr(start));
  }
  NL_CHECK(!files.empty(), "--list file {} names no WAV files", path);
  return files;
}

void run_fbank(const FbankCliOptions& o) {
  const bool single = !o.input.empty();
  NL_CHECK(single != !o.list.empty(), "give either IN.wav -o OUT.npy or --list FILES.txt --out-dir DIR");
  o.fbank.Validate();
  { speech::FbankComputer check(o.fbank); }  // option errors (e.g. an empty mel bin) before any file is read
  if (single) {
    NL_CHECK(!o.output.empty(), "-o OUT.npy is required with IN.wav");
    NL_CHECK(o.out_dir.empty() && o.jobs == 0, "--out-dir and --jobs go with --list");
    speech::FbankExtractor extractor(o.fbank);
    const FileResult r = run_one(o.input, o.output, o, extractor);
    if (o.stats)
      std::printf("fbank: 1 file, %.3f s of audio, %.4f s computing (real-time factor %.5f; %.5f in CPU time)\n",
                  r.audio_seconds, r.compute_seconds, r.compute_seconds / r.audio_seconds,
                  r.compute_cpu_seconds / r.audio_seconds);
    return;
  }
  NL_CHECK(o.output.empty(), "-o goes with a single IN.wav; with --list use --out-dir");
  NL_CHECK(!o.out_dir.empty(), "--out-dir DIR is required with --list");
  NL_CHECK(o.jobs >= 0, "--jobs must be ≥ 1, got {}", o.jobs);
  const std::vector<std::string> files = read_list(o.list);
  std::vector<std::string> outs;
  std::map<std::string, std::string> seen;
  for (const std::string& f : files) {
    const std::string out = (fs::path(o.out_dir) / fs::path(f).stem()).string() + ".npy";
    const auto [it, fresh] = seen.emplace(out, f);
    NL_CHECK(fresh, "--list: {} and {} would both write {}", it->second, f, out);
    outs.push_back(out);
  }
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  NL_CHECK(!ec, "cannot create --out-dir {}: {}", o.out_dir, ec.message());

  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t jobs =
      std::min<std::size_t>(o.jobs > 0 ? static_cast<std::size_t>(o.jobs) : hw, files.size());
  std::atomic<std::size_t> next{0};
  std::vector<std::string> errors(files.size());
  std::vector<FileResult> results(files.size());
  auto worker = [&] {
    speech::FbankExtractor extractor(o.fbank);
    for (std::size_t i; (i = next.fetch_add(1)) < files.size();) {
      try {
        results[i] = run_one(files[i], outs[i], o, extractor);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (std::size_t j = 1; j < jobs; ++j) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::size_t failed = 0;
  std::string first;
  for (const std::string& e : errors)
    if (!e.empty() && failed++ < 5) first += "\n  " + e;
  if (o.stats) {
    double audio = 0, compute = 0, cpu = 0;
    for (const FileResult& r : results) {
      audio += r.audio_seconds;
      compute += r.compute_seconds;
      cpu += r.compute_cpu_seconds;
    }
    std::printf(
        "fbank: %zu files (%zu failed), %.3f s of audio, %.4f s computing features (real-time factor %.5f "
        "per core; %.5f in thread CPU time), %.3f s wall on %zu threads incl. I/O\n",
        files.size(), failed, audio, compute, audio > 0 ? compute / audio : 0.0, audio > 0 ? cpu / audio : 0.0,
        wall, jobs);
  }
  NL_CHECK(failed == 0, "{} of {} files failed:{}{}", failed, files.size(), first,
           failed > 5 ? "\n  ..." : "");
}

}  // namespace

void add_fbank_command(CLI::App& app) {
  auto opts = std::make_shared<FbankCliOptions>();
  FbankOptions& fb = opts->fbank;
  CLI::App* cmd = app.add_subcommand(
      "fbank", "Kaldi-compatible log-mel filterbank features of WAV files (compute-fbank-feats), as .npy");
  cmd->add_option("input", opts->input, "Input WAV file (mono, 16-bit PCM or float)");
  cmd->add_option("-o,--output", opts->output, "Output .npy file (with IN.wav)");
  cmd->add_option("--list", opts->list, "Text file with one WAV path per line (instead of IN.wav)");
  cmd->add_option("--out-dir", opts->out_dir, "Output directory for --list: DIR/<name>.npy per file");
  cmd->add_option("--jobs", opts->jobs, "Threads for --list (parallel over files; default: all cores)");
  cmd->add_flag("--stats", opts->stats, "Print audio duration, compute time and real-time factor");
  cmd->add_option("--layout", opts->layout, "Output layout: tf = [frames, features], ft = [features, frames]")
      ->check(CLI::IsMember({"tf", "ft"}))
      ->capture_default_str();
  cmd->add_option("--seed", fb.frame_opts.dither_seed, "Seed of the dither generator")->capture_default_str();
  // Kaldi's flags, Kaldi's defaults.
  cmd->add_option("--sample-frequency", fb.frame_opts.samp_freq, "Sample rate the WAV must have (Hz)")
      ->capture_default_str();
  cmd->add_option("--frame-length", fb.frame_opts.frame_length_ms, "Frame length (ms)")
      ->capture_default_str();
  cmd->add_option("--frame-shift", fb.frame_opts.frame_shift_ms, "Frame shift (ms)")->capture_default_str();
  cmd->add_option("--dither", fb.frame_opts.dither, "Dither stddev in int16 units (0 = off)")
      ->capture_default_str();
  cmd->add_option("--preemphasis-coefficient", fb.frame_opts.preemph_coeff, "Pre-emphasis coefficient")
      ->capture_default_str();
  cmd->add_flag("--remove-dc-offset{true}", fb.frame_opts.remove_dc_offset,
                "Subtract each frame's mean [default: true]")
      ->capture_default_str();
  cmd->footer("Boolean flags take Kaldi's form: --snip-edges=false, --use-energy (= true).");
  cmd->add_option("--window-type", fb.frame_opts.window_type,
                  "povey, hamming, hanning, sine, rectangular or blackman")
      ->check(CLI::IsMember({"povey", "hamming", "hanning", "sine", "rectangular", "blackman"}))
      ->capture_default_str();
  cmd->add_flag("--round-to-power-of-two{true}", fb.frame_opts.round_to_power_of_two,
                "Zero-pad frames to a power-of-two FFT length [default: true]")
      ->capture_default_str();
  cmd->add_option("--blackman-coeff", fb.frame_opts.blackman_coeff, "Blackman window coefficient")
      ->capture_default_str();
  cmd->add_flag("--snip-edges{true}", fb.frame_opts.snip_edges,
                "Only frames that fit in the audio; false: centred frames, mirrored edges [default: true]")
      ->capture_default_str();
  cmd->add_option("--num-mel-bins", fb.mel_opts.num_bins, "Number of mel bins")->capture_default_str();
  cmd->add_option("--low-freq", fb.mel_opts.low_freq, "Lowest mel-bin edge (Hz)")->capture_default_str();
  cmd->add_option("--high-freq", fb.mel_opts.high_freq, "Highest mel-bin edge (Hz); ≤ 0: offset from Nyquist")
      ->capture_default_str();
  cmd->add_option("--vtln-warp", fb.vtln_warp, "VTLN warp factor of the mel banks (1 = none)")
      ->capture_default_str();
  cmd->add_option("--vtln-low", fb.mel_opts.vtln_low, "Lower VTLN inflection point (Hz)")->capture_default_str();
  cmd->add_option("--vtln-high", fb.mel_opts.vtln_high,
                  "Upper VTLN inflection point (Hz); < 0: offset from Nyquist")
      ->capture_default_str();
  cmd->add_flag("--use-energy{true}", fb.use_energy, "Add the log-energy as feature 0 [default: false]")
      ->capture_default_str();
  cmd->add_option("--energy-floor", fb.energy_floor, "Floor on the energy (0 = none)")->capture_default_str();
  cmd->add_flag("--raw-energy{true}", fb.raw_energy,
                "Energy before pre-emphasis and windowing [default: true]")
      ->capture_default_str();
  cmd->add_flag("--htk-compat{true}", fb.htk_compat,
                "Energy as the last feature (HTK order) [default: false]")
      ->capture_default_str();
  cmd->add_flag("--use-log-fbank{true}", fb.use_log_fbank, "Log of the mel energies [default: true]")
      ->capture_default_str();
  cmd->add_flag("--use-power{true}", fb.use_power, "Power (true) or magnitude spectrum [default: true]")
      ->capture_default_str();
  cmd->callback([opts] { run_fbank(*opts); });
}

}  // namespace normlab::cli
