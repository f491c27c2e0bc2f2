// Checkpoints (src/nn/checkpoint.h) on a parameter set without a Model: round trip of weights, AdamW /
// SGD state, step, RNG state and config; atomic writes; clear errors for missing, truncated, corrupt
// and mismatched checkpoints, which leave the destination untouched.
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <unistd.h>
#include <vector>

#include "nn/checkpoint.h"
#include "support/tolerance.h"

namespace normlab::nn {
namespace {

namespace fs = std::filesystem;

struct Params {
  std::vector<std::vector<float>> data, grad;
  std::vector<ParamRef> refs;
  Params(std::uint64_t seed, Index extra = 0) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd;
    const std::vector<std::pair<std::string, Dims>> meta = {
        {"wte", Dims{8, 4}}, {"blocks.0.attn.q.weight", Dims{4, 4 + extra}}, {"blocks.0.attn.q.bias", Dims{4}}};
    for (const auto& [name, shape] : meta) {
      data.emplace_back(static_cast<std::size_t>(shape.product()));
      grad.emplace_back(static_cast<std::size_t>(shape.product()));
      for (float& x : data.back()) x = nd(rng);
      for (float& x : grad.back()) x = nd(rng);
    }
    for (std::size_t i = 0; i < meta.size(); ++i)
      refs.push_back({meta[i].first, meta[i].second, data[i].data(), grad[i].data()});
  }
};

std::string temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("normlab_ckpt_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d.string();
}

ModelConfig small_config() {
  ModelConfig c;
  c.layers = 1;
  c.d_model = 4;
  c.seed = 42;
  c.norm_eps = 1e-5;
  return c;
}

CheckpointMeta meta_at(std::int64_t step) {
  CheckpointMeta m;
  m.model = small_config();
  m.step = step;
  std::mt19937_64 rng(5);
  rng.discard(17);
  std::ostringstream os;
  os << rng;
  m.rng_state = os.str();
  m.extra = R"({"lr":0.003,"data":"fortunes"})";
  return m;
}

TEST(NnCheckpoint, RoundTripWeightsOptimizerStepRngAndConfig) {
  const std::string dir = temp_dir("roundtrip");
  Params a(1);
  AdamW opt_a(a.refs);
  opt_a.step(1e-2);
  opt_a.step(1e-2);
  save_checkpoint(dir, meta_at(2), a.refs, &opt_a);
  EXPECT_TRUE(fs::exists(checkpoint_file(dir)));
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().filename(), "checkpoint.bin");  // no temp left

  Params b(2);
  AdamW opt_b(b.refs);
  const CheckpointMeta m = load_checkpoint(dir, small_config(), b.refs, &opt_b);
  EXPECT_EQ(m.step, 2);
  EXPECT_EQ(m.rng_state, meta_at(2).rng_state);
  EXPECT_EQ(m.optimizer, "adamw");
  EXPECT_EQ(m.extra, R"({"data":"fortunes","lr":0.003})");
  EXPECT_EQ(model_config_json(m.model), model_config_json(small_config()));
  EXPECT_EQ(a.data, b.data);
  EXPECT_EQ(opt_b.steps(), 2);
  // Same state ⇒ the next update is identical.
  b.grad = a.grad;
  opt_a.step(1e-2);
  opt_b.step(1e-2);
  EXPECT_EQ(a.data, b.data);

  const CheckpointMeta header = read_checkpoint_meta(dir);
  EXPECT_EQ(header.step, 2);
  EXPECT_EQ(header.model.seed, 42u);
  fs::remove_all(dir);
}

TEST(NnCheckpoint, OverwriteAndSgdState) {
  const std::string dir = temp_dir("sgd");
  Params a(1);
  Sgd opt(a.refs, SgdOptions{0.9});
  opt.step(0.1);
  save_checkpoint(dir, meta_at(1), a.refs, &opt);
  opt.step(0.1);
  save_checkpoint(dir, meta_at(2), a.refs, &opt);  // replaces the first
  Params b(3);
  Sgd opt_b(b.refs, SgdOptions{0.9});
  EXPECT_EQ(load_checkpoint(dir, small_config(), b.refs, &opt_b).step, 2);
  EXPECT_EQ(a.data, b.data);
  for (std::size_t i = 0; i < opt.state().size(); ++i)
    for (Index j = 0; j < opt.state()[i].numel; ++j) EXPECT_EQ(opt.state()[i].data[j], opt_b.state()[i].data[j]);
  // Weights only.
  Params c(4);
  load_checkpoint(dir, small_config(), c.refs, nullptr);
  EXPECT_EQ(a.data, c.data);
  fs::remove_all(dir);
}

class NnCheckpointErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = temp_dir("errors");
    save_checkpoint(dir, meta_at(3), a.refs, &opt);
    std::ifstream in(checkpoint_file(dir), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  void TearDown() override { fs::remove_all(dir); }
  void write(const std::string& b) {
    std::ofstream out(checkpoint_file(dir), std::ios::binary | std::ios::trunc);
    out << b;
  }
  // Loading must fail with `needle` and leave the destination's weights alone.
  void expect_fails(const ModelConfig& cfg, Params& dst, Optimizer* o, const std::string& needle) {
    const auto before = dst.data;
    EXPECT_NL_ERROR(load_checkpoint(dir, cfg, dst.refs, o), needle);
    EXPECT_EQ(dst.data, before);
  }
  std::string dir, bytes;
  Params a{1};
  AdamW opt{a.refs};
};

TEST_F(NnCheckpointErrors, Missing) {
  Params b(2);
  EXPECT_NL_ERROR(load_checkpoint(dir + "/nope", small_config(), b.refs, nullptr), "checkpoint not found");
  EXPECT_NL_ERROR(read_checkpoint_meta(dir + "/nope"), "checkpoint not found");
}

TEST_F(NnCheckpointErrors, Truncated) {
  Params b(2);
  write(bytes.substr(0, bytes.size() - 20));
  expect_fails(small_config(), b, nullptr, "truncated");
  write(bytes.substr(0, 10));
  expect_fails(small_config(), b, nullptr, "truncated");
}

TEST_F(NnCheckpointErrors, CorruptDataOrMagicOrVersion) {
  Params b(2);
  std::string bad = bytes;
  bad[bad.size() - 40] ^= 0x10;  // a float of the optimizer state
  write(bad);
  expect_fails(small_config(), b, nullptr, "checksum mismatch");
  bad = bytes;
  bad[0] = 'X';
  write(bad);
  expect_fails(small_config(), b, nullptr, "not a normlab checkpoint");
  bad = bytes;
  bad[8] = 9;
  write(bad);
  expect_fails(small_config(), b, nullptr, "version 9");
}

TEST_F(NnCheckpointErrors, DifferentConfig) {
  Params b(2);
  ModelConfig other = small_config();
  other.layers = 2;
  expect_fails(other, b, nullptr, "layers = 1 in the checkpoint, 2 here");
  other = small_config();
  other.placement = Placement::kPost;
  expect_fails(other, b, nullptr, "placement");
}

TEST_F(NnCheckpointErrors, DifferentShapesOrOptimizer) {
  Params wide(2, /*extra=*/1);
  expect_fails(small_config(), wide, nullptr, "has shape [4, 4] in the checkpoint, [4, 5] in the model");
  Params b(2);
  Sgd sgd(b.refs, SgdOptions{0.9});
  expect_fails(small_config(), b, &sgd, "holds adamw optimizer state, the run uses sgd");
  Params c(2);
  c.refs.pop_back();
  expect_fails(small_config(), c, nullptr, "has 3 parameters, the model has 2");
}

}  // namespace
}  // namespace normlab::nn
