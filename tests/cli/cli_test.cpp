// End-to-end tests of the normlab command (NORMLAB_CLI): each test runs the built binary with
// std::system in its own temporary directory, writes inputs with normlab::save_npy, reads outputs with
// normlab::load_npy and compares them with direct library calls (bitwise: the CLI must add nothing to
// the numbers). Covers `norm layer` forward, statistics and backward, axis lists, `exercise` (text and
// --json), `lab` (results.json), --help on every command, and the error contract: bad input exits 1 with
// "normlab: error: <message>" on stderr and writes no output.
#include <gtest/gtest.h>
#include <normlab/norm.h>
#include <normlab/npy.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/cli_runner.h"
#include "support/random.h"
#include "support/tolerance.h"

namespace normlab {
namespace {

namespace fs = std::filesystem;
using testing::bitwise_equal;
using testing::random_tensor;

using testing::contains;
using testing::describe;
using testing::read_file;
using testing::RunResult;
using CliTest = testing::CliDirTest;


#define ASSERT_RUN_OK(r) ASSERT_EQ((r).rc, 0) << describe(r)

// ---- norm layer: forward -------------------------------------------------------------------------

TEST_F(CliTest, NormLayerForwardEqualsLibraryBitwise) {
  std::mt19937_64 rng(1);
  const Tensor x = random_tensor({3, 5, 7}, rng, 2.0, 3.0);
  const Tensor w = random_tensor({7}, rng, 1.0, 1.0), b = random_tensor({7}, rng, 1.0, 0.0);
  save("x.npy", x);
  save("w.npy", w);
  save("b.npy", b);
  const RunResult r = run("norm layer x.npy -o y.npy --axes 2 --eps 1e-3 --weight w.npy --bias b.npy");
  ASSERT_RUN_OK(r);
  EXPECT_TRUE(r.err.empty()) << r.err;

  Tensor want(x.shape());
  layer_norm_forward(want.view(), View{}, View{}, x.cview(), w.cview(), b.cview(), {2}, 1e-3);
  const Tensor got = load("y.npy");
  EXPECT_TRUE(bitwise_equal(got.cview(), want.cview(), "y"));
  EXPECT_FALSE(exists("stats.mean.npy"));
}

TEST_F(CliTest, NormLayerDefaultEpsIs1e5) {
  std::mt19937_64 rng(2);
  const Tensor x = random_tensor({4, 16}, rng, 1e-3, 0.0);  // var ≈ 1e-6: eps matters
  save("x.npy", x);
  ASSERT_RUN_OK(run("norm layer x.npy -o y.npy --axes 1"));
  Tensor want(x.shape());
  layer_norm_forward(want.view(), View{}, View{}, x.cview(), ConstView{}, ConstView{}, {1}, 1e-5);
  EXPECT_TRUE(bitwise_equal(load("y.npy").cview(), want.cview(), "y"));
}

TEST_F(CliTest, NormLayerReadsFloat64Input) {
  std::mt19937_64 rng(3);
  const BasicTensor<double> xd = testing::random_dtensor({2, 9}, rng, 1.0, 0.5);
  save_npy(path("x64.npy"), xd.cview());
  ASSERT_RUN_OK(run("norm layer x64.npy -o y.npy --axes -1"));
  Tensor x32(xd.shape());
  for (Index i = 0; i < xd.numel(); ++i) x32[i] = static_cast<float>(xd[i]);
  Tensor want(x32.shape());
  layer_norm_forward(want.view(), View{}, View{}, x32.cview(), ConstView{}, ConstView{}, {-1}, 1e-5);
  EXPECT_TRUE(bitwise_equal(load("y.npy").cview(), want.cview(), "y"));
}

TEST_F(CliTest, StatsOutWritesMeanAndRstdWithKeptShape) {
  std::mt19937_64 rng(4);
  const Tensor x = random_tensor({3, 4, 5}, rng, 3.0, -2.0);
  save("x.npy", x);
  ASSERT_RUN_OK(run("norm layer x.npy -o y.npy --axes 1,2 --stats-out st"));
  ASSERT_TRUE(exists("st.mean.npy"));
  ASSERT_TRUE(exists("st.rstd.npy"));
  const Tensor mean = load("st.mean.npy"), rstd = load("st.rstd.npy");
  EXPECT_EQ(mean.shape(), (Dims{3}));
  EXPECT_EQ(rstd.shape(), (Dims{3}));

  Tensor y(x.shape()), wm(Dims{3}), wr(Dims{3});
  layer_norm_forward(y.view(), wm.view(), wr.view(), x.cview(), ConstView{}, ConstView{}, {1, 2}, 1e-5);
  EXPECT_TRUE(bitwise_equal(mean.cview(), wm.cview(), "mean"));
  EXPECT_TRUE(bitwise_equal(rstd.cview(), wr.cview(), "rstd"));
  EXPECT_TRUE(bitwise_equal(load("y.npy").cview(), y.cview(), "y"));
}

TEST_F(CliTest, StatsOutOverEveryAxisIsRankZero) {
  save("x.npy", Tensor({2, 2}, {1, 2, 3, 4}));
  ASSERT_RUN_OK(run("norm layer x.npy -o y.npy --axes 0,1 --stats-out s"));
  const Tensor mean = load("s.mean.npy");
  EXPECT_EQ(mean.rank(), 0);
  ASSERT_EQ(mean.numel(), 1);
  EXPECT_EQ(mean[0], 2.5f);
  EXPECT_EQ(load("s.rstd.npy").rank(), 0);
}

// ---- norm layer: axes ----------------------------------------------------------------------------

TEST_F(CliTest, AxesNegativeAndMultipleMatchLibrary) {
  std::mt19937_64 rng(5);
  const Tensor x = random_tensor({2, 3, 4, 5}, rng, 1.5, 1.0);
  save("x.npy", x);
  auto expect_same = [&](const std::string& axes_args, const Axes& axes, const Dims& kept) {
    SCOPED_TRACE(axes_args);
    const RunResult r = run("norm layer x.npy -o y.npy --stats-out s " + axes_args);
    ASSERT_RUN_OK(r);
    Tensor y(x.shape()), m(kept), s(kept);
    layer_norm_forward(y.view(), m.view(), s.view(), x.cview(), ConstView{}, ConstView{}, axes, 1e-5);
    EXPECT_TRUE(bitwise_equal(load("y.npy").cview(), y.cview(), "y"));
    EXPECT_TRUE(bitwise_equal(load("s.mean.npy").cview(), m.cview(), "mean"));
    EXPECT_TRUE(bitwise_equal(load("s.rstd.npy").cview(), s.cview(), "rstd"));
  };
  expect_same("--axes -1,-3", {-1, -3}, Dims{2, 4});
  expect_same("--axes=-1", {-1}, Dims{2, 3, 4});
  expect_same("--axes -2", {-2}, Dims{2, 3, 5});
  expect_same("--axes 0 --axes 2", {0, 2}, Dims{3, 5});
  expect_same("--axes 3,1,2", {1, 2, 3}, Dims{2});
  expect_same("--axes 0,1,2,3", {0, 1, 2, 3}, Dims{});
}

TEST_F(CliTest, AxesBeforeThePositionalInput) {
  std::mt19937_64 rng(6);
  const Tensor x = random_tensor({3, 4}, rng, 1.0, 0.0);
  save("x.npy", x);
  ASSERT_RUN_OK(run("norm layer --axes 0 x.npy -o y.npy"));
  Tensor y(x.shape());
  layer_norm_forward(y.view(), View{}, View{}, x.cview(), ConstView{}, ConstView{}, {0}, 1e-5);
  EXPECT_TRUE(bitwise_equal(load("y.npy").cview(), y.cview(), "y"));
}

// ---- norm layer: backward ------------------------------------------------------------------------

TEST_F(CliTest, BackwardOutputsEqualLibrary) {
  std::mt19937_64 rng(7);
  const Tensor x = random_tensor({6, 3, 8}, rng, 2.0, 1.0), dy = random_tensor({6, 3, 8}, rng, 1.0, 0.0);
  const Tensor w = random_tensor({3, 8}, rng, 0.5, 1.0);
  save("x.npy", x);
  save("dy.npy", dy);
  save("w.npy", w);
  const RunResult r =
      run("norm layer x.npy -o y.npy --axes -2,-1 --eps 1e-4 --weight w.npy --dy dy.npy --dx-out dx.npy "
          "--dweight-out dw.npy --dbias-out db.npy");
  ASSERT_RUN_OK(r);

  Tensor y(x.shape()), dx(x.shape()), dw(Dims{3, 8}), db(Dims{3, 8});
  layer_norm_forward(y.view(), View{}, View{}, x.cview(), w.cview(), ConstView{}, {-2, -1}, 1e-4);
  layer_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), {-2, -1}, 1e-4);
  EXPECT_TRUE(bitwise_equal(load("y.npy").cview(), y.cview(), "y"));
  EXPECT_TRUE(bitwise_equal(load("dx.npy").cview(), dx.cview(), "dx"));
  EXPECT_TRUE(bitwise_equal(load("dw.npy").cview(), dw.cview(), "dweight"));
  EXPECT_TRUE(bitwise_equal(load("db.npy").cview(), db.cview(), "dbias"));
}

TEST_F(CliTest, BackwardWithoutWeightWritesOnlyWhatIsAsked) {
  std::mt19937_64 rng(8);
  const Tensor x = random_tensor({5, 4}, rng, 1.0, 0.0), dy = random_tensor({5, 4}, rng, 1.0, 0.0);
  save("x.npy", x);
  save("dy.npy", dy);
  ASSERT_RUN_OK(run("norm layer x.npy -o y.npy --axes 0 --dy dy.npy --dx-out dx.npy"));
  Tensor dx(x.shape());
  layer_norm_backward(dx.view(), View{}, View{}, dy.cview(), x.cview(), ConstView{}, {0}, 1e-5);
  EXPECT_TRUE(bitwise_equal(load("dx.npy").cview(), dx.cview(), "dx"));
  std::vector<std::string> npy;
  for (const auto& e : fs::directory_iterator(dir_))
    if (e.path().extension() == ".npy") npy.push_back(e.path().filename().string());
  std::sort(npy.begin(), npy.end());
  EXPECT_EQ(npy, (std::vector<std::string>{"dx.npy", "dy.npy", "x.npy", "y.npy"}));
}

TEST_F(CliTest, ThreadCountDoesNotChangeTheBits) {
  std::mt19937_64 rng(9);
  const Tensor x = random_tensor({64, 33}, rng, 1.0, 100.0);
  save("x.npy", x);
  ASSERT_RUN_OK(run("norm layer x.npy -o y1.npy --axes 0 --threads 1"));
  ASSERT_RUN_OK(run("norm layer x.npy -o y2.npy --axes 0 --threads 2"));
  EXPECT_TRUE(bitwise_equal(load("y1.npy").cview(), load("y2.npy").cview(), "threads 1 vs 2"));
}

// ---- exercise ------------------------------------------------------------------------------------

// The whitespace-separated numbers on the `count` lines after the first line containing `header`.
std::vector<std::vector<double>> table_after(const std::string& text, const std::string& header, int count) {
  std::vector<std::vector<double>> rows;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line) && !contains(line, header)) {
  }
  while (static_cast<int>(rows.size()) < count && std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<double> row;
    double v;
    while (ls >> v) row.push_back(v);
    rows.push_back(row);
  }
  return rows;
}

TEST_F(CliTest, ExercisePrintsTheExpectedLines) {
  const RunResult r = run("exercise");
  ASSERT_RUN_OK(r);
  EXPECT_TRUE(contains(r.out, "input shape: [2, 4, 6]\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "LayerNorm output shape: [2, 4, 6]\n")) << r.out;
  const std::string diff_label = "max abs diff (normlab vs textbook per-row float loops): ";
  const std::size_t at = r.out.find(diff_label);
  ASSERT_NE(at, std::string::npos) << r.out;
  const double diff = std::strtod(r.out.c_str() + at + diff_label.size(), nullptr);
  EXPECT_GE(diff, 0.0);
  EXPECT_LT(diff, 1e-5) << r.out;
  EXPECT_TRUE(contains(r.out, "  x:             [2, 4, 6]\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "  LN(x):         [2, 4, 6]\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "  Linear(LN(x)): [2, 4, 6]\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "  y:             [2, 4, 6]\n")) << r.out;

  const auto means = table_after(r.out, "per-token mean", 2);
  const auto vars = table_after(r.out, "per-token variance", 2);
  ASSERT_EQ(means.size(), 2u) << r.out;
  ASSERT_EQ(vars.size(), 2u) << r.out;
  for (int b = 0; b < 2; ++b) {
    ASSERT_EQ(means[b].size(), 4u) << r.out;
    ASSERT_EQ(vars[b].size(), 4u) << r.out;
    for (int t = 0; t < 4; ++t) {
      EXPECT_LT(std::fabs(means[b][t]), 1e-5) << "b " << b << " t " << t;
      EXPECT_NEAR(vars[b][t], 1.0, 1e-3) << "b " << b << " t " << t;
    }
  }
}

TEST_F(CliTest, ExerciseJsonHasTheNumbers) {
  const RunResult r = run("exercise --json --seed 7");
  ASSERT_RUN_OK(r);
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
  EXPECT_EQ(j.at("seed").get<std::uint64_t>(), 7u);
  EXPECT_EQ(j.at("eps").get<double>(), 1e-5);
  EXPECT_EQ(j.at("input_shape").get<std::vector<Index>>(), (std::vector<Index>{2, 4, 6}));
  EXPECT_EQ(j.at("output_shape").get<std::vector<Index>>(), (std::vector<Index>{2, 4, 6}));
  const double diff = j.at("max_abs_diff").get<double>();
  EXPECT_GE(diff, 0.0);
  EXPECT_LT(diff, 1e-5);
  const auto means = j.at("token_mean").get<std::vector<std::vector<double>>>();
  const auto vars = j.at("token_var").get<std::vector<std::vector<double>>>();
  ASSERT_EQ(means.size(), 2u);
  ASSERT_EQ(vars.size(), 2u);
  for (int b = 0; b < 2; ++b) {
    ASSERT_EQ(means[b].size(), 4u);
    ASSERT_EQ(vars[b].size(), 4u);
    for (int t = 0; t < 4; ++t) {
      EXPECT_LT(std::fabs(means[b][t]), 1e-5);
      EXPECT_NEAR(vars[b][t], 1.0, 1e-3);
    }
  }
  const auto& block = j.at("prenorm_block");
  for (const char* key : {"x", "ln_x", "linear_ln_x", "y"})
    EXPECT_EQ(block.at(key).get<std::vector<Index>>(), (std::vector<Index>{2, 4, 6})) << key;
}

TEST_F(CliTest, ExerciseIsSeeded) {
  const RunResult a = run("exercise --json --seed 3");
  ASSERT_RUN_OK(a);
  const RunResult b = run("exercise --json --seed 3");
  ASSERT_RUN_OK(b);
  const RunResult c = run("exercise --json --seed 4");
  ASSERT_RUN_OK(c);
  EXPECT_EQ(a.out, b.out);
  const auto ja = nlohmann::json::parse(a.out), jc = nlohmann::json::parse(c.out);
  EXPECT_NE(ja.at("token_var"), jc.at("token_var"));
}

// ---- lab -----------------------------------------------------------------------------------------

TEST_F(CliTest, LabWritesResultsWithWorkedExamplesPassed) {
  // Claim 1 alone (the full lab and its report are tested in tests/lab/lab_cli_test.cpp).
  const RunResult r = run("lab --out labdir --only 1 --no-report");
  ASSERT_RUN_OK(r);
  ASSERT_TRUE(exists("labdir/results.json")) << r.out;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(read_file(dir_ / "labdir/results.json")));
  EXPECT_FALSE(j.at("quick").get<bool>());
  ASSERT_EQ(j.at("claims").size(), 1u);
  const nlohmann::json& claim = j.at("claims").at(0);
  EXPECT_EQ(claim.at("id").get<int>(), 1);
  EXPECT_EQ(claim.at("verdict").get<std::string>(), "reproduced") << claim.dump(2);
  for (const auto& c : claim.at("data").at("exercise_checks")) EXPECT_TRUE(c.at("passed").get<bool>()) << c.dump();
  EXPECT_EQ(claim.at("data").at("exercise_checks").size(), 4u);

  std::map<std::string, nlohmann::json> by_name;
  for (const auto& e : claim.at("data").at("worked_examples")) by_name[e.at("name").get<std::string>()] = e;
  ASSERT_EQ(by_name.size(), 3u) << claim.at("data").dump(2);
  for (const auto& [name, e] : by_name) EXPECT_TRUE(e.at("passed").get<bool>()) << name;

  // The numbers themselves, against the hand answers.
  auto actual = [&](const std::string& example, const std::string& quantity) {
    for (const auto& c : by_name.at(example).at("checks"))
      if (c.at("quantity") == quantity) return c.at("actual").get<std::vector<double>>();
    ADD_FAILURE() << example << " has no check of " << quantity;
    return std::vector<double>{};
  };
  const double s = std::sqrt(1.5);
  EXPECT_EQ(actual("layer-output", "mean"), (std::vector<double>{2.0}));
  const auto y1 = actual("layer-output", "y");
  ASSERT_EQ(y1.size(), 3u);
  EXPECT_NEAR(y1[0], -s, 1e-6);
  EXPECT_NEAR(y1[1], 0.0, 1e-6);
  EXPECT_NEAR(y1[2], s, 1e-6);
  EXPECT_EQ(actual("speech-over-F", "y"), (std::vector<double>{-1, -1, -1, 1, 1, 1}));
  const auto yt = actual("speech-over-T", "y");
  ASSERT_EQ(yt.size(), 6u);
  for (int row = 0; row < 2; ++row) {
    EXPECT_NEAR(yt[row * 3 + 0], -s, 1e-6);
    EXPECT_NEAR(yt[row * 3 + 1], 0.0, 1e-6);
    EXPECT_NEAR(yt[row * 3 + 2], s, 1e-6);
  }

  // Text: the verdict line of claim 1 and the checks count.
  EXPECT_TRUE(contains(r.out, "reproduced")) << r.out;
  EXPECT_TRUE(contains(r.out, "13 of 13 checks passed")) << r.out;  // 3 examples' y/mean/rstd + 4 exercise checks
}

TEST_F(CliTest, LabDefaultsToLabOut) {
  ASSERT_RUN_OK(run("lab --only 1 --no-report"));
  EXPECT_TRUE(exists("lab-out/results.json"));
}

// ---- --help --------------------------------------------------------------------------------------

TEST_F(CliTest, HelpWorksOnEveryCommand) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--help", "exercise"},          {"norm --help", "layer"},
      {"norm layer --help", "--axes"}, {"norm layer --help", "--dx-out"},
      {"exercise --help", "--seed"},   {"lab --help", "--out"},
  };
  for (const auto& [args, needle] : cases) {
    const RunResult r = run(args);
    EXPECT_EQ(r.rc, 0) << args << "\n" << describe(r);
    EXPECT_TRUE(contains(r.out, "Usage:")) << args << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, needle)) << args << " lacks " << needle << "\n" << r.out;
  }
}

// ---- errors --------------------------------------------------------------------------------------

struct ErrorCase {
  const char* name;
  const char* args;
  const char* needle;  // must appear in stderr
};

// Names the case in gtest's messages instead of dumping its bytes.
void PrintTo(const ErrorCase& c, std::ostream* os) {
  *os << c.name;
}

class CliErrorTest : public CliTest, public ::testing::WithParamInterface<ErrorCase> {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    save("x.npy", Tensor({2, 4}, {1, 2, 3, 4, 5, 6, 7, 9}));
    save("dy.npy", Tensor({2, 4}, {1, 0, 0, 0, 0, 0, 0, 1}));
    save("dy_bad.npy", Tensor({4, 2}, {1, 0, 0, 0, 0, 0, 0, 1}));
    save("w4.npy", Tensor({4}, {1, 1, 1, 1}));
    save("w5.npy", Tensor({5}, {1, 1, 1, 1, 1}));
    std::ofstream(path("garbage.npy"), std::ios::binary) << "this is not a numpy file at all";
  }
};

TEST_P(CliErrorTest, ExitsOneWithMessageAndWritesNothing) {
  const ErrorCase& c = GetParam();
  const RunResult r = run(c.args);
  EXPECT_EQ(r.rc, 1) << describe(r);
  EXPECT_EQ(r.err.rfind("normlab: error: ", 0), 0u) << describe(r);
  EXPECT_TRUE(contains(r.err, c.needle)) << "stderr lacks \"" << c.needle << "\"\n" << describe(r);
  for (const char* out : {"y.npy", "dx.npy", "dw.npy", "db.npy", "st.mean.npy", "st.rstd.npy"})
    EXPECT_FALSE(exists(out)) << out << " was written despite the error";
}

INSTANTIATE_TEST_SUITE_P(
    Cli, CliErrorTest,
    ::testing::Values(
        ErrorCase{"MissingInput", "norm layer missing.npy -o y.npy --axes 1", "missing.npy"},
        ErrorCase{"MalformedNpy", "norm layer garbage.npy -o y.npy --axes 1", "garbage.npy"},
        ErrorCase{"MalformedWeight", "norm layer x.npy -o y.npy --axes 1 --weight garbage.npy", "--weight"},
        ErrorCase{"AxisOutOfRange", "norm layer x.npy -o y.npy --axes 2", "axis 2 is out of range"},
        ErrorCase{"NegativeAxisOutOfRange", "norm layer x.npy -o y.npy --axes=-3", "axis -3 is out of range"},
        ErrorCase{"DuplicateAxis", "norm layer x.npy -o y.npy --axes 1,-1", "given twice"},
        ErrorCase{"NonIntegerAxis", "norm layer x.npy -o y.npy --axes 1,x", "'x' is not an integer"},
        ErrorCase{"MissingAxes", "norm layer x.npy -o y.npy", "--axes is required"},
        ErrorCase{"MissingOutput", "norm layer x.npy --axes 1", "--output is required"},
        ErrorCase{"WeightShapeMismatch", "norm layer x.npy -o y.npy --axes 1 --weight w5.npy --stats-out st",
                  "--weight has shape [5], but the input's shape at the normalized axes is [4]"},
        ErrorCase{"BiasShapeMismatch", "norm layer x.npy -o y.npy --axes 0 --bias w4.npy",
                  "--bias has shape [4]"},
        ErrorCase{"DyShapeMismatch", "norm layer x.npy -o y.npy --axes 1 --dy dy_bad.npy --dx-out dx.npy",
                  "--dy has shape [4, 2]"},
        ErrorCase{"DxOutWithoutDy", "norm layer x.npy -o y.npy --axes 1 --dx-out dx.npy",
                  "--dx-out needs --dy"},
        ErrorCase{"DyWithoutDxOut", "norm layer x.npy -o y.npy --axes 1 --dy dy.npy", "--dy needs --dx-out"},
        ErrorCase{"DweightOutWithoutDy", "norm layer x.npy -o y.npy --axes 1 --dweight-out dw.npy",
                  "--dweight-out needs --dy"},
        ErrorCase{"NegativeEps", "norm layer x.npy -o y.npy --axes 1 --eps -0.1", "--eps must be finite and"},
        ErrorCase{"NanEps", "norm layer x.npy -o y.npy --axes 1 --eps nan", "--eps must be finite and"},
        ErrorCase{"ZeroThreads", "norm layer x.npy -o y.npy --axes 1 --threads 0",
                  "--threads must be at least 1"},
        ErrorCase{"UnknownOption", "norm layer x.npy -o y.npy --axes 1 --bogus", "--bogus"},
        ErrorCase{"NormWithoutKind", "norm", "subcommand is required"},
        ErrorCase{"LabOutIsAFile", "lab --out x.npy", "cannot create directory"}),
    [](const ::testing::TestParamInfo<ErrorCase>& p) { return std::string(p.param.name); });

// A bad NORMLAB_ROW_TUNING (the row kernels' machine choices) is an error like any bad input: exit 1 with
// the message, no output. The child inherits this process's environment.
TEST_F(CliTest, BadRowTuningExitsOneWithMessage) {
  save("x.npy", Tensor({2, 4}, {1, 2, 3, 4, 5, 6, 7, 9}));
  ASSERT_EQ(setenv("NORMLAB_ROW_TUNING", "zen6", 1), 0);
  const RunResult r = run("norm layer x.npy -o y.npy --axes 1");
  unsetenv("NORMLAB_ROW_TUNING");
  EXPECT_EQ(r.rc, 1) << describe(r);
  EXPECT_EQ(r.err.rfind("normlab: error: ", 0), 0u) << describe(r);
  EXPECT_TRUE(contains(r.err, "NORMLAB_ROW_TUNING must be intel, zen4 or zen5, got 'zen6'")) << describe(r);
  EXPECT_FALSE(exists("y.npy"));
  ASSERT_EQ(setenv("NORMLAB_ROW_TUNING", "zen5", 1), 0);
  const RunResult ok = run("norm layer x.npy -o y.npy --axes 1");
  unsetenv("NORMLAB_ROW_TUNING");
  ASSERT_RUN_OK(ok);
  EXPECT_TRUE(exists("y.npy"));
}

}  // namespace
}  // namespace normlab
