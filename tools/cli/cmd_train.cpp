// `normlab train` and `normlab eval`: the Transformer lab's training loop (src/nn/train.h) and the
// layer-removal evaluation of a trained checkpoint.
//
//   normlab train --placement pre [--norm layer|rms|dyt|batch] --layers 6 --d-model 64 --heads 4 --ffn 256
//   --seq 64 --batch 32
//                 --lr 3e-3 --warmup 0 --schedule constant|linear|cosine|noam --steps 600 --seed 0
//                 --data PATH|fortunes --log run.jsonl [--eval-every N] [--checkpoint DIR] [--resume DIR]
//                 [--threads N] [--optimizer adamw|sgd] [--clip X] [--weight-decay W] [--lr-floor F]
//                 [--val-windows N] [--momentum M]
//     Progress on stderr: a progress bar on a terminal, plain lines (one per evaluation) otherwise.
//     stdout: one JSON summary line. Under `mpirun -np N` (N > 1): data-parallel training, every rank on
//     its share of each batch with gradients averaged over ranks; rank 0 prints, logs and checkpoints.
//     Divergence: "normlab: error: diverged at step N: loss = nan", exit 1 (the log and the last good
//     checkpoint are kept).
//   normlab eval --checkpoint DIR [--drop-last K | --skip-block I ...] [--data PATH|fortunes]
//                [--val-windows N] [--threads N]
//     Prints JSON: the validation loss with all blocks and with the blocks removed.
#include <normlab/error.h>
#include <normlab/parallel.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.h"
#include "nn/checkpoint.h"
#include "nn/train.h"
#ifdef NORMLAB_HAVE_MPI
#include <mpi.h>

#include <cstdlib>
#include <optional>

#include "dist/train_hooks.h"
#endif

namespace normlab::cli {

namespace {

using nn::TrainConfig;

struct TrainOptions {
  TrainConfig cfg;
  std::string placement = "pre";
  std::string norm = "layer";
  std::string schedule = "constant";
  std::string optimizer = "adamw";
};

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t / 60) % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

std::string format_rate(double r) {
  return r >= 1e6 ? fmt::format("{:.2f}M", r / 1e6) : r >= 1e3 ? fmt::format("{:.1f}k", r / 1e3) : fmt::format("{:.0f}", r);
}

#ifdef NORMLAB_HAVE_MPI
// Started by mpirun / mpiexec? (Open MPI, MPICH's Hydra and PMIx launchers set these.)
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

// MPI_Init for the run, MPI_Finalize after it (also when the run throws: every rank throws together).
struct MpiSession {
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized && launched_by_mpi()) {
      MPI_Init(nullptr, nullptr);
      owned = true;
    }
  }
  ~MpiSession() {
    if (owned) MPI_Finalize();
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  bool owned = false;
};
#endif

void run_train(TrainOptions& o) {
  // Under mpirun with more than one rank: data-parallel training (src/nn/train.h, DataParallel); rank 0
  // prints the progress and the summary and writes the log and checkpoints.
  const nn::DataParallel* dp = nullptr;
#ifdef NORMLAB_HAVE_MPI
  MpiSession mpi;
  std::optional<dist::Comm> comm;
  std::optional<nn::DataParallel> hooks;
  if (mpi.owned) {
    comm.emplace(dist::Comm::world());
    if (comm->size() > 1) dp = &hooks.emplace(dist::data_parallel(*comm));
  }
#endif
  const bool rank0 = !dp || dp->rank == 0;
  TrainConfig cfg = o.cfg;
  cfg.model.placement = nn::parse_placement(o.placement);
  cfg.model.norm = nn::parse_norm_kind(o.norm);
  cfg.schedule = nn::parse_schedule(o.schedule);
  cfg.optimizer = nn::parse_optimizer(o.optimizer);
  const bool tty = ::isatty(::fileno(stderr)) != 0;
  auto last_draw = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  double last_val = NAN;
  auto progress = [&](const nn::StepReport& r) {
    if (!rank0) return;
    if (r.val_loss) last_val = *r.val_loss;
    if (tty) {
      const auto now = std::chrono::steady_clock::now();
      if (r.step != r.steps && now - last_draw < std::chrono::milliseconds(100)) return;
      last_draw = now;
      constexpr int kWidth = 24;
      const int filled = static_cast<int>(kWidth * r.step / std::max<std::int64_t>(r.steps, 1));
      std::string bar(static_cast<std::size_t>(filled), '#');
      bar.resize(kWidth, '.');
      std::fprintf(stderr, "\r[%s] step %lld/%lld  loss %.4f  val %s  %s tok/s  ETA %s   ", bar.c_str(),
                   static_cast<long long>(r.step), static_cast<long long>(r.steps), r.loss,
                   std::isnan(last_val) ? "-" : fmt::format("{:.4f}", last_val).c_str(),
                   format_rate(r.tokens_per_s).c_str(), format_duration(r.eta_s).c_str());
      if (r.step == r.steps) std::fputc('\n', stderr);
    } else if (r.val_loss) {
      std::fprintf(stderr, "step %lld/%lld loss %.4f val_loss %.4f lr %.3g %s tok/s ETA %s\n",
                   static_cast<long long>(r.step), static_cast<long long>(r.steps), r.loss, *r.val_loss, r.lr,
                   format_rate(r.tokens_per_s).c_str(), format_duration(r.eta_s).c_str());
    }
    std::fflush(stderr);
  };
  if (dp && rank0)
    std::fprintf(stderr, "data parallel: %d ranks, %lld sequences each step in all\n", dp->size,
                 static_cast<long long>(cfg.batch));
  const nn::TrainResult res = nn::train(cfg, progress, dp);
  if (tty && res.diverged && rank0) std::fputc('\n', stderr);
  if (res.diverged) throw Error(res.message);
  if (!rank0) return;
  nlohmann::json summary{{"steps", res.steps_done},
                         {"first_step", res.first_step},
                         {"final_loss", res.losses.empty() ? NAN : res.losses.back()},
                         {"final_val_loss", res.val_losses.empty() ? NAN : res.val_losses.back().second},
                         {"unigram", res.unigram},
                         {"unigram_val", res.unigram_val},
                         {"seconds", res.seconds},
                         {"ranks", dp ? dp->size : 1}};
  std::printf("%s\n", summary.dump().c_str());
}

struct EvalOptions {
  std::string checkpoint;
  int drop_last = -1;
  std::vector<int> skip;
  std::string data;  // empty: the checkpoint's
  std::int64_t val_windows = 0;  // 0: the checkpoint's
  int threads = 0;
};

void run_eval(const EvalOptions& o) {
  const nn::CheckpointMeta meta = nn::read_checkpoint_meta(o.checkpoint);
  const TrainConfig tc = nn::train_config_from_json(meta.extra);
  if (o.threads > 0) set_num_threads(o.threads);
  const int L = meta.model.layers;
  std::vector<int> skipped;
  if (o.drop_last >= 0) {
    NL_CHECK(o.drop_last <= L, "--drop-last {} exceeds the model's {} blocks", o.drop_last, L);
    for (int l = L - o.drop_last; l < L; ++l) skipped.push_back(l);
  }
  for (int b : o.skip) {
    NL_CHECK(b >= 0 && b < L, "--skip-block {} is outside the model's blocks 0..{}", b, L - 1);
    skipped.push_back(b);
  }
  nn::Model model(meta.model);
  nn::load_checkpoint(o.checkpoint, meta.model, model.params(), nullptr, model.buffers());
  const nn::LmData data = nn::LmData::load(o.data.empty() ? tc.data : o.data);
  const std::int64_t windows = o.val_windows > 0 ? o.val_windows : tc.val_windows;
  const double full = nn::evaluate(model, data, tc.seq, windows, tc.batch);
  model.set_skipped_blocks(skipped);
  const double removed = skipped.empty() ? full : nn::evaluate(model, data, tc.seq, windows, tc.batch);
  const nlohmann::json out{{"checkpoint", o.checkpoint},
                           {"step", meta.step},
                           {"placement", nn::placement_name(meta.model.placement)},
                           {"layers", L},
                           {"skipped", skipped},
                           {"val_loss", removed},
                           {"val_loss_full", full},
                           {"delta", removed - full},
                           {"val_windows", windows},
                           {"seq", tc.seq}};
  std::printf("%s\n", out.dump().c_str());
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  TrainConfig& c = o->cfg;
  CLI::App* cmd = app.add_subcommand("train", "Train a byte-level Transformer LM (the lab's training loop)");
  cmd->footer(
      "Logs one JSON line per evaluation to --log (step, loss, val_loss, lr, gradient norms, residual-stream "
      "norms, LN input norms, update/weight ratios, token cosine similarity). --checkpoint DIR is written "
      "at every evaluation; --resume DIR continues bit-identically (same flags, same --threads). A "
      "non-finite loss or gradient stops the run: exit 1, the last good checkpoint is kept.");
  cmd->add_option("--placement", o->placement, "Norm placement: post, pre, sandwich, deepnorm, b2t, mixln, lns, siamese, spannorm, none")
      ->capture_default_str();
  cmd->add_option("--norm", o->norm,
                  "Norm kind: layer | rms | dyt | batch (BatchNorm over batch and sequence, running statistics for "
                  "evaluation)")
      ->capture_default_str();
  cmd->add_option("--layers", c.model.layers, "Blocks")->capture_default_str();
  cmd->add_option("--d-model", c.model.d_model, "Model width")->capture_default_str();
  cmd->add_option("--heads", c.model.heads, "Attention heads")->capture_default_str();
  cmd->add_option("--ffn", c.model.ffn, "FFN hidden width")->capture_default_str();
  cmd->add_option("--seq", c.seq, "Sequence length T")->capture_default_str();
  cmd->add_option("--batch", c.batch, "Batch size B")->capture_default_str();
  cmd->add_option("--lr", c.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--warmup", c.warmup, "Warmup steps (linear, cosine, noam)")->capture_default_str();
  cmd->add_option("--schedule", o->schedule, "constant | linear (warmup, then constant) | cosine | noam")
      ->capture_default_str();
  cmd->add_option("--lr-floor", c.lr_floor, "cosine: final fraction of --lr")->capture_default_str();
  cmd->add_option("--steps", c.steps, "Optimizer steps")->capture_default_str();
  cmd->add_option("--seed", c.seed, "Seed of the initialization and of the training batches")->capture_default_str();
  cmd->add_option("--data", c.data, "Text file, or \"fortunes\" (Debian's fortunes corpus)")->capture_default_str();
  cmd->add_option("--log", c.log_path, "JSON-lines log file");
  cmd->add_option("--eval-every", c.eval_every, "Steps between evaluations/log lines/checkpoints (0: at the end)")
      ->capture_default_str();
  cmd->add_option("--val-windows", c.val_windows, "Fixed validation windows")->capture_default_str();
  cmd->add_option("--checkpoint", c.checkpoint_dir, "Checkpoint folder (written at every evaluation)");
  cmd->add_option("--resume", c.resume_dir, "Resume from this checkpoint folder");
  cmd->add_option("--threads", c.threads, "Threads (0: default)")->capture_default_str();
  cmd->add_option("--optimizer", o->optimizer, "adamw | sgd")->capture_default_str();
  cmd->add_option("--clip", c.clip, "Clip the global gradient norm to X (0: off)")->capture_default_str();
  cmd->add_option("--weight-decay", c.weight_decay, "Decoupled (AdamW) / L2 (SGD) weight decay; biases and norms excluded")
      ->capture_default_str();
  cmd->add_option("--momentum", c.momentum, "SGD momentum")->capture_default_str();
  cmd->callback([o] { run_train(*o); });
}

void add_eval_command(CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* cmd = app.add_subcommand("eval", "Validation loss of a trained checkpoint, optionally with blocks removed");
  cmd->add_option("--checkpoint", o->checkpoint, "Checkpoint folder (from normlab train --checkpoint)")->required();
  CLI::Option* drop = cmd->add_option("--drop-last", o->drop_last, "Remove the last K blocks");
  CLI::Option* skip = cmd->add_option("--skip-block", o->skip, "Remove block I (0-based; repeatable)");
  drop->excludes(skip);
  cmd->add_option("--data", o->data, "Text file or \"fortunes\" (default: the training run's)");
  cmd->add_option("--val-windows", o->val_windows, "Validation windows (default: the training run's)");
  cmd->add_option("--threads", o->threads, "Threads (0: default)");
  cmd->callback([o] { run_eval(*o); });
}

}  // namespace normlab::cli
