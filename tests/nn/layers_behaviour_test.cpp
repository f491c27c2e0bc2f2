// Behaviour of the nn layers beyond their gradients: masks really mask, pinned values and defaults,
// bad input, determinism across thread counts.
#include <normlab/nn/layers.h>
#include <normlab/parallel.h>

#include <cmath>
#include <cstring>
#include <random>

#include "nn/layer_check.h"
#include "support/tolerance.h"

namespace normlab::nn {
namespace {

using testing::randn;

// A float attention layer with its own weights (scale 1/√C), for behaviour tests.
struct AttnLayer {
  Index B, T, C, H;
  std::vector<std::vector<float>> w;  // wq bq wk bk wv bv wo bo
  AttnLayer(Index b, Index t, Index c, Index h, std::mt19937_64& rng) : B(b), T(t), C(c), H(h) {
    for (int i = 0; i < 4; ++i) {
      w.push_back(testing::cast_vec<float>(randn(static_cast<std::size_t>(C * C), rng, 1 / std::sqrt(double(C)))));
      w.push_back(testing::cast_vec<float>(randn(static_cast<std::size_t>(C), rng, 0.1)));
    }
  }
  AttentionParams<float> params() const {
    return {w[0].data(), w[1].data(), w[2].data(), w[3].data(), w[4].data(), w[5].data(), w[6].data(), w[7].data()};
  }
  struct Out {
    std::vector<float> y, dinp, q, k, v, att, ctx;
    std::vector<std::vector<float>> grads;
  };
  Out run(const std::vector<float>& x, const std::vector<float>& dy, std::span<const Index> lengths,
          bool causal) const {
    const std::size_t n = static_cast<std::size_t>(B * T * C);
    Out o{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n),
          std::vector<float>(n), std::vector<float>(static_cast<std::size_t>(B * H * T * T)), std::vector<float>(n),
          {}};
    for (const auto& p : w) o.grads.emplace_back(p.size(), 0.0f);
    const AttentionActs<float> acts{o.q.data(), o.k.data(), o.v.data(), o.att.data(), o.ctx.data()};
    attention_forward(o.y.data(), acts, x.data(), params(), lengths, B, T, C, H, causal);
    auto& g = o.grads;
    const AttentionGrads<float> grads{g[0].data(), g[1].data(), g[2].data(), g[3].data(),
                                      g[4].data(), g[5].data(), g[6].data(), g[7].data()};
    attention_backward(o.dinp.data(), grads, dy.data(), x.data(), params(), acts, lengths, B, T, C, H, causal);
    return o;
  }
};

bool same_bits(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

TEST(NnAttention, CausalMaskingMasksTheFuture) {
  std::mt19937_64 rng(20);
  const Index B = 2, T = 7, C = 8, H = 2, t0 = 4;
  AttnLayer layer(B, T, C, H, rng);
  std::vector<float> x = testing::cast_vec<float>(randn(static_cast<std::size_t>(B * T * C), rng));
  const std::vector<float> dy(x.size(), 0.0f);
  const auto a = layer.run(x, dy, {}, true);
  for (Index b = 0; b < B; ++b)  // change the token at t0 (and after) in every sequence
    for (Index t = t0; t < T; ++t)
      for (Index c = 0; c < C; ++c) x[static_cast<std::size_t>((b * T + t) * C + c)] += 3.0f;
  const auto c2 = layer.run(x, dy, {}, true);
  for (Index b = 0; b < B; ++b) {
    const std::size_t off = static_cast<std::size_t>(b * T * C);
    EXPECT_TRUE(same_bits(a.y.data() + off, c2.y.data() + off, static_cast<std::size_t>(t0 * C)))
        << "an output before t0 moved when tokens at ≥ t0 changed (sequence " << b << ")";
    EXPECT_FALSE(same_bits(a.y.data() + off + t0 * C, c2.y.data() + off + t0 * C, static_cast<std::size_t>(C)));
  }
  // att is lower triangular, and each allowed row sums to 1
  for (Index bh = 0; bh < B * H; ++bh)
    for (Index i = 0; i < T; ++i) {
      double s = 0;
      for (Index j = 0; j < T; ++j) {
        const float p = a.att[static_cast<std::size_t>((bh * T + i) * T + j)];
        if (j > i) {
          EXPECT_EQ(p, 0.0f);
        }
        s += p;
      }
      EXPECT_NEAR(s, 1.0, 1e-6);
    }
  // Bidirectional attention does see the future.
  const auto d = layer.run(x, dy, {}, false);
  x[static_cast<std::size_t>((T - 1) * C)] += 1.0f;
  const auto e = layer.run(x, dy, {}, false);
  EXPECT_FALSE(same_bits(d.y.data(), e.y.data(), static_cast<std::size_t>(C)));
}

TEST(NnAttention, PaddingIsInvisibleAndGetsNoGradient) {
  std::mt19937_64 rng(21);
  const Index B = 2, T = 6, C = 8, H = 4;
  const std::vector<Index> lengths{4, 6};
  AttnLayer layer(B, T, C, H, rng);
  for (bool causal : {true, false}) {
    std::vector<float> x = testing::cast_vec<float>(randn(static_cast<std::size_t>(B * T * C), rng));
    std::vector<float> dy = testing::cast_vec<float>(randn(x.size(), rng));
    const auto a = layer.run(x, dy, lengths, causal);
    // padded query rows: out, dinp are 0
    for (Index t = lengths[0]; t < T; ++t)
      for (Index c = 0; c < C; ++c) {
        EXPECT_EQ(a.y[static_cast<std::size_t>(t * C + c)], 0.0f);
        EXPECT_EQ(a.dinp[static_cast<std::size_t>(t * C + c)], 0.0f);
      }
    // change the padded tokens and their dout: nothing else moves
    for (Index t = lengths[0]; t < T; ++t)
      for (Index c = 0; c < C; ++c) {
        x[static_cast<std::size_t>(t * C + c)] = 100.0f;
        dy[static_cast<std::size_t>(t * C + c)] = -7.0f;
      }
    const auto b = layer.run(x, dy, lengths, causal);
    EXPECT_TRUE(same_bits(a.y.data(), b.y.data(), a.y.size()));
    EXPECT_TRUE(same_bits(a.dinp.data(), b.dinp.data(), a.dinp.size()));
    for (std::size_t i = 0; i < a.grads.size(); ++i)
      EXPECT_TRUE(same_bits(a.grads[i].data(), b.grads[i].data(), a.grads[i].size())) << "parameter " << i;
  }
}

TEST(NnAttention, SameBitsForOneTwoAndThreeThreads) {
  std::mt19937_64 rng(22);
  const Index B = 3, T = 9, C = 12, H = 3;
  AttnLayer layer(B, T, C, H, rng);
  const std::vector<float> x = testing::cast_vec<float>(randn(static_cast<std::size_t>(B * T * C), rng));
  const std::vector<float> dy = testing::cast_vec<float>(randn(x.size(), rng));
  const int saved = num_threads();
  set_num_threads(1);
  const auto a = layer.run(x, dy, std::vector<Index>{9, 5, 1}, true);
  for (int nt : {2, 3}) {
    set_num_threads(nt);
    const auto b = layer.run(x, dy, std::vector<Index>{9, 5, 1}, true);
    EXPECT_TRUE(same_bits(a.y.data(), b.y.data(), a.y.size())) << nt << " threads";
    EXPECT_TRUE(same_bits(a.dinp.data(), b.dinp.data(), a.dinp.size())) << nt << " threads";
    for (std::size_t i = 0; i < a.grads.size(); ++i)
      EXPECT_TRUE(same_bits(a.grads[i].data(), b.grads[i].data(), a.grads[i].size())) << nt << " threads";
  }
  set_num_threads(saved);
}

// One (batch, head) chunk (it runs outside a parallel region) and many, at sizes where oneDNN would
// thread a product: the float attention core gives the same bits at 1, 2 and 3 threads.
TEST(NnAttention, GemmCoreSameBitsForAnyThreadCount) {
  std::mt19937_64 rng(23);
  for (const Index H : {Index{1}, Index{4}}) {
    const Index B = 1, T = 96, C = 64;
    std::vector<float> q = testing::cast_vec<float>(randn(static_cast<std::size_t>(B * T * C), rng));
    std::vector<float> k = testing::cast_vec<float>(randn(q.size(), rng)), v = testing::cast_vec<float>(randn(q.size(), rng));
    std::vector<float> dctx = testing::cast_vec<float>(randn(q.size(), rng));
    auto run = [&](int nt) {
      set_num_threads(nt);
      std::vector<float> ctx(q.size()), att(static_cast<std::size_t>(B * H * T * T)), g(3 * q.size(), 0.0f);
      sdpa_forward(ctx.data(), att.data(), q.data(), k.data(), v.data(), {}, B, T, C, H, true);
      sdpa_backward(g.data(), g.data() + q.size(), g.data() + 2 * q.size(), dctx.data(), q.data(), k.data(), v.data(),
                    att.data(), {}, B, T, C, H, true);
      ctx.insert(ctx.end(), g.begin(), g.end());
      return ctx;
    };
    const int saved = num_threads();
    const std::vector<float> one = run(1);
    for (int nt : {2, 3}) {
      const std::vector<float> other = run(nt);
      EXPECT_TRUE(same_bits(one.data(), other.data(), one.size())) << "H = " << H << ", " << nt << " threads";
    }
    set_num_threads(saved);
  }
}

TEST(NnLayers, BadInputIsReported) {
  std::vector<float> buf(4096, 0.0f);
  float* p = buf.data();
  const AttentionParams<float> params{p, p, p, p, p, p, p, p};
  const AttentionActs<float> acts{p, p, p, p, p};
  EXPECT_NL_ERROR(attention_forward(p, acts, p, params, {}, 1, 2, 8, 3, true), "heads (H) must divide d_model (C)");
  EXPECT_NL_ERROR(attention_forward(p, acts, p, params, {}, 1, 2, 8, 0, true), "H must be ≥ 1, got 0");
  EXPECT_NL_ERROR(attention_forward(p, acts, p, params, {}, 0, 2, 8, 2, true), "B must be ≥ 1, got 0");
  const std::vector<Index> too_long{2, 5}, negative{-1, 2}, wrong_count{2};
  EXPECT_NL_ERROR(attention_forward(p, acts, p, params, too_long, 2, 4, 8, 2, true),
                  "lengths[1] = 5 is out of range [0, T = 4]");
  EXPECT_NL_ERROR(attention_forward(p, acts, p, params, negative, 2, 4, 8, 2, false),
                  "lengths[0] = -1 is out of range");
  EXPECT_NL_ERROR(attention_forward(p, acts, p, params, wrong_count, 2, 4, 8, 2, false),
                  "lengths has 1 entries, expected B = 2");
  EXPECT_NL_ERROR(linear_forward(p, p, p, p, 0, 3, 2), "linear: N must be ≥ 1, got 0");
  EXPECT_NL_ERROR(linear_backward(p, p, p, p, p, p, 2, 3, 0), "linear: OC must be ≥ 1, got 0");
  EXPECT_NL_ERROR(ffn_forward(p, p, p, p, p, p, p, p, 2, 3, 0, Activation::kRelu), "ffn: F must be ≥ 1, got 0");
  const std::int32_t bad_tokens[] = {0, 7};
  EXPECT_NL_ERROR(token_embedding_forward(p, bad_tokens, p, 1, 2, 3, 7), "token 7 at flat position 1 is out of range [0, V = 7)");
  EXPECT_NL_ERROR(cross_entropy_forward(p, p, bad_tokens, {}, 1, 2, 7), "target 7 at flat position 1");
  EXPECT_NL_ERROR(cross_entropy_forward(p, p, bad_tokens, too_long, 2, 1, 8), "lengths[0] = 2 is out of range [0, T = 1]");
  EXPECT_NL_ERROR(layernorm_forward(p, p, p, p, p, p, 2, 0), "layernorm: C must be ≥ 1, got 0");
  EXPECT_NL_ERROR(layernorm_forward<float>(p, nullptr, nullptr, p, nullptr, nullptr, 2, 3, -1.0), "eps must be finite");
  EXPECT_NL_ERROR(dyt_forward(p, p, p, p, p, 0, 3), "dyt: N must be ≥ 1, got 0");
}

TEST(NnLayers, GeluDefaultIsExactErfAsPyTorch) {
  // nn.GELU()(1.0) = 0.8413447460685429 (erf); nn.GELU(approximate="tanh")(1.0) = 0.8411919906082768.
  const double x = 1.0;
  double y = 0;
  activation_forward(&y, &x, 1, Activation::kGelu);
  EXPECT_NEAR(y, 0.8413447460685429, 1e-15);
  activation_forward(&y, &x, 1, Activation::kGeluTanh);
  EXPECT_NEAR(y, 0.8411919906082768, 1e-15);
  const double xs[] = {-1.0, 0.0, 2.0};
  double ys[3], d[3] = {0, 0, 0};
  const double ones[] = {1, 1, 1};
  activation_forward(ys, xs, 3, Activation::kRelu);
  EXPECT_EQ(ys[0], 0.0);
  EXPECT_EQ(ys[2], 2.0);
  activation_backward(d, ones, xs, 3, Activation::kRelu);
  EXPECT_EQ(d[1], 0.0);  // ReLU'(0) = 0, as PyTorch
  EXPECT_EQ(d[2], 1.0);
  EXPECT_EQ(kDytAlphaInit, 0.5);
}

TEST(NnLayers, SinusoidalPositionsFollowVaswani) {
  const Index T = 5, C = 6;
  std::vector<double> pe(static_cast<std::size_t>(T * C));
  sinusoidal_positions(pe.data(), T, C);
  for (Index t = 0; t < T; ++t)
    for (Index i = 0; i < C / 2; ++i) {
      const double angle = double(t) / std::pow(10000.0, 2.0 * double(i) / double(C));
      EXPECT_DOUBLE_EQ(pe[static_cast<std::size_t>(t * C + 2 * i)], std::sin(angle));
      EXPECT_DOUBLE_EQ(pe[static_cast<std::size_t>(t * C + 2 * i + 1)], std::cos(angle));
    }
  EXPECT_EQ(pe[0], 0.0);  // t = 0: sin 0, cos 0
  EXPECT_EQ(pe[1], 1.0);
}

TEST(NnLayers, CrossEntropyValuesAndAllIgnored) {
  // Two positions, V = 2: logits (0, 0) → loss log 2; logits (0, log 3), target 1 → loss log(4/3).
  const double logits[] = {0, 0, 0, std::log(3.0)};
  double probs[4], dl[4] = {0, 0, 0, 0};
  const std::int32_t targets[] = {0, 1};
  const double loss = cross_entropy_forward(probs, logits, targets, {}, 1, 2, 2);
  EXPECT_NEAR(loss, (std::log(2.0) + std::log(4.0 / 3.0)) / 2, 1e-15);
  cross_entropy_backward(dl, probs, targets, {}, 1, 2, 2);
  EXPECT_NEAR(dl[0], (0.5 - 1) / 2, 1e-15);
  EXPECT_NEAR(dl[3], (0.75 - 1) / 2, 1e-15);
  // Nothing counted: loss 0, no gradient.
  const std::int32_t ignored[] = {-100, -1};
  EXPECT_EQ(cross_entropy_forward(probs, logits, ignored, {}, 1, 2, 2), 0.0);
  const std::vector<Index> zero{0};
  EXPECT_EQ(cross_entropy_forward(probs, logits, targets, zero, 1, 2, 2), 0.0);
  double dz[4] = {0, 0, 0, 0};
  cross_entropy_backward(dz, probs, targets, zero, 1, 2, 2);
  for (double v : dz) EXPECT_EQ(v, 0.0);
}

}  // namespace
}  // namespace normlab::nn
