// A standalone timing loop for one LayerNorm kernel on contiguous rows: the median and the 10th percentile of
// `calls` timed calls, and a hash of the output bits (y or dx; the backward adds a second one of dγ and dβ),
// so that an A/B of two builds (or of NORMLAB_ISA targets) shows a change of speed together with the proof
// that the result did not change. Google Benchmark (normlab_bench) is the record; this loop is for quick
// A/B runs of one kernel at one shape.
//
//   normlab_bench_loop KERNEL ROWS D [THREADS [CALLS]]
//   KERNEL: ln-fwd | ln-fwd-bf16 | ln-fwd-fp16 (y, mean, rstd from x, γ, β) |
//           ln-bwd-saved | ln-bwd-saved-bf16 (dx, dγ, dβ from dy, x, γ and the NormStats of one forward
//           before the loop) | rms-bwd-saved (RMSNorm: dx, dγ from dy, x, γ and NormStats; the dγ/dβ hash
//           then covers dγ and a zero dβ)
//   NORMLAB_ISA=avx512 normlab_bench_loop ln-fwd-bf16 682 768    # 1 thread, 200 calls
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/simd.h>
#include <normlab/tensor.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_support.h"

namespace {

using namespace normlab;
using bench::parse_positive;

template <typename T>
std::uint64_t hash_bits(const T* p, Index n) {
  std::uint64_t h = 0;
  for (Index i = 0; i < n; ++i) {
    if constexpr (sizeof(T) == 4) {
      std::uint32_t u;
      std::memcpy(&u, p + i, 4);
      h = h * 31 + u;
    } else {
      h = h * 31 + p[i].bits;
    }
  }
  return h;
}

int run(int argc, char** argv) {
  if (argc < 4 || argc > 6) {
    std::fprintf(
        stderr,
        "usage: %s ln-fwd|ln-fwd-bf16|ln-fwd-fp16|ln-bwd-saved|ln-bwd-saved-bf16|rms-bwd-saved ROWS D "
        "[THREADS [CALLS]]\n",
        argv[0]);
    return 2;
  }
  const std::string kernel = argv[1];
  const bool bf16 = kernel == "ln-fwd-bf16" || kernel == "ln-bwd-saved-bf16";
  const bool fp16 = kernel == "ln-fwd-fp16";
  const bool rms = kernel == "rms-bwd-saved";
  const bool backward = kernel == "ln-bwd-saved" || kernel == "ln-bwd-saved-bf16" || rms;
  if (!bf16 && !fp16 && !rms && kernel != "ln-fwd" && kernel != "ln-bwd-saved")
    throw std::invalid_argument("unknown kernel '" + kernel + "'");
  const Index rows = parse_positive(argv[2], "ROWS"), d = parse_positive(argv[3], "D");
  set_num_threads(argc > 4 ? static_cast<int>(parse_positive(argv[4], "THREADS")) : 1);
  const int calls = argc > 5 ? static_cast<int>(parse_positive(argv[5], "CALLS")) : 200;

  // x ~ N(1, 2), dy ~ N(1, 2); γ = 1 + 0.01·i, β = 0.1; the 16-bit inputs are the rounded fp32 ones.
  Tensor x({rows, d}), y({rows, d}), dy({rows, d}), w({d}), b({d}), mean({rows}), rstd({rows}), dw({d}),
      db({d});
  // (the 16-bit tensors have rows only for the kernel that uses them)
  BF16Tensor xh({bf16 ? rows : 0, d}), yh({bf16 ? rows : 0, d}), dyh({bf16 ? rows : 0, d});
  F16Tensor xf({fp16 ? rows : 0, d}), yf({fp16 ? rows : 0, d});
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(1.0f, 2.0f);
  for (Index i = 0; i < x.numel(); ++i) {
    x.data()[i] = dist(gen);
    dy.data()[i] = dist(gen);
    if (bf16) {
      xh.data()[i] = bfloat16(x.data()[i]);
      dyh.data()[i] = bfloat16(dy.data()[i]);
    }
    if (fp16) xf.data()[i] = float16(x.data()[i]);
  }
  for (Index i = 0; i < d; ++i) {
    w.data()[i] = 1.0f + 0.01f * static_cast<float>(i);
    b.data()[i] = 0.1f;
  }
  NormStats st;
  if (backward && bf16)
    layer_norm_forward(yh.view(), mean.view(), rstd.view(), xh.cview(), w.cview(), b.cview(), Axes{1}, 1e-5,
                       &st);
  if (backward && !bf16 && !rms)
    layer_norm_forward(y.view(), mean.view(), rstd.view(), x.cview(), w.cview(), b.cview(), Axes{1}, 1e-5,
                       &st);
  if (rms) rms_norm_forward(y.view(), rstd.view(), x.cview(), w.cview(), Axes{1}, 1e-6, &st);  // (db stays 0)

  std::vector<double> us;
  for (int c = 0; c < calls; ++c) {
    const auto t0 = std::chrono::steady_clock::now();
    if (fp16)
      layer_norm_forward(yf.view(), mean.view(), rstd.view(), xf.cview(), w.cview(), b.cview(), Axes{1},
                         1e-5);
    else if (!backward && !bf16)
      layer_norm_forward(y.view(), mean.view(), rstd.view(), x.cview(), w.cview(), b.cview(), Axes{1}, 1e-5);
    if (!backward && bf16)
      layer_norm_forward(yh.view(), mean.view(), rstd.view(), xh.cview(), w.cview(), b.cview(), Axes{1},
                         1e-5);
    if (rms)
      rms_norm_backward_saved(y.view(), dw.view(), dy.cview(), x.cview(), w.cview(), st);
    else if (backward && !bf16)
      layer_norm_backward_saved(y.view(), dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), st);
    if (backward && bf16)
      layer_norm_backward_saved(yh.view(), dw.view(), db.view(), dyh.cview(), xh.cview(), w.cview(), st);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  const std::uint64_t h = bf16   ? hash_bits(yh.data(), yh.numel())
                          : fp16 ? hash_bits(yf.data(), yf.numel())
                                 : hash_bits(y.data(), y.numel());
  std::printf("%s %lldx%lld %s %d threads: median %.1f us, p10 %.1f us, output hash %016llx", kernel.c_str(),
              static_cast<long long>(rows), static_cast<long long>(d), isa_name(active_isa()), num_threads(),
              us[us.size() / 2], us[us.size() / 10], static_cast<unsigned long long>(h));
  if (backward)
    std::printf(", dγ/dβ hash %016llx",
                static_cast<unsigned long long>(hash_bits(dw.data(), d) * 31 + hash_bits(db.data(), d)));
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return normlab::bench::run_tool("normlab_bench_loop", run, argc, argv);
}
