// Every layer of include/normlab/nn/layers.h, checked alone (tests/nn/layer_check.h):
//   the double backward vs float64 central finite differences of L = Σ r⊙y,
//   a second backward accumulates (+=) into every gradient, parameters and activations alike,
//   the float instantiation (oneDNN GEMM, library norms) vs the double one with all_close / Tol.
// Behaviour (masks, values, errors, determinism) is in layers_behaviour_test.cpp.
#include <normlab/nn/layers.h>

#include <cmath>
#include <random>
#include <type_traits>

#include "nn/gemm.h"
#include "nn/layer_check.h"

namespace normlab::nn {
namespace {

using testing::check_layer;
using testing::LayerCheck;
using testing::randn;
using testing::Vecs;

template <typename V>
using ScalarOf = typename std::decay_t<V>::value_type::value_type;

// ---- GEMM ------------------------------------------------------------------------------------------

// float (dnnl_sgemm) vs double (the plain loop), every transpose combination, beta 0 and 1, padded
// leading dimensions. fp32 dot products of K terms: error ≤ ~K·ε·Σ|a·b|; we bound it by
// (8 + 2√K)·ε·max Σ|a·b| (the measured worst is far below).
TEST(NnGemm, FloatMatchesDoubleForEveryTranspose) {
  std::mt19937_64 rng(1);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (double beta : {0.0, 1.0}) {
        const Index M = 7, N = 13, K = 37, pad = 3;
        const Index lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
        const std::vector<double> A = randn(static_cast<std::size_t>((ta ? K : M) * lda), rng);
        const std::vector<double> B = randn(static_cast<std::size_t>((tb ? N : K) * ldb), rng);
        std::vector<double> C = randn(static_cast<std::size_t>(M * ldc), rng);
        std::vector<float> Af(A.begin(), A.end()), Bf(B.begin(), B.end()), Cf(C.begin(), C.end());
        gemm<double>(ta, tb, M, N, K, 1.5, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
        gemm<float>(ta, tb, M, N, K, 1.5f, Af.data(), lda, Bf.data(), ldb, static_cast<float>(beta), Cf.data(), ldc);
        // the plain definition, for the double loop itself
        double absum = 0;
        for (Index i = 0; i < M; ++i)
          for (Index j = 0; j < N; ++j) {
            double s = 0, a_b = 0;
            for (Index k = 0; k < K; ++k) {
              const double a = ta ? A[static_cast<std::size_t>(k * lda + i)] : A[static_cast<std::size_t>(i * lda + k)];
              const double b = tb ? B[static_cast<std::size_t>(j * ldb + k)] : B[static_cast<std::size_t>(k * ldb + j)];
              s += a * b;
              a_b += std::fabs(a * b);
            }
            absum = std::max(absum, 1.5 * a_b);
            (void)s;
          }
        std::vector<double> c_rows;
        std::vector<float> cf_rows;
        for (Index i = 0; i < M; ++i)
          for (Index j = 0; j < N; ++j) {
            c_rows.push_back(C[static_cast<std::size_t>(i * ldc + j)]);
            cf_rows.push_back(Cf[static_cast<std::size_t>(i * ldc + j)]);
          }
        BasicTensor<double> ref({M * N});
        std::copy(c_rows.begin(), c_rows.end(), ref.data());
        EXPECT_TRUE(testing::all_close(ConstView(cf_rows.data(), {M * N}), ref,
                                       testing::Tol{8 + 2 * std::sqrt(double(K)), absum + 4}, "C"))
            << "ta=" << ta << " tb=" << tb << " beta=" << beta;
      }
}

TEST(NnGemm, DoubleLoopIsTheDefinitionAndKZeroScales) {
  // [[1,2],[3,4]] · [[5,6],[7,8]] = [[19,22],[43,50]]; beta = 1 adds C.
  const double A[] = {1, 2, 3, 4}, B[] = {5, 6, 7, 8};
  double C[] = {1, 1, 1, 1};
  gemm<double>(false, false, 2, 2, 2, 1.0, A, 2, B, 2, 1.0, C, 2);
  EXPECT_EQ(C[0], 20);
  EXPECT_EQ(C[1], 23);
  EXPECT_EQ(C[2], 44);
  EXPECT_EQ(C[3], 51);
  float Cf[] = {NAN, NAN};  // K = 0, beta = 0: C is written 0 without being read
  gemm<float>(false, false, 1, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, Cf, 2);
  EXPECT_EQ(Cf[0], 0.0f);
  EXPECT_EQ(Cf[1], 0.0f);
}

// ---- Linear --------------------------------------------------------------------------------------

TEST(NnLayers, LinearWithAndWithoutBias) {
  std::mt19937_64 rng(2);
  const Index N = 6, C = 9, OC = 5;
  for (bool with_bias : {true, false}) {
    auto layer = [&](const auto& in, const auto* dy, auto* g) {
      using R = ScalarOf<decltype(in)>;
      std::vector<R> y(static_cast<std::size_t>(N * OC));
      const R* b = with_bias ? in[2].data() : nullptr;
      linear_forward(y.data(), in[0].data(), in[1].data(), b, N, C, OC);
      if (dy)
        linear_backward((*g)[0].data(), (*g)[1].data(), with_bias ? (*g)[2].data() : nullptr, dy->data(),
                        in[0].data(), in[1].data(), N, C, OC);
      return y;
    };
    Vecs<double> in{randn(N * C, rng), randn(OC * C, rng, 0.3), randn(OC, rng)};
    check_layer(layer, in, {{"inp", "weight", "bias"}}, rng);
  }
}

// ---- Activations and FFN ---------------------------------------------------------------------------

const Activation kActs[] = {Activation::kRelu, Activation::kGelu, Activation::kGeluTanh};

TEST(NnLayers, Activations) {
  std::mt19937_64 rng(3);
  const Index N = 50;
  for (Activation act : kActs) {
    auto layer = [&](const auto& in, const auto* dy, auto* g) {
      using R = ScalarOf<decltype(in)>;
      std::vector<R> y(static_cast<std::size_t>(N));
      activation_forward(y.data(), in[0].data(), N, act);
      if (dy) activation_backward((*g)[0].data(), dy->data(), in[0].data(), N, act);
      return y;
    };
    SCOPED_TRACE(static_cast<int>(act));
    check_layer(layer, {randn(N, rng, 2.0)}, {{"inp"}, 8, 8}, rng);
  }
}

TEST(NnLayers, FfnEveryActivation) {
  std::mt19937_64 rng(4);
  const Index N = 5, C = 8, F = 16;
  for (Activation act : kActs) {
    auto layer = [&](const auto& in, const auto* dy, auto* g) {
      using R = ScalarOf<decltype(in)>;
      std::vector<R> y(static_cast<std::size_t>(N * C)), h(static_cast<std::size_t>(N * F)), a(h.size());
      ffn_forward(y.data(), h.data(), a.data(), in[0].data(), in[1].data(), in[2].data(), in[3].data(),
                  in[4].data(), N, C, F, act);
      if (dy)
        ffn_backward((*g)[0].data(), (*g)[1].data(), (*g)[2].data(), (*g)[3].data(), (*g)[4].data(), dy->data(),
                     in[0].data(), h.data(), a.data(), in[1].data(), in[3].data(), N, C, F, act);
      return y;
    };
    SCOPED_TRACE(static_cast<int>(act));
    Vecs<double> in{randn(N * C, rng), randn(F * C, rng, 0.35), randn(F, rng, 0.1), randn(C * F, rng, 0.25),
                    randn(C, rng, 0.1)};
    check_layer(layer, in, {{"inp", "w1", "b1", "w2", "b2"}}, rng);
  }
}

// ---- Residual ----------------------------------------------------------------------------------------

TEST(NnLayers, Residual) {
  std::mt19937_64 rng(5);
  const Index N = 12;
  auto layer = [&](const auto& in, const auto* dy, auto* g) {
    using R = ScalarOf<decltype(in)>;
    std::vector<R> y(static_cast<std::size_t>(N));
    residual_forward(y.data(), in[0].data(), in[1].data(), N);
    if (dy) residual_backward((*g)[0].data(), (*g)[1].data(), dy->data(), N);
    return y;
  };
  check_layer(layer, {randn(N, rng), randn(N, rng)}, {{"inp1", "inp2"}, 1, 0}, rng);
}

// ---- Embeddings ----------------------------------------------------------------------------------------

TEST(NnLayers, TokenEmbeddingWithRepeatedTokens) {
  std::mt19937_64 rng(6);
  const Index B = 2, T = 4, C = 5, V = 7;
  const std::vector<std::int32_t> tokens{3, 0, 3, 6, 1, 1, 1, 3};  // repeats: rows of dwte collect sums
  auto layer = [&](const auto& in, const auto* dy, auto* g) {
    using R = ScalarOf<decltype(in)>;
    std::vector<R> y(static_cast<std::size_t>(B * T * C));
    token_embedding_forward(y.data(), tokens.data(), in[0].data(), B, T, C, V);
    if (dy) token_embedding_backward((*g)[0].data(), dy->data(), tokens.data(), B, T, C, V);
    return y;
  };
  check_layer(layer, {randn(V * C, rng)}, {{"wte"}, 0, 2}, rng);
}

TEST(NnLayers, LearnedPositions) {
  std::mt19937_64 rng(7);
  const Index B = 3, T = 4, Tmax = 6, C = 5;  // a table longer than T: only its first T rows are used
  auto layer = [&](const auto& in, const auto* dy, auto* g) {
    using R = ScalarOf<decltype(in)>;
    std::vector<R> y(static_cast<std::size_t>(B * T * C));
    position_forward(y.data(), in[0].data(), in[1].data(), B, T, C);
    if (dy) position_backward((*g)[0].data(), (*g)[1].data(), dy->data(), B, T, C);
    return y;
  };
  check_layer(layer, {randn(B * T * C, rng), randn(Tmax * C, rng)}, {{"inp", "wpe"}, 1, 4}, rng);
}

// ---- Attention -------------------------------------------------------------------------------------

struct AttnCase {
  bool causal;
  std::vector<Index> lengths;
};

TEST(NnLayers, ScaledDotProductAttention) {
  std::mt19937_64 rng(8);
  const Index B = 2, T = 5, C = 6, H = 2;
  for (const AttnCase& ac : {AttnCase{true, {}}, AttnCase{false, {}}, AttnCase{true, {3, 5}},
                             AttnCase{false, {5, 2}}, AttnCase{false, {0, 4}}}) {
    auto layer = [&](const auto& in, const auto* dy, auto* g) {
      using R = ScalarOf<decltype(in)>;
      std::vector<R> ctx(static_cast<std::size_t>(B * T * C)), att(static_cast<std::size_t>(B * H * T * T));
      sdpa_forward(ctx.data(), att.data(), in[0].data(), in[1].data(), in[2].data(), ac.lengths, B, T, C, H,
                   ac.causal);
      if (dy)
        sdpa_backward((*g)[0].data(), (*g)[1].data(), (*g)[2].data(), dy->data(), in[0].data(), in[1].data(),
                      in[2].data(), att.data(), ac.lengths, B, T, C, H, ac.causal);
      return ctx;
    };
    SCOPED_TRACE(::testing::Message() << "causal " << ac.causal << ", lengths " << ac.lengths.size());
    check_layer(layer, {randn(B * T * C, rng), randn(B * T * C, rng), randn(B * T * C, rng)},
                {{"q", "k", "v"}, 16, 32}, rng);
  }
}

// The whole layer (q, k, v, o projections with bias) on the double and float paths.
template <typename R>
struct AttnBuffers {
  std::vector<R> q, k, v, att, ctx;
  AttnBuffers(Index B, Index T, Index C, Index H)
      : q(static_cast<std::size_t>(B * T * C)), k(q.size()), v(q.size()), att(static_cast<std::size_t>(B * H * T * T)),
        ctx(q.size()) {}
  AttentionActs<R> acts() { return {q.data(), k.data(), v.data(), att.data(), ctx.data()}; }
};

TEST(NnLayers, MultiHeadAttention) {
  std::mt19937_64 rng(9);
  const Index B = 2, T = 5, C = 8, H = 2;
  for (const AttnCase& ac : {AttnCase{true, {}}, AttnCase{false, {}}, AttnCase{true, {4, 2}},
                             AttnCase{false, {3, 5}}}) {
    auto layer = [&](const auto& in, const auto* dy, auto* g) {
      using R = ScalarOf<decltype(in)>;
      AttnBuffers<R> buf(B, T, C, H);
      const AttentionParams<R> p{in[1].data(), in[2].data(), in[3].data(), in[4].data(),
                                 in[5].data(), in[6].data(), in[7].data(), in[8].data()};
      std::vector<R> y(static_cast<std::size_t>(B * T * C));
      attention_forward(y.data(), buf.acts(), in[0].data(), p, ac.lengths, B, T, C, H, ac.causal);
      if (dy) {
        auto& G = *g;
        const AttentionGrads<R> grads{G[1].data(), G[2].data(), G[3].data(), G[4].data(),
                                      G[5].data(), G[6].data(), G[7].data(), G[8].data()};
        attention_backward(G[0].data(), grads, dy->data(), in[0].data(), p, buf.acts(), ac.lengths, B, T, C, H,
                           ac.causal);
      }
      return y;
    };
    SCOPED_TRACE(::testing::Message() << "causal " << ac.causal << ", lengths " << ac.lengths.size());
    const double ws = 1 / std::sqrt(double(C));
    Vecs<double> in{randn(B * T * C, rng)};
    for (int i = 0; i < 4; ++i) {
      in.push_back(randn(C * C, rng, ws));
      in.push_back(randn(C, rng, 0.1));
    }
    check_layer(layer, in, {{"inp", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo"}, 32, 64, 200, true, {4}}, rng);
  }
}

// ---- Cross-entropy ---------------------------------------------------------------------------------

TEST(NnLayers, CrossEntropyWithIgnoredAndPaddedPositions) {
  std::mt19937_64 rng(10);
  const Index B = 2, T = 4, V = 6;
  const std::vector<std::int32_t> targets{2, -100, 5, 0, 1, 1, 3, 4};  // (0,1) ignored
  for (const std::vector<Index>& lengths : {std::vector<Index>{}, std::vector<Index>{4, 2}}) {
    auto layer = [&](const auto& in, const auto* dy, auto* g) {
      using R = ScalarOf<decltype(in)>;
      std::vector<R> probs(static_cast<std::size_t>(B * T * V));
      const double loss = cross_entropy_forward(probs.data(), in[0].data(), targets.data(), lengths, B, T, V);
      if (dy) cross_entropy_backward((*g)[0].data(), probs.data(), targets.data(), lengths, B, T, V, (*dy)[0]);
      return std::vector<R>{static_cast<R>(loss)};
    };
    check_layer(layer, {randn(B * T * V, rng, 2.0)}, {{"logits"}, 4, 8}, rng);
  }
}

// ---- DyT, LayerNorm, RMSNorm ---------------------------------------------------------------------

TEST(NnLayers, DynamicTanh) {
  std::mt19937_64 rng(11);
  const Index N = 6, C = 7;
  auto layer = [&](const auto& in, const auto* dy, auto* g) {
    using R = ScalarOf<decltype(in)>;
    std::vector<R> y(static_cast<std::size_t>(N * C));
    dyt_forward(y.data(), in[0].data(), in[1].data(), in[2].data(), in[3].data(), N, C);
    if (dy)
      dyt_backward((*g)[0].data(), (*g)[1].data(), (*g)[2].data(), (*g)[3].data(), dy->data(), in[0].data(),
                   in[1].data(), in[2].data(), N, C);
    return y;
  };
  check_layer(layer, {randn(N * C, rng, 2.0), {kDytAlphaInit}, randn(C, rng, 0.5, 1.0), randn(C, rng, 0.1)},
              {{"inp", "alpha", "gamma", "beta"}, 8, 16}, rng);
}

// BatchNorm over the sequence: training (batch statistics over the real positions) and eval (given
// running statistics), with and without padding. The padded rows of y and dinp are 0.
TEST(NnLayers, BatchNormOverTheSequence) {
  std::mt19937_64 rng(13);
  const Index B = 3, T = 5, C = 7;
  const std::vector<double> rm = randn(C, rng, 0.3, 0.2), rv = randn(C, rng, 0.2, 1.5);
  for (bool training : {true, false})
    for (const std::vector<Index>& lengths : {std::vector<Index>{}, std::vector<Index>{5, 2, 0}}) {
      auto layer = [&](const auto& in, const auto* dy, auto* g) {
        using R = ScalarOf<decltype(in)>;
        std::vector<R> y(static_cast<std::size_t>(B * T * C)), mean(rm.begin(), rm.end()), var(rv.begin(), rv.end());
        batchnorm_forward(y.data(), mean.data(), var.data(), in[0].data(), in[1].data(), in[2].data(), lengths, B, T,
                          C, training);
        if (dy) {
          const std::vector<R> m0(rm.begin(), rm.end()), v0(rv.begin(), rv.end());
          batchnorm_backward((*g)[0].data(), (*g)[1].data(), (*g)[2].data(), dy->data(), in[0].data(), in[1].data(),
                             m0.data(), v0.data(), lengths, B, T, C, training);
        }
        return y;
      };
      SCOPED_TRACE(::testing::Message() << "training " << training << ", lengths " << lengths.size());
      check_layer(layer, {randn(B * T * C, rng, 2.0, 0.5), randn(C, rng, 0.5, 1.0), randn(C, rng, 0.1)},
                  {{"inp", "weight", "bias"}, 8, 16}, rng);
      // padded rows: y and dinp are 0; the running statistics follow PyTorch's update in training
      std::vector<double> x = randn(B * T * C, rng), y(x.size()), dx(x.size(), 0.0), dy = randn(x.size(), rng);
      std::vector<double> mean(rm), var(rv), w(C, 1.0), dw(C, 0.0), db(C, 0.0);
      batchnorm_forward(y.data(), mean.data(), var.data(), x.data(), w.data(), static_cast<const double*>(nullptr),
                        lengths, B, T, C, training);
      batchnorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), rm.data(), rv.data(),
                         lengths, B, T, C, training);
      Index n = 0;
      std::vector<double> sum(C, 0.0);
      for (Index b = 0; b < B; ++b)
        for (Index t = 0; t < T; ++t)
          for (Index c = 0; c < C; ++c) {
            const std::size_t i = static_cast<std::size_t>((b * T + t) * C + c);
            const bool real = lengths.empty() || t < lengths[static_cast<std::size_t>(b)];
            if (!real) {
              EXPECT_EQ(y[i], 0.0);
              EXPECT_EQ(dx[i], 0.0);
            } else {
              sum[static_cast<std::size_t>(c)] += x[i];
              if (c == 0) ++n;
            }
          }
      for (Index c = 0; c < C; ++c) {
        const double expect = training ? 0.9 * rm[static_cast<std::size_t>(c)] + 0.1 * sum[static_cast<std::size_t>(c)] / n
                                       : rm[static_cast<std::size_t>(c)];
        EXPECT_NEAR(mean[static_cast<std::size_t>(c)], expect, 1e-14);
      }
    }
  // errors: eval without running statistics; training on one real position
  std::vector<float> x(static_cast<std::size_t>(B * T * C), 1.0f), y(x.size());
  EXPECT_NL_ERROR(batchnorm_forward<float>(y.data(), nullptr, nullptr, x.data(), nullptr, nullptr, {}, B, T, C, false),
                  "eval mode needs the running statistics");
  const std::vector<Index> one{1, 0, 0};
  EXPECT_NL_ERROR(batchnorm_forward<float>(y.data(), nullptr, nullptr, x.data(), nullptr, nullptr, one, B, T, C, true),
                  "more than 1 value per channel");
}

TEST(NnLayers, LayerNormAdapter) {
  std::mt19937_64 rng(12);
  const Index N = 5, C = 11;
  auto layer = [&](const auto& in, const auto* dy, auto* g) {
    using R = ScalarOf<decltype(in)>;
    std::vector<R> y(static_cast<std::size_t>(N * C)), mean(static_cast<std::size_t>(N)), rstd(mean.size());
    layernorm_forward(y.data(), mean.data(), rstd.data(), in[0].data(), in[1].data(), in[2].data(), N, C);
    if (dy)
      layernorm_backward((*g)[0].data(), (*g)[1].data(), (*g)[2].data(), dy->data(), in[0].data(), in[1].data(), N,
                         C);
    return y;
  };
  check_layer(layer, {randn(N * C, rng, 2.0, 0.5), randn(C, rng, 0.5, 1.0), randn(C, rng, 0.1)},
              {{"inp", "weight", "bias"}, 8, 16}, rng);
}

TEST(NnLayers, RmsNormAdapter) {
  std::mt19937_64 rng(13);
  const Index N = 5, C = 11;
  auto layer = [&](const auto& in, const auto* dy, auto* g) {
    using R = ScalarOf<decltype(in)>;
    std::vector<R> y(static_cast<std::size_t>(N * C)), rstd(static_cast<std::size_t>(N));
    rmsnorm_forward(y.data(), rstd.data(), in[0].data(), in[1].data(), N, C);
    if (dy) rmsnorm_backward((*g)[0].data(), (*g)[1].data(), dy->data(), in[0].data(), in[1].data(), N, C);
    return y;
  };
  check_layer(layer, {randn(N * C, rng, 2.0, 0.5), randn(C, rng, 0.5, 1.0)}, {{"inp", "weight"}, 8, 16}, rng);
}

}  // namespace
}  // namespace normlab::nn
