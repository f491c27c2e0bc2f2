// The training loop (src/nn/train.h).
#include "nn/train.h"

#include <normlab/error.h>
#include <normlab/parallel.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "nn/checkpoint.h"

namespace normlab::nn {

using nlohmann::json;

const char* optimizer_name(OptimizerKind k) { return k == OptimizerKind::kSgd ? "sgd" : "adamw"; }

OptimizerKind parse_optimizer(const std::string& name) {
  if (name == "adamw" || name == "adam") return OptimizerKind::kAdamW;
  if (name == "sgd") return OptimizerKind::kSgd;
  throw Error("unknown optimizer \"" + name + "\"; valid: adamw, sgd");
}

std::string train_config_json(const TrainConfig& c) {
  json j{{"model", json::parse(model_config_json(c.model))},
         {"placement", placement_name(c.model.placement)},
         {"data", c.data},
         {"schedule", schedule_name(c.schedule)},
         {"lr", c.lr},
         {"warmup", c.warmup},
         {"lr_floor", c.lr_floor},
         {"steps", c.steps},
         {"batch", c.batch},
         {"seq", c.seq},
         {"seed", c.seed},
         {"eval_every", c.eval_every},
         {"val_windows", c.val_windows},
         {"clip", c.clip},
         {"optimizer", optimizer_name(c.optimizer)},
         {"weight_decay", c.weight_decay},
         {"beta1", c.beta1},
         {"beta2", c.beta2},
         {"eps", c.eps},
         {"momentum", c.momentum},
         {"threads", c.threads}};
  return j.dump();
}

TrainConfig train_config_from_json(const std::string& text) {
  TrainConfig c;
  try {
    const json j = json::parse(text);
    if (j.contains("model")) c.model = model_config_from_json(j.at("model").dump());
    auto get = [&](const char* key, auto& field) {
      if (j.contains(key)) field = j.at(key).get<std::decay_t<decltype(field)>>();
    };
    get("data", c.data);
    if (j.contains("schedule")) c.schedule = parse_schedule(j.at("schedule").get<std::string>());
    get("lr", c.lr);
    get("warmup", c.warmup);
    get("lr_floor", c.lr_floor);
    get("steps", c.steps);
    get("batch", c.batch);
    get("seq", c.seq);
    get("seed", c.seed);
    get("eval_every", c.eval_every);
    get("val_windows", c.val_windows);
    get("clip", c.clip);
    if (j.contains("optimizer")) c.optimizer = parse_optimizer(j.at("optimizer").get<std::string>());
    get("weight_decay", c.weight_decay);
    get("beta1", c.beta1);
    get("beta2", c.beta2);
    get("eps", c.eps);
    get("momentum", c.momentum);
    get("threads", c.threads);
  } catch (const json::exception& e) {
    throw Error(fmt::format("malformed training configuration JSON: {}", e.what()));
  }
  return c;
}

std::uint64_t sampler_seed(std::uint64_t seed) { return seed ^ 0x9E3779B97F4A7C15ull; }

double evaluate(Model& model, const LmData& data, Index T, Index windows, Index batch) {
  NL_CHECK(batch >= 1, "evaluation batch must be ≥ 1, got {}", batch);
  // eval mode (BatchNorm: running statistics, none updated), restored on the way out
  struct EvalMode {
    Model& m;
    bool was;
    explicit EvalMode(Model& model) : m(model), was(model.training()) { m.set_training(false); }
    ~EvalMode() { m.set_training(was); }
  } eval_mode(model);
  const std::vector<Index> offsets = data.validation_offsets(T, windows);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * T)), targets(tokens.size());
  double sum = 0;
  Index count = 0;
  for (Index first = 0; first < windows; first += batch) {
    const Index b = std::min(batch, windows - first);
    const std::span<const Index> chunk(offsets.data() + first, static_cast<std::size_t>(b));
    data.validation_batch(tokens.data(), targets.data(), chunk, T);
    sum += model.forward(tokens.data(), targets.data(), b, T) * static_cast<double>(b);
    count += b;
  }
  return sum / static_cast<double>(count);
}

namespace {

// "nan" / "inf" / "-inf" / the number (fmt would print a NaN's sign bit as "-nan").
std::string fmt_value(double x) {
  if (std::isnan(x)) return "nan";
  return fmt::format("{}", x);
}

// Block index of "blocks.<i>.…", or −1.
int block_of(const std::string& name) {
  if (!name.starts_with("blocks.")) return -1;
  const std::size_t end = name.find('.', 7);
  try {
    return std::stoi(name.substr(7, end - 7));
  } catch (...) {
    return -1;
  }
}

void check_config(const TrainConfig& c) {
  NL_CHECK(c.steps >= 1, "steps must be ≥ 1, got {}", c.steps);
  NL_CHECK(c.batch >= 1, "batch must be ≥ 1, got {}", c.batch);
  NL_CHECK(c.seq >= 1, "seq must be ≥ 1, got {}", c.seq);
  NL_CHECK(c.eval_every >= 0, "eval-every must be ≥ 0, got {}", c.eval_every);
  NL_CHECK(c.val_windows >= 1, "validation windows must be ≥ 1, got {}", c.val_windows);
  NL_CHECK(std::isfinite(c.clip) && c.clip >= 0, "clip must be finite and ≥ 0 (0 = off), got {}", c.clip);
  NL_CHECK(c.threads >= 0, "threads must be ≥ 1 (or 0 for the default), got {}", c.threads);
  NL_CHECK(c.model.head == Head::kLanguageModel, "the training loop trains language models (head = LM)");
  NL_CHECK(c.model.vocab == 256, "byte-level data needs vocab = 256, got {}", c.model.vocab);
}

}  // namespace

TrainResult train(const TrainConfig& in, const std::function<void(const StepReport&)>& progress,
                  const DataParallel* dp) {
  using Clock = std::chrono::steady_clock;
  TrainConfig cfg = in;
  check_config(cfg);
  if (dp) {
    NL_CHECK(dp->size >= 1 && dp->rank >= 0 && dp->rank < dp->size, "data parallel: rank {} of {} is invalid",
             dp->rank, dp->size);
    NL_CHECK(cfg.batch >= dp->size, "data parallel: batch {} is smaller than the number of ranks {}",
             cfg.batch, dp->size);
    NL_CHECK(dp->broadcast && dp->average_gradients && dp->weighted_mean, "data parallel: a hook is missing");
    // Each rank's backward is that of its own mean loss; gradient averaging weighs the ranks' results, but
    // SyncBatchNorm's backward also sums the ranks' dy, which is exact only when every share weighs the same.
    NL_CHECK(cfg.model.norm != NormKind::kBatchNorm || cfg.batch % dp->size == 0,
             "data parallel: a BatchNorm model needs a batch ({}) divisible by the number of ranks ({})",
             cfg.batch, dp->size);
  }
  const bool writer = !dp || dp->rank == 0;  // log and checkpoints
  cfg.model.max_seq = static_cast<int>(cfg.seq);
  cfg.model.seed = cfg.seed;
  const Schedule sched{cfg.schedule, cfg.lr, cfg.warmup, cfg.steps, cfg.lr_floor};
  validate(sched);
  if (cfg.threads > 0) {
    set_num_threads(cfg.threads);
    omp_set_num_threads(cfg.threads);
  }

  const LmData data = LmData::load(cfg.data);
  Model model(cfg.model);
  std::vector<ParamRef> params = model.params();
  std::unique_ptr<Optimizer> opt;
  if (cfg.optimizer == OptimizerKind::kAdamW)
    opt = std::make_unique<AdamW>(params, AdamWOptions{cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, true});
  else
    opt = std::make_unique<Sgd>(params, SgdOptions{cfg.momentum, 0.0, false, cfg.weight_decay, true});
  // The sampler's seed differs from the model's so that the two streams are unrelated; it depends on
  // `seed` only, so every arm of an experiment with the same seed sees the same batches.
  BatchSampler sampler(data, sampler_seed(cfg.seed));

  TrainResult res;
  res.unigram = unigram_entropy(data.train());
  res.unigram_val = unigram_cross_entropy(data.train(), data.val());
  std::int64_t start = 0;
  if (!cfg.resume_dir.empty()) {
    const CheckpointMeta meta = load_checkpoint(cfg.resume_dir, cfg.model, params, opt.get(), model.buffers());
    start = meta.step;
    NL_CHECK(start <= cfg.steps, "checkpoint {} is at step {}, beyond --steps {}", checkpoint_file(cfg.resume_dir),
             start, cfg.steps);
    sampler.set_rng_state(meta.rng_state);
  }
  if (dp) dp->broadcast(params);  // the same start on every rank (DistributedDataParallel does this too)
  if (dp && dp->batch_norm.forward) model.set_batch_norm_kernels(&dp->batch_norm);
  res.first_step = start;
  res.steps_done = start;

  std::ofstream log;
  if (!cfg.log_path.empty() && writer) {
    log.open(cfg.log_path, start > 0 ? std::ios::app : std::ios::trunc);
    NL_CHECK(log.good(), "cannot write the log {}", cfg.log_path);
    if (start == 0)
      log << json{{"config", json::parse(train_config_json(cfg))},
                  {"unigram", res.unigram},
                  {"unigram_val", res.unigram_val},
                  {"train_bytes", data.train_size()},
                  {"val_bytes", data.val_size()}}
                 .dump()
          << '\n'
          << std::flush;
  }
  const std::string extra = train_config_json(cfg);
  auto save = [&](std::int64_t step) {
    if (cfg.checkpoint_dir.empty() || !writer) return;
    CheckpointMeta meta;
    meta.model = cfg.model;
    meta.step = step;
    meta.rng_state = sampler.rng_state();
    meta.extra = extra;
    save_checkpoint(cfg.checkpoint_dir, meta, params, opt.get(), model.buffers());
  };

  const Index B = cfg.batch, T = cfg.seq;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(B * T)), targets(tokens.size());
  std::vector<std::vector<float>> before;  // weights before a logged update
  double loss_sum = 0;
  std::int64_t loss_n = 0;
  const auto t0 = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };

  auto diverge = [&](std::int64_t step, const std::string& what) {
    res.diverged = true;
    res.message = fmt::format("diverged at step {}: {}", step, what);
    if (log.is_open())
      log << json{{"step", step}, {"diverged", true}, {"message", res.message}}.dump() << '\n' << std::flush;
    res.seconds = elapsed();
    return res;
  };

  for (std::int64_t s = start; s < cfg.steps; ++s) {
    const std::int64_t step = s + 1;
    sampler.sample(tokens.data(), targets.data(), B, T);
    // This rank's share of the batch (all of it without data parallelism).
    const Index lo = dp ? B * dp->rank / dp->size : 0, hi = dp ? B * (dp->rank + 1) / dp->size : B;
    const double share_loss = model.forward(tokens.data() + lo * T, targets.data() + lo * T, hi - lo, T);
    double predicted = 0;  // the share's weight: its predicted tokens (targets ≥ 0)
    for (Index i = lo * T; i < hi * T; ++i) predicted += targets[static_cast<std::size_t>(i)] >= 0 ? 1 : 0;
    const double loss = dp ? dp->weighted_mean(share_loss, predicted) : share_loss;
    res.losses.push_back(loss);
    if (!std::isfinite(loss)) return diverge(step, "loss = " + fmt_value(loss));
    model.backward();
    if (dp) dp->average_gradients(params, predicted);
    const bool log_now = step == 1 || (cfg.eval_every > 0 && step % cfg.eval_every == 0) || step == cfg.steps;

    json line;
    if (log_now && cfg.instrument) {
      json gn = json::object();
      std::vector<double> block_sq(static_cast<std::size_t>(cfg.model.layers), 0.0);
      for (const ParamRef& p : params) {
        const double n = l2_norm(p.grad, p.numel());
        gn[p.name] = n;
        const int b = block_of(p.name);
        if (b >= 0 && b < cfg.model.layers) block_sq[static_cast<std::size_t>(b)] += n * n;
      }
      for (double& x : block_sq) x = std::sqrt(x);
      line["grad_norms"] = gn;
      line["block_grad_norms"] = block_sq;
      line["residual_norms"] = model.residual_norms();
      line["ln_input_norms"] = model.ln_input_norms();
      line["token_cosine"] = model.token_cosine();
      before.resize(params.size());
      for (std::size_t i = 0; i < params.size(); ++i)
        before[i].assign(params[i].data, params[i].data + params[i].numel());
    }
    const double gnorm = clip_grad_norm(params, cfg.clip);
    if (!std::isfinite(gnorm))
      return diverge(step, fmt::format("gradient norm = {} (loss = {})", fmt_value(gnorm), loss));
    const double lr = lr_at(sched, s);
    opt->step(lr);
    res.steps_done = step;
    loss_sum += loss;
    ++loss_n;

    StepReport rep;
    rep.step = step;
    rep.steps = cfg.steps;
    rep.loss = loss;
    rep.lr = lr;
    rep.grad_norm = gnorm;
    rep.elapsed_s = elapsed();
    rep.tokens_per_s = static_cast<double>((step - start) * B * T) / std::max(rep.elapsed_s, 1e-9);
    rep.eta_s = rep.elapsed_s / static_cast<double>(step - start) * static_cast<double>(cfg.steps - step);
    if (log_now) {
      const double val = evaluate(model, data, T, cfg.val_windows, B);
      if (!std::isfinite(val)) return diverge(step, "val_loss = " + fmt_value(val));
      res.val_losses.emplace_back(step, val);
      rep.val_loss = val;
      if (cfg.instrument) {
        json ur = json::object();
        for (std::size_t i = 0; i < params.size(); ++i) {
          const Index n = params[i].numel();
          double d2 = 0, w2 = 0;
          for (Index j = 0; j < n; ++j) {
            const double w = before[i][static_cast<std::size_t>(j)];
            const double d = static_cast<double>(params[i].data[j]) - w;
            d2 += d * d;
            w2 += w * w;
          }
          ur[params[i].name] = w2 > 0 ? std::sqrt(d2 / w2) : 0.0;
        }
        line["update_ratio"] = ur;
      }
      line["step"] = step;
      line["loss"] = loss;
      line["loss_avg"] = loss_sum / static_cast<double>(loss_n);
      line["val_loss"] = val;
      line["lr"] = lr;
      line["grad_norm"] = gnorm;
      line["tokens_per_s"] = rep.tokens_per_s;
      line["elapsed_s"] = rep.elapsed_s;
      loss_sum = 0;
      loss_n = 0;
      if (log.is_open()) log << line.dump() << '\n' << std::flush;
      save(step);
    }
    if (progress) progress(rep);
  }
  res.seconds = elapsed();
  return res;
}

}  // namespace normlab::nn
