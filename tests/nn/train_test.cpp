// The training loop (src/nn/train.h) on a tiny Pre-LN model and a small generated text: it learns,
// logs what the lab needs, resumes bit-identically, stops cleanly on divergence and keeps the last good
// checkpoint.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <unistd.h>

#include "nn/checkpoint.h"
#include "nn/train.h"
#include "support/tolerance.h"

namespace normlab::nn {
namespace {

namespace fs = std::filesystem;

class NnTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / (std::string("normlab_train_") + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // 40 kB of a small repetitive "language": words from a fixed list in a seeded order.
    std::mt19937_64 rng(11);
    const char* words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat. ", "dog ", "ran\n", "fortune ", "cookie "};
    std::ofstream f(dir_ / "text.txt", std::ios::binary);
    std::size_t n = 0;
    while (n < 40000) {
      const std::string w = words[rng() % 10];
      f << w;
      n += w.size();
    }
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  TrainConfig tiny(std::int64_t steps) const {
    TrainConfig c;
    c.model.placement = Placement::kPre;
    c.model.layers = 2;
    c.model.d_model = 16;
    c.model.heads = 2;
    c.model.ffn = 32;
    c.data = (dir_ / "text.txt").string();
    c.steps = steps;
    c.batch = 4;
    c.seq = 16;
    c.lr = 3e-3;
    c.eval_every = 5;
    c.val_windows = 8;
    c.seed = 3;
    c.threads = 1;
    return c;
  }
  fs::path dir_;
};

std::vector<nlohmann::json> read_lines(const fs::path& p) {
  std::ifstream f(p);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST_F(NnTrain, LearnsAndLogsTheInstrumentation) {
  TrainConfig c = tiny(60);
  c.eval_every = 20;
  c.log_path = (dir_ / "run.jsonl").string();
  std::vector<StepReport> reports;
  const TrainResult r = train(c, [&](const StepReport& s) { reports.push_back(s); });
  ASSERT_FALSE(r.diverged) << r.message;
  ASSERT_EQ(r.losses.size(), 60u);
  EXPECT_EQ(r.steps_done, 60);
  EXPECT_EQ(reports.size(), 60u);
  EXPECT_NEAR(r.losses.front(), std::log(256.0), 1.0);  // near-uniform at initialization
  EXPECT_LT(r.val_losses.back().second, r.losses.front() - 1.0);  // it learns
  const std::vector<nlohmann::json> lines = read_lines(c.log_path);
  ASSERT_EQ(lines.size(), 1u + 4u);  // header + steps 1, 20, 40, 60
  EXPECT_TRUE(lines[0].contains("config"));
  EXPECT_GT(lines[0]["unigram"].get<double>(), 1.0);
  const nlohmann::json& l = lines[2];
  EXPECT_EQ(l["step"], 20);
  for (const char* key : {"loss", "loss_avg", "val_loss", "lr", "grad_norm", "tokens_per_s"})
    EXPECT_TRUE(l[key].is_number()) << key;
  EXPECT_EQ(l["residual_norms"].size(), 2u);
  EXPECT_EQ(l["token_cosine"].size(), 2u);
  EXPECT_EQ(l["ln_input_norms"].size(), 5u);  // 2 per block + ln_f
  EXPECT_EQ(l["block_grad_norms"].size(), 2u);
  EXPECT_TRUE(l["grad_norms"].contains("blocks.1.ffn.w2.weight"));
  EXPECT_GT(l["update_ratio"]["blocks.0.attn.q.weight"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(l["val_loss"].get<double>(), r.val_losses[1].second);
  EXPECT_DOUBLE_EQ(l["loss"].get<double>(), r.losses[19]);
}

TEST_F(NnTrain, SameConfigSameLossesAndSeedsMatter) {
  const TrainResult a = train(tiny(8)), b = train(tiny(8));
  EXPECT_EQ(a.losses, b.losses);
  TrainConfig other = tiny(8);
  other.seed = 4;
  EXPECT_NE(train(other).losses, a.losses);
}

TEST_F(NnTrain, ResumeIsBitIdenticalToAnUninterruptedRun) {
  // 2k steps uninterrupted vs the same run's step-k checkpoint resumed to 2k, with a schedule that
  // depends on the step (warmup + cosine over 2k), clipping and weight decay, for both optimizers.
  const std::int64_t k = 10;
  for (OptimizerKind opt : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    TrainConfig full = tiny(2 * k);
    full.optimizer = opt;
    full.schedule = ScheduleKind::kCosine;
    full.warmup = 3;
    full.clip = 0.5;
    full.weight_decay = 0.01;
    full.eval_every = k;
    full.checkpoint_dir = (dir_ / "ck_full").string();
    if (opt == OptimizerKind::kSgd) full.lr = 0.1;
    // The checkpoint is written before the progress callback runs: copy the one of step k.
    const fs::path resume = dir_ / "resume";
    fs::create_directories(resume);
    const TrainResult whole = train(full, [&](const StepReport& s) {
      if (s.step == k)
        fs::copy_file(checkpoint_file(full.checkpoint_dir), checkpoint_file(resume.string()),
                      fs::copy_options::overwrite_existing);
    });
    ASSERT_EQ(whole.losses.size(), static_cast<std::size_t>(2 * k));
    ASSERT_EQ(read_checkpoint_meta(resume.string()).step, k);

    TrainConfig resumed = full;
    resumed.resume_dir = resume.string();
    resumed.checkpoint_dir = resume.string();
    const TrainResult r = train(resumed);
    EXPECT_EQ(r.first_step, k);
    ASSERT_EQ(r.losses.size(), static_cast<std::size_t>(k));
    for (std::int64_t i = 0; i < k; ++i) {
      const double a = whole.losses[static_cast<std::size_t>(k + i)], b = r.losses[static_cast<std::size_t>(i)];
      EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0)
          << optimizer_name(opt) << " step " << k + i + 1 << ": " << a << " vs " << b;
    }
    EXPECT_EQ(r.val_losses.back(), whole.val_losses.back());
    fs::remove_all(resume);
  }
}

TEST_F(NnTrain, ResumeWithConstantScheduleFromAShortRun) {
  // k steps with a checkpoint, then resume to 2k: the same losses as 2k uninterrupted steps.
  const std::int64_t k = 7;
  TrainConfig c = tiny(2 * k);
  c.eval_every = 0;
  const TrainResult whole = train(c);
  TrainConfig first = c;
  first.steps = k;
  first.checkpoint_dir = (dir_ / "ck").string();
  const TrainResult a = train(first);
  TrainConfig second = c;
  second.resume_dir = first.checkpoint_dir;
  const TrainResult b = train(second);
  std::vector<double> joined = a.losses;
  joined.insert(joined.end(), b.losses.begin(), b.losses.end());
  EXPECT_EQ(joined, whole.losses);
  // A mismatched config is refused with a clear message.
  TrainConfig wrong = c;
  wrong.model.layers = 3;
  wrong.resume_dir = first.checkpoint_dir;
  EXPECT_NL_ERROR(train(wrong), "layers = 2 in the checkpoint, 3 here");
}

TEST_F(NnTrain, BatchNormResumeIsBitIdenticalWithItsRunningStatistics) {
  // BatchNorm over the sequence: the validation loss uses the running statistics (eval mode), which
  // the checkpoint carries; a resumed run matches the uninterrupted one in losses and validation losses.
  const std::int64_t k = 6;
  TrainConfig c = tiny(2 * k);
  c.model.norm = NormKind::kBatchNorm;
  c.eval_every = k;
  c.log_path = (dir_ / "whole.jsonl").string();
  const TrainResult whole = train(c);
  TrainConfig first = c;
  first.steps = k;
  first.log_path = (dir_ / "first.jsonl").string();
  first.checkpoint_dir = (dir_ / "ck").string();
  const TrainResult a = train(first);
  TrainConfig second = c;
  second.log_path = (dir_ / "second.jsonl").string();
  second.resume_dir = first.checkpoint_dir;
  const TrainResult b = train(second);
  std::vector<double> joined = a.losses;
  joined.insert(joined.end(), b.losses.begin(), b.losses.end());
  EXPECT_EQ(joined, whole.losses);
  const auto lw = read_lines(dir_ / "whole.jsonl"), ls = read_lines(dir_ / "second.jsonl");
  ASSERT_FALSE(lw.empty());
  ASSERT_FALSE(ls.empty());
  EXPECT_EQ(lw.back()["step"], ls.back()["step"]);
  EXPECT_EQ(lw.back()["val_loss"], ls.back()["val_loss"]);
  // the checkpoint holds the running statistics; a model loaded from it evaluates like the run did
  Model m(read_checkpoint_meta(first.checkpoint_dir).model);
  ASSERT_FALSE(m.buffers().empty());
  load_checkpoint(first.checkpoint_dir, read_checkpoint_meta(first.checkpoint_dir).model, m.params(), nullptr,
                  m.buffers());
  bool moved = false;  // running_mean moved away from its initial 0
  for (const ParamRef& r : m.buffers())
    for (Index i = 0; i < r.numel(); ++i) moved |= r.name.ends_with("running_mean") && r.data[i] != 0.0f;
  EXPECT_TRUE(moved);
  // without the buffers the load is refused
  Model m2(read_checkpoint_meta(first.checkpoint_dir).model);
  EXPECT_NL_ERROR(load_checkpoint(first.checkpoint_dir, read_checkpoint_meta(first.checkpoint_dir).model, m2.params(),
                                  nullptr),
                  "buffers (running statistics)");
}

TEST_F(NnTrain, DivergenceStopsCleanlyAndKeepsTheLastGoodCheckpoint) {
  TrainConfig good = tiny(4);
  good.eval_every = 2;
  good.checkpoint_dir = (dir_ / "ck").string();
  ASSERT_FALSE(train(good).diverged);
  std::ifstream f0(checkpoint_file(good.checkpoint_dir), std::ios::binary);
  const std::string before((std::istreambuf_iterator<char>(f0)), std::istreambuf_iterator<char>());

  TrainConfig bad = tiny(50);
  bad.lr = 1e30;
  bad.eval_every = 1;
  bad.resume_dir = good.checkpoint_dir;
  bad.checkpoint_dir = good.checkpoint_dir;
  bad.log_path = (dir_ / "bad.jsonl").string();
  const TrainResult r = train(bad);
  ASSERT_TRUE(r.diverged);
  EXPECT_TRUE(r.message.starts_with("diverged at step ")) << r.message;
  EXPECT_TRUE(r.message.find("nan") != std::string::npos || r.message.find("inf") != std::string::npos) << r.message;
  EXPECT_LT(r.steps_done, 50);
  std::ifstream f1(checkpoint_file(good.checkpoint_dir), std::ios::binary);
  const std::string after((std::istreambuf_iterator<char>(f1)), std::istreambuf_iterator<char>());
  EXPECT_EQ(read_checkpoint_meta(good.checkpoint_dir).step, 4);
  EXPECT_EQ(before, after) << "the last good checkpoint must be kept";
  const std::vector<nlohmann::json> lines = read_lines(bad.log_path);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["diverged"], true);
  EXPECT_EQ(lines.back()["message"], r.message);
}

TEST_F(NnTrain, InvalidConfigsThrow) {
  TrainConfig c = tiny(10);
  c.schedule = ScheduleKind::kConstant;
  c.warmup = 5;
  EXPECT_NL_ERROR(train(c), "use schedule linear");
  c = tiny(0);
  EXPECT_NL_ERROR(train(c), "steps must be");
  c = tiny(10);
  c.data = (dir_ / "missing.txt").string();
  EXPECT_NL_ERROR(train(c), "data file not found");
  c = tiny(10);
  c.resume_dir = (dir_ / "nothing").string();
  EXPECT_NL_ERROR(train(c), "checkpoint not found");
}

TEST_F(NnTrain, EvaluateWithSkippedBlocks) {
  TrainConfig c = tiny(20);
  c.checkpoint_dir = (dir_ / "ck").string();
  c.eval_every = 20;
  const TrainResult r = train(c);
  const CheckpointMeta meta = read_checkpoint_meta(c.checkpoint_dir);
  Model m(meta.model);
  load_checkpoint(c.checkpoint_dir, meta.model, m.params(), nullptr);
  const LmData data = LmData::load(c.data);
  const double full = evaluate(m, data, c.seq, c.val_windows, c.batch);
  EXPECT_EQ(full, r.val_losses.back().second);  // same weights, same windows, same bits
  m.set_skipped_blocks({1});
  const double skipped = evaluate(m, data, c.seq, c.val_windows, c.batch);
  EXPECT_NE(skipped, full);
  const TrainConfig back = train_config_from_json(meta.extra);
  EXPECT_EQ(back.seq, c.seq);
  EXPECT_EQ(back.data, c.data);
  EXPECT_EQ(back.val_windows, c.val_windows);
}

}  // namespace
}  // namespace normlab::nn
