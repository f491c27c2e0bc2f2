// The training loop of the Transformer lab: a byte-level LM (nn/data.h) trained with AdamW or SGD
// (normlab/nn/optim.h) under a learning-rate schedule (nn/schedule.h), with JSON-lines logging,
// checkpoints (nn/checkpoint.h), resume and divergence detection.
//
// Step convention: update s (0-based) uses lr_at(schedule, s); "step" in logs and reports counts the
// updates done, so the line with "step": k reports update k's training loss (computed before that
// update), its gradients and instrumentation, and the validation loss AFTER it.
//
// Log (TrainConfig::log_path, one JSON object per line, written after update 1, every eval_every
// updates and after the last): step, loss (this update's training loss), loss_avg (mean training loss
// since the previous line), val_loss, lr, grad_norm (global, before clipping), grad_norms
// {param name: ‖g‖}, block_grad_norms [‖g‖ of each block's parameters], residual_norms, ln_input_norms,
// token_cosine (Model accessors), update_ratio {param name: ‖Δw‖/‖w‖}, tokens_per_s, elapsed_s.
// The first line is a header {"config": {...}, "unigram": H(train bytes), "unigram_val": validation
// cross-entropy under the training byte frequencies (the "stuck" level)} unless resuming (appended).
//
// Divergence: a non-finite training loss, gradient norm or validation loss stops the run; the result
// carries "diverged at step N: loss = nan" (or "gradient norm = inf", "val_loss = nan"), a final log
// line {"step": N, "diverged": true, "message": ...} is written, and no checkpoint is written after the
// last good one.
//
// Determinism: for a given thread count the run is a pure function of the config; resuming from the
// checkpoint written at step k reproduces the uninterrupted run's losses bit for bit (weights,
// optimizer state, step and the sampler's RNG state are restored; validation does not touch the RNG).
#pragma once

#include <normlab/nn/layers.h>
#include <normlab/nn/model.h>
#include <normlab/nn/optim.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "nn/data.h"
#include "nn/schedule.h"

namespace normlab::nn {

enum class OptimizerKind { kAdamW, kSgd };
const char* optimizer_name(OptimizerKind k);
OptimizerKind parse_optimizer(const std::string& name);  // "adamw" | "sgd"

struct TrainConfig {
  ModelConfig model;              // placement, sizes, norm, ...; max_seq and seed are overwritten by seq, seed
  std::string data = "fortunes";  // "fortunes" or a file path
  ScheduleKind schedule = ScheduleKind::kConstant;
  double lr = 3e-3;
  std::int64_t warmup = 0;
  double lr_floor = 0.1;  // cosine: final fraction of lr
  std::int64_t steps = 600;
  std::int64_t batch = 32;
  std::int64_t seq = 64;
  std::uint64_t seed = 0;           // model init (ModelConfig::seed) and the data sampler
  std::int64_t eval_every = 50;     // log + validation + checkpoint period (0: only at the end)
  std::int64_t val_windows = 256;   // fixed validation windows of seq+1 bytes
  double clip = 0;                  // global-norm clipping threshold; 0 = off (lab.md default)
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  double weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.98, eps = 1e-9;  // AdamW (lab.md)
  double momentum = 0.9;                         // SGD
  int threads = 0;                  // 0: keep the current setting
  std::string log_path;             // JSON lines; empty: no log
  std::string checkpoint_dir;       // written at every eval and at the end; empty: none
  std::string resume_dir;           // continue from this checkpoint; empty: fresh run
  bool instrument = true;           // per-parameter norms and Model accessors in the log
};

// The training configuration as JSON text (stored in checkpoints) and back (fields not present keep
// their defaults).
std::string train_config_json(const TrainConfig& cfg);
TrainConfig train_config_from_json(const std::string& json);

// What the progress callback sees after every update.
struct StepReport {
  std::int64_t step = 0;   // updates done
  std::int64_t steps = 0;  // total
  double loss = 0;         // this update's training loss
  double lr = 0;
  double grad_norm = 0;
  std::optional<double> val_loss;  // at eval steps
  double tokens_per_s = 0;         // since the start of this run (or resume)
  double elapsed_s = 0;
  double eta_s = 0;
};

struct TrainResult {
  std::int64_t first_step = 0;   // 0, or the resumed checkpoint's step
  std::int64_t steps_done = 0;   // updates completed (including before a resume)
  std::vector<double> losses;    // training loss of updates first_step+1 .. steps_done (and the diverged one)
  std::vector<std::pair<std::int64_t, double>> val_losses;  // (step, validation loss)
  bool diverged = false;
  std::string message;           // "diverged at step N: loss = nan" when diverged
  double unigram = 0;            // unigram entropy of the training split (nats)
  double unigram_val = 0;        // validation cross-entropy of a byte-frequency model (the stuck level)
  double seconds = 0;
};

// The data sampler's seed for TrainConfig::seed (unrelated to the model's initialization stream, the
// same for every arm of an experiment).
std::uint64_t sampler_seed(std::uint64_t seed);

// Data-parallel training: the loop's view of a group of processes (normlab_dist's
// dist::data_parallel(comm) makes one over MPI; this library does not depend on MPI). Every rank runs train()
// with the same config. Every step every rank samples the same batch (same sampler seed) and runs
// forward/backward on its share of the B sequences, [B·r/size, B·(r+1)/size) (B ≥ size); the loss and the
// gradients are then averaged over ranks weighted by predicted tokens, so they are the whole batch's and
// every rank clips and steps to the same bits. Rank 0 alone writes the log and the checkpoints; every rank
// evaluates (same parameters, same validation loss) and returns the same TrainResult. A BatchNorm model
// normalizes with the `batch_norm` kernels (dist::data_parallel's are SyncBatchNorm's: the whole batch's
// statistics, so the run stays that of one process); without them, with each rank's own batch statistics
// (PyTorch's DistributedDataParallel without SyncBatchNorm).
struct DataParallel {
  int rank = 0, size = 1;
  std::function<void(std::span<const ParamRef>)> broadcast;                         // rank 0's values to all
  std::function<void(std::span<const ParamRef>, double weight)> average_gradients;  // Σ w_r·g_r / Σ w_r
  std::function<double(double value, double weight)> weighted_mean;                 // Σ w_r·v_r / Σ w_r
  // BatchNorm models: the kernels of every BatchNorm layer (SyncBatchNorm's, so that the statistics are those
  // of the whole batch, as one process would take them); empty functions: each rank's own statistics.
  BatchNormKernels batch_norm;
};

// Runs the loop. Throws normlab::Error for invalid configs, unreadable data or checkpoints; divergence
// is not an exception (see TrainResult::diverged). dp: null for one process.
TrainResult train(const TrainConfig& cfg, const std::function<void(const StepReport&)>& progress = {},
                  const DataParallel* dp = nullptr);

// Mean cross-entropy over `windows` fixed validation windows of T+1 bytes, `batch` windows per forward,
// in eval mode (BatchNorm: the running statistics); the model's mode is restored afterwards.
double evaluate(Model& model, const LmData& data, Index T, Index windows, Index batch);

}  // namespace normlab::nn
