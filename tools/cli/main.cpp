// The normlab command: `normlab --help` lists the subcommands. Every failure — a normlab::Error from a
// command or a command-line error from CLI11 — prints "normlab: error: <message>" on stderr and exits 1.
#include <normlab/error.h>

#include <cstdio>
#include <exception>

#include "cli.h"

int main(int argc, char** argv) {
  CLI::App app{"normlab: normalization kernels, a Transformer lab and a speech front end"};
  // Set before the subcommands are added: they copy it.
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    return "normlab: error: " + CLI::FailureMessage::simple(a, e);
  });
  app.require_subcommand(1);
  normlab::cli::add_norm_command(app);
  normlab::cli::add_cmvn_stats_command(app);
  normlab::cli::add_exercise_command(app);
  normlab::cli::add_lab_command(app);
  normlab::cli::add_fbank_command(app);
  normlab::cli::add_speech_data_command(app);
  normlab::cli::add_speech_study_command(app);
  normlab::cli::add_gradnorms_command(app);
  normlab::cli::add_train_command(app);
  normlab::cli::add_eval_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;  // --help exits 0
  } catch (const normlab::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "normlab: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "normlab: unexpected error: %s\n", e.what());
    return 2;
  }
  return 0;
}
