// normlab/nn/optim.h — optimizers and gradient clipping over a Model's params() (nn/model.h).
//
// Semantics follow PyTorch (torch.optim / LibTorch 1.13) step for step, in float32 with the same
// operation order, so that a run can be compared with torch::optim::AdamW / SGD on the same tensors:
//   AdamW (decoupled weight decay, bias correction), for each parameter p with gradient g, t = step + 1:
//       p ← p · (1 − lr·wd)                            (only parameters that decay, see below)
//       m ← β1·m + (1 − β1)·g
//       v ← β2·v + (1 − β2)·g²
//       p ← p − lr/(1 − β1^t) · m / (√v / √(1 − β2^t) + eps)
//   SGD with momentum μ, dampening δ (default 0), Nesterov off by default, L2 weight decay wd:
//       d ← g + wd·p;  b ← d at the first step, else μ·b + (1 − δ)·d;  d ← nesterov ? d + μ·b : b
//       p ← p − lr·d
// The learning rate is an argument of step() (the schedule, nn/schedule.h, supplies it).
// The optimizer keeps the ParamRef list it was built with: the pointers must outlive it (a Model's do).
#pragma once

#include <normlab/nn/model.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace normlab::nn {

// Weight-decay exclusion by name: true for biases (last dotted component "bias"), for the parameters
// of normalization layers (a dotted component that starts with "ln" or contains "norm", e.g.
// "blocks.0.ln1.weight", "ln_f.weight", "blocks.0.attn_norm.weight") and for DyT's "alpha"; also for
// every parameter of rank ≤ 1 whatever its name.
bool is_no_decay(const ParamRef& p);

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.98;  // lab.md: Adam β = (0.9, 0.98)
  double eps = 1e-9;
  double weight_decay = 0.0;
  bool exclude_no_decay = true;  // skip weight decay where is_no_decay(p)
};

struct SgdOptions {
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;
  bool exclude_no_decay = true;
};

// One named state buffer of the optimizer ("exp_avg" of "blocks.0.attn.q.weight"), for checkpoints.
struct OptimStateRef {
  std::string name;  // "<param name>:<buffer>", e.g. "wte:exp_avg"
  float* data;
  Index numel;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step(double lr) = 0;                   // one update of every parameter from its grad
  virtual const char* kind() const = 0;               // "adamw" | "sgd"
  virtual std::vector<OptimStateRef> state() = 0;     // every state buffer, in a fixed order
  std::int64_t steps() const { return steps_; }       // updates taken so far
  void set_steps(std::int64_t n) { steps_ = n; }      // restoring from a checkpoint
  const std::vector<ParamRef>& params() const { return params_; }

 protected:
  explicit Optimizer(std::vector<ParamRef> params);
  std::vector<ParamRef> params_;
  std::vector<bool> decay_;  // weight decay applies to params_[i]
  std::int64_t steps_ = 0;
};

class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<ParamRef> params, const AdamWOptions& opts = {});
  void step(double lr) override;
  const char* kind() const override { return "adamw"; }
  std::vector<OptimStateRef> state() override;
  const AdamWOptions& options() const { return opts_; }

 private:
  AdamWOptions opts_;
  std::vector<std::vector<float>> m_, v_;
};

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<ParamRef> params, const SgdOptions& opts = {});
  void step(double lr) override;
  const char* kind() const override { return "sgd"; }
  std::vector<OptimStateRef> state() override;  // the momentum buffers (none when momentum = 0)
  const SgdOptions& options() const { return opts_; }

 private:
  SgdOptions opts_;
  std::vector<std::vector<float>> buf_;
};

// ‖g‖₂ of one gradient (or any float array), summed in double.
double l2_norm(const float* x, Index n);

// Global gradient norm sqrt(Σ_p ‖g_p‖²): squares summed in double, in params order (deterministic).
double global_grad_norm(std::span<const ParamRef> params);

// torch.nn.utils.clip_grad_norm_: scales every gradient by max_norm / (norm + 1e-6) when that is < 1.
// Returns the norm BEFORE clipping. max_norm ≤ 0 disables clipping (the norm is still returned); a
// non-finite norm leaves the gradients untouched (the training loop reports divergence).
double clip_grad_norm(std::span<const ParamRef> params, double max_norm);

}  // namespace normlab::nn
