// bench/bench_norm.cpp — Google Benchmark harness: normlab's LayerNorm next to its peers (LibTorch ATen
// 1.13 and oneDNN 2.6) and next to a plain memory copy, all in one binary so that they share the build
// flags, the buffers, the thread pool (libgomp) and the machine state.
//
// What is measured (names are BM_<Op>/<impl>/<shape>; gbench appends "/real_time"):
//   BM_LayerNormFwd/{normlab,aten,onednn}/RxD   y, mean, rstd (or variance) from x, γ, β; rows × D,
//                                               normalized over the last axis
//   BM_LayerNormBwd/{normlab,aten,onednn}/RxD   dx, dγ, dβ from dy, x, γ (ATen and oneDNN take the
//                                               forward's mean/rstd, computed once outside the loop;
//                                               normlab recomputes them, which is its contract)
//   BM_LayerNormBwdSaved/normlab/RxD            the same backward taking the double statistics kept by
//                                               one forward outside the loop (NormStats,
//                                               layer_norm_backward_saved): what the peers get, bitwise
//                                               the recomputing backward's results
//   BM_LayerNormFwdBFT/{normlab,aten,onednn}/32x80x1000
//                                               forward over axis 1 (F) of a contiguous [B, F, T]:
//                                               normlab on the strided axis as is; ATen via the permute
//                                               route (permute().contiguous() -> native_layer_norm
//                                               over the last axis -> permute back .contiguous());
//                                               oneDNN on a strided memory descriptor, when it accepts one
//   BM_RmsNormFwd/{normlab,aten}/RxD            y (and rstd) from x, γ; ATen as users compose it:
//                                               x * at::rsqrt(x.pow(2).mean(-1, true) + eps) * w
//   BM_RmsNormBwd/{normlab,aten}/RxD            dx, dγ from dy, x, γ; ATen as the composed formula that
//                                               autograd evaluates, with rstd saved from one forward
//                                               outside the loop (normlab recomputes it)
//   BM_Copy/copy/<shape>, BM_CopyStream/copy/<shape>
//                                               the memory roofline: y = x with ordinary AVX-512 stores,
//                                               or with non-temporal (streaming) stores
// For every D ∈ {64, 80, 256, 768, 4096} there are two sizes: "in L3", x = 2 MiB (forward working set
// x + y = 4 MiB), and "out of cache", x = 128 MiB (256 MiB forward, 384 MiB backward).
//
// Bytes: every benchmark reports bytes_per_second = iterations × (bytes the ideal kernel must move) /
// wall time, so that it reads directly against copy bandwidth. The ideal kernel reads each input once
// and writes each output once; γ, β, mean, rstd, dγ, dβ are O(rows + D) and are not counted:
//   LayerNormFwd, LayerNormFwdBFT: read x, write y          = 2 · 4 · N bytes
//   LayerNormBwd, RmsNormBwd:      read x, dy, write dx     = 3 · 4 · N bytes
//   RmsNormFwd:                    read x, write y          = 2 · 4 · N bytes
//   Copy, CopyStream:              read x, write y          = 2 · 4 · N bytes
// Extra traffic an implementation does (a second pass that misses the cache, the permute copies of the
// ATen BFT route) is exactly what this comparison is meant to expose, so it is never counted.
//
// Method: every implementation reads the same 64-byte aligned buffers (one set per size, allocated and
// filled once from a fixed RNG) and writes into them (normlab, oneDNN) or into the tensors it returns
// (ATen). Primitives, views and wrapped tensors are made outside the timed loop, and each benchmark runs
// once untimed before its loop. Time is wall-clock time (UseRealTime); the default minimum time per
// benchmark is 0.2 s (override with --benchmark_min_time).
//
// Environment:
//   NORMLAB_BENCH_THREADS   threads for normlab, ATen, oneDNN (OpenMP) and the copies alike; default 1.
//   NORMLAB_BENCH_MALLOC    "reuse" (default): the outputs ATen allocates on every call reuse warm pages
//                           instead of page-faulting fresh ones: ATen's CPU allocator keeps freed blocks
//                           for the next allocation of the same size (ReuseCpuAllocator), and malloc never
//                           returns memory to the kernel (no mmap, no trim); "default": leave both as
//                           they are.
//   NORMLAB_ISA             the instruction set normlab's kernels use (see normlab/simd.h).
// Before running, the harness checks on small shapes (and on the BFT shape) that the three
// implementations agree, so that a misconfigured peer cannot produce a flattering number.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <c10/core/CPUAllocator.h>
#include <fmt/format.h>
#include <immintrin.h>
#include <malloc.h>
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/simd.h>
#include <normlab/tensor.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bench_copy.h"
#include "bench_onednn.h"
#include "bench_support.h"

namespace {

using normlab::Index;
using normlab::bench::AllocateFloats;
using normlab::bench::Buffer;
using normlab::bench::FillUniform;

constexpr double kEps = 1e-5;
constexpr double kRmsEps = 1e-6;
constexpr Index kInCacheElems = (Index{2} << 20) / 4;       // x = 2 MiB
constexpr Index kOutOfCacheElems = (Index{128} << 20) / 4;  // x = 128 MiB
constexpr Index kDims[] = {64, 80, 256, 768, 4096};
constexpr Index kMaxD = 4096;
constexpr const char* kDefaultMinTime = "--benchmark_min_time=0.2";

int g_threads = 1;

// ---- buffers (AllocateFloats, FillUniform: bench_support.h) ------------------------------------------

// The four full-size tensors of one size class; every shape of that class is a view of their first
// elements, so the out-of-cache class costs 4 × 128 MiB in all.
struct Pool {
  Index elems;
  Buffer x, y, dy, dx;
};

Pool& GetPool(Index elems) {
  static std::map<Index, std::unique_ptr<Pool>> pools;
  auto& slot = pools[elems];
  if (!slot) {
    slot = std::make_unique<Pool>();
    slot->elems = elems;
    slot->x = AllocateFloats(elems);
    slot->y = AllocateFloats(elems);
    slot->dy = AllocateFloats(elems);
    slot->dx = AllocateFloats(elems);
    FillUniform(slot->x.get(), elems, 1, -1.5f, 2.5f);
    FillUniform(slot->dy.get(), elems, 2, -1.0f, 1.0f);
    std::fill_n(slot->y.get(), elems, 0.0f);  // first touch outside any timed loop
    std::fill_n(slot->dx.get(), elems, 0.0f);
  }
  return *slot;
}

// γ and β for any D ≤ kMaxD (read-only).
const float* Gamma() {
  static const Buffer g = [] {
    Buffer b = AllocateFloats(kMaxD);
    FillUniform(b.get(), kMaxD, 3, 0.5f, 1.5f);
    return b;
  }();
  return g.get();
}
const float* Beta() {
  static const Buffer g = [] {
    Buffer b = AllocateFloats(kMaxD);
    FillUniform(b.get(), kMaxD, 4, -0.5f, 0.5f);
    return b;
  }();
  return g.get();
}

// ---- problems ---------------------------------------------------------------------------------------

enum class Op { kFwd, kBwd, kBwdSaved, kRmsFwd, kRmsBwd };
bool IsBackward(Op op) {
  return op == Op::kBwd || op == Op::kBwdSaved || op == Op::kRmsBwd;
}
enum class Kind { kNormlab, kAten, kOneDnn };

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kNormlab:
      return "normlab";
    case Kind::kAten:
      return "aten";
    case Kind::kOneDnn:
      return "onednn";
  }
  return "?";
}

// A contiguous x of `shape`, normalized over `axis`.
struct Problem {
  std::string name;  // "8192x64"
  std::vector<Index> shape;
  int axis = 0;
  Index numel = 0;   // elements of x
  Index n = 0;       // elements per group (the normalized size)
  Index groups = 0;  // numel / n
  Index pool = 0;    // elements of the buffer set it is a view of (≥ numel), shared by a size class

  bool last_axis() const { return axis == static_cast<int>(shape.size()) - 1; }
};

Problem MakeProblem(std::vector<Index> shape, int axis, Index pool = 0) {
  Problem p;
  p.shape = std::move(shape);
  p.axis = axis;
  p.numel = 1;
  for (std::size_t i = 0; i < p.shape.size(); ++i) {
    p.numel *= p.shape[i];
    if (i) p.name += 'x';
    p.name += std::to_string(p.shape[i]);
  }
  p.n = p.shape[static_cast<std::size_t>(axis)];
  p.groups = p.numel / p.n;
  p.pool = std::max(pool, p.numel);
  return p;
}

std::vector<Index> KeptShape(const Problem& p) {
  std::vector<Index> k;
  for (std::size_t i = 0; i < p.shape.size(); ++i)
    if (static_cast<int>(i) != p.axis) k.push_back(p.shape[i]);
  return k;
}

std::vector<Index> RowMajorStrides(const std::vector<Index>& shape) {
  std::vector<Index> s(shape.size());
  Index acc = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

// Bytes the ideal kernel moves (see the top of the file).
std::int64_t BytesMoved(Op op, const Problem& p) {
  return (IsBackward(op) ? 3 : 2) * static_cast<std::int64_t>(sizeof(float)) * p.numel;
}

// ---- implementations ---------------------------------------------------------------------------------

// What an implementation produced: y (forward) or dx (backward), and dγ, dβ (backward only).
struct Outputs {
  const float* main = nullptr;
  const float* dgamma = nullptr;
  const float* dbeta = nullptr;
};

class Impl {
 public:
  virtual ~Impl() = default;
  virtual void Run() = 0;
  virtual Outputs Result() = 0;
};

class NormlabFwd : public Impl {
 public:
  NormlabFwd(const Problem& p, Pool& pool)
      : mean_(static_cast<std::size_t>(p.groups)),
        rstd_(static_cast<std::size_t>(p.groups)),
        y_(pool.y.get(), normlab::Dims(p.shape)),
        mean_v_(mean_.data(), normlab::Dims(KeptShape(p))),
        rstd_v_(rstd_.data(), normlab::Dims(KeptShape(p))),
        x_(pool.x.get(), normlab::Dims(p.shape)),
        gamma_(Gamma(), normlab::Dims{p.n}),
        beta_(Beta(), normlab::Dims{p.n}),
        axes_{p.axis} {}
  void Run() override { normlab::layer_norm_forward(y_, mean_v_, rstd_v_, x_, gamma_, beta_, axes_, kEps); }
  Outputs Result() override { return {y_.data(), nullptr, nullptr}; }

 private:
  std::vector<float> mean_, rstd_;
  normlab::View y_, mean_v_, rstd_v_;
  normlab::ConstView x_, gamma_, beta_;
  normlab::Axes axes_;
};

class NormlabBwd : public Impl {
 public:
  // saved: the statistics come from one forward made here (NormStats), as the peers' mean/rstd do.
  NormlabBwd(const Problem& p, Pool& pool, bool saved)
      : saved_(saved),
        dgamma_(static_cast<std::size_t>(p.n)),
        dbeta_(static_cast<std::size_t>(p.n)),
        dx_(pool.dx.get(), normlab::Dims(p.shape)),
        dgamma_v_(dgamma_.data(), normlab::Dims{p.n}),
        dbeta_v_(dbeta_.data(), normlab::Dims{p.n}),
        dy_(pool.dy.get(), normlab::Dims(p.shape)),
        x_(pool.x.get(), normlab::Dims(p.shape)),
        gamma_(Gamma(), normlab::Dims{p.n}),
        axes_{p.axis} {
    if (saved_) {
      std::vector<float> y(static_cast<std::size_t>(p.numel));
      normlab::layer_norm_forward(normlab::View(y.data(), normlab::Dims(p.shape)), {}, {}, x_, gamma_, {},
                                  axes_, kEps, &stats_);
    }
  }
  void Run() override {
    if (saved_)
      normlab::layer_norm_backward_saved(dx_, dgamma_v_, dbeta_v_, dy_, x_, gamma_, stats_);
    else
      normlab::layer_norm_backward(dx_, dgamma_v_, dbeta_v_, dy_, x_, gamma_, axes_, kEps);
  }
  Outputs Result() override { return {dx_.data(), dgamma_.data(), dbeta_.data()}; }

 private:
  bool saved_;
  normlab::NormStats stats_;
  std::vector<float> dgamma_, dbeta_;
  normlab::View dx_, dgamma_v_, dbeta_v_;
  normlab::ConstView dy_, x_, gamma_;
  normlab::Axes axes_;
};

at::Tensor Wrap(const float* p, const std::vector<Index>& shape) {
  return at::from_blob(const_cast<float*>(p), at::IntArrayRef(shape), at::TensorOptions().dtype(at::kFloat));
}

// at::native_layer_norm on from_blob views of the shared buffers. Its outputs are allocated by ATen on
// every call (the API has no preallocated-output form that avoids a copy); they are dropped at once
// unless `keep` (for the self-check).
class AtenFwd : public Impl {
 public:
  AtenFwd(const Problem& p, Pool& pool, bool keep)
      : keep_(keep),
        x_(Wrap(pool.x.get(), p.shape)),
        gamma_(Wrap(Gamma(), {p.n})),
        beta_(Wrap(Beta(), {p.n})),
        normalized_shape_{p.n},
        permute_(!p.last_axis()) {
    if (permute_) {  // the normalized axis goes last, and comes back
      for (int i = 0; i < static_cast<int>(p.shape.size()); ++i)
        if (i != p.axis) to_last_.push_back(i);
      to_last_.push_back(p.axis);
      from_last_.resize(to_last_.size());
      for (std::size_t i = 0; i < to_last_.size(); ++i)
        from_last_[static_cast<std::size_t>(to_last_[i])] = static_cast<Index>(i);
    }
  }
  void Run() override {
    at::Tensor y;
    if (permute_) {
      const at::Tensor xp = x_.permute(to_last_).contiguous();
      y = std::get<0>(at::native_layer_norm(xp, normalized_shape_, gamma_, beta_, kEps))
              .permute(from_last_)
              .contiguous();
    } else {
      y = std::get<0>(at::native_layer_norm(x_, normalized_shape_, gamma_, beta_, kEps));
    }
    benchmark::DoNotOptimize(y.data_ptr());
    if (keep_) y_ = y;
  }
  Outputs Result() override { return {y_.data_ptr<float>(), nullptr, nullptr}; }

 private:
  bool keep_;
  at::Tensor x_, gamma_, beta_, y_;
  std::vector<Index> normalized_shape_, to_last_, from_last_;
  bool permute_;
};

class AtenBwd : public Impl {
 public:
  AtenBwd(const Problem& p, Pool& pool, bool keep)
      : keep_(keep),
        x_(Wrap(pool.x.get(), p.shape)),
        dy_(Wrap(pool.dy.get(), p.shape)),
        gamma_(Wrap(Gamma(), {p.n})),
        beta_(Wrap(Beta(), {p.n})),
        normalized_shape_{p.n} {
    if (!p.last_axis()) throw std::invalid_argument("AtenBwd: only the last axis");
    auto fwd = at::native_layer_norm(x_, normalized_shape_, gamma_, beta_, kEps);
    mean_ = std::get<1>(fwd);
    rstd_ = std::get<2>(fwd);
  }
  void Run() override {
    auto r = at::native_layer_norm_backward(dy_, x_, normalized_shape_, mean_, rstd_, gamma_, beta_,
                                            {true, true, true});
    benchmark::DoNotOptimize(std::get<0>(r).data_ptr());
    if (keep_) out_ = std::move(r);
  }
  Outputs Result() override {
    return {std::get<0>(out_).data_ptr<float>(), std::get<1>(out_).data_ptr<float>(),
            std::get<2>(out_).data_ptr<float>()};
  }

 private:
  bool keep_;
  at::Tensor x_, dy_, gamma_, beta_, mean_, rstd_;
  std::vector<Index> normalized_shape_;
  std::tuple<at::Tensor, at::Tensor, at::Tensor> out_;
};

// ---- RMSNorm: normlab and ATen as users compose it ---------------------------------------------------

class NormlabRmsFwd : public Impl {
 public:
  NormlabRmsFwd(const Problem& p, Pool& pool)
      : rstd_(static_cast<std::size_t>(p.groups)),
        y_(pool.y.get(), normlab::Dims(p.shape)),
        rstd_v_(rstd_.data(), normlab::Dims(KeptShape(p))),
        x_(pool.x.get(), normlab::Dims(p.shape)),
        gamma_(Gamma(), normlab::Dims{p.n}),
        axes_{p.axis} {}
  void Run() override { normlab::rms_norm_forward(y_, rstd_v_, x_, gamma_, axes_, kRmsEps); }
  Outputs Result() override { return {y_.data(), nullptr, nullptr}; }

 private:
  std::vector<float> rstd_;
  normlab::View y_, rstd_v_;
  normlab::ConstView x_, gamma_;
  normlab::Axes axes_;
};

class NormlabRmsBwd : public Impl {
 public:
  NormlabRmsBwd(const Problem& p, Pool& pool)
      : dgamma_(static_cast<std::size_t>(p.n)),
        dx_(pool.dx.get(), normlab::Dims(p.shape)),
        dgamma_v_(dgamma_.data(), normlab::Dims{p.n}),
        dy_(pool.dy.get(), normlab::Dims(p.shape)),
        x_(pool.x.get(), normlab::Dims(p.shape)),
        gamma_(Gamma(), normlab::Dims{p.n}),
        axes_{p.axis} {}
  void Run() override { normlab::rms_norm_backward(dx_, dgamma_v_, dy_, x_, gamma_, axes_, kRmsEps); }
  Outputs Result() override { return {dx_.data(), dgamma_.data(), nullptr}; }

 private:
  std::vector<float> dgamma_;
  normlab::View dx_, dgamma_v_;
  normlab::ConstView dy_, x_, gamma_;
  normlab::Axes axes_;
};

// y = x * rsqrt(mean(x², -1) + eps) * w, as written in user code (e.g. LLaMA's RMSNorm module).
class AtenRmsFwd : public Impl {
 public:
  AtenRmsFwd(const Problem& p, Pool& pool, bool keep)
      : keep_(keep), x_(Wrap(pool.x.get(), p.shape)), gamma_(Wrap(Gamma(), {p.n})) {
    if (!p.last_axis()) throw std::invalid_argument("AtenRmsFwd: only the last axis");
  }
  void Run() override {
    at::Tensor y = x_ * at::rsqrt(x_.pow(2).mean(-1, true) + kRmsEps) * gamma_;
    benchmark::DoNotOptimize(y.data_ptr());
    if (keep_) y_ = y;
  }
  Outputs Result() override { return {y_.data_ptr<float>(), nullptr, nullptr}; }

 private:
  bool keep_;
  at::Tensor x_, gamma_, y_;
};

// The backward autograd runs for the composed forward above, written out: with rstd saved from the
// forward (computed once here, outside the timed loop), x̂ = x·rstd, g = dy·w:
//   dx = rstd·(g − x̂·mean(g·x̂, -1)),  dw = Σ_rows dy·x̂.
class AtenRmsBwd : public Impl {
 public:
  AtenRmsBwd(const Problem& p, Pool& pool, bool keep)
      : keep_(keep),
        x_(Wrap(pool.x.get(), p.shape)),
        dy_(Wrap(pool.dy.get(), p.shape)),
        gamma_(Wrap(Gamma(), {p.n})) {
    if (!p.last_axis()) throw std::invalid_argument("AtenRmsBwd: only the last axis");
    rstd_ = at::rsqrt(x_.pow(2).mean(-1, true) + kRmsEps);
  }
  void Run() override {
    const at::Tensor xh = x_ * rstd_;
    const at::Tensor g = dy_ * gamma_;
    at::Tensor dx = rstd_ * (g - xh * (g * xh).mean(-1, true));
    at::Tensor dw = (dy_ * xh).sum(0);
    benchmark::DoNotOptimize(dx.data_ptr());
    benchmark::DoNotOptimize(dw.data_ptr());
    if (keep_) {
      dx_ = dx;
      dw_ = dw;
    }
  }
  Outputs Result() override { return {dx_.data_ptr<float>(), dw_.data_ptr<float>(), nullptr}; }

 private:
  bool keep_;
  at::Tensor x_, dy_, gamma_, rstd_, dx_, dw_;
};

namespace onednn = normlab::bench::onednn;
using dnnl::memory;

// oneDNN normalizes over the last logical dimension: the logical dims are x's with the normalized axis
// moved last, and the strides say where the elements really are (plain `ab` for a rows × D problem).
memory::desc DataDesc(const Problem& p) {
  const std::vector<Index> strides = RowMajorStrides(p.shape);
  memory::dims dims, st;
  for (std::size_t i = 0; i < p.shape.size(); ++i)
    if (static_cast<int>(i) != p.axis) {
      dims.push_back(p.shape[i]);
      st.push_back(strides[i]);
    }
  dims.push_back(p.n);
  st.push_back(strides[static_cast<std::size_t>(p.axis)]);
  if (p.shape.size() == 2 && p.last_axis())
    return memory::desc(dims, memory::data_type::f32, memory::format_tag::ab);
  return memory::desc(dims, memory::data_type::f32, st);
}
memory::desc StatDesc(const Problem& p) {
  const std::vector<Index> kept = KeptShape(p);
  return memory::desc(kept, memory::data_type::f32, RowMajorStrides(kept));
}
memory::desc ParamDesc(const Problem& p) {
  return memory::desc({p.n}, memory::data_type::f32, memory::format_tag::a);
}

onednn::LayerNormDescs OneDnnDescs(const Problem& p) {
  return {DataDesc(p), StatDesc(p), ParamDesc(p), kEps};
}

// Does oneDNN accept this problem at all (the BFT shape needs a strided descriptor)?
bool OneDnnSupports(const Problem& p, std::string* impl_name) {
  try {
    const auto pd = onednn::LayerNormForwardDesc(OneDnnDescs(p));
    if (impl_name) *impl_name = pd.impl_info_str();
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

// `forward_training`: writes y, mean and variance, like the other two write y, mean and rstd.
class OneDnnFwd : public Impl {
 public:
  OneDnnFwd(const Problem& p, Pool& pool)
      : mean_(static_cast<std::size_t>(p.groups)),
        var_(static_cast<std::size_t>(p.groups)),
        y_(pool.y.get()) {
    onednn::LayerNormBuffers b;
    b.x = pool.x.get();
    b.y = pool.y.get();
    b.mean = mean_.data();
    b.var = var_.data();
    b.gamma = Gamma();
    b.beta = Beta();
    call_ = onednn::LayerNormForward(OneDnnDescs(p), b);
  }
  void Run() override { call_.Run(); }
  Outputs Result() override { return {y_, nullptr, nullptr}; }

 private:
  std::vector<float> mean_, var_;
  float* y_;
  onednn::Call call_;
};

// prop_kind::backward with use_scale | use_shift: dx, dγ, dβ, from the mean and variance of one forward
// run made at set-up, outside the timed loop.
class OneDnnBwd : public Impl {
 public:
  OneDnnBwd(const Problem& p, Pool& pool)
      : mean_(static_cast<std::size_t>(p.groups)),
        var_(static_cast<std::size_t>(p.groups)),
        dgamma_(static_cast<std::size_t>(p.n)),
        dbeta_(static_cast<std::size_t>(p.n)),
        dx_(pool.dx.get()) {
    const onednn::LayerNormBuffers b{pool.x.get(),   pool.y.get(), pool.dy.get(), pool.dx.get(),
                                     mean_.data(),   var_.data(),  Gamma(),       Beta(),
                                     dgamma_.data(), dbeta_.data()};
    call_ = onednn::LayerNormBackward(OneDnnDescs(p), b);
  }
  void Run() override { call_.Run(); }
  Outputs Result() override { return {dx_, dgamma_.data(), dbeta_.data()}; }

 private:
  std::vector<float> mean_, var_, dgamma_, dbeta_;
  float* dx_;
  onednn::Call call_;
};

std::unique_ptr<Impl> MakeImpl(Op op, Kind kind, const Problem& p, Pool& pool, bool keep) {
  switch (kind) {
    case Kind::kNormlab:
      if (op == Op::kRmsFwd) return std::make_unique<NormlabRmsFwd>(p, pool);
      if (op == Op::kRmsBwd) return std::make_unique<NormlabRmsBwd>(p, pool);
      if (op == Op::kFwd) return std::make_unique<NormlabFwd>(p, pool);
      return std::make_unique<NormlabBwd>(p, pool, op == Op::kBwdSaved);
    case Kind::kAten:
      if (op == Op::kRmsFwd) return std::make_unique<AtenRmsFwd>(p, pool, keep);
      if (op == Op::kRmsBwd) return std::make_unique<AtenRmsBwd>(p, pool, keep);
      if (op == Op::kFwd) return std::make_unique<AtenFwd>(p, pool, keep);
      return std::make_unique<AtenBwd>(p, pool, keep);
    case Kind::kOneDnn:
      if (op == Op::kRmsFwd || op == Op::kRmsBwd) throw std::invalid_argument("oneDNN 2.6 has no RMSNorm");
      if (op == Op::kFwd) return std::make_unique<OneDnnFwd>(p, pool);
      return std::make_unique<OneDnnBwd>(p, pool);
  }
  return nullptr;
}

// ---- copy: the memory roofline -----------------------------------------------------------------------

// bench_copy.h holds the kernels (ordinary and streaming stores) and the per-thread split.

// ---- benchmarks ---------------------------------------------------------------------------------------

void BenchLayerNorm(benchmark::State& state, Op op, Kind kind, const Problem& p) {
  std::unique_ptr<Impl> impl;
  try {
    impl = MakeImpl(op, kind, p, GetPool(p.pool), /*keep=*/false);
    impl->Run();  // untimed warm-up: first calls, lazy initialization, page touch
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) {
    impl->Run();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * BytesMoved(op, p));
}

void BenchCopy(benchmark::State& state, bool stream, const Problem& p) {
  Pool& pool = GetPool(p.pool);
  normlab::bench::RunCopyBenchmark(state, stream, pool.y.get(), pool.x.get(), p.numel, g_threads);
}

template <typename F>
void Register(const std::string& name, F&& fn) {
  benchmark::RegisterBenchmark(name.c_str(), std::forward<F>(fn))
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
}

void RegisterCopies(const Problem& p) {
  Register("BM_Copy/copy/" + p.name, [p](benchmark::State& s) { BenchCopy(s, false, p); });
  Register("BM_CopyStream/copy/" + p.name, [p](benchmark::State& s) { BenchCopy(s, true, p); });
}

void RegisterLayerNorm(const std::string& op_name, Op op, const Problem& p, bool with_onednn) {
  for (Kind kind : {Kind::kNormlab, Kind::kAten, Kind::kOneDnn}) {
    if (kind == Kind::kOneDnn && !with_onednn) continue;
    Register("BM_" + op_name + "/" + KindName(kind) + "/" + p.name,
             [op, kind, p](benchmark::State& s) { BenchLayerNorm(s, op, kind, p); });
  }
}

Problem BftProblem() {
  return MakeProblem({32, 80, 1000}, 1);
}

// Registered per shape so that the implementations being compared run close together in time.
std::string RegisterAll() {
  for (Index elems : {kInCacheElems, kOutOfCacheElems}) {
    for (Index d : kDims) {
      const Problem p = MakeProblem({elems / d, d}, 1, elems);
      RegisterCopies(p);
      RegisterLayerNorm("LayerNormFwd", Op::kFwd, p, true);
      RegisterLayerNorm("LayerNormBwd", Op::kBwd, p, true);
      Register("BM_LayerNormBwdSaved/normlab/" + p.name,
               [p](benchmark::State& s) { BenchLayerNorm(s, Op::kBwdSaved, Kind::kNormlab, p); });
      RegisterLayerNorm("RmsNormFwd", Op::kRmsFwd, p, false);
      RegisterLayerNorm("RmsNormBwd", Op::kRmsBwd, p, false);
    }
  }
  const Problem bft = BftProblem();
  std::string onednn_bft;
  const bool onednn_ok = OneDnnSupports(bft, &onednn_bft);
  RegisterCopies(bft);
  RegisterLayerNorm("LayerNormFwdBFT", Op::kFwd, bft, onednn_ok);
  return onednn_ok ? onednn_bft : "not supported (no oneDNN primitive for the strided descriptor)";
}

// ---- self-check ---------------------------------------------------------------------------------------

// max |a − b| / max(1, max |b|)
double RelError(const float* a, const float* b, Index n) {
  double err = 0, scale = 1;
  for (Index i = 0; i < n; ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return err / scale;
}

struct Snapshot {
  std::vector<float> main, dgamma, dbeta;
};

Snapshot RunOnce(Op op, Kind kind, const Problem& p) {
  Pool& pool = GetPool(p.pool);
  std::unique_ptr<Impl> impl = MakeImpl(op, kind, p, pool, /*keep=*/true);
  impl->Run();
  const Outputs o = impl->Result();
  Snapshot s;
  s.main.assign(o.main, o.main + p.numel);
  if (o.dgamma) s.dgamma.assign(o.dgamma, o.dgamma + p.n);
  if (o.dbeta) s.dbeta.assign(o.dbeta, o.dbeta + p.n);
  return s;
}

// Runs every implementation once on small problems (and on the BFT problem) and compares each peer with
// normlab (whose double-precision result is the closest to exact). Returns the worst relative error;
// exits when a peer disagrees, since its timings would then mean nothing.
double SelfCheck(bool onednn_bft) {
  constexpr double kTolerance = 1e-4;
  double worst = 0;
  auto check = [&](Op op, const Problem& p, bool with_onednn) {
    const Snapshot ref = RunOnce(op, Kind::kNormlab, p);
    for (Kind kind : {Kind::kAten, Kind::kOneDnn}) {
      if (kind == Kind::kOneDnn && !with_onednn) continue;
      const Snapshot got = RunOnce(op, kind, p);
      double err = RelError(got.main.data(), ref.main.data(), p.numel);
      if (!got.dgamma.empty()) err = std::max(err, RelError(got.dgamma.data(), ref.dgamma.data(), p.n));
      if (!got.dbeta.empty()) err = std::max(err, RelError(got.dbeta.data(), ref.dbeta.data(), p.n));
      if (!(err <= kTolerance)) {
        static const char* const kOpNames[] = {"forward", "backward", "RMSNorm forward", "RMSNorm backward"};
        std::fprintf(stderr, "self-check FAILED: %s %s on %s differs from normlab by %.3g (> %.0e)\n",
                     kOpNames[static_cast<int>(op)], KindName(kind), p.name.c_str(), err,
                     kTolerance);
        std::exit(1);
      }
      worst = std::max(worst, err);
    }
  };
  for (Index d : kDims) {
    const Problem p = MakeProblem({67, d}, 1);
    check(Op::kFwd, p, true);
    check(Op::kBwd, p, true);
    check(Op::kRmsFwd, p, false);
    check(Op::kRmsBwd, p, false);
  }
  check(Op::kFwd, BftProblem(), onednn_bft);
  return worst;
}

// ---- setup ----------------------------------------------------------------------------------------------

int ThreadsFromEnv() {
  const char* env = std::getenv("NORMLAB_BENCH_THREADS");
  if (!env || !*env) return 1;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  if (*end != '\0' || n < 1 || n > 1024) {
    std::fprintf(stderr, "NORMLAB_BENCH_THREADS=%s: expected a whole number ≥ 1\n", env);
    std::exit(2);
  }
  return static_cast<int>(n);
}

// ATen's CPU allocator in "reuse" mode: a freed block is kept, by size, for the next allocation of that
// size, and never returned. glibc's malloc alone did not reuse them: ATen allocates with posix_memalign,
// whose request is a little larger than the block a freed output leaves, so with the heap's other small
// blocks in between each new output came from the top of the heap, which grew by the output's size on
// every call (seen with strace: brk by 26 MB per call of ATen's BatchNorm backward on [64, 256, 400]),
// and every call page-faulted a fresh output: 59 % of that benchmark's time in the kernel's page
// clearing, 73–90 ms a call against 7–8 ms when the layout happened to allow reuse
// (docs/PERFORMANCE.md, "twenty-fourth session"). Blocks are 64-byte aligned, like c10's own.
class ReuseCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) const override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &Release, cpu};
    Block* b = nullptr;
    {
      std::lock_guard<std::mutex> lock(Mutex());
      std::vector<Block*>& free = Free()[n];
      if (!free.empty()) {
        b = free.back();
        free.pop_back();
      }
    }
    if (b == nullptr) {
      void* p = std::aligned_alloc(64, (n + 63) / 64 * 64);
      if (p == nullptr) throw std::bad_alloc();
      b = new Block{p, n};
    }
    return {b->data, b, &Release, cpu};
  }

 private:
  struct Block {
    void* data;
    size_t size;
  };
  static void Release(void* ctx) {
    if (ctx == nullptr) return;
    Block* b = static_cast<Block*>(ctx);
    std::lock_guard<std::mutex> lock(Mutex());
    Free()[b->size].push_back(b);
  }
  static std::mutex& Mutex() {
    static std::mutex m;
    return m;
  }
  static std::unordered_map<size_t, std::vector<Block*>>& Free() {
    static auto* f = new std::unordered_map<size_t, std::vector<Block*>>();  // never destroyed
    return *f;
  }
};

// See NORMLAB_BENCH_MALLOC at the top of the file.
std::string ConfigureMalloc() {
  const char* env = std::getenv("NORMLAB_BENCH_MALLOC");
  const std::string mode = env && *env ? env : "reuse";
  if (mode == "default") return "glibc default";
  if (mode != "reuse") {
    std::fprintf(stderr, "NORMLAB_BENCH_MALLOC=%s: expected reuse or default\n", mode.c_str());
    std::exit(2);
  }
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
  static ReuseCpuAllocator aten_allocator;
  c10::SetCPUAllocator(&aten_allocator, /*priority=*/100);
  return "reuse (ATen's freed blocks kept by size; M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1)";
}

}  // namespace

int main(int argc, char** argv) {
  const std::string malloc_mode = ConfigureMalloc();
  g_threads = ThreadsFromEnv();
  normlab::set_num_threads(g_threads);
  at::set_num_threads(g_threads);
  omp_set_num_threads(g_threads);  // oneDNN (OpenMP runtime) and the copies

  // The default minimum time goes in front, so that a --benchmark_min_time given by the user wins.
  std::vector<char*> args(argv, argv + argc);
  std::string min_time = kDefaultMinTime;
  args.insert(args.begin() + 1, min_time.data());
  int nargs = static_cast<int>(args.size());
  benchmark::Initialize(&nargs, args.data());
  if (benchmark::ReportUnrecognizedArguments(nargs, args.data())) return 1;

  const std::string onednn_bft = RegisterAll();
  const double check_err = SelfCheck(onednn_bft.rfind("not supported", 0) != 0);
  const normlab::bench::LowPrecisionContext lowp = normlab::bench::RegisterLowPrecision();  // bench_norm_lowp.cpp

  benchmark::AddCustomContext("threads", std::to_string(g_threads));
  benchmark::AddCustomContext("isa", normlab::isa_name(normlab::active_isa()));
  benchmark::AddCustomContext("aten_threads", std::to_string(at::get_num_threads()));
  benchmark::AddCustomContext("omp_max_threads", std::to_string(omp_get_max_threads()));
  benchmark::AddCustomContext("copy_isa", __builtin_cpu_supports("avx512f") ? "avx512f" : "avx");
  benchmark::AddCustomContext("malloc", malloc_mode);
  benchmark::AddCustomContext("onednn_bft", onednn_bft);
  benchmark::AddCustomContext("selfcheck", fmt::format("ok (worst peer vs normlab: {:.2g})", check_err));
  benchmark::AddCustomContext("onednn_bf16", lowp.onednn_bf16);
  benchmark::AddCustomContext("selfcheck_lowp", lowp.selfcheck);
  // Where the buffers start in their 4 KiB pages: the row backward's speed depends on it
  // (docs/PERFORMANCE.md, "seventeenth session").
  for (const auto& [label, elems] :
       {std::pair{"page_offsets_l3", kInCacheElems}, {"page_offsets_ooc", kOutOfCacheElems}}) {
    const Pool& pool = GetPool(elems);
    auto off = [](const Buffer& b) { return normlab::bench::page_offset(b.get()); };
    benchmark::AddCustomContext(
        label, fmt::format("x {}, y {}, dy {}, dx {}", off(pool.x), off(pool.y), off(pool.dy), off(pool.dx)));
  }
  // Whether the pools are on transparent huge pages (tensor.h, "storage"; docs/PERFORMANCE.md, "eighteenth
  // session"): out of cache the fp32 kernels ran 1.1-2.2× and the copies 1.2-1.4× faster on them on the
  // development VM, so the fractions of copy of runs with and without them are not comparable.
  benchmark::AddCustomContext("huge_pages", normlab::bench::huge_page_report());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
