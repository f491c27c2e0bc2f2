// A paired timing of the two orders of BatchNorm's training passes (src/norm/channel_norm.h): kSegments
// (a statistics pass over the whole tensor, then an output pass) against kChannels (blocks of channels,
// each block's statistics, then its outputs from cache). Each round times one call of each order,
// alternating which goes first, so that both see the same machine; it prints each order's median and the
// quartiles of the per-round ratio channels / segments, for the forward and the backward, and whether the
// two orders gave the same bits.
//
//   normlab_bench_bn_order B C S [THREADS [ROUNDS]]      x is [B, C, S], BatchNorm over B and S
#include <normlab/parallel.h>
#include <normlab/tensor.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "bench_support.h"
#include "norm/channel_norm.h"

namespace {

using normlab::Index;
using normlab::Tensor;
using normlab::chnorm::BatchOrder;

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

bool same(const Tensor& a, const Tensor& b) {
  return std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(float)) == 0;
}

int run(int argc, char** argv) {
  using normlab::bench::parse_positive;
  if (argc < 4 || argc > 6) {
    std::fprintf(stderr, "usage: %s B C S [THREADS [ROUNDS]]\n", argv[0]);
    return 2;
  }
  const Index B = parse_positive(argv[1], "B"), C = parse_positive(argv[2], "C"), S = parse_positive(argv[3], "S");
  const int threads = argc > 4 ? static_cast<int>(parse_positive(argv[4], "THREADS")) : 1;
  const int rounds = argc > 5 ? static_cast<int>(parse_positive(argv[5], "ROUNDS")) : 40;
  normlab::set_num_threads(threads);
  const normlab::Dims shape{B, C, S};
  Tensor x(shape), dy(shape), y[2] = {Tensor(shape), Tensor(shape)}, dx[2] = {Tensor(shape), Tensor(shape)};
  normlab::bench::FillUniform(x.data(), x.numel(), 1, 2.0f, 4.0f);
  normlab::bench::FillUniform(dy.data(), dy.numel(), 2, -1.0f, 1.0f);
  std::vector<float> w(static_cast<std::size_t>(C), 1.5f), b(static_cast<std::size_t>(C), 0.25f);
  const normlab::chnorm::Plan p =
      normlab::chnorm::make_plan(shape, 1, normlab::chnorm::Grouping::kBatch, 1, {}, -1, "bn-order");
  const BatchOrder order[2] = {BatchOrder::kSegments, BatchOrder::kChannels};
  std::vector<double> fwd[2], bwd[2], rf, rb;
  std::vector<double> rstd;
  auto us = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms up and is not counted
    double tf[2], tb[2];
    for (int k = 0; k < 2; ++k) {
      const int o = (r % 2 == 0) ? k : 1 - k;
      tf[o] = us([&] { normlab::chnorm::batch_forward(p, y[o].view(), x.cview(), 1e-5, w.data(), b.data(), rstd, order[o]); });
      tb[o] = us([&] { normlab::chnorm::batch_backward(p, dx[o].view(), dy.cview(), x.cview(), 1e-5, w.data(), order[o]); });
    }
    if (r == 0) continue;
    for (int o = 0; o < 2; ++o) {
      fwd[o].push_back(tf[o]);
      bwd[o].push_back(tb[o]);
    }
    rf.push_back(tf[1] / tf[0]);
    rb.push_back(tb[1] / tb[0]);
  }
  std::printf("bn-order %ldx%ldx%ld, %d thread(s), %d rounds\n", static_cast<long>(B), static_cast<long>(C),
              static_cast<long>(S), threads, rounds);
  std::printf("forward:  segments median %.0f us, channels median %.0f us; channels/segments p25 %.3f, median %.3f, p75 %.3f\n",
              quantile(fwd[0], 0.5), quantile(fwd[1], 0.5), quantile(rf, 0.25), quantile(rf, 0.5), quantile(rf, 0.75));
  std::printf("backward: segments median %.0f us, channels median %.0f us; channels/segments p25 %.3f, median %.3f, p75 %.3f\n",
              quantile(bwd[0], 0.5), quantile(bwd[1], 0.5), quantile(rb, 0.25), quantile(rb, 0.5), quantile(rb, 0.75));
  std::printf("same bits (y, dx): %s\n", same(y[0], y[1]) && same(dx[0], dx[1]) ? "yes" : "no");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bn-order: %s\n", e.what());
    return 1;
  }
}
