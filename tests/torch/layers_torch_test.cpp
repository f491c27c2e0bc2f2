// The nn layers (include/normlab/nn/layers.h) against LibTorch autograd (Debian's libtorch 1.13, CPU).
//
// Each layer is written a second time with plain torch ops on the same weights, in float64 with
// requires_grad; L = Σ r⊙y (r random) is backpropagated by autograd. LibTorch in float64 is an
// independent oracle for the SEMANTICS (layouts, GELU variant, masks, ignore rules, means):
//   normlab double vs LibTorch double:  |a − b| ≤ 1e-11 · max|LibTorch| (both exact to ~1e-15);
//   normlab float  vs LibTorch double:  all_close with Tol{k, max|ref|}, k in fp32 epsilons (as the
//                                       float-vs-double checks of tests/nn/layers_test.cpp).
// Attention masks follow normlab's contract: keys ≥ length masked (−inf before the softmax), padded
// query rows zeroed after it (lengths ≥ 1 here: a fully masked row is NaN in LibTorch).
#include <normlab/nn/layers.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "nn/layer_check.h"

namespace normlab::nn {
namespace {

using testing::randn;
using testing::Vecs;

template <typename V>
using ScalarOf = typename std::decay_t<V>::value_type::value_type;

torch::Tensor t64(const std::vector<double>& v, std::vector<int64_t> shape) {
  return torch::from_blob(const_cast<double*>(v.data()), shape, torch::kFloat64).clone().requires_grad_(true);
}
std::vector<double> vec_of(const torch::Tensor& t) {
  torch::Tensor c = t.detach().contiguous().to(torch::kFloat64);
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

::testing::AssertionResult double_matches(const std::vector<double>& a, const std::vector<double>& ref,
                                          const std::string& what) {
  if (a.size() != ref.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  const double bound = 1e-11 * std::max(testing::max_abs(ref), 1e-300);
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(a[i] - ref[i]) <= bound))
      return ::testing::AssertionFailure() << what << "[" << i << "]: normlab " << a[i] << ", LibTorch " << ref[i];
  return ::testing::AssertionSuccess();
}

// Runs normlab (double and float) and LibTorch (double autograd) on the same inputs and compares y and
// every gradient. `shapes` gives each input's torch shape.
template <typename Layer>
void compare_with_torch(Layer&& layer,
                        const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& torch_layer,
                        const Vecs<double>& in, const std::vector<std::vector<int64_t>>& shapes,
                        const std::vector<std::string>& names, double k_out, double k_grad, std::mt19937_64& rng) {
  std::vector<torch::Tensor> tin;
  for (std::size_t i = 0; i < in.size(); ++i) tin.push_back(t64(in[i], shapes[i]));
  torch::Tensor ty = torch_layer(tin);
  const std::vector<double> y_ref = vec_of(ty);
  const std::vector<double> r = randn(y_ref.size(), rng);
  (ty * t64(r, ty.sizes().vec()).detach()).sum().backward();

  const std::vector<double> yd = layer(in, static_cast<const std::vector<double>*>(nullptr),
                                       static_cast<Vecs<double>*>(nullptr));
  Vecs<double> gd = testing::zeros_like<double>(in);
  layer(in, &r, &gd);
  const Vecs<float> inf = testing::cast_vecs<float>(in);
  const std::vector<float> rf = testing::cast_vec<float>(r);
  const std::vector<float> yf = layer(inf, static_cast<const std::vector<float>*>(nullptr),
                                      static_cast<Vecs<float>*>(nullptr));
  Vecs<float> gf = testing::zeros_like<float>(in);
  layer(inf, &rf, &gf);

  EXPECT_TRUE(double_matches(yd, y_ref, "y (double)"));
  EXPECT_TRUE(testing::float_matches(yf, y_ref, k_out, "y (float)"));
  double gmax = 0;
  std::vector<std::vector<double>> g_ref;
  for (const auto& t : tin) {
    g_ref.push_back(t.grad().defined() ? vec_of(t.grad()) : std::vector<double>(static_cast<std::size_t>(t.numel()), 0.0));
    gmax = std::max(gmax, testing::max_abs(g_ref.back()));
  }
  for (std::size_t i = 0; i < in.size(); ++i) {
    // A gradient that is 0 in exact arithmetic (attention's key bias) is measured against the largest one.
    const bool zero = testing::max_abs(g_ref[i]) <= 1e-12 * gmax;
    if (zero) {
      EXPECT_LE(testing::max_abs(gd[i]), 1e-11 * gmax) << "d" << names[i] << " (double)";
    } else {
      EXPECT_TRUE(double_matches(gd[i], g_ref[i], "d" + names[i] + " (double)"));
    }
    EXPECT_TRUE(testing::float_matches(gf[i], g_ref[i], k_grad, "d" + names[i] + " (float)", zero ? gmax : 0.0));
  }
}

namespace F = torch::nn::functional;

TEST(NnLayersTorch, Linear) {
  std::mt19937_64 rng(101);
  const Index N = 7, C = 12, OC = 5;
  auto layer = [&](const auto& in, const auto* dy, auto* g) {
    using R = ScalarOf<decltype(in)>;
    std::vector<R> y(static_cast<std::size_t>(N * OC));
    linear_forward(y.data(), in[0].data(), in[1].data(), in[2].data(), N, C, OC);
    if (dy)
      linear_backward((*g)[0].data(), (*g)[1].data(), (*g)[2].data(), dy->data(), in[0].data(), in[1].data(), N, C, OC);
    return y;
  };
  auto torch_layer = [](const std::vector<torch::Tensor>& t) { return F::linear(t[0], t[1], t[2]); };
  compare_with_torch(layer, torch_layer, {randn(N * C, rng), randn(OC * C, rng, 0.3), randn(OC, rng)},
                     {{N, C}, {OC, C}, {OC}}, {"inp", "weight", "bias"}, 16, 32, rng);
}

TEST(NnLayersTorch, FfnReluGeluAndGeluTanh) {
  std::mt19937_64 rng(102);
  const Index N = 6, C = 8, F_ = 32;
  for (Activation act : {Activation::kRelu, Activation::kGelu, Activation::kGeluTanh}) {
    auto layer = [&](const auto& in, const auto* dy, auto* g) {
      using R = ScalarOf<decltype(in)>;
      std::vector<R> y(static_cast<std::size_t>(N * C)), h(static_cast<std::size_t>(N * F_)), a(h.size());
      ffn_forward(y.data(), h.data(), a.data(), in[0].data(), in[1].data(), in[2].data(), in[3].data(), in[4].data(), N,
                  C, F_, act);
      if (dy)
        ffn_backward((*g)[0].data(), (*g)[1].data(), (*g)[2].data(), (*g)[3].data(), (*g)[4].data(), dy->data(),
                     in[0].data(), h.data(), a.data(), in[1].data(), in[3].data(), N, C, F_, act);
      return y;
    };
    auto torch_layer = [act](const std::vector<torch::Tensor>& t) {
      torch::Tensor h = F::linear(t[0], t[1], t[2]);
      // nn.GELU() is exact erf ("none"); kGeluTanh is nn.GELU(approximate="tanh")
      torch::Tensor a = act == Activation::kRelu ? torch::relu(h)
                        : act == Activation::kGelu ? torch::gelu(h, "none")
                                                   : torch::gelu(h, "tanh");
      return F::linear(a, t[3], t[4]);
    };
    SCOPED_TRACE(static_cast<int>(act));
    compare_with_torch(layer, torch_layer,
                       {randn(N * C, rng), randn(F_ * C, rng, 0.35), randn(F_, rng, 0.1), randn(C * F_, rng, 0.18),
                        randn(C, rng, 0.1)},
                       {{N, C}, {F_, C}, {F_}, {C, F_}, {C}}, {"inp", "w1", "b1", "w2", "b2"}, 16, 32, rng);
  }
}

TEST(NnLayersTorch, TokenEmbeddingPlusPositions) {
  std::mt19937_64 rng(103);
  const Index B = 2, T = 5, C = 6, V = 9, Tmax = 8;
  const std::vector<std::int32_t> tokens{1, 4, 4, 0, 8, 3, 1, 1, 7, 2};
  auto layer = [&](const auto& in, const auto* dy, auto* g) {
    using R = ScalarOf<decltype(in)>;
    std::vector<R> y(static_cast<std::size_t>(B * T * C));
    token_embedding_forward(y.data(), tokens.data(), in[0].data(), B, T, C, V);
    position_forward(y.data(), y.data(), in[1].data(), B, T, C);
    if (dy) {
      std::vector<R> demb(y.size(), R(0));
      position_backward(demb.data(), (*g)[1].data(), dy->data(), B, T, C);
      token_embedding_backward((*g)[0].data(), demb.data(), tokens.data(), B, T, C, V);
    }
    return y;
  };
  auto torch_layer = [&](const std::vector<torch::Tensor>& t) {
    std::vector<int64_t> tok(tokens.begin(), tokens.end());
    torch::Tensor ids = torch::tensor(tok, torch::kLong).view({B, T});
    return F::embedding(ids, t[0]) + t[1].slice(0, 0, T).unsqueeze(0);
  };
  compare_with_torch(layer, torch_layer, {randn(V * C, rng), randn(Tmax * C, rng)}, {{V, C}, {Tmax, C}},
                     {"wte", "wpe"}, 1, 4, rng);
}

// The attention layer with torch ops: q/k/v/o Linear, (B,H,T,hs) heads, −inf at masked keys, padded
// query rows zeroed after the softmax and after the output projection.
torch::Tensor torch_attention(const std::vector<torch::Tensor>& t, Index B, Index T, Index C, Index H, bool causal,
                              const std::vector<Index>& lengths) {
  const Index hs = C / H;
  auto heads = [&](const torch::Tensor& x) { return x.view({B, T, H, hs}).transpose(1, 2); };
  torch::Tensor q = heads(F::linear(t[0], t[1], t[2])), k = heads(F::linear(t[0], t[3], t[4])),
                v = heads(F::linear(t[0], t[5], t[6]));
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hs));
  torch::Tensor allowed = torch::ones({B, 1, T, T}, torch::kBool), qmask = torch::ones({B, 1, T, 1}, torch::kBool);
  for (Index b = 0; b < B; ++b) {
    const Index len = lengths.empty() ? T : lengths[static_cast<std::size_t>(b)];
    for (Index i = 0; i < T; ++i) {
      if (i >= len) qmask[b][0][i][0] = false;
      for (Index j = 0; j < T; ++j)
        if (j >= len || (causal && j > i)) allowed[b][0][i][j] = false;
    }
  }
  // padded query rows keep their real-key scores (finite) and are zeroed after the softmax
  torch::Tensor att = torch::softmax(scores.masked_fill(allowed.logical_not(), -INFINITY), -1);
  att = att * qmask.to(torch::kFloat64);
  torch::Tensor ctx = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
  return F::linear(ctx, t[7], t[8]) * qmask.squeeze(1).to(torch::kFloat64);
}

TEST(NnLayersTorch, MultiHeadAttentionCausalBidirectionalPadded) {
  std::mt19937_64 rng(104);
  const Index B = 2, T = 6, C = 12, H = 3;
  struct Case {
    bool causal;
    std::vector<Index> lengths;
  };
  for (const Case& cs : {Case{true, {}}, Case{false, {}}, Case{true, {6, 3}}, Case{false, {2, 5}}}) {
    auto layer = [&](const auto& in, const auto* dy, auto* g) {
      using R = ScalarOf<decltype(in)>;
      const std::size_t n = static_cast<std::size_t>(B * T * C);
      std::vector<R> y(n), q(n), k(n), v(n), ctx(n), att(static_cast<std::size_t>(B * H * T * T));
      const AttentionActs<R> acts{q.data(), k.data(), v.data(), att.data(), ctx.data()};
      const AttentionParams<R> p{in[1].data(), in[2].data(), in[3].data(), in[4].data(),
                                 in[5].data(), in[6].data(), in[7].data(), in[8].data()};
      attention_forward(y.data(), acts, in[0].data(), p, cs.lengths, B, T, C, H, cs.causal);
      if (dy) {
        auto& G = *g;
        const AttentionGrads<R> gr{G[1].data(), G[2].data(), G[3].data(), G[4].data(),
                                   G[5].data(), G[6].data(), G[7].data(), G[8].data()};
        attention_backward(G[0].data(), gr, dy->data(), in[0].data(), p, acts, cs.lengths, B, T, C, H, cs.causal);
      }
      return y;
    };
    auto torch_layer = [&](const std::vector<torch::Tensor>& t) {
      return torch_attention(t, B, T, C, H, cs.causal, cs.lengths);
    };
    Vecs<double> in{randn(B * T * C, rng)};
    std::vector<std::vector<int64_t>> shapes{{B, T, C}};
    for (int i = 0; i < 4; ++i) {
      in.push_back(randn(C * C, rng, 1 / std::sqrt(double(C))));
      in.push_back(randn(C, rng, 0.1));
      shapes.push_back({C, C});
      shapes.push_back({C});
    }
    SCOPED_TRACE(::testing::Message() << "causal " << cs.causal << ", padded " << !cs.lengths.empty());
    compare_with_torch(layer, torch_layer, in, shapes, {"inp", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo"}, 32,
                       64, rng);
  }
}

TEST(NnLayersTorch, CrossEntropyIgnoreIndexAndLengths) {
  std::mt19937_64 rng(105);
  const Index B = 3, T = 4, V = 10;
  const std::vector<std::int32_t> targets{3, 9, -100, 0, 1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<Index> lengths{4, 3, 1};
  auto layer = [&](const auto& in, const auto* dy, auto* g) {
    using R = ScalarOf<decltype(in)>;
    std::vector<R> probs(static_cast<std::size_t>(B * T * V));
    const double loss = cross_entropy_forward(probs.data(), in[0].data(), targets.data(), lengths, B, T, V);
    if (dy) cross_entropy_backward((*g)[0].data(), probs.data(), targets.data(), lengths, B, T, V, (*dy)[0]);
    return std::vector<R>{static_cast<R>(loss)};
  };
  auto torch_layer = [&](const std::vector<torch::Tensor>& t) {
    std::vector<int64_t> tg(targets.begin(), targets.end());
    for (Index b = 0; b < B; ++b)  // padding → ignore_index
      for (Index s = lengths[static_cast<std::size_t>(b)]; s < T; ++s) tg[static_cast<std::size_t>(b * T + s)] = -100;
    return F::cross_entropy(t[0].view({B * T, V}), torch::tensor(tg, torch::kLong),
                            F::CrossEntropyFuncOptions().ignore_index(-100))
        .view({1});
  };
  compare_with_torch(layer, torch_layer, {randn(B * T * V, rng, 2.0)}, {{B, T, V}}, {"logits"}, 4, 8, rng);
}

TEST(NnLayersTorch, DyTLayerNormRmsNorm) {
  std::mt19937_64 rng(106);
  const Index N = 6, C = 16;
  const double eps = 1e-5;
  auto dyt = [&](const auto& in, const auto* dy, auto* g) {
    using R = ScalarOf<decltype(in)>;
    std::vector<R> y(static_cast<std::size_t>(N * C));
    dyt_forward(y.data(), in[0].data(), in[1].data(), in[2].data(), in[3].data(), N, C);
    if (dy)
      dyt_backward((*g)[0].data(), (*g)[1].data(), (*g)[2].data(), (*g)[3].data(), dy->data(), in[0].data(),
                   in[1].data(), in[2].data(), N, C);
    return y;
  };
  compare_with_torch(
      dyt, [](const std::vector<torch::Tensor>& t) { return t[2] * torch::tanh(t[1] * t[0]) + t[3]; },
      {randn(N * C, rng, 2.0), {kDytAlphaInit}, randn(C, rng, 0.5, 1.0), randn(C, rng, 0.1)}, {{N, C}, {1}, {C}, {C}},
      {"inp", "alpha", "gamma", "beta"}, 8, 16, rng);

  auto ln = [&](const auto& in, const auto* dy, auto* g) {
    using R = ScalarOf<decltype(in)>;
    std::vector<R> y(static_cast<std::size_t>(N * C));
    layernorm_forward<R>(y.data(), nullptr, nullptr, in[0].data(), in[1].data(), in[2].data(), N, C, eps);
    if (dy)
      layernorm_backward((*g)[0].data(), (*g)[1].data(), (*g)[2].data(), dy->data(), in[0].data(), in[1].data(), N, C,
                         eps);
    return y;
  };
  compare_with_torch(
      ln, [&](const std::vector<torch::Tensor>& t) { return torch::layer_norm(t[0], {C}, t[1], t[2], eps); },
      {randn(N * C, rng, 2.0, 0.5), randn(C, rng, 0.5, 1.0), randn(C, rng, 0.1)}, {{N, C}, {C}, {C}},
      {"inp", "weight", "bias"}, 8, 16, rng);

  auto rms = [&](const auto& in, const auto* dy, auto* g) {
    using R = ScalarOf<decltype(in)>;
    std::vector<R> y(static_cast<std::size_t>(N * C));
    rmsnorm_forward<R>(y.data(), nullptr, in[0].data(), in[1].data(), N, C, eps);
    if (dy) rmsnorm_backward((*g)[0].data(), (*g)[1].data(), dy->data(), in[0].data(), in[1].data(), N, C, eps);
    return y;
  };
  compare_with_torch(
      rms,
      [&](const std::vector<torch::Tensor>& t) {  // LibTorch 1.13 has no rms_norm: the formula
        return t[0] * torch::rsqrt(t[0].pow(2).mean(-1, true) + eps) * t[1];
      },
      {randn(N * C, rng, 2.0, 0.5), randn(C, rng, 0.5, 1.0)}, {{N, C}, {C}}, {"inp", "weight"}, 8, 16, rng);
}

}  // namespace
}  // namespace normlab::nn
