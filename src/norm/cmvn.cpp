// CMVN: Kaldi stats, apply-cmvn, apply-cmvn-sliding, streaming and padding-aware batches.
//
// Semantics are restated from Kaldi's src/transform/cmvn.cc (AccCmvnStats, ApplyCmvn) and
// src/feat/feature-functions.cc (SlidingWindowCmnInternal) and checked against torchaudio's
// sliding_window_cmn and a numpy transcription (tests/fixtures/make_cmvn_fixtures.py). The code is our own.
//
// Shapes: every 2-D function first turns x into a time-major view ([T, D], strides st, sd) — a view, no
// copy. All arithmetic is in double; each output is rounded to float once (docs/numerics.md, "CMVN").
#include <normlab/cmvn.h>
#include <normlab/npy.h>

#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "parallel/parallel.h"

namespace normlab {
namespace {

constexpr double kApplyVarFloor = 1e-20;    // apply-cmvn, WeNet GlobalCMVN, ESPnet GlobalMVN
constexpr double kSlidingVarFloor = 1e-10;  // apply-cmvn-sliding

// A 2-D feature view as time-major frames.
template <typename T>
struct Frames {
  T* data;
  Index frames, dims, st, sd;
  T& at(Index t, Index d) const { return data[t * st + d * sd]; }
};

int check_time_axis(int time_axis, int rank_of_utterance) {
  NL_CHECK(time_axis >= -rank_of_utterance && time_axis < rank_of_utterance,
           "time_axis {} is out of range for a {}-D feature matrix (valid: 0 for [T, D], 1 for [D, T])",
           time_axis, rank_of_utterance);
  return time_axis < 0 ? time_axis + rank_of_utterance : time_axis;
}

template <typename T>
Frames<T> as_frames(TensorView<T> v, int time_axis, const char* what) {
  NL_CHECK(v.rank() == 2, "{}: a feature matrix must be 2-D ([T, D] or [D, T]), got shape {}", what,
           v.shape().str());
  const int a = check_time_axis(time_axis, 2);
  return Frames<T>{v.data(), v.size(a), v.size(1 - a), v.stride(a), v.stride(1 - a)};
}

void check_same_shape(const Dims& y, const Dims& x, const char* what) {
  NL_CHECK(y == x, "{}: output shape {} differs from input shape {}", what, y.str(), x.str());
}

void check_not_empty(const Dims& shape, const char* what) {
  NL_CHECK(shape.product() > 0, "{}: empty features (shape {}); CMVN needs at least one frame and one dim",
           what, shape.str());
}

void check_sliding_options(const SlidingCmvnOptions& o) {
  NL_CHECK(o.cmn_window >= 1, "cmn_window must be ≥ 1, got {}", o.cmn_window);
  NL_CHECK(o.min_cmn_window >= 0, "min_cmn_window must be ≥ 0, got {}", o.min_cmn_window);
}

void check_cmvn_options(const CmvnOptions& o) {
  NL_CHECK(o.norm_means || !o.norm_vars,
           "norm_vars needs norm_means (Kaldi: cannot normalize the variance but not the mean)");
}

// Running sums of one window of frames, taken around an origin c (the first frame seen): s1 = Σ(x − c),
// s2 = Σ(x − c)². The window mean is c + s1/n. Because c is a frame of the same utterance, s1/n is of the
// order of the spread, so the one-pass variance s2/n − (s1/n)² loses little to a large common offset (it
// would cancel badly only if the first frame were an outlier by many standard deviations), and a constant
// band has s1 = s2 = 0 exactly, hence an output of exactly 0.
class WindowSums {
 public:
  explicit WindowSums(Index dims) : c_(dims), s1_(dims), s2_(dims), mean_(dims), istd_(dims) {}

  void set_origin(const Frames<const float>& x, Index t) {
    for (Index d = 0; d < dims(); ++d) c_[d] = x.at(t, d);
  }
  template <typename Row>
  void add(Row row) {
    for (Index d = 0; d < dims(); ++d) {
      const double v = static_cast<double>(row(d)) - c_[d];
      s1_[d] += v;
      s2_[d] += v * v;
    }
    ++n_;
  }
  template <typename Row>
  void remove(Row row) {
    for (Index d = 0; d < dims(); ++d) {
      const double v = static_cast<double>(row(d)) - c_[d];
      s1_[d] -= v;
      s2_[d] -= v * v;
    }
    --n_;
  }
  Index count() const { return n_; }

  // Window statistics: mean_ (shifted by c) and istd_ (1 when !norm_vars). Returns which dims' variance
  // was floored via `floored` when given.
  void finish(bool norm_vars, double floor, std::vector<char>* floored = nullptr) {
    const double n = static_cast<double>(n_);
    for (Index d = 0; d < dims(); ++d) {
      mean_[d] = s1_[d] / n;
      if (!norm_vars) {
        istd_[d] = 1.0;
        continue;
      }
      double var = s2_[d] / n - mean_[d] * mean_[d];
      const bool low = var < floor;
      if (low) var = floor;
      if (floored) (*floored)[static_cast<std::size_t>(d)] = low;
      istd_[d] = 1.0 / std::sqrt(var);
    }
  }
  // x̂ = ((x − c) − mean)·istd for one element (after finish()).
  double xhat(double x, Index d) const { return ((x - c_[d]) - mean_[d]) * istd_[d]; }
  double istd(Index d) const { return istd_[d]; }
  Index dims() const { return static_cast<Index>(c_.size()); }

 private:
  std::vector<double> c_, s1_, s2_, mean_, istd_;
  Index n_ = 0;
};

// Writes y[t, :] = x̂ of frame t of x under `sums`; with `zero` the frame is set to 0 instead.
void write_frame(const Frames<float>& y, const Frames<const float>& x, Index t, const WindowSums& sums,
                 bool zero) {
  for (Index d = 0; d < x.dims; ++d) y.at(t, d) = zero ? 0.0f : static_cast<float>(sums.xhat(x.at(t, d), d));
}

// Kaldi's window [start, end) for frame t of an utterance of T frames (see cmvn.h).
std::pair<Index, Index> sliding_window(Index t, Index T, const SlidingCmvnOptions& o) {
  Index start, end;
  if (o.center) {
    start = t - o.cmn_window / 2;
    end = start + o.cmn_window;
  } else {
    start = t - o.cmn_window;  // [t − cmn_window, t]: cmn_window + 1 frames, as Kaldi
    end = t + 1;
  }
  if (start < 0) {  // shift right
    end -= start;
    start = 0;
  }
  if (!o.center && end > t) end = std::max<Index>(t + 1, o.min_cmn_window);  // at most min_cmn_window ahead
  if (end > T) {                                                             // shift left
    start = std::max<Index>(start - (end - T), 0);
    end = T;
  }
  return {start, end};
}

// Per-utterance CMVN of time-major frames (T ≥ 1); y may be x.
void per_utterance_frames(const Frames<float>& y, const Frames<const float>& x, const CmvnOptions& o) {
  if (!o.norm_means) {
    for (Index t = 0; t < x.frames; ++t)
      for (Index d = 0; d < x.dims; ++d) y.at(t, d) = x.at(t, d);
    return;
  }
  WindowSums sums(x.dims);
  sums.set_origin(x, 0);
  for (Index t = 0; t < x.frames; ++t) sums.add([&](Index d) { return x.at(t, d); });
  sums.finish(o.norm_vars, kApplyVarFloor);
  for (Index t = 0; t < x.frames; ++t) write_frame(y, x, t, sums, false);
}

// Sliding CMVN of time-major frames (T ≥ 1). x must not share memory with y.
void sliding_frames(const Frames<float>& y, const Frames<const float>& x, const SlidingCmvnOptions& o) {
  WindowSums sums(x.dims);
  sums.set_origin(x, 0);
  Index start = 0, end = 0;  // the frames now in `sums`
  for (Index t = 0; t < x.frames; ++t) {
    const auto [ws, we] = sliding_window(t, x.frames, o);
    NL_DCHECK(ws >= start && we >= end && ws < we);
    // Kaldi's order: drop frames that left the window, then add those that entered.
    for (; start < ws; ++start) sums.remove([&](Index d) { return x.at(start, d); });
    for (; end < we; ++end) sums.add([&](Index d) { return x.at(end, d); });
    sums.finish(o.norm_vars, kSlidingVarFloor);
    write_frame(y, x, t, sums, o.norm_vars && sums.count() == 1);
  }
}

// Per-utterance backward of time-major frames (T ≥ 1); dx may alias dy or x.
void per_utterance_backward_frames(const Frames<float>& dx, const Frames<const float>& dy,
                                   const Frames<const float>& x, const CmvnOptions& o) {
  const Index T = x.frames, D = x.dims;
  if (!o.norm_means) {
    for (Index t = 0; t < T; ++t)
      for (Index d = 0; d < D; ++d) dx.at(t, d) = dy.at(t, d);
    return;
  }
  WindowSums sums(D);
  sums.set_origin(x, 0);
  for (Index t = 0; t < T; ++t) sums.add([&](Index d) { return x.at(t, d); });
  std::vector<char> floored(static_cast<std::size_t>(D), 0);
  sums.finish(o.norm_vars, kApplyVarFloor, &floored);
  std::vector<double> g_sum(static_cast<std::size_t>(D), 0.0), gx_sum(static_cast<std::size_t>(D), 0.0);
  for (Index t = 0; t < T; ++t)
    for (Index d = 0; d < D; ++d) {
      const double g = dy.at(t, d);
      g_sum[static_cast<std::size_t>(d)] += g;
      if (o.norm_vars) gx_sum[static_cast<std::size_t>(d)] += g * sums.xhat(x.at(t, d), d);
    }
  const double n = static_cast<double>(T);
  for (Index t = 0; t < T; ++t)
    for (Index d = 0; d < D; ++d) {
      const auto k = static_cast<std::size_t>(d);
      double v = static_cast<double>(dy.at(t, d)) - g_sum[k] / n;
      if (o.norm_vars) {
        // Scalar math: dx = istd·(g − mean(g) − x̂·mean(g·x̂)); the last term vanishes where var is floored.
        if (!floored[k]) v -= sums.xhat(x.at(t, d), d) * (gx_sum[k] / n);
        v *= sums.istd(d);
      }
      dx.at(t, d) = static_cast<float>(v);
    }
}

// Per-dim mean and istd from accumulated stats (Kaldi ApplyCmvn); checks width and count.
void stats_moments(const CmvnStats& s, Index dims, bool norm_vars, std::vector<double>& mean,
                   std::vector<double>& istd) {
  NL_CHECK(s.dim() == dims, "stats of the wrong width: the stats have {} dims, the features have {}", s.dim(),
           dims);
  NL_CHECK(s.count() >= 1.0, "insufficient CMVN statistics: count {} is < 1", s.count());
  mean.assign(static_cast<std::size_t>(dims), 0.0);
  istd.assign(static_cast<std::size_t>(dims), 1.0);
  for (Index d = 0; d < dims; ++d) {
    const auto k = static_cast<std::size_t>(d);
    mean[k] = s.sum()[k] / s.count();
    if (norm_vars) {
      const double var = std::max(s.sum_sq()[k] / s.count() - mean[k] * mean[k], kApplyVarFloor);
      istd[k] = 1.0 / std::sqrt(var);
    }
  }
}

// Checks a batch [B, <utterance>] and its lengths; returns the time-axis index within the 3-D view.
int check_batch(const Dims& y, const Dims& x, std::span<const Index> lengths, int time_axis,
                const char* what) {
  NL_CHECK(x.size() == 3, "{}: a batch must be 3-D ([B, T, D] or [B, D, T]), got shape {}", what, x.str());
  check_same_shape(y, x, what);
  const int a = 1 + check_time_axis(time_axis, 2);
  NL_CHECK(static_cast<Index>(lengths.size()) == x[0], "{}: {} lengths for a batch of {} sequences", what,
           lengths.size(), x[0]);
  NL_CHECK(x[3 - a] > 0, "{}: empty features: the feature axis of shape {} has size 0", what, x.str());
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    NL_CHECK(lengths[b] >= 0, "{}: length {} of sequence {} is negative", what, lengths[b], b);
    NL_CHECK(lengths[b] <= x[a], "{}: length {} of sequence {} is longer than the time axis ({} frames)",
             what, lengths[b], b, x[a]);
  }
  return a;
}

// Runs fn(y_cut, x_cut[, ...]) on each sequence cut to its length (time-major 2-D views) and zeroes the
// padding of `out`. Sequences are independent, so the thread count never changes the bits.
template <typename Fn>
void for_each_sequence(View out, ConstView x, std::span<const Index> lengths, int a, Fn&& fn) {
  parallel::parallel_for(x.size(0), [&](Index b) {
    const Index len = lengths[static_cast<std::size_t>(b)];
    View yb = out.select(0, b);
    ConstView xb = x.select(0, b);
    if (a == 2) {  // [D, T] -> [T, D] views
      yb = yb.transpose(0, 1);
      xb = xb.transpose(0, 1);
    }
    if (len > 0) fn(b, yb.slice(0, 0, len), xb.slice(0, 0, len));
    View pad = yb.slice(0, len, yb.size(0));
    for_each_offset(pad.shape(), pad.strides(), [&](Index off) { pad.data()[off] = 0.0f; });
  });
}

}  // namespace

// ---- CmvnStats ----------------------------------------------------------------------------------------

CmvnStats::CmvnStats(Index dim) {
  NL_CHECK(dim >= 0, "CmvnStats: negative dim {}", dim);
  sum_.assign(static_cast<std::size_t>(dim), 0.0);
  sum_sq_.assign(static_cast<std::size_t>(dim), 0.0);
}

void CmvnStats::add(ConstView feats, int time_axis) {
  const Frames<const float> x = as_frames(feats, time_axis, "CmvnStats::add");
  if (dim() == 0 && count_ == 0) *this = CmvnStats(x.dims);
  NL_CHECK(x.dims == dim(),
           "CmvnStats::add: stats of the wrong width: the stats have {} dims, the features "
           "have {}",
           dim(), x.dims);
  for (Index t = 0; t < x.frames; ++t)
    for (Index d = 0; d < x.dims; ++d) {
      const double v = x.at(t, d);
      sum_[static_cast<std::size_t>(d)] += v;
      sum_sq_[static_cast<std::size_t>(d)] += v * v;
    }
  count_ += static_cast<double>(x.frames);
}

void CmvnStats::add(const CmvnStats& other) {
  if (dim() == 0 && count_ == 0) *this = CmvnStats(other.dim());
  NL_CHECK(other.dim() == dim(), "CmvnStats::add: stats of the wrong width: {} dims vs {}", other.dim(),
           dim());
  for (std::size_t d = 0; d < sum_.size(); ++d) {
    sum_[d] += other.sum_[d];
    sum_sq_[d] += other.sum_sq_[d];
  }
  count_ += other.count_;
}

BasicTensor<double> CmvnStats::to_kaldi_matrix() const {
  const Index D = dim();
  BasicTensor<double> m(Dims{2, D + 1});
  for (Index d = 0; d < D; ++d) {
    m[d] = sum_[static_cast<std::size_t>(d)];
    m[D + 1 + d] = sum_sq_[static_cast<std::size_t>(d)];
  }
  m[D] = count_;
  m[2 * D + 1] = 0.0;
  return m;
}

CmvnStats CmvnStats::from_kaldi_matrix(TensorView<const double> m, const std::string& what) {
  NL_CHECK(m.rank() == 2 && m.size(0) == 2 && m.size(1) >= 2,
           "{}: Kaldi CMVN stats must have shape [2, D+1] with D ≥ 1, got {}", what, m.shape().str());
  const Index D = m.size(1) - 1;
  CmvnStats s(D);
  // Every entry but (1, D), which Kaldi leaves 0 and never reads, must be finite.
  for (Index r = 0; r < 2; ++r)
    for (Index d = 0; d < (r == 0 ? D + 1 : D); ++d)
      NL_CHECK(std::isfinite(m.at({r, d})), "{}: non-finite value {} at [{}, {}] of the CMVN stats", what,
               m.at({r, d}), r, d);
  s.count_ = m.at({0, D});
  NL_CHECK(s.count_ >= 0, "{}: negative count {} in the CMVN stats", what, s.count_);
  for (Index d = 0; d < D; ++d) {
    s.sum_[static_cast<std::size_t>(d)] = m.at({0, d});
    s.sum_sq_[static_cast<std::size_t>(d)] = m.at({1, d});
  }
  return s;
}

void CmvnStats::save_kaldi_npy(const std::string& path) const {
  NL_CHECK(dim() >= 1, "CmvnStats::save_kaldi_npy: no statistics (dim 0) to write to {}", path);
  const BasicTensor<double> m = to_kaldi_matrix();
  save_npy(path, m.view());
}

CmvnStats CmvnStats::load_kaldi_npy(const std::string& path) {
  const BasicTensor<double> m = load_npy_f64(path);
  return from_kaldi_matrix(m.view(), path);
}

std::string CmvnStats::to_wenet_json() const {
  nlohmann::json j;
  j["mean_stat"] = sum_;
  j["var_stat"] = sum_sq_;
  // WeNet writes an integer frame count; keep a weighted (fractional) count as a float.
  if (count_ == std::floor(count_) && std::fabs(count_) < 9.0e15)
    j["frame_num"] = static_cast<std::int64_t>(count_);
  else
    j["frame_num"] = count_;
  return j.dump();
}

CmvnStats CmvnStats::from_wenet_json(const std::string& text, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: malformed WeNet CMVN JSON: {}", what, e.what()));
  }
  NL_CHECK(j.is_object(),
           "{}: malformed WeNet CMVN JSON: expected an object with mean_stat, var_stat and "
           "frame_num",
           what);
  for (const char* key : {"mean_stat", "var_stat", "frame_num"})
    NL_CHECK(j.contains(key), "{}: malformed WeNet CMVN JSON: missing \"{}\"", what, key);
  const auto& ms = j["mean_stat"];
  const auto& vs = j["var_stat"];
  NL_CHECK(ms.is_array() && vs.is_array(),
           "{}: malformed WeNet CMVN JSON: mean_stat and var_stat must be "
           "arrays",
           what);
  NL_CHECK(ms.size() == vs.size() && !ms.empty(),
           "{}: malformed WeNet CMVN JSON: mean_stat has {} entries, "
           "var_stat {} (need the same number, ≥ 1)",
           what, ms.size(), vs.size());
  NL_CHECK(j["frame_num"].is_number(), "{}: malformed WeNet CMVN JSON: frame_num must be a number", what);
  CmvnStats s(static_cast<Index>(ms.size()));
  s.count_ = j["frame_num"].get<double>();
  NL_CHECK(std::isfinite(s.count_) && s.count_ >= 0,
           "{}: malformed WeNet CMVN JSON: frame_num {} must be "
           "finite and ≥ 0",
           what, s.count_);
  for (std::size_t d = 0; d < ms.size(); ++d) {
    NL_CHECK(ms[d].is_number() && vs[d].is_number(),
             "{}: malformed WeNet CMVN JSON: entry {} of mean_stat "
             "or var_stat is not a number",
             what, d);
    s.sum_[d] = ms[d].get<double>();
    s.sum_sq_[d] = vs[d].get<double>();
    NL_CHECK(std::isfinite(s.sum_[d]) && std::isfinite(s.sum_sq_[d]),
             "{}: malformed WeNet CMVN JSON: "
             "non-finite entry {}",
             what, d);
  }
  return s;
}

void CmvnStats::save_wenet_json(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    NL_CHECK(f.good(), "cannot open {} for writing", tmp);
    f << to_wenet_json() << '\n';
    f.close();
    if (!f.good()) {
      std::remove(tmp.c_str());
      throw Error(fmt::format("cannot write {}", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(fmt::format("cannot rename {} to {}", tmp, path));
  }
}

CmvnStats CmvnStats::load_wenet_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  NL_CHECK(f.good(), "cannot open {} for reading", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return from_wenet_json(ss.str(), path);
}

// ---- apply-cmvn -------------------------------------------------------------------------------------

void apply_cmvn(View y, ConstView x, const CmvnStats& stats, const CmvnOptions& opts) {
  check_cmvn_options(opts);
  check_same_shape(y.shape(), x.shape(), "apply_cmvn");
  const Frames<const float> xf = as_frames(x, opts.time_axis, "apply_cmvn");
  const Frames<float> yf = as_frames(y, opts.time_axis, "apply_cmvn");
  check_not_empty(x.shape(), "apply_cmvn");
  std::vector<double> mean, istd;
  stats_moments(stats, xf.dims, opts.norm_vars, mean, istd);
  for (Index t = 0; t < xf.frames; ++t)
    for (Index d = 0; d < xf.dims; ++d) {
      const auto k = static_cast<std::size_t>(d);
      const double v = xf.at(t, d);
      yf.at(t, d) = opts.norm_means ? static_cast<float>((v - mean[k]) * istd[k]) : static_cast<float>(v);
    }
}

void apply_cmvn_per_utterance(View y, ConstView x, const CmvnOptions& opts) {
  check_cmvn_options(opts);
  check_same_shape(y.shape(), x.shape(), "apply_cmvn_per_utterance");
  const Frames<const float> xf = as_frames(x, opts.time_axis, "apply_cmvn_per_utterance");
  check_not_empty(x.shape(), "apply_cmvn_per_utterance");
  per_utterance_frames(as_frames(y, opts.time_axis, "apply_cmvn_per_utterance"), xf, opts);
}

void apply_cmvn_backward(View dx, ConstView dy, const CmvnStats& stats, const CmvnOptions& opts) {
  check_cmvn_options(opts);
  check_same_shape(dx.shape(), dy.shape(), "apply_cmvn_backward");
  const Frames<const float> g = as_frames(dy, opts.time_axis, "apply_cmvn_backward");
  const Frames<float> out = as_frames(dx, opts.time_axis, "apply_cmvn_backward");
  check_not_empty(dy.shape(), "apply_cmvn_backward");
  std::vector<double> mean, istd;
  stats_moments(stats, g.dims, opts.norm_vars, mean, istd);
  for (Index t = 0; t < g.frames; ++t)
    for (Index d = 0; d < g.dims; ++d)
      out.at(t, d) = static_cast<float>(static_cast<double>(g.at(t, d)) * istd[static_cast<std::size_t>(d)]);
}

void apply_cmvn_per_utterance_backward(View dx, ConstView dy, ConstView x, const CmvnOptions& opts) {
  check_cmvn_options(opts);
  check_same_shape(dy.shape(), x.shape(), "apply_cmvn_per_utterance_backward");
  check_same_shape(dx.shape(), x.shape(), "apply_cmvn_per_utterance_backward");
  const char* what = "apply_cmvn_per_utterance_backward";
  const Frames<const float> xf = as_frames(x, opts.time_axis, what);
  check_not_empty(x.shape(), what);
  per_utterance_backward_frames(as_frames(dx, opts.time_axis, what), as_frames(dy, opts.time_axis, what), xf,
                                opts);
}

// ---- apply-cmvn-sliding -------------------------------------------------------------------------------

void sliding_cmvn(View y, ConstView x, const SlidingCmvnOptions& opts) {
  check_sliding_options(opts);
  check_same_shape(y.shape(), x.shape(), "sliding_cmvn");
  Frames<const float> xf = as_frames(x, opts.time_axis, "sliding_cmvn");
  const Frames<float> yf = as_frames(y, opts.time_axis, "sliding_cmvn");
  check_not_empty(x.shape(), "sliding_cmvn");
  // Frames leave the window after they were normalized: in place, keep a copy of the input.
  Tensor copy;
  if (y.data() == x.data()) {
    copy = Tensor::copy_of(x);
    xf = as_frames(copy.cview(), opts.time_axis, "sliding_cmvn");
  }
  sliding_frames(yf, xf, opts);
}

// ---- padding-aware batches ------------------------------------------------------------------------------

void apply_cmvn_masked(View y, ConstView x, std::span<const Index> lengths, const CmvnOptions& opts) {
  check_cmvn_options(opts);
  const int a = check_batch(y.shape(), x.shape(), lengths, opts.time_axis, "apply_cmvn_masked");
  for_each_sequence(y, x, lengths, a, [&](Index, View yb, ConstView xb) {
    per_utterance_frames(as_frames(yb, 0, ""), as_frames(xb, 0, ""), opts);
  });
}

void apply_cmvn_masked_backward(View dx, ConstView dy, ConstView x, std::span<const Index> lengths,
                                const CmvnOptions& opts) {
  check_cmvn_options(opts);
  check_same_shape(dy.shape(), x.shape(), "apply_cmvn_masked_backward");
  const int a = check_batch(dx.shape(), x.shape(), lengths, opts.time_axis, "apply_cmvn_masked_backward");
  for_each_sequence(dx, x, lengths, a, [&](Index b, View dxb, ConstView xb) {
    ConstView dyb = dy.select(0, b);
    if (a == 2) dyb = dyb.transpose(0, 1);
    dyb = dyb.slice(0, 0, xb.size(0));
    per_utterance_backward_frames(as_frames(dxb, 0, ""), as_frames(dyb, 0, ""), as_frames(xb, 0, ""), opts);
  });
}

void sliding_cmvn_masked(View y, ConstView x, std::span<const Index> lengths,
                         const SlidingCmvnOptions& opts) {
  check_sliding_options(opts);
  const int a = check_batch(y.shape(), x.shape(), lengths, opts.time_axis, "sliding_cmvn_masked");
  Tensor copy;
  if (y.data() == x.data()) {
    copy = Tensor::copy_of(x);
    x = copy.cview();
  }
  for_each_sequence(y, x, lengths, a, [&](Index, View yb, ConstView xb) {
    sliding_frames(as_frames(yb, 0, ""), as_frames(xb, 0, ""), opts);
  });
}

// ---- streaming --------------------------------------------------------------------------------------

struct StreamingCmvn::State {
  SlidingCmvnOptions opts;
  Index dims;
  WindowSums sums;
  std::deque<float> window;  // the frames in `sums`, oldest first, `dims` floats each
  Index seen = 0;
};

StreamingCmvn::StreamingCmvn(Index dim, const SlidingCmvnOptions& opts) {
  check_sliding_options(opts);
  check_time_axis(opts.time_axis, 2);
  NL_CHECK(dim >= 1, "StreamingCmvn: dim must be ≥ 1, got {}", dim);
  NL_CHECK(!opts.center, "StreamingCmvn is causal: center must be false (a centred window looks ahead)");
  NL_CHECK(opts.min_cmn_window <= 1,
           "StreamingCmvn is causal: min_cmn_window must be 0 or 1, got {} (Kaldi's "
           "min_cmn_window looks ahead up to min_cmn_window − 1 frames at the start)",
           opts.min_cmn_window);
  s_ = std::make_unique<State>(State{opts, dim, WindowSums(dim), {}, 0});
}
StreamingCmvn::~StreamingCmvn() = default;
StreamingCmvn::StreamingCmvn(StreamingCmvn&&) noexcept = default;
StreamingCmvn& StreamingCmvn::operator=(StreamingCmvn&&) noexcept = default;

Index StreamingCmvn::frames_seen() const {
  return s_->seen;
}

void StreamingCmvn::reset() {
  s_->sums = WindowSums(s_->dims);
  s_->window.clear();
  s_->seen = 0;
}

void StreamingCmvn::accept(View y, ConstView frames) {
  check_same_shape(y.shape(), frames.shape(), "StreamingCmvn::accept");
  const Frames<const float> x = as_frames(frames, s_->opts.time_axis, "StreamingCmvn::accept");
  const Frames<float> yf = as_frames(y, s_->opts.time_axis, "StreamingCmvn::accept");
  NL_CHECK(x.dims == s_->dims, "StreamingCmvn::accept: frames of the wrong width: {} dims, the stream has {}",
           x.dims, s_->dims);
  State& s = *s_;
  const Index D = s.dims;
  std::vector<float> row(static_cast<std::size_t>(D));
  for (Index i = 0; i < x.frames; ++i) {
    const Index t = s.seen;
    for (Index d = 0; d < D; ++d) row[static_cast<std::size_t>(d)] = x.at(i, d);  // y may alias x
    if (t == 0) s.sums.set_origin(Frames<const float>{row.data(), 1, D, 0, 1}, 0);
    // The same window and the same order of updates as sliding_frames: frame t uses [max(0, t − W), t].
    const Index ws = std::max<Index>(0, t - s.opts.cmn_window);
    for (Index start = t - static_cast<Index>(s.window.size() / static_cast<std::size_t>(D)); start < ws;
         ++start) {
      s.sums.remove([&](Index d) { return s.window[static_cast<std::size_t>(d)]; });
      s.window.erase(s.window.begin(), s.window.begin() + D);
    }
    s.sums.add([&](Index d) { return row[static_cast<std::size_t>(d)]; });
    s.window.insert(s.window.end(), row.begin(), row.end());
    s.sums.finish(s.opts.norm_vars, kSlidingVarFloor);
    const bool zero = s.opts.norm_vars && s.sums.count() == 1;
    for (Index d = 0; d < D; ++d)
      yf.at(i, d) = zero ? 0.0f : static_cast<float>(s.sums.xhat(row[static_cast<std::size_t>(d)], d));
    ++s.seen;
  }
}

// ---- StreamingLayerNormF --------------------------------------------------------------------------------

StreamingLayerNormF::StreamingLayerNormF(Index features, ConstView weight, ConstView bias, double eps,
                                         int time_axis)
    : features_(features),
      has_weight_(weight.defined()),
      has_bias_(bias.defined()),
      eps_(eps),
      time_axis_(check_time_axis(time_axis, 2)) {
  NL_CHECK(features >= 1, "StreamingLayerNormF: features must be ≥ 1, got {}", features);
  NL_CHECK(std::isfinite(eps) && eps >= 0, "StreamingLayerNormF: eps must be finite and ≥ 0, got {}", eps);
  for (const ConstView* p : {&weight, &bias})
    NL_CHECK(!p->defined() || (p->rank() == 1 && p->size(0) == features),
             "StreamingLayerNormF: weight/bias must have shape [{}], got {}", features, p->shape().str());
  if (has_weight_) weight_ = Tensor::copy_of(weight);
  if (has_bias_) bias_ = Tensor::copy_of(bias);
}

void StreamingLayerNormF::accept(View y, ConstView frames) {
  check_same_shape(y.shape(), frames.shape(), "StreamingLayerNormF::accept");
  NL_CHECK(frames.rank() == 2 && frames.size(1 - time_axis_) == features_,
           "StreamingLayerNormF::accept: frames must be 2-D with {} features on axis {}, got shape {}",
           features_, 1 - time_axis_, frames.shape().str());
  const Index n = frames.size(time_axis_);
  if (n > 0)
    layer_norm_forward(y, View{}, View{}, frames, has_weight_ ? weight_.cview() : ConstView{},
                       has_bias_ ? bias_.cview() : ConstView{}, Axes{1 - time_axis_}, eps_);
  frames_seen_ += n;
}

}  // namespace normlab
