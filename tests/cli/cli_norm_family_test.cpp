// End-to-end tests of the normalization family on the command line: `normlab norm rms|batch|instance|
// group|cmvn` and `normlab cmvn-stats`. As in cli_test.cpp (same fixture, tests/support/cli_runner.h), each test
// runs the built binary (NORMLAB_CLI) in its own temporary directory and compares every output with the
// direct library call bit for bit; the error cases check exit code 1, "normlab: error: <message>" and that
// no output file was written.
#include <gtest/gtest.h>
#include <normlab/cmvn.h>
#include <normlab/norm.h>
#include <normlab/npy.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
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

#define ASSERT_RUN_OK(r) ASSERT_EQ((r).rc, 0) << describe(r)

class NormFamilyCliTest : public testing::CliDirTest {
 protected:
  void save_lengths(const std::string& name, const std::vector<Index>& v) const {
    save_npy_index(path(name), v, Dims{static_cast<Index>(v.size())});
  }
  void save_all(const std::vector<std::pair<std::string, const Tensor*>>& files) const {
    for (const auto& [name, t] : files) save(name, *t);
  }
  // Loads `name` and compares it bitwise with `want`.
  ::testing::AssertionResult same(const std::string& name, const Tensor& want) const {
    if (!exists(name)) return ::testing::AssertionFailure() << name << " was not written";
    return bitwise_equal(load(name).cview(), want.cview(), name);
  }
};

Tensor positive_tensor(Dims shape, std::mt19937_64& rng) {
  Tensor t = random_tensor(shape, rng, 0.3, 1.0);
  for (Index i = 0; i < t.numel(); ++i) t[i] = std::fabs(t[i]) + 0.1f;
  return t;
}

// ---- rms -----------------------------------------------------------------------------------------

TEST_F(NormFamilyCliTest, RmsForwardStatsAndBackwardEqualLibrary) {
  std::mt19937_64 rng(11);
  const Tensor x = random_tensor({4, 3, 6}, rng, 2.0, 0.5), dy = random_tensor({4, 3, 6}, rng, 1.0, 0.0);
  const Tensor w = random_tensor({3, 6}, rng, 0.5, 1.0);
  save("x.npy", x);
  save("dy.npy", dy);
  save("w.npy", w);
  ASSERT_RUN_OK(
      run("norm rms x.npy -o y.npy --axes -2,-1 --eps 1e-4 --weight w.npy --stats-out st --dy dy.npy "
          "--dx-out dx.npy --dweight-out dw.npy"));
  Tensor y(x.shape()), rstd(Dims{4}), dx(x.shape()), dw(Dims{3, 6});
  rms_norm_forward(y.view(), rstd.view(), x.cview(), w.cview(), {-2, -1}, 1e-4);
  rms_norm_backward(dx.view(), dw.view(), dy.cview(), x.cview(), w.cview(), {-2, -1}, 1e-4);
  EXPECT_TRUE(same("y.npy", y));
  EXPECT_TRUE(same("st.rstd.npy", rstd));
  EXPECT_TRUE(same("dx.npy", dx));
  EXPECT_TRUE(same("dw.npy", dw));
  EXPECT_FALSE(exists("st.mean.npy"));  // RMSNorm has no mean
}

TEST_F(NormFamilyCliTest, RmsDefaultEpsIs1e6AndTorchIsFltEpsilon) {
  std::mt19937_64 rng(12);
  const Tensor x = random_tensor({5, 8}, rng, 1e-3, 0.0);  // mean square ≈ 1e-6: eps matters
  save("x.npy", x);
  ASSERT_RUN_OK(run("norm rms x.npy -o y_default.npy --axes 1"));
  ASSERT_RUN_OK(run("norm rms x.npy -o y_torch.npy --axes 1 --eps torch"));
  Tensor want_default(x.shape()), want_torch(x.shape());
  rms_norm_forward(want_default.view(), View{}, x.cview(), ConstView{}, {1}, kRmsNormEps);
  rms_norm_forward(want_torch.view(), View{}, x.cview(), ConstView{}, {1}, kTorchRmsNormEps);
  EXPECT_TRUE(same("y_default.npy", want_default));
  EXPECT_TRUE(same("y_torch.npy", want_torch));
  EXPECT_FALSE(bitwise_equal(want_default.cview(), want_torch.cview()));  // the two eps really differ here
}

// ---- batch ---------------------------------------------------------------------------------------

TEST_F(NormFamilyCliTest, BatchTrainingUpdatesRunningStatsAndMatchesLibrary) {
  std::mt19937_64 rng(21);
  const Tensor x = random_tensor({4, 3, 5}, rng, 2.0, 1.0), dy = random_tensor({4, 3, 5}, rng, 1.0, 0.0);
  const Tensor w = random_tensor({3}, rng, 0.5, 1.0), b = random_tensor({3}, rng, 0.5, 0.0);
  const Tensor rm = random_tensor({3}, rng, 1.0, 0.0), rv = positive_tensor({3}, rng);
  save_all({{"x.npy", &x}, {"dy.npy", &dy}, {"w.npy", &w}, {"b.npy", &b}, {"rm.npy", &rm}, {"rv.npy", &rv}});
  ASSERT_RUN_OK(
      run("norm batch x.npy -o y.npy --eps 1e-3 --weight w.npy --bias b.npy --momentum 0.25 "
          "--running-mean rm.npy --running-var rv.npy --running-mean-out rm2.npy --running-var-out "
          "rv2.npy --stats-out st --dy dy.npy --dx-out dx.npy --dweight-out dw.npy --dbias-out db.npy"));
  BatchNormOptions opt;
  opt.eps = 1e-3;
  opt.momentum = 0.25;
  Tensor y(x.shape()), sm(Dims{3}), sr(Dims{3}), rm2 = rm.clone(), rv2 = rv.clone();
  Index nbt = 0;
  batch_norm_forward(y.view(), sm.view(), sr.view(), rm2.view(), rv2.view(), &nbt, x.cview(), w.cview(),
                     b.cview(), {}, opt);
  Tensor dx(x.shape()), dw(Dims{3}), db(Dims{3});
  batch_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), rm.cview(),
                      rv.cview(), {}, opt);
  EXPECT_TRUE(same("y.npy", y));
  EXPECT_TRUE(same("st.mean.npy", sm));
  EXPECT_TRUE(same("st.rstd.npy", sr));
  EXPECT_TRUE(same("rm2.npy", rm2));
  EXPECT_TRUE(same("rv2.npy", rv2));
  EXPECT_FALSE(bitwise_equal(rm2.cview(), rm.cview()));  // the running mean did move
  EXPECT_TRUE(same("dx.npy", dx));
  EXPECT_TRUE(same("dw.npy", dw));
  EXPECT_TRUE(same("db.npy", db));
}

TEST_F(NormFamilyCliTest, BatchRunningStatsOutStartFromPyTorchInit) {
  std::mt19937_64 rng(22);
  const Tensor x = random_tensor({6, 4}, rng, 3.0, 2.0);  // [N, C]: BatchNorm1d on features
  save("x.npy", x);
  ASSERT_RUN_OK(run("norm batch x.npy -o y.npy --running-mean-out rm.npy --running-var-out rv.npy"));
  Tensor y(x.shape()), rm(Dims{4}), rv(Dims{4});
  for (Index c = 0; c < 4; ++c) rv[c] = 1.0f;
  Index nbt = 0;
  batch_norm_forward(y.view(), View{}, View{}, rm.view(), rv.view(), &nbt, x.cview(), ConstView{},
                     ConstView{});
  EXPECT_TRUE(same("y.npy", y));
  EXPECT_TRUE(same("rm.npy", rm));
  EXPECT_TRUE(same("rv.npy", rv));
}

TEST_F(NormFamilyCliTest, BatchOnnxAndCumulativeMomentumMatchLibrary) {
  std::mt19937_64 rng(23);
  const Tensor x = random_tensor({3, 2, 4}, rng, 1.5, -1.0);
  const Tensor rm = random_tensor({2}, rng, 1.0, 0.0), rv = positive_tensor({2}, rng);
  save("x.npy", x);
  save("rm.npy", rm);
  save("rv.npy", rv);
  auto expect = [&](const std::string& flags, BatchNormOptions opt, Index nbt) {
    SCOPED_TRACE(flags);
    ASSERT_RUN_OK(
        run("norm batch x.npy -o y.npy --running-mean rm.npy --running-var rv.npy --running-mean-out "
            "rm2.npy --running-var-out rv2.npy " +
            flags));
    Tensor y(x.shape()), rm2 = rm.clone(), rv2 = rv.clone();
    batch_norm_forward(y.view(), View{}, View{}, rm2.view(), rv2.view(), &nbt, x.cview(), ConstView{},
                       ConstView{}, {}, opt);
    EXPECT_TRUE(same("y.npy", y));
    EXPECT_TRUE(same("rm2.npy", rm2));
    EXPECT_TRUE(same("rv2.npy", rv2));
  };
  expect("--onnx", BatchNormOptions::onnx(), 0);
  BatchNormOptions onnx_m = BatchNormOptions::onnx();
  onnx_m.momentum = 0.5;
  expect("--onnx --momentum 0.5", onnx_m, 0);
  BatchNormOptions cumulative;
  cumulative.momentum = std::nullopt;
  expect("--momentum none --num-batches-tracked 3", cumulative, 3);
}

TEST_F(NormFamilyCliTest, BatchEvalUsesRunningStatsForwardAndBackward) {
  std::mt19937_64 rng(24);
  const Tensor x = random_tensor({2, 3, 4, 5}, rng, 2.0, 0.5),
               dy = random_tensor({2, 3, 4, 5}, rng, 1.0, 0.0);
  const Tensor w = random_tensor({3}, rng, 0.5, 1.0), b = random_tensor({3}, rng, 0.5, 0.0);
  const Tensor rm = random_tensor({3}, rng, 1.0, 0.0), rv = positive_tensor({3}, rng);
  save_all({{"x.npy", &x}, {"dy.npy", &dy}, {"w.npy", &w}, {"b.npy", &b}, {"rm.npy", &rm}, {"rv.npy", &rv}});
  ASSERT_RUN_OK(
      run("norm batch x.npy -o y.npy --eval --weight w.npy --bias b.npy --running-mean rm.npy "
          "--running-var rv.npy --stats-out st --dy dy.npy --dx-out dx.npy --dweight-out dw.npy "
          "--dbias-out db.npy"));
  BatchNormOptions opt;
  opt.training = false;
  Tensor y(x.shape()), sm(Dims{3}), sr(Dims{3}), rm2 = rm.clone(), rv2 = rv.clone();
  batch_norm_forward(y.view(), sm.view(), sr.view(), rm2.view(), rv2.view(), nullptr, x.cview(), w.cview(),
                     b.cview(), {}, opt);
  Tensor dx(x.shape()), dw(Dims{3}), db(Dims{3});
  batch_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), rm.cview(),
                      rv.cview(), {}, opt);
  EXPECT_TRUE(same("y.npy", y));
  EXPECT_TRUE(same("st.mean.npy", sm));
  EXPECT_TRUE(same("st.rstd.npy", sr));
  EXPECT_TRUE(same("dx.npy", dx));
  EXPECT_TRUE(same("dw.npy", dw));
  EXPECT_TRUE(same("db.npy", db));
  // Eval statistics are the running ones, not the batch's.
  Tensor ytrain(x.shape());
  batch_norm_forward(ytrain.view(), View{}, View{}, View{}, View{}, nullptr, x.cview(), w.cview(), b.cview());
  EXPECT_FALSE(bitwise_equal(y.cview(), ytrain.cview()));
}

TEST_F(NormFamilyCliTest, BatchMaskedWithLengthsMatchesLibrary) {
  std::mt19937_64 rng(25);
  const Tensor x = random_tensor({3, 2, 7}, rng, 1.0, 3.0), dy = random_tensor({3, 2, 7}, rng, 1.0, 0.0);
  save("x.npy", x);
  save("dy.npy", dy);
  const std::vector<Index> len = {7, 4, 2};
  save_lengths("len.npy", len);
  ASSERT_RUN_OK(
      run("norm batch x.npy -o y.npy --lengths len.npy --time-axis 2 --stats-out st --dy dy.npy "
          "--dx-out dx.npy --dweight-out dw.npy"));
  BatchNormOptions opt;
  opt.time_axis = 2;
  Tensor y(x.shape()), sm(Dims{2}), sr(Dims{2}), dx(x.shape()), dw(Dims{2});
  batch_norm_forward(y.view(), sm.view(), sr.view(), View{}, View{}, nullptr, x.cview(), ConstView{},
                     ConstView{}, len, opt);
  batch_norm_backward(dx.view(), dw.view(), View{}, dy.cview(), x.cview(), ConstView{}, ConstView{},
                      ConstView{}, len, opt);
  EXPECT_TRUE(same("y.npy", y));
  EXPECT_TRUE(same("st.mean.npy", sm));
  EXPECT_TRUE(same("st.rstd.npy", sr));
  EXPECT_TRUE(same("dx.npy", dx));
  EXPECT_TRUE(same("dw.npy", dw));
  EXPECT_EQ(load("y.npy").cview().at({2, 1, 5}), 0.0f);  // padding is written 0
}

// ---- instance ------------------------------------------------------------------------------------

TEST_F(NormFamilyCliTest, InstanceMaskedForwardStatsBackwardMatchLibrary) {
  std::mt19937_64 rng(31);
  const Tensor x = random_tensor({3, 4, 6}, rng, 2.0, -1.0), dy = random_tensor({3, 4, 6}, rng, 1.0, 0.0);
  const Tensor w = random_tensor({4}, rng, 0.5, 1.0), b = random_tensor({4}, rng, 0.5, 0.0);
  save_all({{"x.npy", &x}, {"dy.npy", &dy}, {"w.npy", &w}, {"b.npy", &b}});
  const std::vector<Index> len = {6, 3, 0};
  save_lengths("len.npy", len);
  ASSERT_RUN_OK(
      run("norm instance x.npy -o y.npy --eps 1e-3 --weight w.npy --bias b.npy --lengths len.npy "
          "--stats-out st --dy dy.npy --dx-out dx.npy --dweight-out dw.npy --dbias-out db.npy"));
  InstanceNormOptions opt;
  opt.eps = 1e-3;
  Tensor y(x.shape()), sm(Dims{3, 4}), sr(Dims{3, 4}), dx(x.shape()), dw(Dims{4}), db(Dims{4});
  instance_norm_forward(y.view(), sm.view(), sr.view(), x.cview(), w.cview(), b.cview(), len, opt);
  instance_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), len, opt);
  EXPECT_TRUE(same("y.npy", y));
  EXPECT_TRUE(same("st.mean.npy", sm));
  EXPECT_TRUE(same("st.rstd.npy", sr));
  EXPECT_TRUE(same("dx.npy", dx));
  EXPECT_TRUE(same("dw.npy", dw));
  EXPECT_TRUE(same("db.npy", db));
}

TEST_F(NormFamilyCliTest, InstanceNegativeChannelAxisMatchesLibrary) {
  std::mt19937_64 rng(32);
  const Tensor x = random_tensor({2, 5, 3}, rng, 1.0, 0.0);  // C = 5 on axis -2, 3 positions per (b, c)
  save("x.npy", x);
  ASSERT_RUN_OK(run("norm instance x.npy -o y.npy --channel-axis -2 --stats-out st"));
  InstanceNormOptions opt;
  opt.channel_axis = -2;
  Tensor y(x.shape()), sm(Dims{2, 5}), sr(Dims{2, 5});
  instance_norm_forward(y.view(), sm.view(), sr.view(), x.cview(), ConstView{}, ConstView{}, {}, opt);
  EXPECT_TRUE(same("y.npy", y));
  EXPECT_TRUE(same("st.mean.npy", sm));
  EXPECT_TRUE(same("st.rstd.npy", sr));
}

// ---- group ---------------------------------------------------------------------------------------

TEST_F(NormFamilyCliTest, GroupForwardStatsBackwardMatchLibrary) {
  std::mt19937_64 rng(41);
  const Tensor x = random_tensor({2, 6, 3, 4}, rng, 2.0, 5.0),
               dy = random_tensor({2, 6, 3, 4}, rng, 1.0, 0.0);
  const Tensor w = random_tensor({6}, rng, 0.5, 1.0), b = random_tensor({6}, rng, 0.5, 0.0);
  save_all({{"x.npy", &x}, {"dy.npy", &dy}, {"w.npy", &w}, {"b.npy", &b}});
  ASSERT_RUN_OK(
      run("norm group x.npy -o y.npy --groups 3 --eps 1e-4 --weight w.npy --bias b.npy --stats-out st "
          "--dy dy.npy --dx-out dx.npy --dweight-out dw.npy --dbias-out db.npy"));
  GroupNormOptions opt;
  opt.eps = 1e-4;
  Tensor y(x.shape()), sm(Dims{2, 3}), sr(Dims{2, 3}), dx(x.shape()), dw(Dims{6}), db(Dims{6});
  group_norm_forward(y.view(), sm.view(), sr.view(), x.cview(), w.cview(), b.cview(), 3, opt);
  group_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), 3, opt);
  EXPECT_TRUE(same("y.npy", y));
  EXPECT_TRUE(same("st.mean.npy", sm));
  EXPECT_TRUE(same("st.rstd.npy", sr));
  EXPECT_TRUE(same("dx.npy", dx));
  EXPECT_TRUE(same("dw.npy", dw));
  EXPECT_TRUE(same("db.npy", db));
}

TEST_F(NormFamilyCliTest, GroupChannelAxisMatchesLibrary) {
  std::mt19937_64 rng(42);
  const Tensor x = random_tensor({3, 5, 4}, rng, 1.0, 0.0);  // C = 4 on axis 2, no positions after it
  save("x.npy", x);
  ASSERT_RUN_OK(run("norm group x.npy -o y.npy --groups 2 --channel-axis 2 --stats-out st"));
  GroupNormOptions opt;
  opt.channel_axis = 2;
  Tensor y(x.shape()), sm(Dims{3, 5, 2}), sr(Dims{3, 5, 2});
  group_norm_forward(y.view(), sm.view(), sr.view(), x.cview(), ConstView{}, ConstView{}, 2, opt);
  EXPECT_TRUE(same("y.npy", y));
  EXPECT_TRUE(same("st.mean.npy", sm));
  EXPECT_TRUE(same("st.rstd.npy", sr));
}

// ---- cmvn ----------------------------------------------------------------------------------------

CmvnStats stats_of(std::initializer_list<const Tensor*> feats, int time_axis = 0) {
  CmvnStats s;
  for (const Tensor* f : feats) s.add(f->cview(), time_axis);
  return s;
}

TEST_F(NormFamilyCliTest, CmvnGlobalWithKaldiAndWenetStatsForwardAndBackward) {
  std::mt19937_64 rng(51);
  const Tensor a = random_tensor({40, 5}, rng, 2.0, 3.0), x = random_tensor({30, 5}, rng, 2.0, 4.0);
  const Tensor dy = random_tensor({30, 5}, rng, 1.0, 0.0);
  const CmvnStats st = stats_of({&a});
  st.save_kaldi_npy(path("st.npy"));
  st.save_wenet_json(path("st.json"));
  save("x.npy", x);
  save("dy.npy", dy);
  for (const char* file : {"st.npy", "st.json"}) {
    SCOPED_TRACE(file);
    ASSERT_RUN_OK(run(std::string("norm cmvn x.npy -o y.npy --mode global --norm-vars --stats ") + file +
                      " --dy dy.npy --dx-out dx.npy"));
    const CmvnOptions opt{true, true, 0};
    Tensor y(x.shape()), dx(x.shape());
    apply_cmvn(y.view(), x.cview(), st, opt);
    apply_cmvn_backward(dx.view(), dy.cview(), st, opt);
    EXPECT_TRUE(same("y.npy", y));
    EXPECT_TRUE(same("dx.npy", dx));
  }
  // Means only (Kaldi's default), features [D, T].
  const Tensor xt = random_tensor({5, 30}, rng, 2.0, 4.0);
  save("xt.npy", xt);
  ASSERT_RUN_OK(run("norm cmvn xt.npy -o yt.npy --mode global --stats st.npy --time-axis 1"));
  Tensor yt(xt.shape());
  apply_cmvn(yt.view(), xt.cview(), st, CmvnOptions{true, false, 1});
  EXPECT_TRUE(same("yt.npy", yt));
}

TEST_F(NormFamilyCliTest, CmvnUtteranceForwardAndBackward) {
  std::mt19937_64 rng(52);
  const Tensor x = random_tensor({25, 4}, rng, 2.0, 100.0), dy = random_tensor({25, 4}, rng, 1.0, 0.0);
  save("x.npy", x);
  save("dy.npy", dy);
  for (const bool norm_vars : {false, true}) {
    SCOPED_TRACE(norm_vars);
    ASSERT_RUN_OK(run(std::string("norm cmvn x.npy -o y.npy --mode utterance --dy dy.npy --dx-out dx.npy") +
                      (norm_vars ? " --norm-vars" : "")));
    const CmvnOptions opt{true, norm_vars, 0};
    Tensor y(x.shape()), dx(x.shape());
    apply_cmvn_per_utterance(y.view(), x.cview(), opt);
    apply_cmvn_per_utterance_backward(dx.view(), dy.cview(), x.cview(), opt);
    EXPECT_TRUE(same("y.npy", y));
    EXPECT_TRUE(same("dx.npy", dx));
  }
  ASSERT_RUN_OK(run("norm cmvn x.npy -o y.npy --mode utterance --no-norm-means"));
  EXPECT_TRUE(same("y.npy", x));  // Kaldi: no mean, no variance normalization = identity
}

TEST_F(NormFamilyCliTest, CmvnUtteranceMaskedBatchForwardAndBackward) {
  std::mt19937_64 rng(53);
  const Tensor x = random_tensor({3, 12, 4}, rng, 2.0, 1.0), dy = random_tensor({3, 12, 4}, rng, 1.0, 0.0);
  save("x.npy", x);
  save("dy.npy", dy);
  const std::vector<Index> len = {12, 7, 0};
  save_lengths("len.npy", len);
  ASSERT_RUN_OK(
      run("norm cmvn x.npy -o y.npy --mode utterance --norm-vars --lengths len.npy --dy dy.npy "
          "--dx-out dx.npy"));
  const CmvnOptions opt{true, true, 0};
  Tensor y(x.shape()), dx(x.shape());
  apply_cmvn_masked(y.view(), x.cview(), len, opt);
  apply_cmvn_masked_backward(dx.view(), dy.cview(), x.cview(), len, opt);
  EXPECT_TRUE(same("y.npy", y));
  EXPECT_TRUE(same("dx.npy", dx));
  // A batch without --lengths: every sequence is whole.
  ASSERT_RUN_OK(run("norm cmvn x.npy -o y_full.npy --mode utterance"));
  Tensor yf(x.shape());
  apply_cmvn_masked(yf.view(), x.cview(), std::vector<Index>{12, 12, 12}, CmvnOptions{});
  EXPECT_TRUE(same("y_full.npy", yf));
}

TEST_F(NormFamilyCliTest, CmvnSlidingMatchesLibrary) {
  std::mt19937_64 rng(54);
  const Tensor x = random_tensor({80, 3}, rng, 2.0, 1.0);
  save("x.npy", x);
  auto expect = [&](const std::string& flags, SlidingCmvnOptions opt) {
    SCOPED_TRACE(flags);
    ASSERT_RUN_OK(run("norm cmvn x.npy -o y.npy --mode sliding " + flags));
    Tensor y(x.shape());
    sliding_cmvn(y.view(), x.cview(), opt);
    EXPECT_TRUE(same("y.npy", y));
  };
  expect("", SlidingCmvnOptions{});
  expect("--window 20 --min-window 5 --norm-vars", SlidingCmvnOptions{20, 5, false, true, 0});
  expect("--window 15 --center", SlidingCmvnOptions{15, 100, true, false, 0});
  // Masked batch, [B, D, T].
  const Tensor xb = random_tensor({2, 3, 30}, rng, 1.0, 0.0);
  save("xb.npy", xb);
  const std::vector<Index> len = {30, 17};
  save_lengths("len.npy", len);
  ASSERT_RUN_OK(run("norm cmvn xb.npy -o yb.npy --mode sliding --window 10 --time-axis 1 --lengths len.npy"));
  Tensor yb(xb.shape());
  sliding_cmvn_masked(yb.view(), xb.cview(), len, SlidingCmvnOptions{10, 100, false, false, 1});
  EXPECT_TRUE(same("yb.npy", yb));
}

TEST_F(NormFamilyCliTest, CmvnOnlineIsStreamingCmvnFrameByFrame) {
  std::mt19937_64 rng(55);
  const Tensor x = random_tensor({40, 3}, rng, 2.0, 1.0);
  save("x.npy", x);
  ASSERT_RUN_OK(run("norm cmvn x.npy -o y.npy --mode online --window 8 --norm-vars"));
  const SlidingCmvnOptions opt{8, 0, false, true, 0};
  Tensor want(x.shape());
  StreamingCmvn stream(3, opt);
  for (Index t = 0; t < 40; ++t) stream.accept(want.view().slice(0, t, t + 1), x.cview().slice(0, t, t + 1));
  EXPECT_TRUE(same("y.npy", want));
  // The causal window: the same as sliding with no look-ahead, but not Kaldi's default min-window 100.
  ASSERT_RUN_OK(
      run("norm cmvn x.npy -o y_sliding0.npy --mode sliding --window 8 --min-window 0 --norm-vars"));
  ASSERT_RUN_OK(run("norm cmvn x.npy -o y_sliding.npy --mode sliding --window 8 --norm-vars"));
  EXPECT_TRUE(same("y_sliding0.npy", want));
  EXPECT_FALSE(bitwise_equal(load("y_sliding.npy").cview(), want.cview()));

  // A padded batch: one stream per sequence, padding written 0.
  const Tensor xb = random_tensor({2, 10, 3}, rng, 1.0, 0.0);
  save("xb.npy", xb);
  const std::vector<Index> len = {10, 6};
  save_lengths("len.npy", len);
  ASSERT_RUN_OK(run("norm cmvn xb.npy -o yb.npy --mode online --window 4 --lengths len.npy"));
  Tensor wb(xb.shape());
  for (Index b = 0; b < 2; ++b) {
    StreamingCmvn s(3, SlidingCmvnOptions{4, 0, false, false, 0});
    const View yv = wb.view().select(0, b);
    const ConstView xv = xb.cview().select(0, b);
    for (Index t = 0; t < len[static_cast<std::size_t>(b)]; ++t)
      s.accept(yv.slice(0, t, t + 1), xv.slice(0, t, t + 1));
  }
  EXPECT_TRUE(same("yb.npy", wb));
}

// ---- cmvn-stats ----------------------------------------------------------------------------------

TEST_F(NormFamilyCliTest, CmvnStatsRoundTripKaldiAndJson) {
  std::mt19937_64 rng(61);
  const Tensor a = random_tensor({20, 6}, rng, 2.0, 3.0), b = random_tensor({13, 6}, rng, 1.0, -2.0),
               c = random_tensor({7, 6}, rng, 5.0, 0.0);
  save("a.npy", a);
  save("b.npy", b);
  save("c.npy", c);
  std::ofstream(path("list.txt")) << "# features\nb.npy\n\n  c.npy  \n";
  const RunResult r = run("cmvn-stats a.npy --list list.txt -o stats.npy --json stats.json");
  ASSERT_RUN_OK(r);
  const CmvnStats want = stats_of({&a, &b, &c});
  const BasicTensor<double> km = want.to_kaldi_matrix(), got = load_npy_f64(path("stats.npy"));
  ASSERT_EQ(got.shape(), (Dims{2, 7}));
  EXPECT_EQ(std::memcmp(got.data(), km.data(), sizeof(double) * 14), 0);
  const CmvnStats js = CmvnStats::load_wenet_json(path("stats.json"));
  EXPECT_EQ(js.count(), 40.0);
  ASSERT_EQ(js.dim(), 6);
  for (std::size_t d = 0; d < 6; ++d) {
    EXPECT_EQ(js.sum()[d], want.sum()[d]) << d;
    EXPECT_EQ(js.sum_sq()[d], want.sum_sq()[d]) << d;
  }
  EXPECT_TRUE(contains(r.out, "3 files")) << r.out;

  // The stats file drives `norm cmvn --mode global` like the in-process stats do.
  ASSERT_RUN_OK(run("norm cmvn a.npy -o y.npy --mode global --stats stats.npy --norm-vars"));
  Tensor y(a.shape());
  apply_cmvn(y.view(), a.cview(), want, CmvnOptions{true, true, 0});
  EXPECT_TRUE(same("y.npy", y));
}

TEST_F(NormFamilyCliTest, CmvnStatsTimeAxisOne) {
  std::mt19937_64 rng(62);
  const Tensor a = random_tensor({4, 9}, rng, 1.0, 1.0);  // [D, T]
  save("a.npy", a);
  ASSERT_RUN_OK(run("cmvn-stats a.npy --time-axis 1 --json only.json"));
  EXPECT_FALSE(exists("stats.npy"));
  const CmvnStats want = stats_of({&a}, 1), got = CmvnStats::load_wenet_json(path("only.json"));
  EXPECT_EQ(got.count(), 9.0);
  ASSERT_EQ(got.dim(), 4);
  for (std::size_t d = 0; d < 4; ++d) EXPECT_EQ(got.sum()[d], want.sum()[d]) << d;
}

// ---- --help --------------------------------------------------------------------------------------

TEST_F(NormFamilyCliTest, HelpListsTheNewCommandsAndFlags) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--help", "cmvn-stats"},
      {"norm --help", "group"},
      {"norm rms --help", "torch"},
      {"norm batch --help", "--momentum"},
      {"norm batch --help", "--running-var-out"},
      {"norm instance --help", "--lengths"},
      {"norm group --help", "--groups"},
      {"norm cmvn --help", "CAUSAL window"},
      {"norm cmvn --help", "--no-norm-means"},
      {"cmvn-stats --help", "--list"},
  };
  for (const auto& [args, needle] : cases) {
    const RunResult r = run(args);
    EXPECT_EQ(r.rc, 0) << args << "\n" << describe(r);
    EXPECT_TRUE(contains(r.out, needle)) << args << " lacks " << needle << "\n" << r.out;
  }
}

// ---- errors --------------------------------------------------------------------------------------

struct ErrorCase {
  const char* name;
  const char* args;
  const char* needle;
};

void PrintTo(const ErrorCase& c, std::ostream* os) {
  *os << c.name;
}

class NormFamilyCliErrorTest : public NormFamilyCliTest, public ::testing::WithParamInterface<ErrorCase> {
 protected:
  void SetUp() override {
    NormFamilyCliTest::SetUp();
    std::mt19937_64 rng(99);
    save("x.npy", random_tensor({2, 4, 6}, rng, 1.0, 0.0));  // [N, C, T]
    save("dy.npy", random_tensor({2, 4, 6}, rng, 1.0, 0.0));
    save("w4.npy", Tensor({4}, {1, 1, 1, 1}));
    save("w5.npy", Tensor({5}, {1, 1, 1, 1, 1}));
    save("rv4.npy", Tensor({4}, {1, 1, 1, 1}));
    save_lengths("len_ok.npy", {6, 3});
    save_lengths("len_long.npy", {6, 7});
    save_lengths("len_neg.npy", {-1, 3});
    save_lengths("len_three.npy", {6, 3, 1});
    const Tensor f4 = random_tensor({10, 4}, rng, 1.0, 0.0), f3 = random_tensor({10, 3}, rng, 1.0, 0.0);
    save("f4.npy", f4);
    save("f3.npy", f3);
    stats_of({&f3}).save_kaldi_npy(path("s3.npy"));
  }
};

TEST_P(NormFamilyCliErrorTest, ExitsOneWithMessageAndWritesNothing) {
  const ErrorCase& c = GetParam();
  const RunResult r = run(c.args);
  EXPECT_EQ(r.rc, 1) << describe(r);
  EXPECT_EQ(r.err.rfind("normlab: error: ", 0), 0u) << describe(r);
  EXPECT_TRUE(contains(r.err, c.needle)) << "stderr lacks \"" << c.needle << "\"\n" << describe(r);
  for (const char* out : {"y.npy", "dx.npy", "dw.npy", "db.npy", "st.mean.npy", "st.rstd.npy", "rm.npy",
                          "rv.npy", "stats.npy", "stats.json"})
    EXPECT_FALSE(exists(out)) << out << " was written despite the error";
}

INSTANTIATE_TEST_SUITE_P(
    Cli, NormFamilyCliErrorTest,
    ::testing::Values(
        ErrorCase{"RmsHasNoBias", "norm rms x.npy -o y.npy --axes 2 --bias w4.npy", "--bias"},
        ErrorCase{"RmsWeightShape", "norm rms x.npy -o y.npy --axes 1 --weight w5.npy --stats-out st",
                  "--weight has shape [5], but the input's shape at the normalized axes is [4]"},
        ErrorCase{"EpsTorchOnBatch", "norm batch x.npy -o y.npy --eps torch",
                  "accepted only by `normlab norm rms`"},
        ErrorCase{"EpsTorchOnLayer", "norm layer x.npy -o y.npy --axes 1 --eps torch",
                  "accepted only by `normlab norm rms`"},
        ErrorCase{"ChannelAxisOutOfRange", "norm batch x.npy -o y.npy --channel-axis 3 --stats-out st",
                  "--channel-axis: axis 3 is out of range for an input of shape [2, 4, 6]"},
        ErrorCase{"InstanceChannelAxisOutOfRange", "norm instance x.npy -o y.npy --channel-axis=-4",
                  "--channel-axis: axis -4 is out of range"},
        ErrorCase{"GroupsDoNotDivide", "norm group x.npy -o y.npy --groups 3",
                  "--groups 3 does not divide the 4 channels"},
        ErrorCase{"GroupsZero", "norm group x.npy -o y.npy --groups 0", "--groups must be at least 1"},
        ErrorCase{"GroupsMissing", "norm group x.npy -o y.npy", "--groups is required"},
        ErrorCase{
            "GroupWeightWidth", "norm group x.npy -o y.npy --groups 2 --weight w5.npy",
            "--weight has shape [5], but the channel count (axis 1 of the input of shape [2, 4, 6]) is [4]"},
        ErrorCase{"LengthsLongerThanAxis", "norm batch x.npy -o y.npy --lengths len_long.npy",
                  "--lengths: length 7 of item 1 is longer than the time axis"},
        ErrorCase{"NegativeLengths", "norm instance x.npy -o y.npy --lengths len_neg.npy",
                  "--lengths: length -1 of item 0 is negative"},
        ErrorCase{"LengthsWrongCount", "norm batch x.npy -o y.npy --lengths len_three.npy",
                  "--lengths has 3 entries, but there are 2 batch items"},
        ErrorCase{"TimeAxisBeforeChannel", "norm instance x.npy -o y.npy --lengths len_ok.npy --time-axis 0",
                  "--time-axis 0 must come after --channel-axis 1"},
        ErrorCase{"EvalWithoutRunningStats", "norm batch x.npy -o y.npy --eval",
                  "--eval needs --running-mean RM.npy and --running-var RV.npy"},
        ErrorCase{"EvalWithRunningOut",
                  "norm batch x.npy -o y.npy --eval --running-mean w4.npy --running-var rv4.npy "
                  "--running-mean-out rm.npy",
                  "--eval does not update the running statistics"},
        ErrorCase{"TrainAndEval", "norm batch x.npy -o y.npy --train --eval", "excludes"},
        ErrorCase{"RunningMeanAlone", "norm batch x.npy -o y.npy --running-mean w4.npy",
                  "--running-mean and --running-var go together"},
        ErrorCase{
            "RunningStatsWrongWidth",
            "norm batch x.npy -o y.npy --running-mean w5.npy --running-var w5.npy --running-var-out rv.npy",
            "--running-mean has shape [5], but the channel count"},
        ErrorCase{"BadMomentum", "norm batch x.npy -o y.npy --momentum fast", "--momentum must be a number"},
        ErrorCase{"MomentumAboveOne", "norm batch x.npy -o y.npy --momentum 1.5",
                  "--momentum must be in [0, 1]"},
        ErrorCase{"BatchDyShape", "norm batch x.npy -o y.npy --dy w4.npy --dx-out dx.npy",
                  "--dy has shape [4]"},
        ErrorCase{"UnknownMode", "norm cmvn f4.npy -o y.npy --mode fancy", "--mode: fancy not in"},
        ErrorCase{"ModeMissing", "norm cmvn f4.npy -o y.npy", "--mode is required"},
        ErrorCase{"CmvnStatsWrongWidth", "norm cmvn f4.npy -o y.npy --mode global --stats s3.npy",
                  "--stats has the wrong width: 3 dims, but the features have 4"},
        ErrorCase{"CmvnGlobalWithoutStats", "norm cmvn f4.npy -o y.npy --mode global",
                  "--mode global needs --stats"},
        ErrorCase{"CmvnStatsWithUtterance", "norm cmvn f4.npy -o y.npy --mode utterance --stats s3.npy",
                  "--stats is used only by --mode global"},
        ErrorCase{"CmvnMissingStatsFile", "norm cmvn f4.npy -o y.npy --mode global --stats nope.json",
                  "--stats: cannot open nope.json"},
        ErrorCase{"CmvnSlidingBackward",
                  "norm cmvn f4.npy -o y.npy --mode sliding --dy f4.npy --dx-out dx.npy",
                  "--mode sliding has no backward pass"},
        ErrorCase{"CmvnOnlineLookAhead", "norm cmvn f4.npy -o y.npy --mode online --min-window 100",
                  "--mode online is causal"},
        ErrorCase{"CmvnOnlineCenter", "norm cmvn f4.npy -o y.npy --mode online --center",
                  "--mode online is causal"},
        ErrorCase{"CmvnWindowWithGlobal", "norm cmvn f4.npy -o y.npy --mode utterance --window 10",
                  "--window applies only to --mode sliding and online"},
        ErrorCase{"CmvnNoNormMeansSliding", "norm cmvn f4.npy -o y.npy --mode sliding --no-norm-means",
                  "--no-norm-means applies only to --mode global and utterance"},
        ErrorCase{"CmvnVarsWithoutMeans",
                  "norm cmvn f4.npy -o y.npy --mode utterance --no-norm-means --norm-vars",
                  "--norm-vars needs --norm-means"},
        ErrorCase{"CmvnLengthsLonger", "norm cmvn x.npy -o y.npy --mode utterance --lengths len_ok.npy",
                  "--lengths: length 6 of item 0 is longer than the time axis"},
        ErrorCase{"CmvnLengthsNegative", "norm cmvn x.npy -o y.npy --mode sliding --lengths len_neg.npy",
                  "--lengths: length -1 of item 0 is negative"},
        ErrorCase{"CmvnLengthsOn2D", "norm cmvn f4.npy -o y.npy --mode utterance --lengths len_ok.npy",
                  "with --lengths takes a batch [B, T, D], but the input has shape [10, 4]"},
        ErrorCase{"CmvnBadTimeAxis", "norm cmvn f4.npy -o y.npy --mode utterance --time-axis 2",
                  "--time-axis must be 0"},
        ErrorCase{"CmvnStatsWidthMismatch", "cmvn-stats f4.npy f3.npy -o stats.npy --json stats.json",
                  "f3.npy: stats of the wrong width: the file has 3 dims, the files before it have 4"},
        ErrorCase{"CmvnStatsNot2D", "cmvn-stats f4.npy x.npy -o stats.npy",
                  "x.npy: a feature file must be 2-D"},
        ErrorCase{"CmvnStatsNoFiles", "cmvn-stats -o stats.npy", "no feature files"},
        ErrorCase{"CmvnStatsNoOutput", "cmvn-stats f4.npy", "say where to write the statistics"},
        ErrorCase{"CmvnStatsMissingList", "cmvn-stats --list nope.txt -o stats.npy",
                  "--list: cannot open nope.txt"},
        ErrorCase{"CmvnStatsMissingFile", "cmvn-stats f4.npy missing.npy -o stats.npy", "missing.npy"}),
    [](const ::testing::TestParamInfo<ErrorCase>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace normlab
