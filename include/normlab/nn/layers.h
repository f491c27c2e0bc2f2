// normlab/nn/layers.h — the layer library of the Transformer engine (forward/backward pairs).
//
// Style (llm.c): every layer is a pair of plain functions, <layer>_forward and <layer>_backward, side by
// side. Arguments come in one order: outputs, then inputs (activations, then parameters), then sizes.
// All arrays are contiguous, row-major, and owned by the caller; nothing here keeps state.
//
// Scalar type: every layer is a template on Real ∈ {float, double}, explicitly instantiated for both.
//   float   the engine: matrix products through oneDNN (dnnl_sgemm), LayerNorm/RMSNorm through
//           normlab's library kernels (include/normlab/norm.h).
//   double  the float64 reference "beside" the kernel: the same formulas in plain loops. It is what the
//           tests run float64 finite differences on and compare the float path against.
//
// Dimension vocabulary (llm.c):
//   B batch, T sequence length (time), C model width (d_model), H heads (hs = C/H per head),
//   F FFN hidden width, V vocabulary size, OC output channels of a Linear,
//   N number of rows = B·T for layers that act on each position alone.
//   An activation "(B,T,C)" is B·T·C numbers, C innermost. Weights follow PyTorch's layout, so they load
//   from PyTorch .npy files as-is: a Linear's weight is (OC, C), an embedding table (V, C).
//
// GRADIENT CONVENTION (llm.c's):
//   * Forward outputs are WRITTEN (=).
//   * Every backward ACCUMULATES (+=): parameter gradients (dweight, dbias, dwte, ...) AND the gradient
//     of the layer's input activations (dinp, ...). The caller zeroes the gradient buffers once before
//     a backward pass. Residual branches can therefore sum into the same buffer, and a parameter used
//     twice (tied weights) collects both contributions.
//   * A pointer documented as "nullable" may be nullptr: that gradient is not wanted / that optional
//     parameter is absent. A bare nullptr does not deduce Real, so name the scalar type in such calls:
//     linear_forward<float>(out, inp, weight, nullptr, N, C, OC).
//   * Backward never modifies its inputs (dout, the saved activations, the parameters).
//   Internal scratch (e.g. the FFN hidden gradient, the attention q/k/v gradients) lives in per-thread
//   buffers that are reused from call to call (src/nn/scratch.h): no allocation per training step.
//
// Padding (lengths): where a layer takes `lengths`, it is either empty (no padding) or holds B entries,
// 0 ≤ lengths[b] ≤ T; positions t ≥ lengths[b] of sequence b are padding. See attention and
// cross-entropy for what each does with them.
//
// Errors: sizes must be ≥ 1, heads must divide C, lengths must lie in [0, T], token ids in [0, V);
// violations throw normlab::Error with the value and the valid range (include/normlab/error.h).
//
// Threading: OpenMP through normlab's deterministic parallel_for (chunks fixed by the shape), so
// results are the same bits for any thread count, except for the float matrix products, which oneDNN
// threads on its own (deterministic for a given thread count).
#pragma once

#include <normlab/norm.h>
#include <normlab/tensor.h>

#include <cstdint>
#include <functional>
#include <span>

namespace normlab::nn {

// ---- Token embedding and positions ------------------------------------------------------------------

// out[b,t,:] = wte[tokens[b,t], :]                                       (=)
// out is (B,T,C); tokens is (B,T) with ids in [0, V); wte is (V,C)
template <typename Real>
void token_embedding_forward(Real* out, const std::int32_t* tokens, const Real* wte, Index B, Index T, Index C,
                             Index V);
// dwte[tokens[b,t], :] += dout[b,t,:]                                    (+=)
// dwte is (V,C); dout is (B,T,C); tokens is (B,T)
template <typename Real>
void token_embedding_backward(Real* dwte, const Real* dout, const std::int32_t* tokens, Index B, Index T,
                              Index C, Index V);

// Fixed sinusoidal positions (Vaswani et al. 2017), written into a (T,C) table:
//   pe[t, j] = sin(t · 10000^(−2⌊j/2⌋/C)) for even j,  cos(same angle) for odd j.
// Add it with position_forward (pass dwpe = nullptr to its backward: the table is not trained).
template <typename Real>
void sinusoidal_positions(Real* pe, Index T, Index C);

// out[b,t,:] = inp[b,t,:] + wpe[t,:]                                     (=; out may alias inp)
// out, inp are (B,T,C); wpe is a (T_max,C) table with T_max ≥ T (only its first T rows are read),
// learned or sinusoidal
template <typename Real>
void position_forward(Real* out, const Real* inp, const Real* wpe, Index B, Index T, Index C);
// dinp += dout; dwpe[t,:] += Σ_b dout[b,t,:]                             (+=)
// dinp (nullable), dout are (B,T,C); dwpe (nullable: fixed table) is (T_max,C), first T rows touched
template <typename Real>
void position_backward(Real* dinp, Real* dwpe, const Real* dout, Index B, Index T, Index C);

// ---- Linear -----------------------------------------------------------------------------------------

// out = inp · weightᵀ + bias                                             (=)
// out is (N,OC); inp is (N,C); weight is (OC,C) (PyTorch layout); bias (nullable) is (OC)
template <typename Real>
void linear_forward(Real* out, const Real* inp, const Real* weight, const Real* bias, Index N, Index C,
                    Index OC);
// dinp += dout · weight;  dweight += doutᵀ · inp;  dbias += Σ_rows dout  (+=)
// dinp (nullable) is (N,C); dweight is (OC,C); dbias (nullable) is (OC); dout is (N,OC)
template <typename Real>
void linear_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                     const Real* weight, Index N, Index C, Index OC);

// ---- Activations and the FFN ------------------------------------------------------------------------

enum class Activation {
  kRelu,      // max(x, 0); derivative 0 at x = 0 (as PyTorch)
  kGelu,      // exact GELU x·Φ(x) = 0.5·x·(1 + erf(x/√2)): PyTorch's nn.GELU() default
  kGeluTanh,  // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): nn.GELU(approximate="tanh")
};

// out = act(inp), elementwise                                            (=; out may alias inp)
// out, inp are (N)
template <typename Real>
void activation_forward(Real* out, const Real* inp, Index N, Activation act);
// dinp += act'(inp) ⊙ dout                                               (+=)
// dinp, dout, inp are (N); inp is the forward's INPUT (pre-activation)
template <typename Real>
void activation_backward(Real* dinp, const Real* dout, const Real* inp, Index N, Activation act);

// FFN: h = inp·w1ᵀ + b1;  a = act(h);  out = a·w2ᵀ + b2                  (out, h, a written =)
// out is (N,C); h, a are (N,F) (saved for backward); inp is (N,C)
// w1 is (F,C), b1 (nullable) (F); w2 is (C,F), b2 (nullable) (C)
template <typename Real>
void ffn_forward(Real* out, Real* h, Real* a, const Real* inp, const Real* w1, const Real* b1, const Real* w2,
                 const Real* b2, Index N, Index C, Index F, Activation act);
// The reverse: linear_backward(w2) → activation_backward → linear_backward(w1)       (all +=)
// dinp (nullable) is (N,C); dw1 (F,C), db1 (nullable) (F); dw2 (C,F), db2 (nullable) (C)
// dout is (N,C); inp, h, a, w1, w2 as in the forward. Uses one (N,F) scratch buffer.
template <typename Real>
void ffn_backward(Real* dinp, Real* dw1, Real* db1, Real* dw2, Real* db2, const Real* dout, const Real* inp,
                  const Real* h, const Real* a, const Real* w1, const Real* w2, Index N, Index C, Index F,
                  Activation act);

// ---- Residual add -----------------------------------------------------------------------------------

// out = inp1 + inp2                                                      (=; out may alias an input)
// out, inp1, inp2 are (N)
template <typename Real>
void residual_forward(Real* out, const Real* inp1, const Real* inp2, Index N);
// dinp1 += dout;  dinp2 += dout                                          (+=; either may be nullptr)
// A residual stream whose gradient buffer already holds dout needs no call at all: that is the point of
// the += convention.
template <typename Real>
void residual_backward(Real* dinp1, Real* dinp2, const Real* dout, Index N);

// ---- Multi-head self-attention ----------------------------------------------------------------------
//
// q = inp·wqᵀ + bq, k = inp·wkᵀ + bk, v = inp·wvᵀ + bv      (each (B,T,C); head h = channels [h·hs, (h+1)·hs))
// att[b,h,i,:] = softmax_j( q_i·k_j / √hs  over the ALLOWED keys j )        (B,H,T,T), 0 elsewhere
// ctx[b,i,h·hs:(h+1)·hs] = Σ_j att[b,h,i,j] · v_j                          (B,T,C)
// out = ctx·woᵀ + bo                                                       (B,T,C)
// Allowed keys for query i of sequence b: j < len_b (padding), and j ≤ i when causal; len_b = T when
// `lengths` is empty. PADDED QUERY ROWS (i ≥ len_b): att row, ctx row and out row are written 0 (no
// bias), dout there is ignored, and nothing flows back from them: the layer's output and gradients for
// real positions do not depend on padded tokens in any way.

// Parameters: each w is (C,C) in PyTorch layout (out, in), each b is (C).
template <typename Real>
struct AttentionParams {
  const Real* wq;
  const Real* bq;
  const Real* wk;
  const Real* bk;
  const Real* wv;
  const Real* bv;
  const Real* wo;
  const Real* bo;
};
// Their gradients, same shapes, accumulated (+=).
template <typename Real>
struct AttentionGrads {
  Real* dwq;
  Real* dbq;
  Real* dwk;
  Real* dbk;
  Real* dwv;
  Real* dbv;
  Real* dwo;
  Real* dbo;
};
// Activations the forward saves for the backward (written = by the forward, read by the backward).
template <typename Real>
struct AttentionActs {
  Real* q;    // (B,T,C)
  Real* k;    // (B,T,C)
  Real* v;    // (B,T,C)
  Real* att;  // (B,H,T,T) softmax probabilities (0 at masked keys and padded query rows)
  Real* ctx;  // (B,T,C) heads concatenated, before the output projection
};

// Scaled dot-product attention alone (the core of the layer, no projections).
// ctx is (B,T,C), att is (B,H,T,T) (=); q, k, v are (B,T,C)
template <typename Real>
void sdpa_forward(Real* ctx, Real* att, const Real* q, const Real* k, const Real* v,
                  std::span<const Index> lengths, Index B, Index T, Index C, Index H, bool causal);
// dq, dk, dv (B,T,C) += the gradients through the softmax; dctx is (B,T,C) (rows of padded queries are
// ignored); q, k, v, att as saved by sdpa_forward
template <typename Real>
void sdpa_backward(Real* dq, Real* dk, Real* dv, const Real* dctx, const Real* q, const Real* k,
                   const Real* v, const Real* att, std::span<const Index> lengths, Index B, Index T,
                   Index C, Index H, bool causal);

// The layer. out is (B,T,C) (=); acts as above (=); inp is (B,T,C).
// Throws "heads (H) must divide d_model (C)" when C % H ≠ 0.
template <typename Real>
void attention_forward(Real* out, const AttentionActs<Real>& acts, const Real* inp,
                       const AttentionParams<Real>& params, std::span<const Index> lengths, Index B, Index T,
                       Index C, Index H, bool causal);
// dinp (nullable) (B,T,C) and grads (+=); dout is (B,T,C); inp, params, acts as in the forward.
// Uses 4 (B,T,C) scratch buffers (5 with padding).
template <typename Real>
void attention_backward(Real* dinp, const AttentionGrads<Real>& grads, const Real* dout, const Real* inp,
                        const AttentionParams<Real>& params, const AttentionActs<Real>& acts,
                        std::span<const Index> lengths, Index B, Index T, Index C, Index H, bool causal);

// ---- Softmax cross-entropy ----------------------------------------------------------------------------
//
// Position (b,t) COUNTS when t < lengths[b] (or `lengths` is empty) and targets[b,t] ≥ 0; a negative
// target is ignored (PyTorch's ignore_index = −100 works). n = number of counted positions.
//   probs[b,t,:] = softmax(logits[b,t,:])   (every position, counted or not)
//   loss = (1/n) Σ_counted −log probs[b,t,targets[b,t]]
// When n = 0 the loss is 0 and the gradient 0 (PyTorch returns NaN there).

// probs is (B,T,V) (=); logits is (B,T,V); targets is (B,T) with values < V. Returns the mean loss,
// summed in double.
template <typename Real>
double cross_entropy_forward(Real* probs, const Real* logits, const std::int32_t* targets,
                             std::span<const Index> lengths, Index B, Index T, Index V);
// dlogits[b,t,:] += dloss/n · (probs[b,t,:] − onehot(targets[b,t]))  at counted positions (+=)
// dlogits is (B,T,V); probs as saved by the forward; dloss is the gradient of the mean loss (1 for a
// loss that is minimized directly)
template <typename Real>
void cross_entropy_backward(Real* dlogits, const Real* probs, const std::int32_t* targets,
                            std::span<const Index> lengths, Index B, Index T, Index V, double dloss = 1.0);

// ---- Normalization layers over the last axis (C) of N rows ---------------------------------------------

// DyT (Zhu et al. 2025): out = gamma ⊙ tanh(alpha·inp) + beta             (=)
// out, inp are (N,C); alpha is ONE learned scalar (init kDytAlphaInit); gamma, beta are (C)
inline constexpr double kDytAlphaInit = 0.5;
template <typename Real>
void dyt_forward(Real* out, const Real* inp, const Real* alpha, const Real* gamma, const Real* beta, Index N,
                 Index C);
// With s = tanh(alpha·x):  dinp += dout·gamma·alpha·(1−s²);  dalpha += Σ dout·gamma·x·(1−s²);
// dgamma += Σ_rows dout·s;  dbeta += Σ_rows dout                          (+=)
// dinp (nullable) (N,C); dalpha (1); dgamma, dbeta (C); the sums are taken in double.
template <typename Real>
void dyt_backward(Real* dinp, Real* dalpha, Real* dgamma, Real* dbeta, const Real* dout, const Real* inp,
                  const Real* alpha, const Real* gamma, Index N, Index C);

// LayerNorm over the last axis (normlab::layer_norm_forward for float; the same formulas in plain
// double loops for double, see docs/numerics.md):
//   mean = Σx/C, rstd = 1/sqrt(Σ(x−mean)²/C + eps), out = (x−mean)·rstd·weight + bias   (=)
// out, inp are (N,C); mean, rstd (both nullable) are (N); weight, bias (nullable) are (C)
template <typename Real>
void layernorm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const Real* weight,
                       const Real* bias, Index N, Index C, double eps = 1e-5);
// dinp += rstd·(g − mean(g) − x̂·mean(g·x̂)) with g = dout·weight;  dweight += Σ dout·x̂;  dbias += Σ dout
// dinp (nullable) (N,C); dweight, dbias (nullable) (C). The statistics are recomputed from inp in double
// (as normlab's library backward does), so the forward's mean/rstd need not be kept.
template <typename Real>
void layernorm_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                        const Real* weight, Index N, Index C, double eps = 1e-5);

// RMSNorm over the last axis: rstd = 1/sqrt(Σx²/C + eps), out = x·rstd·weight           (=)
// out, inp are (N,C); rstd (nullable) is (N); weight (nullable) is (C)
template <typename Real>
void rmsnorm_forward(Real* out, Real* rstd, const Real* inp, const Real* weight, Index N, Index C,
                     double eps = 1e-6);
// dinp += rstd·(g − x̂·mean(g·x̂)) with g = dout·weight;  dweight += Σ dout·x̂        (+=)
template <typename Real>
void rmsnorm_backward(Real* dinp, Real* dweight, const Real* dout, const Real* inp, const Real* weight,
                      Index N, Index C, double eps = 1e-6);

// BatchNorm over the sequence (BatchNorm1d on (B,T,C): one group per channel c over all REAL positions
// (b, t), t < lengths[b]; padded positions take no part, and out/dinp are written 0 there):
//   training  mean_c, var_c = biased moments over the real positions; out = (x − mean)·rstd·weight + bias,
//             rstd = 1/sqrt(var + eps); the running statistics (when given) are updated as PyTorch's:
//             running_mean ← (1−momentum)·running_mean + momentum·mean,
//             running_var  ← (1−momentum)·running_var + momentum·var·n/(n−1)  (n real positions)
//   eval      the running statistics instead of the batch ones (required, read only)
// float: normlab's batch_norm_forward/backward (include/normlab/norm.h) on the real rows; double: the
// same formulas in plain double loops. Training needs n ≥ 2 real positions.
// out, inp are (B,T,C); running_mean, running_var (nullable in training) are (C); weight, bias
// (nullable) are (C)                                                              (=; running stats updated)
// The float path's BatchNorm kernels are normlab's batch_norm_forward/backward unless `kernels` is given:
// data-parallel training passes SyncBatchNorm's (normlab_dist, dist::data_parallel), which take the
// statistics over every rank's batch. They are called on the real rows [n, C] without lengths; with them the
// check for ≥ 2 real positions is theirs (over all ranks). The double path takes none.
struct BatchNormKernels {
  std::function<void(View y, View running_mean, View running_var, ConstView x, ConstView weight,
                     ConstView bias, const BatchNormOptions& opt)>
      forward;
  std::function<void(View dx, View dweight, View dbias, ConstView dy, ConstView x, ConstView weight,
                     ConstView running_mean, ConstView running_var, const BatchNormOptions& opt,
                     GradMode mode)>
      backward;
};
template <typename Real>
void batchnorm_forward(Real* out, Real* running_mean, Real* running_var, const Real* inp, const Real* weight,
                       const Real* bias, std::span<const Index> lengths, Index B, Index T, Index C,
                       bool training, double momentum = 0.1, double eps = 1e-5,
                       const BatchNormKernels* kernels = nullptr);
// training: dinp += rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dout·weight, moments over the real positions
// (recomputed from inp in double); eval: dinp += dout·weight·rstd_running.  dweight += Σ dout·x̂,
// dbias += Σ dout over the real positions                                           (+=)
// dinp (nullable) (B,T,C); dweight, dbias (nullable) (C); running_* as in the forward (eval only)
template <typename Real>
void batchnorm_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                        const Real* weight, const Real* running_mean, const Real* running_var,
                        std::span<const Index> lengths, Index B, Index T, Index C, bool training,
                        double eps = 1e-5, const BatchNormKernels* kernels = nullptr);

}  // namespace normlab::nn
