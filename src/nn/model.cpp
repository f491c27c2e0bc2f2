// src/nn/model.cpp — the Transformer network (Transformer<Real>) and nn::Model, its float facade.
//
//   forward:  x0 = embed(tokens | frames) + positions            (B,T,C)   res_[0]
//             x_l = block_l(x_{l−1}),  l = 1..L                  (B,T,C)   res_[l]
//             xf = final_norm(x_L)  (or x_L when there is none)  (B,T,C)
//             LM: logits = xf·Wᵀ + b (B,T,V);  classifier: logits = mean_t(xf)·Wᵀ + b (B,classes)
//             loss = mean cross-entropy
//   backward: the same lines, bottom-up (gpt2_backward of llm.c).
// Placements and init: docs/placements.md.
#include <normlab/error.h>
#include <normlab/nn/model.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>

#include "nn/block.h"

namespace normlab::nn {

// ---- names ----------------------------------------------------------------------------------------

namespace {
struct PlacementName {
  Placement p;
  const char* name;
};
constexpr PlacementName kPlacements[] = {
    {Placement::kPost, "post"},     {Placement::kPre, "pre"},       {Placement::kSandwich, "sandwich"},
    {Placement::kDeepNorm, "deepnorm"}, {Placement::kB2T, "b2t"},   {Placement::kMixLN, "mixln"},
    {Placement::kLNS, "lns"},       {Placement::kSiamese, "siamese"}, {Placement::kSpanNorm, "spannorm"},
    {Placement::kNone, "none"},
};
}  // namespace

const char* placement_name(Placement p) {
  for (const auto& e : kPlacements)
    if (e.p == p) return e.name;
  return "?";
}

Placement parse_placement(const std::string& name) {
  std::string valid;
  for (const auto& e : kPlacements) {
    if (name == e.name) return e.p;
    valid += valid.empty() ? e.name : std::string("|") + e.name;
  }
  if (name == "peri") return Placement::kSandwich;
  throw Error(fmt::format("unknown placement '{}'; valid placements: {} (peri = sandwich)", name, valid));
}

namespace {
struct NormName {
  NormKind n;
  const char* name;
};
constexpr NormName kNormNames[] = {
    {NormKind::kLayerNorm, "layer"}, {NormKind::kRmsNorm, "rms"}, {NormKind::kDyT, "dyt"}, {NormKind::kBatchNorm, "batch"}};
}  // namespace

const char* norm_kind_name(NormKind n) {
  for (const auto& e : kNormNames)
    if (e.n == n) return e.name;
  return "?";
}

NormKind parse_norm_kind(const std::string& name) {
  std::string valid;
  for (const auto& e : kNormNames) {
    if (name == e.name) return e.n;
    valid += valid.empty() ? e.name : std::string("|") + e.name;
  }
  throw Error(fmt::format("unknown norm '{}'; valid norms: {}", name, valid));
}

// ---- building -------------------------------------------------------------------------------------

template <typename Real>
int Transformer<Real>::add_param(const std::string& name, Dims shape, ParamInit init) {
  ParamEntry<Real> e;
  e.name = name;
  e.shape = shape;
  e.init = init;
  params_.push_back(e);
  return static_cast<int>(params_.size()) - 1;
}

template <typename Real>
int Transformer<Real>::add_linear(const std::string& name, Index out, Index in) {
  const int w = add_param(name + ".weight", {out, in}, ParamInit::kLinear);
  add_param(name + ".bias", {out}, ParamInit::kZero);
  return w;
}

template <typename Real>
Norm<Real> Transformer<Real>::add_norm(const std::string& name, double scale) {
  Norm<Real> n;
  n.kind = cfg_.norm;
  n.eps = cfg_.norm_eps;
  n.scale = scale;
  const Index C = cfg_.d_model;
  switch (cfg_.norm) {
    case NormKind::kLayerNorm:
      n.weight = add_param(name + ".weight", {C}, ParamInit::kOne);
      n.bias = add_param(name + ".bias", {C}, ParamInit::kZero);
      break;
    case NormKind::kRmsNorm:
      n.weight = add_param(name + ".weight", {C}, ParamInit::kOne);
      break;
    case NormKind::kDyT:
      n.alpha = add_param(name + ".alpha", {1}, ParamInit::kDytAlpha);
      n.weight = add_param(name + ".weight", {C}, ParamInit::kOne);
      n.bias = add_param(name + ".bias", {C}, ParamInit::kZero);
      break;
    case NormKind::kBatchNorm: {  // over the batch and the sequence, per channel; running stats as buffers
      n.weight = add_param(name + ".weight", {C}, ParamInit::kOne);
      n.bias = add_param(name + ".bias", {C}, ParamInit::kZero);
      n.running = static_cast<int>(buffers_.size());
      for (const auto& [suffix, init] : {std::pair{".running_mean", ParamInit::kZero}, std::pair{".running_var", ParamInit::kOne}}) {
        ParamEntry<Real> e;
        e.name = name + suffix;
        e.shape = {C};
        e.init = init;
        buffers_.push_back(e);
      }
      break;
    }
  }
  return n;
}

template <typename Real>
void Transformer<Real>::build() {
  const ModelConfig& c = cfg_;
  const bool lm = c.head == Head::kLanguageModel;
  if (!lm && c.input_dim > 0) {
    input_ = add_linear("input", c.d_model, c.input_dim);
  } else {
    embed_ = add_param("wte", {c.vocab, c.d_model}, ParamInit::kEmbedding);
  }
  if (c.positions == PositionKind::kLearned) wpe_ = add_param("wpe", {c.max_seq, c.d_model}, ParamInit::kPositions);

  const int L = c.layers;
  const int n_post = c.placement == Placement::kMixLN ? static_cast<int>(std::floor(c.mixln_alpha * L)) : 0;
  bool last_pre = false;
  for (int l = 0; l < L; ++l) {
    Block<Real> b;
    b.index = l;
    b.causal = c.causal;
    b.act = c.gelu ? Activation::kGelu : Activation::kRelu;
    switch (c.placement) {
      case Placement::kPost: case Placement::kDeepNorm: b.style = BlockStyle::kPost; break;
      case Placement::kPre: case Placement::kLNS: b.style = BlockStyle::kPre; break;
      case Placement::kSandwich: b.style = BlockStyle::kSandwich; break;
      case Placement::kB2T: b.style = BlockStyle::kB2T; break;
      case Placement::kMixLN: b.style = l < n_post ? BlockStyle::kPost : BlockStyle::kPre; break;
      case Placement::kNone: b.style = BlockStyle::kNone; break;
      case Placement::kSiamese: b.style = BlockStyle::kSiamese; break;
      case Placement::kSpanNorm: NL_DCHECK(false); break;
    }
    if (c.placement == Placement::kDeepNorm) b.alpha = deep_alpha_;
    b.siamese_c = std::sqrt(2.0 * (l + 1));
    const double s = c.placement == Placement::kLNS ? 1.0 / std::sqrt(static_cast<double>(l + 1)) : 1.0;
    const std::string pre = fmt::format("blocks.{}.", l);
    // registered in forward order
    switch (b.style) {
      case BlockStyle::kPost: case BlockStyle::kB2T:
        b.attn_params = add_linear(pre + "attn.q", c.d_model, c.d_model);
        add_linear(pre + "attn.k", c.d_model, c.d_model), add_linear(pre + "attn.v", c.d_model, c.d_model);
        add_linear(pre + "attn.o", c.d_model, c.d_model);
        b.norms.push_back(add_norm(pre + "norm1"));
        b.ffn_params = add_linear(pre + "ffn.w1", c.ffn, c.d_model);
        add_linear(pre + "ffn.w2", c.d_model, c.ffn);
        b.norms.push_back(add_norm(pre + "norm2"));
        break;
      case BlockStyle::kPre: case BlockStyle::kSandwich: case BlockStyle::kNone: {
        const bool sw = b.style == BlockStyle::kSandwich, normed = b.style != BlockStyle::kNone;
        if (normed) b.norms.push_back(add_norm(pre + "norm1", s));
        b.attn_params = add_linear(pre + "attn.q", c.d_model, c.d_model);
        add_linear(pre + "attn.k", c.d_model, c.d_model), add_linear(pre + "attn.v", c.d_model, c.d_model);
        add_linear(pre + "attn.o", c.d_model, c.d_model);
        if (sw) b.norms.push_back(add_norm(pre + "norm1_out"));
        if (normed) b.norms.push_back(add_norm(pre + "norm2", s));
        b.ffn_params = add_linear(pre + "ffn.w1", c.ffn, c.d_model);
        add_linear(pre + "ffn.w2", c.d_model, c.ffn);
        if (sw) b.norms.push_back(add_norm(pre + "norm2_out"));
        break;
      }
      case BlockStyle::kSiamese:
        for (const char* n : {"norm1_post", "norm1_pre", "norm1_in"}) b.norms.push_back(add_norm(pre + n));
        b.attn_params = add_linear(pre + "attn.q", c.d_model, c.d_model);
        add_linear(pre + "attn.k", c.d_model, c.d_model), add_linear(pre + "attn.v", c.d_model, c.d_model);
        add_linear(pre + "attn.o", c.d_model, c.d_model);
        for (const char* n : {"norm2_post", "norm2_pre", "norm2_in"}) b.norms.push_back(add_norm(pre + n));
        b.ffn_params = add_linear(pre + "ffn.w1", c.ffn, c.d_model);
        add_linear(pre + "ffn.w2", c.d_model, c.ffn);
        break;
    }
    last_pre = b.style == BlockStyle::kPre || b.style == BlockStyle::kSandwich;
    blocks_.push_back(std::move(b));
  }
  if (c.placement == Placement::kSiamese) {  // xf = ln_f(ln_f_x(x) + ln_f_y(y))
    final_x_ = add_norm("ln_f_x");
    final_y_ = add_norm("ln_f_y");
  }
  if (last_pre || c.placement == Placement::kSiamese) final_norm_ = add_norm("ln_f");
  head_ = add_linear("head", lm ? c.vocab : c.classes, c.d_model);

  Index total = 0;
  for (const auto& p : params_) total += p.numel();
  values_.assign(static_cast<std::size_t>(total), Real(0));
  grads_.assign(static_cast<std::size_t>(total), Real(0));
  Index off = 0;
  for (auto& p : params_) {
    p.data = values_.data() + off;
    p.grad = grads_.data() + off;
    off += p.numel();
  }
  // BatchNorm running statistics: running_mean = 0, running_var = 1 (no random draws)
  buffer_values_.assign(static_cast<std::size_t>(buffers_.size()) * static_cast<std::size_t>(c.d_model), Real(0));
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    buffers_[i].data = buffer_values_.data() + static_cast<Index>(i) * c.d_model;
    if (buffers_[i].init == ParamInit::kOne) std::fill_n(buffers_[i].data, c.d_model, Real(1));
  }
  for_each_norm([this](Norm<Real>& n) {
    if (n.running < 0) return;
    n.running_mean = buffers_[static_cast<std::size_t>(n.running)].data;
    n.running_var = buffers_[static_cast<std::size_t>(n.running) + 1].data;
  });
}

template <typename Real>
template <typename F>
void Transformer<Real>::for_each_norm(F&& f) {
  for (Block<Real>& b : blocks_)
    for (Norm<Real>& n : b.norms) f(n);
  for (Norm<Real>* n : {&final_x_, &final_y_, &final_norm_}) f(*n);
}

template <typename Real>
void Transformer<Real>::set_training(bool training) {
  training_ = training;
  for_each_norm([training](Norm<Real>& n) { n.training = training; });
}

template <typename Real>
void Transformer<Real>::set_batch_norm_kernels(const BatchNormKernels* k) {
  for_each_norm([k](Norm<Real>& n) { n.bn_kernels = k; });
}

// Initialization: ONE std::mt19937_64 seeded with cfg.seed, consumed in params() order, each tensor
// row-major; only kEmbedding, kPositions and kLinear tensors draw. Portable draws (no std::
// distributions): u = (bits >> 11)·2⁻⁵³ ∈ [0,1); uniform(−a,a) = a·(2u − 1) (one draw);
// normal = √(−2 ln(1 − u₁))·cos(2π u₂) (two draws, Box–Muller). Values are drawn in double and
// rounded to Real, so the float and double networks start from the same numbers.
template <typename Real>
void Transformer<Real>::init() {
  std::mt19937_64 rng(cfg_.seed);
  auto u01 = [&rng]() { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
  auto normal = [&]() {
    const double u1 = u01(), u2 = u01();
    return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * std::numbers::pi * u2);
  };
  for (auto& p : params_) {
    const Index n = p.numel();
    for (Index i = 0; i < n; ++i) {
      double v = 0;
      switch (p.init) {
        case ParamInit::kZero: v = 0; break;
        case ParamInit::kOne: v = 1; break;
        case ParamInit::kDytAlpha: v = kDytAlphaInit; break;
        case ParamInit::kEmbedding: v = normal(); break;       // N(0,1) (lab.md)
        case ParamInit::kPositions: v = 0.02 * normal(); break;  // learned positions: N(0, 0.02²)
        case ParamInit::kLinear:
          if (cfg_.init == InitKind::kNormal) {
            v = 0.02 * normal();
          } else {  // Xavier-uniform: a = √(6/(fan_in + fan_out))
            const double a = std::sqrt(6.0 / static_cast<double>(p.shape[0] + p.shape[1]));
            v = a * (2.0 * u01() - 1.0);
          }
          break;
      }
      p.data[i] = static_cast<Real>(v);
    }
  }
  if (cfg_.placement == Placement::kDeepNorm) {  // β on FFN, v-proj and out-proj weights (Wang et al. 2022)
    for (const Block<Real>& b : blocks_)
      for (int i : {b.attn_params + 4, b.attn_params + 6, b.ffn_params, b.ffn_params + 2}) {
        ParamEntry<Real>& p = params_[static_cast<std::size_t>(i)];
        for (Index j = 0; j < p.numel(); ++j) p.data[j] = static_cast<Real>(deep_beta_ * p.data[j]);
      }
  }
}

template <typename Real>
Transformer<Real>::Transformer(const ModelConfig& cfg) : cfg_(cfg) {
  const ModelConfig& c = cfg;
  NL_CHECK(c.layers >= 1, "model: layers must be ≥ 1, got {}", c.layers);
  NL_CHECK(c.d_model >= 1, "model: d_model must be ≥ 1, got {}", c.d_model);
  NL_CHECK(c.heads >= 1, "model: heads must be ≥ 1, got {}", c.heads);
  NL_CHECK(c.d_model % c.heads == 0, "model: heads ({}) must divide d_model ({})", c.heads, c.d_model);
  NL_CHECK(c.ffn >= 1, "model: ffn must be ≥ 1, got {}", c.ffn);
  NL_CHECK(c.max_seq >= 1, "model: max_seq must be ≥ 1, got {}", c.max_seq);
  NL_CHECK(std::isfinite(c.norm_eps) && c.norm_eps >= 0, "model: norm_eps must be finite and ≥ 0, got {}", c.norm_eps);
  NL_CHECK(c.mixln_alpha >= 0 && c.mixln_alpha <= 1, "model: mixln_alpha must lie in [0, 1], got {}", c.mixln_alpha);
  if (c.head == Head::kLanguageModel) {
    NL_CHECK(c.vocab >= 1, "model: vocab must be ≥ 1 for the language-model head, got {}", c.vocab);
  } else {
    NL_CHECK(c.classes >= 1, "model: classes must be ≥ 1 for the classifier head, got {}", c.classes);
    NL_CHECK(c.input_dim >= 1 || c.vocab >= 1, "model: the classifier needs input_dim ≥ 1 (frames) or vocab ≥ 1 "
             "(tokens), got input_dim {} and vocab {}", c.input_dim, c.vocab);
  }
  NL_CHECK(c.placement != Placement::kSpanNorm,
           "SpanNorm's block formula could not be verified (arXiv 2601.22580); see docs/placements.md");
  if (c.placement == Placement::kDeepNorm) {  // decoder-only (M = L) and encoder-only (N = L) share the formula
    deep_alpha_ = std::pow(2.0 * c.layers, 0.25);
    deep_beta_ = std::pow(8.0 * c.layers, -0.25);
  }
  build();
  init();
  pe_.resize(static_cast<std::size_t>(c.max_seq * c.d_model));
  sinusoidal_positions(pe_.data(), c.max_seq, c.d_model);
}

// ---- forward --------------------------------------------------------------------------------------

template <typename Real>
bool Transformer<Real>::skipped(int l) const {
  return std::find(skipped_.begin(), skipped_.end(), l) != skipped_.end();
}

template <typename Real>
void Transformer<Real>::set_skipped_blocks(std::vector<int> skipped) {
  for (int l : skipped)
    NL_CHECK(l >= 0 && l < cfg_.layers, "model: skipped block {} is out of range [0, {})", l, cfg_.layers);
  skipped_ = std::move(skipped);
}

template <typename Real>
double Transformer<Real>::forward(const std::int32_t* tokens, const std::int32_t* targets, Index B, Index T,
                                  std::span<const Index> lengths) {
  NL_CHECK(embed_ >= 0, "model: this classifier takes real-valued frames (input_dim = {}); call forward_frames",
           cfg_.input_dim);
  return run(tokens, nullptr, targets, B, T, lengths);
}

template <typename Real>
double Transformer<Real>::forward_frames(const Real* frames, const std::int32_t* labels, Index B, Index T,
                                         std::span<const Index> lengths) {
  NL_CHECK(input_ >= 0, "model: forward_frames needs a classifier with input_dim ≥ 1");
  return run(nullptr, frames, labels, B, T, lengths);
}

template <typename Real>
double Transformer<Real>::run(const std::int32_t* tokens, const Real* frames, const std::int32_t* targets, Index B,
                              Index T, std::span<const Index> lengths) {
  const ModelConfig& c = cfg_;
  const bool lm = c.head == Head::kLanguageModel;
  NL_CHECK(B >= 1, "model: batch size B must be ≥ 1, got {}", B);
  NL_CHECK(T >= 1 && T <= c.max_seq, "model: sequence length T = {} is out of range [1, max_seq = {}]", T, c.max_seq);
  NL_CHECK(lengths.empty() || static_cast<Index>(lengths.size()) == B,
           "model: lengths has {} entries, expected B = {} (or none)", lengths.size(), B);
  for (Index len : lengths) NL_CHECK(len >= 0 && len <= T, "model: a length {} is out of range [0, T = {}]", len, T);
  have_forward_ = false;
  dx_.clear();  // ∂L/∂x_l belongs to the previous forward's shapes
  shape_ = {B, T, c.d_model, c.heads, c.ffn};
  const Index N = B * T, C = c.d_model, NC = N * C;
  lengths_.assign(lengths.begin(), lengths.end());
  tokens_ = tokens;
  frames_ = frames;
  targets_.assign(targets, targets + (lm ? N : B));
  res_.resize(static_cast<std::size_t>(c.layers + 1));
  for (auto& r : res_) r.resize(static_cast<std::size_t>(siamese() ? 2 * NC : NC));  // SiameseNorm: (x, y)
  auto P = [this](int i) { return params_[static_cast<std::size_t>(i)].data; };

  Real* x0 = res_[0].data();  // x0 = embed + positions
  if (frames) {
    linear_forward(x0, frames, P(input_), P(input_ + 1), N, static_cast<Index>(c.input_dim), C);
  } else {
    token_embedding_forward(x0, tokens, P(embed_), B, T, C, static_cast<Index>(c.vocab));
  }
  position_forward(x0, x0, wpe_ >= 0 ? P(wpe_) : pe_.data(), B, T, C);
  if (siamese()) std::copy(x0, x0 + NC, x0 + NC);  // y0 = x0
  for (int l = 0; l < c.layers; ++l) {  // x_l = block_l(x_{l−1})
    auto& out = res_[static_cast<std::size_t>(l + 1)];
    const auto& in = res_[static_cast<std::size_t>(l)];
    if (skipped(l)) {
      out = in;
    } else {
      blocks_[static_cast<std::size_t>(l)].forward(out.data(), in.data(), params_, shape_, lengths);
    }
  }
  xf_.resize(static_cast<std::size_t>(NC));
  if (siamese()) {  // fsum = ln_f_x(x) + ln_f_y(y); xf = ln_f(fsum)
    std::vector<Real> fx(static_cast<std::size_t>(NC));
    fsum_.resize(static_cast<std::size_t>(NC));
    final_x_.forward(fx.data(), res_.back().data(), params_, N, C, lengths, T);
    final_y_.forward(fsum_.data(), res_.back().data() + NC, params_, N, C, lengths, T);
    residual_forward(fsum_.data(), fsum_.data(), fx.data(), NC);
    final_norm_.forward(xf_.data(), fsum_.data(), params_, N, C, lengths, T);
  } else if (has_final_norm()) {
    final_norm_.forward(xf_.data(), res_.back().data(), params_, N, C, lengths, T);
  } else {
    xf_ = res_.back();
  }
  double loss = 0;
  if (lm) {  // logits = xf·Wᵀ + b; loss = CE over (B,T)
    const Index V = c.vocab;
    logits_.resize(static_cast<std::size_t>(N * V)), probs_.resize(logits_.size());
    linear_forward(logits_.data(), xf_.data(), P(head_), P(head_ + 1), N, C, V);
    loss = cross_entropy_forward(probs_.data(), logits_.data(), targets_.data(), lengths, B, T, V);
  } else {  // pooled[b] = mean over real t of xf[b,t]; logits = pooled·Wᵀ + b; CE over B labels
    const Index K = c.classes;
    pooled_.assign(static_cast<std::size_t>(B * C), Real(0));
    for (Index b = 0; b < B; ++b) {
      const Index len = lengths.empty() ? T : lengths[static_cast<std::size_t>(b)];
      NL_CHECK(len >= 1, "model: the classifier needs every length ≥ 1, sequence {} has 0", b);
      for (Index t = 0; t < len; ++t)
        for (Index i = 0; i < C; ++i) pooled_[static_cast<std::size_t>(b * C + i)] += xf_[static_cast<std::size_t>((b * T + t) * C + i)];
      for (Index i = 0; i < C; ++i) pooled_[static_cast<std::size_t>(b * C + i)] /= static_cast<Real>(len);
    }
    logits_.resize(static_cast<std::size_t>(B * K)), probs_.resize(logits_.size());
    linear_forward(logits_.data(), pooled_.data(), P(head_), P(head_ + 1), B, C, K);
    loss = cross_entropy_forward(probs_.data(), logits_.data(), targets_.data(), {}, B, Index{1}, K);
  }
  have_forward_ = true;
  return loss;
}

// ---- backward: the forward's lines in reverse -------------------------------------------------------

template <typename Real>
void Transformer<Real>::backward() {
  NL_CHECK(have_forward_, "model: backward() needs a successful forward() first");
  const ModelConfig& c = cfg_;
  const Index B = shape_.B, T = shape_.T, N = shape_.N(), C = shape_.C, NC = N * C;
  std::fill(grads_.begin(), grads_.end(), Real(0));
  auto P = [this](int i) { return params_[static_cast<std::size_t>(i)].data; };
  auto G = [this](int i) { return params_[static_cast<std::size_t>(i)].grad; };
  std::vector<Real> dlogits(logits_.size(), Real(0)), dxf(static_cast<std::size_t>(NC), Real(0));
  if (c.head == Head::kLanguageModel) {
    const Index V = c.vocab;
    cross_entropy_backward(dlogits.data(), probs_.data(), targets_.data(), lengths_, B, T, V);
    linear_backward(dxf.data(), G(head_), G(head_ + 1), dlogits.data(), xf_.data(), P(head_), N, C, V);
  } else {
    const Index K = c.classes;
    cross_entropy_backward(dlogits.data(), probs_.data(), targets_.data(), {}, B, Index{1}, K);
    std::vector<Real> dpooled(static_cast<std::size_t>(B * C), Real(0));
    linear_backward(dpooled.data(), G(head_), G(head_ + 1), dlogits.data(), pooled_.data(), P(head_), B, C, K);
    for (Index b = 0; b < B; ++b) {
      const Index len = lengths_.empty() ? T : lengths_[static_cast<std::size_t>(b)];
      for (Index t = 0; t < len; ++t)
        for (Index i = 0; i < C; ++i)
          dxf[static_cast<std::size_t>((b * T + t) * C + i)] += dpooled[static_cast<std::size_t>(b * C + i)] / static_cast<Real>(len);
    }
  }
  std::vector<Real> dres(static_cast<std::size_t>(siamese() ? 2 * NC : NC), Real(0)), dprev(dres.size());
  dx_.clear();
  if (record_dx_) dx_.resize(static_cast<std::size_t>(c.layers));
  if (siamese()) {
    std::vector<Real> dsum(static_cast<std::size_t>(NC), Real(0));
    final_norm_.backward(dsum.data(), dxf.data(), fsum_.data(), params_, N, C, lengths_, T);  // xf = ln_f(fsum)
    final_y_.backward(dres.data() + NC, dsum.data(), res_.back().data() + NC, params_, N, C, lengths_, T);  // fsum = ... + ln_f_y(y)
    final_x_.backward(dres.data(), dsum.data(), res_.back().data(), params_, N, C, lengths_, T);            // fsum = ln_f_x(x) + ...
  } else if (has_final_norm()) {
    final_norm_.backward(dres.data(), dxf.data(), res_.back().data(), params_, N, C, lengths_, T);
  } else {
    dres = dxf;
  }
  for (int l = c.layers - 1; l >= 0; --l) {
    if (!skipped(l)) {  // skipped: identity, dres passes through
      std::fill(dprev.begin(), dprev.end(), Real(0));
      blocks_[static_cast<std::size_t>(l)].backward(dprev.data(), dres.data(), res_[static_cast<std::size_t>(l)].data(),
                                                    params_, shape_, lengths_);
      std::swap(dres, dprev);
    }
    if (record_dx_) dx_[static_cast<std::size_t>(l)] = dres;  // ∂L/∂x_l, block l's input
  }
  if (siamese()) residual_backward(dres.data(), static_cast<Real*>(nullptr), dres.data() + NC, NC);  // y0 = x0
  // x0 = embed + positions
  if (wpe_ >= 0) position_backward(static_cast<Real*>(nullptr), G(wpe_), dres.data(), B, T, C);
  if (frames_) {
    linear_backward(static_cast<Real*>(nullptr), G(input_), G(input_ + 1), dres.data(), frames_, P(input_), N,
                    static_cast<Index>(c.input_dim), C);
  } else {
    token_embedding_backward(G(embed_), dres.data(), tokens_, B, T, C, static_cast<Index>(c.vocab));
  }
}

// ---- instrumentation -------------------------------------------------------------------------------

namespace {
// Mean over the real rows of ‖x[row]‖ for an (B,T,C) activation.
template <typename Real>
double mean_row_norm(const Real* x, const Shape& s, std::span<const Index> lengths) {
  double sum = 0;
  Index count = 0;
  for (Index b = 0; b < s.B; ++b) {
    const Index len = lengths.empty() ? s.T : lengths[static_cast<std::size_t>(b)];
    for (Index t = 0; t < len; ++t, ++count) {
      double q = 0;
      for (Index i = 0; i < s.C; ++i) q += double(x[(b * s.T + t) * s.C + i]) * x[(b * s.T + t) * s.C + i];
      sum += std::sqrt(q);
    }
  }
  return count ? sum / count : 0.0;
}
}  // namespace

template <typename Real>
std::vector<double> Transformer<Real>::residual_norms() const {
  std::vector<double> out;
  if (!have_forward_) return out;
  for (int l = 1; l <= cfg_.layers; ++l) out.push_back(mean_row_norm(stream(l), shape_, lengths_));
  return out;
}

template <typename Real>
std::vector<double> Transformer<Real>::ln_input_norms() const {
  std::vector<double> out;
  if (!have_forward_) return out;
  for (int l = 0; l < cfg_.layers; ++l) {
    const Block<Real>& b = blocks_[static_cast<std::size_t>(l)];
    for (const Real* x : b.norm_inputs(res_[static_cast<std::size_t>(l)].data()))
      out.push_back(skipped(l) ? NAN : mean_row_norm(x, shape_, lengths_));
  }
  if (siamese()) {
    out.push_back(mean_row_norm(res_.back().data(), shape_, lengths_));
    out.push_back(mean_row_norm(res_.back().data() + shape_.N() * shape_.C, shape_, lengths_));
    out.push_back(mean_row_norm(fsum_.data(), shape_, lengths_));
  } else if (has_final_norm()) {
    out.push_back(mean_row_norm(res_.back().data(), shape_, lengths_));
  }
  return out;
}

// SiameseNorm reports its y stream (the Pre-LN-like identity path); the others their one stream.
template <typename Real>
const Real* Transformer<Real>::stream(int l) const {
  const Real* r = res_[static_cast<std::size_t>(l)].data();
  return siamese() ? r + shape_.N() * shape_.C : r;
}

// Mean pairwise cosine of the real tokens of each sequence, averaged over sequences with ≥ 2 tokens:
// Σ_{i≠j} cos(x_i, x_j) = ‖Σ_i x̂_i‖² − n, so the mean is (‖Σ x̂‖² − n) / (n(n − 1)).
template <typename Real>
std::vector<double> Transformer<Real>::token_cosine() const {
  std::vector<double> out;
  if (!have_forward_) return out;
  const Shape& s = shape_;
  for (int l = 1; l <= cfg_.layers; ++l) {
    const Real* x = stream(l);
    double total = 0;
    int seqs = 0;
    for (Index b = 0; b < s.B; ++b) {
      const Index n = lengths_.empty() ? s.T : lengths_[static_cast<std::size_t>(b)];
      if (n < 2) continue;
      std::vector<double> sum(static_cast<std::size_t>(s.C), 0.0);
      for (Index t = 0; t < n; ++t) {
        const Real* row = x + (b * s.T + t) * s.C;
        double q = 0;
        for (Index i = 0; i < s.C; ++i) q += double(row[i]) * row[i];
        const double r = q > 0 ? 1.0 / std::sqrt(q) : 0.0;
        for (Index i = 0; i < s.C; ++i) sum[static_cast<std::size_t>(i)] += r * row[i];
      }
      double q = 0;
      for (double v : sum) q += v * v;
      total += (q - static_cast<double>(n)) / static_cast<double>(n * (n - 1));
      ++seqs;
    }
    out.push_back(seqs ? total / seqs : NAN);
  }
  return out;
}

template <typename Real>
void Transformer<Real>::record_input_grads(bool on) {
  record_dx_ = on;
  if (!on) dx_.clear();
}

template <typename Real>
std::span<const Real> Transformer<Real>::input_grad(int l) const {
  NL_CHECK(l >= 0 && l < cfg_.layers, "model: input_grad block {} is out of range [0, {})", l, cfg_.layers);
  if (dx_.empty()) return {};
  return dx_[static_cast<std::size_t>(l)];
}

template <typename Real>
std::vector<double> Transformer<Real>::input_grad_norms() const {
  std::vector<double> out;
  const Index NC = shape_.N() * shape_.C;
  for (const std::vector<Real>& d : dx_) out.push_back(mean_row_norm(siamese() ? d.data() + NC : d.data(), shape_, lengths_));
  return out;
}

template class Transformer<float>;
template class Transformer<double>;

// ---- Model: the float facade of model.h ----------------------------------------------------------------

struct Model::Impl {
  explicit Impl(const ModelConfig& cfg) : net(cfg) {}
  Transformer<float> net;
};

Model::Model(const ModelConfig& cfg) : impl_(std::make_unique<Impl>(cfg)) {}
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

const ModelConfig& Model::config() const { return impl_->net.config(); }

std::vector<ParamRef> Model::params() {
  std::vector<ParamRef> out;
  for (auto& p : impl_->net.params()) out.push_back(ParamRef{p.name, p.shape, p.data, p.grad});
  return out;
}

double Model::forward(const std::int32_t* tokens, const std::int32_t* targets, Index B, Index T,
                      std::span<const Index> lengths) {
  return impl_->net.forward(tokens, targets, B, T, lengths);
}
double Model::forward_frames(const float* frames, const std::int32_t* labels, Index B, Index T,
                             std::span<const Index> lengths) {
  return impl_->net.forward_frames(frames, labels, B, T, lengths);
}
void Model::backward() { impl_->net.backward(); }
void Model::set_skipped_blocks(std::vector<int> skipped) { impl_->net.set_skipped_blocks(std::move(skipped)); }
std::vector<double> Model::residual_norms() const { return impl_->net.residual_norms(); }
std::vector<double> Model::ln_input_norms() const { return impl_->net.ln_input_norms(); }
std::vector<double> Model::token_cosine() const { return impl_->net.token_cosine(); }
void Model::record_input_grads(bool on) { impl_->net.record_input_grads(on); }
std::span<const float> Model::input_grad(int l) const { return impl_->net.input_grad(l); }
std::vector<double> Model::input_grad_norms() const { return impl_->net.input_grad_norms(); }
const float* Model::logits() const { return impl_->net.logits(); }
std::vector<ParamRef> Model::buffers() {
  std::vector<ParamRef> out;
  for (auto& b : impl_->net.buffers()) out.push_back(ParamRef{b.name, b.shape, b.data, nullptr});
  return out;
}
void Model::set_training(bool training) { impl_->net.set_training(training); }
void Model::set_batch_norm_kernels(const BatchNormKernels* kernels) {
  impl_->net.set_batch_norm_kernels(kernels);
}
bool Model::training() const { return impl_->net.training(); }

}  // namespace normlab::nn
