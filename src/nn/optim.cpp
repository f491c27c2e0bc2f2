// Optimizers and gradient clipping (include/normlab/nn/optim.h).
//
// Each update mirrors LibTorch 1.13's CPU kernels operation by operation in float32 (scalars computed
// in double and rounded to float once, as ATen does), so normlab and torch::optim agree to rounding.
#include <normlab/error.h>
#include <normlab/nn/optim.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "parallel/parallel.h"

namespace normlab::nn {

namespace {

constexpr Index kChunk = 16384;  // elements per parallel chunk of the optimizer updates

std::vector<std::string_view> split_dots(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = s.find('.', start);
    out.push_back(s.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return out;
}

void check_params(const std::vector<ParamRef>& params) {
  for (const ParamRef& p : params) {
    NL_CHECK(p.data != nullptr && p.grad != nullptr, "optimizer: parameter {} has no data or gradient", p.name);
    NL_CHECK(p.numel() >= 0, "optimizer: parameter {} has shape {}", p.name, p.shape.str());
  }
}

}  // namespace

bool is_no_decay(const ParamRef& p) {
  if (p.shape.size() <= 1) return true;
  const std::vector<std::string_view> parts = split_dots(p.name);
  if (!parts.empty() && (parts.back() == "bias" || parts.back() == "alpha")) return true;
  for (std::string_view c : parts)
    if (c.starts_with("ln") || c.find("norm") != std::string_view::npos) return true;
  return false;
}

Optimizer::Optimizer(std::vector<ParamRef> params) : params_(std::move(params)) {
  check_params(params_);
  decay_.resize(params_.size(), true);
}

// ---- AdamW ------------------------------------------------------------------------------------------

AdamW::AdamW(std::vector<ParamRef> params, const AdamWOptions& opts) : Optimizer(std::move(params)), opts_(opts) {
  NL_CHECK(opts.beta1 >= 0 && opts.beta1 < 1, "AdamW: beta1 must be in [0, 1), got {}", opts.beta1);
  NL_CHECK(opts.beta2 >= 0 && opts.beta2 < 1, "AdamW: beta2 must be in [0, 1), got {}", opts.beta2);
  NL_CHECK(opts.eps >= 0, "AdamW: eps must be ≥ 0, got {}", opts.eps);
  NL_CHECK(opts.weight_decay >= 0, "AdamW: weight decay must be ≥ 0, got {}", opts.weight_decay);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    decay_[i] = !(opts.exclude_no_decay && is_no_decay(params_[i]));
    m_.emplace_back(static_cast<std::size_t>(params_[i].numel()), 0.0f);
    v_.emplace_back(static_cast<std::size_t>(params_[i].numel()), 0.0f);
  }
}

void AdamW::step(double lr) {
  ++steps_;
  const double t = static_cast<double>(steps_);
  const double bc1 = 1 - std::pow(opts_.beta1, t);
  const double bc2 = 1 - std::pow(opts_.beta2, t);
  const float decay = static_cast<float>(1 - lr * opts_.weight_decay);
  const float b1 = static_cast<float>(opts_.beta1), one_b1 = static_cast<float>(1 - opts_.beta1);
  const float b2 = static_cast<float>(opts_.beta2), one_b2 = static_cast<float>(1 - opts_.beta2);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float eps = static_cast<float>(opts_.eps);
  const float neg_step = static_cast<float>(-(lr / bc1));
  for (std::size_t i = 0; i < params_.size(); ++i) {
    float* p = params_[i].data;
    const float* g = params_[i].grad;
    float* m = m_[i].data();
    float* v = v_[i].data();
    const Index n = params_[i].numel();
    const bool wd = decay_[i] && opts_.weight_decay != 0;
    // One element, in float (PyTorch's single-tensor AdamW, the same operations in the same order):
    //   p ← p·(1 − lr·wd);  m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g·g;  p ← p − (lr/bc1)·m/(√v/√bc2 + eps)
    auto one = [&](Index j) {
      float pj = p[j];
      if (wd) pj = pj * decay;
      const float gj = g[j];
      const float mj = m[j] * b1 + one_b1 * gj;
      const float vj = v[j] * b2 + one_b2 * gj * gj;
      const float denom = std::sqrt(vj) / bc2_sqrt + eps;
      m[j] = mj;
      v[j] = vj;
      p[j] = pj + neg_step * mj / denom;
    };
    // Elementwise: fixed chunks in parallel, the same bits for any thread count.
    parallel::parallel_for((n + kChunk - 1) / kChunk, [&](Index c) {
      Index j = c * kChunk;
      const Index end = std::min(n, j + kChunk);
#if defined(__SSE2__)
      // Scalar math: one(j) for four elements at a time (IEEE sqrt and division give the same bits)
      const __m128 vdecay = _mm_set1_ps(decay), vb1 = _mm_set1_ps(b1), vob1 = _mm_set1_ps(one_b1);
      const __m128 vb2 = _mm_set1_ps(b2), vob2 = _mm_set1_ps(one_b2), vbc2 = _mm_set1_ps(bc2_sqrt);
      const __m128 veps = _mm_set1_ps(eps), vstep = _mm_set1_ps(neg_step);
      for (; j + 4 <= end; j += 4) {
        __m128 pj = _mm_loadu_ps(p + j);
        if (wd) pj = _mm_mul_ps(pj, vdecay);
        const __m128 gj = _mm_loadu_ps(g + j);
        const __m128 mj = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(m + j), vb1), _mm_mul_ps(vob1, gj));
        const __m128 vj = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(v + j), vb2), _mm_mul_ps(_mm_mul_ps(vob2, gj), gj));
        const __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vj), vbc2), veps);
        _mm_storeu_ps(m + j, mj);
        _mm_storeu_ps(v + j, vj);
        _mm_storeu_ps(p + j, _mm_add_ps(pj, _mm_div_ps(_mm_mul_ps(vstep, mj), denom)));
      }
#endif
      for (; j < end; ++j) one(j);
    });
  }
}

std::vector<OptimStateRef> AdamW::state() {
  std::vector<OptimStateRef> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    out.push_back({params_[i].name + ":exp_avg", m_[i].data(), params_[i].numel()});
    out.push_back({params_[i].name + ":exp_avg_sq", v_[i].data(), params_[i].numel()});
  }
  return out;
}

// ---- SGD --------------------------------------------------------------------------------------------

Sgd::Sgd(std::vector<ParamRef> params, const SgdOptions& opts) : Optimizer(std::move(params)), opts_(opts) {
  NL_CHECK(opts.momentum >= 0, "SGD: momentum must be ≥ 0, got {}", opts.momentum);
  NL_CHECK(opts.weight_decay >= 0, "SGD: weight decay must be ≥ 0, got {}", opts.weight_decay);
  NL_CHECK(!opts.nesterov || (opts.momentum > 0 && opts.dampening == 0),
           "SGD: Nesterov momentum requires a momentum > 0 and zero dampening");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    decay_[i] = !(opts.exclude_no_decay && is_no_decay(params_[i]));
    if (opts.momentum != 0) buf_.emplace_back(static_cast<std::size_t>(params_[i].numel()), 0.0f);
  }
}

void Sgd::step(double lr) {
  const bool first = steps_ == 0;
  ++steps_;
  const float neg_lr = static_cast<float>(-lr);
  const float mu = static_cast<float>(opts_.momentum);
  const float one_damp = static_cast<float>(1 - opts_.dampening);
  const float wdf = static_cast<float>(opts_.weight_decay);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    float* p = params_[i].data;
    const float* g = params_[i].grad;
    const Index n = params_[i].numel();
    const bool wd = decay_[i] && opts_.weight_decay != 0;
    float* b = opts_.momentum != 0 ? buf_[i].data() : nullptr;
    for (Index j = 0; j < n; ++j) {
      float d = g[j];
      if (wd) d = d + wdf * p[j];
      if (b) {
        const float bj = first ? d : b[j] * mu + one_damp * d;
        b[j] = bj;
        d = opts_.nesterov ? d + mu * bj : bj;
      }
      p[j] = p[j] + neg_lr * d;
    }
  }
}

std::vector<OptimStateRef> Sgd::state() {
  std::vector<OptimStateRef> out;
  for (std::size_t i = 0; i < buf_.size(); ++i)
    out.push_back({params_[i].name + ":momentum_buffer", buf_[i].data(), params_[i].numel()});
  return out;
}

// ---- norms and clipping -----------------------------------------------------------------------------

double l2_norm(const float* x, Index n) {
  double s = 0;
  for (Index i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return std::sqrt(s);
}

double global_grad_norm(std::span<const ParamRef> params) {
  double s = 0;
  for (const ParamRef& p : params) {
    const Index n = p.numel();
    for (Index i = 0; i < n; ++i) s += static_cast<double>(p.grad[i]) * static_cast<double>(p.grad[i]);
  }
  return std::sqrt(s);
}

double clip_grad_norm(std::span<const ParamRef> params, double max_norm) {
  const double norm = global_grad_norm(params);
  if (max_norm <= 0 || !std::isfinite(norm)) return norm;
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1) {
    const float c = static_cast<float>(coef);
    for (const ParamRef& p : params) {
      const Index n = p.numel();
      for (Index i = 0; i < n; ++i) p.grad[i] = p.grad[i] * c;
    }
  }
  return norm;
}

}  // namespace normlab::nn
