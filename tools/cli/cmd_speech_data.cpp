// `normlab speech-data --out DIR [--seed S] [--limit N] [--renditions R] [--jobs J] [--no-corrupt]`: the
// spoken-digit data set of src/speech/dataset.h (espeak-ng + sox, speaker-disjoint splits, corrupted test
// copies, manifest.csv). A progress bar on a terminal, plain progress lines (every 10%) otherwise.
#include <normlab/error.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli.h"
#include "speech/dataset.h"

namespace normlab::cli {
namespace {

struct SpeechDataCli {
  speech::SpeechDataOptions data;
  bool no_corrupt = false, quiet = false;
};

void run_speech_data(SpeechDataCli& c) {
  c.data.corrupt = !c.no_corrupt;
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  std::size_t last_decile = 0;
  if (!c.quiet)
    c.data.progress = [tty, &last_decile](std::size_t done, std::size_t total) {
      if (tty) {
        const int width = 40;
        const int filled = static_cast<int>(width * done / total);
        std::fprintf(stderr, "\rspeech-data [%s%s] %zu/%zu",
                     std::string(static_cast<std::size_t>(filled), '#').c_str(),
                     std::string(static_cast<std::size_t>(width - filled), ' ').c_str(), done, total);
        if (done == total) std::fputc('\n', stderr);
      } else if (const std::size_t decile = 10 * done / total; decile > last_decile || done == total) {
        last_decile = decile;
        std::fprintf(stderr, "speech-data: %zu/%zu tasks (%zu%%)\n", done, total, 100 * done / total);
      }
      std::fflush(stderr);
    };
  const auto t0 = std::chrono::steady_clock::now();
  const speech::SpeechDataSummary s = speech::MakeSpeechData(c.data);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "speech-data: %zu clips (%.1f s of audio) from %zu voices, %zu corrupted test copies, in %.1f s; "
      "manifest: %s/manifest.csv\n",
      s.clips, s.seconds_of_audio, s.voices, s.corrupted, wall, c.data.out_dir.c_str());
}

}  // namespace

void add_speech_data_command(CLI::App& app) {
  auto c = std::make_shared<SpeechDataCli>();
  CLI::App* cmd = app.add_subcommand(
      "speech-data",
      "Build the spoken-digit data set (espeak-ng + sox): speaker-disjoint splits, manifest, "
      "corrupted test copies");
  cmd->add_option("--out", c->data.out_dir, "Output directory")->required();
  cmd->add_option("--seed", c->data.seed, "Seed for speeds, pitches and corruptions")->capture_default_str();
  cmd->add_option("--limit", c->data.limit,
                  "Only the first N digits and the first N voices of each split (0 = everything)")
      ->capture_default_str();
  cmd->add_option("--renditions", c->data.renditions, "Clips per voice and digit")->capture_default_str();
  cmd->add_option("--jobs", c->data.jobs, "Parallel espeak-ng/sox pipelines (0 = all cores)")
      ->capture_default_str();
  cmd->add_flag("--no-corrupt", c->no_corrupt, "Skip the corrupted test copies");
  cmd->add_flag("--quiet", c->quiet, "No progress output");
  cmd->callback([c] { run_speech_data(*c); });
}

}  // namespace normlab::cli
