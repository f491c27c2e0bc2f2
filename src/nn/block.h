// src/nn/block.h — the Transformer engine's blocks and the templated network behind nn::Model (internal).
//
// include/normlab/nn/model.h is the public, float-only contract. Behind it sits Transformer<Real>, the
// same network as a template on Real ∈ {float, double} (like the layers of layers.h): float is the
// engine, double is the float64 reference that tests/nn/model_test.cpp runs finite differences on.
//
// Dimension vocabulary (llm.c): B batch, T time, C d_model, H heads, F FFN width, V vocabulary,
// N = B·T rows. Every activation is (N,C) unless stated. Placement formulas: docs/placements.md.
//
// Gradient convention (layers.h): Block::backward ACCUMULATES (+=) into dinp and into the parameter
// gradients; Transformer::backward zeroes every parameter gradient first.
#pragma once

#include <normlab/nn/layers.h>
#include <normlab/nn/model.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace normlab::nn {

// How a parameter is initialized (docs/placements.md, "Initialization").
enum class ParamInit { kZero, kOne, kDytAlpha, kEmbedding, kPositions, kLinear };

// One parameter tensor of the network: name, shape, and where its values and gradient live.
template <typename Real>
struct ParamEntry {
  std::string name;
  Dims shape;
  Real* data = nullptr;
  Real* grad = nullptr;
  ParamInit init = ParamInit::kZero;
  Index numel() const { return shape.product(); }
};

// A norm layer of the block (LayerNorm, RMSNorm or DyT) with its parameters, and an optional constant
// output scale (LayerNorm Scaling: 1/√l). Parameters are indices into the network's parameter list.
// BatchNorm (over the sequence: all real positions of the batch per channel) also has running statistics,
// buffers of the network (not parameters), and follows the network's train/eval mode.
template <typename Real>
struct Norm {
  NormKind kind = NormKind::kLayerNorm;
  double eps = 1e-5;
  double scale = 1.0;                     // out = scale · norm(inp)
  int alpha = -1, weight = -1, bias = -1;  // DyT: alpha, weight (γ), bias (β); LN/BN: weight, bias; RMS: weight
  int running = -1;       // BatchNorm: index of its running_mean in the network's buffers; running_var follows
  Real* running_mean = nullptr;  // BatchNorm: (C), set by the network once its buffers are allocated
  Real* running_var = nullptr;
  bool training = true;  // BatchNorm: batch statistics (and running-stat updates) or the running ones
  double momentum = 0.1;
  const BatchNormKernels* bn_kernels = nullptr;  // BatchNorm: null = normlab's (layers.h); set by the network
  // out (N,C) =; inp (N,C); N = B·T rows with T given (BatchNorm: the lengths' padding is excluded)
  void forward(Real* out, const Real* inp, const std::vector<ParamEntry<Real>>& p, Index N, Index C,
               std::span<const Index> lengths = {}, Index T = 0) const;
  // dinp (N,C) += and the parameter gradients +=; dout, inp (N,C)
  void backward(Real* dinp, const Real* dout, const Real* inp, const std::vector<ParamEntry<Real>>& p, Index N,
                Index C, std::span<const Index> lengths = {}, Index T = 0) const;
};

// How one block combines its two sublayers (attention, FFN) with its norms.
enum class BlockStyle {
  kPost,      // x ← LN(a·x + F(x)), a = 1 (Post-LN) or DeepNorm's α
  kPre,       // x ← x + F(s·LN(x)), s = 1 (Pre-LN) or 1/√l (LayerNorm Scaling)
  kSandwich,  // x ← x + LN_out(F(LN_in(x)))
  kB2T,       // h ← LN₁(x + Attn(x)); y ← LN₂(h + FFN(h) + x)
  kNone,      // x ← x + F(x)
  kSiamese,   // two streams (x, y), 2·N·C wide: x ← PostN(x); z = F(InN(x + PreN(y))); x ← x + z/c; y ← y + z
};

// Per-block activations saved by the forward for the backward. Buffers a style does not use stay empty.
template <typename Real>
struct BlockActs {
  std::vector<Real> u1, f1, g1, s1, m, u2, f2, g2, s2;  // (N,C): see Block::forward
  std::vector<Real> ym;                                 // (N,C) SiameseNorm: the y stream between sublayers
  std::vector<Real> q, k, v, ctx;                       // (N,C) attention
  std::vector<Real> att;                                // (B,H,T,T)
  std::vector<Real> h, a;                               // (N,F) FFN
};

// Sizes of one forward pass.
struct Shape {
  Index B = 0, T = 0, C = 0, H = 0, F = 0;
  Index N() const { return B * T; }
};

template <typename Real>
class Block {
 public:
  BlockStyle style = BlockStyle::kPre;
  double alpha = 1.0;           // kPost: the residual multiplier (DeepNorm α; 1 for Post-LN)
  double siamese_c = 1.0;       // kSiamese: c = √(2l), l = index + 1
  int index = 0;                // l − 1 (0-based)
  int attn_params = -1;         // index of blocks.l.attn.q.weight; q.bias, k.*, v.*, o.* follow
  int ffn_params = -1;          // index of blocks.l.ffn.w1.weight; w1.bias, w2.weight, w2.bias follow
  std::vector<Norm<Real>> norms;  // in forward order: see docs/placements.md for each style's list
  Activation act = Activation::kRelu;
  bool causal = true;

  // y (N,C) = block(x); x (N,C) must stay alive and unchanged until backward. kSiamese: x and y are
  // (2,N,C), the x stream then the y stream.
  void forward(Real* y, const Real* x, const std::vector<ParamEntry<Real>>& p, const Shape& s,
               std::span<const Index> lengths);
  // dx (N,C) += ∂loss/∂x, parameter gradients +=; dy (N,C) is ∂loss/∂y; x as in the forward.
  void backward(Real* dx, const Real* dy, const Real* x, const std::vector<ParamEntry<Real>>& p, const Shape& s,
                std::span<const Index> lengths);
  // The input of each norm in the last forward, in `norms` order (pointers into the saved activations).
  std::vector<const Real*> norm_inputs(const Real* x) const;

 private:
  void attn_forward(Real* out, const Real* inp, const std::vector<ParamEntry<Real>>& p, const Shape& s,
                    std::span<const Index> lengths);
  void attn_backward(Real* dinp, const Real* dout, const Real* inp, const std::vector<ParamEntry<Real>>& p,
                     const Shape& s, std::span<const Index> lengths);
  void ffn_forward_(Real* out, const Real* inp, const std::vector<ParamEntry<Real>>& p, const Shape& s);
  void ffn_backward_(Real* dinp, const Real* dout, const Real* inp, const std::vector<ParamEntry<Real>>& p,
                     const Shape& s);
  BlockActs<Real> acts_;
};

// The whole network (embedding → blocks → final norm → head), templated on Real. nn::Model wraps
// Transformer<float>; see model.h for the meaning of every member.
template <typename Real>
class Transformer {
 public:
  explicit Transformer(const ModelConfig& cfg);
  const ModelConfig& config() const { return cfg_; }
  std::vector<ParamEntry<Real>>& params() { return params_; }
  const std::vector<ParamEntry<Real>>& params() const { return params_; }
  // BatchNorm running statistics ("blocks.l.norm1.running_mean", "...running_var"), grad = nullptr
  std::vector<ParamEntry<Real>>& buffers() { return buffers_; }
  void set_training(bool training);
  bool training() const { return training_; }
  void set_batch_norm_kernels(const BatchNormKernels* k);

  double forward(const std::int32_t* tokens, const std::int32_t* targets, Index B, Index T,
                 std::span<const Index> lengths = {});
  double forward_frames(const Real* frames, const std::int32_t* labels, Index B, Index T,
                        std::span<const Index> lengths = {});
  void backward();
  void set_skipped_blocks(std::vector<int> skipped);

  std::vector<double> residual_norms() const;
  std::vector<double> ln_input_norms() const;
  std::vector<double> token_cosine() const;
  // ∂L/∂x_l per block input (model.h: record_input_grads, input_grad, input_grad_norms).
  void record_input_grads(bool on);
  std::span<const Real> input_grad(int l) const;
  std::vector<double> input_grad_norms() const;
  const Real* logits() const { return logits_.data(); }
  // DeepNorm's α and β for this config (1, 1 for the other placements).
  double deepnorm_alpha() const { return deep_alpha_; }
  double deepnorm_beta() const { return deep_beta_; }
  bool has_final_norm() const { return final_norm_.weight >= 0 || final_norm_.alpha >= 0; }
  bool siamese() const { return cfg_.placement == Placement::kSiamese; }

 private:
  int add_param(const std::string& name, Dims shape, ParamInit init);
  int add_linear(const std::string& name, Index out, Index in);  // name.weight (out,in), name.bias (out)
  Norm<Real> add_norm(const std::string& name, double scale = 1.0);
  void build();
  void init();
  double run(const std::int32_t* tokens, const Real* frames, const std::int32_t* targets, Index B, Index T,
             std::span<const Index> lengths);
  bool skipped(int l) const;

  ModelConfig cfg_;
  std::vector<ParamEntry<Real>> params_;
  std::vector<Real> values_, grads_;  // every parameter, flat, in params_ order
  std::vector<ParamEntry<Real>> buffers_;  // BatchNorm running statistics, in forward order
  std::vector<Real> buffer_values_;
  bool training_ = true;
  template <typename F>
  void for_each_norm(F&& f);
  std::vector<Block<Real>> blocks_;
  Norm<Real> final_norm_;
  Norm<Real> final_x_, final_y_;  // SiameseNorm: xf = final_norm(final_x(x) + final_y(y))
  int embed_ = -1, wpe_ = -1, input_ = -1, head_ = -1;
  double deep_alpha_ = 1.0, deep_beta_ = 1.0;
  std::vector<Real> pe_;  // (max_seq, C) sinusoidal table
  std::vector<int> skipped_;

  // the last forward
  Shape shape_;
  std::vector<Index> lengths_;
  const std::int32_t* tokens_ = nullptr;  // LM/classifier token input (caller's memory, as llm.c)
  const Real* frames_ = nullptr;
  std::vector<std::int32_t> targets_;
  std::vector<std::vector<Real>> res_;  // L+1 streams (N,C): res_[0] embedding, res_[l] after block l
  std::vector<Real> xf_;                // (N,C) final norm output (or a copy of res_[L])
  std::vector<Real> fsum_;              // (N,C) SiameseNorm: final_x(x) + final_y(y)
  const Real* stream(int l) const;      // the (N,C) stream reported by the instrumentation after block l
  std::vector<Real> pooled_;            // classifier: (B,C)
  std::vector<Real> logits_, probs_;    // (N,V) or (B,classes)
  bool have_forward_ = false;
  bool record_dx_ = false;
  std::vector<std::vector<Real>> dx_;  // recorded ∂L/∂x_l of the last backward, l = 0..L−1 (empty: not recorded)
};

}  // namespace normlab::nn
