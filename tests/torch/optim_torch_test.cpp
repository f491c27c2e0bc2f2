// normlab's optimizers (include/normlab/nn/optim.h) against torch::optim::AdamW / SGD (libtorch 1.13)
// on the same float32 tensors and gradients, step after step. normlab mirrors ATen's float operation
// order, but ATen's vectorized kernels fuse some products (add with alpha is an fmadd) and round a
// few elements differently (≤ ~4e-8 absolute, ~1 ulp of an update), so parameters are compared
// with all_close, Tol{k = 4, scale = 1} (the parameters are N(0,1)).
#include <normlab/nn/optim.h>
#include <torch/torch.h>

#include <random>
#include <vector>

#include "support/tolerance.h"

namespace normlab::nn {
namespace {

struct OptimSetup {
  std::vector<std::vector<float>> data, grad;
  std::vector<ParamRef> refs;
  std::vector<torch::Tensor> tparams;
  explicit OptimSetup(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd;
    const std::vector<std::pair<std::string, Dims>> meta = {
        {"wte", Dims{10, 6}}, {"blocks.0.attn.q.weight", Dims{6, 6}}, {"blocks.0.attn.q.bias", Dims{6}},
        {"blocks.0.norm1.weight", Dims{6}}, {"head.weight", Dims{3, 6}}};
    data.reserve(meta.size());
    grad.reserve(meta.size());
    for (const auto& [name, shape] : meta) {
      data.emplace_back(static_cast<std::size_t>(shape.product()));
      grad.emplace_back(static_cast<std::size_t>(shape.product()));
      for (float& x : data.back()) x = nd(rng);
      refs.push_back({name, shape, data.back().data(), grad.back().data()});
      tparams.push_back(torch::tensor(data.back(), torch::kFloat32).view(shape.vec()).clone().requires_grad_(true));
    }
  }
  // Fresh random gradients (some tiny, some large) for both sides.
  void new_grads(std::mt19937_64& rng) {
    std::normal_distribution<float> nd;
    for (std::size_t i = 0; i < refs.size(); ++i) {
      const float scale = i % 2 == 0 ? 1e-3f : 3.0f;
      for (float& g : grad[i]) g = scale * nd(rng);
      tparams[i].mutable_grad() = torch::tensor(grad[i], torch::kFloat32).view(refs[i].shape.vec());
    }
  }
  void expect_same(const std::string& what) {
    for (std::size_t i = 0; i < refs.size(); ++i) {
      torch::Tensor t = tparams[i].detach().contiguous();
      Tensor ours(refs[i].shape), theirs(refs[i].shape);
      std::copy(data[i].begin(), data[i].end(), ours.data());
      std::copy(t.data_ptr<float>(), t.data_ptr<float>() + t.numel(), theirs.data());
      BasicTensor<double> ref(refs[i].shape);
      for (Index j = 0; j < ref.numel(); ++j) ref[j] = theirs[j];
      EXPECT_TRUE(testing::all_close(ours.cview(), ref, testing::Tol{4, 1.0}, what + " " + refs[i].name));
    }
  }
};

TEST(NnOptimTorch, AdamWMatchesTorchOptimAdamW) {
  for (double wd : {0.0, 0.1}) {
    OptimSetup s(1);
    AdamW ours(s.refs, AdamWOptions{0.9, 0.98, 1e-9, wd, /*exclude_no_decay=*/false});
    torch::optim::AdamW theirs(s.tparams, torch::optim::AdamWOptions(1e-3).betas({0.9, 0.98}).eps(1e-9).weight_decay(wd));
    std::mt19937_64 rng(2);
    for (int step = 0; step < 20; ++step) {
      const double lr = 1e-3 * (1 + step % 3);
      for (auto& g : theirs.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
      s.new_grads(rng);
      ours.step(lr);
      theirs.step();
      s.expect_same("AdamW wd " + std::to_string(wd) + " step " + std::to_string(step));
    }
  }
}

TEST(NnOptimTorch, AdamWNoDecayGroupsMatchTorchParamGroups) {
  OptimSetup s(3);
  AdamW ours(s.refs, AdamWOptions{0.9, 0.98, 1e-9, 0.1, /*exclude_no_decay=*/true});
  std::vector<torch::Tensor> decay, no_decay;
  for (std::size_t i = 0; i < s.refs.size(); ++i) (is_no_decay(s.refs[i]) ? no_decay : decay).push_back(s.tparams[i]);
  ASSERT_EQ(no_decay.size(), 2u);  // the bias and the norm weight
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(2e-3).betas({0.9, 0.98}).eps(1e-9).weight_decay(0.1)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(2e-3).betas({0.9, 0.98}).eps(1e-9).weight_decay(0.0)));
  torch::optim::AdamW theirs(std::move(groups), torch::optim::AdamWOptions(2e-3));
  std::mt19937_64 rng(4);
  for (int step = 0; step < 10; ++step) {
    s.new_grads(rng);
    ours.step(2e-3);
    theirs.step();
    s.expect_same("AdamW groups step " + std::to_string(step));
  }
}

TEST(NnOptimTorch, SgdMatchesTorchOptimSgd) {
  struct Case {
    double momentum, wd;
    bool nesterov;
  };
  for (const Case& c : {Case{0.0, 0.0, false}, Case{0.9, 0.0, false}, Case{0.9, 0.01, false}, Case{0.9, 0.01, true}}) {
    OptimSetup s(5);
    Sgd ours(s.refs, SgdOptions{c.momentum, 0.0, c.nesterov, c.wd, /*exclude_no_decay=*/false});
    torch::optim::SGD theirs(s.tparams,
                             torch::optim::SGDOptions(0.05).momentum(c.momentum).weight_decay(c.wd).nesterov(c.nesterov));
    std::mt19937_64 rng(6);
    for (int step = 0; step < 15; ++step) {
      s.new_grads(rng);
      ours.step(0.05);
      theirs.step();
      s.expect_same("SGD momentum " + std::to_string(c.momentum) + " step " + std::to_string(step));
    }
  }
}

TEST(NnOptimTorch, ClipGradNormMatchesTorch) {
  OptimSetup s(7);
  std::mt19937_64 rng(8);
  s.new_grads(rng);
  const double ours = clip_grad_norm(s.refs, 1.0);
  const double theirs = torch::nn::utils::clip_grad_norm_(s.tparams, 1.0);
  EXPECT_NEAR(ours, theirs, 1e-6 * theirs);
  for (std::size_t i = 0; i < s.refs.size(); ++i) {
    torch::Tensor g = s.tparams[i].grad().contiguous();
    for (Index j = 0; j < s.refs[i].numel(); ++j)
      EXPECT_NEAR(s.grad[i][static_cast<std::size_t>(j)], g.data_ptr<float>()[j], 1e-6 * std::fabs(g.data_ptr<float>()[j]) + 1e-12);
  }
}

}  // namespace
}  // namespace normlab::nn
