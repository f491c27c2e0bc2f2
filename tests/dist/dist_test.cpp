// normlab_dist: the deterministic communicator, SyncBatchNorm against BatchNorm on the whole batch, and
// data-parallel gradient averaging against the single-process gradient. Every rank builds the same whole
// batch (same seed) and takes its own share of the batch items, so each rank can compare its results with
// the single-process ones.
#include <gtest/gtest.h>
#include <normlab/dist.h>
#include <normlab/error.h>
#include <normlab/norm.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dist/train_hooks.h"
#include "nn/train.h"
#include "support/random.h"
#include "support/tolerance.h"

namespace normlab {
namespace {

using dist::Comm;
using testing::all_close;
using testing::bitwise_equal;
using testing::max_abs;
using testing::Tol;

// Batch items [lo, hi) of rank r when B items are split over `size` ranks as evenly as possible.
std::pair<Index, Index> share(Index B, int r, int size) {
  const Index lo = B * r / size, hi = B * (r + 1) / size;
  return {lo, hi};
}

TEST(DistComm, AllreduceSumsInRankOrderWithTheSameBitsEverywhere) {
  const Comm comm = Comm::world();
  // Values whose sum depends on the order: 1e16 + 1 + 1 + ... in rank order.
  std::vector<double> v{comm.rank() == 0 ? 1e16 : 1.0, 0.1 * (comm.rank() + 1)};
  comm.allreduce_sum(v);
  double e0 = 1e16, e1 = 0.1;
  for (int r = 1; r < comm.size(); ++r) {
    e0 += 1.0;
    e1 += 0.1 * (r + 1);
  }
  EXPECT_EQ(v[0], e0);
  EXPECT_EQ(v[1], e1);
  EXPECT_NO_THROW(comm.check_same(v, "the sums"));
  const std::vector<double> all = comm.allgather(std::vector<double>{static_cast<double>(comm.rank())});
  ASSERT_EQ(all.size(), static_cast<std::size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) EXPECT_EQ(all[static_cast<std::size_t>(r)], r);
}

// allreduce_sum and weighted_sum (each rank sums a slice) give the bits of sums of allgather's values in rank
// order, at lengths that leave some ranks no slice (0, 1, 2) and at odd lengths.
TEST(DistComm, SlicedSumsHaveTheBitsOfGatheredSums) {
  const Comm comm = Comm::world();
  const auto P = static_cast<std::size_t>(comm.size());
  std::vector<double> w(P);
  for (std::size_t r = 0; r < P; ++r) w[r] = 0.5 + 0.25 * static_cast<double>(r);  // exact
  for (std::size_t n : {0, 1, 2, 7, 33, 1025}) {
    std::mt19937_64 rng(1000 * n + static_cast<std::size_t>(comm.rank()));
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    std::vector<double> v(n);
    for (double& x : v) x = u(rng) * std::ldexp(1.0, static_cast<int>(rng() % 40) - 20);  // sums round
    const std::vector<double> all = comm.allgather(v);
    std::vector<double> sum = v, wsum = v;
    comm.allreduce_sum(sum);
    comm.weighted_sum(wsum, w);
    for (std::size_t i = 0; i < n; ++i) {
      double s = all[i], t = 0;
      for (std::size_t r = 1; r < P; ++r) s += all[r * n + i];
      for (std::size_t r = 0; r < P; ++r) t += w[r] * all[r * n + i];
      ASSERT_EQ(std::bit_cast<std::uint64_t>(sum[i]), std::bit_cast<std::uint64_t>(s))
          << "n " << n << " i " << i;
      ASSERT_EQ(std::bit_cast<std::uint64_t>(wsum[i]), std::bit_cast<std::uint64_t>(t))
          << "n " << n << " i " << i;
    }
  }
  // A wrong number of weights, on one rank only, stops every rank.
  std::vector<double> v(5, 1.0);
  std::vector<double> bad(comm.rank() == 0 ? P + 1 : P, 1.0);
  EXPECT_THROW(comm.weighted_sum(v, bad), Error);
}

TEST(DistComm, ALocalErrorStopsEveryRank) {
  const Comm comm = Comm::world();
  const bool last = comm.rank() == comm.size() - 1;
  try {
    comm.agree(last ? "bad input on the last rank" : "");
    ADD_FAILURE() << "agree returned on rank " << comm.rank();
  } catch (const Error& e) {
    if (last)
      EXPECT_STREQ(e.what(), "bad input on the last rank");
    else
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(comm.size() - 1)), std::string::npos)
          << e.what();
  }
  // Lengths that differ between ranks are refused everywhere instead of corrupting memory.
  if (comm.size() > 1) {
    std::vector<double> v(static_cast<std::size_t>(1 + comm.rank()), 1.0);
    EXPECT_THROW(comm.allreduce_sum(v), Error);
  }
}

struct BnCase {
  Dims shape;                  // whole batch [B, C, T]
  std::vector<Index> lengths;  // empty: unmasked
  bool permuted;               // x stored [B, T, C] and seen as [B, C, T]
  bool channels_last = false;  // x and dy [B, T, C] with the channel axis last (channel rows)
};

class SyncBatchNorm : public ::testing::TestWithParam<BnCase> {};

TEST_P(SyncBatchNorm, EqualsBatchNormOnTheWholeBatch) {
  const Comm comm = Comm::world();
  const BnCase& cs = GetParam();
  const Index B = cs.shape[0], C = cs.shape[1], T = cs.shape[2];
  if (B < comm.size()) GTEST_SKIP() << "needs at least one batch item per rank";
  std::mt19937_64 rng(21);
  const Dims stored = cs.permuted || cs.channels_last ? Dims{B, T, C} : Dims{B, C, T};
  const Tensor xs = testing::random_tensor(stored, rng, 2.0, 3.0);
  const ConstView x = cs.permuted ? xs.cview().permute({0, 2, 1}) : xs.cview();
  const Tensor dy = testing::random_tensor(cs.channels_last ? stored : Dims{B, C, T}, rng, 1.0, 0.0);
  const Tensor w = testing::random_tensor(Dims{C}, rng, 0.5, 1.0),
               b = testing::random_tensor(Dims{C}, rng, 1.0, 0.0);
  BatchNormOptions opt;
  opt.time_axis = 2;
  if (cs.channels_last) opt.channel_axis = 2;

  // The whole batch on one process.
  Tensor y(x.shape()), mean({C}), rstd({C}), rm({C}), rv({C}), dx(x.shape()), dw({C}), db({C});
  for (Index c = 0; c < C; ++c) rv[c] = 1.0f;
  batch_norm_forward(y.view(), mean.view(), rstd.view(), rm.view(), rv.view(), nullptr, x, w.cview(),
                     b.cview(), cs.lengths, opt);
  batch_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x, w.cview(), {}, {}, cs.lengths, opt);

  // This rank's share.
  const auto [lo, hi] = share(B, comm.rank(), comm.size());
  const ConstView xl = x.slice(0, lo, hi), dyl = dy.cview().slice(0, lo, hi);
  const std::vector<Index> len_l = cs.lengths.empty()
                                       ? std::vector<Index>{}
                                       : std::vector<Index>(cs.lengths.begin() + lo, cs.lengths.begin() + hi);
  Tensor yl(xl.shape()), mean_l({C}), rstd_l({C}), rm_l({C}), rv_l({C}), dxl(xl.shape()), dwl({C}), dbl({C});
  for (Index c = 0; c < C; ++c) rv_l[c] = 1.0f;
  dist::sync_batch_norm_forward(comm, yl.view(), mean_l.view(), rstd_l.view(), rm_l.view(), rv_l.view(),
                                nullptr, xl, w.cview(), b.cview(), len_l, opt);
  dist::sync_batch_norm_backward(comm, dxl.view(), dwl.view(), dbl.view(), dyl, xl, w.cview(), {}, {}, len_l,
                                 opt);
  // dweight, dbias are per rank (PyTorch's SyncBatchNorm): their sum over ranks is the whole batch's.
  std::vector<double> dsum(static_cast<std::size_t>(2 * C));
  for (Index c = 0; c < C; ++c) {
    dsum[static_cast<std::size_t>(c)] = dwl[c];
    dsum[static_cast<std::size_t>(C + c)] = dbl[c];
  }
  comm.allreduce_sum(dsum);
  Tensor dw_all({C}), db_all({C});
  for (Index c = 0; c < C; ++c) {
    dw_all[c] = static_cast<float>(dsum[static_cast<std::size_t>(c)]);
    db_all[c] = static_cast<float>(dsum[static_cast<std::size_t>(C + c)]);
  }

  if (comm.size() == 1) {  // one rank: BatchNorm's bits
    EXPECT_TRUE(bitwise_equal(yl.cview(), y.cview(), "y"));
    EXPECT_TRUE(bitwise_equal(mean_l.cview(), mean.cview(), "save_mean"));
    EXPECT_TRUE(bitwise_equal(rstd_l.cview(), rstd.cview(), "save_rstd"));
    EXPECT_TRUE(bitwise_equal(rm_l.cview(), rm.cview(), "running_mean"));
    EXPECT_TRUE(bitwise_equal(rv_l.cview(), rv.cview(), "running_var"));
    EXPECT_TRUE(bitwise_equal(dxl.cview(), dx.cview(), "dx"));
    EXPECT_TRUE(bitwise_equal(dwl.cview(), dw.cview(), "dweight"));
    EXPECT_TRUE(bitwise_equal(dbl.cview(), db.cview(), "dbias"));
    return;
  }
  // Several ranks: the same statistics merged in another order (double), so fp32 outputs within a few ulps.
  const Tensor y_share = Tensor::copy_of(y.cview().slice(0, lo, hi));
  const Tensor dx_share = Tensor::copy_of(dx.cview().slice(0, lo, hi));
  EXPECT_TRUE(all_close(yl.cview(), y_share, Tol{4, max_abs(y)}, "y"));
  EXPECT_TRUE(all_close(mean_l.cview(), mean, Tol{4, max_abs(mean)}, "save_mean"));
  EXPECT_TRUE(all_close(rstd_l.cview(), rstd, Tol{4, max_abs(rstd)}, "save_rstd"));
  EXPECT_TRUE(all_close(rm_l.cview(), rm, Tol{4, max_abs(rm)}, "running_mean"));
  EXPECT_TRUE(all_close(rv_l.cview(), rv, Tol{4, max_abs(rv)}, "running_var"));
  EXPECT_TRUE(all_close(dxl.cview(), dx_share, Tol{16, max_abs(dx)}, "dx"));
  EXPECT_TRUE(all_close(dw_all.cview(), dw, Tol{16, max_abs(dw)}, "dweight summed over ranks"));
  EXPECT_TRUE(all_close(db_all.cview(), db, Tol{16, max_abs(db)}, "dbias summed over ranks"));
}

INSTANTIATE_TEST_SUITE_P(Cases, SyncBatchNorm,
                         ::testing::Values(BnCase{Dims{7, 5, 13}, {}, false},  //
                                           BnCase{Dims{6, 3, 33}, {}, true},   // strided channels
                                           BnCase{Dims{7, 4, 9}, {9, 0, 5, 9, 1, 7, 2}, false},  // padding
                                           BnCase{Dims{3, 2, 1025}, {}, false},
                                           BnCase{Dims{5, 37, 11}, {}, false, true}));  // channels last

TEST(SyncBatchNormErrors, ABadWeightOnOneRankStopsEveryRank) {
  const Comm comm = Comm::world();
  std::mt19937_64 rng(3);
  const Tensor x = testing::random_tensor(Dims{2, 4, 5}, rng, 1.0, 0.0);
  Tensor y(x.shape());
  const bool last = comm.rank() == comm.size() - 1;
  const Tensor w(Dims{last ? Index{3} : Index{4}});  // wrong shape on the last rank only
  EXPECT_THROW(
      dist::sync_batch_norm_forward(comm, y.view(), {}, {}, {}, {}, nullptr, x.cview(), w.cview(), {}),
      Error);
  // Channel counts that differ between ranks.
  if (comm.size() > 1) {
    const Tensor xc =
        testing::random_tensor(Dims{2, comm.rank() == 0 ? Index{4} : Index{5}, 5}, rng, 1.0, 0.0);
    Tensor yc(xc.shape());
    EXPECT_THROW(dist::sync_batch_norm_forward(comm, yc.view(), {}, {}, {}, {}, nullptr, xc.cview(), {}, {}),
                 Error);
  }
}

TEST(DataParallel, AveragedGradientsEqualTheWholeBatchGradient) {
  const Comm comm = Comm::world();
  nn::ModelConfig cfg;
  cfg.layers = 2;
  cfg.d_model = 16;
  cfg.heads = 2;
  cfg.ffn = 32;
  cfg.vocab = 32;
  cfg.max_seq = 8;
  cfg.seed = 5;
  const Index B = 6, T = 8;
  std::mt19937_64 rng(9);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(B * T)), targets(tokens.size());
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng() % 32);
  for (std::size_t i = 0; i < tokens.size(); ++i) targets[i] = (i % T == T - 1) ? -1 : tokens[i + 1];

  nn::Model whole(cfg);
  whole.forward(tokens.data(), targets.data(), B, T);
  whole.backward();

  nn::Model model(cfg);
  std::vector<nn::ParamRef> params = model.params();
  dist::broadcast_params(comm, params);  // identical already (same seed); DDP's start
  const auto [lo, hi] = share(B, comm.rank(), comm.size());
  const Index n = hi - lo;
  model.forward(tokens.data() + lo * T, targets.data() + lo * T, n, T);
  model.backward();
  dist::average_gradients(comm, params, static_cast<double>(n * (T - 1)));  // predicted tokens in this share

  const std::vector<nn::ParamRef> ref = whole.params();
  ASSERT_EQ(ref.size(), params.size());
  const auto grad_scale = [&](const std::string& name) {
    for (const nn::ParamRef& p : ref)
      if (p.name == name) return max_abs(ConstView(p.grad, p.shape));
    ADD_FAILURE() << "no parameter " << name;
    return 0.0;
  };
  std::vector<double> mine;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ConstView g(params[i].grad, params[i].shape), gr(ref[i].grad, ref[i].shape);
    // The key bias's gradient is 0 in exact arithmetic (softmax ignores a shift common to a query's scores):
    // what both runs hold is the rounding left by cancelling terms of the key weight's gradient's size.
    const std::string& name = params[i].name;
    const bool key_bias = name.size() > 6 && name.compare(name.size() - 6, 6, "k.bias") == 0;
    const double scale = key_bias ? grad_scale(name.substr(0, name.size() - 4) + "weight") : max_abs(gr);
    EXPECT_TRUE(all_close(g, Tensor::copy_of(gr), Tol{64, scale}, name));
    for (Index k = 0; k < params[i].numel(); ++k) mine.push_back(params[i].grad[k]);
  }
  EXPECT_NO_THROW(comm.check_same(mine, "the averaged gradients"));  // the same bits on every rank
}

class DataParallelTraining : public ::testing::TestWithParam<nn::NormKind> {};

TEST_P(DataParallelTraining, MatchesOneProcess) {
  // nn::train on every rank's share with the hooks of dist::data_parallel: the same losses as one process
  // training on the whole batch (up to the order of float sums), the same bits on every rank. A BatchNorm
  // model normalizes with SyncBatchNorm, i.e. with the whole batch's statistics.
  const Comm comm = Comm::world();
  nn::TrainConfig cfg;
  cfg.model.norm = GetParam();
  cfg.model.layers = 2;
  cfg.model.d_model = 32;
  cfg.model.heads = 2;
  cfg.model.ffn = 64;
  cfg.steps = 6;
  cfg.batch = 6;
  cfg.seq = 16;
  cfg.eval_every = 3;
  cfg.val_windows = 12;
  cfg.lr = 1e-3;
  cfg.threads = 1;
  if (GetParam() == nn::NormKind::kBatchNorm) {
    // SGD here: a bias just before a BatchNorm has a gradient of 0 in exact arithmetic (the batch mean
    // removes it), and AdamW turns the rounding left there into steps of ±lr that differ between the two
    // runs. They do not change the training loss, but eval mode's running statistics see them.
    cfg.optimizer = nn::OptimizerKind::kSgd;
    cfg.lr = 0.1;
  }
  const nn::TrainResult one = nn::train(cfg);
  const nn::DataParallel dp = dist::data_parallel(comm);
  const nn::TrainResult par = nn::train(cfg, {}, &dp);
  ASSERT_FALSE(par.diverged) << par.message;
  ASSERT_EQ(par.losses.size(), one.losses.size());
  for (std::size_t i = 0; i < one.losses.size(); ++i)
    EXPECT_NEAR(par.losses[i], one.losses[i], 1e-5 * one.losses[i]) << "step " << i + 1;
  ASSERT_EQ(par.val_losses.size(), one.val_losses.size());
  for (std::size_t i = 0; i < one.val_losses.size(); ++i)
    EXPECT_NEAR(par.val_losses[i].second, one.val_losses[i].second, 1e-5 * one.val_losses[i].second);
  std::vector<double> mine = par.losses;
  for (const auto& v : par.val_losses) mine.push_back(v.second);
  EXPECT_NO_THROW(comm.check_same(mine, "the training and validation losses"));
  if (comm.size() == 1) {  // one rank: the hooks change nothing
    for (std::size_t i = 0; i < one.losses.size(); ++i) EXPECT_EQ(par.losses[i], one.losses[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Norms, DataParallelTraining,
                         ::testing::Values(nn::NormKind::kLayerNorm, nn::NormKind::kBatchNorm));

TEST(DataParallel, MismatchedModelsAreRefused) {
  const Comm comm = Comm::world();
  if (comm.size() == 1) GTEST_SKIP() << "needs two ranks";
  nn::ModelConfig cfg;
  cfg.layers = comm.rank() == 0 ? 1 : 2;
  cfg.d_model = 8;
  cfg.heads = 2;
  cfg.ffn = 16;
  cfg.vocab = 16;
  cfg.max_seq = 4;
  nn::Model model(cfg);
  const std::vector<nn::ParamRef> params = model.params();
  EXPECT_THROW(dist::average_gradients(comm, params), Error);
}

}  // namespace
}  // namespace normlab
