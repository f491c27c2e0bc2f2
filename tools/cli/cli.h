// Subcommands of the normlab CLI, and the results they share. Each add_*_command registers one
// subcommand on the app; errors are thrown as normlab::Error and turned into exit codes by main.cpp
// only.
#pragma once

#include <normlab/tensor.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json_fwd.hpp>
#include <vector>

namespace normlab::cli {

void add_norm_command(CLI::App& app);      // cmd_norm.cpp: `normlab norm layer ...`
void add_cmvn_stats_command(CLI::App& app);  // cmd_cmvn.cpp: `normlab cmvn-stats FILES... -o STATS.npy`
void add_norm_channel_commands(CLI::App* norm);  // cmd_norm_channel.cpp: `norm batch|instance|group`
void add_norm_cmvn_command(CLI::App* norm);      // cmd_cmvn.cpp: `norm cmvn`
void add_exercise_command(CLI::App& app);  // cmd_exercise.cpp: `normlab exercise [--seed S] [--json]`
void add_lab_command(CLI::App& app);       // cmd_lab.cpp: `normlab lab [--out DIR] [--quick]`
void add_fbank_command(CLI::App& app);     // cmd_fbank.cpp: `normlab fbank IN.wav -o OUT.npy` / `--list`
void add_gradnorms_command(CLI::App& app);  // cmd_gradnorms.cpp: `normlab gradnorms --placement P --layers L [--json]`
void add_speech_data_command(CLI::App& app);  // cmd_speech_data.cpp: `normlab speech-data --out DIR`
void add_speech_study_command(CLI::App& app);  // cmd_speech_study.cpp: `normlab speech-study --data DIR [--out study.json]`
void add_train_command(CLI::App& app);  // cmd_train.cpp: `normlab train --placement P --layers L ... --log run.jsonl`
void add_eval_command(CLI::App& app);   // cmd_train.cpp: `normlab eval --checkpoint DIR [--drop-last K | --skip-block I]`

// The source article's exercise (cmd_exercise.cpp), reused by `normlab lab`.
struct ExerciseResult {
  std::uint64_t seed = 0;
  double eps = 1e-5;
  Dims input_shape;         // x: [2, 4, 6] = N(0,1)·5 + 10
  Dims output_shape;        // normlab's LayerNorm over the last axis
  double max_abs_diff = 0;  // max |normlab − textbook per-row float implementation|
  // Per-token mean and (biased) variance of LayerNorm(x), [batch][token], computed in double.
  std::vector<std::vector<double>> token_mean, token_var;
  // Shapes through the Pre-Norm block y = x + Linear(LN(x)) with a seeded Linear(6, 6).
  Dims block_x_shape, block_ln_shape, block_linear_shape, block_y_shape;
};

ExerciseResult run_exercise(std::uint64_t seed);
void print_exercise(const ExerciseResult& r, std::FILE* out);
nlohmann::json exercise_json(const ExerciseResult& r);

}  // namespace normlab::cli
