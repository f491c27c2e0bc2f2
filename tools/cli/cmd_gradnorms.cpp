// `normlab gradnorms --placement post|pre|... --layers L ... [--json]`: per-layer gradient norms at
// initialization (lab.md, claim 5; Xiong et al. 2020).
//
// For `--batches` random training windows of the byte corpus (src/nn/data.h), the model at init runs
// forward + backward of the mean token cross-entropy; each parameter's squared gradient norm is averaged
// over the batches and square-rooted. Output: one object per block, from the input side, keyed by the
// parameter's name inside the block ("attn.q" … "ffn.w2" for weight matrices — ffn.w2 is the FFN's output
// matrix —, "attn.q.bias", "norm1.weight", …); the parameters outside the blocks go to "other".
#include <normlab/error.h>
#include <normlab/nn/model.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.h"
#include "nn/data.h"

namespace normlab::cli {

namespace {

struct GradnormsOptions {
  std::string placement = "post";
  std::string norm = "layer";
  int layers = 6, d_model = 128, heads = 4, ffn = 512, seq = 64, batch = 32, batches = 8;
  std::uint64_t seed = 0;
  std::string data = "fortunes";
  bool json = false;
};

// "blocks.3.attn.q.weight" → (3, "attn.q"); "blocks.3.norm1.weight" → (3, "norm1.weight"); else (−1, name)
std::pair<int, std::string> layer_key(const nn::ParamRef& p) {
  if (!p.name.starts_with("blocks.")) return {-1, p.name};
  const std::size_t dot = p.name.find('.', 7);
  const int l = std::stoi(p.name.substr(7, dot - 7));
  std::string key = p.name.substr(dot + 1);
  if (p.shape.size() == 2 && key.ends_with(".weight")) key.resize(key.size() - 7);
  return {l, key};
}

void run_gradnorms(const GradnormsOptions& o) {
  NL_CHECK(o.batches >= 1, "--batches must be ≥ 1, got {}", o.batches);
  NL_CHECK(o.batch >= 1 && o.seq >= 1, "--batch and --seq must be ≥ 1, got {} and {}", o.batch, o.seq);
  nn::ModelConfig cfg;
  cfg.placement = nn::parse_placement(o.placement);
  cfg.norm = nn::parse_norm_kind(o.norm);
  cfg.layers = o.layers, cfg.d_model = o.d_model, cfg.heads = o.heads, cfg.ffn = o.ffn;
  cfg.vocab = 256, cfg.max_seq = o.seq, cfg.seed = o.seed;
  nn::Model model(cfg);
  const nn::LmData data = nn::LmData::load(o.data);
  nn::BatchSampler sampler(data, o.seed);

  const auto start = std::chrono::steady_clock::now();
  std::vector<nn::ParamRef> params = model.params();
  std::vector<double> sq(params.size(), 0.0);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(o.batch * o.seq)), targets(tokens.size());
  double loss_sum = 0;
  for (int i = 0; i < o.batches; ++i) {
    sampler.sample(tokens.data(), targets.data(), o.batch, o.seq);
    loss_sum += model.forward(tokens.data(), targets.data(), o.batch, o.seq);
    model.backward();
    for (std::size_t t = 0; t < params.size(); ++t) {
      double s = 0;
      for (Index j = 0; j < params[t].numel(); ++j) s += double(params[t].grad[j]) * params[t].grad[j];
      sq[t] += s;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  nlohmann::ordered_json layers = nlohmann::ordered_json::array(), other = nlohmann::ordered_json::object();
  for (int l = 0; l < o.layers; ++l) layers.push_back(nlohmann::ordered_json::object());
  for (std::size_t t = 0; t < params.size(); ++t) {
    const double norm = std::sqrt(sq[t] / o.batches);
    const auto [l, key] = layer_key(params[t]);
    (l >= 0 ? layers[static_cast<std::size_t>(l)] : other)[key] = norm;
  }
  nlohmann::ordered_json out = {
      {"config",
       {{"placement", nn::placement_name(cfg.placement)}, {"norm", o.norm}, {"layers", o.layers},
        {"d_model", o.d_model}, {"heads", o.heads}, {"ffn", o.ffn}, {"seq", o.seq}, {"batch", o.batch},
        {"batches", o.batches}, {"seed", o.seed}, {"data", o.data}}},
      {"loss", loss_sum / o.batches},
      {"seconds", seconds},
      {"layers", layers},
      {"other", other},
  };
  if (o.json) {
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print("normlab gradnorms: {} {}-norm, L={} d={} heads={} ffn={} T={} batch={} ×{} batches, seed {}\n",
             nn::placement_name(cfg.placement), o.norm, o.layers, o.d_model, o.heads, o.ffn, o.seq, o.batch,
             o.batches, o.seed);
  fmt::print("mean loss at init {:.4f} (ln 256 = {:.4f}); {:.1f} s\n", loss_sum / o.batches, std::log(256.0), seconds);
  fmt::print("{:>5} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}\n", "layer", "attn.q", "attn.k", "attn.v", "attn.o",
             "ffn.w1", "ffn.w2");
  for (int l = 0; l < o.layers; ++l) {
    const auto& j = layers[static_cast<std::size_t>(l)];
    fmt::print("{:>5} {:>11.4e} {:>11.4e} {:>11.4e} {:>11.4e} {:>11.4e} {:>11.4e}\n", l + 1, j["attn.q"].get<double>(),
               j["attn.k"].get<double>(), j["attn.v"].get<double>(), j["attn.o"].get<double>(),
               j["ffn.w1"].get<double>(), j["ffn.w2"].get<double>());
  }
}

}  // namespace

void add_gradnorms_command(CLI::App& app) {
  auto o = std::make_shared<GradnormsOptions>();
  CLI::App* cmd = app.add_subcommand(
      "gradnorms", "Per-layer gradient norms at initialization of the byte-level LM loss (Xiong et al. 2020)");
  cmd->footer(
      "Squared gradient norms of every parameter are averaged over --batches random windows of the corpus "
      "and square-rooted. The model is the lab's (lab.md): byte vocabulary 256, N(0,1) embedding, sinusoidal "
      "positions, causal attention, ReLU FFN, Xavier-uniform weights, seeded by --seed (the windows too).");
  cmd->add_option("--placement", o->placement,
                  "Norm placement: post|pre|sandwich|deepnorm|b2t|mixln|lns|siamese|none (see docs/placements.md)")
      ->capture_default_str();
  cmd->add_option("--norm", o->norm, "Norm kind: layer|rms|dyt|batch (batch: BatchNorm over batch and sequence)")->capture_default_str();
  cmd->add_option("--layers", o->layers, "Number of blocks L")->capture_default_str();
  cmd->add_option("--d-model", o->d_model, "Model width d")->capture_default_str();
  cmd->add_option("--heads", o->heads, "Attention heads (must divide d)")->capture_default_str();
  cmd->add_option("--ffn", o->ffn, "FFN hidden width")->capture_default_str();
  cmd->add_option("--seq", o->seq, "Sequence length T")->capture_default_str();
  cmd->add_option("--batch", o->batch, "Sequences per batch")->capture_default_str();
  cmd->add_option("--batches", o->batches, "Batches averaged over")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the weights and of the window sampler")->capture_default_str();
  cmd->add_option("--data", o->data, "A text file, or `fortunes` (the lab's corpus)")->capture_default_str();
  cmd->add_flag("--json", o->json, "Print {\"layers\": [{\"attn.q\": …, \"ffn.w2\": …}, …], …} as JSON");
  cmd->callback([o] { run_gradnorms(*o); });
}

}  // namespace normlab::cli
