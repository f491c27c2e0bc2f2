// End-to-end tests of `normlab train` and `normlab eval` (NORMLAB_CLI) on a small generated text:
// exit codes, the JSON summary and log, checkpoints, resume, layer removal, divergence and errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace normlab {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class CliTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("normlab_cli_train_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::mt19937_64 rng(5);
    const char* words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat. ", "dog ", "ran\n"};
    std::ofstream f(dir_ / "text.txt");
    for (int i = 0; i < 6000; ++i) f << words[rng() % 8];
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  CliRun run(const std::string& args) {
    const std::string cmd = "cd '" + dir_.string() + "' && '" NORMLAB_CLI "' " + args + " > out.txt 2> err.txt";
    const int st = std::system(cmd.c_str());
    CliRun r;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(dir_ / "out.txt");
    r.err = slurp(dir_ / "err.txt");
    return r;
  }
  static std::string model_flags() {
    return "--placement pre --layers 2 --d-model 16 --heads 2 --ffn 32 --seq 16 --batch 4 --data text.txt "
           "--threads 1 --val-windows 8";
  }
  fs::path dir_;
};

TEST_F(CliTrain, TrainsLogsCheckpointsAndEvaluates) {
  const CliRun r = run("train " + model_flags() + " --steps 30 --eval-every 10 --log run.jsonl --checkpoint ck");
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json s = nlohmann::json::parse(r.out);
  EXPECT_EQ(s["steps"], 30);
  EXPECT_TRUE(s["final_val_loss"].is_number());
  EXPECT_NE(r.err.find("step 30/30"), std::string::npos) << r.err;  // plain progress lines (not a tty)
  std::ifstream log(dir_ / "run.jsonl");
  std::string line;
  std::vector<nlohmann::json> lines;
  while (std::getline(log, line)) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 5u);  // header + steps 1, 10, 20, 30
  EXPECT_EQ(lines.back()["step"], 30);
  EXPECT_EQ(lines.back()["val_loss"], s["final_val_loss"]);
  ASSERT_TRUE(fs::exists(dir_ / "ck" / "checkpoint.bin"));

  const CliRun e = run("eval --checkpoint ck");
  ASSERT_EQ(e.rc, 0) << e.err;
  const nlohmann::json full = nlohmann::json::parse(e.out);
  EXPECT_EQ(full["val_loss"], s["final_val_loss"]);  // bitwise: same weights and windows
  EXPECT_EQ(full["step"], 30);
  const CliRun d = run("eval --checkpoint ck --drop-last 1");
  ASSERT_EQ(d.rc, 0) << d.err;
  const nlohmann::json dropped = nlohmann::json::parse(d.out);
  EXPECT_EQ(dropped["skipped"], nlohmann::json::array({1}));
  EXPECT_EQ(dropped["val_loss_full"], full["val_loss"]);
  EXPECT_NE(dropped["val_loss"], full["val_loss"]);
  const CliRun k = run("eval --checkpoint ck --skip-block 0");
  ASSERT_EQ(k.rc, 0) << k.err;
  EXPECT_EQ(nlohmann::json::parse(k.out)["skipped"], nlohmann::json::array({0}));
  EXPECT_EQ(run("eval --checkpoint ck --skip-block 2").rc, 1);
  EXPECT_EQ(run("eval --checkpoint ck --drop-last 1 --skip-block 0").rc, 1);
  const CliRun missing = run("eval --checkpoint nowhere");
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.err.find("normlab: error: checkpoint not found"), std::string::npos) << missing.err;
}

TEST_F(CliTrain, ResumeContinuesTheSameRun) {
  ASSERT_EQ(run("train " + model_flags() + " --steps 20 --eval-every 10 --log a.jsonl").rc, 0);
  ASSERT_EQ(run("train " + model_flags() + " --steps 10 --eval-every 10 --checkpoint ck").rc, 0);
  const CliRun r = run("train " + model_flags() + " --steps 20 --eval-every 10 --resume ck --log b.jsonl");
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json s = nlohmann::json::parse(r.out);
  EXPECT_EQ(s["first_step"], 10);
  std::string last_a, last_b, line;
  std::ifstream a(dir_ / "a.jsonl"), b(dir_ / "b.jsonl");
  while (std::getline(a, line)) last_a = line;
  while (std::getline(b, line)) last_b = line;
  const nlohmann::json ja = nlohmann::json::parse(last_a), jb = nlohmann::json::parse(last_b);
  EXPECT_EQ(ja["step"], 20);
  EXPECT_EQ(ja["loss"], jb["loss"]);
  EXPECT_EQ(ja["val_loss"], jb["val_loss"]);
}

TEST_F(CliTrain, DivergenceExitsNonZeroWithTheMessage) {
  const CliRun r = run("train " + model_flags() + " --steps 50 --lr 1e30 --log bad.jsonl");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("normlab: error: diverged at step "), std::string::npos) << r.err;
  EXPECT_TRUE(r.err.find("= nan") != std::string::npos || r.err.find("= inf") != std::string::npos) << r.err;
}

TEST_F(CliTrain, BadArgumentsExitOne) {
  CliRun r = run("train " + model_flags() + " --schedule sometimes");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("valid: constant, linear, cosine, noam"), std::string::npos) << r.err;
  r = run("train --placement middle --layers 2 --d-model 16 --heads 2 --ffn 32 --data text.txt");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("unknown placement"), std::string::npos) << r.err;
  r = run("train " + model_flags() + " --optimizer lion");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("valid: adamw, sgd"), std::string::npos) << r.err;
  r = run("train --layers 2 --d-model 16 --heads 2 --ffn 32 --data missing.txt");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("data file not found: missing.txt"), std::string::npos) << r.err;
  r = run("train " + model_flags() + " --schedule constant --warmup 10");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("use schedule linear"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace normlab
