// The Transformer engine (include/normlab/nn/model.h, src/nn/block.h):
//   every placement builds and starts near ln V; the double network's backward vs float64 central
//   finite differences of the loss (a sample of entries of every parameter tensor); the float Model
//   vs the double network; errors; seeded, deterministic init; instrumentation.
// The LibTorch comparison of every placement is tests/torch/model_torch_test.cpp.
#include <normlab/nn/model.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "nn/block.h"
#include "nn/layer_check.h"

namespace normlab::nn {
namespace {

const Placement kImplemented[] = {Placement::kPost,  Placement::kPre,   Placement::kSandwich, Placement::kDeepNorm,
                                  Placement::kB2T,   Placement::kMixLN, Placement::kLNS,      Placement::kSiamese,
                                  Placement::kNone};
const NormKind kNorms[] = {NormKind::kLayerNorm, NormKind::kRmsNorm, NormKind::kDyT, NormKind::kBatchNorm};

ModelConfig tiny(Placement p, NormKind n = NormKind::kLayerNorm) {
  ModelConfig c;
  c.placement = p;
  c.norm = n;
  c.layers = 2;
  c.d_model = 8;
  c.heads = 2;
  c.ffn = 16;
  c.vocab = 11;
  c.max_seq = 8;
  c.seed = 7;
  return c;
}

struct Batch {
  Index B = 2, T = 5;
  std::vector<std::int32_t> tokens, targets;
};
Batch make_batch(int V, Index B, Index T, std::uint64_t seed, bool ignore_some = true) {
  Batch b{B, T, {}, {}};
  std::mt19937_64 rng(seed);
  for (Index i = 0; i < B * T; ++i) {
    b.tokens.push_back(static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(V)));
    b.targets.push_back(static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(V)));
  }
  if (ignore_some) b.targets[1] = -1;
  return b;
}

std::string label(const ModelConfig& c) {
  return std::string(placement_name(c.placement)) + "/norm" + std::to_string(static_cast<int>(c.norm));
}

// ---- builds, ln V at init ----------------------------------------------------------------------------

TEST(NnModel, EveryPlacementAndNormStartsNearLnV) {
  for (Placement p : kImplemented)
    for (NormKind n : kNorms) {
      ModelConfig c = tiny(p, n);
      c.layers = 4, c.d_model = 32, c.heads = 4, c.ffn = 64, c.vocab = 64, c.max_seq = 16;
      Model m(c);
      const Batch b = make_batch(c.vocab, 4, 16, 3, false);
      const double loss = m.forward(b.tokens.data(), b.targets.data(), b.B, b.T);
      // logits = xf·Wᵀ with Xavier W: variance ≈ 2C/(C+V)·E[xf²] ≈ 0.7 for unit xf, so loss ≈ ln V + 0.35
      EXPECT_TRUE(std::isfinite(loss)) << label(c);
      // Without any norm the head sees the raw stream (variance ≫ 1 after the N(0,1) embedding): far above
      // ln V, which is what "no normalization" means.
      if (p != Placement::kNone) {
        EXPECT_NEAR(loss, std::log(64.0), 0.25 * std::log(64.0)) << label(c);
      }
      m.backward();
      for (const ParamRef& r : m.params())
        for (Index i = 0; i < r.numel(); ++i) ASSERT_TRUE(std::isfinite(r.grad[i])) << label(c) << " " << r.name;
    }
}

// ---- backward vs finite differences (double) -------------------------------------------------------------

// Up to `probes` evenly spaced entries of every parameter tensor: |analytic − fd| ≤ 1e-6·max(|fd|, max|g|
// of the tensor) + 1e-9 (h = 1e-5; the loss is O(1), so rounding in the difference is ~1e-11).
// eval: BatchNorm in eval mode, its running statistics moved by 3 training forwards first.
void check_fd(const ModelConfig& c, const Batch& b, std::span<const Index> lengths = {}, int probes = 6,
              bool eval = false) {
  Transformer<double> net(c);
  if (eval) {
    for (int i = 0; i < 3; ++i) net.forward(b.tokens.data(), b.targets.data(), b.B, b.T, lengths);
    net.set_training(false);
  }
  net.forward(b.tokens.data(), b.targets.data(), b.B, b.T, lengths);
  net.backward();
  std::vector<std::vector<double>> g;
  for (const auto& p : net.params()) g.emplace_back(p.grad, p.grad + p.numel());
  const double h = 1e-5;
  int bad = 0;
  for (std::size_t t = 0; t < net.params().size(); ++t) {
    ParamEntry<double> p = net.params()[t];
    const double gscale = testing::max_abs(g[t]);
    const Index n = p.numel(), step = std::max<Index>(1, n / probes);
    for (Index i = 0; i < n; i += step) {
      const double keep = p.data[i];
      p.data[i] = keep + h;
      const double lp = net.forward(b.tokens.data(), b.targets.data(), b.B, b.T, lengths);
      p.data[i] = keep - h;
      const double lm = net.forward(b.tokens.data(), b.targets.data(), b.B, b.T, lengths);
      p.data[i] = keep;
      const double fd = (lp - lm) / (2 * h);
      const double an = g[t][static_cast<std::size_t>(i)];
      const double tol = 1e-6 * std::max(std::fabs(fd), gscale) + 1e-9;
      if (std::fabs(an - fd) > tol && bad++ < 5)
        ADD_FAILURE() << label(c) << ": d" << p.name << "[" << i << "] analytic " << an << " vs finite difference "
                      << fd << " (tolerance " << tol << ")";
    }
  }
}

TEST(NnModel, BackwardMatchesFiniteDifferencesForEveryPlacement) {
  for (Placement p : kImplemented) check_fd(tiny(p), make_batch(11, 2, 5, 11));
}

TEST(NnModel, BackwardMatchesFiniteDifferencesForRmsNormAndDyT) {
  for (Placement p : {Placement::kPost, Placement::kPre, Placement::kSandwich, Placement::kSiamese})
    for (NormKind n : {NormKind::kRmsNorm, NormKind::kDyT}) check_fd(tiny(p, n), make_batch(11, 2, 5, 12));
}

// BatchNorm over the sequence: training mode (batch statistics over all real positions), with and
// without padding, and eval mode (the running statistics, here after a few training forwards).
TEST(NnModel, BackwardMatchesFiniteDifferencesForBatchNorm) {
  for (Placement p : {Placement::kPost, Placement::kPre, Placement::kSandwich, Placement::kSiamese}) {
    check_fd(tiny(p, NormKind::kBatchNorm), make_batch(11, 2, 5, 14));
    const std::vector<Index> lengths{5, 3};
    check_fd(tiny(p, NormKind::kBatchNorm), make_batch(11, 2, 5, 15), lengths);
  }
}

TEST(NnModel, BatchNormTrainEvalRunningStatsAndPadding) {
  ModelConfig c = tiny(Placement::kPre, NormKind::kBatchNorm);
  Transformer<double> net(c);
  ASSERT_EQ(net.buffers().size(), 2u * (2 * 2 + 1));  // norm1, norm2 per block and ln_f: mean and var each
  EXPECT_EQ(net.buffers()[0].name, "blocks.0.norm1.running_mean");
  EXPECT_EQ(net.buffers()[1].name, "blocks.0.norm1.running_var");
  const Batch b = make_batch(11, 2, 5, 16);
  const std::vector<Index> lengths{5, 3};
  // training: padded tokens take no part (loss and running statistics unchanged when they change)
  const double loss = net.forward(b.tokens.data(), b.targets.data(), b.B, b.T, lengths);
  std::vector<double> rs(net.buffers()[0].data, net.buffers()[0].data + c.d_model);
  Transformer<double> net2(c);
  Batch b2 = b;
  b2.tokens[8] = (b2.tokens[8] + 1) % 11, b2.tokens[9] = (b2.tokens[9] + 5) % 11;  // sequence 1, t = 3, 4: padding
  EXPECT_EQ(net2.forward(b2.tokens.data(), b2.targets.data(), b.B, b.T, lengths), loss);
  for (Index i = 0; i < c.d_model; ++i) EXPECT_EQ(net2.buffers()[0].data[i], rs[static_cast<std::size_t>(i)]);
  // eval: the running statistics; forwards no longer move them, and the loss differs from training's
  net.set_training(false);
  EXPECT_FALSE(net.training());
  const double eval_loss = net.forward(b.tokens.data(), b.targets.data(), b.B, b.T, lengths);
  for (Index i = 0; i < c.d_model; ++i) EXPECT_EQ(net.buffers()[0].data[i], rs[static_cast<std::size_t>(i)]);
  EXPECT_EQ(net.forward(b.tokens.data(), b.targets.data(), b.B, b.T, lengths), eval_loss);
  EXPECT_NE(eval_loss, loss);
  check_fd(c, b, lengths, 6, /*eval=*/true);  // eval mode: running statistics from 3 training forwards
  // the float Model: same train/eval switch and buffers
  Model m(c);
  EXPECT_TRUE(m.training());
  m.set_training(false);
  EXPECT_FALSE(m.training());
  EXPECT_EQ(m.buffers().size(), net.buffers().size());
  EXPECT_EQ(m.buffers()[0].grad, nullptr);
}

TEST(NnModel, BackwardMatchesFiniteDifferencesWithPaddingGeluLearnedPositionsAndMixLn) {
  ModelConfig c = tiny(Placement::kPre);
  c.gelu = true;
  c.positions = PositionKind::kLearned;
  const std::vector<Index> lengths{5, 3};
  check_fd(c, make_batch(11, 2, 5, 13), lengths);
  ModelConfig mix = tiny(Placement::kMixLN);
  mix.layers = 4;  // ⌊0.25·4⌋ = 1 Post-LN block, then 3 Pre-LN blocks
  check_fd(mix, make_batch(11, 2, 5, 14));
}

TEST(NnModel, ClassifierOverTokensAndFramesMatchesFiniteDifferences) {
  ModelConfig c = tiny(Placement::kPre);
  c.head = Head::kClassifier;
  c.causal = false;
  c.classes = 3;
  Batch b = make_batch(11, 2, 5, 15, false);
  b.targets = {2, 0};
  const std::vector<Index> lengths{5, 2};
  check_fd(c, b, lengths);

  c.input_dim = 6;  // frames
  Transformer<double> net(c);
  std::mt19937_64 rng(16);
  std::vector<double> frames = testing::randn(static_cast<std::size_t>(2 * 5 * 6), rng);
  const std::vector<std::int32_t> labels{1, 2};
  net.forward_frames(frames.data(), labels.data(), 2, 5, lengths);
  net.backward();
  ParamEntry<double> w = net.params()[0];  // input.weight
  ASSERT_EQ(w.name, "input.weight");
  const double h = 1e-5;
  for (Index i = 0; i < w.numel(); i += 7) {
    const double keep = w.data[i], an = w.grad[i];
    w.data[i] = keep + h;
    const double lp = net.forward_frames(frames.data(), labels.data(), 2, 5, lengths);
    w.data[i] = keep - h;
    const double lm = net.forward_frames(frames.data(), labels.data(), 2, 5, lengths);
    w.data[i] = keep;
    EXPECT_NEAR(an, (lp - lm) / (2 * h), 1e-6 * std::fabs(an) + 1e-9) << "dinput.weight[" << i << "]";
  }
}

// ---- float Model vs double network ------------------------------------------------------------------------

TEST(NnModel, FloatModelMatchesDoubleNetwork) {
  for (Placement p : kImplemented)
    for (NormKind n : {NormKind::kLayerNorm, NormKind::kBatchNorm}) {
    if (n == NormKind::kBatchNorm && p == Placement::kNone) continue;
    ModelConfig c = tiny(p, n);
    c.layers = 3, c.d_model = 16, c.ffn = 32, c.vocab = 20;
    Model m(c);
    Transformer<double> net(c);
    std::vector<ParamRef> pf = m.params();
    auto& pd = net.params();
    ASSERT_EQ(pf.size(), pd.size());
    for (std::size_t t = 0; t < pf.size(); ++t)  // same weights: the float ones
      for (Index i = 0; i < pf[t].numel(); ++i) pd[t].data[i] = pf[t].data[i];
    const Batch b = make_batch(c.vocab, 2, 8, 21);
    std::vector<Index> lengths;  // BatchNorm: with padding (its statistics skip the padded positions)
    if (n == NormKind::kBatchNorm) lengths = {8, 5};
    const double lf = m.forward(b.tokens.data(), b.targets.data(), b.B, b.T, lengths);
    const double ld = net.forward(b.tokens.data(), b.targets.data(), b.B, b.T, lengths);
    EXPECT_NEAR(lf, ld, 64 * 1.2e-7 * ld) << label(c);
    m.backward();
    net.backward();
    double gmax = 0;
    for (const auto& e : pd) gmax = std::max(gmax, testing::max_abs(std::vector<double>(e.grad, e.grad + e.numel())));
    for (std::size_t t = 0; t < pf.size(); ++t) {
      const std::vector<float> gf(pf[t].grad, pf[t].grad + pf[t].numel());
      const std::vector<double> gd(pd[t].grad, pd[t].grad + pd[t].numel());
      // relative to the tensor's largest gradient, with a floor at 1e-3 of the model's largest; a gradient
      // that is 0 in exact arithmetic (attention's key bias) is measured against the model's largest
      const bool zero = testing::max_abs(gd) <= 1e-12 * gmax;
      EXPECT_TRUE(testing::float_matches(gf, gd, 512, label(c) + " d" + pf[t].name, zero ? gmax : 1e-3 * gmax));
    }
  }
}

// ---- errors --------------------------------------------------------------------------------------------

TEST(NnModel, BadConfigurationsThrowClearErrors) {
  ModelConfig c = tiny(Placement::kPre);
  c.heads = 3;
  EXPECT_NL_ERROR(Model{c}, "heads (3) must divide d_model (8)");
  EXPECT_NL_ERROR(parse_placement("postln"), "unknown placement 'postln'");
  EXPECT_NL_ERROR(parse_placement("postln"), "post|pre|sandwich|deepnorm|b2t|mixln|lns|siamese|spannorm|none");
  EXPECT_NL_ERROR(Model{tiny(Placement::kSpanNorm)}, "SpanNorm's block formula could not be verified");
  c = tiny(Placement::kPre);
  c.layers = 0;
  EXPECT_NL_ERROR(Model{c}, "layers must be ≥ 1");
  c = tiny(Placement::kPre);
  c.head = Head::kClassifier;
  EXPECT_NL_ERROR(Model{c}, "classes must be ≥ 1");
  Model m(tiny(Placement::kPre));
  const Batch b = make_batch(11, 2, 9, 1);
  EXPECT_NL_ERROR(m.forward(b.tokens.data(), b.targets.data(), 2, 9), "T = 9 is out of range [1, max_seq = 8]");
  EXPECT_NL_ERROR(m.backward(), "needs a successful forward");
  EXPECT_NL_ERROR(m.set_skipped_blocks({2}), "skipped block 2 is out of range");
  for (Placement p : kImplemented) EXPECT_EQ(parse_placement(placement_name(p)), p);
}

// ---- init --------------------------------------------------------------------------------------------

TEST(NnModel, InitIsSeededDeterministicAndFollowsTheDocumentedLaws) {
  ModelConfig c = tiny(Placement::kPost);
  c.d_model = 64, c.heads = 4, c.ffn = 128, c.vocab = 256, c.layers = 3;
  Model a(c), b(c);
  c.seed = 8;
  Model other(c);
  auto pa = a.params(), pb = b.params(), po = other.params();
  bool differs = false;
  for (std::size_t t = 0; t < pa.size(); ++t) {
    EXPECT_EQ(pa[t].name, pb[t].name);
    EXPECT_TRUE(std::equal(pa[t].data, pa[t].data + pa[t].numel(), pb[t].data)) << pa[t].name;
    differs |= !std::equal(pa[t].data, pa[t].data + pa[t].numel(), po[t].data);
  }
  EXPECT_TRUE(differs);
  auto stats = [](const ParamRef& r) {
    double s = 0, q = 0, mx = 0;
    for (Index i = 0; i < r.numel(); ++i) s += r.data[i], q += double(r.data[i]) * r.data[i], mx = std::max(mx, double(std::fabs(r.data[i])));
    const double mean = s / r.numel();
    return std::array<double, 3>{mean, std::sqrt(q / r.numel() - mean * mean), mx};
  };
  for (const ParamRef& r : pa) {
    const auto [mean, sd, mx] = stats(r);
    if (r.name == "wte") {
      EXPECT_NEAR(mean, 0, 0.02);
      EXPECT_NEAR(sd, 1, 0.02);
    } else if (r.shape.size() == 2) {  // Xavier-uniform: sd = a/√3, |w| ≤ a
      const double bound = std::sqrt(6.0 / double(r.shape[0] + r.shape[1]));
      EXPECT_LE(mx, bound) << r.name;
      EXPECT_NEAR(sd, bound / std::sqrt(3.0), 0.06 * bound) << r.name;
    } else if (r.name.ends_with("bias")) {
      EXPECT_EQ(mx, 0) << r.name;
    } else {  // norm weights
      EXPECT_EQ(mean, 1) << r.name;
      EXPECT_EQ(sd, 0) << r.name;
    }
  }
  // DeepNorm: same draws, v/o/FFN weights × β = (8L)^(−1/4), the rest unchanged; α = (2L)^(1/4)
  c.seed = 7;
  c.placement = Placement::kDeepNorm;
  Transformer<float> deep(c);
  EXPECT_DOUBLE_EQ(deep.deepnorm_alpha(), std::pow(6.0, 0.25));
  const double beta = std::pow(24.0, -0.25);
  EXPECT_DOUBLE_EQ(deep.deepnorm_beta(), beta);
  for (std::size_t t = 0; t < pa.size(); ++t) {
    const auto& d = deep.params()[t];
    ASSERT_EQ(d.name, pa[t].name);
    const bool scaled = d.name.find("attn.v.weight") != std::string::npos ||
                        d.name.find("attn.o.weight") != std::string::npos || d.name.find("ffn.w") != std::string::npos;
    for (Index i = 0; i < d.numel(); i += 13)
      EXPECT_EQ(d.data[i], scaled ? static_cast<float>(beta * pa[t].data[i]) : pa[t].data[i]) << d.name;
  }
  ModelConfig n = c;
  n.placement = Placement::kPre;
  n.init = InitKind::kNormal;
  Model normal(n);
  for (const ParamRef& r : normal.params())
    if (r.name == "blocks.0.ffn.w1.weight") {
      EXPECT_NEAR(stats(r)[1], 0.02, 0.001);
    }
}

TEST(NnModel, ParamsListEveryTensorOnceInForwardOrder) {
  auto names = [](ModelConfig c) {
    std::vector<std::string> v;
    for (const ParamRef& r : Model(c).params()) v.push_back(r.name);
    return v;
  };
  ModelConfig c = tiny(Placement::kPre);
  c.layers = 1;
  const std::vector<std::string> pre{
      "wte",          "blocks.0.norm1.weight", "blocks.0.norm1.bias", "blocks.0.attn.q.weight", "blocks.0.attn.q.bias",
      "blocks.0.attn.k.weight", "blocks.0.attn.k.bias", "blocks.0.attn.v.weight", "blocks.0.attn.v.bias",
      "blocks.0.attn.o.weight", "blocks.0.attn.o.bias", "blocks.0.norm2.weight", "blocks.0.norm2.bias",
      "blocks.0.ffn.w1.weight", "blocks.0.ffn.w1.bias", "blocks.0.ffn.w2.weight", "blocks.0.ffn.w2.bias",
      "ln_f.weight",  "ln_f.bias", "head.weight", "head.bias"};
  EXPECT_EQ(names(c), pre);
  c.placement = Placement::kPost;
  const std::vector<std::string> post = names(c);
  EXPECT_EQ(post[1], "blocks.0.attn.q.weight");
  EXPECT_EQ(post[9], "blocks.0.norm1.weight");
  EXPECT_EQ(post.size(), pre.size() - 2);  // no ln_f
  c.placement = Placement::kSandwich;
  EXPECT_EQ(names(c).size(), pre.size() + 4);
  c.placement = Placement::kNone;
  EXPECT_EQ(names(c).size(), pre.size() - 6);
  c.placement = Placement::kSiamese;  // 6 norms per block, ln_f_x, ln_f_y, ln_f
  const std::vector<std::string> siamese = names(c);
  EXPECT_EQ(siamese.size(), pre.size() + 12);
  EXPECT_EQ(siamese[1], "blocks.0.norm1_post.weight");
  EXPECT_EQ(siamese[siamese.size() - 8], "ln_f_x.weight");
  c.placement = Placement::kPre;
  c.norm = NormKind::kDyT;
  EXPECT_EQ(names(c)[1], "blocks.0.norm1.alpha");
}

// ---- behaviour, instrumentation -------------------------------------------------------------------------

TEST(NnModel, BackwardZeroesGradientsAndInstrumentationIsSane) {
  ModelConfig c = tiny(Placement::kPre);
  c.layers = 3;
  Model m(c);
  const Batch b = make_batch(11, 2, 6, 31);
  const double loss = m.forward(b.tokens.data(), b.targets.data(), b.B, b.T);
  m.backward();
  std::vector<float> g1;
  for (const ParamRef& r : m.params()) g1.insert(g1.end(), r.grad, r.grad + r.numel());
  m.backward();
  std::vector<float> g2;
  for (const ParamRef& r : m.params()) g2.insert(g2.end(), r.grad, r.grad + r.numel());
  EXPECT_EQ(g1, g2);  // zeroed, not accumulated
  const auto rn = m.residual_norms(), cs = m.token_cosine(), ln = m.ln_input_norms();
  ASSERT_EQ(rn.size(), 3u);
  ASSERT_EQ(cs.size(), 3u);
  ASSERT_EQ(ln.size(), 7u);  // 2 per block + ln_f
  EXPECT_DOUBLE_EQ(ln.back(), rn.back());
  for (double v : cs) EXPECT_TRUE(v >= -1 && v <= 1) << v;
  for (double v : rn) EXPECT_GT(v, 0);
  // Pre-LN residual stream grows with depth at init (Xiong et al. 2020)
  EXPECT_GT(rn[2], rn[0]);
  // skipping every block: the loss changes; skipping none restores it bitwise
  m.set_skipped_blocks({0, 1, 2});
  EXPECT_NE(m.forward(b.tokens.data(), b.targets.data(), b.B, b.T), loss);
  m.backward();
  m.set_skipped_blocks({});
  EXPECT_EQ(m.forward(b.tokens.data(), b.targets.data(), b.B, b.T), loss);
}

}  // namespace
}  // namespace normlab::nn
