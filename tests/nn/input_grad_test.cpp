// ∂L/∂x_l, the gradient w.r.t. each block's residual-stream input (Model::record_input_grads / input_grad /
// input_grad_norms), against float64 central differences of the loss:
//   * per element: with learned positions and B = 1, x_0[t, i] = wte[token_t, i] + wpe[t, i], so a change of
//     wpe[t, i] is a change of x_0[t, i] alone; skipping blocks 0..l−1 makes x_l = x_0, so the finite
//     difference over wpe[t, i] is ∂L/∂x_l[t, i] for every l;
//   * with every block run: the last op of a Post-LN block adds norm2.bias to the stream and the last op of a
//     Pre-LN block adds ffn.w2.bias, so the finite difference over that bias of block l−1 is Σ_t ∂L/∂x_l[t, i].
// Also: not recorded by default, discarded by the next forward, the float Model's norms match its recorded
// gradients.
#include <normlab/nn/model.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "nn/block.h"
#include "support/finite_diff.h"

namespace normlab::nn {
namespace {

ModelConfig small(Placement p) {
  ModelConfig c;
  c.placement = p;
  c.layers = 3;
  c.d_model = 8;
  c.heads = 2;
  c.ffn = 16;
  c.vocab = 11;
  c.max_seq = 6;
  c.positions = PositionKind::kLearned;
  c.seed = 5;
  return c;
}

struct Tokens {
  std::vector<std::int32_t> tokens, targets;
};
Tokens make_tokens(Index n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tokens t;
  for (Index i = 0; i < n; ++i) {
    t.tokens.push_back(static_cast<std::int32_t>(rng() % 11));
    t.targets.push_back(static_cast<std::int32_t>(rng() % 11));
  }
  return t;
}

// |analytic − fd| ≤ 1e-6·max(|fd|, scale) + 1e-10 (h = 1e-5 on an O(1) loss: rounding ~1e-11).
void expect_close(double an, double fd, double scale, const std::string& what) {
  EXPECT_LE(std::fabs(an - fd), 1e-6 * std::max(std::fabs(fd), scale) + 1e-10)
      << what << ": analytic " << an << " vs finite difference " << fd;
}

ParamEntry<double>& param(Transformer<double>& net, const std::string& name) {
  for (auto& p : net.params())
    if (p.name == name) return p;
  throw std::runtime_error("no parameter " + name);
}

TEST(NnInputGrad, EachBlockInputMatchesFiniteDifferencesPerElement) {
  const Index T = 5, C = 8;
  const Tokens b = make_tokens(T, 3);
  for (Placement p : {Placement::kPost, Placement::kPre, Placement::kSandwich, Placement::kDeepNorm}) {
    Transformer<double> net(small(p));
    net.record_input_grads(true);
    for (int l = 0; l < 3; ++l) {
      std::vector<int> skip;
      for (int k = 0; k < l; ++k) skip.push_back(k);  // x_l = x_0
      net.set_skipped_blocks(skip);
      auto loss = [&] { return net.forward(b.tokens.data(), b.targets.data(), 1, T); };
      loss();
      net.backward();
      const std::vector<double> dx(net.input_grad(l).begin(), net.input_grad(l).end());
      ASSERT_EQ(dx.size(), static_cast<std::size_t>(T * C));
      double scale = 0;
      for (double v : dx) scale = std::max(scale, std::fabs(v));
      ParamEntry<double>& wpe = param(net, "wpe");
      for (Index t = 0; t < T; ++t)
        for (Index i = 0; i < C; i += 3) {
          const double fd = testing::central_difference(wpe.data[t * C + i], loss, 1e-5);
          expect_close(dx[static_cast<std::size_t>(t * C + i)], fd, scale,
                       std::string(placement_name(p)) + " dL/dx_" + std::to_string(l) + "[" + std::to_string(t) + "," +
                           std::to_string(i) + "]");
        }
    }
  }
}

TEST(NnInputGrad, TokenSumsMatchTheFiniteDifferenceOfTheBiasThatFeedsEachBlockInput) {
  const Index B = 2, T = 5, C = 8;
  const Tokens b = make_tokens(B * T, 4);
  for (auto [p, bias] : {std::pair{Placement::kPost, "norm2.bias"}, std::pair{Placement::kPre, "ffn.w2.bias"}}) {
    Transformer<double> net(small(p));
    net.record_input_grads(true);
    auto loss = [&] { return net.forward(b.tokens.data(), b.targets.data(), B, T); };
    loss();
    net.backward();
    std::vector<std::vector<double>> dx;
    for (int l = 0; l < 3; ++l) dx.emplace_back(net.input_grad(l).begin(), net.input_grad(l).end());
    for (int l = 1; l < 3; ++l) {
      std::vector<double> sum(static_cast<std::size_t>(C), 0.0);
      for (Index r = 0; r < B * T; ++r)
        for (Index i = 0; i < C; ++i) sum[static_cast<std::size_t>(i)] += dx[static_cast<std::size_t>(l)][static_cast<std::size_t>(r * C + i)];
      double scale = 0;
      for (double v : sum) scale = std::max(scale, std::fabs(v));
      ParamEntry<double>& bp = param(net, "blocks." + std::to_string(l - 1) + "." + bias);
      for (Index i = 0; i < C; ++i) {
        const double fd = testing::central_difference(bp.data[i], loss, 1e-5);
        expect_close(sum[static_cast<std::size_t>(i)], fd, scale,
                     std::string(placement_name(p)) + " Σ_t dL/dx_" + std::to_string(l) + "[" + std::to_string(i) + "]");
      }
    }
  }
}

TEST(NnInputGrad, NotRecordedByDefaultAndNormsMatchTheRecordedGradients) {
  const Index B = 2, T = 6, C = 8;
  const Tokens b = make_tokens(B * T, 5);
  Model m(small(Placement::kPre));
  m.forward(b.tokens.data(), b.targets.data(), B, T);
  m.backward();
  EXPECT_TRUE(m.input_grad(0).empty());
  EXPECT_TRUE(m.input_grad_norms().empty());
  EXPECT_THROW(m.input_grad(3), Error);
  m.record_input_grads(true);
  const std::vector<Index> lengths{6, 4};
  m.forward(b.tokens.data(), b.targets.data(), B, T, lengths);
  m.backward();
  const std::vector<double> norms = m.input_grad_norms();
  ASSERT_EQ(norms.size(), 3u);
  for (int l = 0; l < 3; ++l) {
    const auto g = m.input_grad(l);
    ASSERT_EQ(g.size(), static_cast<std::size_t>(B * T * C));
    double sum = 0;
    int rows = 0;
    for (Index r = 0; r < B * T; ++r) {
      if (r % T >= lengths[static_cast<std::size_t>(r / T)]) continue;  // padding is not a real token
      double q = 0;
      for (Index i = 0; i < C; ++i) q += double(g[static_cast<std::size_t>(r * C + i)]) * g[static_cast<std::size_t>(r * C + i)];
      sum += std::sqrt(q), ++rows;
    }
    EXPECT_NEAR(norms[static_cast<std::size_t>(l)], sum / rows, 1e-12 * sum / rows + 1e-300) << "block " << l;
    EXPECT_GT(norms[static_cast<std::size_t>(l)], 0.0);
  }
  m.forward(b.tokens.data(), b.targets.data(), 1, T);  // a new forward (another batch size) discards them
  EXPECT_TRUE(m.input_grad(0).empty());
  EXPECT_TRUE(m.input_grad_norms().empty());
  m.record_input_grads(false);
  m.forward(b.tokens.data(), b.targets.data(), B, T);
  m.backward();
  EXPECT_TRUE(m.input_grad(1).empty());
}

}  // namespace
}  // namespace normlab::nn
