// bench/bench_layouts.cpp — the layout fast paths in the normlab_bench binary (main is in bench_norm.cpp;
// these benchmarks register themselves when the program starts):
//   BM_LayerNormBwdBFT/{normlab,aten,onednn}/32x80x1000   dx, dγ, dβ over axis 1 (F) of a contiguous
//                        [B, F, T]. normlab on the strided axis (its column path); ATen by the permute
//                        route: x and dy permute(0,2,1).contiguous(), native_layer_norm_backward over the
//                        last dim with mean/rstd of one forward made outside the loop, dx permuted back
//                        .contiguous(), all of it timed; oneDNN on strided memory descriptors
//   BM_LayerNormBwdBFTSaved/normlab/32x80x1000            the same from the double statistics of one
//                        forward made outside the loop (NormStats, layer_norm_backward_saved), as the
//                        peers take theirs
//   BM_RMSNormFwdBFT/{normlab,aten}/32x80x1000            y over F; ATen as users compose it over dim 1:
//                        x·rsqrt(x.pow(2).mean(1, keepdim) + eps)·γ (no permute needed)
//   BM_BatchNormFwd/{normlab,aten,onednn}/64x256x400       training forward on [N, C, T]: y and the batch
//                        statistics (normlab and ATen also update running_mean/var; oneDNN
//                        batch_normalization forward_training with use_scale | use_shift)
//   BM_BatchNormBwd/{normlab,aten,onednn}/64x256x400       training backward: dx, dγ, dβ. ATen and oneDNN
//                        take the saved mean and rstd (variance) of one forward made outside the loop;
//                        normlab recomputes them from x, as its contract says
//   BM_BatchNormBwdSaved/normlab/64x256x400               the same from the statistics of one forward made
//                        outside the loop (BatchNormStats, batch_norm_backward_saved), as the peers take
//                        theirs
//   BM_BatchNorm{Fwd,Bwd}ChannelsLast/{normlab,aten,onednn}/64x400x256  the same BatchNorm on [N, T, C]
//                        memory, channels innermost (normlab channel_axis 2; ATen on the [N, C, T] view of
//                        that memory; oneDNN format nwc)
//   BM_LayerNorm{Fwd,Bwd}/normlab/32000x80                the BFT problem's bytes as contiguous rows over
//                        the last axis: what the strided path is measured against (normlab only)
//   BM_LayerNorm{Fwd,Bwd}Permuted/{normlab,aten}/32x1024x1024  over C of a [B, T, C] view of [T, B, C]
//                        memory (sequence-first activations seen batch-first; the backward recomputing
//                        in normlab, from one forward's mean/rstd in ATen). ATen's
//                        native_layer_norm(_backward) on the permuted tensor makes its contiguous copy itself
//                        and returns contiguous [B, T, C] (permuted back for the self-check, untimed)
//   BM_LayerNorm{Fwd,Bwd}/normlab/32768x1024              that memory as the contiguous rows it is
//   BM_GroupNorm{Fwd,Bwd}/{normlab,aten}/4096x1024         GroupNorm with 32 groups of [N, C] (one element
//                        per channel and item: normlab's sample rows); the backward dx, dγ, dβ recomputing
//                        in normlab, from one forward's mean/rstd in ATen (native_group_norm(_backward))
//   BM_GroupNorm{Fwd,Bwd}/{normlab,aten}/1024x256x16       the same of [N, C, 4·4] (segments of 16 floats:
//                        normlab's sample runs)
//   BM_GroupNorm{Fwd,Bwd}/{normlab,aten}/2048x256x8        the same of [N, C, 8] (segments of 8 floats:
//                        sample runs, sixteen segments' elements deinterleaved into vector lanes; from
//                        the forty-sixth session LayerNorm rows of 64: GroupNorm's group_rows)
//   BM_InstanceNorm{Fwd,Bwd}/{normlab,aten}/{1024x256x16,256x256x64}  InstanceNorm of [N, C, S]; ATen as
//                        torch.nn.functional.instance_norm runs it (BatchNorm over the [1, N·C, S] view, the
//                        backward from one forward's mean/invstd), normlab recomputing
//   BM_InstanceNormBwdSaved/normlab/{1024x256x16,256x256x64}  normlab's backward from one forward's
//                        ChannelNormStats (instance_norm_backward_saved): what ATen's backward gets; bitwise
//                        the recomputing backward's
//   BM_Copy/copy/{64x256x400,32000x80,32768x1024}, BM_CopyStream/...  the copy roofline at those shapes
//                        (the BFT shape's copies are in bench_norm.cpp)
// Bytes per iteration as in bench_norm.cpp: forward 2·4·N (x, y), backward 3·4·N (x, dy, dx).
// Threads: whatever main set (NORMLAB_BENCH_THREADS) for normlab, ATen, oneDNN and the copies.
// Before timing, each peer's output is compared once with normlab's on the benchmark's own shape; a peer
// that differs by more than 1e-4 (relative to the largest value) is reported as an error, not timed.
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <dnnl.hpp>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench_copy.h"
#include "bench_onednn.h"
#include "bench_support.h"

namespace {

using normlab::Index;
constexpr double kEps = 1e-5;

// ---- buffers: x, dy filled once from a fixed seed; y, dx first touched outside the timed loops ------

// Aligned buffers and the seeded fill come from bench_support.h (shared with bench_norm.cpp).
using normlab::bench::AllocateFloats;
using normlab::bench::Buffer;
using normlab::bench::FillUniform;

struct Shape {
  std::string name;
  std::vector<Index> dims;
  Index numel() const {
    Index n = 1;
    for (Index d : dims) n *= d;
    return n;
  }
  int channel_dim = 1;  // the axis of γ, β: F of [B,F,T], C of [N,C,T]; C of the permuted [B,T,C]
  Index channels() const { return dims[static_cast<std::size_t>(channel_dim)]; }
};

struct Data {
  Buffer x, y, dy, dx, gamma, beta;
};

Data& GetData(const Shape& s) {
  static std::map<std::string, std::unique_ptr<Data>> all;
  auto& d = all[s.name];
  if (!d) {
    d = std::make_unique<Data>();
    const Index n = s.numel(), c = s.channels();
    d->x = AllocateFloats(n);
    d->y = AllocateFloats(n);
    d->dy = AllocateFloats(n);
    d->dx = AllocateFloats(n);
    d->gamma = AllocateFloats(c);
    d->beta = AllocateFloats(c);
    FillUniform(d->x.get(), n, 11, -1.5f, 2.5f);
    FillUniform(d->dy.get(), n, 12, -1.0f, 1.0f);
    std::fill_n(d->y.get(), n, 0.0f);
    std::fill_n(d->dx.get(), n, 0.0f);
    FillUniform(d->gamma.get(), c, 13, 0.5f, 1.5f);
    FillUniform(d->beta.get(), c, 14, -0.5f, 0.5f);
  }
  return *d;
}

const Shape kBft{"32x80x1000", {32, 80, 1000}};
const Shape kRows{"32000x80", {32000, 80}};  // the BFT problem's bytes as contiguous rows over the last axis
const Shape kBn{"64x256x400", {64, 256, 400}};
const Shape kBnLast{"64x400x256", {64, 400, 256}, 2};  // the same problem with the channels innermost
// A [B, T, C] view of [T, B, C] memory (sequence-first activations seen batch-first), over C; its memory
// holds T·B rows of C, and kPermRows is that memory as the contiguous rows it is.
const Shape kPerm{"32x1024x1024", {32, 1024, 1024}, 2};
const Shape kPermRows{"32768x1024", {32768, 1024}};
const Shape kGn{"4096x1024", {4096, 1024}};  // GroupNorm of [N, C], kGroups groups
const Shape kGnSmall{"1024x256x16", {1024, 256, 16}};  // GroupNorm of [N, C, H·W] with H·W = 4 × 4
const Shape kGnShort{"2048x256x8", {2048, 256, 8}};    // GroupNorm of [N, C, T] with T = 8
const Shape kInShort{"1024x256x16", {1024, 256, 16}};  // InstanceNorm of [N, C, H·W], H·W = 4 × 4
const Shape kInMid{"256x256x64", {256, 256, 64}};      // InstanceNorm of [N, C, H·W], H·W = 8 × 8
constexpr int kGroups = 32;

// ---- implementations: Run() is timed; Result() gives the main output and (backward) dγ, dβ ----------

struct Result {
  const float* main;
  const float* dgamma = nullptr;
  const float* dbeta = nullptr;
};

class Impl {
 public:
  virtual ~Impl() = default;
  virtual void Run() = 0;
  virtual Result Get() = 0;
  std::string label;  // oneDNN: the implementation it picked
};

at::Tensor Wrap(const float* p, const std::vector<Index>& shape) {
  return at::from_blob(const_cast<float*>(p), at::IntArrayRef(shape), at::TensorOptions().dtype(at::kFloat));
}
normlab::Dims D(const std::vector<Index>& v) {
  return normlab::Dims(v);
}

// Generic holder: a lambda to run and one to read the result.
class Lambda : public Impl {
 public:
  Lambda(std::function<void()> run, std::function<Result()> get)
      : run_(std::move(run)), get_(std::move(get)) {}
  void Run() override { run_(); }
  Result Get() override { return get_(); }

 private:
  std::function<void()> run_;
  std::function<Result()> get_;
};

namespace onednn = normlab::bench::onednn;

struct State {  // what an implementation keeps alive between calls
  std::vector<float> a, b, c, d;
  at::Tensor t0, t1, t2, t3, t4, t5, t6, t7, t8;
  std::tuple<at::Tensor, at::Tensor, at::Tensor> out;
  onednn::Call call;  // oneDNN's primitive and arguments (bench_onednn.h)
  normlab::NormStats stats;
  normlab::ChannelNormStats cstats;  // InstanceNorm's / GroupNorm's, for the backward from saved statistics
  normlab::BatchNormStats bstats;    // BatchNorm's, likewise
};

using dnnl::memory;
using onednn::Engine;
using onednn::kScaleShift;

// [B, F, T] over F as oneDNN sees it: logical [B, T, F] with F's stride T.
memory::desc BftDesc(const Shape& s) {
  const Index B = s.dims[0], F = s.dims[1], T = s.dims[2];
  return memory::desc({B, T, F}, memory::data_type::f32, memory::dims{F * T, 1, T});
}

enum class Bench {
  kLnBwdBft,
  kLnBwdBftSaved,
  kRmsFwdBft,
  kBnFwd,
  kBnBwd,
  kBnBwdSaved,
  kLnFwdRows,
  kLnBwdRows,
  kLnFwdPerm,
  kLnBwdPerm,
  kGnFwd,
  kGnBwd,
  kInFwd,
  kInBwd,
  kInBwdSaved
};

// normlab's InstanceNorm or GroupNorm of [N, C, ...] (x, γ, β from d; y or dx, dγ, dβ into d and st):
// fwd(y, x, γ, β) or bwd(dx, dγ, dβ, dy, x, γ) is the library call, its other arguments bound by the caller.
template <typename Fwd, typename Bwd>
std::unique_ptr<Impl> PerSampleNormlab(bool forward, Data& d, const std::shared_ptr<State>& st,
                                       const Shape& s, Index C, Fwd fwd, Bwd bwd) {
  st->a.assign(static_cast<std::size_t>(C), 0.0f);
  st->b.assign(static_cast<std::size_t>(C), 0.0f);
  if (forward)
    return std::make_unique<Lambda>(
        [&d, s, C, fwd] {
          fwd(normlab::View(d.y.get(), D(s.dims)), normlab::ConstView(d.x.get(), D(s.dims)),
              normlab::ConstView(d.gamma.get(), D({C})), normlab::ConstView(d.beta.get(), D({C})));
        },
        [&d] { return Result{d.y.get()}; });
  return std::make_unique<Lambda>(
      [&d, st, s, C, bwd] {
        bwd(normlab::View(d.dx.get(), D(s.dims)), normlab::View(st->a.data(), D({C})),
            normlab::View(st->b.data(), D({C})), normlab::ConstView(d.dy.get(), D(s.dims)),
            normlab::ConstView(d.x.get(), D(s.dims)), normlab::ConstView(d.gamma.get(), D({C})));
      },
      [&d, st] {
        return Result{d.dx.get(), st->a.data(), st->b.data()};
      });
}

std::unique_ptr<Impl> Make(Bench b, const std::string& impl, const Shape& s) {
  Data& d = GetData(s);
  auto st = std::make_shared<State>();
  const Index C = s.channels();
  const std::vector<Index> cs{C};
  if (b == Bench::kLnFwdRows || b == Bench::kLnBwdRows) {  // normlab only: the reference for the BFT path
    const Index Dn = s.dims[1], R = s.dims[0];
    st->a.resize(static_cast<std::size_t>(std::max(R, Dn)));
    st->b.resize(static_cast<std::size_t>(std::max(R, Dn)));
    if (b == Bench::kLnFwdRows)
      return std::make_unique<Lambda>(
          [&d, st, s, R, Dn] {
            normlab::layer_norm_forward(
                normlab::View(d.y.get(), D(s.dims)), normlab::View(st->a.data(), D({R})),
                normlab::View(st->b.data(), D({R})), normlab::ConstView(d.x.get(), D(s.dims)),
                normlab::ConstView(d.gamma.get(), D({Dn})), normlab::ConstView(d.beta.get(), D({Dn})), {1},
                kEps);
          },
          [&d] { return Result{d.y.get()}; });
    return std::make_unique<Lambda>(
        [&d, st, s, Dn] {
          normlab::layer_norm_backward(
              normlab::View(d.dx.get(), D(s.dims)), normlab::View(st->a.data(), D({Dn})),
              normlab::View(st->b.data(), D({Dn})), normlab::ConstView(d.dy.get(), D(s.dims)),
              normlab::ConstView(d.x.get(), D(s.dims)), normlab::ConstView(d.gamma.get(), D({Dn})), {1},
              kEps);
        },
        [&d, st] {
          return Result{d.dx.get(), st->a.data(), st->b.data()};
        });
  }
  if (b == Bench::kLnFwdPerm || b == Bench::kLnBwdPerm) {
    // x, y, dy, dx hold [T, B, C] memory; the problem is its [B, T, C] view. Results compared in memory
    // order (ATen's outputs, contiguous [B, T, C], are permuted back outside the timed call).
    const Index B = s.dims[0], T = s.dims[1];
    const std::vector<Index> mem{T, B, C};
    const bool fwd = b == Bench::kLnFwdPerm;
    if (impl == "normlab") {
      st->a.resize(static_cast<std::size_t>(fwd ? B * T : C));
      st->b.resize(static_cast<std::size_t>(fwd ? B * T : C));
      const auto view = [mem](float* p) { return normlab::View(p, D(mem)).permute({1, 0, 2}); };
      const auto cview = [mem](const float* p) { return normlab::ConstView(p, D(mem)).permute({1, 0, 2}); };
      if (fwd)
        return std::make_unique<Lambda>(
            [&d, st, B, T, C, view, cview] {
              normlab::layer_norm_forward(view(d.y.get()), normlab::View(st->a.data(), D({B, T})),
                                          normlab::View(st->b.data(), D({B, T})), cview(d.x.get()),
                                          normlab::ConstView(d.gamma.get(), D({C})),
                                          normlab::ConstView(d.beta.get(), D({C})), {2}, kEps);
            },
            [&d] { return Result{d.y.get()}; });
      return std::make_unique<Lambda>(
          [&d, st, C, view, cview] {
            normlab::layer_norm_backward(
                view(d.dx.get()), normlab::View(st->a.data(), D({C})), normlab::View(st->b.data(), D({C})),
                cview(d.dy.get()), cview(d.x.get()), normlab::ConstView(d.gamma.get(), D({C})), {2}, kEps);
          },
          [&d, st] {
            return Result{d.dx.get(), st->a.data(), st->b.data()};
          });
    }
    // ATen: native_layer_norm on the permuted tensor (it makes the contiguous copy itself); the backward
    // takes mean and rstd of one forward made here.
    st->t0 = Wrap(d.x.get(), mem).permute({1, 0, 2});
    st->t1 = Wrap(d.dy.get(), mem).permute({1, 0, 2});
    st->t2 = Wrap(d.gamma.get(), cs);
    st->t3 = Wrap(d.beta.get(), cs);
    if (fwd)
      return std::make_unique<Lambda>(
          [st, C] {
            st->out = at::native_layer_norm(st->t0, {C}, st->t2, st->t3, kEps);
            benchmark::DoNotOptimize(std::get<0>(st->out).data_ptr());
          },
          [st] {
            st->t6 = std::get<0>(st->out).permute({1, 0, 2}).contiguous();
            return Result{st->t6.data_ptr<float>()};
          });
    auto f = at::native_layer_norm(st->t0, {C}, st->t2, st->t3, kEps);
    st->t4 = std::get<1>(f);
    st->t5 = std::get<2>(f);
    return std::make_unique<Lambda>(
        [st, C] {
          st->out = at::native_layer_norm_backward(st->t1, st->t0, {C}, st->t4, st->t5, st->t2, st->t3,
                                                   {true, true, true});
          benchmark::DoNotOptimize(std::get<0>(st->out).data_ptr());
        },
        [st] {
          st->t6 = std::get<0>(st->out).permute({1, 0, 2}).contiguous();
          return Result{st->t6.data_ptr<float>(), std::get<1>(st->out).data_ptr<float>(),
                        std::get<2>(st->out).data_ptr<float>()};
        });
  }
  if (b == Bench::kLnBwdBft || b == Bench::kLnBwdBftSaved) {
    const Index B = s.dims[0], T = s.dims[2];
    if (impl == "normlab") {
      st->a.resize(static_cast<std::size_t>(C));
      st->b.resize(static_cast<std::size_t>(C));
      // Saved (normlab only): the double statistics of one forward made here, as the peers take theirs.
      const bool saved = b == Bench::kLnBwdBftSaved;
      if (saved)
        normlab::layer_norm_forward(normlab::View(d.y.get(), D(s.dims)), {}, {},
                                    normlab::ConstView(d.x.get(), D(s.dims)),
                                    normlab::ConstView(d.gamma.get(), D({C})),
                                    normlab::ConstView(d.beta.get(), D({C})), {1}, kEps, &st->stats);
      return std::make_unique<Lambda>(
          [&d, st, s, C, saved] {
            const normlab::View dx(d.dx.get(), D(s.dims)), dw(st->a.data(), D({C})), db(st->b.data(), D({C}));
            const normlab::ConstView dy(d.dy.get(), D(s.dims)), x(d.x.get(), D(s.dims)),
                w(d.gamma.get(), D({C}));
            if (saved)
              normlab::layer_norm_backward_saved(dx, dw, db, dy, x, w, st->stats);
            else
              normlab::layer_norm_backward(dx, dw, db, dy, x, w, {1}, kEps);
          },
          [&d, st] {
            return Result{d.dx.get(), st->a.data(), st->b.data()};
          });
    }
    if (impl == "aten") {
      st->t0 = Wrap(d.x.get(), s.dims);
      st->t1 = Wrap(d.dy.get(), s.dims);
      st->t2 = Wrap(d.gamma.get(), cs);
      st->t3 = Wrap(d.beta.get(), cs);
      auto fwd = at::native_layer_norm(st->t0.permute({0, 2, 1}).contiguous(), {C}, st->t2, st->t3, kEps);
      st->t4 = std::get<1>(fwd);
      st->t5 = std::get<2>(fwd);
      return std::make_unique<Lambda>(
          [st, C] {
            auto r = at::native_layer_norm_backward(st->t1.permute({0, 2, 1}).contiguous(),
                                                    st->t0.permute({0, 2, 1}).contiguous(), {C}, st->t4,
                                                    st->t5, st->t2, st->t3, {true, true, true});
            std::get<0>(r) = std::get<0>(r).permute({0, 2, 1}).contiguous();
            benchmark::DoNotOptimize(std::get<0>(r).data_ptr());
            st->out = std::move(r);
          },
          [st] {
            return Result{std::get<0>(st->out).data_ptr<float>(), std::get<1>(st->out).data_ptr<float>(),
                          std::get<2>(st->out).data_ptr<float>()};
          });
    }
    // oneDNN: strided descriptors; forward once for mean/variance, then the backward primitive.
    for (auto* v : {&st->a, &st->b}) v->resize(static_cast<std::size_t>(B * T));
    for (auto* v : {&st->c, &st->d}) v->resize(static_cast<std::size_t>(C));
    const onednn::LayerNormDescs descs{
        BftDesc(s), memory::desc({B, T}, memory::data_type::f32, memory::format_tag::ab),
        memory::desc({C}, memory::data_type::f32, memory::format_tag::a), kEps};
    st->call = onednn::LayerNormBackward(
        descs, {d.x.get(), d.y.get(), d.dy.get(), d.dx.get(), st->a.data(), st->b.data(), d.gamma.get(),
                d.beta.get(), st->c.data(), st->d.data()});
    auto out = std::make_unique<Lambda>([st] { st->call.Run(); },
                                        [&d, st] {
                                          return Result{d.dx.get(), st->c.data(), st->d.data()};
                                        });
    out->label = st->call.impl;
    return out;
  }
  if (b == Bench::kRmsFwdBft) {
    if (impl == "normlab")
      return std::make_unique<Lambda>(
          [&d, s, C] {
            normlab::rms_norm_forward(normlab::View(d.y.get(), D(s.dims)), {},
                                      normlab::ConstView(d.x.get(), D(s.dims)),
                                      normlab::ConstView(d.gamma.get(), D({C})), {1}, kEps);
          },
          [&d] { return Result{d.y.get()}; });
    st->t0 = Wrap(d.x.get(), s.dims);
    st->t1 = Wrap(d.gamma.get(), cs).view({1, C, 1});
    return std::make_unique<Lambda>(
        [st] {
          st->t2 = st->t0 * at::rsqrt(st->t0.pow(2).mean({1}, true) + kEps) * st->t1;
          benchmark::DoNotOptimize(st->t2.data_ptr());
        },
        [st] { return Result{st->t2.data_ptr<float>()}; });
  }
  if (b == Bench::kGnFwd || b == Bench::kGnBwd) {  // GroupNorm of [N, C, ...]: normlab and ATen
    const bool gfwd = b == Bench::kGnFwd;
    const Index N = s.dims[0], HxW = s.numel() / (N * C);
    if (impl == "normlab")
      return PerSampleNormlab(
          gfwd, d, st, s, C,
          [](normlab::View y, normlab::ConstView x, normlab::ConstView g, normlab::ConstView be) {
            normlab::group_norm_forward(y, {}, {}, x, g, be, kGroups);
          },
          [](normlab::View dx, normlab::View dg, normlab::View db, normlab::ConstView dy,
             normlab::ConstView x,
             normlab::ConstView g) { normlab::group_norm_backward(dx, dg, db, dy, x, g, kGroups); });
    st->t0 = Wrap(d.x.get(), s.dims);
    st->t1 = Wrap(d.dy.get(), s.dims);
    st->t2 = Wrap(d.gamma.get(), cs);
    st->t3 = Wrap(d.beta.get(), cs);
    auto f = at::native_group_norm(st->t0, st->t2, st->t3, N, C, HxW, kGroups, kEps);
    st->t4 = std::get<1>(f);
    st->t5 = std::get<2>(f);
    if (gfwd)
      return std::make_unique<Lambda>(
          [st, N, C, HxW] {
            st->out = at::native_group_norm(st->t0, st->t2, st->t3, N, C, HxW, kGroups, kEps);
            benchmark::DoNotOptimize(std::get<0>(st->out).data_ptr());
          },
          [st] { return Result{std::get<0>(st->out).data_ptr<float>()}; });
    return std::make_unique<Lambda>(
        [st, N, C, HxW] {
          st->out = at::native_group_norm_backward(st->t1, st->t0, st->t4, st->t5, st->t2, N, C, HxW, kGroups,
                                                   {true, true, true});
          benchmark::DoNotOptimize(std::get<0>(st->out).data_ptr());
        },
        [st] {
          return Result{std::get<0>(st->out).data_ptr<float>(), std::get<1>(st->out).data_ptr<float>(),
                        std::get<2>(st->out).data_ptr<float>()};
        });
  }
  if (b == Bench::kInFwd || b == Bench::kInBwd || b == Bench::kInBwdSaved) {  // InstanceNorm: normlab, ATen
    const bool ifwd = b == Bench::kInFwd;
    const Index N = s.dims[0], S = s.numel() / (N * C);
    if (b == Bench::kInBwdSaved) {  // normlab from the statistics of one forward made here
      normlab::instance_norm_forward(normlab::View(d.y.get(), D(s.dims)), {}, {},
                                     normlab::ConstView(d.x.get(), D(s.dims)),
                                     normlab::ConstView(d.gamma.get(), D({C})),
                                     normlab::ConstView(d.beta.get(), D({C})), {}, {}, &st->cstats);
      return PerSampleNormlab(
          false, d, st, s, C,
          [](normlab::View, normlab::ConstView, normlab::ConstView, normlab::ConstView) {},
          [st](normlab::View dx, normlab::View dg, normlab::View db, normlab::ConstView dy,
               normlab::ConstView x, normlab::ConstView g) {
            normlab::instance_norm_backward_saved(dx, dg, db, dy, x, g, st->cstats);
          });
    }
    if (impl == "normlab")
      return PerSampleNormlab(
          ifwd, d, st, s, C,
          [](normlab::View y, normlab::ConstView x, normlab::ConstView g, normlab::ConstView be) {
            normlab::instance_norm_forward(y, {}, {}, x, g, be);
          },
          [](normlab::View dx, normlab::View dg, normlab::View db, normlab::ConstView dy,
             normlab::ConstView x,
             normlab::ConstView g) { normlab::instance_norm_backward(dx, dg, db, dy, x, g); });
    // What torch.nn.functional.instance_norm runs on the CPU (at::instance_norm): BatchNorm in training mode
    // over the [1, N·C, S] view, γ and β repeated N times; its backward, native_batch_norm_backward from the
    // forward's mean and invstd, gives dγ, dβ per (n, c), which autograd's repeat sums over n (here in
    // Get(), untimed: C·N additions).
    st->t0 = Wrap(d.x.get(), {1, N * C, S});
    st->t1 = Wrap(d.dy.get(), {1, N * C, S});
    st->t2 = Wrap(d.gamma.get(), cs).repeat({N});
    st->t3 = Wrap(d.beta.get(), cs).repeat({N});
    if (ifwd)
      return std::make_unique<Lambda>(
          [st] {
            st->out = at::native_batch_norm(st->t0, st->t2, st->t3, {}, {}, true, 0.1, kEps);
            benchmark::DoNotOptimize(std::get<0>(st->out).data_ptr());
          },
          [st] { return Result{std::get<0>(st->out).data_ptr<float>()}; });
    auto f = at::native_batch_norm(st->t0, st->t2, st->t3, {}, {}, true, 0.1, kEps);
    st->t4 = std::get<1>(f);
    st->t5 = std::get<2>(f);
    return std::make_unique<Lambda>(
        [st] {
          st->out = at::native_batch_norm_backward(st->t1, st->t0, st->t2, {}, {}, st->t4, st->t5, true, kEps,
                                                   {true, true, true});
          benchmark::DoNotOptimize(std::get<0>(st->out).data_ptr());
        },
        [st, N, C] {
          const at::Tensor dg = std::get<1>(st->out).view({N, C}).sum(0),
                           db = std::get<2>(st->out).view({N, C}).sum(0);
          st->a.assign(dg.data_ptr<float>(), dg.data_ptr<float>() + C);
          st->b.assign(db.data_ptr<float>(), db.data_ptr<float>() + C);
          return Result{std::get<0>(st->out).data_ptr<float>(), st->a.data(), st->b.data()};
        });
  }
  // BatchNorm, training; [N, C, T], or [N, T, C] with the channels innermost (channel_dim 2).
  const bool fwd = b == Bench::kBnFwd;
  const bool last = s.channel_dim == 2;
  normlab::BatchNormOptions bn_opt;
  bn_opt.channel_axis = s.channel_dim;
  if (impl == "normlab") {
    for (auto* v : {&st->a, &st->b, &st->c, &st->d}) v->assign(static_cast<std::size_t>(C), 0.0f);
    std::fill(st->d.begin(), st->d.end(), 1.0f);  // running_var
    if (fwd)
      return std::make_unique<Lambda>(
          [&d, st, s, C, bn_opt] {
            // save_mean, save_rstd, running_mean, running_var
            normlab::batch_norm_forward(
                normlab::View(d.y.get(), D(s.dims)), normlab::View(st->a.data(), D({C})),
                normlab::View(st->b.data(), D({C})), normlab::View(st->c.data(), D({C})),
                normlab::View(st->d.data(), D({C})), nullptr, normlab::ConstView(d.x.get(), D(s.dims)),
                normlab::ConstView(d.gamma.get(), D({C})), normlab::ConstView(d.beta.get(), D({C})), {},
                bn_opt);
          },
          [&d] { return Result{d.y.get()}; });
    if (b == Bench::kBnBwdSaved) {  // from the statistics of one forward made here
      normlab::batch_norm_forward(normlab::View(d.y.get(), D(s.dims)), {}, {}, {}, {}, nullptr,
                                  normlab::ConstView(d.x.get(), D(s.dims)),
                                  normlab::ConstView(d.gamma.get(), D({C})),
                                  normlab::ConstView(d.beta.get(), D({C})), {}, bn_opt, &st->bstats);
      return std::make_unique<Lambda>(
          [&d, st, s, C] {
            normlab::batch_norm_backward_saved(
                normlab::View(d.dx.get(), D(s.dims)), normlab::View(st->a.data(), D({C})),
                normlab::View(st->b.data(), D({C})), normlab::ConstView(d.dy.get(), D(s.dims)),
                normlab::ConstView(d.x.get(), D(s.dims)), normlab::ConstView(d.gamma.get(), D({C})),
                st->bstats);
          },
          [&d, st] {
            return Result{d.dx.get(), st->a.data(), st->b.data()};
          });
    }
    return std::make_unique<Lambda>(
        [&d, st, s, C, bn_opt] {
          normlab::batch_norm_backward(
              normlab::View(d.dx.get(), D(s.dims)), normlab::View(st->a.data(), D({C})),
              normlab::View(st->b.data(), D({C})), normlab::ConstView(d.dy.get(), D(s.dims)),
              normlab::ConstView(d.x.get(), D(s.dims)), normlab::ConstView(d.gamma.get(), D({C})), {}, {}, {},
              bn_opt);
        },
        [&d, st] {
          return Result{d.dx.get(), st->a.data(), st->b.data()};
        });
  }
  if (impl == "aten") {
    // Channels innermost: ATen takes the [N, C, T] view of the [N, T, C] memory (its own layout handling);
    // its output, for the self-check, goes back to [N, T, C] order outside the timed call.
    st->t0 = Wrap(d.x.get(), s.dims);
    st->t1 = Wrap(d.dy.get(), s.dims);
    if (last) {
      st->t0 = st->t0.permute({0, 2, 1});
      st->t1 = st->t1.permute({0, 2, 1});
    }
    st->t2 = Wrap(d.gamma.get(), cs);
    st->t3 = Wrap(d.beta.get(), cs);
    st->t4 = at::zeros({C});
    st->t5 = at::ones({C});
    auto f = at::native_batch_norm(st->t0, st->t2, st->t3, st->t4, st->t5, true, 0.1, kEps);
    st->t6 = std::get<1>(f);
    st->t7 = std::get<2>(f);
    auto main_out = [st, last] {
      st->t8 =
          last ? std::get<0>(st->out).permute({0, 2, 1}).contiguous() : std::get<0>(st->out).contiguous();
      return st->t8.data_ptr<float>();
    };
    if (fwd)
      return std::make_unique<Lambda>(
          [st] {
            st->out = at::native_batch_norm(st->t0, st->t2, st->t3, st->t4, st->t5, true, 0.1, kEps);
            benchmark::DoNotOptimize(std::get<0>(st->out).data_ptr());
          },
          [main_out] { return Result{main_out()}; });
    return std::make_unique<Lambda>(
        [st] {
          st->out = at::native_batch_norm_backward(st->t1, st->t0, st->t2, st->t4, st->t5, st->t6, st->t7,
                                                   true, kEps, {true, true, true});
          benchmark::DoNotOptimize(std::get<0>(st->out).data_ptr());
        },
        [st, main_out] {
          return Result{main_out(), std::get<1>(st->out).data_ptr<float>(),
                        std::get<2>(st->out).data_ptr<float>()};
        });
  }
  // oneDNN batch_normalization, ncw (nwc with the channels innermost).
  dnnl::engine& e = Engine();
  const memory::dims logical =
      last ? memory::dims{s.dims[0], s.dims[2], s.dims[1]} : memory::dims(s.dims.begin(), s.dims.end());
  const memory::desc data(logical, memory::data_type::f32,
                          last ? memory::format_tag::nwc : memory::format_tag::ncw),
      stat({C}, memory::data_type::f32, memory::format_tag::a);
  for (auto* v : {&st->a, &st->b, &st->c, &st->d}) v->assign(static_cast<std::size_t>(C), 0.0f);
  const memory x(data, e, d.x.get()), mean(stat, e, st->a.data()), var(stat, e, st->b.data());
  const memory g(stat, e, d.gamma.get()), be(stat, e, d.beta.get());
  const dnnl::batch_normalization_forward::primitive_desc fpd(
      dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, data,
                                              static_cast<float>(kEps), kScaleShift),
      e);
  std::unordered_map<int, memory> fargs = {{DNNL_ARG_SRC, x},     {DNNL_ARG_DST, memory(data, e, d.y.get())},
                                           {DNNL_ARG_MEAN, mean}, {DNNL_ARG_VARIANCE, var},
                                           {DNNL_ARG_SCALE, g},   {DNNL_ARG_SHIFT, be}};
  if (fwd) {
    st->call = {dnnl::batch_normalization_forward(fpd), fargs, fpd.impl_info_str()};
    auto out = std::make_unique<Lambda>([st] { st->call.Run(); }, [&d] { return Result{d.y.get()}; });
    out->label = st->call.impl;
    return out;
  }
  onednn::Call{dnnl::batch_normalization_forward(fpd), fargs, {}}.Run();  // the statistics the backward reads
  const dnnl::batch_normalization_backward::primitive_desc bpd(
      dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, data, data,
                                               static_cast<float>(kEps), kScaleShift),
      e, fpd);
  st->call.prim = dnnl::batch_normalization_backward(bpd);
  st->call.impl = bpd.impl_info_str();
  st->call.args = {{DNNL_ARG_SRC, x},
                   {DNNL_ARG_DIFF_DST, memory(data, e, d.dy.get())},
                   {DNNL_ARG_MEAN, mean},
                   {DNNL_ARG_VARIANCE, var},
                   {DNNL_ARG_SCALE, g},
                   {DNNL_ARG_SHIFT, be},
                   {DNNL_ARG_DIFF_SRC, memory(data, e, d.dx.get())},
                   {DNNL_ARG_DIFF_SCALE, memory(stat, e, st->c.data())},
                   {DNNL_ARG_DIFF_SHIFT, memory(stat, e, st->d.data())}};
  auto out = std::make_unique<Lambda>([st] { st->call.Run(); },
                                      [&d, st] {
                                        return Result{d.dx.get(), st->c.data(), st->d.data()};
                                      });
  out->label = st->call.impl;
  return out;
}

// max |a − b| / max(1, max |b|)
double RelError(const float* a, const float* b, Index n) {
  double err = 0, scale = 1;
  for (Index i = 0; i < n; ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return err / scale;
}

struct Copy3 {
  std::vector<float> main, dg, db;
};
Copy3 Snapshot(Impl& impl, const Shape& s, bool grads) {
  impl.Run();
  const Result r = impl.Get();
  Copy3 c;
  c.main.assign(r.main, r.main + s.numel());
  if (grads) {
    c.dg.assign(r.dgamma, r.dgamma + s.channels());
    c.db.assign(r.dbeta, r.dbeta + s.channels());
  }
  return c;
}

bool IsBackward(Bench b) {
  return b == Bench::kLnBwdBft || b == Bench::kLnBwdBftSaved || b == Bench::kBnBwd ||
         b == Bench::kBnBwdSaved || b == Bench::kLnBwdRows || b == Bench::kLnBwdPerm || b == Bench::kGnBwd ||
         b == Bench::kInBwd || b == Bench::kInBwdSaved;
}

// The bytes the ideal kernel moves: forward x, y; backward x, dy, dx.
std::int64_t Bytes(Bench b, const Shape& s) {
  return (IsBackward(b) ? 3 : 2) * static_cast<std::int64_t>(sizeof(float)) * s.numel();
}

void Run(benchmark::State& state, Bench b, const std::string& impl, const Shape& s) {
  std::unique_ptr<Impl> p;
  try {
    p = Make(b, impl, s);
    if (impl != "normlab") {  // self-check against normlab on this shape, then the timed loop
      std::unique_ptr<Impl> ref = Make(b, "normlab", s);
      const bool g = IsBackward(b);
      const Copy3 want = Snapshot(*ref, s, g), got = Snapshot(*p, s, g);
      double err = RelError(got.main.data(), want.main.data(), s.numel());
      if (g) {
        err = std::max(err, RelError(got.dg.data(), want.dg.data(), s.channels()));
        err = std::max(err, RelError(got.db.data(), want.db.data(), s.channels()));
      }
      state.counters["selfcheck_err"] = err;
      if (!(err <= 1e-4)) {
        state.SkipWithError(("self-check failed: differs from normlab by " + std::to_string(err)).c_str());
        return;
      }
    }
    if (!p->label.empty()) state.SetLabel(p->label);
    p->Run();  // untimed warm-up
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) {
    p->Run();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * Bytes(b, s));
}

// ---- copy roofline at the BatchNorm shape -----------------------------------------------------------

// The copy kernels and their per-thread split come from bench_copy.h (shared with bench_norm.cpp).
void RunCopy(benchmark::State& state, bool stream, const Shape& s) {
  Data& d = GetData(s);
  normlab::bench::RunCopyBenchmark(state, stream, d.y.get(), d.x.get(), s.numel(), normlab::num_threads());
}

// ---- registration (at program start; main runs them with the other benchmarks) ----------------------

template <typename F>
void Register(const std::string& name, F&& fn) {
  benchmark::RegisterBenchmark(name.c_str(), std::forward<F>(fn))
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
}

// BM_<op>/<impl>/<shape> for each implementation.
void RegisterImpls(const char* op, std::initializer_list<const char*> impls, Bench b, const Shape& s) {
  for (const char* impl : impls)
    Register(std::string("BM_") + op + "/" + impl + "/" + s.name,
             [impl, b, &s](benchmark::State& st) { Run(st, b, impl, s); });
}

// The copy roofline at a shape (ordinary and streaming stores).
void RegisterCopies(const Shape& s) {
  Register("BM_Copy/copy/" + s.name, [&s](benchmark::State& st) { RunCopy(st, false, s); });
  Register("BM_CopyStream/copy/" + s.name, [&s](benchmark::State& st) { RunCopy(st, true, s); });
}

// Contiguous rows as the reference of a layout path: the copies and normlab's LayerNorm forward, backward.
void RegisterRowsReference(const Shape& s) {
  RegisterCopies(s);
  RegisterImpls("LayerNormFwd", {"normlab"}, Bench::kLnFwdRows, s);
  RegisterImpls("LayerNormBwd", {"normlab"}, Bench::kLnBwdRows, s);
}

const bool kRegistered = [] {
  RegisterImpls("LayerNormBwdBFT", {"normlab", "aten", "onednn"}, Bench::kLnBwdBft, kBft);
  RegisterImpls("LayerNormBwdBFTSaved", {"normlab"}, Bench::kLnBwdBftSaved, kBft);
  RegisterRowsReference(kRows);
  RegisterImpls("RMSNormFwdBFT", {"normlab", "aten"}, Bench::kRmsFwdBft, kBft);
  RegisterCopies(kBn);
  RegisterImpls("BatchNormFwd", {"normlab", "aten", "onednn"}, Bench::kBnFwd, kBn);
  RegisterImpls("BatchNormBwd", {"normlab", "aten", "onednn"}, Bench::kBnBwd, kBn);
  RegisterImpls("BatchNormBwdSaved", {"normlab"}, Bench::kBnBwdSaved, kBn);
  RegisterImpls("BatchNormFwdChannelsLast", {"normlab", "aten", "onednn"}, Bench::kBnFwd, kBnLast);
  RegisterImpls("BatchNormBwdChannelsLast", {"normlab", "aten", "onednn"}, Bench::kBnBwd, kBnLast);
  RegisterImpls("LayerNormFwdPermuted", {"normlab", "aten"}, Bench::kLnFwdPerm, kPerm);
  RegisterImpls("LayerNormBwdPermuted", {"normlab", "aten"}, Bench::kLnBwdPerm, kPerm);
  RegisterRowsReference(kPermRows);
  RegisterImpls("GroupNormFwd", {"normlab", "aten"}, Bench::kGnFwd, kGn);
  RegisterImpls("GroupNormBwd", {"normlab", "aten"}, Bench::kGnBwd, kGn);
  RegisterImpls("GroupNormFwd", {"normlab", "aten"}, Bench::kGnFwd, kGnSmall);
  RegisterImpls("GroupNormBwd", {"normlab", "aten"}, Bench::kGnBwd, kGnSmall);
  RegisterImpls("GroupNormFwd", {"normlab", "aten"}, Bench::kGnFwd, kGnShort);
  RegisterImpls("GroupNormBwd", {"normlab", "aten"}, Bench::kGnBwd, kGnShort);
  RegisterImpls("InstanceNormFwd", {"normlab", "aten"}, Bench::kInFwd, kInShort);
  RegisterImpls("InstanceNormBwd", {"normlab", "aten"}, Bench::kInBwd, kInShort);
  RegisterImpls("InstanceNormBwdSaved", {"normlab"}, Bench::kInBwdSaved, kInShort);
  RegisterImpls("InstanceNormFwd", {"normlab", "aten"}, Bench::kInFwd, kInMid);
  RegisterImpls("InstanceNormBwd", {"normlab", "aten"}, Bench::kInBwd, kInMid);
  RegisterImpls("InstanceNormBwdSaved", {"normlab"}, Bench::kInBwdSaved, kInMid);
  return true;
}();

}  // namespace
