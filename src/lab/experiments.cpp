// The lab's experiments (see experiments.h and docs/LAB.md).
#include "lab/experiments.h"

#include <fmt/format.h>
#include <normlab/error.h>
#include <normlab/nn/model.h>
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>

#include "nn/checkpoint.h"
#include "nn/data.h"
#include "nn/train.h"
#include <normlab/nn/layers.h>
#include "speech/dataset.h"
#include "speech/study.h"

namespace normlab::lab {

namespace {

using json = nlohmann::json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- sizes: lab.md's designs (default) and the --quick reductions ----------------------------------
struct Sizes {
  // claims 4, 5: gradients at init
  std::vector<int> depths;
  int g_d, g_heads, g_ffn, g_seq, g_batch, g_batches;
  // claim 6 (and its models for 8, 9)
  int c6_layers, d, heads, ffn, seq, batch;
  std::int64_t c6_steps, c6_warmup;
  double c6_lr;
  std::int64_t eval_every, val_windows;
  // claim 7
  int c7_layers;
  std::int64_t c7_steps, c7_warmup;
  double c7_lr;
  // claim 8 at depth (first seed only): Post-LN's gentler schedule and a Pre-LN control on it
  bool c8_deep;
  int c8_layers;
  double c8_lr;
  std::int64_t c8_warmup, c8_steps;
  // experiments 11 (placement variants without warmup) and 12 (Post-LN's warmup threshold vs depth): the first
  // seed only, claim 6's model width and learning rate with a shorter, smaller-batch run. Sized to fit the
  // default run's budget (docs/LAB.md): raise x_batch / x_steps when training gets faster.
  std::vector<int> v_depths;
  std::vector<int> w_depths;
  std::vector<std::int64_t> w_warmups;
  int x_batch;
  std::int64_t x_steps, x_eval_every, x_val_windows;
  double x_lr;
  // claim 2, trained: the next-byte MLP (examples seen per arm; batch 64 and batch 2 see the same ones)
  std::int64_t mlp_examples;
};

Sizes sizes(bool quick) {
  if (!quick)
    return Sizes{.depths = {6, 12, 24}, .g_d = 128, .g_heads = 4, .g_ffn = 512, .g_seq = 64, .g_batch = 32,
                 .g_batches = 8, .c6_layers = 6, .d = 64, .heads = 4, .ffn = 256, .seq = 64, .batch = 32,
                 .c6_steps = 600, .c6_warmup = 200, .c6_lr = 3e-3, .eval_every = 50, .val_windows = 256,
                 .c7_layers = 3, .c7_steps = 1000, .c7_warmup = 200, .c7_lr = 3e-3, .c8_deep = true,
                 .c8_layers = 12, .c8_lr = 1e-3, .c8_warmup = 400, .c8_steps = 600,
                 .v_depths = {6, 12}, .w_depths = {2, 4, 6, 8}, .w_warmups = {0, 100}, .x_batch = 16,
                 .x_steps = 200, .x_eval_every = 50, .x_val_windows = 64, .x_lr = 3e-3,
                 .mlp_examples = 64 * 200};
  return Sizes{.depths = {2, 4, 8}, .g_d = 64, .g_heads = 4, .g_ffn = 256, .g_seq = 32, .g_batch = 8,
               .g_batches = 2, .c6_layers = 6, .d = 64, .heads = 4, .ffn = 256, .seq = 64, .batch = 16,
               .c6_steps = 200, .c6_warmup = 50, .c6_lr = 3e-3, .eval_every = 25, .val_windows = 64,
               .c7_layers = 3, .c7_steps = 200, .c7_warmup = 40, .c7_lr = 3e-3, .c8_deep = false,
               .c8_layers = 12, .c8_lr = 1e-3, .c8_warmup = 400, .c8_steps = 600,
               .v_depths = {2, 4}, .w_depths = {1, 4}, .w_warmups = {0, 20}, .x_batch = 8, .x_steps = 60,
               .x_eval_every = 20, .x_val_windows = 32, .x_lr = 3e-3,
               .mlp_examples = 64 * 60};
}

std::string quick_note(bool quick) {
  return quick ? "--quick: reduced sizes (see config); the verdict describes these sizes, not lab.md's designs. " : "";
}

// ---- job specs ---------------------------------------------------------------------------------------
struct Arm {
  std::string name;
  nn::Placement placement;
  nn::ScheduleKind schedule;
  std::int64_t warmup;
};

std::vector<Arm> c6_arms(const Sizes& z) {
  return {{"post-nowarmup", nn::Placement::kPost, nn::ScheduleKind::kConstant, 0},
          {"post-warmup", nn::Placement::kPost, nn::ScheduleKind::kLinear, z.c6_warmup},
          {"pre-nowarmup", nn::Placement::kPre, nn::ScheduleKind::kConstant, 0},
          {"pre-warmup", nn::Placement::kPre, nn::ScheduleKind::kLinear, z.c6_warmup}};
}

// Experiment 11's variants (docs/placements.md), each trained without warmup; "post" and "pre" are the controls.
// SpanNorm is listed but not run: the engine refuses it (its block formula could not be verified).
struct Variant {
  const char* name;
  nn::Placement placement;
  nn::NormKind norm;
};
constexpr Variant kVariants[] = {
    {"post", nn::Placement::kPost, nn::NormKind::kLayerNorm},         {"pre", nn::Placement::kPre, nn::NormKind::kLayerNorm},
    {"b2t", nn::Placement::kB2T, nn::NormKind::kLayerNorm},           {"siamese", nn::Placement::kSiamese, nn::NormKind::kLayerNorm},
    {"sandwich", nn::Placement::kSandwich, nn::NormKind::kLayerNorm}, {"deepnorm", nn::Placement::kDeepNorm, nn::NormKind::kLayerNorm},
    {"mixln", nn::Placement::kMixLN, nn::NormKind::kLayerNorm},       {"lns", nn::Placement::kLNS, nn::NormKind::kLayerNorm},
    {"dyt", nn::Placement::kPre, nn::NormKind::kDyT},
};
constexpr const char* kRefusedVariant = "spannorm";

std::string x_key(const std::string& variant, int layers, std::int64_t warmup, int seed) {
  return fmt::format("x-{}-L{}-w{}-s{}", variant, layers, warmup, seed);
}

nn::TrainConfig base_train(const Sizes& z, const LabOptions& opt, int seed) {
  nn::TrainConfig c;
  c.model.d_model = z.d, c.model.heads = z.heads, c.model.ffn = z.ffn;
  c.seq = z.seq, c.batch = z.batch, c.seed = static_cast<std::uint64_t>(seed);
  c.eval_every = z.eval_every, c.val_windows = z.val_windows, c.data = opt.data;
  c.threads = 1;
  return c;
}

std::string train_command(const nn::TrainConfig& c, const std::string& key, bool checkpoint) {
  std::string s = fmt::format(
      "normlab train --placement {} --layers {} --d-model {} --heads {} --ffn {} --seq {} --batch {} --lr {:g} "
      "--schedule {} --warmup {}",
      nn::placement_name(c.model.placement), c.model.layers, c.model.d_model, c.model.heads, c.model.ffn, c.seq,
      c.batch, c.lr, nn::schedule_name(c.schedule), c.warmup);
  if (c.schedule == nn::ScheduleKind::kCosine) s += fmt::format(" --lr-floor {:g}", c.lr_floor);
  s += fmt::format(" --steps {} --seed {} --eval-every {} --val-windows {} --data {} --threads 1 --log {}.jsonl",
                   c.steps, c.seed, c.eval_every, c.val_windows, c.data, key);
  if (checkpoint) s += fmt::format(" --checkpoint {}-ckpt", key);
  if (c.model.norm != nn::NormKind::kLayerNorm) s += fmt::format(" --norm {}", nn::norm_kind_name(c.model.norm));
  return s;
}

Job train_job(const std::string& key, const nn::TrainConfig& c, bool removal) {
  Job j;
  j.key = key;
  j.spec = {{"kind", "train"}, {"config", json::parse(nn::train_config_json(c))}, {"removal", removal}};
  j.commands.push_back(train_command(c, key, removal));
  if (removal) {
    j.commands.push_back(fmt::format("normlab eval --checkpoint {}-ckpt --drop-last K   # K = 1..{}", key,
                                     c.model.layers - 1));
    j.commands.push_back(fmt::format("normlab eval --checkpoint {}-ckpt --skip-block I   # I = 0..{}", key,
                                     c.model.layers - 1));
  }
  j.cost = static_cast<double>(c.model.layers) * c.model.d_model * c.model.d_model * static_cast<double>(c.steps) *
           static_cast<double>(c.batch * c.seq) * 1e-9;
  return j;
}

// Claim 3: one run builds the spoken-digit data (speech/dataset.h) into its run directory and computes part (a)
// of the speech study (speech/study.h): feature residuals per corruption and front end. --quick: --limit 2.
constexpr const char* kC3Key = "c3-speech";
constexpr int kC3Seed = 0;
int c3_limit(bool quick) { return quick ? 2 : 0; }

std::string mlp_key(int seed) { return fmt::format("c2-mlp-s{}", seed); }
constexpr int kMlpCtx = 8, kMlpEmb = 16, kMlpHidden = 128, kMlpValExamples = 4096;
constexpr double kMlpLr64 = 2e-3;

std::string c6_key(const std::string& arm, int seed) { return fmt::format("c6-{}-s{}", arm, seed); }
std::string c7_key(const std::string& arm, int seed) { return fmt::format("c7-{}-s{}", arm, seed); }
std::string c8_key(const std::string& arm, int layers, int seed) {
  return fmt::format("c8-L{}-{}-s{}", layers, arm, seed);
}
std::string grad_key(const std::string& placement, int layers, int seed) {
  return fmt::format("grad-{}-L{}-s{}", placement, layers, seed);
}

json grad_spec(const Sizes& z, const LabOptions& opt, const std::string& placement, int layers, int seed) {
  return {{"kind", "gradnorms"}, {"placement", placement}, {"layers", layers},      {"d_model", z.g_d},
          {"heads", z.g_heads},  {"ffn", z.g_ffn},         {"seq", z.g_seq},        {"batch", z.g_batch},
          {"batches", z.g_batches}, {"seed", seed},        {"data", opt.data}};
}

nn::TrainConfig x_train(const Sizes& z, const LabOptions& opt, const Variant& v, int layers, std::int64_t warmup,
                        int seed) {
  nn::TrainConfig c = base_train(z, opt, seed);
  c.model.layers = layers, c.model.placement = v.placement, c.model.norm = v.norm;
  c.batch = z.x_batch, c.steps = z.x_steps, c.lr = z.x_lr, c.eval_every = z.x_eval_every;
  c.val_windows = z.x_val_windows;
  c.schedule = warmup > 0 ? nn::ScheduleKind::kLinear : nn::ScheduleKind::kConstant, c.warmup = warmup;
  return c;
}

}  // namespace

const std::vector<Section>& sections() {
  static const std::vector<Section> s = {
      {"neuron", "The neuron", {}},
      {"layer", "The layer", {}},
      {"layernorm-math", "LayerNorm math: worked examples", {1}},
      {"ln-vs-bn", "LayerNorm vs BatchNorm", {2}},
      {"f-vs-t", "F vs T normalization on speech", {3}},
      {"placement", "Pre/Post placement", {4, 7}},
      {"gradient-flow", "Gradient flow at initialization", {5}},
      {"residual-growth", "Residual-stream norm growth", {10}},
      {"warmup", "Warmup", {6, 12}},
      {"layer-utilization", "Layer utilization and token similarity", {8, 9}},
      {"variants", "Variants", {11}},
  };
  return s;
}

std::string lab_command(const LabOptions& opt, int claim) {
  std::string s = fmt::format("normlab lab --only {}", claim);
  if (opt.quick) s += " --quick";
  const bool default_seeds = opt.quick ? opt.seeds == std::vector<int>{0} : opt.seeds == std::vector<int>{0, 1, 2};
  if (!default_seeds) s += fmt::format(" --seeds {}", opt.seeds.size());
  if (opt.data != "fortunes") s += fmt::format(" --data {}", opt.data);
  return s;
}

std::vector<Job> plan_jobs(const LabOptions& opt) {
  const Sizes z = sizes(opt.quick);
  std::vector<Job> jobs;
  if (opt.wants(3)) {
    Job j;
    j.key = kC3Key;
    const int limit = c3_limit(opt.quick);
    j.spec = {{"kind", "speech"}, {"seed", kC3Seed}, {"limit", limit}, {"renditions", 5}};
    const std::string lim = limit > 0 ? fmt::format(" --limit {}", limit) : "";
    j.commands.push_back(fmt::format(
        "normlab speech-data --out speech-data --seed {}{} && normlab speech-study --data speech-data "
        "--no-classifier --out study.json",
        kC3Seed, lim));
    // Full data set: ~1 min for 3100 clips + 3600 corrupted copies with one espeak-ng/sox pipeline at a time.
    j.cost = limit > 0 ? 0.5 : 20;
    jobs.push_back(std::move(j));
  }
  if (opt.wants(2))
    for (int seed : opt.seeds) {
      Job j;
      j.key = mlp_key(seed);
      j.spec = {{"kind", "mlp"}, {"seed", seed}, {"ctx", kMlpCtx}, {"emb", kMlpEmb}, {"hidden", kMlpHidden},
                {"examples", z.mlp_examples}, {"lr64", kMlpLr64}, {"val_examples", kMlpValExamples}, {"data", opt.data}};
      j.commands.push_back(fmt::format("normlab lab --only 2{}   # the MLP runs only inside the lab (hidden lab-job)",
                                       opt.quick ? " --quick" : ""));
      j.cost = double(z.mlp_examples) * 4 * 2e-5;
      jobs.push_back(std::move(j));
    }
  if (opt.wants(4) || opt.wants(5) || opt.wants(10)) {
    for (int seed : opt.seeds)
      for (const char* p : {"post", "pre"})
        for (int L : z.depths) {
          Job j;
          j.key = grad_key(p, L, seed);
          j.spec = grad_spec(z, opt, p, L, seed);
          j.commands.push_back(fmt::format(
              "normlab gradnorms --placement {} --layers {} --d-model {} --heads {} --ffn {} --seq {} --batch {} "
              "--batches {} --seed {} --data {} --json",
              p, L, z.g_d, z.g_heads, z.g_ffn, z.g_seq, z.g_batch, z.g_batches, seed, opt.data));
          j.cost = L * double(z.g_d) * z.g_d * z.g_batches * z.g_batch * z.g_seq * 3e-9;
          jobs.push_back(std::move(j));
        }
  }
  if (opt.wants(6) || opt.wants(8) || opt.wants(9)) {
    for (int seed : opt.seeds)
      for (const Arm& a : c6_arms(z)) {
        nn::TrainConfig c = base_train(z, opt, seed);
        c.model.layers = z.c6_layers, c.model.placement = a.placement;
        c.schedule = a.schedule, c.warmup = a.warmup, c.lr = z.c6_lr, c.steps = z.c6_steps;
        jobs.push_back(train_job(c6_key(a.name, seed), c, opt.wants(8) && a.name != "post-nowarmup"));
      }
  }
  if (opt.wants(7)) {
    for (int seed : opt.seeds)
      for (auto [arm, p] : {std::pair{"post", nn::Placement::kPost}, std::pair{"pre", nn::Placement::kPre}}) {
        nn::TrainConfig c = base_train(z, opt, seed);
        c.model.layers = z.c7_layers, c.model.placement = p;
        c.schedule = nn::ScheduleKind::kCosine, c.warmup = z.c7_warmup, c.lr = z.c7_lr, c.steps = z.c7_steps;
        c.lr_floor = 0.1;
        jobs.push_back(train_job(c7_key(arm, seed), c, false));
      }
  }
  if (opt.wants(8) && z.c8_deep && !opt.seeds.empty()) {
    const int seed = opt.seeds.front();
    for (auto [arm, p] : {std::pair{"post", nn::Placement::kPost}, std::pair{"pre", nn::Placement::kPre}}) {
      nn::TrainConfig c = base_train(z, opt, seed);
      c.model.layers = z.c8_layers, c.model.placement = p;
      c.schedule = nn::ScheduleKind::kLinear, c.warmup = z.c8_warmup, c.lr = z.c8_lr, c.steps = z.c8_steps;
      jobs.push_back(train_job(c8_key(arm, z.c8_layers, seed), c, true));
    }
  }
  // Experiments 11 and 12 share their Post-LN runs without warmup at the common depths.
  if ((opt.wants(11) || opt.wants(12)) && !opt.seeds.empty()) {
    const int seed = opt.seeds.front();
    auto add = [&](const Variant& v, int layers, std::int64_t warmup) {
      const std::string key = x_key(v.name, layers, warmup, seed);
      for (const Job& j : jobs)
        if (j.key == key) return;
      jobs.push_back(train_job(key, x_train(z, opt, v, layers, warmup, seed), false));
    };
    if (opt.wants(11))
      for (const Variant& v : kVariants)
        for (int L : z.v_depths) add(v, L, 0);
    if (opt.wants(12))
      for (int L : z.w_depths)
        for (std::int64_t w : z.w_warmups) add(kVariants[0], L, w);
  }
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.cost > b.cost; });
  return jobs;
}

// ---- running one job -------------------------------------------------------------------------------------
namespace {

void single_thread() {
  set_num_threads(1);
  omp_set_num_threads(1);
}

json run_gradnorms(const json& s) {
  // The computation of `normlab gradnorms` (tools/cli/cmd_gradnorms.cpp): the same model, sampler seed, batch
  // order and averaging of squared norms.
  nn::ModelConfig cfg;
  cfg.placement = nn::parse_placement(s.at("placement").get<std::string>());
  cfg.layers = s.at("layers"), cfg.d_model = s.at("d_model"), cfg.heads = s.at("heads"), cfg.ffn = s.at("ffn");
  const int seq = s.at("seq"), batch = s.at("batch"), batches = s.at("batches");
  const std::uint64_t seed = s.at("seed").get<std::uint64_t>();
  cfg.vocab = 256, cfg.max_seq = seq, cfg.seed = seed;
  nn::Model model(cfg);
  model.record_input_grads(true);  // ∂L/∂x_l per block input (claim 4)
  const nn::LmData data = nn::LmData::load(s.value("data", std::string("fortunes")));
  nn::BatchSampler sampler(data, seed);
  std::vector<nn::ParamRef> params = model.params();
  std::vector<double> sq(params.size(), 0.0);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * seq)), targets(tokens.size());
  double loss_sum = 0;
  std::vector<double> dx(static_cast<std::size_t>(cfg.layers), 0.0), resid(dx.size(), 0.0);
  for (int i = 0; i < batches; ++i) {
    sampler.sample(tokens.data(), targets.data(), batch, seq);
    loss_sum += model.forward(tokens.data(), targets.data(), batch, seq);
    model.backward();
    const std::vector<double> d = model.input_grad_norms(), r = model.residual_norms();
    for (std::size_t l = 0; l < dx.size(); ++l) dx[l] += d[l] / batches, resid[l] += r[l] / batches;
    for (std::size_t t = 0; t < params.size(); ++t) {
      double v = 0;
      for (Index j = 0; j < params[t].numel(); ++j) v += double(params[t].grad[j]) * params[t].grad[j];
      sq[t] += v;
    }
  }
  std::vector<double> ffn2(static_cast<std::size_t>(cfg.layers), kNaN), block(static_cast<std::size_t>(cfg.layers), 0.0);
  json named = json::object();
  for (std::size_t t = 0; t < params.size(); ++t) {
    const double norm = std::sqrt(sq[t] / batches);
    named[params[t].name] = norm;
    const std::string& n = params[t].name;
    if (!n.starts_with("blocks.")) continue;
    const std::size_t dot = n.find('.', 7);
    const int l = std::stoi(n.substr(7, dot - 7));
    const std::string rest = n.substr(dot + 1);
    block[static_cast<std::size_t>(l)] += sq[t] / batches;
    if (rest == "ffn.w2.weight") ffn2[static_cast<std::size_t>(l)] = norm;
  }
  for (double& b : block) b = std::sqrt(b);
  json f = json::array(), b = json::array();
  for (double v : ffn2) f.push_back(finite_or_null(v));
  for (double v : block) b.push_back(finite_or_null(v));
  json jdx = json::array(), jres = json::array();
  for (double v : dx) jdx.push_back(finite_or_null(v));
  for (double v : resid) jres.push_back(finite_or_null(v));
  // dx: mean over the batches of Model::input_grad_norms (‖∂L/∂x_l‖, block l's input); resid: of residual_norms.
  return {{"loss", loss_sum / batches}, {"ffn2", f}, {"block", b}, {"params", named}, {"dx", jdx}, {"resid", jres}};
}

json run_train(const json& s, const std::string& work_dir) {
  namespace fs = std::filesystem;
  nn::TrainConfig cfg = nn::train_config_from_json(s.at("config").dump());
  const bool removal = s.value("removal", false);
  cfg.threads = 1;
  cfg.log_path = (fs::path(work_dir) / "train.jsonl").string();
  cfg.checkpoint_dir = removal ? (fs::path(work_dir) / "ckpt").string() : std::string();
  const nn::TrainResult res = nn::train(cfg);
  json out;
  json val = json::array();
  for (const auto& [step, v] : res.val_losses) val.push_back({step, finite_or_null(v)});
  json train = json::array();  // mean training loss per 10 updates
  for (std::size_t i = 0; i < res.losses.size(); i += 10) {
    double sum = 0;
    std::size_t n = 0;
    for (std::size_t k = i; k < std::min(res.losses.size(), i + 10); ++k) sum += res.losses[k], ++n;
    train.push_back({static_cast<std::int64_t>(i + n), finite_or_null(sum / static_cast<double>(n))});
  }
  out["val"] = val;
  out["train"] = train;
  out["unigram"] = res.unigram;
  out["unigram_val"] = res.unigram_val;
  out["diverged"] = res.diverged;
  out["message"] = res.message;
  out["steps_done"] = res.steps_done;
  out["final_val"] = res.diverged || res.val_losses.empty() ? json(nullptr) : finite_or_null(res.val_losses.back().second);
  // Token cosine (and block gradient norms) at the first and the last logged update, from the log.
  std::ifstream log(cfg.log_path);
  std::string line;
  json first, last;
  while (std::getline(log, line)) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("token_cosine")) continue;
    if (first.is_null()) first = j;
    last = j;
  }
  auto pick = [](const json& j, const char* k) { return j.is_object() && j.contains(k) ? j.at(k) : json::array(); };
  out["cos_init"] = pick(first, "token_cosine");
  out["cos_final"] = pick(last, "token_cosine");
  out["block_grad_init"] = pick(first, "block_grad_norms");
  out["block_grad_final"] = pick(last, "block_grad_norms");
  out["resid_init"] = pick(first, "residual_norms");
  out["resid_final"] = pick(last, "residual_norms");
  if (removal && !res.diverged) {
    // The computation of `normlab eval --checkpoint DIR --drop-last K / --skip-block I`.
    const nn::CheckpointMeta meta = nn::read_checkpoint_meta(cfg.checkpoint_dir);
    nn::Model model(meta.model);
    nn::load_checkpoint(cfg.checkpoint_dir, meta.model, model.params(), nullptr);
    const nn::LmData data = nn::LmData::load(cfg.data);
    auto eval = [&](std::vector<int> skipped) {
      model.set_skipped_blocks(std::move(skipped));
      return nn::evaluate(model, data, cfg.seq, cfg.val_windows, cfg.batch);
    };
    const int L = meta.model.layers;
    const double full = eval({});
    json drop = json::array(), skip = json::array();
    for (int k = 1; k < L; ++k) {
      std::vector<int> sk;
      for (int l = L - k; l < L; ++l) sk.push_back(l);
      drop.push_back(finite_or_null(eval(sk) - full));
    }
    for (int l = 0; l < L; ++l) skip.push_back(finite_or_null(eval({l}) - full));
    out["removal"] = {{"full", finite_or_null(full)}, {"drop_last", drop}, {"skip", skip}, {"step", meta.step}};
  }
  return out;
}


// Claim 2, trained (lab.md design (a)): an MLP predicting the next byte from the previous `ctx` bytes,
//   e = concat(emb[x_1..x_ctx])   (B, ctx·E)
//   h = e·W1ᵀ + b1                (B, H)
//   n = Norm(h)                   (B, H)   BatchNorm: per feature over the batch; LayerNorm: per example over H
//   a = relu(n);  logits = a·W2ᵀ + b2 (B, 256);  loss = mean cross-entropy
// trained with AdamW (β (0.9, 0.98), eps 1e-9) at batch 64 and batch 2 on the same stream of examples (lr
// scaled by √(B/64)). Measured: the eval-mode validation loss (BatchNorm: running statistics) and the train-mode
// minus eval-mode gap (BatchNorm's batch statistics over validation batches of the training batch size).
struct Mlp {
  int ctx, E, H;
  static constexpr int V = 256;
  std::vector<float> emb, w1, b1, g, be, w2, b2;  // parameters
  std::vector<float> rm, rv;                       // BatchNorm running statistics
  std::vector<float*> params() { return {emb.data(), w1.data(), b1.data(), g.data(), be.data(), w2.data(), b2.data()}; }
  std::vector<std::size_t> sizes() const {
    return {emb.size(), w1.size(), b1.size(), g.size(), be.size(), w2.size(), b2.size()};
  }
};

Mlp mlp_init(int ctx, int E, int H, std::uint64_t seed) {
  Mlp m{ctx, E, H, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  auto xavier = [&](std::vector<float>& w, int out, int in) {
    std::uniform_real_distribution<float> u(-std::sqrt(6.f / float(in + out)), std::sqrt(6.f / float(in + out)));
    w.resize(static_cast<std::size_t>(out * in));
    for (float& v : w) v = u(rng);
  };
  m.emb.resize(static_cast<std::size_t>(Mlp::V * E));
  for (float& v : m.emb) v = n(rng);
  xavier(m.w1, H, ctx * E);
  xavier(m.w2, Mlp::V, H);
  m.b1.assign(static_cast<std::size_t>(H), 0.f), m.be.assign(static_cast<std::size_t>(H), 0.f);
  m.g.assign(static_cast<std::size_t>(H), 1.f), m.b2.assign(static_cast<std::size_t>(Mlp::V), 0.f);
  m.rm.assign(static_cast<std::size_t>(H), 0.f), m.rv.assign(static_cast<std::size_t>(H), 1.f);
  return m;
}

struct MlpActs {
  std::vector<float> e, h, n, a, logits, probs;
};

// Forward over B examples starting at bytes[pos[i]] (context) with target bytes[pos[i] + ctx]; returns the mean
// loss. bn_mode: 0 LayerNorm, 1 BatchNorm training (running stats updated when `update`), 2 BatchNorm eval.
double mlp_forward(Mlp& m, MlpActs& a, std::span<const std::uint8_t> bytes, const Index* pos, Index B, int bn_mode,
                   bool update, std::vector<std::int32_t>& tgt) {
  const Index D = m.ctx * m.E, H = m.H;
  a.e.resize(static_cast<std::size_t>(B * D)), a.h.resize(static_cast<std::size_t>(B * H));
  a.n.resize(a.h.size()), a.a.resize(a.h.size());
  a.logits.resize(static_cast<std::size_t>(B * Mlp::V)), a.probs.resize(a.logits.size());
  tgt.resize(static_cast<std::size_t>(B));
  for (Index b = 0; b < B; ++b) {
    for (int k = 0; k < m.ctx; ++k) {
      const std::uint8_t x = bytes[static_cast<std::size_t>(pos[b] + k)];
      std::copy_n(m.emb.data() + x * m.E, m.E, a.e.data() + b * D + k * m.E);
    }
    tgt[static_cast<std::size_t>(b)] = bytes[static_cast<std::size_t>(pos[b] + m.ctx)];
  }
  nn::linear_forward(a.h.data(), a.e.data(), m.w1.data(), m.b1.data(), B, D, H);
  if (bn_mode == 0) {
    nn::layernorm_forward(a.n.data(), static_cast<float*>(nullptr), static_cast<float*>(nullptr), a.h.data(), m.g.data(),
                          m.be.data(), B, H, 1e-5);
  } else {
    BatchNormOptions o;
    o.training = bn_mode == 1;
    const bool stats = bn_mode == 2 || update;
    batch_norm_forward(View(a.n.data(), Dims{B, H}), View{}, View{}, stats ? View(m.rm.data(), Dims{H}) : View{},
                       stats ? View(m.rv.data(), Dims{H}) : View{}, nullptr, ConstView(a.h.data(), Dims{B, H}),
                       ConstView(m.g.data(), Dims{H}), ConstView(m.be.data(), Dims{H}), {}, o);
  }
  nn::activation_forward(a.a.data(), a.n.data(), B * H, nn::Activation::kRelu);
  nn::linear_forward(a.logits.data(), a.a.data(), m.w2.data(), m.b2.data(), B, H, Index{Mlp::V});
  return nn::cross_entropy_forward(a.probs.data(), a.logits.data(), tgt.data(), {}, B, Index{1}, Index{Mlp::V});
}

void mlp_backward(Mlp& m, const MlpActs& a, std::span<const std::uint8_t> bytes, const Index* pos, Index B, bool bn,
                  const std::vector<std::int32_t>& tgt, std::vector<std::vector<float>>& grads) {
  const Index D = m.ctx * m.E, H = m.H;
  for (auto& gr : grads) std::fill(gr.begin(), gr.end(), 0.f);
  std::vector<float> dlogits(a.logits.size(), 0.f), da(a.a.size(), 0.f), dn(a.a.size(), 0.f), dh(a.h.size(), 0.f),
      de(a.e.size(), 0.f);
  nn::cross_entropy_backward(dlogits.data(), a.probs.data(), tgt.data(), {}, B, Index{1}, Index{Mlp::V});
  nn::linear_backward(da.data(), grads[5].data(), grads[6].data(), dlogits.data(), a.a.data(), m.w2.data(), B, H,
                      Index{Mlp::V});
  nn::activation_backward(dn.data(), da.data(), a.n.data(), B * H, nn::Activation::kRelu);
  if (!bn) {
    nn::layernorm_backward(dh.data(), grads[3].data(), grads[4].data(), dn.data(), a.h.data(), m.g.data(), B, H, 1e-5);
  } else {
    batch_norm_backward(View(dh.data(), Dims{B, H}), View(grads[3].data(), Dims{H}), View(grads[4].data(), Dims{H}),
                        ConstView(dn.data(), Dims{B, H}), ConstView(a.h.data(), Dims{B, H}),
                        ConstView(m.g.data(), Dims{H}), ConstView{}, ConstView{});
  }
  nn::linear_backward(de.data(), grads[1].data(), grads[2].data(), dh.data(), a.e.data(), m.w1.data(), B, D, H);
  for (Index b = 0; b < B; ++b)
    for (int k = 0; k < m.ctx; ++k) {
      const std::uint8_t x = bytes[static_cast<std::size_t>(pos[b] + k)];
      for (int i = 0; i < m.E; ++i) grads[0][static_cast<std::size_t>(x * m.E + i)] += de[static_cast<std::size_t>(b * D + k * m.E + i)];
    }
}

json run_mlp(const json& s) {
  const int ctx = s.at("ctx"), E = s.at("emb"), H = s.at("hidden");
  const std::int64_t examples = s.at("examples");
  const double lr64 = s.at("lr64");
  const Index val_n = s.at("val_examples");
  const std::uint64_t seed = s.at("seed").get<std::uint64_t>();
  const nn::LmData data = nn::LmData::load(s.value("data", std::string("fortunes")));
  const auto train = data.train(), val = data.val();
  // One stream of training examples shared by every arm (paired); fixed, evenly spaced validation examples.
  std::mt19937_64 rng(seed ^ 0x6D6C70u);
  std::vector<Index> stream(static_cast<std::size_t>(examples));
  for (Index& p : stream) p = static_cast<Index>(rng() % static_cast<std::uint64_t>(data.train_size() - ctx));
  std::vector<Index> vpos(static_cast<std::size_t>(val_n));
  for (Index i = 0; i < val_n; ++i) vpos[static_cast<std::size_t>(i)] = i * (data.val_size() - ctx - 1) / std::max<Index>(1, val_n - 1);
  json arms = json::array();
  for (const char* norm : {"ln", "bn"})
    for (Index B : {Index{64}, Index{2}}) {
      const bool bn = std::string(norm) == "bn";
      Mlp m = mlp_init(ctx, E, H, seed);
      std::vector<std::vector<float>> grads, m1, m2;
      for (std::size_t n : m.sizes()) grads.emplace_back(n, 0.f), m1.emplace_back(n, 0.f), m2.emplace_back(n, 0.f);
      const double lr = lr64 * std::sqrt(double(B) / 64.0);
      MlpActs acts;
      std::vector<std::int32_t> tgt;
      const std::int64_t steps = examples / B;
      double tail = 0;
      std::int64_t tail_n = 0;
      for (std::int64_t t = 0; t < steps; ++t) {
        const Index* pos = stream.data() + t * B;
        const double loss = mlp_forward(m, acts, train, pos, B, bn ? 1 : 0, true, tgt);
        if (t >= steps - steps / 10) tail += loss, ++tail_n;
        mlp_backward(m, acts, train, pos, B, bn, tgt, grads);
        const double b1c = 1 - std::pow(0.9, double(t + 1)), b2c = 1 - std::pow(0.98, double(t + 1));
        std::vector<float*> ps = m.params();
        for (std::size_t k = 0; k < ps.size(); ++k)
          for (std::size_t i = 0; i < grads[k].size(); ++i) {
            const float gv = grads[k][i];
            m1[k][i] = 0.9f * m1[k][i] + 0.1f * gv;
            m2[k][i] = 0.98f * m2[k][i] + 0.02f * gv * gv;
            ps[k][i] -= static_cast<float>(lr * (m1[k][i] / b1c) / (std::sqrt(m2[k][i] / b2c) + 1e-9));
          }
      }
      // Eval mode over the validation examples (batches of 256); train mode with batch statistics of
      // validation batches of the training batch size B (running statistics untouched).
      auto val_loss = [&](int mode, Index bs) {
        double sum = 0;
        Index n = 0;
        for (Index i = 0; i + bs <= val_n; i += bs) {
          sum += mlp_forward(m, acts, val, vpos.data() + i, bs, mode, false, tgt) * double(bs);
          n += bs;
        }
        return sum / double(n);
      };
      const double ev = val_loss(bn ? 2 : 0, 256), tr = val_loss(bn ? 1 : 0, B);
      arms.push_back({{"norm", norm}, {"batch", B}, {"lr", lr}, {"steps", steps}, {"eval_val", finite_or_null(ev)},
                      {"train_mode_val", finite_or_null(tr)}, {"gap", finite_or_null(tr - ev)},
                      {"train_tail", finite_or_null(tail / double(std::max<std::int64_t>(1, tail_n)))}});
    }
  return {{"arms", arms}, {"unigram_val", nn::unigram_cross_entropy(train, val)}};
}

json run_speech(const json& s, const std::string& work_dir) {
  namespace fs = std::filesystem;
  const fs::path data_dir = fs::path(work_dir) / "speech-data";
  speech::SpeechDataOptions d;
  d.out_dir = data_dir.string();
  d.seed = s.at("seed").get<std::uint64_t>();
  d.limit = s.at("limit").get<int>();
  d.renditions = s.value("renditions", 5);
  d.jobs = 1;  // one espeak-ng/sox pipeline: the lab runs its jobs in parallel processes
  const auto t0 = std::chrono::steady_clock::now();
  const speech::SpeechDataSummary sum = speech::MakeSpeechData(d);
  const double data_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  speech::StudyOptions st;
  st.data_dir = d.out_dir;
  st.classifier = false;  // part (a) only; the classifier is `normlab speech-study`
  st.threads = 1;
  st.log = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
  const std::string text = speech::run_speech_study(st);
  {
    std::ofstream f(fs::path(work_dir) / "study.json", std::ios::binary | std::ios::trunc);
    f << text << "\n";
  }
  const json study = json::parse(text);
  return {{"dataset",
           {{"dir", d.out_dir}, {"seed", d.seed}, {"limit", d.limit}, {"renditions", d.renditions},
            {"clips", sum.clips}, {"corrupted", sum.corrupted}, {"voices", sum.voices},
            {"seconds_of_audio", sum.seconds_of_audio}, {"seconds", data_s}}},
          {"study_config", study.at("config")},
          {"residuals", study.at("residuals")}};
}

}  // namespace

json run_job(const json& spec, const std::string& work_dir) {
  single_thread();
  const auto t0 = std::chrono::steady_clock::now();
  const std::string kind = spec.at("kind");
  json out;
  if (kind == "gradnorms")
    out = run_gradnorms(spec);
  else if (kind == "train")
    out = run_train(spec, work_dir);
  else if (kind == "speech")
    out = run_speech(spec, work_dir);
  else if (kind == "mlp")
    out = run_mlp(spec);
  else
    throw Error(fmt::format("lab: unknown job kind '{}'", kind));
  out["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

// ---- claim 2: LayerNorm vs BatchNorm on synthetic activations (kernel level) ------------------------------
// Activations x [B, C, T] (C = 16 features, T frames): per-feature offsets and scales, per-sample gains.
// LayerNorm normalizes each (b, t) over C (axes {1}); BatchNorm each feature c over (B, T) (channel axis 1).
struct Acts {
  Index B, C, T;
  std::vector<float> x;
};

Acts make_acts(std::mt19937_64& rng, Index B, Index C, Index T) {
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> off(static_cast<std::size_t>(C)), sc(static_cast<std::size_t>(C));
  for (Index c = 0; c < C; ++c) off[c] = 2.f * n(rng), sc[c] = 0.5f + std::fabs(n(rng));
  Acts a{B, C, T, std::vector<float>(static_cast<std::size_t>(B * C * T))};
  for (Index b = 0; b < B; ++b) {
    const float gain = 0.5f + 1.5f * std::fabs(n(rng));
    for (Index c = 0; c < C; ++c)
      for (Index t = 0; t < T; ++t) a.x[static_cast<std::size_t>((b * C + c) * T + t)] = gain * (off[c] + sc[c] * n(rng));
  }
  return a;
}

std::vector<float> ln_out(const std::vector<float>& x, Index B, Index C, Index T) {
  std::vector<float> y(x.size());
  layer_norm_forward(View(y.data(), Dims{B, C, T}), View{}, View{}, ConstView(x.data(), Dims{B, C, T}), ConstView{},
                     ConstView{}, Axes{1}, 1e-5);
  return y;
}

std::vector<float> bn_out(const std::vector<float>& x, Index B, Index C, Index T, View rm = {}, View rv = {},
                          bool training = true) {
  std::vector<float> y(x.size());
  BatchNormOptions o;
  o.training = training;
  batch_norm_forward(View(y.data(), Dims{B, C, T}), View{}, View{}, rm, rv, nullptr, ConstView(x.data(), Dims{B, C, T}),
                     ConstView{}, ConstView{}, {}, o);
  return y;
}

// max |a − b| over sample b < nb, all c, frames t < nt; a has T frames per row, bb has Tb.
double max_diff(const std::vector<float>& a, Index Ta, const std::vector<float>& bb, Index Tb, Index nb, Index C, Index nt) {
  double m = 0;
  for (Index b = 0; b < nb; ++b)
    for (Index c = 0; c < C; ++c)
      for (Index t = 0; t < nt; ++t)
        m = std::max(m, std::fabs(double(a[static_cast<std::size_t>((b * C + c) * Ta + t)]) -
                                  double(bb[static_cast<std::size_t>((b * C + c) * Tb + t)])));
  return m;
}

Claim2Seed measure_claim2(int seed) {
  constexpr Index C = 16, T = 24;
  std::mt19937_64 rng(0xC1A1u + static_cast<std::uint64_t>(seed));
  Claim2Seed r;
  r.seed = seed;
  // (a) batch 64 vs its first 2 samples.
  const Acts big = make_acts(rng, 64, C, T);
  const std::vector<float> small(big.x.begin(), big.x.begin() + 2 * C * T);
  r.ln_batch = max_diff(ln_out(big.x, 64, C, T), T, ln_out(small, 2, C, T), T, 2, C, T);
  r.bn_batch = max_diff(bn_out(big.x, 64, C, T), T, bn_out(small, 2, C, T), T, 2, C, T);
  // (b) train vs eval: running statistics from 20 batches of 2, then the same batch in both modes.
  std::vector<float> rm(C, 0.f), rv(C, 1.f);
  for (int i = 0; i < 20; ++i) {
    const std::vector<float> xb(big.x.begin() + 2 * i * C * T, big.x.begin() + 2 * (i + 1) * C * T);
    bn_out(xb, 2, C, T, View(rm.data(), Dims{C}), View(rv.data(), Dims{C}), true);
  }
  r.bn_train_eval = max_diff(bn_out(small, 2, C, T), T,
                             bn_out(small, 2, C, T, View(rm.data(), Dims{C}), View(rv.data(), Dims{C}), false), T, 2,
                             C, T);
  // (c) zero padding after T real frames, padding fractions 0.25, 0.5, 0.75 (unmasked BatchNorm).
  const Acts base = make_acts(rng, 4, C, T);
  const std::vector<float> ln0 = ln_out(base.x, 4, C, T), bn0 = bn_out(base.x, 4, C, T);
  for (double frac : {0.25, 0.5, 0.75}) {
    const Index Tp = static_cast<Index>(std::lround(T / (1 - frac)));
    std::vector<float> xp(static_cast<std::size_t>(4 * C * Tp), 0.f);
    for (Index b = 0; b < 4; ++b)
      for (Index c = 0; c < C; ++c)
        for (Index t = 0; t < T; ++t)
          xp[static_cast<std::size_t>((b * C + c) * Tp + t)] = base.x[static_cast<std::size_t>((b * C + c) * T + t)];
    r.ln_pad = std::max(r.ln_pad, max_diff(ln_out(xp, 4, C, Tp), Tp, ln0, T, 4, C, T));
    r.bn_pad = std::max(r.bn_pad, max_diff(bn_out(xp, 4, C, Tp), Tp, bn0, T, 4, C, T));
  }
  // (d) the special case: one sample's C features as BatchNorm's [1, 1, C] (one channel, C positions) vs
  // LayerNorm over its C features.
  std::vector<float> one(base.x.begin(), base.x.begin() + C);  // sample 0, frame-major slice of C values
  std::vector<float> y_ln(C), y_bn(C);
  layer_norm_forward(View(y_ln.data(), Dims{C}), View{}, View{}, ConstView(one.data(), Dims{C}), ConstView{}, ConstView{},
                     Axes{0}, 1e-5);
  BatchNormOptions o;
  batch_norm_forward(View(y_bn.data(), Dims{1, 1, C}), View{}, View{}, View{}, View{}, nullptr,
                     ConstView(one.data(), Dims{1, 1, C}), ConstView{}, ConstView{}, {}, o);
  for (Index i = 0; i < C; ++i) r.special = std::max(r.special, std::fabs(double(y_ln[i]) - double(y_bn[i])));
  return r;
}

// ---- assembling the claims ----------------------------------------------------------------------------------
namespace {

double num(const json& j) { return j.is_number() ? j.get<double>() : kNaN; }
std::vector<double> nums(const json& j) {
  std::vector<double> v;
  if (j.is_array())
    for (const auto& x : j) v.push_back(num(x));
  return v;
}

// Collects the outputs of the given keys; reports missing/failed ones.
struct Gather {
  explicit Gather(const json& o) : outputs(o) {}
  const json& outputs;
  std::vector<std::string> missing;
  double wall = 0;
  std::vector<std::string> commands;
  const json* get(const std::string& key, const std::vector<Job>& jobs) {
    for (const Job& j : jobs)
      if (j.key == key)
        for (const std::string& c : j.commands)
          if (std::find(commands.begin(), commands.end(), c) == commands.end()) commands.push_back(c);
    if (!outputs.contains(key)) {
      missing.push_back(key + ": not run");
      return nullptr;
    }
    const json& o = outputs.at(key);
    if (o.contains("error")) {
      missing.push_back(key + ": " + o.at("error").get<std::string>());
      return nullptr;
    }
    wall += o.value("seconds", 0.0);
    return &o;
  }
  std::string failures() const {
    std::string s;
    for (const std::string& m : missing) s += (s.empty() ? "" : "; ") + m;
    return s;
  }
};

ClaimResult make(int id, const std::string& section, const std::string& title, const std::string& claim) {
  ClaimResult c;
  c.id = id, c.section = section, c.title = title, c.claim = claim;
  return c;
}

void finish(ClaimResult& c, const LabOptions& opt, Gather& g, RuleResult rule) {
  c.command = lab_command(opt, c.id);
  c.run_commands.insert(c.run_commands.end(), g.commands.begin(), g.commands.end());
  c.wall_s += g.wall;
  if (!g.missing.empty()) {
    rule.verdict = Verdict::kInconclusive;
    rule.reason = "runs failed or missing (" + g.failures() + "); " + rule.reason;
  }
  c.verdict = std::move(rule);
}

json run_entry(const std::string& arm, int seed, const json& o) {
  return {{"arm", arm},
          {"seed", seed},
          {"val", o.at("val")},
          {"train", o.at("train")},
          {"final_val", o.at("final_val")},
          {"diverged", o.at("diverged")},
          {"message", o.at("message")},
          {"unigram_val", o.at("unigram_val")},
          {"seconds", o.value("seconds", 0.0)}};
}

json train_config_summary(const Sizes& z, int layers) {
  return {{"layers", layers}, {"d_model", z.d}, {"heads", z.heads}, {"ffn", z.ffn}, {"seq", z.seq},
          {"batch", z.batch}, {"val_windows", z.val_windows}, {"eval_every", z.eval_every},
          {"optimizer", "adamw β=(0.9, 0.98) eps 1e-9, no clipping"}, {"data", "fortunes (byte-level)"}};
}

}  // namespace

std::vector<ClaimResult> assemble(const LabOptions& opt, const json& outputs, const std::vector<ExtraCheck>& extra) {
  const Sizes z = sizes(opt.quick);
  const std::vector<Job> jobs = plan_jobs(opt);
  std::vector<ClaimResult> claims;

  if (opt.wants(1)) {
    const auto t0 = std::chrono::steady_clock::now();
    ClaimResult c = make(1, "layernorm-math", "LayerNorm is per-sample normalization over one layer's features",
                         "LayerNorm = per-sample normalization over the features of one layer. Layer output [1,2,3] → "
                         "mean 2; the 2×3 speech example [[1,2,3],[3,4,5]] over F → [[-1,-1,-1],[1,1,1]]; over T → "
                         "rows ≈ [-1.22, 0, 1.22].");
    const WorkedExamples w = run_worked_examples();
    Claim1Input in{w.num_checks(), w.num_failed()};
    json ex = json::array();
    for (const ExtraCheck& e : extra) {
      in.checks += 1, in.failed += e.passed ? 0 : 1;
      ex.push_back({{"name", e.name}, {"passed", e.passed}, {"detail", e.detail}});
    }
    c.measured = true;
    c.config = {{"eps", 0}, {"kernel", "normlab::layer_norm_forward"}, {"exercise_seed", 0}};
    c.data = {{"worked_examples", worked_examples_json(w)}, {"exercise_checks", ex}};
    SeedValues sv;
    sv.seed = 0;
    for (const WorkedExample& e : w.examples)
      for (const ExampleCheck& k : e.checks) sv.values[e.name + "." + k.quantity + ".max_abs_err"] = k.max_abs_err;
    c.per_seed.push_back(sv);
    c.run_commands = {"normlab lab --only 1", "normlab exercise --seed 0",
                      "normlab norm layer x.npy -o y.npy --axes 0 --eps 0   # x = [1,2,3]"};
    c.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Gather g(outputs);
    finish(c, opt, g, rule_claim1(in));
    claims.push_back(std::move(c));
  }

  if (opt.wants(2)) {
    const auto t0 = std::chrono::steady_clock::now();
    ClaimResult c = make(2, "ln-vs-bn", "LayerNorm does not depend on the batch; BatchNorm does",
                         "LayerNorm does not depend on batch size or padding; BatchNorm does (small batches are noisy, "
                         "train and eval differ, padded zeros change the statistics). Batch size 1 with the right "
                         "layout makes them coincide numerically.");
    c.measured = true;
    c.note = quick_note(opt.quick) +
             "The verdict is measured at the kernel level (layer_norm_forward, batch_norm_forward in training mode, "
             "unmasked) on synthetic activations [B, C=16, T=24] with per-feature offsets and per-sample gains: the "
             "same sample in a batch of 64 vs 2, zero padding to fractions 0.25/0.5/0.75, train vs eval mode with "
             "running statistics from 20 batches of 2, and batch 1 with one channel over the features. Trained "
             "(lab.md design (a), informational, not in the rule): a next-byte MLP (8 previous bytes, embedding 16, "
             "hidden 128 with BatchNorm or LayerNorm, ReLU) trained at batch 64 and batch 2 on the same examples (lr "
             "scaled by √(B/64)); eval-mode validation loss and the train-mode − eval-mode gap. lab.md's design (b), "
             "a padded 2-layer Transformer with BatchNorm, is not run: the Transformer engine has no BatchNorm.";
    c.config = {{"C", 16}, {"T", 24}, {"batch", {64, 2}}, {"padding_fractions", {0.25, 0.5, 0.75}}, {"eps", 1e-5},
                {"seeds", opt.seeds}};
    std::vector<Claim2Seed> seeds;
    for (int seed : opt.seeds) {
      const Claim2Seed s = measure_claim2(seed);
      seeds.push_back(s);
      c.per_seed.push_back({seed, {{"ln_batch", s.ln_batch}, {"bn_batch", s.bn_batch}, {"ln_pad", s.ln_pad},
                                   {"bn_pad", s.bn_pad}, {"bn_train_eval", s.bn_train_eval},
                                   {"batch1_bn_vs_ln", s.special}}});
    }
    c.run_commands = {"normlab norm batch --help", "normlab norm layer --help"};
    c.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Gather g(outputs);
    json mlp = json::array();
    for (std::size_t i = 0; i < opt.seeds.size(); ++i) {
      const json* o = g.get(mlp_key(opt.seeds[i]), jobs);
      if (!o) continue;
      json e = *o;
      e["seed"] = opt.seeds[i];
      mlp.push_back(e);
      auto arm = [&](const char* norm, int B, const char* k) {
        for (const auto& a : o->at("arms"))
          if (a.at("norm") == norm && a.at("batch") == B) return num(a.at(k));
        return kNaN;
      };
      json& v = c.per_seed[i].values;
      v["mlp_ln_val_b2_minus_b64"] = finite_or_null(arm("ln", 2, "eval_val") - arm("ln", 64, "eval_val"));
      v["mlp_bn_val_b2_minus_b64"] = finite_or_null(arm("bn", 2, "eval_val") - arm("bn", 64, "eval_val"));
      v["mlp_ln_gap_b2"] = finite_or_null(arm("ln", 2, "gap"));
      v["mlp_bn_gap_b2"] = finite_or_null(arm("bn", 2, "gap"));
      v["mlp_bn_gap_b64"] = finite_or_null(arm("bn", 64, "gap"));
    }
    c.data = {{"kind", "kernel-level"}, {"mlp", mlp},
              {"mlp_config", {{"ctx", kMlpCtx}, {"emb", kMlpEmb}, {"hidden", kMlpHidden}, {"examples", z.mlp_examples},
                              {"lr_batch64", kMlpLr64}, {"lr", "lr_batch64 * sqrt(B / 64)"}, {"batches", {64, 2}},
                              {"val_examples", kMlpValExamples}, {"optimizer", "adamw β=(0.9, 0.98) eps 1e-9"}}}};
    finish(c, opt, g, rule_claim2(seeds));
    claims.push_back(std::move(c));
  }

  if (opt.wants(3)) {
    ClaimResult c = make(3, "f-vs-t", "F-normalization vs T-normalization (CMVN) on speech features",
                         "F-normalization removes frame-level level differences and keeps the spectral shape; "
                         "T-normalization (CMVN) removes per-band bias and keeps each band's time course; F-norm is "
                         "causal and per-frame, T-norm needs the whole window; T statistics are noisy for short "
                         "utterances.");
    c.measured = true;
    const int limit = c3_limit(opt.quick);
    c.config = {{"data", {{"command", "normlab speech-data"}, {"seed", kC3Seed}, {"limit", limit}, {"renditions", 5},
                          {"corruptions", std::vector<std::string>(std::begin(speech::kCorruptions), std::end(speech::kCorruptions))}}},
                {"features", "40-bin Kaldi log-mel filterbanks, dither 0"},
                {"front_ends", {"none", "f-ln", "t-cmvn", "t-then-f", "f-then-t", "t-cmn", "f-mean",
                                "t-then-f-mean", "f-then-t-mean"}},
                {"compared", {"f-ln", "t-cmvn"}},
                {"residual", "mean over test utterances of sqrt(mean over cells of (N(clean) - N(corrupted))^2)"},
                {"ln_eps", 1e-5},
                {"classifier", "not run in the lab (too slow for its budget): normlab speech-study"}};
    c.note = quick_note(opt.quick) +
             "Part (a) of `normlab speech-study` (feature residuals) on the spoken-digit data built by `normlab "
             "speech-data` into the run directory (DIR/runs/c3-speech/speech-data). The keyword classifier (part (b)) "
             "is not run here: `normlab speech-study --data DIR` runs it (about 8 minutes); its numbers are in "
             "docs/SPEECH_STUDY.md. Not measured: causality (F-norm per frame vs T-norm over the window) and the "
             "noise of T statistics on short utterances.";
    Gather g(outputs);
    const json* o = g.get(kC3Key, jobs);
    Claim3Input in{kNaN, kNaN, kNaN, kNaN, kNaN, kNaN};
    if (o) {
      const json& res = o->at("residuals");
      const json& mean = res.at("mean");
      auto at = [&](const std::string& k, const char* fe) {
        return mean.contains(k) && mean.at(k).contains(fe) ? num(mean.at(k).at(fe)) : kNaN;
      };
      auto gain = [&](const char* fe) {
        double m = 0;
        for (const char* k : {"gain+20dB", "gain-20dB", "gain+40dB", "gain-40dB"}) {
          const double v = at(k, fe);
          m = std::isnan(v) || std::isnan(m) ? kNaN : std::max(m, v);
        }
        return m;
      };
      in = {gain("f-ln"), gain("t-cmvn"), at("segment-gain", "f-ln"), at("segment-gain", "t-cmvn"),
            at("channel", "f-ln"), at("channel", "t-cmvn")};
      c.data = {{"residuals",
                 {{"front_ends", res.at("front_ends")}, {"corruptions", res.at("corruptions")},
                  {"utterances", res.at("utterances")}, {"mean", mean}, {"sd", res.at("sd")}, {"max", res.at("max")},
                  {"scale", res.at("scale")}}},
                {"dataset", o->at("dataset")}};
      c.config["test_utterances"] = res.at("utterances");
    }
    c.per_seed.push_back({kC3Seed, {{"gain_f_ln", finite_or_null(in.gain_fln)},
                                    {"gain_t_cmvn", finite_or_null(in.gain_tcmvn)},
                                    {"segment_gain_f_ln", finite_or_null(in.seg_fln)},
                                    {"segment_gain_t_cmvn", finite_or_null(in.seg_tcmvn)},
                                    {"channel_f_ln", finite_or_null(in.ch_fln)},
                                    {"channel_t_cmvn", finite_or_null(in.ch_tcmvn)}}});
    c.run_commands = {lab_command(opt, 3)};
    finish(c, opt, g, rule_claim3(in));
    c.run_commands.push_back("normlab speech-data --out speech-data --seed 0 && normlab speech-study --data "
                             "speech-data --out study.json   # with the classifier (part b), ~8 min");
    claims.push_back(std::move(c));
  }

  // Claims 4, 5 and experiment 10 share the gradient runs.
  if (opt.wants(4) || opt.wants(5) || opt.wants(10)) {
    Gather g(outputs);
    std::vector<GradSeed> seeds;
    json profiles = json::array();
    for (int seed : opt.seeds) {
      GradSeed gs;
      gs.seed = seed;
      bool complete = true;
      for (const char* p : {"post", "pre"})
        for (int L : z.depths) {
          const json* o = g.get(grad_key(p, L, seed), jobs);
          if (!o) {
            complete = false;
            continue;
          }
          GradProfile prof{L, nums(o->at("ffn2")), nums(o->at("block")), nums(o->value("dx", json::array())),
                           nums(o->value("resid", json::array()))};
          profiles.push_back({{"placement", p}, {"layers", L}, {"seed", seed}, {"ffn2", o->at("ffn2")},
                              {"block", o->at("block")}, {"dx", o->value("dx", json::array())},
                              {"resid", o->value("resid", json::array())}, {"loss", o->at("loss")}});
          (std::string(p) == "post" ? gs.post : gs.pre).push_back(std::move(prof));
        }
      if (complete) seeds.push_back(std::move(gs));
    }
    const json config = {{"depths", z.depths}, {"d_model", z.g_d}, {"heads", z.g_heads}, {"ffn", z.g_ffn},
                         {"seq", z.g_seq},     {"batch", z.g_batch}, {"batches", z.g_batches},
                         {"loss", "mean cross-entropy over all predicted tokens, at initialization"},
                         {"averaging", "squared gradient norms averaged over the batches, then square-rooted"}};
    if (opt.wants(4)) {
      ClaimResult c = make(4, "placement", "Pre-LN keeps an identity path; Post-LN sends gradients through every LN",
                           "Pre-LN keeps an identity path (∂x_{l+1}/∂x_l = I + …); Post-LN sends gradients through "
                           "every LN Jacobian.");
      c.measured = true;
      c.config = config;
      c.data = {{"profiles", profiles}};
      c.note = quick_note(opt.quick) +
               "Measured on ‖∂L/∂x_l‖, the gradient of the loss w.r.t. each block's residual-stream input "
               "(Model::input_grad_norms, mean over tokens, averaged over the batches) at initialization, in the "
               "same runs as claim 5. Identity path: in Pre-LN ∂L/∂x_l = ∂L/∂x_{l+1}·(I + ∂F/∂x), so the gradient "
               "reaching block 1 is not smaller than the one reaching block L; in Post-LN it passes every LN "
               "Jacobian. The per-block parameter gradient ratio ‖∇θ_1‖/‖∇θ_L‖ is listed too (not in the rule).";
      for (const GradSeed& s : seeds) {
        SeedValues sv{s.seed, json::object()};
        for (std::size_t i = 0; i < s.post.size(); ++i) {
          const auto &po = s.post[i], &pr = s.pre[i];
          if (!po.dx.empty()) sv.values[fmt::format("r_post_L{}", po.layers)] = finite_or_null(po.dx.front() / po.dx.back());
          if (!pr.dx.empty()) sv.values[fmt::format("r_pre_L{}", pr.layers)] = finite_or_null(pr.dx.front() / pr.dx.back());
        }
        const auto &po = s.post.back(), &pr = s.pre.back();
        if (!po.block.empty()) sv.values[fmt::format("theta_r_post_L{}", po.layers)] = finite_or_null(po.block.front() / po.block.back());
        if (!pr.block.empty()) sv.values[fmt::format("theta_r_pre_L{}", pr.layers)] = finite_or_null(pr.block.front() / pr.block.back());
        c.per_seed.push_back(sv);
      }
      Gather g4 = g;
      finish(c, opt, g4, rule_claim4(seeds));
      claims.push_back(std::move(c));
    }
    if (opt.wants(5)) {
      ClaimResult c = make(5, "gradient-flow", "Gradient norms at initialization (Xiong et al. 2020)",
                           "At initialization Post-LN's gradients are large near the output and grow relative to the "
                           "input layers with depth; Pre-LN's last-layer gradient shrinks like 1/√L.");
      c.measured = true;
      c.config = config;
      c.data = {{"profiles", profiles}};
      c.note = quick_note(opt.quick) + "Same computation as `normlab gradnorms` (one process per run, 1 thread).";
      for (const GradSeed& s : seeds) {
        SeedValues sv{s.seed, json::object()};
        std::vector<double> d, last;
        for (const GradProfile& p : s.post)
          if (!p.ffn2.empty()) sv.values[fmt::format("post_last_over_first_L{}", p.layers)] = finite_or_null(p.ffn2.back() / p.ffn2.front());
        for (const GradProfile& p : s.pre)
          if (!p.ffn2.empty()) {
            sv.values[fmt::format("pre_last_L{}", p.layers)] = finite_or_null(p.ffn2.back());
            d.push_back(p.layers), last.push_back(p.ffn2.back());
          }
        sv.values["pre_last_slope"] = finite_or_null(loglog_slope(d, last));
        c.per_seed.push_back(sv);
      }
      Gather g5 = g;
      finish(c, opt, g5, rule_claim5(seeds));
      claims.push_back(std::move(c));
    }
    if (opt.wants(10)) {
      ClaimResult c = make(10, "residual-growth", "Residual-stream norm growth per layer (Xiong et al. 2020, Lemma 1)",
                           "At initialization Post-LN's residual stream keeps the same norm in every layer (each block "
                           "ends in a LayerNorm), while Pre-LN's grows with depth: E‖x_l‖² grows linearly in l.");
      c.measured = true;
      c.config = config;
      c.data = {{"profiles", profiles}};
      c.note = quick_note(opt.quick) +
               "‖x_l‖ = mean over tokens of the residual stream's norm after block l (Model::residual_norms), averaged "
               "over the batches of claim 5's runs at initialization. The trained models' norms are in the training "
               "logs (train.jsonl, residual_norms) and in the variants section.";
      for (const GradSeed& s : seeds) {
        SeedValues sv{s.seed, json::object()};
        const auto &po = s.post.back().resid, &pr = s.pre.back().resid;
        if (!po.empty()) {
          const auto [lo, hi] = std::minmax_element(po.begin(), po.end());
          sv.values["post_max_over_min"] = finite_or_null(*hi / *lo);
          sv.values["post_first"] = finite_or_null(po.front()), sv.values["post_last"] = finite_or_null(po.back());
        }
        if (!pr.empty()) {
          std::vector<double> l, sq;
          for (std::size_t i = 0; i < pr.size(); ++i) l.push_back(double(i + 1)), sq.push_back(pr[i] * pr[i]);
          sv.values["pre_first"] = finite_or_null(pr.front()), sv.values["pre_last"] = finite_or_null(pr.back());
          sv.values["pre_sq_growth"] = finite_or_null(sq.back() / sq.front());
          sv.values["pre_sq_r2"] = finite_or_null(linear_r2(l, sq));
        }
        c.per_seed.push_back(sv);
      }
      Gather g10 = g;
      finish(c, opt, g10, rule_residual_growth(seeds));
      claims.push_back(std::move(c));
    }
  }

  // Claim 6's runs (also the trained models of claims 8 and 9).
  std::map<std::pair<std::string, int>, const json*> c6;
  Gather g6(outputs);
  if (opt.wants(6) || opt.wants(8) || opt.wants(9))
    for (int seed : opt.seeds)
      for (const Arm& a : c6_arms(z)) c6[{a.name, seed}] = g6.get(c6_key(a.name, seed), jobs);
  auto c6_config = [&] {
    json arms = json::array();
    for (const Arm& a : c6_arms(z))
      arms.push_back({{"arm", a.name}, {"placement", nn::placement_name(a.placement)},
                      {"schedule", nn::schedule_name(a.schedule)}, {"warmup", a.warmup}});
    json c = train_config_summary(z, z.c6_layers);
    c["lr"] = z.c6_lr, c["steps"] = z.c6_steps, c["arms"] = arms, c["seeds"] = opt.seeds;
    return c;
  };

  if (opt.wants(6)) {
    ClaimResult c = make(6, "warmup", "Post-LN needs learning-rate warmup; Pre-LN trains without it",
                         "Post-LN needs learning-rate warmup; Pre-LN trains without it.");
    c.measured = true;
    c.config = c6_config();
    c.note = quick_note(opt.quick) + "\"Failure\" means stuck at the unigram level U (or a divergence), not NaN.";
    std::vector<Claim6Seed> seeds;
    json runs = json::array();
    double unigram = kNaN;
    for (int seed : opt.seeds) {
      Claim6Seed s{seed};
      SeedValues sv{seed, json::object()};
      bool ok = true;
      for (const Arm& a : c6_arms(z)) {
        const json* o = c6[{a.name, seed}];
        if (!o) {
          ok = false;
          continue;
        }
        runs.push_back(run_entry(a.name, seed, *o));
        const double f = o->at("diverged").get<bool>() ? kNaN : num(o->at("final_val"));
        s.unigram = num(o->at("unigram_val"));
        unigram = s.unigram;
        sv.values[a.name] = finite_or_null(f);
        // Informational (not in the rule): the validation loss at the end of the warmup (lab.md: "the arms
        // separate by step 200").
        for (const auto& pt : o->at("val"))
          if (pt.at(0).get<std::int64_t>() == z.c6_warmup)
            sv.values[fmt::format("{}@{}", a.name, z.c6_warmup)] = pt.at(1);
        if (a.name == "post-nowarmup") s.post_nowarmup = f;
        if (a.name == "post-warmup") s.post_warmup = f;
        if (a.name == "pre-nowarmup") s.pre_nowarmup = f;
      }
      sv.values["unigram"] = finite_or_null(s.unigram);
      c.per_seed.push_back(sv);
      if (ok) seeds.push_back(s);
    }
    c.data = {{"runs", runs}, {"unigram_val", finite_or_null(unigram)}};
    finish(c, opt, g6, rule_claim6(seeds));
    c.run_commands.erase(std::remove_if(c.run_commands.begin(), c.run_commands.end(),
                                        [](const std::string& s) { return s.starts_with("normlab eval"); }),
                         c.run_commands.end());
    claims.push_back(std::move(c));
  }

  if (opt.wants(7)) {
    ClaimResult c = make(7, "placement", "At shallow depth a well-tuned Post-LN can end slightly better than Pre-LN",
                         "At shallow depth (≤ 6 layers) a well-tuned Post-LN can end slightly better than Pre-LN.");
    c.measured = true;
    json cfg = train_config_summary(z, z.c7_layers);
    cfg["lr"] = z.c7_lr, cfg["schedule"] = "cosine", cfg["warmup"] = z.c7_warmup, cfg["lr_floor"] = 0.1,
    cfg["steps"] = z.c7_steps, cfg["arms"] = {"post", "pre"}, cfg["seeds"] = opt.seeds;
    c.config = cfg;
    c.note = quick_note(opt.quick) + "Paired: both arms of a seed share the initialization seed, batches and "
                                     "validation windows.";
    Gather g(outputs);
    std::vector<Claim7Seed> seeds;
    json runs = json::array();
    for (int seed : opt.seeds) {
      const json* po = g.get(c7_key("post", seed), jobs);
      const json* pr = g.get(c7_key("pre", seed), jobs);
      if (po) runs.push_back(run_entry("post", seed, *po));
      if (pr) runs.push_back(run_entry("pre", seed, *pr));
      if (!po || !pr) continue;
      Claim7Seed s{seed, num(po->at("unigram_val")), num(po->at("final_val")), num(pr->at("final_val"))};
      seeds.push_back(s);
      c.per_seed.push_back({seed, {{"post", finite_or_null(s.post)}, {"pre", finite_or_null(s.pre)},
                                   {"d", finite_or_null(s.post - s.pre)}}});
    }
    c.data = {{"runs", runs}};
    finish(c, opt, g, rule_claim7(seeds));
    claims.push_back(std::move(c));
  }

  if (opt.wants(8)) {
    ClaimResult c = make(8, "layer-utilization", "Pre-LN's deep layers are under-used",
                         "Pre-LN's deep layers are under-used: removing them costs little; Post-LN's cost a lot.");
    c.measured = true;
    json cfg = c6_config();
    cfg["compared"] = {"pre-warmup", "post-warmup"};
    cfg["removal"] = "validation loss increase: drop the last k blocks (k = 1..L-1); skip each block alone";
    if (z.c8_deep)
      cfg["deep"] = {{"layers", z.c8_layers}, {"lr", z.c8_lr}, {"schedule", "linear"}, {"warmup", z.c8_warmup},
                     {"steps", z.c8_steps}, {"seed", opt.seeds.empty() ? 0 : opt.seeds.front()},
                     {"arms", {"post", "pre (control on Post-LN's schedule)"}}};
    c.config = cfg;
    c.note = quick_note(opt.quick) +
             "The rule compares the 6-layer Pre-LN and Post-LN models trained with the same warmup schedule (claim 6's "
             "warmup arms), so the comparison is not a schedule artefact." +
             (z.c8_deep ? " The 12-layer pair (one seed) is shown for reference and does not enter the rule." : "");
    std::vector<Claim8Seed> seeds;
    json removal = json::array();
    auto add_removal = [&](const std::string& arm, int seed, int layers, const json* o) {
      if (!o || !o->contains("removal")) return;
      const json& r = o->at("removal");
      removal.push_back({{"arm", arm}, {"seed", seed}, {"layers", layers}, {"full", r.at("full")},
                         {"drop_last", r.at("drop_last")}, {"skip", r.at("skip")}});
    };
    for (int seed : opt.seeds) {
      const json* pre = c6[{"pre-warmup", seed}];
      const json* post = c6[{"post-warmup", seed}];
      add_removal("pre-warmup", seed, z.c6_layers, pre);
      add_removal("post-warmup", seed, z.c6_layers, post);
      add_removal("pre-nowarmup", seed, z.c6_layers, c6[{"pre-nowarmup", seed}]);
      if (!pre || !post) continue;
      Claim8Seed s{seed, num(pre->at("unigram_val")), kNaN, kNaN, {}, {}};
      if (pre->contains("removal")) s.pre_full = num(pre->at("removal").at("full")), s.pre_skip = nums(pre->at("removal").at("skip"));
      if (post->contains("removal"))
        s.post_full = num(post->at("removal").at("full")), s.post_skip = nums(post->at("removal").at("skip"));
      seeds.push_back(s);
      c.per_seed.push_back({seed, {{"D_pre", finite_or_null(deep_skip_mean(s.pre_skip))},
                                   {"D_post", finite_or_null(deep_skip_mean(s.post_skip))},
                                   {"pre_full", finite_or_null(s.pre_full)},
                                   {"post_full", finite_or_null(s.post_full)}}});
    }
    Gather g = g6;
    json deep = json::array();
    if (z.c8_deep && !opt.seeds.empty()) {
      const int seed = opt.seeds.front();
      for (const char* arm : {"post", "pre"}) {
        const json* o = g.get(c8_key(arm, z.c8_layers, seed), jobs);
        if (!o) continue;
        json e = run_entry(arm, seed, *o);
        if (o->contains("removal")) e["removal"] = o->at("removal");
        deep.push_back(e);
      }
    }
    c.data = {{"removal", removal}, {"deep", deep}};
    finish(c, opt, g, rule_claim8(seeds));
    claims.push_back(std::move(c));
  }

  if (opt.wants(9)) {
    ClaimResult c = make(9, "layer-utilization", "Token representations become similar late in training",
                         "Late in training, token representations can become similar (collapse); measured as the "
                         "mean pairwise cosine similarity of tokens per layer.");
    c.measured = true;
    c.config = c6_config();
    c.note = quick_note(opt.quick) +
             "Cosine over the tokens of the training batch at the first and the last logged update (Model::token_cosine, "
             "the training log's token_cosine), for claim 6's runs.";
    std::vector<Claim9Seed> seeds;
    json cos = json::array();
    for (int seed : opt.seeds) {
      Claim9Seed s{seed, {}};
      SeedValues sv{seed, json::object()};
      for (const Arm& a : c6_arms(z)) {
        const json* o = c6[{a.name, seed}];
        if (!o) continue;
        const double f = o->at("diverged").get<bool>() ? kNaN : num(o->at("final_val"));
        const double u = num(o->at("unigram_val"));
        Claim9Arm arm{a.name, std::isfinite(f) && f <= u - kThresholds.trained_margin, nums(o->at("cos_init")),
                      nums(o->at("cos_final"))};
        cos.push_back({{"arm", a.name}, {"seed", seed}, {"trained", arm.trained}, {"cos_init", o->at("cos_init")},
                       {"cos_final", o->at("cos_final")}});
        if (!arm.cos_final.empty())
          sv.values[a.name + "_last_layer_final"] = finite_or_null(arm.cos_final.back());
        s.arms.push_back(std::move(arm));
      }
      c.per_seed.push_back(sv);
      seeds.push_back(std::move(s));
    }
    c.data = {{"cosine", cos}};
    // Informational: arms that did not train are outside the rule, but their similarity is reported.
    std::string untrained;
    for (const Claim9Seed& s : seeds)
      for (const Claim9Arm& a : s.arms)
        if (!a.trained && !a.cos_final.empty())
          untrained += fmt::format("{}{} seed {}: {:.3g}", untrained.empty() ? "" : ", ", a.arm, s.seed,
                                   *std::max_element(a.cos_final.begin(), a.cos_final.end()));
    if (!untrained.empty())
      c.note += " Arms that did not train (outside the rule), max final token cosine: " + untrained + ".";
    Gather g = g6;
    finish(c, opt, g, rule_claim9(seeds));
    c.run_commands.erase(std::remove_if(c.run_commands.begin(), c.run_commands.end(),
                                        [](const std::string& s) { return s.starts_with("normlab eval"); }),
                         c.run_commands.end());
    claims.push_back(std::move(c));
  }

  // Experiments 11 and 12: short runs of one seed (Sizes::x_*).
  const int xseed = opt.seeds.empty() ? 0 : opt.seeds.front();
  auto x_config = [&] {
    json c = train_config_summary(z, 0);
    c.erase("layers");
    c["batch"] = z.x_batch, c["steps"] = z.x_steps, c["lr"] = z.x_lr, c["eval_every"] = z.x_eval_every;
    c["val_windows"] = z.x_val_windows, c["seed"] = xseed;
    return c;
  };
  auto x_entry = [](const std::string& variant, int layers, std::int64_t warmup, int seed, const json& o) {
    json e = run_entry(variant, seed, o);
    e["layers"] = layers, e["warmup"] = warmup;
    e["cos_final"] = o.value("cos_final", json::array()), e["resid_final"] = o.value("resid_final", json::array());
    return e;
  };

  if (opt.wants(11)) {
    ClaimResult c = make(11, "variants", "Placement variants train without warmup",
                         "The variants of the source articles (B2T, SiameseNorm, SpanNorm — the hybrids — and "
                         "Sandwich/Peri-LN, DeepNorm, Mix-LN, LayerNorm Scaling, DyT) train without learning-rate "
                         "warmup in the setting where Post-LN does not, at 6 and 12 layers.");
    c.measured = true;
    json cfg = x_config();
    json names = json::array();
    for (const Variant& v : kVariants) names.push_back(v.name);
    cfg["depths"] = z.v_depths, cfg["schedule"] = "constant (no warmup)", cfg["variants"] = names;
    cfg["controls"] = {"post", "pre"};
    c.config = cfg;
    // SpanNorm: ask the engine, report what it says.
    std::string refused;
    try {
      nn::ModelConfig mc;
      mc.placement = nn::parse_placement(kRefusedVariant);
      nn::Model m(mc);
      refused = "the engine built it (update the lab to run it)";
    } catch (const Error& e) {
      refused = e.what();
    }
    c.note = quick_note(opt.quick) +
             fmt::format("One seed; claim 6's model width and learning rate, shorter runs (batch {}, {} steps) to fit "
                         "the default run's budget. dyt = Pre-LN with DyT in place of every LayerNorm. SpanNorm is not "
                         "run: {}",
                         z.x_batch, z.x_steps, refused);
    Gather g(outputs);
    std::vector<VariantRun> vr;
    json runs = json::array();
    SeedValues sv{xseed, json::object()};
    for (const Variant& v : kVariants)
      for (int L : z.v_depths) {
        const json* o = g.get(x_key(v.name, L, 0, xseed), jobs);
        if (!o) continue;
        runs.push_back(x_entry(v.name, L, 0, xseed, *o));
        const double f = o->at("diverged").get<bool>() ? kNaN : num(o->at("final_val"));
        vr.push_back({v.name, L, num(o->at("unigram_val")), f});
        sv.values[fmt::format("{}_L{}", v.name, L)] = finite_or_null(f);
        if (!vr.empty()) sv.values["unigram"] = finite_or_null(vr.back().unigram);
      }
    c.per_seed.push_back(sv);
    c.data = {{"runs", runs}, {"refused", {{{"variant", kRefusedVariant}, {"error", refused}}}}};
    finish(c, opt, g, rule_variants(vr));
    claims.push_back(std::move(c));
  }

  if (opt.wants(12)) {
    ClaimResult c = make(12, "warmup", "Post-LN's warmup threshold grows with depth",
                         "The deeper the Post-LN model, the longer the learning-rate warmup it needs (Xiong et al. "
                         "2020: the gradients near the output grow with depth).");
    c.measured = true;
    json cfg = x_config();
    cfg["placement"] = "post", cfg["depths"] = z.w_depths, cfg["warmups"] = z.w_warmups;
    cfg["schedule"] = "linear warmup, then constant (warmup 0: constant)";
    c.config = cfg;
    c.note = quick_note(opt.quick) +
             fmt::format("One seed; the runs of the variants section's setting (batch {}, {} steps), so a warmup "
                         "threshold here is relative to this short budget.",
                         z.x_batch, z.x_steps);
    Gather g(outputs);
    std::vector<WarmupRun> wr;
    json runs = json::array();
    for (int L : z.w_depths)
      for (std::int64_t w : z.w_warmups) {
        const json* o = g.get(x_key("post", L, w, xseed), jobs);
        if (!o) continue;
        runs.push_back(x_entry("post", L, w, xseed, *o));
        const double f = o->at("diverged").get<bool>() ? kNaN : num(o->at("final_val"));
        wr.push_back({L, static_cast<long>(w), num(o->at("unigram_val")), f});
      }
    SeedValues sv{xseed, json::object()};
    for (int L : z.w_depths) {
      const long t = warmup_threshold(wr, L);
      sv.values[fmt::format("threshold_L{}", L)] = t < 0 ? json(nullptr) : json(t);
    }
    for (const WarmupRun& w : wr) sv.values[fmt::format("L{}_w{}", w.layers, w.warmup)] = finite_or_null(w.final_val);
    c.per_seed.push_back(sv);
    c.data = {{"runs", runs}};
    finish(c, opt, g, rule_warmup_depth(wr));
    claims.push_back(std::move(c));
  }

  std::sort(claims.begin(), claims.end(), [](const ClaimResult& a, const ClaimResult& b) { return a.id < b.id; });
  return claims;
}

}  // namespace normlab::lab
