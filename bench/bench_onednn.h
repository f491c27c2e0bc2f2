// bench/bench_onednn.h — oneDNN as a peer in the benchmarks: one CPU engine and stream for every source, the
// scale-and-shift flags, and its LayerNorm set up the one way every comparison uses it (bench_norm.cpp,
// bench_layouts.cpp, bench_norm_lowp.cpp, bench_peer_pair.cpp): the training forward (y, mean, variance from
// x, γ, β) and the backward (dx, dγ, dβ from dy, x, γ, β and the mean and variance of one forward run at
// set-up, outside any timing). oneDNN normalizes over the last logical dimension of `data`; a strided
// descriptor places it anywhere in memory ([B, F, T] over F: logical [B, T, F] with F's stride T).
#pragma once

#include <dnnl.hpp>
#include <string>
#include <unordered_map>

namespace normlab::bench::onednn {

using dnnl::memory;

inline dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}
inline dnnl::stream& Stream() {
  static dnnl::stream stream(Engine());
  return stream;
}
inline const dnnl::normalization_flags kScaleShift =
    dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;

// A primitive with its arguments, ready to run; `impl` is oneDNN's name for the implementation it chose.
struct Call {
  dnnl::primitive prim;
  std::unordered_map<int, memory> args;
  std::string impl;
  void Run() const {
    prim.execute(Stream(), args);
    Stream().wait();
  }
};

// A LayerNorm's buffers: x, y, dy, dx of `data`'s type and layout; mean and variance of `stat`'s; γ, β, dγ,
// dβ float32 of `param`'s. The forward uses x, y, mean, var, gamma, beta; the backward all of them.
struct LayerNormDescs {
  memory::desc data, stat, param;
  double eps;
};
struct LayerNormBuffers {
  void* x = nullptr;
  void* y = nullptr;
  void* dy = nullptr;
  void* dx = nullptr;
  float* mean = nullptr;
  float* var = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  float* dgamma = nullptr;
  float* dbeta = nullptr;
};

// Throws dnnl::error where oneDNN has no implementation for the descriptors.
inline dnnl::layer_normalization_forward::primitive_desc LayerNormForwardDesc(const LayerNormDescs& d) {
  return dnnl::layer_normalization_forward::primitive_desc(
      dnnl::layer_normalization_forward::desc(dnnl::prop_kind::forward_training, d.data, d.stat,
                                              static_cast<float>(d.eps), kScaleShift),
      Engine());
}

namespace detail {
inline memory Mem(const memory::desc& md, const void* p) {
  return memory(md, Engine(), const_cast<void*>(p));  // oneDNN's memory takes a non-const handle
}
inline std::unordered_map<int, memory> ForwardArgs(const LayerNormDescs& d, const LayerNormBuffers& b) {
  return {{DNNL_ARG_SRC, Mem(d.data, b.x)},        {DNNL_ARG_DST, Mem(d.data, b.y)},
          {DNNL_ARG_MEAN, Mem(d.stat, b.mean)},    {DNNL_ARG_VARIANCE, Mem(d.stat, b.var)},
          {DNNL_ARG_SCALE, Mem(d.param, b.gamma)}, {DNNL_ARG_SHIFT, Mem(d.param, b.beta)}};
}
}  // namespace detail

inline Call LayerNormForward(const LayerNormDescs& d, const LayerNormBuffers& b) {
  const auto pd = LayerNormForwardDesc(d);
  return {dnnl::layer_normalization_forward(pd), detail::ForwardArgs(d, b), pd.impl_info_str()};
}

// Runs the forward once (y, mean, var written) and returns the backward, which reads that mean and variance.
inline Call LayerNormBackward(const LayerNormDescs& d, const LayerNormBuffers& b) {
  const auto fpd = LayerNormForwardDesc(d);
  const Call fwd{dnnl::layer_normalization_forward(fpd), detail::ForwardArgs(d, b), fpd.impl_info_str()};
  fwd.Run();
  const dnnl::layer_normalization_backward::primitive_desc bpd(
      dnnl::layer_normalization_backward::desc(dnnl::prop_kind::backward, d.data, d.data, d.stat,
                                               static_cast<float>(d.eps), kScaleShift),
      Engine(), fpd);
  std::unordered_map<int, memory> args = fwd.args;
  args.erase(DNNL_ARG_DST);
  args.emplace(DNNL_ARG_DIFF_DST, detail::Mem(d.data, b.dy));
  args.emplace(DNNL_ARG_DIFF_SRC, detail::Mem(d.data, b.dx));
  args.emplace(DNNL_ARG_DIFF_SCALE, detail::Mem(d.param, b.dgamma));
  args.emplace(DNNL_ARG_DIFF_SHIFT, detail::Mem(d.param, b.dbeta));
  return {dnnl::layer_normalization_backward(bpd), std::move(args), bpd.impl_info_str()};
}

}  // namespace normlab::bench::onednn
