// normlab/cmvn.h — cepstral mean and variance normalization (CMVN) as Kaldi and ESPnet/WeNet define it.
//
// Vocabulary: a feature matrix is a 2-D view of T frames × D dims. By default it is [T, D]
// (time_axis = 0); time_axis = 1 reads a [D, T] view in place (no transpose or copy needed). Any strides
// are accepted. Batched ("masked") functions take [B, <one utterance's layout>]: [B, T, D] with
// time_axis = 0, [B, D, T] with time_axis = 1, plus B lengths; frames at t ≥ length are padding.
//
// Semantics followed (restated, not copied, from Kaldi src/transform/cmvn.cc and
// src/feat/feature-functions.cc; see docs/numerics.md "CMVN" for the numerics):
//   * Stats (Kaldi layout): a 2×(D+1) double matrix [Σx_0 .. Σx_{D−1}, count; Σx²_0 .. Σx²_{D−1}, 0].
//   * apply-cmvn: mean = Σx/count; var = Σx²/count − mean² (biased) floored at 1e-20;
//     y = (x − mean) when norm_vars is false (the default), y = (x − mean)/sqrt(var) when true.
//     count < 1 is an error. WeNet's GlobalCMVN JSON {mean_stat, var_stat, frame_num} holds the same
//     three sums (ESPnet's GlobalMVN also floors the variance at 1e-20).
//   * apply-cmvn-sliding: frame t is normalized with the statistics of a window [start, end) of frames:
//       non-centred: [t − cmn_window, t] (cmn_window + 1 frames!), shifted right to start at 0; while it
//                    would end before min_cmn_window it is extended to [0, min_cmn_window) (look-ahead);
//       centred:     [t − cmn_window/2, t − cmn_window/2 + cmn_window), shifted right at the start;
//       both:        shifted left to end at T (start clipped at 0).
//     The variance is floored at 1e-10; a one-frame window with norm_vars outputs 0.
//     Consequence: when T ≤ min(min_cmn_window, cmn_window + 1) (non-centred; T ≤ 100 at the defaults)
//     or T ≤ cmn_window (centred), every frame uses the whole utterance, and the result equals
//     apply_cmvn_per_utterance bit for bit (with norm_vars unless a variance lies between 1e-20 and 1e-10).
//   * Streaming: StreamingCmvn is causal. It needs min_cmn_window ≤ 1 (no look-ahead) and then equals
//     sliding_cmvn with the same options bit for bit; frame t uses [max(0, t − cmn_window), t].
//     Kaldi's OnlineCmvn ("the last N frames", no speaker/global top-up here) is cmn_window = N − 1.
//
// Outputs are written with = . y may alias x exactly (same data pointer; the sliding functions then work
// on a copy of x) but must not partially overlap it. NaN/Inf in the data propagate to the affected dims; no value checks are made on features.
#pragma once

#include <normlab/norm.h>
#include <normlab/tensor.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

namespace normlab {

// Accumulated CMVN statistics, in double: count (frames, possibly weighted) and per-dim Σx and Σx².
class CmvnStats {
 public:
  CmvnStats() = default;          // dim() == 0 until the first add()
  explicit CmvnStats(Index dim);  // zero statistics of a given width

  Index dim() const { return static_cast<Index>(sum_.size()); }
  double count() const { return count_; }
  std::span<const double> sum() const { return sum_; }
  std::span<const double> sum_sq() const { return sum_sq_; }

  // Adds every frame of `feats` (2-D, time along `time_axis`). An empty stats object takes its width
  // from the first add; later widths must match ("stats of the wrong width").
  void add(ConstView feats, int time_axis = 0);
  void add(const CmvnStats& other);

  // Kaldi's 2×(D+1) layout [Σx..., count; Σx²..., 0].
  BasicTensor<double> to_kaldi_matrix() const;
  // Reads the Kaldi layout; throws unless the shape is [2, D+1] with D ≥ 1, every value is finite and
  // count ≥ 0. The (1, D) entry is ignored, as Kaldi does.
  static CmvnStats from_kaldi_matrix(TensorView<const double> m, const std::string& what = "<matrix>");
  void save_kaldi_npy(const std::string& path) const;  // float64 .npy, shape [2, D+1]
  static CmvnStats load_kaldi_npy(const std::string& path);

  // WeNet's global_cmvn JSON: {"mean_stat": [Σx...], "var_stat": [Σx²...], "frame_num": count}.
  std::string to_wenet_json() const;
  static CmvnStats from_wenet_json(const std::string& text, const std::string& what = "<json>");
  void save_wenet_json(const std::string& path) const;
  static CmvnStats load_wenet_json(const std::string& path);

 private:
  double count_ = 0;
  std::vector<double> sum_, sum_sq_;
};

// Options of Kaldi's apply-cmvn.
struct CmvnOptions {
  bool norm_means = true;  // --norm-means
  bool norm_vars = false;  // --norm-vars (needs norm_means, as in Kaldi)
  int time_axis = 0;       // 0: [T, D]; 1: [D, T]
};

// Kaldi apply-cmvn with given (global / speaker) stats. x, y: [T, D] per opts.time_axis; stats.dim() == D.
void apply_cmvn(View y, ConstView x, const CmvnStats& stats, const CmvnOptions& opts = {});
// The same with statistics computed from x itself (per-utterance CMVN). Internally the sums are taken
// around the first frame (a shifted origin), so a large common offset costs no precision and a constant
// band gives exactly 0.
void apply_cmvn_per_utterance(View y, ConstView x, const CmvnOptions& opts = {});

// Backward of apply_cmvn with fixed stats: dx = dy·istd (norm_vars) or dx = dy. dx may alias dy.
void apply_cmvn_backward(View dx, ConstView dy, const CmvnStats& stats, const CmvnOptions& opts = {});
// Backward of apply_cmvn_per_utterance (statistics depend on x). Per dim d over the T frames:
//   means only:  dx = dy − mean_t(dy)
//   norm_vars:   dx = istd·(dy − mean_t(dy) − x̂·mean_t(dy·x̂)),  x̂ = (x − mean)·istd
// i.e. InstanceNorm over time without affine (layer_norm_backward over the time axis with eps = 0) while
// var ≥ 1e-20; where the floor is active istd is a constant and the last term is dropped.
void apply_cmvn_per_utterance_backward(View dx, ConstView dy, ConstView x, const CmvnOptions& opts = {});

// Options of Kaldi's apply-cmvn-sliding (defaults pinned by a test).
struct SlidingCmvnOptions {
  int cmn_window = 600;      // --cmn-window, ≥ 1
  int min_cmn_window = 100;  // --min-cmn-window, ≥ 0; only used when center is false
  bool center = false;       // --center
  bool norm_vars = false;    // --norm-vars
  int time_axis = 0;         // 0: [T, D]; 1: [D, T]
};

// Kaldi apply-cmvn-sliding. x, y: [T, D] per opts.time_axis, T ≥ 1.
void sliding_cmvn(View y, ConstView x, const SlidingCmvnOptions& opts = {});

// Padding-aware batches: x, y [B, T, D] (time_axis 0) or [B, D, T] (time_axis 1); lengths[b] in [0, T].
// Sequence b is normalized exactly as its first lengths[b] frames alone would be (bitwise equal to the
// 2-D function on the cut sequence); padded frames are set to 0.
void apply_cmvn_masked(View y, ConstView x, std::span<const Index> lengths, const CmvnOptions& opts = {});
void apply_cmvn_masked_backward(View dx, ConstView dy, ConstView x, std::span<const Index> lengths,
                                const CmvnOptions& opts = {});
void sliding_cmvn_masked(View y, ConstView x, std::span<const Index> lengths,
                         const SlidingCmvnOptions& opts = {});

// Causal sliding CMVN fed a frame or a chunk at a time. Needs center == false and min_cmn_window ≤ 1;
// then the concatenated outputs equal sliding_cmvn(x, opts) on the concatenated frames, bit for bit.
class StreamingCmvn {
 public:
  explicit StreamingCmvn(Index dim, const SlidingCmvnOptions& opts = {});
  ~StreamingCmvn();
  StreamingCmvn(StreamingCmvn&&) noexcept;
  StreamingCmvn& operator=(StreamingCmvn&&) noexcept;

  // frames: [n, D] per opts.time_axis (n ≥ 0); y: same shape, written with the normalized frames.
  void accept(View y, ConstView frames);
  Index frames_seen() const;
  void reset();  // start a new utterance

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Per-frame LayerNorm over the feature axis fed a frame or a chunk at a time: equal bit for bit to
// layer_norm_forward over that axis of the whole utterance (each frame is its own group).
class StreamingLayerNormF {
 public:
  // weight, bias: optional [F] (copied); time_axis 0: chunks are [n, F]; 1: [F, n].
  StreamingLayerNormF(Index features, ConstView weight = {}, ConstView bias = {}, double eps = 1e-5,
                      int time_axis = 0);
  void accept(View y, ConstView frames);
  Index frames_seen() const { return frames_seen_; }

 private:
  Index features_;
  Tensor weight_, bias_;
  bool has_weight_, has_bias_;
  double eps_;
  int time_axis_;
  Index frames_seen_ = 0;
};

}  // namespace normlab
