// normlab/nn/model.h — the Transformer model: blocks with a norm placement, LM and classifier heads.
//
// CONTRACT shared by the model (src/nn/block.cpp, src/nn/model.cpp) and the training code
// (src/nn/optim.cpp, schedule.cpp, data.cpp, checkpoint.cpp, train.cpp):
//   * A Model owns its parameters, their gradients and its activations, all float32.
//   * params() lists every parameter exactly once, in a fixed order, with a stable dotted name
//     ("wte", "blocks.3.attn.q.weight", "blocks.3.ffn.w2.weight", "ln_f.weight", "head.weight", ...),
//     its shape, and pointers to its data and its gradient. Optimizers, checkpoints, gradient
//     clipping, instrumentation and the LibTorch comparison all iterate over this one list.
//   * forward() computes the mean cross-entropy and keeps what backward() needs; backward() zeroes
//     every gradient and then fills them (the layer library accumulates, see layers.h).
//   * Everything random is seeded from ModelConfig::seed.
// Placements and their constants: ../shared/reference/placements.md (docs/placements.md in the repo).
#pragma once

#include <normlab/tensor.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace normlab::nn {

enum class Placement {
  kPost,      // x ← LN(x + F(x))
  kPre,       // x ← x + F(LN(x)); final LN
  kSandwich,  // Peri-LN: x ← x + LN_out(F(LN_in(x)))
  kDeepNorm,  // x ← LN(α·x + F(x)); β-scaled init
  kB2T,       // Takase et al. 2023
  kMixLN,     // Post-LN in the first ⌊αL⌋ blocks, Pre-LN after
  kLNS,       // Pre-LN with LN outputs scaled by 1/√l
  kSiamese,   // SiameseNorm: two streams through shared sublayers
  kSpanNorm,  // see docs/placements.md
  kNone,      // x ← x + F(x)
};
const char* placement_name(Placement p);
Placement parse_placement(const std::string& name);  // throws normlab::Error listing the valid names

// kBatchNorm: BatchNorm1d over the sequence (statistics per channel over every real position of the
// batch, padding excluded), with running statistics (Model::buffers) and train/eval mode.
enum class NormKind { kLayerNorm, kRmsNorm, kDyT, kBatchNorm };
const char* norm_kind_name(NormKind n);                // "layer", "rms", "dyt", "batch"
NormKind parse_norm_kind(const std::string& name);     // throws normlab::Error listing the valid names
enum class Head { kLanguageModel, kClassifier };  // next-token LM (causal) or mean-pooled classifier
enum class PositionKind { kSinusoidal, kLearned };
enum class InitKind { kXavierUniform, kNormal };

struct ModelConfig {
  Placement placement = Placement::kPre;
  NormKind norm = NormKind::kLayerNorm;
  Head head = Head::kLanguageModel;
  PositionKind positions = PositionKind::kSinusoidal;
  InitKind init = InitKind::kXavierUniform;
  int layers = 6;
  int d_model = 64;
  int heads = 4;
  int ffn = 256;
  int vocab = 256;      // LM: vocabulary; classifier: input tokens' vocabulary (or 0 for real-valued input)
  int classes = 0;      // classifier: number of classes
  int input_dim = 0;    // classifier over real-valued frames (speech): feature width, 0 = token input
  int max_seq = 64;
  double norm_eps = 1e-5;
  double mixln_alpha = 0.25;  // Mix-LN: fraction of Post-LN blocks
  bool causal = true;         // LM: causal; classifier: bidirectional by default (set false)
  bool gelu = false;          // FFN activation: ReLU (default, as lab.md) or GELU
  std::uint64_t seed = 0;
};

struct BatchNormKernels;  // normlab/nn/layers.h

struct ParamRef {
  std::string name;
  Dims shape;
  float* data;
  float* grad;
  Index numel() const { return shape.product(); }
};

class Model {
 public:
  explicit Model(const ModelConfig& cfg);  // validates (heads | d_model, sizes ≥ 1, ...) and initializes
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;

  const ModelConfig& config() const;
  std::vector<ParamRef> params();

  // LM: tokens and targets are (B,T) int32, targets −1 = ignored. Returns the mean cross-entropy over
  // predicted tokens. lengths: empty or B entries (padding mask).
  double forward(const std::int32_t* tokens, const std::int32_t* targets, Index B, Index T,
                 std::span<const Index> lengths = {});
  // Classifier over real-valued frames: frames (B,T,input_dim), labels (B). Returns mean cross-entropy.
  double forward_frames(const float* frames, const std::int32_t* labels, Index B, Index T,
                        std::span<const Index> lengths = {});
  void backward();  // zero every gradient, then backpropagate the last forward's loss

  // Buffers: state that is not trained by gradients, i.e. BatchNorm's running statistics
  // ("blocks.l.norm1.running_mean", "….running_var", shape (d_model), grad = nullptr), in forward order;
  // empty for the other norms. Checkpoints save them next to params().
  std::vector<ParamRef> buffers();
  // Train/eval mode (PyTorch's model.train()/model.eval()); only BatchNorm depends on it: training uses
  // the batch statistics over all real positions and updates the running ones, eval uses the running
  // ones. Default: training.
  void set_training(bool training);
  bool training() const;
  // BatchNorm kernels of every BatchNorm layer (layers.h; null: normlab's). Data-parallel training sets
  // SyncBatchNorm's; `kernels` must outlive their use.
  void set_batch_norm_kernels(const BatchNormKernels* kernels);

  // Layer-removal test: blocks not run (identity) in subsequent forwards; empty = run all.
  void set_skipped_blocks(std::vector<int> skipped);

  // Instrumentation of the last forward/backward (per block, from the input side).
  std::vector<double> residual_norms() const;     // mean over tokens of ‖x_l‖ after each block (l = 1..L)
  std::vector<double> ln_input_norms() const;     // mean ‖input‖ of each norm layer, in params() order of norms
  std::vector<double> token_cosine() const;       // mean pairwise cosine similarity of tokens after each block

  // ∂L/∂x_l: the gradient of the last backward's loss w.r.t. block l's residual-stream input x_l (l = 0..L−1;
  // x_0 = embedding + positions, x_l = the output of block l−1), (B,T,C) — SiameseNorm: its (x, y) pair, 2·B·T·C.
  // backward() records it only after record_input_grads(true) (off by default: one stream copy per block); the
  // next forward discards it.
  void record_input_grads(bool on);
  std::span<const float> input_grad(int l) const;  // empty when not recorded since the last forward
  std::vector<double> input_grad_norms() const;    // mean over real tokens of ‖∂L/∂x_l‖ (SiameseNorm: y stream)
  const float* logits() const;                    // (B,T,V) for LM, (B,classes) for classifier

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace normlab::nn
