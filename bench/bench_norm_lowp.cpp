// bench/bench_norm_lowp.cpp — bf16/fp16 storage and the fused variants, in the same normlab_bench binary as
// bench_norm.cpp (same build flags, thread pool, NORMLAB_BENCH_THREADS and malloc settings; main() there
// calls RegisterLowPrecision() after registering the fp32 benchmarks).
//
// What is measured (BM_<Op>/<impl>/<shape>, shapes RxD as in bench_norm.cpp: the same element counts, so
// "in L3" x is 1 MiB of bf16 and "out of cache" 64 MiB; compare against BM_LayerNormFwd/normlab/<shape>
// for the bf16-over-fp32 speedup):
//   BM_LayerNormFwdBF16/{normlab,aten,onednn}/RxD   y (bf16), mean, rstd (fp32) from bf16 x. normlab: fp32
//                                                   γ/β; ATen: at::native_layer_norm on bf16 tensors with
//                                                   bf16 γ/β (LibTorch 1.13 wants one dtype); oneDNN:
//                                                   layer_normalization forward_training, bf16 src/dst,
//                                                   f32 scale/shift and statistics
//   BM_LayerNormFwdFP16/normlab/RxD                 the same with fp16 storage (no peer: LibTorch 1.13 has
//                                                   no CPU fp16 layer_norm; oneDNN 2.6 has no f16 on CPU)
//   BM_LayerNormBwdBF16/{normlab,aten,onednn}/RxD   dx (bf16), dγ, dβ (fp32; ATen bf16) from bf16 dy, x
//   BM_LayerNormBwdBF16Saved/normlab/RxD            the same from the double statistics (NormStats) of one
//                                                   forward outside the loop, as the peers take theirs
//   BM_RmsNormFwdBF16/normlab/RxD                   y (bf16), rstd (fp32) from bf16 x, fp32 γ (against
//                                                   BM_RmsNormFwd/normlab: bf16 / fp32 speed, as LayerNorm)
//   BM_AddLayerNormFwd/{normlab,aten}/RxD           fp32 s = x + residual, y = LayerNorm(s): normlab's fused
//                                                   add_layer_norm_forward; ATen: at::add + native_layer_norm
//   BM_AddLayerNormFwdUnfused/normlab/RxD           normlab's own add loop, then layer_norm_forward
//   BM_AddLayerNormBwd/{normlab,aten}/RxD           fp32 dx = dnorm + ds, dγ, dβ from dy, ds, s: normlab's
//                                                   fused add_layer_norm_backward; ATen:
//                                                   native_layer_norm_backward (the forward's mean/rstd) +
//                                                   at::add, as autograd runs it
//   BM_AddLayerNormBwdSaved/normlab/RxD             add_layer_norm_backward_saved: the same from the double
//                                                   statistics (NormStats) the forward kept, as ATen reads
//                                                   the forward's mean/rstd
//   BM_AddLayerNormBwdUnfused/normlab/RxD           layer_norm_backward, then normlab's own loop dx += ds
//   BM_LayerNormBwdFromOutput/normlab/RxD           fp32 memory-efficient backward (reads y, dy, rstd)
//   BM_AddLayerNormFwdBF16/{normlab,aten}/RxD       the fused forward with bf16 x, residual, s, y (fp32 γ/β,
//                                                   mean, rstd); ATen: at::add + native_layer_norm on bf16
//                                                   tensors (bf16 γ/β), which rounds s to bf16 as normlab
//                                                   does
//   BM_AddLayerNormFwdFP16/normlab/RxD              the same with fp16 storage (no peer, as LayerNormFwdFP16)
//   BM_AddLayerNormBwdBF16/{normlab,aten}/RxD       the fused backward with bf16 dy, ds, s, dx (fp32 dγ, dβ;
//                                                   ATen bf16): native_layer_norm_backward + at::add, as
//                                                   AddLayerNormBwd's ATen
//   BM_AddLayerNormBwdFP16/normlab/RxD              the same with fp16 storage
// Bytes (bytes_per_second), as bench_norm.cpp: what the ideal kernel moves, in the storage type:
//   Fwd BF16/FP16 (LayerNorm, RmsNorm): 2·2·N; Bwd BF16: 3·2·N; AddLayerNormFwd(+Unfused): 4·4·N (read x,
//   residual; write s, y); AddLayerNormBwd(+Saved, +Unfused): 4·4·N (read dy, ds, s; write dx);
//   LayerNormBwdFromOutput: 3·4·N; AddLayerNormFwdBF16/FP16, AddLayerNormBwdBF16/FP16: 4·2·N.
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <normlab/norm.h>
#include <normlab/tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <dnnl.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "bench_onednn.h"
#include "bench_support.h"

namespace normlab::bench {
namespace {

constexpr double kEps = 1e-5;
constexpr Index kInCacheElems = (Index{2} << 20) / 4;
constexpr Index kOutOfCacheElems = (Index{128} << 20) / 4;
constexpr Index kDims[] = {64, 80, 256, 768, 4096};
constexpr Index kMaxD = 4096;

// One size class of buffers: bf16 x, y, dy, dx, residual, s; fp16 the same; fp32 x, residual, s, y
// (fused) and dx.
struct LowpPool {
  Index elems = 0;
  BufferOf<bfloat16> bx, by, bdy, bdx, br, bs;
  BufferOf<float16> hx, hy, hdy, hdx, hr, hs;
  Buffer fx, fr, fs, fy, fdy, fdx;
};

// The 16-bit buffers of one storage type, for the benchmarks written once for bf16 and fp16.
template <typename T>
struct Buffers16 {
  T *x, *y, *dy, *dx, *r, *s;
};
template <typename T>
Buffers16<T> Of(LowpPool& p) {
  if constexpr (std::is_same_v<T, bfloat16>)
    return {p.bx.get(), p.by.get(), p.bdy.get(), p.bdx.get(), p.br.get(), p.bs.get()};
  else
    return {p.hx.get(), p.hy.get(), p.hdy.get(), p.hdx.get(), p.hr.get(), p.hs.get()};
}

LowpPool& GetLowpPool(Index elems) {
  static std::map<Index, std::unique_ptr<LowpPool>> pools;
  auto& slot = pools[elems];
  if (!slot) {
    auto p = std::make_unique<LowpPool>();
    p->elems = elems;
    for (auto* b : {&p->bx, &p->by, &p->bdy, &p->bdx, &p->br, &p->bs}) *b = Allocate<bfloat16>(elems);
    for (auto* b : {&p->hx, &p->hy, &p->hdy, &p->hdx, &p->hr, &p->hs}) *b = Allocate<float16>(elems);
    for (Buffer* b : {&p->fx, &p->fr, &p->fs, &p->fy, &p->fdy, &p->fdx}) *b = AllocateFloats(elems);
    FillUniform(p->fx.get(), elems, 1, -1.5f, 2.5f);
    FillUniform(p->fr.get(), elems, 5, -2.0f, 2.0f);
    FillUniform(p->fdy.get(), elems, 2, -1.0f, 1.0f);
    for (Index i = 0; i < elems; ++i) {
      p->bx.get()[i] = bfloat16(p->fx.get()[i]);
      p->hx.get()[i] = float16(p->fx.get()[i]);
      p->br.get()[i] = bfloat16(p->fr.get()[i]);
      p->hr.get()[i] = float16(p->fr.get()[i]);
      p->bdy.get()[i] = bfloat16(p->fdy.get()[i]);
      p->hdy.get()[i] = float16(p->fdy.get()[i]);
      p->by.get()[i] = p->bdx.get()[i] = p->bs.get()[i] = bfloat16{};
      p->hy.get()[i] = p->hdx.get()[i] = p->hs.get()[i] = float16{};
    }
    std::fill_n(p->fs.get(), elems, 0.0f);  // first touch outside any timed loop
    std::fill_n(p->fy.get(), elems, 0.0f);
    std::fill_n(p->fdx.get(), elems, 0.0f);
    slot = std::move(p);
  }
  return *slot;
}

// γ, β (fp32, with bf16-representable values so that every implementation uses the same numbers).
const float* Param(int which) {
  static const std::vector<float> g = [] {
    std::vector<float> v(2 * kMaxD);
    FillUniform(v.data(), kMaxD, 3, 0.5f, 1.5f);
    FillUniform(v.data() + kMaxD, kMaxD, 4, -0.5f, 0.5f);
    for (float& f : v) f = static_cast<float>(bfloat16(f));
    return v;
  }();
  return g.data() + which * kMaxD;
}
const bfloat16* ParamBf16(int which) {
  static const std::vector<bfloat16> g = [] {
    std::vector<bfloat16> v(2 * kMaxD);
    for (Index i = 0; i < 2 * kMaxD; ++i) v[static_cast<std::size_t>(i)] = bfloat16(Param(0)[i]);
    return v;
  }();
  return g.data() + which * kMaxD;
}

struct Shape {
  Index rows, d, pool;
  std::string name() const { return fmt::format("{}x{}", rows, d); }
  Index numel() const { return rows * d; }
};

// ---- implementations: a Run() and, for the self-check, the main output widened to fp32 ------------------

struct Impl {
  std::function<void()> run;
  std::function<std::vector<float>()> result;  // y (forward) or dx (backward), as fp32
};

template <typename T>
std::vector<float> Widen(const T* p, Index n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (Index i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(p[i]);
  return v;
}

at::Tensor WrapBf16(const bfloat16* p, std::vector<Index> shape) {
  return at::from_blob(const_cast<bfloat16*>(p), at::IntArrayRef(shape), at::TensorOptions().dtype(at::kBFloat16));
}
at::Tensor WrapF32(const float* p, std::vector<Index> shape) {
  return at::from_blob(const_cast<float*>(p), at::IntArrayRef(shape), at::TensorOptions().dtype(at::kFloat));
}
std::vector<float> FromTensor(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kFloat).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

namespace onednn = normlab::bench::onednn;
using dnnl::memory;

// oneDNN's LayerNorm on bf16 rows (fp32 statistics and parameters).
onednn::LayerNormDescs OneDnnBf16Descs(const Shape& s) {
  return {memory::desc({s.rows, s.d}, memory::data_type::bf16, memory::format_tag::ab),
          memory::desc({s.rows}, memory::data_type::f32, memory::format_tag::a),
          memory::desc({s.d}, memory::data_type::f32, memory::format_tag::a), kEps};
}

// Holds what an implementation needs alive (tensors, primitives, argument maps, statistics).
struct Holder {
  std::vector<float> a, b, c, d;
  at::Tensor t0, t1, t2, t3, keep;
  onednn::Call call;
  NormStats stats;
};

Impl MakeFwdBf16(const std::string& impl, const Shape& s, LowpPool& p, std::shared_ptr<Holder> h) {
  const Index n = s.numel();
  if (impl == "normlab") {
    h->a.resize(static_cast<std::size_t>(s.rows));
    h->b.resize(static_cast<std::size_t>(s.rows));
    const BF16View y(p.by.get(), Dims{s.rows, s.d});
    const View mean(h->a.data(), Dims{s.rows}), rstd(h->b.data(), Dims{s.rows});
    const ConstBF16View x(p.bx.get(), Dims{s.rows, s.d});
    const ConstView w(Param(0), Dims{s.d}), b(Param(1), Dims{s.d});
    return {[=] { layer_norm_forward(y, mean, rstd, x, w, b, {1}, kEps); }, [=, &p] { return Widen(p.by.get(), n); }};
  }
  if (impl == "aten") {
    h->t0 = WrapBf16(p.bx.get(), {s.rows, s.d});
    h->t1 = WrapBf16(ParamBf16(0), {s.d});
    h->t2 = WrapBf16(ParamBf16(1), {s.d});
    const Index d = s.d;
    return {[h, d] {
              h->keep = std::get<0>(at::native_layer_norm(h->t0, {d}, h->t1, h->t2, kEps));
              benchmark::DoNotOptimize(h->keep.data_ptr());
            },
            [h] { return FromTensor(h->keep); }};
  }
  // onednn
  h->a.resize(static_cast<std::size_t>(s.rows));
  h->b.resize(static_cast<std::size_t>(s.rows));
  onednn::LayerNormBuffers b;
  b.x = p.bx.get();
  b.y = p.by.get();
  b.mean = h->a.data();
  b.var = h->b.data();
  b.gamma = Param(0);
  b.beta = Param(1);
  h->call = onednn::LayerNormForward(OneDnnBf16Descs(s), b);
  return {[h] { h->call.Run(); }, [=, &p] { return Widen(p.by.get(), n); }};
}

Impl MakeFwdF16(const Shape& s, LowpPool& p, std::shared_ptr<Holder> h) {
  h->a.resize(static_cast<std::size_t>(2 * s.rows));
  const F16View y(p.hy.get(), Dims{s.rows, s.d});
  const View mv(h->a.data(), Dims{s.rows}), rv(h->a.data() + s.rows, Dims{s.rows});
  const ConstF16View x(p.hx.get(), Dims{s.rows, s.d});
  const ConstView w(Param(0), Dims{s.d}), b(Param(1), Dims{s.d});
  const Index n = s.numel();
  return {[=] { layer_norm_forward(y, mv, rv, x, w, b, {1}, kEps); }, [=, &p] { return Widen(p.hy.get(), n); }};
}

Impl MakeRmsFwdBf16(const Shape& s, LowpPool& p, std::shared_ptr<Holder> h) {
  h->a.resize(static_cast<std::size_t>(s.rows));
  const BF16View y(p.by.get(), Dims{s.rows, s.d});
  const View rv(h->a.data(), Dims{s.rows});
  const ConstBF16View x(p.bx.get(), Dims{s.rows, s.d});
  const ConstView w(Param(0), Dims{s.d});
  const Index n = s.numel();
  return {[=] { rms_norm_forward(y, rv, x, w, {1}, kEps); }, [=, &p] { return Widen(p.by.get(), n); }};
}

// saved (normlab only): from the double statistics (NormStats) of one forward made here.
Impl MakeBwdBf16(const std::string& impl, const Shape& s, LowpPool& p, std::shared_ptr<Holder> h,
                 bool saved = false) {
  const Index n = s.numel();
  if (impl == "normlab") {
    h->a.resize(static_cast<std::size_t>(s.d));
    h->b.resize(static_cast<std::size_t>(s.d));
    const BF16View dx(p.bdx.get(), Dims{s.rows, s.d});
    const View dw(h->a.data(), Dims{s.d}), db(h->b.data(), Dims{s.d});
    const ConstBF16View dy(p.bdy.get(), Dims{s.rows, s.d}), x(p.bx.get(), Dims{s.rows, s.d});
    const ConstView w(Param(0), Dims{s.d});
    if (saved) {
      layer_norm_forward(BF16View(p.by.get(), Dims{s.rows, s.d}), {}, {}, x, w,
                         ConstView(Param(1), Dims{s.d}), {1}, kEps, &h->stats);
      return {[=] { layer_norm_backward_saved(dx, dw, db, dy, x, w, h->stats); },  // (the closure holds h)
              [=, &p] { return Widen(p.bdx.get(), n); }};
    }
    return {[=] { layer_norm_backward(dx, dw, db, dy, x, w, {1}, kEps); }, [=, &p] { return Widen(p.bdx.get(), n); }};
  }
  if (impl == "aten") {
    h->t0 = WrapBf16(p.bx.get(), {s.rows, s.d});
    h->t1 = WrapBf16(ParamBf16(0), {s.d});
    h->t2 = WrapBf16(ParamBf16(1), {s.d});
    h->t3 = WrapBf16(p.bdy.get(), {s.rows, s.d});
    auto fwd = at::native_layer_norm(h->t0, {s.d}, h->t1, h->t2, kEps);
    auto mean = std::make_shared<at::Tensor>(std::get<1>(fwd));
    auto rstd = std::make_shared<at::Tensor>(std::get<2>(fwd));
    const Index d = s.d;
    return {[h, mean, rstd, d] {
              auto r = at::native_layer_norm_backward(h->t3, h->t0, {d}, *mean, *rstd, h->t1, h->t2, {true, true, true});
              benchmark::DoNotOptimize(std::get<0>(r).data_ptr());
              h->keep = std::get<0>(r);
            },
            [h] { return FromTensor(h->keep); }};
  }
  // onednn: statistics from one forward run outside the loop
  for (auto* v : {&h->a, &h->b}) v->resize(static_cast<std::size_t>(s.rows));
  for (auto* v : {&h->c, &h->d}) v->resize(static_cast<std::size_t>(s.d));
  h->call = onednn::LayerNormBackward(
      OneDnnBf16Descs(s), {p.bx.get(), p.by.get(), p.bdy.get(), p.bdx.get(), h->a.data(), h->b.data(),
                           Param(0), Param(1), h->c.data(), h->d.data()});
  return {[h] { h->call.Run(); }, [=, &p] { return Widen(p.bdx.get(), n); }};
}

Impl MakeAddFwd(const std::string& impl, bool fused, const Shape& s, LowpPool& p, std::shared_ptr<Holder> h) {
  const Index n = s.numel();
  if (impl == "normlab") {
    h->a.resize(static_cast<std::size_t>(2 * s.rows));
    const View sv(p.fs.get(), Dims{s.rows, s.d}), y(p.fy.get(), Dims{s.rows, s.d});
    const View mean(h->a.data(), Dims{s.rows}), rstd(h->a.data() + s.rows, Dims{s.rows});
    const ConstView x(p.fx.get(), Dims{s.rows, s.d}), r(p.fr.get(), Dims{s.rows, s.d});
    const ConstView w(Param(0), Dims{s.d}), b(Param(1), Dims{s.d});
    float* sp = p.fs.get();
    const float* xp = p.fx.get();
    const float* rp = p.fr.get();
    if (fused)
      return {[=] { add_layer_norm_forward(sv, y, mean, rstd, x, r, w, b, {1}, kEps); },
              [=, &p] { return std::vector<float>(p.fy.get(), p.fy.get() + n); }};
    return {[=] {
              for (Index i = 0; i < n; ++i) sp[i] = xp[i] + rp[i];
              layer_norm_forward(y, mean, rstd, ConstView(sv), w, b, {1}, kEps);
            },
            [=, &p] { return std::vector<float>(p.fy.get(), p.fy.get() + n); }};
  }
  // aten: the composition users write, s = x + residual; y = layer_norm(s)
  h->t0 = WrapF32(p.fx.get(), {s.rows, s.d});
  h->t1 = WrapF32(p.fr.get(), {s.rows, s.d});
  h->t2 = WrapF32(Param(0), {s.d});
  h->t3 = WrapF32(Param(1), {s.d});
  const Index d = s.d;
  return {[h, d] {
            at::Tensor sum = at::add(h->t0, h->t1);
            h->keep = std::get<0>(at::native_layer_norm(sum, {d}, h->t2, h->t3, kEps));
            benchmark::DoNotOptimize(h->keep.data_ptr());
          },
          [h] { return FromTensor(h->keep); }};
}

// The backward of the fused add + LayerNorm: dx = dnorm + ds, dγ, dβ from dy, ds, s (s and the forward's
// statistics made once, outside the loop; the residual buffer serves as ds). saved (normlab, fused): from
// the NormStats that forward kept.
Impl MakeAddBwd(const std::string& impl, bool fused, const Shape& s, LowpPool& p, std::shared_ptr<Holder> h,
                bool saved = false) {
  const Index n = s.numel();
  const View sv(p.fs.get(), Dims{s.rows, s.d}), y(p.fy.get(), Dims{s.rows, s.d});
  const ConstView x(p.fx.get(), Dims{s.rows, s.d}), ds(p.fr.get(), Dims{s.rows, s.d});
  const ConstView w(Param(0), Dims{s.d}), b(Param(1), Dims{s.d});
  add_layer_norm_forward(sv, y, {}, {}, x, ConstView(p.fx.get(), Dims{s.rows, s.d}), w, b, {1}, kEps,
                         &h->stats);
  const View dx(p.fdx.get(), Dims{s.rows, s.d});
  const ConstView dy(p.fdy.get(), Dims{s.rows, s.d});
  auto result = [n, &p] { return std::vector<float>(p.fdx.get(), p.fdx.get() + n); };
  if (impl == "normlab") {
    h->b.resize(static_cast<std::size_t>(2 * s.d));
    const View dw(h->b.data(), Dims{s.d}), db(h->b.data() + s.d, Dims{s.d});
    if (fused && saved)  // (the closure holds h)
      return {[=] { add_layer_norm_backward_saved(dx, dw, db, dy, ds, ConstView(sv), w, h->stats); }, result};
    if (fused) return {[=] { add_layer_norm_backward(dx, dw, db, dy, ds, ConstView(sv), w, {1}, kEps); }, result};
    float* dxp = p.fdx.get();
    const float* dsp = p.fr.get();
    return {[=] {
              layer_norm_backward(dx, dw, db, dy, ConstView(sv), w, {1}, kEps);
              for (Index i = 0; i < n; ++i) dxp[i] += dsp[i];
            },
            result};
  }
  // aten: native_layer_norm_backward with the forward's mean/rstd, then dx + ds (what autograd runs)
  h->t0 = WrapF32(p.fs.get(), {s.rows, s.d});
  h->t1 = WrapF32(p.fdy.get(), {s.rows, s.d});
  h->t2 = WrapF32(Param(0), {s.d});
  h->t3 = WrapF32(Param(1), {s.d});
  const Index d = s.d;
  auto fwd = at::native_layer_norm(h->t0, {d}, h->t2, h->t3, kEps);
  auto mean = std::get<1>(fwd), rstd = std::get<2>(fwd);
  const at::Tensor dst = WrapF32(p.fr.get(), {s.rows, s.d});
  return {[h, d, mean, rstd, dst] {
            auto r = at::native_layer_norm_backward(h->t1, h->t0, {d}, mean, rstd, h->t2, h->t3, {true, true, true});
            h->keep = at::add(std::get<0>(r), dst);
            benchmark::DoNotOptimize(h->keep.data_ptr());
          },
          [h] { return FromTensor(h->keep); }};
}

// The fused add + LayerNorm with 16-bit storage (T = bfloat16 or float16; ATen for bf16 only).
template <typename T>
Impl MakeAddFwd16(const std::string& impl, const Shape& s, LowpPool& p, std::shared_ptr<Holder> h) {
  const Index n = s.numel();
  const Buffers16<T> b = Of<T>(p);
  auto result = [n, b] { return Widen(b.y, n); };
  if (impl == "normlab") {
    h->a.resize(static_cast<std::size_t>(2 * s.rows));
    const TensorView<T> sv(b.s, Dims{s.rows, s.d}), y(b.y, Dims{s.rows, s.d});
    const View mean(h->a.data(), Dims{s.rows}), rstd(h->a.data() + s.rows, Dims{s.rows});
    const TensorView<const T> x(b.x, Dims{s.rows, s.d}), r(b.r, Dims{s.rows, s.d});
    const ConstView w(Param(0), Dims{s.d}), bias(Param(1), Dims{s.d});
    return {[=] { add_layer_norm_forward(sv, y, mean, rstd, x, r, w, bias, {1}, kEps); }, result};
  }
  // aten (bf16): s = x + residual, rounded to bf16; y = layer_norm(s)
  h->t0 = WrapBf16(p.bx.get(), {s.rows, s.d});
  h->t1 = WrapBf16(p.br.get(), {s.rows, s.d});
  h->t2 = WrapBf16(ParamBf16(0), {s.d});
  h->t3 = WrapBf16(ParamBf16(1), {s.d});
  const Index d = s.d;
  return {[h, d] {
            at::Tensor sum = at::add(h->t0, h->t1);
            h->keep = std::get<0>(at::native_layer_norm(sum, {d}, h->t2, h->t3, kEps));
            benchmark::DoNotOptimize(h->keep.data_ptr());
          },
          [h] { return FromTensor(h->keep); }};
}

// Its backward: dx = dnorm + ds, dγ, dβ from dy, ds, s (s made once by the fused forward, outside the loop).
template <typename T>
Impl MakeAddBwd16(const std::string& impl, const Shape& s, LowpPool& p, std::shared_ptr<Holder> h) {
  const Index n = s.numel();
  const Buffers16<T> b = Of<T>(p);
  const TensorView<T> sv(b.s, Dims{s.rows, s.d}), y(b.y, Dims{s.rows, s.d});
  const TensorView<const T> x(b.x, Dims{s.rows, s.d}), r(b.r, Dims{s.rows, s.d});
  const ConstView w(Param(0), Dims{s.d}), bias(Param(1), Dims{s.d});
  add_layer_norm_forward(sv, y, {}, {}, x, r, w, bias, {1}, kEps);
  if (impl == "normlab") {
    h->b.resize(static_cast<std::size_t>(2 * s.d));
    const TensorView<T> dx(b.dx, Dims{s.rows, s.d});
    const View dw(h->b.data(), Dims{s.d}), db(h->b.data() + s.d, Dims{s.d});
    const TensorView<const T> dy(b.dy, Dims{s.rows, s.d}), ds(b.r, Dims{s.rows, s.d});
    return {[=] { add_layer_norm_backward(dx, dw, db, dy, ds, TensorView<const T>(sv), w, {1}, kEps); },
            [n, b] { return Widen(b.dx, n); }};
  }
  // aten (bf16): native_layer_norm_backward with the forward's mean/rstd, then dx + ds
  h->t0 = WrapBf16(p.bs.get(), {s.rows, s.d});
  h->t1 = WrapBf16(p.bdy.get(), {s.rows, s.d});
  h->t2 = WrapBf16(ParamBf16(0), {s.d});
  h->t3 = WrapBf16(ParamBf16(1), {s.d});
  const Index d = s.d;
  auto fwd = at::native_layer_norm(h->t0, {d}, h->t2, h->t3, kEps);
  auto mean = std::get<1>(fwd), rstd = std::get<2>(fwd);
  const at::Tensor dst = WrapBf16(p.br.get(), {s.rows, s.d});
  return {[h, d, mean, rstd, dst] {
            auto g = at::native_layer_norm_backward(h->t1, h->t0, {d}, mean, rstd, h->t2, h->t3,
                                                    {true, true, true});
            h->keep = at::add(std::get<0>(g), dst);
            benchmark::DoNotOptimize(h->keep.data_ptr());
          },
          [h] { return FromTensor(h->keep); }};
}

Impl MakeBwdFromOutput(const Shape& s, LowpPool& p, std::shared_ptr<Holder> h) {
  h->a.resize(static_cast<std::size_t>(2 * s.rows));
  h->b.resize(static_cast<std::size_t>(2 * s.d));
  const View y(p.fy.get(), Dims{s.rows, s.d});
  const View rstd(h->a.data(), Dims{s.rows});
  const ConstView x(p.fx.get(), Dims{s.rows, s.d}), w(Param(0), Dims{s.d}), b(Param(1), Dims{s.d});
  layer_norm_forward(y, {}, rstd, x, w, b, {1}, kEps);  // y and rstd, once, outside the loop
  const View dx(p.fdx.get(), Dims{s.rows, s.d}), dw(h->b.data(), Dims{s.d}), db(h->b.data() + s.d, Dims{s.d});
  const ConstView dy(p.fdy.get(), Dims{s.rows, s.d});
  const Index n = s.numel();
  return {[=] { layer_norm_backward_from_output(dx, dw, db, dy, ConstView(y), ConstView(rstd), w, b, {1}); },
          [=, &p] { return std::vector<float>(p.fdx.get(), p.fdx.get() + n); }};
}

using Maker = std::function<Impl(const Shape&, LowpPool&, std::shared_ptr<Holder>)>;

void Bench(benchmark::State& state, const Maker& make, const Shape& s, std::int64_t bytes) {
  auto holder = std::make_shared<Holder>();
  Impl impl;
  try {
    impl = make(s, GetLowpPool(s.pool), holder);
    impl.run();  // untimed warm-up
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) {
    impl.run();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

struct Op {
  std::string name;
  std::vector<std::string> impls;
  std::function<Maker(const std::string&)> maker;
  std::int64_t bytes_per_elem;
};

std::vector<Op> Ops(bool onednn_bf16) {
  std::vector<std::string> bf16_impls = {"normlab", "aten"};
  if (onednn_bf16) bf16_impls.push_back("onednn");
  return {
      {"LayerNormFwdBF16", bf16_impls,
       [](const std::string& i) -> Maker {
         return [i](auto& s, auto& p, auto h) { return MakeFwdBf16(i, s, p, h); };
       },
       4},
      {"LayerNormFwdFP16",
       {"normlab"},
       [](const std::string&) -> Maker {
         return [](auto& s, auto& p, auto h) { return MakeFwdF16(s, p, h); };
       },
       4},
      {"RmsNormFwdBF16",
       {"normlab"},
       [](const std::string&) -> Maker {
         return [](auto& s, auto& p, auto h) { return MakeRmsFwdBf16(s, p, h); };
       },
       4},
      {"LayerNormBwdBF16", bf16_impls,
       [](const std::string& i) -> Maker {
         return [i](auto& s, auto& p, auto h) { return MakeBwdBf16(i, s, p, h); };
       },
       6},
      {"LayerNormBwdBF16Saved",
       {"normlab"},
       [](const std::string&) -> Maker {
         return [](auto& s, auto& p, auto h) { return MakeBwdBf16("normlab", s, p, h, true); };
       },
       6},
      {"AddLayerNormFwd",
       {"normlab", "aten"},
       [](const std::string& i) -> Maker {
         return [i](auto& s, auto& p, auto h) { return MakeAddFwd(i, true, s, p, h); };
       },
       16},
      {"AddLayerNormFwdUnfused",
       {"normlab"},
       [](const std::string& i) -> Maker {
         return [i](auto& s, auto& p, auto h) { return MakeAddFwd(i, false, s, p, h); };
       },
       16},
      {"AddLayerNormBwd",
       {"normlab", "aten"},
       [](const std::string& i) -> Maker {
         return [i](auto& s, auto& p, auto h) { return MakeAddBwd(i, true, s, p, h); };
       },
       16},
      {"AddLayerNormBwdSaved",
       {"normlab"},
       [](const std::string& i) -> Maker {
         return [i](auto& s, auto& p, auto h) { return MakeAddBwd(i, true, s, p, h, true); };
       },
       16},
      {"AddLayerNormBwdUnfused",
       {"normlab"},
       [](const std::string& i) -> Maker {
         return [i](auto& s, auto& p, auto h) { return MakeAddBwd(i, false, s, p, h); };
       },
       16},
      {"LayerNormBwdFromOutput",
       {"normlab"},
       [](const std::string&) -> Maker {
         return [](auto& s, auto& p, auto h) { return MakeBwdFromOutput(s, p, h); };
       },
       12},
      {"AddLayerNormFwdBF16",
       {"normlab", "aten"},
       [](const std::string& i) -> Maker {
         return [i](auto& s, auto& p, auto h) { return MakeAddFwd16<bfloat16>(i, s, p, h); };
       },
       8},
      {"AddLayerNormFwdFP16",
       {"normlab"},
       [](const std::string& i) -> Maker {
         return [i](auto& s, auto& p, auto h) { return MakeAddFwd16<float16>(i, s, p, h); };
       },
       8},
      {"AddLayerNormBwdBF16",
       {"normlab", "aten"},
       [](const std::string& i) -> Maker {
         return [i](auto& s, auto& p, auto h) { return MakeAddBwd16<bfloat16>(i, s, p, h); };
       },
       8},
      {"AddLayerNormBwdFP16",
       {"normlab"},
       [](const std::string& i) -> Maker {
         return [i](auto& s, auto& p, auto h) { return MakeAddBwd16<float16>(i, s, p, h); };
       },
       8},
  };
}

// Each peer against normlab on 67×D: within 2 bf16 ulps of the larger magnitude plus 4·2^-8 of the largest
// value. LibTorch 1.13's bf16 kernel rounds intermediates to bf16 (tests/torch/lowp_norm_torch_test.cpp
// measures ~0.1·2^-8 of its intermediates' magnitude); a misconfigured peer (γ, β, eps, layout) is off by
// far more.
std::string SelfCheck(bool onednn_bf16) {
  double worst = 0;
  for (const Op& op : Ops(onednn_bf16)) {
    if (op.impls.size() < 2) continue;
    for (Index d : kDims) {
      const Shape s{67, d, 67 * d};
      auto run = [&](const std::string& impl) {
        auto h = std::make_shared<Holder>();
        Impl i = op.maker(impl)(s, GetLowpPool(s.pool), h);
        i.run();
        return i.result();
      };
      const std::vector<float> base = run("normlab");
      double scale = 1;
      for (float v : base) scale = std::max(scale, static_cast<double>(std::fabs(v)));
      for (std::size_t k = 1; k < op.impls.size(); ++k) {
        const std::vector<float> got = run(op.impls[k]);
        double err = 0;
        for (std::size_t i = 0; i < base.size(); ++i) {
          const double m = std::max(std::fabs(base[i]), std::fabs(got[i]));
          const double bound = 2 * std::ldexp(1.0, std::ilogb(std::max(m, 1e-30)) - 7) + 4 * 0x1p-8 * scale;
          err = std::max(err, std::fabs(static_cast<double>(base[i]) - got[i]) / bound);
        }
        if (!(err <= 1)) {
          std::fprintf(stderr, "self-check FAILED: %s %s on 67x%lld differs from normlab (%.3g × the bound)\n",
                       op.name.c_str(), op.impls[k].c_str(), static_cast<long long>(d), err);
          std::exit(1);
        }
        worst = std::max(worst, err);
      }
    }
  }
  return fmt::format("ok (worst peer vs normlab: {:.2g} of the bound 2 bf16 ulp + 2^-6·max)", worst);
}

}  // namespace

LowPrecisionContext RegisterLowPrecision() {
  LowPrecisionContext ctx;
  bool onednn_bf16 = false;
  try {
    const auto pd = onednn::LayerNormForwardDesc(OneDnnBf16Descs(Shape{64, 64, 64 * 64}));
    onednn_bf16 = true;
    ctx.onednn_bf16 = pd.impl_info_str();
  } catch (const dnnl::error& e) {
    ctx.onednn_bf16 = fmt::format("not supported ({})", e.what());
  }
  for (Index elems : {kInCacheElems, kOutOfCacheElems})
    for (Index d : kDims) {
      const Shape s{elems / d, d, elems};
      for (const Op& op : Ops(onednn_bf16))
        for (const std::string& impl : op.impls) {
          const Maker make = op.maker(impl);
          const std::int64_t bytes = op.bytes_per_elem * s.numel();
          benchmark::RegisterBenchmark(("BM_" + op.name + "/" + impl + "/" + s.name()).c_str(),
                                       [make, s, bytes](benchmark::State& st) { Bench(st, make, s, bytes); })
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
    }
  ctx.selfcheck = SelfCheck(onednn_bf16);
  return ctx;
}

}  // namespace normlab::bench
