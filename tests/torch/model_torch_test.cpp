// The Transformer engine (include/normlab/nn/model.h) against LibTorch autograd (libtorch 1.13, CPU).
//
// For every implemented placement, a 3-block model is written a second time with plain torch ops
// (float64, requires_grad), from the formulas of docs/placements.md, on the SAME weights (copied from
// Model::params()); the mean cross-entropy is backpropagated by autograd. Compared:
//   the float Model vs LibTorch float64: loss and every parameter gradient with all_close / Tol
//     (k fp32 epsilons × the tensor's largest gradient, floored at 1e-3 × the model's largest; a gradient
//     that is 0 in exact arithmetic — attention's key bias — is measured against the model's largest);
//   the float64 network (src/nn/block.h) vs LibTorch float64: relative 1e-10 (semantics, exactly).
#include <normlab/nn/model.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "nn/block.h"
#include "nn/layer_check.h"

namespace normlab::nn {
namespace {

namespace F = torch::nn::functional;
using TParams = std::map<std::string, torch::Tensor>;

torch::Tensor tnorm(const ModelConfig& c, TParams& P, const std::string& name, const torch::Tensor& x,
                    double scale = 1.0) {
  torch::Tensor y;
  switch (c.norm) {
    case NormKind::kLayerNorm:
      y = F::layer_norm(x, F::LayerNormFuncOptions({c.d_model}).weight(P[name + ".weight"]).bias(P[name + ".bias"]).eps(c.norm_eps));
      break;
    case NormKind::kRmsNorm:
      y = x * torch::rsqrt(x.pow(2).mean(-1, true) + c.norm_eps) * P[name + ".weight"];
      break;
    case NormKind::kBatchNorm: {  // BatchNorm1d over (B·T) per channel, training mode, running stats updated
      const int64_t C = c.d_model;
      if (P.find(name + ".running_mean") == P.end()) {
        P[name + ".running_mean"] = torch::zeros({C}, torch::kFloat64);
        P[name + ".running_var"] = torch::ones({C}, torch::kFloat64);
      }
      y = F::batch_norm(x.reshape({-1, C}), P[name + ".running_mean"], P[name + ".running_var"],
                        F::BatchNormFuncOptions().weight(P[name + ".weight"]).bias(P[name + ".bias"])
                            .training(true).momentum(0.1).eps(c.norm_eps))
              .view(x.sizes());
      break;
    }
    default:  // DyT
      y = P[name + ".weight"] * torch::tanh(P[name + ".alpha"] * x) + P[name + ".bias"];
      break;
  }
  return y * scale;
}

torch::Tensor tlinear(TParams& P, const std::string& name, const torch::Tensor& x) {
  return F::linear(x, P[name + ".weight"], P[name + ".bias"]);
}

torch::Tensor tattn(const ModelConfig& c, TParams& P, const std::string& pre, const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = c.d_model, H = c.heads, hs = C / H;
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, H, hs}).transpose(1, 2); };
  torch::Tensor q = heads(tlinear(P, pre + "attn.q", x)), k = heads(tlinear(P, pre + "attn.k", x)),
                v = heads(tlinear(P, pre + "attn.v", x));
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hs));
  if (c.causal) scores = scores.masked_fill(torch::ones({T, T}, torch::kBool).triu(1), -INFINITY);
  torch::Tensor ctx = torch::matmul(torch::softmax(scores, -1), v).transpose(1, 2).contiguous().view({B, T, C});
  return tlinear(P, pre + "attn.o", ctx);
}

torch::Tensor tffn(const ModelConfig& c, TParams& P, const std::string& pre, const torch::Tensor& x) {
  torch::Tensor h = tlinear(P, pre + "ffn.w1", x);
  return tlinear(P, pre + "ffn.w2", c.gelu ? torch::gelu(h) : torch::relu(h));
}

// The whole LM, from the placement formulas of docs/placements.md.
torch::Tensor torch_loss(const ModelConfig& c, TParams& P, const std::vector<std::int32_t>& tokens,
                         const std::vector<std::int32_t>& targets, int64_t B, int64_t T) {
  const int64_t C = c.d_model, L = c.layers;
  torch::Tensor ids = torch::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), torch::kLong).view({B, T});
  torch::Tensor pe = torch::zeros({T, C}, torch::kFloat64);  // sin/cos of t·10000^(−2⌊j/2⌋/C)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < C; ++j) {
      const double ang = static_cast<double>(t) * std::pow(10000.0, -2.0 * static_cast<double>(j / 2) / static_cast<double>(C));
      pe[t][j] = j % 2 == 0 ? std::sin(ang) : std::cos(ang);
    }
  torch::Tensor x = F::embedding(ids, P["wte"]) + pe.unsqueeze(0);
  if (c.placement == Placement::kSiamese) {  // the official SiameseNorm block (DeiT version), c = √(2(i+1))
    torch::Tensor y = x;
    for (int l = 0; l < L; ++l) {
      const std::string p = "blocks." + std::to_string(l) + ".";
      const double cl = std::sqrt(2.0 * (l + 1));
      x = tnorm(c, P, p + "norm1_post", x);
      torch::Tensor z = tattn(c, P, p, tnorm(c, P, p + "norm1_in", x + tnorm(c, P, p + "norm1_pre", y)));
      x = x + z / cl, y = y + z;
      x = tnorm(c, P, p + "norm2_post", x);
      z = tffn(c, P, p, tnorm(c, P, p + "norm2_in", x + tnorm(c, P, p + "norm2_pre", y)));
      x = x + z / cl, y = y + z;
    }
    x = tnorm(c, P, "ln_f", tnorm(c, P, "ln_f_x", x) + tnorm(c, P, "ln_f_y", y));
    torch::Tensor logits = tlinear(P, "head", x).view({B * T, c.vocab});
    torch::Tensor tgt = torch::tensor(std::vector<int64_t>(targets.begin(), targets.end()), torch::kLong);
    return F::cross_entropy(logits, tgt, F::CrossEntropyFuncOptions().ignore_index(-1));
  }
  const int n_post = c.placement == Placement::kMixLN ? static_cast<int>(std::floor(c.mixln_alpha * L)) : 0;
  bool final_norm = false;
  for (int l = 0; l < L; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    Placement style = c.placement;
    if (style == Placement::kMixLN) style = l < n_post ? Placement::kPost : Placement::kPre;
    final_norm = false;
    switch (style) {
      case Placement::kPost:
      case Placement::kDeepNorm: {
        const double a = style == Placement::kDeepNorm ? std::pow(2.0 * L, 0.25) : 1.0;
        x = tnorm(c, P, p + "norm1", a * x + tattn(c, P, p, x));
        x = tnorm(c, P, p + "norm2", a * x + tffn(c, P, p, x));
        break;
      }
      case Placement::kPre:
      case Placement::kLNS: {
        const double s = style == Placement::kLNS ? 1.0 / std::sqrt(l + 1.0) : 1.0;
        x = x + tattn(c, P, p, tnorm(c, P, p + "norm1", x, s));
        x = x + tffn(c, P, p, tnorm(c, P, p + "norm2", x, s));
        final_norm = true;
        break;
      }
      case Placement::kSandwich:
        x = x + tnorm(c, P, p + "norm1_out", tattn(c, P, p, tnorm(c, P, p + "norm1", x)));
        x = x + tnorm(c, P, p + "norm2_out", tffn(c, P, p, tnorm(c, P, p + "norm2", x)));
        final_norm = true;
        break;
      case Placement::kB2T: {
        torch::Tensor h = tnorm(c, P, p + "norm1", x + tattn(c, P, p, x));
        x = tnorm(c, P, p + "norm2", h + tffn(c, P, p, h) + x);
        break;
      }
      case Placement::kNone:
        x = x + tattn(c, P, p, x);
        x = x + tffn(c, P, p, x);
        break;
      default:
        ADD_FAILURE() << "no LibTorch version of " << placement_name(style);
    }
  }
  if (final_norm) x = tnorm(c, P, "ln_f", x);
  torch::Tensor logits = tlinear(P, "head", x).view({B * T, c.vocab});
  torch::Tensor tgt = torch::tensor(std::vector<int64_t>(targets.begin(), targets.end()), torch::kLong);
  return F::cross_entropy(logits, tgt, F::CrossEntropyFuncOptions().ignore_index(-1));
}

void compare(const ModelConfig& c) {
  SCOPED_TRACE(std::string(placement_name(c.placement)) + " norm " + std::to_string(static_cast<int>(c.norm)));
  const int64_t B = 2, T = 6;
  std::mt19937_64 rng(c.seed + 100);
  std::vector<std::int32_t> tokens, targets;
  for (int64_t i = 0; i < B * T; ++i) {
    tokens.push_back(static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(c.vocab)));
    targets.push_back(static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(c.vocab)));
  }
  targets[3] = -1;

  Model m(c);
  Transformer<double> net(c);
  std::vector<ParamRef> pf = m.params();
  TParams P;
  for (std::size_t t = 0; t < pf.size(); ++t) {
    std::vector<double> v(pf[t].data, pf[t].data + pf[t].numel());
    std::copy(v.begin(), v.end(), net.params()[t].data);  // the double network: the same (float) weights
    P[pf[t].name] = torch::tensor(v, torch::kFloat64).view(pf[t].shape.vec()).requires_grad_(true);
  }
  torch::Tensor tl = torch_loss(c, P, tokens, targets, B, T);
  tl.backward();
  const double ref = tl.item<double>();

  const double lf = m.forward(tokens.data(), targets.data(), B, T);
  const double ld = net.forward(tokens.data(), targets.data(), B, T);
  m.backward();
  net.backward();
  EXPECT_NEAR(lf, ref, 64 * 1.19e-7 * ref);
  EXPECT_NEAR(ld, ref, 1e-12 * ref);

  // BatchNorm: the running statistics after this one training forward, LibTorch's update rule
  std::vector<ParamRef> bf = m.buffers();
  ASSERT_EQ(bf.size(), net.buffers().size());
  for (std::size_t t = 0; t < bf.size(); ++t) {
    ASSERT_TRUE(P.count(bf[t].name)) << bf[t].name;
    const torch::Tensor r = P[bf[t].name];
    const std::vector<double> ref_v(r.data_ptr<double>(), r.data_ptr<double>() + r.numel());
    EXPECT_TRUE(testing::float_matches(std::vector<float>(bf[t].data, bf[t].data + bf[t].numel()), ref_v, 64,
                                       bf[t].name + " (float)", 1.0));
    for (Index i = 0; i < bf[t].numel(); ++i)
      EXPECT_NEAR(net.buffers()[t].data[i], ref_v[static_cast<std::size_t>(i)], 1e-12 * (1 + std::fabs(ref_v[static_cast<std::size_t>(i)])))
          << bf[t].name;
  }

  std::vector<std::vector<double>> g_ref;
  double gmax = 0;
  for (const ParamRef& r : pf) {
    torch::Tensor g = P[r.name].grad();
    g_ref.push_back(g.defined() ? std::vector<double>(g.data_ptr<double>(), g.data_ptr<double>() + g.numel())
                                : std::vector<double>(static_cast<std::size_t>(r.numel()), 0.0));
    gmax = std::max(gmax, testing::max_abs(g_ref.back()));
  }
  for (std::size_t t = 0; t < pf.size(); ++t) {
    const bool zero = testing::max_abs(g_ref[t]) <= 1e-12 * gmax;
    const std::vector<float> gf(pf[t].grad, pf[t].grad + pf[t].numel());
    EXPECT_TRUE(testing::float_matches(gf, g_ref[t], 512, "d" + pf[t].name + " (float)", zero ? gmax : 1e-3 * gmax));
    const auto& e = net.params()[t];
    for (Index i = 0; i < e.numel(); ++i) {
      const double bound = 1e-10 * (zero ? gmax : std::max(testing::max_abs(g_ref[t]), 1e-3 * gmax));
      if (!(std::fabs(e.grad[i] - g_ref[t][static_cast<std::size_t>(i)]) <= bound)) {
        ADD_FAILURE() << "d" << e.name << "[" << i << "] (double): normlab " << e.grad[i] << ", LibTorch "
                      << g_ref[t][static_cast<std::size_t>(i)];
        break;
      }
    }
  }
}

ModelConfig small(Placement p, NormKind n = NormKind::kLayerNorm) {
  ModelConfig c;
  c.placement = p;
  c.norm = n;
  c.layers = 3;
  c.d_model = 16;
  c.heads = 4;
  c.ffn = 32;
  c.vocab = 20;
  c.max_seq = 8;
  c.seed = 5;
  return c;
}

TEST(NnModelTorch, EveryPlacementMatchesLibTorchAutograd) {
  for (Placement p : {Placement::kPost, Placement::kPre, Placement::kSandwich, Placement::kDeepNorm, Placement::kB2T,
                      Placement::kMixLN, Placement::kLNS, Placement::kSiamese, Placement::kNone})
    compare(small(p));
}

TEST(NnModelTorch, RmsNormAndDyTMatchLibTorchAutograd) {
  for (Placement p : {Placement::kPost, Placement::kPre, Placement::kSandwich, Placement::kSiamese})
    for (NormKind n : {NormKind::kRmsNorm, NormKind::kDyT}) compare(small(p, n));
}

TEST(NnModelTorch, BatchNormOverTheSequenceMatchesLibTorchAutograd) {
  for (Placement p : {Placement::kPost, Placement::kPre, Placement::kSandwich, Placement::kSiamese})
    compare(small(p, NormKind::kBatchNorm));
}

TEST(NnModelTorch, MixLnWithPostBlocksMatchesLibTorchAutograd) {
  ModelConfig c = small(Placement::kMixLN);
  c.layers = 4;
  c.mixln_alpha = 0.5;  // ⌊0.5·4⌋ = 2 Post-LN blocks, then 2 Pre-LN blocks (3 blocks at α = 0.25: all Pre-LN)
  compare(c);
}

}  // namespace
}  // namespace normlab::nn
